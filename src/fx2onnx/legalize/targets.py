"""Targets: what the exported model must load and run in, and which type bindings each one runs.

``onnx`` is the ONNX spec alone (``onnx.defs`` schemas). ``onnxruntime-cpu`` is the spec plus the
installed ONNX Runtime's CPU kernels (see :mod:`fx2onnx.legalize.tables`). Another runtime is
added with :func:`register_target` and a :class:`KernelTableTarget` built from its own table, e.g.
ONNX Runtime's CUDA provider from ``tables.registered_kernels("CUDAExecutionProvider")``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Hashable, Mapping

import onnx
import onnx.defs

from fx2onnx.legalize import probes, schemas, tables
from fx2onnx.legalize.tables import KernelTable, load_onnxruntime_cpu


@dataclasses.dataclass(frozen=True)
class Verdict:
    legal: bool
    reason: str = ""  # why not, when not legal
    # Legal only because the runtime computes the float16 node in float32 through Casts of its own.
    # ONNX Runtime drops the rounding to float16 between consecutive such nodes, which eager keeps.
    implicit_float32: bool = False


class Target:
    """What a model must run on: a verdict for each (domain, op type, opset, type binding)."""

    name: str

    def verdict(
        self,
        domain: str,
        op_type: str,
        opset: int,
        binding: Mapping[str, str],
        *,
        probe: probes.Probe | None = None,
    ) -> Verdict:
        """Whether the target runs `op_type` at `opset` with `binding` (constraint -> type string).

        `probe` builds a single-node model of the node in question, for targets that must ask a
        real session (see :class:`KernelTableTarget`).
        """
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


class SpecTarget(Target):
    """The ONNX spec: a node is legal when its schema allows every bound type."""

    name = "onnx"

    def verdict(
        self,
        domain: str,
        op_type: str,
        opset: int,
        binding: Mapping[str, str],
        *,
        probe: probes.Probe | None = None,
    ) -> Verdict:
        op_schema = schemas.schema(op_type, opset, domain)
        if op_schema is None:
            return Verdict(False, f"the ONNX spec has no {_qualified(domain, op_type)} at opset {opset}")
        violations = schemas.spec_violations(op_schema, binding)
        if violations:
            return Verdict(
                False, f"the ONNX spec does not allow {', '.join(violations)} for {op_type}-{op_schema.since_version}"
            )
        return Verdict(True)

    def describe(self) -> str:
        return "the ONNX spec"


class KernelTableTarget(SpecTarget):
    """The spec, then a runtime's kernel table: a node is legal when both accept its types."""

    def __init__(
        self,
        name: str,
        table: KernelTable | Callable[[], KernelTable],
        *,
        session_probe: Callable[[onnx.ModelProto | None], str] | None = None,
    ) -> None:
        self.name = name
        self._table = table
        # ONNX Runtime runs some nodes without a kernel of their own: it expands an operator's
        # function body (Relu on int64 becomes Max, Clip without bounds becomes Identity) and turns
        # Constant nodes into initializers. Whether that works can depend on the node's optional
        # inputs and attributes, so a session for the node itself decides (memoized).
        self._session_probe = session_probe
        self._probed: dict[Hashable, bool] = {}

    @functools.cached_property
    def table(self) -> KernelTable:
        return self._table if isinstance(self._table, KernelTable) else self._table()

    def verdict(
        self,
        domain: str,
        op_type: str,
        opset: int,
        binding: Mapping[str, str],
        *,
        probe: probes.Probe | None = None,
    ) -> Verdict:
        op_schema = schemas.schema(op_type, opset, domain)
        if op_schema is None:
            # A domain onnx does not know (e.g. com.microsoft): the runtime must at least know the op.
            if self.table.knows(domain, op_type):
                return Verdict(True)
            return Verdict(False, f"{self.describe()} has no kernel for {_qualified(domain, op_type)}")
        spec = super().verdict(domain, op_type, opset, binding)
        if not spec.legal:
            return spec
        if self.table.has_kernel(domain, op_type, op_schema.since_version, binding):
            return self._when_run(op_schema, opset, binding, probe)
        if self.table.runs_as_float32(domain, op_type, op_schema.since_version, binding):
            return Verdict(True, implicit_float32=True)
        if self._runs_without_kernel(op_schema, opset, binding, probe):
            # An expanded function body may itself run in float32 through the runtime's Casts.
            return Verdict(True, implicit_float32=tables.FLOAT16 in binding.values())
        bound = ", ".join(f"{name}={type_}" for name, type_ in sorted(binding.items()))
        return Verdict(
            False, f"{self.describe()} has no kernel for {op_type}-{op_schema.since_version} with {bound or 'no types'}"
        )

    def describe(self) -> str:
        return self.table.description or self.name

    def _when_run(
        self, op_schema: onnx.defs.OpSchema, opset: int, binding: Mapping[str, str], probe: probes.Probe | None
    ) -> Verdict:
        """A kernel is registered; some (scatter ops with a reduction) still refuse types when they run."""
        if self._session_probe is None or op_schema.domain or op_schema.name not in probes.REDUCTION_OPS:
            return Verdict(True)
        reduction = probe.attributes.get("reduction", "none") if probe is not None else "none"
        if reduction == "none":
            return Verdict(True)
        key = ("run", op_schema.name, opset, tuple(sorted(binding.items())), reduction)
        if key not in self._probed:
            self._probed[key] = probes.reduction_outcome(op_schema.name, opset, binding, str(reduction)) == "ok"
        if self._probed[key]:
            return Verdict(True)
        bound = ", ".join(f"{name}={type_}" for name, type_ in sorted(binding.items()))
        return Verdict(
            False,
            f"{self.describe()} refuses {op_schema.name}-{op_schema.since_version} with {bound} and "
            f"reduction={reduction!r} when it runs",
        )

    def _runs_without_kernel(
        self, op_schema: onnx.defs.OpSchema, opset: int, binding: Mapping[str, str], probe: probes.Probe | None
    ) -> bool:
        if self._session_probe is None:
            return False
        expandable = op_schema.has_function or op_schema.has_context_dependent_function
        if not expandable and self.table.knows(op_schema.domain, op_schema.name):
            return False  # kernels exist, none for these types, and nothing to expand
        if probe is None:
            probe = probes.schema_probe(op_schema.name, opset, binding, op_schema.domain)
        if probe.key not in self._probed:
            self._probed[probe.key] = self._session_probe(probe.build()) == "ok"
        return self._probed[probe.key]


_FACTORIES: dict[str, Callable[[], Target]] = {
    "onnxruntime-cpu": lambda: KernelTableTarget(
        "onnxruntime-cpu", load_onnxruntime_cpu, session_probe=probes.session_outcome
    ),
    "onnx": SpecTarget,
}
_INSTANCES: dict[str, Target] = {}


def register_target(name: str, factory: Callable[[], Target]) -> None:
    """Make `name` usable as ``fx2onnx.export(..., target=name)``; `factory` builds the Target on first use."""
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def unregister_target(name: str) -> None:
    _FACTORIES.pop(name, None)
    _INSTANCES.pop(name, None)


def available_targets() -> tuple[str, ...]:
    return tuple(_FACTORIES)


def get_target(name: str) -> Target:
    if name not in _FACTORIES:
        raise ValueError(f"unknown target {name!r}; choose from {available_targets()}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _FACTORIES[name]()
    return _INSTANCES[name]


def _qualified(domain: str, op_type: str) -> str:
    return f"{domain}::{op_type}" if domain else op_type
