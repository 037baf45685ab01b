"""The ``fx2onnx`` command line, run in a subprocess on a factory module written to a temporary folder."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import jsonschema
import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from fx2onnx import cli

SCHEMA = json.loads((pathlib.Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())

FACTORIES = textwrap.dedent(
    """
    import torch


    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 3)

        def forward(self, x, ids):
            return torch.relu(self.proj(x)) * ids.unsqueeze(-1)  # float times int64


    def build():
        torch.manual_seed(0)
        return Tagger(), (torch.randn(2, 4), torch.arange(2))


    @torch.library.custom_op("fx2onnx_cli_test::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2


    @twice.register_fake
    def _(x):
        return torch.empty_like(x)


    class Unsupported(torch.nn.Module):
        def forward(self, x):
            return torch.ops.fx2onnx_cli_test.twice(x) + 1  # LINE


    def unsupported():
        return Unsupported(), torch.randn(3)


    def with_keywords():
        torch.manual_seed(0)
        return Tagger(), (torch.randn(2, 4),), {"ids": torch.arange(2)}
    """
)


def fx2onnx_cli(*arguments: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fx2onnx.cli", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=3600,  # only a hung command reaches it (an export takes minutes at load 20 on 2 cores)
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("cli")
    (folder / "factories.py").write_text(FACTORIES)
    return folder


@pytest.fixture(scope="module")
def exported(workdir: pathlib.Path) -> tuple[pathlib.Path, subprocess.CompletedProcess[str]]:
    done = fx2onnx_cli(
        "export",
        "factories:build",
        "-o",
        "out/tagger.onnx",
        "--dynamic",
        "batch",
        "--verify",
        "--report",
        "out/report.md",
        "--report",
        "out/report.sarif",
        cwd=workdir,
    )
    return workdir / "out", done


def test_export_writes_model_and_reports(exported: tuple[pathlib.Path, subprocess.CompletedProcess[str]]) -> None:
    out, done = exported
    assert done.returncode == 0, done.stderr
    assert "saved out/tagger.onnx" in done.stdout
    assert "output: ok" in done.stdout  # --verify printed the comparison
    assert "fx2onnx: capture..." in done.stderr  # progress on stderr

    model = onnx.load(out / "tagger.onnx")
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"

    # The saved model runs in ONNX Runtime with another batch size and matches eager.
    namespace: dict = {}
    exec(FACTORIES, namespace)
    module, _ = namespace["build"]()
    x, ids = torch.randn(5, 4), torch.arange(5)
    with torch.no_grad():
        expected = module(x, ids).numpy()
    session = onnxruntime.InferenceSession(str(out / "tagger.onnx"), providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {"x": x.numpy(), "ids": ids.numpy()})
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)

    text = (out / "report.md").read_text()
    assert "Export succeeded." in text and "## Verification" in text and "## Casts" in text
    log = json.loads((out / "report.sarif").read_text())
    assert not list(jsonschema.Draft4Validator(SCHEMA).iter_errors(log))
    assert log["runs"][0]["invocations"][0]["executionSuccessful"] is True


def test_export_failure_is_one_paragraph_and_writes_no_model(workdir: pathlib.Path) -> None:
    done = fx2onnx_cli("export", "factories:unsupported", "-o", "bad/model.onnx", "--report", "bad/r.md", cwd=workdir)
    assert done.returncode == 1
    error = done.stderr[done.stderr.index("fx2onnx export failed:") :]
    assert "\n\n" not in error.strip() and "Traceback" not in done.stderr
    line = next(n for n, text in enumerate(FACTORIES.splitlines(), start=1) if text.endswith("# LINE"))
    for expected in ("UnsupportedOperatorError", "fx2onnx_cli_test::twice", f"factories.py:{line}", "remedy:"):
        assert expected in error, error
    assert "The export report is in bad/r.md." in error
    assert not (workdir / "bad" / "model.onnx").exists()
    assert "Export **FAILED** (UnsupportedOperatorError)" in (workdir / "bad" / "r.md").read_text()


def test_export_bad_factory_and_bad_arguments(
    workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In process (the subprocess path is covered above): the same main() the console script runs.
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_factory adds the working directory
    assert cli.main(["export", "factories:missing", "-o", "x.onnx"]) == 1
    error = capsys.readouterr().err
    assert "fx2onnx export failed: AttributeError:" in error and "'missing'" in error
    assert not (workdir / "x.onnx").exists()
    with pytest.raises(SystemExit) as usage:
        cli.main(["export", "factories:build"])  # no -o
    assert usage.value.code == 2 and "-o/--output" in capsys.readouterr().err


def test_inspect_prints_the_model(exported: tuple[pathlib.Path, subprocess.CompletedProcess[str]]) -> None:
    out, done = exported
    assert done.returncode == 0, done.stderr
    shown = fx2onnx_cli("inspect", "tagger.onnx", cwd=out)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "opsets: ai.onnx 18" in text
    assert "MiB on disk" in text
    assert "input  x: FLOAT [batch, 4]" in text and "input  ids: INT64 [batch]" in text
    assert "output output: FLOAT [batch, 3]" in text
    assert any(line.split()[:1] == ["Gemm"] for line in text.splitlines())  # the op histogram
    assert "every node has a kernel in onnxruntime-cpu" in text
    assert "ONNX Runtime session: loads" in text


def test_inspect_names_nodes_without_a_kernel(tmp_path: pathlib.Path) -> None:
    # bfloat16 Add: valid ONNX, but ONNX Runtime's CPU provider has no kernel for it.
    bf16 = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["a", "b"], ["c"], name="add_bf16")],
        "g",
        [bf16("a", onnx.TensorProto.BFLOAT16, [2]), bf16("b", onnx.TensorProto.BFLOAT16, [2])],
        [bf16("c", onnx.TensorProto.BFLOAT16, [2])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=8)
    onnx.save(model, tmp_path / "bf16.onnx")
    shown = fx2onnx_cli("inspect", "bf16.onnx", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "1 node(s) without a kernel in onnxruntime-cpu" in shown.stdout
    assert "`add_bf16` (Add, T=tensor(bfloat16))" in shown.stdout
    assert "ONNX Runtime session: fails to load" in shown.stdout
    spec = fx2onnx_cli("inspect", "bf16.onnx", "--target", "onnx", cwd=tmp_path)
    assert "every node has a kernel in onnx" in spec.stdout


def test_help_and_version_answer_without_importing_torch(tmp_path: pathlib.Path) -> None:
    """`fx2onnx --help` and `--version` are instant: the CLI's parser imports no torch (seconds of imports)."""
    probe = (
        "import sys\n"
        "from fx2onnx.cli import build_parser\n"
        "build_parser().format_help()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnx', 'onnxruntime', 'onnxscript')))\n"
    )
    imported = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "[]"

    import fx2onnx

    version = fx2onnx_cli("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"fx2onnx {fx2onnx.__version__}"
    usage = fx2onnx_cli("--help", cwd=tmp_path)
    assert usage.returncode == 0
    for command in ("demo", "export", "inspect", "coverage", "--version"):
        assert command in usage.stdout
    export_usage = fx2onnx_cli("export", "--help", cwd=tmp_path)
    assert "--opset OPSET ONNX opset of the model (default 18" in " ".join(export_usage.stdout.split())


def test_the_package_api_loads_on_first_use() -> None:
    """The lazily loaded names are the real objects; `fx2onnx.export` stays the function after its module loads."""
    probe = (
        "import fx2onnx._export, fx2onnx, fx2onnx.program\n"
        "from fx2onnx._export import export\n"
        "assert fx2onnx.export is export, fx2onnx.export\n"
        "assert fx2onnx.ONNXProgram is fx2onnx.program.ONNXProgram\n"
        "assert all(callable(getattr(fx2onnx, name)) for name in fx2onnx.__all__ if name != '__version__')\n"
        "assert set(fx2onnx.__all__) == {*fx2onnx._PUBLIC, '__version__'}\n"
        "from fx2onnx import *\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_dynamic_applies_to_keyword_inputs_of_a_factory(workdir: pathlib.Path) -> None:
    done = fx2onnx_cli("export", "factories:with_keywords", "-o", "out/kw.onnx", "--dynamic", "batch", cwd=workdir)
    assert done.returncode == 0, done.stderr
    model = onnx.load(workdir / "out" / "kw.onnx")
    dims = {v.name: v.type.tensor_type.shape.dim[0].dim_param for v in model.graph.input}
    assert dims == {"x": "batch", "ids": "batch"}
    namespace: dict = {}
    exec(FACTORIES, namespace)
    module, (_,), _ = namespace["with_keywords"]()
    x, ids = torch.randn(5, 4), torch.arange(5)
    session = onnxruntime.InferenceSession(str(workdir / "out" / "kw.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": x.numpy(), "ids": ids.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(got, module(x, ids=ids).numpy(), rtol=1e-6, atol=1e-6)
