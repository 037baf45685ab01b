"""The legalization pass: nodes the target cannot run compute in the nearest legal type, cast back.

For each node (main graph, If/Loop/Scan bodies, model-local functions) the pass binds the schema's
type constraints to the node's types and asks the target. When the target refuses, it tries the
constraints' wider types (see :mod:`fx2onnx.legalize.widening`), cheapest first, casts the inputs
of changed constraints to the new types and the outputs back to the original ones, so every value
keeps its type and the graph's boundary keeps eager's dtypes. By default every legalized node
rounds its outputs back to their own type, as eager does after each op; ``fast_math=True`` lets a
legalized float node read its legalized float producer's wide result directly.

ONNX Runtime CPU runs most float16 nodes in float32 through Casts it inserts itself, but between
two such nodes it drops the rounding to float16 that eager does. So by default the pass casts
float16 nodes explicitly too (ONNX Runtime keeps explicit Casts); ``fast_math=True`` leaves them to
the runtime.

A constraint whose values disagree (an optimizer may leave ``Conv(x: bf16, w: f32)``) is invalid
as it stands; the pass casts its values to a common type the target runs.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterator, Mapping
from typing import Union

import onnx
import onnx_ir as ir

from fx2onnx import _dtypes as dtypes
from fx2onnx._records import FX_NODE, LEGALIZED, METADATA_PREFIX, NAMESPACE, CastRecord
from fx2onnx.legalize import probes, schemas, widening
from fx2onnx.legalize.targets import Target, Verdict

GraphLike = Union[ir.Graph, ir.Function]  # noqa: UP007 - runtime alias on 3.10
RUNTIME_CASTS = "legalize (fast_math: onnxruntime's own Casts)"
FOLD_LIMIT = 1024  # elements: constants up to this size are converted instead of cast

# Ops whose output type an attribute decides: when widening their output-only constraint, the
# attribute changes with it.
_DTYPE_ATTRIBUTE_OPS = frozenset(
    {"EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}
)


@dataclasses.dataclass
class Refusal:
    """A node the target cannot run in any type the pass may choose."""

    graph: GraphLike
    node: ir.Node
    binding: schemas.Binding
    reason: str
    tried: list[str]  # the other bindings tried, none of which the target runs


@dataclasses.dataclass
class _Inserted:
    node: ir.Node
    record: CastRecord


class Legalizer:
    """One run of the pass over one model."""

    def __init__(self, model: ir.Model, target: Target, *, fast_math: bool = False) -> None:
        self.model = model
        self.target = target
        self.fast_math = fast_math
        self.inserted: list[_Inserted] = []
        # Records without a Cast node: constants converted ahead of time, float16 nodes left to the runtime.
        self.unattached: list[CastRecord] = []
        self.refusals: list[Refusal] = []
        self._casts: dict[tuple[int, int, ir.DataType], ir.Value] = {}  # (graph, value, dtype) -> cast
        self._narrowed: dict[int, ir.Value] = {}  # id(cast-back output) -> the wide value it rounds
        self._tried: dict[int, list[str]] = {}  # id(node) -> bindings tried in vain
        self._count = 0
        self._folded: list[tuple[ir.Graph, ir.Value]] = []  # constants replaced by converted copies
        # Nodes found legal as they were, with what the verdict read of them: check() need not judge them again. Only
        # a rewrite changes what a verdict reads during run(), so before the first one it is not read (None; run()'s
        # own check takes such nodes as legal, a later check() judges them again): most models need no rewrite, and
        # reading it twice a node was a fifth of the pass.
        self._legal_as_judged: dict[ir.Node, tuple[object, ...] | None] = {}
        self._rewritten = False
        # Verdicts by all they read of a node (the probe's key): a model's layers ask the same over and over.
        self._verdicts: dict[tuple[object, ...], Verdict] = {}

    # --- driver -------------------------------------------------------------------------------------
    def run(self) -> list[CastRecord]:
        for graph, opsets in self.graphs():
            for node in list(graph):
                self.legalize_node(graph, node, opsets)
        self._drop_unused_casts()
        self._drop_unused_originals()
        self.refusals = list(self._refusals(trust_unrewritten=True))
        return [item.record for item in self.inserted] + self.unattached

    def graphs(self) -> Iterator[tuple[GraphLike, Mapping[str, int]]]:
        """The main graph, each subgraph (If/Loop/Scan bodies) and each model-local function."""
        opsets = self.model.graph.opset_imports
        yield from _with_subgraphs(self.model.graph, opsets)
        for function in self.model.functions.values():
            yield from _with_subgraphs(function, {**opsets, **function.opset_imports})

    def check(self) -> Iterator[Refusal]:
        """Every node the target still cannot run."""
        return self._refusals(trust_unrewritten=False)

    def _refusals(self, *, trust_unrewritten: bool) -> Iterator[Refusal]:
        """check(); `trust_unrewritten`: the nodes found legal while the pass rewrote nothing are taken as legal
        without reading them again (run() checks before anything else could change them)."""
        for graph, opsets in self.graphs():
            for node in graph:
                judged = self._legal_as_judged.get(node, _NOT_JUDGED)
                if (judged is None and trust_unrewritten) or (judged is not None and judged == _judged_signature(node)):
                    continue
                context = _NodeContext.of(node, opsets, self.model)
                if context is None:
                    continue
                verdict = self._current_verdict(context, node)
                if not verdict.legal:
                    yield Refusal(graph, node, context.binding, verdict.reason, self._tried.get(id(node), []))

    # --- one node -----------------------------------------------------------------------------------
    def legalize_node(self, graph: GraphLike, node: ir.Node, opsets: Mapping[str, int]) -> None:
        context = _NodeContext.of(node, opsets, self.model)
        if context is None:
            return
        _type_unknown_outputs(node, context)
        verdict = self._current_verdict(context, node)
        if self._acceptable(verdict):
            self._legal_as_judged[node] = _judged_signature(node) if self._rewritten else None
            if verdict.implicit_float32:  # fast_math: the runtime's own Casts to float32, with less rounding
                note = self._describe(node, "all", ir.DataType.FLOAT16, ir.DataType.FLOAT, RUNTIME_CASTS)
                self.unattached.append(note)
            return
        choice = self._choose(context, node)
        if choice is not None:
            self._rewrite(graph, node, context, choice)
        # else: check() reports the node

    def _current_verdict(self, context: _NodeContext, node: ir.Node) -> Verdict:
        if context.mixed:
            mixed = "; ".join(f"{name} bound to {', '.join(sorted(types))}" for name, types in context.mixed.items())
            return Verdict(False, f"its values disagree on a type constraint ({mixed})")
        return self._verdict(context, node, context.binding)

    def _acceptable(self, verdict: Verdict) -> bool:
        """Legal, and rounding like eager: float16 left to the runtime's own Casts only under fast_math."""
        return verdict.legal and (self.fast_math or not verdict.implicit_float32)

    def _verdict(self, context: _NodeContext, node: ir.Node, binding: Mapping[str, str]) -> Verdict:
        def build() -> onnx.ModelProto | None:
            inputs = [context.retyped(v, context.input_constraint(i), binding) for i, v in enumerate(node.inputs)]
            outputs = [context.retyped(v, context.output_constraint(i), binding) for i, v in enumerate(node.outputs)]
            return probes.node_model(node, context.opsets, inputs, outputs)

        key = (
            "node",
            node.domain,
            node.op_type,
            context.opset,
            tuple(sorted(binding.items())),
            tuple(v is not None for v in node.inputs),
            len(node.outputs),
            _attribute_signature(node),
        )
        found = self._verdicts.get(key)
        if found is not None:
            return found
        attributes = {name: a.value for name, a in node.attributes.items() if isinstance(a.value, (int, float, str))}
        probe = probes.Probe(key, build, attributes)
        verdict = self.target.verdict(node.domain, node.op_type, context.opset, binding, probe=probe)
        self._verdicts[key] = verdict
        return verdict

    def _choose(self, context: _NodeContext, node: ir.Node) -> schemas.Binding | None:
        """The cheapest binding the target runs, changing only constraints the pass may change."""
        names = sorted(context.binding)
        options = [self._options(context, node, name) for name in names]
        combinations = sorted(
            itertools.product(*options), key=lambda combo: (sum(c for _, c in combo), [t for t, _ in combo])
        )
        tried = self._tried.setdefault(id(node), [])
        for combo in combinations:
            binding = dict(zip(names, (t for t, _ in combo)))
            if binding == context.binding and not context.mixed:
                continue  # the node as it is: already refused
            if self._acceptable(self._verdict(context, node, binding)):
                return binding
            tried.append(", ".join(f"{n}={t}" for n, t in binding.items() if t != context.binding[n]))
        return None

    def _options(self, context: _NodeContext, node: ir.Node, name: str) -> list[tuple[str, float]]:
        """(type, cost) choices for one constraint: types every one of its values can be cast to losslessly."""
        members = context.mixed.get(name) or {context.binding[name]}
        member_dtypes = [schemas.tensor_dtype(m) for m in members]
        if any(d is None for d in member_dtypes) or not context.changeable(name):
            return [(context.binding[name], 0.0)]
        reachable: dict[ir.DataType, float] | None = None
        for dtype in member_dtypes:
            costs = {dtype: 0.0}
            for wider, _lossy in widening.candidates(node.op_type, dtype):
                costs[wider] = widening.cost(dtype, wider)
            if reachable is None:
                reachable = costs
            else:
                reachable = {d: c + costs[d] for d, c in reachable.items() if d in costs}
        allowed = context.allowed.get(name, frozenset())
        return [(schemas.tensor_type(d), c) for d, c in (reachable or {}).items() if schemas.tensor_type(d) in allowed]

    def _rewrite(self, graph: GraphLike, node: ir.Node, context: _NodeContext, binding: Mapping[str, str]) -> None:
        if not self._rewritten:  # what the verdicts so far read, before this rewrite changes any of it
            self._rewritten = True
            for judged in self._legal_as_judged:
                self._legal_as_judged[judged] = _judged_signature(judged)
        new = {name: schemas.tensor_dtype(bound) for name, bound in binding.items()}
        lossy = any(
            widening.cost(schemas.tensor_dtype(member), new[name]) >= dtypes.LOSSY
            for name in binding
            for member in context.mixed.get(name, {context.binding[name]})
            if schemas.tensor_dtype(member) not in (None, new[name])
        )
        reason = "legalize" + (" (lossy)" if lossy else "") + (" (fast_math)" if self.fast_math else "")
        for index, value in enumerate(node.inputs):
            dtype = new.get(context.input_constraint(index))
            if value is not None and dtype is not None and value.dtype not in (None, dtype):
                node.replace_input_with(index, self._cast_input(graph, node, value, dtype, reason))
        for index, value in enumerate(node.outputs):
            dtype = new.get(context.output_constraint(index))
            if dtype is None or value.dtype in (None, dtype):
                continue
            if value.uses() or value.is_graph_output():
                self._cast_output(graph, node, value, dtype, reason)
            else:
                value.type = ir.TensorType(dtype)  # an unused output needs no Cast back
        for name, bound in binding.items():
            if bound != context.binding[name] and not context.input_uses(name):
                _retype_attribute(node, new[name])

    def _cast_input(
        self, graph: GraphLike, node: ir.Node, value: ir.Value, dtype: ir.DataType, reason: str
    ) -> ir.Value:
        if self.fast_math:
            wide = self._narrowed.get(id(value))
            if wide is not None and wide.dtype == dtype and widening.is_float(dtype) and widening.is_float(value.dtype):
                return wide  # skip rounding to the narrow type between two legalized ops
        graph = _defining_graph(graph, value)
        key = (id(graph), id(value), dtype)
        if key in self._casts:
            return self._casts[key]
        folded = self._fold(graph, value, dtype)
        if folded is not None:
            self._casts[key] = folded
            self.unattached.append(self._describe(node, value.name or "", value.dtype, dtype, reason))
            return folded
        cast = _cast_node(value, dtype, node, self._fresh(f"{value.name}_{dtypes.short_name(dtype)}"))
        producer = value.producer()
        if producer is not None and producer.graph is graph:
            graph.insert_after(producer, cast)
        else:
            graph.insert_before(next(iter(graph)), cast)  # graph inputs and initializers
        self._casts[key] = cast.outputs[0]
        self._record(cast, node, value.name or "", value.dtype, dtype, reason)
        return cast.outputs[0]

    def _cast_output(self, graph: GraphLike, node: ir.Node, value: ir.Value, dtype: ir.DataType, reason: str) -> None:
        """`node` now computes `value` in `dtype`; a Cast gives its consumers the original type and name."""
        original, name = value.dtype, value.name
        uses = list(value.uses())
        value.name = self._fresh(f"{name}_{dtypes.short_name(dtype)}")
        value.type = ir.TensorType(dtype)  # a new type: values may share type objects
        rounded = _cast_node(value, original, node, name or self._fresh("legalized"))
        result = rounded.outputs[0]
        for user, index in uses:
            user.replace_input_with(index, result)
        if value.is_graph_output():
            outputs = graph.outputs
            for position, output in enumerate(outputs):
                if output is value:
                    outputs[position] = result
        graph.insert_after(node, rounded)
        self._narrowed[id(result)] = value
        self._record(rounded, node, name or "", dtype, original, reason)

    def _fold(self, graph: GraphLike, value: ir.Value, dtype: ir.DataType) -> ir.Value | None:
        """A small constant converted ahead of time instead of a Cast (weights keep their Cast and size)."""
        tensor = value.const_value
        if (
            tensor is None
            or not isinstance(graph, ir.Graph)
            or value.is_graph_input()
            or tensor.size > FOLD_LIMIT
            or not (value.is_initializer() or (value.producer() is not None and value.producer().op_type == "Constant"))
        ):
            return None
        converted = ir.Value(
            name=self._fresh(f"{value.name}_{dtypes.short_name(dtype)}"),
            type=ir.TensorType(dtype),
            shape=value.shape,
            const_value=ir.tensor(tensor.numpy().astype(dtype.numpy()), dtype=dtype),
        )
        converted.const_value.name = converted.name
        graph.register_initializer(converted)
        if value.is_initializer():
            self._folded.append((graph, value))
        return converted

    def _describe(self, node: ir.Node, value: str, source: ir.DataType, dtype: ir.DataType, reason: str) -> CastRecord:
        """A Cast for `node`: the value (by its original name) and the types, for the report."""
        fx_node = node.metadata_props.get(FX_NODE, node.name or node.op_type)
        short_from, short_to = dtypes.short_name(source), dtypes.short_name(dtype)
        return CastRecord(fx_node, f"{value} ({node.op_type})", short_from, short_to, reason)

    def _record(
        self, cast: ir.Node, node: ir.Node, value: str, source: ir.DataType, dtype: ir.DataType, reason: str
    ) -> None:
        record = self._describe(node, value, source, dtype, reason)
        cast.metadata_props[LEGALIZED] = f"{reason}: {node.op_type} {record.from_dtype}->{record.to_dtype}"
        self.inserted.append(_Inserted(cast, record))

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_legal{self._count}"

    def _drop_unused_originals(self) -> None:
        """A constant whose every use now reads its converted copy is dead weight in the file (and ONNX Runtime
        warns about it at load)."""
        for graph, value in self._folded:
            if not value.uses() and not value.is_graph_output() and graph.initializers.get(value.name) is value:
                del graph.initializers[value.name]

    def _drop_unused_casts(self) -> None:
        """With fast_math, some Casts back to the narrow type end up unused: remove them."""
        kept = []
        for item in reversed(self.inserted):
            output = item.node.outputs[0]
            if output.uses() or output.is_graph_output():
                kept.append(item)
            else:
                item.node.graph.remove(item.node, safe=True)
        self.inserted = kept[::-1]


# --- the node as the schema sees it ------------------------------------------------------------------
@dataclasses.dataclass
class _NodeContext:
    op_schema: onnx.defs.OpSchema | None
    opset: int
    opsets: Mapping[str, int]
    binding: schemas.Binding
    mixed: dict[str, set[str]]
    allowed: Mapping[str, frozenset[str]]
    inputs: list[str | None]
    outputs: list[str | None]

    @classmethod
    def of(cls, node: ir.Node, opsets: Mapping[str, int], model: ir.Model) -> _NodeContext | None:
        """None for nodes not to judge: calls of model-local functions (their bodies are judged)."""
        if (node.domain, node.op_type, node.overload) in model.functions:
            return None
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = opsets.get(domain) or node.version  # the model's import is what runtimes read
        if opset is None:
            return None
        op_schema = schemas.schema(node.op_type, opset, domain)
        if op_schema is None:
            return cls(None, opset, opsets, {}, {}, {}, [], [])
        input_types = tuple(schemas.type_string(v.type) if v is not None else None for v in node.inputs)
        output_types = tuple(schemas.type_string(v.type) for v in node.outputs)
        view = _schema_view(op_schema, input_types, output_types)
        if view is None:  # values that disagree on a constraint: bound afresh, their sets as node_binding built them
            binding, mixed = schemas.node_binding(op_schema, input_types, output_types)
            inputs = [schemas.formal_constraint(op_schema, i, output=False) for i in range(len(node.inputs))]
            outputs = [schemas.formal_constraint(op_schema, i, output=True) for i in range(len(node.outputs))]
            return cls(op_schema, opset, opsets, binding, mixed, schemas.allowed_types(op_schema), inputs, outputs)
        inputs, outputs, binding = view
        return cls(
            op_schema, opset, opsets, dict(binding), {}, schemas.allowed_types(op_schema), list(inputs), list(outputs)
        )

    def input_constraint(self, index: int) -> str | None:
        return self.inputs[index] if index < len(self.inputs) else None

    def output_constraint(self, index: int) -> str | None:
        return self.outputs[index] if index < len(self.outputs) else None

    def input_uses(self, name: str) -> bool:
        return name in self.inputs

    def retyped(
        self, value: ir.Value | None, constraint: str | None, binding: Mapping[str, str]
    ) -> ir.TypeProtocol | None:
        """`value`'s type, were its constraint bound as in `binding`."""
        if value is None:
            return None
        if constraint in binding:
            dtype = schemas.tensor_dtype(binding[constraint])
            if dtype is not None:
                return ir.TensorType(dtype)
        return value.type

    def changeable(self, name: str) -> bool:
        """Inputs can be cast; an output-only constraint only when an attribute gives its type."""
        if self.input_uses(name):
            return True
        op_type = self.op_schema.name if self.op_schema is not None else ""
        return op_type in _DTYPE_ATTRIBUTE_OPS or op_type == "ConstantOfShape"


