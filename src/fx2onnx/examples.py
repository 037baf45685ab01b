"""Built-in example models, used by ``fx2onnx demo``, the tests and the benchmarks."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    """A pre-norm transformer block with causal self-attention (GPT-2 style)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.out = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TinyGPT(torch.nn.Module):
    """A GPT-like decoder: token + position embeddings, `layers` blocks, tied LM head."""

    def __init__(self, vocab: int = 512, width: int = 64, heads: int = 4, layers: int = 2, context: int = 128) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tokens.weight.T


class ResidualBlock(torch.nn.Module):
    def __init__(self, channels: int, stride: int = 1) -> None:
        super().__init__()
        out = channels * stride
        self.conv1 = torch.nn.Conv2d(channels, out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(out)
        self.conv2 = torch.nn.Conv2d(out, out, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(out)
        self.shortcut = (
            torch.nn.Sequential(torch.nn.Conv2d(channels, out, 1, stride=stride, bias=False), torch.nn.BatchNorm2d(out))
            if stride != 1
            else torch.nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class TinyResNet(torch.nn.Module):
    """A ResNet-like CNN: stem, residual stages, global pooling, classifier."""

    def __init__(self, width: int = 16, stages: int = 3, blocks: int = 1, classes: int = 10) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, width, 3, padding=1, bias=False), torch.nn.BatchNorm2d(width), torch.nn.ReLU()
        )
        layers: list[torch.nn.Module] = []
        channels = width
        for stage in range(stages):
            for index in range(blocks):
                stride = 2 if stage > 0 and index == 0 else 1
                layers.append(ResidualBlock(channels, stride))
                channels *= stride
        self.layers = torch.nn.Sequential(*layers)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.layers(self.stem(x))).flatten(1))


def tiny_gpt(seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """The demo model and example input."""
    torch.manual_seed(seed)
    model = TinyGPT().eval()
    return model, (torch.randint(0, 512, (2, 16)),)


def tiny_resnet(seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(seed)
    model = TinyResNet().eval()
    return model, (torch.randn(2, 3, 32, 32),)


def gpt2_small(layers: int = 12) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """A GPT-2-small-sized model (vocab 50257, width 768, 12 heads) with random weights."""
    torch.manual_seed(0)
    model = TinyGPT(vocab=50257, width=768, heads=12, layers=layers, context=1024).eval()
    return model, (torch.randint(0, 50257, (1, 128)),)


# --- transformers' model families, built from their configs (random weights, nothing downloaded) -------------
# One builder for the tests (size "small": a few layers of width 64, seconds to export) and the benchmarks (size
# "benchmark": the published models' sizes). transformers is imported on first use only (a test dependency).

TRANSFORMERS_FAMILIES = ("gpt2", "llama", "bert", "whisper", "t5")
TRANSFORMERS_SIZES = ("small", "benchmark")
_SMALL_VOCAB = 512

# family -> (config class, model class): the model as a user exports it, the class itself with no wrapper.
_TRANSFORMERS_CLASSES = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "bert": ("BertConfig", "BertModel"),
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration"),
    "t5": ("T5Config", "T5ForConditionalGeneration"),
}
# (family, size) -> the config's arguments (no KV cache: use_cache=False is added to each).
_TRANSFORMERS_CONFIGS: dict[tuple[str, str], dict[str, Any]] = {
    ("gpt2", "small"): dict(
        n_layer=2, n_embd=64, n_head=4, vocab_size=_SMALL_VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0
    ),
    ("gpt2", "benchmark"): {},  # GPT2Config(): GPT-2 small, 12 layers, width 768, vocab 50257
    ("llama", "small"): dict(
        vocab_size=_SMALL_VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    ),
    ("llama", "benchmark"): dict(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
    ),
    ("bert", "small"): dict(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=_SMALL_VOCAB
    ),
    ("bert", "benchmark"): {},  # BertConfig(): BERT-base, 12 layers, width 768, vocab 30522
    ("whisper", "small"): dict(
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
        vocab_size=_SMALL_VOCAB,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    ),
    ("whisper", "benchmark"): dict(  # openai/whisper-tiny's sizes
        d_model=384,
        encoder_layers=4,
        decoder_layers=4,
        encoder_attention_heads=6,
        decoder_attention_heads=6,
        encoder_ffn_dim=1536,
        decoder_ffn_dim=1536,
        num_mel_bins=80,
        vocab_size=51865,
    ),
    ("t5", "small"): dict(
        d_model=64,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        d_kv=16,
        vocab_size=_SMALL_VOCAB,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    ),
    ("t5", "benchmark"): dict(  # t5-small's sizes
        vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8
    ),
}
# size -> (batch, tokens, decoder tokens) of the example inputs.
_TRANSFORMERS_INPUT_SIZES = {"small": (2, 12, 7), "benchmark": (1, 128, 32)}


def _transformers_class(family: str, which: int) -> Any:
    if family not in _TRANSFORMERS_CLASSES:
        raise ValueError(f"unknown transformers family {family!r}; choose from {', '.join(TRANSFORMERS_FAMILIES)}")
    import transformers

    return getattr(transformers, _TRANSFORMERS_CLASSES[family][which])


def transformers_config(family: str, size: str = "small", **overrides: Any) -> Any:
    """The config of a transformers model `family` (see TRANSFORMERS_FAMILIES) at `size` ("small": for tests,
    "benchmark": the published model's sizes), with `overrides` applied; no KV cache unless overridden."""
    if size not in TRANSFORMERS_SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(TRANSFORMERS_SIZES)}")
    config_class = _transformers_class(family, 0)
    values = {**_TRANSFORMERS_CONFIGS[family, size], **overrides}
    use_cache = values.pop("use_cache", False)
    config = config_class(**values)
    config.use_cache = use_cache  # set after construction: T5Config's constructor does not take it as given
    return config


