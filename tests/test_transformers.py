"""Hugging Face models built from small configs (no download): ModelOutput, caches, padding masks."""

from __future__ import annotations

import copy
import inspect
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import fx2onnx

from conftest import assert_exports_and_matches as check

transformers = pytest.importorskip("transformers")
warnings.filterwarnings("ignore", module="transformers")


def gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_gpt2_dynamic_batch_and_sequence_with_padding() -> None:
    ids = torch.randint(0, 300, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=64)
    padded = torch.ones(3, 7, dtype=torch.long)
    padded[0, :2] = 0  # left padding: those query rows attend to nothing; eager gives zeros there
    program = check(
        gpt2(),
        (),
        {"input_ids": ids, "attention_mask": mask, "use_cache": False},
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        run_with=[((), {"input_ids": torch.randint(0, 300, (3, 7)), "attention_mask": padded, "use_cache": False})],
    )
    assert [v.name for v in program.model.graph.outputs] == ["logits"]
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "seq"]


def test_gpt2_dynamic_batch_from_a_batch_of_one() -> None:
    """The usual call: one sentence as the example. transformers' masking compares the batch with its positions'
    1 and took the size-1 branch: the batch was pinned to 1 (ONNX Runtime refused a batch of 3)."""
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=1, max=64)
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(0))
    program = check(
        gpt2(),
        (),
        {"input_ids": ids, "use_cache": False},
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "use_cache": None},
        run_with=[((), {"input_ids": torch.randint(0, 300, (b, s)), "use_cache": False}) for b, s in ((3, 7), (1, 9))],
    )
    assert [str(d) for d in program.model.graph.inputs[0].shape] == ["batch", "seq"]


