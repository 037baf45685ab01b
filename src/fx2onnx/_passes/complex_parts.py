"""Complex ops without a complex lowering, rewritten as real ops on their real and imaginary parts.

Inside the graph a complex tensor is a (..., 2) real tensor (:mod:`fx2onnx._complex_layout`), and only ops with a
complex lowering take that layout. Many others reduce to real ops on the two parts, which every real lowering
handles: data movement and linear maps act on each part alone (``diagonal``, ``gather``, ``index_put``,
``cumsum``...: ``f(z) = complex(f(z.real), f(z.imag))``), a product of complex matrices is four real products,
a vector norm is the norm of the magnitudes, a variance the sum of the parts' variances, ``exp`` and ``log``
follow their formulas, values are equal where both parts are and non-zero where either
is, and a factory given a complex dtype makes each part (torchlib's would cast a real constant to complex inside
the graph, which ONNX Runtime cannot run). This pass, run first, rewrites such nodes, also where torchlib has a
complex lowering that fails (``sum`` over several dims); an implementation a user registered for complex inputs
is left to the dispatcher. What it does not list keeps failing with the dispatcher's error.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.fx
import torch.utils._pytree as pytree

from fx2onnx._capture import recompile_when_read
from fx2onnx._passes import complex_functions, complex_linalg
from fx2onnx._passes.base import PassResult
from fx2onnx._passes.node_builder import NodeBuilder, fake_mode_of, replace_node
from fx2onnx._torch_ops import aten, prims

# f(z) = complex(f(z.real), f(z.imag)): every complex tensor argument replaced by the same part.
PER_PART = {
    aten.cumsum.default,
    aten.diff.default,
    aten.diagonal.default,
    aten.diagonal_copy.default,
    aten.diag_embed.default,
    aten.gather.default,
    aten.take.default,
    aten.index_put.default,
    aten.copy.default,
    aten.as_strided.default,
    aten.as_strided_copy.default,
    aten.index.Tensor,
    aten.select.int,
    aten.sum.default,
    aten.sum.dim_IntList,
    aten.mean.default,
    aten.mean.dim,
    aten.tile.default,
    aten.repeat.default,
    aten.repeat_interleave.self_int,
    aten.index_select.default,
    aten.scatter.src,
    aten.scatter_add.default,
    aten.put.default,
    aten.masked_scatter.default,
    aten.alias.default,
    aten.alias_copy.default,
    # a complex constant in the model's code: captured as lift_fresh_copy, kept as is by local decomposition
    aten.lift_fresh_copy.default,
    aten.as_strided_scatter.default,
    aten.diagonal_scatter.default,
    aten.select_scatter.default,
    aten.slice_scatter.default,
    aten.combinations.default,
    aten.masked_select.default,
    aten.resize.default,
}
# The same, for ops returning a list of tensors (used through getitem).
PER_PART_LISTS = {
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.unsafe_split.Tensor,
    aten.unbind.int,
    aten.atleast_1d.Sequence,
    aten.atleast_2d.Sequence,
    aten.atleast_3d.Sequence,
    aten.broadcast_tensors.default,
}
# Bilinear in two complex operands: (a + ib)(c + id) = (ac - bd) + i(ad + bc), each product the op itself.
PRODUCTS = {
    aten.mm.default,
    aten.bmm.default,
    aten.dot.default,
    aten.matmul.default,
    aten.mv.default,
    aten.outer.default,
    aten.linalg_cross.default,
    aten.cross.default,
}
# Equal where both parts are (eq), different where either is (ne); comparing with a number compares its parts.
COMPARISONS = {
    aten.eq.Scalar: aten.logical_and.default,
    aten.eq.Tensor: aten.logical_and.default,
    aten.ne.Scalar: aten.logical_or.default,
    aten.ne.Tensor: aten.logical_or.default,
    prims.eq.default: aten.logical_and.default,
    prims.ne.default: aten.logical_or.default,
}


# Factories given a complex dtype, each part made by the same factory in the component dtype (``ones``: ones and
# zeros), with the positions of the numbers split into parts.
FACTORIES = {
    aten.ones.default: (),
    aten.zeros.default: (),
    aten.full.default: (1,),
    aten.linspace.default: (0, 1),
    aten.scalar_tensor.default: (0,),
}
# ``x.new_ones(size)``...: the factory itself, without `x` (which only lends its dtype and device).
NEW_FACTORIES = {
    aten.new_ones.default: aten.ones.default,
    aten.new_zeros.default: aten.zeros.default,
    aten.new_full.default: aten.full.default,
}
# The variance of complex values is the sum of the parts' variances (a real result); std its square root.
VARIANCES = {
    aten.var.correction: None,
    aten.var.dim: None,
    aten.var.default: None,
    aten.std.correction: aten.sqrt.default,
    aten.std.dim: aten.sqrt.default,
    aten.std.default: aten.sqrt.default,
}
NORMS = {aten.linalg_vector_norm.default, aten.norm.Scalar, aten.norm.ScalarOpt_dim}
# e^(a + ib) = e^a (cos b + i sin b); log(a + ib) = log|a + ib| + i atan2(b, a).
EXP = {aten.exp.default}
LOG = {aten.log.default}
# Where a complex value is non-zero: where either part is (logical_not: where neither is).
NONZERO = {aten.nonzero.default, aten.nonzero_static.default, aten.argwhere.default, aten.logical_not.default}
# A complex tensor filled with a number (real or complex) or a 0-d tensor: each part with that value's part (a write
# through a view, `z[:, 1:3] = 1.5 - 2j`, is captured as a fill of the view scattered back).
FILLS = {aten.fill.Scalar, aten.fill.Tensor}


# Ops rewritten as other ops on complex values, which the next round of this pass takes on.
COMPOSITES: dict[Any, Callable[[Any, torch.fx.Node], torch.fx.Node]] = {}


def _composite(*targets: Any) -> Callable[[Callable[[Any, torch.fx.Node], torch.fx.Node]], Any]:
    def register(function: Callable[[Any, torch.fx.Node], torch.fx.Node]) -> Any:
        COMPOSITES.update(dict.fromkeys(targets, function))
        return function

    return register


@_composite(aten.addbmm.default)
def _addbmm(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    """beta self + alpha sum_b(batch1[b] @ batch2[b]); beta = 0 ignores self (its NaN too), as eager."""
    self, batch1, batch2 = node.args[:3]
    beta = node.kwargs.get("beta", node.args[3] if len(node.args) > 3 else 1)
    alpha = node.kwargs.get("alpha", node.args[4] if len(node.args) > 4 else 1)
    total = build.call(aten.sum.dim_IntList, build.call(aten.bmm.default, batch1, batch2), [0])
    if alpha != 1:
        total = build.call(aten.mul.Tensor, total, alpha)
    if beta == 0:
        return build.call(aten.expand.default, total, list(node.meta["val"].shape))
    scaled = self if beta == 1 else build.call(aten.mul.Tensor, self, beta)
    return build.call(aten.add.Tensor, scaled, total)


@_composite(aten.linear.default)
def _linear(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    """input @ weight.T + bias."""
    value, weight = node.args[:2]
    bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    rank = len(weight.meta["val"].shape)
    transposed = build.call(aten.t.default, weight) if rank == 2 else weight
    result = build.call(aten.matmul.default, value, transposed)
    return result if bias is None else build.call(aten.add.Tensor, result, bias)


@_composite(aten.isfinite.default)
def _isfinite(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    value = node.args[0]
    finite = [build.call(aten.isfinite.default, build.part(value, which)) for which in (0, 1)]
    return build.call(aten.logical_and.default, *finite)


def _either_part_nan(build: Any, value: torch.fx.Node) -> torch.fx.Node:
    if not _is_complex(value):
        return build.call(aten.isnan.default, value)
    nan = [build.call(aten.isnan.default, build.part(value, which)) for which in (0, 1)]
    return build.call(aten.logical_or.default, *nan)


@_composite(aten.cov.default)
def _cov(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    """Eager's cov on the parts: (X - avg) w conj(X - avg)^T / (sum w - correction [* sum(w aw) / sum w])."""
    value = node.args[0]
    names = ("correction", "fweights", "aweights")
    correction, fweights, aweights = (
        node.kwargs.get(name, node.args[1 + i] if len(node.args) > 1 + i else default)
        for i, (name, default) in enumerate(zip(names, (1, None, None)))
    )
    component = value.meta["val"].dtype.to_real()
    vector = value.meta["val"].dim() < 2
    x = [build.part(value, w) for w in (0, 1)]
    if vector:
        x = [build.call(aten.unsqueeze.default, p, 0) for p in x]
    observations = int(x[0].meta["val"].shape[-1])

    def as_component(weights: torch.fx.Node) -> torch.fx.Node:
        return build.call(prims.convert_element_type.default, weights, component)

    weights = None
    if fweights is not None:
        weights = as_component(fweights)
    if aweights is not None:
        weights = (
            as_component(aweights) if weights is None else build.call(aten.mul.Tensor, weights, as_component(aweights))
        )
    if weights is None:
        average = [build.call(aten.mean.dim, p, [1], True) for p in x]
        factor: Any = observations - correction
    else:
        total = build.call(aten.sum.default, weights)
        average = [
            build.call(
                aten.div.Tensor,
                build.call(aten.sum.dim_IntList, build.call(aten.mul.Tensor, p, weights), [1], True),
                total,
            )
            for p in x
        ]
        if aweights is None:
            factor = build.call(aten.sub.Tensor, total, correction)
        else:
            spread = build.call(aten.sum.default, build.call(aten.mul.Tensor, weights, as_component(aweights)))
            factor = build.call(
                aten.sub.Tensor,
                total,
                build.call(aten.mul.Tensor, build.call(aten.div.Tensor, spread, total), correction),
            )
        factor = build.call(aten.clamp_min.default, factor, 0)
    if not isinstance(factor, torch.fx.Node):
        factor = max(factor, 0)
    centered = [build.call(aten.sub.Tensor, p, a) for p, a in zip(x, average)]
    weighted = centered if weights is None else [build.call(aten.mul.Tensor, p, weights) for p in centered]
    transposed = [build.call(aten.t.default, p) for p in centered]

    def product(left: torch.fx.Node, right: torch.fx.Node) -> torch.fx.Node:
        return build.call(aten.mm.default, left, right)

    real = build.call(aten.add.Tensor, product(weighted[0], transposed[0]), product(weighted[1], transposed[1]))
    imag = build.call(aten.sub.Tensor, product(weighted[1], transposed[0]), product(weighted[0], transposed[1]))
    parts = [build.call(aten.div.Tensor, p, factor) for p in (real, imag)]
    if node.meta["val"].dim() < 2:  # eager squeezes the result: one variable, as a vector or one row, gives a 0-d
        parts = [build.call(aten.squeeze.default, p) for p in parts]
    return build.complex(*parts)


