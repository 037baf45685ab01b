"""Finalize: the emitted model made ready to save, as a sequence of ``onnx_ir`` passes.

Inline the script functions, run onnxscript's optimizer (:mod:`~fx2onnx._finalize.optimizer`), convert to the
requested opset (onnxscript's version converter upward; below 18, :mod:`~fx2onnx._finalize.opset_down`) with, at
opset >= 23, the fusions into ``RMSNormalization`` and ``RotaryEmbedding`` (:mod:`~fx2onnx._finalize.fusions`),
drop what is unused, and stamp the opset and IR version.
Also here: the opsets an export may target, and the ONNX checker run on the final (legalized) model.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from fx2onnx import _dtypes as dtypes
from fx2onnx._finalize import graph_walks, opset_down
from fx2onnx._records import BASE_OPSET, FX_NODE, STACK_TRACE, TARGET
from fx2onnx.errors import ExportError, InvalidModelError, source_line


def finalize(model: ir.Model, opset_version: int, *, optimize: bool) -> None:
    """Inline script functions, optimize, convert the opset, drop what is unused."""
    try:
        finalize_passes(opset_version, optimize=optimize)(model)
    except ir.passes.PassError as error:
        if isinstance(error.__cause__, ExportError):  # a node the target opset cannot express: the user's error
            raise error.__cause__ from None
        raise


def finalize_passes(opset_version: int, *, optimize: bool) -> ir.passes.Sequential:
    """The passes of :func:`finalize`, in order.

    Passes that would find nothing to do are left out (graph_walks.UnlessNothingToDo): the inliner without a function,
    the final removal of unused nodes after the optimizer when no version conversion follows it (the optimizer's
    rewrite removes them last, and what runs after it, the lifting of Constants, deduplication, CSE, output and name
    fixes, leaves none unused).
    """
    steps: list[ir.passes.PassBase] = [graph_walks.inline_functions(), graph_walks.remove_unused_functions()]
    steps.append(Float8CastsPass())
    if optimize:
        steps.append(OptimizePass())
    converted = opset_version != BASE_OPSET
    if opset_version < BASE_OPSET:
        steps.append(opset_down.DownConvertPass(opset_version))
    elif converted:
        if optimize and opset_version >= FUSION_OPSET:
            steps.append(FuseOperatorsPass())
        steps.append(ConvertVersionPass(opset_version))
    if converted or not optimize:
        steps.append(common_passes.RemoveUnusedNodesPass())
    steps += [graph_walks.remove_unused_opsets(), StampOpsetPass(opset_version)]
    return ir.passes.Sequential(*steps)


class Float8CastsPass(ir.passes.InPlacePass):
    """Casts to float8 as torch casts (no saturation but for float8_e4m3fn)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        _float8_casts_do_not_saturate(model)
        return ir.passes.PassResult(model, modified=True)


class OptimizePass(ir.passes.InPlacePass):
    """onnxscript's optimize_ir, without its quadratic rule where it cannot match (finalize/optimizer.py)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        from fx2onnx._finalize import optimizer  # onnxscript's rewriter is slow to import: only when optimizing

        optimizer.optimize(model)
        return ir.passes.PassResult(model, modified=True)


class FuseOperatorsPass(ir.passes.InPlacePass):
    """At opset 23: RMSNormalization (and GQA) by onnxscript's rules, RotaryEmbedding by fx2onnx's
    (_finalize/fusions.py). Converts the model to opset 23 first, where they apply."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        import onnxscript.version_converter

        from fx2onnx._finalize import fusions

        onnxscript.version_converter.convert_version(model, FUSION_OPSET)
        fusions.fuse_with_onnxscript(model)
        fusions.fuse_rotary_embeddings(model)
        return ir.passes.PassResult(model, modified=True)


class ConvertVersionPass(ir.passes.InPlacePass):
    """onnxscript's version converter, to `opset`; the Constants its adapters add are then typed."""

    def __init__(self, opset: int) -> None:
        super().__init__()
        self.opset = opset

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        import onnxscript.version_converter

        onnxscript.version_converter.convert_version(model, self.opset)
        _type_new_constants(model)
        return ir.passes.PassResult(model, modified=True)


class StampOpsetPass(ir.passes.InPlacePass):
    """The default domain's opset and the lowest IR version that holds it."""

    def __init__(self, opset: int) -> None:
        super().__init__()
        self.opset = opset

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        version = ir_version(self.opset)
        modified = model.graph.opset_imports.get("") != self.opset or model.ir_version != version
        model.graph.opset_imports[""] = self.opset
        model.ir_version = version
        return ir.passes.PassResult(model, modified=modified)


FUSION_OPSET = 23


def _type_new_constants(model: ir.Model) -> None:
    """Type the Constants the version converter's adapters add untyped (DFT-17 -> 20 adds its axis as one)."""
    for node in graph_walks.all_nodes(model.graph):
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or node.outputs[0].type is not None:
            continue
        value = node.attributes.get("value")
        if value is not None and value.type == ir.AttributeType.TENSOR:
            tensor = value.as_tensor()
            node.outputs[0].dtype, node.outputs[0].shape = tensor.dtype, ir.Shape(tensor.shape)
        elif "value_int" in node.attributes:
            node.outputs[0].dtype, node.outputs[0].shape = ir.DataType.INT64, ir.Shape([])
        elif "value_ints" in node.attributes:
            count = len(node.attributes["value_ints"].as_ints())
            node.outputs[0].dtype, node.outputs[0].shape = ir.DataType.INT64, ir.Shape([count])


