"""Integer compute and quantized graphs: out_dtype, _int_mm, quantize/dequantize."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
import torch.fx
import torch.utils._pytree as pytree
from onnxscript import opset18 as op
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from fx2onnx import _dtypes as dtypes
from fx2onnx._emit.context import LoweringContext
from fx2onnx._lowerings.rules import lowering
from fx2onnx._records import BASE_OPSET
from fx2onnx._torch_ops import aten

_MATMULS = (aten.mm.default, aten.linear.default)


_CONVOLUTIONS = (aten.conv2d.default, aten.convolution.default)


_BYTE_TYPES = (ir.DataType.INT8, ir.DataType.UINT8)


_LOWERING_OPSET = BASE_OPSET


_DTYPE_RANGES = {
    ir.DataType.INT8: (-128, 127),
    ir.DataType.UINT8: (0, 255),
    ir.DataType.INT16: (-(2**15), 2**15 - 1),
    ir.DataType.UINT16: (0, 2**16 - 1),
    ir.DataType.INT32: (-(2**31), 2**31 - 1),
}


# --- what the runtime has kernels for ---------------------------------------------------------------
@functools.cache
def _runtime_kernels() -> dict[str, list[tuple[tuple[int, int], dict[str, list[str]]]]]:
    """ONNX Runtime's CPU kernels by op type: (opset range, type constraints); empty without onnxruntime."""
    try:
        from onnxruntime.capi import _pybind_state
    except ImportError:
        return {}
    table: dict[str, list[tuple[tuple[int, int], dict[str, list[str]]]]] = {}
    for kernel in _pybind_state.get_all_opkernel_def():
        if kernel.domain in ("", "ai.onnx") and kernel.provider == "CPUExecutionProvider":
            table.setdefault(kernel.op_name, []).append((tuple(kernel.version_range), dict(kernel.type_constraints)))
    return table


def has_kernel(op_type: str, **types: ir.DataType) -> bool:
    """Whether ONNX Runtime CPU runs `op_type` at opset 18 with these type-constraint bindings (``T1=UINT8``).

    Without onnxruntime installed, the ONNX specification (which allows these types) is the target.
    """
    kernels = _runtime_kernels()
    if not kernels:
        return True
    for (low, high), constraints in kernels.get(op_type, []):
        if low <= _LOWERING_OPSET <= high and all(
            f"tensor({dtype.name.lower()})" in constraints.get(name, []) for name, dtype in types.items()
        ):
            return True
    return False


# --- shared helpers ----------------------------------------------------------------------------------
def _constant_array(value: Any) -> np.ndarray | None:
    """The value of an initializer or Constant, or of a Python number; None when computed at run time."""
    if isinstance(value, ir.Value):
        return None if value.const_value is None else value.const_value.numpy()
    if isinstance(value, (int, float, bool)):
        return np.asarray(value)
    return None


def _scalar(value: Any) -> ir.Value:
    """A rank-0 view of a one-element tensor (``Tensor scale`` overloads read it with ``.item()``)."""
    return op.Reshape(value, np.array([], dtype=np.int64))


def _as_uint8(ctx: LoweringContext, value: ir.Value, transpose: bool = False) -> tuple[ir.Value, ir.Value | None]:
    """(uint8 operand, its zero point): an int8 operand shifted by 128, with zero point 128.

    (q + 128) - 128 == q, so MatMulInteger/ConvInteger compute the int8 product exactly with their uint8 x
    uint8 kernels. Constants are shifted (and transposed) at export time.
    """
    constant = _constant_array(value)
    if constant is not None:
        array = constant.T if transpose else constant
        if value.dtype == ir.DataType.INT8:
            array = (array.astype(np.int16) + 128).astype(np.uint8)
        if transpose or value.dtype == ir.DataType.INT8:
            suffix = ("_t" if transpose else "") + ("_uint8" if value.dtype == ir.DataType.INT8 else "")
            folded = ctx.initializer(array, f"{value.name}{suffix}")  # computed at export time
        else:
            folded = value
        return folded, (np.array(128, np.uint8) if value.dtype == ir.DataType.INT8 else None)
    if transpose:
        value = op.Transpose(value, perm=[1, 0])
    if value.dtype == ir.DataType.UINT8:
        return value, None
    shifted = op.Add(op.Cast(value, to=ir.DataType.INT16), np.array(128, np.int16))
    return op.Cast(shifted, to=ir.DataType.UINT8), np.array(128, np.uint8)


