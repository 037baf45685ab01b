"""float64 math from ops ONNX Runtime runs in float64, for ops whose ONNX operator it runs in float32 only.

ONNX Runtime's CPU provider has no float64 kernel for Erf, Atan, Asin, Acos, Sinh, Cosh, Asinh, Acosh, Atanh,
NonZero, Det... (``fx2onnx.legalize.tables``), so legalization would compute those nodes in float32 and cast
back: float32-accurate results (erf off by 7e-8 relative, erfc's tail 0, sinh inf above 89) in a float64
graph, and for NonZero another result (a float64 1e-50 is 0.0 in float32 and drops out of the indices).

These lowerings compute in float64 from Exp, Log, Sqrt, Mul, Div, Where... with the algorithms of Cephes and
fdlibm (eager calls glibc or SLEEF's double functions, within an ulp or two of the exact value), so results are
within a few ulps of eager's, and keep its special values (+-0, +-inf, NaN, NaN outside the domain). They are
registered with ``variant="float64"`` for DOUBLE only: float64 nodes reach them before fx2onnx's generic lowerings
of the same ops, every other dtype keeps its dispatch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript import BOOL, DOUBLE, INT64
from onnxscript import opset18 as op

from fx2onnx.lowerings import _cephes as _c
from fx2onnx.lowerings import core as _core
from fx2onnx.lowerings import integer_pooling as _pooling
from fx2onnx.lowerings.accuracy import expm1, log1p
from fx2onnx.lowerings.core import _polynomial
from fx2onnx.lowerings.kernels import acos_of_double, atan_nonnegative, double, erf_small, keep_nan
from fx2onnx.lowerings.rules import lowering

_LN2 = 0.693147180559945309417232121458176568
_PI_HIGH, _PI_LOW = 3.141592653589793, 1.2246467991473532e-16  # pi = high + low to 107 bits
_TANH_ONE = 18.714973875  # SLEEF's tanh is +-1 above this


# erfc's Taylor coefficients about 3/4 (highest power first), for 0.5 <= x < 1: terms beyond h^20 are below 1e-19
# there (|h| <= 1/4). Computed with mpmath (mpmath.taylor(mpmath.erfc, 0.75, 20)), each rounded once.
_ERFC_NEAR_3_4 = (
    3.7686462355785005e-08,
    -1.988595070010976e-08,
    -3.820585027845882e-07,
    5.034286680771006e-07,
    3.252264713003685e-06,
    -7.166231694301993e-06,
    -2.2117975642824626e-05,
    7.57456209347206e-05,
    0.00010618466494862627,
    -0.0006239836743132585,
    -0.00018603225735249506,
    0.00396826044637477,
    -0.0023017883040209273,
    -0.018435235177909452,
    0.026872509532768433,
    0.053242729167728105,
    -0.1506869693426267,
    -0.026788794549800304,
    0.4821983018964055,
    -0.6429310691952074,
    0.28884436634648486,
)


def _is_negative(x: DOUBLE) -> BOOL:
    """The sign bit: true for -0 too (1 / -0 is -inf)."""
    zero = double(0.0)
    return op.Or(op.Less(x, zero), op.And(op.Equal(x, zero), op.Less(op.Div(double(1.0), x), zero)))


def _with_sign_of(magnitude: DOUBLE, x: DOUBLE) -> DOUBLE:
    """-magnitude where x < 0 (zeros: see _zeros_kept)."""
    return op.Where(op.Less(x, double(0.0)), op.Neg(magnitude), magnitude)


def _zeros_kept(x: DOUBLE, result: DOUBLE) -> DOUBLE:
    """x itself where it is +-0 (and NaN), for odd functions. x goes in Where's second branch: ONNX Runtime's
    Where turns a -0 in its first branch into +0."""
    return op.Where(op.Greater(op.Abs(x), double(0.0)), result, x)


# --- nonzero: float32 would turn tiny values into 0 and drop them from the indices ------------------------------
def _nonzero_mask(self: DOUBLE) -> BOOL:
    """x != 0, NaN included, as eager's nonzero tests it."""
    return op.Not(op.Equal(self, double(0.0)))


