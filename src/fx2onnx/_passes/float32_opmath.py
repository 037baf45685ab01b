"""float16/bfloat16 ops that eager computes in float32 and rounds once are exported to do the same.

Eager's CPU kernels for the reduced float types convert their inputs to float32 (torch's "opmath" type),
compute, and round the result once. Exported as is, an op whose lowering takes several ONNX nodes (``silu`` is
Sigmoid then Mul, ``rsqrt`` Sqrt then Reciprocal, ``lerp``, ``hypot``, ``log10``...) rounds after each node, once
legalized through float32 node by node: a quarter to a half of their bfloat16 results were an ulp or more off
eager. This pass, run before type promotion, rewrites such nodes as ``convert(op(convert(x, float32)), dtype)``.

``mul``/``div`` by a number are a case of their own: eager reads the number (or a 0-d float32 tensor) unrounded,
as a float32 (``bf16 * 0.3`` multiplies by ``0.3f``, not by bfloat16's ``0.30078125``; measured on torch 2.13),
where promotion alone would round it to the tensor's dtype (47% of ``x * 0.3``'s bfloat16 results differed).
They are rewritten only when the number is not exact in that dtype; a product of two tensors is one rounding
either way. ``add``/``sub`` narrow their scalar operand and their ``alpha`` to the tensor's dtype, then compute
``a + alpha * b`` in float32 and round once: rewritten when there is an ``alpha``, with it narrowed.

Ops are listed, not found by a rule: some are defined by the narrow dtype itself (``nextafter`` steps one
bfloat16 ulp), eager computes others in steps that round (``logit`` rounds after each op, so its lowering keeps
the dtype; ``log_softmax`` is 10% off a float32 computation rounded once, for reasons not found yet), and
single-node ops gain nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.fx
import torch.utils._pytree as pytree

from fx2onnx._capture import recompile_when_read
from fx2onnx._passes.base import PassResult
from fx2onnx._passes.node_builder import NodeBuilder, fake_mode_of, replace_node
from fx2onnx._passes.promotion import constant_value, node_dtype
from fx2onnx._passes.promotion_rules import CAST
from fx2onnx._torch_ops import aten

REDUCED_FLOATS = (torch.float16, torch.bfloat16)
# mul/div: in float32 when their scalar operand is read more precisely than the tensor's dtype holds it.
_BY_SCALAR = {aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar}
# add/sub: in float32 when they have an alpha other than 1 (eager: a + narrow(alpha) * b in float32).
_WITH_ALPHA = {aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar}
# Always in float32: their lowerings take several ONNX nodes, or ONNX Runtime's float16 kernel rounds otherwise
# than eager (each measured off eager in bfloat16 or float16 before this pass).
ROUND_ONCE = {
    aten.silu.default,
    aten.mish.default,
    aten.softplus.default,
    aten.sigmoid.default,
    aten.glu.default,
    aten.addcmul.default,
    aten.addcdiv.default,
    aten.lerp.Scalar,
    aten.lerp.Tensor,
    aten.rsqrt.default,
    aten.hypot.default,
    aten.atan2.default,
    aten.sinc.default,
    aten.log2.default,
    aten.log10.default,
    aten.deg2rad.default,
    aten.rad2deg.default,
    # not remainder nor div with a rounding mode: eager rounds a tensor quotient's steps in the dtype, as the
    # lowerings' nodes do (8% of bfloat16 floor quotients above 256 were off in float32)
    aten.erf.default,
    aten.erfinv.default,
    aten.lgamma.default,
    aten.digamma.default,
}
# Floor and truncating division by a number: eager's kernel reads the number as a float32 and computes the quotient
# in float32, rounded once (by a tensor, it rounds each step in the dtype, as the lowerings' nodes do).
_ROUNDED_BY_NUMBER = {aten.div.Tensor_mode, aten.div.Scalar_mode, aten.floor_divide.default, aten.floor_divide.Scalar}
_OPS = frozenset(ROUND_ONCE | _BY_SCALAR | _WITH_ALPHA | _ROUNDED_BY_NUMBER)


class ComputeInFloat32:
    """Rewrite the reduced-float nodes eager computes in float32 to do so. `constants` maps placeholders holding
    constants to their values, so that a constant factor the dtype holds exactly is left to promotion."""

    name = "compute_in_float32"

    def __init__(self, constants: Mapping[torch.fx.Node, torch.Tensor] | None = None) -> None:
        self.constants = constants or {}

    def __call__(self, graph_module: torch.fx.GraphModule) -> PassResult:
        replaced = _compute_in_float32(graph_module, self.constants)
        return PassResult(bool(replaced), replaced)


def _compute_in_float32(
    graph_module: torch.fx.GraphModule, constants: Mapping[torch.fx.Node, torch.Tensor]
) -> dict[torch.fx.Node, torch.fx.Node]:
    graph = graph_module.graph
    fake_mode = fake_mode_of(graph)
    replaced: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(graph.nodes):
        dtype = _reduced_float_result(node)
        if dtype is None or not _computed_in_float32(node, dtype, constants):
            continue
        build = NodeBuilder(graph, node, fake_mode)
        args, kwargs = _float32_arguments(build, node, dtype)
        replaced[node] = build.call(CAST, build.call(node.target, *args, **kwargs), dtype)
        replace_node(node, replaced[node])
    if replaced:
        graph.lint()
        recompile_when_read(graph_module)
    return replaced


def _float32_arguments(
    build: NodeBuilder, node: torch.fx.Node, dtype: torch.dtype
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`node`'s arguments for its float32 form: its `dtype` (and 0-d float64) tensors converted, numbers as eager
    reads them."""
    wide: dict[torch.fx.Node, torch.fx.Node] = {}

    def widen(leaf: Any) -> Any:
        if not isinstance(leaf, torch.fx.Node) or node_dtype(leaf) not in (dtype, torch.float64):
            return leaf
        if leaf not in wide:  # float64: a 0-d factor eager reads as a float32
            wide[leaf] = build.call(CAST, leaf, torch.float32)
        return wide[leaf]

    args, kwargs = pytree.tree_map(widen, (node.args, node.kwargs))
    if node.target in _BY_SCALAR | _ROUNDED_BY_NUMBER and not isinstance(args[1], torch.fx.Node):
        args = (args[0], float(_as_float32(args[1])), *args[2:])  # exact in float32
    if node.target in _WITH_ALPHA:
        kwargs = {**kwargs, "alpha": float(torch.tensor(kwargs["alpha"]).to(dtype))}
    return args, kwargs


