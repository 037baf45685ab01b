"""Complex elementary functions, powers and products from their formulas on the real and imaginary parts.

Used by :mod:`fx2onnx._passes.complex_parts`: each function here takes a node with a complex input and returns
the nodes of real ops that compute its result. The transcendental ones compute in float64 (complex64's parts are
float32, so float64 holds their squares without overflow and the formulas' cancellations stay below float32's
rounding), then round once to the component dtype. The branch cuts are C99's (and eager's): on a cut, the sign
of the zero part picks the side (``asin(2+0j)`` has a positive imaginary part, ``asin(2-0j)`` a negative one),
because the formulas keep the input's signed zeros (copysign) where the result depends on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.fx

from fx2onnx._torch_ops import aten, prims


class Builder(Protocol):
    """What these formulas need of complex_parts' node builder."""

    def call(self, target: Any, *args: Any, **kwargs: Any) -> torch.fx.Node: ...

    def part(self, value: torch.fx.Node, which: int) -> torch.fx.Node: ...

    def complex(self, real: torch.fx.Node, imag: torch.fx.Node) -> torch.fx.Node: ...


class Real:
    """Arithmetic on real FX nodes of one dtype, written as formulas (Python numbers allowed on either side)."""

    def __init__(self, build: Builder, node: torch.fx.Node) -> None:
        self.build, self.node = build, node

    def _wrap(self, node: torch.fx.Node) -> Real:
        return Real(self.build, node)

    def _call(self, target: Any, *args: Any) -> Real:
        return self._wrap(self.build.call(target, *(a.node if isinstance(a, Real) else a for a in args)))

    @property
    def dtype(self) -> torch.dtype:
        return self.node.meta["val"].dtype

    def __add__(self, other: Real | float) -> Real:
        return self._call(aten.add.Tensor, self, other)

    def __radd__(self, other: float) -> Real:
        return self._call(aten.add.Tensor, self, other)

    def __sub__(self, other: Real | float) -> Real:
        return self._call(aten.sub.Tensor, self, other)

    def __rsub__(self, other: float) -> Real:
        return -self + other

    def plus_zero(self) -> Real:
        """``self + 0.0`` as IEEE computes it (-0.0 becomes +0.0), which ONNX optimizers fold away to ``self``."""
        return where(self.eq(0), 0.0, self)

    def __mul__(self, other: Real | float) -> Real:
        return self._call(aten.mul.Tensor, self, other)

    def __rmul__(self, other: float) -> Real:
        return self._call(aten.mul.Tensor, self, other)

    def __truediv__(self, other: Real | float) -> Real:
        return self._call(aten.div.Tensor, self, other)

    def __rtruediv__(self, other: float) -> Real:
        inverse = self._call(aten.reciprocal.default, self)
        return inverse if other == 1 else inverse * other

    def __neg__(self) -> Real:
        return self._call(aten.neg.default, self)

    def __lt__(self, other: Real | float) -> Real:  # type: ignore[override]
        return self._call(aten.lt.Tensor if isinstance(other, Real) else aten.lt.Scalar, self, other)

    def __gt__(self, other: Real | float) -> Real:  # type: ignore[override]
        return self._call(aten.gt.Tensor if isinstance(other, Real) else aten.gt.Scalar, self, other)

    def __ge__(self, other: Real | float) -> Real:  # type: ignore[override]
        return self._call(aten.ge.Tensor if isinstance(other, Real) else aten.ge.Scalar, self, other)

    def eq(self, other: Real | float) -> Real:
        return self._call(aten.eq.Tensor if isinstance(other, Real) else aten.eq.Scalar, self, other)

    def __and__(self, other: Real) -> Real:
        return self._call(aten.logical_and.default, self, other)

    def __or__(self, other: Real) -> Real:
        return self._call(aten.logical_or.default, self, other)

    def __invert__(self) -> Real:
        return self._call(aten.logical_not.default, self)

    def apply(self, target: Any, *args: Any) -> Real:
        return self._call(target, self, *args)

    def __getattr__(self, name: str) -> Callable[..., Real]:
        """``x.sin()``, ``x.abs()``...: the aten op of that name (its default overload) on this value."""
        if name.startswith("_"):
            raise AttributeError(name)
        packet = getattr(aten, name)
        return lambda *args: self._call(packet.default, self, *args)

    def copysign(self, sign: Real) -> Real:
        """|self| with `sign`'s sign, zeros included (a product with ±1: see :meth:`where`)."""
        return self.abs() * (1.0 - sign.signbit().to(self.dtype) * 2.0)

    def atan2(self, other: Real) -> Real:
        return self._call(aten.atan2.default, self, other)

    def to(self, dtype: torch.dtype) -> Real:
        if dtype == self.dtype:
            return self
        return self._call(prims.convert_element_type.default, self, dtype)

    def full(self, value: float) -> Real:
        """A tensor shaped and typed like this one, filled with `value`."""
        return self._call(aten.full_like.default, self, value)

    def where(self, condition: Real, other: Real | float) -> Real:
        """This value where `condition` holds, else `other`, signed zeros kept.

        ONNX Runtime's float Where turns a -0.0 taken from its first value input into +0.0 (it merges the two
        selections with ``a != 0 ? a : b``); the false input's zeros keep their sign. So the sign is chosen apart,
        on booleans, and put back by a product with ±1.
        """
        otherwise = other if isinstance(other, Real) else self.full(other)
        chosen = self._call(aten.where.self, condition, self, otherwise)
        negative = self._call(aten.where.self, condition, self.signbit(), otherwise.signbit())
        return chosen.abs() * (1.0 - negative.to(self.dtype) * 2.0)


