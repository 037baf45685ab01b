"""Adapters that spell an op out in older ops where the target opset lacks it or its mode: scatter reductions as a
Loop, LayerNormalization, Trilu, HardSwish, Mish, bitwise ops, DFT, window functions, GridSample, Col2Im; below 13
Softmax along an inner axis (transposed to the last), below 12 GreaterOrEqual, LessOrEqual, Celu, and Max, Min and
Clip of integers."""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir

from fx2onnx._finalize.opset_down.rewriting import OpsetRefused, constant_ints, replace, typed


def scatter_reduction(node: ir.Node, opset: int) -> None:
    attribute = node.attributes.get("reduction")
    reduction = attribute.as_string() if attribute is not None else "none"
    needs = {"none": 0, "add": 16, "mul": 16, "max": 18, "min": 18}[reduction]
    if needs > opset:
        _scatter_in_a_loop(node, reduction)
        return
    if opset < 16:
        node.attributes.pop("reduction", None)


def _scatter_in_a_loop(node: ir.Node, reduction: str) -> None:
    """ScatterElements or ScatterND reducing (add, mul, max, min) as a Loop over the updates, which reads the values
    an update meets, combines and writes them back: ScatterElements one slice along its axis at a time (the columns of
    a slice reach distinct elements), ScatterND one update at a time. Each element meets its updates in their order,
    as in torch's kernels and ONNX Runtime's reduction; each step copies the data."""
    data, indices, updates = node.inputs[0], node.inputs[1], node.inputs[2]
    assert data is not None and indices is not None and updates is not None
    if data.dtype is None or indices.shape is None or updates.shape is None or data.shape is None:
        raise OpsetRefused(f"{node.op_type} with reduction={reduction!r} of unknown ranks or types")
    elements = node.op_type == "ScatterElements"
    axis = node.attributes["axis"].as_int() if elements and "axis" in node.attributes else 0
    axis %= len(data.shape)
    tape = ir.tape.Tape()

    def constant(value: object) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(np.asarray(value, dtype=np.int64))})

    if elements:
        along, count_of = axis, indices
    else:  # the updates as [count, *the data's trailing dims], the indices as [count, k]
        depth = indices.shape[-1]
        if not isinstance(depth, int):
            raise OpsetRefused("ScatterND with index tuples of a length not known at export needs opset 16")
        trailing = tape.op("Slice", [tape.op("Shape", [data]), constant([depth]), constant([len(data.shape)])])
        indices = tape.op("Reshape", [indices, constant([-1, depth])])
        updates = tape.op("Reshape", [updates, tape.op("Concat", [constant([-1]), trailing], {"axis": 0})])
        along, count_of = 0, indices
    count = tape.op("Gather", [tape.op("Shape", [count_of]), constant(along)])
    typed(tape.nodes)  # the body reads their types
    prefix = node.name or f"scatter_{id(node)}"  # of the body's names, unique in the model
    body = ir.tape.Tape()
    step, going, current = (
        ir.Value(name=f"{prefix}_{name}", type=ir.TensorType(dtype), shape=shape)
        for name, dtype, shape in (
            ("step", ir.DataType.INT64, ir.Shape([])),
            ("going", ir.DataType.BOOL, ir.Shape([])),
            ("current", data.dtype, data.shape),
        )
    )
    first = body.op("Unsqueeze", [step, body.op("Constant", [], {"value": ir.tensor(np.asarray([0], np.int64))})])
    last = body.op("Add", [first, body.op("Constant", [], {"value": ir.tensor(np.asarray([1], np.int64))})])
    axes = body.op("Constant", [], {"value": ir.tensor(np.asarray([along], np.int64))})
    where = body.op("Slice", [indices, first, last, axes])
    given = body.op("Slice", [updates, first, last, axes])
    if elements:
        met = body.op("GatherElements", [current, where], {"axis": axis})
    else:
        met = body.op("GatherND", [current, where])
    if reduction in ("add", "mul"):
        combined = body.op("Add" if reduction == "add" else "Mul", [met, given])
    else:  # the update where it is larger (smaller) or NaN, as torch's amax (amin): NaN wins either way
        wins = body.op("Greater" if reduction == "max" else "Less", [given, met])
        if data.dtype.is_floating_point():
            wins = body.op("Or", [wins, body.op("IsNaN", [given])])
        combined = body.op("Where", [wins, given, met])
    scatter_attributes = {"axis": axis} if elements else None
    written = body.op(node.op_type, [current, where, combined], scatter_attributes)
    still = body.op("Identity", [going])
    typed(body.nodes)
    for number, value in enumerate(output for body_node in body.nodes for output in body_node.outputs):
        value.name = f"{prefix}_loop_{number}"
    written.shape = data.shape
    graph = ir.Graph([step, going, current], [still, written], nodes=body.nodes, name=f"{prefix}_loop")
    result = tape.op("Loop", [count, None, data], {"body": graph})
    replace(node, tape.nodes, [result])


