"""Spectral ops before their opsets: HannWindow, HammingWindow and BlackmanWindow of a size known at export as
constants, DFT before 17 as a product with its matrix."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from fx2onnx._finalize.opset_down.rewriting import OpsetRefused, constant_ints, replace


def window_as_constant(node: ir.Node, opset: int) -> None:
    """HannWindow, HammingWindow and BlackmanWindow-17 of a size known at export as the constant they compute (their
    definitions' cosine sums, in float64, then cast to the output type)."""
    size = constant_ints(node.inputs[0])
    if size is None or len(size) != 1:
        raise OpsetRefused(f"{node.op_type} of a size computed at run time needs opset 17")
    periodic = node.attributes["periodic"].as_int() if "periodic" in node.attributes else 1
    output_type = node.attributes.get("output_datatype")
    dtype = ir.DataType(output_type.as_int()) if output_type is not None else ir.DataType.FLOAT
    length = size[0]
    angle = 2 * np.pi * np.arange(length) / max(length if periodic else length - 1, 1)
    a0, a1, a2 = _WINDOW_TERMS[node.op_type]
    window = a0 - a1 * np.cos(angle) + a2 * np.cos(2 * angle)
    tape = ir.tape.Tape()
    result = tape.op("Constant", [], {"value": ir.tensor(window.astype(dtype.numpy()))})
    replace(node, tape.nodes, [result])


# a0 - a1 cos(angle) + a2 cos(2 angle), as ONNX defines each window (Hamming's alpha 25/46, not torch's 0.54)
_WINDOW_TERMS = {
    "HannWindow": (0.5, 0.5, 0.0),
    "HammingWindow": (25 / 46, 21 / 46, 0.0),
    "BlackmanWindow": (0.42, 0.5, 0.08),
}


DFT_MATRIX_LIMIT = 1 << 22
"""The most elements a DFT's matrix (below opset 17) may hold: 32 MB of float64 (a complex signal of 1024)."""


def dft_as_matmul(node: ir.Node, opset: int) -> None:
    """DFT-17 as a product with its matrix: the signal's axis and its (real, imaginary) pair moved last and
    flattened, times the constant [cos | -sin; sin | cos] of the angles 2 pi (n k mod N) / N (float64, exact at
    quarter turns, so that a real signal's bin 0 has an imaginary part of exactly 0 as eager's; divided by N for
    the inverse), the result's pairs put back. Its length must be known at export."""
    x = node.inputs[0]
    if x is None or x.shape is None or x.dtype is None or not x.dtype.is_floating_point():
        raise OpsetRefused("DFT of an input of unknown rank or type needs opset 17")
    rank = len(x.shape)
    axis = node.attributes["axis"].as_int() if "axis" in node.attributes else 1
    axis %= rank
    inverse = bool(node.attributes["inverse"].as_int()) if "inverse" in node.attributes else False
    onesided = bool(node.attributes["onesided"].as_int()) if "onesided" in node.attributes else False
    length, parts = x.shape[axis], x.shape[-1]
    given = node.inputs[1] if len(node.inputs) > 1 else None
    signal = constant_ints(given) if given is not None else None
    if given is not None and signal is None:
        raise OpsetRefused("DFT with a length computed at run time needs opset 17")
    if not isinstance(length, int) or parts not in (1, 2) or axis == rank - 1:
        raise OpsetRefused(f"DFT along a dimension not known at export ({length}) needs opset 17")
    size = signal[0] if signal else length
    if onesided and (inverse or parts == 2):
        raise OpsetRefused("a one-sided inverse or complex DFT needs opset 17")
    bins = size // 2 + 1 if onesided else size
    used = min(length, size)  # zero padding up to the length adds nothing; a shorter length reads the first values
    if parts * used * 2 * bins > DFT_MATRIX_LIMIT:
        raise OpsetRefused(f"a DFT of {size} points as a matrix product (its form before opset 17) is too large")
    turns = np.outer(np.arange(used), np.arange(bins)) % size  # the angle in 1/size of a turn
    cos, sin = np.cos(2 * np.pi * turns / size), np.sin(2 * np.pi * turns / size)
    quarter = (4 * turns) % size == 0  # a multiple of a quarter turn: exact 0 and ±1, as in an FFT's twiddles
    quadrant = (4 * turns // size)[quarter] % 4
    cos[quarter], sin[quarter] = np.array([1, 0, -1, 0])[quadrant], np.array([0, 1, 0, -1])[quadrant]
    sin = sin if inverse else -sin  # e^(-+i angle) = cos -+ i sin
    rows = [np.concatenate([cos, sin], axis=1)]  # the real part's contribution to (real, imaginary)
    if parts == 2:
        rows.append(np.concatenate([-sin, cos], axis=1))  # i times the imaginary part's
    matrix = np.concatenate(rows, axis=0) / (size if inverse else 1)
    others = [d for d in range(rank - 1) if d != axis]
    tape = ir.tape.Tape()

    def constant(value: np.ndarray) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(value)})

    if used < length:
        starts, ends, axes = constant(np.array([0])), constant(np.array([used])), constant(np.array([axis]))
        x = tape.op("Slice", [x, starts, ends, axes])
    moved = tape.op("Transpose", [x], {"perm": [*others, rank - 1, axis]})
    keep = [0] * len(others)
    flat = tape.op("Reshape", [moved, constant(np.array([*keep, parts * used]))])
    product = tape.op("MatMul", [flat, constant(matrix.astype(x.dtype.numpy()))])
    pairs = tape.op("Reshape", [product, constant(np.array([*keep, 2, bins]))])
    # pairs is [*others, pair, bin]: the bins go back to the axis, the pair last
    back = [others.index(d) if d in others else len(others) + (d == axis) for d in range(rank)]
    result = tape.op("Transpose", [pairs], {"perm": back})
    replace(node, tape.nodes, [result])
