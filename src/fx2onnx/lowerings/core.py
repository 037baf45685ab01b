"""Lowerings for core ATen ops where torchlib has no implementation or a wrong one.

Each was found by the coverage sweep (``fx2onnx coverage``, docs/support-matrix.md): an OpInfo
sample that eager runs and whose export failed or differed from eager.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import onnx_ir as ir
from onnxscript import BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8
from onnxscript import opset18 as op

from fx2onnx.lowerings import lowering

TFloat = TypeVar("TFloat", BFLOAT16, DOUBLE, FLOAT, FLOAT16)
# Every real dtype eager computes with, bool included; types the target lacks are left to legalization.
TReal = TypeVar("TReal", BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8)

_LOW_PRECISION = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


# --- batch norm in training mode ------------------------------------------------------------------------
def _batch_norm(
    input: TFloat,
    weight: TFloat | None,
    bias: TFloat | None,
    running_mean: TFloat | None,
    running_var: TFloat | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[TFloat, TFloat, TFloat, TFloat | None, TFloat | None]:
    """Normalize over every axis but the channel axis (1), in float32 for float16/bfloat16 as eager does.

    Returns (output, save_mean, save_rstd, new running mean, new running var). In training mode the
    batch's statistics normalize and update the running ones (with the unbiased variance);
    otherwise the running statistics normalize and save_mean/save_rstd are empty, as in eager.
    """
    dtype = input.dtype
    compute = ir.DataType.FLOAT if dtype in _LOW_PRECISION else dtype
    x = op.Cast(input, to=compute) if compute != dtype else input
    rank = len(input.shape)
    axes = op.Constant(value_ints=[a for a in range(rank) if a != 1])
    channels_shape = op.Constant(value_ints=[1, -1] + [1] * (rank - 2))  # [C] -> broadcastable over x

    def as_compute(value: TFloat | None) -> TFloat | None:
        if value is None:
            return None
        return op.Cast(value, to=compute) if value.dtype != compute else value

    weight, bias = as_compute(weight), as_compute(bias)
    running_mean, running_var = as_compute(running_mean), as_compute(running_var)
    epsilon = op.CastLike(eps, x)
    new_mean = new_var = None
    if training:
        mean = op.ReduceMean(x, axes, keepdims=True)
        centered = op.Sub(x, mean)
        variance = op.ReduceMean(op.Mul(centered, centered), axes, keepdims=True)
        rstd = op.Reciprocal(op.Sqrt(op.Add(variance, epsilon)))
        normalized = op.Mul(centered, rstd)
        save_mean = op.Reshape(mean, op.Constant(value_ints=[-1]))
        save_rstd = op.Reshape(rstd, op.Constant(value_ints=[-1]))
        if running_mean is not None and running_var is not None:
            count = op.Cast(op.Div(op.Size(x), op.Shape(x, start=1, end=2)), to=compute)
            one = op.CastLike(1.0, x)
            unbiased = op.Div(op.Mul(op.Reshape(variance, op.Constant(value_ints=[-1])), count), op.Sub(count, one))
            keep = op.CastLike(1.0 - momentum, x)
            take = op.CastLike(momentum, x)
            new_mean = op.Add(op.Mul(running_mean, keep), op.Mul(save_mean, take))
            new_var = op.Add(op.Mul(running_var, keep), op.Mul(unbiased, take))
    elif weight is not None and bias is not None and rank >= 2 and compute != ir.DataType.DOUBLE:
        # ONNX's own op: ONNX Runtime folds it into a preceding Conv, and it is one node instead of eight.
        # (Not for float64: its epsilon attribute is a float32, eager's eps a double.)
        output = op.BatchNormalization(x, weight, bias, running_mean, running_var, epsilon=eps)
        empty = op.CastLike(op.ConstantOfShape(op.Constant(value_ints=[0])), x)
        return (op.Cast(output, to=dtype) if compute != dtype else output), empty, empty, None, None
    else:
        mean = op.Reshape(running_mean, channels_shape)
        rstd = op.Reciprocal(op.Sqrt(op.Add(op.Reshape(running_var, channels_shape), epsilon)))
        normalized = op.Mul(op.Sub(x, mean), rstd)
        empty = op.ConstantOfShape(op.Constant(value_ints=[0]))
        save_mean = save_rstd = op.CastLike(empty, x)
    if weight is not None:
        normalized = op.Mul(normalized, op.Reshape(weight, channels_shape))
    if bias is not None:
        normalized = op.Add(normalized, op.Reshape(bias, channels_shape))
    output = op.Cast(normalized, to=dtype) if compute != dtype else normalized
    return output, save_mean, save_rstd, new_mean, new_var


@lowering("aten::_native_batch_norm_legit_functional")
def native_batch_norm_legit_functional(
    input: TFloat,
    weight: TFloat | None = None,
    bias: TFloat | None = None,
    running_mean: TFloat | None = None,
    running_var: TFloat | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[TFloat, TFloat, TFloat, TFloat, TFloat]:
    """Batch norm that returns the updated running statistics (torchlib always uses inference mode)."""
    output, save_mean, save_rstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, training, momentum, eps
    )
    if new_mean is None:
        new_mean, new_var = op.Identity(running_mean), op.Identity(running_var)
    return output, save_mean, save_rstd, new_mean, new_var


@lowering("aten::_native_batch_norm_legit.no_stats")
def native_batch_norm_legit_no_stats(
    input: TFloat,
    weight: TFloat | None = None,
    bias: TFloat | None = None,
    training: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[TFloat, TFloat, TFloat]:
    """Batch norm with the batch's statistics and no running ones (instance norm decomposes to it)."""
    del training  # without running statistics, eager normalizes with the batch's in either mode
    output, save_mean, save_rstd, _, _ = _batch_norm(input, weight, bias, None, None, True, momentum, eps)
    return output, save_mean, save_rstd


