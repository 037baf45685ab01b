"""ONNX Runtime's int64 ReduceSum and ReduceProd, and its integer Pow, compute through double: exact only up to 2**53.

ReduceSum([2**53 + 1, 0]) gives 2**53 (the smallest case: two elements); a cancelling sum loses a small result
altogether, ReduceSum([2**62, 1, -2**62]) = 0 (int64 arithmetic: 1), and an overflowing one saturates:
ReduceSum([INT64_MAX, 1]) = INT64_MAX where int64 arithmetic (eager's sum) wraps to INT64_MIN.
ReduceProd([2**32 + 1, 2**32 + 1]) gives INT64_MAX where int64 arithmetic wraps to 2**33 + 1 (as eager does);
Pow(3, 40) gives INT64_MIN (saturated) where int64 arithmetic wraps, and Pow(0, -3) gives INT64_MIN (eager: 0).
Optimizations on or off alike.

Run: python integer_reductions_through_double.py
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper


def session(node: onnx.NodeProto, inputs: list[str]) -> onnxruntime.InferenceSession:
    graph = helper.make_graph(
        [node],
        node.op_type,
        [helper.make_tensor_value_info(name, TensorProto.INT64, None) for name in inputs],
        [helper.make_tensor_value_info("Y", TensorProto.INT64, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def main() -> None:
    print(f"onnxruntime {onnxruntime.__version__}")
    reduce_sum = session(helper.make_node("ReduceSum", ["X"], ["Y"], keepdims=0), ["X"])
    for numbers in ([2**53 + 1, 0], [2**62, 1, -(2**62)], [2**62, 2**62, 1, -(2**63)], [2**63 - 1, 1]):
        values = np.array(numbers, np.int64)
        got = reduce_sum.run(None, {"X": values})[0]
        print(f"  ReduceSum({values.tolist()}) = {int(got)}, int64 arithmetic (wrapping): {int(values.sum())}")
    values = np.array([2**32 + 1, 2**32 + 1], np.int64)
    got = session(helper.make_node("ReduceProd", ["X"], ["Y"], keepdims=0), ["X"]).run(None, {"X": values})[0]
    print(f"  ReduceProd({values.tolist()}) = {int(got)}, int64 arithmetic (wrapping): {int(np.prod(values))}")
    power = session(helper.make_node("Pow", ["B", "E"], ["Y"]), ["B", "E"])
    for base, exponent in [(3, 40), (0, -3)]:
        got = power.run(None, {"B": np.array([base], np.int64), "E": np.array([exponent], np.int64)})[0]
        exact = (base**exponent + 2**63) % 2**64 - 2**63 if exponent >= 0 else 0  # int64 wraps
        print(f"  Pow({base}, {exponent}) = {int(got[0])}, int64 arithmetic (wrapping): {exact}")


if __name__ == "__main__":
    main()
