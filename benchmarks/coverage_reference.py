"""The reference engine of ``fx2onnx coverage --baseline``: ``torch.onnx.export(dynamo=True)`` on the same samples.

A benchmark, not part of the package (the package never calls ``torch.onnx.export``): the coverage
workers load this file when a case's engine is ``reference``. Each sample is exported with the
exporter's defaults, checked with ``onnx.checker`` (full check, as fx2onnx's own exports are), run in
ONNX Runtime with the same session options and compared with eager exactly as fx2onnx's results are.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any

import onnx
import torch

from fx2onnx.coverage import check
from fx2onnx.coverage.samples import PreparedSample


def check_sample(sample: PreparedSample, phase: check.Phase) -> check.SampleOutcome:
    _cache_torchlib_registry()
    phase("export")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.onnx.export(sample.module, sample.fresh_inputs(), dynamo=True, verbose=False)
        proto = exported.model_proto
    except Exception as error:
        return check.failure(sample, check.EXPORT_ERROR, error)
    phase("check")
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as error:
        return check.failure(sample, check.INVALID_MODEL, error)
    phase("session")
    try:
        session = check.session(proto.SerializeToString())
    except Exception as error:
        return check.session_failure(sample, error)
    phase("run")
    try:
        actual = check.run(session, sample.fresh_inputs())
    except Exception as error:
        return check.failure(sample, check.RUN_ERROR, error)
    return check.compare_outputs(sample, actual)


@functools.cache
def _cache_torchlib_registry() -> None:
    """Build torch.onnx's operator registry once per worker instead of once per export (3 s each).

    The registry is rebuilt identically on every call and is not changed by an export without a
    custom translation table, so reusing it changes no result, only the sweep's duration.
    """
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        return
    original = _registration.ONNXRegistry.from_torchlib.__func__  # type: ignore[attr-defined]
    built: dict[Any, Any] = {}

    def from_torchlib(cls: type, opset_version: Any = None) -> Any:
        key = (cls, opset_version)
        if key not in built:
            built[key] = original(cls) if opset_version is None else original(cls, opset_version)
        return built[key]

    _registration.ONNXRegistry.from_torchlib = classmethod(from_torchlib)
