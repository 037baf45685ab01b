"""``fx2onnx._finalize.optimizer.optimize`` gives the graph ``onnxscript.optimizer.optimize_ir`` gives.

The same nodes, attributes and initializers; the recorded shapes of intermediate values may differ
(fx2onnx's constant folding reuses the shapes recorded at emission instead of re-running ONNX
inference), so ``value_info`` is left out of the comparison. The rules fx2onnx makes exact
(``x + 0`` etc. only for an exact 0 or 1) cannot fire differently on these models.
"""

from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxscript.optimizer
import onnxscript.rewriter
import pytest
import torch

import fx2onnx
from fx2onnx import examples
from fx2onnx._finalize import check_model, graph_walks, optimizer
from fx2onnx._records import FX_NODE, TARGET
from fx2onnx.errors import InvalidModelError

from conftest import Call, assert_exports_and_matches


class _TwoSlices(torch.nn.Module):
    """Two slices of one value: the optimizer then runs onnxscript's SlicesSplit rule too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        return y[..., :3] * 2 + y[..., 3:6] * 3  # the halves, as the rule requires


class _ReshapeTwice(torch.nn.Module):
    """Two reshapes back to the input's shape: the rewrite merges them into one Reshape, which only the second
    round of constant folding turns into nothing (a Reshape to the input's own shape)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).reshape(3, 4).reshape(2, 6) * 2


def _unoptimized(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> ir.Model:
    # target="onnx": the unoptimized graph has ops (sequences) ONNX Runtime CPU legalization refuses.
    return fx2onnx.export(model.eval(), args, optimize=False, target="onnx").model


@pytest.mark.parametrize(
    "model, args",
    [
        (examples.TinyGPT(layers=1), (torch.randint(0, 512, (2, 8)),)),
        (_TwoSlices(), (torch.randn(2, 6),)),
        (_ReshapeTwice(), (torch.randn(2, 6),)),
    ],
    ids=["tiny_gpt", "two_slices", "reshape_twice"],
)
def test_same_model_as_onnxscript_optimize_ir(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    torch.manual_seed(0)
    proto = ir.to_proto(_unoptimized(model, args))
    ours, theirs = ir.from_proto(proto), ir.from_proto(proto)
    optimizer.optimize(ours)
    onnxscript.optimizer.optimize_ir(theirs)
    ours_proto, theirs_proto = ir.to_proto(ours), ir.to_proto(theirs)
    for graph in (ours_proto.graph, theirs_proto.graph):
        del graph.value_info[:]
    assert len(ours_proto.graph.node) > 0
    assert ours_proto.SerializeToString(deterministic=True) == theirs_proto.SerializeToString(deterministic=True)


class _CountingFold(optimizer._FoldConstants):
    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.runs += 1
        return super().call(model)


@pytest.mark.parametrize("model, folds", [(_ReshapeTwice(), 2), (torch.nn.Sequential(torch.nn.ReLU()), 1)])
def test_folds_again_only_after_a_rewrite(model: torch.nn.Module, folds: int) -> None:
    """Folding reaches its fixed point in one pass: a second one runs only when the rewrite changed the graph."""
    unoptimized = _unoptimized(model, (torch.randn(2, 6),))
    rules = optimizer._with_exact_no_ops(onnxscript.rewriter._DEFAULT_REWRITE_RULES)
    fold = _CountingFold()
    optimizer._FoldAndRewrite(fold, optimizer._Rewrite(rules), iterations=2)(unoptimized)
    assert fold.runs == folds


def _gemm_whose_zero_bias_is_also_transposed() -> ir.Model:
    """y = Gemm(x, w, zeros) + Transpose(zeros): the zero bias is large (128x128, above onnxscript's folding
    limit), so the first fold leaves its Transpose (the bias has two users); the rewrite drops the bias from the
    Gemm, and the second fold then folds the Transpose (a large input it alone uses), a node the rewrite did not
    touch."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([128, 4]))
    w = ir.Value(name="w", const_value=ir.tensor(np.ones((4, 128), np.float32), name="w"))
    zeros = ir.Value(name="zeros", const_value=ir.tensor(np.zeros((128, 128), np.float32), name="zeros"))
    for value in (w, zeros):
        value.type, value.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(value.const_value.shape)
    gemm = ir.node("Gemm", [x, w, zeros])
    transpose = ir.node("Transpose", [zeros], attributes={"perm": [1, 0]})
    add = ir.node("Add", [gemm.outputs[0], transpose.outputs[0]])
    for node in (gemm, transpose, add):
        node.outputs[0].type, node.outputs[0].shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([128, 128])
    add.outputs[0].name = "y"
    graph = ir.Graph(
        [x], [add.outputs[0]], nodes=[gemm, transpose, add], initializers=[w, zeros], opset_imports={"": 18}
    )
    return ir.Model(graph, ir_version=8)


def test_second_fold_folds_a_node_the_rewrite_did_not_touch() -> None:
    """The rewrite dropping the zero bias leaves its Transpose the only user of that large constant: the second
    fold folds it (a fold restricted to the nodes the rewrite touched would not)."""
    model = _gemm_whose_zero_bias_is_also_transposed()
    rules = optimizer._with_exact_no_ops(onnxscript.rewriter._DEFAULT_REWRITE_RULES)
    optimizer._FoldAndRewrite(optimizer._FoldConstants(), optimizer._Rewrite(rules), iterations=2)(model)
    assert [node.op_type for node in model.graph] == ["Gemm", "Add"]


class _TransposedTwice(torch.nn.Module):
    """Two permutations the rewrite merges into one Transpose, read by a Relu: nothing the fold computes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.relu(x).permute(0, 2, 1).permute(1, 0, 2))


@pytest.mark.parametrize("model, folds", [(_TransposedTwice(), 1), (_ReshapeTwice(), 2)])
def test_second_fold_runs_only_where_the_rewrite_changed_what_it_folds(
    model: torch.nn.Module, folds: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a rewrite whose new nodes and their readers are all nodes the fold passes over (a Transpose of an
    activation, a Relu), folding again would change nothing and is left out; a Reshape the rewrite made is folded
    again (into nothing, a Reshape to its input's shape). Either way the model is optimize_ir's."""
    shape = (2, 3, 4) if isinstance(model, _TransposedTwice) else (2, 6)
    proto = ir.to_proto(_unoptimized(model, (torch.randn(*shape),)))
    ours, theirs = ir.from_proto(proto), ir.from_proto(proto)
    made = []
    fold_pass = optimizer._fold_pass
    monkeypatch.setattr(optimizer, "_fold_pass", lambda: made.append(1) or fold_pass())
    optimizer.optimize(ours)
    assert len(made) == folds
    onnxscript.optimizer.optimize_ir(theirs)
    ours_proto, theirs_proto = ir.to_proto(ours), ir.to_proto(theirs)
    for graph in (ours_proto.graph, theirs_proto.graph):
        del graph.value_info[:]
    assert ours_proto.SerializeToString(deterministic=True) == theirs_proto.SerializeToString(deterministic=True)


def test_rules_needing_a_producer_are_tried_only_where_the_input_has_it() -> None:
    """ReshapeReshape needs its input computed by a Reshape: a Reshape of a graph input is not offered to it,
    a Reshape of a Reshape is (and it fires, as in test_same_model_as_onnxscript_optimize_ir)."""
    from onnxscript.rewriter.rules.common import _basic_rules

    rule = _basic_rules.reshape_reshape_rule
    required = optimizer._pattern_producers(rule)
    assert required == (((0,), "", "Reshape"),)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 6]))
    shape = ir.Value(name="shape", const_value=ir.tensor(np.array([3, 4], np.int64), name="shape"))
    first = ir.node("Reshape", [x, shape])
    second = ir.node("Reshape", [first.outputs[0], shape])
    cast = ir.node("Cast", [first.outputs[0]], attributes={"to": 1})
    assert not optimizer._producers_can_match(first, required)
    assert optimizer._producers_can_match(second, required)
    assert not optimizer._producers_can_match(ir.node("Reshape", [cast.outputs[0], shape]), required)
    assert not optimizer._producers_can_match(ir.node("Reshape", []), required)


def test_materialize_reshape_shape_is_not_tried_on_a_reshape_to_a_constant_shape() -> None:
    """Its check fails at once on a constant shape; a computed shape is still offered to it (and materialized)."""
    from onnxscript.rewriter.rules.common import materialize_reshape_shape_rule

    fails = optimizer._known_failing_checks()[id(materialize_reshape_shape_rule)]
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 6]))
    constant = ir.Value(name="c", const_value=ir.tensor(np.array([3, 4], np.int64), name="c"))
    computed = ir.node("Shape", [x]).outputs[0]
    assert fails(ir.node("Reshape", [x, constant]))
    assert not fails(ir.node("Reshape", [x, computed]))

    reshape = ir.node("Reshape", [x, computed])
    reshape.outputs[0].name, reshape.outputs[0].type = "y", ir.TensorType(ir.DataType.FLOAT)
    reshape.outputs[0].shape = ir.Shape([2, 6])
    model = ir.Model(
        ir.Graph([x], [reshape.outputs[0]], nodes=[computed.producer(), reshape], opset_imports={"": 18}), ir_version=8
    )
    rules = optimizer._RulesByRoot([materialize_reshape_shape_rule])
    delta = rules.try_rewrite(model, model.graph, reshape)
    assert delta is not None and rules.name == "MaterializeReshapeShape"


class _CountingRewrite(optimizer._Rewrite):
    def __init__(self, rules: list) -> None:
        super().__init__(rules)
        self.runs = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.runs += 1
        return super().call(model)


def _float_value(name: str, shape: list[int]) -> ir.Value:
    return ir.Value(name=name, type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(shape))


def test_rewrites_again_only_where_the_last_rewrite_may_have_made_a_match() -> None:
    """A rewrite that changed the graph (a zero bias dropped from a Gemm, two Transposes merged into one) is not run
    again over the whole graph when the rules match nothing where it changed it; the model is optimize_ir's."""
    x, y = _float_value("x", [4, 4]), _float_value("y", [2, 3, 4])
    w = ir.Value(name="w", const_value=ir.tensor(np.ones((4, 4), np.float32), name="w"))
    zeros = ir.Value(name="zeros", const_value=ir.tensor(np.zeros((4,), np.float32), name="zeros"))
    for value in (w, zeros):
        value.type, value.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(value.const_value.shape)
    gemm = ir.node("Gemm", [x, w, zeros])
    relu = ir.node("Relu", [gemm.outputs[0]])
    first = ir.node("Transpose", [y], attributes={"perm": [1, 0, 2]})
    second = ir.node("Transpose", [first.outputs[0]], attributes={"perm": [0, 2, 1]})
    nodes = [gemm, relu, first, second]
    for index, (node, shape) in enumerate(zip(nodes, ([4, 4], [4, 4], [3, 2, 4], [3, 4, 2]))):
        node.outputs[0].name, node.outputs[0].type = f"v{index}", ir.TensorType(ir.DataType.FLOAT)
        node.outputs[0].shape = ir.Shape(shape)
    graph = ir.Graph(
        [x, y], [relu.outputs[0], second.outputs[0]], nodes=nodes, initializers=[w, zeros], opset_imports={"": 18}
    )
    proto = ir.to_proto(ir.Model(graph, ir_version=8))
    ours, theirs = ir.from_proto(proto), ir.from_proto(proto)
    rewrite = _CountingRewrite(optimizer._with_exact_no_ops(onnxscript.rewriter._DEFAULT_REWRITE_RULES))
    optimizer._FoldAndRewrite(optimizer._FoldConstants(), rewrite, iterations=2)(ours)
    assert rewrite.runs == 1
    assert [node.op_type for node in ours.graph] == ["Gemm", "Relu", "Transpose"]
    assert len(next(iter(ours.graph)).inputs) == 2
    optimizer.optimize(ours)
    onnxscript.optimizer.optimize_ir(theirs)
    assert ir.to_proto(ours).SerializeToString(deterministic=True) == ir.to_proto(theirs).SerializeToString(
        deterministic=True
    )


def _chain(ops: list[tuple[str, dict[str, list[int]]]]) -> ir.Model:
    """x -> each (op type, attributes) in turn, a Mul taking the constant 1.0 as its second input -> output."""
    value = _float_value("x", [3, 4])
    graph_input, nodes = value, []
    constant = ir.Value(name="one", const_value=ir.tensor(np.array(1.0, np.float32), name="one"))
    constant.type, constant.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([])
    for index, (op_type, attributes) in enumerate(ops):
        node = ir.node(op_type, [value, constant] if op_type == "Mul" else [value], attributes=attributes)
        value = node.outputs[0]
        value.name, value.type = f"v{index}", ir.TensorType(ir.DataType.FLOAT)
        value.shape = ir.Shape([4, 3] if [op for op, _ in ops[: index + 1]].count("Transpose") % 2 else [3, 4])
        nodes.append(node)
    graph = ir.Graph([graph_input], [value], nodes=nodes, initializers=[constant], opset_imports={"": 18})
    return ir.Model(graph, ir_version=8)


def test_no_rewrite_after_a_fold_that_only_removed_what_the_rewrite_left() -> None:
    """x * 1 rewritten to Identity(x), which the second fold removes (T5's 18 attention scales of 1): the rewrite is
    not run again over the whole graph, as nothing the fold changed can match; the model is optimize_ir's."""
    proto = ir.to_proto(_chain([("Relu", {}), ("Mul", {}), ("Sigmoid", {})]))
    ours, theirs = ir.from_proto(proto), ir.from_proto(proto)
    rewrite = _CountingRewrite(optimizer._with_exact_no_ops(onnxscript.rewriter._DEFAULT_REWRITE_RULES))
    optimizer._FoldAndRewrite(optimizer._FoldConstants(), rewrite, iterations=2)(ours)
    assert rewrite.runs == 1
    assert [node.op_type for node in ours.graph] == ["Relu", "Sigmoid"]
    optimizer.optimize(ours)
    onnxscript.optimizer.optimize_ir(theirs)
    assert ir.to_proto(ours).SerializeToString(deterministic=True) == ir.to_proto(theirs).SerializeToString(
        deterministic=True
    )


def test_after_a_fold_the_model_is_optimize_ir_s() -> None:
    """Transpose(x * 1 of a Transpose): the rewrite leaves Transpose(Identity(Transpose)), the fold rewires the outer
    Transpose to the inner one (a change a second rewrite is tried at); the model is optimize_ir's."""
    proto = ir.to_proto(
        _chain([("Transpose", {"perm": [1, 0]}), ("Mul", {}), ("Transpose", {"perm": [1, 0]}), ("Relu", {})])
    )
    ours, theirs = ir.from_proto(proto), ir.from_proto(proto)
    optimizer.optimize(ours)
    onnxscript.optimizer.optimize_ir(theirs)
    assert "Identity" not in [node.op_type for node in ours.graph]
    assert ir.to_proto(ours).SerializeToString(deterministic=True) == ir.to_proto(theirs).SerializeToString(
        deterministic=True
    )


def test_a_match_the_last_rewrite_made_possible_is_found() -> None:
    """Transpose(Transpose(x)) does not match while the inner Transpose has another user; once a rewrite removed
    that user (recorded as the rewrite records it: the values the removed node read), the merged pair is found,
    and only there: a change elsewhere finds nothing."""
    from onnxscript.rewriter.rules.common import _basic_rules

    x = _float_value("x", [2, 3])
    first = ir.node("Transpose", [x], attributes={"perm": [1, 0]})
    second = ir.node("Transpose", [first.outputs[0]], attributes={"perm": [1, 0]})
    other_user = ir.node("Relu", [first.outputs[0]])
    elsewhere = ir.node("Relu", [x])
    nodes = [first, second, other_user, elsewhere]
    for index, node in enumerate(nodes):
        node.outputs[0].name, node.outputs[0].type = f"v{index}", ir.TensorType(ir.DataType.FLOAT)
    outputs = [second.outputs[0], other_user.outputs[0], elsewhere.outputs[0]]
    model = ir.Model(ir.Graph([x], outputs, nodes=nodes, opset_imports={"": 18}), ir_version=8)
    rewrite = optimizer._Rewrite([_basic_rules.transpose_transpose_rule])
    assert not rewrite(model).modified  # the inner Transpose has two users

    model.graph.outputs.remove(other_user.outputs[0])
    read = list(other_user.inputs)
    model.graph.remove(other_user, safe=True)
    rewrite._pass = rewrite.without_slice_split
    rewrite._last_changes = ([], [elsewhere.outputs[0]])
    assert not rewrite.may_match_after_last_changes(model)
    rewrite._last_changes = ([], read)
    assert rewrite.may_match_after_last_changes(model)
    assert rewrite(model).modified


def test_slices_split_is_tried_only_on_a_slice_from_0_with_a_second_slice_of_its_input() -> None:
    """SlicesSplit enumerates the whole graph for each Slice it is tried on; it is offered only the Slices it can
    match (beginning at a constant 0, with another Slice of the same input), and still rewrites those."""
    slice_split_rule = optimizer._SLICES_SPLIT
    fails = optimizer._known_failing_checks()[id(slice_split_rule)]
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 6]))

    def constant(name: str, values: list[int]) -> ir.Value:
        return ir.Value(name=name, const_value=ir.tensor(np.array(values, np.int64), name=name))

    zero, three, six, last = constant("zero", [0]), constant("three", [3]), constant("six", [6]), constant("a", [-1])
    y = ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 6]))
    alone = ir.node("Slice", [y, zero, three, last])
    assert fails(alone)  # no second Slice of y
    first = ir.node("Slice", [x, zero, three, last])
    second = ir.node("Slice", [x, three, six, last])
    assert not fails(first)
    assert fails(second)  # begins at 3: the rule's check needs its first Slice to begin at 0
    assert fails(ir.node("Slice", [x, ir.node("Shape", [x]).outputs[0], three, last]))  # a computed begin

    for node, name in ((first, "y0"), (second, "y1")):
        node.outputs[0].name, node.outputs[0].type = name, ir.TensorType(ir.DataType.FLOAT)
        node.outputs[0].shape = ir.Shape([2, 3])
    total = ir.node("Add", [first.outputs[0], second.outputs[0]])
    total.outputs[0].name, total.outputs[0].type = "z", ir.TensorType(ir.DataType.FLOAT)
    model = ir.Model(
        # the second Slice first: the rule's matcher pairs a Slice with the first Slice of the graph that has its
        # input, which for the first Slice would be itself (and its check then fails)
        ir.Graph([x, y], [total.outputs[0]], nodes=[alone, second, first, total], opset_imports={"": 18}),
        ir_version=8,
    )
    rules = optimizer._RulesByRoot([slice_split_rule])
    assert rules.try_rewrite(model, model.graph, alone) is None
    delta = rules.try_rewrite(model, model.graph, first)
    assert delta is not None and rules.name == "SlicesSplit"


