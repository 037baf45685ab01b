"""torch.nn.functional and statistics ops where torchlib is missing or differs from eager.

Pooling, norms and variances, losses, convolutions, attention helpers, distances, grid sampling, histograms.

Each lowering here was found by the coverage sweep (``fx2onnx coverage``, docs/support-matrix.md).
"""

from __future__ import annotations

import builtins
import itertools
import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import onnx_ir as ir
from onnxscript import BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT8, INT16, INT32, INT64, UINT8
from onnxscript import opset18 as op

from fx2onnx.lowerings.core import TFloat, TReal, _back, _batch_norm, _const, _in_float32
from fx2onnx.lowerings.rules import lowering


# --- variance and standard deviation with a correction -------------------------------------------------------------
# torch decomposes var/std(_mean).correction to prims::var, whose torchlib lowering divides by N - correction
# even when that is <= 0 and takes ReduceMean of empty tensors; eager divides sum((x - mean)^2) by
# max(0, N - correction), so an empty or one-element reduction gives NaN or inf exactly as IEEE does.
def _variance_and_mean(
    self: TFloat, dim: Sequence[int] | int | None, correction: float | None, keepdim: bool
) -> tuple[TFloat, TFloat]:
    x = _in_float32(self)
    rank = len(self.shape)
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    if rank == 0 or not dims:
        axes = None
        count = op.Size(x)
    else:
        axes = op.Constant(value_ints=dims)
        count = op.ReduceProd(op.Gather(op.Shape(x), axes, axis=0), keepdims=False)
    count = op.CastLike(count, x)
    total = op.ReduceSum(x, axes, keepdims=True) if rank else x
    mean = op.Div(total, count)
    centered = op.Sub(x, mean)
    squares = op.Mul(centered, centered)
    squares_sum = op.ReduceSum(squares, axes, keepdims=keepdim) if rank else squares
    zero = op.CastLike(0.0, x)
    divisor = op.Max(op.Sub(count, op.CastLike(1.0 if correction is None else correction, x)), zero)
    variance = op.Div(squares_sum, divisor)
    if rank and not keepdim:
        mean = op.Squeeze(mean, axes) if axes is not None else op.Reshape(mean, op.Constant(value_ints=[]))
    return variance, mean


@lowering("aten::var.correction")
def var_correction(
    self: TFloat, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
) -> TFloat:
    variance, _ = _variance_and_mean(self, dim, correction, keepdim)
    return _back(variance, self)


@lowering("aten::std.correction")
def std_correction(
    self: TFloat, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
) -> TFloat:
    variance, _ = _variance_and_mean(self, dim, correction, keepdim)
    return _back(op.Sqrt(variance), self)


@lowering("aten::var_mean.correction")
def var_mean_correction(
    self: TFloat, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
) -> tuple[TFloat, TFloat]:
    variance, mean = _variance_and_mean(self, dim, correction, keepdim)
    return _back(variance, self), _back(mean, self)


@lowering("aten::std_mean.correction")
def std_mean_correction(
    self: TFloat, dim: Sequence[int] | None = None, correction: float | None = None, keepdim: bool = False
) -> tuple[TFloat, TFloat]:
    variance, mean = _variance_and_mean(self, dim, correction, keepdim)
    return _back(op.Sqrt(variance), self), _back(mean, self)


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


def _spatial_sizes(input: TFloat, count: int, name: str) -> list[int]:
    sizes = list(input.shape)[-count:]
    if not all(isinstance(size, int) for size in sizes):
        raise ValueError(f"{name} needs static spatial sizes, got {list(input.shape)}")
    return [int(size) for size in sizes]


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


# --- segment reductions -------------------------------------------------------------------------------------------
builtins_range = builtins.range  # the histogram lowerings take an argument named `range`

TIndex = TypeVar("TIndex", INT32, INT64)

_SEGMENT_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}