def softmax_along_last(node: ir.Node, opset: int) -> None:
    """Softmax, LogSoftmax and Hardmax-13 (along one axis) below 13, where they flatten the input to 2-D at their
    axis (default 1): the same along the last axis only, so an inner axis is swapped with the last and back."""
    if opset >= 13:
        return
    axis = node.attributes["axis"].as_int() if "axis" in node.attributes else -1
    x = node.inputs[0]
    assert x is not None
    rank = len(x.shape) if x.shape is not None else None
    if rank is None and axis != -1:
        raise OpsetRefused(f"{node.op_type} along axis {axis} of an input of unknown rank needs opset 13")
    if rank == 0:
        raise OpsetRefused(f"{node.op_type} of a scalar needs opset 13")
    node.attributes["axis"] = ir.AttrInt64("axis", -1)
    if rank is None or axis % rank == rank - 1:
        return
    swap = list(range(rank))
    swap[axis % rank], swap[-1] = rank - 1, axis % rank
    tape = ir.tape.Tape()
    swapped = tape.op("Transpose", [x], {"perm": swap})
    along_last = tape.op(node.op_type, [swapped], {"axis": -1})
    result = tape.op("Transpose", [along_last], {"perm": swap})
    replace(node, tape.nodes, [result])


def compare_or_equal(node: ir.Node, opset: int) -> None:
    """GreaterOrEqual and LessOrEqual-12 as Greater (Less) or Equal: false at NaN, as theirs (not Not(Less))."""
    if opset >= 12:
        return
    a, b = node.inputs[0], node.inputs[1]
    tape = ir.tape.Tape()
    strict = tape.op("Greater" if node.op_type == "GreaterOrEqual" else "Less", [a, b])
    result = tape.op("Or", [strict, tape.op("Equal", [a, b])])
    replace(node, tape.nodes, [result])


def integer_extremes_as_where(node: ir.Node, opset: int) -> None:
    """Max, Min and Clip of integers below 12 (their version 8 and 11 take floats only, and no float holds every
    int64) as Where over Greater or Less: exact, and integers have no NaN to order."""
    if opset >= 12:
        return
    x = node.inputs[0]
    if x is None or x.dtype is None or not x.dtype.is_integer():
        return
    tape = ir.tape.Tape()

    def pick(a: ir.Value, b: ir.Value, larger: bool) -> ir.Value:
        return tape.op("Where", [tape.op("Greater" if larger else "Less", [a, b]), a, b])

    if node.op_type == "Clip":
        result = x
        for index, larger in ((1, True), (2, False)):  # max(x, low), then min(.., high), as Clip with low > high
            bound = node.inputs[index] if len(node.inputs) > index else None
            if bound is not None:
                result = pick(result, bound, larger)
        if result is x:
            result = tape.op("Identity", [x])
    else:
        values = [value for value in node.inputs if value is not None]
        result = values[0] if len(values) > 1 else tape.op("Identity", [values[0]])
        for value in values[1:]:
            result = pick(result, value, node.op_type == "Max")
    replace(node, tape.nodes, [result])


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


EINSUM_PRODUCT_LIMIT = 1 << 24
"""The most elements the broadcast product of an Einsum's operands (its form before opset 12) may hold."""


