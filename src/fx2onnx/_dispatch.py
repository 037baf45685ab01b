"""The dispatcher: for each FX node, choose one implementation from the registry.

Each candidate is bound to the node: ATen arguments to the implementation's parameters (by name,
then by position), the presence of optional arguments (``dim=None`` vs ``dim=1``, ``dtype`` given
or not) to its required/optional parameters, and input dtypes to its type constraints (shared
type variables must agree). A candidate whose constraints all hold is a perfect match; the first
perfect match wins. Otherwise the candidate reachable with the cheapest Casts wins (see
:func:`fx2onnx._dtypes.cast_cost`). Every candidate and the reason it lost is recorded.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

import onnx_ir as ir
import torch
import torch.fx
from onnx_ir import schemas

from fx2onnx import _complex_layout as complex_layout
from fx2onnx import _dtypes as dtypes
from fx2onnx._records import qualified_name, schema_arguments
from fx2onnx._registry import Implementation, Registry
from fx2onnx.errors import UnsupportedOperatorError, source_line

# ATen arguments that carry no meaning for an ONNX graph; implementations may omit them.
IGNORABLE_ARGUMENTS = frozenset(
    {"device", "layout", "pin_memory", "memory_format", "non_blocking", "requires_grad", "generator", "out"}
)

# Among equally cheap cast targets, prefer these (deterministic tie-break).
_PREFERENCE = [
    ir.DataType.FLOAT,
    ir.DataType.INT64,
    ir.DataType.INT32,
    ir.DataType.DOUBLE,
    ir.DataType.FLOAT16,
    ir.DataType.BFLOAT16,
    ir.DataType.BOOL,
    ir.DataType.INT16,
    ir.DataType.INT8,
    ir.DataType.UINT8,
]

MatchKind = Literal["perfect", "cast", "rejected", "not-tried"]


@dataclasses.dataclass
class Candidate:
    """One implementation as the dispatcher saw it for one node."""

    implementation: Implementation
    kind: MatchKind
    reason: str = ""
    casts: dict[str, ir.DataType] = dataclasses.field(default_factory=dict)  # param name -> cast to
    cost: float = 0.0
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict)  # param name -> FX argument


@dataclasses.dataclass
class DispatchDecision:
    """What was chosen for one node, and why every other candidate was not."""

    node: str
    target: str
    input_dtypes: dict[str, str]
    candidates: list[Candidate]
    chosen: Candidate | None
    stack_trace: str | None = None

    @property
    def perfect(self) -> bool:
        return self.chosen is not None and self.chosen.kind == "perfect"

    def explain(self) -> str:
        lines = [f"{self.node} = {self.target}({_format_dtypes(self.input_dtypes)})"]
        for candidate in self.candidates:
            mark = "->" if candidate is self.chosen else "  "
            detail = candidate.reason
            if candidate.casts:
                casts = ", ".join(f"{k}->{dtypes.short_name(v)}" for k, v in candidate.casts.items())
                detail = f"casts {casts} (cost {candidate.cost:g})" + (f"; {detail}" if detail else "")
            lines.append(f"  {mark} {candidate.implementation.name} [{candidate.kind}] {detail}".rstrip())
        return "\n".join(lines)


def _format_dtypes(input_dtypes: Mapping[str, str]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in input_dtypes.items())


# --- node introspection ---------------------------------------------------------------------------
def value_dtype(value: Any) -> ir.DataType | None:
    """The ONNX dtype of an FX argument: a tensor node, a symbolic scalar, or None for constants."""
    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            return dtypes.to_onnx(val.dtype)
        if isinstance(val, torch.SymBool):
            return ir.DataType.BOOL
        if isinstance(val, torch.SymInt):
            return ir.DataType.INT64
        if isinstance(val, torch.SymFloat):
            return ir.DataType.FLOAT
    return None


def node_arguments(node: torch.fx.Node) -> tuple[list[tuple[str, Any]], set[str]]:
    """The node's arguments as (name, value) in schema order, and the names explicitly given.

    An argument given with its schema default counts as not given.
    """
    read = read_arguments(node)
    return read.named, read.given


# How an argument is present, as binding reads it (bits of an ArgumentsRead's `presence`).
_GIVEN, _NONE, _SYMBOLIC = 1, 2, 4


class ArgumentsRead(NamedTuple):
    """A node's arguments, and all that binding reads of them (:func:`bind`), from one pass over them."""

    named: list[tuple[str, Any]]  # (name, value) in schema order
    given: set[str]  # the names explicitly given (an argument given with its schema default is not)
    presence: tuple[Any, ...]  # per argument: given / None / symbolic bits; and the names where there is no schema
    dtypes: tuple[Any, ...]  # per argument: its tensors' dtypes (_argument_dtypes), None for a Python constant

    @property
    def takes_complex(self) -> bool:
        return any(found is not None and any(dtypes.is_complex(d) for d in found) for found in self.dtypes)


