"""Buffered against direct-I/O saves: the save itself, and ONNX Runtime loading the file right after.

A direct-I/O save (``ONNXProgram.save(..., direct_io=True)``) skips the page cache: it can be much
faster where filling the page cache is slow, but the file is then not in the page cache, so the next
load reads it from the disk. This script exports one benchmark model and, alternating between the
two modes, saves it and creates an ONNX Runtime session from the saved file; it prints the medians.

    python benchmarks/save_modes.py                    # gpt2, 5 rounds
    python benchmarks/save_modes.py --model llama --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2", help="a benchmark model (models.py)")
    parser.add_argument("--rounds", type=int, default=5, help="saves per mode (default 5)")
    options = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    import onnxruntime

    import fx2onnx
    from models import MODELS

    spec = MODELS[options.model]
    program = fx2onnx.export(spec.build(), spec.inputs())
    times: dict[bool, dict[str, list[float]]] = {mode: {"save": [], "load": []} for mode in (False, True)}
    with tempfile.TemporaryDirectory(prefix="fx2onnx-save-modes-", dir=os.getcwd()) as folder:
        for index in range(options.rounds):
            for direct in (False, True) if index % 2 == 0 else (True, False):
                path = os.path.join(folder, f"{options.model}-{direct}-{index}.onnx")
                start = time.perf_counter()
                program.save(path, direct_io=direct)
                saved = time.perf_counter()
                onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
                loaded = time.perf_counter()
                times[direct]["save"].append(saved - start)
                times[direct]["load"].append(loaded - saved)
                print(
                    f"  round {index + 1} direct_io={direct}: save {saved - start:.2f} s, load {loaded - saved:.2f} s"
                )
    megabytes = program.weight_bytes / 2**20
    print(f"\n{options.model}: {megabytes:.0f} MB of weights, medians of {options.rounds} rounds\n")
    print("| save mode | save s | ONNX Runtime session right after s | both s |")
    print("|---|---:|---:|---:|")
    for direct in (False, True):
        save, load = (statistics.median(times[direct][key]) for key in ("save", "load"))
        print(f"| {'direct_io=True' if direct else 'buffered'} | {save:.2f} | {load:.2f} | {save + load:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
