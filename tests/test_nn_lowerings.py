"""fx2onnx's own lowerings of torch.nn.functional and statistics ops (src/fx2onnx/_lowerings/), against eager.

Each case is one the coverage sweep found failing with torchlib's implementation (or none); the inputs include
the edge cases that broke it (empty batches, one-element reductions, NaN and -inf, output_padding >= stride,
unbatched inputs, float16/bfloat16).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import onnx
import pytest
import torch
import torch.nn.functional as F

import fx2onnx
from fx2onnx import Registry

from conftest import Call, assert_exports_and_matches


def floats(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator).to(dtype)


def with_specials(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random values with a NaN, a -inf row and a large value planted."""
    values = floats(*shape)
    flat = values.view(-1)
    flat[1] = math.nan
    flat[-shape[-1] :] = -math.inf
    flat[shape[-1] + 2] = 3e4
    return values.to(dtype)


def check(function: Callable[..., Any], *args: torch.Tensor) -> None:
    assert_exports_and_matches(Call(function), args)


def test_nn_lowerings_are_registered_first() -> None:
    """The dispatcher tries fx2onnx's lowerings before torchlib's for the overloads nn.py lowers."""
    registry = Registry.default()
    for target in ("aten::var_mean.correction", "aten::convolution", "aten::scaled_dot_product_attention"):
        assert registry.overloads(target)[0].name.startswith("fx2onnx:"), target


# --- variance: eager divides by max(0, N - correction); empty and one-element reductions give NaN ---------------
@pytest.mark.parametrize(
    ("function", "value"),
    [
        (lambda x: torch.var(x, False), torch.zeros(0)),
        (lambda x: torch.std_mean(x, True), floats(1)),
        (lambda x: torch.var_mean(x, (0, 2), correction=2, keepdim=True), floats(3, 4, 5, dtype=torch.float16)),
        (lambda x: torch.std(x, -1, correction=0), with_specials(3, 4, dtype=torch.bfloat16)),
        (lambda x: torch.var(x, 1), torch.zeros(0, 5, dtype=torch.float64)),
        (lambda x: torch.std(x, 0), floats(dtype=torch.float64)),
    ],
    ids=["empty", "one-element-unbiased", "correction-2-f16", "specials-bf16", "empty-rows", "rank-0"],
)
def test_variance(function: Callable[..., Any], value: torch.Tensor) -> None:
    check(function, value)


