"""Graph optimization: onnxscript's optimizer (constant folding, then its default rewrite rules).

The passes and rules are onnxscript's ``optimize_ir``, in the same order, with one difference in
cost and none in result: the ``SlicesSplit`` rule (two Slices of one value -> one Split) matches a
two-node pattern by enumerating every node of the graph for every node it visits, which makes it
quadratic in the graph's size (two thirds of the optimizer's time on a GPT-2-small). It can only
match two Slice nodes, and no rule or fold creates a Slice, so a rewrite pass over a graph with
fewer than two Slices leaves it out.

The rewrite pass tries every rule on every node; most rules' patterns are rooted at one op type
(``CastCast`` at a Cast), so here a node is only offered to the rules that can be rooted at its op
type, in their order, before onnxscript's matcher, which costs ~40 us a try (three quarters of the
optimizer's time on GPT-2 went to failed tries), and not to a rule whose pattern needs an input the node's is not
(``ReshapeReshape`` needs a Reshape's output) or whose check fails at once (``_known_failing_checks``). Constant
folding uses the types and shapes fx2onnx recorded while
emitting instead of running ONNX shape inference again on every node. The inliner, which walks the whole graph,
runs only when the model still has a function to inline. optimize_ir's fold/rewrite loop runs each pass again only
when it may still change something, and removes unused nodes only where the rewrite pass has not just done it
(``_FoldAndRewrite``). Constants are lifted to initializers without ``ir.tensor``'s slow checks (``_LiftConstants``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxscript.optimizer
import onnxscript.rewriter
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules.common import _redundant_scatter_nd, slice_split_rule

from fx2onnx import _weights
from fx2onnx._constant_arrays import number_attribute_tensor


def optimize(model: ir.Model, num_iterations: int = 2) -> None:
    """What ``onnxscript.optimizer.optimize_ir(model)`` does, without the quadratic rule where it cannot match."""
    with _without_unactionable_warnings():
        _optimize(model, num_iterations)


# Warnings the passes log that say nothing wrong about the model: a constant the ONNX reference evaluator
# cannot fold (its GatherElements handles at most 64 distinct values, say) stays a node and runs in the
# runtime; a graph output that is also an initializer is not deduplicated.
_UNACTIONABLE_WARNINGS = {
    "onnxscript.optimizer._constant_folding": ("Evaluation failed",),
    "onnx_ir.passes.common.initializer_deduplication": ("as it is a graph input or output",),
}


class _DropMessages(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(fragment in str(record.msg) for fragment in self.fragments)


@contextlib.contextmanager
def _without_unactionable_warnings() -> Iterator[None]:
    """Keep those warnings off the user's terminal, unless the user turned their logger up to INFO or DEBUG."""
    installed = []
    for name, fragments in _UNACTIONABLE_WARNINGS.items():
        logger = logging.getLogger(name)
        if not logger.isEnabledFor(logging.INFO):
            installed.append((logger, _DropMessages(fragments)))
            logger.addFilter(installed[-1][1])
    try:
        yield
    finally:
        for logger, message_filter in installed:
            logger.removeFilter(message_filter)


def _optimize(model: ir.Model, num_iterations: int) -> None:
    rules: Sequence[pattern.RewriteRule] | None = getattr(onnxscript.rewriter, "_DEFAULT_REWRITE_RULES", None)
    if not rules or slice_split_rule not in rules:  # another onnxscript: use its optimizer as it is
        onnxscript.optimizer.optimize_ir(model)
        return
    rewrite = _Rewrite(_with_exact_scatter_nd(_with_exact_no_ops(rules)))
    passes = ir.passes.Sequential(
        _InlineIfAnyFunction(),
        _FoldAndRewrite(_FoldConstants(), rewrite, num_iterations),
        *(() if rewrite.removes_unused_nodes else (common_passes.RemoveUnusedNodesPass(),)),
        _lift_constants(),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        common_passes.OutputFixPass(),
        common_passes.NameFixPass(),
    )
    passes(model)


