"""Indexing and shapes: gather/scatter/index_put, masked ops, nonzero, sorting and searching, unique,
views and reshapes, padding, embedding bags.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8, UINT64
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TTensor, TTensor2
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

from fx2onnx._emit.context import LoweringContext
from fx2onnx._lowerings.builders import (
    _LOW_PRECISION,
    _NARROW_INTS,
    TFloat,
    TIndex,
    TOther,
    TReal,
    _back,
    _const,
    _flat,
    _in_float32,
    _negative_or_negative_zero,
    _positive_zero,
    _widened,
)
from fx2onnx._lowerings.kernels import double
from fx2onnx._lowerings.rules import lowering
from fx2onnx._lowerings.symbolic import check_node
from fx2onnx._records import CHECK_PREFIX, RUNTIME_CHECK, RUNTIME_CHECK_REASON


# --- dtype helpers -----------------------------------------------------------------------------------------------
def _as(value: TFloat, dtype: ir.DataType) -> TFloat:
    return op.Cast(value, to=dtype) if value.dtype != dtype else value


# --- embedding_renorm ---------------------------------------------------------------------------------------------
def _row_norms(rows: TFloat, norm_type: float) -> TFloat:
    """Each row's p-norm (keepdims), as ``row.norm(p)``: 0 counts the nonzeros, +-inf the largest/smallest |x|."""
    axes = op.Constant(value_ints=[1])
    if norm_type == 1:
        return op.ReduceL1(rows, axes, keepdims=True)
    if norm_type == 2:
        return op.ReduceL2(rows, axes, keepdims=True)
    if norm_type == math.inf:
        return op.ReduceMax(op.Abs(rows), axes, keepdims=True)
    if norm_type == -math.inf:
        return op.ReduceMin(op.Abs(rows), axes, keepdims=True)
    if norm_type == 0:
        nonzero = op.Cast(op.Not(op.Equal(rows, _const(0.0, rows))), to=rows.dtype)
        return op.ReduceSum(nonzero, axes, keepdims=True)
    powers = op.ReduceSum(op.Pow(op.Abs(rows), _const(norm_type, rows)), axes, keepdims=True)
    return op.Pow(powers, _const(1.0 / norm_type, rows))


@lowering("aten::embedding_renorm")
def embedding_renorm(weight: TFloat, indices: INT64, max_norm: float, norm_type: float = 2.0) -> TFloat:
    """eager's loop over the distinct indices: a row whose norm (in the weight's dtype) exceeds max_norm is
    multiplied by max_norm / (norm + 1e-7), taken in double and rounded to the weight's dtype."""
    unique = op.Unique(indices)[0]
    rows = _in_float32(op.Gather(weight, unique))
    norms = _as(_back(_row_norms(rows, norm_type), weight), ir.DataType.DOUBLE)
    limit = op.Constant(value=ir.tensor(float(max_norm), dtype=ir.DataType.DOUBLE))
    scale = op.Div(limit, op.Add(norms, op.Constant(value=ir.tensor(1e-7, dtype=ir.DataType.DOUBLE))))
    scaled = op.Mul(rows, _in_float32(_as(scale, weight.dtype)))
    renormed = _back(op.Where(op.Greater(norms, limit), scaled, rows), weight)
    return op.ScatterND(weight, op.Unsqueeze(unique, op.Constant(value_ints=[1])), renormed)


# --- shapes ---------------------------------------------------------------------------------------------------
def _squeezed(ctx: LoweringContext, self: TReal, dims: Sequence[int]) -> TReal:
    """Eager squeezes only the listed dims of size 1; any other is left as it is. torch decides a symbolic dim whose
    range holds 1 (``nonzero(x).squeeze(0)``'s count, a dynamic dim traced size-obliviously) as not 1 without a
    guard, keeping it where eager drops it at size 1: a run-time check refuses that size (no graph of one rank gives
    eager's other). torchlib's Squeeze of a dim of size 4 fails the checker."""
    rank = len(self.shape)
    axes = sorted({d % rank for d in dims}) if rank else []
    for axis in axes:
        if not isinstance(self.shape[axis], int):
            _check_not_one(ctx, self, axis)
    axes = [a for a in axes if self.shape[a] == 1]
    return op.Squeeze(self, op.Constant(value_ints=axes)) if axes else op.Identity(self)


def _check_not_one(ctx: LoweringContext, self: TReal, axis: int) -> None:
    """A run-time check that the symbolic dim `axis` the capture kept is not 1, where its range holds 1."""
    size = ctx.node.args[0].meta["val"].shape[axis]
    if not isinstance(size, torch.SymInt) or statically_known_true(size != 1):
        return
    kind = "data-dependent" if free_unbacked_symbols(size) else "dynamic"
    expression = f"Ne({size.node.expr}, 1)"
    size_value = op.Squeeze(op.Shape(self, start=axis, end=axis + 1))
    zero = check_node(op.Not(op.Equal(size_value, op.Constant(value_int=1))), ctx.fresh_name(CHECK_PREFIX))
    zero.producer().metadata_props[RUNTIME_CHECK] = expression
    zero.producer().metadata_props[RUNTIME_CHECK_REASON] = (
        f"squeeze({axis}) of a {kind} size: the ONNX graph keeps that dim, eager drops it at size 1"
    )


@lowering("aten::squeeze.dim", context=True)
def squeeze_dim(ctx: LoweringContext, self: TReal, dim: int) -> TReal:
    return _squeezed(ctx, self, [dim])


def _shape_value(shape: Sequence[int | INT64]) -> INT64:
    """A 1-D INT64 shape from torch's sizes (constants, or symbolic sizes as 0-d values)."""
    if all(isinstance(d, int) for d in shape):
        return op.Constant(value_ints=list(shape))
    parts = []
    for d in shape:
        part = op.Constant(value_ints=[d]) if isinstance(d, int) else op.Reshape(d, op.Constant(value_ints=[-1]))
        if part.dtype is None:
            part.dtype = ir.DataType.INT64  # for Concat's type inference
        parts.append(part)
    return op.Concat(*parts, axis=0)


@lowering("aten::reshape", "aten::view", "aten::_unsafe_view")
def reshape(self: TReal, shape: Sequence[INT64]) -> TReal:
    """torch's sizes are literal: a 0 is an empty dim (allowzero=1), never ONNX's "copy the input's dim"
    (torchlib's Reshape of a (1, 1, 0) tensor to (1, 0) fails the checker)."""
    literal_zero = any(isinstance(d, int) and d == 0 for d in shape)
    return op.Reshape(self, _shape_value(shape), allowzero=1 if literal_zero else 0)


@lowering("aten::flatten.using_ints")
def flatten(self: TReal, start_dim: int = 0, end_dim: int = -1) -> TReal:
    """Dims start_dim..end_dim merged into their product, built from the shape without a -1 (torchlib's
    Reshape of an empty tensor to [head, -1] fails the checker: a -1 cannot be inferred beside a 0)."""
    rank = len(self.shape)
    if rank == 0:
        return op.Reshape(self, op.Constant(value_ints=[1]))
    start, end = start_dim % rank, end_dim % rank
    if start == end:
        return op.Identity(self)
    merged = op.ReduceProd(op.Shape(self, start=start, end=end + 1), keepdims=1)
    parts = [op.Shape(self, start=0, end=start)] if start > 0 else []
    parts.append(merged)
    if end + 1 < rank:
        parts.append(op.Shape(self, start=end + 1))
    return op.Reshape(self, op.Concat(*parts, axis=0), allowzero=1)


@lowering("aten::cat")
def cat(tensors: Sequence[TReal], dim: int = 0) -> TReal:
    """Concat, without the 1-D empty tensors eager ignores beside tensors of any rank; a cat of only those is
    one of them (torchlib asserts there: "received all None or empty tensors")."""
    kept = [t for t in tensors if t is not None and not (t.shape is not None and tuple(t.shape) == (0,))]
    if not kept:
        return op.Identity(tensors[0])
    if len(kept) == 1:
        return op.Identity(kept[0])
    return op.Concat(*kept, axis=dim)


@lowering("aten::topk")
def topk(self: TReal, k: INT64, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[TReal, INT64]:
    """TopK; a 0-d tensor (k is 0 or 1; eager returns it and index 0) has no axis for ONNX's TopK. `k` may be
    symbolic (detection heads keep ``min(K, number of candidates)``): TopK takes it as a tensor."""
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value=ir.tensor(np.array(0, dtype=np.int64)))
    count = op.Constant(value_ints=[k]) if isinstance(k, int) else op.Reshape(k, op.Constant(value_ints=[1]))
    values, indices = op.TopK(self, count, axis=dim, largest=largest, sorted=sorted)
    return values, indices


