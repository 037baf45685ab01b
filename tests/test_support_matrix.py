"""The support matrix can only grow: the tier's cases that pass in docs/support-matrix.json must still pass.

The tier is ~150 common OpInfo ops x the ten dtypes, first runnable sample each, exported with
fx2onnx, run in ONNX Runtime and compared with eager, on the coverage tool's worker pool. The other
tests check the tool itself: crash and hang isolation, resuming, and the matrix it writes.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from fx2onnx.coverage import cases, check, matrix
from fx2onnx.coverage.sweep import load_results, run_sweep

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
WORKERS = 2


def checked_in_matrix() -> dict[str, Any]:
    payload = matrix.load_matrix(DOCS)
    assert payload is not None, f"{DOCS}/{matrix.MATRIX_JSON} is missing; run `{matrix.COMMAND}`"
    return payload


def tier_cases_passing(payload: dict[str, Any]) -> list[cases.Case]:
    cells = payload["cells"]
    return [
        cases.Case(op, dtype, "fx2onnx", samples=1)
        for op in cases.TIER_OPS
        for dtype in cases.DTYPES
        if cells.get(op, {}).get(dtype, {}).get("status") == check.OK
    ]


def test_tier_is_in_opinfo_and_in_the_matrix() -> None:
    payload = checked_in_matrix()
    database = cases.op_database()
    assert len(cases.TIER_OPS) == len(set(cases.TIER_OPS))
    assert 140 <= len(cases.TIER_OPS) <= 160
    assert [op for op in cases.TIER_OPS if op not in database] == []
    assert [op for op in cases.TIER_OPS if op not in payload["cells"]] == []


def test_tier_does_not_regress() -> None:
    """Every tier case marked ok in the checked-in matrix still exports, runs and matches eager."""
    selected = tier_cases_passing(checked_in_matrix())
    assert len(selected) > 900, "the checked-in matrix lost most of the tier; regenerate it"
    records = run_sweep(selected, None, workers=WORKERS, progress=False)
    regressions = sorted(
        f"{r['op']}/{r['dtype']}: {r['status']}: {r.get('detail', '')}"
        for r in records.values()
        if r["status"] != check.OK
    )
    assert len(records) == len(selected)
    assert not regressions, (
        f"{len(regressions)} of {len(selected)} tier cases that pass in docs/{matrix.MATRIX_JSON} now fail "
        f"(reproduce one with `fx2onnx coverage --op OP --dtype DTYPE --rerun`):\n  " + "\n  ".join(regressions)
    )


def only_the_hang_times_out(case: cases.Case) -> float:
    """A short timeout for the case that hangs, none a loaded machine could reach for the others.

    The clock starts once the worker has imported torch and OpInfo (minutes at load 20 on 2 cores), and the
    first export in a fresh worker takes seconds more than the next ones.
    """
    return 2.0 if case.op == "fx2onnx.selftest.hang" else 3600.0


def test_pool_isolates_crash_and_hang_and_resumes(tmp_path: Any) -> None:
    """A worker that dies or hangs costs only its case; the sweep records why and goes on; a rerun resumes."""
    results = str(tmp_path / "results.jsonl")
    selected = [
        cases.Case("fx2onnx.selftest.crash", "float32"),
        cases.Case("fx2onnx.selftest.hang", "float32"),
        cases.Case("add", "float32", samples=1),
    ]
    records = run_sweep(
        selected, results, workers=1, timeout=only_the_hang_times_out, startup_timeout=3600.0, progress=False
    )
    crash, hang, add = (records[c.key] for c in selected)
    assert [r["status"] for r in records.values()] == [check.EXPORT_ERROR, check.TIMEOUT, check.OK], records
    assert crash["status"] == check.EXPORT_ERROR
    assert "worker crashed (signal SIGABRT) during export" in crash["detail"]
    assert hang["status"] == check.TIMEOUT
    assert "during run of sample 0" in hang["detail"]
    assert add["status"] == check.OK
    f32 = {"t": "f32"}
    assert add["signatures"] == [{"overload": "aten::add.Tensor", "args": {"self": f32, "other": f32}}]
    assert set(load_results(results)) == {c.key for c in selected}

    # Resuming: nothing left to run, so no worker starts and the same records come back.
    def fail(record: dict[str, Any]) -> None:
        raise AssertionError(f"{record['op']} ran again")

    again = run_sweep(selected, results, workers=1, timeout=only_the_hang_times_out, progress=False, on_record=fail)
    assert again == records


def test_case_statuses_in_process() -> None:
    """Statuses straight from the runner: excluded ops, an op whose output is no tensor, an ok case."""
    from fx2onnx.coverage.runner import run_case

    bernoulli = run_case(cases.Case("bernoulli", "float32", samples=1))
    assert bernoulli["status"] == check.EXCLUDED and "nondeterministic" in bernoulli["detail"]
    item = run_case(cases.Case("item", "float32", samples=1))
    assert item["status"] == check.EXCLUDED and "not a tensor" in item["detail"]
    where = run_case(cases.Case("where", "int64", samples=2))
    assert where["status"] == check.OK and where["samples"] == 2 and where["first"] == check.OK


def test_matrix_summary_and_rendering() -> None:
    records = [
        {"engine": "fx2onnx", "op": "add", "dtype": "float32", "status": "ok", "first": "ok", "fixed": "ok"},
        {"engine": "fx2onnx", "op": "add", "dtype": "bfloat16", "status": "no_kernel", "detail": "K: Add(14)"},
        {
            "engine": "fx2onnx",
            "op": "mul",
            "dtype": "float16",
            "status": "ok",
            "first": "ok",
            "fixed": "mismatch",
            "fixed_detail": "output 0: values differ, max abs err 0.02",
        },
        {"engine": "fx2onnx", "op": "mul", "dtype": "float32", "status": "ok", "first": "ok"},
        {"engine": "fx2onnx", "op": "cos", "dtype": "bool", "status": "excluded", "detail": "eager fails"},
        {"engine": "fx2onnx", "op": "cos", "dtype": "int8", "status": "mismatch", "first": "ok", "sample": 2},
        {"engine": "reference", "op": "add", "dtype": "float32", "status": "ok"},
        {"engine": "reference", "op": "cos", "dtype": "int8", "status": "invalid_model", "detail": "bad"},
    ]
    payload = matrix.update_matrix(None, records, samples=3, reference_samples=1)
    overall = payload["summary"]["overall"]
    assert (overall["cases"], overall["ok"], overall["excluded"]) == (6, 3, 1)
    assert overall["pass_rate"] == round(3 / 5, 4)
    # At the fixed tolerance: mul/float16 passed only by eager's noise; mul/float32 predates the field.
    assert (overall["fixed_ok"], overall["noise_only"], overall["fixed_unknown"]) == (1, 1, 1)
    assert overall["fixed_pass_rate"] == round(2 / 5, 4)
    assert payload["cells"]["mul"]["float16"]["fixed_detail"].endswith("0.02")
    # On the first sample, cos/int8 passes for fx2onnx (it failed on sample 2) and fails for the reference.
    assert overall["first_sample"] == {
        "compared": 2,
        "fx2onnx_ok": 2,
        "reference_ok": 1,
        "fx2onnx_rate": 1.0,
        "reference_rate": 0.5,
    }
    text = matrix.render_matrix(payload)
    assert "| `add` | ✓ |  | " in text and "| K |" in text
    assert "| `mul` | ✓ |  | ≈ |" in text and "| `mul`/f16 | output 0: values differ, max abs err 0.02 |" in text
    assert "| `cos` |" in text and "| M |" in text
    reference = matrix.render_reference(payload)
    assert "✓ / I" in reference
    # A later partial sweep replaces only the cells it covers and keeps the reference column.
    update = [{"engine": "fx2onnx", "op": "cos", "dtype": "int8", "status": "ok", "first": "ok"}]
    merged = matrix.update_matrix(payload, update, samples=3, reference_samples=None)
    assert merged["cells"]["cos"]["int8"]["status"] == "ok"
    assert merged["cells"]["cos"]["int8"]["reference"]["status"] == "invalid_model"
    assert merged["cells"]["add"]["bfloat16"]["status"] == "no_kernel"
    json.dumps(merged)


@pytest.mark.parametrize("dtype", ["bf16", "bfloat16", "f16,i8"])
def test_dtype_names(dtype: str) -> None:
    parsed = cases.parse_dtypes([dtype])
    assert parsed and all(d in cases.ALL_DTYPES for d in parsed)
    with pytest.raises(ValueError, match="unknown dtype"):
        cases.parse_dtypes(["float128"])
