"""ONNX Runtime's Where returns +0.0 where it should pick a -0.0 from its first branch (X), and its NotWhereFusion
swaps the branches of Where(Not(c), x, y), moving a -0.0 into that first branch.

The CPU kernel (onnxruntime/core/providers/cpu/tensor/where_op.cc) computes Where in three passes:
X_selection = c ? X : 0, Y_selection = !c ? Y : 0, then output = X_selection != 0 ? X_selection : Y_selection.
-0.0 != 0 is false, so a -0.0 selected from X is replaced by Y_selection's +0.0. A -0.0 from Y is kept. This is
the kernel (optimizations off too); NotWhereFusion (level 1, ORT_ENABLE_BASIC) then makes it reachable from a graph
that keeps its -0.0 in Y.

Run: python where_negative_zero.py  (prints the sign bits of the outputs)
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

LEVELS = {
    "off": onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "default": onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def model(nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "where_negative_zero",
        [
            helper.make_tensor_value_info("C", TensorProto.BOOL, [4]),
            helper.make_tensor_value_info("X", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def run(proto: onnx.ModelProto, level: onnxruntime.GraphOptimizationLevel, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = level
    session = onnxruntime.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def main() -> None:
    condition = np.array([True, True, False, False])
    x = np.array([-0.0, 0.0, -0.0, -0.0], np.float32)
    y = np.array([0.0, 0.0, -0.0, -0.0], np.float32)
    # expected: positions 0 (X = -0.0), 2 and 3 (Y = -0.0) have the sign bit set
    print(f"onnxruntime {onnxruntime.__version__}; expected sign bits {np.signbit(np.where(condition, x, y))}")
    plain = model([helper.make_node("Where", ["C", "X", "Y"], ["Z"])])
    for name, level in LEVELS.items():
        signs = np.signbit(run(plain, level, {"C": condition, "X": x, "Y": y}))
        print(f"  Where(C, X, Y), optimizations {name:7}: sign bits {signs}")
    # Where(Not(C'), X, Y) with C' = !C: the same selection, the -0.0s of Y in the second branch
    negated = model([helper.make_node("Not", ["C"], ["NC"]), helper.make_node("Where", ["NC", "Y", "X"], ["Z"])])
    feeds = {"C": condition, "X": np.full(4, -0.0, np.float32), "Y": np.zeros(4, np.float32)}
    # expected: Where(!C, Y, X) picks X's -0.0 from its second branch where C is true (positions 0, 1)
    for name, level in LEVELS.items():
        print(f"  Where(Not(C), Y, X), optimizations {name:7}: sign bits {np.signbit(run(negated, level, feeds))}")


if __name__ == "__main__":
    main()
