"""The package's metadata builds without setuptools' deprecation warnings (issue 21)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

pytest.importorskip("setuptools")


def test_metadata_builds_without_deprecation_warnings(tmp_path: pathlib.Path) -> None:
    """`project.license` as an SPDX expression: a TOML table made setuptools warn three times per install."""
    script = (
        "import warnings; warnings.simplefilter('error')\n"
        "from setuptools.build_meta import prepare_metadata_for_build_wheel\n"
        f"print(prepare_metadata_for_build_wheel({str(tmp_path)!r}))\n"
    )
    build = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    metadata = (tmp_path / build.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata
