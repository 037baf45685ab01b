"""The recorder: an onnxscript evaluator that turns calls to ONNX ops into ``onnx_ir`` nodes.

torchlib's functions (and ours) are written against onnxscript's ``op.Add(x, y)`` API. While a
function runs under :class:`GraphRecorder`, each such call appends a node to the graph instead of
computing. Python constants passed where ONNX expects tensors become ``Constant`` nodes whose dtype
follows the op's type constraints, and every output gets its dtype and shape from ONNX's own
per-node inference, so functions that inspect ``x.dtype`` or ``x.shape`` while tracing see real
values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript
from onnx_ir import schemas
from onnxscript import evaluator
from onnxscript.values import OnnxFunction, TracedOnnxFunction

from fx2onnx import _dtypes as dtypes
from fx2onnx import _weight_reads as weight_reads
from fx2onnx._constant_arrays import constant_attribute_tensor
from fx2onnx._emit import folding
from fx2onnx._records import BASE_OPSET

# Constants of up to this many elements are read by value: ONNX's type inference is given their data, so a trace's
# key holds their bytes, and a fold at emit reading a larger one makes its trace one that is not replayed.
_READ_CONSTANT_SIZE = 64
_PY_DEFAULT_DTYPES = {bool: ir.DataType.BOOL, int: ir.DataType.INT64, float: ir.DataType.FLOAT}
# Cast/CastLike targets a Python number is converted to directly. Not float16, bfloat16, float8: eager converts a
# Python float to those through float32 (c10's types take a float), as the Cast of a float32 constant does.
_EXACT_FLOAT_TARGETS = frozenset({ir.DataType.DOUBLE, ir.DataType.FLOAT})


class RecordingError(RuntimeError):
    pass


class GraphRecorder(evaluator.Evaluator):
    """Records ONNX ops into `graph`; script functions become model-local functions."""

    def __init__(self, graph: ir.Graph, opset_imports: dict[str, int]) -> None:
        self.graph = graph
        self.opset_imports = opset_imports
        self.functions: dict[ir.OperatorIdentifier, ir.Function] = {}
        self._names = 0
        self._constants: dict[tuple[Any, ...], ir.Value] = {}
        self._metadata: dict[str, str] = {}
        self.nodes_added = 0
        # ONNX's inferred output types by what decides them (infer_node_types): a model's repeated layers ask
        # for the same node with the same input types over and over.
        self._inferred: dict[tuple[Any, ...], list[_InferredType | None]] = {}
        self._constant_keys: dict[int, tuple[Any, ...]] = {}  # id of a shared constant -> its key in _constants
        # Traces of implementations by what a trace reads (_trace_key); None: one that cannot be replayed.
        self._traces: dict[tuple[Any, ...], _Trace | None] | None = {}
        self._log: list[ir.Node] | None = None  # nodes added while a trace is recorded
        # Whether nodes reading a weight may be folded at emit: not when a checkpoint replaces the weights after
        # emission (export(weights=...)).
        self.fold_initializers = True

    # --- context ------------------------------------------------------------------------------
    def recording(self, metadata: Mapping[str, str] | None = None) -> _Recording:
        """Within this context, onnxscript op calls record into the graph, tagged with `metadata`."""
        return _Recording(self, dict(metadata or {}))

    @property
    def metadata(self) -> Mapping[str, str]:
        """The metadata of the nodes recorded now (those of the FX node being lowered)."""
        return self._metadata

    def fresh_name(self, hint: str = "v") -> str:
        self._names += 1
        return f"{hint}_{self._names}"

    def nested(self, graph: ir.Graph) -> GraphRecorder:
        """A recorder into a subgraph (a ``Loop``/``If``/``Scan`` body): its names come from this recorder (ONNX
        forbids a subgraph reusing an outer name), its model-local functions go to this recorder's table; its
        constants are its own (a subgraph's are not visible outside it)."""
        return _NestedRecorder(graph, self)

    # --- evaluator protocol -------------------------------------------------------------------
    def eval_op(self, op: onnxscript.values.Op, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        signature = _signature_of(op)
        if signature is None:
            raise RecordingError(f"ONNX op {op.domain}::{op.name} has no schema in the installed onnx")
        kwargs = dict(kwargs)
        num_outputs = kwargs.pop("_num_outputs", None)
        converted = self._converted_number(signature, args, kwargs)
        if converted is not None:
            return converted
        inputs, attributes = self._bind(signature, args, kwargs)
        if num_outputs is None:
            num_outputs = _num_outputs(op.op_schema, signature, inputs, attributes)
        if folding.may_fold(op.domain, op.name, num_outputs):
            folded = self._folded(op.name, inputs, attributes)
            if folded is not None:
                return folded
        version = self.opset_imports.get(op.domain) if op.domain else None
        outputs = self.add_node(op.domain, op.name, inputs, attributes, num_outputs, version=version)
        if op.name == "Constant" and not op.domain:
            outputs[0].const_value = constant_attribute_tensor(attributes)  # what nodes folded at emit read
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def eval_function(self, function: OnnxFunction, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """A script (non-traced) function becomes a call to a model-local ONNX function.

        The call is inlined after emission; its outputs get dtypes from the signature here.
        """
        if isinstance(function, TracedOnnxFunction):
            return function.func(*args, **kwargs)
        signature = function.op_signature
        assert signature is not None
        inputs, attributes = self._bind(signature, args, kwargs)
        ir_function = self._function(function)
        outputs = self.add_node(
            ir_function.domain, ir_function.name, inputs, attributes, len(ir_function.outputs), infer=False
        )
        bindings = _type_bindings(signature, inputs)
        for value, param in zip(outputs, signature.outputs):
            dtype = bindings.get(param.type_constraint.name) or _single_dtype(param.type_constraint)
            if dtype is not None:
                value.dtype = dtype
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _folded(
        self, op_type: str, inputs: Sequence[ir.Value | None], attributes: Sequence[ir.Attr]
    ) -> ir.Value | None:
        """The constant a node of constants computes (``_emit/folding.py``), or None: then the node is recorded.

        Read here, where a trace's watch trusts the reads: a trace key holds the bytes of constants of up to 64
        elements, so a fold that read a larger one makes the trace being recorded one that is not replayed."""
        if op_type == "CastLike" and len(inputs) == 2 and inputs[1] is not None and inputs[1].dtype is not None:
            # Only the target's dtype is read (the optimizer makes it a Cast): the target may be anything.
            op_type, inputs, attributes = "Cast", inputs[:1], [ir.AttrInt64("to", inputs[1].dtype)]
        result = folding.static_shape(op_type, inputs[0] if inputs else None, attributes)
        if result is None:
            if op_type in ("Shape", "Size"):
                return None
            for value in inputs:  # every input checked before any is read: a weight read is one folded (_weight_reads)
                const = None if value is None else value.const_value
                if value is not None and (const is None or value.is_graph_input()):
                    return None
                if value is not None and value.is_initializer() and not self.fold_initializers:
                    return None
                if const is not None and const.size > folding.INPUT_SIZE_LIMIT:
                    return None
            arrays: list[np.ndarray | None] = []
            for value in inputs:
                const = None if value is None else value.const_value
                try:
                    arrays.append(None if const is None else const.numpy().view(const.dtype.numpy()))
                except Exception:  # a weight without bytes (on the meta device: export(weights=...))
                    return None
            version = self.opset_imports.get("", BASE_OPSET)
            dtypes_of = [None if value is None else value.dtype for value in inputs]
            result = folding.evaluate(op_type, version, arrays, dtypes_of, attributes)
            if result is None:
                return None
            for value in inputs:
                if (
                    value is not None
                    and value.const_value is not None
                    and value.const_value.size > _READ_CONSTANT_SIZE
                    and id(value) not in self._constant_keys  # a shared constant is keyed by its value
                ):
                    _note_watched(value, "const_value")
        # Shared by value, as Python constants are: the same constant folded in each layer is one value, so the
        # nodes that read it stay alike for the optimizer's common subexpression elimination.
        key = (ir.DataType.from_numpy(result.dtype), result.shape, result.tobytes())
        shared = self._constants.get(key)
        if shared is None:
            shared = self._constants[key] = self.constant(result)
            self._constant_keys[id(shared)] = key
        return shared

    # --- building blocks ----------------------------------------------------------------------
    def add_node(
        self,
        domain: str,
        op_type: str,
        inputs: Sequence[ir.Value | None],
        attributes: Sequence[ir.Attr] = (),
        num_outputs: int = 1,
        *,
        version: int | None = None,
        infer: bool = True,
    ) -> list[ir.Value]:
        name = self.fresh_name(f"node_{op_type}")
        node = ir.Node(
            domain,
            op_type,
            inputs,
            attributes,
            outputs=[ir.Value(name=self.fresh_name("val")) for _ in range(num_outputs)],
            version=version,
            name=name,
            metadata_props=dict(self._metadata) if self._metadata else None,
        )
        self.graph.append(node)
        self.nodes_added += 1
        if self._log is not None:
            self._log.append(node)
        if infer:
            infer_node_types(node, self.opset_imports, self._inferred)
        return list(node.outputs)

    def constant(self, value: Any, dtype: ir.DataType | None = None) -> ir.Value:
        """A ``Constant`` node for a Python/numpy value; identical constants are shared."""
        if _is_value(value):
            return value
        # Python numbers first: an isinstance check against a runtime Protocol costs ~0.3 ms.
        plain = isinstance(value, (bool, int, float, list, tuple, np.generic))
        # ir.Tensor rather than ir.tensor for numpy arrays: what ir.tensor builds for them, without its checks
        # against runtime Protocols (~50 us each, and a constant is made for most lowered nodes).
        if not plain and isinstance(value, (np.ndarray, ir.TensorProtocol)):
            tensor = ir.Tensor(value) if isinstance(value, np.ndarray) else value
            if dtype is not None and tensor.dtype != dtype:
                tensor = ir.Tensor(tensor.numpy().astype(dtype.numpy()), dtype=dtype)
            key = None
        else:
            if dtype is None:
                dtype = _python_dtype(value)
            array = np.asarray(value, dtype=dtype.numpy())
            tensor = ir.Tensor(array, dtype=dtype)
            key = (dtype, array.shape, array.tobytes())
        if key is not None and key in self._constants:
            return self._constants[key]
        (output,) = self.add_node("", "Constant", [], [ir.AttrTensor("value", tensor)], infer=False)
        output.dtype = tensor.dtype
        output.shape = ir.Shape(tensor.shape)
        output.const_value = tensor
        if key is not None:
            self._constants[key] = output
            self._constant_keys[id(output)] = key
        return output

    def _converted_number(
        self, signature: schemas.OpSignature, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> ir.Value | None:
        """``Cast``/``CastLike`` of a Python number: a constant of the target dtype, converted from the exact number.

        Materialized first with its default dtype (float32 for a Python float), the number would be rounded
        before the Cast: ``CastLike(0.1, x_float64)`` would hold 0.10000000149. None when this does not apply.
        """
        if signature.domain != "" or signature.name not in ("Cast", "CastLike") or not args:
            return None
        number = args[0]
        if type(number) not in (bool, int, float) or set(kwargs) - {"to", "target_type"}:
            return None
        if signature.name == "Cast":
            dtype = ir.DataType(int(kwargs["to"])) if "to" in kwargs else None
        else:
            like = args[1] if len(args) > 1 else kwargs.get("target_type")
            dtype = like.dtype if _is_value(like) else None
        if dtype is None or not (dtype in _EXACT_FLOAT_TARGETS or dtype.is_integer() or dtype == ir.DataType.BOOL):
            return None
        try:
            with np.errstate(all="raise"):
                np.asarray(number, dtype=dtype.numpy())
        except (ArithmeticError, ValueError, TypeError):
            return None  # out of the target's range (ONNX's Cast wraps or saturates): the Cast node decides
        return self.constant(number, dtype)

    def cast(self, value: ir.Value, dtype: ir.DataType) -> ir.Value:
        if value.dtype == dtype:
            return value
        attributes = [ir.AttrInt64("to", dtype)]
        folded = self._folded("Cast", [value], attributes) if value.const_value is not None else None
        if folded is not None:
            return folded
        (output,) = self.add_node("", "Cast", [value], attributes)
        return output

    # --- argument binding ---------------------------------------------------------------------
    def _bind(
        self, signature: schemas.OpSignature, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> tuple[list[ir.Value | None], list[ir.Attr]]:
        """Split call arguments into ONNX inputs and attributes following the signature."""
        named: dict[str, Any] = {}
        positional = list(args)
        variadic: list[Any] = []
        for param in signature.params:
            if isinstance(param, schemas.Parameter) and param.variadic:
                variadic = positional
                positional = []
                named[param.name] = variadic
                continue
            if positional:
                named[param.name] = positional.pop(0)
            elif param.name in kwargs:
                named[param.name] = kwargs[param.name]
        unknown = set(kwargs) - {p.name for p in signature.params}
        if unknown or positional:
            raise RecordingError(f"{signature.domain}::{signature.name}: unexpected arguments {sorted(unknown)}")

        tensor_params = [p for p in signature.params if isinstance(p, schemas.Parameter)]
        bindings = _type_bindings(signature, [named.get(p.name) for p in tensor_params if not p.variadic])
        for p in tensor_params:
            if p.variadic:
                for item in named.get(p.name, []):
                    if _is_value(item) and item.dtype is not None:
                        bindings.setdefault(p.type_constraint.name, item.dtype)

        inputs: list[ir.Value | None] = []
        for p in tensor_params:
            if p.name not in named:
                if p.required and not p.variadic:
                    raise RecordingError(f"{signature.domain}::{signature.name}: missing input {p.name}")
                inputs.append(None)
                continue
            dtype = bindings.get(p.type_constraint.name) or _single_dtype(p.type_constraint)
            items = named[p.name] if p.variadic else [named[p.name]]
            weak = _weak_float_dtype(bindings, p.type_constraint) if dtype is None else None
            inputs.extend(self._as_input(item, weak if type(item) is float and weak else dtype) for item in items)
        while inputs and inputs[-1] is None:
            inputs.pop()

        attributes = []
        for p in signature.params:
            if isinstance(p, schemas.AttributeParameter) and named.get(p.name) is not None:
                attributes.append(_as_attribute(p, named[p.name]))
        return inputs, attributes

    def _as_input(self, value: Any, dtype: ir.DataType | None) -> ir.Value | None:
        if value is None or _is_value(value):
            return value
        if isinstance(value, (list, tuple)) and any(_is_value(v) for v in value):
            # A shape-like list mixing symbolic values and ints: concatenate 1-D pieces.
            pieces = []
            for item in value:
                if _is_value(item):
                    if item.shape is not None and item.shape.rank() == 0:
                        item = self.add_node("", "Reshape", [item, self.constant([1])])[0]
                    pieces.append(self.cast(item, dtype or ir.DataType.INT64))
                else:
                    pieces.append(self.constant([item], dtype))
            return self.add_node("", "Concat", pieces, [ir.AttrInt64("axis", 0)])[0]
        return self.constant(value, dtype)

    def _function(self, function: OnnxFunction) -> ir.Function:
        proto = function.to_function_proto()
        identifier = (proto.domain, proto.name, "")
        if identifier not in self.functions:
            ir_function = ir.serde.deserialize_function(proto)
            self.functions[identifier] = ir_function
            for domain, version in ir_function.opset_imports.items():
                self.opset_imports.setdefault(domain, version)
            self.opset_imports.setdefault(proto.domain, 1)
            # A script function may itself call other script functions.
            for called in function.function_ir.get_called_functions().values():
                self._function(called)
        return self.functions[identifier]

    # --- traces kept and replayed -------------------------------------------------------------------
    def call_traced(self, function: Any, arguments: Mapping[str, Any], call: Callable[[], Any]) -> Any:
        """`call()` (which runs `function` on `arguments`), or a replay of the nodes an earlier call recorded when
        the two calls are alike in all the function can read: a model's repeated layers lower the same op on the
        same types dozens of times, and tracing a torchlib function costs ~10x adding its nodes.

        The first call of a kind is traced with its input values watched: if the function reads anything of them
        but their types and shapes (their producer, constant value, name, uses...), or adds nodes the recorder
        cannot replay (subgraphs, values from elsewhere, names of its own), that kind is always traced afresh.
        A replay adds the same nodes, names, metadata, types and shapes a fresh trace would.
        """
        if self._traces is None or self._log is not None:
            return call()
        try:
            key, inputs = _trace_key(function, arguments, self._constant_keys)
        except _NotKeyable:
            return call()
        trace = self._traces.get(key, _UNSEEN)
        if trace is None:
            return call()
        if trace is not _UNSEEN:
            assert isinstance(trace, _Trace)
            return self._replay(trace, inputs)
        reads: list[str] = []
        for value in inputs:
            _WATCHED_READS[id(value)] = reads
            value.__class__ = _WatchedValue
        names, length, self._log = self._names, len(self.graph), []
        try:
            result = call()
        finally:
            log, self._log = self._log, None
            for value in inputs:
                value.__class__ = ir.Value
                _WATCHED_READS.pop(id(value), None)
        replayable = not reads and len(self.graph) - length == len(log)
        self._traces[key] = _Trace.of(self, log, inputs, result, names) if replayable else None
        return result

    def _replay(self, trace: _Trace, inputs: Sequence[ir.Value]) -> Any:
        produced: list[Sequence[ir.Value]] = []
        constants = self._constants

        def resolve(reference: _Reference) -> Any:
            kind, first, second = reference
            if kind == "input":
                return inputs[first]
            if kind == "node":
                return produced[first][second]
            return constants[first]  # "constant": a shared constant (it exists: the recorded call made it)

        metadata = self._metadata
        for recorded in trace.nodes:
            if recorded.shared_constant is not None:
                produced.append((constants[recorded.shared_constant],))
                continue
            name = self.fresh_name(recorded.name_hint)
            # The outputs made whole, then given to the node: what setting each of their fields after costs twice.
            outputs = [
                ir.Value(
                    name=self.fresh_name("val"),
                    type=None if dtype is None else ir.TensorType(dtype),
                    shape=None if dims is None else ir.Shape(dims),
                    const_value=const_value,
                )
                for dtype, dims, const_value in recorded.outputs
            ]
            node = ir.Node(
                recorded.domain,
                recorded.op_type,
                [None if reference is None else resolve(reference) for reference in recorded.inputs],
                [ir.Attr(a.name, a.type, a.value) for a in recorded.attributes],
                outputs=outputs,
                version=recorded.version,
                name=name,
                metadata_props=dict(metadata) if metadata else None,
            )
            self.graph.append(node)
            self.nodes_added += 1
            produced.append(outputs)
        return _rebuild(trace.result, resolve)


class _Recording:
    """The context of :meth:`GraphRecorder.recording` (entered once per FX node: a class, not a generator, and the
    default evaluator switched as onnxscript's ``default_as`` does, without its own generator)."""

    __slots__ = ("metadata", "previous", "recorder")

    def __init__(self, recorder: GraphRecorder, metadata: dict[str, str]) -> None:
        self.recorder = recorder
        self.metadata = metadata
        self.previous: tuple[dict[str, str], Any, evaluator.Evaluator] | None = None

    def __enter__(self) -> None:
        recorder = self.recorder
        previous_metadata, recorder._metadata = recorder._metadata, self.metadata
        previous_handler = ir.set_value_magic_handler(_ARITHMETIC)
        self.previous = (previous_metadata, previous_handler, evaluator.default())
        evaluator.set_default(recorder)

    def __exit__(self, *exc_info: object) -> None:
        assert self.previous is not None
        previous_metadata, previous_handler, previous_evaluator = self.previous
        evaluator.set_default(previous_evaluator)
        self.recorder._metadata = previous_metadata
        ir.set_value_magic_handler(previous_handler)


class _NotKeyable(Exception):
    """An argument a trace key cannot describe: the call is traced as it comes."""


_UNSEEN = object()

# ("input", position among the call's distinct input values, 0) | ("node", recorded node, output index) |
# ("constant", key in the recorder's shared constants, 0)
_Reference = tuple[str, Any, int]


def _trace_key(
    function: Any, arguments: Mapping[str, Any], shared: Mapping[int, tuple[Any, ...]]
) -> tuple[tuple[Any, ...], list[ir.Value]]:
    """What a traced function reads of its arguments when it reads only their types: each input value's dtype,
    shape and (a small one's) constant value, which input values are the same value, and the Python arguments
    (by type and repr: -0.0 is not 0.0, True is not 1). The recorder reads the constant values of inputs of up to 64
    elements (for ONNX's type inference), and of any size for a constant it shares by value (`shared`: id -> its
    key in the recorder's shared constants), whose key holds its bytes: a fold at emit reads them (a mask in each
    attention layer); a function that reads more is seen doing so while its trace is recorded.
    Also the call's distinct input values in order."""
    positions: dict[int, int] = {}
    inputs: list[ir.Value] = []

    def describe(item: Any) -> Any:
        kind = type(item)
        if kind is ir.Value:
            position = positions.get(id(item))
            if position is not None:
                return ("same", position)
            positions[id(item)] = len(inputs)
            inputs.append(item)
            value_type = item.type
            if value_type is not None and (type(value_type) is not ir.TensorType or value_type.denotation is not None):
                raise _NotKeyable
            shape = item.shape
            dims = None if shape is None else shape.dims
            if dims is not None and not all(type(d) is int for d in dims):
                dims = tuple(d if type(d) is int else (d.value,) for d in dims)
            const = item.const_value
            data = shared.get(id(item))
            if const is not None and data is None:
                try:
                    if const.size > _READ_CONSTANT_SIZE:  # a weight, mostly: its type alone, no bytes read
                        data = (const.dtype, tuple(const.shape), None)
                    else:
                        with weight_reads.unwatched():  # a key tells calls apart; the model holds no value it reads
                            data = (const.dtype, tuple(const.shape), const.tobytes())
                except Exception:  # a weight on the meta device or a fake tensor (export(weights=...)): no bytes to key
                    raise _NotKeyable from None
            return (None if value_type is None else value_type.dtype, dims, data)
        if item is None or kind in _PLAIN_KEYS:
            return (kind, repr(item))
        if kind is list or kind is tuple:
            return (kind, tuple([describe(element) for element in item]))
        raise _NotKeyable

    key = (function, tuple([(name, describe(value)) for name, value in arguments.items()]))
    return key, inputs


_PLAIN_KEYS = frozenset({bool, int, float, str})  # Python arguments a trace key holds by type and repr

# id of a watched value -> the list its recording trace notes reads into
_WATCHED_READS: dict[int, list[str]] = {}
_FREE_READS = frozenset({"dtype", "shape", "type"})


class _WatchedValue(ir.Value):
    """An input value of a trace being recorded (its class, for the call): a read by the traced function of
    anything but its type and shape, or a write to it, makes the trace one that is not replayed. onnx_ir's own
    code and the recorder's (which a trace key covers) read freely."""

    __slots__ = ()

    def __getattribute__(self, name: str) -> Any:
        if name[0] != "_" and name not in _FREE_READS and not _reader_is_trusted():
            _note_watched(self, name)
        return object.__getattribute__(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if not _reader_is_trusted():
            _note_watched(self, f"set {name}")
        object.__setattr__(self, name, value)


# Classes of the arguments the recorder sees most that are not ir.Values: isinstance against ir.Value (a Protocol's
# subclass) goes through typing's check, ~8 us a call, several per recorded node.
_NOT_VALUES = frozenset({type(None), bool, int, float, str, list, tuple})


def _is_value(item: object) -> bool:
    """``isinstance(item, ir.Value)``, answered at once for ir.Value itself, a watched one and plain Python values."""
    kind = type(item)
    if kind is ir.Value or kind is _WatchedValue:
        return True
    return kind not in _NOT_VALUES and isinstance(item, ir.Value)


def _reader_is_trusted() -> bool:
    module = sys._getframe(2).f_globals.get("__name__", "")
    return module == __name__ or module.startswith("onnx_ir")


def _note_watched(value: ir.Value, what: str) -> None:
    reads = _WATCHED_READS.get(id(value))
    if reads is not None:
        reads.append(what)


@dataclasses.dataclass(frozen=True)
class _RecordedNode:
    domain: str
    op_type: str
    version: int | None
    inputs: tuple[_Reference | None, ...]
    attributes: tuple[ir.Attr, ...]
    outputs: tuple[tuple[ir.DataType | None, tuple[Any, ...] | None, Any], ...]  # dtype, dims, constant value
    shared_constant: tuple[Any, ...] | None  # a shared constant's key: reused, as a fresh call reuses it

    @property
    def name_hint(self) -> str:
        return f"node_{self.op_type}"


@dataclasses.dataclass(frozen=True)
class _Trace:
    """The nodes one call added, with their inputs as references, and its result with values as references."""

    nodes: tuple[_RecordedNode, ...]
    result: Any

    @classmethod
    def of(
        cls, recorder: GraphRecorder, log: Sequence[ir.Node], inputs: Sequence[ir.Value], result: Any, names: int
    ) -> _Trace | None:
        """The trace, or None when a replay could not add what the call added."""
        references: dict[int, _Reference] = {id(value): ("input", position, 0) for position, value in enumerate(inputs)}

        def reference(value: ir.Value) -> _Reference | None:
            found = references.get(id(value))
            if found is None and id(value) in recorder._constant_keys:
                found = ("constant", recorder._constant_keys[id(value)], 0)
            return found

        metadata = dict(recorder.metadata) or None
        nodes = []
        for index, node in enumerate(log):
            names += 1
            if node.name != f"node_{node.op_type}_{names}" or node.metadata_props != (metadata or {}):
                return None
            if node.doc_string or node.overload or node.meta:
                return None
            inputs_of_node: list[_Reference | None] = []
            for value in node.inputs:
                found = None if value is None else reference(value)
                if value is not None and found is None:
                    return None  # a value from elsewhere
                inputs_of_node.append(found)
            attributes = tuple(node.attributes.values())
            if any(a.is_ref() or a.type in _UNREPLAYABLE_ATTRIBUTES or a.doc_string for a in attributes):
                return None
            outputs = []
            for position, output in enumerate(node.outputs):
                names += 1
                if output.name != f"val_{names}" or output.metadata_props or output.meta or output.doc_string:
                    return None
                value_type, shape = output.type, output.shape
                if value_type is not None and (type(value_type) is not ir.TensorType or value_type.denotation):
                    return None
                if shape is not None and any(shape.get_denotation(axis) for axis in range(len(shape))):
                    return None
                dims = None if shape is None else tuple(shape)
                outputs.append((output.dtype, dims, output.const_value))
                references[id(output)] = ("node", index, position)
            shared = recorder._constant_keys.get(id(node.outputs[0])) if node.op_type == "Constant" else None
            nodes.append(
                _RecordedNode(
                    node.domain,
                    node.op_type,
                    node.version,
                    tuple(inputs_of_node),
                    attributes,
                    tuple(outputs),
                    shared,
                )
            )
        if names != recorder._names:
            return None  # names were taken by something else than the nodes it added

        def template(item: Any) -> Any:
            if isinstance(item, ir.Value):
                found = reference(item)
                if found is None:
                    raise _NotKeyable
                return _ValueReference(found)
            if isinstance(item, (list, tuple)):
                return type(item)(template(element) for element in item)
            if item is None or type(item) in (bool, int, float, str):
                return item
            raise _NotKeyable

        try:
            return cls(tuple(nodes), template(result))
        except _NotKeyable:
            return None


_UNREPLAYABLE_ATTRIBUTES = frozenset({ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS})


@dataclasses.dataclass(frozen=True)
class _ValueReference:
    reference: _Reference


def _rebuild(template: Any, resolve: Callable[[_Reference], Any]) -> Any:
    if isinstance(template, _ValueReference):
        return resolve(template.reference)
    if isinstance(template, (list, tuple)):
        return type(template)(_rebuild(element, resolve) for element in template)
    return template


class _NestedRecorder(GraphRecorder):
    def __init__(self, graph: ir.Graph, parent: GraphRecorder) -> None:
        super().__init__(graph, parent.opset_imports)
        self.parent = parent
        self.functions = parent.functions
        self._inferred = parent._inferred
        self._traces = None  # its names are its parent's: a trace's names would not be consecutive
        self.fold_initializers = parent.fold_initializers

    def fresh_name(self, hint: str = "v") -> str:
        return self.parent.fresh_name(hint)


class _ArithmeticHandler:
    """``x + y`` on ir.Values inside torchlib functions: record the ONNX op."""

    def Add(self, lhs: Any, rhs: Any) -> Any:
        return onnxscript.opset18.Add(lhs, rhs)

    def Sub(self, lhs: Any, rhs: Any) -> Any:
        return onnxscript.opset18.Sub(lhs, rhs)

    def Mul(self, lhs: Any, rhs: Any) -> Any:
        return onnxscript.opset18.Mul(lhs, rhs)

    def Div(self, lhs: Any, rhs: Any) -> Any:
        return onnxscript.opset18.Div(lhs, rhs)

    def Neg(self, operand: Any) -> Any:
        return onnxscript.opset18.Neg(operand)


_ARITHMETIC = _ArithmeticHandler()  # stateless: one for every recording


# --- helpers ------------------------------------------------------------------------------------
def _python_dtype(value: Any) -> ir.DataType:
    if isinstance(value, (list, tuple)):
        if not value:
            return ir.DataType.INT64
        kinds = {type(v) for v in value}
        for kind in (float, int, bool):
            if kind in kinds:
                return _PY_DEFAULT_DTYPES[kind]
    if isinstance(value, np.generic):
        return ir.DataType.from_numpy(value.dtype)
    for kind, dtype in _PY_DEFAULT_DTYPES.items():
        if type(value) is kind:
            return dtype
    return ir.DataType.FLOAT


def _weak_float_dtype(
    bindings: Mapping[str, ir.DataType], constraint: schemas.TypeConstraintParam
) -> ir.DataType | None:
    """float64 for a Python float whose type variable nothing binds, when the call's float tensors are float64.

    As in eager, where a Python number takes the dtype of the tensors it meets, not float32: ``Pow(x, 1.7)`` and
    ``aten_fill(x, 0.3)`` (whose value has a type variable of its own) on float64 get float64 constants.
    float16/bfloat16 calls keep float32 constants, which hold those numbers more precisely.
    """
    floats = {d for d in bindings.values() if d.is_floating_point()}
    if floats != {ir.DataType.DOUBLE}:
        return None
    return ir.DataType.DOUBLE if ir.DataType.DOUBLE in dtypes.allowed_dtypes(constraint) else None


def _single_dtype(constraint: schemas.TypeConstraintParam) -> ir.DataType | None:
    if len(constraint.allowed_types) == 1:
        (only,) = constraint.allowed_types
        return getattr(only, "dtype", None)
    return None


def _type_bindings(signature: schemas.OpSignature, values: Sequence[Any]) -> dict[str, ir.DataType]:
    bindings: dict[str, ir.DataType] = {}
    params = [p for p in signature.params if isinstance(p, schemas.Parameter)]
    for param, value in zip(params, values):
        if _is_value(value) and value.dtype is not None:
            bindings.setdefault(param.type_constraint.name, value.dtype)
    return bindings


def _as_attribute(param: schemas.AttributeParameter, value: Any) -> ir.Attr:
    kind = param.type
    name = param.name
    # Plain values first: isinstance against onnx_ir's classes goes through typing's slower Protocol check.
    if not isinstance(value, (int, float, str, list, tuple)) and isinstance(value, ir.Attr):
        return value
    if kind == ir.AttributeType.FLOAT:
        return ir.AttrFloat32(name, float(value))
    if kind == ir.AttributeType.INT:
        return ir.AttrInt64(name, int(value))
    if kind == ir.AttributeType.STRING:
        return ir.AttrString(name, str(value))
    if kind == ir.AttributeType.FLOATS:
        return ir.AttrFloat32s(name, [float(v) for v in value])
    if kind == ir.AttributeType.INTS:
        return ir.AttrInt64s(name, [int(v) for v in value])
    if kind == ir.AttributeType.STRINGS:
        return ir.AttrStrings(name, [str(v) for v in value])
    if kind == ir.AttributeType.TENSOR:
        if isinstance(value, np.ndarray):
            return ir.AttrTensor(name, ir.Tensor(value))  # what ir.tensor makes of it, without its Protocol checks
        tensor = value if type(value) is ir.Tensor or isinstance(value, ir.TensorProtocol) else ir.tensor(value)
        return ir.AttrTensor(name, tensor)
    if kind == ir.AttributeType.GRAPH:
        return ir.AttrGraph(name, value)
    return ir.convenience.convert_attribute(name, value, kind)


_SIGNATURES: dict[tuple[str, str, int], schemas.OpSignature] = {}


def _signature_of(op: onnxscript.values.Op) -> schemas.OpSignature | None:
    """The op's signature, built once per ONNX schema (onnxscript makes a new Op, and signature, per call)."""
    schema = op.op_schema
    if schema is None:
        return op.op_signature
    key = (schema.domain, schema.name, schema.since_version)
    signature = _SIGNATURES.get(key)
    if signature is None:
        signature = _SIGNATURES[key] = op.op_signature
    return signature


def _num_outputs(
    schema: onnx.defs.OpSchema | None,
    signature: schemas.OpSignature,
    inputs: Sequence[ir.Value | None],
    attributes: Sequence[ir.Attr],
) -> int:
    attrs = {a.name: a.value for a in attributes}
    if signature.domain == "":
        if signature.name == "Split":
            if "num_outputs" in attrs:
                return int(attrs["num_outputs"])
            if len(inputs) > 1 and inputs[1] is not None and inputs[1].const_value is not None:
                return int(inputs[1].const_value.numpy().size)
            raise RecordingError("Split: the number of outputs is unknown (give num_outputs)")
        if signature.name == "BatchNormalization" and not attrs.get("training_mode", 0):
            return 1
        if signature.name == "Attention" and (len(inputs) < 5 or inputs[4] is None):
            return 1  # without a past key/value cache there is no present one to return
        if signature.name in ("Loop", "Scan"):
            body = attrs["body"]
            return len(body.outputs) - (1 if signature.name == "Loop" else 0)
        if signature.name == "If":
            return len(attrs["then_branch"].outputs)
    return len(signature.outputs)


# Ops whose output has the dtype and shape of their first input; and those that broadcast their inputs.
_SAME_AS_INPUT = frozenset(
    {
        *("Abs", "Ceil", "Cos", "Erf", "Exp", "Floor", "Gelu", "Identity", "IsInf", "IsNaN", "Log", "Neg", "Not"),
        *("Reciprocal", "Relu", "Round", "Sigmoid", "Sign", "Sin", "Softmax", "LogSoftmax", "Sqrt", "Tanh"),
    }
)
_BROADCASTING = frozenset(["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where"])
_COMPARISONS = frozenset(["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor"])


def _infer_simply(node: ir.Node) -> bool:
    """Types of the commonest ops without ONNX's inference (which serializes the node): False when unsure."""
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return False
    if node.op_type in _RESHAPING:
        return _RESHAPING[node.op_type](node)
    inputs = node.inputs
    if not inputs or any(v is None or v.dtype is None or v.shape is None for v in inputs):
        return False
    output, op_type = node.outputs[0], node.op_type
    if op_type in ("IsInf", "IsNaN", "Not"):
        dtype = ir.DataType.BOOL
    elif op_type == "Cast":
        dtype = ir.DataType(node.attributes["to"].as_int())
    elif op_type in _COMPARISONS:
        dtype = ir.DataType.BOOL
    elif op_type == "Where":
        dtype = inputs[1].dtype
    else:
        dtype = inputs[0].dtype
    if op_type in _SAME_AS_INPUT or op_type == "Cast":
        if len(inputs) != 1:
            return False
        shape = ir.Shape(inputs[0].shape)
    elif op_type in _BROADCASTING or op_type in _COMPARISONS:
        shape = _broadcast_shape([v.shape for v in inputs])
        if shape is None:
            return False
    else:
        return False
    output.dtype, output.shape = dtype, shape
    return True


def _infer_constant(node: ir.Node) -> bool:
    """A Constant's type is its attribute's: a tensor's dtype and shape, or a scalar or 1-D list of int64/float."""
    if node.inputs or len(node.attributes) != 1:
        return False
    tensor = constant_attribute_tensor(node.attributes.values())
    if tensor is None:
        return False
    output = node.outputs[0]
    output.dtype, output.shape = tensor.dtype, ir.Shape(tuple(tensor.shape))
    return True


def _infer_transpose(node: ir.Node) -> bool:
    """Transpose: its input's dtype, the dims permuted (reversed without `perm`)."""
    (source,) = node.inputs if len(node.inputs) == 1 else (None,)
    if source is None or source.dtype is None or source.shape is None or set(node.attributes) - {"perm"}:
        return False
    dims = list(source.shape)
    perm_attribute = node.attributes.get("perm")
    if perm_attribute is None:
        perm = list(reversed(range(len(dims))))
    elif perm_attribute.is_ref():
        return False
    else:
        perm = list(perm_attribute.value)
    if sorted(perm) != list(range(len(dims))):
        return False  # ONNX's inference says what is wrong
    output = node.outputs[0]
    output.dtype, output.shape = source.dtype, ir.Shape([dims[axis] for axis in perm])
    return True


def _infer_unsqueeze(node: ir.Node) -> bool:
    """Unsqueeze (opset 13's: axes as a constant input): its input's dtype, a 1 inserted at each axis."""
    if len(node.inputs) != 2 or node.attributes or node.version not in (None, 13, 21, 23, 24, 25):
        return False
    source, axes_value = node.inputs
    if source is None or axes_value is None or source.dtype is None or source.shape is None:
        return False
    const = axes_value.const_value
    if const is None or const.dtype != ir.DataType.INT64 or len(const.shape) > 1:
        return False
    axes = [int(axis) for axis in np.atleast_1d(const.numpy())]
    rank = len(source.shape) + len(axes)
    normalized = sorted(axis + rank if axis < 0 else axis for axis in axes)
    if len(set(normalized)) != len(normalized) or any(not 0 <= axis < rank for axis in normalized):
        return False
    dims = list(source.shape)
    for axis in normalized:
        dims.insert(axis, 1)
    output = node.outputs[0]
    output.dtype, output.shape = source.dtype, ir.Shape(dims)
    return True


# Ops whose types follow from their attributes or constant inputs (infer_node_types asks ONNX for the rest).
_RESHAPING: dict[str, Callable[[ir.Node], bool]] = {
    "Constant": _infer_constant,
    "Transpose": _infer_transpose,
    "Unsqueeze": _infer_unsqueeze,
}


def _broadcast_shape(shapes: Sequence[ir.Shape]) -> ir.Shape | None:
    """numpy broadcasting of static dims, and of symbolic dims that are equal or meet a 1; else None."""
    rank = max(len(s) for s in shapes)
    dims: list[Any] = []
    for axis in range(rank):
        chosen: Any = 1
        for shape in shapes:
            offset = axis - (rank - len(shape))
            if offset < 0:
                continue
            dim = shape[offset]
            if not isinstance(dim, int) and dim.value is None:  # an unknown SymbolicDim
                return None  # an unknown dim equals nothing for sure
            if dim == 1:
                continue
            if chosen == 1:
                chosen = dim
            elif dim != chosen:
                return None  # a mismatch, or symbolic dims that may broadcast: ask ONNX
        dims.append(chosen)
    return ir.Shape(dims)


def infer_node_types(
    node: ir.Node,
    opset_imports: Mapping[str, int],
    cache: dict[tuple[Any, ...], list[_InferredType | None]] | None = None,
) -> None:
    """Fill dtypes and shapes of `node`'s outputs with ONNX's per-node inference.

    With `cache`, ONNX's answer is kept by everything it depends on (the op and its version, the attributes, the
    inputs' types and shapes, the values of small constant inputs, the opsets) and reused for the next node that
    has the same: each inference serializes the node and its inputs (~0.2 ms), and a transformer asks the same
    question once per layer.
    """
    if _infer_simply(node):
        return
    domain = node.domain
    version = node.version or opset_imports.get(domain)
    if version is None:
        return
    key = _inference_key(node, version, opset_imports) if cache is not None else None
    inferred = cache.get(key) if key is not None and cache is not None else None
    if inferred is None:
        type_protos = _infer_with_onnx(node, domain, version, opset_imports)
        if type_protos is None:
            return
        inferred = [_InferredType.of(type_proto) if type_proto is not None else None for type_proto in type_protos]
        if key is not None and cache is not None:
            cache[key] = inferred
    for output, answer in zip(node.outputs, inferred):
        if answer is None:
            continue
        if output.type is None:
            output.type = answer.fresh_type()
        shape = answer.fresh_shape()
        if shape is not None and output.shape is None:
            output.shape = shape


@dataclasses.dataclass(frozen=True)
class _InferredType:
    """One output's inferred type, deserialized once; each output it is given to gets objects of its own (onnx_ir
    mutates types and shapes in place)."""

    type_proto: onnx.TypeProto
    tensor_dtype: ir.DataType | None  # a plain tensor type's dtype, rebuilt without deserializing
    dims: tuple[Any, ...] | None  # a shape without denotations, rebuilt without deserializing
    has_shape: bool

    @classmethod
    def of(cls, type_proto: onnx.TypeProto) -> _InferredType:
        type_ = ir.serde.deserialize_type_proto_for_type(type_proto)
        plain = type(type_) is ir.TensorType and type_.denotation is None
        shape = ir.serde.deserialize_type_proto_for_shape(type_proto)
        simple_shape = shape is not None and all(shape.get_denotation(i) is None for i in range(len(shape)))
        dims = tuple(shape) if shape is not None and simple_shape else None
        return cls(type_proto, type_.dtype if plain else None, dims, shape is not None)

    def fresh_type(self) -> ir.TypeProtocol | None:
        if self.tensor_dtype is not None:
            return ir.TensorType(self.tensor_dtype)
        return ir.serde.deserialize_type_proto_for_type(self.type_proto)

    def fresh_shape(self) -> ir.Shape | None:
        if not self.has_shape:
            return None
        if self.dims is not None:
            return ir.Shape(self.dims)
        return ir.serde.deserialize_type_proto_for_shape(self.type_proto)


def _infer_with_onnx(
    node: ir.Node, domain: str, version: int, opset_imports: Mapping[str, int]
) -> list[onnx.TypeProto | None] | None:
    """ONNX's inferred type of each output of `node` (None where it infers none); None when it cannot tell."""
    try:
        schema = onnx.defs.get_schema(node.op_type, version, domain)
    except onnx.defs.SchemaError:
        try:  # an op newer than the emission opset (Attention-23 when exporting to 23+): its own version
            schema = onnx.defs.get_schema(node.op_type, onnx.defs.onnx_opset_version(), domain)
        except onnx.defs.SchemaError:
            return None
        opset_imports = {**opset_imports, domain: schema.since_version}
    input_types: dict[str, onnx.TypeProto] = {}
    input_data: dict[str, onnx.TensorProto] = {}
    for value in node.inputs:
        if value is None or value.type is None:
            if value is not None:
                return None  # an input of unknown type: nothing to infer from
            continue
        input_types[value.name] = ir.serde.serialize_value(value).type
        const = value.const_value
        if const is not None and const.size <= _READ_CONSTANT_SIZE:
            # A meta or fake weight (export(weights=...)) has no bytes: inferred from its type and shape only. A float
            # weight's values make no shape: its read puts nothing of them in the model (apply_weights may swap it).
            reads = weight_reads.unwatched() if const.dtype.is_floating_point() else contextlib.nullcontext()
            with contextlib.suppress(Exception), reads:
                input_data[value.name] = ir.serde.serialize_tensor(const)
    try:
        inferred = onnx.shape_inference.infer_node_outputs(
            schema,
            ir.serde.serialize_node(node),
            input_types,
            input_data,
            opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opset_imports.items()],
        )
    except Exception:
        return None
    return [inferred.get(output.name) for output in node.outputs]


def _inference_key(node: ir.Node, version: int, opset_imports: Mapping[str, int]) -> tuple[Any, ...] | None:
    """What ONNX's inference of `node` depends on, hashable; None for a node not worth keeping (a graph
    attribute, a large tensor attribute, an input whose type is not a plain tensor)."""
    attributes: list[Any] = []
    for attribute in node.attributes.values():
        if attribute.is_ref():
            return None
        kind = attribute.type
        if kind in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS, ir.AttributeType.TENSORS):
            return None
        if kind == ir.AttributeType.TENSOR:
            tensor = attribute.value  # a TENSOR attribute's value is a tensor (as_tensor checks a Protocol)
            if tensor.size > 64:
                return None
            attributes.append((attribute.name, tensor.dtype, tuple(tensor.shape), tensor.tobytes()))
        else:
            attributes.append((attribute.name, kind, repr(attribute.value)))  # repr: -0.0 is not 0.0
    inputs: list[Any] = []
    for value in node.inputs:
        if value is None:
            inputs.append(None)
            continue
        kind = value.type
        if kind is None:
            return None  # the inference returns at once
        if type(kind) is not ir.TensorType or kind.denotation is not None:
            return None
        shape = value.shape
        if shape is not None and any(shape.get_denotation(axis) is not None for axis in range(len(shape))):
            return None
        const = value.const_value
        try:
            with weight_reads.unwatched():  # a key tells nodes apart; the model holds no value it reads
                data = (
                    (const.dtype, tuple(const.shape), const.tobytes())
                    if const is not None and const.size <= _READ_CONSTANT_SIZE
                    else None
                )
        except Exception:  # a weight on the meta device or a fake tensor (export(weights=...)): no bytes to key
            return None
        inputs.append((kind.dtype, None if shape is None else tuple(shape), data))
    return (
        node.domain,
        node.op_type,
        version,
        len(node.outputs),
        tuple(attributes),
        tuple(inputs),
        tuple(opset_imports.items()),
    )


_NOT_LOOKED_UP = object()


class LazyTracedOnnxFunction(TracedOnnxFunction):
    """A traced function whose signature (its type constraints, read from its annotations) is computed when first
    asked for, not when it is defined: the registry holds ~1,000 of them and an export looks up a few dozen.

    Reading the annotations cost ~40% of building the registry, the first export's fixed cost. The signature is
    the one :class:`TracedOnnxFunction` computes, by the same code, so dispatch decides exactly as before.
    """

    def __init__(self, opset: onnxscript.values.Opset, func: Callable[..., Any]) -> None:
        # What TracedOnnxFunction (Op.__init__) sets, minus the signature and the ONNX schema lookup by the function's
        # name (onnx.defs.get_schema, which raises for a lowering's name): both are looked up when first asked for.
        self._opset = opset
        self._name = func.__name__
        self._op_schema: Any = _NOT_LOOKED_UP
        self._signature = None
        self.func = func
        functools.update_wrapper(self, func)

    @property
    def op_schema(self) -> Any:
        if self._op_schema is _NOT_LOOKED_UP:
            found = self.opset[self.name]  # what Op.__init__ looks up
            self._op_schema = found.op_schema if found is not None else None
        return self._op_schema

    @property
    def op_signature(self) -> Any:
        if self._signature is None:
            self._signature = TracedOnnxFunction(self.opset, self.func).op_signature
        return self._signature

    @op_signature.setter
    def op_signature(self, value: Any) -> None:
        self._signature = value
