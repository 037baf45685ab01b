"""The ``fx2onnx`` command line: ``demo``, ``export``, ``inspect``."""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

_DTYPES = {
    "fp32": "float32",
    "f32": "float32",
    "fp16": "float16",
    "f16": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fx2onnx", description="Export PyTorch models to ONNX through FX.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="export the built-in TinyGPT, run it in ONNX Runtime, verify vs eager")
    demo.add_argument("-o", "--output", default="out/tiny_gpt.onnx", help="where to save the model")

    export = commands.add_parser("export", help="export MODULE:FACTORY (a function returning a model [, inputs])")
    export.add_argument("factory", help="e.g. my_models:build (the function returns model or (model, args))")
    export.add_argument("-o", "--output", required=True)
    export.add_argument("--input-shape", action="append", default=[], help="e.g. 1,3,224,224 (repeat per input)")
    export.add_argument("--input-dtype", default="float32", help="dtype of inputs made from --input-shape")
    export.add_argument("--dtype", help="cast the model's floating weights to this dtype (bf16, fp16, ...)")
    export.add_argument("--dynamic", action="append", default=[], help="make dim 0 of every input dynamic, named so")
    export.add_argument("--opset", type=int, default=18)
    export.add_argument("--external-data", action="store_true")
    export.add_argument("--verify", action="store_true", help="compare ONNX Runtime with eager on the inputs")

    inspect = commands.add_parser("inspect", help="print inputs, outputs, op histogram, opset and size of a model")
    inspect.add_argument("model")

    options = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    try:
        return {"demo": _demo, "export": _export, "inspect": _inspect}[options.command](options)
    except Exception as error:
        print(f"fx2onnx {options.command} failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1


def _demo(options: argparse.Namespace) -> int:
    import fx2onnx
    from fx2onnx.examples import parameter_count, tiny_gpt

    model, args = tiny_gpt()
    print(f"TinyGPT: {parameter_count(model):,} parameters, input ids {tuple(args[0].shape)}")
    start = time.perf_counter()
    program = fx2onnx.export(model, args, progress=True)
    seconds = time.perf_counter() - start
    program.save(options.output)
    results = program.verify(*args)
    print(program.report.summary())
    print(f"exported in {seconds:.2f}s to {options.output} ({os.path.getsize(options.output) / 2**20:.2f} MiB)")
    for result in results:
        print(f"  {result}")
    ok = all(r.passed for r in results)
    print("verification:", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


def _load_factory(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise ValueError(f"expected MODULE:FACTORY, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    return getattr(module, attribute)


def _export(options: argparse.Namespace) -> int:
    import torch

    import fx2onnx

    made = _load_factory(options.factory)()
    model, args = made if isinstance(made, tuple) else (made, None)
    if options.input_shape:
        dtype = getattr(torch, _DTYPES.get(options.input_dtype, options.input_dtype))
        shapes = [tuple(int(d) for d in shape.split(",")) for shape in options.input_shape]
        args = tuple(
            torch.randn(shape).to(dtype) if dtype.is_floating_point else torch.randint(0, 10, shape, dtype=dtype)
            for shape in shapes
        )
    if args is None:
        raise ValueError("the factory returned no example inputs; give --input-shape")
    args = args if isinstance(args, tuple) else (args,)
    if options.dtype:
        dtype = getattr(torch, _DTYPES.get(options.dtype, options.dtype))
        model = model.to(dtype)
        args = tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    dynamic_shapes = None
    if options.dynamic:
        dim = torch.export.Dim(options.dynamic[0])
        dynamic_shapes = tuple({0: dim} if isinstance(a, torch.Tensor) else None for a in args)
    program = fx2onnx.export(
        model.eval(),
        args,
        dynamic_shapes=dynamic_shapes,
        opset_version=options.opset,
        progress=True,
        verify=options.verify,
    )
    program.save(options.output, external_data=options.external_data or None)
    print(program.report.summary())
    if program.report.verification:
        for result in program.report.verification:
            print(f"  {result}")
    print(f"saved {options.output}")
    return 0


def _inspect(options: argparse.Namespace) -> int:
    import onnx_ir as ir

    model = ir.load(options.model)
    graph = model.graph
    print(f"{options.model}: ir_version {model.ir_version}, opsets {dict(graph.opset_imports)}")
    print(f"size: {os.path.getsize(options.model) / 2**20:.2f} MiB on disk")
    for value in graph.inputs:
        print(f"  input  {value.name}: {value.dtype.name if value.dtype else '?'} {value.shape}")
    for value in graph.outputs:
        print(f"  output {value.name}: {value.dtype.name if value.dtype else '?'} {value.shape}")
    histogram = collections.Counter(node.op_type for node in graph.all_nodes())
    print(f"{sum(histogram.values())} nodes, {len(graph.initializers)} initializers")
    for op_type, count in histogram.most_common():
        print(f"  {op_type:<24}{count}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
