"""Shared builders of fx2onnx's lowerings: constants of a value's dtype, computing in float32 and back,
polynomials, type variables. Registers nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import onnx_ir as ir
from onnxscript import (
    BFLOAT16,
    BOOL,
    DOUBLE,
    FLOAT,
    FLOAT16,
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

_NUMPY = {ir.DataType.FLOAT: np.float32, ir.DataType.DOUBLE: np.float64}


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


TFloat = TypeVar("TFloat", BFLOAT16, DOUBLE, FLOAT, FLOAT16)


# Every real dtype eager computes with, bool included; types the target lacks are left to legalization.
TReal = TypeVar("TReal", BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8)


_LOW_PRECISION = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _positive_zero(x: TFloat) -> TFloat:
    """x with -0.0 made +0.0 (what eager's x + 0.0 gives). Not Add(x, 0.0): ONNX Runtime's NoopElimination removes
    it (and Sub(x, -0.0)) as a no-op, which it is not for -0.0 (docs/ort-defects.md). +0.0 is Where's first branch,
    which ONNX Runtime's Where returns as +0.0."""
    zero = _const(0.0, x)
    return op.Where(op.Equal(x, zero), zero, x)


def _negative_or_negative_zero(x: TFloat) -> BOOL:
    zero = _const(0.0, x)
    return op.Or(op.Less(x, zero), op.And(op.Equal(x, zero), op.Less(op.Reciprocal(x), zero)))


# --- selections that keep a selected -0.0 ----------------------------------------------------------------------
# ONNX Runtime's Where returns +0.0 for a -0.0 taken from its first branch (its kernel tests the selected value
# against 0), and its NotWhereFusion rewrites Where(Not(c), a, b) into Where(c, b, a) (docs/ort-defects.md 3). Each
# tensor operand is therefore taken from a Where's second branch under a condition that is no Not's output; a
# constant other than -0.0 may stay in the first branch (+0.0 comes back as +0.0).
def _is_negative_zero(value: float) -> bool:
    return value == 0 and math.copysign(1.0, value) < 0


def _is_not_output(condition: BOOL) -> bool:
    producer = condition.producer() if isinstance(condition, ir.Value) else None
    return producer is not None and producer.op_type == "Not" and producer.domain in ("", "ai.onnx")


def _not_a_not(condition: BOOL, is_not: bool) -> BOOL:
    """`condition`, computed otherwise than by a Not (which NotWhereFusion would fold into the Where). `is_not`:
    whether a Not computes it (_is_not_output)."""
    if is_not:
        (negated,) = condition.producer().inputs
        return op.Equal(negated, op.Constant(value=_false_tensor()))
    return condition


def _negated(condition: BOOL, is_not: bool) -> BOOL:
    if is_not:
        (negated,) = condition.producer().inputs
        return _not_a_not(negated, _is_not_output(negated))
    return op.Equal(condition, op.Constant(value=_false_tensor()))


def _false_tensor() -> ir.Tensor:
    """What ``ir.tensor(False)`` makes, without its checks against runtime Protocols (~45 us a call)."""
    return ir.Tensor(np.array(False))


def _fill_value(value: object) -> float | None:
    """The one value all elements of `value` hold when the graph fixes it (a number, a scalar constant, a
    ConstantOfShape, an Expand of such), else None."""
    if isinstance(value, (bool, int, float)):
        return float(value)
    if not isinstance(value, ir.Value):
        return None
    producer = value.producer()
    if producer is not None and producer.op_type == "Expand" and producer.domain in ("", "ai.onnx"):
        return _fill_value(producer.inputs[0])
    tensor = value.const_value
    if tensor is None and producer is not None and producer.domain in ("", "ai.onnx"):
        attribute = producer.attributes.get("value")
        if producer.op_type == "ConstantOfShape":
            return 0.0 if attribute is None else _fill_value_of(attribute.as_tensor())
        if producer.op_type == "Constant" and attribute is not None:
            tensor = attribute.as_tensor()
    return None if tensor is None else _fill_value_of(tensor)


def _fill_value_of(tensor: ir.TensorProtocol) -> float | None:
    if tensor.size != 1:  # larger constants are not read (a scan of their values per selection)
        return None
    return float(np.asarray(tensor.numpy()).reshape(-1)[0])


def _first_branch_safe(value: object) -> bool:
    """`value` may be Where's first branch: never -0.0 (+0.0 comes back as +0.0)."""
    fill = _fill_value(value)
    return fill is not None and not _is_negative_zero(fill)


def _selection_reads(condition: BOOL, chosen: TFloat | float, otherwise: TFloat | float) -> tuple[bool, bool, bool]:
    """All _select reads of its operands besides their types and shapes: whether `chosen` and `otherwise` may be
    Where's first branch, whether a Not computes `condition`. A lowering may compute it before its call, as its
    replay key (context_key), and hand it to _select."""
    return _first_branch_safe(chosen), _first_branch_safe(otherwise), _is_not_output(condition)


def _select(
    condition: BOOL,
    chosen: TFloat | float,
    otherwise: TFloat | float,
    like: TFloat,
    reads: tuple[bool, bool, bool] | None = None,
) -> TFloat:
    """Eager's where(condition, chosen, otherwise) on floats, zero signs kept. An operand fixed to a value other than
    -0.0 (a number, a scalar constant, a filled tensor) may stay in the first branch: one Where (and one Equal on
    the booleans to put `chosen` second). Two tensors (or a -0.0 fill) cost two Wheres and a Mul:
    Where(not c, 1, chosen) * Where(c, 1, otherwise), exact (x * 1 is x). `reads`: _selection_reads of the operands,
    when the caller has it."""

    def tensor(value: TFloat | float) -> TFloat:
        return _const(float(value), like) if isinstance(value, (bool, int, float)) else value

    chosen_first, otherwise_first, is_not = reads or _selection_reads(condition, chosen, otherwise)
    if chosen_first:
        return op.Where(_not_a_not(condition, is_not), tensor(chosen), tensor(otherwise))
    if otherwise_first:
        return op.Where(_negated(condition, is_not), tensor(otherwise), tensor(chosen))
    one = _const(1.0, like)
    return op.Mul(
        op.Where(_negated(condition, is_not), one, tensor(chosen)),
        op.Where(_not_a_not(condition, is_not), one, tensor(otherwise)),
    )


# --- integer matrix products with a scaled addend ------------------------------------------------------------
# torchlib lowers addmm & co. with Gemm (floats only) or through CastLike of the scalars, neither of which
# runs for integers. Integer arithmetic wraps alike in any width (results agree modulo 2**bits), so
# int8/int16/uint8 compute in int32 (which MatMul takes) and cast back. Floats keep torchlib's implementations.
TInt = TypeVar("TInt", INT8, INT16, INT32, INT64, UINT8)


_NARROW_INTS = (ir.DataType.INT8, ir.DataType.INT16, ir.DataType.UINT8)


def _widened(value: TInt) -> TInt:
    return op.Cast(value, to=INT32.dtype) if value.dtype in _NARROW_INTS else value


def _scaled_sum(self: TInt, product: TInt, beta: float, alpha: float) -> TInt:
    """beta * self + alpha * product (product already widened), cast back to self's dtype.

    As in eager, beta == 0 ignores `self` (but the result still has its broadcast shape).
    """
    wide = _widened(self)
    if alpha != 1:
        product = op.Mul(product, op.Constant(value=ir.tensor(int(alpha), dtype=wide.dtype)))
    if beta == 0:
        result = op.Expand(product, op.Shape(op.Add(wide, product)))
    else:
        addend = wide if beta == 1 else op.Mul(wide, op.Constant(value=ir.tensor(int(beta), dtype=wide.dtype)))
        result = op.Add(addend, product)
    return op.Cast(result, to=self.dtype) if wide.dtype != self.dtype else result


# --- elementwise ops torch decomposes into prims ONNX has no lowering for ---------------------------------------
def _is_float(value: TReal) -> bool:
    return value.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


# --- special functions ---------------------------------------------------------------------------------------
# ONNX has no gamma, Bessel or inverse error functions; these are the classic approximations, accurate to a
# few float32 ulps (and to ~1e-7 relative in float64, within the matrix's float64 tolerance). float16 and
# bfloat16 compute in float32: the coefficients do not survive rounding to them.
def _in_float32(self: TFloat) -> TFloat:
    return op.Cast(self, to=FLOAT.dtype) if self.dtype in _LOW_PRECISION else self


def _back(result: TFloat, self: TFloat) -> TFloat:
    return op.Cast(result, to=self.dtype) if result.dtype != self.dtype else result


def _const(value: float, like: TFloat) -> TFloat:
    dtype = like.dtype
    if dtype is None:
        return op.Constant(value=ir.tensor(value))
    # What ir.tensor(value, dtype=dtype) makes, without its checks against runtime Protocols (~45 us a call).
    return op.Constant(value=ir.Tensor(np.array(value, dtype=dtype.numpy()), dtype=dtype))


def _log_softmax(x: TFloat, dim: int) -> TFloat:
    """LogSoftmax, with eager's NaN rows: eager subtracts the row's max, so a NaN or +inf anywhere in the row, or a
    row of -inf only, makes every element NaN; ONNX Runtime's max skips NaN (finite results beside the NaN)."""
    if len(x.shape) == 0:
        return op.Sub(x, x)  # 0.0, NaN for NaN and +-inf
    result = op.LogSoftmax(x, axis=dim)
    axes = op.Constant(value_ints=[dim])
    has_nan = op.Greater(op.ReduceMax(op.Cast(op.IsNaN(x), to=x.dtype), axes, keepdims=True), _const(0.0, x))
    largest = op.ReduceMax(x, axes, keepdims=True)
    return op.Where(op.Or(has_nan, op.IsInf(largest)), _const(math.nan, x), result)


def _polynomial(x: TFloat, coefficients: Sequence[float]) -> TFloat:
    """Horner's rule, highest power first."""
    result = _const(coefficients[0], x)
    for coefficient in coefficients[1:]:
        result = op.Add(op.Mul(result, x), _const(coefficient, x))
    return result


def _double(value: float) -> DOUBLE:
    return op.Constant(value=ir.tensor(float(value), dtype=ir.DataType.DOUBLE))


# Every integer dtype eager rounds and classifies (isfinite & co. take bool too).
TIntegral = TypeVar("TIntegral", INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64)


_BITS = {
    ir.DataType.INT8: 8, ir.DataType.INT16: 16, ir.DataType.INT32: 32, ir.DataType.INT64: 64,
    ir.DataType.UINT8: 8, ir.DataType.UINT16: 16, ir.DataType.UINT32: 32, ir.DataType.UINT64: 64,
}  # fmt: skip


def _wide(dtype: ir.DataType) -> ir.DataType:
    """The dtype integer arithmetic of `dtype` runs in: int64 for int64, int32 below (exact modulo 2**bits)."""
    return ir.DataType.INT64 if _BITS[dtype] == 64 else ir.DataType.INT32


def _cast(value: ir.Value, dtype: ir.DataType) -> ir.Value:
    return op.Cast(value, to=dtype) if value.dtype != dtype else value


def _int_const(value: int, dtype: ir.DataType) -> ir.Value:
    """A Python int as a 0-d constant of `dtype`, wrapped into its range as eager wraps a number it is given."""
    numpy_dtype = ir.DataType(dtype).numpy()
    return op.Constant(value=ir.tensor(np.array(value).astype(np.uint64).astype(numpy_dtype)))


# Weights and indices are typed apart from the data they go with (frequency weights are integers).
TOther = TypeVar("TOther", BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8)


def _flat(self: TReal) -> TReal:
    return op.Reshape(self, op.Constant(value_ints=[-1]))


def _spatial_sizes(input: TFloat, count: int, name: str) -> list[int]:
    sizes = list(input.shape)[-count:]
    if not all(isinstance(size, int) for size in sizes):
        raise ValueError(f"{name} needs static spatial sizes, got {list(input.shape)}")
    return [int(size) for size in sizes]


TIndex = TypeVar("TIndex", INT32, INT64)


# --- p-norms over every element (dist, norm.Scalar) ------------------------------------------------------------------
def _p_norm(x: TFloat, p: float, axes: INT64 | None, keepdim: bool) -> TFloat:
    """The p-norm of x over `axes` (all when None), as torch.linalg.vector_norm defines it for each p."""
    magnitude = op.Abs(x)
    if p in (math.inf, -math.inf):  # NaN where a NaN is, as eager's amax/amin (ONNX Runtime's skip it)
        extreme = op.ReduceMax if p > 0 else op.ReduceMin
        has_nan = op.ReduceMax(op.Cast(op.IsNaN(x), to=INT32.dtype), axes, keepdims=keepdim)
        return op.Where(
            op.Cast(has_nan, to=BOOL.dtype), op.CastLike(math.nan, x), extreme(magnitude, axes, keepdims=keepdim)
        )
    if p == 0:
        return op.ReduceSum(op.CastLike(op.Not(op.Equal(x, op.CastLike(0.0, x))), x), axes, keepdims=keepdim)
    if p == 1:
        return op.ReduceSum(magnitude, axes, keepdims=keepdim)
    if p == 2:
        return op.Sqrt(op.ReduceSumSquare(x, axes, keepdims=keepdim))
    powered = op.ReduceSum(op.Pow(magnitude, op.CastLike(p, x)), axes, keepdims=keepdim)
    return op.Pow(powered, op.CastLike(1.0 / p, x))


# A complex tensor's components, as the layout carries them.
TComponent = TypeVar("TComponent", FLOAT, DOUBLE)


# --- helpers --------------------------------------------------------------------------------------------------------
def _part(self: TComponent, index: int) -> TComponent:
    """The real (0) or imaginary (1) part, without the trailing dim."""
    part = op.Slice(
        self,
        op.Constant(value_ints=[index]),
        op.Constant(value_ints=[index + 1]),
        op.Constant(value_ints=[-1]),
    )
    return op.Squeeze(part, op.Constant(value_ints=[-1]))


def _complex_rank(self: TComponent) -> int:
    return len(self.shape) - 1


def _conj(self: TComponent) -> TComponent:
    """Negate the imaginary part (a multiply by (1, -1) keeps NaN and inf as eager does)."""
    return op.Mul(self, op.CastLike(op.Constant(value_floats=[1.0, -1.0]), self))
