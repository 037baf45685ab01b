"""Adding nodes to an FX graph in a pass: each with its fake value and the source location of the node it replaces."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

# What a new node inherits from the node it stands for, so that reports and errors still name the user's line.
_KEPT_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node")


def fake_mode_of(graph: torch.fx.Graph) -> Any:
    """The fake mode of `graph`'s values (None if it has none), under which factories make fake tensors too."""
    return first_fake_mode(n.meta.get("val") for n in graph.nodes)


def first_fake_mode(values: Iterable[Any]) -> Any:
    """``torch._guards.detect_fake_mode(values)``, asked of one value at a time until one answers: the mode of the
    first value that has one (the values of one graph share theirs), without walking a graph's thousand values."""
    for value in values:
        if value is None:
            continue
        mode = torch._guards.detect_fake_mode([value])
        if mode is not None:
            return mode
    return torch._guards.detect_fake_mode()  # none among the values: an active mode, if any


class NodeBuilder:
    """Adds nodes before `origin` (the node being rewritten); `fake_mode`: :func:`fake_mode_of` the graph, found
    once per pass."""

    def __init__(self, graph: torch.fx.Graph, origin: torch.fx.Node, fake_mode: Any) -> None:
        self.graph, self.origin, self.fake_mode = graph, origin, fake_mode

    def call(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        """A node computing ``target(*args, **kwargs)``."""
        with self.graph.inserting_before(self.origin):
            new = self.graph.call_function(target, args, kwargs)
        fake_args, fake_kwargs = pytree.tree_map_only(torch.fx.Node, lambda n: n.meta["val"], (args, kwargs))
        with self.fake_mode or contextlib.nullcontext():
            new.meta["val"] = target(*fake_args, **fake_kwargs)
        new.meta.update({name: self.origin.meta[name] for name in _KEPT_META if name in self.origin.meta})
        return new


def replace_node(node: torch.fx.Node, replacement: torch.fx.Node) -> None:
    """Point `node`'s users at `replacement` and remove `node`."""
    node.replace_all_uses_with(replacement)
    node.graph.erase_node(node)
