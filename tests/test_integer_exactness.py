"""Integer arithmetic exact over the whole range of each dtype, and eager's float edge values, in a default session.

Every check exports, runs in ONNX Runtime (default session options) and compares with eager bit for bit: dtype,
shape and every value (NaN where eager has NaN), at each dtype's limits and above 2**24 and 2**53, where a detour
through float32/float64 rounds. docs/integer-audit.md lists every lowering that casts an integer tensor to a float
type, and what became of it.

Before these lowerings (same inputs): int32/int64 ``div(rounding_mode="floor"|"trunc")`` went through float32 (int32
-2**31 // 7 off by 13, int64 off by up to 2**39); integer ``pow`` through ONNX Runtime's double Pow (int8 3 ** 100
gave 0, eager -47; int64 0 ** -3 gave INT64_MIN, eager 0); ``<<``/``>>`` on tensors failed to export; int32
``cumsum``/``cumprod`` added in int32 (eager: int64); int64 ``sum`` went through ONNX Runtime's double ReduceSum
(2**53 + 1 summed to 2**53) and ``prod`` saturated at INT64_MAX where eager wraps; ``int % 0.001`` and float
``remainder`` lost the remainder of large values (-128 % 0.001 gave 0, eager 6.08e-06); ``inf // 2`` gave inf (eager
NaN); ``sign(NaN)`` NaN (eager 0); ``mean`` over an empty dim 0 (eager NaN), ``any`` of nothing True (eager False);
integer ``scatter_reduce``/``index_reduce`` means divided in float64 (int64 above 2**53 rounded) and int8
``index_reduce`` did not wrap its sum as eager does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import fx2onnx
from fx2onnx.errors import LoweringError

from conftest import Call, assert_exports_and_matches

INTEGERS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def same_values(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal dtype, shape and values, NaN matching NaN."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if not want.is_floating_point():
        return torch.equal(got, want)
    both_nan = got.isnan() & want.isnan()
    return bool(((got == want) | both_nan).all())


def assert_exact(function: Callable[..., Any], args: tuple[Any, ...], **options: Any) -> fx2onnx.ONNXProgram:
    """Export, verify as every test does, then demand eager's outputs exactly."""
    model = Call(function)
    program = assert_exports_and_matches(model, args, **options)
    for call_args, _ in options.get("run_with") or [(args, {})]:
        with torch.no_grad():
            expected = model(*call_args)
        expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
        actual = program(*call_args)
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            differ = ~((got == want) | (got.isnan() & want.isnan())) if want.is_floating_point() else got != want
            where = differ.nonzero()[:4].tolist() if got.shape == want.shape else "shape"
            assert same_values(got, want), (
                f"output {index}: {got.dtype}{list(got.shape)} vs eager {want.dtype}{list(want.shape)}; "
                f"differs at {where}:\n{got}\n!=\n{want}"
            )
    return program


def extremes(dtype: torch.dtype) -> list[int]:
    """The dtype's limits, values near 2**24, 2**31, 2**53 and 2**60 that it holds, small values, their negatives."""
    info = torch.iinfo(dtype)
    candidates = [info.min, info.min + 1, -(2**60) - 1, -(2**53) - 1, -(2**24) - 1, -123456789, -7, -3, -2, -1]
    candidates += [0, 1, 2, 3, 7, 2**24 + 1, 123456789, 2**31 - 1, 2**53 + 1, 2**60 + 3, info.max - 1, info.max]
    return sorted({v for v in candidates if info.min <= v <= info.max})


