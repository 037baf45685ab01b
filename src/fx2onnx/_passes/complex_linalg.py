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

aten = torch.ops.aten

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
        eye = build.call(torch.ops.prims.convert_element_type.default, diagonal, real.meta["val"].dtype)
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
