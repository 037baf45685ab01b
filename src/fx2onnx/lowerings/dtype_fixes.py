"""Lowerings that keep eager's results across dtypes where torchlib has none or a narrower one."""

from __future__ import annotations

from typing import TypeVar

from onnxscript import BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8
from onnxscript import opset18 as op

from fx2onnx.lowerings.rules import lowering

# Every real dtype eager sorts, bool included (torchlib's aten_sort takes no bool). Types the
# target's TopK lacks (bool, int16, bfloat16 on ONNX Runtime CPU) are left to legalization.
TSortable = TypeVar("TSortable", BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8)


@lowering("aten::sort.stable")
def sort_stable(
    self: TSortable, stable: bool | None = None, dim: int = -1, descending: bool = False
) -> tuple[TSortable, INT64]:
    """``torch.sort(x, stable=...)``: a TopK over the whole dimension.

    ONNX's TopK puts equal elements in index order, in either direction, which is the order a
    stable sort keeps; an unstable sort may return any order of ties, so that order serves too.
    """
    del stable
    rank = len(self.shape)
    if rank == 0:
        return op.Identity(self), op.Constant(value_int=0)
    axis = dim % rank
    size = op.Shape(self, start=axis, end=axis + 1)
    return op.TopK(self, size, axis=axis, largest=descending, sorted=True)
