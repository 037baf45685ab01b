"""torch.nn.functional ops (pooling, upsampling, norms, losses, convolutions) where torchlib is missing or differs from eager.

Each lowering here was found by the coverage sweep (``fx2onnx coverage``, docs/support-matrix.md).
"""

from __future__ import annotations
