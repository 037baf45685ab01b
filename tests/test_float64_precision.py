"""float64 graphs keep float64 precision: no Python number, scalar attribute or library constant on the way into a
float64 computation is rounded to float32.

A number rounded through float32 is off by up to 3e-8 relative (0.1 becomes 0.10000000149), so each case compares
with eager at rtol 1e-12: what remains are the few ulps by which ONNX Runtime's kernels and eager's may differ.
The cases cover each path such a number takes: type promotion's constants (src/fx2onnx/passes/promotion.py), the
recorder's constants for torchlib's ``CastLike(number, x)`` / ``Cast(number, to=...)`` and for numbers in untyped
slots (src/fx2onnx/emit/recorder.py), torchlib functions with float32 attributes or constants
(src/fx2onnx/lowerings/float64.py, core.py's batch norm) and ONNX Runtime's MatMulScaleFusion, which before 1.32
folded a float64 scale into a float32 attribute (docs/ort-defects.md): the saved model must keep float64 precision
in a plain default ``InferenceSession``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from conftest import Call, assert_exports_and_matches

RTOL, ATOL = 1e-12, 1e-14


def doubles(*shape: int, seed: int = 0, low: float = -2.0, high: float = 2.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=generator, dtype=torch.float64) * (high - low) + low


X = doubles(3, 5)
Y = doubles(3, 5, seed=1)
Z = doubles(3, 5, seed=2, low=0.5, high=2.0)  # kept away from 0: a divisor
POSITIVE = doubles(3, 5, seed=3, low=0.1, high=4.0)
MASK = doubles(3, 5, seed=4) > 0
# Values a float32 rounding of 0.3 (0.30000001192) puts on the wrong side of a bound.
EDGES = torch.tensor([0.3 + 1e-9, -0.3 - 1e-9, 0.3 - 1e-9, 0.1 + 1e-10, 0.5, -1.5], dtype=torch.float64)
# Large negative inputs check log1p/expm1's accuracy far from 0.
WIDE = torch.tensor([-40.0, -3.0, -1e-9, 0.0, 1e-9, 2.5, 30.0], dtype=torch.float64)

Case = tuple[Callable[..., Any], tuple[Any, ...]]

# Python numbers that type promotion turns into constants of the compute dtype.
PROMOTED: dict[str, Case] = {
    "mul_add": (lambda x: x * 0.1 + 3.4e-10, (X,)),
    "reverse_sub": (lambda x: 0.1 - x, (X,)),
    "reverse_div": (lambda z: 0.7 / z, (Z,)),
    "int_then_float": (lambda x: x * 3 + 0.1, (X,)),
}

# Numbers torchlib passes to CastLike/Cast, or in a slot of their own type variable.
RECORDED: dict[str, Case] = {
    "clamp": (lambda x: torch.clamp(x, 0.1, 0.3), (X,)),
    "clamp_min_edge": (lambda x: torch.clamp_min(x, 0.3 + 5e-10), (EDGES,)),
    "clamp_max": (lambda x: torch.clamp_max(x, 0.3), (X,)),
    "full": (lambda x: x + torch.full((3, 5), 0.1, dtype=torch.float64), (X,)),
    "full_like": (lambda x: torch.full_like(x, 0.1), (X,)),
    "new_full": (lambda x: x.new_full((2, 5), 0.1), (X,)),
    "fill": (lambda x: x.clone().fill_(0.1), (X,)),
    "scalar_tensor": (lambda x: x + torch.scalar_tensor(0.1, dtype=torch.float64), (X,)),
    "masked_fill": (lambda x, mask: x.masked_fill(mask, 0.1), (X, MASK)),
    "index_fill": (lambda x: x.index_fill(1, torch.tensor([0, 2]), 0.1), (X,)),
    "add_alpha": (lambda x, y: torch.add(x, y, alpha=0.1), (X, Y)),
    "sub_alpha": (lambda x, y: torch.sub(x, y, alpha=0.1), (X, Y)),
    "pow_scalar_base": (lambda x: torch.pow(1.1, x), (X,)),
    "hinge_embedding_loss": (lambda x, y: F.hinge_embedding_loss(x, torch.sign(y), margin=0.3), (X, Y)),
    "deg2rad": (lambda x: torch.deg2rad(x), (X,)),
    "rad2deg": (lambda x: torch.rad2deg(x), (X,)),
}

# torchlib functions with float32 attributes or constants, lowered in src/fx2onnx/lowerings/float64.py.
LOWERED: dict[str, Case] = {
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), (X,)),
    "elu": (lambda x: F.elu(x, alpha=0.3), (WIDE,)),
    "elu_scales": (lambda x: torch.ops.aten.elu(x, 0.3, 1.7, 0.9), (X,)),
    "celu": (lambda x: F.celu(x, alpha=0.3), (WIDE,)),
    "selu": (lambda x: F.selu(x), (X,)),
    "hardtanh": (lambda x: F.hardtanh(x, -0.3, 0.3), (EDGES,)),
    "hardsigmoid": (lambda x: F.hardsigmoid(x), (X,)),
    "hardswish": (lambda x: F.hardswish(x), (X,)),
    "softplus": (lambda x: F.softplus(x, beta=0.3, threshold=7.0), (WIDE,)),
    "addcmul": (lambda x, y, z: torch.addcmul(x, y, z, value=0.1), (X, Y, Z)),
    "addcdiv": (lambda x, y, z: torch.addcdiv(x, y, z, value=0.1), (X, Y, Z)),
    "log10": (lambda x: torch.log10(x), (POSITIVE,)),
    "log2": (lambda x: torch.log2(x), (POSITIVE,)),
    "sinc": (lambda x: torch.sinc(x), (torch.cat([X.flatten(), torch.zeros(1, dtype=torch.float64)]),)),
    "addmm": (lambda x, y: torch.addmm(x[:, :3], x, y.T, beta=0.1, alpha=0.3), (X, Y)),
    "addmv": (lambda x, y: torch.addmv(x[:, 0], x, y[0], beta=0.1, alpha=0.3), (X, Y)),
    "addbmm": (lambda x, y: torch.addbmm(x[:, :3], x[None], y.T[None], beta=0.1, alpha=0.3), (X, Y)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (5,), w, b, eps=0.1), (X, Z[0], Y[0])),
    "native_layer_norm": (lambda x: torch.native_layer_norm(x, (5,), None, None, 0.1), (X,)),
    "group_norm": (lambda x, w, b: F.group_norm(x.reshape(1, 3, 5), 3, w, b, eps=0.1), (X, Z[:, 0], Y[:, 0])),
    "instance_norm": (
        lambda x, w, b: F.instance_norm(x.reshape(1, 3, 5), weight=w, bias=b, eps=0.1),
        (X, Z[:, 0], Y[:, 0]),
    ),
    "batch_norm": (
        lambda x, w, b: F.batch_norm(x.reshape(3, 5, 1), b, w, w, b, eps=0.1),
        (X, Z[0], Y[0]),
    ),
    "arange_float64": (lambda x: x[0] + torch.arange(0.1, 0.6, 0.1, dtype=torch.float64), (X,)),
    "arange_float32_length": (lambda x: x[0].float() + torch.arange(0.1, 0.6, 0.1), (X,)),
}

# Scales around a MatMul, which ONNX Runtime's MatMulScaleFusion would fold into a float32 attribute.
SCALED_MATMULS: dict[str, Case] = {
    "matmul_times_scalar": (lambda x, y: (x @ y.T) * 0.1, (X, Y)),
    "baddbmm": (lambda x, y: torch.baddbmm(x[None, :, :3], x[None], y.T[None], beta=0.1, alpha=0.3), (X, Y)),
    "attention": (lambda q: F.scaled_dot_product_attention(q, q, q), (doubles(1, 2, 4, 8),)),
}


def _check(case: Case) -> None:
    function, args = case
    assert_exports_and_matches(Call(function), args, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", sorted(PROMOTED))
def test_promoted_numbers(name: str) -> None:
    _check(PROMOTED[name])


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_numbers_torchlib_casts(name: str) -> None:
    _check(RECORDED[name])


@pytest.mark.parametrize("name", sorted(LOWERED))
def test_float32_attributes_and_constants(name: str) -> None:
    _check(LOWERED[name])


@pytest.mark.parametrize("name", sorted(SCALED_MATMULS))
def test_scales_around_matmul(name: str, tmp_path: Any) -> None:
    """In fx2onnx's session and in a user's plain InferenceSession of the saved file (every optimization on)."""
    import onnxruntime

    function, args = SCALED_MATMULS[name]
    program = assert_exports_and_matches(Call(function), args, rtol=RTOL, atol=ATOL)
    path = str(tmp_path / "scaled_matmul.onnx")
    program.save(path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    (result,) = session.run(None, feed)
    torch.testing.assert_close(torch.from_numpy(result), function(*args), rtol=RTOL, atol=ATOL)


def test_arange_with_a_symbolic_end() -> None:
    """The length ceil((end - start) / step) computed at run time, in double."""

    class Arange(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.arange(0.3, x.shape[0], 0.1, dtype=torch.float64)

    n = torch.export.Dim("n", min=2, max=64)
    assert_exports_and_matches(
        Arange(),
        (doubles(5),),
        dynamic_shapes=({0: n},),
        run_with=[((doubles(5),), {}), ((doubles(11, seed=5),), {})],
        rtol=RTOL,
        atol=ATOL,
    )


def test_float32_graphs_keep_onnx_ops() -> None:
    """The float64 lowerings take float64 only: float32 graphs still use ONNX's fused ops."""
    x = X.float()
    program = assert_exports_and_matches(Call(lambda x: (F.leaky_relu(x, 0.1), F.layer_norm(x, (5,), eps=0.1))), (x,))
    op_types = {node.op_type for node in program.model.graph}
    assert {"LeakyRelu", "LayerNormalization"} <= op_types, op_types


def test_large_int64_numbers_stay_exact() -> None:
    """int64 numbers above 2**53 (which a float64 cannot hold) through the same paths: promotion's constants and
    the recorder's direct conversion of ``Cast(number, to=INT64)``. These were exact before; this guards them."""
    big = 2**53 + 1

    def numbers(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            a + big,
            a * (2**40 + 1),
            torch.full((5,), big, dtype=torch.int64),
            torch.full_like(a, big),
            torch.clamp(a * 2**45, min=big),
            torch.where(a > 0, a, big),
            a.masked_fill(a > 0, big),
        )

    generator = torch.Generator().manual_seed(0)
    a = torch.randint(-1000, 1000, (5,), generator=generator, dtype=torch.int64)
    assert_exports_and_matches(Call(numbers), (a,), rtol=0.0, atol=0.0)
