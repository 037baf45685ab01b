"""Write an ONNX model without copying its weights.

``ir.save`` builds the whole ``ModelProto`` in memory (a copy of every weight) and serializes it (a
second copy) before writing; with external data it still copies each tensor (``tobytes``) on its
way out. Here only the graph's structure goes through protobuf; each initializer's bytes go from
the tensor's own memory (the torch parameter) straight to the file; a strided view (a weight the
optimizer folded through a Transpose) goes through small contiguous blocks.

With ``save(weights="reference")``, weights that a checkpoint holds as the model needs them are not written at
all: their external data points at the checkpoint's own bytes (``_save_with_references``).

In a single file, the bytes follow the protobuf wire format: fields may come in any order, so the
large initializers are appended to the graph after its other fields, each as a ``TensorProto``
whose ``raw_data`` is written last.

Files larger than the kernel lets writers dirty before throttling them are written with direct I/O
(``O_DIRECT``, Linux) through small aligned buffers. Buffered writes of such a file proceed at the disk's
speed anyway once the dirty-page limit is reached, and then also evict the user's page cache; direct
writes skip the copy into the page cache (7B LLaMA, 12.55 GiB on this machine: 46 s buffered, 24 s direct).
Smaller files are buffered by default, since a buffered file is in the page cache for the next load: on
the machine we measured, a 475 MB GPT-2 saved in 0.43 s direct against 1.26 s buffered, but ONNX Runtime
then loaded it in 2.06 s against 0.90 s, more in all (benchmarks/save_modes.py). ``direct_io=True`` asks
for direct writes anyway (exports in a loop that are not loaded at once); where the file system refuses
``O_DIRECT``, or its first 64 MB go slower than 500 MB/s (a disk the page cache outruns), writes go buffered.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import queue
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np
import onnx
import onnx_ir as ir
import torch
from onnx_ir.tensor_adapters import TorchTensor

from fx2onnx._weights import CheckpointTensor

# Above this many bytes of weights, a model goes to external data (protobuf's limit is 2 GB).
EXTERNAL_DATA_THRESHOLD = int(1.5 * 1024**3)
# Tensors smaller than this go through protobuf as usual; streaming them would not save anything.
STREAM_THRESHOLD_BYTES = 1024
# Strided tensors are written through buffers of about this size, filled tile by tile...
_BLOCK_BYTES = 8 * 2**20
_TILE = 128
# ...or, up to this size, copied whole by torch (two such buffers live during a save).
_WHOLE_COPY_BYTES = 32 * 2**20

_MODEL_GRAPH = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
_GRAPH_INITIALIZER = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
_TENSOR_RAW_DATA = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
_LENGTH_DELIMITED = 2
_PROTOBUF_LIMIT = 2**31
# Direct I/O is never used by default below this size, whatever the dirty-page limits.
DIRECT_IO_THRESHOLD_BYTES = 64 * 2**20
# Direct I/O needs buffer addresses, lengths and file offsets aligned to the device's logical block size:
# 4096 covers every common one. The buffer is an anonymous mmap, hence page-aligned.
_DIRECT_ALIGNMENT = 4096
_DIRECT_BUFFER_BYTES = 8 * 2**20
# Direct writes wait for the disk. Where the first 64 MB go slower than this (a spinning or network disk,
# where the page cache would absorb the file sooner), the rest of the file is written buffered.
DIRECT_IO_PROBE_BYTES = 64 * 2**20
DIRECT_IO_MIN_BYTES_PER_SECOND = 500 * 2**20


def writes_protobuf(path: str | os.PathLike[str]) -> bool:
    """Whether ``onnx.save`` would write `path` in the binary protobuf format (not text or JSON)."""
    extension = os.path.splitext(os.fspath(path))[1]
    return onnx.serialization.registry.get_format_from_file_extension(extension) in (None, "protobuf")


def save_model(
    model: ir.Model,
    path: str | os.PathLike[str],
    external_data: str | None = None,
    *,
    direct_io: bool | None = None,
    reference_from: str | None = None,
) -> None:
    """Write `model` to `path`; with `external_data` (a file name beside `path`), weights go there.

    `direct_io`: write the weights' file with direct I/O (None: when it is larger than the kernel's
    dirty-page throttling point, see :func:`direct_io_by_default`). `reference_from` (the folder the model will
    be in once saved; `path` may be a staging copy inside it): initializers that are a checkpoint's bytes as they
    are point at them in the checkpoint's files instead of being copied (see :func:`_save_with_references`);
    `external_data` then receives only the others, and is not written if there are none. The model is unchanged
    afterwards.
    """
    with _scratch_for_this_save():
        if reference_from is not None:
            assert external_data is not None
            _save_with_references(model, os.fspath(path), external_data, reference_from, direct_io)
        elif external_data is not None:
            _save_with_external_data(model, os.fspath(path), external_data, direct_io)
        else:
            _save_single_file(model, os.fspath(path), direct_io)


def _save_single_file(model: ir.Model, path: str, direct_io: bool | None) -> None:
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

    with _open_for_writing(path, len(model_bytes) + graph_length, direct_io) as file:
        file.write(model_bytes)
        file.write(_key(_MODEL_GRAPH) + _varint(graph_length))
        file.write(graph_bytes)
        for prefix, tensor in entries:
            file.write(prefix)
            _write_tensor(file, tensor)


def _save_with_external_data(model: ir.Model, path: str, data_name: str, direct_io: bool | None) -> None:
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
    data_bytes = sum(value.const_value.nbytes for value in external if value.const_value is not None)
    with _open_for_writing(os.path.join(os.path.dirname(path), data_name), data_bytes, direct_io) as file:
        for value in external:
            offsets[value.name] = file.tell()
            _write_tensor(file, value.const_value)
    with _stand_ins(external, location=data_name, offsets=offsets):
        proto = ir.to_proto(model)
    onnx.save_model(proto, path)


def _save_with_references(model: ir.Model, path: str, data_name: str, folder: str, direct_io: bool | None) -> None:
    """Save with the checkpoint's tensors referenced where they lie (``save(weights="reference")``).

    The model will be in `folder` (`path` may be a staging copy inside it). ONNX external data names a file
    relative to the model's folder, and ``onnx.checker`` (``full_check``) refuses absolute paths, ``..``, symbolic
    links and files with several hard links (it reads those as attacks), so the checkpoint's files must lie in the
    model's folder or below it, as they are: the model is saved into the checkpoint's folder (or a folder holding
    it). A weight the optimizer folded through a Transpose is referenced in the checkpoint's layout and a
    ``Transpose`` node restores the graph's (ONNX Runtime folds it when the session is created). Tensors converted
    to another dtype, or given in memory, are copied to `data_name` as usual.
    """
    referenced: list[ir.Value] = []
    copied: list[ir.Value] = []
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, CheckpointTensor) and tensor.checkpoint_bytes and tensor.nbytes:
            referenced.append(value)  # whatever its size: nothing of the checkpoint is copied
        elif tensor is not None and not isinstance(tensor, ir.StringTensor) and tensor.nbytes >= STREAM_THRESHOLD_BYTES:
            copied.append(value)
    converted = [
        value for value in copied if isinstance(value.const_value, CheckpointTensor) and value.const_value.stored.path
    ]
    if converted:
        converted_bytes = sum(value.const_value.nbytes for value in converted if value.const_value is not None)
        example = converted[0].const_value
        assert isinstance(example, CheckpointTensor)
        warnings.warn(
            f"weights='reference': {len(converted)} weights ({converted_bytes / 2**20:.1f} MiB) are converted from "
            f"the checkpoint's dtype and were copied to {data_name} (e.g. {example.stored.name!r}: "
            f"{example.stored.dtype} in the checkpoint, {example.torch_dtype} in the model); build the model in the "
            "checkpoint's dtype to reference them in place",
            stacklevel=4,
        )

    locations = _checkpoint_locations(referenced, folder)
    offsets: dict[str, int] = {}
    if copied:
        data_bytes = sum(value.const_value.nbytes for value in copied if value.const_value is not None)
        with _open_for_writing(os.path.join(os.path.dirname(path), data_name), data_bytes, direct_io) as file:
            for value in copied:
                offsets[value.name or ""] = file.tell()
                _write_tensor(file, value.const_value)

    # Referenced tensors stand in under their own names in the checkpoint's layout; a permuted one is renamed to
    # its Transpose's input, or shares the initializer that already references the same bytes unpermuted (tied
    # weights: the embedding and the LM head).
    unpermuted: dict[tuple[str, int], str] = {}
    for value in referenced:
        tensor = value.const_value
        assert isinstance(tensor, CheckpointTensor)
        if not tensor.permutation:
            unpermuted.setdefault((tensor.stored.path or "", tensor.stored.offset), value.name or "")
    transposes: list[tuple[str, str, tuple[int, ...]]] = []  # (source initializer, graph value, permutation)
    sources: dict[str, ir.ExternalTensor] = {}
    taken = _names_in(model.graph)
    for value in referenced:
        tensor = value.const_value
        assert isinstance(tensor, CheckpointTensor)
        stored = tensor.stored
        key = (stored.path or "", stored.offset)
        external = ir.ExternalTensor(
            locations[stored.path or ""],
            stored.offset,
            tensor.nbytes,
            tensor.dtype,
            shape=ir.Shape(list(stored.shape)),
            name=value.name or "",
        )
        if not tensor.permutation:
            sources[value.name or ""] = external
            continue
        source_name = unpermuted.get(key)
        if source_name is None:
            source_name = stored.name if stored.name not in taken else f"{value.name}_untransposed"
            while source_name in taken:
                source_name += "_"
            taken.add(source_name)
            unpermuted[key] = source_name
            external.name = source_name
            sources[source_name] = external
        transposes.append((source_name, value.name or "", tensor.permutation))

    with _stand_ins(copied, location=data_name, offsets=offsets), _stand_ins_external(referenced, sources):
        proto = ir.to_proto(model)
    _insert_transposes(proto, transposes, sources, referenced)
    from fx2onnx._weights import CHECKPOINT_FILES_METADATA

    entry = proto.metadata_props.add()  # files the model references but does not own: a later save keeps them
    entry.key, entry.value = CHECKPOINT_FILES_METADATA, json.dumps(sorted(set(locations.values())))
    onnx.save_model(proto, path)


def _names_in(graph: ir.Graph) -> set[str]:
    names = {value.name for value in (*graph.inputs, *graph.outputs, *graph.initializers.values()) if value.name}
    for node in graph.all_nodes():
        names.update(value.name for value in (*node.inputs, *node.outputs) if value is not None and value.name)
    return names


def _checkpoint_locations(referenced: list[ir.Value], folder: str) -> dict[str, str]:
    """{checkpoint file: its location relative to `folder`} for the files `referenced` tensors lie in, each
    checked as ``onnx.checker`` will check it (inside `folder`, no symbolic link on the way, one hard link), and
    its safetensors header read again: every referenced tensor must still be where the export found it."""
    from fx2onnx._weights import WeightsError, read_header

    by_file: dict[str, list[CheckpointTensor]] = {}
    for value in referenced:
        tensor = value.const_value
        assert isinstance(tensor, CheckpointTensor) and tensor.stored.path is not None
        by_file.setdefault(tensor.stored.path, []).append(tensor)
    root = os.path.realpath(folder)
    locations: dict[str, str] = {}
    for checkpoint_file, tensors in by_file.items():
        if not os.path.exists(checkpoint_file):
            raise WeightsError(
                f"weights='reference': the checkpoint file {checkpoint_file} (read at export) is gone: save while "
                "the checkpoint is where it was at export, or export again from where it is now"
            )
        real = os.path.realpath(checkpoint_file)
        if os.path.commonpath([root, real]) != root:
            raise WeightsError(
                f"weights='reference' points the model's external data at the checkpoint's files, which ONNX requires "
                f"inside the model's folder (onnx.checker refuses '..', absolute paths, symbolic and hard links), "
                f"and {checkpoint_file} is not inside {folder}: save the model into the checkpoint's folder "
                f"({os.path.dirname(checkpoint_file)}/model.onnx), or with weights='copy' (the default)"
            )
        if os.path.islink(checkpoint_file):
            raise WeightsError(
                f"weights='reference': {checkpoint_file} is a symbolic link (to {real}; Hugging Face's cache holds "
                "such links), which onnx.checker refuses for external data: export from the real files, or save "
                "with weights='copy'"
            )
        if os.stat(real).st_nlink > 1:
            raise WeightsError(
                f"weights='reference': {checkpoint_file} has {os.stat(real).st_nlink} hard links, and onnx.checker "
                "refuses external data with more than one: keep one link, or save with weights='copy'"
            )
        header = read_header(real)
        for tensor in tensors:
            found = header.get(tensor.stored.name)
            if found is None or (found.offset, found.dtype, found.shape) != (
                tensor.stored.offset,
                tensor.stored.dtype,
                tensor.stored.shape,
            ):
                raise WeightsError(
                    f"weights='reference': {checkpoint_file} changed since the export: tensor "
                    f"{tensor.stored.name!r} is no longer where the export found it; export again"
                )
        locations[checkpoint_file] = os.path.relpath(real, root).replace(os.sep, "/")
    return locations


@contextlib.contextmanager
def _stand_ins_external(values: list[ir.Value], sources: dict[str, ir.ExternalTensor]) -> Iterator[None]:
    """Temporarily give `values` their references into the checkpoint: their own where they are unpermuted; a
    permuted one, whose initializer is replaced by a Transpose of its source, a stand-in dropped after."""
    originals = [(value, value.const_value) for value in values]
    try:
        for value, tensor in originals:
            assert isinstance(tensor, CheckpointTensor)
            own = sources.get(value.name or "")
            value.const_value = own if own is not None and not tensor.permutation else _placeholder(tensor, value)
        yield
    finally:
        for value, tensor in originals:
            value.const_value = tensor


def _placeholder(tensor: CheckpointTensor, value: ir.Value) -> ir.ExternalTensor:
    return ir.ExternalTensor("", 0, tensor.nbytes, tensor.dtype, shape=ir.Shape(list(tensor.shape)), name=value.name)


def _insert_transposes(
    proto: onnx.ModelProto,
    transposes: list[tuple[str, str, tuple[int, ...]]],
    sources: dict[str, ir.ExternalTensor],
    referenced: list[ir.Value],
) -> None:
    """Replace each permuted initializer of `proto` by a Transpose of its source initializer (added once), and
    update the provenance metadata (which checkpoint tensor each initializer holds) to match."""
    from fx2onnx._weights import CHECKPOINT_METADATA, CheckpointTensor

    if not transposes:
        return
    graph = proto.graph
    permuted = {value_name for _, value_name, _ in transposes}
    kept = [initializer for initializer in graph.initializer if initializer.name not in permuted]
    present = {initializer.name for initializer in kept}
    for source_name, _, _ in transposes:
        if source_name not in present:
            kept.append(ir.serde.serialize_tensor(sources[source_name]))
            present.add(source_name)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = [
        onnx.helper.make_node(
            "Transpose", [source_name], [value_name], name=f"{value_name}_from_checkpoint", perm=list(permutation)
        )
        for source_name, value_name, permutation in transposes
    ]
    existing = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + existing)

    # Provenance: each initializer now holds its checkpoint tensor unpermuted.
    stored_names = {}
    for value in referenced:
        tensor = value.const_value
        if isinstance(tensor, CheckpointTensor):
            stored_names[value.name] = tensor.stored.name
    for prop in proto.metadata_props:
        if prop.key != CHECKPOINT_METADATA:
            continue
        provenance = {name: entry for name, entry in json.loads(prop.value).items() if name not in permuted}
        for source_name, value_name, _ in transposes:
            stored_name = stored_names.get(value_name, source_name)
            if stored_name != source_name:
                provenance[source_name] = [stored_name, None]
        prop.value = json.dumps(provenance, separators=(",", ":"))


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
        and type(tensor) in (TorchTensor, ir.Tensor, CheckpointTensor)
        and tensor.dtype != ir.DataType.STRING
        and tensor.dtype.bitwidth % 8 == 0
        and tensor.nbytes >= STREAM_THRESHOLD_BYTES
    )


def _write_tensor(file: _Sink, tensor: ir.TensorProtocol) -> None:
    if isinstance(tensor, CheckpointTensor):  # read from the checkpoint block by block (fx2onnx/_weights.py)
        written = tensor.stream_to(file)
    elif _streamable(tensor):
        written = _write_array(file, tensor.numpy())
    else:
        data = tensor.tobytes()
        file.write(data)
        written = len(data)
    if written != tensor.nbytes:
        raise OSError(f"wrote {written} bytes for initializer {tensor.name!r}, expected {tensor.nbytes}")


def _write_array(file: _Sink, array: np.ndarray) -> int:
    """Write an array's bytes in C order: from its own memory, or through small buffers if it is strided."""
    if array.dtype.itemsize in (1, 2, 4, 8):
        array = array.view(f"i{array.dtype.itemsize}")  # numpy copies custom dtypes (bfloat16) element by element
    if array.flags.c_contiguous:
        file.write(array.reshape(-1).view(np.uint8).data)
        return array.nbytes
    if array.ndim != 2:
        array = array.reshape(array.shape[0], -1) if array.ndim > 2 else array.reshape(1, -1)  # may copy; rare
    # A strided view, e.g. a weight the optimizer folded through a Transpose: copied into one of two reused
    # buffers, which a writer thread writes out while the next block is copied into the other (the copy and the
    # kernel's copy into the page cache overlap).
    scratch = getattr(_save_scratch, "current", None)
    if scratch is None:
        with _Scratch() as scratch:
            return scratch.write_strided(file, array)
    return scratch.write_strided(file, array)


