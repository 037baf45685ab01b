"""Explicit type promotion: every node receives the input dtypes eager PyTorch computes in.

ATen ops promote their inputs internally (``int8 + int16`` computes in int16, ``int64 + 0.5`` in float32,
``sum(bool)`` in int64); ONNX ops take one type and do not. For each node this pass asks the installed torch
which dtype each input is computed in, and inserts ``prims.convert_element_type`` nodes where an input has
another dtype. The rules come from torch at export time, in two ways:

- elementwise ops: the promotion kind and promoting arguments of the op's reference implementation (its
  ``elementwise_type_promotion_wrapper`` in ``torch._refs``), fed to ``torch._prims_common.elementwise_dtypes``;
- other ops whose inputs and outputs differ in dtype (``sum``/``cumsum`` of ints, ``mean(dtype=)``, ``div``
  with a rounding mode...): their decomposition runs on meta tensors and the conversions it applies to its
  inputs are recorded.

(Both are read in :mod:`fx2onnx._passes.promotion_rules`.) Python numbers get the compute dtype as well.

Outputs are left alone: ``meta["val"]`` holds eager's dtype, and the emitter casts an output back only when an
implementation produced another. float16/bfloat16 inputs are not upcast to torch's float32 "opmath" when the
result keeps their dtype: that upcast is an implementation detail of eager kernels, not a dtype eager exposes
(except where :mod:`fx2onnx._passes.float32_opmath`, run before this pass, reproduces eager's rounding).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes, get_computation_dtype
from torch.fx.experimental.symbolic_shapes import optimization_hint

from fx2onnx._capture import recompile_when_read
from fx2onnx._passes.base import PassResult
from fx2onnx._passes.node_builder import fake_mode_of, first_fake_mode
from fx2onnx._passes.promotion_rules import (
    CAST,
    CONVERSIONS,
    ElementwiseRule,
    decomposition,
    elementwise_rule,
    save_conversions,
    traced_conversions,
)
from fx2onnx._records import schema_arguments
from fx2onnx._torch_ops import aten

SCALAR_TO_TENSOR = aten.scalar_tensor.default
# Kinds whose result dtype is not the dtype the inputs are compared/computed in.
_RESULT_IS_NOT_INPUT = {Kind.ALWAYS_BOOL, Kind.COMPLEX_TO_FLOAT}
# Dtype a symbolic scalar node has in the ONNX graph (see GraphEmitter._meta_dtype).
_SYMBOLIC_DTYPES = {torch.SymBool: torch.bool, torch.SymInt: torch.int64, torch.SymFloat: torch.float32}
# Dtype a Python number gets as an ONNX constant when nothing else decides it.
_PYTHON_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float32}
# Ops that copy a value unchanged: a cast of their result is a cast of their input (folded if that is a constant).
_COPIES = {aten.clone.default, aten.lift_fresh_copy.default, aten.alias.default, aten.detach.default}
# Constants up to this many elements are cast at export time rather than by a Cast node.
FOLD_LIMIT = 4096


class PromoteTypes:
    """Insert the casts eager's type promotion implies.

    `constants` maps placeholders that hold constants (weights, lifted tensors) to their values, so casts of
    small ones can be folded.
    """

    name = "promote_types"

    def __init__(self, constants: Mapping[torch.fx.Node, torch.Tensor] | None = None) -> None:
        self.constants = constants or {}

    def __call__(self, graph_module: torch.fx.GraphModule) -> PassResult:
        return PassResult(_promote_types(graph_module, self.constants))


def _promote_types(graph_module: torch.fx.GraphModule, constants: Mapping[torch.fx.Node, torch.Tensor]) -> bool:
    graph = graph_module.graph
    casts = _CastInserter(graph, constants)
    graph_changed = _eager_bool_powers(graph, casts)
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target in CONVERSIONS:
            continue
        rule = elementwise_rule(node.target)
        if rule is None and not _may_convert_inputs(node) and not _has_numbers_to_promote(node):
            continue  # what _traced_input_dtypes and _promote_numbers would find: nothing (told before flattening)
        leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
        slots = None  # schema position -> flat indices, computed once for both uses below
        if rule is not None:
            slots = _schema_slots(node, spec, len(leaves))
            wanted = _elementwise_input_dtypes(node, rule, leaves, slots)
        else:
            wanted = _traced_input_dtypes(node, leaves, spec)
        changed = False
        for index, dtype in wanted.items():
            leaf = leaves[index]
            if isinstance(leaf, torch.fx.Node) and node_dtype(leaf) not in (None, dtype):
                leaves[index] = casts.cast(leaf, dtype, consumer=node)
                changed = True
        changed |= _promote_numbers(node, leaves, spec, wanted if rule is not None else None, casts, slots)
        if changed:
            node.args, node.kwargs = pytree.tree_unflatten(leaves, spec)
            graph_changed = True
    save_conversions()
    if graph_changed:
        _erase_unused_copies(graph)
        graph.lint()
        recompile_when_read(graph_module)
    return graph_changed


def _eager_bool_powers(graph: torch.fx.Graph, casts: _CastInserter) -> bool:
    """bool ** True is the tensor itself and bool ** False all True, both bool in eager (its kernel copies or fills
    for the exponents 1 and 0), where torch's meta function, so the traced graph, says int64 (fuzz seeds 894, 1317).
    The graph's outputs get eager's bool; other uses keep the traced int64 (a cast), as the rest was traced."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != aten.pow.Tensor_Scalar or len(node.args) != 2:
            continue
        base, exponent = node.args
        if type(exponent) is not bool or not isinstance(base, torch.fx.Node) or node_dtype(base) != torch.bool:
            continue
        traced = node_dtype(node)
        if traced in (None, torch.bool):
            continue
        # The node itself becomes the copy or fill (the outputs name it).
        if exponent:
            node.target, node.args, node.kwargs = aten.clone.default, (base,), {}
        else:
            node.target, node.args, node.kwargs = aten.ones_like.default, (base,), {"dtype": torch.bool}
        node.meta["val"] = node.meta["val"].to(torch.bool)
        if not _retrace_users(graph, node):
            for user in list(node.users):
                if user.op != "output":
                    user.replace_input_with(node, casts.cast(node, traced, consumer=user))
        changed = True
    return changed


