"""ONNX Runtime's float64 Sin and Cos are accurate to about epsilon times |x|, not to the result, near their zeros.

At fl(k * pi) (k = 1..4) float64 Sin returns +-0 where the correctly rounded sin (numpy, eager) is about
+-1.2e-16 * k (fl(pi) is not pi); Cos likewise at fl((k - 1/2) * pi). Next to those points the error is still
hundreds of thousands of ulps of the result (about epsilon times |x| absolute); far from them 3 ulps. float32 Sin
and Cos give numpy's values at the same points. Optimizations off (it is the kernel).

Run: python float64_sin_cos_near_zeros.py
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime
from onnx import TensorProto, helper


def session(op_type: str, dtype: int) -> onnxruntime.InferenceSession:
    graph = helper.make_graph(
        [helper.make_node(op_type, ["X"], ["Y"])],
        op_type.lower(),
        [helper.make_tensor_value_info("X", dtype, [None])],
        [helper.make_tensor_value_info("Y", dtype, [None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    k = np.arange(1, 5)
    for op_type, points, exact in (("Sin", k * math.pi, np.sin), ("Cos", (k - 0.5) * math.pi, np.cos)):
        for dtype, numpy_dtype in ((TensorProto.DOUBLE, np.float64), (TensorProto.FLOAT, np.float32)):
            x = points.astype(numpy_dtype)
            (got,) = session(op_type, dtype).run(None, {"X": x})
            print(f"{op_type} {numpy_dtype.__name__}: onnxruntime {got.tolist()}, numpy {exact(x).tolist()}")
    x = np.random.default_rng(0).uniform(-10.0, 10.0, 200_000)
    (got,) = session("Sin", TensorProto.DOUBLE).run(None, {"X": x})
    ulps = np.abs(got - np.sin(x)) / np.spacing(np.abs(np.sin(x)))
    worst = int(ulps.argmax())
    print(f"Sin float64 over 200k x in [-10, 10]: at most {ulps.max():.0f} ulps, at x = {x[worst]!r}: {got[worst]!r}")
    relative = abs(got[worst] - np.sin(x[worst])) / (2**-52 * abs(x[worst]))
    print(f"  (numpy {np.sin(x[worst])!r}; |error| / (epsilon |x|) = {relative:.2f})")


if __name__ == "__main__":
    main()
