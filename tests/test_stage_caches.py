"""What emission keeps to go faster decides as if nothing were kept.

The dispatcher reuses an earlier node's binding for a node alike in all that binding reads, and the recorder
reuses ONNX's inferred types for a node alike in all that inference reads (a model's repeated layers): each
answer must be the one computed afresh.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
import torch
from onnxscript import FLOAT, INT64
from onnxscript import opset18 as op

from fx2onnx import Registry
from fx2onnx._dispatch import Dispatcher, node_arguments
from fx2onnx._emit.recorder import GraphRecorder, infer_node_types
from fx2onnx._passes.node_builder import fake_mode_of, first_fake_mode
from fx2onnx._records import qualified_name, schema_arguments, schema_facts


class Alike(torch.nn.Module):
    """Nodes of one target alike but for their arguments' dtypes, constants or which node they read."""

    def forward(self, x: torch.Tensor, i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x + 1
        b = x + 1.0
        c = a + b
        d = i + 1
        e = i + True
        f = torch.add(x, b, alpha=2)
        g = torch.add(x, c, alpha=2)
        k = torch.add(i, d, alpha=3)
        m = h + h
        n = x.sum(dim=0, dtype=torch.float64)
        p = x.sum(dim=0)
        q = x.sum(dim=1, keepdim=True)
        r = torch.where(x > 0, x, -0.0)
        s = torch.where(x > 0, x, 0.0)
        return c, e, f, g, k, m, n, p, q, r, s


def describe(decision: object) -> tuple[str, dict[str, str], dict[str, object]]:
    chosen = decision.chosen  # type: ignore[attr-defined]
    arguments = {name: getattr(value, "name", value) for name, value in chosen.arguments.items()}
    return decision.explain(), dict(chosen.casts), arguments  # type: ignore[attr-defined]


def add_float(self: FLOAT, other: FLOAT) -> FLOAT:
    return op.Add(self, other)


def add_int64(self: INT64, other: INT64, alpha: int = 1) -> INT64:
    return op.Add(self, op.Mul(other, alpha))


def add_nothing(self: FLOAT) -> FLOAT:
    return op.Identity(self)


class Adds(torch.nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 2
        return x + x, i + i, h + h, x + y, torch.add(i, i, alpha=2), i + i


def dtype_variants() -> Registry:
    """add.Tensor by dtype: float32 (no alpha) and int64 (alpha); float16 is cast; one that takes no `other`
    (its rejection names the node given as `other`)."""
    registry = Registry()
    registry.register("aten::add.Tensor", add_int64)
    registry.register("aten::add.Tensor", add_float)
    registry.register("aten::add.Tensor", add_nothing)
    registry.register("aten::mul.Tensor", add_float)
    return registry


@pytest.mark.parametrize(("model", "registry"), [(Alike, Registry.default), (Adds, dtype_variants)])
def test_a_shared_dispatcher_decides_each_node_as_a_fresh_one(model: type, registry: object) -> None:
    args = (torch.randn(3, 4), torch.arange(12).reshape(3, 4), torch.randn(3, 4).to(torch.float16))
    graph = torch.export.export(model(), args).graph
    nodes = [node for node in graph.nodes if node.op == "call_function"]
    registry = registry()
    shared = Dispatcher(registry, 18)
    kept = [describe(shared.dispatch(node)) for node in nodes]
    fresh = [describe(Dispatcher(registry, 18).dispatch(node)) for node in nodes]
    assert len(shared._bindings) < len(nodes)  # some bindings were reused
    assert kept == fresh


def _node(op_type: str, inputs: list[ir.Value], **attributes: object) -> ir.Node:
    node = ir.Node("", op_type, inputs, [ir.convenience.convert_attribute(k, v) for k, v in attributes.items()])
    for index, output in enumerate(node.outputs):
        output.name = f"{op_type}_{id(node)}_{index}"
    return node


def _input(name: str, dtype: ir.DataType, shape: list[int | str | None]) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))


def _constant(name: str, array: np.ndarray) -> ir.Value:
    tensor = ir.Tensor(array)
    return ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=ir.Shape(tensor.shape), const_value=tensor)