def test_rules_needing_producers_of_producers_are_tried_only_where_the_inputs_have_them() -> None:
    """onnxscript's Reshape(MatMul(Reshape(a), b)) -> MatMul rule needs the root's input computed by a MatMul whose
    first input is computed by a Reshape: a Reshape of a MatMul of activations is not offered to it (it was, and
    failed in the matcher, at every Reshape of an attention output)."""
    from onnxscript.rewriter.rules.common._broadcast_to_matmul import one_reshape_matmul_reshape_rule

    required = optimizer._pattern_producers(one_reshape_matmul_reshape_rule)
    assert required == (((0,), "", "MatMul"), ((0, 0), "", "Reshape"))
    a, b = _float_value("a", [2, 3, 4]), _float_value("b", [4, 5])
    shape = ir.Value(name="shape", const_value=ir.tensor(np.array([6, 4], np.int64), name="shape"))
    plain = ir.node("MatMul", [a, b])
    reshaped = ir.node("MatMul", [ir.node("Reshape", [a, shape]).outputs[0], b])
    assert not optimizer._producers_can_match(ir.node("Reshape", [plain.outputs[0], shape]), required)
    assert optimizer._producers_can_match(ir.node("Reshape", [reshaped.outputs[0], shape]), required)


def _offered(rules: list, node: ir.Node) -> list[str | None]:
    return [rule.name for rule in optimizer._RulesByRoot(rules)._rules_at(node)]