def einsum_as_product(node: ir.Node, opset: int) -> None:
    """Einsum-12 as its definition: every operand transposed and unsqueezed to one layout of all its labels (the
    output's first, then the summed ones; an ellipsis as labels of its own, aligned from the right), multiplied
    with broadcasting, and summed over the labels not in the output. Refused when a label repeats within an
    operand (a diagonal) or the product would be larger than EINSUM_PRODUCT_LIMIT. Two operands with at most one
    label of each kind (only the first's, only the second's, summed in both) are a MatMul instead, as attention's
    "bhid,bhjd->bhij": the product would be as large as their inputs times the summed size."""
    equation = node.attributes["equation"].as_string().replace(" ", "")
    given, _, output = equation.partition("->")
    terms = given.split(",")
    operands = list(node.inputs)
    if len(terms) != len(operands) or any(x is None or x.shape is None for x in operands):
        raise OpsetRefused("Einsum of inputs of unknown rank needs opset 12")
    ellipsis = [chr(0x100 + k) for k in range(max(len(x.shape) for x in operands if x is not None))]

    def labels(term: str, rank: int) -> list[str]:
        head, dots, tail = term.partition("...")
        if not dots:
            return list(term)
        count = rank - len(head) - len(tail)
        return [*head, *ellipsis[:count][::-1], *tail]  # the ellipsis's last dim is label 0 in every operand

    named = [labels(term, len(x.shape)) for term, x in zip(terms, operands, strict=True) if x is not None]
    if any(len(set(term)) != len(term) for term in named):
        raise OpsetRefused("Einsum with a label repeated in one operand (a diagonal) needs opset 12")
    if "->" in equation:
        widest = max(sum(1 for label in term if label in ellipsis) for term in named)
        out = labels(output, widest + len(output.replace("...", ""))) if "..." in output else list(output)
    else:  # implicit output: the ellipsis, then the labels seen once, in alphabetical order
        seen = [label for term in named for label in term]
        dots = sorted({label for label in seen if label in ellipsis}, reverse=True)
        out = dots + sorted(label for label in set(seen) if seen.count(label) == 1 and label not in ellipsis)
    if len(named) == 2 and _einsum_as_matmul(node, named, out):
        return
    summed = [label for term in named for label in term if label not in out]
    layout = out + list(dict.fromkeys(summed))
    sizes: dict[str, int] = {}  # the sizes known at export (a dynamic one counts as 1)
    for term, x in zip(named, operands, strict=True):
        assert x is not None and x.shape is not None
        for label, size in zip(term, x.shape, strict=True):
            if isinstance(size, int):
                sizes[label] = max(sizes.get(label, 1), size)
    product = int(np.prod([sizes.get(label, 1) for label in layout]))
    if product > EINSUM_PRODUCT_LIMIT:
        raise OpsetRefused(f"Einsum {equation} as a product of {product} elements (its form before 12) is too large")
    tape = ir.tape.Tape()

    def constant(values: list[int]) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(np.asarray(values, dtype=np.int64))})

    result: ir.Value | None = None
    for term, x in zip(named, operands, strict=True):
        assert x is not None
        order = sorted(range(len(term)), key=lambda i: layout.index(term[i]))
        aligned = tape.op("Transpose", [x], {"perm": order}) if order != sorted(order) else x
        missing = [i for i, label in enumerate(layout) if label not in term]
        if missing:
            aligned = tape.op("Unsqueeze", [aligned, constant(missing)])
        result = aligned if result is None else tape.op("Mul", [result, aligned])
    assert result is not None
    if len(layout) > len(out):
        result = tape.op("ReduceSum", [result, constant(list(range(len(out), len(layout))))], {"keepdims": 0})
    elif not tape.nodes:
        result = tape.op("Identity", [result])
    replace(node, tape.nodes, [result])


def _einsum_as_matmul(node: ir.Node, named: list[list[str]], out: list[str]) -> bool:
    """Einsum of two operands as Transposes, a MatMul over the batch labels and back, when its labels fit one."""
    a, b = named
    batch = [label for label in out if label in a and label in b]
    only_a = [label for label in out if label in a and label not in b]
    only_b = [label for label in out if label in b and label not in a]
    summed = [label for label in a if label in b and label not in out]
    if max(len(only_a), len(only_b), len(summed)) > 1:
        return False
    tape = ir.tape.Tape()

    def constant(values: list[int]) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(np.asarray(values, dtype=np.int64))})

    def arrange(x: ir.Value, labels: list[str], target: list[str]) -> ir.Value:
        """`x` summed over its labels not in `target`, transposed to its order, 1s where it lacks a label."""
        alone = [i for i, label in enumerate(labels) if label not in target]
        if alone:
            x = tape.op("ReduceSum", [x, constant(alone)], {"keepdims": 0})
            labels = [label for label in labels if label in target]
        order = sorted(range(len(labels)), key=lambda i: target.index(labels[i]))
        if order != list(range(len(labels))):
            x = tape.op("Transpose", [x], {"perm": order})
        missing = [i for i, label in enumerate(target) if label not in labels]
        return tape.op("Unsqueeze", [x, constant(missing)]) if missing else x

    rows, inner, columns = only_a or ["rows"], summed or ["inner"], only_b or ["columns"]  # "rows": no einsum label
    left, right = (
        arrange(x, term, batch + first + second)
        for x, term, first, second in (
            (node.inputs[0], a, rows, inner),
            (node.inputs[1], b, inner, columns),
        )
    )
    result = tape.op("MatMul", [left, right])
    placeholders = [len(batch) + i for i, group in enumerate((only_a, only_b)) if not group]
    if placeholders:
        result = tape.op("Squeeze", [result, constant(placeholders)])
    made = batch + only_a + only_b
    order = [made.index(label) for label in out]
    if order != list(range(len(made))):
        result = tape.op("Transpose", [result], {"perm": order})
    replace(node, tape.nodes, [result])
    return True