def read_arguments(node: torch.fx.Node) -> ArgumentsRead:
    """:func:`node_arguments` with, per argument, what :func:`bind` reads of it: whether it is given, None or symbolic,
    and its tensors' dtypes. Two nodes of one target alike in these bind alike to every implementation (the values
    of Python constants are not read: only whether they are given, which the presence says)."""
    arguments = schema_arguments(node.target)
    named: list[tuple[str, Any]] = []
    given: set[str] = set()
    presence: list[Any] = []
    found_dtypes: list[Any] = []
    if arguments is None:
        named = [(f"arg{i}", a) for i, a in enumerate(node.args)] + list(node.kwargs.items())
        for name, value in named:
            if value is not None:
                given.add(name)
            presence.append((name, _presence(value, value is not None)))
            found_dtypes.append(_dtypes_key(value))
        return ArgumentsRead(named, given, tuple(presence), tuple(found_dtypes))
    args, kwargs = node.args, node.kwargs
    positional = len(args)
    for i, (name, kwarg_only, has_default, default) in enumerate(arguments):
        if i < positional and not kwarg_only:
            value, explicit = args[i], True
        elif name in kwargs:
            value, explicit = kwargs[name], True
        else:
            value, explicit = (copy.copy(default) if type(default) is list else default), False
        named.append((name, value))
        kind = type(value)
        if kind is torch.fx.Node:  # the commonest arguments first, without the general path's calls
            dtype = value_dtype(value)
            given.add(name)
            presence.append(_GIVEN | _SYMBOLIC)
            found_dtypes.append(None if dtype is None else (dtype,))
            continue
        if value is None:
            presence.append(_NONE)
            found_dtypes.append(None)
            continue
        is_given = explicit and not (has_default and _same(value, default))
        if is_given:
            given.add(name)
        if kind in _CONSTANTS:
            presence.append(_GIVEN if is_given else 0)
            found_dtypes.append(None)
            continue
        presence.append(_presence(value, is_given))
        found_dtypes.append(_dtypes_key(value))
    return ArgumentsRead(named, given, tuple(presence), tuple(found_dtypes))


# Python constants: neither symbolic nor holding tensors.
_CONSTANTS = frozenset({bool, int, float, str, torch.dtype, torch.device, torch.layout, torch.memory_format})


def _presence(value: Any, given: bool) -> int:
    return (_GIVEN if given else 0) | (_NONE if value is None else 0) | (_SYMBOLIC if _is_symbolic(value) else 0)


def _dtypes_key(value: Any) -> tuple[ir.DataType, ...] | None:
    """:func:`_argument_dtypes`, hashable."""
    found = _argument_dtypes(value)
    return None if found is None else tuple(found)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.fx.Node) or isinstance(b, torch.fx.Node):
        return False
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False


def _argument_dtypes(value: Any) -> list[ir.DataType] | None:
    """dtypes of a tensor-ish argument; None when it is a Python constant."""
    if isinstance(value, (list, tuple)):
        found = [value_dtype(v) for v in value if isinstance(v, torch.fx.Node)]
        found = [d for d in found if d is not None]
        return found or None
    dtype = value_dtype(value)
    return [dtype] if dtype is not None else None


