"""Run-time checks of what the capture assumed, so that an input breaking an assumption fails in ONNX Runtime
with a node named for it, never computing silently something else than eager.

What a captured graph is valid for, beyond the static dims ONNX Runtime checks itself:

- torch.export's deferred runtime assertions (``aten._assert_scalar``: guards the model's code put on dynamic or
  data-dependent sizes, ``Ne(s0, 1)``, ``Eq(Mod(s0, 2), 0)``, and the size-oblivious strategy's choices,
  ``Eq(u0, 3)``): lowered to check nodes by ``_lowerings/symbolic.py``; here renamed after the user's dims and
  source line;
- each dynamic input dim's range (``range_constraints``: ``Dim("n", min=2)``, a range the model's code implied,
  ``n >= 5``) and the relations between input dims (one ``Dim`` on two inputs, a derived ``2 * d``), which a
  symbolic ONNX dim does not check: checked here, at the start of the graph.

A check node is a ``Gather`` from a one-element tensor at index ``not condition``: a scalar 0 when the condition
holds, ONNX Runtime's "indices element out of data bounds" error naming the node when it does not. ONNX Runtime
drops nodes that no output reads, so the checks' sum is added to the shape a ``Reshape`` of the first output takes
(a Reshape copies nothing, and the output keeps its shape): a Constant, one Add per check and one Reshape per model.
They run first (ONNX Runtime orders the nodes by a walk up from the last one: see ``_feed_an_output``), before a
node that would fail on the same input with an error that explains nothing (a Reshape of an odd size, a broadcast).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
import sympy
import torch
from torch.utils._sympy import functions as sympy_functions
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from fx2onnx._capture import CapturedGraph
from fx2onnx._capture_size_one import SizeOneVerdict, decision_key
from fx2onnx._capture_strategies import (
    GENERAL_BRANCH,
    LOWERED_WHOLE,
    Assumption,
    assertion_key,
    parsed_expression,
)
from fx2onnx._records import CHECK_PREFIX, RUNTIME_CHECK, RUNTIME_CHECK_REASON, STACK_TRACE


@dataclasses.dataclass
class RuntimeChecks:
    """What the exported model checks at run time, and what it cannot (for the report and the warning)."""

    checked: list[str] = dataclasses.field(default_factory=list)
    unchecked: list[str] = dataclasses.field(default_factory=list)
    pending: int = 0  # the last outputs of the graph are the checks, until feed_an_output


class _Builder:
    """Nodes appended to a list (inserted into the graph by the caller), int64 [1] values.

    Their values are named here, under `prefix`: a graph names a value it is given unnamed from its own counter,
    which does not know the names in If/Loop bodies the optimizer has named (a check's ``val_14`` then shadowed a
    float in a body, breaking SSA)."""

    def __init__(self, prefix: str) -> None:
        self.nodes: list[ir.Node] = []
        self._constants: dict[int, ir.Value] = {}
        self._prefix = prefix

    def add(self, op_type: str, inputs: Sequence[ir.Value], name: str | None = None, **attributes: Any) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes or None, name=name)
        node.outputs[0].name = f"{self._prefix}{len(self.nodes)}"
        self.nodes.append(node)
        return node.outputs[0]

    def constant(self, value: int) -> ir.Value:
        if value not in self._constants:
            output = self.add("Constant", [], value=ir.tensor(np.array([value], dtype=np.int64)))
            output.dtype, output.shape = ir.DataType.INT64, ir.Shape([1])
            self._constants[value] = output
        return self._constants[value]

    def check(self, ok: ir.Value, name: str, assumption: str) -> ir.Value:
        index = self.add("Cast", [self.add("Not", [ok])], to=ir.DataType.INT64)
        index = self.add("Reshape", [index, self.add("Constant", [], value=ir.tensor(np.array([], dtype=np.int64)))])
        zero = self.add("Gather", [self.constant(0), index], name=name, axis=0)
        zero.producer().metadata_props[RUNTIME_CHECK] = assumption  # type: ignore[union-attr]
        zero.dtype, zero.shape = ir.DataType.INT64, ir.Shape([])
        return zero


class _Unexpressible(Exception):
    pass


def _to_onnx(expression: Any, symbols: Mapping[sympy.Symbol, ir.Value], build: _Builder) -> ir.Value:
    """An integer sympy expression of the input dims as an int64 [1] value (Python's floor division and modulo)."""

    def double(op_type: str, inputs: Sequence[ir.Value]) -> ir.Value:
        result = build.add(op_type, [_as_double(value, build) for value in inputs])
        result.dtype = ir.DataType.DOUBLE
        return result

    def walk(expr: Any) -> ir.Value:
        if isinstance(expr, sympy.Integer):
            return build.constant(int(expr))
        if isinstance(expr, sympy.Float):
            constant = build.add("Constant", [], value=ir.tensor(np.array([float(expr)], dtype=np.float64)))
            constant.dtype = ir.DataType.DOUBLE
            return constant
        if isinstance(expr, sympy.Symbol):
            if expr not in symbols:
                raise _Unexpressible(f"{expr} is no input's dim")
            return symbols[expr]
        arguments = [walk(argument) for argument in expr.args]
        # torch's float functions of sizes (``int(n ** 0.5)``: TruncToInt(FloatPow(ToFloat(n), 0.5))), in float64 as
        # Python computes them (IEEE: the same square root); a truncation back to int64 rounds toward zero, as int()
        if isinstance(expr, sympy_functions.ToFloat):
            return _as_double(arguments[0], build)
        if isinstance(expr, (sympy_functions.FloatPow, sympy_functions.FloatTrueDiv, sympy_functions.IntTrueDiv)):
            return double("Pow" if isinstance(expr, sympy_functions.FloatPow) else "Div", arguments)
        if isinstance(expr, (sympy_functions.TruncToInt, sympy_functions.CeilToInt, sympy_functions.FloorToInt)):
            rounded = arguments[0]
            if not isinstance(expr, sympy_functions.TruncToInt):
                rounded = double("Ceil" if isinstance(expr, sympy_functions.CeilToInt) else "Floor", [rounded])
            result = build.add("Cast", [rounded], to=ir.DataType.INT64)
            result.dtype = ir.DataType.INT64
            return result
        if isinstance(expr, (sympy.Add, sympy.Mul, sympy.Min, sympy.Max)):
            op_type = {sympy.Add: "Add", sympy.Mul: "Mul", sympy.Min: "Min", sympy.Max: "Max"}[type(expr)]
            if any(argument.dtype == ir.DataType.DOUBLE for argument in arguments):
                return functools.reduce(lambda a, b: double(op_type, [a, b]), arguments)
            result = arguments[0]
            for argument in arguments[1:]:
                result = build.add(op_type, [result, argument])
            return result
        if isinstance(expr, sympy_functions.FloorDiv):
            return floor_divide(*arguments)
        if isinstance(expr, (sympy_functions.PythonMod, sympy_functions.Mod)):
            return build.add("Sub", [arguments[0], build.add("Mul", [arguments[1], floor_divide(*arguments)])])
        if isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Integer) and int(expr.exp) >= 1:
            result = arguments[0]
            for _ in range(int(expr.exp) - 1):
                result = build.add("Mul", [result, arguments[0]])
            return result
        raise _Unexpressible(f"{type(expr).__name__} has no ONNX translation here")

    def floor_divide(a: ir.Value, b: ir.Value) -> ir.Value:
        quotient = build.add("Div", [a, b])  # truncates toward zero
        zero = build.constant(0)
        inexact = build.add("Not", [build.add("Equal", [build.add("Mul", [quotient, b]), a])])
        signs_differ = build.add("Xor", [build.add("Less", [a, zero]), build.add("Less", [b, zero])])
        return build.add("Sub", [quotient, build.add("Cast", [build.add("And", [inexact, signs_differ])], to=7)])

    return walk(expression)


