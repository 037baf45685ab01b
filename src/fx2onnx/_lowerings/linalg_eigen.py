"""Singular value and eigen decompositions on static matrix sizes: svd and eigh by one-sided Jacobi in float64,
eig/eigvals of real matrices by LAPACK's geev step by step (balancing, Hessenberg reduction, lahqr's
double-shift QR, trevc's eigenvectors).
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import onnx_ir as ir
from onnxscript import BOOL, DOUBLE, FLOAT, INT64
from onnxscript import opset18 as op

from fx2onnx._emit.context import LoweringContext
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
from fx2onnx._lowerings.builders import TFloat
from fx2onnx._lowerings.rules import lowering

# --- singular values and symmetric eigenvalues: one-sided Jacobi in float64 --------------------------------------
# Hestenes' one-sided Jacobi orthogonalizes A's columns by plane rotations; their norms are then the singular
# values. It is accurate to float64's precision for the small static sizes unrolled here; a fixed number of
# sweeps (convergence is quadratic) replaces the data-dependent stopping test. Signs of singular vectors
# (and eigenvectors) are those of the rotations, not necessarily LAPACK's.
_JACOBI_SWEEPS = 10


def _jacobi(a: DOUBLE, m: int, n: int) -> tuple[list[DOUBLE], list[DOUBLE]]:
    """A V = [c_0 ... c_{n-1}] with orthogonal columns: the columns c_j ([..., m, 1]) and V's ([..., n, 1])."""
    columns = [_columns(a, j, j + 1) for j in range(n)]
    eye = np.eye(n, dtype=np.float64)
    batch_shape = op.Concat(op.Shape(a, end=-2), _ints(n, 1), axis=0)
    vectors = [op.Expand(op.Constant(value=ir.tensor(eye[:, j : j + 1].copy())), batch_shape) for j in range(n)]
    one, zero = op.Constant(value_float=1.0), op.Constant(value_float=0.0)
    one, zero = op.Cast(one, to=DOUBLE.dtype), op.Cast(zero, to=DOUBLE.dtype)
    axes = _ints(-2)
    for _ in range(_JACOBI_SWEEPS):
        for p in range(n):
            for q in range(p + 1, n):
                cp, cq = columns[p], columns[q]
                alpha = op.ReduceSum(op.Mul(cp, cp), axes, keepdims=1)
                beta = op.ReduceSum(op.Mul(cq, cq), axes, keepdims=1)
                gamma = op.ReduceSum(op.Mul(cp, cq), axes, keepdims=1)
                rotate = op.Greater(op.Abs(gamma), zero)  # already orthogonal: no rotation
                safe_gamma = op.Where(rotate, gamma, one)
                zeta = op.Div(op.Sub(beta, alpha), op.Mul(safe_gamma, _scalar_like(2.0, gamma)))
                sign = op.Where(op.Less(zeta, zero), op.Neg(one), one)
                t = op.Div(sign, op.Add(op.Abs(zeta), op.Sqrt(op.Add(one, op.Mul(zeta, zeta)))))
                c = op.Div(one, op.Sqrt(op.Add(one, op.Mul(t, t))))
                s = op.Mul(c, t)
                c, s = op.Where(rotate, c, one), op.Where(rotate, s, zero)
                columns[p], columns[q] = op.Sub(op.Mul(c, cp), op.Mul(s, cq)), op.Add(op.Mul(s, cp), op.Mul(c, cq))
                vp, vq = vectors[p], vectors[q]
                vectors[p], vectors[q] = op.Sub(op.Mul(c, vp), op.Mul(s, vq)), op.Add(op.Mul(s, vp), op.Mul(c, vq))
    return columns, vectors


def _svd_tall(a: DOUBLE, m: int, n: int) -> tuple[DOUBLE, DOUBLE, DOUBLE]:
    """U [..., m, n], S [..., n] (descending), V [..., n, n] of a float64 [..., m, n] with m >= n >= 1."""
    columns, vectors = _jacobi(a, m, n)
    norms = [op.Sqrt(op.ReduceSum(op.Mul(c, c), _ints(-2), keepdims=1)) for c in columns]  # [..., 1, 1] each
    zero = op.Cast(op.Constant(value_float=0.0), to=DOUBLE.dtype)
    units = [
        op.Where(
            op.Greater(s, zero),
            op.Div(
                c, op.Where(op.Greater(s, zero), s, op.Add(s, op.Cast(op.Constant(value_float=1.0), to=DOUBLE.dtype)))
            ),
            zero,
        )
        for c, s in zip(columns, norms)
    ]
    values = op.Concat(*norms, axis=-1)  # [..., 1, n]
    _, order = op.TopK(values, _ints(n), axis=-1, largest=1, sorted=1)  # [..., 1, n]
    values = op.GatherElements(values, order, axis=-1)
    u = op.GatherElements(
        op.Concat(*units, axis=-1), op.Expand(order, op.Concat(op.Shape(a, end=-2), _ints(m, n), axis=0)), axis=-1
    )
    v = op.GatherElements(
        op.Concat(*vectors, axis=-1), op.Expand(order, op.Concat(op.Shape(a, end=-2), _ints(n, n), axis=0)), axis=-1
    )
    return u, op.Squeeze(values, _ints(-2)), v


def _svd(self: TFloat) -> tuple[TFloat, TFloat, TFloat]:
    """Reduced U, S, Vh in self's dtype (computed in float64)."""
    m, n = self.shape[-2], self.shape[-1]
    k = min(m, n)
    if k == 0 or 0 in list(self.shape)[:-2]:  # nothing to decompose: empty factors of the right shapes
        return (
            _batch_filled(self, [m, k], 0.0, self),
            op.Reshape(_batch_filled(self, [k, 1], 0.0, self), op.Concat(op.Shape(self, end=-2), _ints(k), axis=0)),
            _batch_filled(self, [k, n], 0.0, self),
        )
    a = op.Cast(self, to=DOUBLE.dtype)
    if m >= n:
        u, s, v = _svd_tall(a, m, n)
        vh = _transpose(v)
    else:  # A^T = U' S V'^T, so A = V' S U'^T
        u_t, s, v_t = _svd_tall(_transpose(a), n, m)
        u, vh = v_t, _transpose(u_t)
    return op.CastLike(u, self), op.CastLike(s, self), op.CastLike(vh, self)


@lowering("aten::_linalg_svd")
def linalg_svd(
    A: TFloat, full_matrices: bool = False, compute_uv: bool = True, driver: str | None = None
) -> tuple[TFloat, TFloat, TFloat]:
    m, n = A.shape[-2], A.shape[-1]
    if compute_uv and full_matrices and m != n:
        raise NotImplementedError("full_matrices=True with a rectangular matrix has no lowering here")
    u, s, vh = _svd(A)
    if not compute_uv:
        empty = op.CastLike(op.Constant(value=ir.tensor(np.zeros((0,), dtype=np.float32))), A)
        return empty, s, empty
    return u, s, vh


def _symmetric(a: TFloat, lower: bool) -> TFloat:
    """The symmetric matrix that a's lower (or upper) triangle describes."""
    n = a.shape[-1]
    rows, columns = _index_column(n), _index_row(n)
    keep = op.GreaterOrEqual(rows, columns) if lower else op.LessOrEqual(rows, columns)
    return op.Where(keep, a, _transpose(a))


def _eigh(self: TFloat, lower: bool) -> tuple[TFloat, TFloat]:
    """Ascending eigenvalues and eigenvectors of a symmetric matrix: the SVD of A + c I, with c making it PD."""
    n = self.shape[-1]
    if n == 0 or 0 in list(self.shape)[:-2]:
        values = op.Reshape(_batch_filled(self, [n, 1], 0.0, self), op.Concat(op.Shape(self, end=-2), _ints(n), axis=0))
        return values, op.Identity(self)
    a = op.Cast(_symmetric(self, lower), to=DOUBLE.dtype)
    shift = op.Add(
        op.Sqrt(op.ReduceSum(op.Mul(a, a), _ints(-2, -1), keepdims=1)),
        op.Cast(op.Constant(value_float=1.0), to=DOUBLE.dtype),
    )
    identity = op.Constant(value=ir.tensor(np.eye(n, dtype=np.float64)))
    _, s, v = _svd_tall(op.Add(a, op.Mul(shift, identity)), n, n)
    values = op.Sub(s, op.Squeeze(shift, _ints(-1)))  # descending
    reverse = list(range(n - 1, -1, -1))
    ascending = op.Gather(values, op.Constant(value_ints=reverse), axis=-1)
    vectors = op.Gather(v, op.Constant(value_ints=reverse), axis=-1)
    return op.CastLike(ascending, self), op.CastLike(vectors, self)


@lowering("aten::_linalg_eigh")
def linalg_eigh(A: TFloat, UPLO: str = "L", compute_v: bool = True) -> tuple[TFloat, TFloat]:
    values, vectors = _eigh(A, UPLO == "L")
    if not compute_v:
        vectors = op.CastLike(op.Constant(value=ir.tensor(np.zeros((0,), dtype=np.float32))), A)
    return values, vectors


