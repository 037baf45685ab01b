"""Pooling: average, max and adaptive pools, each with its integer and float64 variants beside it."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir
from onnxscript import DOUBLE, INT32, INT64
from onnxscript import opset18 as op

from fx2onnx._lowerings.builders import TFloat, TInt, TReal, _back, _const, _in_float32, _is_float, _spatial_sizes
from fx2onnx._lowerings.kernels import double
from fx2onnx._lowerings.rules import lowering


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
    # eager's windows (the integer and float64 variants' too): what ceil-mode windows need past the padding
    extra = [_Dim(size, k, s, p, 1, ceil_mode).pad_after for size, k, s, p in zip(sizes, kernel, strides, pads)]
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


# --- average pooling: window sums in eager's order (AveragePool has no float64 kernel) -------------------------------
def _avg_pool(
    self: DOUBLE,
    spatial: int,
    name: str,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> DOUBLE:
    """Window sums over a zero-padded input (integer_pooling's windows: eager's, ceil mode included), each summed
    from +0 in eager's scan order and divided by eager's divisor, so results round as eager's do. Dynamic spatial
    dims keep core's AveragePool (which legalization runs in float32)."""
    if not all(isinstance(size, int) for size in self.shape[len(self.shape) - spatial :]):
        return avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    dims = _dims(self, spatial, name, kernel_size, stride, padding, (1,), ceil_mode)
    padded = _pad(self, dims, 0)
    total = double(0.0)  # eager's running sum starts at +0 (an all -0 window averages to +0)
    for offset in _offsets(dims):
        total = op.Add(total, _at_offset(padded, dims, offset))
    if divisor_override is not None:
        return op.Div(total, double(divisor_override))
    counts = window_counts(dims, count_include_pad)
    divisor = np.ones([len(c) for c in counts], dtype=np.float64)
    for axis, count in enumerate(counts):
        divisor = divisor * count.reshape([1] * axis + [-1] + [1] * (len(counts) - 1 - axis))
    return op.Div(total, op.Constant(value=ir.tensor(divisor)))


