"""Complex linear algebra through the real embedding of complex matrices.

A complex matrix A = X + iY acts on real vectors [re; im] as the real matrix E(A) = [[X, -Y], [Y, X]] of twice its
size. E maps sums, products, inverses, conjugate transposes (to transposes) and exponentials of complex matrices to
those of their embeddings, so ``inv``, ``solve``, ``pinv`` and ``matrix_exp`` of A are read from the same real
operation on E(A) (its left column of blocks), which the real lowerings compute. E(A)'s singular values (and, for a
Hermitian A, its eigenvalues) are A's, each twice: ``svdvals``, ``eigvalsh`` and ``matrix_rank`` keep one of each
pair. Used by :mod:`fx2onnx._passes.complex_parts` (a node of these ops with complex inputs becomes real ops).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from fx2onnx._torch_ops import aten, prims

Build = Any  # complex_parts._Builder (call, part, complex)


def _size(value: torch.fx.Node, dim: int) -> int:
    return int(value.meta["val"].shape[dim])


def embed(build: Build, matrix: torch.fx.Node) -> torch.fx.Node:
    """E(A) = [[X, -Y], [Y, X]] (..., 2n, 2m)."""
    x, y = build.part(matrix, 0), build.part(matrix, 1)
    top = build.call(aten.cat.default, [x, build.call(aten.neg.default, y)], -1)
    bottom = build.call(aten.cat.default, [y, x], -1)
    return build.call(aten.cat.default, [top, bottom], -2)


def _block(build: Build, value: torch.fx.Node, dim: int, start: int, stop: int) -> torch.fx.Node:
    return build.call(aten.slice.Tensor, value, dim, start, stop)


def unembed(build: Build, real: torch.fx.Node, rows: int, columns: int) -> torch.fx.Node:
    """The complex matrix whose embedding is `real` (..., 2 rows, 2 columns): its left column of blocks."""
    left = _block(build, real, -1, 0, columns)
    return build.complex(_block(build, left, -2, 0, rows), _block(build, left, -2, rows, 2 * rows))


def stack_parts(build: Build, value: torch.fx.Node, dim: int) -> torch.fx.Node:
    """[re; im] along `dim`: a right-hand side as E(A) multiplies it."""
    return build.call(aten.cat.default, [build.part(value, 0), build.part(value, 1)], dim)


def split_parts(build: Build, real: torch.fx.Node, dim: int) -> torch.fx.Node:
    half = int(real.meta["val"].shape[dim]) // 2
    return build.complex(_block(build, real, dim, 0, half), _block(build, real, dim, half, 2 * half))


def _transposed(build: Build, value: torch.fx.Node) -> torch.fx.Node:
    return build.call(aten.transpose.int, value, -2, -1)


# --- ops of one matrix, read from the same op on the embedding --------------------------------------------------------
def _on_embedding(target: Any, *extra: Any) -> Callable[[Build, torch.fx.Node], torch.fx.Node]:
    def rewrite(build: Build, node: torch.fx.Node) -> torch.fx.Node:
        matrix = node.args[0]
        result = build.call(target, embed(build, matrix), *node.args[1:], *extra, **node.kwargs)
        shape = node.meta["val"].shape
        return unembed(build, result, int(shape[-2]), int(shape[-1]))

    return rewrite


def _is_vector(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.linalg.solve's rule: B is a batch of vectors when it is 1-d or has A's shape without its last dim."""
    return b.dim() == 1 or (b.dim() == a.dim() - 1 and tuple(b.shape) == tuple(a.shape[:-1]))


def solve(build: Build, a: torch.fx.Node, b: torch.fx.Node, left: bool = True) -> torch.fx.Node:
    """A X = B (X A = B when not `left`: A^T X^T = B^T) as E(A) [Xr; Xi] = [Br; Bi]."""
    a_value, b_value = a.meta["val"], b.meta["val"]
    vector = _is_vector(a_value, b_value)
    if not left:
        a = _transposed(build, a)
        b = b if vector else _transposed(build, b)
    dim = -1 if vector else -2
    real = build.call(aten.linalg_solve.default, embed(build, a), stack_parts(build, b, dim))
    result = split_parts(build, real, dim)
    return result if (left or vector) else _transposed(build, result)


def _solve(build: Build, node: torch.fx.Node) -> torch.fx.Node:
    left = node.kwargs.get("left", node.args[2] if len(node.args) > 2 else True)
    return solve(build, node.args[0], node.args[1], left)


def _triangle(build: Build, a: torch.fx.Node, upper: bool, unit: bool) -> torch.fx.Node:
    """The triangle a triangular solve reads (with a unit diagonal when `unit`)."""
    triangle = aten.triu.default if upper else aten.tril.default
    offset = (1 if upper else -1) if unit else 0
    real, imag = (build.call(triangle, build.part(a, which), offset) for which in (0, 1))
    if unit:
        # the identity from comparing indices (aten.eye and diag_embed have no lowering: capture decomposes them)
        index = build.call(aten.arange.default, _size(a, -1))
        diagonal = build.call(aten.eq.Tensor, build.call(aten.unsqueeze.default, index, -1), index)
        eye = build.call(prims.convert_element_type.default, diagonal, real.meta["val"].dtype)
        real = build.call(aten.add.Tensor, real, eye)
    return build.complex(real, imag)