# --- binding ----------------------------------------------------------------------------------------
def bind(implementation: Implementation, named: list[tuple[str, Any]], given: set[str], opset: int) -> Candidate:
    """Bind one node's arguments to one implementation's constraints."""
    if not implementation.supports_opset(opset):
        high = implementation.opset_max if implementation.opset_max is not None else "newest"
        return Candidate(
            implementation, "rejected", f"valid for opsets {implementation.opset_min}..{high}, not {opset}"
        )
    signature = implementation.signature
    params = list(signature.params)
    values = dict(named)

    arguments: dict[str, Any] = {}
    used: set[str] = set()
    for param_name, source in argument_sources(implementation, [name for name, _ in named]):
        used.add(source)
        if values[source] is not None:
            arguments[param_name] = values[source]

    has_complex = any(d is not None and dtypes.is_complex(d) for _, v in named for d in (_argument_dtypes(v) or []))
    if has_complex != implementation.complex:
        kind = "complex" if implementation.complex else "real"
        return Candidate(implementation, "rejected", f"takes {kind} inputs only")

    problem = _presence_problem(implementation, arguments, given - used, values)
    if problem is not None:
        return Candidate(implementation, "rejected", problem)

    # Group tensor inputs by type variable.
    groups: dict[str, list[tuple[str, ir.DataType]]] = {}
    allowed: dict[str, frozenset[ir.DataType]] = {}
    for param in params:
        if not isinstance(param, schemas.Parameter) or param.name not in arguments:
            continue
        found = _argument_dtypes(arguments[param.name])
        if not found:
            continue
        if implementation.complex:  # complex values reach it as (..., 2) real tensors (complex_layout)
            found = [complex_layout.real_component(d) for d in found]
        var = param.type_constraint.name
        allowed[var] = dtypes.allowed_dtypes(param.type_constraint)
        groups.setdefault(var, []).extend((param.name, d) for d in found)

    casts: dict[str, ir.DataType] = {}
    cost = 0.0
    problems = []
    for var, members in groups.items():
        present = {d for _, d in members}
        legal = allowed[var]
        if len(present) == 1 and present <= legal:
            continue
        best, best_cost = _cheapest_target([d for _, d in members], legal)
        if math.isinf(best_cost):
            shown = ", ".join(f"{p}: {dtypes.short_name(d)}" for p, d in members)
            names = ",".join(sorted(dtypes.short_name(d) for d in legal)) or "none"
            return Candidate(
                implementation, "rejected", f"{var} allows {{{names}}}; no lossless or lossy cast from {shown}"
            )
        assert best is not None
        cost += best_cost
        for param_name, d in members:
            if d != best:
                casts[param_name] = best
        problems.append(
            f"{var} bound to {'/'.join(sorted(dtypes.short_name(d) for d in present))}, needs {dtypes.short_name(best)}"
        )
    if casts:
        return Candidate(implementation, "cast", "; ".join(problems), casts, cost, arguments)
    return Candidate(implementation, "perfect", "", {}, 0.0, arguments)


def _presence_problem(
    implementation: Implementation, arguments: Mapping[str, Any], not_used: set[str], values: Mapping[str, Any]
) -> str | None:
    """Why `implementation` cannot take the node's arguments as they are present (an argument given that it has no
    parameter for, a required parameter the node leaves out, a constant attribute given a symbolic value), or None."""
    for name in sorted(not_used - IGNORABLE_ARGUMENTS):
        return f"does not take `{name}` (given: {values[name]!r})"
    for param in implementation.signature.params:
        required = param.required and not param.has_default()
        if required and param.name not in arguments:
            if isinstance(param, schemas.Parameter) and param.variadic:
                continue
            return f"requires `{param.name}`, which the node does not give"
        is_attribute = isinstance(param, schemas.AttributeParameter) and param.name in arguments
        if is_attribute and _is_symbolic(arguments[param.name]):
            return f"needs `{param.name}` as a constant but it is symbolic"
    return None


