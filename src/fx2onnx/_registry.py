"""The registry: each operator (an ATen overload, a custom op, a Python function on SymInts)
maps to an ordered list of implementations, each with its type constraints and opset range.

Order is precedence: user registrations first (latest first), then fx2onnx's own lowerings, then
onnxscript's torchlib. The dispatcher tries them in this order and prefers the first perfect match.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, Union

import onnx_ir as ir
import onnxscript
import torch
from onnxscript.values import OnnxFunction, TracedOnnxFunction

from fx2onnx._passes import complex_parts
from fx2onnx._records import BASE_OPSET, qualified_name
from fx2onnx._torch_ops import lacks

Source = Literal["user", "fx2onnx", "torchlib"]
OnnxCallable = Union[OnnxFunction, TracedOnnxFunction]  # noqa: UP007 - runtime alias on 3.10
Target = Union[str, torch._ops.OpOverload, torch._ops.HigherOrderOperator, Callable[..., Any]]  # noqa: UP007

# ONNX domain under which user Python functions are traced (never appears in the model: traced
# functions emit their ONNX ops directly).
_USER_DOMAIN = "pkg.fx2onnx.user"


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One way to lower an operator: an onnxscript function and when it applies."""

    name: str
    function: OnnxCallable
    source: Source
    opset_min: int = BASE_OPSET
    opset_max: int | None = None
    complex: bool = False  # only for complex inputs (torchlib keeps these apart)

    @property
    def signature(self) -> ir.schemas.OpSignature:
        signature = self.function.op_signature
        assert signature is not None, f"{self.name} has no signature"
        return signature

    def supports_opset(self, opset: int) -> bool:
        return self.opset_min <= opset and (self.opset_max is None or opset <= self.opset_max)

    def describe(self) -> str:
        return f"{self.name} [{self.source}] ({self.signature})"


def as_onnx_function(impl: Callable[..., Any] | OnnxCallable) -> OnnxCallable:
    """Accept onnxscript functions as they are; wrap a plain Python function as traced.

    A plain function is called with ``onnx_ir`` values and calls ONNX ops through
    ``onnxscript.opsetNN`` (``op.Add(x, y)``); its annotations (``onnxscript.FLOAT`` etc. or
    TypeVars) give its type constraints.
    """
    if isinstance(impl, (OnnxFunction, TracedOnnxFunction)):
        return impl
    if not callable(impl) or not inspect.isfunction(impl):
        raise TypeError(f"an implementation must be an onnxscript function or a Python function, got {impl!r}")
    if impl not in _WRAPPED:  # one wrapper per function, so registrations of it compare equal
        _WRAPPED[impl] = TracedOnnxFunction(onnxscript.values.Opset(_USER_DOMAIN, 1), impl)
    return _WRAPPED[impl]


_WRAPPED: dict[Callable[..., Any], TracedOnnxFunction] = {}


def _function_name(function: OnnxCallable) -> str:
    inner = getattr(function, "func", None) or getattr(function, "function", None) or function
    name = getattr(inner, "__qualname__", None) or getattr(function, "name", None)
    return name if name is not None else repr(function)  # repr only when needed: onnxscript's is slow


