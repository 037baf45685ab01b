"""Run one case in the current process: its samples in order, stopping at the first failure."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from fx2onnx.coverage import check
from fx2onnx.coverage.cases import NONDETERMINISTIC, Case
from fx2onnx.coverage.samples import PreparedSample, SkippedSample, first_line, prepared_samples

# Samples examined per case at most, runnable or not (some generators yield hundreds).
MAX_EXAMINED = 40

Emit = Callable[[str, Any], None]


def run_case(case: Case, emit: Emit | None = None) -> dict[str, Any]:
    """The case's record: status (of its first failing sample, else ok), detail, samples, discovery."""
    emit = emit or (lambda kind, payload: None)
    start = time.perf_counter()
    record: dict[str, Any] = {"engine": case.engine, "op": case.op, "dtype": case.dtype, "limit": case.samples}
    if case.op in SELF_TESTS:
        SELF_TESTS[case.op](emit)
    if case.op in NONDETERMINISTIC:
        return _finish(record, start, check.EXCLUDED, detail="nondeterministic op (random or uninitialised output)")

    outcomes: list[check.SampleOutcome] = []
    skipped: list[SkippedSample] = []
    signatures: list[dict[str, Any]] = []
    current = {"sample": -1}

    def phase(name: str) -> None:
        emit("phase", {"phase": name, "sample": current["sample"]})

    phase("samples")
    samples = prepared_samples(case)
    for _ in range(MAX_EXAMINED):
        if len(outcomes) >= case.samples:
            break
        try:
            prepared = next(samples, None)
        except Exception as error:  # OpInfo's sample generator itself fails for this dtype
            skipped.append(SkippedSample(-1, f"sample inputs fail: {type(error).__name__}: {first_line(str(error))}"))
            break
        if prepared is None:
            break
        if isinstance(prepared, SkippedSample):
            skipped.append(prepared)
            continue
        current["sample"] = prepared.index
        outcome = _check(case, prepared, phase, signatures)
        outcomes.append(outcome)
        emit("sample", outcome.as_json())
        if outcome.status != check.OK:
            break
        current["sample"] = -1
        phase("samples")
    record["signatures"] = _unique(signatures) if case.engine == "fx2onnx" else []
    record["samples"] = len(outcomes)
    if outcomes:
        record["first"] = outcomes[0].status  # for comparisons on the first sample only
    record["skipped"] = len(skipped)
    if not outcomes:
        reason = skipped[0].reason if skipped else "no sample inputs for this dtype"
        return _finish(record, start, check.EXCLUDED, detail=reason)
    failed = next((o for o in outcomes if o.status != check.OK), None)
    if failed is None:
        # The cell's result at the fixed tolerance: ok, or the first sample that passed only by eager's noise.
        noisy = next((o for o in outcomes if o.noise_only), None)
        if noisy is None:
            record["fixed"] = check.OK
        else:
            record.update(fixed=check.MISMATCH, fixed_detail=noisy.noise_only, fixed_sample=noisy.index)
        return _finish(record, start, check.OK)
    return _finish(record, start, failed.status, detail=failed.detail, cause=failed.cause, sample=failed.index)


def _crash(emit: Emit) -> None:
    emit("phase", {"phase": "export", "sample": 0})
    os.abort()


def _hang(emit: Emit) -> None:
    emit("phase", {"phase": "run", "sample": 0})
    time.sleep(3600)


# Cases that make a worker die or hang, to check that the pool isolates them (tests/test_support_matrix.py).
SELF_TESTS: dict[str, Callable[[Emit], None]] = {"fx2onnx.selftest.crash": _crash, "fx2onnx.selftest.hang": _hang}


def _check(
    case: Case, prepared: PreparedSample, phase: check.Phase, signatures: list[dict[str, Any]]
) -> check.SampleOutcome:
    return check.check_sample(case.engine, prepared, phase, signatures if case.engine == "fx2onnx" else None)


def _finish(record: dict[str, Any], start: float, status: str, **details: Any) -> dict[str, Any]:
    record["status"] = status
    record.update({k: v for k, v in details.items() if v not in ("", None)})
    record["seconds"] = round(time.perf_counter() - start, 3)
    return record


def _unique(signatures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from fx2onnx.coverage.discovery import signature_key

    seen: dict[str, dict[str, Any]] = {}
    for signature in signatures:
        seen.setdefault(signature_key(signature), signature)
    return list(seen.values())


def crash_record(case: Case, phase: str, sample: int, why: str, samples_done: int) -> dict[str, Any]:
    """The record of a case whose worker died or hung: the status follows the phase it was in."""
    if why.startswith("timeout"):
        status = check.TIMEOUT
    elif phase == "export":
        status = check.EXPORT_ERROR
    elif phase == "check":
        status = check.INVALID_MODEL
    elif phase in ("session", "run", "differential"):  # differential: a session with optimizations off
        status = check.RUN_ERROR
    else:
        status = check.EXCLUDED  # eager itself (sample preparation) crashed or hung
    where = f"during {phase}" + (f" of sample {sample}" if sample >= 0 else "")
    record = {
        "engine": case.engine,
        "op": case.op,
        "dtype": case.dtype,
        "limit": case.samples,
        "status": status,
        "detail": f"{why} {where}",
        "samples": samples_done,
        "signatures": [],
    }
    if sample >= 0:
        record["sample"] = sample
    return record


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=False, separators=(",", ":"))
