"""``python -m fx2onnx.legalize [--check]``: regenerate the ONNX Runtime CPU legal-types table, and compare it with
single-node sessions."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from fx2onnx._records import BASE_OPSET
from fx2onnx.legalize import tables
from fx2onnx.legalize.targets import get_target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fx2onnx.legalize", description="Generate and check fx2onnx's legal-types tables."
    )
    parser.add_argument("--check", action="store_true", help="compare the table with single-node sessions")
    parser.add_argument("--opset", type=int, default=BASE_OPSET, help="opset for --check")
    options = parser.parse_args(argv)
    start = time.perf_counter()
    table = tables.load_onnxruntime_cpu(regenerate=True)
    print(
        f"{table.description}: {sum(map(len, table.kernels.values()))} kernels for {len(table.kernels)} ops, "
        f"{len(table.float16_via_float32)} float16-via-float32 (op, version) pairs; "
        f"{time.perf_counter() - start:.2f}s -> {tables.table_path()}"
    )
    if options.check:
        target = get_target("onnxruntime-cpu")
        disagreements = tables.check_against_sessions(
            lambda op, opset, binding: target.verdict("", op, opset, binding).legal, options.opset
        )
        print("\n".join(disagreements) or f"the table agrees with sessions on the sample (opset {options.opset})")
        return 1 if disagreements else 0
    return 0