def test_batch_norm_with_update_returns_new_running_statistics() -> None:
    weight, bias = floats(2, dtype=torch.float16, seed=2), floats(2, dtype=torch.float16, seed=3)

    def batch_norm(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> Any:
        output, save_mean, save_rstd, _ = torch.ops.aten._batch_norm_with_update(x, weight, bias, mean, var, 0.3, 1e-5)
        return output, save_mean, save_rstd

    check(
        batch_norm,
        floats(3, 2, 4, dtype=torch.float16),
        torch.zeros(2, dtype=torch.float16),
        torch.ones(2, dtype=torch.float16),
    )


# --- adaptive pooling: overlapping bins, NaN/-inf, empty batches ------------------------------------------------------
def test_adaptive_max_pool_values_and_indices() -> None:
    x = with_specials(2, 4, 5, 7)
    x[1, 2, 3, 3:5] = math.nan  # two NaNs in one bin: eager reports the last
    check(lambda t: F.adaptive_max_pool2d(t, (3, 4), return_indices=True), x)
    check(lambda t: F.adaptive_max_pool1d(t, 3, return_indices=True), floats(4, 7, dtype=torch.float16))


@pytest.mark.parametrize(
    ("function", "value"),
    [
        (lambda t: F.adaptive_avg_pool3d(t, (5, 2, 4)), with_specials(2, 3, 8, 3, 8, dtype=torch.bfloat16)),
        (lambda t: F.adaptive_avg_pool3d(t, (5, 7, 4)), torch.zeros(0, 8, 8, 8, 8)),
        (lambda t: F.adaptive_avg_pool1d(t, 3), torch.zeros(0, 4, 7)),
        (lambda t: F.adaptive_max_pool3d(t, (2, 3, 2)), floats(2, 3, 5, 7, 3, dtype=torch.float64)),
    ],
    ids=["avg3d-uneven-bf16", "avg3d-empty-batch", "avg1d-empty-batch", "max3d-f64"],
)
def test_adaptive_pooling(function: Callable[..., Any], value: torch.Tensor) -> None:
    check(function, value)


# --- segment_reduce ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
def test_segment_reduce_lengths_and_offsets(reduce: str) -> None:
    data = torch.tensor([1.0, -2.0, 3.0, math.nan, 5.0, 0.5])
    lengths = torch.tensor([0, 1, 2, 3])
    check(lambda d, n: torch.segment_reduce(d, reduce, lengths=n, initial=2), data, lengths)
    check(lambda d, o: torch.segment_reduce(d, reduce, offsets=o), data, torch.tensor([0, 0, 1, 3, 6]))


def test_segment_reduce_along_inner_axis() -> None:
    data = floats(2, 6, 3, dtype=torch.float16)
    check(lambda d, n: torch.segment_reduce(d, "mean", lengths=n, axis=1), data, torch.tensor([[1, 2, 3], [0, 4, 2]]))


# --- p-norms ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.5, math.inf, -math.inf])
def test_dist(p: float) -> None:
    check(lambda a, b: torch.dist(a, b, p), floats(5, 1, 5), floats(5, 5, seed=2))


def test_vector_norm_of_rank_0_over_dim_and_low_precision() -> None:
    check(lambda x: torch.linalg.vector_norm(x, 2, 0, True), floats())
    check(lambda x: torch.linalg.vector_norm(x, 3.5, (0, 2)), floats(3, 4, 5, dtype=torch.float16))
    check(lambda x: torch.norm(x, 3), floats(4, 5, dtype=torch.bfloat16))


# --- cross entropy with class indices ---------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_label_smoothing_weight_ignore_index(reduction: str) -> None:
    logits = floats(6, 5, 3)
    target = torch.tensor([[0, 1, 4], [2, 2, -100], [1, 1, 1], [0, 4, 3], [3, 3, 3], [2, 0, 1]])
    weight = torch.rand(5, generator=torch.Generator().manual_seed(3))
    check(lambda x, t, w: F.cross_entropy(x, t, w, reduction=reduction, label_smoothing=0.2), logits, target, weight)


def test_cross_entropy_unbatched_and_all_ignored() -> None:
    check(lambda x, t: F.cross_entropy(x, t), floats(5, dtype=torch.float16), torch.tensor(3))
    check(lambda x, t: F.cross_entropy(x, t), floats(6, 5), torch.full((6,), -100))  # NaN, as eager


# --- negative log likelihood: torchlib requires a weight, F.nll_loss(x, t) had no implementation ----------------------
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_nll_loss_without_and_with_weight(reduction: str, dtype: torch.dtype) -> None:
    log_probabilities = floats(6, 5, dtype=dtype)
    target = torch.tensor([0, 4, -100, 2, 2, 1])
    weight = torch.rand(5, generator=torch.Generator().manual_seed(3)).to(dtype)
    check(lambda x, t: F.nll_loss(x, t, reduction=reduction), log_probabilities, target)
    check(lambda x, t, w: F.nll_loss(x, t, w, reduction=reduction), log_probabilities, target, weight)
    # the 2-d loss (images), total_weight of an unbatched input, and every sample ignored (mean: NaN, as eager)
    check(
        lambda x, t: F.nll_loss(x, t, reduction=reduction),
        floats(2, 5, 3, 4, dtype=dtype),
        target[:2].abs()[:, None, None].expand(2, 3, 4),
    )
    check(lambda x, t: torch.ops.aten.nll_loss_forward(x, t, None, 0, -100), floats(5, dtype=dtype), torch.tensor(3))
    check(
        lambda x, t: F.nll_loss(x, t, ignore_index=1, reduction=reduction),
        floats(3, 5, dtype=dtype),
        torch.ones(3, dtype=torch.int64),
    )


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_linear_cross_entropy_chunked(reduction: str) -> None:
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2)

    def loss(x: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.linear_cross_entropy(x, w, t, reduction=reduction, options=options)

    check(loss, floats(8, 3, dtype=torch.bfloat16), floats(4, 3, dtype=torch.bfloat16, seed=2), torch.arange(8) % 4)
    check(loss, floats(3), floats(4, 3, seed=2), torch.tensor(1))


# --- scaled_dot_product_attention without a boolean mask ------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "shapes", "dtype"),
    [
        ({"is_causal": True}, ((4, 3, 8), (4, 6, 8)), torch.float32),
        ({"is_causal": True}, ((3, 8), (4, 4, 6, 8)), torch.bfloat16),
        ({"enable_gqa": True, "scale": 0.3}, ((2, 4, 3, 8), (2, 2, 6, 8)), torch.float16),
    ],
    ids=["causal-3d", "causal-broadcast-bf16", "gqa-f16"],
)
def test_scaled_dot_product_attention(kwargs: dict[str, Any], shapes: tuple[Any, ...], dtype: torch.dtype) -> None:
    query, key = floats(*shapes[0], dtype=dtype), floats(*shapes[1], dtype=dtype, seed=2)
    value = floats(*shapes[1], dtype=dtype, seed=3)
    check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), query, key, value)


