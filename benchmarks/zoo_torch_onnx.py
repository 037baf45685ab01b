"""The zoo's baseline: ``torch.onnx.export(dynamo=True)`` on the same cases and variants as benchmarks/zoo.py
(same models, inputs, dynamic shapes and runs), run in ONNX Runtime and judged the way fx2onnx's verify judges:
every output's dtype, shape and values against eager; float16/bfloat16 outputs against eager's own rounding noise
(distance to the float32 result within fx2onnx._rounding_noise's factors of eager's). A benchmark, not part of the
package (the package never calls torch.onnx.export).

    python benchmarks/zoo_torch_onnx.py --only sd_unet,vae --variants float32,float16 --out out/zoo_torch_onnx.jsonl
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zoo
from fx2onnx import _rounding_noise
from fx2onnx._verification import compare


def _judge(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], outputs: list[torch.Tensor]
) -> list[str]:
    """The failed outputs' descriptions (empty: every output matches eager)."""
    with torch.no_grad():
        expected = [x for x in pytree.tree_leaves(model(*args, **copy.deepcopy(kwargs))) if isinstance(x, torch.Tensor)]
    if len(outputs) != len(expected):
        return [f"{len(outputs)} outputs, eager {len(expected)}"]
    reference = _rounding_noise.float32_outputs(model, args, kwargs) if _rounding_noise.weights_dtype(model) else None
    failed = []
    for index, (want, got) in enumerate(zip(expected, outputs, strict=True)):
        result = compare(f"output {index}", want, got)
        if result.passed:
            continue
        if reference is not None and want.dtype == got.dtype and want.shape == got.shape:
            noise = _rounding_noise.compare_to_reference(want, got, reference[index], floor=result.atol)
            if noise is not None and noise.within_noise:
                continue
            failed.append(f"{result} ({noise})")
        else:
            failed.append(str(result))
    return failed


def run_variant(case: zoo.Case, model32: torch.nn.Module, variant: str) -> dict[str, Any]:
    record: dict[str, Any] = {"model": case.name, "group": case.group, "variant": variant, "engine": "torch.onnx"}
    args, kwargs = case.inputs(1 if variant == "batch1" else 2, 12)
    dtype = zoo.REDUCED.get(variant, torch.float32)
    model = model32
    if dtype != torch.float32:
        model = copy.deepcopy(model32).to(dtype)
        args, kwargs = pytree.tree_map(lambda value: zoo._to_dtype(value, dtype), (args, kwargs))
    if variant == "timestep_float":
        kwargs = {**kwargs, "timestep": zoo.float_timestep(case, kwargs["timestep"])}
    runs = [(args, kwargs)]
    options: dict[str, Any] = {}
    if variant in ("dynamic", "batch1"):
        options["dynamic_shapes"] = zoo._dynamic_shapes(case, args, kwargs)
        runs.append(case.inputs(3, 7))
        if variant == "batch1":
            runs.append(case.inputs(2, 12))
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, args, kwargs=kwargs, dynamo=True, verbose=False, **options)
    except Exception as error:
        record.update(outcome="export", error=zoo._short(error))
        return record
    record["export_seconds"] = round(time.perf_counter() - start, 2)
    try:
        program.initialize_inference_session()
    except Exception as error:
        record.update(outcome="load", error=zoo._short(error))
        return record
    lines = []
    for call_args, call_kwargs in runs:
        try:
            outputs = [x for x in program(*call_args, **call_kwargs) if isinstance(x, torch.Tensor)]
        except Exception as error:
            record.update(outcome="run", error=zoo._short(error))
            return record
        failed = _judge(model, call_args, call_kwargs, outputs)
        if failed:
            lines.append(" | ".join(failed))
    record["outcome"] = "mismatch" if lines else "ok"
    if lines:
        record["error"] = " || ".join(lines)[:1500]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated substrings of model names")
    parser.add_argument("--variants", default="float32,bfloat16,float16,dynamic,batch1,timestep_float")
    parser.add_argument("--out", type=Path, default=None, help="append one JSON line per result to this file")
    options = parser.parse_args()
    wanted = [w for w in options.only.split(",") if w]
    cases = [case for case in zoo.all_cases() if not wanted or any(w in case.name for w in wanted)]
    records = []
    for case in cases:
        model32 = case.build()
        for variant in options.variants.split(","):
            if variant not in case.variants:
                continue
            record = run_variant(case, model32, variant)
            records.append(record)
            detail = f" ({record['error'][:160]})" if "error" in record else ""
            print(f"{case.name:20} {variant:15} {record['outcome']}{detail}", file=sys.stderr, flush=True)
            if options.out is not None:
                with options.out.open("a") as file:
                    file.write(json.dumps(record) + "\n")
    print(zoo.table(records))


if __name__ == "__main__":
    main()
