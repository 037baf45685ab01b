"""Complex ops rewritten as real ops on their real and imaginary parts (passes/complex_parts.py).

Each had no complex lowering and failed the export (UnsupportedOperatorError, or a decomposition into prims that
nothing lowers); each now runs in ONNX Runtime and matches eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import fx2onnx

from conftest import Call, assert_exports_and_matches


def _complex(*shape: int, dtype: torch.dtype = torch.complex64) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype)


_INDEX = torch.tensor([[0, 1, 2, 0], [3, 2, 1, 0]])
_ROWS = torch.tensor([0, 2])

CASES: dict[str, tuple[Callable[..., torch.Tensor], tuple[tuple[int, ...], ...]]] = {
    # on each part
    "cumsum": (lambda x: x.cumsum(1), ((3, 4),)),
    "diff": (lambda x, y: torch.diff(x, n=2, dim=0, append=y), ((3, 2), (2, 2))),
    "diff of order 0": (lambda x: torch.diff(x, 0), ((1,),)),
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


def test_take_of_a_0d_complex_tensor_with_an_index_input() -> None:
    """Decomposed, take guarded on the index's value (the complex64 take cell): it is now taken on the parts."""
    assert_exports_and_matches(Call(torch.take), (_complex(), torch.tensor(0)))


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


# --- functions from their formulas on the parts (passes/complex_functions.py) ------------------------------------
# Every side of every branch cut (the sign of a zero part picks it), the origin with its four signed zeros, points
# on the axes and off them, large and small magnitudes.
_CUT_POINTS = [
    complex(re, im)
    for re, im in [
        (2.0, 0.0), (2.0, -0.0), (-2.0, 0.0), (-2.0, -0.0), (0.0, 3.0), (-0.0, 3.0), (0.0, -3.0), (-0.0, -3.0),
        (0.5, 0.0), (0.5, -0.0), (-0.5, 0.0), (-0.5, -0.0), (0.0, 0.0), (-0.0, 0.0), (0.0, -0.0), (-0.0, -0.0),
        (0.0, 0.5), (-0.0, -0.5), (1.0, 0.0), (-1.0, -0.0), (1e-4, 1e-5), (-3e-3, 2e-4), (1.5, -2.5), (-4.0, 7.0),
        (30.0, -1.0), (-25.0, 2.0), (0.3, 40.0), (-1e3, -1e-3),
    ]
]  # fmt: skip

UNARY_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "sinh": torch.sinh,
    "cosh": torch.cosh,
    "tanh": torch.tanh,
    "asin": torch.asin,
    "acos": torch.acos,
    "atan": torch.atan,
    "asinh": torch.asinh,
    "acosh": torch.acosh,
    "atanh": torch.atanh,
    "exp2": torch.exp2,
    "expm1": torch.expm1,
    "log1p": torch.log1p,
    "log2": torch.log2,
    "log10": torch.log10,
    "sigmoid": torch.sigmoid,
}
# Where eager's own result is not C99's (its vectorized kernels round differently near overflow, or divide by a
# zero that C special-cases), the values are compared but not the signs of zeros.
_SIGNS_UNCHECKED = {("tan", 0.3 + 40j), ("tanh", -25 + 2j), ("tanh", 30 - 1j)}


@pytest.mark.parametrize("name", list(UNARY_FUNCTIONS))
def test_complex_function_matches_eager_on_its_branch_cuts(name: str) -> None:
    """Values within tolerance of eager, and the sign of every zero part as eager's (the branch cuts' sides)."""
    function = UNARY_FUNCTIONS[name]
    x = torch.tensor(_CUT_POINTS, dtype=torch.complex64)
    # verify() measures complex errors as |got - eager|, NaN for two equal infinities: those points are compared here
    finite = torch.view_as_real(function(x)).isfinite().all(-1) | function(x).isnan()
    assert_exports_and_matches(Call(function), (x[finite],))
    (got,) = fx2onnx.export(Call(function), (x,))(x)
    want = function(x)
    torch.testing.assert_close(torch.view_as_real(got), torch.view_as_real(want), rtol=1e-4, atol=1e-4, equal_nan=True)
    for point, g, w in zip(_CUT_POINTS, torch.view_as_real(got), torch.view_as_real(want)):
        if (name, point) in _SIGNS_UNCHECKED:
            continue
        zero = (w == 0) & (g == 0)
        assert torch.equal(torch.signbit(g[zero]), torch.signbit(w[zero])), (name, point, g.tolist(), w.tolist())


