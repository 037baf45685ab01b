"""ONNX Runtime fuses the tanh form of GELU on a 0-d tensor into a FastGelu that refuses 0-d inputs at run time.

FastGeluFusion (onnxruntime/core/optimizer/fast_gelu_fusion.cc, ORT_ENABLE_EXTENDED and above) rewrites
x * 0.5 * (1 + tanh(sqrt(2/pi) * x * (1 + 0.044715 * x * x))) into com.microsoft.FastGelu without looking at x's
rank, and the FastGelu kernel then fails every run of a 0-d x: "Input 0 is expected to have 1 or more dimensions,
got 0". With optimizations off the model runs; a 1-element [1] input runs in both. Here x comes from a Cast
(float16 computed in float32), as fx2onnx's float16 gelu(x, approximate="tanh") does (fuzz seed 40001174:
gelu(sinc(int64 scalar))).

Run: python fast_gelu_zero_dimensional.py
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper


def model(shape: list[int]) -> bytes:
    def constant(name: str, value: float) -> object:
        return numpy_helper.from_array(np.array(value, np.float32), name)

    nodes = [
        helper.make_node("Cast", ["X"], ["x"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "half"], ["half_x"]),
        helper.make_node("Mul", ["x", "c"], ["cx"]),
        helper.make_node("Mul", ["cx", "x"], ["cxx"]),
        helper.make_node("Add", ["cxx", "one"], ["poly"]),
        helper.make_node("Mul", ["x", "k"], ["kx"]),
        helper.make_node("Mul", ["kx", "poly"], ["inner"]),
        helper.make_node("Tanh", ["inner"], ["t"]),
        helper.make_node("Add", ["t", "one"], ["one_plus"]),
        helper.make_node("Mul", ["half_x", "one_plus"], ["y"]),
        helper.make_node("Cast", ["y"], ["Y"], to=TensorProto.FLOAT16),
    ]
    graph = helper.make_graph(
        nodes,
        "fast_gelu",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, shape)],
        [constant("half", 0.5), constant("c", 0.044715), constant("one", 1.0), constant("k", math.sqrt(2 / math.pi))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8).SerializeToString()


def main() -> None:
    print(f"onnxruntime {onnxruntime.__version__}: gelu(0.7, approximate='tanh') = 0.5306")
    for shape in ([], [1]):
        for level in (
            onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL,
            onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL,
        ):
            options = onnxruntime.SessionOptions()
            options.graph_optimization_level = level
            session = onnxruntime.InferenceSession(model(shape), options, providers=["CPUExecutionProvider"])
            try:
                result = session.run(None, {"X": np.full(shape, 0.7, np.float16)})[0].tolist()
            except Exception as error:  # the defect: the run fails
                result = f"fails: {str(error).splitlines()[0][-80:]}"
            print(f"  shape {shape}, {level.name}: {result}")


if __name__ == "__main__":
    main()
