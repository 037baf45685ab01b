"""FX passes run after capture, before dispatch: complex ops on their parts, float16/bfloat16 ops eager computes
in float32, then type promotion. Each pass follows one contract (:mod:`fx2onnx._passes.base`)."""

from __future__ import annotations

from fx2onnx._capture import CapturedGraph
from fx2onnx._passes.base import FxPass, PassResult, run_passes
from fx2onnx._passes.complex_parts import ComplexOnParts, Registry
from fx2onnx._passes.float32_opmath import ComputeInFloat32
from fx2onnx._passes.promotion import PromoteTypes
from fx2onnx._passes.subgraphs import all_nodes, graph_modules


def fx_passes(captured: CapturedGraph, registry: Registry | None = None) -> list[FxPass]:
    """The passes, in order. Ops that `registry` lowers with complex inputs are left to it rather than rewritten on
    their parts."""
    constants = {node: tensor for node, (_, tensor) in captured.weights.items()}
    return [ComplexOnParts(registry), ComputeInFloat32(constants), PromoteTypes(constants)]


def run_fx_passes(captured: CapturedGraph, registry: Registry | None = None) -> list[str]:
    """Run the FX passes in order; returns the names of the passes that changed the graph."""
    return run_passes(captured, fx_passes(captured, registry))


__all__ = ["FxPass", "PassResult", "all_nodes", "fx_passes", "graph_modules", "run_fx_passes", "run_passes"]