# --- nonsymmetric eigenvalues: LAPACK's geev, step by step -------------------------------------------------------
# Eager (CPU) calls ?geev: balance (?gebal 'B': isolate eigenvalues by permutations, then scale rows and columns by
# powers of 2), reduce to Hessenberg form by Householder reflections (?gehd2), then the double-shift QR of ?lahqr
# (hseqr's choice below 75 rows) until the quasi-triangular Schur form; the eigenvalues are read off its diagonal
# in order (a 2x2 block standardized by ?lanv2 holds a complex-conjugate pair, the one with positive imaginary part
# first). Reproducing the same shifts and deflation tests gives eager's order. Each matrix of a batch is its own
# state machine: an ONNX Loop steps all of them at once (a QR sweep or a deflation each), each held once done.
TEig = TypeVar("TEig", FLOAT, DOUBLE)
_HQR_EXCEPTIONAL = 10  # ?lahqr's KEXSH: an exceptional shift every 10 sweeps without deflation
_BALANCE_DOUBLINGS = 6  # factor-of-2 steps of gebal's scaling per sweep (4^6 = 4096; more sweeps continue it)


def _typed(value: float, like: TEig) -> TEig:
    """A scalar constant of like's dtype (float64 constants keep their precision and range)."""
    dtype = np.float64 if like.dtype == ir.DataType.DOUBLE else np.float32
    return op.Constant(value=ir.tensor(np.array(value, dtype=dtype)))


def _clamped(index: INT64, n: int) -> INT64:
    """An index held in 0..n-1 (where it is out of range the caller masks the result)."""
    return op.Clip(index, op.Constant(value=ir.tensor(np.int64(0))), op.Constant(value=ir.tensor(np.int64(n - 1))))


def _matrix_entry(a: TEig, row: INT64, column: INT64, n: int) -> TEig:
    """a[b, row[b], column[b]] ([B, 1, 1]) of a [B, n, n]; indices clamped into range (callers mask)."""
    row, column = _clamped(row, n), _clamped(column, n)
    flat = op.Reshape(a, _ints(0, n * n))
    index = op.Reshape(op.Add(op.Mul(row, _ints(n)), column), _ints(-1, 1))
    return op.Reshape(op.GatherElements(flat, index, axis=1), _ints(-1, 1, 1))


def _diagonal(a: TEig, n: int, offset: int) -> TEig:
    """The diagonal a[k + offset, k] (offset 0: main, 1: sub, -1: super) as [B, n - |offset|]."""
    count = n - abs(offset)
    rows = np.arange(count) + max(offset, 0)
    columns = np.arange(count) + max(-offset, 0)
    flat = op.Reshape(a, _ints(0, n * n))
    return op.Gather(flat, op.Constant(value=ir.tensor((rows * n + columns).astype(np.int64))), axis=1)


def _sign_of(magnitude: TEig, sign_source: TEig) -> TEig:
    """Fortran's SIGN(magnitude, sign_source): |magnitude| with the sign of sign_source (+ for +0)."""
    positive = op.Abs(magnitude)
    return op.Where(op.Less(sign_source, _typed(0.0, sign_source)), op.Neg(positive), positive)


def _lapy2(x: TEig, y: TEig) -> TEig:
    """?lapy2: sqrt(x^2 + y^2) as LAPACK computes it (scaled by the larger)."""
    ax, ay = op.Abs(x), op.Abs(y)
    w, z = op.Max(ax, ay), op.Min(ax, ay)
    zero, one = _typed(0.0, x), _typed(1.0, x)
    safe_w = op.Where(op.Equal(w, zero), one, w)
    ratio = op.Div(z, safe_w)
    scaled = op.Mul(w, op.Sqrt(op.Add(one, op.Mul(ratio, ratio))))
    return op.Where(op.Equal(z, zero), w, scaled)


def _norm2(x: TEig, axes: list[int]) -> TEig:
    """The Euclidean norm over `axes` (kept), scaled by the largest magnitude as LAPACK's dnrm2 is scaled, so that
    the squares of tiny entries (a bulge far below the matrix's scale) do not underflow."""
    zero, one = _typed(0.0, x), _typed(1.0, x)
    largest = op.ReduceMax(op.Abs(x), _ints(*axes), keepdims=1)
    safe = op.Where(op.Equal(largest, zero), one, largest)
    scaled = op.Div(x, safe)
    return op.Mul(safe, op.Sqrt(op.ReduceSum(op.Mul(scaled, scaled), _ints(*axes), keepdims=1)))


def _larfg(alpha: TEig, x: list[TEig]) -> tuple[TEig, TEig, list[TEig]]:
    """?larfg on [B, 1, 1] scalars: (beta, tau, scaled x) of the reflector taking (alpha, x) to (beta, 0...)."""
    zero, one = _typed(0.0, alpha), _typed(1.0, alpha)
    if not x:
        return alpha, zero, []
    xnorm = _norm2(op.Concat(*x, axis=-1), [-1])
    trivial = op.Equal(xnorm, zero)
    beta = op.Neg(_sign_of(_lapy2(alpha, xnorm), alpha))
    safe_beta = op.Where(trivial, one, beta)
    tau = op.Where(trivial, zero, op.Div(op.Sub(safe_beta, alpha), safe_beta))
    denominator = op.Where(trivial, one, op.Sub(alpha, safe_beta))
    reciprocal = op.Div(one, denominator)
    scaled = [op.Where(trivial, element, op.Mul(element, reciprocal)) for element in x]
    return op.Where(trivial, alpha, beta), tau, scaled


def _constants(like: TEig) -> dict[str, float]:
    """LAPACK's machine constants (?lamch) for like's dtype."""
    info = np.finfo(np.float64 if like.dtype == ir.DataType.DOUBLE else np.float32)
    ulp, safmin = float(info.eps), float(info.tiny)  # dlamch('P'), dlamch('S')
    return {"ulp": ulp, "safmin": safmin, "sfmin1": safmin / ulp}


def _swap_index(columns: INT64, first: INT64, second: INT64, swap: BOOL) -> INT64:
    """The gather index [B, 1, n] exchanging positions first and second where swap holds, else the identity."""
    exchanged = op.Where(op.Equal(columns, first), second, op.Where(op.Equal(columns, second), first, columns))
    return op.Where(swap, exchanged, op.Expand(columns, op.Shape(exchanged)))


def _permuted(a: TEig, index: INT64, n: int) -> TEig:
    """P^T a P for the symmetric exchange `index` ([B, 1, n])."""
    rows = op.GatherElements(a, op.Expand(op.Reshape(index, _ints(-1, n, 1)), op.Shape(a)), axis=1)
    return op.GatherElements(rows, op.Expand(index, op.Shape(a)), axis=2)


