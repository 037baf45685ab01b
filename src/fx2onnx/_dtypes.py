"""Conversions between torch dtypes and ONNX data types, and the cost of casting between them."""

from __future__ import annotations

import math

import onnx_ir as ir
import torch

_TORCH_TO_ONNX: dict[torch.dtype, ir.DataType] = {
    torch.float32: ir.DataType.FLOAT,
    torch.float16: ir.DataType.FLOAT16,
    torch.bfloat16: ir.DataType.BFLOAT16,
    torch.float64: ir.DataType.DOUBLE,
    torch.int8: ir.DataType.INT8,
    torch.int16: ir.DataType.INT16,
    torch.int32: ir.DataType.INT32,
    torch.int64: ir.DataType.INT64,
    torch.uint8: ir.DataType.UINT8,
    torch.uint16: ir.DataType.UINT16,
    torch.uint32: ir.DataType.UINT32,
    torch.uint64: ir.DataType.UINT64,
    torch.bool: ir.DataType.BOOL,
    torch.complex64: ir.DataType.COMPLEX64,
    torch.complex128: ir.DataType.COMPLEX128,
    torch.float8_e4m3fn: ir.DataType.FLOAT8E4M3FN,
    torch.float8_e4m3fnuz: ir.DataType.FLOAT8E4M3FNUZ,
    torch.float8_e5m2: ir.DataType.FLOAT8E5M2,
    torch.float8_e5m2fnuz: ir.DataType.FLOAT8E5M2FNUZ,
}
_ONNX_TO_TORCH = {v: k for k, v in _TORCH_TO_ONNX.items()}

# The first ONNX opset whose operators (Cast, QuantizeLinear...) take these types; earlier opsets cannot hold them.
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)
# bfloat16: no op, not even Cast, takes it before opset 13. float4_e2m1fn_x2: see to_onnx
MIN_OPSET: dict[torch.dtype, int] = {torch.bfloat16: 13, **dict.fromkeys(FLOAT8, 19)}


def to_onnx(dtype: torch.dtype) -> ir.DataType:
    try:
        return _TORCH_TO_ONNX[dtype]
    except KeyError:
        if dtype == torch.float4_e2m1fn_x2:
            raise TypeError(
                "torch.float4_e2m1fn_x2 packs two float4 values in each element, where ONNX's FLOAT4E2M1 (opset 23) "
                "counts each value: fx2onnx does not map one onto the other yet; pass such tensors as uint8 "
                "(tensor.view(torch.uint8)) and unpack them in the model"
            ) from None
        raise TypeError(f"torch dtype {dtype} has no ONNX equivalent") from None


def to_torch(dtype: ir.DataType) -> torch.dtype:
    try:
        return _ONNX_TO_TORCH[dtype]
    except KeyError:
        raise TypeError(f"ONNX data type {dtype.name} has no torch equivalent") from None


def short_name(dtype: ir.DataType | torch.dtype | None) -> str:
    """Compact names used in messages and reports: f32, bf16, i64, bool..."""
    if dtype is None:
        return "?"
    if isinstance(dtype, torch.dtype):
        dtype = to_onnx(dtype)
    return _SHORT.get(dtype, dtype.name.lower())


_SHORT = {
    ir.DataType.FLOAT: "f32",
    ir.DataType.FLOAT16: "f16",
    ir.DataType.BFLOAT16: "bf16",
    ir.DataType.DOUBLE: "f64",
    ir.DataType.INT8: "i8",
    ir.DataType.INT16: "i16",
    ir.DataType.INT32: "i32",
    ir.DataType.INT64: "i64",
    ir.DataType.UINT8: "u8",
    ir.DataType.UINT16: "u16",
    ir.DataType.UINT32: "u32",
    ir.DataType.UINT64: "u64",
    ir.DataType.BOOL: "bool",
    ir.DataType.COMPLEX64: "c64",
    ir.DataType.COMPLEX128: "c128",
}

# (kind, significant bits, exponent range) summarises what a type can hold exactly.
_FLOATS = {  # dtype -> (mantissa bits incl. implicit, max exponent)
    ir.DataType.FLOAT16: (11, 15),
    ir.DataType.BFLOAT16: (8, 127),
    ir.DataType.FLOAT: (24, 127),
    ir.DataType.DOUBLE: (53, 1023),
    # float8: an implementation for them is rare; float16 holds each of their values exactly
    ir.DataType.FLOAT8E4M3FN: (4, 8),
    ir.DataType.FLOAT8E4M3FNUZ: (4, 7),
    ir.DataType.FLOAT8E5M2: (3, 15),
    ir.DataType.FLOAT8E5M2FNUZ: (3, 15),
}
_INTS = {  # dtype -> (signed, bits)
    ir.DataType.UINT8: (False, 8),
    ir.DataType.INT8: (True, 8),
    ir.DataType.INT16: (True, 16),
    ir.DataType.UINT16: (False, 16),
    ir.DataType.INT32: (True, 32),
    ir.DataType.UINT32: (False, 32),
    ir.DataType.INT64: (True, 64),
    ir.DataType.UINT64: (False, 64),
}

