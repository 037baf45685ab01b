"""fx2onnx's own lowerings of core ATen ops (src/fx2onnx/_lowerings/, formerly core.py), each against eager.

Each case is one the coverage sweep found failing with torchlib's implementation (or none); the
inputs include the edge cases that broke it (0-d tensors, NaN, ties, narrow integers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from fx2onnx import Registry

from conftest import Call, assert_exports_and_matches


def ints(*shape: int, dtype: torch.dtype = torch.int8, low: int = -5, high: int = 6) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(low, high, shape, generator=generator).to(dtype)


def floats(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(shape, generator=generator).to(dtype)


def test_core_lowerings_are_registered_first() -> None:
    """The dispatcher tries fx2onnx's lowerings before torchlib's for the overloads it lowers."""
    registry = Registry.default()
    for overload in ("aten::amax", "aten::cummax", "aten::addmm", "aten::_native_batch_norm_legit_functional"):
        assert registry.overloads(overload)[0].source == "fx2onnx", overload


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm(training: bool, dtype: torch.dtype) -> None:
    def batch_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        mean, var = torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype)
        return torch.nn.functional.batch_norm(x, mean, var, weight, bias, training=training, momentum=0.3, eps=0.1)

    x = floats(4, 3, 5, dtype=dtype) * 3 + 1
    assert_exports_and_matches(Call(batch_norm), (x, floats(3, dtype=dtype), floats(3, dtype=dtype)))


def test_instance_norm() -> None:
    assert_exports_and_matches(Call(torch.nn.functional.instance_norm), (floats(2, 3, 4, 4) * 2 - 1,))


@pytest.mark.parametrize("function", [torch.amax, torch.amin, torch.all, torch.any])
@pytest.mark.parametrize("dtype", [torch.float16, torch.int16, torch.bool])
def test_reductions_over_a_dim_of_a_scalar(function: Callable[..., torch.Tensor], dtype: torch.dtype) -> None:
    scalar = torch.tensor(3).to(dtype)
    assert_exports_and_matches(Call(lambda x: function(x, 0)), (scalar,))
    assert_exports_and_matches(Call(lambda x: function(x, -1, keepdim=True)), (ints(3, 4, dtype=dtype),))


@pytest.mark.parametrize("function", [torch.cummax, torch.cummin])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.uint8, torch.bool])
def test_cummax_cummin(function: Callable[..., Any], dtype: torch.dtype) -> None:
    x = ints(3, 6, dtype=dtype, low=0, high=3)  # many ties: eager returns the latest index
    assert_exports_and_matches(Call(lambda t: tuple(function(t, 1))), (x,))
    assert_exports_and_matches(Call(lambda t: tuple(function(t, 0))), (x,))


def test_cummax_nan_sticks() -> None:
    x = torch.tensor([1.0, float("nan"), 3.0, float("nan"), 0.5])
    assert_exports_and_matches(Call(lambda t: tuple(torch.cummax(t, 0))), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.bool])
def test_cumprod(dtype: torch.dtype) -> None:
    assert_exports_and_matches(Call(lambda t: torch.cumprod(t, 1)), (ints(2, 5, dtype=dtype, low=-2, high=3),))


@pytest.mark.parametrize("dtype", [torch.float16, torch.int64])
def test_masked_select(dtype: torch.dtype) -> None:
    x = ints(3, 4, dtype=dtype)
    assert_exports_and_matches(Call(lambda t, m: torch.masked_select(t, m)), (x, x > 0))
    assert_exports_and_matches(Call(lambda t, m: torch.masked_select(t, m)), (x, (x > 0)[0]))  # broadcast mask


def test_signbit_and_copysign() -> None:
    x = torch.tensor([-1.0, -0.0, 0.0, 2.0, float("-inf")])
    assert_exports_and_matches(Call(torch.signbit), (x,))
    assert_exports_and_matches(Call(torch.copysign), (torch.ones(5), x))
    assert_exports_and_matches(Call(torch.signbit), (ints(5),))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8, torch.int64])
def test_integer_matrix_products(dtype: torch.dtype) -> None:
    a, b, c = ints(3, 4, dtype=dtype, low=0), ints(4, 5, dtype=dtype, low=0), ints(3, 5, dtype=dtype, low=0)
    assert_exports_and_matches(Call(lambda s, m1, m2: torch.addmm(s, m1, m2, beta=2, alpha=3)), (c, a, b))
    assert_exports_and_matches(Call(torch.addmv), (ints(3, dtype=dtype, low=0), a, ints(4, dtype=dtype, low=0)))
    assert_exports_and_matches(Call(torch.addr), (c, ints(3, dtype=dtype, low=0), ints(5, dtype=dtype, low=0)))
    batch1, batch2 = ints(2, 3, 4, dtype=dtype, low=0), ints(2, 4, 5, dtype=dtype, low=0)
    assert_exports_and_matches(Call(torch.baddbmm), (ints(2, 3, 5, dtype=dtype, low=0), batch1, batch2))
    assert_exports_and_matches(Call(lambda s, x, y: torch.addbmm(s, x, y, beta=0)), (c, batch1, batch2))


def test_integer_products_wrap_like_eager() -> None:
    big = torch.full((2, 8), 100, dtype=torch.int8)
    assert_exports_and_matches(Call(torch.addmm), (torch.zeros(2, 2, dtype=torch.int8), big, big.T.contiguous()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_fmax_fmin(dtype: torch.dtype) -> None:
    if dtype.is_floating_point:
        a = torch.tensor([1.0, float("nan"), float("nan"), -2.0]).to(dtype)
        b = torch.tensor([float("nan"), 2.0, float("nan"), -3.0]).to(dtype)
    else:
        a, b = ints(4, dtype=dtype), ints(4, dtype=dtype, low=-2)
    assert_exports_and_matches(Call(torch.fmax), (a, b))
    assert_exports_and_matches(Call(torch.fmin), (a, b))


def test_hypot() -> None:
    a = torch.tensor([3.0, 1e30, 0.0, float("inf"), float("nan")])
    b = torch.tensor([4.0, 1e30, 0.0, float("nan"), 1.0])
    assert_exports_and_matches(Call(torch.hypot), (a, b))


@pytest.mark.parametrize("right", [False, True])
def test_bucketize_and_searchsorted(right: bool) -> None:
    boundaries = torch.tensor([1, 3, 5, 7])
    values = torch.tensor([[0, 1, 3], [6, 7, 9]])
    assert_exports_and_matches(Call(lambda v, b: torch.bucketize(v, b, right=right)), (values, boundaries))
    rows = torch.tensor([[1, 3, 5, 7], [2, 4, 6, 8]])
    assert_exports_and_matches(Call(lambda s, v: torch.searchsorted(s, v, right=right, out_int32=True)), (rows, values))


@pytest.mark.parametrize(
    "function",
    [torch.lgamma, torch.digamma, torch.special.i0e, torch.special.i1, torch.i0, torch.special.entr],
    ids=lambda f: f.__name__,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_special_functions(function: Callable[..., torch.Tensor], dtype: torch.dtype) -> None:
    x = torch.tensor([-2.5, -0.5, 0.0, 0.25, 1.0, 3.5, 12.0, 40.0], dtype=dtype)
    assert_exports_and_matches(Call(function), (x,))


def test_erfinv_ndtri_polygamma() -> None:
    p = torch.tensor([-1.0, -0.999, -0.3, 0.0, 0.5, 0.9999, 1.0])
    assert_exports_and_matches(Call(torch.erfinv), (p,))
    assert_exports_and_matches(Call(torch.special.ndtri), ((p + 1) / 2,))
    assert_exports_and_matches(Call(lambda t: torch.polygamma(2, t)), (torch.tensor([0.3, 1.0, 4.5, 20.0]),))


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool_windows_like_eager(ceil_mode: bool, count_include_pad: bool) -> None:
    def pool(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool2d(x, 3, 2, 1, ceil_mode, count_include_pad)

    assert_exports_and_matches(Call(pool), (floats(1, 2, 8, 7),))
    assert_exports_and_matches(
        Call(lambda x: torch.nn.functional.avg_pool2d(x, 2, divisor_override=3)), (floats(1, 2, 4, 4),)
    )
    assert_exports_and_matches(Call(pool), (floats(2, 8, 7),))  # unbatched: (C, H, W)


@pytest.mark.filterwarnings("ignore:index_reduce")
@pytest.mark.parametrize("reduce", ["amax", "amin", "prod", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int16])
def test_index_reduce(reduce: str, include_self: bool, dtype: torch.dtype) -> None:
    index = torch.tensor([0, 2, 0, 1])

    def reduced(x: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return x.index_reduce(0, index, source, reduce, include_self=include_self)

    assert_exports_and_matches(Call(reduced), (ints(3, 2, dtype=dtype), ints(4, 2, dtype=dtype, low=-3, high=4)))


@pytest.mark.filterwarnings("ignore:index_reduce")
@pytest.mark.parametrize("reduce", ["amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_index_reduce_propagates_nan(reduce: str, include_self: bool, dtype: torch.dtype) -> None:
    """Eager's index_reduce amax/amin is NaN where self (with include_self) or a reduced value is NaN, as its
    scatter_reduce is; ONNX Runtime's ScatterElements max/min dropped self's NaN (-2 for max(NaN, -2, -inf); found
    probing tests/fuzzing.py's limits catalogue)."""
    nan = math.nan
    x = torch.tensor([[nan, 1.0], [2.0, -3.0], [0.5, nan]], dtype=dtype)
    source = torch.tensor([[-2.0, nan], [-math.inf, 4.0], [1.5, -0.0]], dtype=dtype)
    index = torch.tensor([0, 0, 1])

    def reduced(x: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return x.index_reduce(0, index, source, reduce, include_self=include_self)

    assert_exports_and_matches(Call(reduced), (x, source))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool])