def _as_double(value: ir.Value, build: _Builder) -> ir.Value:
    if value.dtype == ir.DataType.DOUBLE:
        return value
    cast = build.add("Cast", [value], to=ir.DataType.DOUBLE)
    cast.dtype = ir.DataType.DOUBLE
    return cast


_RELATIONS = {
    sympy.Eq: "Equal",
    sympy.Ne: "Equal",  # negated below
    sympy.StrictLessThan: "Less",
    sympy.LessThan: "LessOrEqual",
    sympy.StrictGreaterThan: "Greater",
    sympy.GreaterThan: "GreaterOrEqual",
}


def condition_to_onnx(
    expression: Any, symbols: Mapping[sympy.Symbol, ir.Value], prefix: str
) -> tuple[list[ir.Node], ir.Value]:
    """A sympy condition over sizes (``Eq(u0, 0)``, ``u0 > 1``, their And/Or/Not) as nodes computing a 0-d bool, the
    condition of an ``If`` (`symbols`: int64 [1] values). Raises ValueError when it has no ONNX translation here."""
    build = _Builder(prefix)

    def walk(expr: Any) -> ir.Value:
        if expr in (sympy.true, sympy.false):
            return build.add("Cast", [build.constant(int(bool(expr)))], to=ir.DataType.BOOL)
        if isinstance(expr, sympy.Not):
            return build.add("Not", [walk(expr.args[0])])
        if isinstance(expr, (sympy.And, sympy.Or)):
            parts = [walk(argument) for argument in expr.args]
            result = parts[0]
            for part in parts[1:]:
                result = build.add("And" if isinstance(expr, sympy.And) else "Or", [result, part])
            return result
        op_type = _RELATIONS.get(type(expr))
        if op_type is None:
            raise ValueError(f"{type(expr).__name__} has no ONNX translation here")
        try:
            sides = [_to_onnx(side, symbols, build) for side in (expr.lhs, expr.rhs)]
        except _Unexpressible as error:
            raise ValueError(str(error)) from None
        if any(side.dtype == ir.DataType.DOUBLE for side in sides):
            sides = [_as_double(side, build) for side in sides]
        result = build.add(op_type, sides)
        return build.add("Not", [result]) if isinstance(expr, sympy.Ne) else result

    scalar = build.add(
        "Reshape", [walk(expression), build.add("Constant", [], value=ir.tensor(np.array([], np.int64)))]
    )
    for node in build.nodes:  # typed: legalization reads every node's types
        value = node.outputs[0]
        if value.dtype is not None:  # typed where made (the float64 nodes of torch's float functions)
            continue
        if node.op_type == "Cast":
            value.dtype = ir.DataType(node.attributes["to"].as_int())
        elif node.op_type == "Reshape":
            value.dtype = node.inputs[0].dtype  # type: ignore[union-attr]
        elif node.op_type in ("Constant", "Add", "Mul", "Sub", "Div", "Min", "Max"):
            value.dtype = ir.DataType.INT64
        else:
            value.dtype = ir.DataType.BOOL
    scalar.shape = ir.Shape([])
    return build.nodes, scalar


