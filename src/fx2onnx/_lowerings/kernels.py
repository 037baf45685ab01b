"""Pure math kernels: compositions of ONNX ops that compute one function (erf near 0, float64 inverse
trigonometric functions...) to a stated accuracy. Registered for no op: lowerings of every family build on them.
Their coefficient tables are in :mod:`fx2onnx._lowerings._cephes`.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import DOUBLE
from onnxscript import opset18 as op

from fx2onnx._lowerings import _cephes as _c
from fx2onnx._lowerings.builders import _polynomial


def _with_sign_of(magnitude: DOUBLE, x: DOUBLE) -> DOUBLE:
    """-magnitude where x < 0 (zeros: see _zeros_kept)."""
    return op.Where(op.Less(x, double(0.0)), op.Neg(magnitude), magnitude)


# --- erf, erfc, gelu (Cephes ndtr.c) ----------------------------------------------------------------------------
def _exp_minus_square(t: DOUBLE) -> DOUBLE:
    """exp(-t^2) for 0 <= t <= 32 to about an ulp: t = h + l with h on a 2^-21 grid, so h^2 is exact, and
    exp(-t^2) = exp(-h^2) exp(-s) with s = (2h + l) l < 3.1e-5, whose exponential is a short series (one Exp
    rounding instead of two, as in special.py's version for every dtype)."""
    scale = double(2.0**21)
    high = op.Div(op.Floor(op.Mul(t, scale)), scale)
    low = op.Sub(t, high)
    s = op.Mul(op.Add(op.Add(high, high), low), low)
    # 1 - s + s^2/2 - s^3/6: the next term, s^4/24, is below 4e-20
    series = op.Sub(
        double(1.0), op.Mul(s, op.Sub(double(1.0), op.Mul(s, op.Sub(double(0.5), op.Mul(s, double(1 / 6))))))
    )
    return op.Mul(op.Exp(op.Neg(op.Mul(high, high))), series)


def _erfc_from_one(a: DOUBLE) -> DOUBLE:
    """erfc(a) for a >= 1 (NaN aside): exp(-a^2) P(a) / Q(a) below 8, exp(-a^2) R(a) / S(a) above; exp(-a^2) taken
    without rounding a^2 first (it would cost a^2 ulps). 0 from about 27.3 on, as in eager; inf gives 0."""
    a = op.Min(a, double(32.0))  # erfc(32) underflows anyway; R(inf) / S(inf) would be NaN
    middle = op.Div(_polynomial(a, _c.ERFC_P), _polynomial(a, _c.ERFC_Q))
    large = op.Div(_polynomial(a, _c.ERFC_R), _polynomial(a, _c.ERFC_S))
    return op.Mul(_exp_minus_square(a), op.Where(op.Less(a, double(8.0)), middle, large))


def _erf(x: DOUBLE) -> DOUBLE:
    magnitude = op.Abs(x)
    small = op.Less(magnitude, double(1.0))
    safe = op.Where(small, double(1.0), magnitude)  # keeps the unused branch finite
    large = _with_sign_of(op.Sub(double(1.0), _erfc_from_one(safe)), x)
    # erf_small's -0 for -0 in Where's second branch (see _zeros_kept); NaN takes it too
    large_side = op.GreaterOrEqual(magnitude, double(1.0))
    return op.Where(large_side, large, erf_small(op.Where(large_side, double(0.0), x)))


def erf_small(x: ir.Value) -> ir.Value:
    """erf for |x| < 1 (Cephes), to float64 accuracy: ONNX Runtime's Erf has no float64 kernel."""
    square = op.Mul(x, x)
    return op.Div(op.Mul(x, _polynomial(square, _c.ERF_T)), _polynomial(square, _c.ERF_U))


_HALF_PI = 1.57079632679489661923  # rounded down: pi/2 - _HALF_PI is _MOREBITS


_QUARTER_PI = 7.85398163397448309616e-1


_MOREBITS = 6.123233995736765886130e-17


_TAN_3PI_8 = 2.41421356237309504880


# atan.c: atan(x) = x + x^3 P(x^2) / Q(x^2) for 0 <= x <= 0.66 (highest power first; Q's leading 1 written out).
_ATAN_P = (
    -8.750608600031904122785e-1,
    -1.615753718733365076637e1,
    -7.500855792314704667340e1,
    -1.228866684490136173410e2,
    -6.485021904942025371773e1,
)


_ATAN_Q = (
    1.0,
    2.485846490142306297962e1,
    1.650270098316988542046e2,
    4.328810604912902668951e2,
    4.853903996359136964868e2,
    1.945506571482613964425e2,
)


def double(value: float) -> DOUBLE:
    return op.Constant(value=ir.tensor(float(value), dtype=ir.DataType.DOUBLE))


def keep_nan(x: DOUBLE, result: DOUBLE) -> DOUBLE:
    """NaN where x is NaN: Min/Max clamps inside the formulas may not carry it."""
    return op.Where(op.IsNaN(x), x, result)


# --- inverse trigonometric functions (Cephes atan.c; asin, acos, atan2 from atan) --------------------------------
def atan_nonnegative(a: DOUBLE) -> DOUBLE:
    """atan(a) for a >= 0 (inf: pi/2): reduced to [0, 0.66] by atan(a) = pi/2 + atan(-1/a) above tan(3pi/8) and
    pi/4 + atan((a - 1)/(a + 1)) above 0.66, then a + a^3 P(a^2) / Q(a^2); pi/2's and pi/4's rounding errors are
    added back (Cephes' MOREBITS)."""
    above = op.Greater(a, double(_TAN_3PI_8))
    middle = op.And(op.Greater(a, double(0.66)), op.Not(above))
    reduced = op.Where(
        above,
        op.Div(double(-1.0), a),
        op.Where(middle, op.Div(op.Sub(a, double(1.0)), op.Add(a, double(1.0))), a),
    )
    offset = op.Where(above, double(_HALF_PI), op.Where(middle, double(_QUARTER_PI), double(0.0)))
    extra = op.Where(above, double(_MOREBITS), op.Where(middle, double(0.5 * _MOREBITS), double(0.0)))
    square = op.Mul(reduced, reduced)
    ratio = op.Div(op.Mul(square, _polynomial(square, _ATAN_P)), _polynomial(square, _ATAN_Q))
    series = op.Add(op.Mul(reduced, ratio), reduced)
    return op.Add(offset, op.Add(series, extra))


def acos_of_double(x: DOUBLE) -> DOUBLE:
    """2 atan(sqrt((1 - x) / (1 + x))): -1 gives pi (sqrt of inf), |x| > 1 NaN."""
    one = double(1.0)
    half_angle = atan_nonnegative(op.Sqrt(op.Div(op.Sub(one, x), op.Add(one, x))))
    return keep_nan(x, op.Mul(double(2.0), half_angle))
