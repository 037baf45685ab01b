"""Dynamic shapes at capture: ``dynamic_shapes`` completed (a key per argument) and adapted (a cache's layout), read
(which input dims it asks dynamic, by which names), and torch.export run with it: the relations it declares known
to the trace from its start, torch.export's suggested fixes applied, a dim a size-1 example pinned retried at size 2.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram

from fx2onnx import _capture_strategies as capture_strategies
from fx2onnx._log_filters import without_messages
from fx2onnx._torch_ops import aten
from fx2onnx.errors import CaptureError, SourceFrame, is_user_file

_UNFOUND_USER_CODE = {"torch.fx.experimental.symbolic_shapes": ("Unable to find user code corresponding to",)}


@contextlib.contextmanager
def _without_partial_graph_print() -> Iterator[None]:
    """torch.export prints the graph traced so far to stderr when a trace fails, and logs that it found no user code
    for a data-dependent symbol. fx2onnx handles such failures itself (a branch on a value is captured both ways, a
    suggested fix applied) or raises an error naming the model's line, so both are dropped: the print (a whole graph
    module, once per torch.export wrapper the error passes) and that log line; the graph stays on the error as
    ``partial_fx_graph``. Anything else printed to stderr meanwhile is passed on when the trace ends."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stderr(printed), without_messages(_UNFOUND_USER_CODE):
            yield
    except BaseException as error:
        partial = getattr(error, "partial_fx_graph", None)
        text = printed.getvalue()
        sys.stderr.write(text.replace(f"{partial}\n", "") if partial is not None else text)
        raise
    sys.stderr.write(printed.getvalue())


# torch's shape environment logs each guard it adds at INFO ("eval Eq(s3, 2) [guard added] ..."), while the model's
# code that asked for it is still on the stack
_SYMBOLIC_SHAPES_LOG = "torch.fx.experimental.symbolic_shapes"
_CONSTANT_GUARD = re.compile(r"Eq\(s\d+, (-?\d+)\)")