@lowering("aten::avg_pool1d", variant="float64")
def avg_pool1d(
    self: DOUBLE,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> DOUBLE:
    return _avg_pool(self, 1, "avg_pool1d", kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@lowering("aten::avg_pool2d", variant="float64")
def avg_pool2d(
    self: DOUBLE,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> DOUBLE:
    return _avg_pool(
        self, 2, "avg_pool2d", kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


@lowering("aten::avg_pool3d", variant="float64")
def avg_pool3d(
    self: DOUBLE,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> DOUBLE:
    return _avg_pool(
        self, 3, "avg_pool3d", kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


# Computed in int32, which holds all their values: ONNX Runtime has no int16 Max, Where or Pad (legalization would
# wrap each node in Casts), and one code path serves all three.
_NARROW = (ir.DataType.INT8, ir.DataType.INT16, ir.DataType.UINT8)


@dataclasses.dataclass(frozen=True)
class _Dim:
    """One spatial dim of a pooling: its size, window geometry and number of windows (as eager counts them)."""

    size: int
    kernel: int
    stride: int
    pad: int
    dilation: int
    ceil_mode: bool

    @property
    def windows(self) -> int:
        span = self.size + 2 * self.pad - self.dilation * (self.kernel - 1) - 1
        count = (-(-span // self.stride) if self.ceil_mode else span // self.stride) + 1
        if self.ceil_mode and (count - 1) * self.stride >= self.size + self.pad:
            count -= 1  # eager drops a last window that starts in the right padding
        return count

    @property
    def starts(self) -> np.ndarray:
        """Each window's first position, in input coordinates (negative inside the left padding)."""
        return np.arange(self.windows, dtype=np.int64) * self.stride - self.pad

    @property
    def pad_after(self) -> int:
        """Padding on the right so that every window's last element exists (ceil-mode windows run past it)."""
        reach = (self.windows - 1) * self.stride + self.dilation * (self.kernel - 1) + 1
        return max(0, reach - (self.size + 2 * self.pad))


def _dims(
    self: TInt,
    spatial: int,
    name: str,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> list[_Dim]:
    shape = list(self.shape)
    sizes = shape[len(shape) - spatial :]
    if not all(isinstance(size, int) for size in sizes):
        raise NotImplementedError(
            f"{name} of an integer tensor needs static spatial dims (got shape {shape}); "
            "export with static spatial sizes or register an implementation"
        )
    kernel = _per_dim(kernel_size, spatial)
    strides = _per_dim(stride, spatial) if len(stride) else kernel
    pads = _per_dim(padding, spatial)
    dilations = _per_dim(dilation, spatial)
    return [_Dim(int(n), k, s, p, d, ceil_mode) for n, k, s, p, d in zip(sizes, kernel, strides, pads, dilations)]


def _int64(values: np.ndarray | int) -> INT64:
    return op.Constant(value=ir.tensor(np.asarray(values, dtype=np.int64)))


def _pad(value: TInt, dims: list[_Dim], fill: int) -> TInt:
    """Pad the spatial dims with `fill`: `pad` before, `pad` plus what ceil-mode windows need after."""
    if not any(dim.pad or dim.pad_after for dim in dims):
        return value
    leading = [0] * (len(value.shape) - len(dims))
    amounts = [*leading, *(dim.pad for dim in dims), *leading, *(dim.pad + dim.pad_after for dim in dims)]
    fill_value = op.Constant(value=ir.tensor(np.asarray(fill, dtype=value.dtype.numpy())))
    return op.Pad(value, _int64(np.asarray(amounts)), fill_value)


def _offsets(dims: list[_Dim]) -> list[tuple[int, ...]]:
    """Every kernel offset, in eager's row-major scan order (last dim fastest)."""
    return list(itertools.product(*(range(dim.kernel) for dim in dims)))


def _at_offset(padded: TInt, dims: list[_Dim], offset: tuple[int, ...]) -> TInt:
    """The element at `offset` of every window: one strided Slice of the padded input."""
    starts = [j * dim.dilation for j, dim in zip(offset, dims)]
    ends = [start + (dim.windows - 1) * dim.stride + 1 for start, dim in zip(starts, dims)]
    axes = list(range(-len(dims), 0))
    steps = [dim.stride for dim in dims]
    return op.Slice(
        padded,
        _int64(np.asarray(starts)),
        _int64(np.asarray(ends)),
        _int64(np.asarray(axes)),
        _int64(np.asarray(steps)),
    )


def _spread(per_dim: list[np.ndarray], combine: Callable[[INT64, INT64], INT64]) -> INT64:
    """Combine one vector per spatial dim into a tensor over the windows (Add: flat indices; Mul: sizes)."""
    count = len(per_dim)
    result = None
    for axis, vector in enumerate(per_dim):
        shaped = _int64(vector.reshape([1] * axis + [-1] + [1] * (count - 1 - axis)))
        result = shaped if result is None else combine(result, shaped)
    return result


def _narrowed(result: TInt, self: TInt) -> TInt:
    return op.Cast(result, to=self.dtype) if result.dtype != self.dtype else result


# --- max pooling ------------------------------------------------------------------------------------------------
def _max_pool(self: TReal, dims: list[_Dim], with_indices: bool) -> tuple[TReal, INT64 | None]:
    """The maximum of each window and (optionally) the flat index of its first maximum.

    The padding holds the compute dtype's minimum (-inf for floats), so it is never strictly greater than the
    running maximum: the running index starts at each window's first position inside the input (past the input
    for a window of padding only, as in eager) and moves only on a strictly greater element, which is eager's
    first maximum in scan order. For floats it moves on every NaN too (eager: the window's last NaN).
    """
    floating = _is_float(self)
    x = op.Cast(self, to=INT32.dtype) if self.dtype in _NARROW else self
    # self's own minimum: a window of padding only is eager's initial maximum (int8: -128, not int32's cast to 0)
    padded = _pad(x, dims, -math.inf if floating else int(np.iinfo(self.dtype.numpy()).min))
    if not with_indices and self.dtype != ir.DataType.INT64:
        # float64 holds every int32 exactly, and ONNX Runtime's MaxPool is several times faster than the slices.
        # The padding is explicit, so its windows are exactly eager's (no ceil_mode, pads or auto_pad of its own).
        unbatched = len(self.shape) == len(dims) + 1  # MaxPool wants (N, C, *spatial)
        batch_axis = op.Constant(value_ints=[0])
        pooled, _ = op.MaxPool(
            op.Cast(op.Unsqueeze(padded, batch_axis) if unbatched else padded, to=DOUBLE.dtype),
            kernel_shape=[dim.kernel for dim in dims],
            strides=[dim.stride for dim in dims],
            dilations=[dim.dilation for dim in dims],
        )
        return op.Cast(op.Squeeze(pooled, batch_axis) if unbatched else pooled, to=self.dtype), None
    offsets = _offsets(dims)
    best = _at_offset(padded, dims, offsets[0])
    if not with_indices:
        for offset in offsets[1:]:
            best = op.Max(best, _at_offset(padded, dims, offset))
        return _narrowed(best, self), None
    plane_strides = [math.prod(dim.size for dim in dims[axis + 1 :]) for axis in range(len(dims))]
    window_starts = _spread([dim.starts * step for dim, step in zip(dims, plane_strides)], op.Add)
    first_inside = [  # per dim, the first position of each window's dilated grid that is inside the input
        dim.starts + (-(-np.maximum(-dim.starts, 0) // dim.dilation)) * dim.dilation for dim in dims
    ]
    first = _spread([first * step for first, step in zip(first_inside, plane_strides)], op.Add)
    if len(offsets) == 1:
        return _narrowed(best, self), op.Expand(first, op.Shape(best))
    # The running choice is the offset's number (a Where with a scalar, several times faster in ONNX Runtime than
    # one broadcasting each window's position), turned into a position once at the end.
    shifts = [sum(j * dim.dilation * step for j, dim, step in zip(offset, dims, plane_strides)) for offset in offsets]
    chosen = op.Expand(_int64(0), op.Shape(best))
    for number, offset in enumerate(offsets[1:], 1):
        candidate = _at_offset(padded, dims, offset)
        greater = op.Greater(candidate, best)
        if floating:
            greater = op.Or(greater, op.IsNaN(candidate))
        best = op.Where(greater, candidate, best)
        chosen = op.Where(greater, _int64(number), chosen)
    later = op.Add(window_starts, op.Gather(_int64(np.asarray(shifts)), chosen))
    index = op.Where(op.Equal(chosen, _int64(0)), first, later)  # offset 0: its first position inside the input
    return _narrowed(best, self), index


def _max_pool_values(
    self: TInt,
    spatial: int,
    name: str,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> TInt:
    sizes = list(self.shape)[len(self.shape) - spatial :]
    if not all(isinstance(size, int) for size in sizes) and not ceil_mode and self.dtype != ir.DataType.INT64:
        return _max_pool_of_dynamic_sizes(self, spatial, kernel_size, stride, padding, dilation)
    dims = _dims(self, spatial, name, kernel_size, stride, padding, dilation, ceil_mode)
    return _max_pool(self, dims, with_indices=False)[0]


def _max_pool_of_dynamic_sizes(
    self: TInt,
    spatial: int,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> TInt:
    """Integer max pooling over spatial dims known at run time only (a data-dependent length): float64 MaxPool,
    which holds every int32, padded explicitly with self's minimum. Without ceil mode every window ends inside
    the padded input, so the padding is `padding` on both sides whatever the sizes."""
    kernel = _per_dim(kernel_size, spatial)
    pads = _per_dim(padding, spatial)
    x = op.Cast(self, to=INT32.dtype) if self.dtype in _NARROW else self
    leading = [0] * (len(self.shape) - spatial)
    if any(pads):
        fill = op.Constant(value=ir.tensor(np.asarray(np.iinfo(self.dtype.numpy()).min, dtype=x.dtype.numpy())))
        x = op.Pad(x, _int64(np.asarray([*leading, *pads, *leading, *pads])), fill)
    unbatched = len(self.shape) == spatial + 1  # MaxPool wants (N, C, *spatial)
    batch_axis = op.Constant(value_ints=[0])
    pooled, _ = op.MaxPool(
        op.Cast(op.Unsqueeze(x, batch_axis) if unbatched else x, to=DOUBLE.dtype),
        kernel_shape=kernel,
        strides=_per_dim(stride, spatial) if len(stride) else kernel,
        dilations=_per_dim(dilation, spatial),
    )
    return op.Cast(op.Squeeze(pooled, batch_axis) if unbatched else pooled, to=self.dtype)


def _max_pool_indexed(
    self: TInt,
    spatial: int,
    name: str,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> tuple[TInt, INT64]:
    dims = _dims(self, spatial, name, kernel_size, stride, padding, dilation, ceil_mode)
    values, indices = _max_pool(self, dims, with_indices=True)
    assert indices is not None
    return values, indices


# float max pooling in ceil mode: eager drops a last window that would start in the right padding, ONNX's MaxPool
# (shape inference, the checker) counts it (max_pool1d(k=3, padding=1, ceil_mode) of 2 elements: 1 window, ONNX 2).
def _max_pool_float(
    self: TFloat,
    spatial: int,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> TFloat:
    """MaxPool with eager's window count: ceil mode only where a dim needs it, and its extra windows sliced off."""
    kernel = _per_dim(kernel_size, spatial)
    strides = _per_dim(stride, spatial) if len(stride) else kernel
    pads = _per_dim(padding, spatial)
    dilations = _per_dim(dilation, spatial)
    sizes = list(self.shape)[len(self.shape) - spatial :]
    windows: list[int | None] = [None] * spatial
    if ceil_mode and all(isinstance(size, int) for size in sizes):
        dims = [_Dim(int(n), k, s, p, d, True) for n, k, s, p, d in zip(sizes, kernel, strides, pads, dilations)]
        floor = [dataclasses.replace(dim, ceil_mode=False).windows for dim in dims]
        windows = [dim.windows for dim in dims]
        ceil_mode = any(count > low for count, low in zip(windows, floor))
    unbatched = len(self.shape) == spatial + 1  # MaxPool wants (N, C, *spatial)
    batch_axis = op.Constant(value_ints=[0])
    batched = op.Unsqueeze(self, batch_axis) if unbatched else self

    def pool(value: TFloat) -> TFloat:
        pooled, _ = op.MaxPool(
            value,
            ceil_mode=int(ceil_mode),
            dilations=dilations,
            kernel_shape=kernel,
            pads=pads + pads,
            strides=strides,
        )
        if not ceil_mode:
            return pooled
        # a dim whose last ceil window eager drops: keep eager's count
        ends = _int64(np.asarray([count for count in windows if count is not None]))
        return op.Slice(pooled, _int64(np.zeros(spatial, np.int64)), ends, _int64(np.arange(2, 2 + spatial)))

    # Eager's max of a window holding a NaN is NaN, and of a window of -infs -inf; ONNX Runtime's float32 MaxPool
    # skips a NaN after the window's first element (max_pool1d([1, nan], 2): 1) and starts from the lowest finite
    # value (a window of -infs, or of padding only: -3.4e38). One pool of an indicator (2: NaN, 1: above -inf, 0: -inf)
    # puts both back.
    above = op.Cast(op.Greater(batched, _const(-math.inf, self)), to=self.dtype)
    indicator = op.Add(above, op.Mul(op.Cast(op.IsNaN(batched), to=self.dtype), _const(2.0, self)))
    seen = pool(indicator)
    # (a window of padding only: ONNX Runtime's lowest finite value, below 0)
    pooled = op.Where(op.LessOrEqual(seen, _const(0.0, self)), _const(-math.inf, self), pool(batched))
    pooled = op.Where(op.Equal(seen, _const(2.0, self)), _const(math.nan, self), pooled)
    return op.Squeeze(pooled, batch_axis) if unbatched else pooled


# float max pooling with indices: ONNX Runtime's MaxPool (torchlib's lowering) skips NaN (max_pool1d([1, nan, 2], 3):
# 2 at index 2, eager nan at 1), gives -3.4e38 for a window of -infs and -1 for a window of padding only (eager:
# -inf at the first position of its grid past the padding). With static spatial sizes, eager's scan.
def _max_pool_float_indexed(
    self: TFloat,
    spatial: int,
    name: str,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> tuple[TFloat, INT64]:
    if not all(isinstance(size, int) for size in list(self.shape)[len(self.shape) - spatial :]):
        from onnxscript.function_libs.torch_lib.ops import nn

        torchlib = getattr(nn, f"aten_{name}")
        return torchlib(self, kernel_size, stride, padding, dilation, ceil_mode)
    dims = _dims(self, spatial, name, kernel_size, stride, padding, dilation, ceil_mode)
    values, indices = _max_pool(self, dims, with_indices=True)
    assert indices is not None
    return values, indices


@lowering("aten::max_pool1d_with_indices", variant="float")
def max_pool1d_with_indices_float(
    self: TFloat,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> tuple[TFloat, INT64]:
    return _max_pool_float_indexed(
        self, 1, "max_pool1d_with_indices", kernel_size, stride, padding, dilation, ceil_mode
    )


@lowering("aten::max_pool2d_with_indices", variant="float")
def max_pool2d_with_indices_float(
    self: TFloat,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    ceil_mode: bool = False,
) -> tuple[TFloat, INT64]:
    return _max_pool_float_indexed(
        self, 2, "max_pool2d_with_indices", kernel_size, stride, padding, dilation, ceil_mode
    )


@lowering("aten::max_pool3d_with_indices", variant="float")
def max_pool3d_with_indices_float(
    self: TFloat,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0, 0),
    dilation: Sequence[int] = (1, 1, 1),
    ceil_mode: bool = False,
) -> tuple[TFloat, INT64]:
    return _max_pool_float_indexed(
        self, 3, "max_pool3d_with_indices", kernel_size, stride, padding, dilation, ceil_mode
    )


@lowering("aten::max_pool1d", variant="float")
def max_pool1d_float(
    self: TFloat,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> TFloat:
    return _max_pool_float(self, 1, kernel_size, stride, padding, dilation, ceil_mode)


@lowering("aten::max_pool2d", variant="float")
def max_pool2d_float(
    self: TFloat,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
    ceil_mode: bool = False,
) -> TFloat:
    return _max_pool_float(self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowering("aten::max_pool3d", variant="float")
def max_pool3d_float(
    self: TFloat,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0, 0, 0),
    dilation: Sequence[int] = (1, 1, 1),
    ceil_mode: bool = False,
) -> TFloat:
    return _max_pool_float(self, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lowering("aten::max_pool1d")
def max_pool1d_int(
    self: TInt,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> TInt:
    return _max_pool_values(self, 1, "max_pool1d", kernel_size, stride, padding, dilation, ceil_mode)


@lowering("aten::max_pool2d")
def max_pool2d_int(
    self: TInt,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> TInt:
    return _max_pool_values(self, 2, "max_pool2d", kernel_size, stride, padding, dilation, ceil_mode)


@lowering("aten::max_pool3d")
def max_pool3d_int(
    self: TInt,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> TInt:
    return _max_pool_values(self, 3, "max_pool3d", kernel_size, stride, padding, dilation, ceil_mode)


@lowering("aten::max_pool1d_with_indices")
def max_pool1d_with_indices_int(
    self: TInt,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> tuple[TInt, INT64]:
    return _max_pool_indexed(self, 1, "max_pool1d_with_indices", kernel_size, stride, padding, dilation, ceil_mode)


@lowering("aten::max_pool2d_with_indices")
def max_pool2d_with_indices_int(
    self: TInt,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> tuple[TInt, INT64]:
    return _max_pool_indexed(self, 2, "max_pool2d_with_indices", kernel_size, stride, padding, dilation, ceil_mode)


@lowering("aten::max_pool3d_with_indices")
def max_pool3d_with_indices_int(
    self: TInt,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    ceil_mode: bool = False,
) -> tuple[TInt, INT64]:
    return _max_pool_indexed(self, 3, "max_pool3d_with_indices", kernel_size, stride, padding, dilation, ceil_mode)


# --- average pooling --------------------------------------------------------------------------------------------
def window_counts(dims: Sequence[_Dim], count_include_pad: bool) -> list[np.ndarray]:
    """Per spatial dim, the element count eager divides each window's sum by: each window clipped to the padded
    input, then (without count_include_pad) to the input."""
    counts = []
    for dim in dims:
        ends = np.minimum(dim.starts + dim.kernel, dim.size + dim.pad)
        starts = dim.starts
        if not count_include_pad:
            starts, ends = np.maximum(starts, 0), np.minimum(ends, dim.size)
        counts.append(ends - starts)
    return counts


def _avg_pool_integer(
    self: INT64,
    spatial: int,
    name: str,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> INT64:
    """Window sums over a zero-padded input, divided (truncating, as C++ does) by eager's divisor."""
    dims = _dims(self, spatial, name, kernel_size, stride, padding, (1,), ceil_mode)
    padded = _pad(self, dims, 0)
    offsets = _offsets(dims)
    total = _at_offset(padded, dims, offsets[0])
    for offset in offsets[1:]:
        total = op.Add(total, _at_offset(padded, dims, offset))
    if divisor_override is not None:
        return op.Div(total, _int64(divisor_override))
    counts = window_counts(dims, count_include_pad)
    if all(np.all(count == count[0]) for count in counts):  # the same divisor everywhere: one scalar
        return op.Div(total, _int64(math.prod(int(count[0]) for count in counts)))
    return op.Div(total, _spread(counts, op.Mul))


@lowering("aten::avg_pool1d")
def avg_pool1d_int(
    self: INT64,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
) -> INT64:
    return _avg_pool_integer(self, 1, "avg_pool1d", kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@lowering("aten::avg_pool2d")
def avg_pool2d_int(
    self: INT64,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> INT64:
    return _avg_pool_integer(
        self, 2, "avg_pool2d", kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


@lowering("aten::avg_pool3d")
def avg_pool3d_int(
    self: INT64,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = (0,),
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> INT64:
    return _avg_pool_integer(
        self, 3, "avg_pool3d", kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


# --- adaptive pooling ------------------------------------------------------------------------------------------------
# Output cell i of a dim of length n pooled to m covers [floor(i*n/m), ceil((i+1)*n/m)). Bins overlap and differ in
# size when m does not divide n, so no fixed-window ONNX pool matches. The spatial dims are flattened, one padding
# element is appended, and a constant [cells, largest bin] index table gathers each cell's inputs (short bins
# point at the padding, which is neutral: 0 for sums, -inf for maxima).
def _adaptive_bins(input_sizes: Sequence[int], output_sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(index table [cells, width] into the flat inputs, padded with prod(input_sizes); bin sizes [cells])."""
    bins: list[list[int]] = [[0]]
    for n, m in zip(input_sizes, output_sizes):
        ranges = [range((i * n) // m, -((-(i + 1) * n) // m)) for i in range(m)]
        bins = [[outer * n + inner for outer in cell for inner in span] for cell in bins for span in ranges]
    padding = math.prod(input_sizes)
    width = max(len(cell) for cell in bins)
    table = np.full((len(bins), width), padding, dtype=np.int64)
    for row, cell in enumerate(bins):
        table[row, : len(cell)] = cell
    return table, np.array([len(cell) for cell in bins], dtype=np.int64)


def _gather_bins(input: TFloat, sizes: Sequence[int], table: np.ndarray, padding: float) -> TFloat:
    """[..., *sizes] -> [..., cells, width]: each cell's inputs, padded with `padding`."""
    leading = op.Shape(input, start=0, end=len(input.shape) - len(sizes))
    flat = op.Reshape(input, op.Concat(leading, op.Constant(value_ints=[math.prod(sizes)]), axis=0))
    pad = op.Expand(
        op.Constant(value=ir.tensor([padding], dtype=input.dtype)),
        op.Concat(leading, op.Constant(value_ints=[1]), axis=0),
    )
    return op.Gather(op.Concat(flat, pad, axis=-1), op.Constant(value=ir.tensor(table)), axis=-1)


def _is_empty(input: TFloat) -> bool:
    return any(size == 0 for size in input.shape)


def _empty_cells(input: TFloat, output_sizes: Sequence[int]) -> TFloat:
    """The zero-size result of pooling an input with a leading dim of 0 (ORT's reductions mis-shape those)."""
    leading = op.Shape(input, start=0, end=len(input.shape) - len(output_sizes))
    shape = op.Concat(leading, op.Constant(value_ints=list(output_sizes)), axis=0)
    return op.CastLike(op.ConstantOfShape(shape), input)


def _unflatten_cells(cells: TFloat, input: TFloat, output_sizes: Sequence[int]) -> TFloat:
    leading = op.Shape(input, start=0, end=len(input.shape) - len(output_sizes))
    return op.Reshape(cells, op.Concat(leading, op.Constant(value_ints=list(output_sizes)), axis=0))


def _adaptive_max(input: TFloat, output_size: Sequence[int], name: str) -> tuple[TFloat, INT64]:
    """Max of each cell and the flat spatial index of its first maximum (of its last NaN, as eager's scan picks)."""
    sizes = _spatial_sizes(input, len(output_size), name)
    table, _ = _adaptive_bins(sizes, output_size)
    if _is_empty(input):
        return _empty_cells(input, output_size), op.Cast(_empty_cells(input, output_size), to=INT64.dtype)
    values = _gather_bins(input, sizes, table, -math.inf)
    positions = op.Constant(value=ir.tensor(table))
    last = op.Constant(value_ints=[-1])
    nan = op.IsNaN(values)
    lowest = op.Constant(value=ir.tensor(-math.inf, dtype=input.dtype))
    largest = op.ReduceMax(op.Where(nan, lowest, values), last, keepdims=True)
    beyond = op.Constant(value_int=math.prod(sizes))
    first = op.ReduceMin(op.Where(op.Equal(values, largest), positions, beyond), last, keepdims=False)
    has_nan = op.Cast(op.ReduceMax(op.Cast(nan, to=ir.DataType.INT32), last, keepdims=False), to=ir.DataType.BOOL)
    last_nan = op.ReduceMax(op.Where(nan, positions, op.Constant(value_int=-1)), last, keepdims=False)
    not_a_number = op.Constant(value=ir.tensor(math.nan, dtype=input.dtype))
    maxima = op.Where(has_nan, not_a_number, op.Squeeze(largest, last))
    indices = op.Where(has_nan, last_nan, first)
    return _unflatten_cells(maxima, input, output_size), _unflatten_cells(indices, input, output_size)


@lowering("aten::adaptive_max_pool1d")
def adaptive_max_pool1d(self: TFloat, output_size: Sequence[int]) -> tuple[TFloat, INT64]:
    return _adaptive_max(self, output_size, "adaptive_max_pool1d")


@lowering("aten::adaptive_max_pool2d")
def adaptive_max_pool2d(self: TFloat, output_size: Sequence[int]) -> tuple[TFloat, INT64]:
    return _adaptive_max(self, output_size, "adaptive_max_pool2d")


@lowering("aten::adaptive_max_pool3d")
def adaptive_max_pool3d(self: TFloat, output_size: Sequence[int]) -> tuple[TFloat, INT64]:
    return _adaptive_max(self, output_size, "adaptive_max_pool3d")


def _adaptive_average(input: TFloat, output_size: Sequence[int], name: str) -> TFloat:
    """Each cell's sum over its inputs divided by their count (float32 for float16/bfloat16, as eager)."""
    sizes = _spatial_sizes(input, len(output_size), name)
    table, counts = _adaptive_bins(sizes, output_size)
    x = _in_float32(input)
    if _is_empty(input):
        return _empty_cells(input, output_size)
    total = op.ReduceSum(_gather_bins(x, sizes, table, 0.0), op.Constant(value_ints=[-1]), keepdims=False)
    mean = op.Div(total, op.CastLike(op.Constant(value=ir.tensor(counts)), x))
    return _back(_unflatten_cells(mean, x, output_size), input)


@lowering("aten::adaptive_avg_pool1d")
def adaptive_avg_pool1d(self: TFloat, output_size: Sequence[int]) -> TFloat:
    return _adaptive_average(self, output_size, "adaptive_avg_pool1d")


@lowering("aten::_adaptive_avg_pool3d", "aten::adaptive_avg_pool3d")
def adaptive_avg_pool3d(self: TFloat, output_size: Sequence[int]) -> TFloat:
    return _adaptive_average(self, output_size, "adaptive_avg_pool3d")
