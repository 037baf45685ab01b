"""Weights from a checkpoint on disk, for models captured without them (``export(..., weights=PATH)``).

A model built on the ``meta`` device (or holding fake tensors) is captured as usual: torch.export needs only the
weights' shapes and dtypes. Each initializer of the emitted graph is then given a :class:`CheckpointTensor`: where
its bytes are in the checkpoint (a safetensors file, a folder of shards with transformers'
``model.safetensors.index.json``, or a mapping from name to tensor), the dtype the graph wants and, for a weight
the optimizer transposes (``Linear`` weights feed ``MatMul`` through a ``Transpose``), the permutation. Nothing is
read until the model is saved: ``_streaming`` then asks each tensor to :meth:`CheckpointTensor.stream_to` the file,
and the bytes go from the checkpoint to the file through one reused 8 MB buffer, cast block by block when the
checkpoint's dtype is not the model's (a bfloat16 checkpoint for a float32 model, or the reverse); a transposed
weight is read whole and written transposed block by block. The process holds at most one tensor of the
checkpoint (the largest transposed one), whatever the model's size.

Names are the model's ``state_dict`` names. A name missing from the checkpoint is looked up under the names of
the parameters tied to it (transformers ties ``lm_head.weight`` to ``model.embed_tokens.weight`` and saves one);
buffers that the model computes rather than loads (non-persistent ones: rotary embeddings' ``inv_freq``) are
computed on the CPU by the model's own initialization code where fx2onnx knows it (transformers'
``_init_weights``), or must be given in a mapping. A weight missing from the checkpoint, or stored with another
shape or a dtype it cannot be converted from, is an error naming the weight and the file, raised before the graph
is emitted and so before any file is written.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import random
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import torch
from onnx_ir.tensor_adapters import TorchTensor

from fx2onnx import _complex_layout as complex_layout
from fx2onnx import _dtypes as dtypes
from fx2onnx.errors import ExportError

# Bytes of the checkpoint read (and cast) at a time while saving; the cast block of a float32 model read from a
# bfloat16 checkpoint is twice as large.
BLOCK_BYTES = 8 * 2**20
INDEX_NAME = "model.safetensors.index.json"
# Model metadata: initializers whose bytes are a checkpoint tensor under another name or transposed, as
# {initializer: [checkpoint name, permutation or null]}; for verify_weights on a saved model.
CHECKPOINT_METADATA = "pkg.fx2onnx.checkpoint_tensors"
# Model metadata of a model saved with weights="reference": the checkpoint files (locations relative to the model)
# its external data points into, which the model does not own: a later save over it must not remove them.
CHECKPOINT_FILES_METADATA = "pkg.fx2onnx.checkpoint_files"

# safetensors' dtype names (https://github.com/huggingface/safetensors, the format's README)
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "C64": torch.complex64,
}


class WeightsError(ExportError):
    """The checkpoint given with ``weights=`` cannot supply the model's weights (missing, other shape or dtype)."""


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """One tensor of a checkpoint: its bytes in a file (`path`, `offset`), or a tensor in memory."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    path: str | None = None
    offset: int = 0
    tensor: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def where(self) -> str:
        return self.path if self.path is not None else "the weights mapping"

    def read_blocks(self, block_bytes: int | None = None) -> Iterator[torch.Tensor]:
        """The tensor's values in order, as 1-D tensors of its dtype of at most `block_bytes` each. A block read
        from the file is a view of one reused buffer: valid until the next block is asked for."""
        step = max(1, (block_bytes or BLOCK_BYTES) // self.dtype.itemsize)
        if self.tensor is not None:
            flat = self.tensor.reshape(-1)
            for begin in range(0, flat.numel(), step):
                yield flat[begin : begin + step]
            return
        assert self.path is not None
        buffer = torch.empty(min(self.nbytes, step * self.dtype.itemsize), dtype=torch.uint8)
        with open(self.path, "rb", buffering=0) as file:
            file.seek(self.offset)
            left = self.nbytes
            while left:
                count = min(left, buffer.numel())
                _read_exactly(file, memoryview(buffer.numpy())[:count], self)
                yield buffer[:count].view(self.dtype)
                left -= count

    def load(self) -> torch.Tensor:
        """The whole tensor in memory, in its dtype and shape."""
        if self.tensor is not None:
            return self.tensor
        assert self.path is not None
        tensor = torch.empty(self.shape, dtype=self.dtype)
        if self.nbytes:
            with open(self.path, "rb", buffering=0) as file:
                file.seek(self.offset)
                _read_exactly(file, memoryview(tensor.reshape(-1).view(torch.uint8).numpy()), self)
        return tensor

    def element(self, index: tuple[int, ...]) -> torch.Tensor:
        """One element (a 1-element tensor of the stored dtype), read alone."""
        if self.tensor is not None:
            return self.tensor[index].reshape(1)
        assert self.path is not None
        position = int(np.ravel_multi_index(index, self.shape)) if self.shape else 0
        with open(self.path, "rb", buffering=0) as file:
            data = os.pread(file.fileno(), self.dtype.itemsize, self.offset + position * self.dtype.itemsize)
        return torch.frombuffer(bytearray(data), dtype=self.dtype)


def _read_exactly(file: Any, target: memoryview, stored: StoredTensor) -> None:
    filled = 0
    while filled < len(target):
        count = file.readinto(target[filled:])
        if not count:
            raise WeightsError(f"{stored.path} ended inside tensor {stored.name!r}: the file is truncated")
        filled += count


class Checkpoint:
    """The tensors of a checkpoint by name: a safetensors file, a folder of them (with or without transformers'
    index), the index file itself, or a mapping from name to tensor."""

    def __init__(self, tensors: dict[str, StoredTensor], description: str) -> None:
        self.tensors = tensors
        self.description = description

    @classmethod
    def open(cls, source: str | os.PathLike[str] | Mapping[str, Any] | Checkpoint) -> Checkpoint:
        if isinstance(source, Checkpoint):
            return source
        if isinstance(source, Mapping):
            return cls(_from_mapping(source), "the weights mapping")
        path = os.path.abspath(os.fspath(source))
        if os.path.isdir(path):
            index = os.path.join(path, INDEX_NAME)
            if os.path.exists(index):
                return cls(_from_index(index), path)
            files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
            if not files:
                raise WeightsError(f"no .safetensors file and no {INDEX_NAME} in the folder {path}")
            tensors: dict[str, StoredTensor] = {}
            for name in files:
                tensors.update(read_header(os.path.join(path, name)))
            return cls(tensors, path)
        if not os.path.exists(path):
            raise WeightsError(f"weights: no file or folder {path}")
        if path.endswith(".json"):
            return cls(_from_index(path), os.path.dirname(path))
        return cls(read_header(path), path)

    def get(self, name: str) -> StoredTensor | None:
        return self.tensors.get(name)


def read_header(path: str) -> dict[str, StoredTensor]:
    """A safetensors file's tensors: 8 bytes (little-endian header length), a JSON header, then the data."""
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        prefix = file.read(8)
        header_length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if header_length < 2 or 8 + header_length > size:
            raise WeightsError(f"{path} is not a safetensors file (its header length is {header_length})")
        try:
            header = json.loads(file.read(header_length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise WeightsError(f"{path} is not a safetensors file: its header is not JSON ({error})") from None
    data_start = 8 + header_length
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise WeightsError(
                f"{path}: tensor {name!r} has the dtype {info.get('dtype')!r}, which fx2onnx cannot load"
            )
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(v) for v in info["data_offsets"])
        stored = StoredTensor(name, dtype, shape, path=path, offset=data_start + begin)
        if end - begin != stored.nbytes or data_start + end > size:
            raise WeightsError(
                f"{path}: tensor {name!r} ({_describe(dtype, shape)}) claims bytes {begin}..{end} of the data, "
                f"but the file holds {size - data_start} bytes of data: the file is truncated or corrupt"
            )
        tensors[name] = stored
    return tensors


def _from_index(index_path: str) -> dict[str, StoredTensor]:
    with open(index_path, encoding="utf-8") as file:
        weight_map: dict[str, str] = json.load(file).get("weight_map", {})
    folder = os.path.dirname(index_path)
    headers: dict[str, dict[str, StoredTensor]] = {}
    tensors = {}
    for name, shard in weight_map.items():
        shard_path = os.path.join(folder, shard)
        if shard_path not in headers:
            if not os.path.exists(shard_path):
                raise WeightsError(f"{index_path} puts {name!r} in {shard}, which does not exist")
            headers[shard_path] = read_header(shard_path)
        if name not in headers[shard_path]:
            raise WeightsError(f"{index_path} puts {name!r} in {shard}, which does not hold it")
        tensors[name] = headers[shard_path][name]
    return tensors


def _from_mapping(mapping: Mapping[str, Any]) -> dict[str, StoredTensor]:
    tensors = {}
    for name, value in mapping.items():
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        if not isinstance(value, torch.Tensor):
            raise WeightsError(f"weights[{name!r}] is a {type(value).__name__}, not a tensor")
        if is_weightless(value):
            raise WeightsError(f"weights[{name!r}] is on the {value.device} device: it holds no data")
        value = value.detach().cpu()
        tensors[name] = StoredTensor(name, value.dtype, tuple(value.shape), tensor=value)
    return tensors


def _describe(dtype: torch.dtype, shape: tuple[int, ...]) -> str:
    return f"{str(dtype).removeprefix('torch.')}[{', '.join(map(str, shape))}]"


def is_weightless(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return tensor.is_meta or is_fake(tensor)


class CheckpointTensor(ir._core.TensorBase):  # onnx_ir exports no base class for tensors
    """An initializer whose bytes are a checkpoint tensor, converted to `dtype` and permuted by `permutation`,
    read only when needed: :meth:`stream_to` a file in blocks, or all at once (``numpy``, ``tobytes``) for the
    small models that are run in memory."""

    def __init__(
        self,
        stored: StoredTensor,
        dtype: torch.dtype,
        *,
        permutation: tuple[int, ...] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name if name is not None else stored.name)
        self.stored = stored
        self.torch_dtype = dtype
        self.permutation = permutation
        shape = complex_layout.as_real(torch.empty(stored.shape, dtype=stored.dtype, device="meta")).shape
        self._shape = ir.Shape([shape[p] for p in permutation] if permutation else list(shape))
        self._dtype = dtypes.to_onnx(complex_layout.as_real(torch.empty((), dtype=dtype, device="meta")).dtype)

    @property
    def dtype(self) -> ir.DataType:
        return self._dtype

    @property
    def shape(self) -> ir.Shape:
        return self._shape

    @property
    def raw(self) -> StoredTensor:
        return self.stored

    def transposed(self, permutation: tuple[int, ...], name: str) -> CheckpointTensor:
        """This tensor permuted as ONNX ``Transpose(perm=permutation)`` permutes it, still unread."""
        combined = tuple(self.permutation[p] for p in permutation) if self.permutation else tuple(permutation)
        return CheckpointTensor(self.stored, self.torch_dtype, permutation=combined, name=name)

    @property
    def _target(self) -> torch.dtype:
        return complex_layout.as_real(torch.empty((), dtype=self.torch_dtype, device="meta")).dtype

    def blocks(self, block_bytes: int | None = None) -> Iterator[torch.Tensor]:
        """The tensor's values in C order, as contiguous 1-D tensors of the target dtype of about `block_bytes`:
        read and converted block by block, or, for a permuted tensor, read whole and permuted block by block."""
        target = self._target
        block_bytes = block_bytes or BLOCK_BYTES
        if not self.permutation:
            for block in self.stored.read_blocks(block_bytes):  # views of one buffer: written before the next
                flat = complex_layout.as_real(block).reshape(-1)
                yield flat if flat.dtype == target else flat.to(target)
            return
        view = complex_layout.as_real(self.stored.load()).permute(self.permutation)
        yield from _blocks(view, target, block_bytes)

    def element(self, position: int) -> torch.Tensor:
        """The element at flat `position` of this tensor (target dtype and permutation), read alone."""
        index = [int(i) for i in np.unravel_index(position, tuple(self.shape))] if len(self.shape) else []
        if self.permutation:
            source_index = [0] * len(index)
            for axis, source_axis in enumerate(self.permutation):
                source_index[source_axis] = index[axis]
            index = source_index
        stored = self.stored
        if stored.dtype.is_complex:  # as (..., 2) real: the last index picks the part
            value = stored.element(tuple(index[:-1]))
            return torch.view_as_real(value).reshape(-1)[index[-1] : index[-1] + 1].to(self._target)
        return stored.element(tuple(index)).to(self._target)

    def stream_to(self, file: Any) -> int:
        """Write the bytes to `file` (``write`` taking a buffer) block by block; the number of bytes written."""
        written = 0
        for block in self.blocks():
            data = block.view(torch.uint8) if block.dtype.itemsize > 0 else block
            file.write(memoryview(data.numpy()))
            written += block.numel() * block.dtype.itemsize
        return written

    def materialize(self) -> torch.Tensor:
        """The whole tensor in memory (target dtype and permutation), for small models run in ONNX Runtime."""
        tensor = complex_layout.as_real(self.stored.load())
        if self.permutation:
            tensor = tensor.permute(self.permutation)
        return tensor.to(self._target, memory_format=torch.contiguous_format, copy=True)

    def numpy(self) -> np.ndarray:
        return TorchTensor(self.materialize()).numpy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def tobytes(self) -> bytes:
        return TorchTensor(self.materialize()).tobytes()

    def __repr__(self) -> str:
        permuted = f", permutation={self.permutation}" if self.permutation else ""
        return f"CheckpointTensor<{self.dtype},{self.shape}>({self.stored.name!r} in {self.stored.where}{permuted})"

    @property
    def checkpoint_bytes(self) -> bool:
        """Whether the initializer, up to its permutation, is the checkpoint file's bytes as they are: a tensor in
        a file (not a mapping's), of the model's dtype (no conversion). safetensors stores tensors contiguous, in C
        order and little-endian, as ONNX's external data does, so such a tensor can be referenced in place."""
        stored = self.stored
        return (
            stored.path is not None
            and stored.dtype == self.torch_dtype
            and not stored.dtype.is_complex
            and stored.dtype.itemsize > 0
            and sys.byteorder == "little"  # ONNX external data is little-endian; a big-endian host would convert
        )


_TILE = 128


def _blocks(view: torch.Tensor, dtype: torch.dtype, block_bytes: int) -> Iterator[torch.Tensor]:
    """Contiguous 1-D blocks of `view` (a permuted tensor) in C order, converted to `dtype`. A 2-D view (a
    transposed weight) is copied tile by tile, cache-friendly, into one reused buffer of a few rows (each block is
    valid until the next is asked for); other ranks are made contiguous whole."""
    if view.dim() != 2 or view.element_size() not in (1, 2, 4, 8):
        flat = view.contiguous().reshape(-1)
        step = max(1, block_bytes // flat.element_size())
        for begin in range(0, flat.numel(), step):
            yield flat[begin : begin + step].to(dtype)
        return
    bits = view.view(_UNSIGNED[view.element_size()]).numpy()  # numpy has no bfloat16/float8: copy the bits
    rows, columns = bits.shape
    block_rows = max(_TILE, block_bytes // max(1, columns * bits.itemsize) // _TILE * _TILE)
    buffer = np.empty((min(rows, block_rows), columns), bits.dtype)
    for begin in range(0, rows, block_rows):
        end = min(rows, begin + block_rows)
        for row in range(begin, end, _TILE):
            for column in range(0, columns, _TILE):
                buffer[row - begin : row - begin + _TILE, column : column + _TILE] = bits[
                    row : row + _TILE, column : column + _TILE
                ]
        block = torch.from_numpy(buffer[: end - begin]).view(view.dtype).reshape(-1)
        yield block if block.dtype == dtype else block.to(dtype)


_UNSIGNED = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}


# --- binding the captured weights to the checkpoint -----------------------------------------------------------
def bind(
    weights: Mapping[Any, tuple[str, torch.Tensor]],
    model: Any,
    source: str | os.PathLike[str] | Mapping[str, Any],
) -> dict[str, CheckpointTensor]:
    """For each captured weight (`weights`: placeholder -> (state_dict name, tensor)), the checkpoint tensor that
    supplies it, converted to the captured tensor's dtype. Weights the checkpoint lacks keep the model's own values
    when they have some; weightless ones (meta, fake) are computed (non-persistent buffers of transformers
    modules) or reported missing. Raises :class:`WeightsError` naming every missing or mismatched weight."""
    checkpoint = Checkpoint.open(source)
    aliases = _tied_names(model) if isinstance(model, torch.nn.Module) else {}
    bound: dict[str, CheckpointTensor] = {}
    missing: list[str] = []
    mismatched: list[str] = []
    computed: dict[str, torch.Tensor] | None = None
    for name, tensor in weights.values():
        stored = checkpoint.get(name)
        for alias in aliases.get(name, ()):
            if stored is None:
                stored = checkpoint.get(alias)
        if stored is None:
            if not is_weightless(tensor):
                continue  # the model's own value (a buffer the checkpoint does not hold)
            if computed is None:
                computed = computed_buffers(model, [n for n, t in weights.values() if is_weightless(t)])
            if name not in computed:
                missing.append(name)
                continue
            value = computed[name]
            stored = StoredTensor(name, value.dtype, tuple(value.shape), tensor=value)
        problem = _mismatch(stored, tensor)
        if problem:
            mismatched.append(f"{name}: {problem}")
            continue
        bound[name] = CheckpointTensor(stored, tensor.dtype, name=name)
    if missing or mismatched:
        lines = [f"missing from {checkpoint.description}: {name}" for name in missing[:20]]
        if len(missing) > 20:
            lines.append(f"... and {len(missing) - 20} more missing")
        lines += mismatched[:20]
        remedy = (
            "remedy: export with the checkpoint of this model (state_dict names as keys), or pass the missing "
            "tensors in a mapping (weights={**safetensors.torch.load_file(...), name: tensor})"
        )
        raise WeightsError(
            f"the weights do not fit the model ({len(missing)} missing, {len(mismatched)} mismatched):\n  "
            + "\n  ".join(lines)
            + f"\n  {remedy}"
        )
    return bound


def _mismatch(stored: StoredTensor, wanted: torch.Tensor) -> str | None:
    if tuple(stored.shape) != tuple(wanted.shape):
        return (
            f"{stored.where} holds {_describe(stored.dtype, stored.shape)}, the model wants "
            f"{_describe(wanted.dtype, tuple(wanted.shape))} (another shape)"
        )
    if stored.dtype == wanted.dtype:
        return None
    convertible = (stored.dtype.is_floating_point and wanted.dtype.is_floating_point) or (
        stored.dtype.is_complex and wanted.dtype.is_complex
    )
    if not convertible:
        return (
            f"{stored.where} holds {_describe(stored.dtype, stored.shape)}, the model wants "
            f"{_describe(wanted.dtype, tuple(wanted.shape))} (only floating dtypes are converted)"
        )
    return None


def _tied_names(model: torch.nn.Module) -> dict[str, list[str]]:
    """Each parameter/buffer name -> the other names of the same tensor (tied weights)."""
    by_tensor: dict[int, list[str]] = {}
    for name, tensor in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)):
        by_tensor.setdefault(id(tensor), []).append(name)
    return {name: [other for other in names if other != name] for names in by_tensor.values() for name in names}


def computed_buffers(model: Any, names: list[str]) -> dict[str, torch.Tensor]:
    """Values for weightless buffers that a model computes rather than loads, by the model's own code.

    transformers models compute them in ``_init_weights`` (rotary embeddings' ``inv_freq``): each module owning
    such a buffer is copied (the model stays as it is), the copy given CPU storage and initialized."""
    if not isinstance(model, torch.nn.Module):
        return {}
    initialize: Callable[[torch.nn.Module], Any] | None = getattr(model, "_init_weights", None)
    if initialize is None:
        return {}
    wanted = set(names)
    values: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        own = {
            f"{prefix}.{n}" if prefix else n: n
            for n, b in module.named_buffers(recurse=False)
            if (f"{prefix}.{n}" if prefix else n) in wanted and n in module._non_persistent_buffers_set
        }
        if not own or any(True for _ in module.parameters(recurse=False)):
            continue  # computed buffers only: a module with parameters would be initialized at random
        try:
            clone = copy.deepcopy(module).to_empty(device="cpu")
            with torch.no_grad():
                initialize(clone)
        except Exception:  # not something its init code computes: reported missing
            continue
        for full, local in own.items():
            values[full] = getattr(clone, local).detach()
    return values


def attach(model: ir.Model, bound: Mapping[str, CheckpointTensor]) -> None:
    """Give the emitted graph's initializers their checkpoint tensors; refuse any initializer left weightless."""
    for value in model.graph.initializers.values():
        tensor = bound.get(value.name or "")
        if tensor is not None:
            value.const_value = tensor
        elif isinstance(value.const_value, TorchTensor) and is_weightless(value.const_value.raw):
            raise WeightsError(
                f"initializer {value.name!r} holds no data (a {value.const_value.raw.device} tensor the model's "
                "forward computed from its weights) and is not in the checkpoint: compute it in forward from "
                "inputs, or pass it in weights= as a mapping"
            )


def fold_transposes(model: ir.Model) -> None:
    """Fold ``Transpose`` nodes of checkpoint initializers that nothing else reads into permuted checkpoint tensors
    (what onnxscript's constant folding does with a weight in memory), without reading them."""
    graph = model.graph
    for node in list(graph):
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 1:
            continue
        source = node.inputs[0]
        if source is None or not source.is_initializer() or not isinstance(source.const_value, CheckpointTensor):
            continue
        if len(source.uses()) != 1 or source.is_graph_output():
            continue
        rank = len(source.const_value.shape)
        perm_attribute = node.attributes.get("perm")
        permutation = tuple(perm_attribute.as_ints()) if perm_attribute is not None else tuple(reversed(range(rank)))
        output = node.outputs[0]
        if output.is_graph_output():
            continue
        name = output.name or f"{source.name}_transposed"
        folded = ir.Value(
            type=ir.TensorType(source.const_value.dtype),
            shape=ir.Shape([source.const_value.shape[p] for p in permutation]),
            const_value=source.const_value.transposed(permutation, name),
        )
        output.replace_all_uses_with(folded)
        graph.remove(node, safe=True)
        graph.initializers.pop(source.name)
        output.name = None
        folded.name = name
        graph.register_initializer(folded)


def record_provenance(model: ir.Model) -> None:
    """Which checkpoint tensor each initializer holds, where its name or layout differs, in the model's metadata."""
    renamed = {}
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, CheckpointTensor) and (tensor.permutation or value.name != tensor.stored.name):
            renamed[value.name] = [tensor.stored.name, list(tensor.permutation) if tensor.permutation else None]
    if renamed:
        model.metadata_props[CHECKPOINT_METADATA] = json.dumps(renamed, separators=(",", ":"))


