"""Makes PyPI's torchvision importable beside the CPU build of torch, for the detection tests.

PyPI's torchvision wheel ships its operators (``torchvision::nms``, ``roi_align``, ...) in a compiled ``_C``
extension linked against the CUDA build of torch; beside torch's CPU wheel it fails to load, and
``import torchvision`` then stops with "operator torchvision::nms does not exist". :func:`import_torchvision`
defines, before the import, the operators that torchvision's detection models call, with CPU kernels written
in PyTorch, and after it registers torchvision's own fake (meta) kernels for them, so that ``torch.export``
captures each as one ``torchvision::`` node, as with a working torchvision. Where torchvision's extension does
load, it changes nothing.

The kernels follow torchvision's C++ CPU kernels: ``nms`` keeps boxes greedily in decreasing score (a stable
sort, so that equal scores keep their index order) and drops those whose IoU with a kept box is above the
threshold; ``roi_align`` is torchvision's own pure-PyTorch version (``torchvision.ops.roi_align._roi_align``,
transcribed from its CUDA kernel); ``roi_pool`` is Caffe's max RoI pooling, as torchvision's kernel.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    # No kernel: defined only because torchvision registers a fake kernel for it on import.
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align": (
        "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
        "int sampling_ratio, bool aligned) -> Tensor"
    ),
    "roi_pool": (
        "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
        "-> (Tensor, Tensor)"
    ),
}

# Kept alive for the process: a torch.library.Library drops its definitions when collected.
_LIBRARIES: list[torch.library.Library] = []


def _nms_kernel(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    order = torch.sort(scores, descending=True, stable=True).indices
    boxes = dets[order]
    x1, y1, x2, y2 = boxes.unbind(1)
    areas = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    keep: list[int] = []
    for position in range(len(order)):
        if suppressed[position]:
            continue
        keep.append(position)
        width = (torch.minimum(x2[position], x2) - torch.maximum(x1[position], x1)).clamp(min=0)
        height = (torch.minimum(y2[position], y2) - torch.maximum(y1[position], y1)).clamp(min=0)
        intersection = width * height
        iou = intersection / (areas[position] + areas - intersection)
        later = torch.arange(len(order)) > position
        suppressed |= later & (iou > iou_threshold)
    return order[torch.tensor(keep, dtype=torch.long)]


def _roi_pool_kernel(
    input: torch.Tensor, rois: torch.Tensor, spatial_scale: float, pooled_height: int, pooled_width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    channels, height, width = input.shape[1:]
    output = input.new_zeros((rois.shape[0], channels, pooled_height, pooled_width))
    argmax = torch.full(output.shape, -1, dtype=torch.int32)

    def half_away_from_zero(value: float) -> int:  # C++ std::round
        return int(math.copysign(math.floor(abs(value) + 0.5), value))

    for index, (batch, x1, y1, x2, y2) in enumerate(rois.tolist()):
        start_w, start_h = half_away_from_zero(x1 * spatial_scale), half_away_from_zero(y1 * spatial_scale)
        end_w, end_h = half_away_from_zero(x2 * spatial_scale), half_away_from_zero(y2 * spatial_scale)
        bin_h = max(end_h - start_h + 1, 1) / pooled_height
        bin_w = max(end_w - start_w + 1, 1) / pooled_width
        for ph in range(pooled_height):
            h0 = min(max(math.floor(ph * bin_h) + start_h, 0), height)
            h1 = min(max(math.ceil((ph + 1) * bin_h) + start_h, 0), height)
            for pw in range(pooled_width):
                w0 = min(max(math.floor(pw * bin_w) + start_w, 0), width)
                w1 = min(max(math.ceil((pw + 1) * bin_w) + start_w, 0), width)
                if h1 <= h0 or w1 <= w0:
                    continue
                window = input[int(batch), :, h0:h1, w0:w1].reshape(channels, -1)
                values, positions = window.max(dim=1)
                output[index, :, ph, pw] = values
                argmax[index, :, ph, pw] = ((positions // (w1 - w0) + h0) * width + positions % (w1 - w0) + w0).int()
    return output, argmax


def _extension_loaded() -> bool:
    try:
        torch.ops.torchvision.nms.default  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


def _put_on_path() -> None:
    """The folder `make test` installs torchvision into (``FX2ONNX_TORCHVISION_DIR`` names another) on sys.path."""
    folder = Path(os.environ.get("FX2ONNX_TORCHVISION_DIR", Path(sys.prefix) / "torchvision-cpu"))
    if folder.is_dir() and str(folder) not in sys.path:
        sys.path.append(str(folder))


def import_torchvision() -> ModuleType:
    """Imports torchvision, first defining the operators its unloadable ``_C`` extension would have."""
    _put_on_path()
    if "torchvision" in sys.modules or _extension_loaded():
        return importlib.import_module("torchvision")
    library = torch.library.Library("torchvision", "DEF")
    _LIBRARIES.append(library)
    for schema in _SCHEMAS.values():
        library.define(schema)
    library.impl("nms", _nms_kernel, "CPU")
    library.impl("roi_pool", _roi_pool_kernel, "CPU")
    torchvision = importlib.import_module("torchvision")  # registers the fake kernel of nms itself
    from torchvision import _meta_registrations, extension

    roi_align_module = importlib.import_module("torchvision.ops.roi_align")  # the package's name is the function
    roi_align_reference = roi_align_module._roi_align.__wrapped__  # without lazy_compile's torch.compile
    library.impl("roi_align", roi_align_reference, "CPU")
    # torchvision registered its other fake kernels only where its extension loaded: register them now.
    torch.library.register_fake("torchvision::roi_align", _meta_registrations.meta_roi_align, lib=library)
    torch.library.register_fake("torchvision::roi_pool", _meta_registrations.meta_roi_pool, lib=library)
    # torchvision.ops call the operators only where the extension says it loaded.
    extension._has_ops = lambda: True
    roi_align_module._has_ops = lambda: True
    return torchvision
