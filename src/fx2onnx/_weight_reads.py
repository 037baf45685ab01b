"""Which weights the export read the values of: those ``ONNXProgram.apply_weights`` may not swap in place.

The export reads a weight's values where it folds it (a transposed Linear weight, batch norm's statistics folded
into a constant), where an optimization depends on them (an Add of zeros removed), or where it compares them
(duplicate initializers merged): the model then holds something computed from the weight, or a structure chosen
for its value, and swapping the initializer alone would leave the rest computing with the old weight, silently.
A weight whose values nothing read while the graph was built and optimized is an input in all but name: giving it
other values gives the model that the export makes of the module holding them.

Each emitted weight's initializer holds a :class:`WatchedWeight` while :func:`watch` is active; any read of its
values (``numpy``, ``tobytes``, the torch tensor itself) is recorded. :meth:`WeightReads.finish` names the weights
still held, unread, by the initializer of their name (the only copy emitted), and gives the initializers plain
``TorchTensor`` values again (the save streams those).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx_ir as ir
import torch
from onnx_ir.tensor_adapters import TorchTensor


@dataclasses.dataclass
class WeightReads:
    """The weights emitted during one export (several per name where a branch was emitted again) and those read."""

    created: dict[str, list[WatchedWeight]] = dataclasses.field(default_factory=dict)
    read: set[str] = dataclasses.field(default_factory=set)
    watching: bool = True

    def finish(self, model: ir.Model) -> frozenset[str]:
        """Stop watching; the names of the weights the model holds unread, each as the initializer of its name."""
        self.watching = False
        swappable = set()
        for graph in model.graphs():
            for name, value in graph.initializers.items():
                tensor = value.const_value
                if not isinstance(tensor, WatchedWeight):
                    continue
                if graph is model.graph and name not in self.read and self.created.get(name) == [tensor]:
                    swappable.add(name)
                value.const_value = TorchTensor(tensor.torch_tensor, name=tensor.name)
        return frozenset(swappable)


_CURRENT: contextvars.ContextVar[WeightReads | None] = contextvars.ContextVar("fx2onnx_weight_reads", default=None)


@contextlib.contextmanager
def watch() -> Iterator[WeightReads]:
    """Weights emitted inside are watched (:func:`weight_tensor`) until the caller's :meth:`WeightReads.finish`."""
    reads = WeightReads()
    token = _CURRENT.set(reads)
    try:
        yield reads
    finally:
        _CURRENT.reset(token)
        reads.watching = False


_UNWATCHED: contextvars.ContextVar[bool] = contextvars.ContextVar("fx2onnx_weight_reads_off", default=False)


@contextlib.contextmanager
def unwatched() -> Iterator[None]:
    """Reads inside are not recorded: for reads that put no value into the model (the emit's trace keys, which
    tell calls apart by their constants' bytes)."""
    token = _UNWATCHED.set(True)
    try:
        yield
    finally:
        _UNWATCHED.reset(token)


def weight_tensor(tensor: torch.Tensor, name: str) -> TorchTensor:
    """The initializer value of a captured weight: watched during an export that watches, plain otherwise."""
    reads = _CURRENT.get()
    if reads is None:
        return TorchTensor(tensor, name=name)
    return WatchedWeight(tensor, name, reads)


class WatchedWeight(TorchTensor):
    """A weight's ``TorchTensor`` that records in its export's :class:`WeightReads` every read of its values."""

    def __init__(self, tensor: torch.Tensor, name: str, reads: WeightReads) -> None:
        self._reads = reads
        self.torch_tensor = tensor  # the tensor, for finish(), without counting as a read
        super().__init__(tensor, name=name)
        reads.created.setdefault(name, []).append(self)

    def _mark(self) -> None:
        if self._reads.watching and not _UNWATCHED.get():
            self._reads.read.add(self.name or "")

    @property
    def raw(self) -> Any:
        self._mark()
        return super().raw

    def numpy(self) -> np.ndarray:
        self._mark()
        return super().numpy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        self._mark()
        return super().__array__(dtype, copy)

    def __dlpack__(self, *, stream: Any = None) -> Any:
        self._mark()
        return super().__dlpack__(stream=stream)

    def tobytes(self) -> bytes:
        self._mark()
        return super().tobytes()

    def tofile(self, file: Any) -> None:
        self._mark()
        return super().tofile(file)
