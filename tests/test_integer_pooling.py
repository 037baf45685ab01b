"""Max and average pooling of integer tensors export exactly (fx2onnx._lowerings.pooling, the integer variants).

Values run beyond 2**24 and 2**53 and include negatives and the dtype's extremes, so a lowering through float32 or
float64 would fail; windows cover padding, dilation, strides and ceil mode; indices cover ties.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import fx2onnx

from conftest import Call, assert_exports_and_matches

MAX_POOL_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]  # what eager's CPU kernels take
MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def full_range(shape: list[int], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random values over the dtype's whole range, with a few repeated maxima and both extremes planted."""
    generator = torch.Generator().manual_seed(seed)
    info = torch.iinfo(dtype)
    values = torch.randint(info.min, info.max, shape, dtype=dtype, generator=generator)
    flat = values.view(-1)
    flat[::7] = info.max  # ties: several windows see the same maximum more than once
    flat[3::11] = info.min
    return values


def exports_exactly(
    function: Callable[[torch.Tensor], Any], x: torch.Tensor, *others: torch.Tensor, **options: Any
) -> fx2onnx.ONNXProgram:
    """assert_exports_and_matches on `x` (and `others`), then every output compared bit for bit with eager.

    (``ONNXProgram.verify`` compares in float64, which cannot tell int64 values apart beyond 2**53.)
    """
    inputs = [x, *others]
    program = assert_exports_and_matches(Call(function), (x,), run_with=[((i,), {}) for i in inputs], **options)
    for value in inputs:
        expected = function(value)
        expected = list(expected) if isinstance(expected, tuple) else [expected]
        actual = program(value)
        assert len(actual) == len(expected)
        for index, (want, got) in enumerate(zip(expected, actual)):
            assert got.dtype == want.dtype and got.shape == want.shape, f"output {index}: {got.dtype} {got.shape}"
            assert torch.equal(got, want), f"output {index}: {int((got != want).sum())} elements differ from eager"
    return program


def chosen(program: fx2onnx.ONNXProgram, target: str) -> str:
    """The name of the implementation the dispatcher chose for the (one) node of `target`."""
    (name,) = [d.chosen.implementation.name for d in program.report.decisions if d.target == target]
    return name


# --- max pooling --------------------------------------------------------------------------------------------------
MAX_POOL_CASES = [  # (spatial dims, input spatial shape, keyword arguments)
    (1, [9], dict(kernel_size=3, stride=2, padding=1)),
    (1, [8], dict(kernel_size=3, stride=2, dilation=2, ceil_mode=True)),
    (2, [7, 8], dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (2, [6, 7], dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1), dilation=(2, 1))),
    (3, [4, 5, 6], dict(kernel_size=(2, 3, 2), stride=(2, 1, 2), padding=(1, 1, 0), ceil_mode=True)),
    (3, [5, 5, 4], dict(kernel_size=2, dilation=(2, 1, 1))),
]


@pytest.mark.parametrize("dtype", MAX_POOL_DTYPES, ids=str)
@pytest.mark.parametrize("spatial, sizes, kwargs", MAX_POOL_CASES)
def test_max_pool_with_indices_matches_eager(
    dtype: torch.dtype, spatial: int, sizes: list[int], kwargs: dict[str, Any]
) -> None:
    x = full_range([2, 3, *sizes], dtype)
    program = exports_exactly(lambda x: MAX_POOL[spatial](x, return_indices=True, **kwargs), x)
    assert chosen(program, f"aten::max_pool{spatial}d_with_indices").startswith("fx2onnx:max_pool")


