"""float16/bfloat16 matrix products with a bias, rounded once as eager rounds them.

Eager's CPU ``addmm`` (and ``linear``, which calls it for a contiguous input) on float16/bfloat16
accumulates the product in float32 and adds ``beta * self`` before the one rounding to the narrow type
(oneDNN's sum post-op, or cpublas' gemm in opmath). torchlib's ``MatMul`` then ``Add``, which ONNX
Runtime CPU runs in float32 through legalization's Casts, rounds twice: the product, then the sum. On
a bfloat16 ``Linear`` that put a quarter of the outputs one ulp off eager, and 35% farther from the
exact result on average. Here the whole expression is computed in float32 and rounded once.
"""

from __future__ import annotations

from typing import TypeVar

import onnx_ir as ir
from onnxscript import BFLOAT16, FLOAT, FLOAT16
from onnxscript import opset18 as op

from fx2onnx.lowerings.rules import lowering

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
def addmm(self: TReduced, mat1: TReduced, mat2: TReduced, beta: float = 1.0, alpha: float = 1.0) -> TReduced:
    return _rounded_once(self, op.MatMul(_float(mat1), _float(mat2)), beta, alpha)


@lowering("aten::addmv")
def addmv(self: TReduced, mat: TReduced, vec: TReduced, beta: float = 1.0, alpha: float = 1.0) -> TReduced:
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
