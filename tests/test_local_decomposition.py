"""Capture decomposes locally: only the nodes the registry cannot lower are replaced by their decompositions (each
traced on its own inputs' fake values and spliced in), in-place writes into fresh tensors become functional ops,
and the rest of torch.export's graph is left as captured. ``run_decompositions`` retraces the whole program only
where correctness needs it, and the report says which strategy was used and why.

The registries here lack ``aten::diff`` (which fx2onnx lowers) so that the graph holds an op to decompose; an
``aten::to.dtype`` node shows that the rest was not retraced (full decomposition turns it into ``_to_copy``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from onnxscript import FLOAT
from onnxscript import opset18 as op

from fx2onnx import Registry
from fx2onnx._capture import CapturedGraph, LazyDecompositionTable, TorchExportExtractor

from conftest import Call, assert_exports_and_matches


def registry_without(*targets: str) -> Registry:
    registry = Registry.default()
    for target in targets:
        registry.unregister(target)
    return registry


class DiffAndNorm(torch.nn.Module):
    """transformers' packed-sequence check (diff with a prepended column), around ops ONNX has whole."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        steps = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1).to(x.dtype)
        return torch.nn.functional.gelu(self.norm(self.linear(x))) * steps.unsqueeze(-1)


def call_nodes(graph: torch.fx.Graph) -> list[tuple[str, str]]:
    return [(node.name, str(node.target)) for node in graph.nodes if node.op == "call_function"]


def capture(
    model: torch.nn.Module, args: tuple[Any, ...], registry: Registry, dynamic_shapes: Any = None
) -> CapturedGraph:
    extractor = TorchExportExtractor(registry=registry)
    return extractor.capture(model, args, {}, dynamic_shapes, LazyDecompositionTable(registry))


def test_only_the_node_the_registry_lacks_is_decomposed() -> None:
    registry = registry_without("aten::diff")
    model, args = DiffAndNorm().eval(), (torch.randn(3, 5, 4), torch.arange(15).reshape(3, 5))
    before = call_nodes(torch.export.export(model, args, strict=False).graph)
    assert ("diff", "aten.diff.default") in before and ("to", "aten.to.dtype") in before
    captured = capture(model, args, registry)
    record = captured.decomposition
    assert (record.strategy, record.nodes, record.functionalized) == ("local", [("diff", "aten::diff")], [])
    assert captured.decomposed == ["aten::diff"]
    after = call_nodes(captured.graph)
    # every other node of torch.export's graph is still there, same name and op, in the same order
    assert [n for n in after if n in before] == [n for n in before if n[0] != "diff"]
    assert "aten.diff.default" not in {target for _, target in after}
    assert ("to", "aten.to.dtype") in after  # full decomposition makes it _to_copy


def test_local_decomposition_matches_eager_with_dynamic_sizes() -> None:
    registry = registry_without("aten::diff")
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    positions = torch.tensor([[0, 1, 2, 0, 1], [4, 5, 6, 7, 8], [0, 0, 1, 1, 2]])
    other = torch.randint(-(2**62), 2**62, (2, 7))  # int64 differences that wrap, as eager's do
    program = assert_exports_and_matches(
        DiffAndNorm(),
        (torch.randn(3, 5, 4), positions),
        dynamic_shapes=({0: batch, 1: length}, {0: batch, 1: length}),
        registry=registry,
        run_with=[((torch.randn(2, 7, 4), other), {})],
    )
    report = program.report
    assert report.decomposition.strategy == "local"
    assert report.decomposition.nodes == [("diff", "aten::diff")]
    assert report.capture_seconds["decomposition"] > 0.0
    markdown = report.to_markdown()
    assert "Decomposition strategy: local; decomposed `diff` (aten::diff)" in markdown
    sarif = json.loads(report.to_sarif_json())
    properties = sarif["runs"][0]["properties"]["decomposition"]
    assert properties["strategy"] == "local" and properties["nodes"] == [{"node": "diff", "overload": "aten::diff"}]
    # symbolic sizes survived: the ONNX inputs keep their dims' names
    assert [str(d) for d in program.model.graph.inputs[1].shape] == ["batch", "length"]


