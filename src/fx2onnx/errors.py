"""Errors fx2onnx raises, each naming what failed, where in the user's code, and what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.fx

if TYPE_CHECKING:
    from fx2onnx.dispatch import DispatchDecision


class ExportError(RuntimeError):
    """Base class of fx2onnx's export failures."""


class CaptureError(ExportError):
    """torch.export (or another extractor) could not capture the model."""


class UnsupportedOperatorError(ExportError):
    """No registered implementation can lower a node."""

    def __init__(self, decision: DispatchDecision, where: str | None) -> None:
        self.decision = decision
        self.where = where
        target = decision.target
        lines = [f"Unsupported operator {target} at node `{decision.node}`."]
        if where:
            lines.append(f"  from: {where}")
        lines.append("  input dtypes: " + (", ".join(f"{k}={v}" for k, v in decision.input_dtypes.items()) or "(none)"))
        if decision.candidates:
            lines.append("  candidates:")
            for candidate in decision.candidates:
                lines.append(f"    - {candidate.implementation.name}: {candidate.reason}")
        else:
            lines.append("  candidates: none registered for this overload")
        lines.append(
            "  remedy: register an implementation, e.g.\n"
            f"      fx2onnx.register('{target}', my_onnxscript_function)\n"
            f"    or pass custom_translation_table={{{_python_target(target)}: my_onnxscript_function}} to "
            "fx2onnx.export; the function takes the ATen arguments by name and calls ONNX ops via "
            "onnxscript (`from onnxscript import opset18 as op`)."
        )
        super().__init__("\n".join(lines))


class LoweringError(ExportError):
    """An implementation was chosen but failed while emitting ONNX."""


class InvalidModelError(ExportError):
    """The emitted model fails the ONNX checker."""


class VerificationError(AssertionError):
    """ONNX Runtime's results differ from eager."""


def _python_target(target: str) -> str:
    namespace, _, rest = target.partition("::")
    name, _, overload = rest.partition(".")
    return f"torch.ops.{namespace}.{name}.{overload or 'default'}"


def source_line(node: torch.fx.Node) -> str | None:
    """The innermost user frame of the node's stack trace, e.g. ``model.py:12 in forward: y = x + 1``."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    lines = [line for line in trace.strip().splitlines() if line.strip()]
    # Frames look like: `  File "x.py", line 12, in forward` followed by the code line.
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index].strip()
        if line.startswith("File "):
            code = lines[index + 1].strip() if index + 1 < len(lines) else ""
            try:
                path_part, line_part, func_part = line.split(", ", 2)
                path = path_part[len('File "') : -1]
                number = line_part.removeprefix("line ")
                func = func_part.removeprefix("in ")
                return f"{path}:{number} in {func}: {code}"
            except ValueError:
                return f"{line} {code}".strip()
    return lines[-1]


def describe_value(value: Any) -> str:
    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            return f"{value.name}: {val.dtype} {tuple(val.shape)}"
        return f"{value.name}: {val!r}"
    return repr(value)
