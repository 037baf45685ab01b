"""Object detection: torchvision's operators (``torchvision::nms``, ``roi_align``, ``roi_pool``).

torchvision defines them in its compiled extension; torch.export keeps each as one node (their fake kernels
give ``nms`` an output of data-dependent length), lowered here to the ONNX operators made for them.
"""

from __future__ import annotations

import operator
from typing import TypeVar

from onnxscript import DOUBLE, FLOAT, INT32, INT64
from onnxscript import opset18 as op

from fx2onnx._emit.context import LoweringContext
from fx2onnx._lowerings.rules import lowering

TRoi = TypeVar("TRoi", FLOAT, DOUBLE)


@lowering("torchvision::nms")
def nms(dets: FLOAT, scores: FLOAT, iou_threshold: float) -> INT64:
    """ONNX NonMaxSuppression on one batch and one class, then its box indices.

    Both keep boxes greedily in decreasing score, dropping those whose IoU with a kept box is *above* the
    threshold, and return them in the order kept; equal scores go by increasing index in both (torchvision's
    stable sort; ONNX Runtime's queue orders ties by index), and a box of zero area suppresses nothing in both.
    Boxes are given as corners (x1, y1, x2, y2): NonMaxSuppression's corner mode takes either diagonal and
    either axis order. At most all boxes are kept (the count is the boxes' own).
    """
    boxes = op.Unsqueeze(dets, op.Constant(value_ints=[0]))  # (1, N, 4)
    batch_scores = op.Unsqueeze(scores, op.Constant(value_ints=[0, 1]))  # (1, 1, N)
    count = op.Shape(dets, start=0, end=1)
    selected = op.NonMaxSuppression(
        op.Cast(boxes, to=FLOAT.dtype),
        op.Cast(batch_scores, to=FLOAT.dtype),
        count,
        op.Constant(value_floats=[iou_threshold]),
        center_point_box=0,
    )
    return op.Reshape(op.Slice(selected, [2], [3], [1]), [-1])


def _roi_align(
    input: TRoi,
    rois: TRoi,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> TRoi:
    batch_indices = op.Cast(op.Reshape(op.Slice(rois, [0], [1], [1]), [-1]), to=INT64.dtype)
    boxes = op.Slice(rois, [1], [5], [1])
    return op.RoiAlign(
        input,
        boxes,
        batch_indices,
        coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel",
        mode="avg",
        output_height=pooled_height,
        output_width=pooled_width,
        sampling_ratio=max(sampling_ratio, 0),
        spatial_scale=spatial_scale,
    )


@lowering("torchvision::roi_align")
def roi_align(
    input: TRoi,
    rois: TRoi,
    spatial_scale: float,
    pooled_height: int,
    pooled_width: int,
    sampling_ratio: int,
    aligned: bool,
) -> TRoi:
    """ONNX RoiAlign (opset 16's coordinate modes), rois (K, 5) split into batch indices and corners.

    ``aligned=True`` shifts the box by half a pixel (``half_pixel``); ``aligned=False`` does not and, as
    torchvision, takes a box at least 1 pixel wide and high (``output_half_pixel``). A sampling ratio <= 0 is
    torchvision's adaptive grid (ceil(box size / output size) samples), ONNX's 0.
    """
    return _roi_align(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned)


@lowering("torchvision::roi_pool", context=True)
def roi_pool(
    ctx: LoweringContext, input: FLOAT, rois: FLOAT, spatial_scale: float, pooled_height: int, pooled_width: int
) -> tuple[FLOAT, INT32]:
    """ONNX MaxRoiPool: Caffe's max RoI pooling, as torchvision's (box corners rounded half away from zero, a
    box at least 1 pixel wide, bins floor/ceil-divided, an empty bin 0). Its second output, the argmax that
    only the backward pass reads, has no ONNX counterpart: a graph that uses it is refused."""
    argmax_used = any(user.target is operator.getitem and user.args[1] == 1 and user.users for user in ctx.node.users)
    if argmax_used:
        raise NotImplementedError("torchvision::roi_pool's argmax output has no ONNX equivalent (MaxRoiPool)")
    pooled = op.MaxRoiPool(input, rois, pooled_shape=[pooled_height, pooled_width], spatial_scale=spatial_scale)
    unused_argmax = op.Cast(op.Shape(pooled), to=INT32.dtype)  # dropped: nothing reads it
    return pooled, unused_argmax
