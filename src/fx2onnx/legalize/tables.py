"""Legal-types tables of ONNX Runtime, generated from the installed onnxruntime and cached.

The table of a provider holds, for each (domain, op type), the kernels the provider registers:
their opset range and, per type constraint, the types they take (from
``onnxruntime.capi._pybind_state.get_all_opkernel_def()``). For the CPU provider it also holds
which float16 nodes ONNX Runtime runs by casting them to float32 itself (its InsertCastTransformer):
the kernel registry cannot say that, so each candidate (op, opset) is asked of a real
single-node session. Nothing here is typed by hand.

The table is cached per onnxruntime and onnx version as JSON under ``$FX2ONNX_CACHE_DIR``, else
``$XDG_CACHE_HOME/fx2onnx``, else ``~/.cache/fx2onnx``, and regenerated when missing (in about a
second). ``python -m fx2onnx.legalize [--check]`` regenerates it (and checks it against sessions).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import onnx.defs

from fx2onnx import _cache_files as cache_files
from fx2onnx._records import BASE_OPSET
from fx2onnx.legalize import probes, schemas

FORMAT = 1
CPU = "CPUExecutionProvider"
FLOAT16 = "tensor(float16)"
FLOAT = "tensor(float)"
_OPEN_END = 2**31 - 1  # ONNX Runtime's "no end version"


class KernelTable:
    """What kernels one ONNX Runtime provider has, with the float16 handling it applies itself."""

    def __init__(
        self,
        kernels: Mapping[str, Sequence[tuple[int, int, Mapping[str, Iterable[str]]]]],
        float16_via_float32: Iterable[tuple[str, int]] = (),
        *,
        description: str = "",
    ) -> None:
        # Each op's entries are converted (frozensets of types) on its first lookup: the table holds ~300 ops and an
        # export asks about a few dozen, so converting all of them was most of legalize's cost in a fresh process.
        self._given = dict(kernels)
        self._converted: dict[str, list[tuple[int, int, dict[str, frozenset[str]]]]] = {}
        self.float16_via_float32 = frozenset((key, since) for key, since in float16_via_float32)
        self.description = description

    @property
    def kernels(self) -> dict[str, list[tuple[int, int, dict[str, frozenset[str]]]]]:
        """Every op's kernels (converts the whole table: for listings, not for lookups)."""
        return {key: self._entries(key) for key in self._given}

    def _entries(self, key: str) -> list[tuple[int, int, dict[str, frozenset[str]]]]:
        entries = self._converted.get(key)
        if entries is None:
            entries = self._converted[key] = [
                (int(start), int(end), {name: frozenset(types) for name, types in constraints.items()})
                for start, end, constraints in self._given.get(key, ())
            ]
        return entries

    @staticmethod
    def key(domain: str, op_type: str) -> str:
        return f"{_normal_domain(domain)}::{op_type}"

    def knows(self, domain: str, op_type: str) -> bool:
        return self.key(domain, op_type) in self._given

    def has_kernel(self, domain: str, op_type: str, since_version: int, binding: Mapping[str, str]) -> bool:
        """A registered kernel matches the node's schema version and bound types.

        Versions match as ONNX Runtime matches them: the kernel starts at the schema's version, or
        starts before it and has a closed end at or after it. A kernel lists only the constraints it
        dispatches on; the others take whatever the spec allows.
        """
        for start, end, constraints in self._entries(self.key(domain, op_type)):
            if not (start == since_version or (start < since_version <= end and end != _OPEN_END)):
                continue
            if all(bound in constraints[name] for name, bound in binding.items() if name in constraints):
                return True
        return False

    def runs(self, domain: str, op_type: str, since_version: int, binding: Mapping[str, str]) -> bool:
        """The provider runs the node: a kernel of its own, or (float16) one reached by ORT's own Casts."""
        return self.has_kernel(domain, op_type, since_version, binding) or self.runs_as_float32(
            domain, op_type, since_version, binding
        )

    def runs_as_float32(self, domain: str, op_type: str, since_version: int, binding: Mapping[str, str]) -> bool:
        """The provider runs this float16 node in float32, through Casts it inserts itself."""
        if FLOAT16 in binding.values() and (self.key(domain, op_type), since_version) in self.float16_via_float32:
            as_float = {name: FLOAT if bound == FLOAT16 else bound for name, bound in binding.items()}
            return self.has_kernel(domain, op_type, since_version, as_float)
        return False

    # --- (de)serialization ------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "kernels": {
                key: [[start, end, {n: sorted(t) for n, t in sorted(c.items())}] for start, end, c in entries]
                for key, entries in sorted(self.kernels.items())
            },
            "float16_via_float32": sorted([key, since] for key, since in self.float16_via_float32),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], description: str = "") -> KernelTable:
        return cls(data["kernels"], [(k, int(v)) for k, v in data["float16_via_float32"]], description=description)


