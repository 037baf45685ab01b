"""ONNX Runtime's linear Resize of a 3-D input reads the next channel at weight 0: a NaN or inf there turns a finite
channel into NaN. Resize(x [1, 2, 2], scales [1, 1, 3], mode="linear") of channel 0 = [1, 2] must not depend on
channel 1; with channel 1 = [nan, nan], every value of channel 0 is NaN (onnxruntime 1.32.0).

What it looks like: the CPU kernel computes the 3-D input as a 2-D resize of [N*C, W] whose first axis keeps its
size, and still weighs the next row (here the next channel) by 0: 0 * NaN, or 0 * inf, is NaN. A 4-D input whose
height or width is kept shows the same with the next row. Graph optimizations do not matter: it is the kernel.

Run: python resize_linear_next_channel.py  (prints channel 0 with a finite and with a NaN channel 1)
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper


def model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Resize", ["X", "", "scales"], ["Y"], mode="linear")],
        "resize_linear_next_channel",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2, 6])],
        [helper.make_tensor("scales", TensorProto.FLOAT, [3], [1.0, 1.0, 3.0])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def main() -> None:
    print("onnxruntime", onnxruntime.__version__)
    for name, level in (
        ("off", onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL),
        ("default", onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL),
    ):
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = level
        session = onnxruntime.InferenceSession(model().SerializeToString(), options, providers=["CPUExecutionProvider"])
        for second in (np.array([3.0, 4.0]), np.array([np.nan, np.nan])):
            x = np.stack([np.array([1.0, 2.0]), second])[None].astype(np.float32)
            (y,) = session.run(None, {"X": x})
            print(f"{name:8s} channel 1 = {second}: channel 0 -> {y[0, 0]}")


if __name__ == "__main__":
    main()
