"""float16/bfloat16 matrix products with a bias round once, as eager's CPU kernels do (_lowerings/matrix_products.py).

Rounding the product and then the sum (torchlib's MatMul + Add, each legalized through float32) put a quarter
of a bfloat16 Linear's outputs one ulp off eager; rounding once, the outputs are eager's.
"""

from __future__ import annotations

import pytest
import torch

import fx2onnx
from fx2onnx._dtypes import to_onnx

from conftest import assert_exports_and_matches as check
from conftest import assert_rounds_like_eager

DTYPES = [torch.bfloat16, torch.float16]


class Linear3d(torch.nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(256, 192, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class AddMm(torch.nn.Module):
    def __init__(self, beta: float, alpha: float) -> None:
        super().__init__()
        self.beta, self.alpha = beta, alpha

    def forward(self, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.addmm(bias, a, b, beta=self.beta, alpha=self.alpha)


class BAddBmm(torch.nn.Module):
    def forward(self, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(bias, a, b, beta=0.5, alpha=2.0)


class AddMv(torch.nn.Module):
    def forward(self, bias: torch.Tensor, a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.addmv(bias, a, v)


def _matches_eager(program: fx2onnx.ONNXProgram, model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    """float32 sums in another order than eager's round the other way once in a while (~0.1% of float16
    outputs, by an ulp or two)."""
    assert_rounds_like_eager(program, model, args, differing=0.005)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_rounds_once(dtype: torch.dtype, bias: bool) -> None:
    torch.manual_seed(0)
    model, x = Linear3d(bias).to(dtype).eval(), torch.randn(2, 64, 256, dtype=dtype)
    program = check(model, (x,))
    _matches_eager(program, model, (x,))
    # The weight stays a bfloat16/float16 initializer (transposed as a view), converted when the model runs: no
    # float32 copy of it in the file (the small bias may be converted ahead of time).
    weights = [v.const_value for v in program.model.graph.initializers.values() if v.const_value is not None]
    assert [w.dtype for w in weights if w.size == 256 * 192] == [to_onnx(dtype)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("beta", "alpha"), [(1.0, 1.0), (0.5, 3.0), (0.0, 1.0)])
def test_addmm_rounds_once(dtype: torch.dtype, beta: float, alpha: float) -> None:
    torch.manual_seed(0)
    bias, a, b = torch.randn(96, dtype=dtype), torch.randn(32, 128, dtype=dtype), torch.randn(128, 96, dtype=dtype)
    if beta == 0:
        bias[3] = float("nan")  # ignored when beta is 0, as in eager
    model = AddMm(beta, alpha)
    program = check(model, (bias, a, b))
    _matches_eager(program, model, (bias, a, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_baddbmm_and_addmv_round_once(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    args = (
        torch.randn(4, 16, 24, dtype=dtype),
        torch.randn(4, 16, 64, dtype=dtype),
        torch.randn(4, 64, 24, dtype=dtype),
    )
    _matches_eager(check(BAddBmm(), args), BAddBmm(), args)
    args = (torch.randn(48, dtype=dtype), torch.randn(48, 200, dtype=dtype), torch.randn(200, dtype=dtype))
    _matches_eager(check(AddMv(), args), AddMv(), args)
