"""Where type promotion's rules come from: the installed torch, read at export time, not a table.

- :func:`elementwise_rule`: the promotion kind (``ELEMENTWISE_TYPE_PROMOTION_KIND``) and promoting arguments of an
  elementwise op's reference implementation, read from its ``elementwise_type_promotion_wrapper``;
- :func:`traced_conversions`: for other ops, run torch's decomposition on meta tensors and record the dtype each
  input is converted to before it is computed with (``sum(bool)`` converts to int64). What a trace found is kept in
  memory and, across processes, in a file per op, torch build and version of this module (:func:`conversions_path`):
  a first export traced ``scaled_dot_product_attention``'s decomposition for 17 ms. A file per op: a first export
  reads those of the few ops it traces, not what every export before found (one file of 4,500 entries took 6 ms).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._decomp import decomposition_table
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common.wrappers import elementwise_type_promotion_wrapper
from torch.utils._python_dispatch import TorchDispatchMode

from fx2onnx import _cache_files as cache_files
from fx2onnx._torch_ops import aten, prims

CAST = prims.convert_element_type.default
# Ops that are themselves a conversion: casting their input first would only add a Cast.
CONVERSIONS = {CAST, aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.to.other, aten.type_as.default}


@dataclasses.dataclass(frozen=True)
class ElementwiseRule:
    """torch's promotion rule for one overload: the kind, and the schema positions of the promoting arguments."""

    kind: Kind
    arguments: tuple[int, ...]


@functools.cache
def elementwise_rule(op: torch._ops.OpOverload) -> ElementwiseRule | None:
    """The promotion rule of `op`'s reference implementation, read from its type-promotion wrapper."""
    reference = decomposition_table.get(op)
    wrapper = _promotion_wrapper(reference) if reference is not None else None
    if wrapper is None or not wrapper.type_promoting_arg_names:
        return None
    parameters = list(inspect.signature(reference).parameters)
    schema_names = [argument.name for argument in op._schema.arguments]
    positions = []
    for name in wrapper.type_promoting_arg_names:
        if name in schema_names:  # same name in the ATen schema (addcmul: self, tensor1, tensor2)
            positions.append(schema_names.index(name))
        elif name in parameters and parameters.index(name) < len(schema_names):  # by position: a, b -> self, other
            positions.append(parameters.index(name))
    return ElementwiseRule(wrapper.type_promotion_kind, tuple(positions))