# --- selection and signs ---------------------------------------------------------------------------------------
@lowering("aten::masked_select")
def masked_select(self: TReal, mask: BOOL) -> TReal:
    """The elements where `mask` (broadcast with `self`) is true, flattened: a Compress of both, flattened."""
    both = op.Shape(op.Where(mask, self, self))  # the broadcast shape of self and mask
    flat_self = op.Reshape(op.Expand(self, both), op.Constant(value_ints=[-1]))
    flat_mask = op.Reshape(op.Expand(mask, both), op.Constant(value_ints=[-1]))
    return op.Compress(flat_self, flat_mask, axis=0)


@lowering("aten::copysign.Tensor")
def copysign(self: TFloat, other: TFloat) -> TFloat:
    """|self| with the sign bit of `other`, -0.0 included (torchlib's Less(other, 0) misses it). The magnitude's
    zero is made +0.0 (ONNX Runtime's Abs(-0.0) is -0.0), then multiplied by -1 where `other`'s sign bit is set: a
    product, not a Where picking Neg(magnitude), since ONNX Runtime's Where turns a -0.0 from its first branch into
    +0.0 (docs/ort-defects.md). A NaN's sign bit is not visible in ONNX: copysign(x, NaN) is |x|."""
    magnitude = _positive_zero(op.Abs(self))
    sign = op.Where(_negative_or_negative_zero(other), _const(-1.0, self), _const(1.0, self))
    return op.Mul(magnitude, sign)


@lowering("aten::copysign.Scalar")
def copysign_scalar(self: TFloat, other: float) -> TFloat:
    """copysign(x, number): the number's sign bit is known at export (torch's decomposition needs
    prims::scalar_tensor)."""
    return op.Mul(_positive_zero(op.Abs(self)), _const(math.copysign(1.0, float(other)), self))


# --- searching sorted boundaries -------------------------------------------------------------------------------
def _count_below(values: TReal, sorted_sequence: TReal, right: bool, out_int32: bool) -> INT64:
    """For each value, how many sequence entries (last axis) are < it (<= it when `right`).

    Counted as eager's binary search compares: an entry is below unless it is >= the value (> when `right`), so a
    NaN value is above every entry (bucket len(sequence), as in eager; Less would put it in bucket 0)."""
    if sorted_sequence.shape is not None and len(sorted_sequence.shape) and sorted_sequence.shape[-1] == 0:
        # ONNX Runtime's ReduceSum over an empty axis keeps the axis: the count is 0 everywhere.
        zeros = op.Expand(op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64)), op.Shape(values))
        return op.Cast(zeros, to=INT32.dtype) if out_int32 else zeros
    length = sorted_sequence.shape[-1] if sorted_sequence.shape is not None and len(sorted_sequence.shape) else None
    if isinstance(length, int):
        counts = _binary_search(values, sorted_sequence, right, length)
        return op.Cast(counts, to=INT32.dtype) if out_int32 else counts
    pairs = op.Unsqueeze(values, op.Constant(value_ints=[-1]))
    below = op.Not(op.Greater(sorted_sequence, pairs) if right else op.GreaterOrEqual(sorted_sequence, pairs))
    counts = op.ReduceSum(op.Cast(below, to=INT64.dtype), op.Constant(value_ints=[-1]), keepdims=False)
    return op.Cast(counts, to=INT32.dtype) if out_int32 else counts


def _binary_search(values: TReal, sequence: TReal, right: bool, length: int) -> INT64:
    """Eager's binary search, step by step: `start` moves past a probed entry unless it is >= the value (> when
    `right`), else `end` comes down to it. On a sorted sequence this is the count of entries below; with NaN among
    the entries (which eager's comparisons put below every value wherever it is probed) the result is the one
    eager's probes give ([1, 2, nan]: -5 -> 0, 2.5 -> 3), where a count took the NaN below every value (-5 -> 1).
    `sequence` is 1-D (any values) or [..., length] beside values [..., k]."""
    shape = op.Shape(values)
    start = op.Expand(_int64_scalar(0), shape)
    end = op.Expand(_int64_scalar(length), shape)
    one, last = _int64_scalar(1), _int64_scalar(length - 1)
    rows = len(sequence.shape) > 1
    for _ in range(length.bit_length()):  # each step at least halves end - start, from `length`
        active = op.Less(start, end)
        middle = op.Add(start, op.Div(op.Sub(end, start), _int64_scalar(2)))
        probe = op.Min(middle, last)  # a finished search probes a valid entry, unused
        probed = op.GatherElements(sequence, probe, axis=-1) if rows else op.Gather(sequence, probe)
        above = op.Greater(probed, values) if right else op.GreaterOrEqual(probed, values)
        start = op.Where(op.And(active, op.Not(above)), op.Add(middle, one), start)
        end = op.Where(op.And(active, above), middle, end)
    return start


def _int64_scalar(value: int) -> INT64:
    return op.Constant(value=ir.tensor(value, dtype=ir.DataType.INT64))


@lowering("aten::bucketize.Tensor")
def bucketize(self: TReal, boundaries: TReal, out_int32: bool = False, right: bool = False) -> INT64:
    """torch.bucketize: a count of the (1-D) boundaries below each value (torch decomposes it data-dependently)."""
    return _count_below(self, boundaries, right, out_int32)


@lowering("aten::searchsorted.Tensor")
def searchsorted(
    sorted_sequence: TReal,
    self: TReal,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: INT64 | None = None,
) -> INT64:
    """torch.searchsorted over the last axis (a 1-D sequence serves every value)."""
    if sorter is not None:
        sorted_sequence = op.GatherElements(sorted_sequence, sorter, axis=-1)
    length = sorted_sequence.shape[-1]
    sequence = sorted_sequence
    if len(sorted_sequence.shape) > 1 and not isinstance(length, int):  # counted: pair each of [..., k] with its row
        sequence = op.Unsqueeze(sorted_sequence, op.Constant(value_ints=[-2]))
    return _count_below(self, sequence, right or side == "right", out_int32)


# --- nonzero of a 0-d tensor ------------------------------------------------------------------------------------
@lowering("aten::nonzero")
def nonzero(self: TReal) -> INT64:
    """Indices of the non-zero elements, [count, rank]; a 0-d input gives [0 or 1, 0] as in eager."""
    rank = len(self.shape)
    flat = op.Reshape(self, op.Constant(value_ints=[-1])) if rank == 0 else self
    indices = op.Transpose(op.NonZero(flat), perm=[1, 0])
    if rank == 0:
        return op.Slice(indices, op.Constant(value_ints=[0]), op.Constant(value_ints=[0]), op.Constant(value_ints=[1]))
    return indices


