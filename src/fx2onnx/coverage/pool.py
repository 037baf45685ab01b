"""A pool of long-lived worker processes that run cases in isolation.

Importing torch, OpInfo and fx2onnx takes seconds, so a worker is started once and runs many cases.
A case that crashes its worker (a segfault in a runtime) or hangs past the timeout costs only that
case: the worker is replaced and the sweep goes on. Workers report the phase they are in, so a
crash is attributed to export, session creation or the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fx2onnx.coverage.cases import Case
from fx2onnx.coverage.runner import crash_record


@dataclasses.dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    sender: multiprocessing.connection.Connection
    connection: multiprocessing.connection.Connection  # what the worker sends back
    case: Case | None = None
    phase: str = "start"
    sample: int = -1
    samples_done: int = 0
    deadline: float = 0.0
    cases_run: int = 0
    ready: bool = False  # imports done: from then on a case gets its timeout, not `startup_timeout`


# Seconds a sample may take, for every case or per case (the self-test that hangs gets a short one, so a
# test of the pool does not make the other cases race a clock).
Timeout = float | Callable[[Case], float]


class WorkerPool:
    """Runs cases on `workers` processes; yields each case's record as it finishes."""

    def __init__(
        self,
        workers: int = 2,
        timeout: Timeout = 90.0,
        log_dir: str | None = None,
        max_cases_per_worker: int = 300,
        startup_timeout: float = 600.0,  # importing torch and OpInfo: seconds, minutes on a loaded machine
    ) -> None:
        self.size = max(1, workers)
        self.timeout = timeout  # seconds per sample (the clock restarts at each finished sample)
        self.log_dir = log_dir
        self.max_cases_per_worker = max_cases_per_worker
        self.startup_timeout = startup_timeout
        self._workers: list[_Worker] = []
        self._started = 0
        self._failed_starts = 0

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for worker in self._workers:
            self._stop(worker)
        self._workers = []

    def run(self, cases: Iterable[Case]) -> Iterator[dict[str, Any]]:
        pending = deque(cases)
        while len(self._workers) < min(self.size, len(pending)):
            self._workers.append(self._start())
        while pending or any(w.case is not None for w in self._workers):
            for worker in self._workers:
                if worker.case is None and pending:
                    self._assign(worker, pending.popleft())
            busy = [w for w in self._workers if w.case is not None]
            if not busy:
                continue
            wait = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            readable = multiprocessing.connection.wait([w.connection for w in busy], timeout=wait)
            for worker in busy:
                if worker.connection in readable:
                    record = self._receive(worker)
                    if record is not None:
                        yield record
                elif time.monotonic() > worker.deadline:
                    yield self._replace(worker, f"timeout: no result after {self._timeout(worker):g}s")

    # --- one worker ---------------------------------------------------------------------------------
    def _start(self) -> _Worker:
        """A fresh ``python -m fx2onnx.coverage.worker`` talking over a pair of pipes."""
        to_worker_read, to_worker_write = os.pipe()
        from_worker_read, from_worker_write = os.pipe()
        log = subprocess.DEVNULL
        if self.log_dir is not None:
            os.makedirs(self.log_dir, exist_ok=True)
            log = open(os.path.join(self.log_dir, f"worker-{self._started}.log"), "ab")  # noqa: SIM115
        self._started += 1
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "fx2onnx.coverage.worker", str(to_worker_read), str(from_worker_write)],
                pass_fds=(to_worker_read, from_worker_write),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=_worker_environment(),
            )
        finally:
            os.close(to_worker_read)
            os.close(from_worker_write)
            if log is not subprocess.DEVNULL:
                log.close()
        sender = multiprocessing.connection.Connection(to_worker_write, readable=False)
        receiver = multiprocessing.connection.Connection(from_worker_read, writable=False)
        return _Worker(process, sender, receiver)

    def _timeout(self, worker: _Worker) -> float:
        assert worker.case is not None
        return self.timeout(worker.case) if callable(self.timeout) else self.timeout

    def _assign(self, worker: _Worker, case: Case) -> None:
        worker.case, worker.phase, worker.sample, worker.samples_done = case, "start", -1, 0
        worker.deadline = time.monotonic() + (self._timeout(worker) if worker.ready else self.startup_timeout)
        with contextlib.suppress(OSError):  # a dead worker shows up in run() as a crash
            worker.sender.send(dataclasses.asdict(case))

    def _receive(self, worker: _Worker) -> dict[str, Any] | None:
        try:
            kind, payload = worker.connection.recv()
        except (EOFError, OSError):
            try:
                code = worker.process.wait(timeout=60)  # its pipe closed: it is exiting (a core dump may be slow)
            except subprocess.TimeoutExpired:
                code = None
            if not worker.ready:
                self._failed_starts += 1
                if self._failed_starts >= 3:
                    raise RuntimeError(
                        f"coverage workers die on start-up ({_describe_exit(code)}); see the logs in {self.log_dir}"
                    ) from None
            return self._replace(worker, f"worker crashed ({_describe_exit(code)})")
        if kind == "ready":
            worker.ready = True
            if worker.case is not None:
                worker.deadline = time.monotonic() + self._timeout(worker)
            return None
        if kind == "phase":
            worker.phase, worker.sample = payload["phase"], payload["sample"]
            return None
        if kind == "sample":
            worker.samples_done += 1
            worker.deadline = time.monotonic() + self._timeout(worker)
            return None
        if kind != "done":
            return None  # a message this version does not know
        worker.case = None
        worker.cases_run += 1
        self._failed_starts = 0
        if worker.cases_run >= self.max_cases_per_worker:  # bound the memory a long sweep accumulates
            self._recycle(worker)
        return payload

    def _replace(self, worker: _Worker, why: str) -> dict[str, Any]:
        assert worker.case is not None
        record = crash_record(worker.case, worker.phase, worker.sample, why, worker.samples_done)
        self._recycle(worker, graceful=False)
        return record

    def _recycle(self, worker: _Worker, graceful: bool = True) -> None:
        self._stop(worker, graceful)
        fresh = self._start()
        worker.process, worker.sender, worker.connection = fresh.process, fresh.sender, fresh.connection
        worker.case, worker.cases_run, worker.ready = None, 0, False

    @staticmethod
    def _stop(worker: _Worker, graceful: bool = True) -> None:
        process = worker.process
        if graceful and process.poll() is None:
            try:
                worker.sender.send(None)
                process.wait(timeout=2)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        worker.sender.close()
        worker.connection.close()


def _worker_environment() -> dict[str, str]:
    """The worker imports fx2onnx the way this process did, and uses one thread (workers share cores)."""
    environment = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = [package_root, *sys.path]
    environment["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    environment.setdefault("OMP_NUM_THREADS", "1")
    return environment


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
