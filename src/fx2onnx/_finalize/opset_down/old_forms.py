"""Adapters to an op's older form: inputs back to attributes (Reduce* axes, Split sizes, Pad/Resize axes, and below
13 Squeeze's, Unsqueeze's, ReduceSum's axes and Split's sizes), new attributes dropped where they hold their old
meaning, Shape's start/end as Slice, CastLike as Cast, Constant's number attributes as its tensor."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from fx2onnx._finalize.opset_down.rewriting import (
    Adapter,
    OpsetRefused,
    constant_ints,
    int64s,
    known_dtype,
    replace,
    typed,
)


def reduce_axes_as_attribute(node: ir.Node, opset: int) -> None:
    """Reduce*-18's axes input (ReduceSum's since 13) as the attribute older versions take."""
    noop = node.attributes.get("noop_with_empty_axes")
    noop_value = noop.as_int() if noop is not None else 0
    axes_input = node.inputs[1] if len(node.inputs) > 1 else None
    axes = constant_ints(axes_input) if axes_input is not None else []
    if axes is None:
        raise OpsetRefused(f"{node.op_type}'s axes are computed at run time; before opset 18 they are an attribute")
    if not axes and noop_value:
        raise OpsetRefused(f"{node.op_type} with noop_with_empty_axes=1 and no axes has no form before opset 18")
    node.attributes.pop("noop_with_empty_axes", None)
    node.resize_inputs(1)
    if axes:
        node.attributes["axes"] = ir.AttrInt64s("axes", axes)


def reduce_sum_11(node: ir.Node, opset: int) -> None:
    """ReduceSum-13's axes input as the attribute ReduceSum-11 takes."""
    if opset < 13:
        reduce_axes_as_attribute(node, opset)


def axes_as_attribute(node: ir.Node, opset: int) -> None:
    """Squeeze-13's and Unsqueeze-13's axes input as the attribute their version 11 takes (a constant only)."""
    if opset >= 13 or len(node.inputs) < 2:
        return
    axes = constant_ints(node.inputs[1])
    if axes is None:
        raise OpsetRefused(f"{node.op_type}'s axes are computed at run time; before opset 13 they are an attribute")
    node.resize_inputs(1)
    node.attributes["axes"] = ir.AttrInt64s("axes", axes)


def split_11(node: ir.Node, opset: int) -> None:
    """Split-18 as Split-13 (sizes as an input), then below 13 its sizes as the attribute Split-11 takes."""
    split_sizes_as_input(node, opset)
    if opset >= 13 or len(node.inputs) < 2:
        return
    sizes = constant_ints(node.inputs[1])
    if sizes is None:
        raise OpsetRefused("Split's sizes are computed at run time; before opset 13 they are an attribute")
    node.resize_inputs(1)
    node.attributes["split"] = ir.AttrInt64s("split", sizes)