def _alike_nodes() -> list[ir.Node]:
    x = _input("x", ir.DataType.FLOAT, [2, 6])
    y = _input("y", ir.DataType.FLOAT, ["batch", 6])
    z = _input("z", ir.DataType.DOUBLE, [2, 6])
    return [
        _node("Reshape", [x, _constant("s1", np.array([3, 4]))]),
        _node("Reshape", [x, _constant("s2", np.array([4, 3]))]),  # alike but for a small constant's value
        _node("Reshape", [x, _constant("s3", np.array([3, 4]))]),
        _node("Reshape", [z, _constant("s4", np.array([3, 4]))]),  # another dtype
        _node("Transpose", [x], perm=[1, 0]),
        _node("Transpose", [y], perm=[1, 0]),  # a symbolic dim
        _node("Transpose", [x], perm=[0, 1]),  # another attribute
        _node("Unsqueeze", [x, _constant("a1", np.array([0]))]),
        _node("Unsqueeze", [x, _constant("a2", np.array([-1]))]),
        _node("Gather", [y, _constant("g1", np.array(1))], axis=1),
        _node("Gather", [y, _constant("g2", np.array(1))], axis=0),
        _node("CumSum", [x, _constant("c1", np.array(0))]),
        _node("Expand", [x, _constant("e1", np.array([3, 2, 6]))]),
        _node("Expand", [x, _constant("e2", np.array([5, 2, 6]))]),
    ]


def _types(node: ir.Node) -> list[tuple[object, object]]:
    return [(output.type, None if output.shape is None else tuple(output.shape)) for output in node.outputs]


def test_kept_inferred_types_are_those_inferred_afresh() -> None:
    opsets = {"": 18}
    cache: dict = {}
    kept, fresh = _alike_nodes(), _alike_nodes()
    for node in kept:
        infer_node_types(node, opsets, cache)
    for node in fresh:
        infer_node_types(node, opsets)
    assert len(cache) < len(kept)  # some answers were reused
    assert [_types(node) for node in kept] == [_types(node) for node in fresh]
    assert _types(kept[1]) == [(ir.TensorType(ir.DataType.FLOAT), (4, 3))]


# --- traces the recorder replays ------------------------------------------------------------------------------
def transpose_last(x: FLOAT) -> FLOAT:
    """Reads the rank and a static last dim (a scale), and a Python float constant (shared between calls)."""
    rank = len(x.shape)
    last = x.shape[-1]
    scaled = op.Mul(x, 1.0 / last if isinstance(last, int) else 0.5)
    return op.Transpose(scaled, perm=[*range(rank - 2), rank - 1, rank - 2])


def add_like(x: FLOAT, y: FLOAT, alpha: float = 1.0) -> FLOAT:
    """The dtype picks the constant's dtype; the two inputs may be one value (which the function sees); -0.0 and
    True are not 0.0 and 1."""
    scale = op.Constant(value=ir.tensor(alpha, dtype=x.dtype))
    return op.Mul(x, op.Add(scale, scale)) if x is y else op.Add(x, op.Mul(y, scale))


def reshaped(x: FLOAT, shape: INT64) -> tuple[FLOAT, FLOAT]:
    """The output's shape comes from ONNX's inference, which reads the constant `shape`; a tuple result that
    returns an input as it came."""
    return op.Reshape(x, shape), x


def folds_a_constant(x: FLOAT) -> FLOAT:
    """Reads what only the value's producer tells (not replayable)."""
    producer = x.producer()
    return op.Identity(x) if producer is not None and producer.op_type == "Constant" else op.Neg(x)


def reads_a_large_constant(x: FLOAT) -> FLOAT:
    """Reads a constant's value the recorder does not key on (not replayable)."""
    array = x.const_value.numpy() if x.const_value is not None else np.zeros(1)
    return op.Add(x, float(array.reshape(-1)[0]))


