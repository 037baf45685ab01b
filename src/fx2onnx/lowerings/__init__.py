"""fx2onnx's own lowerings, for operators torchlib lacks or lowers wrongly.

Each module registers its rules where they are defined, with :func:`~fx2onnx.lowerings.rules.lowering`;
importing this package imports them all.
"""

from __future__ import annotations

from fx2onnx.lowerings import (
    accuracy,
    attention,
    core,
    dtype_fixes,
    float64,
    float64_math,
    indexing,
    integer_ops,
    integer_pooling,
    linalg,
    moe,
    nn,
    quantized,
    reduced_precision,
    special,
    spectral,
    symbolic,
)
from fx2onnx.lowerings.rules import DOMAIN, Rule, lowering, registered_rules

FAMILIES = (
    accuracy,
    attention,
    core,
    dtype_fixes,
    float64,
    float64_math,
    indexing,
    integer_ops,
    integer_pooling,
    linalg,
    moe,
    nn,
    quantized,
    reduced_precision,
    special,
    spectral,
    symbolic,
)

__all__ = ["DOMAIN", "FAMILIES", "Rule", "lowering", "registered_rules"]
