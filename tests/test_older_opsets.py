"""opset_version 11 to 17: exported at 18, adapted op by op (fx2onnx/_finalize/opset_down/), run in ONNX Runtime.

Each model is compared with eager in a default ONNX Runtime session (the `check` fixture); the saved model's opset
is the one asked for and passes the full ONNX checker at it. An op the older opset cannot express is refused with
its name, the opset it needs and the user's line, and no file is written.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch

import fx2onnx
from fx2onnx import examples

from conftest import Call

OLDER = [11, 12, 13, 14, 15, 16, 17]


def _opset_of(program: fx2onnx.ONNXProgram) -> int:
    return program.model.opset_imports[""]


def _op_types(program: fx2onnx.ONNXProgram) -> set[str]:
    return {node.op_type for node in program.model_proto.graph.node}


class Norms(torch.nn.Module):
    """LayerNormalization-17, Reduce*-18 (mean, max, amax, prod, logsumexp), Split-18 by num_outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(12)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, b, c = x.chunk(3, dim=-1)
        return (
            self.norm(x),
            x.mean(-1),
            x.amax(1, keepdim=True),
            a.prod(-1),
            torch.logsumexp(b, dim=0),
            c.norm(dim=-1),
            x.var(-1),
        )


@pytest.mark.parametrize("opset", OLDER)
def test_reductions_splits_and_layer_norm(check, opset: int) -> None:
    program = check(Norms(), (torch.randn(2, 5, 12),), opset_version=opset)
    assert _opset_of(program) == opset
    if opset < 17:
        assert "LayerNormalization" not in _op_types(program)


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_layer_norm_in_reduced_and_double_precision(check, opset: int, dtype: torch.dtype) -> None:
    model = torch.nn.LayerNorm(64).to(dtype)
    x = torch.randn(3, 64, dtype=dtype) * 100
    # large values whose squares overflow float16 (not float32): eager and the spelt-out form compute in float32
    x[0, :4] = {torch.float16: 8000.0, torch.bfloat16: 1e18, torch.float64: 1e150}[dtype]
    program = check(model, (x,), opset_version=opset)
    assert _opset_of(program) == opset


