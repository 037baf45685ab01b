"""Every code block of README.md works as written.

Each ```python block runs on its own in a fresh interpreter, in a temporary directory (a block may write
files). In the ```bash blocks, each `fx2onnx ...` command must parse with the CLI's own parser (its
subcommand and options exist; the command is not run) and each `make TARGET` must name a target of the
Makefile.
"""

from __future__ import annotations

import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

from fx2onnx import cli

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# A fenced block, possibly indented (inside a list item): its language and its text.
BLOCK = re.compile(r"^(?P<indent>[ \t]*)```(?P<language>\w*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)


def blocks(language: str) -> list[str]:
    return [textwrap.dedent(match["body"]) for match in BLOCK.finditer(README) if match["language"] == language]


def commands(block: str) -> list[list[str]]:
    """The block's commands as argument lists (continuation lines joined, comments dropped)."""
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if shlex.split(line, comments=True)]


PYTHON_BLOCKS = blocks("python")
BASH_COMMANDS = [command for block in blocks("bash") for command in commands(block)]


def test_the_readme_has_its_blocks() -> None:
    assert len(PYTHON_BLOCKS) >= 3
    assert {command[0] for command in BASH_COMMANDS} == {"make", "fx2onnx"}


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[f"python-{i}" for i in range(len(PYTHON_BLOCKS))])
def test_python_block_runs_as_written(block: str, tmp_path: pathlib.Path) -> None:
    if "transformers" in block:
        pytest.importorskip("transformers")
    run = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, f"this README block fails:\n{block}\n{run.stderr[-4000:]}"


@pytest.mark.parametrize("command", BASH_COMMANDS, ids=[" ".join(c[:2]) for c in BASH_COMMANDS])
def test_bash_command_exists(command: list[str]) -> None:
    if command[0] == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        assert set(command[1:]) <= targets, f"`{' '.join(command)}`: no such target in the Makefile"
        return
    try:
        cli.build_parser().parse_args(command[1:])
    except SystemExit as error:
        raise AssertionError(f"`{' '.join(command)}` does not parse (exit status {error.code})") from None