class _ConstantGuardLines(logging.Handler):
    """Where the model's code fixed a dynamic size to a constant: the innermost frame of the model's code (not
    torch's: its log names the decomposition that asked) when a guard ``Eq(s3, 2)`` is added, by constant."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if "[guard added]" not in str(record.msg) or len(args) < 2:
            return
        matched = _CONSTANT_GUARD.fullmatch(str(args[1]))
        frames = [frame for frame in traceback.extract_stack() if is_user_file(frame.filename)] if matched else []
        if matched and frames:
            frame = frames[-1]
            where = SourceFrame(os.path.basename(frame.filename), frame.lineno or 0, frame.name, frame.line or "")
            self.lines.setdefault(matched.group(1), []).append(str(where))


@contextlib.contextmanager
def _constant_guard_lines() -> Iterator[_ConstantGuardLines]:
    """The guards' lines, read from torch's INFO log for the duration; its own stderr handler muted meanwhile unless
    the user turned that log up (TORCH_LOGS="+dynamic"): only an export that needs a suggested fix names them."""
    logger = logging.getLogger(_SYMBOLIC_SHAPES_LOG)
    lines = _ConstantGuardLines()
    quiet = not logger.isEnabledFor(logging.INFO)
    level, handlers = logger.level, list(logger.handlers)
    if quiet:
        logger.handlers = []
        logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)
        if quiet:
            logger.setLevel(level)
            logger.handlers = handlers


def _with_lines(fixes: list[str], lines: Mapping[str, list[str]]) -> list[str]:
    """Each fix making a dim a constant (``batch = 2``) with the model's line that specialized it, where torch logged
    one: ``len(tensor)`` (RT-DETR's ``batch_size = len(source_flatten)``), a Python int taken of a size."""
    named = []
    for fix in fixes:
        where = lines.get(fix.partition(" = ")[2], [])
        named.append(f"{fix} (specialized by the model's code at {where[0]})" if where else fix)
    return named


def export_with_suggested_fixes(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any, *, strict: bool
) -> tuple[ExportedProgram, list[str]]:
    """``torch.export.export`` as torch.onnx's dynamo exporter runs it, and the fixes it needed.

    Dynamic dims are traced size-obliviously (an example size of 0 or 1 stays dynamic, not specialized), guards on
    them preferably deferred to runtime checks; when the
    model's code constrains a dim more than `dynamic_shapes` says (a range, a relation, a constant), torch.export
    fails with suggested fixes: they are applied and the capture retried once. The fixes are returned so that
    the export warns and reports which dims became static or constrained.
    """
    from torch.fx.experimental import _config as symbolic_config

    def run(shapes: Any) -> ExportedProgram:
        with (
            symbolic_config.patch(backed_size_oblivious=dynamic_shapes is not None),
            declared_dim_relations(),
            _without_partial_graph_print(),
        ):
            return torch.export.export(
                model,
                args,
                kwargs,
                dynamic_shapes=shapes,
                strict=strict,
                # a guard on dynamic sizes the model's code needs becomes a runtime check, not a refusal
                prefer_deferred_runtime_asserts_over_guards=dynamic_shapes is not None,
            )

    try:
        with _constant_guard_lines() as guard_lines:
            return _run_or_hinted_fixes(run, model, args, kwargs, dynamic_shapes, strict=strict), []
    except torch._dynamo.exc.UserError as error:
        message = str(getattr(error, "msg", error))
        if dynamic_shapes is None or "Suggested fixes:" not in message:
            raise
        try:
            refined = torch.export.dynamic_shapes.refine_dynamic_shapes_from_suggested_fixes(message, dynamic_shapes)
        except Exception:
            raise error from None
    fixes = [line.strip() for line in message.split("Suggested fixes:")[1].strip().splitlines() if " = " in line]
    pinned = _pinned_at_example_one(fixes, model, args, kwargs, dynamic_shapes)
    if pinned:
        retried = _export_at_size_two(pinned, model, args, kwargs, dynamic_shapes, strict=strict)
        if retried is not None:
            return retried
        fixes = [
            f"{fix} (the example's size 1 made the model's code branch on it: give an example of size 2 or more "
            "to keep it dynamic)"
            if fix.split(" = ")[0] in pinned
            else fix
            for fix in fixes
        ]
    return run(refined), _with_lines(fixes, guard_lines.lines)


def _run_or_hinted_fixes(
    run: Callable[[Any], ExportedProgram],
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic_shapes: Any,
    *,
    strict: bool,
) -> ExportedProgram:
    """``run(dynamic_shapes)``, the size-oblivious trace; where it fails otherwise than with torch.export's suggested
    fixes (or on a data-dependent size, which other capture strategies take), the fixes a hinted trace suggests are
    raised in its place, for the caller to apply: a relation the model's code needs between dims `dynamic_shapes`
    gives independently (OPT's attention mask of ``past + 1``, asked as a dim of its own) is decided by a hinted
    trace from the example's sizes, and refused with the fix ``total = past + 1``; the size-oblivious trace never
    decides it, and failed further on (a Python test of ``p + 1 - p > 1`` left a SymBool). The failure stands where
    the hinted trace suggests nothing. Costs one more trace, on the way to an error only."""
    try:
        return run(dynamic_shapes)
    except Exception as error:
        own_fixes = isinstance(error, torch._dynamo.exc.UserError)  # torch.export's, suggested fixes or not
        if dynamic_shapes is None or own_fixes or capture_strategies.is_data_dependent(error):
            raise
        try:
            torch.export.export(
                model,
                args,
                kwargs,
                dynamic_shapes=dynamic_shapes,
                strict=strict,
                prefer_deferred_runtime_asserts_over_guards=True,
            )
        except torch._dynamo.exc.UserError as hinted:
            if "Suggested fixes:" in str(getattr(hinted, "msg", hinted)):
                raise hinted from error
        except Exception:
            pass  # the hinted trace fails too, otherwise: the size-oblivious trace's error is the one to show
        raise error


@contextlib.contextmanager
def declared_dim_relations() -> Iterator[None]:
    """The relations `dynamic_shapes` declares between input dims (one ``Dim`` on several inputs, a derived
    ``Dim("past") + 1``) are known to the trace from its start, as replacements of its shape environment.

    torch.export (non-strict) makes one symbol per input dim and checks the declared relations only after tracing
    (``produce_guards``): a hinted trace learns ``mask = past + 1`` on the way, from a guard the example's sizes
    decide (a slice's bounds), but a size-oblivious one never decides it, so expressions of both stay
    unsimplified (OPT's query length ``Max(0, s53 - Min(s53, s84))`` instead of 1) and a Python branch on them
    (transformers' SDPA ``is_causal = q_length > 1 and ...``) is left a SymBool. Each declared equation replaces
    its symbol once the fake inputs exist, as the shape environment does for an equality the model's code
    asserts; torch.export's check afterwards holds by construction, and the ONNX model checks the inputs' relations
    at run time (the input checks, ``mask == past + 1 (as exported)``). Non-strict only (strict: Dynamo fakifies).
    """
    from torch.export import _trace

    make_fake_inputs = _trace.make_fake_inputs

    def with_relations(*args: Any, **kwargs: Any) -> Any:
        made = make_fake_inputs(*args, **kwargs)
        shape_env, equalities = made[0].shape_env, made[3]
        symbol_of = {source.name: symbol for symbol, sources in shape_env.var_to_sources.items() for source in sources}
        replaced: dict[sympy.Symbol, sympy.Expr] = {}

        def resolved(symbol: sympy.Symbol) -> sympy.Expr:
            while symbol in replaced and isinstance(replaced[symbol], sympy.Symbol):
                symbol = replaced[symbol]
            return symbol

        def replace(symbol: sympy.Expr, target: sympy.Expr) -> None:
            if not isinstance(symbol, sympy.Symbol) or symbol == target or symbol in target.free_symbols:
                return
            hints = shape_env.backed_var_to_val
            if symbol not in hints or target.xreplace(hints) != hints[symbol]:
                return  # an example that breaks the declared relation: torch.export's check names it
            replaced[symbol] = target
            shape_env._set_replacement(symbol, target, "declared by dynamic_shapes")

        for first, second in equalities.source_pairs:  # one Dim on several inputs
            if first.name in symbol_of and second.name in symbol_of:
                replace(resolved(symbol_of[first.name]), resolved(symbol_of[second.name]))
        for source, root, derive in equalities.derived_equalities:  # source = derive(root)
            base = root if isinstance(root, sympy.Expr) else symbol_of.get(root.name)
            if source.name in symbol_of and base is not None:
                replace(resolved(symbol_of[source.name]), derive(resolved(base)))
        return made

    _trace.make_fake_inputs = with_relations
    try:
        yield
    finally:
        _trace.make_fake_inputs = make_fake_inputs


def _pinned_at_example_one(
    fixes: list[str], model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], dynamic_shapes: Any
) -> dict[str, list[tuple[int, int]]]:
    """The dims asked dynamic that torch.export's fixes pin to 1 where the example's size is 1: the model's code
    compared the size with 1 (``if batch_size != position_ids.shape[0]`` in transformers' masking), and a size-1
    example took the special branch, so torch.export asks for the example's size. Name -> (input id, dim)s."""
    # "batch = 1", or "batch = Dim('batch', max=1)" (Swin: a guard 'batch <= 2' met a size-oblivious range [2, ...])
    named = {name for name, _, fix in (f.partition(" = ") for f in fixes) if fix == "1" or fix.endswith("max=1)")}
    if not named:
        return {}
    sizes = {id(x): x.shape for x in pytree.tree_leaves((args, dict(kwargs))) if isinstance(x, torch.Tensor)}
    pinned: dict[str, list[tuple[int, int]]] = {}
    for (tensor_id, dim), spec in dynamic_dims(model, args, kwargs, dynamic_shapes).items():
        name = getattr(spec, "__name__", spec)
        if name in named and tensor_id in sizes and sizes[tensor_id][dim] == 1:
            pinned.setdefault(name, []).append((tensor_id, dim))
    return pinned