class _LiftConstants(common_passes.LiftConstantsToInitializersPass):
    """onnx_ir's pass lifting every Constant to an initializer, with the tensor of a number or list attribute
    made as ``ir.tensor`` makes it (an int64 or float32 array) but without its checks of what the value is
    (runtime protocol checks, ~0.3 ms a call on Python 3.11: most of the pass's time on GPT-2)."""

    def _constant_node_attribute_to_tensor(
        self, node: ir.Node, attr_name: str, attr_value: ir.Attr, initializer_name: str
    ) -> ir.TensorProtocol | None:
        tensor = number_attribute_tensor(attr_value) if self.lift_all_constants else None
        if tensor is None:
            return super()._constant_node_attribute_to_tensor(node, attr_name, attr_value, initializer_name)
        tensor.name = initializer_name
        return None if tensor.size < self.size_limit else tensor


def _lift_constants() -> ir.passes.PassBase:
    """optimize_ir's lifting of every Constant; onnx_ir's own pass where its internals differ."""
    plain = common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)
    if not callable(getattr(plain, "_constant_node_attribute_to_tensor", None)):
        return plain
    return _LiftConstants(lift_all_constants=True, size_limit=0)


class _FoldAndRewrite(ir.passes.InPlacePass):
    """optimize_ir's loop (fold constants, rewrite, remove what is unused; at most `iterations` times), with each
    pass run only when it may still change something.

    Folding is a single pass in topological order, so it is at its fixed point once it has run: it is run again
    only after a rewrite changed the graph. A rewrite is run again only after it changed the graph itself (it
    sweeps the nodes once, so nodes it created were not tried as roots) or after a fold did. optimize_ir's loop
    also removes unused nodes after each rewrite, which the rewrite pass has just done when its rules ask for
    it; unused functions and opsets are removed once, at the end.

    A rewrite run again after a fold that changed nothing can only match where the previous rewrite changed the
    graph (``_Rewrite.may_match_after_last_changes``): the rules are first tried there, without applying them,
    and the whole pass runs only if one matches (on GPT-2 the second rewrite tried 411 nodes to match none).
    """

    def __init__(self, fold: ir.passes.PassBase, rewrite: _Rewrite, iterations: int) -> None:
        super().__init__()
        self.fold, self.rewrite, self.iterations = fold, rewrite, iterations

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        fold_pending = rewrite_pending = True
        for _ in range(self.iterations):
            if not (fold_pending or rewrite_pending):
                break
            folded = fold_pending and self.fold(model).modified
            if not folded and rewrite_pending and not self.rewrite.may_match_after_last_changes(model):
                break  # the rewrite would match nothing: neither pass has anything left to change
            rewritten = (rewrite_pending or folded) and self.rewrite(model).modified
            if not self.rewrite.removes_unused_nodes:
                common_passes.RemoveUnusedNodesPass()(model)
            modified = modified or folded or rewritten
            fold_pending = rewrite_pending = rewritten
        if model.functions:
            modified = common_passes.RemoveUnusedFunctionsPass()(model).modified or modified
        modified = common_passes.RemoveUnusedOpsetsPass()(model).modified or modified
        return ir.passes.PassResult(model, modified)