def _normal_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


# --- generation ---------------------------------------------------------------------------------------
def registered_kernels(provider: str = CPU) -> dict[str, list[tuple[int, int, dict[str, list[str]]]]]:
    """The installed onnxruntime's kernel registry for `provider`, keyed ``domain::op``."""
    from onnxruntime.capi import _pybind_state

    kernels: dict[str, list[tuple[int, int, dict[str, list[str]]]]] = collections.defaultdict(list)
    for kernel in _pybind_state.get_all_opkernel_def():
        if kernel.provider != provider:
            continue
        start, end = kernel.version_range
        constraints = {name: list(types) for name, types in kernel.type_constraints.items()}
        kernels[KernelTable.key(kernel.domain, kernel.op_name)].append((int(start), int(end), constraints))
    return dict(kernels)


def schema_versions(max_opset: int) -> list[onnx.defs.OpSchema]:
    """Each distinct default-domain schema in force at some opset from BASE_OPSET to `max_opset`."""
    found: dict[tuple[str, int], onnx.defs.OpSchema] = {}
    for opset in range(BASE_OPSET, max_opset + 1):
        for op_schema in onnx.defs.get_all_schemas():
            current = schemas.schema(op_schema.name, opset, "")
            if current is not None and not current.deprecated:
                found.setdefault((current.name, current.since_version), current)
    return list(found.values())


def float16_via_float32(table: KernelTable, max_opset: int) -> list[tuple[str, int]]:
    """(op, schema version) pairs whose float16 nodes ONNX Runtime CPU runs by casting to float32.

    Candidates are schemas allowing float16 with no float16 kernel but a float32 one; a single-node
    session decides each.
    """
    found = []
    for op_schema in schema_versions(max_opset):
        half = [name for name, allowed in schemas.allowed_types(op_schema).items() if FLOAT16 in allowed]
        if not half:
            continue
        binding = probes.default_binding(op_schema, **dict.fromkeys(half, FLOAT16))
        if binding is None:
            continue
        as_float = {name: FLOAT if bound == FLOAT16 else bound for name, bound in binding.items()}
        since = op_schema.since_version
        if table.has_kernel("", op_schema.name, since, binding) or not table.has_kernel(
            "", op_schema.name, since, as_float
        ):
            continue
        opset = max(since, BASE_OPSET)
        if probes.probe(op_schema.name, opset, binding) == "ok":
            found.append((KernelTable.key("", op_schema.name), since))
    return found


def generate_onnxruntime_cpu() -> dict[str, Any]:
    """Build the ONNX Runtime CPU table from the installed onnxruntime (kernels + float16 probes)."""
    import onnxruntime

    start = time.perf_counter()
    table = KernelTable(registered_kernels(CPU))
    highest = newest_opset()
    table.float16_via_float32 = frozenset(float16_via_float32(table, highest))
    data = table.to_json()
    data.update(
        format=FORMAT,
        provider=CPU,
        onnxruntime=onnxruntime.__version__,
        onnx=onnx.__version__,
        opsets=[BASE_OPSET, highest],
        generated_seconds=round(time.perf_counter() - start, 3),
    )
    return data


@functools.cache
def newest_opset() -> int:
    """The newest default-domain opset both the installed onnx and ONNX Runtime accept."""
    for opset in range(onnx.defs.onnx_opset_version(), BASE_OPSET - 1, -1):
        if probes.probe("Identity", opset, {"T": FLOAT, "V": FLOAT}) == "ok":
            return opset
    return BASE_OPSET


