"""The bodies of control-flow ops (``torch.cond`` branches, loop bodies): sub-GraphModules of the captured one."""

from __future__ import annotations

from collections.abc import Iterator

import torch.fx


def graph_modules(root: torch.fx.GraphModule) -> Iterator[tuple[str, torch.fx.GraphModule]]:
    """``("", root)`` and every GraphModule nested in it, by attribute path (``true_graph_0.false_graph_0``)."""
    for path, module in root.named_modules():
        if isinstance(module, torch.fx.GraphModule):
            yield path, module


def all_nodes(root: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes of the root graph and of every body in it."""
    return {node for _, module in graph_modules(root) for node in module.graph.nodes}
