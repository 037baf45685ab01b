"""Traceable stand-ins, during capture, for library functions that loop in Python over data-dependent counts.

torchvision's Mask R-CNN and Keypoint R-CNN post-process each detection in a Python loop: ``for m, b in
zip(masks, boxes)`` pastes each mask, ``for i in range(len(rois))`` decodes each keypoint heatmap, and each
iteration resizes to a size read from the box's values (``int(box[2] - box[0] + 1)``,
``int(widths_ceil[i].item())``). No capture strategy can keep such code general: the trip count of a Python loop
must be a Python int, and so must ``int(...)`` and ``len(...)`` (CPython converts their results), so a tracer
either specialises them to the example's values (a graph valid only for images with the same number and sizes
of detections) or stops. torchvision's own ONNX paths for them are TorchScript loops, taken only under
``torch.jit`` tracing.

Within :func:`library_stand_ins` such a function is replaced by one that computes the same result for all
detections at once with tensor ops whose sizes stay symbolic (unbacked); the model's eager behaviour outside
the capture is untouched. Each stand-in replaces a module attribute (the name the caller looks up at call time)
and is installed only when its library is already imported. Those used are recorded for the capture's report.

- ``torchvision.ops.poolers._multiscale_roi_align``: sizes its result by ``len(rois)``, which for the mask and
  keypoint heads' detections is an unbacked count (the size-oblivious strategy would take it at its bound).
- ``torchvision.models.detection.transform.paste_masks_in_image``: each mask resized bilinearly to its box and
  pasted into the image, as a product of per-detection interpolation matrices (rows x mask x columns), zero
  outside the box. The matrices hold torch's own bilinear weights (``align_corners=False``), in its order of
  summation, so the values agree with eager's to float32 rounding.
- ``torchvision.models.detection.roi_heads.heatmaps_to_keypoints``: each heatmap resized bicubically to its
  box's ceiled size, its argmax and value. Computed on a grid as large as the largest box (a box's own size is
  masked out of it), with torch's bicubic weights (A = -0.75, clamped taps) as interpolation matrices; the argmax
  over the masked, row-major grid keeps torch's first-maximum order. Its memory is detections x keypoints x the
  largest box's area, where eager's is one box at a time.
- ``transformers.cache_utils.DynamicSlidingWindowLayer``'s ``update``, ``get_mask_sizes`` and
  ``get_seq_length``: the plain ``DynamicLayer``'s, as transformers' exporter patches them
  (``exporter_dynamo._patch_sliding_window_layer``). The sliding layer counts its tokens in a Python int
  (``cumulative_length``, in the cache's pytree context) and cuts its keys to the window, so a trace builds the
  example's count in: Mistral's step exported after 7 tokens gave other logits after 20 (the same 7 kept keys,
  the same shapes), silently. Traced as a plain layer, the count is the keys' length, a dim of the graph's
  input: the cache input holds the whole history, and the sliding mask (from the positions) applies the window.
  Not a vectorization: recorded as a warning (:data:`SLIDING_WINDOW_CACHE_NOTE`) instead of in the stand-ins.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fx2onnx.errors import CaptureError

__all__ = ["library_stand_ins", "refuse_windowed_caches"]


def _one_hot(source_index: torch.Tensor, size: int) -> torch.Tensor:
    """One-hot rows (..., size) selecting `source_index` (int64)."""
    return (source_index.unsqueeze(-1) == torch.arange(size, device=source_index.device)).to(torch.float32)


def _bilinear_paste_weights(start: torch.Tensor, end: torch.Tensor, mask_size: int, image_size: int) -> torch.Tensor:
    """(K, image_size, mask_size): row y of detection k holds the bilinear weights with which torch's
    ``interpolate(mask, size=end - start + 1, mode="bilinear", align_corners=False)`` computes the resized
    mask's row ``y - start``; rows outside [start, end] are zero (nothing pasted there)."""
    resized = (end - start + 1).clamp(min=1)  # torchvision: max(int(x2 - x1 + 1), 1)
    pixel = torch.arange(image_size, device=start.device)
    offset = pixel.unsqueeze(0) - start.unsqueeze(1)  # (K, image_size): row of the resized mask
    inside = (offset >= 0) & (offset < resized.unsqueeze(1))
    scale = float(mask_size) / resized.to(torch.float32)  # torch: (float)input_size / output_size
    source = scale.unsqueeze(1) * (offset.to(torch.float32) + 0.5) - 0.5
    source = source.clamp(min=0.0)  # linear modes clamp negative source coordinates to 0
    lower = source.floor().clamp(max=mask_size - 1)
    lambda1 = (source - lower).clamp(0.0, 1.0)
    lower_index = lower.to(torch.int64)
    upper_index = (lower_index + 1).clamp(max=mask_size - 1)
    weights = (1.0 - lambda1).unsqueeze(-1) * _one_hot(lower_index, mask_size)
    weights = weights + lambda1.unsqueeze(-1) * _one_hot(upper_index, mask_size)
    return weights * inside.unsqueeze(-1).to(torch.float32)


