"""Special functions (orthogonal polynomials, Bessel, gamma family, zeta, gcd/lcm, nextafter, frexp) as ONNX graphs.

Each lowering here was found by the coverage sweep (``fx2onnx coverage``, docs/support-matrix.md).
"""

from __future__ import annotations
