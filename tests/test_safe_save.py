"""Saves never corrupt, lose or escape: faults injected at each step leave the previous model whole and nothing
behind; external-data names stay inside the model's folder; a save leaves exactly the files of its model."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

import fx2onnx
from fx2onnx import _safe_save as safe_save
from fx2onnx import _streaming as streaming

INPUT = torch.linspace(-3.0, 3.0, 2 * 64).reshape(2, 64)


def _program(seed: int, features: int = 64) -> tuple[torch.nn.Module, fx2onnx.ONNXProgram]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(features, features), torch.nn.Tanh()).eval()
    return model, fx2onnx.export(model, (torch.randn(2, features),))


@pytest.fixture(scope="module")
def old_and_new() -> tuple[torch.nn.Module, fx2onnx.ONNXProgram, torch.nn.Module, fx2onnx.ONNXProgram]:
    old_model, old_program = _program(0)
    new_model, new_program = _program(1)
    return old_model, old_program, new_model, new_program


def _run_saved(path: str | os.PathLike[str], x: torch.Tensor = INPUT) -> np.ndarray:
    onnx.checker.check_model(os.fspath(path), full_check=True)
    session = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    return out


def _assert_saved_model_is(path: str | os.PathLike[str], model: torch.nn.Module) -> None:
    with torch.no_grad():
        expected = model(INPUT)
    torch.testing.assert_close(torch.from_numpy(_run_saved(path)), expected, rtol=1e-5, atol=1e-5)


def _files(folder: str | os.PathLike[str]) -> list[str]:
    """Every file under `folder`, relative to it (temporary folders included, hidden or not)."""
    found = []
    for root, _, names in os.walk(folder):
        found.extend(os.path.relpath(os.path.join(root, name), folder) for name in names)
    return sorted(found)


def _model_files(path: str | os.PathLike[str]) -> list[str]:
    """The model file and the external-data files it references."""
    return sorted([os.path.basename(path), *safe_save.referenced_files(os.fspath(path))])


# --- names stay inside the model's folder -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "../escaped.data",
        "weights/../../escaped.data",
        "/tmp/fx2onnx-escaped.data",
        "",
        "  ",
        "model.onnx",
        "./",
        "weights/",
    ],
)
def test_external_data_names_leaving_the_folder_or_naming_no_file_are_refused(
    tmp_path: Path, old_and_new: tuple, name: str
) -> None:
    _, program, _, _ = old_and_new
    destination = tmp_path / "models"
    with pytest.raises(ValueError, match="external_data="):
        program.save(destination / "model.onnx", external_data=name)
    assert _files(tmp_path) == []
    assert not os.path.exists("/tmp/fx2onnx-escaped.data")


def test_external_data_name_through_a_symbolic_link_out_of_the_folder_is_refused(
    tmp_path: Path, old_and_new: tuple
) -> None:
    _, program, _, _ = old_and_new
    (tmp_path / "outside").mkdir()
    (tmp_path / "models").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "models" / "link")
    with pytest.raises(ValueError, match="outside"):
        program.save(tmp_path / "models" / "model.onnx", external_data="link/weights.data")
    assert _files(tmp_path / "outside") == []
    assert os.listdir(tmp_path / "models") == ["link"]


def test_external_data_in_a_subfolder_loads_and_matches_eager(tmp_path: Path, old_and_new: tuple) -> None:
    model, program, _, _ = old_and_new
    path = tmp_path / "model.onnx"
    assert program.save(path, external_data="weights/model.bin") == "weights/model.bin"
    assert _files(tmp_path) == ["model.onnx", "weights/model.bin"]
    _assert_saved_model_is(path, model)


# --- a save leaves exactly its model's files ---------------------------------------------------------------------
def test_each_save_leaves_exactly_the_files_of_the_model_it_wrote(tmp_path: Path, old_and_new: tuple) -> None:
    old_model, old_program, new_model, new_program = old_and_new
    path = tmp_path / "model.onnx"
    steps = [
        (old_program, old_model, True),
        (new_program, new_model, True),  # the old weights' name is taken: the new ones get a fresh name
        (old_program, old_model, True),
        (new_program, new_model, False),  # single file: the earlier .data goes (issue 21, item 5)
        (old_program, old_model, "weights/old.bin"),
        (new_program, new_model, True),  # the subfolder goes with its last file
    ]
    for program, model, external_data in steps:
        data_name = program.save(path, external_data=external_data)
        assert _files(tmp_path) == _model_files(path), external_data
        assert (data_name is None) == (external_data is False)
        _assert_saved_model_is(path, model)


def test_a_save_beside_another_model_keeps_that_models_weights(tmp_path: Path, old_and_new: tuple) -> None:
    old_model, old_program, new_model, new_program = old_and_new
    old_program.save(tmp_path / "a.onnx", external_data="shared.data")
    new_program.save(tmp_path / "b.onnx", external_data="shared.data")  # taken by a.onnx: b gets a fresh name
    _assert_saved_model_is(tmp_path / "a.onnx", old_model)
    _assert_saved_model_is(tmp_path / "b.onnx", new_model)
    assert len(_files(tmp_path)) == 4


# --- faults: the old model stays whole, nothing is left behind ---------------------------------------------------
@pytest.mark.parametrize("external_data", [False, True])
def test_failure_between_the_weights_and_the_model_rename_keeps_the_old_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_and_new: tuple, external_data: bool
) -> None:
    old_model, old_program, _, new_program = old_and_new
    path = tmp_path / "model.onnx"
    old_program.save(path, external_data=True)
    before = _files(tmp_path)
    replace = os.replace

    def fail_on_the_model(source: str, destination: str) -> None:
        if os.fspath(destination) == os.fspath(path):
            raise OSError(errno.EIO, "injected failure before the .onnx rename")
        replace(source, destination)

    monkeypatch.setattr(os, "replace", fail_on_the_model)
    with pytest.raises(OSError, match="injected"):
        new_program.save(path, external_data=external_data)
    monkeypatch.undo()
    assert _files(tmp_path) == before
    _assert_saved_model_is(path, old_model)


@pytest.mark.parametrize("external_data", [False, True])
def test_full_disk_while_writing_keeps_the_old_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_and_new: tuple, external_data: bool
) -> None:
    old_model, old_program, _, new_program = old_and_new
    path = tmp_path / "model.onnx"
    old_program.save(path, external_data=external_data)
    before = _files(tmp_path)
    write_array = streaming._write_array

    def half_then_full(file: streaming._Sink, array: np.ndarray) -> int:
        file.write(array.reshape(-1).view(np.uint8)[: array.nbytes // 2].data)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(streaming, "_write_array", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        new_program.save(path, external_data=not external_data)
    monkeypatch.setattr(streaming, "_write_array", write_array)
    assert _files(tmp_path) == before
    _assert_saved_model_is(path, old_model)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a real full disk (needs root and mount; skipped elsewhere)."""
    folder = tmp_path / "small_disk"
    folder.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("external_data", [False, True])
