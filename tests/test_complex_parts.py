"""Complex ops rewritten as real ops on their real and imaginary parts (passes/complex_parts.py).

Each had no complex lowering and failed the export (UnsupportedOperatorError, or a decomposition into prims that
nothing lowers); each now runs in ONNX Runtime and matches eager.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import fx2onnx

from conftest import Call, assert_exports_and_matches


def _complex(*shape: int, dtype: torch.dtype = torch.complex64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


_INDEX = torch.tensor([[0, 1, 2, 0], [3, 2, 1, 0]])
_ROWS = torch.tensor([0, 2])

CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[tuple[int, ...], ...]]] = {
    # on each part
    "cumsum": (lambda x: x.cumsum(1), ((3, 4),)),
    "diagonal": (lambda x: torch.diagonal(x, 1), ((4, 4),)),
    "diag": (torch.diag, ((4, 4),)),
    "trace": (torch.trace, ((4, 4),)),
    "gather": (lambda x: torch.gather(x, 1, _INDEX), ((2, 4),)),
    "take_along_dim": (lambda x: torch.take_along_dim(x, _INDEX, 1), ((2, 4),)),
    "index_put": (lambda x, v: x.index_put((_ROWS,), v), ((4, 3), (2, 3))),
    "index_add": (lambda x, v: x.index_add(0, _ROWS, v), ((4, 3), (2, 3))),
    "index_copy": (lambda x, v: x.index_copy(0, _ROWS, v), ((4, 3), (2, 3))),
    "as_strided": (lambda x: torch.as_strided(x, (2, 2), (1, 2), 1), ((3, 3),)),
    "copy_": (lambda x, y: x.clone().copy_(y), ((3, 3), (3, 3))),
    "select": (lambda x: x[1], ((3, 4),)),
    "index": (lambda x: x[:, torch.tensor([1, 3])], ((3, 4),)),
    "take": (lambda x: torch.take(x, torch.tensor([0, 5])), ((3, 4),)),
    "sum": (lambda x: x.sum((0, 1)), ((3, 4),)),
    "sum with dtype": (lambda x: x.sum(1, dtype=x.dtype), ((3, 4),)),
    "mean": (lambda x: x.mean(1), ((3, 4),)),
    "masked.sum": (lambda x: torch.masked.sum(x, 1, mask=x.real > 0), ((3, 4),)),
    # ops returning lists, taken apart with getitem
    "split": (lambda x: x.split(2, 1), ((4, 6),)),
    "split_with_sizes": (lambda x: x.split([1, 5], 1), ((4, 6),)),
    "unbind": (lambda x: x.unbind(0), ((4, 6),)),
    "hstack": (lambda a, b: torch.hstack([a, b]), ((3,), (3,))),
    "vstack": (lambda a, b: torch.vstack([a, b]), ((3,), (3,))),
    # products of parts
    "mm": (torch.mm, ((3, 4), (4, 5))),
    "bmm": (torch.bmm, ((2, 3, 4), (2, 4, 5))),
    "dot": (torch.dot, ((4,), (4,))),
    "tensordot": (lambda a, b: torch.tensordot(a, b, 1), ((3, 4), (4, 5))),
    "addmm": (torch.addmm, ((3, 5), (3, 4), (4, 5))),
    "mv": (torch.mv, ((3, 4), (4,))),
    "addmv": (lambda x, v: torch.addmv(x[:, 0], x, v), ((3, 4), (4,))),
    # comparisons: equal where both parts are, different where either is
    "eq": (lambda x, y: x == y.where(y.real > 0, x), ((3, 4), (3, 4))),
    "ne": (lambda x, y: x != y.where(y.real > 0, x), ((3, 4), (3, 4))),
    "eq 0": (lambda x: (x * (x.real > 0)) == 0, ((3, 4),)),
    "ne a complex number": (lambda x: x.where(x.real > 0, 1 + 2j) != (1 + 2j), ((3, 4),)),
    "logical_and": (lambda x, y: torch.logical_and(x * (x.real > 0), y), ((3, 4), (3, 4))),
    "logical_not": (lambda x: torch.logical_not(x * (x.real > 0)), ((3, 4),)),
    "isnan": (torch.isnan, ((3, 4),)),
    "count_nonzero": (lambda x: torch.count_nonzero(x * (x.real > 0)), ((3, 4),)),
    # where either part is non-zero
    "nonzero": (lambda x: torch.nonzero(x * (x.real > 0)), ((4, 3),)),
    "argwhere": (lambda x: torch.argwhere(x * (x.imag > 0)), ((4, 3),)),
    # factories given a complex dtype (torchlib's cast a real constant to complex inside the graph)
    "ones": (lambda x: torch.ones(3, 2, dtype=x.dtype) + x, ((3, 2),)),
    "zeros": (lambda x: torch.zeros(3, 2, dtype=x.dtype) * x, ((3, 2),)),
    "full": (lambda x: torch.full((3, 2), 1.5 - 2j, dtype=x.dtype) * x, ((3, 2),)),
    "linspace": (lambda x: torch.linspace(1 + 2j, 3 - 1j, 6, dtype=x.dtype).reshape(3, 2) + x, ((3, 2),)),
    "scalar_tensor": (lambda x: x * torch.scalar_tensor(2 - 1j, dtype=x.dtype), ((3, 2),)),
    "new_ones": (lambda x: x.new_ones(3, 2) - x, ((3, 2),)),
    "new_full": (lambda x: x.new_full((3, 2), 0.5j) - x, ((3, 2),)),
    "block_diag": (lambda x: torch.block_diag(x, x), ((2, 3),)),
    # formulas on the parts
    "var": (lambda x: x.var(1), ((3, 4),)),
    "var without correction": (lambda x: torch.var(x, 1, correction=0, keepdim=True), ((3, 4),)),
    "std": (torch.std, ((3, 4),)),
    "exp": (torch.exp, ((3, 4),)),
    "log": (torch.log, ((3, 4),)),
    "logsumexp": (lambda x: torch.logsumexp(x, 1), ((3, 4),)),
    # norms of magnitudes
    "vector_norm ord 3": (lambda x: torch.linalg.vector_norm(x, 3, dim=1), ((3, 4),)),
    "norm": (torch.linalg.norm, ((3, 4),)),
    "matrix_norm": (torch.linalg.matrix_norm, ((3, 4),)),
    "normalize": (lambda x: torch.nn.functional.normalize(x, dim=1), ((3, 4),)),
}


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize("case", list(CASES))
def test_complex_op_on_parts_matches_eager(case: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    function, shapes = CASES[case]
    program = assert_exports_and_matches(Call(function), tuple(_complex(*s, dtype=dtype) for s in shapes))
    if case in DECOMPOSED_INTO_COMPLEX_LOWERINGS:
        assert program.report.decomposition.strategy == "local"
    else:
        assert "rewrite_complex_on_parts" in program.report.fx_passes


# Decomposed locally into one complex `cat`, which has a complex lowering: no part needs rewriting (a full
# decomposition went through atleast_1d on the parts).
DECOMPOSED_INTO_COMPLEX_LOWERINGS = frozenset({"hstack", "vstack"})


def test_real_inputs_are_left_alone() -> None:
    program = assert_exports_and_matches(Call(torch.mm), (torch.randn(3, 4), torch.randn(4, 5)))
    assert "rewrite_complex_on_parts" not in program.report.fx_passes


def test_real_values_into_a_complex_tensor_are_not_split() -> None:
    """copy_ of a real tensor into a complex one: the real values are not the imaginary part too."""
    model = Call(lambda x, y: x.clone().copy_(y))
    try:
        assert_exports_and_matches(model, (_complex(3, 3), torch.randn(3, 3)))
    except Exception as error:  # an export error is acceptable, a wrong result is not
        assert "Unsupported" in str(error) or "lower" in str(error).lower(), error


def test_a_registered_complex_implementation_takes_precedence() -> None:
    """A user's complex `dot` (here: conjugating its first operand, as `vdot` does) is used, not the rewrite."""
    from onnxscript import opset18 as op

    from fx2onnx import Registry

    def conjugating_dot(self, tensor):  # type: ignore[no-untyped-def]  # (..., 2) layout in and out
        a, b = op.Split(self, axis=-1, num_outputs=2)  # [n, 1] each
        c, d = op.Split(tensor, axis=-1, num_outputs=2)
        first = op.Constant(value_ints=[0])
        real = op.Add(op.ReduceSum(op.Mul(a, c), first, keepdims=0), op.ReduceSum(op.Mul(b, d), first, keepdims=0))
        imag = op.Sub(op.ReduceSum(op.Mul(a, d), first, keepdims=0), op.ReduceSum(op.Mul(b, c), first, keepdims=0))
        return op.Concat(real, imag, axis=-1)  # [2]: a 0-d complex

    registry = Registry.default()
    registry.register("aten::dot", conjugating_dot, complex=True)
    x, y = _complex(4), _complex(4)
    program = fx2onnx.export(Call(torch.dot), (x, y), registry=registry)
    assert "rewrite_complex_on_parts" not in program.report.fx_passes
    (result,) = program(x, y)
    torch.testing.assert_close(result, torch.vdot(x, y))


def test_log_on_the_branch_cut() -> None:
    """log(-2 + 0i) = log 2 + i pi and log(-2 - 0i) = log 2 - i pi: the imaginary part's sign picks the side."""
    x = torch.tensor([complex(-2, 0.0), complex(-2, -0.0), complex(0, -1), 1e-20 + 0j])
    assert_exports_and_matches(Call(torch.log), (x,))
