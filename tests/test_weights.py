"""export(weights=...): models captured on the meta device, their weights streamed from a checkpoint (issue 22).

Each model is also built eagerly with the same code, its state_dict saved as a checkpoint (a safetensors file,
transformers' sharded folder, a mapping); the model built on the meta device and exported with ``weights=`` must
give, in ONNX Runtime, what eager gives (and what the export of the eager model gives), and its saved weights must
be the checkpoint's, byte for byte.
"""

from __future__ import annotations

import os
import warnings

import onnx
import pytest
import torch
from safetensors.torch import load_file, save_file

import fx2onnx
from fx2onnx import _weights, examples
from fx2onnx._verification import compare, cpu_session, to_torch
from fx2onnx._verification import to_ortvalue as _to_ortvalue
from fx2onnx._weights import WeightsError

transformers = pytest.importorskip("transformers")
warnings.filterwarnings("ignore", module="transformers")


def llama_config(**overrides: object) -> transformers.LlamaConfig:
    """fx2onnx.examples' small LLaMA (vocab 512, 2 layers of width 64, tied embeddings), with `overrides`."""
    return examples.transformers_config("llama", **overrides)


def build(config: transformers.LlamaConfig, dtype: torch.dtype, *, meta: bool, seed: int = 0) -> torch.nn.Module:
    """The same constructor for both: eagerly (random weights from `seed`) or on the meta device."""
    return examples.transformers_model("llama", config=config, dtype=dtype, meta=meta, seed=seed)


def to_ortvalue(tensor: torch.Tensor) -> object:
    import onnxruntime

    return _to_ortvalue(onnxruntime, tensor)


def run_saved(path: str, input_ids: torch.Tensor) -> torch.Tensor:
    """Run a saved model in a session of its own (default options), as a user would."""
    session = cpu_session(path)
    (logits,) = session.run_with_ort_values(None, {session.get_inputs()[0].name: to_ortvalue(input_ids)})
    return to_torch(logits)


INPUT_IDS = torch.tensor([[0, 511, 7, 300, 42, 1, 255, 128]])


@pytest.mark.parametrize("layout", ["file", "sharded", "index_file"])
def test_tied_llama_from_checkpoint_matches_eager(tmp_path: os.PathLike[str], layout: str) -> None:
    config = llama_config()
    eager = build(config, torch.float32, meta=False)
    assert eager.lm_head.weight is eager.model.embed_tokens.weight
    if layout == "file":
        weights = str(tmp_path / "model.safetensors")
        save_file({k: v for k, v in eager.state_dict().items() if k != "lm_head.weight"}, weights)
    else:
        eager.save_pretrained(tmp_path, max_shard_size="60KB")  # transformers' shards and index, lm_head left out
        weights = str(tmp_path / _weights.INDEX_NAME) if layout == "index_file" else str(tmp_path)
        assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 3
    meta = build(config, torch.float32, meta=True)
    assert meta.lm_head.weight.is_meta

    program = fx2onnx.export(meta, (INPUT_IDS,), kwargs={"use_cache": False}, weights=weights)
    with torch.no_grad():
        expected = eager(INPUT_IDS, use_cache=False).logits
    result = compare("logits", expected, program(INPUT_IDS, use_cache=False)[0])
    assert result.passed, result
    # The same graph as the export of the eager model: the same results, bit for bit.
    reference = fx2onnx.export(eager, (INPUT_IDS,), kwargs={"use_cache": False})
    assert torch.equal(reference(INPUT_IDS, use_cache=False)[0], program(INPUT_IDS, use_cache=False)[0])

    saved = str(tmp_path / "out" / "model.onnx")
    program.save(saved, external_data=True)
    check = program.verify_weights(saved, full=True)
    assert check.passed, check
    assert check.from_checkpoint >= 2 * 7 + 1  # every projection (transposed) and the embedding
    assert torch.equal(run_saved(saved, INPUT_IDS), program(INPUT_IDS, use_cache=False)[0])


@pytest.mark.parametrize(
    ("stored", "wanted"),
    [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16), (torch.float32, torch.float16)],
)
def test_checkpoint_dtype_converted_to_the_models(
    tmp_path: os.PathLike[str], stored: torch.dtype, wanted: torch.dtype
) -> None:
    config = llama_config(tie_word_embeddings=False)
    source = build(config, stored, meta=False)
    # Extremes of the stored dtype that the wanted one holds, where a careless conversion would show.
    with torch.no_grad():
        source.model.norm.weight[:4] = torch.tensor([0.0, -0.0, 1e-30, torch.finfo(wanted).tiny], dtype=stored)
    source.save_pretrained(tmp_path, max_shard_size="100KB")
    eager = build(config, wanted, meta=False)
    eager.load_state_dict({name: value.to(wanted) for name, value in source.state_dict().items()})
    meta = build(config, wanted, meta=True)

    program = fx2onnx.export(meta, (INPUT_IDS,), kwargs={"use_cache": False}, weights=str(tmp_path))
    reference = fx2onnx.export(eager, (INPUT_IDS,), kwargs={"use_cache": False})
    verified = reference.verify(INPUT_IDS, use_cache=False)
    assert all(v.passed for v in verified), verified
    assert torch.equal(reference(INPUT_IDS, use_cache=False)[0], program(INPUT_IDS, use_cache=False)[0])
    saved = str(tmp_path / "out" / "model.onnx")
    program.save(saved, external_data=True)
    check = program.verify_weights(saved, full=True)
    assert check.passed, check


