"""Resampling: interpolate/upsample (linear, cubic, nearest; uint8 fixed-point kernels) and grid sampling."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript import DOUBLE, FLOAT, INT64, UINT8
from onnxscript import opset18 as op

from fx2onnx._lowerings.builders import TFloat, _back, _in_float32, _spatial_sizes
from fx2onnx._lowerings.kernels import double
from fx2onnx._lowerings.rules import lowering


# --- interpolation with output_size or scale_factors -------------------------------------------------------------
# torchlib's `.vec` overloads declare both optional arguments without a default, so they bind only when both
# are given, and eager gives exactly one. Scales, when given, also set the coordinate mapping (as in eager).
def _resized_lengths(
    input: TFloat, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None, axes: Sequence[int]
) -> list[int | None]:
    """The output's lengths along the resized axes where known at export (None where not)."""
    if output_size is not None:
        return [int(output_size[a - 2]) if isinstance(output_size[a - 2], int) else None for a in axes]
    shape = input.shape
    lengths: list[int | None] = []
    for a in axes:
        size = shape[a] if shape is not None else None
        known = isinstance(size, int) and scale_factors is not None
        lengths.append(math.floor(size * float(scale_factors[a - 2])) if known else None)
    return lengths


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
    if not align_corners and 1 in _resized_lengths(input, output_size, scale_factors, axes):
        # pytorch_half_pixel maps an output of length 1 to source 0; eager maps it as any other, to
        # (0 + 0.5) * in / out - 0.5 (2 -> 1 averages the two): half_pixel, the same mapping for every other length.
        transformation = "half_pixel"
    lengths = _resized_lengths(input, output_size, scale_factors, axes)
    kept = [a for a, n in zip(axes, lengths) if n is not None and input.shape is not None and input.shape[a] == n]
    if mode == "linear" and axis is None and (len(input.shape) == 3 or kept):
        changed = [a for a in axes if a not in kept]
        return _resize_axes_alone(input, output_size, scale_factors, changed, transformation)
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


# ONNX Runtime's linear Resize interpolates every dim it sees as spatial, with weight 0 on the next row of a dim
# whose scale is 1: an infinite value there makes the row NaN (0 * inf). A 3-D input is computed as 2-D [N*C, W], so
# a channel takes NaN from the next one (interpolate(sqrt(int8 [[-1], [2]]), scale_factor=3, mode='linear'): the
# second channel's NaN made the first one's 1.41 NaN; fuzz seed 10004980), and a 4-D input whose height keeps its
# size (eager copies that axis) takes NaN from the next row. Each resized axis is then resized alone, as the last axis
# of a [M, 1, 1, L] tensor (the other dims in M: no neighbours), in float32 when there are several (no rounding to
# the half type between them).
def _resize_axes_alone(
    input: TFloat,
    output_size: Sequence[int] | None,
    scale_factors: Sequence[float] | None,
    axes: Sequence[int],
    transformation: str,
) -> TFloat:
    rank = len(input.shape)
    narrow = len(axes) > 1 and input.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    x = op.Cast(input, to=FLOAT.dtype) if narrow else input
    for a in reversed(axes):  # the width first, as eager nests its sums
        perm = [d for d in range(rank) if d != a] + [a]
        moved = op.Transpose(x, perm=perm) if a != rank - 1 else x
        rows = op.Reshape(moved, op.Concat(op.Constant(value_ints=[-1, 1, 1]), op.Shape(moved, start=-1), axis=0))
        if scale_factors is not None and output_size is None:
            scales, sizes = op.Constant(value_floats=[float(scale_factors[a - 2])]), None
        else:
            assert output_size is not None
            scales, sizes = None, op.Constant(value_ints=[int(output_size[a - 2])])
        resized = op.Resize(
            rows, None, scales, sizes, axes=[3], mode="linear", coordinate_transformation_mode=transformation
        )
        shape = op.Concat(op.Shape(moved, start=0, end=-1), op.Shape(resized, start=-1), axis=0)
        back = op.Reshape(resized, shape)
        x = op.Transpose(back, perm=[perm.index(d) for d in range(rank)]) if a != rank - 1 else back
    return op.Cast(x, to=input.dtype) if narrow else x


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


