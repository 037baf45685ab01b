"""float64 ops whose ONNX operator ONNX Runtime runs in float32 only are computed in float64, with no lossy Cast.

Legalization used to wrap float64 Erf, Atan, Asin, Acos, Sinh, Cosh, Asinh, Acosh, Atanh, NonZero, AveragePool in
Casts to float32 and back (recorded as lossy): erf off by 7e-8, sinh inf above 89, nonzero dropping 1e-50. These
cases export float64 inputs over wide ranges and special values (+-0, +-inf, NaN, out of domain), compare with eager
at RTOL (about 7 ulps; the lowerings measure within 1-2 ulps of eager except erfc, whose Cephes rationals reach 6)
and check the report has no lossy Cast (the float64 variants in src/fx2onnx/_lowerings/, kernels.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import Call, assert_exports_and_matches

RTOL = 1.5e-15  # ~7 ulps
ATOL = 1e-300  # values, not their absolute size, are compared: only subnormal results may differ by a few ulps

SPECIAL = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0, 0.5, -0.5, 1e-300, -1e-300, 5e-324, 1e-8]


def values(low: float, high: float, count: int = 200, *, log: bool = False, seed: int = 0) -> torch.Tensor:
    """`count` values in [low, high] (magnitudes spread logarithmically, both signs, with `log`), then SPECIAL."""
    generator = np.random.default_rng(seed)
    if log:
        drawn = np.exp(generator.uniform(np.log(low), np.log(high), count)) * generator.choice([-1.0, 1.0], count)
    else:
        drawn = generator.uniform(low, high, count)
    return torch.tensor(np.concatenate([drawn, SPECIAL]), dtype=torch.float64)


Case = tuple[Callable[..., Any], tuple[torch.Tensor, ...]]
AXIS = torch.tensor([*SPECIAL[:9], 3.0, -2.0], dtype=torch.float64)
GRID_Y, GRID_X = torch.meshgrid(AXIS, AXIS, indexing="ij")  # atan2 of every pair of special values

CASES: dict[str, Case] = {
    "erf": (torch.erf, (values(1e-10, 30.0, log=True),)),
    "erfc": (torch.erfc, (torch.cat([values(1e-10, 26.0, log=True), values(0.4, 1.1, 100, seed=1)]),)),
    "special_ndtr": (torch.special.ndtr, (values(-10.0, 10.0),)),
    "atan": (torch.atan, (values(1e-10, 1e300, log=True),)),
    "asin": (torch.asin, (torch.cat([values(-1.1, 1.1), values(1e-12, 1.0, log=True, seed=1)]),)),
    "acos": (torch.acos, (torch.cat([values(-1.1, 1.1), 1 - values(1e-14, 1.0, log=True, seed=1).abs()]),)),
    "atan2": (torch.atan2, (GRID_Y.flatten(), GRID_X.flatten())),
    "atan2_wide": (torch.atan2, (values(1e-8, 1e8, log=True, seed=2), values(1e-8, 1e8, log=True, seed=3))),
    # eager's vectorized sinh/cosh (SLEEF) overflow from 709.78, its scalar ones (glibc) at 710.48, as these do
    "sinh": (torch.sinh, (torch.cat([values(1e-10, 709.7, log=True), torch.tensor([720.0, -720.0])]),)),
    "cosh": (torch.cosh, (torch.cat([values(1e-10, 709.7, log=True), torch.tensor([720.0, -720.0])]),)),
    "asinh": (torch.asinh, (values(1e-10, 1e300, log=True),)),
    "acosh": (torch.acosh, (torch.cat([1 + values(1e-12, 1e300, log=True).abs(), values(-2.0, 1.5)]),)),
    "atanh": (torch.atanh, (torch.cat([values(-1.1, 1.1), values(1e-10, 1.0, log=True, seed=1)]),)),
    "sigmoid": (torch.sigmoid, (values(-800.0, 800.0),)),
}

# 1 + erf(x / sqrt(2)) and 1 + tanh(...) cancel for negative x in eager's formula too: there the results agree to
# a few ulps of the 1 they are subtracted from (times |x| / 2), not of their own size.
CANCELLING: dict[str, Case] = {
    "gelu": (F.gelu, (values(-40.0, 40.0),)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), (values(-40.0, 40.0),)),
    # cos(9 acos(x)) near its roots: an ulp of acos moves the result by ~1e-15 (special.py's trigonometric form)
    "chebyshev_t": (lambda x: torch.special.chebyshev_polynomial_t(x, 9), (values(-0.99, 0.99),)),
}

# Index results: a float32 computation would drop 1e-50 and 5e-324 (they round to 0).
TINY = torch.tensor([0.0, 1e-50, -0.0, float("nan"), 5e-324, -3.0, float("inf")], dtype=torch.float64)
EXACT: dict[str, Case] = {
    "nonzero": (torch.nonzero, (TINY.reshape(7, 1),)),
    "argwhere": (torch.argwhere, (TINY,)),
    "nonzero_static": (lambda x: torch.nonzero_static(x, size=7), (TINY,)),
    "masked_scatter": (
        lambda x, mask, source: x.masked_scatter(mask, source),
        (torch.zeros(3, 4, dtype=torch.float64), torch.tensor([True, False, True, True]), values(-1.0, 1.0, 9)),
    ),
    "avg_pool1d": (lambda x: F.avg_pool1d(x, 3, stride=2, padding=1), (values(-5.0, 5.0, 47).reshape(2, 3, 10),)),
    "avg_pool2d": (
        lambda x: F.avg_pool2d(x, (2, 3), stride=2, padding=1, ceil_mode=True, count_include_pad=False),
        (values(-5.0, 5.0, 107).reshape(1, 2, 6, 10),),
    ),
    "avg_pool2d_divisor": (lambda x: F.avg_pool2d(x, 3, divisor_override=7), (values(-1.0, 1.0, 67).reshape(4, 5, 4),)),
    "avg_pool3d": (lambda x: F.avg_pool3d(x, 2, stride=1, padding=1), (values(-5.0, 5.0, 67).reshape(1, 2, 2, 4, 5),)),
}


def _assert_no_lossy_cast(program: Any) -> None:
    lossy = [cast for cast in program.report.all_casts() if "lossy" in cast.reason]
    assert not lossy, lossy


@pytest.mark.parametrize("name", sorted(CASES))
def test_math_in_float64(name: str) -> None:
    function, args = CASES[name]
    _assert_no_lossy_cast(assert_exports_and_matches(Call(function), args, rtol=RTOL, atol=ATOL))


@pytest.mark.parametrize("name", sorted(CANCELLING))
def test_cancelling_forms_in_float64(name: str) -> None:
    function, args = CANCELLING[name]
    _assert_no_lossy_cast(assert_exports_and_matches(Call(function), args, rtol=RTOL, atol=40 * 2.0**-52))


@pytest.mark.parametrize("name", sorted(EXACT))
def test_indices_and_pooling_exact(name: str) -> None:
    """Same indices; pooled sums in eager's order and divisor: the same bits."""
    function, args = EXACT[name]
    _assert_no_lossy_cast(assert_exports_and_matches(Call(function), args, rtol=0.0, atol=0.0))


