"""Both branches of a size-oblivious decision in one ONNX model, chosen at run time by an ``If``.

Where the capture decided a guard on a data-dependent size for the general branch (``if kept.numel() == 0`` taken
as False, ``_capture_strategies.size_oblivious_guards``), the model's special branch may compute something else
(``return torch.zeros(1)``): the general graph alone is then silently wrong on those inputs. The export captures
the model a second time with the decision taken the other way, and :func:`join` makes one model of the two:

- the main graph keeps what the condition reads (the general graph's nodes up to the values whose sizes are the
  condition's symbols) and what the run-time checks read, and computes the condition (``runtime_checks``);
- an ``If`` on it: its then-branch is the whole special graph, its else-branch the rest of the general graph. Both
  read the main graph's inputs and initializers from the outer scope; the outputs keep the general graph's names.

The branches must agree in the number and dtypes of their outputs (their shapes may differ: ONNX's If allows it);
:func:`disagreement` says where they do not, and the export then keeps the general graph alone, with a warning.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import sympy
import torch

from fx2onnx._capture import CapturedGraph
from fx2onnx._emit import runtime_checks
from fx2onnx._records import RUNTIME_CHECK
from fx2onnx._torch_ops import aten

_SPECIAL_PREFIX = "fx2onnx_special_"


def disagreement(general: ir.Model, special: ir.Model, outputs: int) -> str | None:
    """Why the two captures cannot be the branches of one If (outputs' count or dtypes), or None."""
    if len(special.graph.outputs) != outputs:
        return f"the special branch returns {len(special.graph.outputs)} outputs, the general one {outputs}"
    if len(special.graph.inputs) != len(general.graph.inputs):
        return (
            f"the special branch reads {len(special.graph.inputs)} inputs, the general one {len(general.graph.inputs)}"
        )
    for index, (one, other) in enumerate(zip(general.graph.outputs[:outputs], special.graph.outputs)):
        if one.dtype != other.dtype:
            return f"output {index} is {one.dtype} in the general branch, {other.dtype} in the special one"
        if one.shape is not None and other.shape is not None and len(one.shape) != len(other.shape):
            return (
                f"output {index} has rank {len(one.shape)} in the general branch, {len(other.shape)} in the special one"
            )
    return None


def inference_error(special: ir.Model) -> str | None:
    """Why ONNX's shape inference refuses the special graph (a Squeeze of a dim the special branch pinned to 0, as
    ``median`` of ``x[x == x.max()]`` selecting nothing, where eager raises too), or None. ONNX Runtime infers an
    If's branches when it loads the model: a join of such a branch would give a model that does not load."""
    graph = special.graph
    # weights as typed inputs: inference reads their types and shapes only, so their data is not copied
    weights = list(graph.initializers.values())
    for weight in weights:
        graph.initializers.pop(weight.name)
        graph.inputs.append(weight)
    try:
        proto = ir.serde.serialize_model(special)
    finally:
        for weight in weights:
            graph.inputs.remove(weight)
            graph.initializers.add(weight)
    try:
        # types unchecked: legalize makes them consistent later (a bool or int16 Greater before it is an int one)
        onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=True)
    except onnx.shape_inference.InferenceError as error:
        return " ".join(str(error).split())
    return None


def same_empty_results(general: CapturedGraph, special: CapturedGraph, condition: Any, general_value: bool) -> bool:
    """True when, where the special branch is taken, both captures return the same empty tensors (dtypes and
    shapes): torchvision's ``if boxes.numel() == 0: return torch.empty((0,))`` before an NMS that returns just that.
    The If would choose between equal results: the general graph alone is kept. Decided only for a special branch
    that fixes its symbol (``u0 == 0``); symbols are matched by name (the two traces name them alike)."""
    taken = sympy.Not(condition) if general_value else condition
    if not isinstance(taken, sympy.Eq) or len(taken.free_symbols) != 1:
        return False
    (symbol,) = taken.free_symbols
    solutions = sympy.solve(taken, symbol)
    if len(solutions) != 1:
        return False
    value = solutions[0]

    def shape(output: Any) -> list[Any] | None:
        val = getattr(output, "meta", {}).get("val")
        if not isinstance(val, torch.Tensor):
            return None
        dims = []
        for size in val.shape:
            expr = size.node.expr if isinstance(size, torch.SymInt) else sympy.Integer(size)
            dims.append(expr.xreplace({free: value for free in expr.free_symbols if str(free) == str(symbol)}))
        return dims

    if len(general.user_outputs) != len(special.user_outputs):
        return False
    for one, other in zip(general.user_outputs, special.user_outputs):
        one_shape, other_shape = shape(one), shape(other)
        if one_shape is None or other_shape is None or one.meta["val"].dtype != other.meta["val"].dtype:
            return False
        if one_shape != other_shape or sympy.Integer(0) not in one_shape:
            return False
    return True