# --- diagonals, products over a dim of a scalar, atleast_Nd of lists ---------------------------------------------
@lowering("aten::diagonal", "aten::diagonal_copy")
def diagonal(self: TReal, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TReal:
    """A Gather of the diagonal's flat positions: the same ops for every dtype.

    dim1 and dim2 move last, are flattened into one axis, and positions i*m + i + offset are gathered; the
    diagonal ends up as the last axis, as in eager. (torchlib's multiplies by an identity mask, which
    narrow integers do not run.) Needs the two dims' sizes to be static.
    """
    rank = len(self.shape)
    dim1, dim2 = dim1 % rank, dim2 % rank
    rows, columns = self.shape[dim1], self.shape[dim2]
    if not isinstance(rows, int) or not isinstance(columns, int):
        raise NotImplementedError("diagonal over dynamic dims has no lowering here")
    rest = [d for d in range(rank) if d not in (dim1, dim2)]
    moved = op.Transpose(self, perm=[*rest, dim1, dim2])
    if rows * columns == 0:  # an empty diagonal: Reshape's 0 would copy a dim, so the zero is spelt allowzero
        kept = op.Shape(moved, start=0, end=len(rest))
        return op.Reshape(moved, op.Concat(kept, op.Constant(value_ints=[0]), axis=0), allowzero=1)
    flat = op.Reshape(moved, op.Constant(value_ints=[*([0] * len(rest)), rows * columns]))
    if offset >= 0:
        length = max(0, min(rows, columns - offset))
        positions = [i * columns + i + offset for i in range(length)]
    else:
        length = max(0, min(rows + offset, columns))
        positions = [(i - offset) * columns + i for i in range(length)]
    indices = op.Constant(value=ir.tensor(positions, dtype=ir.DataType.INT64))
    return op.Gather(flat, indices, axis=len(rest))


def _at_least(tensor: TReal, rank: int) -> TReal:
    """torch.atleast_{1,2,3}d of one tensor: 0-d -> all ones; 1-d [n] -> [1, n] or [1, n, 1]; 2-d -> [m, n, 1]."""
    current = len(tensor.shape)
    if current >= rank:
        return op.Identity(tensor)
    if current == 0:
        return op.Reshape(tensor, op.Constant(value_ints=[1] * rank))
    axes = {(1, 2): [0], (1, 3): [0, 2], (2, 3): [2]}[(current, rank)]
    return op.Unsqueeze(tensor, op.Constant(value_ints=axes))


@lowering("aten::atleast_1d.Sequence")
def atleast_1d_sequence(tensors: Sequence[TReal]) -> Sequence[TReal]:
    """Each tensor reshaped on its own (torchlib's SequenceMap with a graph body does not run everywhere)."""
    return [_at_least(t, 1) for t in tensors]


@lowering("aten::atleast_2d.Sequence")
def atleast_2d_sequence(tensors: Sequence[TReal]) -> Sequence[TReal]:
    return [_at_least(t, 2) for t in tensors]


@lowering("aten::atleast_3d.Sequence")
def atleast_3d_sequence(tensors: Sequence[TReal]) -> Sequence[TReal]:
    return [_at_least(t, 3) for t in tensors]


# --- index_reduce --------------------------------------------------------------------------------------------------
_IDENTITY = {"amax": float("-inf"), "amin": float("inf"), "prod": 1.0, "mean": 0.0}


_SCATTER_REDUCTION = {"amax": "max", "amin": "min", "prod": "mul", "mean": "add"}


def _compute_type(value: TReal) -> TReal:
    """float16/bfloat16 -> float32, narrow ints -> int32: types every ScatterElements reduction runs in."""
    if value.dtype in _LOW_PRECISION:
        return op.Cast(value, to=FLOAT.dtype)
    return _widened(value)


def floor_divide_by_positive(total: TReal, counts: TReal) -> TReal:
    """Integer floor division by positive counts, in integers (through float64, int64 sums above 2**53 rounded):
    truncating Div, minus one where a negative total leaves a remainder.

    No zero guard (elementwise's `_divisor`): every count is at least 1 by construction (a position starts at 1,
    or at 0 where the index touches it and then gains 1 per touch), an empty total has empty counts, and a
    constant count (a constant index) holds no zero for ONNX Runtime to refuse at session creation."""
    zero = op.CastLike(0, total)
    inexact_negative = op.And(op.Less(total, zero), op.Not(op.Equal(op.Mod(total, counts, fmod=1), zero)))
    return op.Sub(op.Div(total, counts), op.CastLike(inexact_negative, total))


def _identity_for(reduce: str, like: TReal) -> TReal:
    value = _IDENTITY[reduce]
    if like.dtype in (ir.DataType.INT32, ir.DataType.INT64) and reduce in ("amax", "amin"):
        info = np.iinfo(np.int32 if like.dtype == ir.DataType.INT32 else np.int64)
        value = info.min if reduce == "amax" else info.max
    if like.dtype in (ir.DataType.INT32, ir.DataType.INT64):
        return op.Constant(value=ir.tensor(int(value), dtype=like.dtype))
    return _const(value, like)


# Eager's index_put into a bool tensor converts the values to bool and accumulates by or (True + True stays True).
# index_add of a bool tensor decomposes to index_put(self, source * alpha, accumulate=True), int64 values for an
# int alpha, which torchlib's index_put summed in int64 (True + True * -1 -> False; fuzz seeds 10002446, 10002802).
@lowering("aten::index_put", variant="bool")
def index_put_bool(self: BOOL, indices: Sequence[INT64 | BOOL | None], values: TReal, accumulate: bool = False) -> BOOL:
    from onnxscript.function_libs.torch_lib.ops.core import aten_index_put

    flags = values if values.dtype == ir.DataType.BOOL else op.Not(op.Equal(values, op.CastLike(0, values)))
    if not accumulate:
        return aten_index_put(self, indices, flags, accumulate)
    counts = aten_index_put(op.Cast(self, to=INT64.dtype), indices, op.Cast(flags, to=INT64.dtype), True)
    return op.Greater(counts, op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64)))


def _nan_propagated(result: TReal, base: TReal, positions: INT64, values: TReal, axis: int) -> TReal:
    """A max/min ScatterElements' result NaN where self (`base`) or a value reduced into it is NaN, as eager's
    amax/amin (scatter_reduce and index_reduce alike); ONNX Runtime's max/min may drop it (index_reduce of a NaN in
    self: found probing the fuzzer's limits catalogue)."""
    if base.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        return result
    nan_base = op.Cast(op.IsNaN(base), to=INT32.dtype)
    nan_values = op.Cast(op.IsNaN(values), to=INT32.dtype)
    seen_nan = op.ScatterElements(nan_base, positions, nan_values, axis=axis, reduction="max")
    return op.Where(op.Cast(seen_nan, to=BOOL.dtype), op.CastLike(float("nan"), base), result)


@lowering("aten::index_reduce")
def index_reduce(self: TReal, dim: int, index: INT64, source: TReal, reduce: str, include_self: bool = True) -> TReal:
    """Reduce `source` slices into `self` at `index` along `dim` (amax, amin, prod, mean) with ScatterElements.

    Without include_self, the positions `index` touches start from the reduction's identity; mean divides
    by the number of values reduced into each position (floor division for integers, as in eager).
    """
    scalar = len(self.shape) == 0
    if source.shape is not None and 0 in source.shape:
        # Nothing is reduced (no index, or self is empty too): self as it is. The Expand of the index to an empty
        # source's shape below is removed by ONNX Runtime's basic graph optimizations (index [k] reshaped to
        # [k, 1] then meets the [k, 0] values: ScatterElements refuses the run).
        return op.Identity(self)
    one = op.Constant(value_ints=[1])
    base = _compute_type(op.Reshape(self, one) if scalar else self)
    values = _compute_type(op.Reshape(source, one) if scalar else source)
    rank = 1 if scalar else len(self.shape)
    axis = dim % rank
    index_shape = [1] * rank
    index_shape[axis] = -1
    positions = op.Expand(op.Reshape(index, op.Constant(value_ints=index_shape)), op.Shape(values))
    reduction = _SCATTER_REDUCTION[reduce]
    identity = _identity_for(reduce, base)
    if not include_self:  # touched positions forget self's value
        base = op.ScatterElements(base, positions, op.Expand(identity, op.Shape(values)), axis=axis)
    result = op.ScatterElements(base, positions, values, axis=axis, reduction=reduction)
    if reduction in ("max", "min"):
        result = _nan_propagated(result, base, positions, values, axis)
    if reduce == "mean":
        ones = op.Expand(op.CastLike(1, base), op.Shape(base))
        counts = ones
        zeros_at = op.Expand(op.CastLike(0, base), op.Shape(values))
        ones_at = op.Expand(op.CastLike(1, base), op.Shape(values))
        if not include_self:
            counts = op.ScatterElements(ones, positions, zeros_at, axis=axis)
        counts = op.ScatterElements(counts, positions, ones_at, axis=axis, reduction="add")
        if base.dtype in (ir.DataType.INT32, ir.DataType.INT64):
            # The sum wraps in self's dtype before the division, as eager's index_add does.
            total = op.Cast(op.Cast(result, to=self.dtype), to=result.dtype) if result.dtype != self.dtype else result
            result = floor_divide_by_positive(total, counts)
        else:
            result = op.Div(result, counts)
    if scalar:
        result = op.Reshape(result, op.Constant(value_ints=[]))
    return op.Cast(result, to=self.dtype) if result.dtype != self.dtype else result