def test_exact_no_op_rules_are_offered_only_a_scalar_constant_of_their_value() -> None:
    """x + y of two activations, x * 2 or x * [1, 1] cannot be a no-op: the exact no-op rules are not tried there
    (on Whisper, T5, BERT they were tried at every Add and Mul, to fail); x + -0.0 and 1 * x are, and fire."""
    rules = optimizer._EXACT_NO_OP_RULES
    x, y = _float_value("x", [2, 3]), _float_value("y", [2, 3])

    def constant(name: str, value: np.ndarray) -> ir.Value:
        return ir.Value(name=name, const_value=ir.tensor(value, name=name))

    two, ones = constant("two", np.array(2.0, np.float32)), constant("ones", np.ones(2, np.float32))
    minus_zero, one = constant("m0", np.array(-0.0, np.float32)), constant("one", np.array(1.0, np.float32))
    assert _offered(rules, ir.node("Add", [x, y])) == []
    assert _offered(rules, ir.node("Mul", [x, two])) == []
    assert _offered(rules, ir.node("Mul", [x, ones])) == []
    assert _offered(rules, ir.node("Add", [x, constant("p0", np.array(0.0, np.float32))])) == []  # +0.0: not a no-op
    assert _offered(rules, ir.node("Add", [x, minus_zero])) == ["AddExactZero"]
    assert _offered(rules, ir.node("Mul", [one, x])) == ["ExactOneMul"]
    for op_type, inputs, name in (("Add", [0, minus_zero], "AddExactZero"), ("Mul", [one, 0], "ExactOneMul")):
        source = _float_value("source", [2, 3])
        node = ir.node(op_type, [source if value == 0 else value for value in inputs])
        node.outputs[0].name, node.outputs[0].type = "z", ir.TensorType(ir.DataType.FLOAT)
        model = ir.Model(ir.Graph([source], [node.outputs[0]], nodes=[node], opset_imports={"": 18}), ir_version=8)
        by_root = optimizer._RulesByRoot(rules)
        assert by_root.try_rewrite(model, model.graph, node) is not None and by_root.name == name