def _trace_calls(recorder: object) -> None:
    """Calls alike but in one thing each, made through the recorder's trace cache."""
    graph = recorder.graph  # type: ignore[attr-defined]

    def value(name: str, dtype: ir.DataType, shape: list[int | str]) -> ir.Value:
        made = ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(shape))
        graph.inputs.append(made)
        return made

    x = value("x", ir.DataType.FLOAT, [2, 3, 4])
    x2 = value("x2", ir.DataType.FLOAT, [2, 3, 4])
    d = value("d", ir.DataType.DOUBLE, [2, 3, 4])
    b = value("b", ir.DataType.FLOAT, ["batch", 3, 4])
    n = value("n", ir.DataType.FLOAT, ["n", 3, 4])
    w = value("w", ir.DataType.FLOAT, [3, 5])
    m = value("m", ir.DataType.FLOAT, [2, 3, 4, 6])
    large = ir.Value(name="large", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([80]))
    large.const_value = ir.Tensor(np.full(80, 2.0, np.float32))
    large_too = ir.Value(name="large_too", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([80]))
    large_too.const_value = ir.Tensor(np.full(80, 3.0, np.float32))
    with recorder.recording({"pkg.test": "calls"}):  # type: ignore[attr-defined]
        shape_34 = recorder.constant(np.array([6, 4]))  # type: ignore[attr-defined]
        shape_43 = recorder.constant(np.array([4, 6]))  # type: ignore[attr-defined]
        calls: list[tuple[object, dict[str, object]]] = [
            (transpose_last, {"x": x}),
            (transpose_last, {"x": x2}),  # alike: replayed
            (transpose_last, {"x": w}),  # another rank and last dim
            (transpose_last, {"x": m}),
            (transpose_last, {"x": b}),  # a symbolic dim
            (transpose_last, {"x": n}),  # another symbolic dim's name
            (add_like, {"x": x, "y": x2, "alpha": 2.0}),
            (add_like, {"x": x, "y": x, "alpha": 2.0}),  # one value twice
            (add_like, {"x": x2, "y": x2, "alpha": 2.0}),
            (add_like, {"x": d, "y": d, "alpha": 2.0}),  # another dtype
            (add_like, {"x": x, "y": x2, "alpha": -0.0}),
            (add_like, {"x": x, "y": x2, "alpha": 0.0}),
            (add_like, {"x": x, "y": x2, "alpha": True}),
            (add_like, {"x": x, "y": x2, "alpha": 1}),
            (reshaped, {"x": x, "shape": shape_34}),
            (reshaped, {"x": x2, "shape": shape_43}),  # another constant value
            (reshaped, {"x": x2, "shape": shape_34}),
            (folds_a_constant, {"x": shape_34}),
            (folds_a_constant, {"x": x}),
            (reads_a_large_constant, {"x": large}),
            (reads_a_large_constant, {"x": large_too}),
        ]
        results = []
        for function, arguments in calls:
            result = recorder.call_traced(function, arguments, lambda f=function, a=arguments: f(**a))  # type: ignore[attr-defined]
            results.append(result)
        for index, result in enumerate(results):  # what each call returned, as graph outputs
            for item in result if isinstance(result, tuple) else (result,):
                copy = recorder.add_node("", "Identity", [item])[0]  # type: ignore[attr-defined]
                copy.name = f"result_{index}_{len(graph.outputs)}"
                graph.outputs.append(copy)


def _recorded_graph(replaying: bool) -> tuple[bytes, GraphRecorder]:
    graph = ir.Graph([], [], nodes=[], name="calls", opset_imports={"": 18})
    recorder = GraphRecorder(graph, {"": 18})
    if not replaying:
        recorder._traces = None
    _trace_calls(recorder)
    model = ir.Model(graph, ir_version=8)
    return ir.to_proto(model).SerializeToString(), recorder


def test_replayed_traces_add_what_fresh_traces_add() -> None:
    kept, recorder = _recorded_graph(replaying=True)
    fresh, _ = _recorded_graph(replaying=False)
    traces = recorder._traces
    assert traces is not None
    replayable = [key for key, trace in traces.items() if trace is not None]
    assert len(traces) < 21  # some calls were replayed
    assert {key[0] for key in traces if traces[key] is None} == {folds_a_constant, reads_a_large_constant}
    assert len(replayable) >= 10
    assert kept == fresh  # byte for byte: nodes, names, attributes, metadata, types and shapes


def test_a_model_exports_the_same_with_and_without_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    import fx2onnx
    from fx2onnx import examples

    model, args = examples.tiny_gpt()
    replayed = fx2onnx.export(model, args).model_proto.SerializeToString()
    monkeypatch.setattr(GraphRecorder, "call_traced", lambda self, function, arguments, call: call())
    traced = fx2onnx.export(model, args).model_proto.SerializeToString()
    assert replayed == traced


