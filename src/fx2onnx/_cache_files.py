"""Where stages keep what they derive from the installed libraries across processes, and how they read and write it.

Files live under ``$FX2ONNX_CACHE_DIR``, else ``$XDG_CACHE_HOME/fx2onnx``, else ``~/.cache/fx2onnx``, named by the
versions their content depends on. A file that is missing, unreadable or of another format reads as nothing (the
stage derives it again); one that cannot be written costs only that next time.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    explicit = os.environ.get("FX2ONNX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fx2onnx"


def read_json(path: Path, file_format: int) -> dict[str, Any] | None:
    """The cached dict at `path` if it is one of `file_format` (its ``"format"`` key), else None."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == file_format else None


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomic write (a reader sees the old file or the new one, never half of one)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{path.stem}-", dir=path.parent)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                json.dump(data, stream, indent=0, sort_keys=True)
            os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide the cache from other users of a shared one
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(temporary)
            raise
