"""Mixture of experts: grouped matrix products."""

from __future__ import annotations

from typing import TypeVar

import onnx_ir as ir
from onnxscript import FLOAT, INT32, INT64
from onnxscript import opset18 as op

from fx2onnx._lowerings.builders import _LOW_PRECISION, TFloat
from fx2onnx._lowerings.rules import lowering

TOffset = TypeVar("TOffset", INT32, INT64)


# ConstantOfShape takes bfloat16 only from opset 20; below it, zeros of that type are float32 zeros cast.
_CONSTANT_OF_SHAPE_TYPES = (ir.DataType.FLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE)


def _group_count(offs: TOffset, operand: TFloat | None = None) -> int:
    """The number of groups, which the unrolled graph needs statically: the operand's leading dim, or offs' length."""
    for candidate in (operand.shape[0] if operand is not None else None, offs.shape[0]):
        if isinstance(candidate, int):
            return candidate
    raise NotImplementedError("a grouped matmul needs a static number of groups (the length of `offs`)")


def _group_bounds(offs: TOffset, groups: int) -> list[INT64]:
    """[0, offs[0], ..., offs[-1]] as groups + 1 one-element INT64 tensors, the starts/ends Slice takes."""
    bounds = op.Concat(op.Constant(value_ints=[0]), op.Cast(offs, to=INT64.dtype), axis=0)
    return list(op.Split(bounds, num_outputs=groups + 1))


def _zeros_beyond(last: INT64, length: INT64, other: INT64, dtype: ir.DataType, *, axis: int) -> TFloat:
    """The zeros that fill positions last..length of the grouped axis (none when the groups cover it)."""
    count = op.Max(op.Sub(length, last), op.Constant(value_ints=[0]))
    shape = op.Concat(count, other, axis=0) if axis == 0 else op.Concat(other, count, axis=0)
    if dtype in _CONSTANT_OF_SHAPE_TYPES:
        return op.ConstantOfShape(shape, value=ir.tensor([0], dtype=dtype))
    return op.Cast(op.ConstantOfShape(shape, value=ir.tensor([0], dtype=ir.DataType.FLOAT)), to=dtype)


def _rows_by_group(input: TFloat, weight: TFloat, offs: TOffset) -> TFloat:
    """(S, K) rows grouped by `offs` x (G, K, N) -> (S, N): rows offs[g-1]:offs[g] times weight[g]."""
    groups = _group_count(offs, weight)
    bounds = _group_bounds(offs, groups)
    rows_axis = op.Constant(value_ints=[0])
    products = []
    for group in range(groups):
        rows = op.Slice(input, bounds[group], bounds[group + 1], rows_axis)
        products.append(op.MatMul(rows, op.Gather(weight, op.Constant(value_int=group), axis=0)))
    tail = _zeros_beyond(
        bounds[groups], op.Shape(input, start=0, end=1), op.Shape(weight, start=2), input.dtype, axis=0
    )
    return op.Concat(*products, tail, axis=0)


def _columns_by_group(input: TFloat, other: TFloat, offs: TOffset) -> TFloat:
    """(G, M, K) x (K, N) with N's columns grouped by `offs` -> (M, N): columns of group g from input[g]."""
    groups = _group_count(offs, input)
    bounds = _group_bounds(offs, groups)
    columns_axis = op.Constant(value_ints=[1])
    products = []
    for group in range(groups):
        columns = op.Slice(other, bounds[group], bounds[group + 1], columns_axis)
        products.append(op.MatMul(op.Gather(input, op.Constant(value_int=group), axis=0), columns))
    rows = op.Shape(input, start=1, end=2)
    tail = _zeros_beyond(bounds[groups], op.Shape(other, start=1, end=2), rows, input.dtype, axis=1)
    return op.Concat(*products, tail, axis=1)


def _contraction_by_group(input: TFloat, other: TFloat, offs: TOffset) -> TFloat:
    """(M, K) x (K, N) with K split by `offs` -> (G, M, N): one product per slice of K (zeros for an empty one)."""
    groups = _group_count(offs)
    bounds = _group_bounds(offs, groups)
    first = op.Constant(value_ints=[0])
    columns_axis, rows_axis = op.Constant(value_ints=[1]), first
    products = []
    for group in range(groups):
        start, end = bounds[group], bounds[group + 1]
        product = op.MatMul(op.Slice(input, start, end, columns_axis), op.Slice(other, start, end, rows_axis))
        products.append(op.Unsqueeze(product, first))
    return op.Concat(*products, axis=0)


@lowering("transformers::grouped_mm_fallback")
def grouped_mm_fallback(input: TFloat, weight: TFloat, offs: TOffset) -> TFloat:
    """transformers' custom op (transformers/integrations/moe.py): (S, K) rows sorted by expert, (E, K, N) weights,
    cumulative row counts -> (S, N). Registered by name, so it needs no import of transformers."""
    return _rows_by_group(input, weight, offs)


@lowering("aten::_grouped_mm")
def grouped_mm(
    self: TFloat,
    mat2: TFloat,
    offs: TOffset | None = None,
    bias: TFloat | None = None,
    out_dtype: int | None = None,
) -> TFloat:
    """Every layout of the schema: 2-D x 3-D (rows grouped, the MoE forward), 3-D x 2-D (columns grouped),
    2-D x 2-D (the contraction grouped: one (M, N) product per group), and 3-D x 3-D (a batched product).

    torch 2.13 refuses `bias` (eager: "Bias not supported yet", and its meta kernel), so there is no eager
    result to follow. `out_dtype` other than the inputs' (which neither eager on CPU nor the meta kernel accepts
    today) gets the product accumulated in float32 and cast once.
    """
    if bias is not None:
        raise NotImplementedError("_grouped_mm with a bias: torch 2.13 refuses it, so its meaning is not defined")
    dtype = self.dtype
    target = dtype if out_dtype is None or out_dtype == -1 else ir.DataType(out_dtype)
    if target != dtype and dtype in _LOW_PRECISION:  # accumulate in float32 without rounding to the inputs' dtype
        self, mat2 = op.Cast(self, to=FLOAT.dtype), op.Cast(mat2, to=FLOAT.dtype)
    layout = (len(self.shape), len(mat2.shape))
    if layout == (3, 3):
        result = op.MatMul(self, mat2)
    elif offs is None:
        raise NotImplementedError(f"_grouped_mm of {layout[0]}-D x {layout[1]}-D operands needs `offs`")
    elif layout == (2, 3):
        result = _rows_by_group(self, mat2, offs)
    elif layout == (3, 2):
        result = _columns_by_group(self, mat2, offs)
    elif layout == (2, 2):
        result = _contraction_by_group(self, mat2, offs)
    else:
        raise NotImplementedError(f"_grouped_mm takes 2-D or 3-D operands, got {layout[0]}-D x {layout[1]}-D")
    return op.Cast(result, to=target) if result.dtype != target else result
