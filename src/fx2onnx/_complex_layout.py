"""How complex tensors travel through an exported graph: as real tensors with a trailing dim of 2.

ONNX Runtime's CPU provider has almost no complex kernels (no Cast, Slice, Add... on complex64), so
inside the graph a complex64 (complex128) tensor of shape ``S`` is a float32 (float64) tensor of
shape ``S + [2]`` holding (real, imag) in its last dim: ``torch.view_as_real``'s layout. This is
torchlib's convention too: its ``complex=True`` implementations (``aten::mul``, ``aten::_fft_c2c``,
``aten::abs``...) take and return this layout, and its real-input ops that make complex values
(``aten::complex``, ``aten::polar``, ``aten::_fft_r2c``, a cast to complex) return it.

At the graph's boundary a complex input or output is such a real tensor too; the model's metadata
(``pkg.fx2onnx.complex_inputs`` / ``pkg.fx2onnx.complex_outputs``: JSON lists of positions) says
which, and :class:`fx2onnx.ONNXProgram` converts on the way in (``view_as_real``) and out
(``view_as_complex``), so callers see eager's complex dtypes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import onnx_ir as ir
import torch

from fx2onnx import _dtypes as dtypes

COMPLEX_INPUTS = "pkg.fx2onnx.complex_inputs"
COMPLEX_OUTPUTS = "pkg.fx2onnx.complex_outputs"
# Not about complex values, but recorded the same way: positions among the model's flat outputs of its Nones.
NONE_OUTPUTS = "pkg.fx2onnx.none_outputs"

_REAL_COMPONENT = {ir.DataType.COMPLEX64: ir.DataType.FLOAT, ir.DataType.COMPLEX128: ir.DataType.DOUBLE}


def real_component(dtype: ir.DataType) -> ir.DataType:
    """The dtype a value of `dtype` has in the graph: its component type when complex, else itself."""
    return _REAL_COMPONENT.get(dtype, dtype)


def graph_dtype(dtype: torch.dtype) -> ir.DataType:
    """The ONNX dtype of a torch tensor of `dtype` inside the graph (complex64 -> float32...)."""
    return real_component(dtypes.to_onnx(dtype))


def as_real(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor in the graph's layout: complex -> (..., 2) real; others unchanged."""
    return torch.view_as_real(tensor.resolve_conj()) if tensor.is_complex() else tensor


def from_complex_cast(value: ir.Value) -> ir.Value | None:
    """The layout for an implementation's ``Cast(real, to=complex)``, which ONNX Runtime cannot run; None otherwise.

    Call under the recorder. The Cast left without users is removed when the graph is finalized.
    """
    from onnxscript import opset18 as op

    producer = value.producer()
    if producer is None or producer.op_type != "Cast" or producer.domain not in ("", "ai.onnx"):
        return None
    target = producer.attributes.get("to")
    source = producer.inputs[0]
    if target is None or ir.DataType(target.as_int()) not in _REAL_COMPONENT:
        return None
    if source is None or source.dtype is None or dtypes.is_complex(source.dtype):
        return None
    component = _REAL_COMPONENT[ir.DataType(target.as_int())]
    real = op.Unsqueeze(op.Cast(source, to=component), op.Constant(value_ints=[-1]))
    imag = op.Expand(op.Constant(value=ir.tensor(0, dtype=component)), op.Shape(real))
    return op.Concat(real, imag, axis=-1)


def record(
    model: ir.Model, complex_inputs: Sequence[int], complex_outputs: Sequence[int], none_outputs: Sequence[int] = ()
) -> None:
    """Note in the model which graph inputs and outputs hold complex values in the real layout, and where among the
    model's flat outputs a None was (it has no graph output)."""
    if complex_inputs:
        model.metadata_props[COMPLEX_INPUTS] = json.dumps(list(complex_inputs))
    if complex_outputs:
        model.metadata_props[COMPLEX_OUTPUTS] = json.dumps(list(complex_outputs))
    if none_outputs:
        model.metadata_props[NONE_OUTPUTS] = json.dumps(list(none_outputs))


def positions(model: ir.Model, key: str) -> set[int]:
    text = model.metadata_props.get(key)
    return set(json.loads(text)) if text else set()


def restore_outputs(model: ir.Model, outputs: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """ONNX Runtime's (..., 2) outputs back to the complex tensors eager returns, and its Nones back in place."""
    wanted = positions(model, COMPLEX_OUTPUTS)
    restored: list[torch.Tensor | None] = [_as_complex(t) if i in wanted else t for i, t in enumerate(outputs)]
    for index in sorted(positions(model, NONE_OUTPUTS)):  # the Nones the model returns, where it returns them
        restored.insert(index, None)
    return restored


def _as_complex(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.numel() == 0:  # ONNX Runtime's empty outputs can carry strides view_as_complex refuses
        dtype = torch.complex128 if tensor.dtype == torch.float64 else torch.complex64
        return torch.empty(tensor.shape[:-1], dtype=dtype)
    return torch.view_as_complex(tensor.contiguous())


__all__ = ["COMPLEX_INPUTS", "COMPLEX_OUTPUTS", "NONE_OUTPUTS", "as_real", "graph_dtype", "real_component", "record"]
