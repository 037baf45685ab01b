"""log1p, expm1 and the ops built on them match eager to a few ulps in every float dtype, at 0, near 0, near -1,
far out and at inf/-inf/NaN (src/fx2onnx/_lowerings/elementwise.py and builders.py).

torchlib's ``Log(1 + x)`` and ``Exp(x) - 1`` give 0 for log1p(1e-10) in float32 (eager 1e-10), its
``Log(Sigmoid(x))`` and ``Log(Exp(a) + Exp(b))`` overflow to inf or underflow to 0 where eager's results are
finite, and its elu scales the positive side by input_scale. Each case compares with eager at a few ulps of its
dtype, and the smallest subnormal absolute (a subnormal result may differ in its last bit). Each also checks NaN,
+-inf and the sign of zeros exactly (`assert_special_values_match`): ``verify``'s tolerance accepts any value
where eager's is infinite (rtol * inf), and 0 == -0.

logcumsumexp (torchlib: max + Log(CumSum(Exp(x - max))), NaN at +-inf, -inf far below the maximum) is checked
at +-inf, NaN, all -inf prefixes and +-1e4 along each dim, and with a dim of run-time length (an ONNX Loop).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

import fx2onnx

from conftest import Call, assert_exports_and_matches

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INF, NAN = float("inf"), float("nan")
# Near 0 (where Log(1 + x) and Exp(x) - 1 cancel), near -1, inf/-inf/NaN, and where exp over/underflows.
SPECIAL = [0.0, -0.0, 1e-30, -1e-30, 1e-10, -1e-7, 3e-5, -7e-6, -0.5, -0.999, -1.0, -1.5, 1.0, 3.0, INF, -INF, NAN]
FAR = [8.0, 12.0, 15.0, 17.0, 20.0, 80.0, 88.5, 100.0, 700.0, 709.5, 1e30, -20.0, -80.0, -100.0, -745.0, -1e30]
# A grid of small magnitudes both sides of 0, where Log(1 + x) and Exp(x) - 1 lose the most digits.
SMALL = torch.logspace(-9, -2, 29, dtype=torch.float64)


def values(dtype: torch.dtype) -> torch.Tensor:
    grid = torch.cat([torch.tensor(SPECIAL + FAR, dtype=torch.float64), SMALL, -SMALL])
    return grid.to(dtype)


def tolerances(dtype: torch.dtype, ulps: int = 4) -> tuple[float, float]:
    """(rtol, atol): `ulps` epsilons relative (log1p, expm1 and log_sigmoid are within 2.5 of eager, measured on
    60k samples per dtype), the smallest subnormal absolute."""
    info = torch.finfo(dtype)
    return ulps * info.eps, info.smallest_normal * info.eps


Case = Callable[[torch.Tensor], Any]


def _logaddexp2_same(x: torch.Tensor) -> torch.Tensor:
    """logaddexp2(x, x) = x + 1, away from x = -1: near there the sum cancels, and eager's rounded 1 / ln 2 (in a
    fused multiply-add) is off by up to 1 relative (-1.06e-8 for the exact 0 at -1 in float32), where ours is
    exact."""
    x = torch.where((x + 1).abs() < 0.1, torch.full_like(x, 0.5), x)
    return torch.logaddexp2(x, x)


CASES: dict[str, Case] = {
    "log1p": torch.log1p,
    "expm1": torch.expm1,
    "special_expm1": torch.special.expm1,  # its own ATen op (aten::special_expm1)
    "log_sigmoid": F.logsigmoid,
    "logaddexp": lambda x: (torch.logaddexp(x, x.flip(0)), torch.logaddexp(x, x), torch.logaddexp(x, -x)),
    "logaddexp2": lambda x: (torch.logaddexp2(x, x.flip(0)), _logaddexp2_same(x), torch.logaddexp2(x, -x)),
    "xlog1py": lambda x: torch.special.xlog1py(x.flip(0), x),
    # Decomposed by torch into log_sigmoid and log1p(exp(...)).
    "bce_with_logits": lambda x: F.binary_cross_entropy_with_logits(x, torch.full_like(x, 0.25), reduction="none"),
    "soft_margin_loss": lambda x: F.soft_margin_loss(x, torch.ones_like(x), reduction="none"),
}

# elu's negative side is expm1, and torchlib's positive side multiplies by input_scale.
ELU_CASES: dict[str, Case] = {
    "aten_elu_scales": lambda x: torch.ops.aten.elu(x, 0.3, 1.7, 0.9),
    "aten_elu_input_scale": lambda x: torch.ops.aten.elu(x, 1.0, 1.0, 2.5),
    "elu": lambda x: F.elu(x, alpha=0.3),
    "celu": lambda x: F.celu(x, alpha=0.3),
    "selu": F.selu,
}
# Left out where the code before was already within the dtype's tolerance (these could not fail): float64's elu
# family (float64.py's float64-only lowerings had it; tests/test_float64_precision.py covers it), and float16's elu,
# celu, selu and soft_margin_loss, whose narrow range keeps ONNX Runtime's float32 Exp(x) - 1 and Log(1 + x)
# within an ulp of float16.
ALREADY_ACCURATE = {
    (name, torch.float64) for name in ("elu", "celu", "selu", "aten_elu_scales", "aten_elu_input_scale")
}
ALREADY_ACCURATE |= {(name, torch.float16) for name in ("elu", "celu", "selu", "soft_margin_loss")}


def _params(cases: dict[str, Case]) -> list[Any]:
    return [
        pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}")
        for name in sorted(cases)
        for dtype in DTYPES
        if (name, dtype) not in ALREADY_ACCURATE
    ]


def assert_special_values_match(program: fx2onnx.ONNXProgram, model: torch.nn.Module, args: tuple[Any, ...]) -> None:
    """NaN, +-inf and the sign of zeros in every output exactly as eager's."""
    with torch.no_grad():
        expected = [t for t in pytree.tree_leaves(model(*args)) if isinstance(t, torch.Tensor)]
    for index, (e, a) in enumerate(zip(expected, program(*args))):
        e, a = e.to(torch.float64), a.to(torch.float64)
        assert torch.equal(e.isnan(), a.isnan()), f"output {index}: NaN at {e.isnan().nonzero().tolist()}, {a}"
        infinite = e.isinf() | a.isinf()
        assert torch.equal(e[infinite], a[infinite]), f"output {index}: infinities {e[infinite]} vs {a[infinite]}"
        zeros = (e == 0) & (a == 0)
        signs = (torch.signbit(e[zeros]), torch.signbit(a[zeros]))
        assert torch.equal(*signs), f"output {index}: signs of zeros {e[zeros].tolist()} vs {a[zeros].tolist()}"