def integer_matmul(ctx: LoweringContext, a: ir.Value, b: ir.Value, *, transpose_b: bool = False) -> ir.Value:
    """int32 ``a @ b`` (``b.T`` when `transpose_b`) for int8/uint8 operands, exactly (wrapping as int32 does)."""
    if has_kernel("MatMulInteger", T1=ir.DataType.UINT8, T2=ir.DataType.UINT8):
        a_uint8, a_zero = _as_uint8(ctx, a)
        b_uint8, b_zero = _as_uint8(ctx, b, transpose=transpose_b)
        if b_zero is not None:
            return op.MatMulInteger(a_uint8, b_uint8, a_zero, b_zero)
        if a_zero is not None:
            return op.MatMulInteger(a_uint8, b_uint8, a_zero)
        return op.MatMulInteger(a_uint8, b_uint8)
    b = op.Transpose(b, perm=[1, 0]) if transpose_b else b
    return op.MatMul(op.Cast(a, to=ir.DataType.INT32), op.Cast(b, to=ir.DataType.INT32))


def _ints(value: Any, rank: int) -> list[int]:
    values = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
    return values * rank if len(values) == 1 else values


def integer_convolution(
    ctx: LoweringContext,
    x: ir.Value,
    weight: ir.Value,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
    rank: int,
) -> ir.Value:
    """int32 convolution of int8/uint8 operands with ``ConvInteger``, exactly; padding contributes zero."""
    x_uint8, x_zero = _as_uint8(ctx, x)
    w_uint8, w_zero = _as_uint8(ctx, weight)
    pads = _ints(padding, rank)
    inputs: list[Any] = [x_uint8, w_uint8]
    if x_zero is not None or w_zero is not None:
        inputs += [x_zero if x_zero is not None else np.array(0, np.uint8)]
    if w_zero is not None:
        inputs += [w_zero]
    return op.ConvInteger(
        *inputs,
        strides=_ints(stride, rank),
        pads=pads + pads,
        dilations=_ints(dilation, rank),
        group=int(groups),
    )


# --- out_dtype ---------------------------------------------------------------------------------------
def _example(argument: Any) -> Any:
    return argument.meta["val"] if isinstance(argument, torch.fx.Node) else argument


