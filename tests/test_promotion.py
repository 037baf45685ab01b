"""Type promotion: every exported node computes in, and produces, the dtypes eager PyTorch does.

The property tests draw operand kinds (a tensor or 0-d tensor of some dtype, or a Python int/float/bool),
export one module applying every binary (or unary) op to them, run it in ONNX Runtime and compare dtype and
values of every output with eager. ``FX2ONNX_NIGHTLY=1`` runs many more, randomised, examples.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import onnx
import onnx_ir as ir
import onnxruntime
import pytest
import torch
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

import fx2onnx
from fx2onnx import _dtypes as dtypes
from fx2onnx._passes.promotion import CAST
from fx2onnx._verification import compare

from conftest import assert_exports_and_matches as check

NIGHTLY = os.environ.get("FX2ONNX_NIGHTLY") == "1"


def examples(regular: int, nightly: int) -> settings:
    """Hypothesis settings: a fixed, small set of examples normally; many randomised ones with FX2ONNX_NIGHTLY=1.

    A failure names the ops and operands, so shrinking (slow: each example is an export) is for nightly runs.
    """
    return settings(
        max_examples=nightly if NIGHTLY else regular,
        derandomize=not NIGHTLY,
        deadline=None,
        database=settings.default.database if NIGHTLY else None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if NIGHTLY else []),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# Dtypes the pipeline runs on ONNX Runtime CPU without target legalization (bfloat16 and the wide unsigned
# types need it; that is issue 4).
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]
SHAPE = (2, 3)


@dataclasses.dataclass(frozen=True)
class Operand:
    """One argument of an op: a tensor (n-d or 0-d) of a dtype, or a Python scalar of a kind."""

    kind: str  # "tensor", "0-d", "int", "float", "bool"
    dtype: torch.dtype | None = None

    @property
    def is_tensor(self) -> bool:
        return self.dtype is not None

    def __str__(self) -> str:
        if not self.is_tensor:
            return self.kind
        shape = "[]" if self.kind == "0-d" else "[2,3]"
        return f"{dtypes.short_name(self.dtype)}{shape}"

    def value(self, generator: torch.Generator, role: str) -> Any:
        """Small exact values; role "divisor" is never zero, role "exponent" is in 0..3 (shift amounts too)."""
        shape = SHAPE if self.kind == "tensor" else ()
        dtype = self.dtype or {"int": torch.int64, "float": torch.float64, "bool": torch.bool}[self.kind]
        if dtype == torch.bool:
            values = torch.randint(0, 2, shape, generator=generator).bool()
        elif role == "exponent":
            values = torch.randint(0, 4, shape, generator=generator).to(dtype)
        elif dtype.is_floating_point:
            values = torch.randint(-16, 17, shape, generator=generator).to(dtype) / 4  # multiples of 1/4: exact
            if role == "divisor":
                values = torch.where(values == 0, torch.full_like(values, 0.5), values)
        else:
            low = 0 if dtype == torch.uint8 else -4
            values = torch.randint(low, 5, shape, generator=generator).to(dtype)
            if role == "divisor":
                values = torch.where(values == 0, torch.ones_like(values), values)
        return values if self.is_tensor else values.item()


def operands(tensors_only: bool = False) -> st.SearchStrategy[Operand]:
    tensor = st.sampled_from(DTYPES).map(lambda d: Operand("tensor", d))
    zero_dim = st.sampled_from(DTYPES).map(lambda d: Operand("0-d", d))
    if tensors_only:
        return st.one_of(tensor, zero_dim)
    return st.one_of(tensor, zero_dim, st.sampled_from(["int", "float", "bool"]).map(Operand))


# Each op takes (cond, a, b, e): b is a non-zero "divisor" version of the rhs, e an "exponent" version.
BINARY_OPS: dict[str, Callable[..., Any]] = {
    "add": lambda c, a, b, e: a + b,
    "add_alpha": lambda c, a, b, e: torch.add(a, b, alpha=2),
    "sub": lambda c, a, b, e: a - b,
    "rsub": lambda c, a, b, e: b - a,
    "mul": lambda c, a, b, e: a * b,
    "div": lambda c, a, b, e: a / b,
    "div_trunc": lambda c, a, b, e: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda c, a, b, e: torch.div(a, b, rounding_mode="floor"),
    "floor_divide": lambda c, a, b, e: a // b,
    "pow": lambda c, a, b, e: a**e,
    "remainder": lambda c, a, b, e: a % b,
    "fmod": lambda c, a, b, e: torch.fmod(a, b),
    "maximum": lambda c, a, b, e: torch.maximum(a, b),
    "minimum": lambda c, a, b, e: torch.minimum(a, b),
    "clamp_min": lambda c, a, b, e: torch.clamp(a, min=b),
    "clamp_max": lambda c, a, b, e: torch.clamp(a, max=b),
    "clamp": lambda c, a, b, e: torch.clamp(a, min=b, max=e),
    "where": lambda c, a, b, e: torch.where(c, a, b),
    "eq": lambda c, a, b, e: a == b,
    "ne": lambda c, a, b, e: a != b,
    "lt": lambda c, a, b, e: a < b,
    "le": lambda c, a, b, e: a <= b,
    "gt": lambda c, a, b, e: a > b,
    "ge": lambda c, a, b, e: a >= b,
    "bitwise_and": lambda c, a, b, e: a & b,
    "bitwise_or": lambda c, a, b, e: a | b,
    "bitwise_xor": lambda c, a, b, e: a ^ b,
    "shift_left": lambda c, a, b, e: torch.bitwise_left_shift(a, e),
    "shift_right": lambda c, a, b, e: torch.bitwise_right_shift(a, e),
    "logical_and": lambda c, a, b, e: torch.logical_and(a, b),
    "logical_or": lambda c, a, b, e: torch.logical_or(a, b),
    "logical_xor": lambda c, a, b, e: torch.logical_xor(a, b),
}

UNARY_OPS: dict[str, Callable[[torch.Tensor], Any]] = {
    "sin": torch.sin,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "reciprocal": torch.reciprocal,
    "true_divide": lambda x: torch.true_divide(x, 2),
    "neg": torch.neg,
    "abs": torch.abs,
    "floor": torch.floor,
    "sign": torch.sign,
    "square": torch.square,
    "logical_not": torch.logical_not,
    "bitwise_not": torch.bitwise_not,
    "one_minus": lambda x: 1.0 - x,
    "sum": torch.sum,
    "sum_dim": lambda x: x.sum(-1),
    "sum_f64": lambda x: x.sum(dtype=torch.float64),
    "prod": torch.prod,
    "cumsum": lambda x: x.cumsum(-1),
    "cumsum_i32": lambda x: x.cumsum(-1, dtype=torch.int32),
    "mean": torch.mean,
    "mean_f32": lambda x: x.mean(dtype=torch.float32),
    "to_f16": lambda x: x.to(torch.float16),
}


class OpsModule(torch.nn.Module):
    """Applies each op to the same operands; Python-scalar operands are constants of the module."""

    def __init__(self, ops: dict[str, Callable[..., Any]], roles: list[str], constants: dict[str, Any]) -> None:
        super().__init__()
        self.ops = ops
        self.roles = roles  # which of a/b/e... the tensor inputs are, in order
        self.constants = constants

    def forward(self, *tensors: torch.Tensor) -> dict[str, torch.Tensor]:
        values = {**self.constants, **dict(zip(self.roles, tensors))}
        return {name: op(*(values[r] for r in ("c", "a", "b", "e") if r in values)) for name, op in self.ops.items()}


@dataclasses.dataclass
class Outcome:
    failures: list[str] = dataclasses.field(default_factory=list)
    missing_kernels: list[str] = dataclasses.field(default_factory=list)
    torch_disagrees: list[str] = dataclasses.field(default_factory=list)  # eager vs torch's own meta dtype


def run_ops(ops: dict[str, Callable[..., Any]], values: dict[str, Any], label: str) -> Outcome:
    """Export the ops eager accepts for these operands, run them in ONNX Runtime, compare with eager."""
    roles = [r for r, v in values.items() if isinstance(v, torch.Tensor)]
    constants = {r: v for r, v in values.items() if r not in roles}
    args = tuple(values[r] for r in roles)
    valid = {}
    outcome = Outcome()
    for name, op in ops.items():
        try:
            result = OpsModule({name: op}, roles, constants)(*args)[name]
        except Exception:  # eager rejects this op for these operands: nothing to match
            continue
        if not isinstance(result, torch.Tensor):
            continue
        meta = _meta_dtype(OpsModule({name: op}, roles, constants), args, name)
        if meta != result.dtype:  # the graph can only carry torch's meta dtype (pow(bool, True) is bool in eager)
            outcome.torch_disagrees.append(f"{name}({label}): eager gives {result.dtype}, torch's meta {meta}")
            continue
        valid[name] = op
    if valid:
        _export_and_compare(valid, roles, constants, args, label, outcome)
    return outcome


def _export_and_compare(
    ops: dict[str, Callable[..., Any]],
    roles: list[str],
    constants: dict[str, Any],
    args: tuple[torch.Tensor, ...],
    label: str,
    outcome: Outcome,
) -> None:
    try:
        program = fx2onnx.export(OpsModule(ops, roles, constants), args)
        results = program.verify(*args)
    except Exception as error:
        if len(ops) > 1:  # find the op(s) at fault
            for name, op in ops.items():
                _export_and_compare({name: op}, roles, constants, args, label, outcome)
            return
        (name,) = ops
        message = f"{name}({label}): {type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
        if "NOT_IMPLEMENTED" in str(error) and "Could not find an implementation" in str(error):
            outcome.missing_kernels.append(message)
        else:
            outcome.failures.append(message)
        return
    for result in results:
        if not result.passed:
            outcome.failures.append(f"{result.name}({label}): {result}")


def _meta_dtype(module: torch.nn.Module, args: tuple[torch.Tensor, ...], name: str) -> torch.dtype | None:
    try:
        return module(*(a.to("meta") for a in args))[name].dtype
    except Exception:
        return None


def _assert_ok(outcome: Outcome) -> None:
    for disagreement in outcome.torch_disagrees:
        event(f"skipped, eager and torch's meta dtype differ: {disagreement.split('(', 1)[0]}")
        note(f"skipped (eager and torch's meta dtype differ): {disagreement}")
    for missing in outcome.missing_kernels:
        event(f"skipped, no ONNX Runtime CPU kernel: {missing.split(': ', 1)[0]} {missing.rsplit('for ', 1)[-1]}")
        note(f"skipped (no ONNX Runtime CPU kernel): {missing}")
    assert not outcome.failures, "\n".join(outcome.failures)


@examples(regular=48, nightly=1500)
@given(a=operands(), b=operands(), seed=st.integers(0, 2**31 - 1))
def test_binary_ops_promote_like_eager(a: Operand, b: Operand, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    values = {
        "c": torch.randint(0, 2, SHAPE, generator=generator).bool(),
        "a": a.value(generator, "any"),
        "b": b.value(generator, "divisor"),
        "e": b.value(generator, "exponent"),
    }
    event(f"operands: {a.kind}/{b.kind}")
    _assert_ok(run_ops(BINARY_OPS, values, f"{a}, {b}"))


@examples(regular=18, nightly=300)
@given(x=operands(tensors_only=True), seed=st.integers(0, 2**31 - 1))
def test_unary_ops_and_reductions_promote_like_eager(x: Operand, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    _assert_ok(run_ops({k: _unary(f) for k, f in UNARY_OPS.items()}, {"a": x.value(generator, "any")}, str(x)))


def _unary(op: Callable[[torch.Tensor], Any]) -> Callable[..., Any]:
    return lambda a: op(a)


# --- regressions from transformer code and the issue ------------------------------------------------------------------
class Lambda(torch.nn.Module):
    def __init__(self, function: Callable[..., Any]) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: Any) -> Any:
        return self.function(*args)


MASK = torch.tensor([[1, 0, 1], [0, 0, 1]])
REGRESSIONS = {
    "one_minus_long_mask": (lambda m: 1.0 - m.long(), (MASK,)),
    "float_times_bool_mask": (lambda x, m: x.float() * m.bool(), (torch.randn(2, 3, dtype=torch.float64), MASK)),
    "arange_over_two": (lambda x: torch.arange(x.shape[0]) / 2, (torch.randn(5),)),
    "fp16_plus_float": (lambda x: x + 1.5, (torch.randn(2, 3).half(),)),
    "int8_plus_int16": (
        lambda a, b: a + b,
        (torch.tensor([100, -100, 7], dtype=torch.int8), torch.tensor([1000, 30000, -7], dtype=torch.int16)),
    ),
    "where_int_and_half": (lambda c, x: torch.where(c, x, 0.5), (MASK.bool(), torch.tensor([[3, 4, 5], [6, 7, 8]]))),
    "int_plus_zero_dim_float": (lambda x, s: x + s, (torch.tensor([1, 2, 3]), torch.tensor(0.25))),
    "fp16_plus_zero_dim_double": (lambda x, s: x * s, (torch.randn(3).half(), torch.tensor(1.5, dtype=torch.float64))),
    "int8_plus_zero_dim_int64": (lambda x, s: x + s, (torch.tensor([1, 2], dtype=torch.int8), torch.tensor(300))),
    "sum_bool": (lambda m: m.bool().sum(-1), (MASK,)),
    "cumsum_int8": (lambda x: x.cumsum(0), (torch.tensor([100, 100, 100], dtype=torch.int8),)),
    "mean_int_dtype": (lambda x: x.mean(dtype=torch.float32), (torch.tensor([1, 2, 4]),)),
    "sum_fp16_to_float": (lambda x: x.sum(dtype=torch.float32), (torch.full((4,), 30000.0, dtype=torch.float16),)),
    "sum_int8_to_int64": (lambda x: x.sum(0, dtype=torch.int64), (torch.full((4, 2), 100, dtype=torch.int8),)),
    "int_mean_dim_float_mask": (lambda x, m: (x * m).sum(1) / m.sum(1), (torch.randn(2, 3), MASK)),
    "pow_int_float_exponent": (lambda x: x**0.5, (torch.tensor([1, 4, 9]),)),
    "bool_arithmetic": (lambda a, b: (a + b, a * b, a & b), (MASK.bool(), MASK.bool().logical_not())),
    "comparison_int_float": (lambda a, b: a < b, (torch.tensor([1, 2, 3]), torch.tensor([1.5, 1.5, 3.5]))),
    "to_and_type_as": (lambda a, b: (a.to(torch.float16), a.type_as(b)), (torch.tensor([1, 2]), torch.ones(2))),
    "full_with_dtype": (lambda x: torch.full((2,), 7, dtype=torch.float16) + x, (torch.ones(2, dtype=torch.float16),)),
    "zeros_like_dtype": (lambda x: torch.zeros_like(x, dtype=torch.int32) + 1, (torch.randn(2),)),
    "arange_float_step": (lambda x: torch.arange(0, x.shape[0], 0.5) + x.sum(), (torch.ones(3, dtype=torch.int32),)),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_promotion_regressions(name: str) -> None:
    function, args = REGRESSIONS[name]
    check(Lambda(function), args)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_integers_meet_a_reduced_float_in_its_dtype(dtype: torch.dtype) -> None:
    """int32 / a 0-d float16 tensor: eager converts the integers to float16 first (70000 is inf there, 2049 is
    2048), then computes in float32; a decomposition's conversion straight to float32 kept 70000 (-31104 where
    eager gives -inf; fuzz seed 21000595)."""
    x = torch.tensor([1, 0, 2049, 70000, -70000, 2147483646, 65504], dtype=torch.int32)
    s = torch.tensor(-2.25, dtype=dtype)
    check(Lambda(lambda x, s: (x / s, torch.div(x, s, rounding_mode="floor"), x // s)), (x, s))


def test_int_and_float_numbers_promote_apart() -> None:
    """`2 == 2.0` in Python, but `bool // 2` computes in int64 and `bool // 2.0` in float32 (the rules are cached)."""
    mask = MASK.bool()
    check(Lambda(lambda m: m // 2), (mask,))
    check(Lambda(lambda m: m // 2.0), (mask,))


def test_symbolic_sizes_promote() -> None:
    """A size (SymInt) or a size-derived float (SymFloat) is a weakly typed scalar in eager's promotion."""
    batch = torch.export.Dim("batch")

    class Sizes(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x * x.shape[0], y / y.shape[0], y * (y.shape[0] / 3)

    x, y = torch.randn(4, 3).half(), torch.arange(12, dtype=torch.int8).reshape(4, 3)
    check(
        Sizes(),
        (x, y),
        dynamic_shapes=({0: batch}, {0: batch}),
        run_with=[((x, y), {}), ((torch.randn(6, 3).half(), torch.ones(6, 3, dtype=torch.int8)), {})],
    )


# --- every node, not only the outputs -----------------------------------------------------------------------------
class Mixed(torch.nn.Module):
    """Mixed-dtype arithmetic of the kinds transformer code does, with intermediates of many dtypes."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        inverted = 1.0 - mask  # int64 -> float32
        scores = x * mask.bool() + inverted * -1e4
        counts = mask.sum(-1, keepdim=True)  # int64
        mean = scores.sum(-1, keepdim=True) / counts
        positions = torch.arange(x.shape[-1]) / 2 + ids.to(torch.int8)  # int8 + float -> float32
        half = h + 1.5  # stays float16
        gate = torch.where(mask.bool(), ids, 0.5)  # int64 vs Python float -> float32
        small = ids.to(torch.int8) + ids.to(torch.int16)
        return (scores - mean + positions + gate) * half.mean() + small.cumsum(-1) + (ids > 0.5)


def test_every_node_has_eagers_dtype_and_value() -> None:
    """Each ONNX value named after an FX node has that node's eager dtype and value (not only the outputs)."""
    mask, ids = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]]), torch.tensor([[3, 0, 1, 2]])
    args = (torch.randn(2, 4), mask, ids, torch.randn(4).half())
    program = fx2onnx.export(Mixed(), args, optimize=False, target="onnx")  # keep every value and name
    graph_module = program.exported_program.graph_module
    assert "promote_types" in program.report.fx_passes
    assert any(n.target is CAST for n in graph_module.graph.nodes)

    eager: dict[str, torch.Tensor] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> Any:
            result = super().run_node(node)
            if isinstance(result, torch.Tensor):
                eager[node.name] = result
            return result

    Recorder(graph_module).run(*args)
    proto = ir.to_proto(program.model)
    values = {value.name: value for node in program.model.graph.all_nodes() for value in node.outputs}
    named = [name for name in eager if name in values and name not in {o.name for o in proto.graph.output}]
    assert len(named) > 20, f"too few FX nodes found in the ONNX graph: {named}"
    for name in named:
        proto.graph.output.append(onnx.helper.make_tensor_value_info(name, values[name].dtype.value, None))
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    produced = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    fx_nodes = {n.name: n for n in graph_module.graph.nodes}
    mismatches = []
    for name in named:
        expected = eager[name]
        assert fx_nodes[name].meta["val"].dtype == expected.dtype, name
        result = compare(name, expected, torch.from_numpy(produced[name]), rtol=1e-3, atol=1e-3)
        if not result.passed:
            mismatches.append(f"{name} ({fx_nodes[name].target}): {result}")
    assert not mismatches, "\n".join(mismatches)


