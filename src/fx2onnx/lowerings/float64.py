"""float64 lowerings for ops whose torchlib implementation rounds a scalar through float32.

ONNX attributes of type FLOAT are float32: LeakyRelu's alpha, Gemm's alpha and beta, LayerNormalization's
epsilon... torchlib passes an op's Python numbers there, its script functions (``aten_hardtanh``, ``aten_addcmul``,
``aten_softplus``...) turn every ``float`` parameter into such an attribute, and a few of its functions compute a
constant in float32 (``Log(10.0)``, pi). Eager computes with the exact double, so a float64 graph would be off by
about 1e-8 relative. These lowerings compute the same thing from ops that take each number as a float64
constant, following eager's CPU kernels' formulas. They take float64 only: other dtypes still dispatch to torchlib
(float32 attributes hold float32 numbers exactly). Several of the ONNX ops avoided here (LeakyRelu, HardSigmoid,
HardSwish, Softplus, InstanceNormalization) have no float64 kernel in ONNX Runtime either, so legalization would
have run them in float32. elu, celu and selu, which need an accurate expm1 in every dtype, are lowered for all
float dtypes in :mod:`fx2onnx.lowerings.accuracy`, which keeps float64's numbers exact too.

Python numbers that reach torchlib as ONNX inputs (``CastLike(0.3, x)``) are kept exact by the recorder
(:mod:`fx2onnx.emit.recorder`), and by type promotion (:mod:`fx2onnx.passes.promotion`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar, Union

import onnx_ir as ir
from onnxscript import DOUBLE, FLOAT, INT16, INT32, INT64
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.ops.core import aten_arange_start_step
from onnxscript.function_libs.torch_lib.tensor_typing import TTensor

from fx2onnx.lowerings.accuracy import log1p
from fx2onnx.lowerings.rules import lowering

_FLOAT_RESULTS = (ir.DataType.DOUBLE, ir.DataType.FLOAT)


def _double(value: float) -> DOUBLE:
    return op.Constant(value=ir.tensor(float(value), dtype=ir.DataType.DOUBLE))


# --- activations ----------------------------------------------------------------------------------------------
@lowering("aten::leaky_relu")
def leaky_relu(self: DOUBLE, negative_slope: float = 0.01) -> DOUBLE:
    """x > 0 ? x : x * negative_slope."""
    return op.Where(op.Greater(self, _double(0.0)), self, op.Mul(self, _double(negative_slope)))


@lowering("aten::hardtanh")
def hardtanh(self: DOUBLE, min_val: float = -1.0, max_val: float = 1.0) -> DOUBLE:
    return op.Clip(self, _double(min_val), _double(max_val))


@lowering("aten::hardsigmoid")
def hardsigmoid(self: DOUBLE) -> DOUBLE:
    """min(max(x + 3, 0), 6) / 6."""
    return op.Div(op.Clip(op.Add(self, _double(3.0)), _double(0.0), _double(6.0)), _double(6.0))


@lowering("aten::hardswish")
def hardswish(self: DOUBLE) -> DOUBLE:
    """x * min(max(x + 3, 0), 6) / 6."""
    clipped = op.Clip(op.Add(self, _double(3.0)), _double(0.0), _double(6.0))
    return op.Div(op.Mul(self, clipped), _double(6.0))


@lowering("aten::softplus")
def softplus(self: DOUBLE, beta: float = 1.0, threshold: float = 20.0) -> DOUBLE:
    """x * beta > threshold ? x : log1p(exp(x * beta)) / beta."""
    scaled = op.Mul(self, _double(beta))
    smooth = op.Div(log1p(op.Exp(scaled)), _double(beta))
    return op.Where(op.Greater(scaled, _double(threshold)), self, smooth)


# --- pointwise math -------------------------------------------------------------------------------------------
@lowering("aten::addcmul")
def addcmul(self: DOUBLE, tensor1: DOUBLE, tensor2: DOUBLE, value: float = 1.0) -> DOUBLE:
    """self + value * tensor1 * tensor2, in eager's order."""
    return op.Add(self, op.Mul(op.Mul(_double(value), tensor1), tensor2))


@lowering("aten::addcdiv")
def addcdiv(self: DOUBLE, tensor1: DOUBLE, tensor2: DOUBLE, value: float = 1.0) -> DOUBLE:
    """self + value * tensor1 / tensor2, in eager's order."""
    return op.Add(self, op.Div(op.Mul(_double(value), tensor1), tensor2))


@lowering("aten::log10")
def log10(self: DOUBLE) -> DOUBLE:
    return op.Div(op.Log(self), _double(math.log(10.0)))


@lowering("aten::log2")
def log2(self: DOUBLE) -> DOUBLE:
    return op.Div(op.Log(self), _double(math.log(2.0)))


