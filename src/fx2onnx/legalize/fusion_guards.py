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

- ``NoopElimination`` removes ``Add(x, +0.0)`` (and ``Sub(x, -0.0)``) as a no-op, which it is not for x = -0.0
  (-0.0 + 0.0 is +0.0, as in eager: ``fmod(x, x) + 0`` then ``atan2`` gave -pi for pi, fuzz seed 1939). Such a
  node adding a scalar zero becomes ``Where(x == 0, +0.0, x)``, the same values, which nothing removes.

- ``MatMulScaleFusion`` folds a constant scale after a MatMul into ``FusedMatMul``'s alpha, and the session then
  refuses a non-finite alpha (``matmul(a, b) / 0``): a same-shape Reshape between the two keeps them apart.

- ``ExpandElimination`` removes an Expand whose constant target shape is at most 1 where it differs from the
  input's, a target 0 included: ``Expand(x [1, 1], [1, 0])`` (an empty broadcast, as eager's ``x.expand(1, 0)``)
  then returns x itself, [1, 1] (fuzz seed 10002201: a bfloat16 masked_scatter with an empty mask, its Expand
  between legalization's Casts). The input is sliced to size 0 along those dims first: the same result, and an
  Expand the rule only removes when it is one.

- ``FastGeluFusion`` makes the tanh form of gelu a ``com.microsoft.FastGelu``, whose kernel requires an input of
  rank 1 or more: a 0-d gelu(x, approximate="tanh") failed when run (fuzz seed 40001174). A 0-d Tanh takes its
  input through a same-shape Reshape, which the fusion does not look through.

- ``GeluFusion`` removes the ``x * 0.5`` node it finds among x's consumers with the erf gelu it fuses, even when
  other nodes read that product: two gelus of one tensor (erf and tanh forms, the product shared by the optimizer)
  gave a model the session refused. The other readers get their own product, of x through a same-shape Reshape.

ONNX Runtime also refuses to create a session for a model with an integer ``Div``/``Mod`` by a constant holding a
zero ("Integer modulo by zero", at kernel creation), where eager's ``empty_uint8 % 0`` is an empty tensor (and a
non-empty one raises ZeroDivisionError). The zeros of such a constant divisor become ones: the model loads, and
whatever the input, nothing eager computes changes.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from fx2onnx._constant_arrays import constant_array

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
                if node.op_type == "Div":
                    inserted += _non_finite_scale_kept_apart(graph, node)
            elif node.op_type == "Mul" and node.domain in _STANDARD:
                inserted += _non_finite_scale_kept_apart(graph, node)
                inserted += _shared_gelu_half_kept_apart(graph, node)
            elif node.op_type in ("Add", "Sub") and node.domain in _STANDARD:
                inserted += _zero_addition_kept(graph, node)
            elif node.op_type == "Cast" and node.domain in _STANDARD and _cast_target(node) in _NARROW_FLOATS:
                inserted += _separate_from_casts(graph, node, to=_EIGHT_BIT_INTEGERS)
            elif node.op_type == "Expand" and node.domain in _STANDARD:
                inserted += _empty_expansion_kept(graph, node)
            elif node.op_type == "Tanh" and node.domain in _STANDARD:
                inserted += _scalar_tanh_kept_apart(graph, node)
    return inserted


# Cast(float -> float16/bfloat16) -> Cast(-> int8/uint8) skips the narrow rounding in ONNX Runtime, even with
# optimizations off (docs/ort-defects.md, 7); a Reshape between the two keeps it (fuzz seed 19267).
_NARROW_FLOATS = {ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
_EIGHT_BIT_INTEGERS = {ir.DataType.INT8, ir.DataType.UINT8}


def _cast_target(node: ir.Node) -> ir.DataType | None:
    to = node.attributes.get("to")
    return ir.DataType(to.as_int()) if to is not None else None


def _zero_addition_kept(graph: ir.Graph | ir.Function, node: ir.Node) -> int:
    """Add(x, +0.0) / Add(+0.0, x) / Sub(x, -0.0) of a float x and a scalar: Where(x == 0, +0.0, x)."""
    if len(node.inputs) != 2:
        return 0
    for position in ((0, 1), (1, 0)) if node.op_type == "Add" else ((0, 1),):
        x, constant = node.inputs[position[0]], constant_array(node.inputs[position[1]])
        if x is None or constant is None or constant.shape != () or constant.dtype.kind != "f":
            continue
        number = float(constant)
        if number != 0 or np.signbit(constant) != (node.op_type == "Sub"):
            continue
        name = node.name or "zero_addition"
        zero = ir.node("Constant", [], {"value": ir.tensor(np.zeros((), constant.dtype))}, name=f"{name}_zero")
        zero.outputs[0].name = f"{name}_zero"
        zero.outputs[0].type = ir.TensorType(ir.DataType.from_numpy(constant.dtype))
        zero.outputs[0].shape = ir.Shape([])
        equal = ir.node("Equal", [x, zero.outputs[0]], name=f"{name}_is_zero")
        equal.outputs[0].name = f"{name}_is_zero"
        equal.outputs[0].type = ir.TensorType(ir.DataType.BOOL)
        where = ir.node("Where", [equal.outputs[0], zero.outputs[0], x], name=f"{name}_positive_zero")
        graph.insert_before(node, [zero, equal, where])
        result = node.outputs[0]
        where.outputs[0].type = result.type
        where.outputs[0].shape = result.shape
        kept_name = result.name
        result.replace_all_uses_with(where.outputs[0], replace_graph_outputs=True)
        graph.remove(node, safe=True)
        result.name = f"{name}_removed"
        where.outputs[0].name = kept_name
        return 1
    return 0


def _without_zero_divisor(graph: ir.Graph | ir.Function, node: ir.Node) -> int:
    """An integer Div/Mod by a constant holding a zero divides by a copy with ones there (ONNX Runtime refuses
    the zero at session creation)."""
    divisor = constant_array(node.inputs[1] if len(node.inputs) > 1 else None)
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


def _empty_expansion_kept(graph: ir.Graph | ir.Function, node: ir.Node) -> int:
    """An Expand to a constant shape with a 0 where the input's dim is not 0 (statically) expands a Slice of the
    input to size 0 along those dims, which ExpandElimination does not mistake for a no-op."""
    source, target = node.inputs[0], constant_array(node.inputs[1] if len(node.inputs) > 1 else None)
    if source is None or source.shape is None or target is None or target.ndim != 1:
        return 0
    rank, offset = source.shape.rank(), target.size - source.shape.rank()
    axes = [
        axis
        for axis in range(max(0, -offset), rank)
        if target[axis + offset] == 0 and not (isinstance(source.shape[axis], int) and source.shape[axis] == 0)
    ]
    if not axes:
        return 0
    name = f"{node.name or 'expand'}_empty_source"
    zeros, axes_node = (
        ir.node("Constant", [], {"value": ir.tensor(np.asarray(values, np.int64))}, name=f"{name}_{part}")
        for part, values in (("starts", [0] * len(axes)), ("axes", axes))
    )
    for constant in (zeros, axes_node):
        constant.outputs[0].name = constant.name
        constant.outputs[0].type = ir.TensorType(ir.DataType.INT64)
        constant.outputs[0].shape = ir.Shape([len(axes)])
    sliced = ir.node("Slice", [source, zeros.outputs[0], zeros.outputs[0], axes_node.outputs[0]], name=name)
    sliced.outputs[0].name = name
    sliced.outputs[0].type = source.type
    sliced.outputs[0].shape = ir.Shape([0 if axis in axes else size for axis, size in enumerate(source.shape)])
    for key in ("pkg.fx2onnx.fx_node", "pkg.fx2onnx.target", "pkg.fx2onnx.stack_trace", "namespace"):
        if key in node.metadata_props:
            sliced.metadata_props[key] = node.metadata_props[key]
    graph.insert_before(node, [zeros, axes_node, sliced])
    node.replace_input_with(0, sliced.outputs[0])
    return 1


def _scalar_tanh_kept_apart(graph: ir.Graph | ir.Function, node: ir.Node) -> int:
    """A Tanh of a 0-d value takes it through a same-shape Reshape: FastGeluFusion would make the tanh form of gelu
    around it a FastGelu, whose kernel refuses a 0-d input when the model runs (fuzz seed 40001174)."""
    source = node.inputs[0] if node.inputs else None
    producer = source.producer() if source is not None else None
    if producer is None or source is not producer.outputs[0] or source.shape is None or source.shape.rank() != 0:
        return 0
    return _guard_uses(graph, producer, [(node, 0)])


def _shared_gelu_half_kept_apart(graph: ir.Graph | ir.Function, node: ir.Node) -> int:
    """x * 0.5 (`node`) read by the last Mul of an erf gelu, (1 + erf(.)) * (x * 0.5), and by other nodes (two gelus
    of one tensor, the product shared by the optimizer's common subexpressions): GeluFusion removes this node with
    the gelu it fuses, and the session refuses the model, whose other readers then read a value nothing computes
    ("Node input ... is not a graph input"). The other readers get their own x * 0.5 of x through a same-shape
    Reshape, which the fusion, finding its Mul among x's consumers, does not look through."""
    output = node.outputs[0]
    uses = list(output.uses())
    if len(uses) < 2 or len(node.inputs) != 2 or not any(_ends_an_erf_gelu(user) for user, _ in uses):
        return 0
    others = [(user, index) for user, index in uses if not _ends_an_erf_gelu(user)]
    for position, value in enumerate(node.inputs):
        if value is None or constant_array(value) is not None or value.shape is None:
            continue
        name = f"{output.name or 'gelu_half'}_apart"
        view = _same_shape_view(graph, value, node, name)
        inputs = list(node.inputs)
        inputs[position] = view
        copy = ir.node("Mul", inputs, name=name)
        copy.outputs[0].name = name
        copy.outputs[0].type, copy.outputs[0].shape = output.type, output.shape
        for key, meta in node.metadata_props.items():
            copy.metadata_props[key] = meta
        view_node = view.producer()
        assert view_node is not None
        graph.insert_after(view_node, copy)
        for user, index in others:
            user.replace_input_with(index, copy.outputs[0])
        return 1
    return 0


def _ends_an_erf_gelu(node: ir.Node) -> bool:
    """Whether `node` is a Mul of (1 + erf(.)) by something: the last node of the erf form of gelu."""
    if node.op_type != "Mul" or node.domain not in _STANDARD:
        return False
    for value in node.inputs:
        plus = value.producer() if value is not None else None
        if plus is not None and plus.op_type == "Add":
            sources = [operand.producer() for operand in plus.inputs if operand is not None]
            if any(source is not None and source.op_type == "Erf" for source in sources):
                return True
    return False


def _graphs(model: ir.Model) -> list[ir.Graph | ir.Function]:
    graphs: list[ir.Graph | ir.Function] = [model.graph, *model.graph.subgraphs()]
    for function in model.functions.values():
        graphs += [function, *function.graph.subgraphs()]
    return graphs


def _separate_from_casts(graph: ir.Graph | ir.Function, node: ir.Node, to: set[ir.DataType] | None = None) -> int:
    """Feed the Casts (to a type in `to`, if given) of `node`'s output through a same-shape Reshape (the trigger of
    MatMulIntegerToFloatFusion, and of the cast chain of docs/ort-defects.md 7)."""
    output = node.outputs[0]
    casts = [
        (user, index)
        for user, index in output.uses()
        if user.op_type == "Cast" and user.domain in _STANDARD and (to is None or _cast_target(user) in to)
    ]
    return _guard_uses(graph, node, casts)


def _non_finite_scale_kept_apart(graph: ir.Graph | ir.Function, node: ir.Node) -> int:
    """MatMul -> Div by a constant 0 or NaN, or Mul by a constant inf or NaN: MatMulScaleFusion folds the scale into
    FusedMatMul's alpha, which must be finite, and the session refuses the model (fuzz seed 24189, a float64
    `matmul(a, b) / False`). A same-shape Reshape between the two keeps the graph as it is."""
    if len(node.inputs) != 2:
        return 0
    for position in (0, 1) if node.op_type == "Mul" else (0,):
        product, constant = node.inputs[position], constant_array(node.inputs[1 - position])
        if product is None or constant is None or constant.size != 1 or constant.dtype.kind != "f":
            continue
        value = float(constant.reshape(()))
        scale = value if node.op_type == "Mul" else 1.0 / value if value != 0 else math.inf
        producer = product.producer()
        if math.isfinite(scale) or producer is None or producer.op_type not in ("MatMul", "Gemm"):
            continue
        if producer.domain not in _STANDARD:
            continue
        return _guard_uses(graph, producer, [(node, position)])
    return 0


def _guard_uses(graph: ir.Graph | ir.Function, node: ir.Node, uses: list[tuple[ir.Node, int]]) -> int:
    """Feed `uses` of `node`'s first output through a same-shape Reshape (a view in ONNX Runtime, no copy), which
    no fusion looks through."""
    output = node.outputs[0]
    if not uses:
        return 0
    guarded = _same_shape_view(graph, output, node, output.name or node.name or "matmul_integer")
    for user, index in uses:
        user.replace_input_with(index, guarded)
    return 1


def _same_shape_view(graph: ir.Graph | ir.Function, value: ir.Value, anchor: ir.Node, name: str) -> ir.Value:
    """`value` through a same-shape Reshape, inserted after `anchor` (whose origin metadata it takes)."""
    rank = value.shape.rank() if value.shape is not None else None
    if rank is not None:  # Reshape's 0 keeps each dimension as it is, whatever its size at run time
        shape_node = ir.node("Constant", [], {"value": ir.tensor(np.zeros(rank, np.int64))}, name=f"{name}_guard_shape")
    else:
        shape_node = ir.node("Shape", [value], name=f"{name}_guard_shape")
    shape_node.outputs[0].name = f"{name}_guard_shape"
    shape_node.outputs[0].type = ir.TensorType(ir.DataType.INT64)
    reshape = ir.node("Reshape", [value, shape_node.outputs[0]], name=f"{name}_fusion_guard")
    guarded = reshape.outputs[0]
    guarded.name = f"{name}_fusion_guard"
    guarded.type = value.type
    guarded.shape = value.shape
    for key in ("pkg.fx2onnx.fx_node", "pkg.fx2onnx.target", "pkg.fx2onnx.stack_trace", "namespace"):
        if key in anchor.metadata_props:
            reshape.metadata_props[key] = anchor.metadata_props[key]
    graph.insert_after(anchor, [shape_node, reshape])
    return guarded
