"""diffusers' Stable Diffusion UNet and VAE decoder, tiny and random, exported as pipelines feed them and compared
with eager in ONNX Runtime (float32 and float16).

diffusers comes from ``make test`` (Makefile: ``.venv/diffusers``, PyPI's wheel and the few of its dependencies the
venv lacks, without theirs; ``FX2ONNX_DIFFUSERS_DIR`` names another folder). benchmarks/zoo.py's diffusers group
has more of them (SDXL's UNet, VAE encoder, DiT, SD3's transformer, ControlNet) and more variants.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import assert_exports_and_matches as check

_FOLDER = Path(os.environ.get("FX2ONNX_DIFFUSERS_DIR", Path(sys.prefix) / "diffusers"))
if _FOLDER.is_dir() and str(_FOLDER) not in sys.path:
    sys.path.append(str(_FOLDER))
try:
    import diffusers
except ImportError as error:  # `make test` installs it: only a hand-made environment lacks it
    if os.environ.get("CI"):
        raise
    pytest.skip(f"diffusers is not installed ({error}); `make test` installs it", allow_module_level=True)

diffusers.utils.logging.set_verbosity_error()


def _unet(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    return unet.to(dtype).eval()


def _unet_inputs(batch: int, side: int, dtype: torch.dtype, timestep: torch.Tensor) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(batch * side)
    return {
        "sample": torch.randn(batch, 4, side, side, generator=generator).to(dtype),
        "timestep": timestep,
        "encoder_hidden_states": torch.randn(batch, 5, 16, generator=generator).to(dtype),
    }


def test_unet_step() -> None:
    """One denoising step as ONNX Runtime pipelines run it: an int64 timestep per row, dynamic batch and latent
    size (even: the down block halves it, the up block concatenates it again), run at a second shape."""
    batch, side = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("half_side", min=2, max=32)
    dynamic = {
        "sample": {0: batch, 2: 2 * side, 3: 2 * side},
        "timestep": {0: batch},
        "encoder_hidden_states": {0: batch},
    }
    example = _unet_inputs(2, 8, torch.float32, torch.tensor([999, 500]))
    other = _unet_inputs(3, 12, torch.float32, torch.tensor([1, 20, 300]))
    check(_unet(torch.float32), (), example, run_with=[((), example), ((), other)], dynamic_shapes=dynamic)


def test_unet_float16_float_timestep() -> None:
    """A float16 UNet called as a float16 pipeline with an Euler scheduler calls it: one 0-d float32 timestep."""
    check(_unet(torch.float16), (), _unet_inputs(2, 8, torch.float16, torch.tensor(957.25)))


class VaeDecoder(torch.nn.Module):
    """AutoencoderKL's decode: latents to an image, as optimum's vae_decoder exports it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.vae = diffusers.AutoencoderKL(
            block_out_channels=(16, 32),
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            latent_channels=4,
            norm_num_groups=8,
            layers_per_block=1,
        )

    def forward(self, latent_sample: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latent_sample).sample


def test_vae_decoder() -> None:
    """Dynamic batch and latent size, run at a second shape."""
    generator = torch.Generator().manual_seed(0)
    latents, other = (torch.randn(b, 4, s, s, generator=generator) for b, s in ((2, 8), (1, 6)))
    dims = {0: torch.export.Dim("batch", max=8), 2: torch.export.Dim("height"), 3: torch.export.Dim("width")}
    check(VaeDecoder().eval(), (latents,), run_with=[((latents,), {}), ((other,), {})], dynamic_shapes=(dims,))


def test_vae_decoder_float16() -> None:
    latents = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0)).half()
    check(VaeDecoder().half(), (latents,))
