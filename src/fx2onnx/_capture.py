"""Capture: turn a model and example inputs into an ATen-level FX graph.

Extractors are pluggable (:class:`Extractor`). ``torch.export`` (non-strict by default) is the
first; ``torch.fx.symbolic_trace`` followed by ``make_fx`` is the second, for models torch.export
rejects. Both produce a :class:`CapturedGraph`: the graph plus which placeholders are user inputs,
which are weights, and how inputs/outputs flatten (pytrees).

Decomposition uses torch's table minus every op the registry lowers directly, so that what ONNX can
express natively (``layer_norm``, ``scaled_dot_product_attention``, ``gelu``...) stays whole. It is local when it
can be: only the nodes the registry cannot lower are replaced, each by its decomposition traced on its own inputs'
fake values (``make_fx`` under the graph's fake mode, symbolic sizes included), and in-place writes into fresh
tensors, also through their views, become functional ops (``_capture_functionalize.py``); torch's
``run_decompositions`` retraces the whole program only where correctness needs it (mutated buffers or inputs, writes
into tensors that may alias others, training-mode batch norm).
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, OutputKind, TensorArgument
from torch.fx.experimental import _config as symbolic_config

from fx2onnx import _capture_strategies as capture_strategies
from fx2onnx import _torch_compat as torch_compat
from fx2onnx._capture_dims import (
    cache_shapes_in_registered_layout,
    complete_dynamic_shapes,
    export_with_suggested_fixes,
    shared_axis_names,
)
from fx2onnx._capture_functionalize import PROVENANCE_META, NeedsFullDecomposition, functionalize_locally
from fx2onnx._capture_pytrees import (
    flatten_inputs,
    input_paths,
    library_pytrees_when_returned,
    register_library_pytrees_for_inputs,
)
from fx2onnx._capture_size_one import SizeOneVerdict, general_branch_at_size_one
from fx2onnx._fake_kernels import static_fake_kernels
from fx2onnx._library_stand_ins import library_stand_ins, refuse_windowed_caches
from fx2onnx._records import DecompositionRecord, qualified_name, schema_arguments, schema_facts, target_name
from fx2onnx._torch_ops import aten
from fx2onnx.errors import CaptureError, source_line, user_frame

# torch.export is not thread-safe: its tracing modes (the proxy and fake modes, the module hierarchy it records) are
# process-wide, and non-strict capture swaps the model's parameters for fake tensors while it traces. Two exports
# at once in two threads fail inside torch.export, and one of the same model can leave it holding fake tensors.
# Every export (capture through verification) holds this lock; so does the eager run of `ONNXProgram.verify`, so
# that it never sees a model some other thread is tracing. Reentrant: `export(verify=True)` verifies inside.
EXPORT_LOCK = threading.RLock()


@dataclasses.dataclass
class CapturedGraph:
    """An ATen-level FX graph and what its placeholders and outputs mean."""

    graph_module: torch.fx.GraphModule
    user_inputs: list[torch.fx.Node]  # tensor (and symbolic) user inputs, in flat order
    constant_inputs: dict[torch.fx.Node, Any]  # user inputs specialised to constants (ints, None...)
    weights: dict[torch.fx.Node, tuple[str, torch.Tensor]]  # placeholder -> (qualified name, tensor)
    user_outputs: list[Any]  # FX output arguments that the user sees, in flat order
    in_spec: pytree.TreeSpec | None
    out_spec: pytree.TreeSpec | None
    exported_program: ExportedProgram | None
    strategy: str
    seconds: float = 0.0
    decomposed: list[str] = dataclasses.field(default_factory=list)  # overloads decomposed away
    # Of `seconds`: the tracer itself (torch.export / symbolic_trace + make_fx) and decomposition. The
    # rest is fx2onnx's own work around them, which issue 8 counts as the exporter's overhead.
    trace_seconds: float = 0.0
    decomposition_seconds: float = 0.0
    # torch.export's suggested fixes applied to the user's `dynamic_shapes` (dims it found constrained or static)
    shape_fixes: list[str] = dataclasses.field(default_factory=list)
    # none, local or full decomposition, of which nodes, and why
    decomposition: DecompositionRecord = dataclasses.field(default_factory=DecompositionRecord)
    # what the capture strategies assumed (capture_strategies.Assumption, as text), also said in a warning
    assumptions: list[str] = dataclasses.field(default_factory=list)
    # torch.export's deferred runtime assertion (its expression, as the graph's _assert_scalar names it) -> the
    # user's line whose guard deferred it: the ONNX model's check of it names that line
    assertion_lines: dict[str, str] = dataclasses.field(default_factory=dict)
    # the size-oblivious decisions for the general branch (``numel() == 0`` taken as False), whose special branch
    # the export may capture too (`special_branch=`) and choose at run time
    branch_decisions: list[capture_strategies.BranchDecision] = dataclasses.field(default_factory=list)
    # the general branch of a size-oblivious decision on a backed input dim or a sum or product of them (``Ne(batch,
    # 1)``, ``Ne(height*width, 1)``), keyed by the dims named by placeholder (a retrace numbers the symbols afresh:
    # `decision_key`) -> whether it gives eager's result at size 1 too, run at export on the example sliced to the
    # sizes that make it 1 (:func:`general_branch_at_size_one`)
    size_one_verdicts: dict[str, SizeOneVerdict] = dataclasses.field(default_factory=dict)
    # (strategy attempts, stand-ins used) of the capture's warning, when the export issues it (after its If, if any)
    pending_warning: tuple[list[capture_strategies.StrategyAttempt], list[str]] | None = None

    @property
    def graph(self) -> torch.fx.Graph:
        return self.graph_module.graph


class Extractor(Protocol):
    """Produces a decomposed ATen graph from a model. `special_branch` and `size_one_branch` ask for a special
    branch's capture (``_branch_join.py``), as :meth:`TorchExportExtractor.capture` says."""

    name: str

    def capture(
        self,
        model: torch.nn.Module | ExportedProgram,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        dynamic_shapes: Any,
        decompositions: Mapping[Any, Callable[..., Any]],
        special_branch: capture_strategies.BranchDecision | None = None,
        size_one_branch: bool = False,
    ) -> CapturedGraph: ...


class Registry(Protocol):
    """What capture asks of the registry (:class:`fx2onnx._registry.Registry`, a later stage): which ops are lowered
    as they are, so that decomposition keeps them."""

    def lowers(self, target: Any, *, complex: bool = False) -> bool: ...

    def lowers_on_parts(self, target: Any) -> bool:
        """Whether an op with complex inputs is lowered by its real lowering once rewritten on its parts."""
        ...


