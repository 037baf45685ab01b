"""Every error fx2onnx raises to its users, each naming what failed, where in the user's code, and what to do.

A leaf of the package: stages import their errors from here; ``fx2onnx`` re-exports them."""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch.fx


@dataclasses.dataclass(frozen=True)
class SourceFrame:
    """One frame of the user's code: where a node (or a failure) came from."""

    path: str
    line: int
    function: str
    code: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line} in {self.function}"
        return f"{where}: {self.code}" if self.code else where


class ExportError(RuntimeError):
    """Base class of fx2onnx's export failures.

    `node` (the FX node), `target` (the op overload) and `frame` (the user's source line) say where
    it failed when known; the export report points at them.
    """

    def __init__(
        self,
        message: str = "",
        *,
        node: str | None = None,
        target: str | None = None,
        stack_trace: str | None = None,
        frame: SourceFrame | None = None,
    ) -> None:
        super().__init__(message)
        self.node = node
        self.target = target
        self.stack_trace = stack_trace
        self.frame = frame if frame is not None else source_frame(stack_trace)


class CaptureError(ExportError):
    """torch.export (or another extractor) could not capture the model."""


class _Candidate(Protocol):
    implementation: Any  # its ``name`` is shown
    reason: str


class DispatchOutcome(Protocol):
    """What :class:`UnsupportedOperatorError` reads of a dispatch decision (``fx2onnx._dispatch.DispatchDecision``)."""

    node: str
    target: str
    input_dtypes: Mapping[str, Any]
    candidates: Sequence[_Candidate]
    stack_trace: str | None


# Ops fx2onnx knows it cannot lower yet, and why (an export error says so).
_NOT_LOWERED_YET: dict[str, str] = {}


class UnsupportedOperatorError(ExportError):
    """No registered implementation can lower a node."""

    def __init__(self, decision: DispatchOutcome, where: str | None, node: torch.fx.Node | None = None) -> None:
        self.decision = decision
        self.where = where
        target = decision.target
        lines = [f"Unsupported operator {target} at node `{decision.node}`."]
        if where:
            lines.append(f"  from: {where}")
        lines.append("  input dtypes: " + (", ".join(f"{k}={v}" for k, v in decision.input_dtypes.items()) or "(none)"))
        if node is not None and node.all_input_nodes:
            lines.append("  inputs: " + "; ".join(describe_value(n) for n in node.all_input_nodes))
        if decision.candidates:
            lines.append("  candidates:")
            for candidate in decision.candidates:
                lines.append(f"    - {candidate.implementation.name}: {candidate.reason}")
            lines.append(
                "  remedy: no candidate accepts these inputs: cast them in the model before this line (e.g. "
                "`x.float()`), or register an implementation that accepts them (tried before the defaults), e.g."
            )
        else:
            lines.append("  candidates: none registered for this overload")
            if _short_name(target) in _NOT_LOWERED_YET:
                lines.append(f"  why: {_NOT_LOWERED_YET[_short_name(target)]}")
            lines.append("  remedy: register an implementation (tried before the defaults), e.g.")
        name = f"my_{_short_name(target)}"
        parameters = _parameter_names(node)
        first = parameters.split(", ")[0] if parameters and not parameters.startswith("*") else "..."
        lines.append(
            "      from onnxscript import opset18 as op\n"
            f"      def {name}({parameters}):  # the ATen arguments, by name\n"
            f"          return op.Identity({first})  # the ONNX ops that compute {target}\n"
            f"      fx2onnx.export(..., custom_translation_table={{{_python_target(target)}: {name}}})\n"
            f"    or, process-wide: fx2onnx.register('{target}', {name})"
        )
        super().__init__("\n".join(lines), node=decision.node, target=target, stack_trace=decision.stack_trace)


class LoweringError(ExportError):
    """An implementation was chosen but failed while emitting ONNX."""


class InvalidModelError(ExportError):
    """The emitted model fails the ONNX checker."""


class LegalizationError(ExportError):
    """Some node has no kernel in the target in any type the legalizer may compute it in."""


class VerificationError(AssertionError):
    """ONNX Runtime's results differ from eager."""


