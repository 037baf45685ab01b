"""Linear algebra on static matrix sizes: factorizations and solves (LU, Cholesky, LDL/Bunch-Kaufman, triangular,
QR), inverses (inv, tensorinv, pinv), slogdet, least squares, the matrix exponential. SVD and eigen
decompositions are in linalg_eigen.py, matrix products in matrix_products.py.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import onnx_ir as ir
from onnxscript import BOOL, DOUBLE, FLOAT, INT32, INT64
from onnxscript import opset18 as op

from fx2onnx._lowerings._matrix_builders import (
    _batch_filled,
    _columns,
    _index_column,
    _index_row,
    _ints,
    _rows,
    _scalar_like,
    _transpose,
)
from fx2onnx._lowerings.builders import TFloat, _double
from fx2onnx._lowerings.linalg_eigen import _eigh, _svd, _svd_tall
from fx2onnx._lowerings.rules import lowering


# --- dense linear algebra on static matrix sizes ----------------------------------------------------------------
# ONNX has no factorizations; with the matrix sizes known at export, each is unrolled into its n steps, each
# step a few whole-tensor ops over every batch at once. Partial pivoting picks the first largest magnitude in the
# column, as LAPACK's getrf does, so that pivots, P and the packed LU agree with eager's.
def _lu_steps(a: TFloat, pivot: bool = True) -> tuple[TFloat, INT64, list[INT64], list[TFloat]]:
    """Gaussian elimination with partial pivoting on [..., m, n].

    Returns the packed LU (U on and above the diagonal, L's multipliers below), the row permutation as a
    [..., m, 1] gather index (A[perm] = L U), the 0-based pivot row of each step ([..., 1, 1] each) and each
    step's pivot value ([..., 1, 1]).
    """
    m, n = a.shape[-2], a.shape[-1]
    rows, columns = _index_column(m), _index_row(n)
    perm = op.Expand(rows, op.Concat(op.Shape(a, end=-2), _ints(m, 1), axis=0))
    pivots, diagonal = [], []
    for k in range(min(m, n)):
        if pivot:
            magnitude = op.Where(op.Less(rows, _ints(k)), _scalar_like(-1.0, a), op.Abs(_columns(a, k, k + 1)))
            chosen = op.ArgMax(magnitude, axis=-2, keepdims=1)  # the first largest, as LAPACK's i*amax
            source = op.Where(
                op.Equal(rows, _ints(k)),
                chosen,
                op.Where(op.Equal(rows, chosen), op.Expand(_ints(k), op.Shape(chosen)), rows),
            )
            a = op.GatherElements(a, op.Expand(source, op.Shape(a)), axis=-2)
            perm = op.GatherElements(perm, source, axis=-2)
            pivots.append(chosen)
        else:
            pivots.append(op.Expand(_ints(k), op.Shape(op.Slice(perm, _ints(0), _ints(1), _ints(-2)))))
        top = op.Slice(a, _ints(k, k), _ints(k + 1, k + 1), _ints(-2, -1))  # [..., 1, 1]
        diagonal.append(top)
        zero = _scalar_like(0.0, a)
        safe = op.Where(op.Equal(top, zero), _scalar_like(1.0, a), top)  # a zero pivot leaves its column as is
        below = op.Greater(rows, _ints(k))
        factors = op.Where(below, op.Div(_columns(a, k, k + 1), safe), zero)  # [..., m, 1]
        right = op.Where(op.Greater(columns, _ints(k)), _rows(a, k, k + 1), zero)  # [..., 1, n]
        a = op.Sub(a, op.Mul(factors, right))
        a = op.Where(op.And(below, op.Equal(columns, _ints(k))), factors, a)
    return a, perm, pivots, diagonal


def _pivots_int32(a: TFloat, pivots: list[INT64]) -> INT32:
    """LAPACK's 1-based pivot rows, [..., min(m, n)] int32."""
    if not pivots:
        return op.Cast(_batch_filled(a, [0], 0.0, a), to=INT32.dtype)
    joined = op.Concat(*[op.Reshape(p, op.Concat(op.Shape(p, end=-2), _ints(1), axis=0)) for p in pivots], axis=-1)
    return op.Cast(op.Add(joined, _ints(1)), to=INT32.dtype)


def _first_failure(a: TFloat, failed: list[BOOL]) -> INT32:
    """info: 1 + the first step whose flag is set, 0 when none is, as LAPACK reports it; [...] int32."""
    info = op.Cast(_batch_filled(a, [], 0.0, a), to=INT64.dtype)
    for step in reversed(range(len(failed))):
        flag = op.Reshape(failed[step], op.Shape(info))
        info = op.Where(flag, op.Constant(value_int=step + 1), info)
    return op.Cast(info, to=INT32.dtype)


def _unit_lower_solve(lu: TFloat, b: TFloat, n: int) -> TFloat:
    """Solve L y = b with L unit lower triangular (LU's strict lower part); b [..., n, k]."""
    solved = []
    for i in range(n):
        row = _rows(b, i, i + 1)
        if i:
            row = op.Sub(
                row, op.MatMul(op.Slice(lu, _ints(i, 0), _ints(i + 1, i), _ints(-2, -1)), op.Concat(*solved, axis=-2))
            )
        solved.append(row)
    return op.Concat(*solved, axis=-2) if solved else b


def _triangular_solve(t: TFloat, b: TFloat, upper: bool, unit: bool, n: int) -> TFloat:
    """Solve T x = b by substitution; T [..., n, n] (only its `upper` or lower triangle is read), b [..., n, k]."""
    if n == 0:
        return b
    solved: dict[int, TFloat] = {}
    order = range(n - 1, -1, -1) if upper else range(n)
    for i in order:
        row = _rows(b, i, i + 1)
        known = sorted(solved)
        if known:
            start, stop = known[0], known[-1] + 1
            coefficients = op.Slice(t, _ints(i, start), _ints(i + 1, stop), _ints(-2, -1))
            row = op.Sub(row, op.MatMul(coefficients, op.Concat(*[solved[j] for j in known], axis=-2)))
        if not unit:
            row = op.Div(row, op.Slice(t, _ints(i, i), _ints(i + 1, i + 1), _ints(-2, -1)))
        solved[i] = row
    return op.Concat(*[solved[j] for j in range(n)], axis=-2)


def _broadcast_batches(a: TFloat, b: TFloat) -> tuple[TFloat, TFloat]:
    """a [..., n, n] and b [..., n, k] expanded to their common batch dims."""
    b = op.Expand(b, op.Shape(_columns(a, 0, 1)))  # Expand broadcasts both ways: b gets a's batch dims
    a = op.Expand(a, op.Concat(op.Shape(b, end=-2), op.Shape(a, start=-2), axis=0))
    return a, b


def _solve_with_lu(lu: TFloat, perm: INT64, b: TFloat, n: int) -> TFloat:
    """x with A x = b from A's packed LU and row permutation; lu, perm and b share batch dims."""
    permuted = op.GatherElements(b, op.Expand(perm, op.Shape(b)), axis=-2)
    return _triangular_solve(lu, _unit_lower_solve(lu, permuted, n), upper=True, unit=False, n=n)


def _is_vector_rhs(a: TFloat, b: TFloat) -> bool:
    """torch.linalg.solve's rule: B is a (batch of) vector(s) when it has one dim fewer than A and A's batch."""
    return len(b.shape) == 1 or (len(b.shape) == len(a.shape) - 1 and list(b.shape) == list(a.shape)[:-1])


def _solve(a: TFloat, b: TFloat, left: bool) -> tuple[TFloat, TFloat, INT32, INT32]:
    """linalg.solve's (result, LU, pivots, info) for square A, with B a matrix or vector, on either side."""
    vector = _is_vector_rhs(a, b)
    n = a.shape[-1]
    if vector:
        b = op.Unsqueeze(b, _ints(-1))
    lu, perm, pivots, diagonal = _lu_steps(a)
    zero = _scalar_like(0.0, a)
    info = _first_failure(a, [op.Equal(d, zero) for d in diagonal])
    pivots_out = _pivots_int32(a, pivots)
    if left:
        lu_b, b = _broadcast_batches(lu, b)
        perm_b = op.Expand(perm, op.Concat(op.Shape(b, end=-2), _ints(a.shape[-1], 1), axis=0))
        result = _solve_with_lu(lu_b, perm_b, b, n)
    else:  # X A = B: A^T X^T = B^T, with A^T = U^T L^T P^T
        at = _transpose(a)
        t_lu, t_perm, _, _ = _lu_steps(at)
        bt = _transpose(b)
        t_lu, bt = _broadcast_batches(t_lu, bt)
        t_perm = op.Expand(t_perm, op.Concat(op.Shape(bt, end=-2), _ints(a.shape[-1], 1), axis=0))
        result = _transpose(_solve_with_lu(t_lu, t_perm, bt, n))
    if vector:
        result = op.Squeeze(result, _ints(-1))
    return result, lu, pivots_out, info


@lowering("aten::_linalg_solve_ex")
def linalg_solve_ex(
    A: TFloat, B: TFloat, left: bool = True, check_errors: bool = False
) -> tuple[TFloat, TFloat, INT32, INT32]:
    """Solve by LU with partial pivoting; a singular A gives info > 0 and non-finite values, as eager's."""
    return _solve(A, B, left)


@lowering("aten::linalg_solve")
def linalg_solve(A: TFloat, B: TFloat, left: bool = True) -> TFloat:
    """Kept whole (its decomposition checks errors through an effect token)."""
    return _solve(A, B, left)[0]


def _inverse(a: TFloat) -> tuple[TFloat, INT32]:
    n = a.shape[-1]
    identity = op.Expand(op.CastLike(op.Constant(value=ir.tensor(np.eye(n, dtype=np.float32))), a), op.Shape(a))
    result, _, _, info = _solve(a, identity, left=True)
    return result, info


@lowering("aten::linalg_inv_ex")
def linalg_inv_ex(A: TFloat, check_errors: bool = False) -> tuple[TFloat, INT32]:
    return _inverse(A)


@lowering("aten::linalg_inv")
def linalg_inv(A: TFloat) -> TFloat:
    """Kept whole (its decomposition checks errors through an effect token)."""
    return _inverse(A)[0]


@lowering("aten::linalg_lu_factor_ex")
def linalg_lu_factor_ex(A: TFloat, pivot: bool = True, check_errors: bool = False) -> tuple[TFloat, INT32, INT32]:
    lu, _, pivots, diagonal = _lu_steps(A, pivot)
    info = _first_failure(A, [op.Equal(d, _scalar_like(0.0, A)) for d in diagonal])
    return lu, _pivots_int32(A, pivots), info


@lowering("aten::linalg_lu_factor")
def linalg_lu_factor(A: TFloat, pivot: bool = True) -> tuple[TFloat, INT32]:
    """Kept whole (its decomposition checks errors through an effect token)."""
    lu, _, pivots, _ = _lu_steps(A, pivot)
    return lu, _pivots_int32(A, pivots)


def _unpack(lu: TFloat, perm: INT64 | None, m: int, n: int) -> tuple[TFloat, TFloat, TFloat]:
    """P, L, U from the packed LU and the row permutation (A = P L U); P is empty without a permutation."""
    k = min(m, n)
    rows, columns = _index_column(m), _index_row(n)
    zero = _scalar_like(0.0, lu)
    lower = op.Where(op.Greater(rows, columns), lu, op.Where(op.Equal(rows, columns), _scalar_like(1.0, lu), zero))
    upper = op.Where(op.LessOrEqual(rows, columns), lu, zero)
    lower, upper = _columns(lower, 0, k), _rows(upper, 0, k)
    if perm is None:
        return _batch_filled(lu, [0, 0], 0.0, lu), lower, upper
    # P[perm[i], i] = 1: column i of P is one-hot at perm[i].
    as_row = op.Reshape(perm, op.Concat(op.Shape(lu, end=-2), _ints(1, m), axis=0))
    one_hot = op.Equal(as_row, rows)
    return op.CastLike(one_hot, lu), lower, upper


@lowering("aten::linalg_lu")
def linalg_lu(A: TFloat, pivot: bool = True) -> tuple[TFloat, TFloat, TFloat]:
    m, n = A.shape[-2], A.shape[-1]
    lu, perm, _, _ = _lu_steps(A, pivot)
    return _unpack(lu, perm if pivot else None, m, n)


def _permutation_from_pivots(lu: TFloat, pivots: INT32) -> INT64:
    """The row permutation (gather index [..., m, 1]) that LAPACK's 1-based swaps, applied in order, give."""
    m = lu.shape[-2]
    rows = _index_column(m)
    swaps = op.Sub(op.Cast(pivots, to=INT64.dtype), _ints(1))
    perm = op.Expand(rows, op.Concat(op.Shape(lu, end=-2), _ints(m, 1), axis=0))
    for k in range(pivots.shape[-1]):
        chosen = op.Unsqueeze(op.Slice(swaps, _ints(k), _ints(k + 1), _ints(-1)), _ints(-1))  # [..., 1, 1]
        source = op.Where(
            op.Equal(rows, _ints(k)),
            chosen,
            op.Where(op.Equal(rows, chosen), op.Expand(_ints(k), op.Shape(chosen)), rows),
        )
        perm = op.GatherElements(perm, source, axis=-2)
    return perm


@lowering("aten::lu_unpack")
def lu_unpack(
    LU_data: TFloat, LU_pivots: INT32, unpack_data: bool = True, unpack_pivots: bool = True
) -> tuple[TFloat, TFloat, TFloat]:
    m, n = LU_data.shape[-2], LU_data.shape[-1]
    perm = _permutation_from_pivots(LU_data, LU_pivots)
    p, lower, upper = _unpack(LU_data, perm, m, n)
    empty = _batch_filled(LU_data, [0], 0.0, LU_data)
    if not unpack_data:
        lower = upper = empty
    if not unpack_pivots:
        p = empty
    return p, lower, upper


@lowering("aten::linalg_lu_solve")
def linalg_lu_solve(LU: TFloat, pivots: INT32, B: TFloat, left: bool = True, adjoint: bool = False) -> TFloat:
    """A X = B (or X A = B, or with A^H) from getrf's packed LU and pivots."""
    perm = _permutation_from_pivots(LU, pivots)
    n = LU.shape[-1]
    if 0 in B.shape:  # nothing to solve for: B's shape with the batch dims broadcast
        return op.Expand(B, op.Concat(op.Shape(LU, end=-2), op.Shape(B, start=-2), axis=0))
    if left and not adjoint:
        lu, b = _broadcast_batches(LU, B)
        perm = op.Expand(perm, op.Concat(op.Shape(b, end=-2), _ints(n, 1), axis=0))
        return _solve_with_lu(lu, perm, b, n)
    # A^T X = B with A = P L U: U^T L^T P^T X = B, so X = P (L^T \ (U^T \ B)).
    rhs = B if left else _transpose(B)  # X A = B <=> A^T X^T = B^T; with adjoint, X A^T = B <=> A X^T = B^T
    lu, rhs = _broadcast_batches(LU, rhs)
    perm = op.Expand(perm, op.Concat(op.Shape(rhs, end=-2), _ints(n, 1), axis=0))
    if not left and adjoint:  # X A^T = B <=> A X^T = B^T
        x = _solve_with_lu(lu, perm, rhs, n)
    else:
        lu_t = _transpose(lu)
        y = _triangular_solve(lu_t, rhs, upper=False, unit=False, n=n)
        y = _triangular_solve(lu_t, y, upper=True, unit=True, n=n)
        x = op.ScatterElements(y, op.Expand(perm, op.Shape(y)), y, axis=-2)
    return x if left else _transpose(x)


def _cholesky(a: TFloat) -> tuple[TFloat, INT32]:
    """Lower Cholesky factor, column by column (the left-looking form), and LAPACK's info.

    A non-positive (or NaN) pivot sets info to its 1-based column; the factor is then meaningless, as eager's is.
    """
    n = a.shape[-1]
    rows = _index_column(n)
    zero = _scalar_like(0.0, a)
    columns, failed = [], []
    for j in range(n):
        v = _columns(a, j, j + 1)  # [..., n, 1]
        if columns:
            done = op.Concat(*columns, axis=-1)  # [..., n, j]
            v = op.Sub(v, op.MatMul(done, _transpose(_rows(done, j, j + 1))))
        pivot = _rows(v, j, j + 1)  # [..., 1, 1]
        failed.append(op.Not(op.Greater(pivot, zero)))
        root = op.Sqrt(pivot)
        column = op.Where(op.Greater(rows, _ints(j)), op.Div(v, root), op.Where(op.Equal(rows, _ints(j)), root, zero))
        columns.append(column)
    factor = op.Concat(*columns, axis=-1) if columns else a
    return factor, _first_failure(a, failed)


@lowering("aten::linalg_cholesky_ex")
def linalg_cholesky_ex(self: TFloat, upper: bool = False, check_errors: bool = False) -> tuple[TFloat, INT32]:
    factor, info = _cholesky(self)
    return (_transpose(factor) if upper else factor), info


# aten::cholesky (the deprecated torch.cholesky) is gone from torch 2.15: the registry skips it there
@lowering("aten::linalg_cholesky", "aten::cholesky")
def linalg_cholesky(self: TFloat, upper: bool = False) -> TFloat:
    """Kept whole (linalg_cholesky's decomposition checks errors through an effect token)."""
    factor, _ = _cholesky(self)
    return _transpose(factor) if upper else factor


@lowering("aten::cholesky_solve")
def cholesky_solve(self: TFloat, input2: TFloat, upper: bool = False) -> TFloat:
    """A X = B with A = L L^T (or U^T U): two triangular solves."""
    n = input2.shape[-1]
    factor, b = _broadcast_batches(input2, self)
    lower = _transpose(factor) if upper else factor
    y = _triangular_solve(lower, b, upper=False, unit=False, n=n)
    return _triangular_solve(_transpose(lower), y, upper=True, unit=False, n=n)


@lowering("aten::cholesky_inverse")
def cholesky_inverse(self: TFloat, upper: bool = False) -> TFloat:
    """(L L^T)^-1 (or (U^T U)^-1) as two triangular solves against the identity."""
    n = self.shape[-1]
    identity = op.Expand(op.CastLike(op.Constant(value=ir.tensor(np.eye(n, dtype=np.float32))), self), op.Shape(self))
    lower = _transpose(self) if upper else self
    y = _triangular_solve(lower, identity, upper=False, unit=False, n=n)
    return _triangular_solve(_transpose(lower), y, upper=True, unit=False, n=n)


# --- symmetric indefinite factorization (Bunch-Kaufman, LAPACK's sytrf/sytrs with UPLO='L') ----------------------
# Eager's LD and pivots are those of LAPACK's unblocked sytf2 (torch passes the lower triangle); the blocked path
# (lasyf panels, reference nb = 64) delays the trailing updates, so its values round differently and a near tie
# may pick another pivot: larger matrices are refused rather than exported with other pivots.
_SYTRF_UNBLOCKED_LIMIT = 64

TLapack = TypeVar("TLapack", FLOAT, DOUBLE)


def _ldl_order(a: TLapack, what: str) -> int:
    """The static matrix size n of a [..., n, n] ldl argument, or a clear refusal."""
    n = a.shape[-1] if a.shape is not None else None
    if not isinstance(n, int):
        raise NotImplementedError(
            f"{what} needs a static matrix size (its Bunch-Kaufman steps are unrolled column by column), not {n}: "
            "export with a static size for the last two dims"
        )
    if n > _SYTRF_UNBLOCKED_LIMIT:
        raise NotImplementedError(
            f"{what} of {n}x{n} matrices: above {_SYTRF_UNBLOCKED_LIMIT} LAPACK's sytrf factors in blocked panels "
            "(lasyf), whose rounding and therefore pivots this lowering does not reproduce; factor matrices of at "
            f"most {_SYTRF_UNBLOCKED_LIMIT} rows, or keep the factorization outside the exported model"
        )
    return n


def _element(a: TLapack, i: int, j: int) -> TLapack:
    """a[..., i, j] as [..., 1, 1]."""
    return op.Slice(a, _ints(i, j), _ints(i + 1, j + 1), _ints(-2, -1))


def _bunch_kaufman_alpha(a: TLapack) -> TLapack:
    """(1 + sqrt(17)) / 8, computed in the input's precision as s/dsytf2 compute it."""
    dtype = np.float64 if a.dtype == ir.DataType.DOUBLE else np.float32
    alpha = (dtype(1) + np.sqrt(dtype(17))) / dtype(8)
    return op.Constant(value=ir.tensor(np.array(alpha, dtype=dtype)))


def _exchanged(n: int, first: INT64, second: INT64) -> INT64:
    """The gather index [..., n, 1] that exchanges rows `first` and `second` ([..., 1, 1] or [1] each)."""
    rows = _index_column(n)
    return op.Where(op.Equal(rows, first), second, op.Where(op.Equal(rows, second), first, rows))


def _lower_mirrored(a: TLapack, rows: INT64, columns: INT64) -> TLapack:
    """The lower triangle, copied onto the upper one."""
    return op.Where(op.GreaterOrEqual(rows, columns), a, _transpose(a))


def _sytf2(a: TLapack, n: int) -> tuple[TLapack, INT32, INT32]:
    """LAPACK's sytf2 with UPLO='L': A = L D L^T with symmetric row/column interchanges and D of 1x1 and 2x2 blocks.

    The steps are unrolled over the static columns k; a column that is the second of the previous step's 2x2
    block is skipped, per matrix. The working matrix keeps the trailing submatrix symmetric (its lower triangle
    mirrored) so that row imax reads as a column; L's finished columns sit below the diagonal, as sytf2 leaves
    them (interchanges touch only the trailing submatrix). Returns the packed LD (zero above the diagonal),
    the pivots in LAPACK's convention (1-based, both entries of a 2x2 block -kp) and info ([...], int32).

    A NaN on the diagonal sets info at its column, as reference LAPACK's sytf2 does; MKL's sytrf (torch's x86
    wheels) has no such check and pivots on through NaNs, so a matrix with NaNs (or overflowing updates) may get
    other pivots and info than eager's there.
    """
    rows, columns = _index_column(n), _index_row(n)
    zero, one, minus_one = _scalar_like(0.0, a), _scalar_like(1.0, a), _scalar_like(-1.0, a)
    alpha = _bunch_kaufman_alpha(a)
    batch = op.Shape(a, end=-2)
    s = _lower_mirrored(a, rows, columns)
    skipped: BOOL | None = None  # per matrix: column k is the second of the previous step's 2x2 block
    previous: INT64 | None = None
    pivots: list[INT64] = []
    failed: list[BOOL] = []
    for k in range(n):
        akk = _element(s, k, k)
        absakk = op.Abs(akk)
        k_index = op.Expand(_ints(k), op.Concat(batch, _ints(1, 1), axis=0))  # [..., 1, 1]
        two: BOOL | None = None
        if k < n - 1:
            below = op.Where(op.Greater(rows, _ints(k)), op.Abs(_columns(s, k, k + 1)), minus_one)  # [..., n, 1]
            imax = op.ArgMax(below, axis=-2, keepdims=1)  # the first largest, as i*amax
            colmax = op.ReduceMax(below, _ints(-2), keepdims=1)
            row = op.GatherElements(s, op.Expand(imax, op.Concat(batch, _ints(1, n), axis=0)), axis=-2)  # [..., 1, n]
            others = op.And(op.GreaterOrEqual(columns, _ints(k)), op.Not(op.Equal(columns, imax)))
            rowmax = op.ReduceMax(op.Where(others, op.Abs(row), minus_one), _ints(-1), keepdims=1)
            absaimax = op.Abs(op.GatherElements(row, imax, axis=-1))
            zero_column = op.Or(op.Equal(op.Max(absakk, colmax), zero), op.IsNaN(absakk))
            alpha_colmax = op.Mul(alpha, colmax)
            safe_rowmax = op.Where(op.Greater(rowmax, zero), rowmax, one)
            keep = op.Or(
                op.GreaterOrEqual(absakk, alpha_colmax),
                op.GreaterOrEqual(absakk, op.Mul(alpha_colmax, op.Div(colmax, safe_rowmax))),
            )
            exchange = op.Not(op.Or(zero_column, keep))
            if skipped is not None:
                exchange = op.And(exchange, op.Not(skipped))
            two = op.And(exchange, op.Not(op.GreaterOrEqual(absaimax, op.Mul(alpha, rowmax))))
            kp = op.Where(exchange, imax, k_index)
            # Interchange rows and columns kk (k, or k + 1 for a 2x2 block) and kp in the trailing submatrix.
            kk = op.Where(two, op.Add(k_index, _ints(1)), k_index)
            order = _exchanged(n, kk, kp)
            swapped = op.GatherElements(s, op.Expand(order, op.Shape(s)), axis=-2)
            swapped = op.GatherElements(swapped, op.Expand(_transpose(order), op.Shape(s)), axis=-1)
            trailing = op.And(op.GreaterOrEqual(rows, _ints(k)), op.GreaterOrEqual(columns, _ints(k)))
            s = op.Where(trailing, swapped, s)
        else:
            zero_column = op.Or(op.Equal(absakk, zero), op.IsNaN(absakk))
            kp = k_index
        if skipped is not None:
            zero_column = op.And(zero_column, op.Not(skipped))
        failed.append(zero_column)
        if k < n - 1:
            # 1x1 pivot: A(k+1:, k+1:) -= x (1/d) x^T with x the column below d, as syr computes it; x /= d.
            single = op.Not(op.Or(zero_column, two))
            if skipped is not None:
                single = op.And(single, op.Not(skipped))
            d11 = op.Div(one, _element(s, k, k))
            x = _columns(s, k, k + 1)
            updated = op.Add(s, op.Mul(x, op.Mul(op.Neg(d11), _transpose(x))))
            after_k = op.And(op.Greater(rows, _ints(k)), op.Greater(columns, _ints(k)))
            below_k = op.And(op.Greater(rows, _ints(k)), op.Equal(columns, _ints(k)))
            next_s = op.Where(after_k, _lower_mirrored(updated, rows, columns), s)
            next_s = op.Where(below_k, op.Mul(x, d11), next_s)
            s = op.Where(single, next_s, s)
        if k < n - 2:
            # 2x2 pivot: the rank-2 update of sytf2, with its W = (L(k) L(k+1)) D written into columns k, k+1.
            d21 = _element(s, k + 1, k)
            d11 = op.Div(_element(s, k + 1, k + 1), d21)
            d22 = op.Div(_element(s, k, k), d21)
            t = op.Div(one, op.Sub(op.Mul(d11, d22), one))
            d21 = op.Div(t, d21)
            ck, ck1 = _columns(s, k, k + 1), _columns(s, k + 1, k + 2)
            wk = op.Mul(d21, op.Sub(op.Mul(d11, ck), ck1))
            wkp1 = op.Mul(d21, op.Sub(op.Mul(d22, ck1), ck))
            updated = op.Sub(op.Sub(s, op.Mul(ck, _transpose(wk))), op.Mul(ck1, _transpose(wkp1)))
            after = op.Greater(rows, _ints(k + 1))
            next_s = op.Where(
                op.And(after, op.Greater(columns, _ints(k + 1))), _lower_mirrored(updated, rows, columns), s
            )
            next_s = op.Where(op.And(after, op.Equal(columns, _ints(k))), wk, next_s)
            next_s = op.Where(op.And(after, op.Equal(columns, _ints(k + 1))), wkp1, next_s)
            s = op.Where(two, next_s, s)
        entry = op.Add(kp, _ints(1))
        if two is not None:
            entry = op.Where(two, op.Neg(entry), entry)
        if skipped is not None:
            entry = op.Where(skipped, previous, entry)
        pivots.append(entry)
        previous = entry
        skipped = two
    ld = op.Where(op.GreaterOrEqual(rows, columns), s, zero)
    if pivots:
        joined = op.Concat(*[op.Reshape(p, op.Concat(batch, _ints(1), axis=0)) for p in pivots], axis=-1)
    else:
        joined = _batch_filled(a, [0], 0.0, a)
    return ld, op.Cast(joined, to=INT32.dtype), _first_failure(a, failed)


@lowering("aten::linalg_ldl_factor_ex")
def linalg_ldl_factor_ex(
    self: TLapack, hermitian: bool = False, check_errors: bool = False
) -> tuple[TLapack, INT32, INT32]:
    """Bunch-Kaufman LDL^T as LAPACK's sytrf computes it (for real matrices hermitian changes nothing)."""
    return _sytf2(self, _ldl_order(self, "linalg.ldl_factor"))


@lowering("aten::linalg_ldl_factor")
def linalg_ldl_factor(self: TLapack, hermitian: bool = False) -> tuple[TLapack, INT32]:
    """Kept whole (its decomposition checks errors through an effect token)."""
    ld, pivots, _ = _sytf2(self, _ldl_order(self, "linalg.ldl_factor"))
    return ld, pivots


def _sytrs(ld: TLapack, pivots: INT64, b: TLapack, n: int) -> TLapack:
    """LAPACK's sytrs with UPLO='L': A X = B from sytf2's LD and pivots; ld, pivots [..., n, 1] and b share batch dims.

    Which columns start a 2x2 block depends on the pivots of each matrix: a negative entry starts one unless it
    is the second of the previous block.
    """
    rows = _index_column(n)
    one = _scalar_like(1.0, ld)
    entries = [op.Slice(pivots, _ints(k), _ints(k + 1), _ints(-2)) for k in range(n)]  # [..., 1, 1] each
    singles = [op.Greater(e, _ints(0)) for e in entries]
    firsts: list[BOOL] = []
    seconds: list[BOOL | None] = [None]
    for k in range(n):
        negative = op.Not(singles[k])
        firsts.append(negative if seconds[k] is None else op.And(negative, op.Not(seconds[k])))
        seconds.append(firsts[k])
    sources = [op.Sub(op.Abs(e), _ints(1)) for e in entries]
    # L D Y = P^T B, column by column.
    for k in range(n):
        single, first = singles[k], firsts[k]
        block = op.Or(single, first) if k < n - 1 else single
        target = op.Where(first, _ints(k + 1), _ints(k)) if k < n - 1 else _ints(k)
        source = op.Where(block, sources[k], _ints(k))
        b = op.GatherElements(b, op.Expand(_exchanged(n, target, source), op.Shape(b)), axis=-2)
        bk = _rows(b, k, k + 1)
        if k < n - 1:
            below = op.And(block, op.Greater(rows, target))  # L starts below the block
            b = op.Where(below, op.Sub(b, op.Mul(_columns(ld, k, k + 1), bk)), b)
        if k < n - 2:
            bk1 = _rows(b, k + 1, k + 2)
            below = op.And(first, op.Greater(rows, _ints(k + 1)))
            b = op.Where(below, op.Sub(b, op.Mul(_columns(ld, k + 1, k + 2), bk1)), b)
        dkk = _element(ld, k, k)
        new_k = op.Where(single, op.Mul(bk, op.Div(one, dkk)), bk)
        if k < n - 1:
            akm1k = _element(ld, k + 1, k)
            akm1 = op.Div(dkk, akm1k)
            ak = op.Div(_element(ld, k + 1, k + 1), akm1k)
            denom = op.Sub(op.Mul(akm1, ak), one)
            bkm1 = op.Div(bk, akm1k)
            bkk = op.Div(_rows(b, k + 1, k + 2), akm1k)
            new_k = op.Where(first, op.Div(op.Sub(op.Mul(ak, bkm1), bkk), denom), new_k)
            new_k1 = op.Div(op.Sub(op.Mul(akm1, bkk), bkm1), denom)
            b = op.Where(op.And(first, op.Equal(rows, _ints(k + 1))), new_k1, b)
        b = op.Where(op.Equal(rows, _ints(k)), new_k, b)
    # L^T X = Y, then the interchanges undone, from the last column back.
    for k in range(n - 1, -1, -1):
        second = seconds[k]
        block_end = singles[k] if second is None else op.Or(singles[k], second)
        if k < n - 1:
            tail = _rows(b, k + 1, n)
            column = op.Slice(ld, _ints(k + 1, k), _ints(n, k + 1), _ints(-2, -1))  # [..., n-k-1, 1]
            new_k = op.Sub(_rows(b, k, k + 1), op.MatMul(_transpose(column), tail))
            b = op.Where(op.And(block_end, op.Equal(rows, _ints(k))), new_k, b)
            if second is not None:
                column = op.Slice(ld, _ints(k + 1, k - 1), _ints(n, k), _ints(-2, -1))
                new_km1 = op.Sub(_rows(b, k - 1, k), op.MatMul(_transpose(column), tail))
                b = op.Where(op.And(second, op.Equal(rows, _ints(k - 1))), new_km1, b)
        source = op.Where(block_end, sources[k], _ints(k))
        b = op.GatherElements(b, op.Expand(_exchanged(n, _ints(k), source), op.Shape(b)), axis=-2)
    return b


@lowering("aten::linalg_ldl_solve")
def linalg_ldl_solve(LD: TLapack, pivots: INT32, B: TLapack, hermitian: bool = False) -> TLapack:
    """A X = B from sytrf's LD and pivots, as LAPACK's sytrs solves it."""
    n = _ldl_order(LD, "linalg.ldl_solve")
    if 0 in B.shape or n == 0:  # nothing to solve for: B's shape with the batch dims broadcast
        return op.Expand(B, op.Concat(op.Shape(LD, end=-2), op.Shape(B, start=-2), axis=0))
    ld, b = _broadcast_batches(LD, B)
    column = op.Unsqueeze(op.Cast(pivots, to=INT64.dtype), _ints(-1))  # [..., n, 1]
    column = op.Expand(column, op.Concat(op.Shape(b, end=-2), _ints(n, 1), axis=0))
    return _sytrs(ld, column, b, n)


def _solve_triangular(a: TFloat, b: TFloat, upper: bool, left: bool, unit: bool) -> TFloat:
    n = a.shape[-1]
    if left:
        a, b = _broadcast_batches(a, b)
        return _triangular_solve(a, b, upper, unit, n)
    # X A = B <=> A^T X^T = B^T; A^T is triangular the other way.
    at, bt = _broadcast_batches(_transpose(a), _transpose(b))
    return _transpose(_triangular_solve(at, bt, not upper, unit, n))


@lowering("aten::linalg_solve_triangular")
def linalg_solve_triangular(
    self: TFloat, B: TFloat, upper: bool, left: bool = True, unitriangular: bool = False
) -> TFloat:
    return _solve_triangular(self, B, upper, left, unitriangular)


@lowering("aten::triangular_solve")
def triangular_solve(
    self: TFloat, A: TFloat, upper: bool = True, transpose: bool = False, unitriangular: bool = False
) -> tuple[TFloat, TFloat]:
    """op(A) X = b with op(A) = A or A^T; returns (X, A) with A broadcast to X's batch dims, as eager."""
    coefficients = _transpose(A) if transpose else A
    a_b, b = _broadcast_batches(coefficients, self)
    solution = _triangular_solve(a_b, b, upper != transpose, unitriangular, A.shape[-1])
    cloned = op.Expand(A, op.Concat(op.Shape(b, end=-2), op.Shape(A, start=-2), axis=0))
    return solution, cloned


def _slogdet(A: TFloat) -> tuple[TFloat, TFloat, TFloat, INT32]:
    """sign and log|det| from the LU's diagonal and the parity of its row swaps."""
    lu, _, pivots, diagonal = _lu_steps(A)
    n = A.shape[-1]
    one = _scalar_like(1.0, A)
    sign = op.Reshape(_batch_filled(A, [1, 1], 1.0, A), op.Concat(op.Shape(A, end=-2), _ints(1, 1), axis=0))
    log_abs = op.Mul(sign, _scalar_like(0.0, A))
    for k in range(n):
        swapped = op.Not(op.Equal(pivots[k], _ints(k)))
        factor = op.Mul(op.Sign(diagonal[k]), op.Where(swapped, op.Neg(one), one))
        sign = op.Mul(sign, factor)
        log_abs = op.Add(log_abs, op.Log(op.Abs(diagonal[k])))
    batch = op.Shape(A, end=-2)
    return op.Reshape(sign, batch), op.Reshape(log_abs, batch), lu, _pivots_int32(A, pivots)


@lowering("aten::_linalg_slogdet")
def linalg_slogdet(A: TFloat) -> tuple[TFloat, TFloat, TFloat, INT32]:
    return _slogdet(A)


@lowering("aten::linalg_slogdet")
def linalg_slogdet_pair(A: TFloat) -> tuple[TFloat, TFloat]:
    """Kept whole: the pair eager returns."""
    sign, log_abs, _, _ = _slogdet(A)
    return sign, log_abs


@lowering("aten::linalg_tensorinv")
def linalg_tensorinv(self: TFloat, ind: int = 2) -> TFloat:
    """The inverse of self reshaped to a square matrix, reshaped to shape[ind:] + shape[:ind]."""
    shape = list(self.shape)
    rows = int(np.prod(shape[:ind]))
    matrix = op.Reshape(self, _ints(rows, int(np.prod(shape[ind:]))))
    matrix.shape = ir.Shape([rows, rows])  # the unrolled inverse needs the static size
    inverse, _ = _inverse(matrix)
    return op.Reshape(inverse, _ints(*shape[ind:], *shape[:ind]))


# --- matrix exponential ------------------------------------------------------------------------------------------
_EXP_MAX_SQUARINGS = 40  # scales norms up to ~5e11; exp of anything larger overflows every float type


_EXP_TAYLOR_DEGREE = 18  # the error of a degree-18 Taylor polynomial at norm 1/2 is below float64's epsilon


@lowering("aten::linalg_matrix_exp")
def linalg_matrix_exp(self: TFloat) -> TFloat:
    """Scaling and squaring: exp(A) = exp(A / 2^s)^(2^s) with s read at run time from A's 1-norm.

    The squarings are unrolled to the largest s and each is kept only where it is due (a Where per batch).
    float16/bfloat16 compute in float32.
    """
    n = self.shape[-1]
    if n == 0:
        return op.Identity(self)
    a = op.Cast(self, to=FLOAT.dtype) if self.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16) else self
    norm = op.ReduceMax(op.ReduceSum(op.Abs(a), _ints(-2), keepdims=1), _ints(-1), keepdims=1)  # [..., 1, 1]
    zero = _scalar_like(0.0, a)
    halvings = op.Ceil(op.Div(op.Log(op.Mul(norm, _scalar_like(2.0, a))), _scalar_like(math.log(2.0), a)))
    halvings = op.Where(op.IsNaN(halvings), zero, halvings)
    halvings = op.Min(op.Max(halvings, zero), _scalar_like(float(_EXP_MAX_SQUARINGS), a))
    scaled = op.Div(a, op.Pow(_scalar_like(2.0, a), halvings))
    identity = op.Expand(op.CastLike(op.Constant(value=ir.tensor(np.eye(n, dtype=np.float32))), a), op.Shape(a))
    result = identity
    for degree in range(_EXP_TAYLOR_DEGREE, 0, -1):  # Horner: I + A/1 (I + A/2 (I + ...))
        result = op.Add(identity, op.Div(op.MatMul(scaled, result), _scalar_like(float(degree), a)))
    for step in range(_EXP_MAX_SQUARINGS):
        due = op.Less(_scalar_like(float(step), a), halvings)
        result = op.Where(due, op.MatMul(result, result), result)
    return op.Cast(result, to=self.dtype) if result.dtype != self.dtype else result