def where(condition: Real, chosen: Real | float, otherwise: Real | float) -> Real:
    like = chosen if isinstance(chosen, Real) else otherwise
    assert isinstance(like, Real)
    first = chosen if isinstance(chosen, Real) else like.full(chosen)
    return first.where(condition, otherwise)


Pair = tuple[Real, Real]
_WORK = torch.float64


def parts(build: Builder, value: torch.fx.Node, dtype: torch.dtype | None = _WORK) -> Pair:
    """`value`'s real and imaginary parts (complex node), in `dtype` (None: the component dtype)."""
    real, imag = Real(build, build.part(value, 0)), Real(build, build.part(value, 1))
    if dtype is None:
        return real, imag
    return real.to(dtype), imag.to(dtype)


def assemble(build: Builder, node: torch.fx.Node, pair: Pair) -> torch.fx.Node:
    """The complex result of `node` from its parts, rounded to the result's component dtype."""
    component = node.meta["val"].dtype.to_real()
    return build.complex(pair[0].to(component).node, pair[1].to(component).node)


# --- products and quotients -----------------------------------------------------------------------------------------
def multiply(a: Pair, b: Pair) -> Pair:
    return a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]


def reciprocal(a: Pair) -> Pair:
    """1 / (c + id) by Smith's algorithm, as eager's complex division (its signed zeros too); 1/0 is inf + nan i."""
    c, d = a
    wide = c.abs() >= d.abs()
    ratio = d / c
    scale = (c + d * ratio).reciprocal()
    tall_ratio = c / d
    tall_scale = (d + c * tall_ratio).reciprocal()
    real = where(wide, scale, tall_ratio.plus_zero() * tall_scale)  # (1 r + 0) / ..., as eager's
    imag = where(wide, (-ratio).plus_zero() * scale, -tall_scale)  # (0 - 1 r) / ...
    zero = c.eq(0) & d.eq(0)
    return where(zero, math.inf, real), where(zero, math.nan, imag)


def divide(a: Pair, b: Pair) -> Pair:
    inverse = reciprocal(b)
    return multiply(a, inverse)