class ScaledSum(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(2.0, dtype=torch.float64))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # f16 + f16 needs nothing; f16 * 0-d f64 buffer and + 0-d int64 constant stay float16
        return (x + y) * self.scale + torch.tensor(3, dtype=torch.int64)


@pytest.mark.parametrize("optimize", [True, False])
def test_no_redundant_casts(optimize: bool) -> None:
    """No Cast to the dtype a value has, none after a node that already computes eager's dtype, and a cast of
    a constant folded into the constant (by the pass itself: also without the ONNX optimizer)."""
    args = (torch.randn(3).half(), torch.randn(3).half())
    # target="onnx": no legalization for ONNX Runtime's CPU kernels, whose own Casts are not promotion's
    program = check(ScaledSum(), args, optimize=optimize, target="onnx")
    casts = [onnx.printer.to_text(n) for n in program.model_proto.graph.node if n.op_type == "Cast"]
    assert not casts, casts
    folded = [n for n in program.exported_program.graph_module.graph.nodes if n.op == "get_attr"]
    assert [n.meta["val"].dtype for n in folded] == [torch.float16, torch.float16]
    assert not [n for n in program.exported_program.graph_module.graph.nodes if n.target is CAST]


@pytest.mark.parametrize(
    ("function", "expected_cast"),
    [
        (lambda a, b: a + b, {("args_0", torch.int16)}),  # int8 + int16: cast the int8 input only
        (lambda a, b: a.float() / b, {("args_1", torch.float32)}),
        (lambda a, b: a < b.double(), {("args_0", torch.float64)}),
    ],
)
def test_pass_inserts_only_the_casts_eager_implies(function: Callable[..., Any], expected_cast: set[Any]) -> None:
    args = (torch.tensor([1, 2], dtype=torch.int8), torch.tensor([3, 4], dtype=torch.int16))
    program = check(Lambda(function), args)
    graph = program.exported_program.graph_module.graph
    inserted = {(n.args[0].name, n.args[1]) for n in graph.nodes if n.target is CAST}
    assert inserted == expected_cast


