"""Static-shape fake kernels, during capture, for composite ops whose generic fake run is data-dependent.

torch.export records CompositeImplicitAutograd ops such as ``aten::combinations`` whole and computes their
outputs' metadata by running their composite implementation on fake tensors. For a few ops that
implementation reads tensor values (``masked_select``, ``.item()``, ``equal``) although the output's shape
does not depend on them, and capture fails (PendingUnbackedSymbolNotFound, DataDependentOutputException).
Within :func:`static_fake_kernels` these ops get a kernel that, on fake tensors, returns an empty tensor of
the output's true (static) shape, as export itself does for the composite ops it preserves; real tensors
still run torch's composite implementation. fx2onnx lowers each op whole (lowerings/linalg.py), so the
composite implementation never reaches the graph.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._C import DispatchKey
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import get_proxy_mode

_COMPOSITE = DispatchKey.CompositeImplicitAutograd


def _combinations(self: torch.Tensor, r: int = 2, with_replacement: bool = False) -> torch.Tensor:
    if r == 0:
        return self.new_empty((0,))
    count = self.shape[0]
    rows = math.comb(count + r - 1, r) if with_replacement else math.comb(count, r)
    return self.new_empty((rows, r))


def _narrow_tensor(self: torch.Tensor, dim: int, start: torch.Tensor, length: int) -> torch.Tensor:
    del start  # where the window starts does not change its shape
    return self.narrow(dim, 0, length)


def _cov(
    self: torch.Tensor,
    correction: int = 1,
    fweights: torch.Tensor | None = None,
    aweights: torch.Tensor | None = None,
) -> torch.Tensor:
    dtype = self.dtype if self.is_floating_point() or self.is_complex() else torch.get_default_dtype()
    if aweights is not None:
        dtype = torch.promote_types(dtype, aweights.dtype)
    variables = self.shape[0] if self.dim() == 2 else 1
    return self.new_empty((variables, variables) if variables != 1 else (), dtype=dtype)  # eager squeezes


def _one_hot(self: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    if num_classes < 0:  # the largest index plus one: a size known at run time only, as nonzero's count
        fake_mode = torch._guards.detect_fake_mode()
        num_classes = fake_mode.shape_env.create_unbacked_symint()
        torch._check(num_classes >= 1)
    return self.new_empty((*self.shape, num_classes), dtype=torch.int64)


def _ctc_loss(
    log_probs: torch.Tensor,
    targets: torch.Tensor,
    input_lengths: Any,
    target_lengths: Any,
    blank: int = 0,
    reduction: int = 1,
    zero_infinity: bool = False,
) -> torch.Tensor:
    # The composite calls aten::_ctc_loss, whose second output (alpha, for the backward pass) is sized by the
    # longest target: data-dependent; the loss itself is one value per sequence, or one value reduced.
    del targets, input_lengths, target_lengths, blank, zero_infinity
    batched = log_probs.dim() == 3
    return log_probs.new_empty((log_probs.shape[1],) if batched and reduction == 0 else ())


# Overload -> its output's metadata on fake tensors.
STATIC_FAKE_KERNELS: dict[torch._ops.OpOverload, Callable[..., torch.Tensor]] = {
    torch.ops.aten.combinations.default: _combinations,
    torch.ops.aten.narrow.Tensor: _narrow_tensor,
    torch.ops.aten.cov.default: _cov,
    torch.ops.aten.one_hot.default: _one_hot,
    torch.ops.aten.ctc_loss.IntList: _ctc_loss,
    torch.ops.aten.ctc_loss.Tensor: _ctc_loss,
}


def _on_fake_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(isinstance(leaf, FakeTensor) for leaf in pytree.tree_leaves((args, kwargs)))


def _kernel(overload: torch._ops.OpOverload, fake: Callable[..., torch.Tensor]) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        # Only an output's metadata is ever taken from the fake kernel: while a graph is being traced (a
        # decomposition of the op), torch's composite implementation runs, so the graph never holds an `empty`.
        if _on_fake_tensors(args, kwargs) and get_proxy_mode() is None:
            return fake(*args, **kwargs)
        return overload._op_dk(_COMPOSITE, *args, **kwargs)  # torch's own composite implementation

    return kernel


@contextlib.contextmanager
def static_fake_kernels() -> Iterator[None]:
    """Install the kernels for the duration of a capture; torch's are restored afterwards."""
    saved = {overload: overload.py_kernels.copy() for overload in STATIC_FAKE_KERNELS}
    try:
        for overload, fake in STATIC_FAKE_KERNELS.items():
            overload.py_kernels.pop(_COMPOSITE, None)
            overload.py_impl(_COMPOSITE)(_kernel(overload, fake))
        yield
    finally:
        for overload, kernels in saved.items():
            overload.py_kernels.clear()
            overload.py_kernels.update(kernels)
            overload._dispatch_cache.clear()
