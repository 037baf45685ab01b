"""ONNX Runtime's float32 MaxPool skips a NaN in its window ([1, nan] -> 1, [nan, 2] -> 2) and gives the lowest
finite float32 (-3.4028235e38) for a window holding only -inf; float64 skips a NaN that follows a number
([1, nan] -> 1) and keeps one that comes first ([nan, 2] -> nan).

ONNX's MaxPool is the maximum of each window; numpy's, torch's and the ONNX reference's maxima propagate a NaN, and
the maximum of -infs is -inf. What it looks like: the float32 kernel starts each window at the lowest finite float
and keeps `x > y ? x : y`, which a NaN never wins and -inf never beats. The kernel itself: optimizations off too.

Run: python maxpool_nan_and_negative_infinity.py  (prints the outputs beside numpy's)
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper


def model(elem_type: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["X"], ["Y"], kernel_shape=[2], strides=[2])],
        "maxpool_nan",
        [helper.make_tensor_value_info("X", elem_type, [1, 1, 6])],
        [helper.make_tensor_value_info("Y", elem_type, [1, 1, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def main() -> None:
    print("onnxruntime", onnxruntime.__version__)
    for dtype, elem_type in ((np.float32, TensorProto.FLOAT), (np.float64, TensorProto.DOUBLE)):
        x = np.array([[[1.0, np.nan, np.nan, 2.0, -np.inf, -np.inf]]], dtype)  # windows [1, nan] [nan, 2] [-inf, -inf]
        expected = x.reshape(1, 1, 3, 2).max(axis=-1)
        for name, level in (
            ("off", onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL),
            ("default", onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL),
        ):
            options = onnxruntime.SessionOptions()
            options.graph_optimization_level = level
            session = onnxruntime.InferenceSession(
                model(elem_type).SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
            got = session.run(None, {"X": x})[0]
            print(f"{np.dtype(dtype).name:8} {name:8} got {got.ravel()} expected {expected.ravel()}")


if __name__ == "__main__":
    main()
