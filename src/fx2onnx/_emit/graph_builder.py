"""Emit: walk the captured FX graph once and build an ``onnx_ir`` graph.

One method per FX node kind, as in ``torch.fx.Interpreter``. Each ``call_function`` node is
dispatched through the registry; the chosen implementation runs under the recorder, with Casts
inserted where the dispatcher chose a cast match; its outputs are then given eager's dtype (a
cast back where the implementation computed in another type) and eager's shape, taken from the
node's ``meta["val"]``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import onnx_ir as ir
import sympy
import torch
import torch.fx
from onnx_ir.tensor_adapters import TorchTensor

from fx2onnx import _complex_layout as complex_layout
from fx2onnx import _dtypes as dtypes
from fx2onnx._capture import CapturedGraph
from fx2onnx._dispatch import DispatchDecision, Dispatcher, value_dtype
from fx2onnx._emit.context import LoweringContext, context_key, context_rule
from fx2onnx._emit.recorder import GraphRecorder
from fx2onnx._progress import ExportProgress
from fx2onnx._records import BASE_OPSET, FX_NODE, NAMESPACE, STACK_TRACE, TARGET, CastRecord, schema_facts, target_name
from fx2onnx._torch_ops import aten
from fx2onnx._version import __version__
from fx2onnx._weight_reads import weight_tensor
from fx2onnx.errors import LoweringError, describe_value, source_line


@dataclasses.dataclass
class EmitResult:
    model: ir.Model
    decisions: list[DispatchDecision]
    casts: list[CastRecord]


# Emits a higher-order node (torch.cond...) with nested walks of the emitter; returns the node's outputs.
HigherOrderEmitter = Callable[["GraphEmitter", torch.fx.Node], tuple[Any, ...]]


class GraphEmitter:
    """Builds the ONNX graph for a :class:`CapturedGraph`."""

    def __init__(
        self,
        captured: CapturedGraph,
        dispatcher: Dispatcher,
        *,
        input_names: Sequence[str] | None = None,
        output_names: Sequence[str] | None = None,
        dim_names: Mapping[Any, str] | None = None,
        progress: ExportProgress | None = None,
        higher_order: Mapping[Any, HigherOrderEmitter] | None = None,
        fold_weights: bool = True,
    ) -> None:
        # Whether the weights' values are final: False when a checkpoint replaces them after emission (weights=).
        self.fold_weights = fold_weights
        self.progress = progress
        # Higher-order operator -> what emits it with nested walks (emit/control_flow.py's EMITTERS).
        self.higher_order: Mapping[Any, HigherOrderEmitter] = higher_order or {}
        self.captured = captured
        self.dispatcher = dispatcher
        self.input_names = list(input_names or [])
        self.output_names = list(output_names or [])
        self.symbol_names: dict[sympy.Symbol, str] = dict(dim_names or {})
        self.graph = ir.Graph([], [], nodes=[], name="main_graph")
        self.opset_imports: dict[str, int] = {"": BASE_OPSET}
        self.recorder = GraphRecorder(self.graph, self.opset_imports)
        self.recorder.fold_initializers = fold_weights
        self.env: dict[torch.fx.Node, Any] = {}
        self.casts: list[CastRecord] = []
        self._named: set[int] = set()  # ids of values named after an FX node
        self.skipped: list[str] = []  # FX nodes that need no ONNX (runtime assertions)
        # Positions of graph inputs/outputs holding complex values as (..., 2) real tensors (complex_layout).
        self.complex_inputs: list[int] = []
        self.complex_outputs: list[int] = []
        self.none_outputs: list[int] = []  # positions among the flat outputs of the Nones the model returns
        self._data_dependent_dims = data_dependent_dims(captured.graph)
        self._pinned_symbols = {symbol for dims in self._data_dependent_dims.values() for symbol in dims.values()}

    # --- driver ---------------------------------------------------------------------------------
    def run(self) -> EmitResult:
        nodes: Iterable[torch.fx.Node] = self.captured.graph.nodes
        if self.progress is not None:
            nodes = self.progress.items(nodes, unit="node")
        for node in nodes:
            getattr(self, node.op)(node)
        if self.fold_weights:
            _fold_weight_transposes(self.graph)
        _remove_unused_constants(self.graph)
        model = ir.Model(
            self.graph,
            ir_version=8,
            producer_name="fx2onnx",
            producer_version=__version__,
            functions=list(self.recorder.functions.values()),
        )
        self.graph.opset_imports.update(self.opset_imports)
        complex_layout.record(model, self.complex_inputs, self.complex_outputs, self.none_outputs)
        return EmitResult(model, self.dispatcher.decisions, self.casts)

    # --- node kinds -----------------------------------------------------------------------------
    def placeholder(self, node: torch.fx.Node) -> None:
        if node in self.captured.weights:
            name, tensor = self.captured.weights[node]
            tensor = complex_layout.as_real(tensor)
            if not tensor.is_contiguous():
                tensor = tensor.contiguous()
            value = ir.Value(
                name=name,
                type=ir.TensorType(dtypes.to_onnx(tensor.dtype)),
                shape=ir.Shape(tuple(tensor.shape)),
                const_value=weight_tensor(tensor, name),
            )
            self.graph.register_initializer(value)
        elif node in self.captured.constant_inputs:
            value = self.captured.constant_inputs[node]
        else:
            index = len(self.graph.inputs)
            name = self.input_names[index] if index < len(self.input_names) else node.name
            value = ir.Value(name=name)
            self._set_type(value, node.meta.get("val"))
            if _is_complex(node.meta.get("val")):
                self.complex_inputs.append(index)
            self.graph.inputs.append(value)
            self._named.add(id(value))
        self.env[node] = value

    def get_attr(self, node: torch.fx.Node) -> None:
        attribute = self.captured.graph_module
        for part in str(node.target).split("."):
            attribute = getattr(attribute, part)
        if isinstance(attribute, torch.Tensor):
            tensor = complex_layout.as_real(attribute.detach()).contiguous()
            value = ir.Value(
                name=str(node.target),
                type=ir.TensorType(dtypes.to_onnx(tensor.dtype)),
                shape=ir.Shape(tuple(tensor.shape)),
                const_value=weight_tensor(tensor, str(node.target)),
            )
            self.graph.register_initializer(value)
            self.env[node] = value
        else:
            self.env[node] = attribute  # a submodule (e.g. a higher-order op's body)

    def call_function(self, node: torch.fx.Node) -> None:
        if node.target is operator.getitem and isinstance(self.env.get(node.args[0]), (tuple, list)):
            self.env[node] = self.env[node.args[0]][node.args[1]]
            self._finish(node, self.env[node], reason_node=node)
            return
        if _is_runtime_check(node) and not _checked_at_run_time(node, self.dispatcher.registry):
            # Assertions torch.export leaves (shape/dtype/value checks) compute nothing an ONNX graph needs.
            self.env[node] = None
            self.skipped.append(node.name)
            return
        control_flow = self.higher_order.get(node.target)
        if control_flow is not None and not self.dispatcher.registry.is_registered(node.target):
            self.env[node] = control_flow(self, node)  # torch.cond -> If, while_loop -> Loop... (emit/control_flow.py)
            return
        decision = self.dispatcher.dispatch(node)
        candidate = decision.chosen
        assert candidate is not None
        implementation = candidate.implementation
        with self.recorder.recording(self._metadata(node)):
            kwargs = {
                name: self._argument(node, name, value, candidate.casts.get(name))
                for name, value in candidate.arguments.items()
            }
            try:
                function = implementation.function
                plan = _call_plan(function)
                # fx2onnx's and torchlib's functions of their arguments only may be replayed; a user's function runs
                # for each node, as registered (it may keep state, or read what the recorder does not watch)
                replay_key = plan.key if implementation.source != "user" else None
                if implementation.source != "user" and plan.rule is None:
                    result = self.recorder.call_traced(function, kwargs, lambda: _call(function, kwargs, None, plan))
                elif replay_key is not None:  # a context rule that says what it reads of its context
                    context = LoweringContext(self, self.recorder, node, dict(kwargs))
                    context.key = replay_key(context)
                    result = self.recorder.call_traced(
                        (function, context.key), kwargs, lambda: _call(function, kwargs, context, plan)
                    )
                else:
                    context = LoweringContext(self, self.recorder, node, dict(kwargs))
                    result = _call(function, kwargs, context, plan)
            except Exception as error:
                arguments = ", ".join(f"{k}={describe_value(v)}" for k, v in candidate.arguments.items())
                raise LoweringError(
                    f"{implementation.name} failed to lower node `{node.name}` ({decision.target}) with "
                    f"{arguments}: {type(error).__name__}: {error}\n  from: {source_line(node)}\n"
                    f"  remedy: register a working implementation with fx2onnx.register('{decision.target}', fn)"
                ) from error
            self.env[node] = self._finish(node, result, reason_node=node)

    def output(self, node: torch.fx.Node) -> None:
        outputs = self.captured.user_outputs
        from fx2onnx._capture_pytrees import output_paths

        # A None among the outputs has no ONNX output: `program(...)` puts None back at its position.
        self.none_outputs = [index for index, arg in enumerate(outputs) if arg is None]
        names = output_paths(self.captured.out_spec, len(outputs))
        if self.output_names:  # the user's names go to the graph's outputs, in order
            names = list(self.output_names) + [f"output_{i}" for i in range(len(self.output_names), len(outputs))]
            for index in self.none_outputs:
                names.insert(index, "")
        used: set[int] = set()
        with self.recorder.recording({FX_NODE: "output"}):
            for index, arg in enumerate(outputs):
                if arg is None:
                    continue
                value = self.env[arg] if isinstance(arg, torch.fx.Node) else self.recorder.constant(arg)
                if not isinstance(value, ir.Value):
                    value = self.recorder.constant(value)
                if value.is_graph_input() or value.is_initializer() or id(value) in used or value.producer() is None:
                    (copy,) = self.recorder.add_node("", "Identity", [value])
                    # Fresh objects: onnx_ir mutates a type in place when a dtype is set, and shapes are mutable.
                    copy.dtype = value.dtype
                    copy.shape = ir.Shape(value.shape) if value.shape is not None else None
                    value = copy
                used.add(id(value))
                name = names[index] if index < len(names) else f"output_{index}"
                if isinstance(arg, torch.fx.Node) and _is_complex(arg.meta.get("val")):
                    self.complex_outputs.append(len(self.graph.outputs))
                value.name = name
                self.graph.outputs.append(value)

    # --- helpers ----------------------------------------------------------------------------------
    def _argument(self, node: torch.fx.Node, name: str, value: Any, cast_to: ir.DataType | None) -> Any:
        """FX argument -> what an onnxscript function takes (values, Python scalars, ONNX dtypes)."""
        kind = type(value)
        if kind in _PLAIN_ARGUMENTS:  # the commonest, without the isinstance checks below
            return value
        if kind is torch.fx.Node or isinstance(value, torch.fx.Node):
            converted = self.env[value]
            if cast_to is not None and isinstance(converted, ir.Value):
                converted = self._cast(node, converted, cast_to, "dispatch")
            return converted
        if isinstance(value, (list, tuple)):
            return [self._argument(node, name, v, cast_to) for v in value]
        if isinstance(value, torch.dtype):
            return int(dtypes.to_onnx(value))
        if isinstance(value, (torch.device, torch.layout, torch.memory_format)):
            return None
        if isinstance(value, torch.Tensor):  # a constant tensor baked into the graph
            return self.recorder.constant(complex_layout.as_real(value.detach()).numpy())
        return value

    def _cast(self, node: torch.fx.Node, value: ir.Value, dtype: ir.DataType, reason: str) -> ir.Value:
        if value.dtype == dtype:
            return value
        self.casts.append(
            CastRecord(node.name, value.name or "", dtypes.short_name(value.dtype), dtypes.short_name(dtype), reason)
        )
        if value.const_value is not None and value.producer() is not None and value.producer().op_type == "Constant":
            return self.recorder.constant(value.const_value.numpy(), dtype)  # fold the Cast into the constant
        return self.recorder.cast(value, dtype)

    def _finish(self, node: torch.fx.Node, result: Any, *, reason_node: torch.fx.Node) -> Any:
        """Give the implementation's outputs eager's dtypes, shapes and the FX node's name."""
        val = node.meta.get("val")
        if isinstance(result, ir.Value):
            return self._finish_value(node, result, val, node.name)
        if isinstance(result, (tuple, list)):
            vals = val if isinstance(val, (tuple, list)) else [None] * len(result)
            finished = []
            for index, (item, item_val) in enumerate(zip(result, vals)):
                if isinstance(item, ir.Value):
                    item = self._finish_value(node, item, item_val, f"{node.name}_{index}")
                finished.append(item)
            return tuple(finished)
        return result

    def _finish_value(self, node: torch.fx.Node, value: ir.Value, val: Any, name: str) -> ir.Value:
        expected = _meta_dtype(val)
        if _is_complex(val) and value.dtype != expected:
            with self.recorder.recording(self._metadata(node)):  # an implementation cast to ONNX's complex type
                value = complex_layout.from_complex_cast(value) or value
        if expected is not None and value.dtype is not None and value.dtype != expected:
            value = self._cast(node, value, expected, "eager-dtype")
        recorded = value.shape
        self._set_type(value, val, expected)
        unbacked = self._data_dependent_dims.get(node)
        if unbacked and value.shape is not None:  # not static: a Shape of it must not fold (the checks read it)
            dims = [ir.SymbolicDim(unbacked[i]) if i in unbacked else d for i, d in enumerate(value.shape)]
            value.shape = ir.Shape(dims)
        elif self._pinned_symbols and recorded is not None and value.shape is not None:
            value.shape = _pinned_dims_kept_symbolic(value.shape, recorded, self._pinned_symbols)
        owned = value.is_graph_input() or value.is_initializer() or id(value) in self._named
        if not owned and value.producer() is not None and value.producer().op_type != "Constant":
            value.name = name
            self._named.add(id(value))
        return value

    def _set_type(self, value: ir.Value, val: Any, dtype: ir.DataType | None = None) -> None:
        """Give `value` the dtype (`dtype` when the caller has it: ``_meta_dtype(val)``) and shape of `val`."""
        if dtype is None:
            dtype = _meta_dtype(val)
        if dtype is not None:
            value.dtype = dtype
        if isinstance(val, torch.Tensor):
            dims = [dim if type(dim) is int else self._dim(dim) for dim in val.shape]
            value.shape = ir.Shape([*dims, 2] if val.is_complex() else dims)
        elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
            value.shape = ir.Shape([])

    def _dim(self, dim: int | torch.SymInt) -> int | ir.SymbolicDim:
        if isinstance(dim, int):
            return dim
        expr = dim.node.expr
        if isinstance(expr, sympy.Integer):
            return int(expr)
        if isinstance(expr, sympy.Symbol):
            return ir.SymbolicDim(self.symbol_names.get(expr, str(expr)))
        renamed = expr.subs({s: sympy.Symbol(n) for s, n in self.symbol_names.items() if s in expr.free_symbols})
        return ir.SymbolicDim(str(renamed))

    def _metadata(self, node: torch.fx.Node) -> dict[str, str]:
        metadata = {
            FX_NODE: node.name,
            TARGET: target_name(node.target),
        }
        stack = node.meta.get("nn_module_stack")
        if stack:
            path, kind = next(reversed(stack.values()))
            metadata[NAMESPACE] = f"{path}: {getattr(kind, '__name__', kind)}"
        trace = node.meta.get("stack_trace")
        if trace:
            metadata[STACK_TRACE] = trace
        return metadata


