"""What an export did, and why: capture, decompositions, dispatch decisions, Casts, stage times,
verification, and on failure the error with where it happened.

The same facts are written as Markdown (for people) and as a SARIF 2.1.0 log (for tools: code
scanning, IDEs), each finding pointing at the line of the user's model it came from.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import pathlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx

from fx2onnx import _dtypes as dtypes
from fx2onnx import errors
from fx2onnx._dispatch import DispatchDecision
from fx2onnx._records import BASE_OPSET, CastRecord, DecompositionRecord
from fx2onnx._version import __version__

if TYPE_CHECKING:
    from fx2onnx._intermediates import NodeComparison
    from fx2onnx._verification import OutputVerification

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SARIF_SUFFIXES = (".sarif", ".sarif.json")
# Beyond this many rows a Markdown table is cut (the SARIF log keeps everything).
MAX_TABLE_ROWS = 200


@dataclasses.dataclass(frozen=True)
class Rule:
    id: str
    name: str
    level: str  # the default SARIF level of its findings
    description: str
    help: str


RULES = {
    rule.name: rule
    for rule in (
        Rule(
            "FX2ONNX001",
            "dispatch-decision",
            "note",
            "Which implementation lowers an FX node, and the Casts it needed.",
            "A note means the implementation needed Casts (its type constraints do not take eager's dtypes). "
            "Register an implementation that takes them to avoid the Casts.",
        ),
        Rule(
            "FX2ONNX002",
            "cast-inserted",
            "note",
            "A Cast the exporter inserted outside dispatch (type promotion, legalization).",
            "Casts keep eager's dtypes where ONNX or the target runtime lacks a kernel for them.",
        ),
        Rule(
            "FX2ONNX101",
            "unsupported-operator",
            "error",
            "No registered implementation can lower this operator for these inputs.",
            "Register an implementation with fx2onnx.register or custom_translation_table.",
        ),
        Rule(
            "FX2ONNX102",
            "lowering-failed",
            "error",
            "The implementation chosen for this node failed while emitting ONNX.",
            "Register a working implementation with fx2onnx.register or custom_translation_table.",
        ),
        Rule(
            "FX2ONNX103",
            "capture-failed",
            "error",
            "The model could not be captured as an FX graph.",
            "Try strict=True or False, extractor='symbolic_trace', or rewrite the code torch.export rejects.",
        ),
        Rule(
            "FX2ONNX104",
            "invalid-model",
            "error",
            "The exported model fails the ONNX checker.",
            "The implementation chosen for the named node emits invalid ONNX; register a correct one.",
        ),
        Rule(
            "FX2ONNX105",
            "export-failed",
            "error",
            "The export failed.",
            "See the message; the Markdown report has the full context.",
        ),
        Rule(
            "FX2ONNX106",
            "no-legal-types",
            "error",
            "A node has no kernel in the target runtime in any type it may compute in.",
            "Cast the tensors to a type the target runs, export for another target, or register an implementation.",
        ),
        Rule(
            "FX2ONNX201",
            "output-verification",
            "error",
            "An output of the ONNX model, run in ONNX Runtime, compared with eager PyTorch.",
            "A mismatch means the dtype, the shape or the values (beyond tolerance) differ.",
        ),
        Rule(
            "FX2ONNX202",
            "first-differing-node",
            "error",
            "The first FX node, in graph order, whose ONNX value differs from its eager value.",
            "Check the implementation chosen for this node (see its dispatch decision).",
        ),
    )
}


@dataclasses.dataclass
class ExportReport:
    model_name: str
    strategy: str = ""
    graph_nodes: int = 0
    decomposed: list[str] = dataclasses.field(default_factory=list)
    # none, local (which nodes) or full (why): how capture decomposed the graph
    decomposition: DecompositionRecord = dataclasses.field(default_factory=DecompositionRecord)
    decisions: list[DispatchDecision] = dataclasses.field(default_factory=list)
    casts: list[CastRecord] = dataclasses.field(default_factory=list)
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    # Within the "capture" stage: the tracer's own time ("torch.export") and decomposition's.
    capture_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    fx_passes: list[str] = dataclasses.field(default_factory=list)
    verification: list[OutputVerification] | None = None  # a Verification (with intermediates) when asked
    error: str | None = None
    opset: int = BASE_OPSET
    target: str = ""
    exception: BaseException | None = None
    promotion_casts: list[CastRecord] = dataclasses.field(default_factory=list)  # FX casts the passes inserted
    # Dims `dynamic_shapes` asked to be dynamic that the model's code made static or constrained.
    dynamic_dims: list[str] = dataclasses.field(default_factory=list)
    # What capture assumed to get through data-dependent code (the capture strategies' warning): each assumption with
    # the value taken and the model's line (a tensor_split's count of sections fixed to the example's...).
    capture_assumptions: list[str] = dataclasses.field(default_factory=list)

    def all_casts(self) -> list[CastRecord]:
        """Every Cast the export added: by FX promotion, by dispatch, back to eager's dtype, by legalization."""
        return [*self.promotion_casts, *self.casts]

    # --- derived facts ----------------------------------------------------------------------------
    def dispatch_table(self) -> list[tuple[str, int, str, str]]:
        """(overload, count, chosen implementation, perfect/cast) rows, most frequent first."""
        return [(row.overload, row.count, row.implementation, row.match) for row in self.dispatch_rows()]

    def dispatch_rows(self) -> list[DispatchRow]:
        """One row per (overload, implementation, match kind), with the Casts its nodes needed, by reason."""
        rows: dict[tuple[str, str, str], DispatchRow] = {}
        row_of_node: dict[str, DispatchRow] = {}
        for decision in self.decisions:
            chosen = decision.chosen.implementation.name if decision.chosen else "-"
            kind = decision.chosen.kind if decision.chosen else "none"
            key = (decision.target, chosen, kind)
            row = rows.setdefault(key, DispatchRow(decision.target, 0, chosen, kind))
            row.count += 1
            row_of_node[decision.node] = row
        for cast in self.all_casts():
            row = row_of_node.get(cast.node)
            if row is not None:
                row.casts[cast.reason] += 1
        return sorted(rows.values(), key=lambda r: (-r.count, r.overload))

    @property
    def intermediates(self) -> list[NodeComparison] | None:
        return getattr(self.verification, "intermediates", None)

    @property
    def first_mismatch(self) -> NodeComparison | None:
        return getattr(self.verification, "first_mismatch", None)

    def failure(self) -> Failure | None:
        """The error, with the node, overload and source line it is tied to when known."""
        if self.exception is None and self.error is None:
            return None
        exception = self.exception
        if exception is not None:
            kind, message = type(exception).__name__, str(exception)
        else:
            kind, _, message = (self.error or "").partition(": ")
        node = getattr(exception, "node", None)
        target = getattr(exception, "target", None)
        frame = getattr(exception, "frame", None)
        if isinstance(exception, errors.LoweringError) and node is None and self.decisions:
            last = self.decisions[-1]  # the node being lowered when it failed
            node, target, frame = last.node, last.target, errors.source_frame(last.stack_trace)
        if isinstance(exception, errors.VerificationError) and self.first_mismatch is not None:
            first = self.first_mismatch
            node, target, frame = first.node, first.target, first.frame
        if frame is None and exception is not None and not isinstance(exception, errors.ExportError):
            frame = errors.user_frame(exception)
        return Failure(kind, message, _rule_for(exception), node, target, frame)

    # --- writing ----------------------------------------------------------------------------------
    def write(self, path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> None:
        """Write the report: Markdown, or SARIF 2.1.0 for a ``.sarif`` path; a list of paths writes each."""
        paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
        for item in paths:
            item = os.fspath(item)
            directory = os.path.dirname(os.path.abspath(item))
            os.makedirs(directory, exist_ok=True)
            text = self.to_sarif_json() if is_sarif_path(item) else self.to_markdown()
            with open(item, "w", encoding="utf-8") as stream:
                stream.write(text)

    def summary(self) -> str:
        total = sum(self.stage_seconds.values())
        times = ", ".join(f"{k} {v:.2f}s" for k, v in self.stage_seconds.items())
        casts = collections.Counter(c.reason for c in self.all_casts())
        cast_text = ", ".join(f"{n} {r}" for r, n in casts.items()) or "none"
        cast_matches = sum(1 for d in self.decisions if d.chosen is not None and not d.perfect)
        failed = sum(1 for d in self.decisions if d.chosen is None)  # nothing could lower the node
        matches = f"{cast_matches} cast matches" + (f", {failed} failed" if failed else "")
        return (
            f"{self.model_name}: {self.graph_nodes} FX nodes via {self.strategy or '?'}, "
            f"{len(self.decisions)} dispatched ({matches}), "
            f"Casts added: {cast_text}; {total:.2f}s ({times})"
        )

    # --- Markdown ---------------------------------------------------------------------------------
    def to_markdown(self) -> str:
        failure = self.failure()
        status = f"**FAILED** ({failure.kind})" if failure else "succeeded"
        lines = [f"# fx2onnx export report: {self.model_name}", "", f"Export {status}.", "", self.summary(), ""]
        if failure:
            lines += ["## Error", ""]
            if failure.node:
                lines.append(f"- node: `{failure.node}` (`{failure.target}`)")
            if failure.frame:
                lines.append(f"- source: `{_md(str(failure.frame))}`")
            lines += ["", "```", failure.message.strip(), "```", ""]
        lines += self._markdown_capture()
        lines += self._markdown_dispatch()
        lines += self._markdown_casts()
        lines += self._markdown_stages()
        lines += self._markdown_verification()
        return "\n".join(lines).rstrip() + "\n"

    def _markdown_capture(self) -> list[str]:
        lines = [
            "## Capture",
            "",
            "| strategy | capture time | FX nodes | opset | target |",
            "|---|---|---|---|---|",
            f"| {self.strategy or '-'} | {self.stage_seconds.get('capture', 0.0):.2f}s | {self.graph_nodes} "
            f"| {self.opset} | {self.target or '-'} |",
            "",
        ]
        decomposed = ", ".join(f"`{d}`" for d in self.decomposed) or "none"
        lines += [f"Decompositions applied: {decomposed}", ""]
        lines += [f"Decomposition strategy: {self.decomposition.describe()}", ""]
        passes = ", ".join(f"`{p}`" for p in self.fx_passes) or "none"
        lines += [f"FX passes that changed the graph: {passes}", ""]
        if self.dynamic_dims:
            lines += ["Dynamic dims the model's code made static or constrained:", ""]
            lines += [f"- {_md(note)}" for note in self.dynamic_dims] + [""]
        if self.capture_assumptions:
            lines += ["Capture's assumptions on data-dependent code:", ""]
            lines += [f"- {_md(note)}" for note in self.capture_assumptions] + [""]
        return lines

    def _markdown_dispatch(self) -> list[str]:
        lines = [
            "## Dispatch",
            "",
            "| overload | count | implementation | match | Casts added |",
            "|---|---|---|---|---|",
        ]
        for row in self.dispatch_rows():
            casts = ", ".join(f"{n} {reason}" for reason, n in sorted(row.casts.items())) or "-"
            lines.append(f"| `{row.overload}` | {row.count} | `{row.implementation}` | {row.match} | {casts} |")
        not_perfect = [d for d in self.decisions if not d.perfect]
        if not_perfect:
            lines += ["", "### Decisions that were not a perfect match", ""]
            for decision in not_perfect[:MAX_TABLE_ROWS]:
                source = errors.source_line(decision.stack_trace)
                lines += ["```", decision.explain()] + ([f"  from: {source}"] if source else []) + ["```"]
            lines += _cut_note(len(not_perfect))
        return [*lines, ""]

    def _markdown_casts(self) -> list[str]:
        all_casts = self.all_casts()
        by_reason = collections.Counter(c.reason for c in all_casts)
        totals = ", ".join(f"{n} {reason}" for reason, n in sorted(by_reason.items())) or "none"
        lines = ["## Casts", "", f"Casts added: {totals}.", ""]
        if all_casts:
            sources = self._sources()
            lines += ["| FX node | value | from | to | reason | source |", "|---|---|---|---|---|---|"]
            for cast in all_casts[:MAX_TABLE_ROWS]:
                source = sources.get(cast.node)
                lines.append(
                    f"| `{cast.node}` | `{cast.value}` | {cast.from_dtype} | {cast.to_dtype} | {cast.reason} "
                    f"| {_md(source) if source else '-'} |"
                )
            lines += _cut_note(len(all_casts))
        return [*lines, ""]

    def _markdown_stages(self) -> list[str]:
        total = sum(self.stage_seconds.values()) or 1.0
        lines = ["## Stage times", "", "| stage | seconds | share |", "|---|---|---|"]
        for stage, seconds in self.stage_seconds.items():
            lines.append(f"| {stage} | {seconds:.3f} | {100 * seconds / total:.0f}% |")
            if stage == "capture":
                for part, part_seconds in self.capture_seconds.items():
                    lines.append(
                        f"| &nbsp;&nbsp;of which {part} | {part_seconds:.3f} | {100 * part_seconds / total:.0f}% |"
                    )
        lines.append(f"| total | {sum(self.stage_seconds.values()):.3f} | 100% |")
        return [*lines, ""]

    def _markdown_verification(self) -> list[str]:
        if self.verification is None:
            return []
        lines = [
            "## Verification",
            "",
            "| output | dtype (eager) | shape (eager) | max abs err | max rel err | tolerance | status |",
            "|---|---|---|---|---|---|---|",
        ]
        for v in self.verification:
            tolerance = f"rtol {v.rtol:g}, atol {v.atol:g}"
            if v.noise is not None:  # beyond the fixed tolerance, judged against float32 eager
                tolerance += f"; {v.expected_dtype} rounding noise, {v.noise}"
            lines.append(
                f"| `{v.name}` | {v.actual_dtype} ({v.expected_dtype}) | {list(v.actual_shape)} "
                f"({list(v.expected_shape)}) | {v.max_abs_error:.3g} | {v.max_rel_error:.3g} "
                f"| {tolerance} | {'ok' if v.passed else '**MISMATCH**'} |"
            )
        nodes = self.intermediates
        if nodes is None:
            return [*lines, ""]
        first = self.first_mismatch
        compared = sum(1 for c in nodes if c.result is not None)
        lines += ["", "### Intermediate values", ""]
        lines.append(f"{compared} of {len(nodes)} FX node values compared with eager, in graph order.")
        if first is not None:
            lines.append(
                f"**First differing node: `{first.node}` (`{first.target}`)**"
                + (f" at `{_md(first.source)}`" if first.source else "")
            )
        else:
            lines.append("No FX node differs from eager beyond tolerance.")
        lines += [
            "",
            "| # | FX node | overload | ONNX value | dtype (eager) | max abs err | max rel err | status | source |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        # Up to the first mismatch and a little past it: what follows mostly inherits the difference.
        stop = len(nodes) if first is None else min(len(nodes), nodes.index(first) + 6)
        shown = nodes[: min(stop, MAX_TABLE_ROWS)]
        for c in shown:
            r = c.result
            dtype = f"{r.actual_dtype} ({r.expected_dtype})" if r else "-"
            abs_err = f"{r.max_abs_error:.3g}" if r else "-"
            rel_err = f"{r.max_rel_error:.3g}" if r else "-"
            status = "**MISMATCH**" if c.status == "mismatch" else c.status
            lines.append(
                f"| {c.index} | `{c.node}` | `{c.target}` | {f'`{c.onnx_value}`' if c.onnx_value else '-'} | {dtype} "
                f"| {abs_err} | {rel_err} | {status} | {_md(c.source) if c.source else '-'} |"
            )
        if len(shown) < len(nodes):
            lines.append(f"\n({len(nodes) - len(shown)} later nodes not shown.)")
        return [*lines, ""]

    def _sources(self) -> dict[str, str]:
        """FX node name -> the user's source line."""
        sources = {}
        for decision in self.decisions:
            source = errors.source_line(decision.stack_trace)
            if source:
                sources[decision.node] = source
        return sources

    # --- SARIF 2.1.0 ------------------------------------------------------------------------------
    def to_sarif_json(self) -> str:
        return json.dumps(_finite(self.to_sarif()), indent=2, allow_nan=False) + "\n"

    def to_sarif(self) -> dict[str, Any]:
        """The report as a SARIF 2.1.0 log: one run, a result per finding, the tables in the run's properties."""

        rule_index = {name: i for i, name in enumerate(RULES)}
        results = list(self._sarif_results())
        for result in results:
            name = result.pop("rule")
            result["ruleId"] = RULES[name].id
            result["ruleIndex"] = rule_index[name]
        failure = self.failure()
        invocation: dict[str, Any] = {"executionSuccessful": failure is None}
        if failure is not None:
            invocation["toolExecutionNotifications"] = [
                {"level": "error", "message": {"text": f"{failure.kind}: {failure.message.strip()}"}}
            ]
        run = {
            "tool": {
                "driver": {
                    "name": "fx2onnx",
                    "version": __version__,
                    "informationUri": "https://pypi.org/project/fx2onnx/",
                    "rules": [_sarif_rule(rule) for rule in RULES.values()],
                }
            },
            "invocations": [invocation],
            "results": results,
            "properties": self._sarif_properties(),
        }
        return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}

    def _sarif_results(self) -> Iterable[dict[str, Any]]:
        failure = self.failure()
        if failure is not None:
            yield _result(
                failure.rule,
                "error",
                f"{failure.kind}: {failure.message.strip()}",
                failure.frame,
                failure.node,
                properties={"overload": failure.target} if failure.target else None,
            )
        casts_by_node: dict[str, list[CastRecord]] = collections.defaultdict(list)
        for cast in self.all_casts():
            casts_by_node[cast.node].append(cast)
        dispatched = set()
        for decision in self.decisions:
            dispatched.add(decision.node)
            if decision.chosen is None:
                continue  # the failure above
            node_casts = casts_by_node.get(decision.node, [])
            chosen = decision.chosen.implementation.name
            text = f"`{decision.node}` = {decision.target}: {decision.chosen.kind} match with {chosen}"
            if node_casts:
                text += "; Casts added: " + ", ".join(
                    f"{c.value} {c.from_dtype}->{c.to_dtype} ({c.reason})" for c in node_casts
                )
            needs_attention = not decision.perfect or bool(node_casts)
            yield _result(
                "dispatch-decision",
                "note" if needs_attention else None,
                text + ".\n" + decision.explain(),
                errors.source_frame(decision.stack_trace),
                decision.node,
                kind=None if needs_attention else "pass",
                properties={
                    "overload": decision.target,
                    "implementation": chosen,
                    "match": decision.chosen.kind,
                    "inputDtypes": decision.input_dtypes,
                    "casts": [dataclasses.asdict(c) for c in node_casts],
                },
            )
        for node, node_casts in casts_by_node.items():
            if node in dispatched:
                continue
            for cast in node_casts:
                yield _result(
                    "cast-inserted",
                    "note",
                    f"Cast of {cast.value} from {cast.from_dtype} to {cast.to_dtype} at `{node}` ({cast.reason}).",
                    None,
                    node,
                    properties=dataclasses.asdict(cast),
                )
        for v in self.verification or []:
            yield _result(
                "output-verification",
                None if v.passed else "error",
                str(v),
                None,
                None,
                kind="pass" if v.passed else None,
                properties=dataclasses.asdict(v),
            )
        first = self.first_mismatch
        if first is not None:
            yield _result(
                "first-differing-node",
                "error",
                f"First FX node whose ONNX value differs from eager: {first}",
                first.frame,
                first.node,
                properties={"overload": first.target, "onnxValue": first.onnx_value},
            )

    def _sarif_properties(self) -> dict[str, Any]:
        properties: dict[str, Any] = {
            "model": self.model_name,
            "target": self.target,
            "opset": self.opset,
            "capture": {
                "strategy": self.strategy,
                "seconds": self.stage_seconds.get("capture", 0.0),
                "secondsByPart": dict(self.capture_seconds),
                "fxNodes": self.graph_nodes,
            },
            "decompositions": list(self.decomposed),
            "decomposition": {
                "strategy": self.decomposition.strategy,
                "reason": self.decomposition.reason,
                "nodes": [{"node": name, "overload": target} for name, target in self.decomposition.nodes],
                "functionalized": [
                    {"node": name, "overload": target} for name, target in self.decomposition.functionalized
                ],
            },
            "fxPasses": list(self.fx_passes),
            "dispatchTable": [
                {
                    "overload": row.overload,
                    "count": row.count,
                    "implementation": row.implementation,
                    "match": row.match,
                    "casts": dict(row.casts),
                }
                for row in self.dispatch_rows()
            ],
            "castsByReason": dict(collections.Counter(c.reason for c in self.all_casts())),
            "stageSeconds": dict(self.stage_seconds),
        }
        if self.verification is not None:
            properties["verification"] = [dataclasses.asdict(v) for v in self.verification]
        nodes = self.intermediates
        if nodes is not None:
            first = self.first_mismatch
            properties["intermediates"] = {
                "nodes": len(nodes),
                "compared": sum(1 for c in nodes if c.result is not None),
                "missing": sum(1 for c in nodes if c.status == "missing"),
                "firstMismatch": None if first is None else {"node": first.node, "overload": first.target},
            }
        return properties


@dataclasses.dataclass
class DispatchRow:
    overload: str
    count: int
    implementation: str
    match: str
    casts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)


