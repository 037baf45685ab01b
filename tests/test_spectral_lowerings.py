"""FFTs and complex values (src/fx2onnx/_lowerings/spectral.py, src/fx2onnx/_complex_layout.py), each against eager.

Inside the graph a complex tensor is a real one with a trailing dim of 2; at the boundary the program
converts, so these tests see eager's complex dtypes on both sides.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

from fx2onnx import Registry
from fx2onnx import _complex_layout as complex_layout

from conftest import Call, assert_exports_and_matches


def floats(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def complexes(*shape: int, dtype: torch.dtype = torch.complex64, seed: int = 2) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.complex128).to(dtype)


def with_edges(x: torch.Tensor) -> torch.Tensor:
    """Zeros, negatives and large values in the first row (FFTs of inf or NaN are NaN soup in both)."""
    x = x.clone()
    x.view(-1)[:4] = torch.tensor([0.0, -0.0, -3.0e6, 1.0e6], dtype=torch.float64).to(x.dtype)
    return x


def test_spectral_lowerings_are_registered_first() -> None:
    registry = Registry.default()
    for overload, complex_input in [
        ("aten::_fft_r2c", False),
        ("aten::_fft_c2c", True),
        ("aten::_fft_c2r", True),
        ("aten::_conj_physical", True),
        ("aten::constant_pad_nd", True),
        ("aten::angle", False),
    ]:
        first = next(i for i in registry.overloads(overload) if i.complex == complex_input)
        assert first.source == "fx2onnx", overload


# --- FFTs of real inputs (float, integer and bool inputs compute in float32 as in eager) ---------------------------
@pytest.mark.parametrize(
    ("function", "dtype"),
    [
        (lambda x: torch.fft.fft(x, n=10), torch.float32),  # zero-padded
        (lambda x: torch.fft.ifft(x, n=5, norm="ortho"), torch.float32),  # truncated
        (lambda x: torch.fft.rfft(x, norm="forward"), torch.int8),
        (lambda x: torch.fft.irfft(x, n=9), torch.float32),
        (lambda x: torch.fft.hfft(x), torch.uint8),
        (lambda x: torch.fft.ihfft(x), torch.bool),
        (lambda x: torch.fft.fft2(x, dim=(0, -1)), torch.float64),
        (lambda x: torch.fft.rfftn(x, s=(3, 6), norm="ortho"), torch.int64),
        (lambda x: torch.fft.ihfft2(x), torch.float32),
        (lambda x: torch.fft.irfftn(x, norm="forward"), torch.float64),
    ],
    ids=["fft-n", "ifft-ortho", "rfft-int8", "irfft", "hfft-uint8", "ihfft-bool", "fft2", "rfftn", "ihfft2", "irfftn"],
)
def test_fft_of_real_input(function: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype) -> None:
    x = with_edges(floats(3, 4, 7) * 4)
    x = x > 0 if dtype == torch.bool else x.to(dtype)
    assert_exports_and_matches(Call(function), (x,))


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
def test_complex128_inverse_keeps_float64_precision(norm: str) -> None:
    """ONNX Runtime's inverse DFT in float64 is float32-accurate for lengths other than powers of two."""

    def transforms(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.fft.ifft(x, norm=norm), torch.fft.ifft2(x, norm=norm), torch.fft.irfft(x, n=9, norm=norm)

    x = complexes(3, 5, dtype=torch.complex128) * 10
    assert_exports_and_matches(Call(transforms), (x,), rtol=1e-12, atol=1e-12)


# --- complex values at the graph's boundary ---------------------------------------------------------------------
def test_complex_inputs_outputs_and_weights() -> None:
    class Spectrum(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("phase", complexes(5, seed=3))

        def forward(self, signal: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.fft.fft(signal * self.phase, norm="ortho"), torch.fft.irfft(other, n=6).abs()

    signal, other = complexes(2, 5), complexes(2, 4, seed=4)
    program = assert_exports_and_matches(Spectrum(), (signal, other))
    props = program.model.metadata_props
    assert json.loads(props[complex_layout.COMPLEX_INPUTS]) == [0, 1]
    assert json.loads(props[complex_layout.COMPLEX_OUTPUTS]) == [0]
    graph_input = program.model.graph.inputs[0]
    assert graph_input.dtype.name == "FLOAT" and list(graph_input.shape) == [2, 5, 2]
    outputs = program(signal, other)
    assert outputs[0].dtype == torch.complex64 and outputs[1].dtype == torch.float32
    verification = program.verify(signal, other, intermediates=True)
    assert verification.first_mismatch is None


@pytest.mark.parametrize(
    ("function", "dtype"),
    [
        (torch.Tensor.cfloat, torch.int8),
        (torch.Tensor.cdouble, torch.bool),
        (torch.Tensor.cdouble, torch.float32),
        (torch.Tensor.cdouble, torch.complex64),
        (torch.Tensor.float, torch.complex64),  # keeps the real part, as eager (which warns)
        (torch.Tensor.int, torch.complex128),
        (torch.Tensor.bool, torch.complex64),
    ],
    ids=["i8-c64", "bool-c128", "f32-c128", "c64-c128", "c64-f32", "c128-i32", "c64-bool"],
)
def test_conversions(function: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype) -> None:
    if dtype.is_complex:
        x = complexes(2, 6, dtype=dtype) * 3
        x[0, :3] = torch.tensor([0, 1j, 2.5], dtype=dtype)  # bool: true where either part is nonzero
    else:
        x = with_edges(floats(2, 6) * 3)
        x = x > 0 if dtype == torch.bool else x.to(dtype)
    assert_exports_and_matches(Call(function), (x,))


def test_complex_construction() -> None:
    def construct(real: torch.Tensor, imag: torch.Tensor, pairs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.complex(real, imag),
            torch.polar(real.abs(), imag),
            torch.view_as_complex(pairs),
            torch.view_as_real(torch.view_as_complex(pairs).conj_physical()),
        )

    real, imag = with_edges(floats(3, 4, dtype=torch.float64)), floats(3, 4, dtype=torch.float64, seed=5)
    assert_exports_and_matches(Call(construct), (real, imag, floats(3, 4, 2)))


def test_complex_padding_and_unsqueeze() -> None:
    def reshape(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.constant_pad_nd(x, (1, 2), 1.5),  # the real part filled, the imaginary part 0
            torch.constant_pad_nd(x, (0, 0, -1, 1)),
            torch.nn.functional.pad(x.unsqueeze(0), (2, 3), mode="reflect"),
            x.unsqueeze(-1),
            x[:0].conj_physical(),  # an empty complex output
        )

    assert_exports_and_matches(Call(reshape), (complexes(3, 6),))


def test_complex_shape_ops_and_fills() -> None:
    def shape_ops(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        first, rest = torch.split(x, [1, 3], dim=-1)
        return (
            x.expand(2, 3, -1, 4),
            torch.where(mask, x, 2j),
            x.masked_fill(mask, 1.5),
            torch.full_like(x, 2 - 1j),
            torch.ones_like(x, dtype=torch.float32),
            x.squeeze(),
            first,
            rest.squeeze((1, -1)),
        )

    mask = floats(3, 1, 4, seed=8) > 0
    assert_exports_and_matches(Call(shape_ops), (complexes(3, 1, 4), mask))


def test_stft_of_complex_and_real_signals() -> None:
    def transforms(signal: torch.Tensor, real: torch.Tensor, window: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.stft(signal, 8, hop_length=3, win_length=6, window=window, return_complex=True),
            torch.stft(signal, 10, center=False, normalized=True, return_complex=True),
            torch.stft(real, 8, window=torch.hann_window(8, dtype=real.dtype), return_complex=True),
        )

    signal = complexes(2, 37, dtype=torch.complex128)
    window = torch.hann_window(6, dtype=torch.float64)
    assert_exports_and_matches(Call(transforms), (signal, floats(2, 40, dtype=torch.float64), window))


def test_complex_arithmetic_with_numbers_and_tensors() -> None:
    """Python numbers (kept as numbers in the graph) join complex arithmetic as (real, imag) pairs."""

    def arithmetic(x: torch.Tensor, y: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x * 2 + (1.5 - 2j),
            3 - x / y,
            torch.add(x, y, alpha=2j) * real,
            2 / torch.sub(x, y, alpha=0.5),
            torch.fft.ifft(torch.fft.fft(x) * y.conj_physical()),
        )

    x, y = complexes(3, 4), complexes(4, seed=6)
    y[0] = 1e-3 + 0j  # a small divisor
    assert_exports_and_matches(Call(arithmetic), (x, y, floats(4)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int8, torch.bool])
def test_angle_of_real_numbers(dtype: torch.dtype) -> None:
    values = [float("nan"), -0.0, 0.0, -1.0, 2.0, float("-inf"), float("inf"), -7.0]
    if dtype == torch.bool:
        x = torch.tensor([True, False])
    elif dtype.is_floating_point:
        x = torch.tensor(values, dtype=dtype)
    else:
        x = torch.tensor([-128, -1, 0, 5], dtype=dtype)
    assert_exports_and_matches(Call(torch.angle), (x,))


def test_fft_with_a_dynamic_batch() -> None:
    class RoundTrip(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            spectrum = torch.fft.rfft(x, norm="ortho")
            return spectrum, torch.fft.irfft(spectrum, n=x.shape[-1], norm="ortho")

    batch = torch.export.Dim("batch")
    assert_exports_and_matches(
        RoundTrip(),
        (floats(3, 10),),
        dynamic_shapes={"x": {0: batch}},
        run_with=[((floats(5, 10, seed=7),), {})],
    )


@pytest.mark.parametrize("opset", [20, 23])
def test_fft_at_newer_opsets(opset: int) -> None:
    """The version converter's DFT adapter adds Constants without types; export types them."""
    assert_exports_and_matches(Call(lambda x: torch.fft.rfft(x).abs()), (floats(3, 16),), opset_version=opset)


def test_user_registered_complex_implementation() -> None:
    """`register(..., complex=True)`: the implementation sees (..., 2) real tensors and returns that layout."""
    from onnxscript import opset18 as op

    def complex_exp(self):  # type: ignore[no-untyped-def]  # e^(a + ib) = e^a (cos b + i sin b)
        real, imag = op.Split(self, axis=-1, num_outputs=2)
        magnitude = op.Exp(real)
        return op.Concat(op.Mul(magnitude, op.Cos(imag)), op.Mul(magnitude, op.Sin(imag)), axis=-1)

    registry = Registry.default()
    implementation = registry.register("aten::exp", complex_exp, complex=True)
    assert implementation.complex and registry.lowers("aten::exp", complex=True)
    x = complexes(3, 4)
    assert_exports_and_matches(Call(torch.exp), (x,), registry=registry)
    assert_exports_and_matches(Call(torch.exp), (floats(3, 4),), registry=registry)  # real inputs: the defaults