def _fold_weight_transposes(graph: ir.Graph) -> None:
    """A ``Transpose`` of a weight that nothing else reads (torchlib's ``linear`` transposes its weight) becomes the
    weight's transposed view, as onnxscript's constant folding makes it (a strided numpy view: no copy; the save
    writes it in C order). Weights without bytes (``export(weights=...)``: meta tensors) are left to finalize,
    which transposes their checkpoint tensors unread (``_weights.fold_transposes``)."""
    for node in list(graph):
        if node.op_type != "Transpose" or node.domain or len(node.inputs) != 1:
            continue
        source, output = node.inputs[0], node.outputs[0]
        tensor = None if source is None else source.const_value
        if tensor is None or not source.is_initializer() or source.is_graph_output() or output.is_graph_output():
            continue
        if len(source.uses()) != 1 or not isinstance(tensor, (TorchTensor, ir.Tensor)):
            continue
        if isinstance(tensor, TorchTensor) and tensor.raw.device.type != "cpu":
            continue  # a weight without bytes (the meta device, a fake tensor)
        perm = node.attributes.get("perm")
        permutation = tuple(perm.as_ints()) if perm is not None else tuple(reversed(range(len(tensor.shape))))
        try:
            array = tensor.numpy().view(tensor.dtype.numpy())
        except Exception:
            continue
        transposed = ir.Tensor(array.transpose(permutation), dtype=tensor.dtype, name=output.name)
        folded = ir.Value(
            name=output.name,
            type=ir.TensorType(tensor.dtype),
            shape=ir.Shape(transposed.shape),
            const_value=transposed,
        )
        output.replace_all_uses_with(folded)
        graph.remove(node, safe=True)
        graph.initializers.pop(source.name)
        output.name = None
        graph.register_initializer(folded)


