"""Export speed, memory and exported-model latency: fx2onnx vs ``torch.onnx.export(dynamo=True)``.

For each model and each run, each exporter runs in a fresh subprocess (so that its peak RSS is its
own): build the model (fixed seed), export, save. Then both saved models are loaded in ONNX Runtime
with the same session options and timed on the same inputs, alternating between the two so that
machine noise hits both alike. Figures are medians over the runs.

    python benchmarks/export_speed.py                        # all models, 3 runs
    python benchmarks/export_speed.py --models gpt2,resnet --runs 5
    python benchmarks/export_speed.py --models transformers  # transformers' models built from their configs
    python benchmarks/export_speed.py --quick                # resnet and gpt2, 1 run, short latency loop

Peak RSS is the process's high-water mark (``VmHWM``) over export + save, reset after the model is
built; it includes the model's own weights and the imported libraries. "peak RSS - libraries" is that
peak less the RSS of the process once torch and the exporter are imported (before the model is
built): the model's weights plus what the export itself holds. Issue 8's budget for it is
1.1 x weights + 300 MB.

Each fx2onnx run also writes the saved file's byte count with ``dd`` (from /dev/zero, 8 MiB blocks) into the
same folder, with ``conv=fsync`` (what a durable save does: fx2onnx's ``save`` fsyncs the file and its folder)
before the export (the model's weight bytes) and right after the save (the file's bytes); the save is compared
with the mean of the two, the machine's own write speed around it. A dd without fsync after the save is
shown too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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
# Issue 18's targets (in the benchmark only, never in tests).
TARGET_EXPORT_SAVE = 0.35  # fx2onnx export+save / torch.onnx export+save
TARGET_AFTER_TORCH_EXPORT = 0.25  # fx2onnx's export time beyond torch.export / torch.export's own time
TARGET_SAVE_VS_DD = 1.2  # fx2onnx save / dd conv=fsync of the same number of bytes
TARGET_LATENCY = 1.0  # ONNX Runtime latency, fx2onnx's model / torch.onnx's


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


def _timed_fsyncs(seconds: list[float]) -> None:
    """Accumulate the time fx2onnx's save spends in fsync (file and folder) into `seconds[0]`."""
    from fx2onnx import _safe_save

    def timed(function: Any) -> Any:
        def wrapper(path: str) -> None:
            start = time.perf_counter()
            try:
                function(path)
            finally:
                seconds[0] += time.perf_counter() - start

        return wrapper

    _safe_save.fsync_file = timed(_safe_save.fsync_file)
    _safe_save.fsync_directory = timed(_safe_save.fsync_directory)


def dd_seconds(folder: str, byte_count: int, *, fsync: bool) -> float:
    """Seconds ``dd`` takes (its own figure) to write `byte_count` bytes from /dev/zero into a new file in `folder`."""
    target = os.path.join(folder, "dd.bin")
    command = ["dd", "if=/dev/zero", f"of={target}", "bs=8M", f"count={byte_count}", "iflag=count_bytes"]
    if fsync:
        command.append("conv=fsync")
    try:
        completed = subprocess.run(command, capture_output=True, text=True, check=True)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(target)
    match = re.search(r"copied, ([0-9.,e+-]+) s", completed.stderr)
    if match is None:
        raise RuntimeError(f"cannot read dd's time from {completed.stderr!r}")
    return float(match.group(1).replace(",", "."))


