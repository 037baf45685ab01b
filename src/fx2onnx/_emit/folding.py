"""Fold at emit: an ONNX op whose inputs are all constants is computed while it is recorded, not added as a node.

torchlib's functions (and fx2onnx's) build much of their bookkeeping from constants: casts and unsqueezes of
Python numbers, the Range of an ``arange`` with static bounds, the Concat of a static shape, the Shape of a value
whose shape is static. onnxscript's optimizer folds all of it after emission, one node at a time through its
reference evaluator (a third of its time on a transformer). Here the same evaluator, with the same size limits,
computes such a node when it is recorded, so the node is never made: the optimized model is the one the optimizer
made before, and the optimizer has fewer nodes to visit.

Only ops whose result ONNX defines exactly (data movement, casts, integer and IEEE arithmetic, comparisons) are
folded, and only when the result has the dtype the op's definition gives: what a model computes never depends on
whether a constant was folded here or by the optimizer (or, with ``optimize=False``, by no one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir

# onnxscript's own limits for folding (optimizer/_constant_folding.py): inputs of at most 8192 elements, results of
# at most 512 x 512.
INPUT_SIZE_LIMIT = 8192
OUTPUT_SIZE_LIMIT = 512 * 512

# Result dtype -> how to get it: "input0"/"input1" (that input's dtype), "bool", "int64", "to" (Cast's attribute).
_FOLDABLE: dict[str, str] = {
    **dict.fromkeys(
        (
            "Identity",
            "Reshape",
            "Unsqueeze",
            "Squeeze",
            "Flatten",
            "Expand",
            "Transpose",
            "Concat",
            "Slice",
            "Gather",
            "GatherND",
            "Tile",
            "Range",
            "Add",
            "Sub",
            "Mul",
            "Neg",
            "Abs",
            "Max",
            "Min",
            "CumSum",
            "ReduceProd",
            "ReduceSum",
        ),
        "input0",
    ),
    **dict.fromkeys(
        ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"),
        "bool",
    ),
    "Where": "input1",
    "CastLike": "input1",
    "Cast": "to",
    "Shape": "int64",
    "Size": "int64",
}
# Float sums and products may be reordered by an evaluator (numpy's pairwise sum): only folded on integers.
_INTEGER_ONLY = frozenset({"CumSum", "ReduceProd", "ReduceSum"})
# float8 and 4-bit casts: finalize sets Cast's `saturate` to torch's convention before the optimizer folds them.
_NARROW_FLOATS = frozenset(
    {
        ir.DataType.FLOAT8E4M3FN,
        ir.DataType.FLOAT8E4M3FNUZ,
        ir.DataType.FLOAT8E5M2,
        ir.DataType.FLOAT8E5M2FNUZ,
        ir.DataType.FLOAT4E2M1,
        ir.DataType.INT4,
        ir.DataType.UINT4,
    }
)


def may_fold(domain: str, op_type: str, num_outputs: int) -> bool:
    """Whether a node of this op may be folded at all (cheap: asked of every node recorded)."""
    return domain == "" and num_outputs == 1 and op_type in _FOLDABLE


def static_shape(op_type: str, value: ir.Value | None, attributes: Sequence[ir.Attr]) -> np.ndarray | None:
    """``Shape``/``Size`` of a value whose shape is static: the constant they compute (None otherwise)."""
    if op_type not in ("Shape", "Size") or value is None or value.shape is None:
        return None
    dims = list(value.shape)
    if not all(type(dim) is int for dim in dims):
        return None
    if op_type == "Size":
        return np.array(int(np.prod(dims, dtype=np.int64)), dtype=np.int64)
    named = {attribute.name: attribute.as_int() for attribute in attributes}
    rank = len(dims)
    start, end = named.get("start", 0), named.get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return np.array(dims[start:end], dtype=np.int64)


def evaluate(
    op_type: str,
    version: int,
    arrays: Sequence[np.ndarray | None],
    dtypes: Sequence[ir.DataType | None],
    attributes: Sequence[ir.Attr],
) -> np.ndarray | None:
    """The result of `op_type` on constant `arrays` (their ONNX dtypes in `dtypes`), computed by onnxscript's
    reference evaluator as its optimizer would; None where it is not folded here."""
    kind = _FOLDABLE[op_type]
    named = {attribute.name: attribute for attribute in attributes}
    if kind == "to":
        expected: ir.DataType | None = ir.DataType(named["to"].as_int()) if "to" in named else None
    elif kind == "bool":
        expected = ir.DataType.BOOL
    elif kind == "int64":
        expected = ir.DataType.INT64
    else:
        position = 0 if kind == "input0" else 1
        expected = dtypes[position] if position < len(dtypes) else None
    if expected is None or expected in _NARROW_FLOATS or any(dtype in _NARROW_FLOATS for dtype in dtypes):
        return None
    if op_type in _INTEGER_ONLY and not expected.is_integer():
        return None
    if any(array is not None and array.size > INPUT_SIZE_LIMIT for array in arrays):
        return None
    values = {name: _attribute_value(attribute) for name, attribute in named.items()}
    result: Any = _gather_nd(arrays, values) if op_type == "GatherND" else None
    if result is None:
        from onnxscript.optimizer import _constant_folding  # the optimizer's evaluator (imported when first folding)

        result = _constant_folding._reference_evaluator.evaluate("", op_type, version, *arrays, **values)
    if isinstance(result, (list, tuple)):
        if len(result) != 1:
            return None
        (result,) = result
    if not isinstance(result, np.ndarray):
        return None
    if result.size > OUTPUT_SIZE_LIMIT or result.dtype != expected.numpy():
        return None
    return result


def _gather_nd(arrays: Sequence[np.ndarray | None], attributes: dict[str, Any]) -> np.ndarray | None:
    """GatherND without batch dims, as numpy's indexing: the reference evaluator's loops over the index rows in Python
    (10 ms for Swin-T's relative position bias, a 2401-row index into its table, at each of its 12 blocks)."""
    if len(arrays) != 2 or attributes.get("batch_dims", 0) != 0:
        return None
    data, indices = arrays
    if data is None or indices is None or indices.ndim == 0 or not 1 <= indices.shape[-1] <= data.ndim:
        return None
    return data[tuple(np.moveaxis(indices, -1, 0))]  # negative indices count from the end, as ONNX's do


def _attribute_value(attribute: ir.Attr) -> Any:
    if attribute.type == ir.AttributeType.TENSOR:
        return ir.serde.serialize_tensor(attribute.value)  # as onnxscript's folding passes it
    return attribute.value