class Scaled(torch.nn.Module):
    """A model of plain torch modules: a computed (non-persistent) buffer, a persistent buffer, tied weights."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.proj = torch.nn.Linear(16, 24)
        self.out = torch.nn.Linear(24, 50, bias=False)
        self.register_buffer("shift", torch.linspace(-1, 1, 24))
        self.register_buffer("scale", torch.arange(1, 25, dtype=torch.float32) / 24, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(torch.nn.functional.gelu(self.proj(self.embed(ids))) * self.scale + self.shift)


def test_mapping_weights_and_a_computed_buffer_given_with_them(tmp_path: os.PathLike[str]) -> None:
    torch.manual_seed(1)
    eager = Scaled().eval()
    with torch.device("meta"):
        meta = Scaled().eval()
    ids = torch.tensor([[0, 49, 3, 7]])
    state = dict(eager.state_dict())
    with pytest.raises(WeightsError, match=r"missing from the weights mapping: scale"):
        fx2onnx.export(meta, (ids,), weights=state, f=str(tmp_path / "m.onnx"))
    assert os.listdir(tmp_path) == []  # a failed export writes nothing
    state["scale"] = eager.scale  # a non-persistent buffer: not in a state_dict, given with the weights
    program = fx2onnx.export(meta, (ids,), weights=state)
    result = compare("out", eager(ids), program(ids)[0])
    assert result.passed, result


def test_weights_replace_those_of_a_model_in_memory(tmp_path: os.PathLike[str]) -> None:
    torch.manual_seed(2)
    model, trained = Scaled().eval(), Scaled().eval()
    path = str(tmp_path / "trained.safetensors")
    save_file(trained.state_dict(), path)
    ids = torch.tensor([[1, 2, 3]])
    program = fx2onnx.export(model, (ids,), weights=path)  # scale (non-persistent) stays the model's
    result = compare("out", trained(ids), program(ids)[0])
    assert result.passed, result


def test_meta_model_without_weights_is_refused() -> None:
    with torch.device("meta"):
        meta = Scaled().eval()
    with pytest.raises(WeightsError, match=r"(?s)hold no data.*embed.weight.*remedy: pass weights="):
        fx2onnx.export(meta, (torch.tensor([[1, 2]]),))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("drop", r"missing from .*model.safetensors: proj.weight"),
        ("shape", r"proj.weight: .*model.safetensors holds float32\[24, 8\], the model wants float32\[24, 16\]"),
        ("dtype", r"proj.weight: .*model.safetensors holds int32\[24, 16\].*only floating dtypes are converted"),
    ],
)
def test_checkpoint_that_does_not_fit_is_refused_and_nothing_written(
    tmp_path: os.PathLike[str], change: str, message: str
) -> None:
    state = {k: v for k, v in Scaled().state_dict().items()}
    if change == "drop":
        del state["proj.weight"]
    elif change == "shape":
        state["proj.weight"] = torch.zeros(24, 8)
    else:
        state["proj.weight"] = torch.zeros(24, 16, dtype=torch.int32)
    save_file(state, str(tmp_path / "model.safetensors"))
    with torch.device("meta"):
        meta = Scaled().eval()
    out = tmp_path / "out"
    with pytest.raises(WeightsError, match=message):
        fx2onnx.export(meta, (torch.tensor([[1]]),), weights=str(tmp_path / "model.safetensors"), f=str(out / "m.onnx"))
    assert not out.exists()


def test_truncated_checkpoint_is_refused(tmp_path: os.PathLike[str]) -> None:
    path = tmp_path / "model.safetensors"
    save_file(Scaled().state_dict(), str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(WeightsError, match=r"truncated or corrupt"):
        _weights.Checkpoint.open(str(path))


def test_verify_weights_finds_a_changed_byte(tmp_path: os.PathLike[str]) -> None:
    torch.manual_seed(3)
    eager = Scaled().eval()
    weights = str(tmp_path / "model.safetensors")
    save_file(eager.state_dict(), weights)
    with torch.device("meta"):
        meta = Scaled().eval()
    program = fx2onnx.export(meta, (torch.tensor([[1]]),), weights={**load_file(weights), "scale": eager.scale})
    saved = tmp_path / "out" / "model.onnx"
    program.save(str(saved), external_data=True)
    assert program.verify_weights(str(saved), full=True).passed
    data_file = saved.parent / "model.onnx.data"
    data = bytearray(data_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    data_file.write_bytes(bytes(data))
    check = _weights.verify_weights(str(saved), weights, full=True)
    assert not check.passed and "differs from the checkpoint" in str(check)
    data_file.write_bytes(bytes(data[:-8]))  # an external-data reference beyond the end of its file
    check = _weights.verify_weights(str(saved), weights, check_model=False)
    assert "beyond the end" in str(check)


def test_blocks_smaller_than_the_tensors(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Contiguous, cast and transposed tensors streamed in many small blocks give the tensor's bytes."""
    monkeypatch.setattr(_weights, "BLOCK_BYTES", 4096)
    values = {
        "a": torch.randn(300, 257).to(torch.bfloat16),
        "b": torch.randn(129, 7, 5),
        "c": torch.tensor([True, False, True]),
        "d": torch.tensor(3.5, dtype=torch.float64),
    }
    path = str(tmp_path / "t.safetensors")
    save_file(values, path)
    checkpoint = _weights.Checkpoint.open(path)
    cases = [
        ("a", torch.bfloat16, None),
        ("a", torch.float32, None),
        ("a", torch.bfloat16, (1, 0)),
        ("a", torch.float16, (1, 0)),
        ("b", torch.float32, (2, 0, 1)),
        ("c", torch.bool, None),
        ("d", torch.float32, None),
    ]
    for name, dtype, permutation in cases:
        tensor = _weights.CheckpointTensor(checkpoint.get(name), dtype, permutation=permutation)
        expected = values[name].to(dtype)
        expected = expected.permute(permutation).contiguous() if permutation else expected

        class Sink:
            chunks: list[bytes] = []

            def write(self, data: memoryview) -> None:
                self.chunks.append(bytes(data))

        sink = Sink()
        assert tensor.stream_to(sink) == expected.numel() * expected.element_size()
        assert b"".join(sink.chunks) == expected.reshape(-1).view(torch.uint8).numpy().tobytes(), (name, dtype)
        assert torch.equal(tensor.materialize(), expected)
        assert list(tensor.shape) == list(expected.shape)