def _nonzero_indices(self: DOUBLE) -> INT64:
    """[count, max(rank, 1)] indices of the non-zero elements (a 0-d input as a 1-element vector)."""
    mask = _nonzero_mask(self)
    flat = op.Reshape(mask, op.Constant(value_ints=[-1])) if len(self.shape) == 0 else mask
    return op.Transpose(op.NonZero(flat), perm=[1, 0])


@lowering("aten::nonzero", variant="float64")
def nonzero(self: DOUBLE) -> INT64:
    """Indices of the non-zero elements, [count, rank]; a 0-d input gives [0 or 1, 0] as in eager."""
    indices = _nonzero_indices(self)
    if len(self.shape) == 0:
        return op.Slice(indices, op.Constant(value_ints=[0]), op.Constant(value_ints=[0]), op.Constant(value_ints=[1]))
    return indices


@lowering("aten::nonzero_static", variant="float64")
def nonzero_static(self: DOUBLE, size: int, fill_value: int = -1) -> INT64:
    """The first `size` rows of nonzero's indices, padded with `fill_value` rows."""
    rank = len(self.shape)
    columns = max(rank, 1)
    padding = op.Expand(
        op.Constant(value=ir.tensor([fill_value], dtype=ir.DataType.INT64)), op.Constant(value_ints=[size, columns])
    )
    padded = op.Concat(_nonzero_indices(self), padding, axis=0)
    starts, ends = op.Constant(value_ints=[0, 0]), op.Constant(value_ints=[size, rank])
    return op.Slice(padded, starts, ends, op.Constant(value_ints=[0, 1]))


@lowering("aten::masked_scatter", variant="float64")
def masked_scatter(self: DOUBLE, mask: BOOL, source: DOUBLE) -> DOUBLE:
    """source's leading elements, in order, where the (broadcast) mask is true. The mask stays bool: torchlib's
    takes it in self's dtype, and NonZero of a float64 mask would run in float32 (exact, but a lossy Cast)."""
    full_mask = op.Expand(mask, op.Shape(self))
    indices = op.Transpose(op.NonZero(full_mask), perm=[1, 0])
    count = op.Shape(indices, start=0, end=1)
    updates = op.Slice(op.Reshape(source, op.Constant(value_ints=[-1])), op.Constant(value_ints=[0]), count)
    return op.ScatterND(self, indices, updates)