@lowering("aten::_native_batch_norm_legit_no_training")
def native_batch_norm_legit_no_training(
    input: TFloat,
    weight: TFloat | None = None,
    bias: TFloat | None = None,
    running_mean: TFloat | None = None,
    running_var: TFloat | None = None,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[TFloat, TFloat, TFloat]:
    """Inference-mode batch norm; save_mean and save_rstd are empty, as in eager (torchlib fills them)."""
    output, save_mean, save_rstd, _, _ = _batch_norm(
        input, weight, bias, running_mean, running_var, False, momentum, eps
    )
    return output, save_mean, save_rstd


# --- reductions over given dims, rank 0 included ------------------------------------------------------------
# Eager accepts dim 0 or -1 on a 0-d tensor (reducing nothing); ONNX's Reduce* refuse an axis on rank 0,
# and torchlib's amax/amin/all.dim/any.dim pass the axis through.
def _axes(dim: Sequence[int] | int | None) -> INT64 | None:
    if dim is None:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    return op.Constant(value_ints=dims) if dims else None


@lowering("aten::amax")
def amax(self: TReal, dim: Sequence[int] = (), keepdim: bool = False) -> TReal:
    if len(self.shape) == 0:
        return op.Identity(self)
    return _nan_propagated(self, op.ReduceMax(self, _axes(dim), keepdims=keepdim), dim, keepdim)


@lowering("aten::amin")
def amin(self: TReal, dim: Sequence[int] = (), keepdim: bool = False) -> TReal:
    if len(self.shape) == 0:
        return op.Identity(self)
    return _nan_propagated(self, op.ReduceMin(self, _axes(dim), keepdims=keepdim), dim, keepdim)


def _nan_propagated(self: TReal, reduced: TReal, dim: Sequence[int] | int | None, keepdim: bool) -> TReal:
    """NaN where the reduced slice holds a NaN, as eager's amax/amin (ONNX Runtime's ReduceMax/ReduceMin skip it)."""
    if self.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        return reduced
    has_nan = op.ReduceMax(op.Cast(op.IsNaN(self), to=INT32.dtype), _axes(dim), keepdims=keepdim)
    return op.Where(op.Cast(has_nan, to=BOOL.dtype), op.CastLike(math.nan, reduced), reduced)


def _extreme_along(self: TReal, dim: int, keepdim: bool, largest: bool) -> tuple[TReal, INT64]:
    """max.dim/min.dim: the value and the index of its first occurrence; a slice holding a NaN gives NaN and
    the first NaN's index, as eager (ONNX Runtime's ReduceMax/ArgMax skip NaN)."""
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value=ir.tensor(np.array(0, dtype=np.int64)))
    axes = op.Constant(value_ints=[dim])
    if largest:
        values, indices = op.ReduceMax(self, axes, keepdims=keepdim), op.ArgMax(self, axis=dim, keepdims=keepdim)
    else:
        values, indices = op.ReduceMin(self, axes, keepdims=keepdim), op.ArgMin(self, axis=dim, keepdims=keepdim)
    if self.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        return values, indices
    nan = op.Cast(op.IsNaN(self), to=INT32.dtype)
    has_nan = op.Cast(op.ReduceMax(nan, axes, keepdims=keepdim), to=BOOL.dtype)
    values = op.Where(has_nan, op.CastLike(math.nan, values), values)
    indices = op.Where(has_nan, op.ArgMax(nan, axis=dim, keepdims=keepdim), indices)
    return values, indices


@lowering("aten::max.dim")
def max_dim(self: TReal, dim: int, keepdim: bool = False) -> tuple[TReal, INT64]:
    return _extreme_along(self, dim, keepdim, largest=True)


@lowering("aten::min.dim")
def min_dim(self: TReal, dim: int, keepdim: bool = False) -> tuple[TReal, INT64]:
    return _extreme_along(self, dim, keepdim, largest=False)


def _truth(self: TReal, dim: Sequence[int] | int | None, keepdim: bool, every: bool) -> BOOL:
    """all (every=True) / any over `dim` (all axes when None or empty): a min / max of 0/1 values."""
    truth = op.Cast(self, to=BOOL.dtype) if self.dtype != ir.DataType.BOOL else self
    if len(self.shape) == 0:
        return op.Identity(truth)
    # all(x) is not any(not x): a max of 0/1 values compared with 0, since ONNX Runtime's ReduceMax over an
    # empty dim gives the lowest int32 (any() of nothing was True; eager: False, and all() of nothing True).
    as_int = op.Cast(op.Not(truth) if every else truth, to=INT32.dtype)
    found = op.Greater(op.ReduceMax(as_int, _axes(dim), keepdims=keepdim), op.Constant(value_int=0))
    return op.Not(found) if every else found


@lowering("aten::all")
def all_elements(self: TReal) -> BOOL:
    return _truth(self, None, False, every=True)


@lowering("aten::any")
def any_element(self: TReal) -> BOOL:
    return _truth(self, None, False, every=False)


@lowering("aten::all.dim")
def all_dim(self: TReal, dim: int, keepdim: bool = False) -> BOOL:
    return _truth(self, dim, keepdim, every=True)


@lowering("aten::all.dims")
def all_dims(self: TReal, dim: Sequence[int] | None = None, keepdim: bool = False) -> BOOL:
    return _truth(self, dim, keepdim, every=True)


@lowering("aten::any.dim")
def any_dim(self: TReal, dim: int, keepdim: bool = False) -> BOOL:
    return _truth(self, dim, keepdim, every=False)


@lowering("aten::any.dims")
def any_dims(self: TReal, dim: Sequence[int] | None = None, keepdim: bool = False) -> BOOL:
    return _truth(self, dim, keepdim, every=False)


# --- cumulative ops along a dim -------------------------------------------------------------------------------
# torchlib has no cummax, cummin or cumprod. Each output i reduces the prefix j <= i: the input is
# broadcast to [..., i, j, ...] and a lower-triangular mask picks the prefix, then one Reduce* over j.
# Memory grows with the square of the dim's length, which suits the lengths models scan over.
def _prefix_layout(self: TReal, dim: int) -> tuple[int, TReal, TReal, BOOL, INT64]:
    """(axis, x_i, x_j, mask[i, j] = j <= i broadcastable to them, j as int64 broadcastable)."""
    rank = len(self.shape)
    axis = dim % rank
    x_j = op.Unsqueeze(self, op.Constant(value_ints=[axis]))  # [..., 1, n, ...]: j on axis + 1
    x_i = op.Unsqueeze(self, op.Constant(value_ints=[axis + 1]))  # [..., n, 1, ...]: i on axis
    length = op.Shape(self, start=axis, end=axis + 1)
    positions = op.Range(op.Constant(value_int=0), op.Squeeze(length), op.Constant(value_int=1))
    trailing = [1] * (rank - axis - 1)
    i = op.Reshape(positions, op.Constant(value_ints=[-1, 1, *trailing]))
    j = op.Reshape(positions, op.Constant(value_ints=[1, -1, *trailing]))
    return axis, x_i, x_j, op.LessOrEqual(j, i), j


def _cumulative_extreme(self: TReal, dim: int, largest: bool) -> tuple[TReal, INT64]:
    """cummax/cummin: the running max (min) and the index of its latest occurrence; NaN wins and sticks."""
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    dtype = self.dtype
    # Narrow integers (and bool) compare in int32: exact, and every Reduce/Equal kernel takes it.
    narrow = dtype in (ir.DataType.BOOL, ir.DataType.INT8, ir.DataType.INT16, ir.DataType.UINT8)
    x = op.Cast(self, to=INT32.dtype) if narrow else self
    axis, x_i, x_j, mask, j = _prefix_layout(x, dim)
    reduce_axis = op.Constant(value_ints=[axis + 1])
    is_float = dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    if is_float:  # NaN compares above everything (eager's `x >= best || isnan(x)`); +-inf stands in for it
        top = op.CastLike(float("inf") if largest else float("-inf"), x)
        x_i = op.Where(op.IsNaN(x_i), top, x_i)
        x_j_nan = op.IsNaN(x_j)
        x_j = op.Where(x_j_nan, top, x_j)
    candidates = op.Where(mask, x_j, x_i)  # outside the prefix: x_i itself, which is in the prefix anyway
    best = (
        op.ReduceMax(candidates, reduce_axis, keepdims=True)
        if largest
        else op.ReduceMin(candidates, reduce_axis, keepdims=True)
    )
    hits = op.And(mask, op.Equal(x_j, best))
    minus_one = op.Constant(value=ir.tensor(-1, dtype=ir.DataType.INT64))
    index = op.ReduceMax(op.Where(hits, j, minus_one), reduce_axis, keepdims=True)
    if is_float:
        nan_hits = op.And(mask, x_j_nan)
        nan_index = op.ReduceMax(op.Where(nan_hits, j, minus_one), reduce_axis, keepdims=True)
        seen_nan = op.GreaterOrEqual(nan_index, op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64)))
        best = op.Where(seen_nan, op.CastLike(float("nan"), x), best)
        index = op.Where(seen_nan, nan_index, index)
    best = op.Squeeze(best, reduce_axis)
    index = op.Squeeze(index, reduce_axis)
    if narrow:
        best = op.Cast(best, to=dtype)
    return best, index


