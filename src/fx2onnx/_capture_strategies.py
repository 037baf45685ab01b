"""Capture through data-dependent code: the strategies tried after torch.export stops on a data-dependent guard.

Ops whose output size depends on values (nonzero, masked_select, unique, ``torchvision::nms``, boolean-mask
indexing) give their outputs *unbacked* sizes: symbols with no example value. Python code that branches on such
a size (torchvision's ``if boxes.numel() == 0: return empty``) makes torch.export raise
``GuardOnDataDependentSymNode``. The strategies, in order:

1. ``torch.export`` as is (``_capture_dims.export_with_suggested_fixes``): most models.
2. **size-oblivious guards**: a guard that torch cannot decide on an unbacked size is decided as torch's own
   size-oblivious reasoning does, for a size of at least 2 (``numel() == 0`` is False, ``size(0) > 1`` is True):
   the general branch, the one that also computes the right thing on 0 or 1 elements in ops that take empty
   tensors (an ONNX graph does). Each decision is recorded with the user's line and reported as an assumption.
   Where the model's special branch computes something else (``if kept.numel() == 0: return torch.zeros(1)``), the
   general graph alone would be silently wrong for those sizes: the export captures the model a second time with
   the decision taken the other way (``special=``: torch is told, a deferred assertion, so it knows ``u0 == 0``) and
   joins the two graphs in an ONNX ``If`` on the condition computed at run time (``_emit/branches.py``). One such
   decision per model; with several, or branches whose outputs' count or dtypes differ, the general branch alone,
   with a warning saying why. torchvision's batched NMS (``if boxes.numel() == 0: return empty``) is known to
   return what the general branch does: no second capture (``_branch_join.SPECIAL_BRANCH_SAVES_WORK``).
   A branch on a value (``if x.sum() > 0``: ``Eq(u0, 1)`` of an ``item()``) is taken as True and torch told so (a
   deferred assertion, which also keeps the value in the graph); the export captures the other side and joins them
   in an If, or fails naming the line: there is no general branch to fall back to.
   Undecidable even so (a comparison with a value the size could take either side of), it fails as before,
   unless the condition is input validation: an ``if`` whose body only raises (``if torch.any(var < 0): raise``),
   decided so that it does not raise, as torch.export decides a Python ``assert``.
3. **the example's section counts**, only after a failure inside ``torch.tensor_split(x, sections)`` given a 0-d
   tensor: the number of sections is the number of outputs, which an ONNX graph fixes. One eager run of the model
   on the example inputs (``torch.no_grad()``, buffers restored after) records each such call's count, in call
   order; the capture then gives each call that many outputs (with the size-oblivious guards of strategy 2). The
   op stays whole in the graph, and its lowering (``_lowerings/indexing.py``) makes the ONNX model fail at run
   time when fed another count, never split it otherwise. Each count is reported as an assumption.
Not a strategy: torch.export.draft_export's real-tensor propagation (guards decided by the example's values).
On torchvision's Faster R-CNN it captured a graph that keeps no detection (the "real" values it propagated
through non-strict export were themselves fake tensors: the RPN's mask came out empty), on Keypoint R-CNN it
failed on a metadata mismatch, and on a branch on a value (``if x.sum() > 0``) it would silently specialise the
graph to the example's branch. A wrong graph is worse than the error.

The first that succeeds is used; when none does, the error of the first (the user's line, torch's message)
is raised with what the later one hit. A model holding one of torchvision's detection modules known to stop plain
torch.export (``known_data_dependent``: their ``batched_nms`` asks ``boxes.numel() == 0``) starts with
size-oblivious guards: tracing it with torch.export first only to fail doubled its capture time.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import inspect
import re
import sys
import textwrap
import traceback
import typing
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sympy
import torch
from torch._C import DispatchKey
from torch._decomp import decomposition_table
from torch.fx.experimental.symbolic_shapes import (
    GuardOnDataDependentSymNode,
    ShapeEnv,
    free_unbacked_symbols,
    sym_or,
)
from torch.overrides import TorchFunctionMode

from fx2onnx._torch_ops import aten

__all__ = [
    "BOTH_BRANCHES",
    "GENERAL_BRANCH",
    "SAME_EMPTY_RESULTS",
    "Assumption",
    "BranchDecision",
    "StrategyAttempt",
    "assertion_key",
    "assumed_message",
    "deferred_assertion_lines",
    "example_section_counts",
    "first_that_captures",
    "is_data_dependent",
    "known_data_dependent",
    "size_oblivious_guards",
    "warn_if_assumed",
]


@dataclasses.dataclass(frozen=True)
class Assumption:
    """A guard on a data-dependent size decided without an example value."""

    expression: str
    decided: str
    source_line: str  # the user's (or library's) line that asked
    # how the ONNX model treats an input for which the decision is wrong: it fails at run time naming the check, or
    # it computes the branch taken (the general branch of a size-oblivious decision, right for 0 and 1 too in ops
    # that take empty tensors, as torch's own size-oblivious code assumes)
    at_run_time: str = "checked at run time by the ONNX model"

    def __str__(self) -> str:
        return f"{self.expression} taken as {self.decided} at {self.source_line} ({self.at_run_time})"


@dataclasses.dataclass
class BranchDecision:
    """A size-oblivious decision for the general branch (``numel() == 0`` taken as False) that the model's code asked
    of a data-dependent size: the special branch can be captured too (the decision taken the other way), and the ONNX
    model choose between the two at run time on `condition`, computed from the sizes of its values."""

    condition: Any  # the sympy condition torch asked, over unbacked sizes
    general: bool  # its value in the general branch
    source_line: str
    ordinal: int  # its position among the general-branch decisions of one trace (the special capture flips this one)
    on_value: bool = False  # a branch on a value (``if x.sum() > 0``), not on a size: no general branch to fall back to
    in_graph: Any = None  # `condition` over the final graph's symbols, where a retrace numbered them otherwise
    # with the ordinal EVERY_VALUE: the ordinals of the branches on values taken the other way (None: all of them)
    flipped: frozenset[int] | None = None

    def text(self) -> str:
        return f"{self.condition} taken as {self.general} at {self.source_line}"


# The ordinal of a special branch that flips every branch on a value (``every_value_flipped``), none of the others.
EVERY_VALUE = -1


def every_value_flipped(ordinals: frozenset[int] | None = None) -> BranchDecision:
    """The `special` of a capture with every branch on a value taken the other way (``x.sum() > 0`` as False), or
    those of `ordinals` (the general capture's decisions' ordinals)."""
    return BranchDecision(sympy.true, True, "<branches on values>", EVERY_VALUE, on_value=True, flipped=ordinals)


@dataclasses.dataclass
class StrategyAttempt:
    """One capture strategy tried, and why it failed (empty when it succeeded)."""

    strategy: str
    failure: str = ""


def is_data_dependent(error: BaseException) -> bool:
    """True for torch.export's refusal to branch on a value-dependent size (possibly wrapped)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, GuardOnDataDependentSymNode) or "data-dependent" in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


