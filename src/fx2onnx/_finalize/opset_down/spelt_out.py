"""Adapters that spell an op out in older ops where the target opset lacks it or its mode: LayerNormalization, Trilu,
HardSwish, Mish, bitwise ops of integers, Einsum before 12; below 13 Softmax along an inner axis (transposed to the
last), below 12 GreaterOrEqual, LessOrEqual, Celu, and Max, Min and Clip of integers. Scatter reductions, spectral and
sampling ops have modules of their own."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from fx2onnx._finalize.opset_down.rewriting import OpsetRefused, replace


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
