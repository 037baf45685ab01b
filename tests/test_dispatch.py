"""The dispatcher on small registries: dtype variants, shared implementations, optional arguments."""

from __future__ import annotations

import onnx_ir as ir
import pytest
import torch
from onnxscript import DOUBLE, FLOAT, INT64
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

import fx2onnx
from fx2onnx import Registry
from fx2onnx._dispatch import Dispatcher

from conftest import assert_exports_and_matches as check


def add_float(self: FLOAT, other: FLOAT, alpha: float = 1.0) -> FLOAT:
    return op.Add(self, op.Mul(other, alpha))


def add_int64(self: INT64, other: INT64, alpha: int = 1) -> INT64:
    return op.Add(self, op.Mul(other, alpha))


def graph_node(model: torch.nn.Module, args: tuple, target: str) -> torch.fx.Node:
    program = torch.export.export(model, args)
    return next(n for n in program.graph.nodes if n.op == "call_function" and n.target.name() == target)


class Add(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def dtype_variant_registry() -> Registry:
    registry = Registry()
    registry.register("aten::add.Tensor", add_int64)
    registry.register("aten::add.Tensor", add_float)  # newest first: tried before add_int64
    return registry


@pytest.mark.parametrize(
    ("dtype", "chosen", "kind", "cast_to"),
    [
        (torch.float32, "add_float", "perfect", None),
        (torch.int64, "add_int64", "perfect", None),
        (torch.int32, "add_int64", "cast", ir.DataType.INT64),  # lossless int widening beats lossy int32->f32
        (torch.float16, "add_float", "cast", ir.DataType.FLOAT),  # float widening
        (torch.int16, "add_int64", "cast", ir.DataType.INT64),  # int->int widening keeps integer semantics
        (torch.bool, "add_int64", "cast", ir.DataType.INT64),  # bool->number is lossless; int before float
    ],
)
def test_dtype_variants_of_one_op(dtype: torch.dtype, chosen: str, kind: str, cast_to: ir.DataType | None) -> None:
    node = graph_node(Add(), (torch.ones(2, dtype=dtype), torch.ones(2, dtype=dtype)), "aten::add.Tensor")
    decision = Dispatcher(dtype_variant_registry(), 18).dispatch(node)
    assert decision.chosen is not None
    assert decision.chosen.implementation.name.endswith(chosen)
    assert decision.chosen.kind == kind
    assert set(decision.chosen.casts.values()) == ({cast_to} if cast_to else set())
    assert len(decision.candidates) == 2  # every candidate is recorded, with its reason
    loser = next(c for c in decision.candidates if c is not decision.chosen)
    assert loser.reason


def test_dtype_variants_export_and_run() -> None:
    registry = Registry.default()
    registry.register("aten::add.Tensor", add_int64)
    registry.register("aten::add.Tensor", add_float)
    # A perfect match (even torchlib's) beats a user implementation that needs Casts.
    for dtype, source in ((torch.float32, "user"), (torch.int64, "user"), (torch.int32, "torchlib")):
        a, b = torch.arange(6, dtype=dtype).reshape(2, 3), torch.full((2, 3), 3, dtype=dtype)
        program = check(Add(), (a, b), registry=registry)
        decision = next(d for d in program.report.decisions if d.target == "aten::add.Tensor")
        assert decision.chosen.implementation.source == source


def test_first_registered_perfect_match_wins() -> None:
    registry = Registry()
    first = registry.register("aten::add.Tensor", add_float)
    registry.register("aten::add.Tensor", add_float)
    decision = Dispatcher(registry, 18).dispatch(graph_node(Add(), (torch.ones(2), torch.ones(2)), "aten::add.Tensor"))
    assert decision.chosen is not None and decision.chosen.kind == "perfect"
    assert decision.chosen.implementation is not first  # the newest user registration is tried first
    assert [c.kind for c in decision.candidates] == ["perfect", "perfect"]


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.aten.mul.Scalar(x, 3.0), torch.ops.aten.mul.Tensor(x, x)


def test_two_overloads_served_by_one_implementation() -> None:
    calls: list[str] = []

    def mul_any(self: FLOAT, other: FLOAT) -> FLOAT:
        calls.append("mul")
        return op.Mul(self, other)

    registry = Registry.default()
    registry.register("aten::mul.Scalar", mul_any)
    registry.register("aten::mul.Tensor", mul_any)
    program = check(Scale(), (torch.randn(2, 3),), registry=registry)
    chosen = {d.target: d.chosen.implementation for d in program.report.decisions}
    assert chosen["aten::mul.Scalar"].function is chosen["aten::mul.Tensor"].function
    assert chosen["aten::mul.Scalar"].source == "user"
    assert len(calls) == 2
    # mul.Scalar was registered, so capture did not decompose it into mul.Tensor.
    assert "aten::mul.Scalar" not in program.report.decomposed


class ArgMax(torch.nn.Module):
    def __init__(self, dim: int | None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x) if self.dim is None else torch.argmax(x, self.dim)


def argmax_flat(self: FLOAT, keepdim: bool = False) -> INT64:
    return op.ArgMax(op.Reshape(self, op.Constant(value_ints=[-1])), axis=0, keepdims=0)


def argmax_dim(self: FLOAT, dim: int, keepdim: bool = False) -> INT64:
    return op.ArgMax(self, axis=dim, keepdims=int(keepdim))


@pytest.mark.parametrize(
    ("dim", "chosen", "rejection"), [(None, "argmax_flat", "requires `dim`"), (1, "argmax_dim", "does not take `dim`")]
)
def test_optional_dim_selects_the_implementation(dim: int | None, chosen: str, rejection: str) -> None:
    registry = Registry.default()
    registry.register("aten::argmax", argmax_dim)
    registry.register("aten::argmax", argmax_flat)
    program = check(ArgMax(dim), (torch.randn(3, 4),), registry=registry)
    decision = next(d for d in program.report.decisions if d.target == "aten::argmax")
    assert decision.chosen.implementation.name.endswith(chosen)
    assert any(rejection in c.reason for c in decision.candidates if c.kind == "rejected")


class Sum(torch.nn.Module):
    def __init__(self, dtype: torch.dtype | None) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(1) if self.dtype is None else x.sum(1, dtype=self.dtype)


def sum_plain(self: FLOAT, dim: list[int], keepdim: bool = False) -> FLOAT:
    return op.ReduceSum(self, op.Constant(value_ints=dim), keepdims=int(keepdim))


def sum_with_dtype(self: TFloat, dim: list[int], keepdim: bool = False, *, dtype: int) -> DOUBLE:
    return op.ReduceSum(op.Cast(self, to=dtype), op.Constant(value_ints=dim), keepdims=int(keepdim))


@pytest.mark.parametrize(("dtype", "chosen"), [(None, "sum_plain"), (torch.float64, "sum_with_dtype")])
def test_dtype_given_or_omitted(dtype: torch.dtype | None, chosen: str) -> None:
    registry = Registry.default()
    registry.register("aten::sum.dim_IntList", sum_plain)
    registry.register("aten::sum.dim_IntList", sum_with_dtype)
    program = check(Sum(dtype), (torch.randn(3, 4),), registry=registry)
    decision = next(d for d in program.report.decisions if d.target == "aten::sum.dim_IntList")
    assert decision.chosen.implementation.name.endswith(chosen)
    assert decision.chosen.kind == "perfect"


def test_opset_range_is_respected() -> None:
    registry = Registry()
    registry.register("aten::add.Tensor", add_float, opset=(19, None))
    node = graph_node(Add(), (torch.ones(2), torch.ones(2)), "aten::add.Tensor")
    with pytest.raises(fx2onnx.UnsupportedOperatorError, match="valid for opsets 19"):
        Dispatcher(registry, 18).dispatch(node)


def test_decisions_are_deterministic() -> None:
    node = graph_node(Add(), (torch.ones(2, dtype=torch.int16), torch.ones(2, dtype=torch.int16)), "aten::add.Tensor")
    explanations = {Dispatcher(Registry.default(), 18).dispatch(node).explain() for _ in range(3)}
    assert len(explanations) == 1
