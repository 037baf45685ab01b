"""Normalization: batch, layer, group and instance norms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import onnx_ir as ir
from onnxscript import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT64, UINT8
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TTensor

from fx2onnx._lowerings.builders import _LOW_PRECISION, TFloat, _back, _const, _double
from fx2onnx._lowerings.rules import lowering


# --- batch norm in training mode ------------------------------------------------------------------------
def _batch_norm(
    input: TFloat,
    weight: TFloat | None,
    bias: TFloat | None,
    running_mean: TFloat | None,
    running_var: TFloat | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[TFloat, TFloat, TFloat, TFloat | None, TFloat | None]:
    """Normalize over every axis but the channel axis (1), in float32 for float16/bfloat16 as eager does.

    Returns (output, save_mean, save_rstd, new running mean, new running var). In training mode the
    batch's statistics normalize and update the running ones (with the unbiased variance);
    otherwise the running statistics normalize and save_mean/save_rstd are empty, as in eager.
    """
    dtype = input.dtype
    compute = ir.DataType.FLOAT if dtype in _LOW_PRECISION else dtype
    x = op.Cast(input, to=compute) if compute != dtype else input
    rank = len(input.shape)
    axes = op.Constant(value_ints=[a for a in range(rank) if a != 1])
    channels_shape = op.Constant(value_ints=[1, -1] + [1] * (rank - 2))  # [C] -> broadcastable over x

    def as_compute(value: TFloat | None) -> TFloat | None:
        if value is None:
            return None
        return op.Cast(value, to=compute) if value.dtype != compute else value

    weight, bias = as_compute(weight), as_compute(bias)
    running_mean, running_var = as_compute(running_mean), as_compute(running_var)
    epsilon = op.CastLike(eps, x)
    new_mean = new_var = None
    if training:
        mean = op.ReduceMean(x, axes, keepdims=True)
        centered = op.Sub(x, mean)
        variance = op.ReduceMean(op.Mul(centered, centered), axes, keepdims=True)
        rstd = op.Reciprocal(op.Sqrt(op.Add(variance, epsilon)))
        normalized = op.Mul(centered, rstd)
        save_mean = op.Reshape(mean, op.Constant(value_ints=[-1]))
        save_rstd = op.Reshape(rstd, op.Constant(value_ints=[-1]))
        if running_mean is not None and running_var is not None:
            count = op.Cast(op.Div(op.Size(x), op.Shape(x, start=1, end=2)), to=compute)
            one = op.CastLike(1.0, x)
            unbiased = op.Div(op.Mul(op.Reshape(variance, op.Constant(value_ints=[-1])), count), op.Sub(count, one))
            keep = op.CastLike(1.0 - momentum, x)
            take = op.CastLike(momentum, x)
            new_mean = op.Add(op.Mul(running_mean, keep), op.Mul(save_mean, take))
            new_var = op.Add(op.Mul(running_var, keep), op.Mul(unbiased, take))
    elif weight is not None and bias is not None and rank >= 2 and compute != ir.DataType.DOUBLE:
        # ONNX's own op: ONNX Runtime folds it into a preceding Conv, and it is one node instead of eight.
        # (Not for float64: its epsilon attribute is a float32, eager's eps a double.)
        output = op.BatchNormalization(x, weight, bias, running_mean, running_var, epsilon=eps)
        empty = op.CastLike(op.ConstantOfShape(op.Constant(value_ints=[0])), x)
        return (op.Cast(output, to=dtype) if compute != dtype else output), empty, empty, None, None
    else:
        mean = op.Reshape(running_mean, channels_shape)
        rstd = op.Reciprocal(op.Sqrt(op.Add(op.Reshape(running_var, channels_shape), epsilon)))
        normalized = op.Mul(op.Sub(x, mean), rstd)
        empty = op.ConstantOfShape(op.Constant(value_ints=[0]))
        save_mean = save_rstd = op.CastLike(empty, x)
    if weight is not None:
        normalized = op.Mul(normalized, op.Reshape(weight, channels_shape))
    if bias is not None:
        normalized = op.Add(normalized, op.Reshape(bias, channels_shape))
    output = op.Cast(normalized, to=dtype) if compute != dtype else normalized
    return output, save_mean, save_rstd, new_mean, new_var


@lowering("aten::_native_batch_norm_legit_functional")
def native_batch_norm_legit_functional(
    input: TFloat,
    weight: TFloat | None = None,
    bias: TFloat | None = None,
    running_mean: TFloat | None = None,
    running_var: TFloat | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[TFloat, TFloat, TFloat, TFloat, TFloat]:
    """Batch norm that returns the updated running statistics (torchlib always uses inference mode)."""
    output, save_mean, save_rstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, training, momentum, eps
    )
    if new_mean is None:
        new_mean, new_var = op.Identity(running_mean), op.Identity(running_var)
    return output, save_mean, save_rstd, new_mean, new_var


@lowering("aten::_native_batch_norm_legit.no_stats")
def native_batch_norm_legit_no_stats(
    input: TFloat,
    weight: TFloat | None = None,
    bias: TFloat | None = None,
    training: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[TFloat, TFloat, TFloat]:
    """Batch norm with the batch's statistics and no running ones (instance norm decomposes to it)."""
    del training  # without running statistics, eager normalizes with the batch's in either mode
    output, save_mean, save_rstd, _, _ = _batch_norm(input, weight, bias, None, None, True, momentum, eps)
    return output, save_mean, save_rstd


