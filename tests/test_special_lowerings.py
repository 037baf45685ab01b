"""fx2onnx's lowerings of special functions (src/fx2onnx/_lowerings/special.py), each against eager.

The inputs cover what the coverage sweep samples and the special cases of eager's algorithms (Math.h): degrees
below 0, 0, 1 and above the switch to trigonometric forms, |x| = 1, the branch points of the Bessel and Airy
approximations, integer and bool inputs (which eager computes in float32), inf and NaN.

The gamma family (lgamma, digamma, polygamma, mvlgamma), erfinv, ndtri and log_ndtr are also checked at float64's
own accuracy (rtol 1e-13 or tighter, against eager's ~1e-15) over their hard regions: near 0 and +-1 for erfinv,
probabilities down to 1e-300 for ndtri, negative non-integers next to the poles, lgamma's zeros at 1 and 2, large
arguments, +-0, +-inf and NaN, whose values (and zeros' signs) must be eager's exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from test_accuracy_lowerings import check_values

from conftest import Call, assert_exports_and_matches

# Tolerances of the coverage sweep (src/fx2onnx/coverage/check.py); float64 results must be float64-accurate.
_TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-5, 1e-6)}

_POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


def _all_of(names: list[str]) -> Callable[..., tuple[torch.Tensor, ...]]:
    """One model computing every function in `names` (one export checks them all)."""
    functions = [getattr(torch.special, name) for name in names]
    return lambda *args: tuple(function(*args) for function in functions)


def test_polynomials_with_tensor_degree() -> None:
    """One model, three input sets: each loop's trip count follows the degree tensor at run time."""
    x = torch.tensor([-8.5, -1.0, -0.7, -0.2, 0.0, 1e-3, 0.3, 0.5, 0.99, 1.0, 2.5], dtype=torch.float64)
    n = torch.tensor([-2.5, -1.0, 0.0, 1.0, 2.0, 3.7, 5.0, 7.0, 9.0, 12.0], dtype=torch.float64).reshape(-1, 1)
    rtol, atol = _TOLERANCE[torch.float64]
    assert_exports_and_matches(
        Call(_all_of(_POLYNOMIALS)),
        (x, n),
        run_with=[((x, n), {}), ((x, n * 2), {}), ((x, torch.zeros_like(n)), {})],
        rtol=rtol,
        atol=atol,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_polynomial_dtypes(dtype: torch.dtype) -> None:
    """float32 computes in float32; integer and bool inputs promote to float32 as in eager."""
    x = torch.tensor([-8, -1, 0, 1, 2, 6, 9]).to(dtype)
    n = torch.tensor([0, 1, 2, 5, 7, 9, 3]).to(dtype).reshape(-1, 1)
    assert_exports_and_matches(Call(_all_of(_POLYNOMIALS)), (x, n), rtol=1e-4, atol=1e-4)


def test_number_arguments() -> None:
    """The .n_scalar / .x_scalar (and zeta's) overloads a Python number in the call captures to."""

    def calls(x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
        special = torch.special
        return (
            special.chebyshev_polynomial_t(x, 3),
            special.hermite_polynomial_h(2.0, n),
            special.legendre_polynomial_p(n, 4),
            special.laguerre_polynomial_l(n, 2.5),
            special.zeta(x + 1.5, 2.0),
            special.zeta(3.0, x + 1),
        )

    x, n = torch.tensor([0.1, 0.5, 0.9, 2.0]), torch.tensor([-2, 0, 1, 3])
    assert_exports_and_matches(Call(calls), (x, n), rtol=1e-4, atol=1e-4)


_EDGES = [0.0, -0.0, 1e-6, -1e-6, 1e-3, 2.0, 2.09, -2.09, 5.0, -5.0, 8.0, 8.3203353, 1e4, -1e4]
_UNARY = [
    "bessel_j0",
    "bessel_j1",
    "bessel_y0",
    "bessel_y1",
    "modified_bessel_i0",
    "modified_bessel_i1",
    "modified_bessel_k0",
    "modified_bessel_k1",
    "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1",
    "airy_ai",
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bessel_and_airy(dtype: torch.dtype) -> None:
    edges = torch.tensor([*_EDGES, float("inf"), float("-inf"), float("nan")])
    x = torch.cat([torch.linspace(-120, 120, 241), torch.linspace(-10, 10, 81), edges]).to(dtype)
    rtol, atol = _TOLERANCE[dtype]
    assert_exports_and_matches(Call(_all_of(_UNARY)), (x,), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool])
def test_bessel_of_integers(dtype: torch.dtype) -> None:
    """Not through float16 (the cheapest lossless cast from these): eager computes them in float32."""
    x = torch.arange(-100, 101, 7).clamp(0 if dtype == torch.uint8 else -100, 100).to(dtype)
    assert_exports_and_matches(Call(_all_of(_UNARY)), (x,), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.bool])
def test_polygamma_of_integers(dtype: torch.dtype) -> None:
    """At negative integers eager's trigamma is huge but finite, digamma NaN, and the zeta form +-inf."""
    x = torch.arange(-9, 10).to(dtype)
    model = Call(lambda t: tuple(torch.polygamma(order, t) for order in range(5)))
    assert_exports_and_matches(model, (x,), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_zeta(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(30, generator=generator) * 18 - 9, torch.tensor([1.0, 2.0, 3.0, 0.5, 4.0, 2.0])])
    q = torch.cat([torch.rand(30, generator=generator) * 18 - 9, torch.tensor([2.0, -3.0, -2.5, 1.0, 0.0, 1.0])])
    if not dtype.is_floating_point:
        x, q = x.round(), q.round()
    rtol, atol = _TOLERANCE.get(dtype, (1e-4, 1e-4))
    assert_exports_and_matches(Call(torch.special.zeta), (x.to(dtype), q.to(dtype)), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int64])