def test_scaled_dot_product_attention_float_mask() -> None:
    query, key, value = floats(2, 4, 3, 8), floats(2, 4, 6, 8, seed=2), floats(2, 4, 6, 8, seed=3)
    mask = floats(3, 6, seed=4)
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m), query, key, value, mask)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_scaled_dot_product_attention_bool_mask_scores_beyond_float16(dtype: torch.dtype) -> None:
    """Eager's CPU kernels compute float16 attention in float32: queries and keys of 100 give scores of about
    1e5, beyond float16's max, which float16 arithmetic turned into inf and its rows into zeros (zoo: a float16
    model fed large values). A padding row (mask all False) still gives zeros."""
    query, key = floats(2, 4, 6, 64, dtype=dtype) * 100, floats(2, 4, 6, 64, dtype=dtype, seed=2) * 100
    value = floats(2, 4, 6, 64, dtype=dtype, seed=3)
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    mask[0, :, :, :2] = False  # left padding
    mask[1] = False  # a row of padding only
    check(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m), query, key, value, mask)


@pytest.mark.parametrize("mask_dtype", [None, torch.float32, torch.bool])
def test_scaled_dot_product_attention_unscaled_records_no_mul(mask_dtype: torch.dtype | None) -> None:
    """A scale of exactly 1 (T5's attention, which does not scale) multiplies nothing: the emitted graph has no Mul
    for the optimizer to remove (a rewrite and a fold round), and the scores are eager's."""
    query, key, value = floats(2, 4, 3, 8), floats(2, 4, 6, 8, seed=2), floats(2, 4, 6, 8, seed=3)
    args: tuple[torch.Tensor, ...] = (query, key, value)
    if mask_dtype is not None:
        args = (*args, floats(3, 6, seed=4) if mask_dtype == torch.float32 else floats(3, 6, seed=4) > 0)
    model = Call(lambda q, k, v, *m: F.scaled_dot_product_attention(q, k, v, *m, scale=1.0))
    assert_exports_and_matches(model, args)
    emitted = fx2onnx.export(model, args, optimize=False).model_proto
    assert "Mul" not in {node.op_type for node in emitted.graph.node}


# --- convolutions -----------------------------------------------------------------------------------------------------
def test_conv_transpose_output_padding_beyond_stride() -> None:
    """Eager allows output_padding < max(stride, dilation); ORT's ConvTranspose only < stride."""

    def conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose2d(x, w, b, stride=(3, 2), padding=(1, 2), output_padding=(2, 3), groups=2, dilation=4)

    check(conv, floats(2, 2, 4, 4), floats(2, 2, 4, 5, seed=2), floats(4, seed=3))
    integers = torch.Generator().manual_seed(4)
    check(conv, *(torch.randint(-3, 3, shape, generator=integers) for shape in [(2, 2, 4, 4), (2, 2, 4, 5), (4,)]))