def worker(exporter: str, model_name: str, path: str, result_path: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    # Imports are not timed: each exporter's modules, and the torchlib both build their registries
    # from (which each would otherwise import on its first export), are loaded before the clock starts.
    import onnxscript.function_libs.torch_lib.ops  # noqa: F401

    from models import MODELS, weight_bytes

    fsync_seconds = [0.0]
    if exporter == "fx2onnx":
        import fx2onnx

        # fx2onnx's public names load their modules on first use: fx2onnx.export imports the exporter's own
        # modules (dispatch, emit, finalize: 0.15-0.2 s CPU), which belong with the untimed imports
        fx2onnx_export = fx2onnx.export
        _timed_fsyncs(fsync_seconds)
    else:
        import torch.onnx
        import torch.onnx._internal.exporter._compat  # what torch.onnx.export(dynamo=True) imports on first use
    rss_libraries = _rss_kb("VmRSS")
    spec = MODELS[model_name]
    model = spec.build()
    args = spec.inputs()
    dd: dict[str, float] = {}
    if exporter == "fx2onnx":  # the machine's write speed just before (and after) the save, for the same bytes
        dd["dd_fsync_before"] = dd_seconds(os.path.dirname(path), int(weight_bytes(model) * 1.002), fsync=True)
    rss_before = _rss_kb("VmRSS")
    peak_was_reset = _reset_peak_rss()

    start = time.perf_counter()
    if exporter == "fx2onnx":
        program = fx2onnx_export(model, args)
    else:
        program = torch.onnx.export(model, args, dynamo=True, verbose=False)  # a dict last in args: kwargs
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
    file_bytes = _file_bytes(path)
    if exporter == "fx2onnx":  # the machine's own write speed, right after the save, same folder, same bytes
        stages["save: fsync"] = fsync_seconds[0]
        dd["dd_fsync_after"] = dd_seconds(os.path.dirname(path), file_bytes, fsync=True)
        dd["dd"] = dd_seconds(os.path.dirname(path), file_bytes, fsync=False)
        # The save's yardstick: dd conv=fsync before and after it (the disk's speed drifts on a shared machine).
        dd["dd_fsync"] = (dd["dd_fsync_before"] + dd["dd_fsync_after"]) / 2
    result = {
        "export": exported - start,
        "save": saved - exported,
        "rss_libraries_mb": rss_libraries / 1024,
        "rss_before_mb": rss_before / 1024,
        "peak_rss_mb": peak / 1024,
        "peak_over_libraries_mb": (peak - rss_libraries) / 1024,
        "peak_reset": peak_was_reset,
        "weights_mb": weight_bytes(model) / MB,
        "file_mb": file_bytes / MB,
        "stages": stages,
        **dd,
    }
    Path(result_path).write_text(json.dumps(result))


def _file_bytes(path: str) -> int:
    folder = Path(path).parent
    return sum(f.stat().st_size for f in folder.iterdir() if f.name.startswith(Path(path).name))


# --- the driver --------------------------------------------------------------------------------------
@dataclasses.dataclass
class ModelFigures:
    name: str
    runs: dict[str, list[dict[str, Any]]]  # exporter -> per-run results
    latency_ms: dict[str, float]
    max_output_difference: float
    load_average: tuple[float, float]  # 1-minute load average when the model's runs began and ended
    failures: dict[str, str] = dataclasses.field(default_factory=dict)  # exporter -> why it failed
    # exporter -> largest absolute difference of its ONNX Runtime outputs from eager's (same inputs)
    eager_difference: dict[str, float] = dataclasses.field(default_factory=dict)

    def median(self, exporter: str, key: str) -> float:
        return statistics.median(run[key] for run in self.runs[exporter])

    def median_ratio(self, numerator: Callable[[dict[str, Any]], float], denominator: Callable[[dict], float]) -> float:
        """Median over runs of fx2onnx's figure / torch.onnx's, each pair from the same run (back to back)."""
        pairs = zip(self.runs["fx2onnx"], self.runs["torch.onnx"])
        return statistics.median(numerator(ours) / denominator(reference) for ours, reference in pairs)

    def median_of(self, figure: Callable[[dict[str, Any]], float]) -> float:
        """Median over fx2onnx's runs of a figure computed within each run."""
        return statistics.median(figure(run) for run in self.runs["fx2onnx"])

    def after_torch_export(self) -> float:
        """fx2onnx's export time beyond torch.export (decomposition and all its stages, save aside) / torch.export."""
        return self.median_of(lambda run: run["export"] / run["stages"]["torch.export"] - 1)

    def save_vs_dd(self, key: str = "dd_fsync") -> float:
        return self.median_of(lambda run: run["save"] / run[key])

    def median_stage(self, stage: str) -> float:
        return statistics.median(run["stages"].get(stage, 0.0) for run in self.runs["fx2onnx"])


def run_export(exporter: str, model_name: str, folder: str, index: int, timeout: float) -> dict[str, Any]:
    tag = exporter.replace(".", "_")
    path = os.path.join(folder, f"{tag}-{index}", f"{model_name}.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    result_path = os.path.join(folder, f"{tag}-{index}.json")
    command = [sys.executable, __file__, "--worker", exporter, model_name, path, result_path]
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"{exporter} timed out on {model_name} after {timeout:.0f} s") from error
    if completed.returncode != 0:
        raise RuntimeError(f"{exporter} failed on {model_name}:\n{completed.stderr[-4000:]}")
    result = json.loads(Path(result_path).read_text())
    result["path"] = path
    return result


def measure_latency(
    paths: dict[str, str], model_name: str, iterations: int, threads: int
) -> tuple[dict[str, float], float]:
    """ONNX Runtime CPU latency (median ms) of each model: same inputs, same options, interleaved runs.

    Also the largest difference between the first model's outputs and each other's.
    """
    latency, outputs = _latency_and_outputs(paths, model_name, iterations, threads)
    first, *others = outputs.values()
    return latency, _max_difference(first, [array for other in others for array in other], len(others))


def _max_difference(expected: list[Any], actual: list[Any], copies: int = 1) -> float:
    """The largest absolute difference between `expected` and `actual` (`copies` lists of its length, end to end)."""
    import numpy as np

    count = len(expected)
    if len(actual) != count * copies:
        return float("inf")
    differences = [
        float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0.0))
        for index, b in enumerate(actual)
        for a in [expected[index % count]]
    ]
    return max(differences, default=float("nan"))