class _MaskedLayers(torch.nn.Module):
    """Each layer selects its scores under the same causal mask (a constant folded at emit, of more elements than a
    trace key holds the bytes of), as T5's attention layers: where.ScalarOther, masked_fill and where.self."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[-1])
        mask = positions[:, None] >= positions
        for _ in range(3):
            x = torch.where(mask, x * 2, torch.finfo(x.dtype).min).softmax(-1)
            x = x.masked_fill(~mask, -0.0) + torch.where(mask, x, -x)
        return x


def test_selections_under_a_shared_mask_are_replayed(check: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A where/masked_fill lowering reads its operands' producers and fill values (builders._selection_reads, its
    context_key), and the fold of the mask's negation reads the mask's bytes: the later layers replay the first's
    selections, and the model is the one fresh traces make."""
    replayed: list[str] = []
    replay = GraphRecorder._replay

    def counted(self: GraphRecorder, trace: Any, inputs: Any) -> Any:
        replayed.extend(node.op_type for node in trace.nodes)
        return replay(self, trace, inputs)

    monkeypatch.setattr(GraphRecorder, "_replay", counted)
    x = torch.randn(2, 12, 12)
    program = check(_MaskedLayers(), (x,))
    assert replayed.count("Where") >= 2 * 3  # the second and third layers' where.ScalarOther, masked_fill, where.self
    monkeypatch.setattr(GraphRecorder, "call_traced", lambda self, function, arguments, call: call())
    import fx2onnx

    assert fx2onnx.export(_MaskedLayers(), (x,)).model_proto.SerializeToString() == (
        program.model_proto.SerializeToString()
    )