def test_small_bfloat16_llama_saved_and_checked(tmp_path: os.PathLike[str]) -> None:
    """The benchmark's pipeline (benchmarks/llama_meta_weights.py) at a few MB: bfloat16 LLaMA, sharded checkpoint,
    export from the meta model, save with external data, checker and byte checks, ONNX Runtime against eager."""
    config = llama_config(
        vocab_size=4096, hidden_size=256, intermediate_size=704, num_attention_heads=8, tie_word_embeddings=False
    )
    eager = build(config, torch.bfloat16, meta=False)
    checkpoint = tmp_path / "checkpoint"
    eager.save_pretrained(checkpoint, max_shard_size="2MB")
    meta = build(config, torch.bfloat16, meta=True)
    ids = torch.randint(0, 4096, (1, 16), generator=torch.Generator().manual_seed(0))
    saved = str(tmp_path / "onnx" / "model.onnx")
    program = fx2onnx.export(
        meta, (ids,), kwargs={"use_cache": False}, weights=str(checkpoint), f=saved, external_data=True
    )
    onnx.checker.check_model(saved, full_check=True)
    check = program.verify_weights(saved)
    assert check.passed and check.from_checkpoint == 2 * 7 + 2, check
    reference = fx2onnx.export(eager, (ids,), kwargs={"use_cache": False})
    verified = reference.verify(ids, use_cache=False)
    assert all(v.passed for v in verified), verified
    assert torch.equal(run_saved(saved, ids), reference(ids, use_cache=False)[0])


FACTORY = """
import torch, transformers

def make():
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert model.lm_head.weight.is_meta, "built under the meta device by --weights"
    return model, (torch.randint(0, 512, (1, 8)),), {"use_cache": False}
"""


def test_cli_export_with_weights_and_verify_weights(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from fx2onnx import cli

    factory = tmp_path / "factory.py"
    factory.write_text(FACTORY)
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    eager = transformers.AutoModelForCausalLM.from_config(config).eval()
    eager.save_pretrained(tmp_path / "checkpoint", max_shard_size="100KB")
    output = str(tmp_path / "out" / "model.onnx")
    arguments = ["export", f"{factory}:make", "--weights", str(tmp_path / "checkpoint"), "-o", output]
    assert cli.main([*arguments, "--external-data"]) == 0
    assert cli.main(["verify-weights", output, "--weights", str(tmp_path / "checkpoint"), "--full"]) == 0
    assert "weights: PASSED" in capsys.readouterr().out
    session = cpu_session(output)
    (logits,) = session.run_with_ort_values(None, {session.get_inputs()[0].name: to_ortvalue(INPUT_IDS)})
    with torch.no_grad():
        expected = eager(INPUT_IDS, use_cache=False).logits
    result = compare("logits", expected, to_torch(logits))
    assert result.passed, result


def test_model_built_with_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    torch.manual_seed(4)
    eager = Scaled().eval()
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = Scaled().eval()
    ids = torch.tensor([[1, 2, 3]])
    program = fx2onnx.export(fake, (ids,), weights={**eager.state_dict(), "scale": eager.scale})
    result = compare("out", eager(ids), program(ids)[0])
    assert result.passed, result