@pytest.mark.parametrize("name", ["sqrt", "asin", "acos", "atanh", "log1p", "tan"])
def test_complex128_function_matches_eager(name: str) -> None:
    x = torch.tensor(_CUT_POINTS, dtype=torch.complex128)
    assert_exports_and_matches(Call(UNARY_FUNCTIONS[name]), (x,))


_BASES = torch.tensor([0j, -2 + 0j, complex(-2, -0.0), 1 + 2j, 3 - 1j, -0.5 + 0.25j], dtype=torch.complex64)
_EXPONENTS = torch.tensor([0j, 2 + 1j, -1 + 0j, 0.5 + 0j, 2 + 0j, -1.5 - 0.5j], dtype=torch.complex64)

POWERS: dict[str, tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]] = {
    "tensor ** tensor (0 ** 0 is NaN, as eager)": (torch.pow, (_BASES, _EXPONENTS)),
    "tensor ** 2": (lambda x: x**2, (_BASES,)),
    "tensor ** 3": (lambda x: x**3, (_BASES,)),
    "tensor ** 0.5": (lambda x: x**0.5, (_BASES,)),
    "tensor ** -1 (1/0 is inf + nan i)": (lambda x: x**-1, (_BASES,)),
    "tensor ** -2": (lambda x: x**-2, (_BASES,)),
    "tensor ** 0": (lambda x: x**0, (_BASES,)),
    "tensor ** 1.7": (lambda x: x**1.7, (_BASES,)),
    "tensor ** complex": (lambda x: x ** (1 - 2j), (_BASES,)),
    "number ** tensor": (lambda x: 2**x, (_EXPONENTS,)),
    "0 ** tensor": (lambda x: 0**x, (_EXPONENTS,)),
    "real tensor ** complex tensor": (lambda x, y: x.real**y, (_BASES, _EXPONENTS)),
    "float_power": (torch.float_power, (_BASES, _EXPONENTS)),
    "prod": (torch.prod, (_BASES.reshape(2, 3),)),
    "prod along a dim": (lambda x: torch.prod(x, 1, keepdim=True), (_BASES.reshape(2, 3),)),
    "cumprod": (lambda x: torch.cumprod(x, 1), (_BASES.reshape(2, 3),)),
}


@pytest.mark.parametrize("case", list(POWERS))
def test_complex_power_and_product_match_eager(case: str) -> None:
    function, inputs = POWERS[case]
    assert_exports_and_matches(Call(function), inputs)