# The scratch buffers and writer thread of the save running in this thread (see `_Scratch`).
_save_scratch = threading.local()


class _Scratch:
    """Two reused buffers and a writer thread for a save's strided tensors.

    Reusing the buffers across tensors means their pages are touched once per save (fresh pages cost a page
    fault each, slow on VMs); a tensor no larger than `_WHOLE_COPY_BYTES` is copied in one piece by torch, whose
    transposing copy is several times faster than numpy's strided one; larger ones are copied tile by tile
    (cache-friendly) into blocks of rows.
    """

    def __init__(self) -> None:
        self._buffers: list[np.ndarray] = [np.empty(0, np.uint8), np.empty(0, np.uint8)]
        self._next = 0
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fx2onnx-save")
        self._pending: Future[Any] | None = None

    def __enter__(self) -> _Scratch:
        return self

    def __exit__(self, *exception: object) -> None:
        self._writer.shutdown(wait=True)
        self._buffers = []

    def _buffer(self, shape: tuple[int, int], dtype: np.dtype) -> np.ndarray:
        """The next free buffer (the other one may still be being written), as an array of `shape`."""
        nbytes = shape[0] * shape[1] * dtype.itemsize
        index, self._next = self._next, 1 - self._next
        if self._buffers[index].nbytes < nbytes:
            self._buffers[index] = np.empty(nbytes, np.uint8)
        return self._buffers[index][:nbytes].view(dtype).reshape(shape)

    def _hand_over(self, file: _Sink, block: np.ndarray) -> None:
        """Write `block` in the writer thread once the previous block is written (writes stay in order)."""
        self._wait()
        self._pending = self._writer.submit(file.write, block.reshape(-1).view(np.uint8).data)

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()  # re-raises the write's error (a full disk) here

    def write_strided(self, file: _Sink, array: np.ndarray) -> int:
        try:
            return self._copy_blocks(file, array)
        finally:
            self._wait()  # nothing is written behind the caller's back once this returns

    def _copy_blocks(self, file: _Sink, array: np.ndarray) -> int:
        rows, columns = array.shape
        if array.nbytes <= _WHOLE_COPY_BYTES and min(array.strides) >= 0:
            block = self._buffer((rows, columns), array.dtype)
            with warnings.catch_warnings():  # a read-only array is only read here
                warnings.filterwarnings("ignore", message=".*not writable", category=UserWarning)
                source = torch.from_numpy(array)
            torch.from_numpy(block).copy_(source)
            self._hand_over(file, block)
            return array.nbytes
        block_rows = max(_TILE, _BLOCK_BYTES // max(1, columns * array.itemsize) // _TILE * _TILE)
        written = 0
        for begin in range(0, rows, block_rows):
            end = min(rows, begin + block_rows)
            block = self._buffer((end - begin, columns), array.dtype)
            for row in range(begin, end, _TILE):
                for column in range(0, columns, _TILE):
                    block[row - begin : row - begin + _TILE, column : column + _TILE] = array[
                        row : row + _TILE, column : column + _TILE
                    ]
            self._hand_over(file, block)
            written += block.nbytes
        return written


@contextlib.contextmanager
def _scratch_for_this_save() -> Iterator[None]:
    if getattr(_save_scratch, "current", None) is not None:  # a save within a save: share the outer one's
        yield
        return
    with _Scratch() as scratch:
        _save_scratch.current = scratch
        try:
            yield
        finally:
            _save_scratch.current = None


class _Sink(Protocol):
    def write(self, data: Any, /) -> int: ...

    def tell(self) -> int: ...


def direct_io_by_default(expected_bytes: int) -> bool:
    """Whether a file of `expected_bytes` is written with direct I/O unless asked otherwise.

    Yes when Linux would throttle a buffered writer before the file is written: above the midpoint
    between its background and hard dirty-page limits (``vm.dirty_background_*``, ``vm.dirty_*``,
    relative to available memory), where the kernel starts slowing writers down to the disk's speed.
    """
    if expected_bytes < DIRECT_IO_THRESHOLD_BYTES or not hasattr(os, "O_DIRECT"):
        return False
    throttled_from = _dirty_throttle_bytes()
    return throttled_from is not None and expected_bytes > throttled_from


def _dirty_throttle_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        available = int(fields["MemAvailable"].split()[0]) * 1024

        def limit(name: str) -> int:
            with open(f"/proc/sys/vm/{name}_bytes") as absolute, open(f"/proc/sys/vm/{name}_ratio") as ratio:
                return int(absolute.read()) or int(ratio.read()) * available // 100

        return (limit("dirty_background") + limit("dirty")) // 2
    except (OSError, KeyError, ValueError):
        return None


def _open_for_writing(path: str, expected_bytes: int, direct_io: bool | None) -> Any:
    """A new file to write sequentially: direct I/O when asked (None: see `direct_io_by_default`) and available."""
    if direct_io is None:
        direct_io = direct_io_by_default(expected_bytes)
    if direct_io and hasattr(os, "O_DIRECT"):
        try:
            return _DirectFile(path)
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):  # not "this file system has no direct I/O"
                raise
    return open(path, "wb")