# --- padding with negative amounts, linspace, cross entropy with class probabilities -----------------------------
_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@lowering("aten::pad")
def pad(self: TReal, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> TReal:
    """torch.nn.functional.pad with negative amounts (crops), which ONNX Runtime's edge and wrap modes refuse.

    Eager's circular mode crops before wrapping; its replicate mode indexes as if padding came first (a
    crop larger than the input repeats the edge), so there the crop follows. `pad` lists (before, after)
    pairs from the last dim backwards. An empty tensor pads in constant mode: no values to repeat.
    """
    rank = len(self.shape)
    befores, afters = [0] * rank, [0] * rank
    for offset in range(len(pad) // 2):
        befores[rank - 1 - offset], afters[rank - 1 - offset] = pad[2 * offset], pad[2 * offset + 1]
    crop_axes = [a for a in range(rank) if befores[a] < 0 or afters[a] < 0]

    def crop(x: TReal) -> TReal:
        if not crop_axes:
            return x
        starts = [max(0, -befores[a]) for a in crop_axes]
        ends = [afters[a] if afters[a] < 0 else 2**62 for a in crop_axes]
        return op.Slice(
            x, op.Constant(value_ints=starts), op.Constant(value_ints=ends), op.Constant(value_ints=crop_axes)
        )

    x = crop(self) if mode == "circular" else self
    amounts = [max(0, b) for b in befores] + [max(0, a) for a in afters]
    if any(amounts):
        empty = any(isinstance(d, int) and d == 0 for d in self.shape)
        onnx_mode = "constant" if empty else _PAD_MODES[mode]
        fill = op.CastLike(value if value is not None else 0, x) if onnx_mode == "constant" else None
        x = op.Pad(x, op.Constant(value_ints=amounts), fill, mode=onnx_mode)
    if mode != "circular":
        x = crop(x)
    return op.Identity(x) if x is self else x


@lowering("aten::flip")
def flip(self: TTensor, dims: Sequence[int]) -> TTensor:
    """Eager flips a 0-d tensor over dim 0 or -1 as a copy; torchlib's Slice over axis 0 of a 0-d value failed the
    checker (fuzz seed 10002538: masked_scatter(x, mask, x.flip(0)) of 0-d tensors)."""
    from onnxscript.function_libs.torch_lib.ops.core import aten_flip

    if self.shape is not None and len(self.shape) == 0:
        return op.Identity(self)
    return aten_flip(self, dims)


def _rolled(x: TTensor, shift: int, axis: int) -> TTensor:
    """x rolled by `shift` along `axis`: its last `shift` (mod n) slices first. n may be 0 at run time (a data-dependent
    length): the modulus is then 1, and both slices are empty."""
    axes = op.Constant(value_ints=[axis])
    length = op.Shape(x, start=axis, end=axis + 1)
    start = op.Mod(op.Constant(value_ints=[-shift]), op.Max(length, op.Constant(value_ints=[1])))
    head = op.Slice(x, start, length, axes)
    tail = op.Slice(x, op.Constant(value_ints=[0]), start, axes)
    return op.Concat(head, tail, axis=axis)


@lowering("aten::roll")
def roll(self: TTensor, shifts: Sequence[int], dims: Sequence[int] = ()) -> TTensor:
    """torch.roll. A length of 0 known only at run time made torchlib's Mod divide by zero (fuzz seed 50002633:
    roll of masked_select's empty result, a run error)."""
    rank = len(self.shape)
    if rank == 0:
        return op.Identity(self)
    if not dims:
        flat = op.Reshape(self, op.Constant(value_ints=[-1]))
        return op.Reshape(_rolled(flat, shifts[0], 0), op.Shape(self), allowzero=1)
    result = self
    for shift, dim in zip(shifts, dims):
        result = _rolled(result, shift, dim % rank)
    return result


@lowering("aten::unfold")
def unfold(self: TTensor, dimension: int, size: int, step: int) -> TTensor:
    """Eager unfolds a 0-d tensor into [x] for a size of 1 and into no element for a size of 0; torchlib's Unsqueeze
    is [x] for both (size 0 failed the checker: fuzz seed 50000349)."""
    from onnxscript.function_libs.torch_lib.ops.core import aten_unfold

    if self.shape is not None and len(self.shape) == 0:
        one = op.Unsqueeze(self, op.Constant(value_ints=[0]))
        return op.Slice(one, op.Constant(value_ints=[0]), op.Constant(value_ints=[size])) if size == 0 else one
    return aten_unfold(self, dimension, size, step)


@lowering("aten::numpy_T")
def numpy_t(self: TReal) -> TReal:
    return op.Transpose(self, perm=list(reversed(range(len(self.shape)))))


@lowering("aten::squeeze.dims", context=True)
def squeeze_dims(ctx: LoweringContext, self: TReal, dim: Sequence[int]) -> TReal:
    """Eager drops only the listed dims that have size 1 (others stay); a 0-d tensor stays as it is."""
    return _squeezed(ctx, self, dim)


# Every real dtype eager sorts, bool included (torchlib's aten_sort takes no bool). Types the
# target's TopK lacks (bool, int16, bfloat16 on ONNX Runtime CPU) are left to legalization.
TSortable = TypeVar("TSortable", BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8)


@lowering("aten::sort.stable")
def sort_stable(
    self: TSortable, stable: bool | None = None, dim: int = -1, descending: bool = False
) -> tuple[TSortable, INT64]:
    """``torch.sort(x, stable=...)``: a TopK over the whole dimension.

    ONNX's TopK puts equal elements in index order, in either direction, which is the order a
    stable sort keeps; an unstable sort may return any order of ties, so that order serves too.
    """
    del stable
    rank = len(self.shape)
    if rank == 0:
        return op.Identity(self), op.Constant(value_int=0)
    axis = dim % rank
    size = op.Shape(self, start=axis, end=axis + 1)
    return op.TopK(self, size, axis=axis, largest=descending, sorted=True)


# --- nonzero: float32 would turn tiny values into 0 and drop them from the indices ------------------------------
def _nonzero_mask(self: DOUBLE) -> BOOL:
    """x != 0, NaN included, as eager's nonzero tests it."""
    return op.Not(op.Equal(self, double(0.0)))


def _nonzero_indices(self: DOUBLE) -> INT64:
    """[count, max(rank, 1)] indices of the non-zero elements (a 0-d input as a 1-element vector)."""
    mask = _nonzero_mask(self)
    flat = op.Reshape(mask, op.Constant(value_ints=[-1])) if len(self.shape) == 0 else mask
    return op.Transpose(op.NonZero(flat), perm=[1, 0])


@lowering("aten::nonzero", variant="float64")
def nonzero_float64(self: DOUBLE) -> INT64:
    """Indices of the non-zero elements, [count, rank]; a 0-d input gives [0 or 1, 0] as in eager."""
    indices = _nonzero_indices(self)
    if len(self.shape) == 0:
        return op.Slice(indices, op.Constant(value_ints=[0]), op.Constant(value_ints=[0]), op.Constant(value_ints=[1]))
    return indices


@lowering("aten::nonzero_static", variant="float64")
def nonzero_static(self: DOUBLE, size: int, fill_value: int = -1) -> INT64:
    """The first `size` rows of nonzero's indices, padded with `fill_value` rows."""
    rank = len(self.shape)
    columns = max(rank, 1)
    padding = op.Expand(
        op.Constant(value=ir.tensor([fill_value], dtype=ir.DataType.INT64)), op.Constant(value_ints=[size, columns])
    )
    padded = op.Concat(_nonzero_indices(self), padding, axis=0)
    starts, ends = op.Constant(value_ints=[0, 0]), op.Constant(value_ints=[size, rank])
    return op.Slice(padded, starts, ends, op.Constant(value_ints=[0, 1]))


@lowering("aten::masked_scatter")
def masked_scatter(self: TTensor, mask: BOOL, source: TTensor) -> TTensor:
    """source's leading elements, in order, where the (broadcast) mask is true. The mask stays bool: torchlib's
    takes it in self's dtype (NonZero of a float64 mask would run in float32, a bool mask Cast to bool fails the
    checker). Scattered into self flattened: ScatterND refuses 0-d data, which eager takes. The result has the
    broadcast shape of self and mask, as in eager (a mask of more dims than self widens it)."""
    flat = op.Constant(value_ints=[-1])
    shape = op.Shape(op.Where(mask, self, self))  # the broadcast shape of self and mask
    full_mask = op.Reshape(op.Expand(mask, shape), flat)
    indices = op.Transpose(op.NonZero(full_mask), perm=[1, 0])
    count = op.Shape(indices, start=0, end=1)
    updates = op.Slice(op.Reshape(source, flat), op.Constant(value_ints=[0]), count)
    scattered = op.ScatterND(op.Reshape(op.Expand(self, shape), flat), indices, updates)
    return op.Reshape(scattered, shape, allowzero=1)  # an empty dim of the shape is 0, not a copied dim


_INTEGERS = (*_NARROW_INTS, ir.DataType.INT32, ir.DataType.INT64)


def _static_shape(value: TReal, what: str) -> list[int]:
    shape = list(value.shape) if value.shape is not None else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise NotImplementedError(f"{what} over a tensor of dynamic shape has no lowering here")
    return shape


def _const_ints(values: np.ndarray | Sequence[int]) -> INT64:
    return op.Constant(value=ir.tensor(np.asarray(values, dtype=np.int64)))


def _flat_indexing(value: TReal) -> TReal:
    return op.Reshape(value, op.Constant(value_ints=[-1]))


# --- scatter with a reduction --------------------------------------------------------------------------------
# ONNX Runtime's ScatterElements reduces float16/bfloat16 with no kernel (add, mul) and bool with none (max,
# min); those compute in float32 / int32 and round back. Integer sums and products wrap alike in any width.
def _compute_type_indexing(value: TReal) -> TReal:
    if value.dtype in _LOW_PRECISION:
        return op.Cast(value, to=FLOAT.dtype)
    if value.dtype in (*_NARROW_INTS, ir.DataType.BOOL):
        return op.Cast(value, to=INT32.dtype)
    return value


_REDUCTIONS = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min"}


def _no_index(index: INT64) -> bool:
    """An index of no element (a static 0 dim): eager gathers nothing and writes nothing, whatever its other dims."""
    return index.shape is not None and any(isinstance(size, int) and size == 0 for size in index.shape)


@lowering("aten::gather")
def gather(self: TTensor, dim: int, index: INT64, sparse_grad: bool = False) -> TTensor:
    """Eager's gather of an index of no element is empty even where its other dims exceed self's, which
    GatherElements refuses (x of [3, 0] gathered by a [0, 3] index)."""
    from onnxscript.function_libs.torch_lib.ops.core import aten_gather

    if _no_index(index):
        return op.Expand(op.CastLike(0, self), op.Shape(index))
    return aten_gather(self, dim, index, sparse_grad)


def _scatter_reduce(self: TReal, dim: int, index: INT64, src: TReal | None, reduce: str, include_self: bool) -> TReal:
    """self with src's elements at `index` (along `dim`) reduced into it; `src` None: `index`'s shape of zeros.

    `src` may be larger than `index`: only its leading part (index's shape) takes part, as in eager. Without
    include_self, the positions `index` touches start from the reduction's identity; mean divides by the
    number of values reduced into each position (floor division for integers, as eager does).
    """
    if _no_index(index):  # (ScatterElements refuses such an index where its other dims exceed self's)
        return op.Identity(self)
    scalar = len(self.shape) == 0
    one = op.Constant(value_ints=[1])
    rank = 1 if scalar else len(self.shape)
    axis = dim % rank
    positions = op.Reshape(index, one) if scalar else index
    if scalar:
        updates = op.Reshape(src, one)
    else:
        starts = op.Constant(value_ints=[0] * rank)
        updates = op.Slice(src, starts, op.Shape(positions), op.Constant(value_ints=list(range(rank))))
    base = _compute_type_indexing(op.Reshape(self, one) if scalar else self)
    values = _compute_type_indexing(updates)
    reduction = "add" if reduce == "mean" else _REDUCTIONS[reduce]
    if not include_self:  # touched positions forget self's value
        identity = _identity_for({"add": "mean", "mul": "prod", "max": "amax", "min": "amin"}[reduction], base)
        base = op.ScatterElements(base, positions, op.Expand(identity, op.Shape(positions)), axis=axis)
    result = op.ScatterElements(base, positions, values, axis=axis, reduction=reduction)
    if reduction in ("max", "min"):
        result = _nan_propagated(result, base, positions, values, axis)
    if reduce == "mean":
        ones = op.Expand(op.CastLike(1, base), op.Shape(base))
        counts = ones
        if not include_self:
            counts = op.ScatterElements(
                ones, positions, op.Expand(op.CastLike(0, base), op.Shape(positions)), axis=axis
            )
        counts = op.ScatterElements(
            counts, positions, op.Expand(op.CastLike(1, base), op.Shape(positions)), axis=axis, reduction="add"
        )
        if self.dtype in _INTEGERS:  # the sum wraps in self's dtype before the floor division, as in eager
            total = op.Cast(op.Cast(result, to=self.dtype), to=result.dtype)
            result = floor_divide_by_positive(total, counts)
        else:
            result = op.Div(result, counts)
    if scalar:
        result = op.Reshape(result, op.Constant(value_ints=[]))
    return op.Cast(result, to=self.dtype) if result.dtype != self.dtype else result


@lowering("aten::copy")
def copy(self: TTensor, src: TTensor2, non_blocking: bool = False) -> TTensor:
    """src converted to self's dtype and broadcast to self's shape, as eager's copy_ broadcasts (t[1:].copy_(t[0]),
    an in-place write through a view, becomes copy then slice_scatter). torchlib's CastLike kept src's shape, and
    ScatterND refused the update at run time (fuzz seeds 60000391, 60000551)."""
    converted = op.CastLike(src, self)
    if self.shape is not None and src.shape is not None and self.shape.is_static() and self.shape == src.shape:
        return converted
    return op.Expand(converted, op.Shape(self))


@lowering("aten::scatter.src")
def scatter_src(self: TTensor, dim: int, index: INT64, src: TTensor) -> TTensor:
    """self with src's elements written at `index` along `dim`. Only src's leading part (index's shape) is
    written, as in eager: ScatterElements takes updates of index's shape exactly (torchlib passes src whole, which
    ONNX Runtime refuses when src is larger). A 0-d self is scattered as one element; an index of no element
    writes nothing."""
    if _no_index(index):
        return op.Identity(self)
    scalar = len(self.shape) == 0
    one = op.Constant(value_ints=[1])
    if scalar:
        written = op.ScatterElements(op.Reshape(self, one), op.Reshape(index, one), op.Reshape(src, one), axis=0)
        return op.Reshape(written, op.Constant(value_ints=[]))
    rank = len(self.shape)
    starts, axes = op.Constant(value_ints=[0] * rank), op.Constant(value_ints=list(range(rank)))
    updates = op.Slice(src, starts, op.Shape(index), axes)
    return op.ScatterElements(self, index, updates, axis=dim % rank)


@lowering("aten::scatter.value")
def scatter_value(self: TTensor, dim: int, index: INT64, value: float) -> TTensor:
    """The scalar written at every `index` position along `dim` (in self's dtype)."""
    return scatter_src(self, dim, index, op.Expand(op.CastLike(value, self), op.Shape(index)))


@lowering("aten::scatter_reduce.two")
def scatter_reduce_two(
    self: TReal, dim: int, index: INT64, src: TReal, reduce: str, include_self: bool = True
) -> TReal:
    """torch.scatter_reduce (sum, prod, mean, amax, amin); torchlib's mean divides by the wrong counts."""
    return _scatter_reduce(self, dim, index, src, reduce, include_self)


@lowering("aten::scatter_add")
def scatter_add(self: TReal, dim: int, index: INT64, src: TReal) -> TReal:
    return _scatter_reduce(self, dim, index, src, "sum", include_self=True)


@lowering("aten::scatter.reduce")
def scatter_reduce_legacy(self: TReal, dim: int, index: INT64, src: TReal, reduce: str) -> TReal:
    """torch.scatter(..., reduce="add" | "multiply"): reduces into self's values."""
    return _scatter_reduce(self, dim, index, src, reduce, include_self=True)


@lowering("aten::scatter.value_reduce")
def scatter_value_reduce(self: TReal, dim: int, index: INT64, value: float, reduce: str) -> TReal:
    """torch.scatter(..., value, reduce=...): the scalar reduced into self at every index."""
    src = op.Expand(op.CastLike(value, self), op.Shape(index))
    return _scatter_reduce(self, dim, index, src, reduce, include_self=True)


@lowering("aten::put")
def put(self: TReal, index: INT64, source: TReal, accumulate: bool = False) -> TReal:
    """torch.put: source's elements written (or added) at flat `index` positions of self (negatives wrap)."""
    positions = _flat_indexing(index)
    positions = op.Where(op.Less(positions, op.Constant(value_int=0)), op.Add(positions, op.Size(self)), positions)
    flat = _flat_indexing(self)
    if accumulate:
        result = _scatter_reduce(flat, 0, positions, _flat_indexing(source), "sum", include_self=True)
    else:
        result = op.ScatterElements(flat, positions, _flat_indexing(source), axis=0)
    return op.Reshape(result, op.Shape(self))


# --- *_scatter: positions known at export, from the (static) shape --------------------------------------------
def _scatter_flat(self: TReal, positions: np.ndarray, src: TReal) -> TReal:
    """self with src's elements (in src's order) at the flat `positions` of self (a constant array)."""
    if positions.size == 0:
        return op.Identity(self)
    written = op.ScatterElements(_flat_indexing(self), _const_ints(positions.reshape(-1)), _flat_indexing(src), axis=0)
    return op.Reshape(written, op.Shape(self))


@lowering("aten::as_strided_scatter", "prims::as_strided_scatter")
def as_strided_scatter(
    self: TReal, src: TReal, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None
) -> TReal:
    """src written over the strided view of self's (contiguous) elements."""
    positions = np.full([int(s) for s in size], int(storage_offset or 0), dtype=np.int64)
    for axis, (length, step) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = int(length)
        positions = positions + (np.arange(int(length), dtype=np.int64) * int(step)).reshape(shape)
    return _scatter_flat(self, positions, src)


@lowering("aten::diagonal_scatter")
def diagonal_scatter(self: TReal, src: TReal, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TReal:
    """src written over torch.diagonal(self, offset, dim1, dim2) (kept whole: its decomposition mutates)."""
    shape = _static_shape(self, "diagonal_scatter")
    elements = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    rank = len(shape)
    positions = np.diagonal(elements, offset, dim1 % rank, dim2 % rank)
    return _scatter_flat(self, positions, src)


# --- shape ops ---------------------------------------------------------------------------------------------
@lowering("prims::view_of")
def view_of(a: TReal) -> TReal:
    """A view with the same shape (squeeze of no size-1 dim decomposes to it)."""
    return op.Identity(a)


@lowering("prims::copy_strided")
def copy_strided(a: TReal, stride: Sequence[INT64]) -> TReal:
    """A copy laid out with other strides: the same values (index_fill of an unfold's view decomposes to it)."""
    del stride
    return op.Identity(a)


@lowering("aten::resize")
def resize(self: TReal, size: Sequence[int], memory_format: int | None = None) -> TReal:
    """Functional resize_: self's elements in order, cut or zero-extended to `size`'s element count.

    Eager leaves the elements past self's count uninitialized; zeros stand in for them.
    """
    del memory_format
    count = math.prod(int(s) for s in size)
    flat = _flat_indexing(self)
    missing = op.Max(
        op.Sub(op.Constant(value_ints=[count]), op.Reshape(op.Size(self), op.Constant(value_ints=[1]))),
        op.Constant(value_ints=[0]),
    )
    padded = op.Pad(flat, op.Concat(op.Constant(value_ints=[0]), missing, axis=0))
    kept = op.Slice(padded, op.Constant(value_ints=[0]), op.Constant(value_ints=[count]))
    return op.Reshape(kept, op.Constant(value_ints=[int(s) for s in size]))


# --- tensor_split at a tensor ----------------------------------------------------------------------------------
_END = 2**63 - 1  # Slice's "to the end"


def tensor_split_at_tensor(
    ctx: LoweringContext, self: TTensor, indices_or_sections: INT64, axis: int, outputs: int
) -> list[TTensor]:
    """``tensor_split`` along `axis` at a 1-D tensor of split points (read at run time, Python slicing semantics:
    negative points count from the end, points past it give empty parts), or into a 0-d tensor's number of sections.

    That number is the number of outputs, fixed at export (capture takes the example's, see
    ``_capture_strategies.sections_from_example``): the split bounds are gathered at index ``sections != outputs``
    from a one-row tensor, so that another count fails in ONNX Runtime (Gather's index out of range) rather than
    splitting into the wrong parts. That Gather is named for the check, so ONNX Runtime's error names it.
    """
    if len(indices_or_sections.shape) == 1:
        bounds = op.Concat(op.Constant(value_ints=[0]), indices_or_sections, op.Constant(value_ints=[_END]), axis=0)
    else:
        length = self.shape[axis]
        if isinstance(length, int):
            base, extra = divmod(length, outputs)
            bounds = op.Constant(value_ints=[i * base + min(i, extra) for i in range(outputs + 1)])
        else:  # i * (length // n) + min(i, length % n): the first length % n sections one longer
            size = op.Shape(self, start=axis, end=axis + 1)
            count = op.Constant(value_ints=[outputs])
            steps = op.Constant(value_ints=list(range(outputs + 1)))
            bounds = op.Add(op.Mul(steps, op.Div(size, count)), op.Min(steps, op.Mod(size, count)))
        another_count = op.Cast(op.Not(op.Equal(indices_or_sections, op.Constant(value_int=outputs))), to=INT64.dtype)
        bounds = op.Gather(op.Unsqueeze(bounds, op.Constant(value_ints=[0])), another_count, axis=0)
        check = bounds.producer() if isinstance(bounds, ir.Value) else None
        if check is not None:
            check.name = ctx.fresh_name(f"fx2onnx_check_tensor_split_sections_is_{outputs}_as_exported")
    axes = op.Constant(value_ints=[axis])
    return [
        op.Slice(self, op.Slice(bounds, [i], [i + 1]), op.Slice(bounds, [i + 1], [i + 2]), axes) for i in range(outputs)
    ]


@lowering("aten::tensor_split.tensor_indices_or_sections", context=True)
def tensor_split_tensor(
    ctx: LoweringContext, self: TTensor, tensor_indices_or_sections: INT64, dim: int = 0
) -> Sequence[TTensor]:
    outputs = len(ctx.node.meta["val"])
    return tensor_split_at_tensor(ctx, self, tensor_indices_or_sections, dim % len(self.shape), outputs)


# --- hash_tensor ---------------------------------------------------------------------------------------------
_SIGN_BIT = -(2**63)  # 1 << 63 as an int64


def _float64_bits(x: DOUBLE) -> INT64:
    """The IEEE-754 bit pattern of each float64 as an int64, computed arithmetically (opset 18 has no BitCast).

    |x| = m * 2**e with 1 <= m < 2 for normal numbers; Log2 only guesses e, and one step corrects it.
    Subnormals use e = -1022 with m < 1; NaN is the canonical quiet NaN.
    """
    magnitude = op.Abs(x)
    two = op.Constant(value=ir.tensor(2.0, dtype=ir.DataType.DOUBLE))
    positive = op.Where(op.Greater(magnitude, op.CastLike(0.0, x)), magnitude, op.CastLike(1.0, x))
    finite = op.Where(op.IsInf(positive), op.CastLike(1.0, x), positive)
    finite = op.Where(op.IsNaN(finite), op.CastLike(1.0, x), finite)
    guess = op.Floor(op.Div(op.Log(finite), op.CastLike(math.log(2.0), x)))
    guess = op.Max(guess, op.CastLike(-1022.0, x))
    scaled = op.Div(finite, op.Pow(two, guess))
    too_big = op.GreaterOrEqual(scaled, two)
    guess = op.Where(too_big, op.Add(guess, op.CastLike(1.0, x)), guess)
    too_small = op.And(
        op.Less(op.Div(finite, op.Pow(two, guess)), op.CastLike(1.0, x)), op.Greater(guess, op.CastLike(-1022.0, x))
    )
    guess = op.Where(too_small, op.Sub(guess, op.CastLike(1.0, x)), guess)
    mantissa = op.Div(finite, op.Pow(two, guess))
    normal = op.GreaterOrEqual(mantissa, op.CastLike(1.0, x))
    fraction = op.Where(normal, op.Sub(mantissa, op.CastLike(1.0, x)), mantissa)
    fraction_bits = op.Cast(op.Mul(fraction, op.CastLike(2.0**52, x)), to=INT64.dtype)
    exponent = op.Where(
        normal, op.Add(op.Cast(guess, to=INT64.dtype), op.Constant(value_int=1023)), op.Constant(value_int=0)
    )
    bits = op.Add(op.Mul(exponent, op.Constant(value_int=2**52)), fraction_bits)
    zero = op.Equal(magnitude, op.CastLike(0.0, x))
    bits = op.Where(zero, op.Constant(value_int=0), bits)
    bits = op.Where(op.IsInf(x), op.Constant(value_int=0x7FF << 52), bits)
    negative = op.Or(op.Less(x, op.CastLike(0.0, x)), op.And(zero, op.Less(op.Reciprocal(x), op.CastLike(0.0, x))))
    bits = op.Where(negative, op.Add(bits, op.Constant(value_int=_SIGN_BIT)), bits)
    return op.Where(op.IsNaN(x), op.Constant(value_int=0x7FF8 << 48), bits)


def _xor_reduce(bits: INT64, rank: int, axis: int, length: int) -> INT64:
    """XOR of `bits` along `axis` (static `length`), halving the axis each step; keeps the axis (size 1)."""
    if length == 0:
        shape = op.Shape(bits)
        reduced = op.ScatterElements(shape, op.Constant(value_ints=[axis]), op.Constant(value_ints=[1]), axis=0)
        return op.Expand(op.Constant(value_int=0), reduced)
    axes = op.Constant(value_ints=[axis])
    while length > 1:
        if length % 2:
            pads = [0] * (2 * rank)
            pads[rank + axis] = 1
            bits = op.Pad(bits, op.Constant(value_ints=pads))
            length += 1
        half = length // 2
        low = op.Slice(bits, op.Constant(value_ints=[0]), op.Constant(value_ints=[half]), axes)
        high = op.Slice(bits, op.Constant(value_ints=[half]), op.Constant(value_ints=[length]), axes)
        bits = op.BitwiseXor(low, high)
        length = half
    return bits


@lowering("aten::hash_tensor")
def hash_tensor(self: TReal, dim: Sequence[int] = (), keepdim: bool = False, mode: int = 0) -> UINT64:
    """XOR of the elements' 64-bit patterns (floats as float64, integers and bool as int64), as uint64."""
    if mode != 0:
        raise NotImplementedError(f"hash_tensor mode {mode} has no lowering here")
    floats = self.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE, *_LOW_PRECISION)
    bits = _float64_bits(op.Cast(self, to=DOUBLE.dtype)) if floats else op.Cast(self, to=INT64.dtype)
    shape = _static_shape(self, "hash_tensor")
    rank = len(shape)
    if rank == 0:
        return op.Cast(bits, to=UINT64.dtype)
    axes = sorted({d % rank for d in dim}) if len(dim) else list(range(rank))
    for axis in axes:
        bits = _xor_reduce(bits, rank, axis, shape[axis])
    if not keepdim:
        bits = op.Squeeze(bits, op.Constant(value_ints=axes))
    return op.Cast(bits, to=UINT64.dtype)


# --- pixel_shuffle / pixel_unshuffle -------------------------------------------------------------------------
# Reshape and Transpose rather than DepthToSpace/SpaceToDepth, which ONNX Runtime runs for few types and only
# on rank 4; shapes are built with allowzero so that empty tensors keep their zero dims.
def _dims(x: TReal, start: int, end: int) -> INT64:
    return op.Shape(x, start=start, end=end)


def _image_dims(x: TReal) -> tuple[int, tuple[INT64, INT64, INT64, INT64]]:
    """How many batch dims lead (*, C, H, W), and the shapes of the batch dims, C, H and W."""
    rank = len(x.shape)
    lead = rank - 3
    return lead, (_dims(x, 0, lead), _dims(x, lead, lead + 1), _dims(x, -2, -1), _dims(x, -1, rank))


def _times(dim: INT64, factor: int) -> INT64:
    return op.Mul(dim, op.Constant(value_ints=[factor]))


def _over(dim: INT64, factor: int) -> INT64:
    return op.Div(dim, op.Constant(value_ints=[factor]))


@lowering("aten::pixel_shuffle")
def pixel_shuffle(self: TReal, upscale_factor: int) -> TReal:
    """(*, C*r*r, H, W) -> (*, C, H*r, W*r)."""
    r = upscale_factor
    lead, (batch, channels, height, width) = _image_dims(self)
    factor = op.Constant(value_ints=[r])
    split = op.Concat(batch, _over(channels, r * r), factor, factor, height, width, axis=0)
    x = op.Reshape(self, split, allowzero=1)
    x = op.Transpose(x, perm=[*range(lead), lead, lead + 3, lead + 1, lead + 4, lead + 2])
    merged = op.Concat(batch, _over(channels, r * r), _times(height, r), _times(width, r), axis=0)
    return op.Reshape(x, merged, allowzero=1)


@lowering("aten::pixel_unshuffle")
def pixel_unshuffle(self: TReal, downscale_factor: int) -> TReal:
    """(*, C, H*r, W*r) -> (*, C*r*r, H, W).

    Eager returns an empty input unchanged, where torch's shape function (which the graph records) gives
    the shape below; both agree for downscale_factor 1.
    """
    r = downscale_factor
    lead, (batch, channels, height, width) = _image_dims(self)
    factor = op.Constant(value_ints=[r])
    split = op.Concat(batch, channels, _over(height, r), factor, _over(width, r), factor, axis=0)
    x = op.Reshape(self, split, allowzero=1)
    x = op.Transpose(x, perm=[*range(lead), lead, lead + 2, lead + 4, lead + 1, lead + 3])
    merged = op.Concat(batch, _times(channels, r * r), _over(height, r), _over(width, r), axis=0)
    return op.Reshape(x, merged, allowzero=1)


# --- repeat_interleave with a tensor of repeats ----------------------------------------------------------------
@lowering("aten::repeat_interleave.self_int")
def repeat_interleave_self_int(
    self: TTensor, repeats: int, dim: int | None = None, output_size: int | None = None
) -> TTensor:
    """x.repeat_interleave(r, dim); a tensor of no element is reshaped to its result's shape (torchlib's Reshape
    to [-1, ...] of the tiled tensor copied a 0 and failed the checker: fuzz seed 50001408)."""
    from onnxscript.function_libs.torch_lib.ops.core import aten_repeat_interleave_self_int

    shape = None if self.shape is None else list(self.shape)
    if shape is not None and isinstance(repeats, int) and all(isinstance(s, int) for s in shape) and 0 in shape:
        if dim is None:
            target = [0]
        else:
            target = shape
            target[dim % len(shape)] *= repeats
        return op.Reshape(self, op.Constant(value_ints=target), allowzero=1)
    return aten_repeat_interleave_self_int(self, repeats, dim, output_size)


@lowering("aten::repeat_interleave.Tensor")
def repeat_interleave_tensor(repeats: INT64, output_size: int | None = None) -> INT64:
    """``torch.repeat_interleave(repeats)``: index i written repeats[i] times (x.repeat_interleave(r, dim)
    decomposes to it and an index_select). torchlib's implementation takes `self` where ATen gives `repeats`.

    The output's length is data-dependent (sum of repeats): position p holds the count of cumulative sums <= p.
    """
    repeats = op.Cast(repeats, to=INT64.dtype)
    ends = op.CumSum(repeats, op.Constant(value_int=0))  # (n,)
    if output_size is None:
        total = op.ReduceSum(repeats, keepdims=0)
    elif isinstance(output_size, int):
        total = op.Constant(value_int=output_size)
    else:  # a symbolic size (a sparse input's number of stored elements)
        total = op.Reshape(op.Cast(output_size, to=INT64.dtype), op.Constant(value_ints=[]))
    positions = op.Range(op.Constant(value_int=0), total, op.Constant(value_int=1))  # (total,)
    passed = op.LessOrEqual(
        op.Unsqueeze(ends, op.Constant(value_ints=[0])), op.Unsqueeze(positions, op.Constant(value_ints=[1]))
    )
    return op.ReduceSum(op.Cast(passed, to=INT64.dtype), op.Constant(value_ints=[1]), keepdims=0)


# --- data-dependent indexing ---------------------------------------------------------------------------------
# Kept whole so that capture does not decompose them into `.item()` calls on the (input) indices.
@lowering("aten::take")
def take(self: TReal, index: INT64) -> TReal:
    """self.flatten()[index], index of any shape; negative indices count from the end, as in eager."""
    flat = _flat(self)
    count = op.Size(self)
    wrapped = op.Where(op.Less(index, op.Constant(value_int=0)), op.Add(index, count), index)
    return op.Gather(flat, wrapped, axis=0)


@lowering("aten::nonzero_static")
def nonzero_static_linalg(self: TReal, size: int, fill_value: int = -1) -> INT64:
    """The first `size` rows of nonzero's [count, rank] indices, padded with `fill_value` rows."""
    rank = len(self.shape)
    flat = _flat(self) if rank == 0 else self
    indices = op.Transpose(op.NonZero(flat), perm=[1, 0])  # [count, max(rank, 1)]
    columns = max(rank, 1)
    padding = op.Expand(
        op.Constant(value=ir.tensor([fill_value], dtype=ir.DataType.INT64)), op.Constant(value_ints=[size, columns])
    )
    padded = op.Concat(indices, padding, axis=0)
    starts, ends = op.Constant(value_ints=[0, 0]), op.Constant(value_ints=[size, rank])
    return op.Slice(padded, starts, ends, op.Constant(value_ints=[0, 1]))


@lowering("aten::narrow")
def narrow(self: TTensor, dim: int, start: INT64, length: INT64) -> TTensor:
    """`length` elements along `dim` from `start`; a negative start counts from the end, as in eager (torchlib's
    Slice from start to start + length ends at or before 0 then: an empty or a shorter slice)."""
    axis = dim % len(self.shape)
    one = op.Constant(value_ints=[1])
    begin = op.Constant(value_ints=[start]) if isinstance(start, int) else op.Reshape(start, one)
    if not isinstance(start, int) or start < 0:
        size = op.Shape(self, start=axis, end=axis + 1)
        begin = op.Where(op.Less(begin, op.Constant(value_ints=[0])), op.Add(begin, size), begin)
    count = op.Constant(value_ints=[length]) if isinstance(length, int) else op.Reshape(length, one)
    return op.Slice(self, begin, op.Add(begin, count), op.Constant(value_ints=[axis]))


@lowering("aten::narrow.Tensor")
def narrow_tensor(self: TReal, dim: int, start: TOther, length: int) -> TReal:
    """`length` elements along `dim` from `start`, a 0-d tensor read at run time (negative counts from the end)."""
    begin = op.Reshape(op.Cast(start, to=INT64.dtype), op.Constant(value_ints=[1]))
    size = op.Shape(self, start=dim % len(self.shape), end=dim % len(self.shape) + 1)
    begin = op.Where(op.Less(begin, op.Constant(value_ints=[0])), op.Add(begin, size), begin)
    end = op.Add(begin, op.Constant(value_ints=[length]))
    return op.Slice(self, begin, end, op.Constant(value_ints=[dim]))


@lowering("aten::one_hot")
def one_hot(self: INT64, num_classes: int = -1) -> INT64:
    """Each index compared with 0..num_classes-1; num_classes=-1 takes the largest index plus one, at run time."""
    if num_classes >= 0:
        depth = op.Constant(value_int=num_classes)
    else:
        depth = op.Add(
            op.ReduceMax(op.Reshape(self, op.Constant(value_ints=[-1])), keepdims=False), op.Constant(value_int=1)
        )
    classes = op.Range(op.Constant(value_int=0), depth, op.Constant(value_int=1))
    return op.Cast(op.Equal(op.Unsqueeze(self, op.Constant(value_ints=[-1])), classes), to=INT64.dtype)


# --- embedding_bag ----------------------------------------------------------------------------------------------------
@lowering("aten::embedding_bag.padding_idx")  # (aten::_embedding_bag reads padding_idx -1 as "none")
def embedding_bag(
    weight: TFloat,
    indices: TIndex,
    offsets: TIndex,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: TFloat | None = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> tuple[TFloat, INT64, INT64, INT64]:
    """Sum (0), mean (1) or max (2) of the embedding rows of each bag, as eager (an empty bag gives zeros).

    Bag b holds the indices at positions [offsets[b], offsets[b+1]) (2-D indices: one bag per row); a
    [bags, positions] membership mask selects them, without the padding_idx entries. Also returns eager's
    offset2bag, bag_size and max_indices for the mode (torchlib's CastLike on int64 has no ORT kernel).
    """
    del scale_grad_by_freq, sparse  # gradient-only options
    if len(indices.shape) == 2:
        rows, width = indices.shape
        offsets = op.Range(op.Constant(value_int=0), op.Constant(value_int=rows * width), op.Constant(value_int=width))
        indices = op.Reshape(indices, op.Constant(value_ints=[-1]))
        include_last_offset = False
    index = op.Cast(indices, to=INT64.dtype)
    bounds = op.Cast(offsets, to=INT64.dtype)
    count = op.Shape(index)
    if include_last_offset:
        starts = op.Slice(bounds, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]))
        ends = op.Slice(bounds, op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62]))
    else:
        starts = bounds
        ends = op.Concat(op.Slice(bounds, op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62])), count, axis=0)
    positions = op.Range(op.Constant(value_int=0), op.Squeeze(count), op.Constant(value_int=1))
    column = op.Constant(value_ints=[1])
    member = op.And(
        op.GreaterOrEqual(positions, op.Unsqueeze(starts, column)), op.Less(positions, op.Unsqueeze(ends, column))
    )  # [bags, positions]
    if padding_idx is not None:
        rows_total = weight.shape[0]
        padding = padding_idx + rows_total if padding_idx < 0 and isinstance(rows_total, int) else padding_idx
        member = op.And(member, op.Not(op.Equal(index, op.Constant(value_int=padding))))
    x = _in_float32(weight)
    rows_of = op.Gather(x, index, axis=0)  # [positions, dim]
    if per_sample_weights is not None:
        sample_weights = op.Reshape(op.CastLike(per_sample_weights, x), op.Constant(value_ints=[-1, 1]))
        rows_of = op.Mul(rows_of, sample_weights)
    selected = op.Unsqueeze(member, op.Constant(value_ints=[2]))  # [bags, positions, 1]
    bag_size = op.ReduceSum(op.Cast(member, to=INT64.dtype), column, keepdims=False)
    zero = op.CastLike(0.0, x)
    if mode == 2:
        # Eager keeps a running max, replaced by a strictly greater row: a NaN first in its bag stays (nothing is
        # greater), a NaN later is passed over (fuzz seeds 20200913, 20201048, 20201993). So the max of the bag's
        # non-NaN values, NaN where its first row is NaN.
        lowest = op.CastLike(-math.inf, x)
        rows_of_numbers = op.Where(op.IsNaN(rows_of), lowest, rows_of)
        largest = op.ReduceMax(op.Where(selected, rows_of_numbers, lowest), column, keepdims=True)  # [bags, 1, dim]
        beyond = op.Constant(value_int=2**62)
        first_member = op.ReduceMin(op.Where(member, positions, beyond), column, keepdims=False)  # [bags]
        first_member = op.Where(op.Less(first_member, beyond), first_member, op.Constant(value_int=0))
        first_row = op.Unsqueeze(op.Gather(rows_of, first_member, axis=0), column)  # [bags, 1, dim]
        first_is_nan = op.IsNaN(first_row)
        largest = op.Where(first_is_nan, first_row, largest)
        output = op.Where(
            op.Greater(op.Unsqueeze(bag_size, column), op.Constant(value_int=0)), op.Squeeze(largest, column), zero
        )
        hits = op.And(selected, op.Or(op.Equal(rows_of, largest), first_is_nan))
        first = op.ReduceMin(op.Where(hits, op.Unsqueeze(positions, column), beyond), column, keepdims=False)
        found = op.Less(first, beyond)
        max_indices = op.Where(
            found, op.Gather(index, op.Where(found, first, op.Constant(value_int=0)), axis=0), op.Constant(value_int=0)
        )
    else:
        total = op.ReduceSum(
            op.Where(selected, op.Unsqueeze(rows_of, op.Constant(value_ints=[0])), zero), column, keepdims=False
        )
        if mode == 1:
            sizes = op.CastLike(op.Unsqueeze(bag_size, column), x)
            output = op.Where(op.Greater(sizes, zero), op.Div(total, op.Max(sizes, op.CastLike(1.0, x))), zero)
        else:
            output = total
    bag_of = op.ArgMax(op.Cast(member, to=INT32.dtype), axis=0, keepdims=False)  # [positions]
    if mode == 0:
        offset2bag = op.Cast(op.ConstantOfShape(op.Constant(value_ints=[0])), to=INT64.dtype)
        bag_size = op.Mul(bag_size, op.Constant(value_int=0))
        max_indices = bag_size
    else:
        offset2bag = bag_of
        if mode == 1:
            max_indices = bag_size
    return _back(output, weight), offset2bag, bag_size, max_indices


