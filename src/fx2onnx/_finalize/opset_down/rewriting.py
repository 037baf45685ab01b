"""What every down-conversion adapter shares: the refusal, the op version in force, typed replacement nodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx.defs
import onnx_ir as ir

from fx2onnx._constant_arrays import constant_array
from fx2onnx._records import BASE_OPSET


class OpsetRefused(Exception):
    """A node the target opset cannot express; the message says what it needs."""


def since(op_type: str, opset: int) -> int:
    """The version of `op_type` in force at `opset` (0 when the op does not exist there)."""
    try:
        return onnx.defs.get_schema(op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        return 0


Adapter = Callable[[ir.Node, int], None]


def constant_ints(value: ir.Value | None) -> list[int] | None:
    array = constant_array(value)
    return None if array is None else [int(v) for v in array.reshape(-1)]


def known_dtype(value: ir.Value | None) -> ir.DataType | None:
    """The dtype of `value`, or where the inliner left it untyped (a torchlib function's intermediate), that of the
    input its producer's schema gives the same type parameter as the output (Softplus of x: x's)."""
    while value is not None and value.dtype is None:
        producer = value.producer()
        if producer is None or producer.domain not in ("", "ai.onnx") or not producer.inputs:
            return None
        try:
            schema = onnx.defs.get_schema(producer.op_type, BASE_OPSET, "")
        except onnx.defs.SchemaError:
            return None
        output = schema.outputs[min(value.index() or 0, len(schema.outputs) - 1)].type_str
        value = next(
            (v for v, formal in zip(producer.inputs, schema.inputs) if formal.type_str == output and v is not None),
            None,
        )
    return value.dtype if value is not None else None


def replace(node: ir.Node, new_nodes: Sequence[ir.Node], new_outputs: Sequence[ir.Value]) -> None:
    """Replace `node` by `new_nodes` in its graph, its outputs by `new_outputs` (names, types and uses carried)."""
    for new_node in new_nodes:
        for key, value in node.metadata_props.items():
            new_node.metadata_props.setdefault(key, value)
    typed(new_nodes)
    graph = node.graph
    assert graph is not None
    outputs = list(node.outputs[: len(new_outputs)])
    ir.convenience.replace_nodes_and_values(graph, node, [node], list(new_nodes), outputs, list(new_outputs))


_BOOLEAN_RESULTS = frozenset(("GreaterOrEqual", "LessOrEqual", "Equal", "Less", "Greater", "Not", "And", "Or", "IsNaN"))


def typed(nodes: Sequence[ir.Node]) -> None:
    """The dtypes of the adapters' new values (legalize reads them); shapes are left to ONNX's inference."""
    for node in nodes:
        output = node.outputs[0]
        if output.dtype is not None:
            continue
        if node.op_type == "Constant":
            output.dtype = node.attributes["value"].as_tensor().dtype
        elif node.op_type == "Cast":
            output.dtype = ir.DataType(node.attributes["to"].as_int())
        elif node.op_type == "Shape":
            output.dtype = ir.DataType.INT64
        elif node.op_type in _BOOLEAN_RESULTS:
            output.dtype = ir.DataType.BOOL
        elif node.op_type == "Where":
            output.dtype = node.inputs[1].dtype if node.inputs[1] is not None else None
        else:
            output.dtype = node.inputs[0].dtype if node.inputs[0] is not None else None


def int64s(values: Sequence[int], name: str) -> ir.Node:
    tensor = ir.tensor(np.asarray(values, dtype=np.int64), name=name)
    node = ir.node("Constant", [], {"value": tensor})
    node.outputs[0].dtype, node.outputs[0].shape = ir.DataType.INT64, ir.Shape([len(values)])
    return node
