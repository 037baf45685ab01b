"""Calling an exported program: inputs matched by name and by key (never by the caller's order), numpy arrays and
Python numbers accepted, unknown/missing/repeated inputs refused; Nones among the outputs stay None; exports
from several threads at once all succeed and leave the user's model intact."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import fx2onnx

from conftest import assert_exports_and_matches as check


def _assert_outputs_match(actual: list[Any], expected: list[Any]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        if e is None:
            assert a is None
        else:
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


# --- keywords -----------------------------------------------------------------------------------------------------
class Difference(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, scale: float = 2.0) -> torch.Tensor:
        return x - y * scale


X = torch.tensor([1.0, -2.5, 3.25, torch.finfo(torch.float32).max / 4])
Y = torch.tensor([0.5, 4.0, -1.0, torch.finfo(torch.float32).max / 8])


@pytest.fixture(scope="module")
def keyword_program() -> fx2onnx.ONNXProgram:
    return check(Difference(), (X,), {"y": Y})


def test_an_input_exported_by_keyword_can_be_given_by_position_or_by_name(
    keyword_program: fx2onnx.ONNXProgram,
) -> None:
    expected = [Difference()(X, y=Y)]
    _assert_outputs_match(keyword_program(X, y=Y), expected)
    _assert_outputs_match(keyword_program(X, Y), expected)
    _assert_outputs_match(keyword_program(x=X, y=Y), expected)
    _assert_outputs_match(keyword_program(X, {"y": Y}), expected)  # torch.onnx's convention: a last dict of keywords


@pytest.mark.parametrize(
    ("args", "kwargs", "problem"),
    [
        ((X,), {"z": Y}, "unexpected keyword argument 'z'"),  # ran silently with z as y
        ((X,), {}, "missing input"),
        ((X, Y), {"y": Y}, "multiple values for argument 'y'"),
        ((X,), {"y": Y, "scale": 3.0}, "unexpected input"),  # not an input of the exported graph
        ((X, Y, 3.0, 4.0), {}, "too many positional arguments"),
    ],
    ids=["unknown", "missing", "repeated", "not-exported", "too-many"],
)
def test_unknown_missing_and_repeated_inputs_are_refused_naming_the_expected_ones(
    keyword_program: fx2onnx.ONNXProgram, args: tuple, kwargs: dict, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        keyword_program(*args, **kwargs)
    assert "exported with inputs (x, *, y)" in str(caught.value)


# --- numpy arrays, Python numbers, constants -----------------------------------------------------------------------
class Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor, offset: int) -> torch.Tensor:
        return x * scale + offset


def test_numpy_arrays_and_python_numbers_are_accepted_as_inputs() -> None:
    x = torch.tensor([[1, -128, 127], [0, 5, -7]], dtype=torch.int32)
    scale = torch.tensor(3, dtype=torch.int32)
    model = Scaled()
    program = check(model, (x, scale, 4))
    expected = [model(x, scale, 4)]
    _assert_outputs_match(program(x.numpy(), scale.numpy(), 4), expected)  # "takes 1 tensor inputs, got 0" before
    _assert_outputs_match(program(x.numpy(), np.int32(3), 4), expected)
    _assert_outputs_match(program(x, 3, 4), expected)  # a Python number for a 0-d tensor input


def test_wrong_dtypes_other_objects_and_changed_constants_are_refused_with_what_was_expected() -> None:
    x = torch.tensor([[1.5, -2.0]], dtype=torch.float32)
    program = fx2onnx.export(Scaled(), (x, torch.tensor(2.0), 1))
    with pytest.raises(
        TypeError, match=r"input x is a numpy float64 array of shape \[1, 2\]: the model takes x: float32"
    ):
        program(x.double().numpy(), torch.tensor(2.0), 1)
    with pytest.raises(TypeError, match="input x is a list of 2 items"):
        program([1.5, -2.0], torch.tensor(2.0), 1)
    with pytest.raises(ValueError, match=r"input offset was exported as the constant 1 .*got 5"):
        program(x, torch.tensor(2.0), 5)


# --- nested inputs by key -----------------------------------------------------------------------------------------
class Nested(torch.nn.Module):
    def forward(self, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["a"] - 2 * inputs["b"] + inputs["c"]["d"] * inputs["c"]["e"][1]


def _nested(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, e: torch.Tensor) -> dict[str, Any]:
    return {"a": a, "b": b, "c": {"d": d, "e": [e, e * 3]}}


def test_nested_dict_inputs_are_matched_by_key_not_by_the_callers_order() -> None:
    a, b, d, e = (torch.randn(2, 3) for _ in range(4))
    model = Nested()
    program = check(model, (_nested(a, b, d, e),))
    a2, b2, d2, e2 = (torch.randn(2, 3) for _ in range(4))
    shuffled = {"c": {"e": [e2, e2 * 3], "d": d2}, "b": b2, "a": a2}  # silently wrong before: matched in this order
    _assert_outputs_match(program(shuffled), [model(shuffled)])
    assert all(r.passed for r in program.verify(shuffled))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda n: {k: v for k, v in n.items() if k != "b"}, r"missing \['b'\]"),
        (lambda n: {**n, "z": n["a"]}, r"unexpected \['z'\]"),
        (lambda n: {**n, "c": {"d": n["c"]["d"]}}, r"input inputs\['c'\] has keys \['d'\].*missing \['e'\]"),
        (lambda n: {**n, "c": n["a"]}, r"input inputs\['c'\] must be a dict"),
        (lambda n: {**n, "c": {**n["c"], "e": n["c"]["e"][:1]}}, r"must be a list of 2 items"),
    ],
    ids=["missing-key", "extra-key", "nested-missing", "tensor-for-dict", "short-list"],
)
def test_a_nested_input_of_another_structure_is_refused(change: Any, problem: str) -> None:
    a, b, d, e = (torch.randn(2, 3) for _ in range(4))
    program = fx2onnx.export(Nested(), (_nested(a, b, d, e),))
    with pytest.raises(ValueError, match=problem):
        program(change(_nested(a, b, d, e)))


class CountingCache:
    """A library container that counts its tokens in a Python int kept in its pytree context, not a tensor, as
    transformers' DynamicSlidingWindowLayer does (cumulative_length): the trace builds the count into the graph."""

    def __init__(self, keys: torch.Tensor, seen: int) -> None:
        self.keys, self.seen = keys, seen