@_composite(aten.isnan.default)
def _isnan(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    return _either_part_nan(build, node.args[0])


@_composite(aten.isinf.default)
def _isinf(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    value = node.args[0]
    infinite = [build.call(aten.isinf.default, build.part(value, which)) for which in (0, 1)]
    return build.call(aten.logical_or.default, *infinite)


@_composite(aten.type_as.default)
def _type_as(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    return build.call(prims.convert_element_type.default, node.args[0], node.args[1].meta["val"].dtype)


@_composite(aten.scatter.reduce)
def _scatter_reduce(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    """scatter with reduce='add' is linear: on each part; 'multiply' is left to the dispatcher's error."""
    reduce = node.kwargs.get("reduce", node.args[4] if len(node.args) > 4 else None)
    if reduce != "add":
        raise _NotOnParts
    return _per_part(build, node)


@_composite(aten.isclose.default)
def _isclose(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    """Eager's: equal, or |a - b| finite and within atol + rtol |b|; both NaN (in either part) with equal_nan."""
    a, b = node.args[:2]
    names = ("rtol", "atol", "equal_nan")
    defaults = (1e-5, 1e-8, False)
    rtol, atol, equal_nan = (
        node.kwargs.get(name, node.args[2 + i] if len(node.args) > 2 + i else default)
        for i, (name, default) in enumerate(zip(names, defaults))
    )
    close = build.call(aten.eq.Tensor, a, b)
    if equal_nan:
        both_nan = build.call(aten.logical_and.default, _either_part_nan(build, a), _either_part_nan(build, b))
        close = build.call(aten.logical_or.default, close, both_nan)
    if rtol == 0 and atol == 0:
        return close
    allowed = build.call(aten.add.Tensor, build.call(aten.mul.Tensor, build.call(aten.abs.default, b), rtol), atol)
    actual = build.call(aten.abs.default, build.call(aten.sub.Tensor, a, b))
    within = build.call(
        aten.logical_and.default,
        build.call(aten.isfinite.default, actual),
        build.call(aten.le.Tensor, actual, allowed),
    )
    return build.call(aten.logical_or.default, close, within)


@_composite(aten.abs.default)
def _abs(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    """|x + iy| in float64, so that complex64's squares do not overflow (|3e30 + 0i| is 3e30, not inf)."""
    value = node.args[0]
    squares = []
    for which in (0, 1):
        wide = build.call(prims.convert_element_type.default, build.part(value, which), torch.float64)
        squares.append(build.call(aten.mul.Tensor, wide, wide))
    modulus = build.call(aten.sqrt.default, build.call(aten.add.Tensor, *squares))
    return build.call(prims.convert_element_type.default, modulus, node.meta["val"].dtype)


@_composite(aten.einsum.default)
def _einsum(build: Any, node: torch.fx.Node) -> torch.fx.Node:
    """A product of complex operands: the einsum of every choice of parts, i^k for k imaginary parts chosen."""
    equation, operands = node.args[0], list(node.args[1])
    choices: list[list[tuple[torch.fx.Node, int]]] = [[]]
    for operand in operands:
        options = [(build.part(operand, 0), 0), (build.part(operand, 1), 1)] if _is_complex(operand) else [(operand, 0)]
        choices = [[*chosen, option] for chosen in choices for option in options]
    sums: list[torch.fx.Node | None] = [None, None]
    for chosen in choices:
        imaginary = sum(k for _, k in chosen)
        term = build.call(aten.einsum.default, equation, [v for v, _ in chosen])
        if imaginary % 4 in (2, 3):
            term = build.call(aten.neg.default, term)
        which = imaginary % 2
        sums[which] = term if sums[which] is None else build.call(aten.add.Tensor, sums[which], term)
    real, imag = sums
    assert real is not None and imag is not None
    return build.complex(real, imag)


COMPOSITES.update(complex_linalg.COMPOSITES)

_WITH_COMPLEX_INPUTS = frozenset(
    PER_PART
    | PER_PART_LISTS
    | PRODUCTS
    | NONZERO
    | FILLS
    | EXP
    | LOG
    | COMPARISONS.keys()
    | VARIANCES.keys()
    | {aten.linalg_vector_norm.default}
    | complex_functions.UNARY.keys()
    | complex_functions.POWERS
    | complex_functions.PRODUCTS_ALONG
    | COMPOSITES.keys()
    | complex_linalg.COMPOSITES.keys()
    | complex_linalg.TUPLES.keys()
    | {aten.var_mean.correction, aten.norm.Scalar, aten.norm.ScalarOpt_dim}
)
_ALL = _WITH_COMPLEX_INPUTS | FACTORIES.keys() | NEW_FACTORIES.keys()


def rewrites(target: Any) -> bool:
    """Whether this pass rewrites `target` with complex inputs (so capture need not decompose it)."""
    return target in _WITH_COMPLEX_INPUTS


class Registry(Protocol):
    """The implementations the registry (:class:`fx2onnx._registry.Registry`, a later stage) holds for a target."""

    def overloads(self, target: Any) -> Sequence[Any]: ...


class ComplexOnParts:
    """Rewrite the listed ops with complex inputs on the parts, unless `registry` lowers them with complex inputs
    (a user's implementation)."""

    name = "rewrite_complex_on_parts"

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry

    def __call__(self, graph_module: torch.fx.GraphModule) -> PassResult:
        replaced = _rewrite_complex_on_parts(graph_module, self.registry)
        return PassResult(bool(replaced), replaced)


def _rewrite_complex_on_parts(
    graph_module: torch.fx.GraphModule, registry: Registry | None
) -> dict[torch.fx.Node, torch.fx.Node]:
    graph = graph_module.graph
    fake_mode = fake_mode_of(graph)
    replaced: dict[torch.fx.Node, torch.fx.Node] = {}
    # A rewrite may use ops that are themselves rewritten (addbmm's bmm and sum): walk until none is left.
    for _ in range(_MAX_ROUNDS):
        found = _rewrite_round(graph, registry, fake_mode)
        # an earlier replacement rewritten in this round now stands for its own replacement
        replaced = {old: found.get(new, new) for old, new in replaced.items()} | found
        if not found:
            break
    if replaced:
        graph.lint()
        recompile_when_read(graph_module)
    return replaced


_MAX_ROUNDS = 4


def _rewrite_round(
    graph: torch.fx.Graph, registry: Registry | None, fake_mode: Any
) -> dict[torch.fx.Node, torch.fx.Node]:
    replaced: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(graph.nodes):
        if _list_per_part(node) and not (registry is not None and _left_to_registry(node, registry)):
            replaced.update(_rewrite_list_per_part(_Builder(graph, node, fake_mode), node))
            continue
        if _variance_and_mean(node) and not (registry is not None and _left_to_registry(node, registry)):
            replaced.update(_rewrite_variance_and_mean(_Builder(graph, node, fake_mode), node))
            continue
        if _tuple_on_parts(node) and not (registry is not None and _left_to_registry(node, registry)):
            replaced.update(_rewrite_tuple(_Builder(graph, node, fake_mode), node))
            continue
        rewrite = _rewrite_for(node)
        if rewrite is None or (registry is not None and _left_to_registry(node, registry)):
            continue
        try:
            replaced[node] = rewrite(_Builder(graph, node, fake_mode), node)
        except _NotOnParts:
            continue
        replace_node(node, replaced[node])
    return replaced


class _NotOnParts(Exception):
    """Raised by a rewrite, before it adds nodes, when this node's arguments are not the case it handles."""


def _list_per_part(node: torch.fx.Node) -> bool:
    """A listed op returning complex tensors that its users only take apart with getitem."""
    values = node.meta.get("val")
    return (
        node.op == "call_function"
        and node.target in PER_PART_LISTS
        and isinstance(values, (list, tuple))
        and all(isinstance(v, torch.Tensor) and v.is_complex() for v in values)
        and all(user.target is operator.getitem for user in node.users)
    )


def _rewrite_list_per_part(build: _Builder, node: torch.fx.Node) -> dict[torch.fx.Node, torch.fx.Node]:
    """The op on each part, and each ``node[i]`` rebuilt from ``real[i]`` and ``imag[i]``."""
    replaced = {}

    def on_part(which: int) -> torch.fx.Node:
        args = pytree.tree_map(lambda a: build.part(a, which) if _is_complex(a) else a, node.args)
        return build.call(node.target, *args, **node.kwargs)

    parts = [on_part(0), on_part(1)]
    for user in list(node.users):
        real, imag = (build.call(operator.getitem, part, user.args[1]) for part in parts)
        replaced[user] = build.complex(real, imag)
        replace_node(user, replaced[user])
    build.graph.erase_node(node)
    return replaced


def _variance_and_mean(node: torch.fx.Node) -> bool:
    return (
        node.op == "call_function"
        and node.target is aten.var_mean.correction
        and _is_complex(node.args[0])
        and all(user.target is operator.getitem for user in node.users)
    )


def _rewrite_variance_and_mean(build: _Builder, node: torch.fx.Node) -> dict[torch.fx.Node, torch.fx.Node]:
    """var_mean as ``var`` and ``mean`` nodes, which the next round rewrites on the parts."""
    value, dim = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keepdim = node.kwargs.get("keepdim", False)
    results = (
        build.call(aten.var.correction, value, dim, correction=node.kwargs.get("correction"), keepdim=keepdim),
        build.call(aten.mean.dim, value, dim, keepdim),
    )
    replaced = {}
    for user in list(node.users):
        replaced[user] = results[user.args[1]]
        replace_node(user, replaced[user])
    build.graph.erase_node(node)
    return replaced


def _tuple_on_parts(node: torch.fx.Node) -> bool:
    """A tuple-returning op of complex_linalg's whose users take only the results it can give."""
    return (
        node.op == "call_function"
        and node.target in complex_linalg.TUPLES
        and _is_complex(node.args[0])
        and all(
            user.target is operator.getitem and user.args[1] in complex_linalg.TUPLE_RESULTS[node.target]
            for user in node.users
        )
    )


def _rewrite_tuple(build: _Builder, node: torch.fx.Node) -> dict[torch.fx.Node, torch.fx.Node]:
    results = complex_linalg.TUPLES[node.target](build, node)
    replaced = {}
    for user in list(node.users):
        replaced[user] = results[user.args[1]]
        replace_node(user, replaced[user])
    build.graph.erase_node(node)
    return replaced


def _left_to_registry(node: torch.fx.Node, registry: Registry) -> bool:
    """Whether a user registered an implementation of `node`'s op for complex inputs (torchlib's are replaced:
    where this pass lists an op, torchlib's complex lowering failed, e.g. ``sum`` over several dims)."""
    takes_complex = any(_is_complex(leaf) for leaf in pytree.tree_leaves((node.args, node.kwargs)))
    return takes_complex and any(i.complex and i.source == "user" for i in registry.overloads(node.target))


class _Builder(NodeBuilder):
    """Adds nodes before `origin`, and takes complex values apart and back together."""

    def __init__(self, graph: torch.fx.Graph, origin: torch.fx.Node, fake_mode: Any) -> None:
        super().__init__(graph, origin, fake_mode)
        self.parts: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}

    def part(self, value: torch.fx.Node, which: int) -> torch.fx.Node:
        """The real (0) or imaginary (1) part of complex `value`."""
        if (value, which) not in self.parts:
            source = value
            if value.meta["val"].is_conj():  # a conjugate view (x.mH) holds its values already conjugated in ONNX
                source = self.call(aten.resolve_conj.default, value)
            self.parts[value, which] = self.call(
                aten.select.int, self.call(aten.view_as_real.default, source), -1, which
            )
        return self.parts[value, which]

    def complex(self, real: torch.fx.Node, imag: torch.fx.Node) -> torch.fx.Node:
        value = real.meta["val"]
        if not any(isinstance(size, torch.SymInt) for size in value.shape):
            return self.call(aten.complex.default, real, imag)
        # torch's meta for complex asks for concrete sizes: one that depends on values (masked_select) has none
        with self.graph.inserting_before(self.origin):
            new = self.graph.call_function(aten.complex.default, (real, imag))
        with self.fake_mode or contextlib.nullcontext():
            new.meta["val"] = value.new_empty(value.shape, dtype=value.dtype.to_complex())
        new.meta.update({k: self.origin.meta[k] for k in ("stack_trace", "nn_module_stack") if k in self.origin.meta})
        return new


def _is_complex(value: Any) -> bool:
    return (
        isinstance(value, torch.fx.Node)
        and isinstance(value.meta.get("val"), torch.Tensor)
        and (value.meta["val"].is_complex())
    )


def _rewrite_for(node: torch.fx.Node) -> Callable[[_Builder, torch.fx.Node], torch.fx.Node] | None:
    if node.op != "call_function" or node.target not in _ALL or not isinstance(node.meta.get("val"), torch.Tensor):
        return None
    if (node.target in FACTORIES or node.target in NEW_FACTORIES) and node.meta["val"].is_complex():
        return _factory_per_part
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    if node.target in FILLS and _is_complex(node.args[0]) and node.meta["val"].is_complex() and not node.kwargs:
        return _fill_per_part
    if node.target in COMPOSITES and any(_is_complex(a) for a in node.all_input_nodes):
        return COMPOSITES[node.target]
    if node.target in complex_functions.POWERS and node.meta["val"].is_complex():
        return complex_functions.pow_
    if node.target in COMPARISONS and any(_is_complex(a) for a in node.args) and not node.kwargs:
        return _compare_parts
    if not any(_is_complex(leaf) for leaf in leaves) or any(isinstance(leaf, complex) for leaf in leaves):
        return None  # no complex input, or a complex number to split as well (left to the dispatcher's error)
    if node.target in PER_PART and node.meta["val"].is_complex() and _complex_or_no_dtype(node):
        # each value-carrying input must be complex (a real `src` or `values` would land in both parts)
        values = [leaf.meta["val"] for leaf in leaves if isinstance(leaf, torch.fx.Node) and "val" in leaf.meta]
        if all(v.is_complex() for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()):
            return _per_part
        return None
    if node.target in PRODUCTS and all(_is_complex(a) for a in node.args[:2]):
        return _product
    if node.target in NORMS and _is_complex(node.args[0]) and _complex_or_no_dtype(node):
        return _norm_of_magnitudes

    if node.target in NONZERO and _is_complex(node.args[0]):
        return _nonzero_of_either_part
    if node.target in VARIANCES and _is_complex(node.args[0]):
        return _variance_of_parts
    if node.target in EXP and _is_complex(node.args[0]):
        return _exp_of_parts
    if node.target in LOG and _is_complex(node.args[0]):
        return _log_of_parts
    if node.target in complex_functions.UNARY and _is_complex(node.args[0]) and node.meta["val"].is_complex():
        return complex_functions.unary
    if node.target in complex_functions.PRODUCTS_ALONG and _is_complex(node.args[0]) and node.meta["val"].is_complex():
        return complex_functions.product
    return None


def _complex_or_no_dtype(node: torch.fx.Node) -> bool:
    """A `dtype` argument, if any, asks for a complex result (each part then gets the component dtype)."""
    dtype = node.kwargs.get("dtype")
    return dtype is None or dtype.is_complex


def _per_part(build: _Builder, node: torch.fx.Node) -> torch.fx.Node:
    def on_part(which: int) -> torch.fx.Node:
        args, kwargs = pytree.tree_map(
            lambda leaf: build.part(leaf, which) if _is_complex(leaf) else leaf, (node.args, node.kwargs)
        )
        if kwargs.get("dtype") is not None:
            kwargs = {**kwargs, "dtype": kwargs["dtype"].to_real()}
        part = build.call(node.target, *args, **kwargs)
        # both parts have the result's sizes: the same symbols where they depend on values (combinations,
        # masked_select), not a new unbacked size per part, which the complex value could not reconcile
        with build.fake_mode or contextlib.nullcontext():
            part.meta["val"] = node.meta["val"].real.clone()
        return part

    return build.complex(on_part(0), on_part(1))


def _fill_per_part(build: _Builder, node: torch.fx.Node) -> torch.fx.Node:
    self, value = node.args[:2]

    def on_part(which: int) -> torch.fx.Node:
        part = build.part(self, which)
        if _is_complex(value):
            return build.call(aten.fill.Tensor, part, build.part(value, which))
        if isinstance(value, torch.fx.Node):  # a real 0-d tensor: the imaginary part is 0
            return build.call(aten.fill.Tensor, part, value) if which == 0 else build.call(aten.fill.Scalar, part, 0)
        return build.call(aten.fill.Scalar, part, _part_of_number(value, which))

    return build.complex(on_part(0), on_part(1))


def _product(build: _Builder, node: torch.fx.Node) -> torch.fx.Node:
    left, right = node.args[:2]
    (a, b), (c, d) = ((build.part(v, 0), build.part(v, 1)) for v in (left, right))
    rest, kwargs = node.args[2:], node.kwargs  # linalg_cross's dim

    def product(left: torch.fx.Node, right: torch.fx.Node) -> torch.fx.Node:
        if node.target is aten.outer.default:  # no real lowering: capture decomposes it for real inputs
            return build.call(aten.mul.Tensor, build.call(aten.unsqueeze.default, left, -1), right)
        return build.call(node.target, left, right, *rest, **kwargs)

    real = build.call(aten.sub.Tensor, product(a, c), product(b, d))
    imag = build.call(aten.add.Tensor, product(a, d), product(b, c))
    return build.complex(real, imag)


def _norm_of_magnitudes(build: _Builder, node: torch.fx.Node) -> torch.fx.Node:
    value, kwargs = node.args[0], dict(node.kwargs)
    if kwargs.get("dtype") is not None:  # the complex dtype the values are cast to first; the norm is of its parts'
        value = build.call(prims.convert_element_type.default, value, kwargs["dtype"])
        kwargs["dtype"] = kwargs["dtype"].to_real()
    magnitude = build.call(aten.abs.default, value)
    return build.call(node.target, magnitude, *node.args[1:], **kwargs)


def _compare_parts(build: _Builder, node: torch.fx.Node) -> torch.fx.Node:
    left, right = node.args if _is_complex(node.args[0]) else node.args[::-1]  # eq and ne are symmetric

    def compare(which: int) -> torch.fx.Node:
        if _is_complex(right):
            other = build.part(right, which)
        elif isinstance(right, torch.fx.Node):  # a real tensor: its imaginary part is 0
            other = right if which == 0 else 0
        else:
            other = _part_of_number(right, which)
        equal = COMPARISONS[node.target] is aten.logical_and.default
        if isinstance(other, torch.fx.Node):
            return build.call(aten.eq.Tensor if equal else aten.ne.Tensor, build.part(left, which), other)
        return build.call(aten.eq.Scalar if equal else aten.ne.Scalar, build.part(left, which), other)

    return build.call(COMPARISONS[node.target], compare(0), compare(1))


def _nonzero_of_either_part(build: _Builder, node: torch.fx.Node) -> torch.fx.Node:
    layout = build.call(aten.view_as_real.default, node.args[0])
    nonzero_part = build.call(aten.ne.Scalar, layout, 0)
    return build.call(node.target, build.call(aten.any.dim, nonzero_part, -1), *node.args[1:], **node.kwargs)


def _factory_per_part(build: _Builder, node: torch.fx.Node) -> torch.fx.Node:
    component = node.meta["val"].dtype.to_real()
    factory = NEW_FACTORIES.get(node.target, node.target)
    arguments = node.args[1:] if node.target in NEW_FACTORIES else node.args

    def on_part(which: int) -> torch.fx.Node:
        target = aten.zeros.default if (factory is aten.ones.default and which == 1) else factory
        args = [_part_of_number(a, which) if i in FACTORIES[factory] else a for i, a in enumerate(arguments)]
        return build.call(target, *args, **{**node.kwargs, "dtype": component})

    return build.complex(on_part(0), on_part(1))


def _part_of_number(number: Any, which: int) -> Any:
    """A complex number's real or imaginary part; a real number is its own real part and has 0 as imaginary."""
    if isinstance(number, bool) or not isinstance(number, (complex, float, int)):
        return number
    if isinstance(number, complex):
        return number.imag if which else number.real
    return number if which == 0 else type(number)(0)


def _variance_of_parts(build: _Builder, node: torch.fx.Node) -> torch.fx.Node:
    real, imag = (build.call(node.target, build.part(node.args[0], w), *node.args[1:], **node.kwargs) for w in (0, 1))
    if VARIANCES[node.target] is None:
        return build.call(aten.add.Tensor, real, imag)
    squares = (build.call(aten.mul.Tensor, std, std) for std in (real, imag))
    return build.call(aten.sqrt.default, build.call(aten.add.Tensor, *squares))


def _exp_of_parts(build: _Builder, node: torch.fx.Node) -> torch.fx.Node:
    a, b = build.part(node.args[0], 0), build.part(node.args[0], 1)
    magnitude = build.call(aten.exp.default, a)
    real = build.call(aten.mul.Tensor, magnitude, build.call(aten.cos.default, b))
    return build.complex(real, build.call(aten.mul.Tensor, magnitude, build.call(aten.sin.default, b)))


def _log_of_parts(build: _Builder, node: torch.fx.Node) -> torch.fx.Node:
    a, b = build.part(node.args[0], 0), build.part(node.args[0], 1)
    real = build.call(aten.log.default, build.call(aten.abs.default, node.args[0]))
    return build.complex(real, build.call(aten.atan2.default, b, a))