def test_rules_are_not_offered_a_node_of_inputs_their_pattern_cannot_bind() -> None:
    """A Gemm without a bias (as RemoveOptionalBiasFromGemm leaves it) is not offered that rule again, a Slice of five
    inputs (torchlib's) not SlicesSplit (a pattern of four), a Transpose of another permutation not
    TransposeIdentity, a Slice to another shape not the collapse of a Slice to its input's shape."""
    from onnxscript.rewriter.rules.common import _basic_rules, _collapse_slices, _remove_optional_bias

    gemm_rule = _remove_optional_bias.remove_optional_bias_from_gemm_rule
    x, w = _float_value("x", [4, 4]), _float_value("w", [4, 4])
    zeros = ir.Value(name="zeros", const_value=ir.tensor(np.zeros(4, np.float32), name="zeros"))
    assert _offered([gemm_rule], ir.node("Gemm", [x, w])) == []
    assert _offered([gemm_rule], ir.node("Gemm", [x, w, zeros])) == ["RemoveOptionalBiasFromGemm"]

    def ints(name: str, values: list[int]) -> ir.Value:
        return ir.Value(name=name, const_value=ir.tensor(np.array(values, np.int64), name=name))

    zero, two, last, step = ints("zero", [0]), ints("two", [2]), ints("last", [-1]), ints("step", [1])
    split = _basic_rules.slice_split_rule
    assert _offered([split], ir.node("Slice", [x, zero, two, last, step])) == []
    pair = [ir.node("Slice", [x, zero, two, last]), ir.node("Slice", [x, two, ints("four", [4]), last])]
    assert _offered([split], pair[0]) == ["SlicesSplit"]
    assert _offered([split], ir.node("Slice", [x, zero, two, ints("first", [0])])) == []  # not the last axis

    transpose = _basic_rules.no_op_transpose_rule
    assert _offered([transpose], ir.node("Transpose", [x], attributes={"perm": [1, 0]})) == []
    assert _offered([transpose], ir.node("Transpose", [x], attributes={"perm": [0, 1]})) == ["TransposeIdentity"]

    collapse = [_collapse_slices.collapse_slice_rule, _collapse_slices.collapse_slice2_rule]
    whole = ir.node("Slice", [x, zero, ints("end", [4]), last, step])
    half = ir.node("Slice", [x, two, ints("end2", [4]), last, step])
    whole.outputs[0].shape, half.outputs[0].shape = ir.Shape([4, 4]), ir.Shape([4, 2])
    assert len(_offered(collapse, whole)) == 2
    assert _offered(collapse, half) == []  # begins at 2, and its output is not its input's shape


