"""Several branches on values (BART's float16 ``if not torch.isfinite(h).all(): clamp``, once per encoder layer):
the region of the graph each branch's answer changes, found by diffing a capture with branches answered the other
way against the general one at the FX level, and emitted as one If per branch around its region.

``_branch_join.py`` calls :func:`join_value_questions` where the capture asked several questions on values; the
If of a single question is its own (``_branch_join.join_special_branch``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sympy
import torch

from fx2onnx import _capture as capture_stage
from fx2onnx import _capture_strategies as capture_strategies
from fx2onnx._emit import branches
from fx2onnx._emit.graph_builder import GraphEmitter
from fx2onnx._records import FX_NODE
from fx2onnx._torch_ops import aten


@dataclasses.dataclass
class EmittedBranch:
    """A special capture's emission: its model, and the ONNX value of each FX node (to diff it with the general's)."""

    model: Any
    env: Mapping[torch.fx.Node, Any]


@dataclasses.dataclass
class _AnswerRegion:
    """What answering one branch on a value the other way changes in the FX graph: the special capture's nodes are
    the general's (`mapping`: special -> general) but for a run of them in the middle (`general`, `special`), which
    the nodes after it read through `pairs` (general node, special node: read in place of each other), the general
    graph's `readers` of each pair's node reading it as that pair."""

    general: list[torch.fx.Node]
    special: list[torch.fx.Node]
    mapping: dict[torch.fx.Node, torch.fx.Node]
    pairs: list[tuple[torch.fx.Node, torch.fx.Node]]
    readers: list[set[torch.fx.Node]]


def _computed_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The nodes that the outputs or a branch's condition (an ``item()``) read, in order, but the placeholders: not
    the assertions that differ between the sides of a branch on a value (each side asserts its own), nor the
    constants (``get_attr``: compared by their data where read, each capture numbers them its own way)."""
    stack = [node for node in graph.nodes if node.op == "output" or node.target is aten._local_scalar_dense.default]
    read: set[torch.fx.Node] = set()
    while stack:
        node = stack.pop()
        if node not in read:
            read.add(node)
            stack.extend(node.all_input_nodes)
    return [node for node in graph.nodes if node in read and node.op not in ("placeholder", "get_attr")]


def _same_tensor(one: Any, other: Any) -> bool:
    """The same data (a weight shared by the two captures, or constants equal bit for bit, NaN included)."""
    if not isinstance(one, torch.Tensor) or not isinstance(other, torch.Tensor):
        return False
    if one is other:
        return True
    if one.dtype != other.dtype or one.shape != other.shape or one.device != other.device:
        return False
    if (one.data_ptr(), one.stride()) == (other.data_ptr(), other.stride()):
        return True
    if one.numel() * one.element_size() > 1 << 16:  # a large constant of its own in each capture: not compared
        return False
    return torch.equal(one.contiguous().reshape(-1).view(torch.uint8), other.contiguous().reshape(-1).view(torch.uint8))


def _same_inputs(general: capture_stage.CapturedGraph, special: capture_stage.CapturedGraph) -> dict[Any, Any]:
    """special placeholder -> the general's of the same name, for user inputs and weights of the same data."""
    by_name = {node.name: node for node in general.graph.nodes if node.op == "placeholder"}
    mapping = {}
    for node in special.graph.nodes:
        other = by_name.get(node.name) if node.op == "placeholder" else None
        if other is None:
            continue
        if node in special.weights or other in general.weights:
            own, theirs = special.weights.get(node), general.weights.get(other)
            if own is None or theirs is None or own[0] != theirs[0] or not _same_tensor(own[1], theirs[1]):
                continue
        elif (node in special.constant_inputs) != (other in general.constant_inputs):
            continue
        mapping[node] = other
    return mapping