# --- pseudo-inverse, from the SVD (or eigh) ---------------------------------------------------------------------
@lowering("aten::linalg_pinv.atol_rtol_tensor")
def linalg_pinv(
    self: TFloat, atol: TFloat | None = None, rtol: TFloat | None = None, hermitian: bool = False
) -> TFloat:
    """Eager's formula: V diag(1/s where s > max(atol, rtol * s_max), else 0) U^T from the SVD (or eigh)."""
    m, n = self.shape[-2], self.shape[-1]
    zero = _scalar_like(0.0, self)
    if min(m, n) == 0 or 0 in list(self.shape)[:-2]:
        return _batch_filled(self, [n, m], 0.0, self)
    if hermitian:
        values, vectors = _eigh(self, lower=True)
        magnitude = op.Abs(values)
        largest = op.ReduceMax(magnitude, _ints(-1), keepdims=1)
    else:
        u, values, vh = _svd(self)
        magnitude = values
        largest = op.Slice(values, _ints(0), _ints(1), _ints(-1))
    if rtol is None:  # eager's default: eps * max(m, n), or 0 where a positive atol is given
        epsilon = float(np.finfo(np.float64 if self.dtype == ir.DataType.DOUBLE else np.float32).eps)
        rtol = _scalar_like(epsilon * max(m, n), self)
        if atol is not None:
            rtol = op.Where(op.Greater(op.CastLike(atol, self), zero), zero, rtol)
    tolerance = zero
    if atol is not None:
        tolerance = op.Unsqueeze(op.CastLike(atol, self), _ints(-1))
    if rtol is not None:
        tolerance = op.Max(tolerance, op.Mul(op.Unsqueeze(op.CastLike(rtol, self), _ints(-1)), largest))
    keep = op.Greater(magnitude, tolerance)
    inverse = op.Where(keep, op.Div(_scalar_like(1.0, self), op.Where(keep, values, _scalar_like(1.0, self))), zero)
    scale = op.Unsqueeze(inverse, _ints(-2))  # [..., 1, k]
    if hermitian:
        return op.MatMul(op.Mul(vectors, scale), _transpose(vectors))
    return op.MatMul(op.Mul(_transpose(vh), scale), _transpose(u))


