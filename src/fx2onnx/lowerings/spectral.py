"""FFTs and complex values: conversions, conjugation, arithmetic, padding, shape ops and fills of complex tensors.

Complex tensors travel through the graph as real tensors with a trailing dim of 2 (real, imag) —
see :mod:`fx2onnx.complex_layout`. Lowerings registered with ``complex=True`` receive and return
that layout (float32 for complex64, float64 for complex128), like torchlib's complex implementations.

The FFTs (``aten::_fft_r2c``, ``_fft_c2c``, ``_fft_c2r``, and ``aten::stft`` of a complex signal) use ONNX's
``DFT`` in its opset 17 form (``dft_length`` an input, ``axis`` an attribute; the version converter
moves it to opset 20's form when a newer opset is asked for), with eager's three normalizations.
ONNX Runtime's CPU kernel is accurate enough only forward and in float64 (see the FFT section), so
these compute forward transforms in float64 and round once, rather than use torchlib's
implementations. Integer and bool inputs reach them as float32, as in eager, through the promotion
pass. float16/bfloat16 FFTs are CUDA-only in eager.

Each lowering here was found by the coverage sweep (``fx2onnx coverage``, docs/support-matrix.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import onnx_ir as ir
from onnxscript import BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8
from onnxscript import opset18 as op

from fx2onnx import complex_layout, dtypes
from fx2onnx.lowerings.core import _const
from fx2onnx.lowerings.core import pad as _real_pad
from fx2onnx.lowerings.rules import lowering

# A complex tensor's components, as the layout carries them.
TComponent = TypeVar("TComponent", FLOAT, DOUBLE)
TReal = TypeVar("TReal", BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8)


# --- helpers --------------------------------------------------------------------------------------------------------
def _part(self: TComponent, index: int) -> TComponent:
    """The real (0) or imaginary (1) part, without the trailing dim."""
    part = op.Slice(
        self,
        op.Constant(value_ints=[index]),
        op.Constant(value_ints=[index + 1]),
        op.Constant(value_ints=[-1]),
    )
    return op.Squeeze(part, op.Constant(value_ints=[-1]))


def _pair(real: TComponent, imag: TComponent) -> TComponent:
    last = op.Constant(value_ints=[-1])
    return op.Concat(op.Unsqueeze(real, last), op.Unsqueeze(imag, last), axis=-1)


def _complex_rank(self: TComponent) -> int:
    return len(self.shape) - 1


def _conj(self: TComponent) -> TComponent:
    """Negate the imaginary part (a multiply by (1, -1) keeps NaN and inf as eager does)."""
    return op.Mul(self, op.CastLike(op.Constant(value_floats=[1.0, -1.0]), self))


# --- FFTs -----------------------------------------------------------------------------------------------------------
# ONNX Runtime's DFT is exact enough only in float64 and forward: in float32 its error for lengths other than powers
# of two grows with the length (1e-3 relative at 4099, 100x eager's at 12), and its inverse in float64 is accurate
# only to 1e-8 there. So float32 transforms compute in float64 and round once at the end (as close to the exact
# result as eager, or closer), and an inverse transform is conj(DFT(conj(x))). Axes are given non-negative: ONNX
# Runtime's DFT computes a wrong result for a negative axis.
def _wide(x: TComponent) -> TComponent:
    return op.Cast(x, to=DOUBLE.dtype) if x.dtype != ir.DataType.DOUBLE else x


def _back(result: TComponent, like: TComponent) -> TComponent:
    return op.Cast(result, to=like.dtype) if result.dtype != like.dtype else result


def _normalized(x: TComponent, sizes: Sequence[INT64], normalization: int) -> TComponent:
    """Eager's normalization modes: 0 none, 1 by 1/sqrt(n), 2 by 1/n, n the product of the signal sizes."""
    if normalization == 0:
        return x
    count = op.CastLike(op.ReduceProd(op.Concat(*sizes, axis=0), keepdims=0), x)
    return op.Div(x, op.Sqrt(count) if normalization == 1 else count)


def _size(x: TComponent, axis: int) -> INT64:
    return op.Shape(x, start=axis, end=axis + 1)


def _dft(x: TComponent, axis: int, onesided: bool = False, length: INT64 | None = None) -> TComponent:
    return op.DFT(x, length, axis=axis, inverse=False, onesided=onesided)


