"""fx2onnx.export takes torch.onnx.export's arguments: the same call works with either exporter."""

from __future__ import annotations

import os
import warnings
from typing import Any

import onnx
import pytest
import torch

import fx2onnx


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
    with pytest.raises(ValueError, match="without its weights"):
        fx2onnx.export(model, args, export_params=False)
    with pytest.raises(ValueError, match="weights as graph inputs"):
        fx2onnx.export(model, args, keep_initializers_as_inputs=True)
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