# --- exponentials and logarithms ------------------------------------------------------------------------------------
def exp(a: Pair) -> Pair:
    """C99's cexp, with its special values where the exponent is infinite or the angle zero or not finite:
    exp(-inf + i nan) = 0, exp(inf + i nan) = inf + i nan, exp(x + 0i) = e^x + 0i."""
    x, y = a
    magnitude = x.exp()
    real, imag = magnitude * y.cos(), magnitude * y.sin()
    angle_not_finite = ~y.isfinite()
    real = where(x.eq(-math.inf) & angle_not_finite, 0.0, where(x.eq(math.inf) & angle_not_finite, math.inf, real))
    imag = where(x.eq(-math.inf) & angle_not_finite, 0.0, where(x.eq(math.inf) & angle_not_finite, math.nan, imag))
    zero_angle = y.eq(0)
    return where(zero_angle, magnitude, real), where(zero_angle, y, imag)


def log(a: Pair) -> Pair:
    x, y = a
    return (x * x + y * y).log() * 0.5, y.atan2(x)


def _modulus(a: Pair) -> Real:
    return (a[0] * a[0] + a[1] * a[1]).sqrt()


def sqrt(a: Pair) -> Pair:
    """t = sqrt((|x| + |z|) / 2): (t, y / 2t) for x >= 0, (|y| / 2t, copysign(t, y)) otherwise; sqrt(0 + yi) for
    y = ±0 is (0, y)."""
    x, y = a
    t = ((x.abs() + _modulus(a)) * 0.5).sqrt()
    half = y / (t * 2.0)
    nonnegative = x >= 0
    real = where(nonnegative, t, half.abs())
    imag = where(nonnegative, half, t.copysign(y))
    zero = t.eq(0)
    return where(zero, t, real), where(zero, y, imag)


# --- trigonometric and hyperbolic functions ---------------------------------------------------------------------------
def sin(a: Pair) -> Pair:
    x, y = a
    return x.sin() * y.cosh(), x.cos() * y.sinh()


def cos(a: Pair) -> Pair:
    x, y = a
    return x.cos() * y.cosh(), -(x.sin() * y.sinh())


def sinh(a: Pair) -> Pair:
    x, y = a
    return _times_angle(x.sinh(), y.cos(), y), _times_angle(x.cosh(), y.sin(), y)


def cosh(a: Pair) -> Pair:
    x, y = a
    return _times_angle(x.cosh(), y.cos(), y), _times_angle(x.sinh(), y.sin(), y)


def _times_angle(magnitude: Real, factor: Real, angle: Real) -> Real:
    """magnitude * factor, where a zero angle keeps an infinite magnitude's product finite (C99: sinh(inf + 0i) is
    inf + 0i, not inf + nan i)."""
    product = magnitude * factor
    return where(magnitude.isinf() & factor.eq(0), factor * magnitude.sign(), product)


def tanh(a: Pair) -> Pair:
    """(sinh x cosh x + i sin y cos y) / (sinh^2 x + cos^2 y); beyond |x| = 20, tanh x is ±1 in float64 and the
    imaginary part 2 sin 2y e^(-2|x|) (the formula's squares would overflow)."""
    x, y = a
    sinh_x, cos_y = x.sinh(), y.cos()
    denominator = sinh_x * sinh_x + cos_y * cos_y
    real = sinh_x * x.cosh() / denominator
    imag = y.sin() * cos_y / denominator
    large = x.abs() > 20.0
    far_imag = (y * 2.0).sin() * ((x.abs() * -2.0).exp() * 2.0)
    return where(large, x.full(1.0).copysign(x), real), where(large, far_imag, imag)


def tan(a: Pair) -> Pair:
    """tan z = -i tanh(iz)."""
    x, y = a
    u, v = tanh((-y, x))
    return v, -u


