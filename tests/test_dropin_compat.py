"""Drop-in compatibility: the same ``torch.onnx.export(..., dynamo=True)`` call through both exporters.

Each case is one call, written as a user of torch.onnx would write it (args/kwargs forms, dynamic_shapes and
dynamic_axes forms, input/output names, opsets, custom translation tables, dtypes, control flow). It runs through
torch.onnx.export and through fx2onnx.export with the same arguments; each resulting model runs in ONNX Runtime
on the example inputs (and on inputs of other sizes where dims are dynamic) and is compared with eager. The
assertion: every call the reference completes with a correct model, fx2onnx completes with a correct model too.
The counts for both exporters are printed at the end of the module (``pytest -m dropin -s`` runs it alone).

Nothing is cached across cases: each builds its model and inputs afresh, for each exporter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import onnx
import onnxscript
import pytest
import torch
import torch.utils._pytree as pytree
from onnxscript import opset18 as op
from torch.onnx import is_in_onnx_export  # imported by name, as mmdet and quantization toolkits do

import fx2onnx

pytestmark = pytest.mark.dropin

Dim = torch.export.Dim


# --- models -------------------------------------------------------------------------------------------------
class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x))


class TwoInputs(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y + x


class OptionalMask(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        y = self.proj(x) * scale
        return y if mask is None else y * mask.unsqueeze(-1)


class DictInput(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["a"] - inputs["b"] * 2


class ListInput(torch.nn.Module):
    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(xs).sum(0)


class TupleOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sin(), x.cos()


class DictOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"mean": x.mean(-1), "max": x.amax(-1)}


class Extremes(NamedTuple):
    low: torch.Tensor
    high: torch.Tensor


class NamedTupleOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> Extremes:
        return Extremes(x.amin(-1), x.amax(-1))


class NestedOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        return x + 1, (x * 2, x - 1)


class Convolution(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.norm(self.conv(x))), 1).flatten(1)


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(batch, length, 3, 2, 8).permute(2, 0, 3, 1, 4)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return torch.nn.functional.gelu(out.transpose(1, 2).reshape(batch, length, 16))


class Embedding(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(20, 6)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.embed(ids), -1)


class IntegerOps(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x.cumsum(0), x.argmax(-1), (x % 3 == 0)


class BoolMask(torch.nn.Module):
    def forward(self, x: torch.Tensor, threshold: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = x > threshold
        return mask, torch.where(mask, x, torch.zeros_like(x))


class Cond(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))


class ShapeBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] > 4:  # resolved at capture: the example's size decides
            return x[..., :4]
        return x * 2


class ExportFlag(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():
            return x + 1
        return x - 1


class Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(4, 6, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(x)[0]


class Reductions(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.sum(1), x.var(0), x.norm(dim=-1), torch.logsumexp(x, -1)


class Indexing(torch.nn.Module):
    def forward(self, x: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[index], torch.gather(x, 1, index.unsqueeze(1).expand(-1, x.shape[1]))


class Reshapes(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1).reshape(x.shape[1], -1).flip(0).unsqueeze(0).contiguous()


class Interpolate(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)


class Elementwise(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x).exp() + torch.sigmoid(x) * x.abs().sqrt() - x.clamp(-0.5, 0.5)


class Factories(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(x.shape[-1], dtype=x.dtype) + torch.ones_like(x) * torch.full((1,), 0.5)


class TopK(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, indices = x.topk(2, dim=-1)
        return values, indices


class Scan(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, 0) + torch.cummax(x, 0).values


class RepeatInterleave(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(2, dim=0)


def custom_relu(self: Any) -> Any:  # a custom translation: relu as max(x, 0)
    return op.Max(self, op.CastLike(op.Constant(value_float=0.0), self))


@onnxscript.script()
def scripted_gelu(self: onnxscript.FLOAT, approximate: str = "none") -> onnxscript.FLOAT:
    return op.Mul(self, op.Sigmoid(op.Mul(self, op.Constant(value_float=1.702))))


class Gelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)


# --- cases ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    name: str
    model: Callable[[], torch.nn.Module]
    # Builds (args, kwargs-for-the-exporters), freshly for each exporter. The options are passed as they are.
    inputs: Callable[[], tuple[Any, dict[str, Any]]]
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Calls to compare with eager: (args, kwargs) as the model takes them; the export call's inputs when empty.
    runs: Callable[[], list[tuple[tuple[Any, ...], dict[str, Any]]]] | None = None
    rtol: float = 1e-4
    atol: float = 1e-5
    # Eager's reference outputs computed with torch.onnx.is_in_onnx_export() True (models that branch on it).
    eager_as_if_exporting: bool = False


def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def ids(*shape: int) -> torch.Tensor:
    return torch.randint(0, 20, shape)


def one(args: tuple[Any, ...], **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    return args, kwargs


CASES: list[Case] = [
    # args forms
    Case("args-a-tensor", Linear, lambda: one(r(2, 8))),
    Case("args-a-tuple", Linear, lambda: one((r(2, 8),))),
    Case("args-two-tensors", TwoInputs, lambda: one((r(3, 4), r(3, 4)))),
    Case("kwargs-keyword", OptionalMask, lambda: one((r(2, 5, 8),), kwargs={"mask": r(2, 5)})),
    Case(
        "kwargs-last-dict",
        OptionalMask,
        lambda: one((r(2, 5, 8), {"mask": r(2, 5)})),
        runs=lambda: [((r(2, 5, 8),), {"mask": r(2, 5)})],
    ),
    Case(
        "kwargs-last-dict-with-a-number",
        OptionalMask,
        lambda: one((r(2, 5, 8), {"mask": r(2, 5), "scale": 3.0})),
        runs=lambda: [((r(2, 5, 8),), {"mask": r(2, 5), "scale": 3.0})],
    ),
    Case("kwargs-optional-left-out", OptionalMask, lambda: one((r(2, 5, 8),))),
    Case("kwargs-only", TwoInputs, lambda: one((), kwargs={"x": r(3), "y": r(3)})),
    Case(
        "input-a-dict",
        DictInput,
        lambda: one(({"a": r(3, 2), "b": r(3, 2)}, {})),
        runs=lambda: [(({"a": r(3, 2), "b": r(3, 2)},), {})],
    ),
    Case("input-a-list", ListInput, lambda: one(([r(4), r(4), r(4)],))),
    Case("output-a-tuple", TupleOutput, lambda: one((r(5),))),
    Case("output-a-dict", DictOutput, lambda: one((r(3, 6),))),
    # dynamic_shapes forms
    Case(
        "dynamic-dim-by-name",
        Linear,
        lambda: one((r(2, 8),), dynamic_shapes={"x": {0: Dim("batch")}}),
        runs=lambda: [((r(2, 8),), {}), ((r(7, 8),), {})],
    ),
    Case(
        "dynamic-dim-tuple",
        TwoInputs,
        lambda: one((r(3, 4), r(3, 4)), dynamic_shapes=({0: Dim("n")}, {0: Dim("n")})),
        runs=lambda: [((r(6, 4), r(6, 4)), {})],
    ),
    Case(
        "dynamic-dim-list-form",
        TwoInputs,
        lambda: one((r(3, 4), r(3, 4)), dynamic_shapes=[[Dim("n"), None], [Dim("n"), None]]),
        runs=lambda: [((r(5, 4), r(5, 4)), {})],
    ),
    Case(
        "dynamic-string-names",
        TwoInputs,
        lambda: one((r(3, 4), r(3, 4)), dynamic_shapes={"x": {0: "batch", 1: "width"}, "y": {0: "batch", 1: "width"}}),
        runs=lambda: [((r(5, 2), r(5, 2)), {})],
    ),
    Case(
        "dynamic-string-tuple",
        Linear,
        lambda: one((r(2, 8),), dynamic_shapes=(("batch", None),)),
        runs=lambda: [((r(9, 8),), {})],
    ),
    Case(
        "dynamic-auto",
        Linear,
        lambda: one((r(2, 8),), dynamic_shapes={"x": {0: Dim.AUTO}}),
        runs=lambda: [((r(4, 8),), {})],
    ),
    Case(
        "dynamic-dynamic",
        Linear,
        lambda: one((r(2, 8),), dynamic_shapes={"x": {0: Dim.DYNAMIC}}),
        runs=lambda: [((r(4, 8),), {})],
    ),
    Case(
        "dynamic-example-size-1",
        Linear,
        lambda: one((r(1, 8),), dynamic_shapes={"x": {0: Dim("batch")}}),
        runs=lambda: [((r(1, 8),), {}), ((r(6, 8),), {})],
    ),
    Case(
        "dynamic-example-size-1-string",
        Attention,
        lambda: one((r(1, 1, 16),), dynamic_shapes=({0: "b", 1: "s"},)),
        runs=lambda: [((r(1, 1, 16),), {}), ((r(2, 5, 16),), {})],
        atol=1e-4,
    ),
    Case(
        "dynamic-two-dims",
        Attention,
        lambda: one((r(2, 5, 16),), dynamic_shapes=({0: Dim("b"), 1: Dim("s")},)),
        runs=lambda: [((r(3, 7, 16),), {})],
        atol=1e-4,
    ),
    Case(
        "dynamic-kwargs",
        OptionalMask,
        lambda: one(
            (r(2, 5, 8),),
            kwargs={"mask": r(2, 5)},
            dynamic_shapes={"x": {0: Dim("b"), 1: Dim("s")}, "mask": {0: Dim("b"), 1: Dim("s")}},
        ),
        runs=lambda: [((r(3, 4, 8),), {"mask": r(3, 4)})],
    ),
    Case(
        "dynamic-nested-dict",
        DictInput,
        lambda: one(({"a": r(3, 2), "b": r(3, 2)}, {}), dynamic_shapes=({"a": {0: "n"}, "b": {0: "n"}},)),
        runs=lambda: [(({"a": r(5, 2), "b": r(5, 2)},), {})],
    ),
    Case(
        "dynamic-nested-list",
        ListInput,
        lambda: one(([r(4), r(4)],), dynamic_shapes=([{0: Dim("n")}, {0: Dim("n")}],)),
        runs=lambda: [(([r(7), r(7)],), {})],
    ),
    Case(
        "dynamic-constrained-by-the-model",
        Attention,
        lambda: one((r(2, 4, 16),), dynamic_shapes=({0: Dim("b", min=1, max=64), 1: Dim("s", min=1, max=64)},)),
        runs=lambda: [((r(3, 6, 16),), {})],
        atol=1e-4,
    ),
    Case(
        "dynamic-conv-batch-and-size",
        Convolution,
        lambda: one((r(2, 3, 8, 8),), dynamic_shapes=({0: Dim("b"), 2: Dim("h"), 3: Dim("w")},)),
        runs=lambda: [((r(1, 3, 5, 9),), {})],
    ),
    Case(
        "dynamic-embedding-ids",
        Embedding,
        lambda: one((ids(2, 5),), dynamic_shapes=({0: "batch", 1: "sequence"},)),
        runs=lambda: [((ids(3, 9),), {})],
    ),
    # dynamic_axes (TorchScript-era) forms, with input/output names
    Case(
        "dynamic-axes-list", Linear, lambda: one((r(2, 8),), dynamic_axes={"x": [0]}), runs=lambda: [((r(5, 8),), {})]
    ),
    Case(
        "dynamic-axes-named",
        Linear,
        lambda: one(
            (r(2, 8),),
            input_names=["features"],
            output_names=["scores"],
            dynamic_axes={"features": {0: "batch"}, "scores": {0: "batch"}},
        ),
        runs=lambda: [((r(5, 8),), {})],
    ),
    Case(
        "dynamic-axes-two-inputs",
        TwoInputs,
        lambda: one((r(3, 4), r(3, 4)), input_names=["a", "b"], dynamic_axes={"a": {0: "n"}, "b": {0: "n"}}),
        runs=lambda: [((r(6, 4), r(6, 4)), {})],
    ),
    Case(
        "dynamic-axes-kwargs-last-dict",
        OptionalMask,
        lambda: one(
            (r(2, 5, 8), {"mask": r(2, 5)}),
            input_names=["x", "mask"],
            dynamic_axes={"x": {0: "batch"}, "mask": {0: "batch"}},
        ),
        runs=lambda: [((r(4, 5, 8),), {"mask": r(4, 5)})],
    ),
    Case(
        "dynamic-axes-attention",
        Attention,
        lambda: one((r(2, 5, 16),), input_names=["hidden"], dynamic_axes={"hidden": {0: "batch", 1: "length"}}),
        runs=lambda: [((r(3, 2, 16),), {})],
        atol=1e-4,
    ),
    # names
    Case("input-names", TwoInputs, lambda: one((r(3), r(3)), input_names=["left", "right"])),
    Case("output-names", TupleOutput, lambda: one((r(5),), output_names=["sine", "cosine"])),
    Case("input-and-output-names", Linear, lambda: one((r(2, 8),), input_names=["in"], output_names=["out"])),
    # opsets
    Case("opset-18", Attention, lambda: one((r(2, 3, 16),), opset_version=18), atol=1e-4),
    Case("opset-20", Attention, lambda: one((r(2, 3, 16),), opset_version=20), atol=1e-4),
    Case("opset-21", Convolution, lambda: one((r(1, 3, 6, 6),), opset_version=21)),
    Case("opset-23", Attention, lambda: one((r(2, 3, 16),), opset_version=23), atol=1e-4),
    Case("opset-default-conv", Convolution, lambda: one((r(2, 3, 6, 6),))),
    # custom translation tables
    Case(
        "custom-traced-function",
        Linear,
        lambda: one((r(2, 8),), custom_translation_table={torch.ops.aten.relu.default: custom_relu}),
    ),
    Case(
        "custom-onnxscript-function",
        Gelu,
        lambda: one((r(2, 8),), custom_translation_table={torch.ops.aten.gelu.default: scripted_gelu}),
        atol=0.03,  # x * sigmoid(1.702 x) is within 0.021 of gelu
    ),
    # dtypes
    Case("float16", Elementwise, lambda: one((r(3, 4, dtype=torch.float16),)), rtol=1e-2, atol=1e-2),
    Case(
        "bfloat16-linear",
        lambda: Linear().to(torch.bfloat16),
        lambda: one((r(2, 8, dtype=torch.bfloat16),)),
        rtol=2e-2,
        atol=2e-2,
    ),
    Case("float64", Reductions, lambda: one((r(3, 5, dtype=torch.float64),)), rtol=1e-9, atol=1e-9),
    Case("int64-ops", IntegerOps, lambda: one((torch.randint(-50, 50, (4, 5)),))),
    Case("int32-ops", IntegerOps, lambda: one((torch.randint(-50, 50, (4, 5), dtype=torch.int32),))),
    Case("bool-outputs", BoolMask, lambda: one((r(3, 4), torch.tensor(0.1)))),
    Case(
        "uint8-image-resize",
        Interpolate,
        lambda: one((torch.randint(0, 256, (1, 2, 4, 4), dtype=torch.uint8),)),
        atol=1,
    ),
    Case("int-indices", Indexing, lambda: one((r(5, 3), torch.tensor([2, 0, 1])))),
    Case("embedding-int64", Embedding, lambda: one((ids(2, 5),))),
    # control flow and export-time branches
    Case("torch-cond", Cond, lambda: one((r(4),)), runs=lambda: [((torch.ones(4),), {}), ((-torch.ones(4),), {})]),
    Case(
        "torch-cond-dynamic",
        Cond,
        lambda: one((r(4),), dynamic_shapes=({0: Dim("n")},)),
        runs=lambda: [((torch.ones(6),), {}), ((-torch.ones(3),), {})],
    ),
    Case("shape-branch", ShapeBranch, lambda: one((r(2, 6),))),
    Case(
        "is-in-onnx-export",
        ExportFlag,
        lambda: one((r(3),)),
        runs=lambda: [((torch.zeros(3),), {})],
        eager_as_if_exporting=True,
    ),
    # a variety of ops
    Case("gru", Recurrent, lambda: one((r(2, 5, 4),)), atol=1e-4),
    Case("reductions", Reductions, lambda: one((r(4, 6),))),
    Case("reshapes", Reshapes, lambda: one((r(3, 4),))),
    Case(
        "reshapes-dynamic",
        Reshapes,
        lambda: one((r(3, 4),), dynamic_shapes=({0: Dim("a"), 1: Dim("b")},)),
        runs=lambda: [((r(5, 2),), {})],
    ),
    Case("interpolate", Interpolate, lambda: one((r(1, 2, 4, 4),))),
    Case("elementwise", Elementwise, lambda: one((r(3, 4),))),
    Case("factories", Factories, lambda: one((r(2, 5),))),
    Case(
        "factories-dynamic",
        Factories,
        lambda: one((r(2, 5),), dynamic_shapes=({1: Dim("n")},)),
        runs=lambda: [((r(2, 9),), {})],
    ),
    Case("topk", TopK, lambda: one((r(3, 6),))),
    Case("cumulative", Scan, lambda: one((r(5, 3),))),
    Case("repeat-interleave", RepeatInterleave, lambda: one((r(3, 2),))),
    Case("conv-batchnorm", Convolution, lambda: one((r(2, 3, 8, 8),))),
    Case("attention-causal", Attention, lambda: one((r(2, 6, 16),)), atol=1e-4),
    Case("kwargs-explicit-none", OptionalMask, lambda: one((r(2, 5, 8),), kwargs={"mask": None})),
    # legacy call sites: None inputs, names for fewer or more inputs and nested outputs, old options at defaults
    Case("args-none-positional", OptionalMask, lambda: one((r(2, 5, 8), None))),
    Case("kwargs-last-dict-none", OptionalMask, lambda: one((r(2, 5, 8), {"mask": None}))),
    Case("output-a-namedtuple", NamedTupleOutput, lambda: one((r(3, 4),))),
    Case("output-names-nested", NestedOutput, lambda: one((r(3),), output_names=["first", "second", "third"])),
    Case("output-names-fewer", NestedOutput, lambda: one((r(3),), output_names=["first"])),
    Case("input-names-more", Linear, lambda: one((r(2, 8),), input_names=["features", "unused"])),
    Case("input-names-dict", DictInput, lambda: one(({"a": r(3, 2), "b": r(3, 2)}, {}), input_names=["A", "B"])),
    Case(
        "dynamic-axes-output-list",
        Linear,
        lambda: one(
            (r(2, 8),), input_names=["input"], output_names=["output"], dynamic_axes={"input": [0], "output": [0]}
        ),
        runs=lambda: [((r(6, 8),), {})],
    ),
    Case(
        "legacy-options-opset-13",
        Convolution,
        lambda: one(
            r(2, 3, 6, 6),
            export_params=True,
            verbose=False,
            opset_version=13,
            do_constant_folding=True,
            input_names=["input"],
            output_names=["output"],
            dynamic_axes={"input": {0: "batch_size"}, "output": {0: "batch_size"}},
        ),
        runs=lambda: [((r(5, 3, 6, 6),), {})],
    ),
]


# --- running a call through an exporter and checking its model -------------------------------------------------
@dataclasses.dataclass
class Outcome:
    status: str  # "correct", "wrong" (ran, differs from eager) or "failed" (export or run raised)
    detail: str = ""


def _flat_outputs(value: Any) -> list[torch.Tensor]:
    leaves = pytree.tree_leaves(value)
    return [leaf if isinstance(leaf, torch.Tensor) else torch.tensor(leaf) for leaf in leaves if leaf is not None]


def _compare(got: list[Any], want: list[torch.Tensor], case: Case) -> str:
    if len(got) != len(want):
        return f"{len(got)} outputs, eager has {len(want)}"
    for index, (actual, expected) in enumerate(zip(got, want)):
        actual = torch.as_tensor(actual)
        if actual.dtype != expected.dtype or tuple(actual.shape) != tuple(expected.shape):
            return (
                f"output {index}: {actual.dtype} {tuple(actual.shape)}, eager {expected.dtype} {tuple(expected.shape)}"
            )
        if expected.dtype.is_floating_point:
            close = torch.allclose(actual.double(), expected.double(), rtol=case.rtol, atol=case.atol, equal_nan=True)
        else:
            close = bool((actual.long() - expected.long()).abs().max() <= case.atol) if expected.numel() else True
        if not close:
            return f"output {index} differs from eager"
    return ""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _as_if_exporting() -> Iterator[None]:
    original = torch.onnx.is_in_onnx_export
    torch.onnx.is_in_onnx_export = lambda: True
    try:
        yield
    finally:
        torch.onnx.is_in_onnx_export = original


def run_call(exporter: str, case: Case, folder: str) -> Outcome:
    torch.manual_seed(0)
    model = case.model().eval()
    args, options = case.inputs()
    path = os.path.join(folder, f"{exporter}.onnx")
    try:
        with _quiet():
            if exporter == "torch.onnx":
                program = torch.onnx.export(model, args, path, dynamo=True, external_data=False, **options)
            else:
                program = fx2onnx.export(model, args, path, dynamo=True, external_data=False, **options)
    except Exception as error:
        return Outcome("failed", f"export: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}")
    if not os.path.exists(path):
        return Outcome("failed", "no file written")
    torch.manual_seed(1)
    if case.runs is not None:
        runs = case.runs()
    else:
        call_args = args if isinstance(args, tuple) else (args,)
        call_kwargs = dict(options.get("kwargs") or {})
        if call_args and isinstance(call_args[-1], dict) and not call_kwargs:  # torch.onnx's convention
            call_args, call_kwargs = call_args[:-1], call_args[-1]
        runs = [(call_args, call_kwargs)]
    for call_args, call_kwargs in runs:
        with torch.no_grad(), _as_if_exporting() if case.eager_as_if_exporting else contextlib.nullcontext():
            expected = _flat_outputs(model(*call_args, **call_kwargs))
        try:
            with _quiet():
                got = program(*call_args, **call_kwargs)
        except Exception as error:
            return Outcome("failed", f"run: {type(error).__name__}: {str(error).strip().splitlines()[0][:200]}")
        got = [g.cpu() if isinstance(g, torch.Tensor) else torch.as_tensor(g) for g in got]
        mismatch = _compare(got, expected, case)
        if mismatch:
            return Outcome("wrong", mismatch)
    return Outcome("correct")


TALLY: dict[str, dict[str, list[str]]] = {"torch.onnx": {}, "fx2onnx": {}}


@pytest.fixture(scope="module", autouse=True)
def counts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print both exporters' counts once the module's cases ran."""
    yield
    ran = sum(len(names) for names in TALLY["fx2onnx"].values())
    lines = [f"drop-in compatibility: {ran} of {len(CASES)} calls run through both exporters"]
    for exporter, outcomes in TALLY.items():
        by_status = {status: sorted(names) for status, names in outcomes.items()}
        summary = ", ".join(f"{len(names)} {status}" for status, names in sorted(by_status.items()))
        lines.append(f"  {exporter}: {summary}")
        for status in ("wrong", "failed"):
            if by_status.get(status):
                lines.append(f"    {status}: {', '.join(by_status[status])}")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print("\n" + "\n".join(lines), flush=True)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_call_the_reference_exports_correctly_fx2onnx_exports_correctly(case: Case, tmp_path: Any) -> None:
    reference = run_call("torch.onnx", case, str(tmp_path))
    ours = run_call("fx2onnx", case, str(tmp_path))
    TALLY["torch.onnx"].setdefault(reference.status, []).append(case.name)
    TALLY["fx2onnx"].setdefault(ours.status, []).append(case.name)
    if reference.status == "correct":
        assert ours.status == "correct", f"torch.onnx exports {case.name} correctly, fx2onnx: {ours.detail}"