def test_signed_zeros_kept() -> None:
    """Odd functions give -0 for -0 (ONNX Runtime's Where would turn a -0 in its first branch into +0)."""
    zeros = torch.tensor([-0.0, 0.0], dtype=torch.float64)
    functions = [torch.erf, torch.atan, torch.asin, torch.sinh, torch.asinh, torch.atanh, F.gelu]
    program = assert_exports_and_matches(Call(lambda x: tuple(f(x) for f in functions)), (zeros,))
    for result in program(zeros):
        assert torch.signbit(result).tolist() == [True, False]
    atan2 = assert_exports_and_matches(Call(torch.atan2), (GRID_Y.flatten(), GRID_X.flatten()))
    (result,) = atan2(GRID_Y.flatten(), GRID_X.flatten())
    expected = torch.atan2(GRID_Y.flatten(), GRID_X.flatten())
    numbers = ~torch.isnan(expected)  # a NaN's sign bit means nothing
    assert torch.equal(torch.signbit(result)[numbers], torch.signbit(expected)[numbers])


def test_other_dtypes_keep_their_dispatch() -> None:
    """float64-only lowerings: float32 graphs keep ONNX's Erf and Atan, and run them in float32."""
    x = values(-3.0, 3.0).float()
    program = assert_exports_and_matches(Call(lambda x: (torch.erf(x), torch.atan(x))), (x,))
    assert {"Erf", "Atan"} <= {node.op_type for node in program.model.graph}
