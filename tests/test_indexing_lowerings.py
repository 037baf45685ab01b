"""fx2onnx's scatter/put/*_scatter/shape lowerings (src/fx2onnx/_lowerings/indexing.py), each against eager.

Each case is one the coverage sweep found failing with torchlib's implementation (or none): scatter with a
reduction (torchlib's mean divides by the wrong counts; bfloat16 built an invalid ConstantOfShape), put,
as_strided_scatter and diagonal_scatter (whose decompositions mutate), squeeze of several dims, resize_as_,
hash_tensor and pixel (un)shuffle (DepthToSpace runs for few types). The inputs include duplicate and
negative indices, 0-d and empty tensors, narrow integers and float edge values.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from fx2onnx.legalize import get_target, probes

from conftest import Call, assert_exports_and_matches


def values(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 5.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return (torch.randn(shape, generator=generator) * scale).to(dtype)


# Rows 0 and 2 receive several values each, row 3 none: counts differ per position.
INDEX = torch.tensor([[0, 2, 0, 2, 0], [2, 0, 0, 2, 2], [0, 0, 1, 0, 2]])


@pytest.mark.parametrize(
    ("reduce", "include_self", "dtype"),
    [
        ("sum", True, torch.float16),
        ("prod", False, torch.bfloat16),
        ("mean", True, torch.int8),
        ("mean", False, torch.int8),
        ("mean", False, torch.float32),
        ("amax", False, torch.bool),
        ("amin", True, torch.bfloat16),
    ],
)
def test_scatter_reduce(reduce: str, include_self: bool, dtype: torch.dtype) -> None:
    def scatter_reduce(x: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return x.scatter_reduce(0, index, src, reduce, include_self=include_self)

    # src is larger than the index along dim 1: only its leading part takes part.
    assert_exports_and_matches(Call(scatter_reduce), (values(4, 5, dtype=dtype), INDEX, values(3, 6, dtype=dtype)))


def test_scatter_reduce_edge_values() -> None:
    """NaN from self or src wins in amax/amin, as in eager; infinities and -0.0 reduce as numbers."""
    x = torch.tensor([0.0, float("inf"), -1.5, float("-inf"), float("nan"), 4.0])
    src = torch.tensor([-0.0, 2.0, float("-inf"), 1e30, -1e30, 3.0, float("nan")])
    index = torch.tensor([0, 1, 1, 2, 2, 4, 5])

    def extremes(a: torch.Tensor, i: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a.scatter_reduce(0, i, b, "amin"), a.scatter_reduce(0, i, b, "amax", include_self=False)

    assert_exports_and_matches(Call(extremes), (x, index, src))


@pytest.mark.parametrize(("reduce", "dtype"), [("add", torch.float16), ("multiply", torch.int16)])
def test_scatter_with_reduce(reduce: str, dtype: torch.dtype) -> None:
    def scatter(x: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return x.scatter(0, index, src, reduce=reduce)

    assert_exports_and_matches(Call(scatter), (values(4, 5, dtype=dtype), INDEX, values(3, 5, dtype=dtype, scale=2)))


def test_scatter_value_reduce() -> None:
    scatter = Call(lambda x, index: x.scatter(1, index, 3, reduce="add"))
    assert_exports_and_matches(scatter, (values(3, 4).abs().to(torch.uint8), torch.tensor([[0, 0], [3, 1], [2, 2]])))


def test_scatter_add_float16() -> None:
    scatter_add = Call(lambda x, index, src: x.scatter_add(1, index, src))
    args = (values(4, 5, dtype=torch.float16), INDEX[:, :4].T.contiguous(), values(4, 3, dtype=torch.float16))
    assert_exports_and_matches(scatter_add, args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_accumulating_index_put_computes_in_float32(dtype: torch.dtype) -> None:
    """torchlib's ScatterND(reduction='add') has no float16/bfloat16 kernel at run time; legalization widens it."""

    def index_add(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return x.index_add(0, index, source) + torch.index_put(x, (index,), source, accumulate=True)

    program = assert_exports_and_matches(
        Call(index_add), (values(5, 3, dtype=dtype), torch.tensor([4, 0, 4, 1]), values(4, 3, dtype=dtype))
    )
    scatters = [n for n in program.model.graph if n.op_type == "ScatterND"]
    assert scatters and all(n.inputs[0].dtype.name == "FLOAT" for n in scatters)


def test_onnxruntime_target_refuses_float16_scatter_reductions() -> None:
    target = get_target("onnxruntime-cpu")

    def legal(op_type: str, dtype: str, reduction: str) -> bool:
        binding = {"T": f"tensor({dtype})", "Tind": "tensor(int64)"}
        probe = probes.Probe(("test", op_type, dtype, reduction), lambda: None, {"reduction": reduction})
        return target.verdict("", op_type, 18, binding, probe=probe).legal

    assert not legal("ScatterND", "float16", "add")
    assert not legal("ScatterElements", "float16", "mul")
    assert not legal("ScatterElements", "bool", "max")
    assert legal("ScatterElements", "float16", "none")
    assert legal("ScatterND", "float", "add")
    assert legal("ScatterElements", "int8", "mul")


@pytest.mark.parametrize("accumulate", [True, False])
def test_put(accumulate: bool) -> None:
    put = Call(lambda x, index, source: x.put(index, source, accumulate=accumulate))
    index = torch.tensor([[0, -1], [7, 4]]) if not accumulate else torch.tensor([[0, -1], [11, 0]])
    assert_exports_and_matches(put, (values(3, 4, dtype=torch.int16), index, values(2, 2, dtype=torch.int16)))


def test_put_0d() -> None:
    put = Call(lambda x, index, source: x.put(index, source, accumulate=True))
    assert_exports_and_matches(put, (torch.tensor(2.5), torch.tensor(0), torch.tensor(-1.0)))


@pytest.mark.parametrize(
    ("shape", "size", "stride", "offset"), [((3, 3), (2, 2), (1, 2), 1), ((16,), (2, 2, 2, 2), (8, 4, 2, 1), 0)]
)
def test_as_strided_scatter(
    shape: tuple[int, ...], size: tuple[int, ...], stride: tuple[int, ...], offset: int
) -> None:
    scatter = Call(lambda x, src: torch.as_strided_scatter(x, src, size, stride, offset))
    assert_exports_and_matches(scatter, (values(*shape, dtype=torch.bfloat16), values(*size, dtype=torch.bfloat16)))


@pytest.mark.parametrize(
    ("shape", "src_shape", "offset", "dim1", "dim2"), [((4, 5), (4,), 1, 0, 1), ((3, 4, 5), (4, 3), -1, 2, 0)]
)
def test_diagonal_scatter(
    shape: tuple[int, ...], src_shape: tuple[int, ...], offset: int, dim1: int, dim2: int
) -> None:
    scatter = Call(lambda x, src: torch.diagonal_scatter(x, src, offset, dim1, dim2))
    assert_exports_and_matches(scatter, (torch.zeros(shape, dtype=torch.bool), torch.ones(src_shape, dtype=torch.bool)))


# Every 2-d and 3-d shape of sizes 0, 1 and 3: an empty diagonal's flattening spelt a 0 that Reshape copied as a
# dim (`x.unsqueeze(1)[:, -1:-1].diagonal(-1)`: ONNX Runtime refused the Reshape).
DIAGONAL_SHAPES = [*itertools.product((0, 1, 3), repeat=2), *itertools.product((0, 1, 3), repeat=3)]
DIAGONALS = [(0, 0, 1), (-1, 0, 1), (2, 1, 0), (1, 0, -1), (-2, -1, 0)]  # (offset, dim1, dim2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_diagonal_of_empty_and_single_dims(dtype: torch.dtype) -> None:
    def diagonals(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t.diagonal(offset, dim1, dim2) for t in tensors for offset, dim1, dim2 in DIAGONALS)

    inputs = tuple((torch.arange(math.prod(shape)).reshape(shape) % 3 == 1).to(dtype) for shape in DIAGONAL_SHAPES)
    assert_exports_and_matches(Call(diagonals), inputs)


def test_diagonal_of_a_slice_to_nothing() -> None:
    assert_exports_and_matches(Call(lambda x: x.unsqueeze(1)[:, -1:-1].diagonal(-1)), (values(3, 4),))


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.float32])
def test_index_reduce_mean_of_empty_sources(dtype: torch.dtype, include_self: bool) -> None:
    """Sources with a 0-size dim reduce nothing: self comes back. The index expanded to a [1, 0] source was removed
    by ONNX Runtime's basic graph optimizations ([1, 1] then met [1, 0]: ScatterElements refused the run); the integer
    mean's floor division by the counts meets no zero (every count is at least 1)."""

    def reduce(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.index_reduce(0, index, source, "mean", include_self=include_self),
            y.index_reduce(0, index[:0], y[:0], "mean", include_self=include_self),
        )

    x, y = torch.full((3, 0), 5, dtype=dtype), torch.tensor([[7, -3], [-8, 1]], dtype=dtype)
    assert_exports_and_matches(Call(reduce), (x, torch.tensor([0]), torch.ones(1, 0, dtype=dtype), y))


