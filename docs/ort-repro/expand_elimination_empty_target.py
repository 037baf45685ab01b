"""ONNX Runtime's ExpandElimination removes an Expand to a target dim of 0: Expand(x [1, 1], [1, 0]) is [1, 0] (the
broadcast of 1 and 0 is 0, as numpy's np.broadcast_to and torch's x.expand(1, 0) give), the default session
returns x itself, [1, 1].

What it looks like: the rule (onnxruntime/core/optimizer/expand_elimination.cc) keeps an Expand only where a target
dim differs from the input's and is greater than 1, so a target 0 counts as "kept". It needs the input's shape
known and the node removable: here a Cast before the Expand (as fx2onnx's legalization puts around a bfloat16
Expand, which ONNX Runtime's CPU provider lacks); an Expand straight from a graph input to a graph output stays.

Run: python expand_elimination_empty_target.py  (prints the output shape per optimization level)
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper


def model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["X"], ["X32"], to=TensorProto.FLOAT),
            helper.make_node("Expand", ["X32", "shape"], ["E"]),
            helper.make_node("Cast", ["E"], ["Y"], to=TensorProto.FLOAT16),
        ],
        "expand_elimination_empty_target",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, [1, 1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [1, 0])],
        [helper.make_tensor("shape", TensorProto.INT64, [2], [1, 0])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def main() -> None:
    print("onnxruntime", onnxruntime.__version__)
    x = np.ones((1, 1), np.float16)
    print("numpy broadcast_to", np.broadcast_to(x, (1, 0)).shape)
    for name, level, disabled in (
        ("off", onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL, []),
        ("default", onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, []),
        ("default without ExpandElimination", onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL, ["ExpandElimination"]),
    ):
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = level
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(
            model().SerializeToString(), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled
        )
        print(f"{name:34} {session.run(None, {'X': x})[0].shape}")


if __name__ == "__main__":
    main()
