"""Turn an OpInfo sample into something an exporter takes: a small nn.Module and its tensor inputs."""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from fx2onnx.coverage.cases import Case, op_database


class SampleModule(torch.nn.Module):
    """Calls the op on a sample; the sample's tensors are the inputs, everything else is a constant."""

    def __init__(self, op: Callable[..., Any], structure: pytree.TreeSpec, constants: list[Any]) -> None:
        super().__init__()
        self.op = op
        self.structure = structure
        self.constants = constants  # one entry per leaf: _TENSOR where a forward input goes

    def forward(self, *tensors: torch.Tensor) -> Any:
        feed = iter(tensors)
        leaves = [next(feed) if c is _TENSOR else c for c in self.constants]
        sample_input, args, kwargs = pytree.tree_unflatten(leaves, self.structure)
        return self.op(sample_input, *args, **kwargs)


_TENSOR = object()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclasses.dataclass
class PreparedSample:
    """A runnable sample: the module, its inputs, and eager's flat outputs."""

    index: int
    module: SampleModule
    inputs: tuple[torch.Tensor, ...]
    expected: list[torch.Tensor]
    op: str = ""  # the OpInfo id

    def fresh_inputs(self) -> tuple[torch.Tensor, ...]:
        """Copies, so that an op that writes to its input cannot change the next run."""
        return tuple(t.clone() for t in self.inputs)

    def call_arguments(self) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """The sample as OpInfo gave it: (input, args, kwargs)."""
        feed = iter(self.inputs)
        leaves = [next(feed) if c is _TENSOR else c for c in self.module.constants]
        return pytree.tree_unflatten(leaves, self.module.structure)


@dataclasses.dataclass
class SkippedSample:
    """A sample left out of the comparison, and why (eager fails, random output, no tensor output)."""

    index: int
    reason: str


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def prepared_samples(case: Case) -> Iterator[PreparedSample | SkippedSample]:
    """The case's samples in OpInfo order, each prepared or skipped with its reason."""
    info = op_database()[case.op]
    seed_everything(case.seed)
    for index, sample in enumerate(info.sample_inputs("cpu", case.torch_dtype, requires_grad=False)):
        prepared = prepare(info.op, sample, index)
        if isinstance(prepared, PreparedSample):
            prepared.op = case.op
        yield prepared


def prepare(op: Callable[..., Any], sample: Any, index: int) -> PreparedSample | SkippedSample:
    leaves, structure = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    tensors = tuple(leaf.detach() for leaf in leaves if isinstance(leaf, torch.Tensor))
    constants = [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    module = SampleModule(op, structure, constants).eval()
    try:
        with torch.no_grad():
            with _RandomOpRecorder() as random_ops:
                first = module(*(t.clone() for t in tensors))
            second = module(*(t.clone() for t in tensors))
    except Exception as error:
        return SkippedSample(index, f"eager fails: {type(error).__name__}: {first_line(str(error))}")
    if random_ops.called:
        # OpInfo seeds such samples (two eager runs agree), but no exporter can draw torch's random numbers.
        return SkippedSample(index, f"nondeterministic: calls {', '.join(sorted(random_ops.called))}")
    first_flat, second_flat = _flat_outputs(first), _flat_outputs(second)
    if first_flat is None:
        return SkippedSample(index, f"output is not a tensor (or tuple of tensors): {type(first).__name__}")
    if not first_flat:
        return SkippedSample(index, "no tensor output")
    if any(t.is_sparse or t.layout != torch.strided for t in first_flat):
        return SkippedSample(index, "sparse output")
    if not all(_identical(a, b) for a, b in zip(first_flat, second_flat)):
        return SkippedSample(index, "nondeterministic: two eager runs differ")
    return PreparedSample(index, module, tensors, [t.detach().clone() for t in first_flat])


class _RandomOpRecorder(TorchDispatchMode):
    """Records the random ATen ops (tagged nondeterministic_seeded: dropout, bernoulli, normal...) eager calls."""

    def __init__(self) -> None:
        super().__init__()
        self.called: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            self.called.add(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def _flat_outputs(output: Any) -> list[torch.Tensor] | None:
    leaves = pytree.tree_leaves(output)
    if any(not isinstance(leaf, torch.Tensor) and leaf is not None for leaf in leaves):
        return None
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))) and bool(
            torch.equal(torch.isnan(a), torch.isnan(b))
        )
    return bool(torch.equal(a, b))


def first_line(text: str, limit: int = 400) -> str:
    """The first non-empty line of an error message, shortened (terminal colour codes removed).

    A first line that ends in a colon introduces a list; its first item comes along.
    """
    lines = [line.strip() for line in _ANSI.sub("", text).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[0]
    if line.endswith(":") and len(lines) > 1:
        line = f"{line} {lines[1]}"
    return line if len(line) <= limit else line[: limit - 3] + "..."
