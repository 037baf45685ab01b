"""Attention: scaled_dot_product_attention (ONNX Attention at opset 23+)."""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript import BOOL, opset23
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

from fx2onnx._lowerings.rules import lowering


@lowering("aten::scaled_dot_product_attention", opset=(23, None))
def scaled_dot_product_attention_bool_mask_onnx23(
    query: TFloat,
    key: TFloat,
    value: TFloat,
    attn_mask: BOOL,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> TFloat:
    """ONNX's own Attention (opset 23+) with a boolean mask (True: attend), as transformers' LLaMA and GPT-2
    pass. Attention gives zeros for a query row whose mask is all False, as eager does (the spec's errata;
    ONNX Runtime 1.32's CPU kernel does so). Dropout is an identity at inference.
    """
    del dropout_p, is_causal  # torch refuses is_causal together with an explicit mask
    return _onnx_attention(query, key, value, attn_mask, scale)


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
    average of the values instead.) float16/bfloat16 compute in float32, as eager's CPU kernels: float16 scores
    of large queries and keys (|q.k| beyond 65504) would overflow to inf and their rows turn to zeros. Dropout is
    an identity at inference.
    """
    del dropout_p, is_causal  # torch refuses is_causal together with an explicit mask
    dtype = query.dtype
    low_precision = dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    compute_type = ir.DataType.FLOAT if low_precision else dtype
    q, k, v = (op.Cast(t, to=compute_type) if low_precision else t for t in (query, key, value))
    rank = len(query.shape)
    key_transposed = op.Transpose(k, perm=[*range(rank - 2), rank - 1, rank - 2])
    if scale is None:
        head_dim = query.shape[-1]
        if isinstance(head_dim, int):
            scale = 1.0 / math.sqrt(head_dim)
    if scale is None:
        width = op.Cast(op.Shape(q, start=-1), to=compute_type)
        scale_value = op.Div(op.CastLike(1.0, q), op.Sqrt(width))
    else:
        scale_value = _scale(scale, q)
    scores = op.MatMul(q, key_transposed)
    if scale_value is not None:
        scores = op.Mul(scores, scale_value)
    zero = op.Constant(value=ir.tensor(0.0, dtype=compute_type))
    minus_infinity = op.Constant(value=ir.tensor(-math.inf, dtype=compute_type))
    scores = op.Add(scores, op.Where(attn_mask, zero, minus_infinity))
    weights = _zero_blocked_rows(scores, op.Softmax(scores, axis=-1))
    attended = op.MatMul(weights, v)
    return op.Cast(attended, to=dtype) if low_precision else attended


@lowering("aten::scaled_dot_product_attention", opset=(23, None))
def scaled_dot_product_attention_onnx23(
    query: TFloat,
    key: TFloat,
    value: TFloat,
    attn_mask: TFloat | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> TFloat:
    """ONNX's own Attention (opset 23+) with no mask, a float mask, or a causal mask (boolean masks: the
    lowering above).

    ONNX's causal mask is aligned bottom-right and torch's top-left: they agree when queries and keys
    are equally many; otherwise the top-left mask is built and passed as a boolean mask (no row of it is
    fully masked). Dropout is an identity at inference.
    """
    del dropout_p, enable_gqa
    if not is_causal:
        return _onnx_attention(query, key, value, attn_mask, scale)
    queries, keys = query.shape[-2], key.shape[-2]
    if isinstance(queries, int) and isinstance(keys, int) and queries == keys:
        return _onnx_attention(query, key, value, attn_mask, scale, is_causal=True)
    return _onnx_attention(query, key, value, _causal_mask(query, key), scale)


def _onnx_attention(
    query: TFloat,
    key: TFloat,
    value: TFloat,
    mask: TFloat | BOOL | None,
    scale: float | None,
    is_causal: bool = False,
) -> TFloat:
    """ONNX Attention on 3-D (a heads axis of 1 is added) or 4-D inputs. Grouped-query inputs (fewer key/value
    heads) are what Attention broadcasts natively."""
    rank = len(query.shape)
    if rank == 3:
        heads_axis = op.Constant(value_ints=[1])
        query, key, value = (
            op.Unsqueeze(query, heads_axis),
            op.Unsqueeze(key, heads_axis),
            op.Unsqueeze(value, heads_axis),
        )
        if mask is not None and len(mask.shape) == 3:
            mask = op.Unsqueeze(mask, heads_axis)
    elif rank != 4:
        raise NotImplementedError("ONNX Attention takes 3-D or 4-D inputs")
    attributes: dict[str, float | int] = {}
    if scale is not None:
        attributes["scale"] = float(scale)
    if is_causal:
        attributes["is_causal"] = 1
    result = opset23.Attention(query, key, value, mask, **attributes)
    return op.Squeeze(result, op.Constant(value_ints=[1])) if rank == 3 else result


def _scale(scale: float, like: TFloat) -> TFloat | None:
    """The scores' scale as a constant, None for a scale of exactly 1 (T5's): x * 1 is x, and a Mul by 1 would cost
    the optimizer a rewrite and a fold to remove."""
    return None if scale == 1 else op.CastLike(scale, like)


def _zero_blocked_rows(scores: TFloat, weights: TFloat) -> TFloat:
    """Zeros for a query whose every score is -inf (the mask blocked every key), as eager's SDPA (_safe_softmax),
    where Softmax gives 0/0; a row holding NaN stays NaN, as in eager. The flags are uint8 (ONNX Runtime has
    ReduceMin for it): a quarter of int32's bytes to write and read, which made this guard cost more than the
    reference exporter's IsNaN + Where (218 us against 161 us per [1, 12, 128, 128] layer; uint8: 147 us)."""
    blocked = op.Cast(op.Equal(scores, op.CastLike(-math.inf, scores)), to=ir.DataType.UINT8)
    every_key_blocked = op.ReduceMin(blocked, op.Constant(value_ints=[-1]), keepdims=True)
    return op.Where(op.Cast(every_key_blocked, to=ir.DataType.BOOL), op.CastLike(0.0, weights), weights)


