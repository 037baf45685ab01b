"""Control flow: ``torch.cond`` -> ONNX ``If``, ``while_loop`` -> ``Loop``, ``scan``/``map`` -> ``Scan``.

torch.export captures each body (a branch, a loop's condition and body, a scan's combine function) as a
sub-GraphModule that the higher-order node reaches through a ``get_attr``. Each body is emitted by a nested
walk of the same emitter (:class:`ScopeEmitter`): its nodes are dispatched by the export's dispatcher, run
under a recorder writing into an ``onnx_ir`` subgraph, and get eager's dtypes and shapes from their
``meta["val"]``, as the main graph's do (type promotion ran on the bodies too, see ``passes``). A body's
placeholders are bound to the values the higher-order node passes: outer-scope values of the enclosing graph,
or the subgraph's own inputs for loop-carried and scanned values. Its outputs are cast to the dtypes eager
gives the higher-order node's results, so both branches of an ``If`` agree in type. Weights used in a body
stay initializers of the main graph, which subgraphs read from the outer scope.

Nested control flow nests walks. Legalization, the optimizer and the checker walk into the subgraphs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import onnx_ir as ir
import torch
import torch.fx
import torch.utils._pytree as pytree
from onnxscript.values import Opset, TracedOnnxFunction

from fx2onnx import _complex_layout as complex_layout
from fx2onnx import _dtypes as dtypes
from fx2onnx._dispatch import Candidate, DispatchDecision
from fx2onnx._emit.graph_builder import GraphEmitter, _meta_dtype, value_dtype
from fx2onnx._records import FX_NODE, qualified_name
from fx2onnx._registry import Implementation
from fx2onnx._weight_reads import weight_tensor
from fx2onnx.errors import LoweringError, UnsupportedOperatorError, source_line

higher_order = torch.ops.higher_order
_SCALAR_BOOL = torch.empty((), dtype=torch.bool, device="meta")
_SCALAR_INT64 = torch.empty((), dtype=torch.int64, device="meta")


# --- the nested walk ----------------------------------------------------------------------------------
class ScopeEmitter(GraphEmitter):
    """Emits one body (a sub-GraphModule) into `graph`, its placeholders bound to `inputs`.

    `path` prefixes the FX node names in dispatch decisions, Cast records, errors and the ONNX nodes'
    metadata (``true_graph_0.sin``: the body's attribute path in the captured module); `value_prefix`
    prefixes the ONNX value names (a body emitted twice, like a loop's condition, needs two).
    """

    def __init__(
        self,
        parent: GraphEmitter,
        graph_module: torch.fx.GraphModule,
        graph: ir.Graph,
        inputs: Sequence[Any],
        *,
        path: str,
        value_prefix: str | None = None,
    ) -> None:
        captured = dataclasses.replace(
            parent.captured, graph_module=graph_module, user_inputs=[], constant_inputs={}, weights={}, user_outputs=[]
        )
        super().__init__(captured, parent.dispatcher, dim_names=parent.symbol_names, higher_order=parent.higher_order)
        self.parent = parent
        self.root_graph: ir.Graph = getattr(parent, "root_graph", parent.graph)
        self.path = path
        self.value_prefix = path if value_prefix is None else value_prefix
        # Shared with the enclosing emitter: one model, one record of Casts, one naming.
        self.graph = graph
        self.symbol_names = parent.symbol_names
        self.opset_imports = parent.opset_imports
        self.recorder = parent.recorder.nested(graph)
        self.casts = parent.casts
        self._named = parent._named
        self.skipped = parent.skipped
        self.inputs = list(inputs)
        self._bound = 0  # placeholders bound so far
        self.outputs: list[Any] = []

    def run_scope(self) -> list[Any]:
        """Walk the body; returns its outputs (ONNX values, or Python constants), flattened."""
        for node in self.captured.graph.nodes:
            getattr(self, node.op)(node)
        return self.outputs

    # --- node kinds ---------------------------------------------------------------------------------
    def placeholder(self, node: torch.fx.Node) -> None:
        if self._bound >= len(self.inputs):
            raise LoweringError(f"body {self.path.rstrip('.')} takes more inputs than its higher-order node passes")
        self.env[node] = self.inputs[self._bound]
        self._bound += 1

    def get_attr(self, node: torch.fx.Node) -> None:
        attribute = self.captured.graph_module
        for part in str(node.target).split("."):
            attribute = getattr(attribute, part)
        if not isinstance(attribute, torch.Tensor):
            self.env[node] = attribute  # a nested body
            return
        # A constant (type promotion folds small casts into some): an initializer of the main graph.
        name = f"{self.value_prefix}{node.target}"
        tensor = complex_layout.as_real(attribute.detach()).contiguous()
        value = ir.Value(
            name=name,
            type=ir.TensorType(dtypes.to_onnx(tensor.dtype)),
            shape=ir.Shape(tuple(tensor.shape)),
            const_value=weight_tensor(tensor, name),
        )
        self.root_graph.register_initializer(value)
        self.env[node] = value

    def call_function(self, node: torch.fx.Node) -> None:
        decisions, casts = len(self.dispatcher.decisions), len(self.casts)
        try:
            super().call_function(node)
        except UnsupportedOperatorError as error:  # raised again, to name the node by its path
            if error.decision.node != node.name:
                raise  # a node of a nested body, already named
            self._name_by_path(node, decisions, casts)
            raise UnsupportedOperatorError(error.decision, error.where, node) from error.__cause__
        finally:
            self._name_by_path(node, decisions, casts)

    def output(self, node: torch.fx.Node) -> None:
        results = pytree.tree_leaves(node.args[0])
        self.outputs = [self.env[r] if isinstance(r, torch.fx.Node) else r for r in results]

    # --- naming -------------------------------------------------------------------------------------
    def _name_by_path(self, node: torch.fx.Node, decisions: int, casts: int) -> None:
        """This node's decision and Casts under its path (``true_graph_0.sin``), as in the model's metadata."""
        for decision in self.dispatcher.decisions[decisions:]:
            if decision.node == node.name:
                decision.node = f"{self.path}{node.name}"
        for record in self.casts[casts:]:
            if record.node == node.name:
                record.node = f"{self.path}{node.name}"

    def _finish_value(self, node: torch.fx.Node, value: ir.Value, val: Any, name: str) -> ir.Value:
        return super()._finish_value(node, value, val, f"{self.value_prefix}{name}")

    def _metadata(self, node: torch.fx.Node) -> dict[str, str]:
        metadata = super()._metadata(node)
        metadata[FX_NODE] = f"{self.path}{metadata[FX_NODE]}"
        return metadata


def emit_body(
    emitter: GraphEmitter,
    body: torch.fx.GraphModule,
    graph: ir.Graph,
    inputs: Sequence[Any],
    *,
    path: str,
    value_prefix: str | None = None,
) -> tuple[ScopeEmitter, list[Any]]:
    """Emit `body` into `graph` with its placeholders bound to `inputs`; returns the scope and its outputs."""
    prefix = _unique_prefix(emitter, path if value_prefix is None else value_prefix)
    scope = ScopeEmitter(emitter, body, graph, inputs, path=path, value_prefix=prefix)
    return scope, scope.run_scope()


def _unique_prefix(emitter: GraphEmitter, prefix: str) -> str:
    """`prefix`, or `prefix` numbered if a body was emitted under it already (one body reached by two nodes)."""
    main = emitter
    while isinstance(main, ScopeEmitter):
        main = main.parent
    used: set[str] = main.__dict__.setdefault("_body_prefixes", set())  # for the whole model
    unique, count = prefix, 1
    while unique in used:
        count += 1
        unique = f"{prefix.rstrip('.')}#{count}."
    used.add(unique)
    return unique


# --- torch.cond -> If ---------------------------------------------------------------------------------
def emit_cond(emitter: GraphEmitter, node: torch.fx.Node) -> tuple[Any, ...]:
    """``cond(pred, true_graph, false_graph, operands)``: an ``If`` whose branches read the operands from the
    enclosing scope."""
    _record_decision(emitter, node, "If")
    pred, true_ref, false_ref, operands = _arguments(node, ("pred", "true_fn", "false_fn", "operands"))
    inputs = _values(emitter, operands)
    vals = _node_vals(node)
    branches = []
    for attribute, reference in (("then_branch", true_ref), ("else_branch", false_ref)):
        path = _body_path(emitter, reference)
        graph = ir.Graph([], [], nodes=[], name=f"{node.name}_{attribute}")
        scope, results = emit_body(emitter, _module(emitter, reference), graph, inputs, path=path)
        _check_count(node, path, results, vals)
        names = [f"output_{i}" for i in range(len(vals))]
        graph.outputs.extend(_as_outputs(scope, node, results, vals, names))
        branches.append(ir.AttrGraph(attribute, graph))
    with emitter.recorder.recording(emitter._metadata(node)):
        condition = _as_bool(emitter, node, pred)
        outputs = emitter.recorder.add_node("", "If", [condition], branches, len(vals), infer=False)
    return _finish(emitter, node, outputs)


# --- while_loop -> Loop -----------------------------------------------------------------------------
def emit_while_loop(emitter: GraphEmitter, node: torch.fx.Node) -> tuple[Any, ...]:
    """``while_loop(cond_graph, body_graph, carried, additional)``: a ``Loop`` without a trip count.

    ONNX's Loop reads a condition before the first iteration and one at the end of each: the condition's body
    is emitted twice, in the enclosing graph on the initial values and in the loop's body on the new ones.
    """
    _record_decision(emitter, node, "Loop")
    cond_ref, body_ref, carried, additional = _arguments(
        node, ("cond_fn", "body_fn", "carried_inputs", "additional_inputs")
    )
    cond_module, body_module = _module(emitter, cond_ref), _module(emitter, body_ref)
    cond_path, body_path = _body_path(emitter, cond_ref), _body_path(emitter, body_ref)
    carried_vals = _placeholder_vals(body_module)[: len(_values(emitter, carried))]
    initial = _typed_operands(emitter, node, _values(emitter, carried), carried_vals)
    extra = _values(emitter, additional)

    _, first = emit_body(emitter, cond_module, emitter.graph, [*initial, *extra], path=cond_path)
    _check_count(node, cond_path, first, [_SCALAR_BOOL])
    with emitter.recorder.recording(emitter._metadata(node)):
        condition = _as_bool(emitter, node, first[0])

    names = _placeholder_names(body_module)
    body_inputs = [
        _typed_input(emitter, f"{body_path}iteration", _SCALAR_INT64),
        _typed_input(emitter, f"{body_path}condition_in", _SCALAR_BOOL),
        *(_typed_input(emitter, f"{body_path}{name}", val) for name, val in zip(names, carried_vals)),
    ]
    graph = ir.Graph(body_inputs, [], nodes=[], name=f"{node.name}_body")
    scope, updated = emit_body(emitter, body_module, graph, [*body_inputs[2:], *extra], path=body_path)
    _check_count(node, body_path, updated, carried_vals)
    carried_out = _as_outputs(scope, node, updated, carried_vals, [f"carried_{i}" for i in range(len(updated))])
    prefix = f"{body_path}{cond_path}"
    _, again = emit_body(emitter, cond_module, graph, [*carried_out, *extra], path=cond_path, value_prefix=prefix)
    graph.outputs.extend([*_as_outputs(scope, node, again, [_SCALAR_BOOL], ["condition"]), *carried_out])
    with emitter.recorder.recording(emitter._metadata(node)):
        body = ir.AttrGraph("body", graph)
        outputs = emitter.recorder.add_node("", "Loop", [None, condition, *initial], [body], len(initial), infer=False)
    return _finish(emitter, node, outputs)


# --- scan / map -> Scan ------------------------------------------------------------------------------
def emit_scan(emitter: GraphEmitter, node: torch.fx.Node) -> tuple[Any, ...]:
    """``scan(combine_graph, init, xs, additional)``: a ``Scan`` over axis 0 (torch moved `dim` there and
    flipped `xs` for ``reverse``) carrying `init` and stacking the other results."""
    combine_ref, init, xs, additional = _arguments(node, ("combine_fn", "init", "xs", "additional_inputs"))
    return _emit_scan(emitter, node, combine_ref, _values(emitter, init), _values(emitter, xs), additional)


def emit_map(emitter: GraphEmitter, node: torch.fx.Node) -> tuple[Any, ...]:
    """``map_impl(body_graph, xs, args)``: a ``Scan`` without state over axis 0."""
    body_ref, xs, args = _arguments(node, ("f", "xs", "pos_args"))
    return _emit_scan(emitter, node, body_ref, [], _values(emitter, xs), args)


def _emit_scan(
    emitter: GraphEmitter, node: torch.fx.Node, reference: Any, states: list[Any], scanned: list[Any], extra: Any
) -> tuple[Any, ...]:
    _record_decision(emitter, node, "Scan")
    if not scanned:
        raise LoweringError(f"`{node.name}` scans no tensor (ONNX Scan needs one)\n  from: {source_line(node)}")
    body = _module(emitter, reference)
    path = _body_path(emitter, reference)
    count = len(states) + len(scanned)
    names, vals = _placeholder_names(body)[:count], _placeholder_vals(body)[:count]
    # The outer values: states as the body takes them, scanned tensors stacked along axis 0.
    operands = _typed_operands(emitter, node, [*states, *scanned], [*vals[: len(states)], *_no_val(scanned)])
    body_inputs = [_typed_input(emitter, f"{path}{name}", val) for name, val in zip(names, vals)]
    graph = ir.Graph(body_inputs, [], nodes=[], name=f"{node.name}_body")
    scope, results = emit_body(emitter, body, graph, [*body_inputs, *_values(emitter, extra)], path=path)
    node_vals = _node_vals(node)
    _check_count(node, path, results, node_vals)
    # State outputs have the state's type; a scanned output is one slice of the stacked result.
    result_vals = [*vals[: len(states)], *(_slice_val(v) for v in node_vals[len(states) :])]
    result_names = [f"state_{i}" for i in range(len(states))]
    result_names += [f"slice_{i}" for i in range(len(node_vals) - len(states))]
    graph.outputs.extend(_as_outputs(scope, node, results, result_vals, result_names))
    attributes = [ir.AttrGraph("body", graph), ir.AttrInt64("num_scan_inputs", len(scanned))]
    with emitter.recorder.recording(emitter._metadata(node)):
        outputs = emitter.recorder.add_node("", "Scan", operands, attributes, len(node_vals), infer=False)
    return _finish(emitter, node, outputs)


def _slice_val(val: Any) -> Any:
    return val[0] if isinstance(val, torch.Tensor) and val.dim() > 0 else val


def _no_val(values: Sequence[Any]) -> list[Any]:
    return [None] * len(values)


# --- shared ------------------------------------------------------------------------------------------
def _arguments(node: torch.fx.Node, names: Sequence[str]) -> list[Any]:
    """The higher-order node's arguments, by position or keyword."""
    found = list(node.args[: len(names)]) + [None] * max(0, len(names) - len(node.args))
    for index, name in enumerate(names):
        if name in node.kwargs:
            found[index] = node.kwargs[name]
    return found


def _values(emitter: GraphEmitter, arguments: Any) -> list[Any]:
    """The ONNX values (or Python constants) of a higher-order node's operand list."""
    if arguments is None:
        return []
    items = arguments if isinstance(arguments, (list, tuple)) else [arguments]
    return [emitter.env[a] if isinstance(a, torch.fx.Node) else a for a in items]


def _typed_operands(
    emitter: GraphEmitter, node: torch.fx.Node, values: Sequence[Any], vals: Sequence[Any]
) -> list[ir.Value]:
    """Operands as values of the enclosing graph (numbers become constants) of the dtype the body takes."""
    typed = []
    with emitter.recorder.recording(emitter._metadata(node)):
        for value, val in zip(values, vals):
            expected = _meta_dtype(val)
            if not isinstance(value, ir.Value):
                value = emitter.recorder.constant(value, expected)
            elif expected is not None and value.dtype not in (None, expected):
                value = emitter._cast(node, value, expected, "eager-dtype")
            typed.append(value)
    return typed


def _module(emitter: GraphEmitter, reference: Any) -> torch.fx.GraphModule:
    body = emitter.env.get(reference) if isinstance(reference, torch.fx.Node) else reference
    if not isinstance(body, torch.fx.GraphModule):
        raise LoweringError(f"expected a captured body (a GraphModule), got {type(body).__name__}")
    return body


def _body_path(emitter: GraphEmitter, reference: Any) -> str:
    """``outer.inner.``: where a body sits in the captured module (its get_attr target under the emitter's)."""
    name = str(reference.target) if isinstance(reference, torch.fx.Node) else "body"
    return f"{getattr(emitter, 'path', '')}{name}."


def _placeholder_vals(body: torch.fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in body.graph.nodes if n.op == "placeholder"]


def _placeholder_names(body: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in body.graph.nodes if n.op == "placeholder"]


def _node_vals(node: torch.fx.Node) -> list[Any]:
    val = node.meta.get("val")
    return list(val) if isinstance(val, (list, tuple)) else [val]


def _typed_input(emitter: GraphEmitter, name: str, val: Any) -> ir.Value:
    """A subgraph input with the dtype and shape of `val` (a body placeholder's example value)."""
    value = ir.Value(name=name)
    emitter._set_type(value, val)
    return value


def _check_count(node: torch.fx.Node, path: str, results: Sequence[Any], expected: Sequence[Any]) -> None:
    if len(results) != len(expected):
        raise LoweringError(
            f"body {path.rstrip('.')} of `{node.name}` ({qualified_name(node.target)}) returns {len(results)} "
            f"values where {len(expected)} are expected\n  from: {source_line(node)}"
        )


def _as_bool(emitter: GraphEmitter, node: torch.fx.Node, pred: Any) -> ir.Value:
    """A condition as a bool value (ONNX's If and Loop take nothing else)."""
    value = emitter.env[pred] if isinstance(pred, torch.fx.Node) else pred
    if not isinstance(value, ir.Value):
        value = emitter.recorder.constant(bool(value))
    if value.dtype != ir.DataType.BOOL:
        value = emitter._cast(node, value, ir.DataType.BOOL, "dispatch")
    return value


def _as_outputs(
    scope: ScopeEmitter, node: torch.fx.Node, values: Sequence[Any], vals: Sequence[Any], names: Sequence[str]
) -> list[ir.Value]:
    """A body's results as its graph's outputs: of eager's dtype and shape, produced inside it, each distinct.

    An output the body passes through (an outer value, a loop-carried input) gets an Identity.
    """
    outputs: list[ir.Value] = []
    with scope.recorder.recording(scope._metadata(node)):
        for value, val, name in zip(values, vals, names):
            expected = _meta_dtype(val)
            if not isinstance(value, ir.Value):
                value = scope.recorder.constant(value, expected)
            elif expected is not None and value.dtype not in (None, expected):
                value = scope._cast(node, value, expected, "eager-dtype")
            producer = value.producer()
            if producer is None or producer.graph is not scope.graph or any(value is o for o in outputs):
                (copy,) = scope.recorder.add_node("", "Identity", [value])
                copy.dtype = value.dtype
                copy.shape = ir.Shape(value.shape) if value.shape is not None else None
                value = copy
            scope._set_type(value, val)
            value.name = f"{scope.value_prefix}{name}"
            outputs.append(value)
    return outputs


def _finish(emitter: GraphEmitter, node: torch.fx.Node, outputs: Sequence[ir.Value]) -> tuple[Any, ...]:
    """The control-flow node's outputs with eager's dtypes, shapes and names."""
    finished = emitter._finish(node, tuple(outputs), reason_node=node)
    return finished if isinstance(finished, tuple) else (finished,)


def _record_decision(emitter: GraphEmitter, node: torch.fx.Node, op_type: str) -> None:
    """The higher-order node in the dispatch record: emitted by this module, not by a registry implementation."""
    implementation = Implementation(
        name=f"fx2onnx:control_flow ({op_type})", function=_CONTROL_FLOW_FUNCTION, source="fx2onnx"
    )
    input_dtypes = {
        f"arg{i}": dtypes.short_name(dtype) for i, a in enumerate(node.args) if (dtype := value_dtype(a)) is not None
    }
    candidate = Candidate(implementation, "perfect")
    decision = DispatchDecision(
        node=f"{getattr(emitter, 'path', '')}{node.name}",
        target=qualified_name(node.target),
        input_dtypes=input_dtypes,
        candidates=[candidate],
        chosen=candidate,
        stack_trace=node.meta.get("stack_trace"),
    )
    emitter.dispatcher.decisions.append(decision)


def _control_flow(*operands: Any) -> Any:
    """Stands for this module in dispatch records; never called (bodies are emitted by nested walks)."""
    raise NotImplementedError


_CONTROL_FLOW_FUNCTION = TracedOnnxFunction(Opset("pkg.fx2onnx", 1), _control_flow)

# Higher-order operator -> the function that emits it (GraphEmitter.call_function looks here first).
EMITTERS: dict[Any, Callable[[GraphEmitter, torch.fx.Node], tuple[Any, ...]]] = {
    higher_order.cond: emit_cond,
    higher_order.while_loop: emit_while_loop,
    higher_order.scan: emit_scan,
    higher_order.map_impl: emit_map,
}


__all__ = ["EMITTERS", "ScopeEmitter", "emit_body", "emit_cond", "emit_map", "emit_scan", "emit_while_loop"]
