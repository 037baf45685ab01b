"""``python -m fx2onnx.legalize [--check]``: regenerate the ONNX Runtime CPU legal-types table."""

from __future__ import annotations

import sys

from fx2onnx.legalize.cli import main

sys.exit(main())
