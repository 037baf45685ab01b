"""Emit makes no node that onnxscript's optimizer would only fold away (fold at emit, `_emit/folding.py`): eval
dropout, the Shape of a static shape, a split into a static number of parts, nodes of constants, the transpose of a
weight. The graphs are read with ``optimize=False``, which is what emit made (then legalized)."""

from __future__ import annotations

import collections
import os

import pytest
import torch
from safetensors.torch import save_file

import fx2onnx
from fx2onnx._weights import CheckpointTensor


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(12, 24)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.drop(self.proj(x)).split(8, dim=-1)  # torchlib: SplitToSequence + 3 SequenceAt
        first, rest = x.split([5, 7], dim=-1)
        positions = torch.arange(x.shape[1], dtype=torch.float32)  # static: Range, CastLike of constants
        scale = x.new_ones(x.shape[-1]).sum()  # Shape of a static shape, ConstantOfShape, ...
        return q * k + v + positions[:, None] + first.sum(-1, keepdim=True) * rest.mean(-1, keepdim=True) / scale


def _op_types(program: fx2onnx.ONNXProgram) -> collections.Counter[str]:
    return collections.Counter(node.op_type for node in program.model.graph)


def test_emit_leaves_nothing_the_optimizer_folds(check) -> None:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 6, 12)
    emitted = check(model, (x,), optimize=False)
    ops = _op_types(emitted)
    for folded in ("Dropout", "SplitToSequence", "SequenceAt", "Shape", "Range", "CastLike", "Transpose"):
        assert ops[folded] == 0, (folded, ops)
    assert ops["Split"] == 2, ops


class TwoTables(torch.nn.Module):
    """The same op on two constants of the same shape and dtype, larger than a trace key's bytes (64 elements): the
    second call must not replay the first one's folded constant."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = torch.arange(100)
        second = torch.arange(100) * 7 - 300
        return x + first.unsqueeze(0).float() + second.unsqueeze(0).float() * 2


def test_folding_a_large_constant_is_not_replayed_for_another(check) -> None:
    program = check(TwoTables(), (torch.randn(3, 100),), optimize=False)
    assert _op_types(program)["Unsqueeze"] == 0


def _layers() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Embedding(50, 16), torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8)
    )


@pytest.mark.parametrize("lazy", [True, False])
def test_transposed_weights_from_a_checkpoint_stay_lazy(tmp_path: os.PathLike[str], lazy: bool) -> None:
    torch.manual_seed(3)
    trained = _layers().eval()
    path = str(tmp_path / "weights.safetensors")
    save_file(trained.state_dict(), path)
    if lazy:
        with torch.device("meta"):
            model = _layers().eval()
    else:  # a model in memory whose weights the checkpoint replaces: not transposed at emit from its own
        model = _layers().eval()
    x = torch.tensor([[0, 49, 3, 7]])
    program = fx2onnx.export(model, (x,), weights=path)
    tensors = [value.const_value for value in program.model.graph.initializers.values()]
    transposed = [t for t in tensors if isinstance(t, CheckpointTensor) and t.permutation]
    assert len(transposed) == 2, tensors  # both weights, permuted unread
    assert _op_types(program)["Transpose"] == 0
    with torch.no_grad():
        torch.testing.assert_close(program(x)[0], trained(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("data_shape", "index_rows", "dtype"),
    [((169, 3), [[0], [168], [-1], [5]], "float32"), ((4, 5, 6), [[0, 4], [-4, -1], [3, 2]], "int64")],
)
def test_gather_nd_is_folded_as_onnx_computes_it(data_shape: tuple[int, ...], index_rows: list, dtype: str) -> None:
    """GatherND of constants (Swin's relative position bias: a weight indexed by a buffer) is folded with numpy's
    indexing, not the reference evaluator's loop over the index rows: the same values, negative indices included."""
    import numpy as np
    import onnx_ir as ir
    from onnxscript.optimizer import _constant_folding

    from fx2onnx._emit import folding

    data = np.arange(np.prod(data_shape), dtype=dtype).reshape(data_shape)
    indices = np.array(index_rows, dtype=np.int64)
    for shaped in (indices, indices.reshape(2, -1, indices.shape[-1]) if len(index_rows) % 2 == 0 else indices):
        dtypes = [ir.DataType.from_numpy(data.dtype), ir.DataType.INT64]
        folded = folding.evaluate("GatherND", 18, [data, shaped], dtypes, [])
        expected = _constant_folding._reference_evaluator.evaluate("", "GatherND", 18, data, shaped)
        assert folded is not None and folded.dtype == expected.dtype and folded.shape == expected.shape
        np.testing.assert_array_equal(folded, expected)
    assert folding._gather_nd([data, indices], {"batch_dims": 1}) is None  # left to the reference evaluator
