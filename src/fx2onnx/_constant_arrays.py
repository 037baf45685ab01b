"""The one reader of a graph value's constant array, shared by emit, finalize and legalize.

Emit decides from it that an integer divisor needs no zero guard (a constant's zeros are made ones by legalize's
``fusion_guards``, which reads the same array), and finalize's fusions prove equalities from it: they must agree
on what a constant is. A constant is a value the graph fixes: an initializer that is not also a graph input (a
graph input's initializer is only a default the caller may replace) or the output of a ``Constant`` node. A
constant whose bytes cannot be read (a weight on the ``meta`` device or a fake tensor, captured for
``export(weights=...)``; external data that is not there) is no proof of anything and counts as none. A weight
bound to a checkpoint is read from it on demand (its values are the checkpoint's): only its reading can turn an
unknown into a known array between emit and legalize, never the reverse, so a guard emit added is never
missing a rewrite legalize expects.

It also holds the one decoder of a ``Constant`` node's attribute into its tensor (emit's folding and type
inference, finalize's lifting of constants to initializers).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx_ir as ir


def constant_array(value: ir.Value | None) -> np.ndarray | None:
    """The values of `value` if the graph fixes them and they can be read, else None."""
    if value is None or value.is_graph_input():
        return None
    try:
        tensor = ir.convenience.get_const_tensor(value)
        return None if tensor is None else np.asarray(tensor.numpy())
    except Exception:  # a meta or fake weight (no bytes), unreadable external data, a malformed Constant
        return None


# A Constant's number and list attributes, the dtype ONNX gives each and the attribute type it must have.
_NUMBER_ATTRIBUTES = {
    "value_int": (ir.DataType.INT64, ir.AttributeType.INT),
    "value_ints": (ir.DataType.INT64, ir.AttributeType.INTS),
    "value_float": (ir.DataType.FLOAT, ir.AttributeType.FLOAT),
    "value_floats": (ir.DataType.FLOAT, ir.AttributeType.FLOATS),
}


def number_attribute_tensor(attribute: ir.Attr) -> ir.Tensor | None:
    """A Constant's ``value_int(s)``/``value_float(s)`` attribute as the int64/float32 tensor ONNX defines (a
    scalar, or 1-D for a list); None for another attribute, a reference or a mistyped one."""
    expected = _NUMBER_ATTRIBUTES.get(attribute.name)
    if expected is None or attribute.is_ref() or attribute.type != expected[1]:
        return None
    dtype = expected[0]
    return ir.Tensor(np.array(attribute.value, dtype=dtype.numpy()), dtype=dtype)


def constant_attribute_tensor(attributes: Iterable[ir.Attr]) -> ir.TensorProtocol | None:
    """The tensor a ``Constant`` node's attributes hold (None for a sparse, string or reference one)."""
    for attribute in attributes:
        if attribute.name == "value" and not attribute.is_ref() and attribute.type == ir.AttributeType.TENSOR:
            return attribute.value  # a TENSOR attribute's value is a tensor (as_tensor's check of it costs ~90 us)
        tensor = number_attribute_tensor(attribute)
        if tensor is not None:
            return tensor
    return None
