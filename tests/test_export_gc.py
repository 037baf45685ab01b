"""The garbage collector while an export runs: the objects older than the export frozen, full collections held until
the export ends, and the collector as it was afterwards."""

from __future__ import annotations

import gc
from typing import Any

import torch

import fx2onnx


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x)) * 2


def test_no_full_collection_runs_during_an_export() -> None:
    full_collections: list[dict[str, Any]] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            full_collections.append(info)

    fx2onnx.export(MLP().eval(), (torch.randn(3, 8),))  # the modules an export imports, imported
    thresholds = gc.get_threshold()
    # A full collection while everything is frozen leaves the collector counting almost no long-lived objects, so
    # that the export's own survivors pass its rule of one full collection per 25% growth (as in a process whose
    # first export builds the registry and imports modules); and a full collection is due every other younger one.
    gc.freeze()
    gc.collect()
    gc.unfreeze()
    gc.set_threshold(100, 1, 1)
    gc.callbacks.append(record)
    try:
        program = fx2onnx.export(MLP().eval(), (torch.randn(3, 8),))
        assert gc.get_threshold() == (100, 1, 1)
    finally:
        gc.callbacks.remove(record)
        gc.set_threshold(*thresholds)
    assert full_collections == []
    assert gc.get_freeze_count() == 0
    results = program.verify(torch.randn(3, 8))
    assert results and all(result.passed for result in results), [str(result) for result in results]