@lowering("aten::segment_reduce")
def segment_reduce(
    data: TFloat,
    reduce: str,
    lengths: TIndex | None = None,
    indices: TIndex | None = None,
    offsets: TIndex | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: float | None = None,
) -> TFloat:
    """Reduce consecutive segments of `data` along `axis` given by lengths or offsets ([..., segments(+1)]).

    A [..., segments, positions] membership mask selects each segment's elements; the reduction's identity fills
    the rest. `initial` seeds every segment as in eager (an empty segment gives it; an empty mean without it NaN).
    """
    del indices, unsafe  # eager rejects indices; unsafe only skips eager's checks
    rank = len(data.shape)
    axis = axis % rank
    x = _in_float32(data)
    if offsets is not None:
        bounds = op.Cast(offsets, to=INT64.dtype)
        starts = op.Slice(
            bounds, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]), op.Constant(value_ints=[-1])
        )
        ends = op.Slice(
            bounds, op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62]), op.Constant(value_ints=[-1])
        )
    else:
        sizes = op.Cast(lengths, to=INT64.dtype)
        ends = op.CumSum(sizes, op.Constant(value_int=-1))
        starts = op.Sub(ends, sizes)
    last = op.Constant(value_ints=[-1])
    positions = op.Range(
        op.Constant(value_int=0), op.Squeeze(op.Shape(x, start=axis, end=axis + 1)), op.Constant(value_int=1)
    )
    member = op.And(
        op.GreaterOrEqual(positions, op.Unsqueeze(starts, last)), op.Less(positions, op.Unsqueeze(ends, last))
    )  # [..., segments, positions]
    features = rank - axis - 1  # dims after `axis`, kept as they are
    if features:
        member = op.Unsqueeze(member, op.Constant(value_ints=list(range(axis + 2, rank + 1))))
    values = op.Unsqueeze(x, op.Constant(value_ints=[axis]))  # [..., 1, positions, features...]
    along = op.Constant(value_ints=[axis + 1])
    identity = op.CastLike(_SEGMENT_IDENTITY[reduce], x)
    masked = op.Where(member, values, identity)
    if reduce in ("sum", "mean"):
        result = op.ReduceSum(masked, along, keepdims=False)
    elif reduce == "prod":
        result = op.ReduceProd(masked, along, keepdims=False)
    elif reduce == "max":
        result = op.ReduceMax(op.Where(op.IsNaN(masked), identity, masked), along, keepdims=False)
    elif reduce == "min":
        result = op.ReduceMin(op.Where(op.IsNaN(masked), identity, masked), along, keepdims=False)
    else:
        raise ValueError(f"segment_reduce: unknown reduction {reduce!r}")
    start = op.CastLike(initial, x) if initial is not None else None
    if reduce == "mean":
        counts = op.CastLike(op.Sub(ends, starts), x)
        if features:
            counts = op.Unsqueeze(counts, op.Constant(value_ints=list(range(axis + 1, rank))))
        if start is not None:
            result = op.Where(op.Equal(counts, op.CastLike(0, x)), start, op.Div(op.Add(result, start), counts))
        else:
            result = op.Div(result, counts)
    elif start is not None:
        combine = {"sum": op.Add, "prod": op.Mul, "max": op.Max, "min": op.Min}[reduce]
        result = combine(result, start)
    if reduce in ("max", "min"):
        has_nan = op.ReduceMax(op.Cast(op.IsNaN(masked), to=INT32.dtype), along, keepdims=False)
        nan = op.CastLike(math.nan, x)
        result = op.Where(op.Cast(has_nan, to=ir.DataType.BOOL), nan, result)
    return _back(result, data)


# --- p-norms over every element (dist, norm.Scalar) ------------------------------------------------------------------
def _p_norm(x: TFloat, p: float, axes: INT64 | None, keepdim: bool) -> TFloat:
    """The p-norm of x over `axes` (all when None), as torch.linalg.vector_norm defines it for each p."""
    magnitude = op.Abs(x)
    if p == math.inf:
        return op.ReduceMax(magnitude, axes, keepdims=keepdim)
    if p == -math.inf:
        return op.ReduceMin(magnitude, axes, keepdims=keepdim)
    if p == 0:
        return op.ReduceSum(op.CastLike(op.Not(op.Equal(x, op.CastLike(0.0, x))), x), axes, keepdims=keepdim)
    if p == 1:
        return op.ReduceSum(magnitude, axes, keepdims=keepdim)
    if p == 2:
        return op.Sqrt(op.ReduceSumSquare(x, axes, keepdims=keepdim))
    powered = op.ReduceSum(op.Pow(magnitude, op.CastLike(p, x)), axes, keepdims=keepdim)
    return op.Pow(powered, op.CastLike(1.0 / p, x))