# --- least squares ---------------------------------------------------------------------------------------------
def _lstsq_threshold(s: DOUBLE, rcond: float | None, driver: str, m: int, n: int, eps: float) -> DOUBLE | None:
    """The singular value at or below which a driver treats a direction as null (None: gels keeps them all)."""
    if driver == "gels":
        return None
    if rcond is None:  # torch's default
        rcond = eps * max(m, n)
    if driver == "gelsd" and not 0 < rcond < 1:  # dlalsd's rule
        rcond = eps
    if driver == "gelss" and rcond < 0:
        rcond = eps
    largest = op.ReduceMax(s, _ints(-1), keepdims=1)
    return op.Mul(largest, _double(rcond))


def _pivoted_qr(a: DOUBLE, eps: float) -> tuple[DOUBLE, INT64, list[DOUBLE], list[DOUBLE]]:
    """LAPACK's dlaqp2 (geqp3 for small matrices): Householder QR choosing, at each step, the column of largest
    remaining norm (the first of equal ones), with its downdating of the norms and recomputation when they
    lose their accuracy (tol3z = sqrt(eps), eps of the input's dtype, so that pivots fall as eager's do).

    Returns R ([..., m, n], zero below the diagonal), the column permutation ([..., 1, n]: column j of R is
    A's column perm[j]) and the reflectors' v and tau.
    """
    m, n = a.shape[-2], a.shape[-1]
    rows, columns = _index_column(m), _index_row(n)
    zero, one = _double(0.0), _double(1.0)
    tol3z = _double(math.sqrt(eps / 2))  # LAPACK's dlamch('E') is half the machine epsilon
    norms = op.Sqrt(op.ReduceSum(op.Mul(a, a), _ints(-2), keepdims=1))  # [..., 1, n]
    vn1, vn2 = norms, norms
    perm = op.Expand(columns, op.Shape(norms))
    vs, taus = [], []
    for i in range(min(m, n)):
        candidates = op.Where(op.Less(columns, _ints(i)), _double(-1.0), vn1)
        chosen = op.ArgMax(candidates, axis=-1, keepdims=1)  # [..., 1, 1]
        source = op.Where(
            op.Equal(columns, _ints(i)),
            chosen,
            op.Where(op.Equal(columns, chosen), op.Expand(_ints(i), op.Shape(chosen)), columns),
        )  # [..., 1, n]
        a = op.GatherElements(a, op.Expand(source, op.Shape(a)), axis=-1)
        perm = op.GatherElements(perm, source, axis=-1)
        vn1 = op.GatherElements(vn1, source, axis=-1)
        vn2 = op.GatherElements(vn2, source, axis=-1)
        v, tau, beta = _reflector(_columns(a, i, i + 1), i, rows)
        a = op.Where(op.Greater(columns, _ints(i)), _apply_reflector(v, tau, a), a)
        head_or_zero = op.Where(op.Equal(rows, _ints(i)), beta, zero)
        column = op.Where(op.Less(rows, _ints(i)), _columns(a, i, i + 1), head_or_zero)
        a = op.Where(op.Equal(columns, _ints(i)), column, a)
        vs.append(v)
        taus.append(tau)
        # The norms of the columns' rows below i: downdated, or recomputed where the downdate lost accuracy.
        head = op.Abs(_rows(a, i, i + 1))  # [..., 1, n]
        live = op.And(op.Greater(columns, _ints(i)), op.Not(op.Equal(vn1, zero)))
        safe_vn1 = op.Where(live, vn1, one)
        ratio = op.Div(head, safe_vn1)
        temp = op.Max(op.Sub(one, op.Mul(ratio, ratio)), zero)
        spread = op.Div(vn1, op.Where(live, vn2, one))
        stale = op.LessOrEqual(op.Mul(temp, op.Mul(spread, spread)), tol3z)
        below = op.Where(op.Greater(rows, _ints(i)), a, zero)
        recomputed = op.Sqrt(op.ReduceSum(op.Mul(below, below), _ints(-2), keepdims=1))
        vn1 = op.Where(live, op.Where(stale, recomputed, op.Mul(vn1, op.Sqrt(temp))), vn1)
        vn2 = op.Where(op.And(live, stale), recomputed, vn2)
    r = op.Where(op.LessOrEqual(rows, columns), a, zero)
    return r, perm, vs, taus