# --- verifying a saved model against its checkpoint ----------------------------------------------------------
@dataclasses.dataclass
class WeightsCheck:
    """What :func:`verify_weights` found: initializers checked, bytes compared, problems (empty: all good)."""

    initializers: int = 0
    from_checkpoint: int = 0
    compared_bytes: int = 0
    # Initializers whose external data is the checkpoint's own file (saved with weights="reference").
    in_place: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else f"FAILED ({len(self.problems)} problems)"
        lines = [
            f"weights: {verdict}: {self.initializers} initializers, {self.from_checkpoint} from the checkpoint"
            + (f" ({self.in_place} referenced in place)" if self.in_place else "")
            + f", {self.compared_bytes} bytes compared"
        ]
        return "\n  ".join(lines + self.problems[:20])


def verify_weights(
    model_path: str | os.PathLike[str],
    weights: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    samples: int = 64,
    full: bool = False,
    check_model: bool = True,
    seed: int = 0,
) -> WeightsCheck:
    """Check a saved model's weights without loading them: the ONNX checker (``full_check``) on the graph, every
    external-data reference (file inside the model's folder, offset and length in bounds, length = the tensor's
    size), and, with `weights` (the checkpoint it was exported from), `samples` elements of each initializer that
    comes from it compared byte for byte with the checkpoint's (converted to the model's dtype and permuted as
    the graph holds it); `full=True` compares every byte."""
    model_path = os.path.abspath(os.fspath(model_path))
    folder = os.path.dirname(model_path)
    result = WeightsCheck()
    if check_model:
        try:
            onnx.checker.check_model(model_path, full_check=True)
        except Exception as error:
            result.problems.append(f"onnx.checker: {type(error).__name__}: {error}")
    proto = onnx.load(model_path, load_external_data=False)
    provenance = {}
    in_checkpoint: set[str] = set()  # files referenced in place (weights="reference")
    for prop in proto.metadata_props:
        if prop.key == CHECKPOINT_METADATA:
            provenance = json.loads(prop.value)
        elif prop.key == CHECKPOINT_FILES_METADATA:
            in_checkpoint = set(json.loads(prop.value))
    checkpoint = Checkpoint.open(weights) if weights is not None else None
    generator = random.Random(seed)
    for initializer in proto.graph.initializer:
        result.initializers += 1
        tensor = ir.serde.deserialize_tensor(initializer, base_path=folder)
        if isinstance(tensor, ir.ExternalTensor):
            problem = _external_problem(initializer.name, tensor, folder, in_checkpoint)
            if problem:
                result.problems.append(problem)
                continue
        if checkpoint is None:
            continue
        stored_name, permutation = provenance.get(initializer.name, [initializer.name, None])
        stored = checkpoint.get(stored_name)
        if stored is None:
            continue
        result.from_checkpoint += 1
        if (
            isinstance(tensor, ir.ExternalTensor)
            and stored.path is not None
            and os.path.exists(stored.path)
            and os.path.samefile(os.path.join(folder, tensor.location), stored.path)
            and (tensor.offset or 0) == stored.offset
        ):
            result.in_place += 1
        torch_dtype = dtypes.to_torch(tensor.dtype)
        if torch_dtype is None:
            continue
        expected = CheckpointTensor(stored, torch_dtype, permutation=tuple(permutation) if permutation else None)
        if list(expected.shape) != list(tensor.shape):
            result.problems.append(
                f"{initializer.name}: shape {list(tensor.shape)} in the model, {list(expected.shape)} from "
                f"{stored_name} in {stored.where}"
            )
            continue
        compared, problem = _compare_bytes(initializer.name, tensor, expected, samples, full, generator)
        result.compared_bytes += compared
        if problem:
            result.problems.append(problem)
    return result