def _retrace_users(graph: torch.fx.Graph, start: torch.fx.Node) -> bool:
    """Recompute the values (dtypes) of the nodes downstream of `start`, whose dtype changed, on their arguments'
    fake values, so that they compute in eager's dtypes (bool ** True then sorted or expanded stays bool). Applied
    only if every node retraces to its old shape; otherwise nothing changes and False is returned."""
    mode = fake_mode_of(graph)
    if mode is None:
        return False
    changed: dict[torch.fx.Node, Any] = {start: start.meta["val"]}
    seen = False
    for node in graph.nodes:
        if node is start:
            seen = True
            continue
        if not seen or node.op != "call_function" or not any(arg in changed for arg in node.all_input_nodes):
            continue
        try:
            args, kwargs = pytree.tree_map_only(
                torch.fx.Node, lambda n: changed.get(n, n.meta.get("val")), (node.args, node.kwargs)
            )
            with mode:
                value = node.target(*args, **kwargs)
        except Exception:  # an op that cannot be retraced on its own: keep the traced dtypes (casts)
            return False
        old = node.meta.get("val")
        old_leaves, new_leaves = pytree.tree_leaves(old), pytree.tree_leaves(value)
        if len(old_leaves) != len(new_leaves) or any(
            isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor)
            or (isinstance(a, torch.Tensor) and a.shape != b.shape)
            for a, b in zip(old_leaves, new_leaves)
        ):
            return False
        if any(isinstance(a, torch.Tensor) and a.dtype != b.dtype for a, b in zip(old_leaves, new_leaves)):
            changed[node] = value
    for node, value in changed.items():
        node.meta["val"] = value
    return True