def size_sources(
    captured: CapturedGraph, env: Mapping[torch.fx.Node, Any], symbols: Sequence[sympy.Symbol]
) -> dict[sympy.Symbol, tuple[ir.Value, int | None]]:
    """For each symbol, a value of the emitted general graph whose size it is (value, dim), or which holds it
    (value, None: a ``SymInt`` computed in the graph, ``item()``)."""
    wanted = set(symbols)
    found: dict[sympy.Symbol, tuple[ir.Value, int | None]] = {}
    for node in captured.graph.nodes:
        if not wanted - set(found):
            break
        value = env.get(node)
        if not isinstance(value, ir.Value):
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for dim, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and size.node.expr in wanted and size.node.expr not in found:
                    found[size.node.expr] = (value, dim)
        elif isinstance(val, torch.SymBool) and node.target is aten._local_scalar_dense.default:
            expr = getattr(val.node, "_expr", val.node.expr)
            symbol = expr.args[0] if isinstance(expr, sympy.Eq) else None
            if symbol in wanted and symbol not in found:
                found[symbol] = (value, None)  # the bool as 0/1 is the symbol
        elif isinstance(val, torch.SymInt):
            # as traced: a value branched on is replaced by the side taken (u0 -> 1) once torch is told it
            expr = getattr(val.node, "_expr", val.node.expr)
            if expr in wanted and expr not in found:
                found[expr] = (value, None)
    return found


def value_symbols(captured: CapturedGraph) -> list[sympy.Symbol]:
    """The symbols of the bools the graph reads from tensors (``bool(x.sum() > 0)``: torch's Eq(u1, 1)), as the
    final graph numbers them (a retrace may number them otherwise than the trace that decided the branch)."""
    found = []
    for node in captured.graph.nodes:
        val = node.meta.get("val")
        if node.target is aten._local_scalar_dense.default and isinstance(val, torch.SymBool):
            expr = getattr(val.node, "_expr", val.node.expr)
            if isinstance(expr, sympy.Eq) and expr.args[1] == 1 and isinstance(expr.args[0], sympy.Symbol):
                found.append(expr.args[0])
    return found


def drop_checks_of_a_side(model: ir.Model, symbols: Sequence[sympy.Symbol]) -> None:
    """The side of a branch on a value that the capture took is asserted in its graph (torch told so, ``Eq(u0, 1)``,
    ``u0 >= 1``): no check in the ONNX model, whose If takes the other side for other values."""
    names = [re.compile(rf"\b{re.escape(str(symbol))}\b") for symbol in symbols]
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        expression = node.metadata_props.get(RUNTIME_CHECK)
        if expression is not None and any(name.search(expression) for name in names):
            del node.metadata_props[RUNTIME_CHECK]  # no longer a check: nothing reads it, the optimizer drops it


def _ancestors(graph: ir.Graph, values: Sequence[ir.Value]) -> set[ir.Node]:
    """The nodes of `graph` (its own, not its subgraphs') that compute `values`, subgraphs' outer-scope reads
    included."""
    kept: set[ir.Node] = set()
    stack = list(values)
    while stack:
        value = stack.pop()
        node = value.producer()
        if node is None or node in kept or node.graph is not graph:
            continue
        kept.add(node)
        stack.extend(v for v in node.inputs if v is not None)
        for attribute in node.attributes.values():
            subgraphs = [attribute.value] if attribute.type == ir.AttributeType.GRAPH else []
            if attribute.type == ir.AttributeType.GRAPHS:
                subgraphs = list(attribute.value)
            for subgraph in subgraphs:
                for inner in ir.traversal.RecursiveGraphIterator(subgraph):
                    stack.extend(v for v in inner.inputs if v is not None)
    return kept


def _graphs(graph: ir.Graph) -> list[ir.Graph]:
    found = [graph]
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for attribute in node.attributes.values():
            if attribute.type == ir.AttributeType.GRAPH:
                found.append(attribute.value)
            elif attribute.type == ir.AttributeType.GRAPHS:
                found.extend(attribute.value)
    return found