def serves_the_example(
    program: ExportedProgram, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """Whether the graph captured at size 2 gives eager's result on the user's size-1 example, run in torch with its
    assertions off (a size-2 capture asserts the size is not 1): the branch the code took at 2 is then right at 1
    too (an `expand` to the batch), where a branch computing otherwise at 1 (``x.view(-1) if n == 1 else x.sum(0)``)
    keeps the dim pinned to 1. The inputs are copied: a Hugging Face cache is appended to by each run."""
    try:
        module = program.module()
        for node in list(module.graph.nodes):
            if node.op == "call_function" and node.target in (
                aten._assert_scalar.default,
                aten._assert_tensor_metadata.default,
            ):
                module.graph.erase_node(node)
        module.recompile()
        module._forward_pre_hooks.clear()  # the input check of the captured dims' ranges (size 2 and up)
        with torch.no_grad():
            expected = pytree.tree_leaves(model(*copy.deepcopy(args), **copy.deepcopy(kwargs)))
            got = pytree.tree_leaves(module(*copy.deepcopy(args), **copy.deepcopy(kwargs)))
    except Exception:
        return False
    if len(expected) != len(got):
        return False
    return all(_same_result(want, have) for want, have in zip(expected, got))


def _same_result(want: Any, have: Any) -> bool:
    if not isinstance(want, torch.Tensor) or not isinstance(have, torch.Tensor):
        return type(want) is type(have) and want == have
    if want.dtype != have.dtype or want.shape != have.shape:
        return False
    return torch.allclose(want.double(), have.double(), rtol=1e-3, atol=1e-5, equal_nan=True)


def _export_at_size_two(
    pinned: dict[str, list[tuple[int, int]]],
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    dynamic_shapes: Any,
    *,
    strict: bool,
) -> tuple[ExportedProgram, list[str]] | None:
    """The capture again with the pinned dims' examples at size 2 (their one slice repeated): the model's code takes
    its general branch, so the graph serves every size the user asked for, instead of size 1 only. The size-1
    branch the code then did not take is the general one's special case (an `expand` to the same size...), as for
    any size-oblivious decision: a lower bound of 2 the model's code implies is not checked at run time unless
    `dynamic_shapes` asked for it. None when that capture fails (the model needs size 1 there: it is pinned)."""
    if not isinstance(model, torch.nn.Module):
        return None
    dims_by_tensor: dict[int, list[int]] = {}
    for places in pinned.values():
        for tensor_id, dim in places:
            dims_by_tensor.setdefault(tensor_id, []).append(dim)

    def at_size_two(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            for dim in dims_by_tensor.get(id(value), []):
                value = torch.cat([value, value], dim=dim)
        return value

    leaves, spec = pytree.tree_flatten((args, kwargs))
    enlarged = [at_size_two(leaf) for leaf in leaves]
    # a dim spec keyed by tensor: the enlarged inputs are new tensors, at the same places of the same structure
    try:
        larger_args, larger_kwargs = pytree.tree_unflatten(enlarged, spec)
        program, fixes = export_with_suggested_fixes(model, larger_args, larger_kwargs, dynamic_shapes, strict=strict)
    except Exception:
        return None
    if not serves_the_example(program, model, args, kwargs):
        return None
    notes = [
        f"{name}: traced at size 2, not the example's 1 (the model's code branches on {name} == 1; its general "
        "branch serves size 1 too)"
        for name in pinned
    ]
    return program, notes + [fix for fix in fixes if fix.split(" = ")[0] not in pinned]


def _forward_arguments(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], dynamic_shapes: Any
) -> Mapping[str, Any] | None:
    """`forward`'s arguments by name, where a dict `dynamic_shapes` is to be read against them; else None."""
    if not isinstance(dynamic_shapes, Mapping) or not isinstance(model, torch.nn.Module):
        return None
    try:
        return inspect.signature(model.forward).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return None


def cache_shapes_in_registered_layout(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], dynamic_shapes: Any
) -> Any:
    """A transformers cache's `dynamic_shapes` in the layout its class is registered with. Two registrations of
    ``DynamicCache`` exist and the first made in the process wins: transformers' exporters' (every tensor of the
    layers in one flat list: keys, values... per layer), which fx2onnx makes, and its executorch helper's
    (``[[keys...], [values...]]``). Either layout is accepted and rewritten to the registered one (by tensor); any
    other is refused naming the layout expected (torch.export said "Node arity mismatch")."""
    bound = _forward_arguments(model, args, kwargs, dynamic_shapes)
    if bound is None:
        return dynamic_shapes
    adapted = dict(dynamic_shapes)
    for name, shapes in dynamic_shapes.items():
        cache = bound.get(name)
        node = pytree.SUPPORTED_NODES.get(type(cache))
        layers = [layer for layer in getattr(cache, "layers", None) or () if getattr(layer, "keys", None) is not None]
        if node is None or not layers or not isinstance(shapes, (list, tuple)):
            continue
        children = node.flatten_fn(cache)[0]
        if _fits(shapes, children):
            continue
        flat_leaves = _exporter_layout_leaves(cache)
        by_tensor: dict[int, Any] = {}
        if len(shapes) == 2 and all(isinstance(s, (list, tuple)) and len(s) == len(layers) for s in shapes):
            for layer, key_shape, value_shape in zip(layers, shapes[0], shapes[1]):  # executorch's [[keys], [values]]
                by_tensor.update({id(layer.keys): key_shape, id(layer.values): value_shape})
        elif flat_leaves is not None and len(shapes) == len(flat_leaves):  # transformers exporters' flat list
            by_tensor.update({id(leaf): shape for leaf, shape in zip(flat_leaves, shapes)})
        else:
            expected = [
                type(child).__name__ if not isinstance(child, list) else f"[{len(child)} tensors]" for child in children
            ]
            raise CaptureError(
                f"dynamic_shapes[{name!r}] has {len(shapes)} entries, which fits neither layout of a "
                f"{type(cache).__name__} of {len(layers)} layers: give one entry per tensor in the order the cache's "
                f"registered pytree flattens it ({len(children)} children: {', '.join(expected)}), or "
                f"[[one per layer's keys], [one per layer's values]]"
            )
        adapted[name] = [
            [by_tensor.get(id(t)) for t in child] if isinstance(child, list) else by_tensor.get(id(child))
            for child in children
        ]
    return adapted


