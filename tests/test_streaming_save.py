"""``ONNXProgram.save`` streams weights from the torch tensors: the file must equal what protobuf writes."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest
import torch
from onnx_ir.tensor_adapters import TorchTensor

import fx2onnx
from fx2onnx import _streaming as streaming


class _Mixed(torch.nn.Module):
    """float32 and bfloat16 weights, a buffer, and a small bias below the streaming threshold."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(32, 48)
        self.second = torch.nn.Linear(48, 8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x))) * self.scale


def _exported() -> tuple[torch.nn.Module, torch.Tensor, fx2onnx.ONNXProgram]:
    torch.manual_seed(0)
    model = _Mixed().eval()
    x = torch.randn(3, 32)
    program = fx2onnx.export(model, (x,))
    # A numpy-backed initializer as onnxscript's constant folding makes them, next to the torch ones.
    extra = ir.Value(name="numpy_weight", const_value=ir.tensor(np.arange(600, dtype=np.int64), name="numpy_weight"))
    program.model.graph.register_initializer(extra)
    # A strided view, as folding a Transpose of a weight leaves it, and a non-contiguous torch tensor.
    strided = np.arange(1200, dtype=np.float32).reshape(30, 40).T
    program.model.graph.register_initializer(ir.Value(name="strided", const_value=ir.Tensor(strided, name="strided")))
    transposed = TorchTensor(torch.arange(600, dtype=torch.float32).reshape(20, 30).T, name="transposed")
    program.model.graph.register_initializer(ir.Value(name="transposed", const_value=transposed))
    permuted = ir.Tensor(
        np.arange(2 * 300 * 7, dtype=np.float16).reshape(2, 300, 7).transpose(2, 0, 1), name="permuted"
    )
    program.model.graph.register_initializer(ir.Value(name="permuted", const_value=permuted))
    return model, x, program


def _initializers(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}


@pytest.mark.parametrize("direct_io", [None, True], ids=["buffered", "direct-io"])
@pytest.mark.parametrize("external_data", [False, True])
def test_saved_file_equals_protobuf_serialization(
    tmp_path: os.PathLike[str], external_data: bool, direct_io: bool | None
) -> None:
    model, x, program = _exported()
    path = os.path.join(tmp_path, "model.onnx")
    program.save(path, external_data=external_data, direct_io=direct_io)
    assert os.path.exists(path + ".data") == external_data

    saved = onnx.load(path)
    expected = ir.to_proto(program.model)
    saved_weights, expected_weights = _initializers(saved), _initializers(expected)
    assert saved_weights.keys() == expected_weights.keys()
    for name, array in expected_weights.items():
        assert saved_weights[name].dtype == array.dtype, name
        np.testing.assert_array_equal(saved_weights[name], array, err_msg=name)
    # Everything but the initializers is byte for byte what protobuf serializes.
    del saved.graph.initializer[:]
    del expected.graph.initializer[:]
    assert saved.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)

    onnx.checker.check_model(path, full_check=True)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    (actual,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(actual), model(x).detach(), rtol=1e-5, atol=1e-5)


