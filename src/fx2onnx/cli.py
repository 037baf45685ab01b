"""The ``fx2onnx`` command line.

``fx2onnx demo``                      export the built-in TinyGPT, run it in ONNX Runtime, verify it
``fx2onnx export MODULE:FACTORY -o m.onnx [--input-shape 1,3,224,224] [--dtype bf16] [--dynamic batch]
                [--target onnxruntime-cpu] [--report r.md --report r.sarif] [--verify]``
``fx2onnx inspect m.onnx [--target onnxruntime-cpu]``
``fx2onnx coverage ...``               the support matrix (issue 5), when its module is installed

Each subcommand is a :class:`Subcommand` in :data:`SUBCOMMANDS`. ``coverage`` plugs in without
editing this file: a module ``fx2onnx.coverage.cli`` with ``HELP``, ``configure(parser)`` and
``run(options) -> int`` becomes ``fx2onnx coverage`` (keep its import light: import torch in ``run``).

On failure a command prints one paragraph to stderr (what failed, where, what to do) and exits
with status 1 (2 for a bad command line); ``--traceback`` adds Python's traceback.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import importlib
import importlib.util
import os
import runpy
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from fx2onnx._records import BASE_OPSET, FX_NODE, STACK_TRACE

_DTYPES = {
    "fp32": "float32",
    "f32": "float32",
    "float": "float32",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
    "f64": "float64",
    "double": "float64",
    "i64": "int64",
    "long": "int64",
    "i32": "int32",
    "int": "int32",
    "i8": "int8",
    "u8": "uint8",
}
# At most this many lines of an error message go to the terminal; the report has the rest.
MAX_ERROR_LINES = 30


@dataclasses.dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --- entry point ------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    options = parser.parse_args(argv)
    options.started = time.time()
    warnings.filterwarnings("ignore")
    try:
        return options.run(options)
    except KeyboardInterrupt:
        print(f"fx2onnx {options.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        print(failure_paragraph(options, error), file=sys.stderr)
        if getattr(options, "traceback", False):
            traceback.print_exc()
        return 1


def build_parser() -> argparse.ArgumentParser:
    from fx2onnx import __version__  # the package's names load on first use: this imports no torch

    parser = argparse.ArgumentParser(prog="fx2onnx", description="Export PyTorch models to ONNX through FX.")
    parser.add_argument("--version", action="version", version=f"fx2onnx {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for subcommand in subcommands():
        sub = commands.add_parser(subcommand.name, help=subcommand.help, description=subcommand.help)
        subcommand.configure(sub)
        sub.add_argument("--traceback", action="store_true", help="print Python's traceback on failure")
        sub.set_defaults(run=subcommand.run)
    return parser


def subcommands() -> list[Subcommand]:
    found = list(SUBCOMMANDS)
    coverage = _plugin("coverage", "fx2onnx.coverage.cli")  # issue 5: the support matrix
    if coverage is not None:
        found.append(coverage)
    return found


def _plugin(name: str, module_name: str) -> Subcommand | None:
    """A subcommand provided by another module (``HELP``, ``configure``, ``run``), if it is installed."""
    try:
        if importlib.util.find_spec(module_name) is None:
            return None
    except ModuleNotFoundError:
        return None
    module = importlib.import_module(module_name)
    return Subcommand(name, getattr(module, "HELP", name), module.configure, module.run)


def failure_paragraph(options: argparse.Namespace, error: BaseException) -> str:
    """One paragraph: the command, the error and its context (no blank lines, at most MAX_ERROR_LINES)."""
    lines = [line.rstrip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        lines = ["(no message)"]
    if len(lines) > MAX_ERROR_LINES:
        lines = [*lines[:MAX_ERROR_LINES], f"... ({len(lines) - MAX_ERROR_LINES} more lines)"]
    lines[0] = f"fx2onnx {options.command} failed: {type(error).__name__}: {lines[0]}"
    started = getattr(options, "started", 0.0)
    reports = [
        path
        for path in getattr(options, "report", None) or []
        if os.path.exists(path) and os.path.getmtime(path) >= started - 1.0  # written by this run (coarse clocks)
    ]
    if reports:
        lines.append(f"The export report is in {', '.join(reports)}.")
    if not getattr(options, "traceback", False):
        lines.append("(--traceback shows where in Python it failed.)")
    return "\n".join(lines)


def _progress(message: str) -> None:
    print(f"fx2onnx: {message}", file=sys.stderr, flush=True)


# --- demo -------------------------------------------------------------------------------------------
def _configure_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", default="out/tiny_gpt.onnx", help="where to save the model")


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


# --- export -----------------------------------------------------------------------------------------
def _configure_export(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "factory",
        help="MODULE:FACTORY or path/to/file.py:FACTORY; FACTORY() returns a model, (model, args) "
        "or (model, args, kwargs)",
    )
    parser.add_argument("-o", "--output", required=True, help="the .onnx file to write (only on success)")
    parser.add_argument(
        "--input-shape", action="append", default=[], help="e.g. 1,3,224,224; repeat per input (replaces the factory's)"
    )
    parser.add_argument("--input-dtype", default="float32", help="dtype of the inputs made from --input-shape")
    parser.add_argument("--dtype", help="cast the model's floating weights and inputs to this dtype (bf16, fp16, ...)")
    parser.add_argument(
        "--dynamic",
        action="append",
        default=[],
        metavar="[DIM=]NAME",
        help="make dimension DIM (0 when omitted) of every tensor input (keyword and nested ones too) dynamic, "
        "named NAME; repeatable",
    )
    parser.add_argument("--target", default="onnxruntime-cpu", help="runtime the model must run in (or 'onnx')")
    parser.add_argument(
        "--opset",
        type=lambda text: text if text == "min" else int(text),
        default=BASE_OPSET,
        help="ONNX opset of the model (default 18, torchlib's own; 23 for the fused Attention, RMSNormalization "
        "and RotaryEmbedding operators), or 'min': the lowest the model's dtypes need (float8: 19)",
    )
    parser.add_argument("--fast-math", action="store_true", help="let legalized float ops skip rounding steps")
    parser.add_argument("--strict", action="store_true", help="capture with torch.export's strict mode")
    parser.add_argument("--extractor", default="torch.export", help="torch.export or symbolic_trace")
    parser.add_argument("--report", action="append", default=[], help="write the report here (.md or .sarif)")
    parser.add_argument("--verify", action="store_true", help="compare ONNX Runtime with eager on the inputs")
    parser.add_argument("--external-data", action="store_true", help="weights to <output>.data")
    parser.add_argument(
        "--weights",
        metavar="CHECKPOINT",
        help="read the weights from this safetensors file or folder of shards (with model.safetensors.index.json) "
        "when saving; the factory's model is built on the meta device (no memory for its weights)",
    )
    parser.add_argument(
        "--save-weights",
        choices=("copy", "reference"),
        default="copy",
        help="with --weights: 'reference' points the model's external data at the checkpoint's own bytes instead "
        "of copying them (the output must be inside the checkpoint's folder; see ONNXProgram.save)",
    )


def _configure_verify_weights(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a saved .onnx file")
    parser.add_argument("--weights", metavar="CHECKPOINT", help="the checkpoint it was exported from")
    parser.add_argument("--samples", type=int, default=64, help="elements of each weight compared (default 64)")
    parser.add_argument("--full", action="store_true", help="compare every byte")


def _verify_weights(options: argparse.Namespace) -> int:
    from fx2onnx._weights import verify_weights

    check = verify_weights(options.model, options.weights, samples=options.samples, full=options.full)
    print(check)
    return 0 if check.passed else 1


def load_factory(spec: str) -> Callable[[], Any]:
    """``package.module:name`` (importable from the current directory) or ``path/to/file.py:name``."""
    source, _, attribute = spec.rpartition(":")
    if not source or not attribute:
        raise ValueError(f"expected MODULE:FACTORY or FILE.py:FACTORY, got {spec!r}")
    if source.endswith(".py"):
        if not os.path.exists(source):
            raise FileNotFoundError(f"no file {source!r} (from {spec!r})")
        namespace = runpy.run_path(source, run_name=f"fx2onnx_factory_{os.path.basename(source)[:-3]}")
        if attribute not in namespace:
            raise AttributeError(f"{source} defines no {attribute!r}")
        return namespace[attribute]
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(source)
    if not hasattr(module, attribute):
        raise AttributeError(f"module {source!r} ({module.__file__}) defines no {attribute!r}")
    return getattr(module, attribute)


def _torch_dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, _DTYPES.get(name, name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}; use e.g. float32, bf16, fp16, int64")
    return dtype


def _model_and_inputs(options: argparse.Namespace) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    import torch

    factory = load_factory(options.factory)
    if getattr(options, "weights", None):  # weights come from the checkpoint: build the model without them
        with torch.device("meta"):
            made = factory()
    else:
        made = factory()
    if isinstance(made, tuple):
        model, args, kwargs = (*made, None, None)[:3]
    else:
        model, args, kwargs = made, None, None
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{options.factory} returned {type(model).__name__}, not a torch.nn.Module")
    if options.input_shape:
        dtype = _torch_dtype(options.input_dtype)
        shapes = [tuple(int(d) for d in shape.split(",") if d.strip()) for shape in options.input_shape]
        args = tuple(
            torch.randn(shape).to(dtype) if dtype.is_floating_point else torch.randint(0, 10, shape, dtype=dtype)
            for shape in shapes
        )
    if args is None:
        raise ValueError(f"{options.factory} returned no example inputs; give them with --input-shape")
    args = args if isinstance(args, tuple) else (args,)
    kwargs = dict(kwargs or {})
    # Inputs the factory made under the meta device hold no data: zeros of their shapes (capture needs no more).
    args, kwargs = torch.utils._pytree.tree_map_only(
        torch.Tensor, lambda a: torch.zeros_like(a, device="cpu") if a.is_meta else a, (args, kwargs)
    )
    if options.dtype:
        dtype = _torch_dtype(options.dtype)
        model = model.to(dtype)
        args, kwargs = torch.utils._pytree.tree_map_only(
            torch.Tensor, lambda a: a.to(dtype) if a.is_floating_point() else a, (args, kwargs)
        )
    return model, args, kwargs


def _dynamic_shapes(options: argparse.Namespace, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``--dynamic`` for every tensor input: positional and keyword arguments, and tensors nested in them."""
    import inspect

    import torch

    if not options.dynamic:
        return None
    dims: dict[int, Any] = {}
    for item in options.dynamic:
        dim, _, name = item.rpartition("=")
        dims[int(dim) if dim else 0] = torch.export.Dim(name)

    def spec(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return {d: dim_spec for d, dim_spec in dims.items() if d < value.dim()} or None
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return type(value)(spec(item) for item in value)
        if isinstance(value, dict):
            return {key: spec(item) for key, item in value.items()}
        return None

    try:
        parameters = inspect.signature(model.forward).parameters
        bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = None
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    if bound is None or any(parameters[name].kind in variadic for name in bound):
        return tuple(spec(value) for value in (*args, *kwargs.values()))
    return {name: spec(value) for name, value in bound.items()}


def _export(options: argparse.Namespace) -> int:
    import fx2onnx

    if options.save_weights == "reference" and not options.weights:
        raise ValueError("--save-weights reference references the checkpoint given with --weights: pass --weights")

    _progress(f"loading {options.factory}...")
    model, args, kwargs = _model_and_inputs(options)
    program = fx2onnx.export(
        model.eval(),
        args,
        kwargs=kwargs,
        dynamic_shapes=_dynamic_shapes(options, model, args, kwargs),
        opset_version=options.opset,
        target=options.target,
        fast_math=options.fast_math,
        strict=options.strict,
        extractor=options.extractor,
        verify=options.verify,
        report=options.report or None,
        f=options.output if options.save_weights == "copy" else None,
        external_data=options.external_data or None,
        weights=options.weights,
        progress=True,
    )
    if options.save_weights == "reference":
        program.save(options.output, weights="reference")
    print(program.report.summary())
    for result in program.report.verification or []:
        print(f"  {result}")
    print(f"saved {options.output} ({_size(options.output) / 2**20:.2f} MiB)")
    for path in options.report:
        print(f"report: {path}")
    return 0


# --- inspect ----------------------------------------------------------------------------------------
def _configure_inspect(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an .onnx file")
    parser.add_argument(
        "--target", default="onnxruntime-cpu", help="list the nodes this target has no kernel for ('onnx': the spec)"
    )


def _inspect(options: argparse.Namespace) -> int:
    import onnx_ir as ir

    model = ir.load(options.model)
    graph = model.graph
    print(f"{options.model}: ir_version {model.ir_version}, producer {model.producer_name or '?'}")
    opsets = ", ".join(f"{domain or 'ai.onnx'} {version}" for domain, version in sorted(graph.opset_imports.items()))
    print(f"opsets: {opsets}")
    weights = sum(v.const_value.nbytes for v in graph.initializers.values() if v.const_value is not None)
    print(
        f"size: {_size(options.model) / 2**20:.2f} MiB on disk ({weights / 2**20:.2f} MiB of weights in "
        f"{len(graph.initializers)} initializers)"
    )
    for value in graph.inputs:
        print(f"  input  {value.name}: {_type_text(value)}")
    for value in graph.outputs:
        print(f"  output {value.name}: {_type_text(value)}")
    histogram = collections.Counter(
        f"{node.domain}::{node.op_type}" if node.domain else node.op_type for node in graph.all_nodes()
    )
    print(f"{sum(histogram.values())} nodes, {len(histogram)} op types:")
    for op_type, count in histogram.most_common():
        print(f"  {op_type:<28}{count}")
    _print_kernel_gaps(model, options)
    return 0


def _print_kernel_gaps(model: Any, options: argparse.Namespace) -> None:
    """The nodes the target cannot run, from the legalization pass's kernel table, then a real session."""
    import onnx_ir.passes.common as common_passes

    from fx2onnx import legalize
    from fx2onnx.errors import source_line

    with contextlib.suppress(Exception):  # types of intermediate values, for models saved without them
        common_passes.ShapeInferencePass()(model)
    target = legalize.get_target(options.target)
    refusals = list(legalize.Legalizer(model, target).check())
    if not refusals:
        print(f"every node has a kernel in {options.target} ({target.describe()})")
    else:
        print(f"{len(refusals)} node(s) without a kernel in {options.target} ({target.describe()}):")
        for refusal in refusals:
            node = refusal.node
            bound = ", ".join(f"{k}={v}" for k, v in sorted(refusal.binding.items())) or "no types"
            fx_node = node.metadata_props.get(FX_NODE)
            where = f" from FX node `{fx_node}`" if fx_node else ""
            print(f"  - `{node.name}` ({node.op_type}, {bound}){where}: {refusal.reason}")
            source = source_line(node.metadata_props.get(STACK_TRACE))
            if source:
                print(f"      from: {source}")
    if options.target.startswith("onnxruntime"):
        print(f"ONNX Runtime session: {_session_outcome(options.model)}")


def _session_outcome(path: str) -> str:
    import onnxruntime

    session_options = onnxruntime.SessionOptions()
    session_options.log_severity_level = 3
    try:
        onnxruntime.InferenceSession(path, session_options, providers=["CPUExecutionProvider"])
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"fails to load: {first}"
    return "loads"


def _type_text(value: Any) -> str:
    dtype = value.dtype.name if value.dtype is not None else "?"
    shape = "[" + ", ".join(str(d) for d in value.shape) + "]" if value.shape is not None else "(unknown shape)"
    return f"{dtype} {shape}"


def _size(path: str) -> int:
    """The model file plus the external data files beside it that it names."""
    total = os.path.getsize(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        import onnx

        proto = onnx.load(path, load_external_data=False)
        locations = {
            entry.value
            for tensor in proto.graph.initializer
            for entry in tensor.external_data
            if entry.key == "location"
        }
        total += sum(os.path.getsize(os.path.join(directory, name)) for name in locations)
    except Exception:  # size of the .onnx alone is still worth printing
        pass
    return total


# --- the table ----------------------------------------------------------------------------------------
SUBCOMMANDS: list[Subcommand] = [
    Subcommand(
        "demo", "export the built-in TinyGPT, run it in ONNX Runtime, verify it against eager", _configure_demo, _demo
    ),
    Subcommand(
        "export",
        "export MODULE:FACTORY (a function returning a model [, inputs]) to ONNX",
        _configure_export,
        _export,
    ),
    Subcommand(
        "verify-weights",
        "check a saved model's graph (onnx.checker), external data, and weights against their checkpoint",
        _configure_verify_weights,
        _verify_weights,
    ),
    Subcommand(
        "inspect",
        "print a model's inputs, outputs, op histogram, opsets, size and the nodes the target has no kernel for",
        _configure_inspect,
        _inspect,
    ),
    # `fx2onnx coverage` (issue 5) joins through fx2onnx.coverage.cli: see the module docstring.
]


if __name__ == "__main__":
    raise SystemExit(main())