@lowering("aten::cummax")
def cummax(self: TReal, dim: int) -> tuple[TReal, INT64]:
    return _cumulative_extreme(self, dim, largest=True)


@lowering("aten::cummin")
def cummin(self: TReal, dim: int) -> tuple[TReal, INT64]:
    return _cumulative_extreme(self, dim, largest=False)


@lowering("aten::cumprod")
def cumprod(self: TReal, dim: int, dtype: int | None = None) -> TReal:
    """Running product (`dtype`, when given, is applied first, as eager does)."""
    x = op.Cast(self, to=dtype) if dtype is not None else self
    if len(self.shape) == 0:
        return op.Identity(x)
    if x.dtype == ir.DataType.BOOL:  # eager's product of bools is an integer; promotion gives it another type
        x = op.Cast(x, to=INT64.dtype)
    axis, _, x_j, mask, _ = _prefix_layout(x, dim)
    factors = op.Where(mask, x_j, op.CastLike(1, x))
    return op.ReduceProd(factors, op.Constant(value_ints=[axis + 1]), keepdims=False)


# --- shapes ---------------------------------------------------------------------------------------------------
def _squeezed(self: TReal, dims: Sequence[int]) -> TReal:
    """Eager squeezes only the listed dims of size 1; any other (a symbolic one is never 1: torch.export
    specializes size-1 dims) is left as it is. torchlib's Squeeze of a dim of size 4 fails the checker."""
    rank = len(self.shape)
    axes = sorted({d % rank for d in dims}) if rank else []
    axes = [a for a in axes if self.shape[a] == 1]
    return op.Squeeze(self, op.Constant(value_ints=axes)) if axes else op.Identity(self)


@lowering("aten::squeeze.dim")
def squeeze_dim(self: TReal, dim: int) -> TReal:
    return _squeezed(self, [dim])


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
def topk(self: TReal, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[TReal, INT64]:
    """TopK; a 0-d tensor (k is 0 or 1; eager returns it and index 0) has no axis for ONNX's TopK."""
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value=ir.tensor(np.array(0, dtype=np.int64)))
    values, indices = op.TopK(self, op.Constant(value_ints=[k]), axis=dim, largest=largest, sorted=sorted)
    return values, indices


# --- selection and signs ---------------------------------------------------------------------------------------
@lowering("aten::masked_select")
def masked_select(self: TReal, mask: BOOL) -> TReal:
    """The elements where `mask` (broadcast with `self`) is true, flattened: a Compress of both, flattened."""
    both = op.Shape(op.Where(mask, self, self))  # the broadcast shape of self and mask
    flat_self = op.Reshape(op.Expand(self, both), op.Constant(value_ints=[-1]))
    flat_mask = op.Reshape(op.Expand(mask, both), op.Constant(value_ints=[-1]))
    return op.Compress(flat_self, flat_mask, axis=0)


def _infinite(self: TFloat, positive: bool, negative: bool) -> BOOL:
    """IsInf in the input's own float type: torchlib casts to float32 first, which makes float64 values
    above 3.4e38 infinite. float16/bfloat16 (which IsInf takes from opset 20) widen to float32 exactly."""
    x = op.Cast(self, to=FLOAT.dtype) if self.dtype in _LOW_PRECISION else self
    return op.IsInf(x, detect_positive=int(positive), detect_negative=int(negative))


@lowering("aten::isinf")
def isinf(self: TFloat) -> BOOL:
    return _infinite(self, positive=True, negative=True)


@lowering("aten::isposinf")
def isposinf(self: TFloat) -> BOOL:
    return _infinite(self, positive=True, negative=False)


@lowering("aten::isneginf")
def isneginf(self: TFloat) -> BOOL:
    return _infinite(self, positive=False, negative=True)


def _truncated(self: TFloat) -> TFloat:
    """Floor above zero, Ceil elsewhere: keeps -0.0 for -0.0 and (-1, 0), where torchlib's
    Floor(Abs(x)) * Sign(x) gives +0.0. (The -0.0 results come from Where's second branch: ONNX Runtime's
    Where turns a -0.0 taken from its first branch into +0.0.)"""
    return op.Where(op.Greater(self, op.CastLike(0, self)), op.Floor(self), op.Ceil(self))


@lowering("aten::trunc")
def trunc(self: TFloat) -> TFloat:
    return _truncated(self)


@lowering("aten::frac")
def frac(self: TFloat) -> TFloat:
    """x - trunc(x): +0.0 for -0.0 as in eager (torchlib's trunc gives -0.0 - +0.0 = -0.0)."""
    return op.Sub(self, _truncated(self))


@lowering("aten::signbit", "prims::signbit")
def signbit(self: TReal) -> BOOL:
    """True for negative numbers and -0.0 (1/-0.0 is -inf). NaN's sign bit is not visible in ONNX: False."""
    if self.dtype == ir.DataType.BOOL:
        return op.And(self, op.Not(self))
    zero = op.CastLike(0, self)
    negative = op.Less(self, zero)
    if self.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        return negative
    negative_zero = op.And(op.Equal(self, zero), op.Less(op.Reciprocal(self), zero))
    return op.Or(negative, negative_zero)


@lowering("aten::sign", "aten::sgn")
def sign_float(self: TFloat) -> TFloat:
    """-1, 0 or 1; eager's kernel computes (0 < x) - (x < 0), which is 0 for NaN (ONNX's Sign gives NaN) and +0
    for -0."""
    zero = _const(0.0, self)
    return op.Sub(op.CastLike(op.Less(zero, self), self), op.CastLike(op.Less(self, zero), self))


# --- floor division and remainder of floats, as eager's kernels (BinaryOpsKernel.cpp, div_floor_floating_vec) ---
# torchlib's Floor(a / b) gave inf for inf // 2 (eager: NaN, from fmod(inf, 2)) and its a - floor(a / b) * b
# remainder lost the small remainders of large values: (-128.0) % 0.001 gave 0, eager 6.08e-06 (from fmod, which is
# exact). float16/bfloat16 (measured on torch 2.13): a tensor divisor's floor/trunc quotient rounds in the dtype
# after each step (as these nodes do, legalized one by one); a number divisor is read as a float32 and the quotient
# computed in float32, rounded once; remainder rounds the number to the dtype (then the steps are exact or round once).
def _remainder_float(a: TFloat, b: TFloat) -> TFloat:
    """fmod(a, b), plus b where it is non-zero and its sign differs from b's."""
    mod = op.Mod(a, b, fmod=1)
    zero = _const(0.0, a)
    wrong_side = op.And(op.Not(op.Equal(mod, zero)), op.Xor(op.Less(b, zero), op.Less(mod, zero)))
    return op.Where(wrong_side, op.Add(mod, b), mod)


