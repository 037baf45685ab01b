"""fx2onnx: export PyTorch models to ONNX through the FX graph, dtype-correct for the target runtime."""

from __future__ import annotations

from fx2onnx._export import export
from fx2onnx._finalize import max_opset
from fx2onnx._registry import Implementation, Registry, is_registered, overloads, register, unregister
from fx2onnx._verification import OutputVerification
from fx2onnx._version import __version__
from fx2onnx.errors import (
    CaptureError,
    ExportError,
    InvalidModelError,
    LegalizationError,
    LoweringError,
    UnsupportedOperatorError,
    VerificationError,
)
from fx2onnx.program import ONNXProgram

__all__ = [
    "CaptureError",
    "ExportError",
    "Implementation",
    "InvalidModelError",
    "LegalizationError",
    "LoweringError",
    "ONNXProgram",
    "OutputVerification",
    "Registry",
    "UnsupportedOperatorError",
    "VerificationError",
    "__version__",
    "export",
    "is_registered",
    "max_opset",
    "overloads",
    "register",
    "unregister",
]
