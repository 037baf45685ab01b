"""ONNX Runtime's MatMulIntegerToFloatFusion changes the results of MatMulInteger -> Cast -> Mul -> Add.

The graph is a dynamically quantized linear layer as PyTorch computes it: an int32 accumulator from
MatMulInteger (uint8 operands, zero points 128), converted to float, times a per-row activation scale
([M, 1]) multiplied by a scalar weight scale, plus a bias. With graph optimizations on (the default), ONNX
Runtime fuses the four nodes into com.microsoft.MatMulIntegerToFloat, whose kernel adds the bias *before* it
applies a non-scalar A scale: it returns a_scale * (acc * b_scale + bias) instead of
acc * (a_scale * b_scale) + bias. Without a bias, the result is still rounded differently
((acc * b_scale) * a_scale, two roundings, instead of acc * (a_scale * b_scale)).

Run: python matmul_integer_to_float.py  (prints the largest difference between the two sessions)
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

M, K, N = 4, 16, 8


def build(with_bias: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weight = rng.integers(0, 256, size=(K, N), dtype=np.uint8)
    initializers = [
        numpy_helper.from_array(weight, "B"),
        numpy_helper.from_array(np.array(128, np.uint8), "zero_point"),
        numpy_helper.from_array(np.array(0.0123, np.float32), "b_scale"),
    ]
    nodes = [
        helper.make_node("MatMulInteger", ["A", "B", "zero_point", "zero_point"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["acc_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["a_scale", "b_scale"], ["scale"]),  # per-row scale, [M, 1]
        helper.make_node("Mul", ["acc_float", "scale"], ["scaled" if with_bias else "Y"]),
    ]
    if with_bias:
        initializers.append(numpy_helper.from_array(np.linspace(-1, 1, N, dtype=np.float32), "bias"))
        nodes.append(helper.make_node("Add", ["scaled", "bias"], ["Y"]))
    graph = helper.make_graph(
        nodes,
        "dynamic_quantized_linear",
        [
            helper.make_tensor_value_info("A", TensorProto.UINT8, [M, K]),
            helper.make_tensor_value_info("a_scale", TensorProto.FLOAT, [M, 1]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [M, N])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def run(model: onnx.ModelProto, level: onnxruntime.GraphOptimizationLevel, feed: dict[str, np.ndarray]) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = level
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def main() -> None:
    rng = np.random.default_rng(1)
    feed = {
        "A": rng.integers(0, 256, size=(M, K), dtype=np.uint8),
        "a_scale": np.array([[0.001], [0.1], [1.0], [7.3]], np.float32),
    }
    print(f"onnxruntime {onnxruntime.__version__}")
    for with_bias in (True, False):
        model = build(with_bias)
        unoptimized = run(model, onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL, feed)
        optimized = run(model, onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, feed)
        # numpy, step by step as the graph says
        weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        acc = (feed["A"].astype(np.int32) - 128) @ (weights["B"].astype(np.int32) - 128)
        expected = acc.astype(np.float32) * (feed["a_scale"] * weights["b_scale"])
        if with_bias:
            expected = expected + weights["bias"]
        print(f"with bias: {with_bias}")
        print(f"  numpy == unoptimized: {np.array_equal(expected, unoptimized)}")
        print(f"  row 0, expected : {expected[0, :4]}")
        print(f"  row 0, optimized: {optimized[0, :4]}")
        print(f"  max |optimized - unoptimized| = {np.abs(optimized - unoptimized).max():.6g}")
        print(f"  elements that differ: {(optimized != unoptimized).sum()} of {optimized.size}")


if __name__ == "__main__":
    main()
