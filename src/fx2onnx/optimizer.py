"""Graph optimization: onnxscript's optimizer (constant folding, then its default rewrite rules).

The passes and rules are onnxscript's ``optimize_ir``, in the same order, with one difference in
cost and none in result: the ``SlicesSplit`` rule (two Slices of one value -> one Split) matches a
two-node pattern by enumerating every node of the graph for every node it visits, which makes it
quadratic in the graph's size (two thirds of the optimizer's time on a GPT-2-small). It can only
match two Slice nodes, and no rule or fold creates a Slice, so a rewrite pass over a graph with
fewer than two Slices leaves it out.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxscript.optimizer
import onnxscript.rewriter
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules.common import slice_split_rule


def optimize(model: ir.Model, num_iterations: int = 2) -> None:
    """What ``onnxscript.optimizer.optimize_ir(model)`` does, without the quadratic rule where it cannot match."""
    rules: Sequence[pattern.RewriteRule] | None = getattr(onnxscript.rewriter, "_DEFAULT_REWRITE_RULES", None)
    if not rules or slice_split_rule not in rules:  # another onnxscript: use its optimizer as it is
        onnxscript.optimizer.optimize_ir(model)
        return
    passes = ir.passes.Sequential(
        common_passes.InlinePass(),
        ir.passes.PassManager(
            [
                _FoldConstants(),
                _Rewrite(rules),
                common_passes.RemoveUnusedNodesPass(),
                common_passes.RemoveUnusedFunctionsPass(),
                common_passes.RemoveUnusedOpsetsPass(),
            ],
            steps=num_iterations,
            early_stop=True,
        ),
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
        common_passes.OutputFixPass(),
        common_passes.NameFixPass(),
    )
    passes(model)


class _FoldConstants(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        result = onnxscript.optimizer.fold_constants_ir(model, onnx_shape_inference=True)
        return ir.passes.PassResult(model, result.modified)


class _Rewrite(ir.passes.InPlacePass):
    """onnxscript's rewrite pass with its default rules; ``SlicesSplit`` only where two Slices exist."""

    def __init__(self, rules: Sequence[pattern.RewriteRule]) -> None:
        super().__init__()
        self.all_rules = onnxscript.rewriter.RewritePass(list(rules))
        self.without_slice_split = onnxscript.rewriter.RewritePass([r for r in rules if r is not slice_split_rule])

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        slices = 0
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            if node.op_type == "Slice" and node.domain in ("", "ai.onnx"):
                slices += 1
                if slices >= 2:
                    return self.all_rules(model)
        for function in model.functions.values():
            slices += sum(1 for node in function if node.op_type == "Slice")
        return (self.all_rules if slices >= 2 else self.without_slice_split)(model)


__all__ = ["optimize"]