def all_pairs(dtype: torch.dtype, *, divisors: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (a, b) of extreme values; as divisors, b != 0 and not min / -1 (eager's kernel traps on both)."""
    values = extremes(dtype)
    pairs = [(a, b) for a in values for b in values]
    if divisors:
        pairs = [(a, b) for a, b in pairs if b != 0 and not (a == torch.iinfo(dtype).min and b == -1)]
    a, b = zip(*pairs, strict=True)
    return torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)


# --- division, remainder ---------------------------------------------------------------------------------------------
def divisions(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        torch.div(a, b, rounding_mode="floor"),
        torch.div(a, b, rounding_mode="trunc"),
        torch.floor_divide(a, b),
        a % b,
        torch.fmod(a, b),
    )


def divisions_by_numbers(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        torch.div(a, -2, rounding_mode="floor"),
        torch.div(a, 7, rounding_mode="floor"),
        torch.div(a, -7, rounding_mode="trunc"),
        a // -3,
        a % -7,
        torch.fmod(a, 3),
    )


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_integer_division_is_exact_at_the_extremes(dtype: torch.dtype) -> None:
    program = assert_exact(divisions, all_pairs(dtype, divisors=True))
    casts = [c for c in program.report.casts if c.to_dtype.startswith(("f", "bf"))]
    assert not casts, f"integer division through a float type: {casts}"


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_integer_division_by_a_number_is_exact(dtype: torch.dtype) -> None:
    values = [v for v in extremes(dtype) if dtype == torch.uint8 or v != torch.iinfo(dtype).min]
    model = (
        divisions_by_numbers
        if dtype != torch.uint8
        else (lambda a: (a // 3, a % 7, torch.div(a, 7, rounding_mode="trunc")))
    )
    assert_exact(model, (torch.tensor(values, dtype=dtype),))


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_integer_remainder_of_a_float_number_matches_eager(dtype: torch.dtype) -> None:
    """int % 0.001 computes in float32 (promotion) from fmod, as eager does: -128 % 0.001 is 6.08e-06, not 0."""
    assert_exact(lambda a: (a % 0.001, a % 7.5, a % -0.25), (torch.tensor(extremes(dtype), dtype=dtype),))


def divisions_of_the_empty(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The divisions by a tensor, and by a number (a constant divisor: nothing to guard)."""
    return (*divisions(a, b), a % b[..., :1].sum(), torch.fmod(a, 5))


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
@pytest.mark.parametrize("divisor_shape", [(4,), (1, 4), (3, 1, 4)], ids=str)
def test_empty_tensor_divided_by_a_tensor_holding_zero_is_empty_as_in_eager(
    dtype: torch.dtype, divisor_shape: tuple[int, ...]
) -> None:
    """An empty dividend by a divisor holding a zero: eager gives an empty tensor, ONNX Runtime's Div/Mod stopped the
    run ("Integer modulo by zero"; fuzz seed 36028, `topk(x, 0).values % y`). The dividend's first dim is dynamic
    (empty at run time, not at export), and statically empty; a non-empty dividend divides by non-zero divisors
    (eager raises ZeroDivisionError at a zero) exactly, the dtype's extremes included."""
    info = torch.iinfo(dtype)
    divisor = torch.tensor([0, info.min if info.min else 3, info.max, 1], dtype=dtype).expand(divisor_shape)
    nonzero = torch.tensor([info.max, 7, -2 if info.min else 3, 1], dtype=dtype).expand(divisor_shape)
    divisor, nonzero = divisor.contiguous(), nonzero.contiguous()
    empty, dividend = torch.empty(0, 4, dtype=dtype), torch.tensor((extremes(dtype) * 2)[:12], dtype=dtype).view(3, 4)
    dynamic = {"args": ({0: torch.export.Dim("rows", min=0)}, None)}
    runs = [((empty, divisor), {}), ((dividend, nonzero), {})]
    assert_exact(divisions_of_the_empty, (dividend, nonzero), dynamic_shapes=dynamic, run_with=runs)
    assert_exact(divisions_of_the_empty, (empty, divisor))


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_divisions_of_a_static_non_empty_tensor_add_no_guard(dtype: torch.dtype) -> None:
    """A dividend of static non-empty shape by a zero raises in eager: its Div/Mod gets the divisor as it is (the
    zero guard, Equal + Where on the divisor, is emitted only where the dividend may be empty)."""
    a, b = all_pairs(dtype, divisors=True)
    program = assert_exact(lambda a, b: (a % b, torch.fmod(a, b)), (a, b))
    assert not [node for node in program.model.graph if node.op_type == "Where"]


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64], ids=str)
def test_floor_division_and_remainder_of_the_minimum_by_minus_one_follow_eager(dtype: torch.dtype) -> None:
    """INT_MIN // -1 is INT_MIN in eager (wrapping) and INT_MIN % -1 is 0; ONNX Runtime's int32/int64 Div traps
    there (SIGFPE: the process died). By a tensor, a number, and a constant tensor holding -1."""
    info = torch.iinfo(dtype)
    a = torch.tensor([info.min, info.min, info.max, -7, 7, info.min, 0], dtype=dtype)
    b = torch.tensor([-1, -1, -1, -1, -1, 3, -1], dtype=dtype)
    constant = torch.tensor([-1, 2, -1, -3, -1, 1, -1], dtype=dtype)

    def floor_divisions(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.floor_divide(a, b),
            torch.div(a, b, rounding_mode="floor"),
            a % b,
            torch.fmod(a, b),
            a // -1,
            torch.div(a, -1, rounding_mode="floor"),
            a // constant,
            a % -1,
            torch.fmod(a, -1),
        )

    assert_exact(floor_divisions, (a, b))
    length = torch.export.Dim("n")
    assert_exact(floor_divisions, (a, b), dynamic_shapes={"args": ({0: length}, {0: length})})


# --- powers ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_integer_powers_wrap_around_as_in_eager(dtype: torch.dtype) -> None:
    signed = dtype != torch.uint8
    bases = torch.tensor([3, 2, -3, -1, 0, 1, 7, -128, 127] if signed else [3, 2, 0, 1, 7, 128, 255], dtype=dtype)
    exponents = torch.tensor([40, 63, 20, 30, 5, 0, 17, 2, 3] if signed else [40, 63, 20, 30, 5, 2, 255], dtype=dtype)
    program = assert_exact(
        lambda x, e: (x**100, x**0, x**1, x**7, x**e, 3**e, (-2) ** e if signed else 2**e), (bases, exponents)
    )
    assert not [c for c in program.report.casts if c.to_dtype.startswith(("f", "bf"))]


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64], ids=str)
def test_integer_powers_with_negative_exponents_follow_eager(dtype: torch.dtype) -> None:
    """1 ** -n = 1, (-1) ** -n = +-1 by parity, anything else ** -n = 0 (0 ** -3 included: ONNX Runtime said
    INT64_MIN)."""
    bases = torch.tensor([0, 1, -1, -1, 2, -2, 3, 0, 100], dtype=dtype)
    exponents = torch.tensor([-3, -2, -3, -4, -1, -2, -5, -128, -127], dtype=dtype)
    assert_exact(lambda x, e: x**e, (bases, exponents))