def test_the_corpus_covers_at_least_60_calls() -> None:
    assert len(CASES) >= 60
    assert len({case.name for case in CASES}) == len(CASES)


def test_every_overload_torch_onnx_lowers_is_handled_or_listed_with_a_reason() -> None:
    """benchmarks/reference_op_gaps.py's classification: a gap without a reason in its table fails here."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        import reference_op_gaps
    finally:
        sys.path.pop(0)
    groups = reference_op_gaps.classify()
    assert "aten::repeat_interleave.Tensor" in groups["lowered"]
    unexplained = [name for name in groups["gap"] if name.removesuffix(" (complex)") not in reference_op_gaps.REASONS]
    assert not unexplained, f"lower these or give the reason in benchmarks/reference_op_gaps.py: {unexplained}"
    listed = reference_op_gaps.DOC.read_text(encoding="utf-8")
    assert all(f"`{name}`" in listed for name in groups["gap"]), "rerun benchmarks/reference_op_gaps.py"


# --- call sites as people write them (tutorials, export scripts), checked in ONNX Runtime by the call's names ------
def _session(source: str | bytes) -> Any:
    import onnxruntime

    return onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])


def _run_by_name(source: str | bytes, feed: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The saved model run in ONNX Runtime as its users run it: a feed keyed by the input names they chose."""
    session = _session(source)
    required = {i.name for i in session.get_inputs()}
    overridable = {i.name for i in session.get_overridable_initializers()}  # weights kept as inputs
    assert required <= set(feed) <= required | overridable, (sorted(required), sorted(overridable))
    outputs = session.run(None, {name: value.detach().numpy() for name, value in feed.items()})
    return [torch.from_numpy(output) for output in outputs]