def test_gcd_and_lcm(dtype: torch.dtype) -> None:
    """Zeros on either side, and lcm wrapping as eager's int arithmetic does in narrow types."""
    generator = torch.Generator().manual_seed(0)
    low = 0 if dtype == torch.uint8 else max(torch.iinfo(dtype).min + 1, -(10**6))
    high = min(torch.iinfo(dtype).max, 10**6)
    a = torch.randint(low, high, (40,), generator=generator).to(dtype)
    b = torch.randint(low, high, (40,), generator=generator).to(dtype)
    a[0], b[1], a[2], b[2] = 0, 0, 0, 0
    assert_exports_and_matches(Call(lambda s, t: (torch.gcd(s, t), torch.lcm(s, t))), (a, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
def test_logit_with_eps(dtype: torch.dtype) -> None:
    values = [-1.0, 0.0, 0.1, 0.5, 0.9, 1.0, 2.0] + ([float("nan")] if dtype.is_floating_point else [])
    x = torch.tensor(values).to(dtype)
    assert_exports_and_matches(Call(lambda t: (torch.logit(t, 0.2), torch.logit(t))), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8])
def test_erfcx_and_log_ndtr(dtype: torch.dtype) -> None:
    """Both tails without overflow or underflow: erfcx to 6e7 and below -26.7 (inf), log_ndtr far below 0."""
    values = [0.0, 0.999, 1.0, 7.99, 8.0, 50.0, 50.1, 6e7, -6.1, -6.09, -26.8, float("inf"), float("-inf")]
    x = torch.cat([torch.linspace(-30, 60, 181), torch.linspace(-2, 2, 41), torch.tensor(values)])
    x = x.to(dtype) if dtype.is_floating_point else x[x.isfinite()].clamp(-100, 100).to(dtype)
    rtol, atol = _TOLERANCE.get(dtype, (1e-4, 1e-4))
    model = Call(_all_of(["erfcx", "log_ndtr"]))
    assert_exports_and_matches(model, (x,), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_incomplete_gamma(dtype: torch.dtype) -> None:
    """Every expansion eager picks (series, continued fraction, upper series, uniform asymptotic) and the edges."""
    generator = torch.Generator().manual_seed(0)
    edges_a = [0.0, 0.0, 1.0, float("inf"), 2.0, 3.0, 0.5, 25.0, 250.0, 1.0, -1.0, float("nan")]
    edges_x = [1.0, 0.0, 0.0, 2.0, float("inf"), 0.3, 0.7, 26.0, 255.0, 1e-5, 1.0, 1.0]
    a = torch.cat([torch.rand(40, generator=generator) * 18 - 9, torch.rand(20, generator=generator) * 300])
    x = torch.cat([torch.rand(40, generator=generator) * 18 - 9, torch.rand(20, generator=generator) * 300])
    a, x = torch.cat([a, torch.tensor(edges_a)]).to(dtype), torch.cat([x, torch.tensor(edges_x)]).to(dtype)
    rtol, atol = _TOLERANCE[dtype]
    model = Call(lambda s, t: (torch.igamma(s, t), torch.igammac(s, t)))
    assert_exports_and_matches(model, (a, x), rtol=rtol, atol=atol)


def test_tan_float64_is_float64_accurate() -> None:
    x = torch.linspace(-10, 10, 101, dtype=torch.float64)
    assert_exports_and_matches(Call(torch.tan), (x,), rtol=1e-10, atol=1e-12)


def _float_edges(dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    values = [0.0, -0.0, 1.0, -1.0, 0.5, 0.75, 3.0, 1024.0, 1e-3, -7.5, 2.0, -4.0, 1 - info.eps]
    values += [float("inf"), float("-inf"), float("nan"), info.tiny, info.tiny / 4, info.max, -info.max]
    generator = torch.Generator().manual_seed(0)
    return torch.cat([torch.tensor(values, dtype=torch.float64), torch.randn(20, generator=generator) * 100]).to(dtype)


_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def test_frexp() -> None:
    """Exact mantissa and exponent in each float type, subnormals, zeros, the largest, inf and NaN included."""
    model = Call(lambda *xs: tuple(part for x in xs for part in torch.frexp(x)))
    assert_exports_and_matches(model, tuple(_float_edges(dtype) for dtype in _FLOATS), rtol=0.0, atol=0.0)


def test_nextafter() -> None:
    """Exact: toward +-inf, 0, other values and itself, from subnormals, powers of two, the largest and inf."""
    model = Call(lambda *xs: tuple(torch.nextafter(x, y) for x, y in zip(xs[0::2], xs[1::2])))

    def pairs(towards: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return tuple(t for dtype in _FLOATS for t in (_float_edges(dtype), towards(_float_edges(dtype))))

    runs = [(pairs(lambda x, v=value: torch.full_like(x, v)), {}) for value in (float("inf"), float("-inf"), 0.0)]
    runs += [(pairs(lambda x: x.clone()), {}), (pairs(lambda x: x.flip(0)), {})]
    assert_exports_and_matches(model, runs[-1][0], run_with=runs, rtol=0.0, atol=0.0)


def test_optimizer_keeps_tiny_additions_and_near_one_factors() -> None:
    """onnxscript's x + 0 / x * 1 rules match within a tolerance; fx2onnx's optimizer requires exact 0 and 1."""
    x = torch.tensor([1e-10, 2e-10], dtype=torch.float64)
    program = assert_exports_and_matches(Call(lambda t: (t * 0.5 + 3.4e-10) * 1.000001), (x,), rtol=1e-7, atol=0.0)
    assert [node.op_type for node in program.model_proto.graph.node].count("Add") == 1


# --- float64-accurate gamma family, erfinv, ndtri and log_ndtr ------------------------------------------------
INF, NAN = float("inf"), float("nan")


def _gamma_arguments(dtype: torch.dtype) -> torch.Tensor:
    """A grid over [-30, 40] (no integers), both sides of the poles -1..-5 and of lgamma's zeros, tiny and huge
    arguments, -100.3 (eager's zeta sums over 100 direct terms there), +-0, negative integers, +-inf and NaN."""
    poles = torch.arange(1, 6, dtype=torch.float64)
    edges = [1e-8, 1 - 1e-7, 1 + 1e-8, 2 - 1e-9, 2 + 1e-7, 1.4616321449683622, 1e3, 1e6, 1e15, 1e200, -0.5]
    edges += [-1e-9, -2.457024738220797, -2.7476826467274127, -100.3, -1000.7, 0.0, -0.0, -1.0, -7.0, INF, -INF, NAN]
    values = [torch.linspace(-30.29, 40.13, 701, dtype=torch.float64), -poles + 1e-5, -poles - 1e-5]
    return torch.cat([*values, torch.tensor(edges, dtype=torch.float64)]).to(dtype)


def _gamma_family(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        torch.lgamma(x),
        torch.digamma(x),
        torch.special.psi(x),
        *(torch.polygamma(n, x) for n in (1, 2, 3)),
        torch.mvlgamma(x.abs() + 2.0, 3),
    )


@pytest.mark.parametrize(
    ("dtype", "rtol", "atol"),
    # atol: psi has a zero at 1.46 and between poles, lgamma at 1, 2 and between poles, where both cancel.
    [(torch.float64, 1e-13, 1e-14), (torch.float32, 2e-6, 2e-6)],
    ids=["float64", "float32"],
)
def test_gamma_family(dtype: torch.dtype, rtol: float, atol: float) -> None:
    """float64 was ~1e-10 off (digamma's series stopped at y^-10 from y = 6.5) and 1e-3 next to the poles (tan of
    pi x in float32); polygamma wrong below -8 (a recurrence to x + 16); lgamma 2e-6 relative next to 1 and 2."""
    check_values(Call(_gamma_family), (_gamma_arguments(dtype),), rtol, atol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_lgamma_near_its_zeros_at_one_and_two(dtype: torch.dtype) -> None:
    """Relative accuracy where lgamma is small (Lanczos' sum alone is ~1e-15 absolute: 1e-7 relative at 1 + 1e-8)."""
    offsets = torch.logspace(-12, -0.7, 40, dtype=torch.float64)
    x = torch.cat([1 + offsets, 1 - offsets, 2 + offsets, 2 - offsets, torch.tensor([1.0, 2.0], dtype=torch.float64)])
    rtol = 1e-13 if dtype == torch.float64 else 4e-6
    check_values(Call(torch.lgamma), (x.to(dtype),), rtol, 0.0)


def _probabilities(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(erfinv's arguments in [-1, 1] with both ends and tiny ones, ndtri's in [0, 1] down to 1e-300), each with
    +-0, the ends, outside values and NaN."""
    generator = torch.Generator().manual_seed(0)
    near_one = 1 - torch.logspace(-16, -1, 46, dtype=torch.float64)
    small = torch.logspace(-300, -1, 47, dtype=torch.float64)
    ends = torch.tensor([0.0, -0.0, 1.0, -1.0, 1.5, -1.5, NAN], dtype=torch.float64)
    v = torch.cat([torch.linspace(-1, 1, 801, dtype=torch.float64)[1:-1], near_one, -near_one, small, -small, ends])
    uniform = torch.rand(400, generator=generator, dtype=torch.float64)
    p = torch.cat([uniform, small, near_one, torch.tensor([0.0, 1.0, 0.5, -0.5, 1.5, NAN], dtype=torch.float64)])
    return v.to(dtype), p.to(dtype)


@pytest.mark.parametrize(
    ("dtype", "rtol"),
    [(torch.float64, 1e-14), (torch.float32, 1e-6)],  # measured: 4 ulps of eager in both
    ids=["float64", "float32"],
)
def test_erfinv_and_ndtri(dtype: torch.dtype, rtol: float) -> None:
    """float64 was Giles' float32 approximation (6e-8); ndtri was sqrt(2) erfinv(2p - 1), -inf below p = 1e-16
    (3e-8 in float32); erfinv(+-1) was -+inf. Now ndtri follows eager's Cephes ndtri, and float64 erfinv too."""
    v, p = _probabilities(dtype)
    model = Call(lambda a, b: (torch.erfinv(a), torch.special.erfinv(a), torch.special.ndtri(b)))
    check_values(model, (v, p), rtol, 0.0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float16, torch.bfloat16], ids=str)
def test_gamma_family_and_erfinv_of_other_dtypes(dtype: torch.dtype) -> None:
    """Integers and bool compute in float32 as eager (not through float16, the cheapest lossless cast);
    float16/bfloat16 in float32, rounded once."""
    if dtype.is_floating_point:
        x = torch.tensor([-2.5, -0.5, 0.0, 0.25, 1.0, 1.5, 3.5, 12.0, 40.0, INF, NAN]).to(dtype)
        v = torch.tensor([-1.0, -0.999, -0.3, 0.0, 0.5, 0.9999, 1.0]).to(dtype)
        tolerance = torch.finfo(dtype).eps * 2
    else:
        x = torch.tensor([-3, -1, 0, 1, 2, 3, 7, 100]).to(dtype)
        v = torch.tensor([-1, 0, 1, 1, 0, 0, 1, -1]).to(dtype)
        tolerance = 2e-6

    def functions(t: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
        results = (torch.lgamma(t), torch.digamma(t), torch.polygamma(1, t), torch.erfinv(u))
        return results if dtype.is_floating_point else (*results, torch.special.ndtri(u))  # no f16/bf16 ndtri

    check_values(Call(functions), (x, v), tolerance, tolerance)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_log_ndtr_tails(dtype: torch.dtype) -> None:
    """The upper tail, log1p(-erfc(t) / 2): erfc(t) = erfcx(t) exp(-t^2) had the rounding of t^2 in it (7e-14 at
    t = 25), and -0 where erfc underflows came out +0."""
    x = torch.cat([torch.linspace(-40, 40, 801, dtype=torch.float64), torch.tensor([0.0, -0.0, 60.0, INF, -INF, NAN])])
    tiny = torch.finfo(dtype).tiny
    rtol = 1e-14 if dtype == torch.float64 else 1e-6
    check_values(Call(torch.special.log_ndtr), (x.to(dtype),), rtol, tiny)


def test_zeta_far_below_zero() -> None:
    """q below -38 (eager sums q + k up to 9): the direct sum continues in an ONNX Loop; the first term in the
    input's type for float32, as eager's pow."""
    q = torch.tensor([-100.3, -1000.7, -38.5, -39.5, -2.5, 0.5, 3.0, 1e3], dtype=torch.float64)
    x = torch.tensor([3.0, 4.0, 2.0, 5.0, 3.0, 1.5, 7.0, 2.0], dtype=torch.float64)
    model = Call(lambda a, b: (torch.special.zeta(a, b), torch.special.zeta(a.float(), b.float())))
    check_values(model, (x, q), 1e-13, 0.0)


# Seed 10000907 (tests/fuzzing.py's wide catalogue): eager's gcd takes |a| (|min| wraps to min) and C++'s truncated
# %; ONNX's default Mod is floored, so gcd(int64 min, 1) was -1 (eager 1) and gcd(6, min) 2 (eager -2).
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_gcd_and_lcm_at_the_integer_minimum(dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    low = info.min
    a = torch.tensor([low, 1, low, low, 6, 4, low, 0, info.max, info.max, 12], dtype=dtype)
    b = torch.tensor([1, low, low, 0, low, low, 2, low, low, info.max - 1, 18], dtype=dtype)
    assert_exports_and_matches(Call(torch.gcd), (a, b))
    assert_exports_and_matches(Call(torch.lcm), (a, b))