def _gelsy(a: DOUBLE, rhs: DOUBLE, rcond: float, eps: float) -> tuple[DOUBLE, INT64]:
    """dgelsy: R from the column-pivoted QR; the rank is the largest r for which every leading block
    R[:j, :j] (j <= r) has s_min >= rcond * s_max (gelsy estimates these by incremental condition estimation;
    here they are computed); the solution is the minimum-norm one of R[:r, :] P^T x = (Q^T B)[:r].

    Every matrix is pivoted, as LAPACK documents for a zero pivot array. torch 2.13 passes gelsy an uninitialized
    one, shared by the batch (BatchLinearAlgebraKernel.cpp, apply_lstsq): the matrices after the first are never
    pivoted, and the first is only where the memory held zeros (it varies from call to call). Where pivoting
    changes the result (a truncated direction that is not negligible, or columns in an order the pivots would
    change on a rank-deficient matrix), eager's own result is therefore not reproducible.
    """
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)
    r, perm, vs, taus = _pivoted_qr(a, eps)
    zero = _double(0.0)
    accepted = None
    count = None
    for j in range(1, k + 1):
        _, s, _ = _svd_tall(op.Slice(r, _ints(0, 0), _ints(j, j), _ints(-2, -1)), j, j)
        largest = op.ReduceMax(s, _ints(-1), keepdims=0)
        ok = op.LessOrEqual(op.Mul(largest, _double(rcond)), op.ReduceMin(s, _ints(-1), keepdims=0))
        if j == 1:
            ok = op.And(ok, op.Greater(largest, zero))  # a zero R[0, 0]: rank 0
        accepted = ok if accepted is None else op.And(accepted, ok)
        step = op.Cast(accepted, to=INT64.dtype)
        count = step if count is None else op.Add(count, step)
    rank = count  # [...] int64
    # Q^T B, then rows from the rank on dropped (zeroed) on both sides.
    projected = rhs
    for v, tau in zip(vs, taus):
        projected = _apply_reflector(v, tau, projected)
    kept = op.Less(_index_column(k), op.Unsqueeze(rank, _ints(-1, -2)))  # [..., k, 1]
    top = op.Where(kept, _rows(r, 0, k), zero)  # [..., k, n]
    projected = op.Where(kept, _rows(projected, 0, k), zero)  # [..., k, nrhs]
    # Minimum-norm solution of top y = projected: top's kept rows are independent, the dropped ones exactly zero.
    u, s, w = _svd_tall(_transpose(top), n, k)  # top^T = U S W^T, so top = W S U^T
    nonzero = op.Greater(s, zero)
    inverse = op.Where(nonzero, op.Div(_double(1.0), op.Where(nonzero, s, _double(1.0))), zero)
    y = op.MatMul(u, op.Mul(op.Unsqueeze(inverse, _ints(-1)), op.MatMul(_transpose(w), projected)))
    # x[perm[j]] = y[j]
    order = op.Expand(_transpose(perm), op.Shape(y))
    return op.ScatterElements(y, order, y, axis=-2), rank