def _hull(a: Pair) -> tuple[Real, Real]:
    """A = (|z + 1| + |z - 1|) / 2 (>= 1) and B = x / A (in [-1, 1]) of Hull, Fairgrieve and Tang's asin/acos."""
    x, y = a
    y2 = y * y
    r = ((x + 1.0) * (x + 1.0) + y2).sqrt()
    s = ((x - 1.0) * (x - 1.0) + y2).sqrt()
    big_a = ((r + s) * 0.5).clamp(1.0)
    return big_a, (x / big_a).clamp(-1.0, 1.0)


def asin(a: Pair) -> Pair:
    big_a, big_b = _hull(a)
    return big_b.asin(), big_a.acosh().copysign(a[1])


def acos(a: Pair) -> Pair:
    big_a, big_b = _hull(a)
    return big_b.acos(), -big_a.acosh().copysign(a[1])


def acosh(a: Pair) -> Pair:
    big_a, big_b = _hull(a)
    return big_a.acosh(), big_b.acos().copysign(a[1])


def asinh(a: Pair) -> Pair:
    """asinh z = i asin(-iz)."""
    x, y = a
    p, q = asin((y, -x))
    return -q, p


def atanh(a: Pair) -> Pair:
    """(log1p(4x / ((1 - x)^2 + y^2)) / 4, atan2(2y, (1 - x)(1 + x) - y^2) / 2)."""
    x, y = a
    one_minus = 1.0 - x
    real = (x * 4.0 / (one_minus * one_minus + y * y)).log1p() * 0.25
    imag = (y * 2.0).atan2(one_minus * (x + 1.0) - y * y) * 0.5
    return real, imag


def atan(a: Pair) -> Pair:
    """atan z = -i atanh(iz)."""
    x, y = a
    u, v = atanh((-y, x))
    return v, -u


def expm1(a: Pair) -> Pair:
    """(expm1(x) cos y - 2 sin^2(y/2), e^x sin y): accurate near 0."""
    x, y = a
    half_sin = (y * 0.5).sin()
    return x.expm1() * y.cos() - half_sin * half_sin * 2.0, _times_angle(x.exp(), y.sin(), y)


def log1p(a: Pair) -> Pair:
    """(log1p(2x + x^2 + y^2) / 2, atan2(y, 1 + x)) for |z| < 1/2 (accurate near 0), else log|1 + z|."""
    x, y = a
    r = x * (x + 2.0) + y * y
    near_zero = where(r.eq(0), x, r.log1p() * 0.5)  # eager's: x itself where r underflows
    far = ((x + 1.0) * (x + 1.0) + y * y).log() * 0.5
    return where(_modulus(a) < 0.5, near_zero, far), y.atan2(x + 1.0)


def _scaled(pair: Pair, factor: float) -> Pair:
    return pair[0] * factor, pair[1] * factor


def sigmoid(a: Pair) -> Pair:
    """1 / (1 + e^-z)."""
    e = exp((-a[0], -a[1]))
    return reciprocal((e[0] + 1.0, e[1]))


# target -> formula on the parts (float64), for ops of one complex input.
UNARY: dict[Any, Callable[[Pair], Pair]] = {
    aten.sqrt.default: sqrt,
    aten.rsqrt.default: lambda a: reciprocal(sqrt(a)),
    aten.sin.default: sin,
    aten.cos.default: cos,
    aten.tan.default: tan,
    aten.sinh.default: sinh,
    aten.cosh.default: cosh,
    aten.tanh.default: tanh,
    aten.asin.default: asin,
    aten.acos.default: acos,
    aten.atan.default: atan,
    aten.asinh.default: asinh,
    aten.acosh.default: acosh,
    aten.atanh.default: atanh,
    aten.exp2.default: lambda a: exp(_scaled(a, math.log(2.0))),
    aten.expm1.default: expm1,
    aten.log1p.default: log1p,
    aten.log2.default: lambda a: _scaled(log(a), 1.0 / math.log(2.0)),
    aten.log10.default: lambda a: _scaled(log(a), 1.0 / math.log(10.0)),
    aten.sigmoid.default: sigmoid,
}