class Registry:
    """Operator -> ordered implementations. Copy it to change it without affecting others.

    An implementation of an ATen or prims op the installed torch lacks (torch 2.15 removed ``aten::cholesky``) is
    not registered: :attr:`skipped` says which and why, and every other op exports as before.
    """

    def __init__(self) -> None:
        self._table: dict[str, list[Implementation]] = {}
        self._skipped: dict[str, str] = {}

    # --- public API -------------------------------------------------------------------------
    def register(
        self,
        target: Target,
        impl: Callable[..., Any] | OnnxCallable,
        *,
        opset: int | tuple[int, int | None] | None = None,
        source: Source = "user",
        complex: bool = False,
    ) -> Implementation:
        """Register `impl` for `target`. User implementations take precedence over the defaults.

        `opset` is the lowest opset the implementation is valid for, or a ``(min, max)`` range.
        `complex=True`: `impl` is for nodes with complex inputs, which it receives as real tensors with a
        trailing dim of 2 (real, imag) and returns in the same layout (see README, "Complex values").
        """
        function = as_onnx_function(impl)
        opset_min, opset_max = _opset_range(opset)
        implementation = Implementation(
            name=f"{source}:{_function_name(function)}",
            function=function,
            source=source,
            opset_min=opset_min,
            opset_max=opset_max,
            complex=complex,
        )
        key = qualified_name(target)
        if self._skips(key, implementation):
            warnings.warn(f"{key} is not registered: {self._skipped[key]}", stacklevel=2)
        else:
            self._insert(key, implementation)
        return implementation

    def unregister(self, target: Target, impl: Callable[..., Any] | OnnxCallable | None = None) -> None:
        """Remove every implementation of `target` (or only `impl`)."""
        key = qualified_name(target)
        if impl is None:
            self._table.pop(key, None)
            return
        kept = [i for i in self._table.get(key, []) if i.function is not impl and _unwrap(i.function) is not impl]
        if kept:
            self._table[key] = kept
        else:
            self._table.pop(key, None)

    def is_registered(self, target: Target) -> bool:
        return bool(self._table.get(qualified_name(target)))

    def lowers(self, target: Target, *, complex: bool = False) -> bool:
        """Whether an implementation of `target` takes real (or, with `complex=True`, complex) inputs."""
        return any(impl.complex == complex for impl in self._table.get(qualified_name(target), []))

    def lowers_on_parts(self, target: Target) -> bool:
        """Whether, with complex inputs, `target` is lowered by its real lowering after the FX pass that rewrites it
        on the real and imaginary parts (passes/complex_parts.py)."""
        return complex_parts.rewrites(target) and self.lowers(target)

    def overloads(self, target: Target) -> list[Implementation]:
        """The implementations of `target`, in the order the dispatcher tries them."""
        return list(self._table.get(qualified_name(target), []))

    def targets(self) -> list[str]:
        return sorted(self._table)

    @property
    def skipped(self) -> dict[str, str]:
        """The targets whose implementations were not registered -> why (the installed torch lacks the op) and
        which implementations: ``{"aten::cholesky": "torch 2.15.0 has no aten::cholesky; not registered: ..."}``."""
        return dict(self._skipped)

    def copy(self) -> Registry:
        new = Registry()
        new._table = {k: list(v) for k, v in self._table.items()}
        new._skipped = dict(self._skipped)
        return new

    @classmethod
    def default(cls) -> Registry:
        """A fresh registry with fx2onnx's lowerings and onnxscript's torchlib."""
        return _default_registry().copy()

    # --- construction -------------------------------------------------------------------------
    def _insert(self, key: str, implementation: Implementation) -> None:
        entries = self._table.setdefault(key, [])
        if implementation.source == "user":  # the newest user registration is tried first
            entries.insert(0, implementation)
            return
        rank = _SOURCE_RANK[implementation.source]  # defaults keep registration order within a source
        position = next((i for i, e in enumerate(entries) if _SOURCE_RANK[e.source] > rank), len(entries))
        entries.insert(position, implementation)

    def _add_default(self, key: str, implementation: Implementation) -> None:
        key = qualified_name(key)
        if not self._skips(key, implementation):
            self._insert(key, implementation)

    def _skips(self, key: str, implementation: Implementation) -> bool:
        """Whether `implementation` is left out because torch lacks `key`'s op; if so, record it in skipped."""
        reason = lacks(key)
        if reason is None:
            return False
        separator = ", " if key in self._skipped else f"{reason}; not registered: "
        self._skipped[key] = self._skipped.get(key, "") + separator + implementation.name
        return True


_SOURCE_RANK = {"user": 0, "fx2onnx": 1, "torchlib": 2}


