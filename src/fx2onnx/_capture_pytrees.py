"""Capture's inputs and outputs as pytrees: library containers (transformers' caches) registered as pytrees when a
model meets them, and the flat order and paths (``past_key_values.0``...) of inputs and outputs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree


def register_library_pytrees(model: torch.nn.Module) -> None:
    """Let pytrees flatten model libraries' containers (Hugging Face caches) in inputs and outputs."""
    if type(model).__module__.startswith("transformers."):
        try:
            from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
        except ImportError:  # older transformers: ModelOutput is a pytree already; caches stay unsupported
            return
        register_cache_pytrees_for_model(model)


def register_library_pytrees_for_inputs(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any], *, strict: bool
) -> bool:
    """:func:`register_library_pytrees` now where the inputs hold a cache, or for strict mode (dynamo would trace
    :func:`library_pytrees_when_returned`'s hook); whether it did.

    Importing transformers' exporters and registering takes 15-25 ms, which an encoder's export (BERT) paid for
    nothing: a model given no cache is left to :func:`library_pytrees_when_returned`."""
    if not type(model).__module__.startswith("transformers."):
        return False
    if strict or any(_is_cache(leaf) for leaf in pytree.tree_leaves((args, dict(kwargs)))):
        register_library_pytrees(model)
        return True
    return False


@contextlib.contextmanager
def library_pytrees_when_returned(model: Any, *, registered: bool, seconds: list[float]) -> Iterator[None]:
    """Register a transformers model's pytrees when its forward returns a cache (``use_cache``: whether it builds
    one is its code's decision, not its config's; BERT's config says True), from a forward hook, which runs before
    torch.export flattens the outputs. The registration's time is added to `seconds`, so that the capture does not
    count it as the tracer's."""
    if registered or not isinstance(model, torch.nn.Module) or not type(model).__module__.startswith("transformers."):
        yield
        return

    def register_if_cache(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        if any(_is_cache(leaf) for leaf in pytree.tree_leaves(output)):
            started = time.perf_counter()
            register_library_pytrees(model)
            seconds[0] += time.perf_counter() - started

    handle = model.register_forward_hook(register_if_cache)
    try:
        yield
    finally:
        handle.remove()


def _is_cache(value: Any) -> bool:
    """transformers' rule for a cache (unregistered, so a pytree leaf): a ``Cache`` subclass, or a model's own class
    named ``...Cache``."""
    kind = type(value)
    return kind.__name__.endswith("Cache") or any(
        base.__name__ == "Cache" and base.__module__.startswith("transformers.") for base in kind.__mro__
    )


def flatten_inputs(in_spec: pytree.TreeSpec | None, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Any]:
    """Flatten call arguments in the order the captured graph expects them."""
    kwargs = dict(kwargs or {})
    if in_spec is not None and in_spec.num_children == 2:
        kw_spec = in_spec.child(1)
        if kw_spec.context is not None and set(kw_spec.context) == set(kwargs):
            kwargs = {k: kwargs[k] for k in kw_spec.context}
    return pytree.tree_leaves((tuple(args), kwargs))


def output_paths(out_spec: pytree.TreeSpec | None, count: int) -> list[str]:
    """Readable names for flat outputs from their pytree paths (``logits``, ``past_key_values_0``)."""
    if out_spec is None or out_spec.num_leaves != count:
        return [f"output_{i}" for i in range(count)]
    names = ["_".join(path) for path in _spec_paths(out_spec, [])]
    names = [n if n and not n[0].isdigit() else f"output_{n}".rstrip("_") for n in names]
    if len(set(names)) != len(names):
        return [f"output_{i}" for i in range(count)]
    return names


def _spec_paths(spec: pytree.TreeSpec, prefix: list[str]) -> list[list[str]]:
    """Key paths of a spec's leaves, read from the spec itself (no need to rebuild the objects)."""
    if spec.is_leaf():
        return [prefix]
    children = spec.children()
    context = spec.context
    keys: list[str]
    if (
        isinstance(context, (list, tuple))
        and len(context) == len(children)
        and all(isinstance(k, str) for k in context)
    ):
        keys = list(context)  # dicts, ModelOutput
    elif isinstance(getattr(context, "_fields", None), tuple) and len(context._fields) == len(children):
        keys = list(context._fields)  # a named tuple's context is its class: its fields name the outputs
    else:
        keys = [str(i) for i in range(len(children))]
    if spec.type in (tuple, list) and not prefix and len(children) == 1:
        keys = [""]  # a lone output needs no index
    paths = []
    for key, child in zip(keys, children):
        paths.extend(_spec_paths(child, [*prefix, key] if key else prefix))
    return paths


def input_paths(in_spec: pytree.TreeSpec | None, count: int) -> list[str]:
    if in_spec is None or in_spec.num_leaves != count:
        return [f"input {i}" for i in range(count)]
    paths = []
    for path in _spec_paths(in_spec, []):
        if path and path[0] == "0":  # positional: args[i]...
            paths.append("args[" + "][".join(path[1:]) + "]" if len(path) > 1 else "args")
        else:
            paths.append(".".join(path[1:]) or "kwargs")
    return paths
