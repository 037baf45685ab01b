"""FX passes run after capture, before dispatch: complex ops on their parts, float16/bfloat16 ops eager computes
in float32, then type promotion."""

from __future__ import annotations

from fx2onnx.capture import CapturedGraph
from fx2onnx.passes.complex_parts import Registry, rewrite_complex_on_parts
from fx2onnx.passes.float32_opmath import compute_in_float32
from fx2onnx.passes.promotion import promote_types
from fx2onnx.passes.subgraphs import all_nodes, graph_modules


def run_fx_passes(captured: CapturedGraph, registry: Registry | None = None) -> list[str]:
    """Run the FX passes in order; returns the names of the passes that changed the graph. Ops that `registry`
    lowers with complex inputs are left to it rather than rewritten on their parts."""
    changed = []
    constants = {node: tensor for node, (_, tensor) in captured.weights.items()}
    for name, rewrite in (
        ("rewrite_complex_on_parts", lambda module: rewrite_complex_on_parts(module, registry)),
        ("compute_in_float32", lambda module: compute_in_float32(module, constants)),
    ):
        replaced = {}
        for _, module in graph_modules(captured.graph_module):
            replaced.update(rewrite(module))
        if replaced:  # the capture lists its outputs by node
            captured.user_outputs = [replaced.get(output, output) for output in captured.user_outputs]
            changed.append(name)
    promoted = promote_types(captured.graph_module, constants)
    for path, body in graph_modules(captured.graph_module):
        if path:  # a control-flow body (torch.cond branch, loop body): its nodes are dispatched too
            promoted = promote_types(body) or promoted
    if promoted:
        changed.append("promote_types")
    return changed


__all__ = ["all_nodes", "graph_modules", "run_fx_passes"]
