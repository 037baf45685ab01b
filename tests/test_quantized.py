"""Integer compute: out_dtype, aten._int_mm and quantize/dequantize graphs, exact against eager.

Every comparison uses rtol=atol=0: integer outputs must equal eager bit for bit, and so must the float
outputs these integer pipelines produce.
"""

from __future__ import annotations

from typing import Any

import onnx_ir as ir
import pytest
import torch
import torch.ao.quantization.fx._decomposed  # defines torch.ops.quantized_decomposed
from onnxscript import opset18 as op
from torch._higher_order_ops.out_dtype import out_dtype

import fx2onnx

from conftest import assert_exports_and_matches

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def exact(model: torch.nn.Module, args: tuple[torch.Tensor, ...], **options: object) -> fx2onnx.ONNXProgram:
    return assert_exports_and_matches(model, args, rtol=0.0, atol=0.0, **options)


def op_types(program: fx2onnx.ONNXProgram) -> list[str]:
    return [node.op_type for node in program.model.graph]


def int8(*shape: int, low: int = -128, high: int = 128) -> torch.Tensor:
    return torch.randint(low, high, shape, dtype=torch.int8)


def uint8(*shape: int) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


# --- out_dtype ---------------------------------------------------------------------------------------
class Int8MatMul(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return out_dtype(aten.mm.default, torch.int32, a, b)


def test_out_dtype_mm_int8_int8_to_int32_is_matmulinteger() -> None:
    a, b = int8(6, 64), int8(64, 5)
    a[0] = -128  # extreme products: -128 * -128 summed over K, which int16 partial sums cannot hold
    b[:, 0] = -128
    program = exact(Int8MatMul(), (a, b), dynamic_shapes=({0: torch.export.Dim("rows")}, None))
    assert "MatMulInteger" in op_types(program)
    assert "MatMul" not in op_types(program)
    assert program(a[:3], b)[0].equal(Int8MatMul()(a[:3], b))  # another batch size


class Int8Linear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return out_dtype(aten.linear.default, torch.int32, x, self.weight, self.bias)


@pytest.mark.parametrize(
    ("activation", "weight"),
    [(uint8(2, 5, 32), int8(7, 32)), (int8(2, 5, 32), uint8(7, 32))],
    ids=["uint8_x_int8", "int8_x_uint8"],
)
def test_out_dtype_linear_mixed_signedness(activation: torch.Tensor, weight: torch.Tensor) -> None:
    bias = torch.randint(-5000, 5000, (7,), dtype=torch.int32)
    program = exact(Int8Linear(weight, bias), (activation,))
    if activation.dtype == torch.uint8:  # nothing to shift at run time: the weight was shifted at export
        assert op_types(program) == ["MatMulInteger", "Add"]
    assert "MatMulInteger" in op_types(program)
    weights = [v for v in program.model.graph.initializers.values() if v.shape == ir.Shape([32, 7])]
    assert [w.dtype for w in weights] == [ir.DataType.UINT8]  # transposed (and shifted) at export time


class Requantize(torch.nn.Module):
    def forward(self, accumulator: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return out_dtype(aten.mul.Tensor, torch.int8, accumulator, scale)


def test_out_dtype_mul_int32_by_float_scale_to_int8_rounds_and_overflows_like_eager() -> None:
    accumulator = torch.tensor(
        [[0, 7, 15, -15, 25, -25, 1269, 1270, -1280, -1290, 2999, 3001, 100_000, -100_000, 2**31 - 1, -(2**31)]],
        dtype=torch.int32,
    )
    scale = torch.tensor(0.1)
    expected = Requantize()(accumulator, scale)
    products = accumulator.double() * 0.1
    assert (products.frac() != 0).any() and (products.abs() > 127).any()  # the cases that round and overflow
    assert expected[0, 9].item() == 127 and expected[0, 10].item() == 43  # eager truncates, then wraps
    program = exact(Requantize(), (accumulator, scale))
    assert op_types(program) == ["Cast", "Mul", "Cast"]


class IntegerDivision(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return out_dtype(aten.div.Tensor, torch.int32, a, b)


def test_out_dtype_div_of_integers_is_true_division_then_truncation() -> None:
    a = torch.randint(-1000, 1000, (4, 6), dtype=torch.int32)
    b = torch.randint(1, 30, (4, 6), dtype=torch.int32) * torch.where(torch.rand(4, 6) > 0.5, 1, -1).int()
    program = exact(IntegerDivision(), (a, b))
    assert "Div" in op_types(program)
    assert any(d.target == "aten::div.Tensor" for d in program.report.decisions)  # dispatched like any node


class Int8Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", int8(4, 3, 3, 3))
        self.register_buffer("bias", int8(4))  # torch.export traces conv2d without promotion: one dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return out_dtype(aten.conv2d.default, torch.int32, x, self.weight, self.bias, [2, 1], [1, 1])


def test_out_dtype_conv2d_int8_to_int32_is_convinteger() -> None:
    x = int8(2, 3, 9, 8)
    program = exact(Int8Conv(), (x,))
    assert "ConvInteger" in op_types(program)
    assert "Conv" not in op_types(program)


class IntMM(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch._int_mm(a, b)


def test_int_mm_is_matmulinteger() -> None:
    program = exact(IntMM(), (int8(32, 64), int8(64, 16)))
    assert "MatMulInteger" in op_types(program)


def test_a_registered_out_dtype_implementation_takes_precedence() -> None:
    def widened_matmul(operator: Any, dtype: int, a: Any, b: Any) -> Any:  # the registry binds by position
        product = op.MatMul(op.Cast(a, to=ir.DataType.INT32), op.Cast(b, to=ir.DataType.INT32))
        return op.Cast(product, to=dtype)

    program = exact(
        Int8MatMul(),
        (int8(4, 8), int8(8, 3)),
        custom_translation_table={torch.ops.higher_order.out_dtype: widened_matmul},
    )
    assert "MatMul" in op_types(program) and "MatMulInteger" not in op_types(program)


# --- quantize / dequantize -----------------------------------------------------------------------------
class QDQModel(torch.nn.Module):
    """What PT2E convert leaves: Q/DQ pairs around float ops, per-channel dequantized int8 weights."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", int8(6, 8, low=-127))
        self.register_buffer("weight_scales", torch.rand(6) * 0.01 + 0.001)
        self.register_buffer("weight_zero_points", torch.zeros(6, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q = qd.quantize_per_tensor.default(x, 0.02, 3, -128, 127, torch.int8)
        dq = qd.dequantize_per_tensor.default(q, 0.02, 3, -128, 127, torch.int8)
        weight = qd.dequantize_per_channel.default(
            self.weight, self.weight_scales, self.weight_zero_points, 0, -127, 127, torch.int8
        )
        y = torch.nn.functional.linear(dq, weight)
        scale, zero_point = torch.tensor(0.05), torch.tensor(-2)
        qy = qd.quantize_per_tensor.tensor(y, scale, zero_point, -100, 100, torch.int8)  # narrower than int8
        uy = qd.quantize_per_tensor.default(y, 0.125, 128, 0, 255, torch.uint8)  # a power-of-two scale
        low, high = torch.tensor(-90), torch.tensor(127)
        ty = qd.quantize_per_tensor.tensor2(y, scale, zero_point, low, high, torch.int8)  # run-time range
        return (
            q,
            qy,
            qd.dequantize_per_tensor.tensor(qy, scale, zero_point, -100, 100, torch.int8),
            qd.dequantize_per_tensor.tensor2(ty, scale, zero_point, low, high, torch.int8),
            qd.dequantize_per_tensor.default(uy, 0.125, 128, 0, 255, torch.uint8, out_dtype=torch.float16),
        )


def test_qdq_pairs_stay_quantizelinear_dequantizelinear_and_match_eager_bit_for_bit() -> None:
    x = torch.arange(-256, 256, dtype=torch.float32).reshape(64, 8) * 0.01
    # QuantizeLinear's round(x / 0.02) differs from eager's round(x * 50.0) on this grid: a lowering that
    # passed the scale straight to QuantizeLinear would fail below.
    assert not torch.equal(torch.round(x / torch.tensor(0.02)), torch.round(x * (1.0 / 0.02)))
    program = exact(QDQModel(), (x,))
    ops = op_types(program)
    # qy and ty share one QuantizeLinear (same input, scale and zero point); only their Clips differ
    assert ops.count("QuantizeLinear") == 3 and ops.count("DequantizeLinear") == 5
    assert "Round" not in ops and "Floor" not in ops  # not decomposed into arithmetic
    assert ops.count("Clip") == 2  # the quant ranges narrower than int8: [-100, 100] and the run-time one
    assert not [name for name in program.report.decomposed if "quantized_decomposed" in name]
    random = torch.randn(64, 8) * 3
    assert program.verify(random, rtol=0.0, atol=0.0)[0].passed


class PerChannel(torch.nn.Module):
    def forward(self, x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q = qd.quantize_per_channel.default(x, scales, zero_points, 1, -128, 127, torch.int8)
        return q, qd.dequantize_per_channel.default(q, scales, zero_points, 1, -128, 127, torch.int8)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float64])
def test_per_channel_quantize_dequantize_along_an_axis(scale_dtype: torch.dtype) -> None:
    x = torch.randn(4, 3, 50) * 2
    scales = torch.tensor([0.01, 0.02, 0.013], dtype=scale_dtype)
    zero_points = torch.tensor([0, 3, -5])
    program = exact(PerChannel(), (x, scales, zero_points))
    if scale_dtype == torch.float32:
        assert {"QuantizeLinear", "DequantizeLinear"} <= set(op_types(program))
    else:  # eager computes in float64, which QuantizeLinear cannot
        assert "Round" in op_types(program)


class Int16Quantization(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = qd.quantize_per_tensor.default(x, 0.001, 10, -32768, 32767, torch.int16)
        return q, qd.dequantize_per_tensor.default(q, 0.001, 10, -32768, 32767, torch.int16)


def test_int16_quantization_without_an_opset_18_kernel_is_eager_arithmetic() -> None:
    exact(Int16Quantization(), (torch.randn(256) * 40,))


# --- a whole W8A8 model ----------------------------------------------------------------------------------
class W8A8MLP(torch.nn.Module):
    """int8 activations x int8 weights, int32 accumulation, float rescale, requantize, dequantize."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("w1", int8(64, 32, low=-127))
        self.register_buffer("w1_scales", torch.rand(64) * 0.004 + 0.001)
        self.register_buffer("b1", torch.randn(64))
        self.register_buffer("w2", int8(10, 64, low=-127))
        self.register_buffer("w2_scales", torch.rand(10) * 0.004 + 0.001)
        self.x_scale, self.h_scale = 0.03, 0.02

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = qd.quantize_per_tensor.default(x, self.x_scale, 0, -128, 127, torch.int8)
        accumulator = out_dtype(aten.linear.default, torch.int32, xq, self.w1)
        h = torch.relu(accumulator.float() * (self.w1_scales * self.x_scale) + self.b1)
        hq = qd.quantize_per_tensor.default(h, self.h_scale, -128, -128, 127, torch.int8)
        # the activation zero point (-128) enters as a correction per output column: sum(w2) * -128
        accumulator2 = out_dtype(aten.mm.default, torch.int32, hq, self.w2.t())
        correction = self.w2.sum(dim=1, dtype=torch.int32) * -128
        y = (accumulator2 - correction).float() * (self.w2_scales * self.h_scale)
        yq = qd.quantize_per_tensor.default(y, 0.05, 0, -128, 127, torch.int8)
        return qd.dequantize_per_tensor.default(yq, 0.05, 0, -128, 127, torch.int8)


def test_w8a8_mlp_runs_in_onnxruntime_and_matches_eager_bit_for_bit() -> None:
    model = W8A8MLP()
    x = torch.randn(8, 32) * 2
    program = exact(model, (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    ops = op_types(program)
    assert ops.count("MatMulInteger") == 2 and "MatMul" not in ops
    assert ops.count("QuantizeLinear") == 3 and "DequantizeLinear" in ops
    assert program.verify(torch.randn(3, 32) * 2, rtol=0.0, atol=0.0)[0].passed


# --- dynamic (per-token) quantization: ONNX Runtime's MatMulIntegerToFloatFusion must not apply ---------------
class DynamicQuantizedLinear(torch.nn.Module):
    """int8 activations quantized per row at run time, int8 weights, ``acc.float() * (x_scale * w_scale) + bias``.

    ONNX Runtime's default session fused MatMulInteger -> Cast -> Mul -> Add into MatMulIntegerToFloat, whose
    kernel adds the bias before the per-row scale: up to 13% off (docs/ort-defects.md).
    """

    def __init__(self, in_features: int = 64, out_features: int = 48, bias: bool = True) -> None:
        super().__init__()
        weight = torch.randn(out_features, in_features)
        w_scale = weight.abs().amax() / 127
        self.register_buffer("weight", torch.round(weight / w_scale).clamp(-128, 127).to(torch.int8))
        self.weight[0, :] = -128  # extreme products
        self.register_buffer("w_scale", w_scale)
        self.register_buffer("bias", torch.randn(out_features) * 3 if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_scale = x.abs().amax(dim=-1, keepdim=True) / 127
        xq = torch.round(x / x_scale).clamp(-128, 127).to(torch.int8)
        accumulator = out_dtype(aten.mm.default, torch.int32, xq, self.weight.t())
        scaled = accumulator.float() * (x_scale * self.w_scale)
        return scaled + self.bias if self.bias is not None else scaled


def per_token_activations() -> torch.Tensor:
    """Rows a thousand times apart in magnitude, each with its extreme at +-127 after quantization."""
    x = torch.randn(8, 64) * torch.logspace(-3, 3, 8)[:, None]
    x[1, 5] = -x[1].abs().max() * 1.01  # -127 after rounding, the row's largest magnitude
    return x


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_dynamic_per_token_quantized_linear_is_exact_in_a_default_session(bias: bool, tmp_path: Any) -> None:
    import onnxruntime

    model = DynamicQuantizedLinear(bias=bias)
    x = per_token_activations()
    program = exact(model, (x,), dynamic_shapes={"x": {0: torch.export.Dim("tokens")}})
    path = str(tmp_path / "dynamic_quantized_linear.onnx")
    program.save(path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])  # as a user runs it
    for batch in (x, per_token_activations()[:3] * 7):
        (result,) = session.run(None, {session.get_inputs()[0].name: batch.numpy()})
        assert torch.from_numpy(result).equal(model(batch))


def test_the_differential_check_finds_the_fusion_without_its_guard() -> None:
    """program.divergence (run by every export test) reports what MatMulIntegerToFloatFusion does unguarded."""
    model = DynamicQuantizedLinear()
    program = exact(model, (per_token_activations(),))
    assert all(result.passed for result in program.divergence(per_token_activations()))
    guards = [node for node in program.model.graph if node.name.endswith("_fusion_guard")]
    assert len(guards) == 1
    guards[0].outputs[0].replace_all_uses_with(guards[0].inputs[0])
    program.model.graph.remove(guards[0], safe=True)
    program._session = program._unoptimized_session = None
    (result,) = program.divergence(per_token_activations())
    assert not result.passed and result.max_abs_error > 0.1
