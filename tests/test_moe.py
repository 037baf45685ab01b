"""Mixture-of-Experts models from transformers 5, whose experts run as grouped matrix products
(``aten::_grouped_mm`` in bfloat16, ``transformers::grouped_mm_fallback`` in the other dtypes), and
``_grouped_mm`` itself in each layout torch 2.13 runs on CPU (lowerings/moe.py)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import onnx_ir as ir
import pytest
import torch

import fx2onnx

from conftest import assert_exports_and_matches as check

transformers = pytest.importorskip("transformers")
warnings.filterwarnings("ignore", module="transformers")

SILENT_EXPERT = 4  # of 5: routed no token, whatever the input (see `route_around_one_expert`)


def route_around_one_expert(router_weight: torch.Tensor) -> None:
    """Router rows (v, -v, u, -u, 0): for any hidden state h, one of +-v.h and one of +-u.h is positive, so the two
    experts chosen never include the last (logit 0). Top-2 choices are never tied at the boundary either."""
    with torch.no_grad():
        v, u = router_weight[0].clone(), router_weight[2].clone()
        router_weight.copy_(torch.stack([v, -v, u, -u, torch.zeros_like(v)]))


def mixtral(dtype: torch.dtype) -> torch.nn.Module:
    config = transformers.MixtralConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=300,
        max_position_embeddings=128,
        num_local_experts=5,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    route_around_one_expert(model.model.layers[0].mlp.gate.weight)
    return model.to(dtype)


def expert_token_counts(model: torch.nn.Module, router: torch.nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    """How many (token, choice) pairs eager routes to each expert."""
    chosen: list[torch.Tensor] = []
    hook = router.register_forward_hook(lambda module, args, output: chosen.append(output[-1]))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        hook.remove()
    return torch.bincount(chosen[0].flatten(), minlength=router.weight.shape[0])


def grouped_products(program: fx2onnx.ONNXProgram) -> set[str]:
    """Each grouped-product op of the exported graph, with the implementation it was lowered by."""
    decisions = program.report.decisions
    return {f"{d.target} -> {d.chosen.implementation.name}" for d in decisions if "grouped_mm" in d.target}


FALLBACK = "transformers::grouped_mm_fallback -> fx2onnx:grouped_mm_fallback"
GROUPED_MM = "aten::_grouped_mm -> fx2onnx:grouped_mm"


def token_ids(batch: int, sequence: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 300, (batch, sequence), generator=torch.Generator().manual_seed(seed))


def test_mixtral_dynamic_batch_and_sequence_with_a_silent_expert() -> None:
    """The whole model (float32: transformers' fallback op); other sizes route other numbers of tokens to each
    expert; one expert never gets any (and with a single token, three of five get none)."""
    model = mixtral(torch.float32)
    router = model.model.layers[0].mlp.gate
    sizes = [(3, 7), (1, 1), (2, 19)]
    counts = [expert_token_counts(model, router, input_ids=token_ids(b, s, seed=b * s)) for b, s in sizes]
    assert all(c[SILENT_EXPERT] == 0 for c in counts)
    assert len({tuple(c.tolist()) for c in counts}) == len(counts)  # the run-time group sizes differ
    batch, sequence = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("sequence", min=1, max=64)
    program = check(
        model,
        (),
        {"input_ids": token_ids(2, 12, seed=0), "use_cache": False},
        dynamic_shapes={"input_ids": {0: batch, 1: sequence}, "use_cache": None},
        run_with=[((), {"input_ids": token_ids(b, s, seed=b * s), "use_cache": False}) for b, s in sizes],
    )
    assert grouped_products(program) == {FALLBACK}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_mixtral_moe_block_dynamic_tokens_with_a_silent_expert(dtype: torch.dtype) -> None:
    """The MoE block alone (router, sort by expert, offsets, grouped products) in bfloat16 (``_grouped_mm``, whose
    MatMuls legalization runs in float32) and float16 (the fallback op)."""
    block = mixtral(dtype).model.layers[0].mlp
    hidden = lambda *shape: torch.randn(*shape, 64, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)  # noqa: E731
    sizes = [(3, 7), (1, 1), (2, 19)]
    counts = [expert_token_counts(block, block.gate, hidden_states=hidden(*size)) for size in sizes]
    assert all(c[SILENT_EXPERT] == 0 for c in counts)
    assert len({tuple(c.tolist()) for c in counts}) == len(counts)
    batch, sequence = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("sequence", min=1, max=64)
    program = check(
        block,
        (hidden(2, 12),),
        dynamic_shapes=({0: batch, 1: sequence},),
        run_with=[((hidden(*size),), {}) for size in sizes],
    )
    assert grouped_products(program) == {GROUPED_MM if dtype == torch.bfloat16 else FALLBACK}
    # The lowerings emit MatMuls in the inputs' dtype; legalization runs them in float32 (ONNX Runtime's CPU
    # provider has no bfloat16 MatMul), each product rounded once to the dtype, as eager's CPU kernels do.
    matmul_types = {value.dtype for node in program.model.graph if node.op_type == "MatMul" for value in node.inputs}
    assert matmul_types == {ir.DataType.FLOAT}


def test_qwen3_moe_bfloat16() -> None:
    """A second family (8 experts of their own intermediate size), through ``_grouped_mm``."""
    config = transformers.Qwen3MoeConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        moe_intermediate_size=32,
        vocab_size=300,
        max_position_embeddings=128,
        num_experts=8,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).eval().to(torch.bfloat16)
    sequence = torch.export.Dim("sequence", min=1, max=64)
    program = check(
        model,
        (),
        {"input_ids": token_ids(2, 12, seed=1), "use_cache": False},
        dynamic_shapes={"input_ids": {1: sequence}, "use_cache": None},
        run_with=[((), {"input_ids": token_ids(2, s, seed=s), "use_cache": False}) for s in (1, 5, 30)],
    )
    assert grouped_products(program) == {GROUPED_MM}


def test_gpt_oss_transposed_experts_with_bias() -> None:
    """gpt-oss keeps its expert weights as (experts, in, out) and adds per-expert biases."""
    config = transformers.GptOssConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=32,
        vocab_size=300,
        max_position_embeddings=128,
        num_local_experts=4,
        num_experts_per_tok=2,
        layer_types=["full_attention"],
    )
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    program = check(model, (), {"input_ids": token_ids(2, 9, seed=2), "use_cache": False})
    assert grouped_products(program) == {FALLBACK}


# --- the ops themselves --------------------------------------------------------------------------------------------
class GroupedMM(torch.nn.Module):
    """``torch._grouped_mm(a, weight, offs=offs)`` with the weight a parameter, as in an MoE layer."""

    def __init__(self, weight: torch.Tensor, **options: object) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.options = options

    def forward(self, a: torch.Tensor, offs: torch.Tensor | None = None) -> torch.Tensor:
        return torch._grouped_mm(a, self.weight, offs=offs, **self.options)


def offsets(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


# torch 2.13 runs _grouped_mm on CPU for float32/float16/bfloat16, but its meta kernel (so torch.export) takes
# bfloat16 only, with 16-byte aligned strides: hence bfloat16 and sizes in multiples of 8.
BF16 = torch.bfloat16


def test_grouped_mm_rows_grouped_with_empty_groups_and_dynamic_rows() -> None:
    """2-D x 3-D, the MoE forward: rows offs[g-1]:offs[g] times weight[g]; empty groups first, between, last."""
    torch.manual_seed(0)
    model = GroupedMM(torch.randn(3, 16, 8, dtype=BF16))
    rows = lambda n: torch.randn(n, 16, dtype=BF16)  # noqa: E731
    check(
        model,
        (rows(24), offsets(8, 8, 24)),
        dynamic_shapes=({0: torch.export.Dim("rows", min=1, max=64)}, None),
        run_with=[
            ((rows(24), offsets(8, 8, 24)), {}),
            ((rows(5), offsets(0, 0, 5)), {}),
            ((rows(40), offsets(40, 40, 40)), {}),
            ((rows(1), offsets(0, 1, 1)), {}),
        ],
    )


def test_grouped_mm_rows_grouped_by_a_transposed_weight_with_out_dtype() -> None:
    """transformers passes weight.transpose(-2, -1) (column-major); out_dtype equal to the inputs' is accepted."""
    torch.manual_seed(0)
    model = GroupedMM(torch.randn(4, 8, 16, dtype=BF16).transpose(-2, -1), out_dtype=BF16)
    check(model, (torch.randn(16, 16, dtype=BF16), offsets(3, 3, 10, 16)))


def test_grouped_mm_batched_without_offsets() -> None:
    """3-D x 3-D: one product per batch entry."""
    torch.manual_seed(0)
    check(GroupedMM(torch.randn(3, 16, 8, dtype=BF16)), (torch.randn(3, 8, 16, dtype=BF16),))


def test_grouped_mm_contraction_grouped() -> None:
    """2-D x 2-D: (M, K) x (K, N) with K split by offs -> (G, M, N); an empty group gives zeros, as in eager, and
    columns beyond offs[-1] are left out."""
    torch.manual_seed(0)
    model = GroupedMM(torch.randn(24, 16, dtype=BF16))
    a = torch.randn(8, 24, dtype=BF16)
    check(model, (a, offsets(5, 5, 24)), run_with=[((a, offsets(5, 5, 24)), {}), ((a, offsets(0, 17, 20)), {})])


def test_grouped_mm_columns_grouped() -> None:
    """3-D x 2-D: (G, M, K) x (K, N) with N's columns split by offs -> (M, N)."""
    torch.manual_seed(0)
    model = GroupedMM(torch.randn(16, 24, dtype=BF16))
    a = torch.randn(3, 8, 16, dtype=BF16)
    check(model, (a, offsets(5, 5, 24)), run_with=[((a, offsets(5, 5, 24)), {}), ((a, offsets(0, 0, 24)), {})])


class Fallback(torch.nn.Module):
    def forward(self, input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        return torch.ops.transformers.grouped_mm_fallback(input, weight, offs)


@pytest.mark.parametrize("offs_dtype", [torch.int32, torch.int64], ids=str)
def test_transformers_fallback_rows_beyond_the_last_offset_are_zeros(offs_dtype: torch.dtype) -> None:
    """The fallback op (any float dtype, int32 or int64 offsets) leaves rows beyond offs[-1] at zero."""
    torch.manual_seed(0)
    weight = torch.randn(3, 6, 5)
    inputs = lambda n, *offs: (torch.randn(n, 6), weight, torch.tensor(offs, dtype=offs_dtype))  # noqa: E731
    check(
        Fallback(),
        inputs(10, 2, 2, 7),
        dynamic_shapes=({0: torch.export.Dim("rows", min=1, max=64)}, None, None),
        run_with=[(inputs(10, 2, 2, 7), {}), (inputs(4, 0, 4, 4), {}), (inputs(9, 0, 0, 0), {})],
    )


def test_fallback_lowering_is_registered_without_importing_transformers() -> None:
    """The registry keys the custom op by name: no transformers import is needed to lower it."""
    code = (
        "import sys; from fx2onnx._registry import Registry;"
        "assert Registry.default().lowers('transformers::grouped_mm_fallback');"
        "assert 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
