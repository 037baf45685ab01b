"""A sweep of model architectures users export: tiny random-weight transformers models built from configs, and
torchvision and timm models, each exported with fx2onnx the way a user calls torch.onnx.export, run in ONNX
Runtime (default session options) and compared with eager, output by output (dtype, shape, values), in float32,
bfloat16 and float16 (``model.to(dtype)``), plus one export with a dynamic batch (and sequence) per model from a
batch-2 example (``dynamic``) and one from a batch-1 example (``batch1``: the common call; run at batches 3, 1
and 2). The causal LMs are also exported as a decoding step (``cache``, ``cache_float16``): one new token after
a ``DynamicCache`` made by the model's own prefill (registered as a pytree as transformers' exporters register
it), dynamic batch and past length, run at (batch 2, past 5), (3, 9: beyond the sliding windows of 8) and (1, 1),
every output compared, the returned cache included. A sliding-window model (Mistral, Gemma 2/3, Starcoder2) is
fed the whole history, as transformers' exporter contract has it (the mask applies the window, the returned cache
grows by the new token): its logits are compared with eager's sliding-window step, its returned cache's last
positions with the window eager keeps. ``generate`` (``generate_float16``, ``generate_bfloat16``) runs them as users
do: exported once with dynamic batch, new-token count and past length (0 included), then greedy decoding of 24
tokens from a 7-token prompt (batch 2) in ONNX Runtime (the prompt after an empty cache, then each argmax token
with the returned cache) and in eager, each on its own tokens and cache: in float32 the tokens must be identical
and the logits close at every step; in float16/bfloat16 the first step where they diverge must be a near tie
(top-2 gap within the dtype's rounding noise, measured against the float32 model on the same history).

Whisper, T5 and BART also run generation as optimum exports them (``*_encdec``, the generate variants): the encoder
with each layer's cross-attention keys and values, and the decoder step over an EncoderDecoderCache exported once
(dynamic batch, new tokens and past, 0 included), greedy decoding of 16 tokens in ONNX Runtime against eager's own
loop. The ``multimodal`` group builds vision, detection and multimodal transformers from tiny configs (CLIP, OWL-ViT,
OWLv2, DETR, RT-DETR, YOLOS, SAM, LLaVA, PaliGemma, Qwen2-VL, Idefics3), their inputs made by hand.

Values at the edges users hit: ``masked_row`` and ``masked_row_float16`` export the token models from a batch of
3 whose attention mask pads row 0 on the left, row 1 on the right and row 2 entirely (a padded batch with an
empty row: every attention row of it fully masked, in float32 and float16); in ``float16_max``, a float16
model taking float inputs (pixels, audio) is fed them scaled to a largest magnitude of 60000, near float16's max,
or less (30000, 10000, 3000, 1000: the first at which eager's output is at most 1% inf or NaN; the scale is
recorded) where random weights make eager overflow everywhere (where eager is inf or NaN, the positions must agree).

Every (model, variant) ends in one class: ``ok``, ``eager`` (eager itself fails: nothing to compare),
``export`` (fx2onnx.export raised), ``load`` (ONNX Runtime refused the model), ``run`` (ONNX Runtime failed
running it) or ``mismatch`` (it ran and an output differs from eager: a silent wrong result).

    python benchmarks/zoo.py                    # everything, progress on stderr, one JSON line per result
    python benchmarks/zoo.py --only bart,vit    # models whose name contains one of these
    python benchmarks/zoo.py --variants float32,dynamic --out out/zoo.jsonl
    python benchmarks/zoo.py --only mamba --variants float16 --length 64   # longer examples (default 12 tokens)
    python benchmarks/zoo.py --table out/zoo.jsonl   # the model x variant table of a results file

timm is imported from FX2ONNX_TIMM_DIR (default: the venv's timm/ folder, which `make bench` fills).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import json
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fx2onnx

VARIANTS = (
    "float32",
    "bfloat16",
    "float16",
    "dynamic",
    "padded",
    "batch1",
    "cache",
    "cache_float16",
    "masked_row",
    "masked_row_float16",
    "float16_max",
    "timestep_float",
    "generate",
    "generate_float16",
    "generate_bfloat16",
)
VISION_VARIANTS = ("float32", "bfloat16", "float16", "dynamic", "batch1")
CACHE_VARIANTS = {"cache": torch.float32, "cache_float16": torch.float16}
# (batch, past) of the decoding steps run: the first is the export's example (within the sliding windows of 8),
# past 9 goes beyond them (a sliding-window model is then fed the whole history), past 1 is a cache of one token
CACHE_RUNS = ((2, 5), (3, 9), (1, 1))
REDUCED = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# values at the edges users hit: a padded batch with a row of padding only (every attention row of it fully
# masked), in float32 and float16; a float16 model fed float inputs (pixels, audio) scaled to near float16's max
EXTREMES = {"masked_row": torch.float32, "masked_row_float16": torch.float16, "float16_max": torch.float16}
MASKED_ROW_BATCH = 3
# the largest input magnitudes tried in float16_max, near float16's max first: a model whose eager output is then
# mostly inf or NaN (random weights amplifying pixels: eager overflows) is fed the next, until eager's nonfinite
# share is at most FLOAT16_MAX_NONFINITE; an ok where eager gives NaN everywhere would only say the NaNs agree
FLOAT16_MAX_SCALES = (60000.0, 30000.0, 10000.0, 3000.0, 1000.0)
FLOAT16_MAX_NONFINITE = 0.01

Inputs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclasses.dataclass
class Case:
    """One model: how to build it (float32, eval mode), its example inputs, the inputs of the same rank at other
    sizes for the dynamic export (None: no dynamic export), and which variants apply."""

    name: str
    group: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int, int], Inputs]  # (batch, length) -> (args, kwargs)
    dynamic_axes: dict[str, dict[int, str]] | None  # input name -> {axis: dim name}
    variants: tuple[str, ...] = VARIANTS
    decoder: bool = False  # a causal LM: also exported as a decoding step with a KV cache
    scalar_timestep: bool = False  # a diffusion UNet: `timestep_float` passes one 0-d timestep for the batch


# --- transformers ----------------------------------------------------------------------------------------------

VOCAB = 256
HIDDEN = 64
LAYERS = 2
TOKEN_AXES = {"input_ids": {0: "batch", 1: "sequence"}}
PIXEL_AXES = {"pixel_values": {0: "batch"}}


def _transformers() -> Any:
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def _seeded(factory: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        model = factory()
    return model.eval()


def _lm(model_class: str, config_class: str, **config: Any) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        t = _transformers()
        values = {"vocab_size": VOCAB, "use_cache": False, **config}
        made = getattr(t, config_class)(**values)
        made.use_cache = False
        return _seeded(lambda: getattr(t, model_class)(made))

    return build


def _token_inputs(batch: int, length: int) -> Inputs:
    generator = torch.Generator().manual_seed(1)
    return (), {"input_ids": torch.randint(3, VOCAB, (batch, length), generator=generator)}


def _seq2seq_inputs(batch: int, length: int) -> Inputs:
    generator = torch.Generator().manual_seed(1)
    return (), {
        "input_ids": torch.randint(3, VOCAB, (batch, length), generator=generator),
        "decoder_input_ids": torch.randint(3, VOCAB, (batch, max(length // 2, 1)), generator=generator),
    }


def _pixel_inputs(size: int, channels: int = 3) -> Callable[[int, int], Inputs]:
    def inputs(batch: int, length: int) -> Inputs:
        generator = torch.Generator().manual_seed(1)
        return (), {"pixel_values": torch.randn(batch, channels, size, size, generator=generator)}

    return inputs


def _audio_inputs(batch: int, length: int) -> Inputs:
    generator = torch.Generator().manual_seed(1)
    return (), {"input_values": torch.randn(batch, 400 + 40 * length, generator=generator)}


WHISPER_MELS = 16
WHISPER_FRAMES = 32  # 2 x max_source_positions: Whisper's encoder takes exactly this many frames


def _whisper_inputs(batch: int, length: int) -> Inputs:
    generator = torch.Generator().manual_seed(1)
    return (), {
        "input_features": torch.randn(batch, WHISPER_MELS, WHISPER_FRAMES, generator=generator),
        "decoder_input_ids": torch.randint(3, VOCAB, (batch, max(length // 2, 1)), generator=generator),
    }


LLAMA_LIKE = {
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
BERT_LIKE = {
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
}
BART_LIKE = {
    "d_model": HIDDEN,
    "encoder_layers": LAYERS,
    "decoder_layers": LAYERS,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_position_embeddings": 128,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
}
WAV2VEC2_LIKE = {  # wav2vec2's and HuBERT's sizes: a small conv feature extractor, then the encoder
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "conv_dim": (32, 32, 32),
    "conv_stride": (5, 4, 2),
    "conv_kernel": (10, 4, 2),
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
}
MOE = {"num_local_experts": 4, "num_experts_per_tok": 2}


def _decoder(name: str, model_class: str, config_class: str, **config: Any) -> Case:
    build = _lm(model_class, config_class, **config)
    return Case(name, "transformers", build, _token_inputs, TOKEN_AXES, decoder=True)


def _encoder(name: str, model_class: str, config_class: str, **config: Any) -> Case:
    return Case(name, "transformers", _lm(model_class, config_class, **config), _token_inputs, TOKEN_AXES)


def _seq2seq(name: str, model_class: str, config_class: str, **config: Any) -> Case:
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "decoder_input_ids": {0: "batch", 1: "decoder_sequence"}}
    return Case(name, "transformers", _lm(model_class, config_class, **config), _seq2seq_inputs, axes)


def _vision(name: str, model_class: str, config_class: str, size: int, **config: Any) -> Case:
    def build() -> torch.nn.Module:
        t = _transformers()
        made = getattr(t, config_class)(**config)
        return _seeded(lambda: getattr(t, model_class)(made))

    return Case(name, "transformers", build, _pixel_inputs(size), PIXEL_AXES)


def transformers_cases() -> list[Case]:
    small_vit = {**BERT_LIKE, "image_size": 32, "patch_size": 8}
    small_vit.pop("max_position_embeddings")
    audio_axes = {"input_values": {0: "batch", 1: "samples"}}
    return [
        _decoder("gpt2", "GPT2LMHeadModel", "GPT2Config", n_embd=HIDDEN, n_layer=LAYERS, n_head=4, n_positions=128),
        _decoder("llama", "LlamaForCausalLM", "LlamaConfig", **LLAMA_LIKE),
        _decoder("mistral", "MistralForCausalLM", "MistralConfig", **LLAMA_LIKE, sliding_window=8),
        _decoder("qwen2", "Qwen2ForCausalLM", "Qwen2Config", **LLAMA_LIKE),
        _decoder("qwen3", "Qwen3ForCausalLM", "Qwen3Config", **LLAMA_LIKE, head_dim=16),
        _decoder("phi3", "Phi3ForCausalLM", "Phi3Config", **LLAMA_LIKE, pad_token_id=0),
        _decoder("phi", "PhiForCausalLM", "PhiConfig", **LLAMA_LIKE),
        _decoder("gemma", "GemmaForCausalLM", "GemmaConfig", **LLAMA_LIKE, head_dim=16),
        _decoder("gemma2", "Gemma2ForCausalLM", "Gemma2Config", **LLAMA_LIKE, head_dim=16, sliding_window=8),
        _decoder("gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig", **LLAMA_LIKE, head_dim=16, sliding_window=8),
        _decoder(
            "falcon",
            "FalconForCausalLM",
            "FalconConfig",
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
        ),
        _decoder(
            "gpt_neox",
            "GPTNeoXForCausalLM",
            "GPTNeoXConfig",
            hidden_size=HIDDEN,
            intermediate_size=128,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
        ),
        _decoder(
            "opt",
            "OPTForCausalLM",
            "OPTConfig",
            hidden_size=HIDDEN,
            ffn_dim=128,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            word_embed_proj_dim=HIDDEN,
            max_position_embeddings=128,
        ),
        _decoder("bloom", "BloomForCausalLM", "BloomConfig", hidden_size=HIDDEN, n_layer=LAYERS, n_head=4),
        _decoder("mpt", "MptForCausalLM", "MptConfig", d_model=HIDDEN, n_layers=LAYERS, n_heads=4, max_seq_len=128),
        _decoder(
            "gptj",
            "GPTJForCausalLM",
            "GPTJConfig",
            n_embd=HIDDEN,
            n_layer=LAYERS,
            n_head=4,
            rotary_dim=8,
            n_positions=128,
        ),
        _decoder(
            "gpt_neo",
            "GPTNeoForCausalLM",
            "GPTNeoConfig",
            hidden_size=HIDDEN,
            num_layers=LAYERS,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=8,
            max_position_embeddings=128,
        ),
        _decoder("starcoder2", "Starcoder2ForCausalLM", "Starcoder2Config", **LLAMA_LIKE, sliding_window=8),
        _decoder("mixtral", "MixtralForCausalLM", "MixtralConfig", **LLAMA_LIKE, **MOE),
        _decoder(
            "qwen2_moe",
            "Qwen2MoeForCausalLM",
            "Qwen2MoeConfig",
            **LLAMA_LIKE,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=64,
        ),
        _decoder(
            "qwen3_moe",
            "Qwen3MoeForCausalLM",
            "Qwen3MoeConfig",
            **LLAMA_LIKE,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
        ),
        _seq2seq("bart", "BartForConditionalGeneration", "BartConfig", **BART_LIKE),
        _seq2seq("mbart", "MBartForConditionalGeneration", "MBartConfig", **BART_LIKE),
        _seq2seq("pegasus", "PegasusForConditionalGeneration", "PegasusConfig", **BART_LIKE),
        _seq2seq("marian", "MarianMTModel", "MarianConfig", **BART_LIKE),
        _encoder("roberta", "RobertaForMaskedLM", "RobertaConfig", **BERT_LIKE, pad_token_id=1),
        _encoder(
            "distilbert",
            "DistilBertForMaskedLM",
            "DistilBertConfig",
            dim=HIDDEN,
            hidden_dim=128,
            n_layers=LAYERS,
            n_heads=4,
            max_position_embeddings=128,
        ),
        _encoder("albert", "AlbertForMaskedLM", "AlbertConfig", **BERT_LIKE, embedding_size=32),
        _encoder("electra", "ElectraForMaskedLM", "ElectraConfig", **BERT_LIKE, embedding_size=32),
        _encoder("deberta_v2", "DebertaV2ForMaskedLM", "DebertaV2Config", **BERT_LIKE),
        _encoder("xlm_roberta", "XLMRobertaForMaskedLM", "XLMRobertaConfig", **BERT_LIKE, pad_token_id=1),
        _vision("vit", "ViTForImageClassification", "ViTConfig", 32, **small_vit),
        _encoder(
            "clip_text",
            "CLIPTextModel",
            "CLIPTextConfig",
            hidden_size=HIDDEN,
            intermediate_size=128,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            max_position_embeddings=128,
        ),
        _vision(
            "clip_vision",
            "CLIPVisionModel",
            "CLIPVisionConfig",
            32,
            hidden_size=HIDDEN,
            intermediate_size=128,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
        ),
        _vision(
            "swin",
            "SwinForImageClassification",
            "SwinConfig",
            32,
            image_size=32,
            patch_size=2,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 2],
            window_size=4,
        ),
        _vision(
            "convnext",
            "ConvNextForImageClassification",
            "ConvNextConfig",
            32,
            hidden_sizes=[16, 32],
            depths=[1, 1],
            num_stages=2,
            image_size=32,
        ),
        _vision("dinov2", "Dinov2Model", "Dinov2Config", 32, **{**small_vit, "image_size": 32, "patch_size": 8}),
        Case(
            "wav2vec2",
            "transformers",
            _lm(
                "Wav2Vec2ForCTC",
                "Wav2Vec2Config",
                **WAV2VEC2_LIKE,
            ),
            _audio_inputs,
            audio_axes,
        ),
        *newer_transformers_cases(),
    ]


def newer_transformers_cases() -> list[Case]:
    """Architectures bringing ops or patterns the cases above lack: QK-norm (OLMo 2), LayerNorm without bias and
    interleaved rotary (Cohere), partial rotary (StableLM), scaling multipliers (Granite), multi-head latent
    attention with grouped top-k routing (DeepSeek-V3), attention sinks with clamped SwiGLU experts (gpt-oss),
    layers without rotary (SmolLM3), the selective scan (Mamba), unpadded local/global attention (ModernBERT),
    relative position buckets (T5, BEiT), audio with log-mel features (Whisper), SigLIP, SegFormer, HuBERT."""
    audio_axes = {"input_values": {0: "batch", 1: "samples"}}
    whisper_axes = {"input_features": {0: "batch"}, "decoder_input_ids": {0: "batch", 1: "decoder_sequence"}}
    whisper = _lm(
        "WhisperForConditionalGeneration",
        "WhisperConfig",
        d_model=HIDDEN,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        num_mel_bins=WHISPER_MELS,
        max_source_positions=WHISPER_FRAMES // 2,
        max_target_positions=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    return [
        _decoder("olmo2", "Olmo2ForCausalLM", "Olmo2Config", **LLAMA_LIKE),
        _decoder("cohere", "CohereForCausalLM", "CohereConfig", **LLAMA_LIKE),
        _decoder("stablelm", "StableLmForCausalLM", "StableLmConfig", **LLAMA_LIKE, partial_rotary_factor=0.25),
        _decoder(
            "granite",
            "GraniteForCausalLM",
            "GraniteConfig",
            **LLAMA_LIKE,
            embedding_multiplier=12.0,
            logits_scaling=8.0,
            residual_multiplier=0.22,
            attention_multiplier=0.0078125,
        ),
        _decoder(
            "deepseek_v3",
            "DeepseekV3ForCausalLM",
            "DeepseekV3Config",
            **{**LLAMA_LIKE, "num_key_value_heads": 4},  # multi-head latent attention has no grouped keys
            moe_intermediate_size=32,
            n_shared_experts=1,
            n_routed_experts=8,
            n_group=4,
            topk_group=2,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
        ),
        _decoder(
            "gpt_oss",
            "GptOssForCausalLM",
            "GptOssConfig",
            **LLAMA_LIKE,
            head_dim=16,
            sliding_window=8,
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        _decoder(
            "smollm3", "SmolLM3ForCausalLM", "SmolLM3Config", **LLAMA_LIKE, no_rope_layer_interval=2, pad_token_id=0
        ),
        # no cache variants: its cache holds convolution and SSM states, not the keys and values a decoding step takes
        _encoder(
            "mamba",
            "MambaForCausalLM",
            "MambaConfig",
            hidden_size=HIDDEN,
            num_hidden_layers=LAYERS,
            state_size=8,
            expand=2,
            conv_kernel=4,
        ),
        _encoder(
            "modernbert",
            "ModernBertForMaskedLM",
            "ModernBertConfig",
            **BERT_LIKE,
            local_attention=8,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
        ),
        _seq2seq(
            "t5",
            "T5ForConditionalGeneration",
            "T5Config",
            d_model=HIDDEN,
            d_kv=16,
            d_ff=128,
            num_layers=LAYERS,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            feed_forward_proj="gated-gelu",
            decoder_start_token_id=0,
        ),
        Case("whisper", "transformers", whisper, _whisper_inputs, whisper_axes),
        _vision(
            "siglip_vision",
            "SiglipVisionModel",
            "SiglipVisionConfig",
            32,
            hidden_size=HIDDEN,
            intermediate_size=128,
            num_hidden_layers=LAYERS,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
        ),
        _vision(
            "beit",
            "BeitForImageClassification",
            "BeitConfig",
            32,
            **BERT_LIKE,
            image_size=32,
            patch_size=8,
            use_relative_position_bias=True,
            use_mean_pooling=True,
        ),
        _vision(
            "segformer",
            "SegformerForSemanticSegmentation",
            "SegformerConfig",
            32,
            num_encoder_blocks=2,
            depths=[1, 1],
            sr_ratios=[2, 1],
            hidden_sizes=[16, 32],
            num_attention_heads=[1, 2],
            decoder_hidden_size=32,
            num_labels=3,
        ),
        Case(
            "hubert",
            "transformers",
            _lm(
                "HubertForCTC",
                "HubertConfig",
                **WAV2VEC2_LIKE,
                feat_extract_norm="layer",
                do_stable_layer_norm=True,
            ),
            _audio_inputs,
            audio_axes,
        ),
    ]


# --- torchvision and timm --------------------------------------------------------------------------------------


def _torchvision_case(name: str, size: int, video: bool = False, **options: Any) -> Case:
    def build() -> torch.nn.Module:
        from models import _without_zero_weights, import_torchvision

        torchvision = import_torchvision()
        namespace = torchvision.models
        for part in name.split(".")[:-1]:
            namespace = getattr(namespace, part)
        torch.manual_seed(0)
        return _without_zero_weights(getattr(namespace, name.split(".")[-1])(weights=None, **options)).eval()

    def inputs(batch: int, length: int) -> Inputs:
        generator = torch.Generator().manual_seed(1)
        shape = (batch, 3, 4, size, size) if video else (batch, 3, size, size)
        return (torch.randn(*shape, generator=generator),), {}

    return Case(f"tv_{name.split('.')[-1]}", "torchvision", build, inputs, {"x": {0: "batch"}}, VISION_VARIANTS)


def torchvision_cases() -> list[Case]:
    return [
        _torchvision_case("segmentation.deeplabv3_mobilenet_v3_large", 64, weights_backbone=None, num_classes=5),
        _torchvision_case("segmentation.fcn_resnet50", 64, weights_backbone=None, num_classes=5),
        _torchvision_case("segmentation.lraspp_mobilenet_v3_large", 64, weights_backbone=None, num_classes=5),
        _torchvision_case("video.r3d_18", 32, video=True),
        _torchvision_case("regnet_y_400mf", 64),
        _torchvision_case("shufflenet_v2_x0_5", 64),
        _torchvision_case("squeezenet1_1", 64),
        _torchvision_case("densenet121", 64),
        _torchvision_case("inception_v3", 96, aux_logits=False, init_weights=True),
        _torchvision_case("googlenet", 64, aux_logits=False, init_weights=True),
        _torchvision_case("mnasnet0_5", 64),
        _torchvision_case("maxvit_t", 224),
        _torchvision_case("efficientnet_v2_s", 64),
    ]


TIMM_MODELS = {
    "resnet18": 64,
    "efficientnet_b0": 64,
    "mobilenetv3_small_100": 64,
    "convnextv2_atto": 64,
    "vit_tiny_patch16_224": 224,
    "deit_tiny_patch16_224": 224,
    "swin_tiny_patch4_window7_224": 224,
    "levit_128s": 224,
    "regnetx_002": 64,
    "mixer_s16_224": 224,
    "poolformer_s12": 64,
    "rexnet_100": 64,
    "ghostnet_100": 64,
    "cspdarknet53": 64,
    "mobilevit_xxs": 256,
    "efficientformer_l1": 224,
    "coatnet_nano_rw_224": 224,
    "edgenext_xx_small": 64,
}


def _timm_case(name: str, size: int) -> Case:
    def build() -> torch.nn.Module:
        from models import _without_zero_weights, import_timm

        timm = import_timm()
        torch.manual_seed(0)
        return _without_zero_weights(timm.create_model(name, pretrained=False, num_classes=10)).eval()

    def inputs(batch: int, length: int) -> Inputs:
        generator = torch.Generator().manual_seed(1)
        return (torch.randn(batch, 3, size, size, generator=generator),), {}

    return Case(f"timm_{name}", "timm", build, inputs, {"x": {0: "batch"}}, VISION_VARIANTS)


def timm_cases() -> list[Case]:
    return [_timm_case(name, size) for name, size in TIMM_MODELS.items()]


# --- diffusers -------------------------------------------------------------------------------------------------
# Tiny random-weight diffusion models built from configs, fed as a pipeline feeds them: latents, a timestep (int64,
# one per row as ONNX Runtime pipelines pass it; `timestep_float`: a fractional float32 one, as Euler and flow-matching
# schedulers give it, 0-d for a UNet as Stable Diffusion's pipelines call it, one per row for the transformers)
# and text states; dynamic batch and latent height/width. diffusers comes from FX2ONNX_DIFFUSERS_DIR (default: the
# venv's diffusers/ folder, which `make test` fills).
LATENT_CHANNELS = 4
TEXT_DIM = 32
TEXT_TOKENS = 7
POOLED_DIM = 16
DIFFUSION_VARIANTS = (*VISION_VARIANTS, "timestep_float")
# a latent side of 2 * side: the models below halve it once (a down block, a patch of 2) and concatenate it again
LATENT_AXES = {0: "batch", 2: "2*latent_height", 3: "2*latent_width"}
TINY_UNET = {
    "sample_size": 16,
    "in_channels": LATENT_CHANNELS,
    "out_channels": LATENT_CHANNELS,
    "block_out_channels": (32, 64),
    "layers_per_block": 1,
    "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"),
    "cross_attention_dim": TEXT_DIM,
    "attention_head_dim": 8,
    "norm_num_groups": 8,
}
TINY_VAE = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": LATENT_CHANNELS,
    "block_out_channels": (16, 32),
    "down_block_types": ("DownEncoderBlock2D", "DownEncoderBlock2D"),
    "up_block_types": ("UpDecoderBlock2D", "UpDecoderBlock2D"),
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "sample_size": 32,
}


def _diffusers() -> Any:
    from models import import_diffusers

    return import_diffusers()


def _latent_side(length: int) -> int:
    return 16 if length >= 12 else 8


def _diffusion_inputs(*extra: str, latent: str = "sample", square: bool = False) -> Callable[[int, int], Inputs]:
    """Latents, an int64 timestep per row and the conditions `extra` names, as a pipeline step feeds them (`square`:
    at one latent side only)."""

    def inputs(batch: int, length: int) -> Inputs:
        generator = torch.Generator().manual_seed(1)
        side = _latent_side(12 if square else length)
        kwargs: dict[str, Any] = {
            latent: torch.randn(batch, LATENT_CHANNELS, side, side, generator=generator),
            "timestep": torch.randint(0, 1000, (batch,), generator=generator),
        }
        if "text" in extra:
            kwargs["encoder_hidden_states"] = torch.randn(batch, TEXT_TOKENS, TEXT_DIM, generator=generator)
        if "pooled" in extra:
            kwargs["pooled_projections"] = torch.randn(batch, POOLED_DIM, generator=generator)
        if "class" in extra:
            kwargs["class_labels"] = torch.randint(0, 10, (batch,), generator=generator)
        if "sdxl" in extra:  # SDXL's added conditions: pooled text and the six size/crop numbers
            kwargs["added_cond_kwargs"] = {
                "text_embeds": torch.randn(batch, TEXT_DIM, generator=generator),
                "time_ids": torch.tensor([[side * 8.0, side * 8.0, 0.0, 0.0, side * 8.0, side * 8.0]] * batch),
            }
        if "control" in extra:  # the control image at twice the latent side (one stride-2 conditioning block)
            kwargs["controlnet_cond"] = torch.randn(batch, 3, 2 * side, 2 * side, generator=generator)
        return (), kwargs

    return inputs


def _diffusion_axes(*extra: str, latent: str = "sample") -> dict[str, dict[int, str]]:
    axes = {latent: LATENT_AXES, "timestep": {0: "batch"}}
    if "text" in extra:
        axes["encoder_hidden_states"] = {0: "batch"}
    if "pooled" in extra:
        axes["pooled_projections"] = {0: "batch"}
    if "class" in extra:
        axes["class_labels"] = {0: "batch"}
    if "sdxl" in extra:
        axes["added_cond_kwargs.text_embeds"] = axes["added_cond_kwargs.time_ids"] = {0: "batch"}
    if "control" in extra:
        axes["controlnet_cond"] = {0: "batch", 2: "4*latent_height", 3: "4*latent_width"}
    return axes


def _diffusion_model(class_name: str, **config: Any) -> Callable[[], torch.nn.Module]:
    return lambda: _seeded(lambda: getattr(_diffusers(), class_name)(**config))


class VaeDecoder(torch.nn.Module):
    """AutoencoderKL's decoder as exporters take it (optimum's vae_decoder): latents to an image."""

    def __init__(self, vae: torch.nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, latent_sample: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latent_sample).sample


class VaeEncoder(torch.nn.Module):
    """AutoencoderKL's encoder as exporters take it: an image to its latent distribution's mean and log-variance
    (sampling from it is the pipeline's, with its own generator)."""

    def __init__(self, vae: torch.nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, sample: torch.Tensor) -> torch.Tensor:
        return self.vae.encode(sample).latent_dist.parameters


def _vae(part: type[torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    return lambda: _seeded(lambda: part(_diffusers().AutoencoderKL(**TINY_VAE)))


def _image_inputs(batch: int, length: int) -> Inputs:
    generator = torch.Generator().manual_seed(1)
    side = 2 * _latent_side(length)
    return (), {"sample": torch.randn(batch, 3, side, side, generator=generator)}


def _latent_only_inputs(batch: int, length: int) -> Inputs:
    generator = torch.Generator().manual_seed(1)
    side = _latent_side(length)
    return (), {"latent_sample": torch.randn(batch, LATENT_CHANNELS, side, side, generator=generator)}


def _flux_inputs(batch: int, length: int) -> Inputs:
    """Flux's packed latents (one token per latent pixel at patch size 1), their and the text's position ids, and
    a float timestep in [0, 1] as its pipeline passes it."""
    generator = torch.Generator().manual_seed(1)
    side = _latent_side(length) // 2
    rows, columns = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    image_ids = torch.stack([torch.zeros_like(rows), rows, columns], dim=-1).reshape(-1, 3).float()
    return (), {
        "hidden_states": torch.randn(batch, side * side, LATENT_CHANNELS, generator=generator),
        "encoder_hidden_states": torch.randn(batch, TEXT_TOKENS, TEXT_DIM, generator=generator),
        "pooled_projections": torch.randn(batch, POOLED_DIM, generator=generator),
        "timestep": torch.rand(batch, generator=generator),
        "img_ids": image_ids,
        "txt_ids": torch.zeros(TEXT_TOKENS, 3),
    }


def float_timestep(case: Case, timestep: torch.Tensor) -> torch.Tensor:
    """The `timestep_float` variant's timestep for the int64 one of a case's inputs."""
    fractional = timestep.float() + 0.25
    return fractional[0] if case.scalar_timestep else fractional


def _diffusion_case(
    name: str, build: Callable[[], torch.nn.Module], *extra: str, latent: str = "sample", square: bool = False
) -> Case:
    """`square`: a model that takes the side of its token grid as ``int(tokens ** 0.5)`` (DiT's unpatchify):
    torch.export specializes that to the example's, so that only the batch is dynamic."""
    inputs, axes = _diffusion_inputs(*extra, latent=latent, square=square), _diffusion_axes(*extra, latent=latent)
    if square:
        axes[latent] = {0: "batch"}
    scalar = latent == "sample"  # the UNets and ControlNet: Stable Diffusion's pipelines pass a 0-d timestep
    return Case(name, "diffusers", build, inputs, axes, DIFFUSION_VARIANTS, scalar_timestep=scalar)


def diffusers_cases() -> list[Case]:
    sdxl_unet = {
        **TINY_UNET,
        "use_linear_projection": True,
        "addition_embed_type": "text_time",
        "addition_time_embed_dim": 8,
        "projection_class_embeddings_input_dim": 6 * 8 + TEXT_DIM,
        "transformer_layers_per_block": (1, 2),
    }
    controlnet = {key: value for key, value in TINY_UNET.items() if key not in ("sample_size", "up_block_types")}
    controlnet.pop("out_channels")
    # SD 2.x / SD-turbo: linear projections, attention computed in float32 (upcast_attention), heads per block
    sd2_unet = {**TINY_UNET, "use_linear_projection": True, "upcast_attention": True, "attention_head_dim": (4, 8)}
    flux_axes = {
        "hidden_states": {0: "batch", 1: "image_tokens"},
        "encoder_hidden_states": {0: "batch"},
        "pooled_projections": {0: "batch"},
        "timestep": {0: "batch"},
        "img_ids": {0: "image_tokens"},
    }
    flux = _diffusion_model(
        "FluxTransformer2DModel",
        patch_size=1,
        in_channels=LATENT_CHANNELS,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT_DIM,
        pooled_projection_dim=POOLED_DIM,
        axes_dims_rope=(4, 4, 8),
    )
    return [
        _diffusion_case("sd_unet", _diffusion_model("UNet2DConditionModel", **TINY_UNET), "text"),
        _diffusion_case("sd2_unet", _diffusion_model("UNet2DConditionModel", **sd2_unet), "text"),
        _diffusion_case(
            "ddpm_unet",
            _diffusion_model(
                "UNet2DModel",
                sample_size=16,
                in_channels=LATENT_CHANNELS,
                out_channels=LATENT_CHANNELS,
                block_out_channels=(32, 64),
                layers_per_block=1,
                down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                up_block_types=("AttnUpBlock2D", "UpBlock2D"),
                attention_head_dim=8,
                norm_num_groups=8,
            ),
        ),
        Case("flux_transformer", "diffusers", flux, _flux_inputs, flux_axes, VISION_VARIANTS),
        _diffusion_case(
            "pixart_transformer",
            _diffusion_model(
                "PixArtTransformer2DModel",
                sample_size=8,
                num_layers=1,
                patch_size=2,
                attention_head_dim=8,
                num_attention_heads=2,
                in_channels=LATENT_CHANNELS,
                cross_attention_dim=16,
                out_channels=2 * LATENT_CHANNELS,
                caption_channels=TEXT_DIM,
                use_additional_conditions=False,
            ),
            "text",
            latent="hidden_states",
        ),
        _diffusion_case(
            "sana_transformer",
            _diffusion_model(
                "SanaTransformer2DModel",
                patch_size=1,
                in_channels=LATENT_CHANNELS,
                out_channels=LATENT_CHANNELS,
                num_layers=1,
                attention_head_dim=4,
                num_attention_heads=2,
                num_cross_attention_heads=2,
                cross_attention_head_dim=4,
                cross_attention_dim=8,
                caption_channels=TEXT_DIM,
                sample_size=16,
            ),
            "text",
            latent="hidden_states",
        ),
        Case(
            "vq_model",
            "diffusers",
            _diffusion_model(
                "VQModel",
                block_out_channels=(16, 32),
                down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
                up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
                latent_channels=3,
                num_vq_embeddings=32,
                vq_embed_dim=3,
                norm_num_groups=8,
                layers_per_block=1,
            ),
            _image_inputs,
            {"sample": {0: "batch", 2: "4*latent_height", 3: "4*latent_width"}},
            VISION_VARIANTS,
        ),
        # float32 only: its forward quantizes the latents to bytes and divides them by 255.0, a float32 tensor that
        # a float16 decoder refuses in eager
        Case(
            "taesd",
            "diffusers",
            _diffusion_model(
                "AutoencoderTiny",
                encoder_block_out_channels=(16, 16),
                decoder_block_out_channels=(16, 16),
                num_encoder_blocks=(1, 1),
                num_decoder_blocks=(1, 1),
                latent_channels=LATENT_CHANNELS,
            ),
            _image_inputs,
            {"sample": {0: "batch", 2: "4*latent_height", 3: "4*latent_width"}},
            ("float32", "dynamic", "batch1"),
        ),
        _diffusion_case("sdxl_unet", _diffusion_model("UNet2DConditionModel", **sdxl_unet), "text", "sdxl"),
        Case(
            "vae_decoder",
            "diffusers",
            _vae(VaeDecoder),
            _latent_only_inputs,
            {"latent_sample": LATENT_AXES},
            VISION_VARIANTS,
        ),
        Case(
            "vae_encoder",
            "diffusers",
            _vae(VaeEncoder),
            _image_inputs,
            {"sample": {0: "batch", 2: "4*latent_height", 3: "4*latent_width"}},
            VISION_VARIANTS,
        ),
        _diffusion_case(
            "dit",
            _diffusion_model(
                "DiTTransformer2DModel",
                num_attention_heads=2,
                attention_head_dim=16,
                in_channels=LATENT_CHANNELS,
                out_channels=2 * LATENT_CHANNELS,
                num_layers=2,
                sample_size=8,
                patch_size=2,
                num_embeds_ada_norm=1000,
            ),
            "class",
            latent="hidden_states",
            square=True,
        ),
        _diffusion_case(
            "sd3_transformer",
            _diffusion_model(
                "SD3Transformer2DModel",
                sample_size=8,
                patch_size=2,
                in_channels=LATENT_CHANNELS,
                num_layers=2,
                attention_head_dim=8,
                num_attention_heads=4,
                joint_attention_dim=TEXT_DIM,
                caption_projection_dim=32,
                pooled_projection_dim=POOLED_DIM,
                out_channels=LATENT_CHANNELS,
                pos_embed_max_size=32,
            ),
            "text",
            "pooled",
            latent="hidden_states",
        ),
        _diffusion_case(
            "controlnet",
            _diffusion_model("ControlNetModel", **controlnet, conditioning_embedding_out_channels=(16, 32)),
            "text",
            "control",
        ),
    ]


# --- encoder-decoder generation and multimodal models ----------------------------------------------------------
# Encoder-decoder models (Whisper, T5, BART) run as users export them for generation, optimum's layout: the encoder
# exported with what the first decoder step computes from its states (each layer's cross-attention keys and values),
# and the decoder step exported once taking an EncoderDecoderCache (registered as a pytree, as transformers'
# exporters register it) whose cross-attention half is filled, with dynamic batch, new-token count and self-attention
# past length (0 included: the first step after an empty one). Greedy decoding in ONNX Runtime against eager's own
# loop (its first step computes the cross-attention keys itself).
ENCDEC_GENERATE_GROUP = "encoder_decoder"
ENCDEC_NEW = 16


class EncoderWithCrossCache(torch.nn.Module):
    """The encoder and the cross-attention keys and values of every decoder layer, as the first decoder step makes
    them (the step run on the start token with an empty EncoderDecoderCache): what the decoder step graph takes."""

    def __init__(self, model: torch.nn.Module, feature: str) -> None:
        super().__init__()
        self.model = model
        self.feature = feature

    def forward(self, features: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any:
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        hidden = self.model.get_encoder()(**{self.feature: features}, attention_mask=attention_mask)[0]
        start = torch.full((features.shape[0], 1), self.model.config.decoder_start_token_id, dtype=torch.long)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        self.model(
            encoder_outputs=(hidden,),
            attention_mask=attention_mask,
            decoder_input_ids=start,
            use_cache=True,
            **{cache_argument(self.model): cache},
        )
        cross = [t for layer in cache.cross_attention_cache.layers for t in (layer.keys, layer.values)]
        return hidden, *cross


def _encdec_inputs(model: torch.nn.Module, feature: str, batch: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The encoder's input (log-mel features, or token ids with a padded row 1) and its attention mask."""
    generator = torch.Generator().manual_seed(11)
    if feature == "input_features":
        return torch.randn(batch, WHISPER_MELS, WHISPER_FRAMES, generator=generator), None
    ids = torch.randint(3, VOCAB, (batch, 10), generator=generator)
    mask = torch.ones(batch, 10, dtype=torch.long)
    mask[1 % batch, -3:] = 0
    return ids, mask


def _encdec_step_kwargs(model: torch.nn.Module, hidden: torch.Tensor, mask: Any, ids: torch.Tensor, cache: Any):
    kwargs = {"decoder_input_ids": ids, "encoder_outputs": (hidden,), cache_argument(model): cache, "use_cache": True}
    if mask is not None:
        kwargs["attention_mask"] = mask
    return kwargs


def encdec_export(model: torch.nn.Module, feature: str) -> Any:
    """The encoder (with cross-attention keys and values) and the decoder step, each exported once: dynamic batch;
    the step also dynamic in new tokens and past length (0 included), from (batch 2, 3 new tokens, past 5) with the
    cache eager's own steps made. Returns both programs and the step's example cache (its pytree layout)."""
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    register_cache_pytrees_for_model(model)
    features, mask = _encdec_inputs(model, feature, 2)
    features = _to_dtype(features, model.dtype)
    batch = torch.export.Dim("batch", min=1, max=64)
    encoder_shapes = {"features": {0: batch}, "attention_mask": None if mask is None else {0: batch}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder = fx2onnx.export(
            EncoderWithCrossCache(model, feature).eval(),
            (features,),
            kwargs={"attention_mask": mask},
            dynamic_shapes=encoder_shapes,
        )
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        hidden = model.get_encoder()(**{feature: features}, attention_mask=mask)[0]
        prefix = torch.randint(3, VOCAB, (2, 5), generator=generator)
        cache = getattr(model(**_encdec_step_kwargs(model, hidden, mask, prefix, None)), cache_argument(model))
    kwargs = _encdec_step_kwargs(model, hidden, mask, torch.randint(3, VOCAB, (2, 3), generator=generator), cache)
    sequence = torch.export.Dim("sequence", min=1, max=64)
    past = torch.export.Dim("past_sequence", min=0, max=64)
    self_leaves = len(torch.utils._pytree.tree_leaves(cache.self_attention_cache))
    cross_leaves = len(torch.utils._pytree.tree_leaves(cache.cross_attention_cache))
    shapes = {
        "decoder_input_ids": {0: batch, 1: sequence},
        "encoder_outputs": ({0: batch},),
        cache_argument(model): [{0: batch, 2: past}] * self_leaves + [{0: batch}] * cross_leaves,
        "use_cache": None,
    }
    if mask is not None:
        shapes["attention_mask"] = {0: batch}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decoder = fx2onnx.export(model, (), kwargs=copy.deepcopy(kwargs), dynamic_shapes=shapes)
    with torch.no_grad():
        _, out_spec = torch.utils._pytree.tree_flatten(model(**copy.deepcopy(kwargs)))
    return encoder, decoder, cache, out_spec


def encdec_greedy_eager(model: torch.nn.Module, feature: str, features: torch.Tensor, mask: Any, steps: int) -> Any:
    """Greedy decoding in eager from the start token: the encoder once, then each step with the cache the model
    returned (its first step computes the cross-attention keys and values itself)."""
    name = cache_argument(model)
    ids = torch.full((features.shape[0], 1), model.config.decoder_start_token_id, dtype=torch.long)
    cache, tokens, logits = None, [], []
    with torch.no_grad():
        hidden = model.get_encoder()(**{feature: features}, attention_mask=mask)[0]
        for _ in range(steps):
            out = model(**_encdec_step_kwargs(model, hidden, mask, ids, cache))
            cache = getattr(out, name)
            logits.append(out.logits[:, -1])
            ids = out.logits[:, -1].float().argmax(-1, keepdim=True)
            tokens.append(ids)
    return torch.cat(tokens, 1), logits


def encdec_greedy_onnx(model: torch.nn.Module, programs: Any, features: torch.Tensor, mask: Any, steps: int) -> Any:
    """The same loop in ONNX Runtime: the encoder graph gives the states and the cross-attention keys and values,
    the first step takes an empty self-attention cache (past length 0), every later one the cache the previous
    step returned, rebuilt as an EncoderDecoderCache from the graph's outputs."""
    encoder, decoder, example_cache, out_spec = programs
    name = cache_argument(model)
    hidden, *cross = encoder(features, attention_mask=mask)
    self_count = len(torch.utils._pytree.tree_leaves(example_cache.self_attention_cache))
    empty = [cross[0].new_zeros((*cross[0].shape[:2], 0, cross[0].shape[3]))] * self_count
    _, cache_spec = torch.utils._pytree.tree_flatten(example_cache)
    cache = torch.utils._pytree.tree_unflatten([*empty, *cross], cache_spec)
    ids = torch.full((features.shape[0], 1), model.config.decoder_start_token_id, dtype=torch.long)
    tokens, logits = [], []
    for _ in range(steps):
        flat = decoder(**_encdec_step_kwargs(model, hidden, mask, ids, cache))
        if len(flat) != out_spec.num_leaves:
            raise AssertionError(f"the step gives {len(flat)} outputs, eager {out_spec.num_leaves}")
        out = torch.utils._pytree.tree_unflatten(flat, out_spec)
        cache = getattr(out, name)
        logits.append(out.logits[:, -1])
        ids = out.logits[:, -1].float().argmax(-1, keepdim=True)
        tokens.append(ids)
    return torch.cat(tokens, 1), logits


def run_encdec_generate(case: Case, model32: torch.nn.Module, variant: str) -> dict[str, Any]:
    """Greedy decoding of ENCDEC_NEW tokens (batch 2) in ONNX Runtime and in eager, judged as `run_generate`
    judges a decoder-only model: float32, identical tokens and close logits at every step; float16/bfloat16,
    logits within the dtype's rounding noise (against the float32 model on the same history) until the first
    divergence, which must be a near tie."""
    from fx2onnx import _rounding_noise as rounding_noise
    from fx2onnx._verification import TOLERANCES, compare

    record: dict[str, Any] = {"model": case.name, "group": case.group, "variant": variant}
    dtype = GENERATE_VARIANTS[variant]
    feature = "input_features" if "whisper" in case.name else "input_ids"
    model = copy.deepcopy(model32).to(dtype)
    model.config.use_cache = True
    features, mask = _encdec_inputs(model, feature, 2)
    features = _to_dtype(features, dtype)
    try:
        eager_tokens, eager_logits = encdec_greedy_eager(model, feature, features, mask, ENCDEC_NEW)
    except Exception as error:
        record.update(outcome="eager", error=_short(error))
        return record
    start = time.perf_counter()
    try:
        programs = encdec_export(model, feature)
    except Exception as error:
        record.update(outcome="export", error=_short(error), trace=traceback.format_exc()[-3000:])
        return record
    record["export_seconds"] = round(time.perf_counter() - start, 2)
    try:
        programs[0].session(), programs[1].session()
    except Exception as error:
        record.update(outcome="load", error=_short(error))
        return record
    try:
        onnx_tokens, onnx_logits = encdec_greedy_onnx(model, programs, features, mask, ENCDEC_NEW)
    except Exception as error:
        record.update(outcome="run", error=_short(error), trace=traceback.format_exc()[-3000:])
        return record
    differing = (eager_tokens != onnx_tokens).any(0).nonzero()
    first = int(differing[0]) if len(differing) else None
    record["tokens_equal"] = first is None
    record["first_divergence"] = first
    lines = []

    def reference(step: int) -> torch.Tensor:  # the float32 model's last logits on eager's history before `step`
        start = torch.full_like(eager_tokens[:, :1], model.config.decoder_start_token_id)
        history = torch.cat([start, eager_tokens[:, :step]], 1)
        with torch.no_grad():
            return model32(**{feature: features.float()}, attention_mask=mask, decoder_input_ids=history).logits[:, -1]

    for step in range(ENCDEC_NEW if first is None else first + 1):
        result = compare(f"logits step {step}", eager_logits[step], onnx_logits[step])
        record["logits_max_abs"] = float(f"{max(record.get('logits_max_abs', 0.0), result.max_abs_error):.3g}")
        if result.passed:
            continue
        if dtype == torch.float32:
            lines.append(str(result))
            continue
        noise = rounding_noise.compare_to_reference(
            eager_logits[step], onnx_logits[step], reference(step), TOLERANCES[dtype][1]
        )
        if noise is None or not noise.within_noise:
            lines.append(f"{result}: {noise}")
    if first is not None:
        if dtype == torch.float32:
            lines.append(f"tokens differ from step {first}")
        else:
            row = int((eager_tokens[:, first] != onnx_tokens[:, first]).nonzero()[0])
            ref = reference(first)[row].double()
            eager, onnx = eager_logits[first][row].double(), onnx_logits[first][row].double()
            a, b = int(eager_tokens[row, first]), int(onnx_tokens[row, first])
            noise = float((eager - ref).abs().max())
            near = max(abs(float(eager[a] - eager[b])), abs(float(ref[a] - ref[b])), float((onnx - ref).abs().max()))
            record["divergence"] = {"step": first, "row": row, "tokens": [a, b], "eager_noise": round(noise, 5)}
            if near > 2 * noise:
                lines.append(f"tokens differ from step {first} without a near tie: {record['divergence']}")
    record["outcome"] = "mismatch" if lines else "ok"
    if lines:
        record["error"] = " || ".join(lines)[:1500]
    return record


def encoder_decoder_generate_cases() -> list[Case]:
    """Whisper, T5 and BART from the configs `transformers_cases` builds them with, for the generate variants."""
    wanted = {"bart", "t5", "whisper"}
    made = [case for case in transformers_cases() if case.name in wanted]
    return [
        dataclasses.replace(
            case, name=f"{case.name}_encdec", group=ENCDEC_GENERATE_GROUP, variants=tuple(GENERATE_VARIANTS)
        )
        for case in made
    ]


# Vision, detection and multimodal transformers: tiny towers (hidden 32-64, 1-2 layers, images of 32-64 pixels)
IMAGE_TOKEN = VOCAB - 1  # the image placeholder token of the multimodal LMs below
TOWER = {"hidden_size": HIDDEN, "intermediate_size": 128, "num_hidden_layers": LAYERS, "num_attention_heads": 4}
TEXT_TOWER = {**TOWER, "max_position_embeddings": 64, "vocab_size": VOCAB}
VISION_TOWER = {**TOWER, "image_size": 32, "patch_size": 8}  # 16 patches
IMAGE_TOKENS = 16
TEXT_IMAGE_AXES = {
    "input_ids": {0: "batch", 1: "sequence"},
    "attention_mask": {0: "batch", 1: "sequence"},
    "pixel_values": {0: "batch"},
}
OWL_QUERIES = 2  # text queries per image: OWL's input_ids hold them for every image, one after the other
OWL_AXES = {
    "input_ids": {0: "2*batch"},
    "attention_mask": {0: "2*batch"},
    "pixel_values": {0: "batch"},
}
SAM_AXES = {"pixel_values": {0: "batch"}, "input_points": {0: "batch"}}
QWEN2_VL_GRID = (1, 4, 4)  # one frame of 4 x 4 patches, merged 2 x 2 into 4 image tokens
QWEN2_VL_AXES = {
    "input_ids": {0: "batch", 1: "sequence"},
    "attention_mask": {0: "batch", 1: "sequence"},
    "mm_token_type_ids": {0: "batch", 1: "sequence"},
    "pixel_values": {0: "16*batch"},
    "image_grid_thw": {0: "batch"},
}
IDEFICS3_AXES = {
    "input_ids": {0: "batch", 1: "sequence"},
    "attention_mask": {0: "batch", 1: "sequence"},
    "pixel_values": {0: "batch"},
}


def _multimodal(
    name: str, model_class: str, config: Callable[[Any], Any], inputs: Callable[[int, int], Inputs], axes: Any
) -> Case:
    def build() -> torch.nn.Module:
        from models import _without_zero_weights

        t = _transformers()
        made = config(t)
        model = _without_zero_weights(_seeded(lambda: getattr(t, model_class)(made)))
        # transformers draws batch-norm scales from N(0, 0.02): each block then shrinks activations ~50x, RT-DETR's
        # encoder output reaches 1e-12 and every query ties in its top-k (whose order among ties is the kernel's)
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.affine:
                module.reset_parameters()
        return model

    return Case(name, "multimodal", build, inputs, axes, VISION_VARIANTS)


def _clip_config(t: Any) -> Any:
    return t.CLIPConfig(text_config=TEXT_TOWER, vision_config=VISION_TOWER, projection_dim=32)


def _owl_config(config_class: str) -> Callable[[Any], Any]:
    # projection_dim = hidden: the class head compares the image's tokens with the projected queries
    return lambda t: getattr(t, config_class)(
        text_config={**TEXT_TOWER, "max_position_embeddings": 16}, vision_config=VISION_TOWER, projection_dim=HIDDEN
    )


def _detr_config(t: Any) -> Any:
    backbone = t.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", out_features=["stage2"]
    )
    return t.DetrConfig(**_DETR_LIKE, use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False)


_DETR_LIKE = {
    "d_model": HIDDEN,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "num_queries": 10,
    "num_labels": 5,
}


def _rt_detr_config(t: Any) -> Any:
    backbone = t.RTDetrResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 64, 128],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    return t.RTDetrConfig(
        **_DETR_LIKE,
        backbone_config=backbone,
        use_pretrained_backbone=False,
        encoder_hidden_dim=HIDDEN,
        encoder_in_channels=[32, 64, 128],
        decoder_in_channels=[HIDDEN] * 3,
        anchor_image_size=None,  # anchors from the image's own size, not a fixed 640
    )


def _yolos_config(t: Any) -> Any:
    return t.YolosConfig(**TOWER, image_size=[32, 32], patch_size=8, num_detection_tokens=5, num_labels=5)


def _sam_config(t: Any) -> Any:
    return t.SamConfig(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 64,
            "patch_size": 8,
            "output_channels": 32,
            "window_size": 4,
            "global_attn_indexes": [0],
            "mlp_dim": 64,
            "num_pos_feats": 16,
        },
        prompt_encoder_config={"hidden_size": 32, "image_size": 64, "patch_size": 8, "mask_input_channels": 4},
        mask_decoder_config={
            "hidden_size": 32,
            "mlp_dim": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "iou_head_hidden_dim": 32,
        },
    )


def _llava_config(t: Any) -> Any:
    return t.LlavaConfig(
        text_config=t.LlamaConfig(**LLAMA_LIKE, vocab_size=VOCAB),
        vision_config=t.CLIPVisionConfig(**VISION_TOWER),
        image_token_index=IMAGE_TOKEN,
        vision_feature_layer=-1,
        image_seq_length=IMAGE_TOKENS,
    )


def _paligemma_config(t: Any) -> Any:
    return t.PaliGemmaConfig(
        text_config=t.GemmaConfig(**LLAMA_LIKE, head_dim=16, vocab_size=VOCAB),
        vision_config=t.SiglipVisionConfig(**VISION_TOWER, projection_dim=HIDDEN),
        image_token_index=IMAGE_TOKEN,
        projection_dim=HIDDEN,
        hidden_size=HIDDEN,
    )


def _qwen2_vl_config(t: Any) -> Any:
    text = {**LLAMA_LIKE, "vocab_size": VOCAB, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
    vision = {"depth": 1, "embed_dim": 32, "hidden_size": HIDDEN, "num_heads": 2, "patch_size": 4}
    return t.Qwen2VLConfig(
        text_config=text,
        vision_config={**vision, "spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=IMAGE_TOKEN,
        vision_start_token_id=IMAGE_TOKEN - 1,
        video_token_id=IMAGE_TOKEN - 2,
    )


def _idefics3_config(t: Any) -> Any:
    return t.Idefics3Config(
        text_config=t.LlamaConfig(**LLAMA_LIKE, vocab_size=VOCAB),
        vision_config={**TOWER, "num_hidden_layers": 1, "image_size": 32, "patch_size": 8},
        scale_factor=2,  # 16 patches shuffled into 4 image tokens
        image_token_id=IMAGE_TOKEN,
    )


def _text_tokens(batch: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Text tokens below the multimodal specials, and an attention mask with row 1's last two tokens padded."""
    ids = torch.randint(3, VOCAB - 3, (batch, length), generator=generator)
    mask = torch.ones(batch, length, dtype=torch.long)
    if batch > 1:
        mask[1, -2:] = 0
    return ids, mask


def _text_image_inputs(size: int) -> Callable[[int, int], Inputs]:
    def inputs(batch: int, length: int) -> Inputs:
        generator = torch.Generator().manual_seed(1)
        ids, mask = _text_tokens(batch, min(length, 16), generator)
        pixels = torch.randn(batch, 3, size, size, generator=generator)
        return (), {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}

    return inputs


def _image_token_inputs(offset: int) -> Callable[[int, int], Inputs]:
    """A multimodal LM's prompt: `length` text tokens with IMAGE_TOKENS placeholders from `offset` on."""

    def inputs(batch: int, length: int) -> Inputs:
        generator = torch.Generator().manual_seed(1)
        ids, mask = _text_tokens(batch, length + IMAGE_TOKENS, generator)
        ids[:, offset : offset + IMAGE_TOKENS] = IMAGE_TOKEN
        pixels = torch.randn(batch, 3, 32, 32, generator=generator)
        return (), {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}

    return inputs


def _owl_inputs(batch: int, length: int) -> Inputs:
    generator = torch.Generator().manual_seed(1)
    ids, mask = _text_tokens(OWL_QUERIES * batch, 7, generator)
    pixels = torch.randn(batch, 3, 32, 32, generator=generator)
    return (), {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}


def _sam_inputs(batch: int, length: int) -> Inputs:
    generator = torch.Generator().manual_seed(1)
    pixels = torch.randn(batch, 3, 64, 64, generator=generator)
    return (), {"pixel_values": pixels, "input_points": torch.rand(batch, 1, 1, 2, generator=generator) * 64}


def _qwen2_vl_inputs(batch: int, length: int) -> Inputs:
    """Qwen2-VL's processor output for one image per row: the vision start token, 4 image tokens, text; the image's
    16 patches flattened (channels x temporal 2 x 4 x 4 pixels each), its grid, and the tokens' modality types."""
    generator = torch.Generator().manual_seed(1)
    ids, mask = _text_tokens(batch, length, generator)
    ids[:, 2] = IMAGE_TOKEN - 1
    ids[:, 3:7] = IMAGE_TOKEN
    patches = QWEN2_VL_GRID[0] * QWEN2_VL_GRID[1] * QWEN2_VL_GRID[2]
    return (), {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": (ids == IMAGE_TOKEN).int(),
        "pixel_values": torch.randn(batch * patches, 3 * 2 * 4 * 4, generator=generator),
        "image_grid_thw": torch.tensor([QWEN2_VL_GRID] * batch),
    }


def _idefics3_inputs(batch: int, length: int) -> Inputs:
    generator = torch.Generator().manual_seed(1)
    ids, mask = _text_tokens(batch, length, generator)
    ids[:, 2:6] = IMAGE_TOKEN
    pixels = torch.randn(batch, 1, 3, 32, 32, generator=generator)
    return (), {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels}


def multimodal_cases() -> list[Case]:
    """Vision, detection and multimodal transformers from tiny configs (random weights, inputs built by hand as
    their processors would: image tokens in the text where the model splices image features in): CLIP with both
    towers and its logits, OWL-ViT and OWLv2 (text queries, two per image), DETR on a transformers ResNet backbone,
    RT-DETR, YOLOS, SAM (vision encoder, prompt encoder and mask decoder from one point), LLaVA, PaliGemma,
    Qwen2-VL (flattened patches with their grid, M-RoPE token types) and Idefics3."""
    return [
        _multimodal("clip", "CLIPModel", _clip_config, _text_image_inputs(32), TEXT_IMAGE_AXES),
        _multimodal("owlvit", "OwlViTForObjectDetection", _owl_config("OwlViTConfig"), _owl_inputs, OWL_AXES),
        _multimodal("owlv2", "Owlv2ForObjectDetection", _owl_config("Owlv2Config"), _owl_inputs, OWL_AXES),
        _multimodal("detr", "DetrForObjectDetection", _detr_config, _pixel_inputs(64), PIXEL_AXES),
        _multimodal("rt_detr", "RTDetrForObjectDetection", _rt_detr_config, _pixel_inputs(64), PIXEL_AXES),
        _multimodal("yolos", "YolosForObjectDetection", _yolos_config, _pixel_inputs(32), PIXEL_AXES),
        _multimodal("sam", "SamModel", _sam_config, _sam_inputs, SAM_AXES),
        _multimodal("llava", "LlavaForConditionalGeneration", _llava_config, _image_token_inputs(2), TEXT_IMAGE_AXES),
        _multimodal(
            "paligemma", "PaliGemmaForConditionalGeneration", _paligemma_config, _image_token_inputs(0), TEXT_IMAGE_AXES
        ),
        _multimodal("qwen2_vl", "Qwen2VLForConditionalGeneration", _qwen2_vl_config, _qwen2_vl_inputs, QWEN2_VL_AXES),
        _multimodal("idefics3", "Idefics3ForConditionalGeneration", _idefics3_config, _idefics3_inputs, IDEFICS3_AXES),
    ]


# --- running ---------------------------------------------------------------------------------------------------


def _to_dtype(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    return value


def _scaled_to(value: Any, scale: float) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return (value / value.abs().max() * scale).to(torch.float16)
    return value


def near_float16_max(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Every float input scaled so that its largest magnitude is the first of FLOAT16_MAX_SCALES at which the
    float16 `model`'s eager output is finite but for at most FLOAT16_MAX_NONFINITE of it (the last scale if none
    is), and cast to float16. Returns (scale, eager's nonfinite share there, args, kwargs)."""
    for scale in FLOAT16_MAX_SCALES:
        scaled_args = tuple(_scaled_to(a, scale) for a in args)
        scaled_kwargs = {k: _scaled_to(v, scale) for k, v in kwargs.items()}
        with torch.no_grad():
            share = _nonfinite_share(model(*scaled_args, **copy.deepcopy(scaled_kwargs)))
        if share <= FLOAT16_MAX_NONFINITE:
            break
    return scale, share, scaled_args, scaled_kwargs


def _nonfinite_share(outputs: Any) -> float:
    """The share of inf and NaN among the floating-point elements of `outputs` (eager's overflow in float16)."""
    floats = [
        o for o in torch.utils._pytree.tree_leaves(outputs) if isinstance(o, torch.Tensor) and o.is_floating_point()
    ]
    total = sum(o.numel() for o in floats)
    return round(sum(int((~torch.isfinite(o)).sum()) for o in floats) / total, 3) if total else 0.0


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:600]


def _dynamic_shapes(case: Case, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch.export's dynamic_shapes for the case's axes, with torch.export.Dim objects (named dims)."""
    assert case.dynamic_axes is not None
    dims: dict[str, torch.export.Dim] = {}

    def dim(name: str) -> Any:  # "4*side": a multiple of the dim "side" (sizes a model halves, then concatenates)
        factor, _, base = name.rpartition("*")
        made = dims.setdefault(base, torch.export.Dim(base, min=1, max=1024))
        return made * int(factor) if factor else made

    def spec(axes: dict[int, str]) -> dict[int, Any]:
        return {axis: dim(name) for axis, name in axes.items()}

    def entry(name: str, value: Any) -> Any:
        if isinstance(value, dict):  # a dict of tensors (SDXL's added_cond_kwargs): "outer.inner" axes
            return {key: entry(f"{name}.{key}", inner) for key, inner in value.items()}
        return spec(case.dynamic_axes[name]) if name in case.dynamic_axes else None

    if args:  # one positional tensor (torchvision, timm)
        return (spec(next(iter(case.dynamic_axes.values()))),)
    return {name: entry(name, value) for name, value in kwargs.items()}


def _output_scale(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    """The largest magnitude among the eager model's floating-point outputs."""
    with torch.no_grad():
        outputs = torch.utils._pytree.tree_leaves(model(*args, **copy.deepcopy(kwargs)))  # a cache is appended to
    floats = [o for o in outputs if isinstance(o, torch.Tensor) and o.is_floating_point() and o.numel()]
    return max((float(o.detach().abs().max()) for o in floats), default=0.0)


def cache_argument(model: torch.nn.Module) -> str:
    """The KV cache's argument (and output field): `past_key_values` until transformers 5.23, `cache` since."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def cache_step_inputs(model: torch.nn.Module, batch: int, past: int) -> Inputs:
    """One decoding step as generation runs it: one new token per row after a DynamicCache of `past` tokens, the
    cache made by the eager model's own prefill of `past` random tokens (its layers as the model builds them:
    sliding-window layers included), and an attention mask over past + 1 tokens."""
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    register_cache_pytrees_for_model(model)  # as transformers' exporters do: a cache flattens to its tensors
    generator = torch.Generator().manual_seed(100 * batch + past)
    name = cache_argument(model)
    prefix = torch.randint(3, VOCAB, (batch, past), generator=generator)
    with torch.no_grad():
        cache = getattr(model(input_ids=prefix, use_cache=True), name)
    step = {
        "input_ids": torch.randint(3, VOCAB, (batch, 1), generator=generator),
        "attention_mask": torch.ones(batch, past + 1, dtype=torch.long),
        name: cache,
        "use_cache": True,
    }
    return (), step


def sliding_layers(cache: Any) -> list[Any]:
    """The cache's sliding-window layers (transformers' DynamicSlidingWindowLayer: Mistral, Gemma 2/3, Starcoder2)."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    return [layer for layer in getattr(cache, "layers", ()) if isinstance(layer, DynamicSlidingWindowLayer)]


def whole_history_step(model: torch.nn.Module, batch: int, past: int) -> Inputs:
    """The step of `cache_step_inputs(model, batch, past)` with the cache an exported sliding-window model takes
    (transformers' exporter contract, as optimum's ONNX decoders are fed): eager's layers holding every key of the
    history, not only the window eager keeps; the same prefix, so the same keys."""
    from transformers.cache_utils import DynamicCache

    args, step = cache_step_inputs(model, batch, past)
    name = cache_argument(model)
    generator = torch.Generator().manual_seed(100 * batch + past)  # cache_step_inputs' prefix again
    prefix = torch.randint(3, VOCAB, (batch, past), generator=generator)
    with torch.no_grad():
        full = getattr(model(input_ids=prefix, use_cache=True, **{name: DynamicCache()}), name)
    whole = copy.deepcopy(step[name])
    for layer, full_layer in zip(whole.layers, full.layers, strict=True):
        layer.keys, layer.values = full_layer.keys, full_layer.values
    return args, {**step, name: whole}


def verify_whole_history(program: Any, model: torch.nn.Module, batch: int, past: int) -> list[Any]:
    """A sliding-window model's step run in ONNX Runtime on the whole history, judged against eager's own step
    (its sliding-window cache cut to the window): the logits, and each returned cache tensor, of which a
    sliding-window layer's is compared on the window eager keeps (the graph's grows by the new token)."""
    from fx2onnx._verification import compare

    _, eager_step = cache_step_inputs(model, batch, past)
    _, whole_step = whole_history_step(model, batch, past)
    name = cache_argument(model)
    with torch.no_grad():
        expected = model(**copy.deepcopy(eager_step))
    kept = {id(t) for layer in sliding_layers(getattr(expected, name)) for t in (layer.keys, layer.values)}
    expected_flat = [leaf for leaf in torch.utils._pytree.tree_leaves(expected) if isinstance(leaf, torch.Tensor)]
    actual_flat = [value for value in program(**whole_step) if value is not None]
    if len(actual_flat) != len(expected_flat):
        raise AssertionError(f"ONNX gives {len(actual_flat)} outputs, eager {len(expected_flat)}")
    results = []
    for index, (want, got) in enumerate(zip(expected_flat, actual_flat)):
        output = f"output {index}"
        if id(want) in kept:  # the graph's cache holds the whole history: past + 1 keys
            if got.shape[-2] != past + 1:
                raise AssertionError(f"{output} holds {got.shape[-2]} positions, not the history's {past + 1}")
            got, output = got[..., got.shape[-2] - want.shape[-2] :, :], f"{output} (last {want.shape[-2]})"
        results.append(compare(output, want, got))
    return results


def cache_dynamic_shapes(model: torch.nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Dynamic batch and past length for a decoding step: named dims as optimum's exports name them; a
    sliding-window layer's cache holds the whole history in the exported graph (transformers' exporter
    contract), so every layer's past is the same dim. The attention mask covers the past and the new token:
    ``past + 1``, the relation torch.export suggests for a mask length given as a dim of its own (and infers for
    transformers' exporter, whose dims are Dim.AUTO); OPT's positions (the mask's cumsum after the past) need it."""
    batch = torch.export.Dim("batch", min=1, max=64)
    past = torch.export.Dim("past_sequence", min=1, max=64)
    total = past + 1
    name = cache_argument(model)
    cache = kwargs[name]
    by_tensor: dict[int, dict[int, Any]] = {}
    for layer in cache.layers:
        spec = {0: batch, 2: past}
        by_tensor.update({id(layer.keys): spec, id(layer.values): spec})
    return {
        "input_ids": {0: batch},
        "attention_mask": {0: batch, 1: total},
        # the cache's flat tensors, in the order its registered flatten gives them
        name: [by_tensor.get(id(leaf)) for leaf in torch.utils._pytree.tree_leaves(cache)],
        "use_cache": None,
    }


GENERATE_VARIANTS = {"generate": torch.float32, "generate_float16": torch.float16, "generate_bfloat16": torch.bfloat16}
GENERATE_BATCH, GENERATE_PROMPT, GENERATE_NEW = 2, 7, 24


def generate_export(model: torch.nn.Module) -> Any:
    """The decoder exported once for a generation loop (optimum's and ONNX Runtime GenAI's layout): dynamic batch,
    new-token count and past length, from (batch 2, 3 new tokens, past 5), the cache made by the model's prefill."""
    from transformers.cache_utils import DynamicCache
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    register_cache_pytrees_for_model(model)
    name = cache_argument(model)
    generator = torch.Generator().manual_seed(5)
    prefix = torch.randint(3, VOCAB, (2, 5), generator=generator)
    with torch.no_grad():  # every layer a plain DynamicLayer: the graph's cache holds the whole history
        cache = getattr(model(input_ids=prefix, use_cache=True, **{name: DynamicCache()}), name)
    kwargs = {
        "input_ids": torch.randint(3, VOCAB, (2, 3), generator=generator),
        "attention_mask": torch.ones(2, 8, dtype=torch.long),
        name: cache,
        "use_cache": True,
    }
    batch = torch.export.Dim("batch", min=1, max=64)
    sequence = torch.export.Dim("sequence", min=1, max=64)
    past = torch.export.Dim("past_sequence", min=0, max=64)  # 0: the prefill, after an empty cache
    total = torch.export.Dim("total_sequence", min=1, max=128)
    leaves = torch.utils._pytree.tree_leaves(cache)
    shapes = {
        "input_ids": {0: batch, 1: sequence},
        "attention_mask": {0: batch, 1: total},
        name: [{0: batch, 2: past}] * len(leaves),
        "use_cache": None,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fx2onnx.export(model, (), kwargs=kwargs, dynamic_shapes=shapes), leaves


def greedy_onnx(program: Any, example_leaves: list[torch.Tensor], prompt: torch.Tensor, steps: int) -> Any:
    """Greedy decoding in ONNX Runtime as optimum and ONNX Runtime GenAI run it: the prompt after an empty cache
    (past length 0), then each step's argmax token with the cache the previous step returned. Returns the new
    tokens (batch, steps) and each step's last-position logits."""
    import onnxruntime

    from fx2onnx._verification import to_ortvalue, to_torch

    session = program.session()
    names = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    batch = prompt.shape[0]
    cache = [leaf.new_zeros((batch, leaf.shape[1], 0, *leaf.shape[3:])) for leaf in example_leaves]
    ids, history, tokens, logits = prompt, prompt.shape[1], [], []
    for _ in range(steps):
        feed = [ids, torch.ones(batch, history, dtype=torch.long), *cache]
        if len(feed) != len(names):
            raise AssertionError(f"the graph takes {len(names)} inputs, the loop feeds {len(feed)}")
        values = session.run_with_ort_values(outputs, {n: to_ortvalue(onnxruntime, t) for n, t in zip(names, feed)})
        step_logits, *cache = [to_torch(v) for v in values]
        logits.append(step_logits[:, -1])
        ids = step_logits[:, -1].float().argmax(-1, keepdim=True)
        tokens.append(ids)
        history += 1
    return torch.cat(tokens, 1), logits


def greedy_eager(model: torch.nn.Module, prompt: torch.Tensor, steps: int) -> Any:
    """The same loop in eager, with the cache the model makes itself (sliding-window layers cut to the window)."""
    name = cache_argument(model)
    batch = prompt.shape[0]
    ids, history, cache, tokens, logits = prompt, prompt.shape[1], None, [], []
    with torch.no_grad():
        for _ in range(steps):
            mask = torch.ones(batch, history, dtype=torch.long)
            out = model(input_ids=ids, attention_mask=mask, use_cache=True, **({name: cache} if cache else {}))
            cache = getattr(out, name)
            logits.append(out.logits[:, -1])
            ids = out.logits[:, -1].float().argmax(-1, keepdim=True)
            tokens.append(ids)
            history += 1
    return torch.cat(tokens, 1), logits


def run_generate(case: Case, model32: torch.nn.Module, variant: str) -> dict[str, Any]:
    """Greedy decoding of GENERATE_NEW tokens from a GENERATE_PROMPT-token prompt (batch GENERATE_BATCH), in ONNX
    Runtime and in eager, each feeding back its own tokens and cache. float32: the tokens must be identical and
    the logits close at every step. float16/bfloat16: rounding alone may flip an argmax where the top two logits
    nearly tie; the first step where the tokens diverge is recorded with eager's top-2 gap there, the float32
    model's, and eager's own rounding noise at that row (distance of its logits to the float32 model's on the same
    history): a divergence where the gap is within twice that noise, with ONNX's logits within twice it too, is a
    near tie, not a defect; any other divergence, and logits beyond the noise before it, are mismatches."""
    from fx2onnx import _rounding_noise as rounding_noise
    from fx2onnx._verification import TOLERANCES, compare

    record: dict[str, Any] = {"model": case.name, "group": case.group, "variant": variant}
    dtype = GENERATE_VARIANTS[variant]
    model = copy.deepcopy(model32).to(dtype)
    model.config.use_cache = True
    prompt = torch.randint(3, VOCAB, (GENERATE_BATCH, GENERATE_PROMPT), generator=torch.Generator().manual_seed(7))
    try:
        eager_tokens, eager_logits = greedy_eager(model, prompt, GENERATE_NEW)
    except Exception as error:
        record.update(outcome="eager", error=_short(error))
        return record
    start = time.perf_counter()
    try:
        program, leaves = generate_export(model)
    except Exception as error:
        record.update(outcome="export", error=_short(error), trace=traceback.format_exc()[-3000:])
        return record
    record["export_seconds"] = round(time.perf_counter() - start, 2)
    try:
        program.session()
    except Exception as error:
        record.update(outcome="load", error=_short(error))
        return record
    try:
        onnx_tokens, onnx_logits = greedy_onnx(program, leaves, prompt, GENERATE_NEW)
    except Exception as error:
        record.update(outcome="run", error=_short(error), trace=traceback.format_exc()[-3000:])
        return record
    differing = (eager_tokens != onnx_tokens).any(0).nonzero()
    first = int(differing[0]) if len(differing) else None
    record["tokens_equal"] = first is None
    record["first_divergence"] = first
    lines = []
    compared = GENERATE_NEW if first is None else first + 1  # the step that diverged still had the same history
    for step in range(compared):
        result = compare(f"logits step {step}", eager_logits[step], onnx_logits[step])
        record["logits_max_abs"] = float(f"{max(record.get('logits_max_abs', 0.0), result.max_abs_error):.3g}")
        if result.passed:
            continue
        if dtype == torch.float32:
            lines.append(str(result))
            continue
        history = torch.cat([prompt, eager_tokens[:, :step]], 1)  # the history both had at this step
        with torch.no_grad():
            reference = model32(input_ids=history, use_cache=False).logits[:, -1]
        noise = rounding_noise.compare_to_reference(
            eager_logits[step], onnx_logits[step], reference, TOLERANCES[dtype][1]
        )
        if noise is None or not noise.within_noise:
            lines.append(f"{result}: {noise}")
        else:
            ratio = noise.onnx_max / noise.eager_max if noise.eager_max else 0.0
            record["noise_max_ratio"] = round(max(record.get("noise_max_ratio", 0.0), ratio), 3)
    if first is not None:
        if dtype == torch.float32:
            lines.append(f"tokens differ from step {first}")
        else:
            tie = divergence_tie(model32, prompt, eager_tokens, onnx_tokens, eager_logits, onnx_logits, first)
            record["divergence"] = tie
            if not tie["near_tie"]:
                lines.append(f"tokens differ from step {first} without a near tie: {tie}")
    record["outcome"] = "mismatch" if lines else "ok"
    if lines:
        record["error"] = " || ".join(lines)[:1500]
    return record


def divergence_tie(
    model32: torch.nn.Module,
    prompt: torch.Tensor,
    eager_tokens: torch.Tensor,
    onnx_tokens: torch.Tensor,
    eager_logits: list[torch.Tensor],
    onnx_logits: list[torch.Tensor],
    step: int,
) -> dict[str, Any]:
    """At the first step where the tokens differ (the same history before it): for the first row that differs,
    eager's gap between its token and ONNX's, the float32 model's gap between them, eager's rounding noise on
    that row (its largest distance to the float32 logits) and ONNX's distance; a near tie when both gaps are
    within twice eager's noise and ONNX's logits within twice it too."""
    row = int((eager_tokens[:, step] != onnx_tokens[:, step]).nonzero()[0])
    history = torch.cat([prompt, eager_tokens[:, :step]], 1)
    with torch.no_grad():
        reference = model32(input_ids=history, use_cache=False).logits[row, -1].double()
    eager, onnx = eager_logits[step][row].double(), onnx_logits[step][row].double()
    a, b = int(eager_tokens[row, step]), int(onnx_tokens[row, step])
    eager_noise = float((eager - reference).abs().max())
    onnx_error = float((onnx - reference).abs().max())
    gap_eager, gap_reference = float(eager[a] - eager[b]), float(reference[a] - reference[b])
    near = abs(gap_eager) <= 2 * eager_noise and abs(gap_reference) <= 2 * eager_noise and onnx_error <= 2 * eager_noise
    return {
        "step": step,
        "row": row,
        "tokens": [a, b],
        "gap_eager": round(gap_eager, 5),
        "gap_float32": round(gap_reference, 5),
        "eager_noise": round(eager_noise, 5),
        "onnx_error": round(onnx_error, 5),
        "near_tie": near,
    }


def noise_margin(record: dict[str, Any], results: list[Any]) -> None:
    """Keep in `record` how close the outputs judged by rounding noise came to its limit: the largest ratio of
    ONNX's distance to the float32 result over eager's own (max and mean), over outputs and runs. An ok at 1.9 is
    not an ok at 1.0; the limits are fx2onnx._rounding_noise's MAX_FACTOR and MEAN_FACTOR."""
    for result in results:
        noise = getattr(result, "noise", None)
        if noise is None or not result.passed:
            continue
        ratios = {"max": (noise.onnx_max, noise.eager_max), "mean": (noise.onnx_mean, noise.eager_mean)}
        for key, (onnx_error, eager_error) in ratios.items():
            ratio = onnx_error / eager_error if eager_error > 0 else (0.0 if onnx_error == 0 else float("inf"))
            field = f"noise_{key}_ratio"
            record[field] = round(max(record.get(field, 0.0), ratio), 3)


def run_variant(case: Case, model32: torch.nn.Module, variant: str, length: int = 12) -> dict[str, Any]:
    """Export `case` as `variant` from an example of `length` (tokens; audio: 400 + 40 x length samples), run it in
    ONNX Runtime and compare with eager: one result record."""
    record: dict[str, Any] = {"model": case.name, "group": case.group, "variant": variant}
    if length != 12:
        record["length"] = length
    masked_row = variant.startswith("masked_row")
    args, kwargs = case.inputs(1 if variant == "batch1" else MASKED_ROW_BATCH if masked_row else 2, length)
    model = model32
    dtype = REDUCED.get(variant, CACHE_VARIANTS.get(variant, EXTREMES.get(variant, torch.float32)))
    if dtype != torch.float32:
        model = copy.deepcopy(model32).to(dtype)
    if variant == "float16_max":  # float inputs scaled near float16's max, as far as eager stays mostly finite
        try:
            record["scale"], record["eager_nonfinite"], args, kwargs = near_float16_max(model, args, kwargs)
        except Exception as error:
            record.update(outcome="eager", error=_short(error))
            return record
    elif dtype != torch.float32:
        args, kwargs = torch.utils._pytree.tree_map(lambda value: _to_dtype(value, dtype), (args, kwargs))
    if variant == "timestep_float":
        kwargs = {**kwargs, "timestep": float_timestep(case, kwargs["timestep"])}
    if variant == "padded" or masked_row:  # an attention mask with padding, as batched generation passes it
        mask = torch.ones(kwargs["input_ids"].shape, dtype=torch.long)
        mask[0, :3] = 0  # row 0 left-padded
        mask[1, -2:] = 0  # row 1 right-padded
        if masked_row:
            mask[2, :] = 0  # row 2 padding only: its attention rows are fully masked
        kwargs = {**kwargs, "attention_mask": mask}
    runs = [(args, kwargs)]
    options: dict[str, Any] = {}
    if variant in ("dynamic", "batch1"):  # batch1: the common call, a batch of one as the example
        options["dynamic_shapes"] = _dynamic_shapes(case, args, kwargs)
        runs.append(case.inputs(3, 7))
        if variant == "batch1":
            runs.append(case.inputs(2, 12))
    try:
        if variant in CACHE_VARIANTS:
            model = copy.deepcopy(model)
            model.config.use_cache = True
            runs = [cache_step_inputs(model, batch, past) for batch, past in CACHE_RUNS]
            args, kwargs = runs[0]
            options["dynamic_shapes"] = cache_dynamic_shapes(model, kwargs)
        with torch.no_grad():
            model(*args, **copy.deepcopy(kwargs))  # eager must run, or there is nothing to compare
    except Exception as error:
        record.update(outcome="eager", error=_short(error))
        return record
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = fx2onnx.export(model, args, kwargs=kwargs, **options)
    except Exception as error:
        record.update(outcome="export", error=_short(error), trace=traceback.format_exc()[-3000:])
        return record
    record["export_seconds"] = round(time.perf_counter() - start, 2)
    try:
        program.session()
    except Exception as error:
        record.update(outcome="load", error=_short(error))
        return record
    lines = []
    whole_history = variant in CACHE_VARIANTS and bool(sliding_layers(kwargs[cache_argument(model)]))
    for run, (call_args, call_kwargs) in enumerate(runs):
        try:
            if whole_history:
                # fed the whole history (the graph's contract), judged against eager's sliding-window step
                batch, past = CACHE_RUNS[run]
                results = verify_whole_history(program, model, batch, past)
            else:
                results = program.verify(*call_args, **call_kwargs)
        except Exception as error:
            record.update(outcome="run", error=_short(error), trace=traceback.format_exc()[-3000:])
            return record
        failed = [str(r) for r in results if not r.passed]
        noise_margin(record, results)
        if failed and dtype == torch.float32 and not whole_history:
            # Random weights without trained batch-norm statistics can grow activations to 1e9 (Inception v3):
            # float32 noise is then far above verify's absolute 1e-4. Judged again at 1e-5 of the outputs' scale.
            scale = _output_scale(model, call_args, call_kwargs)
            rescaled = program.verify(*call_args, atol=1e-5 * scale, **call_kwargs)
            if all(r.passed for r in rescaled):
                record["note"] = f"within 1e-5 of the outputs' scale {scale:.3g}, not verify's atol: " + failed[0]
                failed = []
        if failed:
            flat = torch.utils._pytree.tree_leaves((call_args, call_kwargs))
            shape = [list(v.shape) for v in flat if isinstance(v, torch.Tensor)]
            lines.append(f"inputs {shape}: " + " | ".join(failed))
    record["outcome"] = "mismatch" if lines else "ok"
    if lines:
        record["error"] = " || ".join(lines)[:1500]
    return record


def all_cases() -> list[Case]:
    return (
        transformers_cases()
        + torchvision_cases()
        + timm_cases()
        + diffusers_cases()
        + encoder_decoder_generate_cases()
        + multimodal_cases()
    )


def sweep(cases: list[Case], variants: tuple[str, ...], out: Path | None, length: int = 12) -> list[dict[str, Any]]:
    records = []

    def applies(case: Case, variant: str) -> bool:
        if case.group == ENCDEC_GENERATE_GROUP:  # the generate variants only, of its own loop
            return variant in case.variants
        if variant == "dynamic":
            return case.dynamic_axes is not None
        if variant == "padded" or variant.startswith("masked_row"):
            return case.group == "transformers" and case.inputs in (_token_inputs, _seq2seq_inputs)
        if variant == "float16_max":  # models fed float inputs: pixels, audio (not latents: they are N(0, 1))
            return case.inputs not in (_token_inputs, _seq2seq_inputs) and case.group != "diffusers"
        if variant in CACHE_VARIANTS or variant in GENERATE_VARIANTS:
            return case.decoder
        if variant == "batch1":
            return case.dynamic_axes is not None and variant in case.variants
        if variant == "timestep_float":
            return variant in case.variants
        return variant in case.variants

    jobs = [(case, [v for v in variants if applies(case, v)]) for case in cases]
    total = sum(len(v) for _, v in jobs)
    done = 0
    started = time.perf_counter()
    for case, case_variants in jobs:
        try:
            model32 = case.build()
        except Exception as error:
            for variant in case_variants:
                done += 1
                record = {"model": case.name, "group": case.group, "variant": variant, "outcome": "build"}
                record["error"] = _short(error)
                records.append(record)
                _emit(record, out, done, total, started)
            continue
        for variant in case_variants:
            try:
                if case.group == ENCDEC_GENERATE_GROUP:
                    record = run_encdec_generate(case, model32, variant)
                elif variant in GENERATE_VARIANTS:
                    record = run_generate(case, model32, variant)
                else:
                    record = run_variant(case, model32, variant, length)
            except Exception as error:  # a defect of the sweep itself: recorded, the sweep goes on
                record = {"model": case.name, "group": case.group, "variant": variant, "outcome": "sweep"}
                record["error"] = _short(error)
            done += 1
            records.append(record)
            _emit(record, out, done, total, started)
    return records


def _emit(record: dict[str, Any], out: Path | None, done: int, total: int, started: float) -> None:
    elapsed = time.perf_counter() - started
    detail = f" ({record['error'][:160]})" if "error" in record else ""
    print(
        f"[{done}/{total} {elapsed:6.0f}s] {record['model']:28} {record['variant']:9} {record['outcome']}{detail}",
        file=sys.stderr,
        flush=True,
    )
    if out is not None:
        with out.open("a") as file:
            file.write(json.dumps(record) + "\n")


def table(records: list[dict[str, Any]]) -> str:
    """The model x variant table (markdown) of the last record of each (model, variant)."""
    cells: dict[str, dict[str, str]] = {}
    for record in records:
        cells.setdefault(record["model"], {})[record["variant"]] = record["outcome"]
    lines = ["| model | " + " | ".join(VARIANTS) + " |", "|---|" + "---|" * len(VARIANTS)]
    for model, row in cells.items():
        lines.append(f"| {model} | " + " | ".join(row.get(v, "-") for v in VARIANTS) + " |")
    counts: dict[str, int] = {}
    for row in cells.values():
        for outcome in row.values():
            counts[outcome] = counts.get(outcome, 0) + 1
    lines.append("")
    lines.append(", ".join(f"{outcome}: {count}" for outcome, count in sorted(counts.items())))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated substrings of model names")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--length", type=int, default=12, help="the examples' sequence length (tokens)")
    parser.add_argument("--out", type=Path, default=None, help="append one JSON line per result to this file")
    parser.add_argument("--table", type=Path, default=None, help="print the table of a results file and stop")
    options = parser.parse_args()
    if options.table is not None:
        print(table([json.loads(line) for line in options.table.read_text().splitlines() if line.strip()]))
        return
    cases = all_cases()
    if options.only:
        wanted = options.only.split(",")
        cases = [case for case in cases if any(w in case.name for w in wanted)]
    records = sweep(cases, tuple(options.variants.split(",")), options.out, options.length)
    print(table(records))


if __name__ == "__main__":
    main()
