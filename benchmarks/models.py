"""Benchmark models, written with ``torch.nn`` and built with random weights (nothing is downloaded).

Each entry of :data:`MODELS` builds a model and its example inputs from a fixed seed, so that two
processes (one per exporter) build the same weights and the same inputs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from fx2onnx import examples

# --- a LLaMA-style decoder: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU ---------------


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 32000
    hidden: int = 1024
    intermediate: int = 2816
    layers: int = 8
    heads: int = 16
    kv_heads: int = 4
    context: int = 2048
    rope_theta: float = 10000.0
    eps: float = 1e-5


LLAMA_7B = LlamaConfig(hidden=4096, intermediate=11008, layers=32, heads=32, kv_heads=32, context=4096, eps=1e-5)


class RMSNorm(torch.nn.Module):
    """Written out as in LLaMA's reference code (the pattern ONNX's RMSNormalization replaces)."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class LlamaAttention(torch.nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.kv_heads = config.kv_heads
        self.head_dim = config.hidden // config.heads
        self.q_proj = torch.nn.Linear(config.hidden, config.heads * self.head_dim, bias=False)
        self.k_proj = torch.nn.Linear(config.hidden, config.kv_heads * self.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(config.hidden, config.kv_heads * self.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(config.heads * self.head_dim, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
            k = (
                k[:, :, None]
                .expand(batch, self.kv_heads, groups, length, self.head_dim)
                .reshape(batch, -1, length, self.head_dim)
            )
            v = (
                v[:, :, None]
                .expand(batch, self.kv_heads, groups, length, self.head_dim)
                .reshape(batch, -1, length, self.head_dim)
            )
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))


class LlamaMLP(torch.nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(config.hidden, config.intermediate, bias=False)
        self.up_proj = torch.nn.Linear(config.hidden, config.intermediate, bias=False)
        self.down_proj = torch.nn.Linear(config.intermediate, config.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(torch.nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden, config.eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden, config.eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(torch.nn.Module):
    """A LLaMA-architecture decoder (no KV cache): ids -> logits."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = torch.nn.Embedding(config.vocab, config.hidden)
        self.layers = torch.nn.ModuleList(LlamaLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.eps)
        self.lm_head = torch.nn.Linear(config.hidden, config.vocab, bias=False)
        head_dim = config.hidden // config.heads
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device, dtype=torch.float32)
        angles = positions[:, None] * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        x = self.embed_tokens(ids)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


# --- a ResNet-50-sized CNN (bottleneck blocks 3-4-6-3) -------------------------------------------------


class Bottleneck(torch.nn.Module):
    expansion = 4

    def __init__(self, channels: int, width: int, stride: int) -> None:
        super().__init__()
        out = width * self.expansion
        self.conv1 = torch.nn.Conv2d(channels, width, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(width)
        self.conv2 = torch.nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(width)
        self.conv3 = torch.nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = torch.nn.BatchNorm2d(out)
        self.downsample = (
            torch.nn.Sequential(torch.nn.Conv2d(channels, out, 1, stride=stride, bias=False), torch.nn.BatchNorm2d(out))
            if stride != 1 or channels != out
            else torch.nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.downsample(x))


class ResNet50(torch.nn.Module):
    def __init__(self, classes: int = 1000, blocks: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            torch.nn.BatchNorm2d(64),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, stride=2, padding=1),
        )
        layers: list[torch.nn.Module] = []
        channels = 64
        for stage, count in enumerate(blocks):
            width = 64 * 2**stage
            for index in range(count):
                layers.append(Bottleneck(channels, width, 2 if stage > 0 and index == 0 else 1))
                channels = width * Bottleneck.expansion
        self.layers = torch.nn.Sequential(*layers)
        self.fc = torch.nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


# --- a ViT-B/16-sized vision transformer ---------------------------------------------------------------


class ViTBlock(torch.nn.Module):
    def __init__(self, width: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width, eps=1e-6)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width, eps=1e-6)
        self.fc1 = torch.nn.Linear(width, mlp)
        self.fc2 = torch.nn.Linear(mlp, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(batch, tokens, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, tokens, width))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(torch.nn.Module):
    def __init__(
        self,
        image: int = 224,
        patch: int = 16,
        width: int = 768,
        layers: int = 12,
        heads: int = 12,
        classes: int = 1000,
    ) -> None:
        super().__init__()
        self.patch_embed = torch.nn.Conv2d(3, width, patch, stride=patch)
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = torch.nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, width) * 0.02)
        self.blocks = torch.nn.ModuleList(ViTBlock(width, heads, 4 * width) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width, eps=1e-6)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


# --- transformers' models, built from their configs (random weights, nothing downloaded) -----------------
# fx2onnx.examples' builder at its "benchmark" size, which the tests use at its "small" one. As a user would export
# them: the model class itself, no wrapper, no KV cache; keyword inputs (a dict last in `args`, which both exporters
# read as keyword arguments) where the model's positional order is not the inputs'.


def _hf_model(family: str) -> Callable[[], torch.nn.Module]:
    return lambda: examples.transformers_model(family, "benchmark")


def _hf_inputs(family: str) -> Callable[[], tuple[torch.Tensor | dict[str, torch.Tensor], ...]]:
    def inputs() -> tuple[torch.Tensor | dict[str, torch.Tensor], ...]:
        args, kwargs = examples.transformers_inputs(family, "benchmark")
        return (*args, kwargs) if kwargs else args

    return inputs


# --- torchvision's and timm's image classifiers (random weights) ------------------------------------------
# Neither is a dependency of fx2onnx: `make bench` installs each, without its dependencies (which would replace
# torch), into a folder of its own beside the venv's site-packages (see the Makefile); FX2ONNX_TORCHVISION_DIR and
# FX2ONNX_TIMM_DIR name other folders. PyPI's torchvision needs the CPU-op shim the detection tests use.
_REPOSITORY = Path(__file__).resolve().parent.parent


def _extra_package_folder(variable: str, default: str) -> Path:
    return Path(os.environ.get(variable, Path(sys.prefix) / default))


def import_torchvision() -> ModuleType:
    """torchvision, made importable beside the CPU torch by tests/torchvision_cpu_ops.py."""
    if "torchvision_cpu_ops" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "torchvision_cpu_ops", _REPOSITORY / "tests" / "torchvision_cpu_ops.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["torchvision_cpu_ops"] = module
        spec.loader.exec_module(module)
    return sys.modules["torchvision_cpu_ops"].import_torchvision()


def import_timm() -> ModuleType:
    """timm, from the folder `make bench` installs it into (it imports torchvision: that first)."""
    import_torchvision()
    folder = _extra_package_folder("FX2ONNX_TIMM_DIR", "timm")
    if folder.is_dir() and str(folder) not in sys.path:
        sys.path.append(str(folder))
    import timm

    return timm


def import_diffusers() -> ModuleType:
    """diffusers, from the folder `make test` installs it into with the few dependencies the venv lacks
    (FX2ONNX_DIFFUSERS_DIR names another)."""
    folder = _extra_package_folder("FX2ONNX_DIFFUSERS_DIR", "diffusers")
    if folder.is_dir() and str(folder) not in sys.path:
        sys.path.append(str(folder))
    import diffusers

    diffusers.utils.logging.set_verbosity_error()
    return diffusers


def _without_zero_weights(model: torch.nn.Module) -> torch.nn.Module:
    """Weights a fresh model holds at all zeros are drawn at random (torchvision's ViT initializes its classifier
    to zeros: its logits would be the zero bias whatever the backbone computed, and no comparison would see it)."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2 and not parameter.any():
                parameter.normal_(0.0, 0.02)
    return model


def _torchvision(name: str) -> Callable[[], torch.nn.Module]:
    return lambda: _without_zero_weights(getattr(import_torchvision().models, name)(weights=None))


def _timm(name: str) -> Callable[[], torch.nn.Module]:
    return lambda: _without_zero_weights(import_timm().create_model(name, pretrained=False))


def group_available(group: str) -> str | None:
    """Why a group's models cannot be built here (None when they can)."""
    try:
        if group == "torchvision":
            import_torchvision()
        elif group == "timm":
            import_timm()
        elif group == "diffusers":
            import_diffusers()
        elif group == "transformers":
            import transformers  # noqa: F401
    except ImportError as error:
        return f"{group} does not import ({error}); `make bench` installs it"
    return None


# --- the registry of benchmark models --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchModel:
    name: str
    description: str
    build: Callable[[], torch.nn.Module]
    # Positional tensors, then optionally a dict of keyword tensors (the exporters' convention for `args`).
    inputs: Callable[[], tuple[torch.Tensor | dict[str, torch.Tensor], ...]]
    group: str = "torch.nn"


def _seeded(factory: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        with torch.no_grad():
            model = factory().eval()
            for buffer_name, buffer in model.named_buffers():
                if buffer_name.endswith("running_var"):  # BatchNorm statistics that are not all ones
                    buffer.uniform_(0.5, 1.5)
                elif buffer_name.endswith("running_mean"):
                    buffer.normal_(0.0, 0.1)
        return model

    return build


def _ids(vocab: int, length: int = 128) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(1)),)


def _images(size: int, batch: int = 1) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1)),)