def _named(expression: Any, symbol_names: Mapping[sympy.Symbol, str]) -> str:
    text = str(expression)
    for symbol, name in symbol_names.items():
        text = re.sub(rf"\b{re.escape(str(symbol))}\b", name, text)
    return text


def asked_minimums(
    captured: CapturedGraph, requested: Mapping[tuple[int, int], Any], flat_inputs: Sequence[Any]
) -> dict[tuple[str, int], int]:
    """(placeholder name, dim) -> the minimum `dynamic_shapes` gave that dim (a ``Dim``'s ``min``), keyed as
    `requested` is (:func:`fx2onnx._capture_dims.dynamic_dims`) by the example tensor's id."""
    tensors = [x for x in flat_inputs if isinstance(x, torch.Tensor)]
    minimums = {}
    for node, example in zip(captured.user_inputs, tensors):
        for (tensor_id, dim), spec in requested.items():
            minimum = getattr(spec, "min", None)
            if tensor_id == id(example) and isinstance(minimum, int):
                minimums[(node.name, dim)] = minimum
    return minimums


# A dynamic dim traced size-obliviously: ``size == 1`` (or ``== 0``) is decided False, the general branch, and
# torch.export asserts ``Ne(s, 1)``. Not checked: the general branch is eager's result on 0 and 1 too where the
# special branch only saves work or picks an equivalent kernel (Hugging Face's sdpa_attention on a one-token query,
# a decoding step), and checking it would refuse those sizes, which the exported model is meant to take.


# Where the model's code compares a backed input dim with 1, the capture ran the general branch at size 1 at export
# (_capture_size_one.py): the same as eager there, it stays unchecked; otherwise size 1 is refused at
# run time, naming the model's line, rather than computing the general branch's result.
GENERAL_BRANCH_SAME = "compared with eager at size 1 at export: the same"
GENERAL_BRANCH_JOINED = (
    "the general branch differs from eager at size 1, or could not be compared there, at export: the special branch "
    "captured at size 1 too, the ONNX model's If chooses at run time"
)
GENERAL_BRANCH_DIFFERS = (
    "the general branch differs from eager at size 1, or could not be compared there, at export: size 1 is refused"
)