def test_squeeze_several_dims() -> None:
    squeeze = Call(lambda x, y: (x.squeeze((1, 3)), y.squeeze((0, 1))))
    assert_exports_and_matches(squeeze, (values(5, 1, 5, 1, dtype=torch.int8), values(5, 2)))


def test_resize_as_() -> None:
    resize = Call(lambda x, like: x.clone().resize_as_(like))
    assert_exports_and_matches(resize, (values(5, 4), values(3, 2)))


@pytest.mark.parametrize(
    "x",
    [
        torch.tensor(
            [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 5e-324, 1e308, -2.5, 1 / 3, -1e-310]
        ).double(),
        values(3, 4, dtype=torch.bfloat16),
        torch.tensor([[-128, 127, 0], [5, -1, 3]], dtype=torch.int8),
        torch.tensor([True, False, True]),
    ],
    ids=["f64-edges", "bf16", "i8", "bool"],
)
def test_hash_tensor(x: torch.Tensor) -> None:
    assert_exports_and_matches(Call(lambda a: torch.hash_tensor(a)), (x,))


def test_hash_tensor_over_dims() -> None:
    hashes = Call(lambda a: (torch.hash_tensor(a, 1, keepdim=True), torch.hash_tensor(a, (0, 2))))
    assert_exports_and_matches(hashes, (values(3, 5, 2, dtype=torch.float16),))