# (name, image size, description) of the image classifiers, at their usual 224x224 inputs.
TORCHVISION_MODELS = (
    ("resnet50", 224, "1x3x224x224"),
    ("mobilenet_v3_large", 224, "1x3x224x224"),
    ("efficientnet_b0", 224, "1x3x224x224"),
    ("convnext_tiny", 224, "1x3x224x224"),
    ("vit_b_16", 224, "1x3x224x224"),
    ("swin_t", 224, "1x3x224x224"),
)
TIMM_MODELS = (
    ("vit_small_patch16_224", 224, "ViT-S/16, 1x3x224x224"),
    ("convnext_tiny", 224, "ConvNeXt-T, 1x3x224x224"),
    ("efficientnet_b0", 224, "EfficientNet-B0, 1x3x224x224"),
)

MODELS: dict[str, BenchModel] = {
    model.name: model
    for model in (
        BenchModel(
            "resnet",
            "ResNet-like CNN (fx2onnx.examples.TinyResNet, 3 stages), 8x3x32x32",
            _seeded(lambda: examples.TinyResNet(width=32, stages=3, blocks=2)),
            _images(32, batch=8),
        ),
        BenchModel(
            "gpt2",
            "GPT-2-small-sized transformer (12 layers, width 768, vocab 50257), 1x128 tokens",
            _seeded(lambda: examples.gpt2_small()[0]),
            _ids(50257),
        ),
        BenchModel(
            "llama",
            "LLaMA-style decoder (8 layers, hidden 1024, 16 heads / 4 KV heads, RMSNorm, rotary, SwiGLU), 1x128",
            _seeded(lambda: Llama(LlamaConfig())),
            _ids(32000),
        ),
        BenchModel(
            "resnet50",
            "ResNet-50-sized CNN (bottlenecks 3-4-6-3), 1x3x224x224",
            _seeded(ResNet50),
            _images(224),
        ),
        BenchModel("vit", "ViT-B/16-sized vision transformer, 1x3x224x224", _seeded(ViT), _images(224)),
        BenchModel(
            "hf-gpt2",
            "transformers GPT2LMHeadModel, GPT2Config() (GPT-2-small: 12 layers, width 768), 1x128 tokens",
            _seeded(_hf_model("gpt2")),
            _hf_inputs("gpt2"),
            "transformers",
        ),
        BenchModel(
            "hf-llama",
            "transformers LlamaForCausalLM, 8 layers, hidden 1024, 16 heads / 4 KV heads, vocab 32000, 1x128 tokens",
            _seeded(_hf_model("llama")),
            _hf_inputs("llama"),
            "transformers",
        ),
        BenchModel(
            "hf-bert",
            "transformers BertModel, BertConfig() (BERT-base: 12 layers, width 768), 1x128 tokens",
            _seeded(_hf_model("bert")),
            _hf_inputs("bert"),
            "transformers",
        ),
        BenchModel(
            "hf-whisper",
            "transformers WhisperForConditionalGeneration, whisper-tiny's sizes (d_model 384, 4+4 layers), "
            "1x80x3000 features, 1x32 decoder tokens",
            _seeded(_hf_model("whisper")),
            _hf_inputs("whisper"),
            "transformers",
        ),
        BenchModel(
            "hf-t5",
            "transformers T5ForConditionalGeneration, t5-small's sizes (d_model 512, 6+6 layers), 1x128 tokens, "
            "1x32 decoder tokens",
            _seeded(_hf_model("t5")),
            _hf_inputs("t5"),
            "transformers",
        ),
        *(
            BenchModel(
                f"tv-{name}",
                f"torchvision.models.{name}(weights=None), {description}",
                _seeded(_torchvision(name)),
                _images(size),
                "torchvision",
            )
            for name, size, description in TORCHVISION_MODELS
        ),
        *(
            BenchModel(
                f"timm-{name}",
                f"timm.create_model({name!r}), {description}",
                _seeded(_timm(name)),
                _images(size),
                "timm",
            )
            for name, size, description in TIMM_MODELS
        ),
    )
}


def flat_inputs(inputs: tuple[torch.Tensor | dict[str, torch.Tensor], ...]) -> list[torch.Tensor]:
    """The tensors of a model's inputs in the order of the exported graph's inputs (keyword tensors last)."""
    flat: list[torch.Tensor] = []
    for item in inputs:
        flat.extend(item.values() if isinstance(item, dict) else [item])
    return flat


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each storage counted once (tied weights)."""
    storages: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def build_llama(config: LlamaConfig, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """A LLaMA with random weights of `dtype`, filled in place (no float32 copy of a large model)."""
    with torch.device("meta"):
        model = Llama(config).to(dtype)
    model = model.to_empty(device="cpu")  # allocated once, directly in `dtype`
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                parameter.fill_(1.0)
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
        head_dim = config.hidden // config.heads
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        model.inv_freq = 1.0 / (config.rope_theta**exponents)  # rotary frequencies stay float32
    return model.eval()


__all__ = [
    "LLAMA_7B",
    "MODELS",
    "BenchModel",
    "Llama",
    "LlamaConfig",
    "ResNet50",
    "ViT",
    "build_llama",
    "flat_inputs",
    "weight_bytes",
]