class ArgumentBinder(Registry, Protocol):
    """A :class:`Registry` that also says whether some implementation of a node's op takes the node's arguments as
    they are present (:class:`fx2onnx._dispatch.ArgumentBinding`, which ``_export.py`` passes in: dispatch is a later
    stage). A node the registry has implementations for but none that binds it is decomposed like an op the
    registry lacks, rather than failing at dispatch."""

    def binds(self, node: torch.fx.Node) -> bool: ...


def decomposition_table(registry: Registry) -> dict[Any, Callable[..., Any]]:
    """torch's default decompositions, minus the overloads the registry can lower directly (for real inputs:
    an op with only complex implementations stays decomposable for the real graphs that need it)."""
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if registry.lowers(qualified_name(op)):
            table.pop(op)
    return dict(table.items())


def _takes_complex(node: torch.fx.Node) -> bool:
    """Whether any tensor argument of `node` is complex (its implementations are kept apart)."""
    values = [a.meta.get("val") for a in node.all_input_nodes]
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in values)


def _lowers(registry: Registry, node: torch.fx.Node) -> bool:
    """Whether `node`'s op is lowered as it is: by the registry, or, with complex inputs, by its real lowering
    after the FX pass that rewrites it on the real and imaginary parts (passes/complex_parts.py); and, when the
    registry can say so (:class:`ArgumentBinder`), by an implementation that takes the node's arguments."""
    if not _takes_complex(node):
        lowered = registry.lowers(node.target)
    else:
        lowered = registry.lowers_on_parts(node.target) or registry.lowers(node.target, complex=True)
    if not lowered:
        return False
    binds: Callable[[torch.fx.Node], bool] | None = getattr(registry, "binds", None)  # an ArgumentBinder's
    return binds is None or binds(node)


def _updates_statistics(node: torch.fx.Node, target: torch._ops.OpOverload) -> bool:
    """Batch norm in training mode updates its running statistics though its schema marks no mutation;
    decomposition functionalizes that, so such a graph must be decomposed."""
    for position, (name, *_) in enumerate(schema_arguments(target) or ()):
        if name == "training":
            value = node.kwargs.get("training", node.args[position] if position < len(node.args) else False)
            return bool(value)
    return False


class LazyDecompositionTable(Mapping[Any, Callable[..., Any]]):
    """:func:`decomposition_table`, built on first use: a capture that needs no decomposition never builds it."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._table: dict[Any, Callable[..., Any]] | None = None

    @property
    def table(self) -> dict[Any, Callable[..., Any]]:
        if self._table is None:
            self._table = decomposition_table(self.registry)
        return self._table

    def __getitem__(self, op: Any) -> Callable[..., Any]:
        return self.table[op]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.table)

    def __len__(self) -> int:
        return len(self.table)


def fallback_decompositions(graph_module: torch.fx.GraphModule, registry: Registry) -> dict[Any, Callable[..., Any]]:
    """Decompositions, from torch's full table, for overloads still in the graph that the registry lacks."""
    from torch._decomp import decomposition_table as full_table

    needed = {}
    bodies = [m for m in graph_module.modules() if isinstance(m, torch.fx.GraphModule)]  # and torch.cond branches
    for node in (n for module in bodies for n in module.graph.nodes):
        target = node.target
        is_overload = node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
        if is_overload and not _lowers(registry, node) and target in full_table:
            needed[target] = full_table[target]
    return needed


def lowerable_as_captured(program: ExportedProgram, registry: Registry) -> bool:
    """Whether the registry lowers torch.export's graph as it is, so that decomposing it would change nothing.

    That holds when no op mutates (decomposition functionalizes the graph) and every op has an
    implementation (decomposition keeps those). Ops without results are runtime checks, which emit skips.
    """
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        return False
    return _lowerable_graph(program.graph_module, registry)


# Higher-order operators the emitter turns into If/Loop/Scan with bodies of their own (emit/control_flow.py's
# EMITTERS; a test keeps the two in step): lowerable as captured when their bodies are.
CONTROL_FLOW_OPERATORS = frozenset(
    {
        torch.ops.higher_order.cond,
        torch.ops.higher_order.while_loop,
        torch.ops.higher_order.scan,
        torch.ops.higher_order.map_impl,
    }
)


def _lowerable_graph(graph_module: torch.fx.GraphModule, registry: Registry) -> bool:
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        target = node.target
        if target in CONTROL_FLOW_OPERATORS:
            bodies = [getattr(graph_module, a.target) for a in node.all_input_nodes if a.op == "get_attr"]
            bodies = [body for body in bodies if isinstance(body, torch.fx.GraphModule)]
            if not bodies or not all(_lowerable_graph(body, registry) for body in bodies):
                return False
            continue
        if isinstance(target, torch._ops.OpOverload):
            facts = schema_facts(target)
            assert facts is not None
            if facts.is_mutable or _updates_statistics(node, target):
                return False
            if not facts.returns:
                continue
        try:
            if not _lowers(registry, node):
                return False
        except TypeError:  # not a registry target at all
            return False
    return True


def local_decomposition_table(registry: Registry) -> dict[Any, Callable[..., Any]]:
    """What a node's decomposition may decompose in turn: torch's full table, for the overloads the registry cannot
    lower. ``make_fx`` applies it recursively, and CompositeImplicitAutograd ops decompose as they are traced.
    (Not torch.export's default table: building it costs a second, more than the local decompositions themselves.)"""
    from torch._decomp import decomposition_table as full_table

    return {
        op: function
        for op, function in full_table.items()
        if isinstance(op, torch._ops.OpOverload) and not registry.lowers(qualified_name(op))
    }


