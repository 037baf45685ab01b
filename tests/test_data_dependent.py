"""Capture through data-dependent code: the strategies after torch.export's first refusal, and the error when
none captures (fx2onnx._capture_strategies)."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

import fx2onnx
from fx2onnx import _branch_join as branch_join
from fx2onnx.errors import CaptureError

from conftest import Call


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
        if x.sum() > 0:  # a value, not a size: both sides captured, an If on the value
            return x + 1
        return x - 1


class TwoBranchesOnValues(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0 and x.mean() > 1:  # two values: one If joins the sides of one only
            return x + 1
        return x - 1


class ClampWhereNotFinite(torch.nn.Module):
    """BART's float16 encoder layer: clamps the hidden states only when some are inf or NaN."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden * 2
        if hidden.dtype == torch.float16 and not torch.isfinite(hidden).all():
            limit = torch.finfo(hidden.dtype).max - 1000
            hidden = torch.clamp(hidden, min=-limit, max=limit)
        return hidden


class ClampedLayer(torch.nn.Module):
    """A BART-like float16 layer: mixes a spike into the hidden states, clamps them where that overflowed."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, hidden: torch.Tensor, spike: torch.Tensor) -> torch.Tensor:
        hidden = self.linear(hidden) * 0.5 + spike * 2
        if hidden.dtype == torch.float16 and not torch.isfinite(hidden).all():
            limit = torch.finfo(hidden.dtype).max - 1000
            hidden = torch.clamp(hidden, min=-limit, max=limit)
        return hidden


class ClampedLayers(torch.nn.Module):
    """The same question asked once per layer (BART/Marian's float16 encoder): each layer's spike decides its own."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(ClampedLayer() for _ in range(layers))

    def forward(self, hidden: torch.Tensor, spikes: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, spikes[index])
        return hidden


class ThreeOtherQuestions(torch.nn.Module):
    """Three different branches on values, each answered by its own input."""

    def forward(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        if a.sum() > 0:
            x = x + a.sin()
        y = x * 2
        if b.max() > 1:
            y = torch.where(y > 0, y, -y) - b
        if c.mean() < 0:
            x = x * c.abs()  # read by the output below, in place of the x the first question left
        return torch.cat([x, y])


class DecidesEarlyActsLate(torch.nn.Module):
    """The first question's answer acts after the second question: its nodes follow the second's item()."""

    def forward(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        shift = bool(a.sum() > 0)
        if b.sum() > 0:
            x = x * 2
        if shift:
            x = x + 1
        return x


class AnswerChangesAShape(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            x = x[:2]
        if y.sum() > 0:
            y = y + 1
        return x.sum() + y


def _export_noting(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[fx2onnx.ONNXProgram, str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = fx2onnx.export(model, args)
    return program, "\n".join(str(w.message) for w in caught)


def test_empty_check_on_a_masked_size_captures_both_branches(check) -> None:
    """``if kept.numel() == 0: return torch.zeros(1)``: the general branch alone returned ``[]`` on an all-masked
    input (a silent wrong result); the special branch is captured too and an If chooses at run time."""
    x = torch.tensor([-1.0, 2.0, -3.0, 4.0, 5.0])
    all_masked = torch.tensor([-1.0, -2.0, 0.0, -0.0, -torch.finfo(torch.float32).max])
    one_kept = torch.tensor([-1.0, -2.0, torch.finfo(torch.float32).tiny, -4.0, -5.0])
    program, warned = _export_noting(EmptyCheckAfterMask(), (x,))
    assert "captured with size-oblivious guards" in warned
    assert "torch.export failed: GuardOnDataDependentSymNode" in warned
    assert "test_data_dependent.py" in warned and "kept.numel() == 0" in warned
    assert "both branches captured, the ONNX model's If chooses at run time" in warned
    assert "not checked at run time" not in warned
    (assumption,) = program.report.capture_assumptions
    assert "both branches captured" in assumption
    assert [node.op_type for node in program.model.graph].count("If") == 1
    check(
        EmptyCheckAfterMask(),
        (x,),
        run_with=[((example,), {}) for example in (x, all_masked, one_kept, torch.tensor([3.0, -1.0, 7.0, 0.5, -2.0]))],
    )
    (result,) = program.verify(all_masked)
    assert result.passed and tuple(program(all_masked)[0].shape) == (1,), result


def test_empty_check_with_a_dynamic_length_takes_the_right_branch_at_every_size(check) -> None:
    examples = [torch.tensor([]), torch.tensor([-1.0]), torch.tensor([2.0]), torch.tensor([-1.0, -2.0, -3.0])]
    examples += [torch.tensor([3.0, -1.0, 7.0, 0.5, -2.0, 1e30, -1e30])]
    check(
        EmptyCheckAfterMask(),
        (torch.tensor([-1.0, 2.0, -3.0, 4.0]),),
        dynamic_shapes=({0: torch.export.Dim("n")},),
        run_with=[((example,), {}) for example in examples],
    )


class OneKeptRowDiffers(torch.nn.Module):
    """Both branches compute something non-empty, and something else: a single kept value scales the input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        if kept.shape[0] == 1:
            return x * kept.sum() * 3
        return x + kept.sum()


class OneKeptRowBroadcast(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        if kept.shape[0] == 1:
            return x * kept  # broadcasts [n] by [u0]: torch cannot, even told u0 == 1 (torch._check)
        return x + kept.sum()


def test_branches_that_both_compute_other_non_empty_results(check) -> None:
    x = torch.tensor([1.0, -2.0, 3.0, -4.0])
    examples = [x, torch.tensor([-1.0, 5.0, -3.0, -4.0]), torch.tensor([-1.0, -5.0, -3.0, -4.0])]
    program = check(OneKeptRowDiffers(), (x,), run_with=[((example,), {}) for example in examples])
    # on the one-kept input, the general branch alone gave x + 5 (the old graph): eager gives x * 15
    (result,) = program.verify(examples[1])
    assert result.passed
    assert torch.equal(program(examples[1])[0], examples[1] * 15)


class SeveralKeptOrNot(torch.nn.Module):
    """A decision taken as True for the general branch (``u0 > 1``): the If runs the special capture where it is
    False."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        if kept.shape[0] > 1:
            return x + kept.sum()
        return x * 3


def test_a_decision_taken_as_true_runs_the_special_branch_where_it_is_false(check) -> None:
    x = torch.tensor([1.0, -2.0, 3.0, -4.0])
    examples = [x, torch.tensor([-1.0, 5.0, -3.0, -4.0]), -x.abs(), x.abs()]
    program = check(SeveralKeptOrNot(), (x,), run_with=[((example,), {}) for example in examples])
    assert [node.op_type for node in program.model.graph].count("If") == 1


class LinearInBothBranches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        if kept.numel() == 0:
            return self.linear(x) - 1
        return self.linear(x) + kept.sum()


def test_both_branches_read_the_models_weights_once(check) -> None:
    x = torch.tensor([[1.0, -2.0, 3.0, -4.0], [0.5, 0.25, -1.0, 2.0]])
    program = check(LinearInBothBranches(), (x,), run_with=[((x,), {}), ((-x.abs(),), {}), ((x.abs(),), {})])
    assert [node.op_type for node in program.model.graph].count("If") == 1
    weights = [value for value in program.model.graph.initializers.values() if value.shape and len(value.shape) == 2]
    assert len(weights) == 1, [value.name for value in weights]


def test_a_special_branch_torch_cannot_trace_keeps_the_general_branch_and_says_why() -> None:
    program, warned = _export_noting(OneKeptRowBroadcast(), (torch.tensor([1.0, -2.0, 3.0, -4.0]),))
    assert "Eq(u0, 1) taken as False" in warned and "the special branch could not be exported" in warned
    assert "the ONNX model computes the general branch only" in warned
    (result,) = program.verify(torch.tensor([1.0, 2.0, -3.0, 4.0]))
    assert result.passed, result


class SpecialBranchOfAnotherDtype(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        if kept.numel() == 0:
            return torch.zeros(1, dtype=torch.int64)
        return kept.cumsum(0)


def test_branches_of_other_dtypes_keep_the_general_branch_and_say_why() -> None:
    program, warned = _export_noting(SpecialBranchOfAnotherDtype(), (torch.tensor([1.0, -2.0, 3.0]),))
    assert "output 0 is FLOAT in the general branch, INT64 in the special one" in warned
    assert "the ONNX model computes the general branch only" in warned
    (assumption,) = program.report.capture_assumptions
    assert "not checked at run time: the general branch" in assumption
    assert "If" not in [node.op_type for node in program.model.graph]
    (result,) = program.verify(torch.tensor([1.0, 2.0, 3.0]))
    assert result.passed, result


class TwoEmptyChecks(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positive, negative = x[x > 0], x[x < 0]
        if positive.numel() == 0:
            return x
        if negative.numel() == 0:
            return x * 2
        return positive.cumsum(0)


def test_several_decisions_keep_the_general_branch_and_say_so() -> None:
    program, warned = _export_noting(TwoEmptyChecks(), (torch.tensor([1.0, -2.0, 3.0]),))
    assert "2 size-oblivious decisions of the model's code" in warned
    assert "the ONNX model computes the general branch only" in warned
    assert all("not checked at run time" in assumption for assumption in program.report.capture_assumptions)


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


def test_a_branch_on_a_value_captures_both_sides_in_an_if(check) -> None:
    x = torch.ones(3)
    examples = [x, -x, torch.zeros(3), torch.tensor([-0.0, 0.0, torch.finfo(torch.float32).tiny])]
    program, warned = _export_noting(BranchOnValue(), (x,))
    assert "if x.sum() > 0" in warned and "a value: both branches captured" in warned
    assert [node.op_type for node in program.model.graph].count("If") == 1
    assert not [node for node in program.model.graph if (node.name or "").startswith("fx2onnx_check")]
    check(BranchOnValue(), (x,), run_with=[((example,), {}) for example in examples])
    check(BranchOnValue(), (-x,), run_with=[((example,), {}) for example in examples])  # the other side first


def test_a_branch_on_a_value_leaves_no_partial_graph_on_stderr(check, capfd) -> None:
    """torch.export prints the graph traced so far when the trace meets the question; fx2onnx answers it, so the
    user's terminal gets neither that graph nor torch's "Unable to find user code" line (BART: both, per layer)."""
    x = torch.ones(3)
    check(BranchOnValue(), (x,), run_with=[((x,), {}), ((-x,), {})])
    printed = capfd.readouterr().err
    assert "def forward" not in printed and "Unable to find user code" not in printed, printed


def test_barts_float16_clamp_where_not_finite_matches_eager(check) -> None:
    finite = torch.tensor([[1.0, -2.0], [3.0, 0.5]], dtype=torch.float16)
    big = torch.tensor([[60000.0, -60000.0], [1.0, 2.0]], dtype=torch.float16)  # doubled: inf, clamped by eager
    nan = torch.tensor([[float("nan"), 1.0], [2.0, 3.0]], dtype=torch.float16)
    program = check(ClampWhereNotFinite(), (finite,), run_with=[((finite,), {}), ((big,), {}), ((nan,), {})])
    assert torch.isfinite(program(big)[0]).all()


def test_two_branches_on_values_fail_naming_the_line() -> None:
    with pytest.raises(CaptureError) as raised:
        fx2onnx.export(TwoBranchesOnValues(), (torch.ones(3),))
    message = str(raised.value)
    assert "test_data_dependent.py" in message and "if x.sum() > 0 and x.mean() > 1" in message
    assert "2 data-dependent branches in the model" in message and "remedy:" in message


@pytest.mark.parametrize("layers", [2, 3])
def test_a_branch_on_a_value_in_each_layer_joins_an_if_per_layer(check, monkeypatch, layers: int) -> None:
    """k questions, 2 captures (every answer flipped in the second): every combination of answers matches eager, with
    inf, -inf and NaN spikes at float16's extremes (60000 doubled overflows; the layer's linear of a clamped 65504
    does not)."""
    special_captures = _counting_special_captures(monkeypatch)
    torch.manual_seed(0)
    model = ClampedLayers(layers).half()
    hidden = torch.randn(3, 4, dtype=torch.float16)
    calm = torch.randn(layers, 3, 4, dtype=torch.float16)
    examples = []
    for overflowing in itertools.product([False, True], repeat=layers):
        for big in (60000.0, -65504.0, float("nan")):
            spikes = calm.clone()
            for index, overflows in enumerate(overflowing):
                if overflows:
                    spikes[index, index % 3, 1] = big
            examples.append(((hidden, spikes), {}))
    program = check(model, (hidden, calm), run_with=examples)
    if_nodes = [node for node in program.model.graph if node.op_type == "If"]
    assert len(if_nodes) == layers  # one per layer, each around its clamp: the layers' linears are not repeated
    assert sum(node.op_type == "Gemm" for node in program.model.graph) == layers
    assert len(special_captures) == 1 + (layers - 1).bit_length()  # every branch flipped; the bits of each's position


def _counting_special_captures(monkeypatch) -> list[object]:
    """The special captures of the exports that follow (their decisions), counted."""
    asked: list[object] = []
    emit = branch_join.emit_special_branch

    def counted(*args: object, **kwargs: object) -> object:
        asked.append(args[3])
        return emit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(branch_join, "emit_special_branch", counted)
    return asked


def test_three_different_branches_on_values_match_eager_in_every_combination(check, monkeypatch) -> None:
    """The third question's other side keeps x, which the first's also keeps: whether it is the x the first branch
    left or the original only the capture of that branch alone says (one per branch then: 4 captures)."""
    special_captures = _counting_special_captures(monkeypatch)
    x = torch.tensor([1.0, -2.0, 0.5])
    answers = {
        "a": (torch.tensor([0.5, 0.25, 1.0]), torch.tensor([-0.5, 0.25, -1.0])),
        "b": (torch.tensor([3.0, 0.0, -1.0]), torch.tensor([0.5, 1.0, -1.0])),
        "c": (torch.tensor([-3.0, 1.0, 0.0]), torch.tensor([3.0, -1.0, 0.0])),
    }
    examples = [((x, a, b, c), {}) for a, b, c in itertools.product(*answers.values())]
    examples.append(((x, torch.full((3,), float("inf")), torch.full((3,), float("nan")), -answers["c"][0]), {}))
    check(ThreeOtherQuestions(), examples[0][0], run_with=examples)
    assert len(special_captures) == 4
    check(ThreeOtherQuestions(), examples[-2][0], run_with=examples)  # the other answers first


def test_an_answer_acted_on_after_another_question_is_its_own(check, monkeypatch) -> None:
    """Every branch flipped at once puts both effects after the second item(): the capture with the second alone
    flipped shows that one of them is the first's, and one capture per branch is taken instead."""
    special_captures = _counting_special_captures(monkeypatch)
    x, yes, no = torch.tensor([1.0, -2.0]), torch.tensor([1.0, 0.5]), torch.tensor([-1.0, 0.5])
    examples = [((x, a, b), {}) for a, b in itertools.product([yes, no], repeat=2)]
    check(DecidesEarlyActsLate(), (x, yes, yes.clone()), run_with=examples)  # two inputs: not one aliased
    assert len(special_captures) == 4  # every branch flipped, the second alone, then each alone


def test_an_answer_that_changes_a_shape_fails_naming_the_line() -> None:
    with pytest.raises(CaptureError) as raised:
        fx2onnx.export(AnswerChangesAShape(), (torch.ones(3), torch.ones(3)))
    message = str(raised.value)
    assert "if x.sum() > 0" in message and "2 data-dependent branches in the model" in message
    assert "another dtype or shape" in message and "remedy:" in message


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


class DiffOfMasked(torch.nn.Module):
    """diff of a data-dependent length, n larger than some lengths (eager: empty where the length is at most n)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kept = x[x != 0]
        return torch.diff(kept, n=3), torch.diff(kept > 2, n=2, prepend=x[:1] > 2)


def test_diff_of_a_data_dependent_length_has_no_assumed_length(check) -> None:
    """The composite's `n > length` guard took the smallest length (2) as the only one: the model's shapes said 2
    and ONNX Runtime's GatherSliceToSplitFusion failed the run at 4 (fuzz finding); every length 0-6 matches."""
    lengths = []
    for kept in range(7):
        x = torch.tensor([1.0, -2.0, 4.0, 8.0, -16.0, 32.0])
        x[kept:] = 0
        lengths.append(((x,), {}))
    program = check(DiffOfMasked(), lengths[4][0], run_with=lengths)
    assert not program.report.capture_assumptions


class UnbindAtMostThree(torch.nn.Module):
    """unbind of at most K kept values: Python needs the count (the number of outputs), taken as K."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        first, second, third = x[x != 0][:3].unbind(0)
        return first, second * third, torch.stack([third, first])


def _kept_first(count: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Five values, the first `count` of them non-zero (extremes of the dtype among them)."""
    info = torch.finfo(dtype)
    values = torch.tensor([info.max, -2.5, info.tiny, 7.0, -info.max], dtype=dtype)
    values[count:] = 0
    return values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unbind_of_at_most_k_kept_values_has_eagers_0d_parts(check, dtype: torch.dtype) -> None:
    """torch's unbind squeezed each part only where it could prove its size 1, so at the count (min(3, u0)) taken
    as 3 the parts were 1-D where eager's are 0-d: the ONNX model (SequenceAt of a SplitToSequence, 0-d) failed the
    checker ('Inferred shape and existing shape differ in rank: (0) vs (1)'). Fewer kept values than the parts
    fail at run time on the count's check, never compute something else."""
    program = check(
        UnbindAtMostThree(),
        (_kept_first(3, dtype),),
        run_with=[((_kept_first(count, dtype),), {}) for count in (3, 4, 5)],
    )
    assert all(len(output.shape) == 0 for output in program(_kept_first(4, dtype))[:2])
    with pytest.raises(Exception, match="fx2onnx_check: Eq"):
        program(_kept_first(2, dtype))


class UnbindBoundedAbove(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kept = x[x != 0]
        torch._check(kept.shape[0] <= 3)
        return kept.unbind(0)


@pytest.mark.parametrize("model", [UnbindBoundedAbove(), Call(lambda x: x[x != 0].unbind(0))], ids=["bounded", "plain"])
def test_unbind_of_a_data_dependent_count_fails_naming_the_line_and_the_way_out(model, tmp_path) -> None:
    """The number of outputs is the data's: a bare count ``u0`` asked as an int was decided size-obliviously as a
    guard (sympy's Symbol is a Boolean too) and taken as 2, unchecked: the model failed the checker (unbind's parts
    1-D) or would have returned 2 parts for any count. Now it is an integer without a bound: a CaptureError before
    any file is written, naming the user's line and the way out."""
    path = tmp_path / "model.onnx"
    with pytest.raises(CaptureError) as raised:
        fx2onnx.export(model, (_kept_first(3),), path)
    message = str(raised.value)
    assert "unbind(0)" in message and "test_data_dependent.py" in message
    assert "aten::unbind: " in message and "kept[:K]" in message and "float32 (5,)" in message
    assert "taken as 2" not in message
    assert not path.exists()


class ChunkOfKept(torch.nn.Module):
    def __init__(self, chunks: int) -> None:
        super().__init__()
        self.chunks = chunks

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kept = x[x != 0]
        return tuple(part * 2 for part in kept.chunk(self.chunks))


def _first_nonzero(count: int, length: int = 8, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    info = torch.finfo(dtype)
    values = torch.tensor([info.max / 4, -info.max / 4, info.tiny, -1.5, 3.0, -info.tiny, 7.0, 1.0], dtype=dtype)
    values[count:] = 0
    return values[:length]


@pytest.mark.parametrize(
    ("chunks", "counts_made", "counts_refused"), [(2, (0, 2, 3, 4, 5, 8), (1,)), (3, (0, 3, 5, 6, 7), (1, 2, 4))]
)
def test_chunk_of_a_data_dependent_length_matches_eager_or_fails_naming_the_line(
    check, chunks: int, counts_made: tuple[int, ...], counts_refused: tuple[int, ...]
) -> None:
    """``kept.chunk(n)``: eager's number of parts is the data's (n for an empty tensor and wherever the last part is
    not empty, fewer otherwise). torch's decomposition asked it as an int and the capture failed
    (``Eq((u0+1)//2, 0)``); now there are n parts, each of eager's length at every count that makes n, and a count
    that makes fewer fails at run time naming the model's line, never returns another number of parts."""
    model = ChunkOfKept(chunks)
    program = check(model, (_first_nonzero(5),), run_with=[((_first_nonzero(n),), {}) for n in counts_made])
    (assumption,) = program.report.capture_assumptions
    assert f"chunk({chunks}) makes {chunks} parts" in assumption and "checked at run time" in assumption
    assert "NOT checked" not in assumption
    for count in counts_refused:
        assert len(model(_first_nonzero(count))) < chunks  # eager makes fewer
        with pytest.raises(Exception, match=r"fx2onnx_check: .*kept.chunk\(self.chunks\)"):
            program(_first_nonzero(count))


def test_intermediates_across_a_branch_on_a_value_compare_the_side_taken(check) -> None:
    """verify(intermediates=True) ran the general capture (``x.sum() > 0`` taken True, asserted ``u0 >= 1``) node
    by node in eager and raised at that assertion on an input taking the other side, which the ONNX model's If
    computes. Now the nodes before the If are compared, those the If computes are skipped saying why, and the
    outputs are compared with eager's on both sides."""
    finfo = torch.finfo(torch.float32)
    positive = torch.tensor([1.5, -2.0, finfo.max / 2])
    negative = torch.tensor([-1.5, 2.0, -finfo.max / 2])
    zero = torch.tensor([0.0, finfo.tiny, -finfo.tiny])
    program = check(BranchOnValue(), (positive,), run_with=[((x,), {}) for x in (positive, negative, zero)])
    for x, other_side in ((positive, False), (negative, True), (zero, True)):
        result = program.verify(x, intermediates=True)
        assert result.passed and result.first_mismatch is None, str(result)
        statuses = {c.node: c.status for c in result.intermediates}
        assert statuses["sum_1"] == "ok", statuses
        skipped = [c for c in result.intermediates if c.status == "skipped"]
        assert bool(skipped) == other_side, statuses
        assert all("other side of a branch" in c.note for c in skipped)


class EmptyCheckAndHalves(torch.nn.Module):
    """A data-dependent empty check beside a chunk of a dynamic dim, which torch.export captures again with its
    suggested fix applied."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kept = x[x != 0]
        if kept.numel() == 0:
            return torch.zeros(1), x.chunk(2)[1]
        first, second = x.chunk(2)
        return kept * 2, first + second.sum()


def test_a_retrace_does_not_count_its_decisions_twice(check) -> None:
    """The retrace (suggested fixes applied) asked ``numel() == 0`` again, and the decision recorded by the first
    trace stayed: two decisions, so no If, and the general branch alone returned [] on an all-zero input where eager
    returns zeros(1), silently. The capture keeps the last trace's decisions."""
    finfo = torch.finfo(torch.float32)
    x = torch.tensor([1.0, 0.0, 3.0, 2.0])
    examples = [x, torch.zeros(4), torch.tensor([finfo.max, -finfo.max, finfo.tiny, -0.0])]
    program = check(
        EmptyCheckAndHalves(),
        (x,),
        dynamic_shapes=({0: torch.export.Dim("n", min=2)},),
        run_with=[((example,), {}) for example in examples],
    )
    (assumption,) = program.report.capture_assumptions
    assert "both branches captured" in assumption


class SqueezedNonzero(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x).squeeze(0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
@pytest.mark.parametrize("rank", [0, 1])
def test_squeeze_of_a_data_dependent_dim_matches_eager_or_fails_naming_the_line(
    check, rank: int, dtype: torch.dtype
) -> None:
    """``nonzero(x).squeeze(0)``: eager drops the count's dim where it is 1 (a 0-d x of a nonzero value: shape [0],
    of zero: [0, 0]); torch.export decides it as not 1 without a guard, and the ONNX model gave [1, 0] silently
    (fuzzer seed 60002930). Counts 0 and 2 match eager in dtype, shape and values; count 1 fails at run time,
    naming the model's line (no graph of one rank can give eager's other rank)."""

    def values(count: int) -> torch.Tensor:
        nonzero = torch.tensor([0, 5, 0, -2][: 2 * count], dtype=dtype)
        if rank == 0:
            return torch.tensor(3 if count else 0, dtype=dtype)
        return torch.cat([nonzero, torch.zeros(4 - len(nonzero), dtype=dtype)])

    counts = (0,) if rank == 0 else (0, 2)
    model = SqueezedNonzero()
    program = check(model, (values(counts[-1]),), run_with=[((values(n),), {}) for n in counts])
    assert model(values(1)).dim() == 1 and torch.nonzero(values(1)).shape[0] == 1  # eager squeezes at count 1
    with pytest.raises(Exception, match=r"fx2onnx_check: Ne\(.*, 1\).*torch.nonzero\(x\).squeeze\(0\).*eager drops"):
        program(values(1))
    assert any(
        note.startswith("checked") and "squeeze(0) of a data-dependent" in note for note in program.report.dynamic_dims
    )


class SqueezedRows(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(0) * 2


@pytest.mark.parametrize("example", [1, 2])
def test_squeeze_of_a_dynamic_dim_matches_eager_or_fails_naming_the_line(check, example: int) -> None:
    """``x.squeeze(0)`` with a dynamic dim 0: traced size-obliviously (an example of 1 too), torch keeps the dim
    without a guard, and the ONNX model returned [1, 3] where eager returns [3] at size 1. Other sizes match eager;
    size 1 fails at run time naming the dim and the line."""
    model = SqueezedRows()
    dims = ({0: torch.export.Dim("rows")},)
    program = check(
        model, (torch.randn(example, 3),), dynamic_shapes=dims, run_with=[((torch.randn(n, 3),), {}) for n in (2, 5)]
    )
    with pytest.raises(Exception, match=r"fx2onnx_check: Ne\(rows, 1\).*x.squeeze\(0\).*eager drops"):
        program(torch.randn(1, 3))


class MedianOfTheMaxima(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.median(x[x == x.max()], dim=0).values


@pytest.mark.parametrize("dtype", [torch.int16, torch.float32])
def test_a_special_branch_whose_graph_would_not_load_fails_at_run_time_naming_the_line(
    check, dtype: torch.dtype
) -> None:
    """Fuzzer seed 60002751: the special branch of ``x[x == x.max()]`` of a 0-d x (nothing selected: NaN) meets
    ``median`` over the empty dim, where eager raises; its graph's Squeeze of that dim made the joined model one
    ONNX Runtime refused to load. That side now fails at run time naming the line; the model loads and matches eager
    on every input eager computes."""
    model = MedianOfTheMaxima()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = check(
            model,
            (torch.tensor(-3, dtype=dtype),),
            run_with=[((torch.tensor(v, dtype=dtype),), {}) for v in (-3, 0, 7)],
        )
    assert any("the special branch fails at run time" in str(warning.message) for warning in caught)
    (assumption,) = program.report.capture_assumptions
    assert "the special branch fails at run time" in assumption
    if dtype.is_floating_point:
        nan = torch.tensor(float("nan"), dtype=dtype)
        with pytest.raises(IndexError):
            model(nan)
        with pytest.raises(Exception, match=r"fx2onnx_check: .*x\[x == x.max\(\)\].*special branch fails at run time"):
            program(nan)
