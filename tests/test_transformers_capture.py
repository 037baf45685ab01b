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
from fx2onnx.examples import transformers_inputs, transformers_model

from conftest import assert_exports_and_matches as check

transformers = pytest.importorskip("transformers")
warnings.filterwarnings("ignore", module="transformers")


def assert_not_fully_decomposed(program: fx2onnx.ONNXProgram) -> None:
    record = program.report.decomposition
    assert record.strategy in ("none", "local"), record.describe()
    assert not record.nodes, f"ops decomposed that a lowering should take: {record.describe()}"


def ids(family: str, batch: int, length: int) -> torch.Tensor:
    (input_ids,), _ = transformers_inputs(family, batch=batch, length=length, seed=batch * 100 + length)
    return input_ids


@pytest.mark.parametrize("use_cache", [False, True])
def test_gpt2(use_cache: bool) -> None:
    """Without a cache and a mask, the mask code looks for packed sequences (aten::diff); with one, the cache's
    empty tensors are detached in place (aten::detach_); both move position embeddings with .to(device)."""
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", min=2, max=64)
    program = check(
        transformers_model("gpt2"),
        (),
        {"input_ids": ids("gpt2", 2, 10), "use_cache": use_cache},
        dynamic_shapes={"input_ids": {0: batch, 1: length}, "use_cache": None},
        run_with=[((), {"input_ids": ids("gpt2", 3, 7), "use_cache": use_cache})],
    )
    assert_not_fully_decomposed(program)


def test_llama_8_layer_decoder() -> None:
    model = transformers_model("llama", num_hidden_layers=8, tie_word_embeddings=False)
    program = check(model, transformers_inputs("llama")[0], {"use_cache": False})
    assert_not_fully_decomposed(program)


def test_bert() -> None:
    model = transformers_model("bert")
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0  # right padding
    kwargs: dict[str, Any] = {
        "input_ids": ids("bert", 2, 9),
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(mask),
    }
    program = check(model, (), kwargs)
    assert_not_fully_decomposed(program)


def test_whisper() -> None:
    (features,), kwargs = transformers_inputs("whisper", batch=1, decoder_length=6)  # 2 x max_source_positions
    program = check(transformers_model("whisper"), (), {"input_features": features, **kwargs, "use_cache": False})
    assert_not_fully_decomposed(program)


def test_t5() -> None:
    """T5's relative position buckets: aten::min.other, an in-place `+=` on a fresh tensor (made functional)."""
    (input_ids,), kwargs = transformers_inputs("t5")
    program = check(transformers_model("t5"), (), {"input_ids": input_ids, **kwargs, "use_cache": False})
    assert_not_fully_decomposed(program)
    functionalized = {target for _, target in program.report.decomposition.functionalized}
    assert "aten::add_.Tensor" in functionalized


@pytest.mark.parametrize("overflowing_layer", [0, 1])
def test_bart_float16_clamps_where_an_encoder_layer_overflows(overflowing_layer: int) -> None:
    """BART's float16 encoder layer asks ``not torch.isfinite(hidden).all()`` once per layer: an If per layer around
    its clamp. Token 5 overflows one layer's output (its final LayerNorm scales the dim token 5 fills by 1e4), not
    the other's: eager clamps there only, and its outputs are finite; without the clamp they would not be. Where the
    first layer overflows, the second's attention takes 1e4-sized values (on both inputs: the calm one's too are
    scaled by 1e4): its scores must be computed in float32 as eager's CPU kernel does (float16 MatMuls in ONNX
    Runtime gave encoder_last_hidden_state max abs err 0.185 on the calm input, 0.578 on the spiked one)."""
    config = transformers.BartConfig(
        vocab_size=99,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=128,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.model.encoder.layers[overflowing_layer].final_layer_norm.weight[0] = 10000.0
        model.model.shared.weight[5, 0] = 60.0
    model = model.half()
    decoder_ids = torch.tensor([[2, 7, 8]])
    calm, spiked = torch.tensor([[7, 8, 9, 10, 11, 12]]), torch.tensor([[7, 5, 9, 10, 11, 12]])
    overflowed: list[bool] = []
    hooks = [
        layer.final_layer_norm.register_forward_hook(lambda m, i, o: overflowed.append(not torch.isfinite(o).all()))
        for layer in model.model.encoder.layers
    ]
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=spiked, decoder_input_ids=decoder_ids).logits).all()
    for hook in hooks:
        hook.remove()
    assert overflowed == [index == overflowing_layer for index in range(2)]
    program = check(
        model,
        (),
        {"input_ids": calm, "decoder_input_ids": decoder_ids},
        run_with=[((), {"input_ids": ids, "decoder_input_ids": decoder_ids}) for ids in (calm, spiked)],
    )
    assert sum(node.op_type == "If" for node in program.model.graph) == 2
