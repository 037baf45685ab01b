"""An op fx2onnx names that the installed torch lacks (torch 2.15 removed ``aten::cholesky``) stops neither the
package's import, nor the registry, nor any export that does not use it: the registry skips its implementations and
says why (``Registry.skipped``), and an overload named in fx2onnx's tables is a ``MissingOverload`` listed with its
reason (``fx2onnx._torch_ops.missing()``). The ops missing here are names no torch has, so no torch is mocked."""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch
from onnxscript import FLOAT
from onnxscript import opset18 as op

import fx2onnx
from fx2onnx import _torch_ops
from fx2onnx.errors import ExportError

from conftest import Call, assert_exports_and_matches

SOURCE = pathlib.Path(fx2onnx.__file__).parent


def _double(self: FLOAT) -> FLOAT:
    return op.Add(self, self)


def test_a_registration_for_an_op_torch_lacks_is_skipped_with_its_reason() -> None:
    registry = fx2onnx.Registry.default()
    with pytest.warns(UserWarning, match=r"aten::fx2onnx_no_such_op is not registered: torch .* has no aten::"):
        registry.register("aten::fx2onnx_no_such_op", _double)
    with pytest.warns(UserWarning, match=r"aten::add has no overload 'fx2onnx_no_such_overload'"):
        registry.register("aten::add.fx2onnx_no_such_overload", _double)
    skipped = registry.skipped
    assert skipped["aten::fx2onnx_no_such_op"] == (
        f"torch {torch.__version__} has no aten::fx2onnx_no_such_op; not registered: user:_double"
    )
    assert "aten::add.fx2onnx_no_such_overload" in skipped
    assert not registry.is_registered("aten::fx2onnx_no_such_op")
    assert registry.copy().skipped == skipped
    # a namespace torch does not own in full (a library's ops appear when it is imported) is registered as given
    registry.register("fx2onnx_test_library::later", _double)
    assert registry.is_registered("fx2onnx_test_library::later")
    assert "fx2onnx_test_library::later" not in registry.skipped
    # every other op exports as before
    x = torch.randn(3, 4)
    assert_exports_and_matches(Call(lambda a: torch.relu(a) + a * 2), (x,), registry=registry)


def test_the_default_registry_skips_fx2onnx_rules_for_ops_torch_lacks() -> None:
    """As torch 2.15 did to fx2onnx's rule for aten::cholesky: rules (and an alias) for ops this torch lacks,
    registered before the default registry is built; it builds, records them, and a model exports and matches."""
    script = textwrap.dedent(
        """
        import json
        import torch
        from onnxscript import opset18 as op
        from fx2onnx._lowerings.rules import alias, lowering

        @lowering("aten::fx2onnx_no_such_op", "aten::mul.fx2onnx_no_such_overload")
        def no_such_op(self):
            return op.Identity(self)

        alias("aten::fx2onnx_no_such_alias", "aten::fx2onnx_no_such_op")

        import fx2onnx
        from fx2onnx._registry import Registry

        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
        x = torch.randn(2, 4)
        program = fx2onnx.export(model, (x,))
        results = program.verify(x)  # ONNX Runtime against eager: dtype, shape, values
        assert results and all(r.passed for r in results), results
        print(json.dumps(Registry.default().skipped))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    skipped = json.loads(result.stdout.strip().splitlines()[-1])
    assert skipped["aten::fx2onnx_no_such_op"] == (
        f"torch {torch.__version__} has no aten::fx2onnx_no_such_op; not registered: fx2onnx:no_such_op"
    )
    assert skipped["aten::mul.fx2onnx_no_such_overload"].startswith(
        f"torch {torch.__version__}'s aten::mul has no overload 'fx2onnx_no_such_overload'"
    )
    assert skipped["aten::fx2onnx_no_such_alias"] == "lowered as aten::fx2onnx_no_such_op, which is skipped"


def test_cholesky_is_registered_where_torch_has_it() -> None:
    """torch 2.15 removed aten::cholesky (the deprecated torch.cholesky); torch 2.13 has it."""
    has_it = hasattr(torch.ops.aten, "cholesky")
    registry = fx2onnx.Registry.default()
    assert registry.is_registered("aten::cholesky") == has_it
    assert ("aten::cholesky" in registry.skipped) == (not has_it)
    a = torch.randn(3, 3, dtype=torch.float64)
    assert_exports_and_matches(Call(torch.linalg.cholesky), (a @ a.mT + 3 * torch.eye(3, dtype=torch.float64),))


def test_an_overload_torch_lacks_is_a_recorded_missing_overload() -> None:
    assert _torch_ops.aten.add.Tensor is torch.ops.aten.add.Tensor
    assert _torch_ops.prims.convert_element_type.default is torch.ops.prims.convert_element_type.default
    missing = _torch_ops.aten.fx2onnx_no_such_op.default
    assert isinstance(missing, _torch_ops.MissingOverload)
    assert missing.name() == "aten::fx2onnx_no_such_op"
    assert _torch_ops.missing()["aten::fx2onnx_no_such_op.default"] == (
        f"torch {torch.__version__} has no aten::fx2onnx_no_such_op"
    )
    assert isinstance(_torch_ops.aten.add.fx2onnx_no_such_overload, _torch_ops.MissingOverload)
    assert "aten::add.fx2onnx_no_such_overload" in _torch_ops.missing()
    with pytest.raises(ExportError, match=r"fx2onnx needs aten::fx2onnx_no_such_op\.default: torch .* has no"):
        missing(torch.ones(1))
    table = {missing: "gone", torch.ops.aten.add.Tensor: "kept"}
    assert _torch_ops.present(table) == {torch.ops.aten.add.Tensor: "kept"}
    assert _torch_ops.lacks("aten::add.Tensor") is None and _torch_ops.lacks("aten::relu") is None
    assert _torch_ops.lacks("torchvision::nms") is None  # not torch's to say
    assert fx2onnx.Registry().lowers(missing) is False  # a registry key like any overload's


def _torch_ops_chains(path: pathlib.Path) -> list[str]:
    """``torch.ops.aten.<op>`` / ``torch.ops.prims.<op>`` attribute reads in a module's source."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) in ("torch.ops.aten", "torch.ops.prims"):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_package_names_torch_ops_through_torch_ops_module() -> None:
    """A ``torch.ops.aten.<op>.<overload>`` read raises AttributeError where torch lacks the op (at import, it
    stopped every export under torch 2.15): fx2onnx names them through ``fx2onnx._torch_ops`` instead."""
    chains = [
        chain
        for path in sorted(SOURCE.rglob("*.py"))
        if path.name != "_torch_ops.py"
        for chain in _torch_ops_chains(path)
    ]
    assert chains == []
    # the check sees one
    assert _torch_ops_chains(pathlib.Path(__file__)) != []
    _ = torch.ops.aten.add.Tensor  # what the check above finds in this file