def _type_unknown_outputs(node: ir.Node, context: _NodeContext) -> None:
    """Give untyped outputs the type their schema implies from the inputs.

    Type inference leaves a node's outputs untyped when the spec refuses its input types (int8 MatMul,
    bfloat16 TopK) though legalization will change them; untyped, they would get no Cast back, and their
    consumers would mix the wide and the narrow type.
    """
    if context.op_schema is None:
        return
    formals = context.op_schema.outputs
    for index, value in enumerate(node.outputs):
        if value.dtype is not None:
            continue
        name = context.output_constraint(index)
        if name is not None:
            if name in context.mixed:
                continue
            allowed = context.allowed.get(name, frozenset())
            type_str = context.binding.get(name) or (next(iter(allowed)) if len(allowed) == 1 else None)
        elif index < len(formals):
            type_str = formals[index].type_str  # a literal type, e.g. tensor(int64)
        else:
            continue
        dtype = schemas.tensor_dtype(type_str) if type_str else None
        if dtype is not None:
            value.type = ir.TensorType(dtype)


def _defining_graph(graph: GraphLike, value: ir.Value) -> GraphLike:
    """Where a Cast of `value` goes: the graph defining it, so that an If/Loop/Scan body reading an outer-scope
    value does not convert it again on every iteration (and sibling bodies share one Cast)."""
    owner = value.graph
    if owner is None or owner is graph or len(owner) == 0:
        return graph
    return owner