# --- split into a static number of parts ----------------------------------------------------------------------
# torchlib splits into a sequence (SplitToSequence, then a SequenceAt per part), which onnxscript's optimizer turns
# into a Split when the number of parts is static; here that Split is emitted directly, as the optimizer writes it.
@lowering("aten::split.Tensor")
def split(self: TTensor, split_size: int, dim: int = 0) -> Sequence[TTensor]:
    from onnxscript.function_libs.torch_lib.ops.core import aten_split

    if self.shape is None or not len(self.shape):
        return aten_split(self, split_size, dim)
    axis = dim % len(self.shape)
    length = self.shape[axis]
    if type(length) is not int or length <= 0 or split_size <= 0:
        return aten_split(self, split_size, dim)  # a symbolic or empty dim: a sequence, as torchlib makes it
    parts = math.ceil(length / split_size)
    if length % split_size == 0:
        outputs = op.Split(self, axis=axis, num_outputs=parts)
    else:  # the last part is shorter: explicit sizes (num_outputs alone would split evenly)
        sizes = np.array([split_size] * (parts - 1) + [length - (parts - 1) * split_size], dtype=np.int64)
        outputs = op.Split(self, sizes, axis=axis)
    return [outputs] if isinstance(outputs, ir.Value) else list(outputs)


@lowering("aten::split_with_sizes")
def split_with_sizes(self: TTensor, split_sizes: Sequence[int], dim: int = 0) -> Sequence[TTensor]:
    from onnxscript.function_libs.torch_lib.ops.core import aten_split_with_sizes

    if self.shape is None or not len(self.shape) or not split_sizes:
        return aten_split_with_sizes(self, split_sizes, dim)
    sizes = np.array(list(split_sizes), dtype=np.int64)  # a constant: the number of outputs is read from it
    outputs = op.Split(self, sizes, axis=dim % len(self.shape))
    return [outputs] if isinstance(outputs, ir.Value) else list(outputs)
