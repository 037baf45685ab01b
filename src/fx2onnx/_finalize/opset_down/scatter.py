"""Scatter with a reduction the target opset lacks (add and mul before 16, max and min before 18) as a Loop of
plain scatters, each element receiving its updates in eager's order."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from fx2onnx._finalize.opset_down.rewriting import OpsetRefused, replace, typed


def scatter_reduction(node: ir.Node, opset: int) -> None:
    attribute = node.attributes.get("reduction")
    reduction = attribute.as_string() if attribute is not None else "none"
    needs = {"none": 0, "add": 16, "mul": 16, "max": 18, "min": 18}[reduction]
    if needs > opset:
        _scatter_in_a_loop(node, reduction)
        return
    if opset < 16:
        node.attributes.pop("reduction", None)


def _scatter_in_a_loop(node: ir.Node, reduction: str) -> None:
    """ScatterElements or ScatterND reducing (add, mul, max, min) as a Loop over the updates, which reads the values
    an update meets, combines and writes them back: ScatterElements one slice along its axis at a time (the columns of
    a slice reach distinct elements), ScatterND one update at a time. Each element meets its updates in their order,
    as in torch's kernels and ONNX Runtime's reduction; each step copies the data."""
    data, indices, updates = node.inputs[0], node.inputs[1], node.inputs[2]
    assert data is not None and indices is not None and updates is not None
    if data.dtype is None or indices.shape is None or updates.shape is None or data.shape is None:
        raise OpsetRefused(f"{node.op_type} with reduction={reduction!r} of unknown ranks or types")
    elements = node.op_type == "ScatterElements"
    axis = node.attributes["axis"].as_int() if elements and "axis" in node.attributes else 0
    axis %= len(data.shape)
    tape = ir.tape.Tape()

    def constant(value: object) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(np.asarray(value, dtype=np.int64))})

    if elements:
        along, count_of = axis, indices
    else:  # the updates as [count, *the data's trailing dims], the indices as [count, k]
        depth = indices.shape[-1]
        if not isinstance(depth, int):
            raise OpsetRefused("ScatterND with index tuples of a length not known at export needs opset 16")
        trailing = tape.op("Slice", [tape.op("Shape", [data]), constant([depth]), constant([len(data.shape)])])
        indices = tape.op("Reshape", [indices, constant([-1, depth])])
        updates = tape.op("Reshape", [updates, tape.op("Concat", [constant([-1]), trailing], {"axis": 0})])
        along, count_of = 0, indices
    count = tape.op("Gather", [tape.op("Shape", [count_of]), constant(along)])
    typed(tape.nodes)  # the body reads their types
    prefix = node.name or f"scatter_{id(node)}"  # of the body's names, unique in the model
    body = ir.tape.Tape()
    step, going, current = (
        ir.Value(name=f"{prefix}_{name}", type=ir.TensorType(dtype), shape=shape)
        for name, dtype, shape in (
            ("step", ir.DataType.INT64, ir.Shape([])),
            ("going", ir.DataType.BOOL, ir.Shape([])),
            ("current", data.dtype, data.shape),
        )
    )
    first = body.op("Unsqueeze", [step, body.op("Constant", [], {"value": ir.tensor(np.asarray([0], np.int64))})])
    last = body.op("Add", [first, body.op("Constant", [], {"value": ir.tensor(np.asarray([1], np.int64))})])
    axes = body.op("Constant", [], {"value": ir.tensor(np.asarray([along], np.int64))})
    where = body.op("Slice", [indices, first, last, axes])
    given = body.op("Slice", [updates, first, last, axes])
    if elements:
        met = body.op("GatherElements", [current, where], {"axis": axis})
    else:
        met = body.op("GatherND", [current, where])
    if reduction in ("add", "mul"):
        combined = body.op("Add" if reduction == "add" else "Mul", [met, given])
    else:  # the update where it is larger (smaller) or NaN, as torch's amax (amin): NaN wins either way
        wins = body.op("Greater" if reduction == "max" else "Less", [given, met])
        if data.dtype.is_floating_point():
            wins = body.op("Or", [wins, body.op("IsNaN", [given])])
        combined = body.op("Where", [wins, given, met])
    scatter_attributes = {"axis": axis} if elements else None
    written = body.op(node.op_type, [current, where, combined], scatter_attributes)
    still = body.op("Identity", [going])
    typed(body.nodes)
    for number, value in enumerate(output for body_node in body.nodes for output in body_node.outputs):
        value.name = f"{prefix}_loop_{number}"
    written.shape = data.shape
    graph = ir.Graph([step, going, current], [still, written], nodes=body.nodes, name=f"{prefix}_loop")
    result = tape.op("Loop", [count, None, data], {"body": graph})
    replace(node, tape.nodes, [result])