# --- average pooling: window sums in eager's order (AveragePool has no float64 kernel) -------------------------------
def _avg_pool(
    self: DOUBLE,
    spatial: int,
    name: str,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> DOUBLE:
    """Window sums over a zero-padded input (integer_pooling's windows: eager's, ceil mode included), each summed
    from +0 in eager's scan order and divided by eager's divisor, so results round as eager's do. Dynamic spatial
    dims keep core's AveragePool (which legalization runs in float32)."""
    if not all(isinstance(size, int) for size in self.shape[len(self.shape) - spatial :]):
        return _core.avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    dims = _pooling._dims(self, spatial, name, kernel_size, stride, padding, (1,), ceil_mode)
    padded = _pooling._pad(self, dims, 0)
    total = double(0.0)  # eager's running sum starts at +0 (an all -0 window averages to +0)
    for offset in _pooling._offsets(dims):
        total = op.Add(total, _pooling._at_offset(padded, dims, offset))
    if divisor_override is not None:
        return op.Div(total, double(divisor_override))
    counts = _pooling.window_counts(dims, count_include_pad)
    divisor = np.ones([len(c) for c in counts], dtype=np.float64)
    for axis, count in enumerate(counts):
        divisor = divisor * count.reshape([1] * axis + [-1] + [1] * (len(counts) - 1 - axis))
    return op.Div(total, op.Constant(value=ir.tensor(divisor)))


@lowering("aten::avg_pool1d", variant="float64")
def avg_pool1d(
    self: DOUBLE,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> DOUBLE:
    return _avg_pool(self, 1, "avg_pool1d", kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@lowering("aten::avg_pool2d", variant="float64")
def avg_pool2d(
    self: DOUBLE,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> DOUBLE:
    return _avg_pool(
        self, 2, "avg_pool2d", kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


@lowering("aten::avg_pool3d", variant="float64")
def avg_pool3d(
    self: DOUBLE,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> DOUBLE:
    return _avg_pool(
        self, 3, "avg_pool3d", kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


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


def _erfc(x: DOUBLE) -> DOUBLE:
    """1 - erf(x) for -1 < x < 0.5; erfc's Taylor series about 0.75 up to 1 (1 - erf(x) would lose 3 bits to
    cancellation there); erfc(|x|), and 2 - erfc(|x|) below -1: no cancellation in the tail."""
    magnitude = op.Abs(x)
    small = op.Less(magnitude, double(1.0))
    tail = _erfc_from_one(op.Where(small, double(1.0), magnitude))
    large = op.Where(op.Less(x, double(0.0)), op.Sub(double(2.0), tail), tail)
    middle = op.Sub(double(1.0), erf_small(op.Where(small, x, double(0.0))))
    middle = op.Where(op.GreaterOrEqual(x, double(0.5)), _polynomial(op.Sub(x, double(0.75)), _ERFC_NEAR_3_4), middle)
    return keep_nan(x, op.Where(small, middle, large))


@lowering("aten::erf", "aten::special_erf", variant="float64")
def erf(self: DOUBLE) -> DOUBLE:
    return _erf(self)


@lowering("aten::erfc", "aten::special_erfc", variant="float64")
def erfc(self: DOUBLE) -> DOUBLE:
    return _erfc(self)


def _tanh(x: DOUBLE) -> DOUBLE:
    """tanh to ~2 ulps (fdlibm's s_tanh.c): 1 - 2 / (expm1(2|x|) + 2) from 1, -t / (t + 2) with t = expm1(-2|x|)
    below; +-1 above SLEEF's 18.714973875, as eager's vectorized tanh (the exact value rounds to +-1 from 19.06).
    ONNX Runtime's float64 Tanh is off by up to 7 ulps and is +-1 from about 18.4 on, which 1 + tanh(x) (gelu's
    tanh form) turns into large relative errors and zeros for negative x."""
    a = op.Abs(x)
    one, two = double(1.0), double(2.0)
    capped = op.Min(a, double(_TANH_ONE))
    from_one = op.Sub(one, op.Div(two, op.Add(expm1(op.Add(capped, capped)), two)))
    t = expm1(op.Mul(double(-2.0), capped))
    below_one = op.Div(op.Neg(t), op.Add(t, two))
    magnitude = op.Where(op.GreaterOrEqual(a, one), from_one, below_one)
    magnitude = op.Where(op.Greater(a, double(_TANH_ONE)), one, magnitude)
    return _zeros_kept(x, _with_sign_of(magnitude, x))


@lowering("aten::gelu", variant="float64")
def gelu(self: DOUBLE, approximate: str = "none") -> DOUBLE:
    """eager's kernel: x * 0.5 * (1 + erf(x * M_SQRT1_2)), or 0.5 * x * (1 + tanh(kBeta * (x + 0.044715 x^3)))
    with kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, in its order."""
    if approximate == "tanh":
        beta = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
        cube = op.Mul(op.Mul(self, self), self)
        inner = op.Mul(double(beta), op.Add(self, op.Mul(double(0.044715), cube)))
        return op.Mul(op.Mul(double(0.5), self), op.Add(double(1.0), _tanh(inner)))
    one_plus = op.Add(double(1.0), _erf(op.Mul(self, double(0.70710678118654752440))))
    return op.Mul(op.Mul(self, double(0.5)), one_plus)


@lowering("aten::sigmoid", "aten::special_expit", variant="float64")
def sigmoid(self: DOUBLE) -> DOUBLE:
    """eager's kernel, 1 / (1 + exp(-x)): ONNX Runtime's float64 Sigmoid is 0 below about -36.7 (eager: 4.9e-60
    at -136.5, 0 only from -745)."""
    return op.Reciprocal(op.Add(double(1.0), op.Exp(op.Neg(self))))


def _atan(x: DOUBLE) -> DOUBLE:
    """Odd; +-0 give themselves; NaN stays NaN."""
    return _zeros_kept(x, _with_sign_of(atan_nonnegative(op.Abs(x)), x))


def _asin(x: DOUBLE) -> DOUBLE:
    """atan(x / sqrt((1 - x)(1 + x))): no cancellation (1 - x is exact near 1), and atan does not magnify the
    quotient's relative error; +-1 give +-pi/2 (x / 0), |x| > 1 NaN (sqrt of a negative)."""
    one = double(1.0)
    return _atan(op.Div(x, op.Sqrt(op.Mul(op.Sub(one, x), op.Add(one, x)))))


def _atan2(y: DOUBLE, x: DOUBLE) -> DOUBLE:
    """atan(y / x), plus or minus pi (in two parts) where x's sign bit is set; C's special values: both zero or both
    infinite are replaced by their signs (+-1) before dividing, so that 0/0 and inf/inf give atan2's angles."""
    both_zero = op.And(op.Equal(x, double(0.0)), op.Equal(y, double(0.0)))
    both_infinite = op.And(op.IsInf(x), op.IsInf(y))
    replace = op.Or(both_zero, both_infinite)
    x_negative, y_negative = _is_negative(x), _is_negative(y)
    one, minus_one = double(1.0), double(-1.0)
    x_unit = op.Where(x_negative, minus_one, one)
    numerator = op.Where(both_infinite, op.Where(y_negative, minus_one, one), y)  # zeros keep their sign
    angle = _atan(op.Div(numerator, op.Where(replace, x_unit, x)))
    sign = op.Where(y_negative, minus_one, one)
    turned = op.Add(op.Add(angle, op.Mul(sign, double(_PI_LOW))), op.Mul(sign, double(_PI_HIGH)))
    return op.Where(x_negative, turned, angle)


@lowering("aten::atan", "aten::arctan", variant="float64")
def atan(self: DOUBLE) -> DOUBLE:
    return _atan(self)


@lowering("aten::asin", "aten::arcsin", variant="float64")
def asin(self: DOUBLE) -> DOUBLE:
    return _asin(self)


@lowering("aten::acos", "aten::arccos", variant="float64")
def acos(self: DOUBLE) -> DOUBLE:
    return acos_of_double(self)


@lowering("aten::atan2", "aten::arctan2", variant="float64")
def atan2(self: DOUBLE, other: DOUBLE) -> DOUBLE:
    return _atan2(self, other)


# --- hyperbolic functions and their inverses (fdlibm's formulas) --------------------------------------------------
def _exp_overflow_safe(a: DOUBLE) -> DOUBLE:
    """exp(a) / 2 for a >= 0 without overflowing before the result does: (exp(a/2) / 2) exp(a/2)."""
    half = op.Exp(op.Mul(a, double(0.5)))
    return op.Mul(op.Mul(half, double(0.5)), half)


def _sinh(x: DOUBLE) -> DOUBLE:
    """(t + t / (t + 1)) / 2 with t = expm1(|x|) below 22 (no cancellation near 0), exp(|x|) / 2 above; odd."""
    a = op.Abs(x)
    below = op.Less(a, double(22.0))
    t = expm1(op.Where(below, a, double(0.0)))
    small = op.Mul(double(0.5), op.Add(t, op.Div(t, op.Add(t, double(1.0)))))
    return _zeros_kept(x, _with_sign_of(op.Where(below, small, _exp_overflow_safe(a)), x))


def _cosh(x: DOUBLE) -> DOUBLE:
    """(e + 1/e) / 2 with e = exp(|x|) below 22; near 0, 1 + t^2 / (2 (1 + t)) with t = expm1(|x|) (fdlibm), as
    the plain sum's rounding would show there; exp(|x|) / 2 above 22."""
    a = op.Abs(x)
    one = double(1.0)
    below = op.Less(a, double(22.0))
    e = op.Exp(op.Where(below, a, double(0.0)))
    moderate = op.Add(op.Mul(double(0.5), e), op.Div(double(0.5), e))
    t = expm1(op.Where(below, a, double(0.0)))
    near_zero = op.Add(one, op.Div(op.Mul(t, t), op.Mul(double(2.0), op.Add(one, t))))
    result = op.Where(op.Less(a, double(0.5 * _LN2)), near_zero, moderate)
    return keep_nan(x, op.Where(below, result, _exp_overflow_safe(a)))


def _asinh(x: DOUBLE) -> DOUBLE:
    """log1p(a + a^2 / (1 + sqrt(1 + a^2))) up to 2, log(2a + 1 / (sqrt(a^2 + 1) + a)) up to 2^28, log(a) + log(2)
    beyond (a^2 would overflow); odd, +-0 give themselves."""
    a = op.Abs(x)
    one = double(1.0)
    square = op.Mul(a, a)
    root = op.Sqrt(op.Add(square, one))
    small = log1p(op.Add(a, op.Div(square, op.Add(one, root))))
    medium = op.Log(op.Add(op.Add(a, a), op.Div(one, op.Add(root, a))))
    huge = op.Add(op.Log(a), double(_LN2))
    magnitude = op.Where(op.Greater(a, double(2.0**28)), huge, op.Where(op.Greater(a, double(2.0)), medium, small))
    return _zeros_kept(x, _with_sign_of(magnitude, x))


def _acosh(x: DOUBLE) -> DOUBLE:
    """log1p(t + sqrt(2t + t^2)) with t = x - 1 (exact) up to 2, log(2x - 1 / (x + sqrt(x^2 - 1))) up to 2^28,
    log(x) + log(2) beyond; below 1, NaN (sqrt of a negative)."""
    one = double(1.0)
    t = op.Sub(x, one)
    small = log1p(op.Add(t, op.Sqrt(op.Add(op.Add(t, t), op.Mul(t, t)))))
    medium = op.Log(op.Sub(op.Add(x, x), op.Div(one, op.Add(x, op.Sqrt(op.Sub(op.Mul(x, x), one))))))
    huge = op.Add(op.Log(x), double(_LN2))
    result = op.Where(op.Greater(x, double(2.0**28)), huge, op.Where(op.Greater(x, double(2.0)), medium, small))
    nan = double(float("nan"))
    return op.Where(op.Less(x, one), nan, keep_nan(x, result))


def _atanh(x: DOUBLE) -> DOUBLE:
    """log1p(2a + 2a^2 / (1 - a)) / 2 below 0.5, log1p(2a / (1 - a)) / 2 above; odd; +-1 give +-inf, |x| > 1 NaN."""
    a = op.Abs(x)
    one = double(1.0)
    twice = op.Add(a, a)
    gap = op.Sub(one, a)
    small = log1p(op.Add(twice, op.Div(op.Mul(twice, a), gap)))
    large = log1p(op.Div(twice, gap))
    magnitude = op.Mul(double(0.5), op.Where(op.Less(a, double(0.5)), small, large))
    result = op.Where(op.Greater(a, one), double(float("nan")), _with_sign_of(magnitude, x))
    return _zeros_kept(x, result)


@lowering("aten::sinh", variant="float64")
def sinh(self: DOUBLE) -> DOUBLE:
    return _sinh(self)


@lowering("aten::cosh", variant="float64")
def cosh(self: DOUBLE) -> DOUBLE:
    return _cosh(self)


@lowering("aten::asinh", "aten::arcsinh", variant="float64")
def asinh(self: DOUBLE) -> DOUBLE:
    return _asinh(self)


@lowering("aten::acosh", "aten::arccosh", variant="float64")
def acosh(self: DOUBLE) -> DOUBLE:
    return _acosh(self)


@lowering("aten::atanh", "aten::arctanh", variant="float64")
def atanh(self: DOUBLE) -> DOUBLE:
    return _atanh(self)
