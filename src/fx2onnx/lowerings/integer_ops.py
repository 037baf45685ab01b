"""Exact lowerings of ops on integer (and bool) tensors that torchlib computes in float.

torchlib's implementations of these ops take floats only, so the dispatcher reached them through a
Cast to float32 (or float64), which rounds integers above 2**24 (2**53) and cannot wrap around on
overflow as eager's integer arithmetic does. Here they stay integers:

- ``ceil``/``floor``/``round``/``trunc`` of an integer are the integer itself (eager returns a copy);
  ``round(decimals=...)`` has no integer kernel in eager, so exporting it is refused with eager's reason.
- ``isfinite``/``isinf``/``isnan``/``isneginf``/``isposinf`` of an integer or bool are constants
  (every value finite, none infinite or NaN), built from the input's runtime shape.
- ``bmm``/``dot``/``linear`` multiply in integers. ONNX Runtime's MatMul has int32 and int64 kernels
  that wrap on overflow like eager; integer arithmetic agrees modulo 2**bits in any width, so
  int8/int16/uint8 compute in int32 and cast back (the Cast truncates), which is eager's result.
- ``cov`` of integers with (float) ``aweights``: eager's first arithmetic is ``self * aweights``, which
  converts `self` to the weights' dtype, so that is the dtype it computes (and returns) in. The
  dispatcher used to reach the float lowering through a Cast it had to call lossy (int64 -> float32)
  or one eager does not make (int32 -> float64, computing in float64 what eager computes in float32).

Float inputs never bind to these (their type constraints are integers), so they keep torchlib's lowerings.
"""

from __future__ import annotations

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
    evaluator,
)
from onnxscript import opset18 as op

from fx2onnx.emit.recorder import GraphRecorder
from fx2onnx.lowerings import lowering
from fx2onnx.lowerings.core import cumprod as float_cumprod
from fx2onnx.lowerings.linalg import cov as float_cov

# Every integer dtype eager rounds and classifies (isfinite & co. take bool too).
TIntegral = TypeVar("TIntegral", INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64)
TIntegralOrBool = TypeVar("TIntegralOrBool", BOOL, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64)
# The integer dtypes eager's CPU matrix products take (not bool, not uint16/32/64).
TMatmulInt = TypeVar("TMatmulInt", INT8, INT16, INT32, INT64, UINT8)

TFloat = TypeVar("TFloat", BFLOAT16, DOUBLE, FLOAT, FLOAT16)
TWeightInt = TypeVar("TWeightInt", INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64)

_NARROW_INTS = (ir.DataType.INT8, ir.DataType.INT16, ir.DataType.UINT8)


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


# --- matrix products in integer arithmetic ---------------------------------------------------------------------
def _widened(value: TMatmulInt) -> TMatmulInt:
    """int8/int16/uint8 as int32, which MatMul takes; int32/int64 as they are."""
    return op.Cast(value, to=INT32.dtype) if value.dtype in _NARROW_INTS else value


def _narrowed(result: TMatmulInt, dtype: ir.DataType) -> TMatmulInt:
    return op.Cast(result, to=dtype) if result.dtype != dtype else result


@lowering("aten::bmm")
def bmm_integer(self: TMatmulInt, mat2: TMatmulInt) -> TMatmulInt:
    return _narrowed(op.MatMul(_widened(self), _widened(mat2)), self.dtype)


@lowering("aten::dot")
def dot_integer(self: TMatmulInt, tensor: TMatmulInt) -> TMatmulInt:
    """MatMul of two vectors is their (0-d) inner product."""
    return _narrowed(op.MatMul(_widened(self), _widened(tensor)), self.dtype)


@lowering("aten::linear")
def linear_integer(input: TMatmulInt, weight: TMatmulInt, bias: TMatmulInt | None = None) -> TMatmulInt:
    """input @ weight.T + bias; a 1-D weight is a single output feature (no transpose)."""
    wide_weight = _widened(weight)
    if len(weight.shape) == 2:
        wide_weight = op.Transpose(wide_weight, perm=[1, 0])
    result = op.MatMul(_widened(input), wide_weight)
    if bias is not None:
        result = op.Add(result, _widened(bias))
    return _narrowed(result, input.dtype)


