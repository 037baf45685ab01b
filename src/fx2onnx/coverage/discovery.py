"""Dtype discovery: which ATen overloads reach the dispatcher, with which input dtypes, on inputs eager accepts.

The sweep captures every runnable OpInfo sample through fx2onnx's own extractor (so the graph is the
decomposed one the dispatcher sees) and records, per overload, each distinct *signature*: the
dtypes of its tensor arguments and which other arguments were given. Since every sample ran in
eager first, each signature is one eager supports. The signatures are kept as data
(``aten_dtypes.json`` beside this module) for the dispatcher's tests.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.fx

from fx2onnx import _capture as capture_stage
from fx2onnx import _capture_strategies as capture_strategies
from fx2onnx import _dtypes as dtypes
from fx2onnx._dispatch import node_arguments
from fx2onnx._records import qualified_name

DATA_PATH = os.path.join(os.path.dirname(__file__), "aten_dtypes.json")

Signature = dict[str, Any]  # {"overload": str, "args": {name: encoded value}}


class RecordingExtractor:
    """An extractor that captures like fx2onnx's default one and records every node's signature.

    Each node's arguments are recorded as captured (eager's dtypes) and again, by :meth:`signatures`
    after the export, as the dispatcher saw them (after the FX passes' type promotion).
    """

    def __init__(self, inner: capture_stage.Extractor) -> None:
        self.inner = inner
        self.name = inner.name
        self._eager: list[tuple[torch.fx.Node, Signature]] = []

    def capture(
        self,
        model: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        dynamic_shapes: Any,
        decompositions: Mapping[Any, Callable[..., Any]],
        special_branch: capture_strategies.BranchDecision | None = None,
        size_one_branch: bool = False,
    ) -> capture_stage.CapturedGraph:
        captured = self.inner.capture(
            model,
            args,
            kwargs,
            dynamic_shapes,
            decompositions,
            special_branch=special_branch,
            size_one_branch=size_one_branch,
        )
        # Recorded before the FX passes run, so the dtypes are eager's, not the promoted ones.
        self._eager.extend((node, signature) for node, signature in graph_signatures(captured.graph))
        return captured

    def signatures(self) -> list[Signature]:
        """Every node's signature; ``dispatched`` holds the arguments after promotion where they differ."""
        found = []
        # A node the FX passes erased keeps its `graph` (and loses its args): only the nodes still in
        # their graph's node list reached the dispatcher.
        live: dict[int, set[torch.fx.Node]] = {}
        for node, signature in self._eager:
            graph = node.graph
            if graph is None or node.target is None:
                continue
            if id(graph) not in live:
                live[id(graph)] = set(graph.nodes)
            if node not in live[id(graph)]:
                continue
            after = _node_arguments(node)
            if after is not None and after != signature["args"]:
                signature = {**signature, "dispatched": after}
            found.append(signature)
        return found


def graph_signatures(graph: torch.fx.Graph) -> list[tuple[torch.fx.Node, Signature]]:
    found = []
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        encoded = _node_arguments(node)
        if encoded is None:
            continue  # shapes are static in the sweep; a symbolic argument cannot be replayed
        found.append((node, {"overload": qualified_name(node.target), "args": encoded}))
    return found


def _node_arguments(node: torch.fx.Node) -> dict[str, Any] | None:
    named, given = node_arguments(node)
    encoded = {name: encode(value) for name, value in named if name in given}
    if any(_symbolic(v) for v in encoded.values()):
        return None
    return encoded


def encode(value: Any) -> Any:
    """JSON for one argument: {"t": dtype} for a tensor, {"l": [...]} for a list of them, {"c": value} else."""
    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        if isinstance(val, torch.Tensor):
            return {"t": dtypes.short_name(val.dtype)}
        return {"s": type(val).__name__}
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.fx.Node) for v in value):
        return {"l": [None if v is None else encode(v) for v in value]}
    return {"c": _constant(value)}


def _constant(value: Any) -> Any:
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)  # JSON has no nan/inf
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_constant(v) for v in value]
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    return {"repr": str(value)}


def _symbolic(encoded: Any) -> bool:
    if isinstance(encoded, dict):
        if "s" in encoded:
            return True
        if "l" in encoded:
            return any(_symbolic(v) for v in encoded["l"] if v is not None)
    return False


def decode_constant(value: Any) -> Any:
    """The Python value of an encoded constant (dtypes back to torch dtypes)."""
    if isinstance(value, list):
        return [decode_constant(v) for v in value]
    if isinstance(value, dict):
        if "dtype" in value:
            return getattr(torch, value["dtype"])
        return value.get("repr")
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return value


