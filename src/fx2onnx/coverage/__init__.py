"""The coverage sweep: which (operator, dtype) pairs fx2onnx exports correctly, measured on PyTorch's OpInfo.

``fx2onnx coverage`` (:mod:`~fx2onnx.coverage.cli`) enumerates cases (:mod:`~fx2onnx.coverage.cases`), runs
each in a worker process (:mod:`~fx2onnx.coverage.pool`, :mod:`~fx2onnx.coverage.worker`): the samples are
wrapped in modules (:mod:`~fx2onnx.coverage.samples`), exported, run in ONNX Runtime and compared with eager
(:mod:`~fx2onnx.coverage.check`, :mod:`~fx2onnx.coverage.runner`); records go to a resumable JSONL file
(:mod:`~fx2onnx.coverage.sweep`), then to ``docs/support-matrix.*`` (:mod:`~fx2onnx.coverage.matrix`) and
to the per-overload dtype data the dispatcher's tests read (:mod:`~fx2onnx.coverage.discovery`).
"""