def test_float64_convolutions_are_exact() -> None:
    """ONNX Runtime's Conv and ConvTranspose have no float64 kernels; float64 runs as im2col + MatMul."""
    x, w = floats(2, 2, 4, 4, 4, dtype=torch.float64), floats(2, 2, 4, 5, 6, dtype=torch.float64, seed=2)

    def transposed(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose3d(x, w, b, (3, 2, 1), (1, 2, 3), (2, 3, 1), groups=2, dilation=4)

    check(transposed, x, w, floats(4, dtype=torch.float64, seed=3))
    image, weight = floats(2, 4, 7, 8, dtype=torch.float64), floats(6, 2, 3, 3, dtype=torch.float64, seed=3)
    check(lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2), image, weight)
    empty, kernel = torch.zeros(0, 3, 5, dtype=torch.float64), floats(2, 3, 3, dtype=torch.float64)
    check(lambda x, w: F.conv1d(x, w, padding=1), empty, kernel)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_integer_convolutions_wrap(dtype: torch.dtype) -> None:
    """Eager's integer convolution wraps in the dtype (int32 2 * (2**31 - 1) is -2; fuzz seeds 10003686, 10004909:
    float64 computed it exactly and the cast back gave INT_MIN); transposed: eager has int64 only."""
    low, high = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    x = torch.tensor([[[high, low, high, high - 1, low + 1], [low, high, 3, 0, high]]], dtype=dtype)
    w = torch.tensor([[[high, high, low], [2, low, high]], [[low, 3, high], [high, high, 1]]], dtype=dtype)
    bias = torch.tensor([high, low], dtype=dtype)
    check(lambda x, w, b: F.conv1d(x, w, b, padding=1), x, w, bias)
    check(lambda x, w: F.conv2d(x, w, stride=2, padding=1), x.unsqueeze(2).expand(1, 2, 2, 5), w.unsqueeze(2))
    if dtype == torch.int64:
        check(lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, padding=1), x, w, bias)


def test_unbatched_convolutions_in_low_precision() -> None:
    weight = floats(3, 3, 3, dtype=torch.bfloat16, seed=2)
    check(
        lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=2),
        floats(3, 4, dtype=torch.bfloat16),
        weight,
        floats(3, dtype=torch.bfloat16),
    )
    check(
        lambda x, w: F.conv_transpose1d(x, w, stride=2, output_padding=1),
        floats(1, 3, 4, dtype=torch.float16),
        weight.half(),
    )


# --- unfold, embedding_bag, distances, grid sampling, histograms --------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [torch.zeros(0, 1, 5, 5), floats(3, 7, 6, dtype=torch.bfloat16), floats(2, 3, 7, 6) > 0],
    ids=["empty", "unbatched-bf16", "bool"],
)
def test_unfold(value: torch.Tensor) -> None:
    check(lambda x: F.unfold(x, (2, 3), (1, 2), (1, 0), (2, 1)), value)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode: str) -> None:
    weight, indices, offsets = floats(10, 3), torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 0, 3])
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=4), weight, indices, offsets)
    check(lambda w, i: F.embedding_bag(i, w, mode=mode), weight.half(), indices.reshape(2, 3))


# Seeds 20200913, 20201048, 20201993, 20102030, 20102820, 20102668, 20102966: eager's max keeps a running max that
# only a strictly greater row replaces, so a NaN first in its bag stays and a later NaN is passed over; ReduceMax
# gave NaN for any NaN (or, in ONNX Runtime, passed over some).
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_embedding_bag_max_of_rows_holding_nan(dtype: torch.dtype) -> None:
    nan, inf = math.nan, math.inf
    weight = torch.tensor([[nan, 1.0], [2.0, nan], [-inf, -1.0], [nan, nan], [-65504.0, inf]], dtype=dtype)
    indices = torch.tensor([0, 1, 1, 0, 2, 0, 1, 4, 3, 0, 2, 3, 2, 3, 1, 3])
    offsets = torch.tensor([0, 2, 4, 7, 9, 12, 14])  # each bag starts with NaN in one column, then not
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode="max"), weight, indices, offsets)
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode="max", padding_idx=3), weight, indices, offsets)