def test_integer_tensor_to_a_negative_number_is_refused_as_in_eager() -> None:
    x = torch.tensor([2, 3])
    with pytest.raises(RuntimeError, match="negative integer powers"):
        x**-2
    with pytest.raises(LoweringError, match=r"aten::pow\.Tensor_Scalar[\s\S]*negative integer powers"):
        fx2onnx.export(Call(lambda t: t**-2), (x,))


# --- shifts and bitwise ops ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_shifts_follow_eager_for_every_amount(dtype: torch.dtype) -> None:
    """Amounts below 0 or of the bit width and more: 0 to the left, the sign fill to the right."""
    bits = torch.iinfo(dtype).bits
    amounts = [0, 1, 3, bits - 2, bits - 1, bits, bits + 1, 70, 127] + (
        [-1, -3, -100] if dtype != torch.uint8 else [200]
    )
    amounts = [s for s in amounts if torch.iinfo(dtype).min <= s <= torch.iinfo(dtype).max]
    values = extremes(dtype)
    a = torch.tensor([v for v in values for _ in amounts], dtype=dtype)
    s = torch.tensor([k for _ in values for k in amounts], dtype=dtype)
    assert_exact(
        lambda x, k: (
            x << k,
            x >> k,
            torch.bitwise_left_shift(x, k),
            torch.bitwise_right_shift(x, k),
            x << 3,
            x >> 3,
            x << (bits - 1),
            x >> (bits - 1),
        ),
        (a, s),
    )


@pytest.mark.parametrize("dtype", INTEGERS, ids=str)
def test_bitwise_ops_abs_and_neg_at_the_extremes(dtype: torch.dtype) -> None:
    """abs and neg of the dtype's minimum wrap to the minimum, as in eager."""
    assert_exact(lambda a, b: (a & b, a | b, a ^ b, ~a, torch.abs(a), -a, torch.sign(a)), all_pairs(dtype))