@typing.overload
def _asking_line() -> str: ...
@typing.overload
def _asking_line(*, traced_only: bool) -> str | None: ...
def _asking_line(*, traced_only: bool = False) -> str | None:
    """The innermost frame outside torch: the model's (or its library's) line whose guard is decided.

    `traced_only`: None when that frame is the one that called fx2onnx's export (a guard torch.export adds after
    tracing, which no line of the model asked)."""
    stack = traceback.extract_stack()
    for position in range(len(stack) - 1, -1, -1):
        frame = stack[position]
        filename = frame.filename.replace("\\", "/")
        if "/torch/" in filename or "/fx2onnx/" in filename or filename.endswith("contextlib.py"):
            continue
        inner = stack[position + 1].filename.replace("\\", "/") if position + 1 < len(stack) else ""
        if traced_only and inner.endswith(("/fx2onnx/_export.py", "/fx2onnx/__init__.py")):
            return None
        return f"{frame.filename}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
    return None if traced_only else "<unknown>"


# The line recorded for a guard that an op's fake kernel deferred while tracing an op fx2onnx lowers whole, sizes
# computed at run time (tensor_split at the example's count: ``1 < Mod(s0, 3)`` from its section sizes): no
# assumption of the exported graph, which the ONNX model does not check.
LOWERED_WHOLE = "<an op's fake kernel; fx2onnx's lowering computes its sizes at run time>"
_guards_of_ops_lowered_whole: list[bool] = []


def assertion_key(expression: str) -> str:
    """An assertion's expression without spaces, parentheses and symbol numbers: the graph's ``_assert_scalar``
    message prints it with other parentheses than sympy's ``str`` (``1 < (Mod(s0, 3))``), and a retrace (the
    decomposition) numbers the symbols afresh."""
    return re.sub(r"[\s()]", "", re.sub(r"\b([su])\d+\b", r"\1", expression))