def test_isclose_of_integers_computes_in_the_default_float_dtype(dtype: torch.dtype) -> None:
    """Eager's isclose of integers (and bool) computes |a - b| <= atol + |rtol b| in float32: int8 isclose(-128, 0,
    atol=0.5) is False (the wrapping int8 difference -128 made it True), int64 values 1 apart above 2**24 are equal
    in float32 (exactly as eager rounds them)."""
    if dtype == torch.bool:
        a, b = torch.tensor([True, False, True]), torch.tensor([False, False, True])
    else:
        info = torch.iinfo(dtype)
        a = torch.tensor([info.min, info.max, info.min, 100, 0, info.max - 1], dtype=dtype)
        b = torch.tensor([0, info.min, info.max, 27, info.max, info.max], dtype=dtype)
    if dtype == torch.int64:
        a, b = torch.cat([a, torch.tensor([2**24 + 1, 2**40])]), torch.cat([b, torch.tensor([2**24 + 2, 2**40 + 1])])
    for rtol, atol in ((1e-5, 1e-8), (0.0, 0.5), (0.0, 127.0), (0.0, 255.0), (0.5, 2.0), (0.0, 0.0)):

        def close(a: torch.Tensor, b: torch.Tensor, rtol: float = rtol, atol: float = atol) -> torch.Tensor:
            return torch.isclose(a, b, rtol=rtol, atol=atol)

        assert_exports_and_matches(Call(close), (a, b))


