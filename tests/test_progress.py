"""An export's progress on stderr: live on a terminal, one plain line per stage in a pipe, silent when asked.

Each test runs exports in a child process whose stderr is a pipe or a pseudo-terminal. The default's
"after two seconds" is set to 0 or to a day in the child, so no result depends on the machine's speed.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading

import pytest

CHILD = r"""
import sys, warnings
warnings.filterwarnings("ignore")
import torch
import fx2onnx
import fx2onnx._progress

model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
for line in sys.argv[1:]:
    name, quiet_seconds, options = line.split(";")
    fx2onnx._progress.QUIET_SECONDS = float(quiet_seconds)
    print(f"=== {name}", file=sys.stderr, flush=True)
    fx2onnx.export(model, (torch.randn(2, 4),), **eval(f"dict({options})"))
print("=== end", file=sys.stderr, flush=True)
"""
CASES = {
    "asked": "86400;progress=True",
    "verbose": "86400;verbose=True",
    "default, long export": "0;",
    "default, short export": "86400;",
    "refused": "0;progress=False",
    "refused over verbose": "0;progress=False, verbose=True",
    "verbose=False": "0;verbose=False",
}
STAGES = ["registry", "capture", "fx passes", "dispatch+emit", "finalize", "legalize", "check"]


def split_by_case(output: str) -> dict[str, str]:
    """The child's stderr, cut at its `=== name` markers, by case name."""
    parts = output.split("=== ")
    assert parts[-1].strip() == "end", output[-2000:]
    found: dict[str, str] = {}
    for part in parts[1:-1]:
        name, _, text = part.partition("\n")
        found[name.strip()] = text
    assert set(found) == set(CASES), output[-2000:]
    return found


def run_child(stderr: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *(f"{name};{options}" for name, options in CASES.items())],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
    )


def test_progress_in_a_pipe_is_one_plain_line_per_stage() -> None:
    child = run_child(subprocess.PIPE)
    _, raw = child.communicate()
    assert child.returncode == 0, raw.decode()[-3000:]
    output = raw.decode()
    assert "\r" not in output and "\x1b" not in output  # nothing that garbles a log
    found = split_by_case(output)
    for name in ("asked", "verbose"):
        lines = found[name].splitlines()
        assert [line.split("...")[0].split(" (")[0] for line in lines] == [f"fx2onnx: {s}" for s in STAGES], lines
        emit = next(line for line in lines if "dispatch+emit" in line)
        assert emit.startswith("fx2onnx: dispatch+emit (") and emit.endswith(" FX nodes)..."), emit
    # By default a pipe stays silent, however long the export.
    for name in ("default, long export", "default, short export", "refused", "refused over verbose", "verbose=False"):
        assert found[name] == "", (name, found[name])


@pytest.mark.skipif(not hasattr(pty, "openpty"), reason="needs a pseudo-terminal")
def test_progress_on_a_terminal_is_live_and_shows_by_default_on_long_exports() -> None:
    controller, terminal = pty.openpty()
    # A new pseudo-terminal is 0 columns wide (tqdm then draws an empty bar): make it a usual terminal.
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the child closed the terminal
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        child = run_child(terminal)
        os.close(terminal)
        child.wait()
        reader.join()
    finally:
        os.close(controller)
    output = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    assert child.returncode == 0, output[-3000:]
    found = split_by_case(output)
    for name in ("asked", "verbose", "default, long export"):
        text = found[name]
        for stage in STAGES:
            assert f"fx2onnx: {stage}" in text, (name, text)
        # The emit stage's live bar: drawn in place (a carriage return), from 0 to the graph's node count.
        nodes = re.search(r"fx2onnx: dispatch\+emit \((\d+) FX nodes\)\.\.\.\n", text)
        assert nodes is not None, (name, text)
        bar = text[nodes.end() :].split("fx2onnx: finalize")[0]
        assert "\r" in bar and f"0/{nodes.group(1)}" in bar and "node" in bar, (name, text)
    for name in ("default, short export", "refused", "refused over verbose", "verbose=False"):
        assert found[name] == "", (name, found[name])


def test_verbose_is_read_not_warned_about() -> None:
    """torch's dynamo exporter reads `verbose`: it is no TorchScript-only option here."""
    from fx2onnx import _torch_compat as torch_compat

    assert "verbose" not in torch_compat.IGNORED_OPTIONS
