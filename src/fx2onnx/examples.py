"""Built-in example models, used by ``fx2onnx demo``, the tests and the benchmarks."""

from __future__ import annotations

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


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def megabytes(model: torch.nn.Module) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20


__all__ = ["TinyGPT", "TinyResNet", "gpt2_small", "tiny_gpt", "tiny_resnet"]