def _size_one_verdict(captured: CapturedGraph, expression: str) -> SizeOneVerdict | None:
    """The export's comparison with eager at size 1 of the general branch of ``Ne(s, 1)``, on an input dim `s` or a
    sum or product of input dims."""
    if not captured.size_one_verdicts:
        return None
    parsed = parsed_expression(expression)
    if not isinstance(parsed, sympy.Ne) or sympy.Integer(1) not in parsed.args:
        return None
    (side,) = [argument for argument in parsed.args if argument != sympy.Integer(1)] or [sympy.Integer(1)]
    key = decision_key(side, captured.user_inputs)
    return None if key is None else captured.size_one_verdicts.get(key)


def _general_branch(expression: str) -> bool:
    parsed = parsed_expression(expression)
    if isinstance(parsed, sympy.Ne):  # size != 0, size != 1
        return any(isinstance(side, sympy.Symbol) for side in parsed.args) and any(
            side in (sympy.Integer(0), sympy.Integer(1)) for side in parsed.args
        )
    if isinstance(parsed, (sympy.LessThan, sympy.StrictLessThan)):
        parsed = parsed.reversed
    # size >= 2, size > 1 (an unbacked count decided size-obliviously: SSD's boxes after NMS, 0 or 1 on a gray image)
    return isinstance(parsed, (sympy.GreaterThan, sympy.StrictGreaterThan)) and (
        isinstance(parsed.lhs, sympy.Symbol) and parsed.rhs == (2 if isinstance(parsed, sympy.GreaterThan) else 1)
    )


EVERY_NONEMPTY_SIZE = "true for every size of at least 1"


def _holds_for_every_nonempty_size(expression: str) -> bool:
    """Whether the assertion holds wherever every input dim is at least 1 (``1 < 3*height*width``, a conv's check
    that its input is not empty): an assumption no user's dynamic dim can break but by an empty input. Unbacked
    symbols (``u0``: a count or an ``item()``) may be anything."""
    parsed = parsed_expression(expression)
    if not isinstance(parsed, sympy.Basic) or not parsed.free_symbols:
        return False
    ranges = {
        symbol: ValueRanges(1, sympy.oo) if re.fullmatch(r"s\d+", symbol.name) else ValueRanges.unknown_int()
        for symbol in parsed.free_symbols
    }
    try:
        bound = bound_sympy(parsed, ranges)
    except Exception:  # sympy and torch failing to bound an expression is no failure of the export
        return False
    return bound.lower is sympy.true and bound.upper is sympy.true


def _users_own_check(line: str | None) -> bool:
    """Whether the model's line that asked is its own ``torch._check(...)``: the model states the condition
    (``torch._check(kept.shape[0] >= 2)``), and eager raises where it is false, so the ONNX model checks it, even
    in the form a size-oblivious decision takes (``u0 >= 2``, else left unchecked as the general branch)."""
    code = (line or "").partition(": ")[2]
    return re.search(r"\b_check(_with)?\(", code) is not None


def _recorded_line(captured: CapturedGraph, expression: str) -> str | None:
    """The line the capture recorded for an assertion; the graph prints its expression otherwise than sympy does
    (``1 < (Mod(s0, 3))`` for ``Mod(s0, 3) > 1``): read back by sympy when the text alone does not match."""
    line = captured.assertion_lines.get(assertion_key(expression))
    if line is None:
        parsed = parsed_expression(expression)
        if parsed is None:
            return None
        forms = [parsed] + ([parsed.reversed] if isinstance(parsed, sympy.core.relational.Relational) else [])
        line = next(
            (captured.assertion_lines[k] for k in map(assertion_key, map(str, forms)) if k in captured.assertion_lines),
            None,
        )
    return line


def _short_line(line: str) -> str:
    """``/path/to/model.py:12 in forward: code`` -> ``model.py:12 in forward: code``."""
    path, _, rest = line.partition(":")
    return f"{os.path.basename(path)}:{rest}" if rest else line


def _line_of_trace(trace: str) -> str:
    """The last frame of a stack trace as ``file.py:line in function: code``."""
    found = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    if not found:
        return ""
    path, line, function, code = found[-1]
    return f"{os.path.basename(path)}:{line} in {function}: {code.strip()}"


