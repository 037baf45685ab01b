"""The exported program: the ONNX model, with save, run (ONNX Runtime) and verify (against eager)."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnx
import onnx_ir as ir
import torch
import torch.utils._pytree as pytree

from fx2onnx import _complex_layout as complex_layout
from fx2onnx import _rounding_noise as rounding_noise
from fx2onnx import _streaming as streaming
from fx2onnx._capture import flatten_inputs
from fx2onnx._intermediates import verify_with_intermediates
from fx2onnx._verification import (
    TOLERANCES,
    OutputVerification,
    compare,
    compare_optimized,
    cpu_session,
    to_ortvalue,
    to_torch,
)

if TYPE_CHECKING:
    import onnxruntime

    from fx2onnx._capture import CapturedGraph
    from fx2onnx.report import ExportReport


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
    ) -> None:
        """Write the model; weights go to ``<name>.data`` when asked or above 1.5 GB.

        The write is atomic: files are written in a temporary folder beside `path` and moved into
        place only once complete, so a failure leaves no partial file. ``direct_io=None`` writes files
        larger than Linux's dirty-page throttling point (several GB on most machines) with direct I/O,
        bypassing the page cache, and smaller ones buffered, so that they are in the page cache for
        the next load; ``True`` always writes directly (faster where the page cache is slow to fill, as
        on some VMs, but the next load then reads from the disk), ``False`` never.
        """
        path = os.path.abspath(os.fspath(path))
        directory, filename = os.path.split(path)
        os.makedirs(directory, exist_ok=True)
        if external_data is None:
            external_data = self.weight_bytes > streaming.EXTERNAL_DATA_THRESHOLD
        data_name = external_data if isinstance(external_data, str) else (f"{filename}.data" if external_data else None)
        staging = tempfile.mkdtemp(prefix=".fx2onnx-", dir=directory)
        try:
            staged_model = os.path.join(staging, filename)
            if streaming.writes_protobuf(filename):  # weights go from the torch tensors to the file, uncopied
                streaming.save_model(self.model, staged_model, external_data=data_name, direct_io=direct_io)
            else:
                ir.save(self.model, staged_model, external_data=data_name)
            if data_name is not None:
                os.replace(os.path.join(staging, data_name), os.path.join(directory, data_name))
            os.replace(staged_model, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    # --- running --------------------------------------------------------------------------------
    def session(self, *, optimized: bool = True) -> onnxruntime.InferenceSession:
        """The program's ONNX Runtime CPU session: default options (every graph optimization on), as a user's
        ``InferenceSession`` gets; ``optimized=False`` gives one with graph optimizations off (see
        :meth:`divergence`)."""
        cached = self._session if optimized else self._unoptimized_session
        if cached is not None:
            return cached
        if self.weight_bytes > streaming.EXTERNAL_DATA_THRESHOLD:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "model.onnx")
                self.save(path, external_data=True)
                created = cpu_session(path, optimized=optimized)
        else:
            created = cpu_session(self.model_proto.SerializeToString(), optimized=optimized)
        if optimized:
            self._session = created
        else:
            self._unoptimized_session = created
        return created

    def __call__(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        """Run in ONNX Runtime; returns the flat list of outputs as torch tensors."""
        return self.run(args, kwargs)

    def run(
        self, args: Sequence[Any], kwargs: dict[str, Any] | None = None, *, optimized: bool = True
    ) -> list[torch.Tensor]:
        """``program(*args, **kwargs)``, in the session with graph optimizations on (default) or off."""
        import onnxruntime

        session = self.session(optimized=optimized)
        flat = [
            x
            for x in flatten_inputs(self._in_spec, tuple(args), kwargs or {})
            if isinstance(x, (torch.Tensor, int, float, bool))
        ]
        names = [i.name for i in session.get_inputs()]
        # Complex tensors travel as (..., 2) real ones (fx2onnx._complex_layout).
        tensors = [complex_layout.as_real(x) for x in flat if isinstance(x, torch.Tensor)]
        if len(tensors) != len(names):
            raise ValueError(f"the model takes {len(names)} tensor inputs ({names}), got {len(tensors)}")
        feed = {name: to_ortvalue(onnxruntime, tensor) for name, tensor in zip(names, tensors)}
        outputs = session.run_with_ort_values([o.name for o in session.get_outputs()], feed)
        return complex_layout.restore_outputs(self.model, [to_torch(value) for value in outputs])

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
    ) -> list[OutputVerification]:
        """Run eager and ONNX Runtime on the same inputs and compare every output.

        `intermediates=True` also compares the value of every FX node with the ONNX value named after
        it and returns a :class:`fx2onnx._intermediates.Verification` (still the list of outputs) whose
        ``first_mismatch`` names the first node that differs, with its source line; the program's
        report records it.
        """
        if intermediates:
            return verify_with_intermediates(self, args, kwargs, rtol=rtol, atol=atol)
        # Eager may update its inputs (a KV cache appends this step's keys): it gets its own copy, so that ONNX
        # Runtime, and the caller, see the inputs as they were given.
        eager_args, eager_kwargs = copy.deepcopy((args, kwargs))
        with torch.no_grad():
            expected = self._module(*eager_args, **eager_kwargs)
        # Python numbers the model returns (a size, a constant) are 0-d outputs of the graph: int64, bool, or float32
        # (fx2onnx's type for symbolic floats), the dtypes torch.tensor gives them.
        expected_flat = [
            x if isinstance(x, torch.Tensor) else torch.tensor(x)
            for x in pytree.tree_leaves(expected)
            if isinstance(x, (torch.Tensor, bool, int, float))
        ]
        actual = self(*args, **kwargs)
        names = [v.name or f"output_{i}" for i, v in enumerate(self.model.graph.outputs)]
        if len(actual) != len(expected_flat):
            raise AssertionError(f"ONNX gives {len(actual)} outputs, eager {len(expected_flat)}")
        results = [compare(name, e, a, rtol=rtol, atol=atol) for name, e, a in zip(names, expected_flat, actual)]
        if rtol is None and atol is None:  # tolerances given by the caller are the caller's verdict
            self._judge_rounding_noise(results, expected_flat, actual, args, kwargs)
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
        reference = rounding_noise.float32_outputs(self._module, *copy.deepcopy((args, kwargs)))
        if reference is None or len(reference) != len(expected):
            return
        for i in failed:
            floor = TOLERANCES[expected[i].dtype][1]
            noise = rounding_noise.compare_to_reference(expected[i], actual[i], reference[i], floor)
            if noise is not None:
                results[i].noise = noise
                results[i].passed = noise.within_noise