@lowering("aten::linalg_lstsq")
def linalg_lstsq(
    self: TFloat, b: TFloat, rcond: float | None = None, driver: str | None = None
) -> tuple[TFloat, TFloat, INT64, TFloat]:
    """(solution, residuals, rank, singular_values) as each LAPACK driver defines them, computed in float64.

    gelss/gelsd are SVD solvers: rank counts the singular values above rcond * s_max and the solution is
    V diag(1/s) U^T B over those. gelsy (CPU's default) truncates a column-pivoted QR instead (`_gelsy`), whose
    solution differs from the SVD's where a cut-off direction is not negligible. gels assumes full rank: every
    singular value is inverted (a singular A gives non-finite values where eager's are huge). Residuals (m > n,
    not gelsy) are ||A X - B||^2 per column, returned by gelss/gelsd only when every matrix has full rank; else
    empty, as eager's, though a batch's empty residuals keep the batch dims ((*batch, 0) where eager's are (0,)).
    """
    driver = driver or "gelsy"
    m, n = self.shape[-2], self.shape[-1]
    k = min(m, n)
    vector = len(b.shape) == len(self.shape) - 1
    a = op.Cast(self, to=DOUBLE.dtype)
    rhs = op.Cast(op.Unsqueeze(b, _ints(-1)) if vector else b, to=DOUBLE.dtype)
    eps = float(np.finfo(np.float64 if self.dtype == ir.DataType.DOUBLE else np.float32).eps)
    if k == 0 or 0 in list(self.shape)[:-2]:
        s = op.Reshape(_batch_filled(a, [k, 1], 0.0, a), op.Concat(op.Shape(a, end=-2), _ints(k), axis=0))
        solution = op.MatMul(_batch_filled(a, [n, m], 0.0, a), rhs)  # zeros, with the batch broadcast
        rank = op.ReduceSum(op.Cast(op.Greater(s, s), to=INT64.dtype), _ints(-1), keepdims=0)
    elif driver == "gelsy":
        solution, rank = _gelsy(a, rhs, eps * max(m, n) if rcond is None else rcond, eps)
    else:
        if m >= n:
            u, s, v = _svd_tall(a, m, n)
        else:  # A^T = U' S V'^T, so A = V' S U'^T
            v, s, u = _svd_tall(_transpose(a), n, m)
        threshold = _lstsq_threshold(s, rcond, driver, m, n, eps)
        one = _double(1.0)
        keep = op.Equal(s, s) if threshold is None else op.Greater(s, threshold)
        inverse = op.Div(one, s)
        if threshold is not None:
            inverse = op.Where(keep, op.Div(one, op.Where(keep, s, one)), _double(0.0))
        solution = op.MatMul(v, op.Mul(op.Unsqueeze(inverse, _ints(-1)), op.MatMul(_transpose(u), rhs)))
        rank = op.ReduceSum(op.Cast(keep, to=INT64.dtype), _ints(-1), keepdims=0)
    empty = op.CastLike(op.Constant(value=ir.tensor(np.zeros((0,), dtype=np.float32))), self)
    residuals = empty
    if m > n and driver != "gelsy":
        misfit = op.Sub(op.MatMul(a, solution), rhs)
        residuals = op.CastLike(op.ReduceSum(op.Mul(misfit, misfit), _ints(-2), keepdims=0), self)
        if driver in ("gelsd", "gelss"):  # only where every matrix has full rank, as eager
            full = op.ReduceMin(op.Cast(op.Equal(rank, op.Constant(value_int=n)), to=INT64.dtype), keepdims=0)
            length = op.Mul(op.Reshape(full, _ints(1)), _ints(rhs.shape[-1]))
            residuals = op.Slice(residuals, _ints(0), length, _ints(-1))
    solution = op.CastLike(op.Squeeze(solution, _ints(-1)) if vector else solution, self)
    if driver == "gels":  # rank (over A's batch dims, as the singular values) is the others' only
        rank = op.Constant(value=ir.tensor(np.zeros((0,), dtype=np.int64)))
    singular_values = empty
    if driver in ("gelsd", "gelss"):
        singular_values = op.CastLike(s, self)
    return solution, residuals, rank, singular_values


