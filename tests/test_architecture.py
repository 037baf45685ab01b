"""The package's structure: imports follow the pipeline's stages, with no cycle; every lowering's key is an op.

The import graph is read from the sources with ``ast`` (imports inside functions and under ``TYPE_CHECKING``
included: a cycle hidden by a deferred import is still a cycle). Importing ``a.b.c`` runs ``a.b``'s
``__init__`` too, so it counts as importing the package ``a.b`` (the root package, the public facade, excepted).
"""

from __future__ import annotations

import ast
import importlib
import operator
import pathlib

import pytest
import torch

import fx2onnx
from fx2onnx._lowerings import registered_rules
from fx2onnx._records import qualified_name

PACKAGE = pathlib.Path(fx2onnx.__file__).parent

# Lowest first. A module may import modules of its own layer or of lower ones, never of a higher one. The stages
# run capture -> passes -> registry/dispatch -> emit -> finalize -> legalize -> program; below the registry sit
# the lowerings it holds, and below those what lowerings record with (the recorder and the lowering context).
# A module is placed by its longest matching prefix.
LAYERS: list[tuple[str, ...]] = [
    (  # leaves every stage may use
        "fx2onnx._version",
        "fx2onnx._records",
        "fx2onnx.errors",
        "fx2onnx._dtypes",
        "fx2onnx._complex_layout",
        "fx2onnx._rounding_noise",
        "fx2onnx._streaming",
        "fx2onnx._weights",
        "fx2onnx._weight_reads",
        "fx2onnx._verification",
        "fx2onnx._fake_kernels",
        "fx2onnx._torch_compat",
        "fx2onnx.examples",
        "fx2onnx._safe_save",
        "fx2onnx._progress",
        "fx2onnx._constant_arrays",
        "fx2onnx._cache_files",
        "fx2onnx._log_filters",
        "fx2onnx._torch_ops",
    ),
    ("fx2onnx._capture_strategies", "fx2onnx._library_stand_ins", "fx2onnx._capture_functionalize"),  # capture only
    ("fx2onnx._capture_pytrees",),  # inputs and outputs as pytrees: library types registered, flat order, paths
    ("fx2onnx._capture_dims",),  # dynamic_shapes read and adapted; torch.export run with them
    ("fx2onnx._capture_size_one",),  # the general branch compared at size 1 (the example sliced)
    ("fx2onnx._capture",),
    ("fx2onnx._passes",),
    ("fx2onnx._emit", "fx2onnx._emit.recorder", "fx2onnx._emit.context"),
    ("fx2onnx._lowerings",),
    ("fx2onnx._registry",),
    ("fx2onnx._dispatch",),
    ("fx2onnx._emit.graph_builder", "fx2onnx._emit.control_flow", "fx2onnx._emit.runtime_checks"),
    ("fx2onnx._emit.branches",),  # joins two emitted graphs, the If's condition from runtime_checks
    ("fx2onnx._branch_regions",),  # several branches on values: each one's region, diffed at the FX level
    ("fx2onnx._branch_join",),  # captures and emits a decision's special branch again, joined by branches
    ("fx2onnx._finalize",),
    ("fx2onnx.legalize",),
    ("fx2onnx._intermediates", "fx2onnx.report"),
    ("fx2onnx.program",),
    ("fx2onnx._export",),
    ("fx2onnx", "fx2onnx.cli", "fx2onnx.coverage"),
]


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["fx2onnx", *path.relative_to(PACKAGE).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        return name if name in modules else None

    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names if alias.name.startswith("fx2onnx"))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if not module.startswith("fx2onnx"):
                    continue
                submodules = [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in modules]
                imported.update(submodules)
                if len(submodules) < len(node.names):  # names defined in the module itself
                    imported.add(module)
        edges = set()
        for target in filter(None, map(resolve, imported)):
            edges.add(target)
            while target.count(".") > 1:  # the packages it sits in run first (the root excepted)
                target = target.rpartition(".")[0]
                if not name.startswith(target + "."):
                    edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def _layer(module: str) -> int | None:
    best, best_length = None, -1
    for position, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = position, len(prefix)
    return best


def test_import_graph_has_no_cycle() -> None:
    graph = _import_graph()
    assert len(graph) > 50  # the whole package was read
    assert "fx2onnx._registry" in graph["fx2onnx._dispatch"]  # and its imports, deferred ones included
    assert _cycles(graph) == []


