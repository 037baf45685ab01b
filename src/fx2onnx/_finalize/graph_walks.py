"""Walks over a model's nodes for finalize's own passes, and onnx_ir passes run only where they can change something.

``ir.traversal.RecursiveGraphIterator`` yields each node through two nested generators and reads every node's
attributes through ``UserDict``'s abstract views (~4 us a node); finalize and the optimizer walked a GPT-2's 1000
nodes a dozen times that way. :func:`all_nodes` lists the same nodes in the same order (each node, then the nodes of
its subgraphs) in one plain loop.

Some onnx_ir passes walk the whole graph to find that there is nothing to do: the inliner and the removal of unused
functions when the model has no function, the removal of unused opsets when only the default domain is imported, the
lifting of subgraph initializers when there is no subgraph, the name fix when every value and node has a name of its
own (:func:`names_need_fixing`), the output fix when no output is an input or listed twice
(:func:`outputs_need_fixing`). :class:`UnlessNothingToDo` runs them only otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

_GRAPH = ir.AttributeType.GRAPH
_GRAPHS = ir.AttributeType.GRAPHS


def _attributes_of(node: ir.Node) -> Iterable[ir.Attr]:
    attributes = node.attributes
    # onnx_ir's Attributes is a UserDict: its own dict's values() is a plain view, not collections.abc's generator
    data = getattr(attributes, "data", None)
    return data.values() if isinstance(data, dict) else attributes.values()


def all_nodes(graph: ir.Graph | ir.Function) -> list[ir.Node]:
    """Every node of `graph` and of its subgraphs (If/Loop/Scan bodies, nested), in the order of
    ``ir.traversal.RecursiveGraphIterator``: each node, then the nodes of its subgraphs."""
    nodes: list[ir.Node] = []
    for node in graph:
        nodes.append(node)
        for attribute in _attributes_of(node):
            if not isinstance(attribute, ir.Attr):
                continue  # a reference to a function's attribute holds no graph
            if attribute.type == _GRAPH:
                nodes.extend(all_nodes(attribute.value))
            elif attribute.type == _GRAPHS:
                for subgraph in attribute.value:
                    nodes.extend(all_nodes(subgraph))
    return nodes


def has_subgraphs(model: ir.Model) -> bool:
    """Whether a node of the main graph or of a function holds a graph (an If, Loop or Scan body)."""
    for graph in (model.graph, *model.functions.values()):
        for node in graph:
            for attribute in _attributes_of(node):
                if isinstance(attribute, ir.Attr) and attribute.type in (_GRAPH, _GRAPHS):
                    return True
    return False


def has_functions(model: ir.Model) -> bool:
    return bool(model.functions)


def imports_other_domains(model: ir.Model) -> bool:
    """Whether anything but the default domain is imported, or a function may import one (RemoveUnusedOpsetsPass
    always keeps the default domain: with nothing else it has nothing to remove)."""
    return bool(model.functions) or any(domain != "" for domain in model.graph.opset_imports)


class UnlessNothingToDo(ir.passes.InPlacePass):
    """`wrapped`, run only when `may_change(model)`: otherwise the model is left as the pass would leave it."""

    def __init__(self, wrapped: ir.passes.PassBase, may_change: Callable[[ir.Model], bool]) -> None:
        super().__init__()
        self.wrapped, self.may_change = wrapped, may_change

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not self.may_change(model):
            return ir.passes.PassResult(model, modified=False)
        return self.wrapped(model)


def remove_unused_functions() -> ir.passes.PassBase:
    return UnlessNothingToDo(common_passes.RemoveUnusedFunctionsPass(), has_functions)


def inline_functions() -> ir.passes.PassBase:
    return UnlessNothingToDo(common_passes.InlinePass(), has_functions)


def remove_unused_opsets() -> ir.passes.PassBase:
    return UnlessNothingToDo(common_passes.RemoveUnusedOpsetsPass(), imports_other_domains)


def lift_subgraph_initializers() -> ir.passes.PassBase:
    return UnlessNothingToDo(common_passes.LiftSubgraphInitializersToMainGraphPass(), has_subgraphs)


def names_need_fixing(model: ir.Model) -> bool:
    """Whether NameFixPass would rename anything: a value or a node without a name, or two values (or two nodes) of
    one name. With functions or subgraphs (names scoped by graph), True: the pass itself decides.

    Every value of a graph without subgraphs is one of its inputs, initializers or node outputs (the graph's outputs
    and the nodes' inputs are among them), so only those are read: about a third of NameFixPass's own walk, which the
    fold and the rewrite run after each change that needs none."""
    if model.functions:
        return True
    graph = model.graph
    value_names = [value.name for value in graph.inputs]
    value_names += [value.name for value in graph.initializers.values() if not value.is_graph_input()]
    node_names = []
    for node in graph:
        if _may_hold_a_graph(node):
            return True
        node_names.append(node.name)
        value_names += [value.name for value in node.outputs]
    names = set(value_names)
    if len(names) != len(value_names) or None in names or "" in names:
        return True
    names = set(node_names)
    return len(names) != len(node_names) or None in names or "" in names


def _may_hold_a_graph(node: ir.Node) -> bool:
    """Whether `node` holds a graph: an ONNX If, Loop, Scan or SequenceMap, or a node of another domain that does
    (read without walking the attributes of every ONNX node)."""
    if node.domain in ("", "ai.onnx"):
        return node.op_type in _OPS_WITH_SUBGRAPHS
    return any(isinstance(a, ir.Attr) and a.type in (_GRAPH, _GRAPHS) for a in _attributes_of(node))


# The ONNX operators of a graph attribute.
_OPS_WITH_SUBGRAPHS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def outputs_need_fixing(model: ir.Model) -> bool:
    """Whether OutputFixPass would add an Identity: a graph input, or a value listed twice, among the outputs. With
    functions or subgraphs, True: the pass itself decides."""
    if model.functions or any(_may_hold_a_graph(node) for node in model.graph):
        return True
    outputs = model.graph.outputs
    return len(set(outputs)) != len(outputs) or any(output.is_graph_input() for output in outputs)


def fix_outputs() -> ir.passes.PassBase:
    return UnlessNothingToDo(common_passes.OutputFixPass(), outputs_need_fixing)


def fix_names() -> ir.passes.PassBase:
    return UnlessNothingToDo(common_passes.NameFixPass(), names_need_fixing)