def _input_dims(captured: CapturedGraph, graph: ir.Graph) -> list[tuple[ir.Value, int | None, Any, str]]:
    """(graph input, dim or None for a symbolic int input, sympy expression, placeholder name) for each symbolic size
    of an input."""
    placeholders = [
        node
        for node in captured.graph.nodes
        if node.op == "placeholder" and node not in captured.weights and node not in captured.constant_inputs
    ]
    if len(placeholders) != len(graph.inputs):
        return []
    found = []
    for node, value in zip(placeholders, graph.inputs):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for index, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and not isinstance(size.node.expr, sympy.Integer):
                    found.append((value, index, size.node.expr, node.name))
        elif isinstance(val, torch.SymInt) and not isinstance(val.node.expr, sympy.Integer):
            found.append((value, None, val.node.expr, node.name))
    return found


def _input_checks(
    captured: CapturedGraph,
    graph: ir.Graph,
    symbol_names: Mapping[sympy.Symbol, str],
    asked_minimums: Mapping[tuple[str, int], int],
    found: RuntimeChecks,
) -> tuple[list[ir.Node], list[ir.Value]]:
    """Checks of each input dim's range and of the relations between input dims, as exported.

    A lower bound of 2 is checked only where `dynamic_shapes` asked for it (``Dim("n", min=2)``, keyed by the
    placeholder's name and dim): size-oblivious tracing gives it to dims whose graph computes sizes 0 and 1 right
    too (GPT-2's sequence of one token matches eager), so it is no assumption of the model's."""
    program = captured.exported_program
    ranges: Mapping[Any, Any] = program.range_constraints if program is not None else {}
    build = _Builder(f"{CHECK_PREFIX}_input_")
    definitions: dict[sympy.Symbol, ir.Value] = {}
    zeros: list[ir.Value] = []

    def size_of(value: ir.Value, dim: int | None) -> ir.Value:
        if dim is None:
            return build.add("Reshape", [build.add("Cast", [value], to=ir.DataType.INT64), build.constant(1)])
        return build.add("Shape", [value], start=dim, end=dim + 1)

    def where(value: ir.Value, dim: int | None) -> str:
        return f"input '{value.name}'" + (f" dim {dim}" if dim is not None else "")

    def add_check(ok: ir.Value, assumption: str) -> None:
        name = f"{CHECK_PREFIX}: {assumption}"
        zeros.append(build.check(ok, name, assumption))
        found.checked.append(f"checked at run time (ONNX node '{name}'): {assumption}")

    dims = _input_dims(captured, graph)
    defined_at: dict[Any, tuple[ir.Value, int | None]] = {}
    plain = {expression for _, _, expression, _ in dims if isinstance(expression, sympy.Symbol)}
    for value, dim, expression, placeholder in dims:
        asked = asked_minimums.get((placeholder, dim), 0)
        multiple = _multiple_of_symbol(expression)
        if multiple is not None and multiple[1] not in plain and multiple[1] not in definitions:
            # a derived dim alone (``2 * Dim("half")``, its symbol no input's dim): a multiple, the quotient its symbol
            factor, symbol = multiple
            size = size_of(value, dim)
            quotient = build.add("Div", [size, build.constant(factor)])
            exact = build.add("Equal", [build.add("Mul", [quotient, build.constant(factor)]), size])
            add_check(
                exact,
                f"{where(value, dim)} == {_named(expression, symbol_names)} (a multiple of {factor}, as exported)",
            )
            defined_at[expression] = (value, dim)
            size = definitions[symbol] = quotient
            expression, asked = symbol, asked // factor
        elif isinstance(expression, sympy.Symbol) and expression not in definitions:
            defined_at[expression] = (value, dim)
            size = definitions[expression] = size_of(value, dim)
        else:
            continue
        name = symbol_names.get(expression, str(expression))
        bounds = ranges.get(expression)
        lower, upper = getattr(bounds, "lower", None), getattr(bounds, "upper", None)
        floor = 0 if dim is not None else None  # a size is never negative: nothing to check at 0
        if isinstance(lower, (int, sympy.Integer)) and int(lower) == 2 and dim is not None:
            lower = min(2, asked) or None
        if isinstance(lower, (int, sympy.Integer)) and (floor is None or int(lower) > floor):
            add_check(
                build.add("GreaterOrEqual", [size, build.constant(int(lower))]),
                f"{name} >= {int(lower)} ({where(value, dim)}, the range it was exported for)",
            )
        if isinstance(upper, (int, sympy.Integer)):
            add_check(
                build.add("LessOrEqual", [size, build.constant(int(upper))]),
                f"{name} <= {int(upper)} ({where(value, dim)}, the range it was exported for)",
            )
    for value, dim, expression, _ in dims:
        if defined_at.get(expression) == (value, dim):
            continue  # the dim that defines its symbol
        assumption = f"{where(value, dim)} == {_named(expression, symbol_names)} (as exported)"
        try:
            expected = _to_onnx(expression, definitions, build)
        except _Unexpressible as error:
            found.unchecked.append(f"not checked at run time (cannot be expressed in ONNX: {error}): {assumption}")
            continue
        add_check(build.add("Equal", [size_of(value, dim), expected]), assumption)
    for index, expression in enumerate(_unasserted(captured)):
        line = _recorded_line(captured, str(expression))
        assumption = _named(expression, symbol_names) + (
            f", assumed by the model's code at {_short_line(line)}" if line else ", assumed by the model's code"
        )
        try:
            nodes, ok = condition_to_onnx(expression, definitions, f"{CHECK_PREFIX}_float_{index}_")
        except ValueError as error:
            found.unchecked.append(f"not checked at run time (cannot be expressed in ONNX: {error}): {assumption}")
            continue
        build.nodes.extend(nodes)
        add_check(ok, assumption)
    return build.nodes, zeros


