"""Integer inputs of rounding, float classification, matrix products and weighted cov stay exact.

torchlib computes these ops in float, so integers went through a Cast to float32 (or float64): rounded
above 2**24 (2**53), and unable to wrap around on overflow as eager's integer arithmetic does. Every
check here compares the ONNX Runtime results with eager's bit for bit (``program.verify`` compares in
float64, which cannot tell 2**60 from 2**60 + 1), and asserts that no input was cast to a float type.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import fx2onnx
from fx2onnx.errors import LoweringError

from conftest import Call, assert_exports_and_matches

F = torch.nn.functional
ROUNDING_DTYPES = [
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64,
]  # fmt: skip
MATMUL_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]  # what eager's CPU products take


def assert_exact(model: torch.nn.Module, args: tuple[Any, ...], **options: Any) -> fx2onnx.ONNXProgram:
    """Export and verify as every test does, then demand eager's dtypes and values exactly, with no dispatch Cast."""
    program = assert_exports_and_matches(model, args, **options)
    for call_args, _ in options.get("run_with") or [(args, {})]:
        with torch.no_grad():
            expected = model(*call_args)
        expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
        actual = program(*call_args)
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            assert got.dtype == want.dtype, f"output {index}: {got.dtype} != {want.dtype}"
            assert torch.equal(got, want), f"output {index} differs:\n{got}\n!=\n{want}"
    # Integer widening (int8 -> int32 for MatMul) wraps alike; a Cast to a float type is what rounded.
    to_float = [c for c in program.report.casts if c.reason == "dispatch" and c.to_dtype.startswith(("f", "bf"))]
    assert not to_float, f"Casts to a float type to fit an implementation: {to_float}"
    return program


def chosen(program: fx2onnx.ONNXProgram) -> dict[str, str]:
    return {d.target: d.chosen.implementation.name for d in program.report.decisions if d.chosen is not None}


def extremes(dtype: torch.dtype) -> torch.Tensor:
    """The dtype's limits and values a float32/float64 Cast would round: 2**24 + 1, 2**53 + 1, ..."""
    info = torch.iinfo(dtype)
    candidates = [info.min, info.min + 1, -(2**60) - 1, -(2**53) - 1, -(2**24) - 1, -3, -1, 0, 1, 7, 2**24 + 1]
    candidates += [2**31 - 1, 2**53 + 1, 2**60 + 3, info.max - 1, info.max]
    values = sorted({v for v in candidates if info.min <= v <= info.max})
    return torch.tensor(values, dtype=dtype).reshape(1, -1).repeat(2, 1)


# --- rounding --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ROUNDING_DTYPES, ids=str)
def test_rounding_an_integer_keeps_it(dtype: torch.dtype) -> None:
    program = assert_exact(
        Call(lambda x: (torch.ceil(x), torch.floor(x), torch.round(x), torch.trunc(x))), (extremes(dtype),)
    )
    assert {chosen(program)[f"aten::{name}"] for name in ("ceil", "floor", "round", "trunc")} == {
        "fx2onnx:round_integer"
    }


def test_round_with_decimals_is_refused_for_integers_as_in_eager() -> None:
    model = Call(lambda x: torch.round(x, decimals=2))
    x = torch.tensor([2**53 + 1, -7])
    with pytest.raises(NotImplementedError, match="round_cpu"):
        model(x)  # eager has no integer kernel for it
    with pytest.raises(LoweringError, match=r"aten::round\.decimals[\s\S]*decimals=2[\s\S]*int64"):
        fx2onnx.export(model, (x,))


