"""Write an ONNX model without copying its weights.

``ir.save`` builds the whole ``ModelProto`` in memory (a copy of every weight) and serializes it (a
second copy) before writing; with external data it still copies each tensor (``tobytes``) on its
way out. Here only the graph's structure goes through protobuf; each initializer's bytes go from
the tensor's own memory (the torch parameter) straight to the file; a strided view (a weight the
optimizer folded through a Transpose) goes through small contiguous blocks.

In a single file, the bytes follow the protobuf wire format: fields may come in any order, so the
large initializers are appended to the graph after its other fields, each as a ``TensorProto``
whose ``raw_data`` is written last.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import onnx
import onnx_ir as ir
from onnx_ir.tensor_adapters import TorchTensor

# Tensors smaller than this go through protobuf as usual; streaming them would not save anything.
STREAM_THRESHOLD_BYTES = 1024
# Strided tensors are written through a buffer of about this size, filled tile by tile.
_BLOCK_BYTES = 8 * 2**20
_TILE = 128

_MODEL_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_GRAPH_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_TENSOR_RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
_LENGTH_DELIMITED = 2
_PROTOBUF_LIMIT = 2**31


def writes_protobuf(path: str | os.PathLike[str]) -> bool:
    """Whether ``onnx.save`` would write `path` in the binary protobuf format (not text or JSON)."""
    extension = os.path.splitext(os.fspath(path))[1]
    return onnx.serialization.registry.get_format_from_file_extension(extension) in (None, "protobuf")


def save_model(model: ir.Model, path: str | os.PathLike[str], external_data: str | None = None) -> None:
    """Write `model` to `path`; with `external_data` (a file name beside `path`), weights go there.

    The model is unchanged afterwards.
    """
    if external_data is not None:
        _save_with_external_data(model, os.fspath(path), external_data)
    else:
        _save_single_file(model, os.fspath(path))


def _save_single_file(model: ir.Model, path: str) -> None:
    streamed = [v for v in model.graph.initializers.values() if _streamable(v.const_value)]
    tensors = {value.name: value.const_value for value in streamed}
    with _stand_ins(streamed, location=""):
        proto = ir.to_proto(model)

    headers: dict[str, bytes] = {}
    initializers = proto.graph.initializer
    for index in reversed(range(len(initializers))):
        tensor_proto = initializers[index]
        if tensor_proto.name in tensors:
            tensor_proto.ClearField("data_location")
            tensor_proto.ClearField("external_data")
            headers[tensor_proto.name] = tensor_proto.SerializeToString()
            del initializers[index]
    graph_bytes = proto.graph.SerializeToString()
    proto.ClearField("graph")
    model_bytes = proto.SerializeToString()

    entries = []
    for name, tensor in tensors.items():
        data_key = _key(_TENSOR_RAW_DATA) + _varint(tensor.nbytes)
        entry_length = len(headers[name]) + len(data_key) + tensor.nbytes
        entries.append((_key(_GRAPH_INITIALIZER) + _varint(entry_length) + headers[name] + data_key, tensor))
    graph_length = len(graph_bytes) + sum(len(prefix) + tensor.nbytes for prefix, tensor in entries)
    if len(model_bytes) + graph_length >= _PROTOBUF_LIMIT:
        raise ValueError(
            f"the model is {(len(model_bytes) + graph_length) / 2**30:.2f} GB, above protobuf's 2 GB limit for one "
            "file: save it with external_data=True"
        )

    with open(path, "wb") as file:
        file.write(model_bytes)
        file.write(_key(_MODEL_GRAPH) + _varint(graph_length))
        file.write(graph_bytes)
        for prefix, tensor in entries:
            file.write(prefix)
            _write_tensor(file, tensor)


def _save_with_external_data(model: ir.Model, path: str, data_name: str) -> None:
    if os.path.isabs(data_name):
        raise ValueError(f"the external data path must be relative to the model file, not {data_name!r}")
    external = [
        v
        for v in model.graph.initializers.values()
        if v.const_value is not None
        and not isinstance(v.const_value, ir.StringTensor)
        and v.const_value.nbytes >= STREAM_THRESHOLD_BYTES
    ]
    offsets: dict[str, int] = {}
    with open(os.path.join(os.path.dirname(path), data_name), "wb") as file:
        for value in external:
            offsets[value.name] = file.tell()
            _write_tensor(file, value.const_value)
    with _stand_ins(external, location=data_name, offsets=offsets):
        proto = ir.to_proto(model)
    onnx.save_model(proto, path)


@contextlib.contextmanager
def _stand_ins(values: list[ir.Value], *, location: str, offsets: dict[str, int] | None = None) -> Iterator[None]:
    """Temporarily give `values` external tensors that carry their name, dtype, shape and metadata only."""
    originals = [(value, value.const_value) for value in values]
    try:
        for value, tensor in originals:
            assert tensor is not None
            value.const_value = ir.ExternalTensor(
                location,
                (offsets or {}).get(value.name, 0),
                tensor.nbytes,
                tensor.dtype,
                shape=ir.Shape(list(tensor.shape)),
                name=value.name or "",
                doc_string=tensor.doc_string,
                metadata_props=dict(tensor.metadata_props) or None,
            )
        yield
    finally:
        for value, tensor in originals:
            value.const_value = tensor


def _streamable(tensor: ir.TensorProtocol | None) -> bool:
    return (
        sys.byteorder == "little"  # raw_data is little-endian; elsewhere let onnx_ir convert
        and type(tensor) in (TorchTensor, ir.Tensor)
        and tensor.dtype != ir.DataType.STRING
        and tensor.dtype.bitwidth % 8 == 0
        and tensor.nbytes >= STREAM_THRESHOLD_BYTES
    )


def _write_tensor(file: BinaryIO, tensor: ir.TensorProtocol) -> None:
    if _streamable(tensor):
        written = _write_array(file, tensor.numpy())
    else:
        data = tensor.tobytes()
        file.write(data)
        written = len(data)
    if written != tensor.nbytes:
        raise OSError(f"wrote {written} bytes for initializer {tensor.name!r}, expected {tensor.nbytes}")


def _write_array(file: BinaryIO, array: np.ndarray) -> int:
    """Write an array's bytes in C order: from its own memory, or through a small buffer if it is strided."""
    if array.dtype.itemsize in (1, 2, 4, 8):
        array = array.view(f"u{array.dtype.itemsize}")  # numpy copies custom dtypes (bfloat16) element by element
    if array.flags.c_contiguous:
        file.write(array.reshape(-1).view(np.uint8).data)
        return array.nbytes
    if array.ndim != 2:
        array = array.reshape(array.shape[0], -1) if array.ndim > 2 else array.reshape(1, -1)  # may copy; rare
    # A strided view, e.g. a weight the optimizer folded through a Transpose: copy tile by tile (cache-friendly)
    # into a reused buffer of a few rows, and write each block of rows.
    rows, columns = array.shape
    block_rows = max(_TILE, _BLOCK_BYTES // max(1, columns * array.itemsize) // _TILE * _TILE)
    buffer = np.empty((min(rows, block_rows), columns), array.dtype)
    written = 0
    for begin in range(0, rows, block_rows):
        end = min(rows, begin + block_rows)
        block = buffer[: end - begin]
        for row in range(begin, end, _TILE):
            for column in range(0, columns, _TILE):
                block[row - begin : row - begin + _TILE, column : column + _TILE] = array[
                    row : row + _TILE, column : column + _TILE
                ]
        file.write(block.reshape(-1).view(np.uint8).data)
        written += block.nbytes
    return written


def _key(field_number: int) -> bytes:
    return _varint(field_number << 3 | _LENGTH_DELIMITED)


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        if number:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


__all__ = ["STREAM_THRESHOLD_BYTES", "save_model", "writes_protobuf"]