class _InlineIfAnyFunction(ir.passes.InPlacePass):
    """onnx_ir's InlinePass, which walks the whole graph even when the model has no function left to inline
    (finalize has inlined them before the optimizer runs)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not model.functions:
            return ir.passes.PassResult(model, modified=False)
        return common_passes.InlinePass()(model)


def _with_exact_no_ops(rules: Sequence[pattern.RewriteRule]) -> list[pattern.RewriteRule]:
    """`rules` with onnxscript's x + 0 / x - 0 / x * 1 / x / 1 rules made exact.

    onnxscript's no-op rules match their constant within rel 1e-5 / abs 1e-8, so they also drop x + 3.4e-10
    (a Cephes coefficient in a special function) or x * 1.000001, which changes results; here they fire
    only for a scalar exactly 0 or 1.
    """
    from onnxscript.rewriter.rules.common import _no_op

    dropout = (_no_op.dropout_zero_rule, _no_op.dropout_inference_rule)
    inexact = {id(r) for r in _no_op.rules.rules if r not in dropout}
    kept = [r for r in rules if id(r) not in inexact]
    if len(kept) == len(rules):
        return list(rules)  # another onnxscript: leave its rules as they are
    return kept + _EXACT_NO_OP_RULES


def _with_exact_scatter_nd(rules: Sequence[pattern.RewriteRule]) -> list[pattern.RewriteRule]:
    """`rules` with onnxscript's ScatterAllStatic (a ScatterND whose constant indices cover every row of its
    data -> its updates) made to fire only without a reduction: it ignores the attribute, so it also replaced an
    accumulating index_put (``x.index_add(0, tensor([0]), y)`` on one row: ``y``, eager ``x + y``)."""
    static = _redundant_scatter_nd.no_op_static_scatter_nd_rule
    kept = [r for r in rules if r is not static]
    if len(kept) == len(rules):
        return list(rules)  # another onnxscript: leave its rules as they are
    return [*kept, _ScatterAllStaticWithoutReduction.rule()]


class _ScatterAllStaticWithoutReduction(_redundant_scatter_nd.ScatterAllStatic):
    def check(self, context: Any, data: ir.Value, indices: ir.Value, updates: ir.Value, **_: Any) -> Any:
        if context.root.attributes.get_string("reduction", "none") != "none":
            return onnxscript.rewriter.MatchResult().fail("The ScatterND reduces into its data.")
        return super().check(context, data=data, indices=indices, updates=updates)


def _identity(op: Any, x: ir.Value, **_: Any) -> ir.Value:
    return op.Identity(x)


def _scalar_is(value: float) -> Any:
    """A scalar constant equal to `value`, and for a zero, of its sign: x + -0.0 and x - +0.0 are no-ops, while
    x + +0.0 and x - -0.0 turn a -0.0 into +0.0 (as eager does: a sum starts from +0.0)."""

    def condition(context: Any, x: ir.Value, c: ir.Value, **_: Any) -> bool:
        constant = c.const_value
        if constant is None or constant.shape != ():
            return False
        number = float(constant.numpy())
        return number == value and (value != 0 or math.copysign(1.0, number) == math.copysign(1.0, value))

    return condition


_EXACT_NO_OP_RULES = [
    pattern.RewriteRule(lambda op, x, c: op.Add(x, c), _identity, _scalar_is(-0.0), name="AddExactZero"),
    pattern.RewriteRule(lambda op, x, c: op.Add(c, x), _identity, _scalar_is(-0.0), name="ExactZeroAdd"),
    pattern.RewriteRule(lambda op, x, c: op.Sub(x, c), _identity, _scalar_is(0.0), name="SubExactZero"),
    pattern.RewriteRule(lambda op, x, c: op.Mul(x, c), _identity, _scalar_is(1.0), name="MulExactOne"),
    pattern.RewriteRule(lambda op, x, c: op.Mul(c, x), _identity, _scalar_is(1.0), name="ExactOneMul"),
    pattern.RewriteRule(lambda op, x, c: op.Div(x, c), _identity, _scalar_is(1.0), name="DivExactOne"),
]


class _FoldConstants(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        # Weights still in their checkpoint (export(weights=...)) are transposed unread, as a permutation: a change
        # too (the next rewrite then runs over the whole graph, _FoldAndRewrite).
        nodes = len(model.graph)
        _weights.fold_transposes(model)
        transposed = len(model.graph) != nodes
        result = onnxscript.optimizer.fold_constants_ir(model, onnx_shape_inference=False)
        return ir.passes.PassResult(model, result.modified or transposed)


class _Rewrite(ir.passes.InPlacePass):
    """onnxscript's rewrite pass with its default rules; ``SlicesSplit`` only where two Slices exist."""

    def __init__(self, rules: Sequence[pattern.RewriteRule]) -> None:
        super().__init__()
        self.all_rules = onnxscript.rewriter.RewritePass([_RulesByRoot(rules)])  # type: ignore[list-item]
        self.without_slice_split = onnxscript.rewriter.RewritePass(
            [_RulesByRoot([r for r in rules if r is not slice_split_rule])]  # type: ignore[list-item]
        )

    @property
    def removes_unused_nodes(self) -> bool:
        """Whether the rewrite pass removes unused nodes when it ends (onnxscript's does when any rule keeps the
        nodes it replaces)."""
        return bool(getattr(self.all_rules.rules, "remove_unused_nodes", False)) and bool(
            getattr(self.without_slice_split.rules, "remove_unused_nodes", False)
        )

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        # The nodes and what they read (a removed node no longer reads its inputs), to know what the rewrite changed.
        before = {node: tuple(node.inputs) for node in ir.traversal.RecursiveGraphIterator(model.graph)}
        slices = sum(1 for node in before if node.op_type == "Slice" and node.domain in ("", "ai.onnx"))
        for function in model.functions.values():
            slices += sum(1 for node in function if node.op_type == "Slice")
        self._pass = self.all_rules if slices >= 2 else self.without_slice_split
        by_root = _rules_by_root(self._pass)
        if by_root is not None:
            by_root.changes_read = []
        result = self._pass(model)
        self._last_changes = None
        if result.modified and not model.functions and by_root is not None:
            after = set(ir.traversal.RecursiveGraphIterator(model.graph))
            added = [node for node in after if node not in before]
            # Also what the nodes that went unused, and were removed at the end of the pass, read.
            read = by_root.changes_read + [v for node, inputs in before.items() if node not in after for v in inputs]
            self._last_changes = (added, read)
        return result

    def may_match_after_last_changes(self, model: ir.Model) -> bool:
        """Whether the rewrite, run again on `model` as the last rewrite left it, may match anything.

        A rule matches a pattern of nodes reached from its root through the producers of its inputs, at most
        `depth` nodes deep, and checks what the pattern binds: those nodes, their values' types, shapes,
        constants and uses. Where the last rewrite matched nothing, a root can match now only if a node it
        reaches within its rules' depth is new, or saw the uses of one of its values change: the rewrite's new
        nodes, and the producers and the other users of the values that the nodes it added or removed read.
        The rules are tried (not applied) at the roots within that reach; True when one matches, or when the
        changes are not known (functions, a rule whose depth is not known).
        """
        changes, rewrite = getattr(self, "_last_changes", None), getattr(self, "_pass", None)
        if changes is None or rewrite is None:
            return True
        by_root = _rules_by_root(rewrite)
        if by_root is None or by_root.max_depth is None:
            return True
        added, read = changes
        seeds: dict[ir.Node, int] = {node: 0 for node in added if node.graph is not None}
        for value in read:
            if value is None:
                continue
            producer = value.producer()
            if producer is not None and producer.graph is not None:
                seeds[producer] = 0
            for use in value.uses():
                if use.node.graph is not None:
                    seeds[use.node] = 0
        # Roots within reach: a pattern `depth` nodes deep has its root at most depth - 1 consumers downstream.
        distance, frontier = dict(seeds), list(seeds)
        for step in range(1, by_root.max_depth):
            reached = []
            for node in frontier:
                for output in node.outputs:
                    for use in output.uses():
                        if use.node not in distance and use.node.graph is not None:
                            distance[use.node] = step
                            reached.append(use.node)
            frontier = reached
        by_root._pre_visit()
        try:
            return any(by_root.would_rewrite(model, node, reach) for node, reach in distance.items())
        finally:
            by_root._post_visit()


