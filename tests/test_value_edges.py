"""Value edges of selections, normalizations and casts, in every dtype that takes them, against eager in a default
ONNX Runtime session: NaN and ties in argmax/max.dim/sort/cummax (eager: NaN is the largest, ties give the first
index, a stable sort keeps their order), rows all -inf or holding +inf in softmax/log_softmax/logsumexp, float to
integer casts of in-range values next to the integer type's bounds (truncation toward zero), clamp at the integer
extremes, nan_to_num, where/masked_fill with NaN. The fuzzer draws them from tests/fuzzing.py's EDGE_FIRST_SEED on.

Out of range (NaN, +-inf, beyond the integer type) a float to integer cast is undefined in C++: eager's result is
the platform's (x86: the integer minimum for int32/int64, the low bits of that for narrower types); ONNX Runtime's
Cast on this machine gives the same, which no test pins.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import Call

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
NAN, INF = math.nan, math.inf

# Rows: NaN among numbers, ties, all NaN, -inf ties, +inf beside NaN, all equal.
SELECTION_ROWS = [
    [1.0, NAN, 3.0, NAN],
    [2.0, 2.0, 1.0, 2.0],
    [NAN, NAN, NAN, NAN],
    [-INF, -INF, 0.0, 0.0],
    [INF, NAN, INF, -INF],
    [0.5, 0.5, 0.5, 0.5],
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("function", [torch.max, torch.min], ids=["max", "min"])
def test_max_and_min_of_every_element_are_nan_where_one_is(check, function, dtype: torch.dtype) -> None:
    """torch.max(x)/torch.min(x) (aten.max.default): NaN when any element is, as amax and max.dim are (ONNX
    Runtime's ReduceMax skips NaN: torch.max of [1, nan, 3] was 3)."""
    for values in ([1.0, NAN, 3.0, -1.0], [NAN, NAN], [-INF, INF, 0.0], [2.0, -0.0, 2.0]):
        check(Call(function), (torch.tensor(values, dtype=dtype),))
    check(Call(function), (torch.tensor(SELECTION_ROWS, dtype=dtype),))


@pytest.mark.parametrize("dtype", [*INT_DTYPES, torch.bool], ids=str)
def test_max_and_min_of_every_element_of_integers_and_bool(check, dtype: torch.dtype) -> None:
    if dtype == torch.bool:
        x = torch.tensor([[False, True], [False, False]])
    else:
        info = torch.iinfo(dtype)
        x = torch.tensor([[info.min, 0, info.max], [1, info.max - 1, info.min + 1]], dtype=dtype)
    check(Call(lambda x: (torch.max(x), torch.min(x), torch.max(x[0, 0]))), (x,))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_heaviside_of_nan_is_zero(check, dtype: torch.dtype) -> None:
    """eager computes x == 0 ? values : x > 0: NaN gives 0 (torchlib's Where(x < 0, 0, 1) gave 1)."""
    x = torch.tensor([NAN, -INF, INF, -0.0, 0.0, -2.0, 3.0, NAN], dtype=dtype)
    values = torch.tensor([0.5, 0.5, 0.5, NAN, 7.0, 0.5, 0.5, -1.0], dtype=dtype)
    check(Call(torch.heaviside), (x, values))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8], ids=str)
def test_heaviside_of_integers(check, dtype: torch.dtype) -> None:
    x = torch.tensor([0, 1, 2, 0, 100], dtype=dtype)
    check(Call(torch.heaviside), (x, torch.tensor([5, 5, 5, 9, 5], dtype=dtype)))