class ArgumentBinding:
    """What capture asks of dispatch (capture's ``Registry`` protocol, given by ``_export.py``): the registry's
    answers, and whether some implementation of a node's op takes the node's arguments as they are present.

    ``Registry.lowers`` says only that an op has implementations; an implementation that requires an argument the
    node leaves out (torchlib's ``nll_loss_forward`` requires ``weight``) would fail at dispatch, where the node
    could have been decomposed. Capture decomposes such a node instead. dtypes are not judged here: the FX passes
    (type promotion, complex parts) change them after capture, and dispatch casts.
    """

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._answers: dict[tuple[Any, ...], bool] = {}  # by target and which arguments are given/None/symbolic

    def lowers(self, target: Any, *, complex: bool = False) -> bool:
        return self.registry.lowers(target, complex=complex)

    def lowers_on_parts(self, target: Any) -> bool:
        return self.registry.lowers_on_parts(target)

    def binds(self, node: torch.fx.Node) -> bool:
        """Whether some implementation of `node`'s op (a real one for real inputs; any for complex inputs, which
        the complex parts pass may hand to the real one) takes `node`'s arguments as they are present."""
        if getattr(node.target, "_schema", None) is None:
            return True
        read = read_arguments(node)
        takes_complex = read.takes_complex
        key = (node.target, takes_complex, read.presence)  # the schema names the arguments in order
        answer = self._answers.get(key)
        if answer is None:
            answer = any(
                _takes_present_arguments(implementation, read.named, read.given)
                for implementation in self.registry.overloads(node.target)
                if takes_complex or not implementation.complex
            )
            self._answers[key] = answer
        return answer


def _takes_present_arguments(implementation: Implementation, named: list[tuple[str, Any]], given: set[str]) -> bool:
    values = dict(named)
    sources = argument_sources(implementation, [name for name, _ in named])
    arguments = {param: values[source] for param, source in sources if values[source] is not None}
    return _presence_problem(implementation, arguments, given - {source for _, source in sources}, values) is None


def argument_sources(implementation: Implementation, aten_names: Sequence[str]) -> list[tuple[str, str]]:
    """(parameter, ATen argument) pairs: which of the node's arguments each parameter of `implementation` takes,
    by name, else by position when the argument at that position has no parameter of its own name."""
    params = implementation.signature.params
    param_names = {p.name for p in params}
    aten_set = set(aten_names)
    sources = []
    for position, param in enumerate(params):
        if param.name in aten_set:
            sources.append((param.name, param.name))
        elif position < len(aten_names) and aten_names[position] not in param_names:
            sources.append((param.name, aten_names[position]))
    return sources


def _cheapest_target(sources: Sequence[ir.DataType], legal: frozenset[ir.DataType]) -> tuple[ir.DataType | None, float]:
    best: ir.DataType | None = None
    best_cost = math.inf
    ordered = sorted(legal, key=lambda d: (_PREFERENCE.index(d) if d in _PREFERENCE else len(_PREFERENCE), d.value))
    for target in ordered:
        total = sum(dtypes.cast_cost(s, target) for s in sources)
        if total < best_cost:
            best, best_cost = target, total
    return best, best_cost


@dataclasses.dataclass(frozen=True)
class _Binding:
    """A candidate with the node's arguments left out, to bind another node that is alike."""

    implementation: Implementation
    kind: MatchKind
    reason: str
    casts: dict[str, ir.DataType]
    cost: float
    sources: tuple[tuple[str, str], ...]  # (parameter, ATen argument) of the candidate's arguments
    not_taken: str | None  # the argument a rejection names with its value (that value is the node's own)

    @classmethod
    def of(cls, candidate: Candidate, aten_names: Sequence[str]) -> _Binding:
        sources: tuple[tuple[str, str], ...] = ()
        if candidate.arguments:
            sources = tuple(
                (param, source)
                for param, source in argument_sources(candidate.implementation, aten_names)
                if param in candidate.arguments
            )
        not_taken = None
        if candidate.kind == "rejected" and candidate.reason.startswith("does not take `"):
            not_taken = candidate.reason.split("`")[1]
        return cls(
            candidate.implementation,
            candidate.kind,
            candidate.reason,
            candidate.casts,
            candidate.cost,
            sources,
            not_taken,
        )

    def candidate(self, values: Mapping[str, Any]) -> Candidate:
        reason = self.reason
        if self.not_taken is not None:
            reason = f"does not take `{self.not_taken}` (given: {values[self.not_taken]!r})"
        arguments = {param: values[source] for param, source in self.sources}
        return Candidate(self.implementation, self.kind, reason, dict(self.casts), self.cost, arguments)


