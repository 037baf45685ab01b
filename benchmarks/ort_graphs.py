"""The graphs ONNX Runtime runs for fx2onnx's model and the reference's: op types after its optimizations, and where
the time goes, node by node.

Each exporter exports the model in a fresh subprocess (``export_speed.py``'s worker); both saved models get a
session with the default optimizations (``ORT_ENABLE_ALL``) that writes its optimized graph
(``SessionOptions.optimized_model_filepath``). Printed: the op types (with domain) whose counts differ, then the
kernel time per op type over ``--runs`` profiled runs of each (``SessionOptions.enable_profiling``, one thread).
Kernel times of a single run swing with the machine's load; equal op counts with equal shapes mean equal work.

    python benchmarks/ort_graphs.py --models hf-gpt2,hf-bert --runs 5
    python benchmarks/ort_graphs.py --models gpt2 --keep out/graphs    # keep the models and optimized graphs
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
from pathlib import Path

import export_speed  # beside this script


def _session(path: str, **settings: object) -> object:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = 1, 1, 3
    for name, value in settings.items():
        setattr(options, name, value)
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def optimized_op_counts(path: str) -> collections.Counter[str]:
    """Op types (domain-qualified outside the default domain) of the graph ONNX Runtime optimizes `path` into."""
    import onnx

    optimized = path.removesuffix(".onnx") + ".optimized.onnx"
    _session(path, optimized_model_filepath=optimized)
    graph = onnx.load(optimized, load_external_data=False).graph
    return collections.Counter(f"{node.domain}.{node.op_type}" if node.domain else node.op_type for node in graph.node)


def kernel_microseconds(path: str, model_name: str, runs: int) -> collections.Counter[str]:
    """Mean kernel time per run of each op type, from ONNX Runtime's profile of `runs` + 1 runs (the first cold)."""
    from models import MODELS, flat_inputs

    session = _session(path, enable_profiling=True, profile_file_prefix=path.removesuffix(".onnx"))
    inputs = [tensor.numpy() for tensor in flat_inputs(MODELS[model_name].inputs())]
    feeds = dict(zip([i.name for i in session.get_inputs()], inputs))
    for _ in range(runs + 1):
        session.run(None, feeds)
    profile = session.end_profiling()
    events = json.loads(Path(profile).read_text())
    os.remove(profile)
    per_op: collections.Counter[str] = collections.Counter()
    for event in events:  # session initialization events carry no kernel time
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            per_op[event["args"]["op_name"]] += event["dur"]
    return collections.Counter({op: total / (runs + 1) for op, total in per_op.items()})


def compare(model_name: str, folder: str, runs: int, timeout: float) -> None:
    paths = {e: export_speed.run_export(e, model_name, folder, 0, timeout)["path"] for e in export_speed.EXPORTERS}
    counts = {e: optimized_op_counts(p) for e, p in paths.items()}
    reference, ours = (counts[e] for e in export_speed.EXPORTERS)
    exporters = " / ".join(export_speed.EXPORTERS)
    print(f"== {model_name}, {exporters}: optimized nodes {sum(reference.values())} / {sum(ours.values())}")
    for op in sorted(set(reference) | set(ours)):
        if reference[op] != ours[op]:
            print(f"   {op:42s} {reference[op]:5d} {ours[op]:5d}")
    times = {e: kernel_microseconds(p, model_name, runs) for e, p in paths.items()}
    reference_us, ours_us = (times[e] for e in export_speed.EXPORTERS)
    print(f"   kernel us per run: total {sum(reference_us.values()):.0f} / {sum(ours_us.values()):.0f}")
    for op in sorted(set(reference_us) | set(ours_us), key=lambda o: -max(reference_us[o], ours_us[o])):
        print(f"   {op:42s} {reference_us[op]:10.0f} {ours_us[op]:10.0f} {ours_us[op] - reference_us[op]:+9.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="hf-gpt2", help="comma-separated names of benchmarks/models.py")
    parser.add_argument("--runs", type=int, default=5, help="profiled runs of each model")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per export subprocess")
    parser.add_argument("--keep", default=None, help="folder to keep the models and optimized graphs in")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fx2onnx-ort-graphs-") as scratch:
        folder = arguments.keep or scratch
        for model_name in arguments.models.split(","):
            compare(model_name, os.path.join(folder, model_name), arguments.runs, arguments.timeout)


if __name__ == "__main__":
    main()