def _solve_triangular(build: Build, node: torch.fx.Node) -> torch.fx.Node:
    """linalg_solve_triangular(A, B, *, upper, left=True, unitriangular=False)."""
    a, b = node.args[:2]
    upper = node.kwargs.get("upper", node.args[2] if len(node.args) > 2 else None)
    left = node.kwargs.get("left", True)
    unit = node.kwargs.get("unitriangular", False)
    triangle = _triangle(build, a, bool(upper), bool(unit))
    if not left:  # X A = B: A^T X^T = B^T
        return _transposed(build, _matrix_solve(build, _transposed(build, triangle), _transposed(build, b)))
    return _matrix_solve(build, triangle, b)


def _matrix_solve(build: Build, a: torch.fx.Node, b: torch.fx.Node) -> torch.fx.Node:
    """A X = B for a matrix B (never read as vectors), with A's and B's batch dims broadcast."""
    a_value, b_value = a.meta["val"], b.meta["val"]
    batch = torch.broadcast_shapes(tuple(a_value.shape[:-2]), tuple(b_value.shape[:-2]))
    if 0 in b_value.shape[-2:]:  # nothing to solve for (ONNX Runtime's Concat refuses the empty embedding)
        shape = [*batch, *b_value.shape[-2:]]
        zeros = [build.call(aten.zeros.default, shape, dtype=b_value.dtype.to_real()) for _ in (0, 1)]
        return build.complex(*zeros)
    a = build.call(aten.expand.default, a, [*batch, *a_value.shape[-2:]])
    b = build.call(aten.expand.default, b, [*batch, *b_value.shape[-2:]])
    real = build.call(aten.linalg_solve.default, embed(build, a), stack_parts(build, b, -2))
    return split_parts(build, real, -2)


