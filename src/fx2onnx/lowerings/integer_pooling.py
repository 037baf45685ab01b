"""Exact max and average pooling of integer tensors.

ONNX Runtime's MaxPool and AveragePool have no int64 kernels (nor int16/int32 ones), so torchlib's lowerings reach
integer inputs only through a Cast to float, which rounds values beyond 2**24 (float32) or 2**53 (float64). Here a
pooling is taken apart into its kernel offsets instead: the input is padded with the reduction's identity, one
strided Slice per kernel offset gives every window's element at that offset, and Max (or Add) combines them. (Maxima
without indices of dtypes narrower than int64 go through float64, which holds them exactly, and one MaxPool over the
explicitly padded input: faster than the slices.) Kernel sizes, strides, dilations and paddings are constants, and
the spatial dims must be static, so every window boundary and every divisor is worked out here, as eager's CPU
kernels work them out:

- Windows: ``out = ceil_or_floor((size + 2*pad - dilation*(kernel-1) - 1) / stride) + 1``; in ceil mode a last
  window that starts in the right padding is dropped. Padding never wins a maximum nor adds to a sum.
- Indices (``*_with_indices``): the flat index, within each (N, C) plane, of the window's first maximum in row-major
  scan order; a window whose elements all equal the dtype's minimum points at its first element inside the input.
- Averages: the window sum (wrapping on overflow, as eager's int64 sum does) divided with C++ truncation toward zero
  by ``divisor_override``, else by the window's size clipped to the padded input (``count_include_pad``) or to the
  input itself.

Float inputs keep torchlib's and :mod:`fx2onnx.lowerings.core`'s lowerings: these take integer types only.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import onnx_ir as ir
from onnxscript import DOUBLE, INT8, INT16, INT32, INT64, UINT8
from onnxscript import opset18 as op

from fx2onnx.lowerings.rules import lowering

# The integer dtypes eager's CPU max pooling takes (avg pooling takes int64 only).
TInt = TypeVar("TInt", INT8, INT16, INT32, INT64, UINT8)

# Computed in int32, which holds all their values: ONNX Runtime has no int16 Max, Where or Pad (legalization would
# wrap each node in Casts), and one code path serves all three.
_NARROW = (ir.DataType.INT8, ir.DataType.INT16, ir.DataType.UINT8)
_LOWEST = {ir.DataType.INT32: np.iinfo(np.int32).min, ir.DataType.INT64: np.iinfo(np.int64).min}


def _per_dim(value: Sequence[int] | int, count: int) -> list[int]:
    values = [value] if isinstance(value, int) else list(value)
    return values * count if len(values) == 1 else values


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
def _max_pool(self: TInt, dims: list[_Dim], with_indices: bool) -> tuple[TInt, INT64 | None]:
    """The maximum of each window and (optionally) the flat index of its first maximum.

    The padding holds the compute dtype's minimum, so it is never strictly greater than the running maximum: the
    running index starts at each window's first position inside the input and moves only on a strictly greater
    element, which is eager's first maximum in scan order.
    """
    x = op.Cast(self, to=INT32.dtype) if self.dtype in _NARROW else self
    padded = _pad(x, dims, int(_LOWEST[x.dtype]))
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
    index = _spread([first * step for first, step in zip(first_inside, plane_strides)], op.Add)
    for offset in offsets[1:]:
        candidate = _at_offset(padded, dims, offset)
        shift = sum(j * dim.dilation * step for j, dim, step in zip(offset, dims, plane_strides))
        greater = op.Greater(candidate, best)
        best = op.Where(greater, candidate, best)
        index = op.Where(greater, op.Add(window_starts, _int64(shift)), index)
    return _narrowed(best, self), op.Expand(index, op.Shape(best))


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
    dims = _dims(self, spatial, name, kernel_size, stride, padding, dilation, ceil_mode)
    return _max_pool(self, dims, with_indices=False)[0]


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


def _avg_pool(
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
    return _avg_pool(self, 1, "avg_pool1d", kernel_size, stride, padding, ceil_mode, count_include_pad, None)


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
    return _avg_pool(
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
    return _avg_pool(
        self, 3, "avg_pool3d", kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )
