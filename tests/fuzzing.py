"""A random-program fuzzer: chains of 2-8 torch ops over all ten dtypes, compared with eager in ONNX Runtime.

A program is drawn from a seed: one to three inputs (any of the ten dtypes; shapes with 0-d, size-1 and empty
dims), then 2-8 steps, each an op of the catalogue below applied to earlier values (and Python scalars). A step
is kept only if eager runs it, so every program is valid. Its outputs are the values no later step consumes.

The program is exported with fx2onnx, checked, run in a default ONNX Runtime session (all graph optimizations
on) and compared with eager: exact for integers and bool, the project's tolerance for floats, NaN positions
equal. A finding is classified (silent mismatch, export error on a valid program, unloadable model, run error)
and shrunk (steps dropped, input dims sliced) while it still fails the same way. Positions where eager disagrees
with itself (its vectorized and scalar loops give different values: each elementwise step recomputed one element
at a time) are not compared; a program that passes only thanks to that is counted ok, and the summary lists it
with the number of positions left out.

Float values that went through an inexact op (exp, division, a mean...) are not fed to ops whose result jumps
at a rounding boundary (floor, comparisons, casts to integers, remainder): a last-bit difference there is not a
defect. Inputs are small exact numbers, with NaN, +-inf, -0.0 and the dtype's extremes now and then.

Seeds from WIDE_FIRST_SEED (10,000,000) on draw from a wider catalogue (scatter/index updates, shifts, scans,
padding, resampling, convolution, pooling, normalization, searching, data-dependent sizes...) and feed subnormals
too: ``--seed 10000000``. Seeds from WIDER_FIRST_SEED (20,000,000) add rounding modes, nan_to_num's values, clamp
with NaN bounds, var/std corrections and embedding_bag; seeds from EDGE_FIRST_SEED (30,000,000) add value edges: NaN
and ties in selections, rows made all -inf before softmax/logsumexp, float to integer casts next to the integer
type's bounds, clamp at the integer extremes (``--seed 30000000``); seeds from CORNER_FIRST_SEED (40,000,000) add
ops users hit at their corner values: remainder/fmod/floor division by +-0, +-inf and NaN, clamp with min > max,
addcdiv/lerp extremes, wrapping integer powers, a number's powers, signbit, vector norms, normalize, scans with a
dtype, the piecewise and smooth activations, with NaN and +-inf injected before the selections (``--seed 40000000``);
seeds from DATA_FIRST_SEED (50,000,000) add indexing with negative and boundary indices, data movement, reductions with
a dtype over empty and size-1 dims, casts of anything (positions hanging on an undefined float-to-integer cast are
not compared), integer arithmetic with numbers beyond the dtype, promotion against 0-d tensors and scalars, ties and
NaN before sorts and scans (``--seed 50000000``); seeds from LIMITS_FIRST_SEED (60,000,000) add arithmetic at the
dtypes' limits: wrapping integer arithmetic, division and remainder by negative numbers and -1, shifts by the bit width,
float16/bfloat16 reductions over long rows, signed zeros seen through 1 / x, NaN met by comparisons, clamps and
isclose, rounding of halves and huge values, scatter_reduce/index_reduce in every mode, in-place writes through views,
where/masked_fill with 0-d tensors (``--seed 60000000``).

Run ``python -m tests.fuzzing --programs 2000 --seed 0`` for counts per class and cause, with each finding's
seed and minimized program. ``--jobs N`` judges in N worker processes (a program depends on its seed only, so the
results do not depend on N), ``--jsonl PATH`` writes every finding as it arrives (seed, kind, cause, minimized
program, detail), ``--summarize PATH...`` groups such files' findings by cause, ``--seeds-from PATH...`` reruns
their seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import math
import multiprocessing
import random
import re
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool]

OK, MISMATCH, EXPORT_ERROR, UNLOADABLE, RUN_ERROR = "ok", "mismatch", "export error", "unloadable", "run error"
CLASSES = [OK, MISMATCH, EXPORT_ERROR, UNLOADABLE, RUN_ERROR]

# Results larger than this are rejected while drawing (expand/repeat/matmul chains would grow without bound).
MAX_NUMEL = 4096


def literal(value: Any) -> str:
    """Python source for a constant of a program (NaN and infinities included)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "-float('inf')"
        return repr(value)
    if isinstance(value, (list, tuple)):
        items = ", ".join(literal(v) for v in value)
        return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
    return repr(value)


# --- the op catalogue ---------------------------------------------------------------------------------------------
# An op builds the source of one expression from its operands ({0}, {1}, ... stand for them) and random
# parameters drawn from the operands' eager values; None means "not applicable here, draw another".

Builder = Callable[[random.Random, Sequence[torch.Tensor]], str | None]


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    arity: int
    build: Builder
    inexact: bool = False  # may round a float result (its value then feeds no discontinuous op)
    discontinuous: bool = False  # jumps at some float value: needs exact float operands


def _dim(rng: random.Random, x: torch.Tensor) -> int | None:
    if x.dim() == 0:
        return None
    return rng.randrange(-x.dim(), x.dim())


SCALARS: list[Any] = [0, 1, 2, -3, 7, 0.5, -1.5, 2.0, 0.25, 1e-3, True, False, float("inf"), float("nan"), -0.0]


def _scalar(rng: random.Random) -> str:
    return literal(rng.choice(SCALARS))


def fixed(template: str) -> Builder:
    return lambda rng, xs: template


def with_scalar(template: str) -> Builder:
    """`template` with {s}: a Python scalar operand."""
    return lambda rng, xs: template.replace("{s}", _scalar(rng))


def with_dim(template: str) -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
        dim = _dim(rng, xs[0])
        return None if dim is None else template.replace("{d}", str(dim))

    return build


def reduction(function: str, *, dims: bool = True, extra: str = "") -> Builder:
    """torch.<function>(x), or over one or two dims, with keepdim drawn."""

    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
        x = xs[0]
        if not dims or x.dim() == 0 or rng.random() < 0.25:
            return f"torch.{function}({{0}}{extra})"
        count = rng.randint(1, min(2, x.dim()))
        chosen = rng.sample(range(x.dim()), count)
        dim = chosen[0] if count == 1 and rng.random() < 0.5 else tuple(chosen)
        return f"torch.{function}({{0}}, dim={literal(dim)}, keepdim={rng.random() < 0.5}{extra})"

    return build


def one_dim_reduction(function: str, suffix: str = "") -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
        dim = _dim(rng, xs[0])
        if dim is None:
            return f"torch.{function}({{0}}){suffix}" if function in ("argmax", "argmin") else None
        return f"torch.{function}({{0}}, dim={dim}, keepdim={rng.random() < 0.5}){suffix}"

    return build


