"""FX passes run after capture and before dispatch (type promotion lives here)."""

from __future__ import annotations

from fx2onnx.capture import CapturedGraph
from fx2onnx.passes.promotion import promote_types
from fx2onnx.passes.subgraphs import all_nodes, graph_modules


def run_fx_passes(captured: CapturedGraph) -> list[str]:
    """Run the FX passes in order; returns the names of the passes that changed the graph."""
    changed = []
    constants = {node: tensor for node, (_, tensor) in captured.weights.items()}
    promoted = promote_types(captured.graph_module, constants)
    for path, body in graph_modules(captured.graph_module):
        if path:  # a control-flow body (torch.cond branch, loop body): its nodes are dispatched too
            promoted = promote_types(body) or promoted
    if promoted:
        changed.append("promote_types")
    return changed


__all__ = ["all_nodes", "graph_modules", "run_fx_passes"]