def unary(build: Builder, node: torch.fx.Node) -> torch.fx.Node:
    return assemble(build, node, UNARY[node.target](parts(build, node.args[0])))


# --- powers -----------------------------------------------------------------------------------------------------------
def power(base: Pair, exponent: Pair) -> Pair:
    """exp(w log z), as eager's std::pow: the product's infinities and NaNs meet cexp's special values (0^w is
    0 for Re w > 0, 0^0 NaN)."""
    return exp(multiply(exponent, log(base)))


def _number_pair(like: Real, number: complex | float | int) -> Pair:
    value = complex(number)
    return like.full(value.real), like.full(value.imag)


def _operand(build: Builder, value: Any, like: Real | None) -> Pair:
    if isinstance(value, torch.fx.Node):
        val = value.meta["val"]
        if val.is_complex():
            return parts(build, value)
        real = Real(build, value).to(_WORK)
        return real, real.full(0.0)
    assert like is not None
    return _number_pair(like, value)


# Tensor ** number: the exponents eager computes without exp and log (pow_tensor_scalar's special cases).
def _tensor_power_of_number(base: Pair, exponent: complex) -> Pair:
    if exponent == 0:
        return base[0].full(1.0), base[0].full(0.0)
    if exponent == 1:
        return base
    if exponent == 2:
        return multiply(base, base)
    if exponent == 3:
        return multiply(multiply(base, base), base)
    if exponent == 0.5:
        return sqrt(base)
    if exponent == -0.5:
        return reciprocal(sqrt(base))
    if exponent == -1:
        return reciprocal(base)
    if exponent == -2:
        return reciprocal(multiply(base, base))
    return power(base, _number_pair(base[0], exponent))


def pow_(build: Builder, node: torch.fx.Node) -> torch.fx.Node:
    base, exponent = node.args[:2]
    if node.target is aten.pow.Tensor_Scalar:
        pair = _tensor_power_of_number(_operand(build, base, None), exponent)
    else:
        like = next(_operand(build, v, None)[0] for v in (base, exponent) if isinstance(v, torch.fx.Node))
        pair = power(_operand(build, base, like), _operand(build, exponent, like))
    return assemble(build, node, pair)


POWERS = {aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar}


# --- products along a dim -------------------------------------------------------------------------------------------
def _magnitude_and_angle(build: Builder, value: torch.fx.Node) -> tuple[Real, Real]:
    x, y = parts(build, value)
    return _modulus((x, y)), y.atan2(x)


def _from_polar(magnitude: Real, angle: Real) -> Pair:
    """magnitude (cos angle, sin angle), where a zero sine (or cosine) of an exact multiple of pi/2 stays 0."""
    return magnitude * angle.cos(), magnitude * angle.sin()


def product(build: Builder, node: torch.fx.Node) -> torch.fx.Node:
    """prod z = prod |z| e^(i sum arg z); cumprod the running product and sum."""
    magnitude, angle = _magnitude_and_angle(build, node.args[0])
    rest = list(node.args[1:])
    kwargs = {k: v for k, v in node.kwargs.items() if k != "dtype"}
    if node.target is aten.cumprod.default:
        total = magnitude.apply(aten.cumprod.default, *rest)
        turned = angle.apply(aten.cumsum.default, *rest)
    elif node.target is aten.prod.default:
        total, turned = magnitude.apply(aten.prod.default), angle.apply(aten.sum.default)
    else:  # prod.dim_int(self, dim, keepdim=False)
        dim = rest[0]
        keepdim = rest[1] if len(rest) > 1 else kwargs.get("keepdim", False)
        total = magnitude.apply(aten.prod.dim_int, dim, keepdim)
        turned = angle.apply(aten.sum.dim_IntList, [dim], keepdim)
    return assemble(build, node, _from_polar(total, turned))


PRODUCTS_ALONG = {aten.prod.default, aten.prod.dim_int, aten.cumprod.default}