def _same_argument(special: Any, general: Any, mapping: Mapping[torch.fx.Node, torch.fx.Node]) -> bool:
    if _both_constants(special, general):
        return _same_tensor(_attribute(special), _attribute(general))
    if isinstance(special, torch.fx.Node):
        return mapping.get(special) is general
    if isinstance(special, (list, tuple)):
        return (
            type(special) is type(general)
            and len(special) == len(general)
            and all(_same_argument(one, other, mapping) for one, other in zip(special, general))
        )
    if isinstance(special, dict):
        return (
            isinstance(general, dict)
            and special.keys() == general.keys()
            and all(_same_argument(special[key], general[key], mapping) for key in special)
        )
    if isinstance(special, float) and isinstance(general, float) and math.isnan(special) and math.isnan(general):
        return True
    try:
        return type(special) is type(general) and bool(special == general)
    except Exception:  # a tensor of several elements, a symbolic value: not provably the same
        return False


def _same_node(special: torch.fx.Node, general: torch.fx.Node, mapping: Mapping[torch.fx.Node, torch.fx.Node]) -> bool:
    if special.op != general.op or special.target != general.target:
        return False
    if special.op == "get_attr":
        return _same_tensor(_attribute(special), _attribute(general))
    return _same_argument(special.args, general.args, mapping) and _same_argument(
        special.kwargs, general.kwargs, mapping
    )


def _both_constants(special: Any, general: Any) -> bool:
    return (
        isinstance(special, torch.fx.Node)
        and isinstance(general, torch.fx.Node)
        and special.op == general.op == "get_attr"
    )


def _attribute(node: torch.fx.Node) -> Any:
    owner: Any = node.graph.owning_module
    for part in str(node.target).split("."):
        owner = getattr(owner, part, None)
    return owner


def _read_pairs(
    special: Any, general: Any, mapping: Mapping[torch.fx.Node, torch.fx.Node], found: list[tuple[Any, Any]]
) -> bool:
    """The arguments of a node after the region, on both sides: the same but for nodes; (general, special) of each
    node argument appended to `found`. False where they differ otherwise."""
    if _both_constants(special, general):
        return _same_tensor(_attribute(special), _attribute(general))
    if isinstance(special, torch.fx.Node):
        if not isinstance(general, torch.fx.Node):
            return False
        found.append((general, special))
        return True
    if isinstance(special, (list, tuple)):
        return (
            type(special) is type(general)
            and len(special) == len(general)
            and all(_read_pairs(one, other, mapping, found) for one, other in zip(special, general))
        )
    if isinstance(special, dict):
        return (
            isinstance(general, dict)
            and special.keys() == general.keys()
            and all(_read_pairs(special[key], general[key], mapping, found) for key in special)
        )
    return _same_argument(special, general, mapping)


def _same_tensor_type(one: torch.fx.Node, other: torch.fx.Node) -> bool:
    first, second = one.meta.get("val"), other.meta.get("val")
    return (
        isinstance(first, torch.Tensor)
        and isinstance(second, torch.Tensor)
        and first.dtype == second.dtype
        and [str(size) for size in first.shape] == [str(size) for size in second.shape]
    )


