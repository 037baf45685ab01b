"""Spectral ops: FFTs (ONNX DFT) and STFT."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript import DOUBLE, FLOAT, INT64
from onnxscript import opset18 as op

from fx2onnx._lowerings.builders import TComponent, TReal, _complex_rank, _conj, _const, _part
from fx2onnx._lowerings.rules import lowering


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