class Masks(torch.nn.Module):
    """Trilu-14 (causal masks), HardSwish-14, Mish-18, CastLike-15, Pad-18, constant padding."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        square = x[..., : x.shape[-2]]
        return (
            torch.tril(square),
            torch.triu(square, diagonal=1),
            torch.tril(torch.ones(4, 6, dtype=torch.bool), diagonal=-1),
            torch.nn.functional.hardswish(x),
            torch.nn.functional.mish(x),
            torch.nn.functional.pad(x, (1, 2, 0, 1), value=-3.0),
            x.to(torch.int32).to(x.dtype),
        )


@pytest.mark.parametrize("opset", OLDER)
def test_masks_activations_and_padding(check, opset: int) -> None:
    x = torch.randn(2, 4, 6) * 4
    x[0, 0, 0] = float("inf")
    x[1, 1, 1] = float("-inf")
    program = check(Masks(), (x,), opset_version=opset)
    assert _opset_of(program) == opset
    if opset < 14:
        assert not {"Trilu", "HardSwish"} & _op_types(program)


@pytest.mark.parametrize("opset", [13, 15, 17])
def test_int_and_bool_ops_whose_types_widened_later(check, opset: int) -> None:
    """Add/Mul on int8 (types added at 14), Where on bfloat16 (16), Pow on bfloat16 (15): legalize casts at the
    target opset what it has no kernel or schema for, the dtypes at the boundary stay eager's."""

    def forward(a: torch.Tensor, b: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a + b, a * b, torch.where(a > 0, h, h * 2), h.pow(2), (a > 0) & (b > 0)

    a = torch.tensor([[-128, 127, 3], [5, -7, 0]], dtype=torch.int8)
    b = torch.tensor([[1, 1, -2], [100, 20, 0]], dtype=torch.int8)
    h = torch.tensor([[1.5, -2.25, 3e38], [0.0, -0.0, 7.0]], dtype=torch.bfloat16)
    program = check(Call(forward), (a, b, h), opset_version=opset)
    assert _opset_of(program) == opset


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_dynamic_shapes_survive(check, opset: int) -> None:
    batch = torch.export.Dim("batch")
    program = check(
        Norms(),
        (torch.randn(2, 5, 12),),
        dynamic_shapes=({0: batch},),
        run_with=[((torch.randn(4, 5, 12),), {})],
        opset_version=opset,
    )
    assert _opset_of(program) == opset


@pytest.mark.parametrize("opset", [11, 12, 13, 17])
@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_transformers_models(check, family: str, opset: int) -> None:
    args, kwargs = examples.transformers_inputs(family, "small")
    program = check(examples.transformers_model(family, "small"), args, kwargs, opset_version=opset)
    assert _opset_of(program) == opset


def test_op_the_target_cannot_express_is_refused_without_a_file(tmp_path: Path) -> None:
    def forward(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.grid_sample(x, grid, align_corners=False)  # 5-D: GridSample-20 only

    path = tmp_path / "model.onnx"
    args = (torch.randn(1, 2, 4, 4, 4), torch.rand(1, 3, 3, 3, 3) * 2 - 1)
    with pytest.raises(fx2onnx.ExportError) as raised:
        fx2onnx.export(Call(forward), args, str(path), opset_version=15)
    message = str(raised.value)
    assert "GridSample of a 5-D input needs opset 16" in message and "opset_version=18" in message
    assert "test_older_opsets.py" in message  # the user's line
    assert not path.exists()


@pytest.mark.parametrize("opset", [26, 999])
def test_opsets_outside_the_range_are_refused(opset: int) -> None:
    if opset <= fx2onnx.max_opset():
        pytest.skip("onnxruntime here accepts it")
    with pytest.raises(fx2onnx.ExportError, match=r"choose from 11 to"):
        fx2onnx.export(Norms(), (torch.randn(2, 5, 12),), opset_version=opset)


def test_saved_model_holds_the_target_schemas(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    fx2onnx.export(Masks(), (torch.randn(2, 4, 6),), str(path), opset_version=13)
    model = onnx.load(str(path))
    assert [(o.domain, o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")] == [("", 13)]
    onnx.checker.check_model(model, full_check=True)
    for node in model.graph.node:
        assert onnx.defs.get_schema(node.op_type, 13, node.domain).since_version <= 13


class Flatten(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2) * 2


def test_flatten_of_a_dynamic_dim_at_opset_13(check) -> None:
    """torchlib's flatten is Reshape with allowzero=1 (opset 14); at 13 it goes without, and an empty batch still
    matches eager (its 0 copies the input's own empty dim)."""
    batch = torch.export.Dim("batch", min=0)
    program = check(
        Flatten(),
        (torch.randn(2, 3, 4, 5),),
        dynamic_shapes=({0: batch},),
        run_with=[((torch.randn(4, 3, 4, 5),), {}), ((torch.randn(0, 3, 4, 5),), {})],
        opset_version=13,
    )
    assert _opset_of(program) == 13 and "Reshape" in _op_types(program)


class Upsample(torch.nn.Module):
    """float16 bilinear upsampling: Resize-18 over the two spatial axes only, spread over all four below 18."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.nn.functional.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False),
            torch.nn.functional.interpolate(x, size=(5, 7), mode="nearest"),
        )


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_resize_over_some_axes(check, opset: int, dtype: torch.dtype) -> None:
    batch = torch.export.Dim("batch")
    program = check(
        Upsample(),
        (torch.randn(2, 3, 4, 6, dtype=dtype),),
        dynamic_shapes=({0: batch},),
        run_with=[((torch.randn(3, 3, 4, 6, dtype=dtype),), {})],
        opset_version=opset,
    )
    assert _opset_of(program) == opset


def _integer_extremes(dtype: torch.dtype) -> torch.Tensor:
    info = torch.iinfo(dtype)
    return torch.tensor([info.min, info.min + 1, -1, 0, 1, 5, info.max - 1, info.max], dtype=dtype)


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_bitwise_ops_of_integers_at_their_extremes(check, opset: int) -> None:
    """BitwiseNot, And, Or, Xor (new at 18) of every integer type at both ends (each pair of its extremes), and
    torchlib's arithmetic right shift of a signed integer, which goes through BitwiseNot."""

    def forward(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        results: list[torch.Tensor] = []
        for a in values:
            b = a.flip(0).unsqueeze(1)
            results += [~a, a & b, a | b, a ^ b]
        return (*results, values[0] >> 3, values[2] >> 1, ~(values[0] > 0))

    dtypes = (torch.int64, torch.int32, torch.int8, torch.uint8, torch.int16)
    program = check(Call(forward), tuple(_integer_extremes(dtype) for dtype in dtypes), opset_version=opset)
    assert _opset_of(program) == opset and not {"BitwiseNot", "BitwiseAnd", "BitwiseOr"} & _op_types(program)


class Spectra(torch.nn.Module):
    """DFT-17 (forward, inverse, one-sided, with a length shorter and longer than the signal) along inner axes."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        spectrum = torch.fft.rfft(x)
        window = torch.hann_window(16, dtype=x.dtype)
        return (
            torch.view_as_real(spectrum),
            torch.fft.irfft(spectrum, n=x.shape[-1]),
            torch.view_as_real(torch.fft.fft(spectrum, n=6, norm="ortho")),
            torch.view_as_real(torch.fft.ifft(spectrum, n=11)),
            torch.fft.rfft2(x.reshape(x.shape[0], 8, -1)).abs(),
            torch.stft(x, 16, hop_length=4, window=window, return_complex=True).abs(),
        )


@pytest.mark.parametrize("opset", [11, 13, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dft_below_17_as_a_matrix_product(check, opset: int, dtype: torch.dtype) -> None:
    # signals of large and small magnitudes: the exact zeros of eager's bins (a real signal's imaginary parts at 0
    # and size / 2) stay zeros, not a rounding of sin(pi) times 1e30 (opset 17's DFT in ONNX Runtime misses them)
    scale = 1e30 if dtype == torch.float32 else 1e150  # the squares of complex abs stay finite
    # seeded: irfft's float32 rounding of an arbitrary signal at 1e30 reaches rtol at about one draw in six
    seeded = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, dtype=dtype, generator=seeded) * torch.tensor([[scale], [1 / scale]], dtype=dtype)
    batch = torch.export.Dim("batch")
    program = check(
        Spectra(),
        (x,),
        dynamic_shapes=({0: batch},),
        run_with=[((x,), {}), ((torch.randn(3, 64, dtype=dtype, generator=seeded),), {})],
        opset_version=opset,
    )
    assert _opset_of(program) == opset and "DFT" not in _op_types(program)


def test_dft_too_long_for_a_matrix_is_refused() -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(x).abs()

    with pytest.raises(fx2onnx.ExportError, match=r"(?s)DFT.*4096 points.*opset_version=18"):
        fx2onnx.export(Call(forward), (torch.randn(2, 4096),), opset_version=16)


def _grid_with_extremes() -> torch.Tensor:
    """Coordinates inside, on the corners, outside, and NaN, ±inf, ±1e30 in either coordinate."""
    grid = torch.rand(2, 5, 6, 2, generator=torch.Generator().manual_seed(0)) * 3 - 1.5
    extremes = torch.tensor([float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 1.0])
    grid[0, 0, :, 0] = extremes
    grid[0, 1, :, 1] = extremes
    grid[1, 0] = torch.tensor([[-1.0, -1], [1, 1], [0, 0], [-1 / 3, 1 / 3], [0.5, -0.5], [0.75, 0.25]])
    return grid


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_spelt_out_below_16(check, mode: str, padding_mode: str, align_corners: bool) -> None:
    def forward(x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.grid_sample(
            x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners
        )

    x = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(1))
    x[1, 0, 2, 2], x[1, 1, 0, 0] = float("inf"), float("nan")  # next to points weighted 0
    program = check(Call(forward), (x, _grid_with_extremes()), opset_version=13)
    assert _opset_of(program) == 13 and "GridSample" not in _op_types(program)


class GridSample(torch.nn.Module):
    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.grid_sample(x, grid, align_corners=False)


def test_grid_sample_of_dynamic_sizes_at_15(check) -> None:
    batch, height, width, rows = (torch.export.Dim(name) for name in ("batch", "height", "width", "rows"))
    x, grid = torch.randn(2, 3, 4, 5), _grid_with_extremes()
    other = (torch.randn(3, 3, 7, 2), torch.rand(3, 4, 6, 2) * 2 - 1)
    program = check(
        GridSample(),
        (x, grid),
        dynamic_shapes=({0: batch, 2: height, 3: width}, {0: batch, 1: rows}),
        run_with=[((x, grid), {}), (other, {})],
        opset_version=15,
    )
    assert _opset_of(program) == 15


class Fold(torch.nn.Module):
    """Col2Im-18: overlapping blocks with strides, dilations and padding; non-overlapping patches; unfold's inverse."""

    def forward(self, x: torch.Tensor, patches: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        fold = torch.nn.functional.fold
        unfolded = torch.nn.functional.unfold(image, 3, padding=1, stride=2)
        return (
            fold(x, (7, 6), (2, 3), dilation=(1, 2), padding=(1, 0), stride=(2, 1)),
            fold(patches, (8, 8), 4, stride=4),
            fold(unfolded, (5, 7), 3, padding=1, stride=2),
        )


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_fold_below_18_adds_as_torch_does(check, opset: int) -> None:
    x = torch.randn(2, 12, 8)
    x[0, 1, 2], x[1, 3, 3], x[0, 5, 5] = float("inf"), float("nan"), -0.0  # no 0 * inf, NaN where eager has it
    args = (x, torch.randn(2, 32, 4), torch.randn(2, 3, 5, 7))
    program = check(Fold(), args, opset_version=opset)
    assert _opset_of(program) == opset and "Col2Im" not in _op_types(program)
    for got, want in zip(program(*args), Fold()(*args), strict=True):  # the same sums in the same order
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


class Accumulate(torch.nn.Module):
    """ScatterElements and ScatterND with reduction add and mul (new at 16), max and min (18): scatter_add,
    index_add, index_put with accumulate, index_reduce, scatter_reduce, with repeated indices."""

    def forward(self, x: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        across = x.T.scatter_add(1, index.expand(x.shape[1], -1), rows.T)  # along the last axis
        spread = index.unsqueeze(1).expand(-1, x.shape[1])
        whole = rows.nan_to_num(nan=0.0, posinf=7.0, neginf=-7.0)  # integers without casts of NaN or inf
        return (
            x.scatter_add(0, spread, rows),
            across,
            x.scatter_reduce(0, spread, rows, "amax"),
            x.scatter_reduce(0, spread, rows, "amin", include_self=False),
            x.to(torch.int64).scatter_reduce(0, spread, whole.to(torch.int64), "amax"),
            x.index_add(0, index, rows),
            x.index_put((index,), rows, accumulate=True),
            x.index_put((index, index % x.shape[1]), rows[:, 0], accumulate=True),
            x.index_reduce(0, index, rows, "prod"),
            x.to(torch.int32).index_add(0, index, whole.to(torch.int32)),
        )


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_scatter_reductions_below_their_opset_in_eager_order(check, opset: int) -> None:
    x = torch.randn(5, 4)
    index = torch.tensor([0, 3, 3, 1, 3, 0])
    # float32 sums whose value depends on their order (1e8 + 3 - 1e8), an inf, a NaN, and exact integers
    rows = torch.tensor([[1e8, 2.0, -1, 4], [3, float("inf"), 5, 6], [-1e8, 7, 8, 9], [2, 3, float("nan"), 5]] * 2)[:6]
    count = torch.export.Dim("count", max=64)
    program = check(
        Accumulate(),
        (x, index, rows),
        dynamic_shapes=(None, {0: count}, {0: count}),
        run_with=[((x, index, rows), {}), ((x, index[:5], rows[:5] * 3), {})],
        opset_version=opset,
    )
    assert _opset_of(program) == opset
    for got, want in zip(program(x, index, rows), Accumulate()(x, index, rows), strict=True):
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


# --- opsets 11 and 12: what opset 13 changed (axes and split sizes as inputs, Softmax along one axis) ----------


class SmallCNN(torch.nn.Module):
    """A classifier as tutorials export it at opset 11: convolutions, batch norm, pooling, softmax over the channels
    (Softmax-11 flattens at its axis: not the same along dim 1), chunk and split, squeeze and unsqueeze, sums."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 12, 3, padding=1),
            torch.nn.BatchNorm2d(12),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(12, 12, 3, padding=1),
        )
        self.classifier = torch.nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.features(x)
        attention = torch.softmax(y, dim=1)
        low, middle, high = y.chunk(3, dim=1)
        first, rest = torch.split(y, [5, 7], dim=1)
        pooled = (y * attention).sum(dim=(2, 3))
        logits = self.classifier(pooled)
        return (
            torch.softmax(logits, dim=-1),
            torch.log_softmax(y, dim=2),
            attention,
            torch.nn.functional.softmin(y, dim=0),
            low.mean(1).unsqueeze(1).squeeze(0) + middle.amax(1, keepdim=True)[0] - high.sum(1, keepdim=True)[0],
            first.sum(dim=(0, 2)),
            rest.squeeze(-1).unsqueeze(-1).sum(),
            y.sum(),
            logits.argmax(-1),
        )


@pytest.mark.parametrize("opset", [11, 12])
def test_small_cnn_with_softmax_over_channels(check, opset: int) -> None:
    batch = torch.export.Dim("batch")
    program = check(
        SmallCNN(),
        (torch.randn(2, 3, 8, 8),),
        dynamic_shapes=({0: batch},),
        run_with=[((torch.randn(2, 3, 8, 8),), {}), ((torch.randn(3, 3, 8, 8),), {})],
        opset_version=opset,
    )
    assert _opset_of(program) == opset
    for node in program.model_proto.graph.node:
        if node.op_type in ("Softmax", "LogSoftmax"):  # along the last axis, where Softmax-11 means the same
            assert [a.i for a in node.attribute if a.name == "axis"] == [-1]
        if node.op_type in ("Squeeze", "Unsqueeze", "Split", "ReduceSum"):  # their version 11's attribute form
            assert len(node.input) == 1, node


class Block(torch.nn.Module):
    """A transformer block: LayerNorm (17), multi-head attention with a causal mask (softmax over the keys), GELU
    (erf and tanh), residuals."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
        h = self.norm1(x)
        attended = self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        x = x + torch.nn.functional.gelu(attended, approximate="tanh")
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


@pytest.mark.parametrize("opset", [11, 12])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_transformer_block(check, opset: int, dtype: torch.dtype) -> None:
    model = Block().to(dtype)
    program = check(model, (torch.randn(2, 6, 32, dtype=dtype),), opset_version=opset)
    assert _opset_of(program) == opset
    assert not {"LayerNormalization", "Trilu"} & _op_types(program)


def _integer_ops(a: torch.Tensor, b: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Max, Min, Pow and Clip of integers (types added at 12), comparisons with equality (GreaterOrEqual, new at
    12), argmax and argmin (select_last_index, 12), integer division and remainder, a gather along rows."""
    return (
        torch.maximum(a, b),
        torch.minimum(a, b),
        a.pow(2),
        torch.pow(f, b.clamp(0, 3)),
        a.clamp(-5, 50),
        a >= b,
        f <= 0.5,
        a.argmax(1),
        f.argmin(0),
        torch.div(a, b.clamp(min=1), rounding_mode="floor"),
        a % 7,
        f[a.abs().clamp(max=1).long(), b.abs().clamp(max=2).long()],
        a.amax(0) + a.sum(1, keepdim=True),
    )


@pytest.mark.parametrize("opset", [11, 12])
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
def test_integer_ops_whose_types_or_forms_came_later(check, opset: int, dtype: torch.dtype) -> None:
    a = torch.tensor([[-10, 3, 7], [11, 0, -1]], dtype=dtype)
    b = torch.tensor([[3, 3, -2], [5, 9, -1]], dtype=dtype)
    f = torch.tensor([[0.5, float("nan"), -2.0], [0.25, 4.0, 0.5]])
    program = check(Call(_integer_ops), (a, b, f), opset_version=opset)
    assert _opset_of(program) == opset
    assert not {"GreaterOrEqual", "LessOrEqual"} & _op_types(program) if opset == 11 else True


@pytest.mark.parametrize("opset", [11, 12])
def test_celu_and_softmax_of_float16_with_extremes(check, opset: int) -> None:
    def forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.nn.functional.celu(x, alpha=1.5), torch.softmax(x, dim=1), torch.log_softmax(x, dim=0)

    x = torch.randn(3, 4, 5, dtype=torch.float16) * 4
    x[0, 0, 0], x[1, 1, 1], x[2, 2, 2] = float("nan"), float("-inf"), 60000.0
    program = check(Call(forward), (x,), opset_version=opset)
    assert _opset_of(program) == opset and "Celu" not in _op_types(program) if opset == 11 else True


@pytest.mark.parametrize("opset", [11, 12])
def test_bfloat16_below_13_is_refused_naming_the_dtype(tmp_path: Path, opset: int) -> None:
    """No op takes bfloat16 before opset 13, not even Cast: refused before the graph is built, with the line."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).to(torch.bfloat16).float()

    path = tmp_path / "model.onnx"
    with pytest.raises(fx2onnx.ExportError, match=r"(?s)torch.bfloat16 needs ONNX opset 13.*test_older_opsets.py"):
        fx2onnx.export(Call(forward), (torch.randn(3),), str(path), opset_version=opset)
    assert not path.exists()


@pytest.mark.parametrize("opset", [11, 13])
def test_softplus_whose_cast_like_reads_an_untyped_value(check, opset: int) -> None:
    """torchlib's softplus casts its threshold like an intermediate of its own, which inlining leaves untyped: the
    CastLike (new at 15) becomes a Cast to the type its producer's schema gives it (mamba's, refused before)."""

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.nn.functional.softplus(x + 1), torch.nn.functional.softplus(x, beta=2.0, threshold=5.0)

    x = torch.randn(2, 8) * 10
    x[0, 0], x[1, 1] = float("inf"), float("nan")
    program = check(Call(forward), (x,), opset_version=opset)
    assert _opset_of(program) == opset and "CastLike" not in _op_types(program)


EQUATIONS = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhid,bhjd->bhij", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("ij,j->i", [(3, 4), (4,)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 3, 3, 4), (3, 4, 5)]),
    ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),
    ("...d,hd->...h", [(2, 7, 4, 8), (6, 8)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 5)]),
    ("b i d, b j d -> b i j", [(2, 3, 4), (2, 5, 4)]),
    ("ij,ij->i", [(3, 4), (3, 4)]),
    ("bhjd,bhid->bhij", [(2, 1, 5, 8), (2, 3, 4, 8)]),  # a MatMul broadcasting its batch
    ("ikj,jm->mi", [(3, 2, 4), (4, 5)]),  # k summed in the first operand alone
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),
]


@pytest.mark.parametrize(("equation", "shapes"), EQUATIONS)
def test_einsum_at_11_as_a_product_and_sum(check, equation: str, shapes: list[tuple[int, ...]]) -> None:
    def forward(*operands: torch.Tensor) -> torch.Tensor:
        return torch.einsum(equation, *operands)

    program = check(Call(forward), tuple(torch.randn(*shape) for shape in shapes), opset_version=11)
    assert _opset_of(program) == 11 and "Einsum" not in _op_types(program)
    if equation in ("bij,bjk->bik", "bhid,bhjd->bhij", "bhjd,bhid->bhij", "ij,ij->i"):  # one label of each kind
        assert "MatMul" in _op_types(program)


def test_einsum_of_a_diagonal_at_11_is_refused_without_a_file(tmp_path: Path) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ii->i", x)  # a repeated label: Einsum-12 only

    path = tmp_path / "model.onnx"
    with pytest.raises(fx2onnx.ExportError) as raised:
        fx2onnx.export(Call(forward), (torch.randn(3, 3),), str(path), opset_version=11)
    message = str(raised.value)
    assert "(a diagonal) needs opset 12" in message and "opset_version=18" in message
    assert "test_older_opsets.py" in message  # the user's line
    assert not path.exists()
    program = fx2onnx.export(Call(forward), (torch.randn(3, 3),), opset_version=12)
    assert _opset_of(program) == 12