def celu_spelt_out(node: ir.Node, opset: int) -> None:
    """Celu-12 as its definition: x where positive, else alpha (exp(x / alpha) - 1) (NaN stays NaN)."""
    x = node.inputs[0]
    assert x is not None and x.dtype is not None
    alpha = node.attributes["alpha"].as_float() if "alpha" in node.attributes else 1.0
    tape = ir.tape.Tape()

    def constant(value: float) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(np.asarray(value, dtype=x.dtype.numpy()))})

    exp = tape.op("Exp", [tape.op("Div", [x, constant(alpha)])])
    negative = tape.op("Mul", [constant(alpha), tape.op("Sub", [exp, constant(1.0)])])
    result = tape.op("Where", [tape.op("Greater", [x, constant(0.0)]), x, negative])
    replace(node, tape.nodes, [result])


def layer_norm_spelt_out(node: ir.Node, opset: int) -> None:
    """LayerNormalization-17 as its definition: mean and variance over the trailing axes in the stash type
    (float32 unless stash_type says otherwise), normalized, cast back, then scaled and shifted."""
    if len(node.outputs) > 1 and any(output.uses() for output in node.outputs[1:]):
        raise OpsetRefused("LayerNormalization's Mean or InvStdDev output is used")
    x, scale = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    assert x is not None and scale is not None
    if x.shape is None or x.dtype is None:
        raise OpsetRefused("LayerNormalization of an input of unknown rank or type")
    rank = len(x.shape)
    axis = node.attributes["axis"].as_int() if "axis" in node.attributes else -1
    epsilon = node.attributes["epsilon"].as_float() if "epsilon" in node.attributes else 1e-5
    stash = node.attributes["stash_type"].as_int() if "stash_type" in node.attributes else 1
    stash_type = ir.DataType(stash)
    axes = list(range(axis % rank, rank))
    tape = ir.tape.Tape()
    computed = tape.op("Cast", [x], {"to": stash_type}) if stash_type != x.dtype else x
    mean = tape.op("ReduceMean", [computed], {"axes": axes, "keepdims": 1})
    centered = tape.op("Sub", [computed, mean])
    variance = tape.op("ReduceMean", [tape.op("Mul", [centered, centered])], {"axes": axes, "keepdims": 1})
    epsilon_value = tape.op("Constant", [], {"value": ir.tensor(np.asarray(epsilon, dtype=stash_type.numpy()))})
    deviation = tape.op("Sqrt", [tape.op("Add", [variance, epsilon_value])])
    normalized = tape.op("Div", [centered, deviation])
    if stash_type != x.dtype:
        normalized = tape.op("Cast", [normalized], {"to": x.dtype})
    result = tape.op("Mul", [normalized, scale])
    if bias is not None:
        result = tape.op("Add", [result, bias])
    replace(node, tape.nodes, [result])


def trilu_as_where(node: ir.Node, opset: int) -> None:
    """Trilu-14 as a Where over row and column indices: upper keeps column - row >= k, lower keeps <= k."""
    x = node.inputs[0]
    assert x is not None
    if x.shape is None or len(x.shape) < 2 or x.dtype is None:
        raise OpsetRefused("Trilu of an input of unknown rank or type")
    upper = node.attributes["upper"].as_int() if "upper" in node.attributes else 1
    rank = len(x.shape)
    tape = ir.tape.Tape()

    def constant(value: object, dtype: ir.DataType = ir.DataType.INT64) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(np.asarray(value, dtype=dtype.numpy()))})

    shape = tape.op("Shape", [x])
    zero, one = constant(0), constant(1)
    rows = tape.op("Gather", [shape, constant(rank - 2)])
    columns = tape.op("Gather", [shape, constant(rank - 1)])
    row_index = tape.op("Unsqueeze", [tape.op("Range", [zero, rows, one]), constant([1])])
    offset = tape.op("Sub", [tape.op("Range", [zero, columns, one]), row_index])
    k = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] is not None else zero
    keep = tape.op("GreaterOrEqual" if upper else "LessOrEqual", [offset, k])
    result = tape.op("Where", [keep, x, constant(0, x.dtype)])
    replace(node, tape.nodes, [result])