def test_pixel_shuffle_narrow_integers() -> None:
    shuffle = Call(lambda x: torch.nn.functional.pixel_shuffle(x, 2))
    assert_exports_and_matches(shuffle, (torch.arange(2 * 2 * 8 * 3 * 3, dtype=torch.int16).reshape(2, 2, 8, 3, 3),))


# Eager returns an empty input unchanged where the graph records the shuffled shape: factor 1 agrees with both.
@pytest.mark.parametrize(("shape", "factor"), [((1, 2, 6, 9), 3), ((1, 1, 0, 3), 1)])
def test_pixel_unshuffle(shape: tuple[int, ...], factor: int) -> None:
    unshuffle = Call(lambda x: torch.nn.functional.pixel_unshuffle(x, factor))
    assert_exports_and_matches(unshuffle, (values(*shape, dtype=torch.uint8),))


def test_untyped_outputs_of_legalized_nodes_are_cast_back() -> None:
    """Type inference leaves bfloat16 TopK's and int8 MatMul's outputs untyped (the spec refuses the inputs);
    legalization must still type them, or their consumers mix float32 with bfloat16 (an invalid model)."""
    median = Call(lambda x, y: (torch.median(x), torch.median(y)))
    assert_exports_and_matches(median, (torch.tensor(1.5, dtype=torch.bfloat16), values(4, 5, dtype=torch.bfloat16)))
    bilinear = Call(torch.nn.functional.bilinear)
    args = [
        torch.randint(-3, 4, shape, generator=torch.Generator().manual_seed(2))
        for shape in [(2, 3), (2, 4), (5, 3, 4), (5,)]
    ]
    assert_exports_and_matches(bilinear, tuple(a.to(torch.int8) for a in args))