def _remove_unused_constants(graph: ir.Graph) -> None:
    """Drop the graph's ``Constant`` nodes nothing reads: the inputs of nodes folded at emit (``_emit/folding.py``),
    which the optimizer would otherwise visit before removing them."""
    unused = [
        node
        for node in graph
        if node.op_type == "Constant"
        and not node.domain
        and not node.outputs[0].uses()
        and not node.outputs[0].is_graph_output()
    ]
    if unused:
        graph.remove(unused, safe=True)


def is_runtime_check(node: torch.fx.Node) -> bool:
    """An op that returns nothing and feeds nothing (a shape/dtype/value assertion): the emitter skips it."""
    facts = schema_facts(node.target)
    return facts is not None and not facts.returns and not node.users


_is_runtime_check = is_runtime_check  # the former private name


def data_dependent_dims(graph: torch.fx.Graph) -> dict[torch.fx.Node, dict[int, str]]:
    """FX node -> {dim: its symbol} for the data-dependent sizes the capture pinned to one number.

    A size decided at capture (``u0 < 3`` taken as True where ``u0 >= 2``: u0 is 2) is a constant in the graph's
    metadata (``index: "f32[2]"``), but torch.export still reads it from the tensor to assert it (``sym_size.int``
    feeding ``_assert_scalar``). Emitted static, the Shape those checks read folds at emit, and with it every check
    of that size: the report claimed checks the model did not have. Such a dim is emitted symbolic instead."""
    found: dict[torch.fx.Node, dict[int, str]] = {}
    for node in graph.nodes:
        if node.target is not aten.sym_size.int or not isinstance(node.args[0], torch.fx.Node):
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Integer):
            val = int(val.node.expr)
        if not isinstance(val, int) or isinstance(val, bool):
            continue  # symbolic: the dim is emitted symbolic anyway
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        symbol = next(iter(_asserted_symbols(node)), f"{node.args[0].name}_size{dim}")
        found.setdefault(node.args[0], {})[int(dim)] = symbol  # type: ignore[arg-type]
    return found


def _pinned_dims_kept_symbolic(declared: ir.Shape, recorded: ir.Shape, pinned: set[str]) -> ir.Shape:
    """`declared` (the FX graph's: a pinned size as its number) with the dims that the recorded ONNX nodes
    computed from a pinned data-dependent size (ONNX inference of ``Mul(index[u0], 2)``: ``[u0]``) symbolic.

    The capture's number holds only where the size's checks hold; a value computed from it, a graph output
    most of all, declared the number (``f32[2]``) where the run's size is the data's: ONNX Runtime warned
    'Expected shape from model of {2} does not match actual shape of {1}' wherever a check was missing."""
    if len(declared) != len(recorded):
        return declared
    dims = [
        kept if isinstance(dim, int) and isinstance(kept, ir.SymbolicDim) and kept.value in pinned else dim
        for dim, kept in zip(declared, recorded)
    ]
    return ir.Shape(dims)


def _asserted_symbols(size: torch.fx.Node) -> list[str]:
    """The unbacked symbols (``u0``) named by the assertions that read `size`, through the comparisons."""
    symbols: list[str] = []
    pending, seen = list(size.users), set()
    while pending:
        user = pending.pop()
        if user in seen:
            continue
        seen.add(user)
        if user.target is aten._assert_scalar.default:
            message = user.args[1] if len(user.args) > 1 else ""
            symbols += re.findall(r"\bu\d+\b", str(message).split(" on node ")[0])
        else:
            pending += list(user.users)
    return symbols