@lowering("aten::_fft_r2c")
def fft_r2c(self: TComponent, dim: Sequence[int], normalization: int, onesided: bool) -> TComponent:
    """Real to complex: one-sided (when asked) along the last of `dim`, two-sided along the others."""
    rank = len(self.shape)
    axes = [d % rank for d in dim]
    sizes = [_size(self, a) for a in axes]
    x = op.Unsqueeze(_wide(self), op.Constant(value_ints=[-1]))  # a real signal: (..., 1)
    x = _dft(x, axes[-1], onesided=onesided)
    for axis in axes[:-1]:
        x = _dft(x, axis)
    return _back(_normalized(x, sizes, normalization), self)


@lowering("aten::_fft_c2c", complex=True)
def fft_c2c(self: TComponent, dim: Sequence[int], normalization: int, forward: bool) -> TComponent:
    rank = _complex_rank(self)
    axes = [d % rank for d in dim]
    sizes = [_size(self, a) for a in axes]
    x = _wide(self) if forward else _conj(_wide(self))
    for axis in axes:
        x = _dft(x, axis)
    return _back(_normalized(x if forward else _conj(x), sizes, normalization), self)


@lowering("aten::_fft_c2r", complex=True)
def fft_c2r(self: TComponent, dim: Sequence[int], normalization: int, last_dim_size: int) -> TComponent:
    """Complex to real: inverse along dim[:-1], then the Hermitian inverse of length `last_dim_size` along dim[-1].

    With X the one-sided spectrum, x[k] = Re(sum_m w[m] X[m] e^(2 pi i m k / n)) where w is 1 for the zero
    and Nyquist terms and 2 for the others (which stand for their conjugate twins); that is the real part of
    the forward DFT of conj(w X), zero-padded to n. The imaginary parts of the zero and Nyquist terms drop
    out, as in eager.
    """
    if not isinstance(last_dim_size, int):
        raise NotImplementedError("_fft_c2r needs a static output length")
    rank = _complex_rank(self)
    axes = [d % rank for d in dim]
    x = _wide(self)
    if axes[:-1]:
        x = _conj(x)
        for axis in axes[:-1]:
            x = _dft(x, axis)
        x = _conj(x)
    last = axes[-1]
    half = last_dim_size // 2 + 1
    x = op.Slice(x, op.Constant(value_ints=[0]), op.Constant(value_ints=[half]), op.Constant(value_ints=[last]))
    terms = op.Range(op.Constant(value_int=0), op.Squeeze(_size(x, last)), op.Constant(value_int=1))
    single = op.Or(op.Equal(terms, op.Constant(value_int=0)), op.Equal(op.Mul(terms, 2), last_dim_size))
    weights = op.Where(single, op.CastLike(1, x), op.CastLike(2, x))
    weights = op.Reshape(weights, op.Constant(value_ints=[-1] + [1] * (rank - last)))
    length = op.Constant(value_ints=[last_dim_size])
    spectrum = _dft(_conj(op.Mul(x, weights)), last, length=op.Squeeze(length))
    sizes = [_size(self, a) for a in axes[:-1]] + [length]
    return _back(_normalized(_part(spectrum, 0), sizes, normalization), self)


def _stft(
    signal: TComponent,
    like: TComponent,
    rank: int,
    length: int,
    n_fft: int,
    hop_length: int | None,
    win_length: int | None,
    window: TComponent | None,
    normalized: bool,
    onesided: bool,
) -> TComponent:
    """STFT of a signal in the layout (..., length, 1 or 2) of `rank` dims before the pair: (..., freqs, frames, 2).

    Frames are gathered with a constant index table (the signal's length must be static), multiplied by the
    (real) window, zero-padded around it to n_fft as in eager, and transformed with one DFT.
    """
    if window is not None and len(window.shape) != 1:
        raise NotImplementedError("a complex window is not supported")
    if not isinstance(length, int):
        raise NotImplementedError("this STFT needs a static signal length")
    hop = hop_length if hop_length is not None else n_fft // 4
    frames = 1 + (length - n_fft) // hop
    starts = [[hop * f + k for k in range(n_fft)] for f in range(frames)]
    x = op.Gather(_wide(signal), op.Constant(value=ir.tensor(np.array(starts, dtype=np.int64))), axis=rank - 1)
    size = win_length if win_length is not None else n_fft
    left = (n_fft - size) // 2
    if window is not None:
        window = op.Pad(window, op.Constant(value_ints=[left, n_fft - size - left]))
        x = op.Mul(x, op.Unsqueeze(op.CastLike(window, x), op.Constant(value_ints=[-1])))
    elif size < n_fft:
        ones = np.zeros((n_fft, 1), dtype=np.float64)
        ones[left : left + size] = 1.0
        x = op.Mul(x, op.Constant(value=ir.tensor(ones)))
    spectrum = _dft(x, rank, onesided=onesided)  # (..., frames, frequencies, 2)
    if normalized:
        spectrum = op.Div(spectrum, _const(math.sqrt(n_fft), spectrum))
    order = [*range(rank - 1), rank, rank - 1, rank + 1]
    return _back(op.Transpose(spectrum, perm=order), like)