def hard_swish_spelt_out(node: ir.Node, opset: int) -> None:
    x = node.inputs[0]
    tape = ir.tape.Tape()
    gate = tape.op("HardSigmoid", [x], {"alpha": 1.0 / 6.0, "beta": 0.5})
    result = tape.op("Mul", [x, gate])
    replace(node, tape.nodes, [result])


def mish_spelt_out(node: ir.Node, opset: int) -> None:
    x = node.inputs[0]
    tape = ir.tape.Tape()
    result = tape.op("Mul", [x, tape.op("Tanh", [tape.op("Softplus", [x])])])
    replace(node, tape.nodes, [result])


def bitwise_not_as_sub(node: ir.Node, opset: int) -> None:
    """BitwiseNot-18 of an integer as all ones minus it: -1 - x for a signed type (two's complement; neither end
    overflows), the type's maximum - x for an unsigned one (bool's Not stays Not: torchlib emits it)."""
    x = node.inputs[0]
    if x is None or x.dtype is None or not x.dtype.is_integer():
        raise OpsetRefused("BitwiseNot of an input whose type is not a known integer type")
    ones = np.asarray(-1 if x.dtype.is_signed() else np.iinfo(x.dtype.numpy()).max, dtype=x.dtype.numpy())
    tape = ir.tape.Tape()
    result = tape.op("Sub", [tape.op("Constant", [], {"value": ir.tensor(ones)}), x])
    replace(node, tape.nodes, [result])


def bitwise_by_bits(node: ir.Node, opset: int) -> None:
    """BitwiseAnd, BitwiseOr and BitwiseXor-18 of integers through their bits: both as uint64 (two's complement,
    sign-extended), each bit of the type's width shifted to the top then to the bottom (BitShift-11), the bits
    combined arithmetically (and: a b, or: a + b - a b, xor: a + b - 2 a b), and added back as powers of two in
    int64 (halves at a time), where distinct bits never carry; a signed type's top bit counts as minus its power."""
    a, b = node.inputs[0], node.inputs[1]
    assert a is not None and b is not None
    dtype = a.dtype
    if dtype is None or not dtype.is_integer() or b.dtype != dtype:
        raise OpsetRefused(f"{node.op_type} of inputs whose type is not one known integer type")
    width = dtype.itemsize * 8
    tape = ir.tape.Tape()

    def constant(value: object, numpy_type: type) -> ir.Value:
        return tape.op("Constant", [], {"value": ir.tensor(np.asarray(value, dtype=numpy_type))})

    def bits(x: ir.Value) -> ir.Value:  # [..., width] of 0 and 1, bit k at position k
        wide = tape.op("Unsqueeze", [tape.op("Cast", [x], {"to": ir.DataType.UINT64}), constant([-1], np.int64)])
        top = tape.op("BitShift", [wide, constant(63 - np.arange(width), np.uint64)], {"direction": "LEFT"})
        return tape.op("BitShift", [top, constant(63, np.uint64)], {"direction": "RIGHT"})

    x, y = bits(a), bits(b)
    both = tape.op("Mul", [x, y])
    if node.op_type == "BitwiseAnd":
        combined = both
    else:
        twice = both if node.op_type == "BitwiseOr" else tape.op("Add", [both, both])
        combined = tape.op("Sub", [tape.op("Add", [x, y]), twice])
    placed = tape.op("BitShift", [combined, constant(np.arange(width), np.uint64)], {"direction": "LEFT"})
    signed = constant(np.arange(width) == width - 1, np.bool_) if dtype.is_signed() and width < 64 else None
    values = tape.op("Cast", [placed], {"to": ir.DataType.INT64})
    if signed is not None:  # 2^(width-1) of a signed type's top bit is -2^(width-1)
        values = tape.op("Where", [signed, tape.op("Neg", [values]), values])
    last = constant([-1], np.int64)
    while width > 1:  # halves added (ONNX Runtime's ReduceSum of int64 sums 2^62 + ... + 1 - 2^63 to 0)
        width //= 2
        cuts = [constant([cut], np.int64) for cut in (0, width, 2 * width)]
        low = tape.op("Slice", [values, cuts[0], cuts[1], last])
        values = tape.op("Add", [low, tape.op("Slice", [values, cuts[1], cuts[2], last])])
    result = tape.op("Cast", [tape.op("Squeeze", [values, last])], {"to": dtype})
    replace(node, tape.nodes, [result])


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
