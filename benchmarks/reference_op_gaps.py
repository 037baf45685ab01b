"""Which operators torch.onnx's dynamo exporter lowers that fx2onnx does not: writes docs/reference-op-gaps.md.

Every overload in torch.onnx's registry (torch 2.13's ``torch.onnx._internal.exporter._registration``, at the
newest opset, so that ops only newer opsets lower are included) is looked up in fx2onnx's registry the way
fx2onnx's dispatcher binds a node: by the ATen schema's argument names, so an implementation whose required
parameters the schema does not give (torchlib's ``repeat_interleave.Tensor`` takes ``self`` where ATen gives
``repeats``) does not count. An overload fx2onnx has no binding implementation for is still handled when its
control-flow emitter takes it (``torch.cond``...) or when torch's decomposition table rewrites it at capture.
What remains is listed with the reason. Only this script (never the package) imports torch.onnx._internal.

    PYTHONPATH=src python benchmarks/reference_op_gaps.py [--check]

``--check`` fails (exit 1) when the doc is out of date or an overload is a gap without a reason.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import warnings
from typing import Any

import torch

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "reference-op-gaps.md"

# Why fx2onnx does not lower an overload torch.onnx lowers (every gap needs one).
REASONS: dict[str, str] = {
    "higher_order::invoke_subgraph": (
        "appears only when torch.export is asked to keep nested compiled regions (`torch.compiler.nested_compile_"
        "region`); fx2onnx captures without them, so the region is inlined and its ops lowered one by one"
    ),
    "onnx_symbolic::_symbolic": (
        "`torch.onnx.ops.symbolic(...)`: a model that writes ONNX nodes itself, for torch.onnx; not supported "
        "yet (register an implementation of the custom op with fx2onnx.register instead)"
    ),
    "onnx_symbolic::_symbolic_multi_out": "`torch.onnx.ops.symbolic_multi_out(...)`: as `_symbolic`",
    "torch::sym_sum": (
        "a sum of symbolic sizes that torch.export leaves only in graphs with many dynamic dims added together; "
        "not lowered yet"
    ),
    "_operator::lshift": "`<<` on symbolic sizes: not lowered yet (tensors' `<<` is aten::bitwise_left_shift)",
    "_operator::rshift": "`>>` on symbolic sizes: not lowered yet (tensors' `>>` is aten::bitwise_right_shift)",
}


def reference_overloads() -> dict[str, tuple[Any, bool, bool]]:
    """torch.onnx's registry: qualified name -> (target, has a real implementation, has a complex one)."""
    from torch.onnx._internal.exporter import _registration

    from fx2onnx import max_opset
    from fx2onnx._registry import qualified_name

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        registry = _registration.ONNXRegistry.from_torchlib(opset_version=max_opset())
    table = {}
    for target, metas in registry.functions.items():
        name = target if isinstance(target, str) else qualified_name(target)
        table[name] = (target, any(not m.is_complex for m in metas), any(m.is_complex for m in metas))
    return table


def binds(implementation: Any, target: Any) -> bool:
    """Whether fx2onnx's dispatcher can bind a node of `target` to `implementation` (by argument names)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return True  # a Python function on sizes: called with its arguments as they are
    given = {argument.name for argument in schema.arguments}
    for param in implementation.signature.params:
        required = param.required and not param.has_default() and not getattr(param, "variadic", False)
        if required and param.name not in given:
            return False
    return True


def classify() -> dict[str, list[str]]:
    from torch._decomp import decomposition_table

    from fx2onnx._capture import CONTROL_FLOW_OPERATORS
    from fx2onnx._passes import complex_parts
    from fx2onnx._registry import Registry, qualified_name

    ours = Registry.default()
    control_flow = {qualified_name(op) for op in CONTROL_FLOW_OPERATORS}
    # What capture decomposes: torch.export's default table (CompositeImplicitAutograd ops such as rms_norm
    # included) and, for what the registry lacks, torch's full table (fx2onnx/capture.py).
    tables = [*decomposition_table, *torch.export.default_decompositions()]
    decomposed = {qualified_name(op) for op in tables if isinstance(op, torch._ops.OpOverload)}
    groups: dict[str, list[str]] = {"lowered": [], "control flow": [], "decomposed at capture": [], "gap": []}
    for name, (target, real, complex_) in sorted(reference_overloads().items()):
        for kind, wanted in (("", real), (" (complex)", complex_)):
            if not wanted:
                continue
            complex_inputs = bool(kind)
            implementations = [i for i in ours.overloads(name) if i.complex == complex_inputs]
            if complex_inputs and not implementations and complex_parts.rewrites(target):
                implementations = [i for i in ours.overloads(name) if not i.complex]  # rewritten on the parts
            if any(binds(i, target) for i in implementations):
                groups["lowered"].append(name + kind)
            elif name in control_flow:
                groups["control flow"].append(name + kind)
            elif name in decomposed:
                groups["decomposed at capture"].append(name + kind)
            else:
                groups["gap"].append(name + kind)
    return groups


def render(groups: dict[str, list[str]]) -> str:
    total = sum(len(names) for names in groups.values())
    lines = [
        "# Operators torch.onnx lowers and fx2onnx does not",
        "",
        "Generated by `benchmarks/reference_op_gaps.py` (torch " + torch.__version__.split("+")[0] + "): every "
        "overload in torch.onnx's dynamo exporter registry, looked up in fx2onnx's registry by the ATen schema's "
        "argument names, as fx2onnx's dispatcher binds nodes.",
        "",
        "| how fx2onnx handles it | overloads |",
        "|---|---|",
        *(f"| {group} | {len(names)} |" for group, names in groups.items()),
        f"| total | {total} |",
        "",
        "## Not handled, with the reason",
        "",
    ]
    for name in groups["gap"]:
        lines.append(f"- `{name}`: {REASONS.get(name.removesuffix(' (complex)'), 'NO REASON GIVEN')}")
    lines += ["", "## Handled by fx2onnx's control-flow emitter", ""]
    lines += [f"- `{name}`" for name in groups["control flow"]]
    lines += ["", "## Decomposed at capture by torch's table, then lowered", ""]
    lines += [f"- `{name}`" for name in groups["decomposed at capture"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the doc is stale or a gap has no reason")
    options = parser.parse_args()
    groups = classify()
    text = render(groups)
    unexplained = [name for name in groups["gap"] if name.removesuffix(" (complex)") not in REASONS]
    if options.check:
        stale = not DOC.exists() or DOC.read_text(encoding="utf-8") != text
        if stale or unexplained:
            print(f"stale: {stale}; gaps without a reason: {unexplained}", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC}: " + ", ".join(f"{len(v)} {k}" for k, v in groups.items()))
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