# float32 bilinear with static sizes: eager's taps and weights, gathered. ONNX Runtime's Resize maps each output
# pixel back by dividing by its float scale (out / in) where eager multiplies by in / out: on a 224 -> 320 resize its
# results were up to 6.9e-5 from eager's (150 ulps; eager itself is within 1.8e-5 of exact), and a detector that
# amplifies its input (SSDlite) moved a box by 0.021 px. Eager's generic kernel computes the source coordinate
# scale * (i + 0.5) - 0.5 in float32, contracted into one fused multiply-add by its AVX2 build (measured: 1.4e-5
# apart without the fusion, an ulp with it), the weights 1 - lambda and lambda in float32, and sums the width's two
# taps, then the height's: computed the same way here, within an ulp of eager (the order of its vectorized sums).
def _linear_taps_float32(in_size: int, out_size: int, align_corners: bool, scale: float | None) -> Taps:
    f32 = np.float32
    if align_corners:
        ratio = f32(in_size - 1) / f32(out_size - 1) if out_size > 1 else f32(0.0)
    else:
        ratio = f32(1.0 / scale) if scale is not None and scale > 0 else f32(in_size) / f32(out_size)
    indices = np.zeros((out_size, 2), np.int64)
    weights = np.zeros((out_size, 2), np.float32)
    for i in range(out_size):
        if in_size == out_size:
            indices[i], weights[i] = (i, i), (1.0, 0.0)
            continue
        if align_corners:
            real = ratio * f32(i)
        else:  # one rounding of the exact value, as a fused multiply-add (float64 holds the product exactly)
            real = max(f32(float(ratio) * (i + 0.5) - 0.5), f32(0.0))
        low = min(math.floor(real), in_size - 1)
        fraction = min(max(real - f32(low), f32(0.0)), f32(1.0))
        indices[i] = (low, low + (1 if low < in_size - 1 else 0))
        weights[i] = (f32(1.0) - fraction, fraction)
    return indices, weights, None


def _gather_axis_in_graph(x: FLOAT, axis: int, out_size: int, align_corners: bool) -> FLOAT:
    """`_linear_taps_float32` and `_gather_axis` on an axis of symbolic size, in the graph."""
    in_size = op.Shape(x, start=axis, end=axis + 1)
    last = op.Cast(op.Sub(in_size, op.Constant(value_ints=[1])), to=FLOAT.dtype)
    positions = op.Range(op.Constant(value_float=0.0), op.Constant(value_float=float(out_size)), 1.0)
    if align_corners:
        ratio = op.Div(last, op.Constant(value_floats=[float(max(out_size - 1, 1))]))
        real = op.Mul(ratio, positions)
    else:
        ratio = op.Div(op.Cast(in_size, to=FLOAT.dtype), op.Constant(value_floats=[float(out_size)]))
        centers = op.Add(op.Cast(positions, to=DOUBLE.dtype), double(0.5))
        exact = op.Sub(op.Mul(op.Cast(ratio, to=DOUBLE.dtype), centers), double(0.5))
        real = op.Max(op.Cast(exact, to=FLOAT.dtype), op.Constant(value_float=0.0))  # as one fused multiply-add
    low = op.Min(op.Floor(real), last)
    fraction = op.Min(op.Max(op.Sub(real, low), op.Constant(value_float=0.0)), op.Constant(value_float=1.0))
    same_size = op.Equal(in_size, op.Constant(value_ints=[out_size]))  # eager copies: weights 1 and 0 on one tap
    one = op.Constant(value_float=1.0)
    high = op.Where(op.And(op.Less(low, last), op.Not(same_size)), op.Add(low, one), low)
    shape = op.Constant(value_ints=[-1] + [1] * (3 - axis))
    low_term = op.Mul(op.Gather(x, op.Cast(low, to=INT64.dtype), axis=axis), op.Reshape(op.Sub(one, fraction), shape))
    high_term = op.Mul(op.Gather(x, op.Cast(high, to=INT64.dtype), axis=axis), op.Reshape(fraction, shape))
    return op.Add(low_term, high_term)


