"""Linear algebra: products (mm/bmm/addmm/linear... with their integer and reduced-precision variants),
decompositions, solvers, determinants, covariance.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import onnx_ir as ir
import torch
from onnxscript import (
    BFLOAT16,
    BOOL,
    DOUBLE,
    FLOAT,
    FLOAT16,
    INT8,
    INT16,
    INT32,
    INT64,
    UINT8,
    UINT16,
    UINT32,
    UINT64,
)
from onnxscript import opset18 as op

from fx2onnx._emit.context import LoweringContext
from fx2onnx._lowerings.builders import (
    _NARROW_INTS,
    TFloat,
    TInt,
    TIntegral,
    TOther,
    TReal,
    _back,
    _double,
    _in_float32,
    _p_norm,
    _scaled_sum,
    _widened,
)
from fx2onnx._lowerings.rules import lowering


@lowering("aten::addmm")
def addmm_int(self: TInt, mat1: TInt, mat2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    return _scaled_sum(self, op.MatMul(_widened(mat1), _widened(mat2)), beta, alpha)


@lowering("aten::addmv")
def addmv_int(self: TInt, mat: TInt, vec: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    return _scaled_sum(self, op.MatMul(_widened(mat), _widened(vec)), beta, alpha)


@lowering("aten::baddbmm")
def baddbmm_int(self: TInt, batch1: TInt, batch2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    return _scaled_sum(self, op.MatMul(_widened(batch1), _widened(batch2)), beta, alpha)


@lowering("aten::addbmm")
def addbmm_int(self: TInt, batch1: TInt, batch2: TInt, beta: float = 1, alpha: float = 1) -> TInt:
    products = op.MatMul(_widened(batch1), _widened(batch2))
    return _scaled_sum(self, op.ReduceSum(products, op.Constant(value_ints=[0]), keepdims=False), beta, alpha)


# --- matrix products with scaled terms: Gemm's alpha/beta and torchlib's script functions are float32 -----------
def _scaled_sum_float64(self: DOUBLE, product: DOUBLE, beta: float, alpha: float) -> DOUBLE:
    """beta * self + alpha * product; beta == 0 ignores `self` (its NaNs too) but keeps the broadcast shape."""
    if alpha != 1:
        product = op.Mul(product, _double(alpha))
    if beta == 0:
        return op.Expand(product, op.Shape(op.Add(self, product)))
    return op.Add(self if beta == 1 else op.Mul(self, _double(beta)), product)


@lowering("aten::addmm")
def addmm(self: DOUBLE, mat1: DOUBLE, mat2: DOUBLE, beta: float = 1.0, alpha: float = 1.0) -> DOUBLE:
    return _scaled_sum_float64(self, op.MatMul(mat1, mat2), beta, alpha)


@lowering("aten::addmv")
def addmv(self: DOUBLE, mat: DOUBLE, vec: DOUBLE, beta: float = 1.0, alpha: float = 1.0) -> DOUBLE:
    return _scaled_sum_float64(self, op.MatMul(mat, vec), beta, alpha)


@lowering("aten::addbmm")
def addbmm(self: DOUBLE, batch1: DOUBLE, batch2: DOUBLE, beta: float = 1.0, alpha: float = 1.0) -> DOUBLE:
    products = op.MatMul(batch1, batch2)
    return _scaled_sum_float64(self, op.ReduceSum(products, op.Constant(value_ints=[0]), keepdims=False), beta, alpha)


# The integer dtypes eager's CPU matrix products take (not bool, not uint16/32/64).
TMatmulInt = TypeVar("TMatmulInt", INT8, INT16, INT32, INT64, UINT8)


TWeightInt = TypeVar("TWeightInt", INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64)


# --- matrix products in integer arithmetic ---------------------------------------------------------------------
def _widened_integer(value: TMatmulInt) -> TMatmulInt:
    """int8/int16/uint8 as int32, which MatMul takes; int32/int64 as they are."""
    return op.Cast(value, to=INT32.dtype) if value.dtype in _NARROW_INTS else value


def _narrowed(result: TMatmulInt, dtype: ir.DataType) -> TMatmulInt:
    return op.Cast(result, to=dtype) if result.dtype != dtype else result


@lowering("aten::bmm")
def bmm_integer(self: TMatmulInt, mat2: TMatmulInt) -> TMatmulInt:
    return _narrowed(op.MatMul(_widened_integer(self), _widened_integer(mat2)), self.dtype)


@lowering("aten::dot")
def dot_integer(self: TMatmulInt, tensor: TMatmulInt) -> TMatmulInt:
    """MatMul of two vectors is their (0-d) inner product."""
    return _narrowed(op.MatMul(_widened_integer(self), _widened_integer(tensor)), self.dtype)


@lowering("aten::linear")
def linear_integer(input: TMatmulInt, weight: TMatmulInt, bias: TMatmulInt | None = None) -> TMatmulInt:
    """input @ weight.T + bias; a 1-D weight is a single output feature (no transpose)."""
    wide_weight = _widened_integer(weight)
    if len(weight.shape) == 2:
        wide_weight = op.Transpose(wide_weight, perm=[1, 0])
    result = op.MatMul(_widened_integer(input), wide_weight)
    if bias is not None:
        result = op.Add(result, _widened_integer(bias))
    return _narrowed(result, input.dtype)


# --- covariance of integers with float weights -----------------------------------------------------------------
@lowering("aten::cov")
def cov_integer_weighted(
    self: TIntegral, aweights: TFloat, correction: int = 1, fweights: TWeightInt | None = None
) -> TFloat:
    """Eager multiplies `self` by the weights first (``in * w``): `self` becomes the weights' float dtype
    (promote_types(integer, float) is the float), and everything after computes in it. Without `aweights`
    (required here; parameters bind by name) integers keep the float lowering, which computes in float32."""
    return cov.func(op.Cast(self, to=aweights.dtype), correction, fweights, aweights)


@lowering("aten::combinations")
def combinations(self: TReal, r: int = 2, with_replacement: bool = False) -> TReal:
    """A Gather of the r-tuples of positions, known at export from the static length, in eager's order."""
    if r == 0:
        return op.Slice(self, op.Constant(value_ints=[0]), op.Constant(value_ints=[0]))
    pick = itertools.combinations_with_replacement if with_replacement else itertools.combinations
    rows = [list(row) for row in pick(range(self.shape[0]), r)]
    positions = np.array(rows, dtype=np.int64).reshape(len(rows), r)
    return op.Gather(self, op.Constant(value=ir.tensor(positions)), axis=0)