def _promoted_dtype(operands: Sequence[Any], out_dtype: torch.dtype) -> torch.dtype:
    """The dtype eager's out_dtype computes in: type promotion of every operand and a 1-D ``out_dtype`` tensor."""
    leaves = pytree.arg_tree_leaves(*[_example(a) for a in operands])
    leaves.append(torch.ones(1, dtype=out_dtype, device="meta"))
    return elementwise_dtypes(*leaves, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[0]


def _is_byte_tensor(value: Any) -> bool:
    return isinstance(value, ir.Value) and value.dtype in _BYTE_TYPES


def _specialised(
    ctx: LoweringContext, operator: Any, operands: list[Any], fx_operands: Sequence[Any]
) -> ir.Value | None:
    """MatMulInteger/ConvInteger for int8/uint8 operands computed in int32; None when they do not apply."""
    if len(operands) < 2 or not (_is_byte_tensor(operands[0]) and _is_byte_tensor(operands[1])):
        return None
    bias = operands[2] if len(operands) > 2 else None
    if operator in _MATMULS:
        if operands[1].shape is not None and operands[1].shape.rank() != 2:
            return None
        result = integer_matmul(ctx, operands[0], operands[1], transpose_b=operator is aten.linear.default)
    elif operator in _CONVOLUTIONS:
        if operator is aten.convolution.default:
            stride, padding, dilation, transposed, _output_padding, groups = operands[3:9]
            if transposed:
                return None
        else:
            defaults = [None, None, None, [1], [0], [1], 1]  # conv2d's schema defaults, by position
            stride, padding, dilation, groups = (list(operands) + defaults[len(operands) :])[3:7]
        rank = len(fx_operands[1].meta["val"].shape) - 2
        if not has_kernel("ConvInteger", T1=ir.DataType.UINT8, T2=ir.DataType.UINT8) or rank < 1:
            return None
        if isinstance(padding, str) or any(isinstance(v, ir.Value) for v in (stride, padding, dilation, groups)):
            return None
        result = integer_convolution(ctx, operands[0], operands[1], stride, padding, dilation, groups, rank)
        if bias is not None:  # one value per output channel: broadcast over the spatial dims
            bias = op.Reshape(bias, np.array([-1] + [1] * rank, np.int64))
    else:
        return None
    if bias is not None:
        result = op.Add(result, bias if bias.dtype == ir.DataType.INT32 else op.Cast(bias, to=ir.DataType.INT32))
    return result


def _dispatch_inner(ctx: LoweringContext, operator: Any, operands: list[Any], compute: torch.dtype) -> ir.Value:
    """Emit ``operator`` on operands cast to `compute`, dispatched through the export's registry like any node."""
    outer = ctx.node
    graph = torch.fx.Graph()
    fx_args: list[Any] = []
    bindings: dict[torch.fx.Node, ir.Value] = {}
    for index, (fx_arg, value) in enumerate(zip(outer.args[2:], operands)):
        if isinstance(fx_arg, torch.fx.Node) and isinstance(value, ir.Value):
            placeholder = graph.placeholder(f"{outer.name}_operand{index}")
            placeholder.meta["val"] = fx_arg.meta["val"].to(compute)
            target = dtypes.to_onnx(compute)
            bindings[placeholder] = value if value.dtype == target else op.Cast(value, to=target)
            fx_args.append(placeholder)
        else:
            fx_args.append(fx_arg)
    short = operator.__name__.split(".")[0]
    inner = graph.call_function(operator, tuple(fx_args), name=f"{outer.name}_{short}")
    inner.meta["val"] = operator(*[_example(a) for a in fx_args])
    for key in ("stack_trace", "nn_module_stack"):
        if key in outer.meta:
            inner.meta[key] = outer.meta[key]
    return ctx.lower_inner(inner, bindings)


@lowering("higher_order::out_dtype", context=True)
def out_dtype(
    ctx: LoweringContext,
    operator: torch._ops.OpOverload,
    dtype: int,
    operand0: Any = None,
    operand1: Any = None,
    operand2: Any = None,
    operand3: Any = None,
    operand4: Any = None,
    operand5: Any = None,
    operand6: Any = None,
    operand7: Any = None,
    operand8: Any = None,
) -> Any:
    """``out_dtype(operator, dtype, *operands)``: `operator` in the promoted dtype, then cast to `dtype`."""
    fx_operands = ctx.node.args[2:]
    operands = [operand0, operand1, operand2, operand3, operand4, operand5, operand6, operand7, operand8]
    operands = operands[: len(fx_operands)]
    target = ir.DataType(dtype)
    promoted = _promoted_dtype(fx_operands, dtypes.to_torch(target))
    if promoted == torch.int32:
        result = _specialised(ctx, operator, operands, fx_operands)
        if result is not None:
            return op.Cast(result, to=target) if target != ir.DataType.INT32 else result
    # The inner op computes in float where eager's does for these inputs (true division of integers).
    examples = [_example(a) for a in fx_operands]
    converted = pytree.tree_map_only(torch.Tensor, lambda t: t.to(promoted), examples)
    computed = operator(*converted).dtype
    compute = computed if computed.is_floating_point and not promoted.is_floating_point else promoted
    result = _dispatch_inner(ctx, operator, operands, compute)
    return op.Cast(result, to=target) if result.dtype != target else result


@lowering("aten::_int_mm", context=True)
def aten_int_mm(ctx: LoweringContext, self: Any, mat2: Any) -> Any:
    """int8 x int8 -> int32 matrix product."""
    return integer_matmul(ctx, self, mat2)


# --- quantize / dequantize -------------------------------------------------------------------------
def _is_power_of_two(value: float) -> bool:
    return value > 0 and math.isfinite(value) and math.frexp(value)[0] == 0.5


def _float32(value: ir.Value) -> ir.Value:
    return value if value.dtype == ir.DataType.FLOAT else op.Cast(value, to=ir.DataType.FLOAT)


def _scalar_input(value: Any, dtype: ir.DataType) -> ir.Value | np.ndarray:
    """A scalar argument (a Python number, or a one-element tensor eager reads with ``.item()``) as `dtype`."""
    constant = _constant_array(value)
    if constant is not None:
        return np.array(constant.reshape(-1)[0], dtype=dtype.numpy())
    return _scalar(op.Cast(value, to=dtype))


def _reciprocal_float32(scale: Any) -> ir.Value | np.ndarray:
    """eager's ``1.0 / scale``: a float64 division (Python's), rounded to float32 when it multiplies float32."""
    constant = _constant_array(scale)
    if constant is not None:
        return np.array(1.0 / float(constant.reshape(-1)[0]), dtype=np.float32)
    reciprocal = op.Div(np.array(1.0, np.float64), _scalar(op.Cast(scale, to=ir.DataType.DOUBLE)))
    return op.Cast(reciprocal, to=ir.DataType.FLOAT)


def _clip_to(value: ir.Value, quant_min: Any, quant_max: Any, dtype: ir.DataType) -> ir.Value:
    """Clip to [quant_min, quant_max] where that is narrower than the dtype's range (QuantizeLinear saturates)."""
    bounds: list[Any] = []
    for bound, limit in zip((quant_min, quant_max), _DTYPE_RANGES[dtype]):
        constant = _constant_array(bound)
        narrower = constant is None or int(constant.reshape(-1)[0]) != limit
        bounds.append(_scalar_input(bound, dtype) if narrower else None)
    if bounds == [None, None]:
        return value
    return op.Clip(value, *bounds)


def _round_shift_clamp(
    scaled: ir.Value, zero_point: ir.Value | np.ndarray, quant_min: Any, quant_max: Any, dtype: ir.DataType
) -> ir.Value:
    """eager's ``clamp(round(scaled) + zero_point, quant_min, quant_max).to(dtype)``, op for op."""
    compute = scaled.dtype
    shifted = op.Add(op.Round(scaled), zero_point)
    clamped = op.Clip(shifted, _scalar_input(quant_min, compute), _scalar_input(quant_max, compute))
    return op.Cast(clamped, to=dtype)


def _has_quantize_linear(dtype: ir.DataType) -> bool:
    return dtype in _BYTE_TYPES and has_kernel("QuantizeLinear", T1=ir.DataType.FLOAT, T2=dtype)


def _has_dequantize_linear(dtype: ir.DataType | None) -> bool:
    return dtype in _BYTE_TYPES and has_kernel("DequantizeLinear", T=dtype)


def _quantized_type(dtype: int) -> ir.DataType:
    quantized = ir.DataType(dtype)
    if quantized not in _DTYPE_RANGES:
        raise NotImplementedError(
            f"quantizing to {quantized.name} is not supported at opset {_LOWERING_OPSET} (integer dtypes only)"
        )
    return quantized


def _output_type(out_dtype: int | None) -> ir.DataType:
    return ir.DataType.FLOAT if out_dtype in (None, -1) else ir.DataType(out_dtype)


@lowering(
    "quantized_decomposed::quantize_per_tensor",
    "quantized_decomposed::quantize_per_tensor.tensor",
    "quantized_decomposed::quantize_per_tensor.tensor2",
)
def quantize_per_tensor(input: Any, scale: Any, zero_point: Any, quant_min: Any, quant_max: Any, dtype: int) -> Any:
    """``clamp(round(input * (1.0 / scale)) + zero_point, quant_min, quant_max).to(dtype)``."""
    quantized = _quantized_type(dtype)
    x = _float32(input)
    scale_constant = _constant_array(scale)
    scale_value = None if scale_constant is None else float(scale_constant.reshape(-1)[0])
    if _has_quantize_linear(quantized):
        zero = _scalar_input(zero_point, quantized)
        if scale_value is not None and _is_power_of_two(scale_value) and np.float32(scale_value) == scale_value:
            # x * 2**-k == x / 2**k exactly: QuantizeLinear with the real scale is eager's computation.
            result = op.QuantizeLinear(x, np.array(scale_value, np.float32), zero)
        else:
            result = op.QuantizeLinear(op.Mul(x, _reciprocal_float32(scale)), np.array(1.0, np.float32), zero)
        return _clip_to(result, quant_min, quant_max, quantized)
    scaled = op.Mul(x, _reciprocal_float32(scale))
    return _round_shift_clamp(scaled, _scalar_input(zero_point, ir.DataType.FLOAT), quant_min, quant_max, quantized)


@lowering(
    "quantized_decomposed::dequantize_per_tensor",
    "quantized_decomposed::dequantize_per_tensor.tensor",
    "quantized_decomposed::dequantize_per_tensor.tensor2",
)
def dequantize_per_tensor(
    input: Any,
    scale: Any,
    zero_point: Any,
    quant_min: Any,
    quant_max: Any,
    dtype: int,
    out_dtype: int | None = None,
) -> Any:
    """``(input.to(out_dtype) - zero_point) * scale`` (float32 unless `out_dtype` says otherwise)."""
    output = _output_type(out_dtype)
    scale_f32 = _scalar_input(scale, ir.DataType.FLOAT)
    reduced = output in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    if _has_dequantize_linear(input.dtype) and (output == ir.DataType.FLOAT or reduced):
        # (q - zp) is exact in float32 and the product one float32 rounding, as in eager; eager computes
        # float16/bfloat16 products in float32 too (opmath) and rounds once more.
        result = op.DequantizeLinear(input, scale_f32, _scalar_input(zero_point, input.dtype))
        return result if output == ir.DataType.FLOAT else op.Cast(result, to=output)
    converted = op.Cast(input, to=output)
    if reduced:  # eager's opmath: each step in float32, rounded back to the reduced type
        difference = op.Cast(op.Sub(_float32(converted), _scalar_input(zero_point, ir.DataType.FLOAT)), to=output)
        return op.Cast(op.Mul(_float32(difference), scale_f32), to=output)
    difference = op.Sub(converted, _scalar_input(zero_point, output))
    return op.Mul(difference, _scalar_input(scale, output))


def _channel_shape(rank: int, axis: int) -> np.ndarray:
    """Shape that broadcasts a per-channel vector along `axis` of a rank-`rank` tensor."""
    return np.array([-1] + [1] * (rank - axis - 1), np.int64)


def _normalised_axis(input: ir.Value, axis: int) -> tuple[int, int]:
    if input.shape is None:
        raise NotImplementedError("per-channel (de)quantization needs the input's rank")
    rank = input.shape.rank()
    return (axis + rank if axis < 0 else axis), rank


@lowering("quantized_decomposed::quantize_per_channel")
def quantize_per_channel(
    input: Any, scales: Any, zero_points: Any, axis: int, quant_min: Any, quant_max: Any, dtype: int
) -> Any:
    """``clamp(round(input * (1.0 / scales)) + zero_points, quant_min, quant_max).to(dtype)`` along `axis`.

    eager computes in the scales' type: with float64 scales that is a float64 computation, done here in float64.
    """
    quantized = _quantized_type(dtype)
    axis, rank = _normalised_axis(input, axis)
    compute = ir.DataType.DOUBLE if scales.dtype == ir.DataType.DOUBLE else ir.DataType.FLOAT
    x = _float32(input)
    x = x if compute == ir.DataType.FLOAT else op.Cast(x, to=compute)
    scale_constant = _constant_array(scales)
    if scale_constant is not None:
        reciprocal: Any = np.reciprocal(scale_constant.astype(compute.numpy()))
    else:
        reciprocal = op.Reciprocal(scales if scales.dtype == compute else op.Cast(scales, to=compute))
    scaled = op.Mul(x, op.Reshape(reciprocal, _channel_shape(rank, axis)))
    if compute == ir.DataType.FLOAT and _has_quantize_linear(quantized):
        zero_constant = _constant_array(zero_points)
        if zero_constant is not None:
            zero: Any = zero_constant.astype(quantized.numpy())
            ones: Any = np.ones(zero.shape, np.float32)
        else:
            zero = op.Cast(zero_points, to=quantized)
            ones = op.Expand(np.array(1.0, np.float32), op.Shape(zero))
        result = op.QuantizeLinear(scaled, ones, zero, axis=axis)
        return _clip_to(result, quant_min, quant_max, quantized)
    zero = op.Reshape(op.Cast(zero_points, to=compute), _channel_shape(rank, axis))
    return _round_shift_clamp(scaled, zero, quant_min, quant_max, quantized)


@lowering("quantized_decomposed::dequantize_per_channel")
def dequantize_per_channel(
    input: Any,
    scales: Any,
    zero_points: Any,
    axis: int,
    quant_min: Any,
    quant_max: Any,
    dtype: int,
    out_dtype: int | None = None,
) -> Any:
    """``((input - zero_points) * scales).to(out_dtype)`` along `axis` (float32 unless `out_dtype` says otherwise)."""
    output = _output_type(out_dtype)
    axis, rank = _normalised_axis(input, axis)
    scale_constant = _constant_array(scales)
    exact_in_float32 = scales.dtype == ir.DataType.FLOAT or (
        scale_constant is not None
        and np.array_equal(scale_constant.astype(np.float32).astype(scale_constant.dtype), scale_constant)
    )
    if exact_in_float32 and _has_dequantize_linear(input.dtype):
        # (q - zp) * s rounds once to float32 whether s is float32 or a float64 that float32 holds exactly.
        scale_f32 = scale_constant.astype(np.float32) if scale_constant is not None else _float32(scales)
        if zero_points is None:
            result = op.DequantizeLinear(input, scale_f32, axis=axis)
        else:
            result = op.DequantizeLinear(input, scale_f32, op.Cast(zero_points, to=input.dtype), axis=axis)
        return result if output == ir.DataType.FLOAT else op.Cast(result, to=output)
    # eager: the difference in int64 (exact), times the scales in their float type, then to out_dtype.
    compute = scales.dtype
    difference = op.Cast(input, to=ir.DataType.INT64)
    if zero_points is not None:
        zero = op.Reshape(op.Cast(zero_points, to=ir.DataType.INT64), _channel_shape(rank, axis))
        difference = op.Sub(difference, zero)
    product = op.Mul(op.Cast(difference, to=compute), op.Reshape(scales, _channel_shape(rank, axis)))
    return product if compute == output else op.Cast(product, to=output)