def _python_target(target: str) -> str:
    namespace, _, rest = target.partition("::")
    name, _, overload = rest.partition(".")
    if namespace == "higher_order":  # higher-order operators have no overloads
        return f"torch.ops.higher_order.{name}"
    return f"torch.ops.{namespace}.{name}.{overload or 'default'}"


def _short_name(target: str) -> str:
    return re.sub(r"\W", "_", target.partition("::")[2].partition(".")[0] or target)


def _parameter_names(node: torch.fx.Node | None) -> str:
    schema = getattr(getattr(node, "target", None), "_schema", None)
    if schema is None:
        return "*args"
    return ", ".join(a.name for a in schema.arguments if a.name not in ("out", "memory_format", "layout", "device"))


# `  File "x.py", line 12, in forward` followed by the code line (torch's node stack traces and
# Python tracebacks alike).
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<function>.+?)\s*$')


def source_frame(trace: str | None) -> SourceFrame | None:
    """The innermost frame of a stack trace text (a node's ``meta["stack_trace"]``).

    Frames of generated code (``<eval_with_key>.5``: the graphs torch.cond's branches are traced from) are
    skipped when the trace has a frame of a real file.
    """
    if not trace:
        return None
    lines = [line for line in trace.strip().splitlines() if line.strip()]
    generated = None
    for index in range(len(lines) - 1, -1, -1):
        match = _FRAME.match(lines[index])
        if match:
            following = lines[index + 1].strip() if index + 1 < len(lines) else ""
            code = "" if _FRAME.match(following) else following
            frame = SourceFrame(match["path"], int(match["line"]), match["function"], code)
            if not frame.path.startswith("<"):
                return frame
            generated = generated or frame
    return generated


def source_line(node_or_trace: torch.fx.Node | str | None) -> str | None:
    """The innermost user frame of a node's stack trace, e.g. ``model.py:12 in forward: y = x + 1``."""
    if isinstance(node_or_trace, torch.fx.Node):
        trace = node_or_trace.meta.get("stack_trace")
    else:
        trace = node_or_trace
    if not trace:
        return None
    frame = source_frame(trace)
    if frame is not None:
        return str(frame)
    return trace.strip().splitlines()[-1].strip()


# torch, the standard library and fx2onnx itself.
_LIBRARY_DIRS = tuple(os.path.dirname(os.path.abspath(path)) + os.sep for path in (torch.__file__, traceback.__file__))
_LIBRARY_DIRS += (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
# Installed packages that run the export rather than define the model. Other installed packages
# (transformers, timm, diffusers...) hold model code: a line there is where the model did what failed.
_EXPORT_STACK_PACKAGES = ("torch", "functorch", "onnx", "onnx_ir", "onnxscript", "onnxruntime", "numpy", "sympy")


def is_user_file(path: str) -> bool:
    """Whether a frame's file is the model's code (the user's, or a model library's) rather than the exporter's."""
    if path.startswith("<"):  # <string>, <frozen ...>: no file to show
        return False
    path = os.path.abspath(path)
    if path.startswith(_LIBRARY_DIRS):
        return False
    for marker in (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}"):
        if marker in path:
            package = path.split(marker, 1)[1].split(os.sep, 1)[0]
            return package.removesuffix(".py") not in _EXPORT_STACK_PACKAGES
    return True


def user_frame(error: BaseException) -> SourceFrame | None:
    """The innermost frame of the user's code in an exception chain (for failures outside any node).

    torch.export's strict mode prints the user's frames in the message ("from user code: File ...");
    non-strict mode runs the user's code, so its frames are in the traceback.
    """
    seen: set[int] = set()
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    for item in chain:
        frames = [
            SourceFrame(m["path"], int(m["line"]), m["function"], linecache.getline(m["path"], int(m["line"])).strip())
            for m in (_FRAME.match(line) for line in str(item).splitlines())
            if m and is_user_file(m["path"])
        ]
        if frames:
            return frames[-1]
    for item in reversed(chain):
        frames = [f for f in traceback.extract_tb(item.__traceback__) if is_user_file(f.filename)]
        if frames:
            last = frames[-1]
            return SourceFrame(last.filename, last.lineno or 0, last.name, (last.line or "").strip())
    return None


def describe_value(value: Any) -> str:
    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            return f"{value.name}: {val.dtype} {tuple(val.shape)}"
        return f"{value.name}: {val!r}"
    return repr(value)