def _branch_output(branch: ir.Graph, value: ir.Value, name: str) -> None:
    """`value` as an output of `branch`, through an Identity (it may be the outer graph's input or initializer)."""
    node = ir.node("Identity", [value], name=f"{name}_identity")
    # (a special capture's own output may bear that name already: two values of one name, and the fold of a constant
    # Identity then registered an initializer over its input's; fuzz seed 50000686)
    node.outputs[0].name = name if value.name != name else f"{name}_of_branch"
    node.outputs[0].dtype = value.dtype
    node.outputs[0].shape = ir.Shape(value.shape) if value.shape is not None else None
    branch.append(node)
    branch.outputs.append(node.outputs[0])


# Initializers of the two emissions compared by value up to this many bytes; larger ones are shared only when they
# are views of one tensor (the model's weights, named alike): a name alone proves nothing (constants torch.export
# lifts and numbers per capture).
_COMPARED_BYTES = 1 << 16


def _same_data(one: ir.Value, other: ir.Value) -> bool:
    first, second = one.const_value, other.const_value
    if first is None or second is None or one.dtype != other.dtype or one.shape != other.shape:
        return False
    first_raw, second_raw = getattr(first, "raw", None), getattr(second, "raw", None)
    if (
        isinstance(first_raw, torch.Tensor)
        and isinstance(second_raw, torch.Tensor)
        and (first_raw.data_ptr(), first_raw.stride()) == (second_raw.data_ptr(), second_raw.stride())
    ):
        return True
    if first.nbytes > _COMPARED_BYTES:
        return False
    return first.tobytes() == second.tobytes()


def _merged_shape(one: ir.Shape | None, other: ir.Shape | None) -> ir.Shape | None:
    if one is None or other is None or len(one) != len(other):
        return None
    return ir.Shape([a if a == b else None for a, b in zip(one, other)])


def _special_side(graph: ir.Graph, special: ir.Model) -> tuple[list[ir.Node], list[ir.Value]]:
    """`special`'s nodes and outputs, taken out of it: its inputs and initializers are the main graph's, its values
    renamed apart."""
    special_graph = special.graph
    for own, outer in zip(special_graph.inputs, graph.inputs):
        own.replace_all_uses_with(outer)
    for name, initializer in list(special_graph.initializers.items()):
        existing = graph.initializers.get(name)
        if existing is not None and _same_data(existing, initializer):
            initializer.replace_all_uses_with(existing)
            continue
        special_graph.initializers.pop(name)
        initializer.name = f"{_SPECIAL_PREFIX}{name}"
        graph.register_initializer(initializer)
    for inner in _graphs(special_graph):
        if inner is not special_graph:
            for value in inner.inputs:
                value.name = f"{_SPECIAL_PREFIX}{value.name}"
        for node in inner:
            node.name = f"{_SPECIAL_PREFIX}{node.name}" if node.name else None
            for value in node.outputs:
                if value.name:
                    value.name = f"{_SPECIAL_PREFIX}{value.name}"
    special_outputs = list(special_graph.outputs)
    special_nodes = list(special_graph)
    special_graph.outputs.clear()
    special_graph.remove(special_nodes)
    return special_nodes, special_outputs


def _failure(flag: ir.Value, results: Sequence[ir.Value], name: str) -> tuple[list[ir.Node], list[ir.Value]]:
    """A side that fails at run time in a node named `name`, with outputs of `results`' dtypes and ranks: a Gather
    from one element at index ``flag`` (1 on this side; read from the outer graph, so no optimizer folds it)."""
    index = ir.node("Cast", [flag], {"to": ir.DataType.INT64})
    one_element = ir.node("Constant", [], {"value": ir.tensor(np.array([0], dtype=np.int64))})
    failing = ir.node("Gather", [one_element.outputs[0], index.outputs[0]], {"axis": 0}, name=name)
    nodes = [index, one_element, failing]
    _typed(index, ir.DataType.INT64, [])
    _typed(one_element, ir.DataType.INT64, [1])
    _typed(failing, ir.DataType.INT64, [])
    outputs = []
    for result in results:
        rank = len(result.shape) if result.shape is not None else 0
        ones = ir.node("Constant", [], {"value": ir.tensor(np.ones(rank, dtype=np.int64))})
        cast = ir.node("Cast", [failing.outputs[0]], {"to": result.dtype})
        shaped = ir.node("Reshape", [cast.outputs[0], ones.outputs[0]])
        _typed(ones, ir.DataType.INT64, [rank])
        _typed(cast, result.dtype, [])
        _typed(shaped, result.dtype, [1] * rank)
        nodes += [ones, cast, shaped]
        outputs.append(shaped.outputs[0])
    return nodes, outputs


