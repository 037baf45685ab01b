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
"""

from __future__ import annotations

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