def _names(source: str | bytes) -> tuple[list[str], list[str], list[str]]:
    """The graph's input names, output names and initializer names, as a user of the file sees them."""
    model = onnx.load_from_string(source) if isinstance(source, bytes) else onnx.load(source)
    graph = model.graph
    return [v.name for v in graph.input], [v.name for v in graph.output], [t.name for t in graph.initializer]


def _matches(got: list[torch.Tensor], expected: Any, atol: float = 1e-5) -> None:
    want = _flat_outputs(expected)
    assert len(got) == len(want)
    for actual, reference in zip(got, want):
        assert actual.dtype == reference.dtype and actual.shape == reference.shape
        torch.testing.assert_close(actual, reference.detach(), rtol=1e-4, atol=atol)


def _torch_onnx(model: Any, args: Any, path: str, **options: Any) -> None:
    """torch.onnx.export's dynamo path, quiet: the reference for the names users depend on."""
    with _quiet():
        torch.onnx.export(model, args, path, dynamo=True, **options)


def test_the_pytorch_tutorial_call_runs_with_its_input_name(tmp_path: Any) -> None:
    """PyTorch's and ONNX Runtime's tutorials: an input that requires grad, every legacy option at its default,
    output names and dynamic_axes on input and output, then ``session.get_inputs()[0].name`` fed a numpy array."""
    torch.manual_seed(0)
    model = Convolution().eval()
    x = torch.randn(1, 3, 8, 8, requires_grad=True)
    torch_out = model(x)
    path = str(tmp_path / "model.onnx")
    fx2onnx.export(
        model,
        x,
        path,
        export_params=True,
        opset_version=17,
        do_constant_folding=True,
        input_names=["input"],
        output_names=["output"],
        dynamic_axes={"input": {0: "batch_size"}, "output": {0: "batch_size"}},
    )
    session = _session(path)
    got = session.run(None, {session.get_inputs()[0].name: x.detach().numpy()})
    torch.testing.assert_close(torch.from_numpy(got[0]), torch_out.detach(), rtol=1e-4, atol=1e-5)
    assert _names(path)[:2] == (["input"], ["output"])
    batch = torch.randn(4, 3, 8, 8)
    _matches(_run_by_name(path, {"input": batch}), model(batch))