def cache_argument(model: torch.nn.Module) -> str:
    """The KV cache's argument and output field: `past_key_values` until transformers 5.23, `cache` since."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def test_llama_with_cache_outputs() -> None:
    ids = torch.randint(0, 300, (2, 6))
    model = llama()
    program = check(model, (ids,), {"use_cache": True})
    names = [v.name for v in program.model.graph.outputs]
    assert names == ["logits"] + [f"{cache_argument(model)}_{i}" for i in range(4)]


def llama_step_inputs(
    config: transformers.LlamaConfig, cache_name: str, batch: int, new: int, past: int, dtype: torch.dtype
) -> dict:
    """One decoding step's inputs: `new` tokens after a cache of `past` (random keys/values)."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=config)
    head_dim = config.hidden_size // config.num_attention_heads
    for layer in range(config.num_hidden_layers):
        shape = (batch, config.num_key_value_heads, past, head_dim)
        cache.update(torch.randn(shape, dtype=dtype), torch.randn(shape, dtype=dtype), layer)
    return {
        "input_ids": torch.randint(0, 300, (batch, new)),
        "attention_mask": torch.ones(batch, past + new, dtype=torch.long),
        cache_name: cache,
        "use_cache": True,
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_decoding_step_with_cache_input_and_dynamic_sizes(dtype: torch.dtype) -> None:
    """The usual export for generation: a KV cache as input. Eager appends to the cache it is given, so this
    also checks that verification runs ONNX Runtime on the inputs as given, not as eager left them."""
    model = llama().to(dtype)
    config = model.config
    batch, new, past = (torch.export.Dim(n, min=1, max=32) for n in ("batch", "new", "past"))
    total = torch.export.Dim("total", min=4, max=64)
    layers = config.num_hidden_layers
    cache_name = cache_argument(model)
    check(
        model,
        (),
        llama_step_inputs(config, cache_name, 2, 3, 5, dtype),
        dynamic_shapes={
            "input_ids": {0: batch, 1: new},
            "attention_mask": {0: batch, 1: total},
            cache_name: [{0: batch, 2: past}] * (2 * layers),
        },
        run_with=[
            ((), llama_step_inputs(config, cache_name, b, n, p, dtype)) for b, n, p in [(3, 1, 7), (1, 4, 4), (2, 3, 5)]
        ],
    )


def test_llama_cache_dynamic_shapes_in_executorchs_nested_layout() -> None:
    """transformers' executorch helper registers DynamicCache as [[keys], [values]], its exporters (as fx2onnx) as
    one flat list: the first registration in the process wins, and the other layout failed ("Node arity mismatch;
    expected 4, but got 2"). Either layout is accepted; another is refused naming both."""
    model = llama()
    config = model.config
    batch, past = torch.export.Dim("batch", min=1, max=32), torch.export.Dim("past", min=1, max=32)
    total = torch.export.Dim("total", min=2, max=64)
    name = cache_argument(model)
    per_tensor = {0: batch, 2: past}
    layers = config.num_hidden_layers

    def shapes(cache_shapes: list) -> dict:
        return {"input_ids": {0: batch}, "attention_mask": {0: batch, 1: total}, name: cache_shapes, "use_cache": None}

    check(
        model,
        (),
        llama_step_inputs(config, name, 2, 1, 5, torch.float32),
        dynamic_shapes=shapes([[per_tensor] * layers, [per_tensor] * layers]),
        run_with=[((), llama_step_inputs(config, name, 3, 1, 9, torch.float32))],
    )
    with pytest.raises(fx2onnx.CaptureError, match=r"has 3 entries, which fits neither layout .* 2 layers"):
        fx2onnx.export(
            model, (), llama_step_inputs(config, name, 2, 1, 5, torch.float32), dynamic_shapes=shapes([per_tensor] * 3)
        )


@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_sdpa_with_boolean_mask_becomes_attention_at_opset_23(build: Callable[[], torch.nn.Module]) -> None:
    """transformers' SDPA attention passes a boolean mask (causal and padding): at opset 23 each layer's
    attention is one ONNX Attention, padded query rows (all False) included, in ONNX Runtime's CPU provider."""
    model = build()
    model.config._attn_implementation = "sdpa"
    ids = torch.randint(0, 300, (2, 7), generator=torch.Generator().manual_seed(0))
    padded = torch.ones(2, 7, dtype=torch.long)
    padded[0, :3] = 0  # left padding: those query rows attend to nothing
    batch, seq = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("seq", min=2, max=32)
    inputs = {"input_ids": ids, "attention_mask": padded, "use_cache": False}
    unpadded = {"input_ids": ids[:1, :4], "attention_mask": torch.ones(1, 4, dtype=torch.long), "use_cache": False}
    program = check(
        model,
        (),
        inputs,
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        opset_version=23,
        run_with=[((), inputs), ((), unpadded)],
    )
    sdpa = [n for n in program.exported_program.graph.nodes if "scaled_dot_product_attention" in str(n.target)]
    masks = [n.args[3] if len(n.args) > 3 else n.kwargs.get("attn_mask") for n in sdpa]
    assert len(sdpa) == 2 and all(m is not None and m.meta["val"].dtype == torch.bool for m in masks)
    op_types = [node.op_type for node in program.model.graph]
    assert op_types.count("Attention") == model.config.num_hidden_layers
    if build is llama:  # its rotary embeddings too, their caches expanded to the dynamic batch
        assert op_types.count("RotaryEmbedding") == 2 * model.config.num_hidden_layers
    assert "Softmax" not in op_types


def mistral_prefill(model: torch.nn.Module, past: int, cache: object = None) -> tuple[dict, object]:
    """One decoding step after `past` tokens: its inputs (the new token, the mask over past + 1) and the cache the
    eager prefill left: eager's own (sliding-window layers, cut to the window) or `cache` filled (every key)."""
    generator = torch.Generator().manual_seed(past)
    prefix = torch.randint(0, 300, (1, past), generator=generator)
    name = cache_argument(model)
    with torch.no_grad():
        filled = getattr(model(input_ids=prefix, use_cache=True, **{name: cache}), name)
    step = {"input_ids": torch.randint(0, 300, (1, 1), generator=generator)}
    return {**step, "attention_mask": torch.ones(1, past + 1, dtype=torch.long)}, filled


def test_mistral_sliding_window_step_is_right_in_onnx_runtime_at_every_history_length(tmp_path: object) -> None:
    """transformers' DynamicSlidingWindowLayer counts its tokens in a Python int (cumulative_length), which a trace
    builds in (positions, the window's offset), and cuts its keys to the window: a step exported after 3 tokens
    and run in ONNX Runtime after 10 (the same 3 kept keys, the same shapes) gave other logits, silently, and with a
    dynamic past the past was pinned to 3. The layer is traced as transformers' exporter traces it, as a plain
    DynamicLayer: the cache input holds the whole history (its length the graph's past dim, the window applied by
    the mask), as optimum's decoders. Checked in a plain ONNX Runtime session against eager's sliding-window model."""
    import onnxruntime
    from transformers.cache_utils import DynamicCache
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    import fx2onnx

    config = transformers.MistralConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        sliding_window=4,
        use_cache=True,
    )
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(config).eval()
    register_cache_pytrees_for_model(model)  # as transformers' exporters do: a cache flattens to its tensors
    name = cache_argument(model)
    step, cache = mistral_prefill(model, 3)
    past, total = torch.export.Dim("past", min=1, max=32), torch.export.Dim("total", min=2, max=33)
    leaves = torch.utils._pytree.tree_leaves(cache)
    dynamic_shapes = {
        "input_ids": None,
        "attention_mask": {1: total},
        name: [{2: past} if leaf.dim() == 4 else None for leaf in leaves],
    }
    path = str(tmp_path) + "/mistral.onnx"  # type: ignore[operator]
    with pytest.warns(UserWarning, match="DynamicSlidingWindowLayer .* traced as the plain DynamicLayer"):
        program = fx2onnx.export(model, (), {**step, name: cache}, dynamic_shapes=dynamic_shapes)
    program.save(path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [value.name for value in session.get_inputs()]
    window = config.sliding_window - 1  # the keys eager's layer keeps
    for history in (3, 10):  # 10: beyond the window
        step, eager_cache = mistral_prefill(model, history)
        with torch.no_grad():
            expected = model(**step, **{name: eager_cache})
        _, full = mistral_prefill(model, history, DynamicCache())
        whole = copy.deepcopy(getattr(expected, name))  # eager's layers, given every key
        for layer, full_layer in zip(whole.layers, full.layers):
            layer.keys, layer.values = full_layer.keys, full_layer.values
        feed = [step["input_ids"], step["attention_mask"], *torch.utils._pytree.tree_leaves(whole)]
        logits, *present = session.run(None, {n: t.numpy() for n, t in zip(names, feed)})
        torch.testing.assert_close(torch.from_numpy(logits), expected.logits, rtol=1e-4, atol=1e-5)
        kept = getattr(expected, name).layers[0].keys  # eager's window after the step
        assert present[0].shape[2] == history + 1
        torch.testing.assert_close(torch.from_numpy(present[0][:, :, -window:]), kept, rtol=1e-4, atol=1e-5)
        for layer in whole.layers:  # program.run takes the whole history too, counted by its length
            layer.cumulative_length = history
        torch.testing.assert_close(program(**step, **{name: whole})[0], expected.logits, rtol=1e-4, atol=1e-5)
    # eager's own cache after 10 tokens, cut to the window, with the mask over the history: refused at run time
    step, eager_cache = mistral_prefill(model, 10)
    feed = [step["input_ids"], step["attention_mask"], *torch.utils._pytree.tree_leaves(eager_cache)]
    with pytest.raises(Exception, match="fx2onnx_check"):
        session.run(None, {n: t.numpy() for n, t in zip(names, feed)})
    with pytest.raises(ValueError, match=r"token counts differ .* keeps only the window"):
        program(**step, **{name: eager_cache})
    # an example past the window (its keys already cut) would be traced with the wrong positions: refused
    step, eager_cache = mistral_prefill(model, 10)
    with pytest.raises(fx2onnx.CaptureError, match=r"has seen 10 tokens but keeps only the last 3"):
        fx2onnx.export(model, (), {**step, name: eager_cache}, dynamic_shapes=dynamic_shapes)


def test_pytrees_are_registered_only_for_a_model_that_meets_a_cache() -> None:
    """In a fresh process: an encoder (BERT, whose config says use_cache=True but whose forward builds no cache)
    exports without importing transformers' exporters (15-25 ms); a decoder that returns its cache then registers
    the caches from the forward hook, in time for torch.export to flatten its outputs."""
    script = textwrap.dedent(
        """
        import sys, warnings
        warnings.filterwarnings("ignore")
        import torch, transformers, fx2onnx
        bert = transformers.BertModel(transformers.BertConfig(
            num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2, vocab_size=100)).eval()
        assert bert.config.use_cache and not bert.config.is_decoder
        fx2onnx.export(bert, (torch.randint(0, 100, (1, 8)),))
        assert "transformers.exporters" not in sys.modules, "an encoder's export imported transformers.exporters"
        llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=100, bos_token_id=0, eos_token_id=0)).eval()
        ids = torch.randint(0, 100, (1, 6))
        program = fx2onnx.export(llama, (ids,), kwargs={"use_cache": True})
        assert "transformers.exporters" in sys.modules
        eager = llama(ids, use_cache=True)
        onnx_outputs = program(ids, use_cache=True)
        layer = eager.past_key_values.layers[0]
        for expected, actual in zip([eager.logits, layer.keys, layer.values], onnx_outputs):
            torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
        print(len(onnx_outputs))
        """
    )
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split()[-1] == "3"  # logits, the layer's keys and values


def mistral() -> torch.nn.Module:
    config = transformers.MistralConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        sliding_window=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.MistralForCausalLM(config).eval()


def exported_for_generation(model: torch.nn.Module, generator: torch.Generator) -> tuple[Any, list[torch.Tensor]]:
    """`model` exported as users export a decoder for generation (optimum, ONNX Runtime GenAI): a cache input, dynamic
    batch, new-token count and past length (0 included), from an example of 3 new tokens after a cache of 5 (drawn
    from `generator`). A default ONNX Runtime session of it, and the example cache's tensors (the graph's cache
    inputs, in order)."""
    import onnxruntime
    from transformers.cache_utils import DynamicCache
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    model.config.use_cache = True
    register_cache_pytrees_for_model(model)  # as transformers' exporters do: a cache flattens to its tensors
    name = cache_argument(model)
    with torch.no_grad():  # the example: 3 new tokens after a cache of 5 holding every key (the graph's contract)
        cache = getattr(model(torch.randint(0, 300, (2, 5), generator=generator), **{name: DynamicCache()}), name)
    example = {
        "input_ids": torch.randint(0, 300, (2, 3), generator=generator),
        "attention_mask": torch.ones(2, 8, dtype=torch.long),
        name: cache,
        "use_cache": True,
    }
    batch, new = torch.export.Dim("batch", min=1, max=16), torch.export.Dim("sequence", min=1, max=32)
    past, total = torch.export.Dim("past", min=0, max=64), torch.export.Dim("total", min=1, max=96)
    leaves = torch.utils._pytree.tree_leaves(cache)
    dynamic_shapes = {
        "input_ids": {0: batch, 1: new},
        "attention_mask": {0: batch, 1: total},
        name: [{0: batch, 2: past}] * len(leaves),
        "use_cache": None,
    }
    program = fx2onnx.export(model, (), example, dynamic_shapes=dynamic_shapes)
    session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session, leaves


@pytest.mark.parametrize("build", [gpt2, llama, mistral], ids=["gpt2", "llama", "mistral"])
def test_greedy_generation_in_onnx_runtime_gives_eagers_tokens(build: Callable[[], torch.nn.Module]) -> None:
    """Generation as users run an exported decoder (optimum, ONNX Runtime GenAI): exported once with dynamic batch,
    new-token count and past length, then in a default ONNX Runtime session the prompt after an empty cache (past
    length 0), and 20 steps each feeding back the argmax token and the cache the previous step returned. Eager runs
    the same loop on its own cache (Mistral's sliding-window layers cut to the window of 4, the graph's cache
    holding the whole history): the same tokens, and logits close at every step."""
    model = build()
    generator = torch.Generator().manual_seed(0)
    session, leaves = exported_for_generation(model, generator)
    name = cache_argument(model)
    names = [value.name for value in session.get_inputs()]
    prompt = torch.randint(0, 300, (2, 7), generator=generator)
    onnx_ids, eager_ids = prompt, prompt
    present = [leaf.new_zeros(2, leaf.shape[1], 0, leaf.shape[3]) for leaf in leaves]  # the prefill: no past
    eager_cache = None
    for step in range(21):  # the prefill and 20 new tokens
        length = prompt.shape[1] + step
        feed = [onnx_ids, torch.ones(2, length, dtype=torch.long), *present]
        logits, *present = (torch.from_numpy(x) for x in session.run(None, dict(zip(names, (t.numpy() for t in feed)))))
        with torch.no_grad():
            mask = torch.ones(2, length, dtype=torch.long)
            out = model(input_ids=eager_ids, attention_mask=mask, **({name: eager_cache} if eager_cache else {}))
        eager_cache = getattr(out, name)
        torch.testing.assert_close(logits[:, -1], out.logits[:, -1], rtol=1e-4, atol=1e-4, msg=f"step {step}")
        onnx_ids, eager_ids = logits[:, -1:].argmax(-1), out.logits[:, -1:].argmax(-1)
        assert torch.equal(onnx_ids, eager_ids), f"step {step}: {onnx_ids.tolist()} != {eager_ids.tolist()}"
        assert present[0].shape[2] == length  # the whole history, sliding-window layers included


def test_generation_from_a_bos_token_alone_runs_in_onnx_runtime_as_in_eager() -> None:
    """A one-token prompt after an empty cache (new tokens 1, past 0: generation from the BOS token alone).
    torch.export's graph asserts ``Ne(sequence + past, 1)`` (repeat_kv's reshape of the expanded keys), and the
    ONNX model refused that input at run time, which eager computes. The general branch is compared with eager at
    sequence 1 and past 0 at export (the mask's length moved along, to 1), the same there: the input is served, and
    its logits and returned cache are eager's (dtype, shape, values)."""
    model = llama()
    session, leaves = exported_for_generation(model, torch.Generator().manual_seed(0))
    names = [value.name for value in session.get_inputs()]
    for batch in (1, 3):
        ids = torch.full((batch, 1), model.config.bos_token_id)
        mask = torch.ones(batch, 1, dtype=torch.long)
        empty = [leaf.new_zeros(batch, leaf.shape[1], 0, leaf.shape[3]) for leaf in leaves]
        got = session.run(None, {name: x.numpy() for name, x in zip(names, [ids, mask, *empty])})
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        want = [out.logits, *torch.utils._pytree.tree_leaves(getattr(out, cache_argument(model)))]
        assert len(got) == len(want) == 1 + len(leaves)
        for actual, expected in zip(got, want):
            assert actual.dtype == expected.numpy().dtype and actual.shape == tuple(expected.shape)
            torch.testing.assert_close(torch.from_numpy(actual), expected, rtol=1e-4, atol=1e-4)