def test_the_passes_code_is_generated_when_read() -> None:
    """The passes leave the program's Python code to be generated when it is read, printed or run (the export reads
    only the graph): then it is the code of the graph as the passes left it."""
    from fx2onnx._capture import _code_is_stale

    args = (torch.tensor([1, -2], dtype=torch.int8), torch.tensor([300, 4], dtype=torch.int16))
    program = fx2onnx.export(Lambda(lambda a, b: a + b), args)
    graph_module = program.exported_program.graph_module
    assert any(node.target is CAST for node in graph_module.graph.nodes)
    assert _code_is_stale(graph_module)  # no code generated during the export
    assert "convert_element_type" in str(graph_module)
    assert not _code_is_stale(graph_module)
    assert "convert_element_type" in graph_module.code
    (result,) = graph_module(*args)
    assert result.dtype == torch.int16 and result.tolist() == [301, 2]


def test_a_stale_graph_modules_forward_runs_its_current_graph() -> None:
    from fx2onnx._capture import _code_is_stale, recompile_when_read

    class Add(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

    graph_module = torch.fx.symbolic_trace(Add())
    (add,) = [node for node in graph_module.graph.nodes if node.op == "call_function"]
    add.target = torch.mul
    recompile_when_read(graph_module)
    assert _code_is_stale(graph_module)
    assert graph_module(torch.tensor(3), torch.tensor(4)).item() == 12
    assert not _code_is_stale(graph_module) and "mul" in graph_module.code


def test_traced_conversions_are_kept_on_disk_per_torch_version(tmp_path: Any, monkeypatch: Any) -> None:
    """What a trace of torch's decomposition found is read back from the op's cache file in a later process (here:
    the in-memory cache emptied); another torch version reads another file, and a corrupt file is traced afresh and
    written again."""
    import torch.utils._pytree as pytree

    from fx2onnx._passes import promotion_rules

    monkeypatch.setenv("FX2ONNX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(promotion_rules, "_DISK", promotion_rules._DiskConversions())
    monkeypatch.setattr(promotion_rules, "_CONVERSIONS_CACHE", {})
    op, described = torch.ops.aten.sum.default, (("tensor", torch.bool, (3,)),)
    spec = pytree.tree_flatten(((torch.ones(3),), {}))[1]

    def conversions() -> dict[int, torch.dtype]:
        promotion_rules._CONVERSIONS_CACHE.clear()  # as a new process
        found = promotion_rules.traced_conversions(op, described, spec)
        promotion_rules.save_conversions()
        return found

    assert conversions() == {0: torch.int64}  # sum(bool) counts in int64
    path = promotion_rules.conversions_path(op)
    assert path.exists() and str(torch.__version__) in path.parent.name and path.name == "aten.sum.default.json"
    # Another op's conversions: its own file, beside the first
    prod = torch.ops.aten.prod.default
    assert promotion_rules.traced_conversions(prod, described, spec) == {0: torch.int64}
    promotion_rules.save_conversions()
    assert sorted(p.name for p in path.parent.iterdir()) == ["aten.prod.default.json", "aten.sum.default.json"]
    # A stand-in answer in the file is what a later process gets: the file is read, not traced again.
    path.write_text(path.read_text().replace('"int64"', '"int32"'))
    promotion_rules._DISK.entries.clear()
    assert conversions() == {0: torch.int32}
    # Another torch: another file, traced afresh.
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert promotion_rules.conversions_path(op) != path
    assert conversions() == {0: torch.int64}
    monkeypatch.undo()
    monkeypatch.setenv("FX2ONNX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(promotion_rules, "_DISK", promotion_rules._DiskConversions())
    monkeypatch.setattr(promotion_rules, "_CONVERSIONS_CACHE", {})
    # A corrupt file (a crash mid-write elsewhere, a disk error): ignored, traced, and replaced by a valid one.
    path.unlink()  # the stand-in answer
    promotion_rules._DISK.entries.clear()
    assert conversions() == {0: torch.int64}
    valid = path.read_text()
    for corrupt in ("{not json", "[]", valid.replace('"int64"', '"Tensor"'), valid.replace("[\n0,", '[\n"x",')):
        path.write_text(corrupt)
        promotion_rules._DISK.entries.clear()
        assert conversions() == {0: torch.int64}
    promotion_rules._DISK.entries.clear()
    assert conversions() == {0: torch.int64}
    assert '"int64"' in path.read_text()
