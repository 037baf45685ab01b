"""Exports in a loop, in one process, as users iterating on a model do: fx2onnx against the reference.

``export_speed.py`` runs each export in a fresh process (the first export a user waits for: imports and
torch's first-call costs included). Here one process exports the same model again and again, alternating
between fx2onnx (``fx2onnx.export`` + ``save``) and ``torch.onnx.export(dynamo=True)`` + ``save``, each
saving to the same path every time (as a script re-run would), and prints the median per-iteration
seconds after the first (warm-up) round, with fx2onnx's split into torch.export, its own stages and the save.

    python benchmarks/export_loop.py                        # gpt2, 5 rounds
    python benchmarks/export_loop.py --model resnet50 --rounds 7
"""

from __future__ import annotations

import argparse
import contextlib
import io
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
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up round (default 5)")
    options = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    import torch

    import fx2onnx
    from models import MODELS

    spec = MODELS[options.model]
    model, inputs = spec.build().eval(), spec.inputs()
    seconds: dict[str, list[float]] = {"fx2onnx": [], "reference": [], "torch.export": [], "save": []}
    with tempfile.TemporaryDirectory(prefix="fx2onnx-loop-", dir=os.getcwd()) as folder:
        ours, theirs = os.path.join(folder, "fx2onnx.onnx"), os.path.join(folder, "reference.onnx")
        for index in range(options.rounds + 1):
            for exporter in ("fx2onnx", "reference") if index % 2 == 0 else ("reference", "fx2onnx"):
                start = time.perf_counter()
                if exporter == "fx2onnx":
                    program = fx2onnx.export(model, inputs)
                    saving = time.perf_counter()
                    program.save(ours)
                    save = time.perf_counter() - saving
                else:
                    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
                        torch.onnx.export(model, inputs, dynamo=True).save(theirs, external_data=True)
                total = time.perf_counter() - start
                if index == 0:
                    continue  # warm-up: imports, registries, torch's first-call caches
                seconds[exporter].append(total)
                if exporter == "fx2onnx":
                    seconds["torch.export"].append(program.report.capture_seconds.get("torch.export", 0.0))
                    seconds["save"].append(save)
            print(f"  round {index}{' (warm-up)' if index == 0 else ''} done", flush=True)

    median = {key: statistics.median(values) for key, values in seconds.items()}
    ours_total, reference = median["fx2onnx"], median["reference"]
    own = ours_total - median["torch.export"] - median["save"]
    print(f"\n{options.model}, one process, medians of {options.rounds} rounds after a warm-up round\n")
    print("| exporter | export + save s | ratio |")
    print("|---|---:|---:|")
    print(f"| torch.onnx.export(dynamo=True) | {reference:.2f} | 1.00x |")
    print(f"| fx2onnx | {ours_total:.2f} | {ours_total / reference:.2f}x |")
    print("\n| fx2onnx part | s | share |")
    print("|---|---:|---:|")
    for name, value in (("torch.export", median["torch.export"]), ("fx2onnx's stages", own), ("save", median["save"])):
        print(f"| {name} | {value:.2f} | {value / ours_total:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