def test_a_real_full_disk_keeps_the_old_model(small_disk: Path, old_and_new: tuple, external_data: bool) -> None:
    old_model, old_program, _, _ = old_and_new
    path = small_disk / "model.onnx"
    old_program.save(path, external_data=True)
    before = _files(small_disk)
    _, too_large = _program(2, features=600)  # 1.4 MB of weights: more than the disk holds
    with pytest.raises(OSError) as caught:
        too_large.save(path, external_data=external_data)
    assert caught.value.errno == errno.ENOSPC
    assert _files(small_disk) == before
    _assert_saved_model_is(path, old_model)


def test_a_killed_saves_temporary_folder_is_removed_by_the_next_save(tmp_path: Path, old_and_new: tuple) -> None:
    """A save killed (SIGKILL) while writing leaves its temporary folder; the next save in that folder removes
    it, and leaves alone the temporary folder of a save still running (this process's)."""
    old_model, old_program, _, _ = old_and_new
    path = tmp_path / "model.onnx"
    killed_save = textwrap.dedent(
        f"""
        import os, signal, torch, fx2onnx
        from fx2onnx import _streaming as streaming
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh()).eval()
        program = fx2onnx.export(model, (torch.randn(2, 64),))
        def killed(file, array):
            file.write(array.reshape(-1).view("u1")[:100].data)
            file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        streaming._write_array = killed
        program.save({os.fspath(path)!r}, external_data=True)
        """
    )
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", killed_save], env=environment, capture_output=True)
    assert result.returncode == -9, result.stderr.decode()[-2000:]
    (left,) = os.listdir(tmp_path)
    assert left.startswith(safe_save.TEMPORARY_PREFIX) and _files(tmp_path / left)
    live = tmp_path / f"{safe_save.TEMPORARY_PREFIX}{safe_save._host()}-{os.getpid()}-0123abcd"
    live.mkdir()
    # What earlier versions left (mkdtemp, no process in the name): removed once a day old, not before.
    legacy_old, legacy_recent = tmp_path / ".fx2onnx-k3j_9x2a", tmp_path / ".fx2onnx-p0q8r7s6"
    for legacy in (legacy_old, legacy_recent):
        legacy.mkdir()
        (legacy / "model.onnx").write_bytes(b"partial")
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(legacy_old, (two_days_ago, two_days_ago))
    old_program.save(path, external_data=True)
    assert sorted(os.listdir(tmp_path)) == sorted(["model.onnx", "model.onnx.data", live.name, legacy_recent.name])
    _assert_saved_model_is(path, old_model)


