"""Saving a model so that it never corrupts, loses or escapes: the file-system side of ``ONNXProgram.save``.

A save writes the new model (its ``.onnx`` file and its weights' file) in a temporary folder beside the
destination, flushes both to the disk, then swaps them in: the weights first, under a name no file has yet
(so the old model, which references its own weights' file, stays whole), then the ``.onnx`` file in one
rename, the moment the new model takes the old one's place. Only then are the weights' files of the old model
that the new one does not use removed, so that the folder holds exactly the files of the model saved. Every
rename is followed by an ``fsync`` of its folder, so that it survives a power loss.

Temporary folders are named ``.fx2onnx-tmp-<host>-<pid>-<token>``: a save removes those of earlier saves on
this host whose process is gone (killed), never another live process's.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Iterator

import onnx

from fx2onnx import _streaming as streaming

TEMPORARY_PREFIX = ".fx2onnx-tmp-"
_TEMPORARY_NAME = re.compile(re.escape(TEMPORARY_PREFIX) + r"(?P<host>[A-Za-z0-9_.]*)-(?P<pid>\d+)-[0-9a-f]{8}$")
# What saves of fx2onnx before this module left (tempfile.mkdtemp(prefix=".fx2onnx-")): removed a day after.
_LEGACY_TEMPORARY_NAME = re.compile(r"\.fx2onnx-[a-z0-9_]{8}$")
_LEGACY_STALE_SECONDS = 24 * 3600


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname())


def external_data_name(filename: str, external_data: str) -> str:
    """`external_data`, the weights' file name the user gave, checked to stay inside the model's folder.

    A plain subfolder (``weights/model.data``) is allowed; an absolute path, ``..``, an empty name, or the
    model's own file name are refused with the reason.
    """
    if not external_data or not external_data.strip():
        raise ValueError(
            f"external_data={external_data!r} names no file: pass external_data=True for {filename}.data, or a file "
            "name inside the model's folder"
        )
    if os.path.isabs(external_data) or (os.altsep and external_data.startswith(os.altsep)):
        raise ValueError(
            f"external_data={external_data!r} is an absolute path: a save writes only inside the model's folder, "
            "and ONNX Runtime loads external data only from there; give a name relative to the model file "
            f"(e.g. {os.path.basename(external_data)!r})"
        )
    parts = re.split(r"[\\/]", external_data)
    if ".." in parts:
        raise ValueError(
            f"external_data={external_data!r} leads outside the model's folder: a save writes only inside it, and "
            f"ONNX Runtime refuses external data elsewhere; give a name inside it (e.g. {parts[-1]!r})"
        )
    parts = [part for part in parts if part not in ("", ".")]
    if not parts or external_data.endswith(("/", "\\")):
        raise ValueError(f"external_data={external_data!r} names a folder, not a file")
    if any(part.startswith(TEMPORARY_PREFIX) for part in parts):
        raise ValueError(f"external_data={external_data!r}: names starting with {TEMPORARY_PREFIX} are fx2onnx's own")
    name = "/".join(parts)
    if name == filename:
        raise ValueError(f"external_data={external_data!r} is the model file's own name: choose another name")
    return name


def _inside(directory: str, relative: str) -> bool:
    """Whether `relative` resolves (symbolic links followed) inside `directory`."""
    root = os.path.realpath(directory)
    target = os.path.realpath(os.path.join(directory, relative))
    return os.path.commonpath([root, target]) == root and target != root


def fresh_name(directory: str, name: str) -> str:
    """`name`, or, if a file of that name exists (the weights of the model being replaced, perhaps), a variant
    with a random token before its extension (``model.onnx.data`` -> ``model.onnx.3f9a1c2e.data``)."""
    if not os.path.lexists(os.path.join(directory, name)):
        return name
    root, extension = os.path.splitext(name)
    while True:
        candidate = f"{root}.{secrets.token_hex(4)}{extension}"
        if not os.path.lexists(os.path.join(directory, candidate)):
            return candidate


def referenced_files(path: str) -> set[str]:
    """The external-data files (relative to its folder) the ONNX model at `path` references; none if it is not
    an ONNX model (then it is replaced and nothing else is touched).

    A binary model is scanned in place (mapped, its fields skipped by their lengths): parsing it would copy a
    single-file model's weights, up to 2 GB, into memory.
    """
    if not os.path.isfile(path):
        return set()
    try:
        if streaming.writes_protobuf(path):
            with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                locations: set[str] = set()
                _scan_model(memoryview(mapped), locations)
                return locations
        return _locations_of(onnx.load_model(path, load_external_data=False))
    except Exception:  # empty, not ONNX, or truncated: reference nothing we can tell
        return set()


def checkpoint_files(path: str) -> set[str]:
    """The checkpoint files (relative to its folder) that the model at `path`, saved with
    ``weights="reference"``, references without owning them (its metadata lists them); read without parsing it."""
    if not os.path.isfile(path) or not streaming.writes_protobuf(path):
        return set()
    from fx2onnx._weights import CHECKPOINT_FILES_METADATA

    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            listed = _metadata_value(memoryview(mapped), CHECKPOINT_FILES_METADATA.encode())
        return {str(location) for location in json.loads(listed)} if listed is not None else set()
    except Exception:  # empty, not ONNX, or truncated: no checkpoint files we can tell
        return set()


def _metadata_value(data: memoryview, wanted: bytes) -> bytes | None:
    """The value of the model's metadata entry `wanted`, copied (no view of `data` outlives the call: the caller's
    mapping can then be closed)."""
    for number, value in _fields(data):
        if number != _MODEL_METADATA or not isinstance(value, memoryview):
            continue
        entry = dict(_fields(value))
        key, text = entry.get(_ENTRY_KEY), entry.get(_ENTRY_VALUE)
        if isinstance(key, memoryview) and bytes(key) == wanted and isinstance(text, memoryview):
            return bytes(text)
    return None


def _locations_of(model: onnx.ModelProto) -> set[str]:
    locations: set[str] = set()
    _scan_model(memoryview(model.SerializeToString()), locations)
    return locations


def _field(message: type, name: str) -> int:
    return message.DESCRIPTOR.fields_by_name[name].number


_MODEL_GRAPH, _MODEL_FUNCTIONS = _field(onnx.ModelProto, "graph"), _field(onnx.ModelProto, "functions")
_MODEL_METADATA = _field(onnx.ModelProto, "metadata_props")
_GRAPH_NODE, _GRAPH_INITIALIZER = _field(onnx.GraphProto, "node"), _field(onnx.GraphProto, "initializer")
_GRAPH_SPARSE = _field(onnx.GraphProto, "sparse_initializer")
_SPARSE_VALUES = _field(onnx.SparseTensorProto, "values")
_FUNCTION_NODE = _field(onnx.FunctionProto, "node")
_NODE_ATTRIBUTE = _field(onnx.NodeProto, "attribute")
_ATTRIBUTE_TENSORS = {_field(onnx.AttributeProto, "t"), _field(onnx.AttributeProto, "tensors")}
_ATTRIBUTE_GRAPHS = {_field(onnx.AttributeProto, "g"), _field(onnx.AttributeProto, "graphs")}
_TENSOR_LOCATION = _field(onnx.TensorProto, "data_location")
_TENSOR_EXTERNAL_DATA = _field(onnx.TensorProto, "external_data")
_ENTRY_KEY, _ENTRY_VALUE = _field(onnx.StringStringEntryProto, "key"), _field(onnx.StringStringEntryProto, "value")


def _varint(data: memoryview, position: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7


def _fields(data: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    """(field number, value) of a protobuf message: an int for varints, the bytes for length-delimited fields."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = _varint(data, position)
            yield number, value
        elif wire_type == 2:
            length, position = _varint(data, position)
            if position + length > len(data):
                raise ValueError("truncated protobuf message")
            yield number, data[position : position + length]
            position += length
        elif wire_type in (1, 5):
            position += 8 if wire_type == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire_type} is not used by ONNX")