# --- sums and products ------------------------------------------------------------------------------------------
def accumulations(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """x: (2, n). Eager accumulates integers and bools in int64 unless told otherwise."""
    return (
        x.sum(),
        x.sum(1),
        x.sum((0, 1), keepdim=True),
        x.prod(),
        x.prod(1),
        x.prod(0, keepdim=True),
        torch.cumsum(x, 1),
        torch.cumprod(x, 1),
        torch.cumsum(x, 0, dtype=x.dtype if x.dtype != torch.bool else torch.int32),
        torch.cumprod(x, 1, dtype=torch.int64),
        x.sum(1, dtype=torch.int32),
    )


@pytest.mark.parametrize("dtype", [torch.bool, *INTEGERS], ids=str)
def test_sums_and_products_accumulate_in_int64_and_wrap(dtype: torch.dtype) -> None:
    if dtype == torch.bool:
        x = torch.tensor([[True, False, True, True], [True, True, True, True]])
    else:
        row = [v for v in extremes(dtype) if v != 0]
        x = torch.tensor([row, list(reversed(row))], dtype=dtype)
    program = assert_exact(accumulations, (x,))
    assert not [c for c in program.report.casts if c.to_dtype.startswith(("f", "bf"))]


def test_integer_accumulations_into_another_dtype() -> None:
    """dtype= a float: computed in that float; dtype=bool: nonzero sums and products are True."""
    x = torch.tensor([[-5, 2, 7], [1, 0, 3]], dtype=torch.int32)
    assert_exact(
        lambda t: (
            t.cumsum(1, dtype=torch.float32),
            t.cumprod(1, dtype=torch.float64),
            t.cumprod(1, dtype=torch.bfloat16),
            t.sum(1, dtype=torch.float16),
            t.prod(dtype=torch.float32),
            (t > 0).sum(1, dtype=torch.bool),
            (t > 0).prod(1, dtype=torch.bool),
            t.cumsum(1, dtype=torch.uint8),
        ),
        (x,),
    )


def test_int64_sum_and_product_are_exact_above_2_53() -> None:
    """ONNX Runtime's int64 ReduceSum adds in double (2**53 + 1 became 2**53); its ReduceProd saturates."""
    x = torch.tensor([[2**53 + 1, 0, 2], [2**32 + 1, 2**32 + 1, 3]])
    assert_exact(lambda t: (t.sum(), t.sum(1), t.prod(1), t.prod(), torch.cumprod(t, 1), torch.cumsum(t, 1)), (x,))


def test_products_over_a_dynamic_dim() -> None:
    """A dim known only at run time: the running product is an ONNX Loop (empty dims give 1)."""
    x = torch.tensor([[3, 5, 7, 11, 13, 2**40 + 1, -3], [1, 2, 3, 4, 5, 6, 7]])
    runs = [((y,), {}) for y in (x, x[:, :3], x[:, :1], x[:, :0], torch.full((2, 70), 3))]
    assert_exact(
        lambda t: (t.prod(1), torch.cumprod(t, 1), t.sum(1), t.prod()),
        (x,),
        dynamic_shapes={"args": ({1: torch.export.Dim("n", min=0)},)},
        run_with=runs,
    )


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64], ids=str)
def test_integer_scatter_and_index_means_divide_in_integers(dtype: torch.dtype) -> None:
    """Eager adds in the dtype (wrapping), then floor-divides by the counts."""
    info = torch.iinfo(dtype)
    big = 2**53 + 7 if dtype == torch.int64 else 7
    target = torch.tensor([info.max, info.min + 3, big, -big], dtype=dtype)
    source = torch.tensor([info.max - 2, -5, big - 6, 3, 1, 2], dtype=dtype)
    index = torch.tensor([0, 1, 2, 2, 3, 3])
    assert_exact(
        lambda t, i, s: (
            t.index_reduce(0, i, s, "mean"),
            t.index_reduce(0, i, s, "mean", include_self=False),
            t.scatter_reduce(0, i, s, "mean"),
            t.scatter_reduce(0, i, s, "mean", include_self=False),
        ),
        (target, index, source),
    )


# --- float edge values ----------------------------------------------------------------------------------------
SPECIAL = [float("inf"), float("-inf"), float("nan"), 2.0, -2.0, 0.0, -0.0, 5.5, -5.5, 1e30, -3e-3, 0.1]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_floor_division_and_remainder_follow_eager_at_special_values(dtype: torch.dtype) -> None:
    """inf // 2 is NaN in eager (fmod(inf, 2) is NaN), 2 % inf is 2 and -2 % inf is inf."""
    a = torch.tensor([x for x in SPECIAL for _ in SPECIAL], dtype=dtype)
    b = torch.tensor([y for _ in SPECIAL for y in SPECIAL], dtype=dtype)
    assert_exact(
        lambda x, y: (
            x // y,
            torch.div(x, y, rounding_mode="floor"),
            torch.div(x, y, rounding_mode="trunc"),
            x % y,
            x // 2,
            x % 0.75,
        ),
        (a, b),
    )


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_float_floor_division_and_remainder_round_like_eager(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    a = (torch.randn(4000, generator=generator) * 1000).to(dtype)
    b = torch.randn(4000, generator=generator).to(dtype)
    assert_exact(lambda x, y: (x // y, x % y, torch.div(x, y, rounding_mode="trunc"), x % 0.3, x // 0.3), (a, b))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_sign_of_nan_is_zero_as_in_eager(dtype: torch.dtype) -> None:
    x = torch.tensor(SPECIAL, dtype=dtype)
    assert_exact(lambda t: (torch.sign(t), torch.sgn(t), torch.sign(t).signbit()), (x,))


@pytest.mark.parametrize("dtype", [*FLOATS, torch.int32, torch.bool], ids=str)
def test_reductions_over_nothing_give_eager_identities(dtype: torch.dtype) -> None:
    """sum 0, prod 1, any False, all True, mean NaN (floats); empty dims and empty tensors."""
    x = torch.ones(3, 0, dtype=dtype)

    def reductions(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        results = (t.sum(1), t.prod(1), t.any(1), t.all(1), t.any(), t.all(), t.sum(), t.prod(), t.any(0))
        if t.is_floating_point():
            results += (t.mean(1), t.mean(), t.mean(0), t.mean((0, 1), keepdim=True))
        return results

    assert_exact(reductions, (x,))