@lowering("aten::stft")
def stft(
    self: TComponent,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: TComponent | None = None,
    normalized: bool = False,
    onesided: bool | None = None,
    return_complex: bool | None = None,
    align_to_window: bool | None = None,
) -> TComponent:
    """STFT of a real signal: one-sided unless asked; complex, or its (..., 2) real view (the same layout)."""
    del return_complex
    if align_to_window:
        raise NotImplementedError("align_to_window is not supported")
    signal = op.Unsqueeze(self, op.Constant(value_ints=[-1]))
    one_sided = True if onesided is None else onesided
    rank = len(self.shape)
    return _stft(signal, self, rank, self.shape[-1], n_fft, hop_length, win_length, window, normalized, one_sided)


@lowering("aten::stft", complex=True)
def stft_complex(
    self: TComponent,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: TComponent | None = None,
    normalized: bool = False,
    onesided: bool | None = None,
    return_complex: bool | None = None,
    align_to_window: bool | None = None,
) -> TComponent:
    """STFT of a complex signal (1-D or batched): two-sided, complex or its (..., 2) real view (the same layout)."""
    del return_complex
    if onesided or align_to_window:
        raise NotImplementedError("a complex signal's STFT is two-sided; align_to_window is not supported")
    rank = _complex_rank(self)
    return _stft(self, self, rank, self.shape[rank - 1], n_fft, hop_length, win_length, window, normalized, False)


# --- conversions ----------------------------------------------------------------------------------------------------
def _convert(self: TComponent, dtype: int | None) -> TReal:
    """A complex tensor to `dtype`: complex -> complex casts both parts; to a real type keeps the real part
    (eager warns and discards the imaginary part), except bool, which is true where either part is nonzero."""
    if dtype is None:
        return op.Identity(self)
    target = ir.DataType(dtype)
    if dtypes.is_complex(target):
        component = complex_layout.real_component(target)
        return op.Cast(self, to=component) if component != self.dtype else op.Identity(self)
    if target == ir.DataType.BOOL:
        nonzero = op.Cast(op.Not(op.Equal(self, op.CastLike(0, self))), to=INT32.dtype)
        return op.Cast(op.ReduceMax(nonzero, op.Constant(value_ints=[-1]), keepdims=0), to=target)
    return op.Cast(_part(self, 0), to=target)


@lowering("prims::convert_element_type", complex=True)
def convert_element_type_complex(a: TComponent, dtype: int) -> TReal:
    return _convert(a, dtype)


@lowering("aten::_to_copy", complex=True)
def to_copy_complex(
    self: TComponent,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
    non_blocking: bool = False,
    memory_format: str | None = None,
) -> TReal:
    del layout, device, pin_memory, non_blocking, memory_format
    return _convert(self, dtype)


@lowering("aten::to.dtype", complex=True)
def to_dtype_complex(
    self: TComponent, dtype: int, non_blocking: bool = False, copy: bool = False, memory_format: str | None = None
) -> TReal:
    del non_blocking, copy, memory_format
    return _convert(self, dtype)


# --- conjugation ----------------------------------------------------------------------------------------------------
@lowering("aten::_conj_physical", "aten::conj_physical", complex=True)
def conj_physical_complex(self: TComponent) -> TComponent:
    return _conj(self)


@lowering("aten::resolve_conj", "aten::resolve_neg", complex=True)
def resolve_complex(self: TComponent) -> TComponent:
    """Conjugate and negative views are values in an exported graph: nothing left to resolve."""
    return op.Identity(self)


# --- padding and reshaping ------------------------------------------------------------------------------------------
def _pad_parts(self: TComponent, pad: Sequence[int], mode: str, value: complex | float | None) -> TComponent:
    """Pad a complex tensor: each part with its own part of `value` in constant mode, else both at once.

    `pad` lists (before, after) pairs from the last complex dim backwards; the layout's trailing dim
    comes first in that order, so it gets (0, 0).
    """
    padding = [0, 0, *pad]
    if mode != "constant":
        return _real_pad.func(self, padding, mode, None)
    fill = complex(value if value is not None else 0)
    if fill == 0:
        return _real_pad.func(self, padding, mode, 0.0)
    parts = op.Split(self, num_outputs=2, axis=-1)
    real = _real_pad.func(parts[0], padding, mode, fill.real)
    imag = _real_pad.func(parts[1], padding, mode, fill.imag)
    return op.Concat(real, imag, axis=-1)


