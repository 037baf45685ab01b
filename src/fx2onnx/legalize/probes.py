"""Single-node models: ask a real ONNX Runtime session whether it runs an operator at a binding.

Used to learn what the kernel registry cannot say (which float16 nodes ONNX Runtime itself casts
to float32 on CPU; which nodes without a kernel it runs by expanding the operator's function body,
or, for Constant, by making an initializer) and to check the generated table against real sessions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Literal

import onnx
import onnx.defs
import onnx.helper
import onnx_ir as ir

from fx2onnx.legalize import schemas

Outcome = Literal["ok", "no-kernel", "invalid", "unbuildable"]


@dataclasses.dataclass(frozen=True)
class Probe:
    """A question for a session: `build` makes the model; equal `key`s get the same answer."""

    key: Hashable
    build: Callable[[], onnx.ModelProto | None]
    # The node's attributes (plain values), for verdicts that depend on one (see `reduction_outcome`).
    attributes: Mapping[str, object] = dataclasses.field(default_factory=dict)


def schema_probe(op_type: str, opset: int, binding: Mapping[str, str], domain: str = "") -> Probe:
    """The generic single-node model of `op_type` at `binding` (see :func:`single_node_model`)."""
    fixed = dict(binding)
    key = ("schema", domain, op_type, opset, tuple(sorted(fixed.items())))
    return Probe(key, lambda: single_node_model(op_type, opset, fixed, domain))


# Values for required attributes, by attribute type: enough for session creation on inputs of
# unknown shape, which is all a probe needs.
_ATTRIBUTE_DEFAULTS = {
    onnx.defs.OpSchema.AttrType.INT: 1,
    onnx.defs.OpSchema.AttrType.FLOAT: 1.0,
    onnx.defs.OpSchema.AttrType.INTS: [1],
    onnx.defs.OpSchema.AttrType.FLOATS: [1.0],
}

# When a constraint is not the one under test, bind it to the first of these the schema allows.
_PREFERRED = ("tensor(int64)", "tensor(bool)", "tensor(float)", "tensor(int32)")


def default_binding(op_schema: onnx.defs.OpSchema, **fixed: str) -> schemas.Binding | None:
    """A binding with `fixed` constraints as given and the others at a common type the spec allows."""
    binding: schemas.Binding = {}
    for name, allowed in schemas.allowed_types(op_schema).items():
        if name in fixed:
            binding[name] = fixed[name]
            continue
        choice = next((t for t in _PREFERRED if t in allowed), None) or next(
            (t for t in sorted(allowed) if t.startswith("tensor(")), None
        )
        if choice is None:
            return None
        binding[name] = choice
    return binding


def single_node_model(op_type: str, opset: int, binding: Mapping[str, str], domain: str = "") -> onnx.ModelProto | None:
    """A model of one `op_type` node with the required inputs/outputs typed by `binding`; shapes unknown."""
    op_schema = schemas.schema(op_type, opset, domain)
    if op_schema is None:
        return None

    def value_type(formal: onnx.defs.OpSchema.FormalParameter) -> onnx.TypeProto | None:
        type_str = binding.get(formal.type_str, formal.type_str)
        dtype = schemas.tensor_dtype(type_str)
        if dtype is None:
            return None
        return onnx.helper.make_tensor_type_proto(int(dtype), None)

    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    inputs, input_names = [], []
    for index, formal in enumerate(op_schema.inputs):
        if formal.option == optional:
            input_names.append("")
            continue
        type_proto = value_type(formal)
        if type_proto is None:
            return None
        name = f"in{index}"
        inputs.append(onnx.helper.make_value_info(name, type_proto))
        input_names.append(name)
    while input_names and not input_names[-1]:
        input_names.pop()
    outputs = []
    for index, formal in enumerate(op_schema.outputs):
        if formal.option == optional and index > 0:
            break
        type_proto = value_type(formal)
        if type_proto is None:
            return None
        outputs.append(onnx.helper.make_value_info(f"out{index}", type_proto))

    attributes = {}
    for name, attribute in op_schema.attributes.items():
        if attribute.required:
            if attribute.type not in _ATTRIBUTE_DEFAULTS:
                return None
            attributes[name] = _ATTRIBUTE_DEFAULTS[attribute.type]
    if not domain and op_type in ("Cast", "ConstantOfShape"):  # an attribute gives the output's type
        dtype = schemas.tensor_dtype(binding.get("T2", ""))
        if dtype is None:
            return None
        if op_type == "Cast":
            attributes["to"] = int(dtype)
        else:
            attributes["value"] = onnx.helper.make_tensor("value", int(dtype), [1], [0])

    node = onnx.helper.make_node(op_type, input_names, [o.name for o in outputs], domain=domain or None, **attributes)
    graph = onnx.helper.make_graph([node], f"probe_{op_type}", inputs, outputs)
    imports = [onnx.helper.make_opsetid("", opset)]
    if domain:
        imports.append(onnx.helper.make_opsetid(domain, opset))
    ir_version = onnx.helper.find_min_ir_version_for(imports, ignore_unknown=True)
    return onnx.helper.make_model(graph, opset_imports=imports, ir_version=max(ir_version, 8))


def node_model(
    node: ir.Node,
    opset_imports: Mapping[str, int],
    input_types: Sequence[ir.TypeProtocol | None],
    output_types: Sequence[ir.TypeProtocol | None],
) -> onnx.ModelProto | None:
    """A model of `node` alone, its values typed as given; absent inputs stay absent, attributes stay.

    How ONNX Runtime expands an operator's function body can depend on which optional inputs are
    present and on attributes, so this is the faithful question to ask about one node.
    """
    if any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values()):
        return None
    proto = ir.serde.serialize_node(node)
    del proto.input[:], proto.output[:]
    inputs, outputs = [], []
    for index, (value, type_) in enumerate(zip(node.inputs, input_types)):
        if value is None:
            proto.input.append("")
            continue
        if type_ is None:
            return None
        proto.input.append(f"in{index}")
        inputs.append(onnx.helper.make_value_info(f"in{index}", ir.serde.serialize_type(type_)))
    for index, type_ in enumerate(output_types):
        if type_ is None:
            return None
        proto.output.append(f"out{index}")
        outputs.append(onnx.helper.make_value_info(f"out{index}", ir.serde.serialize_type(type_)))
    proto.name = "probe"
    graph = onnx.helper.make_graph([proto], f"probe_{node.op_type}", inputs, outputs)
    imports = [onnx.helper.make_opsetid(domain, version) for domain, version in opset_imports.items()]
    ir_version = onnx.helper.find_min_ir_version_for(imports, ignore_unknown=True)
    return onnx.helper.make_model(graph, opset_imports=imports, ir_version=max(ir_version, 8))


def session_outcome(model: onnx.ModelProto | None) -> Outcome:
    """Create an ONNX Runtime CPU session for `model`: ok, no kernel, or an invalid model."""
    if model is None:
        return "unbuildable"
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    # Let ONNX Runtime apply its own float16 handling, but keep its fusions out of the question.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as error:
        text = str(error)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
            return "no-kernel"
        return "invalid"
    return "ok"


def probe(op_type: str, opset: int, binding: Mapping[str, str], domain: str = "") -> Outcome:
    return session_outcome(single_node_model(op_type, opset, binding, domain))


# Ops whose kernels ONNX Runtime registers for a type but refuse, only when they run, with a reduction
# attribute (e.g. ScatterND on float16 with reduction='add'): input shapes of a one-element run.
REDUCTION_OPS = {"ScatterElements": ([1], [1], [1]), "ScatterND": ([1], [1, 1], [1])}


def reduction_outcome(op_type: str, opset: int, binding: Mapping[str, str], reduction: str) -> Outcome:
    """Run a one-element `op_type` node (data, indices, updates) with `reduction` in a CPU session."""
    import numpy as np
    import onnxruntime

    op_schema = schemas.schema(op_type, opset, "")
    if op_type not in REDUCTION_OPS or op_schema is None:
        return "unbuildable"
    inputs, feeds = [], {}
    for index, (formal, shape) in enumerate(zip(op_schema.inputs, REDUCTION_OPS[op_type])):
        dtype = schemas.tensor_dtype(binding.get(formal.type_str, formal.type_str))
        if dtype is None:
            return "unbuildable"
        name = f"in{index}"
        inputs.append(onnx.helper.make_tensor_value_info(name, int(dtype), shape))
        feeds[name] = np.zeros(shape, dtype=dtype.numpy())
    node = onnx.helper.make_node(op_type, [i.name for i in inputs], ["out"], reduction=reduction)
    output = onnx.helper.make_tensor_value_info("out", inputs[0].type.tensor_type.elem_type, [1])
    graph = onnx.helper.make_graph([node], f"probe_{op_type}", inputs, [output])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=8)
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    try:
        session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:
        return session_outcome(model)  # classifies the failure
    try:
        session.run(None, feeds)
    except Exception:  # "<type> data type is not supported with <op> when reduction is '<r>'"
        return "no-kernel"
    return "ok"