# --- covariance of integers with float weights -----------------------------------------------------------------
@lowering("aten::cov")
def cov_integer_weighted(
    self: TIntegral, aweights: TFloat, correction: int = 1, fweights: TWeightInt | None = None
) -> TFloat:
    """Eager multiplies `self` by the weights first (``in * w``): `self` becomes the weights' float dtype
    (promote_types(integer, float) is the float), and everything after computes in it. Without `aweights`
    (required here; parameters bind by name) integers keep the float lowering, which computes in float32."""
    return float_cov.func(op.Cast(self, to=aweights.dtype), correction, fweights, aweights)


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


# --- exact integer arithmetic: division, powers, shifts, sums and products ------------------------------------
# torchlib divides integers with a rounding mode in float32 (wrong above 2**24: int32 123456789 // -2 was off by
# one, int64 lost its low digits), computes integer Pow in ONNX Runtime's kernel (through double: no wrapping on
# overflow, INT64_MIN for 0 ** -3), and reduces int64 with ReduceSum/ReduceProd, which ONNX Runtime computes in
# double (2**53 + 1 summed to 2**53; products saturate where eager wraps). Here everything stays in integers.
# Narrow integers compute in int32 and are cast back: integer +, *, << agree modulo 2**bits in any width, and the
# Cast keeps the low bits, as eager's wrapping does.
TInt = TypeVar("TInt", INT8, INT16, INT32, INT64, UINT8)
TSigned = TypeVar("TSigned", INT8, INT16, INT32, INT64)

_BITS = {
    ir.DataType.INT8: 8, ir.DataType.INT16: 16, ir.DataType.INT32: 32, ir.DataType.INT64: 64,
    ir.DataType.UINT8: 8, ir.DataType.UINT16: 16, ir.DataType.UINT32: 32, ir.DataType.UINT64: 64,
}  # fmt: skip
_UNSIGNED = (ir.DataType.UINT8, ir.DataType.UINT16, ir.DataType.UINT32, ir.DataType.UINT64)


def _wide(dtype: ir.DataType) -> ir.DataType:
    """The dtype integer arithmetic of `dtype` runs in: int64 for int64, int32 below (exact modulo 2**bits)."""
    return ir.DataType.INT64 if _BITS[dtype] == 64 else ir.DataType.INT32


def _cast(value: ir.Value, dtype: ir.DataType) -> ir.Value:
    return op.Cast(value, to=dtype) if value.dtype != dtype else value


def _int_const(value: int, dtype: ir.DataType) -> ir.Value:
    """A Python int as a 0-d constant of `dtype`, wrapped into its range as eager wraps a number it is given."""
    numpy_dtype = ir.DataType(dtype).numpy()
    return op.Constant(value=ir.tensor(np.array(value).astype(np.uint64).astype(numpy_dtype)))


def _operand(value: ir.Value | int | float | bool, dtype: ir.DataType) -> ir.Value:
    """A tensor operand, or a Python number (the Scalar overloads) as a constant of `dtype`."""
    return value if isinstance(value, ir.Value) else _int_const(int(value), dtype)


def _is_signed(dtype: ir.DataType) -> bool:
    return dtype not in _UNSIGNED


# --- division with a rounding mode ----------------------------------------------------------------------------------
def _floor_divided(self: TInt, other: TInt) -> TInt:
    """Truncating Div, minus one where the remainder is non-zero and the operands' signs differ (eager's rule)."""
    quotient = op.Div(self, other)
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
    other = _operand(other, self.dtype)
    if rounding_mode == "trunc":
        return op.Div(self, other)
    if rounding_mode == "floor":
        return _floor_divided(self, other)
    raise NotImplementedError(f"integer div with rounding_mode={rounding_mode!r}: eager divides in float")


@lowering("aten::floor_divide", "aten::floor_divide.Scalar")
def floor_divide_integer(self: TInt, other: TInt) -> TInt:
    return _floor_divided(self, _operand(other, self.dtype))


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


