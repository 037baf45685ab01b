"""Local functionalization: capture's in-place writes become functional ops without retracing the program.

torch.export's graph keeps the model's in-place ops (``buckets += ...``, ``mask[h0:h1, w0:w1] = count``). Each
write into a tensor that provably owns its memory becomes its functional variant; a write through a chain of views
(``slice``, ``select``, ``view``, ``permute``...) of such a tensor becomes the functional op on the view, scattered
back into the base through the inverse of each view op (``slice_scatter``, ``select_scatter``, a ``reshape`` back to
the parent's sizes...), as torch's functionalization does. Every later read of the base, or of any view of it
(taken before or after the write), reads the updated value: the view is recomputed from the new base. Eager's
semantics are kept exactly: views alias each other, writes overlap, reads see every earlier write.

What cannot be proven safe is refused with the reason (:class:`NeedsFullDecomposition`, and capture decomposes the
whole program): writes into graph inputs, weights, constants or anything else that may share memory with a tensor
the graph does not own; writes into a tensor of which an op this module does not know (``expand``, ``as_strided``,
``split``'s list, a control-flow operator) took a view before the write; in-place ops that write other arguments
or cast their result.

The pass first walks the graph without changing it, so that a refusal leaves the captured graph as it was, then
walks it again rewriting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from fx2onnx._records import qualified_name
from fx2onnx._torch_ops import aten


class NeedsFullDecomposition(Exception):
    """The graph cannot be decomposed node by node; the message says why (the report gives it)."""


# In-place ops that change a tensor's autograd metadata only, never its values: dropped by local functionalization.
_METADATA_ONLY_IN_PLACE = frozenset({aten.detach_.default, aten.requires_grad_.default})
# In-place dropouts: with train=False (a model in eval mode, `nn.Dropout(inplace=True)` as torchvision's classifier
# heads have) they write nothing, so they are dropped whatever the tensor they name may share memory with.
_IN_PLACE_DROPOUTS = frozenset(
    {
        aten.dropout_.default,
        aten.feature_dropout_.default,
        aten.alpha_dropout_.default,
        aten.feature_alpha_dropout_.default,
    }
)

# Node metadata that says where a node came from: new nodes inherit it from the node they stand for, so errors, the
# report and the ONNX model's metadata point at the user's line.
PROVENANCE_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "custom")


def _same_sizes_view(parent: torch.fx.Node, view: torch.fx.Node) -> Callable[[Builder, torch.fx.Node], torch.fx.Node]:
    """A view that keeps the elements' row-major order (view, squeeze, unsqueeze): its inverse is a reshape back
    (not a view: the functional op's result may have other strides than the view had)."""
    del view

    def inverse(build: Builder, source: torch.fx.Node) -> torch.fx.Node:
        return build(aten.reshape.default, (source, build.sizes(parent)))

    return inverse


def _scatter(
    scatter: torch._ops.OpOverload,
) -> Callable[[torch.fx.Node, torch.fx.Node], Callable[[Builder, torch.fx.Node], torch.fx.Node]]:
    """slice -> slice_scatter(parent, source, dim, start, end, step), and select, diagonal alike."""

    def inverse_of(parent: torch.fx.Node, view: torch.fx.Node) -> Callable[[Builder, torch.fx.Node], torch.fx.Node]:
        def inverse(build: Builder, source: torch.fx.Node) -> torch.fx.Node:
            return build(scatter, (parent, source, *view.args[1:]), dict(view.kwargs))

        return inverse

    return inverse_of


def _permute_back(parent: torch.fx.Node, view: torch.fx.Node) -> Callable[[Builder, torch.fx.Node], torch.fx.Node]:
    rank = len(view.args[1])
    order = [int(d) % rank for d in view.args[1]]
    back = [order.index(d) for d in range(rank)]
    return lambda build, source: build(aten.permute.default, (source, back))


def _transpose_back(parent: torch.fx.Node, view: torch.fx.Node) -> Callable[[Builder, torch.fx.Node], torch.fx.Node]:
    return lambda build, source: build(view.target, (source, *view.args[1:]), dict(view.kwargs))


def _identity(parent: torch.fx.Node, view: torch.fx.Node) -> Callable[[Builder, torch.fx.Node], torch.fx.Node]:
    return lambda build, source: source


# View ops a write may go through, each with the inverse that puts a new value of the view back into its parent
# (given the parent's node and the view's node). Any other op that returns an alias is not followed: a write into
# what it aliases is refused.
_VIEW_INVERSES: dict[Any, Callable[[torch.fx.Node, torch.fx.Node], Callable[[Builder, torch.fx.Node], torch.fx.Node]]]
_VIEW_INVERSES = {
    aten.slice.Tensor: _scatter(aten.slice_scatter.default),
    aten.select.int: _scatter(aten.select_scatter.default),
    aten.diagonal.default: _scatter(aten.diagonal_scatter.default),
    aten.view.default: _same_sizes_view,
    aten.unsqueeze.default: _same_sizes_view,
    aten.squeeze.default: _same_sizes_view,
    aten.squeeze.dim: _same_sizes_view,
    aten.squeeze.dims: _same_sizes_view,
    aten.permute.default: _permute_back,
    aten.transpose.int: _transpose_back,
    aten.t.default: _transpose_back,
    aten.alias.default: _identity,
    aten.detach.default: _identity,
}


class Builder:
    """Inserts new nodes before a cursor node, each with its fake value and the provenance of the node it stands for."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        self.cursor: torch.fx.Node | None = None
        self.provenance: torch.fx.Node | None = None

    def __call__(
        self,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
        like: torch.fx.Node | None = None,
        value: Any = None,
    ) -> torch.fx.Node:
        """The node `target(*args, **kwargs)`; `value`, when given, is its fake value, already computed."""
        kwargs = kwargs or {}
        assert self.cursor is not None
        with self.graph.inserting_before(self.cursor):
            node = self.graph.call_function(target, args, kwargs)
        if value is None:
            values = pytree.tree_map_only(torch.fx.Node, lambda a: a.meta.get("val"), (args, kwargs))
            fake_mode = torch._guards.detect_fake_mode(pytree.tree_leaves(values))
            with fake_mode if fake_mode is not None else contextlib.nullcontext():
                value = target(*values[0], **values[1])
        node.meta["val"] = value
        source = like if like is not None else self.provenance
        if source is not None:
            node.meta.update({key: source.meta[key] for key in PROVENANCE_META if key in source.meta})
        return node

    def sizes(self, node: torch.fx.Node) -> list[Any]:
        """`node`'s sizes as a view's size argument: ints, and a sym_size node for each symbolic one."""
        sizes: list[Any] = []
        for dim, size in enumerate(node.meta["val"].shape):
            if isinstance(size, torch.SymInt) and size.node.maybe_as_int() is None:
                sizes.append(self(aten.sym_size.int, (node, dim)))
            else:
                sizes.append(int(size))
        return sizes


@dataclasses.dataclass
class _Root:
    """A tensor's memory and the node holding its value now."""

    node: torch.fx.Node
    refusal: str | None  # why writes into it are refused (None: it is the graph's own, no untracked alias)
    current: torch.fx.Node
    version: int = 0  # writes so far
    views: int = 0  # views taken of it (a write changing its shape in place is refused once there are any)


@dataclasses.dataclass
class _Alias:
    """A node's value as a view of a root: `parent` (None for the root's own values) through the node's op."""

    root: _Root
    parent: torch.fx.Node | None
    version: int  # the root's version this value was computed at


def _is_fresh(node: torch.fx.Node) -> bool:
    """Whether `node`'s value is a tensor of its own: computed by an op that returns no view of its inputs (or taken
    from such an op's tuple of results)."""
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    schema = node.target._schema
    return not schema.is_mutable and all(result.alias_info is None for result in schema.returns)


def _may_alias(node: torch.fx.Node) -> bool:
    """Whether `node` may return a view of one of its inputs (anything but an ATen op that says it does not)."""
    if node.op != "call_function":
        return False
    if _is_fresh(node):
        return False
    return not isinstance(node.target, torch._ops.OpOverload) or any(
        result.alias_info is not None for result in node.target._schema.returns
    )


def functional_variant(target: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten.add.Tensor`` for ``aten.add_.Tensor``: the same op returning a new tensor, the overload of the same
    argument types (the one of the same name first). The names do not always pair: ``pow_.Scalar`` is
    ``pow.Tensor_Scalar`` (``pow.Scalar`` takes a number as self: a view's ``pow_(2)`` failed to export), likewise
    ``float_power_.Scalar`` and ``ldexp_``."""
    name = target._schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    if packet is None:
        return None
    wanted = _argument_types(target._schema)
    names = [target._overloadname, *(o for o in packet.overloads() if o != target._overloadname)]
    for overload in (getattr(packet, o, None) for o in names):
        if overload is not None and _argument_types(overload._schema) == wanted:
            return overload
    return None


def _argument_types(schema: torch.FunctionSchema) -> list[tuple[str, bool]]:
    return [(str(argument.type), argument.kwarg_only) for argument in schema.arguments]


def _dropout_train(node: torch.fx.Node) -> object:
    """The `train` argument of an in-place dropout node (a bool, or a node where it is computed)."""
    return node.args[2] if len(node.args) > 2 else node.kwargs.get("train")


class _Functionalizer:
    """One walk over a graph in order; with `rewrite` False it only checks (and raises what the rewrite would)."""

    def __init__(
        self,
        graph: torch.fx.Graph,
        prefix: str,
        rewrite: bool,
        results: dict[torch.fx.Node, tuple[list[Any], torch.Tensor]] | None = None,
    ) -> None:
        self.graph = graph
        # each in-place node's functional result computed by the checking walk, with the fake values it was computed
        # on: the rewriting walk reuses it where the node reads the same values (a fake op costs ~1 ms)
        self.results: dict[torch.fx.Node, tuple[list[Any], torch.Tensor]] = {} if results is None else results
        self.prefix = prefix
        self.rewrite = rewrite
        self.aliases: dict[torch.fx.Node, _Alias] = {}
        self.materialized: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}
        self.build = Builder(graph)
        self.functionalized: list[tuple[str, str]] = []

    def run(self) -> None:
        for node in list(self.graph.nodes):
            self.build.cursor = node
            if self.rewrite and node.op in ("call_function", "output"):
                self._read_current_values(node)
            if node.op != "call_function":
                continue
            target = node.target
            if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
                self._functionalize(node, target)
            elif target in _VIEW_INVERSES and isinstance(node.args[0], torch.fx.Node):
                parent = node.args[0]
                root = self._alias(parent).root
                root.views += 1
                self.aliases[node] = _Alias(root, parent, root.version)
            elif _may_alias(node):
                self._untracked_view(node)

    def _alias(self, node: torch.fx.Node) -> _Alias:
        """`node`'s alias record; a node not yet seen is a root of its own."""
        alias = self.aliases.get(node)
        if alias is None:
            refusal = None if _is_fresh(node) else f"`{node.name}`, which may share its memory with another tensor"
            alias = self.aliases[node] = _Alias(_Root(node, refusal, node), None, 0)
        return alias

    def _untracked_view(self, node: torch.fx.Node) -> None:
        """An op that may return a view this module cannot follow: writes into what it reads are refused from now on
        (they would show through its result), and so are writes into its result."""
        for argument in node.all_input_nodes:
            root = self._alias(argument).root
            if root.refusal is None:
                root.refusal = (
                    f"`{root.node.name}`, of which `{node.name}` ({_describe(node.target)}) took a view that "
                    "local functionalization cannot follow"
                )
        refusal = f"`{node.name}` ({_describe(node.target)}), which may be a view of another tensor"
        self.aliases[node] = _Alias(_Root(node, refusal, node), None, 0)

    def _read_current_values(self, node: torch.fx.Node) -> None:
        """Make `node` read the value its inputs have now, after the writes since they were computed."""
        for argument in node.all_input_nodes:
            alias = self.aliases.get(argument)
            if alias is not None and alias.version != alias.root.version:
                node.replace_input_with(argument, self._materialize(argument))

    def _materialize(self, node: torch.fx.Node) -> torch.fx.Node:
        """A node computing `node`'s alias from its root's value now (inserted before the cursor)."""
        alias = self.aliases[node]
        root = alias.root
        if alias.version == root.version:
            return node
        if alias.parent is None:
            return root.current
        key = (node, root.version)
        if key not in self.materialized:
            parent = self._materialize(alias.parent)
            view = self.build(node.target, (parent, *node.args[1:]), dict(node.kwargs), like=node)
            self.aliases[view] = _Alias(root, parent, root.version)
            self.materialized[key] = view
        return self.materialized[key]

    def _functionalize(self, node: torch.fx.Node, target: torch._ops.OpOverload) -> None:
        where = f"`{self.prefix}{node.name}` ({qualified_name(target)})"
        self.build.provenance = node
        if target in _METADATA_ONLY_IN_PLACE or (target in _IN_PLACE_DROPOUTS and _dropout_train(node) is False):
            self.functionalized.append((self.prefix + node.name, qualified_name(target)))
            self._same_tensor(node, node.args[0])
            return
        arguments = target._schema.arguments
        written = [a.name for a in arguments if a.alias_info is not None and a.alias_info.is_write]
        functional = functional_variant(target)
        if written != [arguments[0].name] or functional is None or not isinstance(node.args[0], torch.fx.Node):
            raise NeedsFullDecomposition(f"{where} writes into {', '.join(written) or 'its inputs'}")
        destination = node.args[0]
        alias = self._alias(destination)
        root = alias.root
        if root.refusal is not None:
            through = f" (through `{destination.name}`)" if destination is not root.node else ""
            raise NeedsFullDecomposition(f"{where} writes into {root.refusal}{through}")
        expected = node.meta.get("val")
        values = pytree.tree_map_only(torch.fx.Node, lambda a: a.meta.get("val"), (node.args, node.kwargs))
        leaves = pytree.tree_leaves(values)
        computed = self.results.get(node)
        if computed is not None and _same_fake_values(computed[0], leaves):
            result = computed[1]
        else:
            fake_mode = torch._guards.detect_fake_mode(leaves)
            with fake_mode if fake_mode is not None else contextlib.nullcontext():
                result = functional(*values[0], **values[1])
            self.results[node] = (leaves, result)
        if not isinstance(expected, torch.Tensor) or result.dtype != expected.dtype:
            # eager casts the result into the written tensor's dtype; the functional op would keep its own
            raise NeedsFullDecomposition(f"{where} computes in another dtype than it writes")
        changes_shape = any(r.alias_info is not None for r in functional._schema.returns)
        if result.shape != expected.shape:
            raise NeedsFullDecomposition(f"{where} computes another shape than it writes")
        changes_shape = changes_shape or result.shape != values[0][0].shape
        if changes_shape and (alias.parent is not None or root.views):
            raise NeedsFullDecomposition(
                f"{where} changes the shape of `{destination.name}`, which has views, in place"
            )
        self.functionalized.append((self.prefix + node.name, qualified_name(target)))
        if not self.rewrite:
            root.version += 1
            self._same_tensor(node, destination)
            return
        value = self.build(functional, node.args, dict(node.kwargs), value=result)
        view = destination
        while (parent := self.aliases[view].parent) is not None:  # back through the views, into the root
            value = _VIEW_INVERSES[view.target](parent, view)(self.build, value)
            view = parent
        root.version += 1
        root.current = value
        self.aliases[value] = _Alias(root, None, root.version)
        self._same_tensor(node, destination)

    def _same_tensor(self, node: torch.fx.Node, written: torch.fx.Node) -> None:
        """Readers of the in-place op `node`'s result read the tensor it wrote: its value after the write."""
        if self.rewrite:
            node.replace_all_uses_with(written)
            self.graph.erase_node(node)
        else:
            self.aliases[node] = self._alias(written)


def _same_fake_values(before: list[Any], now: list[Any]) -> bool:
    """Whether an op reading `now` computes what it computed reading `before`: the same leaves, or tensors alike in
    every property a fake op reads (a write's value read anew after an earlier write: a new node, the same metadata).
    Sizes are compared by identity or as plain ints: comparing symbolic ones would add guards."""
    if len(before) != len(now):
        return False
    for old, new in zip(before, now):
        if old is new:
            continue
        if not isinstance(old, torch.Tensor) or not isinstance(new, torch.Tensor) or type(old) is not type(new):
            return False
        if old.dtype != new.dtype or old.device != new.device or old.layout != new.layout or old.dim() != new.dim():
            return False
        if old.requires_grad != new.requires_grad or old.is_conj() != new.is_conj() or old.is_neg() != new.is_neg():
            return False
        sizes = (*zip(old.shape, new.shape), *zip(old.stride(), new.stride()))
        sizes += ((old.storage_offset(), new.storage_offset()),)
        if not all(a is b or (type(a) is int and type(b) is int and a == b) for a, b in sizes):
            return False
    return True


def _describe(target: Any) -> str:
    return (
        qualified_name(target)
        if isinstance(target, torch._ops.OpOverload)
        else getattr(target, "__name__", str(target))
    )


def functionalize_locally(graph_module: torch.fx.GraphModule, prefix: str = "") -> list[tuple[str, str]]:
    """Rewrite every in-place op of `graph_module` (not of its control-flow bodies) into functional ops, or raise
    :class:`NeedsFullDecomposition` with the graph unchanged. Returns the (node, overload) pairs made functional."""
    graph = graph_module.graph
    mutable = [
        n
        for n in graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
    ]
    if not mutable:
        return []
    checker = _Functionalizer(graph, prefix, rewrite=False)
    checker.run()  # raises before anything changed
    functionalizer = _Functionalizer(graph, prefix, rewrite=True, results=checker.results)
    functionalizer.run()
    for node in reversed(graph.nodes):  # views read only by the writes now gone, or by readers now reading anew
        if node.op == "call_function" and node.target in _VIEW_INVERSES and not node.users:
            graph.erase_node(node)
    return functionalizer.functionalized