def _paste_masks_in_image(
    original: Callable[..., torch.Tensor],
    masks: torch.Tensor,
    boxes: torch.Tensor,
    img_shape: tuple[int, int],
    padding: int = 1,
) -> torch.Tensor:
    """torchvision's ``paste_masks_in_image`` for all detections at once (see the module's docstring)."""
    roi_heads = sys.modules[original.__module__]
    masks, scale = roi_heads.expand_masks(masks, padding=padding)
    boxes = roi_heads.expand_boxes(boxes, scale).to(dtype=torch.int64)  # torchvision's own rounding
    image_height, image_width = img_shape
    mask_size = masks.shape[-1]
    rows = _bilinear_paste_weights(boxes[:, 1], boxes[:, 3], mask_size, image_height)
    columns = _bilinear_paste_weights(boxes[:, 0], boxes[:, 2], mask_size, image_width)
    # torch interpolates along the width first, then combines rows: the same order of sums
    along_width = torch.matmul(masks[:, 0].to(torch.float32), columns.transpose(1, 2))
    pasted = torch.matmul(rows, along_width)
    return pasted.to(masks.dtype)[:, None]


def _cubic_weights(fraction: torch.Tensor) -> list[torch.Tensor]:
    """torch's bicubic convolution coefficients (A = -0.75) for the four taps around a source coordinate."""
    a = -0.75

    def near(x: torch.Tensor) -> torch.Tensor:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: torch.Tensor) -> torch.Tensor:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(fraction + 1.0), near(fraction), near(1.0 - fraction), far(2.0 - fraction)]


def _bicubic_weights(resized: torch.Tensor, grid_size: torch.SymInt | int, source_size: int) -> torch.Tensor:
    """(K, grid_size, source_size): row d of detection k holds the bicubic weights of torch's
    ``interpolate(..., size=resized[k], mode="bicubic", align_corners=False)`` for output pixel d; rows at or
    beyond resized[k] are zero."""
    pixel = torch.arange(grid_size, device=resized.device)
    scale = float(source_size) / resized.to(torch.float32)
    source = scale.unsqueeze(1) * (pixel.to(torch.float32) + 0.5).unsqueeze(0) - 0.5  # not clamped for cubic
    lower = source.floor()
    fraction = source - lower
    lower_index = lower.to(torch.int64)
    weights = torch.zeros((), device=resized.device)
    for tap, tap_weight in enumerate(_cubic_weights(fraction)):
        index = (lower_index - 1 + tap).clamp(0, source_size - 1)
        weights = weights + tap_weight.unsqueeze(-1) * _one_hot(index, source_size)
    inside = pixel.unsqueeze(0) < resized.unsqueeze(1)
    return weights * inside.unsqueeze(-1).to(torch.float32)


def _largest(sizes: torch.Tensor) -> torch.SymInt | int:
    """The largest of `sizes` (whole numbers as floats) as a size, at least 1 (also for no detection)."""
    largest = torch.cat([sizes.to(torch.int64), sizes.new_ones((1,), dtype=torch.int64)]).max().item()
    torch._check(largest >= 1)
    return largest


