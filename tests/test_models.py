"""End-to-end exports of small models: each runs in ONNX Runtime and is compared with eager."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from conftest import assert_exports_and_matches as check


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_mlp() -> None:
    check(MLP(), (torch.randn(5, 16),))


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


def test_cnn_with_batchnorm_and_pooling() -> None:
    model = SmallCNN().eval()
    with torch.no_grad():  # non-trivial running statistics
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    check(model, (torch.randn(2, 3, 16, 16),))


class EmbeddingBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 24)
        self.norm = torch.nn.LayerNorm(24)
        self.proj = torch.nn.Linear(24, 24)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(self.norm(self.embed(ids))))


def test_embedding_layernorm_gelu() -> None:
    check(EmbeddingBlock(), (torch.randint(0, 100, (2, 7)),))


class Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_sdpa_float_mask() -> None:
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    mask = torch.randn(2, 1, 6, 6)
    check(Attention(), (q, k, v, mask))


def test_sdpa_bool_mask() -> None:
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    mask = torch.rand(2, 1, 6, 6) > 0.3
    mask[..., 0] = True  # every row attends somewhere
    check(Attention(), (q, k, v, mask))


class Causal(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_sdpa_causal() -> None:
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    check(Causal(), (q, k, v))


class Slicing(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x[:, 1:5:2, ...]
        b = x[..., -1]
        c = torch.cat([x, y], dim=1)
        d = torch.stack([x, y], dim=0)
        e1, e2, e3 = torch.split(x, [1, 2, 3], dim=1)
        f = x[0, [0, 2, 4]]
        g = torch.chunk(y, 2, dim=-1)[1]
        return a, b, c, d, e1, e2 * 2, e3, f, g


def test_slicing_indexing_cat_stack_split() -> None:
    check(Slicing(), (torch.randn(3, 6, 4), torch.randn(3, 6, 4)))


class Reductions(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.sum(),
            x.sum(dim=1, keepdim=True),
            x.mean(dim=(0, 2)),
            x.amax(dim=-1),
            x.min(dim=1).values,
            x.max(),
            x.prod(dim=0),
            torch.var(x, dim=1),
            torch.logsumexp(x, dim=2),
            x.norm(dim=-1),
        )


def test_reductions() -> None:
    check(Reductions(), (torch.randn(3, 4, 5),))


class ArgMax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.argmax(x), torch.argmax(x, dim=1), torch.argmax(x, dim=-1, keepdim=True), torch.argmin(x, 0)


def test_argmax_with_and_without_dim() -> None:
    x = torch.randn(4, 5, 6)
    check(ArgMax(), (x,))


class NewFull(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.new_full((2, 3), 7.5), x.new_full((3,), 2, dtype=torch.int64), x.new_zeros(4) + x.sum()


def test_new_full_with_and_without_dtype() -> None:
    check(NewFull(), (torch.randn(2, 2),))


class BoolMul(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b


def test_mul_on_bool_tensors() -> None:
    check(BoolMul(), (torch.rand(3, 4) > 0.5, torch.rand(3, 4) > 0.5))


class Nested(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor], pair: tuple[torch.Tensor, torch.Tensor]) -> dict[str, object]:
        total = inputs["a"] + pair[0] * pair[1]
        return {"total": total, "parts": (inputs["b"].relu(), total.sum(dim=0)), "neg": -inputs["a"]}


def test_nested_dict_tuple_inputs_and_outputs() -> None:
    inputs = {"a": torch.randn(2, 3), "b": torch.randn(4)}
    pair = (torch.randn(2, 3), torch.randn(2, 3))
    program = check(Nested(), (inputs, pair))
    names = [v.name for v in program.model.graph.outputs]
    assert names == ["total", "parts_0", "parts_1", "neg"]
    assert [v.name for v in program.model.graph.inputs] == ["inputs_a", "inputs_b", "pair_0", "pair_1"]


class KwargsModel(torch.nn.Module):
    def forward(self, x: torch.Tensor, *, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = x * scale
        return y + bias if bias is not None else y


def test_kwargs_inputs() -> None:
    x, scale, bias = torch.randn(2, 3), torch.randn(3), torch.randn(3)
    check(KwargsModel(), (x,), {"scale": scale, "bias": bias})


def test_dynamic_batch_runs_at_two_batch_sizes() -> None:
    model = MLP().eval()
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = check(
        model,
        (torch.randn(4, 16),),
        dynamic_shapes={"x": {0: batch}},
        run_with=[((torch.randn(1, 16),), {}), ((torch.randn(9, 16),), {})],
    )
    (graph_input,) = program.model.graph.inputs
    assert str(graph_input.shape[0]) == "batch"
    assert str(program.model.graph.outputs[0].shape[0]) == "batch"


def test_input_and_output_names() -> None:
    program = check(MLP(), (torch.randn(2, 16),), input_names=["features"], output_names=["scores"])
    assert [v.name for v in program.model.graph.inputs] == ["features"]
    assert [v.name for v in program.model.graph.outputs] == ["scores"]


def test_sdpa_bool_mask_with_fully_masked_rows() -> None:
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 1, :] = False  # query 1 may attend to nothing: eager returns zeros for it
    program = check(Attention(), (q, k, v, mask))
    assert not program(q, k, v, mask)[0][0, :, 1].any()


def test_every_value_carries_dtype_and_shape() -> None:
    from fx2onnx.examples import tiny_gpt

    model, args = tiny_gpt()
    batch = torch.export.Dim("batch")
    for dynamic_shapes in (None, ({0: batch},)):
        program = check(model, args, dynamic_shapes=dynamic_shapes)
        untyped = [
            (node.op_type, value.name)
            for node in program.model.graph
            for value in node.outputs
            if value.dtype is None or value.shape is None
        ]
        assert not untyped