class RepeatInterleaveByTensor(torch.nn.Module):
    def forward(self, x: torch.Tensor, repeats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.repeat_interleave(repeats, dim=1), torch.repeat_interleave(repeats)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_repeat_interleave_by_a_tensor_of_repeats(dtype: torch.dtype) -> None:
    """Data-dependent output size (the sum of repeats); zeros drop columns; all zeros give empty outputs."""
    x = torch.tensor([[1.5, -2.0, 3.0, 0.0], [torch.finfo(torch.float32).max, -0.0, 7.0, 1e-30]]).to(dtype)
    repeats = torch.tensor([2, 0, 3, 1])
    runs = [((x, repeats), {}), ((x, torch.tensor([0, 0, 0, 5])), {}), ((x, torch.zeros(4, dtype=torch.int64)), {})]
    assert_exports_and_matches(RepeatInterleaveByTensor(), (x, repeats), run_with=runs)


# --- found by the fuzzer's wide catalogue (tests/fuzzing.py, seeds from WIDE_FIRST_SEED) ----------------------------
NAN, INF = math.nan, math.inf


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8, torch.bool])
def test_scatter_writes_only_the_leading_part_of_a_larger_source(dtype: torch.dtype) -> None:
    """Seed 10000000: an index [1, 4] with a [3, 4] source ran in ONNX Runtime's ScatterElements, which takes
    updates of the index's shape only (eager writes src's leading part)."""
    x = torch.tensor([[1.0, -0.0, INF, -4.0], [1.0, 4.0, NAN, 3.5], [-3.75, -3.5, 3.0, 1.0]]).to(dtype)
    index = torch.tensor([[0, 1, 2, 0]])
    assert_exports_and_matches(Call(lambda x, index: x.scatter(0, index, x.flip(0))), (x, index))
    assert_exports_and_matches(Call(lambda x, index: x.scatter(1, index[:, :2], x.flip(1))), (x, index))
    assert_exports_and_matches(Call(lambda x, index: x.scatter(1, index[:, :2], -0.0)), (x, index))


def test_scatter_into_a_0d_tensor() -> None:
    x = torch.tensor(torch.iinfo(torch.int8).min, dtype=torch.int8)
    assert_exports_and_matches(Call(lambda x, index: x.scatter(0, index, 127)), (x, torch.tensor(0)))
    assert_exports_and_matches(Call(lambda x, index: x.scatter(0, index, x + 1)), (x, torch.tensor(0)))


@pytest.mark.parametrize("dtype", [torch.int16, torch.float64, torch.bool])
def test_masked_scatter_of_0d_and_bool_tensors(dtype: torch.dtype) -> None:
    """Seed 10000009: ScatterND refuses 0-d data (eager takes it); torchlib's also Cast a bool mask to bool,
    which the checker refused."""
    low = torch.tensor(-32768).to(dtype)
    assert_exports_and_matches(
        Call(lambda mask, x: x.masked_scatter(mask.bool(), x + x)), (low, torch.tensor(6).to(dtype))
    )
    mask = torch.tensor([[True, False, True], [False, False, True]])
    x = torch.tensor([[1.0, NAN, -0.0], [INF, -INF, 2.5]]).to(dtype)
    assert_exports_and_matches(Call(lambda mask, x: x.masked_scatter(mask, x.flip(0))), (mask, x))
    assert_exports_and_matches(Call(lambda mask, x: x.masked_scatter(mask[0], x)), (mask, x))  # broadcast mask
    # seeds 10000282, 10000777: a mask of more dims than self widens the result (eager: the broadcast shape)
    assert_exports_and_matches(Call(lambda mask, x: x[0].masked_scatter(mask, x.flip(1))), (mask, x))
    assert_exports_and_matches(Call(lambda x: x.masked_scatter(x.reshape(1, 1).bool(), x)), (low,))


