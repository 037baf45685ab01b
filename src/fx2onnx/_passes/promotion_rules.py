"""Where type promotion's rules come from: the installed torch, read at export time, not a table.

- :func:`elementwise_rule`: the promotion kind (``ELEMENTWISE_TYPE_PROMOTION_KIND``) and promoting arguments of an
  elementwise op's reference implementation, read from its ``elementwise_type_promotion_wrapper``;
- :func:`traced_conversions`: for other ops, run torch's decomposition on meta tensors and record the dtype each
  input is converted to before it is computed with (``sum(bool)`` converts to int64).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections import defaultdict
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._decomp import decomposition_table
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common.wrappers import elementwise_type_promotion_wrapper
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
CAST = torch.ops.prims.convert_element_type.default
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
    return result


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
