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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxscript
from onnx_ir import schemas
from onnxscript import evaluator
from onnxscript.values import OnnxFunction, TracedOnnxFunction

from fx2onnx import _dtypes as dtypes

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

    # --- context ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def recording(self, metadata: Mapping[str, str] | None = None) -> Iterator[None]:
        """Within this context, onnxscript op calls record into the graph, tagged with `metadata`."""
        previous = self._metadata
        self._metadata = dict(metadata or {})
        previous_handler = ir.set_value_magic_handler(_ArithmeticHandler())
        try:
            with evaluator.default_as(self):
                yield
        finally:
            self._metadata = previous
            ir.set_value_magic_handler(previous_handler)

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
        version = self.opset_imports.get(op.domain) if op.domain else None
        outputs = self.add_node(op.domain, op.name, inputs, attributes, num_outputs, version=version)
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
        node = ir.Node(
            domain,
            op_type,
            inputs,
            attributes,
            num_outputs=num_outputs,
            version=version,
            name=self.fresh_name(f"node_{op_type}"),
            metadata_props=dict(self._metadata) if self._metadata else None,
        )
        for output in node.outputs:
            output.name = self.fresh_name("val")
        self.graph.append(node)
        self.nodes_added += 1
        if infer:
            infer_node_types(node, self.opset_imports, self._inferred)
        return list(node.outputs)

    def constant(self, value: Any, dtype: ir.DataType | None = None) -> ir.Value:
        """A ``Constant`` node for a Python/numpy value; identical constants are shared."""
        if isinstance(value, ir.Value):
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
            dtype = like.dtype if isinstance(like, ir.Value) else None
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
        (output,) = self.add_node("", "Cast", [value], [ir.AttrInt64("to", dtype)])
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
                    if isinstance(item, ir.Value) and item.dtype is not None:
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
        if value is None or isinstance(value, ir.Value):
            return value
        if isinstance(value, (list, tuple)) and any(isinstance(v, ir.Value) for v in value):
            # A shape-like list mixing symbolic values and ints: concatenate 1-D pieces.
            pieces = []
            for item in value:
                if isinstance(item, ir.Value):
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


class _NestedRecorder(GraphRecorder):
    def __init__(self, graph: ir.Graph, parent: GraphRecorder) -> None:
        super().__init__(graph, parent.opset_imports)
        self.parent = parent
        self.functions = parent.functions
        self._inferred = parent._inferred

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
        if isinstance(value, ir.Value) and value.dtype is not None:
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
        tensor = value if isinstance(value, ir.TensorProtocol) else ir.tensor(value)
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
        if const is not None and const.size <= 64:
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
            tensor = attribute.as_tensor()
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
        data = (const.dtype, tuple(const.shape), const.tobytes()) if const is not None and const.size <= 64 else None
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


class LazyTracedOnnxFunction(TracedOnnxFunction):
    """A traced function whose signature (its type constraints, read from its annotations) is computed when first
    asked for, not when it is defined: the registry holds ~1,000 of them and an export looks up a few dozen.

    Reading the annotations cost ~40% of building the registry, the first export's fixed cost. The signature is
    the one :class:`TracedOnnxFunction` computes, by the same code, so dispatch decides exactly as before.
    """

    def __init__(self, opset: onnxscript.values.Opset, func: Callable[..., Any]) -> None:
        onnxscript.values.Op.__init__(self, opset, func.__name__)  # what TracedOnnxFunction does, minus the signature
        self.func = func
        functools.update_wrapper(self, func)

    @property
    def op_signature(self) -> Any:
        if self._signature is None:
            self._signature = TracedOnnxFunction(self.opset, self.func).op_signature
        return self._signature

    @op_signature.setter
    def op_signature(self, value: Any) -> None:
        self._signature = value
