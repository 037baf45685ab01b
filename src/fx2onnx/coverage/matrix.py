"""The published support matrix: ``docs/support-matrix.json`` (the data) and its Markdown views.

The JSON holds one cell per (op, dtype) that eager supports: fx2onnx's status (with the failing
sample's first error line) and, when the sweep ran the reference exporter too, its status. The
Markdown files are rendered from the JSON alone, so they can be regenerated without a sweep.
"""

from __future__ import annotations

import collections
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from fx2onnx.coverage import check
from fx2onnx.coverage.cases import DTYPES, SEPARATE_DTYPES, SHORT_NAMES

MATRIX_JSON = "support-matrix.json"
MATRIX_MD = "support-matrix.md"
REFERENCE_MD = "support-matrix-reference.md"
COMMAND = "fx2onnx coverage --baseline --write-docs"

MARKS = {
    check.OK: "✓",
    check.EXPORT_ERROR: "E",
    check.INVALID_MODEL: "I",
    check.NO_KERNEL: "K",
    check.RUN_ERROR: "R",
    check.MISMATCH: "M",
    check.TIMEOUT: "T",
    check.EXCLUDED: "·",
}
# An ok cell whose outputs fail the fixed tolerance and pass only because eager's own rounding is as far from
# the float64 result (the noise criterion).
NOISE_MARK = "≈"
LEGEND = {
    check.OK: "exported, runs in ONNX Runtime CPU and matches eager (dtype, shape, values) on every sample",
    check.EXPORT_ERROR: "the export raised (capture, dispatch or lowering)",
    check.INVALID_MODEL: "the model fails the ONNX checker, or ONNX Runtime rejects the graph",
    check.NO_KERNEL: "valid ONNX, but ONNX Runtime CPU has no kernel for a node's types",
    check.RUN_ERROR: "the session fails to start or the run fails (or the worker crashed)",
    check.MISMATCH: "runs, but an output differs from eager in dtype, shape or values",
    check.TIMEOUT: "no result within the time limit",
    check.EXCLUDED: "not comparable: random or uninitialised output, eager fails on every sample, no tensor output",
}

Record = Mapping[str, Any]


# --- building the data ---------------------------------------------------------------------------------
def update_matrix(
    previous: Mapping[str, Any] | None, records: Iterable[Record], *, samples: int, reference_samples: int | None
) -> dict[str, Any]:
    """The matrix `previous` with every cell that `records` covers replaced."""
    cells: dict[str, dict[str, dict[str, Any]]] = json.loads(json.dumps((previous or {}).get("cells", {})))
    for record in records:
        cell = cells.setdefault(record["op"], {}).setdefault(record["dtype"], {})
        summary = _cell(record)
        if record["engine"] == "fx2onnx":
            reference = cell.get("reference")
            cell.clear()
            cell.update(summary)
            if reference is not None:
                cell["reference"] = reference
        else:
            cell["reference"] = summary
    ordered = {op: {d: cells[op][d] for d in _dtype_order(cells[op])} for op in sorted(cells)}
    meta = dict((previous or {}).get("meta", {}))
    meta.update(_versions())
    meta["samples_per_case"] = samples
    if reference_samples is not None:
        meta["reference_samples_per_case"] = reference_samples
    return {
        "about": (
            "fx2onnx's operator x dtype support matrix over PyTorch's OpInfo database (CPU dtypes). "
            f"Regenerate with `{COMMAND}`; tests/test_support_matrix.py fails if a cell marked ok here regresses."
        ),
        "meta": meta,
        "summary": summarize(ordered),
        "cells": ordered,
    }


def _cell(record: Record) -> dict[str, Any]:
    cell: dict[str, Any] = {"status": record["status"]}
    for field in ("detail", "cause", "sample", "first", "samples", "fixed", "fixed_detail", "fixed_sample"):
        if record.get(field) not in (None, ""):
            cell[field] = record[field]
    return cell


