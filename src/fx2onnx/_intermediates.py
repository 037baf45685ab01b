"""Locate where an exported model starts to differ from eager: compare every FX node's value.

Eager side: the captured ATen graph, run node by node with ``torch.fx.Interpreter`` (the graph that
was emitted, so each node's value is what its ONNX value must equal). ONNX side: the model with an
extra graph output for each value named after an FX node (the emitter names the final value of each
FX node after it; user outputs carry the output's name). The optimizer may fold or rename some
values: those nodes are reported as missing and skipped. Nodes are compared in topological order;
the first one beyond tolerance is where the difference starts.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import onnx
import onnx_ir as ir
import torch
import torch.fx

from fx2onnx import _complex_layout as complex_layout
from fx2onnx import _dtypes as dtypes
from fx2onnx import _streaming as streaming
from fx2onnx._capture import CapturedGraph, from_exported_program
from fx2onnx._records import qualified_name
from fx2onnx._torch_ops import aten
from fx2onnx._verification import (
    OutputVerification,
    Verifications,
    compare,
    cpu_session,
    match_inputs,
    to_ortvalue,
    to_torch,
)
from fx2onnx.errors import source_frame, source_line

if TYPE_CHECKING:
    from fx2onnx.errors import SourceFrame

Status = Literal["ok", "mismatch", "missing", "skipped"]


class ONNXProgram(Protocol):
    """What this module reads of :class:`fx2onnx.program.ONNXProgram` (which calls it, so cannot be imported)."""

    model: ir.Model
    exported_program: torch.export.ExportedProgram | None
    captured: CapturedGraph | None
    report: Any
    weight_bytes: int
    model_proto: onnx.ModelProto

    def __getattr__(self, name: str) -> Any: ...


@dataclasses.dataclass
class NodeComparison:
    """One FX node's eager value against the ONNX value named after it."""

    index: int  # position in the FX graph (topological order)
    node: str
    target: str
    onnx_value: str | None  # None when the ONNX model no longer has a value for this node
    stack_trace: str | None
    result: OutputVerification | None
    note: str = ""

    @property
    def status(self) -> Status:
        if self.result is None:
            return "skipped" if self.note.startswith("skipped") else "missing"
        return "ok" if self.result.passed else "mismatch"

    @property
    def source(self) -> str | None:
        return source_line(self.stack_trace)

    @property
    def frame(self) -> SourceFrame | None:
        return source_frame(self.stack_trace)

    def __str__(self) -> str:
        text = f"`{self.node}` ({self.target})"
        if self.result is not None:
            r = self.result
            text += (
                f" as ONNX value `{self.onnx_value}`: dtype {r.actual_dtype} (eager {r.expected_dtype}), shape "
                f"{list(r.actual_shape)} (eager {list(r.expected_shape)}), max abs err {r.max_abs_error:.3g}, "
                f"max rel err {r.max_rel_error:.3g}"
            )
        elif self.note:
            text += f": {self.note}"
        if self.source:
            text += f"\n    from: {self.source}"
        return text


class Verification(Verifications):  # list[OutputVerification], as ``ONNXProgram.verify`` returns
    """The per-output comparison, plus the per-node comparison that locates the first difference."""

    def __init__(self, outputs: Sequence[OutputVerification], intermediates: Sequence[NodeComparison]) -> None:
        super().__init__(outputs)
        self.intermediates = list(intermediates)

    @property
    def first_mismatch(self) -> NodeComparison | None:
        return next((c for c in self.intermediates if c.status == "mismatch"), None)

    @property
    def missing(self) -> list[NodeComparison]:
        return [c for c in self.intermediates if c.status == "missing"]

    def __str__(self) -> str:
        lines = [str(r) for r in self]
        compared = sum(1 for c in self.intermediates if c.result is not None)
        lines.append(f"{compared} of {len(self.intermediates)} FX node values compared")
        first = self.first_mismatch
        lines.append(f"first differing node: {first}" if first else "no FX node differs beyond tolerance")
        return "\n".join(lines)