def _latency_and_outputs(
    paths: dict[str, str], model_name: str, iterations: int, threads: int
) -> tuple[dict[str, float], dict[str, list[Any]]]:
    import onnxruntime

    sys.path.insert(0, str(Path(__file__).parent))
    from models import MODELS, flat_inputs

    inputs = [t.numpy() for t in flat_inputs(MODELS[model_name].inputs())]
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
    return {label: statistics.median(t) * 1000 for label, t in times.items()}, outputs


def eager_outputs(model_name: str) -> list[Any]:
    """The model's eager outputs (its tensors, flattened as torch.export flattens them), as numpy arrays."""
    import torch
    import torch.utils._pytree as pytree

    sys.path.insert(0, str(Path(__file__).parent))
    from models import MODELS

    spec = MODELS[model_name]
    model, inputs = spec.build(), spec.inputs()
    args = [item for item in inputs if not isinstance(item, dict)]
    kwargs = next((item for item in inputs if isinstance(item, dict)), {})
    with torch.no_grad():
        result = model(*args, **kwargs)
    return [leaf.numpy() for leaf in pytree.tree_leaves(result) if isinstance(leaf, torch.Tensor)]


class Progress:
    """One line per finished step on stderr: step count, elapsed time, and an estimate of the time left."""

    def __init__(self, total_steps: int) -> None:
        self.total, self.done, self.started = total_steps, 0, time.perf_counter()

    def step(self, message: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.started
        left = elapsed / self.done * (self.total - self.done)
        print(
            f"[{self.done:3d}/{self.total}] {_clock(elapsed)} elapsed, ~{_clock(left)} left, "
            f"load {_load():.1f} | {message}",
            file=sys.stderr,
            flush=True,
        )


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def benchmark(
    model_name: str, runs: int, iterations: int, threads: int, timeout: float, progress: Progress
) -> ModelFigures:
    results: dict[str, list[dict[str, Any]]] = {e: [] for e in EXPORTERS}
    failures: dict[str, str] = {}
    load_at_start = _load()
    with tempfile.TemporaryDirectory(prefix="fx2onnx-bench-") as folder:
        for index in range(runs):
            # Alternate which exporter goes first, so that drifting machine load hits both alike.
            order = EXPORTERS if index % 2 == 0 else EXPORTERS[::-1]
            for exporter in order:
                if exporter in failures:
                    continue
                try:
                    result = run_export(exporter, model_name, folder, index, timeout)
                except RuntimeError as error:
                    if exporter == "fx2onnx":
                        raise
                    failures[exporter] = _failure_summary(str(error))  # the reference's own failure: reported
                    progress.step(f"{model_name} run {index + 1}/{runs} {exporter} FAILED: {failures[exporter]}")
                    continue
                results[exporter].append(result)
                dd = f"  dd conv=fsync {result['dd_fsync']:5.2f} s" if "dd_fsync" in result else ""
                progress.step(
                    f"{model_name} run {index + 1}/{runs} {exporter:10s} export {result['export']:6.2f} s  "
                    f"save {result['save']:5.2f} s{dd}  peak RSS {result['peak_rss_mb']:5.0f} MB"
                )
                if index < runs - 1:
                    _remove_saved(result["path"])
        paths = {e: results[e][-1]["path"] for e in EXPORTERS if e not in failures}
        latency, outputs = _latency_and_outputs(paths, model_name, iterations, threads)
        expected = eager_outputs(model_name)
        from_eager = {exporter: _max_difference(expected, arrays) for exporter, arrays in outputs.items()}
        first, *others = outputs.values()
        difference = _max_difference(first, [array for other in others for array in other], len(others))
        progress.step(
            f"{model_name} ORT latency ms: "
            + ", ".join(f"{exporter} {latency[exporter]:.2f}" for exporter in paths)
            + f" (max abs diff {difference:.2g}; from eager: "
            + ", ".join(f"{exporter} {value:.2g}" for exporter, value in from_eager.items())
            + ")"
        )
    return ModelFigures(model_name, results, latency, difference, (load_at_start, _load()), failures, from_eager)


def _failure_summary(message: str) -> str:
    """The line of a failed worker's error output that says what went wrong (torch.onnx's exception summary)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith("## Exception summary") and index + 1 < len(lines):
            return lines[index + 1][:300]
    return (lines[-1] if lines else "failed")[:300]


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
            if exporter in figures.failures:
                reason = figures.failures[exporter]
                rows.append(f"| {figures.name} | {weights:.0f} | {exporter} | failed: {reason} |||||")
                continue
            export, save = figures.median(exporter, "export"), figures.median(exporter, "save")
            over = figures.median(exporter, "peak_over_libraries_mb")
            rows.append(
                f"| {figures.name} | {weights:.0f} | {exporter} | {export:.2f} | {save:.2f} | {export + save:.2f} "
                f"| {figures.median(exporter, 'peak_rss_mb'):.0f} | {over:.0f} ({budget:.0f}) "
                f"| {figures.latency_ms[exporter]:.2f} |"
            )
    return "\n".join(rows)


def ratios_table(all_figures: list[ModelFigures]) -> str:
    """Issue 18's figures; each ratio is taken within a run (median over runs), never across runs."""
    rows = [
        f"| model | export | save | export+save (target <= {TARGET_EXPORT_SAVE}x) "
        f"| after torch.export / torch.export (target <= {TARGET_AFTER_TORCH_EXPORT:.0%}) "
        f"| save / dd conv=fsync (target <= {TARGET_SAVE_VS_DD}x) | save / dd | peak RSS "
        f"| ORT latency (target <= {TARGET_LATENCY}x) | max abs diff of outputs "
        "| max abs diff from eager: torch.onnx, fx2onnx | load average |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in all_figures:
        if f.failures:
            failed = ", ".join(f"{exporter} failed" for exporter in f.failures)
            rows.append(
                f"| {f.name} | {failed} | | | {_mark(f.after_torch_export(), TARGET_AFTER_TORCH_EXPORT, '%')} "
                f"| {_mark(f.save_vs_dd(), TARGET_SAVE_VS_DD, 'x')} | {f.save_vs_dd('dd'):.2f}x | | | "
                f"| {_from_eager(f)} | {f.load_average[0]:.1f}-{f.load_average[1]:.1f} |"
            )
            continue

        def ratio(key: str, figures: ModelFigures = f) -> float:
            return figures.median_ratio(lambda run: run[key], lambda run: run[key])

        total = f.median_ratio(lambda r: r["export"] + r["save"], lambda r: r["export"] + r["save"])
        latency = f.latency_ms["fx2onnx"] / f.latency_ms["torch.onnx"]
        rows.append(
            f"| {f.name} | {ratio('export'):.2f}x | {ratio('save'):.2f}x | {_mark(total, TARGET_EXPORT_SAVE, 'x')} "
            f"| {_mark(f.after_torch_export(), TARGET_AFTER_TORCH_EXPORT, '%')} "
            f"| {_mark(f.save_vs_dd(), TARGET_SAVE_VS_DD, 'x')} | {f.save_vs_dd('dd'):.2f}x "
            f"| {ratio('peak_rss_mb'):.2f}x | {_mark(latency, TARGET_LATENCY, 'x')} | {f.max_output_difference:.2g} "
            f"| {_from_eager(f)} | {f.load_average[0]:.1f}-{f.load_average[1]:.1f} |"
        )
    return "\n".join(rows)


def _from_eager(figures: ModelFigures) -> str:
    """Each exporter's largest output difference from eager (older --json files have none)."""
    return ", ".join(f"{figures.eager_difference[e]:.2g}" for e in EXPORTERS if e in figures.eager_difference)


def _mark(value: float, target: float, unit: str) -> str:
    """The figure, in bold where it misses its target."""
    text = f"{value:.0%}" if unit == "%" else f"{value:.2f}x"
    return text if value <= target + 1e-9 else f"**{text}**"


def save_table(all_figures: list[ModelFigures]) -> str:
    rows = [
        "| model | file MB | save s | of which fsync s | dd conv=fsync s | dd s | save MB/s | dd conv=fsync MB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in all_figures:
        size, save = f.median("fx2onnx", "file_mb"), f.median("fx2onnx", "save")
        dd_fsync, dd = f.median("fx2onnx", "dd_fsync"), f.median("fx2onnx", "dd")
        fsync = f.median_stage("save: fsync")
        rows.append(
            f"| {f.name} | {size:.0f} | {save:.2f} | {fsync:.2f} | {dd_fsync:.2f} | {dd:.2f} "
            f"| {size / save:.0f} | {size / dd_fsync:.0f} |"
        )
    return "\n".join(rows)


def stages_table(all_figures: list[ModelFigures]) -> str:
    names = [stage for stage in STAGES if stage != "save"]
    for figures in all_figures:  # stages the report has beyond the usual ones, in the order they ran
        for run in figures.runs["fx2onnx"]:
            names += [stage for stage in run["stages"] if stage not in names and not stage.startswith("save")]
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
    from models import MODELS, group_available

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = sorted({spec.group for spec in MODELS.values()})
    parser.add_argument(
        "--models",
        default=None,
        help=f"comma-separated, from {','.join(MODELS)}, or a group: {', '.join(groups)}, all (default: all)",
    )
    parser.add_argument("--runs", type=int, default=None, help="export runs per exporter and model (default 3)")
    parser.add_argument("--iterations", type=int, default=None, help="ORT latency iterations (default 30)")
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads for both models (default 1)")
    parser.add_argument("--quick", action="store_true", help="resnet and gpt2, 1 run, 5 latency iterations")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per export subprocess")
    parser.add_argument("--json", default=None, help="write every measurement to this JSON file")
    parser.add_argument("--tables-from", default=None, help="print the tables of a --json file only")
    options = parser.parse_args(argv)

    names = []
    for item in (options.models or ("resnet,gpt2" if options.quick else "all")).split(","):
        members = [name for name, spec in MODELS.items() if item in (spec.group, "all")]
        names += [name for name in members or [item] if name not in names]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODELS)}")
    unavailable = {group: group_available(group) for group in {MODELS[name].group for name in names}}
    for group, reason in unavailable.items():
        if reason is not None:  # e.g. torchvision or timm not installed: their models are left out, said so
            print(f"skipping the {group} models: {reason}", file=sys.stderr)
            names = [name for name in names if MODELS[name].group != group]
    runs = options.runs or (1 if options.quick else 3)
    iterations = options.iterations or (5 if options.quick else 30)

    if options.tables_from:
        saved = json.loads(Path(options.tables_from).read_text())
        print_tables([ModelFigures(**figures) for figures in saved], "(from " + options.tables_from + ")")
        return 0
    _compile_fx2onnx()
    print(
        f"{len(names)} model(s), {runs} run(s) per exporter, {iterations} latency iterations, "
        f"load average {_load():.1f}",
        file=sys.stderr,
    )
    progress = Progress(len(names) * (2 * runs + 1))
    all_figures = []
    failed: dict[str, str] = {}  # model -> fx2onnx's error: the other models still run, the failure is reported
    for name in names:
        print(f"{name}: {MODELS[name].description}", file=sys.stderr, flush=True)
        try:
            all_figures.append(benchmark(name, runs, iterations, options.threads, options.timeout, progress))
        except RuntimeError as error:
            failed[name] = str(error)
            print(f"{name} FAILED in fx2onnx:\n{error}", file=sys.stderr, flush=True)
            continue
        if options.json:  # after each model, so that a failure later keeps what was measured
            Path(options.json).write_text(json.dumps([dataclasses.asdict(f) for f in all_figures], indent=1))
    print_tables(all_figures, _environment(runs, iterations, options.threads))
    for name, error in failed.items():
        print(f"\n{name}: fx2onnx failed: {_failure_summary(error)}")
    return 1 if failed else 0


def print_tables(all_figures: list[ModelFigures], environment: str) -> None:
    print(environment)

    print("\nMedians per exporter:\n")
    print(figures_table(all_figures))
    print("\nfx2onnx / torch.onnx (each ratio within a run, median over runs; bold: target missed):\n")
    print(ratios_table(all_figures))
    print("\nfx2onnx's save against dd writing the same number of bytes right after it (medians):\n")
    print(save_table(all_figures))
    print("\nfx2onnx stage by stage (seconds, medians):\n")
    print(stages_table(all_figures))


def _environment(runs: int, iterations: int, threads: int) -> str:
    import onnxruntime
    import onnxscript
    import torch

    import fx2onnx

    load = _load()
    source = Path(fx2onnx.__file__).parent
    commit = subprocess.run(
        ["git", "-C", str(source), "describe", "--always", "--dirty"], capture_output=True, text=True
    ).stdout.strip()
    return (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, fx2onnx from {source} (commit {commit or 'unknown'}); "
        f"torch {torch.__version__}, onnxscript {onnxscript.__version__}, onnxruntime {onnxruntime.__version__}; "
        f"{os.cpu_count()} CPUs, load average {load:.1f}; {runs} run(s) per exporter, "
        f"ORT: {iterations} iterations, {threads} intra-op thread(s)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