@lowering("aten::constant_pad_nd", complex=True)
def constant_pad_nd_complex(self: TComponent, pad: Sequence[int], value: complex | float = 0.0) -> TComponent:
    return _pad_parts(self, pad, "constant", value)


@lowering("aten::pad", complex=True)
def pad_complex(
    self: TComponent, pad: Sequence[int], mode: str = "constant", value: complex | float | None = None
) -> TComponent:
    return _pad_parts(self, pad, mode, value)


@lowering("aten::unsqueeze", complex=True)
def unsqueeze_complex(self: TComponent, dim: int) -> TComponent:
    """A negative `dim` counts from the complex tensor's end, which is one before the layout's."""
    axis = dim if dim >= 0 else dim + _complex_rank(self) + 1
    return op.Unsqueeze(self, op.Constant(value_ints=[axis]))


# --- arithmetic with complex values ----------------------------------------------------------------------------------
# torchlib's complex add/mul/... take two tensors in the layout; a Python number (``spectrum * 2``, which the graph
# keeps as a number) reached them as an int64 constant. Here a number becomes a (real, imag) pair in the layout.
Number = complex | float | int | bool


def _operand(value: TComponent | Number, like: TComponent) -> TComponent:
    if isinstance(value, (bool, int, float, complex)):
        number = complex(value)
        pair = np.array([number.real, number.imag], dtype=ir.DataType(like.dtype).numpy())
        return op.Constant(value=ir.tensor(pair))
    return op.CastLike(value, like) if value.dtype != like.dtype else value


def _tensors(a: TComponent | Number, b: TComponent | Number) -> tuple[TComponent, TComponent]:
    """Both operands in the layout (one of them may be a Python number; `b` when `a` is not)."""
    like = b if isinstance(a, (bool, int, float, complex)) else a
    return _operand(a, like), _operand(b, like)


def _multiply(a: TComponent, b: TComponent) -> TComponent:
    a_real, a_imag, b_real, b_imag = _part(a, 0), _part(a, 1), _part(b, 0), _part(b, 1)
    real = op.Sub(op.Mul(a_real, b_real), op.Mul(a_imag, b_imag))
    return _pair(real, op.Add(op.Mul(a_real, b_imag), op.Mul(a_imag, b_real)))


def _scaled(other: TComponent, alpha: Number) -> TComponent:
    return other if alpha == 1 else _multiply(other, _operand(alpha, other))


@lowering("aten::add.Tensor", "aten::add.Scalar", complex=True)
def add_complex(self: TComponent, other: TComponent, alpha: float = 1) -> TComponent:
    first, second = _tensors(self, other)
    return op.Add(first, _scaled(second, alpha))


@lowering("aten::sub.Tensor", "aten::sub.Scalar", complex=True)
def sub_complex(self: TComponent, other: TComponent, alpha: float = 1) -> TComponent:
    first, second = _tensors(self, other)
    return op.Sub(first, _scaled(second, alpha))


@lowering("aten::mul.Tensor", "aten::mul.Scalar", complex=True)
def mul_complex(self: TComponent, other: TComponent) -> TComponent:
    return _multiply(*_tensors(self, other))


@lowering("aten::div.Tensor", "aten::div.Scalar", complex=True)
def div_complex(self: TComponent, other: TComponent) -> TComponent:
    """(a + bi) / (c + di) = ((ac + bd) + (bc - ad) i) / (c^2 + d^2)."""
    dividend, divisor = _tensors(self, other)
    c_real, c_imag = _part(divisor, 0), _part(divisor, 1)
    scale = op.Add(op.Mul(c_real, c_real), op.Mul(c_imag, c_imag))
    numerator = _multiply(dividend, _conj(divisor))
    return op.Div(numerator, op.Unsqueeze(scale, op.Constant(value_ints=[-1])))