class Detector(torch.nn.Module):
    """YOLO-style: one image input, the predictions first, then the feature maps (a list) the export names not."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, stride=2, padding=1)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        features = self.conv(images)
        return features.flatten(2).transpose(1, 2).sigmoid(), [features]


def test_a_yolo_style_export_names_the_predictions_and_their_dynamic_axes(tmp_path: Any) -> None:
    path = str(tmp_path / "detector.onnx")
    model = Detector().eval()
    axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 1: "anchors"}}
    fx2onnx.export(
        model,
        torch.randn(1, 3, 32, 32),
        path,
        verbose=False,
        opset_version=17,
        do_constant_folding=True,
        input_names=["images"],
        output_names=["output0"],
        dynamic_axes=axes,
    )
    inputs, outputs, _ = _names(path)
    assert inputs == ["images"] and outputs[0] == "output0" and len(outputs) == 2
    dims = [d.dim_param or d.dim_value for d in onnx.load(path).graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "anchors", 6]
    images = torch.randn(2, 3, 24, 40)
    _matches(_run_by_name(path, {"images": images}), model(images))


def test_f_as_a_bytesio_holds_the_model_as_torch_onnx_writes_it() -> None:
    """``f = io.BytesIO(); torch.onnx.export(model, x, f); onnx.load_from_string(f.getvalue())``: fx2onnx took only
    a path (TypeError: expected str, bytes or os.PathLike object, not BytesIO)."""
    model, x = Linear().eval(), torch.randn(2, 8)
    ours, theirs = io.BytesIO(), io.BytesIO()
    fx2onnx.export(model, x, ours, input_names=["features"])
    _torch_onnx(model, x, theirs, input_names=["features"])  # type: ignore[arg-type]
    assert _names(ours.getvalue())[0] == _names(theirs.getvalue())[0] == ["features"]
    onnx.checker.check_model(onnx.load_from_string(ours.getvalue()), full_check=True)
    _matches(_run_by_name(ours.getvalue(), {"features": x}), model(x))
    with pytest.raises(ValueError, match="one protobuf"):
        fx2onnx.export(model, x, io.BytesIO(), external_data=True)


@pytest.mark.parametrize("external_data", [False, True], ids=["one-file", "external-data"])
def test_keep_initializers_as_inputs_lists_the_weights_as_inputs_as_torch_onnx_does(
    tmp_path: Any, external_data: bool
) -> None:
    """Older runtimes and tools (and scripts written for them) ask for the weights among the inputs: fx2onnx refused
    the option. The inputs are torch's, the weights keep their values, and feeding others overrides them."""
    model, x = Linear().eval(), torch.randn(2, 8)
    ours, theirs = str(tmp_path / "ours.onnx"), str(tmp_path / "theirs.onnx")
    fx2onnx.export(model, (x,), ours, keep_initializers_as_inputs=True, external_data=external_data)
    _torch_onnx(model, (x,), theirs, keep_initializers_as_inputs=True, external_data=external_data)
    assert _names(ours)[0] == _names(theirs)[0] == ["x", "proj.weight", "proj.bias"]
    assert sorted(_names(ours)[2]) == ["proj.bias", "proj.weight"]
    onnx.checker.check_model(ours, full_check=True)
    # the weights are optional inputs: a feed of the model's inputs alone runs with the saved values
    _matches([torch.from_numpy(output) for output in _session(ours).run(None, {"x": x.numpy()})], model(x))
    other = Linear().eval()
    feed = {"x": x, "proj.weight": other.proj.weight, "proj.bias": other.proj.bias}
    _matches(_run_by_name(ours, feed), other(x))