class _DirectFile:
    """A write-only file written with ``O_DIRECT``; ``write``/``tell`` like a file.

    Bytes are copied into one of two aligned buffers; a full buffer goes to a writer thread, so the
    next one fills (and strided weights are transposed into it) while the disk takes the previous one.
    The last block is padded to the alignment and the file truncated to its true length on close.
    """

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT | os.O_CLOEXEC, 0o666)
        self._buffers = [mmap.mmap(-1, _DIRECT_BUFFER_BYTES) for _ in range(2)]
        self._views = [memoryview(buffer) for buffer in self._buffers]
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._full: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        for index in range(1, len(self._buffers)):
            self._free.put(index)
        self._current, self._filled, self._position = 0, 0, 0
        self._error: BaseException | None = None
        self._probing, self._probed_bytes, self._probed_seconds = True, 0, 0.0
        self.direct = True  # until the file system refuses it or the disk is found slow
        self._writer = threading.Thread(target=self._write_out, name="fx2onnx-direct-io", daemon=True)
        self._writer.start()

    def __enter__(self) -> _DirectFile:
        return self

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        try:
            if error is None:  # direct I/O writes whole blocks: pad the last one (truncated away below)
                self._hand_over(-(-self._filled // _DIRECT_ALIGNMENT) * _DIRECT_ALIGNMENT, take_next=False)
            self._full.put(None)
            self._writer.join()
            if error is None:
                if self._error is not None:
                    raise self._error
                os.ftruncate(self._fd, self._position)
        finally:
            os.close(self._fd)
            for view, buffer in zip(self._views, self._buffers):
                view.release()
                buffer.close()

    def tell(self) -> int:
        return self._position

    def write(self, data: Any) -> int:
        source = memoryview(data).cast("B")
        length, offset = len(source), 0
        while offset < length:
            count = min(length - offset, _DIRECT_BUFFER_BYTES - self._filled)
            self._views[self._current][self._filled : self._filled + count] = source[offset : offset + count]
            self._filled += count
            offset += count
            if self._filled == _DIRECT_BUFFER_BYTES:
                self._hand_over(_DIRECT_BUFFER_BYTES)
        self._position += length
        return length

    def _hand_over(self, length: int, *, take_next: bool = True) -> None:
        """Queue the current buffer's first `length` bytes for the writer; continue in a free buffer."""
        self._full.put((self._current, length))
        self._filled = 0
        if take_next:
            self._current = self._free.get()
            if self._error is not None:
                raise self._error

    def _write_out(self) -> None:  # the writer thread
        while (item := self._full.get()) is not None:
            index, length = item
            if self._error is None:
                try:
                    self._write_buffer(self._views[index], length)
                except BaseException as error:  # re-raised in the caller's thread
                    self._error = error
            self._free.put(index)

    def _write_buffer(self, view: memoryview, length: int) -> None:
        started = time.perf_counter()
        written = 0
        while written < length:
            try:
                written += os.write(self._fd, view[written:length])
            except OSError as error:
                if error.errno != errno.EINVAL or not self._stop_direct_io():
                    raise
        if self._probing:  # a disk slower than the page cache (spinning, network): go buffered
            self._probed_bytes += length
            self._probed_seconds += time.perf_counter() - started
            if self._probed_bytes >= DIRECT_IO_PROBE_BYTES:
                self._probing = False
                if self._probed_bytes < DIRECT_IO_MIN_BYTES_PER_SECOND * self._probed_seconds:
                    self._stop_direct_io()

    def _stop_direct_io(self) -> bool:
        """Fall back to buffered writes on a file system that accepted O_DIRECT at open but not at write."""
        import fcntl

        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        if not flags & os.O_DIRECT:
            return False
        fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
        self.direct = False
        return True


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


__all__ = [
    "DIRECT_IO_THRESHOLD_BYTES",
    "STREAM_THRESHOLD_BYTES",
    "direct_io_by_default",
    "save_model",
    "writes_protobuf",
]
