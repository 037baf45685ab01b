"""At opset >= 23, attention, RMS norm and rotary embeddings become ONNX's own operators; below, they stay decomposed.

``scaled_dot_product_attention`` lowers to ``Attention`` (fx2onnx's lowering, src/fx2onnx/_lowerings/
attention.py), onnxscript's fusions rewrite RMS-norm patterns into ``RMSNormalization``, and fx2onnx's rules
(src/fx2onnx/fusions.py) rewrite ``x * cos + rotate_half(x) * sin`` into ``RotaryEmbedding`` (both in finalize,
src/fx2onnx/_export.py). Every case runs in ONNX Runtime and is compared with eager.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import onnx
import onnx_ir as ir
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_boolean_mask_at_opset_23_keeps_zero_rows_of_eager(dtype: torch.dtype) -> None:
    """A boolean mask (True: attend, as transformers' LLaMA and GPT-2 pass) becomes Attention's own mask at
    opset 23; eager gives zeros for a query row whose mask is all False, and so do Attention and the
    decomposed lowering below opset 23. Values at the dtype's extremes keep the softmax honest."""
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1] = False
    mask[2, ::2] = False
    query = randn(1, 2, 4, 8, dtype=dtype)
    query[0, 0, 3] = torch.finfo(dtype).max / 1e4  # a score far beyond the others: one key takes all the weight
    args = (query, randn(1, 2, 6, 8, dtype=dtype), randn(1, 2, 6, 8, dtype=dtype), mask)
    model = Call(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    assert op_counts(assert_exports_and_matches(model, args, opset_version=23))["Attention"] == 1
    assert op_counts(assert_exports_and_matches(model, args, opset_version=18))["Attention"] == 0


def test_boolean_mask_of_grouped_query_and_3d_attention_at_opset_23() -> None:
    grouped = Call(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True))
    mask = torch.rand(1, 1, 5, 7, generator=torch.Generator().manual_seed(0)) > 0.3
    args = (randn(1, 4, 5, 8), randn(1, 2, 7, 8), randn(1, 2, 7, 8), mask)
    assert op_counts(assert_exports_and_matches(grouped, args, opset_version=23))["Attention"] == 1
    plain = Call(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    args = (randn(2, 5, 8), randn(2, 7, 8), randn(2, 7, 8), mask[0].expand(2, 5, 7))
    assert op_counts(assert_exports_and_matches(plain, args, opset_version=23))["Attention"] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_blocked_row_guard_reduces_one_byte_flags(dtype: torch.dtype) -> None:
    """Below opset 23, a masked SDPA zeroes the rows whose every score is -inf (eager's _safe_softmax) from
    per-score flags reduced with ReduceMin; the flags are uint8, not int32, so that the guard costs ONNX Runtime no
    more than the reference exporter's IsNaN + Where (docs in _lowerings/attention.py). Rows: some keys blocked,
    every key blocked, a NaN score beside blocked keys (NaN, as eager)."""
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1] = False
    mask[2, ::2] = False
    mask[3, 1:] = False
    query = randn(1, 2, 4, 8, dtype=dtype)
    query[0, 1, 3, 0] = float("nan")
    args = (query, randn(1, 2, 6, 8, dtype=dtype), randn(1, 2, 6, 8, dtype=dtype), mask)
    model = Call(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m))
    program = assert_exports_and_matches(model, args, opset_version=18)
    reduced = [node.inputs[0].dtype for node in program.model.graph if node.op_type == "ReduceMin"]
    assert reduced == [ir.DataType.UINT8]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_causal_mask_is_a_triangle_and_an_add(tmp_path: Any, dtype: torch.dtype, dynamic: bool) -> None:
    """Below opset 23, is_causal keeps the scores on and below the diagonal with Trilu and adds -inf above it,
    not Where(mask, scores, -inf): ONNX Runtime's Where is the slower kernel (three passes), Trilu + Add cost
    little more than the reference exporter's Add of a float mask (which turns a masked inf or NaN score into NaN).
    A future key holding NaN, and a masked score of +inf, stay out of the earlier queries' rows, as in eager."""
    import onnxruntime

    query, key, value = randn(1, 2, 5, 8, dtype=dtype), randn(1, 2, 5, 8, dtype=dtype), randn(1, 2, 5, 8, dtype=dtype)
    key[0, 0, 4, 0] = float("nan")  # key 4: masked for queries 0-3
    query[0, 1, 0, 1], key[0, 1, 3, 1] = 1e30 if dtype != torch.bfloat16 else 1e38, 1e30  # q0 . k3 = +inf, masked
    model = Call(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert torch.isfinite(model(query, key, value)[0, :, :4]).all()
    length = torch.export.Dim("length")
    dims = {2: length} if dynamic else None
    shorter = (query[:, :, :3], key[:, :, :3], value[:, :, :3])
    program = assert_exports_and_matches(
        model,
        (query, key, value),
        dynamic_shapes=((dims, dims, dims),) if dynamic else None,
        run_with=[((query, key, value), {}), (shorter, {})] if dynamic else None,
        opset_version=18,
    )
    path, optimized = os.path.join(tmp_path, "causal.onnx"), os.path.join(tmp_path, "causal.opt.onnx")
    program.save(path)
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = optimized
    onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    op_types = collections.Counter(node.op_type for node in onnx.load(optimized).graph.node)
    assert op_types["Trilu"] == 1
    assert op_types["Where"] == (1 if dynamic else 0)  # the dynamic bias: Where of the [L, L] mask, not the scores


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


# --- rotary embeddings -> RotaryEmbedding (fx2onnx's rules in src/fx2onnx/fusions.py) -------------------------


def rotate_half_chunk(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotate_half_slice(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_angles(positions: torch.Tensor, width: int) -> torch.Tensor:
    """``cat((f, f), -1)`` of the angles, as LLaMA computes them: [..., S, width]."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, width, 2, dtype=torch.float32) / width))
    angles = positions.to(torch.float32)[..., None] * inv_freq
    return torch.cat((angles, angles), dim=-1)


class ConstantRotary(torch.nn.Module):
    """q, k: [B, H, S, D]; cos/sin [S, D] from a static length (constants once folded)."""

    def __init__(self, rotate_half: Any, cos_first: bool = True, width: int = 16) -> None:
        super().__init__()
        self.rotate_half, self.cos_first, self.width = rotate_half, cos_first, width

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = rotary_angles(torch.arange(q.shape[2]), self.width)
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        if self.cos_first:
            return q * cos + self.rotate_half(q) * sin, k * cos + self.rotate_half(k) * sin
        return sin * self.rotate_half(q) + cos * q, self.rotate_half(k) * sin + k * cos


class RuntimeRotary(torch.nn.Module):
    """HF style: cos/sin [B, S, D] computed from a positions input, unsqueezed at 1; rotation on the first `rotary`."""

    def __init__(self, rotary: int | None = None) -> None:
        super().__init__()
        self.rotary = rotary

    def forward(self, q: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        width = self.rotary or q.shape[-1]
        if positions is None:  # [S, D] tables, the same for every batch row
            angles = rotary_angles(torch.arange(q.shape[2]), width)
            cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        else:
            angles = rotary_angles(positions, width)
            cos, sin = angles.cos().unsqueeze(1).to(q.dtype), angles.sin().unsqueeze(1).to(q.dtype)
        part, rest = q[..., :width], q[..., width:]
        rotated = cos * part + sin * rotate_half_slice(part)
        return torch.cat((rotated, rest), dim=-1) if self.rotary else rotated


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """GPT-J's interleaved rotation: pairs (x[2i], x[2i+1]) -> (-x[2i+1], x[2i])."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "rotate_half, cos_first", [(rotate_half_chunk, True), (rotate_half_slice, False)], ids=["chunk", "slice, swapped"]
)
def test_rotary_with_constant_tables_fuses(rotate_half: Any, cos_first: bool, dtype: torch.dtype) -> None:
    args = (randn(2, 4, 6, 16, dtype=dtype), randn(2, 2, 6, 16, dtype=dtype))
    program = assert_exports_and_matches(ConstantRotary(rotate_half, cos_first), args, opset_version=23)
    assert op_counts(program)["RotaryEmbedding"] == 2
    assert op_counts(program)["Neg"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_from_runtime_positions_fuses(dtype: torch.dtype) -> None:
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 3, 9, 1, 0]])
    program = assert_exports_and_matches(RuntimeRotary(), (randn(2, 3, 5, 8, dtype=dtype), positions), opset_version=23)
    assert op_counts(program)["RotaryEmbedding"] == 1
    assert op_counts(program)["Neg"] == 0