def test_number_constants_are_read_as_tensors() -> None:
    """A Constant's value_ints (torchlib's shapes) becomes the int64 tensor ONNX defines it as, given as its value
    attribute, so that folding and rewriting read it without making a new array each time; the optimized model is
    the one onnxscript's optimizer makes of the original."""
    x = _float_value("x", [2, 6])
    shape = ir.node("Constant", [], attributes={"value_ints": [3, 4]})
    scale = ir.node("Constant", [], attributes={"value_float": 2.0})
    reshape = ir.node("Reshape", [x, shape.outputs[0]])
    mul = ir.node("Mul", [reshape.outputs[0], scale.outputs[0]])
    for index, node in enumerate((shape, scale, reshape, mul)):
        node.outputs[0].name = f"v{index}"
    mul.outputs[0].type, mul.outputs[0].shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([3, 4])
    graph = ir.Graph([x], [mul.outputs[0]], nodes=[shape, scale, reshape, mul], opset_imports={"": 18})
    proto = ir.to_proto(ir.Model(graph, ir_version=8))
    ours, theirs = ir.from_proto(proto), ir.from_proto(proto)
    converted = ir.from_proto(proto)
    optimizer._number_constants_as_tensors(converted.graph)
    constants = [node for node in converted.graph if node.op_type == "Constant"]
    assert [list(node.attributes) for node in constants] == [["value"], ["value"]]
    first, second = (node.attributes["value"].value for node in constants)
    assert (first.dtype, first.numpy().tolist()) == (ir.DataType.INT64, [3, 4])
    assert (second.dtype, second.shape, second.numpy().tolist()) == (ir.DataType.FLOAT, ir.Shape([]), 2.0)
    optimizer.optimize(ours)
    onnxscript.optimizer.optimize_ir(theirs)
    ours_proto, theirs_proto = ir.to_proto(ours), ir.to_proto(theirs)
    for proto_graph in (ours_proto.graph, theirs_proto.graph):
        del proto_graph.value_info[:]  # optimize_ir infers shapes again (see the module docstring)
    assert [node.op_type for node in ours_proto.graph.node] == ["Reshape", "Mul"]
    assert ours_proto.SerializeToString(deterministic=True) == theirs_proto.SerializeToString(deterministic=True)