def _promotion_wrapper(function: Any, depth: int = 0) -> elementwise_type_promotion_wrapper | None:
    """Find the wrapper instance a reference closes over (through ``functools.wraps`` layers and closures)."""
    if depth > 8 or not callable(function):
        return None
    for cell in getattr(function, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(content, elementwise_type_promotion_wrapper):
            return content
        if inspect.isfunction(content):
            found = _promotion_wrapper(content, depth + 1)
            if found is not None:
                return found
    wrapped = getattr(function, "__wrapped__", None)
    return _promotion_wrapper(wrapped, depth + 1) if wrapped is not None else None


def decomposition(op: torch._ops.OpOverload) -> Any:
    """torch's decomposition of `op`: its table entry (refs included), else its CompositeImplicitAutograd kernel."""
    if op in decomposition_table:
        return decomposition_table[op]
    if op.namespace == "aten" and op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
        return op.decompose
    return None


_CONVERSIONS_CACHE: dict[tuple[Any, ...], dict[int, torch.dtype]] = {}


def traced_conversions(
    op: torch._ops.OpOverload, described: tuple[Any, ...], spec: pytree.TreeSpec
) -> dict[int, torch.dtype]:
    """Run `op`'s decomposition on meta tensors; flat index -> the one dtype that input is used in, if converted.

    `described` stands for the node's flat arguments: ``("tensor", dtype, shape)``, ``("scalar", type, value)``,
    ``("constant", type, value)`` or ``("opaque", name)`` (which cannot be traced); `spec` rebuilds (args, kwargs).
    """
    key = (op, described, str(spec))
    if key in _CONVERSIONS_CACHE:
        return _CONVERSIONS_CACHE[key]
    disk_key = _disk_key(op, described, key[2])
    cached = _read_conversions(op, disk_key)
    if cached is not None:
        _CONVERSIONS_CACHE[key] = cached
        return cached
    inputs: dict[int, int] = {}  # id(meta tensor) -> flat index
    flat = []
    for index, (kind, *rest) in enumerate(described):
        if kind == "tensor":
            tensor = torch.empty(rest[1], dtype=rest[0], device="meta")
            inputs[id(tensor)] = index
            flat.append(tensor)
        elif kind == "opaque":
            _CONVERSIONS_CACHE[key] = {}
            return {}
        else:
            flat.append(rest[-1])
    args, kwargs = pytree.tree_unflatten(flat, spec)
    recorder = _ConversionRecorder(inputs)
    try:
        with recorder:
            decomposition(op)(*args, **kwargs)
    except Exception:  # a decomposition that cannot run on meta tensors tells us nothing
        recorder.used.clear()
    result = {index: dtypes.pop() for index, dtypes in recorder.used.items() if len(dtypes) == 1}
    if len(_CONVERSIONS_CACHE) > 4096:  # bounded: a long-running process exports many graphs
        _CONVERSIONS_CACHE.clear()
    _CONVERSIONS_CACHE[key] = result
    if disk_key is not None:
        # pairs, in the trace's order (the order casts are then inserted in)
        pairs = [[index, str(dtype).removeprefix("torch.")] for index, dtype in result.items()]
        _DISK.pending.setdefault(conversions_path(op), {})[disk_key] = pairs
    return result


# --- the conversions found, across processes ---------------------------------------------------------------------
_DISK_FORMAT = 1
_DISK_LIMIT = 2000  # entries of one op's file; past it the file starts again (each: the op's arguments in one graph)


@dataclasses.dataclass
class _DiskConversions:
    entries: dict[Path, dict[str, list[list[Any]]]] = dataclasses.field(default_factory=dict)  # by file, as read
    pending: dict[Path, dict[str, list[list[Any]]]] = dataclasses.field(default_factory=dict)  # found since written


_DISK = _DiskConversions()


def conversions_path(op: torch._ops.OpOverload) -> Path:
    """The file of the conversions found for `op`: they depend on torch's decompositions (its version and build) and
    on how this module traces them (its source)."""
    build = (torch.version.git_version or "")[:12]
    folder = cache_files.cache_dir() / f"promotion-torch-{torch.__version__}-{build}-{_source_digest()}"
    name = str(op)
    if not re.fullmatch(r"[A-Za-z0-9_.]{1,200}", name):  # a custom op's name that is not a safe file name
        name = hashlib.sha256(name.encode()).hexdigest()[:32]
    return folder / f"{name}.json"


@functools.cache
def _source_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


_PLAIN = (bool, int, float, complex, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _disk_key(op: torch._ops.OpOverload, described: tuple[Any, ...], spec: str) -> str | None:
    """A text naming the trace's inputs for the file; None where a value's text may not name it alone (a tensor's
    is elided past a few elements; an object's holds its address)."""
    if not all(_plain(value) for _, *rest in described for value in rest[-1:]):
        return None
    text = f"{op}|{described!r}|{spec}"
    return None if " at 0x" in text else text


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    return isinstance(value, _PLAIN)


def _read_conversions(op: torch._ops.OpOverload, disk_key: str | None) -> dict[int, torch.dtype] | None:
    if disk_key is None:
        return None
    path = conversions_path(op)
    entries = _DISK.entries.get(path)
    if entries is None:  # first use of this op's file, or another cache folder or torch since
        on_disk = (cache_files.read_json(path, _DISK_FORMAT) or {}).get("conversions")
        entries = _DISK.entries[path] = on_disk if isinstance(on_disk, dict) else {}
    found = entries.get(disk_key)
    if not isinstance(found, list):
        return None
    try:
        result = {int(index): getattr(torch, name) for index, name in found}
    except (TypeError, ValueError, AttributeError):  # not pairs of an index and a dtype's name
        return None
    return result if all(isinstance(dtype, torch.dtype) for dtype in result.values()) else None


def save_conversions() -> None:
    """Write the conversions traced since the last write into their ops' files (one write per graph and op, not per
    trace)."""
    for path, pending in _DISK.pending.items():
        on_disk = (cache_files.read_json(path, _DISK_FORMAT) or {}).get("conversions")  # another process's too
        entries = on_disk if isinstance(on_disk, dict) and len(on_disk) < _DISK_LIMIT else {}
        entries.update(pending)
        cache_files.write_json(path, {"format": _DISK_FORMAT, "torch": torch.__version__, "conversions": entries})
        _DISK.entries[path] = entries
    _DISK.pending.clear()


class _ConversionRecorder(TorchDispatchMode):
    """Records, for each input tensor, the dtypes the decomposition uses it in (converted or as it is).

    ATen ops the decomposition calls are decomposed in turn (down to prims), so that a conversion made
    inside them (``sum.default`` -> ``sum.dim_IntList`` -> convert to int64) is seen.
    """

    def __init__(self, inputs: dict[int, int]) -> None:
        super().__init__()
        self.inputs = inputs
        self.used: dict[int, set[torch.dtype]] = defaultdict(set)
        self.depth = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        decomposed = decomposition(func) if func.namespace == "aten" and func not in CONVERSIONS else None
        if decomposed is not None and self.depth < 8:
            self.depth += 1
            try:
                with self:
                    result = decomposed(*args, **kwargs)
            finally:
                self.depth -= 1
            if result is not NotImplemented:
                return result
        converted_to = _conversion_dtype(func, args, kwargs)
        for position, value in enumerate(pytree.tree_leaves((args, kwargs))):
            index = self.inputs.get(id(value)) if isinstance(value, torch.Tensor) else None
            if index is not None:
                self.used[index].add(converted_to if converted_to is not None and position == 0 else value.dtype)
        return func(*args, **kwargs)


def _conversion_dtype(func: Any, args: Any, kwargs: dict[str, Any]) -> torch.dtype | None:
    """The dtype a conversion op (``to``, ``_to_copy``, ``convert_element_type``...) converts its first argument to."""
    if func not in CONVERSIONS:
        return None
    if isinstance(kwargs.get("dtype"), torch.dtype):
        return kwargs["dtype"]
    for value in args[1:]:
        if isinstance(value, torch.dtype):
            return value
        if isinstance(value, torch.Tensor):  # to.other, type_as
            return value.dtype
    return None