MAX_POOL_VALUE_CASES = [  # (leading dims: batched or not, keyword arguments)
    ([2, 3], dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ([3], dict(kernel_size=2, stride=1, padding=1, dilation=2)),
]


@pytest.mark.parametrize("dtype", MAX_POOL_DTYPES, ids=str)
@pytest.mark.parametrize("spatial", [2, 3])
@pytest.mark.parametrize("leading, kwargs", MAX_POOL_VALUE_CASES)
def test_max_pool_matches_eager(dtype: torch.dtype, spatial: int, leading: list[int], kwargs: dict[str, Any]) -> None:
    x = full_range([*leading, *[7, 6, 5][:spatial]], dtype, seed=1)
    program = exports_exactly(lambda x: MAX_POOL[spatial](x, **kwargs), x)
    assert chosen(program, f"aten::max_pool{spatial}d") == f"fx2onnx:max_pool{spatial}d_int"


def test_max_pool_of_values_float64_cannot_hold() -> None:
    """Neighbours 1 apart above 2**53 (unbatched input): any float path rounds them together."""
    base = 2**62 + 1
    x = (base + torch.arange(60, dtype=torch.int64) * (-1) ** torch.arange(60)).reshape(3, 4, 5)
    exports_exactly(lambda x: F.max_pool2d(x, 2, stride=1, return_indices=True), x)
    exports_exactly(lambda x: F.max_pool2d(x - 2**62, 2, stride=1, padding=1), x)


def test_max_pool_ties_pick_the_first_maximum_in_scan_order() -> None:
    x = torch.tensor([[[[1, 3, 3, 0], [3, 2, 3, 3], [0, 3, 1, 3]]]], dtype=torch.int64) * 2**55 + 1
    exports_exactly(lambda x: F.max_pool2d(x, 3, stride=1, padding=1, return_indices=True), x)
    exports_exactly(
        lambda x: F.max_pool2d(x, 2, stride=1, padding=1, dilation=2, ceil_mode=True, return_indices=True), x
    )


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8], ids=str)
def test_max_pool_of_the_dtype_minimum_points_inside_the_input(dtype: torch.dtype) -> None:
    """Windows of only the dtype's minimum (the padding's value too): eager's index is the first one in the input."""
    lowest = torch.iinfo(dtype).min
    x = torch.full((1, 2, 5, 5), lowest, dtype=dtype)
    x[0, 1, 4, 4] = lowest + 1
    exports_exactly(lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, return_indices=True), x)
    exports_exactly(
        lambda x: F.max_pool3d(x, (1, 2, 2), stride=2, padding=(0, 1, 1), dilation=2, return_indices=True), x
    )


def test_max_pool1d_without_indices() -> None:
    """Eager's CPU max_pool1d refuses integers but torch.export captures it: compare with the indexed kernel."""
    x = full_range([2, 3, 11], torch.int64, seed=2)
    program = fx2onnx.export(Call(lambda x: F.max_pool1d(x, 3, stride=2, padding=1, ceil_mode=True)), (x,))
    expected, _ = F.max_pool1d(x, 3, stride=2, padding=1, ceil_mode=True, return_indices=True)
    (result,) = program(x)
    assert result.dtype == expected.dtype and torch.equal(result, expected)