def test_partial_rotary_and_dynamic_length_fuse() -> None:
    """Rotation of the first 8 of 12 channels; batch and length dynamic: [S, D/2] caches computed and expanded."""
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    args, other = (randn(2, 3, 5, 12),), (randn(1, 3, 7, 12),)
    program = assert_exports_and_matches(
        RuntimeRotary(rotary=8),
        args,
        dynamic_shapes=({0: batch, 2: length},),
        run_with=[(args, {}), (other, {})],
        opset_version=23,
    )
    (rotary,) = [node for node in program.model.graph if node.op_type == "RotaryEmbedding"]
    assert rotary.attributes["rotary_embedding_dim"].as_int() == 8
    assert op_counts(program)["Neg"] == 0


def test_interleaved_rotary_fuses() -> None:
    """Constant tables with equal neighbours (repeat_interleave), scaled by a run-time factor."""

    def interleaved(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        angles = rotary_angles(torch.arange(q.shape[2]), 8)[..., :4]
        cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
        return q * (cos * scale) + rotate_every_two(q) * (sin * scale)

    program = assert_exports_and_matches(Call(interleaved), (randn(2, 3, 5, 8), torch.tensor(0.75)), opset_version=23)
    (rotary,) = [node for node in program.model.graph if node.op_type == "RotaryEmbedding"]
    assert rotary.attributes["interleaved"].as_int() == 1


def test_rotary_left_unfused_when_not_provably_equal() -> None:
    """Unequal halves of cos (runtime, constant), a rotation not by halves, an interleaved rotation with tables whose
    neighbours differ: all stay decomposed, and still match eager."""

    def unequal_runtime_halves(q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = rotary_angles(positions, 8)
        cos = torch.cat((angles[..., :4], 2 * angles[..., 4:]), dim=-1).cos().unsqueeze(1)
        return q * cos + rotate_half_slice(q) * angles.sin().unsqueeze(1)

    def unequal_constant_halves(q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = rotary_angles(torch.arange(q.shape[2]), 8)
        cos = angles.cos().clone()
        cos[1, 5] = 0.25
        return q * cos + rotate_half_chunk(q) * angles.sin() + positions[..., None, :, None]

    def not_by_halves(q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = rotary_angles(positions, 8)
        rotated = torch.cat((-q[..., 3:], q[..., :3]), dim=-1)
        return q * angles.cos().unsqueeze(1) + rotated * angles.sin().unsqueeze(1)

    def interleaved_with_halved_tables(q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        angles = rotary_angles(torch.arange(q.shape[2]), 8)  # equal halves, unequal neighbours
        return q * angles.cos() + rotate_every_two(q) * angles.sin()

    args = (randn(2, 3, 5, 8), torch.arange(10).reshape(2, 5))
    cases = (unequal_runtime_halves, unequal_constant_halves, not_by_halves, interleaved_with_halved_tables)
    for function in cases:
        program = assert_exports_and_matches(Call(function), args, opset_version=23)
        assert op_counts(program)["RotaryEmbedding"] == 0, function.__name__


@pytest.mark.parametrize(
    "opset",
    [
        18,
        pytest.param(
            23,
            marks=pytest.mark.xfail(
                strict=True,
                reason="ONNX Runtime's Attention (is_causal) adds its mask to the scores: inf + -inf is NaN",
            ),
        ),
    ],
)
def test_causal_mask_hides_an_infinite_score_it_masks(opset: int) -> None:
    """A masked score of +inf (q . k overflowing float32) is hidden, as eager's kernel does, not added to -inf
    (inf + -inf is NaN: a whole row of NaNs where eager attends to the unmasked keys)."""
    query, key = torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4)
    query[..., 0, 0], key[..., 1, 0], key[..., 0, 0] = 3e38, 3e38, 1.0
    value = torch.arange(12.0).reshape(1, 1, 3, 4)
    model = Call(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert torch.isfinite(model(query, key, value)).all()
    assert_exports_and_matches(model, (query, key, value), opset_version=opset)