def _heatmaps_to_keypoints(
    original: Callable[..., tuple[torch.Tensor, torch.Tensor]], maps: torch.Tensor, rois: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's ``heatmaps_to_keypoints`` for all detections at once (see the module's docstring)."""
    del original
    offset_x, offset_y = rois[:, 0], rois[:, 1]
    widths = (rois[:, 2] - rois[:, 0]).clamp(min=1)
    heights = (rois[:, 3] - rois[:, 1]).clamp(min=1)
    widths_ceil, heights_ceil = widths.ceil(), heights.ceil()
    count, keypoints, map_height, map_width = maps.shape
    grid_height, grid_width = _largest(heights_ceil), _largest(widths_ceil)
    rows = _bicubic_weights(heights_ceil.to(torch.int64), grid_height, map_height)  # (K, H', H)
    columns = _bicubic_weights(widths_ceil.to(torch.int64), grid_width, map_width)  # (K, W', W)
    # torch sums the width's taps first, then the rows': the same order
    along_width = torch.matmul(maps.to(torch.float32), columns.transpose(1, 2).unsqueeze(1))
    resized = torch.matmul(rows.unsqueeze(1), along_width)  # (K, N, H', W')
    inside_rows = torch.arange(grid_height, device=maps.device) < heights_ceil.unsqueeze(1)
    inside_columns = torch.arange(grid_width, device=maps.device) < widths_ceil.unsqueeze(1)
    inside = (inside_rows.unsqueeze(2) & inside_columns.unsqueeze(1)).unsqueeze(1)  # (K, 1, H', W')
    flat = torch.where(inside, resized, float("-inf")).reshape(count, keypoints, grid_height * grid_width)
    position = flat.argmax(dim=2)  # the first maximum in row-major order, as over the box's own grid
    scores = torch.gather(flat, 2, position.unsqueeze(2)).squeeze(2)
    x_int = position % grid_width
    y_int = torch.div(position - x_int, grid_width, rounding_mode="floor")
    x = (x_int.float() + 0.5) * (widths / widths_ceil).unsqueeze(1) + offset_x.unsqueeze(1)
    y = (y_int.float() + 0.5) * (heights / heights_ceil).unsqueeze(1) + offset_y.unsqueeze(1)
    xy_preds = torch.stack([x, y, torch.ones_like(x)], dim=2)  # (K, N, 3), as torchvision's permuted result
    return xy_preds, scores


def _multiscale_roi_align(
    original: Callable[..., torch.Tensor],
    x_filtered: list[torch.Tensor],
    boxes: list[torch.Tensor],
    output_size: list[int],
    sampling_ratio: int,
    scales: list[float] | None,
    mapper: Callable[[list[torch.Tensor]], torch.Tensor] | None,
) -> torch.Tensor:
    """torchvision's ``_multiscale_roi_align`` with the result sized by the RoIs' symbolic count."""
    if scales is None or mapper is None or len(x_filtered) == 1:  # torchvision's own: no len(rois) there
        return original(x_filtered, boxes, output_size, sampling_ratio, scales, mapper)
    poolers = sys.modules[original.__module__]
    rois = poolers._convert_to_roi_format(boxes)
    levels = mapper(boxes)
    first = x_filtered[0]
    result = first.new_zeros((rois.shape[0], first.shape[1], *output_size))
    for level, (features, scale) in enumerate(zip(x_filtered, scales)):
        in_level = torch.where(levels == level)[0]
        pooled = poolers.roi_align(
            features, rois[in_level], output_size=output_size, spatial_scale=scale, sampling_ratio=sampling_ratio
        )
        result = result.index_put((in_level,), pooled.to(result.dtype))
    return result


# (module, attribute, stand-in taking the original first)
SLIDING_WINDOW_CACHE_NOTE = (
    "transformers' DynamicSlidingWindowLayer (the cache of sliding-window attention layers: Mistral, Gemma 2/3, "
    "Starcoder2...) was traced as the plain DynamicLayer, as transformers' own exporter traces it: it counts its "
    "tokens in a Python int (cumulative_length), which a trace would build into the graph (positions, the "
    "window's offset). In the exported graph these layers' cache inputs hold the whole history (their length is "
    "the number of past tokens; the mask applies the window) and their cache outputs grow by the new tokens, as "
    "optimum's ONNX decoders. Eager's own cache past sliding_window - 1 tokens keeps only the window: it is not a "
    "valid input (with an attention mask over the history, the graph refuses it at run time)"
)


def refuse_windowed_caches(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A sliding-window cache in the example that already dropped keys (more than ``sliding_window - 1`` past
    tokens) cannot be traced as a plain layer: its keys' length is not the history's, so the graph would take the
    wrong positions and mask for every input. Refused, with the example that works."""
    if "transformers" not in sys.modules:
        return
    from transformers.cache_utils import DynamicSlidingWindowLayer

    for name, value in [*((f"args[{i}]", a) for i, a in enumerate(args)), *kwargs.items()]:
        for index, layer in enumerate(getattr(value, "layers", None) or ()):
            if not isinstance(layer, DynamicSlidingWindowLayer) or not layer.is_initialized:
                continue
            kept = layer.keys.shape[-2]
            if isinstance(layer.cumulative_length, int) and layer.cumulative_length > kept:
                raise CaptureError(
                    f"{name}.layers[{index}] is a transformers DynamicSlidingWindowLayer that has seen "
                    f"{layer.cumulative_length} tokens but keeps only the last {kept} (its window): fx2onnx traces "
                    "it as transformers' exporter does, as a plain DynamicLayer whose keys are the whole history, "
                    "so this example would give the wrong positions and mask. Export with a shorter past "
                    f"(at most {kept} tokens, the window minus one) and mark its length dynamic; the exported "
                    "graph then takes the whole history as its cache input"
                )