def check_values(model: torch.nn.Module, args: tuple[Any, ...], rtol: float, atol: float, **options: Any) -> None:
    program = assert_exports_and_matches(model, args, rtol=rtol, atol=atol, **options)
    assert_special_values_match(program, model, args)


def _check(case: Case, dtype: torch.dtype, ulps: int = 4) -> None:
    rtol, atol = tolerances(dtype, ulps)
    check_values(Call(case), (values(dtype),), rtol, atol)


@pytest.mark.parametrize(("name", "dtype"), _params(CASES))
def test_log1p_expm1_and_their_users(name: str, dtype: torch.dtype) -> None:
    _check(CASES[name], dtype)


@pytest.mark.parametrize(("name", "dtype"), _params(ELU_CASES))
def test_elu_family(name: str, dtype: torch.dtype) -> None:
    """float32's negative side goes through ONNX Runtime's Tanh (fast, but ~2 ulps): within 4.1 ulps of eager on
    two million samples, so 6 here."""
    _check(ELU_CASES[name], dtype, ulps=6)


# sigmoid's tail, where ONNX Runtime's Sigmoid (MLAS's logistic) is 25k ulps off at -10 and 0 from -17 down; the
# rest of its range and the bounds of exp's range.
SIGMOID_TAIL = [-1e30, -745.0, -104.0, -103.5, -88.7, -88.0, -80.0, -30.0, -20.0, -18.0, -17.0, -15.84, -10.0, -9.0]
SIGMOID_REST = [-2.0, -0.5, -1e-8, -0.0, 0.0, 1e-30, 0.25, 2.0, 9.0, 17.0, 20.0, 40.0, 88.5, 1e30, INF, -INF, NAN]
SIGMOID_CASES: dict[str, Case] = {
    "sigmoid": torch.sigmoid,
    "special_expit": torch.special.expit,
    "glu": lambda x: F.glu(torch.stack([x.flip(0), x], 1), 1),
    "log_of_sigmoid": lambda x: torch.log(torch.sigmoid(x)),
    "odds": lambda x: torch.sigmoid(x) / torch.sigmoid(-x),
    "sigmoid_gate": lambda x: x.flip(0) * torch.sigmoid(x),
}


