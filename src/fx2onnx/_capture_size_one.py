"""The size-1 comparison: where the model's code compared a dynamic input dim with 1 and the size-oblivious trace
took the general branch, whether that branch gives eager's result at size 1 too (run at export on the example
sliced to that size); where not, what captures the special branch (the example at size 1, that dim static).

The same for a sum or product of input dims compared with 1 (torch's view of a permuted tensor asks whether
``height * width`` is 1, a decoder's ``new + past``): compared at each set of sizes that makes it 1 (a product:
every dim 1; a sum of sizes: one dim 1 and the others 0, as far as the dims' asked minimums allow).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from fx2onnx import _capture_strategies as capture_strategies
from fx2onnx._capture_dims import dynamic_dims, serves_the_example
from fx2onnx._capture_pytrees import flatten_inputs
from fx2onnx._torch_ops import aten


@dataclasses.dataclass
class SizeOneVerdict:
    """Whether the general branch of a size-oblivious decision on a backed input dim gives eager's result where the
    dim is 1 (compared at export), and what was compared."""

    same: bool
    dim: str  # the dim compared with 1, as the graph names it: a symbol (s77), a sum or product of symbols
    seconds: float = 0.0
    # the example at size 1 and `dynamic_shapes` with that dim static: what captures the special branch
    example: tuple[tuple[Any, ...], dict[str, Any]] | None = dataclasses.field(default=None, repr=False)
    static_shapes: Any = dataclasses.field(default=None, repr=False)
    joined: bool = False  # the export captured the special branch too, and an If chooses at run time
    # the sizes the special branch is captured at: (placeholder, dim) -> size, for each input dim made static
    at: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)


_ASSERTED = re.compile(r"expression (.*) on node")


def _asserted_expressions(program: ExportedProgram) -> Iterator[str]:
    """The expression of each deferred assertion in the graph (``aten._assert_scalar``'s message), as torch prints
    it."""
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is not aten._assert_scalar.default:
            continue
        matched = _ASSERTED.search(str(node.args[1]) if len(node.args) > 1 else "")
        if matched is not None:
            yield matched[1]


def _size_one_decisions(program: ExportedProgram, assertion_lines: Mapping[str, str]) -> set[sympy.Expr]:
    """The compared sides of the deferred assertions ``Ne(e, 1)``, `e` a backed input dim `s` or a sum or product of
    such dims (the general branch of the model's own comparison of a dynamic size with 1, decided
    size-obliviously). A guard of an op's fake kernel (``LOWERED_WHOLE``) is left out: the lowering computes sizes at
    run time, whatever the branch."""
    found: set[sympy.Expr] = set()
    for expression in _asserted_expressions(program):
        if assertion_lines.get(capture_strategies.assertion_key(expression)) == capture_strategies.LOWERED_WHOLE:
            continue
        parsed = capture_strategies.parsed_expression(expression)
        if not isinstance(parsed, sympy.Ne) or sympy.Integer(1) not in parsed.args:
            continue
        (side,) = [argument for argument in parsed.args if argument != sympy.Integer(1)] or [None]
        terms = side.args if isinstance(side, (sympy.Add, sympy.Mul)) else (side,)
        # backed: an input's dim (u0: unbacked)
        if all(isinstance(term, sympy.Symbol) and str(term).startswith("s") for term in terms):
            found.add(side)
    return found


def _cases_at_one(side: sympy.Expr, lowest: Mapping[str, int]) -> list[dict[str, int]]:
    """The sizes of `side`'s dims that make it 1 (name -> size): a dim at 1; a product, each factor at 1; a sum of
    sizes (never negative), one term at 1 and the others at 0. Only those the dims' asked minimums allow."""
    names = sorted(str(symbol) for symbol in side.free_symbols)
    if isinstance(side, sympy.Add):
        cases = [{name: int(name == one) for name in names} for one in names]
    else:
        cases = [dict.fromkeys(names, 1)]
    return [case for case in cases if all(size >= lowest.get(name, 0) for name, size in case.items())]


def decision_key(side: sympy.Expr, placeholders: Iterable[torch.fx.Node]) -> str | None:
    """`side` with each symbol named after the first input dim of that size (``input_ids.1 + cache_0.2``): the
    same in the graph as captured and as decomposed, whatever numbers its symbols. None where a symbol is no input's
    dim."""
    places: dict[str, sympy.Symbol] = {}
    for node in placeholders:
        val = node.meta.get("val")
        for dim, size in enumerate(val.shape if isinstance(val, torch.Tensor) else ()):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                places.setdefault(str(size.node.expr), sympy.Symbol(f"{node.name}.{dim}"))
    named = {symbol: places.get(str(symbol)) for symbol in side.free_symbols}
    if any(place is None for place in named.values()):
        return None
    return str(side.xreplace(named))


def _equalities(program: ExportedProgram) -> list[sympy.Eq]:
    """The graph's deferred assertions that two expressions of input dims are equal (``Eq(s53, s70 + s84)``: an
    attention mask as long as the new tokens and the past together), also where asserted as two bounds (``s53 <=
    s70 + s84`` and ``s70 + s84 <= s53``: transformers' masks)."""
    parsed = [capture_strategies.parsed_expression(expression) for expression in _asserted_expressions(program)]
    bounds = {
        (bound.lhs, bound.rhs) if isinstance(bound, sympy.LessThan) else (bound.rhs, bound.lhs)
        for bound in parsed
        if isinstance(bound, (sympy.LessThan, sympy.GreaterThan))
    }
    both_ways = [sympy.Eq(low, high) for low, high in bounds if (high, low) in bounds and str(low) < str(high)]
    return [equality for equality in parsed if isinstance(equality, sympy.Eq)] + both_ways


def _sizes_at_one(case: Mapping[str, int], equalities: list[sympy.Eq], sizes: dict[str, int]) -> dict[str, int]:
    """The input dims' sizes with those of `case` (name -> size) and, for each equality with them, the one other dim
    that shrinks to keep it (the mask's length down by as much as the new tokens', the past as it is: it would have
    to grow), the others as in the example: name -> size. Where no dim can, the example breaks the relation: not
    comparable."""
    wanted = dict(case)
    for equality in equalities:
        names = {str(free): free for free in equality.free_symbols}
        if not set(case) & set(names) or not set(names) <= set(sizes):
            continue
        for tied in sorted(name for name in names if name not in wanted):  # the one dim that can shrink to fit
            known = {names[name]: wanted.get(name, sizes[name]) for name in names if name != tied}
            solutions = sympy.solve(equality.lhs.subs(known) - equality.rhs.subs(known), names[tied])
            if len(solutions) == 1 and solutions[0].is_Integer and 0 <= int(solutions[0]) <= sizes[tied]:
                wanted[tied] = int(solutions[0])
                break
    return wanted


def general_branch_at_size_one(
    program: ExportedProgram,
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    assertion_lines: Mapping[str, str],
    dynamic_shapes: Any = None,
) -> dict[str, SizeOneVerdict]:
    """For each size-oblivious decision of the model's code on a backed input dim (or a sum or product of such
    dims) compared with 1 (``if x.shape[0] == 1``, decided for the general branch and not checked at run time),
    whether the graph gives eager's result at size 1: the example's inputs sliced to each set of sizes that makes it
    1 (:func:`_cases_at_one`), run in eager and in the captured graph (assertions off, as
    :func:`serves_the_example`). One eager run and one graph run per such set, none where the model's code asks no
    such question. A dim the graph has only in a derived form (``2 * s``), or an example that cannot be sliced, is
    not comparable: reported as not the same (checked at run time then). Keyed by :func:`decision_key`."""
    decisions = _size_one_decisions(program, assertion_lines)
    if not decisions or not isinstance(model, torch.nn.Module):
        return {}
    # weights or inputs without data (meta: weights= binds them later) compute no values to compare
    valueless = any(
        tensor.is_meta or isinstance(tensor, torch._subclasses.FakeTensor)
        for tensor in [*model.parameters(), *model.buffers(), *pytree.tree_leaves((args, kwargs))]
        if isinstance(tensor, torch.Tensor)
    )
    user = set(program.graph_signature.user_inputs)
    # tensors only: a constant input (``use_cache=True``) is a leaf of the inputs but no placeholder of the graph
    placeholders = [
        node
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in user and isinstance(node.meta.get("val"), torch.Tensor)
    ]
    leaves = [
        leaf for leaf in flatten_inputs(program.call_spec.in_spec, args, kwargs) if isinstance(leaf, torch.Tensor)
    ]
    asked = dynamic_dims(model, args, kwargs, dynamic_shapes)
    equalities = _equalities(program)
    # each input dim's size in the example, and the least size `dynamic_shapes` asked for it, by its symbol's name
    # (sympify's symbols lack torch's assumptions, integer, positive, so never equal its own)
    sizes: dict[str, int] = {}
    lowest: dict[str, int] = {}
    for node, leaf in zip(placeholders, leaves):
        for dim, size in enumerate(node.meta["val"].shape):
            if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                sizes[str(size.node.expr)] = leaf.shape[dim]
                minimum = getattr(asked.get((id(leaf), dim)), "min", None)
                if isinstance(minimum, int):
                    lowest[str(size.node.expr)] = max(minimum, lowest.get(str(size.node.expr), 0))
    verdicts: dict[str, SizeOneVerdict] = {}
    for side in sorted(decisions, key=str):
        started = time.perf_counter()
        sliceable = (args, kwargs, placeholders, leaves, asked)
        compared = [_sliced_to(case, equalities, sizes, *sliceable) for case in _cases_at_one(side, lowest)]
        key = decision_key(side, placeholders)
        if key is None or not any(places for _, places, _ in compared):
            continue  # no dim of it sliced: the general branch stands, as for a size no slicing reaches
        differing = []
        for at_one, places, specs in compared:
            if at_one is None:
                differing.append((None, places, specs))
                continue
            same = False  # not comparable by values: the special branch is captured (an If joins it)
            if not valueless:
                # the extra eager run leaves the user's model as it was: a module in training mode updates its
                # buffers (BatchNorm's running statistics), and dropout draws from the global generator
                buffers = {name: buffer.clone() for name, buffer in model.named_buffers()}
                with torch.random.fork_rng(devices=[]):
                    same = serves_the_example(program, model, *at_one)
                with torch.no_grad():
                    for name, buffer in model.named_buffers():
                        if name in buffers and buffer.shape == buffers[name].shape:
                            buffer.copy_(buffers[name])
            if not same:
                differing.append((at_one, places, specs))
        verdict = SizeOneVerdict(not differing, str(side), time.perf_counter() - started)
        if len(differing) == 1:  # one special branch: one size-1 capture, joined in an If
            at_one, places, specs = differing[0]
            # named dims only: Dim.DYNAMIC/AUTO have no name telling this dim from the others, which must stay dynamic
            named = specs and all(
                isinstance(spec, str) or isinstance(getattr(spec, "__name__", None), str) for spec in specs
            )
            if at_one is not None and named:
                verdict.example = at_one
                verdict.static_shapes = _made_static(dynamic_shapes, specs)
                verdict.at = places
        verdicts[key] = verdict
    return verdicts


def _sliced_to(
    case: Mapping[str, int],
    equalities: list[sympy.Eq],
    sizes: dict[str, int],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    placeholders: list[torch.fx.Node],
    leaves: list[torch.Tensor],
    asked: Mapping[tuple[int, int], Any],
) -> tuple[tuple[tuple[Any, ...], dict[str, Any]] | None, dict[tuple[str, int], int], list[Any]]:
    """The example sliced to the sizes of `case` (and of the dims tied to them by `equalities`): ((args, kwargs) or
    None where the example cannot be sliced so, (placeholder, dim) -> size for each dim of `case` sliced, what
    `dynamic_shapes` asked for each of those)."""
    wanted = _sizes_at_one(case, equalities, sizes)
    sliced: dict[int, torch.Tensor] = {}
    places: dict[tuple[str, int], int] = {}
    specs: list[Any] = []
    comparable = len(placeholders) == len(leaves)
    for node, leaf in zip(placeholders, leaves) if comparable else ():
        example = leaf
        for dim, size in enumerate(node.meta["val"].shape):
            expression = size.node.expr if isinstance(size, torch.SymInt) else None
            if str(expression) in wanted and leaf.shape[dim] >= wanted[str(expression)]:
                leaf = sliced[id(example)] = leaf.detach().narrow(dim, 0, wanted[str(expression)]).clone()
                if str(expression) in case:
                    places[(node.name, dim)] = case[str(expression)]
                    specs.append(asked.get((id(example), dim)))
            elif expression is not None and set(case) & set(map(str, expression.free_symbols)):
                comparable = False  # a derived dim: no slicing gives its value at size 1
    if not comparable or not sliced:
        return None, places, specs
    return pytree.tree_map(lambda value: sliced.get(id(value), value), (tuple(args), dict(kwargs))), places, specs


def _made_static(dynamic_shapes: Any, specs: list[Any]) -> Any:
    """`dynamic_shapes` with the dims asked as one of `specs` (a Dim, or the same name) given as static."""
    names = {spec if isinstance(spec, str) else getattr(spec, "__name__", None) for spec in specs} - {None}

    def static(spec: Any) -> bool:
        if isinstance(spec, (dict, list, tuple)):
            return False
        name = spec if isinstance(spec, str) else getattr(spec, "__name__", None)
        return any(spec is one for one in specs) or name in names

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: torch.export.Dim.STATIC if static(spec) else walk(spec) for key, spec in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(torch.export.Dim.STATIC if static(spec) else walk(spec) for spec in value)
        return value

    return walk(dynamic_shapes)