def _fits(shapes: Sequence[Any], children: Sequence[Any]) -> bool:
    """Whether `shapes` has the structure of a pytree node's `children` (a list child: a list of as many)."""
    if len(shapes) != len(children):
        return False
    return all(
        isinstance(shape, (list, tuple)) and len(shape) == len(child) if isinstance(child, list) else True
        for shape, child in zip(shapes, children)
    )


def _exporter_layout_leaves(cache: Any) -> list[Any] | None:
    """The tensors of `cache` in the order transformers' exporters' registration flattens it (None: unavailable)."""
    try:
        from transformers.exporters.exporter_dynamo import _pytree_flatten
    except ImportError:
        return None
    return list(_pytree_flatten(cache)[0])


def complete_dynamic_shapes(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], dynamic_shapes: Any) -> Any:
    """torch.export wants a key for every argument in a dict `dynamic_shapes`; the rest are static."""
    bound = _forward_arguments(model, args, kwargs, dynamic_shapes)
    if bound is None:
        return dynamic_shapes
    if not set(dynamic_shapes) <= set(bound):
        return dynamic_shapes  # let torch.export name the unknown keys in its error
    return {name: dynamic_shapes.get(name) for name in bound}


def dynamic_dims(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], dynamic_shapes: Any
) -> dict[tuple[int, int], Any]:
    """(id of input tensor, dim) -> what `dynamic_shapes` asks for it (a Dim, a name, Dim.DYNAMIC/AUTO...),
    for every dim not given as static."""
    if dynamic_shapes is None:
        return {}
    specs: dict[tuple[int, int], Any] = {}

    def walk(value: Any, spec: Any) -> None:
        if spec is None:
            return
        if isinstance(value, torch.Tensor):
            items = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
            for dim, dim_spec in items:
                if dim_spec is not None and not isinstance(dim_spec, int) and dim_spec is not torch.export.Dim.STATIC:
                    specs[(id(value), int(dim) % max(value.dim(), 1))] = dim_spec
            return
        if isinstance(value, Mapping) and isinstance(spec, Mapping):
            for key in value:
                if key in spec:
                    walk(value[key], spec[key])
        elif isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)):
            for item, item_spec in zip(value, spec):
                walk(item, item_spec)
        else:  # a library container (a Hugging Face cache...) given a flat list of specs
            leaves = [x for x in pytree.tree_leaves(value) if isinstance(x, torch.Tensor)]
            if isinstance(spec, (list, tuple)) and len(leaves) == len(spec):
                for item, item_spec in zip(leaves, spec):
                    walk(item, item_spec)

    if isinstance(dynamic_shapes, Mapping):
        forward = model.forward if isinstance(model, torch.nn.Module) else model
        try:
            bound = inspect.signature(forward).bind(*args, **kwargs).arguments
        except (TypeError, ValueError):
            bound = dict(kwargs)
        for key, spec in dynamic_shapes.items():
            if key in bound:
                walk(bound[key], spec)
    else:
        walk(tuple(args) + tuple(kwargs.values()), tuple(dynamic_shapes))
    return specs


