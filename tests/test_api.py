"""The public API: registry functions, errors, saving, running, opsets, extractors."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from typing import Any

import onnx
import onnxruntime
import pytest
import torch
from onnxscript import FLOAT
from onnxscript import opset18 as op

import fx2onnx
from fx2onnx.examples import TinyGPT, tiny_resnet

from conftest import assert_exports_and_matches as check


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


# --- a custom op nobody registered ----------------------------------------------------------------
@torch.library.custom_op("fx2onnx_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(x)


class UsesCustomOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scaled_tanh(x + 1, 2.0)


def scaled_tanh_onnx(x: FLOAT, scale: float) -> FLOAT:
    return op.Mul(op.Tanh(x), scale)


def test_unsupported_operator_raises_a_clear_error_and_writes_no_file(tmp_path: os.PathLike) -> None:
    target = os.path.join(tmp_path, "model.onnx")
    with pytest.raises(fx2onnx.UnsupportedOperatorError) as caught:
        fx2onnx.export(UsesCustomOp(), (torch.randn(2, 3),), f=target)
    message = str(caught.value)
    assert "fx2onnx_test::scaled_tanh" in message  # the op overload
    assert "x=f32" in message  # input dtypes
    assert "none registered" in message  # the candidates (none)
    assert "test_api.py" in message and "scaled_tanh(x + 1, 2.0)" in message  # the user's source line
    assert "fx2onnx.register(" in message and "custom_translation_table" in message  # how to fix it
    assert os.listdir(tmp_path) == []


def test_rejected_candidates_are_listed_in_the_error() -> None:
    def only_new(self: FLOAT, other: FLOAT) -> FLOAT:
        return op.Add(self, other)

    registry = fx2onnx.Registry()
    registry.register("aten::add.Tensor", only_new, opset=(20, None))

    class Add(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

    with pytest.raises(fx2onnx.UnsupportedOperatorError, match=r"only_new: valid for opsets 20\.\.newest"):
        fx2onnx.export(Add(), (torch.ones(2), torch.ones(2)), registry=registry)


def test_custom_translation_table_lowers_a_custom_op() -> None:
    program = check(
        UsesCustomOp(),
        (torch.randn(2, 3),),
        custom_translation_table={torch.ops.fx2onnx_test.scaled_tanh.default: scaled_tanh_onnx},
    )
    assert "Tanh" in {n.op_type for n in program.model.graph}


def test_register_unregister_is_registered_overloads() -> None:
    key = "fx2onnx_test::scaled_tanh"
    assert not fx2onnx.is_registered(key)
    fx2onnx.register(torch.ops.fx2onnx_test.scaled_tanh.default, scaled_tanh_onnx)
    try:
        assert fx2onnx.is_registered(key)
        (implementation,) = fx2onnx.overloads(key)
        assert implementation.source == "user"
        check(UsesCustomOp(), (torch.randn(2, 3),))
    finally:
        fx2onnx.unregister(key)
    assert not fx2onnx.is_registered(key)


def test_user_registration_overrides_the_default() -> None:
    def tanh_via_sigmoid(self: FLOAT) -> FLOAT:
        return op.Sub(op.Mul(op.Sigmoid(op.Mul(self, 2.0)), 2.0), 1.0)

    registry = fx2onnx.Registry.default()
    registry.register("aten::tanh", tanh_via_sigmoid)
    assert registry.overloads("aten::tanh")[0].source == "user"
    assert registry.overloads("aten::tanh")[-1].source == "torchlib"
    program = check(MLP(), (torch.randn(3, 8),), registry=registry)
    op_types = {n.op_type for n in program.model.graph}
    assert "Sigmoid" in op_types and "Tanh" not in op_types


# --- saving -----------------------------------------------------------------------------------------
def test_save_and_load_in_onnxruntime(tmp_path: os.PathLike) -> None:
    model, args = tiny_resnet()
    program = fx2onnx.export(model, args)
    path = os.path.join(tmp_path, "resnet.onnx")
    program.save(path)
    assert os.listdir(tmp_path) == ["resnet.onnx"]
    onnx.checker.check_model(path, full_check=True)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: args[0].numpy()})
    torch.testing.assert_close(torch.from_numpy(out), model(*args), rtol=1e-4, atol=1e-4)


def test_save_with_external_data(tmp_path: os.PathLike) -> None:
    model = TinyGPT().eval()
    ids = torch.randint(0, 512, (1, 8))
    program = fx2onnx.export(model, (ids,))
    path = os.path.join(tmp_path, "gpt.onnx")
    program.save(path, external_data=True)
    assert sorted(os.listdir(tmp_path)) == ["gpt.onnx", "gpt.onnx.data"]
    assert os.path.getsize(path) < 100_000 < os.path.getsize(path + ".data")
    onnx.checker.check_model(path, full_check=True)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"ids": ids.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), model(ids), rtol=1e-4, atol=1e-4)


def test_failed_save_leaves_no_partial_file(tmp_path: os.PathLike, monkeypatch: pytest.MonkeyPatch) -> None:
    program = fx2onnx.export(MLP(), (torch.randn(2, 8),))
    path = os.path.join(tmp_path, "model.onnx")

    def fail(*args: object, **kwargs: object) -> None:
        with open(args[1], "wb") as stream:  # the write has begun...
            stream.write(b"partial")
        raise OSError("disk full")  # ...and fails half way

    monkeypatch.setattr("onnx_ir.save", fail)
    monkeypatch.setattr("fx2onnx._streaming.save_model", fail)  # the writer .onnx files go through
    with pytest.raises(OSError, match="disk full"):
        program.save(path)
    assert os.listdir(tmp_path) == []


def test_initializers_share_memory_with_parameters() -> None:
    model = MLP().eval()
    program = fx2onnx.export(model, (torch.randn(2, 8),))
    initializer = program.model.graph.initializers["fc.weight"]
    assert initializer.const_value.raw.data_ptr() == model.fc.weight.data_ptr()


# --- running ----------------------------------------------------------------------------------------
def test_bfloat16_inputs_and_outputs() -> None:
    class Passthrough(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.transpose(0, 1), x.reshape(-1)

    x = torch.randn(3, 4).to(torch.bfloat16)
    program = fx2onnx.export(Passthrough(), (x,))
    transposed, flat = program(x)
    assert transposed.dtype == torch.bfloat16 and torch.equal(transposed, x.T)
    assert torch.equal(flat, x.reshape(-1))


@pytest.mark.parametrize("opset", [18, 20, 23])
def test_opset_versions(opset: int) -> None:
    if opset > fx2onnx.max_opset():
        pytest.skip(f"onnxruntime here accepts opsets up to {fx2onnx.max_opset()}")
    model, args = tiny_resnet()
    program = check(model, args, opset_version=opset)
    assert program.model.opset_imports[""] == opset


def test_newest_opset_is_supported() -> None:
    newest = fx2onnx.max_opset()
    assert newest >= 23
    check(MLP(), (torch.randn(2, 8),), opset_version=newest)


@pytest.mark.parametrize("opset", [10, 999])
def test_unsupported_opset_is_refused(opset: int) -> None:
    with pytest.raises(fx2onnx.ExportError, match="opset_version"):
        fx2onnx.export(MLP(), (torch.randn(2, 8),), opset_version=opset)


# --- capture ----------------------------------------------------------------------------------------
def test_exported_program_is_accepted() -> None:
    model, x = MLP().eval(), torch.randn(2, 8)
    exported = torch.export.export(model, (x,))
    program = fx2onnx.export(exported, (x,))
    assert program.exported_program is not None
    assert all(r.passed for r in program.verify(x))


def test_strict_capture() -> None:
    check(MLP(), (torch.randn(2, 8),), strict=True)


def test_symbolic_trace_extractor() -> None:
    program = check(MLP(), (torch.randn(2, 8),), extractor="symbolic_trace")
    assert program.report.strategy == "symbolic_trace"


def test_verify_flag_and_f_argument(tmp_path: os.PathLike) -> None:
    path = os.path.join(tmp_path, "m.onnx")
    program = fx2onnx.export(MLP(), (torch.randn(2, 8),), f=path, verify=True)
    assert os.path.exists(path)
    assert program.report.verification and all(v.passed for v in program.report.verification)


def test_node_metadata_names_fx_node_module_and_source() -> None:
    program = fx2onnx.export(MLP(), (torch.randn(2, 8),), optimize=False)
    metadata = [n.metadata_props for n in program.model.graph]
    assert any(m.get("pkg.fx2onnx.fx_node") == "linear" for m in metadata)
    assert any("fc" in m.get("namespace", "") for m in metadata)
    assert any("test_api.py" in m.get("pkg.fx2onnx.stack_trace", "") for m in metadata)


def test_symbolic_trace_failure_is_a_capture_error() -> None:
    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 if x.sum() > 0 else x - 1

    with pytest.raises(fx2onnx.CaptureError, match="symbolic_trace could not trace DataDependent"):
        fx2onnx.export(DataDependent(), (torch.randn(3),), extractor="symbolic_trace")


def test_verification_compares_integers_exactly_beyond_float64s_precision() -> None:
    from fx2onnx._verification import compare

    expected = torch.tensor([2**62, -(2**60), 7], dtype=torch.int64)
    off_by_100 = expected + torch.tensor([100, 0, 0])  # the same value once both are rounded to float64
    assert not compare("x", expected, off_by_100).passed
    assert compare("x", expected, off_by_100).max_abs_error == 100
    assert compare("x", expected, expected.clone()).passed


def test_verification_admits_an_infinite_expected_value_only_itself() -> None:
    from fx2onnx._verification import compare

    inf, nan = float("inf"), float("nan")
    expected = torch.tensor([inf, -inf, nan, 1.0])
    assert compare("x", expected, expected.clone()).passed
    assert not compare("x", expected, torch.tensor([-inf, -inf, nan, 1.0])).passed  # wrong sign of infinity
    assert not compare("x", expected, torch.tensor([3.0e38, -inf, nan, 1.0])).passed  # finite for infinite
    assert not compare("x", expected, torch.tensor([inf, -inf, 0.0, 1.0])).passed  # a number for NaN
    assert not compare("x", torch.tensor([1.0]), torch.tensor([inf])).passed
    complex_inf = torch.tensor([complex(inf, 0.0)])
    assert compare("z", complex_inf, complex_inf.clone()).passed
    assert not compare("z", complex_inf, torch.tensor([complex(-inf, 0.0)])).passed


def test_intermediates_of_a_bfloat16_model_include_folded_constants() -> None:
    class FoldedTable(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.randn(2048))  # above legalization's FOLD_LIMIT: stays bfloat16

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.sin(self.table * 2)  # constant-folded into an initializer named after `sin`

    model = FoldedTable().to(torch.bfloat16)
    x = torch.randn(2, 2048, dtype=torch.bfloat16)
    program = fx2onnx.export(model, (x,))
    verification = program.verify(x, intermediates=True)
    compared = {n.node: n for n in verification.intermediates if n.result is not None}
    assert "sin" in compared and compared["sin"].result.passed
    assert verification.first_mismatch is None


def test_an_export_and_save_import_no_verification_modules(tmp_path: Any) -> None:
    """What only `verify` needs (the intermediates' comparison, the rounding-noise judge) is imported when verifying,
    not by a first export: a fresh process exports and saves without them, then verifies with both."""
    script = (
        "import sys, torch, fx2onnx\n"
        "model, x = torch.nn.Linear(4, 3).eval(), torch.randn(2, 4)\n"
        "program = fx2onnx.export(model, (x,))\n"
        f"program.save({str(tmp_path / 'linear.onnx')!r})\n"
        "deferred = ('fx2onnx._intermediates', 'fx2onnx._rounding_noise')\n"
        "assert not [name for name in deferred if name in sys.modules], [n for n in deferred if n in sys.modules]\n"
        "fx2onnx.export(torch.nn.Linear(4, 3).half().eval(), (x.half(),)).verify(x.half())\n"
        "program.verify(x, intermediates=True)\n"
        "assert all(name in sys.modules for name in deferred)\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]


class FreezeCounts(torch.nn.Module):
    """Notes how many objects the garbage collector skips (`gc.get_freeze_count`) while torch.export runs forward."""

    def __init__(self, seen: list[int]) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.seen = seen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(gc.get_freeze_count())
        return torch.relu(self.fc(x))


def _freeze_counts_at_capture_and_emission() -> tuple[list[int], list[int]]:
    at_capture: list[int] = []
    at_emission: list[int] = []

    def noted_relu(self: FLOAT) -> FLOAT:
        at_emission.append(gc.get_freeze_count())
        return op.Relu(self)

    x = torch.randn(2, 8)
    model = FreezeCounts(at_capture)
    check(model, (x,), custom_translation_table={torch.ops.aten.relu.default: noted_relu})
    return at_capture, at_emission


def test_collections_skip_capture_s_objects_after_it_and_the_export_unfreezes_all() -> None:
    """Full collections after capture walk neither the objects older than the export nor those torch.export made
    (its graphs, fake tensors, shape environment): those are frozen too once capture ends; all are unfrozen after."""
    at_capture, at_emission = _freeze_counts_at_capture_and_emission()
    assert at_capture and at_emission
    assert at_emission[0] > max(at_capture)
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_before_the_export_is_left_as_it_is() -> None:
    """Objects frozen by the caller (a pre-fork server) stay frozen, and the export freezes nothing more (the count
    only falls, as frozen objects are freed)."""
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        at_capture, at_emission = _freeze_counts_at_capture_and_emission()
        assert min(at_capture + at_emission) > 0 and max(at_capture + at_emission) <= frozen
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