# --- isfinite & co. ------------------------------------------------------------------------------------------------
def classify(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.isfinite(x), torch.isinf(x), torch.isnan(x), torch.isneginf(x), torch.isposinf(x)


@pytest.mark.parametrize("dtype", [torch.bool, *ROUNDING_DTYPES], ids=str)
def test_integers_and_bools_are_finite(dtype: torch.dtype) -> None:
    x = extremes(dtype) if dtype != torch.bool else torch.tensor([[True, False, True]])
    program = assert_exact(Call(classify), (x,))
    assert "torchlib" not in " ".join(chosen(program).values())


def test_classification_follows_a_dynamic_shape() -> None:
    batch, width = torch.export.Dim("batch"), torch.export.Dim("width")
    x = torch.arange(12, dtype=torch.int64).reshape(3, 4) + 2**53
    other_shapes = [torch.zeros(5, 2, dtype=torch.int64), torch.full((1, 7), -(2**62), dtype=torch.int64)]
    assert_exact(
        Call(classify),
        (x,),
        dynamic_shapes={"args": ({0: batch, 1: width},)},
        run_with=[((x,), {})] + [((y,), {}) for y in other_shapes],
    )


# --- matrix products -------------------------------------------------------------------------------------------------
def products(a: torch.Tensor, b: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """a, b: (2, 3, 3) batches; v: (3,)."""
    m = a[0]
    return (
        torch.bmm(a, b),
        torch.dot(v, m[1]),
        F.linear(a, m, v),
        F.linear(m, b[1]),
        F.linear(m, v),  # a 1-D weight: one output feature
        torch.mm(m, b[0]),
        torch.matmul(a, m),
        torch.mv(m, v),
        torch.addmm(m, a[1], b[1]),
        torch.baddbmm(a, a, b),
    )


def full_range(dtype: torch.dtype, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, dtype=dtype, generator=generator)


@pytest.mark.parametrize("dtype", MATMUL_DTYPES, ids=str)
def test_integer_products_wrap_around_as_in_eager(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    args = (full_range(dtype, (2, 3, 3), generator), full_range(dtype, (2, 3, 3), generator))
    args += (full_range(dtype, (3,), generator),)
    runs = [(args, {})]
    if dtype == torch.int64:  # sums of products above 2**53 that do not overflow: float64 would round them
        big = [torch.randint(2**29, 2**30, t.shape, generator=generator) * 2 + 1 for t in args]
        runs.append((tuple(big), {}))
    program = assert_exact(Call(products), args, run_with=runs)
    names = chosen(program)
    assert {names[f"aten::{op}"] for op in ("bmm", "dot", "linear")} == {
        "fx2onnx:bmm_integer",
        "fx2onnx:dot_integer",
        "fx2onnx:linear_integer",
    }


@pytest.mark.parametrize("dtype", MATMUL_DTYPES, ids=str)
def test_threshold_keeps_integers_and_converts_its_numbers_as_eager(dtype: torch.dtype) -> None:
    """F.threshold of an integer tensor compares and selects in its dtype, the numbers converted toward zero
    (threshold -0.5 is 0): torch's decomposition went through float32 and gave int32's 2**31 - 1 back as -2**31
    (fuzz catalogue from 40,000,000: piecewise activations)."""
    numbers = [(0.5, 2.0), (3, 2.7)] + ([(-0.5, 7)] if dtype != torch.uint8 else [])  # (eager refuses -0.5 on uint8)
    for threshold, value in numbers:
        program = assert_exact(Call(lambda x, t=threshold, v=value: F.threshold(x, t, v)), (extremes(dtype),))
        assert chosen(program)["aten::threshold"] == "fx2onnx:threshold_integer"


def test_float_inputs_keep_torchlib() -> None:
    """The integer lowerings do not take floats: float nodes dispatch as before."""
    generator = torch.Generator().manual_seed(1)
    a, b, v = torch.randn(2, 3, 3, generator=generator), torch.randn(2, 3, 3, generator=generator), torch.randn(3)

    def model(a: torch.Tensor, b: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (*products(a, b, v), torch.ceil(a), torch.round(a), *classify(a))

    program = assert_exports_and_matches(Call(model), (a, b, v))
    names = chosen(program)
    for op in ("bmm", "dot", "linear", "ceil", "round", "isfinite", "isnan"):
        assert names[f"aten::{op}"].startswith("torchlib:"), (op, names[f"aten::{op}"])
    # float isinf/isposinf/isneginf are fx2onnx's own (torchlib's went through float32: 1e300 was inf in float64)
    for op in ("isinf", "isneginf", "isposinf"):
        assert names[f"aten::{op}"] in (f"fx2onnx:{op}", f"torchlib:{op}"), (op, names[f"aten::{op}"])
        assert "integer" not in names[f"aten::{op}"], (op, names[f"aten::{op}"])


# --- weighted covariance -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8], ids=str)
def test_cov_with_float_weights_computes_in_their_dtype(dtype: torch.dtype) -> None:
    """Eager multiplies the integers by the float weights first, so they are rounded to the weights' dtype.

    Odd values just above 2**24 become even in float32: eager's covariance of [2**24 + 1, 2**24 + 3] with
    float32 weights is that of [2**24, 2**24 + 4] (8, not 2).
    """
    base = 2**24 if dtype != torch.uint8 else 0
    x = torch.tensor([[base + 1, base + 3], [base + 7, base + 1]]).to(dtype)
    weights = torch.tensor([1.0, 1.0])
    expected = torch.cov(x, aweights=weights)
    if dtype != torch.uint8:
        assert expected[0, 0] == 8.0, "eager no longer rounds the integers to float32; revisit the lowering"
    model = Call(lambda x, w, f: torch.cov(x, aweights=w, fweights=f))
    program = assert_exact(model, (x, weights, torch.tensor([1, 1])))
    assert chosen(program)["aten::cov"] == "fx2onnx:cov_integer_weighted"


# uint8 resizes: eager resizes the width, rounds half up and saturates, then the height (core._resize_uint8).
@pytest.mark.parametrize(
    "options",
    [
        {"scale_factor": 2, "mode": "bicubic"},
        {"size": (5, 7), "mode": "bicubic", "align_corners": True},
        {"scale_factor": 2, "mode": "bilinear"},
        {"size": (40, 24), "mode": "bilinear", "align_corners": True},
        {"scale_factor": 3, "mode": "bilinear"},
    ],
    ids=str,
)
def test_uint8_resize_is_eagers(options: dict[str, Any]) -> None:
    """Bit for bit (exact comparison); in one float pass cast back, a bicubic upscale's overshoots wrapped
    (-4 became 252) and bilinear ties rounded the other way."""
    torch.manual_seed(0)
    x = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    x[0, 0, 4:8, 4:8] = 255  # sharp edges: bicubic overshoots below 0 and above 255 around them
    assert_exports_and_matches(Call(lambda t: torch.nn.functional.interpolate(t, **options)), (x,))


def test_uint8_downscale_is_at_most_one_off() -> None:
    """Non-integer downscales: eager's fixed-point weights round a few percent of pixels the other way."""
    torch.manual_seed(0)
    x = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    model = Call(lambda t: torch.nn.functional.interpolate(t, size=(7, 9), mode="bilinear"))
    (actual,) = fx2onnx.export(model, (x,))(x)
    difference = (actual.int() - model(x).int()).abs()
    assert actual.dtype == torch.uint8 and int(difference.max()) <= 1 and difference.float().mean() < 0.1


@pytest.mark.parametrize("dtype", [torch.bool, torch.int16, torch.uint8])
def test_bitwise_operator_spellings(dtype: torch.dtype) -> None:
    """aten::__and__/__or__/__xor__ and prims::bitwise_*, which decompositions leave in graphs."""
    aten, prims = torch.ops.aten, torch.ops.prims
    x, y = (torch.randint(0, 2 if dtype == torch.bool else 100, (12,)).to(dtype) for _ in range(2))
    model = Call(
        lambda a, b: (
            aten.__and__.Tensor(a, b),
            aten.__or__.Tensor(a, b),
            aten.__xor__.Tensor(a, b),
            prims.bitwise_and(a, b),
            prims.bitwise_or(a, b),
            prims.bitwise_xor(a, b),
        )
    )
    assert_exports_and_matches(model, (x, y))
