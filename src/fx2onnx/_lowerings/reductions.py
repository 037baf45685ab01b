"""Reductions and scans: sum/prod/mean/var/std, covariance, all/any, min/max/median, norms (vector norms, cdist's
pairwise distances), cumulative ops, logsumexp/logcumsumexp, histograms.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import (
    BFLOAT16,
    BOOL,
    DOUBLE,
    FLOAT16,
    INT8,
    INT16,
    INT32,
    INT64,
    UINT8,
    UINT16,
    UINT32,
    UINT64,
)
from onnxscript import opset18 as op

from fx2onnx._emit.context import LoweringContext
from fx2onnx._lowerings.builders import (
    _BITS,
    _NARROW_INTS,
    _NUMPY,
    TFloat,
    TIntegral,
    TOther,
    TReal,
    _back,
    _cast,
    _const,
    _flat,
    _in_float32,
    _int_const,
    _is_float,
    _log_softmax,
    _p_norm,
    _positive_zero,
    _wide,
    log1p,
)
from fx2onnx._lowerings.rules import lowering


# --- log_softmax and logsumexp ----------------------------------------------------------------------------------
@lowering("aten::log_softmax.int")
def log_softmax(self: TFloat, dim: int, dtype: int | None = None) -> TFloat:
    return _log_softmax(_cast(self, ir.DataType(dtype)) if dtype is not None else self, dim)


@lowering("aten::_log_softmax")
def log_softmax_internal(self: TFloat, dim: int, half_to_float: bool) -> TFloat:
    return _log_softmax(_cast(self, ir.DataType.FLOAT) if half_to_float else self, dim)


TLowPrecision = TypeVar("TLowPrecision", FLOAT16, BFLOAT16)


def _logsumexp(x: TFloat, dim: Sequence[int], keepdim: bool) -> TFloat:
    """Eager's formula: max + log(sum(exp(x - max))), the max taken as 0 where it is infinite (a row of -inf only
    gives -inf, a +inf gives inf, a NaN NaN). ReduceLogSumExp gives the same in ONNX Runtime, but constant folding
    evaluates it with ONNX's reference implementation, which subtracts an infinite max: NaN for a row of -inf."""
    axes = op.Constant(value_ints=list(dim)) if dim else None
    largest = op.ReduceMax(x, axes, keepdims=True)
    shift = op.Where(op.IsInf(largest), _const(0.0, x), largest)
    total = op.ReduceSum(op.Exp(op.Sub(x, shift)), axes, keepdims=keepdim)
    return op.Add(op.Log(total), shift if keepdim else op.ReduceMax(shift, axes, keepdims=False))


@lowering("aten::logsumexp", variant="float16")
def logsumexp_low_precision(self: TLowPrecision, dim: Sequence[int], keepdim: bool = False) -> TLowPrecision:
    """In float32, rounded once: ONNX Runtime's float16/bfloat16 ReduceLogSumExp does not subtract the max first
    (inf for values near the dtype's max, where eager gives the max)."""
    if len(self.shape) == 0:
        return op.Identity(self)
    return _back(_logsumexp(_in_float32(self), dim, keepdim), self)


@lowering("aten::logsumexp")
def logsumexp(self: TFloat, dim: Sequence[int], keepdim: bool = False) -> TFloat:
    if len(self.shape) == 0:
        return op.Identity(self)
    return _logsumexp(self, dim, keepdim)


# --- logcumsumexp -------------------------------------------------------------------------------------------------
# torchlib's is max + Log(CumSum(Exp(x - max))) with one max over the whole dim: NaN once an input is +-inf (inf - inf),
# -inf (or a few digits) for a prefix far below the later maximum. Eager folds each element into a running
# log-sum-exp (ReduceOpsKernel.cpp's _log_add_exp_helper, in double for float32). Here a prefix scan in
# ceil(log2(n)) doubling steps (Hillis-Steele): step k combines each partial with the one 2^k places before it.
# A partial is a pair (peak, excess) standing for peak + log1p(excess), excess = sum(exp(x_j - peak)) - 1: no Log
# in the steps, and the sum keeps relative accuracy where it is small. Infinities need no special case: peak is x
# clamped to the finite range and each element starts with excess exp(x - peak) - 1, which is 0 for finite x, -1
# for -inf (nothing to add; an all -inf prefix ends as -inf) and inf for +inf (inf from there on). NaN propagates
# through Max, Exp and Add. Padding holds the empty partial (lowest float, -1).
def _scan_step(peak: TFloat, excess: TFloat, pads: INT64, axes: INT64) -> tuple[TFloat, TFloat]:
    lowest = _const(float(-np.finfo(_NUMPY[peak.dtype]).max), peak)
    earlier_peak = op.Pad(peak, pads, lowest, axes)
    earlier_excess = op.Pad(excess, pads, _const(-1.0, excess), axes)
    new_peak = op.Max(peak, earlier_peak)
    own = op.Exp(op.Sub(peak, new_peak))
    other = op.Exp(op.Sub(earlier_peak, new_peak))
    # One of own/other is 1 (the larger peak's), so own + other - 1 is exactly the smaller of them.
    combined = op.Add(op.Add(op.Mul(excess, own), op.Mul(earlier_excess, other)), op.Min(own, other))
    return new_peak, combined