def shared_axis_names(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], dynamic_shapes: Any
) -> dict[str, torch.export.Dim]:
    """A ``Dim`` for each string axis name (``dynamic_shapes={"ids": {0: "batch"}, "mask": {0: "batch"}}``, or
    ``dynamic_axes``) given to several axes whose example sizes agree (at least 2, torch.export's smallest dynamic
    size), unless a ``Dim`` object of the user's carries the name too."""
    sizes = {id(x): x.shape for x in pytree.tree_leaves((args, dict(kwargs))) if isinstance(x, torch.Tensor)}
    axes: dict[str, list[int]] = {}
    taken: set[str] = set()
    for (tensor, dim), spec in dynamic_dims(model, args, kwargs, dynamic_shapes).items():
        if isinstance(spec, str):
            axes.setdefault(spec, []).append(int(sizes[tensor][dim]) if tensor in sizes else -1)
        elif isinstance(getattr(spec, "__name__", None), str):
            taken.add(spec.__name__)
    return {
        name: torch.export.Dim(name)
        for name, found in axes.items()
        if len(found) > 1 and len(set(found)) == 1 and found[0] >= 2 and name.isidentifier() and name not in taken
    }


def dim_names(
    model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], dynamic_shapes: Any
) -> dict[tuple[int, int], str]:
    """(id of input tensor, dim) -> the name the user gave it: a ``torch.export.Dim``'s, or a string."""
    names: dict[tuple[int, int], str] = {}
    for key, spec in dynamic_dims(model, args, kwargs, dynamic_shapes).items():
        name = spec if isinstance(spec, str) else getattr(spec, "__name__", None)
        if name and not name.startswith("_"):
            names[key] = name
    return names
