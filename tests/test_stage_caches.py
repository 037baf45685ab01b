"""What emission keeps to go faster decides as if nothing were kept.

The dispatcher reuses an earlier node's binding for a node alike in all that binding reads, and the recorder
reuses ONNX's inferred types for a node alike in all that inference reads (a model's repeated layers): each
answer must be the one computed afresh.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
import torch
from onnxscript import FLOAT, INT64
from onnxscript import opset18 as op

from fx2onnx import Registry
from fx2onnx._dispatch import Dispatcher
from fx2onnx._emit.recorder import infer_node_types


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
