"""Special functions: Bessel, gamma and zeta families, orthogonal polynomials, incomplete gamma, erf
variants. Their kernels are in kernels.py and _cephes.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import onnx_ir as ir
from onnxscript import BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8
from onnxscript import opset18 as op

from fx2onnx._emit.context import LoweringContext
from fx2onnx._lowerings import _cephes as _c
from fx2onnx._lowerings.builders import (
    TFloat,
    TInt,
    TReal,
    _back,
    _const,
    _double,
    _in_float32,
    _polynomial,
    expm1,
    log1p,
)
from fx2onnx._lowerings.kernels import _erf, _erfc_from_one, acos_of_double, double, erf_small, keep_nan
from fx2onnx._lowerings.rules import lowering


@lowering("aten::log1p", "aten::special_log1p")
def log1p_lowering(self: TFloat) -> TFloat:
    return _back(log1p(_in_float32(self)), self)


@lowering("aten::expm1", "aten::special_expm1")
def expm1_lowering(self: TFloat) -> TFloat:
    return _back(expm1(_in_float32(self)), self)


@lowering("aten::special_xlog1py")
def xlog1py(self: TFloat, other: TFloat) -> TFloat:
    """x * log1p(y); 0 where x is 0 unless y is NaN."""
    x, y = _in_float32(self), _in_float32(other)
    zero = _const(0.0, x)
    product = op.Mul(x, log1p(y))
    return _back(op.Where(op.And(op.Equal(x, zero), op.Not(op.IsNaN(y))), zero, product), self)


def _bessel_series(half: TFloat, order: int, terms: int) -> TFloat:
    """sum_k (x/2)^(2k+order) / (k! (k+order)!), term by term (no overflow of the powers)."""
    square = op.Mul(half, half)
    term = _const(1.0, half) if order == 0 else half
    total = term
    for k in range(1, terms):
        term = op.Div(op.Mul(term, square), _const(float(k * (k + order)), half))
        total = op.Add(total, term)
    return total


def _bessel_asymptotic_scaled(magnitude: TFloat, order: int) -> TFloat:
    """exp(-x) I_order(x) for large x: sum_k (-1)^k a_k(order) / x^k / sqrt(2 pi x)."""
    mu = 4.0 * order * order
    coefficient = 1.0
    total = _const(1.0, magnitude)
    power = _const(1.0, magnitude)
    inverse = op.Reciprocal(magnitude)
    for k in range(1, 8):
        coefficient *= -(mu - (2 * k - 1) ** 2) / (k * 8.0)
        power = op.Mul(power, inverse)
        total = op.Add(total, op.Mul(_const(coefficient, magnitude), power))
    return op.Div(total, op.Sqrt(op.Mul(_const(6.283185307179586, magnitude), magnitude)))


def _modified_bessel(self: TFloat, order: int, scaled: bool) -> TFloat:
    """I_order(x) (order 0 or 1), or exp(-|x|) I_order(x) when `scaled`: series below 30, asymptotic above."""
    x = _in_float32(self)
    magnitude = op.Abs(x)
    small = op.Less(magnitude, _const(30.0, x))
    safe_small = op.Where(small, magnitude, _const(1.0, x))
    series = _bessel_series(op.Mul(safe_small, _const(0.5, x)), order, 60)
    if scaled:
        series = op.Mul(series, op.Exp(op.Neg(safe_small)))
    safe_large = op.Where(small, _const(30.0, x), magnitude)
    asymptotic = _bessel_asymptotic_scaled(safe_large, order)
    if not scaled:
        asymptotic = op.Mul(asymptotic, op.Exp(safe_large))
    result = op.Where(small, series, asymptotic)
    if order == 1:  # I_1 is odd
        result = op.Where(op.Less(x, _const(0.0, x)), op.Neg(result), result)
    result = op.Where(op.IsNaN(x), x, result)
    return _back(result, self)


@lowering("aten::i0", "aten::special_modified_bessel_i0")
def bessel_i0(self: TFloat) -> TFloat:
    return _modified_bessel(self, 0, scaled=False)


@lowering("aten::special_i0e")
def bessel_i0e(self: TFloat) -> TFloat:
    return _modified_bessel(self, 0, scaled=True)


@lowering("aten::special_i1", "aten::special_modified_bessel_i1")
def bessel_i1(self: TFloat) -> TFloat:
    return _modified_bessel(self, 1, scaled=False)


@lowering("aten::special_i1e")
def bessel_i1e(self: TFloat) -> TFloat:
    return _modified_bessel(self, 1, scaled=True)


@lowering("aten::special_entr")
def entr(self: TFloat) -> TFloat:
    """-x log x; 0 at 0, -inf below 0."""
    zero = _const(0.0, self)
    positive = op.Greater(self, zero)
    safe = op.Where(positive, self, _const(1.0, self))
    result = op.Where(positive, op.Neg(op.Mul(self, op.Log(safe))), zero)
    result = op.Where(op.Less(self, zero), _const(float("-inf"), self), result)
    return op.Where(op.IsNaN(self), self, result)


@lowering("aten::special_spherical_bessel_j0")
def spherical_bessel_j0(x: TFloat) -> TFloat:
    """sin(x) / x, 1 at 0."""
    zero = _const(0.0, x)
    is_zero = op.Equal(x, zero)
    safe = op.Where(is_zero, _const(1.0, x), x)
    result = op.Where(is_zero, _const(1.0, x), op.Div(op.Sin(safe), safe))
    return op.Where(op.IsInf(x), zero, result)


@lowering("aten::sinc", "aten::special_sinc")
def sinc(self: DOUBLE) -> DOUBLE:
    """x == 0 ? 1 : sin(pi * x) / (pi * x)."""
    product = op.Mul(self, _double(math.pi))
    return op.Where(op.Equal(self, _double(0.0)), _double(1.0), op.Div(op.Sin(product), product))


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


TDegree = TypeVar("TDegree", BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8)


# --- dtype helpers ---------------------------------------------------------------------------------------------
def _compute_dtype(*values: ir.Value) -> ir.DataType:
    """float64 if any input is float64, else float32 (eager's promotion of ints/bool, and its f16/bf16 math)."""
    return ir.DataType.DOUBLE if any(v.dtype == ir.DataType.DOUBLE for v in values) else ir.DataType.FLOAT


def _as(value: ir.Value, dtype: ir.DataType) -> ir.Value:
    return op.Cast(value, to=dtype) if value.dtype != dtype else value


def _float(value: TReal) -> TReal:
    return _as(value, _compute_dtype(value))


def _where(condition: BOOL, then: float | ir.Value, otherwise: float | ir.Value, like: ir.Value) -> ir.Value:
    then = _const(then, like) if isinstance(then, (int, float)) else then
    otherwise = _const(otherwise, like) if isinstance(otherwise, (int, float)) else otherwise
    return op.Where(condition, then, otherwise)


def _acos(x: ir.Value) -> ir.Value:
    """acos; float64 from float64 ops (ONNX Runtime's CPU Acos has no float64 kernel, so it would run in float32)."""
    if x.dtype != ir.DataType.DOUBLE:
        return op.Acos(x)
    return acos_of_double(x)


# --- a loop over a tensor degree ---------------------------------------------------------------------------------
# Step = (k, p, q) -> the next value, k the (float) index of q; the recurrence runs while k < limit, elementwise.
Step = Callable[[ir.Value, ir.Value, ir.Value], ir.Value]


def _recurrence(ctx: LoweringContext, first: ir.Value, second: ir.Value, steps: ir.Value, step: Step) -> ir.Value:
    """Run q_{k+1} = step(k, q_{k-1}, q_k) from (first, second) = (q_0, q_1) for k = 1 .. steps - 1 elementwise.

    The degree is a tensor, so the trip count is known only at run time: an ONNX Loop runs max(steps) - 1
    times and each element stops updating once its own k reaches its `steps`. Returns q_steps (q_1 where
    steps <= 1; callers select the low degrees themselves). The body is recorded into its own graph by a
    nested recorder; it reads `steps` (and whatever `step` closes over) from the outer scope.
    """
    dtype = first.dtype

    def body(iteration: ir.Value, carried: list[ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
        previous, current = carried
        k = op.Add(op.Cast(iteration, to=dtype), op.Constant(value=ir.tensor(1.0, dtype=dtype)))
        following = step(k, previous, current)
        active = op.Less(k, steps)
        new_previous = op.Where(active, current, previous)
        new_current = op.Where(active, following, current)
        # Stop once no element has steps left, or (as eager) every one still going has become NaN.
        going = op.And(
            op.Less(op.Add(k, op.Constant(value=ir.tensor(1.0, dtype=dtype))), steps), op.Not(op.IsNaN(new_current))
        )
        keep_going = op.Cast(_largest(op.Cast(going, to=INT32.dtype)), to=BOOL.dtype)
        return keep_going, [new_previous, new_current]

    # Start from values broadcast to the result's shape: a loop-carried value keeps its shape.
    shape = op.Shape(op.Add(op.Add(first, second), op.CastLike(steps, first)))
    first = op.Expand(first, shape)
    second = op.Expand(second, shape)
    trips = op.Cast(_largest(steps), to=INT64.dtype)
    trips = op.Max(op.Sub(trips, op.Constant(value=ir.tensor(1, dtype=ir.DataType.INT64))), op.Constant(value_int=0))
    keep = op.Constant(value=ir.tensor(True))
    _, last = ctx.loop(trips, keep, [first, second], body, name="recurrence")
    return last


def _largest(values: ir.Value) -> ir.Value:
    """The largest element as a scalar, 0 for an empty tensor (ReduceMax of nothing is not 0)."""
    flat = op.Concat(
        op.Reshape(values, op.Constant(value_ints=[-1])), op.CastLike(op.Constant(value_floats=[0.0]), values), axis=0
    )
    return op.ReduceMax(flat, keepdims=0)


def _degree(x: TReal, n: TDegree) -> tuple[ir.Value, ir.Value]:
    """(x, n) in the compute dtype, n truncated toward zero as eager's cast to int64; NaN/inf n become -1."""
    dtype = _compute_dtype(x, n)
    x = _as(x, dtype)
    n = _as(n, dtype)
    finite = op.Not(op.Or(op.IsNaN(n), op.IsInf(n)))
    n = _where(finite, op.Where(op.Less(n, _const(0.0, n)), op.Ceil(n), op.Floor(n)), -1.0, n)
    return x, n


def _is_odd(n: ir.Value) -> ir.Value:
    two = _const(2.0, n)
    return op.Not(op.Equal(op.Sub(n, op.Mul(two, op.Floor(op.Div(n, two)))), _const(0.0, n)))


def _select_low_degrees(n: ir.Value, result: ir.Value, degree0: ir.Value, degree1: ir.Value) -> ir.Value:
    """degree 0 and 1 values where n is 0 or 1, 0 where n < 0, else the recurrence's result."""
    result = op.Where(op.Equal(n, _const(1.0, n)), degree1, result)
    result = op.Where(op.Equal(n, _const(0.0, n)), degree0, result)
    return op.Where(op.Less(n, _const(0.0, n)), _const(0.0, n), result)


def _chebyshev_step(x: ir.Value) -> Step:
    return lambda k, p, q: op.Sub(op.Mul(op.Add(x, x), q), p)


# --- Chebyshev polynomials of the first to fourth kinds ----------------------------------------------------
# Degree above which eager switches to the trigonometric form for |x| < 1: (plain, shifted) per kind.
_TRIGONOMETRIC_ABOVE = {"t": (6.0, 6.0), "u": (8.0, 6.0), "v": (8.0, 6.0), "w": (8.0, 4.0)}


def _chebyshev(ctx: LoweringContext, x: TReal, n: TDegree, kind: str, shifted: bool = False) -> ir.Value:
    """T, U, V or W (at 2x - 1 when `shifted`): eager's special values at |x| = 1, its trigonometric form for
    |x| < 1 above a degree, and the recurrence otherwise (Math.h's [shifted_]chebyshev_polynomial_*_forward)."""
    x, n = _degree(x, n)
    one = _const(1.0, x)
    if shifted:
        x = op.Sub(op.Add(x, x), one)
    two_x = op.Add(x, x)
    first = op.Expand(one, op.Shape(x))
    second = {"t": x, "u": two_x, "v": op.Sub(two_x, one), "w": op.Add(two_x, one)}[kind]
    magnitude = op.Abs(x)
    inside = op.Less(magnitude, one)
    trigonometric_form = op.And(inside, op.Greater(n, _const(_TRIGONOMETRIC_ABOVE[kind][shifted], x)))
    # Elements the closed forms below answer need no steps of the recurrence.
    steps = op.Where(op.Or(trigonometric_form, op.Equal(magnitude, one)), _const(0.0, n), n)
    result = _select_low_degrees(n, _recurrence(ctx, first, second, steps, _chebyshev_step(x)), first, second)
    positive = op.Greater(x, _const(0.0, x))
    zero = _const(0.0, x)
    odd = _is_odd(n)
    n_plus_one = op.Add(n, one)
    two_n_plus_one = op.Add(op.Add(n, n), one)
    safe = _where(inside, x, 0.5, x)
    theta = _acos(safe)
    half = op.Div(theta, _const(2.0, x))
    if kind == "t":
        trigonometric = op.Cos(op.Mul(n, theta))
        at_one = _where(op.Or(positive, op.Not(odd)), 1.0, -1.0, x)
    elif kind == "u":
        sine = op.Sin(theta)
        degenerate = op.Equal(sine, zero)
        fallback = op.Div(op.Mul(n_plus_one, op.Cos(op.Mul(n_plus_one, theta))), safe)
        ratio = op.Div(op.Sin(op.Mul(n_plus_one, theta)), op.Where(degenerate, one, sine))
        trigonometric = op.Where(degenerate, fallback, ratio)
        at_one = op.Where(op.Or(positive, op.Not(odd)), n_plus_one, op.Neg(n_plus_one))
    elif kind == "v":
        alternating = op.Where(odd, op.Neg(two_n_plus_one), two_n_plus_one)
        ratio = op.Div(op.Cos(op.Mul(op.Add(n, _const(0.5, x)), theta)), op.Cos(half))
        trigonometric = op.Where(op.Equal(op.Sin(half), one), alternating, ratio)
        at_one = op.Where(positive, one, alternating)
    else:
        alternating = _where(odd, -1.0, 1.0, x)
        at_one = op.Where(positive, two_n_plus_one, alternating)
        sine = op.Sin(half)
        ratio = op.Div(op.Sin(op.Mul(op.Add(n, _const(0.5, x)), theta)), op.Where(op.Equal(sine, zero), one, sine))
        trigonometric = op.Where(op.Equal(op.Cos(half), one), alternating if shifted else at_one, ratio)
    result = op.Where(trigonometric_form, trigonometric, result)
    result = op.Where(op.Equal(magnitude, one), at_one, result)
    return op.Where(op.Less(n, _const(0.0, n)), _const(0.0, n), result)


@lowering("aten::special_chebyshev_polynomial_t", context=True)
def chebyshev_polynomial_t(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    return _chebyshev(ctx, x, n, "t")


@lowering("aten::special_chebyshev_polynomial_u", context=True)
def chebyshev_polynomial_u(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    return _chebyshev(ctx, x, n, "u")


@lowering("aten::special_chebyshev_polynomial_v", context=True)
def chebyshev_polynomial_v(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    return _chebyshev(ctx, x, n, "v")


@lowering("aten::special_chebyshev_polynomial_w", context=True)
def chebyshev_polynomial_w(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    return _chebyshev(ctx, x, n, "w")


@lowering("aten::special_shifted_chebyshev_polynomial_t", context=True)
def shifted_chebyshev_polynomial_t(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    return _chebyshev(ctx, x, n, "t", shifted=True)


@lowering("aten::special_shifted_chebyshev_polynomial_u", context=True)
def shifted_chebyshev_polynomial_u(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    return _chebyshev(ctx, x, n, "u", shifted=True)


@lowering("aten::special_shifted_chebyshev_polynomial_v", context=True)
def shifted_chebyshev_polynomial_v(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    return _chebyshev(ctx, x, n, "v", shifted=True)


@lowering("aten::special_shifted_chebyshev_polynomial_w", context=True)
def shifted_chebyshev_polynomial_w(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    return _chebyshev(ctx, x, n, "w", shifted=True)


# --- Hermite, Laguerre and Legendre polynomials -----------------------------------------------------------
def _hermite(ctx: LoweringContext, x: TReal, n: TDegree, physicists: bool) -> ir.Value:
    """H_n (physicists') or He_n (probabilists'); NaN above eager's degree limit (128 in float32, 512 in float64)."""
    x, n = _degree(x, n)
    one = op.Expand(_const(1.0, x), op.Shape(x))
    if physicists:
        second = op.Add(x, x)
        step: Step = lambda k, p, q: op.Sub(op.Mul(second, q), op.Mul(op.Add(k, k), p))  # noqa: E731
    else:
        second = x
        step = lambda k, p, q: op.Sub(op.Mul(x, q), op.Mul(k, p))  # noqa: E731
    limit = 512.0 if x.dtype == ir.DataType.DOUBLE else 128.0
    steps = op.Min(n, _const(limit + 1.0, n))  # no element needs more steps than the limit
    result = _recurrence(ctx, one, second, steps, step)
    result = op.Where(op.Greater(n, _const(limit, n)), _const(float("nan"), x), result)
    return _select_low_degrees(n, result, one, second)


@lowering("aten::special_hermite_polynomial_h", context=True)
def hermite_polynomial_h(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    return _hermite(ctx, x, n, physicists=True)


@lowering("aten::special_hermite_polynomial_he", context=True)
def hermite_polynomial_he(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    return _hermite(ctx, x, n, physicists=False)


@lowering("aten::special_laguerre_polynomial_l", context=True)
def laguerre_polynomial_l(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    """L_n(x) by ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1); 1 at x = 0."""
    x, n = _degree(x, n)
    one = _const(1.0, x)
    first = op.Expand(one, op.Shape(x))
    second = op.Sub(one, x)

    def step(k: ir.Value, p: ir.Value, q: ir.Value) -> ir.Value:
        return op.Div(op.Sub(op.Mul(op.Add(op.Add(k, k), second), q), op.Mul(k, p)), op.Add(k, one))

    result = _select_low_degrees(n, _recurrence(ctx, first, second, n, step), first, second)
    return op.Where(op.And(op.Equal(x, _const(0.0, x)), op.GreaterOrEqual(n, _const(0.0, n))), one, result)


@lowering("aten::special_legendre_polynomial_p", context=True)
def legendre_polynomial_p(ctx: LoweringContext, x: TReal, n: TDegree) -> TReal:
    """P_n(x) by ((2k + 1) x P_k - k P_{k-1}) / (k + 1); +-1 at |x| = 1."""
    x, n = _degree(x, n)
    one = _const(1.0, x)
    first = op.Expand(one, op.Shape(x))

    def step(k: ir.Value, p: ir.Value, q: ir.Value) -> ir.Value:
        return op.Div(op.Sub(op.Mul(op.Mul(op.Add(op.Add(k, k), one), x), q), op.Mul(k, p)), op.Add(k, one))

    result = _select_low_degrees(n, _recurrence(ctx, first, x, n, step), first, x)
    at_one = _where(op.Or(op.Greater(x, _const(0.0, x)), op.Not(_is_odd(n))), 1.0, -1.0, x)
    result = op.Where(op.And(op.Equal(op.Abs(x), one), op.GreaterOrEqual(n, _const(0.0, n))), at_one, result)
    return result


# --- Bessel functions of the first and second kinds (Cephes j0.c, j1.c) ----------------------------------
_SQRT_TWO_OVER_PI = 0.797884560802865355879892119868763737


_TWO_OVER_PI = 0.636619772367581343075535053490057448


_QUARTER_PI = 0.785398163397448309615660845819875721


_THREE_QUARTERS_PI = 2.356194490192344928846982537459627163


def _ratio(x: ir.Value, numerator: tuple[float, ...], denominator: tuple[float, ...]) -> ir.Value:
    return op.Div(_polynomial(x, numerator), _polynomial(x, denominator))


def _hankel_asymptotic(x: ir.Value, order: int, second_kind: bool) -> ir.Value:
    """J or Y of order 0 or 1 for x > 5: sqrt(2 / (pi x)) (P cos(x - phase) -+ (5 / x) Q sin(x - phase))."""
    five = _const(5.0, x)
    if order == 0:
        w = op.Div(_const(25.0, x), op.Mul(x, x))
        pp, pq, qp, qq, phase = _c.J0_PP, _c.J0_PQ, _c.J0_QP, _c.J0_QQ, _QUARTER_PI
    else:
        w = op.Mul(op.Div(five, x), op.Div(five, x))
        pp, pq, qp, qq, phase = _c.J1_PP, _c.J1_PQ, _c.J1_QP, _c.J1_QQ, _THREE_QUARTERS_PI
    shifted = op.Sub(x, _const(phase, x))
    p = _ratio(w, pp, pq)
    q = op.Mul(op.Div(five, x), _ratio(w, qp, qq))
    if second_kind:
        wave = op.Add(op.Mul(p, op.Sin(shifted)), op.Mul(q, op.Cos(shifted)))
    else:
        wave = op.Sub(op.Mul(p, op.Cos(shifted)), op.Mul(q, op.Sin(shifted)))
    return op.Div(op.Mul(wave, _const(_SQRT_TWO_OVER_PI, x)), op.Sqrt(x))


def _j0(x: ir.Value) -> ir.Value:
    x = op.Abs(x)
    square = op.Mul(x, x)
    tiny = op.Sub(_const(1.0, x), op.Div(square, _const(4.0, x)))
    roots = op.Mul(
        op.Sub(square, _const(5.78318596294678452118e00, x)), op.Sub(square, _const(3.04712623436620863991e01, x))
    )
    small = op.Mul(roots, _ratio(square, _c.J0_RP, _c.J0_RQ))
    small = op.Where(op.Less(x, _const(1e-5, x)), tiny, small)
    return op.Where(op.LessOrEqual(x, _const(5.0, x)), small, _hankel_asymptotic(x, 0, second_kind=False))


def _j1(x: ir.Value) -> ir.Value:
    magnitude = op.Abs(x)
    square = op.Mul(magnitude, magnitude)
    roots = op.Mul(
        op.Sub(square, _const(1.46819706421238932572e01, x)), op.Sub(square, _const(4.92184563216946036703e01, x))
    )
    small = op.Mul(op.Mul(_ratio(square, _c.J1_RP, _c.J1_RQ), magnitude), roots)
    result = op.Where(
        op.LessOrEqual(magnitude, _const(5.0, x)), small, _hankel_asymptotic(magnitude, 1, second_kind=False)
    )
    return op.Where(op.Less(x, _const(0.0, x)), op.Neg(result), result)  # J1 is odd


def _second_kind_edges(x: ir.Value, result: ir.Value) -> ir.Value:
    """-inf at 0 and NaN below, as eager's y0/y1."""
    result = op.Where(op.Less(x, _const(0.0, x)), _const(float("nan"), x), result)
    return op.Where(op.Equal(x, _const(0.0, x)), _const(float("-inf"), x), result)


@lowering("aten::special_bessel_j0")
def bessel_j0(self: TReal) -> TReal:
    return _j0(_float(self))


@lowering("aten::special_bessel_j1")
def bessel_j1(self: TReal) -> TReal:
    return _j1(_float(self))


@lowering("aten::special_bessel_y0")
def bessel_y0(self: TReal) -> TReal:
    x = _float(self)
    square = op.Mul(x, x)
    small = op.Add(_ratio(square, _c.Y0_YP, _c.Y0_YQ), op.Mul(op.Mul(_const(_TWO_OVER_PI, x), op.Log(x)), _j0(x)))
    result = op.Where(op.LessOrEqual(x, _const(5.0, x)), small, _hankel_asymptotic(x, 0, second_kind=True))
    return _second_kind_edges(x, result)


@lowering("aten::special_bessel_y1")
def bessel_y1(self: TReal) -> TReal:
    x = _float(self)
    square = op.Mul(x, x)
    logarithmic = op.Sub(op.Mul(_j1(x), op.Log(x)), op.Reciprocal(x))
    small = op.Add(op.Mul(x, _ratio(square, _c.Y1_YP, _c.Y1_YQ)), op.Mul(_const(_TWO_OVER_PI, x), logarithmic))
    result = op.Where(op.LessOrEqual(x, _const(5.0, x)), small, _hankel_asymptotic(x, 1, second_kind=True))
    return _second_kind_edges(x, result)


# --- modified Bessel functions (Cephes i0.c, i1.c, k0.c, k1.c: Chebyshev series) -------------------------------
def _chebyshev_series(t: ir.Value, coefficients: tuple[float, ...]) -> ir.Value:
    """Cephes' chbevl: sum' c_k T_k(t / 2) by Clenshaw's recurrence."""
    b0 = _const(coefficients[0], t)
    b1 = _const(0.0, t)
    b2 = b1
    for coefficient in coefficients[1:]:
        b2 = b1
        b1 = b0
        b0 = op.Add(op.Sub(op.Mul(t, b1), b2), _const(coefficient, t))
    return op.Mul(_const(0.5, t), op.Sub(b0, b2))


def _i_scaled(magnitude: ir.Value, order: int) -> ir.Value:
    """exp(-|x|) I_order(|x|) for order 0 or 1 (Chebyshev series below and above 8)."""
    small_a, large_b = (_c.I0_A, _c.I0_B) if order == 0 else (_c.I1_A, _c.I1_B)
    small = _chebyshev_series(op.Sub(op.Div(magnitude, _const(2.0, magnitude)), _const(2.0, magnitude)), small_a)
    if order == 1:
        small = op.Mul(small, magnitude)
    large = op.Div(
        _chebyshev_series(op.Sub(op.Div(_const(32.0, magnitude), magnitude), _const(2.0, magnitude)), large_b),
        op.Sqrt(magnitude),
    )
    return op.Where(op.LessOrEqual(magnitude, _const(8.0, magnitude)), small, large)


def _i(x: ir.Value, order: int) -> ir.Value:
    magnitude = op.Abs(x)
    result = op.Mul(op.Exp(magnitude), _i_scaled(magnitude, order))
    if order == 1:  # I1 is odd
        result = op.Where(op.Less(x, _const(0.0, x)), op.Neg(result), result)
    return result


@lowering("aten::special_modified_bessel_i0", "aten::i0")
def modified_bessel_i0(self: TReal) -> TReal:
    """Integer and bool inputs (float inputs take bessel_i0/bessel_i1 above); computed in float32 as eager does."""
    return _i(_float(self), 0)


@lowering("aten::special_modified_bessel_i1")
def modified_bessel_i1(self: TReal) -> TReal:
    return _i(_float(self), 1)


def _k(self: TReal, order: int, scaled: bool) -> ir.Value:
    """K_order(x), or exp(x) K_order(x) when `scaled`: inf at 0, NaN below; Chebyshev series below and above 2."""
    x = _float(self)
    small_a, large_b = (_c.K0_A, _c.K0_B) if order == 0 else (_c.K1_A, _c.K1_B)
    two = _const(2.0, x)
    series = _chebyshev_series(op.Sub(op.Mul(x, x), two), small_a)
    logarithm = op.Log(op.Mul(_const(0.5, x), x))
    if order == 0:
        small = op.Sub(series, op.Mul(logarithm, _i(x, 0)))
    else:
        small = op.Add(op.Mul(logarithm, _i(x, 1)), op.Div(series, x))
    large = op.Div(_chebyshev_series(op.Sub(op.Div(_const(8.0, x), x), two), large_b), op.Sqrt(x))
    if scaled:
        small = op.Mul(small, op.Exp(x))
    else:
        large = op.Mul(op.Exp(op.Neg(x)), large)
    result = op.Where(op.LessOrEqual(x, two), small, large)
    result = op.Where(op.Less(x, _const(0.0, x)), _const(float("nan"), x), result)
    return op.Where(op.Equal(x, _const(0.0, x)), _const(float("inf"), x), result)


@lowering("aten::special_modified_bessel_k0")
def modified_bessel_k0(self: TReal) -> TReal:
    return _k(self, 0, scaled=False)


@lowering("aten::special_modified_bessel_k1")
def modified_bessel_k1(self: TReal) -> TReal:
    return _k(self, 1, scaled=False)


@lowering("aten::special_scaled_modified_bessel_k0")
def scaled_modified_bessel_k0(self: TReal) -> TReal:
    return _k(self, 0, scaled=True)


@lowering("aten::special_scaled_modified_bessel_k1")
def scaled_modified_bessel_k1(self: TReal) -> TReal:
    return _k(self, 1, scaled=True)


# --- the Airy function Ai (Cephes airy.c) ---------------------------------------------------------------------
_AIRY_C1 = 0.355028053887817239260


_AIRY_C2 = 0.258819403792806798405


_ONE_OVER_SQRT_PI_special = 5.64189583547756286948e-01


@lowering("aten::special_airy_ai")
def airy_ai(self: TReal) -> TReal:
    """Ai(x): oscillating asymptotic form below -2.09, decaying one from 2.09, Maclaurin series between;
    0 above 103.892 and NaN at +-inf, as eager."""
    x = _float(self)
    one = _const(1.0, x)
    # Below -2.09.
    negative = op.Neg(x)
    zeta_negative = op.Div(op.Mul(op.Mul(_const(-2.0, x), x), op.Sqrt(negative)), _const(3.0, x))
    z = op.Reciprocal(zeta_negative)
    square = op.Mul(z, z)
    f = op.Add(one, op.Mul(square, _ratio(square, _c.AIRY_AFN, _c.AIRY_AFD)))
    g = op.Mul(z, _ratio(square, _c.AIRY_AGN[:11], _c.AIRY_AGD[:10]))
    phase = op.Add(zeta_negative, _const(0.25 * 3.141592653589793, x))
    wave = op.Sub(op.Mul(op.Sin(phase), f), op.Mul(op.Cos(phase), g))
    oscillating = op.Mul(op.Div(_const(_ONE_OVER_SQRT_PI_special, x), op.Sqrt(op.Sqrt(negative))), wave)
    # From 2.09.
    zeta = op.Div(op.Mul(op.Mul(_const(2.0, x), x), op.Sqrt(x)), _const(3.0, x))
    decay = op.Mul(_const(_ONE_OVER_SQRT_PI_special, x), _ratio(op.Reciprocal(zeta), _c.AIRY_AN, _c.AIRY_AD))
    decaying = op.Div(decay, op.Mul(op.Mul(_const(2.0, x), op.Sqrt(op.Sqrt(x))), op.Exp(zeta)))
    # Between: Ai = c1 f(x^3) - c2 x g(x^3); eager sums until a term is below epsilon (at most ~20 terms here).
    cube = op.Mul(op.Mul(x, x), x)
    m, n_term, k = one, x, 1.0
    f_sum, g_sum = one, x
    for _ in range(24):
        m = op.Div(op.Mul(m, cube), _const((k + 1.0) * (k + 2.0), x))
        n_term = op.Div(op.Mul(n_term, cube), _const((k + 2.0) * (k + 3.0), x))
        k += 3.0
        f_sum = op.Add(f_sum, m)
        g_sum = op.Add(g_sum, n_term)
    series = op.Sub(op.Mul(_const(_AIRY_C1, x), f_sum), op.Mul(_const(_AIRY_C2, x), g_sum))
    result = op.Where(op.Less(x, _const(-2.09, x)), oscillating, series)
    result = op.Where(op.GreaterOrEqual(x, _const(2.09, x)), decaying, result)
    result = op.Where(op.Greater(x, _const(103.892, x)), _const(0.0, x), result)
    return op.Where(op.IsInf(x), _const(float("nan"), x), result)


# --- the gamma function's logarithm and its derivatives ---------------------------------------------------------
# Eager's algorithms (Math.h's calc_digamma, trigamma and calc_polygamma, which follow Cephes' psi.c and zeta.c;
# glibc's lgamma), each with every constant in the compute dtype, so that float64 is float64-accurate. Integer
# and bool inputs compute in float32, float16/bfloat16 in float32, as eager does.
_PI = 3.141592653589793


# log|Gamma(z)| for z >= 0.5: Lanczos' series (g = 7, 9 terms).
_LANCZOS = (
    0.99999999999980993,
    676.5203681218851,
    -1259.1392167224028,
    771.32342877765313,
    -176.61502916214059,
    12.507343278686905,
    -0.13857109526572012,
    9.9843695780195716e-6,
    1.5056327351493116e-7,
)


# psi(y) ~ log(y) - 1 / (2y) - sum_k B_2k / (2k y^2k): B_2k / 2k for k = 7 .. 1 (Cephes' psi.c, as eager).
_DIGAMMA_ASYMPTOTIC = (1.0 / 12, -691.0 / 32760, 1.0 / 132, -1.0 / 240, 1.0 / 252, -1.0 / 120, 1.0 / 12)


_DIGAMMA_STEPS = 10  # eager recurs up to y >= 10, where seven terms of the series are within 5e-17


def _is_nonpositive_integer(x: ir.Value) -> ir.Value:
    return op.And(op.LessOrEqual(x, _const(0.0, x)), op.Equal(x, op.Floor(x)))


def _lgamma_lanczos(z: ir.Value) -> ir.Value:
    shifted = op.Sub(z, _const(1.0, z))
    series = _const(_LANCZOS[0], z)
    for index, coefficient in enumerate(_LANCZOS[1:], start=1):
        series = op.Add(series, op.Div(_const(coefficient, z), op.Add(shifted, _const(float(index), z))))
    t = op.Add(shifted, _const(7.5, z))
    half_log_two_pi = _const(0.91893853320467274, z)
    power = op.Mul(op.Add(shifted, _const(0.5, z)), op.Log(t))
    return op.Add(op.Add(half_log_two_pi, op.Sub(power, t)), op.Log(series))


def _lgamma_right(z: ir.Value) -> ir.Value:
    """log|Gamma(z)| for z >= 0.5. Lanczos' sum is within about 1e-15 absolute in float64 (its large alternating
    terms leave float32 about 1e-6), which is no relative accuracy near lgamma's zeros at 1 and 2: within 1/4 of
    them a Taylor series around 2 takes over,
    lgamma(2 + t) = (1 - euler_gamma) t + sum_k c_k t^k, and lgamma(1 + t) = lgamma(2 + t) - log1p(t) (t = z - 1
    or z - 2 is exact there). 18 terms for float64, 9 for float32."""
    one = _const(1.0, z)
    near_one = op.Less(z, _const(1.5, z))
    t = op.Sub(z, op.Where(near_one, one, _const(2.0, z)))
    terms = len(_c.LGAMMA_AROUND_TWO) if z.dtype == ir.DataType.DOUBLE else 9
    series = _polynomial(t, (*_c.LGAMMA_AROUND_TWO[:terms][::-1], 0.42278433509846713939))  # 1 - euler_gamma
    series = op.Mul(t, series)
    series = op.Sub(series, op.Where(near_one, log1p(t), _const(0.0, z)))
    near = op.LessOrEqual(op.Abs(t), _const(0.25, z))
    return op.Where(near, series, _lgamma_lanczos(z))


def _lgamma(x: ir.Value) -> ir.Value:
    """Below 0.5 by reflection, log(pi / |sin(pi x)|) - lgamma(1 - x), the sine's argument reduced to
    [-pi/2, pi/2] (exactly: pi (x - round(x))); inf at 0, -1, -2... and at +-inf."""
    half = _const(0.5, x)
    reflect = op.Less(x, half)
    z = op.Where(reflect, op.Sub(_const(1.0, x), x), x)
    right = _lgamma_right(z)
    pi = _const(_PI, x)
    sine = op.Abs(op.Sin(op.Mul(pi, op.Sub(x, op.Round(x)))))
    reflected = op.Sub(op.Log(op.Div(pi, sine)), right)
    result = op.Where(reflect, reflected, right)
    infinity = _const(float("inf"), x)
    return op.Where(op.Or(op.IsInf(x), _is_nonpositive_integer(x)), infinity, result)


@lowering("aten::lgamma")
def lgamma(self: TReal) -> TReal:
    return _lgamma(_float(self))


# ONNX Runtime's float64 Sin and Cos are within a few ulps only on about [-pi/2, pi/2] (Cos on [-pi/4, pi/4]):
# elsewhere their error is about an ulp of the argument, which is no relative accuracy near their zeros. Where
# eager takes the sine or tangent of pi x rounded, the float64 graphs reduce that angle first, by Cody and Waite's
# method: pi (or pi/2) in parts whose products with the (small) integer k are exact.
_PI_PARTS = (3.141592502593994, 1.5099578831723193e-07, 1.0780605716316238e-14)  # 24, 24 and 53 bits of pi


_HALF_PI_PARTS = (1.5707963267948966, 6.123233995736766e-17)


def _minus_multiples(theta: ir.Value, k: ir.Value, parts: tuple[float, ...]) -> ir.Value:
    for part in parts:
        theta = op.Sub(theta, op.Mul(k, _const(part, theta)))
    return theta


def _sin_of_angle(theta: ir.Value) -> ir.Value:
    """+-sin(theta), the sign dropped for float64 (theta - k pi, k = round(theta / pi), is the argument)."""
    if theta.dtype != ir.DataType.DOUBLE:
        return op.Sin(theta)
    k = op.Round(op.Div(theta, _const(_PI, theta)))
    return op.Sin(_minus_multiples(theta, k, _PI_PARTS))


def _pi_over_tan_pi(r: ir.Value) -> ir.Value:
    """pi / tan(pi r) for r in (-1, 0), as eager's digamma has it. float64: tan of pi r rounded, as eager's
    (theta = pi r reduced to t = theta - k pi/2, |t| <= pi/4, for Sin and Cos: tan(theta) is tan(t) for even k,
    -1 / tan(t) for odd k). float32, which eager computes in double: from r moved into (-1/2, 1/2] (exactly), so
    that pi r keeps its relative accuracy next to -1 too, and ONNX Runtime's float32 Tan (within an ulp)."""
    pi = _const(_PI, r)
    if r.dtype != ir.DataType.DOUBLE:
        r = op.Where(op.Less(r, _const(-0.5, r)), op.Add(r, _const(1.0, r)), r)
        return op.Div(pi, op.Tan(op.Mul(pi, r)))
    theta = op.Mul(pi, r)
    k = op.Round(op.Div(theta, _const(_PI / 2, r)))
    t = _minus_multiples(theta, k, _HALF_PI_PARTS)
    sine, cosine = op.Sin(t), op.Cos(t)
    odd = op.Equal(k, _const(-1.0, r))
    return op.Div(op.Mul(pi, op.Where(odd, op.Neg(sine), cosine)), op.Where(odd, cosine, sine))


def _digamma(x: ir.Value) -> ir.Value:
    """psi(x): below 0 by reflection, psi(1 - x) - pi / tan(pi r), r = x - trunc(x); for y >= 0 the recurrence
    psi(y) = psi(y + 10) - sum_k 1 / (y + k) (eager's stops at 10, this always takes ten steps) and the asymptotic
    series. -inf at +0, +inf at -0, NaN at negative integers and -inf, inf at inf."""
    one = _const(1.0, x)
    negative = op.Less(x, _const(0.0, x))
    y = op.Where(negative, op.Sub(one, x), x)
    total = _const(0.0, x)
    for _ in range(_DIGAMMA_STEPS):
        total = op.Sub(total, op.Reciprocal(y))
        y = op.Add(y, one)
    inverse_square = op.Reciprocal(op.Mul(y, y))
    tail = op.Mul(inverse_square, _polynomial(inverse_square, _DIGAMMA_ASYMPTOTIC))
    right = op.Sub(op.Sub(op.Add(total, op.Log(y)), op.Div(_const(0.5, x), y)), tail)
    reflected = op.Sub(right, _pi_over_tan_pi(op.Sub(x, op.Ceil(x))))
    result = op.Where(negative, reflected, right)
    result = op.Where(_is_nonpositive_integer(x), _const(float("nan"), x), result)
    result = op.Where(op.Equal(x, _const(0.0, x)), op.Neg(op.Reciprocal(x)), result)  # 1/+0 = inf, 1/-0 = -inf
    return op.Where(op.IsInf(x, detect_negative=0), x, result)


@lowering("aten::digamma", "aten::special_digamma", "aten::special_psi")
def digamma(self: TReal) -> TReal:
    return _digamma(_float(self))


def _trigamma(x: ir.Value) -> ir.Value:
    """Math.h's trigamma: reflection below 0.5 (sin(pi x) of pi x rounded, as eager's), six steps of the recurrence,
    then the asymptotic series (which eager truncates at y^-7, about 1e-10 from the true value: this follows it
    term for term)."""
    pi = _const(_PI, x)
    one = _const(1.0, x)
    reflect = op.Less(x, _const(0.5, x))
    sine = _sin_of_angle(op.Mul(pi, x))
    total = op.Where(reflect, op.Neg(op.Div(op.Mul(pi, pi), op.Mul(sine, sine))), _const(0.0, x))
    y = op.Where(reflect, op.Sub(one, x), x)
    for _ in range(6):
        total = op.Add(total, op.Reciprocal(op.Mul(y, y)))
        y = op.Add(y, one)
    inverse_square = op.Reciprocal(op.Mul(y, y))
    series = op.Sub(_const(1.0 / 30, x), op.Mul(inverse_square, _const(1.0 / 42, x)))
    series = op.Sub(_const(1.0 / 6, x), op.Mul(inverse_square, series))
    series = op.Add(op.Add(one, op.Reciprocal(op.Mul(_const(2.0, x), y))), op.Mul(inverse_square, series))
    total = op.Add(total, op.Div(series, y))
    return op.Where(reflect, op.Neg(total), total)


@lowering("aten::polygamma", context=True)
def polygamma(ctx: LoweringContext, n: int, self: TReal) -> TReal:
    """As eager: digamma for n = 0, its trigamma for n = 1 (huge but finite at negative integers, where
    float32 sin(pi x) is not 0), and (-1)^(n+1) n! zeta(n + 1, x) above (zeta in float64, as eager's)."""
    x = _float(self)
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    sign = 1.0 if n % 2 == 1 else -1.0
    return op.Mul(_const(sign * math.factorial(n), x), zeta(ctx, op.Expand(_const(float(n + 1), x), op.Shape(x)), x))


# --- erfinv and ndtri (Cephes' ndtri.c, as Math.h's calc_ndtri) ------------------------------------------------
_EXP_MINUS_TWO = 0.13533528323661269189


_SQRT_TWO_PI = 2.50662827463100050242


_SQRT_PI_OVER_TWO = 0.88622692545275801365  # sqrt(pi) / 2


_ONE_OVER_SQRT_TWO = 0.70710678118654752440


def _ndtri_middle(w: ir.Value, square: ir.Value) -> ir.Value:
    """ndtri(1/2 + w) / sqrt(2 pi) for |w| < 1/2 - exp(-2), given square = w^2: w + w w^2 P0(w^2) / Q0(w^2)."""
    ratio = op.Div(op.Mul(square, _polynomial(square, _c.NDTRI_P0)), _polynomial(square, _c.NDTRI_Q0))
    return op.Add(w, op.Mul(w, ratio))


def _ndtri_tail(y: ir.Value) -> ir.Value:
    """-ndtri(y) for 0 <= y <= exp(-2): t - log(t) / t - P(1/t) / (t Q(1/t)) with t = sqrt(-2 log y); inf at 0
    (t is clamped to the largest float inside the logarithm and the ratio, which are then 0)."""
    t = op.Sqrt(op.Mul(_const(-2.0, y), op.Log(y)))
    finite = op.Min(t, _const(float(_LARGEST[y.dtype]), y))
    z = op.Reciprocal(finite)
    leading = op.Sub(t, op.Div(op.Log(finite), finite))
    near = op.Div(_polynomial(z, _c.NDTRI_P1), _polynomial(z, _c.NDTRI_Q1))
    far = op.Div(_polynomial(z, _c.NDTRI_P2), _polynomial(z, _c.NDTRI_Q2))
    return op.Sub(leading, op.Mul(z, op.Where(op.Less(finite, _const(8.0, y)), near, far)))


@lowering("aten::special_ndtri")
def ndtri(self: TReal) -> TReal:
    """The standard normal quantile, as eager: the middle rational between exp(-2) and 1 - exp(-2), the tail
    expansions in y = p or 1 - p outside (-inf at 0, inf at 1, NaN outside [0, 1])."""
    p = _float(self)
    one = _const(1.0, p)
    upper = op.Greater(p, _const(_rounded(1.0, p) - _rounded(_EXP_MINUS_TWO, p), p))  # as eager's T arithmetic
    y = op.Where(upper, op.Sub(one, p), p)
    w = op.Sub(p, _const(0.5, p))
    middle = op.Mul(_ndtri_middle(w, op.Mul(w, w)), _const(_SQRT_TWO_PI, p))
    tail = _ndtri_tail(y)
    tail = op.Where(upper, tail, op.Neg(tail))
    return op.Where(op.Greater(y, _const(_EXP_MINUS_TWO, p)), middle, tail)


def _rounded(value: float, like: ir.Value) -> float | np.floating:
    """`value` as a number of `like`'s dtype (float32 or float64), for arithmetic that eager does in that dtype."""
    return float(value) if like.dtype == ir.DataType.DOUBLE else np.float32(value)


def _erfinv_from_ndtri(v: ir.Value) -> ir.Value:
    """erfinv(v) = ndtri((1 + v) / 2) / sqrt(2), with the quantile's arguments formed exactly: its middle
    w = v / 2 (written as v (1 + v^2/4 P0/Q0) sqrt(pi)/2), its tail y = (1 - |v|) / 2, exact for |v| >= 1/2
    (ndtri's own 1 - p would lose the tail's digits)."""
    one = _const(1.0, v)
    middle = op.Mul(_ndtri_middle(v, op.Mul(op.Mul(v, v), _const(0.25, v))), _const(_SQRT_PI_OVER_TWO, v))
    y = op.Mul(op.Sub(one, op.Abs(v)), _const(0.5, v))
    tail = op.Mul(op.Mul(_ndtri_tail(y), op.Sign(v)), _const(_ONE_OVER_SQRT_TWO, v))
    # `middle` is the second branch: ONNX Runtime's Where turns a -0 in its first into +0.
    return op.Where(op.Less(y, _const(_EXP_MINUS_TWO, v)), tail, middle)


# Giles (2010), "Approximating the erfinv function": w = -log(1 - v^2), a polynomial in w below 5, one in sqrt(w) above.
_GILES_MIDDLE = (
    2.81022636e-08,
    3.43273939e-07,
    -3.5233877e-06,
    -4.39150654e-06,
    0.00021858087,
    -0.00125372503,
    -0.00417768164,
    0.246640727,
    1.50140941,
)


_GILES_TAIL = (
    -0.000200214257,
    0.000100950558,
    0.00134934322,
    -0.00367342844,
    0.00573950773,
    -0.0076224613,
    0.00943887047,
    1.00167406,
    2.83297682,
)


def _erfinv_giles(v: ir.Value) -> ir.Value:
    """The polynomial in sqrt(w) goes to -inf at w = inf: +-1 give +-inf by a Where."""
    one = _const(1.0, v)
    w = op.Neg(op.Log(op.Mul(op.Sub(one, v), op.Add(one, v))))
    middle = _polynomial(op.Sub(w, _const(2.5, v)), _GILES_MIDDLE)
    tail = _polynomial(op.Sub(op.Sqrt(w), _const(3.0, v)), _GILES_TAIL)
    result = op.Mul(op.Where(op.Less(w, _const(5.0, v)), middle, tail), v)
    return op.Where(op.Equal(op.Abs(v), one), op.Mul(v, _const(float("inf"), v)), result)


@lowering("aten::erfinv", "aten::special_erfinv")
def erfinv(self: TReal) -> TReal:
    """float64 from the normal quantile (within 4 ulps of eager, which refines a rational guess by Newton steps
    on erf), float32 by Giles' polynomials (within 2.5 ulps of eager, cheaper: no second Log, one polynomial
    pair); +-inf at +-1, NaN outside [-1, 1]."""
    v = _float(self)
    return _erfinv_from_ndtri(v) if v.dtype == ir.DataType.DOUBLE else _erfinv_giles(v)


# --- logit, tan ---------------------------------------------------------------------------------------------
@lowering("aten::logit")
def logit(self: TReal, eps: float | None = None) -> TReal:
    """log(x / (1 - x)) with x clamped to [eps, 1 - eps] when eps >= 0 is given (NaN stays NaN), as eager.
    float16/bfloat16 stay in their dtype: eager's kernel rounds after each of the three ops there (computed in
    float32 and rounded once, 30% of bfloat16 results were an ulp off eager)."""
    x = self if self.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16) else _float(self)
    if eps is not None and eps >= 0:
        low, high = _const(eps, x), _const(1.0 - eps, x)
        x = op.Where(op.Less(x, low), low, op.Where(op.Greater(x, high), high, x))
    return op.Log(op.Div(x, op.Sub(_const(1.0, x), x)))


@lowering("aten::tan")
def tan(self: TFloat) -> TFloat:
    """ONNX Runtime's CPU Tan has no float64 kernel (it would run in float32): sin / cos there."""
    if self.dtype == ir.DataType.DOUBLE:
        return op.Div(op.Sin(self), op.Cos(self))
    return op.Tan(self)


# --- the Hurwitz zeta function (Cephes zeta.c) ----------------------------------------------------------
_ZETA_A = (
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
)


_ZETA_MAX_TERMS = 1_000_000  # direct terms beyond the first nine: q down to about -10^6 (eager: any q)


@lowering("aten::special_zeta", context=True)
def zeta(ctx: LoweringContext, self: TReal, other: TDegree) -> TReal:
    """zeta(x, q) = sum_k (q + k)^-x: direct terms, then the Euler-Maclaurin tail; in float64 (eager
    accumulates float32 in double too). inf at x = 1 or at integer q <= 0, NaN for x < 1 or for q <= 0 with
    x not an integer.

    Eager sums the direct terms while fewer than 9 or q + k <= 9: nine here, then an ONNX Loop for elements
    with q below 0, as long as any needs more (at most _ZETA_MAX_TERMS; eager has no bound).
    """
    result_dtype = _compute_dtype(self, other)
    x = _as(self, ir.DataType.DOUBLE)
    q = _as(other, ir.DataType.DOUBLE)
    one = _const(1.0, x)
    nine = _const(9.0, x)
    shape = op.Shape(op.Add(x, q))
    x, q = op.Expand(x, shape), op.Expand(q, shape)
    minus_x = op.Neg(x)
    # Eager's first term is pow(q, -x) in the input's type (the rest in double): for float32 too, here.
    single = ir.DataType.FLOAT
    first = op.Pow(q, minus_x) if result_dtype == ir.DataType.DOUBLE else op.Pow(_as(q, single), _as(minus_x, single))
    total = _as(first, ir.DataType.DOUBLE)
    a = q
    b = _const(0.0, x)
    for _ in range(9):
        a = op.Add(a, one)
        b = op.Pow(a, minus_x)
        total = op.Add(total, b)
    nonpositive_q = op.LessOrEqual(q, _const(0.0, x))
    integer_q = op.Equal(q, op.Floor(q))
    answered = op.Or(op.And(nonpositive_q, op.Or(integer_q, op.Not(op.Equal(x, op.Floor(x))))), op.Less(x, one))

    def step(k: ir.Value, states: list[ir.Value]) -> tuple[list[ir.Value], ir.Value]:
        a, _, total = states
        a = op.Add(a, one)
        b = op.Pow(a, minus_x)
        return [a, b, op.Add(total, b)], op.Greater(a, nine)

    more = op.And(op.LessOrEqual(a, nine), op.Not(answered))
    a, b, total = _iterate(ctx, more, [a, op.Expand(b, shape), total], step, _ZETA_MAX_TERMS)
    w = a
    total = op.Add(total, op.Div(op.Mul(b, w), op.Sub(x, one)))
    total = op.Sub(total, op.Mul(_const(0.5, x), b))
    factor = one
    k = 0.0
    for coefficient in _ZETA_A:
        factor = op.Mul(factor, op.Add(x, _const(k, x)))
        b = op.Div(b, w)
        total = op.Add(total, op.Div(op.Mul(factor, b), _const(coefficient, x)))
        factor = op.Mul(factor, op.Add(x, _const(k + 1.0, x)))
        b = op.Div(b, w)
        k += 2.0
    total = op.Where(op.And(nonpositive_q, op.Not(op.Equal(x, op.Floor(x)))), _const(float("nan"), x), total)
    total = op.Where(op.And(nonpositive_q, integer_q), _const(float("inf"), x), total)
    total = op.Where(op.Less(x, one), _const(float("nan"), x), total)
    total = op.Where(op.Equal(x, one), _const(float("inf"), x), total)
    return _as(total, result_dtype)


# Euclid's algorithm takes the most steps on consecutive Fibonacci numbers: fewer than these for each type.
_EUCLID_STEPS = {
    ir.DataType.UINT8: 13,
    ir.DataType.INT8: 12,
    ir.DataType.INT16: 24,
    ir.DataType.INT32: 47,
    ir.DataType.INT64: 93,
}


def _gcd(a: ir.Value, b: ir.Value) -> ir.Value:
    """Eager's Euclid: |a| and |b| (|min| wraps to min), then C++'s truncated % (fmod=1): the floored Mod differs
    where a magnitude wrapped negative (gcd(int64 min, 1): 1 in eager, -1 with the floored one)."""
    zero = op.CastLike(op.Constant(value_int=0), a)
    one = op.CastLike(op.Constant(value_int=1), a)
    a, b = op.Abs(a), op.Abs(b)
    for _ in range(_EUCLID_STEPS[a.dtype]):
        done = op.Equal(a, zero)
        remainder = op.Mod(b, op.Where(done, one, a), fmod=1)
        a, b = op.Where(done, zero, remainder), op.Where(done, b, a)
    return b


@lowering("aten::gcd")
def gcd(self: TInt, other: TInt) -> TInt:
    return _gcd(self, other)


@lowering("aten::lcm")
def lcm(self: TInt, other: TInt) -> TInt:
    """|a / gcd * b|, 0 where gcd is 0; narrow types in int32 and wrapped back, as C++'s int promotion in eager."""
    divisor = _gcd(self, other)
    zero = op.CastLike(op.Constant(value_int=0), divisor)
    is_zero = op.Equal(divisor, zero)
    safe = op.Where(is_zero, op.CastLike(op.Constant(value_int=1), divisor), divisor)
    wide = ir.DataType.INT64 if self.dtype == ir.DataType.INT64 else ir.DataType.INT32
    product = op.Abs(op.Mul(op.Div(_as(self, wide), _as(safe, wide)), _as(other, wide)))
    return op.Where(is_zero, zero, _as(product, self.dtype))


def _binary_parts(magnitude: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(m, e) with magnitude = m 2^e, 0.5 <= m < 1, for finite positive float64 values."""
    one = _const(1.0, magnitude)
    two = _const(2.0, magnitude)
    exponent = op.Add(op.Floor(op.Div(op.Log(magnitude), _const(math.log(2.0), magnitude))), one)
    half = op.Floor(op.Div(exponent, two))  # 2^-exponent in two factors: 2^1024 or 2^1074 overflow float64
    mantissa = op.Mul(op.Mul(magnitude, op.Pow(two, op.Neg(half))), op.Pow(two, op.Sub(half, exponent)))
    too_large = op.GreaterOrEqual(mantissa, one)
    exponent = op.Where(too_large, op.Add(exponent, one), exponent)
    mantissa = op.Where(too_large, op.Div(mantissa, two), mantissa)
    too_small = op.Less(mantissa, _const(0.5, magnitude))
    exponent = op.Where(too_small, op.Sub(exponent, one), exponent)
    mantissa = op.Where(too_small, op.Mul(mantissa, two), mantissa)
    return mantissa, exponent


# --- frexp ---------------------------------------------------------------------------------------------------
@lowering("aten::frexp.Tensor")
def frexp(self: TFloat) -> tuple[TFloat, INT32]:
    """x = mantissa * 2^exponent with 0.5 <= |mantissa| < 1 (0, inf and NaN: themselves and exponent 0).

    In float64, where every float32/float16/bfloat16 (subnormals included) is normal, so 2^-exponent
    cannot overflow; the exponent from log2 is corrected by one either way where log rounds across.
    """
    x = _as(self, ir.DataType.DOUBLE)
    zero = _const(0.0, x)
    regular = op.Not(op.Or(op.Or(op.Equal(x, zero), op.IsInf(x)), op.IsNaN(x)))
    mantissa, exponent = _binary_parts(op.Where(regular, op.Abs(x), _const(1.0, x)))
    mantissa = op.Where(op.Less(x, zero), op.Neg(mantissa), mantissa)
    mantissa = op.Where(regular, mantissa, x)
    exponent = op.Where(regular, exponent, zero)
    return _as(mantissa, self.dtype), op.Cast(exponent, to=INT32.dtype)


# --- nextafter ---------------------------------------------------------------------------------------------
# (significand bits, exponent of the smallest subnormal) per type: the spacing of x = m 2^e is 2^(e - bits).
_FLOAT_FORMAT = {
    ir.DataType.FLOAT: (24, -149),
    ir.DataType.DOUBLE: (53, -1074),
    ir.DataType.FLOAT16: (11, -24),
    ir.DataType.BFLOAT16: (8, -133),
}


_LARGEST = {
    ir.DataType.FLOAT: 3.4028234663852886e38,
    ir.DataType.DOUBLE: 1.7976931348623157e308,
    ir.DataType.FLOAT16: 65504.0,
    ir.DataType.BFLOAT16: 3.3895313892515355e38,
}


@lowering("aten::nextafter")
def nextafter(self: TFloat, other: TFloat) -> TFloat:
    """The next representable value after x toward y, computed in float64 from x's binary exponent: the
    spacing halves below a power of two, is constant among subnormals, and steps past the largest to inf."""
    bits, smallest = _FLOAT_FORMAT[self.dtype]
    x = _as(self, ir.DataType.DOUBLE)
    y = _as(other, ir.DataType.DOUBLE)
    zero = _const(0.0, x)
    two = _const(2.0, x)
    magnitude = op.Abs(x)
    finite_nonzero = op.And(op.Not(op.Equal(x, zero)), op.Not(op.Or(op.IsInf(x), op.IsNaN(x))))
    mantissa, exponent = _binary_parts(op.Where(finite_nonzero, magnitude, _const(1.0, x)))
    away = op.Equal(op.Less(x, y), op.Greater(x, zero))  # moving away from zero
    spacing = op.Sub(exponent, _const(float(bits), x))
    spacing = op.Where(
        op.And(op.Not(away), op.Equal(mantissa, _const(0.5, x))), op.Sub(spacing, _const(1.0, x)), spacing
    )
    step = op.Pow(two, op.Max(spacing, _const(float(smallest), x)))
    result = op.Where(op.Less(x, y), op.Add(x, step), op.Sub(x, step))
    tiny = op.Pow(two, _const(float(smallest), x))
    result = op.Where(op.Equal(x, zero), op.Where(op.Less(x, y), tiny, op.Neg(tiny)), result)
    largest = _const(_LARGEST[self.dtype], x)
    result = op.Where(op.IsInf(x), op.Where(op.Greater(x, zero), largest, op.Neg(largest)), result)
    result = op.Where(op.Equal(x, y), y, result)
    result = op.Where(op.Or(op.IsNaN(x), op.IsNaN(y)), _const(float("nan"), x), result)
    return _as(result, self.dtype)


# --- erfcx and log_ndtr ----------------------------------------------------------------------------------
# Eager evaluates erfcx with Johnson's Faddeeva package (a 100-piece Chebyshev table); here Cephes' erf/erfc
# rationals give erfcx(x) = exp(x^2) erfc(x) to float64 accuracy without forming erfc, so nothing underflows.
_ONE_OVER_SQRT_PI_special = 0.56418958354775628694807945156


def _erfcx_nonnegative(x: ir.Value) -> ir.Value:
    """exp(x^2) erfc(x) for x >= 0."""
    one = _const(1.0, x)
    square = op.Mul(x, x)
    below_one = op.Mul(op.Exp(square), op.Sub(one, erf_small(x)))
    middle = op.Div(_polynomial(x, _c.ERFC_P), _polynomial(x, _c.ERFC_Q))
    large = op.Div(_polynomial(x, _c.ERFC_R), _polynomial(x, _c.ERFC_S))
    # Above 50 eager's continued fraction (5 terms), and its 1-term form above 5e7 (no overflow of x^4).
    fraction = op.Div(
        op.Mul(
            _const(_ONE_OVER_SQRT_PI_special, x),
            op.Add(op.Mul(square, op.Add(square, _const(4.5, x))), _const(2.0, x)),
        ),
        op.Mul(x, op.Add(op.Mul(square, op.Add(square, _const(5.0, x))), _const(3.75, x))),
    )
    fraction = op.Where(op.Greater(x, _const(5e7, x)), op.Div(_const(_ONE_OVER_SQRT_PI_special, x), x), fraction)
    result = op.Where(op.Less(x, one), below_one, middle)
    result = op.Where(op.GreaterOrEqual(x, _const(8.0, x)), large, result)
    return op.Where(op.Greater(x, _const(50.0, x)), fraction, result)


def _erfcx(x: ir.Value) -> ir.Value:
    """erfcx on the whole line: 2 exp(x^2) - erfcx(-x) below 0 (no subtraction below -6.1, inf below -26.7)."""
    negative = op.Less(x, _const(0.0, x))
    magnitude = op.Abs(x)
    positive_side = _erfcx_nonnegative(magnitude)
    doubled = op.Mul(_const(2.0, x), op.Exp(op.Mul(x, x)))
    negative_side = op.Where(op.Less(x, _const(-6.1, x)), doubled, op.Sub(doubled, positive_side))
    negative_side = op.Where(op.Less(x, _const(-26.7, x)), _const(float("inf"), x), negative_side)
    result = op.Where(negative, negative_side, positive_side)
    return op.Where(op.IsNaN(x), x, result)


@lowering("aten::special_erfcx")
def erfcx(self: TReal) -> TReal:
    return _erfcx(_float(self))


def _log1p(z: ir.Value) -> ir.Value:
    """log(1 + z) without losing small z: log(u) z / (u - 1) with u = 1 + z rounded (z itself where u is 1)."""
    one = _const(1.0, z)
    u = op.Add(one, z)
    exact = op.Equal(u, one)
    ratio = op.Div(z, op.Where(exact, one, op.Sub(u, one)))
    return op.Where(exact, z, op.Mul(op.Log(u), ratio))


def _exp_minus_square(t: ir.Value) -> ir.Value:
    """exp(-t^2) for t >= 0 to an ulp or two: with t = h + l, h holding the top half of the significand (t
    clamped to 32, where this is 0 anyway), h^2 is exact and exp(-h^2) exp(-(2h + l) l) loses nothing; exp of t^2
    rounded would be off by t^2 ulps (7e-14 at t = 25, as in Cephes' expx2)."""
    fraction_bits = 21 if t.dtype == ir.DataType.DOUBLE else 7  # 5 bits above the point: h^2 fits the significand
    scale = _const(float(2**fraction_bits), t)
    t = op.Min(t, _const(32.0, t))
    high = op.Div(op.Floor(op.Mul(t, scale)), scale)
    low = op.Sub(t, high)
    return op.Mul(op.Exp(op.Neg(op.Mul(high, high))), op.Exp(op.Neg(op.Mul(op.Add(op.Add(high, high), low), low))))


@lowering("aten::special_log_ndtr")
def log_ndtr(self: TReal) -> TReal:
    """log Phi(x): log(erfcx(-t) / 2) - t^2 below -1, log1p(-erfc(t) / 2) above, with t = x / sqrt(2) (as eager);
    -0 where erfc(t) underflows, as eager."""
    x = _float(self)
    t = op.Mul(x, _const(0.70710678118654752440, x))
    square = op.Mul(t, t)
    lower_tail = op.Sub(op.Log(op.Div(_erfcx(op.Neg(t)), _const(2.0, x))), square)
    # erfc(t) = erfcx(t) exp(-t^2) for t >= 0 (relative accuracy kept in the tail), 1 + erf(|t|) below.
    magnitude = op.Abs(t)
    erfc = op.Where(
        op.Less(t, _const(0.0, x)),
        op.Add(_const(1.0, x), erf_small(magnitude)),
        op.Mul(_erfcx_nonnegative(magnitude), _exp_minus_square(magnitude)),
    )
    upper = log1p(op.Neg(op.Div(erfc, _const(2.0, x))))
    return op.Where(op.Less(x, _const(-1.0, x)), lower_tail, upper)


# --- regularized incomplete gamma functions (Cephes igam.c via SciPy, as Math.h) --------------------------
IterationStep = Callable[[ir.Value, list[ir.Value]], tuple[list[ir.Value], ir.Value]]


def _iterate(
    ctx: LoweringContext, active: ir.Value, states: list[ir.Value], step: IterationStep, max_trips: int
) -> list[ir.Value]:
    """Eager's convergence loops, elementwise: step(k, states) -> (next states, converged) for k = 0, 1, ...

    An element updates while it is active and stops after the step that converges (as a `break` after the
    update); the ONNX Loop ends when no element is active, or after `max_trips` (eager's MAXITER).
    """

    def body(iteration: ir.Value, carried: list[ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
        active_in, *states_in = carried
        k = op.Cast(iteration, to=states[0].dtype)
        following, converged = step(k, states_in)
        updated = [op.Where(active_in, new, old) for new, old in zip(following, states_in)]
        still = op.And(active_in, op.Not(converged))
        keep_going = op.Cast(_largest(op.Cast(still, to=INT32.dtype)), to=BOOL.dtype)
        return keep_going, [still, *updated]

    trips = op.Constant(value=ir.tensor(max_trips, dtype=ir.DataType.INT64))
    anything = op.Cast(_largest(op.Cast(active, to=INT32.dtype)), to=BOOL.dtype)  # no trip if nothing is active
    return ctx.loop(trips, anything, [active, *states], body, name="iterate")[1:]


# (machine epsilon as igam.c uses it, largest log, continued-fraction rescaling bound) per compute dtype.
_IGAM_LIMITS = {
    ir.DataType.DOUBLE: (1.11022302462515654042e-16, 7.09782712893383996843e2, 4.503599627370496e15),
    ir.DataType.FLOAT: (5.9604644775390625e-8, 88.72283905206835, 16777216.0),
}


_LANCZOS_G = 6.024680040776729583740234375


def _expm1(y: ir.Value) -> ir.Value:
    """exp(y) - 1 without losing small y: (u - 1) y / log(u) with u = exp(y) rounded (Kahan)."""
    one = _const(1.0, y)
    u = op.Exp(y)
    exact = op.Equal(u, one)
    safe_log = op.Where(exact, one, op.Log(u))
    result = op.Div(op.Mul(op.Sub(u, one), y), safe_log)
    result = op.Where(op.Equal(op.Sub(u, one), _const(-1.0, y)), _const(-1.0, y), result)
    result = op.Where(op.IsInf(u), u, result)
    return op.Where(exact, y, result)


def _lanczos_sum_expg_scaled(a: ir.Value) -> ir.Value:
    """igam.c's ratevl: the rational in a, evaluated in 1/a above 1 (no overflow of a^12)."""
    forward = op.Div(_polynomial(a, _c.LANCZOS_EXPG_NUM), _polynomial(a, _c.LANCZOS_EXPG_DENOM))
    inverse = op.Reciprocal(a)
    backward = op.Div(
        _polynomial(inverse, _c.LANCZOS_EXPG_NUM[::-1]), _polynomial(inverse, _c.LANCZOS_EXPG_DENOM[::-1])
    )
    return op.Where(op.Greater(op.Abs(a), _const(1.0, a)), backward, forward)


def _igam_factor(a: ir.Value, x: ir.Value) -> ir.Value:
    """x^a exp(-x) / Gamma(a), through the Lanczos form where a ~ x (igam.c's igam_fac)."""
    _, max_log, _ = _IGAM_LIMITS[a.dtype]
    log_term = op.Sub(op.Sub(op.Mul(a, op.Log(x)), x), _lgamma(a))
    direct = op.Where(op.Less(log_term, _const(-max_log, a)), _const(0.0, a), op.Exp(log_term))
    fac = op.Add(a, _const(_LANCZOS_G - 0.5, a))
    scale = op.Div(op.Sqrt(op.Div(fac, _const(math.e, a))), _lanczos_sum_expg_scaled(a))
    moderate = op.Mul(scale, op.Mul(op.Exp(op.Sub(a, x)), op.Pow(op.Div(x, fac), a)))
    ratio = op.Div(op.Add(op.Sub(op.Sub(x, a), _const(_LANCZOS_G, a)), _const(0.5, a)), fac)
    exponent = op.Add(op.Mul(a, op.Sub(_log1p(ratio), ratio)), op.Div(op.Mul(x, _const(0.5 - _LANCZOS_G, a)), fac))
    large = op.Mul(scale, op.Exp(exponent))
    both_small = op.And(op.Less(a, _const(200.0, a)), op.Less(x, _const(200.0, a)))
    lanczos = op.Where(both_small, moderate, large)
    return op.Where(op.Greater(op.Abs(op.Sub(a, x)), op.Mul(_const(0.4, a), op.Abs(a))), direct, lanczos)


def _igam_series(ctx: LoweringContext, a: ir.Value, x: ir.Value, active: ir.Value) -> ir.Value:
    """The lower function by its power series (DLMF 8.11.4)."""
    epsilon, _, _ = _IGAM_LIMITS[a.dtype]
    one = _const(1.0, a)

    def step(k: ir.Value, states: list[ir.Value]) -> tuple[list[ir.Value], ir.Value]:
        r, c, total = states
        r = op.Add(r, one)
        c = op.Mul(c, op.Div(x, r))
        total = op.Add(total, c)
        return [r, c, total], op.LessOrEqual(c, op.Mul(_const(epsilon, a), total))

    ones = op.Expand(one, op.Shape(active))
    _, _, total = _iterate(ctx, active, [op.Expand(a, op.Shape(active)), ones, ones], step, 2000)
    factor = _igam_factor(a, x)
    return op.Where(op.Equal(factor, _const(0.0, a)), _const(0.0, a), op.Div(op.Mul(total, factor), a))


def _igamc_series(ctx: LoweringContext, a: ir.Value, x: ir.Value, active: ir.Value) -> ir.Value:
    """The upper function for small x by DLMF 8.7.3, arranged against cancellation."""
    epsilon, _, _ = _IGAM_LIMITS[a.dtype]
    one = _const(1.0, a)

    def step(k: ir.Value, states: list[ir.Value]) -> tuple[list[ir.Value], ir.Value]:
        factor, total = states
        n = op.Add(k, one)
        factor = op.Mul(factor, op.Div(op.Neg(x), n))
        term = op.Div(factor, op.Add(a, n))
        total = op.Add(total, term)
        return [factor, total], op.LessOrEqual(op.Abs(term), op.Mul(_const(epsilon, a), op.Abs(total)))

    shape = op.Shape(active)
    _, total = _iterate(ctx, active, [op.Expand(one, shape), op.Expand(_const(0.0, a), shape)], step, 1999)
    log_x = op.Log(x)
    head = op.Neg(_expm1(op.Sub(op.Mul(a, log_x), _lgamma(op.Add(one, a)))))
    return op.Sub(head, op.Mul(op.Exp(op.Sub(op.Mul(a, log_x), _lgamma(a))), total))


def _igamc_continued_fraction(ctx: LoweringContext, a: ir.Value, x: ir.Value, active: ir.Value) -> ir.Value:
    """The upper function for large x by its continued fraction (DLMF 8.9.2), rescaled as igam.c does."""
    epsilon, _, big = _IGAM_LIMITS[a.dtype]
    one = _const(1.0, a)
    shape = op.Shape(active)
    y = op.Sub(one, a)
    z = op.Add(op.Add(x, y), one)
    p_previous, q_previous = op.Expand(one, shape), op.Expand(x, shape)
    p_current, q_current = op.Expand(op.Add(x, one), shape), op.Expand(op.Mul(z, x), shape)
    answer = op.Div(p_current, q_current)

    def step(k: ir.Value, states: list[ir.Value]) -> tuple[list[ir.Value], ir.Value]:
        c, y, z, p1, p2, q1, q2, answer = states
        c = op.Add(c, one)
        y = op.Add(y, one)
        z = op.Add(z, _const(2.0, a))
        yc = op.Mul(y, c)
        pk = op.Sub(op.Mul(p1, z), op.Mul(p2, yc))
        qk = op.Sub(op.Mul(q1, z), op.Mul(q2, yc))
        nonzero = op.Not(op.Equal(qk, _const(0.0, a)))
        r = op.Div(pk, op.Where(nonzero, qk, one))
        change = op.Where(nonzero, op.Abs(op.Div(op.Sub(answer, r), r)), one)
        answer = op.Where(nonzero, r, answer)
        p2, p1, q2, q1 = p1, pk, q1, qk
        rescale = op.Greater(op.Abs(pk), _const(big, a))
        factor = op.Where(rescale, _const(1.0 / big, a), one)
        p2, p1, q2, q1 = (op.Mul(v, factor) for v in (p2, p1, q2, q1))
        return [c, y, z, p1, p2, q1, q2, answer], op.LessOrEqual(change, _const(epsilon, a))

    zero = op.Expand(_const(0.0, a), shape)
    initial = [zero, op.Expand(y, shape), op.Expand(z, shape), p_current, p_previous, q_current, q_previous, answer]
    answer = _iterate(ctx, active, initial, step, 2000)[-1]
    factor = _igam_factor(a, x)
    return op.Where(op.Equal(factor, _const(0.0, a)), _const(0.0, a), op.Mul(answer, factor))


def _igam_asymptotic(a: ir.Value, x: ir.Value, lower: bool) -> ir.Value:
    """Temme's uniform asymptotic expansion for large a ~ x (DLMF 8.12.3 / 8.12.4), terms until they grow."""
    epsilon, _, _ = _IGAM_LIMITS[a.dtype]
    one = _const(1.0, a)
    sigma = op.Div(op.Sub(x, a), a)
    root = op.Sqrt(op.Mul(_const(-2.0, a), op.Sub(_log1p(sigma), sigma)))
    ratio = op.Div(x, a)
    eta = op.Where(op.Greater(ratio, one), root, op.Where(op.Less(ratio, one), op.Neg(root), _const(0.0, a)))
    sign = -1.0 if lower else 1.0
    z = op.Mul(op.Mul(_const(sign, a), eta), op.Sqrt(op.Div(a, _const(2.0, a))))
    tail = op.Mul(_erfcx_nonnegative(op.Abs(z)), op.Exp(op.Neg(op.Mul(z, z))))
    erfc = op.Where(op.Less(z, _const(0.0, a)), op.Sub(_const(2.0, a), tail), tail)
    result = op.Mul(_const(0.5, a), erfc)
    total = _const(0.0, a)
    previous = _const(float("inf"), a)
    done = op.Equal(a, _const(float("nan"), a))  # all False, in a's shape
    power = one
    for row in _c.IGAM_D:
        term = op.Mul(_polynomial(eta, row[::-1]), power)
        magnitude = op.Abs(term)
        done = op.Or(done, op.Greater(magnitude, previous))  # the series started to diverge: stop before it
        total = op.Where(done, total, op.Add(total, term))
        converged = op.Less(magnitude, op.Mul(_const(epsilon, a), op.Abs(total)))
        previous = op.Where(done, previous, magnitude)
        done = op.Or(done, converged)
        power = op.Div(power, a)
    two_pi = 2.0 * 3.1415927410125732  # c10::pi<float>, as eager
    scale = op.Div(op.Exp(op.Mul(_const(-0.5, a), op.Mul(a, op.Mul(eta, eta)))), op.Sqrt(op.Mul(_const(two_pi, a), a)))
    return op.Add(result, op.Mul(_const(sign, a), op.Mul(scale, total)))


def _incomplete_gamma(ctx: LoweringContext, self: TReal, other: TReal, lower: bool) -> ir.Value:
    """igamma (lower) or igammac: eager's boundary values, then its choice among the expansions."""
    dtype = ir.DataType.DOUBLE if _compute_dtype(self, other) == ir.DataType.DOUBLE else ir.DataType.FLOAT
    a, x = _as(self, dtype), _as(other, dtype)
    shape = op.Shape(op.Add(a, x))
    a, x = op.Expand(a, shape), op.Expand(x, shape)
    zero, one = _const(0.0, a), _const(1.0, a)
    # Safe arguments where a boundary value answers (the expansions below must not see 0, inf or negatives).
    boundary = op.Or(op.Or(op.LessOrEqual(x, zero), op.LessOrEqual(a, zero)), op.Or(op.IsInf(a), op.IsInf(x)))
    boundary = op.Or(boundary, op.Or(op.IsNaN(a), op.IsNaN(x)))
    a_safe, x_safe = op.Where(boundary, one, a), op.Where(boundary, one, x)
    relative = op.Div(op.Abs(op.Sub(x_safe, a_safe)), a_safe)
    asymptotic = op.Or(
        op.And(
            op.And(op.Greater(a_safe, _const(20.0, a)), op.Less(a_safe, _const(200.0, a))),
            op.Less(relative, _const(0.3, a)),
        ),
        op.And(op.Greater(a_safe, _const(200.0, a)), op.Less(relative, op.Div(_const(4.5, a), op.Sqrt(a_safe)))),
    )
    regular = op.Not(op.Or(boundary, asymptotic))
    # igammac's choice (also igamma's above x > max(1, a)): 1 - the lower series, the fraction, or the upper series.
    large_x = op.Greater(x_safe, _const(1.1, a))
    small_x = op.LessOrEqual(x_safe, _const(0.5, a))
    complement_series = op.Where(
        large_x,
        op.Less(x_safe, a_safe),
        op.Where(
            small_x,
            op.Less(op.Div(_const(-0.4, a), op.Log(x_safe)), a_safe),
            op.Less(op.Mul(x_safe, _const(1.1, a)), a_safe),
        ),
    )
    fraction = op.And(large_x, op.Not(op.Less(x_safe, a_safe)))
    upper_series = op.And(op.Not(large_x), op.Not(complement_series))
    if lower:
        through_upper = op.And(regular, op.And(op.Greater(x_safe, one), op.Greater(x_safe, a_safe)))
        direct = op.And(regular, op.Not(through_upper))
    else:
        through_upper, direct = regular, op.And(regular, op.Not(regular))
    series_active = op.Or(direct, op.And(through_upper, complement_series))
    series = _igam_series(ctx, a_safe, x_safe, series_active)
    continued = _igamc_continued_fraction(ctx, a_safe, x_safe, op.And(through_upper, fraction))
    upper_small = _igamc_series(ctx, a_safe, x_safe, op.And(through_upper, upper_series))
    upper = op.Where(complement_series, op.Sub(one, series), op.Where(fraction, continued, upper_small))
    if lower:
        result = op.Where(through_upper, op.Sub(one, upper), series)
    else:
        result = upper
    result = op.Where(asymptotic, _igam_asymptotic(a_safe, x_safe, lower), result)
    # Boundaries, in eager's order of tests (later Wheres win): x inf, a inf, x 0, a 0, negatives.
    nan = _const(float("nan"), a)
    full, empty = (one, zero) if lower else (zero, one)
    result = op.Where(op.IsInf(x), full, result)
    result = op.Where(op.IsInf(a), op.Where(op.IsInf(x), nan, empty), result)
    result = op.Where(op.Equal(x, zero), empty, result)
    result = op.Where(op.Equal(a, zero), op.Where(op.Greater(x, zero), full, nan), result)
    result = op.Where(op.Or(op.Less(x, zero), op.Less(a, zero)), nan, result)
    return op.Where(op.Or(op.IsNaN(a), op.IsNaN(x)), nan, result)


@lowering("aten::igamma", context=True)
def igamma(ctx: LoweringContext, self: TReal, other: TReal) -> TReal:
    return _incomplete_gamma(ctx, self, other, lower=True)


@lowering("aten::igammac", context=True)
def igammac(ctx: LoweringContext, self: TReal, other: TReal) -> TReal:
    return _incomplete_gamma(ctx, self, other, lower=False)


# --- overloads with one Python-number argument: the number as a tensor of the other's compute dtype -----------
def _number_like(value: float, like: ir.Value) -> ir.Value:
    return op.Constant(value=ir.tensor(float(value), dtype=_compute_dtype(like)))


def _register_number_overloads(name: str, function: Callable[..., ir.Value]) -> None:
    def second_is_number(ctx: LoweringContext, self: TReal, other: float) -> TReal:
        return function(ctx, self, _number_like(other, self))

    def first_is_number(ctx: LoweringContext, self: float, other: TReal) -> TReal:
        return function(ctx, _number_like(self, other), other)

    second_is_number.__name__ = f"{name}_second_number"
    first_is_number.__name__ = f"{name}_first_number"
    second, first = ("other_scalar", "self_scalar") if name == "special_zeta" else ("n_scalar", "x_scalar")
    lowering(f"aten::{name}.{second}", context=True)(second_is_number)
    lowering(f"aten::{name}.{first}", context=True)(first_is_number)


for _name, _function in {
    "special_chebyshev_polynomial_t": chebyshev_polynomial_t,
    "special_chebyshev_polynomial_u": chebyshev_polynomial_u,
    "special_chebyshev_polynomial_v": chebyshev_polynomial_v,
    "special_chebyshev_polynomial_w": chebyshev_polynomial_w,
    "special_shifted_chebyshev_polynomial_t": shifted_chebyshev_polynomial_t,
    "special_shifted_chebyshev_polynomial_u": shifted_chebyshev_polynomial_u,
    "special_shifted_chebyshev_polynomial_v": shifted_chebyshev_polynomial_v,
    "special_shifted_chebyshev_polynomial_w": shifted_chebyshev_polynomial_w,
    "special_hermite_polynomial_h": hermite_polynomial_h,
    "special_hermite_polynomial_he": hermite_polynomial_he,
    "special_laguerre_polynomial_l": laguerre_polynomial_l,
    "special_legendre_polynomial_p": legendre_polynomial_p,
    "special_zeta": zeta,
}.items():
    _register_number_overloads(_name, _function)
