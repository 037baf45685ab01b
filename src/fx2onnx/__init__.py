"""fx2onnx: export PyTorch models to ONNX through the FX graph, dtype-correct for the target runtime.

The public names are imported on first use, so that ``fx2onnx --help`` and ``--version`` answer without
importing torch (seconds).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fx2onnx._version import __version__

if TYPE_CHECKING:
    from fx2onnx._export import export
    from fx2onnx._finalize import max_opset
    from fx2onnx._registry import Implementation, Registry, is_registered, overloads, register, unregister
    from fx2onnx._verification import OutputVerification
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

# Public name -> the module that defines it.
_PUBLIC: dict[str, str] = {
    **dict.fromkeys(
        (
            "CaptureError",
            "ExportError",
            "InvalidModelError",
            "LoweringError",
            "UnsupportedOperatorError",
            "VerificationError",
        ),
        "fx2onnx.errors",
    ),
    "export": "fx2onnx._export",  # a private module: `fx2onnx.export` stays the function
    "max_opset": "fx2onnx._finalize",
    "LegalizationError": "fx2onnx.errors",
    "ONNXProgram": "fx2onnx.program",
    "OutputVerification": "fx2onnx._verification",
    **dict.fromkeys(
        ("Implementation", "Registry", "is_registered", "overloads", "register", "unregister"), "fx2onnx._registry"
    ),
}

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


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'fx2onnx' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
