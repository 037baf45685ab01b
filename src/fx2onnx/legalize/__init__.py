"""Target legalization: make every node's input types legal for the target runtime.

Stub until the legalization issue lands: `legalize_model` records nothing and changes nothing.
"""

from __future__ import annotations

import onnx_ir as ir

TARGETS = ("onnxruntime-cpu", "onnx")


def legalize_model(model: ir.Model, target: str, *, fast_math: bool = False) -> list:
    """Rewrite nodes whose types the target has no kernel for; returns the Casts inserted."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; choose from {TARGETS}")
    return []