# --- QR by Householder reflections, with LAPACK's conventions ---------------------------------------------------
# geqrf's reflector for a column x: beta = -sign(x_0) |x|, v = [1, x_1.. / (x_0 - beta)], tau = (beta - x_0) / beta
# (tau = 0 when x below its head is zero). Q = H_0 H_1 ... is orgqr's; the packed form and tau are geqrf's.
def _reflector(column: TFloat, k: int, rows: INT64) -> tuple[TFloat, TFloat, TFloat]:
    """(v [..., m, 1] with v_k = 1 and zeros above k, tau [..., 1, 1], beta [..., 1, 1]) for rows k.. of a column."""
    zero, one = _scalar_like(0.0, column), _scalar_like(1.0, column)
    head = _rows(column, k, k + 1)
    below = op.Greater(rows, _ints(k))
    tail = op.Where(below, column, zero)
    tail_norm = op.Sqrt(op.ReduceSum(op.Mul(tail, tail), _ints(-2), keepdims=1))
    trivial = op.Equal(tail_norm, zero)
    norm = op.Sqrt(op.Add(op.Mul(head, head), op.Mul(tail_norm, tail_norm)))
    beta = op.Where(op.Less(head, zero), norm, op.Neg(norm))  # -sign(head) |x|, with sign(0) = +
    beta = op.Where(trivial, head, beta)
    safe_beta = op.Where(trivial, one, beta)
    tau = op.Where(trivial, zero, op.Div(op.Sub(beta, head), safe_beta))
    scale = op.Where(trivial, one, op.Sub(head, beta))
    v = op.Where(below, op.Div(tail, scale), op.Where(op.Equal(rows, _ints(k)), one, zero))
    return v, tau, beta


