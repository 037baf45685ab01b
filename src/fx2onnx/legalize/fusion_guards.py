"""Keep ONNX Runtime's graph optimizer from fusing patterns into kernels that compute something else.

ONNX Runtime's default session (``ORT_ENABLE_ALL``) rewrites the graph before running it. Where a fusion's
kernel does not compute what the nodes it replaces compute, the exported model gives other numbers in a default
session than with optimizations off; each such runtime defect is described, with a reproducer, in
``docs/ort-defects.md``. The guards here leave the computation as it is and only make the pattern unmatchable.

- ``MatMulIntegerToFloatFusion`` fuses MatMulInteger -> Cast -> Mul(., Mul(a_scale, b_scale)) [-> Add(bias)]
  into ``com.microsoft.MatMulIntegerToFloat`` without looking at the scales' shapes. With a per-row activation
  scale (dynamic per-token quantization: ``acc.float() * (x_scale * w_scale) + bias``) its kernel adds the bias
  before applying the row scale (``x_scale * (acc * w_scale + bias)``, off by ``bias * (x_scale - 1)``), and
  rounds ``(acc * w_scale) * x_scale`` where the graph says ``acc * (x_scale * w_scale)``. The fusion needs the
  Cast's input to come straight from a MatMulInteger: a Reshape to the same shape in between (a view in ONNX
  Runtime, no copy) keeps the graph's own semantics.

ONNX Runtime also refuses to create a session for a model with an integer ``Div``/``Mod`` by a constant holding a
zero ("Integer modulo by zero", at kernel creation), where eager's ``empty_uint8 % 0`` is an empty tensor (and a
non-empty one raises ZeroDivisionError). The zeros of such a constant divisor become ones: the model loads, and
whatever the input, nothing eager computes changes.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

_STANDARD = ("", "ai.onnx")


def guard_fusions(model: ir.Model) -> int:
    """Insert the guards into every graph and function of `model`; returns how many were inserted."""
    inserted = 0
    for graph in _graphs(model):
        for node in list(graph):
            if node.op_type == "MatMulInteger" and node.domain in _STANDARD:
                inserted += _separate_from_casts(graph, node)
            elif node.op_type in ("Div", "Mod") and node.domain in _STANDARD:
                inserted += _without_zero_divisor(graph, node)
    return inserted


def _constant_of(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    producer = value.producer()
    if producer is not None and producer.op_type == "Constant" and "value" in producer.attributes:
        return producer.attributes["value"].as_tensor().numpy()
    return None


def _without_zero_divisor(graph: ir.Graph | ir.Function, node: ir.Node) -> int:
    """An integer Div/Mod by a constant holding a zero divides by a copy with ones there (ONNX Runtime refuses
    the zero at session creation)."""
    divisor = _constant_of(node.inputs[1] if len(node.inputs) > 1 else None)
    if divisor is None or divisor.dtype.kind not in "iu" or not (divisor == 0).any():
        return 0
    name = f"{node.name or 'division'}_nonzero_divisor"
    constant = ir.node("Constant", [], {"value": ir.tensor(np.where(divisor == 0, 1, divisor).astype(divisor.dtype))})
    constant.name = name
    constant.outputs[0].name = name
    constant.outputs[0].type = ir.TensorType(ir.DataType.from_numpy(divisor.dtype))
    constant.outputs[0].shape = ir.Shape(divisor.shape)
    graph.insert_before(node, constant)
    node.replace_input_with(1, constant.outputs[0])
    return 1


def _graphs(model: ir.Model) -> list[ir.Graph | ir.Function]:
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.graph.subgraphs()]
    for function in model.functions.values():
        graphs += [function, *function.graph.subgraphs()]
    return graphs


def _separate_from_casts(graph: ir.Graph | ir.Function, node: ir.Node) -> int:
    """Feed the Casts of `node`'s output through a same-shape Reshape (MatMulIntegerToFloatFusion's trigger)."""
    output = node.outputs[0]
    casts = [(user, index) for user, index in output.uses() if user.op_type == "Cast" and user.domain in _STANDARD]
    if not casts:
        return 0
    name = output.name or node.name or "matmul_integer"
    rank = output.shape.rank() if output.shape is not None else None
    if rank is not None:  # Reshape's 0 keeps each dimension as it is, whatever its size at run time
        shape_node = ir.node("Constant", [], {"value": ir.tensor(np.zeros(rank, np.int64))}, name=f"{name}_guard_shape")
    else:
        shape_node = ir.node("Shape", [output], name=f"{name}_guard_shape")
    shape_node.outputs[0].name = f"{name}_guard_shape"
    shape_node.outputs[0].type = ir.TensorType(ir.DataType.INT64)
    reshape = ir.node("Reshape", [output, shape_node.outputs[0]], name=f"{name}_fusion_guard")
    guarded = reshape.outputs[0]
    guarded.name = f"{name}_fusion_guard"
    guarded.type = output.type
    guarded.shape = output.shape
    for key in ("pkg.fx2onnx.fx_node", "pkg.fx2onnx.target", "pkg.fx2onnx.stack_trace", "namespace"):
        if key in node.metadata_props:
            reshape.metadata_props[key] = node.metadata_props[key]
    graph.insert_after(node, [shape_node, reshape])
    for user, index in casts:
        user.replace_input_with(index, guarded)
    return 1