def _causal_mask(query: TFloat, key: TFloat) -> BOOL:
    """torch's causal mask, aligned top-left: query i attends key j <= i. A constant when both lengths are
    static (every shape stays known), else built from the lengths at run time."""
    queries, keys = query.shape[-2], key.shape[-2]
    if isinstance(queries, int) and isinstance(keys, int):
        return op.Constant(value=ir.tensor(np.tril(np.ones((queries, keys), dtype=bool))))
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    rows = op.Range(zero, op.Squeeze(op.Shape(query, start=-2, end=-1)), one)
    columns = op.Range(zero, op.Squeeze(op.Shape(key, start=-2, end=-1)), one)
    return op.GreaterOrEqual(op.Unsqueeze(rows, op.Constant(value_ints=[1])), columns)


def _causal_bias(query: TFloat, key: TFloat, dtype: ir.DataType) -> TFloat:
    """-inf above the diagonal, 0 on and below it, for `Add(Trilu(scores), bias)`: the scores a causal mask keeps,
    and -inf exactly where it masks (Trilu writes a 0 there, whatever the score: a NaN or inf score of a future key
    does not reach the row, as in eager). What `Where(mask, scores, -inf)` computes, but ONNX Runtime's Where takes
    three passes: 238 us against 143 us per [1, 12, 128, 128] (the reference exporter's inexact Add: 119 us)."""
    queries, keys = query.shape[-2], key.shape[-2]
    if isinstance(queries, int) and isinstance(keys, int):
        bias = np.triu(np.full((queries, keys), -np.inf), k=1)
        return op.Constant(value=ir.tensor(bias.astype(dtype.numpy())))
    zero, minus_infinity = (op.Constant(value=ir.tensor(value, dtype=dtype)) for value in (0.0, -math.inf))
    return op.Where(_causal_mask(query, key), zero, minus_infinity)


def _repeat_heads(tensor: TFloat, groups: int) -> TFloat:
    """repeat_interleave(groups, dim=-3): each key/value head serves `groups` consecutive query heads (GQA)."""
    rank = len(tensor.shape)
    expanded_axis = op.Constant(value_ints=[rank - 2])
    unsqueezed = op.Unsqueeze(tensor, expanded_axis)  # [..., H, 1, S, E]
    leading = op.Shape(tensor, start=0, end=rank - 3)
    heads = op.Shape(tensor, start=rank - 3, end=rank - 2)
    tail = op.Shape(tensor, start=rank - 2)
    group = op.Constant(value_ints=[groups])
    expanded = op.Expand(unsqueezed, op.Concat(leading, heads, group, tail, axis=0))
    return op.Reshape(expanded, op.Concat(leading, op.Mul(heads, group), tail, axis=0))


@lowering("aten::scaled_dot_product_attention")
def scaled_dot_product_attention(
    query: TFloat,
    key: TFloat,
    value: TFloat,
    attn_mask: TFloat | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> TFloat:
    """SDPA with no mask or an additive float mask, any rank, is_causal and GQA, as eager's math path.

    torchlib's handles only 4-D inputs with is_causal. is_causal keeps key j for query i when j <= i (the
    top-left aligned lower triangle, as eager). float16/bfloat16 compute in float32, as eager's CPU kernels.
    Dropout is an identity at inference.
    """
    del dropout_p
    dtype = query.dtype
    low_precision = dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)

    def compute(tensor: TFloat) -> TFloat:
        return op.Cast(tensor, to=ir.DataType.FLOAT) if low_precision else tensor

    q, k, v = compute(query), compute(key), compute(value)
    if enable_gqa:
        query_heads, key_heads = query.shape[-3], key.shape[-3]
        if not (isinstance(query_heads, int) and isinstance(key_heads, int)):
            raise ValueError("scaled_dot_product_attention with enable_gqa needs static head counts")
        if query_heads != key_heads:
            k, v = _repeat_heads(k, query_heads // key_heads), _repeat_heads(v, query_heads // key_heads)
    key_rank = len(key.shape)
    key_transposed = op.Transpose(k, perm=[*range(key_rank - 2), key_rank - 1, key_rank - 2])
    if scale is None:
        head_dim = query.shape[-1]
        if isinstance(head_dim, int):
            scale = 1.0 / math.sqrt(head_dim)
    if scale is None:
        scale_value = op.Div(op.CastLike(1.0, q), op.Sqrt(op.CastLike(op.Shape(q, start=-1), q)))
    else:
        scale_value = _scale(scale, q)
    scores = op.MatMul(q, key_transposed)
    if scale_value is not None:
        scores = op.Mul(scores, scale_value)
    if is_causal:
        compute_type = ir.DataType.FLOAT if low_precision else dtype
        scores = op.Add(op.Trilu(scores, upper=0), _causal_bias(query, key, compute_type))
    if attn_mask is not None:
        scores = op.Add(scores, compute(attn_mask))
    weights = op.Softmax(scores, axis=-1)
    if attn_mask is not None:
        weights = _zero_blocked_rows(scores, weights)
    attended = op.MatMul(weights, v)
    return op.Cast(attended, to=dtype) if low_precision else attended
