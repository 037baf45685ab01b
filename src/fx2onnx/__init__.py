"""fx2onnx: export PyTorch models to ONNX through the FX graph, dtype-correct for the target runtime."""

from __future__ import annotations

from fx2onnx.errors import (
    CaptureError,
    ExportError,
    InvalidModelError,
    LegalizationError,
    LoweringError,
    UnsupportedOperatorError,
    VerificationError,
)
from fx2onnx.export import export
from fx2onnx.finalize import max_opset
from fx2onnx.program import ONNXProgram
from fx2onnx.registry import Implementation, Registry, is_registered, overloads, register, unregister
from fx2onnx.verification import OutputVerification
from fx2onnx.version import __version__

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