def test_embedding_bag_per_sample_weights_and_last_offset() -> None:
    weight, indices = floats(10, 3), torch.tensor([1, 2, 4, 5, 4, 3])
    check(
        lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p),
        weight,
        indices,
        torch.tensor([0, 3]),
        floats(6),
    )
    check(
        lambda w, i, o: F.embedding_bag(i, w, o, mode="sum", include_last_offset=True),
        weight,
        indices,
        torch.tensor([0, 3, 6]),
    )
    two_dims = indices.reshape(2, 3)
    check(lambda w, i, p: F.embedding_bag(i, w, mode="sum", per_sample_weights=p), weight, two_dims, floats(2, 3))


@pytest.mark.parametrize("p", [0.0, 2.0, math.inf])
def test_cdist_and_pdist(p: float) -> None:
    check(lambda a, b: torch.cdist(a, b, p), floats(2, 5, 3), floats(2, 30, 3, seed=2))
    check(lambda a: F.pdist(a, p), floats(6, 3, dtype=torch.float64))


def test_distances_of_empty_sets() -> None:
    check(lambda a: F.pdist(a), floats(1, 3))
    check(lambda a, b: torch.cdist(a, b), torch.zeros(0, 3), floats(4, 3))


@pytest.mark.parametrize(
    ("mode", "padding_mode", "align_corners"),
    [
        ("bilinear", "zeros", False),
        ("nearest", "border", True),
        ("bilinear", "reflection", True),
        ("nearest", "reflection", False),
    ],
)
def test_grid_sample_3d(mode: str, padding_mode: str, align_corners: bool) -> None:
    grid = torch.rand(2, 3, 2, 4, 3, generator=torch.Generator().manual_seed(5)) * 3 - 1.5  # partly outside [-1, 1]
    check(lambda x, g: F.grid_sample(x, g, mode, padding_mode, align_corners), floats(2, 3, 4, 5, 6), grid)


@pytest.mark.parametrize(("padding_mode", "align_corners"), [("zeros", False), ("reflection", True)])
def test_grid_sample_2d_bicubic_in_float64(padding_mode: str, align_corners: bool) -> None:
    """ONNX Runtime's GridSample runs in float32 only; these lowerings compute float64 in float64."""
    grid = torch.rand(2, 3, 4, 2, generator=torch.Generator().manual_seed(6), dtype=torch.float64) * 3 - 1.5
    image = floats(2, 3, 4, 5, dtype=torch.float64)
    check(lambda x, g: F.grid_sample(x, g, "bicubic", padding_mode, align_corners), image, grid)


def test_histogram() -> None:
    check(lambda x: torch.histogram(x, 1), torch.tensor(2.5))  # one value: edges widened by 0.5 each way
    check(lambda x: torch.histogram(x, 7), floats(50, dtype=torch.float64))
    values, weights = torch.tensor([1.0, 2, 3, 3, 5]), torch.tensor([1.0, 2, 3, 4, 5])
    check(lambda x, w: torch.histogram(x, 3, range=(0.0, 4.0), density=True, weight=w), values, weights)
    check(lambda x, b: torch.histogram(x, b, density=True), floats(4, 5), torch.tensor([-1.0, 0.0, 0.5, 2.0]))


def test_histogramdd() -> None:
    check(lambda x: torch.histogramdd(x, (1, 1, 1, 1, 1)), floats(5, 5))
    check(lambda x, w: torch.histogramdd(x, (2, 3), weight=w, density=True), floats(7, 2), torch.rand(7))
    check(
        lambda x, a, b: torch.histogramdd(x, [a, b]),
        floats(7, 2),
        torch.tensor([-1.0, 0, 1]),
        torch.tensor([-2.0, 0.5]),
    )


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_gelu_matches_eager(approximate: str, dtype: torch.dtype) -> None:
    x = (torch.randn(16, 32) * 4).to(dtype)
    x[0, :4] = torch.tensor([1e4, -1e4, 0.0, -0.0])
    assert_exports_and_matches(Call(lambda t: torch.nn.functional.gelu(t, approximate=approximate)), (x,))