def _multiple_of_symbol(expression: Any) -> tuple[int, sympy.Symbol] | None:
    """(k, s) for ``k*s`` (k a positive integer), else None."""
    if isinstance(expression, sympy.Mul) and len(expression.args) == 2:
        factor, symbol = expression.args
        if isinstance(factor, sympy.Integer) and int(factor) > 0 and isinstance(symbol, sympy.Symbol):
            return int(factor), symbol
    return None


def _unasserted(captured: CapturedGraph) -> list[Any]:
    """torch.export's deferred assertions on sizes that it puts in no ``_assert_scalar`` node: those holding a
    float function (``int(n ** 0.5)`` specialized to the example's 8: ``Eq(TruncToInt(FloatPow(ToFloat(s0), 0.5)),
    8)``), which its graph pass cannot write as nodes. Unchecked, another size would run the example's (DiT's
    unpatchify reshaping 16 tokens as 8 x 8: a wrong shape without an error)."""
    for node in captured.user_inputs:
        val = node.meta.get("val")
        sizes = val.shape if isinstance(val, torch.Tensor) else [val]
        symbolic = next((size for size in sizes if isinstance(size, torch.SymInt)), None)
        if symbolic is not None:
            shape_env = symbolic.node.shape_env
            break
    else:
        return []
    floats = (sympy_functions.ToFloat, sympy_functions.TruncToInt, sympy_functions.CeilToInt)
    found: list[Any] = []
    for assertions in shape_env.deferred_runtime_asserts.values():
        found += [a.expr for a in assertions if a.expr.has(*floats) and a.expr not in found]
    return found