torch.utils._pytree.register_pytree_node(
    CountingCache,
    lambda cache: ([cache.keys], {"seen": cache.seen}),
    lambda leaves, context: CountingCache(leaves[0], context["seen"]),
    flatten_with_keys_fn=lambda cache: ([(torch.utils._pytree.GetAttrKey("keys"), cache.keys)], {"seen": cache.seen}),
)


class AtPosition(torch.nn.Module):
    def forward(self, x: torch.Tensor, cache: CountingCache) -> torch.Tensor:
        return x + cache.keys.sum(1, keepdim=True) + cache.seen  # the position, as rotary embeddings read it


def test_a_container_whose_python_values_differ_from_the_exported_ones_is_refused() -> None:
    """Mistral's decoding step exported after 7 tokens and run with a cache of 20 tokens' history (the same 7 kept
    keys: same shapes) computed the positions of 7, silently: logits off by 0.0056. Now refused, naming the value."""
    keys = torch.randn(2, 7)
    program = check(AtPosition(), (torch.randn(2, 1), CountingCache(keys, 7)))
    with pytest.raises(ValueError, match=r"Python values differ from the exported one's \(seen: 7 exported, 20 given"):
        program(torch.randn(2, 1), CountingCache(keys, 20))


# --- None among the outputs ---------------------------------------------------------------------------------------
class ReturnsNone(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[Any, ...]:
        return x + 1, None, x * 2, {"k": None, "v": torch.view_as_complex(torch.stack([x, -x], -1))}


def test_a_none_output_stays_none_and_has_no_onnx_output(tmp_path: Any) -> None:
    x = torch.tensor([1.0, -0.0, float("inf"), -3.5])
    model = ReturnsNone()
    program = check(model, (x,))  # verify crashed ("ONNX gives 5 outputs, eager 3")
    expected = [x + 1, None, x * 2, None, torch.view_as_complex(torch.stack([x, -x], -1))]
    _assert_outputs_match(program(x), expected)  # a float32 NaN stood for each None
    saved = tmp_path / "model.onnx"
    program.save(saved)
    outputs = onnx.load(saved).graph.output
    assert [o.name for o in outputs] == ["output_0", "output_2", "output_3_v"]


def test_output_names_go_to_the_outputs_that_are_not_none() -> None:
    x = torch.tensor([2.0, -1.0])
    program = fx2onnx.export(ReturnsNone(), (x,), output_names=["plus", "twice", "complex"])
    assert [o.name for o in program.model.graph.outputs] == ["plus", "twice", "complex"]
    assert all(r.passed for r in program.verify(x))


# --- threads --------------------------------------------------------------------------------------------------------
def test_concurrent_exports_succeed_and_leave_the_users_models_intact() -> None:
    """torch.export's tracing state is process-wide: two exports at once failed inside it, and one of the same
    model could leave it holding fake tensors."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).eval()
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten()).eval()
    jobs = [
        (mlp, torch.randn(2, 16)),
        (mlp, torch.randn(3, 16)),
        (conv, torch.randn(1, 3, 8, 8)),
        (mlp, torch.randn(1, 16)),
    ]
    states = {id(m): {k: v.clone() for k, v in m.state_dict().items()} for m in (mlp, conv)}
    start = threading.Barrier(len(jobs))
    results: dict[int, Any] = {}

    def export(index: int, model: torch.nn.Module, x: torch.Tensor) -> None:
        start.wait()
        try:
            program = fx2onnx.export(model, (x,))
            results[index] = [r.passed for r in program.verify(x)]
        except Exception as error:  # reported below, with the others
            results[index] = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=export, args=(i, m, x)) for i, (m, x) in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: [True] for i in range(len(jobs))}
    for model in (mlp, conv):
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            assert type(tensor) is torch.nn.Parameter or type(tensor) is torch.Tensor, name
            assert not isinstance(tensor.data, FakeTensor), name
            torch.testing.assert_close(tensor.data, states[id(model)][name], rtol=0, atol=0)
    check(mlp, (torch.randn(5, 16),))  # and the models still export and run in eager


def test_intermediate_values_are_compared_with_nested_inputs_given_in_another_order() -> None:
    a, b, d, e = (torch.randn(2, 3) for _ in range(4))
    program = fx2onnx.export(Nested(), (_nested(a, b, d, e),))
    shuffled = {"c": {"e": [e, e * 3], "d": d}, "b": b, "a": a}
    verification = program.verify(shuffled, intermediates=True)
    assert verification.first_mismatch is None
    assert all(r.passed for r in verification)


# --- torch.onnx.ONNXProgram's methods, as its users call them after the export --------------------------------------
def _session_outputs(path: str, feed: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The saved file run in ONNX Runtime with default session options, as a user loads it."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    outputs = session.run(None, {name: value.detach().numpy() for name, value in feed.items()})
    return [torch.from_numpy(output) for output in outputs]


def _randomized(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Other weights for `model`'s architecture (batch norm statistics included), as a new state_dict."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.rand(t.shape, generator=generator) + 0.5 if t.is_floating_point() else t.clone()
        for name, t in model.state_dict().items()
    }


class LargeWeights(torch.nn.Module):
    """Weights the export uses as they are (a convolution's, a Linear on 2-D inputs: Gemm reads it untransposed),
    too large for the optimizer to compare with others."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 3, bias=False)
        self.fc = torch.nn.Linear(32, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean((2, 3)))


class FoldedWeights(torch.nn.Module):
    """Weights the export folds: batch norm's statistics into a constant, small biases compared by the optimizer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.bn(self.conv(x)).mean((2, 3)))


class WeightReadTwice(torch.nn.Module):
    """A weight used as it is and folded into a constant (its sum): swapping its initializer alone would leave the
    sum of the old weight."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(48, 48))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w + self.w.sum()


def test_apply_weights_swaps_the_weights_the_export_used_as_they_are_in_place(tmp_path: Any) -> None:
    torch.manual_seed(0)
    model, x = LargeWeights().eval(), torch.randn(2, 16, 6, 6)
    program = fx2onnx.export(model, (x,))
    assert program.swappable_weights == {"conv.weight", "fc.weight"}
    program.export_again = None  # the swap needs no second export
    weights = _randomized(model, 1)
    program.apply_weights(weights)
    other = LargeWeights().eval()
    other.load_state_dict(weights)
    expected = other(x)
    torch.testing.assert_close(program(x)[0], expected, rtol=1e-4, atol=1e-4)
    assert all(v.passed for v in program.verify(x))  # eager runs with the applied weights
    path = str(tmp_path / "model.onnx")
    program.save(path)
    torch.testing.assert_close(_session_outputs(path, {"x": x})[0], expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(model.conv.weight, LargeWeights().conv.weight) is False  # the module keeps its own weights
    torch.testing.assert_close(model(x), fx2onnx.export(model, (x,))(x)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model_class", [FoldedWeights, WeightReadTwice])
def test_apply_weights_exports_again_where_the_export_read_the_weights(model_class: type, tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = model_class().eval()
    x = torch.randn(2, 3, 8, 8) if model_class is FoldedWeights else torch.randn(3, 48)
    program = fx2onnx.export(model, (x,))
    weights = _randomized(model, 2)
    program.apply_weights(weights)
    other = model_class().eval()
    other.load_state_dict(weights)
    expected = other(x)
    torch.testing.assert_close(program(x)[0], expected, rtol=1e-4, atol=1e-3)
    assert all(v.passed for v in program.verify(x))
    path = str(tmp_path / "model.onnx")
    program.save(path)
    torch.testing.assert_close(_session_outputs(path, {"x": x})[0], expected, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(fx2onnx.export(model, (x,))(x)[0], model(x), rtol=1e-4, atol=1e-3)  # module unchanged


def test_apply_weights_of_the_models_own_parameters_changes_nothing_and_tied_weights_stay_tied() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(40, 48)
            self.head = torch.nn.Linear(48, 40, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.embed(ids))

    torch.manual_seed(0)
    model, ids = Tied().eval(), torch.randint(0, 40, (2, 5))
    program = fx2onnx.export(model, (ids,))
    program.apply_weights(dict(model.named_parameters()))  # a user's call, after torch's documentation
    torch.testing.assert_close(program(ids)[0], model(ids), rtol=1e-4, atol=1e-4)
    table = torch.randn(40, 48)
    program.apply_weights({"embed.weight": table})
    torch.testing.assert_close(program(ids)[0], table[ids] @ table.T, rtol=1e-4, atol=1e-4)
    assert all(v.passed for v in program.verify(ids))


def test_apply_weights_refuses_another_shape_and_skips_names_the_graph_does_not_read() -> None:
    model, x = FoldedWeights().eval(), torch.randn(1, 3, 8, 8)
    program = fx2onnx.export(model, (x,))
    with pytest.raises(ValueError, match=r"fc\.weight"):
        program.apply_weights({"fc.weight": torch.zeros(5, 5)})
    with pytest.raises(ValueError, match=r"fc\.weight"):
        program.apply_weights({"fc.weight": torch.zeros(5, 4, dtype=torch.float64)})
    with pytest.warns(UserWarning, match=r"'missing\.weight' not found"):
        program.apply_weights({"missing.weight": torch.zeros(3)})
    torch.testing.assert_close(program(x)[0], model(x), rtol=1e-4, atol=1e-5)


def test_compute_values_gives_intermediate_values_by_their_names() -> None:
    class Steps(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            hidden = torch.relu(x * 3.0 - 1.0)
            return hidden.sum(-1), hidden.amax(-1)

    x = torch.randn(4, 6)
    program = fx2onnx.export(Steps(), (x,))
    relu = next(node for node in program.model.graph if node.op_type == "Relu")
    names = [relu.outputs[0].name, program.model.graph.outputs[1].name, "x"]
    hidden, amax, given = program.compute_values(names, (x,))
    torch.testing.assert_close(hidden, torch.relu(x * 3.0 - 1.0))
    torch.testing.assert_close(amax, torch.relu(x * 3.0 - 1.0).amax(-1))
    assert torch.equal(given, x)
    assert len(program.model.graph.outputs) == 2  # the model's outputs are back
    with pytest.raises(ValueError, match="'nowhere'"):
        program.compute_values(["nowhere"], (x,))


def test_call_reference_runs_onnx_reference_implementation() -> None:
    torch.manual_seed(0)
    model, x = FoldedWeights().eval(), torch.randn(2, 3, 8, 8)
    program = fx2onnx.export(model, (x,))
    torch.testing.assert_close(program.call_reference(x)[0], model(x), rtol=1e-4, atol=1e-5)


def test_initialize_inference_session_with_the_users_initializer() -> None:
    import onnxruntime

    made: list[Any] = []

    def initializer(model: str | bytes) -> onnxruntime.InferenceSession:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        made.append(onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"]))
        return made[-1]

    torch.manual_seed(0)
    model, x = FoldedWeights().eval(), torch.randn(2, 3, 8, 8)
    program = fx2onnx.export(model, (x,))
    program.initialize_inference_session(initializer)
    torch.testing.assert_close(program(x)[0], model(x), rtol=1e-4, atol=1e-5)
    assert len(made) == 1 and program.session() is made[0]
    program.release()
    torch.testing.assert_close(program(x)[0], model(x), rtol=1e-4, atol=1e-5)
    assert program.session() is not made[0]


def test_rename_axes_renames_the_dims_everywhere(tmp_path: Any) -> None:
    model, x = FoldedWeights().eval(), torch.randn(2, 3, 8, 8)
    program = fx2onnx.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("b")},))
    batch = program.model.graph.inputs[0].shape[0]
    program.rename_axes({batch: "images"})
    assert str(program.model.graph.inputs[0].shape[0]) == "images"
    assert str(program.model.graph.outputs[0].shape[0]) == "images"
    path = str(tmp_path / "model.onnx")
    program.save(path)
    assert onnx.load(path).graph.input[0].type.tensor_type.shape.dim[0].dim_param == "images"
    x5 = torch.randn(5, 3, 8, 8)
    torch.testing.assert_close(_session_outputs(path, {"x": x5})[0], model(x5), rtol=1e-4, atol=1e-5)


def test_repr_shows_the_graph_and_the_exported_program() -> None:
    program = fx2onnx.export(FoldedWeights().eval(), (torch.randn(1, 3, 8, 8),))
    text = repr(program)
    assert text.startswith("ONNXProgram(") and "Conv(" in text and "ExportedProgram" in text
    assert str(program) == text


def test_apply_weights_to_a_program_exported_from_an_exported_program() -> None:
    """No module to export again: the weights used as they are are swapped, the others refused with the way out."""
    torch.manual_seed(0)
    model, x = LargeWeights().eval(), torch.randn(2, 16, 6, 6)
    program = fx2onnx.export(torch.export.export(model, (x,)), (x,))
    weights = _randomized(model, 3)
    program.apply_weights(weights)
    model.load_state_dict(weights)
    torch.testing.assert_close(program(x)[0], model(x), rtol=1e-4, atol=1e-4)
    assert all(v.passed for v in program.verify(x))
    folded, x = FoldedWeights().eval(), torch.randn(2, 3, 8, 8)
    program = fx2onnx.export(torch.export.export(folded, (x,)), (x,))
    with pytest.raises(ValueError, match=r"read the values of .*bn\.running_mean.*load_state_dict"):
        program.apply_weights(_randomized(folded, 3))
    torch.testing.assert_close(program(x)[0], folded(x), rtol=1e-4, atol=1e-5)  # left as it was