def test_fold_passes_over_only_nodes_it_cannot_change() -> None:
    """The fold visits a MatMul of activations no more (nothing of it is constant, no input has a symbolic
    value); it still visits the Constant, the Shape (a partial evaluator), the Transpose of a weight, and what reads
    a value the fold knows symbolically, and folds as fold_constants_ir does."""
    fold = optimizer._fold_pass()
    assert fold is not None
    visited: list[str] = []
    base_visit = type(fold).__mro__[1].visit_node

    def recording_visit(self: object, node: ir.Node, root: object) -> None:
        visited.append(node.op_type)
        base_visit(self, node, root)

    x, y = _float_value("x", [2, 3]), _float_value("y", [3, 2])
    weight = ir.Value(name="w", const_value=ir.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), name="w"))
    weight.type, weight.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([2, 3])
    matmul = ir.node("MatMul", [x, y])
    transpose = ir.node("Transpose", [weight], attributes={"perm": [1, 0]})
    shape = ir.node("Shape", [x])
    reshape = ir.node("Reshape", [matmul.outputs[0], shape.outputs[0]])
    add = ir.node("Add", [reshape.outputs[0], x])
    nodes = [matmul, transpose, shape, reshape, add]
    for index, node in enumerate(nodes):
        node.outputs[0].name = f"v{index}"
    for node, dims in ((matmul, [2, 2]), (transpose, [3, 2]), (reshape, [2, 3]), (add, [2, 3])):
        node.outputs[0].type, node.outputs[0].shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(dims)
    outputs = [add.outputs[0], transpose.outputs[0]]
    proto = ir.to_proto(
        ir.Model(ir.Graph([x, y], outputs, nodes=nodes, initializers=[weight], opset_imports={"": 18}), ir_version=8)
    )
    ours, theirs = ir.from_proto(proto), ir.from_proto(proto)
    type(fold).__mro__[1].visit_node = recording_visit
    try:
        fold(ours)
    finally:
        type(fold).__mro__[1].visit_node = base_visit
    assert "MatMul" not in visited
    assert {"Transpose", "Shape", "Reshape", "Add"} <= set(visited)
    onnxscript.optimizer.fold_constants_ir(theirs, onnx_shape_inference=False)
    assert [n.op_type for n in ours.graph] == [n.op_type for n in theirs.graph]
    assert ir.to_proto(ours).SerializeToString(deterministic=True) == ir.to_proto(theirs).SerializeToString(
        deterministic=True
    )