@pytest.mark.parametrize("alpha", [1, -1, 2])
def test_index_add_over_every_row_keeps_self(alpha: int) -> None:
    """Seed 10000116: index_add is index_put(accumulate=True), a ScatterND with reduction add; onnxscript's
    optimizer replaced a ScatterND whose constant indices cover every row by its updates, ignoring the
    reduction (the result was alpha * src: -2.75 where eager gives 2.75 - 2.75 = 0)."""
    x = torch.tensor([2.75, -0.0, torch.finfo(torch.float32).max])
    model = Call(lambda x: x.index_add(0, torch.tensor([0, 1, 2]), x * 1, alpha=alpha))
    assert_exports_and_matches(model, (x,))
    assert_exports_and_matches(Call(lambda x: x.index_put((torch.tensor([0]),), x * 2, accumulate=True)), (x[:1],))


def test_index_put_over_every_row_still_becomes_its_values() -> None:
    """Without a reduction the rewrite holds (and is kept): the model has no ScatterND left."""
    program = assert_exports_and_matches(
        Call(lambda x, y: x.index_put((torch.tensor([0, 1]),), y)), (torch.ones(2, 3), torch.full((2, 3), -0.0))
    )
    assert "ScatterND" not in {node.op_type for node in program.model_proto.graph.node}


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_searchsorted_and_bucketize_put_nan_after_every_boundary(right: bool, dtype: torch.dtype) -> None:
    """Seed 10000103: eager's binary search puts a NaN value after every boundary (bucket len(boundaries)); the
    lowering's Less count put it in bucket 0."""
    values = torch.tensor([NAN, -INF, INF, -0.0, 0.0, 1.0, 2.5, -NAN]).to(dtype)
    boundaries = torch.tensor([-INF, -0.0, 1.0, 1.0, INF]).to(dtype)
    assert_exports_and_matches(Call(lambda v, b: torch.bucketize(v, b, right=right)), (values, boundaries))
    assert_exports_and_matches(Call(lambda v, b: torch.searchsorted(b, v, right=right)), (values, boundaries))
    rows = boundaries.expand(2, 5).contiguous()
    assert_exports_and_matches(
        Call(lambda v, b: torch.searchsorted(b, v, side="right" if right else "left")), (values.reshape(2, 4), rows)
    )


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize(
    "boundaries",
    [
        [1.0, 2.0, NAN],
        [1.0, NAN, NAN],
        [-1.0, 0.0, 1.0, 2.0, 3.0, NAN],
        [0.0, 1.0, 2.0, 2.0, 4.0, 5.0, 6.0, NAN],
        [NAN],
    ],
)
def test_searchsorted_with_nan_among_the_boundaries_follows_eagers_probes(right: bool, boundaries: list) -> None:
    """Eager's binary search takes a probed NaN boundary as below the value (!(nan >= v)), so where it is probed
    decides: [1, 2, nan] puts -5 in bucket 0 and 2.5 in bucket 3. The count of boundaries below counted the NaN
    below every value (-5: bucket 1). The lowering searches as eager does, step by step."""
    values = torch.tensor([-5.0, 0.5, 1.5, 2.0, 2.5, 10.0, NAN, -INF, INF, 3.0, 5.5])
    sequence = torch.tensor(boundaries)
    assert_exports_and_matches(Call(lambda v, b: torch.bucketize(v, b, right=right)), (values, sequence))
    rows = torch.stack([sequence, sequence.flip(0)])  # unsorted rows too: eager's probes, whatever they meet
    assert_exports_and_matches(
        Call(lambda s, v: torch.searchsorted(s, v, right=right)), (rows, values[:10].reshape(2, 5))
    )
    sorter = torch.argsort(sequence, stable=True)
    assert_exports_and_matches(
        Call(lambda s, v, i: torch.searchsorted(s, v, right=right, sorter=i)), (sequence, values, sorter)
    )


