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
computed by (``ReshapeReshape`` needs a Reshape's output; Reshape(MatMul(Reshape)) a MatMul of a Reshape), whose
pattern binds inputs the node has not or has too many of (``_pattern_arity``), or whose check fails at once
(``_known_failing_checks``: the exact no-op rules at an Add or Mul of no scalar constant, tried at every Add and Mul
of Whisper or T5 to fail). Constant folding uses the types and shapes fx2onnx recorded while emitting instead of
running ONNX shape inference again on every node, and passes over the nodes it cannot change (``_fold_pass``).
Constants of a number or list attribute (torchlib's shapes) hold their tensor as a ``value`` from the start, which
folding and rewriting read without making a new array each time (``_number_constants_as_tensors``). The inliner,
which walks the whole graph, runs only when the model still has a function to inline. optimize_ir's fold/rewrite
loop runs each pass again only when it may still change something, and removes unused nodes only where the rewrite
pass has not just done it (``_FoldAndRewrite``). Constants are lifted to initializers without ``ir.tensor``'s slow
checks (``_LiftConstants``).

The fold computes only what it computes exactly, as eager does (``_EXACT_FOLDS``): ONNX's reference evaluator, which
it runs, sums a float16 ReduceMean in float16 and takes LogSoftmax as log(softmax), where eager and ONNX Runtime do
not. Elementwise functions of constants (the cos and sin of rotary embeddings) are computed by torch (``_TORCH_FOLDS``).
"""

from __future__ import annotations

import contextlib
import math
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxscript.optimizer
import onnxscript.rewriter
import torch
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules.common import (
    _basic_rules,
    _redundant_scatter_nd,
    slice_split_rule,
    successive_clip_rule,
    successive_relu_clip_rule,
)

from fx2onnx import _weights
from fx2onnx._constant_arrays import constant_attribute_tensor, number_attribute_tensor
from fx2onnx._finalize import graph_walks
from fx2onnx._log_filters import without_messages

# What a pass changed: the nodes it added (or changed the inputs of), the values whose uses it changed.
_Changes = tuple[list[ir.Node], list[ir.Value | None]]
_NO_CHANGES: _Changes = ([], [])  # never appended to


def optimize(model: ir.Model, num_iterations: int = 2) -> None:
    """What ``onnxscript.optimizer.optimize_ir(model)`` does, without the quadratic rule where it cannot match."""
    # one optimization at a time uses the rewrite (and onnxscript's name fixes)
    with without_messages(_UNACTIONABLE_WARNINGS), _REWRITE_IN_USE, _name_fixes_only_where_needed():
        _optimize(model, num_iterations)


@contextlib.contextmanager
def _name_fixes_only_where_needed() -> Iterator[None]:
    """onnxscript's fold and rewrite run onnx_ir's NameFixPass on the whole model after each pass that changed it, in
    case a new value took a name already used; on fx2onnx's models none ever did (a walk of ~2 ms on GPT-2 for
    nothing, two to four times an export). Meanwhile they run it only where :func:`graph_walks.names_need_fixing`,
    a third of its walk, finds a name to fix: the model they leave is the same."""
    from onnxscript.optimizer import _constant_folding
    from onnxscript.rewriter import _rewrite_rule

    modules = [m for m in (_constant_folding, _rewrite_rule) if getattr(m, "ir_passes_common", None) is common_passes]
    for module in modules:
        module.ir_passes_common = _PASSES_FIXING_NAMES_WHERE_NEEDED  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in modules:
            module.ir_passes_common = common_passes  # type: ignore[attr-defined]


# onnx_ir's common passes as onnxscript's modules read them, their NameFixPass run only where a name needs fixing.
_PASSES_FIXING_NAMES_WHERE_NEEDED = types.SimpleNamespace(
    **{**vars(common_passes), "NameFixPass": graph_walks.fix_names}
)


# Warnings the passes log that say nothing wrong about the model: a constant the ONNX reference evaluator
# cannot fold (its GatherElements handles at most 64 distinct values, say) stays a node and runs in the
# runtime, as does a Split of a constant into several outputs (GPT-J's sin/cos table: the folder folds one output
# at most); a graph output that is also an initializer is not deduplicated. Shown at INFO or DEBUG.
_UNACTIONABLE_WARNINGS = {
    "onnxscript.optimizer._constant_folding": ("Evaluation failed", "Skipping constant folding for op"),
    "onnx_ir.passes.common.initializer_deduplication": ("as it is a graph input or output",),
}


def _optimize(model: ir.Model, num_iterations: int) -> None:
    rules: Sequence[pattern.RewriteRule] | None = getattr(onnxscript.rewriter, "_DEFAULT_REWRITE_RULES", None)
    if not rules or slice_split_rule not in rules:  # another onnxscript: use its optimizer as it is
        onnxscript.optimizer.optimize_ir(model)
        return
    # Clip(Clip(x, a, b), c, d) is not Clip(x, max(a, c), min(b, d)) when the ranges are apart: clamp(0, 1) then
    # clamp(2, 3) is 2 in eager, the fused Clip(x, 2, 1) gives 1 (fuzz seed 40000786: crossed bounds likewise), and
    # Relu(Clip(x, -3, -1)) is 0, not Clip(x, 0, -1) = -1. (Clip(Relu(x)) fuses right: kept.)
    rules = [rule for rule in rules if rule not in (successive_clip_rule, successive_relu_clip_rule)]
    rewrite = _rewrite_with(rules)
    _number_constants_as_tensors(model.graph)
    passes = ir.passes.Sequential(
        graph_walks.inline_functions(),
        _FoldAndRewrite(_FoldConstants(), rewrite, num_iterations),
        *(() if rewrite.removes_unused_nodes else (common_passes.RemoveUnusedNodesPass(),)),
        _lift_constants(),
        graph_walks.lift_subgraph_initializers(),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        graph_walks.fix_outputs(),
        graph_walks.fix_names(),
    )
    passes(model)


# The rewrite made from onnxscript's default rules, kept from one export to the next: building it (the exact no-op and
# ScatterND rules, each rule's pattern read for its root, inputs and depth) took ~10 ms an export. Keyed by the rules
# it was made from; its per-run state is reset before each run, under _REWRITE_IN_USE.
_REWRITES: dict[tuple[int, ...], tuple[Sequence[pattern.RewriteRule], _Rewrite]] = {}
_REWRITE_IN_USE = threading.Lock()


def _rewrite_with(rules: Sequence[pattern.RewriteRule]) -> _Rewrite:
    key = tuple(id(rule) for rule in rules)
    cached = _REWRITES.get(key)
    if cached is None:
        exact = _with_halving_slice_split(_with_exact_scatter_nd(_with_exact_no_ops(rules)))
        cached = (list(rules), _Rewrite(exact))  # (the list keeps the ids)
        _REWRITES.clear()
        _REWRITES[key] = cached
    rewrite = cached[1]
    rewrite.reset()
    return rewrite


def _number_constants_as_tensors(graph: ir.Graph) -> None:
    """Give each Constant of a number or list attribute (``value_ints``: torchlib's shapes, one per Reshape) its
    tensor as a ``value`` attribute, the int64 or float32 tensor ONNX defines it as.

    Constant folding, and the rewrite pass before it starts, read every Constant's tensor again, and made a new
    numpy array and ``ir.Tensor`` from such an attribute each time (~10% of the optimizer's time on GPT-2); the
    lifting of Constants to initializers made one more. A ``value`` attribute's tensor is read as it is.
    """
    for node in graph:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attributes) != 1:
            continue
        ((name, attribute),) = node.attributes.items()
        if name not in _NUMBER_ATTRIBUTES:
            continue
        tensor = number_attribute_tensor(attribute)
        if tensor is None:
            continue  # a reference or a mistyped attribute: left as it is
        del node.attributes[name]
        node.attributes["value"] = ir.AttrTensor("value", tensor)


_NUMBER_ATTRIBUTES = frozenset({"value_int", "value_ints", "value_float", "value_floats"})


class _LiftConstants(common_passes.LiftConstantsToInitializersPass):
    """onnx_ir's pass lifting every Constant to an initializer, without ``ir.Attr.as_tensor``'s and ``ir.tensor``'s
    checks of what the value is (runtime protocol checks, ~0.1-0.3 ms a call on Python 3.11: most of the pass's
    time on GPT-2): a tensor attribute's tensor is taken as it is, a number or list attribute's tensor made as
    ``ir.tensor`` makes it (an int64 or float32 array)."""

    def _constant_node_attribute_to_tensor(
        self, node: ir.Node, attr_name: str, attr_value: ir.Attr, initializer_name: str
    ) -> ir.TensorProtocol | None:
        tensor = constant_attribute_tensor((attr_value,)) if self.lift_all_constants else None
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

    A rewrite run again can only match where the previous rewrite, or the fold after it, changed the graph
    (``_Rewrite.may_match_after_last_changes``): the rules are first tried there, without applying them, and the
    whole pass runs only if one matches (on GPT-2 the second rewrite tried 411 nodes to match none; on T5 the fold
    removed the 18 Identity nodes the rewrite of x * 1 left, and a second rewrite of its 930 nodes matched nothing).
    """

    def __init__(self, fold: _FoldConstants, rewrite: _Rewrite, iterations: int) -> None:
        super().__init__()
        self.fold, self.rewrite, self.iterations = fold, rewrite, iterations

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        fold_pending = rewrite_pending = True
        for _ in range(self.iterations):
            if not (fold_pending or rewrite_pending):
                break
            self.fold.since = self.rewrite.last_changes  # a fold run again runs after a rewrite
            folded = fold_pending and self.fold(model).modified
            fold_changes = self.fold.last_changes if folded else _NO_CHANGES
            if rewrite_pending and not self.rewrite.may_match_after_last_changes(model, fold_changes):
                # The rewrite would match nothing: neither pass has anything left to change. What it would have
                # removed, the nodes the fold left unused (an Identity whose users it rewired), is removed here.
                if folded:
                    common_passes.RemoveUnusedNodesPass()(model)
                    modified = True
                break
            rewritten = (rewrite_pending or folded) and self.rewrite(model).modified
            if not self.rewrite.removes_unused_nodes:
                common_passes.RemoveUnusedNodesPass()(model)
            modified = modified or folded or rewritten
            fold_pending = rewrite_pending = rewritten
        modified = graph_walks.remove_unused_functions()(model).modified or modified
        modified = graph_walks.remove_unused_opsets()(model).modified or modified
        return ir.passes.PassResult(model, modified)


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


def _with_halving_slice_split(rules: Sequence[pattern.RewriteRule]) -> list[pattern.RewriteRule]:
    """`rules` with onnxscript's SlicesSplit (x[..., :k] and x[..., k:] -> Split(x, num_outputs=2), k = n // 2) made
    to fire only where the last dim n is even: Split's first part is ceil(n / 2) long, so for an odd n it took one
    element more than the first Slice (roll([a, b, c], 2): [c, a, b], eager [b, c, a]; fuzz seed 60000074)."""
    return [_SLICES_SPLIT if rule is slice_split_rule else rule for rule in rules]


class _SlicesSplitInHalves(_basic_rules.SlicesSplit):
    def check(self, context: Any, x: ir.Value, *args: Any, **kwargs: Any) -> Any:
        shape = x.shape
        if shape is None or not shape or not isinstance(shape[-1], int) or shape[-1] % 2:
            return onnxscript.rewriter.MatchResult().fail("The last dim is not known to be even.")
        return super().check(context, x, *args, **kwargs)


_SLICES_SPLIT = _SlicesSplitInHalves.rule(name="SlicesSplit")


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


def _exact_no_op_rule(op_type: str, constant_at: int, value: float, name: str) -> pattern.RewriteRule:
    def target(op: Any, x: ir.Value, c: ir.Value) -> ir.Value:
        return getattr(op, op_type)(*((c, x) if constant_at == 0 else (x, c)))

    rule = pattern.RewriteRule(target, _identity, _scalar_is(value), name=name)
    _EXACT_NO_OP_CONSTANTS[id(rule)] = (constant_at, value)
    return rule


# id(rule) -> (position of the constant input, its value) of each exact no-op rule.
_EXACT_NO_OP_CONSTANTS: dict[int, tuple[int, float]] = {}
_EXACT_NO_OP_RULES = [
    _exact_no_op_rule("Add", 1, -0.0, "AddExactZero"),
    _exact_no_op_rule("Add", 0, -0.0, "ExactZeroAdd"),
    _exact_no_op_rule("Sub", 1, 0.0, "SubExactZero"),
    _exact_no_op_rule("Mul", 1, 1.0, "MulExactOne"),
    _exact_no_op_rule("Mul", 0, 1.0, "ExactOneMul"),
    _exact_no_op_rule("Div", 1, 1.0, "DivExactOne"),
]


class _FoldConstants(ir.passes.InPlacePass):
    """The fold; ``last_changes`` is what its last run changed, as ``_Rewrite`` records its own changes (the nodes it
    added, the values whose uses it changed), or None when not known.

    ``since``, when set, is what a pass changed since the fold's last run (in the same form, None when not known): the
    fold then first looks whether it can change anything there. It is a single pass in topological order, at its fixed
    point once it has run, so run again it can only change where the graph changed: at the nodes added, at the nodes
    reading their outputs, and at the readers and producers of the values whose uses changed. Where it passes over
    every one of those at once (``passes_over``, with the symbolic values its last run found), it would leave the
    model as it is, and is not run (on GPT-2, BERT and T5 the second fold changed nothing, 8-12 ms on GPT-2).
    """

    last_changes: _Changes | None = None
    since: _Changes | None = None
    _last_fold: Any = None

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        # Weights still in their checkpoint (export(weights=...)) are transposed unread, as a permutation: a change
        # too (the next rewrite then runs over the whole graph, _FoldAndRewrite).
        nodes = len(model.graph)
        _weights.fold_transposes(model)
        transposed = len(model.graph) != nodes
        if not transposed and not self._may_change_since():
            self.last_changes = _NO_CHANGES
            return ir.passes.PassResult(model, False)
        fold = self._last_fold = _fold_pass()
        result = (
            fold(model)
            if fold is not None
            else onnxscript.optimizer.fold_constants_ir(
                model, onnx_shape_inference=False, should_fold=_fold_only_where_exact
            )
        )
        self.last_changes = None if fold is None or transposed else fold.changes
        return ir.passes.PassResult(model, result.modified or transposed)

    def _may_change_since(self) -> bool:
        fold, since = self._last_fold, self.since
        if fold is None or since is None:
            return True
        added, read = since
        rewired = set(added)
        for node in added:
            rewired.update(use.node for output in node.outputs for use in output.uses())
        if any(node.graph is not None and not fold.passes_over(node) for node in rewired):
            return True
        # Elsewhere only the uses of the values read changed, which the fold reads only at a node of constant inputs
        # (a large constant is folded when that node alone reads it).
        return any(
            use.node.graph is not None and _of_constants(use.node)
            for value in read
            if value is not None
            for use in value.uses()
        )


def _of_constants(node: ir.Node) -> bool:
    return all(value is None or (value.const_value is not None and not value.is_graph_input()) for value in node.inputs)


# What the fold may compute, by op type (ONNX domain). The fold evaluates a node with ONNX's reference evaluator
# (numpy), which computes some ops unlike eager and ONNX Runtime: in the precision of its input (a float16 ReduceMean,
# Softmax or InstanceNormalization summed in float16, overflowing to inf where eager, and ONNX Runtime after
# legalization, sum in float32), by another formula (LogSoftmax as log(softmax): -inf where eager gives -2e30), or at
# the edges (AveragePool of a window holding NaN and padding: 0, eager NaN). So only ops whose reference result is
# exact are folded: data movement, casts, comparisons and logic, and IEEE arithmetic, correctly rounded in every float
# type (numpy computes a float16 op in float32 and rounds it once: the float16 result).
_EXACT_FOLDS = frozenset(
    {
        *("Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Transpose", "Concat", "Slice"),
        *("Gather", "GatherElements", "GatherND", "Tile", "Trilu", "Shape", "Size", "ConstantOfShape", "Range"),
        *("Cast", "CastLike", "Where", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"),
        *("Not", "And", "Or", "Xor", "IsNaN", "IsInf"),
        *("Neg", "Abs", "Add", "Sub", "Mul", "Div", "Max", "Min", "Floor", "Ceil", "Sqrt", "Reciprocal"),
    }
)
# Sums and products, which an evaluator may reorder (numpy's pairwise sum) or accumulate in the input's precision,
# and ops whose float edges (NaN, -0.0) the evaluator may order otherwise: folded on integers only.
_INTEGER_FOLDS = frozenset(
    {
        *("CumSum", "ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "Mod"),
        *("BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"),
    }
)
# Elementwise functions no two libraries round alike (numpy's float32 exp(88.7) is 1 ulp off eager's): computed by
# torch's own kernel, so that the constant is eager's (rotary embeddings' cos and sin, T5's log-spaced position
# buckets, ALiBi's slopes as a Pow), on float inputs of one dtype only.
_TORCH_FOLDS: dict[str, Callable[..., torch.Tensor]] = {
    "Exp": torch.exp,
    "Log": torch.log,
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid,
    "Erf": torch.erf,
    "Pow": torch.pow,
}
_TORCH_DTYPES = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.FLOAT, ir.DataType.DOUBLE})


def _fold_only_where_exact(node: ir.Node) -> bool | None:
    """``should_fold`` for onnxscript's fold: None (its own rules and size limits) for a node whose reference result is
    exact, False otherwise (left to ONNX Runtime, or to :func:`_torch_fold`)."""
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in _EXACT_FOLDS:
        return None
    if node.op_type in _INTEGER_FOLDS:
        data = node.inputs[0] if node.inputs else None
        dtype = data.dtype if data is not None else None
        return None if dtype is not None and dtype.is_integer() else False
    return False


def _torch_fold(node: ir.Node, input_size_limit: int) -> np.ndarray | None:
    """The value of an elementwise function of constant float inputs, computed by torch (None: not folded here)."""
    function = _TORCH_FOLDS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if function is None or not node.inputs or len(node.outputs) != 1 or node.attributes:
        return None
    tensors = []
    for value in node.inputs:
        tensor = value.const_value if value is not None and not value.is_graph_input() else None
        if tensor is None or tensor.dtype not in _TORCH_DTYPES or tensor.size > input_size_limit:
            return None
        tensors.append(tensor)
    if len({tensor.dtype for tensor in tensors}) != 1:
        return None
    arrays = [tensor.numpy() for tensor in tensors]
    # numpy's bfloat16 (ml_dtypes) is not torch's: through float32, exactly.
    if tensors[0].dtype == ir.DataType.BFLOAT16:
        inputs = [torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16) for array in arrays]
    else:
        inputs = [torch.from_numpy(np.array(array)) for array in arrays]
    result = _in_chunks(function, inputs)
    if tensors[0].dtype == ir.DataType.BFLOAT16:
        return result.float().numpy().astype(arrays[0].dtype)
    return result.numpy()


# Elements per call: torch computes these functions on its thread pool above 2048 elements, whose wake-up cost ~8 ms a
# call on a loaded machine (the fold's whole time on a Llama), ~20 us on the calling thread. Chunks of a multiple of
# every vector width give the values one call over the whole tensor gives (its vectorized loop and tail alike).
_CHUNK = 2048


def _in_chunks(function: Callable[..., torch.Tensor], inputs: list[torch.Tensor]) -> torch.Tensor:
    """``function(*inputs)`` (broadcast), computed on the calling thread, `_CHUNK` elements at a time."""
    shape = torch.broadcast_shapes(*(tensor.shape for tensor in inputs))
    flat = [tensor.expand(shape).contiguous().reshape(-1) for tensor in inputs]
    size = flat[0].numel()
    if size <= _CHUNK:
        return function(*flat).reshape(shape)
    pieces = [function(*(tensor[start : start + _CHUNK] for tensor in flat)) for start in range(0, size, _CHUNK)]
    return torch.cat(pieces).reshape(shape)


def _fold_pass() -> ir.passes.PassBase | None:
    """onnxscript's constant folding as ``fold_constants_ir(model, onnx_shape_inference=False)`` runs it, visiting
    only the nodes it may change (None for another onnxscript, whose internals differ: then fold_constants_ir)."""
    from onnxscript.optimizer import _constant_folding

    evaluators = getattr(getattr(_constant_folding, "registry", None), "op_evaluators", None)
    base = getattr(_constant_folding, "FoldConstantsPass", None)
    if not isinstance(evaluators, dict) or base is None or not callable(getattr(base, "visit_node", None)):
        return None

    class FoldWhereItMay(base):  # type: ignore[misc, valid-type]
        """The fold at a node (``process_node``) leaves it as it is when no input has a symbolic value (an equal
        value, a shape: what the partial evaluators record), the op has no partial evaluator, and an input is not a
        constant or is a graph input; nothing is then left to do there but visit its subgraphs. Such nodes (most of a
        transformer's: MatMul, Softmax, LayerNormalization... of activations) are passed over. ~25 us a node."""

        def visit_node(self, node: ir.Node, root: Any) -> None:
            if not self.passes_over(node):
                super().visit_node(node, root)

        def passes_over(self, node: ir.Node) -> bool:
            """Whether the fold leaves `node` as it is at once: no evaluator, an input neither constant nor symbolic."""
            if node.op_type == "Constant" or (node.domain, node.op_type) in evaluators:
                return False
            symbolic = self._state.symbolic_value_map
            foldable = True
            for value in node.inputs:
                if value is None:
                    continue
                if value in symbolic:
                    return False
                if value.const_value is None or value.is_graph_input():
                    foldable = False
            attributes = node.attributes.values()
            return not foldable and not any(attribute.type in _GRAPH_ATTRIBUTES for attribute in attributes)

        changes: _Changes | None = None

        def call(self, model: ir.Model) -> Any:
            # What the fold changes: the nodes it adds or whose inputs or output types it changes, and the values it
            # reads or rewires the uses of (its replacements' outputs). Graph outputs it replaces: not known.
            self.changes = ([], [])
            outputs = list(model.graph.outputs)
            result = super().call(model)
            if list(model.graph.outputs) != outputs or model.functions:
                self.changes = None
            return result

        def replace_node(self, node: ir.Node, replacement: Any, root: Any) -> None:
            if self.changes is not None:
                self.changes[0].extend(replacement.new_nodes)
                self.changes[1].extend((*node.inputs, *replacement.new_outputs))
            super().replace_node(node, replacement, root)

        def process_node(self, node: ir.Node, is_function: bool) -> Any:
            inputs, types = tuple(node.inputs), [output.type for output in node.outputs]
            replacement = super().process_node(node, is_function)
            if self.changes is not None and (
                tuple(node.inputs) != inputs or [output.type for output in node.outputs] != types
            ):  # inputs replaced by the values they equal (an Identity's input), or an output newly typed
                self.changes[0].append(node)
                self.changes[1].extend((*inputs, *node.outputs))
            if replacement is not None or is_function or node.graph is None:
                return replacement
            array = _torch_fold(node, self.input_size_limit)
            folded = self.new_initializer(node, array) if array is not None else None
            if folded is None:
                return None
            node.graph.register_initializer(folded)
            return replacement_type([folded], [])

    replacement_type = getattr(_constant_folding, "Replacement", None)
    if replacement_type is None:
        return None
    try:
        fold = FoldWhereItMay(
            shape_inference=False,
            input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
            output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
            should_fold=_fold_only_where_exact,
        )
    except (AttributeError, TypeError):
        return None
    if not hasattr(getattr(fold, "_state", None), "symbolic_value_map"):
        return None
    return fold


_GRAPH_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


class _Rewrite(ir.passes.InPlacePass):
    """onnxscript's rewrite pass with its default rules; ``SlicesSplit`` only where two Slices exist."""

    def __init__(self, rules: Sequence[pattern.RewriteRule]) -> None:
        super().__init__()
        self.all_rules = onnxscript.rewriter.RewritePass([_RulesByRoot(rules)])  # type: ignore[list-item]
        self.without_slice_split = onnxscript.rewriter.RewritePass(
            [_RulesByRoot([r for r in rules if r not in (slice_split_rule, _SLICES_SPLIT)])]  # type: ignore[list-item]
        )
        self.reset()

    @property
    def removes_unused_nodes(self) -> bool:
        """Whether the rewrite pass removes unused nodes when it ends (onnxscript's does when any rule keeps the
        nodes it replaces)."""
        return bool(getattr(self.all_rules.rules, "remove_unused_nodes", False)) and bool(
            getattr(self.without_slice_split.rules, "remove_unused_nodes", False)
        )

    def reset(self) -> None:
        """Forget the last run's changes (of another model: the rewrite is kept from one export to the next)."""
        self._last_changes: _Changes | None = None
        self._pass: Any = None
        for rewrite in (self.all_rules, self.without_slice_split):
            by_root = _rules_by_root(rewrite)
            if by_root is not None:
                by_root.reset()

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        # The nodes and what they read (a removed node no longer reads its inputs), to know what the rewrite changed.
        before = {node: tuple(node.inputs) for node in graph_walks.all_nodes(model.graph)}
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
            after = set(graph_walks.all_nodes(model.graph))
            added = [node for node in after if node not in before]
            # Also what the nodes that went unused, and were removed at the end of the pass, read.
            read = by_root.changes_read + [v for node, inputs in before.items() if node not in after for v in inputs]
            self._last_changes = (added, read)
        return result

    @property
    def last_changes(self) -> _Changes | None:
        """What the last run changed (the nodes it added, the values whose uses it changed); None when not known."""
        return self._last_changes

    def may_match_after_last_changes(self, model: ir.Model, also: _Changes | None = _NO_CHANGES) -> bool:
        """Whether the rewrite, run again on `model` as the last rewrite (and `also`, the changes of a pass run since,
        in the same form) left it, may match anything.

        A rule matches a pattern of nodes reached from its root through the producers of its inputs, at most
        `depth` nodes deep, and checks what the pattern binds: those nodes, their values' types, shapes,
        constants and uses. Where the last rewrite matched nothing, a root can match now only if a node it
        reaches within its rules' depth is new, or saw the uses of one of its values change: the rewrite's new
        nodes, and the producers and the other users of the values that the nodes it added or removed read.
        The rules are tried (not applied) at the roots within that reach; True when one matches, or when the
        changes are not known (functions, a rule whose depth is not known).
        """
        changes, rewrite = getattr(self, "_last_changes", None), getattr(self, "_pass", None)
        if changes is None or rewrite is None or also is None:
            return True
        by_root = _rules_by_root(rewrite)
        if by_root is None or by_root.max_depth is None:
            return True
        added, read = changes[0] + also[0], changes[1] + also[1]
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
    1000 nodes of GPT-2 were 57,000 calls): those rooted at another op type, those whose pattern needs an
    input computed by an op type the node's input is not computed by (``ReshapeReshape`` at a Reshape of a
    graph input), those whose pattern binds an input the node lacks or takes fewer inputs than it has, and those
    whose check fails at the node (``_known_failing_checks``). The attributes the rule set reads after a match (name,
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
        self._arities = {id(rule): _pattern_arity(rule) for rule in self.rules}
        self._depths = {id(rule): _pattern_depth(rule) for rule in self.rules}
        known = [depth for depth in self._depths.values() if depth is not None]
        self.max_depth = max(known) if known and len(known) == len(self.rules) else None
        self._checks_fail = _known_failing_checks()
        self.reset()
        visitors = [rule for rule in self.rules if rule.graph_pre_visitor or rule.graph_post_visitor]
        self.graph_pre_visitor = self._pre_visit if visitors else None
        self.graph_post_visitor = self._post_visit if visitors else None

    def reset(self) -> None:
        """The state before a run: what the last run's matches set."""
        # The values read by the nodes each rewrite matched or made (read when they were, as a node a later
        # rewrite of the same pass removes no longer reads its inputs): whose uses the rewrites changed.
        self.changes_read: list[ir.Value | None] = []
        # The rule set decides once whether to remove unused nodes afterwards: when any rule keeps them.
        self.remove_nodes = all(rule.remove_nodes for rule in self.rules)
        self.name: str | None = None
        self.as_function = False

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
            if not _arity_can_match(node, self._arities[id(rule)]):
                continue
            if not _producers_can_match(node, self._producers[id(rule)]):
                continue
            if id(rule) in self._checks_fail and self._checks_fail[id(rule)](node):
                continue
            yield rule


def _pattern_producers(rule: pattern.RewriteRule) -> tuple[tuple[tuple[int, ...], str, str], ...]:
    """(input path, domain, op type) of each node the pattern has computing an input of the root, or of such a node.

    onnxscript's matcher matches a node's inputs by position, and an input pattern computed by a node only a value
    computed by a node of that op type, recursively: ``Reshape(MatMul(Reshape(a, s), b), c)`` needs the root's
    input 0 computed by a MatMul, whose input 0 is computed by a Reshape (paths (0,) and (0, 0)). Parents come
    before their children. Patterns of several outputs (matched otherwise) give ().
    """
    from onnxscript.rewriter import _pattern_ir

    required: list[tuple[tuple[int, ...], str, str]] = []

    def walk(node_pattern: Any, path: tuple[int, ...], depth: int) -> None:
        if depth > 8:
            raise RecursionError("pattern too deep")
        for position, input_pattern in enumerate(node_pattern.inputs):
            if not isinstance(input_pattern, _pattern_ir.NodeOutputPattern):
                continue
            identifier = input_pattern.producer().op_identifier()
            if identifier is None or not isinstance(identifier[0], str) or not isinstance(identifier[1], str):
                continue
            domain = "" if identifier[0] == "ai.onnx" else identifier[0]
            required.append(((*path, position), domain, identifier[1]))
            walk(input_pattern.producer(), (*path, position), depth + 1)

    try:
        outputs = rule._target_pattern.outputs
        if len(outputs) != 1 or outputs[0].producer() is None:
            return ()
        walk(outputs[0].producer(), (), 0)
    except (AttributeError, TypeError, ImportError, RecursionError):  # another onnxscript's internals: no filter
        return ()
    return tuple(required)


def _pattern_arity(rule: pattern.RewriteRule) -> tuple[tuple[int, ...], int | None]:
    """(the input positions the root's pattern needs a value at, the most inputs it takes or None).

    onnxscript's matcher fails a node of more inputs than its pattern's node unless that allows other inputs
    (``SlicesSplit``'s Slices of four inputs at torchlib's Slices of five), and a missing or None input where the
    pattern has a variable that cannot match None, a constant or a computed value (``RemoveOptionalBiasFromGemm`` at
    the Gemm without bias it made). For a pattern of several outputs, only the most inputs any of its nodes takes.
    """
    from onnxscript.rewriter import _pattern_ir

    try:
        outputs = rule._target_pattern.outputs
        nodes = [output.producer() for output in outputs]
        if not nodes or any(node is None for node in nodes):
            return (), None
        most = None if any(node.allow_other_inputs for node in nodes) else max(len(node.inputs) for node in nodes)
        if len(nodes) != 1:
            return (), most
        needed = []
        for position, input_pattern in enumerate(nodes[0].inputs):
            kind = type(input_pattern)
            if kind in (_pattern_ir.NodeOutputPattern, _pattern_ir.Constant) or (
                kind is _pattern_ir.Var and not input_pattern.can_match_none
            ):
                needed.append(position)
        return tuple(needed), most
    except (AttributeError, TypeError, ImportError):  # another onnxscript's internals: no filter
        return (), None


def _arity_can_match(node: ir.Node, arity: tuple[tuple[int, ...], int | None]) -> bool:
    needed, most = arity
    inputs = node.inputs
    if most is not None and len(inputs) > most:
        return False
    return all(position < len(inputs) and inputs[position] is not None for position in needed)


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


def _producers_can_match(node: ir.Node, required: tuple[tuple[tuple[int, ...], str, str], ...]) -> bool:
    for path, domain, op_type in required:
        producer: ir.Node | None = node
        for position in path:
            inputs = producer.inputs  # type: ignore[union-attr]
            value = inputs[position] if position < len(inputs) else None
            producer = value.producer() if value is not None else None
            if producer is None:
                return False  # onnxscript's matcher fails there too
        if producer.op_type != op_type or ("" if producer.domain == "ai.onnx" else producer.domain) != domain:  # type: ignore[union-attr]
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
        # Both Slices' axes must be one constant axis, the last of their input (of known rank).
        axes = _constant_list(node.inputs[3] if len(node.inputs) > 3 else None)
        rank = len(node.inputs[0].shape) if node.inputs[0] is not None and node.inputs[0].shape is not None else None
        if rank is None or axes is None or len(axes) != 1 or axes[0] not in (-1, rank - 1):
            return True
        source = node.inputs[0]
        if source is None:
            return True
        if any(user is not node and user.op_type == "Slice" and index == 0 for user, index in source.uses()):
            return False
        return _constant_list(node.inputs[2] if len(node.inputs) > 2 else None) != [0]

    def identity_permutation_fails(node: ir.Node) -> bool:
        # TransposeIdentity's check fails for a perm (of ints, not a reference) that is not the identity.
        perm = node.attributes.get("perm")
        if perm is None or perm.is_ref() or perm.type != ir.AttributeType.INTS:
            return False  # left to the matcher and the check
        ints = tuple(perm.as_ints())
        return ints != tuple(range(len(ints)))

    def exact_no_op_fails(constant_at: int, value: float) -> Callable[[ir.Node], bool]:
        # The exact no-op rules' condition (_scalar_is), read at the node: their pattern binds its two inputs.
        condition = _scalar_is(value)

        def fails(node: ir.Node) -> bool:
            if len(node.inputs) != 2 or node.inputs[constant_at] is None:
                return False  # left to the matcher
            x, c = node.inputs[1 - constant_at], node.inputs[constant_at]
            return not condition(None, x=x, c=c)

        return fails

    checks: dict[int, Callable[[ir.Node], bool]] = {
        id(materialize_reshape_shape_rule): reshape_to_a_constant_shape,
        id(slice_split_rule): no_second_slice,
        id(_SLICES_SPLIT): no_second_slice,
    }
    try:
        from onnxscript.rewriter.rules.common._basic_rules import no_op_transpose_rule
    except ImportError:  # another onnxscript
        pass
    else:
        checks[id(no_op_transpose_rule)] = identity_permutation_fails
    try:
        from onnxscript.rewriter import _ir_utils
        from onnxscript.rewriter.rules.common._collapse_slices import collapse_slice2_rule, collapse_slice_rule
    except ImportError:  # another onnxscript
        pass
    else:

        def slice_from_zero_fails(node: ir.Node) -> bool:
            # The first collapse rule needs constant starts, ends, axes and steps, one each, starts 0 and steps 1.
            constants = [value.const_value if value is not None else None for value in node.inputs[1:5]]
            if len(constants) != 4 or any(constant is None for constant in constants):
                return True
            try:
                starts, steps = constants[0].numpy(), constants[3].numpy()  # type: ignore[union-attr]
            except Exception:  # left to the check
                return False
            return starts.size != 1 or steps.size != 1 or starts.item() != 0 or steps.item() != 1

        def slice_of_another_shape_fails(node: ir.Node) -> bool:
            # The second collapse rule needs the Slice's output of its input's (known) shape.
            data = node.inputs[0] if node.inputs else None
            return data is None or not _ir_utils.same_shape(data.shape, node.outputs[0].shape)

        checks[id(collapse_slice_rule)] = slice_from_zero_fails
        checks[id(collapse_slice2_rule)] = slice_of_another_shape_fails
    for rule_id, (constant_at, value) in _EXACT_NO_OP_CONSTANTS.items():
        checks[rule_id] = exact_no_op_fails(constant_at, value)
    return checks


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