def decompose_locally(program: ExportedProgram, registry: Registry) -> DecompositionRecord:
    """Replace only the nodes of `program` the registry cannot lower by their decompositions, in place.

    Each such node's decomposition is traced on its own inputs' fake values and spliced into the graph where the
    node was; in-place writes into tensors the graph owns, also through views of them, become functional ops. Raises
    :class:`NeedsFullDecomposition` when correctness needs torch's ``run_decompositions`` (mutated buffers or inputs,
    a write into a tensor that may alias another, training-mode batch norm, a node whose decomposition cannot be
    traced on its own); the graph is then still equivalent to the captured one.
    """
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        mutated = sorted({*signature.buffers_to_mutate.values(), *signature.user_inputs_to_mutate.values()})
        raise NeedsFullDecomposition(
            f"the program mutates {', '.join(mutated)}: functionalizing that rewrites the whole program"
        )
    record = DecompositionRecord(strategy="local")
    table: dict[Any, Callable[..., Any]] | None = None

    def lazy_table() -> dict[Any, Callable[..., Any]]:
        nonlocal table
        if table is None:
            table = local_decomposition_table(registry)
        return table

    # Fake kernels run again here as the capture ran them, size-obliviously: otherwise one of a dim whose example is
    # 1 (hardswish's, hardsigmoid's) gives a static 1, and the graph's shapes after it lose the dynamic batch
    with symbolic_config.patch(backed_size_oblivious=True):
        _decompose_graph_locally(program.graph_module, registry, lazy_table, record, prefix="")
    _rename_outputs(program)
    return record


def _decompose_graph_locally(
    graph_module: torch.fx.GraphModule,
    registry: Registry,
    table: Callable[[], dict[Any, Callable[..., Any]]],
    record: DecompositionRecord,
    prefix: str,
) -> None:
    graph = graph_module.graph
    functionalized = functionalize_locally(graph_module, prefix)
    record.functionalized.extend(functionalized)
    changed = bool(functionalized)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        target = node.target
        if target in CONTROL_FLOW_OPERATORS:  # functional by construction: their bodies are decomposed in turn
            for argument in node.all_input_nodes:
                body = getattr(graph_module, str(argument.target), None) if argument.op == "get_attr" else None
                if isinstance(body, torch.fx.GraphModule):
                    _decompose_graph_locally(body, registry, table, record, f"{prefix}{argument.target}.")
            continue
        if not isinstance(target, torch._ops.OpOverload):
            try:
                lowered = _lowers(registry, node)
            except TypeError:
                lowered = False
            if not lowered:
                raise NeedsFullDecomposition(f"`{prefix}{node.name}` calls {target_name(target)}, no ATen overload")
            continue
        if _updates_statistics(node, target):
            raise NeedsFullDecomposition(
                f"`{prefix}{node.name}` ({qualified_name(target)}) updates running statistics in training mode"
            )
        if target._schema.is_mutable:  # functionalize_locally left none: a node another step added
            raise NeedsFullDecomposition(f"`{prefix}{node.name}` ({qualified_name(target)}) writes in place")
        if not target._schema.returns or _lowers(registry, node):
            continue
        name = prefix + node.name
        decompositions = table()
        if target not in decompositions:  # an op the registry has, but no implementation takes this node's arguments
            from torch._decomp import decomposition_table as full_table

            if target in full_table:
                decompositions = {**decompositions, target: full_table[target]}
        try:
            _splice_decomposition(graph, node, decompositions, registry)
        except NeedsFullDecomposition:
            raise
        except Exception as error:  # a decomposition that cannot be traced on its own
            raise NeedsFullDecomposition(
                f"`{name}` ({qualified_name(target)}) could not be decomposed on its own: "
                f"{type(error).__name__}: {_first_lines(str(error), 1)}"
            ) from error
        record.nodes.append((name, qualified_name(target)))
        changed = True
    if changed:
        graph.lint()
        recompile_when_read(graph_module)


def _splice_decomposition(
    graph: torch.fx.Graph, node: torch.fx.Node, table: dict[Any, Callable[..., Any]], registry: Registry
) -> None:
    """Trace `node`'s decomposition on its inputs' fake values and put the traced nodes in its place."""
    from torch.fx.experimental.proxy_tensor import make_fx

    target = node.target
    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    positions = [index for index, leaf in enumerate(flat) if isinstance(leaf, torch.fx.Node)]
    inputs: list[torch.fx.Node] = [flat[index] for index in positions]
    values = [argument.meta.get("val") for argument in inputs]
    if any(value is None for value in values):
        raise NeedsFullDecomposition(f"`{node.name}` has an input without a recorded value")
    fake_mode = torch._guards.detect_fake_mode([*values, node.meta.get("val")])

    def call(*traced: Any) -> Any:
        leaves = list(flat)
        for index, value in zip(positions, traced):
            leaves[index] = value
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        return target(*args, **kwargs)

    with fake_mode if fake_mode is not None else contextlib.nullcontext():
        traced = make_fx(call, decomposition_table=table, tracing_mode="real")(*values)
    # make_fx keeps results nobody reads (a tuple op's unused outputs): dropped, so that later passes see only
    # the results the graph uses (the complex parts pass rewrites _linalg_solve_ex when only result/info are read)
    traced.graph.eliminate_dead_code()
    for sub in traced.graph.nodes:
        if sub.op == "get_attr":
            raise NeedsFullDecomposition(f"the decomposition of `{node.name}` creates a constant tensor")
        if sub.op != "call_function" or sub.target is operator.getitem:
            continue
        if isinstance(sub.target, torch._ops.OpOverload) and sub.target._schema.is_mutable:
            raise NeedsFullDecomposition(f"the decomposition of `{node.name}` writes in place ({sub.target})")
        try:
            lowered = _lowers(registry, sub)
        except TypeError:
            lowered = False
        if not lowered:
            raise NeedsFullDecomposition(
                f"the decomposition of `{node.name}` ({qualified_name(target)}) holds {target_name(sub.target)}, "
                "which the registry cannot lower"
            )
    placeholders = [sub for sub in traced.graph.nodes if sub.op == "placeholder"]
    env: dict[torch.fx.Node, torch.fx.Node] = dict(zip(placeholders, inputs))
    provenance = {key: node.meta[key] for key in PROVENANCE_META if key in node.meta}
    result: Any = None
    with graph.inserting_before(node):
        for sub in traced.graph.nodes:
            if sub.op == "placeholder":
                continue
            if sub.op == "output":
                result = pytree.tree_map_only(torch.fx.Node, env.__getitem__, sub.args[0])
                continue
            copied = graph.node_copy(sub, env.__getitem__)
            copied.meta.update(provenance)
            env[sub] = copied
    if isinstance(result, (list, tuple)):
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise NeedsFullDecomposition(f"`{user.name}` takes `{node.name}`'s results as a whole")
            replacement = result[user.args[1]]
            if isinstance(replacement, (list, tuple)):  # a list result (histogramdd's edges): read item by item
                for reader in list(user.users):
                    if reader.target is not operator.getitem:
                        raise NeedsFullDecomposition(f"`{reader.name}` takes `{user.name}`'s list as a whole")
                    reader.replace_all_uses_with(replacement[reader.args[1]])
                    graph.erase_node(reader)
            else:
                user.replace_all_uses_with(replacement)
            graph.erase_node(user)
    elif isinstance(result, torch.fx.Node):
        node.replace_all_uses_with(result)
    else:
        raise NeedsFullDecomposition(f"the decomposition of `{node.name}` returns {type(result).__name__}")
    graph.erase_node(node)