def _triangular_solve(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    """triangular_solve(b, A, upper=True, transpose=False, unitriangular=False) -> (solution, A)."""
    b, a = node.args[:2]
    options = ("upper", "transpose", "unitriangular")
    defaults = (True, False, False)
    upper, transpose, unit = (
        node.kwargs.get(name, node.args[2 + i] if len(node.args) > 2 + i else default)
        for i, (name, default) in enumerate(zip(options, defaults))
    )
    triangle = _triangle(build, a, bool(upper), bool(unit))
    if transpose:
        triangle = _transposed(build, triangle)
    return {0: _matrix_solve(build, triangle, b), 1: build.call(aten.clone.default, a)}


def _hermitian_product(build: Build, factor: torch.fx.Node, upper: bool) -> torch.fx.Node:
    """L L^H (or U^H U): the matrix a Cholesky factor stands for."""
    adjoint = build.call(aten.conj_physical.default, _transposed(build, factor))
    pair = (adjoint, factor) if upper else (factor, adjoint)
    return build.call(aten.matmul.default, *pair)


def _cholesky_solve(build: Build, node: torch.fx.Node) -> torch.fx.Node:
    b, factor = node.args[:2]
    upper = node.kwargs.get("upper", node.args[2] if len(node.args) > 2 else False)
    return _matrix_solve(build, _hermitian_product(build, factor, bool(upper)), b)


def _cholesky_inverse(build: Build, node: torch.fx.Node) -> torch.fx.Node:
    factor = node.args[0]
    upper = node.kwargs.get("upper", node.args[1] if len(node.args) > 1 else False)
    return build.call(aten.linalg_inv.default, _hermitian_product(build, factor, bool(upper)))


def _tensorinv(build: Build, node: torch.fx.Node) -> torch.fx.Node:
    value = node.args[0]
    index = node.kwargs.get("ind", node.args[1] if len(node.args) > 1 else 2)
    shape = [int(s) for s in value.meta["val"].shape]
    rows = 1
    for size in shape[:index]:
        rows *= size
    square = build.call(aten.view.default, value, [rows, -1])
    return build.call(aten.view.default, build.call(aten.linalg_inv.default, square), shape[index:] + shape[:index])


# --- tuple results ----------------------------------------------------------------------------------------------------
def _inv_ex(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    real = build.call(aten.linalg_inv_ex.default, embed(build, node.args[0]))
    n = _size(node.args[0], -1)
    return {0: unembed(build, build.call(operator.getitem, real, 0), n, n), 1: build.call(operator.getitem, real, 1)}


def _solve_ex(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    """_linalg_solve_ex -> (result, LU, pivots, info): the result and info (E(A) is singular where A is)."""
    a, b = node.args[:2]
    left = node.kwargs.get("left", node.args[2] if len(node.args) > 2 else True)
    info = build.call(operator.getitem, build.call(aten.linalg_inv_ex.default, embed(build, a)), 1)
    return {0: solve(build, a, b, bool(left)), 3: info}


def _hermitian(build: Build, a: torch.fx.Node, upper: bool) -> torch.fx.Node:
    """The Hermitian matrix eager reads from A's lower (or upper) triangle (the diagonal's real part)."""
    x, y = build.part(a, 0), build.part(a, 1)
    triangle = aten.triu.default if upper else aten.tril.default
    strict = 1 if upper else -1
    real = build.call(aten.add.Tensor, build.call(triangle, x), _transposed(build, build.call(triangle, x, strict)))
    half = build.call(triangle, y, strict)
    imag = build.call(aten.sub.Tensor, half, _transposed(build, half))
    return build.complex(real, imag)


def _pairs(build: Build, values: torch.fx.Node) -> torch.fx.Node:
    """One of each equal pair of a sorted (..., 2k) real tensor."""
    size = int(values.meta["val"].shape[-1])
    return build.call(aten.slice.Tensor, values, -1, 0, size, 2)


def _eigh(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node] | None:
    """_linalg_eigh(A, UPLO, compute_v) -> (eigenvalues, eigenvectors): the eigenvalues (the eigenvectors' phases are
    LAPACK's choice, not the embedding's)."""
    uplo = node.kwargs.get("UPLO", node.args[1] if len(node.args) > 1 else "L")
    hermitian = _hermitian(build, node.args[0], uplo == "U")
    real = build.call(aten._linalg_eigh.default, embed(build, hermitian), "L", False)
    return {0: _pairs(build, build.call(operator.getitem, real, 0))}


def _svd(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node] | None:
    """_linalg_svd(A, full_matrices, compute_uv, driver) -> (U, S, Vh): the singular values."""
    real = build.call(aten._linalg_svd.default, embed(build, node.args[0]), False, False)
    return {1: _pairs(build, build.call(operator.getitem, real, 1))}


COMPOSITES: dict[Any, Callable[[Build, torch.fx.Node], torch.fx.Node]] = {
    aten.linalg_inv.default: _on_embedding(aten.linalg_inv.default),
    aten.linalg_matrix_exp.default: _on_embedding(aten.linalg_matrix_exp.default),
    aten.linalg_pinv.atol_rtol_tensor: _on_embedding(aten.linalg_pinv.atol_rtol_tensor),
    aten.linalg_pinv.atol_rtol_float: _on_embedding(aten.linalg_pinv.atol_rtol_float),
    aten.linalg_solve.default: _solve,
    aten.linalg_solve_triangular.default: _solve_triangular,
    aten.cholesky_solve.default: _cholesky_solve,
    aten.cholesky_inverse.default: _cholesky_inverse,
    aten.linalg_tensorinv.default: _tensorinv,
}
# Ops returning tuples: the results they can give (by index); rewritten when their users take only those.
TUPLES: dict[Any, Callable[[Build, torch.fx.Node], dict[int, torch.fx.Node] | None]] = {
    aten.linalg_inv_ex.default: _inv_ex,
    aten._linalg_solve_ex.default: _solve_ex,
    aten.triangular_solve.default: _triangular_solve,
    aten._linalg_eigh.default: _eigh,
    aten._linalg_svd.default: _svd,
}
# What each tuple op can give: its users must take nothing else.
TUPLE_RESULTS: dict[Any, set[int]] = {
    aten.linalg_inv_ex.default: {0, 1},
    aten._linalg_solve_ex.default: {0, 3},
    aten.triangular_solve.default: {0, 1},
    aten._linalg_eigh.default: {0},
    aten._linalg_svd.default: {1},
}


# --- LU factorization with partial pivoting, on the parts ------------------------------------------------------------
# E(A) has no complex LU to read, so the factorization is unrolled here (the sizes are static), as LAPACK's getrf
# computes it: at step k the row with the largest |re| + |im| in column k (the first, on ties: izamax) is swapped into
# row k, the rows below are reduced by multiples of it, and the multipliers kept below the diagonal.
class _Lu:
    def __init__(self, build: Build, a: torch.fx.Node) -> None:
        self.build = build
        shape = [int(s) for s in a.meta["val"].shape]
        self.batch, (self.m, self.n) = shape[:-2], shape[-2:]
        self.rows = build.call(aten.arange.default, self.m)
        self.columns = build.call(aten.arange.default, self.n)
        self.real, self.imag = build.part(a, 0), build.part(a, 1)
        self.order = build.call(aten.expand.default, self.rows, [*self.batch, self.m])  # rows of A in LU's order
        self.pivots: list[torch.fx.Node] = []  # (..., 1) int64, 0-based
        for k in range(min(self.m, self.n)):
            self._step(k)

    def call(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node:
        return self.build.call(target, *args, **kwargs)

    def _swap(self, k: int, pivot: torch.fx.Node) -> None:
        """Rows k and `pivot` (..., 1) exchanged, in both parts and in the row order."""
        at = self.call(aten.eq.Scalar, self.rows, k)
        at_pivot = self.call(aten.eq.Tensor, self.rows, pivot)
        index = self.call(
            aten.where.self,
            at,
            self.call(aten.expand.default, pivot, [*self.batch, self.m]),
            self.call(aten.where.self, at_pivot, self.call(aten.full_like.default, self.rows, k), self.rows),
        )
        matrix_index = self.call(
            aten.expand.default, self.call(aten.unsqueeze.default, index, -1), [*self.batch, self.m, self.n]
        )
        self.real = self.call(aten.gather.default, self.real, -2, matrix_index)
        self.imag = self.call(aten.gather.default, self.imag, -2, matrix_index)
        self.order = self.call(aten.gather.default, self.order, -1, index)

    def _step(self, k: int) -> None:
        column = [self.call(aten.select.int, part, -1, k) for part in (self.real, self.imag)]
        score = self.call(aten.add.Tensor, *(self.call(aten.abs.default, c) for c in column))
        candidate = self.call(aten.ge.Scalar, self.rows, k)
        score = self.call(aten.where.self, candidate, score, self.call(aten.full_like.default, score, -1.0))
        pivot = self.call(aten.argmax.default, score, -1, True)
        self.pivots.append(pivot)
        self._swap(k, pivot)
        column = [self.call(aten.select.int, part, -1, k) for part in (self.real, self.imag)]  # (..., m)
        row = [self.call(aten.select.int, part, -2, k) for part in (self.real, self.imag)]  # (..., n)
        head = [self.call(aten.unsqueeze.default, self.call(aten.select.int, r, -1, k), -1) for r in row]
        # multipliers: column / pivot, and the column itself (zeros) where the pivot is 0, as LAPACK skips it
        scale = self.call(aten.add.Tensor, *(self.call(aten.mul.Tensor, h, h) for h in head))
        product = (
            self.call(
                aten.add.Tensor,
                self.call(aten.mul.Tensor, column[0], head[0]),
                self.call(aten.mul.Tensor, column[1], head[1]),
            ),
            self.call(
                aten.sub.Tensor,
                self.call(aten.mul.Tensor, column[1], head[0]),
                self.call(aten.mul.Tensor, column[0], head[1]),
            ),
        )
        singular = self.call(aten.eq.Scalar, scale, 0)
        below = self.call(aten.gt.Scalar, self.rows, k)
        multiplier = []
        for part, c in zip(product, column):
            value = self.call(aten.where.self, singular, c, self.call(aten.div.Tensor, part, scale))
            multiplier.append(self.call(aten.where.self, below, value, self.call(aten.zeros_like.default, value)))
        right = self.call(aten.gt.Scalar, self.columns, k)
        row = [self.call(aten.where.self, right, r, self.call(aten.zeros_like.default, r)) for r in row]
        left = [self.call(aten.unsqueeze.default, v, -1) for v in multiplier]  # (..., m, 1)
        top = [self.call(aten.unsqueeze.default, r, -2) for r in row]  # (..., 1, n)
        update_real = self.call(
            aten.sub.Tensor, self.call(aten.mul.Tensor, left[0], top[0]), self.call(aten.mul.Tensor, left[1], top[1])
        )
        update_imag = self.call(
            aten.add.Tensor, self.call(aten.mul.Tensor, left[0], top[1]), self.call(aten.mul.Tensor, left[1], top[0])
        )
        self.real = self.call(aten.sub.Tensor, self.real, update_real)
        self.imag = self.call(aten.sub.Tensor, self.imag, update_imag)
        stored = self.call(
            aten.logical_and.default,
            self.call(aten.unsqueeze.default, below, -1),
            self.call(aten.eq.Scalar, self.columns, k),
        )
        self.real = self.call(aten.where.self, stored, left[0], self.real)
        self.imag = self.call(aten.where.self, stored, left[1], self.imag)

    def factors(self) -> torch.fx.Node:
        return self.build.complex(self.real, self.imag)

    def lapack_pivots(self) -> torch.fx.Node:
        """LAPACK's 1-based int32 pivots (..., min(m, n))."""
        if not self.pivots:
            empty = self.call(aten.zeros.default, [*self.batch, 0], dtype=torch.int64)
            return self.call(prims.convert_element_type.default, empty, torch.int32)
        stacked = self.call(aten.cat.default, self.pivots, -1)
        return self.call(prims.convert_element_type.default, self.call(aten.add.Tensor, stacked, 1), torch.int32)

    def diagonal(self, k: int) -> tuple[torch.fx.Node, torch.fx.Node]:
        return tuple(
            self.call(aten.select.int, self.call(aten.select.int, p, -1, k), -1, k) for p in (self.real, self.imag)
        )  # type: ignore[return-value]

    def odd(self) -> torch.fx.Node | None:
        """Whether the row exchanges make an odd permutation (..., bool), None without any."""
        parity = None
        for k, pivot in enumerate(self.pivots):
            swapped = self.call(aten.ne.Scalar, self.call(aten.squeeze.dim, pivot, -1), k)
            parity = swapped if parity is None else self.call(aten.logical_xor.default, parity, swapped)
        return parity

    def permutation(self, dtype: torch.dtype) -> torch.fx.Node:
        """P with A = P L U: P[r, i] = 1 where row i of LU is row r of A."""
        matches = self.call(
            aten.eq.Tensor,
            self.call(aten.unsqueeze.default, self.rows, -1),
            self.call(aten.unsqueeze.default, self.order, -2),
        )
        real = self.call(prims.convert_element_type.default, matches, dtype.to_real())
        return self.build.complex(real, self.call(aten.zeros_like.default, real))


def _determinant_parts(build: Build, a: torch.fx.Node) -> tuple[Any, Any, Any]:
    """(det's real part, imaginary part, sum of log |u_kk|) of a square complex matrix."""
    from fx2onnx._passes.complex_functions import Real, multiply

    lu = _Lu(build, a)
    component = a.meta["val"].dtype.to_real()
    batch = lu.batch
    one = Real(build, build.call(aten.ones.default, batch, dtype=component))
    det = (one, one.full(0.0))
    log_magnitude = one.full(0.0)
    for k in range(lu.n):
        real, imag = (Real(build, v) for v in lu.diagonal(k))
        det = multiply(det, (real, imag))
        log_magnitude = log_magnitude + (real * real + imag * imag).log() * 0.5
    odd = lu.odd()
    if odd is not None:
        sign = one.full(1.0).where(Real(build, build.call(aten.logical_not.default, odd)), -1.0)
        det = (det[0] * sign, det[1] * sign)
    return det[0], det[1], log_magnitude


def _det(build: Build, node: torch.fx.Node) -> torch.fx.Node:
    real, imag, _ = _determinant_parts(build, node.args[0])
    return build.complex(real.node, imag.node)


def _slogdet_parts(build: Build, a: torch.fx.Node) -> tuple[torch.fx.Node, Any]:
    real, imag, log_magnitude = _determinant_parts(build, a)
    magnitude = (real * real + imag * imag).sqrt()
    zero = magnitude.eq(0)
    sign = build.complex((real / magnitude).where(~zero, 0.0).node, (imag / magnitude).where(~zero, 0.0).node)
    return sign, log_magnitude


def _slogdet(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    """linalg_slogdet -> (sign, logabsdet)."""
    sign, log_magnitude = _slogdet_parts(build, node.args[0])
    return {0: sign, 1: log_magnitude.node}


def _logdet(build: Build, node: torch.fx.Node) -> torch.fx.Node:
    """log det A = log |det A| + i arg det A (-inf + 0i for a singular A)."""
    real, imag, log_magnitude = _determinant_parts(build, node.args[0])
    return build.complex(log_magnitude.node, imag.atan2(real).node)


def _lu_factor_ex(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    """linalg_lu_factor_ex -> (LU, pivots, info); info 0 (eager's counts a zero pivot, which the checks ignore)."""
    lu = _Lu(build, node.args[0])
    info = build.call(aten.zeros.default, lu.batch, dtype=torch.int32)
    return {0: lu.factors(), 1: lu.lapack_pivots(), 2: info}


def _lu_factor(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    lu = _Lu(build, node.args[0])
    return {0: lu.factors(), 1: lu.lapack_pivots()}


def _unpacked(build: Build, factors: torch.fx.Node, m: int, n: int) -> tuple[torch.fx.Node, torch.fx.Node]:
    """L (m, k) with a unit diagonal and U (k, n) from packed factors, k = min(m, n)."""
    k = min(m, n)
    lower_block = build.call(aten.slice.Tensor, factors, -1, 0, k)
    upper_block = build.call(aten.slice.Tensor, factors, -2, 0, k)
    real, imag = (build.call(aten.tril.default, build.part(lower_block, w), -1) for w in (0, 1))
    rows = build.call(aten.arange.default, m)
    columns = build.call(aten.arange.default, k)
    eye = build.call(aten.eq.Tensor, build.call(aten.unsqueeze.default, rows, -1), columns)
    real = build.call(
        aten.add.Tensor, real, build.call(prims.convert_element_type.default, eye, real.meta["val"].dtype)
    )
    lower = build.complex(real, imag)
    upper = build.complex(*(build.call(aten.triu.default, build.part(upper_block, w)) for w in (0, 1)))
    return lower, upper


def _linalg_lu(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    """linalg_lu -> (P, L, U)."""
    lu = _Lu(build, node.args[0])
    lower, upper = _unpacked(build, lu.factors(), lu.m, lu.n)
    return {0: lu.permutation(node.args[0].meta["val"].dtype), 1: lower, 2: upper}


class _Pivoted:
    """The row order of given LAPACK pivots (values known only at run time)."""

    def __init__(self, build: Build, pivots: torch.fx.Node, m: int) -> None:
        self.build = build
        batch = [int(s) for s in pivots.meta["val"].shape[:-1]]
        count = int(pivots.meta["val"].shape[-1])
        rows = build.call(aten.arange.default, m)
        order = build.call(aten.expand.default, rows, [*batch, m])
        zero_based = build.call(aten.sub.Tensor, build.call(prims.convert_element_type.default, pivots, torch.int64), 1)
        for k in range(count):
            pivot = build.call(aten.unsqueeze.default, build.call(aten.select.int, zero_based, -1, k), -1)
            at = build.call(aten.eq.Scalar, rows, k)
            at_pivot = build.call(aten.eq.Tensor, rows, pivot)
            index = build.call(
                aten.where.self,
                at,
                build.call(aten.expand.default, pivot, [*batch, m]),
                build.call(aten.where.self, at_pivot, build.call(aten.full_like.default, rows, k), rows),
            )
            order = build.call(aten.gather.default, order, -1, index)
        self.rows, self.order = rows, order

    def permutation(self, dtype: torch.dtype) -> torch.fx.Node:
        build = self.build
        matches = build.call(
            aten.eq.Tensor,
            build.call(aten.unsqueeze.default, self.rows, -1),
            build.call(aten.unsqueeze.default, self.order, -2),
        )
        real = build.call(prims.convert_element_type.default, matches, dtype.to_real())
        return build.complex(real, build.call(aten.zeros_like.default, real))


def _lu_unpack(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    """lu_unpack(LU, pivots, unpack_data=True, unpack_pivots=True) -> (P, L, U)."""
    factors, pivots = node.args[:2]
    m, n = (int(s) for s in factors.meta["val"].shape[-2:])
    lower, upper = _unpacked(build, factors, m, n)
    permutation = _Pivoted(build, pivots, m).permutation(factors.meta["val"].dtype)
    return {0: permutation, 1: lower, 2: upper}


def _lu_solve(build: Build, node: torch.fx.Node) -> torch.fx.Node:
    """linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False): A = P L U rebuilt, then solved by E(A)."""
    factors, pivots, b = node.args[:3]
    left, adjoint = node.kwargs.get("left", True), node.kwargs.get("adjoint", False)
    n = int(factors.meta["val"].shape[-1])
    lower, upper = _unpacked(build, factors, n, n)
    permutation = _Pivoted(build, pivots, n).permutation(factors.meta["val"].dtype)
    a = build.call(aten.matmul.default, permutation, build.call(aten.matmul.default, lower, upper))
    if adjoint:
        a = build.call(aten.conj_physical.default, _transposed(build, a))
    if left:
        return _matrix_solve(build, a, b)
    return _transposed(build, _matrix_solve(build, _transposed(build, a), _transposed(build, b)))


COMPOSITES.update(
    {
        aten.linalg_det.default: _det,
        aten.logdet.default: _logdet,
        aten.linalg_lu_solve.default: _lu_solve,
    }
)
TUPLES.update(
    {
        aten.linalg_slogdet.default: _slogdet,
        aten._linalg_slogdet.default: lambda build, node: {**_slogdet(build, node)},
        aten.linalg_lu_factor_ex.default: _lu_factor_ex,
        aten.linalg_lu_factor.default: _lu_factor,
        aten.linalg_lu.default: _linalg_lu,
        aten.lu_unpack.default: _lu_unpack,
    }
)
TUPLE_RESULTS.update(
    {
        aten.linalg_slogdet.default: {0, 1},
        aten._linalg_slogdet.default: {0, 1},
        aten.linalg_lu_factor_ex.default: {0, 1, 2},
        aten.linalg_lu_factor.default: {0, 1},
        aten.linalg_lu.default: {0, 1, 2},
        aten.lu_unpack.default: {0, 1, 2},
    }
)


# --- Cholesky, unrolled on the parts --------------------------------------------------------------------------------
def _cholesky_lower(build: Build, a: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node]:
    """L with A = L L^H, column by column from A's lower triangle: L[j, j] = sqrt(A[j, j] - sum_k |L[j, k]|^2) and
    L[i, j] = (A[i, j] - sum_k L[i, k] conj(L[j, k])) / L[j, j] below it."""
    n = _size(a, -1)
    x, y = build.part(a, 0), build.part(a, 1)
    lower = [build.call(aten.zeros_like.default, x), build.call(aten.zeros_like.default, y)]
    rows = build.call(aten.arange.default, n)
    for j in range(n):
        row = [
            build.call(aten.unsqueeze.default, build.call(aten.select.int, p, -2, j), -1) for p in lower
        ]  # (..., n, 1)
        products = {(p, q): build.call(aten.matmul.default, lower[p], row[q]) for p in (0, 1) for q in (0, 1)}
        sum_real = build.call(aten.add.Tensor, products[0, 0], products[1, 1])  # L conj(row)
        sum_imag = build.call(aten.sub.Tensor, products[1, 0], products[0, 1])
        column = [
            build.call(
                aten.sub.Tensor, build.call(aten.select.int, part, -1, j), build.call(aten.squeeze.dim, total, -1)
            )
            for part, total in ((x, sum_real), (y, sum_imag))
        ]
        pivot = build.call(aten.sqrt.default, build.call(aten.select.int, column[0], -1, j))  # (...,)
        scale = build.call(aten.unsqueeze.default, pivot, -1)
        below = build.call(aten.gt.Scalar, rows, j)
        at = build.call(aten.eq.Scalar, rows, j)
        values = [
            build.call(
                aten.where.self,
                below,
                build.call(aten.div.Tensor, column[0], scale),
                build.call(
                    aten.where.self,
                    at,
                    build.call(aten.expand_as.default, scale, column[0]),
                    build.call(aten.zeros_like.default, column[0]),
                ),
            ),
            build.call(
                aten.where.self,
                below,
                build.call(aten.div.Tensor, column[1], scale),
                build.call(aten.zeros_like.default, column[1]),
            ),
        ]
        at_column = build.call(aten.eq.Scalar, rows, j)
        lower = [
            build.call(aten.where.self, at_column, build.call(aten.unsqueeze.default, v, -1), part)
            for v, part in zip(values, lower)
        ]
    return lower[0], lower[1]


def _cholesky_factor(build: Build, a: torch.fx.Node, upper: bool) -> torch.fx.Node:
    """L (or U = L^H, from A's upper triangle: the lower one of A^H)."""
    source = build.call(aten.conj_physical.default, _transposed(build, a)) if upper else a
    factor = build.complex(*_cholesky_lower(build, source))
    return build.call(aten.conj_physical.default, _transposed(build, factor)) if upper else factor


def _cholesky(build: Build, node: torch.fx.Node) -> torch.fx.Node:
    upper = node.kwargs.get("upper", node.args[1] if len(node.args) > 1 else False)
    return _cholesky_factor(build, node.args[0], bool(upper))


def _cholesky_ex(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    """linalg_cholesky_ex -> (L, info); info 0 (a matrix that is not positive-definite gives NaN in L)."""
    upper = node.kwargs.get("upper", node.args[1] if len(node.args) > 1 else False)
    batch = [int(s) for s in node.args[0].meta["val"].shape[:-2]]
    info = build.call(aten.zeros.default, batch, dtype=torch.int32)
    return {0: _cholesky_factor(build, node.args[0], bool(upper)), 1: info}


COMPOSITES[aten.linalg_cholesky.default] = _cholesky
COMPOSITES[aten.cholesky.default] = _cholesky  # the deprecated torch.cholesky's op (a MissingOverload in torch 2.15)
TUPLES[aten.linalg_cholesky_ex.default] = _cholesky_ex
TUPLE_RESULTS[aten.linalg_cholesky_ex.default] = {0, 1}


# --- singular values by a complex one-sided Jacobi --------------------------------------------------------------------
# E(A) doubles the size that the real lowerings' unrolled Jacobi works on (a 10 x 10 export takes minutes), so the
# singular values of a complex A come from Hestenes' one-sided Jacobi on A's own columns, in float64: a pair of
# columns is made orthogonal by turning the second by the phase of their inner product (which makes it real) and
# then rotating the pair as the real algorithm does. The columns' norms are the singular values; V accumulates the
# same rotations (A V = C), so pinv(A) = V diag(1/s^2) C^H.
_JACOBI_SWEEPS = 6


def _jacobi(build: Build, a: torch.fx.Node, with_vectors: bool) -> tuple[list[Any], list[Any]]:
    """A's columns made orthogonal (C = A V), as (real, imag) pairs (..., m, 1), and V's columns (..., n, 1)."""
    from fx2onnx._passes.complex_functions import Real, parts

    real, imag = parts(build, a)  # float64
    n = _size(a, -1)
    columns = [
        (real.apply(aten.slice.Tensor, -1, j, j + 1), imag.apply(aten.slice.Tensor, -1, j, j + 1)) for j in range(n)
    ]
    vectors: list[Any] = []
    if with_vectors:
        batch = [int(s) for s in a.meta["val"].shape[:-2]]
        index = Real(build, build.call(aten.arange.default, n))
        for j in range(n):
            unit = index.eq(float(j)).to(torch.float64).apply(aten.unsqueeze.default, -1)
            unit = unit.apply(aten.expand.default, [*batch, n, 1])
            vectors.append((unit, unit.full(0.0)))
    zero = real.full(0.0).apply(aten.sum.dim_IntList, [-2], True)
    one = zero + 1.0  # (..., 1, n): the constants the rotations select from (plain Wheres: no signed zeros here)

    def select(condition: Any, chosen: Any, otherwise: Any) -> Any:
        return Real(build, build.call(aten.where.self, condition.node, chosen.node, otherwise.node))

    for _ in range(_JACOBI_SWEEPS):
        for p in range(n):
            for q in range(p + 1, n):
                (pr, pi), (qr, qi) = columns[p], columns[q]
                alpha = (pr * pr + pi * pi).apply(aten.sum.dim_IntList, [-2], True)
                beta = (qr * qr + qi * qi).apply(aten.sum.dim_IntList, [-2], True)
                gamma_real = (pr * qr + pi * qi).apply(aten.sum.dim_IntList, [-2], True)
                gamma_imag = (pr * qi - pi * qr).apply(aten.sum.dim_IntList, [-2], True)
                size = (gamma_real * gamma_real + gamma_imag * gamma_imag).sqrt()
                rotate = size > 0.0
                safe = select(rotate, size, _column(one, 0))
                phase = (select(rotate, gamma_real / safe, _column(one, 0)), gamma_imag / safe)
                zeta = (beta - alpha) / (safe * 2.0)
                t = zeta.sign().apply(aten.add.Tensor, (zeta.eq(0.0)).to(torch.float64)) / (
                    zeta.abs() + (zeta * zeta + 1.0).sqrt()
                )
                c = 1.0 / (t * t + 1.0).sqrt()
                s = select(rotate, c * t, _column(zero, 0))
                c = select(rotate, c, _column(one, 0))

                def turn(first: Any, second: Any, c: Any = c, s: Any = s, phase: Any = phase) -> tuple[Any, Any]:
                    # second * conj(phase), then the real rotation of the pair
                    turned = (
                        second[0] * phase[0] + second[1] * phase[1],
                        second[1] * phase[0] - second[0] * phase[1],
                    )
                    return (
                        (c * first[0] - s * turned[0], c * first[1] - s * turned[1]),
                        (s * first[0] + c * turned[0], s * first[1] + c * turned[1]),
                    )

                columns[p], columns[q] = turn(columns[p], columns[q])
                if with_vectors:
                    vectors[p], vectors[q] = turn(vectors[p], vectors[q])
    return columns, vectors


def _column(value: Any, j: int) -> Any:
    return value.apply(aten.slice.Tensor, -1, j, j + 1)


def _norms(columns: list[Any]) -> list[Any]:
    return [(r * r + i * i).apply(aten.sum.dim_IntList, [-2], False).sqrt() for r, i in columns]  # (..., 1)


def _descending(build: Build, values: list[Any]) -> Any:
    from fx2onnx._passes.complex_functions import Real

    stacked = Real(build, build.call(aten.cat.default, [v.node for v in values], -1))
    return Real(build, build.call(operator.getitem, build.call(aten.sort.default, stacked.node, -1, True), 0))


def _tall(build: Build, a: torch.fx.Node) -> torch.fx.Node:
    """A, or A^H when A is wide (the same singular values)."""
    if _size(a, -2) >= _size(a, -1):
        return a
    return build.call(aten.conj_physical.default, _transposed(build, a))


def _singular_values(build: Build, a: torch.fx.Node) -> Any:
    """Descending, float64 (..., min(m, n))."""
    columns, _ = _jacobi(build, _tall(build, a), with_vectors=False)
    return _descending(build, _norms(columns))


def _svdvals(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    a = node.args[0]
    if 0 in [int(s) for s in a.meta["val"].shape]:
        raise _Unhandled
    component = a.meta["val"].dtype.to_real()
    return {1: _singular_values(build, a).to(component).node}


def _eigvalsh(build: Build, node: torch.fx.Node) -> dict[int, torch.fx.Node]:
    """Ascending eigenvalues of the Hermitian matrix A's triangle gives: the singular values of H + cI (c = |H| + 1
    makes it positive-definite) less c, as the real lowering computes them."""
    from fx2onnx._passes.complex_functions import Real

    a = node.args[0]
    if 0 in [int(s) for s in a.meta["val"].shape]:
        raise _Unhandled
    uplo = node.kwargs.get("UPLO", node.args[1] if len(node.args) > 1 else "L")
    hermitian = _hermitian(build, a, uplo == "U")
    n = _size(a, -1)
    x, y = build.part(hermitian, 0), build.part(hermitian, 1)
    wide_x = Real(build, x).to(torch.float64)
    wide_y = Real(build, y).to(torch.float64)
    shift = (wide_x * wide_x + wide_y * wide_y).apply(aten.sum.dim_IntList, [-2, -1], True).sqrt() + 1.0
    index = Real(build, build.call(aten.arange.default, n))
    eye = index.apply(aten.unsqueeze.default, -1).eq(index).to(torch.float64)
    shifted = build.complex((wide_x + shift * eye).node, wide_y.node)
    values = _singular_values(build, shifted) - shift.apply(aten.squeeze.dim, -1)
    ascending = values.apply(aten.flip.default, [-1])
    return {0: ascending.to(a.meta["val"].dtype.to_real()).node}


def _pinv(build: Build, node: torch.fx.Node) -> torch.fx.Node:
    """Eager's formula: V diag(1/s where s > max(atol, rtol * s_max), else 0) U^H, from the Jacobi's V and C = U S."""
    from fx2onnx._passes.complex_functions import Real

    a = node.args[0]
    shape = [int(s) for s in a.meta["val"].shape]
    if 0 in shape:
        raise _Unhandled
    atol = node.kwargs.get("atol", node.args[1] if len(node.args) > 1 else None)
    rtol = node.kwargs.get("rtol", node.args[2] if len(node.args) > 2 else None)
    hermitian = node.kwargs.get("hermitian", node.args[3] if len(node.args) > 3 else False)
    m, n = shape[-2:]
    source = _hermitian(build, a, upper=False) if hermitian else a
    wide = m < n
    tall = _tall(build, source)
    columns, vectors = _jacobi(build, tall, with_vectors=True)
    norms = _norms(columns)  # (..., 1) each
    largest = norms[0]
    for value in norms[1:]:
        largest = largest.apply(aten.maximum.default, value)

    def as_tolerance(value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            return Real(build, value).to(torch.float64).apply(aten.unsqueeze.default, -1)
        return largest.full(float(value))

    if rtol is None:  # eager's default: eps * max(m, n), or 0 where a positive atol is given
        epsilon = float(torch.finfo(a.meta["val"].dtype.to_real()).eps)
        rtol_value = largest.full(epsilon * max(m, n))
        if atol is not None:
            rtol_value = rtol_value.where(~(as_tolerance(atol) > 0.0), 0.0)
    else:
        rtol_value = as_tolerance(rtol)
    tolerance = rtol_value * largest
    if atol is not None:
        tolerance = tolerance.apply(aten.maximum.default, as_tolerance(atol))
    total: Any = None
    for (cr, ci), (vr, vi), norm in zip(columns, vectors, norms):
        keep = norm > tolerance
        weight = (1.0 / (norm * norm).where(keep, 1.0)).where(keep, 0.0).apply(aten.unsqueeze.default, -1)
        # v c^H / s^2: (..., n, 1) x (..., 1, m)
        row_r, row_i = (p.apply(aten.transpose.int, -2, -1) for p in (cr, ci))
        term = (
            (vr.apply(aten.matmul.default, row_r) + vi.apply(aten.matmul.default, row_i)) * weight,
            (vi.apply(aten.matmul.default, row_r) - vr.apply(aten.matmul.default, row_i)) * weight,
        )
        total = term if total is None else (total[0] + term[0], total[1] + term[1])
    component = a.meta["val"].dtype.to_real()
    result = build.complex(total[0].to(component).node, total[1].to(component).node)
    return build.call(aten.conj_physical.default, _transposed(build, result)) if wide else result


class _Unhandled(Exception):
    """An input these rewrites do not take (an empty matrix): the previous rule applies."""


_EMBEDDED_PINV = COMPOSITES[aten.linalg_pinv.atol_rtol_tensor]
_EMBEDDED_EIGH = TUPLES[aten._linalg_eigh.default]
_EMBEDDED_SVD = TUPLES[aten._linalg_svd.default]


def _first(*rules: Callable[[Build, torch.fx.Node], Any]) -> Callable[[Build, torch.fx.Node], Any]:
    def rewrite(build: Build, node: torch.fx.Node) -> Any:
        for rule in rules[:-1]:
            try:
                return rule(build, node)
            except _Unhandled:
                continue
        return rules[-1](build, node)

    return rewrite


COMPOSITES[aten.linalg_pinv.atol_rtol_tensor] = _first(_pinv, _EMBEDDED_PINV)
COMPOSITES[aten.linalg_pinv.atol_rtol_float] = _first(_pinv, COMPOSITES[aten.linalg_pinv.atol_rtol_float])
TUPLES[aten._linalg_eigh.default] = _first(_eigvalsh, _EMBEDDED_EIGH)
TUPLES[aten._linalg_svd.default] = _first(_svdvals, _EMBEDDED_SVD)
