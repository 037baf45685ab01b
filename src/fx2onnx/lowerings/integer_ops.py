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

from typing import TypeVar

import numpy as np
import onnx_ir as ir
from onnxscript import BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64
from onnxscript import opset18 as op

from fx2onnx.lowerings.linalg import cov as float_cov
from fx2onnx.lowerings.rules import lowering

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
