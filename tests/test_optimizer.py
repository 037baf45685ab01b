"""``fx2onnx._finalize.optimizer.optimize`` gives the graph ``onnxscript.optimizer.optimize_ir`` gives.

The same nodes, attributes and initializers; the recorded shapes of intermediate values may differ
(fx2onnx's constant folding reuses the shapes recorded at emission instead of re-running ONNX
inference), so ``value_info`` is left out of the comparison. The rules fx2onnx makes exact
(``x + 0`` etc. only for an exact 0 or 1) cannot fire differently on these models.
"""

from __future__ import annotations

import onnx_ir as ir
import onnxscript.optimizer
import onnxscript.rewriter
import pytest
import torch

import fx2onnx
from fx2onnx import examples
from fx2onnx._finalize import optimizer


class _TwoSlices(torch.nn.Module):
    """Two slices of one value: the optimizer then runs onnxscript's SlicesSplit rule too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x)
        return y[..., :3] * 2 + y[..., 3:6] * 3  # the halves, as the rule requires


class _ReshapeTwice(torch.nn.Module):
    """Two reshapes back to the input's shape: the rewrite merges them into one Reshape, which only the second
    round of constant folding turns into nothing (a Reshape to the input's own shape)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).reshape(3, 4).reshape(2, 6) * 2


def _unoptimized(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> ir.Model:
    # target="onnx": the unoptimized graph has ops (sequences) ONNX Runtime CPU legalization refuses.
    return fx2onnx.export(model.eval(), args, optimize=False, target="onnx").model


@pytest.mark.parametrize(
    "model, args",
    [
        (examples.TinyGPT(layers=1), (torch.randint(0, 512, (2, 8)),)),
        (_TwoSlices(), (torch.randn(2, 6),)),
        (_ReshapeTwice(), (torch.randn(2, 6),)),
    ],
    ids=["tiny_gpt", "two_slices", "reshape_twice"],
)
def test_same_model_as_onnxscript_optimize_ir(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    torch.manual_seed(0)
    proto = ir.to_proto(_unoptimized(model, args))
    ours, theirs = ir.from_proto(proto), ir.from_proto(proto)
    optimizer.optimize(ours)
    onnxscript.optimizer.optimize_ir(theirs)
    ours_proto, theirs_proto = ir.to_proto(ours), ir.to_proto(theirs)
    for graph in (ours_proto.graph, theirs_proto.graph):
        del graph.value_info[:]
    assert len(ours_proto.graph.node) > 0
    assert ours_proto.SerializeToString(deterministic=True) == theirs_proto.SerializeToString(deterministic=True)


class _CountingFold(optimizer._FoldConstants):
    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        self.runs += 1
        return super().call(model)


@pytest.mark.parametrize("model, folds", [(_ReshapeTwice(), 2), (torch.nn.Sequential(torch.nn.ReLU()), 1)])
def test_folds_again_only_after_a_rewrite(model: torch.nn.Module, folds: int) -> None:
    """Folding reaches its fixed point in one pass: a second one runs only when the rewrite changed the graph."""
    unoptimized = _unoptimized(model, (torch.randn(2, 6),))
    rules = optimizer._with_exact_no_ops(onnxscript.rewriter._DEFAULT_REWRITE_RULES)
    fold = _CountingFold()
    optimizer._FoldAndRewrite(fold, optimizer._Rewrite(rules), iterations=2)(unoptimized)
    assert fold.runs == folds
