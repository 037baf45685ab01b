"""fx2onnx's own implementations, for operators torchlib lacks or lowers wrongly.

Each module registers its rules where they are defined, with :func:`lowering`, in the manner of
JAX's ``register_lowering``; importing this package collects them all.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import onnxscript
from onnxscript.values import TracedOnnxFunction

from fx2onnx.emit.context import with_context
from fx2onnx.records import BASE_OPSET

DOMAIN = "pkg.fx2onnx"
_OPSET = onnxscript.values.Opset(DOMAIN, 1)
_RULES: list[tuple[str, TracedOnnxFunction, tuple[int, int | None]]] = []
# Rules for a few dtypes (float64 only, say) that must be tried before the generic rules of the same targets.
_SPECIFIC_RULES: list[tuple[str, TracedOnnxFunction, tuple[int, int | None]]] = []
_COMPLEX: set[int] = set()  # ids of lowerings for complex inputs, which reach them as (..., 2) real tensors
_MODULES = (
    "core",
    "attention",
    "quantized",
    "dtype_fixes",
    "special",
    "spectral",
    "indexing",
    "nn",
    "linalg",
    "float64",
    "float64_math",
    "accuracy",
    "symbolic",
    "integer_ops",
    "integer_pooling",
    "moe",
    "reduced_precision",
)


def lowering(
    *targets: str,
    opset: tuple[int, int | None] = (BASE_OPSET, None),
    complex: bool = False,
    specific: bool = False,
    context: bool = False,
) -> Callable[[Callable[..., Any]], TracedOnnxFunction]:
    """Register the decorated (traced) function as fx2onnx's implementation of `targets`.

    `complex=True`: it is for nodes with complex inputs (kept apart from real ones, as torchlib does).
    `specific=True`: it takes fewer dtypes than fx2onnx's other lowerings of `targets` and is tried before them
    (the dispatcher takes the first perfect match), whatever the order the modules register in.
    `context=True`: its first parameter, ``ctx``, receives the :class:`~fx2onnx.emit.context.LoweringContext`.
    """

    def decorate(function: Callable[..., Any]) -> TracedOnnxFunction:
        traced = TracedOnnxFunction(_OPSET, with_context(function) if context else function)
        if complex:
            _COMPLEX.add(id(traced))
        for target in targets:
            (_SPECIFIC_RULES if specific else _RULES).append((target, traced, opset))
        return traced

    return decorate


def takes_complex(function: TracedOnnxFunction) -> bool:
    return id(function) in _COMPLEX


def own_lowerings() -> list[tuple[str, TracedOnnxFunction, tuple[int, int | None]]]:
    for module in _MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return _SPECIFIC_RULES + _RULES