@lowering("aten::dist")
def dist(self: TFloat, other: TFloat, p: float = 2.0) -> TFloat:
    difference = op.Sub(_in_float32(self), _in_float32(other))
    return _back(_p_norm(difference, float(p), None, False), self)


@lowering("aten::norm.Scalar")
def norm_scalar(self: TFloat, p: float = 2.0) -> TFloat:
    return _back(_p_norm(_in_float32(self), float(p), None, False), self)


# --- cross entropy with class-index targets ---------------------------------------------------------------------------
# torchlib's aten::cross_entropy_loss ignores label_smoothing and fails on unbatched input ([C] logits, 0-d target).
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _class_cross_entropy(
    logits: TFloat,
    target: INT64,
    weight: TFloat | None,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
) -> TFloat:
    """Eager's cross_entropy for class indices, in the logits' dtype (callers pass float32 for half types).

    Per sample: (1 - s) * w[t] * -log_softmax[t] + s / C * sum_c w[c] * -log_softmax[c], ignored samples 0;
    'mean' divides both sums by the sum of w[t] over the kept samples (NaN when every sample is ignored).
    """
    unbatched = len(logits.shape) == 1
    rank = max(len(logits.shape), 2)
    zero_axis = op.Constant(value_ints=[0])
    if unbatched:
        logits, target = op.Unsqueeze(logits, zero_axis), op.Unsqueeze(target, zero_axis)
    class_axis = op.Constant(value_ints=[1])
    log_probabilities = op.LogSoftmax(logits, axis=1)
    ignored = op.Equal(target, op.Constant(value_int=ignore_index))
    safe_target = op.Where(ignored, op.Constant(value_int=0), target)
    picked = op.Squeeze(op.GatherElements(log_probabilities, op.Unsqueeze(safe_target, class_axis), axis=1), class_axis)
    zero = op.CastLike(0.0, logits)
    if weight is not None:
        target_weight = op.Where(ignored, zero, op.Gather(weight, safe_target, axis=0))
    else:
        target_weight = op.Where(ignored, zero, op.CastLike(1.0, logits))
    losses = op.Neg(op.Mul(picked, target_weight))
    smooth = None
    if label_smoothing > 0:
        terms = log_probabilities
        if weight is not None:
            terms = op.Mul(terms, op.Reshape(weight, op.Constant(value_ints=[1, -1] + [1] * (rank - 2))))
        smooth = op.Where(ignored, zero, op.Neg(op.ReduceSum(terms, class_axis, keepdims=False)))
        classes = op.CastLike(op.Shape(logits, start=1, end=2), logits)
        smooth = op.Div(op.Mul(smooth, op.CastLike(label_smoothing, logits)), classes)
        losses = op.Mul(losses, op.CastLike(1.0 - label_smoothing, logits))
    if reduction == "none":
        result = losses if smooth is None else op.Add(losses, smooth)
        return op.Squeeze(result, zero_axis) if unbatched else result
    total = op.ReduceSum(losses, keepdims=False)
    if smooth is not None:
        total = op.Add(total, op.ReduceSum(smooth, keepdims=False))
    if reduction == "sum":
        return total
    return op.Div(total, op.ReduceSum(target_weight, keepdims=False))


