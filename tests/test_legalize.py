"""Target legalization: exported models load and run in ONNX Runtime CPU for every dtype eager supports.

The dtype matrix exports one op per dtype, creates an ONNX Runtime CPU session (must succeed), runs
it and compares dtype, shape and values with eager. Cells eager itself refuses are skipped.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
import pytest
import torch
import torch.nn.functional as F
from onnxscript import opset18 as op

import fx2onnx
from fx2onnx import _dtypes as dtypes
from fx2onnx.examples import tiny_gpt, tiny_resnet
from fx2onnx.legalize import LegalizationError, legalize_model, probes, tables, targets
from fx2onnx.legalize import cli as legalize_cli
from fx2onnx.program import ONNXProgram

from conftest import assert_exports_and_matches as check

DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f64": torch.float64,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "u8": torch.uint8,
    "bool": torch.bool,
}


def make(
    shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator, *, nonzero: bool = False
) -> torch.Tensor:
    """Random values; narrow integers span their whole range, so arithmetic overflows and must wrap."""
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool) if nonzero else torch.rand(shape, generator=generator) > 0.5
    info = torch.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    values = torch.randint(low, high + 1, shape, generator=generator).to(dtype)
    return torch.where(values == 0, torch.ones_like(values), values) if nonzero else values


def distinct(shape: tuple[int, int], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Rows without ties where the dtype allows (topk's order of ties is unspecified in eager)."""
    if dtype == torch.bool:
        return make(shape, dtype, generator)
    rows = [torch.randperm(shape[1], generator=generator) for _ in range(shape[0])]
    values = torch.stack(rows) * 3 - 5
    return values.to(dtype) if not dtype.is_floating_point else (values.to(torch.float32) / 4).to(dtype)


Case = tuple[Callable[..., Any], Callable[[torch.dtype, torch.Generator], tuple[torch.Tensor, ...]]]
INDEX = torch.tensor([[0, 2], [1, 0], [3, 3]])
CASES: dict[str, Case] = {
    "add": (lambda a, b: a + b, lambda d, g: (make((3, 4), d, g), make((3, 4), d, g))),
    "sub": (lambda a, b: a - b, lambda d, g: (make((3, 4), d, g), make((3, 4), d, g))),
    "mul": (lambda a, b: a * b, lambda d, g: (make((3, 4), d, g), make((3, 4), d, g))),
    "div": (lambda a, b: a / b, lambda d, g: (make((3, 4), d, g), make((3, 4), d, g, nonzero=True))),
    "matmul": (lambda a, b: a @ b, lambda d, g: (make((3, 4), d, g), make((4, 5), d, g))),
    "bmm": (torch.bmm, lambda d, g: (make((2, 3, 4), d, g), make((2, 4, 5), d, g))),
    "max": (torch.maximum, lambda d, g: (make((3, 4), d, g), make((3, 4), d, g))),
    "min": (torch.minimum, lambda d, g: (make((3, 4), d, g), make((3, 4), d, g))),
    "max_reduction": (lambda a: a.max(dim=1), lambda d, g: (distinct((3, 4), d, g),)),
    "min_reduction": (lambda a: (a.min(), a.amin(dim=0)), lambda d, g: (make((3, 4), d, g),)),
    "argmax": (lambda a: torch.argmax(a, dim=1), lambda d, g: (distinct((3, 4), d, g),)),
    "relu": (torch.relu, lambda d, g: (make((3, 4), d, g),)),
    "where": (
        lambda c, a, b: torch.where(c, a, b),
        lambda d, g: (make((3, 4), torch.bool, g), make((3, 4), d, g), make((3, 4), d, g)),
    ),
    "softmax": (lambda a: torch.softmax(a, dim=-1), lambda d, g: (make((3, 4), d, g),)),
    "log_softmax": (lambda a: torch.log_softmax(a, dim=-1), lambda d, g: (make((3, 4), d, g),)),
    "layer_norm": (
        lambda a, w, b: F.layer_norm(a, (4,), w, b),
        lambda d, g: (make((3, 4), d, g), make((4,), d, g), make((4,), d, g)),
    ),
    "exp": (torch.exp, lambda d, g: (make((3, 4), d, g) if d.is_floating_point else make((3, 4), d, g) % 8,)),
    "sin": (torch.sin, lambda d, g: (make((3, 4), d, g),)),
    "cos": (torch.cos, lambda d, g: (make((3, 4), d, g),)),
    "sum": (lambda a: a.sum(dim=1), lambda d, g: (make((3, 4), d, g),)),
    "mean": (lambda a: a.mean(dim=1), lambda d, g: (make((3, 4), d, g),)),
    "cumsum": (lambda a: torch.cumsum(a, dim=1), lambda d, g: (make((3, 4), d, g),)),
    "topk": (lambda a: torch.topk(a, 2, dim=1), lambda d, g: (distinct((3, 4), d, g),)),
    "sort": (
        lambda a: (torch.sort(a, dim=1, stable=True), torch.sort(a, dim=0, descending=True, stable=True)),
        lambda d, g: (make((3, 4), d, g) if d == torch.bool else make((3, 4), d, g) % 3,),  # with ties
    ),
    "gather": (lambda a, i: torch.gather(a, 1, i), lambda d, g: (make((4, 4), d, g), INDEX)),
    "index_select": (lambda a, i: torch.index_select(a, 0, i), lambda d, g: (make((4, 3), d, g), INDEX[:, 0])),
    "embedding": (lambda i, w: F.embedding(i, w), lambda d, g: (INDEX, make((5, 3), d, g))),
    "conv2d": (
        lambda a, w, b: F.conv2d(a, w, b),
        lambda d, g: (make((1, 2, 5, 5), d, g), make((3, 2, 3, 3), d, g), make((3,), d, g)),
    ),
}