def _constant_of_dtype(values: torch.Tensor, dtype: int | None) -> INT64:
    from fx2onnx import _dtypes as dtype_table

    torch_dtype = dtype_table.to_torch(ir.DataType(dtype)) if dtype is not None else torch.int64
    return op.Constant(value=ir.tensor(values.to(torch_dtype)))


@lowering("aten::tril_indices")
def tril_indices(
    row: int,
    col: int,
    offset: int = 0,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
) -> INT64:
    """All arguments are constants: eager's indices, computed once at export."""
    return _constant_of_dtype(torch.tril_indices(row, col, offset), dtype)


@lowering("aten::triu_indices")
def triu_indices(
    row: int,
    col: int,
    offset: int = 0,
    dtype: int | None = None,
    layout: int | None = None,
    device: str | None = None,
    pin_memory: bool | None = None,
) -> INT64:
    """All arguments are constants: eager's indices, computed once at export."""
    return _constant_of_dtype(torch.triu_indices(row, col, offset), dtype)


# --- covariance -------------------------------------------------------------------------------------------
@lowering("aten::cov")
def cov(self: TReal, correction: int = 1, fweights: TOther | None = None, aweights: TReal | None = None) -> TReal:
    """Eager's covariance formula with its data-dependent check (a non-positive normalizer becomes 0) as a Max.

    Variables are rows, observations columns; a 1-D input is one variable and gives a 0-d result.
    Integers and bools compute in float32 (the default dtype); float16/bfloat16 in float32, as eager's
    accumulations do.
    """
    rank = len(self.shape)
    x = self if rank == 2 else op.Reshape(self, op.Constant(value_ints=[1, -1]))
    compute = self.dtype if self.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE) else ir.DataType.FLOAT
    x = op.Cast(x, to=compute)
    observations = self.shape[-1] if rank else 1
    columns = op.Constant(value_ints=[1])
    weights = None
    if fweights is not None:
        weights = op.Cast(fweights, to=compute)
    if aweights is not None:
        scaled = op.Cast(aweights, to=compute)
        weights = scaled if weights is None else op.Mul(weights, scaled)
    integral = self.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    if weights is None:
        total = op.Constant(value=ir.tensor(float(observations), dtype=compute))
        mean = op.ReduceMean(x, columns, keepdims=True)
        if integral and isinstance(observations, int) and observations > 0:
            # Eager sums integers exactly (int64) and divides the sum in float32: a float32 sum rounds above 2**24.
            exact = op.CumSum(
                op.Cast(self if rank == 2 else op.Reshape(self, op.Constant(value_ints=[1, -1])), to=ir.DataType.INT64),
                op.Constant(value=ir.tensor(1, dtype=ir.DataType.INT64)),
            )
            row_sums = op.Slice(exact, op.Constant(value_ints=[-1]), op.Constant(value_ints=[observations]), columns)
            mean = op.Div(op.Cast(row_sums, to=compute), total)
    else:
        total = op.ReduceSum(weights, keepdims=False)
        mean = op.Div(op.ReduceSum(op.Mul(x, weights), columns, keepdims=True), total)
    correction_value = op.Constant(value=ir.tensor(float(correction), dtype=compute))
    if weights is None:
        normalizer = op.Sub(total, correction_value)
    elif correction == 0:
        normalizer = total
    elif aweights is None:
        normalizer = op.Sub(total, correction_value)
    else:
        spread = op.Div(op.ReduceSum(op.Mul(weights, op.Cast(aweights, to=compute)), keepdims=False), total)
        normalizer = op.Sub(total, op.Mul(correction_value, spread))
    normalizer = op.Max(normalizer, op.Constant(value=ir.tensor(0.0, dtype=compute)))
    centered = op.Sub(x, mean)
    right = centered if weights is None else op.Mul(centered, weights)
    result = op.Div(op.MatMul(centered, op.Transpose(right, perm=[1, 0])), normalizer)
    if rank < 2 or self.shape[0] == 1:  # eager squeezes a single variable's 1x1 result
        result = op.Reshape(result, op.Constant(value=ir.tensor(np.array([], dtype=np.int64))))
    return op.Cast(result, to=_cov_dtype(self, aweights))


