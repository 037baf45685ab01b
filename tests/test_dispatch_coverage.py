"""Every dtype signature eager accepts, per ATen overload, has an implementation the dispatcher can bind.

The signatures come from the coverage sweep's dtype discovery (``fx2onnx/coverage/aten_dtypes.json``):
each is an overload as it reached fx2onnx's dispatcher on an OpInfo sample that eager ran, with the
dtypes of its tensor arguments and the other arguments it was given, as captured (eager's dtypes) and,
where type promotion changed them, as dispatched. For each one this test builds the FX node with the
dispatched dtypes and asks the real dispatcher (default registry) to choose: a perfect match, or a match
through lossless Casts, covers it (legalization then makes each ONNX node's types ones the target runs).
Runtime checks (``_assert_tensor_metadata``...) are not dispatched: the emitter skips them
(``graph_builder.is_runtime_check``), so they are counted apart. A signature nothing can bind, or that
binds only through a lossy Cast, is a gap. Today's gaps are listed in ``dispatch_gaps.json`` beside this
file: a new one fails the test, a fixed one is only reported (a warning). After a change that closes
gaps (or a sweep that records new signatures), refresh the list with
``python tests/test_dispatch_coverage.py --update`` and review the diff.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import sys
import warnings
from typing import Any

import pytest
import torch
import torch.fx

from fx2onnx import Registry
from fx2onnx import _dtypes as dtypes
from fx2onnx._dispatch import Dispatcher
from fx2onnx._emit.graph_builder import is_runtime_check
from fx2onnx._records import BASE_OPSET
from fx2onnx.coverage import discovery
from fx2onnx.errors import UnsupportedOperatorError

# "f32" -> torch.float32, for every dtype fx2onnx maps to ONNX
_TORCH_DTYPES = {dtypes.short_name(d): d for d in dtypes._TORCH_TO_ONNX}

KNOWN_GAPS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dispatch_gaps.json")


def known_gaps() -> dict[str, str]:
    """overload(dtypes) -> why, for the signatures nothing lowers from eager's dtypes (or only lossily) today."""
    with open(KNOWN_GAPS_PATH, encoding="utf-8") as handle:
        return json.load(handle)["gaps"]


def resolve(overload: str) -> torch._ops.OpOverload:
    if overload.startswith("torch_nn::"):  # custom ops torch registers when their module is first imported
        importlib.import_module("torch.nn.modules.linear_cross_entropy")
    namespace, _, rest = overload.partition("::")
    name, _, overload_name = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload_name or "default")


def recorded_with_this_torch() -> bool:
    """Whether the discovery data was recorded with the installed torch release (local build tags aside)."""
    with open(discovery.DATA_PATH, encoding="utf-8") as handle:
        recorded = json.load(handle)["torch"]
    return recorded.split("+")[0] == torch.__version__.split("+")[0]


def in_this_torch(overload: str) -> bool:
    """Whether the installed torch has `overload`: another release than the data's may have removed it
    (torch 2.15 removed aten::cholesky; torch.cholesky now calls linalg_cholesky)."""
    try:
        resolve(overload)
    except AttributeError:
        return False
    return True


def build_node(overload: str, args: dict[str, Any]) -> torch.fx.Node:
    """The FX node for a recorded signature: placeholders with eager's dtypes, constants as recorded."""
    target = resolve(overload)
    graph = torch.fx.Graph()

    def value(encoded: Any) -> Any:
        if encoded is None:
            return None
        if "t" in encoded:
            node = graph.placeholder(f"x{len(graph.nodes)}")
            node.meta["val"] = torch.empty(2, dtype=_TORCH_DTYPES[encoded["t"]])
            return node
        if "l" in encoded:
            return [value(v) for v in encoded["l"]]
        return discovery.decode_constant(encoded["c"])

    positional, keywords = [], {}
    for argument in target._schema.arguments:
        if argument.name in args:
            given = value(args[argument.name])
        elif argument.has_default_value():
            given = argument.default_value
        else:
            given = None
        if argument.kwarg_only:
            if argument.name in args:
                keywords[argument.name] = given
        else:
            positional.append(given)
    while positional and positional[-1] is None and len(positional) > _required_positional(target):
        positional.pop()
    return graph.call_function(target, tuple(positional), keywords)