def _typed(node: ir.Node, dtype: ir.DataType | None, shape: list[int]) -> None:
    node.outputs[0].dtype = dtype
    node.outputs[0].shape = ir.Shape(shape)


def join(
    general: ir.Model,
    special: ir.Model,
    outputs: int,
    condition: Any,
    sources: Mapping[sympy.Symbol, tuple[ir.Value, int | None]],
    fails: str | None = None,
) -> None:
    """Make `general` (whose first `outputs` graph outputs are the model's, the rest run-time checks) compute
    `condition` (the special branch's: ``Eq(u0, 0)`` for ``numel() == 0`` taken as False) and run `special`'s graph
    where it holds, its own nodes elsewhere (module docstring). `special` is
    consumed. Raises ValueError, leaving `general` unchanged, when the condition has no ONNX translation.
    With `fails` (a node name), the special side is no graph of `special`'s but a failure named so at run time."""
    graph = general.graph
    condition_nodes, flag = _condition_flag(condition, sources, f"{_SPECIAL_PREFIX}condition_")

    # the main graph: what the condition and the run-time checks read; the rest is the general branch
    main = _ancestors(graph, [value for value, _ in sources.values()] + list(graph.outputs[outputs:]))
    general_branch = ir.Graph([], [], nodes=[], name="general_branch")
    moved = [node for node in graph if node not in main]
    graph.remove(moved)
    general_branch.extend(moved)

    results = list(graph.outputs[:outputs])
    if fails is not None:
        special_nodes, special_outputs = _failure(flag, results, fails)
    else:
        special_nodes, special_outputs = _special_side(graph, special)
    special_branch = ir.Graph([], [], nodes=special_nodes, name="special_branch")

    names = [value.name or f"output_{index}" for index, value in enumerate(results)]
    for index, (value, name) in enumerate(zip(results, names)):
        if value.producer() is not None:  # the If's output takes its name
            value.name = f"{name}_general"
        else:  # the model returns an input or a weight as it is: that keeps its name
            names[index] = f"{name}_output"
        _branch_output(general_branch, value, f"fx2onnx_general_output_{index}")
        _branch_output(special_branch, special_outputs[index], f"{_SPECIAL_PREFIX}output_{index}")
    branch = ir.node(
        "If",
        [flag],
        {"then_branch": special_branch, "else_branch": general_branch},
        num_outputs=outputs,
        name="fx2onnx_special_branch_if",
    )
    for value, name, general_value, special_value in zip(branch.outputs, names, results, special_outputs):
        value.name = name
        value.dtype = general_value.dtype
        value.shape = _merged_shape(general_value.shape, special_value.shape)
    graph.extend([*condition_nodes, branch])
    for index in range(outputs):
        graph.outputs[index] = branch.outputs[index]
    for key, function in special.functions.items():
        general.functions.setdefault(key, function)
    for domain, version in special.graph.opset_imports.items():
        graph.opset_imports.setdefault(domain, version)


__all__ = ["disagreement", "drop_checks_of_a_side", "join", "same_empty_results", "size_sources", "value_symbols"]


# --- several branches on values: one If per question, around the nodes its answer changes -----------------------


@dataclasses.dataclass
class QuestionRegion:
    """What one branch on a value changes in the general graph (``_branch_regions.py`` found it by diffing
    the general capture against the capture with this question answered the other way), at the ONNX level.

    The If runs `special_nodes` (of `special`, the other side's emission) where `condition` holds, `general_nodes`
    elsewhere; each of its outputs replaces `pairs[k][0]` (a value of the general graph) for the readers listed in
    `rewired[k]` (nodes of the general graph, and the graph output positions in `rewired_outputs[k]`), and is
    `pairs[k][1]` (a value of `special`) on the other side."""

    condition: Any
    sources: Mapping[sympy.Symbol, tuple[ir.Value, int | None]]
    special: ir.Model
    general_nodes: list[ir.Node]
    special_nodes: list[ir.Node]
    # the special side's reads of its own graph's values outside `special_nodes`: the general graph's equal
    outer: Mapping[ir.Value, ir.Value]
    pairs: list[tuple[ir.Value, ir.Value]]
    rewired: list[list[tuple[ir.Node, int]]]
    rewired_outputs: list[list[int]]