def _scan_model(data: memoryview, locations: set[str]) -> None:
    for number, value in _fields(data):
        if number == _MODEL_GRAPH and isinstance(value, memoryview):
            _scan_graph(value, locations)
        elif number == _MODEL_FUNCTIONS and isinstance(value, memoryview):
            for field, node in _fields(value):
                if field == _FUNCTION_NODE and isinstance(node, memoryview):
                    _scan_node(node, locations)


def _scan_graph(data: memoryview, locations: set[str]) -> None:
    for number, value in _fields(data):
        if not isinstance(value, memoryview):
            continue
        if number == _GRAPH_INITIALIZER:
            _scan_tensor(value, locations)
        elif number == _GRAPH_SPARSE:
            for field, tensor in _fields(value):
                if field == _SPARSE_VALUES and isinstance(tensor, memoryview):
                    _scan_tensor(tensor, locations)
        elif number == _GRAPH_NODE:
            _scan_node(value, locations)


def _scan_node(data: memoryview, locations: set[str]) -> None:
    for number, attribute in _fields(data):
        if number != _NODE_ATTRIBUTE or not isinstance(attribute, memoryview):
            continue
        for field, value in _fields(attribute):
            if field in _ATTRIBUTE_TENSORS and isinstance(value, memoryview):
                _scan_tensor(value, locations)
            elif field in _ATTRIBUTE_GRAPHS and isinstance(value, memoryview):
                _scan_graph(value, locations)


def _scan_tensor(data: memoryview, locations: set[str]) -> None:
    external, location = False, None
    for number, value in _fields(data):
        if number == _TENSOR_LOCATION:
            external = value == onnx.TensorProto.EXTERNAL
        elif number == _TENSOR_EXTERNAL_DATA and isinstance(value, memoryview):
            entry = dict(_fields(value))
            key, text = entry.get(_ENTRY_KEY), entry.get(_ENTRY_VALUE)
            if isinstance(key, memoryview) and bytes(key) == b"location" and isinstance(text, memoryview):
                location = bytes(text).decode("utf-8", errors="replace")
    if external and location:
        locations.add(location)


