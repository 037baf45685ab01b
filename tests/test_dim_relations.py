"""Relations `dynamic_shapes` declares between input dims (a derived ``Dim("past") + 1``, one Dim on several inputs)
are known to the size-oblivious trace from its start. torch.export checks them only after tracing; a hinted trace
learns them on the way from guards the example decides, a size-oblivious one never did: a size computed from two
related dims stayed an expression (``Max(0, s0 - Min(s0, s1))`` for ``p + 1 - p``), and a Python test of it
(transformers' SDPA ``is_causal = q_length > 1 and ...``) a SymBool that the op refused."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import fx2onnx
from fx2onnx.errors import CaptureError

from conftest import assert_exports_and_matches as check


class AttendFromMaskPositions(torch.nn.Module):
    """OPT's decoding step in miniature: the new tokens' positions are the mask's running count after the past
    (``cumsum(mask)[:, past:]``: one per new token when ``mask = past + 1``), and SDPA is causal for more than one
    query, as transformers decides it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)

    def forward(self, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = mask.cumsum(-1)[:, keys.shape[2] :]
        query = self.embed(positions).unsqueeze(1)
        is_causal = query.shape[2] > 1 and True  # a SymBool where the query length is not known to be 1
        return torch.nn.functional.scaled_dot_product_attention(query, keys, keys, is_causal=is_causal)


def step_inputs(batch: int, past: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(10 * batch + past)
    return torch.randn(batch, 1, past, 8, generator=generator), torch.ones(batch, past + 1, dtype=torch.long)


def test_derived_dim_is_known_to_the_trace() -> None:
    batch, past = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("past", min=1, max=32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a declared relation is no constraint of the model's code: no warning
        program = check(
            AttendFromMaskPositions().eval(),
            step_inputs(2, 5),
            dynamic_shapes=({0: batch, 2: past}, {0: batch, 1: past + 1}),
            run_with=[(step_inputs(b, p), {}) for b, p in ((3, 9), (1, 1), (2, 5))],
        )
    assert [str(d) for d in program.model.graph.inputs[1].shape] == ["batch", "past + 1"]
    assert [str(d) for d in program.model.graph.outputs[0].shape] == ["batch", "1", "1", "8"]


class AddsRows(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y  # the size-oblivious broadcast asserts the rows' equality


def test_one_dim_on_several_inputs_is_one_symbol() -> None:
    """`n` on both inputs: the model's code asserting their equality is no assumption of its own (it was: a
    warning, a check node named for the model's line), the ONNX model checks the inputs' relation as exported."""
    n = torch.export.Dim("n", min=1, max=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        program = check(
            AddsRows(),
            (torch.randn(3, 4), torch.randn(3, 4)),
            dynamic_shapes=({0: n}, {0: n}),
            run_with=[((torch.randn(b, 4), torch.randn(b, 4)), {}) for b in (1, 7)],
        )
    assert not [node for node in program.model.graph if "assumed by the model's code" in (node.name or "")]
    assert [str(d) for d in program.model.graph.inputs[1].shape] == ["n", "4"]
    assert any("input 'y' dim 0 == n (as exported)" in note for note in program.report.dynamic_dims)


def test_an_independent_dim_gets_torchs_suggested_relation_with_a_warning() -> None:
    """The mask length asked as a dim of its own: torch.export (hinted) refuses it and suggests ``mask = past + 1``;
    the size-oblivious trace failed before it got there (the SymBool). As for every suggested fix: applied, and
    said once, in the fix's own words."""
    batch, past = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("past", min=1, max=32)
    mask = torch.export.Dim("mask", min=2, max=33)
    with pytest.warns(UserWarning, match=r"suggested fix applied\): mask = past \+ 1") as caught:
        program = check(
            AttendFromMaskPositions().eval(),
            step_inputs(2, 5),
            dynamic_shapes=({0: batch, 2: past}, {0: batch, 1: mask}),
            run_with=[(step_inputs(b, p), {}) for b, p in ((3, 9), (1, 1))],
        )
    assert not [w for w in caught if "derived from other dims" in str(w.message)]
    assert [str(d) for d in program.model.graph.inputs[1].shape] == ["batch", "past + 1"]


class BatchByLen(torch.nn.Module):
    """RT-DETR's ``batch_size = len(source_flatten)``: a Python int of the batch, which torch.export specializes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = len(x)
        return x.reshape(batch, -1) * 2.0


def test_a_dim_the_models_code_specializes_is_warned_with_the_line() -> None:
    """The warning said ``batch = 2`` and nothing of where: RT-DETR's exported batch stayed 2 with no line to fix.
    It names the model's line, and the exported model computes eager's result at that batch."""
    with pytest.warns(
        UserWarning,
        match=r"batch = 2 \(specialized by the model.s code at test_dim_relations.py:\d+ in forward: batch = len\(x\)",
    ):
        program = check(BatchByLen(), (torch.randn(2, 3, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["2", "3", "4"]


def test_an_error_no_relation_fixes_stays_the_error() -> None:
    """A failure of the size-oblivious trace that the hinted one does not turn into suggested fixes is the export's
    error, as before."""

    class PassesASymBool(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            flag = x.shape[1] > 100 and True  # a SymBool for any dynamic size: no fix of dynamic_shapes helps
            return torch.nn.functional.scaled_dot_product_attention(x, x, x, is_causal=flag)

    with pytest.raises(CaptureError, match="must be bool, not SymBool"):
        fx2onnx.export(PassesASymBool(), (torch.randn(1, 6, 4),), dynamic_shapes=({1: torch.export.Dim("n")},))


transformers = pytest.importorskip("transformers")


def tiny_opt() -> torch.nn.Module:
    config = transformers.OPTConfig(
        vocab_size=300,
        hidden_size=32,
        ffn_dim=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        word_embed_proj_dim=32,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return transformers.OPTForCausalLM(config).eval()


def opt_step(model: torch.nn.Module, batch: int, past: int) -> dict:
    """One decoding step as generation runs it: a new token after the cache of the model's own prefill of `past`
    tokens, and a mask over past + 1."""
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    register_cache_pytrees_for_model(model)
    generator = torch.Generator().manual_seed(100 * batch + past)
    with torch.no_grad():
        prefill = model(input_ids=torch.randint(3, 300, (batch, past), generator=generator), use_cache=True)
    name = "cache" if hasattr(prefill, "cache") else "past_key_values"
    return {
        "input_ids": torch.randint(3, 300, (batch, 1), generator=generator),
        "attention_mask": torch.ones(batch, past + 1, dtype=torch.long),
        name: getattr(prefill, name),
        "use_cache": True,
    }


def test_opt_decoding_step_with_mask_of_past_plus_one() -> None:
    """OPT's positions come from the mask after the past: with the mask declared `past + 1` (an independent dim
    is refused by torch.export, which suggests this relation) the step exports, at any batch and past; every
    output, the returned cache included, matches eager."""
    model = tiny_opt()
    model.config.use_cache = True
    example = opt_step(model, 2, 5)
    name = next(key for key in example if key not in ("input_ids", "attention_mask", "use_cache"))
    batch, past = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("past", min=1, max=64)
    leaves = len(torch.utils._pytree.tree_leaves(example[name]))
    program = check(
        model,
        (),
        copy.copy(example),
        dynamic_shapes={
            "input_ids": {0: batch},
            "attention_mask": {0: batch, 1: past + 1},
            name: [{0: batch, 2: past}] * leaves,
            "use_cache": None,
        },
        run_with=[((), opt_step(model, b, p)) for b, p in ((3, 9), (1, 1))],
    )
    outputs = program.model.graph.outputs
    assert len(outputs) == 1 + leaves  # logits and the returned cache
    assert [str(d) for d in outputs[1].shape] == ["batch", "4", "past + 1", "8"]


def test_exports_a_derived_dim_with_fx2onnx_export_directly() -> None:
    """The plain call, no check helper: the derived dim's name reaches the ONNX model's input."""
    past = torch.export.Dim("past", min=1, max=32)
    program = fx2onnx.export(
        AttendFromMaskPositions().eval(), step_inputs(2, 5), dynamic_shapes=({2: past}, {1: past + 1})
    )
    assert [str(d) for d in program.model.graph.inputs[1].shape] == ["2", "past + 1"]


@pytest.mark.parametrize(
    ("second", "message"),
    [("n", r"L\['y'\].size\(\)\[0\] = 6 is not equal to"), ("n + 1", r"to be equal to n \+ 1, where n = 5, but got 7")],
)
def test_an_example_breaking_the_declared_relation_is_refused_by_torchs_check(second: str, message: str) -> None:
    """The relation is made a fact of the trace only where the example holds it; otherwise torch.export's own check
    names the inputs, as before."""

    class Adds(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return x.sum() + y.sum()

    n = torch.export.Dim("n", max=40)
    shapes = ({0: n}, {0: n if second == "n" else n + 1})
    y = torch.randn(6 if second == "n" else 7)  # neither n nor n + 1
    with pytest.raises(CaptureError, match=message):
        fx2onnx.export(Adds(), (torch.randn(5), y), dynamic_shapes=shapes)