@pytest.mark.parametrize("mode", ["constant", "replicate", "circular"])
def test_pad_with_negative_amounts(mode: str) -> None:
    x = floats(1, 2, 4, 5)
    assert_exports_and_matches(Call(lambda t: torch.nn.functional.pad(t, (-1, 2, 1, -2), mode=mode)), (x,))


def test_linspace_and_cross_entropy_with_probabilities() -> None:
    assert_exports_and_matches(Call(lambda: torch.linspace(-2.0, 3, 7)), ())
    logits, target = floats(4, 5), torch.softmax(floats(4, 5) * 2, dim=1)
    loss = Call(lambda x, t: torch.nn.functional.cross_entropy(x, t, label_smoothing=0.1))
    assert_exports_and_matches(loss, (logits, target))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_order_statistics(dtype: torch.dtype) -> None:
    x = ints(3, 7, dtype=dtype, low=0, high=4)
    assert_exports_and_matches(Call(torch.median), (x,))
    assert_exports_and_matches(Call(lambda t: torch.median(t, 1).values), (x,))
    assert_exports_and_matches(Call(lambda t: torch.kthvalue(t, 3, 1).values), (x,))
    assert_exports_and_matches(Call(lambda t: tuple(torch.mode(t, 1))), (x,))  # ties: smallest value, last index
    with_nan = torch.tensor([[1.0, float("nan"), 3.0, 2.0], [4.0, 1.0, 2.0, 3.0]])
    assert_exports_and_matches(Call(lambda t: torch.nanmedian(t, 1).values), (with_nan,))
    assert_exports_and_matches(Call(lambda t: torch.median(t, 1).values), (with_nan,))