def test_direct_io_by_default_only_beyond_the_dirty_page_throttling_point(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not streaming.direct_io_by_default(streaming.DIRECT_IO_THRESHOLD_BYTES - 1)
    throttled_from = streaming._dirty_throttle_bytes()
    if throttled_from is None or not hasattr(os, "O_DIRECT"):
        pytest.skip("needs Linux's /proc/sys/vm and O_DIRECT")
    assert throttled_from > 0
    # The limit follows MemAvailable, which other processes change between two reads: compare with this one.
    monkeypatch.setattr(streaming, "_dirty_throttle_bytes", lambda: throttled_from)
    below = max(streaming.DIRECT_IO_THRESHOLD_BYTES, throttled_from)
    assert not streaming.direct_io_by_default(below)
    assert streaming.direct_io_by_default(below + 1)


def test_direct_io_writes_exact_bytes_across_buffer_boundaries(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "blob")
    rng = np.random.default_rng(0)
    # Pieces smaller and larger than the aligned buffer, of odd lengths, so that blocks straddle pieces.
    pieces = [rng.integers(0, 256, size, dtype=np.uint8) for size in (5, 3 * 2**20 + 7, 9 * 2**20 + 1, 4095, 1)]
    file = streaming._open_for_writing(path, 0, direct_io=True)
    if not isinstance(file, streaming._DirectFile):
        file.close()
        pytest.skip("the file system of tmp_path has no direct I/O")
    with file:
        for piece in pieces:
            assert file.write(piece.data) == piece.nbytes
        assert file.tell() == sum(p.nbytes for p in pieces)
    with open(path, "rb") as written:
        assert written.read() == b"".join(p.tobytes() for p in pieces)


def test_direct_io_falls_back_to_buffered_writes_on_einval(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "blob")
    file = streaming._open_for_writing(path, 0, direct_io=True)
    if not isinstance(file, streaming._DirectFile):
        file.close()
        pytest.skip("the file system of tmp_path has no direct I/O")
    with file:
        file.write(b"0123456789")
        file._hand_over(10)  # an unaligned direct write: the kernel answers EINVAL, the file goes buffered
        file.write(b"abc" * 5000)
    assert not file.direct
    with open(path, "rb") as written:
        assert written.read() == b"0123456789" + b"abc" * 5000


def test_direct_io_goes_buffered_on_a_disk_slower_than_the_threshold(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No disk is this fast: the probe must switch to buffered writes after its first buffer.
    monkeypatch.setattr(streaming, "DIRECT_IO_PROBE_BYTES", 1)
    monkeypatch.setattr(streaming, "DIRECT_IO_MIN_BYTES_PER_SECOND", 2**60)
    path = os.path.join(tmp_path, "blob")
    data = np.random.default_rng(1).integers(0, 256, 20 * 2**20 + 3, dtype=np.uint8)
    file = streaming._open_for_writing(path, 0, direct_io=True)
    if not isinstance(file, streaming._DirectFile):
        file.close()
        pytest.skip("the file system of tmp_path has no direct I/O")
    with file:
        file.write(data.data)
    assert not file.direct
    with open(path, "rb") as written:
        assert written.read() == data.tobytes()


def test_bfloat16_weights_stream_bit_exact(tmp_path: os.PathLike[str]) -> None:
    torch.manual_seed(0)
    # Larger than legalization's FOLD_LIMIT and the optimizer's constant-folding limit (8192 elements): the weight
    # stays bfloat16 (with a Cast) rather than converted ahead of time
    model = torch.nn.Linear(128, 96).to(torch.bfloat16).eval()
    program = fx2onnx.export(model, (torch.randn(2, 128, dtype=torch.bfloat16),))
    path = os.path.join(tmp_path, "model.onnx")
    program.save(path)
    saved = {t.name: t.raw_data for t in onnx.load(path).graph.initializer}
    assert saved["weight"] == model.weight.detach().view(torch.int16).numpy().tobytes()


def test_text_formats_are_left_to_onnx(tmp_path: os.PathLike[str]) -> None:
    assert streaming.writes_protobuf("model.onnx")
    assert not streaming.writes_protobuf("model.textproto")
    _, _, program = _exported()
    path = os.path.join(tmp_path, "model.textproto")
    program.save(path)
    with open(path) as text:
        assert "numpy_weight" in text.read()


@pytest.mark.parametrize("external_data", [False, True])
def test_failure_while_streaming_leaves_no_file(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch, external_data: bool
) -> None:
    _, _, program = _exported()

    def fail(file: object, array: np.ndarray) -> int:
        raise OSError("disk full")

    monkeypatch.setattr(streaming, "_write_array", fail)
    with pytest.raises(OSError, match="disk full"):
        program.save(os.path.join(tmp_path, "model.onnx"), external_data=external_data)
    assert os.listdir(tmp_path) == []


class _Recorder:
    """A file that keeps what is written, and fails once more than `capacity` bytes are (a full disk)."""

    def __init__(self, capacity: int | None = None) -> None:
        self.chunks: list[bytes] = []
        self.capacity = capacity

    def write(self, data: object) -> int:
        chunk = bytes(memoryview(data).cast("B"))  # type: ignore[arg-type]
        if self.capacity is not None and self.tell() + len(chunk) > self.capacity:
            raise OSError(28, "No space left on device")
        self.chunks.append(chunk)
        return len(chunk)

    def tell(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)


@pytest.mark.parametrize(
    "array",
    [
        # Larger than the whole-copy size: tiles into blocks of rows, written by the writer thread one by one.
        np.arange(4100 * 4200, dtype=np.float16).reshape(4100, 4200).T,
        np.arange(2000 * 3000, dtype=np.float32).reshape(2000, 3000).T,  # copied whole by torch
        np.arange(1200, dtype=np.float32).reshape(30, 40)[::-1],  # negative strides: tiles
        np.broadcast_to(np.arange(300, dtype=np.int64), (40, 300)),  # zero strides
        np.zeros((300, 500), dtype=bool).T,
    ],
    ids=["tiles", "whole", "negative-strides", "broadcast", "bool"],
)
def test_strided_arrays_are_written_in_c_order(array: np.ndarray) -> None:
    file = _Recorder()
    assert streaming._write_array(file, array) == array.nbytes
    assert b"".join(file.chunks) == np.ascontiguousarray(array).tobytes()


def test_a_failed_write_in_the_writer_thread_fails_the_save() -> None:
    array = np.arange(4100 * 4200, dtype=np.float16).reshape(4100, 4200).T
    file = _Recorder(capacity=array.nbytes // 3)
    with pytest.raises(OSError, match="No space left"):
        streaming._write_array(file, array)
    written = file.tell()
    assert 0 < written <= array.nbytes // 3
    assert b"".join(file.chunks) == np.ascontiguousarray(array).tobytes()[:written]
