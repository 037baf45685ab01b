"""Elementwise math and activations: log1p/expm1 and what builds on them, atan2, rounding, bitwise ops,
casts, gelu/sigmoid..., each op's generic rule beside its dtype variants (float64, integer, reduced precision).
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import (
    BOOL,
    DOUBLE,
    FLOAT,
    INT8,
    INT16,
    INT32,
    INT64,
    UINT8,
    UINT16,
    UINT32,
    UINT64,
)
from onnxscript import opset18 as op

from fx2onnx._constant_arrays import constant_array
from fx2onnx._emit.context import LoweringContext
from fx2onnx._lowerings.builders import (
    _BITS,
    _LOW_PRECISION,
    TFloat,
    TIndex,
    TInt,
    TIntegral,
    TReal,
    _back,
    _cast,
    _const,
    _double,
    _in_float32,
    _int_const,
    _is_float,
    _p_norm,
    _scaled_sum,
    _select,
    _selection_reads,
    _wide,
    _widened,
    expm1,
    log1p,
)
from fx2onnx._lowerings.kernels import _erf, _with_sign_of, acos_of_double, atan_nonnegative, double, keep_nan
from fx2onnx._lowerings.rules import alias, lowering

# torch's constants for selu (ATen's Activation.cpp).
_SELU_ALPHA = 1.6732632423543772848170429916717


_SELU_SCALE = 1.0507009873554804934193349852946


def _scalar(value: float, like: TFloat) -> float:
    """`value` as eager's kernel holds it: a double for float64, else rounded to float32."""
    return float(value) if like.dtype == ir.DataType.DOUBLE else float(np.float32(value))


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


# --- sigmoid and the gates built on it -----------------------------------------------------------------------------
# eager's kernel, 1 / (1 + exp(-x)), in ONNX nodes: within 2 ulps of eager for every float32 tried (542k values over
# [-104, 20], NaN, +-inf; subnormal results too). ONNX Runtime 1.32's float32 Sigmoid (MLAS's logistic) is 8 ulps
# off at -2, 25k at -10, 17% at -15 and 0 from -17 down (eager: 2e-9 at -20), so log(sigmoid(x)) was -inf; its
# float64 Sigmoid is 0 below -36.7 (eager: 4.9e-60 at -136.5). Cost of the four nodes: +1% CPU on EfficientNet-B0
# (its 16 squeeze-excitation gates, interleaved medians of 150 runs). float16/bfloat16 come in float32
# (float32_opmath) and round once.
def _one_plus_exp_minus(x: TFloat) -> TFloat:
    return op.Add(_const(1.0, x), op.Exp(op.Neg(x)))


@lowering("aten::sigmoid", "aten::special_expit")
def sigmoid(self: TFloat) -> TFloat:
    x = _in_float32(self)
    return _back(op.Reciprocal(_one_plus_exp_minus(x)), self)


@lowering("aten::glu")
def glu(self: TFloat, dim: int = -1) -> TFloat:
    """a * sigmoid(b) for the halves a, b of `dim`."""
    a, b = op.Split(_in_float32(self), axis=dim, num_outputs=2)
    return _back(op.Mul(a, op.Reciprocal(_one_plus_exp_minus(b))), self)


@lowering("aten::silu")
def silu(self: TFloat) -> TFloat:
    """x * Sigmoid(x), which ONNX Runtime fuses into one QuickGelu (kept in its NCHWc layout after a Conv). Its
    error is float32's epsilon times x at most, |silu(x) - eager| <= 1.33e-7 |x| (11M float32 over [-104, 0]):
    invisible wherever silu's output meets values of x's size (MatMul, Conv, a residual), but relative to silu
    itself it is MLAS's tail, all of it from -16 down (tests/test_accuracy_lowerings.py pins it). Eager's
    x / (1 + exp(-x)) is four nodes that leave NCHWc: +35% CPU on EfficientNet-B0 (49 SiLUs); on hf-llama within
    noise (+0.6%, quartiles -1.4..+4%)."""
    x = _in_float32(self)
    return _back(op.Mul(x, op.Sigmoid(x)), self)


@lowering("aten::silu", variant="float64")
def silu_of_double(self: DOUBLE) -> DOUBLE:
    """x / (1 + exp(-x)), eager's kernel: ONNX Runtime's float64 Sigmoid is 0 below -36.7."""
    return op.Div(self, _one_plus_exp_minus(self))


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


# --- atan2: the quadrant of signed zeros ---------------------------------------------------------------------------
def _sign_bit(x: TFloat) -> ir.Value:
    """True where x < 0, -0 included (1 / -0 is -inf)."""
    zero = _const(0.0, x)
    return op.Or(op.Less(x, zero), op.And(op.Equal(x, zero), op.Less(op.Div(_const(1.0, x), x), zero)))


@lowering("aten::atan2", "aten::arctan2")
def atan2(self: TFloat, other: TFloat) -> TFloat:
    """atan(y / x), turned by pi toward y's sign where x's sign bit is set, with C's special values: both zero
    or both infinite are replaced by their signs (+-1) first. torchlib's put atan2(+0, -2) at -pi (eager: +pi).
    (float64 has its own lowering, atan2_float64: ONNX Runtime's float64 Atan runs in float32.)"""
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


def _infinite(self: TFloat, positive: bool, negative: bool) -> BOOL:
    """IsInf in the input's own float type: torchlib casts to float32 first, which makes float64 values
    above 3.4e38 infinite. float16/bfloat16 (which IsInf takes from opset 20) widen to float32 exactly."""
    x = op.Cast(self, to=FLOAT.dtype) if self.dtype in _LOW_PRECISION else self
    return op.IsInf(x, detect_positive=int(positive), detect_negative=int(negative))


@lowering("aten::isinf")
def isinf(self: TFloat) -> BOOL:
    return _infinite(self, positive=True, negative=True)


@lowering("aten::isposinf")
def isposinf(self: TFloat) -> BOOL:
    return _infinite(self, positive=True, negative=False)


@lowering("aten::isneginf")
def isneginf(self: TFloat) -> BOOL:
    return _infinite(self, positive=False, negative=True)


def _truncated(self: TFloat) -> TFloat:
    """Floor above zero, Ceil elsewhere: keeps -0.0 for -0.0 and (-1, 0), where torchlib's
    Floor(Abs(x)) * Sign(x) gives +0.0. (The -0.0 results come from Where's second branch: ONNX Runtime's
    Where turns a -0.0 taken from its first branch into +0.0.)"""
    return op.Where(op.Greater(self, op.CastLike(0, self)), op.Floor(self), op.Ceil(self))