@pytest.mark.parametrize(("approximate", "fused"), [("none", "Gelu"), ("tanh", "FastGelu")])
def test_gelu_is_the_pattern_onnx_runtime_fuses(tmp_path: Any, approximate: str, fused: str) -> None:
    """ONNX Runtime fuses x * 0.5 * (1 + erf(x / sqrt2)) into one Gelu kernel, but not torchlib's
    x * (0.5 * (1 + erf(...))): unfused, ViT-B/16 ran 1-2% slower than the reference exporter's model. Its
    FastGelu fusion takes x * 0.5 * (1 + tanh(sqrt(2/pi) * x * (1 + 0.044715 * x * x))) only, not eager's
    x + 0.044715 * x**3 (GPT-2-small ran 3% slower). (FastGelu's fusion skips a graph output, hence the * 2.)"""
    import onnxruntime

    model = Call(lambda x: torch.nn.functional.gelu(x, approximate=approximate) * 2)
    program = assert_exports_and_matches(model, (torch.randn(4, 64) * 4,))  # fused as ONNX Runtime runs it
    path, optimized = os.path.join(tmp_path, "gelu.onnx"), os.path.join(tmp_path, "gelu.opt.onnx")
    program.save(path)
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = optimized
    onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    assert [node.op_type for node in onnx.load(optimized).graph.node] == [fused, "Mul"]