@lowering("aten::cross_entropy_loss")
def cross_entropy_loss_classes(
    self: TFloat,
    target: INT64,
    weight: TFloat | None = None,
    reduction: int = 1,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> TFloat:
    """Cross entropy against class indices: unbatched inputs and label smoothing as in eager."""
    x = _in_float32(self)
    class_weight = _in_float32(weight) if weight is not None else None
    loss = _class_cross_entropy(x, target, class_weight, _REDUCTIONS[reduction], ignore_index, label_smoothing)
    return _back(loss, self)


def _linear_logits(input: TFloat, linear_weight: TFloat, linear_bias: TFloat | None) -> TFloat:
    """input @ linear_weight.T (+ bias) in float32: [N, H] x [C, H] -> [N, C]."""
    x = _in_float32(input)
    logits = op.MatMul(x, op.Transpose(op.CastLike(linear_weight, x), perm=[1, 0]))
    if linear_bias is not None:
        logits = op.Add(logits, op.CastLike(linear_bias, x))
    return logits


def _empty_gradient(like: TFloat, rank: int) -> TFloat:
    return op.CastLike(op.ConstantOfShape(op.Constant(value_ints=[0] * rank)), like)


@lowering("torch_nn::_linear_cross_entropy_batch_chunked")
def linear_cross_entropy_batch_chunked(
    input: TFloat,
    linear_weight: TFloat,
    target: INT64,
    linear_bias: TFloat | None = None,
    weight: TFloat | None = None,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    batch_chunk_size: int = 0,
    acc_policy: str = "auto",
    acc_dtype: int | None = None,
    allow_retain_graph: bool = False,
    compute_input_grad: bool = False,
    compute_linear_weight_grad: bool = False,
    compute_linear_bias_grad: bool = False,
) -> tuple[TFloat, TFloat, TFloat, TFloat]:
    """linear_cross_entropy's chunked path (mean/sum) as one linear + cross entropy: chunking only saves memory.

    Returns (loss, grad_input, grad_linear_weight, grad_linear_bias); the gradients are the empty placeholders
    eager returns when no gradient is needed (an exported model runs without autograd).
    """
    del batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph
    if compute_input_grad or compute_linear_weight_grad or compute_linear_bias_grad:
        raise NotImplementedError("linear_cross_entropy's precomputed gradients are not exported; export in eval mode")
    logits = _linear_logits(input, linear_weight, linear_bias)
    class_weight = _in_float32(weight) if weight is not None else None
    loss = _back(_class_cross_entropy(logits, target, class_weight, reduction, ignore_index, label_smoothing), input)
    return loss, _empty_gradient(input, 2), _empty_gradient(input, 2), _empty_gradient(input, 1)


@lowering("torch_nn::_linear_cross_entropy_batch_chunked_no_reduction")
def linear_cross_entropy_batch_chunked_no_reduction(
    input: TFloat,
    linear_weight: TFloat,
    target: INT64,
    linear_bias: TFloat | None = None,
    weight: TFloat | None = None,
    ignore_index: int = -100,
    batch_chunk_size: int = 0,
    acc_policy: str = "auto",
    acc_dtype: int | None = None,
) -> TFloat:
    """Per-sample losses [N] of linear_cross_entropy's chunked path with reduction='none'."""
    del batch_chunk_size, acc_policy, acc_dtype
    logits = _linear_logits(input, linear_weight, linear_bias)
    class_weight = _in_float32(weight) if weight is not None else None
    return _back(_class_cross_entropy(logits, target, class_weight, "none", ignore_index, 0.0), input)


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
# strided Slice per kernel offset (im2col) and a float64 MatMul per group. A transposed convolution is the
# correlation of the stride-dilated input with the flipped, in/out-swapped kernel.
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
    types in float32 too); float64 and integers (exact below 2**53) in float64 with im2col + MatMul.
    """
    spatial = len(weight.shape) - 2
    unbatched = len(input.shape) == spatial + 1
    dtype = input.dtype
    shape, weight_shape = ([1] if unbatched else []) + list(input.shape), list(weight.shape)
    if dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        compute = dtype
    elif dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        compute = ir.DataType.FLOAT
    else:
        compute = ir.DataType.DOUBLE
    converted = compute != dtype
    if converted:
        input, weight = op.Cast(input, to=compute), op.Cast(weight, to=compute)
        bias = op.Cast(bias, to=compute) if bias is not None else None
    x = op.Unsqueeze(input, op.Constant(value_ints=[0])) if unbatched else input
    strides, pads = _each(stride, spatial), _each(padding, spatial)
    dilations, extra = _each(dilation, spatial), _each(output_padding, spatial)
    sizes, kernel = shape[2:], weight_shape[2:]
    static = all(isinstance(size, int) for size in [*shape[1:], *weight_shape])  # the batch may be dynamic
    if static:
        out_channels = weight_shape[1] * groups if transposed else weight_shape[0]
        channels = (shape[0], shape[1], out_channels)
    if compute == ir.DataType.DOUBLE and static and not transposed:
        result = _correlate_exactly(x, weight, sizes, kernel, strides, pads, pads, dilations, groups, channels)
    elif compute == ir.DataType.DOUBLE and static:
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


# --- vector norms over given dims, rank 0 included ----------------------------------------------------------------
@lowering("aten::linalg_vector_norm")
def linalg_vector_norm(
    self: TFloat, ord: float = 2.0, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: int | None = None
) -> TFloat:
    """torch.linalg.vector_norm; a 0-d input with dim 0 or -1 reduces nothing (ONNX refuses the axis)."""
    x = op.Cast(self, to=dtype) if dtype is not None else self
    computed = _in_float32(x)
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    axes = op.Constant(value_ints=dims) if dims and len(self.shape) else None
    return _back(_p_norm(computed, float(ord), axes, keepdim), x)


# --- embedding_bag ----------------------------------------------------------------------------------------------------
@lowering("aten::embedding_bag.padding_idx")  # (aten::_embedding_bag reads padding_idx -1 as "none")
def embedding_bag(
    weight: TFloat,
    indices: TIndex,
    offsets: TIndex,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: TFloat | None = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> tuple[TFloat, INT64, INT64, INT64]:
    """Sum (0), mean (1) or max (2) of the embedding rows of each bag, as eager (an empty bag gives zeros).

    Bag b holds the indices at positions [offsets[b], offsets[b+1]) (2-D indices: one bag per row); a
    [bags, positions] membership mask selects them, without the padding_idx entries. Also returns eager's
    offset2bag, bag_size and max_indices for the mode (torchlib's CastLike on int64 has no ORT kernel).
    """
    del scale_grad_by_freq, sparse  # gradient-only options
    if len(indices.shape) == 2:
        rows, width = indices.shape
        offsets = op.Range(op.Constant(value_int=0), op.Constant(value_int=rows * width), op.Constant(value_int=width))
        indices = op.Reshape(indices, op.Constant(value_ints=[-1]))
        include_last_offset = False
    index = op.Cast(indices, to=INT64.dtype)
    bounds = op.Cast(offsets, to=INT64.dtype)
    count = op.Shape(index)
    if include_last_offset:
        starts = op.Slice(bounds, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]))
        ends = op.Slice(bounds, op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62]))
    else:
        starts = bounds
        ends = op.Concat(op.Slice(bounds, op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62])), count, axis=0)
    positions = op.Range(op.Constant(value_int=0), op.Squeeze(count), op.Constant(value_int=1))
    column = op.Constant(value_ints=[1])
    member = op.And(
        op.GreaterOrEqual(positions, op.Unsqueeze(starts, column)), op.Less(positions, op.Unsqueeze(ends, column))
    )  # [bags, positions]
    if padding_idx is not None:
        rows_total = weight.shape[0]
        padding = padding_idx + rows_total if padding_idx < 0 and isinstance(rows_total, int) else padding_idx
        member = op.And(member, op.Not(op.Equal(index, op.Constant(value_int=padding))))
    x = _in_float32(weight)
    rows_of = op.Gather(x, index, axis=0)  # [positions, dim]
    if per_sample_weights is not None:
        sample_weights = op.Reshape(op.CastLike(per_sample_weights, x), op.Constant(value_ints=[-1, 1]))
        rows_of = op.Mul(rows_of, sample_weights)
    selected = op.Unsqueeze(member, op.Constant(value_ints=[2]))  # [bags, positions, 1]
    bag_size = op.ReduceSum(op.Cast(member, to=INT64.dtype), column, keepdims=False)
    zero = op.CastLike(0.0, x)
    if mode == 2:
        lowest = op.CastLike(-math.inf, x)
        largest = op.ReduceMax(op.Where(selected, rows_of, lowest), column, keepdims=True)  # [bags, 1, dim]
        output = op.Where(
            op.Greater(op.Unsqueeze(bag_size, column), op.Constant(value_int=0)), op.Squeeze(largest, column), zero
        )
        hits = op.And(selected, op.Equal(rows_of, largest))
        beyond = op.Constant(value_int=2**62)
        first = op.ReduceMin(op.Where(hits, op.Unsqueeze(positions, column), beyond), column, keepdims=False)
        found = op.Less(first, beyond)
        max_indices = op.Where(
            found, op.Gather(index, op.Where(found, first, op.Constant(value_int=0)), axis=0), op.Constant(value_int=0)
        )
    else:
        total = op.ReduceSum(
            op.Where(selected, op.Unsqueeze(rows_of, op.Constant(value_ints=[0])), zero), column, keepdims=False
        )
        if mode == 1:
            sizes = op.CastLike(op.Unsqueeze(bag_size, column), x)
            output = op.Where(op.Greater(sizes, zero), op.Div(total, op.Max(sizes, op.CastLike(1.0, x))), zero)
        else:
            output = total
    bag_of = op.ArgMax(op.Cast(member, to=INT32.dtype), axis=0, keepdims=False)  # [positions]
    if mode == 0:
        offset2bag = op.Cast(op.ConstantOfShape(op.Constant(value_ints=[0])), to=INT64.dtype)
        bag_size = op.Mul(bag_size, op.Constant(value_int=0))
        max_indices = bag_size
    else:
        offset2bag = bag_of
        if mode == 1:
            max_indices = bag_size
    return _back(output, weight), offset2bag, bag_size, max_indices


# --- pairwise distances ----------------------------------------------------------------------------------------------
@lowering("aten::_cdist_forward")
def cdist_forward(x1: TFloat, x2: TFloat, p: float, compute_mode: int | None = None) -> TFloat:
    """[..., P, M] x [..., R, M] -> [..., P, R] p-norm distances, from the broadcast differences directly."""
    del compute_mode  # eager's matrix-product shortcut for p=2 is a speed/accuracy trade-off; this is exact
    if any(size == 0 for size in [*x1.shape[:-1], *x2.shape[:-1]]):
        # ORT's reductions keep the reduced axis of a zero-size tensor: build the empty result directly.
        shape = op.Concat(op.Shape(x1, start=0, end=-1), op.Shape(x2, start=-2, end=-1), axis=0)
        return op.CastLike(op.ConstantOfShape(shape), x1)
    a = op.Unsqueeze(_in_float32(x1), op.Constant(value_ints=[-2]))  # [..., P, 1, M]
    b = op.Unsqueeze(_in_float32(x2), op.Constant(value_ints=[-3]))  # [..., 1, R, M]
    return _back(_p_norm(op.Sub(a, b), float(p), op.Constant(value_ints=[-1]), False), x1)


@lowering("aten::_pdist_forward")
def pdist_forward(self: TFloat, p: float = 2.0) -> TFloat:
    """[N, M] -> [N*(N-1)/2]: the p-norm distance of every row pair i < j, in row-major pair order."""
    rows = self.shape[0]
    if not isinstance(rows, int):
        raise ValueError("pdist needs a static number of rows")
    if rows < 2:
        return op.CastLike(op.ConstantOfShape(op.Constant(value_ints=[0])), self)
    first, second = np.triu_indices(rows, k=1)
    x = _in_float32(self)
    left = op.Gather(x, op.Constant(value=ir.tensor(first.astype(np.int64))), axis=0)
    right = op.Gather(x, op.Constant(value=ir.tensor(second.astype(np.int64))), axis=0)
    return _back(_p_norm(op.Sub(left, right), float(p), op.Constant(value_ints=[-1]), False), self)


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


# --- histograms -------------------------------------------------------------------------------------------------------
# Eager bins x into the last bin whose left edge is <= x (the rightmost edge closes the last bin) and skips values
# outside the edges. Bin counts are one-hot rows summed with a MatMul, which also gives zeros for empty inputs.
def _linspace_edges(low: TFloat, high: TFloat, bins: int) -> TFloat:
    """bins + 1 edges from low to high, as torch.linspace computes them (from both ends towards the middle)."""
    step = op.Div(op.Sub(high, low), op.CastLike(float(bins), low))
    steps = bins + 1
    halfway = steps // 2
    from_start = op.CastLike(op.Constant(value=ir.tensor(np.arange(steps, dtype=np.float64))), low)
    from_end = op.CastLike(op.Constant(value=ir.tensor(np.arange(steps, dtype=np.float64)[::-1].copy() - 0.0)), low)
    first = op.Add(low, op.Mul(step, from_start))
    second = op.Sub(high, op.Mul(step, from_end))
    return op.Where(op.Constant(value=ir.tensor(np.arange(steps) < halfway)), first, second)


def _outer_edges(values: TFloat, bin_range: Sequence[float] | None, empty: bool) -> tuple[TFloat, TFloat]:
    """(low, high) of the binned range: the given range or the data's, widened by 0.5 each way when equal."""
    if bin_range is not None:
        low, high = op.CastLike(float(bin_range[0]), values), op.CastLike(float(bin_range[1]), values)
    elif empty:
        low, high = op.CastLike(0.0, values), op.CastLike(1.0, values)
    else:
        low, high = op.ReduceMin(values, keepdims=False), op.ReduceMax(values, keepdims=False)
    equal = op.Equal(low, high)
    half = op.CastLike(0.5, values)
    return op.Where(equal, op.Sub(low, half), low), op.Where(equal, op.Add(high, half), high)


def _bin_one_hot(values: TFloat, edges: TFloat, bins: int) -> TFloat:
    """[N] values, [bins + 1] edges -> [N, bins] one-hot bin membership (all zero outside the edges)."""
    column = op.Unsqueeze(values, op.Constant(value_ints=[1]))
    below = op.ReduceSum(
        op.Cast(op.LessOrEqual(edges, column), to=INT64.dtype), op.Constant(value_ints=[1]), keepdims=False
    )
    position = op.Min(op.Sub(below, op.Constant(value_int=1)), op.Constant(value_int=bins - 1))
    first_edge = op.Gather(edges, op.Constant(value_int=0), axis=0)
    last_edge = op.Gather(edges, op.Constant(value_int=bins), axis=0)
    inside = op.And(op.GreaterOrEqual(values, first_edge), op.LessOrEqual(values, last_edge))
    hits = op.Equal(
        op.Unsqueeze(position, op.Constant(value_ints=[1])),
        op.Constant(value=ir.tensor(np.arange(bins, dtype=np.int64))),
    )
    return op.CastLike(op.And(hits, op.Unsqueeze(inside, op.Constant(value_ints=[1]))), values)


def _bin_widths(edges: TFloat) -> TFloat:
    ends = op.Constant(value_ints=[2**62])
    return op.Sub(
        op.Slice(edges, op.Constant(value_ints=[1]), ends),
        op.Slice(edges, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1])),
    )


