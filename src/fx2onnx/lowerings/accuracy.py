"""Lowerings for ops whose torchlib implementation loses accuracy, or is wrong, in every float dtype.

ONNX has neither Log1p nor Expm1, and torchlib writes ``Log(1 + x)`` and ``Exp(x) - 1``: both lose every digit
below float's epsilon (log1p(1e-10) is 0 in float32, 1.00000008e-10 in float64). Its ``log_sigmoid``
(``Log(Sigmoid(x))``) and ``logaddexp`` (``Log(Exp(a) + Exp(b))``) also overflow or underflow where eager's
formulas do not, its ``elu`` multiplies the positive side by ``input_scale``, which eager does not, and its
``embedding_renorm`` rounds max_norm to float32 and has no inf-norm. The lowerings here follow eager's CPU kernels
(ATen's Activation.cpp, Elu.h, BinaryOpsKernel.cpp, Embedding.cpp): float16 and bfloat16 compute in float32 and
round once, as eager's kernels do; float32 and float64 compute in their own dtype, with each Python number a
constant of that dtype (float64 keeps the exact double).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript import INT64
from onnxscript import opset18 as op

from fx2onnx.emit.context import LoweringContext
from fx2onnx.lowerings.core import TFloat, _back, _const, _in_float32
from fx2onnx.lowerings.rules import lowering

_NUMPY = {ir.DataType.FLOAT: np.float32, ir.DataType.DOUBLE: np.float64}
# torch's constants for selu (ATen's Activation.cpp).
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


# --- dtype helpers -----------------------------------------------------------------------------------------------
def _as(value: TFloat, dtype: ir.DataType) -> TFloat:
    return op.Cast(value, to=dtype) if value.dtype != dtype else value


def _scalar(value: float, like: TFloat) -> float:
    """`value` as eager's kernel holds it: a double for float64, else rounded to float32."""
    return float(value) if like.dtype == ir.DataType.DOUBLE else float(np.float32(value))


# --- log1p and expm1 (for float32/float64 values) -----------------------------------------------------------------
# ONNX Runtime's Where (0.5-1 ms per million float32 elements) and Log (0.9 ms) cost several times a Mul, Exp or
# Tanh (~0.1 ms): log1p has no Where, elu's expm1 neither.
def log1p(x: TFloat) -> TFloat:
    """log(1 + x) accurate near 0, without branches: log(u) + d / u, with u = 1 + x rounded and d = x - (u - 1) its
    rounding error, exact for |x| <= 1 (Fast2Sum); d / u is log(1 + d / u) to first order, d / u being below an ulp.

    Above 1 the correction is left out (d taken as 0; Log(1 + x) is within a few ulps there); at -1 (u = 0) d is
    0 and is divided by the smallest normal instead of 0, leaving Log's -inf. inf gives inf; below -1 and -inf
    give NaN, from Log. The sum is formed negated, -(-(d / u) - log(u)), which rounds the same but keeps -0 for
    -0 (at x = +-0, log(u) is +0 and d / u is x, and +0 + -0 would be +0).
    """
    one = _const(1.0, x)
    u = op.Add(x, one)
    clamped = op.Min(x, one)
    error = op.Sub(clamped, op.Sub(op.Add(clamped, one), one))
    smallest = _const(float(np.finfo(_NUMPY[x.dtype]).tiny), x)
    return op.Neg(op.Sub(op.Neg(op.Div(error, op.Max(u, smallest))), op.Log(u)))


def expm1(x: TFloat, nonpositive: bool = False) -> TFloat:
    """exp(x) - 1 accurate near 0: (u - 1) * (x / log(u)) with u = exp(x) rounded (Kahan's trick).

    The ratio x / log(u) corrects u's rounding; it is taken first so that (u - 1) * x cannot overflow where u is
    near the largest float. x itself where u is 1; -1 where u - 1 rounds to -1 (exp underflows, -inf included);
    inf where exp overflows (left out when the caller promises x <= 0: `nonpositive`). NaN stays NaN.

    x is the last Where's second branch, selected where |u - 1| > 0 is false, so that -0 stays -0: ONNX Runtime's
    Where turns a -0 in its first branch into +0 (and its NotWhereFusion would swap the branches of a Not(u == 1)).
    """
    one = _const(1.0, x)
    u = op.Exp(x)
    below = op.Sub(u, one)
    result = op.Mul(below, op.Div(x, op.Log(u)))
    result = op.Where(op.Equal(below, _const(-1.0, x)), below, result)
    if not nonpositive:
        result = op.Where(op.IsInf(u), u, result)
    return op.Where(op.Greater(op.Abs(below), _const(0.0, x)), result, x)


