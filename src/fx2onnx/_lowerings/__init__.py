"""fx2onnx's own lowerings, for operators torchlib lacks or lowers wrongly, one module per op family.

Each module registers its rules where they are defined, with :func:`~fx2onnx._lowerings.rules.lowering`, an op's
generic rule beside its dtype variants; shared builders are in :mod:`~fx2onnx._lowerings.builders`, pure math
kernels in :mod:`~fx2onnx._lowerings.kernels`. Importing this package imports them all.
"""

from __future__ import annotations

from fx2onnx._lowerings import (
    attention,
    complex,
    convolution,
    creation,
    detection,
    elementwise,
    indexing,
    linalg,
    linalg_eigen,
    losses,
    matrix_products,
    moe,
    normalization,
    pooling,
    quantized,
    reductions,
    resize,
    special,
    spectral,
    symbolic,
)
from fx2onnx._lowerings.rules import DOMAIN, Rule, lowering, registered_aliases, registered_rules

FAMILIES = (
    attention,
    complex,
    convolution,
    creation,
    detection,
    elementwise,
    indexing,
    linalg,
    linalg_eigen,
    losses,
    matrix_products,
    moe,
    normalization,
    pooling,
    quantized,
    reductions,
    resize,
    special,
    spectral,
    symbolic,
)

__all__ = ["DOMAIN", "FAMILIES", "Rule", "lowering", "registered_aliases", "registered_rules"]