def tensor_dtypes(signature_args: Mapping[str, Any]) -> list[str]:
    """Every tensor dtype in a signature's arguments."""
    found = []
    for value in signature_args.values():
        if isinstance(value, dict) and "t" in value:
            found.append(value["t"])
        elif isinstance(value, dict) and "l" in value:
            found.extend(v["t"] for v in value["l"] if isinstance(v, dict) and "t" in v)
    return found


def signature_key(signature: Signature) -> str:
    """Signatures that differ only in constant values are the same for dispatch."""

    def shape(args: Mapping[str, Any] | None) -> Any:
        return {name: (value if "c" not in value else "const") for name, value in (args or {}).items()}

    return json.dumps(
        [signature["overload"], shape(signature["args"]), shape(signature.get("dispatched"))], sort_keys=True
    )


def aggregate(
    records: Iterable[Mapping[str, Any]], previous: Mapping[str, Any] | None = None, max_examples: int = 3
) -> dict[str, Any]:
    """Per overload: the eager dtypes seen and each distinct signature, with the cases it came from.

    `previous` (an earlier aggregate) is extended, so a sweep of some ops keeps what others found; the cases
    that `records` ran again are taken out of its signatures first (a signature only they had recorded, and that
    they no longer produce, is dropped).
    """
    records = list(records)
    rerun = {f"{record['op']}/{record['dtype']}" for record in records if record.get("engine", "fx2onnx") == "fx2onnx"}
    overloads: dict[str, dict[str, Any]] = {}
    seen: dict[str, dict[str, Any]] = {}

    def add(overload: str, args: dict[str, Any], dispatched: Any, cases: Iterable[str]) -> None:
        key = signature_key({"overload": overload, "args": args, "dispatched": dispatched})
        entry = seen.get(key)
        if entry is None:
            entry = {"args": args, **({"dispatched": dispatched} if dispatched else {}), "cases": []}
            seen[key] = entry
            found = overloads.setdefault(overload, {"dtypes": set(), "signatures": []})
            found["signatures"].append(entry)
            found["dtypes"].update(tensor_dtypes(args))
        for case in cases:
            if len(entry["cases"]) < max_examples and case not in entry["cases"]:
                entry["cases"].append(case)

    for overload, entry in (previous or {}).items():
        for signature in entry["signatures"]:
            kept = [case for case in signature["cases"] if case not in rerun]
            if kept:
                add(overload, signature["args"], signature.get("dispatched"), kept)
    for record in records:
        case = f"{record['op']}/{record['dtype']}"
        for signature in record.get("signatures", []):
            add(signature["overload"], signature["args"], signature.get("dispatched"), [case])
    return {
        name: {"dtypes": sorted(entry["dtypes"]), "signatures": entry["signatures"]}
        for name, entry in sorted(overloads.items())
    }


def write(overloads: Mapping[str, Any], path: str = DATA_PATH) -> None:
    payload = {
        "about": (
            "Per ATen overload that reaches fx2onnx's dispatcher: the input dtypes eager PyTorch accepted "
            "in OpInfo's samples, and each distinct signature (tensor dtypes, other arguments given). "
            "Written by `fx2onnx coverage`; read by tests/test_dispatch_coverage.py."
        ),
        "torch": torch.__version__,
        "overloads": overloads,
    }
    _write_json(path, payload)


def _dumps_compact(payload: Mapping[str, Any]) -> str:
    """One line per signature: readable in a diff, a tenth of the size of fully indented JSON."""
    lines = ["{"]
    for key in ("about", "torch"):
        lines.append(f" {json.dumps(key)}: {json.dumps(payload[key])},")
    lines.append(' "overloads": {')
    names = list(payload["overloads"])
    for position, name in enumerate(names):
        entry = payload["overloads"][name]
        lines.append(f"  {json.dumps(name)}: {{")
        lines.append(f'   "dtypes": {json.dumps(entry["dtypes"])},')
        lines.append('   "signatures": [')
        signatures = entry["signatures"]
        for index, signature in enumerate(signatures):
            comma = "," if index < len(signatures) - 1 else ""
            lines.append(f"    {json.dumps(signature, separators=(', ', ': '))}{comma}")
        lines.append("   ]")
        lines.append("  }" + ("," if position < len(names) - 1 else ""))
    lines.append(" }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def load(path: str = DATA_PATH) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)["overloads"]


def _write_json(path: str, payload: Mapping[str, Any]) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(_dumps_compact(payload))
    os.replace(temporary, path)
