"""ONNX Runtime's NoopElimination removes Add(x, +0.0) as a no-op; for x = -0.0 it is not one (-0.0 + 0.0 = +0.0).

NoopElimination (onnxruntime/core/optimizer/noop_elimination.cc, level 1: ORT_ENABLE_BASIC and above) removes an
Add/Sub whose other operand is a constant of zeros (and Mul/Div by ones), comparing the constant's value with 0, so
Add(x, +0.0), Add(x, [+0.0]) and Sub(x, -0.0) all go. It applies when x comes from a node (an Add fed by a graph
input is kept). The result's -0.0 then stays -0.0: here 1 / (sum(x) + 0.0) is -inf instead of +inf. (Neither a
-0.0 constant merged with a +0.0 one nor any other constant pass was found to change a zero's sign: the
"merged constant" seen from fx2onnx was this elimination, and onnxscript's own x + 0 rule, which fx2onnx's
optimizer now applies to x + -0.0 and x - +0.0 only.)

Run: python noop_elimination_negative_zero.py
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper


def build(op_type: str, constant: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["X"], ["S"], keepdims=1),
            helper.make_node(op_type, ["S", "K"], ["A"]),
            helper.make_node("Reciprocal", ["A"], ["Y"]),
        ],
        "noop_negative_zero",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(constant, "K")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def run(model: onnx.ModelProto, level: onnxruntime.GraphOptimizationLevel, x: np.ndarray) -> np.ndarray:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = level
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"X": x})[0]


def main() -> None:
    x = np.array([-0.0, -0.0], np.float32)  # ReduceSum gives -0.0
    print(f"onnxruntime {onnxruntime.__version__}: 1 / (sum([-0.0, -0.0]) op k), expected +inf")
    for op_type, constant in [
        ("Add", np.array(0.0, np.float32)),
        ("Add", np.array([0.0], np.float32)),
        ("Sub", np.array(-0.0, np.float32)),
    ]:
        model = build(op_type, constant)
        off = run(model, onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL, x)
        default = run(model, onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, x)
        print(
            f"  {op_type}(., {constant.tolist()}): optimizations off {off.tolist()}, default session {default.tolist()}"
        )


if __name__ == "__main__":
    main()