def cast(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    return f"{{0}}.to({rng.choice(DTYPES)})"


def reshape(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    n = xs[0].numel()
    choices: list[tuple[int, ...]] = [(-1,), (n,), (1, n), (n, 1)]
    divisors = [d for d in range(2, n) if n % d == 0]
    if divisors:
        d = rng.choice(divisors)
        choices += [(d, -1), (-1, d), (d, n // d, 1)]
    if n == 1:
        choices.append(())
    if n == 0:
        choices += [(0, 3), (2, 0, -1) if False else (2, 0)]
    return f"{{0}}.reshape({literal(rng.choice(choices))})"


def transpose(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.dim() < 2:
        return None
    a, b = rng.sample(range(x.dim()), 2)
    return f"{{0}}.transpose({a}, {b})"


def permute(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    order = list(range(xs[0].dim()))
    rng.shuffle(order)
    return f"{{0}}.permute({literal(tuple(order))})"


def squeeze(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    dim = _dim(rng, xs[0])
    if dim is None or rng.random() < 0.3:
        return "{0}.squeeze()"
    return f"{{0}}.squeeze({dim})"  # a dim whose size is not 1 is a no-op in torch


def unsqueeze(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    return f"{{0}}.unsqueeze({rng.randrange(-xs[0].dim() - 1, xs[0].dim() + 1)})"


def flatten(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    x = xs[0]
    if x.dim() < 2 or rng.random() < 0.4:
        return "torch.flatten({0})"
    start = rng.randrange(0, x.dim() - 1)
    return f"torch.flatten({{0}}, {start}, {rng.randrange(start, x.dim())})"


def expand(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    shape = [rng.choice([s, 3]) if s == 1 else s for s in xs[0].shape]
    if rng.random() < 0.5:
        shape.insert(0, rng.choice([1, 2]))
    return f"{{0}}.expand({literal(tuple(shape))})"


def slicing(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None:
        return None
    size = x.shape[dim]
    start = rng.randint(-size - 1, size)
    stop = rng.choice([None, rng.randint(-size, size + 2)])
    step = rng.choice([1, 1, 2, 3])
    index = ", ".join([":"] * (dim % x.dim()) + [f"{start}:{'' if stop is None else stop}:{step}"])
    return f"{{0}}[{index}]"


def select(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None or x.shape[dim] == 0:
        return None
    return f"{{0}}.select({dim}, {rng.randrange(-x.shape[dim], x.shape[dim])})"


def index_select(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None or x.shape[dim] == 0:
        return None
    index = [rng.randrange(x.shape[dim]) for _ in range(rng.randint(0, 4))]
    return f"torch.index_select({{0}}, {dim}, torch.tensor({literal(index)}, dtype=torch.int64))"


def advanced_index(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.dim() == 0 or x.shape[0] == 0:
        return None
    index = [rng.randrange(-x.shape[0], x.shape[0]) for _ in range(rng.randint(1, 3))]
    return f"{{0}}[{literal(index)}]"


def joining(function: str) -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
        if function == "stack":
            dim = rng.randrange(-xs[0].dim() - 1, xs[0].dim() + 1)
        else:
            dim = _dim(rng, xs[0]) or 0
        return f"torch.{function}([{{0}}, {{1}}], dim={dim})"

    return build


def topk(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    size = 1 if dim is None else x.shape[dim]
    k = rng.randint(0, size)
    dim_text = "" if dim is None and rng.random() < 0.5 else f", dim={-1 if dim is None else dim}"
    return f"torch.topk({{0}}, {k}{dim_text}, largest={rng.random() < 0.7}).values"


def sort(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    dim = _dim(rng, xs[0])
    return f"torch.sort({{0}}, dim={-1 if dim is None else dim}, descending={rng.random() < 0.5}).values"


def clamp(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    low, high = sorted(rng.sample([-3, -1, 0, 1, 2, 5, 0.5, -0.5], 2))
    form = rng.randrange(3)
    if form == 0:
        return f"torch.clamp({{0}}, min={literal(low)})"
    if form == 1:
        return f"torch.clamp({{0}}, max={literal(high)})"
    return f"torch.clamp({{0}}, {literal(low)}, {literal(high)})"


def repeat(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    counts = [rng.choice([1, 2]) for _ in range(xs[0].dim())] + [rng.choice([1, 2])] * rng.randint(0, 1)
    return f"{{0}}.repeat({literal(tuple(counts))})"


def cumulative(function: str) -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
        dim = _dim(rng, xs[0])
        return f"torch.{function}({{0}}, dim={0 if dim is None else dim})"

    return build


def softmax(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    dim = _dim(rng, xs[0])
    return None if dim is None else f"torch.softmax({{0}}, dim={dim})"


def tril(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    return None if xs[0].dim() < 2 else f"torch.{rng.choice(['tril', 'triu'])}({{0}}, {rng.randint(-1, 1)})"


OPS: list[Op] = [
    # elementwise unary
    Op("neg", 1, fixed("torch.neg({0})")),
    Op("abs", 1, fixed("torch.abs({0})")),
    Op("exp", 1, fixed("torch.exp({0})"), inexact=True),
    Op("log", 1, fixed("torch.log({0})"), inexact=True),
    Op("sqrt", 1, fixed("torch.sqrt({0})"), inexact=True),
    Op("rsqrt", 1, fixed("torch.rsqrt({0})"), inexact=True),
    Op("sin", 1, fixed("torch.sin({0})"), inexact=True),
    Op("cos", 1, fixed("torch.cos({0})"), inexact=True),
    Op("tanh", 1, fixed("torch.tanh({0})"), inexact=True),
    Op("sigmoid", 1, fixed("torch.sigmoid({0})"), inexact=True),
    Op("erf", 1, fixed("torch.erf({0})"), inexact=True),
    Op("log1p", 1, fixed("torch.log1p({0})"), inexact=True),
    Op("expm1", 1, fixed("torch.expm1({0})"), inexact=True),
    Op("reciprocal", 1, fixed("torch.reciprocal({0})"), inexact=True),
    Op("relu", 1, fixed("torch.relu({0})")),
    Op("square", 1, fixed("torch.square({0})")),
    Op("floor", 1, fixed("torch.floor({0})"), discontinuous=True),
    Op("ceil", 1, fixed("torch.ceil({0})"), discontinuous=True),
    Op("round", 1, fixed("torch.round({0})"), discontinuous=True),
    Op("trunc", 1, fixed("torch.trunc({0})"), discontinuous=True),
    Op("sign", 1, fixed("torch.sign({0})"), discontinuous=True),
    Op("logical_not", 1, fixed("torch.logical_not({0})"), discontinuous=True),
    Op("bitwise_not", 1, fixed("torch.bitwise_not({0})")),
    Op("isnan", 1, fixed("torch.isnan({0})")),
    Op("isinf", 1, fixed("torch.isinf({0})")),
    Op("isfinite", 1, fixed("torch.isfinite({0})")),
    Op("nan_to_num", 1, fixed("torch.nan_to_num({0})")),
    Op("cast", 1, cast, discontinuous=True),
    Op("clamp", 1, clamp),
    # elementwise binary, with a tensor or a Python scalar
    Op("add", 2, fixed("{0} + {1}")),
    Op("add_scalar", 1, with_scalar("{0} + {s}")),
    Op("sub", 2, fixed("{0} - {1}")),
    Op("rsub_scalar", 1, with_scalar("{s} - {0}")),
    Op("mul", 2, fixed("{0} * {1}")),
    Op("mul_scalar", 1, with_scalar("{0} * {s}")),
    Op("div", 2, fixed("{0} / {1}"), inexact=True),
    Op("div_scalar", 1, with_scalar("{0} / {s}"), inexact=True),
    Op("floor_divide", 2, fixed("{0} // {1}"), discontinuous=True),
    Op("floor_divide_scalar", 1, with_scalar("{0} // {s}"), discontinuous=True),
    Op("div_trunc", 2, fixed("torch.div({0}, {1}, rounding_mode='trunc')"), discontinuous=True),
    Op("remainder", 2, fixed("{0} % {1}"), discontinuous=True),
    Op("remainder_scalar", 1, with_scalar("{0} % {s}"), discontinuous=True),
    Op("fmod", 2, fixed("torch.fmod({0}, {1})"), discontinuous=True),
    Op("pow", 2, fixed("torch.pow({0}, {1})"), inexact=True),
    Op("pow_scalar", 1, with_scalar("torch.pow({0}, {s})"), inexact=True),
    Op("maximum", 2, fixed("torch.maximum({0}, {1})")),
    Op("minimum", 2, fixed("torch.minimum({0}, {1})")),
    Op("atan2", 2, fixed("torch.atan2({0}, {1})"), inexact=True),
    Op("eq", 2, fixed("{0} == {1}"), discontinuous=True),
    Op("ne_scalar", 1, with_scalar("{0} != {s}"), discontinuous=True),
    Op("lt", 2, fixed("{0} < {1}"), discontinuous=True),
    Op("le_scalar", 1, with_scalar("{0} <= {s}"), discontinuous=True),
    Op("gt", 2, fixed("{0} > {1}"), discontinuous=True),
    Op("ge", 2, fixed("{0} >= {1}"), discontinuous=True),
    Op("logical_and", 2, fixed("torch.logical_and({0}, {1})"), discontinuous=True),
    Op("logical_or", 2, fixed("torch.logical_or({0}, {1})"), discontinuous=True),
    Op("bitwise_and", 2, fixed("{0} & {1}")),
    Op("bitwise_or", 2, fixed("{0} | {1}")),
    Op("bitwise_xor", 2, fixed("{0} ^ {1}")),
    Op("where", 3, fixed("torch.where({0}.bool(), {1}, {2})"), discontinuous=True),
    Op("where_scalar", 2, with_scalar("torch.where({0}.bool(), {1}, {s})"), discontinuous=True),
    Op("masked_fill", 2, with_scalar("{0}.masked_fill({1}.bool(), {s})"), discontinuous=True),
    # reductions
    Op("sum", 1, reduction("sum")),
    Op("mean", 1, reduction("mean"), inexact=True),
    Op("prod", 1, one_dim_reduction("prod")),
    Op("amax", 1, reduction("amax")),
    Op("amin", 1, reduction("amin")),
    Op("max_dim", 1, one_dim_reduction("max", ".values")),
    Op("min_dim", 1, one_dim_reduction("min", ".values")),
    Op("argmax", 1, one_dim_reduction("argmax"), discontinuous=True),
    Op("argmin", 1, one_dim_reduction("argmin"), discontinuous=True),
    Op("any", 1, one_dim_reduction("any"), discontinuous=True),
    Op("all", 1, one_dim_reduction("all"), discontinuous=True),
    Op("std", 1, reduction("std"), inexact=True),
    Op("var", 1, reduction("var", extra=", correction=0"), inexact=True),
    Op("logsumexp", 1, with_dim("torch.logsumexp({0}, dim={d})"), inexact=True),
    Op("cumsum", 1, cumulative("cumsum")),
    Op("cumprod", 1, cumulative("cumprod")),
    Op("softmax", 1, softmax, inexact=True),
    # shape ops
    Op("reshape", 1, reshape),
    Op("transpose", 1, transpose),
    Op("permute", 1, permute),
    Op("squeeze", 1, squeeze),
    Op("unsqueeze", 1, unsqueeze),
    Op("flatten", 1, flatten),
    Op("expand", 1, expand),
    Op("slice", 1, slicing),
    Op("select", 1, select),
    Op("index_select", 1, index_select),
    Op("index", 1, advanced_index),
    Op("flip", 1, with_dim("torch.flip({0}, [{d}])")),
    Op("repeat", 1, repeat),
    Op("tril", 1, tril),
    Op("cat", 2, joining("cat")),
    Op("stack", 2, joining("stack")),
    Op("topk", 1, topk),
    Op("sort", 1, sort),
    Op("matmul", 2, fixed("torch.matmul({0}, {1})")),
    Op("contiguous_clone", 1, fixed("{0}.clone()")),
]
OPS_BY_NAME = {op.name: op for op in OPS}
# The catalogue lists the elementwise ops first (up to the reductions): eager may compute one of their elements
# differently in its vectorized loop and in its scalar tail (see eager_disagreements).
ELEMENTWISE = frozenset(op.name for op in OPS[: OPS.index(OPS_BY_NAME["sum"])])


# --- the widened catalogue ----------------------------------------------------------------------------------------
# Op families users' models use beyond the first catalogue: gather/scatter and index updates, shifts and the integer
# and float binary functions, scans, padding, resampling, convolution, pooling, normalization, searching, sorting
# with indices, data-dependent sizes. Seeds from WIDE_FIRST_SEED on draw from OPS + WIDE_OPS (below it a seed keeps
# naming the program the first catalogue gives it, so pinned seeds stay valid). Indices are drawn in range (and,
# where eager's result would depend on the order of writes, without duplicates), so that every step is defined.
WIDE_FIRST_SEED = 10_000_000

F = "torch.nn.functional"
SHIFT_COUNTS = [0, 1, 3, 7, 8, 9, 15, 16, 31, 32, 33, 63, 64, 65, 100, -1, -8]


def _int_list_source(values: torch.Tensor) -> str:
    """An int64 tensor's source (any shape, empty included)."""
    flat = literal([int(v) for v in values.reshape(-1).tolist()])
    return f"torch.tensor({flat}, dtype=torch.int64).reshape({literal(tuple(values.shape))})"


def _generator(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**31))


def _index_shape(rng: random.Random, x: torch.Tensor, dim: int, any_size_along_dim: bool) -> tuple[int, ...]:
    """An index tensor's shape for gather/scatter: no larger than x's in every dim (except along `dim` for gather)."""
    shape = []
    for d, size in enumerate(x.shape):
        if d == dim % x.dim() and any_size_along_dim:
            shape.append(rng.randint(0 if rng.random() < 0.1 else 1, max(1, size) + 1))
        else:
            shape.append(rng.randint(0 if rng.random() < 0.1 else min(1, size), size))
    return tuple(shape)


def _unique_along(rng: random.Random, shape: tuple[int, ...], dim: int, size: int) -> torch.Tensor:
    """Indices in [0, size) of `shape`, distinct along `dim` (shape[dim] <= size): one write per target."""
    full = list(shape)
    full[dim] = size
    keys = torch.rand(full, generator=_generator(rng))
    return keys.argsort(dim=dim).narrow(dim, 0, shape[dim])


def gather(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None or x.shape[dim] == 0:
        return None
    shape = _index_shape(rng, x, dim, any_size_along_dim=True)
    index = torch.randint(0, x.shape[dim], shape, generator=_generator(rng))
    return f"torch.gather({{0}}, {dim}, {_int_list_source(index)})"


def scatter(kind: str) -> Builder:
    """scatter (a source tensor or a scalar), scatter_add, scatter_reduce: x's own values as the source."""

    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
        x = xs[0]
        dim = _dim(rng, x)
        if dim is None or x.shape[dim] == 0:
            return None
        shape = _index_shape(rng, x, dim, any_size_along_dim=False)
        if kind == "scatter":
            index = _unique_along(rng, shape, dim % x.dim(), x.shape[dim])
        else:
            index = torch.randint(0, x.shape[dim], shape, generator=_generator(rng))
        source = rng.choice(["{0}", f"{{0}}.flip({dim})"])
        index_text = _int_list_source(index)
        if kind == "scatter":
            if rng.random() < 0.3:
                return f"{{0}}.scatter({dim}, {index_text}, {_scalar(rng)})"
            return f"{{0}}.scatter({dim}, {index_text}, {source})"
        if kind == "scatter_add":
            return f"{{0}}.scatter_add({dim}, {index_text}, {source})"
        reduce = rng.choice(["sum", "prod", "mean", "amax", "amin"])
        include_self = rng.random() < 0.5
        return f"{{0}}.scatter_reduce({dim}, {index_text}, {source}, {reduce!r}, include_self={include_self})"

    return build


def _slice_source(rng: random.Random, x: torch.Tensor, dim: int, count: int) -> str | None:
    """A source for index_add/index_copy: `count` slices of x along dim (its own values)."""
    size = x.shape[dim]
    if count > size:
        return None
    start = rng.randint(0, size - count)
    return f"{{0}}.narrow({dim}, {start}, {count})" + (f".flip({dim})" if rng.random() < 0.5 else "")


def index_update(kind: str) -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
        x = xs[0]
        dim = _dim(rng, x)
        if dim is None or x.shape[dim] == 0:
            return None
        size = x.shape[dim]
        count = rng.randint(0, size)
        if kind == "index_copy":
            index = torch.randperm(size, generator=_generator(rng))[:count]
        else:
            index = torch.randint(0, size, (count,), generator=_generator(rng))
        source = _slice_source(rng, x, dim, count)
        if source is None:
            return None
        if kind == "index_copy":
            return f"{{0}}.index_copy({dim}, {_int_list_source(index)}, {source})"
        # A float alpha on an integer x: eager runs it, torch.export refuses it ("cannot be safely cast").
        alpha = rng.choice([1, 1, 2, -1, 0.5] if x.is_floating_point() else [1, 1, 2, -1])
        return f"{{0}}.index_add({dim}, {_int_list_source(index)}, {source}, alpha={alpha})"

    return build


def index_put(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.dim() == 0 or x.shape[0] == 0:
        return None
    accumulate = rng.random() < 0.5
    count = rng.randint(1, x.shape[0] if not accumulate else 4)
    if accumulate:  # duplicates add up, negative indices count from the end
        index = torch.randint(-x.shape[0], x.shape[0], (count,), generator=_generator(rng))
    else:  # one write per row (which of two writes wins is not defined)
        index = torch.randperm(x.shape[0], generator=_generator(rng))[:count]
        index = torch.where(torch.rand(count, generator=_generator(rng)) < 0.3, index - x.shape[0], index)
    values = rng.choice([f"torch.tensor({_scalar(rng)}).to({{0}}.dtype)", f"{{0}}[:{count}].flip(0)"])
    if count > x.shape[0] and "flip" in values:
        values = "{0}[:1]"
    return f"{{0}}.index_put(({_int_list_source(index)},), {values}, accumulate={accumulate})"


def index_put_mask(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x, mask = xs
    if mask.dim() == 0 or tuple(mask.shape) != tuple(x.shape[: mask.dim()]):
        return None
    return f"{{0}}.index_put(({{1}}.bool(),), torch.tensor({_scalar(rng)}).to({{0}}.dtype))"


def masked_scatter(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    source = rng.choice(["{0}", "{0}.flip(0)" if xs[0].dim() else "{0}", "{0} + {0}"])
    return f"{{0}}.masked_scatter({{1}}.bool(), {source})"


# Eager shifts a bool tensor, torch.export's meta function refuses it ("Expected input tensor to have an integral
# dtype"): no program of the exporter's, so bool operands are not drawn.
def shift(operator: str) -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
        if any(x.dtype == torch.bool for x in xs):
            return None
        return f"{{0}} {operator} " + ("{1}" if len(xs) == 2 else str(rng.choice(SHIFT_COUNTS)))

    return build


def lerp(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    return f"torch.lerp({{0}}, {{1}}, {literal(rng.choice([0.0, 0.25, 0.5, 0.75, 1.0, 2.0, -1.0]))})"


def clamp_tensor(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    form = rng.randrange(3)
    if form == 0:
        return "torch.clamp({0}, min={1})"
    if form == 1:
        return "torch.clamp({0}, max={1})"
    return "torch.clamp({0}, {1}, {2})"


def scan(function: str, suffix: str = "") -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
        dim = _dim(rng, xs[0])
        return f"torch.{function}({{0}}, dim={0 if dim is None else dim}){suffix}"

    return build


def diff(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    dim = _dim(rng, xs[0])
    if dim is None:
        return None
    return f"torch.diff({{0}}, n={rng.choice([1, 1, 2, 3])}, dim={dim})"


def roll(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    x = xs[0]
    if x.dim() == 0 or rng.random() < 0.25:
        return f"torch.roll({{0}}, {rng.randint(-7, 7)})"
    count = rng.randint(1, min(2, x.dim()))
    dims = rng.sample(range(x.dim()), count)
    shifts = [rng.randint(-7, 7) for _ in dims]
    return f"torch.roll({{0}}, {literal(tuple(shifts))}, {literal(tuple(dims))})"


def narrow(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None:
        return None
    size = x.shape[dim]
    start = rng.randint(-size, size) if size else 0
    first = start + size if start < 0 else start
    return f"torch.narrow({{0}}, {dim}, {start}, {rng.randint(0, size - first)})"


def pad(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    mode = rng.choice(["constant", "constant", "reflect", "replicate", "circular"])
    padded_dims = rng.randint(1, min(3, max(1, x.dim() - 1 if mode != "constant" else x.dim())))
    if x.dim() == 0:
        return None
    if mode == "constant":
        amounts = [rng.randint(-2, 3) for _ in range(2 * padded_dims)]
        value = rng.choice([0, 1, -2, 0.5, float("nan"), float("inf"), -0.0])
        return f"{F}.pad({{0}}, {literal(tuple(amounts))}, value={literal(value)})"
    amounts = []
    for size in reversed(x.shape[-padded_dims:]):
        for _ in range(2):
            amounts.append(rng.randint(0, max(0, size - 1) if mode == "reflect" else size + 1))
    return f"{F}.pad({{0}}, {literal(tuple(amounts))}, mode={mode!r})"


def _batched(rng: random.Random, x: torch.Tensor) -> tuple[str, torch.Size]:
    """x as a batch of one channel (a 2-d x as an image, else a signal) when it has too few dims for a
    convolution, a pooling or a resampling: its source and shape."""
    if x.dim() > 2:
        return "{0}", x.shape
    if x.dim() == 2 and rng.random() < 0.5:
        return "{0}[None, None]", torch.Size((1, 1, *x.shape))
    return "{0}.reshape(1, 1, -1)", torch.Size((1, 1, x.numel()))


def interpolate(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    source, shape = _batched(rng, xs[0])
    x = torch.empty(shape)
    spatial = x.dim() - 2
    if spatial not in (1, 2):
        return None
    modes = ["nearest", "nearest-exact"] + (["linear"] if spatial == 1 else ["bilinear", "bicubic"])
    mode = rng.choice(modes)
    if rng.random() < 0.5:
        size = tuple(rng.randint(1, 7) for _ in range(spatial))
        scale = f"size={literal(size)}"
    else:
        scale = f"scale_factor={rng.choice([0.5, 2.0, 1.5, 3.0, 0.75])}"
    corners = f", align_corners={rng.random() < 0.5}" if mode not in ("nearest", "nearest-exact") else ""
    return f"{F}.interpolate({source}, {scale}, mode={mode!r}{corners})"


# Convolution and pooling weights are small non-negative exact numbers: a float sum's order then bounds its rounding
# as in summation_bounds (the magnitudes are the convolution of |x|).
def convolution(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    source, shape = _batched(rng, xs[0])
    x = torch.empty(shape)
    spatial = x.dim() - 2
    if spatial not in (1, 2) or x.shape[1] == 0:
        return None
    channels = x.shape[1]
    groups = rng.choice([g for g in (1, 2, 3) if channels % g == 0])
    out_channels = groups * rng.randint(1, 2)
    kernel = tuple(rng.randint(1, 3) for _ in range(spatial))
    count = out_channels * (channels // groups) * math.prod(kernel)
    weights = [rng.choice([0.0, 0.25, 0.5, 1.0, 2.0]) for _ in range(count)]
    shape = (out_channels, channels // groups, *kernel)
    weight = f"torch.tensor({literal(weights)}, dtype={{0}}.dtype).reshape({literal(shape)})"
    stride = rng.randint(1, 2)
    padding = rng.choice([0, 1, "'same'"]) if stride == 1 else rng.choice([0, 1])
    dilation = rng.randint(1, 2)
    options = f"stride={stride}, padding={padding}, dilation={dilation}, groups={groups}"
    return f"{F}.conv{spatial}d({source}, {weight}, {options})"


def pooling(kind: str) -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
        source, shape = _batched(rng, xs[0])
        x = torch.empty(shape)
        spatial = rng.choice([1, 2])
        if x.dim() not in (spatial + 1, spatial + 2):
            return None
        kernel = rng.randint(1, 3)
        stride = rng.choice([None, 1, 2])
        padding = rng.randint(0, kernel // 2)
        ceil_mode = rng.random() < 0.3
        common = f"{kernel}, stride={stride}, padding={padding}, ceil_mode={ceil_mode}"
        if kind == "avg":
            include = rng.random() < 0.5
            return f"{F}.avg_pool{spatial}d({source}, {common}, count_include_pad={include})"
        dilation = rng.randint(1, 2)
        if kind == "max_indices":
            return f"{F}.max_pool{spatial}d({source}, {common}, dilation={dilation}, return_indices=True)[1]"
        return f"{F}.max_pool{spatial}d({source}, {common}, dilation={dilation})"

    return build


def _affine_source(rng: random.Random, count: int) -> str:
    values = [rng.choice([0.5, 1.0, -1.0, 2.0, 0.25]) for _ in range(count)]
    return f"torch.tensor({literal(values)}, dtype={{0}}.dtype)"


def layer_norm(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.dim() == 0:
        return None
    shape = tuple(x.shape[-rng.randint(1, min(2, x.dim())) :])
    affine = ""
    if rng.random() < 0.6 and math.prod(shape) <= 64:
        weight, bias = _affine_source(rng, math.prod(shape)), _affine_source(rng, math.prod(shape))
        affine = f", {weight}.reshape({literal(shape)}), {bias}.reshape({literal(shape)})"
    return f"{F}.layer_norm({{0}}, {literal(shape)}{affine}, eps={rng.choice([1e-5, 1e-3, 0.0])})"


def group_norm(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.dim() < 2 or x.shape[1] == 0:
        return None
    channels = x.shape[1]
    groups = rng.choice([g for g in range(1, channels + 1) if channels % g == 0])
    affine = ""
    if rng.random() < 0.6:
        affine = f", {_affine_source(rng, channels)}, {_affine_source(rng, channels)}"
    return f"{F}.group_norm({{0}}, {groups}{affine}, eps={rng.choice([1e-5, 1e-3])})"


def batch_norm(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.dim() < 2:
        return None
    channels = x.shape[1]
    mean = [rng.choice([0.0, 0.5, -1.0, 2.0]) for _ in range(channels)]
    variance = [rng.choice([1.0, 0.25, 4.0, 0.0]) for _ in range(channels)]
    statistics = (
        f"torch.tensor({literal(mean)}, dtype={{0}}.dtype), torch.tensor({literal(variance)}, dtype={{0}}.dtype)"
    )
    affine = ""
    if rng.random() < 0.6:
        affine = f", {_affine_source(rng, channels)}, {_affine_source(rng, channels)}"
    return f"{F}.batch_norm({{0}}, {statistics}{affine}, training=False, eps={rng.choice([1e-5, 1e-3])})"


def softmax_family(function: str) -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
        dim = _dim(rng, xs[0])
        if dim is None:
            dim = 0
        dtype = ", dtype=torch.float32" if rng.random() < 0.2 else ""
        return f"torch.{function}({{0}}, dim={dim}{dtype})"

    return build


def _sorted_boundaries(rng: random.Random, x: torch.Tensor) -> list[Any]:
    pool: list[Any] = [-3, -1, 0, 0, 1, 2, 5, 100]
    if x.is_floating_point():
        pool += [-0.5, 0.25, 1.5, float("inf"), -float("inf"), -0.0]
    values = [rng.choice(pool) for _ in range(rng.randint(0, 6))]
    # Sorted in x's dtype (-3 is 253 in uint8): eager's binary search over unsorted boundaries is not defined.
    return torch.tensor(values, dtype=torch.float64).to(x.dtype).sort().values.tolist()


def bucketize(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    boundaries = f"torch.tensor({literal(_sorted_boundaries(rng, xs[0]))}, dtype={{0}}.dtype)"
    right = rng.random() < 0.5
    int32 = ", out_int32=True" if rng.random() < 0.2 else ""
    return f"torch.bucketize({{0}}, {boundaries}, right={right}{int32})"


def searchsorted(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    sequence = f"torch.tensor({literal(_sorted_boundaries(rng, xs[0]))}, dtype={{0}}.dtype)"
    if rng.random() < 0.4 and xs[0].dim() >= 1:  # a sorted N-d sequence: x's own values sorted
        sequence = "torch.sort({0}, dim=-1).values"
    side = rng.choice(["", ", right=True", ", side='left'", ", side='right'"])
    return f"torch.searchsorted({sequence}, {{0}}{side})"


def unique(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    form = rng.randrange(4)
    if form == 0:
        return "torch.unique({0})"
    if form == 1:
        return "torch.unique({0}, return_counts=True)[1]"
    if form == 2:
        return "torch.unique({0}, return_inverse=True)[1]"
    return "torch.unique_consecutive({0})"


def nonzero(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    return rng.choice(["torch.nonzero({0})", "{0}[{0} != 0]", "torch.masked_select({0}, {0} > 0)"])


def argsort(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    dim = _dim(rng, xs[0])
    dim = -1 if dim is None else dim
    descending = rng.random() < 0.5
    if rng.random() < 0.3:
        return f"torch.sort({{0}}, dim={dim}, descending={descending}, stable=True).indices"
    return f"torch.argsort({{0}}, dim={dim}, descending={descending}, stable=True)"


def order_statistic(function: str) -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
        x = xs[0]
        dim = _dim(rng, x)
        if function == "kthvalue":
            size = 1 if dim is None else x.shape[dim]
            if size == 0:
                return None
            dim_text = "" if dim is None else f", dim={dim}"
            return f"torch.kthvalue({{0}}, {rng.randint(1, size)}{dim_text}, keepdim={rng.random() < 0.5}).values"
        if dim is None or (function in ("median", "nanmedian") and rng.random() < 0.3):
            return None if function == "mode" else f"torch.{function}({{0}})"
        return f"torch.{function}({{0}}, dim={dim}, keepdim={rng.random() < 0.5}).values"

    return build


def histc(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    low, high = sorted(rng.sample([-4, -1, 0, 0.5, 1, 3], 2))
    return f"torch.histc({{0}}, bins={rng.randint(1, 6)}, min={low}, max={high})"


def one_hot(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    classes = rng.randint(1, 6)
    return f"{F}.one_hot({{0}}.to(torch.int64).remainder({classes}), {classes})"


def embedding(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    table = xs[1]
    if table.dim() != 2 or table.shape[0] == 0:
        return None
    return f"{F}.embedding({{0}}.to(torch.int64).remainder({table.shape[0]}), {{1}})"


def tril_offset(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    if xs[0].dim() < 2:
        return None
    return f"torch.{rng.choice(['tril', 'triu'])}({{0}}, {rng.randint(-6, 6)})"


def einsum(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    a, b = xs
    shapes = (tuple(a.shape), tuple(b.shape))
    candidates = []
    if a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0]:
        candidates.append("ij,jk->ik")
    if a.dim() == 2 and b.dim() == 2 and a.shape == b.shape:
        candidates += ["ij,ij->i", "ij,ij->ij", "ij,ij->"]
    if a.dim() == 1 and b.dim() == 1:
        candidates.append("i,j->ij")
        if shapes[0] == shapes[1]:
            candidates.append("i,i->")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1]:
        candidates.append("bij,bjk->bik")
    if a.dim() == 2 and b.dim() == 1 and a.shape[1] == b.shape[0]:
        candidates.append("ij,j->i")
    if candidates:
        return f"torch.einsum({rng.choice(candidates)!r}, {{0}}, {{1}})"
    if a.dim() == 2:
        square = a.shape[0] == a.shape[1]
        return f"torch.einsum({rng.choice(['ij->ji', 'ij->j', 'ii->i' if square else 'ij->i'])!r}, {{0}})"
    unary = {3: ["bij->bji", "bij->b"]}
    if a.dim() in unary:
        return f"torch.einsum({rng.choice(unary[a.dim()])!r}, {{0}})"
    return None


WIDE_ELEMENTWISE_OPS: list[Op] = [
    Op("shift_left", 2, shift("<<")),
    Op("shift_right", 2, shift(">>")),
    Op("shift_left_scalar", 1, shift("<<")),
    Op("shift_right_scalar", 1, shift(">>")),
    Op("gcd", 2, fixed("torch.gcd({0}, {1})")),
    Op("lcm", 2, fixed("torch.lcm({0}, {1})")),
    Op("copysign", 2, fixed("torch.copysign({0}, {1})"), discontinuous=True),
    Op("hypot", 2, fixed("torch.hypot({0}, {1})"), inexact=True),
    Op("lerp", 2, lerp, inexact=True),
    Op("lerp_tensor", 3, fixed("torch.lerp({0}, {1}, {2})"), inexact=True),
    Op("logaddexp", 2, fixed("torch.logaddexp({0}, {1})"), inexact=True),
    Op("logaddexp2", 2, fixed("torch.logaddexp2({0}, {1})"), inexact=True),
    Op("float_power", 2, fixed("torch.float_power({0}, {1})"), inexact=True),
    Op("float_power_scalar", 1, with_scalar("torch.float_power({0}, {s})"), inexact=True),
    Op("clamp_tensor", 3, clamp_tensor),
    Op("clamp_tensor_min", 2, fixed("torch.clamp({0}, min={1})")),
]
WIDE_OTHER_OPS: list[Op] = [
    Op("gather", 1, gather),
    Op("scatter", 1, scatter("scatter")),
    Op("scatter_add", 1, scatter("scatter_add")),
    Op("scatter_reduce", 1, scatter("scatter_reduce"), inexact=True),
    Op("index_put", 1, index_put),
    Op("index_put_mask", 2, index_put_mask),
    Op("index_add", 1, index_update("index_add")),
    Op("index_copy", 1, index_update("index_copy")),
    Op("masked_scatter", 2, masked_scatter),
    Op("cummax", 1, scan("cummax", ".values")),
    Op("cummin", 1, scan("cummin", ".values")),
    Op("cummax_indices", 1, scan("cummax", ".indices"), discontinuous=True),
    Op("cummin_indices", 1, scan("cummin", ".indices"), discontinuous=True),
    Op("logcumsumexp", 1, scan("logcumsumexp"), inexact=True),
    Op("diff", 1, diff),
    Op("roll", 1, roll),
    Op("narrow", 1, narrow),
    Op("pad", 1, pad),
    Op("interpolate", 1, interpolate, inexact=True),
    Op("conv", 1, convolution),
    Op("avg_pool", 1, pooling("avg"), inexact=True),
    Op("max_pool", 1, pooling("max")),
    Op("max_pool_indices", 1, pooling("max_indices"), discontinuous=True),
    Op("layer_norm", 1, layer_norm, inexact=True),
    Op("group_norm", 1, group_norm, inexact=True),
    Op("batch_norm", 1, batch_norm, inexact=True),
    Op("softmax_dim", 1, softmax_family("softmax"), inexact=True),
    Op("log_softmax", 1, softmax_family("log_softmax"), inexact=True),
    Op("bucketize", 1, bucketize, discontinuous=True),
    Op("searchsorted", 1, searchsorted, discontinuous=True),
    Op("unique", 1, unique, discontinuous=True),
    Op("nonzero", 1, nonzero, discontinuous=True),
    Op("argsort_stable", 1, argsort, discontinuous=True),
    Op("kthvalue", 1, order_statistic("kthvalue")),
    Op("median", 1, order_statistic("median")),
    Op("nanmedian", 1, order_statistic("nanmedian")),
    Op("mode", 1, order_statistic("mode"), discontinuous=True),
    Op("histc", 1, histc, discontinuous=True),
    Op("one_hot", 1, one_hot, discontinuous=True),
    Op("embedding", 2, embedding, discontinuous=True),
    Op("tril_offset", 1, tril_offset),
    Op("einsum", 2, einsum),
]
WIDE_OPS = WIDE_ELEMENTWISE_OPS + WIDE_OTHER_OPS


# --- the widest catalogue (seeds from WIDER_FIRST_SEED on): ops users hit whose edge cases the others miss --------
# Rounding modes of division at int min / -1 and by zero, round to decimals (half to even), nan_to_num's own values,
# clamp with NaN bounds, var/std with a correction at one element, embedding_bag's modes. Below WIDER_FIRST_SEED a
# seed keeps naming its program.
WIDER_FIRST_SEED = 20_000_000


def embedding_bag(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    table = xs[1]
    if table.dim() != 2 or table.shape[0] == 0 or not table.is_floating_point() or xs[0].numel() == 0:
        return None
    count = xs[0].numel()
    offsets = sorted({0, *(rng.randint(0, count) for _ in range(rng.randint(0, 3)))})
    mode = rng.choice(["sum", "mean", "max"])
    return (
        f"{F}.embedding_bag({{0}}.reshape(-1).to(torch.int64).remainder({table.shape[0]}), {{1}}, "
        f"torch.tensor({literal(offsets)}, dtype=torch.int64), mode={mode!r})"
    )


def std_correction(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    dim = _dim(rng, xs[0])
    function = rng.choice(["var", "std"])
    correction = rng.choice([0, 1, 2])
    where = "" if dim is None else f", dim={dim}, keepdim={rng.random() < 0.5}"
    return f"torch.{function}({{0}}{where}, correction={correction})"


NAN_TO_NUM_VALUES = [0.0, -1.5, 1e30, 3.0, -0.0]


def nan_to_num_values(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    nan, posinf, neginf = (literal(rng.choice(NAN_TO_NUM_VALUES)) for _ in range(3))
    return f"torch.nan_to_num({{0}}, nan={nan}, posinf={posinf}, neginf={neginf})"


WIDER_OPS: list[Op] = [
    Op("div_floor", 2, fixed("torch.div({0}, {1}, rounding_mode='floor')"), discontinuous=True),
    Op("div_floor_scalar", 1, with_scalar("torch.div({0}, {s}, rounding_mode='floor')"), discontinuous=True),
    Op("div_trunc_scalar", 1, with_scalar("torch.div({0}, {s}, rounding_mode='trunc')"), discontinuous=True),
    Op("fmod_scalar", 1, with_scalar("torch.fmod({0}, {s})"), discontinuous=True),
    Op(
        "round_decimals",
        1,
        lambda rng, xs: f"torch.round({{0}}, decimals={rng.choice([-1, 1, 2])})",
        inexact=True,
    ),
    Op(
        "nan_to_num_values",
        1,
        nan_to_num_values,
    ),
    Op(
        "clamp_nan",
        1,
        lambda rng, xs: rng.choice(
            [
                "torch.clamp({0}, min=float('nan'))",
                "torch.clamp({0}, max=float('nan'))",
                "torch.clamp({0}, -1, float('nan'))",
            ]
        ),
    ),
    Op("std_correction", 1, std_correction, inexact=True),
    Op("embedding_bag", 2, embedding_bag, inexact=True),
]
OPS_BY_NAME.update({op.name: op for op in WIDE_OPS + WIDER_OPS})
ELEMENTWISE = ELEMENTWISE | frozenset(op.name for op in WIDE_ELEMENTWISE_OPS)
ELEMENTWISE = ELEMENTWISE | frozenset(
    ["div_floor", "div_floor_scalar", "div_trunc_scalar", "fmod_scalar", "nan_to_num_values", "clamp_nan"]
)
# The share of a wide program's steps drawn from the new families (the first catalogue's ops chain them).
WIDE_SHARE = 0.6
WIDER_SHARE = 0.35


# --- the edge catalogue (seeds from EDGE_FIRST_SEED on): values at the edges of selections, normalizations, casts ----
# NaN and ties in the selections whose result eager defines there (max/min of every element, max.dim/min.dim indices,
# argmax/argmin, stable sorts with indices, aminmax), rows made all -inf (or holding NaN/+-inf) before softmax,
# log_softmax and logsumexp, float to integer casts of in-range values next to the integer type's bounds (truncation
# toward zero; a value out of range, NaN or infinite, is not drawn: eager's result is the platform's), clamp at the
# integer extremes, heaviside/fmax/fmin/nansum/nanmean on NaN. A value-injecting step (masked_fill with a constant
# mask, whole slices sometimes) puts NaN, +-inf or an integer bound's neighbour where later steps meet it. Below
# EDGE_FIRST_SEED a seed keeps naming its program.
EDGE_FIRST_SEED = 30_000_000
EDGE_SHARE = 0.4


def _edge_mask_source(rng: random.Random, x: torch.Tensor) -> str:
    """A constant bool mask of x's shape: scattered positions, and now and then whole slices along a dim."""
    generator = _generator(rng)
    mask = torch.rand(x.shape, generator=generator) < rng.choice([0.2, 0.5])
    dim = _dim(rng, x)
    if dim is not None and x.shape[dim] and rng.random() < 0.6:
        mask.index_fill_(dim, torch.tensor([rng.randrange(x.shape[dim])]), True)
    flat = literal([bool(v) for v in mask.reshape(-1).tolist()])
    return f"torch.tensor({flat}, dtype=torch.bool).reshape({literal(tuple(x.shape))})"


def fill_special(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """NaN or +-inf at masked positions of a float tensor."""
    x = xs[0]
    if not x.is_floating_point() or x.numel() == 0:
        return None
    value = rng.choice([math.nan, math.inf, -math.inf, math.nan])
    return f"{{0}}.masked_fill({_edge_mask_source(rng, x)}, {literal(value)})"


def _integer_edges(source: torch.dtype, target: torch.dtype) -> list[float]:
    """Values exact in `source` that truncate into `target`'s range, next to its bounds."""
    info = torch.iinfo(target)
    wanted = [info.min, info.min + 0.5, info.min + 1, info.max - 1, info.max - 0.5, info.max, info.max + 0.75]
    wanted += [info.min - 0.75, -0.75, 0.75, -1.5]
    kept = []
    for value in wanted:
        rounded = float(torch.tensor(value, dtype=torch.float64).to(source))
        if info.min - 1 < rounded < info.max + 1:
            kept.append(rounded)
    for bound in (info.max, info.min):  # the source dtype's values next to the bound, inside the range
        below = torch.tensor(float(bound), dtype=torch.float64).to(source).double()
        for _ in range(2):
            if info.min - 1 < float(below) < info.max + 1:
                kept.append(float(below))
            below = torch.nextafter(below.to(source).float(), torch.tensor(0.0)).to(source).double()
    return sorted(set(kept))


def fill_integer_edge(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """An integer type's bound (or its neighbour in x's float dtype) at masked positions of a float tensor."""
    x = xs[0]
    if not x.is_floating_point() or x.numel() == 0:
        return None
    value = rng.choice(_integer_edges(x.dtype, rng.choice(INT_DTYPES)))
    return f"{{0}}.masked_fill({_edge_mask_source(rng, x)}, {literal(value)})"


def cast_in_range(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """A float tensor to an integer type every value of which truncates into its range (finite)."""
    x = xs[0]
    if not x.is_floating_point():
        return None
    truncated = x.double().trunc()
    targets = []
    for target in INT_DTYPES:
        info = torch.iinfo(target)
        inside = (truncated >= float(info.min)) & (truncated < float(info.max) + 1)  # 2**63 exact in float64
        if bool((truncated.isfinite() & inside).all()):
            targets.append(target)
    return f"{{0}}.to({rng.choice(targets)})" if targets else None


def masked_normalization(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """softmax/log_softmax/logsumexp of x with masked positions (whole rows now and then) set to -inf."""
    x = xs[0]
    if not x.is_floating_point() or x.dim() == 0:
        return None
    dim = _dim(rng, x)
    filled = f"{{0}}.masked_fill({_edge_mask_source(rng, x)}, -float('inf'))"
    function = rng.choice(["softmax", "log_softmax", "logsumexp"])
    return f"torch.{function}({filled}, dim={dim})"


def max_all(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    return None if xs[0].numel() == 0 else f"torch.{rng.choice(['max', 'min'])}({{0}})"


def extreme_indices(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """max.dim/min.dim indices or argmax/argmin: the first NaN's index, else the first largest's."""
    dim = _dim(rng, xs[0])
    if dim is None or xs[0].shape[dim] == 0:
        return None
    function = rng.choice(["max", "min", "argmax", "argmin"])
    suffix = ".indices" if function in ("max", "min") else ""
    return f"torch.{function}({{0}}, dim={dim}, keepdim={rng.random() < 0.5}){suffix}"


def stable_sort(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    dim = _dim(rng, xs[0])
    dim = -1 if dim is None else dim
    part = rng.choice(["values", "indices"])
    return f"torch.sort({{0}}, dim={dim}, descending={rng.random() < 0.5}, stable=True).{part}"


def aminmax(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    dim = _dim(rng, xs[0])
    part = rng.choice(["min", "max"])
    if dim is None or rng.random() < 0.3:
        return None if xs[0].numel() == 0 else f"torch.aminmax({{0}}).{part}"
    return f"torch.aminmax({{0}}, dim={dim}, keepdim={rng.random() < 0.5}).{part}"


def clamp_integer_extremes(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.is_floating_point() or x.dtype == torch.bool:
        return None
    info = torch.iinfo(x.dtype)
    bounds: list[Any] = [info.min, info.min + 1, info.max - 1, info.max, 0, -1 if info.min < 0 else 1, 0.5, -0.5]
    low, high = rng.choice(bounds), rng.choice(bounds)
    form = rng.randrange(4)
    if form == 0:
        return f"torch.clamp_min({{0}}, {literal(low)})"
    if form == 1:
        return f"torch.clamp_max({{0}}, {literal(high)})"
    if form == 2:
        return f"torch.clamp({{0}}, {literal(low)}, {literal(high)})"
    return f"torch.clamp({{0}}, min={literal(low)}, max={literal(high)})"


def same_dtype(template: str) -> Builder:
    """`template` on two tensors of one dtype (heaviside refuses mixed dtypes)."""
    return lambda rng, xs: template if xs[0].dtype == xs[1].dtype else None


def nan_reduction(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    if not xs[0].is_floating_point():
        return None
    function = rng.choice(["nansum", "nanmean"])
    dim = _dim(rng, xs[0])
    where = "" if dim is None or rng.random() < 0.3 else f", dim={dim}, keepdim={rng.random() < 0.5}"
    return f"torch.{function}({{0}}{where})"


EDGE_OPS: list[Op] = [
    Op("fill_special", 1, fill_special),
    Op("fill_integer_edge", 1, fill_integer_edge),
    Op("cast_in_range", 1, cast_in_range, discontinuous=True),
    Op("masked_normalization", 1, masked_normalization, inexact=True),
    Op("max_all", 1, max_all),
    Op("extreme_indices", 1, extreme_indices, discontinuous=True),
    Op("stable_sort", 1, stable_sort, discontinuous=True),
    Op("aminmax", 1, aminmax),
    Op("clamp_integer_extremes", 1, clamp_integer_extremes),
    Op("heaviside", 2, same_dtype("torch.heaviside({0}, {1})"), discontinuous=True),
    Op("fmax", 2, fixed("torch.fmax({0}, {1})")),
    Op("fmin", 2, fixed("torch.fmin({0}, {1})")),
    Op("nan_reduction", 1, nan_reduction, inexact=True),
]
OPS_BY_NAME.update({op.name: op for op in EDGE_OPS})
# The value-injecting steps and the steps that meet them drawn twice as often as the others.
EDGE_DRAWS = EDGE_OPS + [OPS_BY_NAME[name] for name in ("fill_special", "fill_integer_edge", "masked_normalization")]
EDGE_DRAWS += [OPS_BY_NAME["cast_in_range"]]
ELEMENTWISE = ELEMENTWISE | frozenset(["clamp_integer_extremes", "heaviside", "fmax", "fmin"])


# --- the corner catalogue (seeds from CORNER_FIRST_SEED on): ops users hit, at their corner values ------------------
# Scans with a dtype (float16/bfloat16 accumulation, integers promoted to int64), remainder/fmod/floor division by
# +-0, +-inf and NaN (and of them), clamp with min > max, addcdiv/addcmul/lerp with extreme weights, integer powers
# that wrap, a scalar's powers (0 ** -1, (-0.0) ** -1, 1 ** nan), signbit/isposinf/isneginf (-0.0), frac/xlogy/sinc,
# vector norms of every order, normalize of zero rows, count_nonzero, the piecewise activations (relu6, hardtanh,
# threshold, hardshrink...) and the smooth ones (softplus's threshold, elu, mish, gelu's tanh form) at NaN and
# +-inf. The edge catalogue's value injectors (NaN, +-inf, integer bounds) and the selections that meet NaN (topk,
# sort, argsort, kthvalue, median, scatter_reduce, searchsorted) are drawn with them. Below CORNER_FIRST_SEED a
# seed keeps naming its program.
CORNER_FIRST_SEED = 40_000_000
CORNER_SHARE = 0.45
CORNER_SCALARS: list[Any] = [0.0, -0.0, math.inf, -math.inf, math.nan, -1.5, 2.0, 0, -1, 3]


def scan_dtype(function: str) -> Builder:
    def build(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
        x = xs[0]
        dim = _dim(rng, x)
        dim = 0 if dim is None else dim
        if not x.is_floating_point():  # (integers and bool promote to int64 without a dtype)
            return f"torch.{function}({{0}}, dim={dim})"
        dtype = rng.choice([None, x.dtype, torch.float32, torch.float64])
        return f"torch.{function}({{0}}, dim={dim}" + ("" if dtype is None else f", dtype={dtype}") + ")"

    return build


def special_division(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    """remainder, fmod or floor division of x by a corner scalar, or of a corner scalar by x."""
    function = rng.choice(["torch.remainder", "torch.fmod", "torch.floor_divide"])
    scalar = literal(rng.choice(CORNER_SCALARS))
    if function != "torch.fmod" and rng.random() < 0.4:  # (fmod takes no scalar first)
        return f"{function}(torch.tensor({scalar}, dtype={{0}}.dtype), {{0}})"
    return f"{function}({{0}}, {scalar})"


def clamp_crossed(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    """clamp with min > max: every element is max (eager's min(max(x, min), max)), NaN kept."""
    low, high = sorted(rng.sample([-3, -1, 0, 1, 2, 0.5, -0.5, -0.0], 2))
    if low == high:
        return f"torch.clamp({{0}}, {literal(high)}, {literal(low)})"
    return rng.choice(
        [
            f"torch.clamp({{0}}, {literal(high)}, {literal(low)})",
            f"torch.clamp({{0}}, min={literal(high)}, max={literal(low)})",
        ]
    )


def addc(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    if not all(x.is_floating_point() for x in xs):  # (addcdiv refuses integers; addcmul kept to floats alike)
        return None
    function = rng.choice(["addcdiv", "addcmul"])
    return f"torch.{function}({{0}}, {{1}}, {{2}}, value={literal(rng.choice([1, -0.5, 2.0, 0, 1e30]))})"


def lerp_extreme(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    if not xs[0].is_floating_point():
        return None
    weight = rng.choice([0.0, 1.0, -0.0, 1e30, -1e30, math.inf, math.nan, 0.5])
    return f"torch.lerp({{0}}, {{1}}, {literal(weight)})"


def integer_power(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    if xs[0].is_floating_point() or xs[0].dtype == torch.bool:
        return None
    return f"torch.pow({{0}}, {rng.choice([0, 1, 2, 3, 7, 8, 15, 31, 33, 63, 64])})"


def scalar_power(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    return f"torch.pow({literal(rng.choice([2, -2, 0, 0.5, -0.0, 0.0, 1, -1, math.inf, math.nan, 1.5]))}, {{0}})"


def classify(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    function = rng.choice(["signbit", "isposinf", "isneginf"])
    # A NaN's sign bit is no op's result (x86's 0 / 0 is -nan, sinc(inf) either sign): signbit of NaN is not drawn
    # (seed 40100525). copysign's sign operand (the wide catalogue) has the same noise: seed 21001159, 2 / (0 / -0.0).
    if function == "signbit" and xs[0].is_floating_point() and bool(xs[0].isnan().any()):
        return None
    return f"torch.{function}({{0}})"


def vector_norm(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    if not xs[0].is_floating_point():
        return None
    order = literal(rng.choice([math.inf, -math.inf, 0, 1, 2, 3, 0.5]))
    dim = _dim(rng, xs[0])
    where = "" if dim is None or rng.random() < 0.3 else f", dim={dim}, keepdim={rng.random() < 0.5}"
    return f"torch.linalg.vector_norm({{0}}, {order}{where})"


def normalize(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    dim = _dim(rng, xs[0])
    if dim is None or not xs[0].is_floating_point():
        return None
    return f"{F}.normalize({{0}}, p={literal(rng.choice([1, 2, math.inf]))}, dim={dim})"


def count_nonzero(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    dim = _dim(rng, xs[0])
    return "torch.count_nonzero({0})" if dim is None or rng.random() < 0.3 else f"torch.count_nonzero({{0}}, {dim})"


PIECEWISE_ACTIVATIONS = [
    f"{F}.relu6({{0}})",
    f"{F}.hardtanh({{0}}, -1.5, 2.0)",
    f"{F}.threshold({{0}}, 0.5, -2.0)",
    f"{F}.hardshrink({{0}}, 0.5)",
    f"{F}.softshrink({{0}}, 0.5)",
    f"{F}.leaky_relu({{0}}, 0.25)",
    f"{F}.hardsigmoid({{0}})",
    f"{F}.hardswish({{0}})",
]
SMOOTH_ACTIVATIONS = [
    f"{F}.softplus({{0}}, beta=2.0, threshold=5.0)",
    f"{F}.softplus({{0}})",
    f"{F}.elu({{0}})",
    f"{F}.selu({{0}})",
    f"{F}.celu({{0}}, 0.5)",
    f"{F}.mish({{0}})",
    f"{F}.gelu({{0}}, approximate='tanh')",
    f"{F}.gelu({{0}})",
    f"{F}.logsigmoid({{0}})",
    f"{F}.softsign({{0}})",
    f"{F}.tanhshrink({{0}})",
]


def activation(family: list[str]) -> Builder:
    return lambda rng, xs: rng.choice(family) if xs[0].is_floating_point() else None


CORNER_OPS: list[Op] = [
    Op("cumsum_dtype", 1, scan_dtype("cumsum")),
    Op("cumprod_dtype", 1, scan_dtype("cumprod"), inexact=True),
    Op("special_division", 1, special_division, discontinuous=True),
    Op("clamp_crossed", 1, clamp_crossed),
    Op("addc", 3, addc, inexact=True),
    Op("lerp_extreme", 2, lerp_extreme, inexact=True),
    Op("integer_power", 1, integer_power),
    Op("scalar_power", 1, scalar_power, inexact=True),
    Op("classify", 1, classify, discontinuous=True),  # (signbit of a rounded zero: -1e-16 or +0.0)
    Op("frac", 1, fixed("torch.frac({0})"), discontinuous=True),
    Op("xlogy", 2, fixed("torch.xlogy({0}, {1})"), inexact=True),
    Op("sinc", 1, fixed("torch.sinc({0})"), inexact=True),
    Op("vector_norm", 1, vector_norm, inexact=True),
    Op("normalize", 1, normalize, inexact=True),
    Op("count_nonzero", 1, count_nonzero, discontinuous=True),  # (jumps at 0: sinc(-2.0) is 3.9e-17 or 0)
    Op("piecewise_activation", 1, activation(PIECEWISE_ACTIVATIONS), discontinuous=True),
    Op("smooth_activation", 1, activation(SMOOTH_ACTIVATIONS), inexact=True),
]
OPS_BY_NAME.update({op.name: op for op in CORNER_OPS})
CORNER_MET = ["fill_special", "fill_special", "fill_integer_edge", "topk", "sort", "argsort_stable", "kthvalue"]
CORNER_MET += ["median", "scatter_reduce", "searchsorted", "bucketize", "where_scalar"]
CORNER_DRAWS = CORNER_OPS + [OPS_BY_NAME[name] for name in CORNER_MET]
ELEMENTWISE = ELEMENTWISE | {"special_division", "clamp_crossed", "addc", "lerp_extreme", "integer_power"}
ELEMENTWISE = ELEMENTWISE | {"scalar_power", "classify", "frac", "xlogy", "sinc", "piecewise_activation"}
ELEMENTWISE = ELEMENTWISE | {"smooth_activation"}


# --- the data catalogue (seeds from DATA_FIRST_SEED on): indexing, data movement, dtypes at their corners ----------
# Indexing with negative, boundary and repeated indices (take, take_along_dim, index_select with a 0-d index,
# index_fill, advanced indexing on later and non-adjacent dims, bool masks of other values), data movement (unfold,
# diagonal, roll beyond the size and twice along a dim, flips of several dims, repeat_interleave with counts and
# tensors, movedim, tile), masked_select/nonzero/argwhere, reductions with a dtype and keepdim over empty, size-1 and
# no dims (dim=() reduces every dim), casts of anything to anything (a float's cast to an integer type is undefined
# in C++ where the value is NaN, infinite or out of range: eager's result is its platform's, so the positions that
# hang on such a cast are not compared, see undefined_dependents), bool/int8/uint8/int16 arithmetic with Python
# integers beyond the dtype (eager wraps the number into the dtype first: int8 // 1000 is int8 // -24), type
# promotion against 0-d tensors and Python scalars of every kind, ties made before sorts and scans (clamp, abs,
# sign) met by NaN. Below DATA_FIRST_SEED a seed keeps naming its program.
DATA_FIRST_SEED = 50_000_000
DATA_SHARE = 0.5


def _index_values(rng: random.Random, size: int, count: int, negative: bool = True) -> list[int]:
    """`count` indices into a dim of `size` (> 0): the ends (and -1, -size) often, repeats allowed."""
    ends = [0, size - 1] + ([-1, -size] if negative else [])
    low = -size if negative else 0
    return [rng.choice(ends) if rng.random() < 0.5 else rng.randrange(low, size) for _ in range(count)]


def take(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    n = xs[0].numel()
    if n == 0:
        return None
    shape = rng.choice([(rng.randint(0, 4),), (rng.randint(1, 2), rng.randint(0, 3)), ()])
    index = torch.tensor(_index_values(rng, n, math.prod(shape)), dtype=torch.int64).reshape(shape)
    return f"torch.take({{0}}, {_int_list_source(index)})"


def take_along_dim(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None or x.shape[dim] == 0:
        return None
    shape = [rng.choice([s, 1]) for s in x.shape]
    shape[dim] = rng.randint(0, x.shape[dim] + 1)
    index = torch.tensor(_index_values(rng, x.shape[dim], math.prod(shape)), dtype=torch.int64).reshape(shape)
    return f"torch.take_along_dim({{0}}, {_int_list_source(index)}, dim={dim})"


def index_select_boundary(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None or x.shape[dim] == 0:
        return None
    values = _index_values(rng, x.shape[dim], rng.randint(0, 4), negative=False)
    if rng.random() < 0.25:
        return f"torch.index_select({{0}}, {dim}, torch.tensor({values[0] if values else 0}))"  # a 0-d index
    return f"torch.index_select({{0}}, {dim}, torch.tensor({literal(values)}, dtype=torch.int64))"


def index_fill(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None or x.shape[dim] == 0:
        return None
    values = _index_values(rng, x.shape[dim], rng.randint(0, 3))
    value = rng.choice([*CORNER_SCALARS, True, 7])
    return f"{{0}}.index_fill({dim}, torch.tensor({literal(values)}, dtype=torch.int64), {literal(value)})"


def index_tensors(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """Advanced indexing with index lists on a later dim, on two non-adjacent dims (their result dims go first), after
    None or an ellipsis, or 2-d index tensors."""
    x = xs[0]
    if x.dim() == 0 or 0 in x.shape:
        return None
    dim = rng.randrange(x.dim())
    count = rng.randint(1, 3)
    first = literal(_index_values(rng, x.shape[dim], count))
    form = rng.randrange(4)
    if form == 0:
        return f"{{0}}[{', '.join([':'] * dim + [first])}]"
    if form == 1 and x.dim() >= 3:
        last = literal(_index_values(rng, x.shape[-1], rng.choice([1, count])))
        return f"{{0}}[{first if dim == 0 else literal(_index_values(rng, x.shape[0], count))}, :, ..., {last}]"
    if form == 2:
        return f"{{0}}[..., None, {literal(_index_values(rng, x.shape[-1], count))}]"
    index = torch.tensor(_index_values(rng, x.shape[0], 2 * count), dtype=torch.int64).reshape(2, count)
    return f"{{0}}[{_int_list_source(index)}]"


def unfold(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    size = 1 if dim is None else x.shape[dim]
    return f"{{0}}.unfold({0 if dim is None else dim}, {rng.randint(0, size)}, {rng.randint(1, 3)})"


def diagonal(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.dim() < 2:
        return f"torch.diag({{0}}, {rng.randint(-2, 2)})" if x.dim() == 1 else None
    a, b = rng.sample(range(-x.dim(), 0), 2)
    return f"torch.diagonal({{0}}, {rng.randint(-3, 3)}, {a}, {b})"


def roll_far(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.dim() == 0:
        return None
    dims = [rng.randrange(-x.dim(), x.dim()) for _ in range(rng.randint(1, 3))]  # a dim twice now and then
    shifts = [rng.choice([-13, -7, -1, 0, 5, 6, 11]) for _ in dims]
    return f"torch.roll({{0}}, {literal(tuple(shifts))}, {literal(tuple(dims))})"


def flip_dims(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.dim() == 0:
        return "torch.flip({0}, ())"
    dims = rng.sample(range(x.dim()), rng.randint(1, x.dim()))
    return f"torch.flip({{0}}, {literal([d - x.dim() if rng.random() < 0.5 else d for d in dims])})"


def repeat_interleave(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None or rng.random() < 0.2:
        return f"torch.repeat_interleave({{0}}, {rng.randint(0, 3)})"
    if rng.random() < 0.5:
        return f"torch.repeat_interleave({{0}}, {rng.randint(0, 3)}, dim={dim})"
    counts = [rng.randint(0, 3) for _ in range(x.shape[dim])]
    output_size = f", output_size={sum(counts)}" if rng.random() < 0.5 else ""
    return f"torch.repeat_interleave({{0}}, torch.tensor({literal(counts)}, dtype=torch.int64), dim={dim}{output_size})"


def movement(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    x = xs[0]
    if x.dim() == 0:
        return None
    if rng.random() < 0.5:
        return f"torch.movedim({{0}}, {rng.randrange(-x.dim(), x.dim())}, {rng.randrange(-x.dim(), x.dim())})"
    return f"{{0}}.tile({literal(tuple(rng.choice([1, 2]) for _ in range(rng.randint(1, x.dim() + 1))))})"


def selection(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """masked_select by another value's mask (broadcast), a leading-dims mask, nonzero as a tuple, argwhere."""
    x, other = xs
    form = rng.randrange(5)
    if form == 0:
        return "torch.masked_select({0}, {1} > 0)"
    if form == 1:
        if other.dim() == 0 or tuple(other.shape) != tuple(x.shape[: other.dim()]):
            return None
        return "{0}[{1}.bool()]"
    if form == 2:
        return None if x.dim() == 0 else f"torch.nonzero({{0}}, as_tuple=True)[{rng.randrange(x.dim())}]"
    if form == 3:
        return "torch.argwhere({0})"
    return "{0}[{0} != {0}]" if x.is_floating_point() else "{0}[{0} == {0}.max()]" if x.numel() else None


def reduction_dtype(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """sum/prod/mean/nansum with a dtype (and without), keepdim, over empty, size-1 and no dims."""
    x = xs[0]
    function = rng.choice(["sum", "sum", "prod", "mean", "nansum"])
    floating = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
    dtypes = floating if x.is_floating_point() else [*floating, torch.int64, torch.int32, torch.int8, torch.uint8]
    if function in ("mean", "nansum") and not x.is_floating_point():
        dtypes = floating
    dtype = rng.choice([*dtypes, None])
    dtype_text = "" if dtype is None else f", dtype={dtype}"
    if function == "prod":  # (one dim at most)
        dim = _dim(rng, x)
        if dim is None:
            return f"torch.prod({{0}}{dtype_text})"
        return f"torch.prod({{0}}, {dim}, keepdim={rng.random() < 0.5}{dtype_text})"
    dims: Any
    special = [d for d, s in enumerate(x.shape) if s <= 1]  # empty and size-1 dims preferred
    if x.dim() == 0 or rng.random() < 0.2:
        dims = ()
    elif special and rng.random() < 0.6:
        dims = tuple(rng.sample(special, rng.randint(1, len(special))))
    else:
        dims = tuple(rng.sample(range(x.dim()), rng.randint(1, x.dim())))
    if function == "nansum" and dims == ():
        # torch's meta function of nansum over dim=() reduces nothing where eager reduces every dim (a shape of 3
        # where eager gives 0-d): the export fails the checker (seed 50000766), torch's and not drawn
        function = "sum"
    return f"torch.{function}({{0}}, dim={literal(dims)}, keepdim={rng.random() < 0.5}{dtype_text})"


def reduction_edge(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """The other reductions over size-1 and empty dims with keepdim (any/all, logsumexp, std/var, amax/argmax)."""
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None:
        return None
    keepdim = rng.random() < 0.5
    function = rng.choice(["any", "all", "logsumexp", "std", "var", "amax", "amin", "argmax", "argmin"])
    if function in ("logsumexp", "std", "var") and not x.is_floating_point():
        return None
    return f"torch.{function}({{0}}, dim={dim}, keepdim={keepdim})"


def cast_extreme(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    """A cast to any dtype, whatever the values (undefined float-to-integer casts are left out of the comparison)."""
    return f"{{0}}.to({rng.choice([*INT_DTYPES, torch.bool, *FLOAT_DTYPES])})"


WIDE_INTEGERS = [127, 128, 255, 256, -129, 1000, 40000, 65535, 2**31, -(2**31) - 1, 2**40, -1, 3]


def small_integer_arithmetic(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """Integer and bool arithmetic with numbers beyond the dtype, negation and abs at its minimum, squares."""
    if xs[0].is_floating_point():
        return None
    number = rng.choice(WIDE_INTEGERS)
    return rng.choice(
        [
            f"{{0}} + {number}",
            f"{{0}} * {number}",
            f"{number} - {{0}}",
            f"{{0}} // {number}",
            f"{{0}} % {number}",
            f"torch.bitwise_and({{0}}, {number})",
            "-{0}" if xs[0].dtype != torch.bool else "~{0}",
            "torch.abs({0})",
            "{0} * {0}",
            "{0} + {0}",
        ]
    )


def _corner_value(rng: random.Random, dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return rng.choice([True, False])
    if dtype.is_floating_point:
        return rng.choice([*CORNER_SCALARS, torch.finfo(dtype).max, 0.5])
    info = torch.iinfo(dtype)
    return rng.choice([info.min, info.max, 0, 1, -1 if info.min else 2, 3])


def promotion(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    """x against a 0-d tensor of any dtype or a Python scalar of any kind, on either side."""
    operator = rng.choice(["+", "-", "*", "/", "//", "%", "==", "<", "max", "where", "pow", "atan2"])
    if rng.random() < 0.6:
        dtype = rng.choice(DTYPES)
        other = f"torch.tensor({literal(_corner_value(rng, dtype))}, dtype={dtype})"
    else:
        other = literal(rng.choice([True, False, 0, 2, -3, 300, 2.5, -0.0, math.inf, math.nan, 1e10]))
    a, b = ("{0}", other) if rng.random() < 0.6 else (other, "{0}")
    if operator == "max":
        return f"torch.maximum({a}, {b})" if "tensor" in other else f"torch.clamp({{0}}, min={other})"
    if operator == "where":
        return f"torch.where({{0}} > 0, {{0}}, {other})"
    if operator == "pow":
        return f"torch.pow({a}, {b})"
    if operator == "atan2":
        return f"torch.atan2({{0}}, {other})" if "tensor" in other else "torch.atan2({0}, {0})"
    return f"{a} {operator} {b}"


def make_ties(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    return rng.choice(["torch.clamp({0}, -1, 1)", "torch.abs({0})", "torch.sign({0})", "{0} // 2"])


def sort_ties(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """Stable sorts, msort, topk values (sorted) and unique over ties and NaN."""
    x = xs[0]
    dim = _dim(rng, x)
    dim = -1 if dim is None else dim
    form = rng.randrange(4)
    if form == 0:
        part = rng.choice(["values", "indices"])
        return f"torch.sort({{0}}, dim={dim}, descending={rng.random() < 0.5}, stable=True).{part}"
    if form == 1:
        return "torch.msort({0})" if x.dim() else None
    if form == 2:
        size = x.shape[dim] if x.dim() else 1
        return f"torch.topk({{0}}, {rng.randint(0, size)}, dim={dim}, largest={rng.random() < 0.5}).values"
    return f"torch.unique({{0}}, sorted=True, dim={dim})" if x.dim() else None


DATA_OPS: list[Op] = [
    Op("take", 1, take),
    Op("take_along_dim", 1, take_along_dim),
    Op("index_select_boundary", 1, index_select_boundary),
    Op("index_fill", 1, index_fill),
    Op("index_tensors", 1, index_tensors),
    Op("unfold", 1, unfold),
    Op("diagonal", 1, diagonal),
    Op("roll_far", 1, roll_far),
    Op("flip_dims", 1, flip_dims),
    Op("repeat_interleave", 1, repeat_interleave),
    Op("movement", 1, movement),
    Op("selection", 2, selection, discontinuous=True),
    Op("reduction_dtype", 1, reduction_dtype, inexact=True),
    Op("reduction_edge", 1, reduction_edge, inexact=True, discontinuous=True),
    Op("cast_extreme", 1, cast_extreme, discontinuous=True),
    Op("small_integer_arithmetic", 1, small_integer_arithmetic),
    Op("promotion", 1, promotion, inexact=True, discontinuous=True),
    Op("make_ties", 1, make_ties, discontinuous=True),
    Op("sort_ties", 1, sort_ties, discontinuous=True),
]
OPS_BY_NAME.update({op.name: op for op in DATA_OPS})
DATA_MET = ["fill_special", "fill_special", "fill_integer_edge", "make_ties", "cummax", "cummin", "cummax_indices"]
DATA_MET += ["cummin_indices", "logcumsumexp", "cumsum_dtype", "stable_sort", "kthvalue", "gather", "scatter"]
DATA_MET += ["index_put", "narrow", "nonzero", "unique", "cast_extreme", "promotion", "small_integer_arithmetic"]
DATA_DRAWS = DATA_OPS + [OPS_BY_NAME[name] for name in DATA_MET]
ELEMENTWISE = ELEMENTWISE | {"cast_extreme", "small_integer_arithmetic", "promotion", "make_ties"}


# --- the limits catalogue (seeds from LIMITS_FIRST_SEED on): arithmetic at the dtypes' limits, in place writes ------
# Integer arithmetic at the dtype's bounds (wrapping add/mul/neg/abs, floor division, remainder and fmod with negative
# operands and by -1, shifts by the bit width and more), float16/bfloat16 sums, means, variances, norms, softmaxes and
# products over long rows (eager accumulates them in float32), signed zeros (seen through 1 / x: +-inf) and NaN met
# by comparisons, clamps and isclose, rounding of halves and huge values, scatter_reduce/index_reduce in every mode,
# index_put with accumulate and repeated indices, in-place writes through views (a slice, a column, the diagonal,
# a transpose), where/masked_fill with 0-d tensors of other dtypes. Left out, as eager leaves them undefined or
# platform-specific: the sign of a zero that maximum/minimum/amax/amin pick between -0.0 and +0.0 (eager's vectorized
# loop takes one, its scalar loop the other: a size of 64 and of 6 differ), the sign bit of a NaN, truncating
# division of int32/int64's minimum by -1 (eager's kernel traps: SIGFPE), float-to-integer casts out of range (the
# data catalogue's, left out there). Below LIMITS_FIRST_SEED a seed keeps naming its program.
LIMITS_FIRST_SEED = 60_000_000
LIMITS_SHARE = 0.55


def fill_integer_limits(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """The integer dtype's min, max, min + 1, max - 1 or -1 at masked positions."""
    x = xs[0]
    if x.is_floating_point() or x.dtype == torch.bool or x.numel() == 0:
        return None
    info = torch.iinfo(x.dtype)
    value = rng.choice([info.min, info.max, info.min + 1, info.max - 1, -1 if info.min else 128])
    return f"{{0}}.masked_fill({_edge_mask_source(rng, x)}, {value})"


def fill_float_limits(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """The float dtype's max, -max, smallest normal, a subnormal, -0.0 or NaN at masked positions."""
    x = xs[0]
    if not x.is_floating_point() or x.numel() == 0:
        return None
    info = torch.finfo(x.dtype)
    value = rng.choice([info.max, -info.max, info.tiny, -info.tiny / 4, -0.0, -0.0, math.nan, info.eps])
    return f"{{0}}.masked_fill({_edge_mask_source(rng, x)}, {literal(value)})"


def integer_wrap(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """Arithmetic that wraps at the integer dtype's bounds, in the dtype (no promotion)."""
    x = xs[0]
    if x.is_floating_point() or x.dtype == torch.bool:
        return None
    info = torch.iinfo(x.dtype)
    number = rng.choice([info.max, info.min, 2, 3, -1 if info.min else 255, info.max // 2 + 1])
    return rng.choice(
        [
            "{0} + {0}",
            "{0} * {0}",
            "-{0}",
            "torch.abs({0})",
            "{0} - torch.flip({0}, [0])" if x.dim() else "{0} - 1",
            f"{{0}} * {number}",
            f"{{0}} + {number}",
            f"{number} - {{0}}",
            f"torch.mul({{0}}, torch.tensor({number}, dtype={x.dtype}))",
            "torch.square({0})",
            f"torch.sum({{0}}, dtype={x.dtype})",
            f"torch.cumsum({{0}}, dim=0, dtype={x.dtype})" if x.dim() else "{0} * 2",
            f"torch.prod({{0}}, dtype={x.dtype})",
            "torch.addcmul({0}, {0}, {0})",
            f"torch.add({{0}}, {{0}}, alpha={rng.choice([2, -1, 3])})",
        ]
    )


def integer_division(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """Floor division, remainder and fmod of integers by negative numbers, -1 and the dtype's bounds (tensors or
    numbers); truncating division only where eager's kernel defines min / -1 (int8/int16/uint8: computed in int)."""
    x, y = xs
    if x.dtype != y.dtype or x.is_floating_point() or x.dtype == torch.bool:
        return None
    info = torch.iinfo(x.dtype)
    divisor = rng.choice(["{1}", "{1}", str(rng.choice([-1, -2, -3, 7, info.min, info.max, -1 if info.min else 255]))])
    if divisor == "{1}" and bool((y == 0).any()):
        return None  # (eager refuses a division by zero: ZeroDivisionError)
    functions = ["torch.floor_divide", "torch.remainder", "torch.fmod"]
    if x.dtype not in (torch.int32, torch.int64):
        functions.append("trunc")
    function = rng.choice(functions)
    if function == "trunc":
        return f"torch.div({{0}}, {divisor}, rounding_mode='trunc')"
    if rng.random() < 0.2 and function != "torch.fmod":
        bound = rng.choice([info.min, info.max, -1 if info.min else 0])
        return f"{function}(torch.tensor({bound}, dtype={x.dtype}), {{1}})"
    return f"{function}({{0}}, {divisor})"


def shift_limits(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """Shifts of negative numbers and the bounds by counts at and beyond the bit width (and negative counts)."""
    x = xs[0]
    if x.is_floating_point() or x.dtype == torch.bool:
        return None
    bits = torch.iinfo(x.dtype).bits
    counts = [0, 1, bits - 1, bits, bits + 1, 2 * bits, 64, -1, 7]
    count = rng.choice(counts)
    operator = rng.choice(["<<", ">>"])
    if rng.random() < 0.4 and x.numel() and x.dim():
        values = [rng.choice(counts) for _ in range(x.shape[-1])]
        return f"{{0}} {operator} torch.tensor({literal(values)}, dtype={x.dtype})"
    return f"{{0}} {operator} {count}"


LOW_PRECISION = (torch.float16, torch.bfloat16)


def to_low_precision(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    return f"{{0}}.to({rng.choice(LOW_PRECISION)})"


def long_rows(x: torch.Tensor, rng: random.Random) -> str:
    """x's elements as rows of a few hundred (repeated), where rounding every partial result in float16/bfloat16
    drifts from eager's float32 accumulation."""
    repeats = rng.choice([97, 256, 300, 513])
    rows = rng.choice([1, 2])
    return f"{{0}}.reshape(-1).repeat({rows}, {repeats})"


def low_precision_reduction(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """A reduction over a long float16/bfloat16 row, which eager accumulates in float32 (a sum, mean, ...)."""
    x = xs[0]
    if x.dtype not in LOW_PRECISION or x.numel() == 0 or x.numel() > 8:
        return None
    rows = long_rows(x, rng)
    return rng.choice(
        [
            f"torch.sum({rows}, dim=-1)",
            f"torch.mean({rows}, dim=-1)",
            f"torch.sum({rows})",
            f"torch.nansum({rows}, dim=-1)",
        ]
    )


def low_precision_statistic(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """var/std, norms, softmax/log_softmax, logsumexp, cumsum and matmul over long float16/bfloat16 rows."""
    x = xs[0]
    if x.dtype not in LOW_PRECISION or x.numel() == 0 or x.numel() > 8:
        return None
    rows = long_rows(x, rng)
    return rng.choice(
        [
            f"torch.var({rows}, dim=-1)",
            f"torch.std({rows}, dim=-1, correction=0)",
            f"torch.var_mean({rows}, dim=-1)[0]",
            f"torch.linalg.vector_norm({rows}, dim=-1)",
            f"torch.linalg.vector_norm({rows}, ord={rng.choice([1, 3, math.inf])}, dim=-1)",
            f"torch.softmax({rows}, dim=-1)[..., :4]",
            f"torch.log_softmax({rows}, dim=-1)[..., :4]",
            f"torch.logsumexp({rows}, dim=-1)",
            f"torch.cumsum({rows}, dim=-1)[..., -3:]",
            f"torch.matmul({rows}, {rows}.transpose(0, 1))",
            f"torch.nn.functional.layer_norm({rows}, ({rows}.shape[-1],))[..., :4]",
            f"torch.nn.functional.normalize({rows}, dim=-1)[..., :4]",
        ]
    )


def signed_zero(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """Ops whose result may be -0.0, seen through 1 / x (-inf or +inf)."""
    x = xs[0]
    if not x.is_floating_point():
        return None
    inner = rng.choice(
        [
            "torch.clamp({0}, min=0.0)",
            "torch.clamp({0}, max=-0.0)",
            "torch.clamp({0}, -0.0, 0.0)",
            "torch.relu({0})",
            "{0} * 0",
            "{0} * -0.0",
            "torch.round({0} * 0.25)",
            "torch.trunc({0} * 0.25)",
            "torch.ceil({0} * 0.25)",
            "torch.floor(-{0})",
            "torch.round({0} * 0.125, decimals=1)",
            "torch.fmod({0}, 0.5)",
            "torch.remainder({0}, -0.5)",
            "torch.sign({0}) * 0",
            "torch.nan_to_num({0}, nan=-0.0)",
            "torch.where({0} > 0, {0}, torch.tensor(-0.0, dtype={0}.dtype))",
            "{0}.masked_fill({0} < 1, -0.0)",
            "torch.abs({0}) * -0.0",
            "torch.copysign(torch.zeros_like({0}), {0})",
            "torch.nn.functional.hardtanh({0})",
            "torch.nn.functional.leaky_relu({0}, 0.0)",
            "torch.frac({0})",
            "-{0} + 0.0",
            "{0} - {0}",
            "torch.lerp({0}, -{0}, 0.5)",
        ]
    )
    return f"torch.reciprocal({inner})"


def nan_comparison(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """Comparisons, clamps, isclose and selections of floats with NaN and infinities."""
    x, y = xs
    if not (x.is_floating_point() and y.is_floating_point()):
        return None
    equal_nan = rng.random() < 0.5
    rtol, atol = rng.choice([0.0, 0.5, 1e-3]), literal(rng.choice([0.0, 0.25, math.inf]))
    return rng.choice(
        [
            "{0} < {1}",
            "{0} >= {1}",
            "{0} == {1}",
            "{0} != {1}",
            "torch.maximum({0}, {1})",
            "torch.fmin({0}, {1})",
            "torch.clamp({0}, min={1})",
            "torch.clamp({0}, {1}, {1} + 1)",
            "torch.where({0} > {1}, {0}, {1})",
            f"torch.isclose({{0}}, {{1}}, equal_nan={equal_nan})",
            f"torch.isclose({{0}}, {{1}}, rtol={rtol}, atol={atol})",
            "torch.eq({0}, float('nan'))",
            "{0} > float('-inf')",
            "torch.clamp({0}, min=float('-inf'), max=float('inf'))",
            "torch.isin({0}, {1})",
        ]
    )


def integer_isclose(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """isclose of integers and bool (eager compares in the default float dtype)."""
    x, y = xs
    if x.is_floating_point() or x.dtype != y.dtype:
        return None
    rtol, atol = rng.choice([(1e-5, 1e-8), (0.0, 1.0), (0.5, 0.0), (0.0, 127.0), (0.0, 128.0), (1.0, 2.0)])
    return f"torch.isclose({{0}}, {{1}}, rtol={rtol}, atol={atol})"


def rounding_limits(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """round (half to even, decimals), trunc, ceil, floor, frac of halves, huge and tiny values."""
    x = xs[0]
    if not x.is_floating_point():
        return None
    info = torch.finfo(x.dtype)
    scale = rng.choice(["0.5", "0.125", "2.0", literal(info.max / 4), literal(info.tiny), literal(2.0 / info.eps)])
    function = rng.choice(["torch.round", "torch.trunc", "torch.ceil", "torch.floor", "torch.frac", "decimals"])
    scaled = f"({{0}} * {scale} + 0.5)" if scale in ("0.5", "2.0") and rng.random() < 0.5 else f"({{0}} * {scale})"
    if function == "decimals":
        return f"torch.round({scaled}, decimals={rng.choice([-3, -1, 1, 2, 3])})"
    return f"{function}({scaled})"


def _duplicate_index(rng: random.Random, x: torch.Tensor, dim: int) -> torch.Tensor:
    size = x.shape[dim]
    return torch.tensor([rng.choice([0, size - 1, rng.randrange(size)]) for _ in range(rng.randint(1, 5))])


def reduce_into(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """scatter_reduce and index_reduce in every mode with include_self, index_add/index_put accumulating at repeated
    indices: x's own values (flipped, negated) as the source."""
    x = xs[0]
    dim = _dim(rng, x)
    if dim is None or x.shape[dim] == 0:
        return None
    reduce = rng.choice(["sum", "prod", "mean", "amax", "amin"])
    include_self = rng.random() < 0.5
    form = rng.randrange(4)
    index = _duplicate_index(rng, x, dim)
    if form == 0:
        shape = list(x.shape)
        shape[dim] = len(index)
        full = index.reshape([-1 if d == dim % x.dim() else 1 for d in range(x.dim())]).expand(shape)
        source = rng.choice(["{0}", f"{{0}}.flip({dim})"])
        if len(index) > x.shape[dim]:
            source = f"torch.cat([{source}] * {len(index)}, dim={dim})"
        index_text = _int_list_source(full)
        return f"{{0}}.scatter_reduce({dim}, {index_text}, {source}, {reduce!r}, include_self={include_self})"
    if form == 1:
        if reduce == "sum":
            reduce = "mean"
        source = f"{{0}}.index_select({dim}, {_int_list_source(index.flip(0) % x.shape[dim])})"
        index_text = _int_list_source(index)
        return f"{{0}}.index_reduce({dim}, {index_text}, {source}, {reduce!r}, include_self={include_self})"
    if form == 2:
        source = f"{{0}}.index_select({dim}, {_int_list_source(index.flip(0))})"
        alpha = rng.choice([1, 2, -1] if not x.is_floating_point() else [1, -1, 0.5])
        return f"{{0}}.index_add({dim}, {_int_list_source(index)}, {source}, alpha={alpha})"
    negative = torch.where(index % 2 == 1, index - x.shape[0], index) if dim % x.dim() == 0 else index
    rows = f"{{0}}[{_int_list_source(index.flip(0))}]" if dim % x.dim() == 0 else None
    if rows is None:
        return None
    return f"{{0}}.index_put(({_int_list_source(negative)},), {rows}, accumulate=True)"


def in_place_view(rng: random.Random, xs: Sequence[torch.Tensor]) -> str | None:
    """An in-place op written through a view of a copy of x (a slice, a column, the diagonal, a transpose, a
    flattened view), the copy returned. An operand read from the copy is cloned first: eager's result for an operand
    that overlaps the elements written hangs on the order its loop writes them (t.view(-1)[::3].add_(t[0]) adds the
    updated t[0] to t[3]: seed 60000628)."""
    x = xs[0]
    if x.dim() == 0 or x.numel() == 0:
        return None
    bool_x = x.dtype == torch.bool
    view = rng.choice(["t[1:]", "t[::2]", "t[-1]", "t.view(-1)[::3]", "t.unsqueeze(0)[0, :1]"])
    if x.dim() >= 2:
        view = rng.choice([view, "t[:, 0]", "t.diagonal()", "t.transpose(0, 1)[0]", "t[..., 1:]"])
    if bool_x:
        update = rng.choice(["logical_not_()", "fill_(True)", "zero_()", "copy_(t[0].logical_not())"])  # (a copy)
    else:
        number = literal(rng.choice([2, -1, 3, 0, 1]) if not x.is_floating_point() else rng.choice([0.5, -0.0, 2.0]))
        update = rng.choice(
            [
                f"add_({number})",
                f"mul_({number})",
                f"sub_({view.replace('t', 't.clone()', 1)})",
                "neg_()" if x.dtype != torch.uint8 else "abs_()",
                f"clamp_(min={number})",
                "zero_()",
                f"fill_({number})",
                "copy_(t[0].clone())" if x.dim() >= 2 else "add_(t[0].clone())",
                f"index_put_((torch.tensor([0, 0, -1]),), torch.tensor({number}, dtype=t.dtype), accumulate=True)",
                "pow_(2)",  # (pow_.Scalar, functionally pow.Tensor_Scalar)
            ]
        )
    return f"(lambda t: ({view}.{update}, t)[1])({{0}}.clone())"


def where_zero_dim(rng: random.Random, xs: Sequence[torch.Tensor]) -> str:
    """where/masked_fill with 0-d tensors of any dtype (condition, value or both) broadcast against x."""
    dtype = rng.choice(DTYPES)
    other = f"torch.tensor({literal(_corner_value(rng, dtype))}, dtype={dtype})"
    flag = f"torch.tensor({rng.random() < 0.5})"
    return rng.choice(
        [
            f"torch.where({{0}} != 0, {{0}}, {other})",
            f"torch.where({{0}} != 0, {other}, {{0}})",
            f"torch.where({flag}, {{0}}, {other})",
            f"torch.where({flag}, {other}, {literal(_corner_value(rng, torch.float32))})",
            f"{{0}}.masked_fill({flag}, {literal(_corner_value(rng, dtype))})",
            f"{{0}}.masked_fill({{0}} == 0, {other}.to({{0}}.dtype))",
            f"torch.where({other}.bool(), {{0}}, {{0}}.flip(0))" if xs[0].dim() else f"torch.where({flag}, {{0}}, 1)",
        ]
    )


LIMITS_OPS: list[Op] = [
    Op("fill_integer_limits", 1, fill_integer_limits),
    Op("fill_float_limits", 1, fill_float_limits),
    Op("integer_wrap", 1, integer_wrap),
    Op("integer_division", 2, integer_division, discontinuous=True),
    Op("shift_limits", 1, shift_limits),
    Op("to_low_precision", 1, to_low_precision, discontinuous=True),
    Op("low_precision_reduction", 1, low_precision_reduction, inexact=True),
    Op("low_precision_statistic", 1, low_precision_statistic, inexact=True),
    Op("signed_zero", 1, signed_zero, discontinuous=True),
    Op("nan_comparison", 2, nan_comparison, discontinuous=True),
    Op("integer_isclose", 2, integer_isclose),
    Op("rounding_limits", 1, rounding_limits, inexact=True, discontinuous=True),
    Op("reduce_into", 1, reduce_into, inexact=True),
    Op("in_place_view", 1, in_place_view),
    Op("where_zero_dim", 1, where_zero_dim, discontinuous=True),
]
OPS_BY_NAME.update({op.name: op for op in LIMITS_OPS})
LIMITS_MET = ["fill_special", "fill_integer_edge", "cast_extreme", "promotion", "scatter_reduce", "index_put"]
LIMITS_DRAWS = LIMITS_OPS + LIMITS_OPS[:3] + [OPS_BY_NAME[name] for name in LIMITS_MET]
ELEMENTWISE = ELEMENTWISE | {"integer_division", "nan_comparison", "integer_isclose", "signed_zero", "rounding_limits"}


# --- programs ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Step:
    op: str
    operands: tuple[int, ...]  # indices into the program's values (inputs first)
    expression: str  # with {0}, {1}, ... for the operands

    def source(self, names: Sequence[str]) -> str:
        return self.expression.format(*(names[i] for i in self.operands))


@dataclasses.dataclass
class Program:
    seed: int
    inputs: list[torch.Tensor]
    steps: list[Step]

    @property
    def outputs(self) -> list[int]:
        """The values no later step consumes (every step's result then matters)."""
        used = {i for step in self.steps for i in step.operands}
        first = len(self.inputs)
        return [first + k for k in range(len(self.steps)) if first + k not in used]

    def names(self) -> list[str]:
        return [f"v{i}" for i in range(len(self.inputs) + len(self.steps))]

    def forward_source(self) -> str:
        names = self.names()
        lines = [f"def forward(self, {', '.join(names[: len(self.inputs)])}):"]
        for k, step in enumerate(self.steps):
            lines.append(f"    {names[len(self.inputs) + k]} = {step.source(names)}")
        outputs = ", ".join(names[i] for i in self.outputs)
        lines.append(f"    return ({outputs},)")
        return "\n".join(lines)

    def module(self) -> torch.nn.Module:
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(self.forward_source(), f"<fuzz program {self.seed}>", "exec"), namespace)
        module_class = type("FuzzProgram", (torch.nn.Module,), {"forward": namespace["forward"]})
        return module_class().eval()

    def source(self) -> str:
        """A runnable reproducer: the inputs' values and the program."""
        lines = ["import torch, fx2onnx", "", "class Program(torch.nn.Module):"]
        lines += ["    " + line for line in self.forward_source().splitlines()]
        lines.append("")
        for name, tensor in zip(self.names(), self.inputs):
            lines.append(f"{name} = {tensor_source(tensor)}")
        args = ", ".join(self.names()[: len(self.inputs)])
        lines.append(f"print(fx2onnx.export(Program(), ({args},)).verify({args}))")
        return "\n".join(lines)


def tensor_source(tensor: torch.Tensor) -> str:
    if tensor.numel() == 0:
        return f"torch.empty({literal(tuple(tensor.shape))}, dtype={tensor.dtype})"
    return f"torch.tensor({literal(tensor.tolist())}, dtype={tensor.dtype})"


def run_eager(program: Program) -> list[torch.Tensor]:
    with torch.no_grad():
        return list(program.module()(*program.inputs))


# --- eager disagreeing with itself ----------------------------------------------------------------------------------
# Eager computes an elementwise op in a vectorized loop and the last few elements (or a lone one) in a scalar loop,
# and the two can disagree: float64 `remainder`/`fmod` whose quotient overflows (fmod(1.8e308, -0.75)) is NaN in the
# vectorized loop and the exact remainder in the scalar one (seeds 12100, 13996). Such a position has no single
# eager answer, so it is not compared; every other position of the program still is.
def _evaluate(expression: str, operands: Sequence[torch.Tensor]) -> torch.Tensor:
    names = {f"x{i}": t for i, t in enumerate(operands)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return eval(expression.format(*names), {"torch": torch}, names)


def _one_element_at_a_time(expression: str, operands: Sequence[torch.Tensor], result: torch.Tensor) -> torch.Tensor:
    """An elementwise step's result computed for each element alone (eager's scalar loop), or `result` unchanged
    where that is not possible. Operands keep their 0-d-ness (a 0-d tensor weighs less in type promotion)."""
    try:
        broadcast = [t.broadcast_to(result.shape) for t in operands]
        alone = torch.empty_like(result).reshape(-1)
        for n, index in enumerate(itertools.product(*(range(size) for size in result.shape))):
            elements = [b[index].reshape(() if t.dim() == 0 else (1,)) for t, b in zip(operands, broadcast)]
            element = _evaluate(expression, elements)
            if not isinstance(element, torch.Tensor) or element.dtype != result.dtype or element.numel() != 1:
                return result
            alone[n] = element.reshape(())
    except Exception:
        return result
    return alone.reshape(result.shape)


# Eager's layer_norm and group_norm compute a row's statistics in two loops too: a row of fewer than 8 elements
# (its scalar loop) whose variance overflows (a float32 row holding -3.4e38, bfloat16 computed in float32) gives
# NaN, a longer row (its vectorized loop) gives a reciprocal deviation of 0, so the mean-free values times 0 (seeds
# 10002929, 10002938, 10003294). The second opinion for these steps is the textbook formula in eager's accumulation
# dtype (float32 for float16/bfloat16): where eager's result differs from it, eager disagrees with itself.
def _normalized(x: torch.Tensor, dims: tuple[int, ...], eps: float) -> torch.Tensor:
    mean = x.mean(dims, keepdim=True)
    centered = x - mean
    return centered * torch.rsqrt((centered * centered).mean(dims, keepdim=True) + eps)


def _accumulated(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _layer_norm_by_formula(
    x: torch.Tensor,
    shape: Sequence[int],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    y = _normalized(_accumulated(x), tuple(range(-len(shape), 0)), eps)
    y = y if weight is None else y * _accumulated(weight)
    return (y if bias is None else y + _accumulated(bias)).to(x.dtype)


def _group_norm_by_formula(
    x: torch.Tensor,
    groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    grouped = _accumulated(x).reshape(x.shape[0], groups, -1)
    y = _normalized(grouped, (-1,), eps).reshape(x.shape)
    channel = (1, -1) + (1,) * (x.dim() - 2)
    y = y if weight is None else y * _accumulated(weight).reshape(channel)
    return (y if bias is None else y + _accumulated(bias).reshape(channel)).to(x.dtype)


# Eager's linear/bilinear/bicubic interpolation adds every neighbour's term, one of weight 0 too: next to an
# infinite value that is 0 * inf, NaN (interpolate([inf], size=2, mode='linear', align_corners=True): NaN where the
# output sits on the sample). ONNX Runtime's Resize gives the sample there (inf), and a weight that rounds to 0 in
# one and to 1e-8 in the other decides between NaN and inf. The second opinion is the interpolation with eager's own
# weights (eager's result for each one-hot input) where a zero weight adds nothing and a weight under 1e-6 on an
# infinite value is NaN: where eager's result differs, it hangs on those zero terms.
def _interpolate_by_weights(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    original = _ORIGINALS["interpolate"]
    result = original(x, *args, **kwargs)
    mode = kwargs.get("mode", "nearest")
    inputs = math.prod(x.shape[2:])
    if mode in ("nearest", "nearest-exact") or not result.numel() or x.shape[0] * x.shape[1] * inputs > 4096:
        return result
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    basis = torch.eye(inputs, dtype=dtype).reshape(inputs, 1, *x.shape[2:])
    weights = original(basis, *args, **kwargs).reshape(inputs, -1).double()  # [input position, output position]
    values = x.reshape(x.shape[0] * x.shape[1], inputs, 1).double()
    terms = torch.where(weights == 0, 0.0, values * weights)
    terms = torch.where((weights.abs() < 1e-6) & (weights != 0) & ~values.isfinite(), math.nan, terms)
    return terms.sum(1).reshape(result.shape).to(result.dtype)


FORMULAS: dict[str, tuple[str, Callable[..., torch.Tensor]]] = {
    "layer_norm": ("layer_norm", _layer_norm_by_formula),
    "group_norm": ("group_norm", _group_norm_by_formula),
    "interpolate": ("interpolate", _interpolate_by_weights),
}
_ORIGINALS = {name: getattr(torch.nn.functional, name) for name, _ in FORMULAS.values()}


def _by_formula(op: str, expression: str, operands: Sequence[torch.Tensor]) -> torch.Tensor:
    name, formula = FORMULAS[op]
    original = _ORIGINALS[name]
    setattr(torch.nn.functional, name, formula)
    try:
        return _evaluate(expression, operands)
    finally:
        setattr(torch.nn.functional, name, original)


def run_eager_one_element_at_a_time(program: Program) -> list[torch.Tensor]:
    """The program's outputs with every elementwise step computed one element at a time (eager's scalar loop), and
    the normalizations by their formula (eager's two loops disagree where a row's variance overflows)."""
    values = list(program.inputs)
    for step in program.steps:
        operands = [values[i] for i in step.operands]
        result = _evaluate(step.expression, operands)
        if step.op in ELEMENTWISE and isinstance(result, torch.Tensor) and result.numel():
            result = _one_element_at_a_time(step.expression, operands, result)
        elif step.op in FORMULAS and isinstance(result, torch.Tensor) and result.numel():
            result = _by_formula(step.op, step.expression, operands)
        values.append(result)
    return [values[i] for i in program.outputs]


def agreeing(expected: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    """Where `actual` passes for `expected` by verify's criterion, element by element (NaN where NaN, an infinity
    only itself, floats within the dtype's tolerance, integers and bool equal)."""
    from fx2onnx._verification import TOLERANCES

    if expected.dtype.is_floating_point:
        rtol, atol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
        e, a = expected.double(), actual.double()
        close = (e - a).abs() <= atol + rtol * e.abs()
        return (e.isnan() & a.isnan()) | (e.isinf() & (e == a)) | (e.isfinite() & close)
    return expected == actual


def eager_disagreements(program: Program) -> list[torch.Tensor]:
    """Per output, the positions where eager disagrees with itself: its result differs (by verify's criterion)
    from the one its scalar loop gives when each elementwise step is computed one element at a time, or it hangs
    on the order of a sum of products that overflows (overflow_dependents)."""
    vectorized = run_eager(program)
    alone = _quietly(lambda: run_eager_one_element_at_a_time(program))
    masks = []
    for v, a in zip(vectorized, alone):
        same_layout = isinstance(a, torch.Tensor) and a.shape == v.shape and a.dtype == v.dtype
        masks.append(~agreeing(v, a) if same_layout else torch.zeros(v.shape, dtype=torch.bool))
    for dependents in (_quietly(lambda: overflow_dependents(program)), _quietly(lambda: undefined_dependents(program))):
        masks = [m | d if d.shape == m.shape else m for m, d in zip(masks, dependents)]
    return masks


# A float's cast to an integer type is undefined in C++ where the value is NaN, infinite or beyond the type's range:
# eager gives its platform's (x86: int32/int64 min, int8 of 300.0 through int32: 44), ONNX Runtime's Cast its own.
# The output positions that change when those cast positions hold the type's min, max, 0 or mixed values are left out
# (seeds from DATA_FIRST_SEED cast anything to anything).
UNDEFINED_CASTS = frozenset({"cast", "cast_extreme"})
UNDEFINED_MIXES = 4


def _undefined_positions(operand: torch.Tensor, result: torch.Tensor) -> torch.Tensor | None:
    if not operand.is_floating_point() or result.is_floating_point() or result.dtype == torch.bool:
        return None
    info = torch.iinfo(result.dtype)
    truncated = operand.double().trunc()
    return ~(truncated.isfinite() & (truncated >= float(info.min)) & (truncated < float(info.max) + 1))


def _with_undefined_casts_set(program: Program, fill: Callable[[torch.Tensor], torch.Tensor]) -> tuple[list, bool]:
    values, found = list(program.inputs), False
    for step in program.steps:
        operands = [values[i] for i in step.operands]
        result = _evaluate(step.expression, operands)
        if step.op in UNDEFINED_CASTS and isinstance(result, torch.Tensor) and result.numel():
            undefined = _undefined_positions(operands[0], result)
            if undefined is not None and undefined.shape == result.shape and bool(undefined.any()):
                found = True
                result = torch.where(undefined, fill(result), result)
        values.append(result)
    return [values[i] for i in program.outputs], found


def undefined_dependents(program: Program) -> list[torch.Tensor]:
    """Per output, the positions that hang on an undefined float-to-integer cast."""
    first = run_eager(program)
    none = [torch.zeros(o.shape, dtype=torch.bool) for o in first]
    generator = torch.Generator().manual_seed(0)

    def bound(result: torch.Tensor, which: str) -> torch.Tensor:
        info = torch.iinfo(result.dtype)
        return torch.full_like(result, {"min": info.min, "max": info.max, "zero": 0}[which])

    def mixed(result: torch.Tensor) -> torch.Tensor:
        info = torch.iinfo(result.dtype)
        return torch.randint(info.min, info.max, result.shape, generator=generator, dtype=result.dtype)

    fills = [lambda r, w=w: bound(r, w) for w in ("min", "max", "zero")] + [mixed] * UNDEFINED_MIXES
    try:
        others = []
        for fill in fills:
            outputs, found = _with_undefined_casts_set(program, fill)
            if not found:
                return none
            others.append(outputs)
    except Exception:  # a step eager refuses with those values: none left out
        return none
    masks = []
    for n, mask in enumerate(none):
        for other in others:
            same_layout = first[n].shape == other[n].shape == mask.shape and first[n].dtype == other[n].dtype
            mask = mask | ~agreeing(first[n], other[n]) if same_layout else mask
        masks.append(mask)
    return masks


# A sum of products of finite operands whose terms overflow has no single float answer: eager rounds each product
# (+inf + -inf: NaN), ONNX Runtime's MatMul fuses multiply-adds and keeps the first overflow's sign, and which sign
# comes first is the order's (summation_bounds gives such a position no bound). A later step that consumes several
# such positions hangs on each one's sign (seed 20102517: bfloat16 v @ v, then @ v again: eager NaN, ONNX Runtime
# inf from -inf * -0.5 + inf * 2.25). The output positions that change when those positions are all +inf, all -inf,
# all NaN or infinities of mixed signs are left out.
OVERFLOW_SIGN_MIXES = 16  # (drawn: two positions consumed together meet each pair of signs in 99% of draws)


def _with_overflows_set(program: Program, fill: Callable[[torch.Tensor], torch.Tensor]) -> tuple[list, bool]:
    """The program's outputs with every overflowing position of a sum of products set to fill(result)'s value
    there, and whether there was one."""
    values, found = list(program.inputs), False
    for step in program.steps:
        operands = [values[i] for i in step.operands]
        result = _evaluate(step.expression, operands)
        floating = isinstance(result, torch.Tensor) and result.dtype.is_floating_point and result.numel()
        if floating and step.op in PRODUCT_SUMMATIONS:
            with contextlib.suppress(RuntimeError, TypeError):
                exact, bound = summation_bounds(step, operands, result)
                overflowing = exact.isfinite() & (bound == math.inf)
                found |= bool(overflowing.any())
                result = torch.where(overflowing, fill(result), result)
        values.append(result)
    return [values[i] for i in program.outputs], found


def overflow_dependents(program: Program) -> list[torch.Tensor]:
    """Per output, the positions that hang on the order of an overflowing sum of products."""
    none = [torch.zeros(o.shape, dtype=torch.bool) for o in run_eager(program)]
    generator = torch.Generator().manual_seed(0)

    def mixed(result: torch.Tensor) -> torch.Tensor:
        signs = torch.randint(0, 2, result.shape, generator=generator).to(result.dtype) * 2 - 1
        return signs * math.inf

    fills = [lambda r, v=v: torch.full_like(r, v) for v in (-math.inf, math.nan)] + [mixed] * OVERFLOW_SIGN_MIXES
    try:
        first, found = _with_overflows_set(program, lambda r: torch.full_like(r, math.inf))
        if not found:
            return none
        others = [_with_overflows_set(program, fill)[0] for fill in fills]
    except Exception:  # a step eager refuses with those values: none left out
        return none
    masks = []
    for n, mask in enumerate(none):
        for other in others:
            same_layout = first[n].shape == other[n].shape == mask.shape and first[n].dtype == other[n].dtype
            mask = mask | ~agreeing(first[n], other[n]) if same_layout else mask  # (else a size hangs on them)
        masks.append(mask)
    return masks


# --- rounding of the inexact ops --------------------------------------------------------------------------------
# Eager's and ONNX Runtime's float kernels are accurate to an ulp or two, not rounded alike (ONNX Runtime's float32
# Tanh is 1.7 ulp off at -6 where eager's is 0.1). A program whose output is ill-conditioned in an inexact step's
# result then differs beyond the tolerance though no lowering is wrong: log1p(tanh(-6)), where one ulp of tanh is
# 0.5% of log1p's result (seeds 22509, 30586). A position where ONNX's value is eager's with every inexact step's float
# result moved 1..ULP_ENVELOPE ulps (all up, or all down), or lies within the farthest such move, is such rounding:
# it passes, and is counted apart (expm1(36) 2 ulps off then sin: seed 34923). Anything farther is a mismatch.
ULP_ENVELOPE = 2


def _nudged(result: torch.Tensor, direction: float, ulps: int) -> torch.Tensor:
    towards = torch.full_like(result, direction)
    for _ in range(ulps):
        result = torch.nextafter(result, towards)
    return result


# Sums (sum, mean, cumsum, matmul) are exact in no order: eager and ONNX Runtime add in different orders (eager's
# vectorized pairwise sums, ONNX Runtime's blocks), and with operands of mixed magnitudes (+-FLT_MAX beside small
# numbers, seed 44517: a mean of 0.15 in eager, 0 in ONNX Runtime, the exact one 0.0125) the two results are both
# cancellation artefacts. Any order's float sum of m terms lies within m * eps * sum(|terms|) of the exact one
# (Higham's bound, with eps of the result's dtype: a low-precision sum may also accumulate in its own dtype), plus
# the result's own rounding: a summation step's result is moved to the exact sum (float64) plus or minus that bound,
# and the move is propagated through the later steps as the ulps of the inexact ops are. A result beyond the float
# range becomes an infinity there, as an order that overflows gives.
SUMMATIONS = frozenset({"sum", "mean", "cumsum", "matmul", "conv", "avg_pool", "einsum", "nan_reduction"})
SUMMATIONS |= {"cumsum_dtype", "vector_norm", "reduction_dtype", "low_precision_reduction"}
PRODUCT_SUMMATIONS = frozenset({"matmul", "conv", "einsum"})  # (sums of products, which may overflow alone)


def _terms(op: str, operands: Sequence[torch.Tensor], result: torch.Tensor) -> int:
    """How many terms each element of a summation step's result adds (at most)."""
    if op == "matmul":
        return operands[0].shape[-1] if operands[0].dim() else 1
    if op in ("cumsum", "cumsum_dtype"):
        return max(operands[0].shape, default=1)
    if op == "conv":  # input channels times a kernel of at most 3x3
        return 9 * operands[0].shape[1]
    if op == "avg_pool":
        return 9
    if op == "einsum":
        return max(1, *(t.numel() for t in operands))
    if op == "low_precision_reduction":  # (a row of the operand repeated, at most 513 times)
        return max(1, 513 * operands[0].numel())
    return max(1, operands[0].numel() // max(1, result.numel()))


def summation_bounds(step: Step, operands: Sequence[torch.Tensor], result: torch.Tensor) -> torch.Tensor:
    """Per element of a summation step's float result, the exact sum (in float64) and how far any order's float
    sum may lie from it, stacked ([2, *shape]); non-finite where no bound holds (an operand inf or NaN)."""
    wide = [t.double() if t.is_floating_point() else t for t in operands]
    exact = _evaluate(step.expression, wide).double()
    magnitude = _evaluate(step.expression, [t.abs() for t in wide]).double().abs()
    eps = torch.finfo(result.dtype).eps
    # A mean's magnitude is its sum's divided by m, as its bound is; 2 eps |exact|: the result's rounding.
    bound = _terms(step.op, operands, result) * eps * magnitude + 2 * eps * exact.abs()
    # That bound assumes no product or partial sum overflows. Where the products of finite operands, in absolute
    # value, sum beyond the accumulation dtype's range, the order decides: eager rounds each product (+inf - inf:
    # NaN), ONNX Runtime's MatMul fuses multiply-adds and keeps the first overflow's sign (seed 20101642: float64
    # -1.25 * DBL_MAX + DBL_MAX * DBL_MAX, eager NaN, ONNX Runtime -inf). There: an exact 0 and an infinite bound.
    if step.op in PRODUCT_SUMMATIONS and all(bool(t.isfinite().all()) for t in wide if t.is_floating_point()):
        overflowing = ~(magnitude <= torch.finfo(_accumulated(result).dtype).max)
        exact, bound = torch.where(overflowing, 0.0, exact), torch.where(overflowing, math.inf, bound)
    return torch.stack([exact, bound])


# Eager's index_add and index_put(accumulate=True) of float16/bfloat16 add the rows one at a time in the dtype,
# rounding (and overflowing) every partial sum, where its scatter_add, scatter_reduce and sum of the same values
# accumulate in float32 and round once: index_add of [1000, -1000] into 65504 is inf, their scatter_add 65504. fx2onnx
# accumulates all of them in float32 (ScatterND legalized to float32). In the nudged runs these steps are computed as
# eager's scatter_add computes them (the low-precision operands in float32, the result rounded once), so ONNX's value
# is compared with that one there (seed 10004263: float16 index_add of -2, -1000, +65504 into -65504, alpha=-1: eager
# -inf, float32 -1002).
LOW_PRECISION_ACCUMULATIONS = frozenset({"index_add", "index_put"})


def _accumulated_in_float32(step: Step, operands: Sequence[torch.Tensor], result: torch.Tensor) -> torch.Tensor:
    wide = [t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for t in operands]
    try:
        once = _evaluate(step.expression, wide)
    except (RuntimeError, TypeError):
        return result
    return once.to(result.dtype) if isinstance(once, torch.Tensor) and once.shape == result.shape else result


# ONNX Runtime's float64 Sin and Cos are accurate to about epsilon |x| absolute near their zeros, not to the result
# (docs/ort-defects.md 17: sin(fl(pi)) is 0, eager 1.2e-16; float64 sinc(-4.0) 0.0, eager -3.9e-17): in the nudged
# runs such a step's result also moves by epsilon |x| (sinc, sin(pi x) / (pi x): by epsilon).
ARGUMENT_SCALED = frozenset({"sin", "cos", "sinc"})


def _moved_by_epsilon_of_x(step: Step, x: torch.Tensor, result: torch.Tensor, direction: float) -> torch.Tensor:
    if x.shape != result.shape:
        return result
    size = torch.ones_like(result, dtype=torch.float64) if step.op == "sinc" else x.double().abs()
    moved = result.double() + math.copysign(torch.finfo(result.dtype).eps, direction) * size
    return torch.where(moved.isfinite(), moved.to(result.dtype), result)


def run_eager_nudged(program: Program, direction: float, ulps: int = ULP_ENVELOPE) -> list[torch.Tensor]:
    """The program's outputs with every inexact step's float result moved `ulps` ulps towards `direction`, every
    summation step's float result moved to the far end of its order's bound in that direction, and the
    low-precision accumulations rounded once."""
    values = list(program.inputs)
    for step in program.steps:
        operands = [values[i] for i in step.operands]
        result = _evaluate(step.expression, operands)
        floating = isinstance(result, torch.Tensor) and result.dtype.is_floating_point and result.numel()
        if floating and step.op in LOW_PRECISION_ACCUMULATIONS and result.dtype in (torch.float16, torch.bfloat16):
            result = _accumulated_in_float32(step, operands, result)
        elif floating and step.op in SUMMATIONS:
            try:
                exact, bound = summation_bounds(step, operands, result)
            except (RuntimeError, TypeError):  # not computable in float64 (no bound: eager's result kept)
                exact = bound = torch.full_like(result, math.nan, dtype=torch.float64)
            moved = (exact + math.copysign(1.0, direction) * bound).to(result.dtype)
            result = torch.where(exact.isfinite() & bound.isfinite(), moved, result)
            unbounded = exact.isfinite() & (bound == math.inf)  # (terms overflowing: any order's result)
            result = torch.where(unbounded, torch.full_like(result, direction), result)
        elif floating and OPS_BY_NAME[step.op].inexact:
            result = _nudged(result, direction, ulps)
            if step.op in ARGUMENT_SCALED:
                result = _moved_by_epsilon_of_x(step, operands[0], result, direction)
        values.append(result)
    return [values[i] for i in program.outputs]


def nudged_runs(program: Program) -> list[list[torch.Tensor]]:
    """Eager's outputs with the inexact steps' results moved 1..ULP_ENVELOPE ulps and the summation steps' to their
    bounds, all up or all down."""
    return [
        _quietly(lambda d=d, n=n: run_eager_nudged(program, d, n))
        for n in range(1, ULP_ENVELOPE + 1)
        for d in (math.inf, -math.inf)
    ]


def within_envelopes(
    expected: Sequence[torch.Tensor],
    actual: Sequence[torch.Tensor],
    excluded: Sequence[torch.Tensor],
    runs: Sequence[Sequence[torch.Tensor]],
) -> tuple[bool, int]:
    """Whether every position passes by verify's criterion, or is left out, or is within the rounding of the inexact
    ops and the order of the sums: it passes for one of the nudged runs' values, or differs from eager by no more
    than the farthest finite nudged value does, or lies between the lowest and highest of eager's and the runs'
    values. Also how many positions passed by that rounding only."""
    rounding = 0
    for n, (e, a, mask) in enumerate(zip(expected, actual, excluded)):
        if a.shape != e.shape or a.dtype != e.dtype:
            return False, 0
        good = agreeing(e, a) | mask
        if e.dtype.is_floating_point:
            reached = torch.zeros(e.shape, dtype=torch.bool)
            spread = torch.zeros(e.shape, dtype=torch.float64)
            low, high = e.double().clone(), e.double().clone()  # the runs' hull, infinities included
            for run in runs:
                other = run[n]
                if other.shape != e.shape or other.dtype != e.dtype:
                    continue
                reached |= agreeing(other, a)
                moved = (other.double() - e.double()).abs()
                spread = torch.maximum(spread, torch.where(moved.isfinite(), moved, 0.0))
                low, high = torch.fmin(low, other.double()), torch.fmax(high, other.double())
            close = e.isfinite() & a.isfinite() & ((a.double() - e.double()).abs() <= spread)
            close |= (low <= a.double()) & (a.double() <= high)
            rounded = (reached | close) & ~good
            rounding += int(rounded.sum())
            good = good | rounded
        if not bool(good.all()):
            return False, 0
    return True, rounding


def judge_outputs(
    expected: Sequence[torch.Tensor], actual: Sequence[torch.Tensor], excluded: Sequence[torch.Tensor]
) -> tuple[bool, str]:
    """Whether ONNX's outputs pass for eager's once the excluded positions are left out (ONNX's value there
    replaced by eager's), and verify's lines for them."""
    from fx2onnx._verification import compare, summarize

    results = []
    for n, (e, a, mask) in enumerate(zip(expected, actual, excluded)):
        if mask.any() and a.shape == e.shape and a.dtype == e.dtype:
            a = torch.where(mask, e, a)
        results.append(compare(f"output_{n}", e, a))
    return all(r.passed for r in results), summarize(results)


# --- drawing -------------------------------------------------------------------------------------------------------
def draw_shape(rng: random.Random) -> tuple[int, ...]:
    rank = rng.choice([0, 1, 1, 2, 2, 2, 3, 3, 4])
    return tuple(rng.choice([1, 2, 3, 3, 4, 5, 0] if rng.random() < 0.1 else [1, 2, 3, 3, 4, 5]) for _ in range(rank))


def related_shape(rng: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with `shape` (most of the time): a suffix, dims set to 1, or its own."""
    form = rng.random()
    if form < 0.4:
        return shape
    if form < 0.6:
        return shape[rng.randint(0, len(shape)) :]
    if form < 0.8:
        return tuple(1 if rng.random() < 0.4 else s for s in shape)
    return draw_shape(rng)


def draw_values(rng: random.Random, dtype: torch.dtype, shape: tuple[int, ...], wide: bool = False) -> torch.Tensor:
    """Small exact numbers, with the dtype's extremes now and then (subnormals too in a wide program)."""
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    numel = math.prod(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        values = (torch.randint(-16, 17, shape, generator=generator) / 4).to(dtype)  # exact in every float dtype
        if numel and rng.random() < 0.3:
            info = torch.finfo(dtype)
            specials = [math.nan, math.inf, -math.inf, -0.0, info.max, -info.max, info.tiny, 1000.0, -1e-3]
            if wide:
                specials += [info.smallest_normal / 4, -info.smallest_normal / 2, info.min]
            flat = values.reshape(-1)
            for _ in range(rng.randint(1, max(1, numel // 3))):
                flat[rng.randrange(numel)] = rng.choice(specials)
        return values
    info = torch.iinfo(dtype)
    low, high = (0, 10) if dtype == torch.uint8 else (-6, 7)
    values = torch.randint(low, high, shape, generator=generator).to(dtype)
    if numel and rng.random() < 0.2:
        flat = values.reshape(-1)
        for _ in range(rng.randint(1, max(1, numel // 3))):
            extremes = [info.min, info.max, info.max - 1, 100, -100 if low < 0 else 200]
            if wide:
                extremes += [info.min + 1, 64, 31, -1 if low < 0 else 255]
            flat[rng.randrange(numel)] = rng.choice(extremes)
    return values


def _eager_step(expression: str, operands: Sequence[torch.Tensor]) -> torch.Tensor | None:
    names = {f"x{i}": t for i, t in enumerate(operands)}
    source = expression.format(*names)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = eval(source, {"torch": torch}, names)
    except Exception:
        return None
    if not isinstance(result, torch.Tensor) or result.is_complex() or result.numel() > MAX_NUMEL:
        return None
    return result


def draw_program(seed: int) -> Program:
    """A valid program (eager runs every step) drawn from `seed` (from WIDE_FIRST_SEED on, with the wide catalogue)."""
    rng = random.Random(seed)
    wide = seed >= WIDE_FIRST_SEED
    wider = seed >= WIDER_FIRST_SEED  # (a seed below it draws no number more: its program is unchanged)
    edge = seed >= EDGE_FIRST_SEED  # (likewise)
    corner = seed >= CORNER_FIRST_SEED  # (likewise)
    data = seed >= DATA_FIRST_SEED  # (likewise)
    limits = seed >= LIMITS_FIRST_SEED  # (likewise)
    base = draw_shape(rng)
    inputs = []
    for k in range(rng.choice([1, 2, 2, 3])):
        shape = base if k == 0 else related_shape(rng, base)
        dtype = rng.choice(DTYPES) if k == 0 or rng.random() < 0.5 else inputs[0].dtype
        inputs.append(draw_values(rng, dtype, shape, wide))
    values = list(inputs)
    exact = [True] * len(inputs)
    steps: list[Step] = []
    target = rng.randint(2, 8)
    attempts = 0
    while len(steps) < target and attempts < 200:
        attempts += 1
        if limits and rng.random() < LIMITS_SHARE:
            op = rng.choice(LIMITS_DRAWS)
        elif data and rng.random() < DATA_SHARE:
            op = rng.choice(DATA_DRAWS)
        elif corner and rng.random() < CORNER_SHARE:
            op = rng.choice(CORNER_DRAWS)
        elif edge and rng.random() < EDGE_SHARE:
            op = rng.choice(EDGE_DRAWS)
        elif wider and rng.random() < WIDER_SHARE:
            op = rng.choice(WIDER_OPS)
        else:
            op = rng.choice(WIDE_OPS if wide and rng.random() < WIDE_SHARE else OPS)
        # Prefer recent values: chains, not only independent ops on the inputs.
        indices = tuple(
            max(0, len(values) - 1 - int(rng.expovariate(0.7))) if rng.random() < 0.8 else rng.randrange(len(values))
            for _ in range(op.arity)
        )
        operands = [values[i] for i in indices]
        if op.discontinuous and not all(exact[i] for i in indices):
            continue
        expression = op.build(rng, operands)
        if expression is None:
            continue
        if op.name == "mode" and any(x.is_floating_point() and bool(x.isnan().any()) for x in operands):
            # eager's mode std::sorts the slice: NaN breaks its order (mode of [inf, nan, inf, -inf]: -inf; of
            # [nan, -2.75, 3.5]: NaN, of [2, nan, 1]: 1, seed 20100119). Only programs that drew mode on NaN change.
            continue
        result = _eager_step(expression, operands)
        if result is None:
            continue
        steps.append(Step(op.name, indices, expression))
        values.append(result)
        exact.append(not (result.is_floating_point() and (op.inexact or not all(exact[i] for i in indices))))
    return _unused_inputs_dropped(Program(seed, inputs, steps))


# --- judging -------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Outcome:
    kind: str  # one of CLASSES
    detail: str = ""
    excluded: int = 0  # positions not compared: eager disagrees with itself there (eager_disagreements)
    rounding: int = 0  # positions passed by the rounding of inexact ops only (within_envelopes)

    @property
    def signature(self) -> str:
        """The cause, without the numbers that vary between programs (for grouping)."""
        return f"{self.kind}: {_error_cause(self.detail)}"


def _error_cause(detail: str) -> str:
    """An error's first line without its numbers, and the overload it names (a legalization error's first line
    is the same for every op)."""
    first = detail.strip().splitlines()[0] if detail.strip() else ""
    first = re.sub(r"<fuzz program \d+>", "<program>", first)
    text = re.sub(r"[0-9]+", "N", first)[:160]
    overload = re.search(r"overload: (\S+)", detail)
    return f"{text} [{overload.group(1)}]" if overload else text


def _quietly(function: Callable[[], Any]) -> Any:
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        return function()


def judge(program: Program) -> Outcome:
    """Export, check, run in a default ONNX Runtime session and compare with eager."""
    import onnx

    import fx2onnx
    from fx2onnx._verification import summarize

    if not program.steps:
        return Outcome(OK)
    module = program.module()
    try:
        onnx_program = _quietly(lambda: fx2onnx.export(module, tuple(program.inputs)))
    except Exception as error:
        return Outcome(EXPORT_ERROR, f"{type(error).__name__}: {error}")
    try:
        onnx.checker.check_model(onnx_program.model_proto, full_check=True)
        onnx_program.session()
    except Exception as error:
        return Outcome(UNLOADABLE, f"{type(error).__name__}: {error}")
    try:
        results = _quietly(lambda: onnx_program.verify(*program.inputs))
    except AssertionError as error:
        return Outcome(MISMATCH, str(error))
    except Exception as error:
        return Outcome(RUN_ERROR, f"{type(error).__name__}: {error}")
    if all(r.passed for r in results):
        return Outcome(OK)
    return _without_eager_disagreements(program, onnx_program, Outcome(MISMATCH, summarize(results)))


def _without_eager_disagreements(program: Program, onnx_program: Any, mismatch: Outcome) -> Outcome:
    """A mismatch judged again without the positions where eager disagrees with itself: OK (with the number of
    positions left out) if every other position passes, else the mismatch."""
    excluded = _quietly(lambda: eager_disagreements(program))
    count = sum(int(mask.sum()) for mask in excluded)
    expected = run_eager(program)
    actual = [a for a in _quietly(lambda: onnx_program(*program.inputs)) if a is not None]
    if len(actual) != len(expected):
        return mismatch
    note = f"{count} positions not compared (eager disagrees with itself there)"
    passed, detail = judge_outputs(expected, actual, excluded)
    if passed:
        return Outcome(OK, f"{note}\n{detail}", count)
    enveloped, rounding = within_envelopes(expected, actual, excluded, nudged_runs(program))
    if enveloped:
        rounded = (
            f"{rounding} positions within the rounding of inexact ops (+-{ULP_ENVELOPE} ulps of a step's result) "
            "and the order of sums"
        )
        return Outcome(OK, f"{rounded}; {note}\n{detail}", count, rounding)
    return Outcome(MISMATCH, f"{detail}\n({note})" if count else mismatch.detail, count)


def _same_failure(outcome: Outcome, reference: Outcome) -> bool:
    if outcome.kind != reference.kind:
        return False
    if outcome.kind in (EXPORT_ERROR, UNLOADABLE, RUN_ERROR):
        return outcome.detail.split(":")[0] == reference.detail.split(":")[0]
    return True


def _without_step(program: Program, k: int) -> Program | None:
    """The program without step k: its consumers use its first operand instead (or lose their step if it had none)."""
    removed = len(program.inputs) + k
    step = program.steps[k]
    replacement = step.operands[0] if step.operands else None
    steps = []
    for other in program.steps[:k] + program.steps[k + 1 :]:
        operands = []
        for i in other.operands:
            if i == removed:
                if replacement is None:
                    return None
                i = replacement
            operands.append(i - 1 if i > removed else i)
        steps.append(Step(other.op, tuple(operands), other.expression))
    return Program(program.seed, program.inputs, steps)


def _sliced_inputs(program: Program) -> list[Program]:
    """Variants with one input made smaller: one dim cut to its first element, or dropped."""
    variants = []
    for n, tensor in enumerate(program.inputs):
        for dim, size in enumerate(tensor.shape):
            smaller = [tensor.narrow(dim, 0, 1).clone()] if size > 1 else []
            if size <= 1:
                smaller.append(tensor.select(dim, 0).clone() if size == 1 else tensor.sum(dim).to(tensor.dtype))
            for replacement in smaller:
                variants.append(
                    dataclasses.replace(program, inputs=[*program.inputs[:n], replacement, *program.inputs[n + 1 :]])
                )
    return variants


def _unused_inputs_dropped(program: Program) -> Program:
    used = {i for step in program.steps for i in step.operands}
    keep = [i for i in range(len(program.inputs)) if i in used]
    if len(keep) == len(program.inputs):
        return program
    remap = {old: new for new, old in enumerate(keep)}
    shift = len(program.inputs) - len(keep)
    steps = [
        Step(s.op, tuple(remap[i] if i < len(program.inputs) else i - shift for i in s.operands), s.expression)
        for s in program.steps
    ]
    return Program(program.seed, [program.inputs[i] for i in keep], steps)


def _valid(program: Program) -> bool:
    if not program.steps:
        return False
    try:
        _quietly(lambda: run_eager(program))
    except Exception:
        return False
    return True


def shrink(program: Program, outcome: Outcome, budget: int = 40) -> tuple[Program, Outcome]:
    """Drop steps and shrink inputs while the program still fails the same way (at most `budget` exports)."""
    improved = True
    while improved and budget > 0:
        improved = False
        candidates = [_without_step(program, k) for k in range(len(program.steps))] + _sliced_inputs(program)
        for candidate in candidates:
            if candidate is None or budget <= 0:
                continue
            candidate = _unused_inputs_dropped(candidate)
            if not _valid(candidate):
                continue
            budget -= 1
            result = judge(candidate)
            if _same_failure(result, outcome):
                program, outcome, improved = candidate, result, True
                break
    return program, outcome


def cause(program: Program, outcome: Outcome) -> str:
    """A finding's cause: the export error's message, or the ops of a (minimized) mismatching program."""
    if outcome.kind == MISMATCH:
        ops = sorted({s.op for s in program.steps})
        dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in program.inputs})
        return f"{MISMATCH}: {'+'.join(ops)} on {'/'.join(dtypes)}"
    return outcome.signature


@dataclasses.dataclass
class Finding:
    seed: int
    outcome: Outcome
    program: Program

    def report(self) -> str:
        return (
            f"--- seed {self.seed}: {cause(self.program, self.outcome)}\n{self.outcome.detail.strip()[:600]}\n"
            f"{self.program.source()}\n"
        )

    def record(self) -> dict[str, Any]:
        """The finding as one JSON object (a line of --jsonl's file)."""
        return {
            "seed": self.seed,
            "kind": self.outcome.kind,
            "cause": cause(self.program, self.outcome),
            "ops": [step.op for step in self.program.steps],
            "program": self.program.source(),
            "detail": self.outcome.detail.strip()[:4000],
            "excluded": self.outcome.excluded,
            "rounding": self.outcome.rounding,
        }


def fuzz_one(seed: int, *, minimize: bool = True) -> Finding | None:
    """The seed's finding (shrunk), or None if its program passes. A program that passes only once the positions
    where eager disagrees with itself are left out is an OK finding (not shrunk), counted apart."""
    program = draw_program(seed)
    outcome = judge(program)
    if outcome.kind == OK:
        return Finding(seed, outcome, program) if outcome.excluded or outcome.rounding else None
    if minimize:
        program, outcome = shrink(program, outcome)
    return Finding(seed, outcome, program)


def run_seed(seed: int, minimize: bool = True) -> dict[str, Any]:
    """One program, judged (and its finding shrunk): a finding's record, or {"seed", "kind": "ok"}."""
    started = time.monotonic()
    finding = fuzz_one(seed, minimize=minimize)
    if finding is None:
        record = {"seed": seed, "kind": OK}
    elif finding.outcome.kind == OK:  # passes once eager's own disagreements are left out
        record = {**finding.record(), "cause": f"{OK}: {'+'.join(sorted({s.op for s in finding.program.steps}))}"}
    else:
        record = finding.record()
    record["seconds"] = round(time.monotonic() - started, 3)
    return record


# A worker process is replaced after this many programs (torch.export and ONNX Runtime keep caches that grow).
PROGRAMS_PER_WORKER = 400


def _crash_record(seed: int) -> dict[str, Any]:
    detail = "the worker process died running this program (a crash in torch, the exporter or ONNX Runtime)"
    return {
        "seed": seed,
        "kind": RUN_ERROR,
        "cause": f"{RUN_ERROR}: worker process died",
        "ops": [],
        "program": "",
        "detail": detail,
        "seconds": 0.0,
    }


def _run_isolated(seed: int, minimize: bool, context: multiprocessing.context.BaseContext) -> dict[str, Any]:
    """A seed in a process of its own: its record, or a run error if the process dies."""
    with ProcessPoolExecutor(1, mp_context=context) as executor:
        try:
            return executor.submit(run_seed, seed, minimize).result()
        except BrokenProcessPool:
            return _crash_record(seed)


def run_seeds(seeds: Sequence[int], *, jobs: int = 1, minimize: bool = True) -> Iterator[dict[str, Any]]:
    """Each seed's record (run_seed), in `jobs` worker processes, in the order they complete.

    A program is drawn and judged from its seed alone, so the records do not depend on `jobs`. A worker that dies
    (a crash in native code) takes the programs in flight with it: those are rerun one per process, and the one
    that kills its process is reported as a run error."""
    if jobs <= 1:
        for seed in seeds:
            yield run_seed(seed, minimize)
        return
    context = multiprocessing.get_context("spawn")

    def new_executor() -> ProcessPoolExecutor:
        return ProcessPoolExecutor(jobs, mp_context=context, max_tasks_per_child=PROGRAMS_PER_WORKER)

    remaining = iter(seeds)
    in_flight: dict[Future[dict[str, Any]], int] = {}
    executor = new_executor()
    try:
        while True:
            for seed in remaining:
                in_flight[executor.submit(run_seed, seed, minimize)] = seed
                if len(in_flight) >= 2 * jobs:  # a few queued ahead, so that no worker waits
                    break
            if not in_flight:
                return
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            lost = []
            for future in done:
                seed = in_flight.pop(future)
                try:
                    yield future.result()
                except BrokenProcessPool:
                    lost.append(seed)
            if lost:
                lost += in_flight.values()
                in_flight.clear()
                executor.shutdown(wait=True, cancel_futures=True)
                for seed in sorted(lost):
                    yield _run_isolated(seed, minimize, context)
                executor = new_executor()
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def summary(records: Sequence[dict[str, Any]], programs: int | None = None) -> str:
    """Counts per class and the findings grouped by cause (most frequent first), with their seeds."""
    counts = Counter(record["kind"] for record in records)
    if programs is not None:
        counts[OK] = programs - sum(counts[kind] for kind in CLASSES[1:])
    lines = [f"  {kind}: {counts[kind]}" for kind in CLASSES]
    excluded = sorted((r["seed"], r["excluded"]) for r in records if r["kind"] == OK and r.get("excluded"))
    if excluded:
        lines.append(
            f"  (of the ok: {len(excluded)} programs pass with {sum(n for _, n in excluded)} positions not compared, "
            "where eager disagrees with itself (vectorized and scalar loops, an overflowing sum's order): seeds "
            + ", ".join(f"{seed} ({n})" for seed, n in excluded[:12])
            + (", ...)" if len(excluded) > 12 else ")")
        )
    rounded = sorted((r["seed"], r["rounding"]) for r in records if r["kind"] == OK and r.get("rounding"))
    if rounded:
        lines.append(
            f"  (of the ok: {len(rounded)} programs pass with {sum(n for _, n in rounded)} positions within the "
            f"rounding of their inexact ops, +-{ULP_ENVELOPE} ulps: seeds "
            + ", ".join(f"{seed} ({n})" for seed, n in rounded[:12])
            + (", ...)" if len(rounded) > 12 else ")")
        )
    by_cause: dict[str, list[int]] = {}
    for record in sorted(records, key=lambda r: r["seed"]):
        if record["kind"] != OK:
            key = (
                record["cause"] if record["kind"] == MISMATCH else f"{record['kind']}: {_error_cause(record['detail'])}"
            )
            by_cause.setdefault(key, []).append(record["seed"])
    lines.append(f"per cause ({len(by_cause)}):")
    for key, seeds in sorted(by_cause.items(), key=lambda item: (-len(item[1]), item[0])):
        shown = ", ".join(map(str, seeds[:12])) + (", ..." if len(seeds) > 12 else "")
        lines.append(f"  {len(seeds):5d}  {key}  seeds {shown}")
    return "\n".join(lines)


def read_records(paths: Sequence[str]) -> list[dict[str, Any]]:
    records = []
    for path in paths:
        with open(path) as file:
            records += [json.loads(line) for line in file if line.strip()]
    return records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzzing", description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="the first program's seed (then seed+1, ...)")
    parser.add_argument("--seeds-from", nargs="+", metavar="JSONL", help="rerun the seeds of these findings files")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (the results do not depend on it)")
    parser.add_argument("--jsonl", metavar="PATH", help="write every finding to PATH, one JSON object a line")
    parser.add_argument("--summarize", nargs="+", metavar="JSONL", help="only print the summary of findings files")
    parser.add_argument("--no-shrink", action="store_true", help="report findings as drawn, not minimized")
    parser.add_argument("--progress", type=int, default=50, help="print counts every N programs")
    options = parser.parse_args(argv)
    if options.summarize:
        print(summary(read_records(options.summarize)))
        return 0
    if options.seeds_from:
        seeds = sorted({record["seed"] for record in read_records(options.seeds_from)})
        described = f"{len(seeds)} seeds from {', '.join(options.seeds_from)}"
    else:
        seeds = list(range(options.seed, options.seed + options.programs))
        described = f"seeds {options.seed}..{options.seed + options.programs - 1}"
    output = open(options.jsonl, "w") if options.jsonl else None  # noqa: SIM115 (written as findings arrive)
    counts: Counter[str] = Counter()
    findings: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        for n, record in enumerate(run_seeds(seeds, jobs=options.jobs, minimize=not options.no_shrink), 1):
            counts[record["kind"]] += 1
            if record["kind"] != OK or record.get("excluded") or record.get("rounding"):
                findings.append(record)
                print(
                    f"--- seed {record['seed']}: {record['cause']}\n{record['detail'][:600]}\n{record['program']}\n",
                    flush=True,
                )
                if output is not None:
                    output.write(json.dumps(record) + "\n")
                    output.flush()
            if n % options.progress == 0 or n == len(seeds):
                rate = n / (time.monotonic() - started)
                progress = ", ".join(f"{kind} {counts[kind]}" for kind in CLASSES)
                print(f"[{n}/{len(seeds)} programs, {rate:.2f}/s] {progress}", file=sys.stderr, flush=True)
    finally:
        if output is not None:
            output.close()
    print(f"\n{len(seeds)} programs ({described}):")
    print(summary(findings, programs=len(seeds)))
    return 0 if counts[OK] == len(seeds) else 1


if __name__ == "__main__":
    sys.exit(main())