def parsed_expression(text: str) -> Any | None:
    """A size expression as torch prints it (``Ne(s0, 1)``, ``1 < 3*s1*s2``) read back by sympy, None where sympy
    cannot read it."""
    try:
        return sympy.sympify(text)
    except (sympy.SympifyError, TypeError, ValueError, SyntaxError):
        return None


@contextlib.contextmanager
def deferred_assertion_lines(lines: dict[str, str]) -> Iterator[None]:
    """While active, each guard deferred to a runtime assertion records the line that asked (its expression -> the
    model's line): the ONNX model checks the assertion (``aten._assert_scalar``) in a node named for both."""
    original: Callable[..., Any] = ShapeEnv.guard_or_defer_runtime_assert

    def record(self: ShapeEnv, orig_expr: Any, msg: str, fx_node: Any = None) -> Any:
        line = LOWERED_WHOLE if _guards_of_ops_lowered_whole else _asking_line(traced_only=True)
        if line is not None:
            lines.setdefault(assertion_key(str(orig_expr)), line)
        return original(self, orig_expr, msg, fx_node)

    ShapeEnv.guard_or_defer_runtime_assert = record  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShapeEnv.guard_or_defer_runtime_assert = original  # type: ignore[method-assign]


@contextlib.contextmanager
def size_oblivious_guards(
    assumptions: list[Assumption],
    decisions: list[BranchDecision] | None = None,
    special: BranchDecision | None = None,
) -> Iterator[None]:
    """While active, a guard on unbacked sizes that torch cannot decide is decided size-obliviously.

    Each general-branch decision is appended to `decisions`; `special` (one of a previous trace's) is taken the other
    way, the special branch, and torch told so (a deferred assertion: ``u0 == 0`` is then known to the trace)."""
    original: Callable[..., Any] = ShapeEnv._evaluate_expr
    position: dict[str, Any] = {"trace": None, "next": 0}

    def next_ordinal() -> int:
        trace = torch._guards.detect_fake_mode()  # counted afresh in each trace (a retry with suggested fixes)
        if position["trace"] is not trace:
            position["trace"], position["next"] = trace, 0
        position["next"] += 1
        return position["next"] - 1

    # A retrace (torch.export's suggested fixes applied) asks its guards again, and the graph captured is the last
    # trace's: what these guards decided in an earlier trace is forgotten (a decision counted twice kept the If out)
    decided_in: dict[int, Any] = {}  # id of an assumption or decision made here -> the trace that made it

    def recorded() -> list[Any]:
        return [*assumptions, *(decisions or [])]

    def evaluate(
        self: ShapeEnv,
        orig_expr: Any,
        hint: Any = None,
        fx_node: Any = None,
        size_oblivious: bool = False,
        fallback_value: bool | None = None,
        *,
        forcing_spec: bool = False,
    ) -> Any:
        try:
            return original(self, orig_expr, hint, fx_node, size_oblivious, fallback_value, forcing_spec=forcing_spec)
        except GuardOnDataDependentSymNode:
            if size_oblivious:
                raise
            trace = torch._guards.detect_fake_mode()
            stale = {key for key, made_in in decided_in.items() if made_in is not trace}
            if stale:
                assumptions[:] = [item for item in assumptions if id(item) not in stale]
                if decisions is not None:
                    decisions[:] = [item for item in decisions if id(item) not in stale]
                for key in stale:
                    del decided_in[key]
            known = {id(item) for item in recorded()}
            try:  # decide's bare `raise` passes torch's error on: it runs while that error is handled here
                return decide(self, orig_expr, hint, fx_node, fallback_value, forcing_spec=forcing_spec)
            finally:
                decided_in.update((id(item), trace) for item in recorded() if id(item) not in known)

    def decide(
        self: ShapeEnv,
        orig_expr: Any,
        hint: Any = None,
        fx_node: Any = None,
        fallback_value: bool | None = None,
        *,
        forcing_spec: bool = False,
    ) -> Any:
        """A guard torch could not decide (asked not size-obliviously): called by `evaluate` while torch's error is
        handled, which a bare `raise` here passes on."""
        if not _is_condition(orig_expr):
            result = _largest_value(self, orig_expr)
            if result is None:
                raise
            assumptions.append(Assumption(str(orig_expr), f"{result} (its largest value)", _asking_line()))
            return result
        try:
            result = original(self, orig_expr, hint, fx_node, True, fallback_value, forcing_spec=forcing_spec)
        except GuardOnDataDependentSymNode:  # undecidable for sizes >= 2 too: a threshold on a count
            result = _at_smallest_sizes(self, orig_expr)
            if result is None:
                result = _validation_passes(self, orig_expr)
                if result is None:
                    if decisions is None or not _on_values(self, orig_expr):
                        raise
                    # a branch on a value (``if x.sum() > 0``): both sides are captured and an If chooses (the
                    # export fails, naming the line, where it cannot join them). torch is told the side taken (a
                    # deferred assertion, which also keeps the value in the graph for the If's condition)
                    line, ordinal = _asking_line(), next_ordinal()
                    listed = special is not None and special.ordinal == EVERY_VALUE
                    every = listed and (special.flipped is None or ordinal in special.flipped)  # type: ignore[union-attr]
                    flip = special is not None and ordinal == special.ordinal
                    taken = not (every or (flip and str(orig_expr) == str(special.condition)))  # type: ignore[union-attr]
                    self.guard_or_defer_runtime_assert(
                        orig_expr if taken else sympy.Not(orig_expr), f"fx2onnx: a side of {orig_expr}"
                    )
                    if taken or listed:  # the capture of every value flipped lists them, to compare
                        decisions.append(BranchDecision(orig_expr, taken, line, ordinal, on_value=True))
                    assumptions.append(Assumption(str(orig_expr), str(taken), line, f"a value: {BOTH_BRANCHES}"))
                    return sympy.true if taken else sympy.false
                assumptions.append(Assumption(str(orig_expr), f"{result} (the input is valid)", _asking_line()))
                return result
            assumptions.append(Assumption(str(orig_expr), f"{result} (for the smallest sizes)", _asking_line()))
            return result
        line = _asking_line()
        ordinal = next_ordinal()
        if special is not None and ordinal == special.ordinal and str(orig_expr) == str(special.condition):
            taken = not bool(result)
            self.guard_or_defer_runtime_assert(
                orig_expr if taken else sympy.Not(orig_expr), f"fx2onnx: the special branch of {orig_expr}"
            )
            assumptions.append(Assumption(str(orig_expr), str(taken), line, f"the special branch: {BOTH_BRANCHES}"))
            return sympy.true if taken else sympy.false
        if decisions is not None:
            decisions.append(BranchDecision(orig_expr, bool(result), line, ordinal))
        assumptions.append(Assumption(str(orig_expr), str(result), line, f"not checked at run time: {GENERAL_BRANCH}"))
        return result

    ShapeEnv._evaluate_expr = evaluate  # type: ignore[method-assign]
    # fake tensors at symbolic sizes run torch's Python decomposition of unbind (its table's, before the op's Meta)
    unbind_decomposition = decomposition_table.get(_UNBIND)
    if unbind_decomposition is not None:
        decomposition_table[_UNBIND] = _unbind_by_select(unbind_decomposition)
    # chunk is decomposed in C++ (CompositeImplicitAutograd): a Python kernel of that key takes its place while set
    chunk_kernel = _CHUNK.py_kernels.get(DispatchKey.CompositeImplicitAutograd)
    _CHUNK.py_kernels[DispatchKey.CompositeImplicitAutograd] = _chunk_of_a_data_dependent_size(
        chunk_kernel, assumptions
    )
    _CHUNK._dispatch_cache.clear()
    try:
        yield
    finally:
        ShapeEnv._evaluate_expr = original  # type: ignore[method-assign]
        if unbind_decomposition is not None:
            decomposition_table[_UNBIND] = unbind_decomposition
        if chunk_kernel is None:
            del _CHUNK.py_kernels[DispatchKey.CompositeImplicitAutograd]
        else:
            _CHUNK.py_kernels[DispatchKey.CompositeImplicitAutograd] = chunk_kernel
        _CHUNK._dispatch_cache.clear()


