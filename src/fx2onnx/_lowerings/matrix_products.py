"""Matrix products where torchlib's lose precision or dtype: addmm/addmv/baddbmm/addbmm with their scaled
terms (float64 sums, integer arithmetic), bmm/dot/linear of integers, and float16/bfloat16 linear/addmm/addmv/
baddbmm adding their bias in float32 and rounding once, as eager's CPU kernels do.
"""

from __future__ import annotations

from typing import TypeVar

import onnx_ir as ir
from onnxscript import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8
from onnxscript import opset18 as op

from fx2onnx._lowerings.builders import _NARROW_INTS, TInt, _double, _scaled_sum, _widened
from fx2onnx._lowerings.rules import lowering


# --- matrix products with scaled terms, in integer arithmetic ---------------------------------------------------
@lowering("aten::addmm")
def addmm_int(self: TInt, mat1: TInt, mat2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    return _scaled_sum(self, op.MatMul(_widened(mat1), _widened(mat2)), beta, alpha)


@lowering("aten::addmv")
def addmv_int(self: TInt, mat: TInt, vec: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    return _scaled_sum(self, op.MatMul(_widened(mat), _widened(vec)), beta, alpha)


@lowering("aten::baddbmm")
def baddbmm_int(self: TInt, batch1: TInt, batch2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    return _scaled_sum(self, op.MatMul(_widened(batch1), _widened(batch2)), beta, alpha)


@lowering("aten::addbmm")
def addbmm_int(self: TInt, batch1: TInt, batch2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    products = op.MatMul(_widened(batch1), _widened(batch2))
    return _scaled_sum(self, op.ReduceSum(products, op.Constant(value_ints=[0]), keepdims=False), beta, alpha)


# --- matrix products with scaled terms: Gemm's alpha/beta and torchlib's script functions are float32 -----------
def _scaled_sum_float64(self: DOUBLE, product: DOUBLE, beta: float, alpha: float) -> DOUBLE:
    """beta * self + alpha * product; beta == 0 ignores `self` (its NaNs too) but keeps the broadcast shape."""
    if alpha != 1:
        product = op.Mul(product, _double(alpha))
    if beta == 0:
        return op.Expand(product, op.Shape(op.Add(self, product)))
    return op.Add(self if beta == 1 else op.Mul(self, _double(beta)), product)


@lowering("aten::addmm")
def addmm(self: DOUBLE, mat1: DOUBLE, mat2: DOUBLE, beta: float = 1.0, alpha: float = 1.0) -> DOUBLE:
    return _scaled_sum_float64(self, op.MatMul(mat1, mat2), beta, alpha)


@lowering("aten::addmv")
def addmv(self: DOUBLE, mat: DOUBLE, vec: DOUBLE, beta: float = 1.0, alpha: float = 1.0) -> DOUBLE:
    return _scaled_sum_float64(self, op.MatMul(mat, vec), beta, alpha)


@lowering("aten::addbmm")
def addbmm(self: DOUBLE, batch1: DOUBLE, batch2: DOUBLE, beta: float = 1.0, alpha: float = 1.0) -> DOUBLE:
    products = op.MatMul(batch1, batch2)
    return _scaled_sum_float64(self, op.ReduceSum(products, op.Constant(value_ints=[0]), keepdims=False), beta, alpha)


# The integer dtypes eager's CPU matrix products take (not bool, not uint16/32/64).
TMatmulInt = TypeVar("TMatmulInt", INT8, INT16, INT32, INT64, UINT8)


# --- matrix products in integer arithmetic ---------------------------------------------------------------------
def _widened_integer(value: TMatmulInt) -> TMatmulInt:
    """int8/int16/uint8 as int32, which MatMul takes; int32/int64 as they are."""
    return op.Cast(value, to=INT32.dtype) if value.dtype in _NARROW_INTS else value


def _narrowed(result: TMatmulInt, dtype: ir.DataType) -> TMatmulInt:
    return op.Cast(result, to=dtype) if result.dtype != dtype else result


@lowering("aten::bmm")
def bmm_integer(self: TMatmulInt, mat2: TMatmulInt) -> TMatmulInt:
    return _narrowed(op.MatMul(_widened_integer(self), _widened_integer(mat2)), self.dtype)


@lowering("aten::dot")
def dot_integer(self: TMatmulInt, tensor: TMatmulInt) -> TMatmulInt:
    """MatMul of two vectors is their (0-d) inner product."""
    return _narrowed(op.MatMul(_widened_integer(self), _widened_integer(tensor)), self.dtype)


@lowering("aten::linear")
def linear_integer(input: TMatmulInt, weight: TMatmulInt, bias: TMatmulInt | None = None) -> TMatmulInt:
    """input @ weight.T + bias; a 1-D weight is a single output feature (no transpose)."""
    wide_weight = _widened_integer(weight)
    if len(weight.shape) == 2:
        wide_weight = op.Transpose(wide_weight, perm=[1, 0])
    result = op.MatMul(_widened_integer(input), wide_weight)
    if bias is not None:
        result = op.Add(result, _widened_integer(bias))
    return _narrowed(result, input.dtype)


# --- float16/bfloat16 matrix products: the bias added in float32, the result rounded once -----------------------
TReduced = TypeVar("TReduced", BFLOAT16, FLOAT16)


def _float(x: TReduced) -> FLOAT:
    return op.Cast(x, to=ir.DataType.FLOAT)


def _scaled(x: FLOAT, factor: float) -> FLOAT:
    return x if factor == 1 else op.Mul(x, op.Constant(value=ir.tensor(float(factor), dtype=ir.DataType.FLOAT)))


def _rounded_once(self: TReduced, product: FLOAT, beta: float, alpha: float) -> TReduced:
    """beta * self + alpha * product, in float32, rounded to self's dtype. beta == 0 ignores `self`, NaN
    included (as eager), but the result keeps the broadcast shape."""
    product = _scaled(product, alpha)
    if beta == 0:
        result = op.Expand(product, op.Shape(op.Add(_float(self), product)))
    else:
        result = op.Add(_scaled(_float(self), beta), product)
    return op.Cast(result, to=self.dtype)


@lowering("aten::addmm")
def addmm_reduced_precision(
    self: TReduced, mat1: TReduced, mat2: TReduced, beta: float = 1.0, alpha: float = 1.0
) -> TReduced:
    return _rounded_once(self, op.MatMul(_float(mat1), _float(mat2)), beta, alpha)


@lowering("aten::addmv")
def addmv_reduced_precision(
    self: TReduced, mat: TReduced, vec: TReduced, beta: float = 1.0, alpha: float = 1.0
) -> TReduced:
    return _rounded_once(self, op.MatMul(_float(mat), _float(vec)), beta, alpha)


@lowering("aten::baddbmm")
def baddbmm(self: TReduced, batch1: TReduced, batch2: TReduced, beta: float = 1.0, alpha: float = 1.0) -> TReduced:
    return _rounded_once(self, op.MatMul(_float(batch1), _float(batch2)), beta, alpha)


@lowering("aten::linear")
def linear(input: TReduced, weight: TReduced, bias: TReduced | None = None) -> TReduced:
    """input @ weight.T + bias; a 1-D weight is a single output feature (no transpose)."""
    if len(input.shape) == 2 and len(weight.shape) == 2:  # Gemm transposes the weight itself, bias included
        wide_bias = _float(bias) if bias is not None else None
        return op.Cast(op.Gemm(_float(input), _float(weight), wide_bias, transB=1), to=input.dtype)
    # Transposed first: the optimizer folds a Transpose of a weight into a view of it, while the Cast stays a
    # node (a float32 copy of the weights in the file would double a bfloat16 model's size).
    if len(weight.shape) == 2:
        weight = op.Transpose(weight, perm=[1, 0])
    product = op.MatMul(_float(input), _float(weight))
    if bias is None:
        return op.Cast(product, to=input.dtype)
    return _rounded_once(bias, product, 1.0, 1.0)