def transformers_model(
    family: str,
    size: str = "small",
    *,
    config: Any = None,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    meta: bool = False,
    **overrides: Any,
) -> torch.nn.Module:
    """A transformers model of `family` in eval mode, its random weights drawn from `seed` (the same weights in
    every process), of `dtype`, or on the meta device (no storage) with `meta`. `config` (from
    transformers_config) replaces `size` and `overrides`."""
    model_class = _transformers_class(family, 1)
    if config is None:
        config = transformers_config(family, size, **overrides)
    torch.manual_seed(seed)
    with torch.device("meta") if meta else torch.device("cpu"), torch.no_grad():
        model = model_class._from_config(config, dtype=dtype) if dtype is not None else model_class(config)
    return model.eval()


def transformers_inputs(
    family: str,
    size: str = "small",
    *,
    config: Any = None,
    batch: int | None = None,
    length: int | None = None,
    decoder_length: int | None = None,
    seed: int = 1,
) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    """Example inputs `(args, kwargs)` for transformers_model(family, size): token ids (Whisper: log-mel
    features, as many frames as the encoder's positions need), and the decoder's ids for encoder-decoders, drawn
    from `seed`. Batch and lengths default to the size's: small 2 x 12 (decoder 7), benchmark 1 x 128 (32)."""
    if config is None:
        config = transformers_config(family, size)
    default_batch, default_length, default_decoder_length = _TRANSFORMERS_INPUT_SIZES[size]
    batch, length = batch or default_batch, length or default_length
    generator = torch.Generator().manual_seed(seed)
    if family == "whisper":  # the encoder requires 2 x max_source_positions frames
        first = torch.randn(batch, config.num_mel_bins, 2 * config.max_source_positions, generator=generator)
    else:
        first = torch.randint(0, config.vocab_size, (batch, length), generator=generator)
    kwargs: dict[str, torch.Tensor] = {}
    if family in ("whisper", "t5"):
        shape = (batch, decoder_length or default_decoder_length)
        kwargs["decoder_input_ids"] = torch.randint(0, config.vocab_size, shape, generator=generator)
    return (first,), kwargs


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def megabytes(model: torch.nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20


__all__ = [
    "TRANSFORMERS_FAMILIES",
    "TRANSFORMERS_SIZES",
    "TinyGPT",
    "TinyResNet",
    "gpt2_small",
    "tiny_gpt",
    "tiny_resnet",
    "transformers_config",
    "transformers_inputs",
    "transformers_model",
]
