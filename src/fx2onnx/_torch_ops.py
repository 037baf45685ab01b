"""The ATen and prims overloads fx2onnx names, looked up so that one the installed torch lacks cannot stop the package.

torch removes ops: 2.15 removed ``aten::cholesky`` (the deprecated ``torch.cholesky``'s op), and
``torch.ops.aten.cholesky.default`` raising AttributeError in a table built at import made every export fail. Here
``aten.cholesky.default`` is then a :class:`MissingOverload`: no graph node's target equals it, so a table keyed by it
never matches, :func:`present` leaves it out of what is handed to torch, calling it raises an :class:`ExportError`
naming the op and torch's version, and :func:`missing` lists each one with that reason. The registry skips its
targets the same way (:func:`lacks`, ``Registry.skipped``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, TypeVar

import torch

from fx2onnx.errors import ExportError

# The namespaces torch defines in full when it is imported: a name absent there is absent from this torch (other
# namespaces, torchvision's or a user's library, fill in when their package is imported).
_TORCH_NAMESPACES = ("aten", "prims")
_MISSING: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class MissingOverload:
    """An overload fx2onnx names that the installed torch lacks (``aten::cholesky.default`` in torch 2.15)."""

    qualified: str  # ``aten::cholesky.default``

    def name(self) -> str:
        """The registry key, as ``OpOverload.name()`` gives it (``aten::cholesky``, ``aten::add.Tensor``)."""
        return self.qualified.removesuffix(".default")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ExportError(f"fx2onnx needs {self.qualified}: {_MISSING[self.qualified]}", target=self.name())


def _absence(namespace: str, op: str, overload: str) -> str | None:
    """Why torch lacks ``namespace::op.overload``, or None when it has it."""
    packet = getattr(getattr(torch.ops, namespace), op, None)
    if packet is None:
        return f"torch {torch.__version__} has no {namespace}::{op}"
    if not hasattr(packet, overload):
        return f"torch {torch.__version__}'s {namespace}::{op} has no overload {overload!r} ({packet.overloads()})"
    return None


class _Packet:
    """``aten.<op>``: its overloads as attributes, each torch's OpOverload or a MissingOverload."""

    def __init__(self, namespace: str, op: str) -> None:
        self._namespace, self._op = namespace, op

    def __getattr__(self, overload: str) -> torch._ops.OpOverload | MissingOverload:
        if overload.startswith("__"):
            raise AttributeError(overload)
        reason = _absence(self._namespace, self._op, overload)
        if reason is None:
            found: Any = getattr(getattr(getattr(torch.ops, self._namespace), self._op), overload)
        else:
            found = MissingOverload(f"{self._namespace}::{self._op}.{overload}")
            _MISSING[found.qualified] = reason
        setattr(self, overload, found)  # looked up once: later reads are plain attribute reads
        return found


class _Namespace:
    def __init__(self, namespace: str) -> None:
        self._namespace = namespace

    def __getattr__(self, op: str) -> _Packet:
        if op.startswith("__") and getattr(getattr(torch.ops, self._namespace), op, None) is None:
            raise AttributeError(op)  # Python's protocol probes (__deepcopy__...); aten.__and__ is an op
        packet = _Packet(self._namespace, op)
        setattr(self, op, packet)
        return packet


aten: Any = _Namespace("aten")
prims: Any = _Namespace("prims")

K = TypeVar("K")
V = TypeVar("V")


def present(table: Mapping[K, V]) -> dict[K, V]:
    """`table` without its entries keyed by overloads this torch lacks (for tables torch reads, as fake kernels)."""
    return {key: value for key, value in table.items() if not isinstance(key, MissingOverload)}


def missing() -> dict[str, str]:
    """Every overload fx2onnx named that this torch lacks -> why (``aten::cholesky.default`` -> ``torch 2.15.0 has
    no aten::cholesky``)."""
    return dict(_MISSING)


@functools.cache  # torch's own namespaces do not change once it is imported
def lacks(key: str) -> str | None:
    """Why the installed torch lacks the op a registry key (``aten::add.Tensor``, ``aten::relu``) names, or None when
    it has it or the key is outside torch's own namespaces."""
    namespace, separator, rest = key.partition("::")
    if not separator or namespace not in _TORCH_NAMESPACES:
        return None
    op, _, overload = rest.partition(".")
    return _absence(namespace, op, overload or "default")
