"""Hugging Face models built from small configs (no download): ModelOutput, caches, padding masks."""

from __future__ import annotations

import warnings

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


def test_llama_with_cache_outputs() -> None:
    ids = torch.randint(0, 300, (2, 6))
    program = check(llama(), (ids,), {"use_cache": True})
    names = [v.name for v in program.model.graph.outputs]
    assert names == ["logits"] + [f"past_key_values_{i}" for i in range(4)]