def _histogram(values: TFloat, edges: TFloat, bins: int, weight: TFloat | None, density: bool) -> TFloat:
    one_hot = _bin_one_hot(values, edges, bins)
    weights = weight if weight is not None else op.Expand(op.CastLike(1.0, values), op.Shape(values))
    counts = op.Squeeze(
        op.MatMul(op.Unsqueeze(weights, op.Constant(value_ints=[0])), one_hot), op.Constant(value_ints=[0])
    )
    if density:
        counts = op.Div(op.Div(counts, op.ReduceSum(counts, keepdims=False)), _bin_widths(edges))
    return counts


@lowering("aten::histogram.bin_ct")
def histogram_bin_count(
    self: TFloat,
    bins: int = 100,
    range: Sequence[float] | None = None,
    weight: TFloat | None = None,
    density: bool = False,
) -> tuple[TFloat, TFloat]:
    values = op.Reshape(self, op.Constant(value_ints=[-1]))
    empty = any(size == 0 for size in self.shape)
    low, high = _outer_edges(values, range, empty)
    edges = _linspace_edges(low, high, bins)
    flat_weight = op.Reshape(weight, op.Constant(value_ints=[-1])) if weight is not None else None
    return _histogram(values, edges, bins, flat_weight, density), edges


@lowering("aten::histogram.bins_tensor")
def histogram_bins_tensor(
    self: TFloat, bins: TFloat, weight: TFloat | None = None, density: bool = False
) -> tuple[TFloat, TFloat]:
    count = bins.shape[0]
    if not isinstance(count, int):
        raise ValueError("histogram needs a static number of bin edges")
    values = op.Reshape(self, op.Constant(value_ints=[-1]))
    flat_weight = op.Reshape(weight, op.Constant(value_ints=[-1])) if weight is not None else None
    return _histogram(values, bins, count - 1, flat_weight, density), op.Identity(bins)


