"""Shared test helpers: export, run in ONNX Runtime, compare every output with eager."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import onnx
import pytest
import torch

import fx2onnx

warnings.filterwarnings("ignore", category=FutureWarning)


class Call(torch.nn.Module):
    """A module that calls `function` on its inputs: one op (or a few) under test."""

    def __init__(self, function: Callable[..., Any]) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: torch.Tensor) -> Any:
        return self.function(*args)


def assert_exports_and_matches(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    run_with: list[tuple[tuple[Any, ...], dict[str, Any]]] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    **export_options: Any,
) -> fx2onnx.ONNXProgram:
    """Export, check the model, run it in ONNX Runtime and compare dtype, shape and values with eager.

    The model runs in the session users get by default (every graph optimization on), and again with graph
    optimizations off on the same inputs: the two must agree (exactly for integer and bool outputs, up to the
    rounding noise of reordered float arithmetic otherwise), or one of ONNX Runtime's fusions computes something
    else than the graph (docs/ort-defects.md).
    """
    model = model.eval() if isinstance(model, torch.nn.Module) else model
    program = fx2onnx.export(model, args, kwargs, **export_options)
    onnx.checker.check_model(program.model_proto, full_check=True)
    for call_args, call_kwargs in run_with or [(args, kwargs or {})]:
        results = program.verify(*call_args, rtol=rtol, atol=atol, **call_kwargs)
        assert results, "the model has no outputs to compare"
        failures = [str(r) for r in results if not r.passed]
        assert not failures, "\n".join(failures)
        assert_optimizations_change_nothing(program, call_args, call_kwargs)
    return program


DIFFERENTIAL_RUNS = [0]  # programs compared with graph optimizations on and off in this session


def assert_optimizations_change_nothing(
    program: fx2onnx.ONNXProgram, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> None:
    """The default session's outputs equal those of a session with graph optimizations off (same inputs)."""
    divergent = [str(r) for r in program.divergence(*args, **(kwargs or {})) if not r.passed]
    DIFFERENTIAL_RUNS[0] += 1
    assert not divergent, "ONNX Runtime's graph optimizations change the outputs:\n" + "\n".join(divergent)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if DIFFERENTIAL_RUNS[0]:
        terminalreporter.write_line(
            f"differential check (graph optimizations on vs off): {DIFFERENTIAL_RUNS[0]} program runs compared"
        )


@pytest.fixture
def check():
    return assert_exports_and_matches


def assert_rounds_like_eager(
    program: fx2onnx.ONNXProgram, model: torch.nn.Module, args: tuple[Any, ...], *, differing: float = 0.0
) -> None:
    """Every output equal to eager's bit for bit, or, with `differing` > 0, all but that fraction of them, none
    farther than an ulp of the largest output (float32 computations in another order, or another float32
    approximation of exp, round the other way once in a while)."""
    actual = program(*args)
    with torch.no_grad():
        expected = model(*args)
    actual, expected = (t if isinstance(t, (tuple, list)) else (t,) for t in (actual, expected))
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        differ = (got != want) & ~(got.isnan() & want.isnan())
        fraction = differ.float().mean().item()
        assert fraction <= differing, f"{fraction:.2%} of outputs differ from eager"
        scale = torch.finfo(want.dtype).eps * want.float().nan_to_num().abs().max()
        if differ.any():
            assert float((got.float() - want.float())[differ].nan_to_num().abs().max()) <= scale
