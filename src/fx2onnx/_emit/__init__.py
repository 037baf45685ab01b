"""Emit stage: FX graph -> onnx_ir graph (graph_builder) through the op recorder (recorder)."""
