"""The export report (Markdown and SARIF 2.1.0), failure messages, and verify(intermediates=True).

Each scenario exports a real model; the SARIF logs are validated against the official OASIS schema
(tests/data/sarif-schema-2.1.0.json) and every result must point at the line of this file the
node came from.
"""

from __future__ import annotations

import copy
import json
import pathlib

import jsonschema
import pytest
import torch
from onnxscript import FLOAT
from onnxscript import opset18 as op

import fx2onnx

SCHEMA = json.loads((pathlib.Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
THIS_FILE = pathlib.Path(__file__).resolve()


# --- a custom op, so the tests control what registers for it ------------------------------------------
@torch.library.custom_op("fx2onnx_report_test::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def scale_in_float(x: FLOAT) -> FLOAT:
    """Correct, but takes float only: an int input needs a Cast in, and a Cast back to eager's int64."""
    return op.Mul(x, op.Constant(value_float=2.0))


def scale_wrong(x):
    """A deliberately wrong lowering: multiplies by 3."""
    return op.Mul(x, op.CastLike(op.Constant(value_float=3.0), x))


SCALE = torch.ops.fx2onnx_report_test.scale.default


class MixedIntFloat(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * n  # int64 * float32
        m = torch.ops.fx2onnx_report_test.scale(n)  # LINE: scale(n)
        return torch.relu(y), m + 1


class ScaledRelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v, _ = torch.max(x, dim=1)  # a multi-output node before the wrong one
        y = torch.relu(x) + v.unsqueeze(1)
        z = torch.ops.fx2onnx_report_test.scale(y)  # LINE: scale(y)
        return torch.tanh(z)


def line_of(marker: str) -> int:
    """The line of this file carrying `# LINE: marker`."""
    for number, line in enumerate(THIS_FILE.read_text().splitlines(), start=1):
        if line.rstrip().endswith(f"# LINE: {marker}"):
            return number
    raise AssertionError(f"no line marked {marker!r}")


def validated_sarif(path: pathlib.Path) -> dict:
    log = json.loads(path.read_text())
    validator = jsonschema.Draft4Validator(SCHEMA, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(log)]
    assert not errors, "\n".join(errors[:10])
    return log


def results_of(log: dict, rule_id: str) -> list[dict]:
    return [r for r in log["runs"][0]["results"] if r["ruleId"] == rule_id]


def points_at(result: dict, line: int) -> bool:
    physical = result["locations"][0]["physicalLocation"]
    return physical["artifactLocation"]["uri"] == THIS_FILE.as_uri() and physical["region"]["startLine"] == line


# --- a successful export with Casts ---------------------------------------------------------------------
def test_successful_export_with_casts_reports_every_decision(tmp_path: pathlib.Path) -> None:
    args = (torch.randn(3, 4), torch.arange(4))
    md, sarif, model_path = tmp_path / "r.md", tmp_path / "r.sarif", tmp_path / "m.onnx"
    program = fx2onnx.export(
        MixedIntFloat(),
        args,
        custom_translation_table={SCALE: scale_in_float},
        verify=True,
        report=[md, sarif],
        f=model_path,
    )
    assert model_path.exists()
    assert all(v.passed for v in program.report.verification), program.report.verification

    casts = program.report.all_casts()
    scale_casts = {(c.from_dtype, c.to_dtype, c.reason) for c in casts if c.node == "scale"}
    assert scale_casts == {("i64", "f32", "dispatch"), ("f32", "i64", "eager-dtype")}
    assert any(c.node == "mul" and (c.from_dtype, c.to_dtype) == ("i64", "f32") for c in casts), casts

    text = md.read_text()
    assert "Export succeeded." in text
    assert "| torch.export(non-strict) |" in text  # the capture table
    scale_row = next(line for line in text.splitlines() if line.startswith("| `fx2onnx_report_test::scale` |"))
    assert "| 1 | `user:scale_in_float` | cast | 1 dispatch, 1 eager-dtype |" in scale_row
    assert f"test_report.py:{line_of('scale(n)')} in forward" in text  # Casts table: the source line
    for stage in ("capture", "fx passes", "dispatch+emit", "finalize", "legalize", "verify"):
        assert f"| {stage} |" in text
    assert "## Verification" in text and "**MISMATCH**" not in text

    log = validated_sarif(sarif)
    run = log["runs"][0]
    assert run["invocations"][0]["executionSuccessful"] is True
    (scale_result,) = [r for r in results_of(log, "FX2ONNX001") if r["properties"]["overload"].endswith("::scale")]
    assert scale_result["level"] == "note" and scale_result["properties"]["match"] == "cast"
    assert {c["reason"] for c in scale_result["properties"]["casts"]} == {"dispatch", "eager-dtype"}
    assert points_at(scale_result, line_of("scale(n)"))
    passes = [r for r in results_of(log, "FX2ONNX201") if r.get("kind") == "pass"]
    assert len(passes) == 2
    table = {row["overload"]: row for row in run["properties"]["dispatchTable"]}
    assert table["fx2onnx_report_test::scale"]["casts"] == {"dispatch": 1, "eager-dtype": 1}
    assert set(run["properties"]["stageSeconds"]) >= {"capture", "dispatch+emit", "legalize", "verify"}

    # The validation above is not vacuous: the schema rejects a log with a level SARIF does not know.
    broken = copy.deepcopy(log)
    broken["runs"][0]["results"][0]["level"] = "fatal"
    assert list(jsonschema.Draft4Validator(SCHEMA).iter_errors(broken))


# --- an unsupported operator -------------------------------------------------------------------------------
def test_unsupported_operator_fails_with_report_and_no_model(tmp_path: pathlib.Path) -> None:
    md, sarif, model_path = tmp_path / "r.md", tmp_path / "r.sarif", tmp_path / "m.onnx"
    with pytest.raises(fx2onnx.UnsupportedOperatorError) as raised:
        fx2onnx.export(MixedIntFloat(), (torch.randn(3, 4), torch.arange(4)), report=[md, sarif], f=model_path)
    assert not model_path.exists()

    line = line_of("scale(n)")
    message = str(raised.value)
    for expected in (
        "fx2onnx_report_test::scale",  # the overload
        "node `scale`",  # the node
        "x=i64",  # input dtypes
        "n: torch.int64 (4,)",  # input shapes
        f"test_report.py:{line} in forward",  # the user's line
        "custom_translation_table={torch.ops.fx2onnx_report_test.scale.default: my_scale}",  # the remedy
        "fx2onnx.register('fx2onnx_report_test::scale', my_scale)",
    ):
        assert expected in message, f"{expected!r} not in:\n{message}"

    text = md.read_text()
    assert "Export **FAILED** (UnsupportedOperatorError)" in text
    assert "3 dispatched (0 cast matches, 1 failed)" in text  # the failed dispatch is no cast match
    assert "- node: `scale` (`fx2onnx_report_test::scale`)" in text
    assert f"test_report.py:{line} in forward" in text
    assert "remedy:" in text

    log = validated_sarif(sarif)
    run = log["runs"][0]
    assert run["invocations"][0]["executionSuccessful"] is False
    assert "UnsupportedOperatorError" in run["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"]
    (failure,) = results_of(log, "FX2ONNX101")
    assert failure["level"] == "error"
    assert failure["properties"]["overload"] == "fx2onnx_report_test::scale"
    assert failure["locations"][0]["logicalLocations"] == [{"name": "scale", "kind": "variable"}]
    assert points_at(failure, line)


# --- a wrong custom implementation, found by verify(intermediates=True) ------------------------------------
def test_verify_intermediates_finds_the_wrong_implementation(tmp_path: pathlib.Path) -> None:
    x = torch.randn(3, 4)
    program = fx2onnx.export(ScaledRelu(), (x,), custom_translation_table={SCALE: scale_wrong})
    results = program.verify(x, intermediates=True)

    assert not all(r.passed for r in results)  # still the per-output list
    first = results.first_mismatch
    assert first is not None, str(results)
    assert (first.node, first.target) == ("scale", "fx2onnx_report_test::scale")
    assert first.source is not None and f"test_report.py:{line_of('scale(y)')} in forward" in first.source
    assert first.result.max_abs_error > 0.1
    before = results.intermediates[: results.intermediates.index(first)]
    compared_before = [c for c in before if c.status != "missing"]
    assert {c.target for c in compared_before} >= {"aten::relu", "aten::add.Tensor", "_operator::getitem"}
    assert all(c.status == "ok" for c in compared_before), [str(c) for c in before]

    md, sarif = tmp_path / "r.md", tmp_path / "r.sarif"
    program.report.write([md, sarif])
    text = md.read_text()
    assert "**First differing node: `scale` (`fx2onnx_report_test::scale`)**" in text
    assert f"test_report.py:{line_of('scale(y)')} in forward" in text
    log = validated_sarif(sarif)
    (mismatch,) = results_of(log, "FX2ONNX202")
    assert mismatch["level"] == "error" and points_at(mismatch, line_of("scale(y)"))
    assert any(r["level"] == "error" for r in results_of(log, "FX2ONNX201"))

    # export(verify=True) fails naming the node, writes the report, and saves no model.
    model_path, failed_md = tmp_path / "m.onnx", tmp_path / "failed.md"
    with pytest.raises(fx2onnx.VerificationError, match=r"first differing node: `scale`"):
        fx2onnx.export(
            ScaledRelu(),
            (x,),
            custom_translation_table={SCALE: scale_wrong},
            verify=True,
            report=failed_md,
            f=model_path,
        )
    assert not model_path.exists()
    assert "Export **FAILED** (VerificationError)" in failed_md.read_text()


def test_verify_intermediates_passes_a_correct_model() -> None:
    x = torch.randn(3, 4)
    program = fx2onnx.export(ScaledRelu(), (x,), custom_translation_table={SCALE: scale_in_float})
    results = program.verify(x, intermediates=True)
    assert all(r.passed for r in results)
    assert results.first_mismatch is None
    assert sum(c.status == "ok" for c in results.intermediates) >= 5


# --- a capture failure -------------------------------------------------------------------------------------
class DataDependentBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0 and x.mean() > 1:  # LINE: branch
            return x + 1  # two branches on values: no If joins more than one
        return x - 1


def test_capture_failure_names_the_line_and_a_remedy(tmp_path: pathlib.Path) -> None:
    sarif = tmp_path / "r.sarif"
    with pytest.raises(fx2onnx.CaptureError) as raised:
        fx2onnx.export(DataDependentBranch(), (torch.randn(3),), report=sarif)
    message = str(raised.value)
    assert f"test_report.py:{line_of('branch')} in forward" in message
    assert "inputs: float32 (3,)" in message and "remedy:" in message
    (failure,) = results_of(validated_sarif(sarif), "FX2ONNX103")
    assert points_at(failure, line_of("branch"))


# --- verify's results, as printed ------------------------------------------------------------------------------
def test_verify_prints_one_line_per_output_with_the_criterion_that_decided() -> None:
    class TwoOutputs(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.tanh(x), (x > 0).sum()

    x = torch.randn(3, 4)
    program = fx2onnx.export(TwoOutputs(), (x,))
    results = program.verify(x)
    assert results.passed and len(results) == 2
    lines = str(results).splitlines()
    assert len(lines) == 2 and "OutputVerification(" not in str(results)
    assert lines[0].startswith(f"{results[0].name}: ok, dtype float32 (eager float32), shape [3, 4], max abs err ")
    count = "dtype int64 (eager int64), shape [], max abs err 0, max rel err 0 (identical)"
    assert lines[1] == f"{results[1].name}: ok, {count}"


def test_verify_result_says_which_tolerance_held_or_broke() -> None:
    from fx2onnx._verification import compare

    eager = torch.tensor([1e-6, 1.0, -2.0, 1e4])
    # 2.4 relative error on a value near zero: passes on atol, and says so.
    near_zero = compare("y", eager, eager + torch.tensor([2.4e-6, 0.0, 0.0, 0.0]))
    assert near_zero.passed and near_zero.max_rel_error == pytest.approx(2.4, rel=1e-3)
    assert str(near_zero).startswith("y: ok, dtype float32 (eager float32), shape [4], max abs err 2.4e-06, max rel")
    assert str(near_zero).endswith("(within atol 0.0001: the large relative error is on values near 0)")
    # 0.5 off on 1e4: beyond atol, within rtol.
    large = compare("y", eager, eager + torch.tensor([0.0, 0.0, 0.0, 0.5]))
    assert large.passed and large.criterion == "within rtol 0.0001"
    # Neither alone holds for every element, but each is within atol + rtol * |eager|.
    both = compare("y", eager, eager + torch.tensor([5e-5, 0.0, 0.0, 0.5]))
    assert both.passed and both.criterion == "within atol + rtol * |eager| = 0.0001 + 0.0001 * |eager|"
    wrong = compare("y", eager, eager + torch.tensor([0.0, 0.01, 0.0, 0.0]))
    assert not wrong.passed
    assert str(wrong).startswith("y: MISMATCH, ")
    assert wrong.criterion == "beyond atol + rtol * |eager| = 0.0001 + 0.0001 * |eager|"
    assert compare("y", eager, eager).criterion == "identical"
    assert compare("y", eager, eager.double()).criterion == "dtype differs from eager's"
    assert compare("y", eager, eager[:2]).criterion == "shape differs from eager's [4]"
    # Extremes: the same infinities and NaNs are identical, an infinity against a finite value is a mismatch.
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), torch.finfo(torch.float32).max])
    assert compare("y", special, special.clone()).criterion == "identical"
    overflow = compare("y", special, special.nan_to_num(posinf=0.0))
    assert not overflow.passed and "MISMATCH" in str(overflow)
