"""Static-shape fake kernels, during capture, for composite ops whose generic fake run is data-dependent.

torch.export records CompositeImplicitAutograd ops such as ``aten::combinations`` whole and computes their
outputs' metadata by running their composite implementation on fake tensors. For a few ops that
implementation reads tensor values (``masked_select``, ``.item()``, ``equal``) although the output's shape
does not depend on them, and capture fails (PendingUnbackedSymbolNotFound, DataDependentOutputException).
Within :func:`static_fake_kernels` these ops get a kernel that, on fake tensors, returns an empty tensor of
the output's true (static) shape, as export itself does for the composite ops it preserves; real tensors
still run torch's composite implementation. fx2onnx lowers each op whole (_lowerings/), so the
composite implementation never reaches the graph.

A few ops with a kernel per device are tagged ``dynamic_output_shape`` although their shapes follow from the
inputs' shapes and arguments (``linalg_lstsq``: which outputs are empty depends on the driver); fake tensors refuse
them (DynamicOutputShapeException). Within the same context these get a fake kernel, the way
``torch.library.register_fake`` gives one to a custom op, in the table torch's fake tensors consult; only the one
size that does depend on values (a rank-deficient matrix's missing residuals) is an unbacked size.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._C import DispatchKey
from torch._library import simple_registry
from torch._library.utils import Kernel
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import get_proxy_mode

from fx2onnx._torch_ops import aten, present

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


def _diff(
    self: torch.Tensor,
    n: int = 1,
    dim: int = -1,
    prepend: torch.Tensor | None = None,
    append: torch.Tensor | None = None,
) -> torch.Tensor:
    # The composite clamps n to the length with a Python comparison (`n > size`), which on a data-dependent length
    # (diff of x[x != 0]) is a guard: capture then took the smallest length (2) as the only one, and the ONNX model's
    # shapes said 2 (ONNX Runtime's fusions split by them). The length is max(length - n, 0) for every length.
    if n == 0:  # eager returns the input itself, without prepend and append
        return self.new_empty(self.shape)
    parts = [part for part in (prepend, self, append) if part is not None]
    axis = dim % self.dim()
    length = sum(part.shape[axis] for part in parts)
    dtype = self.dtype
    for part in parts:
        dtype = torch.promote_types(dtype, part.dtype)
    shape = list(self.shape)
    shape[axis] = torch.sym_max(length - n, 0)
    return self.new_empty(shape, dtype=dtype)


# Overload -> its output's metadata on fake tensors.
# (present: an overload the installed torch lacks gets no kernel.)
STATIC_FAKE_KERNELS: dict[torch._ops.OpOverload, Callable[..., torch.Tensor]] = present(
    {
        aten.combinations.default: _combinations,
        aten.narrow.Tensor: _narrow_tensor,
        aten.cov.default: _cov,
        aten.one_hot.default: _one_hot,
        aten.ctc_loss.IntList: _ctc_loss,
        aten.ctc_loss.Tensor: _ctc_loss,
        aten.diff.default: _diff,
    }
)


def _linalg_lstsq(
    self: torch.Tensor, b: torch.Tensor, rcond: float | None = None, *, driver: str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eager's output shapes: empty (0,) tensors for what the driver does not compute (CPU's default is gelsy)."""
    driver = driver or "gelsy"
    m, n = self.shape[-2], self.shape[-1]
    vector = b.dim() == self.dim() - 1
    columns = b.unsqueeze(-1) if vector else b
    batch = torch.broadcast_shapes(self.shape[:-2], columns.shape[:-2])
    count = columns.shape[-1]
    solution = self.new_empty((*batch, n) if vector else (*batch, n, count))
    empty = self.new_empty((0,))
    residuals = empty
    if m > n and driver != "gelsy":
        residuals = self.new_empty((*batch, count))
        if driver in ("gelsd", "gelss"):
            # Eager computes them only when every matrix has full rank, else returns a (0,) tensor: a length known
            # at run time. With batch dims the empty result keeps them ((*batch, 0), one rank cannot become another).
            size = torch.library.get_ctx().new_dynamic_size(max=count)
            residuals = self.new_empty((*batch, size))
    # rank and singular values over A's own batch dims (B's do not broadcast into them)
    rank = self.new_empty(self.shape[:-2] if driver != "gels" else (0,), dtype=torch.int64)
    singular_values = self.new_empty((*self.shape[:-2], min(m, n))) if driver in ("gelsd", "gelss") else empty
    return solution, residuals, rank, singular_values


# Overload (with a kernel per device, tagged dynamic_output_shape) -> its fake kernel.
SHAPE_FAKE_KERNELS: dict[torch._ops.OpOverload, Callable[..., Any]] = present(
    {
        aten.linalg_lstsq.default: _linalg_lstsq,
    }
)


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
    handles = []
    try:
        for overload, fake in STATIC_FAKE_KERNELS.items():
            overload.py_kernels.pop(_COMPOSITE, None)
            overload.py_impl(_COMPOSITE)(_kernel(overload, fake))
        for overload, fake in SHAPE_FAKE_KERNELS.items():
            # Only the table fake tensors read (no dispatcher registration): real tensors keep torch's kernels.
            holder = simple_registry.singleton.find(overload.name()).fake_impl
            kernel = Kernel(fake, f"fx2onnx/_fake_kernels.py ({overload})")
            holder.kernels.append(kernel)
            handles.append((holder, kernel))
        yield
    finally:
        for holder, kernel in handles:
            holder.kernels.remove(kernel)
        for overload, kernels in saved.items():
            overload.py_kernels.clear()
            overload.py_kernels.update(kernels)
            overload._dispatch_cache.clear()