@lowering("aten::trunc")
def trunc(self: TFloat) -> TFloat:
    return _truncated(self)


@lowering("aten::frac")
def frac(self: TFloat) -> TFloat:
    """x - trunc(x): +0.0 for -0.0 as in eager (torchlib's trunc gives -0.0 - +0.0 = -0.0)."""
    return op.Sub(self, _truncated(self))


@lowering("aten::signbit", "prims::signbit")
def signbit(self: TReal) -> BOOL:
    """True for negative numbers and -0.0 (1/-0.0 is -inf). NaN's sign bit is not visible in ONNX: False."""
    if self.dtype == ir.DataType.BOOL:
        return op.And(self, op.Not(self))
    zero = op.CastLike(0, self)
    negative = op.Less(self, zero)
    if self.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        return negative
    negative_zero = op.And(op.Equal(self, zero), op.Less(op.Reciprocal(self), zero))
    return op.Or(negative, negative_zero)


@lowering("aten::sign", "aten::sgn")
def sign_float(self: TFloat) -> TFloat:
    """-1, 0 or 1; eager's kernel computes (0 < x) - (x < 0), which is 0 for NaN (ONNX's Sign gives NaN) and +0
    for -0."""
    zero = _const(0.0, self)
    return op.Sub(op.CastLike(op.Less(zero, self), self), op.CastLike(op.Less(self, zero), self))


# --- floor division and remainder of floats, as eager's kernels (BinaryOpsKernel.cpp, div_floor_floating_vec) ---
# torchlib's Floor(a / b) gave inf for inf // 2 (eager: NaN, from fmod(inf, 2)) and its a - floor(a / b) * b
# remainder lost the small remainders of large values: (-128.0) % 0.001 gave 0, eager 6.08e-06 (from fmod, which is
# exact). float16/bfloat16 (measured on torch 2.13): a tensor divisor's floor/trunc quotient rounds in the dtype
# after each step (as these nodes do, legalized one by one); a number divisor is read as a float32 and the quotient
# computed in float32, rounded once; remainder rounds the number to the dtype (then the steps are exact or round once).
def _remainder_float(a: TFloat, b: TFloat) -> TFloat:
    """fmod(a, b), plus b where it is non-zero and its sign differs from b's."""
    mod = op.Mod(a, b, fmod=1)
    zero = _const(0.0, a)
    wrong_side = op.And(op.Not(op.Equal(mod, zero)), op.Xor(op.Less(b, zero), op.Less(mod, zero)))
    return op.Where(wrong_side, op.Add(mod, b), mod)


def _floor_divide_float(a: TFloat, b: TFloat) -> TFloat:
    zero, one = _const(0.0, a), _const(1.0, a)
    quotient = op.Div(a, b)
    mod = op.Mod(a, b, fmod=1)
    # a - mod is exactly divisible; where a / b overflows with a finite, eager divides a itself.
    overflows = op.And(op.IsInf(quotient), op.Not(op.IsInf(a)))
    divided = op.Div(op.Where(overflows, a, op.Sub(a, mod)), b)
    wrong_side = op.And(op.Not(op.Equal(mod, zero)), op.Xor(op.Less(b, zero), op.Less(mod, zero)))
    divided = op.Where(wrong_side, op.Sub(divided, one), divided)
    floored = op.Floor(divided)
    floored = op.Where(op.Greater(op.Sub(divided, floored), _const(0.5, a)), op.Add(floored, one), floored)
    # A zero quotient takes a / b's sign (0.0 // -inf is -0.0, eager's copysign(0, a / b)); floored is a zero of
    # b's sign there (+0.0 / b), negated where the two differ. A product by -1, not a Where picking a -0.0: ONNX
    # Runtime's Where turns a -0.0 from its first branch into +0.0 and its NotWhereFusion swaps the branches of a
    # Where(Not(c), ...) (docs/ort-defects.md).
    negative = _const(-1.0, a)
    sign_differs = op.Xor(op.Less(op.Reciprocal(floored), zero), op.Less(op.Reciprocal(quotient), zero))
    floored = op.Mul(floored, op.Where(op.And(op.Equal(divided, zero), sign_differs), negative, one))
    return op.Where(op.Equal(b, zero), quotient, floored)


def _rounded_quotient(self: TFloat, other: TFloat | float, rounding_mode: str | None) -> TFloat:
    if isinstance(other, ir.Value):
        a, b = self, other
    else:  # a number: float32 (float64 for float64) and unrounded, the quotient rounded once
        a = _in_float32(self)
        b = _const(float(other), a)
    if rounding_mode == "floor":
        return _back(_floor_divide_float(a, b), self)
    quotient = op.Div(a, b)
    return _back(_truncated(quotient) if rounding_mode == "trunc" else quotient, self)


@lowering("aten::div.Tensor_mode", "aten::div.Scalar_mode")
def div_mode_float(self: TFloat, other: TFloat, rounding_mode: str | None = None) -> TFloat:
    return _rounded_quotient(self, other, rounding_mode)


@lowering("aten::floor_divide", "aten::floor_divide.Scalar")
def floor_divide_float(self: TFloat, other: TFloat) -> TFloat:
    return _rounded_quotient(self, other, "floor")


@lowering("aten::remainder.Tensor", "aten::remainder.Scalar", "prims::remainder")
def remainder_float(self: TFloat, other: TFloat) -> TFloat:
    return _remainder_float(self, other if isinstance(other, ir.Value) else _const(float(other), self))


@lowering("aten::remainder.Scalar_Tensor")
def remainder_scalar_tensor_float(self: float, other: TFloat) -> TFloat:
    return _remainder_float(_const(float(self), other), other)


