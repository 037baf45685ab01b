"""The exported program: the ONNX model, with save, run (ONNX Runtime) and verify (against eager)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import tempfile
import textwrap
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

import numpy as np
import onnx
import onnx_ir as ir
import torch
import torch.utils._pytree as pytree
from onnx_ir.tensor_adapters import TorchTensor

from fx2onnx import _complex_layout as complex_layout
from fx2onnx import _dtypes as dtypes
from fx2onnx import _safe_save as safe_save
from fx2onnx import _streaming as streaming
from fx2onnx import _weights as checkpoint_weights
from fx2onnx._capture import EXPORT_LOCK, SPARSE_PART, SPARSE_PARTS, sparse_part
from fx2onnx._capture_pytrees import flatten_inputs
from fx2onnx._verification import (
    TOLERANCES,
    OutputVerification,
    Verifications,
    _describe,
    compare,
    compare_optimized,
    cpu_session,
    match_inputs,
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
        weights: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        optimized: bool = True,
        swappable_weights: frozenset[str] = frozenset(),
    ) -> None:
        self.model = model
        self.optimized = optimized  # export(optimize=...): whether the onnxscript optimizer ran before legalize
        self.weights = weights  # the checkpoint of a model exported without weights in memory (fx2onnx/_weights.py)
        self.exported_program = exported_program
        self.report = report
        self.captured = captured  # the ATen graph that was emitted (for verify(intermediates=True))
        self._module = module
        self._in_spec = in_spec
        self._input_layout = input_layout(captured, in_spec)
        self._session: onnxruntime.InferenceSession | None = None
        self._unoptimized_session: onnxruntime.InferenceSession | None = None
        # apply_weights: the weights whose initializers it may swap in place (the export never read their values,
        # fx2onnx/_weight_reads.py), the export to run again for the others, and the weights applied (eager runs
        # with them in verify)
        self.swappable_weights = swappable_weights
        self.export_again: Callable[[Any], ONNXProgram] | None = None
        self._applied: dict[str, torch.Tensor] = {}

    def __repr__(self) -> str:
        model = textwrap.indent(str(self.model), " " * 8)
        program = textwrap.indent(str(self.exported_program), " " * 8)
        return f"ONNXProgram(\n    model=\n{model}\n    ,\n    exported_program=\n{program}\n)\n"

    # --- the model ------------------------------------------------------------------------------
    @property
    def model_proto(self) -> onnx.ModelProto:
        return ir.to_proto(self.model)

    @property
    def weight_bytes(self) -> int:
        return sum(v.const_value.nbytes for v in self.model.graph.initializers.values() if v.const_value is not None)

    def save(
        self,
        destination: str | os.PathLike[str] | BinaryIO,
        *,
        external_data: bool | str | None = None,
        direct_io: bool | None = None,
        durable: bool = True,
        weights: Literal["copy", "reference"] = "copy",
        include_initializers: bool = True,
        keep_initializers_as_inputs: bool = False,
    ) -> str | None:
        """Write the model; weights go to ``<name>.data`` (or the file name `external_data` gives) when asked or
        above 1.5 GB. Returns the weights' file name (relative to the model's folder), or None.

        The save never corrupts, loses or escapes: the files are written in a temporary folder beside `destination`,
        flushed to the disk, and swapped in, the weights under a name that nothing references yet, then the
        ``.onnx`` file in one rename; the model previously at `destination` stays whole until then, and its weights'
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

        ``weights="reference"`` (a model exported with ``weights=CHECKPOINT``): the weights that the checkpoint
        holds as the model needs them (same dtype; Linear weights are referenced untransposed, behind a
        ``Transpose`` node that ONNX Runtime folds at load) are not copied: the model's external data points at
        their bytes in the checkpoint's ``.safetensors`` files. ONNX requires external data inside the model's
        folder (``onnx.checker`` refuses ``..``, symbolic and hard links), so the model must be saved into the
        checkpoint's folder (or a folder holding it), else :class:`~fx2onnx.errors.WeightsError` and nothing is
        written. The save takes seconds and no disk space for those weights; weights converted to another dtype
        are copied to the external data file (with a warning). The model then depends on the checkpoint's files:
        moving or changing them breaks or changes it (``verify_weights`` says so); saving over it never removes
        them.

        `destination` may also be a binary file object (``io.BytesIO``, as torch.onnx.export's `f`): the model is
        written to it as one protobuf, weights included (no external data). ``keep_initializers_as_inputs=True``
        lists the initializers among the graph's inputs too (a runtime may then be fed other values for them);
        ``include_initializers=False`` leaves their data out of the file, and then they must be inputs (as
        torch.onnx's TorchScript exporter made them for ``export_params=False``): the model in memory is unchanged.
        """
        path = destination  # torch.onnx's name for it
        if not include_initializers and not keep_initializers_as_inputs:
            raise ValueError(
                "include_initializers=False without keep_initializers_as_inputs=True leaves the weights' values "
                "undefined (the model fails onnx.checker); pass keep_initializers_as_inputs=True to have them as "
                "graph inputs"
            )
        if keep_initializers_as_inputs:
            with initializers_as_inputs(self.model, keep_data=include_initializers):
                return self.save(
                    path, external_data=external_data, direct_io=direct_io, durable=durable, weights=weights
                )
        if not isinstance(path, (str, os.PathLike)):
            if external_data or weights != "copy":
                raise ValueError("a file object takes the model as one protobuf: save to a path for external data")
            path.write(self.model_proto.SerializeToString())
            return None
        if weights not in ("copy", "reference"):
            raise ValueError(f"weights={weights!r}: 'copy' (write the weights into the model's files) or 'reference'")
        if weights == "reference":
            if self.weights is None:
                raise ValueError(
                    "weights='reference' points the model at the checkpoint given to export(weights=...); this model "
                    "was exported with its weights in memory: save it with weights='copy' (the default)"
                )
            if external_data is False:
                raise ValueError("weights='reference' saves the weights as external data: leave external_data unset")
            if external_data is None:
                external_data = True
            if not streaming.writes_protobuf(os.fspath(path)):
                raise ValueError(f"weights='reference' needs a binary .onnx file, not {os.fspath(path)!r}")
        path = os.path.abspath(os.fspath(path))
        directory, filename = os.path.split(path)
        if not filename:
            raise ValueError(f"save() needs a file path, not the folder {path!r}")
        if external_data is None:
            external_data = self.weight_bytes > streaming.EXTERNAL_DATA_THRESHOLD
        data_name: str | None = None
        if isinstance(external_data, str):
            data_name = safe_save.external_data_name(filename, external_data)
        elif external_data:
            data_name = f"{filename}.data"
        os.makedirs(directory, exist_ok=True)

        def write(staged_model: str, staged_data_name: str | None) -> None:
            if streaming.writes_protobuf(filename):  # weights go from the torch tensors to the file, uncopied
                streaming.save_model(
                    self.model,
                    staged_model,
                    external_data=staged_data_name,
                    direct_io=direct_io,
                    reference_from=directory if weights == "reference" else None,
                )
            else:
                ir.save(self.model, staged_model, external_data=staged_data_name)

        return safe_save.save_atomically(path, data_name, write, durable=durable)

    def verify_weights(
        self, path: str | os.PathLike[str], *, samples: int = 64, full: bool = False
    ) -> checkpoint_weights.WeightsCheck:
        """Check the model saved at `path` without loading its weights: ``onnx.checker`` (``full_check``), every
        external-data reference complete and in bounds, and, for a model exported with ``weights=``, `samples`
        elements of every initializer read from the checkpoint compared byte for byte with it (``full=True``:
        every byte). The result prints one line (and the problems); ``.passed`` says whether all is well."""
        return checkpoint_weights.verify_weights(path, self.weights, samples=samples, full=full)

    def optimize(self) -> None:
        """torch.onnx's ``onnx_program.optimize()``, as its tutorial calls it before ``save``: the export already
        optimized the model (``optimize=True``, the default), so this does nothing. A model exported with
        ``optimize=False`` is refused: optimizing after legalize could fold away the Casts around nodes ONNX
        Runtime has no kernel for; export again with ``optimize=True``."""
        if not self.optimized:
            raise ValueError(
                "this model was exported with optimize=False; fx2onnx optimizes before making the model legal for "
                "ONNX Runtime, which optimizing now could undo: export again with optimize=True"
            )

    def release(self) -> None:
        """Drop the ONNX Runtime sessions (torch.onnx's ``release``); the next run creates them again."""
        self._session = None
        self._unoptimized_session = None

    def apply_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """torch.onnx's ``apply_weights``: the model computes with these weights (keyed by the module's
        ``state_dict`` names) from now on, in ``save``, ``program(...)`` and ``verify`` (whose eager run gets them
        too; the module itself is left unchanged).

        A weight that the export used only as an initializer of its name is swapped in place. A weight the export
        read the values of (folded into a constant, as batch norm's statistics or a transposed Linear weight are, or
        merged with an equal one) is applied by exporting the module again with the weights given in place of its
        own (with the export's arguments), since swapping its initializer alone would leave the model computing
        with the old values. A name the graph does not read is skipped with a warning, as torch does; a weight of
        another shape or dtype than the module's is refused.
        """
        if self.weights is not None:
            raise ValueError(
                "this model's weights come from the checkpoint given to export(weights=...): export again with "
                "weights= naming the new ones"
            )
        captured = {name: tensor for name, tensor in self.captured.weights.values()} if self.captured else {}
        changed: dict[str, torch.Tensor] = {}
        for name, tensor in state_dict.items():
            if name not in captured:
                warnings.warn(
                    f"Weight {name!r} not found in the model (its graph does not read it). Skipped applying.",
                    stacklevel=2,
                )
                continue
            old = captured[name]
            if not isinstance(tensor, torch.Tensor) or tensor.shape != old.shape or tensor.dtype != old.dtype:
                raise ValueError(
                    f"apply_weights: {name!r} is {_describe(tensor)}; the model's is {_describe(old)}: convert it, "
                    "or export the module built for it"
                )
            if not _same_tensor(tensor, old) and not torch.equal(tensor.detach(), old):
                # a tied weight (one tensor under several names, each its own graph input) changes under all of them
                changed.update((alias, tensor.detach()) for alias, held in captured.items() if _same_tensor(held, old))
        if not changed:
            return
        if set(changed) <= self.swappable_weights:
            for name, tensor in changed.items():
                self.model.graph.initializers[name].const_value = TorchTensor(
                    complex_layout.as_real(tensor).contiguous(), name=name
                )
            if self.captured is not None:  # verify(intermediates=True) runs the captured graph with them
                for node, (name, _) in list(self.captured.weights.items()):
                    if name in changed:
                        self.captured.weights[node] = (name, changed[name])
        elif self.export_again is None:
            raise ValueError(
                f"the export read the values of {', '.join(sorted(set(changed) - self.swappable_weights))} (folded "
                "into constants, or compared), and this program cannot be exported again (exported from an "
                "ExportedProgram): export the module holding the new weights (module.load_state_dict(state_dict))"
            )
        else:
            with applied_weights(self._module, {**self._applied, **changed}):
                again = self.export_again(self._module)
            self.model, self.exported_program, self.captured = again.model, again.exported_program, again.captured
            self.report, self._in_spec, self._input_layout = again.report, again._in_spec, again._input_layout
            self.swappable_weights = again.swappable_weights
        self._applied.update(changed)
        self.release()

    def initialize_inference_session(
        self, initializer: Callable[[str | bytes], onnxruntime.InferenceSession] | None = None
    ) -> None:
        """torch.onnx's ``initialize_inference_session``: create the session ``program(...)`` runs in, by
        ``initializer`` (given the serialized model, or the path of a temporary copy for a model above 1.5 GB of
        weights) or, without it, the default CPU session."""
        self._session = self._new_session(optimized=True, initializer=initializer)

    # --- running --------------------------------------------------------------------------------
    def session(self, *, optimized: bool = True) -> onnxruntime.InferenceSession:
        """The program's ONNX Runtime CPU session: default options (every graph optimization on), as a user's
        ``InferenceSession`` gets; ``optimized=False`` gives one with graph optimizations off (see
        :meth:`divergence`)."""
        cached = self._session if optimized else self._unoptimized_session
        if cached is not None:
            return cached
        created = self._new_session(optimized=optimized)
        if optimized:
            self._session = created
        else:
            self._unoptimized_session = created
        return created

    def _new_session(
        self,
        *,
        optimized: bool,
        initializer: Callable[[str | bytes], onnxruntime.InferenceSession] | None = None,
    ) -> onnxruntime.InferenceSession:
        def create(model: str | bytes) -> onnxruntime.InferenceSession:
            return initializer(model) if initializer is not None else cpu_session(model, optimized=optimized)

        if self.weight_bytes > streaming.EXTERNAL_DATA_THRESHOLD:
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "model.onnx")
                self.save(path, external_data=True, durable=False)  # a temporary file: no fsync needed
                return create(path)
        return create(self.model_proto.SerializeToString())

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

        tensors = self._input_tensors(args, kwargs)
        session = self.session(optimized=optimized)
        names = [i.name for i in session.get_inputs()]
        feed = {name: to_ortvalue(onnxruntime, tensor) for name, tensor in zip(names, tensors)}
        outputs = session.run_with_ort_values([o.name for o in session.get_outputs()], feed)
        return complex_layout.restore_outputs(self.model, [to_torch(value) for value in outputs])

    def _input_tensors(self, args: Sequence[Any], kwargs: dict[str, Any] | None) -> list[torch.Tensor]:
        """A call's inputs as the torch tensors the graph's inputs take, in their order, or a clear error."""
        args, kwargs = tuple(args), dict(kwargs or {})
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
        values = [part for path, value in values for part in _sparse_parts(path, value)]
        if len(values) != len(graph_inputs):
            wanted = ", ".join(_describe_input(v) for v in graph_inputs)
            given = ", ".join(f"{path}={_describe(value)}" for path, value in values) or "none"
            raise ValueError(
                f"the model takes {len(graph_inputs)} tensor inputs ({wanted}); got {len(values)}: {given}"
            )
        return [_input_tensor(path, value, graph_input) for (path, value), graph_input in zip(values, graph_inputs)]

    def compute_values(
        self, value_names: Sequence[str], args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> list[torch.Tensor]:
        """torch.onnx's ``compute_values``: the values of the graph named `value_names` (node outputs, inputs or
        initializers of the main graph) on these inputs, computed in ONNX Runtime, as torch tensors (complex
        values in their real layout, as the graph holds them)."""
        import onnxruntime

        graph = self.model.graph
        values: dict[str, ir.Value] = {v.name: v for v in (*graph.inputs, *graph.initializers.values()) if v.name}
        values.update((v.name, v) for node in graph for v in node.outputs if v.name)
        unknown = [name for name in value_names if name not in values]
        if unknown:
            raise ValueError(f"no value of the model's graph is named {', '.join(map(repr, unknown))}")
        tensors = self._input_tensors(args, kwargs or {})
        outputs = list(graph.outputs)
        graph.outputs.clear()
        graph.outputs.extend(values[name] for name in value_names)
        try:
            session = self._new_session(optimized=True)
        finally:
            graph.outputs.clear()
            graph.outputs.extend(outputs)
        feed = {i.name: to_ortvalue(onnxruntime, t) for i, t in zip(session.get_inputs(), tensors)}
        return [to_torch(value) for value in session.run_with_ort_values(list(value_names), feed)]

    def call_reference(self, *args: Any, **kwargs: Any) -> list[torch.Tensor | None]:
        """torch.onnx's ``call_reference``: ``program(*args, **kwargs)`` computed by ONNX's reference
        implementation (``onnx.reference.ReferenceEvaluator``) instead of ONNX Runtime."""
        import onnx.reference

        evaluator = onnx.reference.ReferenceEvaluator(self.model_proto)
        tensors = self._input_tensors(args, kwargs)
        feed = {v.name: ir.tensor(t).numpy() for v, t in zip(self.model.graph.inputs, tensors)}
        outputs = evaluator.run(None, feed)
        return complex_layout.restore_outputs(self.model, [_numpy_to_torch(array) for array in outputs])

    def rename_axes(self, rename_mapping: Mapping[str | ir.SymbolicDim, str]) -> None:
        """torch.onnx's ``rename_axes``: the dim_params named by the mapping's keys (names, or the
        ``SymbolicDim`` of a value's shape) get the mapping's names, on every value of the model."""
        renamed = {str(k.value) if isinstance(k, ir.SymbolicDim) else str(k): str(v) for k, v in rename_mapping.items()}
        graph = self.model.graph
        every = [*graph.inputs, *graph.initializers.values(), *graph.outputs]
        every += [v for node in ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs]
        for value in every:
            if value.shape is None or not any(
                isinstance(d, ir.SymbolicDim) and d.value in renamed for d in value.shape
            ):
                continue
            value.shape = ir.Shape(
                [
                    ir.SymbolicDim(renamed[d.value]) if isinstance(d, ir.SymbolicDim) and d.value in renamed else d
                    for d in value.shape
                ]
            )
        self.release()

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
        it and returns a :class:`fx2onnx._intermediates.Verification` (still the list of outputs) whose
        ``first_mismatch`` names the first node that differs, with its source line; the program's
        report records it.
        """
        if intermediates:
            from fx2onnx._intermediates import verify_with_intermediates  # only here: an export needs none of it

            with applied_weights(self._module, self._applied):
                return verify_with_intermediates(self, args, kwargs, rtol=rtol, atol=atol)
        # Eager may update its inputs (a KV cache appends this step's keys): it gets its own copy, so that ONNX
        # Runtime, and the caller, see the inputs as they were given.
        eager_args, eager_kwargs = _copy_inputs((args, kwargs))
        # Under the lock: while another thread traces the same model, its parameters are fake tensors for a while
        # (capture.EXPORT_LOCK), and the check below would take them for a weightless model.
        with torch.no_grad(), EXPORT_LOCK:
            if isinstance(self._module, torch.nn.Module) and any(
                checkpoint_weights.is_weightless(t) for t in (*self._module.parameters(), *self._module.buffers())
            ):
                raise ValueError(
                    "the model was exported without weights in memory (meta or fake tensors): eager cannot run it; "
                    "compare program(...) with a model built with the weights, or check the saved weights with "
                    "verify_weights(path)"
                )
            with applied_weights(self._module, self._applied):
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
        than eager's own (deep low-precision models drift apart by rounding alone). So do float32 outputs of a
        model whose weights are float16/bfloat16 (Mamba's ``logits.float()``): float32 in dtype only, they carry
        the rounding noise of the dtype the model computed in, which the float32 tolerance cannot hold."""
        from fx2onnx import _rounding_noise as rounding_noise  # only here: an export needs none of it

        low_precision = rounding_noise.LOW_PRECISION
        computed_in = rounding_noise.weights_dtype(self._module)

        def noisy(dtype: torch.dtype) -> bool:
            return dtype in low_precision or (dtype == rounding_noise.REFERENCE_DTYPE and computed_in is not None)

        failed = [
            i
            for i, r in enumerate(results)
            if not r.passed and noisy(expected[i].dtype) and expected[i].dtype == actual[i].dtype
        ]
        if not failed:
            return
        with EXPORT_LOCK, applied_weights(self._module, self._applied):  # runs the user's model (capture.EXPORT_LOCK)
            reference = rounding_noise.float32_outputs(self._module, *_copy_inputs((args, kwargs)))
        if reference is None or len(reference) != len(expected):
            return
        for i in failed:
            floor = TOLERANCES[expected[i].dtype][1]
            noise = rounding_noise.compare_to_reference(expected[i], actual[i], reference[i], floor)
            if noise is not None and expected[i].dtype not in low_precision:
                noise = dataclasses.replace(noise, computed_in=str(computed_in).removeprefix("torch."))
            if noise is not None:
                results[i].noise = noise
                results[i].passed = noise.within_noise


@contextlib.contextmanager
def initializers_as_inputs(model: ir.Model, *, keep_data: bool, names: Collection[str] | None = None) -> Iterator[None]:
    """`model`'s initializers (those of `names`, or all) appended to its graph inputs (and, unless `keep_data`, out of
    its initializers) while it is saved: torch.onnx's keep_initializers_as_inputs and export_params=False."""
    graph = model.graph
    initializers = {name: value for name, value in graph.initializers.items() if names is None or name in names}
    inputs = list(graph.inputs)
    graph.inputs.extend(initializers.values())
    if not keep_data:
        for name in initializers:
            graph.initializers.pop(name)
    try:
        yield
    finally:
        if not keep_data:
            graph.initializers.update(initializers)
        graph.inputs.clear()
        graph.inputs.extend(inputs)


@contextlib.contextmanager
def applied_weights(module: Any, tensors: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """`module` holding `tensors` (by ``state_dict`` name) in place of its own while inside: every attribute
    holding the tensor a name gives (a tied weight under all its names) is replaced, and restored on the way out."""
    if not tensors or not isinstance(module, torch.nn.Module):
        yield
        return
    holders: dict[int, list[tuple[dict[str, Any], str]]] = {}
    for owner in module.modules(remove_duplicate=False):
        for slots in (owner._parameters, owner._buffers, owner.__dict__):
            for attribute, value in slots.items():
                if isinstance(value, torch.Tensor):
                    holders.setdefault(id(value), []).append((slots, attribute))
    replaced: list[tuple[dict[str, Any], str, Any]] = []
    try:
        for name, tensor in tensors.items():
            prefix, _, attribute = name.rpartition(".")
            owner = module.get_submodule(prefix)
            original = owner._parameters.get(attribute, owner._buffers.get(attribute, owner.__dict__.get(attribute)))
            for slots, held in holders.get(id(original), []):
                new = (
                    torch.nn.Parameter(tensor, requires_grad=False)
                    if slots.get(held) is not None and isinstance(slots[held], torch.nn.Parameter)
                    else tensor
                )
                replaced.append((slots, held, slots[held]))
                slots[held] = new
        yield
    finally:
        for slots, held, original in reversed(replaced):
            slots[held] = original


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` are one tensor (the same object, or views of the same memory alike in every way)."""
    if a is b:
        return True
    if a.device.type == "meta" or b.device.type == "meta" or a.layout != torch.strided or b.layout != torch.strided:
        return False
    return (a.untyped_storage().data_ptr(), a.storage_offset(), a.shape, a.stride(), a.dtype) == (
        b.untyped_storage().data_ptr(),
        b.storage_offset(),
        b.shape,
        b.stride(),
        b.dtype,
    )


def _numpy_to_torch(array: np.ndarray) -> torch.Tensor:
    """An array of ONNX's reference evaluator as a torch tensor (bfloat16 and float8 arrays of ml_dtypes too)."""
    array = np.ascontiguousarray(array)
    try:
        return torch.from_numpy(array)
    except TypeError:
        dtype = dtypes.to_torch(ir.DataType.from_numpy(array.dtype))
        bits = {1: np.uint8, 2: np.uint16}[array.dtype.itemsize]
        return torch.from_numpy(array.view(bits)).view(dtype)


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
            if node.meta.get(SPARSE_PART, (0,))[0] == 0:  # a sparse input's parts are one flat input
                layout.append(None)
        elif node in captured.constant_inputs:
            layout.append(_Constant(captured.constant_inputs[node]))
    return layout if len(layout) == in_spec.num_leaves else None


def _copy_inputs(inputs: Any) -> Any:
    """A deep copy of call inputs; sparse tensors (which ``copy.deepcopy`` refuses: no storage) are cloned."""
    memo: dict[int, Any] = {
        id(leaf): leaf.clone()
        for leaf in pytree.tree_leaves(inputs)
        if isinstance(leaf, torch.Tensor) and leaf.layout != torch.strided
    }
    return copy.deepcopy(inputs, memo)


def _sparse_parts(path: str, value: Any) -> list[tuple[str, Any]]:
    """A sparse tensor as the graph inputs it was exported as (capture's SPARSE_PARTS); anything else as is."""
    if isinstance(value, torch.Tensor) and value.layout in SPARSE_PARTS:
        return [(f"{path}.{name}()", sparse_part(value, name)) for name in SPARSE_PARTS[value.layout]]
    return [(path, value)]


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


def _describe_input(value: ir.Value) -> str:
    torch_dtype = dtypes.to_torch(value.dtype) if value.dtype is not None else None
    dtype = str(torch_dtype).removeprefix("torch.") if torch_dtype is not None else "?"
    shape = "[" + ", ".join(str(d) for d in value.shape) + "]" if value.shape is not None else "?"
    return f"{value.name}: {dtype} tensor of shape {shape}"
