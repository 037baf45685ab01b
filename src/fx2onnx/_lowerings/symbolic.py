"""Symbolic scalars: sym_max/sym_min/sym_ite/sym_not/sym_float/sym_int/sqrt and floordiv on SymInts."""

from __future__ import annotations

from typing import TypeVar

import onnx_ir as ir
from onnxscript import BOOL, FLOAT, INT64
from onnxscript import opset18 as op

from fx2onnx._emit.context import LoweringContext
from fx2onnx._lowerings.rules import lowering
from fx2onnx._records import CHECK_PREFIX, RUNTIME_CHECK

TScalar = TypeVar("TScalar", BOOL, FLOAT, INT64)


TNumber = TypeVar("TNumber", FLOAT, INT64)


@lowering("torch::sym_max")
def sym_max(a: TNumber, b: TNumber) -> TNumber:
    return op.Max(a, b)


@lowering("torch::sym_min")
def sym_min(a: TNumber, b: TNumber) -> TNumber:
    return op.Min(a, b)


@lowering("torch::sym_ite")
def sym_ite(b: BOOL, t: TScalar, f: TScalar) -> TScalar:
    """``t if b else f``: both branches are already computed values, so a Where, not an If."""
    return op.Where(b, t, f)


@lowering("torch::sym_not")
def sym_not(a: BOOL) -> BOOL:
    return op.Not(a)


@lowering("torch::sym_float")
def sym_float(a: TScalar) -> FLOAT:
    return op.Cast(a, to=FLOAT.dtype)


@lowering("torch::sym_int")
def sym_int(a: FLOAT) -> INT64:
    """Python's ``int()`` of a float truncates toward zero, as Cast does."""
    return op.Cast(a, to=INT64.dtype)


@lowering("torch::_sym_sqrt")
def sym_sqrt(a: TNumber) -> FLOAT:
    return op.Sqrt(op.Cast(a, to=FLOAT.dtype))


@lowering("_operator::floordiv")
def floordiv(a: TNumber, b: TNumber) -> TNumber:
    """Python's ``a // b``, which rounds toward -inf (torchlib's lowering truncates: wrong for negative operands,
    as in the ceil-division idiom ``-(-n // k)``)."""
    reference = b if isinstance(a, int) else a  # one operand may be a Python constant (``18200 // min(50, n)``)
    a, b = (op.CastLike(x, reference) if isinstance(x, int) else x for x in (a, b))
    if reference.dtype == FLOAT.dtype:
        return op.Floor(op.Div(a, b))
    zero = op.CastLike(0, a)
    quotient = op.Div(a, b)  # truncates toward zero
    inexact = op.Not(op.Equal(op.Mul(quotient, b), a))
    signs_differ = op.Xor(op.Less(a, zero), op.Less(b, zero))
    return op.Sub(quotient, op.Cast(op.And(inexact, signs_differ), to=INT64.dtype))


# --- run-time checks of what the capture assumed -----------------------------------------------------------------
# A check node carries the assumption it verifies (records.RUNTIME_CHECK): the export (``_emit/runtime_checks.py``)
# renames it after the user's dims and line and makes it feed an output.


def check_node(ok: BOOL, name: str) -> INT64:
    """A scalar int64 0 that only exists when `ok` holds: a Gather from a one-element tensor at index ``not ok``,
    which ONNX Runtime refuses (index 1 out of range), naming the node, when the condition is false."""
    index = op.Cast(op.Not(ok), to=INT64.dtype)
    zero = op.Gather(op.Constant(value_ints=[0]), index, axis=0)
    zero.producer().name = name
    return zero


@lowering("aten::_assert_scalar", context=True)
def assert_scalar(ctx: LoweringContext, self: BOOL, assert_msg: str = "") -> INT64 | None:
    """torch.export's deferred runtime assertion (a guard on dynamic or data-dependent sizes that the graph was
    captured under: ``Ne(s0, 1)``, ``Eq(u0, 3)``): checked at run time, so that an input breaking it fails in ONNX
    Runtime, naming the assumption, rather than computing something else than eager. The check's result must feed
    an output (ONNX Runtime drops what none reads): the export adds them to one (``_emit/runtime_checks.py``)."""
    if isinstance(self, bool):  # decided at export: true holds for every input
        if self:
            return None
        self = op.Constant(value=ir.tensor(False))
    expression = assert_msg.removeprefix("Runtime assertion failed for expression ").split(" on node ")[0]
    zero = check_node(op.Cast(self, to=BOOL.dtype), ctx.fresh_name(f"{CHECK_PREFIX}_{expression or ctx.node.name}"))
    zero.producer().metadata_props[RUNTIME_CHECK] = expression or str(ctx.node.name)
    return zero
