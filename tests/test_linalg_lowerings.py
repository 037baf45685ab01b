"""fx2onnx's lowerings of data-dependent ops and of dense linear algebra (src/fx2onnx/_lowerings/linalg.py,
linalg_eigen.py).

Each export runs in ONNX Runtime and is compared with eager. The data-dependent ops (take, nonzero_static,
unique_consecutive, combinations, narrow with a tensor start, cov, one_hot) used to fail in capture or
had no lowering; the factorizations are unrolled for the static matrix size, with partial pivoting as
LAPACK does, so that pivots, P, L and U agree with eager's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import fx2onnx
from fx2onnx.errors import CaptureError, LoweringError

from conftest import Call, assert_exports_and_matches


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def well_conditioned(*shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    n = shape[-1]
    return (randn(*shape, dtype=torch.float64) + 3 * torch.eye(n, dtype=torch.float64)).to(dtype)


def positive_definite(*shape: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    a = randn(*shape, dtype=torch.float64, seed=3)
    return (a @ a.mT + shape[-1] * torch.eye(shape[-1], dtype=torch.float64)).to(dtype)


# --- data-dependent ops ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.int8, torch.bool])
def test_take_wraps_negative_indices(dtype: torch.dtype) -> None:
    x = randn(3, 4).mul(5).to(dtype)
    index = torch.tensor([[0, -1], [11, -12], [5, 5]])
    assert_exports_and_matches(Call(torch.take), (x, index))


def test_nonzero_static_pads_and_truncates() -> None:
    x = torch.tensor([[0.0, 1.0, float("nan")], [0.0, -0.0, 2.0]])
    assert_exports_and_matches(Call(lambda t: torch.nonzero_static(t, size=5, fill_value=-7)), (x,))
    assert_exports_and_matches(Call(lambda t: torch.nonzero_static(t, size=1)), (x,))
    assert_exports_and_matches(Call(lambda t: torch.nonzero_static(t, size=2)), (torch.tensor(3),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8, torch.bool])
def test_unique_consecutive(dtype: torch.dtype) -> None:
    x = torch.tensor([[1, 1, 0], [0, 2, 2]]).to(dtype)
    function = Call(lambda t: torch.unique_consecutive(t, return_inverse=True, return_counts=True))
    assert_exports_and_matches(function, (x,))
    assert_exports_and_matches(Call(torch.unique_consecutive), (torch.tensor(5).to(dtype),))


def test_unique_consecutive_nan_runs_split() -> None:
    x = torch.tensor([float("nan"), float("nan"), 1.0, 1.0, float("inf")])
    assert_exports_and_matches(Call(lambda t: torch.unique_consecutive(t, return_counts=True)), (x,))


def test_unique_of_bools() -> None:
    """ONNX Runtime has no Unique kernel for bool: the lowering goes through uint8."""
    x = torch.tensor([[True, False, True], [True, True, True]])
    function = Call(lambda t: torch.unique(t, return_inverse=True, return_counts=True))
    assert_exports_and_matches(function, (x,))


@pytest.mark.parametrize(("r", "with_replacement"), [(2, False), (3, True), (0, False), (5, False)])
def test_combinations(r: int, with_replacement: bool) -> None:
    x = torch.tensor([3, -1, 4, 7], dtype=torch.int16)
    assert_exports_and_matches(Call(lambda t: torch.combinations(t, r, with_replacement)), (x,))


@pytest.mark.parametrize("start", [1, -2, 0])
def test_narrow_with_a_tensor_start(start: int) -> None:
    x = randn(4, 5, 3)
    program = assert_exports_and_matches(Call(lambda t, s: torch.narrow(t, 1, s, 2)), (x, torch.tensor(start)))
    # The start is an input, read at run time: another start gives eager's other window.
    other = torch.tensor(3)
    assert program.verify(x, other)[0].passed


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_cov_and_corrcoef(dtype: torch.dtype) -> None:
    x = randn(3, 6).mul(4).to(dtype)
    assert_exports_and_matches(Call(torch.cov), (x,))
    assert_exports_and_matches(Call(torch.corrcoef), (x,))
    assert_exports_and_matches(Call(torch.cov), (x[0],))  # one variable: a 0-d result


def test_cov_with_weights_and_too_few_observations() -> None:
    x = randn(2, 4)
    fweights, aweights = torch.tensor([1, 2, 0, 3]), torch.tensor([0.5, 1.0, 2.0, 0.25])
    function = Call(lambda t, f, a: torch.cov(t, correction=1, fweights=f, aweights=a))
    assert_exports_and_matches(function, (x, fweights, aweights))
    # correction >= the number of observations: eager's normalizer is clamped to 0 (inf/nan results)
    assert_exports_and_matches(Call(lambda t: torch.cov(t, correction=4)), (x,))


def test_one_hot_reads_the_class_count_at_run_time() -> None:
    x = torch.tensor([[0, 3], [1, 1]])
    program = assert_exports_and_matches(Call(torch.nn.functional.one_hot), (x,))
    assert program.verify(torch.tensor([[0, 5], [2, 1]]))[0].passed  # another count of classes
    assert_exports_and_matches(Call(lambda t: torch.nn.functional.one_hot(t, 4)), (torch.tensor(2),))


@pytest.mark.parametrize("function", [torch.tril_indices, torch.triu_indices])
def test_tril_triu_indices(function: Callable[..., torch.Tensor]) -> None:
    class Indices(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return function(4, 3, -1), function(0, 5), function(3, 3, 1, dtype=torch.int32) + x

    assert_exports_and_matches(Indices(), (torch.tensor(1, dtype=torch.int32),))


# --- linear algebra ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_solve_and_inverse(dtype: torch.dtype) -> None:
    a, b = well_conditioned(2, 4, 4, dtype=dtype), randn(2, 4, 3, dtype=dtype)
    assert_exports_and_matches(Call(torch.linalg.solve), (a, b))
    assert_exports_and_matches(Call(lambda x, y: torch.linalg.solve(x, y, left=False)), (a, b.mT))
    assert_exports_and_matches(Call(torch.linalg.solve), (a[0], randn(4, dtype=dtype)))  # a vector
    assert_exports_and_matches(Call(torch.linalg.inv), (a,))
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.inv_ex(x))), (a,))


def test_pivoting_follows_lapack() -> None:
    """A zero leading entry needs a row swap; the factors, pivots and P must be eager's."""
    a = torch.tensor([[0.0, 2.0, 1.0], [1.0, 1.0, 0.0], [4.0, -1.0, 3.0]], dtype=torch.float64)
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.lu_factor(x))), (a,))
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.lu_factor_ex(x))), (a,))
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.lu(x))), (a,))
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.slogdet(x))), (a,))


