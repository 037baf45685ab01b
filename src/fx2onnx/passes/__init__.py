"""FX passes run after capture and before dispatch (type promotion lives here)."""

from __future__ import annotations

from fx2onnx.capture import CapturedGraph
from fx2onnx.passes.promotion import promote_types


def run_fx_passes(captured: CapturedGraph) -> list[str]:
    """Run the FX passes in order; returns the names of the passes that changed the graph."""
    changed = []
    constants = {node: tensor for node, (_, tensor) in captured.weights.items()}
    if promote_types(captured.graph_module, constants):
        changed.append("promote_types")
    return changed