def _erase_unused_copies(graph: torch.fx.Graph) -> None:
    """Copies of constants whose only use was a cast that got folded."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and node.target in _COPIES and not node.users:
            graph.erase_node(node)


def _promote_numbers(
    node: torch.fx.Node,
    leaves: list[Any],
    spec: pytree.TreeSpec,
    wanted: dict[int, torch.dtype] | None,
    casts: _CastInserter,
    slots: dict[int, list[int]] | None = None,
) -> bool:
    """Give Python numbers the compute dtype too.

    Where the schema takes a Tensor (``2 - x`` is captured as ``sub.Tensor(2, x)``), the number becomes a 0-d
    constant of the compute dtype (implementations take such arguments as typed tensors), unless it is not the
    leading argument and already has that dtype as an ONNX constant (``x_int64 + 1``). Where it takes a
    Scalar, it becomes a number of the compute dtype's kind, an int wrapped as eager wraps it (``uint8 + -3``
    adds 253). `wanted` holds the promoting arguments of an elementwise op; for other ops (None), only when their
    tensor arguments and result share one dtype, and then only Tensor arguments and ints are touched.
    """
    kinds = _slot_kinds(node.target)
    if "tensor" not in kinds:
        return False  # factories (arange, full): eager computes their numbers in their own types, then converts
    if not _has_number_in_slots(node, kinds):
        return False  # no number where the schema takes a tensor or a scalar: nothing to give a dtype
    outputs = output_dtypes(node)
    common = _common_dtype(node, leaves)
    if common is None and not any(isinstance(leaf, torch.fx.Node) for leaf in leaves):
        common = next(iter(outputs)) if len(outputs) == 1 else None  # div(3, 1.5, rounding_mode=...)
    elif outputs != {common}:
        common = None  # the op changes dtype: its numbers' dtype is not known here
    changed = False
    if slots is None:
        slots = _schema_slots(node, spec, len(leaves))
    for position, indices in slots.items():
        slot = kinds[position]
        for index in indices:
            number = leaves[index]
            if slot is None or type(number) not in (bool, int, float):
                continue
            dtype = wanted.get(index) if wanted is not None else common
            if dtype is None or dtype.is_complex:
                continue
            if slot == "tensor" and (index == 0 or _PYTHON_DTYPES[type(number)] != dtype):
                leaves[index] = casts.number(number, dtype, consumer=node)
            elif wanted is not None or (type(number) is int and _is_integer(dtype)):
                leaves[index] = _as_python(number, dtype)
            changed = changed or leaves[index] is not number
    return changed


def _has_number_in_slots(node: torch.fx.Node, kinds: tuple[str | None, ...]) -> bool:
    """Whether a Python number is given to an argument of a Tensor or Scalar slot (such an argument is one leaf)."""
    arguments = schema_arguments(node.target) or ()
    for position, ((name, kwarg_only, _, _), kind) in enumerate(zip(arguments, kinds)):
        if kind is None:
            continue
        if position < len(node.args) and not kwarg_only:
            value = node.args[position]
        else:
            value = node.kwargs.get(name)
        if type(value) in (bool, int, float):
            return True
    return False


@functools.lru_cache(maxsize=4096)
def _slot_kinds(op: torch._ops.OpOverload) -> tuple[str | None, ...]:
    """:func:`_slot_kind` of each argument of `op`'s schema (kept per op: the schema's bindings are slow to read)."""
    return tuple(_slot_kind(argument.type) for argument in op._schema.arguments)


def _slot_kind(argument_type: torch._C.JitType) -> str | None:
    if isinstance(argument_type, torch.OptionalType):
        argument_type = argument_type.getElementType()
    if isinstance(argument_type, torch.TensorType):
        return "tensor"
    if isinstance(argument_type, torch.NumberType):
        return "scalar"
    return None


def _as_python(number: bool | int | float, dtype: torch.dtype) -> bool | int | float:
    """`number` as a Python number of `dtype`'s kind; floats keep their value (eager computes them in float32+)."""
    if dtype.is_floating_point:
        return number if type(number) is float else float(number)
    if dtype == torch.bool:
        return bool(number)
    wrapped = int(torch.tensor(int(number)).to(dtype).item())
    return number if wrapped == number and type(number) is int else wrapped


