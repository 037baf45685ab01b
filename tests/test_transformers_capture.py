"""transformers' model families built from small configs (random weights, no download) export without a full
decomposition: the ops their code brings (``aten::diff`` and ``aten::to.dtype_layout`` from the mask code,
``aten::to.device`` from rotary embeddings, ``aten::min.other`` and an in-place ``+=`` from T5's position buckets,
``aten::detach_`` from the caches) are lowered or handled locally, so capture never retraces the whole program."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import fx2onnx

from conftest import assert_exports_and_matches as check

transformers = pytest.importorskip("transformers")
warnings.filterwarnings("ignore", module="transformers")

VOCAB = 300


def assert_not_fully_decomposed(program: fx2onnx.ONNXProgram) -> None:
    record = program.report.decomposition
    assert record.strategy in ("none", "local"), record.describe()
    assert not record.nodes, f"ops decomposed that a lowering should take: {record.describe()}"


def ids(batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(batch * 100 + length))


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("use_cache", [False, True])
def test_gpt2(use_cache: bool) -> None:
    """Without a cache and a mask, the mask code looks for packed sequences (aten::diff); with one, the cache's
    empty tensors are detached in place (aten::detach_); both move position embeddings with .to(device)."""
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", min=2, max=64)
    program = check(
        gpt2(),
        (),
        {"input_ids": ids(2, 10), "use_cache": use_cache},
        dynamic_shapes={"input_ids": {0: batch, 1: length}, "use_cache": None},
        run_with=[((), {"input_ids": ids(3, 7), "use_cache": use_cache})],
    )
    assert_not_fully_decomposed(program)


def test_llama_8_layer_decoder() -> None:
    config = transformers.LlamaConfig(
        num_hidden_layers=8,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    program = check(model, (ids(2, 12),), {"use_cache": False})
    assert_not_fully_decomposed(program)


def test_bert() -> None:
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=VOCAB
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0  # right padding
    kwargs: dict[str, Any] = {"input_ids": ids(2, 9), "attention_mask": mask, "token_type_ids": torch.zeros_like(mask)}
    program = check(model, (), kwargs)
    assert_not_fully_decomposed(program)


def test_whisper() -> None:
    config = transformers.WhisperConfig(
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=16,
        max_source_positions=20,
        max_target_positions=32,
        vocab_size=VOCAB,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config).eval()
    features = torch.randn(1, 16, 40, generator=torch.Generator().manual_seed(0))  # 2 x max_source_positions
    program = check(model, (), {"input_features": features, "decoder_input_ids": ids(1, 6), "use_cache": False})
    assert_not_fully_decomposed(program)


def test_t5() -> None:
    """T5's relative position buckets: aten::min.other, an in-place `+=` on a fresh tensor (made functional)."""
    config = transformers.T5Config(
        d_model=64,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        d_kv=16,
        vocab_size=VOCAB,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    program = check(model, (), {"input_ids": ids(2, 12), "decoder_input_ids": ids(2, 7), "use_cache": False})
    assert_not_fully_decomposed(program)
    functionalized = {target for _, target in program.report.decomposition.functionalized}
    assert "aten::add_.Tensor" in functionalized
