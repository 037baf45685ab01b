"""The exported program: the ONNX model, with save, run (ONNX Runtime) and verify (against eager)."""

from __future__ import annotations

import collections
import copy
import ctypes
import dataclasses
import inspect
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx_ir as ir
import torch
import torch.utils._pytree as pytree

from fx2onnx import complex_layout, dtypes, rounding_noise, safe_save, streaming
from fx2onnx.capture import EXPORT_LOCK, flatten_inputs

if TYPE_CHECKING:
    import onnxruntime

    from fx2onnx.capture import CapturedGraph
    from fx2onnx.report import ExportReport

# Above this many bytes of weights, a model goes to external data (protobuf's limit is 2 GB).
EXTERNAL_DATA_THRESHOLD = int(1.5 * 1024**3)

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
    # exported model is within the dtype's rounding noise (then `passed`; see fx2onnx.rounding_noise).
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
            return f"{verdict} {self.expected_dtype} rounding noise: {self.noise}"
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


class ONNXProgram:
    """An exported model. Run it with ``program(*args)``; compare with eager with ``verify``."""

    def __init__(
        self,
        model: ir.Model,
        *,
        exported_program: torch.export.ExportedProgram | None,
        module: Any,
        in_spec: pytree.TreeSpec | None,
        report: ExportReport | None = None,
        captured: CapturedGraph | None = None,
    ) -> None:
        self.model = model
        self.exported_program = exported_program
        self.report = report
        self.captured = captured  # the ATen graph that was emitted (for verify(intermediates=True))
        self._module = module
        self._in_spec = in_spec
        self._input_layout = input_layout(captured, in_spec)
        self._session: onnxruntime.InferenceSession | None = None
        self._unoptimized_session: onnxruntime.InferenceSession | None = None

    # --- the model ------------------------------------------------------------------------------
    @property
    def model_proto(self) -> onnx.ModelProto:
        return ir.to_proto(self.model)

    @property
    def weight_bytes(self) -> int:
        return sum(v.const_value.nbytes for v in self.model.graph.initializers.values() if v.const_value is not None)

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        external_data: bool | str | None = None,
        direct_io: bool | None = None,
        durable: bool = True,
    ) -> str | None:
        """Write the model; weights go to ``<name>.data`` (or the file name `external_data` gives) when asked or
        above 1.5 GB. Returns the weights' file name (relative to the model's folder), or None.

        The save never corrupts, loses or escapes: the files are written in a temporary folder beside `path`,
        flushed to the disk, and swapped in, the weights under a name that nothing references yet, then the
        ``.onnx`` file in one rename; the model previously at `path` stays whole until then, and its weights'
        file is removed after (the folder holds exactly the files of the model saved). When a file of the
        weights' name already exists (the replaced model's), the new weights get a fresh name beside it
        (``model.onnx.3f9a1c2e.data``), which only the new model references. `external_data` must name a file
        inside the model's folder (a subfolder is fine); a failure leaves no file behind, and temporary folders
        of earlier saves that were killed are removed (fx2onnx/safe_save.py). The files and the folder are flushed
        to the disk (fsync) before and after the renames, so that the swap survives a power loss;
        ``durable=False`` skips that (faster where the disk is slow; the swap stays atomic if the process dies).

        ``direct_io=None`` writes files larger than Linux's dirty-page throttling point (several GB on most
        machines) with direct I/O, bypassing the page cache, and smaller ones buffered, so that they are in the
        page cache for the next load; ``True`` always writes directly (faster where the page cache is slow to
        fill, as on some VMs, but the next load then reads from the disk), ``False`` never.
        """
        path = os.path.abspath(os.fspath(path))
        directory, filename = os.path.split(path)
        if not filename:
            raise ValueError(f"save() needs a file path, not the folder {path!r}")
        if external_data is None:
            external_data = self.weight_bytes > EXTERNAL_DATA_THRESHOLD
        data_name: str | None = None
        if isinstance(external_data, str):
            data_name = safe_save.external_data_name(filename, external_data)
        elif external_data:
            data_name = f"{filename}.data"
        os.makedirs(directory, exist_ok=True)

        def write(staged_model: str, staged_data_name: str | None) -> None:
            if streaming.writes_protobuf(filename):  # weights go from the torch tensors to the file, uncopied
                streaming.save_model(self.model, staged_model, external_data=staged_data_name, direct_io=direct_io)
            else:
                ir.save(self.model, staged_model, external_data=staged_data_name)

        return safe_save.save_atomically(path, data_name, write, durable=durable)

    # --- running --------------------------------------------------------------------------------
    def session(self, *, optimized: bool = True) -> onnxruntime.InferenceSession:
        """The program's ONNX Runtime CPU session: default options (every graph optimization on), as a user's
        ``InferenceSession`` gets; ``optimized=False`` gives one with graph optimizations off (see
        :meth:`divergence`)."""
        cached = self._session if optimized else self._unoptimized_session
        if cached is not None:
            return cached
        if self.weight_bytes > EXTERNAL_DATA_THRESHOLD:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "model.onnx")
                self.save(path, external_data=True, durable=False)  # a temporary file: no fsync needed
                created = cpu_session(path, optimized=optimized)
        else:
            created = cpu_session(self.model_proto.SerializeToString(), optimized=optimized)
        if optimized:
            self._session = created
        else:
            self._unoptimized_session = created
        return created

    def __call__(self, *args: Any, **kwargs: Any) -> list[torch.Tensor | None]:
        """Run in ONNX Runtime; returns the flat list of outputs as torch tensors (None where the model returns None).

        Inputs are given as to the model (tensors, numpy arrays, or Python numbers for 0-d inputs), by position or
        by name, and nested dicts are matched by key; an unknown, missing or repeated input is refused with the
        inputs the model was exported with.
        """
        return self.run(args, kwargs)

    def run(
        self, args: Sequence[Any], kwargs: dict[str, Any] | None = None, *, optimized: bool = True
    ) -> list[torch.Tensor | None]:
        """``program(*args, **kwargs)``, in the session with graph optimizations on (default) or off."""
        import onnxruntime

        args, kwargs = tuple(args), dict(kwargs or {})
        session = self.session(optimized=optimized)
        graph_inputs = self.model.graph.inputs
        if self._input_layout is None:  # no record of the capture: the tensors, in the order given
            flat = flatten_inputs(self._in_spec, args, kwargs)
            values = [(f"input {i}", x) for i, x in enumerate(v for v in flat if isinstance(v, _ARRAYS))]
        else:
            values = []
            for (path, value), constant in zip(
                match_inputs(self._in_spec, args, kwargs, self._module), self._input_layout
            ):
                if constant is None:
                    values.append((path, value))
                elif not _same_constant(value, constant.value):
                    raise ValueError(
                        f"input {path} was exported as the constant {constant.value!r} (torch.export specializes "
                        f"Python numbers and None into the graph); got {_describe(value)}: export again with this "
                        "value, or make it a tensor"
                    )
        if len(values) != len(graph_inputs):
            wanted = ", ".join(_describe_input(v) for v in graph_inputs)
            given = ", ".join(f"{path}={_describe(value)}" for path, value in values) or "none"
            raise ValueError(
                f"the model takes {len(graph_inputs)} tensor inputs ({wanted}); got {len(values)}: {given}"
            )
        tensors = [_input_tensor(path, value, graph_input) for (path, value), graph_input in zip(values, graph_inputs)]
        names = [i.name for i in session.get_inputs()]
        feed = {name: _to_ortvalue(onnxruntime, tensor) for name, tensor in zip(names, tensors)}
        outputs = session.run_with_ort_values([o.name for o in session.get_outputs()], feed)
        return complex_layout.restore_outputs(self.model, [_to_torch(value) for value in outputs])

    def divergence(self, *args: Any, **kwargs: Any) -> list[OutputVerification]:
        """Compare the outputs of the default session (graph optimizations on) with those of a session with graph
        optimizations off, on the same inputs: integer and bool outputs must be equal, float outputs equal up to
        the rounding noise of reordered float arithmetic (:data:`OPTIMIZATION_TOLERANCES`).

        A divergence is an ONNX Runtime graph optimization that changes what the model computes
        (``docs/ort-defects.md``).
        """
        optimized = self.run(args, kwargs)
        unoptimized = self.run(args, kwargs, optimized=False)
        names = [v.name or f"output_{i}" for i, v in enumerate(self.model.graph.outputs)]
        unoptimized = [value for value in unoptimized if value is not None]  # Nones have no graph output
        optimized = [value for value in optimized if value is not None]
        return [
            compare_optimized(name, reference, result)
            for name, reference, result in zip(names, unoptimized, optimized, strict=True)
        ]

    def verify(
        self,
        *args: Any,
        rtol: float | None = None,
        atol: float | None = None,
        intermediates: bool = False,
        **kwargs: Any,
    ) -> Verifications:
        """Run eager and ONNX Runtime on the same inputs and compare every output (printed: one line each).

        `intermediates=True` also compares the value of every FX node with the ONNX value named after
        it and returns a :class:`fx2onnx.intermediates.Verification` (still the list of outputs) whose
        ``first_mismatch`` names the first node that differs, with its source line; the program's
        report records it.
        """
        if intermediates:
            from fx2onnx.intermediates import verify_with_intermediates

            return verify_with_intermediates(self, args, kwargs, rtol=rtol, atol=atol)
        # Eager may update its inputs (a KV cache appends this step's keys): it gets its own copy, so that ONNX
        # Runtime, and the caller, see the inputs as they were given.
        eager_args, eager_kwargs = copy.deepcopy((args, kwargs))
        with torch.no_grad(), EXPORT_LOCK:  # not while another thread traces the same model (capture.EXPORT_LOCK)
            expected = self._module(*eager_args, **eager_kwargs)
        # Python numbers the model returns (a size, a constant) are 0-d outputs of the graph: int64, bool, or float32
        # (fx2onnx's type for symbolic floats), the dtypes torch.tensor gives them. A None has no graph output and
        # comes back from ONNX Runtime as None, in its place.
        expected_flat = [
            x if x is None or isinstance(x, torch.Tensor) else torch.tensor(x)
            for x in pytree.tree_leaves(expected)
            if x is None or isinstance(x, (torch.Tensor, bool, int, float))
        ]
        actual_flat = self(*args, **kwargs)
        if len(actual_flat) != len(expected_flat):
            raise AssertionError(f"ONNX gives {len(actual_flat)} outputs, eager {len(expected_flat)}")
        nones = [i for i, (e, a) in enumerate(zip(expected_flat, actual_flat)) if e is None or a is None]
        mismatched = [i for i in nones if (expected_flat[i] is None) != (actual_flat[i] is None)]
        if mismatched:
            only = "eager" if expected_flat[mismatched[0]] is None else "ONNX Runtime"
            raise AssertionError(f"output {mismatched[0]} is None in {only}'s results only")
        expected_tensors = [e for i, e in enumerate(expected_flat) if i not in nones]
        actual = [a for i, a in enumerate(actual_flat) if i not in nones]
        names = [v.name or f"output_{i}" for i, v in enumerate(self.model.graph.outputs)]
        results = Verifications(
            compare(name, e, a, rtol=rtol, atol=atol) for name, e, a in zip(names, expected_tensors, actual)
        )
        if rtol is None and atol is None:  # tolerances given by the caller are the caller's verdict
            self._judge_rounding_noise(results, expected_tensors, actual, args, kwargs)
        return results

    def _judge_rounding_noise(
        self,
        results: list[OutputVerification],
        expected: list[torch.Tensor],
        actual: list[torch.Tensor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        """Outputs in float16/bfloat16 beyond the fixed tolerance pass if no farther from the float32 result
        than eager's own (deep low-precision models drift apart by rounding alone)."""
        low_precision = rounding_noise.LOW_PRECISION
        failed = [
            i
            for i, r in enumerate(results)
            if not r.passed and expected[i].dtype in low_precision and expected[i].dtype == actual[i].dtype
        ]
        if not failed:
            return
        with EXPORT_LOCK:  # runs the user's model (capture.EXPORT_LOCK)
            reference = rounding_noise.float32_outputs(self._module, *copy.deepcopy((args, kwargs)))
        if reference is None or len(reference) != len(expected):
            return
        for i in failed:
            floor = TOLERANCES[expected[i].dtype][1]
            noise = rounding_noise.compare_to_reference(expected[i], actual[i], reference[i], floor)
            if noise is not None:
                results[i].noise = noise
                results[i].passed = noise.within_noise


# --- matching a call's inputs with the exported ones ---------------------------------------------------------------
# What `program(...)` takes where the model took a tensor: torch tensors, numpy arrays and numpy scalars.
_ARRAYS = (torch.Tensor, np.ndarray, np.generic)


@dataclasses.dataclass(frozen=True)
class _Constant:
    """A flat input that torch.export specialized into the graph (a Python number, None): no graph input."""

    value: Any


def input_layout(captured: CapturedGraph | None, in_spec: pytree.TreeSpec | None) -> list[_Constant | None] | None:
    """Per flat input, in the order of `in_spec`'s leaves: None for a graph input, or the constant it became."""
    if captured is None or in_spec is None:
        return None
    graph_inputs = set(captured.user_inputs)
    layout: list[_Constant | None] = []
    for node in captured.graph.nodes:
        if node.op != "placeholder":
            continue
        if node in graph_inputs:
            layout.append(None)
        elif node in captured.constant_inputs:
            layout.append(_Constant(captured.constant_inputs[node]))
    return layout if len(layout) == in_spec.num_leaves else None


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
    return [
        leaf
        for i, (item, child) in enumerate(zip(children, spec.children()))
        for leaf in _flatten_like(child, item, f"{path}[{i}]")
    ]


def _same_constant(value: Any, constant: Any) -> bool:
    if value is None or constant is None or isinstance(value, _ARRAYS):
        return value is constant
    if isinstance(value, float) and isinstance(constant, float) and value != value and constant != constant:
        return True  # both NaN
    try:
        return bool(value == constant)
    except Exception:  # an object without a plain equality: not ours to judge
        return True


def _input_tensor(path: str, value: Any, graph_input: ir.Value) -> torch.Tensor:
    """A call's input as the torch tensor the graph input takes (complex in the real layout), or a clear error."""
    expected = graph_input.dtype
    if isinstance(value, torch.Tensor):
        tensor = value
    elif isinstance(value, (np.ndarray, np.generic)):
        try:
            tensor = torch.from_numpy(np.ascontiguousarray(value))
        except TypeError as error:
            raise TypeError(f"input {path}: numpy array of dtype {value.dtype} has no torch dtype ({error})") from None
    elif (
        isinstance(value, (bool, int, float, complex))
        and expected is not None
        and dtypes.to_torch(expected) is not None
    ):
        tensor = torch.tensor(value, dtype=dtypes.to_torch(expected))
    else:
        raise TypeError(f"input {path} is {_describe(value)}: the model takes {_describe_input(graph_input)}")
    tensor = complex_layout.as_real(tensor)
    if expected is not None and dtypes.to_onnx(tensor.dtype) != expected:
        raise TypeError(
            f"input {path} is {_describe(value)}: the model takes {_describe_input(graph_input)}; convert it "
            f"(.to({dtypes.to_torch(expected)}))"
        )
    return tensor


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


def _describe_input(value: ir.Value) -> str:
    torch_dtype = dtypes.to_torch(value.dtype) if value.dtype is not None else None
    dtype = str(torch_dtype).removeprefix("torch.") if torch_dtype is not None else "?"
    shape = "[" + ", ".join(str(d) for d in value.shape) + "]" if value.shape is not None else "?"
    return f"{value.name}: {dtype} tensor of shape {shape}"


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


def _to_ortvalue(onnxruntime: Any, tensor: torch.Tensor) -> Any:
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


def _to_torch(value: Any) -> torch.Tensor:
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
