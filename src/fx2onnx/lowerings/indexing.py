"""Scatter, gather, put/take, *_scatter and shape ops where torchlib has no implementation or a wrong one.

Each lowering here was found by the coverage sweep (``fx2onnx coverage``, docs/support-matrix.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript import BOOL, DOUBLE, FLOAT, INT32, INT64, UINT64
from onnxscript import opset18 as op

from fx2onnx.lowerings import lowering
from fx2onnx.lowerings.core import _LOW_PRECISION, _NARROW_INTS, TReal, _identity_for, floor_divide_by_positive

_INTEGERS = (*_NARROW_INTS, ir.DataType.INT32, ir.DataType.INT64)


def _static_shape(value: TReal, what: str) -> list[int]:
    shape = list(value.shape) if value.shape is not None else None
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise NotImplementedError(f"{what} over a tensor of dynamic shape has no lowering here")
    return shape


def _const_ints(values: np.ndarray | Sequence[int]) -> INT64:
    return op.Constant(value=ir.tensor(np.asarray(values, dtype=np.int64)))


def _flat(value: TReal) -> TReal:
    return op.Reshape(value, op.Constant(value_ints=[-1]))


# --- scatter with a reduction --------------------------------------------------------------------------------
# ONNX Runtime's ScatterElements reduces float16/bfloat16 with no kernel (add, mul) and bool with none (max,
# min); those compute in float32 / int32 and round back. Integer sums and products wrap alike in any width.
def _compute_type(value: TReal) -> TReal:
    if value.dtype in _LOW_PRECISION:
        return op.Cast(value, to=FLOAT.dtype)
    if value.dtype in (*_NARROW_INTS, ir.DataType.BOOL):
        return op.Cast(value, to=INT32.dtype)
    return value


_REDUCTIONS = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min"}


def _scatter_reduce(self: TReal, dim: int, index: INT64, src: TReal | None, reduce: str, include_self: bool) -> TReal:
    """self with src's elements at `index` (along `dim`) reduced into it; `src` None: `index`'s shape of zeros.

    `src` may be larger than `index`: only its leading part (index's shape) takes part, as in eager. Without
    include_self, the positions `index` touches start from the reduction's identity; mean divides by the
    number of values reduced into each position (floor division for integers, as eager does).
    """
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
    base = _compute_type(op.Reshape(self, one) if scalar else self)
    values = _compute_type(updates)
    reduction = "add" if reduce == "mean" else _REDUCTIONS[reduce]
    if not include_self:  # touched positions forget self's value
        identity = _identity_for({"add": "mean", "mul": "prod", "max": "amax", "min": "amin"}[reduction], base)
        base = op.ScatterElements(base, positions, op.Expand(identity, op.Shape(positions)), axis=axis)
    result = op.ScatterElements(base, positions, values, axis=axis, reduction=reduction)
    if reduction in ("max", "min") and base.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        # Eager's amax/amin propagate NaN (from self or src); ONNX Runtime's max/min may drop it.
        nan_base = op.Cast(op.IsNaN(base), to=INT32.dtype)
        nan_values = op.Cast(op.IsNaN(values), to=INT32.dtype)
        seen_nan = op.ScatterElements(nan_base, positions, nan_values, axis=axis, reduction="max")
        result = op.Where(op.Cast(seen_nan, to=BOOL.dtype), op.CastLike(float("nan"), base), result)
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
    positions = _flat(index)
    positions = op.Where(op.Less(positions, op.Constant(value_int=0)), op.Add(positions, op.Size(self)), positions)
    flat = _flat(self)
    if accumulate:
        result = _scatter_reduce(flat, 0, positions, _flat(source), "sum", include_self=True)
    else:
        result = op.ScatterElements(flat, positions, _flat(source), axis=0)
    return op.Reshape(result, op.Shape(self))


# --- *_scatter: positions known at export, from the (static) shape --------------------------------------------
def _scatter_flat(self: TReal, positions: np.ndarray, src: TReal) -> TReal:
    """self with src's elements (in src's order) at the flat `positions` of self (a constant array)."""
    if positions.size == 0:
        return op.Identity(self)
    written = op.ScatterElements(_flat(self), _const_ints(positions.reshape(-1)), _flat(src), axis=0)
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


@lowering("aten::resize")
def resize(self: TReal, size: Sequence[int], memory_format: int | None = None) -> TReal:
    """Functional resize_: self's elements in order, cut or zero-extended to `size`'s element count.

    Eager leaves the elements past self's count uninitialized; zeros stand in for them.
    """
    del memory_format
    count = math.prod(int(s) for s in size)
    flat = _flat(self)
    missing = op.Max(
        op.Sub(op.Constant(value_ints=[count]), op.Reshape(op.Size(self), op.Constant(value_ints=[1]))),
        op.Constant(value_ints=[0]),
    )
    padded = op.Pad(flat, op.Concat(op.Constant(value_ints=[0]), missing, axis=0))
    kept = op.Slice(padded, op.Constant(value_ints=[0]), op.Constant(value_ints=[count]))
    return op.Reshape(kept, op.Constant(value_ints=[int(s) for s in size]))


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
@lowering("aten::repeat_interleave.Tensor")
def repeat_interleave_tensor(repeats: INT64, output_size: int | None = None) -> INT64:
    """``torch.repeat_interleave(repeats)``: index i written repeats[i] times (x.repeat_interleave(r, dim)
    decomposes to it and an index_select). torchlib's implementation takes `self` where ATen gives `repeats`.

    The output's length is data-dependent (sum of repeats): position p holds the count of cumulative sums <= p.
    """
    repeats = op.Cast(repeats, to=INT64.dtype)
    ends = op.CumSum(repeats, op.Constant(value_int=0))  # (n,)
    total = op.ReduceSum(repeats, keepdims=0) if output_size is None else op.Constant(value_int=output_size)
    positions = op.Range(op.Constant(value_int=0), total, op.Constant(value_int=1))  # (total,)
    passed = op.LessOrEqual(
        op.Unsqueeze(ends, op.Constant(value_ints=[0])), op.Unsqueeze(positions, op.Constant(value_ints=[1]))
    )
    return op.ReduceSum(op.Cast(passed, to=INT64.dtype), op.Constant(value_ints=[1]), keepdims=0)