def _required_positional(target: torch._ops.OpOverload) -> int:
    return sum(1 for a in target._schema.arguments if not a.kwarg_only and not a.has_default_value())


def describe(overload: str, args: dict[str, Any]) -> str:
    shown = []
    for name, encoded in args.items():
        if "t" in encoded:
            shown.append(f"{name}={encoded['t']}")
        elif "l" in encoded:
            shown.append(f"{name}=[{','.join(v['t'] if v and 't' in v else '-' for v in encoded['l'])}]")
    return f"{overload}({', '.join(shown)})"


def dispatch_gaps(
    registry: Registry, data: dict[str, Any] | None = None
) -> tuple[dict[str, str], collections.Counter[str]]:
    """gap description -> why, and how many signatures bound perfectly / through Casts."""
    data = discovery.load() if data is None else data
    gaps: dict[str, str] = {}
    kinds: collections.Counter[str] = collections.Counter()
    for overload, entry in data.items():
        if not in_this_torch(overload):
            kinds["absent from this torch (skipped)"] += len(entry["signatures"])
            continue
        for signature in entry["signatures"]:
            if any(t.startswith("c") for t in discovery.tensor_dtypes(signature["args"])):
                kinds["complex (reported apart)"] += 1
                continue
            args = signature.get("dispatched", signature["args"])
            name = describe(overload, args)
            node = build_node(overload, args)
            if is_runtime_check(node):  # as in a real export, where the emitter skips it before dispatch
                kinds["runtime check (skipped)"] += 1
                continue
            dispatcher = Dispatcher(registry, BASE_OPSET)
            try:
                decision = dispatcher.dispatch(node)
            except UnsupportedOperatorError as error:
                gaps[name] = str(error).splitlines()[0] + f" (e.g. {', '.join(signature['cases'])})"
                kinds["none"] += 1
                continue
            chosen = decision.chosen
            assert chosen is not None
            if chosen.kind == "cast" and chosen.cost >= dtypes.LOSSY:
                casts = ", ".join(f"{p}->{dtypes.short_name(t)}" for p, t in chosen.casts.items())
                gaps[name] = f"only a lossy cast ({casts}) via {chosen.implementation.name}"
                kinds["lossy"] += 1
            else:
                kinds[chosen.kind] += 1
    return gaps, kinds


@pytest.fixture(scope="module")
def gaps_and_kinds() -> tuple[dict[str, str], collections.Counter[str]]:
    return dispatch_gaps(Registry.default())


def test_discovery_data_is_current() -> None:
    """Every recorded overload exists in this torch and every signature can be rebuilt as an FX node.

    Under another torch release than the data's, an overload that release removed is skipped (the data stays
    that of the release `make test` installs); every other one must still build."""
    data = discovery.load()
    assert len(data) > 100, "the discovery data is nearly empty; run `fx2onnx coverage --write-docs`"
    absent = [overload for overload in data if not in_this_torch(overload)]
    if recorded_with_this_torch():
        assert absent == []
    assert len(absent) < len(data) // 20, f"this torch lacks many recorded overloads: {absent}"
    for overload, entry in data.items():
        if overload in absent:
            continue
        for signature in entry["signatures"]:
            build_node(overload, signature["args"])
            build_node(overload, signature.get("dispatched", signature["args"]))
        assert set(entry["dtypes"]) <= set(_TORCH_DTYPES)


# Cells whose signatures the sweep records: a complex op the FX passes rewrite on its parts (its captured node
# is erased), float16 ops rewritten to compute in float32, a plain integer op.
REGENERATED_CELLS = [
    ("as_strided", "complex64"),
    ("hstack", "complex64"),
    ("nn.functional.silu", "float16"),
    ("add", "int8"),
]