@lowering("aten::sinc", "aten::special_sinc")
def sinc(self: DOUBLE) -> DOUBLE:
    """x == 0 ? 1 : sin(pi * x) / (pi * x)."""
    product = op.Mul(self, _double(math.pi))
    return op.Where(op.Equal(self, _double(0.0)), _double(1.0), op.Div(op.Sin(product), product))


# --- matrix products with scaled terms: Gemm's alpha/beta and torchlib's script functions are float32 -----------
def _scaled_sum(self: DOUBLE, product: DOUBLE, beta: float, alpha: float) -> DOUBLE:
    """beta * self + alpha * product; beta == 0 ignores `self` (its NaNs too) but keeps the broadcast shape."""
    if alpha != 1:
        product = op.Mul(product, _double(alpha))
    if beta == 0:
        return op.Expand(product, op.Shape(op.Add(self, product)))
    return op.Add(self if beta == 1 else op.Mul(self, _double(beta)), product)


@lowering("aten::addmm")
def addmm(self: DOUBLE, mat1: DOUBLE, mat2: DOUBLE, beta: float = 1.0, alpha: float = 1.0) -> DOUBLE:
    return _scaled_sum(self, op.MatMul(mat1, mat2), beta, alpha)


@lowering("aten::addmv")
def addmv(self: DOUBLE, mat: DOUBLE, vec: DOUBLE, beta: float = 1.0, alpha: float = 1.0) -> DOUBLE:
    return _scaled_sum(self, op.MatMul(mat, vec), beta, alpha)


@lowering("aten::addbmm")
def addbmm(self: DOUBLE, batch1: DOUBLE, batch2: DOUBLE, beta: float = 1.0, alpha: float = 1.0) -> DOUBLE:
    products = op.MatMul(batch1, batch2)
    return _scaled_sum(self, op.ReduceSum(products, op.Constant(value_ints=[0]), keepdims=False), beta, alpha)


# --- normalization: LayerNormalization's and InstanceNormalization's epsilon is float32 -------------------------
def _normalize(x: DOUBLE, axes: Sequence[int], eps: float) -> tuple[DOUBLE, DOUBLE, DOUBLE]:
    """(x - mean) * rstd over `axes`, with the mean and rstd (keepdims), rstd = 1 / sqrt(biased var + eps)."""
    axes_value = op.Constant(value_ints=list(axes))
    mean = op.ReduceMean(x, axes_value, keepdims=True)
    centered = op.Sub(x, mean)
    variance = op.ReduceMean(op.Mul(centered, centered), axes_value, keepdims=True)
    rstd = op.Reciprocal(op.Sqrt(op.Add(variance, _double(eps))))
    return op.Mul(centered, rstd), mean, rstd


def _layer_norm(
    input: DOUBLE, normalized_shape: Sequence[int], weight: DOUBLE | None, bias: DOUBLE | None, eps: float
) -> tuple[DOUBLE, DOUBLE, DOUBLE]:
    rank = len(input.shape)
    normalized, mean, rstd = _normalize(input, range(rank - len(normalized_shape), rank), eps)
    if weight is not None:
        normalized = op.Mul(normalized, weight)
    if bias is not None:
        normalized = op.Add(normalized, bias)
    return normalized, mean, rstd


@lowering("aten::layer_norm")
def layer_norm(
    input: DOUBLE,
    normalized_shape: Sequence[int],
    weight: DOUBLE | None = None,
    bias: DOUBLE | None = None,
    eps: float = 1e-5,
    cudnn_enable: bool = True,
) -> DOUBLE:
    del cudnn_enable
    return _layer_norm(input, normalized_shape, weight, bias, eps)[0]


@lowering("aten::native_layer_norm")
def native_layer_norm(
    input: DOUBLE,
    normalized_shape: Sequence[int],
    weight: DOUBLE | None = None,
    bias: DOUBLE | None = None,
    eps: float = 1e-5,
) -> tuple[DOUBLE, DOUBLE, DOUBLE]:
    """(output, mean, rstd); the statistics keep the normalized dims as 1s, as eager's."""
    return _layer_norm(input, normalized_shape, weight, bias, eps)


def _group_norm(
    input: DOUBLE, groups: int, weight: DOUBLE | None, bias: DOUBLE | None, eps: float
) -> tuple[DOUBLE, DOUBLE, DOUBLE]:
    """Normalize (N, groups, rest) rows, then scale and shift per channel (axis 1); mean and rstd are (N, groups)."""
    rank = len(input.shape)
    grouped = op.Reshape(input, op.Constant(value_ints=[0, groups, -1]))
    normalized, mean, rstd = _normalize(grouped, [2], eps)
    normalized = op.Reshape(normalized, op.Shape(input))
    channels = op.Constant(value_ints=[-1] + [1] * (rank - 2))  # (C,) -> broadcast over (N, C, *)
    if weight is not None:
        normalized = op.Mul(normalized, op.Reshape(weight, channels))
    if bias is not None:
        normalized = op.Add(normalized, op.Reshape(bias, channels))
    last = op.Constant(value_ints=[2])
    return normalized, op.Squeeze(mean, last), op.Squeeze(rstd, last)


