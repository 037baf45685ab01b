"""Control flow: torch.cond -> If, while_loop -> Loop, scan/map -> Scan.

Each model is run in ONNX Runtime on inputs that take the other branch (or another trip count) than the
example it was exported with, so a model that froze the example's path fails.
"""

from __future__ import annotations

import inspect
import os

import onnx_ir as ir
import onnxruntime
import pytest
import torch
from torch._higher_order_ops.map import map as torch_map
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop
from torch.export import Dim

import fx2onnx
from fx2onnx.errors import UnsupportedOperatorError, source_frame

from conftest import assert_exports_and_matches as check


def _ops(program: fx2onnx.ONNXProgram) -> list[str]:
    """Op types of every node, subgraphs included."""
    return [node.op_type for node in ir.traversal.RecursiveGraphIterator(program.model.graph)]


def _subgraphs(program: fx2onnx.ONNXProgram) -> list[ir.Graph]:
    found = []
    for node in ir.traversal.RecursiveGraphIterator(program.model.graph):
        found += [a.value for a in node.attributes.values() if a.type == ir.AttributeType.GRAPH]
    return found


# --- torch.cond -> If -------------------------------------------------------------------------------
class SinOrScaledCos(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x.sin() + 1, lambda x: x.cos() * 2, (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cond_runs_the_branch_the_input_chooses(dtype: torch.dtype) -> None:
    x = torch.rand(4, 3).add(0.1).to(dtype)
    program = check(SinOrScaledCos(), (x,), run_with=[((x,), {}), ((-x,), {})])
    assert "If" in _ops(program)
    # The bfloat16 Sin/Cos inside the branches compute in float32 (ONNX Runtime has no bfloat16 kernel).
    if dtype == torch.bfloat16:
        branch_ops = [n.op_type for graph in _subgraphs(program) for n in graph]
        assert "Cast" in branch_ops and "Sin" in branch_ops and "Cos" in branch_ops
        legalized = {c.node for c in program.report.casts if c.reason.startswith("legalize")}
        assert any(name.startswith(("true_graph_0.", "false_graph_0.")) for name in legalized), legalized


class IntegerBranches(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # sin of an integer tensor computes in float32 (promotion inside the branch); the other branch converts.
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: (x * 3 - 1).float(), (x,))


def test_cond_whose_branches_the_registry_lowers_is_not_decomposed() -> None:
    from fx2onnx._capture import CONTROL_FLOW_OPERATORS
    from fx2onnx._emit.control_flow import EMITTERS

    assert set(EMITTERS) == CONTROL_FLOW_OPERATORS  # capture's list of bodies it checks = what emit lowers
    x = torch.randn(4, 3)
    program = check(SinOrScaledCos(), (x,))
    assert program.report.capture_seconds["decomposition"] == 0.0  # torch's decomposition never ran
    assert not program.report.decomposed


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_cond_on_integer_inputs_promotes_inside_branches(dtype: torch.dtype) -> None:
    x = torch.tensor([[1, -2, 3], [4, 5, -6]], dtype=dtype)
    program = check(IntegerBranches(), (x,), run_with=[((x,), {}), ((-x,), {})])
    promoted = [c for c in program.report.promotion_casts if c.node.startswith("true_graph_0.")]
    assert promoted and promoted[0].to_dtype == "f32"


class DecomposedInBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # copysign has no implementation of its own: torch's full decomposition table applies, in branches too.
        return torch.cond(x.sum() > 0, lambda x, y: torch.copysign(x, y), lambda x, y: x - y, (x, y))


def test_ops_decomposed_by_the_fallback_table_inside_a_branch() -> None:
    x, y = torch.rand(5) + 0.1, torch.randn(5)
    check(DecomposedInBranch(), (x, y), run_with=[((x, y), {}), ((-x, y), {})])


class SeveralOutputs(torch.nn.Module):
    def forward(self, x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
        def then(x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x.clone(), k * 2, x.argmax(1)

        def otherwise(x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x.cos().exp(), k.clone(), (x > 0).sum(1)

        return torch.cond(k.sum() > 3, then, otherwise, (x, k))


def test_cond_with_several_outputs_of_different_dtypes() -> None:
    x = torch.randn(4, 3)
    program = check(
        SeveralOutputs(),
        (x, torch.tensor([1, 5])),
        run_with=[((x, torch.tensor([1, 5])), {}), ((x, torch.tensor([1, 1])), {})],
    )
    assert [v.dtype for v in program.model.graph.outputs] == [ir.DataType.FLOAT, ir.DataType.INT64, ir.DataType.INT64]


class WeightsInBranches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wide = torch.nn.Linear(64, 64)
        self.narrow = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.mean() > 0, lambda x: self.wide(x).relu(), lambda x: self.narrow(x.tanh()), (x,))


def test_weights_used_in_branches_stay_main_graph_initializers(tmp_path: os.PathLike[str]) -> None:
    torch.manual_seed(0)
    x = torch.rand(2, 64)
    program = check(WeightsInBranches(), (x,), run_with=[((x,), {}), ((-x,), {})])
    assert {"wide.weight", "narrow.weight"} <= set(program.model.graph.initializers)
    assert all(not graph.initializers for graph in _subgraphs(program))
    path = os.path.join(tmp_path, "model.onnx")
    program.save(path, external_data=True)  # the weights go to the data file, read by the branches
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    model = WeightsInBranches()
    model.load_state_dict({k: v for k, v in program.exported_program.state_dict.items()})
    for sample in (x, -x):
        (result,) = session.run(None, {"x": sample.numpy()})
        torch.testing.assert_close(torch.from_numpy(result), model(sample), rtol=1e-5, atol=1e-5)


class NestedCond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def outer_true(x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.mean() > 0.5, lambda x: self.linear(x), lambda x: x - 1, (x,))

        return torch.cond(x.sum() > 0, outer_true, lambda x: x.abs().sqrt(), (x,))


def test_nested_cond_takes_each_of_its_three_paths() -> None:
    big, small = torch.full((2, 3), 0.9), torch.full((2, 3), 0.1)
    program = check(NestedCond(), (big,), run_with=[((big,), {}), ((small,), {}), ((-big,), {})])
    assert _ops(program).count("If") == 2
    names = {d.node for d in program.report.decisions}
    assert "true_graph_0.true_graph_0.linear" in names and "true_graph_0.cond" in names


class ShapePredicate(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.shape[0] > 4, lambda x: x.sum(0, keepdim=True) * 2, lambda x: x[:1] + 1, (x,))


def test_cond_on_a_dynamic_dimension() -> None:
    samples = [((torch.randn(n, 3),), {}) for n in (6, 3, 9)]
    program = check(
        ShapePredicate(), (torch.randn(6, 3),), run_with=samples, dynamic_shapes={"x": {0: Dim("batch", min=2)}}
    )
    assert program.model.graph.inputs[0].shape[0] == ir.SymbolicDim("batch")


# --- while_loop -> Loop -----------------------------------------------------------------------------
class DoubleUntil(torch.nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def condition(i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return i < n.sum()

        def body(i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, x * 2 - 1

        return while_loop(condition, body, (torch.tensor(0), x))


def test_while_loop_with_a_data_dependent_trip_count() -> None:
    x = torch.randn(4, 3)
    samples = [((x, torch.tensor([n])), {}) for n in (3, 0, 7)]  # 0: the loop body never runs
    program = check(DoubleUntil(), (x, torch.tensor([3])), run_with=samples)
    assert "Loop" in _ops(program)


class CollatzSteps(torch.nn.Module):
    """Integer carried values; the loop stops on a value computed in the body."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def condition(steps: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return (x > 1).any() & (steps < 200)

        def body(steps: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            stepped = torch.where(x % 2 == 0, x // 2, 3 * x + 1)
            return steps + 1, torch.where(x > 1, stepped, x)

        return while_loop(condition, body, (torch.tensor(0), x))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_while_loop_on_integers(dtype: torch.dtype) -> None:
    x = torch.tensor([6, 7], dtype=dtype)
    samples = [((x,), {}), ((torch.tensor([27, 1], dtype=dtype),), {}), ((torch.tensor([1, 1], dtype=dtype),), {})]
    check(CollatzSteps(), (x,), run_with=samples)


class LoopWithBranchAndWeights(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def condition(i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return i < n

        def body(i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.cond(i % 2 == 0, lambda x: self.linear(x).tanh(), lambda x: x * 1.5, (x,))
            return i + 1, y

        return while_loop(condition, body, (torch.tensor(0), x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_while_loop_with_a_cond_and_weights_in_its_body(dtype: torch.dtype) -> None:
    model = LoopWithBranchAndWeights().to(dtype)
    x = torch.randn(2, 3, dtype=dtype)
    samples = [((x, torch.tensor(n)), {}) for n in (3, 0, 4)]
    program = check(model, (x, torch.tensor(3)), run_with=samples)
    assert "Loop" in _ops(program) and "If" in _ops(program)


class ScaledSineLoop(torch.nn.Module):
    """A body reading an outer-scope bfloat16 tensor that ONNX Runtime's Mul needs in float32."""

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def condition(i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return i < 5

        def body(i: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, torch.sin(x) * w

        return while_loop(condition, body, (torch.tensor(0), x))


def test_legalization_casts_outer_scope_values_once_outside_the_loop() -> None:
    x, w = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)
    program = check(ScaledSineLoop(), (x, w), run_with=[((x, w), {}), ((x * 3, -w), {})])
    main_casts = [node.inputs[0].name for node in program.model.graph if node.op_type == "Cast"]
    assert "w" in main_casts  # converted to float32 once, before the Loop
    for body in _subgraphs(program):
        defined = {v.name for v in body.inputs} | {v.name for node in body for v in node.outputs}
        outer_casts = [n.inputs[0].name for n in body if n.op_type == "Cast" and n.inputs[0].name not in defined]
        assert not outer_casts, f"Casts of outer-scope values run on every iteration: {outer_casts}"


# --- scan / map -> Scan ------------------------------------------------------------------------------
class RunningSum(torch.nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def combine(carry: torch.Tensor, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            total = carry * 0.5 + row * w
            return total, total.sin().to(torch.int32)

        return scan(combine, torch.zeros(3), x, dim=1, reverse=True)


def test_scan_carries_state_and_stacks_results() -> None:
    x, w = torch.randn(3, 5) * 10, torch.randn(3)
    program = check(RunningSum(), (x, w), run_with=[((x, w), {}), ((x * 2, -w), {})])
    assert "Scan" in _ops(program)


class MapRows(torch.nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch_map(lambda row, bias: row.cos() + bias, x, bias)


def test_map_applies_its_body_to_each_row() -> None:
    x, bias = torch.randn(4, 3), torch.randn(3)
    program = check(MapRows(), (x, bias), run_with=[((x, bias), {}), ((torch.randn(4, 3), bias), {})])
    assert "Scan" in _ops(program)


# --- errors point at the user's line ----------------------------------------------------------------
@torch.library.custom_op("fx2onnx_test_control_flow::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class UnloweredOpInBranch(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: twice(x), lambda x: x.cos(), (x,))  # the line errors name


def test_an_op_without_implementation_in_a_branch_names_the_op_and_the_user_line() -> None:
    with pytest.raises(UnsupportedOperatorError) as caught:
        fx2onnx.export(UnloweredOpInBranch(), (torch.randn(3),))
    message = str(caught.value)
    assert "fx2onnx_test_control_flow::twice" in message and "true_graph_0.twice" in message
    line = inspect.getsourcelines(UnloweredOpInBranch.forward)[1] + 1
    assert f"{__file__}:{line} in forward" in message
    assert "<eval_with_key>" not in message
    assert caught.value.frame is not None and caught.value.frame.line == line


def test_source_frame_prefers_a_real_file_over_generated_code() -> None:
    trace = (
        'File "/src/model.py", line 12, in forward\n    return torch.cond(p, f, g, (x,))\n'
        'File "<eval_with_key>.5", line 9, in forward\n    cond = torch.ops.higher_order.cond(...)'
    )
    frame = source_frame(trace)
    assert frame is not None and (frame.path, frame.line) == ("/src/model.py", 12)
    only_generated = 'File "<eval_with_key>.6", line 6, in forward\n    sin = x.sin()'
    frame = source_frame(only_generated)
    assert frame is not None and frame.path == "<eval_with_key>.6"


def test_report_lists_the_branch_nodes_and_the_control_flow_node(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "report.md")
    program = fx2onnx.export(SinOrScaledCos(), (torch.randn(4, 3),), report=path)
    decisions = {d.node: d for d in program.report.decisions}
    assert decisions["cond"].target == "higher_order::cond"
    assert decisions["true_graph_0.sin"].target == "aten::sin"
    assert decisions["false_graph_0.cos"].target == "aten::cos"
    with open(path, encoding="utf-8") as file:
        text = file.read()
    assert "`higher_order::cond`" in text and "`aten::cos`" in text
    # The node count covers the branch bodies (as captured: before promotion added its constants), not only
    # the main graph's placeholder, sum, gt, two get_attr, cond, getitem and output.
    bodies = [m for n, m in program.exported_program.graph_module.named_children() if n.endswith("_graph_0")]
    captured = [n for m in bodies for n in m.graph.nodes if not n.name.startswith("_promoted_constant")]
    assert program.report.graph_nodes == len(program.exported_program.graph.nodes) + len(captured) == 16
