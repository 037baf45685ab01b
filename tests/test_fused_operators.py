"""At opset >= 23, attention and RMS norm become ONNX's own operators; below, the decomposed lowerings stay.

``scaled_dot_product_attention`` lowers to ``Attention`` (fx2onnx's lowering, src/fx2onnx/lowerings/
attention.py) and onnxscript's fusions rewrite RMS-norm patterns into ``RMSNormalization`` (finalize in
src/fx2onnx/export.py). Every case runs in ONNX Runtime and is compared with eager.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from conftest import Call, assert_exports_and_matches


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(len(shape) + sum(shape))).to(dtype)


def op_counts(program: Any) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in program.model.graph)


ATTENTION_CASES = {
    "causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (2, 3, 6, 8), (2, 3, 6, 8)),
    "causal, fewer queries": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        (1, 2, 4, 8),
        (1, 2, 7, 8),
    ),
    "grouped query": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=0.2),
        (1, 4, 5, 8),
        (1, 2, 5, 8),
    ),
    "3-d": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (2, 5, 8), (2, 6, 8)),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_operator_at_opset_23(case: str, dtype: torch.dtype) -> None:
    function, query_shape, key_shape = ATTENTION_CASES[case]
    args = (randn(*query_shape, dtype=dtype), randn(*key_shape, dtype=dtype), randn(*key_shape, dtype=dtype))
    program = assert_exports_and_matches(Call(function), args, opset_version=23)
    assert op_counts(program)["Attention"] == 1
    assert op_counts(program)["Softmax"] == 0


def test_float_mask_at_opset_23_and_decomposed_at_18() -> None:
    args = (randn(1, 2, 4, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8), randn(4, 6))
    model = Call(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    assert op_counts(assert_exports_and_matches(model, args, opset_version=23))["Attention"] == 1
    assert op_counts(assert_exports_and_matches(model, args, opset_version=18))["Attention"] == 0


def test_boolean_mask_keeps_zero_rows_of_eager() -> None:
    """Eager gives zeros for a query row whose mask is all False; the decomposed lowering keeps that."""
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1] = False
    args = (randn(1, 2, 4, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8), mask)
    model = Call(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    assert_exports_and_matches(model, args, opset_version=23)


class RMSNormBlock(torch.nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(width) + 0.5)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return self.proj(normed)


@pytest.mark.parametrize("opset", [18, 23])
def test_rms_norm_fused_from_opset_23(opset: int) -> None:
    program = assert_exports_and_matches(RMSNormBlock().eval(), (randn(2, 5, 16),), opset_version=opset)
    assert op_counts(program)["RMSNormalization"] == (1 if opset >= 23 else 0)