@lowering("aten::upsample_bilinear2d.vec", variant="float32")
def upsample_bilinear_vec_float32(
    input: FLOAT,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> FLOAT:
    axes = _static_resize_sizes(input, output_size, scale_factors, 2)
    if axes is None:
        if output_size is None or not all(isinstance(size, int) for size in output_size):
            return _resize(input, output_size, align_corners, scale_factors, "linear")  # ONNX Runtime's Resize
        result = input  # a symbolic input to a fixed size (SSD's 320 x 320): the same taps, computed in the graph
        for axis in (3, 2):
            result = _gather_axis_in_graph(result, axis, int(output_size[axis - 2]), align_corners)
        return result
    result = input
    for position in reversed(range(2)):  # the width first, as eager nests its sums
        in_size, out_size, scale = axes[position]
        result = _gather_axis(result, 2 + position, _linear_taps_float32(in_size, out_size, align_corners, scale))
    return result


# uint8 images: eager resizes the width, rounds half up and saturates to [0, 255], then does the same for the
# height (its fixed-point kernels). Computed in one pass in float and cast back as a cast match would be,
# results were truncated and wrapped: a bicubic overshoot to -4 became 252, in half of a bicubic upscale's
# pixels. In two passes, rounding half up, upscales are eager's bit for bit (measured); non-integer
# downscales are up to 1 off in a few percent of pixels (eager's weights are rounded to fixed point). Bilinear keeps
# this path; bicubic and the antialiased modes compute eager's fixed-point sums (`_resize_uint8_fixed_point`, below)
# when the sizes are static.
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


@lowering("aten::upsample_bilinear2d.vec", variant="uint8")
def upsample_bilinear_vec_uint8(
    input: UINT8,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> UINT8:
    return _resize_uint8(input, output_size, align_corners, scale_factors, "linear")


@lowering("aten::upsample_bicubic2d.vec", variant="uint8")
def upsample_bicubic_vec_uint8(
    input: UINT8,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> UINT8:
    return _resize_uint8_fixed_point(input, output_size, align_corners, scale_factors, "cubic")


# --- float64: eager's taps and weights, gathered (ONNX Runtime's Resize has no float64 kernel) ----------------------
# Resize in float64 is legalized to float32 (results 1e-7 off eager). With static sizes, each resized axis instead
# gathers its taps and sums them with eager's weights, computed here as eager computes them (in double), the last
# axis first as eager's kernels nest their sums: linear and cubic agree with eager to an ulp or two.
_CUBIC_A = -0.75  # eager's bicubic interpolation
_AA_CUBIC_A = -0.5  # eager's antialiased bicubic filter (PIL's)

# Per output index of one axis: input indices [out, taps], weights [out, taps], and which taps count (None: all).
Taps = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]


def _source_ratio(in_size: int, out_size: int, align_corners: bool, scale: float | None) -> float:
    """eager's area_pixel_compute_scale: input pixels per output pixel."""
    if align_corners:
        return (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else in_size / out_size


def _cubic_near(x: float, a: float) -> float:  # |x| <= 1
    return ((a + 2) * x - (a + 3)) * x * x + 1


def _cubic_far(x: float, a: float) -> float:  # 1 < |x| < 2
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a


def _source_index(real: float, in_size: int) -> tuple[int, float]:
    """eager's guard_index_and_lambda: the tap below `real` (floored in float32, as eager's floorf) and the
    fraction past it, clamped to [0, 1]."""
    index = min(math.floor(float(np.float32(real))), in_size - 1)
    return index, min(max(real - index, 0.0), 1.0)


def _linear_taps(in_size: int, out_size: int, align_corners: bool, scale: float | None) -> Taps:
    ratio = _source_ratio(in_size, out_size, align_corners, scale)
    indices = np.zeros((out_size, 2), np.int64)
    weights = np.zeros((out_size, 2), np.float64)
    for i in range(out_size):
        if in_size == out_size:
            indices[i], weights[i] = (i, i), (1.0, 0.0)
            continue
        real = ratio * i if align_corners else max(ratio * (i + 0.5) - 0.5, 0.0)
        low, fraction = _source_index(real, in_size)
        indices[i] = (low, low + (1 if low < in_size - 1 else 0))
        weights[i] = (1.0 - fraction, fraction)
    return indices, weights, None


def _cubic_taps(in_size: int, out_size: int, align_corners: bool, scale: float | None) -> Taps:
    ratio = _source_ratio(in_size, out_size, align_corners, scale)
    indices = np.zeros((out_size, 4), np.int64)
    weights = np.zeros((out_size, 4), np.float64)
    a = _CUBIC_A
    for i in range(out_size):
        real = ratio * i if align_corners else ratio * (i + 0.5) - 0.5
        low, t = _source_index(real, in_size)
        weights[i] = (_cubic_far(t + 1.0, a), _cubic_near(t, a), _cubic_near(1.0 - t, a), _cubic_far(2.0 - t, a))
        indices[i] = [min(max(low - 1 + k, 0), in_size - 1) for k in range(4)]
    return indices, weights, None


def _antialias_taps(
    in_size: int,
    out_size: int,
    align_corners: bool,
    scale: float | None,
    cubic: bool,
    antialias: bool = True,
    corner_delta: float = 0.0,
) -> Taps:
    """eager's _compute_weights_aa: a window of the filter stretched by the downscale ratio (its support), weights
    normalized to sum 1. Without `antialias` (eager's uint8 kernels), the plain filter; `corner_delta` is 0.5 for
    uint8 with align_corners and no antialias."""
    ratio = _source_ratio(in_size, out_size, align_corners, scale)
    taps = 4 if cubic else 2
    support = taps * 0.5 * ratio if ratio >= 1.0 and antialias else taps * 0.5
    width = math.ceil(support) * 2 + 1 if antialias else taps
    inverse = 1.0 / ratio if ratio >= 1.0 and antialias else 1.0

    def kernel(x: float) -> float:
        x = abs(x)
        if cubic:
            a = _AA_CUBIC_A if antialias else _CUBIC_A
            return _cubic_near(x, a) if x < 1.0 else _cubic_far(x, a) if x < 2.0 else 0.0
        return 1.0 - x if x < 1.0 else 0.0

    indices = np.zeros((out_size, width), np.int64)
    weights = np.zeros((out_size, width), np.float64)
    counted = np.zeros((out_size, width), np.bool_)
    for i in range(out_size):
        center = ratio * (i + 0.5 - corner_delta)
        start = max(int(center - support + 0.5 + corner_delta), 0)
        count = min(max(min(int(center + support + 0.5 + corner_delta), in_size) - start, 0), width)
        values = [kernel((j + start - center + 0.5 - corner_delta) * inverse) for j in range(count)]
        total = 0.0
        for value in values:
            total += value
        for j, value in enumerate(values):
            indices[i, j], weights[i, j], counted[i, j] = start + j, value / total if total != 0.0 else value, True
        indices[i, count:] = start
    return indices, weights, counted


def _gather_axis(x: TFloat, axis: int, taps: Taps) -> TFloat:
    """Sum over the taps of x's slices along `axis` times their weights (x's dtype), in tap order (eager's)."""
    indices, weights, counted = taps
    rank = len(x.shape)
    shape = [-1] + [1] * (rank - 1 - axis)
    result = None
    for k in range(indices.shape[1]):
        taken = op.Gather(x, op.Constant(value=ir.tensor(np.ascontiguousarray(indices[:, k]))), axis=axis)
        term = op.Mul(taken, op.Constant(value=ir.tensor(weights[:, k].reshape(shape).copy())))
        if counted is not None and not counted[:, k].all():  # a tap past the window adds nothing (not 0 * inf)
            term = op.Where(op.Constant(value=ir.tensor(counted[:, k].reshape(shape).copy())), term, double(0.0))
        result = term if result is None else op.Add(result, term)
    assert result is not None
    return result


def _static_resize_sizes(
    input: TFloat, output_size: Sequence[int] | None, scale_factors: Sequence[float | None] | None, spatial: int
) -> list[tuple[int, int, float | None]] | None:
    """Per spatial axis (in, out, eager's scale or None); None when a size is symbolic."""
    sizes = list(input.shape)[-spatial:]
    scales: list[float | None] = list(scale_factors) if scale_factors is not None else [None] * spatial
    if output_size is not None:
        outs = list(output_size)
    else:
        outs = [
            int(size * scale) if isinstance(size, int) and scale is not None else None
            for size, scale in zip(sizes, scales)
        ]
    if not all(isinstance(n, int) for n in [*sizes, *outs]):
        return None
    return [(int(i), int(o), s) for i, o, s in zip(sizes, outs, scales)]


def _resize_float64(
    input: DOUBLE,
    output_size: Sequence[int] | None,
    align_corners: bool,
    scale_factors: Sequence[float | None] | None,
    mode: str,
    spatial: int,
) -> DOUBLE | None:
    """`mode`: linear, cubic, linear_aa or cubic_aa; None when the sizes are symbolic (the caller falls back)."""
    axes = _static_resize_sizes(input, output_size, scale_factors, spatial)
    if axes is None:
        return None
    result = input
    rank = len(input.shape)
    for position in reversed(range(spatial)):  # the last axis first, as eager nests its sums
        in_size, out_size, scale = axes[position]
        if mode.endswith("_aa"):
            if in_size == out_size:
                continue  # eager's separable kernel skips an axis it does not resize
            taps = _antialias_taps(in_size, out_size, align_corners, scale, cubic=mode == "cubic_aa")
        elif mode == "cubic":
            taps = _cubic_taps(in_size, out_size, align_corners, scale)
        else:
            taps = _linear_taps(in_size, out_size, align_corners, scale)
        result = _gather_axis(result, rank - spatial + position, taps)
    return result


def _vec_float64(
    input: DOUBLE,
    output_size: Sequence[int] | None,
    align_corners: bool,
    scale_factors: Sequence[float] | None,
    mode: str,
) -> DOUBLE:
    spatial = len(output_size) if output_size is not None else len(scale_factors or [])
    result = _resize_float64(input, output_size, align_corners, scale_factors, mode, spatial)
    if result is not None:
        return result
    if mode.endswith("_aa"):
        return _resize_antialias(input, output_size, align_corners, scale_factors, mode.removesuffix("_aa"))
    return _resize(input, output_size, align_corners, scale_factors, mode)


def _resize_antialias(
    input: TFloat,
    output_size: Sequence[int] | None,
    align_corners: bool,
    scale_factors: Sequence[float] | None,
    mode: str,
) -> TFloat:
    """Symbolic sizes: ONNX's antialiased Resize (float32 in ONNX Runtime)."""
    spatial = len(output_size) if output_size is not None else len(scale_factors or [])
    axes = list(range(2, 2 + spatial))
    if output_size is not None:
        scales, sizes = None, op.Constant(value_ints=[int(n) for n in output_size])
    else:
        scales, sizes = op.Constant(value_floats=[float(s) for s in scale_factors or []]), None
    return op.Resize(
        input,
        None,
        scales,
        sizes,
        axes=axes,
        mode=mode,
        antialias=1,
        coordinate_transformation_mode="align_corners" if align_corners else "pytorch_half_pixel",
        cubic_coeff_a=-0.5,
        exclude_outside=1,
    )


@lowering(
    "aten::upsample_linear1d.vec", "aten::upsample_bilinear2d.vec", "aten::upsample_trilinear3d.vec", variant="float64"
)
def upsample_linear_vec_float64(
    input: DOUBLE,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> DOUBLE:
    return _vec_float64(input, output_size, align_corners, scale_factors, "linear")


@lowering("aten::upsample_bicubic2d.vec", variant="float64")
def upsample_bicubic_vec_float64(
    input: DOUBLE,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> DOUBLE:
    return _vec_float64(input, output_size, align_corners, scale_factors, "cubic")


@lowering("aten::_upsample_bilinear2d_aa.vec", variant="float64")
def upsample_bilinear_aa_vec_float64(
    input: DOUBLE,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> DOUBLE:
    return _vec_float64(input, output_size, align_corners, scale_factors, "linear_aa")


@lowering("aten::_upsample_bicubic2d_aa.vec", variant="float64")
def upsample_bicubic_aa_vec_float64(
    input: DOUBLE,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> DOUBLE:
    return _vec_float64(input, output_size, align_corners, scale_factors, "cubic_aa")


def _sized_float64(
    input: DOUBLE, output_size: Sequence[int], align_corners: bool, scales: Sequence[float | None], mode: str
) -> DOUBLE:
    result = _resize_float64(input, output_size, align_corners, scales, mode, len(output_size))
    if result is not None:
        return result
    if mode.endswith("_aa"):
        return _resize_antialias(input, output_size, align_corners, None, mode.removesuffix("_aa"))
    return _resize(input, output_size, align_corners, None, mode)


@lowering("aten::upsample_linear1d", variant="float64")
def upsample_linear1d_float64(
    self: DOUBLE, output_size: Sequence[int], align_corners: bool, scales: float | None = None
) -> DOUBLE:
    return _sized_float64(self, output_size, align_corners, [scales], "linear")


@lowering("aten::upsample_bilinear2d", variant="float64")
def upsample_bilinear2d_float64(
    self: DOUBLE,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> DOUBLE:
    return _sized_float64(self, output_size, align_corners, [scales_h, scales_w], "linear")


@lowering("aten::upsample_trilinear3d", variant="float64")
def upsample_trilinear3d_float64(
    self: DOUBLE,
    output_size: Sequence[int],
    align_corners: bool,
    scales_d: float | None = None,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> DOUBLE:
    return _sized_float64(self, output_size, align_corners, [scales_d, scales_h, scales_w], "linear")


@lowering("aten::upsample_bicubic2d", variant="float64")
def upsample_bicubic2d_float64(
    self: DOUBLE,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> DOUBLE:
    return _sized_float64(self, output_size, align_corners, [scales_h, scales_w], "cubic")


@lowering("aten::_upsample_bilinear2d_aa", variant="float64")
def upsample_bilinear2d_aa_float64(
    self: DOUBLE,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> DOUBLE:
    return _sized_float64(self, output_size, align_corners, [scales_h, scales_w], "linear_aa")


@lowering("aten::_upsample_bicubic2d_aa", variant="float64")
def upsample_bicubic2d_aa_float64(
    self: DOUBLE,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> DOUBLE:
    return _sized_float64(self, output_size, align_corners, [scales_h, scales_w], "cubic_aa")


# --- uint8 antialiased resizes: eager's fixed-point kernels -----------------------------------------------------------
# eager resizes uint8 images one axis at a time (the last first) with its float weights scaled to int16 at the
# largest precision that keeps the largest weight below 2**15, sums integer products from 2**(precision - 1) and
# shifts right (floor), saturating to [0, 255]. The integer sums are exact in float64 (below 2**53), so that is
# where they are computed: the results are eager's bit for bit.
def _int16_weights(weights: np.ndarray, counted: np.ndarray | None) -> tuple[np.ndarray, int]:
    largest = float(weights.max())
    precision = 0
    while precision < 22 and int(0.5 + largest * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    rounded = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5))  # half away from zero
    if counted is not None:
        rounded = np.where(counted, rounded, 0.0)
    return rounded.astype(np.float64), max(precision, 1)


def _merged_taps(taps: Taps) -> Taps:
    """Taps clamped onto the same input index merged into one (their weights summed), as eager's uint8 bicubic
    weights are before they are scaled to int16."""
    indices, weights, _ = taps
    merged_indices = np.zeros_like(indices)
    merged_weights = np.zeros_like(weights)
    counted = np.zeros(weights.shape, np.bool_)
    for i in range(indices.shape[0]):
        distinct = sorted(set(indices[i].tolist()))
        for j, index in enumerate(distinct):
            total = 0.0
            for k in range(indices.shape[1]):
                if indices[i, k] == index:
                    total += weights[i, k]
            merged_indices[i, j], merged_weights[i, j], counted[i, j] = index, total, True
        merged_indices[i, len(distinct) :] = distinct[0]
    return merged_indices, merged_weights, counted


def _resize_uint8_fixed_point(
    input: UINT8,
    output_size: Sequence[int] | None,
    align_corners: bool,
    scale_factors: Sequence[float | None] | None,
    mode: str,
) -> UINT8:
    """`mode`: linear_aa, cubic_aa or cubic (eager's uint8 bicubic: the cubic taps, clamped taps merged)."""
    spatial = len(output_size) if output_size is not None else len(scale_factors or [])
    axes = _static_resize_sizes(input, output_size, scale_factors, spatial)
    if axes is None and mode == "cubic":
        return _resize_uint8(input, output_size, align_corners, scale_factors, "cubic")
    if axes is None:  # symbolic sizes: ONNX's antialiased Resize in float, rounded half up and saturated
        sizes = None if output_size is None else output_size
        resized = _resize_antialias(
            op.Cast(input, to=ir.DataType.FLOAT),
            sizes,
            align_corners,
            scale_factors if sizes is None else None,
            mode.removesuffix("_aa"),
        )
        return op.Cast(_round_to_uint8(resized), to=ir.DataType.UINT8)
    result = op.Cast(input, to=ir.DataType.DOUBLE)
    rank = len(input.shape)
    for position in reversed(range(spatial)):
        in_size, out_size, scale = axes[position]
        if in_size == out_size:
            continue
        if mode == "cubic":
            taps = _merged_taps(_cubic_taps(in_size, out_size, align_corners, scale))
        else:
            taps = _antialias_taps(in_size, out_size, align_corners, scale, cubic=mode == "cubic_aa")
        indices, weights, counted = taps
        fixed, precision = _int16_weights(weights, counted)
        total = _gather_axis(result, rank - spatial + position, (indices, fixed, counted))
        shifted = op.Floor(op.Mul(op.Add(total, double(float(1 << (precision - 1)))), double(2.0**-precision)))
        result = op.Clip(shifted, double(0.0), double(255.0))
    return op.Cast(result, to=ir.DataType.UINT8)


@lowering("aten::_upsample_bilinear2d_aa.vec", variant="uint8")
def upsample_bilinear_aa_vec_uint8(
    input: UINT8,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> UINT8:
    return _resize_uint8_fixed_point(input, output_size, align_corners, scale_factors, "linear_aa")


@lowering("aten::_upsample_bicubic2d_aa.vec", variant="uint8")
def upsample_bicubic_aa_vec_uint8(
    input: UINT8,
    output_size: Sequence[int] | None = None,
    align_corners: bool = False,
    scale_factors: Sequence[float] | None = None,
) -> UINT8:
    return _resize_uint8_fixed_point(input, output_size, align_corners, scale_factors, "cubic_aa")


@lowering("aten::_upsample_bilinear2d_aa", variant="uint8")
def upsample_bilinear2d_aa_uint8(
    self: UINT8,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> UINT8:
    return _resize_uint8_fixed_point(self, output_size, align_corners, [scales_h, scales_w], "linear_aa")


@lowering("aten::_upsample_bicubic2d_aa", variant="uint8")
def upsample_bicubic2d_aa_uint8(
    self: UINT8,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> UINT8:
    return _resize_uint8_fixed_point(self, output_size, align_corners, [scales_h, scales_w], "cubic_aa")


# --- grid sampling ----------------------------------------------------------------------------------------------------
# ONNX's GridSample handles 3-D grids only from opset 20, and ONNX Runtime runs it in float32 only. Each output point
# gathers its corners (2**dims for bilinear, 1 for nearest, 4x4 for bicubic) from the flattened input with
# GatherElements, weighted as eager's grid_sampler; out-of-range corners count as zeros (padding_mode 0), or the
# coordinates are first clipped (1, border) or reflected (2, reflection).
def _unnormalize(coordinate: TFloat, size: int, align_corners: bool) -> TFloat:
    if align_corners:
        return op.Mul(op.Add(coordinate, op.CastLike(1.0, coordinate)), op.CastLike((size - 1) / 2, coordinate))
    scaled = op.Mul(op.Add(coordinate, op.CastLike(1.0, coordinate)), op.CastLike(size / 2, coordinate))
    return op.Sub(scaled, op.CastLike(0.5, coordinate))


def _reflect(coordinate: TFloat, twice_low: int, twice_high: int) -> TFloat:
    if twice_low == twice_high:
        return op.Mul(coordinate, op.CastLike(0.0, coordinate))
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = op.Abs(op.Sub(coordinate, op.CastLike(low, coordinate)))
    extra = op.Mod(distance, op.CastLike(span, coordinate), fmod=1)
    flips = op.Floor(op.Div(distance, op.CastLike(span, coordinate)))
    even = op.Equal(op.Mod(flips, op.CastLike(2.0, coordinate), fmod=1), op.CastLike(0.0, coordinate))
    return op.Where(
        even, op.Add(extra, op.CastLike(low, coordinate)), op.Sub(op.CastLike(span + low, coordinate), extra)
    )


def _padded_coordinate(position: TFloat, size: int, padding_mode: int, align_corners: bool) -> TFloat:
    """eager's compute_coordinates: reflect (2) and/or clip (1, 2) an unnormalized coordinate."""
    if padding_mode == 2:
        position = _reflect(position, 0, 2 * (size - 1)) if align_corners else _reflect(position, -1, 2 * size - 1)
    if padding_mode in (1, 2):
        position = op.Clip(position, op.CastLike(0.0, position), op.CastLike(float(size - 1), position))
    return position


def _cubic_weights(t: TFloat) -> list[TFloat]:
    """Cubic convolution weights (A = -0.75) of the taps at -1, 0, 1, 2 for a fraction t, as eager."""
    a = -0.75

    def near(x: TFloat) -> TFloat:  # |x| <= 1
        return op.Add(
            op.Mul(op.Mul(op.Sub(op.Mul(op.CastLike(a + 2, x), x), op.CastLike(a + 3, x)), x), x), op.CastLike(1.0, x)
        )

    def far(x: TFloat) -> TFloat:  # 1 < |x| < 2
        inner = op.Add(op.Mul(op.Sub(op.Mul(op.CastLike(a, x), x), op.CastLike(5 * a, x)), x), op.CastLike(8 * a, x))
        return op.Sub(op.Mul(inner, x), op.CastLike(4 * a, x))

    one, two = op.CastLike(1.0, t), op.CastLike(2.0, t)
    return [far(op.Add(t, one)), near(t), near(op.Sub(one, t)), far(op.Sub(two, t))]


def _grid_sample(
    input: TFloat, grid: TFloat, interpolation_mode: int, padding_mode: int, align_corners: bool, name: str
) -> TFloat:
    """Sample [N, C, *sizes] at grid [N, *out, dims] (coordinates x, y(, z): last spatial dim first)."""
    dims = len(input.shape) - 2
    sizes = _spatial_sizes(input, dims, name)
    x, g = _in_float32(input), _in_float32(grid)
    batch_channels = op.Shape(input, start=0, end=2)
    flat = op.Reshape(x, op.Concat(batch_channels, op.Constant(value_ints=[math.prod(sizes)]), axis=0))
    points = op.Reshape(g, op.Concat(op.Shape(grid, start=0, end=1), op.Constant(value_ints=[-1, dims]), axis=0))
    unnormalized = []
    for axis, size in enumerate(reversed(sizes)):
        start, stop, along = (
            op.Constant(value_ints=[axis]),
            op.Constant(value_ints=[axis + 1]),
            op.Constant(value_ints=[2]),
        )
        coordinate = op.Squeeze(op.Slice(points, start, stop, along), along)
        unnormalized.append(_unnormalize(coordinate, size, align_corners))
    unnormalized.reverse()  # in the order of sizes
    one = op.CastLike(1.0, x)
    # Each tap: per axis (coordinate, weight or None); coordinates are padded before the bounds check.
    taps: list[list[tuple[TFloat, TFloat | None]]] = []
    if interpolation_mode == 2:  # bicubic
        lows = [op.Floor(p) for p in unnormalized]
        weights = [_cubic_weights(op.Sub(p, low)) for p, low in zip(unnormalized, lows)]
        for offsets in itertools.product(range(4), repeat=dims):
            taps.append(
                [
                    (
                        _padded_coordinate(
                            op.Add(low, op.CastLike(float(o - 1), x)), size, padding_mode, align_corners
                        ),
                        w[o],
                    )
                    for low, w, o, size in zip(lows, weights, offsets, sizes)
                ]
            )
    else:
        positions = [_padded_coordinate(p, size, padding_mode, align_corners) for p, size in zip(unnormalized, sizes)]
        if interpolation_mode == 1:
            taps.append([(op.Round(p), None) for p in positions])
        else:
            lows = [op.Floor(p) for p in positions]
            fractions = [op.Sub(p, low) for p, low in zip(positions, lows)]
            for highs in itertools.product((0, 1), repeat=dims):
                taps.append(
                    [
                        (op.Add(low, one), f) if high else (low, op.Sub(one, f))
                        for low, f, high in zip(lows, fractions, highs)
                    ]
                )
    index_shape = op.Concat(
        op.Shape(points, start=0, end=1), op.Shape(input, start=1, end=2), op.Shape(points, start=1, end=2), axis=0
    )
    channel_axis = op.Constant(value_ints=[1])
    result = None
    for tap in taps:
        inside = flat_index = weight = None
        for (coordinate, axis_weight), size in zip(tap, sizes):
            lowest, highest = op.CastLike(0.0, x), op.CastLike(float(size - 1), x)
            valid = op.And(op.GreaterOrEqual(coordinate, lowest), op.LessOrEqual(coordinate, highest))
            inside = valid if inside is None else op.And(inside, valid)
            clamped = op.Cast(op.Clip(coordinate, lowest, highest), to=INT64.dtype)
            flat_index = (
                clamped if flat_index is None else op.Add(op.Mul(flat_index, op.Constant(value_int=size)), clamped)
            )
            if axis_weight is not None:
                weight = axis_weight if weight is None else op.Mul(weight, axis_weight)
        values = op.GatherElements(flat, op.Expand(op.Unsqueeze(flat_index, channel_axis), index_shape), axis=2)
        if weight is not None:
            values = op.Mul(values, op.Unsqueeze(weight, channel_axis))
        values = op.Where(op.Unsqueeze(inside, channel_axis), values, op.CastLike(0.0, x))
        result = values if result is None else op.Add(result, values)
    out_shape = op.Shape(grid, start=1, end=1 + dims)
    return _back(op.Reshape(result, op.Concat(batch_channels, out_shape, axis=0)), input)


@lowering("aten::grid_sampler_2d")
def grid_sampler_2d(
    input: TFloat, grid: TFloat, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> TFloat:
    """Bilinear (0), nearest (1) or bicubic (2) sampling of [N, C, H, W] at grid [N, Ho, Wo, 2]."""
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners, "grid_sampler_2d")


@lowering("aten::grid_sampler_3d")
def grid_sampler_3d(
    input: TFloat, grid: TFloat, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> TFloat:
    """Bilinear (0) or nearest (1) sampling of [N, C, D, H, W] at grid [N, Do, Ho, Wo, 3]."""
    if interpolation_mode not in (0, 1):
        raise ValueError(f"grid_sampler_3d: eager has no interpolation mode {interpolation_mode} in 3-D")
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners, "grid_sampler_3d")


@lowering("aten::grid_sampler", variant="float64")
def grid_sampler_float64(
    input: DOUBLE, grid: DOUBLE, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> DOUBLE:
    """F.grid_sample's overload: torchlib's is ONNX's GridSample, which ONNX Runtime runs in float32 only."""
    if len(input.shape) == 5:
        return grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners)
    return grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners)
