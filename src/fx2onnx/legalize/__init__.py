"""Target legalization: every node computes in types the target runs; eager's dtypes stay at the boundary.

- :mod:`~fx2onnx.legalize.targets`: targets (``onnxruntime-cpu``, ``onnx``) and how to add one.
- :mod:`~fx2onnx.legalize.tables`: the legal-types tables, generated from the installed runtime.
- :mod:`~fx2onnx.legalize.widening`: which wider types keep eager's results.
- :mod:`~fx2onnx.legalize.rewrite`: the pass, and the final check that the target runs every node.
- :mod:`~fx2onnx.legalize.fusion_guards`: keeps ONNX Runtime's graph optimizer from fusing patterns into kernels
  that compute something else (``docs/ort-defects.md``).
"""

from __future__ import annotations

import onnx_ir as ir

from fx2onnx.emit.graph_builder import CastRecord
from fx2onnx.errors import ExportError, source_line
from fx2onnx.legalize.fusion_guards import guard_fusions
from fx2onnx.legalize.rewrite import FX_NODE, Legalizer, Refusal
from fx2onnx.legalize.targets import (
    KernelTableTarget,
    SpecTarget,
    Target,
    available_targets,
    get_target,
    register_target,
    unregister_target,
)

TARGETS = ("onnxruntime-cpu", "onnx")


class LegalizationError(ExportError):
    """Some node has no kernel in the target in any type the legalizer may compute it in."""


def legalize_model(model: ir.Model, target: str | Target, *, fast_math: bool = False) -> list[CastRecord]:
    """Rewrite nodes whose types the target has no kernel for; returns the Casts inserted.

    Raises :class:`LegalizationError` naming each node that cannot be legalized, so no model that
    will not load is ever written.
    """
    resolved = get_target(target) if isinstance(target, str) else target
    legalizer = Legalizer(model, resolved, fast_math=fast_math)
    records = legalizer.run()
    if legalizer.refusals:
        raise _error(legalizer.refusals, resolved)
    # Every target: a model exported for the spec is run in ONNX Runtime too, and the guards are plain ONNX.
    guard_fusions(model)
    return records


def _error(refusals: list[Refusal], target: Target) -> LegalizationError:
    lines = [f"{len(refusals)} node(s) cannot run on target {target.name!r} ({target.describe()}) in any type:"]
    first = refusals[0].node.metadata_props
    for refusal in refusals[:20]:
        node = refusal.node
        props = node.metadata_props
        bound = ", ".join(f"{k}={v}" for k, v in sorted(refusal.binding.items())) or "no types"
        lines.append(f"  - ONNX node `{node.name}` ({node.op_type}, {bound}) from FX node `{props.get(FX_NODE, '?')}`")
        if props.get("pkg.fx2onnx.target"):
            lines.append(f"    overload: {props['pkg.fx2onnx.target']}")
        where = source_line(props.get("pkg.fx2onnx.stack_trace"))
        if where:
            lines.append(f"    from: {where}")
        lines.append(f"    why: {refusal.reason}")
        if refusal.tried:
            lines.append(f"    also refused: {'; '.join(refusal.tried[:6])}")
        else:
            lines.append("    no wider type computes this op with eager's results (see fx2onnx.legalize.widening)")
    if len(refusals) > 20:
        lines.append(f"  ... and {len(refusals) - 20} more")
    lines.append(
        "  remedy: cast the tensors to a type the target runs before these lines (e.g. `x.float()`), export for "
        "target='onnx' if the model will not run in ONNX Runtime, or register an implementation of the overload "
        "that emits ops the target runs (fx2onnx.register)."
    )
    return LegalizationError(
        "\n".join(lines),
        node=first.get(FX_NODE),
        target=first.get("pkg.fx2onnx.target"),
        stack_trace=first.get("pkg.fx2onnx.stack_trace"),
    )


__all__ = [
    "TARGETS",
    "KernelTableTarget",
    "LegalizationError",
    "Legalizer",
    "Refusal",
    "SpecTarget",
    "Target",
    "available_targets",
    "get_target",
    "legalize_model",
    "register_target",
    "unregister_target",
]