def test_export_params_false_saves_the_weights_as_inputs_without_their_data(tmp_path: Any) -> None:
    """torch.onnx's TorchScript exporter made the weights inputs for export_params=False (fed at run time); its
    dynamo path writes them nowhere (a model onnx.checker refuses). fx2onnx refused the option; now the file holds
    no weight and runs when fed them by their state_dict names; the program in memory keeps them."""
    model, x = Linear().eval(), torch.randn(2, 8)
    path = str(tmp_path / "model.onnx")
    program = fx2onnx.export(model, (x,), path, export_params=False)
    inputs, _, initializers = _names(path)
    assert inputs == ["x", "proj.weight", "proj.bias"] and initializers == []
    onnx.checker.check_model(path, full_check=True)
    feed = {"x": x, **dict(model.named_parameters())}
    _matches(_run_by_name(path, feed), model(x))
    _matches([t for t in program(x) if t is not None], model(x))
    assert sorted(program.model.graph.initializers) == ["proj.bias", "proj.weight"]
    # a constant the export computed from weights (batch norm folded in eval) stays: no caller could feed it
    model, x = Classifier().eval(), torch.randn(4, 8)
    fx2onnx.export(model, (x,), path, export_params=False)
    inputs, _, initializers = _names(path)
    state = dict(model.state_dict())
    assert inputs[0] == "x" and set(inputs[1:]) <= set(state) and not set(initializers) & set(state)
    _matches(_run_by_name(path, {"x": x, **{name: state[name] for name in inputs[1:]}}), model(x))