class One(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, a: torch.Tensor) -> Any:
        return self.fn(a)


class Two(One):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Any:
        return self.fn(a, b)


class Three(One):
    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
        return self.fn(a, b, c)


def module_and_inputs(op_name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    fn, inputs = CASES[op_name]
    args = inputs(dtype, torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            fn(*args)
    except (RuntimeError, TypeError, NotImplementedError) as error:
        pytest.skip(f"eager does not support {op_name} on {dtype}: {str(error).splitlines()[0]}")
    return {1: One, 2: Two, 3: Three}[len(args)](fn), args


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("op_name", CASES)
def test_dtype_matrix(op_name: str, dtype: torch.dtype) -> None:
    # make_fx capture: the same ATen graph as torch.export here, at a fraction of the time.
    model, args = module_and_inputs(op_name, dtype)
    check(model, args, extractor="symbolic_trace")


@pytest.mark.parametrize(
    ("op_name", "dtype"),
    [
        ("add", torch.bfloat16),
        ("where", torch.int16),
        ("where", torch.bool),
        ("matmul", torch.uint8),
        ("cos", torch.bfloat16),
    ],
)
def test_dtype_matrix_cells_through_torch_export(op_name: str, dtype: torch.dtype) -> None:
    model, args = module_and_inputs(op_name, dtype)
    check(model, args)


# --- the legal-types tables -----------------------------------------------------------------------------
def test_table_is_generated_when_missing_then_read_from_the_cache(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("FX2ONNX_CACHE_DIR", str(tmp_path))
    table = tables.load_onnxruntime_cpu()
    path = tables.table_path()
    assert path.parent == tmp_path and path.exists()
    data = json.loads(path.read_text())
    assert data["onnxruntime"] == onnxruntime.__version__ and data["onnx"] == onnx.__version__
    assert data["kernels"] == table.to_json()["kernels"]

    def no_generation() -> None:
        raise AssertionError("the cached table should have been used")

    monkeypatch.setattr(tables, "generate_onnxruntime_cpu", no_generation)
    cached = tables.load_onnxruntime_cpu()
    assert cached.kernels == table.kernels and cached.float16_via_float32 == table.float16_via_float32


def test_an_export_and_save_do_not_load_onnxruntime(tmp_path: Any) -> None:
    """The cached table is named by onnxruntime's version, read without importing it (the import loads its native
    library): a fresh process exports and saves with onnxruntime absent from sys.modules, and the version read is
    the one the import reports."""
    script = (
        "import sys, torch, fx2onnx\n"
        "from fx2onnx.legalize import tables\n"
        "program = fx2onnx.export(torch.nn.Linear(4, 3), (torch.randn(2, 4),))\n"
        f"program.save({str(tmp_path / 'linear.onnx')!r})\n"
        "assert 'onnxruntime' not in sys.modules, 'onnxruntime was imported'\n"
        "read = tables.onnxruntime_version()\n"
        "import onnxruntime\n"
        "assert read == onnxruntime.__version__, (read, onnxruntime.__version__)\n"
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]


def test_table_command_regenerates_the_cache(tmp_path: Any, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setenv("FX2ONNX_CACHE_DIR", str(tmp_path))
    assert legalize_cli.main([]) == 0
    assert tables.table_path().exists()
    assert "float16-via-float32" in capsys.readouterr().out


def test_table_comes_from_the_installed_kernel_registry() -> None:
    from onnxruntime.capi import _pybind_state

    registered = [k for k in _pybind_state.get_all_opkernel_def() if k.provider == "CPUExecutionProvider"]
    table = targets.get_target("onnxruntime-cpu").table
    assert sum(map(len, table.kernels.values())) == len(registered)


@pytest.mark.parametrize("opset", [18, tables.newest_opset()])
def test_onnxruntime_table_agrees_with_single_node_sessions(opset: int) -> None:
    target = targets.get_target("onnxruntime-cpu")
    disagreements = tables.check_against_sessions(
        lambda op_type, at, binding: target.verdict("", op_type, at, binding).legal, opset
    )
    assert not disagreements, "\n".join(disagreements)


def test_spec_target_agrees_with_the_onnx_checker() -> None:
    target = targets.get_target("onnx")

    def checker_accepts(op_type: str, opset: int, binding: dict[str, str]) -> bool:
        model = probes.single_node_model(op_type, opset, binding)
        try:  # type checking against the schema (the probe's values have no shapes to check)
            onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        except onnx.shape_inference.InferenceError:
            return False
        return True

    schema_ops = [o for o in tables.SAMPLE_OPS if o not in ("ConstantOfShape", "Cast")]
    for op_type in schema_ops:
        op_schema = onnx.defs.get_schema(op_type, 18)
        first = op_schema.inputs[0].type_str
        for type_str in tables.SAMPLE_TYPES:
            binding = probes.default_binding(op_schema, **{first: type_str})
            if binding is None or probes.single_node_model(op_type, 18, binding) is None:
                continue
            verdict = target.verdict("", op_type, 18, binding).legal
            assert verdict == checker_accepts(op_type, 18, binding), (op_type, binding)


def test_float16_handling_is_derived_from_sessions() -> None:
    """Each float16 node the table says ONNX Runtime casts to float32 itself has no float16 kernel, yet runs."""
    table = targets.get_target("onnxruntime-cpu").table
    assert table.float16_via_float32
    for key, since in sorted(table.float16_via_float32):
        op_type = key.partition("::")[2]
        op_schema = onnx.defs.get_schema(op_type, max(since, 18))
        if op_schema.since_version != since:
            continue  # superseded by opset 18
        half = [c.type_param_str for c in op_schema.type_constraints if "tensor(float16)" in c.allowed_type_strs]
        binding = probes.default_binding(op_schema, **dict.fromkeys(half, "tensor(float16)"))
        assert not table.has_kernel("", op_type, since, binding) and table.runs("", op_type, since, binding)
        assert probes.probe(op_type, max(since, 18), binding) == "ok", (op_type, binding)


@pytest.mark.parametrize(
    ("op_type", "opset", "binding", "in_spec"),  # what ONNX Runtime runs is its installed version's business
    [
        ("Add", 18, {"T": "tensor(bfloat16)"}, True),
        ("Add", 18, {"T": "tensor(bool)"}, False),
        ("Cos", 18, {"T": "tensor(bfloat16)"}, False),
        ("Cos", 22, {"T": "tensor(bfloat16)"}, True),
        ("Where", 18, {"B": "tensor(bool)", "T": "tensor(int16)"}, True),
        ("Where", 18, {"B": "tensor(bool)", "T": "tensor(bool)"}, True),
        ("MatMul", 18, {"T": "tensor(int8)"}, False),
        ("Relu", 18, {"T": "tensor(int64)"}, True),  # ONNX Runtime may expand Relu's function body
        ("Clip", 18, {"T": "tensor(int16)"}, True),
        ("Exp", 18, {"T": "tensor(float16)"}, True),
    ],
)
def test_verdicts_agree_with_sessions(op_type: str, opset: int, binding: dict[str, str], in_spec: bool) -> None:
    assert targets.get_target("onnx").verdict("", op_type, opset, binding).legal == in_spec
    on_onnxruntime = targets.get_target("onnxruntime-cpu").verdict("", op_type, opset, binding).legal
    assert on_onnxruntime == (probes.probe(op_type, opset, binding) == "ok")
    assert in_spec or not on_onnxruntime


def test_onnxruntime_cast_wraps_integers_like_eager() -> None:
    """The cast back after computing int8 in int32 must wrap as eager's int8 arithmetic does."""
    values = np.array([127, 128, 200, 255, 256, -129, 70000, -70000, 2**31 - 1], dtype=np.int32)
    for dtype in (torch.int8, torch.uint8, torch.int16):
        to = ir.DataType.from_numpy(torch.empty(0, dtype=dtype).numpy().dtype)
        model = probes.single_node_model("Cast", 18, {"T1": "tensor(int32)", "T2": f"tensor({to.name.lower()})"})
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (result,) = session.run(None, {"in0": values})
        np.testing.assert_array_equal(result, torch.from_numpy(values).to(dtype).numpy())


# --- the pass -----------------------------------------------------------------------------------------
class RoundingChain(torch.nn.Module):
    """log(exp(x) + d) - x: eager rounds exp(x) + d to the narrow type first, so a small d vanishes."""

    def forward(self, x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return (x.exp() + d).log() - x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_legalized_ops_round_to_the_narrow_type_after_each_op(dtype: torch.dtype) -> None:
    x = torch.linspace(1, 2, 12).reshape(3, 4).to(dtype)
    d = torch.full((3, 4), 1e-4).to(dtype)
    expected = RoundingChain()(x, d)
    assert torch.equal(expected, torch.zeros_like(expected))
    program = check(RoundingChain(), (x, d))
    assert torch.equal(program(x, d)[0], expected)
    legalized = [c for c in program.report.casts if c.reason == "legalize"]
    assert {(c.from_dtype, c.to_dtype) for c in legalized} == {
        (dtypes.short_name(dtype), "f32"),
        ("f32", dtypes.short_name(dtype)),
    }
    casts = [n for n in program.model.graph if n.op_type == "Cast"]
    assert casts and all(n.metadata_props.get("pkg.fx2onnx.legalize") for n in casts)

    fast = check(RoundingChain(), (x, d), fast_math=True)  # within the dtype's tolerance of eager
    fast_casts = [c for c in fast.report.casts if c.reason.startswith("legalize")]
    assert fast_casts and all(c.reason.startswith("legalize (fast_math") for c in fast_casts)
    inserted = [n for n in fast.model.graph if n.op_type == "Cast"]
    assert len(inserted) < len(casts)  # round trips between consecutive ops are gone
    assert fast(x, d)[0].abs().max() > 0  # unrounded, d survives
    assert "fast_math" in fast.report.summary()


def test_int8_arithmetic_wraps_like_eager() -> None:
    class Int8Math(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return a @ w, (a * 3 + b).relu(), torch.maximum(a, b), torch.cumsum(a, 1, dtype=torch.int8)

    a = torch.tensor([[100, -128, 127, 5], [77, 90, -100, 1]], dtype=torch.int8)
    b = torch.tensor([[127, 100, -128, 50], [90, 90, 90, 90]], dtype=torch.int8)
    w = torch.tensor([[127, 100, -128], [90, 90, 90], [-7, 3, 127], [1, 2, 3]], dtype=torch.int8)
    program = check(Int8Math(), (a, b, w))
    # ONNX Runtime has no int8 CumSum: the integer cumsum lowering adds in int32 and casts back (legalization did)
    assert any(n.op_type == "CumSum" for n in program.model_proto.graph.node)


class BoolLogic(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return a + b, a * b, torch.maximum(a, b), torch.where(c, a, b)


def test_bool_computes_as_integers_where_semantics_allow() -> None:
    generator = torch.Generator().manual_seed(1)
    a, b, c = (torch.rand(4, 5, generator=generator) > 0.5 for _ in range(3))
    program = check(BoolLogic(), (a, b, c))
    legalized = {(c.value.rsplit("(", 1)[-1].rstrip(")"), c.from_dtype, c.to_dtype) for c in program.report.casts}
    assert ("Where", "bool", "u8") in legalized  # ONNX Runtime has no bool Where


def test_float32_models_get_no_casts() -> None:
    for factory in (tiny_gpt, tiny_resnet):
        model, args = factory()
        program = check(model, args)
        assert not [c for c in program.report.casts if c.reason.startswith("legalize")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("factory", [tiny_gpt, tiny_resnet], ids=["TinyGPT", "TinyResNet"])
def test_end_to_end_low_precision(factory: Callable[[], Any], dtype: torch.dtype) -> None:
    model, args = factory()
    reference_model = copy.deepcopy(model).to(dtype).double()  # dtype's weights, computed in float64
    model = model.to(dtype)
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    reference_args = tuple(a.double() if a.is_floating_point() else a for a in args)
    with torch.no_grad():
        eager = model(*args)
        reference = reference_model(*reference_args)
    # Within two units in the last place of the largest output, relative tolerance as for dtype.
    ulp = 2.0 ** math.floor(math.log2(float(eager.abs().max()))) * torch.finfo(dtype).eps
    program = check(model, args, atol=2 * ulp)
    legalized = [c for c in program.report.casts if c.reason == "legalize"]
    assert legalized  # ONNX Runtime CPU computes most of these ops in float32 only
    assert f"| {legalized[0].from_dtype} | {legalized[0].to_dtype} | legalize |" in program.report.to_markdown()
    # As accurate as eager itself against a float64 computation of the same model.
    onnx_error = (program(*args)[0].double() - reference).abs().max()
    eager_error = (eager.double() - reference).abs().max()
    assert onnx_error <= 1.5 * eager_error + ulp


# --- subgraphs, targets, errors ---------------------------------------------------------------------
def if_model() -> ir.Model:
    """if c: (x + x) * x else: x * x + x, on bfloat16, with the branches reading x from outer scope."""
    bf16 = ir.TensorType(ir.DataType.BFLOAT16)
    shape = ir.Shape([3])
    c = ir.Value(name="c", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    x = ir.Value(name="x", type=bf16, shape=shape)

    def branch(name: str, first: str, second: str) -> ir.Graph:
        a = ir.Node("", first, [x, x], name=f"{name}_a")
        b = ir.Node("", second, [a.outputs[0], x], name=f"{name}_b")
        for node in (a, b):
            node.outputs[0].type, node.outputs[0].shape = bf16, shape
        b.outputs[0].name = f"{name}_out"
        return ir.Graph([], [b.outputs[0]], nodes=[a, b], name=name)

    node = ir.Node(
        "", "If", [c], [ir.AttrGraph("then_branch", branch("then", "Add", "Mul")),
                        ir.AttrGraph("else_branch", branch("else", "Mul", "Add"))], name="if"
    )  # fmt: skip
    node.outputs[0].name, node.outputs[0].type, node.outputs[0].shape = "y", bf16, shape
    graph = ir.Graph([c, x], [node.outputs[0]], nodes=[node], opset_imports={"": 18}, name="main")
    return ir.Model(graph, ir_version=8)


def test_if_branches_are_legalized() -> None:
    model = if_model()
    casts = legalize_model(model, "onnxruntime-cpu")
    assert {c.node for c in casts} >= {"then_a", "then_b", "else_a", "else_b"}
    onnx.checker.check_model(ir.to_proto(model), full_check=True)
    program = ONNXProgram(model, exported_program=None, module=None, in_spec=None)
    x = torch.tensor([1.5, -2.25, 3.0]).bfloat16()
    for flag, expected in ((True, (x + x) * x), (False, x * x + x)):
        (result,) = program(torch.tensor(flag), x)
        assert result.dtype == torch.bfloat16 and torch.equal(result, expected)


def test_onnx_target_follows_the_spec_at_the_chosen_opset() -> None:
    class CosOfSum(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.cos(a + b)

    args = (torch.randn(3).bfloat16(), torch.randn(3).bfloat16())
    at_18 = fx2onnx.export(CosOfSum(), args, target="onnx")
    legalized = {c.value.rsplit("(", 1)[-1].rstrip(")") for c in at_18.report.casts if c.reason == "legalize"}
    assert legalized == {"Cos"}  # the spec allows bfloat16 Add; Cos only from opset 22
    at_22 = fx2onnx.export(CosOfSum(), args, target="onnx", opset_version=22)
    assert not [c for c in at_22.report.casts if c.reason == "legalize"]


def test_another_runtime_is_added_by_supplying_its_table() -> None:
    """A runtime without float32 Add: its models compute Add in float64, and still run on ORT."""
    full = targets.get_target("onnxruntime-cpu").table
    kernels = {
        key: [(s, e, c) for s, e, c in entries if key != "::Add" or "tensor(float)" not in c.get("T", ())]
        for key, entries in full.kernels.items()
    }
    targets.register_target(
        "no-float-add", lambda: targets.KernelTableTarget("no-float-add", tables.KernelTable(kernels))
    )
    try:
        program = check(Two(lambda a, b: a + b), (torch.randn(3, 4), torch.randn(3, 4)), target="no-float-add")
        assert {(c.from_dtype, c.to_dtype) for c in program.report.casts} == {("f32", "f64"), ("f64", "f32")}
    finally:
        targets.unregister_target("no-float-add")


def test_unknown_target_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown target 'tpu'"):
        fx2onnx.export(One(torch.relu), (torch.randn(2),), target="tpu")


def test_a_node_no_type_can_legalize_fails_the_export_naming_it(tmp_path: Any) -> None:
    def erf_of_integers(self):  # Erf takes floats only; int64 has nothing wider to compute in
        return op.Erf(self)

    path = tmp_path / "model.onnx"
    with pytest.raises(LegalizationError) as caught:
        fx2onnx.export(
            One(torch.neg),
            (torch.arange(4),),
            custom_translation_table={torch.ops.aten.neg.default: erf_of_integers},
            f=path,
        )
    message = str(caught.value)
    assert "Erf" in message and "from FX node `neg`" in message and "aten::neg" in message
    assert "T=tensor(int64)" in message and "test_legalize.py" in message
    assert caught.value.node == "neg"
    assert not os.path.exists(path)


def test_constants_converted_ahead_of_time_leave_no_unused_original() -> None:
    class AddsBufferFunction(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.randn(8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.sin(self.table * 2)  # folded to a bf16 constant, which the f32 Add reads converted

    program = check(AddsBufferFunction().to(torch.bfloat16), (torch.randn(2, 8, dtype=torch.bfloat16),))
    unused = [v.name for v in program.model.graph.initializers.values() if not v.uses() and not v.is_graph_output()]
    assert unused == []


def test_final_check_judges_again_a_legal_node_whose_types_changed() -> None:
    """check() skips a node found legal only while its types are as judged: a float32 Cos made bfloat16 after
    the pass (as a rewrite of its producer could) is refused, not taken for the node found legal."""
    from fx2onnx.legalize import get_target
    from fx2onnx.legalize.rewrite import Legalizer

    f32 = ir.TensorType(ir.DataType.FLOAT)
    x = ir.Value(name="x", type=f32, shape=ir.Shape([3]))
    cos = ir.Node("", "Cos", [x], name="cos")
    cos.outputs[0].name, cos.outputs[0].type, cos.outputs[0].shape = "y", f32, ir.Shape([3])
    graph = ir.Graph([x], [cos.outputs[0]], nodes=[cos], opset_imports={"": 18}, name="main")
    legalizer = Legalizer(ir.Model(graph, ir_version=8), get_target("onnxruntime-cpu"))
    legalizer.run()
    assert not legalizer.refusals and not list(legalizer.check())
    bf16 = ir.TensorType(ir.DataType.BFLOAT16)
    x.type = cos.outputs[0].type = bf16
    assert [refusal.node.name for refusal in legalizer.check()] == ["cos"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_tanh_gelu_of_a_zero_dimensional_tensor_runs(dtype: torch.dtype) -> None:
    """ONNX Runtime fuses the tanh form of gelu into FastGelu, whose kernel refuses a 0-d input when the model runs
    (fuzz seed 40001174: gelu(sinc(x), approximate="tanh") of a 0-d tensor); fusion_guards keeps a 0-d Tanh's input
    apart (docs/ort-defects.md). The user's own GPT-2 formula, in eager's order, likewise."""

    def gpt2_gelu(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    for function in (lambda x: F.gelu(x, approximate="tanh"), gpt2_gelu):
        for value in (-5.0, 0.7, 3.0):
            check(One(lambda x, f=function: f(torch.sinc(x))), (torch.tensor(value, dtype=dtype),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_two_gelus_of_one_tensor_load(check: Callable[..., Any], dtype: torch.dtype) -> None:
    """gelu(h) + gelu(h, approximate="tanh"): the optimizer shares their h * 0.5, and ONNX Runtime's GeluFusion removed
    that node with the erf gelu it fused, so the default session refused the model ("Node input ... is not a graph
    input"); fusion_guards gives the other reader its own product (docs/ort-defects.md)."""
    model = One(lambda h: F.gelu(h) + F.gelu(h, approximate="tanh"))
    x = torch.tensor([[-6.0, -3.0, -0.5, 0.0, 0.5, 3.0, 6.0, float("nan")]], dtype=dtype).repeat(2, 1)
    check(model, (x,))