def _has_dynamic_dims(program: ExportedProgram) -> bool:
    """Whether the captured program has symbolic input sizes (it was exported with `dynamic_shapes`)."""
    return bool(program.range_constraints)


def _rename_outputs(program: ExportedProgram) -> None:
    """Point the graph signature's outputs at the nodes that now compute them (a decomposed output has a new node)."""
    output = next(n for n in program.graph_module.graph.nodes if n.op == "output")
    for spec, argument in zip(program.graph_signature.output_specs, output.args[0]):
        name = getattr(spec.arg, "name", None)
        if name is not None and isinstance(argument, torch.fx.Node) and argument.name != name:
            spec.arg = dataclasses.replace(spec.arg, name=argument.name)


class TorchExportExtractor:
    """``torch.export.export``; non-strict unless ``strict=True``."""

    def __init__(self, strict: bool = False, registry: Registry | None = None) -> None:
        self.strict = strict
        self.registry = registry
        self.name = f"torch.export({'strict' if strict else 'non-strict'})"

    def capture(
        self,
        model: torch.nn.Module | ExportedProgram,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        dynamic_shapes: Any,
        decompositions: Mapping[Any, Callable[..., Any]],
        special_branch: capture_strategies.BranchDecision | None = None,
        size_one_branch: bool = False,
    ) -> CapturedGraph:
        """`special_branch`: one of a previous capture's `branch_decisions`, taken the other way this time.
        `size_one_branch`: the size-1 capture of a dim the general capture compared at size 1: neither the
        comparison nor the capture's warning again (the general capture's stand for both)."""
        start = time.perf_counter()
        trace_seconds = 0.0
        shape_fixes: list[str] = []
        attempts: list[capture_strategies.StrategyAttempt] = []
        assumptions: list[capture_strategies.Assumption] = []
        stand_ins_used: list[str] = []
        assertion_lines: dict[str, str] = {}
        decisions: list[capture_strategies.BranchDecision] = []
        pending_warning: tuple[list[capture_strategies.StrategyAttempt], list[str]] | None = None
        size_one_verdicts: dict[str, SizeOneVerdict] = {}
        registration_seconds = [0.0]  # of library pytrees, in the tracer's time: not the tracer's
        if isinstance(model, ExportedProgram):
            program = model
        else:
            pytrees_registered = register_library_pytrees_for_inputs(model, args, kwargs, strict=self.strict)
            refuse_windowed_caches(args, kwargs)  # its example would be traced wrong (see the stand-in)
            shared = shared_axis_names(model, args, kwargs, dynamic_shapes)
            dynamic_shapes = torch_compat.axis_names_to_dims(dynamic_shapes, shared)
            dynamic_shapes = complete_dynamic_shapes(model, args, kwargs, dynamic_shapes)
            dynamic_shapes = cache_shapes_in_registered_layout(model, args, kwargs, dynamic_shapes)
            try:
                with (
                    static_fake_kernels(),
                    onnx_export_flag(),
                    library_stand_ins(stand_ins_used),
                    capture_strategies.deferred_assertion_lines(assertion_lines),
                    library_pytrees_when_returned(model, registered=pytrees_registered, seconds=registration_seconds),
                ):  # static: composite ops whose fake run is data-dependent
                    traced_at = time.perf_counter()
                    program, shape_fixes = capture_strategies.first_that_captures(
                        lambda: export_with_suggested_fixes(model, args, kwargs, dynamic_shapes, strict=self.strict),
                        attempts,
                        assumptions,
                        section_counts=lambda: capture_strategies.example_section_counts(model, args, kwargs),
                        skip_torch_export=(
                            "the special branch of a size-oblivious decision"
                            if special_branch is not None
                            else capture_strategies.known_data_dependent(model)
                        ),
                        decisions=decisions,
                        special=special_branch,
                    )
                    trace_seconds = time.perf_counter() - traced_at - registration_seconds[0]
            except Exception as error:
                frame = user_frame(error)
                raise CaptureError(
                    f"{self.name} could not capture {type(model).__name__}: {type(error).__name__}: "
                    f"{_first_lines(str(error))}\n"
                    + (f"  from: {frame}\n" if frame else "")
                    + f"  inputs: {describe_inputs(args, kwargs)}\n"
                    f"  remedy: {_capture_remedy(error, self.strict)}"
                    + "".join(f"\n  {note}" for note in getattr(error, "__notes__", [])),
                    frame=frame,
                ) from error
            if dynamic_shapes is not None and special_branch is None and not size_one_branch:
                size_one_verdicts = general_branch_at_size_one(
                    program, model, args, kwargs, assertion_lines, dynamic_shapes
                )
            if decisions and special_branch is None:
                # the export may capture the special branch too, and then says so: it warns once it knows
                pending_warning = (attempts, stand_ins_used)
            elif special_branch is None and not size_one_branch:  # a special capture is reported with the general one
                capture_strategies.warn_if_assumed(attempts, assumptions, stand_ins_used)

        def finished(exported: ExportedProgram) -> CapturedGraph:
            """The captured graph of `exported`, with what this capture recorded on the way (one place for the
            three ways it ends: as captured, decomposed locally, decomposed whole)."""
            made = from_exported_program(exported, self.name)
            made.seconds = time.perf_counter() - start
            made.trace_seconds = trace_seconds
            made.shape_fixes = shape_fixes
            made.assumptions = [str(assumption) for assumption in assumptions]
            made.assertion_lines = assertion_lines
            made.branch_decisions = decisions
            made.size_one_verdicts = size_one_verdicts
            made.pending_warning = pending_warning
            return made

        if self.registry is not None:
            flatten_sparse_inputs(program, flatten_inputs(program.call_spec.in_spec, args, kwargs), self.registry)
        refuse_sparse_tensors(program.graph_module)
        before = _overloads(program.graph_module)
        if self.registry is not None and lowerable_as_captured(program, self.registry):
            # Decomposing would keep every op (the table leaves out what the registry lowers) and only
            # retrace the graph, which costs more than torch.export itself on large models.
            captured = finished(program)
            captured.decomposition = DecompositionRecord("none", "the registry lowers every captured op")
            return captured
        decomposed_at = time.perf_counter()
        reason = "no registry says which ops to keep"
        if self.registry is not None:
            try:
                with static_fake_kernels():
                    record = decompose_locally(program, self.registry)
            except NeedsFullDecomposition as why:
                reason = str(why)
            else:
                # Only the nodes the registry cannot lower were replaced; retracing the whole program
                # (run_decompositions) would cost more than torch.export itself on large models.
                record.reason = "only the nodes the registry cannot lower"
                captured = finished(program)
                captured.decomposition_seconds = time.perf_counter() - decomposed_at
                captured.decomposed = sorted({target for _, target in record.nodes})
                captured.decomposition = record
                return captured
        # the retrace decides again what the capture decided: size-obliviously where it did (a dynamic dim whose
        # example is 1 would otherwise be specialized to 1 by a decomposition's contiguity or broadcast check)
        with static_fake_kernels(), symbolic_config.patch(backed_size_oblivious=_has_dynamic_dims(program)):
            program = program.run_decompositions(dict(decompositions))
            if self.registry is not None:
                # What neither the registry nor torch's default table handles: decompose with torch's full table.
                extra = fallback_decompositions(program.graph_module, self.registry)
                if extra:
                    program = program.run_decompositions(extra)
        decomposition_seconds = time.perf_counter() - decomposed_at
        after = _overloads(program.graph_module)
        captured = finished(program)
        captured.decomposition_seconds = decomposition_seconds
        captured.decomposed = sorted(before - after)
        captured.decomposition = DecompositionRecord("full", reason)
        return captured


