"""What ONNX's fused operators (opset 23+) buy: fx2onnx's model at opset 18 against the same model at opset >= 23.

At opset >= 23 fx2onnx lowers ``scaled_dot_product_attention`` to ONNX's ``Attention`` and lets
onnxscript's fusions rewrite RMS norm and rotary-embedding patterns into ``RMSNormalization`` and
``RotaryEmbedding``. This script exports each transformer benchmark model both ways, counts the fused
nodes, checks both against eager, and times both in ONNX Runtime CPU (same inputs, same session
options, interleaved runs; median latency).

    python benchmarks/fusion_speedup.py                     # gpt2, llama, vit at opsets 18 and 23
    python benchmarks/fusion_speedup.py --models llama --opset 25 --iterations 50
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

FUSED = ("Attention", "RMSNormalization", "RotaryEmbedding")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,llama,vit", help="comma-separated benchmark models")
    parser.add_argument("--opset", type=int, default=23, help="the fused opset (default 23)")
    parser.add_argument("--iterations", type=int, default=20, help="ORT latency iterations (default 20)")
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads (default 1)")
    options = parser.parse_args(argv)

    import fx2onnx
    from export_speed import measure_latency
    from models import MODELS

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in options.models.split(","):
            model, args = MODELS[name].build(), MODELS[name].inputs()
            paths, counts = {}, {}
            for opset in (18, options.opset):
                program = fx2onnx.export(model, args, opset_version=opset)
                failed = [str(v) for v in program.verify(*args) if not v.passed]
                if failed:
                    raise SystemExit(f"{name} at opset {opset} differs from eager: {failed}")
                paths[f"opset {opset}"] = path = os.path.join(folder, f"{name}-{opset}.onnx")
                program.save(path)
                ops = collections.Counter(node.op_type for node in program.model.graph)
                counts[opset] = (sum(ops.values()), {op: ops[op] for op in FUSED})
            latency, difference = measure_latency(paths, name, options.iterations, options.threads)
            base, fused = latency["opset 18"], latency[f"opset {options.opset}"]
            fused_nodes = ", ".join(f"{op} {n}" for op, n in counts[options.opset][1].items())
            rows.append(
                f"| {name} | {counts[18][0]} | {counts[options.opset][0]} ({fused_nodes}) | {base:.1f} | {fused:.1f} "
                f"| {base / fused:.2f}x | {difference:.2g} |"
            )
            print(rows[-1], flush=True)
    print(
        f"\n| model | nodes at 18 | nodes at {options.opset} (fused) | ORT ms at 18 | ORT ms at {options.opset} "
        "| speed-up | max abs diff |\n|---|---:|---|---:|---:|---:|---:|"
    )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