def _with_subgraphs(graph: GraphLike, opsets: Mapping[str, int]) -> Iterator[tuple[GraphLike, Mapping[str, int]]]:
    yield graph, opsets
    for node in list(graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                yield from _with_subgraphs(attribute.value, opsets)
            elif attribute.type == ir.AttributeType.GRAPHS:
                for subgraph in attribute.value:
                    yield from _with_subgraphs(subgraph, opsets)


def _cast_node(value: ir.Value, dtype: ir.DataType, consumer: ir.Node, name: str) -> ir.Node:
    metadata = {k: v for k, v in consumer.metadata_props.items() if k.startswith(METADATA_PREFIX) or k == NAMESPACE}
    cast = ir.Node(
        "",
        "Cast",
        [value],
        [ir.AttrInt64("to", dtype)],
        name=f"{consumer.name or consumer.op_type}_legalize_{name}",
        metadata_props=metadata,
    )
    output = cast.outputs[0]
    output.name = name
    output.type = ir.TensorType(dtype)
    output.shape = value.shape
    return cast


@functools.lru_cache(maxsize=4096)
def _schema_view(
    op_schema: onnx.defs.OpSchema, inputs: tuple[str | None, ...], outputs: tuple[str | None, ...]
) -> tuple[tuple[str | None, ...], tuple[str | None, ...], tuple[tuple[str, str], ...]] | None:
    """The constraint of each input and output and the binding of a node whose values have these types, or None
    when they disagree on a constraint. The same for the nodes of every layer, and reading a schema's formals from
    onnx's C++ objects is slow (each access builds new Python objects)."""
    binding, mixed = schemas.node_binding(op_schema, inputs, outputs)
    if mixed:
        return None
    input_constraints = tuple(schemas.formal_constraint(op_schema, i, output=False) for i in range(len(inputs)))
    output_constraints = tuple(schemas.formal_constraint(op_schema, i, output=True) for i in range(len(outputs)))
    return input_constraints, output_constraints, tuple(binding.items())


_NOT_JUDGED = ()  # no signature equals it


def _judged_signature(node: ir.Node) -> tuple[object, ...]:
    """What a verdict reads of a node that a later rewrite of another node could change: its values' types and
    presence, and its attributes (a legal node judged again with the same is legal again)."""
    return (
        tuple(None if value is None else value.type for value in node.inputs),
        tuple(value.type for value in node.outputs),
        tuple((name, id(attribute)) for name, attribute in node.attributes.items()),
    )


def _attribute_signature(node: ir.Node) -> tuple[object, ...]:
    """What of a node's attributes can decide how a runtime expands it: values, but tensors by dtype only."""
    signature = []
    for name, attribute in sorted(node.attributes.items()):
        value = attribute.value
        if node.op_type == "Constant" and not node.domain:
            value = value.dtype if attribute.type == ir.AttributeType.TENSOR else None  # its value is data
        elif attribute.type == ir.AttributeType.TENSOR:
            value = value.dtype
        elif attribute.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS, ir.AttributeType.TENSORS):
            value = id(value)
        elif isinstance(value, list):
            value = tuple(value)
        signature.append((name, attribute.type, value))
    return tuple(signature)


def _retype_attribute(node: ir.Node, dtype: ir.DataType) -> None:
    """For ops whose output type an attribute gives: make the attribute give `dtype`."""
    if node.op_type == "ConstantOfShape":
        attribute = node.attributes.get("value")
        array = attribute.value.numpy() if attribute is not None else None
        tensor = ir.tensor(array.astype(dtype.numpy()) if array is not None else [0], dtype=dtype)
        node.attributes["value"] = ir.AttrTensor("value", tensor)
    elif node.op_type in _DTYPE_ATTRIBUTE_OPS:
        node.attributes["dtype"] = ir.AttrInt64("dtype", dtype)