def _exporting() -> bool:
    return True


@contextlib.contextmanager
def onnx_export_flag() -> Iterator[None]:
    """``torch.onnx.is_in_onnx_export()`` returns True while fx2onnx captures, as in torch's exporters.

    The flag that function reads lives in ``torch.onnx._internal`` (no public setter in torch 2.13), which
    fx2onnx does not import. Instead, for the capture's duration, the public function's code answers True, so that
    a name imported before the export (``from torch.onnx import is_in_onnx_export``, as mmdet and quantization
    toolkits do: the same function object) answers True too; and ``torch.onnx.is_in_onnx_export`` names a new
    function, which torch.export's strict mode inlines (Dynamo answers False for the function objects its tables
    hold, torch's own among them, whatever their code, as it does under torch.onnx.export).
    """
    import torch.onnx

    function = torch.onnx.is_in_onnx_export
    if getattr(function, "_fx2onnx_capturing", False):  # a nested export: already set
        yield
        return

    def is_in_onnx_export() -> bool:  # a new object per capture: in no table of Dynamo's
        return True

    is_in_onnx_export._fx2onnx_capturing = True  # type: ignore[attr-defined]
    is_in_onnx_export.__doc__ = function.__doc__
    original = function.__code__
    swap = not original.co_freevars  # a user's stand-in closure cannot take other code
    if swap:
        function.__code__ = _exporting.__code__
    torch.onnx.is_in_onnx_export = is_in_onnx_export
    try:
        yield
    finally:
        torch.onnx.is_in_onnx_export = function
        if swap:
            function.__code__ = original


class SymbolicTraceExtractor:
    """``torch.fx.symbolic_trace`` then ``make_fx`` to ATen, for models torch.export rejects.

    Shapes are static: the graph is specialised to the example inputs.
    """

    name = "symbolic_trace"

    def capture(
        self,
        model: torch.nn.Module | ExportedProgram,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        dynamic_shapes: Any,
        decompositions: Mapping[Any, Callable[..., Any]],
        special_branch: capture_strategies.BranchDecision | None = None,
        size_one_branch: bool = False,
    ) -> CapturedGraph:
        """`special_branch`, `size_one_branch`: never asked of this extractor, whose capture takes no size-oblivious
        decision (its shapes are static)."""
        from torch.fx.experimental.proxy_tensor import make_fx

        if isinstance(model, ExportedProgram):
            raise CaptureError("symbolic_trace takes an nn.Module, not an ExportedProgram")
        if dynamic_shapes is not None:
            raise CaptureError("symbolic_trace captures static shapes only; use the torch.export extractor")
        start = time.perf_counter()
        try:
            traced = torch.fx.symbolic_trace(model)
        except Exception as error:  # data-dependent control flow, unsupported Python
            raise CaptureError(
                f"torch.fx.symbolic_trace could not trace {type(model).__name__}: {type(error).__name__}: "
                f"{_first_lines(str(error))}\n  remedy: use the torch.export extractor (the default), strict or not."
            ) from error
        named_weights = dict(model.named_parameters()) | dict(model.named_buffers())
        names = list(named_weights)
        flat_inputs, in_spec = pytree.tree_flatten((args, kwargs))

        def run(weights: list[torch.Tensor], *flat: Any) -> Any:
            call_args, call_kwargs = pytree.tree_unflatten(list(flat), in_spec)
            state = dict(zip(names, weights))
            return torch.func.functional_call(traced, state, call_args, call_kwargs)

        try:
            with torch.no_grad():
                aten = make_fx(run, decomposition_table=dict(decompositions), tracing_mode="fake")(
                    list(named_weights.values()), *flat_inputs
                )
                eager_out = traced(*args, **kwargs)
        except Exception as error:
            raise CaptureError(
                f"symbolic_trace could not lower {type(model).__name__} to ATen: {type(error).__name__}: "
                f"{_first_lines(str(error))}\n  remedy: use the torch.export extractor (the default)."
            ) from error
        _, out_spec = pytree.tree_flatten(eager_out)
        placeholders = [n for n in aten.graph.nodes if n.op == "placeholder"]
        weight_nodes = placeholders[: len(names)]
        input_nodes = placeholders[len(names) :]
        weights = {
            node: (name, tensor.detach()) for node, name, tensor in zip(weight_nodes, names, named_weights.values())
        }
        user_inputs, constants = [], {}
        for node, value in zip(input_nodes, flat_inputs):
            if isinstance(value, torch.Tensor):
                user_inputs.append(node)
            else:
                constants[node] = value
        output = next(n for n in aten.graph.nodes if n.op == "output")
        user_outputs = list(pytree.tree_leaves(output.args[0]))
        seconds = time.perf_counter() - start
        return CapturedGraph(
            graph_module=aten,
            user_inputs=user_inputs,
            constant_inputs=constants,
            weights=weights,
            user_outputs=user_outputs,
            in_spec=in_spec,
            out_spec=out_spec,
            exported_program=None,
            strategy=self.name,
            seconds=seconds,
            trace_seconds=seconds,  # make_fx traces and decomposes in one go
            decomposition=DecompositionRecord("full", "symbolic_trace: make_fx decomposes as it traces"),
        )