@pytest.mark.parametrize(("op", "dtype"), REGENERATED_CELLS, ids=lambda value: str(value))
def test_regenerating_cells_reproduces_the_data(op: str, dtype: str) -> None:
    """A cell's signatures recorded again (as the sweep does: its samples, in process) are the published ones:
    each is in the data, and each published signature that lists the cell is recorded again."""
    from fx2onnx.coverage.cases import Case
    from fx2onnx.coverage.runner import run_case

    if not recorded_with_this_torch():
        pytest.skip("the data was recorded with another torch release")
    case = f"{op}/{dtype}"
    record = run_case(Case(op, dtype, "fx2onnx", samples=3))
    regenerated = {discovery.signature_key(s) for s in record["signatures"]}
    published = {
        discovery.signature_key({"overload": overload, **signature}): signature["cases"]
        for overload, entry in discovery.load().items()
        for signature in entry["signatures"]
    }
    assert sorted(regenerated - set(published)) == [], f"{case} records signatures the data lacks"
    listing = {key for key, cases in published.items() if case in cases}
    assert sorted(listing - regenerated) == [], f"the data lists {case} for signatures it no longer records"
    for signature in record["signatures"]:
        if discovery.tensor_dtypes(signature["args"]) and "dispatched" in signature:
            assert discovery.tensor_dtypes(signature["dispatched"]), f"{signature}: no tensor left (an erased node)"


def test_every_eager_signature_has_an_implementation(gaps_and_kinds: Any) -> None:
    gaps, kinds = gaps_and_kinds
    known = known_gaps()
    new = {name: why for name, why in gaps.items() if name not in known}
    fixed = sorted(set(known) - set(gaps))
    if fixed:  # reported, not failed: refresh the list with --update
        warnings.warn(f"{len(fixed)} known dispatch gaps are fixed: {', '.join(fixed)}", stacklevel=1)
    assert kinds["perfect"] + kinds["cast"] > 0
    assert not new, (
        f"{len(new)} eager dtype signatures have no lossless implementation ({dict(kinds)}; "
        f"{len(known)} known in {os.path.basename(KNOWN_GAPS_PATH)}):\n  "
        + "\n  ".join(f"{k}: {v}" for k, v in sorted(new.items()))
    )


def test_known_gaps_are_still_recorded() -> None:
    """A known gap that the discovery data no longer records is stale: refresh the list (--update)."""
    data = discovery.load()
    recorded = {describe(o, s.get("dispatched", s["args"])) for o, e in data.items() for s in e["signatures"]}
    assert sorted(set(known_gaps()) - recorded) == []


def test_runtime_checks_are_counted_apart(gaps_and_kinds: Any) -> None:
    """``_assert_tensor_metadata`` & co. return nothing: the emitter skips them, so they are never a gap."""
    gaps, kinds = gaps_and_kinds
    assert kinds["runtime check (skipped)"] >= 10  # one per dtype the sweep asserted
    assert not [name for name in gaps if name.startswith("aten::_assert_tensor_metadata")]
    used = build_node("aten::_assert_tensor_metadata", {"a": {"t": "f32"}})
    used.graph.output(used)  # a node something reads is no runtime check: it would be dispatched
    assert not is_runtime_check(used)


def test_a_missing_implementation_is_found() -> None:
    """The check can fail: with an overload's implementations removed, its signatures become gaps."""
    registry = Registry.default()
    registry.unregister("aten::add.Tensor")
    gaps, _ = dispatch_gaps(registry)
    assert any(name.startswith("aten::add.Tensor(self=f32, other=f32") for name in gaps)


def _update_known_gaps() -> None:
    gaps, kinds = dispatch_gaps(Registry.default())
    payload = {
        "about": "Eager dtype signatures with no lossless implementation today; see test_dispatch_coverage.py.",
        "counts": dict(sorted(kinds.items())),
        "gaps": dict(sorted(gaps.items())),
    }
    with open(KNOWN_GAPS_PATH, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=1)
        handle.write("\n")
    print(f"wrote {len(gaps)} gaps to {KNOWN_GAPS_PATH} ({dict(kinds)})")


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    _update_known_gaps()
