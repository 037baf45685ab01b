"""The contract of an FX pass: one GraphModule in, a :class:`PassResult` out (as ``onnx_ir.passes.PassResult``).

A pass is a callable with a ``name``; :func:`run_passes` applies each in order to the captured graph and to
every control-flow body in it, and keeps the capture's list of outputs pointing at the nodes that replace them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch.fx

from fx2onnx._capture import CapturedGraph
from fx2onnx._passes.subgraphs import graph_modules


@dataclasses.dataclass(frozen=True)
class PassResult:
    """What a pass did to one GraphModule: whether it changed it, and the nodes it replaced (node -> replacement;
    their users already use the replacement)."""

    modified: bool
    replaced: Mapping[torch.fx.Node, torch.fx.Node] = dataclasses.field(default_factory=dict)


class FxPass(Protocol):
    name: str  # as the report lists the passes that changed the graph

    def __call__(self, graph_module: torch.fx.GraphModule) -> PassResult: ...


def run_passes(captured: CapturedGraph, passes: Sequence[FxPass]) -> list[str]:
    """Run `passes` in order on the captured graph and its bodies; returns the names of those that changed it."""
    changed = []
    for fx_pass in passes:
        modified = False
        replaced: dict[torch.fx.Node, torch.fx.Node] = {}
        for _, module in graph_modules(captured.graph_module):
            result = fx_pass(module)
            modified |= result.modified
            replaced.update(result.replaced)
        if replaced:  # the capture lists its outputs by node
            captured.user_outputs = [replaced.get(output, output) for output in captured.user_outputs]
        if modified:
            changed.append(fx_pass.name)
    return changed
