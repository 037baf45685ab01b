"""Mixture-of-Experts models exported through the grouped-product lowerings (src/fx2onnx/_lowerings/moe.py).

Each grouped product is unrolled over the experts (a Slice, a Gather of the expert's weight and a MatMul per
expert, one Concat). This script shows what that costs: for tiny Mixtral models with 4 to 128 experts, in float32
(transformers' fallback op) and bfloat16 (``aten::_grouped_mm``), it exports the model, checks it against eager,
counts the ONNX nodes per decoder layer and those of the grouped products, and times ONNX Runtime CPU against eager
PyTorch (same inputs, one intra-op thread each, interleaved runs, median).

    python benchmarks/moe_latency.py                              # 4, 32 and 128 experts, float32 and bfloat16
    python benchmarks/moe_latency.py --experts 8 --dtypes float32 --iterations 50 --tokens 256
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
import warnings

import onnxruntime as ort
import torch

import fx2onnx

warnings.filterwarnings("ignore")
FX_TARGET = "pkg.fx2onnx.target"
GROUPED = ("transformers::grouped_mm_fallback", "aten::_grouped_mm")


def mixtral(experts: int, dtype: torch.dtype) -> torch.nn.Module:
    import transformers

    config = transformers.MixtralConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=300,
        max_position_embeddings=512,
        num_local_experts=experts,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(config).eval().to(dtype)


def median_ms(run: object, iterations: int) -> float:
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(experts: int, dtype: torch.dtype, tokens: int, iterations: int) -> dict[str, object]:
    model = mixtral(experts, dtype)
    ids = torch.randint(0, 300, (1, tokens), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    program = fx2onnx.export(model, (), {"input_ids": ids, "use_cache": False})
    export_seconds = time.perf_counter() - start
    verification = program.verify(input_ids=ids, use_cache=False)
    worst = max(r.max_abs_error for r in verification)
    matches = all(r.passed for r in verification)

    graph = program.model.graph
    layers = collections.Counter()
    grouped = 0
    for node in graph:
        namespace = node.metadata_props.get("namespace", "")
        layer = next((part for part in namespace.split(".") if part.isdigit()), None)
        if layer is not None and "layers" in namespace:
            layers[layer] += 1
        grouped += node.metadata_props.get(FX_TARGET) in GROUPED

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # no warnings about the initializers its constant folding leaves unused
    start = time.perf_counter()
    session = ort.InferenceSession(program.model_proto.SerializeToString(), options, ["CPUExecutionProvider"])
    # bfloat16 outputs stay OrtValues (numpy has no bfloat16)
    session_seconds = time.perf_counter() - start
    feeds = {session.get_inputs()[0].name: ort.OrtValue.ortvalue_from_numpy(ids.numpy())}
    torch.set_num_threads(1)
    with torch.no_grad():
        ort_ms, eager_ms = [], []
        for _ in range(3):  # interleaved, so that load on the shared machine hits both alike
            ort_ms.append(median_ms(lambda: session.run_with_ort_values(None, feeds), iterations))
            eager_ms.append(median_ms(lambda: model(input_ids=ids, use_cache=False), iterations))
    return {
        "experts": experts,
        "dtype": str(dtype).removeprefix("torch."),
        "nodes": len(graph),
        "nodes/layer": max(layers.values()) if layers else 0,
        "grouped-product nodes": grouped,
        "export s": round(export_seconds, 1),
        "session s": round(session_seconds, 2),
        "ORT ms": round(min(ort_ms), 2),
        "eager ms": round(min(eager_ms), 2),
        "ORT/eager": round(min(ort_ms) / min(eager_ms), 2),
        "max abs err": worst,
        "matches eager": matches,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", default="4,32,128", help="comma-separated expert counts")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per forward (batch 1)")
    parser.add_argument("--iterations", type=int, default=20, help="timed runs per round (3 rounds)")
    args = parser.parse_args(argv)
    for index, (experts, dtype) in enumerate((e, d) for e in args.experts.split(",") for d in args.dtypes.split(",")):
        row = measure(int(experts), getattr(torch, dtype), args.tokens, args.iterations)
        if index == 0:
            print(" | ".join(row))
        print(" | ".join(str(value) for value in row.values()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
