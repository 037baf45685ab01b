"""float8 tensors: casts to and from them export at opset 19+ and match eager bit for bit (extremes included)."""

from __future__ import annotations

import pytest
import torch

import fx2onnx
from fx2onnx.errors import ExportError

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz]
# Zeros, tiny (subnormal or flushed), each format's largest values, overflow, inf and NaN.
EXTREMES = torch.tensor(
    [
        0.0,
        -0.0,
        1.5,
        -3.0,
        3.3,
        1e-3,
        1e-7,
        240.0,
        448.0,
        1000.0,
        57344.0,
        -1e9,
        float("inf"),
        -float("inf"),
        float("nan"),
    ]
)


class CastsThrough(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.to(self.dtype), (y.float() * 2).to(self.dtype), y.to(torch.float16) + 1, y


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    nan = want.float().isnan()
    return (
        got.dtype == want.dtype
        and torch.equal(got.float().isnan(), nan)
        and torch.equal(got.float()[~nan], want.float()[~nan])
    )


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
@pytest.mark.parametrize("opset", [19, 21, "min"])
def test_casts_to_and_from_float8_match_eager_bit_for_bit(dtype: torch.dtype, opset: int | str) -> None:
    model, args = CastsThrough(dtype), (EXTREMES, EXTREMES.to(dtype))
    program = fx2onnx.export(model, args, opset_version=opset)
    assert program.model.opset_imports[""] == (19 if opset == "min" else opset)
    got, want = program(*args), model(*args)
    assert [g.dtype for g in got] == [dtype, dtype, torch.float16, dtype]  # float8 outputs are float8 tensors
    assert all(_same(g, w) for g, w in zip(got, want, strict=True))
    assert all(r.passed for r in program.verify(*args))


def test_a_float8_model_below_opset_19_is_refused_naming_the_dtype_and_the_way_out() -> None:
    with pytest.raises(ExportError, match=r"float8_e5m2 needs ONNX opset 19.*opset_version is 18 \(the default\)") as e:
        fx2onnx.export(CastsThrough(torch.float8_e5m2), (EXTREMES, EXTREMES.to(torch.float8_e5m2)))
    assert (
        "opset_version=19" in str(e.value)
        and "opset_version='min'" in str(e.value)
        and "test_float8.py" in str(e.value)
    )


def test_opset_min_stays_at_18_without_float8() -> None:
    program = fx2onnx.export(torch.nn.ReLU(), (torch.randn(3),), opset_version="min")
    assert program.model.opset_imports[""] == 18


def test_float4_is_refused_with_the_reason() -> None:
    class Packs(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(torch.float4_e2m1fn_x2)

    with pytest.raises(Exception, match="float4_e2m1fn_x2 packs two float4 values"):
        fx2onnx.export(Packs(), (torch.zeros(4, dtype=torch.uint8),), opset_version=23)