def _answer_regions(
    general_capture: capture_stage.CapturedGraph, special_capture: capture_stage.CapturedGraph, split: bool
) -> list[_AnswerRegion] | str:
    """The runs of nodes that answering branches on values the other way replaces (:class:`_AnswerRegion`), or why
    the two captures differ otherwise: nodes after a run that compute something else, a value read in place of
    another whose dtype or shape differs (the rest of the graph was captured for one). `split`: the special capture
    answered every branch the other way, one run per branch, between its ``item()`` and the next; else one run."""
    general_nodes, special_nodes = _computed_nodes(general_capture.graph), _computed_nodes(special_capture.graph)
    mapping: dict[torch.fx.Node, torch.fx.Node] = _same_inputs(general_capture, special_capture)
    general_mapped = set(mapping.values())
    paired: dict[torch.fx.Node, torch.fx.Node] = {}
    readers: dict[torch.fx.Node, set[torch.fx.Node]] = {}
    chunks = [(0, len(general_nodes), 0, len(special_nodes))]
    if split:
        asked = aten._local_scalar_dense.default
        general_ends = [index + 1 for index, node in enumerate(general_nodes) if node.target is asked]
        special_ends = [index + 1 for index, node in enumerate(special_nodes) if node.target is asked]
        if len(general_ends) != len(special_ends):
            return "answered the other way, the branches ask another number of questions"
        general_ends.append(len(general_nodes))
        special_ends.append(len(special_nodes))
        chunks = [
            (general_start, general_end, special_start, special_end)
            for general_start, general_end, special_start, special_end in zip(
                [0, *general_ends[:-1]], general_ends, [0, *special_ends[:-1]], special_ends
            )
        ]

    def accept(special_node: torch.fx.Node, general_node: torch.fx.Node) -> None:
        mapping[special_node] = general_node
        general_mapped.add(general_node)

    def same_reads(special_node: torch.fx.Node, general_node: torch.fx.Node) -> list[tuple[Any, Any]] | None:
        """The node's reads where each is the same node or a replaced one already paired, or None."""
        if special_node.op != general_node.op or special_node.target != general_node.target:
            return None
        if special_node.op == "get_attr":
            return [] if _same_node(special_node, general_node, mapping) else None
        reads: list[tuple[Any, Any]] = []
        if not (
            _read_pairs(special_node.args, general_node.args, mapping, reads)
            and _read_pairs(special_node.kwargs, general_node.kwargs, mapping, reads)
        ):
            return None
        if all(mapping.get(s) is g or paired.get(g) is s for g, s in reads):
            return reads
        return None

    runs: list[tuple[list[torch.fx.Node], list[torch.fx.Node]]] = []
    owner: dict[torch.fx.Node, int] = {}  # a node of a run -> its chunk (a later chunk may read a run's values)
    chunk_pairs: list[list[torch.fx.Node]] = []
    for general_start, general_end, special_start, special_end in chunks:
        general_chunk = general_nodes[general_start:general_end]
        special_chunk = special_nodes[special_start:special_end]
        start = 0
        while start < min(len(general_chunk), len(special_chunk)):
            reads = same_reads(special_chunk[start], general_chunk[start])
            if reads is None:
                break
            for general_read, special_read in reads:
                if mapping.get(special_read) is not general_read:
                    readers[general_read].add(general_chunk[start])
            accept(special_chunk[start], general_chunk[start])
            start += 1

        def signature(node: torch.fx.Node) -> tuple[Any, ...]:
            return (node.op, node.target, len(node.args), tuple(node.kwargs))

        tail = 0
        while tail < min(len(general_chunk), len(special_chunk)) - start and signature(
            general_chunk[-1 - tail]
        ) == signature(special_chunk[-1 - tail]):
            tail += 1
        general_run = general_chunk[start : len(general_chunk) - tail]
        special_run = special_chunk[start : len(special_chunk) - tail]
        owner.update((node, len(runs)) for node in [*general_run, *special_run])
        runs.append((general_run, special_run))
        chunk_pairs.append([])
        for general_node, special_node in zip(
            general_chunk[len(general_chunk) - tail :], special_chunk[len(special_chunk) - tail :]
        ):
            reads = []
            if special_node.op == "get_attr":
                if not _same_node(special_node, general_node, mapping):
                    return f"{general_node.name} is another constant on either side of the branch"
                accept(special_node, general_node)
                continue
            if not (
                _read_pairs(special_node.args, general_node.args, mapping, reads)
                and _read_pairs(special_node.kwargs, general_node.kwargs, mapping, reads)
            ):
                return f"{general_node.name} computes something else after the branch on either side"
            same = {general_read for general_read, special_read in reads if mapping.get(special_read) is general_read}
            for general_read, special_read in reads:
                if mapping.get(special_read) is general_read:
                    continue
                if general_read in same:
                    return f"{general_node.name} reads both sides of a value the branch replaces"
                if paired.get(general_read) is special_read:
                    readers[general_read].add(general_node)
                    continue
                known_special = special_read in owner or special_read in mapping
                known_general = general_read in owner or general_read in general_mapped
                # the branch whose run computes the pair's value, or this one for two older values (not split)
                owners = {owner[node] for node in (general_read, special_read) if node in owner}
                if not owners and not split:
                    owners = {len(runs) - 1}
                if not (known_special and known_general) or len(owners) != 1:
                    return f"{general_node.name} reads other values on either side of the branch"
                if general_read in paired:
                    return f"{general_read.name} is replaced by two values"
                if not _same_tensor_type(general_read, special_read):
                    return f"{general_read.name} has another dtype or shape on the other side of the branch"
                paired[general_read] = special_read
                readers[general_read] = {general_node}
                chunk_pairs[owners.pop()].append(general_read)
            accept(special_node, general_node)
        if special_chunk and split and special_end != len(special_nodes) and special_chunk[-1] not in mapping:
            return f"answered the other way, the branch changes how {general_chunk[-1].name} is computed"
    # a later branch's own nodes read a value an earlier branch replaced as its replacement, as the nodes after it do
    pair_owner = {node: index for index, pairs in enumerate(chunk_pairs) for node in pairs}
    if split:
        # a value the special capture computes before the branches (x), read in place of what several branches
        # replace, or by a branch's own nodes after one replaced it: the original x, or x as that branch left it? Only
        # the capture of that branch alone says (the caller's fallback)
        kept: dict[torch.fx.Node, int] = {}
        for general_read in pair_owner:
            special_read = paired[general_read]
            if special_read in mapping:
                kept[special_read] = kept.get(special_read, 0) + 1
        if any(count > 1 for count in kept.values()) or any(
            read in kept for _, special_run in runs for node in special_run for read in node.all_input_nodes
        ):
            return "a value computed before the branches stands for what more than one branch leaves"
    for index, (general_run, _) in enumerate(runs):
        for node in general_run:
            for read in node.all_input_nodes:
                if pair_owner.get(read, index) < index and read in owner:  # computed by that branch: its If's
                    readers[read].add(node)
    regions = [
        _AnswerRegion(
            general_run,
            special_run,
            mapping,
            [(node, paired[node]) for node in pairs],
            [readers[node] for node in pairs],
        )
        for (general_run, special_run), pairs in zip(runs, chunk_pairs)
    ]
    if split:
        first = regions.pop(0)
        if first.general or first.special or first.pairs:
            return "the two captures differ before the first branch"
    return regions