def _external_problem(name: str, tensor: ir.ExternalTensor, folder: str, in_checkpoint: set[str]) -> str | None:
    path = os.path.normpath(os.path.join(folder, tensor.location))
    if os.path.isabs(tensor.location) or not path.startswith(folder + os.sep):
        return f"{name}: external data {tensor.location!r} is outside the model's folder"
    if not os.path.exists(path):
        if tensor.location in in_checkpoint:
            return (
                f"{name}: the checkpoint file {tensor.location!r} is missing: the model was saved with "
                "weights='reference' and reads its weights from the checkpoint's files in its folder; put them back "
                "beside it, or export and save again"
            )
        return f"{name}: external data file {tensor.location!r} does not exist"
    expected = math.prod(tensor.shape.numpy()) * tensor.dtype.itemsize
    length = tensor.length if tensor.length is not None else expected
    if length != expected:
        return f"{name}: external data length {length}, the tensor needs {expected} bytes"
    if tensor.offset is not None and tensor.offset + length > os.path.getsize(path):
        return f"{name}: external data {tensor.offset}..{tensor.offset + length} beyond the end of {tensor.location}"
    return None


def _compare_bytes(
    name: str,
    actual: ir.TensorProtocol,
    expected: CheckpointTensor,
    samples: int,
    full: bool,
    generator: random.Random,
) -> tuple[int, str | None]:
    itemsize = math.ceil(expected.dtype.itemsize)
    size = expected.size
    if size == 0:
        return 0, None
    if full:
        wanted = b"".join(block.view(torch.uint8).numpy().tobytes() for block in expected.blocks())
        got = _read_bytes(actual, 0, size * itemsize)
        if got != wanted:
            first = next(i for i, (a, b) in enumerate(zip(got, wanted)) if a != b) // max(1, int(itemsize))
            return len(wanted), f"{name}: element {first} differs from the checkpoint's {expected.stored.name}"
        return len(wanted), None
    positions = sorted({0, size - 1, *(generator.randrange(size) for _ in range(samples))})
    for position in positions:
        wanted = expected.element(position).view(torch.uint8).numpy().tobytes()
        got = _read_bytes(actual, position * itemsize, itemsize)
        if got != wanted:
            return len(positions) * itemsize, (
                f"{name}: element {position} is {got.hex()} in the model, {wanted.hex()} in the checkpoint's "
                f"{expected.stored.name} ({expected.stored.where})"
            )
    return len(positions) * itemsize, None


def _read_bytes(tensor: ir.TensorProtocol, begin: int, length: int) -> bytes:
    if isinstance(tensor, ir.ExternalTensor):
        with open(os.path.join(tensor.base_dir, tensor.location), "rb") as file:
            file.seek((tensor.offset or 0) + begin)
            return file.read(length)
    return tensor.tobytes()[begin : begin + length]