def _rules_by_root(rewrite: ir.passes.PassBase) -> _RulesByRoot | None:
    rule_list = getattr(getattr(rewrite, "rules", None), "rules", ())
    return rule_list[0] if len(rule_list) == 1 and isinstance(rule_list[0], _RulesByRoot) else None


class _RulesByRoot:
    """The rules as one rule that, at each node, tries only those whose pattern can be rooted at its op type.

    onnxscript's rule set tries each rule on each node, in order, and applies the first that matches;
    this does the same, in the same order, without calling the rules that cannot match (60 rules x
    1000 nodes of GPT-2 were 57,000 calls): those rooted at another op type, and those whose pattern needs an
    input computed by an op type the node's input is not computed by (``ReshapeReshape`` at a Reshape of a
    graph input). The attributes the rule set reads after a match (name,
    as_function, remove_nodes) are the matched rule's.
    """

    def __init__(self, rules: Sequence[pattern.RewriteRule]) -> None:
        self.rules = list(rules)
        roots = [_pattern_roots(rule) for rule in self.rules]
        self._anywhere = [rule for rule, root in zip(self.rules, roots) if root is None]
        self._by_root: dict[tuple[str, str], list[pattern.RewriteRule]] = {}
        for key in set().union(*(root for root in roots if root is not None)):
            self._by_root[key] = [rule for rule, root in zip(self.rules, roots) if root is None or key in root]
        self._producers = {id(rule): _pattern_producers(rule) for rule in self.rules}
        self._depths = {id(rule): _pattern_depth(rule) for rule in self.rules}
        known = [depth for depth in self._depths.values() if depth is not None]
        self.max_depth = max(known) if known and len(known) == len(self.rules) else None
        self._checks_fail = _known_failing_checks()
        # The values read by the nodes each rewrite matched or made (read when they were, as a node a later
        # rewrite of the same pass removes no longer reads its inputs): whose uses the rewrites changed.
        self.changes_read: list[ir.Value | None] = []
        # The rule set decides once whether to remove unused nodes afterwards: when any rule keeps them.
        self.remove_nodes = all(rule.remove_nodes for rule in self.rules)
        self.name: str | None = None
        self.as_function = False
        visitors = [rule for rule in self.rules if rule.graph_pre_visitor or rule.graph_post_visitor]
        self.graph_pre_visitor = self._pre_visit if visitors else None
        self.graph_post_visitor = self._post_visit if visitors else None

    def _pre_visit(self) -> None:
        for rule in self.rules:
            if rule.graph_pre_visitor:
                rule.graph_pre_visitor()

    def _post_visit(self) -> None:
        for rule in self.rules:
            if rule.graph_post_visitor:
                rule.graph_post_visitor()

    def try_rewrite(self, model: ir.Model, graph_or_function: Any, node: ir.Node, **options: Any) -> Any:
        for rule in self._rules_at(node):
            delta = rule.try_rewrite(model, graph_or_function, node, **options)
            if delta is not None:
                self.name, self.as_function, self.remove_nodes = rule.name, rule.as_function, rule.remove_nodes
                for changed in (*delta.match.nodes, *delta.new_nodes):
                    self.changes_read.extend(changed.inputs)
                return delta
        return None

    def would_rewrite(self, model: ir.Model, node: ir.Node, reach: int) -> bool:
        """Whether a rule of a pattern deeper than `reach` nodes matches at `node` (tried, not applied)."""
        for rule in self._rules_at(node):
            depth = self._depths[id(rule)]
            if (depth is None or depth > reach) and rule.try_rewrite(model, node.graph, node) is not None:
                return True
        return False

    def _rules_at(self, node: ir.Node) -> Iterator[pattern.RewriteRule]:
        """The rules that may match at `node`, in order."""
        domain = "" if node.domain == "ai.onnx" else node.domain
        for rule in self._by_root.get((domain, node.op_type), self._anywhere):
            if not _producers_can_match(node, self._producers[id(rule)]):
                continue
            if id(rule) in self._checks_fail and self._checks_fail[id(rule)](node):
                continue
            yield rule