def verify_with_intermediates(
    program: ONNXProgram,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> Verification:
    """``program.verify(..., intermediates=True)``: outputs and every FX node compared with eager."""
    outputs = program.verify(*args, rtol=rtol, atol=atol, **kwargs)
    nodes = compare_intermediates(program, args, kwargs, rtol=rtol, atol=atol)
    result = Verification(outputs, nodes)
    if program.report is not None:
        program.report.verification = result
    return result


def compare_intermediates(
    program: ONNXProgram,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> list[NodeComparison]:
    """Compare each FX node's eager value with its ONNX value, in topological order."""
    captured = _captured_graph(program)
    # In the exported order, nested dicts matched by key (as program(...) does), not in the caller's order.
    flat = [value for _, value in match_inputs(captured.in_spec, args, dict(kwargs), program._module)]
    names = _onnx_names(captured, [v.name for v in program.model.graph.outputs])
    available = _available_values(program.model)
    wanted = {node: next((n for n in candidates if n in available), None) for node, candidates in names.items()}
    onnx_values = _run_onnx(program, [n for n in wanted.values() if n is not None], flat)

    comparisons: list[NodeComparison] = []
    broken: list[str] = []  # the captured graph's assertions this input breaks
    after_if = _after_an_if(program.model)
    for index, (node, eager) in enumerate(_eager_values(captured, flat, broken)):
        if node.op != "call_function" or not isinstance(eager, torch.Tensor):
            continue
        target = _target_name(node)
        trace = node.meta.get("stack_trace")
        name = wanted.get(node)
        if _is_random(node):
            comparisons.append(NodeComparison(index, node.name, target, name, trace, None, "skipped: random op"))
            continue
        if broken and name in after_if:
            note = f"skipped: {OTHER_SIDE} ({broken[0]})"
            comparisons.append(NodeComparison(index, node.name, target, name, trace, None, note))
            continue
        if name is None:
            note = "no ONNX value is named after this node (folded or renamed by the optimizer)"
            comparisons.append(NodeComparison(index, node.name, target, None, trace, None, note))
            continue
        actual = onnx_values[name]
        if eager.is_complex() and actual.dim() == eager.dim() + 1:  # (..., 2) real layout (complex_layout)
            actual = torch.view_as_complex(actual.contiguous())
        result = compare(node.name, eager, actual, rtol=rtol, atol=atol)
        comparisons.append(NodeComparison(index, node.name, target, name, trace, result))
    return comparisons


# --- the eager side --------------------------------------------------------------------------------
def _captured_graph(program: ONNXProgram) -> CapturedGraph:
    captured = getattr(program, "captured", None)
    if captured is not None:
        return captured
    if program.exported_program is None:
        raise ValueError("intermediates=True needs the captured FX graph, and this program keeps none")
    return from_exported_program(program.exported_program, "torch.export")


# A branch on a value (``if x.sum() > 0``) is captured once per side and joined in an If; the graph compared here
# is the general capture, whose assertion of its side (``u0 >= 1``) an input taking the other side breaks. Its
# nodes after the If are that side's values, which eager does not compute for such an input: not compared.
OTHER_SIDE = "this input takes the other side of a branch the ONNX model joins in an If, not this graph's"


def _after_an_if(model: ir.Model) -> set[str]:
    """Names of the main graph's values an If computes, or that are computed from one."""
    after: set[str] = set()
    for node in model.graph:
        if node.op_type == "If" or any(value is not None and value.name in after for value in node.inputs):
            after.update(value.name for value in node.outputs if value.name)
    return after


def _eager_values(
    captured: CapturedGraph, flat_inputs: Sequence[Any], broken: list[str] | None = None
) -> Iterator[tuple[torch.fx.Node, Any]]:
    """Run the ATen graph node by node, yielding (node, value) in graph order; values are freed after last use.

    A run-time assertion of the graph that fails is appended to `broken` (when given) and the run goes on: the
    nodes it guards are computed as the graph says (the side of a value branch the capture took)."""
    user_placeholders = [n for n in captured.graph.nodes if n.op == "placeholder" and n not in captured.weights]
    if len(user_placeholders) != len(flat_inputs):
        raise ValueError(
            f"the captured graph takes {len(user_placeholders)} inputs besides its weights, but the call gives "
            f"{len(flat_inputs)} once flattened; call verify with the arguments given to export"
        )
    inputs = iter(flat_inputs)  # user inputs, including those specialised to constants, in flat order
    placeholders = [
        captured.weights[node][1] if node in captured.weights else next(inputs)
        for node in captured.graph.nodes
        if node.op == "placeholder"
    ]
    last_user: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in captured.graph.nodes:
        for used in node.all_input_nodes:
            last_user[used] = node
    freed_after: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for used, user in last_user.items():
        freed_after.setdefault(user, []).append(used)

    interpreter = torch.fx.Interpreter(captured.graph_module, garbage_collect_values=False)
    interpreter.args_iter = iter(placeholders)
    with torch.no_grad():
        for node in captured.graph.nodes:
            if node.op == "output":
                break
            try:
                value = interpreter.run_node(node)
            except RuntimeError as error:
                if broken is None or node.target is not aten._assert_scalar.default:
                    raise
                broken.append(str(error).strip())
                value = None
            interpreter.env[node] = value
            yield node, value
            for used in freed_after.get(node, []):
                interpreter.env.pop(used, None)


def _target_name(node: torch.fx.Node) -> str:
    try:
        return qualified_name(node.target)
    except TypeError:
        return str(node.target)


def _is_random(node: torch.fx.Node) -> bool:
    tags = getattr(node.target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


# --- the ONNX side ---------------------------------------------------------------------------------
def _onnx_names(captured: CapturedGraph, output_names: Sequence[str]) -> dict[torch.fx.Node, list[str]]:
    """Each FX node -> the ONNX value names that may hold its value, best first."""
    names: dict[torch.fx.Node, list[str]] = {}
    for node in captured.graph.nodes:
        if node.op != "call_function":
            continue
        candidates = [node.name]
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            candidates.append(f"{node.args[0].name}_{node.args[1]}")  # an item of a multi-output node
        names[node] = candidates
    for node, name in zip([o for o in captured.user_outputs if o is not None], output_names):  # Nones have none
        if isinstance(node, torch.fx.Node) and node in names:
            names[node].insert(0, name)  # outputs are renamed after the user's output names
    return names


def _available_values(model: ir.Model) -> dict[str, ir.Value]:
    """Values of the main graph that can be made graph outputs, by name."""
    values: dict[str, ir.Value] = {}
    for node in model.graph:
        for value in node.outputs:
            if value.name:
                values[value.name] = value
    for name, value in model.graph.initializers.items():
        values.setdefault(name, value)
    return values


def _run_onnx(program: ONNXProgram, names: Sequence[str], flat_inputs: Sequence[Any]) -> dict[str, torch.Tensor]:
    """Run the model with the given values as extra outputs; returns them as torch tensors."""
    import onnxruntime

    available = _available_values(program.model)
    results: dict[str, torch.Tensor] = {}
    to_run: list[str] = []
    for name in dict.fromkeys(names):
        value = available[name]
        if value.const_value is not None and value.producer() is None:  # an initializer: no need to run
            results[name] = _initializer_as_torch(value.const_value)
        else:
            to_run.append(name)
    if not to_run:
        return results

    tensors = [complex_layout.as_real(x) for x in flat_inputs if isinstance(x, torch.Tensor)]
    with tempfile.TemporaryDirectory() as folder:
        large = program.weight_bytes > streaming.EXTERNAL_DATA_THRESHOLD
        if large:  # protobuf cannot hold it: go through a file with external data
            path = os.path.join(folder, "model.onnx")
            program.save(path, external_data=True, durable=False)  # a temporary file
            proto = onnx.load(path, load_external_data=False)
        else:
            proto = program.model_proto
        existing = {o.name for o in proto.graph.output}
        for name in to_run:
            if name not in existing:
                proto.graph.output.append(_value_info(name, available[name]))
        if large:
            onnx.save(proto, path)
        source = path if large else proto.SerializeToString()
        session = cpu_session(source, program.model)
        input_names = [i.name for i in session.get_inputs()]
        feed = {name: to_ortvalue(onnxruntime, tensor) for name, tensor in zip(input_names, tensors)}
        outputs = session.run_with_ort_values(to_run, feed)
    results.update({name: to_torch(value) for name, value in zip(to_run, outputs)})
    return results


def _initializer_as_torch(tensor: ir.TensorProtocol) -> torch.Tensor:
    array = tensor.numpy()
    try:
        return torch.from_numpy(array.copy())
    except TypeError:  # numpy has no such dtype (bfloat16, float8: ml_dtypes arrays): reinterpret its bytes
        torch_dtype = dtypes.to_torch(tensor.dtype)
        if torch_dtype is None:
            raise
        return torch.from_numpy(array.view(f"u{array.dtype.itemsize}").copy()).view(torch_dtype)


def _value_info(name: str, value: ir.Value) -> onnx.ValueInfoProto:
    if value.dtype is None:
        info = onnx.ValueInfoProto()
        info.name = name
        return info
    return onnx.helper.make_tensor_value_info(name, int(value.dtype), None)


__all__ = ["NodeComparison", "Verification", "compare_intermediates", "verify_with_intermediates"]
