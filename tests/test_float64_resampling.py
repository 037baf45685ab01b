"""float64 interpolate and grid_sample in float64: eager's taps and weights, gathered and summed in float64.

ONNX Runtime's CPU provider runs Resize and GridSample in float32 only, so the legalizer narrowed float64 to
float32 (results 1e-7 off eager, relatively). The inputs here make float32 miss by far more than the tolerance:
values around 1e6 with fractional parts, grids at fine coordinates, odd sizes and scales.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx_ir as ir
import pytest
import torch
import torch.nn.functional as F

from conftest import Call, assert_exports_and_matches

RTOL, ATOL = 1e-12, 1e-8  # inputs up to ~1e6: atol is 1e-14 of their magnitude; float32 misses by ~1e-1


def large(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return 1e6 * torch.rand(shape, generator=generator, dtype=torch.float64) + torch.randn(
        shape, generator=generator, dtype=torch.float64
    )


def fine_grid(*shape: int, seed: int = 1) -> torch.Tensor:
    """Coordinates partly outside [-1, 1], at fractions float32 cannot hold."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=generator, dtype=torch.float64) * 2.6 - 1.3 + 1e-9


def check(function: Callable[..., Any], *args: torch.Tensor, **options: Any) -> None:
    program = assert_exports_and_matches(Call(function), args, rtol=RTOL, atol=ATOL, **options)
    narrowed = [node.op_type for node in program.model.graph if node.op_type in ("Resize", "GridSample")]
    assert narrowed == [], f"float64 went through ONNX Runtime's float32 {narrowed}"
    assert all(v.dtype != ir.DataType.FLOAT for node in program.model.graph for v in node.outputs)


INTERPOLATIONS = {
    "linear-size": (lambda x: F.interpolate(x, size=13, mode="linear"), (2, 3, 7)),
    "linear-scale-corners": (
        lambda x: F.interpolate(x, scale_factor=1.7, mode="linear", align_corners=True),
        (1, 2, 9),
    ),
    "linear-down": (lambda x: F.interpolate(x, size=4, mode="linear"), (1, 2, 11)),
    "bilinear-size": (lambda x: F.interpolate(x, size=(5, 13), mode="bilinear"), (2, 3, 7, 9)),
    "bilinear-scale": (lambda x: F.interpolate(x, scale_factor=(1.3, 0.6), mode="bilinear"), (1, 2, 7, 9)),
    "bilinear-corners": (lambda x: F.interpolate(x, size=(11, 4), mode="bilinear", align_corners=True), (1, 2, 7, 9)),
    "bicubic-size": (lambda x: F.interpolate(x, size=(11, 6), mode="bicubic"), (2, 3, 7, 9)),
    "bicubic-scale": (lambda x: F.interpolate(x, scale_factor=2.5, mode="bicubic"), (1, 2, 4, 5)),
    "bicubic-corners": (lambda x: F.interpolate(x, size=(3, 17), mode="bicubic", align_corners=True), (1, 2, 7, 9)),
    "trilinear-size": (lambda x: F.interpolate(x, size=(3, 7, 8), mode="trilinear"), (1, 2, 4, 5, 6)),
    "trilinear-corners": (
        lambda x: F.interpolate(x, scale_factor=(1.5, 0.5, 2.0), mode="trilinear", align_corners=True),
        (1, 2, 4, 5, 6),
    ),
    "bilinear-antialias-down": (lambda x: F.interpolate(x, size=(3, 4), mode="bilinear", antialias=True), (2, 3, 8, 9)),
    "bilinear-antialias-scale": (
        lambda x: F.interpolate(x, scale_factor=0.3, mode="bilinear", antialias=True),
        (1, 2, 17, 13),
    ),
    "bilinear-antialias-up": (lambda x: F.interpolate(x, size=(11, 5), mode="bilinear", antialias=True), (1, 2, 7, 4)),
    "bicubic-antialias-down": (lambda x: F.interpolate(x, size=(3, 4), mode="bicubic", antialias=True), (2, 3, 8, 9)),
    "bicubic-antialias-corners": (
        lambda x: F.interpolate(x, size=(10, 3), mode="bicubic", antialias=True, align_corners=True),
        (1, 2, 7, 9),
    ),
    "bilinear-aa-op": (lambda x: torch.ops.aten._upsample_bilinear2d_aa(x, [3, 5], False), (1, 2, 7, 8)),
    "bicubic-aa-op": (lambda x: torch.ops.aten._upsample_bicubic2d_aa(x, [5, 3], True), (1, 2, 7, 8)),
    "bilinear-op": (lambda x: torch.ops.aten.upsample_bilinear2d(x, [5, 12], False, 0.7, 1.5), (1, 2, 7, 8)),
}