def _cov_dtype(self: TReal, aweights: TReal | None) -> int:
    from fx2onnx import _dtypes as dtype_table

    dtype = dtype_table.to_torch(self.dtype)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if aweights is not None:
        dtype = torch.promote_types(dtype, dtype_table.to_torch(aweights.dtype))
    return dtype_table.to_onnx(dtype).value


# --- dense linear algebra on static matrix sizes ----------------------------------------------------------------
# ONNX has no factorizations; with the matrix sizes known at export, each is unrolled into its n steps, each
# step a few whole-tensor ops over every batch at once. Partial pivoting picks the first largest magnitude in the
# column, as LAPACK's getrf does, so that pivots, P and the packed LU agree with eager's.
def _ints(*values: int) -> INT64:
    return op.Constant(value_ints=list(values))


def _index_column(count: int) -> INT64:
    """[[0], [1], ..., [count-1]]: row numbers, broadcast against [..., count, 1] columns."""
    return op.Constant(value=ir.tensor(np.arange(count, dtype=np.int64).reshape(count, 1)))


def _index_row(count: int) -> INT64:
    return op.Constant(value=ir.tensor(np.arange(count, dtype=np.int64).reshape(1, count)))


def _scalar_like(value: float, like: TFloat) -> TFloat:
    return op.CastLike(op.Constant(value_float=value), like)


def _rows(a: TFloat, start: int, stop: int) -> TFloat:
    return op.Slice(a, _ints(start), _ints(stop), _ints(-2))


def _columns(a: TFloat, start: int, stop: int) -> TFloat:
    return op.Slice(a, _ints(start), _ints(stop), _ints(-1))


def _transpose(a: TFloat) -> TFloat:
    """The last two axes swapped, whatever the rank (intermediate values may not know theirs)."""
    return op.Einsum(a, equation="...ij->...ji")


def _batch_filled(a: TFloat, trailing: list[int], value: float, like: TFloat) -> TFloat:
    """A tensor of `value` with a's batch dims and the given trailing dims (empty results keep their batch)."""
    shape = op.Concat(op.Shape(a, end=-2), _ints(*trailing), axis=0)
    return op.Expand(op.CastLike(op.Constant(value_float=value), like), shape)


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


