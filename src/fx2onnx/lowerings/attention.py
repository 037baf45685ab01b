"""Attention lowerings where torchlib's differ from eager."""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript import BOOL
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

from fx2onnx.lowerings import lowering


@lowering("aten::scaled_dot_product_attention")
def scaled_dot_product_attention_bool_mask(
    query: TFloat,
    key: TFloat,
    value: TFloat,
    attn_mask: BOOL,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> TFloat:
    """SDPA with a boolean mask. A query row whose mask is all False gives zeros, as in eager.

    (torchlib fills masked scores with the dtype's minimum, which turns such rows into a uniform
    average of the values instead.) Dropout is an identity at inference.
    """
    del dropout_p, is_causal  # torch refuses is_causal together with an explicit mask
    rank = len(query.shape)
    key_transposed = op.Transpose(key, perm=[*range(rank - 2), rank - 1, rank - 2])
    if scale is None:
        head_dim = query.shape[-1]
        if isinstance(head_dim, int):
            scale = 1.0 / math.sqrt(head_dim)
    if scale is None:
        width = op.Cast(op.Shape(query, start=-1), to=query.dtype)
        scale_value = op.Div(op.CastLike(1.0, query), op.Sqrt(width))
    else:
        scale_value = op.CastLike(scale, query)
    scores = op.Mul(op.MatMul(query, key_transposed), scale_value)
    zero = op.Constant(value=ir.tensor(0.0, dtype=query.dtype))
    minus_infinity = op.Constant(value=ir.tensor(-math.inf, dtype=query.dtype))
    scores = op.Add(scores, op.Where(attn_mask, zero, minus_infinity))
    weights = op.Softmax(scores, axis=-1)
    weights = op.Where(op.IsNaN(weights), zero, weights)  # rows with no allowed key: 0/0 -> 0
    return op.MatMul(weights, value)