@pytest.mark.parametrize(("start", "length"), [(-2, 2), (-3, 1), (-1, 0), (1, 2), (0, 3)])
def test_narrow_from_a_negative_start(start: int, length: int) -> None:
    """Seed 10000141: narrow(x, -1, -2, 2) sliced from -2 to 0 (empty: the checker refused the model); a negative
    start counts from the end."""
    x = torch.tensor([[-1e-3, 0.5, NAN], [INF, -0.0, 65504.0]], dtype=torch.float16)
    assert_exports_and_matches(Call(lambda x: torch.narrow(x, -1, start, length)), (x,))


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.float16, torch.bfloat16, torch.float32])
def test_masked_scatter_of_no_element(dtype: torch.dtype) -> None:
    """Seeds 10002142, 10003499, 10004004, 10004227: an empty broadcast of self and mask ([0] with [[False]]:
    [1, 0]) was reshaped back with Reshape's 0 meaning 'copy the input's dim', which the checker refused. Seed
    10002201 (bfloat16): ONNX Runtime's ExpandElimination then took the Expand of [[x]] to [1, 0] for a no-op and
    returned [1, 1] (legalize/fusion_guards.py)."""
    extreme = (
        torch.tensor([True]) if dtype == torch.bool else torch.tensor([-math.inf if dtype.is_floating_point else 0])
    )
    low = (
        extreme.to(dtype) if dtype.is_floating_point or dtype == torch.bool else torch.tensor([torch.iinfo(dtype).min])
    )
    x = low.to(dtype).reshape(1, 1)
    scatter = Call(lambda x, mask: x.masked_scatter(mask.bool(), x + x))
    assert_exports_and_matches(scatter, (x[0, :0], torch.tensor([[False]])))  # self [0], mask [1, 1]
    assert_exports_and_matches(scatter, (x, torch.empty(1, 0, dtype=torch.bool)))  # self [1, 1], mask [1, 0]
    assert_exports_and_matches(scatter, (x[:, :0], torch.tensor([True, False])[:1]))  # self [1, 0], mask [1]
    assert_exports_and_matches(scatter, (x.expand(2, 1).clone(), torch.empty(3, 1, 0, dtype=torch.bool)))
    assert_exports_and_matches(Call(lambda x: x.masked_scatter(x[:, :0].bool(), x.flip(0))), (x,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int16])
def test_expand_of_size_one_to_no_element(dtype: torch.dtype) -> None:
    """eager's x.expand(1, 0) of a [1, 1] tensor is [1, 0]; for bfloat16 (its Expand legalized between Casts to
    float32) ONNX Runtime's ExpandElimination removed it (a target dim <= 1 counts as kept) and gave [1, 1]."""
    x = torch.tensor([[3]], dtype=dtype)
    assert_exports_and_matches(Call(lambda x: x.expand(1, 0) * 2), (x,))
    assert_exports_and_matches(Call(lambda x: x.expand(2, 1, 0) + 1), (x,))
    assert_exports_and_matches(Call(lambda x: x.expand(1, 3) * 2), (x,))  # not empty: nothing inserted


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32, torch.bool])
def test_index_fill_of_an_unfolded_view(dtype: torch.dtype) -> None:
    """index_fill of unfold's windows (a strided view) decomposes to prims.copy_strided, a copy with the view's
    strides: the same values (fuzz seed 50000081: it was refused as unsupported)."""

    def fill(x: torch.Tensor) -> torch.Tensor:
        return x.unfold(-1, 5, 2).index_fill(-3, torch.tensor([-1]), True)  # one window of the whole row

    assert_exports_and_matches(Call(fill), (torch.tensor([[-2, 0, -6, 3, 2]]).to(dtype),))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.bool, torch.uint8])