EXTRACTORS: dict[str, Callable[[bool, Registry], Extractor]] = {
    "torch.export": lambda strict, registry: TorchExportExtractor(strict, registry),
    "symbolic_trace": lambda strict, registry: SymbolicTraceExtractor(),
}


def _decomposed_from(node: torch.fx.Node) -> str | None:
    """The op of the original graph (the root of the node's provenance) that a decomposition put `node` in for."""
    sources = list(node.meta.get("from_node") or [])
    root = None
    while sources:
        source = sources[0]
        if str(source.target).startswith("aten."):
            root = str(source.target)
        sources = list(source.from_node or [])
    return root


def _effect_token_message(graph_module: torch.fx.GraphModule, placeholder: str) -> str:
    """Which ops put an effect token (eager's error checks, prints...) in the graph, and the way out."""
    sources: dict[str, str] = {}
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.higher_order.with_effects:
            effect = str(node.args[1]) if len(node.args) > 1 else "an effectful op"
            sources.setdefault(_decomposed_from(node) or effect, effect)
    if not sources:
        return f"placeholder {placeholder} of kind TOKEN is not supported (an effectful op: ONNX has no side effects)"
    described = ", ".join(f"{op} (through {effect})" for op, effect in sources.items())
    first = next(iter(sources))
    qualified = first.replace("aten.", "aten::", 1) if first.startswith("aten.") else first
    name = qualified.split("::")[-1].split(".")[0]
    return (
        f"the graph threads an effect token ({placeholder}), which ONNX has no equivalent of: {described}. fx2onnx "
        f"has no lowering for {first}, so it was decomposed, and the decomposition checks errors through an effect. "
        f"Register an implementation so that it is kept whole: "
        f"fx2onnx.register('{qualified.rsplit('.', 1)[0] if qualified.endswith('.default') else qualified}', "
        f"my_{name}) or export(..., custom_translation_table={{torch.ops.{first}: my_{name}}})"
    )


