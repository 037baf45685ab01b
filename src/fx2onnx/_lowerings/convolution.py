"""Convolutions and patch extraction (im2col)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TypeVar

import onnx_ir as ir
from onnxscript import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8
from onnxscript import opset18 as op

from fx2onnx._lowerings.builders import TReal, _spatial_sizes
from fx2onnx._lowerings.rules import lowering

# --- convolution, transposed included -------------------------------------------------------------------------------
# Eager allows output_padding < max(stride, dilation); ONNX Runtime's ConvTranspose only < stride. The transposed
# convolution runs with no output_padding, cropping `padding` at the start only; its end is then cropped by
# padding - output_padding or padded with zeros, and the bias is added last so that padded cells get it too.
TConv = TypeVar("TConv", BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8)


def _each(value: Sequence[int] | int, count: int) -> list[int]:
    values = [value] if isinstance(value, int) else list(value)
    return values * count if len(values) == 1 else values


# Exact convolution for float64 and integers: ONNX Runtime's Conv and ConvTranspose have float kernels only, so
# legalization would compute them in float32 (relative error ~1e-5, outside float64's tolerance). Instead: one
# strided Slice per kernel offset (im2col) and a MatMul per group, float64 for float64, integer for integers (eager's
# integer convolution wraps: int32 2 * (2**31 - 1) is -2, which float64 would compute exactly and then fail to cast
# back). A transposed convolution is the correlation of the stride-dilated input with the flipped, in/out-swapped
# kernel.
def _crop_or_pad(x: TConv, begins: Sequence[int], ends: Sequence[int], sizes: Sequence[int]) -> TConv:
    """Pad the spatial dims by (begins, ends), where negative amounts crop."""
    spatial = len(sizes)
    grow_begin, grow_end = [max(b, 0) for b in begins], [max(e, 0) for e in ends]
    if any(grow_begin) or any(grow_end):
        x = op.Pad(x, op.Constant(value_ints=[0, 0, *grow_begin, 0, 0, *grow_end]))
    if any(b < 0 for b in begins) or any(e < 0 for e in ends):
        starts = [max(-b, 0) for b in begins]
        stops = [size + max(b, 0) + min(e, 0) for size, b, e in zip(sizes, begins, ends)]
        axes = list(range(2, 2 + spatial))
        x = op.Slice(x, op.Constant(value_ints=starts), op.Constant(value_ints=stops), op.Constant(value_ints=axes))
    return x


def _correlate_exactly(
    x: TConv,
    weight: TConv,
    sizes: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    begins: Sequence[int],
    ends: Sequence[int],
    dilations: Sequence[int],
    groups: int,
    channels: tuple[int, int, int],
) -> TConv:
    """Conv of [N, Ci, *sizes] with [Co, Ci/groups, *kernel] as im2col + MatMul, in x's dtype.

    `channels` is (batch, Ci, Co), the channels static: the intermediate values' shapes are not always inferred.
    """
    spatial = len(sizes)
    batch_size, channels_in, channels_out = channels
    padded = [size + b + e for size, b, e in zip(sizes, begins, ends)]
    outputs = [(p - d * (k - 1) - 1) // s + 1 for p, d, k, s in zip(padded, dilations, kernel, strides)]
    if batch_size == 0:  # ORT's MatMul refuses to broadcast a zero-size batch
        return op.CastLike(op.ConstantOfShape(op.Constant(value_ints=[0, channels_out, *outputs])), x)
    x = _crop_or_pad(x, begins, ends, sizes)
    axes, steps = op.Constant(value_ints=list(range(2, 2 + spatial))), op.Constant(value_ints=list(strides))
    columns = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts = [o * d for o, d in zip(offset, dilations)]
        stops = [start + s * (out - 1) + 1 for start, s, out in zip(starts, strides, outputs)]
        window = op.Slice(x, op.Constant(value_ints=starts), op.Constant(value_ints=stops), axes, steps)
        columns.append(op.Unsqueeze(window, op.Constant(value_ints=[2])))
    stacked = op.Concat(*columns, axis=2)  # [N, Ci, K, *outputs]
    batch = op.Shape(x, start=0, end=1)
    kernel_size, output_size = math.prod(kernel), math.prod(outputs)
    per_group = (channels_in // groups) * kernel_size
    cols = op.Reshape(stacked, op.Concat(batch, op.Constant(value_ints=[groups, per_group, output_size]), axis=0))
    filters = op.Reshape(weight, op.Constant(value_ints=[groups, channels_out // groups, per_group]))
    product = op.MatMul(filters, cols)  # [N, groups, Co/groups, outputs]
    return op.Reshape(product, op.Concat(batch, op.Constant(value_ints=[channels_out, *outputs]), axis=0))


def _dilate(x: TConv, sizes: Sequence[int], strides: Sequence[int]) -> TConv:
    """Insert stride - 1 zeros between neighbours along each spatial dim: [.., S, ..] -> [.., (S-1)*s+1, ..]."""
    spatial = len(sizes)
    current = list(sizes)
    for axis, stride in enumerate(strides):
        if stride == 1:
            continue
        position = 2 + axis
        expanded = op.Unsqueeze(x, op.Constant(value_ints=[position + 1]))
        rank = 2 + spatial + 1
        pads = [0] * (2 * rank)
        pads[rank + position + 1] = stride - 1
        expanded = op.Pad(expanded, op.Constant(value_ints=pads))
        merged = [*current[:axis], current[axis] * stride, *current[axis + 1 :]]
        channels = op.Shape(x, start=1, end=2)
        shape = op.Concat(op.Shape(x, start=0, end=1), channels, op.Constant(value_ints=merged), axis=0)
        x = op.Slice(
            op.Reshape(expanded, shape),
            op.Constant(value_ints=[0]),
            op.Constant(value_ints=[(current[axis] - 1) * stride + 1]),
            op.Constant(value_ints=[position]),
        )
        current[axis] = (current[axis] - 1) * stride + 1
    return x


def _transposed_kernel(weight: TConv, shape: Sequence[int], groups: int) -> TConv:
    """[Ci, Co/g, *K] -> [Co, Ci/g, *K] flipped along every spatial dim: ConvTranspose as a correlation."""
    channels_in, per_group_out, *kernel = shape
    spatial = len(kernel)
    per_group_in = channels_in // groups
    grouped = op.Reshape(weight, op.Constant(value_ints=[groups, per_group_in, per_group_out, *kernel]))
    swapped = op.Transpose(grouped, perm=[0, 2, 1, *range(3, 3 + spatial)])
    merged = op.Reshape(swapped, op.Constant(value_ints=[groups * per_group_out, per_group_in, *kernel]))
    axes = list(range(2, 2 + spatial))
    return op.Slice(
        merged,
        op.Constant(value_ints=[-1] * spatial),
        op.Constant(value_ints=[-(2**62)] * spatial),
        op.Constant(value_ints=axes),
        op.Constant(value_ints=[-1] * spatial),
    )


@lowering("aten::convolution")
def convolution(
    input: TConv,
    weight: TConv,
    bias: TConv | None = None,
    stride: Sequence[int] = (1,),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    transposed: bool = False,
    output_padding: Sequence[int] = (0,),
    groups: int = 1,
) -> TConv:
    """Conv or ConvTranspose with eager's output size.

    float16/bfloat16 compute in float32 (ONNX's Conv has no bfloat16 before opset 22; eager accumulates half
    types in float32 too); float64 in float64 and integers in int32/int64 (wrapping as eager's integer arithmetic;
    int8/int16/uint8 agree modulo 2**bits when cast back) with im2col + MatMul.
    """
    spatial = len(weight.shape) - 2
    unbatched = len(input.shape) == spatial + 1
    dtype = input.dtype
    shape, weight_shape = ([1] if unbatched else []) + list(input.shape), list(weight.shape)
    static = all(isinstance(size, int) for size in [*shape[1:], *weight_shape])  # the batch may be dynamic
    if dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        compute = dtype
    elif dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        compute = ir.DataType.FLOAT
    elif static:
        compute = ir.DataType.INT64 if dtype == ir.DataType.INT64 else ir.DataType.INT32
    else:
        compute = ir.DataType.DOUBLE  # Conv, which legalization computes in a float type
    converted = compute != dtype
    if converted:
        input, weight = op.Cast(input, to=compute), op.Cast(weight, to=compute)
        bias = op.Cast(bias, to=compute) if bias is not None else None
    x = op.Unsqueeze(input, op.Constant(value_ints=[0])) if unbatched else input
    strides, pads = _each(stride, spatial), _each(padding, spatial)
    dilations, extra = _each(dilation, spatial), _each(output_padding, spatial)
    sizes, kernel = shape[2:], weight_shape[2:]
    exact = compute in (ir.DataType.DOUBLE, ir.DataType.INT32, ir.DataType.INT64) and static
    if static:
        out_channels = weight_shape[1] * groups if transposed else weight_shape[0]
        channels = (shape[0], shape[1], out_channels)
    if exact and not transposed:
        result = _correlate_exactly(x, weight, sizes, kernel, strides, pads, pads, dilations, groups, channels)
    elif exact:
        dilated = _dilate(x, sizes, strides)
        dilated_sizes = [(size - 1) * s + 1 for size, s in zip(sizes, strides)]
        reach = [d * (k - 1) for d, k in zip(dilations, kernel)]
        begins = [r - p for r, p in zip(reach, pads)]
        ends = [r - p + e for r, p, e in zip(reach, pads, extra)]
        flipped = _transposed_kernel(weight, weight_shape, groups)
        flipped_kernel = kernel
        result = _correlate_exactly(
            dilated, flipped, dilated_sizes, flipped_kernel, [1] * spatial, begins, ends, dilations, groups, channels
        )
    elif not transposed:
        result = op.Conv(x, weight, strides=strides, pads=pads + pads, dilations=dilations, group=groups)
    else:
        crop_end = [max(p - e, 0) for p, e in zip(pads, extra)]
        result = op.ConvTranspose(x, weight, strides=strides, pads=pads + crop_end, dilations=dilations, group=groups)
        grow_end = [max(e - p, 0) for p, e in zip(pads, extra)]
        if any(grow_end):
            result = op.Pad(result, op.Constant(value_ints=[0] * (spatial + 2) + [0, 0] + grow_end))
    if bias is not None:
        result = op.Add(result, op.Reshape(bias, op.Constant(value_ints=[1, -1] + [1] * spatial)))
    result = op.Squeeze(result, op.Constant(value_ints=[0])) if unbatched else result
    return op.Cast(result, to=dtype) if converted else result


@lowering("aten::conv1d", "aten::conv2d", "aten::conv3d")
def conv(
    input: TConv,
    weight: TConv,
    bias: TConv | None = None,
    stride: Sequence[int] = (1,),
    padding: Sequence[int] = (0,),
    dilation: Sequence[int] = (1,),
    groups: int = 1,
) -> TConv:
    """convNd with numeric padding, batched or not (torchlib's unbatched path fails the checker for bfloat16)."""
    return convolution(input, weight, bias, stride, padding, dilation, False, (0,), groups)


# --- im2col (nn.functional.unfold) ------------------------------------------------------------------------------------
@lowering("aten::im2col")
def im2col(
    self: TReal,
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> TReal:
    """[N, C, H, W] -> [N, C*kh*kw, L]: one strided Slice per kernel offset, stacked after the channel axis.

    The result's shape is built from the input's dims without -1, so an empty batch stays valid (torchlib's
    Reshape to [N, -1, L] is rejected when N is 0). H and W must be static.
    """
    unbatched = len(self.shape) == 3
    x = op.Unsqueeze(self, op.Constant(value_ints=[0])) if unbatched else self
    (kh, kw), (dh, dw) = _each(kernel_size, 2), _each(dilation, 2)
    (ph, pw), (sh, sw) = _each(padding, 2), _each(stride, 2)
    height, width = _spatial_sizes(self, 2, "im2col")
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if ph or pw:
        x = op.Pad(x, op.Constant(value_ints=[0, 0, ph, pw, 0, 0, ph, pw]))
    axes, steps = op.Constant(value_ints=[2, 3]), op.Constant(value_ints=[sh, sw])
    patches = []
    for i in range(kh):
        for j in range(kw):
            starts = [i * dh, j * dw]
            ends = [starts[0] + sh * (out_h - 1) + 1, starts[1] + sw * (out_w - 1) + 1]
            window = op.Slice(x, op.Constant(value_ints=starts), op.Constant(value_ints=ends), axes, steps)
            patches.append(op.Unsqueeze(window, op.Constant(value_ints=[2])))
    stacked = op.Concat(*patches, axis=2)  # [N, C, kh*kw, out_h, out_w]
    rows = op.Mul(op.Shape(x, start=1, end=2), op.Constant(value_ints=[kh * kw]))
    shape = op.Concat(op.Shape(x, start=0, end=1), rows, op.Constant(value_ints=[out_h * out_w]), axis=0)
    columns = op.Reshape(stacked, shape)
    return op.Squeeze(columns, op.Constant(value_ints=[0])) if unbatched else columns