def _checked_at_run_time(node: torch.fx.Node, registry: Any) -> bool:
    """torch.export's deferred assertions on sizes (``aten._assert_scalar``) are what the graph was captured under:
    their lowering checks them at run time (``_lowerings/symbolic.py``), so an input breaking one fails in ONNX
    Runtime instead of computing something else than eager."""
    return node.target is aten._assert_scalar.default and registry.is_registered(node.target)


class _CallPlan(NamedTuple):
    """What calling an implementation's function needs, read once per function (each read is a few lookups through
    wrappers, and an export calls the same few dozen functions for every node)."""

    positional: tuple[str, ...]  # the leading parameters, given by position
    rule: Callable[..., Any] | None  # the context rule behind the function (context_rule)
    key: Callable[[LoweringContext], Any] | None  # what that rule reads of its context (context_key)


def _read_call_plan(function: Any) -> _CallPlan:
    python_function = getattr(function, "func", None) or getattr(function, "function", None) or function
    return _CallPlan(_positional_parameters(python_function), context_rule(function), context_key(function))


def _call_plan(function: Any) -> _CallPlan:
    try:
        return _cached_call_plan(function)
    except TypeError:  # an unhashable callable
        return _read_call_plan(function)


_cached_call_plan = functools.lru_cache(maxsize=4096)(_read_call_plan)


