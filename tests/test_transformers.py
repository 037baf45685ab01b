"""Hugging Face models built from small configs (no download): ModelOutput, caches, padding masks."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable

import pytest
import torch

from conftest import assert_exports_and_matches as check

transformers = pytest.importorskip("transformers")
warnings.filterwarnings("ignore", module="transformers")


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_gpt2_dynamic_batch_and_sequence_with_padding() -> None:
    ids = torch.randint(0, 300, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=64)
    padded = torch.ones(3, 7, dtype=torch.long)
    padded[0, :2] = 0  # left padding: those query rows attend to nothing; eager gives zeros there
    program = check(
        gpt2(),
        (),
        {"input_ids": ids, "attention_mask": mask, "use_cache": False},
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        run_with=[((), {"input_ids": torch.randint(0, 300, (3, 7)), "attention_mask": padded, "use_cache": False})],
    )
    assert [v.name for v in program.model.graph.outputs] == ["logits"]
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "seq"]


def test_gpt2_dynamic_batch_from_a_batch_of_one() -> None:
    """The usual call: one sentence as the example. transformers' masking compares the batch with its positions'
    1 and took the size-1 branch: the batch was pinned to 1 (ONNX Runtime refused a batch of 3)."""
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=64)
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(0))
    program = check(
        gpt2(),
        (),
        {"input_ids": ids, "use_cache": False},
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "use_cache": None},
        run_with=[((), {"input_ids": torch.randint(0, 300, (b, s)), "use_cache": False}) for b, s in ((3, 7), (1, 9))],
    )
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "seq"]


def cache_argument(model: torch.nn.Module) -> str:
    """The KV cache's argument and output field: `past_key_values` until transformers 5.23, `cache` since."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def test_llama_with_cache_outputs() -> None:
    ids = torch.randint(0, 300, (2, 6))
    model = llama()
    program = check(model, (ids,), {"use_cache": True})
    names = [v.name for v in program.model.graph.outputs]
    assert names == ["logits"] + [f"{cache_argument(model)}_{i}" for i in range(4)]


def llama_step_inputs(
    config: transformers.LlamaConfig, cache_name: str, batch: int, new: int, past: int, dtype: torch.dtype
) -> dict:
    """One decoding step's inputs: `new` tokens after a cache of `past` (random keys/values)."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=config)
    head_dim = config.hidden_size // config.num_attention_heads
    for layer in range(config.num_hidden_layers):
        shape = (batch, config.num_key_value_heads, past, head_dim)
        cache.update(torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype), layer)
    return {
        "input_ids": torch.randint(0, 300, (batch, new)),
        "attention_mask": torch.ones(batch, past + new, dtype=torch.long),
        cache_name: cache,
        "use_cache": True,
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_decoding_step_with_cache_input_and_dynamic_sizes(dtype: torch.dtype) -> None:
    """The usual export for generation: a KV cache as input. Eager appends to the cache it is given, so this
    also checks that verification runs ONNX Runtime on the inputs as given, not as eager left them."""
    model = llama().to(dtype)
    config = model.config
    batch, new, past = (torch.export.Dim(n, min=1, max=32) for n in ("batch", "new", "past"))
    total = torch.export.Dim("total", min=4, max=64)
    layers = config.num_hidden_layers
    cache_name = cache_argument(model)
    check(
        model,
        (),
        llama_step_inputs(config, cache_name, 2, 3, 5, dtype),
        dynamic_shapes={
            "input_ids": {0: batch, 1: new},
            "attention_mask": {0: batch, 1: total},
            cache_name: [{0: batch, 2: past}] * (2 * layers),
        },
        run_with=[
            ((), llama_step_inputs(config, cache_name, b, n, p, dtype)) for b, n, p in [(3, 1, 7), (1, 4, 4), (2, 3, 5)]
        ],
    )


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_sdpa_with_boolean_mask_becomes_attention_at_opset_23(build: Callable[[], torch.nn.Module]) -> None:
    """transformers' SDPA attention passes a boolean mask (causal and padding): at opset 23 each layer's
    attention is one ONNX Attention, padded query rows (all False) included, in ONNX Runtime's CPU provider."""
    model = build()
    model.config._attn_implementation = "sdpa"
    ids = torch.randint(0, 300, (2, 7), generator=torch.Generator().manual_seed(0))
    padded = torch.ones(2, 7, dtype=torch.long)
    padded[0, :3] = 0  # left padding: those query rows attend to nothing
    batch, seq = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("seq", min=2, max=32)
    inputs = {"input_ids": ids, "attention_mask": padded, "use_cache": False}
    unpadded = {"input_ids": ids[:1, :4], "attention_mask": torch.ones(1, 4, dtype=torch.long), "use_cache": False}
    program = check(
        model,
        (),
        inputs,
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        opset_version=23,
        run_with=[((), inputs), ((), unpadded)],
    )
    sdpa = [n for n in program.exported_program.graph.nodes if "scaled_dot_product_attention" in str(n.target)]
    masks = [n.args[3] if len(n.args) > 3 else n.kwargs.get("attn_mask") for n in sdpa]
    assert len(sdpa) == 2 and all(m is not None and m.meta["val"].dtype == torch.bool for m in masks)
    op_types = [node.op_type for node in program.model.graph]
    assert op_types.count("Attention") == model.config.num_hidden_layers
    if build is llama:  # its rotary embeddings too, their caches expanded to the dynamic batch
        assert op_types.count("RotaryEmbedding") == 2 * model.config.num_hidden_layers
    assert "Softmax" not in op_types