class WritesIntoFreshTensor(torch.nn.Module):
    """T5's relative position buckets: `buckets += torch.where(...)` into a tensor computed just before."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        buckets = (x > 0).long() * 8
        before = buckets * 1  # read before the write: keeps the old value
        buckets += torch.where(x.abs() < 2, x.abs().long(), 7)
        buckets.clamp_(max=10)
        return buckets.view(-1), before


def test_in_place_writes_into_fresh_tensors_become_functional() -> None:
    model, x = WritesIntoFreshTensor(), torch.tensor([[-3.0, -1.0, 0.0], [0.5, 1.5, 9.0]])
    program = assert_exports_and_matches(model, (x,))
    record = program.report.decomposition
    assert record.strategy == "local"
    assert [target for _, target in record.functionalized] == ["aten::add_.Tensor", "aten::clamp_"]
    assert record.nodes == []


class WritesThroughAView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        view = y.view(-1)  # taken before the write: sees it
        y.add_(1)
        return view


def test_a_write_seen_through_a_view_takes_full_decomposition() -> None:
    program = assert_exports_and_matches(WritesThroughAView(), (torch.randn(2, 3),))
    record = program.report.decomposition
    assert record.strategy == "full"
    assert "writes into `mul`, of which `view` took a view before" in record.reason


class InPlaceDropoutHead(torch.nn.Module):
    """torchvision's classifier heads (EfficientNet, MobileNetV3): pooled, flattened (a view), in-place dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.classifier = torch.nn.Sequential(torch.nn.Dropout(0.2, inplace=True), torch.nn.Linear(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(x), 1))


def test_in_place_dropout_in_eval_mode_is_dropped_without_full_decomposition() -> None:
    """With train=False it writes nothing: that the tensor it names is a view of another changes nothing."""
    program = assert_exports_and_matches(InPlaceDropoutHead(), (torch.randn(2, 3, 5, 5),))
    record = program.report.decomposition
    assert record.strategy == "local", record.describe()
    assert [target for _, target in record.functionalized] == ["aten::dropout_"]
    assert record.nodes == []


class CountsCalls(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return torch.diff(x, prepend=x[:1])


def test_mutated_buffers_take_full_decomposition() -> None:
    program = assert_exports_and_matches(CountsCalls(), (torch.randn(5),), registry=registry_without("aten::diff"))
    record = program.report.decomposition
    assert record.strategy == "full" and "writes into `b_calls`" in record.reason
    assert "aten::diff" in program.report.decomposed


def test_registry_lowering_everything_decomposes_nothing() -> None:
    program = assert_exports_and_matches(DiffAndNorm(), (torch.randn(3, 5, 4), torch.arange(15).reshape(3, 5)))
    assert program.report.decomposition.strategy == "none"
    assert program.report.capture_seconds["decomposition"] == 0.0


class DiffInBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(
            x.sum() > 0, lambda x: torch.diff(x, prepend=x[:1]), lambda x: torch.diff(x, append=x[-1:]) * 2, (x,)
        )


def test_nodes_inside_branches_are_decomposed_locally() -> None:
    x = torch.randn(6)
    program = assert_exports_and_matches(
        DiffInBranch(), (x,), registry=registry_without("aten::diff"), run_with=[((x.abs(),), {}), ((-x.abs(),), {})]
    )
    record = program.report.decomposition
    assert record.strategy == "local"
    assert sorted(name.split(".")[0] for name, _ in record.nodes) == ["false_graph_0", "true_graph_0"]


@pytest.mark.parametrize("n", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool])
def test_diff_lowering(n: int, dtype: torch.dtype) -> None:
    """fx2onnx's own `aten::diff`: n steps, prepend and append, integers wrapping and bools, as eager."""
    if dtype == torch.bool:
        x = torch.tensor([[True, False, False, True, True], [False, False, True, False, True]])
    elif dtype.is_floating_point:
        info = torch.finfo(dtype)
        x = torch.tensor([[info.max, -info.max, 0.0, info.tiny, float("inf")], [1.0, -2.5, 3.0, float("nan"), 0.5]])
        x = x.to(dtype)
    else:
        info = torch.iinfo(dtype)
        x = torch.tensor([[info.max, info.min, 0, 1, info.max], [3, 1, 4, 1, 5]], dtype=dtype)

    def diffs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.diff(x, n=n), torch.diff(x, n=n, dim=0, prepend=x[:1].flip(1), append=x[-1:])

    program = assert_exports_and_matches(Call(diffs), (x,))
    assert program.report.decomposition.strategy == "none"


