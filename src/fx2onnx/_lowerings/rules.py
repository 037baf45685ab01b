"""The rule record: how a module of :mod:`fx2onnx._lowerings` registers a lowering, in the manner of JAX's
``register_lowering``.

Precedence among fx2onnx's rules of one target is a key stored in each record, not the order modules are
imported in: a dtype *variant* (``variant="float64"``: it takes fewer dtypes than the generic rule, the one
that is right for them) is tried before the generic rules, then rules go by their registration order within
the same standing. The dispatcher takes the first perfect match in that order.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable
from typing import Any

import onnxscript
from onnxscript.values import TracedOnnxFunction

from fx2onnx._emit.context import with_context
from fx2onnx._emit.recorder import LazyTracedOnnxFunction
from fx2onnx._records import BASE_OPSET

DOMAIN = "pkg.fx2onnx"
_OPSET = onnxscript.values.Opset(DOMAIN, 1)
_ORDER = itertools.count()


@dataclasses.dataclass(frozen=True)
class Rule:
    """One lowering of one target (an ATen overload's registry key, ``aten::add.Tensor``)."""

    target: str
    function: TracedOnnxFunction
    opset: tuple[int, int | None]
    complex: bool  # for complex inputs, which reach it as (..., 2) real tensors
    variant: str | None  # the dtypes it is specific to (``"float64"``), tried before the generic rules
    order: int  # registration order: breaks ties among rules of the same standing

    @property
    def precedence(self) -> tuple[int, int]:
        return (0 if self.variant is not None else 1, self.order)


_RULES: list[Rule] = []


def lowering(
    *targets: str,
    opset: tuple[int, int | None] = (BASE_OPSET, None),
    complex: bool = False,
    variant: str | None = None,
    context: bool = False,
    context_key: Callable[[Any], Hashable] | None = None,
) -> Callable[[Callable[..., Any]], TracedOnnxFunction]:
    """Register the decorated (traced) function as fx2onnx's implementation of `targets`.

    `complex=True`: it is for nodes with complex inputs (kept apart from real ones, as torchlib does).
    `variant`: the dtypes it is specific to (``"float64"``, ``"integer"``...): it takes fewer dtypes than
    fx2onnx's generic lowering of `targets` and is tried before it.
    `context=True`: its first parameter, ``ctx``, receives the :class:`~fx2onnx._emit.context.LoweringContext`.
    `context_key` (with `context=True`): everything the rule reads of its context, as a hashable value of the
    context; a later call alike in its arguments and in that key replays the nodes the first one recorded (as
    functions of their arguments only are replayed). Without it, a context rule is traced for each node.
    """

    def decorate(function: Callable[..., Any]) -> TracedOnnxFunction:
        traced = LazyTracedOnnxFunction(_OPSET, with_context(function, context_key) if context else function)
        order = next(_ORDER)
        _RULES.extend(Rule(target, traced, opset, complex, variant, order) for target in targets)
        return traced

    return decorate


def registered_rules() -> list[Rule]:
    """Every registered rule, by precedence."""
    return sorted(_RULES, key=lambda rule: rule.precedence)


_ALIASES: dict[str, str] = {}


def alias(target: str, same_as: str) -> None:
    """`target` is lowered exactly as `same_as` is (an overload ATen defines as another op under a second name,
    ``aten::min.other`` for ``aten::minimum``): the registry gives it the same implementations, fx2onnx's and
    torchlib's, in the same order."""
    _ALIASES[target] = same_as


def registered_aliases() -> dict[str, str]:
    """Every alias: target -> the target whose implementations it shares."""
    return dict(_ALIASES)