@pytest.mark.parametrize("opset_version", [7, 9, 10])
def test_an_opset_below_11_is_refused_with_what_to_pass(tmp_path: Any, opset_version: int) -> None:
    """opset_version=11 is in most export scripts (and works, tests/test_older_opsets.py); older scripts say 9 or
    10, where torch's dynamo path writes opset 18 instead. The error says what to pass, and no file is written."""
    with pytest.raises(fx2onnx.ExportError, match=r"remedy: leave opset_version out \(18\), or pass opset_version=11"):
        fx2onnx.export(Linear().eval(), torch.randn(2, 8), str(tmp_path / "model.onnx"), opset_version=opset_version)
    assert os.listdir(tmp_path) == []


def scaled_product(x: torch.Tensor, y: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    return x * y * scale + 1


def test_a_plain_function_exports_with_its_parameter_names(tmp_path: Any) -> None:
    """torch.export takes modules only (torch.onnx.export fails on a function); fx2onnx wraps it, keeping its
    signature: inputs named after its parameters, dynamic_axes and dynamic_shapes keyed by them."""
    path = str(tmp_path / "function.onnx")
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    program = fx2onnx.export(scaled_product, (x, y), path, dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    assert _names(path)[0] == ["x", "y"]
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    _matches(_run_by_name(path, {"x": x, "y": y}), scaled_product(x, y))
    assert all(result.passed for result in program.verify(x, y))
    program = fx2onnx.export(scaled_product, (x,), kwargs={"y": y, "scale": 3.0})
    assert all(result.passed for result in program.verify(x, y=y, scale=3.0))


def test_torchscript_is_refused_with_the_way_out() -> None:
    """A ScriptModule (torch.jit.script or trace, as legacy scripts pass): torch.export cannot read it."""
    model, x = Linear().eval(), torch.randn(2, 8)
    for scripted in (torch.jit.script(model), torch.jit.trace(model, (x,))):
        with pytest.raises(TypeError, match=r"remedy: pass the torch.nn.Module .* before torch.jit.script"):
            fx2onnx.export(scripted, (x,))


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Dropout(0.5)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _training_warnings(model: torch.nn.Module) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fx2onnx.export(model, (torch.randn(4, 8),))
    return [str(w.message) for w in caught if "training mode" in str(w.message)]


def test_a_model_left_in_training_mode_is_warned_about_as_torch_onnx_does() -> None:
    """model.eval() forgotten: the ONNX model drops at random and normalizes with the batch's statistics, silently
    (torch.onnx.export warns). A model whose graph does not depend on the mode is not warned about."""
    warned = _training_warnings(Classifier().train())
    assert len(warned) == 1 and "remedy: call model.eval()" in warned[0]
    assert _training_warnings(Classifier().eval()) == []
    assert _training_warnings(Linear().train()) == []


class ThreeInputs(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return a + b * c


def test_input_names_shorter_than_the_inputs_leave_the_rest_their_parameter_names(tmp_path: Any) -> None:
    """torch names the inputs input_names leaves unnamed after their parameters; dynamic_axes keyed by those names
    made no dim dynamic (fx2onnx matched its keys to input_names only): the model refused other batch sizes."""
    ours, theirs = str(tmp_path / "ours.onnx"), str(tmp_path / "theirs.onnx")
    args = (torch.randn(3, 2), torch.randn(3, 2), torch.randn(3, 2))
    options = {"input_names": ["first"], "dynamic_axes": {"first": {0: "n"}, "b": {0: "n"}, "c": {0: "n"}}}
    fx2onnx.export(ThreeInputs(), args, ours, **options)
    _torch_onnx(ThreeInputs(), args, theirs, **options)
    assert _names(ours)[0] == _names(theirs)[0] == ["first", "b", "c"]
    a, b, c = torch.randn(6, 2), torch.randn(6, 2), torch.randn(6, 2)
    _matches(_run_by_name(ours, {"first": a, "b": b, "c": c}), ThreeInputs()(a, b, c))


def test_dynamic_axes_may_key_an_input_by_its_parameter_when_input_names_rename_it(tmp_path: Any) -> None:
    """``input_names=["input"], dynamic_axes={"x": {0: "batch"}}``: the key was silently ignored (a static model)."""
    path = str(tmp_path / "model.onnx")
    model = Linear().eval()
    fx2onnx.export(model, torch.randn(2, 8), path, input_names=["input"], dynamic_axes={"x": {0: "batch"}})
    graph = onnx.load(path).graph
    assert [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", 8]
    x = torch.randn(5, 8)
    _matches(_run_by_name(path, {"input": x}), model(x))


def test_a_dynamic_axes_key_naming_nothing_is_refused(tmp_path: Any) -> None:
    """A misspelt name (``"inputs"`` for ``"input"``) left the axis static without a word (torch.onnx refuses it)."""
    path = str(tmp_path / "model.onnx")
    with pytest.raises(
        ValueError, match=r"dynamic_axes names 'inputs': no input or output .*inputs: input, x; outputs: output"
    ):
        fx2onnx.export(Linear().eval(), torch.randn(2, 8), path, input_names=["input"], dynamic_axes={"inputs": [0]})
    assert os.listdir(tmp_path) == []


class Images(torch.nn.Module):
    """torchvision's detection models' convention: a list of images, each of its own size."""

    def forward(self, images: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack([image.mean((1, 2)) for image in images])


def test_a_list_args_is_one_argument_as_in_torch_onnx(tmp_path: Any) -> None:
    """``export(maskrcnn, [image], f)``: the list is the model's one argument (legacy torch.onnx's reading); a list
    that only binds as several arguments is refused saying to give a tuple (it was a capture error about a missing
    argument)."""
    images = [torch.randn(3, 4, 5), torch.randn(3, 6, 2)]
    path = str(tmp_path / "images.onnx")
    fx2onnx.export(Images(), images, path)
    assert _names(path)[0] == ["images_0", "images_1"]
    _matches(_run_by_name(path, {"images_0": images[0], "images_1": images[1]}), Images()(images))
    theirs = str(tmp_path / "theirs.onnx")
    _torch_onnx(Images(), (images,), theirs)
    assert _names(theirs)[0] == _names(path)[0]
    with pytest.raises(TypeError, match=r"remedy: give them as a tuple"):
        fx2onnx.export(TwoInputs(), [torch.randn(3), torch.randn(3)])


def test_dynamic_axes_reach_tensors_inside_nested_inputs_by_their_graph_names(tmp_path: Any) -> None:
    """Mask R-CNN's legacy export: ``export(model, [image], f, input_names=["images"], dynamic_axes={"images": {1:
    "height", 2: "width"}})`` names the image inside the list (fx2onnx refused: "give dynamic_shapes instead"); a
    dict input's tensors are keyed as the graph names them (``inputs_a``: the key was silently ignored)."""
    path = str(tmp_path / "images.onnx")
    fx2onnx.export(
        Images(), [r(3, 4, 5)], path, input_names=["images"], dynamic_axes={"images": {1: "height", 2: "width"}}
    )
    image = r(3, 7, 2)
    _matches(_run_by_name(path, {"images": image}), Images()([image]))
    path = str(tmp_path / "dict.onnx")
    axes = {"inputs_a": {0: "n"}, "inputs_b": {0: "n"}}
    fx2onnx.export(DictInput(), ({"a": r(3, 2), "b": r(3, 2)}, {}), path, dynamic_axes=axes)
    theirs = str(tmp_path / "theirs.onnx")
    _torch_onnx(DictInput(), ({"a": r(3, 2), "b": r(3, 2)}, {}), theirs, dynamic_axes=axes)
    assert _names(path)[0] == _names(theirs)[0] == ["inputs_a", "inputs_b"]
    a, b = r(6, 2), r(6, 2)
    _matches(_run_by_name(path, {"inputs_a": a, "inputs_b": b}), DictInput()({"a": a, "b": b}))


def test_the_pytorch_tutorial_optimizes_and_saves_the_returned_program(tmp_path: Any) -> None:
    """torch's tutorial: ``onnx_program = torch.onnx.export(model, example_inputs, dynamo=True)``, then
    ``onnx_program.optimize()`` and ``onnx_program.save(path)`` (AttributeError: no optimize)."""
    model, x = Convolution().eval(), r(1, 3, 8, 8)
    onnx_program = fx2onnx.export(model, (x,), dynamo=True)
    onnx_program.optimize()
    path = str(tmp_path / "image_classifier_model.onnx")
    onnx_program.save(path)
    _matches(_run_by_name(path, {"x": x}), model(x))
    _matches([t for t in onnx_program(x) if t is not None], model(x))
    onnx_program.release()
    _matches([t for t in onnx_program(x) if t is not None], model(x))
    with pytest.raises(ValueError, match="export again with optimize=True"):
        fx2onnx.export(model, (x,), optimize=False).optimize()


def test_a_named_tuple_returned_names_the_outputs_by_its_fields(tmp_path: Any) -> None:
    """As a dict's keys do: ``Extremes(low, high)`` gives outputs ``low`` and ``high`` (they were ``output_0``,
    ``output_1``; torch.onnx names them after FX nodes, ``getitem``...)."""
    path = str(tmp_path / "model.onnx")
    x = r(3, 4)
    fx2onnx.export(NamedTupleOutput(), (x,), path)
    assert _names(path)[1] == ["low", "high"]
    _matches(_run_by_name(path, {"x": x}), NamedTupleOutput()(x))


class Tokens(torch.nn.Module):
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return input_ids * 2 + (0 if attention_mask is None else attention_mask)


def test_args_as_a_dict_of_keyword_arguments_as_transformers_scripts_pass_them(tmp_path: Any) -> None:
    """``export(model, dict(tokenizer(...)), f, input_names=[...], dynamic_axes=...)``: legacy torch.onnx read a
    dict `args` as the keyword arguments (torch 2.13's dynamo path fails: KeyError -1)."""
    path = str(tmp_path / "tokens.onnx")
    ids, mask = torch.randint(0, 9, (2, 5)), torch.ones(2, 5, dtype=torch.long)
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    fx2onnx.export(
        Tokens(), {"input_ids": ids, "attention_mask": mask}, path, input_names=list(axes), dynamic_axes=axes
    )
    ids, mask = torch.randint(0, 9, (3, 7)), torch.randint(0, 2, (3, 7))
    _matches(_run_by_name(path, {"input_ids": ids, "attention_mask": mask}), Tokens()(ids, mask))


def test_legacy_options_at_their_defaults_with_report_and_verify(tmp_path: Any) -> None:
    """A legacy call with every TorchScript-era option at its default, plus dynamo=True and the new options, into a
    folder that does not exist yet: no warning about the options, the report written, the model verified."""
    model, x = Linear().eval(), torch.randn(2, 8)
    path = str(tmp_path / "exports" / "v1" / "model.onnx")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = fx2onnx.export(
            model,
            (x,),
            path,
            export_params=True,
            verbose=False,
            training=torch.onnx.TrainingMode.EVAL,
            input_names=["input"],
            output_names=["output"],
            operator_export_type=torch.onnx.OperatorExportTypes.ONNX,
            opset_version=18,
            do_constant_folding=True,
            keep_initializers_as_inputs=False,
            dynamo=True,
            report=True,
            verify=True,
            artifacts_dir=str(tmp_path / "artifacts"),
        )
    assert not [w for w in caught if "ignored" in str(w.message)], [str(w.message) for w in caught]
    assert os.listdir(tmp_path / "artifacts") == ["Linear_fx2onnx_report.md"]
    assert program.report is not None and all(result.passed for result in program.report.verification)
    _matches(_run_by_name(path, {"input": x}), model(x))


# --- after the export call: what users do with the returned ONNXProgram, through both exporters ----------------------
def _initializer_feed(program: Any) -> dict[str, torch.Tensor]:
    """The program's weights by their graph names, to feed a model saved with them as inputs only."""
    graph = program.model.graph
    return {name: torch.from_numpy(value.const_value.numpy().copy()) for name, value in graph.initializers.items()}


def _other_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Other values for every floating-point weight of `model` (batch norm's statistics too), as a state_dict."""
    generator = torch.Generator().manual_seed(5)
    return {
        name: torch.rand(t.shape, generator=generator) + 0.5 if t.is_floating_point() else t.clone()
        for name, t in model.state_dict().items()
    }


def _use_apply_weights(program: Any, model: torch.nn.Module, args: tuple[Any, ...], path: str) -> list[torch.Tensor]:
    weights = _other_weights(model)
    with _quiet():
        program.apply_weights(weights)
    model.load_state_dict(weights)  # eager with the same weights
    program.save(path)
    return _run_by_name(path, {"x": args[0]})


def _use_verify_onnx_program(program: Any, model: torch.nn.Module, args: tuple[Any, ...], path: str) -> list[Any]:
    from torch.onnx.verification import verify_onnx_program

    with _quiet():
        infos = verify_onnx_program(program, args)
    assert infos and all(info.max_abs_diff < 1e-4 for info in infos), infos
    return list(program(*args))


def _use_initialize_inference_session(
    program: Any, model: torch.nn.Module, args: tuple[Any, ...], path: str
) -> list[Any]:
    program.initialize_inference_session(_session)
    return list(program(*args))


def _use_rename_axes(program: Any, model: torch.nn.Module, args: tuple[Any, ...], path: str) -> list[torch.Tensor]:
    program.rename_axes({program.model.graph.inputs[0].shape[0]: "images"})
    program.save(path)
    assert onnx.load(path).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "images"
    return _run_by_name(path, {"x": args[0]})


def _save_model_proto(program: Any, path: str) -> str:
    onnx.save(program.model_proto, path)
    return path


# (name, model, export's extra options, what the user does: (program, model, args, path) -> outputs to compare)
USES: list[tuple[str, Callable[[], torch.nn.Module], dict[str, Any], Callable[..., list[Any]]]] = [
    (
        "apply-weights-named-parameters",
        Convolution,
        {},
        lambda p, m, a, path: (
            p.apply_weights(dict(m.named_parameters())),
            p.save(path),
            _run_by_name(path, {"x": a[0]}),
        )[-1],
    ),
    ("apply-weights-another-state-dict", Convolution, {}, _use_apply_weights),
    ("apply-weights-another-state-dict-linear", Linear, {}, _use_apply_weights),
    (
        "save-destination-keyword",
        Linear,
        {},
        lambda p, m, a, path: (p.save(destination=path), _run_by_name(path, {"x": a[0]}))[-1],
    ),
    (
        "save-weights-as-inputs-without-data",
        Convolution,
        {},
        lambda p, m, a, path: (
            p.save(path, include_initializers=False, keep_initializers_as_inputs=True),
            _run_by_name(path, {"x": a[0], **_initializer_feed(p)}),
        )[-1],
    ),
    (
        "compute-values-of-an-output",
        Linear,
        {},
        lambda p, m, a, path: list(p.compute_values([p.model.graph.outputs[0].name], a)),
    ),
    ("call-reference", Convolution, {}, lambda p, m, a, path: list(p.call_reference(*a))),
    ("initialize-inference-session", Convolution, {}, _use_initialize_inference_session),
    ("rename-axes", Convolution, {"dynamic_shapes": ({0: "batch"},)}, _use_rename_axes),
    ("verify-onnx-program", Convolution, {}, _use_verify_onnx_program),
    (
        "onnx-save-model-proto",
        Convolution,
        {},
        lambda p, m, a, path: _run_by_name(_save_model_proto(p, path), {"x": a[0]}),
    ),
    ("release-and-call-again", Linear, {}, lambda p, m, a, path: (p(*a), p.release(), list(p(*a)))[-1]),
]


def _run_use(
    exporter: str, model_class: Callable[[], torch.nn.Module], options: dict[str, Any], use: Any, folder: str
) -> Outcome:
    torch.manual_seed(0)
    model = model_class().eval()
    args = (r(2, 3, 8, 8),) if model_class is Convolution else (r(2, 8),)
    try:
        with _quiet():
            export = torch.onnx.export if exporter == "torch.onnx" else fx2onnx.export
            program = export(model, args, dynamo=True, **options)
        got = use(program, model, args, os.path.join(folder, f"{exporter}.onnx"))
    except Exception as error:
        return Outcome("failed", f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}")
    with torch.no_grad():
        expected = _flat_outputs(model(*args))
    mismatch = _compare(
        [torch.as_tensor(g) for g in got if g is not None], expected, Case("use", model_class, lambda: one(()))
    )
    return Outcome("wrong", mismatch) if mismatch else Outcome("correct")


@pytest.mark.parametrize(("name", "model", "options", "use"), USES, ids=[use[0] for use in USES])
def test_what_users_do_with_the_returned_program_works_as_with_torch_onnx(
    name: str, model: Callable[[], torch.nn.Module], options: dict[str, Any], use: Any, tmp_path: Any
) -> None:
    """Every use gives eager's outputs with fx2onnx; torch.onnx's outcome is said when it differs (its
    ``apply_weights`` leaves batch norm's folded statistics as they were: a silently wrong model)."""
    reference = _run_use("torch.onnx", model, options, use, str(tmp_path))
    ours = _run_use("fx2onnx", model, options, use, str(tmp_path))
    assert ours.status == "correct", (
        f"{name}: fx2onnx {ours.detail} (torch.onnx: {reference.status} {reference.detail})"
    )


class Exportable(torch.onnx.ExportableModule):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x))

    def example_arguments(self) -> tuple[tuple[Any, ...], dict[str, Any] | None]:
        return (torch.randn(2, 8),), None

    def input_names(self) -> tuple[str, ...]:
        return ("features",)

    def output_names(self) -> tuple[str, ...]:
        return ("scores",)

    def dynamic_shapes(self) -> Any:
        return ({0: "batch"},)


@pytest.mark.parametrize("exporter", ["torch.onnx", "fx2onnx"])
def test_an_exportable_module_exports_from_its_own_example_arguments(exporter: str, tmp_path: Any) -> None:
    """``torch.onnx.export(module)`` of a ``torch.onnx.ExportableModule``: no args, the module gives them, its names
    and dynamic shapes (fx2onnx: CaptureError, missing a required argument 'x')."""
    torch.manual_seed(0)
    model, path = Exportable().eval(), str(tmp_path / "model.onnx")
    with _quiet():
        (torch.onnx.export if exporter == "torch.onnx" else fx2onnx.export)(model, f=path)
    assert _names(path)[:2] == (["features"], ["scores"])
    x = torch.randn(5, 8)
    _matches(_run_by_name(path, {"features": x}), model(x))


class ExportFlagImported(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if is_in_onnx_export():
            return x + 1  # what the model computes in ONNX (a fake-quantize stand-in, a traceable path)
        return x - 1


@pytest.mark.parametrize("exporter", ["torch.onnx", "fx2onnx"])
def test_is_in_onnx_export_imported_by_name_is_true_during_the_export(exporter: str, tmp_path: Any) -> None:
    """``from torch.onnx import is_in_onnx_export`` at a module's top binds torch's function: it must answer True
    during the export too (fx2onnx replaced only the attribute of torch.onnx: the model took its eager branch)."""
    path, x = str(tmp_path / "model.onnx"), torch.zeros(3)
    with _quiet():
        (torch.onnx.export if exporter == "torch.onnx" else fx2onnx.export)(ExportFlagImported(), (x,), path)
    _matches(_run_by_name(path, {"x": x}), x + 1)
    assert not is_in_onnx_export() and torch.equal(ExportFlagImported()(x), x - 1)  # False again afterwards
