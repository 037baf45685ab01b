"""Builders shared by the linear-algebra lowerings (linalg.py, linalg_eigen.py): constants, index grids, and
slices and transposes over a matrix's last two axes. Registers nothing.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import INT64
from onnxscript import opset18 as op

from fx2onnx._lowerings.builders import TFloat


def _ints(*values: int) -> INT64:
    return op.Constant(value_ints=list(values))


def _index_column(count: int) -> INT64:
    """[[0], [1], ..., [count-1]]: row numbers, broadcast against [..., count, 1] columns."""
    return op.Constant(value=ir.tensor(np.arange(count, dtype=np.int64).reshape(count, 1)))


def _index_row(count: int) -> INT64:
    return op.Constant(value=ir.tensor(np.arange(count, dtype=np.int64).reshape(1, count)))


def _scalar_like(value: float, like: TFloat) -> TFloat:
    return op.CastLike(op.Constant(value_float=value), like)


def _rows(a: TFloat, start: int, stop: int) -> TFloat:
    return op.Slice(a, _ints(start), _ints(stop), _ints(-2))


def _columns(a: TFloat, start: int, stop: int) -> TFloat:
    return op.Slice(a, _ints(start), _ints(stop), _ints(-1))


def _transpose(a: TFloat) -> TFloat:
    """The last two axes swapped, whatever the rank (intermediate values may not know theirs)."""
    return op.Einsum(a, equation="...ij->...ji")


def _batch_filled(a: TFloat, trailing: list[int], value: float, like: TFloat) -> TFloat:
    """A tensor of `value` with a's batch dims and the given trailing dims (empty results keep their batch)."""
    shape = op.Concat(op.Shape(a, end=-2), _ints(*trailing), axis=0)
    return op.Expand(op.CastLike(op.Constant(value_float=value), like), shape)
