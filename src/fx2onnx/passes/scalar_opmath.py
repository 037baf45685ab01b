"""float16/bfloat16 multiplied or divided by a number: in float32 with the number unrounded, as eager does.

ATen's CPU ``mul`` and ``div`` kernels for the reduced float types read a scalar operand (a Python number, or
a 0-d tensor of a wider dtype) at its own precision, as a float32, compute in float32 and round once:
``bf16 * 0.3`` multiplies by ``0.3f``, not by bfloat16's ``0.30078125`` (``x / 0.3`` likewise divides by
``0.3f``; measured on torch 2.13). Type promotion alone would round the number to the tensor's dtype first (47% of
``x * 0.3``'s bfloat16 results then differed from eager). This pass rewrites those nodes to compute in float32
and round once, before promotion sees them. ``add``/``sub`` narrow their scalar to the tensor's dtype in eager
too, so promotion's rounding is right for them and they are left alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.fx

from fx2onnx.passes.promotion import constant_value
from fx2onnx.passes.promotion_rules import CAST

aten = torch.ops.aten
REDUCED_FLOATS = (torch.float16, torch.bfloat16)
# The ops whose reduced-float kernel reads a scalar operand unrounded, and their float32 form.
_IN_FLOAT32 = {
    aten.mul.Tensor: aten.mul.Tensor,
    aten.mul.Scalar: aten.mul.Tensor,
    aten.div.Tensor: aten.div.Tensor,
    aten.div.Scalar: aten.div.Tensor,
}
_KEPT_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node")


def compute_scalar_products_in_float32(
    graph_module: torch.fx.GraphModule, constants: Mapping[torch.fx.Node, torch.Tensor] | None = None
) -> dict[torch.fx.Node, torch.fx.Node]:
    """Rewrite reduced-float ``mul``/``div`` by a scalar as eager's kernel computes them; returns each replaced
    node's replacement (its users now use the replacement). `constants` maps placeholders holding constants to
    their values, so that a constant the dtype holds exactly is left to promotion."""
    graph = graph_module.graph
    replaced: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _IN_FLOAT32 or node.kwargs:
            continue
        tensor, scalar = node.args
        dtype = _reduced_float_dtype(node, tensor)
        if dtype is None or not _read_unrounded(scalar, dtype, constants or {}):
            continue
        with graph.inserting_before(node):
            wide = _call(graph, CAST, (tensor, torch.float32), node)
            if isinstance(scalar, torch.fx.Node):
                factor = _call(graph, CAST, (scalar, torch.float32), node)
            else:
                factor = float(np.float32(scalar))  # as eager reads it, kept exactly by the float32 graph
            product = _call(graph, _IN_FLOAT32[node.target], (wide, factor), node)
            replaced[node] = _call(graph, CAST, (product, dtype), node)
        node.replace_all_uses_with(replaced[node])
        graph.erase_node(node)
    if replaced:
        graph.lint()
        graph_module.recompile()
    return replaced


def _reduced_float_dtype(node: torch.fx.Node, tensor: Any) -> torch.dtype | None:
    """The float16/bfloat16 dtype of `node`'s tensor operand and result, else None."""
    if not isinstance(tensor, torch.fx.Node):
        return None
    value, result = tensor.meta.get("val"), node.meta.get("val")
    if not isinstance(value, torch.Tensor) or not isinstance(result, torch.Tensor):
        return None
    return value.dtype if value.dtype in REDUCED_FLOATS and result.dtype == value.dtype else None


def _read_unrounded(scalar: Any, dtype: torch.dtype, constants: Mapping[torch.fx.Node, torch.Tensor]) -> bool:
    """Whether eager reads `scalar` more precisely than `dtype` holds it (else promotion's rounding is exact)."""
    if isinstance(scalar, torch.fx.Node):  # a 0-d float32/float64 tensor: eager reads its value as a float32
        value = scalar.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.dim() != 0 or value.dtype not in (torch.float32, torch.float64):
            return False
        constant = constant_value(scalar, constants)
        if constant is None:
            return True  # known only when the model runs
        scalar = constant.item()
    if type(scalar) not in (int, float) or not np.isfinite(scalar):
        return False
    with np.errstate(over="ignore"):  # beyond float32's range eager reads inf too
        as_float32 = float(np.float32(scalar))
    return float(torch.tensor(as_float32).to(dtype).float()) != as_float32


def _call(graph: torch.fx.Graph, target: Any, args: tuple[Any, ...], origin: torch.fx.Node) -> torch.fx.Node:
    """A node computing `target(*args)`, with its fake value and `origin`'s source location."""
    new = graph.call_function(target, args)
    new.meta["val"] = target(*(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args))
    new.meta.update({name: origin.meta[name] for name in _KEPT_META if name in origin.meta})
    return new
