"""ONNX Runtime's float32 Sigmoid and QuickGelu (MLAS's logistic) lose their relative accuracy below about -2.

The CPU kernels of Sigmoid, and of com.microsoft.QuickGelu, which a default session makes of x * Sigmoid(x)
(QuickGeluFusion), evaluate MLAS's logistic approximation, whose error is absolute (about 6e-8, half of float32's
epsilon) rather than relative: 9 ulps off at -2, 29k ulps (0.25%) at -10, 17-28% at -15, and from about -15.8 down
noise of that absolute size: 0 at some x (from -15.8; all x below -18), up to 7 times the exact value at others,
where 1 / (1 + exp(-x)) (numpy in float64, eager in float32) is 1.1e-7 at -16 and 2.1e-9 at -20. float64 Sigmoid
is 0 below -36.7 (exact: 8.5e-17 at -37). x * Sigmoid(x) stays within float32's epsilon times |x| of silu (1.38e-7
|x| at most over 2.5M float32 in [-25, 0]), so a SiLU's error is invisible next to values of x's size.

Run: python mlas_logistic_tail.py
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper


def session(nodes: list[onnx.NodeProto], dtype: int, level: onnxruntime.GraphOptimizationLevel):
    graph = helper.make_graph(
        nodes,
        "logistic",
        [helper.make_tensor_value_info("X", dtype, [None])],
        [helper.make_tensor_value_info("Y", dtype, [None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = ""
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    default, off = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.array([-2.0, -10.0, -15.0, -16.0, -16.78, -17.0, -20.0], np.float32)
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    sigmoid = [helper.make_node("Sigmoid", ["X"], ["Y"])]
    # x * Sigmoid(x) with x from a node: the default session fuses it into QuickGelu(alpha=1).
    silu = [
        helper.make_node("Neg", ["X"], ["N"]),
        helper.make_node("Neg", ["N"], ["P"]),
        helper.make_node("Sigmoid", ["P"], ["S"]),
        helper.make_node("Mul", ["P", "S"], ["Y"]),
    ]
    print(f"onnxruntime {onnxruntime.__version__}, float32")
    print(f"  x:                        {x.tolist()}")
    print(f"  1 / (1 + exp(-x)), exact: {[float(f'{v:.4g}') for v in exact]}")
    got = session(sigmoid, TensorProto.FLOAT, off).run(None, {"X": x})[0]
    print(f"  Sigmoid (any level):      {[float(f'{v:.4g}') for v in got]}")
    print(f"  relative error:           {[float(f'{v:.2g}') for v in np.abs(got - exact) / exact]}")
    fused = session(silu, TensorProto.FLOAT, default)
    got = fused.run(None, {"X": x})[0]
    print(f"  x * Sigmoid(x), default session (QuickGelu): {[float(f'{v:.4g}') for v in got]}")
    print(f"  x * exact:                                    {[float(f'{v:.4g}') for v in x * exact]}")
    print(
        f"  |error| / |x| (float32 epsilon 1.19e-7):      {[float(f'{v:.2g}') for v in np.abs(got - x * exact) / -x]}"
    )
    x64 = np.array([-30.0, -36.0, -37.0, -100.0], np.float64)
    got = session(sigmoid, TensorProto.DOUBLE, off).run(None, {"X": x64})[0]
    print(f"float64 Sigmoid of {x64.tolist()}: {got.tolist()}, exact {(1 / (1 + np.exp(-x64))).tolist()}")


if __name__ == "__main__":
    main()