# --- average pooling ----------------------------------------------------------------------------------------------
AVG_POOL_CASES = [  # (spatial dims, input spatial shape, keyword arguments)
    (1, [9], dict(kernel_size=3, stride=2, padding=1)),
    (1, [10], dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    (1, [10], dict(kernel_size=4, stride=3, padding=2, ceil_mode=True)),
    (2, [7, 8], dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    (2, [7, 8], dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), ceil_mode=True, count_include_pad=False)),
    (2, [6, 7], dict(kernel_size=(2, 3), stride=1, padding=(1, 0), divisor_override=4)),
    (2, [6, 6], dict(kernel_size=2, divisor_override=-3)),
    (3, [4, 5, 6], dict(kernel_size=(2, 3, 2), stride=2, padding=(1, 1, 0), ceil_mode=True)),
    (3, [5, 4, 5], dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    (3, [4, 4, 4], dict(kernel_size=2, stride=1, divisor_override=7)),
]


@pytest.mark.parametrize("spatial, sizes, kwargs", AVG_POOL_CASES)
def test_avg_pool_matches_eager(spatial: int, sizes: list[int], kwargs: dict[str, Any]) -> None:
    """int64 window sums beyond 2**53, negative too, divided with eager's truncation toward zero."""
    x = torch.randint(-(2**59), 2**59, [2, 3, *sizes], generator=torch.Generator().manual_seed(spatial))
    program = exports_exactly(lambda x: AVG_POOL[spatial](x, **kwargs), x)
    assert chosen(program, f"aten::avg_pool{spatial}d") == f"fx2onnx:avg_pool{spatial}d_int"


def test_avg_pool_truncates_negative_quotients() -> None:
    """Small sums with remainders of both signs: -13 / 2 is -6 in eager (truncation), not -7 (floor)."""
    x = torch.tensor([[[-7, -6, 7, 6, -1, 0, -5, 2, 3]]])
    for kwargs in (
        dict(kernel_size=2),
        dict(kernel_size=4, stride=1),
        dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
        dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    ):
        exports_exactly(lambda x, kwargs=kwargs: F.avg_pool1d(x, **kwargs), x)
    exports_exactly(lambda x: F.avg_pool2d(x, (1, 2), divisor_override=-4), x)


def test_avg_pool_sums_wrap_as_eager() -> None:
    """Window sums past int64's range wrap around in eager's kernel, and here."""
    x = torch.tensor([[[2**62, 2**62, 2**62, -(2**62), 2**63 - 1, 2**63 - 1]]])
    exports_exactly(lambda x: F.avg_pool1d(x, 3, stride=1), x)


# --- what the integer lowerings leave alone -------------------------------------------------------------------------
def test_float_inputs_keep_their_lowerings() -> None:
    x = torch.randn(2, 3, 7, 8)
    program = assert_exports_and_matches(Call(lambda x: F.max_pool2d(x, 3, stride=2, return_indices=True)), (x,))
    # floats with indices: eager's scan (NaN, padding-only windows), not ONNX Runtime's MaxPool (test_nn_lowerings)
    assert chosen(program, "aten::max_pool2d_with_indices") == "fx2onnx:max_pool2d_with_indices_float"
    program = assert_exports_and_matches(Call(lambda x: F.avg_pool2d(x, 3, stride=2, ceil_mode=True)), (x,))
    assert chosen(program, "aten::avg_pool2d") == "fx2onnx:avg_pool"


def test_dynamic_spatial_dims_are_refused_clearly() -> None:
    x = torch.randint(-(2**40), 2**40, (2, 3, 8, 8))
    width = torch.export.Dim("width", min=4, max=64)
    with pytest.raises(fx2onnx.LoweringError, match="needs static spatial dims"):
        fx2onnx.export(Call(lambda x: F.max_pool2d(x, 2, return_indices=True)), (x,), dynamic_shapes=(({3: width},),))


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8])
def test_max_pool_over_dynamic_spatial_dims(dtype: torch.dtype) -> None:
    """Without indices, ceil mode or int64, the spatial sizes may be known at run time only (a data-dependent count
    of rows: the open fuzzer finding, refused before): float64 MaxPool, padded with the dtype's minimum."""
    x = full_range([2, 3, 9, 8], dtype)
    width, height = torch.export.Dim("width", min=4, max=64), torch.export.Dim("height", min=4, max=64)
    others = [full_range([2, 3, 5, 11], dtype, seed=1), full_range([2, 3, 4, 4], dtype, seed=2)]
    for function in (
        lambda v: F.max_pool2d(v, 2),
        lambda v: F.max_pool2d(v, 3, stride=2, padding=1, dilation=1),
        lambda v: F.max_pool2d(v, (2, 3), stride=1, padding=(1, 1), dilation=2),
    ):
        exports_exactly(function, x, *others, dynamic_shapes=(({2: height, 3: width},),))

    def selected(v: torch.Tensor) -> torch.Tensor:  # rows of a data-dependent count
        return F.max_pool2d(v[v.sum(-1, dtype=torch.int64) > 0][None], 2, stride=1, padding=1)

    rows = full_range([6, 4], dtype, seed=3)
    exports_exactly(selected, rows, full_range([6, 4], dtype, seed=4))


def test_dynamic_batch_is_fine() -> None:
    x = torch.randint(-(2**60), 2**60, (2, 3, 7, 8))
    batch = torch.export.Dim("batch")
    other = torch.randint(-(2**60), 2**60, (5, 3, 7, 8))
    for function in (
        lambda x: F.max_pool2d(x, 3, stride=2, padding=1, return_indices=True),
        lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    ):
        exports_exactly(function, x, other, dynamic_shapes=(({0: batch},),))
