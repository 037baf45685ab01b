"""Capture decomposes locally: only the nodes the registry cannot lower are replaced by their decompositions (each
traced on its own inputs' fake values and spliced in), in-place writes into fresh tensors become functional ops,
and the rest of torch.export's graph is left as captured. ``run_decompositions`` retraces the whole program only
where correctness needs it, and the report says which strategy was used and why.

The registries here lack ``aten::diff`` (which fx2onnx lowers) so that the graph holds an op to decompose; an
``aten::to.dtype`` node shows that the rest was not retraced (full decomposition turns it into ``_to_copy``).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from onnxscript import FLOAT
from onnxscript import opset18 as onnx_op

from fx2onnx import Registry
from fx2onnx._capture import CapturedGraph, LazyDecompositionTable, TorchExportExtractor

from conftest import Call, assert_exports_and_matches

_NIGHTLY = os.environ.get("FX2ONNX_NIGHTLY") == "1"


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


class InPlaceHardActivations(torch.nn.Module):
    """timm's MobileNetV3: ``nn.Hardswish(inplace=True)`` and a hardsigmoid gate, then a flatten of the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)
        self.norm = torch.nn.BatchNorm2d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.hardswish(self.norm(self.conv(x)), inplace=True)
        torch.nn.functional.hardsigmoid(y, inplace=True)
        return torch.flatten(y, 1)


def test_in_place_ops_functionalized_from_a_batch_of_one_keep_the_batch_dynamic() -> None:
    # their fake kernels, run again out of the capture's size-oblivious tracing, gave a static batch of 1: the
    # flatten's Reshape to [1, 48] then failed in ONNX Runtime at batch 3 (timm mobilenetv3_small_100, batch1)
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = assert_exports_and_matches(
        InPlaceHardActivations(),
        (torch.randn(1, 3, 4, 4) * 4,),
        dynamic_shapes=({0: batch},),
        run_with=[((torch.randn(3, 3, 4, 4) * 4,), {}), ((torch.randn(1, 3, 4, 4) * 4,), {})],
    )
    assert [target for _, target in program.report.decomposition.functionalized] == [
        "aten::hardswish_",
        "aten::hardsigmoid_",
    ]
    assert [str(d) for d in program.model.graph.outputs[0].shape] == ["batch", "48"]