def _condition_flag(
    condition: Any, sources: Mapping[sympy.Symbol, tuple[ir.Value, int | None]], prefix: str
) -> tuple[list[ir.Node], ir.Value]:
    """The nodes computing `condition` over the sizes or item() values `sources` names, and its 0-d bool."""
    symbols: dict[sympy.Symbol, ir.Value] = {}
    size_nodes: list[ir.Node] = []
    for position, (symbol, (value, dim)) in enumerate(sources.items()):
        if dim is None:
            cast = ir.node("Cast", [value], {"to": ir.DataType.INT64}, name=f"{prefix}size_{position}_cast")
            shape = ir.node("Constant", [], {"value": ir.tensor(np.array([1], np.int64))})
            size = ir.node("Reshape", [cast.outputs[0], shape.outputs[0]], name=f"{prefix}size_{position}")
            size_nodes += [cast, shape, size]
        else:
            size = ir.node("Shape", [value], {"start": dim, "end": dim + 1}, name=f"{prefix}size_{position}")
            size_nodes.append(size)
        for index, node in enumerate(size_nodes[-3 if dim is None else -1 :]):
            node.outputs[0].name = f"{prefix}size_{position}_{index}"
            node.outputs[0].dtype = ir.DataType.INT64
        symbols[symbol] = size.outputs[0]
    condition_nodes, flag = runtime_checks.condition_to_onnx(condition, symbols, f"{prefix}value_")
    return size_nodes + condition_nodes, flag


def _outer_reads(nodes: Sequence[ir.Node]) -> list[tuple[ir.Node, int, ir.Value]]:
    """(node, input index, value) for each input of `nodes` (their subgraphs' included) not computed by `nodes`."""
    produced = {value for node in nodes for value in node.outputs}
    reads = []
    for node in nodes:
        for inner in [node, *_subgraph_nodes(node)]:
            for index, value in enumerate(inner.inputs):
                if value is not None and value not in produced:
                    reads.append((inner, index, value))
            produced.update(inner.outputs)
    return reads


def _subgraph_nodes(node: ir.Node) -> list[ir.Node]:
    found: list[ir.Node] = []
    for attribute in node.attributes.values():
        subgraphs = [attribute.value] if attribute.type == ir.AttributeType.GRAPH else []
        if attribute.type == ir.AttributeType.GRAPHS:
            subgraphs = list(attribute.value)
        for subgraph in subgraphs:
            found.extend(ir.traversal.RecursiveGraphIterator(subgraph))
    return found


def _check_scopes(graph: ir.Graph) -> None:
    """Raises ValueError where a node of `graph` (or of its nodes' subgraphs) reads a value computed neither in the
    main graph nor in the subgraphs of the node that reads it (a value moved into another If's branch)."""
    available = set(graph.inputs) | set(graph.initializers.values())
    available.update(value for node in graph for value in node.outputs)
    for node in graph:
        local: set[ir.Value] = set()
        for attribute in node.attributes.values():
            subgraphs = [attribute.value] if attribute.type == ir.AttributeType.GRAPH else []
            if attribute.type == ir.AttributeType.GRAPHS:
                subgraphs = list(attribute.value)
            for inner_graph in [inner for subgraph in subgraphs for inner in _graphs(subgraph)]:
                local.update(inner_graph.inputs)
                local.update(inner_graph.initializers.values())
                local.update(value for inner in inner_graph for value in inner.outputs)
        for inner in [node, *_subgraph_nodes(node)]:
            for value in inner.inputs:
                if value is not None and value not in available and value not in local:
                    raise ValueError(f"{inner.op_type} {inner.name} reads {value.name}, which only a branch computes")