_SELECT = torch.tensor([[0, 1], [1, 0]])
COMPOSITES: dict[str, tuple[Callable[..., torch.Tensor], tuple[tuple[int, ...], ...]]] = {
    "var_mean": (lambda x: torch.var_mean(x, 1), ((3, 4),)),
    "std_mean": (lambda x: torch.std_mean(x, 0, correction=0), ((3, 4),)),
    "addbmm": (lambda x, a, b: torch.addbmm(x, a, b, beta=0.5, alpha=2), ((3, 5), (2, 3, 4), (2, 4, 5))),
    "linear": (torch.nn.functional.linear, ((2, 4), (3, 4), (3,))),
    "einsum of three": (lambda a, b, c: torch.einsum("ij,kj,k->i", a, b, c), ((3, 4), (2, 4), (2,))),
    "cross": (lambda a, b: torch.linalg.cross(a, b), ((4, 3), (4, 3))),
    "addr": (lambda x, a, b: torch.addr(x, a, b, beta=2), ((3, 4), (3,), (4,))),
    "isclose": (lambda a, b: torch.isclose(a, b.where(b.real > 0, a), rtol=0.5, atol=0.1), ((3, 4), (3, 4))),
    "isfinite": (lambda a, b: torch.isfinite(a / (b * (b.real > 0))), ((3, 4), (3, 4))),
    "isinf": (lambda a, b: torch.isinf(torch.where(b.real > 0, a, complex(1.0, float("-inf")))), ((3, 4), (3, 4))),
    "dist": (torch.dist, ((3, 4), (3, 4))),
    "tile": (lambda x: torch.tile(x, (2, 1)), ((3, 4),)),
    "repeat_interleave": (lambda x: torch.repeat_interleave(x, 2, 1), ((3, 4),)),
    "index_select": (lambda x: torch.index_select(x, 1, _SELECT[0]), ((3, 4),)),
    "scatter_add": (lambda x, v: torch.scatter_add(x, 1, _SELECT, v), ((2, 4), (2, 2))),
    "combinations": (torch.combinations, ((4,),)),
    "masked_select": (lambda x: torch.masked_select(x, x.real > 0), ((3, 4),)),
    "narrow": (lambda x: torch.narrow(x, 1, 1, 2), ((3, 4),)),
    "tensor_split": (lambda x: torch.tensor_split(x, 3, 1)[1], ((3, 4),)),
    "logaddexp": (torch.logaddexp, ((3, 4), (3, 4))),
    "rms_norm": (lambda x: torch.nn.functional.rms_norm(x, (4,)), ((3, 4),)),
    "masked.normalize": (lambda x: torch.masked.normalize(x, 2.0, 1), ((3, 4),)),
    "abs beyond float32's squares": (lambda x: torch.abs(x * 1e30), ((3, 4),)),
    "cov": (torch.cov, ((3, 4),)),
    "cov of one variable": (lambda x: torch.cov(x, correction=0), ((4,),)),
    "corrcoef of one row": (torch.corrcoef, ((1, 2),)),  # eager squeezes to 0-d
    "cov with weights": (
        lambda x: torch.cov(x, fweights=torch.tensor([1, 2, 3, 1]), aweights=torch.tensor([0.5, 1.0, 2.0, 1.0])),
        ((3, 4),),
    ),
    "corrcoef": (torch.corrcoef, ((3, 4),)),
}


@pytest.mark.parametrize("case", list(COMPOSITES))
def test_complex_composite_matches_eager(case: str) -> None:
    torch.manual_seed(0)
    function, shapes = COMPOSITES[case]
    assert_exports_and_matches(Call(function), tuple(_complex(*s) for s in shapes))