def _selections(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The selections whose indices eager defines on NaN and ties (topk/kthvalue/unstable sort leave the order of
    ties to the implementation: their values only; mode's std::sort of a row holding NaN is undefined: eager's mode
    of [inf, nan, inf, -inf] is -inf)."""
    stable = torch.sort(x, dim=1, stable=True)
    descending = torch.sort(x, dim=1, descending=True, stable=True)
    return (
        torch.argmax(x, 1),
        torch.argmin(x, 0, keepdim=True),
        torch.argmax(x),
        *torch.max(x, 1),
        *torch.min(x, 1),
        *stable,
        *descending,
        torch.argsort(x, dim=0, stable=True),
        torch.msort(x),
        *torch.cummax(x, 1),
        *torch.cummin(x, 1),
        torch.topk(x, 2, 1).values,
        torch.topk(x, 3, 1, largest=False).values,
        torch.kthvalue(x, 2, 1).values,
        torch.amax(x, 1),
        torch.aminmax(x, dim=1).min,
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_selections_with_nan_and_ties(check, dtype: torch.dtype) -> None:
    check(Call(_selections), (torch.tensor(SELECTION_ROWS, dtype=dtype),))


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_selections_with_ties_at_the_integer_extremes(check, dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    rows = [[1, 3, 3, 0], [2, 2, 2, 2], [info.max, info.min, info.max, info.min], [info.min, info.min, 0, 1]]
    x = torch.tensor(rows, dtype=torch.int64).clamp(info.min, info.max).to(dtype)
    check(Call(lambda x: (*_selections(x), torch.mode(x, 1).values)), (x,))


def _normalizations(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (
        torch.softmax(x, 1),
        torch.log_softmax(x, 1),
        torch.softmax(x, 1, dtype=torch.float32),
        torch.softmax(x, 0),
        torch.logsumexp(x, 1),
        torch.logsumexp(x, 0, keepdim=True),
        torch.logcumsumexp(x, 1),
        torch.nn.functional.softmin(x, 1),
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_softmax_and_logsumexp_of_infinite_rows(check, dtype: torch.dtype) -> None:
    """A row all -inf: softmax NaN, logsumexp -inf; +inf in a row: NaN where eager's exp(inf - inf) is."""
    rows = [[-INF, -INF, -INF], [1.0, INF, 2.0], [INF, INF, 0.0], [-INF, 0.0, 1.0], [NAN, 0.0, 1.0], [-INF, INF, 0.0]]
    check(Call(_normalizations), (torch.tensor(rows, dtype=dtype),))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_masked_rows_and_nan_fills(check, dtype: torch.dtype) -> None:
    x = torch.tensor([[1.0, -2.0, 0.5], [NAN, 3.0, -INF], [0.0, -0.0, INF]], dtype=dtype)
    mask = torch.tensor([[True, True, True], [False, True, False], [True, False, False]])

    def fills(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.softmax(x.masked_fill(mask, -INF), -1),
            torch.log_softmax(x.masked_fill(mask, -INF), -1),
            x.masked_fill(mask, NAN),
            torch.where(mask, x, NAN),
            torch.where(x > 0, x, x.flip(0)),
            torch.nan_to_num(x),
            torch.nan_to_num(x, nan=1.0, posinf=-7.0, neginf=7.0),
        )

    check(Call(fills), (x, mask))


def _in_range_edges(source: torch.dtype, target: torch.dtype) -> list[float]:
    """Values of `source` next to `target`'s bounds (and around 0) that truncate into `target`'s range."""
    info = torch.iinfo(target)
    wanted = [info.min, info.min + 0.5, info.min + 1, -1.5, -0.75, -0.0, 0.0, 0.75, 1.5, info.max - 1]
    wanted += [info.max - 0.5, info.max, info.max + 0.5, info.max + 0.99, info.min - 0.5, info.min - 0.99]
    kept = []
    for value in wanted:
        rounded = float(torch.tensor(value, dtype=torch.float64).to(source))
        if info.min - 1 < rounded < info.max + 1:
            kept.append(rounded)
    for bound in (info.max, info.min):  # the source dtype's largest values below the bound in magnitude
        below = torch.tensor(float(bound), dtype=torch.float64).to(source).float()
        for _ in range(3):
            if info.min - 1 < float(below) < info.max + 1:
                kept.append(float(below))
            below = torch.nextafter(below, torch.tensor(0.0)).to(source).float()
    return sorted(set(kept))


@pytest.mark.parametrize("target", INT_DTYPES, ids=str)
@pytest.mark.parametrize("source", FLOAT_DTYPES, ids=str)
def test_float_to_integer_casts_truncate_near_the_bounds(check, source: torch.dtype, target: torch.dtype) -> None:
    x = torch.tensor(_in_range_edges(source, target), dtype=source)
    check(Call(lambda x: (x.to(target), x.to(torch.bool), x.trunc().to(target))), (x,))


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_clamp_at_the_integer_extremes(check, dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    x = torch.tensor([info.min, info.min + 1, 0, 1, info.max - 1, info.max], dtype=dtype)

    def clamps(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.clamp_min(x, info.min),
            torch.clamp_max(x, info.max),
            torch.clamp(x, info.min + 1, info.max - 1),
            torch.clamp(x, max=info.min),
            torch.clamp(x, min=info.max),
            torch.clamp_min(x, 0.5),
            torch.clamp_max(x, -0.5),
            torch.clamp(x, x.flip(0)),
            torch.nan_to_num(x),
        )

    check(Call(clamps), (x,))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_one_sided_clamp_keeps_infinities(check, dtype: torch.dtype) -> None:
    """clamp_min/clamp_max leave +-inf on their open side, and F.normalize (x / clamp_min(norm, eps)) of a row
    holding -inf is NaN: ONNX's Clip without its other bound clipped to the dtype's largest value (3.4e38: -inf
    where eager gives NaN; fuzz seed 40000119)."""
    x = torch.tensor([[-INF, 1.0], [INF, 2.0], [NAN, 0.5], [0.0, -0.0]], dtype=dtype)

    def clamps(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.clamp_min(x, 1e-12),
            torch.clamp_max(x, 0.5),
            x.clamp_min(-1.5).clamp_max(NAN),
            torch.nn.functional.normalize(x, p=1, dim=0),
            torch.nn.functional.normalize(x, dim=1),
        )

    check(Call(clamps), (x,))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_norm_of_one_element_is_its_magnitude(check, dtype: torch.dtype) -> None:
    """A vector norm over one element is |x| in eager (x != 0 for ord 0), with no power that overflows: the 2-norm
    of the float32 maximum alone is itself, F.normalize of it -1 (was sqrt(inf) and -0; fuzz seed 40100107)."""
    big = torch.finfo(dtype).max
    x = torch.tensor([[-big, 2.0, 0.0, NAN, -INF]], dtype=dtype)

    def norms(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        vector_norm = torch.linalg.vector_norm
        ords = (vector_norm(x, order, dim=0) for order in (0, 1, 2, 3, 0.5, INF, -INF, -1))
        return (*ords, vector_norm(x, 2, dim=-2, keepdim=True), vector_norm(x[:, :1]), x.norm(dim=0))

    check(Call(norms), (x,))
    check(Call(lambda x: torch.nn.functional.normalize(x, dim=0)), (x,))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_xlogy_is_nan_where_y_is_before_x_is_zero(check, dtype: torch.dtype) -> None:
    """xlogy(0, nan) is NaN in eager (NaN y first, then 0 for x == 0): torchlib's gave 0 (fuzz seed 40100413)."""
    x = torch.tensor([0.0, 0.0, 0.0, 1.0, 2.0, NAN, -0.0], dtype=dtype)
    y = torch.tensor([NAN, 0.0, INF, NAN, 0.0, 1.0, -1.0], dtype=dtype)
    check(Call(lambda x, y: (torch.xlogy(x, y), torch.xlogy(x.to(torch.int64), y))), (x.nan_to_num(), y))
    check(Call(torch.xlogy), (x, y))


# A number whose square overflows where eager computes the dtype (float16: in float32, where 6e4 squared does not).
BIG = {torch.float32: 1e30, torch.bfloat16: 1e30, torch.float64: 1e300, torch.float16: 6e4}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_addcdiv_and_addcmul_overflow_in_eagers_order(check, dtype: torch.dtype) -> None:
    """addcdiv(x, y, z, value=v) is x + (v * y) / z in eager (float16/bfloat16 in float32): 1e30 * 1e30 / 1e30
    overflows to inf, where torchlib's v * (y / z) gave 1e30; addcmul likewise ((v * y) * z)."""
    big = BIG[dtype]
    x = torch.tensor([0.0, 1.0, -INF, NAN], dtype=dtype)
    y = torch.tensor([big, 2.0, 1.0, 1.0], dtype=dtype)
    z = torch.tensor([big, 0.5, 3.0, 0.0], dtype=dtype)
    small = torch.tensor([1 / big, 1.0, 1.0, 1.0], dtype=dtype)

    def both(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, small: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.addcdiv(x, y, z, value=big), torch.addcmul(x, y, small, value=big), torch.addcdiv(x, y, z)

    check(Call(both), (x, y, z, small))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_attention_with_a_float_mask_that_blocks_a_whole_row(check, dtype: torch.dtype) -> None:
    """An additive mask whose row is all -inf gives that query zeros, as eager's SDPA (its _safe_softmax), and
    as a boolean mask's all-False row already did (Softmax of a row of -inf only was NaN)."""
    query = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [0.5, -0.5]]]], dtype=dtype)
    key, value = query.flip(2), query * 2
    allowed = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    mask = torch.zeros(3, 3, dtype=dtype).masked_fill(~allowed, -INF)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return sdpa(q, k, v, attn_mask=m), sdpa(q[0], k[0], v[0], attn_mask=m, scale=0.5)

    check(Call(attend), (query, key, value, mask))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_multihead_attention_with_every_key_padded(check, dtype: torch.dtype) -> None:
    """The padding mask reaches SDPA as an additive float mask: a query with every key padded gives zeros, as
    eager's SDPA path. (Eager's fast path, taken without autograd for self-attention, gives NaN there: the exported
    graph holds the SDPA path, so the test attends to a second tensor, where eager takes that path too.)"""
    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(4, 2, batch_first=True).to(dtype).eval()
    x, memory = torch.randn(2, 3, 4).to(dtype), torch.randn(2, 3, 4).to(dtype)
    padding = torch.tensor([[True, True, True], [False, True, False]])

    def attend(x: torch.Tensor, memory: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        return attention(x, memory, memory, key_padding_mask=padding, need_weights=False)[0]

    check(Call(attend), (x, memory, padding))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_cross_entropy_of_rows_holding_nan_or_inf(check, dtype: torch.dtype) -> None:
    """A row holding NaN or +inf (or only -inf) gives NaN as eager's log_softmax does (float64's LogSoftmax in ONNX
    Runtime skipped the NaN: -46.05 for [nan, 0, 1], inf for [inf, 0, 1])."""
    logits = torch.tensor([[1.0, -INF, 2.0], [-INF, -INF, 0.0], [INF, 0.0, 1.0], [NAN, 0.0, 1.0]], dtype=dtype)
    target = torch.tensor([0, 2, 1, 2])
    probabilities = torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.0, 1.0], [0.2, 0.3, 0.5], [0.0, 1.0, 0.0]], dtype=dtype)
    cross_entropy = torch.nn.functional.cross_entropy

    def losses(x: torch.Tensor, t: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            cross_entropy(x, t, reduction="none"),
            cross_entropy(x, t, reduction="none", label_smoothing=0.1),
            cross_entropy(x[:2], t[:2]),
            cross_entropy(x, p, reduction="none"),
        )

    check(Call(losses), (logits, target, probabilities))


