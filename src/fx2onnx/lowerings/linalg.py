"""Linear algebra on small static shapes (solve, inv, cholesky, lu, det) unrolled into ONNX ops, and data-dependent ops.

Each lowering here was found by the coverage sweep (``fx2onnx coverage``, docs/support-matrix.md).
"""

from __future__ import annotations