def _apply_reflector(v: TFloat, tau: TFloat, target: TFloat) -> TFloat:
    """(I - tau v v^T) target."""
    return op.Sub(target, op.Mul(tau, op.MatMul(v, op.MatMul(_transpose(v), target))))


def _geqrf(a: TFloat) -> tuple[TFloat, TFloat, list[TFloat], list[TFloat]]:
    """geqrf's packed result, tau [..., k], and each reflector's v and tau."""
    m, n = a.shape[-2], a.shape[-1]
    rows, columns = _index_column(m), _index_row(n)
    vs, taus = [], []
    for k in range(min(m, n)):
        v, tau, beta = _reflector(_columns(a, k, k + 1), k, rows)
        updated = _apply_reflector(v, tau, a)
        a = op.Where(op.Greater(columns, _ints(k)), updated, a)
        packed_column = op.Where(
            op.Greater(rows, _ints(k)), v, op.Where(op.Equal(rows, _ints(k)), beta, _columns(a, k, k + 1))
        )
        a = op.Where(op.Equal(columns, _ints(k)), packed_column, a)
        vs.append(v)
        taus.append(tau)
    if taus:
        tau_vector = op.Concat(*[op.Squeeze(t, _ints(-1)) for t in taus], axis=-1)
    else:
        tau_vector = op.Reshape(_batch_filled(a, [0, 1], 0.0, a), op.Concat(op.Shape(a, end=-2), _ints(0), axis=0))
    return a, tau_vector, vs, taus


