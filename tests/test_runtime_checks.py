"""What the capture assumed is checked at run time: an input breaking an assumption fails in ONNX Runtime with a
node named for it, never a silent wrong result (fx2onnx._emit.runtime_checks, the lowering of aten._assert_scalar).

Each model here computed something else than eager (or failed on an unrelated node) in ONNX Runtime on the
violating input before the checks: a branch on ``size == 1``, a dim's range, a relation between dims, a
size-oblivious threshold on a data-dependent count.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest
import torch
from torch.export import Dim

import fx2onnx


def _export(model: torch.nn.Module, args: tuple[Any, ...], **options: Any) -> fx2onnx.ONNXProgram:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fx2onnx.export(model.eval(), args, **options)


def _session(program: fx2onnx.ONNXProgram, tmp_path: Path) -> onnxruntime.InferenceSession:
    """The session a user makes: default options, every graph optimization on."""
    path = tmp_path / "model.onnx"
    program.save(path)
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _run(session: onnxruntime.InferenceSession, *inputs: torch.Tensor) -> list[np.ndarray]:
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {name: x.numpy() for name, x in zip(names, inputs)})


def _matches_eager(session: onnxruntime.InferenceSession, model: torch.nn.Module, *inputs: torch.Tensor) -> None:
    with torch.no_grad():
        expected = model(*inputs)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    actual = _run(session, *inputs)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.dtype == want.numpy().dtype and got.shape == tuple(want.shape), (got, want)
        np.testing.assert_array_equal(got, want.numpy())


def _fails_naming(session: onnxruntime.InferenceSession, check: str, *inputs: torch.Tensor) -> str:
    with pytest.raises(Exception, match=r"fx2onnx_check: ") as raised:
        _run(session, *inputs)
    message = str(raised.value)
    assert re.search(check, message), message
    return message


class BranchesOnOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:  # traced size-obliviously: not 1
            return x * 2
        return x * 3


def test_a_branch_on_a_dynamic_size_of_one_whose_general_branch_differs_is_joined_in_an_if(tmp_path: Path) -> None:
    """A dim traced size-obliviously takes the general branch of ``size == 1``; compared with eager at size 1 at
    export, it differs there (x * 3, not x * 2): the model is captured at size 1 too and an If chooses at run time
    (the general branch alone computed 3 where eager says 2, silently). Said in the report."""
    model = BranchesOnOne()
    with pytest.warns(
        UserWarning, match=r"not checked at run time \(the general branch differs.*If chooses.*Ne\(n, 1\)"
    ):
        program = fx2onnx.export(model, (torch.ones(3),), dynamic_shapes=({0: Dim("n")},))
    note = next(note for note in program.report.dynamic_dims if "Ne(n, 1)" in note)
    assert "If chooses at run time" in note and "if x.shape[0] == 1" in note
    assert [node.op_type for node in program.model.graph].count("If") == 1
    session = _session(program, tmp_path)
    for size in (0, 1, 2, 5):
        _matches_eager(session, model, torch.arange(size, dtype=torch.float32))


class FlattensOneRow(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(-1) * 2 if x.shape[0] == 1 else x.sum(0)


def test_a_general_branch_with_the_special_shape_at_one_is_not_silently_wrong(tmp_path: Path) -> None:
    """The sum's [3] and the flattened row's [3] coincide at batch 1: ONNX Runtime computed the sum there, silently
    (eager doubles the row). Both branches are now in the model: batch 1 and 3 match eager."""
    model = FlattensOneRow()
    program = _export(model, (torch.randn(2, 3),), dynamic_shapes=({0: Dim("batch")},))
    session = _session(program, tmp_path)
    _matches_eager(session, model, torch.tensor([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0], [2.0, 2.0, 2.0]]))
    _matches_eager(session, model, torch.tensor([[1.0, -2.0, 3.0e38]]))
    _matches_eager(session, model, torch.tensor([[-3.0e38, 3.0e38, 1.0], [-3.0e38, 3.0e38, 1.0]]))


def test_an_unnamed_dynamic_dim_whose_branch_on_one_differs_refuses_one(tmp_path: Path) -> None:
    """Dim.DYNAMIC names no dim to make static for a size-1 capture (every such dim would be): size 1 is refused at run
    time naming the model's line, and the warning says to give the dim a Dim of its own."""
    model = FlattensOneRow()
    with pytest.warns(UserWarning, match=r"cannot be captured .*Dim.DYNAMIC/AUTO"):
        program = fx2onnx.export(model, (torch.randn(2, 3),), dynamic_shapes=({0: Dim.DYNAMIC},))
    session = _session(program, tmp_path)
    _matches_eager(session, model, torch.ones(3, 3))
    _fails_naming(session, r"Ne\(\w+, 1\).*x.view\(-1\) \* 2 if x.shape\[0\] == 1", torch.ones(1, 3))