def _value_region(
    model_ir: Any,
    general_env: Mapping[torch.fx.Node, Any],
    emitted: EmittedBranch,
    region: _AnswerRegion,
    condition: Any,
    sources: Mapping[sympy.Symbol, tuple[Any, int | None]],
    every_region: Sequence[_AnswerRegion],
) -> branches.QuestionRegion | str:
    """:class:`_AnswerRegion` in the two emitted graphs (their nodes emitted for its FX nodes), or why not. A value
    of the special capture that a branch replaces (`every_region`'s pairs) is read as the general value it replaces
    (``join_regions`` reads that branch's If in its place)."""
    import onnx_ir as ir

    general_names = {node.name for node in region.general}
    special_names = {node.name for node in region.special}
    graph = model_ir.graph
    outer: dict[Any, Any] = {}
    for special_node, general_node in region.mapping.items():
        special_value, general_value = emitted.env.get(special_node), general_env.get(general_node)
        if isinstance(special_value, (tuple, list)) and isinstance(general_value, (tuple, list)):
            outer.update(
                (one, other)
                for one, other in zip(special_value, general_value)
                if isinstance(one, ir.Value) and isinstance(other, ir.Value)
            )
        elif isinstance(special_value, ir.Value) and isinstance(general_value, ir.Value):
            if general_value.is_initializer() and graph.initializers.get(general_value.name) is not general_value:
                continue  # a weight the general emission folded: read by name
            outer[special_value] = general_value
    for other in every_region:
        for general_node, special_node in other.pairs:
            special_value, general_value = emitted.env.get(special_node), general_env.get(general_node)
            if special_node not in region.mapping and isinstance(special_value, ir.Value):
                outer.setdefault(special_value, general_value)
    pairs = []
    rewired, rewired_outputs = [], []
    for (general_node, special_node), readers in zip(region.pairs, region.readers):
        general_value = general_env.get(general_node)
        if special_node in region.mapping:
            special_value = general_env.get(region.mapping[special_node])
        else:
            special_value = emitted.env.get(special_node)
        if not isinstance(general_value, ir.Value) or not isinstance(special_value, ir.Value):
            return f"{general_node.name} is not one ONNX value"
        pairs.append((general_value, special_value))
        names = {reader.name for reader in readers}
        rewired.append(
            [
                (node, index)
                for node in graph
                if node.metadata_props.get(FX_NODE) in names
                for index, value in enumerate(node.inputs)
                if value is general_value
            ]
        )
        returned = any(reader.op == "output" for reader in readers)
        rewired_outputs.append(
            [index for index, value in enumerate(graph.outputs) if returned and value is general_value]
        )
    return branches.QuestionRegion(
        condition=condition,
        sources=sources,
        special=emitted.model,
        general_nodes=[node for node in graph if node.metadata_props.get(FX_NODE) in general_names],
        special_nodes=[node for node in emitted.model.graph if node.metadata_props.get(FX_NODE) in special_names],
        outer=outer,
        pairs=pairs,
        rewired=rewired,
        rewired_outputs=rewired_outputs,
    )


