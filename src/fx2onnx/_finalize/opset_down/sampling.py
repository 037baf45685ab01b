"""Sampling ops before their opsets: 4-D GridSample before 16 as gathers (as torch's CPU kernel computes it), Col2Im
(F.fold) before 18 as padded sums of blocks."""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir

from fx2onnx._finalize.opset_down.rewriting import OpsetRefused, constant_ints, replace


def grid_sample_spelt_out(node: ir.Node, opset: int) -> None:
    """GridSample-16 (4-D) as gathers from the flattened image, computed as torch's CPU kernel computes it: the grid
    unnormalized per align_corners, clipped to the image (a NaN to 0) or reflected then clipped for border and
    reflection padding (bicubic pads each of its 16 taps, not the location); the corners' weights from the floor's
    distances, a corner outside the image read as 0 under zeros padding (its weight still multiplies it: NaN weights
    stay NaN); nearest rounds half to even."""
    x, grid = node.inputs[0], node.inputs[1]
    assert x is not None and grid is not None
    mode = node.attributes["mode"].as_string() if "mode" in node.attributes else "bilinear"
    padding = node.attributes["padding_mode"].as_string() if "padding_mode" in node.attributes else "zeros"
    align = bool(node.attributes["align_corners"].as_int()) if "align_corners" in node.attributes else False
    if mode not in ("bilinear", "nearest", "bicubic"):
        raise OpsetRefused(f"GridSample with mode={mode!r} needs opset 16")
    if x.shape is None or grid.dtype is None or x.dtype is None:
        raise OpsetRefused("GridSample of an input of unknown rank or type needs opset 16")
    if len(x.shape) != 4:
        raise OpsetRefused(f"GridSample of a {len(x.shape)}-D input needs opset 16 (its spelt-out form is 4-D)")
    if mode != "nearest" and x.dtype != grid.dtype:
        raise OpsetRefused(f"{mode} GridSample of an input and a grid of different types needs opset 16")
    tape = ir.tape.Tape()
    real = grid.dtype.numpy()

    def constant(value: object, dtype: np.dtype | type = np.int64) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(np.asarray(value, dtype=dtype))})

    def op(op_type: str, *inputs: ir.Value, **attributes: object) -> ir.Value:
        return tape.op(op_type, list(inputs), attributes or None)

    def less(a: ir.Value, b: ir.Value) -> ir.Value:  # the smaller, NaN when either is (a Where, unlike Min)
        return op("Where", op("Less", a, b), a, b)

    zero, one = constant(0, real), constant(1, real)
    image, sampled = op("Shape", x), op("Shape", grid)
    batch_channels = op("Slice", image, constant([0]), constant([2]))
    points = op("ReduceProd", op("Slice", sampled, constant([1]), constant([3])), axes=[0], keepdims=1)
    flat_points = op("Concat", op("Slice", sampled, constant([0]), constant([1])), constant([1]), points, axis=0)
    flat_image = op(
        "Concat",
        batch_channels,
        op("ReduceProd", op("Slice", image, constant([2]), constant([4])), axes=[0], keepdims=1),
        axis=0,
    )
    pixels = op("Reshape", x, flat_image)
    width = op("Gather", image, constant(3))

    def unnormalized(coordinate: int, dimension: int) -> tuple[ir.Value, ir.Value]:
        """The coordinates along one axis of the image in pixels, flattened to [N, 1, points], and its size."""
        size = op("Cast", op("Gather", image, constant(dimension)), to=grid.dtype)
        g = op("Reshape", op("Gather", grid, constant(coordinate), axis=3), flat_points)
        if align:
            return op("Mul", op("Add", g, one), op("Div", op("Sub", size, one), constant(2, real))), size
        at = op("Sub", op("Mul", op("Add", g, one), op("Div", size, constant(2, real))), constant(0.5, real))
        return at, size

    def padded(at: ir.Value, size: ir.Value) -> ir.Value:
        """Border's and reflection's coordinates: reflected off the image's edges, clipped to it (NaN to 0)."""
        if padding == "reflection":
            low = zero if align else constant(-0.5, real)
            span = op("Mul", op("Sub", size, one) if align else size, constant(2, real))
            distance = op("Abs", op("Sub", at, low))
            extra = op("Sub", distance, op("Mul", op("Floor", op("Div", distance, span)), span))
            at = op("Add", less(extra, op("Sub", span, extra)), low)
        if padding == "zeros":
            return at
        above = op("Where", op("Greater", at, zero), at, zero)
        last = op("Sub", size, one)
        return op("Where", op("Less", above, last), above, last)

    def read(column: ir.Value, row: ir.Value, inside: ir.Value | None) -> ir.Value:
        """The pixels at integral float coordinates [N, 1, points], 0 where `inside` is false."""
        if inside is not None:
            column, row = op("Where", inside, column, zero), op("Where", inside, row, zero)
        index = op(
            "Add", op("Mul", op("Cast", row, to=ir.DataType.INT64), width), op("Cast", column, to=ir.DataType.INT64)
        )
        index = op("Expand", index, op("Concat", batch_channels, points, axis=0))
        values = op("GatherElements", pixels, index, axis=2)
        if inside is None:
            return values
        return op("Where", inside, values, constant(0, x.dtype.numpy()))

    def within(at: ir.Value, size: ir.Value) -> ir.Value:
        return op("And", op("Greater", at, constant(-1, real)), op("Less", at, size))

    def both(a: ir.Value | None, b: ir.Value | None) -> ir.Value | None:
        return b if a is None else a if b is None else op("And", a, b)

    def cubic(t: ir.Value) -> list[ir.Value]:
        """The 4 taps' weights of cubic convolution (A = -0.75) at distance t past the second tap."""
        a, a2, a3 = constant(-0.75, real), constant(1.25, real), constant(2.25, real)  # A, A + 2, A + 3

        def outer(d: ir.Value) -> ir.Value:  # ((A d - 5 A) d + 8 A) d - 4 A, for 1 <= d <= 2
            inner = op("Add", op("Mul", op("Sub", op("Mul", a, d), constant(-3.75, real)), d), constant(-6, real))
            return op("Sub", op("Mul", inner, d), constant(-3, real))

        def near(d: ir.Value) -> ir.Value:  # ((A + 2) d - (A + 3)) d d + 1, for d <= 1
            return op("Add", op("Mul", op("Mul", op("Sub", op("Mul", a2, d), a3), d), d), one)

        two = constant(2, real)
        return [outer(op("Add", t, one)), near(t), near(op("Sub", one, t)), outer(op("Sub", two, t))]

    column, width_f = unnormalized(0, 3)
    row, height_f = unnormalized(1, 2)
    zeros = padding == "zeros"
    if mode == "nearest":
        column, row = op("Round", padded(column, width_f)), op("Round", padded(row, height_f))
        inside = op("And", within(column, width_f), within(row, height_f)) if zeros else None
        result = read(column, row, inside)
    elif mode == "bilinear":
        column, row = padded(column, width_f), padded(row, height_f)
        west, north = op("Floor", column), op("Floor", row)
        east, south = op("Add", west, one), op("Add", north, one)
        w = op("Sub", column, west)
        e = op("Sub", one, w)
        n = op("Sub", row, north)
        s = op("Sub", one, n)
        if zeros:
            west_in, north_in = within(west, width_f), within(north, height_f)
            east_in, south_in = within(east, width_f), within(south, height_f)
        else:  # the clipped location's floor is inside; its next column or row may not be
            west_in = north_in = None
            east_in, south_in = op("Less", east, width_f), op("Less", south, height_f)
        corners = [
            (read(west, north, both(west_in, north_in)), op("Mul", s, e)),
            (read(east, north, both(east_in, north_in)), op("Mul", s, w)),
            (read(west, south, both(west_in, south_in)), op("Mul", n, e)),
            (read(east, south, both(east_in, south_in)), op("Mul", n, w)),
        ]
        result = op("Mul", *corners[0])
        for value, weight in corners[1:]:
            result = op("Add", result, op("Mul", value, weight))
    else:  # bicubic: 4 x 4 taps around the unpadded location, each tap's coordinates padded
        west, north = op("Floor", column), op("Floor", row)
        across, down = cubic(op("Sub", column, west)), cubic(op("Sub", row, north))
        rows = []
        for i in range(4):
            tap_row = padded(op("Add", north, constant(i - 1, real)), height_f)
            row_in = within(tap_row, height_f) if zeros else None
            terms = []
            for j in range(4):
                tap_column = padded(op("Add", west, constant(j - 1, real)), width_f)
                inside = both(within(tap_column, width_f), row_in) if zeros else None
                terms.append(op("Mul", across[j], read(tap_column, tap_row, inside)))
            rows.append(functools.reduce(lambda a, b: op("Add", a, b), terms))
        terms = [op("Mul", down[i], rows[i]) for i in range(4)]
        result = functools.reduce(lambda a, b: op("Add", a, b), terms)
    output_shape = op("Concat", batch_channels, op("Slice", sampled, constant([1]), constant([3])), axis=0)
    result = op("Reshape", result, output_shape)
    replace(node, tape.nodes, [result])