def _reduced_float_result(node: torch.fx.Node) -> torch.dtype | None:
    """The float16/bfloat16 dtype of `node`'s result if it is one of this pass's ops, else None."""
    if node.op != "call_function" or node.target not in _OPS:
        return None
    dtype = node_dtype(node)
    return dtype if dtype in REDUCED_FLOATS else None


def _computed_in_float32(node: torch.fx.Node, dtype: torch.dtype, constants: Mapping[torch.fx.Node, Any]) -> bool:
    if node.target in ROUND_ONCE:
        return True
    if node.target in _WITH_ALPHA:
        return node.kwargs.get("alpha", 1) != 1
    if node.target in _ROUNDED_BY_NUMBER:
        return len(node.args) > 1 and type(node.args[1]) in (int, float)
    # mul/div: the tensor first, then a number or a 0-d tensor of a wider dtype, read by eager as a float32
    tensor, scalar = node.args
    if node.kwargs or not isinstance(tensor, torch.fx.Node) or node_dtype(tensor) != dtype:
        return False
    if isinstance(scalar, torch.fx.Node):
        value = scalar.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.dim() != 0 or value.dtype not in (torch.float32, torch.float64):
            return False
        constant = constant_value(scalar, constants)
        if constant is None:
            return True  # known only when the model runs
        scalar = constant.item()
    if type(scalar) not in (int, float) or not np.isfinite(scalar):
        return False
    as_float32 = float(_as_float32(scalar))
    return float(torch.tensor(as_float32).to(dtype).float()) != as_float32


def _as_float32(number: float) -> np.float32:
    with np.errstate(over="ignore"):  # beyond float32's range eager reads inf too
        return np.float32(number)
