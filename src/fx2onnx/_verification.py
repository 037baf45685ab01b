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

if TYPE_CHECKING:
    import onnxruntime

    from fx2onnx import _rounding_noise as rounding_noise  # imported by verify, when it judges rounding noise

import collections
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch.utils._pytree as pytree

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

    @property
    def criterion(self) -> str:
        """Why the output passed or failed: which tolerance held (a large relative error on values near zero
        passes within `atol`) or which was exceeded."""
        if self.actual_shape != self.expected_shape:
            return f"shape differs from eager's {list(self.expected_shape)}"
        if self.actual_dtype != self.expected_dtype:
            return "dtype differs from eager's"
        if self.noise is not None:
            verdict = "within" if self.noise.within_noise else "beyond"
            return f"{verdict} {self.noise.computed_in or self.expected_dtype} rounding noise: {self.noise}"
        if self.max_abs_error == 0:
            return "identical"
        if self.passed and self.max_abs_error <= self.atol:
            if self.max_rel_error > self.rtol:
                return f"within atol {self.atol:g}: the large relative error is on values near 0"
            return f"within atol {self.atol:g}"
        if self.passed and self.max_rel_error <= self.rtol:
            return f"within rtol {self.rtol:g}"
        verdict = "within" if self.passed else "beyond"
        return f"{verdict} atol + rtol * |eager| = {self.atol:g} + {self.rtol:g} * |eager|"

    def __str__(self) -> str:
        status = "ok" if self.passed else "MISMATCH"
        return (
            f"{self.name}: {status}, dtype {self.actual_dtype} (eager {self.expected_dtype}), shape "
            f"{list(self.actual_shape)}, max abs err {self.max_abs_error:.3g}, max rel err {self.max_rel_error:.3g} "
            f"({self.criterion})"
        )


class Verifications(list):  # list[OutputVerification]
    """``ONNXProgram.verify``'s result: one :class:`OutputVerification` per output, printed one line each."""

    @property
    def passed(self) -> bool:
        return all(result.passed for result in self)

    def __str__(self) -> str:
        return "\n".join(str(result) for result in self)


def match_inputs(
    in_spec: pytree.TreeSpec | None, args: tuple[Any, ...], kwargs: dict[str, Any], module: Any
) -> list[tuple[str, Any]]:
    """A call's inputs flattened in the order of the exported ones, each with its path (``x``, ``d['a']``).

    Inputs given by position or by name where the model was exported with the other are bound by the model's
    signature; dicts are matched by key, whatever their order. Anything else is refused with what was expected.
    """
    if in_spec is None or in_spec.type is not tuple or in_spec.num_children != 2:
        return [(f"input {i}", x) for i, x in enumerate(pytree.tree_leaves((tuple(args), dict(kwargs))))]
    args_spec, kwargs_spec = in_spec.children()
    keywords = list(kwargs_spec.context or [])
    parameters = _parameter_names(module)
    positional_names = [parameters[i] if i < len(parameters) else f"input {i}" for i in range(args_spec.num_children)]
    if (
        len(args) == args_spec.num_children + 1
        and isinstance(args[-1], dict)
        and args[-1]
        and set(args[-1]) | set(kwargs) == set(keywords)
    ):
        args, kwargs = args[:-1], {**kwargs, **args[-1]}  # torch.onnx's convention: a last dict holds keywords
    if len(args) != args_spec.num_children or set(kwargs) != set(keywords):
        args, kwargs = _rebind(module, positional_names, keywords, args, kwargs)
    leaves: list[tuple[str, Any]] = []
    for name, value, spec in zip(positional_names, args, args_spec.children()):
        leaves.extend(_flatten_like(spec, value, name))
    for key, spec in zip(keywords, kwargs_spec.children()):
        leaves.extend(_flatten_like(spec, kwargs[key], key))
    return leaves


def _parameter_names(module: Any) -> list[str]:
    """The names of the model's positional-or-keyword parameters; none if it takes ``*args``/``**kwargs``."""
    function = module.forward if isinstance(module, torch.nn.Module) else module
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return []
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [p.name for p in parameters if p.kind not in variadic]


