"""Tensor creation: arange, full, ... where torchlib's loses precision or dtype; index tables known at export
(tril_indices, triu_indices, combinations).
"""

from __future__ import annotations

import itertools
import math
from typing import TypeVar, Union

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import DOUBLE, FLOAT, INT16, INT32, INT64
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.ops.core import aten_arange_start_step
from onnxscript.function_libs.torch_lib.tensor_typing import TTensor

from fx2onnx._lowerings.builders import TReal, _double
from fx2onnx._lowerings.rules import lowering


@lowering("aten::linspace")
def linspace(
    start: float,
    end: float,
    steps: int,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
) -> FLOAT:
    """All arguments are constants: the values are eager's own, computed once at export."""
    import torch

    from fx2onnx import _dtypes as dtype_table

    torch_dtype = dtype_table.to_torch(ir.DataType(dtype)) if dtype is not None else torch.get_default_dtype()
    values = torch.linspace(start, end, steps, dtype=torch_dtype)
    return op.Constant(value=ir.tensor(values))


_FLOAT_RESULTS = (ir.DataType.DOUBLE, ir.DataType.FLOAT)


# --- arange with float results ----------------------------------------------------------------------------------
# The dtypes torchlib's arange takes its (symbolic) arguments in: dispatch treats both alike.
TRangeArg = TypeVar("TRangeArg", bound=Union[DOUBLE, FLOAT, INT16, INT32, INT64])  # noqa: UP007 (onnxscript reads it)


def _as_double(value: TRangeArg | float) -> DOUBLE:
    if isinstance(value, ir.Value):
        return value if value.dtype == ir.DataType.DOUBLE else op.Cast(value, to=ir.DataType.DOUBLE)
    return _double(value)


def _is_integral(value: TRangeArg | float) -> bool:
    if isinstance(value, ir.Value):
        return not value.dtype.is_floating_point()
    return isinstance(value, int)


@lowering("aten::arange.start_step")
def arange_start_step(start: TRangeArg, end: TRangeArg, step: TRangeArg = 1, dtype: int = -1) -> TTensor:
    """Float aranges as eager computes them: length ceil((end - start) / step) and values start + i * step, both
    in double (CPU's accumulate type for float and double), then rounded once to the result's dtype.

    torchlib computes both in float32, which can give another length (arange(0.1, 0.6, 0.1) has 5 elements, not
    6) and float32 values in a float64 result. Integer results (and float16/bfloat16 ones) keep torchlib's
    implementation. Without a `dtype`, the emitter casts the double result to eager's dtype.
    """
    integral = all(_is_integral(v) for v in (start, end, step))
    if (dtype in (-1, None) and integral) or (dtype not in (-1, None) and ir.DataType(dtype) not in _FLOAT_RESULTS):
        return aten_arange_start_step(start, end, step, dtype=-1 if dtype is None else dtype)
    if not any(isinstance(v, ir.Value) for v in (start, end, step)):
        count = op.Constant(value=ir.tensor(max(math.ceil((end - start) / step), 0), dtype=ir.DataType.INT64))
    else:
        quotient = op.Div(op.Sub(_as_double(end), _as_double(start)), _as_double(step))
        count = op.Max(op.Cast(op.Ceil(quotient), to=ir.DataType.INT64), op.Constant(value_int=0))
    steps = op.Cast(op.Range(op.Constant(value_int=0), count, op.Constant(value_int=1)), to=ir.DataType.DOUBLE)
    values = op.Add(_as_double(start), op.Mul(_as_double(step), steps))
    if dtype not in (-1, None) and ir.DataType(dtype) != ir.DataType.DOUBLE:
        values = op.Cast(values, to=dtype)
    return values


# --- index tables known at export: tril/triu_indices, combinations' positions -----------------------------------
@lowering("aten::combinations")
def combinations(self: TReal, r: int = 2, with_replacement: bool = False) -> TReal:
    """A Gather of the r-tuples of positions, known at export from the static length, in eager's order."""
    if r == 0:
        return op.Slice(self, op.Constant(value_ints=[0]), op.Constant(value_ints=[0]))
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = [list(row) for row in pick(range(self.shape[0]), r)]
    positions = np.array(rows, dtype=np.int64).reshape(len(rows), r)
    return op.Gather(self, op.Constant(value=ir.tensor(positions)), axis=0)


def _constant_of_dtype(values: torch.Tensor, dtype: int | None) -> INT64:
    from fx2onnx import _dtypes as dtype_table

    torch_dtype = dtype_table.to_torch(ir.DataType(dtype)) if dtype is not None else torch.int64
    return op.Constant(value=ir.tensor(values.to(torch_dtype)))


@lowering("aten::tril_indices")
def tril_indices(
    row: int,
    col: int,
    offset: int = 0,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
) -> INT64:
    """All arguments are constants: eager's indices, computed once at export."""
    return _constant_of_dtype(torch.tril_indices(row, col, offset), dtype)


@lowering("aten::triu_indices")
def triu_indices(
    row: int,
    col: int,
    offset: int = 0,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
) -> INT64:
    """All arguments are constants: eager's indices, computed once at export."""
    return _constant_of_dtype(torch.triu_indices(row, col, offset), dtype)
