"""Export one sample with an engine, run it in ONNX Runtime and compare with eager: one status per sample."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fx2onnx.coverage.cases import Engine
from fx2onnx.coverage.samples import PreparedSample, first_line

# The statuses of a sample (and of a case: its worst sample), from best to worst.
OK = "ok"
EXCLUDED = "excluded"
EXPORT_ERROR = "export_error"
INVALID_MODEL = "invalid_model"
NO_KERNEL = "no_kernel"
RUN_ERROR = "run_error"
MISMATCH = "mismatch"
TIMEOUT = "timeout"
STATUSES = (OK, EXPORT_ERROR, INVALID_MODEL, NO_KERNEL, RUN_ERROR, MISMATCH, TIMEOUT, EXCLUDED)

# (rtol, atol) per output dtype. ONNX Runtime computes low-precision floats through float32 (or
# the exporter's legalization does), where eager rounds at other points: a few ulps apart.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-5, 1e-6),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
    torch.complex64: (1e-4, 1e-4),
    torch.complex128: (1e-5, 1e-6),  # as float64, its component type (complex64 has float32's)
}

Phase = Callable[[str], None]


@dataclasses.dataclass
class SampleOutcome:
    index: int
    status: str
    detail: str = ""
    cause: str = ""  # the innermost error when it says more than the outer one
    seconds: float = 0.0
    # An ok sample that fails the fixed tolerance (TOLERANCES) and passed only because eager's own
    # rounding is as far from the float64 result: the fixed-tolerance mismatch.
    noise_only: str = ""

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v not in ("", None)}


def check_sample(
    engine: Engine, sample: PreparedSample, phase: Phase, signatures: list[dict[str, Any]] | None = None
) -> SampleOutcome:
    start = time.perf_counter()
    runner = _check_fx2onnx if engine == "fx2onnx" else _check_reference
    outcome = runner(sample, phase, signatures)
    outcome.seconds = round(time.perf_counter() - start, 3)
    return outcome


# --- fx2onnx ----------------------------------------------------------------------------------------
def _check_fx2onnx(sample: PreparedSample, phase: Phase, signatures: list[dict[str, Any]] | None) -> SampleOutcome:
    import fx2onnx
    from fx2onnx import _capture as capture_stage
    from fx2onnx._registry import global_registry
    from fx2onnx.coverage.discovery import RecordingExtractor

    extractor = RecordingExtractor(capture_stage.TorchExportExtractor(False, global_registry()))
    phase("export")
    try:
        program = fx2onnx.export(sample.module, sample.fresh_inputs(), extractor=extractor)
    except fx2onnx.InvalidModelError as error:
        return failure(sample, INVALID_MODEL, error)
    except Exception as error:
        return failure(sample, EXPORT_ERROR, error)
    finally:
        if signatures is not None:
            signatures.extend(extractor.signatures())
    phase("session")
    try:
        program.session()
    except Exception as error:
        return session_failure(sample, error)
    phase("run")
    try:
        actual = [a for a in program(*sample.fresh_inputs()) if a is not None]  # as eager's side (_flat_outputs)
    except Exception as error:
        return failure(sample, RUN_ERROR, error)
    outcome = compare_outputs(sample, actual)
    if outcome.status == OK:
        phase("differential")
        outcome = _optimizations_change_nothing(sample, program, actual) or outcome
    return outcome


def _optimizations_change_nothing(
    sample: PreparedSample, program: Any, optimized: Sequence[torch.Tensor]
) -> SampleOutcome | None:
    """A mismatch when ONNX Runtime's graph optimizations change the outputs of the default session (which
    matched eager): the same inputs in a session with optimizations off, compared at rounding-noise tolerance
    (:func:`fx2onnx.program.compare_optimized`); None when they agree."""
    from fx2onnx._verification import compare_optimized

    try:
        unoptimized = [a for a in program.run(sample.fresh_inputs(), optimized=False) if a is not None]
    except Exception as error:
        return failure(sample, RUN_ERROR, error)
    for position, (reference, result) in enumerate(zip(unoptimized, optimized, strict=True)):
        verdict = compare_optimized(f"output {position}", reference, result)
        if not verdict.passed:
            errors = f"max abs err {verdict.max_abs_error:.3g}, max rel err {verdict.max_rel_error:.3g}"
            detail = f"output {position}: ONNX Runtime's graph optimizations change the values ({errors})"
            return SampleOutcome(sample.index, MISMATCH, detail)
    return None


# --- the reference exporter ------------------------------------------------------------------------
def _check_reference(sample: PreparedSample, phase: Phase, signatures: list[dict[str, Any]] | None) -> SampleOutcome:
    """``torch.onnx.export(dynamo=True)``: a benchmark, so it lives in the source checkout, not in the package."""
    return _reference_engine().check_sample(sample, phase)


@functools.cache
def _reference_engine() -> Any:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    path = os.path.join(root, "benchmarks", "coverage_reference.py")
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"the reference engine is a benchmark of the source checkout ({path}); run from a checkout of fx2onnx"
        )
    spec = importlib.util.spec_from_file_location("fx2onnx_coverage_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def session(model_bytes: bytes) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def run(ort_session: Any, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    import onnxruntime

    from fx2onnx._verification import to_ortvalue, to_torch

    names = [i.name for i in ort_session.get_inputs()]
    if len(names) != len(inputs):
        raise ValueError(f"the model takes {len(names)} inputs, the sample has {len(inputs)} tensors")
    feed = {name: to_ortvalue(onnxruntime, tensor) for name, tensor in zip(names, inputs)}
    outputs = ort_session.run_with_ort_values([o.name for o in ort_session.get_outputs()], feed)
    return [to_torch(value) for value in outputs]


# --- classification --------------------------------------------------------------------------------
def session_failure(sample: PreparedSample, error: Exception) -> SampleOutcome:
    """ONNX Runtime refusing a model: no kernel for a type, an invalid graph, or an init failure."""
    message = str(error)
    if "NOT_IMPLEMENTED" in message or "Could not find an implementation" in message:
        return failure(sample, NO_KERNEL, error)
    if "INVALID_GRAPH" in message or "INVALID_ARGUMENT" in message or "INVALID_PROTOBUF" in message:
        return failure(sample, INVALID_MODEL, error)
    return failure(sample, RUN_ERROR, error)


def failure(sample: PreparedSample, status: str, error: BaseException) -> SampleOutcome:
    detail = f"{type(error).__name__}: {first_line(str(error))}"
    root = error
    while root.__cause__ is not None or (root.__context__ is not None and not root.__suppress_context__):
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    cause = f"{type(root).__name__}: {first_line(str(root))}" if root is not error else ""
    return SampleOutcome(sample.index, status, detail, cause if cause != detail else "")


def compare_outputs(sample: PreparedSample, actual: Sequence[torch.Tensor]) -> SampleOutcome:
    from fx2onnx._verification import compare

    expected = sample.expected
    if len(actual) != len(expected):
        return SampleOutcome(sample.index, MISMATCH, f"{len(actual)} outputs, eager has {len(expected)}")
    golden: list[torch.Tensor] | None = None
    noise_only = ""
    for position, (want, got) in enumerate(zip(expected, actual)):
        rtol, atol = TOLERANCES.get(want.dtype, (0.0, 0.0))
        result = compare(f"output {position}", want, got, rtol=rtol, atol=atol)
        if result.passed:
            continue
        detail = _describe_mismatch(result)
        if sample.op in _TIE_ORDERED and _same_up_to_ties(sample, position, want, got):
            continue
        if sample.op in _SELECTING and _selects_eager_value(sample, position, got):
            continue
        if sample.op in _SIGN_FREE and _same_up_to_signs(sample, position, want, got, rtol, atol):
            continue
        if want.dtype in _ROUNDED and result.expected_shape == result.actual_shape and want.dtype == got.dtype:
            golden = golden if golden is not None else _float64_outputs(sample)
            if golden is not None and len(golden) == len(expected):
                verdict = _as_close_as_eager(want, got, golden[position], rtol, atol)
                if verdict is None:
                    noise_only = noise_only or detail
                    continue
                detail = f"{detail} ({verdict})"
        return SampleOutcome(sample.index, MISMATCH, detail)
    return SampleOutcome(sample.index, OK, noise_only=noise_only)


# Ops whose index output eager leaves unspecified among equal values (an unstable sort picks any order of
# ties): op -> (position of the index output, position of `dim` in the sample's args). Their indices are
# compared by what they select: the same values, each index once.
_TIE_ORDERED: dict[str, tuple[int, int]] = {"argsort": (0, 0), "sort": (1, 0), "topk": (1, 1)}


def _same_up_to_ties(sample: PreparedSample, position: int, eager: torch.Tensor, onnx: torch.Tensor) -> bool:
    output, dim_position = _TIE_ORDERED[sample.op]
    if position != output or eager.shape != onnx.shape or eager.dtype != onnx.dtype:
        return False
    source, args, kwargs = sample.call_arguments()
    dim = kwargs.get("dim", args[dim_position] if len(args) > dim_position else -1)
    if not isinstance(source, torch.Tensor) or not isinstance(dim, int):
        return False
    if source.dim() == 0:
        return bool(torch.equal(eager, onnx))
    length = source.shape[dim]
    if length == 0 or eager.numel() == 0:
        return True
    if bool(((onnx < 0) | (onnx >= length)).any()):
        return False
    distinct = torch.sort(onnx, dim=dim).values.diff(dim=dim)
    if bool((distinct == 0).any()):
        return False
    chosen = source.gather(dim, onnx)
    wanted = source.gather(dim, eager)
    same = (
        (chosen == wanted) | (torch.isnan(chosen) & torch.isnan(wanted))
        if chosen.is_floating_point()
        else chosen == wanted
    )
    return bool(same.all())


# Ops that return (value, index of an element equal to it) along a dim, where eager leaves unspecified which
# of several equal elements' index: op -> position of `dim` in the sample's args. An index is right when the
# element it selects equals eager's value.
_SELECTING: dict[str, int] = {"median": 0, "nanmedian": 0, "kthvalue": 1, "mode": 0}


def _selects_eager_value(sample: PreparedSample, position: int, onnx: torch.Tensor) -> bool:
    if position != 1 or len(sample.expected) != 2:
        return False
    values = sample.expected[0]
    source, args, kwargs = sample.call_arguments()
    dim_position = _SELECTING[sample.op]
    dim = kwargs.get("dim", args[dim_position] if len(args) > dim_position else -1)
    if not isinstance(source, torch.Tensor) or not isinstance(dim, int) or onnx.dtype != torch.int64:
        return False
    if source.dim() == 0:
        return bool((onnx == 0).all())
    index = onnx if onnx.dim() == source.dim() else onnx.unsqueeze(dim)
    length = source.shape[dim]
    if bool(((index < 0) | (index >= length)).any()):
        return False
    chosen = source.gather(dim, index).reshape(values.shape)
    same = chosen == values
    if chosen.is_floating_point():
        same = same | (torch.isnan(chosen) & torch.isnan(values))
    return bool(same.all())


# Ops whose eigenvector output is defined up to the sign of each vector (a column): op -> position of that output.
# LAPACK's choice of sign follows no rule an exporter can reproduce; a vector that is eager's times -1 is right.
# linalg.eig's complex vectors are normalized as eager's (unit norm, largest component real), which leaves that
# sign: MKL's geev picks it by a rule that its public LAPACK counterpart does not always reproduce.
_SIGN_FREE: dict[str, int] = {"linalg.eigh": 1, "linalg.eig": 1}


def _same_up_to_signs(
    sample: PreparedSample, position: int, eager: torch.Tensor, onnx: torch.Tensor, rtol: float, atol: float
) -> bool:
    from fx2onnx._verification import compare

    if position != _SIGN_FREE[sample.op] or eager.shape != onnx.shape or eager.dim() < 2 or eager.numel() == 0:
        return False
    alignment = (eager.conj() * onnx).sum(dim=-2, keepdim=True)
    alignment = alignment.real if alignment.is_complex() else alignment
    signs = torch.where(alignment < 0, -1.0, 1.0).to(onnx.dtype)
    return compare("eigenvectors", eager, onnx * signs, rtol=rtol, atol=atol).passed


# Float types whose results depend on where an implementation rounds (accumulation order, fused ops).
_ROUNDED = (torch.float16, torch.bfloat16, torch.float32)
_ERROR_FACTOR = 2.0


def _float64_outputs(sample: PreparedSample) -> list[torch.Tensor] | None:
    """Eager's outputs with the sample's rounded float inputs in float64: the exact result, near enough."""
    inputs = tuple(t.to(torch.float64) if t.dtype in _ROUNDED else t.clone() for t in sample.inputs)
    try:
        with torch.no_grad():
            outputs = sample.module(*inputs)
    except Exception:
        return None
    import torch.utils._pytree as pytree

    leaves = [leaf for leaf in pytree.tree_leaves(outputs) if isinstance(leaf, torch.Tensor)]
    return leaves


def _as_close_as_eager(
    eager: torch.Tensor, onnx: torch.Tensor, exact: torch.Tensor, rtol: float, atol: float
) -> str | None:
    """None when ONNX's result is within tolerance of the float64 result, or at most twice as far as eager's.

    Eager in float16 rounds partial sums at other points than ONNX Runtime (or the legalizer's wider
    compute type) does; neither is "the" answer, so the float64 result arbitrates.
    """
    if exact.shape != eager.shape or not exact.is_floating_point():
        return "no float64 result to arbitrate"
    exact = exact.to(torch.float64)
    onnx_error = (onnx.to(torch.float64) - exact).abs()
    eager_error = (eager.to(torch.float64) - exact).abs()
    finite = torch.isfinite(exact.to(eager.dtype))  # a float64 result beyond the dtype's range rounds to inf
    if not bool((torch.isfinite(onnx.to(torch.float64)) == finite).all()):
        return "non-finite where the float64 result is finite (or the reverse)"
    # Where eager itself overflowed (NaN or inf where the float64 result is finite: matrix_exp's float16 products),
    # eager's error says nothing of its rounding: those elements are judged by the tolerance and the error of the rest.
    eager_overflowed = ~torch.isfinite(eager_error)
    onnx_error, eager_error = onnx_error[finite], eager_error[finite & ~eager_overflowed]
    if onnx_error.numel() == 0:
        return None
    largest_eager_error = float(eager_error.max()) if eager_error.numel() else 0.0
    bound = atol + rtol * exact[finite].abs() + _ERROR_FACTOR * largest_eager_error
    if bool((onnx_error <= bound).all()):
        return None
    return f"vs float64: ONNX max err {float(onnx_error.max()):.3g}, eager max err {float(eager_error.max()):.3g}"


def _describe_mismatch(result: Any) -> str:
    if result.expected_dtype != result.actual_dtype:
        return f"{result.name}: dtype {result.actual_dtype}, eager {result.expected_dtype}"
    if result.expected_shape != result.actual_shape:
        return f"{result.name}: shape {list(result.actual_shape)}, eager {list(result.expected_shape)}"
    errors = f"max abs err {result.max_abs_error:.3g}, max rel err {result.max_rel_error:.3g}"
    return f"{result.name}: values differ, {errors}"