# --- sums and products -----------------------------------------------------------------------------------------
# ONNX Runtime's CumSum adds integers exactly (wrapping); its ReduceSum and ReduceProd of int64 go through double.
# A sum is the last element of a CumSum along the dim, a product the last of a running product built in ceil(log2 n)
# doubling steps (Hillis-Steele: step k multiplies each element by the one 2**k places before it); both start from
# the identity padded in front, so an empty dim gives 0 (1). Several dims reduce one after the other: wrapping
# addition and multiplication are associative, so the order does not change the result.
TAccumulable = TypeVar("TAccumulable", BOOL, INT8, INT16, INT32, INT64, UINT8)


def _running_product_step(value: ir.Value, shift: ir.Value | int, axis: int) -> ir.Value:
    """Each element times the one `shift` places before it along `axis` (1 before the start)."""
    rank = len(value.shape)
    if isinstance(shift, int):
        pads = op.Constant(
            value_ints=[shift if a == axis else 0 for a in range(rank)]
            + [-shift if a == axis else 0 for a in range(rank)]
        )
    else:
        zeros = op.Constant(value_ints=[0] * rank)
        at_axis = op.Constant(value_ints=[1 if a == axis else 0 for a in range(rank)])
        before = op.Mul(at_axis, op.Reshape(shift, op.Constant(value_ints=[1])))
        pads = op.Concat(op.Add(zeros, before), op.Neg(before), axis=0)
    earlier = op.Pad(value, pads, _int_const(1, value.dtype))
    return op.Mul(value, earlier)


def _running_product(value: ir.Value, axis: int, length: int | ir.SymbolicDim | None) -> ir.Value:
    """cumprod along `axis` (of `length`, when known at export) in value's (int32/int64) dtype, exact with wrapping."""
    if isinstance(length, int):
        shift = 1
        while shift < length:
            value = _running_product_step(value, shift, axis)
            shift *= 2
        return value
    return _running_product_loop(value, axis)


def _running_product_loop(value: ir.Value, axis: int) -> ir.Value:
    """The doubling steps for a dim whose length is known only at run time: an ONNX Loop while 2**k < length."""
    outer = evaluator.default()
    assert isinstance(outer, GraphRecorder), "fx2onnx's lowerings are recorded by its GraphRecorder"

    def body_input(hint: str, dtype: ir.DataType, shape: list[int] | None) -> ir.Value:
        body_value = ir.Value(name=outer.fresh_name(hint), type=ir.TensorType(dtype))
        if shape is not None:
            body_value.shape = ir.Shape(shape)
        return body_value

    iteration = body_input("product_iteration", ir.DataType.INT64, [])
    condition = body_input("product_condition", ir.DataType.BOOL, [])
    shift = body_input("product_shift", ir.DataType.INT64, [])
    running = body_input("product_running", value.dtype, None)
    running.shape = ir.Shape(value.shape)
    body = ir.Graph([iteration, condition, shift, running], [], nodes=[], name=outer.fresh_name("product"))
    inner = GraphRecorder(body, outer.opset_imports)
    inner._names = outer._names  # one name space: ONNX forbids a subgraph reusing an outer name
    length = op.Squeeze(op.Shape(value, start=axis, end=axis + 1))
    with inner.recording(outer._metadata), evaluator.default_as(inner):
        stepped = _running_product_step(running, shift, axis)
        doubled = op.Add(shift, shift)
        more = op.Less(doubled, length)
    outer._names = inner._names
    body.outputs.extend([more, doubled, stepped])
    one = op.Constant(value=ir.tensor(1, dtype=ir.DataType.INT64))
    _, result = op.Loop(length, op.Less(one, length), one, value, body=body)
    result.dtype = value.dtype  # the recorder does not infer Loop's outputs
    result.shape = ir.Shape(value.shape)
    return result