# --- shape ops and fills on complex values ---------------------------------------------------------------------
# Layout-agnostic ops whose dims count from the complex tensor's end, or whose fill value is a (complex) number.
@lowering("aten::expand", complex=True)
def expand_complex(self: TComponent, size: Sequence[int], implicit: bool = False) -> TComponent:
    """Broadcast to `size`, the pair dim kept (-1 keeps a dim, as 1 does under Expand's broadcasting)."""
    del implicit
    if not all(isinstance(s, int) for s in size):
        raise NotImplementedError("expanding a complex tensor to a symbolic size is not supported")
    return op.Expand(self, op.Constant(value_ints=[1 if s == -1 else s for s in size] + [2]))


@lowering("aten::where.self", "aten::where.ScalarOther", "aten::where.ScalarSelf", complex=True)
def where_complex(condition: BOOL, self: TComponent, other: TComponent) -> TComponent:
    chosen, otherwise = _tensors(self, other)
    return op.Where(op.Unsqueeze(condition, op.Constant(value_ints=[-1])), chosen, otherwise)


@lowering("aten::masked_fill.Scalar", complex=True)
def masked_fill_complex(self: TComponent, mask: BOOL, value: complex | float) -> TComponent:
    return op.Where(op.Unsqueeze(mask, op.Constant(value_ints=[-1])), _operand(value, self), self)


def _filled_like(self: TComponent, value: complex | float, dtype: int | None) -> TReal:
    """A tensor shaped like `self` (complex), filled with `value`, of `dtype` (eager's: self's when None)."""
    target = ir.DataType(dtype) if dtype is not None else None
    if target is None or dtypes.is_complex(target):
        component = complex_layout.real_component(target) if target is not None else self.dtype
        number = complex(value)
        pair = np.array([number.real, number.imag], dtype=ir.DataType(component).numpy())
        return op.Expand(op.Constant(value=ir.tensor(pair)), op.Shape(self))
    fill = np.array(complex(value).real, dtype=target.numpy())
    return op.Expand(op.Constant(value=ir.tensor(fill)), op.Shape(self, end=-1))


@lowering("aten::zeros_like", complex=True)
def zeros_like_complex(
    self: TComponent,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
    memory_format: str | None = None,
) -> TReal:
    del layout, device, pin_memory, memory_format
    return _filled_like(self, 0, dtype)


@lowering("aten::ones_like", complex=True)
def ones_like_complex(
    self: TComponent,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
    memory_format: str | None = None,
) -> TReal:
    del layout, device, pin_memory, memory_format
    return _filled_like(self, 1, dtype)


@lowering("aten::full_like", complex=True)
def full_like_complex(
    self: TComponent,
    fill_value: complex | float,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
    memory_format: str | None = None,
) -> TReal:
    del layout, device, pin_memory, memory_format
    return _filled_like(self, fill_value, dtype)


def _squeezed(self: TComponent, dims: Sequence[int]) -> TComponent:
    """Eager squeezes only the listed dims of size 1; the shape must be static to know which."""
    rank = _complex_rank(self)
    axes = sorted({d % rank for d in dims} if rank else set())
    if any(not isinstance(self.shape[a], int) for a in axes):
        raise NotImplementedError("squeezing a complex tensor along a symbolic dim is not supported")
    axes = [a for a in axes if self.shape[a] == 1]
    return op.Squeeze(self, op.Constant(value_ints=axes)) if axes else op.Identity(self)


@lowering("aten::squeeze", complex=True)
def squeeze_complex(self: TComponent) -> TComponent:
    return _squeezed(self, range(_complex_rank(self)))


@lowering("aten::squeeze.dims", complex=True)
def squeeze_dims_complex(self: TComponent, dim: Sequence[int]) -> TComponent:
    return _squeezed(self, dim)


@lowering("aten::split_with_sizes", complex=True)
def split_with_sizes_complex(self: TComponent, split_sizes: Sequence[int], dim: int = 0) -> Sequence[TComponent]:
    axis = dim % _complex_rank(self)
    parts, start = [], 0
    for size in split_sizes:
        bounds = op.Constant(value_ints=[start]), op.Constant(value_ints=[start + size])
        parts.append(op.Slice(self, *bounds, op.Constant(value_ints=[axis])))
        start += size
    return parts


# --- angle of real numbers ------------------------------------------------------------------------------------------
@lowering("aten::angle")
def angle(self: TReal) -> TReal:
    """pi where negative, else 0, NaN kept; integers and bool give float32 (torchlib's would compute in float16)."""
    x = self if self.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE) else op.Cast(self, to=FLOAT.dtype)
    zero = _const(0.0, x)
    result = op.Where(op.Less(x, zero), _const(math.pi, x), zero)
    result = op.Where(op.IsNaN(x), x, result)
    if self.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        result = op.Cast(result, to=self.dtype)
    return result
