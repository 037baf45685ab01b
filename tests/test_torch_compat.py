"""fx2onnx.export takes torch.onnx.export's arguments: the same call works with either exporter."""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

import onnx
import onnxscript
import pytest
import torch
from onnxscript import opset18 as op

import fx2onnx
from fx2onnx import examples


class TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * mask.unsqueeze(-1)


def _inputs(batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, length, 8), (torch.rand(batch, length) > 0.3).float()


def _dims(path: str) -> dict[str, list[str | int]]:
    graph = onnx.load(path, load_external_data=False).graph
    return {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.input, *graph.output]
    }


# A typical torch.onnx.export call, positional file name and the TorchScript-era dynamic_axes included.
TORCH_STYLE: dict[str, Any] = {
    "input_names": ["tokens", "mask"],
    "output_names": ["scores"],
    "dynamic_axes": {"tokens": {0: "batch", 1: "length"}, "mask": {0: "batch", 1: "length"}, "scores": {0: "batch"}},
    "opset_version": 18,
    "dynamo": True,
    "external_data": False,
}


@pytest.mark.parametrize("exporter", [fx2onnx.export, torch.onnx.export], ids=["fx2onnx", "torch.onnx"])
def test_the_same_torch_onnx_export_call_works_with_both(exporter: Any, tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exporter(TwoInputs().eval(), _inputs(2, 5), path, **TORCH_STYLE)
    onnx.checker.check_model(path, full_check=True)
    dims = _dims(path)
    assert dims["tokens"] == ["batch", "length", 8] and dims["mask"] == ["batch", "length"]
    assert dims["scores"][0] == "batch" and dims["scores"][2] == 4


def test_dynamic_axes_make_a_model_that_runs_at_other_sizes() -> None:
    model = TwoInputs().eval()
    program = fx2onnx.export(model, _inputs(2, 5), dynamic_axes={"x": [0, 1], "mask": {0: "batch", 1: "length"}})
    for batch, length in [(1, 3), (4, 9)]:
        inputs = _inputs(batch, length)
        assert all(r.passed for r in program.verify(*inputs)), (batch, length)
    names = {v.name: [d if isinstance(d, int) else str(d) for d in v.shape] for v in program.model.graph.inputs}
    assert names["mask"] == ["batch", "length"] and names["x"] == ["batch", "length", 8]


def test_a_mapping_as_third_argument_is_still_kwargs(tmp_path: os.PathLike[str]) -> None:
    x, mask = _inputs(2, 5)
    program = fx2onnx.export(TwoInputs().eval(), (x,), {"mask": mask})
    assert all(r.passed for r in program.verify(x, mask=mask))
    with pytest.raises(TypeError, match="keyword arguments twice"):
        fx2onnx.export(TwoInputs().eval(), (x,), {"mask": mask}, kwargs={"mask": mask})


def test_what_fx2onnx_does_not_make_is_refused_with_the_reason() -> None:
    model, args = TwoInputs().eval(), _inputs(2, 5)
    with pytest.raises(ValueError, match="TorchScript exporter"):
        fx2onnx.export(model, args, dynamo=False)
    with pytest.raises(ValueError, match="not both"):
        fx2onnx.export(model, args, dynamic_axes={"x": [0]}, dynamic_shapes={"x": {0: torch.export.Dim.DYNAMIC}})
    with pytest.raises(TypeError, match="unexpected keyword arguments: no_such_option"):
        fx2onnx.export(model, args, no_such_option=1)
    with pytest.warns(UserWarning, match="training=.* is ignored"):
        fx2onnx.export(model, args, training=torch.onnx.TrainingMode.TRAINING)


def test_report_true_and_dump_exported_program_write_to_artifacts_dir(tmp_path: os.PathLike[str]) -> None:
    folder = os.path.join(tmp_path, "artifacts")  # created on demand
    fx2onnx.export(TwoInputs().eval(), _inputs(2, 5), report=True, dump_exported_program=True, artifacts_dir=folder)
    written = sorted(os.listdir(folder))
    assert written == ["TwoInputs_exported_program.txt", "TwoInputs_fx2onnx_report.md"]
    with open(os.path.join(folder, "TwoInputs_exported_program.txt"), encoding="utf-8") as file:
        assert "ExportedProgram" in file.read()


def _input_dims(program: fx2onnx.ONNXProgram) -> dict[str, list[str | int]]:
    return {v.name: [d if isinstance(d, int) else str(d) for d in v.shape] for v in program.model.graph.inputs}


@pytest.mark.parametrize(
    "dynamic_shapes",
    [
        ({0: "batch", 1: "length"}, {0: "batch", 1: "length"}),
        (("batch", "length", None), ("batch", "length")),
        {"x": {0: "batch", 1: "length"}, "mask": ["batch", "length"]},
    ],
    ids=["dicts", "tuples", "by-name"],
)
def test_axis_names_as_strings_become_named_dynamic_dims(dynamic_shapes: Any) -> None:
    program = fx2onnx.export(TwoInputs().eval(), _inputs(2, 5), dynamic_shapes=dynamic_shapes)
    assert _input_dims(program) == {"x": ["batch", "length", 8], "mask": ["batch", "length"]}
    for batch, length in [(1, 1), (3, 7)]:
        assert all(r.passed for r in program.verify(*_inputs(batch, length))), (batch, length)


class NestedInputs(torch.nn.Module):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor], extra: dict[str, torch.Tensor]) -> torch.Tensor:
        return pair[0] * pair[1] + extra["bias"]


def test_axis_names_as_strings_in_nested_inputs() -> None:
    x, y, bias = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    program = fx2onnx.export(
        NestedInputs(), ((x, y), {"bias": bias}), {}, dynamic_shapes=((("n", None), {0: "n"}), {"bias": {0: "n"}})
    )
    assert [dims[0] for dims in _input_dims(program).values()] == ["n", "n", "n"]
    x, y, bias = torch.randn(6, 4), torch.randn(6, 4), torch.randn(6, 4)
    assert all(r.passed for r in program.verify((x, y), {"bias": bias}))


class OptionalMask(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        return x * scale if mask is None else x * mask.unsqueeze(-1) * scale


def test_a_dict_last_in_args_holds_keyword_arguments_as_in_torch_onnx() -> None:
    x, mask = _inputs(2, 5)
    program = fx2onnx.export(
        OptionalMask(),
        (x, {"mask": mask, "scale": 2.0}),
        input_names=["tokens", "keep"],
        dynamic_axes={"tokens": {0: "batch"}, "keep": {0: "batch"}},
    )
    assert _input_dims(program) == {"tokens": ["batch", 5, 8], "keep": ["batch", 5]}
    x, mask = _inputs(4, 5)
    results = program.verify(x, mask=mask, scale=2.0)
    assert all(r.passed for r in results) and results[0].expected_shape == (4, 5, 8)
    # An empty dict last means "no keyword arguments"; a dict whose keys are no parameters is a positional input.
    assert len(fx2onnx.export(OptionalMask(), (x, {})).model.graph.inputs) == 1
    program = fx2onnx.export(NestedInputs(), ((x, x), {"bias": x}))
    assert all(r.passed for r in program.verify((x, x), {"bias": x}))


@pytest.mark.parametrize("size", [0, 1])
def test_dynamic_dims_with_an_example_size_of_0_or_1_stay_dynamic(size: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    program = fx2onnx.export(model, (torch.randn(size, 8),), dynamic_shapes=({0: "batch"},))
    assert _input_dims(program) == {"input": ["batch", 8]} or list(_input_dims(program).values()) == [["batch", 8]]
    assert not program.report.dynamic_dims
    for batch in (0, 1, 5):
        assert all(r.passed for r in program.verify(torch.randn(batch, 8))), batch


class SplitsInTwo(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(0, (2, -1)).sum(0)  # the size must be even


class AddsSlices(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y[:, :3]  # x's dim 1 must be 3, y's dim 0 must be x's


def test_a_dim_the_model_constrains_is_refined_with_a_warning_and_in_the_report() -> None:
    dims = {"x": {0: torch.export.Dim("a"), 1: torch.export.Dim("b")}, "y": {0: torch.export.Dim("c")}}
    with pytest.warns(UserWarning, match=r"constrained by the model's code"):
        program = fx2onnx.export(AddsSlices(), (torch.randn(2, 3), torch.randn(2, 3)), dynamic_shapes=dims)
    notes = program.report.dynamic_dims
    # b's note names the model's line that fixed it (c = a is a relation between dims: no guard fixes it to a number)
    specialized = r"b = 3 \(specialized by the model's code at test_torch_compat\.py:\d+ in forward: return x \+ y"
    assert any(re.search(specialized, note) for note in notes), notes
    assert any(note.endswith("c = a") for note in notes), notes
    assert "c = a" in program.report.to_markdown()
    assert _input_dims(program) == {"x": ["a", 3], "y": ["a", 3]}
    for size in (1, 5):
        assert all(r.passed for r in program.verify(torch.randn(size, 3), torch.randn(size, 3)))


class BranchesOnExport(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():
            return x + 1
        return x - 1


@pytest.mark.parametrize("strict", [False, True])
def test_is_in_onnx_export_is_true_while_capturing(strict: bool) -> None:
    x = torch.zeros(3)
    program = fx2onnx.export(BranchesOnExport(), (x,), strict=strict)
    assert torch.equal(program(x)[0] if isinstance(program(x), (list, tuple)) else program(x), torch.ones(3))
    assert not torch.onnx.is_in_onnx_export()  # and false again afterwards
    assert torch.equal(BranchesOnExport()(x), -torch.ones(3))


@onnxscript.script()
def abs_float(self: onnxscript.FLOAT) -> onnxscript.FLOAT:
    return op.Max(self, op.Neg(self))


@onnxscript.script()
def abs_int(self: onnxscript.INT64) -> onnxscript.INT64:
    return op.Abs(self)


def test_custom_translation_table_takes_a_list_chosen_by_dtype() -> None:
    """torch.onnx's form: target -> [functions]; each node gets the one whose type constraints fit its dtypes
    (torch 2.13's torch.onnx.export refuses a list: "should be a single callable, not a sequence")."""

    class TwoAbs(torch.nn.Module):
        def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.abs(), n.abs()

    x = torch.tensor([-1.5, 0.0, torch.finfo(torch.float32).max, -torch.finfo(torch.float32).max])
    n = torch.tensor([torch.iinfo(torch.int64).max, -3, 0, torch.iinfo(torch.int64).min + 1])
    for table in ([abs_int, abs_float], [abs_float, abs_int]):
        program = fx2onnx.export(TwoAbs(), (x, n), custom_translation_table={torch.ops.aten.abs.default: table})
        chosen = {d.node: d.chosen.implementation.name for d in program.report.decisions if d.target == "aten::abs"}
        assert sorted(chosen.values()) == ["user:abs_float", "user:abs_int"], chosen
        assert all(d.perfect for d in program.report.decisions if d.target == "aten::abs")
        assert all(r.passed for r in program.verify(x, n))


def test_assumptions_on_dynamic_dims_the_model_makes_are_checked_at_run_time() -> None:
    """Dim.AUTO lets torch.export defer its guards to runtime assertions: the ONNX model checks them, and the warning
    and the report say so (an odd size fails in ONNX Runtime naming the check, not in its Reshape)."""
    with pytest.warns(UserWarning, match=r"checked at run time \(ONNX node 'fx2onnx_check: .*Mod\(s\d+, 2\)"):
        program = fx2onnx.export(SplitsInTwo(), (torch.randn(6, 3),), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    assert any("Mod(" in note for note in program.report.dynamic_dims)
    assert all(r.passed for r in program.verify(torch.randn(10, 3)))
    assert all(r.passed for r in program.verify(torch.randn(0, 3)))
    with pytest.raises(Exception, match=r"fx2onnx_check: .*s\d+//2"):
        program(torch.randn(5, 3))


class AddsTwoInputs(torch.nn.Module):
    """Its code makes the batches of `x` and `y` equal (the sum broadcasts them)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + y


def _dynamic_shape_warnings(export: Any) -> tuple[fx2onnx.ONNXProgram, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = export()
    return program, [str(w.message) for w in caught if "more than the model allows" in str(w.message)]


@pytest.mark.parametrize(
    "dynamic_shapes", [{"x": {0: "batch"}, "y": {0: "batch"}}, ({0: "batch"}, {0: "batch"})], ids=["by-name", "tuple"]
)
def test_a_name_several_axes_share_is_one_dim_not_an_assumption_of_the_model(dynamic_shapes: Any) -> None:
    """Axes given one name are one dim, as torch.export's shared Dim: the model's code equating them is no news (no
    warning), the ONNX inputs share the name, and inputs whose batches differ are refused at run time."""
    model, x, y = AddsTwoInputs().eval(), torch.randn(2, 4), torch.randn(2, 3)
    program, warned = _dynamic_shape_warnings(lambda: fx2onnx.export(model, (x, y), dynamic_shapes=dynamic_shapes))
    assert warned == []
    assert _input_dims(program) == {"x": ["batch", 4], "y": ["batch", 3]}
    assert all(r.passed for r in program.verify(torch.randn(5, 4), torch.randn(5, 3)))
    with pytest.raises(Exception, match=r"batch|fx2onnx_check"):
        program(torch.randn(5, 4), torch.randn(6, 3))


def test_names_the_model_equates_are_still_warned_about() -> None:
    model, x, y = AddsTwoInputs().eval(), torch.randn(2, 4), torch.randn(2, 3)
    program, warned = _dynamic_shape_warnings(
        lambda: fx2onnx.export(model, (x, y), dynamic_shapes=({0: "batch"}, {0: "rows"}))
    )
    assert len(warned) == 1 and "assumed by the model's code" in warned[0]
    with pytest.raises(Exception, match=r"fx2onnx_check"):
        program(torch.randn(5, 4), torch.randn(6, 3))


def test_dynamic_axes_of_a_transformers_model_as_torch_onnx_users_write_them() -> None:
    """GPT-2 with the legacy dynamic_axes (`batch`, `sequence` on ids and mask): its `view(batch_size, -1)` made
    torch.export defer `Mod(batch*seq, batch) == 0` and the like when each axis was a dim of its own, which fx2onnx
    then warned about as the model's assumptions."""
    model = examples.transformers_model("gpt2", "small").eval()
    ids, mask = torch.randint(0, 100, (2, 7)), torch.ones(2, 7, dtype=torch.int64)
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    program, warned = _dynamic_shape_warnings(
        lambda: fx2onnx.export(
            model, (ids,), kwargs={"attention_mask": mask}, input_names=list(axes), dynamic_axes=axes
        )
    )
    assert warned == []
    ids, mask = torch.randint(0, 100, (3, 5)), torch.ones(3, 5, dtype=torch.int64)
    mask[0, :2] = 0
    assert all(r.passed for r in program.verify(ids, attention_mask=mask))