def _ambiguous_read(regions: Sequence[_AnswerRegion]) -> int | None:
    """The branch whose own nodes read a value that an earlier branch replaces but computed before it (BART's ``h``
    that the clamp replaces): the original, or as that branch left it? Neither capture says; None where none does.
    (A value the earlier branch computes itself is only read as it left it: its If's output.)"""
    kept: dict[torch.fx.Node, int] = {}
    for index, region in enumerate(regions):
        own = set(region.general)
        kept.update((general_node, index) for general_node, _ in region.pairs if general_node not in own)
    for index, region in enumerate(regions):
        reads = [region.mapping.get(read) for node in region.special for read in node.all_input_nodes]
        reads += [region.mapping.get(special_node) for _, special_node in region.pairs]
        reads += [read for node in region.general for read in node.all_input_nodes]
        if any(read is not None and kept.get(read, index) < index for read in reads):
            return index
    return None


def _each_region_its_own(
    captured: capture_stage.CapturedGraph,
    decisions: Sequence[capture_strategies.BranchDecision],
    regions: Sequence[_AnswerRegion],
    emit_special: Callable[[capture_strategies.BranchDecision], tuple[capture_stage.CapturedGraph, Any]],
) -> bool:
    """Whether each region of the capture with every branch flipped is its own branch's, not another's whose effect
    the model computes later (``c = bool(a.sum() > 0)``, another branch, then ``if c:``): checked by ceil(log2 k)
    captures more, the branches whose position has bit b set flipped in the b-th (any two branches differ in one),
    where each region must be as found for a flipped branch and empty for another."""

    def shape(region: _AnswerRegion) -> tuple[Any, ...]:
        return (
            [node.target for node in region.general],
            [node.target for node in region.special],
            len(region.pairs),
        )

    lines = [decision.source_line for decision in decisions]
    for bit in range((len(decisions) - 1).bit_length()):
        flipped = [(position >> bit) & 1 == 1 for position in range(len(decisions))]
        ordinals = frozenset(decision.ordinal for decision, flip in zip(decisions, flipped) if flip)
        try:
            probe, _ = emit_special(capture_strategies.every_value_flipped(ordinals))
        except Exception:
            return False
        asked = probe.branch_decisions
        if [inner.source_line for inner in asked] != lines or [not inner.general for inner in asked] != flipped:
            return False
        found = _answer_regions(captured, probe, split=True)
        if isinstance(found, str) or len(found) != len(regions):
            return False
        empty = ([], [], 0)
        if any(shape(got) != (shape(region) if flip else empty) for got, region, flip in zip(found, regions, flipped)):
            return False
    return True


