"""Down-conversion: a model emitted at opset 18 (the lowest torchlib implements) rewritten for an older opset.

Users pass ``opset_version=17`` (or 11 to 16) where their deployment runtime needs it. onnx's C++ version converter
has no down adapter for Split-18, Pow-15 or LayerNormalization-17, and onnxscript's converts upward only, so each
op fx2onnx emits is adapted here, node by node, in every graph and subgraph:

- an op whose newer version only took more types is kept: legalize, which runs next at the target opset, casts
  what the target has no kernel for, and the ONNX checker then holds the types to the target's schemas;
- an op whose newer version moved an input to an attribute (Reduce*'s axes; below 13 Squeeze's, Unsqueeze's and
  ReduceSum's axes, Split's sizes, which go back to attributes where they are constants), split its sizes
  differently (Split's ``num_outputs``) or added an attribute at a value the old op means anyway is rewritten to the
  old form; Scatter* with a reduction (add and mul at 16, max and min at 18) becomes a Loop of plain scatters;
- an op new since the target (LayerNormalization, CastLike, Trilu, HardSwish, Mish, Bitwise* of integers,
  DFT as a matrix product, window functions as constants, 4-D GridSample as gathers, Col2Im as padded sums; below
  12 GreaterOrEqual, LessOrEqual, Celu, Einsum as a broadcast product and sum; Max, Min, Clip of integers, which
  no older float holds exactly) or whose older version means something else (Softmax-11 flattens to 2-D: an inner
  axis is swapped with the last around it) is spelt out in older ops, computing what eager computes at the
  extremes too (NaN and infinite inputs, coordinates off the image);
- anything else is refused with the op, the opset it needs and the user's source line: never a node that means
  something else at the older version.
"""

from __future__ import annotations

import onnx.defs
import onnx_ir as ir

from fx2onnx._finalize.opset_down import old_forms, sampling, scatter, spectral, spelt_out
from fx2onnx._finalize.opset_down.rewriting import Adapter, OpsetRefused, since
from fx2onnx._records import BASE_OPSET, FX_NODE, STACK_TRACE, TARGET
from fx2onnx.errors import ExportError, source_line

LOWEST_OPSET = 11
"""The oldest opset an export may target: 11 gave Pad, Clip, Resize, Slice and TopK the inputs torchlib gives them
(and negative axes); below it most nodes would need rewriting."""


class DownConvertPass(ir.passes.InPlacePass):
    """Every default-domain node made valid at `opset` (< 18), or an ExportError naming the first that cannot be."""

    def __init__(self, opset: int) -> None:
        super().__init__()
        self.opset = opset

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        graphs: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
        for graph in graphs:
            seen: set[ir.Node] = set()
            while True:  # again over the nodes adapters added, in opset 13's forms (Unsqueeze's axes as an input)
                nodes = [node for node in ir.traversal.RecursiveGraphIterator(graph) if node not in seen]
                if not nodes:
                    break
                seen.update(nodes)
                for node in nodes:
                    if node.domain not in ("", "ai.onnx") or since(node.op_type, BASE_OPSET) <= self.opset:
                        continue
                    try:
                        modified |= _convert(node, self.opset)
                    except OpsetRefused as refusal:
                        raise _refusal_error(node, self.opset, str(refusal)) from None
        return ir.passes.PassResult(model, modified)


def _convert(node: ir.Node, opset: int) -> bool:
    adapter = _ADAPTERS.get(node.op_type)
    if adapter is not None:
        adapter(node, opset)
        return True
    old_version = since(node.op_type, opset)
    if old_version == 0:
        raise OpsetRefused(f"{node.op_type} does not exist before opset {_first_version(node.op_type)}")
    old = onnx.defs.get_schema(node.op_type, opset, "")
    new_attributes = sorted(set(node.attributes) - set(old.attributes))
    if new_attributes:
        raise OpsetRefused(f"{node.op_type}-{old_version} has no attribute {', '.join(new_attributes)}")
    variadic = bool(old.inputs) and old.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    if len(node.inputs) > len(old.inputs) and not variadic:
        count = len(node.inputs)
        raise OpsetRefused(f"{node.op_type}-{old_version} takes {len(old.inputs)} inputs, the node has {count}")
    return False  # the same op with fewer types: legalize and the checker hold the types to the target


