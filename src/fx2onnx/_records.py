"""What every stage shares, and nothing else: the base opset, the keys of fx2onnx's metadata on ONNX nodes,
registry keys of FX targets, and the record of a Cast the exporter inserted.

A leaf: it imports no other fx2onnx module, so any stage (and the report) may import it.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any, NamedTuple

# The opset fx2onnx emits in (torchlib's own); export converts upward from it, never downward.
BASE_OPSET = 18

# Metadata fx2onnx writes on ONNX nodes (``metadata_props``) and on the model.
METADATA_PREFIX = "pkg.fx2onnx"
FX_NODE = f"{METADATA_PREFIX}.fx_node"  # the FX node a node was emitted for (a body's nodes by their path)
TARGET = f"{METADATA_PREFIX}.target"  # that node's op overload (``aten::add.Tensor``)
STACK_TRACE = f"{METADATA_PREFIX}.stack_trace"  # that node's stack trace in the user's code
LEGALIZED = f"{METADATA_PREFIX}.legalize"  # on Casts the legalizer inserted: why they are there
# On a run-time check node: the assumption it verifies (torch.export's expression); the export renames the check
# after the user's dims and line (``_emit/runtime_checks.py``).
RUNTIME_CHECK = f"{METADATA_PREFIX}.runtime_check"
# On a run-time check a lowering adds where torch.export made no assertion: why the ONNX graph needs it (always
# checked: no branch of a size-oblivious decision stands for it).
RUNTIME_CHECK_REASON = f"{METADATA_PREFIX}.runtime_check_reason"
CHECK_PREFIX = "fx2onnx_check"  # run-time check nodes' names start so
NAMESPACE = "namespace"  # the nn.Module path, as torch's exporter writes it


def qualified_name(target: Any) -> str:
    """The registry key of an FX call target, e.g. ``aten::add.Tensor`` or ``aten::relu``."""
    try:
        return _cached_qualified_name(target)
    except TypeError:
        if getattr(type(target), "__hash__", None) is not None:
            raise  # not a registry target: the reason is the one _qualified_name gave
        return _qualified_name(target)  # an unhashable target (it raises, naming it)


def _qualified_name(target: Any) -> str:
    import torch  # here: the CLI imports this module before it needs torch

    from fx2onnx._torch_ops import MissingOverload

    if isinstance(target, str):
        if target.endswith(".default"):
            target = target[: -len(".default")]
        return target
    if isinstance(target, (torch._ops.OpOverload, MissingOverload)):
        return target.name()
    if isinstance(target, torch._ops.OpOverloadPacket):
        raise TypeError(
            f"{target} is an overload packet; register a specific overload such as {target}.default or {target}.Tensor"
        )
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order::{target.name()}"
    if isinstance(target, (types.FunctionType, types.BuiltinFunctionType)):
        module = target.__module__ or "builtins"
        if module == "operator":
            module = "_operator"
        return f"{module}::{target.__name__}"
    raise TypeError(f"cannot use {target!r} as a registry target")


# An export asks for the key of each node's target several times (capture, dispatch, emit's metadata), and the same
# few dozen targets recur: kept per target (a key depends on the target alone).
_cached_qualified_name = functools.lru_cache(maxsize=4096)(_qualified_name)


class SchemaFacts(NamedTuple):
    """What the stages read of an op's schema, kept per op (:func:`schema_facts`)."""

    arguments: tuple[tuple[str, bool, bool, Any], ...]  # (name, keyword-only, has a default, the default or None)
    returns: int  # how many results
    is_mutable: bool


def schema_facts(target: Any) -> SchemaFacts | None:
    """The facts of `target`'s schema, None for a target without one. Kept per target: reading them through the
    schema's bindings costs tens of microseconds a node, and an export reads the same few dozen schemas for every
    node (capture, the FX passes, dispatch and emit each do)."""
    try:
        return _cached_schema_facts(target)
    except TypeError:  # an unhashable target
        return _read_schema_facts(target)


def schema_arguments(target: Any) -> tuple[tuple[str, bool, bool, Any], ...] | None:
    """(name, keyword-only, has a default, the default or None) for each argument of `target`'s schema; None for a
    target without one (:func:`schema_facts`)."""
    facts = schema_facts(target)
    return None if facts is None else facts.arguments


def _read_schema_facts(target: Any) -> SchemaFacts | None:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return None
    arguments = tuple(
        (arg.name, arg.kwarg_only, arg.has_default_value(), arg.default_value if arg.has_default_value() else None)
        for arg in schema.arguments
    )
    return SchemaFacts(arguments, len(schema.returns), bool(schema.is_mutable))


_cached_schema_facts = functools.lru_cache(maxsize=4096)(_read_schema_facts)


def target_name(target: Any) -> str:
    """`target`'s registry key, or its text when it is no registry target."""
    try:
        return qualified_name(target)
    except TypeError:
        return str(target)


@dataclasses.dataclass
class CastRecord:
    """A Cast the exporter inserted: where, from what to what, and why."""

    node: str
    value: str
    from_dtype: str
    to_dtype: str
    reason: str  # "dispatch": to fit the implementation; "eager-dtype": back to eager's dtype; "legalize"


@dataclasses.dataclass
class DecompositionRecord:
    """How capture decomposed the graph torch.export produced, and why.

    `strategy` is ``"none"`` (the registry lowers every op as captured), ``"local"`` (only the nodes it cannot lower
    were replaced by their decompositions, each traced on its own inputs, the rest left as captured) or ``"full"``
    (torch's ``run_decompositions`` retraced the whole program: the reason says what needed it).
    """

    strategy: str = "none"
    reason: str = ""
    nodes: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (FX node name, overload) replaced locally
    functionalized: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # in-place nodes made functional

    def describe(self) -> str:
        """One line: the strategy, the nodes it replaced, the reason."""
        parts = [self.strategy]
        if self.nodes:
            parts.append("decomposed " + ", ".join(f"`{name}` ({target})" for name, target in self.nodes))
        if self.functionalized:
            parts.append("made functional " + ", ".join(f"`{name}` ({target})" for name, target in self.functionalized))
        if self.reason:
            parts.append(self.reason)
        return "; ".join(parts)