LOSSY = 100.0
IMPOSSIBLE = math.inf


def is_complex(dtype: ir.DataType) -> bool:
    return dtype in (ir.DataType.COMPLEX64, ir.DataType.COMPLEX128)


def is_float(dtype: ir.DataType) -> bool:
    return dtype in _FLOATS


def is_int(dtype: ir.DataType) -> bool:
    return dtype in _INTS


def is_lossless(src: ir.DataType, dst: ir.DataType) -> bool:
    """True when every value of `src` is represented exactly in `dst`."""
    if src == dst:
        return True
    if src == ir.DataType.BOOL:
        return dst in _INTS or dst in _FLOATS
    if src in _FLOATS and dst in _FLOATS:
        (m1, e1), (m2, e2) = _FLOATS[src], _FLOATS[dst]
        return m1 <= m2 and e1 <= e2
    if src in _INTS and dst in _INTS:
        (s1, b1), (s2, b2) = _INTS[src], _INTS[dst]
        if s1 == s2:
            return b1 <= b2
        return (not s1) and s2 and b1 < b2
    if src in _INTS and dst in _FLOATS:
        signed, bits = _INTS[src]
        return bits - (1 if signed else 0) <= _FLOATS[dst][0]
    return False


def cast_cost(src: ir.DataType, dst: ir.DataType) -> float:
    """Cost of casting a tensor from `src` to `dst` so an implementation can take it.

    Lossless casts are cheap and ranked: float widening first, then bool to a number, then
    integer widening, then integer to float. Any lossy cast costs more than any combination of
    lossless ones, so the dispatcher never picks a lossy cast when a lossless one exists.
    Casting to bool or across complex and real is never done implicitly.
    """
    if src == dst:
        return 0.0
    if dst == ir.DataType.BOOL or is_complex(src) != is_complex(dst):
        return IMPOSSIBLE
    if dst not in _FLOATS and dst not in _INTS and not is_complex(dst):
        return IMPOSSIBLE  # strings (a type variable allowing every type): no numeric cast reaches them
    size_step = max(dst.itemsize - src.itemsize, 0) / 64  # among equals, the narrowest sufficient type
    if src not in _FLOATS and dst in _FLOATS and dst != ir.DataType.FLOAT:
        # Integers and bools become eager's default float (float32) first: a narrower float would round
        # the computation (int8 -> float16 is exact, but what is computed from it is not).
        size_step += 0.125
    if is_lossless(src, dst):
        if src in _FLOATS:
            base = 1.0
        elif src == ir.DataType.BOOL:
            base = 2.0 if dst in _INTS else 2.5
        elif dst in _INTS:
            base = 3.0
        else:
            base = 4.0
        return base + size_step
    if src in _FLOATS and dst not in _FLOATS:
        # A float made an integer loses its fraction; an integer made a float only rounds beyond its mantissa:
        # stack([bfloat16, int64]) computes in bfloat16, as eager does, not in int64.
        size_step += 0.5
    return LOSSY + size_step


def allowed_dtypes(constraint: ir.schemas.TypeConstraintParam) -> frozenset[ir.DataType]:
    """The tensor dtypes a type constraint of an op signature allows (a sequence's element dtype included)."""
    # Cached by identity: signatures live as long as the registry, and isinstance on onnx_ir's protocol
    # types is slow enough to show in an export's profile (dispatch and the recorder ask per node).
    cached = _ALLOWED.get(id(constraint))
    if cached is not None and cached[0] is constraint:
        return cached[1]
    allowed = set()
    for type_ in constraint.allowed_types:
        if type(type_) is not ir.TensorType and isinstance(type_, ir.SequenceType):  # a plain tensor type first
            type_ = type_.elem_type
        dtype = getattr(type_, "dtype", None)
        if dtype is not None:
            allowed.add(dtype)
    result = frozenset(allowed)
    _ALLOWED[id(constraint)] = (constraint, result)
    return result


_ALLOWED: dict[int, tuple[ir.schemas.TypeConstraintParam, frozenset[ir.DataType]]] = {}