def _q_from_reflectors(vs: list[TFloat], taus: list[TFloat], like: TFloat, m: int, columns: int) -> TFloat:
    """H_0 H_1 ... H_{k-1} applied to the first `columns` columns of the identity."""
    identity = np.eye(m, columns, dtype=np.float32)
    q = op.Expand(
        op.CastLike(op.Constant(value=ir.tensor(identity)), like),
        op.Concat(op.Shape(like, end=-2), _ints(m, columns), axis=0),
    )
    for v, tau in reversed(list(zip(vs, taus))):
        q = _apply_reflector(v, tau, q)
    return q


@lowering("aten::geqrf")
def geqrf(self: TFloat) -> tuple[TFloat, TFloat]:
    packed, tau, _, _ = _geqrf(self)
    return packed, tau


@lowering("aten::linalg_qr")
def linalg_qr(A: TFloat, mode: str = "reduced") -> tuple[TFloat, TFloat]:
    m, n = A.shape[-2], A.shape[-1]
    k = min(m, n)
    packed, _, vs, taus = _geqrf(A)
    rows, columns = _index_column(m), _index_row(n)
    r = op.Where(op.LessOrEqual(rows, columns), packed, _scalar_like(0.0, A))
    if mode == "r":
        return op.CastLike(op.Constant(value=ir.tensor(np.zeros((0,), dtype=np.float32))), A), r
    q_columns = m if mode == "complete" else k
    q = _q_from_reflectors(vs, taus, A, m, q_columns)
    return q, (r if mode == "complete" else _rows(r, 0, k))


def _reflectors_from_packed(packed: TFloat, tau: TFloat, count: int) -> tuple[list[TFloat], list[TFloat]]:
    m = packed.shape[-2]
    rows = _index_column(m)
    zero, one = _scalar_like(0.0, packed), _scalar_like(1.0, packed)
    vs, taus = [], []
    for k in range(count):
        column = _columns(packed, k, k + 1)
        vs.append(op.Where(op.Greater(rows, _ints(k)), column, op.Where(op.Equal(rows, _ints(k)), one, zero)))
        taus.append(op.Unsqueeze(op.Slice(tau, _ints(k), _ints(k + 1), _ints(-1)), _ints(-1)))
    return vs, taus


@lowering("aten::linalg_householder_product")
def linalg_householder_product(input: TFloat, tau: TFloat) -> TFloat:
    """orgqr: the first n columns of H_0 ... H_{k-1}, the reflectors stored below input's diagonal."""
    m, n = input.shape[-2], input.shape[-1]
    vs, taus = _reflectors_from_packed(input, tau, tau.shape[-1])
    return _q_from_reflectors(vs, taus, input, m, n)


@lowering("aten::ormqr")
def ormqr(self: TFloat, input2: TFloat, input3: TFloat, left: bool = True, transpose: bool = False) -> TFloat:
    """op(Q) C or C op(Q), with Q = H_0 ... H_{k-1} from geqrf's packed reflectors (self) and tau (input2)."""
    vs, taus = _reflectors_from_packed(self, input2, input2.shape[-1])
    pairs = list(zip(vs, taus))
    target = input3 if left else _transpose(input3)
    # Q C applies H_{k-1} first; Q^T C applies H_0 first. C Q = (Q^T C^T)^T and C Q^T = (Q C^T)^T.
    forward = transpose if left else not transpose
    for v, tau in pairs if forward else reversed(pairs):
        target = _apply_reflector(v, tau, target)
    return target if left else _transpose(target)
