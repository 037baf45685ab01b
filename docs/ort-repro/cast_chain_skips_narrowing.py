"""ONNX Runtime computes Cast(float32 -> float16) -> Cast(float16 -> uint8) without the float16 rounding.

Even with every graph optimization disabled, the chain gives what a direct float32 -> uint8 conversion gives:
2049.5 rounds to 2050 in float16 (2050 mod 256 = 2, as the two Casts run one at a time give), the chain gives 1;
131008 is inf in float16 (0 as uint8, step by step), the chain gives 131008 mod 256 = 192. The same chain to int32
is right. Found by fx2onnx's fuzzer (seed 19267: float16 `(x + x).to(torch.uint8)`, the Add computed in float32).
Run: python docs/ort-repro/cast_chain_skips_narrowing.py
"""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper


def run(nodes: list, x: np.ndarray, x_type: int, y_type: int) -> np.ndarray:
    graph = helper.make_graph(
        nodes,
        "cast_chain",
        [helper.make_tensor_value_info("x", x_type, [None])],
        [helper.make_tensor_value_info("y", y_type, [None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


x = np.array([2049.5, 131008.0, 3.0], dtype=np.float32)
for target, name in ((TensorProto.INT32, "int32"), (TensorProto.UINT8, "uint8")):
    chain = [
        helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["h"], ["y"], to=target),
    ]
    half = run(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)], x, TensorProto.FLOAT, TensorProto.FLOAT16
    )
    step_by_step = run([helper.make_node("Cast", ["x"], ["y"], to=target)], half, TensorProto.FLOAT16, target)
    print(
        f"float32 -> float16 -> {name}: chained {run(chain, x, TensorProto.FLOAT, target)}, step by step {step_by_step}"
    )