def _call(function: Any, kwargs: dict[str, Any], context: LoweringContext | None, plan: _CallPlan) -> Any:
    """Call an onnxscript function; leading parameters go by position (`self` clashes with the method's). A lowering
    declared with ``context=True`` gets the lowering context first."""
    positional = []
    for name in plan.positional:
        if name not in kwargs:
            break
        positional.append(kwargs.pop(name))
    if plan.rule is not None:
        assert context is not None
        return plan.rule(context, *positional, **kwargs)
    return function(*positional, **kwargs)


def _positional_parameters(python_function: Any) -> tuple[str, ...]:
    """The names of the leading parameters that can be given by position. ``inspect.signature`` costs ~50 us and an
    export asks for the same few dozen functions once per node: kept for the functions seen last."""
    try:
        return _cached_positional_parameters(python_function)
    except TypeError:  # an unhashable callable
        return _leading_positional(python_function)


def _leading_positional(python_function: Any) -> tuple[str, ...]:
    names = []
    for param in inspect.signature(python_function).parameters.values():
        if param.kind not in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            break
        names.append(param.name)
    return tuple(names)


_cached_positional_parameters = functools.lru_cache(maxsize=4096)(_leading_positional)


# Python values an implementation takes as they are.
_PLAIN_ARGUMENTS = frozenset({type(None), bool, int, float, str})


def _meta_dtype(val: Any) -> ir.DataType | None:
    if isinstance(val, torch.Tensor):
        return complex_layout.graph_dtype(val.dtype)  # complex values are (..., 2) real tensors in the graph
    if isinstance(val, (torch.SymBool, bool)):
        return ir.DataType.BOOL
    if isinstance(val, (torch.SymInt, int)):
        return ir.DataType.INT64
    if isinstance(val, (torch.SymFloat, float)):
        return ir.DataType.FLOAT
    return None


def _is_complex(val: Any) -> bool:
    return isinstance(val, torch.Tensor) and val.is_complex()


def symbol_names_for(
    captured: CapturedGraph, user_dims: Mapping[tuple[int, int], str], flat_inputs: Sequence[Any]
) -> dict[sympy.Symbol, str]:
    """Map torch's shape symbols (s0, s35...) to the names of the user's ``Dim`` objects."""
    names: dict[sympy.Symbol, str] = {}
    tensors = [x for x in flat_inputs if isinstance(x, torch.Tensor)]
    for node, example in zip(captured.user_inputs, tensors):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        for index, dim in enumerate(val.shape):
            if isinstance(dim, torch.SymInt) and isinstance(dim.node.expr, sympy.Symbol):
                name = user_dims.get((id(example), index))
                if name and dim.node.expr not in names:
                    names[dim.node.expr] = name
    return names


__all__ = ["CastRecord", "EmitResult", "GraphEmitter", "is_runtime_check", "symbol_names_for", "value_dtype"]
