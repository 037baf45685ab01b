"""What an export did: capture, decompositions, dispatch decisions, Casts, stage times, verification."""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import TYPE_CHECKING

from fx2onnx.dispatch import DispatchDecision

if TYPE_CHECKING:
    from fx2onnx.emit.graph_builder import CastRecord
    from fx2onnx.program import OutputVerification


@dataclasses.dataclass
class ExportReport:
    model_name: str
    strategy: str = ""
    graph_nodes: int = 0
    decomposed: list[str] = dataclasses.field(default_factory=list)
    decisions: list[DispatchDecision] = dataclasses.field(default_factory=list)
    casts: list[CastRecord] = dataclasses.field(default_factory=list)
    stage_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    fx_passes: list[str] = dataclasses.field(default_factory=list)
    verification: list[OutputVerification] | None = None
    error: str | None = None
    opset: int = 18
    target: str = ""

    def dispatch_table(self) -> list[tuple[str, int, str, str]]:
        """(overload, count, chosen implementation, perfect/cast) rows, most frequent first."""
        rows: collections.Counter[tuple[str, str, str]] = collections.Counter()
        for decision in self.decisions:
            chosen = decision.chosen.implementation.name if decision.chosen else "-"
            kind = decision.chosen.kind if decision.chosen else "none"
            rows[(decision.target, chosen, kind)] += 1
        return [(t, n, c, k) for (t, c, k), n in rows.most_common()]

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write the report: Markdown (the default) or SARIF 2.1.0 for a ``.sarif`` path."""
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(self.to_markdown())

    def to_markdown(self) -> str:
        lines = [f"# fx2onnx export report: {self.model_name}", "", self.summary(), ""]
        if self.error:
            lines += ["## Error", "", "```", self.error, "```", ""]
        lines += ["## Dispatch", "", "| overload | count | implementation | match |", "|---|---|---|---|"]
        lines += [f"| `{t}` | {n} | `{c}` | {k} |" for t, n, c, k in self.dispatch_table()]
        lines += ["", "## Casts", "", "| node | value | from | to | reason |", "|---|---|---|---|---|"]
        lines += [f"| {c.node} | {c.value} | {c.from_dtype} | {c.to_dtype} | {c.reason} |" for c in self.casts]
        if self.verification is not None:
            lines += ["", "## Verification", ""] + [f"- {v}" for v in self.verification]
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        total = sum(self.stage_seconds.values())
        times = ", ".join(f"{k} {v:.2f}s" for k, v in self.stage_seconds.items())
        casts = collections.Counter(c.reason for c in self.casts)
        cast_text = ", ".join(f"{n} {r}" for r, n in casts.items()) or "none"
        return (
            f"{self.model_name}: {self.graph_nodes} FX nodes via {self.strategy}, "
            f"{len(self.decisions)} dispatched ({sum(1 for d in self.decisions if not d.perfect)} cast matches), "
            f"Casts added: {cast_text}; {total:.2f}s ({times})"
        )
