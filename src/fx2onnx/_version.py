"""fx2onnx's version (a leaf: the emitter and the report write it into models and reports)."""

__version__ = "0.1.0"