# --- vector norms over given dims, rank 0 included ----------------------------------------------------------------
@lowering("aten::linalg_vector_norm")
def linalg_vector_norm(
    self: TFloat, ord: float = 2.0, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: int | None = None
) -> TFloat:
    """torch.linalg.vector_norm; a 0-d input with dim 0 or -1 reduces nothing (ONNX refuses the axis)."""
    x = op.Cast(self, to=dtype) if dtype is not None else self
    computed = _in_float32(x)
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    axes = op.Constant(value_ints=dims) if dims and len(self.shape) else None
    return _back(_p_norm(computed, float(ord), axes, keepdim), x)


# --- pairwise distances ----------------------------------------------------------------------------------------------
@lowering("aten::_cdist_forward")
def cdist_forward(x1: TFloat, x2: TFloat, p: float, compute_mode: int | None = None) -> TFloat:
    """[..., P, M] x [..., R, M] -> [..., P, R] p-norm distances, from the broadcast differences directly."""
    del compute_mode  # eager's matrix-product shortcut for p=2 is a speed/accuracy trade-off; this is exact
    if any(size == 0 for size in [*x1.shape[:-1], *x2.shape[:-1]]):
        # ORT's reductions keep the reduced axis of a zero-size tensor: build the empty result directly.
        shape = op.Concat(op.Shape(x1, start=0, end=-1), op.Shape(x2, start=-2, end=-1), axis=0)
        return op.CastLike(op.ConstantOfShape(shape), x1)
    a = op.Unsqueeze(_in_float32(x1), op.Constant(value_ints=[-2]))  # [..., P, 1, M]
    b = op.Unsqueeze(_in_float32(x2), op.Constant(value_ints=[-3]))  # [..., 1, R, M]
    return _back(_p_norm(op.Sub(a, b), float(p), op.Constant(value_ints=[-1]), False), x1)


TReduced = TypeVar("TReduced", BFLOAT16, FLOAT16)


def _float(x: TReduced) -> FLOAT:
    return op.Cast(x, to=ir.DataType.FLOAT)


def _scaled(x: FLOAT, factor: float) -> FLOAT:
    return x if factor == 1 else op.Mul(x, op.Constant(value=ir.tensor(float(factor), dtype=ir.DataType.FLOAT)))


def _rounded_once(self: TReduced, product: FLOAT, beta: float, alpha: float) -> TReduced:
    """beta * self + alpha * product, in float32, rounded to self's dtype. beta == 0 ignores `self`, NaN
    included (as eager), but the result keeps the broadcast shape."""
    product = _scaled(product, alpha)
    if beta == 0:
        result = op.Expand(product, op.Shape(op.Add(_float(self), product)))
    else:
        result = op.Add(_scaled(_float(self), beta), product)
    return op.Cast(result, to=self.dtype)


@lowering("aten::addmm")
def addmm_reduced_precision(
    self: TReduced, mat1: TReduced, mat2: TReduced, beta: float = 1.0, alpha: float = 1.0
) -> TReduced:
    return _rounded_once(self, op.MatMul(_float(mat1), _float(mat2)), beta, alpha)


@lowering("aten::addmv")
def addmv_reduced_precision(
    self: TReduced, mat: TReduced, vec: TReduced, beta: float = 1.0, alpha: float = 1.0
) -> TReduced:
    return _rounded_once(self, op.MatMul(_float(mat), _float(vec)), beta, alpha)


@lowering("aten::baddbmm")
def baddbmm(self: TReduced, batch1: TReduced, batch2: TReduced, beta: float = 1.0, alpha: float = 1.0) -> TReduced:
    return _rounded_once(self, op.MatMul(_float(batch1), _float(batch2)), beta, alpha)


@lowering("aten::linear")
def linear(input: TReduced, weight: TReduced, bias: TReduced | None = None) -> TReduced:
    """input @ weight.T + bias; a 1-D weight is a single output feature (no transpose)."""
    if len(input.shape) == 2 and len(weight.shape) == 2:  # Gemm transposes the weight itself, bias included
        wide_bias = _float(bias) if bias is not None else None
        return op.Cast(op.Gemm(_float(input), _float(weight), wide_bias, transB=1), to=input.dtype)
    # Transposed first: the optimizer folds a Transpose of a weight into a view of it, while the Cast stays a
    # node (a float32 copy of the weights in the file would double a bfloat16 model's size).
    if len(weight.shape) == 2:
        weight = op.Transpose(weight, perm=[1, 0])
    product = op.MatMul(_float(input), _float(weight))
    if bias is None:
        return op.Cast(product, to=input.dtype)
    return _rounded_once(bias, product, 1.0, 1.0)