def join_value_questions(
    model_ir: Any,
    captured: capture_stage.CapturedGraph,
    emitter: GraphEmitter,
    decisions: Sequence[capture_strategies.BranchDecision],
    emit_special: Callable[[capture_strategies.BranchDecision], tuple[capture_stage.CapturedGraph, Any]],
) -> tuple[capture_strategies.BranchDecision, str] | None:
    """Several branches on values (BART's float16 clamp, asked once per encoder layer): an If per branch runs the
    nodes its answer changes (:func:`_answer_regions`), of the side its value asks; the rest of the graph is shared.

    The regions come from one capture more, every branch answered the other way, diffed against the general one
    between the branches' ``item()``; where that diff fails, from one capture per branch, that one answered the
    other way (k + 1 captures for k branches; never 2**k). Which answers each combination gives is not captured:
    the answer of one must change nothing but its region, which holds where each capture asks the others' questions
    alike and the rest of its graph is the general one. Returns the branch that could not be joined and why, or
    None."""
    sources = []
    for decision in decisions:
        condition = decision.in_graph if decision.in_graph is not None else decision.condition
        symbols = sorted(condition.free_symbols, key=str)
        found_sources = branches.size_sources(captured, emitter.env, symbols)
        if len(found_sources) != len(symbols):
            return decision, "no value of the graph holds " + ", ".join(
                str(s) for s in symbols if s not in found_sources
            )
        sources.append((sympy.Not(condition) if decision.general else condition, found_sources))
    lines = [decision.source_line for decision in decisions]
    try:
        special, emitted = emit_special(capture_strategies.every_value_flipped())
    except Exception:  # each branch alone below, whose failure names it
        pass
    else:
        asked = special.branch_decisions
        if (
            [inner.source_line for inner in asked] == lines
            and all(inner.on_value and not inner.general for inner in asked)
            and special.out_spec == captured.out_spec
        ):
            found = _answer_regions(captured, special, split=True)
            if (
                not isinstance(found, str)
                and len(found) == len(decisions)
                and _ambiguous_read(found) is None
                and _each_region_its_own(captured, decisions, found, emit_special)
            ):
                regions = []
                for region, (side, found_sources) in zip(found, sources):
                    made = _value_region(model_ir, emitter.env, emitted, region, side, found_sources, found)
                    if isinstance(made, str):
                        break
                    regions.append(made)
                else:
                    try:
                        branches.join_regions(model_ir, regions)
                    except ValueError as error:
                        return decisions[0], f"the regions of the branches cannot be separated: {error}"
                    return None

    regions = []
    fx_regions: list[_AnswerRegion] = []
    for decision, (side, found_sources) in zip(decisions, sources):
        try:
            special, emitted = emit_special(decision)
        except Exception as error:
            return decision, f"its other side could not be exported: {type(error).__name__}: {_first_line(error)}"
        others = [inner.source_line for inner in decisions if inner is not decision]
        if [inner.source_line for inner in special.branch_decisions] != others or not all(
            inner.on_value for inner in special.branch_decisions
        ):
            return decision, "answered the other way, the model asks other questions after it"
        if special.out_spec != captured.out_spec:
            return decision, "answered the other way, the model returns another structure of outputs"
        found = _answer_regions(captured, special, split=False)
        if isinstance(found, str):
            return decision, f"the sides differ beyond a region whose values replace the general's: {found}"
        fx_regions.extend(found)
        made = _value_region(model_ir, emitter.env, emitted, found[0], side, found_sources, found)
        if isinstance(made, str):
            return decision, made
        regions.append(made)
    for decision, region in zip(decisions, fx_regions):
        if any(set(region.general) & set(other.general) for other in fx_regions if other is not region):
            return decision, "its region overlaps another branch's"
    # in the order the model computes the regions (a branch may act after a later one is asked): each reads the
    # values an earlier one replaced from its If
    position = {node: index for index, node in enumerate(captured.graph.nodes)}
    order = sorted(
        range(len(decisions)),
        key=lambda index: min(
            (position[node] for node in [*fx_regions[index].general, *itertools.chain(*fx_regions[index].readers)]),
            default=len(position),
        ),
    )
    decisions = [decisions[index] for index in order]
    fx_regions = [fx_regions[index] for index in order]
    regions = [regions[index] for index in order]
    ambiguous = _ambiguous_read(fx_regions)
    if ambiguous is not None:
        return decisions[ambiguous], "its side reads a value an earlier branch replaces, the original or the new one"
    try:
        branches.join_regions(model_ir, regions)
    except ValueError as error:
        return decisions[0], f"the regions of the branches cannot be separated: {error}"
    return None


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [""])[0]