@pytest.mark.parametrize(
    "convert",
    [
        lambda x, y: x.to(y.device),  # aten::to.dtype_layout
        lambda x, y: x.to(device=y.device, dtype=torch.float16),  # aten::to.dtype_layout with a dtype
        lambda x, y: x.to(y.device, torch.int32),  # aten::to.device
        lambda x, y: x.to(y),  # aten::to.other
        lambda x, y: torch.min(x, y),  # aten::min.other
        lambda x, y: torch.max(x, y),  # aten::max.other
    ],
    ids=["to.dtype_layout", "to.dtype_layout-dtype", "to.device", "to.other", "min.other", "max.other"],
)
def test_lowerings_real_models_need(convert: Callable[..., torch.Tensor]) -> None:
    x = torch.tensor([-3.5, 0.0, 2.75, float("nan"), 65504.0, -1e30])
    y = torch.tensor([1.0, -0.0, 3.0, 1.0, float("inf"), -float("inf")], dtype=torch.float64)
    program = assert_exports_and_matches(Call(convert), (x, y))
    assert program.report.decomposition.strategy == "none", program.report.decomposition.describe()


class RepeatBySize(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.repeat(y.shape[0], 2) + 1


def test_a_symbolic_size_argument_reaches_the_decomposition() -> None:
    """repeat's counts hold a size of another input: the decomposition is traced on that SymInt, not its value."""
    dims = ({0: torch.export.Dim("rows")}, {0: torch.export.Dim("times")})
    program = assert_exports_and_matches(
        RepeatBySize(),
        (torch.randn(2, 3), torch.randn(4)),
        dynamic_shapes=dims,
        registry=registry_without("aten::repeat"),
        run_with=[((torch.randn(3, 3), torch.randn(5)), {})],
    )
    assert program.report.decomposition.nodes == [("repeat", "aten::repeat")]


# --- an op the registry has, called without an argument its implementation requires -------------------------------
@torch.library.custom_op("fx2onnx_binding_test::weighted_twice", mutates_args=())
def weighted_twice(x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    return x * 2 if weight is None else x * 2 * weight


@weighted_twice.register_fake
def _(x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    return torch.empty_like(x)


def weighted_twice_requiring_weight(x: FLOAT, weight: FLOAT) -> FLOAT:
    """An implementation that takes `weight` only (as torchlib's nll_loss_forward did)."""
    return op.Mul(op.Add(x, x), weight)


class WeightedTwiceWithAndWithoutWeight(torch.nn.Module):
    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return weighted_twice(x, weight), weighted_twice(x - 1)


@pytest.fixture
def weighted_twice_decomposes() -> Any:
    """torch's decomposition table holds one for the op while the test runs."""
    from torch._decomp import decomposition_table

    target = torch.ops.fx2onnx_binding_test.weighted_twice.default
    decomposition_table[target] = lambda x, weight=None: x * 2 if weight is None else x * 2 * weight
    yield
    del decomposition_table[target]


def test_a_node_no_implementation_binds_is_decomposed_the_others_kept(weighted_twice_decomposes: None) -> None:
    """The registry lowers the op, but its one implementation requires `weight`: the call without it is decomposed
    at capture (dispatch would refuse it), the call with it is lowered by the implementation."""
    target = torch.ops.fx2onnx_binding_test.weighted_twice.default
    x = torch.tensor([[-3.0, 0.5, 1e30], [-1e-30, 2.0, -7.25]])
    weight = torch.tensor([[2.0, -1.0, 0.5], [4.0, 0.0, -3.0]])
    program = assert_exports_and_matches(
        WeightedTwiceWithAndWithoutWeight(),
        (x, weight),
        custom_translation_table={target: weighted_twice_requiring_weight},
    )
    record = program.report.decomposition
    assert record.strategy == "local"
    assert [overload for _, overload in record.nodes] == ["fx2onnx_binding_test::weighted_twice"]
    lowered = [d for d in program.report.decisions if d.target == "fx2onnx_binding_test::weighted_twice"]
    assert len(lowered) == 1 and lowered[0].chosen is not None