@pytest.mark.parametrize("name", sorted(INTERPOLATIONS))
def test_interpolate_in_float64(name: str) -> None:
    function, shape = INTERPOLATIONS[name]
    check(function, large(*shape))


def test_interpolate_with_a_dynamic_batch() -> None:
    x = large(3, 2, 7, 9)
    check(
        lambda t: F.interpolate(t, size=(5, 12), mode="bicubic"),
        x,
        dynamic_shapes=(({0: torch.export.Dim("batch")},),),
    )


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d_in_float64(mode: str, padding_mode: str, align_corners: bool) -> None:
    check(
        lambda x, g: F.grid_sample(x, g, mode, padding_mode, align_corners),
        large(2, 3, 5, 7),
        fine_grid(2, 4, 6, 2),
    )


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d_in_float64(mode: str, padding_mode: str) -> None:
    check(
        lambda x, g: F.grid_sample(x, g, mode, padding_mode, align_corners=mode == "nearest"),
        large(1, 2, 4, 5, 6),
        fine_grid(1, 3, 2, 4, 3),
    )


# uint8 antialiased and bicubic resizes: eager's fixed-point arithmetic, bit for bit (before: float arithmetic
# rounded once or twice, 1 to 2 off in a part of the pixels).
UINT8_RESIZES = {
    "bilinear-down": (lambda x: F.interpolate(x, size=(5, 4), mode="bilinear", antialias=True), (1, 3, 13, 11)),
    "bilinear-up-corners": (
        lambda x: F.interpolate(x, size=(9, 17), mode="bilinear", antialias=True, align_corners=True),
        (2, 5, 6, 7),
    ),
    "bicubic-down": (lambda x: F.interpolate(x, size=(4, 6), mode="bicubic", antialias=True), (1, 3, 13, 11)),
    "bicubic-mixed-corners": (
        lambda x: F.interpolate(x, size=(3, 19), mode="bicubic", antialias=True, align_corners=True),
        (1, 5, 10, 8),
    ),
    "bicubic-scale": (
        lambda x: F.interpolate(x, scale_factor=0.45, mode="bicubic", antialias=True),
        (1, 4, 16, 12),
    ),
    "bilinear-aa-op": (lambda x: torch.ops.aten._upsample_bilinear2d_aa(x, [3, 7], False), (1, 3, 8, 9)),
    "bicubic-plain-up": (lambda x: F.interpolate(x, size=(14, 9), mode="bicubic"), (1, 3, 3, 9)),
    "bicubic-plain-down-corners": (
        lambda x: F.interpolate(x, size=(4, 6), mode="bicubic", align_corners=True),
        (1, 5, 12, 11),
    ),
    "bicubic-plain-scale": (lambda x: F.interpolate(x, scale_factor=(1.6, 0.7), mode="bicubic"), (2, 3, 5, 13)),
}


@pytest.mark.parametrize("name", sorted(UINT8_RESIZES))
def test_uint8_resize_is_eagers(name: str) -> None:
    function, shape = UINT8_RESIZES[name]
    image = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    image.view(-1)[:7] = torch.tensor([0, 255, 0, 255, 255, 0, 0], dtype=torch.uint8)  # overshoots to saturate
    assert_exports_and_matches(Call(function), (image,))
