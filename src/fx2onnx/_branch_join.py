"""The special branch of a decision the capture took for the general one, captured too and joined in an ONNX If.

Two kinds of decision (README, "Data-dependent shapes"):

- a size-oblivious decision on a data-dependent size or value (``if kept.numel() == 0`` taken as False, ``if
  x.sum() > 0``): the model is captured again with the decision taken the other way (:func:`join_special_branch`);
- the model's ``if batch == 1`` whose general branch differs from eager at size 1 (compared at capture:
  ``_capture_size_one.general_branch_at_size_one``): the model is captured again at size 1, that dim static
  (:func:`size_one_special_branch`, then :func:`join_size_one_branch` once the run-time checks are in).

Each special capture goes through the FX passes and emission (:func:`emit_special_branch`); ``_emit/branches.py``
joins the two emitted graphs. Several branches on values join in one If per branch around the region its answer
changes (``_branch_regions.py``). Where they cannot be joined the general graph stands alone, with a warning saying
why; for a branch on a value, whose sides no single graph serves, the export fails naming the line. The capture's
own warning (what it assumed) is held back until the join is decided (:func:`issue_capture_warning`).

``_export.py`` calls these between emission and finalize; this module imports no later stage.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sympy
import torch

from fx2onnx import _capture as capture_stage
from fx2onnx import _capture_strategies as capture_strategies
from fx2onnx import _passes as passes
from fx2onnx._branch_regions import EmittedBranch, join_value_questions
from fx2onnx._dispatch import Dispatcher
from fx2onnx._emit import branches, control_flow
from fx2onnx._emit.graph_builder import GraphEmitter, symbol_names_for
from fx2onnx._records import CHECK_PREFIX
from fx2onnx._registry import Registry
from fx2onnx.errors import CaptureError, SourceFrame

# A special branch's capture, FX passes and emission: (args, kwargs, dynamic_shapes, decision) -> (its capture, its
# emission); `emit_special_branch` with the export's other arguments bound.
EmitSpecial = Callable[
    [tuple[Any, ...], dict[str, Any], Any, "capture_strategies.BranchDecision | None"],
    tuple[capture_stage.CapturedGraph, Any],
]


# Size-oblivious decisions whose special branch returns what the general branch computes too, on the sizes it is
# taken for: torchvision's batched NMS returns an empty index tensor for no boxes, which NMS itself returns. A second
# capture of a detection model (half its export time) would only add an If whose branches agree.
SPECIAL_BRANCH_SAVES_WORK = ("in _batched_nms_coordinate_trick: if boxes.numel() == 0",)

SPECIAL_BRANCH_FAILS = (
    "the special branch fails at run time: its graph would not load in ONNX Runtime (an op meets a size it refuses, "
    "where eager raises too, as a rule)"
)


def emit_special_branch(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic_shapes: Any,
    decision: capture_strategies.BranchDecision | None,
    *,
    extractor: capture_stage.Extractor,
    model: Any,
    decompositions: Any,
    registry: Registry,
    opset_version: int,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    user_dims: Mapping[Any, str],
    flat_inputs: list[Any],
) -> tuple[capture_stage.CapturedGraph, EmittedBranch]:
    """The model captured with `decision` taken the other way (its special branch), through FX passes and emission;
    without `decision`, captured as it is on `args` (a backed dim's special size, static in `dynamic_shapes`)."""
    if decision is None:  # the size-1 capture: not compared at size 1 again, its warning the general capture's
        special = extractor.capture(model, args, kwargs, dynamic_shapes, decompositions, size_one_branch=True)
    else:
        special = extractor.capture(model, args, kwargs, dynamic_shapes, decompositions, special_branch=decision)
    passes.run_fx_passes(special, registry)
    emitter = GraphEmitter(
        special,
        Dispatcher(registry, opset_version),
        input_names=input_names,
        output_names=output_names,
        dim_names=symbol_names_for(special, user_dims, flat_inputs),
        higher_order=control_flow.EMITTERS,
        fold_weights=False,  # the general graph's weights are the ones kept: no weight view of the special's own
    )
    emitted = emitter.run()
    if decision is not None and decision.on_value:
        asked = [symbol for decision in special.branch_decisions for symbol in decision.condition.free_symbols]
        branches.drop_checks_of_a_side(
            emitted.model, branches.value_symbols(special) + asked + [*decision.condition.free_symbols]
        )
    return special, EmittedBranch(emitted.model, emitter.env)


def needs_size_one_branch(captured: capture_stage.CapturedGraph) -> bool:
    """Whether the model's ``if batch == 1`` has a general branch that differs from eager at size 1 (and no other
    decision is joined): :func:`size_one_special_branch` then captures size 1 too."""
    return not captured.branch_decisions and any(not v.same for v in captured.size_one_verdicts.values())


def size_one_comparison_seconds(captured: capture_stage.CapturedGraph) -> float | None:
    """The time of the eager and graph runs at size 1 of the model's ``if batch == 1`` (one per dim), for the
    report's ``capture_seconds``; None where the model asks no such thing."""
    if not captured.size_one_verdicts:
        return None
    compared = {id(verdict): verdict.seconds for verdict in captured.size_one_verdicts.values()}
    return sum(compared.values())


def size_one_special_branch(
    model_ir: Any, captured: capture_stage.CapturedGraph, emitter: GraphEmitter, emit_special: EmitSpecial
) -> tuple[Any, Any, Any] | None:
    """Where the general branch of the model's ``if batch == 1`` differs from eager at size 1 (compared at capture:
    ``general_branch_at_size_one``), the model captured at size 1 too, that dim static (each dim of a sum or
    product compared with 1 at its size there: ``new == 1 and past == 0``): (its emitted model, the If's condition
    ``Eq(batch, 1)``, where the graph has those sizes) for ``branches.join``, the verdict marked joined (not checked
    at run time then). None, with a warning saying why, where it cannot be done: size 1 is then refused at run time
    (``runtime_checks``). One decision only: with more, each is refused at size 1."""
    verdicts = {id(verdict): verdict for verdict in captured.size_one_verdicts.values() if not verdict.same}
    if len(verdicts) != 1:
        return None
    (verdict,) = verdicts.values()
    sizes: dict[Any, int] = {}
    for node in captured.user_inputs:
        val = node.meta.get("val")
        for dim, size in enumerate(val.shape if isinstance(val, torch.Tensor) else ()):
            if (node.name, dim) in verdict.at and isinstance(size, torch.SymInt):
                sizes.setdefault(size.node.expr, verdict.at[(node.name, dim)])
    refused = "size 1 is refused at run time"
    if verdict.example is None or not sizes:
        warnings.warn(
            f"the general branch of the model's Ne({verdict.dim}, 1) differs from eager at size 1 or could not be "
            "compared there, and its size-1 branch cannot be captured (the dim is derived from another, or asked "
            "without a name: Dim.DYNAMIC/AUTO, give it a Dim of its own to capture size 1 too; or several sets of "
            f"its dims' sizes make it 1 and differ there): {refused}",
            stacklevel=4,
        )
        return None
    symbols = sorted(sizes, key=str)
    sources = branches.size_sources(captured, emitter.env, symbols)
    missing = [symbol for symbol in symbols if symbol not in sources]
    why = f"no value of the graph has the size {', '.join(map(str, missing))}" if missing else None
    if why is None:
        try:
            special, emitted = emit_special(*verdict.example, verdict.static_shapes, None)
        except Exception as error:
            why = f"its capture at size 1 failed: {type(error).__name__}: {str(error).splitlines()[0]}"
        else:
            why = branches.disagreement(model_ir, emitted.model, len(model_ir.graph.outputs))
            if why is None and special.out_spec != captured.out_spec:
                why = "the special branch returns another structure of outputs"
    if why is not None:
        warnings.warn(
            f"the general branch of a size-oblivious decision on {verdict.dim} differs from eager at size 1, and "
            f"the special branch cannot be joined in an If ({why}): {refused}",
            stacklevel=4,
        )
        return None
    verdict.joined = True
    # unevaluated: torch's size symbols may be positive, and Eq(past, 0) would then read as False
    condition = sympy.And(*(sympy.Eq(symbol, sizes[symbol], evaluate=False) for symbol in symbols))
    return emitted.model, condition, sources


def join_size_one_branch(model_ir: Any, size_one_branch: tuple[Any, Any, Any], outputs: int) -> None:
    """Join :func:`size_one_special_branch`'s capture into `model_ir` in an If on ``batch == 1``, over its first
    `outputs` outputs (those of the model, not of the run-time checks)."""
    special_model, condition, sources = size_one_branch
    branches.join(model_ir, special_model, outputs, condition, sources)


def join_special_branch(
    model_ir: Any,
    captured: capture_stage.CapturedGraph,
    emitter: GraphEmitter,
    outputs: int,
    inputs: str,
    emit_special: Callable[[capture_strategies.BranchDecision], tuple[capture_stage.CapturedGraph, Any]],
) -> None:
    """Where the capture took a size-oblivious decision for the general branch (``numel() == 0`` taken as False),
    capture the special branch too and let an ONNX If choose between them at run time (``_emit/branches.py``).
    Falls back to the general branch alone, with a warning saying why, where that cannot be done. A joined
    decision's assumption in ``captured.assumptions`` says so (a new list: the report's is to be set from it)."""
    try:
        _join_if_worth_it(model_ir, captured, emitter, outputs, inputs, emit_special)
    finally:
        issue_capture_warning(captured)


def drop_checks_of_value_sides(model_ir: Any, captured: capture_stage.CapturedGraph) -> None:
    """For a branch on a value (``if x.sum() > 0``), the assertions of the side torch took are not checked at run
    time (the If chooses the side), and the decision is renamed to the symbol the final graph reads."""
    if not any(decision.on_value for decision in captured.branch_decisions):
        return
    _value_decision_in_graph_symbols(captured)
    asked = [symbol for decision in captured.branch_decisions for symbol in decision.condition.free_symbols]
    branches.drop_checks_of_a_side(model_ir, branches.value_symbols(captured) + asked)


def _value_decision_in_graph_symbols(captured: capture_stage.CapturedGraph) -> None:
    """A branch on a value decided at trace time on ``Eq(u0, 1)`` reads, in the final graph, the bool of an
    ``item()`` whose symbol may be numbered otherwise (u1): each decision is renamed to the item() asked in its
    place (the graph's in order, as the trace asked them). Left as is (and the If then fails, naming the line)
    unless the graph has as many such values as the decisions, each of one symbol."""
    symbols = branches.value_symbols(captured)
    on_value = [decision for decision in captured.branch_decisions if decision.on_value]
    if len(symbols) != len(on_value) or any(len(decision.condition.free_symbols) != 1 for decision in on_value):
        return
    for decision, symbol in zip(on_value, symbols):
        (old,) = decision.condition.free_symbols
        decision.in_graph = decision.condition.xreplace({old: symbol})


def _no_branch_on_a_value(decision: capture_strategies.BranchDecision, why: str, inputs: str) -> CaptureError:
    """A branch on a value whose two sides cannot be joined: no side is right for every input, so no model."""
    found = re.match(r"(.*):(\d+) in (\S+): (.*)$", decision.source_line)
    frame = SourceFrame(found[1], int(found[2]), found[3], found[4]) if found else None
    return CaptureError(
        f"the model branches on a value read from a tensor at {decision.source_line} ({decision.condition}), and "
        f"fx2onnx could not capture both sides into an ONNX If: {why}\n"
        f"  inputs: {inputs}\n"
        "  remedy: make the branch a graph op: torch.where(...) for an elementwise choice, torch.cond(pred, true_fn, "
        "false_fn, operands) for a branch (exported as an ONNX If), or state the side with torch._check(...)",
        frame=frame,
    )


def issue_capture_warning(captured: capture_stage.CapturedGraph) -> None:
    """The capture's warning (what it assumed), held back until the export knew whether it joined both branches of
    a size-oblivious decision; issued once."""
    if captured.pending_warning is None:
        return
    attempts, stand_ins = captured.pending_warning
    captured.pending_warning = None
    message = capture_strategies.assumed_message(attempts, captured.assumptions, stand_ins)
    if message is not None:
        warnings.warn(message, stacklevel=5)


def _join_if_worth_it(
    model_ir: Any,
    captured: capture_stage.CapturedGraph,
    emitter: GraphEmitter,
    outputs: int,
    inputs: str,
    emit_special: Callable[[capture_strategies.BranchDecision], tuple[capture_stage.CapturedGraph, Any]],
) -> None:
    decisions = [
        decision
        for decision in captured.branch_decisions
        if not any(known in decision.source_line for known in SPECIAL_BRANCH_SAVES_WORK)
    ]
    if not decisions:
        return
    general_only = f"the ONNX model computes the general branch only ({capture_strategies.GENERAL_BRANCH})"
    if len(decisions) > 1 and any(decision.on_value for decision in decisions):
        many = f"{len(decisions)} data-dependent branches in the model: " + "; ".join(
            decision.text() for decision in decisions
        )
        if not all(decision.on_value for decision in decisions):
            why = " (fx2onnx joins several where all are on values, the sides of one on a size otherwise)"
            raise _no_branch_on_a_value(next(d for d in decisions if d.on_value), many + why, inputs)
        failed = join_value_questions(model_ir, captured, emitter, decisions, emit_special)
        if failed is not None:
            raise _no_branch_on_a_value(failed[0], f"{many}\n  {failed[1]}", inputs)
        return
    if len(decisions) > 1:
        warnings.warn(
            f"{len(decisions)} size-oblivious decisions of the model's code (fx2onnx joins the branches of one): "
            + "; ".join(decision.text() for decision in decisions)
            + f"\n  {general_only}",
            stacklevel=5,
        )
        return
    (decision,) = decisions
    condition = decision.in_graph if decision.in_graph is not None else decision.condition
    symbols = sorted(condition.free_symbols, key=str)
    # where the If runs the special capture: the condition, or its negation for a decision taken as True (u0 > 1)
    special_side = sympy.Not(condition) if decision.general else condition
    sources = branches.size_sources(captured, emitter.env, symbols)
    why = None
    joined = capture_strategies.BOTH_BRANCHES
    if len(sources) != len(symbols):
        missing = ", ".join(str(symbol) for symbol in symbols if symbol not in sources)
        why = f"no value of the graph has the size {missing}"
    else:
        try:
            special, emitted = emit_special(decision)
        except Exception as error:  # the general graph stands, as before this existed
            why = f"the special branch could not be exported: {type(error).__name__}: {str(error).splitlines()[0]}"
        else:
            values = [inner for inner in special.branch_decisions if inner.on_value]
            if values:  # a side taken there without an If: no model rather than a silent choice
                raise _no_branch_on_a_value(
                    values[0],
                    f"the special branch of {decision.text()} branches on a value too: "
                    + "; ".join(inner.text() for inner in values),
                    inputs,
                )
            why = branches.disagreement(model_ir, emitted.model, outputs)
            if why is None and special.out_spec != captured.out_spec:
                why = "the special branch returns another structure of outputs"
            # a special graph ONNX Runtime would refuse to load (median over the dim a size of 0 emptied, where
            # eager raises too): the If fails at run time on that side, naming the line, the general side computes
            refused = branches.inference_error(emitted.model) if why is None else None
            fails = None
            if refused is not None:
                joined = f"{SPECIAL_BRANCH_FAILS} ({refused})"
                fails = f"{CHECK_PREFIX}: {decision.condition} not {decision.general} at {decision.source_line}: "
                fails += SPECIAL_BRANCH_FAILS
                warnings.warn(f"size-oblivious decision {decision.text()}: {joined}", stacklevel=5)
            elif why is None and branches.same_empty_results(captured, special, condition, decision.general):
                joined = capture_strategies.SAME_EMPTY_RESULTS
            if why is None and joined != capture_strategies.SAME_EMPTY_RESULTS:
                try:
                    branches.join(model_ir, emitted.model, outputs, special_side, sources, fails=fails)
                except ValueError as error:
                    why = f"its condition has no ONNX translation here: {error}"
    line = decision.text()
    if why is not None and decision.on_value:
        raise _no_branch_on_a_value(decision, why, inputs)
    if why is not None:
        warnings.warn(f"size-oblivious decision {line}: {why}\n  {general_only}", stacklevel=5)
        return
    captured.assumptions = [
        assumption.replace(f"not checked at run time: {capture_strategies.GENERAL_BRANCH}", joined).replace(
            capture_strategies.BOTH_BRANCHES, joined
        )
        if assumption.startswith(f"{decision.condition} taken as")
        else assumption
        for assumption in captured.assumptions
    ]
