"""float16/bfloat16 multiplied or divided by a number compute as eager's kernels do (passes/scalar_opmath.py).

Eager multiplies a bfloat16 tensor by 0.3 as ``float(x) * 0.3f``, rounded once; rounding 0.3 to bfloat16 first
(0.30078125) put 47% of ``x * 0.3``'s results one ulp or more off eager. Every result must now be eager's, bit
for bit, since both compute the same float32 product and round it once.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import fx2onnx

from conftest import Call
from conftest import assert_exports_and_matches as check

DTYPES = [torch.bfloat16, torch.float16]


class ByInputScalar(torch.nn.Module):
    """The factor is a 0-d float32 tensor computed when the model runs (a scale from another input)."""

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * scale.sum(), x / scale.sum()


def _bit_equal_to_eager(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> fx2onnx.ONNXProgram:
    program = check(model, args)
    actual = program(*args)
    with torch.no_grad():
        expected = model(*args)
    actual, expected = (t if isinstance(t, (tuple, list)) else (t,) for t in (actual, expected))
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == want.dtype
        differ = (got != want) & ~(got.isnan() & want.isnan())
        assert not differ.any(), f"{differ.float().mean().item():.1%} of outputs differ from eager"
    return program


CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "x * 0.3": lambda x: x * 0.3,
    "0.3 * x": lambda x: 0.3 * x,
    "x / 0.3": lambda x: x / 0.3,
    "x * 1000001 (an int bfloat16 cannot hold)": lambda x: x * 1000001,
    "x * torch.tensor(0.3)": lambda x: x * torch.tensor(0.3),
    "(x * 0.125**0.5 + 1) * 0.3": lambda x: (x * 0.125**0.5 + 1) * 0.3,
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_product_with_a_number_is_eagers(dtype: torch.dtype, case: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 64).to(dtype)
    x[0, :3] = torch.tensor([float("inf"), float("nan"), 60000.0])
    _bit_equal_to_eager(Call(CASES[case]), (x,))


@pytest.mark.parametrize("dtype", DTYPES)
def test_product_with_a_float32_scalar_input_is_eagers(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    _bit_equal_to_eager(ByInputScalar(), (torch.randn(64, 64).to(dtype), torch.rand(3) + 0.1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_numbers_the_dtype_holds_are_left_to_promotion(dtype: torch.dtype) -> None:
    """x * 0.5 and x / 4 are exact either way: no float32 detour, one Mul/Div node before legalization."""
    program = _bit_equal_to_eager(Call(lambda x: (x * 0.5) / 4), (torch.randn(8, 8).to(dtype),))
    assert "compute_scalar_products_in_float32" not in program.report.fx_passes
