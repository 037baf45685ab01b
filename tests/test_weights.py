"""export(weights=...): models captured on the meta device, their weights streamed from a checkpoint (issue 22).

Each model is also built eagerly with the same code, its state_dict saved as a checkpoint (a safetensors file,
transformers' sharded folder, a mapping); the model built on the meta device and exported with ``weights=`` must
give, in ONNX Runtime, what eager gives (and what the export of the eager model gives), and its saved weights must
be the checkpoint's, byte for byte.
"""

from __future__ import annotations

import os
import pathlib
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


def _cli_factory_and_model(tmp_path: os.PathLike[str]) -> tuple[pathlib.Path, torch.nn.Module]:
    """The CLI tests' factory file (it builds the model on the meta device) and the eager model of its config."""
    factory = pathlib.Path(tmp_path) / "factory.py"
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
    return factory, transformers.AutoModelForCausalLM.from_config(config).eval()


def test_cli_export_with_weights_and_verify_weights(
    tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from fx2onnx import cli

    factory, eager = _cli_factory_and_model(tmp_path)
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


class IntegerTable(torch.nn.Module):
    """Integer weights: rows of a table picked by the input, divided by a weight (the divisor's values are only
    known from the checkpoint, so the zero guards of integer division must not read them at export)."""

    def __init__(self, width: int, division: str) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(width)
        self.register_buffer("table", torch.randint(-100, 100, (3, width), generator=generator))
        signs = torch.arange(width) % 2 * 2 - 1  # no zero: eager raises at an integer division by zero
        self.register_buffer("divisor", torch.randint(1, 9, (width,), generator=generator) * signs)
        self.division = division

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.table[ids]
        if self.division in ("floor", "trunc"):
            return torch.div(rows, self.divisor, rounding_mode=self.division)
        return {"floor_divide": torch.floor_divide, "remainder": torch.remainder, "fmod": torch.fmod}[self.division](
            rows, self.divisor
        )


@pytest.mark.parametrize("division", ["floor", "trunc", "floor_divide", "remainder", "fmod"])
@pytest.mark.parametrize("width", [4, 100])  # 4: small enough for emit's type inference to read its values
def test_integer_division_by_a_meta_weight(division: str, width: int) -> None:
    eager = IntegerTable(width, division)
    with torch.device("meta"):
        meta = IntegerTable(width, division)
    ids = torch.tensor([2, 0, 1, 1])
    program = fx2onnx.export(
        meta, (ids,), weights=dict(eager.state_dict()), dynamic_shapes=({0: torch.export.Dim("n")},)
    )
    for picked in (ids, ids[:1], ids[:0]):  # an empty dividend too: the zero guard's case
        assert torch.equal(program(picked)[0], eager(picked)), picked


# --- save(weights="reference"): external data pointing at the checkpoint's own bytes -----------------------------
def _external_locations(path: str) -> dict[str, tuple[str, int]]:
    """{initializer: (location, offset)} of a saved model's external data."""
    proto = onnx.load(path, load_external_data=False)
    locations = {}
    for initializer in proto.graph.initializer:
        entries = {entry.key: entry.value for entry in initializer.external_data}
        if "location" in entries:
            locations[initializer.name] = (entries["location"], int(entries.get("offset", 0)))
    return locations


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_save_points_into_the_sharded_checkpoint(tmp_path: os.PathLike[str], dtype: torch.dtype) -> None:
    # Tied: lm_head (transposed) and the embedding are one tensor of the checkpoint. Projections of 128 x 256 and
    # more: the optimizer folds smaller ones (transposed and cast in memory, as with the eager model's weights).
    config = llama_config(hidden_size=256, intermediate_size=512)
    eager = build(config, dtype, meta=False)
    checkpoint = tmp_path / "checkpoint"
    eager.save_pretrained(checkpoint, max_shard_size="400KB")
    shards = sorted(f for f in os.listdir(checkpoint) if f.endswith(".safetensors"))
    assert len(shards) > 3
    meta = build(config, dtype, meta=True)
    program = fx2onnx.export(meta, (INPUT_IDS,), kwargs={"use_cache": False}, weights=str(checkpoint))

    copied = str(tmp_path / "copy" / "model.onnx")
    program.save(copied, external_data=True)
    saved = str(checkpoint / "model.onnx")
    program.save(saved, weights="reference")
    onnx.checker.check_model(saved, full_check=True)
    # Every weight of the checkpoint is referenced where it lies, the Linear weights untransposed.
    locations = _external_locations(saved)
    in_shards = {name: where for name, where in locations.items() if where[0] in shards}
    stored = _weights.Checkpoint.open(str(checkpoint)).tensors
    large = {name for name, t in stored.items() if name.endswith(("proj.weight", "embed_tokens.weight"))}
    assert len(large) == 2 * 7 + 1
    where = {(os.path.basename(stored[name].path or ""), stored[name].offset) for name in large}
    assert where <= set(in_shards.values())
    copies = [f for f in os.listdir(checkpoint) if f.startswith("model.onnx.")]  # tensors computed by the export
    assert sum(os.path.getsize(checkpoint / f) for f in copies) < 64 * 1024
    proto = onnx.load(saved, load_external_data=False)
    transposes = [node for node in proto.graph.node if node.op_type == "Transpose" and node.input[0] in in_shards]
    assert len(transposes) == 2 * 7 + 1  # the projections and the LM head, which reads the embedding's bytes
    gathered = {node.input[0] for node in proto.graph.node if node.op_type == "Gather"}
    assert any(node.input[0] in gathered for node in transposes)  # one initializer for the tied weights

    check = program.verify_weights(saved, full=True)
    assert check.passed and check.in_place == check.from_checkpoint == len(in_shards), check
    # ONNX Runtime folds the Transposes: the results are the copied model's, bit for bit, and eager's.
    assert torch.equal(run_saved(saved, INPUT_IDS), run_saved(copied, INPUT_IDS))
    with torch.no_grad():
        expected = eager(INPUT_IDS, use_cache=False).logits
    result = compare("logits", expected, run_saved(saved, INPUT_IDS))
    assert result.passed, result


def test_reference_save_of_a_single_file_checkpoint_and_resaves(tmp_path: os.PathLike[str]) -> None:
    torch.manual_seed(5)
    eager = Scaled().eval()
    weights = tmp_path / "model.safetensors"
    save_file({**eager.state_dict(), "scale": eager.scale}, str(weights))
    original = weights.read_bytes()
    with torch.device("meta"):
        meta = Scaled().eval()
    ids = torch.tensor([[0, 49, 3, 7]])
    program = fx2onnx.export(meta, (ids,), weights=load_file(str(weights)))
    in_memory = str(tmp_path / "mapping" / "model.onnx")
    assert program.save(in_memory, weights="reference") == "model.onnx.data"  # a mapping's tensors: copied
    assert all(location == "model.onnx.data" for location, _ in _external_locations(in_memory).values())
    program = fx2onnx.export(meta, (ids,), weights=str(weights))
    saved = str(tmp_path / "model.onnx")
    program.save(saved, weights="reference")
    onnx.checker.check_model(saved, full_check=True)
    assert {location for location, _ in _external_locations(saved).values()} == {"model.safetensors"}
    result = compare("out", eager(ids), run_saved_any(saved, ids))
    assert result.passed, result
    # Saving over it (copied, then referenced again) never removes the checkpoint it referenced.
    assert program.save(saved, external_data=True) == "model.onnx.data"
    assert weights.read_bytes() == original
    assert program.verify_weights(saved, full=True).passed
    program.save(saved, weights="reference")
    assert weights.read_bytes() == original
    assert not (tmp_path / "model.onnx.data").exists()  # the copy it replaced is removed
    assert program.verify_weights(saved, full=True).passed


def run_saved_any(path: str, *inputs: torch.Tensor) -> torch.Tensor:
    session = cpu_session(path)
    feeds = {arg.name: to_ortvalue(value) for arg, value in zip(session.get_inputs(), inputs, strict=True)}
    (output,) = session.run_with_ort_values(None, feeds)
    return to_torch(output)


def test_reference_save_copies_converted_weights_with_a_warning(tmp_path: os.PathLike[str]) -> None:
    config = llama_config(tie_word_embeddings=False)
    checkpoint = tmp_path / "checkpoint"
    build(config, torch.bfloat16, meta=False).save_pretrained(checkpoint, max_shard_size="100KB")
    meta = build(config, torch.float32, meta=True)  # a float32 model from a bfloat16 checkpoint
    program = fx2onnx.export(meta, (INPUT_IDS,), kwargs={"use_cache": False}, weights=str(checkpoint))
    saved = str(checkpoint / "model.onnx")
    with pytest.warns(UserWarning, match=r"weights='reference': \d+ weights .* converted .*torch.bfloat16 in the"):
        data = program.save(saved, weights="reference")
    assert data == "model.onnx.data"
    assert not any(location.endswith(".safetensors") for location, _ in _external_locations(saved).values())
    check = program.verify_weights(saved, full=True)
    assert check.passed and check.in_place == 0, check
    assert torch.equal(run_saved(saved, INPUT_IDS), program(INPUT_IDS, use_cache=False)[0])


def test_reference_save_outside_the_checkpoint_or_after_it_moved_writes_nothing(tmp_path: os.PathLike[str]) -> None:
    torch.manual_seed(6)
    eager = Scaled().eval()
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    save_file({**eager.state_dict(), "scale": eager.scale}, str(folder / "model.safetensors"))
    with torch.device("meta"):
        meta = Scaled().eval()
    program = fx2onnx.export(meta, (torch.tensor([[1]]),), weights=str(folder))
    out = tmp_path / "out"
    with pytest.raises(WeightsError, match=r"model.safetensors is not inside .*out: save the model into the checkp"):
        program.save(str(out / "model.onnx"), weights="reference")
    assert os.listdir(out) == []
    with pytest.raises(ValueError, match=r"weights='reference' saves the weights as external data"):
        program.save(str(folder / "model.onnx"), weights="reference", external_data=False)
    in_memory = fx2onnx.export(eager, (torch.tensor([[1]]),))
    with pytest.raises(ValueError, match=r"exported with its weights in memory: save it with weights='copy'"):
        in_memory.save(str(folder / "model.onnx"), weights="reference")

    os.link(folder / "model.safetensors", tmp_path / "second-name.safetensors")  # onnx.checker refuses hard links
    with pytest.raises(WeightsError, match=r"has 2 hard links"):
        program.save(str(folder / "model.onnx"), weights="reference")
    os.remove(tmp_path / "second-name.safetensors")

    changed = {**eager.state_dict(), "scale": eager.scale}
    changed["aaa"] = torch.zeros(1000)  # the tensors move within the file
    save_file(changed, str(folder / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"changed since the export: tensor '.*' is no longer where"):
        program.save(str(folder / "model.onnx"), weights="reference")
    os.rename(folder / "model.safetensors", tmp_path / "moved.safetensors")
    with pytest.raises(WeightsError, match=r"model.safetensors \(read at export\) is gone"):
        program.save(str(folder / "model.onnx"), weights="reference")
    assert os.listdir(folder) == []


def test_reference_saved_model_whose_checkpoint_moved(tmp_path: os.PathLike[str]) -> None:
    import onnxruntime

    torch.manual_seed(7)
    eager = Scaled().eval()
    weights = tmp_path / "model.safetensors"
    save_file({**eager.state_dict(), "scale": eager.scale}, str(weights))
    with torch.device("meta"):
        meta = Scaled().eval()
    program = fx2onnx.export(meta, (torch.tensor([[1]]),), weights=str(weights))
    saved = str(tmp_path / "model.onnx")
    program.save(saved, weights="reference")
    assert program.verify_weights(saved).passed
    os.rename(weights, tmp_path / "elsewhere.safetensors")
    check = _weights.verify_weights(saved, str(tmp_path / "elsewhere.safetensors"))
    assert not check.passed
    assert "the checkpoint file 'model.safetensors' is missing: the model was saved with weights='reference'" in str(
        check
    )
    with pytest.raises(Exception, match=r"model.safetensors"):
        onnxruntime.InferenceSession(saved, providers=["CPUExecutionProvider"])


def test_cli_export_with_reference_weights(tmp_path: os.PathLike[str], capsys: pytest.CaptureFixture[str]) -> None:
    from fx2onnx import cli

    factory, eager = _cli_factory_and_model(tmp_path)
    checkpoint = tmp_path / "checkpoint"
    eager.save_pretrained(checkpoint, max_shard_size="100KB")
    output = str(checkpoint / "model.onnx")
    arguments = ["export", f"{factory}:make", "--weights", str(checkpoint), "-o", output, "--save-weights", "reference"]
    assert cli.main(arguments) == 0
    assert cli.main(["verify-weights", output, "--weights", str(checkpoint), "--full"]) == 0
    assert "referenced in place" in capsys.readouterr().out
    onnx.checker.check_model(output, full_check=True)
    with torch.no_grad():
        expected = eager(INPUT_IDS, use_cache=False).logits
    result = compare("logits", expected, run_saved(output, INPUT_IDS))
    assert result.passed, result
