"""Constant folding in finalize never changes a value: what it computes from constants (buffers, aranges) equals eager.

The optimizer's fold evaluates nodes with ONNX's reference evaluator (numpy), which computes some ops unlike eager and
ONNX Runtime: a float16 reduction in float16 (eager and ONNX Runtime, after legalization, in float32), LogSoftmax as
log(softmax), exp and cos rounded by another library. Each model here computes such a subgraph from its buffers only,
so the whole subgraph is a constant the fold could compute (finalize/optimizer.py: ``_EXACT_FOLDS``, ``_TORCH_FOLDS``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_exports_and_matches, assert_rounds_like_eager


class _FromBuffers(torch.nn.Module):
    """`function` of constant buffers, and the input plus one (a graph input, so the model has one)."""

    def __init__(self, function: Callable[..., torch.Tensor], *buffers: torch.Tensor) -> None:
        super().__init__()
        self.function = function
        for index, buffer in enumerate(buffers):
            self.register_buffer(f"b{index}", buffer)
        self.count = len(buffers)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.function(*(getattr(self, f"b{index}") for index in range(self.count))), x + 1


_HALF_RAMP = torch.linspace(0, 60000, 5000).to(torch.float16)  # sums past float16's 65504

WRONG_FOLDS = {
    # ReduceMean of float16 folded in float16: inf (eager, and ONNX Runtime after legalization, sum in float32: 30000).
    "float16_mean": (lambda b: b.mean(), _HALF_RAMP),
    "float16_mse_loss": (lambda b: F.mse_loss(b, b / 2), torch.linspace(0, 100, 5000).to(torch.float16)),
    # InstanceNormalization of float16 folded in float16: every output 0 (eager about -1.73 to 1.73).
    "float16_instance_norm": (
        lambda b: F.instance_norm(b),
        torch.linspace(0, 600, 2000).to(torch.float16).reshape(1, 2, 1000),
    ),
    "float16_group_norm": (
        lambda b: F.group_norm(b, 2),
        torch.linspace(0, 600, 2000).to(torch.float16).reshape(1, 4, 500),
    ),
    # The reference LogSoftmax is log(softmax): -inf where eager gives x - max - log(sum(exp(x - max))) = -2e30.
    "log_softmax_wide_row": (lambda b: b.log_softmax(-1), torch.tensor([[1e30, -1e30, 0.0], [1.0, 2.0, 3.0]])),
}


@pytest.mark.parametrize("name", list(WRONG_FOLDS))
def test_a_constant_subgraph_folds_to_eager_value(name: str) -> None:
    function, *buffers = WRONG_FOLDS[name]
    assert_exports_and_matches(_FromBuffers(function, *buffers), (torch.zeros(3),))


# numpy's float32 exp(88.7) is 3.32597707e38, torch's (eager's) 3.32597686e38: one ulp apart.
ELEMENTWISE = {
    "exp": (torch.exp, torch.tensor([88.7, -103.0, -87.0, 0.5, float("inf"), float("-inf"), float("nan")])),
    "rotary_cos": (
        lambda b: torch.outer(torch.arange(128).float(), b).cos(),
        1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64)),
    ),
    "rotary_sin_float16": (
        lambda b: torch.outer(torch.arange(128).float(), b).sin().half(),
        1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64)),
    ),
    # More elements than one call of torch's takes on the calling thread (_CHUNK), not a multiple of a vector.
    "exp_5001": (torch.exp, torch.linspace(-100, 88, 5001)),
    "sigmoid_tail": (torch.sigmoid, torch.tensor([-100.0, -90.0, -88.0, -20.0, 100.0])),
    "log_bfloat16": (torch.log, torch.tensor([0.0, 1e-3, 3.0, 1e30]).to(torch.bfloat16)),
    # ALiBi's slopes (Bloom, MPT): a power of constants.
    "alibi_slopes": (lambda b: torch.pow(b, torch.arange(1, 9, dtype=torch.int32)), torch.tensor(2 ** (-8 / 8))),
}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_a_folded_elementwise_function_is_eager_bit_for_bit(name: str) -> None:
    """Exp, Log, Sin, Cos, Sigmoid... of constants are folded by torch's own kernels: eager's values exactly (neither
    numpy's nor ONNX Runtime's, which round elsewhere), and no node is left to compute them."""
    function, buffer = ELEMENTWISE[name]
    model, args = _FromBuffers(function, buffer).eval(), (torch.zeros(3),)
    program = assert_exports_and_matches(model, args)
    assert_rounds_like_eager(program, model, args)
    op_types = {node.op_type for node in program.model.graph}
    assert not op_types & {"Exp", "Log", "Sin", "Cos", "Sigmoid", "Pow"}, op_types