def test_imports_follow_the_stage_order() -> None:
    graph = _import_graph()
    unplaced = sorted(module for module in graph if _layer(module) is None)
    assert not unplaced, f"place these modules in LAYERS (tests/test_architecture.py): {unplaced}"
    upward = [
        f"{module} (layer {_layer(module)}) imports {imported} (layer {_layer(imported)})"
        for module, imports in sorted(graph.items())
        for imported in sorted(imports)
        if _layer(imported) > _layer(module)  # type: ignore[operator]
    ]
    assert upward == []


def test_the_layering_check_sees_a_violation() -> None:
    """The checks above can fail: an upward import and a cycle are found in a made-up graph."""
    graph = {"fx2onnx._capture": {"fx2onnx.program"}, "fx2onnx.program": {"fx2onnx._capture"}}
    assert _cycles(graph) == [["fx2onnx._capture", "fx2onnx.program"]]
    assert _layer("fx2onnx._capture") < _layer("fx2onnx.program")  # type: ignore[operator]
    assert _layer("fx2onnx._emit.graph_builder") > _layer("fx2onnx._lowerings.pooling")  # type: ignore[operator]


# Custom ops fx2onnx lowers, registered by the modules that define them.
_OP_LIBRARIES = {
    "quantized_decomposed": "torch.ao.quantization.fx._decomposed",
    "torch_nn": "torch.nn.modules.linear_cross_entropy",
    "transformers": "transformers.integrations.moe",
}
_PYTHON_MODULES = {"torch": torch, "_operator": operator}


def _resolve(key: str) -> object:
    namespace, _, rest = key.partition("::")
    if namespace in _PYTHON_MODULES:
        return getattr(_PYTHON_MODULES[namespace], rest)
    if namespace in _OP_LIBRARIES:
        importlib.import_module(_OP_LIBRARIES[namespace])
    if namespace == "torchvision":  # its operators, where its compiled extension does not load beside this torch
        from torchvision_cpu_ops import import_torchvision

        import_torchvision()
    name, _, overload = rest.partition(".")
    found = getattr(getattr(torch.ops, namespace), name)
    if namespace == "higher_order":
        return found
    return getattr(found, overload or "default")


@pytest.mark.parametrize("namespace", ["aten", "prims", "other"])
def test_every_lowering_key_names_an_existing_overload(namespace: str) -> None:
    keys = sorted(
        {
            rule.target
            for rule in registered_rules()
            if rule.target.startswith(f"{namespace}::") or (namespace == "other" and "aten::" not in rule.target)
        }
    )
    if namespace == "other":
        keys = [key for key in keys if not key.startswith("prims::")]
    assert keys
    unresolved = []
    for key in keys:
        try:
            resolved = _resolve(key)
        except AttributeError as error:
            unresolved.append(f"{key}: {error}")
            continue
        if qualified_name(resolved) != key:
            unresolved.append(f"{key}: resolves to {qualified_name(resolved)}")
    assert unresolved == []


def test_every_fx_pass_follows_the_pass_contract() -> None:
    """Each FX pass takes a GraphModule and returns a PassResult; run again on its own output, it changes nothing."""
    import fx2onnx._capture as capture
    from fx2onnx import Registry
    from fx2onnx._passes import PassResult, fx_passes

    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.sin(x * 0.3) + y.to(torch.int8)  # a float32-opmath rewrite and promotions

    args = (torch.ones(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.int16))
    registry = Registry.default()
    program = torch.export.export(Model(), args)
    captured = capture.from_exported_program(program, "torch.export")
    modified = []
    for fx_pass in fx_passes(captured, registry):
        result = fx_pass(captured.graph_module)
        assert isinstance(result, PassResult)
        modified.append(result.modified)
        assert not fx_pass(captured.graph_module).modified, f"{fx_pass.name} is not idempotent"
    assert any(modified)  # the model gives the passes something to do


def test_a_lowering_taking_the_context_says_so_outside_an_export() -> None:
    """A lowering declared with context=True gets the LoweringContext from the emitter; called without it, it
    names what it needs."""
    from fx2onnx._lowerings import special

    x = torch.ones(2)
    with pytest.raises(RuntimeError, match="needs the lowering context"):
        special.zeta.func(x, x)