def _unwrap(function: OnnxCallable) -> Any:
    return getattr(function, "func", None) or getattr(function, "function", None)


def _opset_range(opset: int | tuple[int, int | None] | None) -> tuple[int, int | None]:
    if opset is None:
        return BASE_OPSET, None
    if isinstance(opset, int):
        return opset, None
    low, high = opset
    return low, high


def apply_translation_table(registry: Registry, table: dict[Target, Any] | None) -> Registry:
    """``custom_translation_table`` as in torch.onnx.export: target -> function or list of them."""
    if not table:
        return registry
    registry = registry.copy()
    for target, impls in table.items():
        impl_list = impls if isinstance(impls, (list, tuple)) else [impls]
        # Register in reverse so the first listed ends up first.
        for impl in reversed(impl_list):
            registry.register(target, impl)
    return registry


@contextlib.contextmanager
def _lazy_signatures() -> Iterator[None]:
    """While torchlib's op modules are first imported, its trace-only functions are created with lazy signatures
    (:class:`~fx2onnx._emit.recorder.LazyTracedOnnxFunction`, a subclass computing the same signature on first use):
    torchlib's decorator creates them through ``onnxscript.values.TracedOnnxFunction``, swapped for the import's
    duration. An already imported torchlib stays as it is."""
    import onnxscript.values

    from fx2onnx._emit.recorder import LazyTracedOnnxFunction

    original = onnxscript.values.TracedOnnxFunction
    onnxscript.values.TracedOnnxFunction = LazyTracedOnnxFunction  # type: ignore[misc]
    try:
        yield
    finally:
        onnxscript.values.TracedOnnxFunction = original  # type: ignore[misc]


@functools.cache
def _default_registry() -> Registry:
    with _lazy_signatures():
        from onnxscript.function_libs.torch_lib import ops as _torchlib_ops  # noqa: F401  (populates registration)
    from onnxscript.function_libs.torch_lib import registration

    from fx2onnx import _lowerings as lowerings

    registry = Registry()
    for rule in lowerings.registered_rules():  # by their precedence
        registry._add_default(
            rule.target,
            Implementation(
                name=f"fx2onnx:{_function_name(rule.function)}",
                function=rule.function,
                source="fx2onnx",
                opset_min=rule.opset[0],
                opset_max=rule.opset[1],
                complex=rule.complex,
            ),
        )
    for key, overloaded in registration.default_registry.items():
        for function in overloaded.overloads:
            registry._add_default(key, _torchlib_impl(function, complex=False))
        for function in overloaded.complex:
            registry._add_default(key, _torchlib_impl(function, complex=True))
    for alias, original in lowerings.registered_aliases().items():
        for implementation in registry.overloads(original):
            registry._add_default(alias, implementation)
        if original in registry._skipped and alias not in registry._skipped:
            registry._skipped[alias] = f"lowered as {original}, which is skipped"
    return registry


def _torchlib_impl(function: OnnxCallable, *, complex: bool) -> Implementation:
    return Implementation(
        name=f"torchlib:{_function_name(function)}", function=function, source="torchlib", complex=complex
    )


# The process-wide registry that ``fx2onnx.register`` changes and ``export`` uses by default.
_global: Registry | None = None


def global_registry() -> Registry:
    global _global
    if _global is None:
        _global = Registry.default()
    return _global


def register(
    target: Target, impl: Callable[..., Any] | OnnxCallable, *, opset: Any = None, complex: bool = False
) -> Implementation:
    return global_registry().register(target, impl, opset=opset, complex=complex)


def unregister(target: Target, impl: Any = None) -> None:
    global_registry().unregister(target, impl)


def is_registered(target: Target) -> bool:
    return global_registry().is_registered(target)


def overloads(target: Target) -> list[Implementation]:
    return global_registry().overloads(target)


def registered_targets(registry: Registry) -> Iterable[str]:
    return registry.targets()
