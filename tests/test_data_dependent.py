"""Capture through data-dependent code: the strategies after torch.export's first refusal, and the error when
none captures (fx2onnx._capture_strategies)."""

from __future__ import annotations

import warnings

import pytest
import torch

import fx2onnx
from fx2onnx.errors import CaptureError


class EmptyCheckAfterMask(torch.nn.Module):
    """torchvision's ``if boxes.numel() == 0: return empty`` after a boolean mask (an unbacked size)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        if kept.numel() == 0:
            return torch.zeros(1)
        return (kept * 2).cumsum(0)


class ThresholdOnCount(torch.nn.Module):
    """torchvision's batched NMS: a threshold on a data-dependent count choosing between two implementations."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = torch.nonzero(x > 0.5).flatten()
        if kept.numel() > 4000:
            return kept.flip(0)  # the other implementation of the same result, for many elements
        return kept


class LengthOfTopK(torch.nn.Module):
    """``len()`` of "at most K" rows (torchvision's ``num_rois = len(rois)``): Python needs an int."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0.1][:3]
        return torch.zeros(len(kept), 2) + kept.unsqueeze(1)


class BranchOnValue(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # a value, not a size: no strategy can take a branch for it
            return x + 1
        return x - 1


def _export_noting(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[fx2onnx.ONNXProgram, str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = fx2onnx.export(model, args)
    return program, "\n".join(str(w.message) for w in caught)


def test_empty_check_on_a_masked_size_takes_the_general_branch(check) -> None:
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0, 5.0])
    program, warned = _export_noting(EmptyCheckAfterMask(), (x,))
    assert "captured with size-oblivious guards" in warned
    assert "torch.export failed: GuardOnDataDependentSymNode" in warned
    assert "test_data_dependent.py" in warned and "kept.numel() == 0" in warned
    for example in (x, torch.tensor([3.0, -1.0, 7.0, 0.5, -2.0, 1.0])):
        (result,) = program.verify(example)
        assert result.passed, result


def test_threshold_on_a_count_takes_the_branch_for_small_counts() -> None:
    x = torch.tensor([0.9, 0.1, 0.7, 0.2, 0.6])
    program, warned = _export_noting(ThresholdOnCount(), (x,))
    assert "taken as False (for the smallest sizes)" in warned
    for example in (x, torch.tensor([0.9, 0.95, 0.1])):
        (result,) = program.verify(example)
        assert result.passed, result


def test_length_of_at_most_k_rows_is_its_bound() -> None:
    x = torch.tensor([0.5, 0.2, 0.9, 0.7, 0.05])
    program, warned = _export_noting(LengthOfTopK(), (x,))
    assert "taken as 3 (its largest value)" in warned
    (result,) = program.verify(torch.tensor([0.3, 0.4, 0.0, 0.8, 0.6, 0.2]))
    assert result.passed, result


def test_no_strategy_captures_a_branch_on_a_value_and_the_error_names_the_line() -> None:
    with pytest.raises(CaptureError) as raised:
        fx2onnx.export(BranchOnValue(), (torch.ones(3),))
    message = str(raised.value)
    assert "test_data_dependent.py" in message and "if x.sum() > 0" in message
    assert "size-oblivious guards: GuardOnDataDependentSymNode" in message
    assert "real-tensor propagation:" in message
