"""The lowering context: what a lowering may touch of the export besides its arguments.

As JAX hands each lowering rule a ``LoweringRuleContext``, the emitter hands a :class:`LoweringContext` to each
lowering declared with ``@lowering(..., context=True)`` (its first parameter, ``ctx``): the FX node being lowered,
constants and initializers, names, the node's metadata, ONNX ``Loop`` bodies, and the dispatch of an inner op
through the export's registry. Nothing else of the emitter is reachable from a lowering.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import onnx_ir as ir
import onnxscript
import torch.fx

from fx2onnx._emit.recorder import GraphRecorder

op = onnxscript.opset18

# step(iteration, carried values) -> (keep going, next carried values), recorded into a Loop's body.
LoopStep = Callable[[ir.Value, list[ir.Value]], tuple[ir.Value, list[ir.Value]]]


class _Emitter(Protocol):
    """What the context reads of the emitter (:class:`fx2onnx._emit.graph_builder.GraphEmitter`)."""

    graph: ir.Graph
    env: dict[torch.fx.Node, Any]

    def call_function(self, node: torch.fx.Node) -> None: ...


class LoweringContext:
    """Handed to a lowering that needs more than its arguments; valid while that lowering runs."""

    def __init__(
        self,
        emitter: _Emitter,
        recorder: GraphRecorder,
        node: torch.fx.Node,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        self._emitter = emitter
        self._recorder = recorder
        self.node = node  # the FX node being lowered (its args, its example values in meta["val"])
        # The arguments the rule is called with (its ONNX values and Python values), for its context_key: the key
        # reads them before the call, where the recorder does not watch them.
        self.arguments: Mapping[str, Any] = arguments or {}
        # What the rule's context_key gave for this call (None without one): a rule decides from it what the key
        # read of its arguments, so that it reads nothing of them the key does not hold.
        self.key: Hashable | None = None

    @property
    def metadata(self) -> Mapping[str, str]:
        """The metadata every ONNX node recorded for this FX node carries."""
        return self._recorder.metadata

    def fresh_name(self, hint: str = "v") -> str:
        """A value or graph name unique in the whole model (subgraphs included)."""
        return self._recorder.fresh_name(hint)

    def constant(self, value: Any, dtype: ir.DataType | None = None) -> ir.Value:
        """A ``Constant`` of a Python/numpy value in the graph being recorded; identical constants are shared."""
        return self._recorder.constant(value, dtype)

    def initializer(self, array: np.ndarray, name: str) -> ir.Value:
        """A constant computed at export time as an initializer of the graph being emitted, shared by name."""
        graph = self._emitter.graph
        existing = graph.initializers.get(name)
        if existing is not None:
            return existing
        tensor = ir.tensor(np.ascontiguousarray(array), name=name)
        value = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=ir.Shape(tensor.shape), const_value=tensor)
        graph.register_initializer(value)
        return value

    def loop(
        self,
        trip_count: ir.Value | None,
        condition: ir.Value | None,
        carried: Sequence[ir.Value],
        step: LoopStep,
        *,
        name: str = "loop",
        carried_shapes: bool = False,
    ) -> list[ir.Value]:
        """An ONNX ``Loop`` over `carried`: its body is `step`, recorded into a subgraph (which reads whatever
        `step` closes over from the enclosing scope). Returns the final carried values, typed as `carried`.
        `carried_shapes=True`: the body sees each carried value with its outer shape (the values keep it)."""
        iteration = ir.Value(name=self.fresh_name(f"{name}_iteration"), type=ir.TensorType(ir.DataType.INT64))
        iteration.shape = ir.Shape([])
        keep_going = ir.Value(name=self.fresh_name(f"{name}_condition"), type=ir.TensorType(ir.DataType.BOOL))
        keep_going.shape = ir.Shape([])
        carried_in = [
            ir.Value(name=self.fresh_name(f"{name}_carried"), type=ir.TensorType(value.dtype)) for value in carried
        ]
        if carried_shapes:
            for inner_value, value in zip(carried_in, carried):
                inner_value.shape = ir.Shape(value.shape) if value.shape is not None else None
        body = ir.Graph([iteration, keep_going, *carried_in], [], nodes=[], name=self.fresh_name(name))
        inner = self._recorder.nested(body)
        with inner.recording(self.metadata):
            more, carried_out = step(iteration, carried_in)
        body.outputs.extend([more, *carried_out])
        outputs = op.Loop(trip_count, condition, *carried, body=body)
        outputs = [outputs] if isinstance(outputs, ir.Value) else list(outputs)
        for output, value in zip(outputs, carried):
            output.dtype = value.dtype  # the recorder does not infer Loop's outputs
        return outputs

    def lower_inner(self, node: torch.fx.Node, bindings: Mapping[torch.fx.Node, ir.Value]) -> Any:
        """Emit `node` (an FX node built by the lowering, its placeholders bound to `bindings`) through the
        export's dispatcher, as any node of the graph; returns its value."""
        env = self._emitter.env
        env.update(bindings)
        try:
            self._emitter.call_function(node)
            return env[node]
        finally:
            for bound in [*bindings, node]:
                env.pop(bound, None)


def with_context(
    function: Callable[..., Any], key: Callable[[LoweringContext], Hashable] | None = None
) -> Callable[..., Any]:
    """`function(ctx, *arguments)` seen as `function(*arguments)`: the signature the dispatcher binds ATen arguments
    to (its type constraints come from the annotations) has no `ctx`. The emitter calls :func:`context_rule` of it
    with the context; another lowering may call it with its own context first. Called otherwise (outside an export),
    it raises. `key`: what `function` reads of its context (:func:`context_key`), when its calls may be replayed."""
    signature = inspect.signature(function)
    first, *parameters = signature.parameters.values()

    @functools.wraps(function)
    def without_context(*args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], LoweringContext):  # one lowering calling another, with its context
            return function(*args, **kwargs)
        raise RuntimeError(
            f"{function.__qualname__} is lowered only inside fx2onnx.export: it needs the lowering context "
            "(the FX node, the export's dispatcher)"
        )

    without_context.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    without_context.__annotations__ = {k: v for k, v in function.__annotations__.items() if k != first.name}
    without_context.lowering_rule = function  # type: ignore[attr-defined]
    without_context.context_key = key  # type: ignore[attr-defined]
    return without_context


def context_rule(function: Any) -> Callable[..., Any] | None:
    """The `ctx`-taking rule behind an implementation wrapped by :func:`with_context`, else None."""
    python_function = getattr(function, "func", None) or getattr(function, "function", None) or function
    return getattr(python_function, "lowering_rule", None)


def context_key(function: Any) -> Callable[[LoweringContext], Hashable] | None:
    """What the context rule behind `function` reads of its context, as a function of the context giving a hashable
    value: two calls alike in their arguments and in this value record the same nodes (the recorder replays the
    second). None for a rule that declared none (it is traced for each node) and for other functions."""
    python_function = getattr(function, "func", None) or getattr(function, "function", None) or function
    return getattr(python_function, "context_key", None)
