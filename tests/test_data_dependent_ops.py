"""Ops whose result depends on the data's values beyond elementwise arithmetic: histc's range from the data, the
split points of tensor_split from a tensor, input validation on values (gaussian_nll_loss), each against eager."""

from __future__ import annotations

import math
import pathlib
import warnings
from typing import Any

import onnxruntime
import pytest
import torch

import fx2onnx
from fx2onnx.errors import CaptureError

from conftest import Call, assert_exports_and_matches

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _histc(bins: int, low: float, high: float) -> Call:
    return Call(lambda x: torch.histc(x, bins=bins, min=low, max=high))


@pytest.mark.parametrize("dtype", FLOATS)
def test_histc_min_equal_max_bins_the_data_range(dtype: torch.dtype) -> None:
    """min == max: eager bins between the data's own min and max (MoE routing: tokens per expert)."""
    experts = torch.tensor([0, 3, 3, 1, 7, 7, 7, 2, 5, 0, 3], dtype=dtype)
    assert_exports_and_matches(_histc(8, 0, 0), (experts,))
    normal = torch.randn(3, 40, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert_exports_and_matches(_histc(5, 2, 2), (normal,))
    # all equal: widened by 1 each way, so every value lands in the middle bin
    assert_exports_and_matches(_histc(3, 0, 0), (torch.full((6,), 4.0, dtype=dtype),))
    info = torch.finfo(dtype)
    extremes = torch.tensor([info.max, info.max / 2, info.tiny, -info.tiny, 0.0, info.max / 3], dtype=dtype)
    assert_exports_and_matches(_histc(6, 0, 0), (extremes,))
    assert_exports_and_matches(_histc(4, 0, 0), (torch.tensor([-info.max, -info.max / 4, -1.0], dtype=dtype),))


@pytest.mark.parametrize("dtype", FLOATS)
def test_histc_given_range(dtype: torch.dtype) -> None:
    """Outside the range and NaN skipped, the right edge in the last bin, edges rounded to the dtype."""
    nan, inf = float("nan"), float("inf")
    values = torch.tensor([nan, -1.0, 1.0, 0.3, 2.0, -5.0, inf, -inf, 0.1, 0.7, -0.2], dtype=dtype)
    assert_exports_and_matches(_histc(10, -1, 1), (values,))
    assert_exports_and_matches(_histc(7, 0.1, 0.7), (values,))
    assert_exports_and_matches(_histc(4, 0, 0), (torch.zeros(0, dtype=dtype),))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.filterwarnings("ignore:data-dependent code in the model")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_gaussian_nll_loss(dtype: torch.dtype, reduction: str) -> None:
    """Its check of the variance (``if torch.any(var < 0): raise``) is input validation: captured as valid."""
    generator = torch.Generator().manual_seed(1)
    mean, target = (torch.randn(4, 3, generator=generator).to(dtype) for _ in range(2))
    variance = torch.rand(4, 3, generator=generator).to(dtype)
    variance[0, :2] = torch.tensor([0.0, 1e-7])  # clamped to eps
    variance[1, 0] = torch.finfo(dtype).max
    loss = Call(lambda m, t, v: torch.nn.functional.gaussian_nll_loss(m, t, v, full=True, reduction=reduction))
    assert_exports_and_matches(loss, (mean, target, variance))
    homoscedastic = Call(lambda m, t, v: torch.nn.functional.gaussian_nll_loss(m, t, v, reduction=reduction))
    assert_exports_and_matches(homoscedastic, (mean, target, variance[:, 0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8, torch.uint8, torch.bool, torch.int64])
def test_tensor_split_at_a_tensor_of_indices_read_at_run_time(dtype: torch.dtype) -> None:
    x = torch.arange(5 * 6 * 7).reshape(5, 6, 7).to(dtype)
    program = assert_exports_and_matches(Call(lambda t, i: torch.tensor_split(t, i, 1)), (x, torch.tensor([1, 4, 5])))
    # other split points, out of order, negative and past the end: eager's slices (empty ones included)
    for indices in ([0, 6, 2], [-1, 3, 9], [-7, -2, 2], [6, 6, 6]):
        results = program.verify(x, torch.tensor(indices))
        assert all(result.passed for result in results), [str(result) for result in results]
    assert_exports_and_matches(Call(lambda t, i: torch.tensor_split(t, i)), (x, torch.tensor([], dtype=torch.long)))


def _with_extremes(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Values of `dtype` from its lowest to its highest (and inf/NaN for floats), so that a part that moved shows."""
    count = math.prod(shape)
    if dtype == torch.bool:
        return (torch.arange(count) % 3 == 0).reshape(shape)
    if dtype.is_complex:
        real = _with_extremes(shape, torch.float32)
        return torch.complex(real, real.flip(0)).to(dtype)
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    ends = [info.min, info.max] + ([math.inf, -math.inf, math.nan, info.tiny] if dtype.is_floating_point else [])
    values = torch.arange(count, dtype=torch.float64) - count // 2
    kept = min(count, len(ends))
    values[:kept] = torch.tensor(ends[:kept], dtype=torch.float64)
    return values.to(dtype).reshape(shape)


SPLIT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.bool, torch.int64]


@pytest.mark.parametrize("dtype", [*SPLIT_DTYPES, torch.complex64])
def test_tensor_split_into_a_tensor_number_of_sections_takes_the_examples_count(dtype: torch.dtype) -> None:
    """The number of sections is the number of outputs, which the ONNX graph fixes: the example's, said in a
    warning; each split point is computed from the size, and the model fails in ONNX Runtime on another count."""
    x = _with_extremes((7, 5), dtype)
    model = Call(lambda t, n: (torch.tensor_split(t, n), t.tensor_split(n, dim=-1)))
    with pytest.warns(UserWarning, match=r"tensor_split's number of sections .* taken as 3, the example's"):
        program = assert_exports_and_matches(model, (x, torch.tensor(3)))
    assert len(program(x, torch.tensor(3))) == 6
    (assumption,) = program.report.capture_assumptions  # both calls are on one line: one assumption
    assert "taken as 3, the example's" in assumption and "torch.tensor_split(t, n)" in assumption
    assert "taken as 3, the example's" in program.report.to_markdown()
    for other in (2, 4, 0, -3):
        with pytest.raises(Exception, match="fx2onnx_check_tensor_split_sections_is_3"):
            program(x, torch.tensor(other))


def test_tensor_split_into_a_tensor_number_of_sections_along_a_dynamic_dim() -> None:
    """Section sizes from the run-time length (the first length % n one longer), empty sections included."""
    model = Call(lambda t, n: torch.tensor_split(t, n, 1))
    x = _with_extremes((2, 8), torch.float32)
    with pytest.warns(UserWarning, match="taken as 3"):
        program = assert_exports_and_matches(model, (x, torch.tensor(3)), dynamic_shapes=(({1: "length"}, None),))
    for length in (0, 1, 2, 3, 4, 10):
        results = program.verify(_with_extremes((2, length), torch.float32), torch.tensor(3))
        assert all(result.passed for result in results), [str(result) for result in results]


def test_tensor_split_into_a_tensor_number_of_sections_computed_in_the_model() -> None:
    """A count computed from a constant tensor in the model, and two calls with different counts: each its own."""

    def split_twice(t: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (*torch.tensor_split(t, n + 1), *torch.tensor_split(t, torch.tensor(2), 1))

    x = _with_extremes((6, 4), torch.int32)
    with pytest.warns(UserWarning, match="taken as 4"):
        program = assert_exports_and_matches(Call(split_twice), (x, torch.tensor(3)))
    assert len(program(x, torch.tensor(3))) == 6
    with pytest.raises(Exception, match="fx2onnx_check_tensor_split_sections_is_4"):
        program(x, torch.tensor(4))


def _ctc(**options: object) -> Call:
    return Call(lambda lp, t, il, tl: torch.nn.functional.ctc_loss(lp, t, il, tl, **options))


def _log_probs(steps: int, batch: int, classes: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(steps, batch, classes, generator=generator, dtype=dtype).mul(3).log_softmax(2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_padded_targets(dtype: torch.dtype, reduction: str, zero_infinity: bool) -> None:
    """Sequences of every kind: full length, shorter input, an impossible alignment (inf), empty target and empty
    input, repeated labels (no skip between equal labels), a label of probability 0 (-inf log-probability)."""
    log_probs = _log_probs(12, 6, 5, dtype)
    log_probs[:, 5, 3] = -math.inf
    targets = torch.tensor([[1, 2, 2, 3, 4], [4, 4, 4, 1, 1], [1, 2, 3, 4, 1], [2, 3, 1, 1, 1], [3, 3, 1, 2, 4]] * 2)[
        :6
    ]
    targets[5] = torch.tensor([3, 1, 1, 2, 2])
    input_lengths = torch.tensor([12, 7, 3, 0, 12, 9])
    target_lengths = torch.tensor([5, 5, 4, 0, 0, 2])
    loss = _ctc(reduction=reduction, zero_infinity=zero_infinity)
    program = assert_exports_and_matches(loss, (log_probs, targets, input_lengths, target_lengths))
    # other lengths at run time, int32 as eager accepts
    other = (log_probs, targets, torch.tensor([1, 12, 11, 4, 6, 12]), torch.tensor([1, 2, 5, 2, 5, 0]))
    results = program.verify(*other)
    assert all(result.passed for result in results), [str(result) for result in results]
    blank_last = Call(
        lambda lp, t: torch.nn.functional.ctc_loss(lp, t, [12, 10, 12, 1, 12, 5], [5, 3, 4, 1, 0, 2], blank=4)
    )
    assert_exports_and_matches(blank_last, (log_probs, targets.clamp(max=3)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ctc_loss_concatenated_and_unbatched_targets(dtype: torch.dtype) -> None:
    log_probs = _log_probs(9, 3, 4, dtype, seed=1)
    concatenated = torch.tensor([1, 2, 3, 3, 1, 2], dtype=torch.int32)  # lengths 3, 0, 3
    lengths = (torch.tensor([9, 4, 6], dtype=torch.int32), torch.tensor([3, 0, 3], dtype=torch.int32))
    assert_exports_and_matches(_ctc(reduction="none"), (log_probs, concatenated, *lengths))
    assert_exports_and_matches(_ctc(reduction="mean"), (log_probs[:, 0], concatenated[:3], *(t[0] for t in lengths)))
    # no labels at all (one state, the blank): padded (3, 0) and concatenated (0,) targets
    no_lengths = (torch.tensor([9, 1, 0]), torch.tensor([0, 0, 0]))
    assert_exports_and_matches(_ctc(reduction="none"), (log_probs, torch.zeros(3, 0, dtype=torch.long), *no_lengths))
    assert_exports_and_matches(_ctc(reduction="sum"), (log_probs, torch.zeros(0, dtype=torch.long), *no_lengths))


@pytest.mark.filterwarnings("ignore:dynamic_shapes asked for more")
def test_ctc_loss_with_dynamic_time_and_batch() -> None:
    steps, batch = torch.export.Dim("steps", min=2, max=100), torch.export.Dim("batch", min=2, max=64)
    targets = torch.tensor([[1, 2, 3, 4, 5], [5, 5, 1, 2, 3], [2, 2, 2, 2, 2], [1, 3, 1, 3, 1]])
    args = (_log_probs(12, 4, 6, torch.float32), targets, torch.tensor([12, 10, 3, 1]), torch.tensor([5, 2, 4, 0]))
    dynamic = (({0: steps, 1: batch}, {0: batch}, {0: batch}, {0: batch}),)
    program = assert_exports_and_matches(_ctc(reduction="none"), args, dynamic_shapes=dynamic)
    longer = _log_probs(30, 3, 6, torch.float32, seed=2)
    results = program.verify(longer, targets[:3], torch.tensor([30, 17, 5]), torch.tensor([5, 3, 1]))
    assert all(result.passed for result in results), [str(result) for result in results]


class SparseMatmulReduce(torch.nn.Module):
    def __init__(self, reduce: str = "amax") -> None:
        super().__init__()
        self.reduce = reduce

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(sparse, dense, self.reduce)


class DenseTimesSparse(torch.nn.Module):
    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return torch.mm(dense, sparse)


class MatmulReduceOnCsrParts(torch.nn.Module):
    """The way out the error gives: a CSR matrix's parts as three inputs, the reduce written with index ops."""

    def __init__(self, reduce: str) -> None:
        super().__init__()
        self.reduce = reduce

    def forward(self, crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        rows = torch.repeat_interleave(torch.arange(crow.numel() - 1), crow.diff(), output_size=col.numel())
        terms = values.unsqueeze(1) * dense[col]
        out = torch.zeros(crow.numel() - 1, dense.shape[1], dtype=dense.dtype)
        if self.reduce == "sum":
            return out.index_add(0, rows, terms)
        return out.index_reduce(0, rows, terms, self.reduce, include_self=False)


def _csr() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse CSR support is in beta
        return torch.tensor([[0.0, 2, 0], [1, 0, -3], [0, 0, 0], [4, 5, 6]]).to_sparse_csr()


def test_a_sparse_input_read_by_another_op_is_refused_naming_it_the_op_and_the_way_out() -> None:
    with pytest.raises(CaptureError) as raised:
        fx2onnx.export(DenseTimesSparse(), (_csr(), torch.randn(2, 4)))
    message = str(raised.value)
    assert "input `sparse` is a sparse tensor (torch.sparse_csr" in message and "aten::mm" in message
    assert "torch.mm(dense, sparse)" in message and "crow_indices()" in message


def _coo(coalesced: bool) -> torch.Tensor:
    """A 4x3 COO matrix; uncoalesced: a position stored twice (its values add up) and out of order."""
    if coalesced:
        return torch.tensor([[0.0, 2, 0], [1, 0, -3], [0, 0, 0], [4, 5, 6]]).to_sparse()
    indices = torch.tensor([[3, 0, 1, 3, 1, 3], [2, 1, 0, 0, 2, 2]])
    return torch.sparse_coo_tensor(indices, torch.tensor([6.0, 2, 1, 4, -3, 0.5]), (4, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("layout", "product"),
    [
        ("coo", lambda s, d: torch.sparse.mm(s, d)),
        ("coo-uncoalesced", lambda s, d: s @ d),
        ("coo", lambda s, d: torch.mm(s, d)),
        ("csr", lambda s, d: torch.mm(s, d)),
        ("csr", lambda s, d: torch.sparse.mm(s, d)),
    ],
)
def test_sparse_times_dense_takes_a_sparse_input_as_its_parts(layout: str, product: Any, dtype: torch.dtype) -> None:
    matrix = (_csr() if layout == "csr" else _coo(layout == "coo")).to(dtype)
    dense = torch.tensor([[1e30, -1.5], [-1e30, 0.25], [3.0, -7.0]], dtype=dtype)
    program = assert_exports_and_matches(Call(product), (matrix, dense))
    parts = ("crow_indices", "col_indices", "values") if layout == "csr" else ("indices", "values")
    assert [value.name for value in program.model.graph.inputs][:-1] == [f"args_0_{part}" for part in parts]
    fewer = torch.tensor([[0.0, 2, 0], [0, 0, 0], [0, 0, 0], [4, 5, 6]], dtype=dtype)  # 4 stored elements, not 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse CSR support is in beta
        fewer = fewer.to_sparse_csr() if layout == "csr" else fewer.to_sparse()
    results = program.verify(fewer, dense)
    assert all(result.passed for result in results), [str(result) for result in results]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_sparse_matmul_reduce_takes_a_sparse_csr_input_as_its_parts(reduce: str, dtype: torch.dtype) -> None:
    """The CSR input becomes three graph inputs; the program splits the sparse tensor it is given (a row with no
    stored element included). Values near the dtype's largest, so that a sum rounded in the dtype would differ."""
    matrix = _csr().to(dtype)
    large = torch.finfo(dtype).max / 8
    dense = torch.tensor([[large, -1.5], [-large, 0.25], [3.0, -large]], dtype=dtype)
    program = assert_exports_and_matches(SparseMatmulReduce(reduce), (matrix, dense))
    names = [value.name for value in program.model.graph.inputs]
    assert names == ["sparse_crow_indices", "sparse_col_indices", "sparse_values", "dense"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse CSR support is in beta
        other = torch.tensor([[0.0, 0, 7], [1, 0, -3], [2, 0, 0], [4, 5, 6]], dtype=dtype).to_sparse_csr()
        empty = torch.zeros(4, 3, dtype=dtype).to_sparse_csr()
    for matrix in (other, empty):  # other values, positions and numbers of stored elements
        results = program.verify(matrix, dense)
        assert all(result.passed for result in results), [str(result) for result in results]


def test_a_saved_model_takes_a_sparse_inputs_parts_by_name(tmp_path: pathlib.Path) -> None:
    matrix, dense = _csr(), torch.randn(3, 2, generator=torch.Generator().manual_seed(5))
    program = fx2onnx.export(SparseMatmulReduce("sum"), (matrix, dense))
    path = tmp_path / "model.onnx"
    program.save(path)
    session = onnxruntime.InferenceSession(path)
    feed = {f"sparse_{part}": getattr(matrix, part)().numpy() for part in ("crow_indices", "col_indices", "values")}
    (result,) = session.run(None, {**feed, "dense": dense.numpy()})
    torch.testing.assert_close(torch.from_numpy(result), torch.sparse.mm(matrix, dense, "sum"))


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_sparse_matmul_reduce_on_csr_parts_matches_eager(reduce: str) -> None:
    matrix, dense = _csr(), torch.randn(3, 2, generator=torch.Generator().manual_seed(3))
    parts = (matrix.crow_indices().clone(), matrix.col_indices().clone(), matrix.values().clone(), dense)
    program = assert_exports_and_matches(MatmulReduceOnCsrParts(reduce), parts)
    (result,) = program(*parts)
    torch.testing.assert_close(result, torch.sparse.mm(matrix, dense, reduce), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dim", [0, 1])
def test_unique_of_bool_along_a_dim(dim: int) -> None:
    """ONNX Runtime has no bool Unique: it runs in uint8 (False < True as 0 < 1), the values cast back (fuzz seeds
    50000408, 50000859: refused by legalization)."""
    x = torch.tensor([[False, True, False], [True, True, True], [False, True, False]])
    unique = Call(
        lambda v: (
            torch.unique(v, sorted=True, dim=dim, return_inverse=True, return_counts=True),
            torch.unique(v, return_counts=True),
        )
    )
    assert_exports_and_matches(unique, (x,))
