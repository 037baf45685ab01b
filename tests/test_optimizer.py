"""``fx2onnx._finalize.optimizer.optimize`` gives the graph ``onnxscript.optimizer.optimize_ir`` gives.

The same nodes, attributes and initializers; the recorded shapes of intermediate values may differ
(fx2onnx's constant folding reuses the shapes recorded at emission instead of re-running ONNX
inference), so ``value_info`` is left out of the comparison. The rules fx2onnx makes exact
(``x + 0`` etc. only for an exact 0 or 1) cannot fire differently on these models.
"""

from __future__ import annotations

import onnx_ir as ir
import onnxscript.optimizer
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


def _unoptimized(model: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> ir.Model:
    # target="onnx": the unoptimized graph has ops (sequences) ONNX Runtime CPU legalization refuses.
    return fx2onnx.export(model.eval(), args, optimize=False, target="onnx").model


@pytest.mark.parametrize(
    "model, args",
    [(examples.TinyGPT(layers=1), (torch.randint(0, 512, (2, 8)),)), (_TwoSlices(), (torch.randn(2, 6),))],
    ids=["tiny_gpt", "two_slices"],
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