def fsync_file(path: str) -> None:
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_directory(path: str) -> None:
    """Make a rename in `path` durable (a folder's entries are flushed by fsync on the folder itself, on POSIX)."""
    if os.name != "posix":  # Windows cannot open a folder; its renames are journaled by NTFS
        return
    fsync_file(path)


def _no_flush(path: str) -> None:
    pass


def remove_stale_temporaries(directory: str) -> None:
    """Remove temporary folders that earlier saves on this host left when they were killed (their process is
    gone). Another live save's folder is left alone."""
    host = _host()
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        stale = os.path.join(directory, entry)
        match = _TEMPORARY_NAME.match(entry)
        if match is None:
            # Earlier fx2onnx versions named them by tempfile.mkdtemp alone, without their process: stale once old.
            if not _LEGACY_TEMPORARY_NAME.match(entry) or not _older_than(stale, _LEGACY_STALE_SECONDS):
                continue
        elif match["host"] != host or _alive(int(match["pid"])):
            continue
        if os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(stale)


def _older_than(path: str, seconds: float) -> bool:
    try:
        return time.time() - os.lstat(path).st_mtime > seconds
    except OSError:
        return False


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process may be saving
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return True
    return True


@contextlib.contextmanager
def staging_folder(directory: str) -> Iterator[str]:
    """A temporary folder in `directory` (the same file system, so that renames out of it are atomic), removed
    on the way out whatever happens."""
    staging = os.path.join(directory, f"{TEMPORARY_PREFIX}{_host()}-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(staging, 0o700)
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def save_atomically(
    path: str, data_name: str | None, write: Callable[[str, str | None], None], *, durable: bool = True
) -> str | None:
    """Write a model to `path` (its weights to `data_name` beside it, or none) with ``write(staged_path,
    data_name)``, and swap it in as described in the module's docstring. Returns the weights' file name used
    (`data_name`, or a fresh variant of it when a file of that name exists). ``durable=False`` skips the fsyncs:
    the swap stays atomic if the process dies, not if the machine loses power.
    """
    directory, filename = os.path.split(path)
    remove_stale_temporaries(directory)
    if data_name is not None:
        data_name = fresh_name(directory, data_name)
        if not _inside(directory, data_name):
            raise ValueError(f"external_data={data_name!r} resolves outside {directory} (through a symbolic link)")
    old_references = referenced_files(path) - checkpoint_files(path)  # the checkpoint's files are not the model's
    with staging_folder(directory) as staging:
        staged_model = os.path.join(staging, filename)
        if data_name is not None:
            os.makedirs(os.path.dirname(os.path.join(staging, data_name)), exist_ok=True)
        write(staged_model, data_name)
        # Flush the new files' contents before any rename makes them part of a model (a power loss after a rename
        # must not leave a renamed file empty).
        flush_file = fsync_file if durable else _no_flush
        flush_directory = fsync_directory if durable else _no_flush
        flush_file(staged_model)
        if data_name is not None and not os.path.exists(os.path.join(staging, data_name)):
            data_name = None  # save(weights="reference") referenced every weight in the checkpoint: no copies
        # The new model's own files, and checkpoint files it references: only read when there is an old model whose
        # files might go (scanning the new file costs ~0.1 s of CPU per 1000 nodes).
        kept = referenced_files(staged_model) if old_references else set()
        moved_data: str | None = None
        try:
            if data_name is not None:
                staged_data = os.path.join(staging, data_name)
                flush_file(staged_data)
                final_data = os.path.join(directory, data_name)
                data_folder = os.path.dirname(final_data)
                os.makedirs(data_folder, exist_ok=True)
                os.replace(staged_data, final_data)  # a name nothing references yet: the old model is untouched
                moved_data = final_data
                flush_directory(data_folder)
            os.replace(staged_model, path)  # the new model takes the old one's place, in one rename
        except BaseException:
            if moved_data is not None:
                with contextlib.suppress(OSError):
                    os.remove(moved_data)
            raise
        flush_directory(directory)
    # The old model's weights the new one does not use; only inside the folder (a foreign model may point anywhere).
    removed_any = False
    for location in old_references - kept - ({data_name} if data_name else set()):
        relative = os.path.normpath(location)
        if os.path.isabs(relative) or relative.split(os.sep)[0] == ".." or not _inside(directory, relative):
            continue
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.remove(os.path.join(directory, relative))
            removed_any = True
        # A subfolder the old weights were in goes too once empty (rmdir refuses a folder that is not).
        folder = os.path.dirname(relative)
        while folder:
            try:
                os.rmdir(os.path.join(directory, folder))
            except OSError:
                break
            folder = os.path.dirname(folder)
    if removed_any:
        flush_directory(directory)
    return data_name
