"""When the registry lowers every op torch.export produced, capture skips ``run_decompositions``.

Decomposing would keep every op anyway (the table leaves out what the registry lowers) and only
retrace the graph, which on large models costs more than torch.export itself. These tests check
when the shortcut applies, that it does not apply to graphs that mutate state, and that the ops it
relies on (ones torch.export keeps whole: batch_norm, adaptive_avg_pool2d, to.dtype, numpy_T)
export correctly in every dtype eager computes them in.
"""

from __future__ import annotations

import pytest
import torch

from fx2onnx import Registry, examples
from fx2onnx._capture import lowerable_as_captured

from conftest import Call, assert_exports_and_matches


class PoolHead(torch.nn.Module):
    def __init__(self, size: tuple[int, int]) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(4)
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.adaptive_avg_pool2d(self.norm(self.conv(x)), self.size)
        return y.flatten(1).T.to(torch.float64)


class CountsCalls(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x * 2


def exported(model: torch.nn.Module, *args: torch.Tensor) -> torch.export.ExportedProgram:
    return torch.export.export(model, args, strict=False)


def test_shortcut_applies_to_registered_ops_only() -> None:
    registry = Registry.default()
    model, args = PoolHead((3, 2)).eval(), (torch.randn(2, 3, 7, 5),)
    program = exported(model, *args)
    assert lowerable_as_captured(program, registry)
    registry.unregister("aten::adaptive_avg_pool2d")
    assert not lowerable_as_captured(program, registry)


def test_shortcut_declines_mutation() -> None:
    assert not lowerable_as_captured(exported(CountsCalls(), torch.randn(3)), Registry.default())
    assert_exports_and_matches(CountsCalls(), (torch.randn(3),))


@pytest.mark.parametrize("size", [(1, 1), (3, 2), (7, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_pool_head_matches_eager(size: tuple[int, int], dtype: torch.dtype) -> None:
    model = PoolHead(size).eval().to(dtype)
    with torch.no_grad():  # running statistics that are not the identity
        model.norm.running_mean.uniform_(-0.5, 0.5)
        model.norm.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 7, 5).to(dtype)
    program = assert_exports_and_matches(model, (x,))
    assert program.report.decomposed == []


def test_batch_norm_in_training_mode_uses_batch_statistics() -> None:
    model = PoolHead((1, 1)).train()
    assert_exports_and_matches(model, (torch.randn(4, 3, 6, 6),))


def test_benchmark_like_models_skip_decomposition() -> None:
    model, args = examples.TinyGPT(vocab=97, width=64, heads=2, layers=1, context=32).eval(), (torch.arange(12)[None],)
    program = exported(model.eval(), *args)
    assert lowerable_as_captured(program, Registry.default())
    assert_exports_and_matches(model, args)


def test_adaptive_average_keeps_nan_in_its_window() -> None:
    x = torch.randn(1, 2, 7, 9)
    x[0, 0, 0, 0] = float("nan")
    x[0, 1, 6, 8] = float("inf")
    model = torch.nn.AdaptiveAvgPool2d((3, 4))
    assert_exports_and_matches(model, (x,))
    assert_exports_and_matches(torch.nn.AdaptiveAvgPool2d((7, 3)), (torch.randn(2, 3, 14, 9),))


@pytest.mark.parametrize("training", [False, True])
def test_native_batch_norm(training: bool) -> None:
    """Training mode updates the running statistics (capture then decomposes); eval mode returns empty stats."""

    def norm(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.native_batch_norm(x, None, None, mean.clone(), var.clone(), training, 0.5, 1e-5)

    args = (torch.randn(4, 3, 5), torch.randn(3), torch.rand(3) + 0.5)
    assert_exports_and_matches(Call(norm), args)


def test_complex_only_implementations_do_not_keep_real_ops_whole() -> None:
    """With only a complex implementation of squeeze.dims, a real graph decomposes it and still exports."""
    registry = Registry.default()
    for implementation in registry.overloads("aten::squeeze.dims"):
        if not implementation.complex:
            registry.unregister("aten::squeeze.dims", implementation.function)
    assert registry.is_registered("aten::squeeze.dims") and not registry.lowers("aten::squeeze.dims")
    model, args = Call(lambda x: x.squeeze((1, 3)) * 2), (torch.randn(2, 1, 3, 1),)
    assert not lowerable_as_captured(exported(model, *args), registry)
    program = assert_exports_and_matches(model, args, registry=registry)
    assert "aten::squeeze.dims" in program.report.decomposed