def _accumulator(result_dtype: ir.DataType) -> ir.DataType | None:
    """The integer dtype eager's integer accumulation into `result_dtype` runs in (bool: int64, nonzero is True);
    None for a float `dtype=`, which computes in that float."""
    if result_dtype == ir.DataType.BOOL:
        return ir.DataType.INT64
    return _wide(result_dtype) if result_dtype in _BITS else None


def _reduced(self: ir.Value, dims: list[int], keepdim: bool, dtype: int | None, product: bool) -> ir.Value:
    result_dtype = ir.DataType(dtype) if dtype is not None else ir.DataType.INT64
    accumulator = _accumulator(result_dtype)
    rank = len(self.shape)
    if accumulator is None:
        x = _cast(self, result_dtype)
        axes = op.Constant(value_ints=dims) if dims and rank else None
        return (op.ReduceProd if product else op.ReduceSum)(x, axes, keepdims=keepdim) if rank else x
    value = _cast(_cast(self, result_dtype), accumulator)
    if rank == 0:
        return _cast(value, result_dtype)
    axes = sorted({d % rank for d in dims}) if dims else list(range(rank))
    identity = _int_const(1 if product else 0, value.dtype)
    for axis in axes:
        pads = op.Constant(value_ints=[1 if a == axis else 0 for a in range(rank)] + [0] * rank)
        padded = op.Pad(value, pads, identity)
        if product:
            length = value.shape[axis]
            running = _running_product(padded, axis, length + 1 if isinstance(length, int) else None)
        else:
            running = op.CumSum(padded, op.Constant(value=ir.tensor(axis, dtype=ir.DataType.INT64)))
        value = op.Slice(
            running, op.Constant(value_ints=[-1]), op.Constant(value_ints=[2**62]), op.Constant(value_ints=[axis])
        )
    if not keepdim:
        value = op.Squeeze(value, op.Constant(value_ints=axes))
    return _cast(value, result_dtype)


@lowering("aten::sum")
def sum_integer(self: TAccumulable, dtype: int | None = None) -> INT64:
    return _reduced(self, [], False, dtype, product=False)


@lowering("aten::sum.dim_IntList")
def sum_dim_integer(
    self: TAccumulable, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: int | None = None
) -> INT64:
    return _reduced(self, list(dim or []), keepdim, dtype, product=False)


@lowering("aten::prod")
def prod_integer(self: TAccumulable, dtype: int | None = None) -> INT64:
    return _reduced(self, [], False, dtype, product=True)


@lowering("aten::prod.dim_int", specific=True)
def prod_dim_integer(self: TAccumulable, dim: int, keepdim: bool = False, dtype: int | None = None) -> INT64:
    return _reduced(self, [dim], keepdim, dtype, product=True)


@lowering("aten::cumsum")
def cumsum_integer(self: TAccumulable, dim: int, dtype: int | None = None) -> INT64:
    """Eager accumulates integers and bools in int64 (returned) unless `dtype` is given; ONNX Runtime's CumSum has
    int32/int64 kernels, which wrap like eager's."""
    result_dtype = ir.DataType(dtype) if dtype is not None else ir.DataType.INT64
    value = _cast(_cast(self, result_dtype), _accumulator(result_dtype) or result_dtype)
    if len(value.shape) == 0:
        return _cast(value, result_dtype)
    summed = op.CumSum(value, op.Constant(value=ir.tensor(dim % len(value.shape), dtype=ir.DataType.INT64)))
    return _cast(summed, result_dtype)


@lowering("aten::cumprod", specific=True)
def cumprod_integer(self: TAccumulable, dim: int, dtype: int | None = None) -> INT64:
    result_dtype = ir.DataType(dtype) if dtype is not None else ir.DataType.INT64
    if _accumulator(result_dtype) is None:  # a float dtype=: the float lowering, on the converted input
        return float_cumprod.func(_cast(self, result_dtype), dim)
    value = _cast(_cast(self, result_dtype), _accumulator(result_dtype))
    if len(value.shape) == 0:
        return _cast(value, result_dtype)
    axis = dim % len(value.shape)
    return _cast(_running_product(value, axis, value.shape[axis]), result_dtype)
