"""Arithmetic on symbolic scalars (dynamic dims, values read with ``.item()``), data-dependent capture errors,
and the optimizer's log noise.

Each model is exported with a dynamic first dim and run in ONNX Runtime at sizes other than the example's,
so a value frozen at export time fails.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable

import pytest
import torch

import fx2onnx

from conftest import assert_exports_and_matches as check

N = torch.export.Dim("n", min=4, max=100)


class Scalar(torch.nn.Module):
    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function(x)


CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sym_max": lambda x: x.new_ones(torch.sym_max(x.shape[0], 6)),
    "builtin_max": lambda x: x.new_ones(max(x.shape[0], 6)),
    "sym_min": lambda x: x.new_ones(torch.sym_min(x.shape[0], 6)),
    "sym_ite": lambda x: x.new_ones(torch.sym_ite(x.shape[0] > 6, x.shape[0], 2 * x.shape[0])),
    "sym_not": lambda x: x * torch.sym_not(x.shape[0] == 6),
    "sym_float": lambda x: x * torch.sym_float(x.shape[0]),
    "sym_sqrt": lambda x: x * torch.sym_sqrt(x.shape[0]),
    "sym_int": lambda x: x.new_ones(torch.sym_int(x.shape[0] / 2)),
    # Python's // rounds toward -inf: -4 // 3 == -2 (ONNX's integer Div truncates to -1)
    "floordiv_negative_dividend": lambda x: x * ((x.shape[0] - 10) // 3),
    "floordiv_negative_divisor": lambda x: x * (x.shape[0] // -4),
    "floordiv_positive": lambda x: x * (x.shape[0] // 4),
    "float_floordiv": lambda x: x * (x.sum().item() // 0.3),
    "item_sym_ite": lambda x: x * torch.sym_ite((x.sum() > 0).item(), 1, 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_symbolic_scalar_function(name: str) -> None:
    torch.manual_seed(0)
    sizes = (7, 4, 11, 6)
    check(
        Scalar(CASES[name]),
        (torch.randn(6, dtype=torch.float64),),
        dynamic_shapes=({0: N},),
        run_with=[((torch.randn(n, dtype=torch.float64) * 3,), {}) for n in sizes]
        + [((-torch.rand(n, dtype=torch.float64) - 0.5,), {}) for n in sizes],  # negative sums: other branches
    )


def test_data_dependent_branch_error_names_the_line_and_the_remedies() -> None:
    class BranchOnValue(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # the line the error must show
                return x * 2
            if x.mean() < -1:  # a second branch on a value: fx2onnx's If joins the sides of one only
                return x * 3
            return x - 1

    line = inspect.getsourcelines(BranchOnValue.forward)[1] + 1
    with pytest.raises(fx2onnx.CaptureError) as raised:
        fx2onnx.export(BranchOnValue(), (torch.randn(3),))
    message = str(raised.value)
    assert f"test_symbolic_scalars.py:{line} in forward: if x.sum() > 0:" in message
    assert "torch.cond(" in message and "torch.where(" in message and "torch._check(" in message


def test_model_library_line_counts_as_the_users_code() -> None:
    """A model defined in an installed package (transformers, timm...) is where the failing line is."""
    from fx2onnx.errors import is_user_file

    assert is_user_file("/venv/lib/python3.11/site-packages/transformers/models/bart/modeling_bart.py")
    assert not is_user_file("/venv/lib/python3.11/site-packages/onnxscript/optimizer/_constant_folding.py")
    assert not is_user_file(torch.__file__)
    assert not is_user_file(fx2onnx.__file__)
    assert not is_user_file("<string>")


class ConstantGather(torch.nn.Module):
    """A gather of constants that the optimizer's constant folding cannot evaluate (ONNX's reference
    GatherElements takes at most 64 distinct values), so it logs a warning and keeps the node."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(128).reshape(1, 128))
        self.register_buffer("index", torch.arange(12).reshape(1, 12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.gather(self.table, 1, self.index)


FOLDING_LOGGER = "onnxscript.optimizer._constant_folding"


def test_unactionable_optimizer_warnings_stay_off_the_terminal(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check(ConstantGather(), (torch.zeros(1, 12, dtype=torch.long),))
    assert not [r for r in caplog.records if r.name == FOLDING_LOGGER]


class SplitTable(torch.nn.Module):
    """A constant table split in two, as GPT-J's sin/cos: the folder leaves a Split of several outputs, and says so."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(8, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sin, cos = torch.split(self.table, 3, dim=-1)
        return x * sin + cos


def test_a_constant_split_in_several_outputs_is_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        check(SplitTable(), (torch.randn(8, 3),))
    assert not [r for r in caplog.records if r.name == FOLDING_LOGGER]


def test_optimizer_warnings_reach_a_user_who_asked_for_them(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=FOLDING_LOGGER):
        fx2onnx.export(ConstantGather(), (torch.zeros(1, 12, dtype=torch.long),))
    assert any(r.getMessage().startswith("Evaluation failed") for r in caplog.records if r.name == FOLDING_LOGGER)
    assert not logging.getLogger(FOLDING_LOGGER).filters  # the filter is removed after the export


def test_sym_sqrt_matches_python() -> None:
    program = fx2onnx.export(
        Scalar(lambda x: x * torch.sym_sqrt(x.shape[0])), (torch.ones(6),), dynamic_shapes=({0: N},)
    )
    (output,) = program(torch.ones(10))
    assert torch.allclose(output, torch.full((10,), math.sqrt(10)))


def test_dynamic_shapes_the_model_constrains_get_torchs_fix_applied_with_a_warning() -> None:
    class NeedsFour(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.narrow(0, 0, 4) * 2  # guards x.shape[0] >= 4

    # As torch.onnx's exporter: re-captured with torch.export's suggested fix, but never silently.
    with pytest.warns(UserWarning, match=r"constrained by the model's code .*n = Dim\('n', min=4, max=50\)"):
        program = fx2onnx.export(
            NeedsFour(), (torch.randn(6),), dynamic_shapes=({0: torch.export.Dim("n", min=1, max=50)},)
        )
    assert any("min=4" in note for note in program.report.dynamic_dims)
    assert "min=4" in program.report.to_markdown()
    for size in (4, 9):
        assert all(r.passed for r in program.verify(torch.randn(size)))


class ExpandsPositionsToTheBatch(torch.nn.Module):
    """transformers' masking (masking_utils._preprocess_mask_arguments): positions made for one row are expanded
    to the batch where it is not 1; for a batch of 1 the expand does nothing, so either branch is right there."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1]).unsqueeze(0)
        if x.shape[0] != positions.shape[0]:
            positions = positions.expand(x.shape[0], -1)
        return x * positions + mask


def test_a_batch_of_one_as_example_keeps_the_batch_dynamic() -> None:
    """The common call: a batch of 1 as the example, the batch asked dynamic. The size-1 example takes the model's
    `batch != 1` branch the other way, and torch.export (as torch.onnx.export's) pins the batch to 1: an ONNX
    model refusing every other batch. It is captured again at size 2 and serves every batch, with a warning."""
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=64)
    with pytest.warns(UserWarning, match=r"batch: traced at size 2, not the example's 1"):
        program = check(
            ExpandsPositionsToTheBatch(),
            (torch.randn(1, 5), torch.randn(1, 5)),
            dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}),
            run_with=[((torch.randn(b, s), torch.randn(b, s)), {}) for b, s in ((3, 7), (1, 5), (1, 1), (2, 4))],
        )
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "seq"]


class NeedsBatchOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[1]) * 2 if x.shape[0] == 1 else x.sum(0)  # the size-2 capture cannot serve 1


def test_a_dim_the_model_needs_at_one_stays_pinned_and_the_warning_says_how_to_keep_it_dynamic() -> None:
    with pytest.warns(UserWarning, match=r"batch = 1 \(the example's size 1 .*give an example of size 2 or more"):
        program = fx2onnx.export(
            NeedsBatchOne(), (torch.randn(1, 5),), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=8)},)
        )
    assert all(r.passed for r in program.verify(torch.randn(1, 5)))


class ReturnsNumbers(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        return x + 1, x.shape[0] * 2, 3


def test_python_numbers_among_the_outputs_are_verified() -> None:
    program = check(ReturnsNumbers(), (torch.randn(5),), dynamic_shapes=({0: N},), run_with=[((torch.randn(9),), {})])
    results = program.verify(torch.randn(7))
    assert [(r.expected_dtype, r.expected_shape, r.passed) for r in results] == [
        ("float32", (7,), True),
        ("int64", (), True),
        ("int64", (), True),
    ]
