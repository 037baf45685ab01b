"""Progress of an export on stderr: the stage it is in and, while emitting, the FX nodes done.

``progress=True`` (or torch.onnx.export's ``verbose=True``) shows it always, ``progress=False`` never; by
default it appears once an export has run for :data:`QUIET_SECONDS` and only when stderr is a terminal
(a short export stays silent, a log stays clean). On a terminal the emit stage has a live bar; anywhere
else each stage is one plain line (no carriage returns, no bar), so a log file or CI output reads cleanly.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

# An export that ends sooner says nothing by default.
QUIET_SECONDS = 2.0

Item = TypeVar("Item")


def wanted(progress: bool | None, verbose: bool | None) -> bool | None:
    """True (always), False (never) or None (when the export is long and stderr is a terminal)."""
    if progress is not None:
        return progress
    return verbose  # torch.onnx.export's argument: True prints, False silences, None is its default


class ExportProgress:
    """Announces stages on `stream` (stderr by default) as :func:`wanted` decided."""

    def __init__(self, show: bool | None, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = _is_terminal(self.stream)
        self.enabled = show is True or (show is None and self.terminal)
        self.active = show is True  # printing now; the default turns this on after QUIET_SECONDS
        self.stage: str | None = None
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        if self.enabled and not self.active:
            # A stage can take longer than QUIET_SECONDS on its own (torch.export of a transformer):
            # the timer announces it while it runs.
            self._timer = threading.Timer(QUIET_SECONDS, self._activate)
            self._timer.daemon = True
            self._timer.start()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def begin(self, stage: str, detail: str = "") -> None:
        """A stage starts: one line, ``fx2onnx: <stage>...`` (with `detail`, e.g. a node count)."""
        with self._lock:
            self.stage = f"{stage} ({detail})" if detail else stage
            if self.active or self._due():
                self.active = True
                self._print_stage()

    def items(self, items: Iterable[Item], unit: str) -> Iterator[Item]:
        """`items`, with a live bar on a terminal once progress shows (plain output gets the stage line only)."""
        items = list(items)
        bar: Any = None
        try:
            for done, item in enumerate(items):
                if bar is None and self.terminal and (self.active or self._due()):
                    self.active = True
                    from tqdm import tqdm

                    bar = tqdm(
                        total=len(items),
                        initial=done,
                        desc=f"fx2onnx: {self.stage}",
                        unit=unit,
                        leave=False,
                        file=self.stream,
                    )
                yield item
                if bar is not None:
                    bar.update()
        finally:
            if bar is not None:
                bar.close()

    def _due(self) -> bool:
        """Shown by default and running for QUIET_SECONDS (the timer says it too, but may not have run yet)."""
        return self.enabled and time.monotonic() - self._started >= QUIET_SECONDS

    def _activate(self) -> None:
        with self._lock:
            if self.active:
                return
            self.active = True
            if self.stage is not None:
                self._print_stage()

    def _print_stage(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed stream must not fail the export
            print(f"fx2onnx: {self.stage}...", file=self.stream, flush=True)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, OSError, ValueError):
        return False


class StageClock:
    """Times each stage into `sink` (the report's stage table) and announces it on `progress`."""

    def __init__(self, sink: dict[str, float], progress: ExportProgress) -> None:
        self.sink = sink
        self.progress = progress

    @contextlib.contextmanager
    def __call__(self, stage: str, detail: str = "") -> Iterator[None]:
        self.progress.begin(stage, detail)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sink[stage] = self.sink.get(stage, 0.0) + time.perf_counter() - start