class _Bound(NamedTuple):
    """How a node's target and arguments bound (:meth:`Dispatcher._bind`), for the next node alike."""

    target: str  # the target's registry key
    input_dtypes: dict[str, str]  # as the decision shows them
    bindings: tuple[_Binding, ...]  # one per implementation, in the registry's order
    chosen: int | None  # the position of the winner among them


def _is_symbolic(value: Any) -> bool:
    if isinstance(value, torch.fx.Node):
        return True
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.fx.Node) for v in value)
    return False


# --- the dispatcher ---------------------------------------------------------------------------------
class Dispatcher:
    """Chooses implementations for FX nodes and keeps every decision."""

    def __init__(self, registry: Registry, opset: int) -> None:
        self.registry = registry
        self.opset = opset
        self.decisions: list[DispatchDecision] = []
        # How each candidate bound, by what binding reads of a node (read_arguments): a model's repeated layers
        # dispatch the same target with the same argument dtypes over and over.
        self._bindings: dict[tuple[Any, ...], _Bound] = {}

    def dispatch(self, node: torch.fx.Node) -> DispatchDecision:
        read = read_arguments(node)
        key = (node.target, read.presence, read.dtypes)
        bound = self._bindings.get(key)
        if bound is None:
            bound, candidates = self._bind(node, read)
            self._bindings[key] = bound
        else:
            values = dict(read.named)
            candidates = [binding.candidate(values) for binding in bound.bindings]
        chosen = None if bound.chosen is None else candidates[bound.chosen]
        decision = DispatchDecision(
            node=node.name,
            target=bound.target,
            input_dtypes=dict(bound.input_dtypes),
            candidates=candidates,
            chosen=chosen,
            stack_trace=node.meta.get("stack_trace"),
        )
        self.decisions.append(decision)
        if chosen is None:
            raise UnsupportedOperatorError(decision, source_line(node), node)
        return decision

    def _bind(self, node: torch.fx.Node, read: ArgumentsRead) -> tuple[_Bound, list[Candidate]]:
        """Every implementation bound to the node as :func:`bind` binds it, and what of that binds another node alike
        in all that binding reads (which arguments are given, None or symbolic, and the dtypes of tensor arguments):
        the bindings with the node's arguments left out, the input dtypes the decision shows, and which one wins."""
        candidates = [bind(impl, read.named, read.given, self.opset) for impl in self.registry.overloads(node.target)]
        chosen = next((i for i, c in enumerate(candidates) if c.kind == "perfect"), None)
        if chosen is None:
            castable = [i for i, c in enumerate(candidates) if c.kind == "cast"]
            chosen = min(castable, key=lambda i: candidates[i].cost) if castable else None
        aten_names = [name for name, _ in read.named]
        bound = _Bound(
            qualified_name(node.target),
            _input_dtypes(read.named),
            tuple(_Binding.of(candidate, aten_names) for candidate in candidates),
            chosen,
        )
        return bound, candidates


def _input_dtypes(named: Sequence[tuple[str, Any]]) -> dict[str, str]:
    """The dtypes of the node's tensor arguments, by argument name, as a decision shows them."""
    shown = {}
    for name, value in named:
        found = _argument_dtypes(value)
        if found:
            shown[name] = "/".join(dtypes.short_name(d) for d in found)
    return shown