def _rebind(
    module: Any, positional: list[str], keywords: list[str], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's inputs in the exported form (the same inputs by position, the same by name), or a clear error."""
    expected = ", ".join(positional + (["*"] if keywords and positional else []) + keywords)
    exported = f"the model was exported with inputs ({expected})"
    function = module.forward if isinstance(module, torch.nn.Module) else module
    try:
        signature = inspect.signature(function)
        bound = signature.bind(*args, **kwargs).arguments
    except TypeError as error:  # an unknown or repeated keyword, too many positional inputs
        raise ValueError(f"program(...) {error}: {exported}") from None
    except ValueError:  # no signature: only the exported form is accepted
        bound = None
    variadic = any(
        p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        for p in (signature.parameters.values() if bound is not None else [])
    )
    if bound is None or variadic:
        unexpected = sorted(set(kwargs) - set(keywords))
        raise ValueError(
            f"got {len(args)} positional inputs and keywords {sorted(kwargs)}"
            + (f" (unknown: {', '.join(unexpected)})" if unexpected else "")
            + f": {exported}; pass them the same way"
        )
    unexpected = [name for name in bound if name not in positional and name not in keywords]
    missing = [name for name in positional + keywords if name not in bound]
    if unexpected or missing:
        problems = ([f"unexpected input(s) {', '.join(unexpected)}"] if unexpected else []) + (
            [f"missing input(s) {', '.join(missing)}"] if missing else []
        )
        raise ValueError(f"program(...): {'; '.join(problems)}: {exported}")
    return tuple(bound[name] for name in positional), {key: bound[key] for key in keywords}


def _flatten_like(spec: pytree.TreeSpec, value: Any, path: str) -> list[tuple[str, Any]]:
    """`value`'s leaves in the order of `spec`'s, dicts matched by key; a clear error where the structures differ."""
    if spec.is_leaf():
        return [(path, value)]
    if spec.type in (dict, collections.OrderedDict, collections.defaultdict):
        keys = list(spec.context)
        if not isinstance(value, Mapping):
            raise ValueError(f"input {path} must be a dict with keys {keys} (as exported), got {_describe(value)}")
        missing = [k for k in keys if k not in value]
        unexpected = [k for k in value if k not in keys]
        if missing or unexpected:
            raise ValueError(
                f"input {path} has keys {list(value)}, the model was exported with {keys}"
                + (f": missing {missing}" if missing else "")
                + (f"{';' if missing else ':'} unexpected {unexpected}" if unexpected else "")
            )
        return [
            leaf
            for key, child in zip(keys, spec.children())
            for leaf in _flatten_like(child, value[key], f"{path}[{key!r}]")
        ]
    if spec.type in (tuple, list):
        if not isinstance(value, (tuple, list)) or len(value) != spec.num_children:
            raise ValueError(
                f"input {path} must be a {spec.type.__name__} of {spec.num_children} items (as exported), got "
                f"{_describe(value)}"
            )
        return [
            leaf
            for i, (item, child) in enumerate(zip(value, spec.children()))
            for leaf in _flatten_like(child, item, f"{path}[{i}]")
        ]
    children, value_spec = pytree.tree_flatten(value, is_leaf=lambda item: item is not value)
    if value_spec.type is not spec.type or value_spec.num_children != spec.num_children:
        raise ValueError(f"input {path} must be a {spec.type.__name__} like the exported one, got {_describe(value)}")
    keys, value_keys = spec.context, value_spec.context
    if keys != value_keys and isinstance(keys, list) and isinstance(value_keys, list) and set(keys) == set(value_keys):
        by_key = dict(zip(value_keys, children))
        children = [by_key[key] for key in keys]
    elif keys != value_keys:
        differences = _context_differences(keys, value_keys, "")
        counts_only = all(difference.split(":")[0].endswith("cumulative_length") for difference in differences)
        if differences and counts_only and _holds_whole_history(value):
            differences = []  # the graph reads the count from the keys' length (traced as plain layers)
        if differences and any("cumulative_length" in difference for difference in differences):
            raise ValueError(
                f"input {path} is a {spec.type.__name__} whose token counts differ from the exported one's "
                f"({'; '.join(differences[:4])}): its sliding-window layers were traced as plain layers (as "
                "transformers' exporter traces them), so the graph takes the whole history as the cache and reads "
                "the count from its length; eager's own cache past sliding_window - 1 tokens keeps only the window, "
                "which the graph cannot tell from a shorter history. Give the whole history (every key, "
                "cumulative_length their count), as the cache the graph returns"
            )
        if differences:
            raise ValueError(
                f"input {path} is a {spec.type.__name__} whose Python values differ from the exported one's "
                f"({'; '.join(differences[:4])}): the graph was traced with the exported values built in (a "
                "transformers sliding-window cache counts its tokens in a Python int, cumulative_length, which set "
                "the positions and the window's offset), so it would compute something else than eager here: "
                "export with an example holding these values"
            )
    return [
        leaf
        for i, (item, child) in enumerate(zip(children, spec.children()))
        for leaf in _flatten_like(child, item, f"{path}[{i}]")
    ]


def _holds_whole_history(cache: Any) -> bool:
    """Whether every transformers sliding-window layer of `cache` keeps every key it has seen (none cut)."""
    layers = [layer for layer in getattr(cache, "layers", None) or () if hasattr(layer, "cumulative_length")]
    return bool(layers) and all(
        getattr(layer, "keys", None) is not None and layer.cumulative_length == layer.keys.shape[-2] for layer in layers
    )


def _context_differences(exported: Any, given: Any, path: str) -> list[str]:
    """Where two pytree contexts (a container's non-tensor data) differ: ``layers[0].cumulative_length: 7 -> 20``;
    dicts and lists are compared item by item, anything else by equality."""
    if isinstance(exported, Mapping) and isinstance(given, Mapping) and set(exported) == set(given):
        return [d for key in exported for d in _context_differences(exported[key], given[key], f"{path}.{key}")]
    if isinstance(exported, (list, tuple)) and isinstance(given, (list, tuple)) and len(exported) == len(given):
        return [d for i, (a, b) in enumerate(zip(exported, given)) for d in _context_differences(a, b, f"{path}[{i}]")]
    try:
        same = bool(exported == given)
    except Exception:  # values without a truth value for ==: not compared
        return []
    return [] if same else [f"{path.lstrip('.') or 'context'}: {exported!r} exported, {given!r} given"]


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    if isinstance(value, np.ndarray):
        return f"a numpy {value.dtype} array of shape {list(value.shape)}"
    if isinstance(value, (bool, int, float, complex, np.generic)) or value is None:
        return repr(value)
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {list(value)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


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
    rtol, relative_atol = OPTIMIZATION_TOLERANCES.get(_computed_in(unoptimized), (0.0, 0.0))
    magnitude = 0.0
    if relative_atol and unoptimized.numel():
        finite = unoptimized.detach().abs().to(torch.float64)
        finite = finite[torch.isfinite(finite)]
        magnitude = float(finite.max()) if finite.numel() else 0.0
    atol = relative_atol * magnitude if magnitude else relative_atol * torch.finfo(torch.float64).tiny
    return compare(name, unoptimized, optimized, rtol=rtol, atol=atol)


def _computed_in(values: torch.Tensor) -> torch.dtype:
    """The dtype `values` were computed in, as far as they show it: a float64 output whose every finite value float32
    holds was computed in float32 (or narrower) and cast at the end (``model(x.float()).double()``), so float32's
    reordering noise applies to it."""
    if values.dtype in (torch.float64, torch.complex128):
        real = torch.view_as_real(values) if values.is_complex() else values
        finite = real[torch.isfinite(real)]
        if finite.numel() and torch.equal(finite.to(torch.float32).to(torch.float64), finite):
            return torch.complex64 if values.is_complex() else torch.float32
    return values.dtype


def to_ortvalue(onnxruntime: Any, tensor: torch.Tensor) -> Any:
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(
            tensor.view(torch.uint16).numpy(), onnx_element_type=int(ir.DataType.BFLOAT16)
        )
    if tensor.dtype in dtypes.FLOAT8:  # no numpy type: the bytes, typed for ONNX Runtime
        return onnxruntime.OrtValue.ortvalue_from_numpy_with_onnx_type(
            tensor.view(torch.uint8).numpy(), onnx_element_type=int(dtypes.to_onnx(tensor.dtype))
        )
    return onnxruntime.OrtValue.ortvalue_from_numpy(tensor.numpy())


_ORT_TYPE_NAMES = {f"tensor({dtype.name.lower()})": dtype for dtype in ir.DataType}


_ORT_TYPE_NAMES["tensor(float)"] = ir.DataType.FLOAT


_ORT_TYPE_NAMES["tensor(double)"] = ir.DataType.DOUBLE


# numpy has no such types (ONNX Runtime gives their bytes as uint8): copied bytewise into the torch dtype.
_RAW_TYPES = frozenset({ir.DataType.BFLOAT16, *(dtypes.to_onnx(dtype) for dtype in dtypes.FLOAT8)})


def to_torch(value: Any) -> torch.Tensor:
    dtype = _ORT_TYPE_NAMES.get(value.data_type())
    if dtype is not None and dtype.numpy() is not None and dtype not in _RAW_TYPES:
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