def _is_condition(expression: Any) -> bool:
    """A true/false question, not an integer. sympy's plain Symbol is also a ``Boolean`` (it may stand for a
    truth value), but torch's symbols are integers (``u0``; a SymBool is ``Eq(u0, 1)``): a bare ``u0`` asked as an
    int (``range(kept.shape[0])``) is an integer to bound, not a guard to decide size-obliviously (that took
    ``u0`` as 2, unchecked)."""
    return isinstance(expression, sympy.logic.boolalg.Boolean) and not isinstance(expression, sympy.Symbol)


_UNBIND = aten.unbind.int


_CHUNK = aten.chunk.default


def _chunk_of_a_data_dependent_size(
    original: Callable[..., Any] | None, assumptions: list[Assumption]
) -> Callable[..., Any]:
    """torch's chunk at a data-dependent size, as `chunks` parts, the count checked at run time.

    Eager's count is the data's: ``ceil(size / ceil(size / chunks))``, `chunks` for an empty tensor and wherever
    the last part is not empty, fewer otherwise (``chunk(2)`` of one element: one part). torch's decomposition
    asked that count as an int (``Eq((u0+1)//2, 0)``, then the count itself), which no bound decides. Here the
    parts are `chunks` (each ``ceil(size / chunks)`` long, the last the rest) and the ONNX model checks, naming the
    model's line, that eager makes as many: it fails at run time on a size that makes fewer, never returns
    another count of parts."""

    def fallback(self: torch.Tensor, chunks: int, dim: int = 0) -> Any:
        if original is not None:
            return original(self, chunks, dim)
        return _CHUNK._op_dk(DispatchKey.CompositeImplicitAutograd, self, chunks, dim)  # torch's own (C++)

    def chunk(self: torch.Tensor, chunks: int, dim: int = 0) -> Any:
        if self.dim() == 0 or not isinstance(chunks, int) or chunks < 1:
            return fallback(self, chunks, dim)
        axis = dim % self.dim()
        size = self.shape[axis]
        if not free_unbacked_symbols(size) or chunks == 1:  # a backed size: torch guards on its example
            return fallback(self, chunks, dim)
        part = (size + chunks - 1) // chunks
        # the last part is not empty, written as torch's graph prints it (the check's line is found by its text)
        as_many = sym_or(size == 0, (chunks - 1) * part + 1 <= size)
        torch._check(as_many, lambda: f"chunk({chunks}): fewer parts")
        decided = f"True (chunk({chunks}) makes {chunks} parts)"
        assumption = Assumption(str(as_many.node.expr), decided, _asking_line())
        if assumption not in assumptions:
            assumptions.append(assumption)
        return torch.split_with_sizes(self, [part] * (chunks - 1) + [size - (chunks - 1) * part], axis)

    return chunk