def _dtype_order(cells: Mapping[str, Any]) -> list[str]:
    order = list(DTYPES + SEPARATE_DTYPES)
    return sorted(cells, key=lambda d: order.index(d) if d in order else len(order))


def _versions() -> dict[str, str]:
    import onnx
    import onnxruntime
    import onnxscript
    import torch

    import fx2onnx

    return {
        "fx2onnx": fx2onnx.__version__,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxscript": onnxscript.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def first_sample_status(cell: Mapping[str, Any]) -> str:
    """The status of the case's first runnable sample (what the reference runs when limited to one)."""
    if cell["status"] in (check.EXCLUDED, check.TIMEOUT):
        return cell["status"]
    return cell.get("first", cell["status"])


def summarize(cells: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Counts per dtype for fx2onnx (all samples) and, on the first sample, fx2onnx and the reference."""
    per_dtype: dict[str, dict[str, Any]] = {}
    for dtype in DTYPES + SEPARATE_DTYPES:
        statuses = collections.Counter(c[dtype]["status"] for c in cells.values() if dtype in c)
        row: dict[str, Any] = {"cases": sum(statuses.values()), **{s: statuses.get(s, 0) for s in check.STATUSES}}
        row["pass_rate"] = _rate(statuses.get(check.OK, 0), row["cases"] - statuses.get(check.EXCLUDED, 0))
        row.update(_fixed_counts(dtype, [c[dtype] for c in cells.values() if dtype in c], row))
        both = [c[dtype] for c in cells.values() if dtype in c and "reference" in c[dtype]]
        compared = [
            c for c in both if first_sample_status(c) != check.EXCLUDED and c["reference"]["status"] != check.EXCLUDED
        ]
        if compared:
            row["first_sample"] = {
                "compared": len(compared),
                "fx2onnx_ok": sum(first_sample_status(c) == check.OK for c in compared),
                "reference_ok": sum(c["reference"]["status"] == check.OK for c in compared),
            }
            row["first_sample"]["fx2onnx_rate"] = _rate(row["first_sample"]["fx2onnx_ok"], len(compared))
            row["first_sample"]["reference_rate"] = _rate(row["first_sample"]["reference_ok"], len(compared))
        per_dtype[dtype] = row
    overall = {"cases": 0, **{s: 0 for s in check.STATUSES}}
    first = {"compared": 0, "fx2onnx_ok": 0, "reference_ok": 0}
    for dtype in DTYPES:
        for key in overall:
            overall[key] += per_dtype[dtype][key]
        for key in first:
            first[key] += per_dtype[dtype].get("first_sample", {}).get(key, 0)
    for dtype in DTYPES:
        for key in ("fixed_ok", "noise_only", "fixed_unknown"):
            overall[key] = overall.get(key, 0) + per_dtype[dtype][key]
    overall["pass_rate"] = _rate(overall[check.OK], overall["cases"] - overall[check.EXCLUDED])
    overall["fixed_pass_rate"] = _rate(
        overall[check.OK] - overall["noise_only"], overall["cases"] - overall[check.EXCLUDED]
    )
    if first["compared"]:
        first["fx2onnx_rate"] = _rate(first["fx2onnx_ok"], first["compared"])
        first["reference_rate"] = _rate(first["reference_ok"], first["compared"])
        overall["first_sample"] = first
    return {"overall": overall, "dtypes": per_dtype}


def passes_only_by_noise(cell: Mapping[str, Any]) -> bool:
    return cell["status"] == check.OK and cell.get("fixed") == check.MISMATCH


# The dtypes where a mismatch can pass by the noise criterion (check._ROUNDED); in the others ok is ok at the fixed
# tolerance.
_NOISE_DTYPES = ("float32", "float16", "bfloat16")


def _fixed_counts(dtype: str, cells: list[Mapping[str, Any]], row: Mapping[str, Any]) -> dict[str, Any]:
    """The dtype's cells at the fixed tolerance: ok there, ok only by the noise criterion, ok but not judged
    at the fixed tolerance (a cell of a sweep that predates the field). The rate counts those as ok."""
    ok = [c for c in cells if c["status"] == check.OK]
    noise_only = sum(passes_only_by_noise(c) for c in ok)
    unknown = sum("fixed" not in c for c in ok) if dtype in _NOISE_DTYPES else 0
    fixed_ok = len(ok) - noise_only - unknown
    return {
        "fixed_ok": fixed_ok,
        "noise_only": noise_only,
        "fixed_unknown": unknown,
        "fixed_pass_rate": _rate(fixed_ok + unknown, row["cases"] - row.get(check.EXCLUDED, 0)),
    }


def _rate(ok: int, total: int) -> float | None:
    return round(ok / total, 4) if total else None


# --- failure analysis -------------------------------------------------------------------------------------
_NOISE = [
    (re.compile(r"`[^`]*`"), "`…`"),
    (re.compile(r"'node_[^']*'"), "'…'"),
    (re.compile(r"node name: [^)]*\)"), "node name: …)"),
    (re.compile(r"(?<![\w:.])\d+(\.\d+)?(e[-+]?\d+)?"), "N"),
]


def cause_of(cell: Mapping[str, Any]) -> str:
    """A failure's cause with node names and numbers removed, so that alike failures group together."""
    text = cell.get("detail", "")
    cause = cell.get("cause", "")
    if cause and cause.split(":")[0] not in text:
        text = f"{text} <- {cause}"
    for pattern, replacement in _NOISE:
        text = pattern.sub(replacement, text)
    return f"{cell['status']}: {text}"


def top_failures(cells: Mapping[str, Mapping[str, Any]], count: int = 10) -> list[tuple[str, int, list[str]]]:
    """The most common causes among failing cells of the ten dtypes: (cause, cells, example cells)."""
    grouped: dict[str, list[str]] = collections.defaultdict(list)
    for op, row in cells.items():
        for dtype, cell in row.items():
            if dtype in DTYPES and cell["status"] not in (check.OK, check.EXCLUDED):
                grouped[cause_of(cell)].append(f"{op}/{SHORT_NAMES[dtype]}")
    ranked = sorted(grouped.items(), key=lambda item: (-len(item[1]), item[0]))
    return [(cause, len(examples), examples[:6]) for cause, examples in ranked[:count]]


# --- Markdown ---------------------------------------------------------------------------------------------
def render_matrix(payload: Mapping[str, Any]) -> str:
    cells = payload["cells"]
    meta = payload.get("meta", {})
    summary = payload["summary"]
    lines = [
        "# Operator x dtype support matrix",
        "",
        "Which (operator, dtype) pairs fx2onnx exports so that the model runs in ONNX Runtime (CPU) and",
        "matches eager PyTorch. The operators and their sample inputs are PyTorch's OpInfo database",
        "(`torch.testing._internal.common_methods_invocations.op_db`); a cell exists where OpInfo says",
        "eager supports the dtype on CPU. Each sample is wrapped in a small `nn.Module`, exported with",
        "`fx2onnx.export`, run with `program(...)` and compared with eager: dtype, shape and values",
        "(NaN-aware; rtol/atol 1e-5/1e-6 for float64, 1e-4 for float32, 1e-2 for float16, 5e-2 for",
        "bfloat16, exact otherwise). In float32, float16 and bfloat16, where eager rounds at other points than",
        "ONNX Runtime, an output beyond that tolerance still passes when it is at most twice as far from the",
        f"float64 result as eager's own output is (the noise criterion): such cells are marked {NOISE_MARK}, and the",
        "summary's *fixed tolerance* columns count only the cells that pass at the fixed tolerance itself",
        "(each cell's `fixed` field in the JSON, with the first such output's error in `fixed_detail`). *Not judged*",
        "counts the ok cells of a sweep older than that field, counted as ok in the rate at fixed tolerance.",
        "",
        f"Regenerate (resumable; the data is [`{MATRIX_JSON}`]({MATRIX_JSON})):",
        "",
        "```bash",
        COMMAND,
        "```",
        "",
        _versions_line(meta),
        "",
        "## Summary",
        "",
        "Pass rate = ok / (cases - excluded). Overall counts the ten dtypes; complex64 is reported apart.",
        "",
        "| dtype | cases | ok | export error | invalid model | no kernel | run error | mismatch | timeout "
        "| excluded | pass rate | ok at fixed tolerance | ok only by noise | not judged "
        "| pass rate at fixed tolerance |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, row in [*((d, summary["dtypes"][d]) for d in DTYPES), ("**overall**", summary["overall"])]:
        lines.append(_summary_row(name, row))
    for dtype in SEPARATE_DTYPES:
        lines.append(_summary_row(f"{dtype} (apart)", summary["dtypes"][dtype]))
    lines += ["", "## Most common failures", "", "| cells | cause | examples |", "|--:|---|---|"]
    for cause, count, examples in top_failures(cells, 15):
        lines.append(f"| {count} | {_escape(cause)} | {', '.join(examples)} |")
    lines += [
        "",
        "## Matrix",
        "",
        "  ".join(f"{MARKS[s]} {s.replace('_', ' ')}" for s in check.STATUSES)
        + f"  {NOISE_MARK} ok only by the noise criterion"
        + "; blank: eager does not support the dtype. Details of every failing cell are in the JSON.",
        "",
        "| op | " + " | ".join(SHORT_NAMES[d] for d in DTYPES + SEPARATE_DTYPES) + " |",
        "|---|" + "|".join(":-:" for _ in DTYPES + SEPARATE_DTYPES) + "|",
    ]
    for op, row in cells.items():
        marks = [_mark(row[d]) if d in row else "" for d in DTYPES + SEPARATE_DTYPES]
        lines.append(f"| `{op}` | " + " | ".join(marks) + " |")
    lines += ["", "### Legend", ""]
    lines += [f"- {MARKS[s]} **{s.replace('_', ' ')}**: {LEGEND[s]}" for s in check.STATUSES]
    lines.append(
        f"- {NOISE_MARK} **ok only by the noise criterion**: ok, but an output exceeds the fixed tolerance; it is"
        " no farther from the float64 result than twice eager's own error"
    )
    noisy = [
        (op, dtype, cell) for op, row in cells.items() for dtype, cell in row.items() if passes_only_by_noise(cell)
    ]
    if noisy:
        lines += ["", "## Cells ok only by the noise criterion", "", "| cell | at the fixed tolerance |", "|---|---|"]
        lines += [f"| `{op}`/{SHORT_NAMES[d]} | {_escape(c.get('fixed_detail', ''))} |" for op, d, c in noisy]
    return "\n".join(lines) + "\n"


def _mark(cell: Mapping[str, Any]) -> str:
    return NOISE_MARK if passes_only_by_noise(cell) else MARKS[cell["status"]]


def render_reference(payload: Mapping[str, Any]) -> str:
    cells = payload["cells"]
    meta = payload.get("meta", {})
    summary = payload["summary"]
    lines = [
        "# fx2onnx vs torch.onnx.export(dynamo=True): operator x dtype support",
        "",
        "A benchmark, not a test: both exporters on the same OpInfo cases (same samples, same ONNX Runtime",
        "session options, same comparison with eager). The reference is run on the first runnable sample",
        f"of each case ({meta.get('reference_samples_per_case', 1)} sample); fx2onnx's column here is its",
        "status on that same sample (the main matrix requires every sample to pass).",
        "",
        f"Regenerate with `{COMMAND}` (the reference engine is `benchmarks/coverage_reference.py`).",
        "",
        _versions_line(meta),
        "",
        "| dtype | cases compared | fx2onnx ok | fx2onnx rate | torch.onnx ok | torch.onnx rate |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for name, row in [*((d, summary["dtypes"][d]) for d in DTYPES), ("**overall**", summary["overall"])]:
        lines.append(_reference_row(name, row))
    for dtype in SEPARATE_DTYPES:
        lines.append(_reference_row(f"{dtype} (apart)", summary["dtypes"][dtype]))
    lines += [
        "",
        "## Most common failures of torch.onnx.export(dynamo=True)",
        "",
        "| cells | cause | examples |",
        "|--:|---|---|",
    ]
    reference_cells = {op: {d: c["reference"] for d, c in row.items() if "reference" in c} for op, row in cells.items()}
    for cause, count, examples in top_failures(reference_cells, 15):
        lines.append(f"| {count} | {_escape(cause)} | {', '.join(examples)} |")
    lines += [
        "",
        "## Side by side",
        "",
        "Each cell: fx2onnx / torch.onnx, on the first sample. "
        + "  ".join(f"{MARKS[s]} {s.replace('_', ' ')}" for s in check.STATUSES),
        "",
        "| op | " + " | ".join(SHORT_NAMES[d] for d in DTYPES + SEPARATE_DTYPES) + " |",
        "|---|" + "|".join(":-:" for _ in DTYPES + SEPARATE_DTYPES) + "|",
    ]
    for op, row in cells.items():
        marks = []
        for dtype in DTYPES + SEPARATE_DTYPES:
            cell = row.get(dtype)
            if cell is None:
                marks.append("")
            elif "reference" not in cell:
                marks.append(f"{MARKS[first_sample_status(cell)]} / ?")
            else:
                marks.append(f"{MARKS[first_sample_status(cell)]} / {MARKS[cell['reference']['status']]}")
        lines.append(f"| `{op}` | " + " | ".join(marks) + " |")
    return "\n".join(lines) + "\n"


def _summary_row(name: str, row: Mapping[str, Any]) -> str:
    counts = " | ".join(str(row.get(s, 0)) for s in check.STATUSES)
    fixed = " | ".join(str(row.get(key, 0)) for key in ("fixed_ok", "noise_only", "fixed_unknown"))
    fixed += f" | {_percent(row.get('fixed_pass_rate'))}"
    return f"| {name} | {row['cases']} | {counts} | {_percent(row.get('pass_rate'))} | {fixed} |"


def _reference_row(name: str, row: Mapping[str, Any]) -> str:
    first = row.get("first_sample")
    if not first:
        return f"| {name} | 0 | | | | |"
    return (
        f"| {name} | {first['compared']} | {first['fx2onnx_ok']} | {_percent(first.get('fx2onnx_rate'))} "
        f"| {first['reference_ok']} | {_percent(first.get('reference_rate'))} |"
    )


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _versions_line(meta: Mapping[str, Any]) -> str:
    names = ("fx2onnx", "torch", "onnx", "onnxscript", "onnxruntime")
    versions = ", ".join(f"{n} {meta[n]}" for n in names if n in meta)
    samples = meta.get("samples_per_case")
    return f"Measured with {versions}; up to {samples} runnable samples per case." if samples else versions


# --- files ------------------------------------------------------------------------------------------------
def load_matrix(docs_dir: str) -> dict[str, Any] | None:
    path = os.path.join(docs_dir, MATRIX_JSON)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_docs(payload: Mapping[str, Any], docs_dir: str) -> list[str]:
    """Write the JSON, the matrix and (when the payload has reference cells) the comparison."""
    os.makedirs(docs_dir, exist_ok=True)
    written = [_write(os.path.join(docs_dir, MATRIX_JSON), json.dumps(payload, indent=1, ensure_ascii=False) + "\n")]
    written.append(_write(os.path.join(docs_dir, MATRIX_MD), render_matrix(payload)))
    if any("reference" in cell for row in payload["cells"].values() for cell in row.values()):
        written.append(_write(os.path.join(docs_dir, REFERENCE_MD), render_reference(payload)))
    return written


def _write(path: str, text: str) -> str:
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)
    return path