def _is_integer(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def _common_dtype(node: torch.fx.Node, leaves: list[Any]) -> torch.dtype | None:
    """The one dtype of the node's tensor arguments (after promotion), if they agree."""
    found = {node_dtype(leaf) for leaf in leaves if isinstance(leaf, torch.fx.Node)} - {None}
    return next(iter(found)) if len(found) == 1 else None


# --- elementwise ops: torch's ELEMENTWISE_TYPE_PROMOTION_KIND ----------------------------------------------------
def _elementwise_input_dtypes(
    node: torch.fx.Node, rule: ElementwiseRule, leaves: list[Any], slots: dict[int, list[int]]
) -> dict[int, torch.dtype]:
    promoting = [index for position in rule.arguments for index in slots.get(position, [])]
    values = [_promotion_value(leaves[index]) for index in promoting]
    values = [v for v in values if v is not None]
    if not values:
        return {}
    _, result = elementwise_dtypes(*values, type_promotion_kind=rule.kind)
    result = node.kwargs.get("dtype") or result
    if result not in output_dtypes(node):
        return {}  # torch's rule does not predict this node's dtype: its arguments map differently; leave it alone
    if rule.kind in _RESULT_IS_NOT_INPUT:
        _, result = elementwise_dtypes(*values, type_promotion_kind=Kind.NO_OPMATH)
    return {index: result for index in promoting}


def _schema_slots(node: torch.fx.Node, spec: pytree.TreeSpec, count: int) -> dict[int, list[int]]:
    """Schema position -> the flat argument indices inside that argument (several for Tensor[])."""
    indexed_args, indexed_kwargs = pytree.tree_unflatten(list(range(count)), spec)
    slots = {}
    for position, (name, kwarg_only, _, _) in enumerate(schema_arguments(node.target) or ()):
        if position < len(indexed_args) and not kwarg_only:
            slots[position] = pytree.tree_leaves(indexed_args[position])
        elif name in indexed_kwargs:
            slots[position] = pytree.tree_leaves(indexed_kwargs[name])
    return slots


def _promotion_value(leaf: Any) -> Any:
    """What ``elementwise_dtypes`` takes for an argument: a (fake) tensor or a Python number."""
    if isinstance(leaf, torch.fx.Node):
        val = leaf.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val
        for symbolic, python_type in ((torch.SymBool, bool), (torch.SymInt, int), (torch.SymFloat, float)):
            if isinstance(val, symbolic):
                return python_type(0)  # only its type matters: a weakly typed scalar
        return None
    if isinstance(leaf, (bool, int, float, complex, torch.Tensor)):
        return leaf
    return None


# --- other ops: run torch's decomposition on meta tensors and record its conversions -------------------------------
def _may_convert_inputs(node: torch.fx.Node) -> bool:
    """False where :func:`_traced_input_dtypes` returns nothing: no decomposition, or one dtype throughout."""
    if decomposition(node.target) is None:
        return False
    outputs = output_dtypes(node)
    inputs = {node_dtype(argument) for argument in node.all_input_nodes} - {None}
    return bool(outputs) and len(inputs | outputs) > 1


def _has_numbers_to_promote(node: torch.fx.Node) -> bool:
    """False where :func:`_promote_numbers` changes nothing: no Python number where the schema takes a tensor or a
    scalar, or a factory's numbers."""
    kinds = _slot_kinds(node.target)
    return "tensor" in kinds and _has_number_in_slots(node, kinds)


def _traced_input_dtypes(node: torch.fx.Node, leaves: list[Any], spec: pytree.TreeSpec) -> dict[int, torch.dtype]:
    if decomposition(node.target) is None:
        return {}
    outputs = output_dtypes(node)
    inputs = {node_dtype(leaf) for leaf in leaves if isinstance(leaf, torch.fx.Node)} - {None}
    if not outputs or len(inputs | outputs) <= 1:
        return {}  # one dtype throughout: nothing to promote
    described = tuple(_describe(leaf) for leaf in leaves)
    converted = traced_conversions(node.target, described, spec)
    wanted = {}
    for index, dtype in converted.items():
        source = node_dtype(leaves[index])
        if source is None or source == dtype:
            continue
        if dtype == get_computation_dtype(source) and source in outputs:
            continue  # float16 computed in float32 and rounded back: an eager kernel detail
        wanted[index] = _common_reduced_float(source, dtype, outputs)
    return wanted


def _common_reduced_float(source: torch.dtype, dtype: torch.dtype, outputs: set[torch.dtype]) -> torch.dtype:
    """An integer or bool input that a decomposition converts to float32 to compute a float16/bfloat16 result:
    eager converts it to that result's dtype first (int32 70000 / a float16 tensor is -inf: 70000 is inf in float16;
    it was -31104; fuzz seed 21000595), then computes in float32."""
    reduced = [d for d in outputs if d in (torch.float16, torch.bfloat16)]
    if source.is_floating_point or source.is_complex or len(reduced) != 1 or dtype != torch.float32:
        return dtype
    return reduced[0]


def _describe(leaf: Any) -> Any:
    """A hashable stand-in for a flat argument: (dtype, concrete shape) for tensors, a hint for symbolic scalars."""
    if isinstance(leaf, torch.fx.Node):
        val = leaf.meta.get("val")
        if isinstance(val, torch.Tensor):
            return ("tensor", val.dtype, tuple(optimization_hint(d, fallback=2) for d in val.shape))
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            hint = val.node.hint if val.node.hint is not None else val.node.pytype(1)
            return ("scalar", type(hint), hint)
        return ("opaque", leaf.name)
    return ("constant", type(leaf), leaf)  # the type too: 2 == 2.0 == True, but they promote differently


# --- helpers ---------------------------------------------------------------------------------------------------------
def node_dtype(node: torch.fx.Node) -> torch.dtype | None:
    """The dtype an FX node's value has in the ONNX graph (symbolic scalars included)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dtype
    return next((dtype for kind, dtype in _SYMBOLIC_DTYPES.items() if isinstance(val, kind)), None)


def output_dtypes(node: torch.fx.Node) -> set[torch.dtype]:
    return {v.dtype for v in pytree.tree_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)}


def constant_value(node: torch.fx.Node, constants: Mapping[torch.fx.Node, torch.Tensor]) -> torch.Tensor | None:
    """The tensor behind `node` if it is a constant (seen through copies such as ``clone``): a ``get_attr``, or a
    placeholder `constants` maps to its value (weights, lifted tensors)."""
    while node.op == "call_function" and node.target in _COPIES and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    if node.op == "get_attr":
        value = node.graph.owning_module
        for part in str(node.target).split("."):
            value = getattr(value, part, None)
        return value if isinstance(value, torch.Tensor) else None
    return constants.get(node)


class _CastInserter:
    """Inserts one cast per (value, dtype), before its first consumer, with a fake-tensor ``meta["val"]``.

    A cast of a small constant (a weight, a lifted ``torch.tensor(...)``, a number) is folded: the graph gets a
    constant of the new dtype instead (a ``get_attr`` of a buffer, which the emitter makes an initializer).
    """

    def __init__(self, graph: torch.fx.Graph, constants: Mapping[torch.fx.Node, torch.Tensor]) -> None:
        self.graph = graph
        self.constants = constants
        self.cache: dict[tuple[Any, ...], torch.fx.Node] = {}
        self.fake_mode = first_fake_mode(n.meta.get("val") for n in graph.nodes if n.op == "placeholder")
        self.constants_made = 0

    def cast(self, source: torch.fx.Node, dtype: torch.dtype, *, consumer: torch.fx.Node) -> torch.fx.Node:
        key = (source, dtype)
        if key in self.cache:
            return self.cache[key]
        constant = constant_value(source, self.constants)
        if constant is not None and constant.numel() <= FOLD_LIMIT:
            cast = self._get_attr(constant.detach().to(dtype), consumer)
        else:
            val = source.meta.get("val")
            with self.graph.inserting_before(consumer):
                if isinstance(val, torch.Tensor):
                    cast = self.graph.call_function(CAST, (source, dtype))
                    cast.meta["val"] = CAST(val, dtype)
                else:  # a symbolic scalar (a size, a sym_float): a 0-d tensor of the compute dtype
                    cast = self.graph.call_function(SCALAR_TO_TENSOR, (source,), {"dtype": dtype})
                    cast.meta["val"] = self._fake(torch.empty((), dtype=dtype))
            for name in ("stack_trace", "nn_module_stack", "source_fn_stack"):
                if name in consumer.meta:
                    cast.meta[name] = consumer.meta[name]
        self.cache[key] = cast
        return cast

    def number(self, value: bool | int | float, dtype: torch.dtype, *, consumer: torch.fx.Node) -> torch.fx.Node:
        """A 0-d constant of `dtype` holding `value` as eager converts it (ints wrap into unsigned types)."""
        key = (type(value), value, dtype)
        if key not in self.cache:
            # A Python float is a double: torch.tensor(0.1) would round it to float32 before the conversion.
            exact = torch.tensor(value, dtype=torch.float64 if type(value) is float else None)
            self.cache[key] = self._get_attr(exact.to(dtype), consumer)
        return self.cache[key]

    def _get_attr(self, tensor: torch.Tensor, consumer: torch.fx.Node) -> torch.fx.Node:
        module = self.graph.owning_module
        name = f"_promoted_constant_{self.constants_made}"
        while hasattr(module, name):
            name += "_"
        self.constants_made += 1
        module.register_buffer(name, tensor, persistent=False)
        with self.graph.inserting_before(consumer):
            node = self.graph.get_attr(name)
        node.meta["val"] = self._fake(tensor)
        return node

    def _fake(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.fake_mode is None:
            return tensor.to("meta")
        return self.fake_mode.from_tensor(tensor)