def every_value_typed(model: ir.Model) -> bool:
    """Whether emission and the passes left a dtype and a shape on every value (then ONNX inference adds nothing)."""
    for node in graph_walks.all_nodes(model.graph):
        for value in node.outputs:
            if value.type is None or value.shape is None:
                return False
    return all(value.type is not None and value.shape is not None for value in model.graph.inputs)


def check_model(model: ir.Model) -> None:
    """``onnx.checker.check_model(full_check=True)``; on failure, name the offending node."""
    try:
        with _without_node_metadata(model):
            common_passes.CheckerPass(full_check=True)(model)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        message = str(error)
        culprit = next((n for n in model.graph if n.name and n.name in message), None)
        where = context = ""
        details: dict[str, Any] = {}
        if culprit is not None:
            fx_node = culprit.metadata_props.get(FX_NODE, "?")
            target = culprit.metadata_props.get(TARGET)
            trace = culprit.metadata_props.get(STACK_TRACE)
            inputs = ", ".join(
                f"{v.name}: {v.dtype.name if v.dtype else '?'} {v.shape}" for v in culprit.inputs if v is not None
            )
            where = f" at ONNX node {culprit.name} ({culprit.op_type}) from FX node `{fx_node}` ({target})"
            context = (f"\n  from: {source_line(trace)}" if trace else "") + f"\n  inputs: {inputs or '(none)'}"
            details = {"node": fx_node, "target": target, "stack_trace": trace}
        raise InvalidModelError(
            f"the exported model fails the ONNX checker{where}: {message.strip()}{context}\n"
            "  remedy: the implementation chosen for this node emits an invalid ONNX node; register a correct one "
            "with fx2onnx.register or "
            "custom_translation_table (see the report's dispatch table for which one was chosen).",
            **details,
        ) from error


@contextlib.contextmanager
def _without_node_metadata(model: ir.Model) -> Iterator[None]:
    """The nodes' metadata (fx2onnx's FX node, target and stack trace of each node: nine tenths of a T5's graph
    proto) left out while the model is serialized for the checker, which reads none of it (only the model's own
    metadata_props), and put back as it was."""
    saved = []
    for node in graph_walks.all_nodes(model.graph):
        metadata = node.metadata_props
        if metadata:
            saved.append((metadata, dict(metadata)))
            metadata.clear()
    try:
        yield
    finally:
        for metadata, entries in saved:
            metadata.update(entries)


def ir_version(opset: int) -> int:
    return onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", opset)], ignore_unknown=True)


@functools.cache
def max_opset() -> int:
    """The newest opset that onnx, onnxscript's version converter and ONNX Runtime all accept."""
    import onnxruntime
    import onnxscript.version_converter

    for opset in range(onnx.defs.onnx_opset_version(), BASE_OPSET, -1):
        graph = onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["x"], ["y"])],
            "probe",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        )
        probe = onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid("", BASE_OPSET)], ir_version=ir_version(opset)
        )
        try:
            converted = ir.from_proto(probe)
            onnxscript.version_converter.convert_version(converted, opset)
            converted.ir_version = ir_version(opset)
            onnxruntime.InferenceSession(ir.to_proto(converted).SerializeToString(), providers=["CPUExecutionProvider"])
            return opset
        except Exception:  # a refusal by any of them means this opset is too new
            continue
    return BASE_OPSET


def check_opset(opset_version: int) -> None:
    if not isinstance(opset_version, int) or not opset_down.LOWEST_OPSET <= opset_version <= max_opset():
        raise ExportError(
            f"opset_version={opset_version!r} is not supported: choose from {opset_down.LOWEST_OPSET} to "
            f"{max_opset()} (the newest opset both onnx {onnx.__version__} and the installed onnxruntime accept; "
            f"below {BASE_OPSET}, fx2onnx adapts its opset-{BASE_OPSET} model op by op)"
        )


_FLOAT8_TYPES = frozenset(dtypes.to_onnx(dtype) for dtype in dtypes.FLOAT8)


def _float8_casts_do_not_saturate(model: ir.Model) -> None:
    """Casts to float8 as torch casts: out of range gives NaN (inf for e5m2), where ONNX's default clamps to the
    largest value; torch clamps only float8_e4m3fn (1e9 -> 448), which keeps ONNX's default."""
    for node in graph_walks.all_nodes(model.graph):
        if node.op_type not in ("Cast", "CastLike") or node.domain not in ("", "ai.onnx"):
            continue
        dtype = node.outputs[0].dtype
        if dtype in _FLOAT8_TYPES and dtype != ir.DataType.FLOAT8E4M3FN and "saturate" not in node.attributes:
            node.attributes["saturate"] = ir.AttrInt64("saturate", 0)