def sigmoid_values(dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(SIGMOID_TAIL + SIGMOID_REST, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(SIGMOID_CASES))
def test_sigmoid_and_its_gates_in_the_tail(name: str, dtype: torch.dtype) -> None:
    """1 / (1 + exp(-x)) as eager computes it: within 2 ulps of eager over 542k float32 values in [-104, 20]."""
    check_values(Call(SIGMOID_CASES[name]), (sigmoid_values(dtype),), *tolerances(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_within_float32_epsilon_times_its_input(dtype: torch.dtype) -> None:
    """silu's error is within float32's epsilon times x (ONNX Runtime's fused x * Sigmoid(x) in float32, kept for
    speed: elementwise.py; 1.33e-7 |x| at most, at -15.84), within a few ulps of silu in float64 (eager's
    x / (1 + exp(-x)))."""
    x = sigmoid_values(dtype)
    program = assert_exports_and_matches(Call(F.silu), (x,))
    assert_special_values_match(program, Call(F.silu), (x,))
    got, want, x = (t.to(torch.float64) for t in (program(x)[0], F.silu(x), x))
    finite = want.isfinite()
    eps = torch.finfo(dtype).eps
    from_x = 1.2 * torch.finfo(torch.float32).eps * x.abs() if dtype != torch.float64 else 0.0
    bound = 4 * eps * want.abs() + from_x
    assert bool(((got - want).abs() <= bound)[finite].all()), (x[finite], got[finite] - want[finite])


@pytest.mark.xfail(strict=True, reason="open: silu keeps ONNX Runtime's fused QuickGelu (elementwise.py)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_silu_relative_to_itself_in_its_tail(dtype: torch.dtype) -> None:
    """Open, by decision: silu(x) for x below -2 is off eager relatively (MLAS's logistic: 0 for silu(-20), eager
    -4.1e-8), within float32's epsilon times x. Eager's form costs 35% CPU on EfficientNet-B0 in ONNX Runtime."""
    check_values(Call(F.silu), (sigmoid_values(dtype),), *tolerances(dtype))


# Activations whose ONNX Runtime kernels (fused into Gelu/BiasGelu/FastGelu in a default session, or ONNX's HardSwish
# and Tanh) are within a few epsilons of |x| of eager but not of their own value where it is much smaller than x:
# gelu's tails around -5 (1 + erf and 1 + tanh cancel, eager's too), HardSwish near -3, Tanh of subnormals
# (docs/ort-defects.md, 15). Kept for speed; pinned here: the bound, and NaN/+-inf exactly as eager.
ACTIVATION_CASES: dict[str, Case] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "hardswish": F.hardswish,
    "tanh": torch.tanh,
}
ACTIVATION_VALUES = [-6.0, -5.5425, -5.36, -5.1546, -5.15, -4.0, -3.0 + 2.4e-7, -3.0, -2.9999, -2.0, -1e-3, -0.0, 0.0]
ACTIVATION_VALUES += [1e-3, 0.7, 2.5462, 3.3933, 4.1397, 30.0, 1e30, -1e30, 1e-40, -1.43e-43, NAN, -INF]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(ACTIVATION_CASES))
def test_activations_within_a_few_epsilons_of_their_input(name: str, dtype: torch.dtype) -> None:
    """|ours - eager| <= 3 eps |x| (+ the smallest subnormal), NaN and -inf as eager's; +inf too, except the erf form
    of gelu in float32/bfloat16, where eager's vectorized kernel gives NaN (inf for a 0-d tensor, float16, float64)
    and ours inf."""
    values = ACTIVATION_VALUES + ([] if name == "gelu" and dtype in (torch.float32, torch.bfloat16) else [INF])
    x = torch.tensor(values, dtype=torch.float64).to(dtype)
    model = Call(ACTIVATION_CASES[name])
    program = fx2onnx.export(model, (x,))
    assert_special_values_match(program, model, (x,))
    got, want, wide = (t.to(torch.float64) for t in (program(x)[0], model(x), x))
    finite = want.isfinite()
    info = torch.finfo(dtype)
    bound = 3 * info.eps * wide.abs() + info.smallest_normal * info.eps
    if (name, dtype) in (("gelu", torch.bfloat16), ("tanh", torch.float32)):
        # bfloat16: eager flushes x / 2 near FLT_MIN to 0; float32 Tanh: ONNX Runtime's is 0 for |x| <= 1.4e-43
        bound = torch.where(wide.abs() < 1e-36, wide.abs(), bound)
    assert bool(((got - want).abs() <= bound)[finite].all()), (x[finite], (got - want)[finite])
    if name == "gelu" and dtype in (torch.float32, torch.bfloat16):
        assert program(torch.full_like(x, INF))[0][0].item() == INF


class _Renormed(torch.nn.Module):
    """An embedding with max_norm: eager renormalizes the looked-up rows of its weight in place."""

    def __init__(self, dtype: torch.dtype, norm_type: float) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(6, 4, max_norm=0.3, norm_type=norm_type, dtype=dtype)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            self.embedding.weight.copy_((torch.rand(6, 4, generator=generator, dtype=torch.float64) * 2 - 1).to(dtype))

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return self.embedding(indices)


@pytest.mark.parametrize(
    ("dtype", "norm_type"),
    [(torch.float64, 2.0), (torch.float64, 3.0), (torch.float32, INF), (torch.bfloat16, INF)],
    ids=str,
)
def test_embedding_renorm(dtype: torch.dtype, norm_type: float) -> None:
    """max_norm and 1e-7 in double (torchlib: float32 constants, 4e-8 off in float64), and the inf-norm (torchlib:
    a sum of |x|^inf). (float16/bfloat16 2-norms were within tolerance before; their scale is now rounded to the
    weight's dtype as in eager's in-place multiply.)"""
    rtol, atol = tolerances(dtype)
    indices = torch.tensor([[0, 2], [3, 2]])
    assert_exports_and_matches(_Renormed(dtype, norm_type), (indices,), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_signed_zeros(dtype: torch.dtype) -> None:
    """-0 in, -0 out (as eager) for log1p and expm1 (whose 0 was +0: log(1) + (-0) and ONNX Runtime's Where, which
    turns a -0 in its first branch into +0), and the elu family (eager's x * scale there)."""
    functions = (
        torch.log1p,
        torch.special.log1p,
        torch.expm1,
        lambda x: torch.special.xlog1py(torch.full_like(x, 2.0), x),
        lambda x: torch.ops.aten.elu(x, 0.3, -1.7, 0.9),
        lambda x: F.elu(x, alpha=-0.5),
        lambda x: F.celu(x, alpha=0.3),
        F.selu,
    )
    x = torch.tensor([-0.0, 0.0, -1e-30, 1e-30, 2.0, -2.0, INF, -INF, NAN], dtype=dtype)
    rtol, atol = tolerances(dtype, ulps=6)
    check_values(Call(lambda t: tuple(function(t) for function in functions)), (x,), rtol, atol)


# --- logcumsumexp ---------------------------------------------------------------------------------------------
# Rows: infinities (-inf prefixes, +inf from there on, then NaN), magnitudes far apart each way, all -inf.
LOGCUMSUMEXP_SPECIAL = [
    [-INF, -INF, 1.0, -1e4, 1e4, INF, 5.0, NAN, 2.0],
    [1e-10, 2e-10, -20.0, -1e4, -INF, 1e4, -INF, INF, INF],
    [-1e4, 1e4, -1e4, 3.0, -INF, 0.5, 1e4, 1e4, -2.0],
    [-INF] * 9,
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_logcumsumexp(dtype: torch.dtype) -> None:
    """Along dim 1, 0 (across the special rows), -1 of a long random row and the middle of a 3-d tensor, and a 0-d
    tensor. float32 is within an ulp of eager (which accumulates in double), float64 within 6."""
    generator = torch.Generator().manual_seed(0)
    special = torch.tensor(LOGCUMSUMEXP_SPECIAL, dtype=torch.float64).to(dtype)
    wide = (torch.randn(3, 257, generator=generator, dtype=torch.float64) * 30).to(dtype)
    cube = torch.randn(2, 5, 3, generator=generator, dtype=torch.float64).to(dtype)
    scalar = torch.tensor(0.75, dtype=dtype)

    def scans(s: torch.Tensor, w: torch.Tensor, c: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.logcumsumexp(s, 1),
            torch.logcumsumexp(s, 0),
            torch.logcumsumexp(w, -1),
            torch.logcumsumexp(c, -2),
            torch.logcumsumexp(z, 0),
        )

    rtol, atol = tolerances(dtype, ulps=16 if dtype == torch.float64 else 4)
    check_values(Call(scans), (special, wide, cube, scalar), rtol, atol)


class _RunningLogSumExp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logcumsumexp(x, 1)


def test_logcumsumexp_of_dynamic_length() -> None:
    """A dim whose length is known only at run time: the doubling steps run in an ONNX Loop."""
    generator = torch.Generator().manual_seed(1)

    def rows(length: int) -> torch.Tensor:
        x = torch.randn(3, length, generator=generator) * 20
        x[0, 0], x[1, length // 2], x[2, -1] = -INF, INF, NAN
        return x

    length = torch.export.Dim("length", min=2, max=4096)
    runs = [((rows(n),), {}) for n in (2, 3, 8, 9, 300)]
    rtol, atol = tolerances(torch.float32)
    program = assert_exports_and_matches(
        _RunningLogSumExp(), runs[0][0], dynamic_shapes=({1: length},), run_with=runs, rtol=rtol, atol=atol
    )
    assert "Loop" in {node.op_type for node in program.model_proto.graph.node}
    for args, _ in runs:
        assert_special_values_match(program, _RunningLogSumExp(), args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_atan2_special_values(dtype: torch.dtype) -> None:
    """C's atan2 on signed zeros, infinities and NaN: torchlib's put atan2(+0, -2) at -pi, eager at +pi."""
    values = [0.0, -0.0, 2.0, -2.0, float("inf"), float("-inf"), float("nan"), 1e-30, -1e30]
    y = torch.tensor([a for a in values for _ in values], dtype=dtype)
    x = torch.tensor([b for _ in values for b in values], dtype=dtype)
    model = Call(torch.atan2)
    assert_exports_and_matches(model, (y, x))
    (actual,) = fx2onnx.export(model, (y, x))(y, x)
    expected = torch.atan2(y, x)
    assert torch.equal(torch.signbit(actual) | expected.isnan(), torch.signbit(expected) | expected.isnan())
