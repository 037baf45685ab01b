"""Export a LLaMA-architecture model with 7B parameters in bfloat16 (random weights), then load it in ONNX Runtime.

Not part of CI: the weights take 13.5 GB (12.6 GiB) of memory, the export adds about 0.2 GiB, and the
saved model 13.5 GB of disk; measured here: build 82 s, export 20 s, save 50 s, then ONNX Runtime maps
the file and peaks at 6.5 GiB running one forward pass (graph optimizations off, see --ort-optimization).

    python benchmarks/llama7b_export.py --out /tmp/llama7b             # LLaMA-2-7B: 32 layers, hidden 4096
    python benchmarks/llama7b_export.py --out /tmp/small --layers 2 --hidden 1024 --intermediate 2816 \\
        --heads 16 --kv-heads 4 --verify                                 # a small configuration, checked against eager

Steps: build the model directly in bfloat16 (meta device, then filled in place, so no float32 copy),
export with fx2onnx, save with external data (weights streamed from the torch tensors), report time and
peak RSS (``VmHWM``, reset after the model is built); then, in a fresh process so that the torch weights
are gone, create an ONNX Runtime session on the saved model and run it once, reporting load time and RSS.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

GiB = 2**30


def _rss_gb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    return 0.0


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def _available_memory() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return float("inf")


def _parameter_count(config: object) -> int:
    """Parameters of a LLaMA configuration, without building it."""
    hidden, intermediate, vocab = config.hidden, config.intermediate, config.vocab
    head_dim = hidden // config.heads
    attention = 2 * hidden * hidden + 2 * hidden * config.kv_heads * head_dim
    layer = attention + 3 * hidden * intermediate + 2 * hidden
    return config.layers * layer + 2 * vocab * hidden + hidden


def export(options: argparse.Namespace) -> dict[str, float]:
    import torch

    import fx2onnx
    from models import LLAMA_7B, build_llama, weight_bytes

    config = dataclasses.replace(
        LLAMA_7B,
        **{
            name: value
            for name, value in {
                "layers": options.layers,
                "hidden": options.hidden,
                "intermediate": options.intermediate,
                "heads": options.heads,
                "kv_heads": options.kv_heads,
                "vocab": options.vocab,
            }.items()
            if value is not None
        },
    )
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[options.dtype]
    needed = _parameter_count(config) * dtype.itemsize * 1.1 + 2 * GiB
    available = _available_memory()
    if available < needed and not options.force:
        raise SystemExit(
            f"this configuration needs about {needed / GiB:.1f} GiB of memory and {available / GiB:.1f} GiB are "
            "available: stopping before building it (--force to try anyway)"
        )
    start = time.perf_counter()
    model = build_llama(config, dtype)
    weights = weight_bytes(model)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"built {config} in {dtype}: {parameters / 1e9:.2f}B parameters, {weights / GiB:.2f} GiB "
        f"in {time.perf_counter() - start:.0f} s; RSS {_rss_gb('VmRSS'):.1f} GiB",
        flush=True,
    )
    ids = torch.randint(0, config.vocab, (1, options.length), generator=torch.Generator().manual_seed(1))

    rss_before = _rss_gb("VmRSS")
    _reset_peak_rss()
    start = time.perf_counter()
    program = fx2onnx.export(model, (ids,))
    exported = time.perf_counter()
    path = os.path.join(options.out, "model.onnx")
    program.save(path, external_data=True)
    saved = time.perf_counter()
    peak = _rss_gb("VmHWM")
    figures = {
        "parameters_billion": parameters / 1e9,
        "weights_gb": weights / GiB,
        "export_s": exported - start,
        "save_s": saved - exported,
        "rss_before_export_gb": rss_before,
        "peak_rss_gb": peak,
        "peak_minus_before_gb": peak - rss_before,
        "file_gb": sum(f.stat().st_size for f in Path(options.out).iterdir()) / GiB,
    }
    print(
        f"export {figures['export_s']:.1f} s, save {figures['save_s']:.1f} s; peak RSS {peak:.2f} GiB "
        f"({peak - rss_before:.2f} GiB above the RSS with the model built); files {figures['file_gb']:.2f} GiB",
        flush=True,
    )
    print("stages:", {k: round(v, 2) for k, v in program.report.stage_seconds.items()}, flush=True)
    if options.verify:
        results = program.verify(ids)
        print("verify:", "; ".join(str(r) for r in results), flush=True)
        figures["verified"] = float(all(r.passed for r in results))
    del program, model
    gc.collect()
    return figures


def load_in_onnxruntime(path: str, length: int, vocab: int, optimization: str) -> dict[str, float]:
    """Runs in a fresh process: session creation time, RSS, and one forward pass."""
    import numpy as np
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = {
        "disable": onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "all": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]
    start = time.perf_counter()
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    loaded = time.perf_counter()
    rss_loaded = _rss_gb("VmRSS")
    ids = np.random.default_rng(1).integers(0, vocab, (1, length), dtype=np.int64)
    (logits,) = session.run_with_ort_values(
        None, {session.get_inputs()[0].name: onnxruntime.OrtValue.ortvalue_from_numpy(ids)}
    )
    ran = time.perf_counter()
    # bfloat16 has no numpy type: read the raw 16-bit words and widen them to float32.
    words = (ctypes.c_uint16 * (logits.tensor_size_in_bytes() // 2)).from_address(logits.data_ptr())
    values = (
        (np.frombuffer(words, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        if logits.data_type() == "tensor(bfloat16)"
        else logits.numpy()
    )
    return {
        "ort_load_s": loaded - start,
        "ort_rss_after_load_gb": rss_loaded,
        "ort_run_s": ran - loaded,
        "ort_peak_rss_gb": _rss_gb("VmHWM"),
        "logits_finite": float(np.isfinite(values.astype(np.float32)).all()),
    }


def main() -> int:
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for model.onnx and model.onnx.data")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--intermediate", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--kv-heads", type=int)
    parser.add_argument("--vocab", type=int)
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--length", type=int, default=16, help="tokens in the example input")
    parser.add_argument("--verify", action="store_true", help="compare with eager (needs memory for both)")
    parser.add_argument("--skip-ort", action="store_true", help="do not load the result in ONNX Runtime")
    parser.add_argument("--force", action="store_true", help="run even if MemAvailable looks too small")
    parser.add_argument(
        "--ort-optimization",
        choices=["disable", "basic", "all"],
        default="disable",
        help="ONNX Runtime graph optimizations while loading (default: none, so no weight is folded into a copy)",
    )
    parser.add_argument("--ort-worker", help=argparse.SUPPRESS)
    options = parser.parse_args()

    if options.ort_worker:
        print(
            json.dumps(load_in_onnxruntime(options.ort_worker, options.length, options.vocab, options.ort_optimization))
        )
        return 0

    os.makedirs(options.out, exist_ok=True)
    figures = export(options)
    if not options.skip_ort:
        from models import LLAMA_7B

        command = [
            sys.executable,
            __file__,
            "--out",
            options.out,
            "--ort-worker",
            os.path.join(options.out, "model.onnx"),
            "--length",
            str(options.length),
            "--vocab",
            str(options.vocab or LLAMA_7B.vocab),
            "--ort-optimization",
            options.ort_optimization,
        ]
        completed = subprocess.run(command, capture_output=True, text=True)
        if completed.returncode != 0:
            print(completed.stderr[-4000:], file=sys.stderr)
            return 1
        ort = json.loads(completed.stdout.strip().splitlines()[-1])
        figures.update(ort)
        print(
            f"ONNX Runtime: loaded in {ort['ort_load_s']:.1f} s (RSS {ort['ort_rss_after_load_gb']:.2f} GiB), "
            f"one forward pass of {options.length} tokens in {ort['ort_run_s']:.1f} s, peak RSS "
            f"{ort['ort_peak_rss_gb']:.2f} GiB, logits finite: {bool(ort['logits_finite'])}",
            flush=True,
        )
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