@pytest.mark.parametrize("dtype", [torch.int8, torch.float16])
def test_diagonal_nonzero_atleast(dtype: torch.dtype) -> None:
    x = ints(3, 4, 5, dtype=dtype)
    assert_exports_and_matches(Call(lambda t: torch.diagonal(t, 1, 2, 0)), (x,))
    assert_exports_and_matches(Call(lambda t: torch.diagonal(t, -2, 0, 1)), (x,))
    assert_exports_and_matches(Call(torch.nonzero), (torch.tensor(3).to(dtype),))
    assert_exports_and_matches(
        Call(lambda a, b: torch.hstack([a, b])), (torch.tensor(1).to(dtype), ints(3, dtype=dtype))
    )


def test_upsample_with_scale_factors() -> None:
    x = floats(1, 2, 5, 4)
    for mode in ("bilinear", "bicubic"):
        resize = Call(lambda t, mode=mode: torch.nn.functional.interpolate(t, scale_factor=1.7, mode=mode))
        assert_exports_and_matches(resize, (x,))
    assert_exports_and_matches(
        Call(lambda t: torch.nn.functional.interpolate(t, size=(3, 7), mode="bilinear", align_corners=True)), (x,)
    )


# Seed 10000622 (tests/fuzzing.py's wide catalogue): the median of no element is NaN in eager (NaN cast for an
# integer dtype: int32's minimum, int8's 0); the lowering's k-th smallest of an empty axis failed the checker.
@pytest.mark.parametrize("function", [torch.median, torch.nanmedian])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, torch.int32, torch.int64, torch.int8])
def test_median_of_an_empty_tensor(function: Callable[..., Any], dtype: torch.dtype) -> None:
    if function is torch.nanmedian and not dtype.is_floating_point:
        pytest.skip("nanmedian of an integer tensor is median")
    assert_exports_and_matches(Call(function), (torch.empty(0, 3, dtype=dtype),))