# --- cache ----------------------------------------------------------------------------------------------
cache_dir = cache_files.cache_dir


def table_path() -> Path:
    return cache_dir() / f"types-onnxruntime-cpu-{onnxruntime_version()}-onnx-{onnx.__version__}.json"


_BUILT_VERSION = re.compile(r"""^__version__ = ['"]([^'"]+)['"]""", re.MULTILINE)


def onnxruntime_version() -> str:
    """The installed onnxruntime's version, read from the build information it ships
    (``onnxruntime/capi/build_and_package_info.py``, what its ``__version__`` is set from) without importing it: the
    import loads its native library, 0.05-0.2 s of an export that only needs the cached table's name. The import
    answers when the file is missing or does not say."""
    loaded = sys.modules.get("onnxruntime")
    if loaded is not None:
        return str(loaded.__version__)
    spec = importlib.util.find_spec("onnxruntime")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            with contextlib.suppress(OSError):
                found = _BUILT_VERSION.search((Path(folder) / "capi" / "build_and_package_info.py").read_text())
                if found:
                    return found[1]
    import onnxruntime

    return str(onnxruntime.__version__)


def load_onnxruntime_cpu(*, regenerate: bool = False) -> KernelTable:
    """The cached ONNX Runtime CPU table, generated (and cached) when missing, stale or asked."""
    path = table_path()
    data = None if regenerate else _read(path)
    if data is None:
        data = generate_onnxruntime_cpu()
        _write(path, data)
    return KernelTable.from_json(data, description=f"onnxruntime {data['onnxruntime']} {data['provider']}")


def _read(path: Path) -> dict[str, Any] | None:
    return cache_files.read_json(path, FORMAT)


def _write(path: Path, data: Mapping[str, Any]) -> None:
    """Atomic write; a cache that cannot be written only costs regeneration next time."""
    cache_files.write_json(path, data)


# --- checking the table against sessions --------------------------------------------------------------
SAMPLE_OPS = (
    "Add", "Sub", "Mul", "Div", "MatMul", "Pow", "Max", "Min", "Equal", "Less", "Where", "Neg", "Abs", "Relu", "Exp",
    "Log", "Sqrt", "Cos", "Sin", "Tanh", "Sigmoid", "Erf", "Softmax", "LogSoftmax", "ReduceSum", "ReduceMax",
    "ReduceMean", "Transpose", "Sign", "Floor", "Not", "And", "Mod", "CumSum", "ArgMax", "TopK", "Clip", "Expand",
    "Gather", "GatherElements", "Concat", "LayerNormalization", "Conv", "Cast", "ConstantOfShape", "Range",
)  # fmt: skip
SAMPLE_TYPES = tuple(
    f"tensor({name})"
    for name in ("float", "float16", "bfloat16", "double", "int8", "int16", "int32", "int64", "uint8", "bool")
)


def check_against_sessions(
    runs: Any, opset: int = BASE_OPSET, ops: Sequence[str] = SAMPLE_OPS, types: Sequence[str] = SAMPLE_TYPES
) -> list[str]:
    """Compare a target's verdicts with real sessions for single-node models; returns the disagreements.

    `runs(op_type, opset, binding) -> bool` is the target's verdict. Each op's first input's
    constraint takes each type; other constraints take a common type. Models no session can judge
    (e.g. a required attribute the probe cannot fill) are skipped.
    """
    disagreements = []
    for op_type in ops:
        op_schema = schemas.schema(op_type, opset, "")
        if op_schema is None or not op_schema.inputs:
            continue
        constraint = op_schema.inputs[0].type_str
        if constraint not in schemas.allowed_types(op_schema):
            continue
        for type_str in types:
            binding = probes.default_binding(op_schema, **{constraint: type_str})
            if binding is None:
                continue
            outcome = probes.probe(op_type, opset, binding)
            if outcome == "unbuildable":
                continue
            verdict = runs(op_type, opset, binding)
            if verdict != (outcome == "ok"):
                disagreements.append(f"{op_type}-{opset} {binding}: table says {verdict}, session says {outcome}")
    return disagreements
