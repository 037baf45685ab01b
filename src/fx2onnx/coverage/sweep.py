"""The sweep: run cases on the worker pool, appending each record to a JSONL file as it finishes.

The JSONL file is the sweep's memory: a sweep started again skips the cases it already holds (same
engine, op, dtype and sample limit), so an interrupted sweep resumes where it stopped. Later lines
win over earlier ones for the same case, so re-running a case (``rerun=True``) just appends.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fx2onnx.coverage.cases import Case
from fx2onnx.coverage.pool import Timeout, WorkerPool
from fx2onnx.coverage.runner import dumps

Record = dict[str, Any]


def record_key(record: Record) -> str:
    return f"{record['engine']}/{record['op']}/{record['dtype']}"


def load_results(path: str) -> dict[str, Record]:
    """The latest record of every case in a results file (missing file: none)."""
    records: dict[str, Record] = {}
    if not os.path.exists(path):
        return records
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short when a sweep was killed
            records[record_key(record)] = record
    return records


def run_sweep(
    cases: Sequence[Case],
    results_path: str | None,
    *,
    workers: int = 2,
    timeout: Timeout = 90.0,
    startup_timeout: float = 600.0,
    rerun: bool = False,
    progress: bool = True,
    on_record: Callable[[Record], None] | None = None,
) -> dict[str, Record]:
    """Run the cases not yet in `results_path` (all of them if `rerun`); returns every case's record."""
    known = load_results(results_path) if results_path else {}
    todo = [c for c in cases if rerun or not _done(known.get(c.key), c)]
    finished = {c.key: known[c.key] for c in cases if c.key in known and c not in todo}
    if todo:
        log_dir = os.path.join(os.path.dirname(os.path.abspath(results_path)), "logs") if results_path else None
        handle = _open_results(results_path)
        try:
            with WorkerPool(
                workers=min(workers, len(todo)), timeout=timeout, startup_timeout=startup_timeout, log_dir=log_dir
            ) as pool:
                for record in _with_progress(pool.run(todo), len(todo), len(finished), progress):
                    finished[record_key(record)] = record
                    if handle is not None:
                        handle.write(dumps(record) + "\n")
                        handle.flush()
                    if on_record is not None:
                        on_record(record)
        finally:
            if handle is not None:
                handle.close()
    return finished


def _done(record: Record | None, case: Case) -> bool:
    return record is not None and record.get("limit") == case.samples


def _open_results(path: str | None) -> Any:
    if path is None:
        return None
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return open(path, "a", encoding="utf-8")


def _with_progress(records: Iterable[Record], total: int, resumed: int, progress: bool) -> Iterable[Record]:
    if not progress:
        yield from records
        return
    from tqdm import tqdm

    counts: collections.Counter[str] = collections.Counter()
    description = "coverage" + (f" (resuming, {resumed} done)" if resumed else "")
    with tqdm(total=total, desc=description, unit="case", dynamic_ncols=True) as bar:
        for record in records:
            counts[record["status"]] += 1
            bar.set_postfix_str(", ".join(f"{k} {v}" for k, v in counts.most_common()), refresh=False)
            bar.update(1)
            yield record