def test_singular_matrix_reports_info() -> None:
    a = torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64)
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.lu_factor_ex(x))), (a,))
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.slogdet(x))), (a,))  # sign 0, -inf


def test_rectangular_lu_and_unpack() -> None:
    a = randn(2, 3, 5, dtype=torch.float64)
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.lu(x))), (a,))
    lu, pivots = torch.linalg.lu_factor(a)
    assert_exports_and_matches(Call(lambda x, p: tuple(torch.lu_unpack(x, p))), (lu, pivots))


@pytest.mark.parametrize(("left", "adjoint"), [(True, False), (True, True), (False, False), (False, True)])
def test_lu_solve(left: bool, adjoint: bool) -> None:
    a = well_conditioned(4, 4)
    lu, pivots = torch.linalg.lu_factor(a)
    b = randn(4, 2, dtype=torch.float64) if left else randn(2, 4, dtype=torch.float64)
    function = Call(lambda x, p, y: torch.linalg.lu_solve(x, p, y, left=left, adjoint=adjoint))
    assert_exports_and_matches(function, (lu, pivots, b))


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_family(upper: bool) -> None:
    a = positive_definite(2, 4, 4)
    factor = torch.linalg.cholesky(a, upper=upper)
    b = randn(2, 4, 3, dtype=torch.float64)
    assert_exports_and_matches(Call(lambda x: torch.linalg.cholesky(x, upper=upper)), (a,))
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.cholesky_ex(x, upper=upper))), (a,))
    assert_exports_and_matches(Call(lambda y, f: torch.cholesky_solve(y, f, upper=upper)), (b, factor))
    assert_exports_and_matches(Call(lambda f: torch.cholesky_inverse(f, upper=upper)), (factor[0],))


