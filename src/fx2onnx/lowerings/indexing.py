"""Scatter, gather, put/take, *_scatter and shape ops where torchlib has no implementation or a wrong one.

Each lowering here was found by the coverage sweep (``fx2onnx coverage``, docs/support-matrix.md).
"""

from __future__ import annotations