def _assertion_checks(
    graph: ir.Graph, captured: CapturedGraph, symbol_names: Mapping[sympy.Symbol, str], found: RuntimeChecks
) -> list[ir.Value]:
    """The check nodes the lowering of ``aten._assert_scalar`` made, renamed after the user's dims and line."""
    zeros = []
    used = {node.name for node in graph}
    for node in ir.traversal.RecursiveGraphIterator(graph):
        expression = node.metadata_props.get(RUNTIME_CHECK)
        if expression is None:
            continue
        reason = node.metadata_props.get(RUNTIME_CHECK_REASON)
        line = (None if reason else _recorded_line(captured, expression)) or _line_of_trace(
            node.metadata_props.get(STACK_TRACE, "")
        )
        if line == LOWERED_WHOLE:  # a guard of an op's fake kernel, not of the graph: the lowering is right anyway
            found.unchecked.append(f"not checked at run time (not assumed by the ONNX graph: {line}): {expression}")
            continue
        assumption = _named(expression, symbol_names) + (
            f", assumed by the model's code at {_short_line(line)}" if line else ", assumed by the model's code"
        )
        if reason:
            assumption += f" ({reason})"
        verdict = None if reason else _size_one_verdict(captured, expression)
        if verdict is not None and verdict.joined:  # the If runs the special branch at size 1
            found.unchecked.append(f"not checked at run time ({GENERAL_BRANCH_JOINED}): {assumption}")
            continue
        if verdict is not None and not verdict.same:  # the general branch is wrong at 1: refuse 1 rather than lie
            assumption += f" ({GENERAL_BRANCH_DIFFERS})"
        elif (_general_branch(expression) or verdict is not None) and not (reason or _users_own_check(line)):
            same = f"; {GENERAL_BRANCH_SAME}" if verdict is not None else ""
            found.unchecked.append(f"not checked at run time ({GENERAL_BRANCH}{same}): {assumption}")
            continue
        if _holds_for_every_nonempty_size(expression):  # checked, but no limit of the model's worth a warning
            assumption += f" ({EVERY_NONEMPTY_SIZE})"
        if node.graph is not graph:  # inside a control-flow body: no output of the main graph can read it
            found.unchecked.append(f"not checked at run time (inside a control-flow body): {assumption}")
            continue
        name = f"{CHECK_PREFIX}: {assumption}"
        unique, count = name, 1
        while unique in used:
            count += 1
            unique = f"{name} ({count})"
        used.add(unique)
        node.name = unique
        node.metadata_props[RUNTIME_CHECK] = assumption
        zeros.append(node.outputs[0])
        found.checked.append(f"checked at run time (ONNX node '{unique}'): {assumption}")
    return zeros


def _feed_an_output(graph: ir.Graph, zeros: Sequence[ir.Value]) -> None:
    """Add the checks' zeros to the shape a Reshape of the first computed output takes: ONNX Runtime cannot drop
    them, and the output's data is not copied. The shape is zeros (Reshape's "this dim as the input's"), so that it
    reads nothing of the output. ONNX Runtime orders the nodes by a depth-first walk up from the nodes nothing reads,
    the last in the graph first, and at each node its inputs' producers the last in the graph first: the Reshape
    and its shape, appended last, make the checks (and only what they read) run before the rest of the model."""
    # a computed output, else (every output folded to a constant or an input passed through) the first one
    position = next((i for i, value in enumerate(graph.outputs) if value.producer() is not None), 0)
    if not graph.outputs:
        return  # nothing to gate: the report's claims are then checked against the model and said not to hold
    build = _Builder(f"{CHECK_PREFIX}_feed_")
    total = zeros[0]
    for zero in zeros[1:]:
        total = build.add("Add", [total, zero])
    output = graph.outputs[position]
    if output.shape is not None:
        same = build.add("Constant", [], value=ir.tensor(np.zeros(len(output.shape), dtype=np.int64)))
    else:  # an unknown rank: the output's own shape (read after the output: the checks may then run later)
        same = build.add("Shape", [output])
    shape = build.add("Add", [same, total], name=f"{CHECK_PREFIX}s_as_a_shape")
    gated = build.add("Reshape", [output, shape], name=f"{CHECK_PREFIX}s_feed_{output.name}")
    gated.dtype = output.dtype
    gated.shape = ir.Shape(output.shape) if output.shape is not None else None
    for node in build.nodes:  # typed: legalization, after this, reads every node's types
        for value in node.outputs:
            value.dtype = value.dtype or ir.DataType.INT64
    total.shape = ir.Shape([])
    same.shape = shape.shape = ir.Shape([len(output.shape) if output.shape is not None else None])
    name = output.name
    output.name = f"{name}_before_checks"
    gated.name = name
    graph.extend(build.nodes)
    graph.outputs[position] = gated


def add_runtime_checks(
    model: ir.Model,
    captured: CapturedGraph,
    symbol_names: Mapping[sympy.Symbol, str],
    asked_minimums: Mapping[tuple[str, int], int] | None = None,
) -> RuntimeChecks:
    """Check at run time the input dims' ranges and relations and torch.export's assertions (module docstring).

    Before the optimizer runs, the checks are extra graph outputs (so that nothing removes them, nor sees through
    them); :func:`feed_an_output` replaces those by the Reshape of a real output once the graph is optimized.
    """
    graph = model.graph
    found = RuntimeChecks()
    input_nodes, input_zeros = _input_checks(captured, graph, symbol_names, asked_minimums or {}, found)
    zeros = _assertion_checks(graph, captured, symbol_names, found)
    if input_nodes:
        if len(graph):
            graph.insert_before(graph.node(0), input_nodes)
        else:
            graph.extend(input_nodes)
    zeros = input_zeros + zeros
    if not any(value.producer() is not None for value in graph.outputs):
        found.unchecked += [
            note.replace("checked at run time", "not checked at run time (the model computes no output)")
            for note in found.checked
        ]
        found.checked = []
        return found
    for index, zero in enumerate(zeros):
        if zero.name is None or not zero.name.startswith(_PENDING):
            zero.name = f"{_PENDING}{index}"
        graph.outputs.append(zero)
    found.pending = len(zeros)
    return found


