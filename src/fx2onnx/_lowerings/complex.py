"""Complex arithmetic on the (..., 2) real layout (fx2onnx._complex_layout): registered with complex=True."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript import BOOL, INT32, INT64
from onnxscript import opset18 as op

from fx2onnx import _complex_layout as complex_layout
from fx2onnx import _dtypes as dtypes
from fx2onnx._emit.context import LoweringContext
from fx2onnx._lowerings.builders import TComponent, TReal, _complex_rank, _conj, _const, _part, _select
from fx2onnx._lowerings.indexing import pad as _real_pad
from fx2onnx._lowerings.indexing import tensor_split_at_tensor
from fx2onnx._lowerings.rules import lowering


def _pair(real: TComponent, imag: TComponent) -> TComponent:
    last = op.Constant(value_ints=[-1])
    return op.Concat(op.Unsqueeze(real, last), op.Unsqueeze(imag, last), axis=-1)


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


def _fused(x: TComponent, y: TComponent, z: TComponent) -> TComponent:
    """x * y + z rounded once, as the fused multiply-add eager's compiled scalar division uses: exact in float64 for
    float32 parts (a product of two float32 is exact there), plain arithmetic for float64 parts. The single rounding
    decides, e.g., the sign of an underflowing result (1e-39j / (-2 + 1e-39j) has real part +0.0)."""
    if x.dtype != ir.DataType.FLOAT:
        return op.Add(op.Mul(x, y), z)
    wide = [op.Cast(v, to=ir.DataType.DOUBLE) for v in (x, y, z)]
    return op.Cast(op.Add(op.Mul(wide[0], wide[1]), wide[2]), to=ir.DataType.FLOAT)


def _smith_quotient(a: TComponent, b: TComponent, c: TComponent, d: TComponent) -> tuple[TComponent, TComponent]:
    """(a + bi) / (c + di) as eager's scalar complex division (c10::complex's operator/=, numpy's, Smith's
    algorithm), in the component dtype, step for step: the ratio of the smaller to the larger divisor part, so that
    the squares never overflow; a zero divisor gives a / |c| + (b / |d|) i (inf or NaN per part, eager's values);
    a NaN in the divisor takes the second formula (NaN). Branches are chosen with _select (zero signs kept)."""
    abs_c, abs_d = op.Abs(c), op.Abs(d)
    zero = _const(0.0, c)
    one = _const(1.0, c)
    wide = op.GreaterOrEqual(abs_c, abs_d)
    divisor_zero = op.And(op.Equal(abs_c, zero), op.Equal(abs_d, zero))
    ratio = op.Div(d, c)
    scale = op.Div(one, _fused(d, ratio, c))
    wide_real = op.Mul(_fused(b, ratio, a), scale)
    wide_imag = op.Mul(_fused(op.Neg(a), ratio, b), scale)
    tall_ratio = op.Div(c, d)
    tall_scale = op.Div(one, _fused(c, tall_ratio, d))
    tall_real = op.Mul(_fused(a, tall_ratio, b), tall_scale)
    tall_imag = op.Mul(_fused(b, tall_ratio, op.Neg(a)), tall_scale)
    real = _select(divisor_zero, op.Div(a, abs_c), _select(wide, wide_real, tall_real, c), c)
    imag = _select(divisor_zero, op.Div(b, abs_d), _select(wide, wide_imag, tall_imag, c), c)
    return real, imag


@lowering("aten::div.Tensor", "aten::div.Scalar", complex=True)
def div_complex(self: TComponent, other: TComponent) -> TComponent:
    """(a + bi) / (c + di) by eager's formula (_smith_quotient): x / 0 is inf or NaN per part, as in eager (the
    textbook ((ac + bd) + (bc - ad) i) / (c^2 + d^2) gave NaN + NaN i, and overflowed for |c| above 1.8e19)."""
    dividend, divisor = _tensors(self, other)
    a, b, c, d = _part(dividend, 0), _part(dividend, 1), _part(divisor, 0), _part(divisor, 1)
    return _pair(*_smith_quotient(a, b, c, d))


@lowering("aten::reciprocal", complex=True)
def reciprocal_complex(self: TComponent) -> TComponent:
    """1 / (c + di) as eager's: its complex division of 1 + 0i (1 / 0 is inf + NaN i)."""
    c, d = _part(self, 0), _part(self, 1)
    return _pair(*_smith_quotient(_const(1.0, c), _const(0.0, c), c, d))


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


@lowering("aten::tensor_split.tensor_indices_or_sections", complex=True, context=True)
def tensor_split_tensor_complex(
    ctx: LoweringContext, self: TComponent, tensor_indices_or_sections: INT64, dim: int = 0
) -> Sequence[TComponent]:
    outputs = len(ctx.node.meta["val"])
    return tensor_split_at_tensor(ctx, self, tensor_indices_or_sections, dim % _complex_rank(self), outputs)


@lowering("aten::sym_size.int", complex=True)
def sym_size_int_complex(self: TComponent, dim: int) -> INT64:
    """A complex tensor's size along `dim` (counted from the complex shape's end when negative)."""
    axis = dim % _complex_rank(self)
    return op.Squeeze(op.Shape(self, start=axis, end=axis + 1))


@lowering("aten::sym_storage_offset", complex=True)
def sym_storage_offset_complex(self: TComponent, dim: int = 0) -> INT64:
    """Storage offsets mean nothing in ONNX (the value only feeds as_strided's bookkeeping), as for real tensors."""
    del self, dim
    return op.Constant(value_int=0)