def test_unfold_of_a_0d_tensor(dtype: torch.dtype) -> None:
    """A 0-d tensor unfolds into [x] for a size of 1 and into no element for a size of 0 (fuzz seed 50000349: size 0
    failed the checker)."""
    unfold = Call(lambda x: (x.unfold(0, 0, 1), x.unfold(-1, 0, 3), x.unfold(0, 1, 2)))
    assert_exports_and_matches(unfold, (torch.tensor(1, dtype=dtype),))


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_repeat_interleave_of_no_element(dtype: torch.dtype) -> None:
    """x.repeat_interleave(3, dim) of a tensor with a 0 dim (fuzz seed 50001408: the checker refused torchlib's
    Reshape of the tiled tensor)."""
    x = torch.empty(1, 1, 0, dtype=dtype)
    repeat = Call(lambda v: (v.repeat_interleave(3, dim=-2), v.repeat_interleave(2, dim=2), v.repeat_interleave(2)))
    assert_exports_and_matches(repeat, (x,))


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int8])
def test_gather_and_scatter_by_an_index_of_no_element(dtype: torch.dtype) -> None:
    """An index of no element gathers nothing and writes nothing in eager even where its other dims exceed self's,
    which GatherElements and ScatterElements refuse (x of [3, 0] by a [0, 3] index: a run error before)."""
    x = torch.empty(3, 0, dtype=dtype)
    y = torch.ones(2, 2, dtype=dtype)

    def by_no_index(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows, columns = torch.zeros(0, 3, dtype=torch.int64), torch.zeros(3, 0, dtype=torch.int64)
        return (
            torch.gather(a, 0, rows),
            torch.gather(b, 1, columns),
            torch.scatter_add(a, 0, rows, a),
            a.scatter_reduce(0, rows, a, "amax"),
            b.scatter(1, columns, torch.ones(3, 0, dtype=b.dtype)),
            b.scatter_reduce(1, columns, torch.ones(3, 0, dtype=b.dtype), "sum", include_self=False),
        )

    assert_exports_and_matches(Call(by_no_index), (x, y))


@pytest.mark.parametrize("dtype", [torch.int32, torch.float32])
def test_roll_of_a_length_zero_at_run_time(dtype: torch.dtype) -> None:
    """roll of masked_select's result, which selects nothing at run time: the shift modulo a length of 0 (fuzz seed
    50002633: torchlib's Mod divided by zero, a run error)."""
    some, none = torch.tensor([-3, 4, 5, -1, 7]).to(dtype), torch.tensor([-3, -1, 0, -2, -5]).to(dtype)
    roll = Call(lambda v: (torch.roll(torch.masked_select(v, v > 0), (-13,), (0,)), torch.roll(v[v > 0], 2)))
    assert_exports_and_matches(roll, (some,), run_with=[((some,), {}), ((none,), {})])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.bool])
@pytest.mark.parametrize("rows", [0, 1, 3])
def test_copy_into_a_view_broadcasts_its_source(dtype: torch.dtype, rows: int) -> None:
    """t[1:].copy_(t[0]) broadcasts the row over the slice (copy then slice_scatter): torchlib's copy kept the
    source's shape and ONNX Runtime's ScatterND refused the update (fuzz seeds 60000391, 60000551: an empty slice)."""

    def written(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = x.clone()
        t[1:].copy_(t[0].clone())
        u = x.clone()
        u[:, :1].copy_(y)  # a 0-d source of another dtype
        return t, u

    x = (torch.arange(2 * (rows + 1)).reshape(rows + 1, 2) % 3).to(dtype)
    assert_exports_and_matches(Call(written), (x, torch.tensor(1.5)))