class ProjectsThenFlattensOneRow(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.projection = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.projection(x)
        return y.view(-1) * 2 if x.shape[0] == 1 else y.sum(0)


def test_a_weightless_model_whose_branch_on_one_cannot_be_compared_gets_both_branches(tmp_path: Path) -> None:
    """Meta weights (bound by weights=) compute no values to compare at size 1: the special branch is captured too."""
    torch.manual_seed(0)
    model = ProjectsThenFlattensOneRow()
    with torch.device("meta"):
        weightless = ProjectsThenFlattensOneRow()
    example = (torch.empty(2, 3, device="meta"),)
    program = _export(weightless, example, dynamic_shapes=({0: Dim("batch")},), weights=model.state_dict())
    session = _session(program, tmp_path)
    for batch in (1, 3):
        inputs = torch.randn(batch, 3)
        with torch.no_grad():
            want = model(inputs).numpy()
        np.testing.assert_allclose(_run(session, inputs)[0], want, rtol=1e-5, atol=1e-6)


class FlattensOneRowToAnotherRank(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(-1) if x.shape[0] == 1 else x * 2


def test_a_special_branch_of_another_rank_refuses_size_one_naming_the_line(tmp_path: Path) -> None:
    """No If can join outputs of two ranks: size 1 fails at run time naming the model's line (it computed x * 2,
    silently), said in a warning at export; other sizes match eager."""
    model = FlattensOneRowToAnotherRank()
    with pytest.warns(
        UserWarning, match=r"differs from eager at size 1.*cannot be joined in an If \(output 0 has rank"
    ):
        program = fx2onnx.export(model, (torch.randn(2, 3),), dynamic_shapes=({0: Dim("batch")},))
    note = next(note for note in program.report.dynamic_dims if "Ne(batch, 1)" in note)
    assert note.startswith("checked at run time") and "size 1 is refused" in note
    session = _session(program, tmp_path)
    _matches_eager(session, model, torch.ones(3, 3))
    _fails_naming(session, r"Ne\(batch, 1\).*x.view\(-1\) if x.shape\[0\] == 1", torch.ones(1, 3))


class OneTokenAttention(torch.nn.Module):
    """A decoding step's shortcut, as LLaMA's attention takes it: one query token needs no causal mask. The general
    branch (the mask) gives the same result at one token, so it serves size 1 too."""

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        scores = query @ keys.transpose(-1, -2)
        length, total = query.shape[1], keys.shape[1]
        if length == 1:
            return scores.softmax(-1)
        allowed = torch.ones(length, total, dtype=torch.bool).tril(total - length)
        return scores.masked_fill(~allowed, float("-inf")).softmax(-1)


def test_a_branch_on_one_whose_general_branch_is_right_at_one_stays_unchecked(tmp_path: Path) -> None:
    """Compared at export with eager at one token, the general branch is the same: no check, no If, size 1 served."""
    model = OneTokenAttention()
    example, batch = (torch.randn(2, 4, 8), torch.randn(2, 6, 8)), Dim("batch")
    same_at_one = r"not checked at run time \(the general branch.*at size 1 at export: the same"
    with pytest.warns(UserWarning, match=same_at_one):
        program = fx2onnx.export(
            model, example, dynamic_shapes=({0: batch, 1: Dim("length")}, {0: batch, 1: Dim("total")})
        )
    assert not [node for node in program.model.graph if node.op_type == "If"]
    assert program.report.capture_seconds["size-1 comparison"] > 0.0  # measured: one eager run at one token
    assert not any("Ne(length, 1)" in note for note in program.report.dynamic_dims if note.startswith("checked"))
    session = _session(program, tmp_path)
    for length, total in ((1, 5), (3, 7), (1, 1)):
        query, keys = torch.randn(3, length, 8), torch.randn(3, total, 8)
        with torch.no_grad():
            want = model(query, keys).numpy()
        np.testing.assert_allclose(_run(session, query, keys)[0], want, rtol=1e-5, atol=1e-6)


class BloomLikeStep(torch.nn.Module):
    """Bloom's attention step: new tokens after a past, an additive mask as long as both (the graph's relation
    ``total == new + past``), and the queries reshaped with -1 (torch asks whether the new-token count is 1)."""

    def forward(self, query: torch.Tensor, past: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keys = torch.cat([past, query], 2)  # (batch, heads, past + new, 8)
        flat = query.transpose(1, 2).reshape(query.shape[0] * query.shape[2], -1, 8)
        scores = query @ keys.transpose(-1, -2) + mask[:, None, None, :]
        return scores.softmax(-1) @ keys, flat


def test_a_branch_on_one_is_compared_with_the_dims_tied_to_that_dim_moved_along(tmp_path: Path) -> None:
    """The size-1 comparison slices the example to one new token; the mask, tied to it by ``total == new + past``,
    stayed at the example's length, so the comparison could not run and the graph refused one new token at run time:
    an exported decoder (Bloom, with optimum's dims: new tokens, past, mask length) could not decode. The mask is
    now cut along (to past + 1): the general branch is the same at one token, and one token is served."""
    model = BloomLikeStep()
    batch, new, past, total = Dim("batch"), Dim("new"), Dim("past", min=0), Dim("total")
    example = (torch.randn(2, 2, 3, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 8))
    program = _export(model, example, dynamic_shapes=({0: batch, 2: new}, {0: batch, 2: past}, {0: batch, 1: total}))
    assert not any("Ne(new, 1)" in note for note in program.report.dynamic_dims if note.startswith("checked"))
    session = _session(program, tmp_path)
    for size, history in ((1, 5), (4, 0), (1, 9), (3, 2)):
        query, cache = torch.randn(3, 2, size, 8), torch.randn(3, 2, history, 8)
        inputs = (query, cache, torch.randn(3, size + history))
        with torch.no_grad():
            want = model(*inputs)
        for got, expected in zip(_run(session, *inputs), want):
            np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-6)


class EvenLength(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._check(x.shape[0] % 2 == 0)
        return x.reshape(2, -1).sum(0)


def test_torch_check_on_a_dynamic_size_is_checked_before_the_reshape_that_needs_it(tmp_path: Path) -> None:
    model = EvenLength()
    program = _export(model, (torch.ones(4),), dynamic_shapes=({0: Dim("n")},))
    assert "size-1 comparison" not in program.report.capture_seconds  # no `if n == 1` in the model: no extra run
    session = _session(program, tmp_path)
    for size in (0, 2, 6):
        _matches_eager(session, model, torch.arange(float(size)))
    _fails_naming(session, r"Mod\(n, 2\)|2\*\(\(n//2\)\)", torch.ones(3))  # was: Reshape's own error


class Unpatchifies(torch.nn.Module):
    """DiT's unpatchify (diffusers): the grid side as ``int(tokens ** 0.5)``, of an image whose height and width are
    dynamic."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.flatten(1, 2)
        side = int(tokens.shape[1] ** 0.5)
        return tokens.reshape(-1, side, side, x.shape[3]) * 2


def test_a_float_function_of_sizes_the_model_specialized_is_checked(tmp_path: Path) -> None:
    """torch.export puts no assertion node for a guard with a float function (``int(n ** 0.5) == 4``): the graph
    reshaped an 8 x 8 image's 64 tokens as four 4 x 4 grids, silently (DiT exported with dynamic latent sizes)."""
    model = Unpatchifies()
    dims = {1: Dim("h", min=1, max=64), 2: Dim("w", min=1, max=64)}
    program = _export(model, (torch.randn(2, 4, 4, 3),), dynamic_shapes=(dims,))
    session = _session(program, tmp_path)
    for height, width in ((4, 4), (2, 8), (1, 16)):  # 16 tokens: a 4 x 4 grid, as exported
        _matches_eager(session, model, torch.randn(2, height, width, 3))
    _fails_naming(session, r"TruncToInt\(FloatPow\(ToFloat\(h\*w\), 0.5\)\), 4\)", torch.randn(2, 8, 8, 3))


class AddsHalf(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x[: x.shape[0] // 2] + y


def test_a_relation_between_dims_the_model_assumes_is_checked(tmp_path: Path) -> None:
    model = AddsHalf()
    program = _export(model, (torch.arange(8.0), torch.ones(4)), dynamic_shapes=({0: Dim("n")}, {0: Dim("m")}))
    session = _session(program, tmp_path)
    for n in (0, 1, 2, 9):
        _matches_eager(session, model, torch.arange(float(n)), torch.full((n // 2,), 0.5))
    _fails_naming(session, r"n//2", torch.arange(8.0), torch.ones(1))  # was: a silent broadcast
    _fails_naming(session, r"n//2", torch.arange(8.0), torch.ones(3))  # was: Add's broadcast error


class Adds(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def test_one_dim_on_two_inputs_is_checked(tmp_path: Path) -> None:
    batch = Dim("batch")
    program = _export(Adds(), (torch.ones(4), torch.ones(4)), dynamic_shapes=({0: batch}, {0: batch}))
    session = _session(program, tmp_path)
    for size in (0, 1, 7):
        _matches_eager(session, Adds(), torch.arange(float(size)), torch.full((size,), -1.5))
    _fails_naming(session, r"batch", torch.arange(4.0), torch.ones(1))  # was: broadcast, 4 results


def test_a_derived_dim_is_checked(tmp_path: Path) -> None:
    class Halves(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x]) + y

    d = Dim("d")
    program = _export(Halves(), (torch.ones(2), torch.ones(4)), dynamic_shapes=({0: d}, {0: 2 * d}))
    session = _session(program, tmp_path)
    for size in (0, 1, 3):
        _matches_eager(session, Halves(), torch.arange(float(size)), torch.arange(float(2 * size)))
    _fails_naming(session, r"2\*d", torch.ones(1), torch.ones(1))  # was: broadcast, 2 results


def test_a_derived_dim_whose_symbol_is_no_inputs_dim_is_checked(tmp_path: Path) -> None:
    """``2 * Dim("half")`` on an input alone (a UNet's latent side, halved by its down block and concatenated again):
    an odd size is refused by a check naming it, not by a Reshape or Concat's error."""

    class Pairs(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(-1, 2).sum(1)

    half = Dim("half", min=1, max=16)
    program = _export(Pairs(), (torch.ones(6),), dynamic_shapes=({0: 2 * half},))
    session = _session(program, tmp_path)
    for size in (2, 8, 32):
        _matches_eager(session, Pairs(), torch.arange(float(size)))
    _fails_naming(session, r"input 'x' dim 0 == 2\*\w+ \(a multiple of 2", torch.ones(5))  # was: Reshape's error
    _fails_naming(session, r"<= 16", torch.ones(34))


@pytest.mark.parametrize(
    ("dim", "valid", "invalid", "check"),
    [
        (Dim("n", min=2), (2, 3, 9), 1, r"n >= 2"),
        (Dim("n", max=8), (0, 2, 8), 9, r"n <= 8"),
        (Dim("n", min=2, max=3), (2, 3), 0, r"n >= 2"),
    ],
)
def test_a_dims_range_is_checked(tmp_path: Path, dim: Any, valid: tuple[int, ...], invalid: int, check: str) -> None:
    model = BranchesOnOne()
    program = _export(model, (torch.ones(3),), dynamic_shapes=({0: dim},))
    session = _session(program, tmp_path)
    for size in valid:
        _matches_eager(session, model, torch.arange(float(size)))
    _fails_naming(session, check, torch.ones(invalid))
    assert any(check.replace("\\", "") in note for note in program.report.dynamic_dims)


class Above(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 4:
            return x * 2
        return x * 3


def test_a_range_the_models_code_implies_is_checked(tmp_path: Path) -> None:
    model = Above()
    with pytest.warns(UserWarning, match=r"min=5"):
        program = fx2onnx.export(model, (torch.ones(6),), dynamic_shapes=({0: Dim("n")},))
    session = _session(program, tmp_path)
    for size in (5, 11):
        _matches_eager(session, model, torch.arange(float(size)))
    _fails_naming(session, r"n >= 5", torch.ones(3))  # was: 2 * x where eager gives 3 * x


class CountThreshold(torch.nn.Module):
    """A threshold on a data-dependent count (torchvision's batched NMS): the small counts' branch is taken."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = torch.nonzero(x > 0.5).flatten()
        if kept.numel() > 3:
            return kept * 2
        return kept


class AtMostThree(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0.1][:3]
        return torch.zeros(len(kept), 2) + kept.unsqueeze(1)


def test_size_oblivious_choices_are_checked(tmp_path: Path) -> None:
    x = torch.tensor([0.9, 0.1, 0.7, 0.0, 0.2])
    model = CountThreshold()
    program = _export(model, (x,))
    assert any("checked at run time by the ONNX model" in a for a in program.report.capture_assumptions)
    session = _session(program, tmp_path)
    for example in (x, torch.zeros(5), torch.tensor([0.6, 0.0, 0.0, 0.0, 0.0]), torch.tensor([1.0, 1, 1, 0, 0])):
        _matches_eager(session, model, example)
    _fails_naming(session, r"u\d+ > 3|u\d+ <= 3", torch.ones(5))  # was: the small counts' result, not doubled

    model = AtMostThree()
    program = _export(model, (torch.tensor([0.5, 0.2, 0.9, 0.7, 0.05]),))
    session = _session(program, tmp_path)
    _matches_eager(session, model, torch.tensor([0.0, 0.3, 0.4, 0.8, 0.9]))
    _fails_naming(session, r"Eq\(", torch.tensor([0.0, 0.3, 0.0, 0.0, 0.0]))  # one row kept: was broadcast to 3


class EmptyEarlyReturn(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        if kept.numel() == 0:
            return kept
        return kept.cumsum(0)


def test_a_special_branch_returning_the_general_branchs_empty_result_needs_no_if(tmp_path: Path) -> None:
    """``numel() == 0`` taken as False: the general branch, right on an empty input here as in torchvision's NMS, is
    not asserted (it would refuse those inputs); the special branch, captured too, returns the same empty tensor, so
    the model has no If: the report says so."""
    model = EmptyEarlyReturn()
    program = _export(model, (torch.tensor([1.0, -2.0, 3.0]),), dynamic_shapes=({0: Dim("n")},))
    (assumption,) = program.report.capture_assumptions
    assert "the special branch returns the same empty outputs as the general one" in assumption
    assert "If" not in [node.op_type for node in program.model.graph]
    session = _session(program, tmp_path)
    for example in (torch.tensor([-1.0, -2.0]), torch.tensor([]), torch.tensor([4.0, -1.0, 2.0])):
        _matches_eager(session, model, example)


def test_the_checks_cost_one_reshape_and_leave_unchecked_models_alone(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    program = _export(model, (torch.randn(2, 4),), dynamic_shapes=({0: Dim("batch")},))
    assert not [node for node in program.model.graph if "fx2onnx_check" in (node.name or "")]
    program = _export(EvenLength(), (torch.ones(4),), dynamic_shapes=({0: Dim("n")},))
    gates = [node for node in program.model.graph if node.name.startswith("fx2onnx_checks_feed")]
    assert [node.op_type for node in gates] == ["Reshape"] and gates[0] is program.model.graph.outputs[0].producer()
    assert [value.name for value in program.model.graph.outputs] == ["output"]


class SmallCountsBranch(torch.nn.Module):
    """``kept.shape[0] < 3`` taken as True for the smallest sizes (2, the lower bound the model checks): the capture
    pins the data-dependent length to 2, and the graph's shapes say 2."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x != 0]
        torch._check(kept.shape[0] >= 2)
        if kept.shape[0] < 3:
            return kept * 2
        return kept * 3


class SplitOfMasked(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = torch.split(x[x != 0], [2, 2])
        return first * second


def _claimed_checks_are_in_the_model(program: fx2onnx.ONNXProgram, tmp_path: Path) -> list[str]:
    """Every check node the report names, in the saved model; every assumption it says is checked, there too."""
    import onnx

    path = tmp_path / "claims.onnx"
    program.save(path)
    saved = {node.name for node in onnx.load(str(path)).graph.node}
    claimed = [
        m.group(1)
        for note in program.report.dynamic_dims
        for m in [re.match(r"checked at run time \(ONNX node '(.*)'\)", note)]
        if m
    ]
    assert set(claimed) <= saved, set(claimed) - saved
    for assumption in program.report.capture_assumptions:
        if assumption.endswith("(checked at run time by the ONNX model)"):
            expression = assumption.split(" taken as ")[0]
            assert any(f"check: {expression}," in name for name in claimed), (assumption, claimed)
    return claimed


def test_a_data_dependent_size_pinned_at_capture_is_checked_in_the_saved_model(tmp_path: Path) -> None:
    """The checks of a size the capture decided (``u0 < 3`` with ``u0 >= 2``: u0 is 2) read a Shape that emission
    folded (the graph's shape said 2), and were gone while the report said "checked at run time": 3 kept values
    gave the small counts' result ([2, 6, 4] where eager gives [3, 9, 6])."""
    model = SmallCountsBranch()
    program = _export(model, (torch.tensor([1.0, 0.0, 2.0, 0.0]),))
    (assumption,) = program.report.capture_assumptions
    assert "checked at run time by the ONNX model" in str(assumption)
    claimed = _claimed_checks_are_in_the_model(program, tmp_path)
    assert any("u0 < 3" in name for name in claimed), claimed
    session = _session(program, tmp_path)
    _matches_eager(session, model, torch.tensor([0.0, -3.0, 0.0, 7.0]))
    # u0 <= 2 (torch's bound of the pinned size) or u0 < 3, whichever ONNX Runtime runs first
    _fails_naming(session, r"u\d+ (< 3|<= 2)", torch.tensor([1.0, 3.0, 2.0, 0.0]))

    model = SplitOfMasked()
    program = _export(model, (torch.tensor([1.0, 0.0, 2.0, 3.0, 4.0]),))
    assert any("u0 <= 4" in name or "u0 >= 4" in name for name in _claimed_checks_are_in_the_model(program, tmp_path))
    session = _session(program, tmp_path)
    _matches_eager(session, model, torch.tensor([5.0, 6.0, 0.0, 7.0, 8.0]))
    _fails_naming(session, r"u\d+ [<>]= 4", torch.tensor([1.0, 0.0, 0.0, 3.0, 4.0]))  # was Split's own error


def test_the_report_never_claims_a_check_the_model_lacks(tmp_path: Path) -> None:
    """A check removed after the report was written (here: by hand, as a pass might) is said not to be checked."""
    from fx2onnx._emit import runtime_checks

    program = _export(SmallCountsBranch(), (torch.tensor([1.0, 0.0, 2.0, 0.0]),))
    graph = program.model.graph
    check = next(node for node in graph if (node.name or "").startswith("fx2onnx_check: u0 < 3"))
    check.name = "renamed"
    check.metadata_props.pop("pkg.fx2onnx.runtime_check", None)
    notes, assumptions, false_claims = runtime_checks.claims_in_model(
        program.model, list(program.report.dynamic_dims), list(program.report.capture_assumptions)
    )
    assert len(false_claims) == 2, false_claims  # the note naming the node and the capture's assumption
    assert [a.endswith(f"({runtime_checks.MISSING})") for a in assumptions] == [True]
    assert sum(note.startswith(runtime_checks.MISSING) for note in notes) == 1


def test_the_models_own_torch_check_of_a_data_dependent_size_is_checked(tmp_path: Path) -> None:
    """``torch._check(kept.shape[0] >= 2)`` has the form of a size-oblivious decision (``u0 >= 2``), which is left
    unchecked as the general branch, and was reported 'not checked at run time (general branch)': with one kept
    value the model returned [2.] (declared f32[2]; ONNX Runtime only warned 'Expected shape from model of {2} does
    not match actual shape of {1}') where eager raises. The model's own check is checked; and values computed
    from the size the capture pinned (2) declare it symbolic, as the data makes it."""
    model = SmallCountsBranch()
    program = _export(model, (torch.tensor([1.0, 0.0, 2.0, 0.0]),))
    notes = "\n".join(program.report.dynamic_dims)
    assert re.search(r"checked at run time \(ONNX node 'fx2onnx_check: u0 >= 2, .*torch._check\(kept", notes), notes
    assert not re.search(r"not checked at run time .*u0 >= 2", notes), notes
    _claimed_checks_are_in_the_model(program, tmp_path)
    (output,) = program.model.graph.outputs
    assert [str(dim) for dim in output.shape] == ["u0"], output.shape
    session = _session(program, tmp_path)
    (declared,) = session.get_outputs()
    assert declared.shape == ["u0"], declared.shape
    finfo = torch.finfo(torch.float32)
    for kept in ([1.0, 0.0, 0.0, -2.0], [0.0, finfo.max, finfo.tiny, 0.0], [-finfo.max, 0.0, -finfo.tiny, 0.0]):
        _matches_eager(session, model, torch.tensor(kept))
    for kept in ([0.0, 0.0, 5.0, 0.0], [0.0, 0.0, 0.0, 0.0]):
        with pytest.raises(RuntimeError):
            model(torch.tensor(kept))  # eager refuses too
        _fails_naming(session, r"u0 >= 2, .*torch._check\(kept.shape\[0\] >= 2\)", torch.tensor(kept))


class ConvHead(torch.nn.Module):
    """A detection head's conv on dynamic height and width: the conv's fake kernel asserts ``1 < 3*height*width``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).flatten(2)


def test_an_assumption_every_nonempty_size_satisfies_is_checked_without_a_warning(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = ConvHead().eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = fx2onnx.export(
            model, (torch.randn(1, 3, 8, 8),), dynamic_shapes=({2: Dim("height"), 3: Dim("width")},)
        )
    assumed = [note for note in program.report.dynamic_dims or [] if "3*" in note]
    assert assumed and all("true for every size of at least 1" in note for note in assumed), assumed
    assert not [w for w in caught if "3*" in str(w.message)], [str(w.message) for w in caught]
    session = _session(program, tmp_path)
    with torch.no_grad():
        for height, width in ((1, 1), (2, 5), (9, 4)):
            x = torch.randn(1, 3, height, width)
            np.testing.assert_allclose(_run(session, x)[0], model(x).numpy(), rtol=1e-5, atol=1e-6)


class YoloLikeHead(torch.nn.Module):
    """A YOLO-style detection head: per cell and anchor, the conv's channels viewed as (anchors, outputs), moved
    last and flattened (torch.export asserts ``Ne(width*height, 1)`` for the view of the permuted tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2 * 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, height, width = x.shape
        cells = self.conv(x).view(batch, 2, 6, height, width).permute(0, 1, 3, 4, 2).contiguous()
        return cells.view(batch, -1, 6).sigmoid()


def test_a_product_of_dims_compared_with_one_is_served_at_one_as_in_eager(tmp_path: Path) -> None:
    """A 1x1 feature map was refused at run time by the check of ``Ne(width*height, 1)``, which eager computes: the
    general branch compared with eager at height 1 and width 1 at export is the same, so it is left unchecked."""
    torch.manual_seed(0)
    model = YoloLikeHead().eval()
    dims = {0: Dim("batch"), 2: Dim("height"), 3: Dim("width")}
    program = _export(model, (torch.randn(2, 3, 4, 5),), dynamic_shapes=(dims,))
    assert not [node for node in program.model.graph if node.op_type == "If"]
    note = next(note for note in program.report.dynamic_dims if "Ne(width*height, 1)" in note)
    assert note.startswith("not checked") and "at size 1 at export: the same" in note
    session = _session(program, tmp_path)
    for shape in ((1, 3, 1, 1), (3, 3, 1, 1), (2, 3, 1, 4), (1, 3, 5, 3)):
        x = torch.randn(*shape)
        with torch.no_grad():
            want = model(x).numpy()
        got = _run(session, x)[0]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class BranchesOnOneCell(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] * x.shape[2] == 1:  # traced size-obliviously: Ne(height*width, 1)
            return x * 2
        return x * 3


class BranchesOnOneToken(torch.nn.Module):
    def forward(self, new: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        tokens = torch.cat([past, new], 1)
        if new.shape[1] + past.shape[1] == 1:  # traced size-obliviously: Ne(new + past, 1)
            return tokens * 2
        return tokens * 3


def test_a_product_of_dims_whose_general_branch_differs_at_one_is_joined_in_an_if(tmp_path: Path) -> None:
    """``height * width == 1`` only at height 1 and width 1: the model captured there too, an If chooses."""
    model = BranchesOnOneCell()
    dims = {0: Dim("batch"), 1: Dim("height"), 2: Dim("width")}
    program = _export(model, (torch.randn(2, 3, 4),), dynamic_shapes=(dims,))
    assert [node.op_type for node in program.model.graph].count("If") == 1
    session = _session(program, tmp_path)
    for shape in ((2, 1, 1), (1, 1, 1), (2, 1, 3), (2, 3, 1), (0, 1, 1)):
        _matches_eager(session, model, torch.randn(*shape))


def test_a_sum_of_dims_whose_general_branch_differs_at_one_is_joined_in_an_if(tmp_path: Path) -> None:
    """``new + past == 1`` with new at least 1 (asked ``min=1``) and past at least 0: only at new 1 and past 0, where
    the model is captured too and an If chooses."""
    model = BranchesOnOneToken()
    batch = Dim("batch")
    program = _export(
        model,
        (torch.randn(2, 3), torch.randn(2, 4)),
        dynamic_shapes=({0: batch, 1: Dim("new", min=1)}, {0: batch, 1: Dim("past", min=0)}),
    )
    assert [node.op_type for node in program.model.graph].count("If") == 1
    session = _session(program, tmp_path)
    for new, past in ((1, 0), (1, 3), (2, 0), (3, 5)):
        _matches_eager(session, model, torch.randn(2, new), torch.randn(2, past))


def test_a_sum_of_dims_that_is_one_at_several_sizes_and_differs_refuses_them_naming_the_line(tmp_path: Path) -> None:
    """With new and past both allowed 0, ``new + past == 1`` at (1, 0) and (0, 1), each needing a special branch of
    its own: not joined, but refused at run time naming the model's line, with a warning at export."""
    model = BranchesOnOneToken()
    batch = Dim("batch")
    with pytest.warns(UserWarning, match=r"several sets of its dims' sizes make it 1"):
        program = fx2onnx.export(
            model,
            (torch.randn(2, 3), torch.randn(2, 4)),
            dynamic_shapes=({0: batch, 1: Dim("new", min=0)}, {0: batch, 1: Dim("past", min=0)}),
        )
    session = _session(program, tmp_path)
    _matches_eager(session, model, torch.randn(2, 2), torch.randn(2, 0))
    for new, past in ((1, 0), (0, 1)):
        _fails_naming(
            session,
            r"Ne\(past \+ new, 1\).*if new.shape\[1\] \+ past.shape\[1\] == 1",
            torch.randn(2, new),
            torch.randn(2, past),
        )


class PlaceholderCount(torch.nn.Module):
    """LLaVA's check that its prompt holds one image token per image feature, as transformers'
    ``torch_compilable_check`` writes it while tracing: ``torch._check_tensor_all`` of a 0-d bool tensor."""

    def forward(self, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        placeholders = ids == 7
        torch._check_tensor_all(placeholders.sum() * features.shape[-1] == features.numel())
        return features * 2.0 + placeholders.sum()


def test_the_models_torch_check_tensor_all_is_checked(tmp_path: Path) -> None:
    """``aten._is_all_true`` (``torch._check_tensor_all``'s condition) had no lowering: LLaVA, PaliGemma and
    Idefics3 were refused. It exports, agrees with eager where the check holds and fails naming it where not."""
    model = PlaceholderCount()
    ids, features = torch.tensor([[7, 7, 1, 2]]), torch.randn(2, 3)
    program = _export(model, (ids, features), dynamic_shapes=({1: Dim("sequence")}, {0: Dim("tokens")}))
    session = _session(program, tmp_path)
    for ids, features in (
        (torch.tensor([[7, 7, 1, 2]]), torch.randn(2, 3)),
        (torch.tensor([[1, 7, 7, 7, 2, 7]]), torch.randn(4, 3)),
    ):
        with torch.no_grad():
            expected = model(ids, features)
        (actual,) = _run(session, ids, features)
        assert actual.dtype == expected.numpy().dtype and actual.shape == tuple(expected.shape)
        np.testing.assert_array_equal(actual, expected.numpy())
    ids, features = torch.tensor([[7, 1, 1, 2]]), torch.randn(2, 3)
    with pytest.raises(RuntimeError):
        model(ids, features)  # eager refuses too
    _fails_naming(session, r"torch._check_tensor_all\(placeholders.sum\(\)", ids, features)
