"""Export speed, memory and exported-model latency: fx2onnx vs ``torch.onnx.export(dynamo=True)``.

For each model and each run, each exporter runs in a fresh subprocess (so that its peak RSS is its
own): build the model (fixed seed), export, save. Then both saved models are loaded in ONNX Runtime
with the same session options and timed on the same inputs, alternating between the two so that
machine noise hits both alike. Figures are medians over the runs.

    python benchmarks/export_speed.py                        # all models, 3 runs
    python benchmarks/export_speed.py --models gpt2,resnet --runs 5
    python benchmarks/export_speed.py --quick                # resnet and gpt2, 1 run, short latency loop

Peak RSS is the process's high-water mark (``VmHWM``) over export + save, reset after the model is
built; it includes the model's own weights and the imported libraries. "peak RSS - libraries" is that
peak less the RSS of the process once torch and the exporter are imported (before the model is
built): the model's weights plus what the export itself holds. Issue 8's budget for it is
1.1 x weights + 300 MB.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EXPORTERS = ("torch.onnx", "fx2onnx")
# fx2onnx's report stages, with "capture" split into the tracer (torch.export), decomposition and the rest
# (fx2onnx's own work around them). Issue 8's "overhead" is everything but torch.export and decomposition.
STAGES = (
    "registry",
    "torch.export",
    "decomposition",
    "capture (rest)",
    "fx passes",
    "dispatch+emit",
    "finalize",
    "legalize",
    "save",
)
CAPTURE_PROPER = ("torch.export", "decomposition")
MB = 2**20


# --- the worker: one export + save in this (fresh) process ---------------------------------------------
def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def worker(exporter: str, model_name: str, path: str, result_path: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    # Imports are not timed: each exporter's modules, and the torchlib both build their registries
    # from (which each would otherwise import on its first export), are loaded before the clock starts.
    import onnxscript.function_libs.torch_lib.ops  # noqa: F401

    from models import MODELS, weight_bytes

    if exporter == "fx2onnx":
        import fx2onnx
    else:
        import torch.onnx
    rss_libraries = _rss_kb("VmRSS")
    spec = MODELS[model_name]
    model = spec.build()
    args = spec.inputs()
    rss_before = _rss_kb("VmRSS")
    peak_was_reset = _reset_peak_rss()

    start = time.perf_counter()
    if exporter == "fx2onnx":
        program = fx2onnx.export(model, args)
    else:
        program = torch.onnx.export(model, args, dynamo=True, verbose=False)
    exported = time.perf_counter()
    program.save(path)
    saved = time.perf_counter()

    stages: dict[str, float] = {}
    if exporter == "fx2onnx":
        for stage, seconds in program.report.stage_seconds.items():
            if stage != "capture":
                stages[stage] = seconds
                continue
            parts = program.report.capture_seconds
            stages["torch.export"] = parts.get("torch.export", seconds)
            stages["decomposition"] = parts.get("decomposition", 0.0)
            stages["capture (rest)"] = seconds - stages["torch.export"] - stages["decomposition"]
    stages["save"] = saved - exported
    peak = _rss_kb("VmHWM")  # since the reset, or since the process started where it could not be reset
    result = {
        "export": exported - start,
        "save": saved - exported,
        "rss_libraries_mb": rss_libraries / 1024,
        "rss_before_mb": rss_before / 1024,
        "peak_rss_mb": peak / 1024,
        "peak_over_libraries_mb": (peak - rss_libraries) / 1024,
        "peak_reset": peak_was_reset,
        "weights_mb": weight_bytes(model) / MB,
        "file_mb": _file_mb(path),
        "stages": stages,
    }
    Path(result_path).write_text(json.dumps(result))


def _file_mb(path: str) -> float:
    folder = Path(path).parent
    return sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith(Path(path).name)) / MB


# --- the driver --------------------------------------------------------------------------------------
@dataclasses.dataclass
class ModelFigures:
    name: str
    runs: dict[str, list[dict[str, Any]]]  # exporter -> per-run results
    latency_ms: dict[str, float]
    max_output_difference: float

    def median(self, exporter: str, key: str) -> float:
        return statistics.median(run[key] for run in self.runs[exporter])

    def median_stage(self, stage: str) -> float:
        return statistics.median(run["stages"].get(stage, 0.0) for run in self.runs["fx2onnx"])


def run_export(exporter: str, model_name: str, folder: str, index: int, timeout: float) -> dict[str, Any]:
    tag = exporter.replace(".", "_")
    path = os.path.join(folder, f"{tag}-{index}", f"{model_name}.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    result_path = os.path.join(folder, f"{tag}-{index}.json")
    command = [sys.executable, __file__, "--worker", exporter, model_name, path, result_path]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if completed.returncode != 0:
        raise RuntimeError(f"{exporter} failed on {model_name}:\n{completed.stderr[-4000:]}")
    result = json.loads(Path(result_path).read_text())
    result["path"] = path
    return result


def measure_latency(paths: dict[str, str], model_name: str, iterations: int, threads: int) -> tuple[dict, float]:
    """ONNX Runtime CPU latency (median ms) of each model: same inputs, same options, interleaved runs.

    Also the largest difference between the first model's outputs and each other's.
    """
    import numpy as np
    import onnxruntime

    sys.path.insert(0, str(Path(__file__).parent))
    from models import MODELS

    inputs = [t.numpy() for t in MODELS[model_name].inputs()]
    sessions = {}
    for label, path in paths.items():
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        sessions[label] = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {label: dict(zip([i.name for i in s.get_inputs()], inputs)) for label, s in sessions.items()}
    outputs = {label: s.run(None, feeds[label]) for label, s in sessions.items()}  # also the warm-up
    for label, session in sessions.items():
        session.run(None, feeds[label])
    times: dict[str, list[float]] = {label: [] for label in sessions}
    for _ in range(iterations):
        for label, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds[label])
            times[label].append(time.perf_counter() - start)
    first, *others = outputs.values()
    difference = max(float(np.abs(a.astype(np.float64) - b).max()) for other in others for a, b in zip(first, other))
    return {label: statistics.median(t) * 1000 for label, t in times.items()}, difference


def benchmark(model_name: str, runs: int, iterations: int, threads: int, timeout: float) -> ModelFigures:
    results: dict[str, list[dict[str, Any]]] = {e: [] for e in EXPORTERS}
    with tempfile.TemporaryDirectory(prefix="fx2onnx-bench-") as folder:
        for index in range(runs):
            # Alternate which exporter goes first, so that drifting machine load hits both alike.
            order = EXPORTERS if index % 2 == 0 else EXPORTERS[::-1]
            for exporter in order:
                result = run_export(exporter, model_name, folder, index, timeout)
                results[exporter].append(result)
                print(
                    f"  {model_name} run {index + 1}/{runs} {exporter:10s} export {result['export']:6.2f} s  "
                    f"save {result['save']:6.2f} s  peak RSS {result['peak_rss_mb']:7.0f} MB",
                    file=sys.stderr,
                    flush=True,
                )
                if index < runs - 1:
                    _remove_saved(result["path"])
        paths = {e: results[e][-1]["path"] for e in EXPORTERS}
        latency, difference = measure_latency(paths, model_name, iterations, threads)
    return ModelFigures(model_name, results, latency, difference)


def _remove_saved(path: str) -> None:
    folder = Path(path).parent
    for item in folder.iterdir():
        item.unlink()


# --- tables --------------------------------------------------------------------------------------------
def figures_table(all_figures: list[ModelFigures]) -> str:
    header = (
        "| model | weights MB | exporter | export s | save s | export+save s | peak RSS MB "
        "| peak RSS - libraries MB (budget) | ORT latency ms |\n|---|---:|---|---:|---:|---:|---:|---:|---:|"
    )
    rows = [header]
    for figures in all_figures:
        weights = figures.median("fx2onnx", "weights_mb")
        budget = 1.1 * weights + 300
        for exporter in EXPORTERS:
            export, save = figures.median(exporter, "export"), figures.median(exporter, "save")
            over = figures.median(exporter, "peak_over_libraries_mb")
            rows.append(
                f"| {figures.name} | {weights:.0f} | {exporter} | {export:.2f} | {save:.2f} | {export + save:.2f} "
                f"| {figures.median(exporter, 'peak_rss_mb'):.0f} | {over:.0f} ({budget:.0f}) "
                f"| {figures.latency_ms[exporter]:.2f} |"
            )
    return "\n".join(rows)


def ratios_table(all_figures: list[ModelFigures]) -> str:
    rows = [
        "| model | export | save | export+save (target <= 0.5) | peak RSS | ORT latency (target <= 1.0) "
        "| max abs diff of outputs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in all_figures:

        def ratio(key: str, figures: ModelFigures = f) -> float:
            return figures.median("fx2onnx", key) / figures.median("torch.onnx", key)

        total_ours = f.median("fx2onnx", "export") + f.median("fx2onnx", "save")
        total_ref = f.median("torch.onnx", "export") + f.median("torch.onnx", "save")
        latency = f.latency_ms["fx2onnx"] / f.latency_ms["torch.onnx"]
        rows.append(
            f"| {f.name} | {ratio('export'):.2f}x | {ratio('save'):.2f}x | {total_ours / total_ref:.2f}x "
            f"| {ratio('peak_rss_mb'):.2f}x | {latency:.2f}x | {f.max_output_difference:.2g} |"
        )
    return "\n".join(rows)


def stages_table(all_figures: list[ModelFigures]) -> str:
    names = [stage for stage in STAGES if stage != "save"]
    for figures in all_figures:  # stages the report has beyond the usual ones, in the order they ran
        for run in figures.runs["fx2onnx"]:
            names += [stage for stage in run["stages"] if stage not in names and stage != "save"]
    names.append("save")
    rows = [
        "| model | " + " | ".join(names) + " | total | after capture (target <= 10%) | after capture, save aside |",
        "|---|" + "---:|" * (len(names) + 3),
    ]
    for f in all_figures:
        stages = {stage: f.median_stage(stage) for stage in names}
        total = f.median("fx2onnx", "export") + f.median("fx2onnx", "save")
        capture = sum(stages[stage] for stage in CAPTURE_PROPER)
        after = (total - capture) / total
        after_without_save = (total - stages["save"] - capture) / (total - stages["save"])
        cells = " | ".join(f"{stages[s]:.2f}" for s in names)
        rows.append(f"| {f.name} | {cells} | {total:.2f} | {after:.0%} | {after_without_save:.0%} |")
    return "\n".join(rows)


def _compile_fx2onnx() -> None:
    """Byte-compile fx2onnx's sources, as ``pip install`` does for the reference's (torch's) modules.

    An editable install leaves fx2onnx uncompiled; where PYTHONDONTWRITEBYTECODE is set (CI images),
    every worker would otherwise compile its lowering modules from source during its first export.
    """
    import compileall

    import fx2onnx

    compileall.compile_dir(str(Path(fx2onnx.__file__).parent), quiet=1)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--worker":
        worker(*argv[1:5])
        return 0
    sys.path.insert(0, str(Path(__file__).parent))
    from models import MODELS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None, help=f"comma-separated, from {','.join(MODELS)} (default: all)")
    parser.add_argument("--runs", type=int, default=None, help="export runs per exporter and model (default 3)")
    parser.add_argument("--iterations", type=int, default=None, help="ORT latency iterations (default 30)")
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads for both models (default 1)")
    parser.add_argument("--quick", action="store_true", help="resnet and gpt2, 1 run, 5 latency iterations")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per export subprocess")
    parser.add_argument("--json", default=None, help="also write every measurement to this JSON file")
    options = parser.parse_args(argv)

    names = (options.models or ("resnet,gpt2" if options.quick else ",".join(MODELS))).split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODELS)}")
    runs = options.runs or (1 if options.quick else 3)
    iterations = options.iterations or (5 if options.quick else 30)

    _compile_fx2onnx()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{runs} run(s) per exporter, {iterations} latency iterations, load average {load:.1f}", file=sys.stderr)
    all_figures = []
    for name in names:
        print(f"{name}: {MODELS[name].description}", file=sys.stderr, flush=True)
        all_figures.append(benchmark(name, runs, iterations, options.threads, options.timeout))

    print(_environment(runs, iterations, options.threads))
    print("\nMedians per exporter:\n")
    print(figures_table(all_figures))
    print("\nfx2onnx / torch.onnx:\n")
    print(ratios_table(all_figures))
    print("\nfx2onnx stage by stage (seconds, medians):\n")
    print(stages_table(all_figures))
    if options.json:
        Path(options.json).write_text(json.dumps([dataclasses.asdict(f) for f in all_figures], indent=1))
    return 0


def _environment(runs: int, iterations: int, threads: int) -> str:
    import onnxruntime
    import onnxscript
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"torch {torch.__version__}, onnxscript {onnxscript.__version__}, onnxruntime {onnxruntime.__version__}; "
        f"{os.cpu_count()} CPUs, load average {load:.1f}; {runs} run(s) per exporter, "
        f"ORT: {iterations} iterations, {threads} intra-op thread(s)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
