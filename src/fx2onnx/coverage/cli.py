"""``fx2onnx coverage``: sweep OpInfo, export every (op, dtype) sample, and publish the support matrix.

    fx2onnx coverage --baseline --write-docs          # the full sweep; regenerates docs/support-matrix.*
    fx2onnx coverage --op 'nn.functional.*' --dtype bf16,f16
    fx2onnx coverage --tier                            # the test suite's tier (first sample, ~150 ops)

Results are appended to a JSONL file as cases finish (``out/coverage/results.jsonl``); running the
same command again resumes. ``--rerun`` runs the selected cases again (after a fix).
"""

from __future__ import annotations

import argparse
import collections
import os
from typing import Any

HELP = "sweep PyTorch's OpInfo ops x dtypes through fx2onnx and ONNX Runtime; write the support matrix"
DEFAULT_RESULTS = os.path.join("out", "coverage", "results.jsonl")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--op", action="append", default=[], help="shell-style OpInfo name pattern (repeatable)")
    parser.add_argument("--dtype", action="append", default=[], help="dtypes, e.g. bf16,f16 (default: all eleven)")
    parser.add_argument("--samples", type=int, default=3, help="runnable samples per case (default 3)")
    parser.add_argument("--tier", action="store_true", help="only the test suite's tier: ~150 ops, first sample")
    parser.add_argument(
        "--baseline", action="store_true", help="also run torch.onnx.export(dynamo=True) on the same cases"
    )
    parser.add_argument("--baseline-samples", type=int, default=1, help="samples per case for the baseline")
    parser.add_argument("--only-baseline", action="store_true", help="run the baseline only (fx2onnx's results kept)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per sample before a case times out")
    parser.add_argument("--results", default=DEFAULT_RESULTS, help=f"JSONL of results (default {DEFAULT_RESULTS})")
    parser.add_argument("--rerun", action="store_true", help="run the selected cases even if the results hold them")
    parser.add_argument(
        "--write-docs", action="store_true", help="update docs/support-matrix.{json,md} and the dtype discovery data"
    )
    parser.add_argument("--docs", default="docs", help="where the matrix is written (default docs/)")
    parser.add_argument("--list", action="store_true", help="print the selected cases and exit")


def run(options: argparse.Namespace) -> int:
    from fx2onnx.coverage import cases as case_table
    from fx2onnx.coverage import discovery, matrix
    from fx2onnx.coverage.sweep import run_sweep

    ops = list(case_table.TIER_OPS) if options.tier else case_table.select_ops(options.op)
    if options.tier and options.op:
        ops = [op for op in ops if op in set(case_table.select_ops(options.op))]
    dtypes = case_table.parse_dtypes(options.dtype) or list(
        case_table.DTYPES if options.tier else case_table.ALL_DTYPES
    )
    samples = 1 if options.tier else options.samples
    selected = [] if options.only_baseline else case_table.enumerate_cases(ops, dtypes, ("fx2onnx",), samples)
    if options.baseline or options.only_baseline:
        selected += case_table.enumerate_cases(ops, dtypes, ("reference",), options.baseline_samples)
    if options.list:
        for case in selected:
            print(case.key)
        print(f"{len(selected)} cases")
        return 0

    records = run_sweep(
        selected, options.results, workers=options.workers, timeout=options.timeout, rerun=options.rerun
    )
    print(_terminal_summary(records.values()))
    if options.write_docs:
        whole = not options.op and not options.dtype and not options.tier
        # A sweep of everything with both engines starts the matrix afresh; any other keeps the cells
        # (and the other engine's column) it did not run.
        previous = None if whole and options.baseline else matrix.load_matrix(options.docs)
        reference_samples = options.baseline_samples if (options.baseline or options.only_baseline) else None
        payload = matrix.update_matrix(previous, records.values(), samples=samples, reference_samples=reference_samples)
        for path in matrix.write_docs(payload, options.docs):
            print(f"wrote {path}")
        fx2onnx_records = [r for r in records.values() if r["engine"] == "fx2onnx"]
        if fx2onnx_records:
            earlier = None if whole else _load_discovery()
            discovery.write(discovery.aggregate(fx2onnx_records, previous=earlier))
            print(f"wrote {discovery.DATA_PATH}")
    return 0


def _load_discovery() -> dict[str, Any] | None:
    from fx2onnx.coverage import discovery

    return discovery.load() if os.path.exists(discovery.DATA_PATH) else None


def _terminal_summary(records: Any) -> str:
    from fx2onnx.coverage.cases import ALL_DTYPES
    from fx2onnx.coverage.check import EXCLUDED, OK

    lines = []
    for engine in ("fx2onnx", "reference"):
        rows = [r for r in records if r["engine"] == engine]
        if not rows:
            continue
        lines.append(f"{engine}:")
        for dtype in ALL_DTYPES:
            counts = collections.Counter(r["status"] for r in rows if r["dtype"] == dtype)
            if not counts:
                continue
            counted = sum(counts.values()) - counts[EXCLUDED]
            rate = f"{100 * counts[OK] / counted:5.1f}%" if counted else "    -"
            detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k != OK)
            lines.append(f"  {dtype:<10} {rate}  ok {counts[OK]}/{counted}  {detail}")
    return "\n".join(lines)
