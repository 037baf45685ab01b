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
    for example in (x, torch.tensor([3.0, -1.0, 7.0, 0.5, -2.0])):
        (result,) = program.verify(example)
        assert result.passed, result


def test_threshold_on_a_count_takes_the_branch_for_small_counts() -> None:
    x = torch.rand(4500, generator=torch.Generator().manual_seed(0))  # up to 4500 kept: the threshold is open
    program, warned = _export_noting(ThresholdOnCount(), (x,))
    assert "taken as False (for the smallest sizes)" in warned
    for example in (x, torch.rand(4500, generator=torch.Generator().manual_seed(1))):
        (result,) = program.verify(example)
        assert result.passed, result


def test_length_of_at_most_k_rows_is_its_bound() -> None:
    x = torch.tensor([0.5, 0.2, 0.9, 0.7, 0.05])
    program, warned = _export_noting(LengthOfTopK(), (x,))
    assert "taken as 3 (its largest value)" in warned
    (result,) = program.verify(torch.tensor([0.3, 0.4, 0.0, 0.8, 0.6]))
    assert result.passed, result


def test_no_strategy_captures_a_branch_on_a_value_and_the_error_names_the_line() -> None:
    with pytest.raises(CaptureError) as raised:
        fx2onnx.export(BranchOnValue(), (torch.ones(3),))
    message = str(raised.value)
    assert "test_data_dependent.py" in message and "if x.sum() > 0" in message
    assert "size-oblivious guards: GuardOnDataDependentSymNode" in message


class ValidatesItsInput(torch.nn.Module):
    """Input validation on values (gaussian_nll_loss's ``if torch.any(var < 0): raise ValueError``)."""

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if torch.any(scale < 0):
            raise ValueError("scale must be non-negative")
        if not (x.abs().max() < 1e6):
            raise ValueError("x out of range")
        return x * scale.sqrt()


class RaisesOrReturns(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0 and x.shape[0] > 1:  # the guard is a part of the test: not decided
            raise ValueError("positive")
        return x


def test_input_validation_on_values_takes_the_branch_that_does_not_raise() -> None:
    x, scale = torch.tensor([1.0, -2.0, 3.0]), torch.tensor([4.0, 0.0, 0.25])
    program, warned = _export_noting(ValidatesItsInput(), (x, scale))
    assert "taken as False (the input is valid)" in warned and "taken as True (the input is valid)" in warned
    assert "if torch.any(scale < 0)" in warned
    for example in ((x, scale), (torch.tensor([5.0, 6.0, -7.0]), torch.tensor([1.0, 9.0, 16.0]))):
        (result,) = program.verify(*example)
        assert result.passed, result


def test_a_guard_inside_a_compound_test_is_not_decided() -> None:
    with pytest.raises(CaptureError) as raised:
        fx2onnx.export(RaisesOrReturns(), (torch.ones(3),))
    assert "if x.sum() > 0 and x.shape[0] > 1" in str(raised.value)


class TopKOfMasked(torch.nn.Module):
    """Detection heads' ``topk(min(K, number of candidates))``: a symbolic k."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kept = x[x > 0]
        values, indices = kept.topk(min(3, kept.shape[0]))
        return values, indices


def test_topk_with_a_data_dependent_k(check) -> None:
    x = torch.tensor([0.5, -1.0, 2.0, 3.0, 0.1, 4.0])
    check(TopKOfMasked(), (x,), run_with=[((x,), {}), ((torch.tensor([0.5, -1.0, 2.0, -3.0, -0.1, -4.0]),), {})])