def test_cholesky_ex_reports_the_failing_column() -> None:
    a = torch.tensor([[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # singular at column 2
    program = torch.linalg.cholesky_ex(a)
    assert int(program.info) == 2
    assert_exports_and_matches(Call(lambda x: torch.linalg.cholesky_ex(x).info), (a,))


@pytest.mark.parametrize("upper", [False, True])
def test_triangular_solves(upper: bool) -> None:
    a = well_conditioned(3, 3, dtype=torch.float32)
    a = a.triu() if upper else a.tril()
    b = randn(2, 3, 4)
    assert_exports_and_matches(Call(lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper)), (a, b))
    right = Call(lambda x, y: torch.linalg.solve_triangular(x, y, upper=upper, left=False, unitriangular=True))
    assert_exports_and_matches(right, (a, b.mT))
    legacy = Call(lambda y, x: tuple(torch.triangular_solve(y, x, upper=upper, transpose=True)))
    assert_exports_and_matches(legacy, (b, a))


def test_tensorinv_and_tensorsolve() -> None:
    a = well_conditioned(6, 6).reshape(2, 3, 6)
    assert_exports_and_matches(Call(lambda x: torch.linalg.tensorinv(x, ind=2)), (a,))
    assert_exports_and_matches(Call(torch.linalg.tensorsolve), (a, randn(2, 3, dtype=torch.float64)))


@pytest.mark.parametrize("scale", [0.0, 0.3, 20.0])
def test_matrix_exp(scale: float) -> None:
    """Small norms need no squaring, large ones many (the count is read from the input at run time)."""
    a = randn(2, 4, 4, dtype=torch.float64) * scale
    assert_exports_and_matches(Call(torch.linalg.matrix_exp), (a,))


def test_singular_values_and_pseudo_inverse() -> None:
    """Jacobi's singular values in float64; U and V only through sign-independent products (pinv)."""
    a = randn(2, 4, 3, dtype=torch.float32)
    assert_exports_and_matches(Call(torch.linalg.svdvals), (a.mT,))  # wide: through A^T
    assert_exports_and_matches(Call(lambda x: torch.linalg.norm(x, "nuc", dim=(-2, -1))), (a,))
    rank_two = randn(4, 2, dtype=torch.float64) @ randn(2, 4, dtype=torch.float64, seed=5)
    assert_exports_and_matches(Call(torch.linalg.pinv), (rank_two,))  # zero singular values are cut off


def test_symmetric_eigenvalues() -> None:
    a = randn(2, 4, 4, dtype=torch.float64)
    assert_exports_and_matches(Call(lambda x: torch.linalg.eigvalsh(x, UPLO="U")), (a,))  # the upper triangle
    assert_exports_and_matches(Call(lambda x: torch.linalg.pinv(x, hermitian=True)), (a + a.mT,))


@pytest.mark.parametrize("shape", [(4, 3), (3, 4)])
def test_qr_follows_lapack_signs(shape: tuple[int, int]) -> None:
    a = randn(2, *shape, dtype=torch.float64)
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.qr(x))), (a,))
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.qr(x, mode="complete"))), (a,))
    assert_exports_and_matches(Call(lambda x: tuple(torch.geqrf(x))), (a,))
    packed, tau = torch.geqrf(a)
    if shape[0] >= shape[1]:  # orgqr wants at least as many rows as columns
        assert_exports_and_matches(Call(torch.linalg.householder_product), (packed, tau))
    c = randn(2, shape[0], 2, dtype=torch.float64)
    assert_exports_and_matches(Call(lambda p, t, y: torch.ormqr(p, t, y, transpose=True)), (packed, tau, c))


# --- least squares: eager's outputs per driver ------------------------------------------------------------------
_LSTSQ_SHAPES = [((4, 3), (4, 2)), ((2, 3), (2,)), ((1, 4, 3), (3, 4, 2))]


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lstsq_drivers(driver: str, dtype: torch.dtype) -> None:
    """Tall, wide with a vector right-hand side, batched and broadcast: solution, residuals (m > n except gelsy),
    rank (not gels) and singular values (gelsd, gelss), empty where eager's are."""
    for index, (a_shape, b_shape) in enumerate(_LSTSQ_SHAPES):
        a, b = randn(*a_shape, dtype=dtype, seed=index), randn(*b_shape, dtype=dtype, seed=10 + index)
        assert_exports_and_matches(Call(lambda x, y: tuple(torch.linalg.lstsq(x, y, driver=driver))), (a, b))