def join_regions(general: ir.Model, regions: Sequence[QuestionRegion]) -> None:
    """One If per branch on a value in `general`, around the nodes its answer changes (:class:`QuestionRegion`): the
    rest of the graph is computed once for every combination of answers. Raises ValueError where the regions cannot
    be separated (a node outside a region reads a value computed inside one); the caller then fails the export."""
    graph = general.graph
    # a value an earlier question's If replaced: read after that question, the If's output is read in its place
    replaced: dict[ir.Value, ir.Value] = {}
    for position, region in enumerate(regions):
        prefix = f"fx2onnx_question_{position}_"
        flag_nodes, flag = _condition_flag(region.condition, region.sources, f"{prefix}condition_")
        # the general side: its nodes leave the main graph (an input-less Constant stays: others may share it)
        general_branch = ir.Graph([], [], nodes=[], name=f"{prefix}general")
        general_nodes = [node for node in region.general_nodes if node.inputs or node.op_type != "Constant"]
        graph.remove(general_nodes)
        general_branch.extend(general_nodes)
        # the special side: its nodes, renamed apart, reading the general graph's values for its own
        special_graph = region.special.graph
        special_branch = ir.Graph([], [], nodes=[], name=f"{prefix}special")
        special_nodes = list(region.special_nodes)
        for node in special_nodes:
            if node.graph is not None:
                node.graph.remove(node)
        for node, index, value in _outer_reads(special_nodes):
            if value in region.outer:
                node.replace_input_with(index, replaced.get(region.outer[value], region.outer[value]))
            elif value in special_graph.inputs:
                node.replace_input_with(index, graph.inputs[special_graph.inputs.index(value)])
            elif value.is_initializer() and graph.initializers.get(value.name) is value:
                continue  # registered in the main graph by an earlier question's region
            elif value.is_initializer() and value.name in special_graph.initializers:
                existing = graph.initializers.get(value.name)
                if existing is not None and _same_data(existing, value):
                    node.replace_input_with(index, existing)
                else:
                    special_graph.initializers.pop(value.name)
                    value.name = f"{prefix}{value.name}"
                    graph.register_initializer(value)
            elif (
                value.producer() is not None and value.producer().op_type == "Constant" and not value.producer().inputs
            ):
                # a constant the special emission shared between nodes (of other regions too): a copy of its own
                constant = value.producer()
                copy = ir.Node(
                    constant.domain,
                    "Constant",
                    [],
                    attributes=[ir.Attr(a.name, a.type, a.value) for a in constant.attributes.values()],
                    name=f"{constant.name}_copy_{len(special_nodes)}",
                )
                copy.outputs[0].name = f"{value.name}_copy_{len(special_nodes)}"
                copy.outputs[0].dtype = value.dtype
                copy.outputs[0].shape = ir.Shape(value.shape) if value.shape is not None else None
                node.replace_input_with(index, copy.outputs[0])
                special_nodes.insert(0, copy)
            elif value.producer() not in special_nodes:
                raise ValueError(f"the other side of question {position} reads {value.name}, computed outside it")
        for inner in [node for node in special_nodes for node in [node, *_subgraph_nodes(node)]]:
            inner.name = f"{prefix}{inner.name}" if inner.name else None
            for value in inner.outputs:
                value.name = f"{prefix}{value.name}" if value.name else None
        special_branch.extend(special_nodes)
        for key, function in region.special.functions.items():
            general.functions.setdefault(key, function)
        for domain, version in special_graph.opset_imports.items():
            graph.opset_imports.setdefault(domain, version)

        for index, (general_value, special_value) in enumerate(region.pairs):
            if general_value.producer() not in general_nodes:
                general_value = replaced.get(general_value, general_value)
            if special_value.producer() not in special_nodes:
                special_value = replaced.get(special_value, special_value)
            _branch_output(general_branch, general_value, f"{prefix}general_output_{index}")
            _branch_output(special_branch, special_value, f"{prefix}special_output_{index}")
        branch = ir.node(
            "If",
            [flag],
            {"then_branch": special_branch, "else_branch": general_branch},
            num_outputs=len(region.pairs),
            name=f"{prefix}if",
        )
        for index, (value, (general_value, _)) in enumerate(zip(branch.outputs, region.pairs)):
            value.name = f"{prefix}output_{index}"
            value.dtype = general_value.dtype
            value.shape = ir.Shape(general_value.shape) if general_value.shape is not None else None
            for reader, input_index in region.rewired[index]:
                reader.replace_input_with(input_index, value)
            replaced[general_value] = value
            for output_index in region.rewired_outputs[index]:
                value.name, general_value.name = general_value.name, f"{prefix}general_{general_value.name}"
                graph.outputs[output_index] = value
        graph.extend([*flag_nodes, branch])
    _check_scopes(graph)
    graph.sort()


__all__ += ["QuestionRegion", "join_regions"]
