"""ONNX Runtime's Unique treats a NaN as equal to every value: NaNs merge into the entry they meet, and a NaN met
first takes in every later value ([nan, nan, nan, 1, 1, 2] -> [nan] counted 6). Each NaN is distinct (NaN != NaN):
numpy's np.unique and torch.unique keep one entry per NaN.

What it looks like: values kept in an ordered map by `<`, under which a NaN is neither less nor greater than any
key, so it is "equivalent" to whichever key it is compared with. The kernel itself: optimizations off too, sorted
or not.

Run: python unique_nan.py  (prints the outputs beside numpy's)
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper


def model(sort: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Unique", ["X"], ["Y", "indices", "inverse", "counts"], sorted=sort)],
        "unique_nan",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [6])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("inverse", TensorProto.INT64, [6]),
            helper.make_tensor_value_info("counts", TensorProto.INT64, [None]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def main() -> None:
    print("onnxruntime", onnxruntime.__version__)
    for x in (
        np.array([2.0, np.nan, 1.0, np.nan, 2.0, np.nan], np.float32),
        np.array([np.nan, np.nan, np.nan, 1.0, 1.0, 2.0], np.float32),
    ):
        values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True, equal_nan=False)
        print(f"input {x}\n  numpy            values {values} inverse {inverse} counts {counts}")
        for sort in (1, 0):
            for name, level in (
                ("off", onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL),
                ("default", onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL),
            ):
                options = onnxruntime.SessionOptions()
                options.graph_optimization_level = level
                proto = model(sort).SerializeToString()
                session = onnxruntime.InferenceSession(proto, options, providers=["CPUExecutionProvider"])
                got, _, got_inverse, got_counts = session.run(None, {"X": x})
                print(f"  sorted={sort} {name:8} values {got} inverse {got_inverse} counts {got_counts}")


if __name__ == "__main__":
    main()