@lowering("aten::addr")
def addr_int(self: TInt, vec1: TInt, vec2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    column = op.Unsqueeze(_widened(vec1), op.Constant(value_ints=[1]))
    row = op.Unsqueeze(_widened(vec2), op.Constant(value_ints=[0]))
    return _scaled_sum(self, op.Mul(column, row), beta, alpha)


def _nan_ignoring(self: TReal, other: TReal, largest: bool) -> TReal:
    """fmax/fmin: like maximum/minimum, but a NaN loses to a number (NaN only when both are NaN)."""
    picked = op.Max(self, other) if largest else op.Min(self, other)
    if not _is_float(self):
        return picked
    return op.Where(op.IsNaN(self), other, op.Where(op.IsNaN(other), self, picked))


@lowering("aten::fmax")
def fmax(self: TReal, other: TReal) -> TReal:
    return _nan_ignoring(self, other, largest=True)


@lowering("aten::fmin")
def fmin(self: TReal, other: TReal) -> TReal:
    return _nan_ignoring(self, other, largest=False)


@lowering("aten::heaviside")
def heaviside(self: TReal, values: TReal) -> TReal:
    """values where x is 0, else x > 0: 0 at NaN, as eager (torchlib's Where(x < 0, 0, 1) gave 1)."""
    stepped = op.CastLike(op.Greater(self, op.CastLike(0, self)), self)
    return op.Where(op.Equal(self, op.CastLike(0, self)), values, stepped)


@lowering("aten::hypot")
def hypot(self: TFloat, other: TFloat) -> TFloat:
    """sqrt(x**2 + y**2), scaled by max(|x|, |y|) so that squares of large values do not overflow."""
    x, y = op.Abs(self), op.Abs(other)
    larger, smaller = op.Max(x, y), op.Min(x, y)
    zero = op.CastLike(0.0, larger)
    ratio = op.Div(smaller, op.Where(op.Equal(larger, zero), op.CastLike(1.0, larger), larger))
    result = op.Mul(larger, op.Sqrt(op.Add(op.CastLike(1.0, larger), op.Mul(ratio, ratio))))
    infinite = op.Or(op.IsInf(self), op.IsInf(other))  # hypot(inf, nan) is inf, as in C
    return op.Where(infinite, op.CastLike(float("inf"), larger), result)


@lowering("aten::to.dtype")
def to_dtype(
    self: TReal, dtype: int, non_blocking: bool = False, copy: bool = False, memory_format: str | None = None
) -> TReal:
    del non_blocking, copy, memory_format
    return op.Cast(self, to=dtype)


@lowering("aten::to.dtype_layout")
def to_dtype_layout(
    self: TReal,
    dtype: int | None = None,
    layout: str | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
    non_blocking: bool = False,
    copy: bool = False,
    memory_format: str | None = None,
) -> TReal:
    """``Tensor.to(device)``, ``.to(device=, dtype=)`` (transformers' models call it): a Cast, or the tensor itself
    when no dtype is given (devices and layouts mean nothing in an ONNX graph)."""
    del layout, device, pin_memory, non_blocking, copy, memory_format
    return op.Identity(self) if dtype is None else op.Cast(self, to=dtype)


@lowering("aten::to.device")
def to_device(
    self: TReal,
    device: str | None,
    dtype: int,
    non_blocking: bool = False,
    copy: bool = False,
    memory_format: str | None = None,
) -> TReal:
    """``Tensor.to(device, dtype)``: a Cast (LLaMA's rotary embedding calls it)."""
    del device, non_blocking, copy, memory_format
    return op.Cast(self, to=dtype)


@lowering("aten::to.other")
def to_other(
    self: TReal, other: TReal, non_blocking: bool = False, copy: bool = False, memory_format: str | None = None
) -> TReal:
    """``Tensor.to(other)``: `other`'s dtype."""
    del non_blocking, copy, memory_format
    return op.CastLike(self, other)


# `min(a, b)`/`max(a, b)` of two tensors are ATen's minimum/maximum under another name (T5's relative position
# buckets call them): lowered by whatever lowers those, so that NaN and bool semantics stay the same.
alias("aten::min.other", "aten::minimum")
alias("aten::max.other", "aten::maximum")


@lowering("aten::_conj_physical", "aten::conj_physical")
def conj_physical_real(self: TReal) -> TReal:
    """The conjugate of a real tensor is the tensor itself."""
    return op.Identity(self)


# --- activations ----------------------------------------------------------------------------------------------
@lowering("aten::leaky_relu")
def leaky_relu(self: DOUBLE, negative_slope: float = 0.01) -> DOUBLE:
    """x > 0 ? x : x * negative_slope."""
    return op.Where(op.Greater(self, _double(0.0)), self, op.Mul(self, _double(negative_slope)))


@lowering("aten::hardtanh")
def hardtanh(self: DOUBLE, min_val: float = -1.0, max_val: float = 1.0) -> DOUBLE:
    return op.Clip(self, _double(min_val), _double(max_val))


@lowering("aten::hardsigmoid")
def hardsigmoid(self: DOUBLE) -> DOUBLE:
    """min(max(x + 3, 0), 6) / 6."""
    return op.Div(op.Clip(op.Add(self, _double(3.0)), _double(0.0), _double(6.0)), _double(6.0))


@lowering("aten::hardswish")
def hardswish(self: DOUBLE) -> DOUBLE:
    """x * min(max(x + 3, 0), 6) / 6."""
    clipped = op.Clip(op.Add(self, _double(3.0)), _double(0.0), _double(6.0))
    return op.Div(op.Mul(self, clipped), _double(6.0))


@lowering("aten::threshold")
def threshold(self: TFloat, threshold: float, value: float) -> TFloat:
    """x <= threshold ? value : x (NaN kept), float16/bfloat16 compared in float32 as eager does (threshold(0.5 in
    float16, 0.49999) keeps 0.5: the number is not rounded to float16)."""
    computed = _in_float32(self)
    return op.Where(op.LessOrEqual(computed, _const(float(threshold), computed)), _const(float(value), self), self)


@lowering("aten::threshold", variant="integer")
def threshold_integer(self: TInt, threshold: float, value: float) -> TInt:
    """x <= threshold ? value : x, the numbers converted to x's dtype toward zero first, as eager converts them
    (threshold(0, -0.5, 7) is 7). torch's decomposition compared and selected in float32 (the numbers' promotion)
    and cast back: int32's 2**31 - 1 came back as -2**31 (int64's near its bounds likewise)."""
    low, replacement = _int_const(int(threshold), self.dtype), _int_const(int(value), self.dtype)
    return op.Where(op.LessOrEqual(self, low), replacement, self)


@lowering("aten::softplus")
def softplus(self: DOUBLE, beta: float = 1.0, threshold: float = 20.0) -> DOUBLE:
    """x * beta > threshold ? x : log1p(exp(x * beta)) / beta."""
    scaled = op.Mul(self, _double(beta))
    smooth = op.Div(log1p(op.Exp(scaled)), _double(beta))
    return op.Where(op.Greater(scaled, _double(threshold)), self, smooth)


# --- pointwise math -------------------------------------------------------------------------------------------
# In eager's order for every float dtype (float16/bfloat16 computed in float32 by the opmath pass): torchlib's
# value * (tensor1 / tensor2) gave 1e30 where eager's (1e30 * 1e30) / 1e30 overflows to inf.
@lowering("aten::addcmul")
def addcmul(self: TFloat, tensor1: TFloat, tensor2: TFloat, value: float = 1.0) -> TFloat:
    """self + value * tensor1 * tensor2, in eager's order."""
    return op.Add(self, op.Mul(op.Mul(_const(float(value), self), tensor1), tensor2))


@lowering("aten::addcdiv")
def addcdiv(self: TFloat, tensor1: TFloat, tensor2: TFloat, value: float = 1.0) -> TFloat:
    """self + value * tensor1 / tensor2, in eager's order."""
    return op.Add(self, op.Div(op.Mul(_const(float(value), self), tensor1), tensor2))


@lowering("aten::xlogy.Tensor")
def xlogy(self: TFloat, other: TFloat) -> TFloat:
    """x * log(y), 0 where x is 0, NaN where y is NaN first, as eager (torchlib's xlogy(0, nan) was 0); float16 and
    bfloat16 computed in float32 and rounded once."""
    x, y = _in_float32(self), _in_float32(other)
    zero = _const(0.0, x)
    product = op.Where(op.Equal(x, zero), zero, op.Mul(x, op.Log(y)))
    return _back(op.Where(op.IsNaN(y), y, product), self)


@lowering("aten::log10")
def log10(self: DOUBLE) -> DOUBLE:
    return op.Div(op.Log(self), _double(math.log(10.0)))


@lowering("aten::log2")
def log2(self: DOUBLE) -> DOUBLE:
    return op.Div(op.Log(self), _double(math.log(2.0)))


_LN2 = 0.693147180559945309417232121458176568


_PI_HIGH, _PI_LOW = 3.141592653589793, 1.2246467991473532e-16  # pi = high + low to 107 bits


_TANH_ONE = 18.714973875  # SLEEF's tanh is +-1 above this


def _is_negative(x: DOUBLE) -> BOOL:
    """The sign bit: true for -0 too (1 / -0 is -inf)."""
    zero = double(0.0)
    return op.Or(op.Less(x, zero), op.And(op.Equal(x, zero), op.Less(op.Div(double(1.0), x), zero)))


def _zeros_kept(x: DOUBLE, result: DOUBLE) -> DOUBLE:
    """x itself where it is +-0 (and NaN), for odd functions. x goes in Where's second branch: ONNX Runtime's
    Where turns a -0 in its first branch into +0."""
    return op.Where(op.Greater(op.Abs(x), double(0.0)), result, x)


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
def atan2_float64(self: DOUBLE, other: DOUBLE) -> DOUBLE:
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


TIntegralOrBool = TypeVar("TIntegralOrBool", BOOL, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64)


# --- rounding: the identity on integers -------------------------------------------------------------------
@lowering("aten::ceil", "aten::floor", "aten::round", "aten::trunc")
def round_integer(self: TIntegral) -> TIntegral:
    """An integer is already integral: eager returns its values unchanged, in its dtype."""
    return op.Identity(self)


@lowering("aten::round.decimals")
def round_decimals_integer(self: TIntegral, decimals: int = 0) -> TIntegral:
    """Eager has no integer kernel for round(decimals=...) (any decimals, 0 included): refuse as eager does."""
    name = ir.DataType(self.dtype).name.lower()
    raise NotImplementedError(
        f"torch.round(x, decimals={decimals}) is not implemented for {name} tensors in eager PyTorch "
        f'("round_cpu" not implemented), so the model does not run in eager either; drop `decimals` '
        "(rounding an integer returns it unchanged) or round a float tensor, e.g. `x.double().round(decimals=...)`"
    )


# Eager's round_decimals_kernel computes in its opmath type (float32 for float16/bfloat16): x * 10**d rounded half to
# even, divided by 10**d, and for d < 0 x / 10**-d rounded, times 10**-d. torchlib's Mul/Round/Div in the half type
# rounded x * 100 first (float16 65504 * 100 overflowed: inf where eager gives 65504, fuzz seed 20000157; -14944 at
# d=-2 became -15000 where eager gives -14896), and multiplied by 10**d for d < 0 (0.1 is not exact).
@lowering("aten::round.decimals", variant="float")
def round_decimals(self: TFloat, decimals: int = 0) -> TFloat:
    """torch.round(x, decimals=d) as eager's kernel computes it (float16/bfloat16 in float32)."""
    x = _in_float32(self)
    power = 10.0 ** abs(decimals) if abs(decimals) <= 308 else math.inf  # eager's std::pow(10, |d|), then cast
    scale = _const(power, x)
    if decimals < 0:
        return _back(op.Mul(op.Round(op.Div(x, scale)), scale), self)
    return _back(op.Div(op.Round(op.Mul(x, scale)), scale), self)


# --- classification: constants of the input's shape ----------------------------------------------------------
def _filled(self: TIntegralOrBool, value: bool) -> BOOL:
    """`value` everywhere, in the input's shape as it is at run time (dynamic dims included)."""
    return op.ConstantOfShape(op.Shape(self), value=ir.tensor(np.array([value])))


@lowering("aten::isfinite")
def isfinite_integer(self: TIntegralOrBool) -> BOOL:
    return _filled(self, True)


@lowering("aten::isinf", "aten::isnan", "aten::isneginf", "aten::isposinf")
def isinf_or_isnan_integer(self: TIntegralOrBool) -> BOOL:
    return _filled(self, False)


# Eager's isclose of integers (and bool) computes the error in the default float dtype (float32): |a - b| is exact
# there up to 2**24, where torchlib's Sub in the integers' own type wrapped (int8 isclose(-128, 0) was True, eager
# False; found probing the fuzzer's limits catalogue).
@lowering("aten::isclose")
def isclose_integer(
    self: TIntegralOrBool, other: TIntegralOrBool, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> BOOL:
    """a == b, or |a - b| <= atol + |rtol b| in the default float dtype (equal_nan has no NaN to meet)."""
    close = op.Equal(self, other)
    if rtol == 0 and atol == 0:
        return close
    to = DOUBLE.dtype if torch.get_default_dtype() == torch.float64 else FLOAT.dtype
    a, b = op.Cast(self, to=to), op.Cast(other, to=to)
    allowed = op.Add(_const(float(atol), a), op.Abs(op.Mul(_const(float(rtol), a), b)))
    return op.Or(close, op.LessOrEqual(op.Abs(op.Sub(a, b)), allowed))


# --- Python's &, |, ^ as ATen ops, and the prims bitwise ops ----------------------------------------------------
# torchlib lowers `bitwise_and` and friends but not these spellings of them, which decompositions leave in graphs
# (a complex `logical_and` decomposes to `ne(x, 0) & ne(y, 0)`; `logical_or` to prims::bitwise_or).
@lowering("aten::__and__.Tensor", "prims::bitwise_and")
def bitwise_and_operator(self: TIntegralOrBool, other: TIntegralOrBool) -> TIntegralOrBool:
    return op.And(self, other) if self.dtype == ir.DataType.BOOL else op.BitwiseAnd(self, other)


@lowering("aten::__or__.Tensor", "prims::bitwise_or")
def bitwise_or_operator(self: TIntegralOrBool, other: TIntegralOrBool) -> TIntegralOrBool:
    return op.Or(self, other) if self.dtype == ir.DataType.BOOL else op.BitwiseOr(self, other)


@lowering("aten::__xor__.Tensor", "prims::bitwise_xor")
def bitwise_xor_operator(self: TIntegralOrBool, other: TIntegralOrBool) -> TIntegralOrBool:
    return op.Xor(self, other) if self.dtype == ir.DataType.BOOL else op.BitwiseXor(self, other)


TSigned = TypeVar("TSigned", INT8, INT16, INT32, INT64)


_UNSIGNED = (ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64)


def _operand(value: ir.Value | int | float | bool, dtype: ir.DataType) -> ir.Value:
    """A tensor operand, or a Python number (the Scalar overloads) as a constant of `dtype`."""
    return value if isinstance(value, ir.Value) else _int_const(int(value), dtype)


def _is_signed(dtype: ir.DataType) -> bool:
    return dtype not in _UNSIGNED


# --- division with a rounding mode, remainder ----------------------------------------------------------------------
# ONNX Runtime stops the run at an integer Div/Mod by zero even where the dividend is empty and nothing is divided
# (eager: an empty tensor; a non-empty dividend by zero raises in eager, so only an empty one needs the guard): fuzz
# seed 36028, `topk(x, 0).values % y`. A constant divisor's zeros are made ones in legalize (fusion_guards), and a
# dividend of static non-empty shape needs nothing, so the guard costs something only where the dividend's shape is
# dynamic or empty and the divisor is computed. An int32/int64 Div of INT_MIN by -1 traps in ONNX Runtime (SIGFPE,
# the process dies) where eager's floor division gives INT_MIN (wrapping); eager's remainder/fmod give 0, as Mod does.
def _constant_values(value: ir.Value | int | float | bool) -> np.ndarray | None:
    """The values of a Python number or of a value the graph fixes (`constant_array`: what legalize rewrites)."""
    return constant_array(value) if isinstance(value, ir.Value) else np.asarray(value)


def _may_be_empty(value: ir.Value) -> bool:
    return value.shape is None or any(not isinstance(dim, int) or dim == 0 for dim in value.shape)


def _divisor(dividend: TInt, divisor: TInt | int) -> TInt:
    """The divisor as a tensor of the dividend's dtype, its zeros made ones where ONNX Runtime could meet them
    beside an empty dividend (every non-zero divisor, and so every quotient eager computes, is unchanged)."""
    divisor = _operand(divisor, dividend.dtype)
    if _constant_values(divisor) is not None or not _may_be_empty(dividend):
        return divisor
    zero, one = _int_const(0, dividend.dtype), _int_const(1, dividend.dtype)
    return op.Where(op.Equal(divisor, zero), one, divisor)


def _truncating_div(self: TInt, other: TInt) -> TInt:
    """ONNX's integer Div (rounds toward zero), with INT_MIN / -1 wrapping to INT_MIN as eager's floor division does
    (a division by 1 times -1) for int32/int64, whose Div traps there; int8/int16 divide in a wider C++ int."""
    if _BITS[self.dtype] < 32 or not _is_signed(self.dtype):
        return op.Div(self, other)
    constant = _constant_values(other)
    if constant is not None and not (constant == -1).any():
        return op.Div(self, other)
    if constant is not None and constant.size == 1:
        return op.Neg(self)  # x // -1 (Neg wraps INT_MIN to itself)
    one, minus_one = _int_const(1, self.dtype), _int_const(-1, self.dtype)
    sign = op.Where(op.Equal(other, minus_one), minus_one, one)
    return op.Mul(op.Div(self, op.Mul(other, sign)), sign)


def _floor_divided(self: TInt, other: TInt) -> TInt:
    """Truncating Div, minus one where the remainder is non-zero and the operands' signs differ (eager's rule)."""
    quotient = _truncating_div(self, other)
    if not _is_signed(self.dtype):
        return quotient
    zero = _int_const(0, self.dtype)
    inexact = op.Not(op.Equal(op.Mod(self, other, fmod=1), zero))
    signs_differ = op.Xor(op.Less(self, zero), op.Less(other, zero))
    return op.Sub(quotient, op.Cast(op.And(inexact, signs_differ), to=self.dtype))


@lowering("aten::div.Tensor_mode", "aten::div.Scalar_mode")
def div_mode_integer(self: TInt, other: TInt, rounding_mode: str | None = None) -> TInt:
    """Integer division rounded toward zero (ONNX's integer Div) or down; without a mode, eager divides in float
    (promotion has made the operands float then, and this rule is not reached)."""
    other = _divisor(self, other)
    if rounding_mode == "trunc":
        return op.Div(self, other)  # int32/int64 INT_MIN / -1 traps in eager too
    if rounding_mode == "floor":
        return _floor_divided(self, other)
    raise NotImplementedError(f"integer div with rounding_mode={rounding_mode!r}: eager divides in float")


@lowering("aten::floor_divide", "aten::floor_divide.Scalar")
def floor_divide_integer(self: TInt, other: TInt) -> TInt:
    return _floor_divided(self, _divisor(self, other))


@lowering("aten::remainder.Tensor", "aten::remainder.Scalar", "prims::remainder")
def remainder_integer(self: TInt, other: TInt) -> TInt:
    """Mod with the divisor's sign (eager's remainder), INT_MIN % -1 included (0, as in eager)."""
    return op.Mod(self, _divisor(self, other))


@lowering("aten::remainder.Scalar_Tensor")
def remainder_scalar_tensor_integer(self: int, other: TInt) -> TInt:
    """A number's remainder has the divisor's shape: eager raises at any zero of it, so no guard is needed."""
    return op.Mod(_int_const(int(self), other.dtype), other)


@lowering("aten::fmod.Tensor", "aten::fmod.Scalar")
def fmod_integer(self: TInt, other: TInt) -> TInt:
    """Mod with the dividend's sign (C's %, eager's fmod)."""
    return op.Mod(self, _divisor(self, other), fmod=1)


# --- powers ----------------------------------------------------------------------------------------------------
def _negative_power(base: ir.Value, exponent: ir.Value) -> ir.Value:
    """Eager's integer power for a negative exponent: 1 for base 1, +-1 for base -1 (by the exponent's parity), else 0
    (0 ** -3 included)."""
    one, minus_one, zero = (_int_const(v, base.dtype) for v in (1, -1, 0))
    odd = op.Equal(op.BitwiseAnd(exponent, _int_const(1, exponent.dtype)), _int_const(1, exponent.dtype))
    at_minus_one = op.Where(odd, minus_one, one)
    return op.Where(op.Equal(base, one), one, op.Where(op.Equal(base, minus_one), at_minus_one, zero))


def _power_by_squaring(base: ir.Value, exponent: int) -> ir.Value:
    """base ** exponent (>= 0) by squaring, in base's dtype (wrapping as eager's multiplications do)."""
    result: ir.Value | None = None
    square = base
    while exponent:
        if exponent & 1:
            result = square if result is None else op.Mul(result, square)
        exponent >>= 1
        if exponent:
            square = op.Mul(square, square)
    return result if result is not None else op.Expand(_int_const(1, base.dtype), op.Shape(base))


def _integer_power(base: TInt, exponent: TInt | int, dtype: ir.DataType) -> TInt:
    wide = _wide(dtype)
    wide_base = _cast(base, wide)
    if not isinstance(exponent, ir.Value):
        if exponent < 0:
            raise NotImplementedError(
                f"{ir.DataType(dtype).name.lower()} tensor ** {exponent}: eager refuses it "
                '("Integers to negative integer powers are not allowed"); raise a float tensor to the power'
            )
        return _cast(_power_by_squaring(wide_base, exponent), dtype)
    wide_exponent = _cast(exponent, wide)
    # Square-and-multiply over every bit the exponent's dtype can set (the sign bit aside): log2 steps, unrolled.
    one, zero = _int_const(1, wide), _int_const(0, wide)
    result = op.Expand(one, op.Shape(op.Add(wide_base, op.Mul(wide_exponent, zero))))
    square = wide_base
    bits = _BITS[exponent.dtype] - (1 if _is_signed(exponent.dtype) else 0)
    for bit in range(bits):
        mask = _int_const(1 << bit, wide)
        is_set = op.Not(op.Equal(op.BitwiseAnd(wide_exponent, mask), zero))
        result = op.Where(is_set, op.Mul(result, square), result)
        if bit + 1 < bits:
            square = op.Mul(square, square)
    if _is_signed(exponent.dtype):
        result = op.Where(op.Less(wide_exponent, zero), _negative_power(wide_base, wide_exponent), result)
    return _cast(result, dtype)


@lowering("aten::clamp", variant="float")
def clamp_float(self: TFloat, min: float | None = None, max: float | None = None) -> TFloat:
    """Clip with both bounds: ONNX's Clip without `max` clips to the dtype's largest finite value (the spec's
    default), so clamp(inf, min=1) gave 3.4e38 (1.8e308 in float64) where eager gives inf; likewise -inf without
    `min`. A missing bound is an infinite one. A NaN bound makes every element NaN, as in eager (Clip ignored it:
    clamp(x, min=nan) was x; fuzz seeds 20000024, 20000030)."""
    if any(bound is not None and math.isnan(float(bound)) for bound in (min, max)):
        return op.Expand(_const(math.nan, self), op.Shape(self))
    low = _const(-math.inf if min is None else float(min), self)
    high = _const(math.inf if max is None else float(max), self)
    return op.Clip(self, low, high)


@lowering("aten::clamp_min", variant="float")
def clamp_min_float(self: TFloat, min: float) -> TFloat:
    """clamp(x, min=...), as clamp_float: torchlib's Clip without `max` clipped +inf to the dtype's largest value
    (clamp_min(inf, 1e-12) was 3.4e38: F.normalize of a row holding -inf gave -inf where eager gives NaN)."""
    return clamp_float.func(self, min, None)


@lowering("aten::clamp_max", variant="float")
def clamp_max_float(self: TFloat, max: float) -> TFloat:
    """clamp(x, max=...), as clamp_float (torchlib's clamp_max(-inf, 0.5) was -3.4e38)."""
    return clamp_float.func(self, None, max)


@lowering("aten::pow.Tensor_Scalar", variant="float")
def pow_float_number(self: TFloat, exponent: float) -> TFloat:
    """x ** number. Eager's float32/float64/bfloat16 kernel computes x ** 0.5 as sqrt(x) and x ** -0.5 as
    1 / sqrt(x), which differ from pow at -inf (NaN, where pow gives inf and 0) and -0.0 (-0.0 and -inf, where pow
    gives 0 and inf); its float16 kernel calls pow."""
    if float(exponent) in (0.5, -0.5) and self.dtype != ir.DataType.FLOAT16:
        root = op.Sqrt(_in_float32(self))
        return _back(root if float(exponent) > 0 else op.Reciprocal(root), self)
    return op.Pow(self, _const(float(exponent), self))


@lowering("aten::pow.Tensor_Tensor", "aten::pow.Tensor_Scalar")
def pow_integer(self: TInt, exponent: TInt) -> TInt:
    """Integer powers by squaring, wrapping on overflow like eager (int8 3 ** 100 is -47); eager's results for
    negative exponents (only 1 and -1 give non-zero). ONNX Runtime's integer Pow goes through double."""
    return _integer_power(self, exponent, self.dtype)


@lowering("aten::pow.Scalar")
def pow_scalar_integer(self: int, exponent: TInt) -> TInt:
    """An integer number raised to an integer tensor (`3 ** x`): the result has the tensor's dtype."""
    base = op.Expand(_int_const(int(self), exponent.dtype), op.Shape(exponent))
    return _integer_power(base, exponent, exponent.dtype)


# --- shifts ----------------------------------------------------------------------------------------------------
# Eager (BinaryOpsKernel.cpp): a shift by a negative amount or by the bit width or more gives 0 to the left; to the
# right, the sign fill (0 or -1; 0 for unsigned) — ONNX's BitShift, on unsigned types only, leaves them undefined.
_UNSIGNED_OF = {ir.DataType.INT32: ir.DataType.UINT32, ir.DataType.INT64: ir.DataType.UINT64}


def _shift_amount_in_range(amount: ir.Value, dtype: ir.DataType, limit: int) -> ir.Value:
    """0 <= amount < limit (amount in `dtype`; an unsigned amount whose sign bit is set counts as negative)."""
    if _is_signed(dtype):
        return op.And(op.GreaterOrEqual(amount, _int_const(0, dtype)), op.Less(amount, _int_const(limit, dtype)))
    return op.Less(amount, _int_const(min(limit, 1 << (_BITS[dtype] - 1)), dtype))


def _logical_shift(value: ir.Value, amount: ir.Value, direction: str) -> ir.Value:
    """BitShift of a non-negative int32/int64 `value` (or any uint8) by an in-range amount, in value's dtype."""
    if value.dtype == ir.DataType.UINT8:
        return op.BitShift(value, _cast(amount, ir.DataType.UINT8), direction=direction)
    unsigned = _UNSIGNED_OF[value.dtype]
    shifted = op.BitShift(op.Cast(value, to=unsigned), op.Cast(amount, to=unsigned), direction=direction)
    return op.Cast(shifted, to=value.dtype)


@lowering(
    "aten::__lshift__.Tensor", "aten::__lshift__.Scalar", "aten::bitwise_left_shift.Tensor",
    "aten::bitwise_left_shift.Tensor_Scalar",
)  # fmt: skip
def left_shift_integer(self: TInt, other: TInt) -> TInt:
    dtype = self.dtype
    amount = _operand(other, dtype)
    valid = _shift_amount_in_range(amount, dtype, _BITS[dtype])
    work = ir.DataType.UINT8 if dtype == ir.DataType.UINT8 else _wide(dtype)
    safe_amount = op.Where(valid, _cast(amount, work), _int_const(0, work))
    shifted = _cast(_logical_shift(_cast(self, work), safe_amount, "LEFT"), dtype)
    return op.Where(valid, shifted, _int_const(0, dtype))


@lowering("aten::bitwise_left_shift.Scalar_Tensor")
def left_shift_scalar_integer(self: int, other: TInt) -> TInt:
    return left_shift_integer.func(op.Expand(_int_const(int(self), other.dtype), op.Shape(other)), other)


@lowering(
    "aten::__rshift__.Tensor", "aten::__rshift__.Scalar", "aten::bitwise_right_shift.Tensor",
    "aten::bitwise_right_shift.Tensor_Scalar",
)  # fmt: skip
def right_shift_integer(self: TInt, other: TInt) -> TInt:
    dtype = self.dtype
    amount = _operand(other, dtype)
    if not _is_signed(dtype):
        valid = _shift_amount_in_range(amount, dtype, _BITS[dtype])
        safe_amount = op.Where(valid, amount, _int_const(0, dtype))
        shifted = _cast(_logical_shift(_cast(self, ir.DataType.UINT8), safe_amount, "RIGHT"), dtype)
        return op.Where(valid, shifted, _int_const(0, dtype))
    # Arithmetic shift: a negative x >> n is ~(~x >> n), ~x being non-negative; amounts out of range shift by
    # bits - 1 (the sign fill), as eager does.
    limit = _BITS[dtype] - 1
    wide = _wide(dtype)
    valid = _shift_amount_in_range(amount, dtype, limit)
    safe_amount = op.Where(valid, _cast(amount, wide), _int_const(limit, wide))
    value = _cast(self, wide)
    negative = op.Less(value, _int_const(0, wide))
    magnitude_bits = op.Where(negative, op.BitwiseNot(value), value)
    shifted = _logical_shift(magnitude_bits, safe_amount, "RIGHT")
    return _cast(op.Where(negative, op.BitwiseNot(shifted), shifted), dtype)


@lowering("aten::bitwise_right_shift.Scalar_Tensor")
def right_shift_scalar_integer(self: int, other: TInt) -> TInt:
    return right_shift_integer.func(op.Expand(_int_const(int(self), other.dtype), op.Shape(other)), other)


_SEGMENT_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}


@lowering("aten::segment_reduce")
def segment_reduce(
    data: TFloat,
    reduce: str,
    lengths: TIndex | None = None,
    indices: TIndex | None = None,
    offsets: TIndex | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: float | None = None,
) -> TFloat:
    """Reduce consecutive segments of `data` along `axis` given by lengths or offsets ([..., segments(+1)]).

    A [..., segments, positions] membership mask selects each segment's elements; the reduction's identity fills
    the rest. `initial` seeds every segment as in eager (an empty segment gives it; an empty mean without it NaN).
    """
    del indices, unsafe  # eager rejects indices; unsafe only skips eager's checks
    rank = len(data.shape)
    axis = axis % rank
    x = _in_float32(data)
    if offsets is not None:
        bounds = op.Cast(offsets, to=INT64.dtype)
        starts = op.Slice(
            bounds, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]), op.Constant(value_ints=[-1])
        )
        ends = op.Slice(
            bounds, op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62]), op.Constant(value_ints=[-1])
        )
    else:
        sizes = op.Cast(lengths, to=INT64.dtype)
        ends = op.CumSum(sizes, op.Constant(value_int=-1))
        starts = op.Sub(ends, sizes)
    last = op.Constant(value_ints=[-1])
    positions = op.Range(
        op.Constant(value_int=0), op.Squeeze(op.Shape(x, start=axis, end=axis + 1)), op.Constant(value_int=1)
    )
    member = op.And(
        op.GreaterOrEqual(positions, op.Unsqueeze(starts, last)), op.Less(positions, op.Unsqueeze(ends, last))
    )  # [..., segments, positions]
    features = rank - axis - 1  # dims after `axis`, kept as they are
    if features:
        member = op.Unsqueeze(member, op.Constant(value_ints=list(range(axis + 2, rank + 1))))
    values = op.Unsqueeze(x, op.Constant(value_ints=[axis]))  # [..., 1, positions, features...]
    along = op.Constant(value_ints=[axis + 1])
    identity = op.CastLike(_SEGMENT_IDENTITY[reduce], x)
    masked = op.Where(member, values, identity)
    if reduce in ("sum", "mean"):
        result = op.ReduceSum(masked, along, keepdims=False)
    elif reduce == "prod":
        result = op.ReduceProd(masked, along, keepdims=False)
    elif reduce == "max":
        result = op.ReduceMax(op.Where(op.IsNaN(masked), identity, masked), along, keepdims=False)
    elif reduce == "min":
        result = op.ReduceMin(op.Where(op.IsNaN(masked), identity, masked), along, keepdims=False)
    else:
        raise ValueError(f"segment_reduce: unknown reduction {reduce!r}")
    start = op.CastLike(initial, x) if initial is not None else None
    if reduce == "mean":
        counts = op.CastLike(op.Sub(ends, starts), x)
        if features:
            counts = op.Unsqueeze(counts, op.Constant(value_ints=list(range(axis + 1, rank))))
        if start is not None:
            result = op.Where(op.Equal(counts, op.CastLike(0, x)), start, op.Div(op.Add(result, start), counts))
        else:
            result = op.Div(result, counts)
    elif start is not None:
        combine = {"sum": op.Add, "prod": op.Mul, "max": op.Max, "min": op.Min}[reduce]
        result = combine(result, start)
    if reduce in ("max", "min"):
        has_nan = op.ReduceMax(op.Cast(op.IsNaN(masked), to=INT32.dtype), along, keepdims=False)
        nan = op.CastLike(math.nan, x)
        result = op.Where(op.Cast(has_nan, to=ir.DataType.BOOL), nan, result)
    return _back(result, data)