# --- linear algebra through the real embedding (passes/complex_linalg.py) ---------------------------------------
def _matrices(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    a = torch.randn(2, 4, 4, dtype=dtype) + 3 * torch.eye(4, dtype=dtype)
    b = torch.randn(2, 4, 3, dtype=dtype)
    factor = torch.linalg.cholesky(a @ a.mH)
    return a, b, factor


LINALG: dict[str, Callable[..., Any]] = {
    "inv": lambda a, b, f: torch.linalg.inv(a),
    "inv_ex": lambda a, b, f: torch.linalg.inv_ex(a),
    "solve": lambda a, b, f: torch.linalg.solve(a, b),
    "solve a batch of vectors": lambda a, b, f: torch.linalg.solve(a, b[..., 0]),
    "solve on the right": lambda a, b, f: torch.linalg.solve(a, b.mT, left=False),
    "solve_ex": lambda a, b, f: torch.linalg.solve_ex(a, b),
    "tensorsolve": lambda a, b, f: torch.linalg.tensorsolve(a[0].reshape(2, 2, 2, 2), b[0, :, 0].reshape(2, 2)),
    "tensorinv": lambda a, b, f: torch.linalg.tensorinv(a[0].reshape(4, 2, 2), ind=1),
    "matrix_exp": lambda a, b, f: torch.linalg.matrix_exp(a * 0.3),
    "pinv": lambda a, b, f: torch.linalg.pinv(b),
    "pinv hermitian": lambda a, b, f: torch.linalg.pinv(f @ f.mH, hermitian=True),
    "solve_triangular": lambda a, b, f: torch.linalg.solve_triangular(a, b, upper=True),
    "solve_triangular unit, right": lambda a, b, f: torch.linalg.solve_triangular(
        a, b.mT, upper=False, left=False, unitriangular=True
    ),
    "triangular_solve": lambda a, b, f: torch.triangular_solve(b, a, upper=True, transpose=True),
    "cholesky_solve": lambda a, b, f: torch.cholesky_solve(b, f),
    "cholesky_inverse": lambda a, b, f: torch.cholesky_inverse(f[0]),
    "eigvalsh": lambda a, b, f: torch.linalg.eigvalsh(a),
    "eigvalsh upper": lambda a, b, f: torch.linalg.eigvalsh(a, UPLO="U"),
    "svdvals": lambda a, b, f: torch.linalg.svdvals(b),
    "matrix_rank": lambda a, b, f: torch.linalg.matrix_rank(b),
    "matrix_rank hermitian": lambda a, b, f: torch.linalg.matrix_rank(f @ f.mH, hermitian=True),
    # Cholesky on the parts (a conjugate view, f.mH, as input)
    "cholesky": lambda a, b, f: torch.linalg.cholesky(f @ f.mH),
    "cholesky upper": lambda a, b, f: torch.linalg.cholesky(f @ f.mH, upper=True),
    "cholesky_ex": lambda a, b, f: torch.linalg.cholesky_ex(f @ f.mH),
    # LU with partial pivoting on the parts (LAPACK's pivots: the largest |re| + |im|)
    "det": lambda a, b, f: torch.linalg.det(a),
    "det of an empty matrix": lambda a, b, f: torch.linalg.det(a[0, :0, :0]),
    "slogdet": lambda a, b, f: torch.linalg.slogdet(a),
    "logdet": lambda a, b, f: torch.logdet(a),
    "lu_factor of a wide matrix": lambda a, b, f: torch.linalg.lu_factor(b.mT),
    "lu_factor_ex": lambda a, b, f: torch.linalg.lu_factor_ex(a),
    "lu of a tall matrix": lambda a, b, f: torch.linalg.lu(b),
    "lu_unpack": lambda a, b, f: torch.lu_unpack(*torch.linalg.lu_factor(a)),
    "lu_solve": lambda a, b, f: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b),
    "lu_solve with no columns": lambda a, b, f: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b[..., :0]),
    "lu_solve adjoint, right": lambda a, b, f: torch.linalg.lu_solve(
        *torch.linalg.lu_factor(a), b.mT, left=False, adjoint=True
    ),
}


@pytest.mark.parametrize("case", list(LINALG))
def test_complex_linalg_matches_eager(case: str) -> None:
    assert_exports_and_matches(Call(LINALG[case]), _matrices(torch.complex64))


@pytest.mark.parametrize("case", ["inv", "solve", "pinv", "svdvals"])
def test_complex128_linalg_matches_eager(case: str) -> None:
    assert_exports_and_matches(Call(LINALG[case]), _matrices(torch.complex128))


class ScalarWrites(torch.nn.Module):
    """Writes of a number (complex, float, int) or a 0-d tensor into slices and a row of a complex tensor."""

    def __init__(self, value: complex | float | None) -> None:
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor, scalar: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[:, 1:3] = scalar if self.value is None else self.value
        y[0].fill_(-0.5j)
        y[-1, ::2] = float("inf")
        return y


@pytest.mark.parametrize("value", [1.5 - 2j, -0.0, 3, None], ids=["complex", "float", "int", "tensor"])
def test_complex_writes_of_a_scalar_through_views_stay_local(value: complex | float | None) -> None:
    """A fill of a complex view is filled part by part: capture functionalizes it locally, with no whole-program
    decomposition (which exported an invalid model: a complex constant's Identity kept a rank-0 shape)."""
    x = torch.tensor(
        [[1 + 2j, -3j, 4.5, 0], [2, 1e30 - 1e-30j, -1, 1j], [0.5, 0.25j, -2 - 2j, 7]], dtype=torch.complex64
    )
    scalar = torch.tensor(2.0 - 1j, dtype=torch.complex64)
    assert_exports_and_matches(ScalarWrites(value), (x, scalar))
    program = fx2onnx.export(ScalarWrites(value), (x, scalar))
    assert program.report.decomposition.strategy == "local"