def col2im_as_pads(node: ir.Node, opset: int) -> None:
    """Col2Im-18 (2-D) as a sum over the kernel's positions, each one's blocks spread by the strides (zeros between
    them), padded to its place in the padded image, added in the kernel's order (torch's col2im adds them so, from
    zero: the same sums, and no 0 * inf), the padding then cut off."""
    x = node.inputs[0]
    image, block = (constant_ints(node.inputs[i]) for i in (1, 2))
    if x is None or x.shape is None or len(x.shape) != 3 or image is None or block is None or len(image) != 2:
        raise OpsetRefused("Col2Im other than 2-D of a batch with sizes known at export needs opset 18")
    channels_blocks = x.shape[1]
    kernel = block[0] * block[1]
    if not isinstance(channels_blocks, int) or channels_blocks % kernel:
        raise OpsetRefused("Col2Im of a channel count not known at export needs opset 18")

    def ints(name: str, default: list[int]) -> list[int]:
        return list(node.attributes[name].as_ints()) if name in node.attributes else default

    dilations, strides, pads = ints("dilations", [1, 1]), ints("strides", [1, 1]), ints("pads", [0, 0, 0, 0])
    padded = [image[a] + pads[a] + pads[a + 2] for a in (0, 1)]
    counts = [(padded[a] - dilations[a] * (block[a] - 1) - 1) // strides[a] + 1 for a in (0, 1)]
    tape = ir.tape.Tape()

    def constant(value: object) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(np.asarray(value, dtype=np.int64))})

    blocks = tape.op("Reshape", [x, constant([0, channels_blocks // kernel, kernel, *counts])])
    total: ir.Value | None = None
    for position in range(kernel):
        rows_cols = divmod(position, block[1])
        placed = tape.op("Gather", [blocks, constant(position)], {"axis": 2})  # [N, C, rows, columns]
        if strides != [1, 1]:  # each block followed by stride - 1 zeros along both axes
            spread = tape.op("Reshape", [placed, constant([0, 0, counts[0], 1, counts[1], 1])])
            gaps = [0] * 6 + [0, 0, 0, strides[0] - 1, 0, strides[1] - 1]
            spread = tape.op("Pad", [spread, constant(gaps)])
            spread = tape.op("Reshape", [spread, constant([0, 0, counts[0] * strides[0], counts[1] * strides[1]])])
            span = [(counts[a] - 1) * strides[a] + 1 for a in (0, 1)]
            placed = tape.op("Slice", [spread, constant([0, 0]), constant(span), constant([2, 3])])
        starts = [rows_cols[a] * dilations[a] for a in (0, 1)]
        ends = [padded[a] - starts[a] - (counts[a] - 1) * strides[a] - 1 for a in (0, 1)]
        placed = tape.op("Pad", [placed, constant([0, 0, *starts, 0, 0, *ends])])
        total = placed if total is None else tape.op("Add", [total, placed])
    assert total is not None
    cut = [pads[0], pads[1]], [pads[0] + image[0], pads[1] + image[1]]
    result = tape.op("Slice", [total, constant(cut[0]), constant(cut[1]), constant([2, 3])])
    replace(node, tape.nodes, [result])