class WritesThroughAView(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        view = y.view(-1)  # taken before the write: sees it
        y.add_(1)
        return view


def test_a_write_seen_through_a_view_taken_before_is_functionalized_locally() -> None:
    program = assert_exports_and_matches(WritesThroughAView(), (torch.randn(2, 3),))
    record = program.report.decomposition
    assert record.strategy == "local", record.describe()
    assert record.functionalized == [("add_", "aten::add_.Tensor")]


class ShiftedWindowMask(torch.nn.Module):
    """torchvision's Swin attention mask: a fresh tensor filled region by region through two slices, then read
    through views (shifted_window_attention)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        height, width = x.shape[-2:]
        mask = x.new_zeros((height, width))
        regions = ((0, -4), (-4, -2), (-2, None))
        count = 0
        for rows in regions:
            for columns in regions:
                mask[rows[0] : rows[1], columns[0] : columns[1]] = count
                count += 1
        windows = mask.view(height // 4, 4, width // 4, 4).permute(0, 2, 1, 3).reshape(-1, 16)
        return x + mask, (windows.unsqueeze(1) - windows.unsqueeze(2)).masked_fill(windows.unsqueeze(1) == 0, -100.0)


def test_writes_through_slices_become_scatters_without_whole_program_decomposition() -> None:
    model, args = ShiftedWindowMask(), (torch.randn(2, 3, 8, 12),)
    program = assert_exports_and_matches(model, args)
    record = program.report.decomposition
    assert record.strategy == "local", record.describe()
    # `mask[...] = n` is fill_.Tensor in torch 2.13's capture, fill_.Scalar in 2.15's
    fills = [target for _, target in record.functionalized]
    assert len(fills) == 9 and len(set(fills)) == 1 and fills[0] in ("aten::fill_.Tensor", "aten::fill_.Scalar")
    assert "Decomposition strategy: local" in program.report.to_markdown()
    targets = {str(node.target) for node in capture(model, args, Registry.default()).graph.nodes}
    assert "aten.slice_scatter.default" in targets and not targets & {"aten.fill_.Tensor", "aten.fill_.Scalar"}


def _extremes(dtype: torch.dtype) -> tuple[float | int | bool, float | int | bool]:
    if dtype == torch.bool:
        return True, False
    if dtype.is_floating_point:
        return torch.finfo(dtype).max, torch.finfo(dtype).min
    return torch.iinfo(dtype).max, torch.iinfo(dtype).min


class WritesThroughChainsOfViews(torch.nn.Module):
    """Writes through slices, selects, a transpose, a flattening view, an indexed select and a diagonal of one fresh
    tensor, overlapping one another; views taken before the writes, and copies taken between them, are read after."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.high, self.low = _extremes(dtype)

    def forward(self, x: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x.clone()
        row, column, transposed = y[1], y[:, 2], y.t()  # views taken before every write
        y[0, 1:3].fill_(self.high)
        after_first = row.clone()
        transposed[2].copy_(values[:4])  # column 2, through the transpose: overlaps the fill
        column[1:].fill_(self.low)
        flat = y.view(-1)
        flat[::3] = x.view(-1)[1::3]  # a copy_ into a strided slice of a view
        y[1, [0, 4]] = values[:2]  # index_put_ into a select
        diagonal = y[:3, 1:4].diagonal()
        diagonal.fill_(self.high)
        return y, row, column, transposed, flat, after_first, diagonal


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool])
def test_writes_through_chains_of_views_match_eager(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    high, low = _extremes(dtype)
    x = torch.randint(0, 100, (4, 5), generator=generator).to(dtype)
    x[0, 0], x[3, 4] = high, low
    values = torch.tensor([high, low, high, low, high]).to(dtype)
    program = assert_exports_and_matches(WritesThroughChainsOfViews(dtype), (x, values))
    record = program.report.decomposition
    assert record.strategy == "local", record.describe()
    expected = ["aten::fill_.Scalar", "aten::copy_", "aten::fill_.Scalar", "aten::copy_", "aten::index_put_"]
    assert [target for _, target in record.functionalized] == [*expected, "aten::fill_.Scalar"]


class OverlappingWritesWithDynamicSizes(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        y = x * 2
        head, middle = y[:, :3], y[:, 1:4]  # overlapping views
        flat = y.view(-1)
        head.add_(1.0)
        snapshot = middle * 1  # sees the write through `head`
        middle.mul_(-3.0)
        flat[1::2].sub_(0.5)  # through a view of symbolic size
        y.unsqueeze(0)[0, -1].fill_(7.0)  # the last row, through an unsqueeze
        y.t().unsqueeze(1)[1:3, 0].fill_(-1.0)  # columns 1 and 2, through a transpose (not contiguous)
        return y, head, snapshot, flat


def test_overlapping_writes_through_views_of_symbolic_sizes() -> None:
    rows = torch.export.Dim("rows")
    program = assert_exports_and_matches(
        OverlappingWritesWithDynamicSizes(),
        (torch.randn(3, 5),),
        dynamic_shapes=({0: rows},),
        run_with=[((torch.randn(3, 5),), {}), ((torch.randn(6, 5),), {})],
    )
    record = program.report.decomposition
    assert record.strategy == "local", record.describe()
    assert len(record.functionalized) == 5


# Random programs of views and writes: (kind, alias index, op). Views index the aliases list the program builds.
Step = tuple[str, int, tuple[Any, ...]]


def _view_choices(rng: random.Random, tensor: torch.Tensor) -> list[tuple[Any, ...]]:
    rank, choices = tensor.dim(), []
    if rank >= 1:
        dim = rng.randrange(rank)
        size = tensor.shape[dim]
        if size >= 1:
            start = rng.randrange(size)
            end = rng.choice([None, rng.randrange(start + 1, size + 1)])
            choices += [("slice", dim, start, end, rng.choice([1, 2, 3])), ("select", dim, rng.randrange(-size, size))]
        choices.append(("unsqueeze", rng.randrange(-rank - 1, rank + 1)))
        if tensor.is_contiguous():
            choices.append(("view", -1))
    if rank >= 2:
        permutation = list(range(rank))
        rng.shuffle(permutation)
        choices += [("transpose", 0, rank - 1), ("diagonal", rng.randrange(-1, 2)), ("permute", permutation)]
    if 1 in tensor.shape:
        choices.append(("squeeze", tensor.shape.index(1)))
    return choices


def _apply(alias: torch.Tensor, op: tuple[Any, ...], x: torch.Tensor) -> torch.Tensor | None:
    name, *arguments = op
    if name == "slice":
        dim, start, end, step = arguments
        return alias[(slice(None),) * dim + (slice(start, end, step),)]
    if name in ("select", "unsqueeze", "view", "transpose", "diagonal", "permute", "squeeze"):
        return getattr(alias, name)(*arguments)
    if name == "copy":
        alias.copy_(x.reshape(-1)[: alias.numel()].reshape(alias.shape))
    elif name == "index_put" and alias.dim() >= 1:
        alias[torch.tensor([0, alias.shape[0] - 1])] = arguments[0]
    elif name != "index_put":
        getattr(alias, name + "_")(*arguments)
    return None


class RandomViewsAndWrites(torch.nn.Module):
    def __init__(self, steps: list[Step]) -> None:
        super().__init__()
        self.steps = steps

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        aliases, copies = [x * 1], []
        for kind, index, step_op in self.steps:
            if kind == "view":
                aliases.append(_apply(aliases[index], step_op, x))
            elif kind == "write":
                _apply(aliases[index], step_op, x)
            else:
                copies.append(aliases[index] * 1)  # the value now, read after the later writes
        return (*aliases, *copies)


def _random_steps(seed: int, x: torch.Tensor) -> list[Step]:
    """Steps that eager runs (a candidate it refuses, an overlapping copy_, is skipped)."""
    rng = random.Random(seed)
    steps: list[Step] = []
    aliases = [x * 1]
    for _ in range(rng.randrange(6, 16)):
        kind, index = rng.choice(["view", "view", "write", "write", "read"]), rng.randrange(len(aliases))
        if kind == "view":
            step_op = rng.choice(_view_choices(rng, aliases[index]) or [("unsqueeze", 0)])
        elif kind == "write":
            step_op = rng.choice(
                [("fill", rng.uniform(-9, 9)), ("add", 1.5), ("mul", -2.0), ("copy",), ("index_put", 4.25)]
            )
        else:
            step_op = ()
        if kind != "read":
            try:
                result = _apply(aliases[index], step_op, x)
            except RuntimeError:
                continue
            if result is not None:
                aliases.append(result)
        steps.append((kind, index, step_op))
    return steps


@pytest.mark.parametrize("seed", range(40 if _NIGHTLY else 3))
def test_random_views_and_writes_match_eager(seed: int) -> None:
    """Slices, selects, diagonals, transposes, permutes, (un)squeezes and flattening views of one fresh tensor and
    of one another, written through in turn (fill_, add_, mul_, copy_, index_put_), every alias read at the end and
    some copied between writes."""
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(seed))
    program = assert_exports_and_matches(RandomViewsAndWrites(_random_steps(seed, x)), (x,))
    assert program.report.decomposition.strategy in ("local", "none"), program.report.decomposition.describe()


class WritesAfterAnUntrackedView(torch.nn.Module):
    def __init__(self, untracked_view: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.untracked_view = untracked_view

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        seen = self.untracked_view(y)  # shows the write below
        y[0].fill_(1.0)
        return y, seen * 1


@pytest.mark.parametrize(
    ("untracked_view", "op"),
    [
        (lambda y: y[:1].expand(3, 3), "aten::expand"),
        (lambda y: y.as_strided((2, 2), (1, 3)), "aten::as_strided"),
        (lambda y: y.split(1)[1], "aten::split.Tensor"),
    ],
    ids=["expand", "as_strided", "split"],
)
def test_a_write_into_a_tensor_with_an_untracked_view_takes_full_decomposition(
    untracked_view: Callable[[torch.Tensor], torch.Tensor], op: str
) -> None:
    program = assert_exports_and_matches(WritesAfterAnUntrackedView(untracked_view), (torch.randn(3, 3),))
    record = program.report.decomposition
    assert record.strategy == "full", record.describe()
    assert f"({op}) took a view that local functionalization cannot follow" in record.reason


class WritesIntoAnAliasOfAnInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.to(torch.float32)  # x itself when it is float32 already
        y[0].fill_(0.0)
        return y


def test_a_write_into_what_may_be_an_input_takes_full_decomposition() -> None:
    """Here torch.export records the write into the input itself, which the program then mutates."""
    program = assert_exports_and_matches(WritesIntoAnAliasOfAnInput(), (torch.randn(2, 3, dtype=torch.float64),))
    record = program.report.decomposition
    assert record.strategy == "full", record.describe()


class ChangesShapeInPlace(torch.nn.Module):
    def __init__(self, with_view: bool) -> None:
        super().__init__()
        self.with_view = with_view

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + 1
        view = y[0] if self.with_view else x
        y.unsqueeze_(0)
        y[0, 1].fill_(5.0)
        return y, view * 1


@pytest.mark.parametrize("with_view", [False, True])
def test_a_write_changing_the_shape_in_place(with_view: bool) -> None:
    program = assert_exports_and_matches(ChangesShapeInPlace(with_view), (torch.randn(2, 3),))
    record = program.report.decomposition
    if with_view:
        assert record.strategy == "full" and "changes the shape of `add`, which has views, in place" in record.reason
    else:
        assert record.strategy == "local", record.describe()


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


class RelativePositionBias(torch.nn.Module):
    """BEiT's relative position index: an in-place add into what `contiguous` may return as a view (full
    decomposition), then a bias on a batch of images."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        coords = torch.stack(torch.meshgrid(torch.arange(2), torch.arange(2), indexing="ij")).flatten(1)
        relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
        relative[:, :, 0] += 1
        return (x + relative.sum(-1).to(x.dtype)).flatten(1) @ self.weight


def test_full_decomposition_keeps_a_dynamic_dim_exported_at_size_one_dynamic() -> None:
    """The retrace of run_decompositions decides size-obliviously as the capture did: a batch-1 example stays
    dynamic (it was specialized to 1 by a decomposition, the graph refusing every other batch at run time)."""
    one, three = torch.randn(1, 4, 4), torch.randn(3, 4, 4)
    program = assert_exports_and_matches(
        RelativePositionBias(), (one,), dynamic_shapes=({0: "batch"},), run_with=[((three,), {}), ((one,), {})]
    )
    assert program.report.decomposition.strategy == "full", program.report.decomposition.describe()


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


def _import_torchvision() -> ModuleType:
    """torchvision as `make test` installs it (tests/torchvision_cpu_ops.py); skipped where it is absent."""
    from torchvision_cpu_ops import import_torchvision

    try:
        return import_torchvision()
    except ImportError as error:  # `make test` installs it: only a hand-made environment lacks it
        if os.environ.get("CI"):
            raise
        pytest.skip(f"torchvision is not installed ({error}); `make test` installs it")


def _assert_swin_is_decomposed_locally(program: Any) -> None:
    record = program.report.decomposition
    assert record.strategy == "local", record.describe()
    targets = [target for _, target in record.functionalized]
    assert targets and set(targets) <= {"aten::fill_.Tensor", "aten::fill_.Scalar"}, targets


def test_a_small_torchvision_swin_transformer_is_decomposed_locally() -> None:
    """torchvision's SwinTransformer at swin_t's layout, scaled down: the first stage's shifted windows fill their
    attention mask through slices (stage 2's window covers its whole feature map: no shift, no mask)."""
    _import_torchvision()
    from torchvision.models.swin_transformer import SwinTransformer

    torch.manual_seed(0)
    model = SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4], num_classes=10
    )
    program = assert_exports_and_matches(model, (torch.randn(2, 3, 48, 40),))
    _assert_swin_is_decomposed_locally(program)


@pytest.mark.skipif(not _NIGHTLY, reason="runs in `make test-nightly`: swin_t's export takes minutes at load 10")
def test_torchvision_swin_t_is_decomposed_locally() -> None:
    torchvision = _import_torchvision()
    torch.manual_seed(0)
    program = assert_exports_and_matches(torchvision.models.swin_t(), (torch.randn(1, 3, 224, 224),))
    _assert_swin_is_decomposed_locally(program)


# --- an op the registry has, called without an argument its implementation requires -------------------------------
@torch.library.custom_op("fx2onnx_binding_test::weighted_twice", mutates_args=())
def weighted_twice(x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    return x * 2 if weight is None else x * 2 * weight


@weighted_twice.register_fake
def _(x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    return torch.empty_like(x)


def weighted_twice_requiring_weight(x: FLOAT, weight: FLOAT) -> FLOAT:
    """An implementation that takes `weight` only (as torchlib's nll_loss_forward did)."""
    return onnx_op.Mul(onnx_op.Add(x, x), weight)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_in_place_ops_whose_functional_overload_is_named_otherwise(dtype: torch.dtype) -> None:
    """pow_(2) is pow_.Scalar, whose functional op is pow.Tensor_Scalar (pow.Scalar takes a number as self): written
    through a view, its functional form failed to capture (float_power_ and ldexp_ likewise)."""

    def written(x: torch.Tensor) -> torch.Tensor:
        t = x.clone()
        t.unsqueeze(0)[:, 1].pow_(2)
        t[0].pow_(t[2].clone())
        if x.is_floating_point():
            t[:, 0].ldexp_(torch.tensor([1, 2, 3]))
        return t

    x = torch.tensor([[1, -2, 3], [4, 5, -6], [2, 1, 0]]).to(dtype)
    assert_exports_and_matches(Call(written), (x,))