def split_sizes_as_input(node: ir.Node, opset: int) -> None:
    """Split-18's num_outputs as the sizes input Split-13 takes (ceil-sized parts, the last smaller)."""
    count_attribute = node.attributes.pop("num_outputs", None)
    if count_attribute is None:
        return
    count = count_attribute.as_int()
    axis_attribute = node.attributes.get("axis")
    axis = axis_attribute.as_int() if axis_attribute is not None else 0
    data = node.inputs[0]
    assert data is not None
    shape = data.shape
    if shape is None:
        raise OpsetRefused("Split by num_outputs of an input of unknown rank")
    size = shape[axis]
    if not isinstance(size, int):
        raise OpsetRefused(f"Split by num_outputs along a dimension not known at export ({size})")
    part = -(-size // count)
    sizes = [part] * (count - 1) + [size - part * (count - 1)]
    constant = int64s(sizes, f"{node.name or 'split'}_sizes")
    node.graph.insert_before(node, constant)
    node.resize_inputs(2)
    node.replace_input_with(1, constant.outputs[0])


def pad_without_axes(node: ir.Node, opset: int) -> None:
    """Pad-18's axes input spread into pads over every dimension, as Pad-13 takes them."""
    if len(node.inputs) < 4 or node.inputs[3] is None:
        return
    axes = constant_ints(node.inputs[3])
    pads = constant_ints(node.inputs[1])
    shape = node.inputs[0].shape if node.inputs[0] is not None else None
    if axes is None or pads is None or shape is None:
        raise OpsetRefused("Pad over some axes, with axes, pads or the rank known only at run time")
    rank = len(shape)
    full = [0] * (2 * rank)
    for i, axis in enumerate(axes):
        full[axis % rank] = pads[i]
        full[axis % rank + rank] = pads[i + len(axes)]
    constant = int64s(full, f"{node.name or 'pad'}_pads")
    node.graph.insert_before(node, constant)
    node.replace_input_with(1, constant.outputs[0])
    node.resize_inputs(3)


def defaults_dropped(defaults: dict[str, object], *, new_in: int) -> Adapter:
    """An adapter dropping attributes added in opset `new_in` that hold the value the older op means."""

    def adapt(node: ir.Node, opset: int) -> None:
        if opset >= new_in:
            return
        for name, default in defaults.items():
            attribute = node.attributes.get(name)
            if attribute is None:
                continue
            if attribute.value != default:
                raise OpsetRefused(f"{node.op_type} with {name}={attribute.value!r} needs opset {new_in}")
            del node.attributes[name]

    return adapt


def resize_13(node: ir.Node, opset: int) -> None:
    """Resize-18's new attributes at the values Resize-13 means; its axes spread over every dimension (the other
    dimensions keep scale 1, or their input size)."""
    defaults_dropped({"antialias": 0, "keep_aspect_ratio_policy": "stretch"}, new_in=18)(node, opset)
    axes_attribute = node.attributes.pop("axes", None)
    if axes_attribute is None:
        return
    x = node.inputs[0]
    if x is None or x.shape is None:
        raise OpsetRefused("Resize over some axes of an input of unknown rank")
    rank = len(x.shape)
    axes = [axis % rank for axis in axes_attribute.as_ints()]
    roi = node.inputs[1] if len(node.inputs) > 1 else None
    if roi is not None and constant_ints(roi) != []:
        raise OpsetRefused("Resize over some axes with a region of interest needs opset 18")
    tape = ir.tape.Tape()
    positions = tape.op("Constant", [], {"value": ir.tensor(np.asarray(axes, dtype=np.int64))})
    spread: dict[int, ir.Value] = {}
    for index in (2, 3):
        given = node.inputs[index] if len(node.inputs) > index else None
        if given is None or given.shape == ir.Shape([0]):
            continue
        if index == 2:
            whole = tape.op("Constant", [], {"value": ir.tensor(np.ones(rank, dtype=np.float32))})
        else:
            whole = tape.op("Shape", [x])
        spread[index] = tape.op("ScatterElements", [whole, positions, given], {"axis": 0})
    typed(tape.nodes)
    node.graph.insert_before(node, list(tape.nodes))
    for index, full in spread.items():
        node.replace_input_with(index, full)


def resize_11(node: ir.Node, opset: int) -> None:
    """Resize-18 as Resize-13, then below 13 its roi and scales given as empty tensors where left out (Resize-11
    requires both inputs; an empty one means none)."""
    resize_13(node, opset)
    if opset >= 13:
        return
    sizes = node.inputs[3] if len(node.inputs) > 3 else None
    missing = [index for index in (1, 2) if node.inputs[index] is None] if len(node.inputs) > 2 else [1, 2]
    if not missing:
        return
    if sizes is None and 2 in missing:
        raise OpsetRefused("Resize with neither scales nor sizes")
    node.resize_inputs(max(len(node.inputs), 3))
    for index in missing:
        empty = ir.node("Constant", [], {"value": ir.tensor(np.zeros(0, dtype=np.float32), name=f"resize_{index}")})
        empty.outputs[0].dtype, empty.outputs[0].shape = ir.DataType.FLOAT, ir.Shape([0])
        node.graph.insert_before(node, empty)
        node.replace_input_with(index, empty.outputs[0])


def constant_11(node: ir.Node, opset: int) -> None:
    """Constant-12's value_int(s), value_float(s) and value_string(s) as the tensor Constant-11 holds."""
    if opset >= 12:
        return
    for name, dtype in _CONSTANT_ATTRIBUTES.items():
        _constant_as_tensor(node, name, dtype)


_CONSTANT_ATTRIBUTES: dict[str, type] = {
    "value_int": np.int64,
    "value_ints": np.int64,
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_string": np.object_,
    "value_strings": np.object_,
}


def _constant_as_tensor(node: ir.Node, name: str, dtype: type) -> None:
    attribute = node.attributes.pop(name, None)
    if attribute is None:
        return
    if attribute.is_ref():
        raise OpsetRefused(f"Constant's {name} referring to a function attribute needs opset 12")
    value = attribute.value
    array = np.asarray(list(value) if isinstance(value, (list, tuple)) else value, dtype=dtype)
    tensor = ir.StringTensor(array) if dtype is np.object_ else ir.tensor(array)
    node.attributes["value"] = ir.AttrTensor("value", tensor)


def shape_sliced(node: ir.Node, opset: int) -> None:
    """Shape-15's start and end as Shape then Slice."""
    start = node.attributes.pop("start", None)
    end = node.attributes.pop("end", None)
    if start is None and end is None:
        return
    whole = ir.node("Shape", [node.inputs[0]])
    rank = len(node.inputs[0].shape) if node.inputs[0] is not None and node.inputs[0].shape is not None else None
    whole.outputs[0].dtype = ir.DataType.INT64
    if rank is not None:
        whole.outputs[0].shape = ir.Shape([rank])
    starts = int64s([start.as_int() if start is not None else 0], "shape_start")
    ends = int64s([end.as_int() if end is not None else 2**62], "shape_end")
    sliced = ir.node("Slice", [whole.outputs[0], starts.outputs[0], ends.outputs[0]])
    replace(node, [whole, starts, ends, sliced], sliced.outputs)


def cast_like_as_cast(node: ir.Node, opset: int) -> None:
    dtype = known_dtype(node.inputs[1])
    if dtype is None:
        raise OpsetRefused("CastLike to a type not known at export")
    cast = ir.node("Cast", [node.inputs[0]], {"to": ir.AttrInt64("to", dtype.value)})
    replace(node, [cast], cast.outputs)


def roi_align_mode(node: ir.Node, opset: int) -> None:
    """RoiAlign-10 always shifts by half a pixel the other way; only that mode (spelt out at 16) carries over."""
    attribute = node.attributes.get("coordinate_transformation_mode")
    if attribute is None or attribute.as_string() != "output_half_pixel":
        raise OpsetRefused("RoiAlign with half_pixel coordinates needs opset 16 (RoiAlign-10 means output_half_pixel)")
    del node.attributes["coordinate_transformation_mode"]


def reshape_13(node: ir.Node, opset: int) -> None:
    """Reshape-14's allowzero=1 (torchlib's flatten, view) dropped: it differs from Reshape-13 only where the shape
    holds a 0 and the input's dim at that position is not 0. A constant shape with a 0 is refused; a computed one
    holds a 0 only from an empty dimension of the model's, which ONNX Runtime's Reshape-13 copies as every exporter
    targeting opset 13 has it (torch.onnx's TorchScript exporter included)."""
    allowzero = node.attributes.pop("allowzero", None)
    if allowzero is None or allowzero.as_int() == 0:
        return
    shape = constant_ints(node.inputs[1])
    if shape is not None and 0 in shape:
        raise OpsetRefused("Reshape to a constant shape holding 0 with allowzero=1 needs opset 14")


def batch_norm_inference(node: ir.Node, opset: int) -> None:
    if len(node.outputs) > 1 and any(output.uses() for output in node.outputs[1:]):
        raise OpsetRefused("BatchNormalization's running statistics outputs changed meaning at opset 14")
    defaults_dropped({"training_mode": 0}, new_in=14)(node, opset)


def lp_pool_13(node: ir.Node, opset: int) -> None:
    dilations = node.attributes.get("dilations")
    if dilations is not None and any(d != 1 for d in dilations.as_ints()):
        raise OpsetRefused("LpPool with dilations needs opset 18")
    node.attributes.pop("dilations", None)
    defaults_dropped({"ceil_mode": 0}, new_in=18)(node, opset)


# Reduce*-18 (all but ReduceSum, whose axes became an input at 13)
REDUCTIONS = (
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
)