@lowering("aten::_native_batch_norm_legit_no_training")
def native_batch_norm_legit_no_training(
    input: TFloat,
    weight: TFloat | None = None,
    bias: TFloat | None = None,
    running_mean: TFloat | None = None,
    running_var: TFloat | None = None,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[TFloat, TFloat, TFloat]:
    """Inference-mode batch norm; save_mean and save_rstd are empty, as in eager (torchlib fills them)."""
    output, save_mean, save_rstd, _, _ = _batch_norm(
        input, weight, bias, running_mean, running_var, False, momentum, eps
    )
    return output, save_mean, save_rstd


# --- ops torch.export keeps whole (CompositeImplicit), lowered so that its graph needs no decomposition ------------
@lowering("aten::batch_norm")
def batch_norm(
    input: TFloat,
    weight: TFloat | None = None,
    bias: TFloat | None = None,
    running_mean: TFloat | None = None,
    running_var: TFloat | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    cudnn_enabled: bool = True,
) -> TFloat:
    del cudnn_enabled
    batch_statistics = training or running_mean is None or running_var is None
    output, _, _, _, _ = _batch_norm(input, weight, bias, running_mean, running_var, batch_statistics, momentum, eps)
    return output


@lowering("aten::native_batch_norm")
def native_batch_norm(
    input: TFloat,
    weight: TFloat | None = None,
    bias: TFloat | None = None,
    running_mean: TFloat | None = None,
    running_var: TFloat | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[TFloat, TFloat, TFloat]:
    """(output, save_mean, save_rstd): the batch's statistics in training (or without running ones),
    else the running ones with empty save_mean/save_rstd, as eager. Capture decomposes a graph that
    trains (the running statistics' update), so this lowering never has to write them."""
    batch_statistics = training or running_mean is None or running_var is None
    output, save_mean, save_rstd, _, _ = _batch_norm(
        input, weight, bias, running_mean, running_var, batch_statistics, momentum, eps
    )
    return output, save_mean, save_rstd


# --- normalization: LayerNormalization's and InstanceNormalization's epsilon is float32 -------------------------
def _normalize(x: DOUBLE, axes: Sequence[int], eps: float) -> tuple[DOUBLE, DOUBLE, DOUBLE]:
    """(x - mean) * rstd over `axes`, with the mean and rstd (keepdims), rstd = 1 / sqrt(biased var + eps)."""
    axes_value = op.Constant(value_ints=list(axes))
    mean = op.ReduceMean(x, axes_value, keepdims=True)
    centered = op.Sub(x, mean)
    variance = op.ReduceMean(op.Mul(centered, centered), axes_value, keepdims=True)
    rstd = op.Reciprocal(op.Sqrt(op.Add(variance, _double(eps))))
    return op.Mul(centered, rstd), mean, rstd


# --- inputs of no element: eager returns the (empty) input, with a mean of 0 and an rstd of NaN (the variance of no
# element) per row. ONNX Runtime's LayerNormalization refuses a row of no element ("Size of X.shape[axis:] must be
# at least 1"; its LayerNormFusion makes one of the ReduceMean pattern too), and the Reshape to [0, groups, -1] of
# a group norm fails the checker when there is no element (fuzz seeds 10003035, 10003335).
def _has_no_element(input: TFloat) -> bool:
    return any(isinstance(size, int) and size == 0 for size in input.shape)


def _empty_normalization(
    input: TFloat, leading_dims: int, statistics_tail: Sequence[int]
) -> tuple[TFloat, TFloat, TFloat]:
    """(input, mean 0, rstd NaN), the statistics shaped as input's first `leading_dims` dims + `statistics_tail`."""
    shape = op.Concat(op.Shape(input, start=0, end=leading_dims), op.Constant(value_ints=list(statistics_tail)), axis=0)
    mean = op.Expand(_const(0.0, input), shape)
    rstd = op.Expand(_const(float("nan"), input), shape)
    return op.Identity(input), mean, rstd


def _empty_layer_norm(input: TFloat, normalized_shape: Sequence[int]) -> tuple[TFloat, TFloat, TFloat]:
    return _empty_normalization(input, len(input.shape) - len(normalized_shape), [1] * len(normalized_shape))


def _empty_group_norm(input: TFloat, groups: int) -> tuple[TFloat, TFloat, TFloat]:
    return _empty_normalization(input, 1, [groups])


def _layer_norm(
    input: DOUBLE, normalized_shape: Sequence[int], weight: DOUBLE | None, bias: DOUBLE | None, eps: float
) -> tuple[DOUBLE, DOUBLE, DOUBLE]:
    if _has_no_element(input):
        return _empty_layer_norm(input, normalized_shape)
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
    if _has_no_element(input):
        return _empty_group_norm(input, groups)
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


# float32, float16 and bfloat16: torchlib's LayerNormalization / InstanceNormalization (their float32 epsilon is
# exact enough there), but for an input of no element, which they refuse (see _has_no_element).
TSinglePrecision = TypeVar("TSinglePrecision", BFLOAT16, FLOAT, FLOAT16)


@lowering("aten::layer_norm")
def layer_norm_single(
    input: TSinglePrecision,
    normalized_shape: Sequence[int],
    weight: TSinglePrecision | None = None,
    bias: TSinglePrecision | None = None,
    eps: float = 1e-5,
    cudnn_enable: bool = True,
) -> TSinglePrecision:
    if _has_no_element(input):
        return _empty_layer_norm(input, normalized_shape)[0]
    from onnxscript.function_libs.torch_lib.ops.core import aten_layer_norm

    return aten_layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable)


@lowering("aten::native_layer_norm")
def native_layer_norm_single(
    input: TSinglePrecision,
    normalized_shape: Sequence[int],
    weight: TSinglePrecision | None = None,
    bias: TSinglePrecision | None = None,
    eps: float = 1e-5,
) -> tuple[TSinglePrecision, TSinglePrecision, TSinglePrecision]:
    if _has_no_element(input):
        return _empty_layer_norm(input, normalized_shape)
    from onnxscript.function_libs.torch_lib.ops.core import aten_native_layer_norm

    return aten_native_layer_norm(input, normalized_shape, weight, bias, eps)


@lowering("aten::group_norm")
def group_norm_single(
    input: TSinglePrecision,
    num_groups: int,
    weight: TSinglePrecision | None = None,
    bias: TSinglePrecision | None = None,
    eps: float = 1e-5,
    cudnn_enabled: bool = True,
) -> TSinglePrecision:
    if _has_no_element(input):
        return _empty_group_norm(input, num_groups)[0]
    from onnxscript.function_libs.torch_lib.ops.nn import aten_group_norm

    return aten_group_norm(input, num_groups, weight, bias, eps, cudnn_enabled)


@lowering("aten::native_group_norm")
def native_group_norm_single(
    input: TSinglePrecision,
    weight: TSinglePrecision | None = None,
    bias: TSinglePrecision | None = None,
    N: INT64 | None = None,
    C: INT64 | None = None,
    HxW: INT64 | None = None,
    group: int = 1,
    eps: float = 1e-5,
) -> tuple[TSinglePrecision, TSinglePrecision, TSinglePrecision]:
    if _has_no_element(input):
        return _empty_group_norm(input, group)
    from onnxscript.function_libs.torch_lib.ops.core import aten_native_group_norm

    return aten_native_group_norm(input, weight, bias, N, C, HxW, group, eps)


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


# --- batch norm that updates its running statistics -----------------------------------------------------------
@lowering("aten::_batch_norm_with_update_functional")
def batch_norm_with_update_functional(
    input: TFloat,
    weight: TFloat | None,
    bias: TFloat | None,
    running_mean: TFloat,
    running_var: TFloat,
    momentum: float,
    eps: float,
) -> tuple[TFloat, TFloat, TFloat, UINT8, TFloat, TFloat]:
    """Training-mode batch norm: (output, save_mean, save_rstd, empty reserve, new running mean, new running var)."""
    output, save_mean, save_rstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )
    reserve = op.Cast(op.ConstantOfShape(op.Constant(value_ints=[0])), to=UINT8.dtype)
    like = running_mean
    return (
        output,
        _back(save_mean, input),
        _back(save_rstd, input),
        reserve,
        _back(new_mean, like),
        _back(new_var, like),
    )


# --- dropout --------------------------------------------------------------------------------------------------
@lowering("aten::dropout")
def dropout(input: TTensor, p: float, train: bool) -> TTensor:
    """In eval (``train=False``) or with ``p=0``, dropout is its input: no node (torchlib's Dropout node, which
    onnxscript's optimizer would remove). Training dropout is torchlib's."""
    if not train or p == 0:
        return input
    from onnxscript.function_libs.torch_lib.ops.core import aten_dropout

    return aten_dropout(input, p, train)