def _floor_divide_float(a: TFloat, b: TFloat) -> TFloat:
    zero, one = _const(0.0, a), _const(1.0, a)
    quotient = op.Div(a, b)
    mod = op.Mod(a, b, fmod=1)
    # a - mod is exactly divisible; where a / b overflows with a finite, eager divides a itself.
    overflows = op.And(op.IsInf(quotient), op.Not(op.IsInf(a)))
    divided = op.Div(op.Where(overflows, a, op.Sub(a, mod)), b)
    wrong_side = op.And(op.Not(op.Equal(mod, zero)), op.Xor(op.Less(b, zero), op.Less(mod, zero)))
    divided = op.Where(wrong_side, op.Sub(divided, one), divided)
    floored = op.Floor(divided)
    floored = op.Where(op.Greater(op.Sub(divided, floored), _const(0.5, a)), op.Add(floored, one), floored)
    signed_zero = op.Where(_negative_or_negative_zero(quotient), _const(-0.0, a), zero)
    floored = op.Where(op.Equal(divided, zero), signed_zero, floored)
    return op.Where(op.Equal(b, zero), quotient, floored)


def _negative_or_negative_zero(x: TFloat) -> BOOL:
    zero = _const(0.0, x)
    return op.Or(op.Less(x, zero), op.And(op.Equal(x, zero), op.Less(op.Reciprocal(x), zero)))


def _rounded_quotient(self: TFloat, other: TFloat | float, rounding_mode: str | None) -> TFloat:
    if isinstance(other, ir.Value):
        a, b = self, other
    else:  # a number: float32 (float64 for float64) and unrounded, the quotient rounded once
        a = _in_float32(self)
        b = _const(float(other), a)
    if rounding_mode == "floor":
        return _back(_floor_divide_float(a, b), self)
    quotient = op.Div(a, b)
    return _back(_truncated(quotient) if rounding_mode == "trunc" else quotient, self)


@lowering("aten::div.Tensor_mode", "aten::div.Scalar_mode")
def div_mode_float(self: TFloat, other: TFloat, rounding_mode: str | None = None) -> TFloat:
    return _rounded_quotient(self, other, rounding_mode)


@lowering("aten::floor_divide", "aten::floor_divide.Scalar")
def floor_divide_float(self: TFloat, other: TFloat) -> TFloat:
    return _rounded_quotient(self, other, "floor")


@lowering("aten::remainder.Tensor", "aten::remainder.Scalar", "prims::remainder")
def remainder_float(self: TFloat, other: TFloat) -> TFloat:
    return _remainder_float(self, other if isinstance(other, ir.Value) else _const(float(other), self))


@lowering("aten::remainder.Scalar_Tensor")
def remainder_scalar_tensor_float(self: float, other: TFloat) -> TFloat:
    return _remainder_float(_const(float(self), other), other)


# --- means: NaN over nothing ---------------------------------------------------------------------------------
def _mean(self: TFloat, dims: Sequence[int] | None, keepdim: bool, dtype: int | None) -> TFloat:
    """ReduceMean, NaN where it reduced no element (ONNX Runtime gives 0): a non-empty input has no empty
    reduction, and an empty one has only those (or no output element)."""
    x = op.Cast(self, to=dtype) if dtype is not None else self
    if len(x.shape) == 0:
        return op.Identity(x)
    mean = op.ReduceMean(x, _axes(dims), keepdims=keepdim)
    if all(isinstance(size, int) and size > 0 for size in x.shape):  # static and non-empty: the plain pattern that
        return mean  # ONNX Runtime's and onnxscript's fusions (RMSNormalization, LayerNorm) recognize
    empty = op.Equal(op.Size(x), op.Constant(value_int=0))
    return op.Where(empty, op.CastLike(float("nan"), mean), mean)


@lowering("aten::mean")
def mean_float(self: TFloat, dtype: int | None = None) -> TFloat:
    return _mean(self, None, False, dtype)


@lowering("aten::mean.dim")
def mean_dim_float(
    self: TFloat, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: int | None = None
) -> TFloat:
    return _mean(self, dim, keepdim, dtype)


@lowering("aten::copysign.Tensor")
def copysign(self: TFloat, other: TFloat) -> TFloat:
    """|self| with the sign bit of `other`, -0.0 included (torchlib's Less(other, 0) misses it). copysign(-0.0, -1)
    still gives +0.0: ONNX Runtime's Abs(-0.0) is -0.0 (and a -0.0 constant is folded into +0.0)."""
    magnitude = op.Abs(self)
    return op.Where(op.Not(_negative_or_negative_zero(other)), magnitude, op.Neg(magnitude))


# --- integer matrix products with a scaled addend ------------------------------------------------------------
# torchlib lowers addmm & co. with Gemm (floats only) or through CastLike of the scalars, neither of which
# runs for integers. Integer arithmetic wraps alike in any width (results agree modulo 2**bits), so
# int8/int16/uint8 compute in int32 (which MatMul takes) and cast back. Floats keep torchlib's implementations.
TInt = TypeVar("TInt", INT8, INT16, INT32, INT64, UINT8)
_NARROW_INTS = (ir.DataType.INT8, ir.DataType.INT16, ir.DataType.UINT8)


def _widened(value: TInt) -> TInt:
    return op.Cast(value, to=INT32.dtype) if value.dtype in _NARROW_INTS else value


def _scaled_sum(self: TInt, product: TInt, beta: float, alpha: float) -> TInt:
    """beta * self + alpha * product (product already widened), cast back to self's dtype.

    As in eager, beta == 0 ignores `self` (but the result still has its broadcast shape).
    """
    wide = _widened(self)
    if alpha != 1:
        product = op.Mul(product, op.Constant(value=ir.tensor(int(alpha), dtype=wide.dtype)))
    if beta == 0:
        result = op.Expand(product, op.Shape(op.Add(wide, product)))
    else:
        addend = wide if beta == 1 else op.Mul(wide, op.Constant(value=ir.tensor(int(beta), dtype=wide.dtype)))
        result = op.Add(addend, product)
    return op.Cast(result, to=self.dtype) if wide.dtype != self.dtype else result