@dataclasses.dataclass
class Failure:
    kind: str  # the exception's type name
    message: str
    rule: str
    node: str | None
    target: str | None
    frame: errors.SourceFrame | None


def casts_inserted_by_passes(graph: torch.fx.Graph, nodes_before: set[torch.fx.Node]) -> list[CastRecord]:
    """The dtype conversions FX passes (type promotion) inserted, each attributed to the node that consumes it."""
    from fx2onnx._passes.subgraphs import graph_modules

    records = []
    owner = graph.owning_module
    # Control-flow bodies too, their nodes named by path (`true_graph_0.sin`) as in the dispatch decisions.
    scopes = [(f"{p}." if p else "", m.graph) for p, m in graph_modules(owner)] if owner is not None else [("", graph)]
    for prefix, scope in scopes:
        for node in scope.nodes:
            if node in nodes_before or node.op != "call_function" or len(node.all_input_nodes) != 1:
                continue
            source = node.all_input_nodes[0]
            to_dtype = _fx_dtype(node)
            from_dtype = _fx_dtype(source)
            if to_dtype is None or from_dtype == to_dtype:
                continue
            consumer = next(iter(node.users), node)
            from_name, to_name = dtypes.short_name(from_dtype), dtypes.short_name(to_dtype)
            records.append(CastRecord(prefix + consumer.name, source.name, from_name, to_name, "promotion"))
    return records