def _first_version(op_type: str) -> int:
    versions = onnx.defs.get_all_schemas_with_history()
    return min(schema.since_version for schema in versions if schema.name == op_type and schema.domain == "")


def _refusal_error(node: ir.Node, opset: int, reason: str) -> ExportError:
    trace = node.metadata_props.get(STACK_TRACE)
    fx_node = node.metadata_props.get(FX_NODE)
    origin = f" from FX node `{fx_node}` ({node.metadata_props.get(TARGET, '?')})" if fx_node else ""
    where = f"\n  from: {source_line(trace)}" if trace else ""
    return ExportError(
        f"opset_version={opset}: ONNX node {node.name or node.op_type} ({node.op_type}){origin} cannot be written "
        f"at opset {opset}: {reason}{where}\n"
        f"  remedy: pass opset_version={max(BASE_OPSET, since(node.op_type, BASE_OPSET))} or newer (fx2onnx emits "
        f"opset {BASE_OPSET} and adapts older opsets op by op), or register an implementation of the op with "
        "fx2onnx.register that avoids it."
    )


_ADAPTERS: dict[str, Adapter] = {
    **dict.fromkeys(old_forms.REDUCTIONS, old_forms.reduce_axes_as_attribute),
    "ReduceSum": old_forms.reduce_sum_11,
    **dict.fromkeys(("Squeeze", "Unsqueeze"), old_forms.axes_as_attribute),
    "Split": old_forms.split_11,
    "Pad": old_forms.pad_without_axes,
    "Resize": old_forms.resize_11,
    "Constant": old_forms.constant_11,
    **dict.fromkeys(("ArgMax", "ArgMin"), old_forms.defaults_dropped({"select_last_index": 0}, new_in=12)),
    "GatherND": old_forms.defaults_dropped({"batch_dims": 0}, new_in=12),
    **dict.fromkeys(("Softmax", "LogSoftmax", "Hardmax"), spelt_out.softmax_along_last),
    **dict.fromkeys(("GreaterOrEqual", "LessOrEqual"), spelt_out.compare_or_equal),
    "Celu": spelt_out.celu_spelt_out,
    "Einsum": spelt_out.einsum_as_product,
    **dict.fromkeys(("HannWindow", "HammingWindow", "BlackmanWindow"), spectral.window_as_constant),
    **dict.fromkeys(("Max", "Min", "Clip"), spelt_out.integer_extremes_as_where),
    "ScatterElements": scatter.scatter_reduction,
    "ScatterND": scatter.scatter_reduction,
    "Shape": old_forms.shape_sliced,
    "CastLike": old_forms.cast_like_as_cast,
    "LayerNormalization": spelt_out.layer_norm_spelt_out,
    "Trilu": spelt_out.trilu_as_where,
    "HardSwish": spelt_out.hard_swish_spelt_out,
    "Mish": spelt_out.mish_spelt_out,
    "BitwiseNot": spelt_out.bitwise_not_as_sub,
    **dict.fromkeys(("BitwiseAnd", "BitwiseOr", "BitwiseXor"), spelt_out.bitwise_by_bits),
    "DFT": spectral.dft_as_matmul,
    "GridSample": sampling.grid_sample_spelt_out,
    "Col2Im": sampling.col2im_as_pads,
    "RoiAlign": old_forms.roi_align_mode,
    "Reshape": old_forms.reshape_13,
    "BatchNormalization": old_forms.batch_norm_inference,
    "LpPool": old_forms.lp_pool_13,
    **dict.fromkeys(("GRU", "LSTM", "RNN"), old_forms.defaults_dropped({"layout": 0}, new_in=14)),
}