@lowering("aten::addmm")
def addmm_int(self: TInt, mat1: TInt, mat2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    return _scaled_sum(self, op.MatMul(_widened(mat1), _widened(mat2)), beta, alpha)


@lowering("aten::addmv")
def addmv_int(self: TInt, mat: TInt, vec: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    return _scaled_sum(self, op.MatMul(_widened(mat), _widened(vec)), beta, alpha)


@lowering("aten::addr")
def addr_int(self: TInt, vec1: TInt, vec2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    column = op.Unsqueeze(_widened(vec1), op.Constant(value_ints=[1]))
    row = op.Unsqueeze(_widened(vec2), op.Constant(value_ints=[0]))
    return _scaled_sum(self, op.Mul(column, row), beta, alpha)


@lowering("aten::baddbmm")
def baddbmm_int(self: TInt, batch1: TInt, batch2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    return _scaled_sum(self, op.MatMul(_widened(batch1), _widened(batch2)), beta, alpha)


@lowering("aten::addbmm")
def addbmm_int(self: TInt, batch1: TInt, batch2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    products = op.MatMul(_widened(batch1), _widened(batch2))
    return _scaled_sum(self, op.ReduceSum(products, op.Constant(value_ints=[0]), keepdims=False), beta, alpha)


# --- elementwise ops torch decomposes into prims ONNX has no lowering for ---------------------------------------
def _is_float(value: TReal) -> bool:
    return value.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _nan_ignoring(self: TReal, other: TReal, largest: bool) -> TReal:
    """fmax/fmin: like maximum/minimum, but a NaN loses to a number (NaN only when both are NaN)."""
    picked = op.Max(self, other) if largest else op.Min(self, other)
    if not _is_float(self):
        return picked
    return op.Where(op.IsNaN(self), other, op.Where(op.IsNaN(other), self, picked))


@lowering("aten::fmax")
def fmax(self: TReal, other: TReal) -> TReal:
    return _nan_ignoring(self, other, largest=True)


@lowering("aten::fmin")
def fmin(self: TReal, other: TReal) -> TReal:
    return _nan_ignoring(self, other, largest=False)


@lowering("aten::hypot")
def hypot(self: TFloat, other: TFloat) -> TFloat:
    """sqrt(x**2 + y**2), scaled by max(|x|, |y|) so that squares of large values do not overflow."""
    x, y = op.Abs(self), op.Abs(other)
    larger, smaller = op.Max(x, y), op.Min(x, y)
    zero = op.CastLike(0.0, larger)
    ratio = op.Div(smaller, op.Where(op.Equal(larger, zero), op.CastLike(1.0, larger), larger))
    result = op.Mul(larger, op.Sqrt(op.Add(op.CastLike(1.0, larger), op.Mul(ratio, ratio))))
    infinite = op.Or(op.IsInf(self), op.IsInf(other))  # hypot(inf, nan) is inf, as in C
    return op.Where(infinite, op.CastLike(float("inf"), larger), result)


# --- searching sorted boundaries -------------------------------------------------------------------------------
def _count_below(values: TReal, sorted_sequence: TReal, right: bool, out_int32: bool) -> INT64:
    """For each value, how many sequence entries (last axis) are < it (<= it when `right`)."""
    if sorted_sequence.shape is not None and len(sorted_sequence.shape) and sorted_sequence.shape[-1] == 0:
        # ONNX Runtime's ReduceSum over an empty axis keeps the axis: the count is 0 everywhere.
        zeros = op.Expand(op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64)), op.Shape(values))
        return op.Cast(zeros, to=INT32.dtype) if out_int32 else zeros
    pairs = op.Unsqueeze(values, op.Constant(value_ints=[-1]))
    below = op.LessOrEqual(sorted_sequence, pairs) if right else op.Less(sorted_sequence, pairs)
    counts = op.ReduceSum(op.Cast(below, to=INT64.dtype), op.Constant(value_ints=[-1]), keepdims=False)
    return op.Cast(counts, to=INT32.dtype) if out_int32 else counts


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
    sequence = sorted_sequence
    if len(sorted_sequence.shape) > 1:  # [..., m] against values [..., k]: pair each k with its row
        sequence = op.Unsqueeze(sorted_sequence, op.Constant(value_ints=[-2]))
    return _count_below(self, sequence, right or side == "right", out_int32)


# --- special functions ---------------------------------------------------------------------------------------
# ONNX has no gamma, Bessel or inverse error functions; these are the classic approximations, accurate to a
# few float32 ulps (and to ~1e-7 relative in float64, within the matrix's float64 tolerance). float16 and
# bfloat16 compute in float32: the coefficients do not survive rounding to them.
def _in_float32(self: TFloat) -> TFloat:
    return op.Cast(self, to=FLOAT.dtype) if self.dtype in _LOW_PRECISION else self


def _back(result: TFloat, self: TFloat) -> TFloat:
    return op.Cast(result, to=self.dtype) if result.dtype != self.dtype else result


def _const(value: float, like: TFloat) -> TFloat:
    return op.Constant(value=ir.tensor(value, dtype=like.dtype))


def _polynomial(x: TFloat, coefficients: Sequence[float]) -> TFloat:
    """Horner's rule, highest power first."""
    result = _const(coefficients[0], x)
    for coefficient in coefficients[1:]:
        result = op.Add(op.Mul(result, x), _const(coefficient, x))
    return result


def _bessel_series(half: TFloat, order: int, terms: int) -> TFloat:
    """sum_k (x/2)^(2k+order) / (k! (k+order)!), term by term (no overflow of the powers)."""
    square = op.Mul(half, half)
    term = _const(1.0, half) if order == 0 else half
    total = term
    for k in range(1, terms):
        term = op.Div(op.Mul(term, square), _const(float(k * (k + order)), half))
        total = op.Add(total, term)
    return total


def _bessel_asymptotic_scaled(magnitude: TFloat, order: int) -> TFloat:
    """exp(-x) I_order(x) for large x: sum_k (-1)^k a_k(order) / x^k / sqrt(2 pi x)."""
    mu = 4.0 * order * order
    coefficient = 1.0
    total = _const(1.0, magnitude)
    power = _const(1.0, magnitude)
    inverse = op.Reciprocal(magnitude)
    for k in range(1, 8):
        coefficient *= -(mu - (2 * k - 1) ** 2) / (k * 8.0)
        power = op.Mul(power, inverse)
        total = op.Add(total, op.Mul(_const(coefficient, magnitude), power))
    return op.Div(total, op.Sqrt(op.Mul(_const(6.283185307179586, magnitude), magnitude)))


def _modified_bessel(self: TFloat, order: int, scaled: bool) -> TFloat:
    """I_order(x) (order 0 or 1), or exp(-|x|) I_order(x) when `scaled`: series below 30, asymptotic above."""
    x = _in_float32(self)
    magnitude = op.Abs(x)
    small = op.Less(magnitude, _const(30.0, x))
    safe_small = op.Where(small, magnitude, _const(1.0, x))
    series = _bessel_series(op.Mul(safe_small, _const(0.5, x)), order, 60)
    if scaled:
        series = op.Mul(series, op.Exp(op.Neg(safe_small)))
    safe_large = op.Where(small, _const(30.0, x), magnitude)
    asymptotic = _bessel_asymptotic_scaled(safe_large, order)
    if not scaled:
        asymptotic = op.Mul(asymptotic, op.Exp(safe_large))
    result = op.Where(small, series, asymptotic)
    if order == 1:  # I_1 is odd
        result = op.Where(op.Less(x, _const(0.0, x)), op.Neg(result), result)
    result = op.Where(op.IsNaN(x), x, result)
    return _back(result, self)


@lowering("aten::i0", "aten::special_modified_bessel_i0")
def bessel_i0(self: TFloat) -> TFloat:
    return _modified_bessel(self, 0, scaled=False)


@lowering("aten::special_i0e")
def bessel_i0e(self: TFloat) -> TFloat:
    return _modified_bessel(self, 0, scaled=True)


@lowering("aten::special_i1", "aten::special_modified_bessel_i1")
def bessel_i1(self: TFloat) -> TFloat:
    return _modified_bessel(self, 1, scaled=False)


@lowering("aten::special_i1e")
def bessel_i1e(self: TFloat) -> TFloat:
    return _modified_bessel(self, 1, scaled=True)


@lowering("aten::special_entr")
def entr(self: TFloat) -> TFloat:
    """-x log x; 0 at 0, -inf below 0."""
    zero = _const(0.0, self)
    positive = op.Greater(self, zero)
    safe = op.Where(positive, self, _const(1.0, self))
    result = op.Where(positive, op.Neg(op.Mul(self, op.Log(safe))), zero)
    result = op.Where(op.Less(self, zero), _const(float("-inf"), self), result)
    return op.Where(op.IsNaN(self), self, result)


@lowering("aten::special_spherical_bessel_j0")
def spherical_bessel_j0(x: TFloat) -> TFloat:
    """sin(x) / x, 1 at 0."""
    zero = _const(0.0, x)
    is_zero = op.Equal(x, zero)
    safe = op.Where(is_zero, _const(1.0, x), x)
    result = op.Where(is_zero, _const(1.0, x), op.Div(op.Sin(safe), safe))
    return op.Where(op.IsInf(x), zero, result)


# --- interpolation with output_size or scale_factors -------------------------------------------------------------
# torchlib's `.vec` overloads declare both optional arguments without a default, so they bind only when both
# are given, and eager gives exactly one. Scales, when given, also set the coordinate mapping (as in eager).
def _resize(
    input: TFloat,
    output_size: Sequence[int] | None,
    align_corners: bool,
    scale_factors: Sequence[float] | None,
    mode: str,
    axis: int | None = None,
) -> TFloat:
    """Resize the spatial dims, or only spatial dim `axis` (of the input's, counted from 0 = N)."""
    transformation = "align_corners" if align_corners else "pytorch_half_pixel"
    spatial = range(2, 2 + len(output_size if output_size is not None else scale_factors or []))
    axes = list(spatial) if axis is None else [axis]
    if scale_factors is not None and output_size is None:
        scales = op.Constant(value_floats=[float(scale_factors[a - 2]) for a in axes])
        sizes = None
    else:
        assert output_size is not None
        scales = None
        sizes = op.Constant(value_ints=[int(output_size[a - 2]) for a in axes])
    return op.Resize(
        input,
        None,
        scales,
        sizes,
        axes=axes,
        mode=mode,
        coordinate_transformation_mode=transformation,
        cubic_coeff_a=-0.75,
        exclude_outside=0,
        nearest_mode="floor",
    )


@lowering("aten::upsample_linear1d.vec", "aten::upsample_bilinear2d.vec", "aten::upsample_trilinear3d.vec")
def upsample_linear_vec(
    input: TFloat,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> TFloat:
    return _resize(input, output_size, align_corners, scale_factors, "linear")


@lowering("aten::upsample_bicubic2d.vec")
def upsample_bicubic_vec(
    input: TFloat,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> TFloat:
    return _resize(input, output_size, align_corners, scale_factors, "cubic")


# uint8 images: eager resizes the width, rounds half up and saturates to [0, 255], then does the same for the
# height (its fixed-point kernels). Computed in one pass in float and cast back as a cast match would be,
# results were truncated and wrapped: a bicubic overshoot to -4 became 252, in half of a bicubic upscale's
# pixels. In two passes, rounding half up, upscales are eager's bit for bit (measured); non-integer
# downscales are up to 1 off in a few percent of pixels (eager's weights are rounded to fixed point).
def _round_to_uint8(value: FLOAT) -> FLOAT:
    half_up = op.Floor(op.Add(value, op.Constant(value_float=0.5)))
    return op.Clip(half_up, op.Constant(value_float=0.0), op.Constant(value_float=255.0))


def _resize_uint8(
    input: UINT8,
    output_size: Sequence[int] | None,
    align_corners: bool,
    scale_factors: Sequence[float] | None,
    mode: str,
) -> UINT8:
    resized = op.Cast(input, to=ir.DataType.FLOAT)
    for axis in (3, 2):
        resized = _round_to_uint8(_resize(resized, output_size, align_corners, scale_factors, mode, axis=axis))
    return op.Cast(resized, to=ir.DataType.UINT8)


@lowering("aten::upsample_bilinear2d.vec", specific=True)
def upsample_bilinear_vec_uint8(
    input: UINT8,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> UINT8:
    return _resize_uint8(input, output_size, align_corners, scale_factors, "linear")


@lowering("aten::upsample_bicubic2d.vec", specific=True)
def upsample_bicubic_vec_uint8(
    input: UINT8,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> UINT8:
    return _resize_uint8(input, output_size, align_corners, scale_factors, "cubic")


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
    flat = op.Reshape(moved, op.Constant(value_ints=[*([0] * len(rest)), rows * columns]))
    if offset >= 0:
        length = max(0, min(rows, columns - offset))
        positions = [i * columns + i + offset for i in range(length)]
    else:
        length = max(0, min(rows + offset, columns))
        positions = [(i - offset) * columns + i for i in range(length)]
    indices = op.Constant(value=ir.tensor(positions, dtype=ir.DataType.INT64))
    return op.Gather(flat, indices, axis=len(rest))


@lowering("aten::prod.dim_int")
def prod_dim(self: TReal, dim: int, keepdim: bool = False, dtype: int | None = None) -> TReal:
    """Product over one dim; on a 0-d tensor, the tensor itself (ONNX refuses the axis)."""
    x = op.Cast(self, to=dtype) if dtype is not None else self
    if len(self.shape) == 0:
        return op.Identity(x)
    return op.ReduceProd(x, op.Constant(value_ints=[dim]), keepdims=keepdim)


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


# --- average pooling with eager's window rules --------------------------------------------------------------------
def _per_dim(value: Sequence[int] | int, count: int) -> list[int]:
    values = [value] if isinstance(value, int) else list(value)
    return values * count if len(values) == 1 else values


@lowering("aten::avg_pool1d", "aten::avg_pool2d", "aten::avg_pool3d")
def avg_pool(
    self: TFloat,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> TFloat:
    """Window sums over an explicitly padded input, divided as eager divides.

    ONNX's AveragePool differs from eager in ceil mode (eager drops a last window that starts in the
    right padding, and counts padding in the divisor only up to the padded edge) and has no divisor
    override. Here the input is padded to exactly the windows eager has, a pooled sum is taken, and the
    divisor is the override, or the pooled count of positions inside the padded input (count_include_pad)
    or inside the input itself.
    """
    x = _in_float32(self)
    spatial = len(kernel_size)
    rank = len(self.shape)
    unbatched = rank == spatial + 1  # (C, *spatial): AveragePool wants (N, C, *spatial)
    if unbatched:
        x = op.Unsqueeze(x, op.Constant(value_ints=[0]))
        rank += 1
    sizes = list(self.shape[len(self.shape) - spatial :])
    if not all(isinstance(s, int) for s in sizes):
        raise NotImplementedError("avg_pool over dynamic spatial dims has no lowering here")
    kernel = _per_dim(kernel_size, spatial)
    strides = _per_dim(stride, spatial) if len(stride) else kernel
    pads = _per_dim(padding, spatial)
    extra = []
    for size, k, s, p in zip(sizes, kernel, strides, pads):
        span = size + 2 * p - k
        count = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (count - 1) * s >= size + p:
            count -= 1
        extra.append(max(0, (count - 1) * s + k - (size + 2 * p)))
    leading = [0] * (rank - spatial)

    def pad(value: TFloat, before: list[int], after: list[int], fill: float) -> TFloat:
        amounts = op.Constant(value_ints=[*leading, *before, *leading, *after])
        return op.Pad(value, amounts, _const(fill, x))

    window = 1
    for k in kernel:
        window *= k

    def pooled_sum(value: TFloat) -> TFloat:
        mean = op.AveragePool(value, kernel_shape=kernel, strides=strides, ceil_mode=0)
        return op.Mul(mean, _const(float(window), x))

    padded = pad(x, pads, [p + e for p, e in zip(pads, extra)], 0.0)
    total = pooled_sum(padded)
    if divisor_override is not None:
        divisor = _const(float(divisor_override), x)
    elif count_include_pad and not any(extra):
        divisor = _const(float(window), x)
    else:
        ones = op.Expand(_const(1.0, x), op.Shape(x))
        if count_include_pad:
            inside = pad(pad(ones, pads, pads, 1.0), [0] * spatial, extra, 0.0)
        else:
            inside = pad(ones, pads, [p + e for p, e in zip(pads, extra)], 0.0)
        divisor = pooled_sum(inside)
    result = op.Div(total, divisor)
    if unbatched:
        result = op.Squeeze(result, op.Constant(value_ints=[0]))
    return _back(result, self)


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
    truncating Div, minus one where a negative total leaves a remainder."""
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


@lowering("aten::index_reduce")
def index_reduce(self: TReal, dim: int, index: INT64, source: TReal, reduce: str, include_self: bool = True) -> TReal:
    """Reduce `source` slices into `self` at `index` along `dim` (amax, amin, prod, mean) with ScatterElements.

    Without include_self, the positions `index` touches start from the reduction's identity; mean divides
    by the number of values reduced into each position (floor division for integers, as in eager).
    """
    scalar = len(self.shape) == 0
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


@lowering("aten::linspace")
def linspace(
    start: float,
    end: float,
    steps: int,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
) -> FLOAT:
    """All arguments are constants: the values are eager's own, computed once at export."""
    import torch

    from fx2onnx import dtypes as dtype_table

    torch_dtype = dtype_table.to_torch(ir.DataType(dtype)) if dtype is not None else torch.get_default_dtype()
    values = torch.linspace(start, end, steps, dtype=torch_dtype)
    return op.Constant(value=ir.tensor(values))


@lowering("aten::cross_entropy_loss")
def cross_entropy_probabilities(
    self: TFloat,
    target: TFloat,
    weight: TFloat | None = None,
    reduction: int = 1,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> TFloat:
    """Cross entropy against class probabilities (a float target shaped like the input).

    loss[n, ...] = -sum_c weight[c] * target[n, c, ...] * log_softmax(input)[n, c, ...]; mean divides by the
    number of samples (not by the weights). Integer class targets keep torchlib's implementation.
    """
    del ignore_index  # only class-index targets have one
    x, probabilities = _in_float32(self), _in_float32(target)
    rank = len(self.shape)
    class_axis = 1 if rank > 1 else 0
    classes = self.shape[class_axis]
    if label_smoothing > 0:
        probabilities = op.Add(
            op.Mul(probabilities, _const(1.0 - label_smoothing, x)), _const(label_smoothing / classes, x)
        )
    log_probabilities = op.LogSoftmax(x, axis=class_axis)
    terms = op.Mul(probabilities, log_probabilities)
    if weight is not None:
        shape = [1] * rank
        shape[class_axis] = -1
        terms = op.Mul(terms, op.Reshape(_in_float32(weight), op.Constant(value_ints=shape)))
    losses = op.Neg(op.ReduceSum(terms, op.Constant(value_ints=[class_axis]), keepdims=False))
    if reduction == 0:
        result = losses
    elif reduction == 2:
        result = op.ReduceSum(losses, keepdims=False)
    else:
        result = op.ReduceMean(losses, keepdims=False)
    return _back(result, self)


# --- order statistics: median, nanmedian, kthvalue ------------------------------------------------------------------
# A TopK of the k smallest along the dim, where NaN sorts last (as +inf). The value is gathered back from the
# input at the chosen index, so a NaN chosen stays NaN. Which of several equal elements' index is returned is
# unspecified in eager; the one here is the lowest.
def _sortable(x: TReal) -> TReal:
    if x.dtype == ir.DataType.BOOL:
        return op.Cast(x, to=UINT8.dtype)
    if _is_float(x):
        return op.Where(op.IsNaN(x), _const(float("inf"), x), x)
    return x


def _kth_smallest(x: TReal, position: INT64 | int, axis: int, keepdim: bool) -> tuple[TReal, INT64]:
    """The element of rank `position` (0-based; an int, or int64 of the reduced shape with keepdims) along `axis`."""
    if isinstance(position, int):
        _, indices = op.TopK(_sortable(x), op.Constant(value_ints=[position + 1]), axis=axis, largest=0, sorted=1)
        index = op.Slice(
            indices, op.Constant(value_ints=[-1]), op.Constant(value_ints=[2**62]), op.Constant(value_ints=[axis])
        )
    else:
        length = op.Shape(x, start=axis, end=axis + 1)
        _, indices = op.TopK(_sortable(x), length, axis=axis, largest=0, sorted=1)
        index = op.GatherElements(indices, position, axis=axis)
    value = op.GatherElements(x, index, axis=axis)
    if not keepdim:
        squeeze = op.Constant(value_ints=[axis])
        value, index = op.Squeeze(value, squeeze), op.Squeeze(index, squeeze)
    return value, index


def _median(self: TReal, dim: int | None, keepdim: bool, ignore_nan: bool) -> tuple[TReal, INT64]:
    x = self if dim is not None else op.Reshape(self, op.Constant(value_ints=[-1]))
    if len(self.shape) == 0 and dim is not None:
        return op.Identity(self), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    rank = 1 if dim is None else len(x.shape)
    axis = 0 if dim is None else dim % rank
    if dim is None:  # flattened: the length is the element count
        length = math.prod(self.shape) if all(isinstance(d, int) for d in self.shape) else None
    else:
        length = x.shape[axis]
    floats = _is_float(x)
    if ignore_nan and floats:  # the lower median of the non-NaN values (NaN when there are none)
        count = op.ReduceSum(
            op.Cast(op.Not(op.IsNaN(x)), to=INT64.dtype), op.Constant(value_ints=[axis]), keepdims=True
        )
        position = op.Div(op.Sub(count, op.Constant(value_ints=[1])), op.Constant(value_ints=[2]))
        position = op.Max(position, op.Constant(value_ints=[0]))
        return _kth_smallest(x, position, axis, keepdim)
    if not isinstance(length, int):
        raise NotImplementedError("median over a dynamic dim has no lowering here")
    value, index = _kth_smallest(x, (length - 1) // 2, axis, keepdim)
    if floats:  # any NaN makes the median NaN, at the first NaN's index
        nan = op.IsNaN(x)
        has_nan = op.ReduceMax(op.Cast(nan, to=INT32.dtype), op.Constant(value_ints=[axis]), keepdims=keepdim)
        has_nan = op.Cast(has_nan, to=BOOL.dtype)
        first_nan = op.ArgMax(op.Cast(nan, to=INT32.dtype), axis=axis, keepdims=keepdim)
        value = op.Where(has_nan, _const(float("nan"), x), value)
        index = op.Where(has_nan, first_nan, index)
    return value, index


@lowering("aten::median")
def median(self: TReal) -> TReal:
    value, _ = _median(self, None, False, ignore_nan=False)
    return value


@lowering("aten::median.dim")
def median_dim(self: TReal, dim: int, keepdim: bool = False) -> tuple[TReal, INT64]:
    return _median(self, dim, keepdim, ignore_nan=False)


@lowering("aten::nanmedian")
def nanmedian(self: TReal) -> TReal:
    value, _ = _median(self, None, False, ignore_nan=True)
    return value


@lowering("aten::nanmedian.dim")
def nanmedian_dim(self: TReal, dim: int, keepdim: bool = False) -> tuple[TReal, INT64]:
    return _median(self, dim, keepdim, ignore_nan=True)


@lowering("aten::kthvalue")
def kthvalue(self: TReal, k: int, dim: int = -1, keepdim: bool = False) -> tuple[TReal, INT64]:
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    return _kth_smallest(self, k - 1, dim % len(self.shape), keepdim)


@lowering("aten::mode")
def mode(self: TReal, dim: int = -1, keepdim: bool = False) -> tuple[TReal, INT64]:
    """The most frequent value along `dim` (the smallest among equally frequent ones) and its last index.

    Occurrences are counted by comparing every pair of elements of a slice, so memory grows with the
    square of the dim's length.
    """
    if len(self.shape) == 0:
        return op.Identity(self), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    dtype = self.dtype
    x = op.Cast(self, to=INT32.dtype) if dtype in (*_NARROW_INTS, ir.DataType.BOOL) else self
    axis, x_i, x_j, _, _ = _prefix_layout(x, dim)
    counts = op.ReduceSum(
        op.Cast(op.Equal(x_i, x_j), to=INT64.dtype), op.Constant(value_ints=[axis + 1]), keepdims=False
    )
    most = op.ReduceMax(counts, op.Constant(value_ints=[axis]), keepdims=True)
    largest = op.ReduceMax(x, op.Constant(value_ints=[axis]), keepdims=True)
    candidates = op.Where(op.Equal(counts, most), x, largest)
    value = op.ReduceMin(candidates, op.Constant(value_ints=[axis]), keepdims=True)
    index = op.ArgMax(op.Cast(op.Equal(x, value), to=INT32.dtype), axis=axis, keepdims=True, select_last_index=1)
    if not keepdim:
        squeeze = op.Constant(value_ints=[axis])
        value, index = op.Squeeze(value, squeeze), op.Squeeze(index, squeeze)
    return (op.Cast(value, to=dtype) if value.dtype != dtype else value), index


# --- ops torch.export keeps whole (CompositeImplicit), lowered so that its graph needs no decomposition ------------
@lowering("aten::batch_norm")
def batch_norm(
    input: TFloat,
    weight: TFloat | None = None,
    bias: TFloat | None = None,
    running_mean: TFloat | None = None,
    running_var: TFloat | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    cudnn_enabled: bool = True,
) -> TFloat:
    del cudnn_enabled
    batch_statistics = training or running_mean is None or running_var is None
    output, _, _, _, _ = _batch_norm(input, weight, bias, running_mean, running_var, batch_statistics, momentum, eps)
    return output


def _adaptive_windows(length: int, size: int) -> list[tuple[int, int]]:
    """Eager's adaptive windows: [floor(i*L/S), ceil((i+1)*L/S)) for each of the S outputs."""
    return [((i * length) // size, -((-(i + 1) * length) // size)) for i in range(size)]


def _adaptive_mean(x: TFloat, axis: int, length: int, size: int) -> TFloat:
    """Average each adaptive window along `axis`: one ReduceMean per window (a NaN stays in its window)."""
    windows = _adaptive_windows(length, size)
    if all(end - start == windows[0][1] - windows[0][0] for start, end in windows) and length % size == 0:
        width = length // size  # equal windows: a reshape and one ReduceMean
        shape = op.Concat(
            op.Shape(x, start=0, end=axis), op.Constant(value_ints=[size, width]), op.Shape(x, start=axis + 1), axis=0
        )
        return op.ReduceMean(op.Reshape(x, shape), op.Constant(value_ints=[axis + 1]), keepdims=False)
    parts = []
    for start, end in windows:
        window = op.Slice(
            x, op.Constant(value_ints=[start]), op.Constant(value_ints=[end]), op.Constant(value_ints=[axis])
        )
        parts.append(op.ReduceMean(window, op.Constant(value_ints=[axis]), keepdims=True))
    return op.Concat(*parts, axis=axis)


@lowering("aten::adaptive_avg_pool2d")
def adaptive_avg_pool2d(self: TFloat, output_size: Sequence[int]) -> TFloat:
    """Global pooling as one ReduceMean; other sizes average each of eager's windows, rows then columns."""
    x = _in_float32(self)
    out_h, out_w = output_size
    height, width = self.shape[-2], self.shape[-1]
    if (out_h, out_w) == (1, 1):
        return _back(op.ReduceMean(x, op.Constant(value_ints=[-2, -1]), keepdims=True), self)
    if not isinstance(height, int) or not isinstance(width, int):
        raise NotImplementedError("adaptive_avg_pool2d to a size other than 1x1 needs static spatial dims")
    rank = len(self.shape)
    rows = _adaptive_mean(x, rank - 2, height, out_h)
    return _back(_adaptive_mean(rows, rank - 1, width, out_w), self)


@lowering("aten::to.dtype")
def to_dtype(
    self: TReal, dtype: int, non_blocking: bool = False, copy: bool = False, memory_format: str | None = None
) -> TReal:
    del non_blocking, copy, memory_format
    return op.Cast(self, to=dtype)


@lowering("aten::numpy_T")
def numpy_t(self: TReal) -> TReal:
    return op.Transpose(self, perm=list(reversed(range(len(self.shape)))))


@lowering("aten::squeeze.dims")
def squeeze_dims(self: TReal, dim: Sequence[int]) -> TReal:
    """Eager drops only the listed dims that have size 1 (others stay); a 0-d tensor stays as it is."""
    rank = len(self.shape)
    axes = sorted({d % rank for d in dim} if rank else set())
    ones = [a for a in axes if isinstance(self.shape[a], int) and self.shape[a] == 1]
    if any(not isinstance(self.shape[a], int) for a in axes):
        raise NotImplementedError("squeeze of a dynamic dim: whether it is 1 is unknown at export")
    if not ones:
        return op.Identity(self)
    return op.Squeeze(self, op.Constant(value_ints=ones))


@lowering("aten::_conj_physical", "aten::conj_physical")
def conj_physical_real(self: TReal) -> TReal:
    """The conjugate of a real tensor is the tensor itself."""
    return op.Identity(self)


@lowering("aten::native_batch_norm")
def native_batch_norm(
    input: TFloat,
    weight: TFloat | None = None,
    bias: TFloat | None = None,
    running_mean: TFloat | None = None,
    running_var: TFloat | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[TFloat, TFloat, TFloat]:
    """(output, save_mean, save_rstd): the batch's statistics in training (or without running ones),
    else the running ones with empty save_mean/save_rstd, as eager. Capture decomposes a graph that
    trains (the running statistics' update), so this lowering never has to write them."""
    batch_statistics = training or running_mean is None or running_var is None
    output, save_mean, save_rstd, _, _ = _batch_norm(
        input, weight, bias, running_mean, running_var, batch_statistics, momentum, eps
    )
    return output, save_mean, save_rstd