def _rank_two(*batch: int, rows: int = 5, dtype: torch.dtype = torch.float64, seed: int = 0) -> torch.Tensor:
    """A [..., rows, 3] matrix whose third column is the sum of the first two."""
    a = randn(*batch, rows, 3, dtype=dtype, seed=seed)
    a[..., 2] = a[..., 0] + a[..., 1]
    return a


@pytest.mark.parametrize("driver", ["gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lstsq_rank_deficient(driver: str, dtype: torch.dtype) -> None:
    """The rank is read at run time, the solution is the minimum-norm one, and gelsd/gelss's residuals are empty
    unless the matrix has full rank (the same export run on both)."""
    b = randn(5, 2, dtype=dtype, seed=7)
    full, deficient = randn(5, 3, dtype=dtype, seed=1), _rank_two(dtype=dtype)
    function = Call(lambda x, y: tuple(torch.linalg.lstsq(x, y, driver=driver)))
    assert_exports_and_matches(function, (full, b), run_with=[((full, b), {}), ((deficient, b), {})])
    assert_exports_and_matches(function, (deficient, b), run_with=[((deficient, b), {}), ((full, b), {})])


def test_lstsq_rank_deficient_in_a_batch() -> None:
    """One rank-deficient matrix of a batch: per-matrix ranks; gelsd's residuals empty for the whole batch (eager's
    are a (0,) tensor, the export's keep the batch dim: (2, 0)), so compare the other outputs."""
    a = torch.stack([randn(5, 3, dtype=torch.float64, seed=2), _rank_two(dtype=torch.float64)])
    b = randn(2, 5, 2, dtype=torch.float64, seed=3)
    result = torch.linalg.lstsq(a, b, driver="gelsd")
    assert result.residuals.shape == (0,)
    assert_exports_and_matches(Call(lambda x, y: torch.linalg.lstsq(x, y, driver="gelsd").rank), (a, b))
    solve = Call(lambda x, y: torch.linalg.lstsq(x, y, driver="gelsy").solution)
    assert_exports_and_matches(solve, (a, b))
    program = fx2onnx.export(Call(lambda x, y: tuple(torch.linalg.lstsq(x, y, driver="gelss"))), (a, b))
    solution, residuals, rank, _ = program(a, b)
    assert residuals.numel() == 0
    torch.testing.assert_close(solution, result.solution)
    assert torch.equal(rank, torch.tensor([3, 2]))


def _truncatable() -> tuple[torch.Tensor, torch.Tensor]:
    """A = Q R with R's third direction at 1e-4; columns in the order column pivoting keeps (the pivots are the
    identity), and B."""
    q, _ = torch.linalg.qr(randn(5, 3, dtype=torch.float64, seed=4))
    r = torch.tensor([[3.0, 0.5, 0.3], [0.0, 1.0, 0.2], [0.0, 0.0, 1e-4]], dtype=torch.float64)
    return q @ r, randn(5, 2, dtype=torch.float64, seed=6)


@pytest.mark.parametrize("driver", ["gelsd", "gelss"])
def test_lstsq_rcond_cuts_small_singular_values(driver: str) -> None:
    """A direction below rcond * s_max counts as zero: rank 2 and the SVD-truncated solution."""
    a, b = _truncatable()
    for rcond in (1e-3, None):  # cut; kept (the default is eps * max(m, n))
        function = Call(lambda x, y, rc=rcond: tuple(torch.linalg.lstsq(x, y, rcond=rc, driver=driver)))
        assert_exports_and_matches(function, (a, b))


def test_lstsq_gelsy_truncates_the_pivoted_qr() -> None:
    """gelsy cuts R's trailing rows, not singular values: the minimum-norm solution of R[:2] x = (Q^T B)[:2].

    Compared with that definition rather than with eager: torch 2.13 hands LAPACK an uninitialized pivot array, so
    eager fixes a varying subset of the columns in place, and its truncated solution varies from call to call.
    """
    a, b = _truncatable()
    program = fx2onnx.export(Call(lambda x, y: tuple(torch.linalg.lstsq(x, y, rcond=1e-3, driver="gelsy"))), (a, b))
    solution, residuals, rank, values = program(a, b)
    q, r = torch.linalg.qr(a)
    expected = torch.linalg.pinv(r[:2]) @ (q.mT @ b)[:2]
    torch.testing.assert_close(solution, expected, rtol=1e-10, atol=1e-12)
    assert int(rank) == 2 and residuals.shape == values.shape == (0,)
    svd_truncated = torch.linalg.lstsq(a, b, rcond=1e-3, driver="gelsd").solution
    assert not torch.allclose(solution, svd_truncated, rtol=1e-6, atol=1e-7)  # the test tells the two apart


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd"])
def test_lstsq_ill_conditioned(driver: str) -> None:
    """A Vandermonde matrix (condition number ~1e6): float64 results within eager's own accuracy."""
    points = torch.linspace(0.0, 1.0, 12, dtype=torch.float64)
    a = torch.stack([points**power for power in range(9)], dim=-1)
    b = torch.cos(3 * points).unsqueeze(-1)
    assert torch.linalg.cond(a) > 5e5
    assert_exports_and_matches(Call(lambda x, y: tuple(torch.linalg.lstsq(x, y, driver=driver))), (a, b))


# --- nonsymmetric eigenvalues: LAPACK geev's order ------------------------------------------------------------
def nonsymmetric(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random matrices; at these sizes most have both real eigenvalues and complex-conjugate pairs."""
    return randn(*shape, dtype=dtype, seed=seed)


def repeated_eigenvalues() -> torch.Tensor:
    """Exactly repeated eigenvalues: a defective triangular block (balancing isolates it by permutations), a
    repeated complex pair behind an orthogonal similarity, and the identity."""
    rotation = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64)
    q, _ = torch.linalg.qr(randn(4, 4, dtype=torch.float64, seed=3))
    return torch.stack(
        [
            torch.tensor([[1.0, 0, 0, 0], [2, 1, 0, 0], [3, 4, 5, 0], [1, 1, 1, 5]], dtype=torch.float64),
            q @ torch.block_diag(rotation, rotation) @ q.T,
            torch.eye(4, dtype=torch.float64),
        ]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eigvals_in_eagers_order(dtype: torch.dtype) -> None:
    """Real and complex eigenvalues of a batch, in the order of LAPACK's Schur form (an exact comparison of
    positions: another order would put other values side by side); geev's rescaling of tiny and huge matrices."""
    a = nonsymmetric(3, 6, 6, dtype=dtype)
    values = torch.linalg.eigvals(a)
    assert bool((values.imag > 0).any()) and bool((values.imag == 0).any())  # both kinds are exercised
    extreme = 1e30 if dtype == torch.float32 else 1e200
    run_with = [((a,), {}), ((a * extreme,), {}), ((a / extreme,), {})]
    if dtype == torch.float32:  # geev scales matrices beyond its own range (float32: 1e-12..1e12) into it
        run_with.append(((a * 1e-15,), {}))
    assert_exports_and_matches(Call(torch.linalg.eigvals), (a,), run_with=run_with)


def test_eigvals_with_repeated_eigenvalues() -> None:
    assert_exports_and_matches(Call(torch.linalg.eigvals), (repeated_eigenvalues(),))


def test_eigvals_of_empty_and_one_by_one_matrices() -> None:
    assert_exports_and_matches(Call(torch.linalg.eigvals), (torch.tensor([[[-2.5]], [[0.0]]]),))
    assert_exports_and_matches(Call(torch.linalg.eigvals), (torch.zeros(0, 3, 3, dtype=torch.float64),))


def assert_eig_matches(program: fx2onnx.ONNXProgram, a: torch.Tensor) -> None:
    """Eigenvalues as eager's; each eigenvector as eager's up to its sign (eager's normalization, unit norm and
    largest component real, leaves it), and an eigenvector of its eigenvalue."""
    values, vectors = program(a)
    expected_values, expected_vectors = torch.linalg.eig(a)
    tolerance = 1e-4 if a.dtype == torch.float32 else 1e-10
    torch.testing.assert_close(values, expected_values, rtol=tolerance, atol=tolerance * float(a.abs().max()))
    alignment = (expected_vectors.conj() * vectors).sum(dim=-2, keepdim=True).real
    signed = vectors * torch.where(alignment < 0, -1.0, 1.0).to(vectors.dtype)
    torch.testing.assert_close(signed, expected_vectors, rtol=tolerance * 10, atol=tolerance * 10)
    residual = a.to(vectors.dtype) @ vectors - vectors * values.unsqueeze(-2)
    assert float(residual.abs().max()) <= tolerance * 10 * float(a.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eig_values_and_vectors(dtype: torch.dtype) -> None:
    a = nonsymmetric(4, 5, 5, dtype=dtype, seed=1)
    program = fx2onnx.export(Call(torch.linalg.eig), (a,))
    for seed in range(3):
        assert_eig_matches(program, nonsymmetric(4, 5, 5, dtype=dtype, seed=seed + 1))
    assert_eig_matches(
        program, nonsymmetric(4, 5, 5, dtype=dtype, seed=7) * (1e30 if dtype == torch.float32 else 1e200)
    )


def test_eig_with_repeated_eigenvalues() -> None:
    """The defective block and the identity (the repeated complex pair's eigenspace has no unique basis)."""
    a = repeated_eigenvalues()[[0, 2]]
    assert_eig_matches(fx2onnx.export(Call(torch.linalg.eig), (a,)), a)


def test_eig_refuses_a_symbolic_matrix_size() -> None:
    class Eigvals(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.linalg.eigvals(x)

    a = randn(2, 4, 4, dtype=torch.float64)
    size = torch.export.Dim("size")
    with pytest.raises(fx2onnx.errors.ExportError, match=r"(?s)linalg.eigvals.*static matrix size"):
        fx2onnx.export(Eigvals(), (a,), dynamic_shapes=({1: size, 2: size},))


# --- ops without a lowering yet: errors that name the op, why, and how to register one -----------------------------


def test_an_op_decomposed_into_an_effect_token_is_named_in_the_error() -> None:
    """Without its lowering, ldl_factor is decomposed and checks errors through an effect token: the error names
    ldl_factor itself, and how to keep it whole."""
    registry = fx2onnx.Registry.default()
    registry.unregister("aten::linalg_ldl_factor")
    with pytest.raises(CaptureError, match=r"(?s)aten.linalg_ldl_factor.*fx2onnx.register"):
        fx2onnx.export(Call(lambda x: tuple(torch.linalg.ldl_factor(x))), (randn(3, 3),), registry=registry)


# --- Bunch-Kaufman LDL^T: eager's LD, pivots and info are LAPACK sytf2's ------------------------------------------
# One 3x3 matrix per branch of sytf2's pivot choice (alpha = (1 + sqrt(17)) / 8), with the pivots eager gives.
LDL_BRANCHES = {
    "1x1 kept": ([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]], [1, 2, 3]),
    "1x1 kept by rowmax, then a last 2x2": ([[0.5, 1.0, 0.0], [1.0, 0.0, 10.0], [0.0, 10.0, 0.0]], [1, -3, -3]),
    "1x1 interchanged (0.6 < alpha)": ([[0.6, 1.0, 0.0], [1.0, 10.0, 0.0], [0.0, 0.0, 1.0]], [2, 2, 3]),
    "2x2 interchanged": ([[0.0, 1.0, 2.0], [1.0, 0.0, 3.0], [2.0, 3.0, 0.0]], [-3, -3, 3]),
    "zero column (info 1)": ([[0.0, 0.0, 0.0], [0.0, 2.0, 1.0], [0.0, 1.0, 0.0]], [1, 2, 3]),
}


def symmetric(*shape: int, dtype: torch.dtype, seed: int = 0, zero_diagonal: bool = False) -> torch.Tensor:
    """Random symmetric (indefinite) matrices; a zero diagonal forces 2x2 pivots."""
    a = randn(*shape, dtype=torch.float64, seed=seed)
    a = a + a.mT
    if zero_diagonal:
        a = a - torch.diag_embed(a.diagonal(dim1=-2, dim2=-1))
    return a.to(dtype)


def ldl_factor_ex(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(torch.linalg.ldl_factor_ex(a))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ldl_factor_takes_each_pivot_branch(dtype: torch.dtype) -> None:
    a = torch.tensor([matrix for matrix, _ in LDL_BRANCHES.values()], dtype=dtype)
    assert torch.linalg.ldl_factor_ex(a).pivots.tolist() == [pivots for _, pivots in LDL_BRANCHES.values()]
    assert torch.linalg.ldl_factor_ex(a).info.tolist() == [0, 0, 0, 0, 1]
    assert_exports_and_matches(Call(ldl_factor_ex), (a,))
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.ldl_factor(x, hermitian=True))), (a[:4],))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ldl_factor_random_symmetric(dtype: torch.dtype) -> None:
    """A batch of random indefinite matrices, half with a zero diagonal: pivots equal eager's, LD to rounding."""
    a = torch.cat(
        [symmetric(8, 6, 6, dtype=dtype, seed=1), symmetric(8, 6, 6, dtype=dtype, seed=2, zero_diagonal=True)]
    )
    pivots = torch.linalg.ldl_factor_ex(a).pivots
    assert (pivots < 0).any() and (pivots[:, 0] != 1).any()  # 2x2 blocks and interchanges
    assert_exports_and_matches(Call(ldl_factor_ex), (a,))
    assert_exports_and_matches(Call(lambda x: tuple(torch.linalg.ldl_factor(x))), (a[:3, :4, :4],))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ldl_factor_extreme_magnitudes(dtype: torch.dtype) -> None:
    """Entries near the dtype's largest and smallest normal values: the same pivots, LD, and info."""
    info = torch.finfo(dtype)
    base = symmetric(2, 4, 4, dtype=torch.float64, seed=4, zero_diagonal=True)
    a = torch.cat([(base * (info.max / 16)).to(dtype), (base * (info.tiny * 4)).to(dtype)])
    assert torch.linalg.ldl_factor_ex(a).LD.isfinite().all()
    assert_exports_and_matches(Call(ldl_factor_ex), (a,))


def test_ldl_factor_empty_and_single() -> None:
    assert_exports_and_matches(Call(ldl_factor_ex), (torch.zeros(0, 0),))
    assert_exports_and_matches(Call(ldl_factor_ex), (torch.zeros(0, 2, 2, dtype=torch.float64),))
    assert_exports_and_matches(Call(ldl_factor_ex), (torch.tensor([[[-2.0]], [[0.0]]]),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ldl_solve(dtype: torch.dtype) -> None:
    """sytrs from eager's factors, mixed 1x1 and 2x2 blocks in one batch, B broadcast against LD's batch."""
    a = torch.cat(
        [symmetric(2, 5, 5, dtype=dtype, seed=5), symmetric(2, 5, 5, dtype=dtype, seed=6, zero_diagonal=True)]
    )
    ld, pivots = torch.linalg.ldl_factor(a)
    assert (pivots < 0).any() and (pivots > 0).any()
    b = randn(4, 5, 3, dtype=dtype, seed=7)
    solve = Call(lambda x, p, y: torch.linalg.ldl_solve(x, p, y))
    assert_exports_and_matches(solve, (ld, pivots, b))
    assert_exports_and_matches(solve, (ld, pivots, b[0]))  # one B for every matrix
    branches = torch.tensor([matrix for matrix, _ in LDL_BRANCHES.values()][:4], dtype=dtype)
    ld, pivots = torch.linalg.ldl_factor(branches)
    assert_exports_and_matches(solve, (ld, pivots, randn(4, 3, 2, dtype=dtype, seed=8)))
    assert_exports_and_matches(solve, (torch.zeros(0, 0, dtype=dtype), torch.zeros(0, dtype=torch.int32), b[0, :0]))


def test_ldl_factor_then_solve_in_one_model() -> None:
    def factor_and_solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ld, pivots = torch.linalg.ldl_factor(a, hermitian=True)
        return torch.linalg.ldl_solve(ld, pivots, b, hermitian=True)

    a = symmetric(3, 4, 4, dtype=torch.float64, seed=9, zero_diagonal=True)
    assert_exports_and_matches(Call(factor_and_solve), (a, randn(3, 4, 2, dtype=torch.float64)))


def test_ldl_factor_refuses_what_it_cannot_match() -> None:
    """Above 64 columns LAPACK factors in blocked panels; a symbolic size cannot be unrolled: clear errors."""
    with pytest.raises(LoweringError, match=r"(?s)linalg_ldl_factor_ex.*65x65.*blocked panels"):
        fx2onnx.export(Call(ldl_factor_ex), (symmetric(65, 65, dtype=torch.float32),))
    size = torch.export.Dim("size", min=2, max=8)
    with pytest.raises(LoweringError, match=r"(?s)linalg_ldl_factor_ex.*static matrix size"):
        fx2onnx.export(
            Call(ldl_factor_ex), (symmetric(4, 4, dtype=torch.float32),), dynamic_shapes=(({0: size, 1: size},),)
        )