# Seed 10000398 (tests/fuzzing.py's wide catalogue): ONNX's pytorch_half_pixel maps an output of length 1 to source
# 0 (the first element); eager maps it as any other length, (0 + 0.5) * in / out - 0.5 (2 -> 1: their mean).
@pytest.mark.parametrize(
    ("mode", "resize", "shape"),
    [
        ("linear", {"scale_factor": 0.5}, (1, 1, 2)),
        ("linear", {"size": 1}, (2, 1, 3)),
        ("bilinear", {"size": (1, 3)}, (1, 2, 2, 3)),
        ("bilinear", {"scale_factor": 0.5}, (1, 1, 2, 4)),
        ("bicubic", {"size": (1, 1)}, (1, 1, 2, 4)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_interpolate_to_a_length_of_one(
    mode: str, resize: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    values = torch.tensor([-6.25, 7.5, 1.0, 4.0, -0.0, 3.0, 5.0, -1.0, 1e30, -2.5, 0.25, 8.0])
    x = values[: math.prod(shape)].reshape(shape).to(dtype)
    assert_exports_and_matches(Call(lambda x: F.interpolate(x, mode=mode, align_corners=False, **resize)), (x,))


# Seed 10004980: ONNX Runtime's linear Resize computes a 3-D input as 2-D [N*C, W], the next channel at weight 0, and
# a 4-D one whose height keeps its size likewise with the next row: a NaN there made a finite row NaN (sqrt of int8
# -1 beside sqrt(2): eager 1.41, ONNX NaN).
@pytest.mark.parametrize(
    ("mode", "resize", "shape"),
    [
        ("linear", {"scale_factor": 3.0}, (3, 3, 1)),
        ("linear", {"size": 7, "align_corners": True}, (2, 3, 4)),
        ("linear", {"scale_factor": 0.5}, (1, 3, 4)),
        ("bilinear", {"size": (3, 5)}, (1, 2, 3, 2)),
        ("bilinear", {"size": (4, 2), "align_corners": True}, (2, 1, 3, 2)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_interpolate_takes_nothing_from_the_next_channel_or_row(
    mode: str, resize: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    kept_width = mode == "bilinear" and resize.get("size", (0, 0))[-1] == shape[-1]  # NaN columns, else rows
    lines = (*shape[:-2], shape[-1], shape[-2]) if kept_width else shape
    rows = floats(*lines).to(dtype).reshape(-1, lines[-1])
    rows[::2, 0], rows[::2, -1] = torch.finfo(dtype).max, torch.finfo(dtype).min
    rows[1::2] = math.nan  # every other row (a channel, or a row of a kept height) NaN
    x = rows.reshape(lines).transpose(-1, -2).contiguous() if kept_width else rows.reshape(shape)
    assert_exports_and_matches(Call(lambda x: F.interpolate(x, mode=mode, **resize)), (x,))


# Seed 10000285: eager drops a last ceil-mode window that would start in the right padding, ONNX's MaxPool counts it
# (the checker refused the model); and eager's max of a window holding a NaN is NaN, where ONNX Runtime's MaxPool
# skips a NaN after the window's first element.
@pytest.mark.parametrize(
    ("function", "shape"),
    [
        (lambda x: F.max_pool1d(x, 3, stride=None, padding=1, ceil_mode=True), (1, 1, 2)),
        (lambda x: F.max_pool1d(x, 2, stride=2, ceil_mode=True), (2, 5)),
        (lambda x: F.max_pool2d(x, 2, stride=2, padding=1, ceil_mode=True), (1, 2, 4, 5)),
        (lambda x: F.max_pool2d(x, (3, 2), stride=(2, 1), padding=1, ceil_mode=True), (1, 1, 4, 5)),
        (lambda x: F.max_pool2d(x, 2, stride=1, padding=1, dilation=2), (1, 4, 5)),
        (lambda x: F.max_pool3d(x, 2, stride=2, ceil_mode=True), (1, 1, 3, 2, 3)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_max_pool_windows_and_nan_as_eager(
    function: Callable[..., Any], shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    generator = torch.Generator().manual_seed(0)
    x = (torch.randint(-16, 17, shape, generator=generator) / 4).to(dtype)
    flat = x.view(-1)
    flat[1], flat[-1] = math.nan, -math.inf
    if flat.numel() > 5:
        flat[3], flat[4] = torch.finfo(dtype).max, -0.0
    assert_exports_and_matches(Call(function), (x,))


# Seeds 10003236, 10003247: a window of padding only is eager's initial maximum, -inf for floats (ONNX Runtime's
# MaxPool: the lowest finite value) and the dtype's minimum for integers (int8 computed in int32: 0, eager -128).
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int16, torch.int32]
)
@pytest.mark.parametrize(
    "function",
    [
        lambda x: F.max_pool2d(x, 3, padding=1, ceil_mode=True, dilation=2),
        lambda x: F.max_pool2d(x, (1, 2), stride=(1, 2), padding=(0, 1), dilation=(1, 2)),
    ],
)
def test_max_pool_of_a_window_of_padding_only(function: Callable[..., Any], dtype: torch.dtype) -> None:
    assert_exports_and_matches(Call(function), (torch.tensor([[[3]]]).to(dtype),))


# Seeds 10002248, 10002271: float max pooling with indices went to ONNX Runtime's MaxPool, which skips NaN (values
# and indices: eager's is the window's last NaN), and gives -1 for a window of padding only (eager: -inf at the first
# position of its dilated grid past the padding, which may lie past the input).
@pytest.mark.parametrize(
    ("function", "x"),
    [
        (
            lambda x: F.max_pool1d(x, 3, stride=1, padding=1, return_indices=True),
            torch.tensor([[1.0, math.nan, 2.0, math.nan, math.nan, 3.0, -math.inf, -math.inf]]),
        ),
        (
            lambda x: F.max_pool1d(x, 2, stride=2, padding=1, dilation=2, return_indices=True),
            torch.tensor([[1000.0]]),
        ),
        (
            lambda x: F.max_pool2d(x, 2, stride=1, padding=1, ceil_mode=True, return_indices=True),
            torch.tensor([[[-math.inf, 2.0, 2.0], [math.nan, -math.inf, 3.4e38], [-0.0, 0.0, math.nan]]]),
        ),
        (
            lambda x: F.max_pool3d(x, 2, stride=2, ceil_mode=True, return_indices=True),
            torch.tensor([[[[math.nan, -math.inf, 1.0], [2.0, math.nan, 2.0]]]]),
        ),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_max_pool_indices_of_nan_and_padding_as_eager(
    function: Callable[..., Any], x: torch.Tensor, dtype: torch.dtype
) -> None:
    assert_exports_and_matches(Call(function), (x.to(dtype),))