NAN, INF = float("nan"), float("inf")
FLOAT_EXTREMES = [NAN, INF, -INF, -0.0, 0.0, 1.5, NAN, 1.5, -2.5, 0.0, NAN, 1e-40]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_kthvalue_sorts_nan_after_inf(dtype: torch.dtype) -> None:
    """kthvalue takes NaN as larger than +inf (k=1 of [nan, inf, inf] is inf, k=3 of [3, nan, inf] NaN); the lowering
    took NaN as +inf, a tie TopK broke by index (fuzz seed 50003134: NaN where eager gave inf)."""
    columns = [[NAN, INF, INF], [NAN, NAN, INF], [3.0, NAN, INF], [NAN, 2.25, INF], [NAN, INF, 3.0], [1.0, -INF, NAN]]
    x = torch.tensor(columns, dtype=dtype).t()
    for k in (1, 2, 3):
        assert_exports_and_matches(Call(lambda t, k=k: torch.kthvalue(t, k, dim=0, keepdim=k == 2).values), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_unique_with_nans(dtype: torch.dtype) -> None:
    """Eager's unique keeps each NaN apart, after the sorted distinct values; ONNX Runtime's Unique keys a sorted map
    by value, which a NaN breaks ([nan, inf, -inf, ...] gave one entry, NaN, counted 12 times)."""
    x = torch.tensor(FLOAT_EXTREMES, dtype=dtype).reshape(3, 4)
    unique = Call(lambda x: torch.unique(x, return_inverse=True, return_counts=True))
    assert_exports_and_matches(unique, (x,))
    assert_exports_and_matches(unique, (x.nan_to_num(),))  # no NaN
    assert_exports_and_matches(Call(lambda x: torch.unique(x, return_counts=True)), (x[:, :0],))  # empty


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_lerp_chooses_its_form_by_the_weight_magnitude(dtype: torch.dtype) -> None:
    """Eager computes end - (end - self) * (1 - weight) where |weight| >= 0.5: lerp(-0.0, inf, -1) is NaN (torchlib
    tested weight < 0.5 and gave -inf)."""
    big = torch.finfo(dtype).max
    x = torch.tensor([NAN, INF, -INF, -0.0, 0.0, big, -big, 1e-3, 1.5, -2.5, -0.0, 3.0], dtype=dtype)
    end = torch.tensor([-0.0, NAN, 1.0, INF, -INF, -big, big, -1.0, 0.0, -1e-3, -0.0, 3.3], dtype=dtype)
    weight = torch.tensor([0.0, 0.5, 1.0, -1.0, 2.0, NAN, INF, 0.25, 0.75, -0.0, -0.25, -0.5], dtype=dtype)
    assert_exports_and_matches(Call(torch.lerp), (x, end, weight))
    for scalar in (-1.0, -0.5, 0.3, 0.5, 2.0):
        assert_exports_and_matches(Call(lambda x, end, scalar=scalar: torch.lerp(x, end, scalar)), (x, end))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_mode_of_a_slice_holding_nan(dtype: torch.dtype) -> None:
    """A NaN counts for nothing; it was also the filler of the non-modes (the slice's ReduceMax), so the mode came
    out NaN where eager's is the most frequent value (ties with NaN are left out: eager sorts NaNs with std::sort,
    whose order is then undefined)."""
    x = torch.tensor([NAN, INF, -INF, -0.0, 0.0, 1.5, NAN, 1.5, -2.5, 0.0, NAN, -0.0], dtype=dtype)
    assert_exports_and_matches(Call(lambda x: torch.mode(x).values), (x,))
    assert_exports_and_matches(Call(lambda x: torch.mode(x, 0).values), (x.reshape(12, 1).expand(12, 2).contiguous(),))


EMPTY_NORMALIZATION_SHAPES = [((0,), (0,)), ((2, 0), (0,)), ((0, 3), (3,)), ((2, 3, 0), (3, 0))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_layer_norm_of_no_element(dtype: torch.dtype) -> None:
    """Seed 10003335: layer_norm over an empty shape is the empty input (native_layer_norm: mean 0, rstd NaN per
    row); ONNX Runtime's LayerNormalization refuses a row of no element, which its LayerNormFusion also makes of
    the float64 ReduceMean pattern. Non-empty rows keep their LayerNormalization (extremes included)."""
    for shape, normalized in EMPTY_NORMALIZATION_SHAPES:
        x = torch.empty(shape, dtype=dtype)
        weight, bias = torch.ones(normalized, dtype=dtype), torch.zeros(normalized, dtype=dtype)
        layer_norm = Call(lambda x, w, b, n=normalized: torch.nn.functional.layer_norm(x, n, w, b, eps=1e-3))
        assert_exports_and_matches(layer_norm, (x, weight, bias))
        assert_exports_and_matches(Call(lambda x, n=normalized: torch.native_layer_norm(x, n, None, None, 1e-5)), (x,))
    big = torch.finfo(dtype).max ** 0.5 / 4  # the variance stays finite (an overflowing one: test_fuzz's seed 10002938)
    tiny = torch.finfo(dtype).tiny
    row = torch.tensor([[big, -big / 2, 0.0, -0.0], [1.0, 1.0, 1.0, 1.0], [tiny, -tiny, 0.0, tiny]], dtype=dtype)
    assert_exports_and_matches(Call(lambda x: torch.nn.functional.layer_norm(x, (4,))), (row,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_group_norm_of_no_element(dtype: torch.dtype) -> None:
    """Seeds 10003035, 10003059: group_norm of an input of no element (N 0, or a group of no element) is the input
    (native_group_norm: mean 0, rstd NaN per group); the Reshape to [0, groups, -1] failed the checker ('product
    cannot be 0 in combination with -1') and the Reshape back (its 0 copying a dim) failed at run time."""
    for shape, groups in [((0, 1), 1), ((0, 4, 3), 2), ((2, 4, 0), 2), ((2, 0), 1), ((1, 2, 0, 3), 1)]:
        x = torch.empty(shape, dtype=dtype)
        weight, bias = torch.ones(shape[1], dtype=dtype), torch.zeros(shape[1], dtype=dtype)
        group_norm = Call(lambda x, w, b, g=groups: torch.nn.functional.group_norm(x, g, w, b, eps=1e-3))
        size = (shape[0], shape[1], math.prod(shape[2:]))
        native = Call(lambda x, g=groups, size=size: torch.native_group_norm(x, None, None, *size, g, 1e-5))
        for call, inputs in ((group_norm, (x, weight, bias)), (native, (x,))):
            try:
                call(*inputs)
            except RuntimeError as error:  # torch 2.15 refuses some inputs of no element: no channel, H*W 0
                assert "to be greater than 0" in str(error) and not x.numel(), error
                continue
            assert_exports_and_matches(call, inputs)
    tiny = torch.finfo(dtype).tiny
    x = torch.tensor([[[tiny, -tiny], [0.0, -0.0]], [[1.0, 2.0], [3.0, 4.0]]], dtype=dtype)
    assert_exports_and_matches(Call(lambda x: torch.nn.functional.group_norm(x, 1)), (x,))


NONZERO_PATTERNS = [[1, 1, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0], [1, 0, 1, 1, 0, 1], [0, 1, 0, 0, 1, 0], [0, 0, 0, 1, 0, 0]]


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8]
)
@pytest.mark.parametrize("function", [torch.median, torch.nanmedian])
def test_median_over_a_dynamic_dim(function: Callable[..., Any], dtype: torch.dtype) -> None:
    """Seeds 10002397, 10003360, 20000045: the median of x[x != 0] (a data-dependent length) had no lowering. Over
    a dim (eager refuses one of size 0) the lower median's position is (length - 1) // 2 at run time; flattened,
    a filler that sorts last makes a length of 0 give eager's NaN (cast for integers)."""
    if dtype.is_floating_point:
        x = torch.tensor([2.5, NAN, -INF, INF, torch.finfo(dtype).max, -0.0], dtype=dtype)
    else:
        info = torch.iinfo(dtype)
        x = torch.tensor([info.max, info.min, 3, info.max, 1, info.min], dtype=dtype)
    runs = [((torch.where(torch.tensor(keep).bool(), x, torch.zeros_like(x)),), {}) for keep in NONZERO_PATTERNS]
    without_nan = ((x.nan_to_num(nan=1.0, posinf=INF, neginf=-INF) if dtype.is_floating_point else x,), {})
    nonzero_runs = [*runs, without_nan]
    assert_exports_and_matches(Call(lambda t: function(t[t != 0], 0)), (x,), run_with=nonzero_runs)
    assert_exports_and_matches(Call(lambda t: tuple(function(t[t != 0], 0, keepdim=True))), (x,), run_with=nonzero_runs)
    flat_runs = [*nonzero_runs, ((torch.zeros_like(x),), {})]  # no element: NaN
    assert_exports_and_matches(Call(lambda t: function(t[t != 0])), (x,), run_with=flat_runs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16])
def test_median_over_a_dim_of_dynamic_shape(dtype: torch.dtype) -> None:
    """dynamic_shapes makes the reduced dim symbolic: the median's position is computed at run time (sizes 1-5)."""
    x = torch.tensor([[3, -1, 7, 0], [2, 2, -5, 9]]).to(dtype)
    runs = [((torch.arange(2 * n).reshape(2, n).flip(1).to(dtype) % 3,), {}) for n in (1, 2, 3, 5)]
    dims = [({1: torch.export.Dim("n", min=1)},)]  # Call takes *args
    for keepdim in (False, True):
        median = Call(lambda t, k=keepdim: tuple(torch.median(t, 1, keepdim=k)))
        assert_exports_and_matches(median, (x,), run_with=[((x,), {}), *runs], dynamic_shapes=dims)
        flat = Call(lambda t: torch.median(t))
        assert_exports_and_matches(flat, (x,), run_with=[((x,), {}), *runs], dynamic_shapes=dims)


# Seed 20202016 (campaign of seeds 20200000 on): nanmedian sorted NaN as +inf, tied with a real +inf that TopK
# broke by index, so nanmedian([nan, inf]) took the NaN (index 0) where eager gives inf (index 1).
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_nanmedian_sorts_nan_after_inf(dtype: torch.dtype) -> None:
    # (no row of NaNs only: eager's index there comes from nth_element's shuffle, 2 of 5, 5 of 7)
    rows = [[NAN, INF, 1.0, NAN, NAN], [NAN, NAN, -INF, INF, NAN], [1.0, NAN, INF, NAN, INF], [NAN, INF, INF, 0, INF]]
    x = torch.tensor(rows, dtype=dtype)
    assert_exports_and_matches(Call(lambda t: tuple(torch.nanmedian(t, 1))), (x,))
    assert_exports_and_matches(Call(lambda t: tuple(torch.nanmedian(t, 0, keepdim=True))), (x[:, :2].T,))
    assert_exports_and_matches(Call(torch.nanmedian), (torch.tensor([NAN, INF, NAN], dtype=dtype),))
    assert_exports_and_matches(Call(lambda t: torch.nanmedian(t[t != 0])), (torch.tensor([NAN, 0, INF], dtype=dtype),))
