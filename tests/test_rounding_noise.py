"""verify() on float16/bfloat16 models: outputs beyond the fixed tolerance are judged against the rounding noise
of the dtype itself (distance to the same model run in float32, against eager's own distance)."""

from __future__ import annotations

import os

import pytest
import torch
from onnxscript import opset18 as op
from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

import fx2onnx
from fx2onnx._rounding_noise import compare_to_reference
from fx2onnx._verification import TOLERANCES
from fx2onnx.examples import TinyGPT


def _tiny_gpt(dtype: torch.dtype, width: int = 64, layers: int = 2) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return TinyGPT(width=width, layers=layers).eval().to(dtype), torch.randint(0, 512, (2, 64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_low_precision_transformer_passes_within_its_rounding_noise(dtype: torch.dtype) -> None:
    model, ids = _tiny_gpt(dtype, width=128, layers=4)
    (result,) = fx2onnx.export(model, (ids,)).verify(ids)
    rtol, atol = TOLERANCES[dtype]
    # Four layers of rounding already put eager and ONNX Runtime beyond any fixed tolerance near zero...
    assert result.max_abs_error > atol and result.max_rel_error > rtol
    # ...while the exported model is as close to the float32 result as eager is.
    assert result.noise is not None and result.noise.within_noise and result.passed, str(result)
    assert result.noise.onnx_mean < 1.1 * result.noise.eager_mean
    assert "within" in str(result) and "rounding noise" in str(result)


def quick_gelu(self: TFloat, approximate: str = "none") -> TFloat:
    """x * sigmoid(1.702 x): up to 0.02 from GELU, wrong for a model that asks for GELU."""
    return op.Mul(self, op.Sigmoid(op.Mul(self, op.CastLike(1.702, self))))


def relu_for_gelu(self: TFloat, approximate: str = "none") -> TFloat:
    return op.Relu(self)


@pytest.mark.parametrize(("dtype", "wrong"), [(torch.bfloat16, relu_for_gelu), (torch.float16, quick_gelu)])
def test_a_wrong_lowering_is_beyond_the_rounding_noise(dtype: torch.dtype, wrong: object) -> None:
    model, ids = _tiny_gpt(dtype)
    program = fx2onnx.export(model, (ids,), custom_translation_table={torch.ops.aten.gelu.default: wrong})
    (result,) = program.verify(ids)
    assert result.noise is not None and not result.noise.within_noise and not result.passed, str(result)
    assert result.noise.onnx_mean > 2 * result.noise.eager_mean
    assert "MISMATCH" in str(result) and "beyond" in str(result)


class FloatLogits(torch.nn.Module):
    """A low-precision model returning its logits as float32, as Mamba does (``logits.float()``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).float()


@pytest.mark.parametrize("wrong", [None, quick_gelu])
def test_float32_outputs_of_a_float16_model_are_judged_by_its_rounding_noise(wrong: object) -> None:
    model, ids = _tiny_gpt(torch.float16, width=128, layers=4)
    table = {torch.ops.aten.gelu.default: wrong} if wrong is not None else None
    (result,) = fx2onnx.export(FloatLogits(model), (ids,), custom_translation_table=table).verify(ids)
    rtol, atol = TOLERANCES[torch.float32]
    assert result.expected_dtype == "float32" and result.max_abs_error > atol and result.max_rel_error > rtol
    assert result.noise is not None and result.passed == (wrong is None), str(result)
    assert ("within" if wrong is None else "beyond") + " float16 rounding noise" in str(result)


def test_tolerances_the_caller_gives_are_not_second_guessed() -> None:
    model, ids = _tiny_gpt(torch.bfloat16)
    (result,) = fx2onnx.export(model, (ids,)).verify(ids, rtol=5e-2, atol=5e-2)
    assert not result.passed and result.noise is None


def test_export_with_verify_and_its_report_show_the_noise_verdict(tmp_path: os.PathLike[str]) -> None:
    model, ids = _tiny_gpt(torch.bfloat16)
    path = os.path.join(tmp_path, "report.md")
    program = fx2onnx.export(model, (ids,), verify=True, report=path)  # raises if verification fails
    (result,) = program.report.verification
    assert result.passed and result.noise is not None
    with open(path, encoding="utf-8") as file:
        assert "bfloat16 rounding noise, vs float32 eager" in file.read()


@pytest.mark.parametrize(("noise_share", "within"), [(0.8, True), (0.01, False)])
def test_a_mean_error_as_large_as_the_outputs_is_held_to_the_max_factor(noise_share: float, within: bool) -> None:
    """EfficientNet-B0 in float16 fed pixels near float16's maximum (random weights): eager's own mean error is 80%
    of the float32 logits' mean magnitude, and valid float16 evaluations spread from 0.76 to 1.29 times it (eager
    on inputs one ulp apart, ONNX Runtime with and without its NCHWc Conv). An ONNX mean error 1.4 times eager's
    is then noise (max factor 2), where noise 1% of the outputs' size it is beyond (mean factor 1.25)."""
    generator = torch.Generator().manual_seed(0)
    reference = 1000 * torch.randn(4096, generator=generator)
    drift = noise_share * 1000 * torch.randn(4096, generator=generator)
    eager, actual = (reference + drift).half(), (reference - 1.4 * drift).half()
    noise = compare_to_reference(eager, actual, reference, TOLERANCES[torch.float16][1])
    assert noise is not None
    assert 1.3 < noise.onnx_mean / noise.eager_mean < 1.5 and noise.onnx_max < 2 * noise.eager_max
    assert noise.within_noise == within, str(noise)
    assert noise.noise_dominated == within
    assert ("of the float32 outputs' mean magnitude" in str(noise)) == within