def _pattern_producers(rule: pattern.RewriteRule) -> tuple[tuple[int, str, str], ...]:
    """(input position, domain, op type) of the root's inputs the pattern has computed by a given op.

    onnxscript's matcher matches the root node's inputs by position, and an input pattern computed by a node
    only a value computed by a node of that op type; patterns of several outputs (matched otherwise) give ().
    """
    from onnxscript.rewriter import _pattern_ir

    required = []
    try:
        outputs = rule._target_pattern.outputs
        if len(outputs) != 1 or outputs[0].producer() is None:
            return ()
        for position, input_pattern in enumerate(outputs[0].producer().inputs):
            if not isinstance(input_pattern, _pattern_ir.NodeOutputPattern):
                continue
            identifier = input_pattern.producer().op_identifier()
            if identifier is None or not isinstance(identifier[0], str) or not isinstance(identifier[1], str):
                continue
            domain = "" if identifier[0] == "ai.onnx" else identifier[0]
            required.append((position, domain, identifier[1]))
    except (AttributeError, TypeError, ImportError):  # another onnxscript's internals: no filter
        return ()
    return tuple(required)


def _pattern_depth(rule: pattern.RewriteRule) -> int | None:
    """How many nodes deep the rule's pattern reaches from its outputs through producers; None if not known."""
    from onnxscript.rewriter import _pattern_ir

    leaves = (_pattern_ir.Var, _pattern_ir.AnyValue, _pattern_ir.Constant)

    def depth(value: Any) -> int:
        if value is None or type(value) in leaves:
            return 0
        if type(value) is not _pattern_ir.NodeOutputPattern:
            raise TypeError(f"not a pattern of known depth: {type(value).__name__}")  # alternatives (Or patterns)
        return 1 + max((depth(input_pattern) for input_pattern in value.producer().inputs), default=0)

    try:
        outputs = rule._target_pattern.outputs
        if len(outputs) != 1:
            return None  # several roots (SlicesSplit): matched through the values they share, not producers
        return depth(outputs[0])
    except (AttributeError, TypeError, ImportError, RecursionError):  # another onnxscript's internals
        return None


