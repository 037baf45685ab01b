"""Where fx2onnx's export time goes, finer than the report's stages; optionally a cProfile listing.

    python benchmarks/profile_export.py gpt2                 # timed steps, one export + save
    python benchmarks/profile_export.py llama --cprofile 30  # and the 30 costliest functions (own time)

Steps are timed by wrapping the functions that do them, so the figures add up to the export's wall
time (the rest is shown as "other"). The first export in a process also imports and builds the
registry; `--warm` exports a tiny model first so that only the model's own work is timed.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import importlib
import io
import pstats
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

# (module, attribute, step name): what is timed. Nested steps are subtracted from their parents.
STEPS = [
    ("fx2onnx._registry", "global_registry", "registry (first use builds it)"),
    ("fx2onnx._capture", "decomposition_table", "decomposition table"),
    ("torch.export", "export", "torch.export.export"),
    ("torch.export.exported_program.ExportedProgram", "run_decompositions", "run_decompositions"),
    ("fx2onnx._capture", "decompose_locally", "local decomposition (and functionalization)"),
    ("fx2onnx._passes", "run_fx_passes", "fx passes"),
    ("fx2onnx._emit.recorder", "infer_node_types", "emit: per-node type inference"),
    ("fx2onnx._emit.graph_builder.GraphEmitter", "run", "dispatch+emit (rest)"),
    ("fx2onnx._finalize.optimizer", "optimize", "finalize: onnxscript optimizer"),
    ("onnx_ir.passes.common.ShapeInferencePass", "call", "shape inference (onnx)"),
    ("fx2onnx._finalize", "finalize", "finalize (rest)"),
    ("fx2onnx.legalize", "legalize_model", "legalize"),
    ("fx2onnx._finalize", "check_model", "check_model"),
    ("fx2onnx.program.ONNXProgram", "save", "save"),
]


class StepTimer:
    """Wall time and process CPU time per step (CPU time is the steadier figure on a shared, loaded machine)."""

    def __init__(self) -> None:
        self.own: dict[str, float] = {}
        self.own_cpu: dict[str, float] = {}
        # per active step: [start, CPU start, wall time spent in nested steps, CPU time spent in nested steps]
        self._stack: list[list[float]] = []

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        self._stack.append([time.perf_counter(), time.process_time(), 0.0, 0.0])
        try:
            yield
        finally:
            start, cpu_start, nested, nested_cpu = self._stack.pop()
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            self.own[name] = self.own.get(name, 0.0) + elapsed - nested
            self.own_cpu[name] = self.own_cpu.get(name, 0.0) + cpu - nested_cpu
            if self._stack:
                self._stack[-1][2] += elapsed
                self._stack[-1][3] += cpu

    def wrap(self, function: Callable[..., Any], name: str) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.step(name):
                return function(*args, **kwargs)

        return timed


def _resolve(path: str) -> Any:
    parts = path.split(".")
    for index in range(len(parts), 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:index]))
        except ImportError:
            continue
        for part in parts[index:]:
            owner = getattr(owner, part)
        return owner
    raise ImportError(path)


def install(timer: StepTimer) -> None:
    import fx2onnx._emit.graph_builder
    import fx2onnx._emit.recorder
    import fx2onnx._export  # noqa: F401

    for owner_path, attribute, name in STEPS:
        owner = _resolve(owner_path)
        setattr(owner, attribute, timer.wrap(getattr(owner, attribute), name))
    # Modules that imported a function by name hold their own reference: point them at the wrapper.
    recorder = sys.modules["fx2onnx._emit.recorder"]
    export_module = sys.modules["fx2onnx._export"]  # fx2onnx.export is the function now
    registry = sys.modules["fx2onnx._registry"]
    export_module.global_registry = registry.global_registry
    for module in list(sys.modules.values()):
        if getattr(module, "infer_node_types", None) is not None and module is not recorder:
            module.infer_node_types = recorder.infer_node_types


def main() -> int:
    warnings.filterwarnings("ignore")
    from models import MODELS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=list(MODELS))
    parser.add_argument("--cprofile", type=int, default=0, help="also list the N functions with most own time")
    parser.add_argument("--warm", action="store_true", help="export a tiny model first (registry, imports)")
    parser.add_argument(
        "--before",
        action="store_true",
        help="time fx2onnx as it was before its speed work: onnxscript's optimize_ir as is, and ir.save",
    )
    options = parser.parse_args()

    import fx2onnx
    from fx2onnx import examples

    spec = MODELS[options.model]
    model, args = spec.build(), spec.inputs()
    if options.warm:
        fx2onnx.export(*examples.tiny_gpt())
    if options.before:
        import onnxscript.optimizer

        from fx2onnx import _streaming as streaming
        from fx2onnx._finalize import optimizer

        optimizer.optimize = lambda model: onnxscript.optimizer.optimize_ir(model)
        streaming.writes_protobuf = lambda path: False  # ONNXProgram.save then calls ir.save
    timer = StepTimer()
    install(timer)
    profiler = cProfile.Profile() if options.cprofile else None
    with tempfile.TemporaryDirectory() as folder:
        start, cpu_start = time.perf_counter(), time.process_time()
        if profiler:
            profiler.enable()
        program = fx2onnx.export(model, args)
        program.save(str(Path(folder) / "model.onnx"))
        if profiler:
            profiler.disable()
        total, total_cpu = time.perf_counter() - start, time.process_time() - cpu_start

    label = " (as before the speed work)" if options.before else ""
    print(
        f"{options.model}{label}: export + save {total:.2f} s, {total_cpu:.2f} s CPU"
        + (" (under cProfile)" if profiler else "")
    )
    print("| step | seconds | share | CPU seconds | CPU share |\n|---|---:|---:|---:|---:|")
    for _, _, name in STEPS:
        seconds, cpu = timer.own.get(name, 0.0), timer.own_cpu.get(name, 0.0)
        print(f"| {name} | {seconds:.3f} | {seconds / total:.0%} | {cpu:.3f} | {cpu / total_cpu:.0%} |")
    other, other_cpu = total - sum(timer.own.values()), total_cpu - sum(timer.own_cpu.values())
    print(f"| other | {other:.3f} | {other / total:.0%} | {other_cpu:.3f} | {other_cpu / total_cpu:.0%} |")
    capture = timer.own.get("torch.export.export", 0.0) + timer.own.get("run_decompositions", 0.0)
    capture_cpu = timer.own_cpu.get("torch.export.export", 0.0) + timer.own_cpu.get("run_decompositions", 0.0)
    print(
        f"\nafter torch.export + decomposition: {(total - capture) / total:.0%} of the total "
        f"({(total_cpu - capture_cpu) / total_cpu:.0%} of the CPU time)"
    )
    if profiler:
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(options.cprofile)
        print(stream.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