def _histogramdd_columns(self: TFloat) -> tuple[TFloat, int]:
    dims = self.shape[-1]
    if not isinstance(dims, int):
        raise ValueError("histogramdd needs a static number of dimensions")
    return op.Reshape(self, op.Constant(value_ints=[-1, dims])), dims


def _column(points: TFloat, index: int) -> TFloat:
    return op.Gather(points, op.Constant(value_int=index), axis=1)


def _histogramdd_edges(self: TFloat, bins: Sequence[int], range: Sequence[float] | None) -> list[TFloat]:
    points, dims = _histogramdd_columns(self)
    counts = list(bins) * dims if len(bins) == 1 else list(bins)
    empty = any(size == 0 for size in self.shape)
    edges = []
    for d in builtins_range(dims):
        bounds = None if range is None else range[2 * d : 2 * d + 2]
        low, high = _outer_edges(_column(points, d), bounds, empty)
        edges.append(_linspace_edges(low, high, counts[d]))
    return edges


def _histogramdd(
    self: TFloat, edges: Sequence[TFloat], counts: Sequence[int], weight: TFloat | None, density: bool
) -> TFloat:
    """The joint histogram: per-dim one-hot memberships multiplied into [N, B0, ..., Bd-1], weighted and summed."""
    points, dims = _histogramdd_columns(self)
    joint = None
    for d in builtins_range(dims):
        one_hot = _bin_one_hot(_column(points, d), edges[d], counts[d])  # [N, Bd]
        shape = [-1] + [counts[k] if k == d else 1 for k in builtins_range(dims)]
        one_hot = op.Reshape(one_hot, op.Constant(value_ints=shape))
        joint = one_hot if joint is None else op.Mul(joint, one_hot)
    total_bins = math.prod(counts)
    flat_joint = op.Reshape(joint, op.Constant(value_ints=[-1, total_bins]))
    weights = op.Reshape(weight, op.Constant(value_ints=[1, -1])) if weight is not None else None
    if weights is None:
        weights = op.Expand(
            op.CastLike(1.0, points), op.Concat(op.Constant(value_ints=[1]), op.Shape(points, start=0, end=1), axis=0)
        )
    hist = op.Reshape(op.MatMul(weights, flat_joint), op.Constant(value_ints=list(counts)))
    if density:
        hist = op.Div(hist, op.ReduceSum(hist, keepdims=False))
        for d in builtins_range(dims):
            shape = [counts[k] if k == d else 1 for k in builtins_range(dims)]
            hist = op.Div(hist, op.Reshape(_bin_widths(edges[d]), op.Constant(value_ints=shape)))
    return hist