def _as_full_dynamic_layer(original: Callable[..., Any], layer: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' ``DynamicSlidingWindowLayer`` method traced as the plain ``DynamicLayer``'s (see the module's
    docstring): the layer keeps every key, and its length, a dim of the graph's input, is the history's."""
    from transformers.cache_utils import DynamicLayer

    return getattr(DynamicLayer, original.__name__)(layer, *args, **kwargs)


_STAND_INS: tuple[tuple[str, str, Callable[..., Any]], ...] = (
    ("torchvision.ops.poolers", "_multiscale_roi_align", _multiscale_roi_align),
    ("torchvision.models.detection.roi_heads", "paste_masks_in_image", _paste_masks_in_image),
    ("torchvision.models.detection.transform", "paste_masks_in_image", _paste_masks_in_image),  # imported there
    ("torchvision.models.detection.roi_heads", "heatmaps_to_keypoints", _heatmaps_to_keypoints),
    *(
        ("transformers.cache_utils", f"DynamicSlidingWindowLayer.{method}", _as_full_dynamic_layer)
        for method in ("update", "get_mask_sizes", "get_seq_length")
    ),
)


@contextlib.contextmanager
def library_stand_ins(used: list[str]) -> Iterator[None]:
    """Install the stand-ins of the libraries already imported; `used` receives the name of each one called."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for module_name, attribute, stand_in in _STAND_INS:
            if module_name.split(".")[0] not in sys.modules:
                continue  # the model cannot be using it
            owner: Any = importlib.import_module(module_name)
            *owners, name = attribute.split(".")  # a class's method: "Class.method"
            for part in owners:
                owner = getattr(owner, part, None)
            original = vars(owner).get(name) if owner is not None else None
            if original is None:
                continue
            saved.append((owner, name, original))
            setattr(owner, name, _recording(stand_in, original, f"{module_name}.{attribute}", used))
        yield
        sliding = [name for name in used if name.startswith("transformers.cache_utils.DynamicSlidingWindowLayer.")]
        if sliding:  # not a vectorized stand-in: the graph's cache contract changes, which the user must know
            used[:] = [name for name in used if name not in sliding]
            warnings.warn(SLIDING_WINDOW_CACHE_NOTE, stacklevel=5)
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _recording(
    stand_in: Callable[..., Any], original: Callable[..., Any], name: str, used: list[str]
) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if name not in used:
            used.append(name)
        return stand_in(original, *args, **kwargs)

    call.__wrapped__ = original  # type: ignore[attr-defined]
    return call
