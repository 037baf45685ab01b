"""Judging float16/bfloat16 outputs against the rounding noise of the dtype itself.

A deep float16/bfloat16 model rounds every intermediate result; ONNX Runtime and eager round the same
values but accumulate in different orders, so after a dozen layers their outputs differ by several ulps
of the largest activations, far beyond any fixed tolerance near zero (a bfloat16 GPT-2-small: max abs
difference 2.0 on logits of mean magnitude 22), although neither is less accurate. The fair question is
whether the exported model is as close to the exact result as eager is. Its answer: run the same module in
float32 (parameters, buffers and floating inputs upcast; eager's own float32 result stands for the exact
one), and accept an output whose distance to it is within a small factor of eager's own distance, in the
maximum and in the mean. A wrong lowering shows up as an error several times eager's noise; rounding does
not. Where eager's own mean error is half the float32 outputs' mean magnitude or more (random weights amplifying
float16 inputs near its maximum: EfficientNet-B0's sigmoid gates flip on one ulp), the mean error is one draw of
noise as large as the signal, and another draw differs by more than MEAN_FACTOR (eager on inputs nudged by one ulp
at 1% of positions: 0.76-1.13 times eager's mean error; the same ONNX model in ONNX Runtime with and without
its NCHWc float32 Conv: 1.15 and 1.29 times): there the mean is held to MAX_FACTOR too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

LOW_PRECISION = (torch.float16, torch.bfloat16)
REFERENCE_DTYPE = torch.float32
# How much farther from the float32 result than eager's own output the exported model's may be.
MAX_FACTOR = 2.0
MEAN_FACTOR = 1.25
# Eager's mean error from this share of the float32 outputs' mean magnitude up: noise as large as the signal.
NOISE_DOMINATED_SHARE = 0.5
# The float32 copy of the weights must fit in this share of the memory available.
MEMORY_SHARE = 0.5


@dataclasses.dataclass(frozen=True)
class NoiseComparison:
    """Distances of eager's and ONNX Runtime's outputs to the float32 result."""

    eager_max: float
    eager_mean: float
    onnx_max: float
    onnx_mean: float
    floor: float  # an absolute allowance: one fixed-tolerance step, for outputs eager computes exactly
    reference_mean: float = float("inf")  # the float32 result's mean magnitude
    computed_in: str = ""  # the low-precision dtype of a float32 output's model (float16 weights, logits.float())

    @property
    def noise_dominated(self) -> bool:
        return self.eager_mean >= NOISE_DOMINATED_SHARE * self.reference_mean

    @property
    def within_noise(self) -> bool:
        mean_factor = MAX_FACTOR if self.noise_dominated else MEAN_FACTOR
        return (
            self.onnx_max <= MAX_FACTOR * self.eager_max + self.floor
            and self.onnx_mean <= mean_factor * self.eager_mean + self.floor
        )

    def __str__(self) -> str:
        text = (
            f"vs float32 eager: ONNX max/mean err {self.onnx_max:.3g}/{self.onnx_mean:.3g}, "
            f"eager {self.eager_max:.3g}/{self.eager_mean:.3g}"
        )
        if self.noise_dominated:
            share = self.eager_mean / self.reference_mean
            text += f"; eager's own mean err is {share:.0%} of the float32 outputs' mean magnitude"
        return text


def float32_outputs(module: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[torch.Tensor] | None:
    """The module's flat tensor outputs with its float16/bfloat16 parameters, buffers and inputs in float32,
    or None where that cannot be computed (not a torch module, too large, or it fails in float32)."""
    if not isinstance(module, torch.nn.Module):
        return None
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    upcast_bytes = sum(t.numel() * 4 for t in state.values() if t.dtype in LOW_PRECISION)
    if upcast_bytes > MEMORY_SHARE * _available_bytes():
        return None
    upcast = {name: t.to(REFERENCE_DTYPE) for name, t in state.items() if t.dtype in LOW_PRECISION}

    def widen(x: Any) -> Any:
        return x.to(REFERENCE_DTYPE) if isinstance(x, torch.Tensor) and x.dtype in LOW_PRECISION else x

    wide_args, wide_kwargs = pytree.tree_map(widen, (tuple(args), dict(kwargs)))
    try:
        with torch.no_grad():
            outputs = torch.func.functional_call(module, upcast, wide_args, wide_kwargs, strict=False)
    except Exception:  # a model that only runs in its own dtype: no reference, the fixed tolerance stands
        return None
    return [x for x in pytree.tree_leaves(outputs) if isinstance(x, torch.Tensor)]


def weights_dtype(module: Any) -> torch.dtype | None:
    """float16 or bfloat16 where every floating-point parameter of `module` has that dtype, else None."""
    if not isinstance(module, torch.nn.Module):
        return None
    dtypes = {t.dtype for t in module.parameters() if t.is_floating_point()}
    return next(iter(dtypes)) if len(dtypes) == 1 and dtypes <= set(LOW_PRECISION) else None


def compare_to_reference(
    expected: torch.Tensor, actual: torch.Tensor, reference: torch.Tensor, floor: float
) -> NoiseComparison | None:
    """Distances to `reference` over the elements all three have finite; None where the shapes differ or
    where eager's and ONNX Runtime's NaNs and infinities are not in the same places."""
    if not (expected.shape == actual.shape == reference.shape):
        return None
    e, a, r = (t.detach().to(torch.float64) for t in (expected, actual, reference))
    if not (torch.equal(torch.isnan(e), torch.isnan(a)) and torch.equal(torch.isinf(e), torch.isinf(a))):
        return None
    if not torch.equal(e[torch.isinf(e)], a[torch.isinf(a)]):
        return None
    finite = torch.isfinite(e) & torch.isfinite(a) & torch.isfinite(r)
    if not finite.any():
        return None
    eager_error, onnx_error = (e - r).abs()[finite], (a - r).abs()[finite]
    return NoiseComparison(
        eager_max=float(eager_error.max()),
        eager_mean=float(eager_error.mean()),
        onnx_max=float(onnx_error.max()),
        onnx_mean=float(onnx_error.mean()),
        floor=floor,
        reference_mean=float(r[finite].abs().mean()),
    )


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 2**62  # not Linux: no limit known


__all__ = ["LOW_PRECISION", "NoiseComparison", "compare_to_reference", "float32_outputs", "weights_dtype"]
