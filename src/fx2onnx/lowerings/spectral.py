"""FFT family (aten::_fft_r2c/_fft_c2c/_fft_c2r via ONNX DFT) and complex construction (complex, polar, view_as_complex).

Each lowering here was found by the coverage sweep (``fx2onnx coverage``, docs/support-matrix.md).
"""

from __future__ import annotations