@lowering("aten::_histogramdd_bin_edges")
def histogramdd_bin_edges(
    self: TFloat,
    bins: Sequence[int],
    range: Sequence[float] | None = None,
    weight: TFloat | None = None,
    density: bool = False,
) -> Sequence[TFloat]:
    return _histogramdd_edges(self, bins, range)


@lowering("aten::_histogramdd_from_bin_cts")
def histogramdd_from_bin_counts(
    self: TFloat,
    bins: Sequence[int],
    range: Sequence[float] | None = None,
    weight: TFloat | None = None,
    density: bool = False,
) -> TFloat:
    dims = self.shape[-1]
    counts = list(bins) * dims if len(bins) == 1 else list(bins)
    return _histogramdd(self, _histogramdd_edges(self, bins, range), counts, weight, density)


@lowering("aten::_histogramdd_from_bin_tensors")
def histogramdd_from_bin_tensors(
    self: TFloat, bins: Sequence[TFloat], weight: TFloat | None = None, density: bool = False
) -> TFloat:
    counts = [edges.shape[0] - 1 for edges in bins]
    return _histogramdd(self, list(bins), counts, weight, density)


# --- gelu --------------------------------------------------------------------------------------------------------
@lowering("aten::gelu")
def gelu(self: TFloat, approximate: str = "none") -> TFloat:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` in eager's order, which is also the one ONNX Runtime's GeluFusion
    recognizes: torchlib's ``x * (0.5 * (1 + erf(...)))`` is left as five nodes (ViT-B/16 ran 1-2% slower than
    the reference exporter's opset-20 Gelu). The tanh form is written as ONNX Runtime's FastGeluFusion expects,
    ``x * 0.5 * (1 + tanh(sqrt(2/pi) * x * (1 + 0.044715 * x * x)))`` (eager's ``x + 0.044715 * x**3`` order was
    left as eight nodes: GPT-2-small ran 3% slower than the reference). float16/bfloat16 compute in float32,
    as eager does."""
    x = _in_float32(self)
    half_x = op.Mul(x, _const(0.5, x))
    if approximate == "tanh":
        one_plus_cubic = op.Add(op.Mul(op.Mul(x, _const(0.044715, x)), x), _const(1.0, x))
        inner = op.Mul(op.Mul(x, _const(math.sqrt(2.0 / math.pi), x)), one_plus_cubic)
        one_plus = op.Add(op.Tanh(inner), _const(1.0, x))
    else:
        one_plus = op.Add(op.Erf(op.Div(x, _const(math.sqrt(2.0), x))), _const(1.0, x))
    return _back(op.Mul(half_x, one_plus), self)