def from_exported_program(program: ExportedProgram, strategy: str) -> CapturedGraph:
    graph_module = program.graph_module
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    signature = program.graph_signature
    state = program.state_dict
    constants = program.constants
    user_inputs: list[torch.fx.Node] = []
    constant_inputs: dict[torch.fx.Node, Any] = {}
    weights: dict[torch.fx.Node, tuple[str, torch.Tensor]] = {}
    for node, spec in zip(placeholders, signature.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            val = node.meta.get("val")
            if isinstance(val, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
                user_inputs.append(node)
            else:
                constant_inputs[node] = getattr(spec.arg, "value", val)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            target = spec.target
            tensor = state[target] if target in state else constants[target]
            weights[node] = (target, tensor.detach())
        elif spec.kind == InputKind.TOKEN:
            raise CaptureError(_effect_token_message(graph_module, node.name))
        else:
            raise CaptureError(f"placeholder {node.name} of kind {spec.kind.name} is not supported")
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    user_outputs = [
        arg for arg, spec in zip(output.args[0], signature.output_specs) if spec.kind == OutputKind.USER_OUTPUT
    ]
    return CapturedGraph(
        graph_module=graph_module,
        user_inputs=user_inputs,
        constant_inputs=constant_inputs,
        weights=weights,
        user_outputs=user_outputs,
        in_spec=program.call_spec.in_spec,
        out_spec=program.call_spec.out_spec,
        exported_program=program,
        strategy=strategy,
    )


def static_dynamic_dims(
    captured: CapturedGraph, requested: Mapping[tuple[int, int], Any], flat_inputs: list[Any]
) -> list[str]:
    """The dims `dynamic_shapes` asked to be dynamic that the captured graph has static or derived from others."""
    paths = input_paths(captured.in_spec, len(flat_inputs))
    found = []
    tensors = [(path, x) for path, x in zip(paths, flat_inputs) if isinstance(x, torch.Tensor)]
    for node, (path, example) in zip(captured.user_inputs, tensors):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for index, size in enumerate(val.shape):
            if (id(example), index) not in requested:
                continue
            if not isinstance(size, torch.SymInt):
                found.append(f"static (the model's code specializes it): {path} dim {index} = {size}")
            elif not isinstance(size.node.expr, sympy.Symbol) and not _declared_or_fixed(
                requested[(id(example), index)], captured.shape_fixes
            ):  # tied to other dims by the model's code: an expression of them
                found.append(f"derived from other dims by the model's code: {path} dim {index} = {size.node.expr}")
    return found


def _declared_or_fixed(spec: Any, shape_fixes: Sequence[str]) -> bool:
    """Whether a dim's relation to others is `dynamic_shapes`' own (a derived ``Dim("past") + 1``) or one of
    torch.export's suggested fixes applied (``total = past + 1``, said in its own line)."""
    if isinstance(spec, torch.export.dynamic_shapes._DerivedDim):
        return True
    name = getattr(spec, "__name__", None)
    return name is not None and any(fix.split(" = ")[0] == name for fix in shape_fixes)


def _overloads(graph_module: torch.fx.GraphModule) -> set[str]:
    return {
        qualified_name(n.target)
        for n in graph_module.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    }


def describe_inputs(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    leaves = pytree.tree_leaves((args, dict(kwargs)))
    return ", ".join(
        f"{x.dtype} {tuple(x.shape)}".replace("torch.", "") if isinstance(x, torch.Tensor) else repr(x) for x in leaves
    )


# A sparse input's parts, by layout, in the order they become graph inputs (`<name>_crow_indices`...); `ONNXProgram`
# splits a sparse tensor it is given in the same order (a COO tensor's `_indices()`/`_values()`: uncoalesced ones
# too). The placeholders of the parts carry SPARSE_PART in their meta.
SPARSE_PARTS = {torch.sparse_csr: ("crow_indices", "col_indices", "values"), torch.sparse_coo: ("indices", "values")}
SPARSE_PART = "fx2onnx_sparse_part"  # node.meta key: (part's position, the sparse input's name)
# Ops reading a sparse matrix as their first argument that are computed on its parts: sparse @ dense
_SPARSE_MATMULS = frozenset(
    {
        aten._sparse_mm.reduce,
        aten._sparse_mm.default,
        aten.mm.default,
        aten.matmul.default,
    }
)


def sparse_part(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """One of SPARSE_PARTS of a sparse tensor (a COO tensor's indices and values as stored, coalesced or not)."""
    if tensor.layout == torch.sparse_coo:
        return tensor._indices() if name == "indices" else tensor._values()
    return getattr(tensor, name)()


def _mm_reduce_on_rows(
    rows_of_values: torch.Tensor,
    columns: torch.Tensor,
    values: torch.Tensor,
    other: torch.Tensor,
    reduce: str,
    rows: int,
) -> torch.Tensor:
    """``sparse @ other`` reduced by `reduce` from the stored elements (their rows, columns, values), with dense ops:
    each stored element's product with its row of `other`, reduced into its row (a row with no stored element gives
    0, as eager). float16/bfloat16 compute in float32 and round once, as eager's kernel."""
    dtype = other.dtype
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    products = other.to(compute).index_select(0, columns.long()) * values.to(compute).unsqueeze(1)
    index = rows_of_values.long().unsqueeze(1).expand(-1, other.shape[1])
    result = torch.zeros(rows, other.shape[1], dtype=compute, device=other.device)
    return result.scatter_reduce(0, index, products, reduce, include_self=False).to(dtype)


def _csr_mm_reduce(
    crow_indices: torch.Tensor,
    col_indices: torch.Tensor,
    values: torch.Tensor,
    other: torch.Tensor,
    reduce: str,
    rows: int,
) -> torch.Tensor:
    """``torch.sparse.mm(csr, other, reduce)`` on the CSR tensor's parts: each stored element's row from the row
    pointers."""
    counts = (crow_indices[1:] - crow_indices[:-1]).long()
    row_of_each = torch.repeat_interleave(torch.arange(rows, device=other.device), counts, output_size=values.shape[0])
    return _mm_reduce_on_rows(row_of_each, col_indices, values, other, reduce, rows)


def _coo_mm_reduce(
    indices: torch.Tensor, values: torch.Tensor, other: torch.Tensor, reduce: str, rows: int
) -> torch.Tensor:
    """``coo @ other`` on the COO tensor's parts (duplicate positions of an uncoalesced tensor add up, as eager)."""
    return _mm_reduce_on_rows(indices[0], indices[1], values, other, reduce, rows)


def _is_dense_matrix(arguments: tuple[Any, ...]) -> bool:
    """Whether `arguments` holds one FX node whose value is a dense 2-D tensor (not a vector, a batch, a sparse one)."""
    value = arguments[0].meta.get("val") if arguments and isinstance(arguments[0], torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and value.layout == torch.strided and value.dim() == 2


def _stored_elements(fake_mode: Any, name: str, example: int) -> int | torch.SymInt:
    """The number of stored elements of a sparse input as a dynamic size (the ONNX model takes any), with the
    example's count as its hint; the example's count itself when the graph has no symbolic shapes."""
    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None:
        return example
    from torch._dynamo.source import LocalSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    source = LocalSource(name)
    symbol = shape_env.create_symbol(example, source=source, dynamic_dim=DimDynamic.DYNAMIC)
    return shape_env.create_symintnode(symbol, hint=example, source=source)


def flatten_sparse_inputs(program: ExportedProgram, flat_inputs: list[Any], registry: Registry) -> None:
    """Give each sparse CSR (COO) 2-D user input of `program` as its parts, in place: dense graph inputs named
    ``<name>_crow_indices``, ``<name>_col_indices``, ``<name>_values`` (``<name>_indices``, ``<name>_values``), when
    every op reading it is a product with a dense matrix (``torch.sparse.mm(x, dense[, reduce])``, ``torch.mm``, ``@``),
    which is rewritten with index ops on the parts. Other sparse inputs are left for :func:`refuse_sparse_tensors`.

    The number of stored elements is a dynamic size (torch.export's fake sparse tensors hold none): the ONNX model
    takes any number; the rows are the example's.
    """
    graph = program.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    specs = program.graph_signature.input_specs
    user_index = -1
    replaced: dict[int, list[InputSpec]] = {}
    for position, (node, spec) in enumerate(zip(placeholders, specs)):
        if spec.kind != InputKind.USER_INPUT:
            continue
        user_index += 1
        value = node.meta.get("val")
        layout = getattr(value, "layout", torch.strided)
        if layout not in SPARSE_PARTS or value.dim() != 2:
            continue
        example = flat_inputs[user_index] if user_index < len(flat_inputs) else None
        readers = list(node.users)
        if not isinstance(example, torch.Tensor) or example.dense_dim() != 0 or not readers:
            continue  # a hybrid tensor (values with dims of their own) is refused
        if not all(r.target in _SPARSE_MATMULS and r.args[0] is node and _is_dense_matrix(r.args[1:]) for r in readers):
            continue
        fake_mode = torch._guards.detect_fake_mode([value])
        if fake_mode is None:
            continue
        stored = _stored_elements(fake_mode, f"{node.name}_values", int(sparse_part(example, "values").shape[0]))
        parts = []
        with graph.inserting_before(node):
            for index, part_name in enumerate(SPARSE_PARTS[layout]):
                part = graph.placeholder(f"{node.name}_{part_name}")
                real = sparse_part(example, part_name)
                shape = [*real.shape[:-1], stored] if part_name != "crow_indices" else list(real.shape)
                with fake_mode:
                    part.meta["val"] = torch.empty(shape, dtype=real.dtype)
                part.meta[SPARSE_PART] = (index, node.name)
                parts.append(part)
        on_parts = _csr_mm_reduce if layout == torch.sparse_csr else _coo_mm_reduce
        for reader in readers:
            reduce = reader.args[2] if reader.target is aten._sparse_mm.reduce else "sum"
            with graph.inserting_before(reader):
                rewritten = graph.call_function(on_parts, (*parts, reader.args[1], reduce, int(value.shape[0])))
            rewritten.meta.update(reader.meta)
            reader.replace_all_uses_with(rewritten)
            graph.erase_node(reader)
            try:
                _splice_decomposition(graph, rewritten, local_decomposition_table(registry), registry)
            except NeedsFullDecomposition as why:
                raise CaptureError(
                    f"{target_name(reader.target)} of the sparse input `{node.name}` could not be computed on its "
                    f"parts: {why}"
                ) from None
        graph.erase_node(node)
        replaced[position] = [
            InputSpec(kind=InputKind.USER_INPUT, arg=TensorArgument(name=part.name), target=None) for part in parts
        ]
    if replaced:
        program.graph_signature.input_specs[:] = [
            new for position, spec in enumerate(specs) for new in replaced.get(position, [spec])
        ]
        graph.lint()
        program.graph_module.recompile()


def recompile_when_read(graph_module: torch.fx.GraphModule) -> None:
    """``graph_module.recompile()`` deferred until its code is read, printed or run (as torch's ``_LazyGraphModule``
    defers it): after capture, the export reads only the graph, and generating and compiling the Python code of a
    transformer's graph costs ~50 ms an edit (hf-t5: local decomposition, then promotion). Its pytree specs are set
    at once, as ``recompile`` sets them. A module whose class is not its own (``GraphModule.__new__`` gives each
    instance a class, where ``recompile`` installs its ``forward``) is recompiled now."""
    cls = type(graph_module)
    if cls.__qualname__.split(".")[-1] != "GraphModuleImpl" or not issubclass(cls, torch.fx.GraphModule):
        graph_module.recompile()
        return
    codegen = graph_module.graph._codegen
    if isinstance(codegen, torch.fx.graph._PyTreeCodeGen):
        graph_module._in_spec = codegen.pytree_info.in_spec
        graph_module._out_spec = codegen.pytree_info.out_spec
    cls.forward = _recompile_then_forward  # recompile() replaces it: the module's code is current again
    cls.code = _code_when_read
    cls.__str__ = _str_when_read


def _code_is_stale(graph_module: torch.fx.GraphModule) -> bool:
    return type(graph_module).__dict__.get("forward") is _recompile_then_forward


def _recompile_if_stale(graph_module: torch.fx.GraphModule) -> None:
    if _code_is_stale(graph_module):
        graph_module.recompile()


def _recompile_then_forward(self: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
    self.recompile()
    return self(*args, **kwargs)


@property  # type: ignore[misc]
def _code_when_read(self: torch.fx.GraphModule) -> str:
    _recompile_if_stale(self)
    return torch.fx.GraphModule.code.fget(self)  # type: ignore[attr-defined]


def _str_when_read(self: torch.fx.GraphModule) -> str:
    _recompile_if_stale(self)
    return torch.fx.GraphModule.__str__(self)


def refuse_sparse_tensors(graph_module: torch.fx.GraphModule) -> None:
    """A sparse tensor anywhere in the graph (an input, or an op's result) is refused before dispatch, naming the
    value, the first op reading it and the user's line.

    An ONNX graph's inputs and values are dense (ONNX has sparse initializers only) and ONNX Runtime's CPU kernels
    compute on dense tensors; a sparse input has no place among the model's inputs that ``program(...)`` could feed
    either. Giving its indices and values as separate dense inputs is the way out (the user's code then states the
    layout), which is why fx2onnx does not choose a layout for them silently.
    """
    for node in graph_module.graph.nodes:
        value = node.meta.get("val")
        layout = getattr(value, "layout", torch.strided)
        if layout == torch.strided:
            continue
        reader = next(iter(node.users), None)
        at = reader if node.op == "placeholder" and reader is not None else node
        target = qualified_name(at.target) if at.op == "call_function" else None
        what = f"input `{node.name}`" if node.op == "placeholder" else f"the result of {qualified_name(node.target)}"
        read = f", read by {target}" if node.op == "placeholder" and target else ""
        message = (
            f"{what} is a sparse tensor ({layout}, shape {list(value.shape)}, {value.dtype}){read}: fx2onnx exports "
            "dense tensors only (ONNX graph inputs and values are dense; ONNX Runtime's CPU kernels compute on "
            "dense tensors)\n"
            + (f"  from: {line}\n" if (line := source_line(at)) else "")
            + "  remedy: give the model the dense tensor (`x.to_dense()`) and compute densely (torch.mm; a masked "
            "amax/amin/mean), or give it the sparse tensor's parts (`x.crow_indices()`, `x.col_indices()`, "
            "`x.values()` for CSR) as three tensors and compute with index ops (repeat_interleave, index_select, "
            "scatter_reduce), which fx2onnx exports"
        )
        raise CaptureError(message, node=at.name, target=target, stack_trace=at.meta.get("stack_trace"))


def _capture_remedy(error: Exception, strict: bool) -> str:
    """What to try after torch.export failed with `error`."""
    if "tensor_split_tensor_indices_or_sections" in str(error):  # torch's decomposition names itself in the error
        return (
            "aten::tensor_split.tensor_indices_or_sections was given a 0-d tensor: the number of sections, and so "
            "the number of outputs, would come from a tensor's value, and an ONNX graph has a fixed number of "
            "outputs. Pass the number of sections as a Python int, or split at a 1-D tensor of indices (exported "
            "with its split points read at run time)."
        )
    text = "\n".join([str(error), *getattr(error, "__notes__", [])])
    if "Could not extract specialized integer from data-dependent expression" in text:
        # Python asked a data-dependent size as an int: unbind/chunk/split's number of outputs, len(), range()
        asked_in = re.search(r"Caused by: \([^()]* in (\w+)\)", text)
        op = asked_in.group(1) if asked_in else None
        return (
            (f"aten::{op}: " if op and hasattr(torch.ops.aten, op) else "")
            + "Python needs a data-dependent size as an int here (the number of outputs of unbind, chunk or split, "
            "len(), range()), and an ONNX graph has a fixed number of outputs. Bound the size first: slice to at "
            "most K (kept[:K], whose count is taken as K and checked at run time by the ONNX model), or keep the "
            "tensor whole (index it, or reduce over the dim, instead of unbinding it)."
        )
    if "data-dependent" in str(error) or "DataDependent" in type(error).__name__:
        # Neither mode nor symbolic_trace can follow Python control flow on a tensor's value.
        return (
            "the model decides something in Python from a tensor's value (the line above). Make it a graph op: "
            "torch.where(...) for an elementwise choice, torch.cond(pred, true_fn, false_fn, operands) for a branch "
            "(exported as an ONNX If), or state the assumption with torch._check(...) (see torch.export's "
            "'data-dependent' documentation)."
        )
    if "Constraints violated" in str(error):
        # The model's code constrains a dynamic dim more than `dynamic_shapes` says; torch prints the fixed Dims.
        return (
            "the dims in `dynamic_shapes` admit sizes the model's code does not: apply torch.export's "
            "'Suggested fixes' (printed by torch.export; TORCH_LOGS='+dynamic' shows where each guard comes from), "
            "or give those dims as torch.export.Dim.AUTO."
        )
    return f"try strict={not strict}, extractor='symbolic_trace', or fix the graph break named above."


def _first_lines(text: str, count: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[:count])