def _producers_can_match(node: ir.Node, required: tuple[tuple[int, str, str], ...]) -> bool:
    inputs = node.inputs
    for position, domain, op_type in required:
        value = inputs[position] if position < len(inputs) else None
        producer = value.producer() if value is not None else None
        if producer is None or producer.op_type != op_type:
            return False  # onnxscript's matcher fails there too
        if ("" if producer.domain == "ai.onnx" else producer.domain) != domain:
            return False
    return True


def _known_failing_checks() -> dict[int, Callable[[ir.Node], bool]]:
    """For the rules tried most often on transformers, what makes their check fail at once, read without the
    matcher (id(rule) -> whether the rule's check fails at the node)."""
    try:
        from onnxscript.rewriter.rules.common._materialize_reshape_shape import materialize_reshape_shape_rule
    except ImportError:  # another onnxscript
        return {}

    def reshape_to_a_constant_shape(node: ir.Node) -> bool:
        # MaterializeReshapeShape gives a Reshape to a computed shape a constant one: its check fails first
        # thing when the shape is a constant (an in-memory one, whose numpy() cannot fail).
        shape = node.inputs[1] if len(node.inputs) == 2 else None
        return shape is not None and isinstance(shape.const_value, ir.Tensor)

    def no_second_slice(node: ir.Node) -> bool:
        # SlicesSplit pairs the Slice with a second Slice of the same input by enumerating the whole graph for each
        # Slice (quadratic: two thirds of the optimizer's time on Swin-T's 85 Slices); its check needs the first to
        # begin at a constant 0. Without such a begin, or without another Slice of the input (or, degenerate, the
        # node as its own partner: an empty first slice), the rule cannot match.
        begin = _constant_list(node.inputs[1] if len(node.inputs) > 1 else None)
        if begin != [0]:
            return True
        source = node.inputs[0]
        if source is None:
            return True
        if any(user is not node and user.op_type == "Slice" and index == 0 for user, index in source.uses()):
            return False
        return _constant_list(node.inputs[2] if len(node.inputs) > 2 else None) != [0]

    return {
        id(materialize_reshape_shape_rule): reshape_to_a_constant_shape,
        id(slice_split_rule): no_second_slice,
    }


def _constant_list(value: ir.Value | None) -> list[Any] | None:
    """A constant input's elements (None when not a constant onnxscript's check could read)."""
    constant = value.const_value if value is not None else None
    if constant is None:
        return None
    try:
        return constant.numpy().tolist()
    except Exception:  # a tensor whose data cannot be read: the check could not read it either
        return None


def _pattern_roots(rule: pattern.RewriteRule) -> set[tuple[str, str]] | None:
    """(domain, op type) of the nodes producing the pattern's outputs; None when any node may match."""
    roots = set()
    try:
        for output in rule._target_pattern.outputs:
            producer = output.producer()
            if producer is None:
                return None
            domain, op_type, _ = producer.op_identifier()
            if not isinstance(domain, str) or not isinstance(op_type, str):
                return None  # a pattern over several op types or domains
            roots.add(("" if domain == "ai.onnx" else domain, op_type))
    except (AttributeError, TypeError):  # another onnxscript's internals: match everything
        return None
    return roots or None


__all__ = ["optimize"]
