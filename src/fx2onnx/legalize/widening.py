"""Which wider types a node may compute in so that, cast back, it gives eager's result.

- float16 and bfloat16 widen to float32 (then float64): eager computes these ops in float32 on CPU
  and rounds to the narrow type, which is what the Cast back does.
- Integers widen to wider integers. Arithmetic modulo 2**n commutes with truncation, so an int8
  ``Add``/``Mul``/``MatMul``/``ReduceSum`` computed in int32 and cast back (ONNX Runtime's Cast
  truncates) wraps exactly as eager's int8 does; comparisons, selection and data movement are exact.
- bool widens to an integer only for operators whose bool result is "nonzero" of the integer
  result (``Add`` = or, ``Mul`` = and, ``Max`` = or, selection, data movement). Arithmetic takes no
  uint8, whose sums could wrap to zero.
- float64 narrows to float32 only when nothing else works (ONNX Runtime CPU has no float64 ``Resize``
  nor ``Det``; fx2onnx's float64 lowerings keep ``Conv``, ``Erf``, ``Atan``... out of float64 graphs);
  such Casts are recorded as lossy.
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx import _dtypes as dtypes

DataType = ir.DataType

_WIDER: dict[DataType, tuple[DataType, ...]] = {
    DataType.BFLOAT16: (DataType.FLOAT, DataType.DOUBLE),
    DataType.FLOAT16: (DataType.FLOAT, DataType.DOUBLE),
    DataType.FLOAT: (DataType.DOUBLE,),
    DataType.INT8: (DataType.INT16, DataType.INT32, DataType.INT64),
    DataType.UINT8: (DataType.INT16, DataType.UINT16, DataType.INT32, DataType.UINT32, DataType.INT64),
    DataType.INT16: (DataType.INT32, DataType.INT64),
    DataType.UINT16: (DataType.INT32, DataType.UINT32, DataType.INT64),
    DataType.INT32: (DataType.INT64,),
    DataType.UINT32: (DataType.INT64, DataType.UINT64),
}
_LOSSY: dict[DataType, tuple[DataType, ...]] = {DataType.DOUBLE: (DataType.FLOAT,)}

# bool as "nonzero of an integer", only where the op's integer result cast to bool is torch's bool
# result; other ops (Sub, Neg, Div, interpolation...) never compute bool as an integer.
_BOOL_SELECTION = frozenset(
    {
        "Where", "Max", "Min", "ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "TopK", "Equal", "Less", "LessOrEqual",
        "Greater", "GreaterOrEqual", "Identity", "Reshape", "Transpose", "Concat", "Split", "Slice", "Gather",
        "GatherElements", "GatherND", "ScatterElements", "ScatterND", "Expand", "Tile", "Pad", "Squeeze",
        "Unsqueeze", "Flatten", "Trilu", "Compress", "MaxPool", "Clip", "ReverseSequence", "DepthToSpace",
        "SpaceToDepth", "Unique",
    }
)  # fmt: skip
_BOOL_ARITHMETIC = frozenset({"Add", "Mul", "Sum", "ReduceSum", "ReduceProd", "CumSum", "Abs", "Sign"})
_BOOL_SELECTION_INTEGERS = (DataType.UINT8, DataType.INT32, DataType.INT64)
_BOOL_ARITHMETIC_INTEGERS = (DataType.INT32, DataType.INT64)


def candidates(op_type: str, dtype: DataType) -> list[tuple[DataType, bool]]:
    """(type, lossy) choices for computing `op_type` on `dtype` instead, nearest first."""
    if dtype == DataType.BOOL:
        if op_type in _BOOL_SELECTION:
            wider: tuple[DataType, ...] = _BOOL_SELECTION_INTEGERS
        elif op_type in _BOOL_ARITHMETIC:
            wider = _BOOL_ARITHMETIC_INTEGERS
        else:
            wider = ()
        return [(d, False) for d in wider]
    return [(d, False) for d in _WIDER.get(dtype, ())] + [(d, True) for d in _LOSSY.get(dtype, ())]


def cost(source: DataType, target: DataType) -> float:
    """Rank of computing in `target` instead of `source`: lossless and narrow first."""
    if source == DataType.BOOL:
        return 2.0 + target.itemsize / 8
    return dtypes.cast_cost(source, target) if dtypes.is_lossless(source, target) else dtypes.LOSSY


def is_float(dtype: DataType) -> bool:
    return dtypes.is_float(dtype)