@lowering("aten::dist")
def dist(self: TFloat, other: TFloat, p: float = 2.0) -> TFloat:
    difference = op.Sub(_in_float32(self), _in_float32(other))
    return _back(_p_norm(difference, float(p), None, False), self)


@lowering("aten::_pdist_forward")
def pdist_forward(self: TFloat, p: float = 2.0) -> TFloat:
    """[N, M] -> [N*(N-1)/2]: the p-norm distance of every row pair i < j, in row-major pair order."""
    rows = self.shape[0]
    if not isinstance(rows, int):
        raise ValueError("pdist needs a static number of rows")
    if rows < 2:
        return op.CastLike(op.ConstantOfShape(op.Constant(value_ints=[0])), self)
    first, second = np.triu_indices(rows, k=1)
    x = _in_float32(self)
    left = op.Gather(x, op.Constant(value=ir.tensor(first.astype(np.int64))), axis=0)
    right = op.Gather(x, op.Constant(value=ir.tensor(second.astype(np.int64))), axis=0)
    return _back(_p_norm(op.Sub(left, right), float(p), op.Constant(value_ints=[-1]), False), self)


# --- gelu --------------------------------------------------------------------------------------------------------
@lowering("aten::gelu")
def gelu_nn(self: TFloat, approximate: str = "none") -> TFloat:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` in eager's order, which is also the one ONNX Runtime's GeluFusion
    recognizes: torchlib's ``x * (0.5 * (1 + erf(...)))`` is left as five nodes (ViT-B/16 ran 1-2% slower than
    the reference exporter's opset-20 Gelu). The tanh form is written as ONNX Runtime's FastGeluFusion expects,
    ``x * 0.5 * (1 + tanh(sqrt(2/pi) * x * (1 + 0.044715 * x * x)))`` (eager's ``x + 0.044715 * x**3`` order was
    left as eight nodes: GPT-2-small ran 3% slower than the reference). float16/bfloat16 compute in float32,
    as eager does."""
    x = _in_float32(self)
    half_x = op.Mul(x, _const(0.5, x))
    if approximate == "tanh":
        one_plus_cubic = op.Add(op.Mul(op.Mul(x, _const(0.044715, x)), x), _const(1.0, x))
        inner = op.Mul(op.Mul(x, _const(math.sqrt(2.0 / math.pi), x)), one_plus_cubic)
        one_plus = op.Add(op.Tanh(inner), _const(1.0, x))
    else:
        one_plus = op.Add(op.Erf(op.Div(x, _const(math.sqrt(2.0), x))), _const(1.0, x))
    return _back(op.Mul(half_x, one_plus), self)


# --- the user's selections, keeping a selected -0.0 (builders._select) ------------------------------------------
# Their context_key is what _select reads of the operands (_selection_reads), computed before the call: calls alike
# in it and in their arguments' types are replayed (a model's attention layers select with the same mask).
def _where_reads(ctx: LoweringContext) -> tuple[bool, bool, bool]:
    arguments = ctx.arguments
    return _selection_reads(arguments["condition"], arguments["self"], arguments["other"])


def _fill_reads(ctx: LoweringContext) -> tuple[bool, bool, bool]:
    arguments = ctx.arguments
    return _selection_reads(arguments["mask"], arguments["value"], arguments["self"])


def _key_of_call(ctx: LoweringContext, *values: object) -> tuple[bool, bool, bool] | None:
    """ctx.key when `ctx` is the emitter's for this call (its arguments are `values`), None when another lowering
    lends its own context (then _select reads the operands itself)."""
    arguments = list(ctx.arguments.values())
    same = len(arguments) == len(values) and all(a is b for a, b in zip(arguments, values))
    return ctx.key if same else None  # type: ignore[return-value]


@lowering("aten::where.self", variant="float", context=True, context_key=_where_reads)
def where_float(ctx: LoweringContext, condition: BOOL, self: TFloat, other: TFloat) -> TFloat:
    return _select(condition, self, other, self, _key_of_call(ctx, condition, self, other))


@lowering("aten::where.ScalarOther", variant="float", context=True, context_key=_where_reads)
def where_scalar_other_float(ctx: LoweringContext, condition: BOOL, self: TFloat, other: float) -> TFloat:
    return _select(condition, self, other, self, _key_of_call(ctx, condition, self, other))


@lowering("aten::where.ScalarSelf", variant="float", context=True, context_key=_where_reads)
def where_scalar_self_float(ctx: LoweringContext, condition: BOOL, self: float, other: TFloat) -> TFloat:
    return _select(condition, self, other, other, _key_of_call(ctx, condition, self, other))


@lowering("aten::masked_fill.Scalar", variant="float", context=True, context_key=_fill_reads)
def masked_fill_float(ctx: LoweringContext, self: TFloat, mask: BOOL, value: float) -> TFloat:
    return _select(mask, value, self, self, _key_of_call(ctx, self, mask, value))


@lowering("aten::masked_fill.Tensor", variant="float", context=True, context_key=_fill_reads)
def masked_fill_tensor_float(ctx: LoweringContext, self: TFloat, mask: BOOL, value: TFloat) -> TFloat:
    return _select(mask, value, self, self, _key_of_call(ctx, self, mask, value))


# --- lerp -------------------------------------------------------------------------------------------------------------
def _lerp(self: TFloat, end: TFloat, weight: TFloat) -> TFloat:
    """Eager's formula: self + weight * (end - self) where |weight| < 0.5, else end - (end - self) * (1 - weight),
    in float32 for float16/bfloat16 (eager's opmath). torchlib tests weight < 0.5: a weight of -1 took the second
    form (lerp(-0.0, inf, -1): inf - inf * 2 = NaN in eager, -inf there). Zero signs kept through the choice."""
    start, stop, w = _in_float32(self), _in_float32(end), _in_float32(op.CastLike(weight, self))
    difference = op.Sub(stop, start)
    near_start = op.Add(start, op.Mul(w, difference))
    near_end = op.Sub(stop, op.Mul(difference, op.Sub(_const(1.0, w), w)))
    return _back(_select(op.Less(op.Abs(w), _const(0.5, w)), near_start, near_end, w), self)


@lowering("aten::lerp.Tensor")
def lerp_tensor(self: TFloat, end: TFloat, weight: TFloat) -> TFloat:
    return _lerp(self, end, weight)


@lowering("aten::lerp.Scalar")
def lerp_scalar(self: TFloat, end: TFloat, weight: float) -> TFloat:
    return _lerp(self, end, _const(float(weight), self))