_PENDING = "fx2onnx_pending_check_"


def feed_an_output(model: ir.Model, checks: RuntimeChecks) -> None:
    """The checks, extra outputs of the graph until now, go into the shape a Reshape of its first computed output
    takes, appended last (so that ONNX Runtime runs them first)."""
    if not checks.pending:
        return
    graph = model.graph
    zeros = list(graph.outputs[-checks.pending :])
    del graph.outputs[-checks.pending :]
    checks.pending = 0
    for index, zero in enumerate(zeros):
        zero.name = f"{CHECK_PREFIX}_{index}"
    _feed_an_output(graph, zeros)


# --- what the report claims, against the model --------------------------------------------------------------------
MISSING = "NOT checked at run time: the ONNX model has no check of it"
_CLAIM = re.compile(r"^checked at run time \(ONNX node '(.*)'\): ", re.DOTALL)


def _condition_key(text: str) -> str | None:
    """A condition over sizes in one canonical form (sympy's), its symbols unnumbered (``assertion_key``)."""
    parsed = parsed_expression(text)
    return None if parsed is None else assertion_key(str(parsed))


_CHECKED_ASSUMPTION = f" ({Assumption.at_run_time})"


def _asserted(assumption: str) -> str | None:
    """The condition the capture asserted for a decision it reports (``str`` of an ``Assumption`` that
    ``_capture_strategies.size_oblivious_guards`` took: ``u0 < 3 taken as True (for the smallest sizes) at ...``)."""
    taken = re.match(r"^(.*?) taken as (\S+)", assumption)
    if taken is None:
        return None
    expression, decided = taken.groups()
    if decided in ("True", "False"):
        return expression if decided == "True" else f"Not({expression})"
    if re.fullmatch(r"-?\d+", decided):  # an integer taken as its largest value
        return f"Eq({expression}, {decided})"
    return None


def claims_in_model(
    model: ir.Model, dynamic_dims: list[str], assumptions: list[str]
) -> tuple[list[str], list[str], list[str]]:
    """The report's notes and the capture's assumptions, where each claim of a run-time check names a check node of
    the final model (one that a pass after emission removed, or that emission folded, is said not to be checked),
    and the claims that were not true."""
    if not any(_CLAIM.match(note) for note in dynamic_dims) and not any(
        assumption.endswith(_CHECKED_ASSUMPTION) for assumption in assumptions
    ):
        return list(dynamic_dims), list(assumptions), []  # no claim to look for: the graph is not walked
    checks = [node for node in ir.traversal.RecursiveGraphIterator(model.graph) if RUNTIME_CHECK in node.metadata_props]
    names = {node.name for node in checks if node.graph is model.graph}
    conditions = {
        _condition_key(node.metadata_props[RUNTIME_CHECK].split(", assumed by")[0])
        for node in checks
        if node.graph is model.graph
    }
    false_claims = []
    notes = []
    for note in dynamic_dims:
        claim = _CLAIM.match(note)
        if claim is not None and claim.group(1) not in names:
            false_claims.append(note)
            note = f"{MISSING} (node '{claim.group(1)}' is not in the ONNX model): {note[claim.end() :]}"
        notes.append(note)
    kept = []
    for assumption in assumptions:
        if assumption.endswith(_CHECKED_ASSUMPTION):
            asserted = _asserted(assumption)
            if asserted is None or _condition_key(asserted) not in conditions:
                false_claims.append(assumption)
                assumption = assumption.removesuffix(_CHECKED_ASSUMPTION) + f" ({MISSING})"
        kept.append(assumption)
    return notes, kept, false_claims


__all__ = [
    "RuntimeChecks",
    "add_runtime_checks",
    "asked_minimums",
    "claims_in_model",
    "condition_to_onnx",
    "feed_an_output",
]