def _two_node_model(input_type: ir.DataType = ir.DataType.FLOAT) -> ir.Model:
    x = ir.Value(name="x", type=ir.TensorType(input_type), shape=ir.Shape([2]))
    relu = ir.node("Relu", [x], name="relu", metadata_props={FX_NODE: "relu_1", TARGET: "aten.relu.default"})
    relu.outputs[0].name = "y"
    neg = ir.node("Neg", [relu.outputs[0]], name="neg", metadata_props={FX_NODE: "neg_1"})
    neg.outputs[0].name = "z"
    for value in (relu.outputs[0], neg.outputs[0]):
        value.type, value.shape = ir.TensorType(input_type), ir.Shape([2])
    graph = ir.Graph([x], [neg.outputs[0]], nodes=[relu, neg], opset_imports={"": 18}, name="g")
    return ir.Model(graph, ir_version=8)


def _rename(model: ir.Model, change: str) -> None:
    relu, neg = list(model.graph)
    if change == "value named as another":
        neg.outputs[0].name = "y"
    elif change == "value named as an input":
        relu.outputs[0].name = "x"
    elif change == "unnamed value":
        relu.outputs[0].name = ""
    elif change == "node named as another":
        neg.name = "relu"
    elif change == "unnamed node":
        neg.name = ""