def _fx_dtype(node: torch.fx.Node) -> torch.dtype | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dtype
    symbolic = {torch.SymBool: torch.bool, torch.SymInt: torch.int64, torch.SymFloat: torch.float32}
    return next((dtype for kind, dtype in symbolic.items() if isinstance(val, kind)), None)


def is_sarif_path(path: str | os.PathLike[str]) -> bool:
    return os.fspath(path).lower().endswith(SARIF_SUFFIXES)


def _rule_for(exception: BaseException | None) -> str:
    if isinstance(exception, errors.UnsupportedOperatorError):
        return "unsupported-operator"
    if isinstance(exception, errors.LoweringError):
        return "lowering-failed"
    if isinstance(exception, errors.CaptureError):
        return "capture-failed"
    if isinstance(exception, errors.InvalidModelError):
        return "invalid-model"
    if isinstance(exception, errors.VerificationError):
        return "first-differing-node"
    if isinstance(exception, errors.LegalizationError):
        return "no-legal-types"
    return "export-failed"


def _sarif_rule(rule: Rule) -> dict[str, Any]:
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.description},
        "help": {"text": rule.help},
        "defaultConfiguration": {"level": rule.level},
    }


def _result(
    rule: str,
    level: str | None,
    text: str,
    frame: errors.SourceFrame | None,
    node: str | None,
    *,
    kind: str | None = None,
    properties: dict[str, Any] | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {"rule": rule, "message": {"text": text}}
    if kind is not None:
        result["kind"] = kind
        result["level"] = "none"  # SARIF: a result that is not a failure has level "none"
    elif level is not None:
        result["level"] = level
    location = _location(frame, node)
    if location:
        result["locations"] = [location]
    if properties:
        result["properties"] = properties
    return result


def _location(frame: errors.SourceFrame | None, node: str | None) -> dict[str, Any]:
    location: dict[str, Any] = {}
    if frame is not None and os.path.isabs(frame.path):
        physical: dict[str, Any] = {"artifactLocation": {"uri": pathlib.Path(frame.path).as_uri()}}
        if frame.line >= 1:
            physical["region"] = {"startLine": frame.line}
            if frame.code:
                physical["region"]["snippet"] = {"text": frame.code}
        location["physicalLocation"] = physical
    if node:
        location["logicalLocations"] = [{"name": node, "kind": "variable"}]
    if frame is not None and "physicalLocation" not in location:
        location["message"] = {"text": str(frame)}
    return location


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _md(text: str) -> str:
    """Text safe inside a Markdown table cell or code span."""
    return text.replace("|", "\\|").replace("`", "'").replace("\n", " ")


def _cut_note(total: int) -> list[str]:
    if total <= MAX_TABLE_ROWS:
        return []
    return [f"\n({total - MAX_TABLE_ROWS} more not shown; the SARIF log has them all.)"]