def _expm1_of_nonpositive(x: TFloat) -> TFloat:
    """expm1 for x <= 0, for activations, where speed matters: in float32 2t / (1 - t) with t = tanh(x / 2), which
    cannot cancel for x <= 0 (-inf: t = -1, giving -1). Five cheap nodes, about ONNX Runtime's own Elu's time;
    Kahan's trick takes five times that (its Log and Wheres), but float64 keeps it: ONNX Runtime's float64
    Tanh is off by up to 3.5 ulps. ONNX Runtime's float32 Tanh loses relative accuracy below about 1e-36 in
    magnitude (absolute error under 1e-42), and so does this there.
    """
    if x.dtype == ir.DataType.DOUBLE:
        return expm1(x, nonpositive=True)
    t = op.Tanh(op.Mul(x, _const(0.5, x)))
    return op.Div(op.Add(t, t), op.Sub(_const(1.0, x), t))


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


# --- activations --------------------------------------------------------------------------------------------------
def _elu(self: TFloat, alpha: float, scale: float, input_scale: float) -> TFloat:
    """eager's kernel: x < 0 ? expm1(x * input_scale) * (alpha * scale) : x * scale, coefficients in the compute
    dtype (alpha * scale rounded there too). torchlib scales the positive side by input_scale as well.

    One Where picks the side (it costs about what the Min, Max and Add of a branchless sum of both sides would):
    x * scale is its second branch, so that -0 gives -0 * scale as in eager (ONNX Runtime's Where turns a -0 in
    its first branch into +0, and Min(x, 0) / Max(x, 0) return either zero at x = +-0).
    """
    x = _in_float32(self)
    alpha, scale, input_scale = (_scalar(v, x) for v in (alpha, scale, input_scale))
    negative_coefficient = _scalar(alpha * scale, x)  # float32 * float32 is exact in double, then rounded once
    scaled = x if input_scale == 1 else op.Mul(x, _const(input_scale, x))
    # Over the whole line; the positive half (inf or NaN there) is not selected.
    negative_side = _expm1_of_nonpositive(scaled) if input_scale >= 0 else expm1(scaled)
    negative = op.Mul(negative_side, _const(negative_coefficient, x))
    positive = x if scale == 1 else op.Mul(x, _const(scale, x))
    return _back(op.Where(op.Less(x, _const(0.0, x)), negative, positive), self)


