"""Comparing exported models with eager: per-dtype tolerances, the comparison of one output, ONNX Runtime sessions
and the conversion of values between torch and ONNX Runtime.

Below the program and the report, which both read its records (:class:`OutputVerification`)."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnx_ir as ir
import torch

from fx2onnx import _dtypes as dtypes
from fx2onnx import _rounding_noise as rounding_noise

if TYPE_CHECKING:
    import onnxruntime

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime


# Default (rtol, atol) per dtype when comparing with eager: ONNX Runtime's kernels differ from
# torch's in accumulation order, so float32 gets more room than torch.testing's defaults.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-5, 1e-6),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
    torch.complex64: (1e-4, 1e-4),  # as their component type
    torch.complex128: (1e-5, 1e-6),
}


@dataclasses.dataclass
class OutputVerification:
    """How one ONNX output compares with eager."""

    name: str
    expected_dtype: str
    actual_dtype: str
    expected_shape: tuple[int, ...]
    actual_shape: tuple[int, ...]
    max_abs_error: float
    max_rel_error: float
    rtol: float
    atol: float
    passed: bool
    # float16/bfloat16 outputs beyond rtol/atol: how far both are from the model run in float32, and whether the
    # exported model is within the dtype's rounding noise (then `passed`; see fx2onnx._rounding_noise).
    noise: rounding_noise.NoiseComparison | None = None

    def __str__(self) -> str:
        status = "ok" if self.passed else "MISMATCH"
        text = (
            f"{self.name}: {status} dtype {self.actual_dtype} (eager {self.expected_dtype}) shape "
            f"{list(self.actual_shape)} max abs err {self.max_abs_error:.3g} max rel err {self.max_rel_error:.3g}"
        )
        if self.noise is not None:
            verdict = "within" if self.noise.within_noise else "beyond"
            text += f" ({verdict} {self.expected_dtype} rounding noise, {self.noise})"
        return text


def compare(
    name: str, expected: torch.Tensor, actual: torch.Tensor, *, rtol: float | None = None, atol: float | None = None
) -> OutputVerification:
    default_rtol, default_atol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    same_shape = tuple(expected.shape) == tuple(actual.shape)
    same_dtype = expected.dtype == actual.dtype
    max_abs = max_rel = 0.0
    close = False
    if same_shape:
        e = expected.detach().to(torch.float64) if not expected.dtype.is_complex else expected.detach()
        a = actual.detach().to(e.dtype)
        if e.numel():
            inexact = e.is_floating_point() or e.is_complex()
            both_nan = torch.isnan(e) & torch.isnan(a) if inexact else torch.zeros_like(e, dtype=torch.bool)
            same_inf = torch.isinf(e) & (e == a) if inexact else torch.zeros_like(e, dtype=torch.bool)
            diff = (e - a).abs()
            diff = torch.where(both_nan | same_inf, torch.zeros_like(diff), diff)
            diff = torch.nan_to_num(diff, nan=float("inf"))
            max_abs = float(diff.max())
            rel = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
            rel = torch.where(diff == 0, torch.zeros_like(rel), rel)
            max_rel = float(rel.max())
            # An infinite expected value admits only itself (rtol * inf would admit anything, -inf included);
            # a NaN one only NaN (its tolerance is NaN).
            bound = torch.where(torch.isinf(e), torch.zeros_like(diff), atol + rtol * e.abs())
            close = bool(((diff <= bound) | both_nan | same_inf).all())
            if _is_exact(expected) and _is_exact(actual) and atol == 0 and rtol == 0:
                # float64 holds integers exactly only up to 2**53: an int64 near 2**62 off by 1000 would compare equal
                exact_diff = (expected.detach().to(torch.int64) - actual.detach().to(torch.int64)).abs()
                close = not bool(exact_diff.any())
                max_abs = max(max_abs, float(exact_diff.max()))
        else:
            close = True
    return OutputVerification(
        name=name,
        expected_dtype=str(expected.dtype).removeprefix("torch."),
        actual_dtype=str(actual.dtype).removeprefix("torch."),
        expected_shape=tuple(expected.shape),
        actual_shape=tuple(actual.shape),
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        rtol=rtol,
        atol=atol,
        passed=same_shape and same_dtype and close,
    )


def _is_exact(tensor: torch.Tensor) -> bool:
    """An integer or bool tensor whose values int64 holds exactly (uint64 above 2**63 would wrap)."""
    return not tensor.dtype.is_floating_point and not tensor.dtype.is_complex and tensor.dtype != torch.uint64


def cpu_session(
    source: str | bytes, model: ir.Model | None = None, *, optimized: bool = True
) -> onnxruntime.InferenceSession:
    """An ONNX Runtime CPU session of a model (a path or its serialized bytes), quiet, otherwise with the options
    a plain ``InferenceSession`` gets (every graph optimization on); ``optimized=False`` turns them off.

    No optimizer is disabled: an exported model must compute the same in the session users get by default
    (fx2onnx avoids the fusions that would not; ``docs/ort-defects.md``). `model` is accepted for compatibility.
    """
    import onnxruntime

    del model
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(source, options, providers=["CPUExecutionProvider"])


# (rtol, atol relative to the output's largest magnitude) between the outputs of a session with graph
# optimizations on and one with them off: fusions reorder float arithmetic (a scale applied after a MatMul instead
# of before, a fused LayerNorm's or Gelu's own kernel), which moves results by a few ulps, compounded through a
# deep model; anything beyond is a fusion computing something else. Integer and bool outputs must be equal.
OPTIMIZATION_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-12),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (4e-2, 1e-2),
    torch.complex64: (1e-4, 1e-5),
    torch.complex128: (1e-10, 1e-12),
}


def compare_optimized(name: str, unoptimized: torch.Tensor, optimized: torch.Tensor) -> OutputVerification:
    """One output of the optimized session against the unoptimized one (:meth:`ONNXProgram.divergence`)."""
    rtol, relative_atol = OPTIMIZATION_TOLERANCES.get(unoptimized.dtype, (0.0, 0.0))
    magnitude = 0.0
    if relative_atol and unoptimized.numel():
        finite = unoptimized.detach().abs().to(torch.float64)
        finite = finite[torch.isfinite(finite)]
        magnitude = float(finite.max()) if finite.numel() else 0.0
    atol = relative_atol * magnitude if magnitude else relative_atol * torch.finfo(torch.float64).tiny
    return compare(name, unoptimized, optimized, rtol=rtol, atol=atol)


def to_ortvalue(onnxruntime: Any, tensor: torch.Tensor) -> Any:
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(
            tensor.view(torch.uint16).numpy(), onnx_element_type=int(ir.DataType.BFLOAT16)
        )
    return onnxruntime.OrtValue.ortvalue_from_numpy(tensor.numpy())


_ORT_TYPE_NAMES = {f"tensor({dtype.name.lower()})": dtype for dtype in ir.DataType}


_ORT_TYPE_NAMES["tensor(float)"] = ir.DataType.FLOAT


_ORT_TYPE_NAMES["tensor(double)"] = ir.DataType.DOUBLE


def to_torch(value: Any) -> torch.Tensor:
    dtype = _ORT_TYPE_NAMES.get(value.data_type())
    if dtype is not None and dtype.numpy() is not None and dtype != ir.DataType.BFLOAT16:
        try:
            return torch.from_numpy(value.numpy())
        except (TypeError, RuntimeError):
            pass
    # No numpy type (bfloat16, float8): copy the raw bytes into a torch tensor of the same dtype.
    torch_dtype = dtypes.to_torch(dtype) if dtype is not None else None
    if torch_dtype is None:
        raise TypeError(f"cannot convert ONNX Runtime output of type {value.data_type()}")
    result = torch.empty(tuple(value.shape()), dtype=torch_dtype)
    if result.numel():
        ctypes.memmove(result.data_ptr(), value.data_ptr(), value.tensor_size_in_bytes())
    return result


def summarize(results: Sequence[OutputVerification]) -> str:
    return "\n".join(str(r) for r in results)
