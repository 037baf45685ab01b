"""ONNX Runtime's MatMulScaleFusion folds a division by zero into an infinite alpha, then refuses the session.

(X @ W) / 0.0: the fusion folds the Div into com.microsoft.FusedMatMul with alpha = 1 / 0 = inf, and the
FusedMatMul kernel requires a finite alpha ("FusedMatMul alpha attribute must be finite, got: inf"), so a default
session cannot be created. With optimizations off the model loads and gives +-inf/NaN, as numpy and eager do.
The same happens for a Mul by a constant inf or NaN.

Run: python matmul_scale_fusion_infinite_alpha.py
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
            helper.make_node("Div", ["product", "zero"], ["Y"]),
        ],
        "matmul_divided_by_zero",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [3, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [3, 3])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.array(0.0), "zero")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def session(model: onnx.ModelProto, level: onnxruntime.GraphOptimizationLevel) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = level
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    model = build()
    x = np.random.default_rng(1).uniform(-2, 2, size=(3, 5))
    print(f"onnxruntime {onnxruntime.__version__}")
    unoptimized = session(model, onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL).run(None, {"X": x})[0]
    print(f"  optimizations off: loads, {unoptimized.ravel()[:3]} ...")
    try:
        session(model, onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL)
        print("  default session:   loads")
    except Exception as error:  # the defect
        print(f"  default session:   refused: {str(error).splitlines()[0][:160]}")


if __name__ == "__main__":
    main()