def test_files_and_folders_are_flushed_before_and_after_each_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_and_new: tuple
) -> None:
    """fsync of each file before it is renamed into place, and of the folder after, so that the rename survives a
    power loss (ext4 and XFS may otherwise persist a rename before the data it points to)."""
    _, program, _, _ = old_and_new
    path = tmp_path / "model.onnx"
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def record_fsync(descriptor: int) -> None:
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{descriptor}"))))
        fsync(descriptor)

    def record_replace(source: str, destination: str) -> None:
        events.append(("replace", os.path.basename(destination)))
        replace(source, destination)

    monkeypatch.setattr(os, "fsync", record_fsync)
    monkeypatch.setattr(os, "replace", record_replace)
    program.save(path, external_data=True)
    folder = tmp_path.name
    assert events.index(("fsync", "model.onnx.data")) < events.index(("replace", "model.onnx.data"))
    assert events.index(("fsync", "model.onnx")) < events.index(("replace", "model.onnx.data"))
    assert events.index(("replace", "model.onnx.data")) < events.index(("replace", "model.onnx"))
    assert ("fsync", folder) in events[events.index(("replace", "model.onnx")) :]


def test_a_save_that_need_not_survive_a_power_loss_skips_the_flushes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_and_new: tuple
) -> None:
    model, program, _, _ = old_and_new
    flushed: list[int] = []
    monkeypatch.setattr(os, "fsync", flushed.append)
    program.save(tmp_path / "model.onnx", external_data=True, durable=False)
    assert flushed == []
    program.save(tmp_path / "model.onnx", external_data=True)
    assert len(flushed) >= 4  # the model, its weights, and the folder after each of the two renames
    monkeypatch.undo()
    _assert_saved_model_is(tmp_path / "model.onnx", model)


class _Branches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(16, 16)
        self.second = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(
            x.sum() > 0, lambda v: self.first(v), lambda v: self.second(v).relu() * torch.arange(16.0), (x,)
        )


def test_the_files_a_model_references_are_read_without_parsing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan of the replaced model's wire format finds what onnx finds: initializers, tensors in attributes,
    in subgraphs (If branches), each in a file of its own; without loading the model (nor its weights)."""
    program = fx2onnx.export(_Branches().eval(), (torch.randn(2, 16),), optimize=False)
    proto = program.model_proto
    onnx.external_data_helper.convert_model_to_external_data(
        proto, all_tensors_to_one_file=False, size_threshold=0, convert_attribute=True
    )
    path = tmp_path / "model.onnx"
    onnx.save_model(proto, path)
    expected = {
        entry.value
        for tensor in onnx.external_data_helper._get_all_tensors(proto)
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }
    branches = [a.g for node in proto.graph.node if node.op_type == "If" for a in node.attribute]
    in_branches = [t.name for g in branches for n in g.node for a in n.attribute if a.HasField("t") for t in [a.t]]
    assert len(expected) >= 5 and in_branches  # weights, a Constant, and a Constant inside a branch

    def no_parsing(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was parsed")

    monkeypatch.setattr(onnx, "load_model", no_parsing)
    assert safe_save.referenced_files(os.fspath(path)) == expected
    path.write_bytes(b"\xff\xff not an ONNX model")
    assert safe_save.referenced_files(os.fspath(path)) == set()
