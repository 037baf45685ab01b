"""fx2onnx: export PyTorch models to ONNX through the FX graph, dtype-correct for the target runtime.

The public names are imported on first use, so that ``fx2onnx --help`` and ``--version`` answer without
importing torch (seconds).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from fx2onnx.errors import (
        CaptureError,
        ExportError,
        InvalidModelError,
        LoweringError,
        UnsupportedOperatorError,
        VerificationError,
    )
    from fx2onnx.export import export, max_opset
    from fx2onnx.legalize import LegalizationError
    from fx2onnx.program import ONNXProgram, OutputVerification
    from fx2onnx.registry import Implementation, Registry, is_registered, overloads, register, unregister

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
    "export": "fx2onnx.export",
    "max_opset": "fx2onnx.export",
    "LegalizationError": "fx2onnx.legalize",
    "ONNXProgram": "fx2onnx.program",
    "OutputVerification": "fx2onnx.program",
    **dict.fromkeys(
        ("Implementation", "Registry", "is_registered", "overloads", "register", "unregister"), "fx2onnx.registry"
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


class _Package(types.ModuleType):
    """``fx2onnx.export`` is the function even after the submodule of that name is imported.

    Importing a submodule binds it as an attribute of its package; a data descriptor on the package's
    class takes precedence over that binding (the module itself stays in ``sys.modules``).
    """

    @property
    def export(self) -> Any:
        return importlib.import_module("fx2onnx.export").export

    @export.setter
    def export(self, value: Any) -> None:
        if not isinstance(value, types.ModuleType):
            raise AttributeError("fx2onnx.export cannot be replaced")


sys.modules[__name__].__class__ = _Package
