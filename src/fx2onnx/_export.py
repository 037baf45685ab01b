"""``fx2onnx.export``: capture -> FX passes -> dispatch/emit -> finalize -> ONNXProgram.

Each stage is a module of its own; this file only wires them together and times them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import onnx_ir.passes.common as common_passes
import sympy
import torch

from fx2onnx import _capture as capture_stage
from fx2onnx import _capture_strategies as capture_strategies
from fx2onnx import _dtypes as dtypes
from fx2onnx import _finalize as finalize_stage
from fx2onnx import _passes as passes
from fx2onnx import _torch_compat as torch_compat
from fx2onnx import _weights as checkpoint_weights
from fx2onnx import legalize
from fx2onnx._dispatch import ArgumentBinding, Dispatcher
from fx2onnx._emit import branches, control_flow, runtime_checks
from fx2onnx._emit.graph_builder import GraphEmitter, symbol_names_for
from fx2onnx._progress import ExportProgress, StageClock
from fx2onnx._progress import wanted as progress_wanted
from fx2onnx._records import BASE_OPSET
from fx2onnx._registry import Registry, apply_translation_table, global_registry
from fx2onnx.errors import CaptureError, ExportError, SourceFrame, source_line
from fx2onnx.program import ONNXProgram
from fx2onnx.report import ExportReport, casts_inserted_by_passes


def export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple[Any, ...] | Any = (),
    f: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    kwargs: Mapping[str, Any] | None = None,
    dynamic_shapes: Any = None,
    dynamic_axes: torch_compat.DynamicAxes | None = None,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    opset_version: int | str | None = None,
    registry: Registry | None = None,
    custom_translation_table: Mapping[Any, Any] | None = None,
    strict: bool = False,
    extractor: str | capture_stage.Extractor = "torch.export",
    optimize: bool = True,
    external_data: bool | None = None,
    verify: bool = False,
    target: str = "onnxruntime-cpu",
    fast_math: bool = False,
    weights: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    report: bool | str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    artifacts_dir: str | os.PathLike[str] = ".",
    dump_exported_program: bool = False,
    progress: bool | None = None,
    verbose: bool | None = None,
    dynamo: bool = True,
    export_params: bool = True,
    keep_initializers_as_inputs: bool = False,
    **torchscript_options: Any,
) -> ONNXProgram:
    """Export `model` to ONNX through its FX graph.

    Arguments follow ``torch.onnx.export`` (see :mod:`fx2onnx._torch_compat` for ``dynamic_axes`` and the
    TorchScript-only options). `f`, when given, is where the model is saved (only once the whole export
    succeeded). `verify=True` runs the model in ONNX Runtime on `args` and raises
    :class:`fx2onnx.errors.VerificationError` if any output differs from eager. `target` is the runtime
    the model must load and run in (``onnxruntime-cpu`` or ``onnx``); `report` is a path (or a list of
    paths) to write the export report to: Markdown, or SARIF 2.1.0 for a ``.sarif`` path (``True``: a
    Markdown file in `artifacts_dir`, as torch does); it is written on failure too (and then no model is
    saved). `dump_exported_program=True` writes torch.export's program to `artifacts_dir`.
    `opset_version` is 18 unless given; ``"min"`` is the lowest opset (18 or above) that every dtype of the graph
    needs (float8 types: 19), otherwise a dtype the opset cannot hold is an error that names it. `progress=True`
    (or `verbose=True`, as torch reads it) shows the stages and the emitted nodes on stderr, `progress=False`
    (or `verbose=False`) never; by default they show once an export has taken two seconds, when stderr is a
    terminal (:mod:`fx2onnx._progress`).

    `weights` supplies the weights of a model built without them (on the ``meta`` device, or with fake tensors):
    a safetensors file, a folder of safetensors shards (with transformers' ``model.safetensors.index.json``), or
    a mapping from name to tensor, keyed by the model's ``state_dict`` names. The graph is captured from the
    weightless model; the weights are read from the checkpoint only when the model is saved, block by block,
    converted to the dtype of the model's parameters (:mod:`fx2onnx._weights`).
    """
    unknown = set(torchscript_options) - set(torch_compat.IGNORED_OPTIONS)
    if unknown:
        raise TypeError(f"export() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    torch_compat.check_options(
        dynamo=dynamo,
        export_params=export_params,
        keep_initializers_as_inputs=keep_initializers_as_inputs,
        **torchscript_options,
    )
    if not isinstance(args, tuple):
        args = (args,)
    f, kwargs = torch_compat.split_f_and_kwargs(f, kwargs)
    if not isinstance(model, torch.export.ExportedProgram):
        args, kwargs = torch_compat.split_kwargs_from_args(model, args, kwargs)
    if opset_version is None:
        opset_version = BASE_OPSET
    elif opset_version != MIN_OPSET_THAT_WORKS:
        finalize_stage.check_opset(opset_version)
    if report is True:
        os.makedirs(artifacts_dir, exist_ok=True)
        report = os.path.join(artifacts_dir, f"{type(model).__name__}_fx2onnx_report.md")
    elif report is False:
        report = None
    axis_names: dict[tuple[int, int], str] = {}
    if dynamic_axes is not None:
        if dynamic_shapes is not None:
            raise ValueError("give dynamic_shapes or dynamic_axes, not both")
        dynamic_shapes, axis_names = torch_compat.dynamic_shapes_from_axes(
            model, args, kwargs, dynamic_axes, input_names
        )
    export_report = ExportReport(
        model_name=type(model).__name__, opset=opset_version if isinstance(opset_version, int) else 0, target=target
    )
    shown = ExportProgress(progress_wanted(progress, verbose))
    captures: list[capture_stage.CapturedGraph] = []  # its capture's warning is issued even when a later stage fails
    try:
        with capture_stage.EXPORT_LOCK, _collections_skip_older_objects():
            program = _export(
                model,
                args,
                kwargs,
                export_report,
                dynamic_shapes=dynamic_shapes,
                axis_names=axis_names,
                input_names=input_names,
                output_names=output_names,
                opset_version=opset_version,
                registry=registry,
                custom_translation_table=custom_translation_table,
                strict=strict,
                extractor=extractor,
                optimize=optimize,
                verify=verify,
                target=target,
                fast_math=fast_math,
                weights=weights,
                progress=shown,
                captures=captures,
            )
    except Exception as error:
        shown.close()
        for captured in captures:
            _issue_capture_warning(captured)
        export_report.error = f"{type(error).__name__}: {error}"
        export_report.exception = error
        if report is not None:
            export_report.write(report)
        raise
    if dynamic_axes is not None:
        torch_compat.name_output_axes(program.model, dynamic_axes)
    if dump_exported_program and program.exported_program is not None:
        os.makedirs(artifacts_dir, exist_ok=True)
        path = os.path.join(artifacts_dir, f"{type(model).__name__}_exported_program.txt")
        with open(path, "w", encoding="utf-8") as file:
            file.write(str(program.exported_program))
    if f is not None:
        with StageClock(export_report.stage_seconds, shown)("save"):
            program.save(f, external_data=external_data)
    shown.close()  # the export is done: no line after it returns
    if report is not None:
        export_report.write(report)
    return program


def _export(
    model: torch.nn.Module | torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    export_report: ExportReport,
    *,
    dynamic_shapes: Any,
    axis_names: Mapping[tuple[int, int], str],
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    opset_version: int | str,
    registry: Registry | None,
    custom_translation_table: Mapping[Any, Any] | None,
    strict: bool,
    extractor: str | capture_stage.Extractor,
    optimize: bool,
    verify: bool,
    target: str,
    fast_math: bool,
    weights: str | os.PathLike[str] | Mapping[str, Any] | None,
    progress: ExportProgress,
    captures: list[capture_stage.CapturedGraph],
) -> ONNXProgram:
    timer = StageClock(export_report.stage_seconds, progress)
    with timer("registry"):  # the first export in a process builds the default registry
        registry = apply_translation_table(registry or global_registry(), dict(custom_translation_table or {}))
    # capture asks which nodes the registry lowers as they are: dispatch's binding answers for argument presence
    capture_registry = ArgumentBinding(registry)
    if isinstance(extractor, str):
        try:
            extractor = capture_stage.EXTRACTORS[extractor](strict, capture_registry)
        except KeyError:
            raise ValueError(
                f"unknown extractor {extractor!r}; choose from {sorted(capture_stage.EXTRACTORS)}"
            ) from None

    with timer("capture"):
        decompositions = capture_stage.LazyDecompositionTable(capture_registry)
        captured = extractor.capture(model, args, kwargs, dynamic_shapes, decompositions)
    captures.append(captured)
    export_report.strategy = captured.strategy
    export_report.capture_seconds = {
        captured.strategy.split("(")[0]: captured.trace_seconds,
        "decomposition": captured.decomposition_seconds,
    }
    if captured.size_one_verdicts:  # the eager and graph runs at size 1 of the model's `if batch == 1` (one per dim)
        compared = {id(verdict): verdict.seconds for verdict in captured.size_one_verdicts.values()}
        export_report.capture_seconds["size-1 comparison"] = sum(compared.values())
    export_report.decomposed = captured.decomposed
    export_report.decomposition = captured.decomposition
    export_report.capture_assumptions = captured.assumptions
    opset_version = opset_for_dtypes(captured, opset_version)
    export_report.opset = opset_version
    flat_inputs = capture_stage.flatten_inputs(captured.in_spec, args, kwargs)
    bound = _bind_weights(captured, model, weights)  # before the work of emission: a bad checkpoint fails fast

    with timer("fx passes"):
        nodes_before = passes.all_nodes(captured.graph_module)  # and those of control-flow bodies
        export_report.graph_nodes = len(nodes_before)
        export_report.fx_passes = passes.run_fx_passes(captured, registry)
        export_report.promotion_casts = casts_inserted_by_passes(captured.graph, nodes_before)

    with timer("dispatch+emit", f"{len(captured.graph.nodes)} FX nodes"):
        user_dims = {**capture_stage.dim_names(model, args, kwargs, dynamic_shapes), **axis_names}
        dispatcher = Dispatcher(registry, opset_version)
        emitter = GraphEmitter(
            captured,
            dispatcher,
            input_names=input_names,
            output_names=output_names,
            dim_names=symbol_names_for(captured, user_dims, flat_inputs),
            progress=progress,
            higher_order=control_flow.EMITTERS,
            fold_weights=bound is None,  # a checkpoint's weights are attached after emission
        )
        # The report sees decisions and Casts as they happen, so a failed export still explains itself.
        export_report.decisions = dispatcher.decisions
        export_report.casts = emitter.casts
        result = emitter.run()
    export_report.decisions = result.decisions
    export_report.casts = result.casts
    model_ir = result.model
    if any(decision.on_value for decision in captured.branch_decisions):
        _value_decision_in_graph_symbols(captured)
        asked = [symbol for decision in captured.branch_decisions for symbol in decision.condition.free_symbols]
        branches.drop_checks_of_a_side(model_ir, branches.value_symbols(captured) + asked)
    # the model's `if batch == 1` whose general branch differs from eager at 1: the size-1 capture, joined below
    size_one_branch = None
    if not captured.branch_decisions and any(not v.same for v in captured.size_one_verdicts.values()):
        with timer("special branch"):
            size_one_branch = _size_one_special_branch(
                model_ir,
                captured,
                emitter,
                lambda verdict: _emit_special_branch(
                    extractor,
                    model,
                    *verdict.example,
                    verdict.static_shapes,
                    decompositions,
                    registry,
                    opset_version,
                    None,
                    input_names=input_names,
                    output_names=output_names,
                    user_dims=user_dims,
                    flat_inputs=flat_inputs,
                ),
            )
    # what the graph was captured under (torch.export's assertions, the input dims' ranges and relations) is checked
    # at run time: an input breaking it fails in ONNX Runtime naming the assumption
    requested = capture_stage.dynamic_dims(model, args, kwargs, dynamic_shapes)
    checks = runtime_checks.add_runtime_checks(
        model_ir, captured, emitter.symbol_names, runtime_checks.asked_minimums(captured, requested, flat_inputs)
    )
    _warn_about_dynamic_dims(captured, requested, flat_inputs, export_report, checks)
    if size_one_branch is not None:
        with timer("special branch"):
            special_model, condition, sources = size_one_branch
            branches.join(model_ir, special_model, len(model_ir.graph.outputs) - checks.pending, condition, sources)
    if captured.branch_decisions:
        with timer("special branch"):
            _join_special_branch(
                model_ir,
                captured,
                emitter,
                export_report,
                len(model_ir.graph.outputs) - checks.pending,
                capture_stage.describe_inputs(args, kwargs),
                lambda decision: _emit_special_branch(
                    extractor,
                    model,
                    args,
                    kwargs,
                    dynamic_shapes,
                    decompositions,
                    registry,
                    opset_version,
                    decision,
                    input_names=input_names,
                    output_names=output_names,
                    user_dims=user_dims,
                    flat_inputs=flat_inputs,
                ),
            )
    if bound is not None:
        checkpoint_weights.attach(model_ir, bound)

    with timer("finalize"):
        finalize_stage.finalize(model_ir, opset_version, optimize=optimize)
        runtime_checks.feed_an_output(model_ir, checks)

    with timer("legalize"):
        export_report.casts.extend(legalize.legalize_model(model_ir, target, fast_math=fast_math))

    with timer("check"):
        # Shape inference runs on the legal model: before legalization some nodes (bf16 Cos) are invalid ONNX.
        if not finalize_stage.every_value_typed(model_ir):
            common_passes.ShapeInferencePass()(model_ir)
        finalize_stage.check_model(model_ir)
    if bound is not None:
        checkpoint_weights.record_provenance(model_ir)

    if isinstance(model, torch.export.ExportedProgram):
        module = model.module()
    else:
        module = model
    program = ONNXProgram(
        model_ir,
        exported_program=captured.exported_program,
        module=module,
        in_spec=captured.in_spec,
        report=export_report,
        captured=captured,
        weights=weights,
    )
    if verify:
        with timer("verify"):
            export_report.verification = program.verify(*args, **kwargs)
        failed = [str(v) for v in export_report.verification if not v.passed]
        if failed:
            from fx2onnx.errors import VerificationError

            # Find the first FX node whose value differs, so the error names where it starts.
            try:
                localized = program.verify(*args, intermediates=True, **kwargs)
            except Exception as error:  # the outputs' verdict stands without it
                localized, where = None, f"\n  (could not compare intermediate values: {error})"
            first = getattr(localized, "first_mismatch", None)
            if localized is not None:
                where = f"\n  first differing node: {first}" if first is not None else ""
            raise VerificationError("ONNX Runtime differs from eager:\n  " + "\n  ".join(failed) + where)
    return program


# Size-oblivious decisions whose special branch returns what the general branch computes too, on the sizes it is
# taken for: torchvision's batched NMS returns an empty index tensor for no boxes, which NMS itself returns. A second
# capture of a detection model (half its export time) would only add an If whose branches agree.
_SPECIAL_BRANCH_SAVES_WORK = ("in _batched_nms_coordinate_trick: if boxes.numel() == 0",)


def _emit_special_branch(
    extractor: capture_stage.Extractor,
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic_shapes: Any,
    decompositions: Any,
    registry: Registry,
    opset_version: int,
    decision: capture_strategies.BranchDecision | None,
    *,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    user_dims: Mapping[Any, str],
    flat_inputs: list[Any],
) -> tuple[capture_stage.CapturedGraph, Any]:
    """The model captured with `decision` taken the other way (its special branch), through FX passes and emission;
    without `decision`, captured as it is on `args` (a backed dim's special size, static in `dynamic_shapes`)."""
    if decision is None:
        special = extractor.capture(model, args, kwargs, dynamic_shapes, decompositions)
    else:
        special = extractor.capture(model, args, kwargs, dynamic_shapes, decompositions, special_branch=decision)  # type: ignore[call-arg]
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
    return special, emitted


def _size_one_special_branch(
    model_ir: Any, captured: capture_stage.CapturedGraph, emitter: GraphEmitter, emit_special: Any
) -> tuple[Any, Any, Any] | None:
    """Where the general branch of the model's ``if batch == 1`` differs from eager at size 1 (compared at capture:
    ``capture.general_branch_at_size_one``), the model captured at size 1 too, that dim static: (its emitted model,
    the If's condition ``Eq(batch, 1)``, where the graph has that size) for ``branches.join``, the verdict marked
    joined (not checked at run time then). None, with a warning saying why, where it cannot be done: size 1 is then
    refused at run time (``runtime_checks``). One dim only: with more, each is refused at size 1."""
    verdicts = {id(verdict): verdict for verdict in captured.size_one_verdicts.values() if not verdict.same}
    if len(verdicts) != 1:
        return None
    (verdict,) = verdicts.values()
    symbol = None
    for node in captured.user_inputs:
        val = node.meta.get("val")
        for dim, size in enumerate(val.shape if isinstance(val, torch.Tensor) else ()):
            if captured.size_one_verdicts.get((node.name, dim)) is verdict and isinstance(size, torch.SymInt):
                symbol = symbol if symbol is not None else size.node.expr
    refused = "size 1 is refused at run time"
    if verdict.example is None or symbol is None:
        warnings.warn(
            f"the general branch of the model's Ne({verdict.dim}, 1) differs from eager at size 1 or could not be "
            "compared there, and its size-1 branch cannot be captured (the dim is derived from another, or asked "
            f"without a name: Dim.DYNAMIC/AUTO; give it a Dim of its own to capture size 1 too): {refused}",
            stacklevel=4,
        )
        return None
    sources = branches.size_sources(captured, emitter.env, [symbol])
    why = None if symbol in sources else f"no value of the graph has the size {symbol}"
    if why is None:
        try:
            special, emitted = emit_special(verdict)
        except Exception as error:
            why = f"its capture at size 1 failed: {type(error).__name__}: {str(error).splitlines()[0]}"
        else:
            why = branches.disagreement(model_ir, emitted.model, len(model_ir.graph.outputs))
            if why is None and special.out_spec != captured.out_spec:
                why = "the special branch returns another structure of outputs"
    if why is not None:
        warnings.warn(
            f"the general branch of a size-oblivious decision on {symbol} differs from eager at size 1, and the "
            f"special branch cannot be joined in an If ({why}): {refused}",
            stacklevel=4,
        )
        return None
    verdict.joined = True
    return emitted.model, sympy.Eq(symbol, 1), sources


def _join_special_branch(
    model_ir: Any,
    captured: capture_stage.CapturedGraph,
    emitter: GraphEmitter,
    export_report: ExportReport,
    outputs: int,
    inputs: str,
    emit_special: Any,
) -> None:
    """Where the capture took a size-oblivious decision for the general branch (``numel() == 0`` taken as False),
    capture the special branch too and let an ONNX If choose between them at run time (``_emit/branches.py``).
    Falls back to the general branch alone, with a warning saying why, where that cannot be done."""
    try:
        _join_if_worth_it(model_ir, captured, emitter, export_report, outputs, inputs, emit_special)
    finally:
        _issue_capture_warning(captured)


def _value_decision_in_graph_symbols(captured: capture_stage.CapturedGraph) -> None:
    """A branch on a value decided at trace time on ``Eq(u0, 1)`` reads, in the final graph, the bool of the one
    ``item()`` whose symbol may be numbered otherwise (u1): the decision is renamed to it. Left as is (and the If
    then fails, naming the line) unless there is exactly one such value and one such decision."""
    symbols = branches.value_symbols(captured)
    on_value = [decision for decision in captured.branch_decisions if decision.on_value]
    if len(symbols) != 1 or len(on_value) != 1 or len(on_value[0].condition.free_symbols) != 1:
        return
    (old,) = on_value[0].condition.free_symbols
    on_value[0].in_graph = on_value[0].condition.xreplace({old: symbols[0]})


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


def _issue_capture_warning(captured: capture_stage.CapturedGraph) -> None:
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
    export_report: ExportReport,
    outputs: int,
    inputs: str,
    emit_special: Any,
) -> None:
    decisions = [
        decision
        for decision in captured.branch_decisions
        if not any(known in decision.source_line for known in _SPECIAL_BRANCH_SAVES_WORK)
    ]
    if not decisions:
        return
    general_only = f"the ONNX model computes the general branch only ({capture_strategies.GENERAL_BRANCH})"
    if len(decisions) > 1 and any(decision.on_value for decision in decisions):
        raise _no_branch_on_a_value(
            next(decision for decision in decisions if decision.on_value),
            f"{len(decisions)} data-dependent branches in the model (fx2onnx joins the two sides of one): "
            + "; ".join(decision.text() for decision in decisions),
            inputs,
        )
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
            if why is None and branches.same_empty_results(captured, special, condition, decision.general):
                joined = capture_strategies.SAME_EMPTY_RESULTS
            elif why is None:
                try:
                    branches.join(model_ir, emitted.model, outputs, special_side, sources)
                except ValueError as error:
                    why = f"its condition has no ONNX translation here: {error}"
    line = decision.text()
    if why is not None and decision.on_value:
        raise _no_branch_on_a_value(decision, why, inputs)
    if why is not None:
        warnings.warn(f"size-oblivious decision {line}: {why}\n  {general_only}", stacklevel=5)
        return
    export_report.capture_assumptions = [
        assumption.replace(f"not checked at run time: {capture_strategies.GENERAL_BRANCH}", joined)
        if assumption.startswith(f"{decision.condition} taken as")
        else assumption
        for assumption in export_report.capture_assumptions
    ]
    captured.assumptions = export_report.capture_assumptions


def _bind_weights(
    captured: capture_stage.CapturedGraph,
    model: Any,
    weights: str | os.PathLike[str] | Mapping[str, Any] | None,
) -> dict[str, checkpoint_weights.CheckpointTensor] | None:
    """The checkpoint's tensor for each captured weight (`weights=`); without it, a clear error for a weightless
    model rather than a failure when the optimizer first reads a meta tensor."""
    if weights is not None:
        return checkpoint_weights.bind(captured.weights, model, weights)
    weightless = [name for name, tensor in captured.weights.values() if checkpoint_weights.is_weightless(tensor)]
    if weightless:
        raise checkpoint_weights.WeightsError(
            f"{len(weightless)} of the model's weights hold no data (meta or fake tensors: {', '.join(weightless[:3])}"
            f"{', ...' if len(weightless) > 3 else ''})\n  remedy: pass weights= (a safetensors file, a folder of "
            "shards with model.safetensors.index.json, or a mapping from state_dict name to tensor)"
        )
    return None


def _warn_about_dynamic_dims(
    captured: capture_stage.CapturedGraph,
    requested: Mapping[tuple[int, int], Any],
    flat_inputs: list[Any],
    export_report: ExportReport,
    checks: runtime_checks.RuntimeChecks,
) -> None:
    """Say which dims asked to be dynamic the model's code made static or constrained (never silently), and what the
    ONNX model checks at run time of what the graph assumes (in the report; in the warning too when it is the
    model's code, not `dynamic_shapes`, that assumes it)."""
    static = capture_stage.static_dynamic_dims(captured, requested, flat_inputs)
    notes = [
        f"constrained by the model's code (torch.export's suggested fix applied): {fix}" for fix in captured.shape_fixes
    ]
    notes += static
    # torch.export's deferred guards on the sizes (the model's code assumes them) and what cannot be checked
    notes += [note for note in checks.checked if "assumed by the model's code" in note]
    notes += [note for note in checks.unchecked if runtime_checks.LOWERED_WHOLE not in note]
    reported = notes + [note for note in checks.checked if "assumed by the model's code" not in note]
    reported += [note for note in checks.unchecked if runtime_checks.LOWERED_WHOLE in note]
    if reported:
        export_report.dynamic_dims = reported
    if notes and (requested or checks.unchecked or static or captured.shape_fixes):
        warnings.warn("dynamic_shapes asked for more than the model allows:\n  " + "\n  ".join(notes), stacklevel=3)


MIN_OPSET_THAT_WORKS = "min"


def opset_for_dtypes(captured: capture_stage.CapturedGraph, opset_version: int | str) -> int:
    """The opset to export at: `opset_version`, or for ``"min"`` the lowest one every dtype of the graph needs.

    Types newer than the opset (float8 needs 19) are refused with the dtype, the node and the way out, rather than
    failing later as an ONNX node without a kernel.
    """
    needs: dict[torch.dtype, torch.fx.Node] = {}
    for module in captured.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            values = node.meta.get("val")
            for value in values if isinstance(values, (list, tuple)) else [values]:
                if not isinstance(value, torch.Tensor):
                    continue
                if value.dtype == torch.float4_e2m1fn_x2:
                    dtypes.to_onnx(value.dtype)  # raises, saying why
                if value.dtype in dtypes.MIN_OPSET and "stack_trace" not in getattr(needs.get(value.dtype), "meta", {}):
                    needs[value.dtype] = node  # the first node with a source line (an input has none)
    required = max([BASE_OPSET, *(dtypes.MIN_OPSET[dtype] for dtype in needs)])
    if opset_version == MIN_OPSET_THAT_WORKS:
        finalize_stage.check_opset(required)
        return required
    assert isinstance(opset_version, int)
    for dtype, node in needs.items():
        if dtypes.MIN_OPSET[dtype] > opset_version:
            trace = node.meta.get("stack_trace")
            where = f"\n  from: {source_line(trace)}" if trace else ""
            default = " (the default)" if opset_version == BASE_OPSET else ""
            raise ExportError(
                f"{dtype} needs ONNX opset {dtypes.MIN_OPSET[dtype]} or newer; "
                f"opset_version is {opset_version}{default}: "
                f"FX node `{node.name}` ({node.target}) makes it{where}\n"
                f"  remedy: pass opset_version={required} (or opset_version='min': the lowest opset that works)"
            )
    return opset_version


@contextlib.contextmanager
def _collections_skip_older_objects() -> Iterator[None]:
    """Let the garbage collector skip, until the export ends, the objects that existed before it began.

    An export allocates enough to trigger full collections, and each one walks every object in the process
    (torch, onnxscript, the user's model: millions), not just the export's own garbage: two of them cost
    0.3 s of a 2.3 s GPT-2 export. Older objects are frozen (``gc.freeze``) for the export's duration and
    unfrozen after; whatever garbage they hold is collected as usual afterwards. Skipped when something
    else already froze objects (a pre-fork server, a nested export), whose freeze must not be undone here.
    """
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