def _doubling_loop(
    ctx: LoweringContext, length: INT64, peak: TFloat, excess: TFloat, axes: INT64, direction: INT64
) -> tuple[TFloat, TFloat]:
    """The doubling steps for a dim whose length is known only at run time: an ONNX Loop while 2^k < length."""

    def body(iteration: ir.Value, carried: list[ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
        shift, peak_in, excess_in = carried
        peak_out, excess_out = _scan_step(peak_in, excess_in, op.Mul(direction, shift), axes)
        doubled = op.Add(shift, shift)
        return op.Less(doubled, length), [doubled, peak_out, excess_out]

    one = op.Constant(value=ir.tensor(1, dtype=ir.DataType.INT64))
    _, final_peak, final_excess = ctx.loop(length, op.Less(one, length), [one, peak, excess], body, name="scan")
    return final_peak, final_excess


@lowering("aten::logcumsumexp", context=True)
def logcumsumexp(ctx: LoweringContext, self: TFloat, dim: int) -> TFloat:
    """log(cumsum(exp(x))) along `dim`, stable for any magnitudes and at +-inf/NaN; float16/bfloat16 in float32.
    ceil(log2(n)) steps of a dozen elementwise nodes over the whole tensor: about 5 to 10 times torchlib's time."""
    x = _in_float32(self)
    rank = len(x.shape)
    if rank == 0:
        return self
    dim = dim % rank
    largest = float(np.finfo(_NUMPY[x.dtype]).max)
    peak = op.Clip(x, _const(-largest, x), _const(largest, x))  # NaN stays NaN
    excess = op.Sub(op.Exp(op.Sub(x, peak)), _const(1.0, x))
    axes = op.Constant(value_ints=[dim])
    length = x.shape[dim]
    if isinstance(length, int):
        shift = 1
        while shift < length:
            peak, excess = _scan_step(peak, excess, op.Constant(value_ints=[shift, -shift]), axes)
            shift *= 2
    else:
        direction = op.Constant(value_ints=[1, -1])  # pads: `shift` before, -`shift` (cut) after
        size = op.Squeeze(op.Shape(x, start=dim, end=dim + 1))
        peak, excess = _doubling_loop(ctx, size, peak, excess, axes, direction)
    return _back(op.Add(peak, log1p(excess)), self)


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


# torch.max(x)/torch.min(x) over every element: NaN when one is NaN, as amax/amin (torchlib's ReduceMax skipped it).
@lowering("aten::max")
def max_all(self: TReal) -> TReal:
    if len(self.shape) == 0:
        return op.Identity(self)
    return _nan_propagated(self, op.ReduceMax(self, keepdims=False), None, False)


@lowering("aten::min")
def min_all(self: TReal) -> TReal:
    if len(self.shape) == 0:
        return op.Identity(self)
    return _nan_propagated(self, op.ReduceMin(self, keepdims=False), None, False)


def _arg_extreme(self: TReal, dim: int | None, keepdim: bool, largest: bool) -> INT64:
    """argmax/argmin: the first NaN's index in a slice holding one, as eager (ONNX Runtime's ArgMax skips NaN);
    dim=None: the index into the flattened tensor (keepdim: shaped [1] * rank)."""
    if dim is None:
        flat = op.Reshape(self, op.Constant(value_ints=[-1]))
        index = _extreme_along(flat, 0, False, largest)[1]
        return op.Reshape(index, op.Constant(value_ints=[1] * len(self.shape))) if keepdim else index
    return _extreme_along(self, dim, keepdim, largest)[1]


@lowering("aten::argmax")
def argmax(self: TReal, dim: int | None = None, keepdim: bool = False) -> INT64:
    return _arg_extreme(self, dim, keepdim, largest=True)


@lowering("aten::argmin")
def argmin(self: TReal, dim: int | None = None, keepdim: bool = False) -> INT64:
    return _arg_extreme(self, dim, keepdim, largest=False)


def _truth(self: TReal, dim: Sequence[int] | int | None, keepdim: bool, every: bool) -> BOOL:
    """all (every=True) / any over `dim` (all axes when None or empty): a min / max of 0/1 values. Bool, except
    for uint8 input: eager's all/any of uint8 returns uint8 0/1."""
    truth = op.Cast(self, to=BOOL.dtype) if self.dtype != ir.DataType.BOOL else self
    if len(self.shape) == 0:
        result = op.Identity(truth)
    else:
        # all(x) is not any(not x): a max of 0/1 values compared with 0, since ONNX Runtime's ReduceMax over an
        # empty dim gives the lowest int32 (any() of nothing was True; eager: False, and all() of nothing True).
        as_int = op.Cast(op.Not(truth) if every else truth, to=INT32.dtype)
        found = op.Greater(op.ReduceMax(as_int, _axes(dim), keepdims=keepdim), op.Constant(value_int=0))
        result = op.Not(found) if every else found
    return op.Cast(result, to=UINT8.dtype) if self.dtype == ir.DataType.UINT8 else result


@lowering("aten::all")
def all_elements(self: TReal) -> BOOL:
    return _truth(self, None, False, every=True)


@lowering("aten::_is_all_true")
def is_all_true(self: BOOL) -> BOOL:
    """The condition of ``torch._check_tensor_all`` (transformers' ``torch_compilable_check``: LLaVA's image tokens
    against its image features), which torch.export turns into ``item`` and a runtime assertion checked in the graph."""
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


# Eager's CPU cumsum/cumprod of floats accumulate in at::acc_type: float32 in float64, float16/bfloat16 in float32,
# each output rounded once ([3e38, 3e38, -3e38].cumsum() is [3e38, inf, 3e38]; in float32 the last was NaN).
_FLOAT_ACCUMULATOR = {
    ir.DataType.FLOAT: ir.DataType.DOUBLE,
    ir.DataType.FLOAT16: ir.DataType.FLOAT,
    ir.DataType.BFLOAT16: ir.DataType.FLOAT,
}


@lowering("aten::cumprod")
def cumprod(self: TReal, dim: int, dtype: int | None = None) -> TReal:
    """Running product (`dtype`, when given, is applied first, as eager does); floats accumulate as eager's."""
    x = op.Cast(self, to=dtype) if dtype is not None else self
    if len(self.shape) == 0:
        return op.Identity(x)
    if x.dtype == ir.DataType.BOOL:  # eager's product of bools is an integer; promotion gives it another type
        x = op.Cast(x, to=INT64.dtype)
    result_dtype = x.dtype
    if result_dtype in _FLOAT_ACCUMULATOR:
        x = op.Cast(x, to=_FLOAT_ACCUMULATOR[result_dtype])
    axis, _, x_j, mask, _ = _prefix_layout(x, dim)
    # x_j is Where's second branch, so that a -0.0 stays -0.0: ONNX Runtime's Where turns a -0.0 of its first branch
    # into +0.0, and its NotWhereFusion swaps the branches of a Where(Not(c), ...) (docs/ort-defects.md).
    outside = op.Equal(mask, op.Constant(value=ir.tensor(False)))
    factors = op.Where(outside, op.CastLike(1, x), x_j)
    product = op.ReduceProd(factors, op.Constant(value_ints=[axis + 1]), keepdims=False)
    return op.Cast(product, to=result_dtype) if result_dtype in _FLOAT_ACCUMULATOR else product


# --- means: NaN over nothing, +0.0 over -0.0s ---------------------------------------------------------------
# Eager's mean is its sum (from a +0.0 accumulator) over the count: +0.0 over -0.0s, where ReduceMean gives -0.0.
# The fix (Where(mean == 0, +0.0, mean), on the reduced tensor) is left out where the mean's input is never -0.0
# (x ** 2, x * x, abs, exp: RMSNorm's mean of squares) and where the mean only centers its own input (x - mean(x),
# LayerNorm's first step): those plain ReduceMean patterns are what onnxscript's RMSNormalization fusion and ONNX
# Runtime's (Simplified)LayerNormFusion match. The price of the second exception: a row of -0.0s centered without
# the fusion (optimizations off) gives +0.0 where eager gives -0.0.
_SIGN_PRESERVING = {
    "prims.convert_element_type.default",
    "aten._to_copy.default",
    "aten.to.dtype",
    "aten.clone.default",
}
_NEVER_NEGATIVE_ZERO = {"aten.abs.default", "aten.square.default", "aten.exp.default"}


def _never_negative_zero(node: object, depth: int = 0) -> bool:
    """The FX value is never -0.0 (but may be NaN): an even power, a square, an absolute value, an exponential."""
    target, args = str(getattr(node, "target", "")), getattr(node, "args", ())
    if depth > 4 or not args:
        return False
    if target in _SIGN_PRESERVING:
        return _never_negative_zero(args[0], depth + 1)
    if target in _NEVER_NEGATIVE_ZERO:
        return True
    if target == "aten.pow.Tensor_Scalar" and len(args) > 1 and isinstance(args[1], (int, float)):
        return float(args[1]) % 2 == 0 and args[1] > 0
    return target == "aten.mul.Tensor" and len(args) > 1 and args[0] is args[1]


def _only_centers_its_input(ctx: LoweringContext) -> bool:
    source = ctx.node.args[0] if ctx.node.args else None
    users = list(ctx.node.users)
    return bool(users) and all(
        str(user.target) == "aten.sub.Tensor" and user.args[:2] == (source, ctx.node) for user in users
    )


def _mean_context(ctx: LoweringContext) -> tuple[bool, bool]:
    """What :func:`_mean` reads of its context: whether it leaves out the +0.0 fix, and why."""
    source = ctx.node.args[0] if ctx.node.args else None
    return (_never_negative_zero(source), _only_centers_its_input(ctx))


def _mean(ctx: LoweringContext, self: TFloat, dims: Sequence[int] | None, keepdim: bool, dtype: int | None) -> TFloat:
    """ReduceMean, NaN where it reduced no element (ONNX Runtime gives 0): a non-empty input has no empty
    reduction, and an empty one has only those (or no output element)."""
    x = op.Cast(self, to=dtype) if dtype is not None else self
    if len(x.shape) == 0:
        return op.Identity(x)
    mean = op.ReduceMean(x, _axes(dims), keepdims=keepdim)
    if not any(_mean_context(ctx)):
        mean = _positive_zero(mean)
    if all(isinstance(size, int) and size > 0 for size in x.shape):  # static and non-empty: no empty reduction
        return mean
    empty = op.Equal(op.Size(x), op.Constant(value_int=0))
    return op.Where(empty, op.CastLike(float("nan"), mean), mean)


@lowering("aten::mean", context=True, context_key=_mean_context)
def mean_float(ctx: LoweringContext, self: TFloat, dtype: int | None = None) -> TFloat:
    return _mean(ctx, self, None, False, dtype)


@lowering("aten::mean.dim", context=True, context_key=_mean_context)
def mean_dim_float(
    ctx: LoweringContext,
    self: TFloat,
    dim: Sequence[int] | None = None,
    keepdim: bool = False,
    dtype: int | None = None,
) -> TFloat:
    return _mean(ctx, self, dim, keepdim, dtype)


# Eager multiplies float16/bfloat16 elements one by one into an accumulator of their own dtype, each partial product
# rounded (`[-1.75, 65504, 6.1e-05, -1.25].prod()` overflows to inf at the first step, where a float32 product is
# 8.74: fuzz seed 32527). Up to this many elements along a static dim, the product is a chain of Muls in the
# dtype (legalized as float32 Muls each rounded back), in eager's order; longer ones keep one float32 ReduceProd.
_ROUNDED_PRODUCT_LENGTH = 16


def _rounded_product(x: TReal, axis: int, keepdim: bool) -> TReal | None:
    """The product along `axis` as eager's float16/bfloat16 loop rounds it, or None where it is not chained."""
    if x.dtype not in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        return None
    length = x.shape[axis]
    if not isinstance(length, int) or not 1 <= length <= _ROUNDED_PRODUCT_LENGTH:
        return None
    parts = op.Split(x, axis=axis, num_outputs=length) if length > 1 else [x]
    parts = [parts] if isinstance(parts, ir.Value) else list(parts)
    product = parts[0]
    for part in parts[1:]:
        product = op.Mul(product, part)
    return product if keepdim else op.Squeeze(product, op.Constant(value_ints=[axis]))


@lowering("aten::prod.dim_int")
def prod_dim(self: TReal, dim: int, keepdim: bool = False, dtype: int | None = None) -> TReal:
    """Product over one dim; on a 0-d tensor, the tensor itself (ONNX refuses the axis)."""
    x = op.Cast(self, to=dtype) if dtype is not None else self
    if len(self.shape) == 0:
        return op.Identity(x)
    rounded = _rounded_product(x, dim % len(self.shape), keepdim)
    if rounded is not None:
        return rounded
    return op.ReduceProd(x, op.Constant(value_ints=[dim]), keepdims=keepdim)


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


def _kth_smallest_not_nan(x: TReal, position: INT64 | int, axis: int, keepdim: bool) -> tuple[TReal, INT64]:
    """_kth_smallest of the non-NaN elements, NaN sorting after +inf (fuzz seed 20202016: nanmedian([nan, inf])
    is inf at index 1). _sortable takes NaN as +inf, a tie that TopK breaks by index; a stable partition putting
    the NaNs last along `axis` first (TopK keeps ties in index order) makes that tie break right."""
    length = op.Shape(x, start=axis, end=axis + 1)
    _, nans_last = op.TopK(op.Cast(op.IsNaN(x), to=INT32.dtype), length, axis=axis, largest=0, sorted=1)
    value, index = _kth_smallest(op.GatherElements(x, nans_last, axis=axis), position, axis, keepdim=True)
    index = op.GatherElements(nans_last, index, axis=axis)
    if not keepdim:
        squeeze = op.Constant(value_ints=[axis])
        value, index = op.Squeeze(value, squeeze), op.Squeeze(index, squeeze)
    return value, index


def _lower_median_position(length: INT64) -> INT64:
    """(length - 1) // 2 of a run-time length (0 for a length of 0, as eager's lower median index)."""
    return op.Max(
        op.Div(op.Sub(length, op.Constant(value_ints=[1])), op.Constant(value_ints=[2])), op.Constant(value_ints=[0])
    )


def _sorts_last(x: TReal) -> TReal:
    """A [1] filler that _kth_smallest sorts after every element of x (TopK keeps ties in index order)."""
    if _is_float(x):
        return op.Constant(value=ir.tensor([math.nan], dtype=x.dtype))  # _sortable takes NaN as +inf
    if x.dtype == ir.DataType.BOOL:
        return op.Constant(value=ir.tensor([True], dtype=x.dtype))
    return op.Constant(value=ir.tensor(np.array([np.iinfo(x.dtype.numpy()).max], dtype=x.dtype.numpy())))


def _median_of_flat_dynamic(x: TReal, ignore_nan: bool) -> TReal:
    """The median of a flat tensor whose length is known at run time only (fuzz seed 10003360: a median of
    x[x != 0]), which may then have no element: eager gives NaN (cast for an integer dtype). A filler that sorts
    last is appended, so the lower-median position (from the length without it) always exists."""
    floats = _is_float(x)
    padded = op.Concat(x, _sorts_last(x), axis=0)
    if ignore_nan and floats:  # the lower median of the non-NaN values; none: the NaN filler
        count = op.ReduceSum(op.Cast(op.Not(op.IsNaN(x)), to=INT64.dtype), op.Constant(value_ints=[0]), keepdims=True)
        return _kth_smallest_not_nan(padded, _lower_median_position(count), 0, keepdim=False)[0]
    length = op.Shape(x)
    value = _kth_smallest(padded, _lower_median_position(length), 0, keepdim=False)[0]
    if floats:  # any NaN makes the median NaN (no element: the NaN filler is taken)
        nan_count = op.ReduceSum(op.Cast(op.IsNaN(x), to=INT64.dtype), op.Constant(value_ints=[0]), keepdims=False)
        return op.Where(op.Greater(nan_count, op.Constant(value_int=0)), _const(math.nan, x), value)
    nan = op.Cast(op.Constant(value=ir.tensor(math.nan, dtype=ir.DataType.FLOAT)), to=x.dtype)
    return op.Where(op.Equal(op.Squeeze(length), op.Constant(value_int=0)), nan, value)


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
    if dim is None and length == 0:  # eager's median of no element is NaN (and NaN cast for an integer dtype)
        nan = op.Constant(value=ir.tensor(math.nan, dtype=ir.DataType.FLOAT))
        return op.Cast(nan, to=self.dtype), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    if length is None:  # flattened, of a run-time length
        return _median_of_flat_dynamic(x, ignore_nan), op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    if ignore_nan and floats:  # the lower median of the non-NaN values (NaN when there are none)
        count = op.ReduceSum(
            op.Cast(op.Not(op.IsNaN(x)), to=INT64.dtype), op.Constant(value_ints=[axis]), keepdims=True
        )
        position = op.Div(op.Sub(count, op.Constant(value_ints=[1])), op.Constant(value_ints=[2]))
        position = op.Max(position, op.Constant(value_ints=[0]))
        return _kth_smallest_not_nan(x, position, axis, keepdim)
    if isinstance(length, int):
        position: INT64 | int = (length - 1) // 2
    else:  # a dynamic dim (eager refuses one of size 0): the position in the statistics' shape, for GatherElements
        statistics_shape = op.Concat(
            op.Shape(x, start=0, end=axis), op.Constant(value_ints=[1]), op.Shape(x, start=axis + 1), axis=0
        )
        position = op.Expand(_lower_median_position(op.Shape(x, start=axis, end=axis + 1)), statistics_shape)
    value, index = _kth_smallest(x, position, axis, keepdim)
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
    if _is_float(self):  # NaN sorts after +inf (kthvalue(k=1) of [nan, inf, inf] is inf: fuzz seed 50003134)
        return _kth_smallest_not_nan(self, k - 1, dim % len(self.shape), keepdim)
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
    if _is_float(x):  # a NaN counts for nothing; as the filler (the ReduceMax of a slice holding one) it won
        largest = _const(math.inf, x)
    else:
        largest = op.ReduceMax(x, op.Constant(value_ints=[axis]), keepdims=True)
    candidates = op.Where(op.Equal(counts, most), x, largest)
    value = op.ReduceMin(candidates, op.Constant(value_ints=[axis]), keepdims=True)
    index = op.ArgMax(op.Cast(op.Equal(x, value), to=INT32.dtype), axis=axis, keepdims=True, select_last_index=1)
    if not keepdim:
        squeeze = op.Constant(value_ints=[axis])
        value, index = op.Squeeze(value, squeeze), op.Squeeze(index, squeeze)
    return (op.Cast(value, to=dtype) if value.dtype != dtype else value), index


# --- sums and products -----------------------------------------------------------------------------------------
# ONNX Runtime's CumSum adds integers exactly (wrapping); its ReduceSum and ReduceProd of int64 go through double.
# A sum is the last element of a CumSum along the dim, a product the last of a running product built in ceil(log2 n)
# doubling steps (Hillis-Steele: step k multiplies each element by the one 2**k places before it); both start from
# the identity padded in front, so an empty dim gives 0 (1). Several dims reduce one after the other: wrapping
# addition and multiplication are associative, so the order does not change the result.
TAccumulable = TypeVar("TAccumulable", BOOL, INT8, INT16, INT32, INT64, UINT8)


def _running_product_step(value: ir.Value, shift: ir.Value | int, axis: int) -> ir.Value:
    """Each element times the one `shift` places before it along `axis` (1 before the start)."""
    rank = len(value.shape)
    if isinstance(shift, int):
        pads = op.Constant(
            value_ints=[shift if a == axis else 0 for a in range(rank)]
            + [-shift if a == axis else 0 for a in range(rank)]
        )
    else:
        zeros = op.Constant(value_ints=[0] * rank)
        at_axis = op.Constant(value_ints=[1 if a == axis else 0 for a in range(rank)])
        before = op.Mul(at_axis, op.Reshape(shift, op.Constant(value_ints=[1])))
        pads = op.Concat(op.Add(zeros, before), op.Neg(before), axis=0)
    earlier = op.Pad(value, pads, _int_const(1, value.dtype))
    return op.Mul(value, earlier)


def _running_product(ctx: LoweringContext, value: ir.Value, axis: int, length: int | ir.SymbolicDim | None) -> ir.Value:
    """cumprod along `axis` (of `length`, when known at export) in value's (int32/int64) dtype, exact with wrapping."""
    if isinstance(length, int):
        shift = 1
        while shift < length:
            value = _running_product_step(value, shift, axis)
            shift *= 2
        return value
    return _running_product_loop(ctx, value, axis)


def _running_product_loop(ctx: LoweringContext, value: ir.Value, axis: int) -> ir.Value:
    """The doubling steps for a dim whose length is known only at run time: an ONNX Loop while 2**k < length."""
    length = op.Squeeze(op.Shape(value, start=axis, end=axis + 1))

    def body(iteration: ir.Value, carried: list[ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
        shift, running = carried
        stepped = _running_product_step(running, shift, axis)
        doubled = op.Add(shift, shift)
        return op.Less(doubled, length), [doubled, stepped]

    one = op.Constant(value=ir.tensor(1, dtype=ir.DataType.INT64))
    _, result = ctx.loop(length, op.Less(one, length), [one, value], body, name="product", carried_shapes=True)
    result.shape = ir.Shape(value.shape)
    return result


def _accumulator(result_dtype: ir.DataType) -> ir.DataType | None:
    """The integer dtype eager's integer accumulation into `result_dtype` runs in (bool: int64, nonzero is True);
    None for a float `dtype=`, which computes in that float."""
    if result_dtype == ir.DataType.BOOL:
        return ir.DataType.INT64
    return _wide(result_dtype) if result_dtype in _BITS else None


def _reduced(
    ctx: LoweringContext, self: ir.Value, dims: list[int], keepdim: bool, dtype: int | None, product: bool
) -> ir.Value:
    result_dtype = ir.DataType(dtype) if dtype is not None else ir.DataType.INT64
    accumulator = _accumulator(result_dtype)
    rank = len(self.shape)
    if accumulator is None:
        x = _cast(self, result_dtype)
        axes = op.Constant(value_ints=dims) if dims and rank else None
        return (op.ReduceProd if product else op.ReduceSum)(x, axes, keepdims=keepdim) if rank else x
    value = _cast(_cast(self, result_dtype), accumulator)
    if rank == 0:
        return _cast(value, result_dtype)
    axes = sorted({d % rank for d in dims}) if dims else list(range(rank))
    identity = _int_const(1 if product else 0, value.dtype)
    for axis in axes:
        pads = op.Constant(value_ints=[1 if a == axis else 0 for a in range(rank)] + [0] * rank)
        padded = op.Pad(value, pads, identity)
        if product:
            length = value.shape[axis]
            running = _running_product(ctx, padded, axis, length + 1 if isinstance(length, int) else None)
        else:
            running = op.CumSum(padded, op.Constant(value=ir.tensor(axis, dtype=ir.DataType.INT64)))
        value = op.Slice(
            running, op.Constant(value_ints=[-1]), op.Constant(value_ints=[2**62]), op.Constant(value_ints=[axis])
        )
    if not keepdim:
        value = op.Squeeze(value, op.Constant(value_ints=axes))
    return _cast(value, result_dtype)


@lowering("aten::sum", context=True)
def sum_integer(ctx: LoweringContext, self: TAccumulable, dtype: int | None = None) -> INT64:
    return _reduced(ctx, self, [], False, dtype, product=False)


@lowering("aten::sum.dim_IntList", context=True)
def sum_dim_integer(
    ctx: LoweringContext,
    self: TAccumulable,
    dim: Sequence[int] | None = None,
    keepdim: bool = False,
    dtype: int | None = None,
) -> INT64:
    return _reduced(ctx, self, list(dim or []), keepdim, dtype, product=False)


@lowering("aten::prod", context=True)
def prod_integer(ctx: LoweringContext, self: TAccumulable, dtype: int | None = None) -> INT64:
    return _reduced(ctx, self, [], False, dtype, product=True)


@lowering("aten::prod.dim_int", variant="integer", context=True)
def prod_dim_integer(
    ctx: LoweringContext, self: TAccumulable, dim: int, keepdim: bool = False, dtype: int | None = None
) -> INT64:
    return _reduced(ctx, self, [dim], keepdim, dtype, product=True)


@lowering("aten::diff")
def diff(self: TReal, n: int = 1, dim: int = -1, prepend: TReal | None = None, append: TReal | None = None) -> TReal:
    """`n`-th forward difference along `dim`, after `prepend`/`append` are joined to `self` (transformers' mask code
    finds packed sequences with it). Each step subtracts neighbours, as eager does (integers wrap; bools differ by
    xor, eager's ``!=``)."""
    if n == 0:  # eager returns the input itself, without prepend and append
        return op.Identity(self)
    rank = len(self.shape)
    axis = dim % rank
    parts = [part for part in (prepend, self, append) if part is not None]
    value = op.Concat(*parts, axis=axis) if len(parts) > 1 else self
    axes = op.Constant(value=ir.tensor([axis], dtype=ir.DataType.INT64))
    zero = op.Constant(value=ir.tensor([0], dtype=ir.DataType.INT64))
    one = op.Constant(value=ir.tensor([1], dtype=ir.DataType.INT64))
    last = op.Constant(value=ir.tensor([-1], dtype=ir.DataType.INT64))
    end = op.Constant(value=ir.tensor([np.iinfo(np.int64).max], dtype=ir.DataType.INT64))
    for _ in range(n):
        later, earlier = op.Slice(value, one, end, axes), op.Slice(value, zero, last, axes)
        value = op.Xor(later, earlier) if self.dtype == ir.DataType.BOOL else op.Sub(later, earlier)
    return value


@lowering("aten::cumsum")
def cumsum_integer(self: TAccumulable, dim: int, dtype: int | None = None) -> INT64:
    """Eager accumulates integers and bools in int64 (returned) unless `dtype` is given; ONNX Runtime's CumSum has
    int32/int64 kernels, which wrap like eager's."""
    result_dtype = ir.DataType(dtype) if dtype is not None else ir.DataType.INT64
    if _accumulator(result_dtype) is None:  # a float dtype=: the float lowering, on the converted input
        return cumsum_float.func(_cast(self, result_dtype), dim)
    value = _cast(_cast(self, result_dtype), _accumulator(result_dtype))
    if len(value.shape) == 0:
        return _cast(value, result_dtype)
    summed = op.CumSum(value, op.Constant(value=ir.tensor(dim % len(value.shape), dtype=ir.DataType.INT64)))
    return _cast(summed, result_dtype)


@lowering("aten::cumprod", variant="integer", context=True)
def cumprod_integer(ctx: LoweringContext, self: TAccumulable, dim: int, dtype: int | None = None) -> INT64:
    result_dtype = ir.DataType(dtype) if dtype is not None else ir.DataType.INT64
    if _accumulator(result_dtype) is None:  # a float dtype=: the float lowering, on the converted input
        return cumprod.func(_cast(self, result_dtype), dim)
    value = _cast(_cast(self, result_dtype), _accumulator(result_dtype))
    if len(value.shape) == 0:
        return _cast(value, result_dtype)
    axis = dim % len(value.shape)
    return _cast(_running_product(ctx, value, axis, value.shape[axis]), result_dtype)


# Eager sums floats from a +0.0 accumulator: a sum (or running sum) of -0.0s is +0.0, where ONNX Runtime's
# ReduceSum/CumSum add the values themselves (-0.0).
def _from_positive_zero(summed: TFloat) -> TFloat:
    return _positive_zero(summed) if _is_float(summed) else summed


def _float_sum(self: TFloat, dims: Sequence[int], keepdim: bool, dtype: int | None) -> TFloat:
    x = _cast(self, ir.DataType(dtype)) if dtype is not None else self
    if len(x.shape) == 0:
        return _from_positive_zero(x)
    axes = op.Constant(value_ints=list(dims)) if dims else None
    if x.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        # eager adds float16/bfloat16 in float32; float64 here loses less to the order of the additions, though
        # not nothing: where huge terms cancel (bf16 [4e16, 3e38, -3e38, ...]) the order still decides what they
        # absorbed, and no order matches eager's for every input (the float edge tests leave such sums out)
        wide = op.ReduceSum(_cast(x, ir.DataType.DOUBLE), axes, keepdims=keepdim)
        return _from_positive_zero(_cast(wide, x.dtype))
    return _from_positive_zero(op.ReduceSum(x, axes, keepdims=keepdim))


@lowering("aten::sum", variant="float")
def sum_float(self: TFloat, dtype: int | None = None) -> TFloat:
    return _float_sum(self, [], False, dtype)


@lowering("aten::sum.dim_IntList", variant="float")
def sum_dim_float(
    self: TFloat, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: int | None = None
) -> TFloat:
    return _float_sum(self, list(dim or []), keepdim, dtype)


@lowering("aten::cumsum", variant="float")
def cumsum_float(self: TFloat, dim: int, dtype: int | None = None) -> TFloat:
    """Running sum (`dtype`, when given, is applied first), accumulated as eager's: from +0.0, float32 in float64 and
    float16/bfloat16 in float32 (_FLOAT_ACCUMULATOR)."""
    x = _cast(self, ir.DataType(dtype)) if dtype is not None else self
    if len(x.shape) == 0:
        return _from_positive_zero(x)
    wide = _cast(x, _FLOAT_ACCUMULATOR.get(x.dtype, x.dtype))
    axis = op.Constant(value=ir.tensor(dim % len(x.shape), dtype=ir.DataType.INT64))
    return _cast(_from_positive_zero(op.CumSum(wide, axis)), x.dtype)


@lowering("aten::unique_consecutive")
def unique_consecutive(
    self: TReal, return_inverse: bool = False, return_counts: bool = False, dim: int | None = None
) -> tuple[TReal, INT64, INT64]:
    """Flattened runs of equal elements: their values, each element's run index, each run's length.

    Inverse and counts are empty unless asked for, as in eager's aten op; `dim` is not supported here.
    """
    if dim is not None:
        raise NotImplementedError("unique_consecutive over a dim has no lowering here")
    flat = _flat(self)
    zero, one, last = op.Constant(value_ints=[0]), op.Constant(value_ints=[1]), op.Constant(value_ints=[-1])
    big = op.Constant(value_ints=[2**62])
    # A run starts at position 0 and wherever an element differs from the one before (NaN differs from NaN).
    differs = op.Not(op.Equal(op.Slice(flat, one, big), op.Slice(flat, zero, last)))
    count = op.Size(flat)
    first = op.Greater(op.Reshape(count, one), zero)  # position 0 starts a run unless there is no element
    starts = op.Concat(first, differs, axis=0)
    values = op.Compress(flat, starts, axis=0)
    empty = op.Constant(value=ir.tensor([], dtype=ir.DataType.INT64))
    inverse = counts = empty
    if return_inverse:
        run = op.Sub(op.CumSum(op.Cast(starts, to=INT64.dtype), zero), op.Constant(value_int=1))
        inverse = op.Reshape(run, op.Shape(self))
    if return_counts:
        positions = op.Reshape(op.NonZero(starts), last)
        ends = op.Concat(op.Slice(positions, one, big), op.Reshape(count, one), axis=0)
        counts = op.Sub(ends, positions)
    return values, inverse, counts


def _unique_with_nans(x: TFloat) -> tuple[TFloat, INT64, INT64]:
    """Unique of a float tensor, flattened: the sorted distinct non-NaN values, then one entry per NaN (eager's
    NaN equals nothing, itself included), with each element's entry and each entry's count. ONNX Runtime's Unique
    keys a sorted map by value, which a NaN breaks: [nan, 1, 2] gave one entry, NaN, counted 3 times."""
    flat = op.Reshape(x, op.Constant(value_ints=[-1]))
    nan = op.IsNaN(flat)
    values, _, inverse, counts = op.Unique(op.Compress(flat, op.Not(nan), axis=0), sorted=1)
    nan_count = op.ReduceSum(op.Cast(nan, to=INT64.dtype), op.Constant(value_ints=[0]), keepdims=True)
    distinct = op.Shape(values)
    values = op.Concat(values, op.Expand(op.CastLike(math.nan, x), nan_count), axis=0)
    counts = op.Concat(counts, op.Expand(op.Constant(value_ints=[1]), nan_count), axis=0)
    # the k-th NaN (in flat order) is entry distinct + k; the other elements take Unique's inverse, in order
    kept = op.Reshape(op.NonZero(op.Not(nan)), op.Constant(value_ints=[-1]))
    placed = op.ScatterElements(op.Expand(op.Constant(value_ints=[0]), op.Shape(flat)), kept, inverse, axis=0)
    nan_entry = op.Add(
        op.Sub(op.CumSum(op.Cast(nan, to=INT64.dtype), op.Constant(value_int=0)), op.Constant(value_ints=[1])), distinct
    )
    return values, op.Where(nan, nan_entry, placed), counts


@lowering("aten::_unique2")
def unique2(
    self: TReal, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False
) -> tuple[TReal, INT64, INT64]:
    """Sorted distinct values of the flattened input (eager sorts on CPU whatever `sorted` says).

    Bools go through uint8: ONNX Runtime has no Unique kernel for them. Inverse and counts are empty unless
    asked for, as in eager's aten op.
    """
    is_bool = self.dtype == ir.DataType.BOOL
    x = op.Cast(self, to=UINT8.dtype) if is_bool else self
    if _is_float(x):
        values, inverse, counts = _unique_with_nans(x)
    else:
        values, _, inverse, counts = op.Unique(x, sorted=1)
    if is_bool:
        values = op.Cast(values, to=BOOL.dtype)
    empty = op.Constant(value=ir.tensor(np.zeros((0,), dtype=np.int64)))
    inverse = op.Reshape(inverse, op.Shape(self), allowzero=1) if return_inverse else empty
    return values, inverse, (counts if return_counts else empty)


# --- variance and standard deviation with a correction -------------------------------------------------------------
# torch decomposes var/std(_mean).correction to prims::var, whose torchlib lowering divides by N - correction
# even when that is <= 0 and takes ReduceMean of empty tensors; eager divides sum((x - mean)^2) by
# max(0, N - correction), so an empty or one-element reduction gives NaN or inf exactly as IEEE does.
# Eager computes a variance two ways (ReduceOps.cpp, std_var_out). A float32/float64 reduction to one element
# (std_var_all_cpu): the mean in the dtype (sum(x) / n, which overflows near the dtype's max), then the squared
# deviations summed in float64, the root taken there, and the result rounded once. Any other (and float16/bfloat16):
# Welford's running mean, which never sums the values, so values near the max give a finite variance (0.0 for equal
# values). For the latter the values are divided by a power of two near their largest magnitude first (exact: only
# exponents change) and the results multiplied back.
_MIN_MAX_EXPONENT = {ir.DataType.FLOAT: (-126.0, 127.0), ir.DataType.DOUBLE: (-1022.0, 1023.0)}


def _power_of_two_scale(x: TFloat, axes: INT64 | None) -> TFloat:
    """2**floor(log2(max |x|)) over `axes` (kept), clipped to the normal exponents; 1 where the largest magnitude is
    0, infinite, NaN or absent (an empty reduction). The rounding of Log may make it a power too low or too high:
    any power of two scales exactly."""
    largest = op.ReduceMax(op.Abs(x), axes, keepdims=True)
    one = _const(1.0, x)
    usable = op.And(op.Greater(largest, _const(0.0, x)), op.Not(op.IsInf(largest)))
    low, high = _MIN_MAX_EXPONENT[x.dtype]
    exponent = op.Floor(op.Div(op.Log(op.Where(usable, largest, one)), _const(math.log(2.0), x)))
    exponent = op.Clip(exponent, _const(low, x), _const(high, x))
    return op.Where(usable, op.Pow(_const(2.0, x), exponent), one)


def _dropped(value: TFloat, axes: INT64 | None) -> TFloat:
    """A keepdims reduction's result without its reduced axes (all of them when `axes` is None)."""
    return op.Squeeze(value, axes) if axes is not None else op.Reshape(value, op.Constant(value_ints=[]))


def _reduces_to_one_element(shape: ir.Shape, dims: list[int]) -> bool:
    """Statically known to reduce to a single element (the kept dims' sizes multiply to 1)."""
    rank = len(shape)
    reduced = {d % rank for d in dims} if dims else set(builtins.range(rank))
    kept = [shape[a] for a in builtins.range(rank) if a not in reduced]
    return all(isinstance(size, int) for size in kept) and math.prod(kept) == 1


def _variance_and_mean(
    self: TFloat,
    dim: Sequence[int] | int | None,
    correction: float | None,
    keepdim: bool,
    root: bool = False,
    with_mean: bool = False,
) -> tuple[TFloat, TFloat]:
    """The variance (its square root with `root`) and the mean, in the compute dtype (float32 for float16/bfloat16;
    the caller rounds back). var_mean/std_mean (`with_mean`) always take Welford's way in eager."""
    x = _in_float32(self)
    rank = len(self.shape)
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    if rank == 0 or not dims:
        axes = None
        count = op.Size(x)
    else:
        axes = op.Constant(value_ints=dims)
        count = op.ReduceProd(op.Gather(op.Shape(x), axes, axis=0), keepdims=False)
    count = op.CastLike(count, x)
    two_pass = rank > 0 and not with_mean and self.dtype in _MIN_MAX_EXPONENT
    two_pass = two_pass and _reduces_to_one_element(self.shape, dims)
    scale = _power_of_two_scale(x, axes) if rank and not two_pass else None
    scaled = op.Div(x, scale) if scale is not None else x
    if scale is None:
        total = op.ReduceSum(scaled, axes, keepdims=True) if rank else scaled
        mean = op.Div(total, count)
    else:  # the mean as the largest value plus the mean offset from it: exact for equal values, as Welford's
        pivot = op.ReduceMax(scaled, axes, keepdims=True)
        mean = op.Add(pivot, op.Div(op.ReduceSum(op.Sub(scaled, pivot), axes, keepdims=True), count))
    if two_pass:  # the deviations from the dtype's mean, in float64
        scaled, centered_mean, count = (_cast(v, ir.DataType.DOUBLE) for v in (x, mean, count))
    else:
        centered_mean = mean
    centered = op.Sub(scaled, centered_mean)
    squares = op.Mul(centered, centered)
    squares_sum = op.ReduceSum(squares, axes, keepdims=keepdim) if rank else squares
    zero = op.CastLike(0.0, count)
    divisor = op.Max(op.Sub(count, op.CastLike(1.0 if correction is None else correction, count)), zero)
    if scale is None:
        variance = op.Div(squares_sum, divisor)
        variance = op.Sqrt(variance) if root else variance
    else:
        mean = op.Mul(mean, scale)
        kept_scale = scale if keepdim else _dropped(scale, axes)
        if x.dtype == ir.DataType.DOUBLE:  # eager's float64 sum of squared deviations is inf once it overflows
            variance = op.Div(op.Mul(op.Mul(squares_sum, kept_scale), kept_scale), divisor)
            variance = op.Sqrt(variance) if root else variance
            # (where two values differ by more than the max, eager's running mean overflows: inf, -inf or NaN by the
            # order of the values, not reproduced)
        else:  # eager accumulates float32 in float64: only the variance (or its root) itself overflows
            variance = op.Div(squares_sum, divisor)
            if root:
                variance = op.Mul(op.Sqrt(variance), kept_scale)
            else:
                variance = op.Mul(op.Mul(variance, kept_scale), kept_scale)
    if rank and not keepdim:
        mean = _dropped(mean, axes)
    return _cast(variance, x.dtype), mean


@lowering("aten::var.correction")
def var_correction(
    self: TFloat, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
) -> TFloat:
    variance, _ = _variance_and_mean(self, dim, correction, keepdim)
    return _back(variance, self)


@lowering("aten::std.correction")
def std_correction(
    self: TFloat, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
) -> TFloat:
    deviation, _ = _variance_and_mean(self, dim, correction, keepdim, root=True)
    return _back(deviation, self)


@lowering("aten::var_mean.correction")
def var_mean_correction(
    self: TFloat, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
) -> tuple[TFloat, TFloat]:
    variance, mean = _variance_and_mean(self, dim, correction, keepdim, with_mean=True)
    return _back(variance, self), _back(mean, self)


@lowering("aten::std_mean.correction")
def std_mean_correction(
    self: TFloat, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
) -> tuple[TFloat, TFloat]:
    deviation, mean = _variance_and_mean(self, dim, correction, keepdim, root=True, with_mean=True)
    return _back(deviation, self), _back(mean, self)


# --- covariance of integers with float weights -----------------------------------------------------------------
TWeightInt = TypeVar("TWeightInt", INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64)


@lowering("aten::cov")
def cov_integer_weighted(
    self: TIntegral, aweights: TFloat, correction: int = 1, fweights: TWeightInt | None = None
) -> TFloat:
    """Eager multiplies `self` by the weights first (``in * w``): `self` becomes the weights' float dtype
    (promote_types(integer, float) is the float), and everything after computes in it. Without `aweights`
    (required here; parameters bind by name) integers keep the float lowering, which computes in float32."""
    return cov.func(op.Cast(self, to=aweights.dtype), correction, fweights, aweights)


# --- covariance -------------------------------------------------------------------------------------------
@lowering("aten::cov")
def cov(self: TReal, correction: int = 1, fweights: TOther | None = None, aweights: TReal | None = None) -> TReal:
    """Eager's covariance formula with its data-dependent check (a non-positive normalizer becomes 0) as a Max.

    Variables are rows, observations columns; a 1-D input is one variable and gives a 0-d result.
    Integers and bools compute in float32 (the default dtype); float16/bfloat16 in float32, as eager's
    accumulations do.
    """
    rank = len(self.shape)
    x = self if rank == 2 else op.Reshape(self, op.Constant(value_ints=[1, -1]))
    compute = self.dtype if self.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE) else ir.DataType.FLOAT
    x = op.Cast(x, to=compute)
    observations = self.shape[-1] if rank else 1
    columns = op.Constant(value_ints=[1])
    weights = None
    if fweights is not None:
        weights = op.Cast(fweights, to=compute)
    if aweights is not None:
        scaled = op.Cast(aweights, to=compute)
        weights = scaled if weights is None else op.Mul(weights, scaled)
    integral = self.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    if weights is None:
        total = op.Constant(value=ir.tensor(float(observations), dtype=compute))
        mean = op.ReduceMean(x, columns, keepdims=True)
        if integral and isinstance(observations, int) and observations > 0:
            # Eager sums integers exactly (int64) and divides the sum in float32: a float32 sum rounds above 2**24.
            exact = op.CumSum(
                op.Cast(self if rank == 2 else op.Reshape(self, op.Constant(value_ints=[1, -1])), to=ir.DataType.INT64),
                op.Constant(value=ir.tensor(1, dtype=ir.DataType.INT64)),
            )
            row_sums = op.Slice(exact, op.Constant(value_ints=[-1]), op.Constant(value_ints=[observations]), columns)
            mean = op.Div(op.Cast(row_sums, to=compute), total)
    else:
        total = op.ReduceSum(weights, keepdims=False)
        mean = op.Div(op.ReduceSum(op.Mul(x, weights), columns, keepdims=True), total)
    correction_value = op.Constant(value=ir.tensor(float(correction), dtype=compute))
    if weights is None:
        normalizer = op.Sub(total, correction_value)
    elif correction == 0:
        normalizer = total
    elif aweights is None:
        normalizer = op.Sub(total, correction_value)
    else:
        spread = op.Div(op.ReduceSum(op.Mul(weights, op.Cast(aweights, to=compute)), keepdims=False), total)
        normalizer = op.Sub(total, op.Mul(correction_value, spread))
    normalizer = op.Max(normalizer, op.Constant(value=ir.tensor(0.0, dtype=compute)))
    centered = op.Sub(x, mean)
    right = centered if weights is None else op.Mul(centered, weights)
    result = op.Div(op.MatMul(centered, op.Transpose(right, perm=[1, 0])), normalizer)
    if rank < 2 or self.shape[0] == 1:  # eager squeezes a single variable's 1x1 result
        result = op.Reshape(result, op.Constant(value=ir.tensor(np.array([], dtype=np.int64))))
    return op.Cast(result, to=_cov_dtype(self, aweights))


def _cov_dtype(self: TReal, aweights: TReal | None) -> int:
    from fx2onnx import _dtypes as dtype_table

    dtype = dtype_table.to_torch(self.dtype)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if aweights is not None:
        dtype = torch.promote_types(dtype, dtype_table.to_torch(aweights.dtype))
    return dtype_table.to_onnx(dtype).value


# --- segment reductions -------------------------------------------------------------------------------------------
builtins_range = builtins.range  # the histogram lowerings take an argument named `range`


@lowering("aten::norm.Scalar")
def norm_scalar(self: TFloat, p: float = 2.0) -> TFloat:
    return _back(_p_norm(_in_float32(self), float(p), None, False), self)


# --- vector norms over given dims, rank 0 included ----------------------------------------------------------------
@lowering("aten::linalg_vector_norm")
def linalg_vector_norm(
    self: TFloat, ord: float = 2.0, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: int | None = None
) -> TFloat:
    """torch.linalg.vector_norm; a 0-d input with dim 0 or -1 reduces nothing (ONNX refuses the axis). Where each
    norm has one element, eager gives |x| (x != 0 for ord 0) without the power and root, which overflow: the norm
    of -3.4e38 alone is 3.4e38, not sqrt(inf) (F.normalize of it -1, not -0; fuzz seed 40100107)."""
    x = op.Cast(self, to=dtype) if dtype is not None else self
    computed = _in_float32(x)
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    rank = len(self.shape)
    reduced = sorted({d % rank for d in dims} if dims and rank else range(rank))
    if all(self.shape[d] == 1 for d in reduced):
        zero = op.Constant(value=ir.tensor(0.0, dtype=computed.dtype))
        single = op.Abs(computed) if float(ord) != 0 else op.CastLike(op.Not(op.Equal(computed, zero)), computed)
        if reduced and not keepdim:
            single = op.Squeeze(single, op.Constant(value_ints=reduced))
        return _back(single, x)
    axes = op.Constant(value_ints=dims) if dims and len(self.shape) else None
    return _back(_p_norm(computed, float(ord), axes, keepdim), x)


# --- pairwise distances ----------------------------------------------------------------------------------------------
@lowering("aten::_cdist_forward")
def cdist_forward(x1: TFloat, x2: TFloat, p: float, compute_mode: int | None = None) -> TFloat:
    """[..., P, M] x [..., R, M] -> [..., P, R] p-norm distances, from the broadcast differences directly."""
    del compute_mode  # eager's matrix-product shortcut for p=2 is a speed/accuracy trade-off; this is exact
    if any(size == 0 for size in [*x1.shape[:-1], *x2.shape[:-1]]):
        # ORT's reductions keep the reduced axis of a zero-size tensor: build the empty result directly.
        shape = op.Concat(op.Shape(x1, start=0, end=-1), op.Shape(x2, start=-2, end=-1), axis=0)
        return op.CastLike(op.ConstantOfShape(shape), x1)
    a = op.Unsqueeze(_in_float32(x1), op.Constant(value_ints=[-2]))  # [..., P, 1, M]
    b = op.Unsqueeze(_in_float32(x2), op.Constant(value_ints=[-3]))  # [..., 1, R, M]
    return _back(_p_norm(op.Sub(a, b), float(p), op.Constant(value_ints=[-1]), False), x1)


# --- histograms -------------------------------------------------------------------------------------------------------
# Eager bins x into the last bin whose left edge is <= x (the rightmost edge closes the last bin) and skips values
# outside the edges. Bin counts are one-hot rows summed with a MatMul, which also gives zeros for empty inputs.
def _linspace_edges(low: TFloat, high: TFloat, bins: int) -> TFloat:
    """bins + 1 edges from low to high, as torch.linspace computes them (from both ends towards the middle)."""
    step = op.Div(op.Sub(high, low), op.CastLike(float(bins), low))
    steps = bins + 1
    halfway = steps // 2
    from_start = op.CastLike(op.Constant(value=ir.tensor(np.arange(steps, dtype=np.float64))), low)
    from_end = op.CastLike(op.Constant(value=ir.tensor(np.arange(steps, dtype=np.float64)[::-1].copy() - 0.0)), low)
    first = op.Add(low, op.Mul(step, from_start))
    second = op.Sub(high, op.Mul(step, from_end))
    return op.Where(op.Constant(value=ir.tensor(np.arange(steps) < halfway)), first, second)


def _outer_edges(values: TFloat, bin_range: Sequence[float] | None, empty: bool) -> tuple[TFloat, TFloat]:
    """(low, high) of the binned range: the given range or the data's, widened by 0.5 each way when equal."""
    if bin_range is not None:
        low, high = op.CastLike(float(bin_range[0]), values), op.CastLike(float(bin_range[1]), values)
    elif empty:
        low, high = op.CastLike(0.0, values), op.CastLike(1.0, values)
    else:
        low, high = op.ReduceMin(values, keepdims=False), op.ReduceMax(values, keepdims=False)
    equal = op.Equal(low, high)
    half = op.CastLike(0.5, values)
    return op.Where(equal, op.Sub(low, half), low), op.Where(equal, op.Add(high, half), high)


def _bin_one_hot(values: TFloat, edges: TFloat, bins: int) -> TFloat:
    """[N] values, [bins + 1] edges -> [N, bins] one-hot bin membership (all zero outside the edges)."""
    column = op.Unsqueeze(values, op.Constant(value_ints=[1]))
    below = op.ReduceSum(
        op.Cast(op.LessOrEqual(edges, column), to=INT64.dtype), op.Constant(value_ints=[1]), keepdims=False
    )
    position = op.Min(op.Sub(below, op.Constant(value_int=1)), op.Constant(value_int=bins - 1))
    first_edge = op.Gather(edges, op.Constant(value_int=0), axis=0)
    last_edge = op.Gather(edges, op.Constant(value_int=bins), axis=0)
    inside = op.And(op.GreaterOrEqual(values, first_edge), op.LessOrEqual(values, last_edge))
    hits = op.Equal(
        op.Unsqueeze(position, op.Constant(value_ints=[1])),
        op.Constant(value=ir.tensor(np.arange(bins, dtype=np.int64))),
    )
    return op.CastLike(op.And(hits, op.Unsqueeze(inside, op.Constant(value_ints=[1]))), values)


def _bin_widths(edges: TFloat) -> TFloat:
    ends = op.Constant(value_ints=[2**62])
    return op.Sub(
        op.Slice(edges, op.Constant(value_ints=[1]), ends),
        op.Slice(edges, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1])),
    )


def _histogram(values: TFloat, edges: TFloat, bins: int, weight: TFloat | None, density: bool) -> TFloat:
    one_hot = _bin_one_hot(values, edges, bins)
    weights = weight if weight is not None else op.Expand(op.CastLike(1.0, values), op.Shape(values))
    counts = op.Squeeze(
        op.MatMul(op.Unsqueeze(weights, op.Constant(value_ints=[0])), one_hot), op.Constant(value_ints=[0])
    )
    if density:
        counts = op.Div(op.Div(counts, op.ReduceSum(counts, keepdims=False)), _bin_widths(edges))
    return counts


@lowering("aten::histogram.bin_ct")
def histogram_bin_count(
    self: TFloat,
    bins: int = 100,
    range: Sequence[float] | None = None,
    weight: TFloat | None = None,
    density: bool = False,
) -> tuple[TFloat, TFloat]:
    values = op.Reshape(self, op.Constant(value_ints=[-1]))
    empty = any(size == 0 for size in self.shape)
    low, high = _outer_edges(values, range, empty)
    edges = _linspace_edges(low, high, bins)
    flat_weight = op.Reshape(weight, op.Constant(value_ints=[-1])) if weight is not None else None
    return _histogram(values, edges, bins, flat_weight, density), edges


@lowering("aten::histogram.bins_tensor")
def histogram_bins_tensor(
    self: TFloat, bins: TFloat, weight: TFloat | None = None, density: bool = False
) -> tuple[TFloat, TFloat]:
    count = bins.shape[0]
    if not isinstance(count, int):
        raise ValueError("histogram needs a static number of bin edges")
    values = op.Reshape(self, op.Constant(value_ints=[-1]))
    flat_weight = op.Reshape(weight, op.Constant(value_ints=[-1])) if weight is not None else None
    return _histogram(values, bins, count - 1, flat_weight, density), op.Identity(bins)


@lowering("aten::histc")
def histc(self: TFloat, bins: int = 100, min: float = 0.0, max: float = 0.0) -> TFloat:
    """torch.histc as eager's CPU kernel computes it: the range (min, max), or the data's own extremes when min ==
    max (MoE routing counts tokens per expert with histc(x, bins=experts)), widened by 1 each way when still
    equal; the ends rounded to the input's dtype; bin = trunc((x - low) * bins / (high - low)) in float32
    (float64 for float64), the right edge in the last bin, values outside the range and NaN skipped."""
    values = _flat(self)
    if float(min) == float(max):
        # eager: aminmax of the data as double, widened in double when equal, then rounded to the dtype
        low = op.Cast(op.ReduceMin(values, keepdims=False), to=DOUBLE.dtype)
        high = op.Cast(op.ReduceMax(values, keepdims=False), to=DOUBLE.dtype)
        if any(size == 0 for size in self.shape):  # no data: eager widens the given value
            low = high = op.Constant(value=ir.tensor(float(min), dtype=ir.DataType.DOUBLE))
        equal = op.Equal(low, high)
        one = op.Constant(value=ir.tensor(1.0, dtype=ir.DataType.DOUBLE))
        low = op.CastLike(op.Where(equal, op.Sub(low, one), low), self)
        high = op.CastLike(op.Where(equal, op.Add(high, one), high), self)
    else:
        low, high = op.CastLike(float(min), self), op.CastLike(float(max), self)
    compute = _in_float32(values)
    low, high = _in_float32(low), _in_float32(high)
    inside = op.And(op.GreaterOrEqual(compute, low), op.LessOrEqual(compute, high))  # False for NaN
    position = op.Div(op.Mul(op.Sub(compute, low), op.CastLike(float(bins), compute)), op.Sub(high, low))
    # (x - low) * bins overflowing to inf (a range near the dtype's max): eager's int64 cast of inf indexes its
    # histogram at INT64_MIN, which wraps around to the first bin on x86; the same here, defined
    usable = op.And(inside, op.Not(op.Or(op.IsInf(position), op.IsNaN(position))))
    position = op.Cast(op.Where(usable, position, op.CastLike(0.0, compute)), to=INT64.dtype)  # truncates
    position = op.Min(position, op.Constant(value_int=bins - 1))  # the rightmost edge closes the last bin
    hits = op.And(
        op.Equal(
            op.Unsqueeze(position, op.Constant(value_ints=[1])),
            op.Constant(value=ir.tensor(np.arange(bins, dtype=np.int64))),
        ),
        op.Unsqueeze(inside, op.Constant(value_ints=[1])),
    )
    counts = op.ReduceSum(op.Cast(hits, to=INT64.dtype), op.Constant(value_ints=[0]), keepdims=False)
    return op.CastLike(counts, self)


def _histogramdd_columns(self: TFloat) -> tuple[TFloat, int]:
    dims = self.shape[-1]
    if not isinstance(dims, int):
        raise ValueError("histogramdd needs a static number of dimensions")
    return op.Reshape(self, op.Constant(value_ints=[-1, dims])), dims


def _column(points: TFloat, index: int) -> TFloat:
    return op.Gather(points, op.Constant(value_int=index), axis=1)


def _histogramdd_edges(self: TFloat, bins: Sequence[int], range: Sequence[float] | None) -> list[TFloat]:
    points, dims = _histogramdd_columns(self)
    counts = list(bins) * dims if len(bins) == 1 else list(bins)
    empty = any(size == 0 for size in self.shape)
    edges = []
    for d in builtins_range(dims):
        bounds = None if range is None else range[2 * d : 2 * d + 2]
        low, high = _outer_edges(_column(points, d), bounds, empty)
        edges.append(_linspace_edges(low, high, counts[d]))
    return edges


def _histogramdd(
    self: TFloat, edges: Sequence[TFloat], counts: Sequence[int], weight: TFloat | None, density: bool
) -> TFloat:
    """The joint histogram: per-dim one-hot memberships multiplied into [N, B0, ..., Bd-1], weighted and summed."""
    points, dims = _histogramdd_columns(self)
    joint = None
    for d in builtins_range(dims):
        one_hot = _bin_one_hot(_column(points, d), edges[d], counts[d])  # [N, Bd]
        shape = [-1] + [counts[k] if k == d else 1 for k in builtins_range(dims)]
        one_hot = op.Reshape(one_hot, op.Constant(value_ints=shape))
        joint = one_hot if joint is None else op.Mul(joint, one_hot)
    total_bins = math.prod(counts)
    flat_joint = op.Reshape(joint, op.Constant(value_ints=[-1, total_bins]))
    weights = op.Reshape(weight, op.Constant(value_ints=[1, -1])) if weight is not None else None
    if weights is None:
        weights = op.Expand(
            op.CastLike(1.0, points), op.Concat(op.Constant(value_ints=[1]), op.Shape(points, start=0, end=1), axis=0)
        )
    hist = op.Reshape(op.MatMul(weights, flat_joint), op.Constant(value_ints=list(counts)))
    if density:
        hist = op.Div(hist, op.ReduceSum(hist, keepdims=False))
        for d in builtins_range(dims):
            shape = [counts[k] if k == d else 1 for k in builtins_range(dims)]
            hist = op.Div(hist, op.Reshape(_bin_widths(edges[d]), op.Constant(value_ints=shape)))
    return hist


@lowering("aten::_histogramdd_bin_edges")
def histogramdd_bin_edges(
    self: TFloat,
    bins: Sequence[int],
    range: Sequence[float] | None = None,
    weight: TFloat | None = None,
    density: bool = False,
) -> Sequence[TFloat]:
    return _histogramdd_edges(self, bins, range)


@lowering("aten::_histogramdd_from_bin_cts")
def histogramdd_from_bin_counts(
    self: TFloat,
    bins: Sequence[int],
    range: Sequence[float] | None = None,
    weight: TFloat | None = None,
    density: bool = False,
) -> TFloat:
    dims = self.shape[-1]
    counts = list(bins) * dims if len(bins) == 1 else list(bins)
    return _histogramdd(self, _histogramdd_edges(self, bins, range), counts, weight, density)


@lowering("aten::_histogramdd_from_bin_tensors")
def histogramdd_from_bin_tensors(
    self: TFloat, bins: Sequence[TFloat], weight: TFloat | None = None, density: bool = False
) -> TFloat:
    counts = [edges.shape[0] - 1 for edges in bins]
    return _histogramdd(self, list(bins), counts, weight, density)