class _LogSumExpOfBuffer(torch.nn.Module):
    """logsumexp of a constant (a buffer: folded at export) and of the input, both with rows of -inf only."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        rows = [[-INF, -INF, -INF], [0.0, -INF, 1.0], [INF, -INF, 0.0], [NAN, -INF, -INF]]
        self.register_buffer("table", torch.tensor(rows, dtype=dtype))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.logsumexp(self.table, -1),
            torch.logsumexp(self.table, 0, keepdim=True),
            torch.logsumexp(x, -1) + torch.logsumexp(self.table, (0, 1)),
            torch.logsumexp(x, (0, 1), keepdim=True),
        )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_logsumexp_of_rows_of_minus_inf_folded_or_not(check, dtype: torch.dtype) -> None:
    """-inf for a row of -inf only, in the model and where the export folds it (ONNX's reference ReduceLogSumExp,
    which constant folding evaluates, subtracts the row's max: NaN; found by fuzz seed 30000472)."""
    x = torch.tensor([[-INF, -INF], [1.0, -INF], [0.5, 0.25]], dtype=dtype)
    check(_LogSumExpOfBuffer(dtype), (x,))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_log_of_sigmoid_in_its_tail(check, dtype: torch.dtype) -> None:
    """log(sigmoid(x)) is x far below 0, as eager's: sigmoid is 1 / (1 + exp(-x)) (elementwise.py). ONNX Runtime's
    float32 Sigmoid (MLAS's logistic), which the float16/bfloat16 ones compute through, is 17% high at -15, twice
    eager's at -17 and 0 from -18 down (eager: 1.5e-8 at -18, 1.8e-35 at -80): log gave -inf for -20."""
    x = torch.tensor([-15.0, -17.0, -20.0, -30.0, -80.0, 0.0, 5.0], dtype=dtype)
    check(Call(lambda x: torch.log(torch.sigmoid(x))), (x,))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_attention_keeps_nan_of_a_query_beside_a_blocked_row(check, dtype: torch.dtype) -> None:
    """A query holding NaN gives NaN with a boolean mask too, as eager (the boolean path zeroed every NaN weight,
    hiding it as 0); its blocked row still gives zeros."""
    query = torch.tensor([[[[1.0, NAN], [0.0, 1.0], [0.5, -0.5]]]], dtype=dtype)
    key = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [0.5, -0.5]]]], dtype=dtype)
    allowed = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    additive = torch.zeros(3, 3, dtype=dtype).masked_fill(~allowed, -INF)

    def attend(
        q: torch.Tensor, k: torch.Tensor, boolean: torch.Tensor, additive: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return sdpa(q, k, k * 2, attn_mask=boolean), sdpa(q, k, k * 2, attn_mask=additive)

    check(Call(attend), (query, key, allowed, additive))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_infinity_norms_are_nan_where_a_nan_is(check, dtype: torch.dtype) -> None:
    """vector_norm/norm/dist/cdist with ord +-inf: NaN for a slice holding NaN, as eager's amax/amin of |x|
    (ONNX Runtime's ReduceMax/ReduceMin skipped it: inf for [inf, nan, -inf], 1 for [1, nan])."""
    x = torch.tensor([[-0.0, 0.0, -0.0], [1.0, NAN, 0.5], [INF, NAN, -INF], [1.0, -INF, 2.0]], dtype=dtype)

    def norms(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        vector_norm = torch.linalg.vector_norm
        return (
            vector_norm(x, ord=INF, dim=1),
            vector_norm(x, ord=-INF, dim=1, keepdim=True),
            vector_norm(x, ord=INF),
            torch.dist(x[0], x[1], p=INF),
            torch.norm(x[1:2], p=INF),
        )

    check(Call(norms), (x,))