@lowering("aten::group_norm")
def group_norm(
    input: DOUBLE,
    num_groups: int,
    weight: DOUBLE | None = None,
    bias: DOUBLE | None = None,
    eps: float = 1e-5,
    cudnn_enabled: bool = True,
) -> DOUBLE:
    del cudnn_enabled
    return _group_norm(input, num_groups, weight, bias, eps)[0]


@lowering("aten::native_group_norm")
def native_group_norm(
    input: DOUBLE,
    weight: DOUBLE | None = None,
    bias: DOUBLE | None = None,
    N: INT64 | None = None,
    C: INT64 | None = None,
    HxW: INT64 | None = None,
    group: int = 1,
    eps: float = 1e-5,
) -> tuple[DOUBLE, DOUBLE, DOUBLE]:
    del N, C, HxW  # the input's shape says as much
    return _group_norm(input, group, weight, bias, eps)


@lowering("aten::instance_norm")
def instance_norm(
    input: DOUBLE,
    weight: DOUBLE | None = None,
    bias: DOUBLE | None = None,
    running_mean: DOUBLE | None = None,
    running_var: DOUBLE | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
    cudnn_enabled: bool = False,
) -> DOUBLE:
    """Each (sample, channel) normalized over its own values, or by the running statistics per channel."""
    del momentum, cudnn_enabled  # an exported graph does not update running statistics
    rank = len(input.shape)
    channels = op.Constant(value_ints=[-1] + [1] * (rank - 2))
    if use_input_stats or running_mean is None or running_var is None:
        normalized = _normalize(input, range(2, rank), eps)[0]
    else:
        rstd = op.Reciprocal(op.Sqrt(op.Add(running_var, _double(eps))))
        normalized = op.Mul(op.Sub(input, op.Reshape(running_mean, channels)), op.Reshape(rstd, channels))
    if weight is not None:
        normalized = op.Mul(normalized, op.Reshape(weight, channels))
    if bias is not None:
        normalized = op.Add(normalized, op.Reshape(bias, channels))
    return normalized


# --- arange with float results ----------------------------------------------------------------------------------
# The dtypes torchlib's arange takes its (symbolic) arguments in: dispatch treats both alike.
TRangeArg = TypeVar("TRangeArg", bound=Union[DOUBLE, FLOAT, INT16, INT32, INT64])  # noqa: UP007 (onnxscript reads it)


def _as_double(value: TRangeArg | float) -> DOUBLE:
    if isinstance(value, ir.Value):
        return value if value.dtype == ir.DataType.DOUBLE else op.Cast(value, to=ir.DataType.DOUBLE)
    return _double(value)


def _is_integral(value: TRangeArg | float) -> bool:
    if isinstance(value, ir.Value):
        return not value.dtype.is_floating_point()
    return isinstance(value, int)


@lowering("aten::arange.start_step")
def arange_start_step(start: TRangeArg, end: TRangeArg, step: TRangeArg = 1, dtype: int = -1) -> TTensor:
    """Float aranges as eager computes them: length ceil((end - start) / step) and values start + i * step, both
    in double (CPU's accumulate type for float and double), then rounded once to the result's dtype.

    torchlib computes both in float32, which can give another length (arange(0.1, 0.6, 0.1) has 5 elements, not
    6) and float32 values in a float64 result. Integer results (and float16/bfloat16 ones) keep torchlib's
    implementation. Without a `dtype`, the emitter casts the double result to eager's dtype.
    """
    integral = all(_is_integral(v) for v in (start, end, step))
    if (dtype in (-1, None) and integral) or (dtype not in (-1, None) and ir.DataType(dtype) not in _FLOAT_RESULTS):
        return aten_arange_start_step(start, end, step, dtype=-1 if dtype is None else dtype)
    if not any(isinstance(v, ir.Value) for v in (start, end, step)):
        count = op.Constant(value=ir.tensor(max(math.ceil((end - start) / step), 0), dtype=ir.DataType.INT64))
    else:
        quotient = op.Div(op.Sub(_as_double(end), _as_double(start)), _as_double(step))
        count = op.Max(op.Cast(op.Ceil(quotient), to=ir.DataType.INT64), op.Constant(value_int=0))
    steps = op.Cast(op.Range(op.Constant(value_int=0), count, op.Constant(value_int=1)), to=ir.DataType.DOUBLE)
    values = op.Add(_as_double(start), op.Mul(_as_double(step), steps))
    if dtype not in (-1, None) and ir.DataType(dtype) != ir.DataType.DOUBLE:
        values = op.Cast(values, to=dtype)
    return values
