"""FX passes run after capture and before dispatch (type promotion lives here)."""

from __future__ import annotations

from fx2onnx.capture import CapturedGraph


def run_fx_passes(captured: CapturedGraph) -> list[str]:
    """Run the FX passes in order; returns the names of the passes that changed the graph."""
    return []