def test_a_users_function_runs_for_each_node() -> None:
    """A registered function may keep state (here it counts its calls): it is never replayed."""
    import fx2onnx

    calls: list[str] = []

    def counted_relu(self: FLOAT) -> FLOAT:
        calls.append("relu")
        return op.Relu(self)

    class ThreeRelus(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(torch.relu(torch.relu(x) - 1) - 1)

    fx2onnx.export(
        ThreeRelus(), (torch.randn(2, 3),), custom_translation_table={torch.ops.aten.relu.default: counted_relu}
    )
    assert calls == ["relu"] * 3


# --- what is kept per op target: schema facts and registry keys ---------------------------------------------------
def _schema_targets() -> list[object]:
    """Targets whose schemas differ in each kept fact: arguments, defaults, keyword-only ones, results, mutation."""
    aten = torch.ops.aten
    return [
        aten.add.Tensor,
        aten.add.Scalar,
        aten.add_.Tensor,  # mutable
        aten.sum.dim_IntList,  # a default list, a keyword-only dtype
        aten.native_batch_norm.default,  # three results, `training`
        aten._assert_scalar.default,  # no result
        aten.var.correction,
        operator.getitem,  # no schema
        "aten::relu.default",
    ]


def _fresh_facts(target: object) -> object:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    arguments = tuple(
        (a.name, a.kwarg_only, a.has_default_value(), a.default_value if a.has_default_value() else None)
        for a in schema.arguments
    )
    return (arguments, len(schema.returns), schema.is_mutable)


def test_kept_schema_facts_are_each_targets_own() -> None:
    """Asked in turn (the cache filled by the first ones), each target gets the facts its schema gives afresh."""
    for _ in range(2):
        for target in _schema_targets():
            facts = schema_facts(target)
            assert (None if facts is None else tuple(facts)) == _fresh_facts(target), target
            assert schema_arguments(target) == (None if facts is None else facts.arguments)


def test_kept_registry_keys_are_each_targets_own() -> None:
    expected = {
        torch.ops.aten.add.Tensor: "aten::add.Tensor",
        torch.ops.aten.add.Scalar: "aten::add.Scalar",
        torch.ops.aten.add_.Tensor: "aten::add_.Tensor",
        operator.getitem: "_operator::getitem",
        "aten::relu.default": "aten::relu",
        torch.ops.higher_order.cond: "higher_order::cond",
    }
    for _ in range(2):
        for target, key in expected.items():
            assert qualified_name(target) == key
    with pytest.raises(TypeError, match="overload packet"):
        qualified_name(torch.ops.aten.add)
    with pytest.raises(TypeError, match="registry target"):
        qualified_name(3)
    with pytest.raises(TypeError, match="registry target"):
        qualified_name([1])  # unhashable: the same error


def test_a_default_list_argument_is_the_nodes_own() -> None:
    """A schema default that is a list is given to each node as a list of its own (a lowering may append to it)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    first = graph.call_function(torch.ops.aten.amax.default, (x,))
    second = graph.call_function(torch.ops.aten.amax.default, (x,))
    named_first = dict(node_arguments(first)[0])
    named_first["dim"].append(5)
    assert dict(node_arguments(second)[0])["dim"] == []


def test_the_fake_mode_found_is_the_one_torch_detects() -> None:
    program = torch.export.export(Alike(), (torch.randn(3, 4), torch.arange(12).reshape(3, 4), torch.randn(3, 4)))
    graph = program.graph
    expected = torch._guards.detect_fake_mode([node.meta.get("val") for node in graph.nodes])
    assert expected is not None
    assert fake_mode_of(graph) is expected
    assert first_fake_mode([None, 3, *(node.meta.get("val") for node in graph.nodes)]) is expected
    assert first_fake_mode([None, 3, torch.zeros(2)]) is None


def test_kept_promotion_slots_are_each_ops_own() -> None:
    """Type promotion's kinds of argument slots (tensor, scalar, other), kept per op, are each op's own."""
    from fx2onnx._passes import promotion

    expected = {
        torch.ops.aten.add.Tensor: ("tensor", "tensor", "scalar"),
        torch.ops.aten.add.Scalar: ("tensor", "scalar", "scalar"),
        torch.ops.aten.sum.dim_IntList: ("tensor", None, None, None),
        torch.ops.aten.where.ScalarOther: ("tensor", "tensor", "scalar"),
    }
    for _ in range(2):
        for op_overload, kinds in expected.items():
            assert promotion._slot_kinds(op_overload) == kinds


def _shaping_nodes() -> list[ir.Node]:
    """Constant, Transpose and Unsqueeze nodes whose types the recorder infers itself, without ONNX."""
    x = _input("x", ir.DataType.FLOAT, [2, "n", None, 5])
    h = _input("h", ir.DataType.BFLOAT16, [3])
    nodes = [
        ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.Tensor(np.zeros((2, 3), dtype=np.float16)))]),
        ir.Node("", "Constant", [], [ir.AttrTensor("value", ir.Tensor(np.array(7, dtype=np.int32)))]),
        ir.Node("", "Constant", [], [ir.AttrInt64("value_int", 3)]),
        ir.Node("", "Constant", [], [ir.AttrFloat32("value_float", -0.0)]),
        ir.Node("", "Constant", [], [ir.AttrInt64s("value_ints", [1, 2, 3])]),
        ir.Node("", "Constant", [], [ir.AttrFloat32s("value_floats", [])]),
        ir.Node("", "Transpose", [x]),
        ir.Node("", "Transpose", [x], [ir.AttrInt64s("perm", [0, 2, 3, 1])]),
        ir.Node("", "Transpose", [h], [ir.AttrInt64s("perm", [0])]),
    ]
    for axes in ([0], [-1], [1, -1], [4, 0], [2, 3]):
        nodes.append(ir.Node("", "Unsqueeze", [x, _constant(f"axes{len(nodes)}", np.array(axes, dtype=np.int64))]))
    nodes.append(ir.Node("", "Unsqueeze", [h, _constant("axis_scalar", np.array(-2, dtype=np.int64))]))
    for index, node in enumerate(nodes):
        node.outputs[0].name = f"output_{index}"
    return nodes


def test_types_inferred_without_onnx_are_onnxs() -> None:
    from fx2onnx._emit import recorder

    for node in _shaping_nodes():
        assert recorder._infer_simply(node), node
        ours = [(v.type, v.shape) for v in node.outputs]
        protos = recorder._infer_with_onnx(node, "", 18, {"": 18})
        assert protos is not None, node
        onnxs = []
        for proto in protos:
            inferred = recorder._InferredType.of(proto)
            onnxs.append((inferred.fresh_type(), inferred.fresh_shape()))
        assert ours == onnxs, node


class _Means(torch.nn.Module):
    """Two means alike in their arguments' types, not in what the lowering reads of its context: the mean of squares
    (never -0.0) is a plain ReduceMean, the other one's -0.0 becomes eager's +0.0."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (x * x).mean(-1), y.mean(-1), (y + 1).mean(-1)


def test_a_context_rule_is_replayed_only_for_a_context_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    import fx2onnx

    args = (torch.tensor([[-0.0, -0.0], [1.0, 2.0]]), torch.tensor([[-0.0, -0.0], [1.0, -3.0]]))
    program = fx2onnx.export(_Means(), args)
    squares, plain, shifted = program(*args)
    expected = _Means()(*args)
    for got, want in zip((squares, plain, shifted), expected):
        assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())
    replayed = program.model_proto.SerializeToString()
    monkeypatch.setattr(GraphRecorder, "call_traced", lambda self, function, arguments, call: call())
    assert fx2onnx.export(_Means(), args).model_proto.SerializeToString() == replayed
