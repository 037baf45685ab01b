"""The sweep's cases: one (OpInfo entry, dtype, engine) each, enumerated from PyTorch's OpInfo database.

OpInfo (``torch.testing._internal.common_methods_invocations.op_db``) records, for every op, the
dtypes eager PyTorch supports on each device and sample inputs for them; it is the source of truth
for which (operator, dtype) pairs an exporter must handle.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import zlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from torch.testing._internal.opinfo.core import OpInfo

Engine = Literal["fx2onnx", "reference"]
ENGINES: tuple[Engine, ...] = ("fx2onnx", "reference")

# The ten dtypes the support matrix counts, then complex64, reported on its own.
DTYPES: tuple[str, ...] = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
)
SEPARATE_DTYPES: tuple[str, ...] = ("complex64",)
ALL_DTYPES: tuple[str, ...] = DTYPES + SEPARATE_DTYPES
SHORT_NAMES = {
    "float32": "f32",
    "float64": "f64",
    "float16": "f16",
    "bfloat16": "bf16",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "bool": "bool",
    "complex64": "c64",
}
_BY_SHORT_NAME = {short: name for name, short in SHORT_NAMES.items()}

# Ops whose outputs are random or uninitialised: no exporter can match eager on them.
NONDETERMINISTIC = frozenset(
    {
        "bernoulli",
        "cauchy",
        "empty",
        "empty_like",
        "empty_permuted",
        "empty_strided",
        "exponential",
        "geometric",
        "log_normal",
        "multinomial",
        "new_empty",
        "new_empty_strided",
        "nn.functional.alpha_dropout",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.feature_alpha_dropout.with_train",
        "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d",
        "nn.functional.rrelu",
        "normal",
        "normal.in_place",
        "normal.number_mean",
        "rand_like",
        "randint",
        "randint_like",
        "randn",
        "randn_like",
        "uniform",
        "svd_lowrank",
        "pca_lowrank",
    }
)


@dataclasses.dataclass(frozen=True)
class Case:
    """One cell of the matrix for one engine: export the op's samples in `dtype` and compare with eager."""

    op: str  # OpInfo name, with ".variant" when the entry has a variant_test_name
    dtype: str  # a key of SHORT_NAMES
    engine: Engine = "fx2onnx"
    samples: int = 3  # how many runnable samples to export (samples whose eager run fails are skipped)

    @property
    def key(self) -> str:
        return f"{self.engine}/{self.op}/{self.dtype}"

    @property
    def seed(self) -> int:
        """Seed for sample generation: the same samples for both engines and for any `samples` limit."""
        return zlib.crc32(f"{self.op}/{self.dtype}".encode())

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def op_id(info: OpInfo) -> str:
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


@functools.cache
def op_database() -> dict[str, OpInfo]:
    """OpInfo entries by id. Importing the database takes a few seconds, so it is loaded once."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return {op_id(info): info for info in op_db}


def eager_dtypes(info: OpInfo) -> list[str]:
    """The dtypes (of ALL_DTYPES) that OpInfo says eager supports on CPU."""
    supported = info.supported_dtypes("cpu")
    return [name for name in ALL_DTYPES if getattr(torch, name) in supported]


def parse_dtypes(values: Iterable[str]) -> list[str]:
    """Accept full names (bfloat16) and short ones (bf16), comma-separated or repeated."""
    names = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            name = _BY_SHORT_NAME.get(part, part)
            if name not in SHORT_NAMES:
                raise ValueError(f"unknown dtype {part!r}; choose from {', '.join(ALL_DTYPES)} (or their short names)")
            names.append(name)
    return names


def select_ops(patterns: Sequence[str] = ()) -> list[str]:
    """OpInfo ids matching any of the shell-style `patterns` (all when none)."""
    ids = sorted(op_database())
    if not patterns:
        return ids
    chosen = [i for i in ids if any(fnmatch.fnmatchcase(i, p) for p in patterns)]
    if not chosen:
        raise ValueError(f"no OpInfo entry matches {list(patterns)}")
    return chosen


def enumerate_cases(
    ops: Sequence[str],
    dtypes: Sequence[str] = ALL_DTYPES,
    engines: Sequence[Engine] = ("fx2onnx",),
    samples: int = 3,
) -> list[Case]:
    """Every (op, dtype, engine) for which eager supports the dtype on CPU."""
    database = op_database()
    cases = []
    for name in ops:
        supported = set(eager_dtypes(database[name]))
        for dtype in dtypes:
            if dtype in supported:
                cases.extend(Case(name, dtype, engine, samples) for engine in engines)
    return cases


# The fixed tier the regular test suite runs (first runnable sample per op and dtype): about 150 ops
# that models use most, across elementwise math, comparisons, reductions, linear algebra, shape and
# indexing ops, and torch.nn.functional.
TIER_OPS: tuple[str, ...] = (
    # elementwise unary
    "abs", "atan", "ceil", "cos", "erf", "exp", "expm1", "floor", "log", "log1p", "neg", "reciprocal", "round",
    "rsqrt", "sigmoid", "sign", "sin", "sqrt", "square", "tanh", "trunc", "bitwise_not", "logical_not", "isnan",
    "isinf", "nan_to_num", "clamp",
    # elementwise binary and ternary
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "floor_divide", "remainder", "fmod", "pow",
    "maximum", "minimum", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "where", "lerp", "addcmul", "addcdiv",
    # reductions and scans
    "sum", "mean", "prod", "amax", "argmax", "argmin", "max.reduction_with_dim", "min.reduction_with_dim", "all",
    "any", "std", "var", "logsumexp", "cumsum", "linalg.vector_norm", "count_nonzero", "sort", "topk",
    # linear algebra
    "matmul", "mm", "bmm", "addmm", "outer", "einsum",
    # shape, copy and indexing
    "reshape", "view", "flatten", "unflatten", "squeeze", "unsqueeze", "permute", "transpose", "expand", "repeat",
    "tile", "cat", "stack", "split", "chunk", "select", "flip", "roll", "tril", "triu", "diagonal", "movedim",
    "broadcast_to", "clone", "index_select", "gather", "scatter", "scatter_add", "take_along_dim", "masked_fill",
    "index_put", "__getitem__", "zeros_like", "arange", "full",
    # torch.nn.functional
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "nn.functional.elu",
    "nn.functional.leaky_relu", "nn.functional.hardtanh", "nn.functional.hardswish", "nn.functional.softplus",
    "nn.functional.mish", "nn.functional.logsigmoid", "softmax", "log_softmax", "nn.functional.layer_norm",
    "nn.functional.group_norm", "nn.functional.batch_norm", "nn.functional.rms_norm", "nn.functional.linear",
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose2d", "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d", "nn.functional.embedding",
    "nn.functional.pad.constant", "nn.functional.pad.reflect", "nn.functional.interpolate.nearest",
    "nn.functional.interpolate.bilinear", "nn.functional.scaled_dot_product_attention",
    "nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.one_hot", "nn.functional.normalize",
    "nn.functional.glu",
)  # fmt: skip