@pytest.mark.parametrize(
    "change",
    [
        "none",
        "value named as another",
        "value named as an input",
        "unnamed value",
        "node named as another",
        "unnamed node",
    ],
)
def test_name_fix_is_left_out_only_where_it_would_rename_nothing(change: str) -> None:
    model = _two_node_model()
    _rename(model, change)
    needed = graph_walks.names_need_fixing(model)
    assert needed == (change != "none")
    assert common_passes.NameFixPass()(model).modified == needed  # the check agrees with the pass it spares


@pytest.mark.parametrize("change", ["none", "input as an output", "output listed twice", "an If's body"])
def test_output_fix_is_left_out_only_where_it_would_add_nothing(change: str) -> None:
    model = _two_node_model()
    graph = model.graph
    if change == "input as an output":
        graph.outputs.append(graph.inputs[0])
    elif change == "output listed twice":
        graph.outputs.append(graph.outputs[0])
    elif change == "an If's body":  # subgraphs: the pass decides
        bodies = {}
        for branch_name in ("then_branch", "else_branch"):
            identity = ir.node("Identity", [graph.inputs[0]], name=f"{branch_name}_identity")
            bodies[branch_name] = ir.Graph([], [identity.outputs[0]], nodes=[identity], name=branch_name)
        condition = ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
        graph.inputs.append(condition)
        branch = ir.node("If", [condition], attributes=bodies, name="if")
        branch.outputs[0].name = "w"
        graph.append(branch)
        graph.outputs.append(branch.outputs[0])
    needed = graph_walks.outputs_need_fixing(model)
    assert needed == (change != "none")
    if change != "an If's body":
        assert common_passes.OutputFixPass()(model).modified == needed  # the check agrees with the pass it spares


def test_the_checker_reads_no_node_metadata_and_leaves_it_as_it_was() -> None:
    model = _two_node_model()
    before = [dict(node.metadata_props) for node in model.graph]
    check_model(model)
    assert [dict(node.metadata_props) for node in model.graph] == before
    invalid = _two_node_model(ir.DataType.STRING)  # Relu of strings: refused by the checker's strict inference
    with pytest.raises(InvalidModelError, match=re.escape("from FX node `relu_1` (aten.relu.default)")):
        check_model(invalid)
    assert [dict(node.metadata_props) for node in invalid.graph] == before


def test_chained_clamps_are_not_fused_into_one_clip() -> None:
    """onnxscript's Clip(Clip(x)) and Relu(Clip(x)) fusions take the bounds' intersection, wrong where the ranges are
    apart: clamp(0, 1) then clamp(2, 3) is 2 (the fused Clip(x, 2, 1) gave 1), relu of clamp(-3, -1) is 0 (gave -1),
    and crossed bounds (fuzz seed 40000786). Clip(Relu(x)) fuses right and is kept."""

    def clamps(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.clamp(0, 1).clamp(2, 3),
            torch.relu(x.clamp(-3, -1)),
            x.relu().clamp(-3, -1),
            x.clamp(-0.5, -3).clamp(1, -1),
            torch.nn.functional.hardtanh(x.clamp(0, 1), 2, 3),
        )

    assert_exports_and_matches(Call(clamps), (torch.tensor([-5.0, 0.5, 5.0, 8.0]),))


@pytest.mark.parametrize("length", [3, 5, 4])
def test_two_slices_of_an_odd_dim_are_not_split_in_halves(length: int) -> None:
    """onnxscript's SlicesSplit turns x[..., :n // 2] and x[..., n // 2:] into Split(x, num_outputs=2), whose first
    part is ceil(n / 2) long: for an odd n each slice got the wrong elements (roll([a, b, c], 2) gave [c, a, b],
    eager [b, c, a]; fuzz seed 60000074). The rule fires for an even n only."""
    half = length // 2
    x = torch.arange(2.0 * length).reshape(2, length)
    assert_exports_and_matches(Call(lambda x: (x[..., :half] * 2, x[..., half:] * 3)), (x,))
    assert_exports_and_matches(Call(lambda x: torch.roll(x, length - half, 1)), (x,))
