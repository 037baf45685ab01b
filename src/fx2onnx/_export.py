"""``fx2onnx.export``: capture -> FX passes -> dispatch/emit -> finalize -> ONNXProgram.

Each stage is a module of its own; this file only wires them together and times them.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import torch

from fx2onnx import _branch_join as branch_join
from fx2onnx import _capture as capture_stage
from fx2onnx import _capture_dims as capture_dims
from fx2onnx import _capture_pytrees as capture_pytrees
from fx2onnx import _dtypes as dtypes
from fx2onnx import _finalize as finalize_stage
from fx2onnx import _passes as passes
from fx2onnx import _torch_compat as torch_compat
from fx2onnx import _weight_reads as weight_reads
from fx2onnx import _weights as checkpoint_weights
from fx2onnx import legalize
from fx2onnx._dispatch import ArgumentBinding, Dispatcher
from fx2onnx._emit import control_flow, runtime_checks
from fx2onnx._emit.graph_builder import GraphEmitter, symbol_names_for
from fx2onnx._progress import ExportProgress, StageClock
from fx2onnx._progress import wanted as progress_wanted
from fx2onnx._records import BASE_OPSET
from fx2onnx._registry import Registry, apply_translation_table, global_registry
from fx2onnx.errors import ExportError, source_line
from fx2onnx.program import ONNXProgram, initializers_as_inputs
from fx2onnx.report import ExportReport, casts_inserted_by_passes


def export(
    model: torch.nn.Module | torch.export.ExportedProgram | Callable[..., Any],
    args: tuple[Any, ...] | Any = (),
    f: str | os.PathLike[str] | BinaryIO | Mapping[str, Any] | None = None,
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
    succeeded): a path, or a binary file object. ``keep_initializers_as_inputs=True`` lists the weights among the
    saved model's inputs too; ``export_params=False`` saves them as inputs without their data (the model in memory
    keeps them; constants the export computed from them, as a folded batch norm, stay in the file).
    `verify=True` runs the model in ONNX Runtime on `args` and raises
    :class:`fx2onnx.errors.VerificationError` if any output differs from eager. `target` is the runtime
    the model must load and run in (``onnxruntime-cpu`` or ``onnx``); `report` is a path (or a list of
    paths) to write the export report to: Markdown, or SARIF 2.1.0 for a ``.sarif`` path (``True``: a
    Markdown file in `artifacts_dir`, as torch does); it is written on failure too (and then no model is
    saved). `dump_exported_program=True` writes torch.export's program to `artifacts_dir`.
    `opset_version` is 18 unless given; 13 to 17 export at 18 and adapt the model op by op (an op the older opset
    cannot express is an error naming it); ``"min"`` is the lowest opset (18 or above) that every dtype of the graph
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
    given_kwargs = kwargs if kwargs is not None else f if isinstance(f, Mapping) else None
    args, given_kwargs, input_names, output_names, dynamic_shapes = torch_compat.exportable_module_arguments(
        model, args, given_kwargs, input_names, output_names, dynamic_shapes
    )
    kwargs = given_kwargs if not isinstance(f, Mapping) else kwargs
    # the same export for the same module holding other weights (ONNXProgram.apply_weights, where the export folded
    # the weights), before the arguments below are read into their internal forms
    export_again = functools.partial(
        export,
        args=args,
        f=f if isinstance(f, Mapping) else None,
        kwargs=kwargs,
        dynamic_shapes=dynamic_shapes,
        dynamic_axes=dynamic_axes,
        input_names=input_names,
        output_names=output_names,
        opset_version=opset_version,
        registry=registry,
        custom_translation_table=custom_translation_table,
        strict=strict,
        extractor=extractor,
        optimize=optimize,
        target=target,
        fast_math=fast_math,
        progress=progress,
        verbose=verbose,
    )
    unknown = set(torchscript_options) - set(torch_compat.IGNORED_OPTIONS)
    if unknown:
        raise TypeError(f"export() got unexpected keyword arguments: {', '.join(sorted(unknown))}")
    torch_compat.check_options(dynamo=dynamo, **torchscript_options)
    torch_compat.check_old_opset(opset_version, finalize_stage.opset_down.LOWEST_OPSET)
    model = torch_compat.as_module(model)
    torch_compat.check_list_args(model, args)
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
    axes_inputs: list[str] = []  # the names dynamic_axes keys inputs by
    if dynamic_axes is not None:
        if dynamic_shapes is not None:
            raise ValueError("give dynamic_shapes or dynamic_axes, not both")
        dynamic_shapes, axis_names, axes_inputs = torch_compat.dynamic_shapes_from_axes(
            model, args, kwargs, dynamic_axes, input_names
        )
    export_report = ExportReport(
        model_name=type(model).__name__, opset=opset_version if isinstance(opset_version, int) else 0, target=target
    )
    shown = ExportProgress(progress_wanted(progress, verbose))
    captures: list[capture_stage.CapturedGraph] = []  # its capture's warning is issued even when a later stage fails
    try:
        with (
            capture_stage.EXPORT_LOCK,
            _collections_skip_older_objects() as skip_objects_so_far,
            weight_reads.watch() as reads,
        ):
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
                reads=reads,
                skip_objects_so_far=skip_objects_so_far,
            )
            if dynamic_axes is not None:
                torch_compat.name_output_axes(program.model, dynamic_axes, axes_inputs)
    except Exception as error:
        shown.close()
        for captured in captures:
            branch_join.issue_capture_warning(captured)
        export_report.error = f"{type(error).__name__}: {error}"
        export_report.exception = error
        if report is not None:
            export_report.write(report)
        raise
    if weights is None and not isinstance(model, torch.export.ExportedProgram):
        program.export_again = export_again
    if dump_exported_program and program.exported_program is not None:
        os.makedirs(artifacts_dir, exist_ok=True)
        path = os.path.join(artifacts_dir, f"{type(model).__name__}_exported_program.txt")
        with open(path, "w", encoding="utf-8") as file:
            file.write(str(program.exported_program))
    if f is not None:
        with StageClock(export_report.stage_seconds, shown)("save"):
            # export_params=False: the model's weights (its state_dict's names) are inputs without data; constants
            # the export computed (from them too: a folded batch norm) stay, since no caller could feed them
            weights_out = contextlib.nullcontext()
            if not export_params:
                names = {name for name, _ in program.captured.weights.values()} if program.captured else None
                weights_out = initializers_as_inputs(program.model, keep_data=False, names=names)
            with weights_out:
                program.save(f, external_data=external_data, keep_initializers_as_inputs=keep_initializers_as_inputs)
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
    reads: weight_reads.WeightReads,
    skip_objects_so_far: Callable[[], None],
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
    skip_objects_so_far()  # torch.export's objects (graphs, fake tensors, shape env): the stages after it add little
    captures.append(captured)
    torch_compat.warn_if_training(model, captured.graph_module)
    export_report.strategy = captured.strategy
    export_report.capture_seconds = {
        captured.strategy.split("(")[0]: captured.trace_seconds,
        "decomposition": captured.decomposition_seconds,
    }
    size_one_seconds = branch_join.size_one_comparison_seconds(captured)
    if size_one_seconds is not None:
        export_report.capture_seconds["size-1 comparison"] = size_one_seconds
    export_report.decomposed = captured.decomposed
    export_report.decomposition = captured.decomposition
    export_report.capture_assumptions = captured.assumptions
    opset_version = opset_for_dtypes(captured, opset_version)
    export_report.opset = opset_version
    # implementations are chosen at opset 18 and up (torchlib's); finalize adapts the model to an older target
    lowering_opset = max(opset_version, BASE_OPSET)
    flat_inputs = capture_pytrees.flatten_inputs(captured.in_spec, args, kwargs)
    bound = _bind_weights(captured, model, weights)  # before the work of emission: a bad checkpoint fails fast

    with timer("fx passes"):
        nodes_before = passes.all_nodes(captured.graph_module)  # and those of control-flow bodies
        export_report.graph_nodes = len(nodes_before)
        export_report.fx_passes = passes.run_fx_passes(captured, registry)
        export_report.promotion_casts = casts_inserted_by_passes(captured.graph, nodes_before)

    with timer("dispatch+emit", f"{len(captured.graph.nodes)} FX nodes"):
        user_dims = {**capture_dims.dim_names(model, args, kwargs, dynamic_shapes), **axis_names}
        dispatcher = Dispatcher(registry, lowering_opset)
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
    branch_join.drop_checks_of_value_sides(model_ir, captured)
    # a decision's special branch: the model captured again (through passes and emission), joined in an If below
    emit_special = functools.partial(
        branch_join.emit_special_branch,
        extractor=extractor,
        model=model,
        decompositions=decompositions,
        registry=registry,
        opset_version=lowering_opset,
        input_names=input_names,
        output_names=output_names,
        user_dims=user_dims,
        flat_inputs=flat_inputs,
    )
    # the model's `if batch == 1` whose general branch differs from eager at 1: the size-1 capture, joined below
    size_one_branch = None
    if branch_join.needs_size_one_branch(captured):
        with timer("special branch"):
            size_one_branch = branch_join.size_one_special_branch(model_ir, captured, emitter, emit_special)
    # what the graph was captured under (torch.export's assertions, the input dims' ranges and relations) is checked
    # at run time: an input breaking it fails in ONNX Runtime naming the assumption
    requested = capture_dims.dynamic_dims(model, args, kwargs, dynamic_shapes)
    checks = runtime_checks.add_runtime_checks(
        model_ir, captured, emitter.symbol_names, runtime_checks.asked_minimums(captured, requested, flat_inputs)
    )
    _warn_about_dynamic_dims(captured, requested, flat_inputs, export_report, checks)
    if size_one_branch is not None:
        with timer("special branch"):
            branch_join.join_size_one_branch(model_ir, size_one_branch, len(model_ir.graph.outputs) - checks.pending)
    if captured.branch_decisions:
        with timer("special branch"):
            branch_join.join_special_branch(
                model_ir,
                captured,
                emitter,
                len(model_ir.graph.outputs) - checks.pending,
                capture_stage.describe_inputs(args, kwargs),
                lambda decision: emit_special(args, kwargs, dynamic_shapes, decision),
            )
        export_report.capture_assumptions = captured.assumptions  # a joined decision's assumption says so
    if bound is not None:
        checkpoint_weights.attach(model_ir, bound)

    with timer("finalize"):
        finalize_stage.finalize(model_ir, opset_version, optimize=optimize)
        runtime_checks.feed_an_output(model_ir, checks)

    with timer("legalize"):
        export_report.casts.extend(legalize.legalize_model(model_ir, target, fast_math=fast_math))
    # the graph is final: the checks below read every weight, without changing what the model computes
    swappable = reads.finish(model_ir)

    with timer("check"):
        # Shape inference runs on the legal model: before legalization some nodes (bf16 Cos) are invalid ONNX.
        if not finalize_stage.every_value_typed(model_ir):
            common_passes.ShapeInferencePass()(model_ir)
        finalize_stage.check_model(model_ir)
    _claim_only_checks_in_model(model_ir, export_report)
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
        optimized=optimize,
        swappable_weights=swappable,
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
    warned = [note for note in checks.checked if runtime_checks.EVERY_NONEMPTY_SIZE not in note]
    notes += [note for note in warned if "assumed by the model's code" in note]
    notes += [note for note in checks.unchecked if runtime_checks.LOWERED_WHOLE not in note]
    reported = notes + [note for note in checks.checked if note not in notes]
    reported += [note for note in checks.unchecked if runtime_checks.LOWERED_WHOLE in note]
    if reported:
        export_report.dynamic_dims = reported
    if notes and (requested or checks.unchecked or static or captured.shape_fixes):
        heading = (
            "dynamic_shapes asked for more than the model allows"
            if requested
            else "the captured graph assumes of its sizes what the model's code assumed"  # no dynamic_shapes given
        )
        warnings.warn(f"{heading}:\n  " + "\n  ".join(notes), stacklevel=3)


def _claim_only_checks_in_model(model: ir.Model, export_report: ExportReport) -> None:
    """The report claims no run-time check that the saved model lacks: such a claim is said not to hold, and warned
    about (an input breaking the assumption computes something else than eager, silently)."""
    notes, assumptions, false_claims = runtime_checks.claims_in_model(
        model, list(export_report.dynamic_dims or []), list(export_report.capture_assumptions)
    )
    if not false_claims:
        return
    if export_report.dynamic_dims:
        export_report.dynamic_dims = notes
    export_report.capture_assumptions = assumptions
    warnings.warn(
        "the ONNX model does not check at run time what the capture assumed (an input breaking it is computed "
        "without error, possibly unlike eager):\n  " + "\n  ".join(false_claims),
        stacklevel=3,
    )


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
def _collections_skip_older_objects() -> Iterator[Callable[[], None]]:
    """Let the garbage collector skip, until the export ends, the objects that existed before it began, and hold
    its full collections until then.

    An export allocates enough to trigger full collections, and each one walks every object in the process
    (torch, onnxscript, the user's model: millions), not just the export's own garbage: two of them cost
    0.3 s of a 2.3 s GPT-2 export. Older objects are frozen (``gc.freeze``) for the export's duration and
    unfrozen after; whatever garbage they hold is collected as usual afterwards. The export's own objects are
    still walked by each full collection, which finds little to free there (what outlives two younger
    collections mostly lives until the export ends: the graphs, the registry and the modules a first export
    builds or imports): the first export in a process ran two (hf-t5: 0.09 s CPU, 2,700 objects freed), so
    full collections wait for the export's end (younger ones run as usual). Skipped when something else
    already froze objects (a pre-fork server, a nested export), whose freeze must not be undone here.

    Yields what freezes the objects made since (torch.export's graphs, fake tensors and shape environment, which
    younger collections then skip too), when the export froze the older ones.
    """
    if gc.get_freeze_count() or not gc.isenabled():
        yield lambda: None
        return
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], _NO_FULL_COLLECTION)
    try:
        yield gc.freeze
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


# Younger collections between two full ones while an export runs: more than an export makes.
_NO_FULL_COLLECTION = 1 << 30