def _gebal_permute(ctx: LoweringContext, a: TEig, n: int) -> tuple[TEig, INT64, INT64, INT64]:
    """gebal's search for rows, then columns, isolating an eigenvalue, each moved to the bottom (top) of the
    active window as gebal moves it; returns the permuted matrix, the permutation ([B, 1, n]: row r of the result
    is row perm[r] of a) and ilo, ihi ([B, 1, 1], 0-based)."""
    rows, columns = _index_column(n), _index_row(n)
    batch_one = op.Concat(op.Shape(a, end=1), _ints(1, 1), axis=0)
    zero_int = op.Expand(_ints(0), batch_one)
    last = op.Expand(_ints(n - 1), batch_one)
    perm = op.Expand(columns, op.Concat(op.Shape(a, end=1), _ints(1, n), axis=0))
    one = _ints(1)

    def step(iteration: ir.Value, carried: list[ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
        a, perm, low, high, scan, changed, phase = carried
        row_phase, column_phase = op.Equal(phase, _ints(0)), op.Equal(phase, _ints(1))
        running = op.Less(phase, _ints(2))
        zero = _typed(0.0, a)
        row = op.GatherElements(
            a, op.Expand(_clamped(scan, n), op.Concat(op.Shape(a, end=1), _ints(1, n), axis=0)), axis=1
        )
        row_off = op.And(
            op.And(op.Not(op.Equal(columns, scan)), op.LessOrEqual(columns, high)), op.Not(op.Equal(row, zero))
        )
        column = op.GatherElements(
            a, op.Expand(_clamped(scan, n), op.Concat(op.Shape(a, end=1), _ints(n, 1), axis=0)), axis=2
        )
        inside = op.And(op.GreaterOrEqual(rows, low), op.LessOrEqual(rows, high))
        column_off = op.And(op.And(op.Not(op.Equal(rows, scan)), inside), op.Not(op.Equal(column, zero)))
        row_free = op.Not(
            op.Cast(op.ReduceMax(op.Cast(row_off, to=INT64.dtype), _ints(-2, -1), keepdims=1), to=BOOL.dtype)
        )
        column_free = op.Not(
            op.Cast(op.ReduceMax(op.Cast(column_off, to=INT64.dtype), _ints(-2, -1), keepdims=1), to=BOOL.dtype)
        )
        swap = op.And(running, op.Where(row_phase, row_free, column_free))
        target = op.Where(row_phase, high, low)
        index = _swap_index(columns, scan, target, swap)
        a = _permuted(a, index, n)
        perm = op.GatherElements(perm, index, axis=2)
        changed = op.Or(changed, swap)
        row_swap, column_swap = op.And(swap, row_phase), op.And(swap, column_phase)
        all_isolated = op.And(row_swap, op.Equal(high, _ints(0)))
        high = op.Where(op.And(row_swap, op.Greater(high, _ints(0))), op.Sub(high, one), high)
        low = op.Where(column_swap, op.Add(low, one), low)
        # the scan moves on; at the end of a pass it restarts if anything moved, else the phase ends
        scan = op.Where(row_phase, op.Sub(scan, one), op.Add(scan, one))
        row_pass_over = op.And(row_phase, op.Less(scan, _ints(0)))
        column_pass_over = op.And(column_phase, op.Greater(scan, high))
        scan = op.Where(op.And(row_pass_over, changed), high, scan)
        scan = op.Where(op.And(column_pass_over, changed), low, scan)
        next_phase = op.Where(op.And(row_pass_over, op.Not(changed)), _ints(1), phase)
        scan = op.Where(op.And(row_pass_over, op.Not(changed)), low, scan)
        next_phase = op.Where(op.And(column_pass_over, op.Not(changed)), _ints(2), next_phase)
        next_phase = op.Where(all_isolated, _ints(2), next_phase)
        changed = op.And(changed, op.Not(op.Or(row_pass_over, column_pass_over)))
        more = _any(op.Less(next_phase, _ints(2)))
        return more, [a, perm, low, high, scan, changed, next_phase]

    unchanged = op.Equal(zero_int, _ints(1))
    a, perm, low, high, _, _, _ = ctx.loop(
        op.Constant(value=ir.tensor(np.int64(2 * n * n + 2 * n + 2))),
        op.Constant(value=ir.tensor(True)),
        [a, perm, zero_int, last, last, unchanged, zero_int],
        step,
        name="gebal_permute",
        carried_shapes=True,
    )
    return a, perm, low, high


def _any(flags: BOOL) -> BOOL:
    """Whether any element holds: a scalar, as a Loop's condition."""
    return op.Cast(op.ReduceMax(op.Cast(flags, to=INT64.dtype), keepdims=0), to=BOOL.dtype)


def _gebal_scale(ctx: LoweringContext, a: TEig, low: INT64, high: INT64, n: int) -> tuple[TEig, TEig]:
    """gebal's scaling of rows and columns low..high by powers of 2 until each row and column have norms within a
    factor 0.95 of balance; returns the balanced matrix and the scale factors ([B, 1, n], 1 outside)."""
    rows, columns = _index_column(n), _index_row(n)
    constants = _constants(a)
    sfmin1 = constants["sfmin1"]
    sfmax1, sfmin2 = 1.0 / sfmin1, sfmin1 * 2.0
    sfmax2 = 1.0 / sfmin2
    scale = _batch_filled(a, [1, n], 1.0, a)
    in_rows = op.And(op.GreaterOrEqual(rows, low), op.LessOrEqual(rows, high))  # [B, n, 1]
    in_columns = op.And(op.GreaterOrEqual(columns, low), op.LessOrEqual(columns, high))  # [B, 1, n]
    rows_to_high = op.LessOrEqual(rows, high)
    columns_from_low = op.GreaterOrEqual(columns, low)

    def step(iteration: ir.Value, carried: list[ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
        a, scale, unconverged = carried
        zero, one, two = _typed(0.0, a), _typed(1.0, a), _typed(2.0, a)
        half = _typed(0.5, a)
        big, small = _typed(sfmax2, a), _typed(sfmin2, a)
        moved = op.Equal(unconverged, op.Not(unconverged))  # all False, [B, 1, 1]
        for i in range(n):
            active = op.And(unconverged, op.And(op.LessOrEqual(low, _ints(i)), op.GreaterOrEqual(high, _ints(i))))
            column, row = _columns(a, i, i + 1), _rows(a, i, i + 1)
            c = _norm2(op.Where(in_rows, column, zero), [-2, -1])
            r = _norm2(op.Where(in_columns, row, zero), [-2, -1])
            ca = op.ReduceMax(op.Where(rows_to_high, op.Abs(column), zero), _ints(-2, -1), keepdims=1)
            ra = op.ReduceMax(op.Where(columns_from_low, op.Abs(row), zero), _ints(-2, -1), keepdims=1)
            active = op.And(active, op.Not(op.Or(op.Equal(c, zero), op.Equal(r, zero))))
            total = op.Add(c, r)
            f, g = one, op.Div(r, two)
            going = active
            for _ in range(_BALANCE_DOUBLINGS):
                going = op.And(
                    going,
                    op.And(
                        op.Less(c, g),
                        op.And(op.Less(op.Max(f, c, ca), big), op.Greater(op.Min(r, g, ra), small)),
                    ),
                )
                f, c, ca = (
                    op.Where(going, op.Mul(f, two), f),
                    op.Where(going, op.Mul(c, two), c),
                    op.Where(going, op.Mul(ca, two), ca),
                )
                r, g, ra = (
                    op.Where(going, op.Mul(r, half), r),
                    op.Where(going, op.Mul(g, half), g),
                    op.Where(going, op.Mul(ra, half), ra),
                )
            g = op.Div(c, two)
            going = active
            for _ in range(_BALANCE_DOUBLINGS):
                going = op.And(
                    going,
                    op.And(
                        op.GreaterOrEqual(g, r),
                        op.And(op.Less(op.Max(r, ra), big), op.Greater(op.Min(op.Min(f, c), op.Min(g, ca)), small)),
                    ),
                )
                f, c, g = (
                    op.Where(going, op.Mul(f, half), f),
                    op.Where(going, op.Mul(c, half), c),
                    op.Where(going, op.Mul(g, half), g),
                )
                ca, r, ra = (
                    op.Where(going, op.Mul(ca, half), ca),
                    op.Where(going, op.Mul(r, two), r),
                    op.Where(going, op.Mul(ra, two), ra),
                )
            current = _columns(scale, i, i + 1)  # [B, 1, 1]
            balanced_enough = op.GreaterOrEqual(op.Add(c, r), op.Mul(_typed(0.95, a), total))
            underflows = op.And(
                op.And(op.Less(f, one), op.Less(current, one)),
                op.LessOrEqual(op.Mul(f, current), _typed(sfmin1, a)),
            )
            overflows = op.And(
                op.And(op.Greater(f, one), op.Greater(current, one)),
                op.GreaterOrEqual(current, op.Div(_typed(sfmax1, a), f)),
            )
            apply = op.And(active, op.Not(op.Or(balanced_enough, op.Or(underflows, overflows))))
            moved = op.Or(moved, apply)
            scale = op.Where(op.And(apply, op.Equal(columns, _ints(i))), op.Mul(current, f), scale)
            row_factor = op.Where(
                op.And(apply, op.And(op.Equal(rows, _ints(i)), columns_from_low)), op.Div(one, f), one
            )
            column_factor = op.Where(op.And(apply, op.And(op.Equal(columns, _ints(i)), rows_to_high)), f, one)
            a = op.Mul(op.Mul(a, row_factor), column_factor)
        return _any(moved), [a, scale, moved]

    start = op.Not(op.Equal(low, op.Add(high, _ints(1))))  # all True, [B, 1, 1]
    start = op.Or(start, op.Not(start))
    a, scale, _ = ctx.loop(
        op.Constant(value=ir.tensor(np.int64(4000))),
        op.Constant(value=ir.tensor(True)),
        [a, scale, start],
        step,
        name="gebal_scale",
        carried_shapes=True,
    )
    return a, scale


def _gehd2(a: TEig, low: INT64, high: INT64, n: int) -> tuple[TEig, list[TEig], list[TEig]]:
    """gehd2: Householder reduction of rows and columns low..high to upper Hessenberg form; returns it (zero below
    the subdiagonal) and each step's reflector (v [B, n, 1] with v[i + 1] = 1, tau [B, 1, 1])."""
    rows, columns = _index_column(n), _index_row(n)
    zero, one = _typed(0.0, a), _typed(1.0, a)
    vs, taus = [], []
    for i in range(n - 2):
        active = op.And(op.LessOrEqual(low, _ints(i)), op.Greater(high, _ints(i)))
        column = _columns(a, i, i + 1)
        alpha = op.Slice(a, _ints(i + 1, i), _ints(i + 2, i + 1), _ints(-2, -1))
        below = op.And(active, op.And(op.GreaterOrEqual(rows, _ints(i + 2)), op.LessOrEqual(rows, high)))
        x = op.Where(below, column, zero)
        xnorm = _norm2(x, [-2, -1])
        trivial = op.Or(op.Equal(xnorm, zero), op.Not(active))
        beta = op.Neg(_sign_of(_lapy2(alpha, xnorm), alpha))
        safe_beta = op.Where(trivial, one, beta)
        tau = op.Where(trivial, zero, op.Div(op.Sub(safe_beta, alpha), safe_beta))
        reciprocal = op.Div(one, op.Where(trivial, one, op.Sub(alpha, safe_beta)))
        v = op.Where(op.Equal(rows, _ints(i + 1)), one, op.Where(below, op.Mul(x, reciprocal), zero))
        # from the right on rows 0..high (rows below are zero in these columns), then from the left
        a = op.Sub(a, op.Mul(tau, op.MatMul(op.MatMul(a, v), _transpose(v))))
        updated = op.Sub(a, op.Mul(tau, op.MatMul(v, op.MatMul(_transpose(v), a))))
        a = op.Where(op.Greater(columns, _ints(i)), updated, a)
        head = op.Where(trivial, alpha, beta)
        new_column = op.Where(op.Equal(rows, _ints(i + 1)), head, op.Where(below, zero, column))
        a = op.Where(op.Equal(columns, _ints(i)), new_column, a)
        vs.append(v)
        taus.append(tau)
    return a, vs, taus


def _lanv2(a: TEig, b: TEig, c: TEig, d: TEig, eps: float) -> tuple[TEig, TEig, TEig, TEig, TEig, TEig]:
    """lanv2: the Schur factorization of a real 2x2 block, standardized (a real pair: c = 0; a complex pair:
    a = d and b c < 0); returns (a, b, c, d, cs, sn) on [B, 1, 1] values."""
    zero, one, half = _typed(0.0, a), _typed(1.0, a), _typed(0.5, a)
    sign = lambda x: _sign_of(one, x)  # noqa: E731
    # case 1: c == 0, nothing to do; case 2: b == 0, swap rows and columns
    c_zero, b_zero = op.Equal(c, zero), op.Equal(b, zero)
    same_signless = op.And(op.Equal(op.Sub(a, d), zero), op.Not(op.Equal(sign(b), sign(c))))
    temp = op.Sub(a, d)
    p = op.Mul(half, temp)
    bcmax = op.Max(op.Abs(b), op.Abs(c))
    bcmis = op.Mul(op.Mul(op.Min(op.Abs(b), op.Abs(c)), sign(b)), sign(c))
    scale = op.Max(op.Abs(p), bcmax)
    safe_scale = op.Where(op.Equal(scale, zero), one, scale)
    z = op.Add(op.Mul(op.Div(p, safe_scale), p), op.Mul(op.Div(bcmax, safe_scale), bcmis))
    real_pair = op.GreaterOrEqual(z, _typed(4.0 * eps, a))
    # real eigenvalues: one rotation makes c zero
    zr = op.Add(p, _sign_of(op.Mul(op.Sqrt(scale), op.Sqrt(op.Abs(z))), p))
    safe_zr = op.Where(op.Equal(zr, zero), one, zr)
    real_a = op.Add(d, zr)
    real_d = op.Sub(d, op.Mul(op.Div(bcmax, safe_zr), bcmis))
    tau = _lapy2(c, zr)
    safe_tau = op.Where(op.Equal(tau, zero), one, tau)
    real_cs, real_sn = op.Div(zr, safe_tau), op.Div(c, safe_tau)
    real_b = op.Sub(b, c)
    # complex or almost equal real eigenvalues: make the diagonal equal
    sigma = op.Add(b, c)
    tau2 = _lapy2(sigma, temp)
    safe_tau2 = op.Where(op.Equal(tau2, zero), one, tau2)
    cs = op.Sqrt(op.Mul(half, op.Add(one, op.Div(op.Abs(sigma), safe_tau2))))
    sn = op.Mul(op.Neg(op.Div(p, op.Mul(safe_tau2, cs))), sign(sigma))
    aa = op.Add(op.Mul(a, cs), op.Mul(b, sn))
    bb = op.Add(op.Mul(op.Neg(a), sn), op.Mul(b, cs))
    cc = op.Add(op.Mul(c, cs), op.Mul(d, sn))
    dd = op.Add(op.Mul(op.Neg(c), sn), op.Mul(d, cs))
    a2 = op.Add(op.Mul(aa, cs), op.Mul(cc, sn))
    b2 = op.Add(op.Mul(bb, cs), op.Mul(dd, sn))
    c2 = op.Add(op.Neg(op.Mul(aa, sn)), op.Mul(cc, cs))
    d2 = op.Add(op.Mul(op.Neg(bb), sn), op.Mul(dd, cs))
    mean = op.Mul(half, op.Add(a2, d2))
    c2_nonzero, b2_nonzero = op.Not(op.Equal(c2, zero)), op.Not(op.Equal(b2, zero))
    same_sign = op.Equal(sign(b2), sign(c2))
    split = op.And(c2_nonzero, op.And(b2_nonzero, same_sign))  # real after all: split it
    sab, sac = op.Sqrt(op.Abs(b2)), op.Sqrt(op.Abs(c2))
    p2 = _sign_of(op.Mul(sab, sac), c2)
    tau3 = op.Div(one, op.Sqrt(op.Abs(op.Add(b2, c2))))
    cs1, sn1 = op.Mul(sab, tau3), op.Mul(sac, tau3)
    split_cs = op.Sub(op.Mul(cs, cs1), op.Mul(sn, sn1))
    split_sn = op.Add(op.Mul(cs, sn1), op.Mul(sn, cs1))
    flip = op.And(c2_nonzero, op.Not(b2_nonzero))  # b == 0: swap
    complex_a = op.Where(split, op.Add(mean, p2), mean)
    complex_d = op.Where(split, op.Sub(mean, p2), mean)
    complex_b = op.Where(split, op.Sub(b2, c2), op.Where(flip, op.Neg(c2), b2))
    complex_c = op.Where(op.Or(split, flip), zero, c2)
    complex_cs = op.Where(split, split_cs, op.Where(flip, op.Neg(sn), cs))
    complex_sn = op.Where(split, split_sn, op.Where(flip, cs, sn))
    # general case: real pair or not
    ga = op.Where(real_pair, real_a, complex_a)
    gb = op.Where(real_pair, real_b, complex_b)
    gc = op.Where(real_pair, zero, complex_c)
    gd = op.Where(real_pair, real_d, complex_d)
    gcs = op.Where(real_pair, real_cs, complex_cs)
    gsn = op.Where(real_pair, real_sn, complex_sn)
    # the special cases first
    keep = op.Or(c_zero, same_signless)
    out_a = op.Where(keep, a, op.Where(b_zero, d, ga))
    out_b = op.Where(keep, b, op.Where(b_zero, op.Neg(c), gb))
    out_c = op.Where(keep, c, op.Where(b_zero, zero, gc))
    out_d = op.Where(keep, d, op.Where(b_zero, a, gd))
    out_cs = op.Where(keep, one, op.Where(b_zero, zero, gcs))
    out_sn = op.Where(keep, zero, op.Where(b_zero, one, gsn))
    return out_a, out_b, out_c, out_d, out_cs, out_sn


def _set_where(a: TEig, mask: BOOL, value: TEig) -> TEig:
    return op.Where(mask, value, a)


def _rotate_pairs(x: TEig, y: TEig, cs: TEig, sn: TEig) -> tuple[TEig, TEig]:
    """drot: (cs x + sn y, cs y - sn x)."""
    return op.Add(op.Mul(cs, x), op.Mul(sn, y)), op.Sub(op.Mul(cs, y), op.Mul(sn, x))


def _lahqr(ctx: LoweringContext, h: TEig, z: TEig | None, low: INT64, high: INT64, n: int) -> tuple[TEig, TEig | None]:
    """lahqr with wantt (the whole Schur form is updated, as geev with vectors asks; the eigenvalues are the same
    without): double-shift QR sweeps on the active window, deflating from the bottom. Returns T (and Z Q)."""
    rows, columns = _index_column(n), _index_row(n)
    constants = _constants(h)
    ulp, safmin = constants["ulp"], constants["safmin"]
    count = op.Cast(op.Add(op.Sub(high, low), _ints(1)), to=h.dtype)
    smlnum_outer = op.Mul(_typed(safmin, h), op.Div(count, _typed(ulp, h)))
    ks = op.Constant(value=ir.tensor(np.arange(1, n, dtype=np.int64).reshape(1, n - 1)))  # subdiagonal rows
    ms = op.Constant(value=ir.tensor(np.arange(0, max(n - 2, 0), dtype=np.int64).reshape(1, max(n - 2, 0))))
    with_z = z is not None

    def entry(a: TEig, r: INT64, c: INT64) -> TEig:
        return _matrix_entry(a, r, c, n)

    def step(iteration: ir.Value, carried: list[ir.Value]) -> tuple[ir.Value, list[ir.Value]]:
        if with_z:
            h, z, bottom, window, kdefl = carried
        else:
            h, bottom, window, kdefl = carried
            z = None
        zero, one = _typed(0.0, h), _typed(1.0, h)
        ulp_, smlnum = _typed(ulp, h), op.Reshape(smlnum_outer, _ints(-1, 1))
        running = op.GreaterOrEqual(bottom, low)
        flat_low, flat_high = op.Reshape(low, _ints(-1, 1)), op.Reshape(high, _ints(-1, 1))
        flat_bottom, flat_window = op.Reshape(bottom, _ints(-1, 1)), op.Reshape(window, _ints(-1, 1))
        # the deflation test at every subdiagonal k (1..n-1), as [B, n-1]
        d = _diagonal(h, n, 0)
        sub, sup = _diagonal(h, n, 1), _diagonal(h, n, -1)
        d_above, d_at = op.Slice(d, _ints(0), _ints(n - 1), _ints(1)), op.Slice(d, _ints(1), _ints(n), _ints(1))
        hk = op.Abs(sub)
        tst = op.Add(op.Abs(d_above), op.Abs(d_at))
        padded = op.Concat(
            op.Slice(sub, _ints(0), _ints(1), _ints(1)), sub, op.Slice(sub, _ints(0), _ints(1), _ints(1)), axis=1
        )
        sub_before = op.Slice(padded, _ints(0), _ints(n - 1), _ints(1))  # h[k-1, k-2]
        sub_after = op.Slice(padded, _ints(2), _ints(n + 1), _ints(1))  # h[k+1, k]
        extra = op.Add(
            op.Where(op.GreaterOrEqual(op.Sub(ks, _ints(2)), flat_low), op.Abs(sub_before), zero),
            op.Where(op.LessOrEqual(op.Add(ks, _ints(1)), flat_high), op.Abs(sub_after), zero),
        )
        tst = op.Where(op.Equal(tst, zero), op.Add(tst, extra), tst)
        ab, ba = op.Max(hk, op.Abs(sup)), op.Min(hk, op.Abs(sup))
        difference = op.Abs(op.Sub(d_above, d_at))
        aa, bb = op.Max(op.Abs(d_at), difference), op.Min(op.Abs(d_at), difference)
        s = op.Add(aa, ab)
        safe_s = op.Where(op.Equal(s, zero), one, s)
        fine = op.LessOrEqual(
            op.Mul(ba, op.Div(ab, safe_s)), op.Max(smlnum, op.Mul(ulp_, op.Mul(bb, op.Div(aa, safe_s))))
        )
        negligible = op.Or(op.LessOrEqual(hk, smlnum), op.And(op.LessOrEqual(hk, op.Mul(ulp_, tst)), fine))
        candidate = op.And(negligible, op.And(op.Greater(ks, flat_window), op.LessOrEqual(ks, flat_bottom)))
        found = op.ReduceMax(op.Where(candidate, ks, flat_window), _ints(1), keepdims=1)
        window = op.Where(running, op.Reshape(found, _ints(-1, 1, 1)), window)
        cut = op.And(running, op.Greater(window, low))
        h = _set_where(
            h, op.And(cut, op.And(op.Equal(rows, window), op.Equal(columns, op.Sub(window, _ints(1))))), zero
        )
        deflate = op.And(running, op.GreaterOrEqual(window, op.Sub(bottom, _ints(1))))
        pair = op.And(deflate, op.Equal(window, op.Sub(bottom, _ints(1))))
        sweep = op.And(running, op.Not(deflate))
        # a 2x2 block at the bottom: standardize it, rotating the rest of T (and Z) with it
        top = op.Sub(bottom, _ints(1))
        a11, a12 = entry(h, top, top), entry(h, top, bottom)
        a21, a22 = entry(h, bottom, top), entry(h, bottom, bottom)
        a11, a12, a21, a22, cs, sn = _lanv2(a11, a12, a21, a22, ulp)
        row_top = op.GatherElements(
            h, op.Expand(_clamped(top, n), op.Concat(op.Shape(h, end=1), _ints(1, n), axis=0)), axis=1
        )
        row_bottom = op.GatherElements(
            h, op.Expand(_clamped(bottom, n), op.Concat(op.Shape(h, end=1), _ints(1, n), axis=0)), axis=1
        )
        new_top, new_bottom = _rotate_pairs(row_top, row_bottom, cs, sn)
        right = op.And(pair, op.Greater(columns, bottom))
        h = _set_where(h, op.And(right, op.Equal(rows, top)), new_top)
        h = _set_where(h, op.And(right, op.Equal(rows, bottom)), new_bottom)
        column_shape = op.Concat(op.Shape(h, end=1), _ints(n, 1), axis=0)
        column_top = op.GatherElements(h, op.Expand(_clamped(top, n), column_shape), axis=2)
        column_bottom = op.GatherElements(h, op.Expand(_clamped(bottom, n), column_shape), axis=2)
        new_left, new_right = _rotate_pairs(column_top, column_bottom, cs, sn)
        above = op.And(pair, op.Less(rows, top))
        h = _set_where(h, op.And(above, op.Equal(columns, top)), new_left)
        h = _set_where(h, op.And(above, op.Equal(columns, bottom)), new_right)
        for value, (r, c) in zip((a11, a12, a21, a22), ((top, top), (top, bottom), (bottom, top), (bottom, bottom))):
            h = _set_where(h, op.And(pair, op.And(op.Equal(rows, r), op.Equal(columns, c))), value)
        if z is not None:
            z_top = op.GatherElements(z, op.Expand(_clamped(top, n), column_shape), axis=2)
            z_bottom = op.GatherElements(z, op.Expand(_clamped(bottom, n), column_shape), axis=2)
            z_left, z_right = _rotate_pairs(z_top, z_bottom, cs, sn)
            z = _set_where(z, op.And(pair, op.Equal(columns, top)), z_left)
            z = _set_where(z, op.And(pair, op.Equal(columns, bottom)), z_right)
        if n >= 3:
            h, z, kdefl = _lahqr_sweep(h, z, bottom, window, kdefl, sweep, ms, n)
        next_bottom = op.Where(deflate, op.Sub(window, _ints(1)), bottom)
        next_window = op.Where(deflate, low, window)
        kdefl = op.Where(deflate, op.Sub(kdefl, kdefl), kdefl)
        more = _any(op.GreaterOrEqual(next_bottom, low))
        state = [h, z] if z is not None else [h]
        return more, [*state, next_bottom, next_window, kdefl]

    state = [h, z] if z is not None else [h]
    kdefl = op.Sub(low, low)
    outputs = ctx.loop(
        op.Constant(value=ir.tensor(np.int64(30 * max(10, n) * n + n))),
        op.Constant(value=ir.tensor(True)),
        [*state, high, low, kdefl],
        step,
        name="lahqr",
        carried_shapes=True,
    )
    return outputs[0], (outputs[1] if z is not None else None)


def _lahqr_sweep(
    h: TEig, z: TEig | None, bottom: INT64, window: INT64, kdefl: INT64, sweep: BOOL, ms: INT64, n: int
) -> tuple[TEig, TEig | None, INT64]:
    """One double-shift QR sweep of lahqr on the window..bottom block where `sweep` holds."""
    rows, columns = _index_column(n), _index_row(n)
    ulp = _constants(h)["ulp"]
    zero, one, two = _typed(0.0, h), _typed(1.0, h), _typed(2.0, h)
    ulp_ = _typed(ulp, h)
    kdefl = op.Where(sweep, op.Add(kdefl, _ints(1)), kdefl)
    top = op.Sub(bottom, _ints(1))

    def entry(r: INT64, c: INT64) -> TEig:
        return _matrix_entry(h, r, c, n)

    # the shifts: the bottom 2x2 block's eigenvalues, or an exceptional shift every 10th sweep
    exceptional_bottom = op.Equal(op.Mod(kdefl, _ints(2 * _HQR_EXCEPTIONAL)), _ints(0))
    exceptional_top = op.And(op.Not(exceptional_bottom), op.Equal(op.Mod(kdefl, _ints(_HQR_EXCEPTIONAL)), _ints(0)))
    s_bottom = op.Add(op.Abs(entry(bottom, top)), op.Abs(entry(top, op.Sub(bottom, _ints(2)))))
    w1 = op.Add(window, _ints(1))
    s_top = op.Add(op.Abs(entry(w1, window)), op.Abs(entry(op.Add(window, _ints(2)), w1)))
    dat1, dat2 = _typed(0.75, h), _typed(-0.4375, h)
    ex_s = op.Where(exceptional_bottom, s_bottom, s_top)
    ex_h11 = op.Add(op.Mul(dat1, ex_s), op.Where(exceptional_bottom, entry(bottom, bottom), entry(window, window)))
    exceptional = op.Or(exceptional_bottom, exceptional_top)
    h11 = op.Where(exceptional, ex_h11, entry(top, top))
    h21 = op.Where(exceptional, ex_s, entry(bottom, top))
    h12 = op.Where(exceptional, op.Mul(dat2, ex_s), entry(top, bottom))
    h22 = op.Where(exceptional, ex_h11, entry(bottom, bottom))
    s = op.Add(op.Add(op.Abs(h11), op.Abs(h12)), op.Add(op.Abs(h21), op.Abs(h22)))
    s_zero = op.Equal(s, zero)
    safe_s = op.Where(s_zero, one, s)
    h11, h21, h12, h22 = (op.Div(x, safe_s) for x in (h11, h21, h12, h22))
    tr = op.Div(op.Add(h11, h22), two)
    det = op.Sub(op.Mul(op.Sub(h11, tr), op.Sub(h22, tr)), op.Mul(h12, h21))
    rtdisc = op.Sqrt(op.Abs(det))
    complex_shift = op.GreaterOrEqual(det, zero)
    r1, r2 = op.Add(tr, rtdisc), op.Sub(tr, rtdisc)
    nearer = op.Where(op.LessOrEqual(op.Abs(op.Sub(r1, h22)), op.Abs(op.Sub(r2, h22))), r1, r2)
    rt1r = op.Where(complex_shift, op.Mul(tr, safe_s), op.Mul(nearer, safe_s))
    rt1r = op.Where(s_zero, zero, rt1r)
    rt2r = rt1r
    rt1i = op.Where(op.And(complex_shift, op.Not(s_zero)), op.Mul(rtdisc, safe_s), zero)
    rt2i = op.Neg(rt1i)
    # where the sweep starts: the lowest m >= window whose bulge does not disturb h[m, m-1] much
    flat = [op.Reshape(x, _ints(-1, 1)) for x in (rt1r, rt2r, rt1i, rt2i)]
    f_rt1r, f_rt2r, f_rt1i, f_rt2i = flat
    d = _diagonal(h, n, 0)
    sub, sup = _diagonal(h, n, 1), _diagonal(h, n, -1)
    count = n - 2

    def part(x: TEig, start: int) -> TEig:
        return op.Slice(x, _ints(start), _ints(start + count), _ints(1))

    h_mm, h_m1m1, h_m1m = part(d, 0), part(d, 1), part(sub, 0)
    h_mm1, h_m2m1 = part(sup, 0), part(sub, 1)
    s_m = op.Add(op.Add(op.Abs(op.Sub(h_mm, f_rt2r)), op.Abs(f_rt2i)), op.Abs(h_m1m))
    safe_s_m = op.Where(op.Equal(s_m, zero), one, s_m)
    h21s = op.Div(h_m1m, safe_s_m)
    v1 = op.Sub(
        op.Add(op.Mul(h21s, h_mm1), op.Mul(op.Sub(h_mm, f_rt1r), op.Div(op.Sub(h_mm, f_rt2r), safe_s_m))),
        op.Mul(f_rt1i, op.Div(f_rt2i, safe_s_m)),
    )
    v2 = op.Mul(h21s, op.Sub(op.Sub(op.Add(h_mm, h_m1m1), f_rt1r), f_rt2r))
    v3 = op.Mul(h21s, h_m2m1)
    s_v = op.Add(op.Add(op.Abs(v1), op.Abs(v2)), op.Abs(v3))
    safe_s_v = op.Where(op.Equal(s_v, zero), one, s_v)
    v1, v2, v3 = op.Div(v1, safe_s_v), op.Div(v2, safe_s_v), op.Div(v3, safe_s_v)
    # h[m, m-1] and h[m-1, m-1] for m >= 1 (m = 0 is never tested: it is then the window's top)
    h_mmm1 = op.Concat(
        op.Slice(sub, _ints(0), _ints(1), _ints(1)), op.Slice(sub, _ints(0), _ints(count - 1), _ints(1)), axis=1
    )
    h_m_1 = op.Concat(
        op.Slice(d, _ints(0), _ints(1), _ints(1)), op.Slice(d, _ints(0), _ints(count - 1), _ints(1)), axis=1
    )
    quiet = op.LessOrEqual(
        op.Mul(op.Abs(h_mmm1), op.Add(op.Abs(v2), op.Abs(v3))),
        op.Mul(op.Mul(ulp_, op.Abs(v1)), op.Add(op.Add(op.Abs(h_m_1), op.Abs(h_mm)), op.Abs(h_m1m1))),
    )
    flat_window, flat_bottom = op.Reshape(window, _ints(-1, 1)), op.Reshape(bottom, _ints(-1, 1))
    starts = op.And(
        op.Or(op.Equal(ms, flat_window), quiet),
        op.And(op.GreaterOrEqual(ms, flat_window), op.LessOrEqual(ms, op.Sub(flat_bottom, _ints(2)))),
    )
    m = op.ReduceMax(op.Where(starts, ms, flat_window), _ints(1), keepdims=1)  # [B, 1]
    first_v = [op.Reshape(op.GatherElements(v, _clamped(m, count), axis=1), _ints(-1, 1, 1)) for v in (v1, v2, v3)]
    m = op.Reshape(m, _ints(-1, 1, 1))
    # chase the bulge down: a reflector on rows/columns k..k+2 for k = m..bottom-1
    for k in range(n - 1):
        active = op.And(sweep, op.And(op.LessOrEqual(m, _ints(k)), op.LessOrEqual(_ints(k), top)))
        first = op.Equal(m, _ints(k))
        three = op.LessOrEqual(_ints(k), op.Sub(bottom, _ints(2)))  # nr = 3, else 2
        width = min(3, n - k)
        if k > 0:
            from_column = [op.Slice(h, _ints(k + i, k - 1), _ints(k + i + 1, k), _ints(-2, -1)) for i in range(width)]
            if width == 2:
                from_column.append(zero)
            alpha = op.Where(first, first_v[0], from_column[0])
            x2 = op.Where(first, first_v[1], from_column[1])
            x3 = op.Where(first, first_v[2], from_column[2])
        else:
            alpha, x2, x3 = first_v
        x3 = op.Where(three, x3, zero)
        beta, t1, (x2, x3) = _larfg(alpha, [x2, x3])
        if k > 0:
            later = op.And(active, op.Not(first))
            column = _columns(h, k - 1, k)
            new_column = op.Where(
                op.Equal(rows, _ints(k)),
                beta,
                op.Where(
                    op.Or(op.Equal(rows, _ints(k + 1)), op.And(three, op.Equal(rows, _ints(k + 2)))), zero, column
                ),
            )
            scaled = op.Where(op.Equal(rows, _ints(k)), op.Mul(column, op.Sub(one, t1)), column)
            inner_start = op.And(active, op.And(first, op.Greater(m, window)))
            column = op.Where(later, new_column, op.Where(inner_start, scaled, column))
            h = op.Concat(_columns(h, 0, k - 1), column, _columns(h, k, n), axis=-1)
        t2, t3 = op.Mul(t1, x2), op.Mul(t1, x3)
        # from the left: rows k..k+2, columns k..n-1
        block = [_rows(h, k + i, k + i + 1) for i in range(width)]
        total = op.Add(block[0], op.Mul(x2, block[1]))
        if width == 3:
            total = op.Add(total, op.Mul(x3, block[2]))
        left = op.And(active, op.GreaterOrEqual(columns, _ints(k)))
        updated = [
            op.Where(left, op.Sub(block[0], op.Mul(total, t1)), block[0]),
            op.Where(left, op.Sub(block[1], op.Mul(total, t2)), block[1]),
        ]
        if width == 3:
            updated.append(op.Where(op.And(left, three), op.Sub(block[2], op.Mul(total, t3)), block[2]))
        h = op.Concat(
            *[
                p
                for p in [_rows(h, 0, k) if k else None, *updated, _rows(h, k + width, n) if k + width < n else None]
                if p is not None
            ],
            axis=-2,
        )
        # from the right: columns k..k+2, rows 0..min(k+3, bottom)
        h = _reflect_columns(
            h,
            k,
            width,
            x2,
            x3,
            t1,
            t2,
            t3,
            three,
            op.And(active, op.LessOrEqual(rows, op.Min(_ints(k + 3), bottom))),
            n,
        )
        if z is not None:
            z = _reflect_columns(z, k, width, x2, x3, t1, t2, t3, three, active, n)
    return h, z, kdefl


def _reflect_columns(
    a: TEig, k: int, width: int, x2: TEig, x3: TEig, t1: TEig, t2: TEig, t3: TEig, three: BOOL, mask: BOOL, n: int
) -> TEig:
    """Columns k..k+width-1 of a times the reflector (I - t v v^T), v = (1, x2, x3), where mask holds."""
    block = [_columns(a, k + i, k + i + 1) for i in range(width)]
    total = op.Add(block[0], op.Mul(x2, block[1]))
    if width == 3:
        total = op.Add(total, op.Mul(x3, block[2]))
    updated = [
        op.Where(mask, op.Sub(block[0], op.Mul(total, t1)), block[0]),
        op.Where(mask, op.Sub(block[1], op.Mul(total, t2)), block[1]),
    ]
    if width == 3:
        updated.append(op.Where(op.And(mask, three), op.Sub(block[2], op.Mul(total, t3)), block[2]))
    parts = [_columns(a, 0, k) if k else None, *updated, _columns(a, k + width, n) if k + width < n else None]
    return op.Concat(*[p for p in parts if p is not None], axis=-1)


def _geev_schur(
    ctx: LoweringContext, a: TEig, n: int, vectors: bool
) -> tuple[TEig, TEig | None, TEig, INT64, TEig, TEig, TEig]:
    """geev up to the Schur form of a [B, n, n] matrix: (T, Z or None, the balancing scale [B, 1, n], the
    balancing permutation [B, 1, n], T's eigenvalues' real and imaginary parts [B, n], and the factor [B, 1]
    that undoes geev's scaling of a tiny or huge matrix on them)."""
    constants = _constants(a)
    # geev scales a matrix whose largest entry is tiny or huge into range (undone on the eigenvalues)
    smlnum = math.sqrt(constants["safmin"]) / constants["ulp"]
    bignum = 1.0 / smlnum
    zero = _typed(0.0, a)
    anrm = op.ReduceMax(op.Abs(a), _ints(-2, -1), keepdims=1)
    tiny = op.And(op.Greater(anrm, zero), op.Less(anrm, _typed(smlnum, a)))
    huge = op.Greater(anrm, _typed(bignum, a))
    cscale = op.Where(tiny, _typed(smlnum, a), _typed(bignum, a))
    rescaled = op.Or(tiny, huge)
    one = _typed(1.0, a)
    safe_anrm = op.Where(rescaled, anrm, one)
    a = op.Where(rescaled, op.Mul(a, op.Div(cscale, safe_anrm)), a)
    a, perm, low, high = _gebal_permute(ctx, a, n)
    a, scale = _gebal_scale(ctx, a, low, high, n)
    h, vs, taus = _gehd2(a, low, high, n)
    z = None
    if vectors:
        identity = op.CastLike(op.Constant(value=ir.tensor(np.eye(n, dtype=np.float32))), a)
        z = op.Expand(identity, op.Shape(a))
        for v, tau in reversed(list(zip(vs, taus))):
            z = op.Sub(z, op.Mul(tau, op.MatMul(v, op.MatMul(_transpose(v), z))))
    h, z = _lahqr(ctx, h, z, low, high, n)
    rows, columns = _index_column(n), _index_row(n)
    h = op.Where(op.Greater(rows, op.Add(columns, _ints(1))), zero, h)  # hseqr clears below the subdiagonal
    real = _diagonal(h, n, 0)
    imaginary = op.Reshape(_batch_filled(a, [n, 1], 0.0, a), op.Concat(op.Shape(a, end=1), _ints(n), axis=0))
    if n > 1:
        sub, sup = _diagonal(h, n, 1), _diagonal(h, n, -1)
        width = op.Mul(op.Sqrt(op.Abs(sup)), op.Sqrt(op.Abs(sub)))  # lanv2's imaginary part of a 2x2 block
        pair = op.Not(op.Equal(sub, zero))
        width = op.Where(pair, width, zero)
        padding = _batch_filled(a, [1, 1], 0.0, a)
        padding = op.Reshape(padding, op.Concat(op.Shape(a, end=1), _ints(1), axis=0))
        imaginary = op.Sub(op.Concat(width, padding, axis=1), op.Concat(padding, width, axis=1))
    return (
        h,
        z,
        scale,
        perm,
        real,
        imaginary,
        op.Reshape(op.Div(safe_anrm, op.Where(rescaled, cscale, one)), _ints(-1, 1)),
    )


def _eig_input(A: TEig, name: str) -> int:
    """The matrix size, which must be static (batch dims may be symbolic)."""
    n = A.shape[-1]
    if not isinstance(n, int):
        raise NotImplementedError(
            f"{name} is lowered for a static matrix size only (LAPACK geev's steps are unrolled over it), got "
            f"an input of shape {list(A.shape)}: export with a static size for the last two dims (the batch dims "
            "may stay dynamic)"
        )
    return n


def _with_batch(value: TEig, source: TEig, trailing: list[int]) -> TEig:
    """value reshaped to source's batch dims followed by `trailing`."""
    return op.Reshape(value, op.Concat(op.Shape(source, end=-2), _ints(*trailing), axis=0))


def _no_matrices(source: TEig, n: int) -> bool:
    return n == 0 or 0 in list(source.shape[:-2])


@lowering("aten::linalg_eigvals", context=True)
def linalg_eigvals(ctx: LoweringContext, self: TEig) -> TEig:
    """Eigenvalues in eager's order (complex, as [..., n, 2]): geev's balancing, Hessenberg QR and deflation."""
    n = _eig_input(self, "linalg.eigvals")
    if _no_matrices(self, n):
        return _with_batch(_batch_filled(self, [n, 2], 0.0, self), self, [n, 2])
    a = op.Reshape(self, _ints(-1, n, n))
    _, _, _, _, real, imaginary, undo = _geev_schur(ctx, a, n, vectors=False)
    real, imaginary = op.Mul(real, undo), op.Mul(imaginary, undo)
    values = op.Concat(op.Unsqueeze(real, _ints(-1)), op.Unsqueeze(imaginary, _ints(-1)), axis=-1)
    return _with_batch(values, self, [n, 2])


def _complex_divide(a_re: TEig, a_im: TEig, b_re: TEig, b_im: TEig) -> tuple[TEig, TEig]:
    """(a_re + i a_im) / (b_re + i b_im), scaled by the larger part of b (Smith's formula, as ?ladiv)."""
    one = _typed(1.0, a_re)
    real_larger = op.GreaterOrEqual(op.Abs(b_re), op.Abs(b_im))
    big = op.Where(real_larger, b_re, b_im)
    small = op.Where(real_larger, b_im, b_re)
    safe_big = op.Where(op.Equal(big, _typed(0.0, big)), one, big)
    ratio = op.Div(small, safe_big)
    denominator = op.Add(big, op.Mul(small, ratio))
    # |b_re| larger: (a_re + a_im r, a_im - a_re r) / (b_re + b_im r); else (a_re r + a_im, a_im r - a_re) / ...
    re = op.Where(real_larger, op.Add(a_re, op.Mul(a_im, ratio)), op.Add(op.Mul(a_re, ratio), a_im))
    im = op.Where(real_larger, op.Sub(a_im, op.Mul(a_re, ratio)), op.Sub(op.Mul(a_im, ratio), a_re))
    return op.Div(re, denominator), op.Div(im, denominator)


def _complex_multiply(a_re: TEig, a_im: TEig, b_re: TEig, b_im: TEig) -> tuple[TEig, TEig]:
    return op.Sub(op.Mul(a_re, b_re), op.Mul(a_im, b_im)), op.Add(op.Mul(a_re, b_im), op.Mul(a_im, b_re))


def _trevc_right(t: TEig, real: TEig, imaginary: TEig, n: int) -> tuple[TEig, TEig]:
    """trevc's right eigenvectors of the standardized quasi-triangular T, as (real, imaginary) [B, n, n]: column j
    for a real eigenvalue or the first of a complex pair (its conjugate's column is filled by the caller). Each
    solves (T - lambda I) x = 0 by back-substitution, x = 1 at the eigenvalue's own row, a complex pair's start
    as trevc's, 2x2 diagonal blocks solved together, pivots below trevc's smin replaced by it."""
    rows, columns = _index_column(n), _index_row(n)
    constants = _constants(t)
    zero, one = _typed(0.0, t), _typed(1.0, t)
    sub = _diagonal(t, n, 1)  # t[k, k-1], k = 1..n-1
    padding = op.Reshape(_batch_filled(t, [1, 1], 0.0, t), op.Concat(op.Shape(t, end=1), _ints(1), axis=0))
    pair_first = op.Not(op.Equal(op.Concat(sub, padding, axis=1), zero))  # t[j+1, j] != 0, [B, n]
    lam_re = op.Unsqueeze(real, _ints(1))  # [B, 1, n]
    lam_im = op.Unsqueeze(imaginary, _ints(1))
    first = op.Unsqueeze(pair_first, _ints(1))
    smlnum = constants["safmin"] * (n / constants["ulp"])
    smin = op.Max(op.Mul(_typed(constants["ulp"], t), op.Add(op.Abs(lam_re), op.Abs(lam_im))), _typed(smlnum, t))
    # the start of each column: x[j] = 1 (real), or trevc's pair start on rows j, j+1
    sup = _diagonal(t, n, -1)  # t[k-1, k]
    b = op.Unsqueeze(op.Concat(sup, padding, axis=1), _ints(1))  # t[j, j+1]
    c = op.Unsqueeze(op.Concat(sub, padding, axis=1), _ints(1))  # t[j+1, j]
    safe_b = op.Where(op.Equal(b, zero), one, b)
    safe_c = op.Where(op.Equal(c, zero), one, c)
    b_larger = op.GreaterOrEqual(op.Abs(b), op.Abs(c))
    head_re = op.Where(first, op.Where(b_larger, one, op.Div(op.Neg(lam_im), safe_c)), one)
    next_im = op.Where(b_larger, op.Div(lam_im, safe_b), one)
    at_j = op.Equal(rows, columns)
    at_next = op.And(first, op.Equal(rows, op.Add(columns, _ints(1))))
    x_re = op.Where(at_j, head_re, zero)
    x_im = op.Where(at_next, next_im, zero)
    x_re, x_im = op.Expand(x_re, op.Shape(t)), op.Expand(x_im, op.Shape(t))
    # the rows above each column's start, from the bottom; 2x2 blocks (r-1, r) together at step r
    for r in range(n - 1, -1, -1):
        due = op.Less(_ints(r), columns)  # [1, n]: columns whose start is below row r
        row_t = _rows(t, r, r + 1)  # [B, 1, n]
        rhs_re = op.Neg(op.MatMul(row_t, x_re))  # [B, 1, n]
        rhs_im = op.Neg(op.MatMul(row_t, x_im))
        t_rr = op.Slice(t, _ints(r, r), _ints(r + 1, r + 1), _ints(-2, -1))
        d_re, d_im = op.Sub(t_rr, lam_re), op.Neg(lam_im)
        tiny = op.Less(op.Add(op.Abs(d_re), op.Abs(d_im)), smin)
        d_re, d_im = op.Where(tiny, smin, d_re), op.Where(tiny, zero, d_im)
        single_re, single_im = _complex_divide(rhs_re, rhs_im, d_re, d_im)
        block_top = (
            op.Not(op.Equal(op.Slice(t, _ints(r + 1, r), _ints(r + 2, r + 1), _ints(-2, -1)), zero))
            if r + 1 < n
            else None
        )
        if r >= 1:
            block_bottom = op.Not(op.Equal(op.Slice(t, _ints(r, r - 1), _ints(r + 1, r), _ints(-2, -1)), zero))
            upper_t = _rows(t, r - 1, r)
            up_re = op.Neg(op.MatMul(upper_t, x_re))
            up_im = op.Neg(op.MatMul(upper_t, x_im))
            t11 = op.Slice(t, _ints(r - 1, r - 1), _ints(r, r), _ints(-2, -1))
            t12 = op.Slice(t, _ints(r - 1, r), _ints(r, r + 1), _ints(-2, -1))
            t21 = op.Slice(t, _ints(r, r - 1), _ints(r + 1, r), _ints(-2, -1))
            a_re, a_im = op.Sub(t11, lam_re), op.Neg(lam_im)
            e_re, e_im = op.Sub(t_rr, lam_re), op.Neg(lam_im)
            # Cramer's rule on [[a, t12], [t21, e]] [x1, x2] = [up, rhs]
            det_re, det_im = _complex_multiply(a_re, a_im, e_re, e_im)
            det_re = op.Sub(det_re, op.Mul(t12, t21))
            small = op.Less(op.Add(op.Abs(det_re), op.Abs(det_im)), op.Mul(smin, smin))
            det_re, det_im = op.Where(small, op.Mul(smin, smin), det_re), op.Where(small, zero, det_im)
            n1_re, n1_im = _complex_multiply(up_re, up_im, e_re, e_im)
            n1_re, n1_im = op.Sub(n1_re, op.Mul(t12, rhs_re)), op.Sub(n1_im, op.Mul(t12, rhs_im))
            n2_re, n2_im = _complex_multiply(a_re, a_im, rhs_re, rhs_im)
            n2_re, n2_im = op.Sub(n2_re, op.Mul(t21, up_re)), op.Sub(n2_im, op.Mul(t21, up_im))
            x1_re, x1_im = _complex_divide(n1_re, n1_im, det_re, det_im)
            x2_re, x2_im = _complex_divide(n2_re, n2_im, det_re, det_im)
            in_block = op.And(due, block_bottom)
            write_top = op.And(in_block, op.Equal(rows, _ints(r - 1)))
            write_bottom = op.And(in_block, op.Equal(rows, _ints(r)))
            x_re = op.Where(write_top, x1_re, op.Where(write_bottom, x2_re, x_re))
            x_im = op.Where(write_top, x1_im, op.Where(write_bottom, x2_im, x_im))
            alone = op.And(due, op.Not(block_bottom))
        else:
            alone = due
        if block_top is not None:
            alone = op.And(alone, op.Not(block_top))
        write = op.And(alone, op.Equal(rows, _ints(r)))
        x_re = op.Where(write, single_re, x_re)
        x_im = op.Where(write, single_im, x_im)
    return x_re, x_im


def _geev_vectors(t: TEig, z: TEig, scale: TEig, perm: INT64, real: TEig, imaginary: TEig, n: int) -> tuple[TEig, TEig]:
    """geev's right eigenvectors: Z times trevc's, balancing undone (gebak), each of Euclidean norm 1 and, for
    a complex pair, rotated so that its largest component is real (lartg); as (real, imaginary) [B, n, n]."""
    x_re, x_im = _trevc_right(t, real, imaginary, n)
    v_re, v_im = op.MatMul(z, x_re), op.MatMul(z, x_im)
    row_scale = _transpose(scale)  # [B, n, 1]
    v_re, v_im = op.Mul(v_re, row_scale), op.Mul(v_im, row_scale)
    index = op.Expand(_transpose(perm), op.Shape(v_re))
    v_re = op.ScatterElements(v_re, index, v_re, axis=1)
    v_im = op.ScatterElements(v_im, index, v_im, axis=1)
    zero, one = _typed(0.0, v_re), _typed(1.0, v_re)
    norm_re, norm_im = _norm2(v_re, [-2]), _norm2(v_im, [-2])
    norm = _lapy2(norm_re, norm_im)  # = norm_re for a real eigenvector
    reciprocal = op.Div(one, op.Where(op.Equal(norm, zero), one, norm))
    v_re, v_im = op.Mul(v_re, reciprocal), op.Mul(v_im, reciprocal)
    # lartg(f, g) at the first component of largest modulus: c = f / r, s = g / r, with r = +-sqrt(f^2 + g^2)
    # negative where |f| > |g| and f < 0 (LAPACK's dlartg before 3.10, which eager's MKL follows more often than
    # the newer r = sign(f) sqrt(f^2 + g^2): 96% of the complex vectors of random 5x5 matrices against 78%)
    modulus = op.Add(op.Mul(v_re, v_re), op.Mul(v_im, v_im))
    k = op.ArgMax(modulus, axis=1, keepdims=1)  # [B, 1, n]
    f = op.GatherElements(v_re, k, axis=1)
    g = op.GatherElements(v_im, k, axis=1)
    d = op.Sqrt(op.Add(op.Mul(f, f), op.Mul(g, g)))
    f_zero, g_zero = op.Equal(f, zero), op.Equal(g, zero)
    safe_d = op.Where(op.Equal(d, zero), one, d)
    r = op.Where(op.Greater(op.Abs(f), op.Abs(g)), _sign_of(safe_d, f), op.Where(f_zero, g, safe_d))
    cs = op.Where(g_zero, one, op.Where(f_zero, zero, op.Div(f, r)))
    sn = op.Where(g_zero, zero, op.Where(f_zero, one, op.Div(g, r)))
    rotated_re = op.Add(op.Mul(cs, v_re), op.Mul(sn, v_im))
    rotated_im = op.Sub(op.Mul(cs, v_im), op.Mul(sn, v_re))
    rotated_im = op.Where(op.Equal(_index_column(n), k), zero, rotated_im)
    pair = op.Greater(op.Unsqueeze(imaginary, _ints(1)), zero)  # the first of each pair
    v_re = op.Where(pair, rotated_re, v_re)
    v_im = op.Where(pair, rotated_im, zero)
    # the second of a pair: the conjugate of the first
    second = op.Less(op.Unsqueeze(imaginary, _ints(1)), zero)
    previous = op.Concat(_columns(v_re, 0, 1), _columns(v_re, 0, n - 1), axis=-1)
    previous_im = op.Concat(_columns(v_im, 0, 1), _columns(v_im, 0, n - 1), axis=-1)
    v_re = op.Where(second, previous, v_re)
    v_im = op.Where(second, op.Neg(previous_im), v_im)
    return v_re, v_im


@lowering("aten::linalg_eig", context=True)
def linalg_eig(ctx: LoweringContext, self: TEig) -> tuple[TEig, TEig]:
    """Eigenvalues and right eigenvectors as eager's (complex, as [..., n, 2] and [..., n, n, 2]): geev."""
    n = _eig_input(self, "linalg.eig")
    if _no_matrices(self, n):
        values = _with_batch(_batch_filled(self, [n, 2], 0.0, self), self, [n, 2])
        return values, _with_batch(_batch_filled(self, [n, n * 2], 0.0, self), self, [n, n, 2])
    a = op.Reshape(self, _ints(-1, n, n))
    t, z, scale, perm, real, imaginary, undo = _geev_schur(ctx, a, n, vectors=True)
    v_re, v_im = _geev_vectors(t, z, scale, perm, real, imaginary, n)
    real, imaginary = op.Mul(real, undo), op.Mul(imaginary, undo)
    values = op.Concat(op.Unsqueeze(real, _ints(-1)), op.Unsqueeze(imaginary, _ints(-1)), axis=-1)
    vectors = op.Concat(op.Unsqueeze(v_re, _ints(-1)), op.Unsqueeze(v_im, _ints(-1)), axis=-1)
    return _with_batch(values, self, [n, 2]), _with_batch(vectors, self, [n, n, 2])
