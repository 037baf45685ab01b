"""ONNX Runtime's MatMulScaleFusion rounds a float64 scale to float32 (fixed in 1.32.0).

(X @ W) * 0.1 in float64: the fusion folds the Mul into com.microsoft.FusedMatMul's `alpha`, a float32
attribute, so the product is scaled by 0.10000000149011612 instead of 0.1 (3e-8 relative error in a float64
result, whose rounding noise is 1e-16). ONNX Runtime 1.32.0 fuses only when float32 holds the scale exactly.

Run: python matmul_scale_fusion_float64.py  (prints the largest relative difference between the two sessions)
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper


def build() -> onnx.ModelProto:
    weight = np.random.default_rng(0).uniform(-2, 2, size=(5, 3))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["product"]),
            helper.make_node("Mul", ["product", "scale"], ["Y"]),
        ],
        "scaled_matmul_float64",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [3, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [3, 3])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.array(0.1), "scale")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def run(model: onnx.ModelProto, level: onnxruntime.GraphOptimizationLevel, x: np.ndarray) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = level
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"X": x})[0]


def main() -> None:
    model = build()
    x = np.random.default_rng(1).uniform(-2, 2, size=(3, 5))
    expected = (x @ numpy_helper.to_array(model.graph.initializer[0])) * 0.1
    unoptimized = run(model, onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL, x)
    optimized = run(model, onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, x)
    print(f"onnxruntime {onnxruntime.__version__}")
    print(f"  max relative error, optimizations off: {np.abs((unoptimized - expected) / expected).max():.3g}")
    print(f"  max relative error, default session:   {np.abs((optimized - expected) / expected).max():.3g}")


if __name__ == "__main__":
    main()