def _unbind_by_select(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch's unbind at a data-dependent size, with eager's ranks: each part one index of the dim.

    torch's own (``_refs.unbind``) splits into size-1 parts and squeezes them, and ``squeeze`` keeps a dim it
    cannot prove is 1 (``(u0//3)`` once the count is taken as its bound 3): its parts were 1-D where eager's are
    0-d, and the ONNX model (SequenceAt of a SplitToSequence without keepdims: 0-d) failed the checker or declared
    outputs of the wrong rank. ``select`` needs no guard: the count (asked by ``range``) is taken as its largest
    value and asserted at run time, as any count Python needs."""

    def unbind(self: torch.Tensor, dim: int = 0) -> Any:
        if self.dim() == 0:
            return original(self, dim)
        axis = dim % self.dim()
        size = self.shape[axis]
        if not free_unbacked_symbols(size):  # a backed size: torch guards on its example
            return original(self, dim)
        if size == 0:  # decided size-obliviously (False) as torch's own unbind asks it
            return ()
        return tuple(self.select(axis, index) for index in range(size))

    return unbind


# A size-oblivious decision (``numel() == 0`` taken as False) is not asserted: the model's general branch is the one
# that an empty or one-row input also computes right (the detection models' batched NMS on no boxes), and asserting
# it would refuse those inputs.
GENERAL_BRANCH = (
    "the general branch of a size-oblivious decision, eager's result for 0 and 1 too where the model's special "
    "branch only saves work"
)
# Where the special branch was captured too (a second capture, the decision taken the other way), the ONNX model
# computes the condition at run time and an ``If`` runs the branch eager would.
BOTH_BRANCHES = "both branches captured, the ONNX model's If chooses at run time"
# ... and where the special branch returns the empty outputs the general branch computes for those sizes, no If
SAME_EMPTY_RESULTS = (
    "both branches captured: the special branch returns the same empty outputs as the general one, computed for all"
)


def _on_values(shape_env: ShapeEnv, condition: Any) -> bool:
    """A condition on values read from tensors (``item()``), not on sizes: ``Eq(u0, 1)`` for ``bool(x.sum() > 0)``."""
    return (
        isinstance(condition, sympy.logic.boolalg.Boolean)
        and bool(condition.free_symbols)
        and not any(symbol in shape_env.size_like for symbol in condition.free_symbols)
    )


def _largest_value(shape_env: ShapeEnv, expression: Any) -> Any:
    """A data-dependent integer that Python needs as an int (``len(boxes)``), when bounded above: its bound.

    The bounded counts of detection code are "keep at most K" (``min(K, number kept by NMS)``): at their bound
    for any input with enough candidates. The choice is asserted at run time in the graph and reported.
    """
    bounds = shape_env.bound_sympy(expression, size_oblivious=True)
    upper = bounds.upper
    if not isinstance(upper, sympy.Integer) or upper == bounds.lower:
        return None
    shape_env.guard_or_defer_runtime_assert(
        sympy.Eq(expression, upper), f"fx2onnx: {expression} taken as its largest value {upper}"
    )
    return upper


def _at_smallest_sizes(shape_env: ShapeEnv, condition: Any) -> Any:
    """A condition on data-dependent counts that no size-oblivious reasoning decides (``numel() > 4000``):
    its value for each count at its smallest size-oblivious value (2, or the count's lower bound).

    Such thresholds choose between two implementations of one result (torchvision's batched NMS: a loop
    over classes above 4000 boxes, one NMS below); the one for small counts is the vectorized one. The choice is
    asserted at run time in the graph and reported.
    """
    smallest = {}
    for symbol in condition.free_symbols:
        if symbol not in shape_env.size_like:  # a value (``x.sum().item() > 0``), not a count: no smallest
            return None
        lower = shape_env.bound_sympy(symbol, size_oblivious=True).lower
        smallest[symbol] = max(sympy.Integer(2), lower) if isinstance(lower, sympy.Integer) else sympy.Integer(2)
    decided = condition.xreplace(smallest)
    if decided not in (sympy.true, sympy.false):
        return None
    shape_env.guard_or_defer_runtime_assert(
        condition if decided is sympy.true else sympy.Not(condition),
        f"fx2onnx: {condition} taken as {decided} (for the smallest sizes)",
    )
    return decided


def _validation_passes(shape_env: ShapeEnv, condition: Any) -> Any:
    """A condition on values that only guards a ``raise`` (``if torch.any(var < 0): raise ValueError(...)``,
    gaussian_nll_loss's check of its input): decided so that it does not raise, as torch.export does for a Python
    ``assert``. Eager raises on such an input; the exported model computes on it. Asserted in the FX graph and
    reported. None unless the asking statement is an ``if`` whose test is the condition and whose body only raises.
    """
    truth_raises = _raising_if_polarity()
    if truth_raises is None:
        return None
    decided = sympy.false if truth_raises else sympy.true
    shape_env.guard_or_defer_runtime_assert(
        sympy.Not(condition) if truth_raises else condition, f"fx2onnx: {condition} taken as {decided} (input valid)"
    )
    return decided


_TRACING_INTERNALS = ("/torch/fx/", "/torch/_", "/torch/utils/", "/torch/export/", "/fx2onnx/", "/sympy/")


def _raising_if_polarity() -> bool | None:
    """For the Python frame whose ``bool()`` of a symbolic value is being decided: True when the statement asking is
    ``if <test>: raise ...`` (raises when the value is true), False for ``if not <test>: raise ...``, else None."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename.replace("\\", "/")
        if not (any(part in filename for part in _TRACING_INTERNALS) or filename.endswith("contextlib.py")):
            break
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(frame.f_code)))
        first_line = frame.f_code.co_firstlineno
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = node.test
        start, end = test.lineno + first_line - 1, (test.end_lineno or test.lineno) + first_line - 1
        if not start <= line <= end or not all(isinstance(statement, ast.Raise) for statement in node.body):
            continue
        negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        inner = test.operand if negated else test
        # the value decided must be the test itself, not a part of it (`a and b`, `x if c else y`, `not` twice)
        if any(isinstance(part, (ast.BoolOp, ast.IfExp, ast.UnaryOp, ast.Lambda)) for part in ast.walk(inner)):
            return None
        return not negated
    return None


# torch's decomposition of tensor_split at a 0-d tensor names itself in the data-dependent error it raises
TENSOR_SPLIT_AT_TENSOR = "tensor_split_tensor_indices_or_sections"
_TENSOR_SPLIT = aten.tensor_split.tensor_indices_or_sections

STRATEGIES = ("torch.export", "size-oblivious guards", "the example's section counts")


class _SectionCounts(TorchFunctionMode):
    """Records, in call order, the count of each ``tensor_split`` given a 0-d tensor of sections (an eager run)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: list[tuple[int, str]] = []  # (count, the asking line)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.tensor_split, torch.Tensor.tensor_split):
            names = ("indices_or_sections", "tensor_indices_or_sections", "sections")
            given = args[1] if len(args) > 1 else next((kwargs[n] for n in names if n in kwargs), None)
            if isinstance(given, torch.Tensor) and given.dim() == 0:
                self.counts.append((int(given.item()), _asking_line()))
        return func(*args, **kwargs)


def example_section_counts(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[int, str]]:
    """Run `model` eagerly on the example inputs and return each 0-d-tensor ``tensor_split``'s count, in call order.

    Under ``torch.no_grad()``, on copies of the inputs (a model may write into them: a KV cache); the buffers (a
    training-mode batch norm's running statistics) are restored after, so that the exported weights are the model's
    as given.
    """
    with contextlib.suppress(Exception):  # inputs that cannot be copied (a sparse tensor) are read as given
        args, kwargs = copy.deepcopy((args, kwargs))
    buffers = [(buffer, buffer.detach().clone()) for buffer in getattr(model, "buffers", lambda: [])()]
    recorder = _SectionCounts()
    try:
        with torch.no_grad(), recorder:
            model(*args, **kwargs)
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
    return recorder.counts


@contextlib.contextmanager
def sections_from_example(
    counts: Sequence[tuple[int, str]],
    assumptions: list[Assumption],
    decisions: list[BranchDecision] | None = None,
    special: BranchDecision | None = None,
) -> Iterator[None]:
    """While active, the i-th ``tensor_split`` at a 0-d tensor traced gets the i-th count of `counts` as its
    number of outputs (counted afresh in each trace: a fake mode of its own). torch's own decomposition keeps the
    other calls (a 1-D tensor of split points)."""
    original = _TENSOR_SPLIT.py_kernels[DispatchKey.CompositeImplicitAutograd]
    position: dict[str, Any] = {"trace": None, "next": 0}

    def tensor_split_at_example_count(self: torch.Tensor, sections: torch.Tensor, dim: int = 0) -> Any:
        if sections.dim() != 0:
            return original(self, sections, dim)
        trace = torch._guards.detect_fake_mode()  # held, not its id: a later trace's mode cannot reuse it
        if position["trace"] is not trace:
            position["trace"], position["next"] = trace, 0
        index = position["next"]
        if index >= len(counts):  # a call the eager run did not make through the public API: as before
            return original(self, sections, dim)
        position["next"] += 1
        count, line = counts[index]
        assumption = Assumption(
            "tensor_split's number of sections (a 0-d tensor)",
            f"{count}, the example's (the ONNX model fails at run time when given another count)",
            line,
        )
        if assumption not in assumptions:
            assumptions.append(assumption)
        _guards_of_ops_lowered_whole.append(True)
        try:
            return aten.tensor_split.sections(self, count, dim)
        finally:
            _guards_of_ops_lowered_whole.pop()

    _TENSOR_SPLIT.py_kernels[DispatchKey.CompositeImplicitAutograd] = tensor_split_at_example_count
    _TENSOR_SPLIT._dispatch_cache.clear()
    try:
        with size_oblivious_guards(assumptions, decisions, special):
            yield
    finally:
        _TENSOR_SPLIT.py_kernels[DispatchKey.CompositeImplicitAutograd] = original
        _TENSOR_SPLIT._dispatch_cache.clear()


# torchvision's detection modules whose post-processing calls ``batched_nms``, which begins with
# ``if boxes.numel() == 0`` on the data-dependent count of candidates: plain torch.export always stops there, after
# tracing the whole network (half of such a model's capture time), so their capture starts with size-oblivious
# guards. Where nothing is data-dependent, that strategy decides no guard and captures what torch.export would.
_KNOWN_DATA_DEPENDENT = {
    "torchvision.models.detection.rpn": {"RegionProposalNetwork"},
    "torchvision.models.detection.roi_heads": {"RoIHeads"},
    "torchvision.models.detection.retinanet": {"RetinaNet"},
    "torchvision.models.detection.fcos": {"FCOS"},
    "torchvision.models.detection.ssd": {"SSD"},
}


def known_data_dependent(model: Any) -> str | None:
    """The qualified name of a module in `model` known to branch on a data-dependent size, or None."""
    if "torchvision" not in sys.modules or not hasattr(model, "modules"):
        return None
    for module in model.modules():
        cls = type(module)
        for base in cls.__mro__:  # subclasses too (torchvision's own builders subclass some of them)
            if base.__name__ in _KNOWN_DATA_DEPENDENT.get(base.__module__, ()):
                return f"{base.__module__}.{base.__name__}"
    return None


def first_that_captures(
    export: Callable[[], Any],
    attempts: list[StrategyAttempt],
    assumptions: list[Assumption],
    *,
    section_counts: Callable[[], Sequence[tuple[int, str]]] | None = None,
    skip_torch_export: str | None = None,
    decisions: list[BranchDecision] | None = None,
    special: BranchDecision | None = None,
) -> Any:
    """``export()`` under each strategy in turn until one captures; the first error when none does.

    Only a data-dependent failure moves on to the next strategy: any other error is the model's or the
    user's, and later strategies would hit it too. The third strategy is tried only after a failure in
    ``tensor_split`` at a 0-d tensor, and only when `section_counts` (an eager run) is given and finds such calls.
    `attempts` and `assumptions` are filled in for the report.
    `skip_torch_export` (the module known to stop plain torch.export) starts with size-oblivious guards.
    `decisions` receives the general-branch decisions of the strategy that captured; `special` (one of them, from a
    previous capture) is taken the other way (:func:`size_oblivious_guards`).
    """
    counts: list[Sequence[tuple[int, str]]] = []
    failed_in_tensor_split = False

    def from_example() -> contextlib.AbstractContextManager[None]:
        return sections_from_example(counts[0], assumptions, decisions, special)

    modes: list[Callable[[], contextlib.AbstractContextManager[None]]] = [
        contextlib.nullcontext,
        lambda: size_oblivious_guards(assumptions, decisions, special),
        from_example,
    ]
    strategies: Sequence[str] = STRATEGIES
    if skip_torch_export is not None:
        attempts.append(
            StrategyAttempt(STRATEGIES[0], f"not tried: {skip_torch_export} branches on a data-dependent size")
        )
        strategies, modes = strategies[1:], modes[1:]
    first_error: BaseException | None = None
    for name, mode in zip(strategies, modes):
        if mode is from_example:
            if section_counts is None or not failed_in_tensor_split:
                break
            try:
                counts.append(section_counts())
            except Exception as error:  # the model fails eagerly too: the first error stands, with this one noted
                attempts.append(StrategyAttempt(name, f"the eager run failed: {type(error).__name__}: {error}"))
                break
            if not counts[0]:
                break
        attempts.append(StrategyAttempt(name))
        assumptions.clear()
        if decisions is not None:
            decisions.clear()
        try:
            with mode():
                return export()
        except Exception as error:
            attempts[-1].failure = f"{type(error).__name__}: {_first_line(error)}"
            failed_in_tensor_split |= TENSOR_SPLIT_AT_TENSOR in str(error)
            if first_error is None:
                first_error = error
            if not is_data_dependent(error):
                break
    assert first_error is not None
    first_error.add_note(
        "fx2onnx tried these capture strategies:\n"
        + "\n".join(f"  {attempt.strategy}: {attempt.failure}" for attempt in attempts)
    )
    raise first_error


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def warn_if_assumed(
    attempts: list[StrategyAttempt], assumptions: list[Assumption], stand_ins: Sequence[str] = ()
) -> None:
    """Say which strategy captured when it was not the first, what it assumed, and which library functions were
    traced as fx2onnx's stand-ins (``_library_stand_ins.py``): never silently."""
    message = assumed_message(attempts, assumptions, stand_ins)
    if message is not None:
        warnings.warn(message, stacklevel=4)


def assumed_message(
    attempts: list[StrategyAttempt], assumptions: Sequence[Assumption | str], stand_ins: Sequence[str] = ()
) -> str | None:
    """:func:`warn_if_assumed`'s warning, or None when there is nothing to say."""
    if len(attempts) <= 1 and not stand_ins:
        return None
    lines = [
        f"{attempt.strategy}: {attempt.failure}"
        if attempt.failure.startswith("not tried")
        else f"{attempt.strategy} failed: {attempt.failure}"
        for attempt in attempts[:-1]
    ]
    lines.append(f"captured with {attempts[-1].strategy}")
    lines += [f"assumed: {assumption}" for assumption in assumptions]
    lines += [f"traced as fx2onnx's vectorized stand-in: {name}" for name in stand_ins]
    return "data-dependent code in the model:\n  " + "\n  ".join(lines)