@lowering("aten::elu")
def elu(self: TFloat, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> TFloat:
    return _elu(self, alpha, scale, input_scale)


@lowering("aten::celu")
def celu(self: TFloat, alpha: float = 1.0) -> TFloat:
    """eager: elu(x, alpha, 1, 1 / alpha), 1 / alpha taken in double."""
    return _elu(self, alpha, 1.0, 1.0 / alpha)


@lowering("aten::selu")
def selu(self: TFloat) -> TFloat:
    return _elu(self, _SELU_ALPHA, _SELU_SCALE, 1.0)


@lowering("aten::log_sigmoid")
def log_sigmoid(self: TFloat) -> TFloat:
    """min(x, 0) - log1p(exp(-|x|)): no overflow or underflow on either side (torchlib's Log(Sigmoid(x)) is -inf
    below about -88 in float32 and 0 above about 17)."""
    x = _in_float32(self)
    smooth = log1p(op.Exp(op.Neg(op.Abs(x))))
    return _back(op.Sub(op.Min(x, _const(0.0, x)), smooth), self)


# --- logaddexp ----------------------------------------------------------------------------------------------------
def _logaddexp(self: TFloat, other: TFloat, base2: bool) -> TFloat:
    """max(a, b) + log1p(exp(-|a - b|)) (base 2: log1p(2^-|a - b|) / ln 2), and a where a == b is infinite."""
    a, b = _in_float32(self), _in_float32(other)
    gap = op.Neg(op.Abs(op.Sub(a, b)))
    if base2:
        tail = op.Mul(log1p(op.Pow(_const(2.0, a), gap)), _const(_scalar(1.0 / math.log(2.0), a), a))
    else:
        tail = log1p(op.Exp(gap))
    result = op.Add(op.Max(a, b), tail)
    both_infinite = op.And(op.Equal(a, b), op.IsInf(a))
    return _back(op.Where(both_infinite, a, result), self)


@lowering("aten::logaddexp")
def logaddexp(self: TFloat, other: TFloat) -> TFloat:
    return _logaddexp(self, other, base2=False)


@lowering("aten::logaddexp2")
def logaddexp2(self: TFloat, other: TFloat) -> TFloat:
    return _logaddexp(self, other, base2=True)


# --- embedding_renorm ---------------------------------------------------------------------------------------------
def _row_norms(rows: TFloat, norm_type: float) -> TFloat:
    """Each row's p-norm (keepdims), as ``row.norm(p)``: 0 counts the nonzeros, +-inf the largest/smallest |x|."""
    axes = op.Constant(value_ints=[1])
    if norm_type == 1:
        return op.ReduceL1(rows, axes, keepdims=True)
    if norm_type == 2:
        return op.ReduceL2(rows, axes, keepdims=True)
    if norm_type == math.inf:
        return op.ReduceMax(op.Abs(rows), axes, keepdims=True)
    if norm_type == -math.inf:
        return op.ReduceMin(op.Abs(rows), axes, keepdims=True)
    if norm_type == 0:
        nonzero = op.Cast(op.Not(op.Equal(rows, _const(0.0, rows))), to=rows.dtype)
        return op.ReduceSum(nonzero, axes, keepdims=True)
    powers = op.ReduceSum(op.Pow(op.Abs(rows), _const(norm_type, rows)), axes, keepdims=True)
    return op.Pow(powers, _const(1.0 / norm_type, rows))


@lowering("aten::embedding_renorm")
def embedding_renorm(weight: TFloat, indices: INT64, max_norm: float, norm_type: float = 2.0) -> TFloat:
    """eager's loop over the distinct indices: a row whose norm (in the weight's dtype) exceeds max_norm is
    multiplied by max_norm / (norm + 1e-7), taken in double and rounded to the weight's dtype."""
    unique = op.Unique(indices)[0]
    rows = _in_float32(op.Gather(weight, unique))
    norms = _as(_back(_row_norms(rows, norm_type), weight), ir.DataType.DOUBLE)
    limit = op.Constant(value=ir.tensor(float(max_norm), dtype=ir.DataType.DOUBLE))
    scale = op.Div(limit, op.Add(norms, op.Constant(value=ir.tensor(1e-7, dtype=ir.DataType.DOUBLE))))
    scaled = op.Mul(rows, _in_float32(_as(scale, weight.dtype)))
    renormed = _back(op.Where(op.Greater(norms, limit), scaled, rows), weight)
    return op.ScatterND(weight, op.Unsqueeze(unique, op.Constant(value_ints=[1])), renormed)


# --- logcumsumexp -------------------------------------------------------------------------------------------------
# torchlib's is max + Log(CumSum(Exp(x - max))) with one max over the whole dim: NaN once an input is +-inf (inf - inf),
# -inf (or a few digits) for a prefix far below the later maximum. Eager folds each element into a running
# log-sum-exp (ReduceOpsKernel.cpp's _log_add_exp_helper, in double for float32). Here a prefix scan in
# ceil(log2(n)) doubling steps (Hillis-Steele): step k combines each partial with the one 2^k places before it.
# A partial is a pair (peak, excess) standing for peak + log1p(excess), excess = sum(exp(x_j - peak)) - 1: no Log
# in the steps, and the sum keeps relative accuracy where it is small. Infinities need no special case: peak is x
# clamped to the finite range and each element starts with excess exp(x - peak) - 1, which is 0 for finite x, -1
# for -inf (nothing to add; an all -inf prefix ends as -inf) and inf for +inf (inf from there on). NaN propagates
# through Max, Exp and Add. Padding holds the empty partial (lowest float, -1).
def _scan_step(peak: TFloat, excess: TFloat, pads: INT64, axes: INT64) -> tuple[TFloat, TFloat]:
    lowest = _const(float(-np.finfo(_NUMPY[peak.dtype]).max), peak)
    earlier_peak = op.Pad(peak, pads, lowest, axes)
    earlier_excess = op.Pad(excess, pads, _const(-1.0, excess), axes)
    new_peak = op.Max(peak, earlier_peak)
    own = op.Exp(op.Sub(peak, new_peak))
    other = op.Exp(op.Sub(earlier_peak, new_peak))
    # One of own/other is 1 (the larger peak's), so own + other - 1 is exactly the smaller of them.
    combined = op.Add(op.Add(op.Mul(excess, own), op.Mul(earlier_excess, other)), op.Min(own, other))
    return new_peak, combined


def _doubling_loop(
    ctx: LoweringContext, length: INT64, peak: TFloat, excess: TFloat, axes: INT64, direction: INT64
) -> tuple[TFloat, TFloat]:
    """The doubling steps for a dim whose length is known only at run time: an ONNX Loop while 2^k < length."""

    def body(iteration: ir.Value, carried: list[ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
        shift, peak_in, excess_in = carried
        peak_out, excess_out = _scan_step(peak_in, excess_in, op.Mul(direction, shift), axes)
        doubled = op.Add(shift, shift)
        return op.Less(doubled, length), [doubled, peak_out, excess_out]

    one = op.Constant(value=ir.tensor(1, dtype=ir.DataType.INT64))
    _, final_peak, final_excess = ctx.loop(length, op.Less(one, length), [one, peak, excess], body, name="scan")
    return final_peak, final_excess


@lowering("aten::logcumsumexp", context=True)
def logcumsumexp(ctx: LoweringContext, self: TFloat, dim: int) -> TFloat:
    """log(cumsum(exp(x))) along `dim`, stable for any magnitudes and at +-inf/NaN; float16/bfloat16 in float32.
    ceil(log2(n)) steps of a dozen elementwise nodes over the whole tensor: about 5 to 10 times torchlib's time."""
    x = _in_float32(self)
    rank = len(x.shape)
    if rank == 0:
        return self
    dim = dim % rank
    largest = float(np.finfo(_NUMPY[x.dtype]).max)
    peak = op.Clip(x, _const(-largest, x), _const(largest, x))  # NaN stays NaN
    excess = op.Sub(op.Exp(op.Sub(x, peak)), _const(1.0, x))
    axes = op.Constant(value_ints=[dim])
    length = x.shape[dim]
    if isinstance(length, int):
        shift = 1
        while shift < length:
            peak, excess = _scan_step(peak, excess, op.Constant(value_ints=[shift, -shift]), axes)
            shift *= 2
    else:
        direction = op.Constant(value_ints=[1, -1])  # pads: `shift` before, -`shift` (cut) after
        size = op.Squeeze(op.Shape(x, start=dim, end=dim + 1))
        peak, excess = _doubling_loop(ctx, size, peak, excess, axes, direction)
    return _back(op.Add(peak, log1p(excess)), self)


# --- atan2: the quadrant of signed zeros ---------------------------------------------------------------------------
def _sign_bit(x: TFloat) -> ir.Value:
    """True where x < 0, -0 included (1 / -0 is -inf)."""
    zero = _const(0.0, x)
    return op.Or(op.Less(x, zero), op.And(op.Equal(x, zero), op.Less(op.Div(_const(1.0, x), x), zero)))


@lowering("aten::atan2", "aten::arctan2")
def atan2(self: TFloat, other: TFloat) -> TFloat:
    """atan(y / x), turned by pi toward y's sign where x's sign bit is set, with C's special values: both zero
    or both infinite are replaced by their signs (+-1) first. torchlib's put atan2(+0, -2) at -pi (eager: +pi).
    (float64 has its own lowering in float64_math.py: ONNX Runtime's float64 Atan runs in float32.)"""
    y, x = _in_float32(self), _in_float32(other)
    one, minus_one = _const(1.0, x), _const(-1.0, x)
    both_zero = op.And(op.Equal(x, _const(0.0, x)), op.Equal(y, _const(0.0, y)))
    both_infinite = op.And(op.IsInf(x), op.IsInf(y))
    x_negative, y_negative = _sign_bit(x), _sign_bit(y)
    numerator = op.Where(both_infinite, op.Where(y_negative, minus_one, one), y)  # zeros keep their sign
    denominator = op.Where(op.Or(both_zero, both_infinite), op.Where(x_negative, minus_one, one), x)
    angle = op.Atan(op.Div(numerator, denominator))
    turned = op.Add(angle, op.Where(y_negative, _const(-math.pi, x), _const(math.pi, x)))
    return _back(op.Where(x_negative, turned, angle), self)  # angle second: ONNX Runtime's Where keeps its -0
