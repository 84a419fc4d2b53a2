"""torch.export import of the shape and index ops, conv1d, multi-axis LayerNorm, upsampling and einsum: small
modules against their own PyTorch output on GE2's CPU backend. Runs where torch is installed (the GPU machine)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch frontend is an optional extra")

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.frontend.torch import from_torch  # noqa: E402
from graph_executor_v2.testing import assert_close  # noqa: E402

F = torch.nn.functional


class Lambda(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *inputs):
        return self.function(*inputs)


CASES = {
    "expand": (lambda x: x[:, :1].expand(-1, 5, -1) + 1, [(2, 3, 4)]),
    "pad_constant": (lambda x: F.pad(x, (1, 2, 0, 3), value=0.5), [(2, 3, 4)]),
    "pad_reflect": (lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), [(1, 2, 5, 6)]),
    "pad_replicate": (lambda x: F.pad(x, (3, 1), mode="replicate"), [(2, 3, 4)]),
    "roll": (lambda x: torch.roll(x, shifts=(1, -2), dims=(0, 2)), [(3, 2, 5)]),
    "repeat_interleave": (lambda x: torch.repeat_interleave(x, 3, dim=1), [(2, 3, 4)]),
    "repeat": (lambda x: x.repeat(2, 1, 3), [(3, 4)]),
    "gather": (lambda x: torch.gather(x, 1, torch.tensor([[4, 0, 1], [2, 2, 3], [0, 1, 4]])), [(3, 5)]),
    "index_select": (lambda x: x.index_select(1, torch.tensor([2, 0, 2])), [(3, 4)]),
    "cumsum": (lambda x: torch.cumsum(x, dim=1), [(3, 6)]),
    "tril_triu": (lambda x: torch.tril(x, -1) + torch.triu(x, 2), [(2, 5, 5)]),
    "arange": (lambda x: x + torch.arange(x.shape[-1], dtype=x.dtype), [(2, 7)]),
    "upsample_nearest": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), [(1, 2, 3, 4)]),
    "upsample_bilinear": (lambda x: F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=False),
                          [(1, 2, 3, 4)]),
    "upsample_bilinear_corners": (lambda x: F.interpolate(x, scale_factor=2.0, mode="bilinear",
                                                          align_corners=True), [(1, 2, 3, 4)]),
    "adaptive_avg_pool": (lambda x: F.adaptive_avg_pool2d(x, (3, 2)), [(2, 3, 7, 5)]),
    "einsum": (lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b), [(2, 2, 3, 4), (2, 2, 5, 4)]),
    # several index tensors, broadcast together: HF's mask[batch_idx, kv_idx], negative indices, axes apart
    "index_mask_pairs": (lambda x: x[torch.arange(x.shape[0])[:, None, None, None],
                                     torch.arange(x.shape[1])[None, None, None, :]], [(2, 6)]),
    "index_negative_pairs": (lambda x: x[:, torch.tensor([[0], [-1]]), torch.tensor([3, -2, 0])], [(2, 3, 5, 2)]),
    "index_axes_apart": (lambda x: x[torch.tensor([2, -3]), :, torch.tensor([[1], [-1]])], [(3, 4, 5)]),
    "min_max_of_two": (lambda a, b: torch.min(a, b) * 2 + torch.max(a, b), [(3, 4), (1, 4)]),
    "any_all": (lambda x: torch.where(torch.isinf(x).any(), x, -x) + (x > 0.5).any(dim=1, keepdim=True) * 2.0
                + (x > -1).all(dim=(0, 2), keepdim=True) * 3.0 + (x > -9).all() * 4.0 + x.any(-1, keepdim=True) * 5.0,
                [(2, 3, 4)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_index_op_modules_match_pytorch(name):
    function, shapes = CASES[name]
    torch.manual_seed(0)
    inputs = tuple(torch.randn(*shape) for shape in shapes)
    module = Lambda(function).eval()
    graph = from_torch(module, inputs)
    got = ge2.ExecutorV2(graph).run({v.name: x.numpy() for v, x in zip(graph.inputs, inputs)})["y"]
    expected = function(*(x.double() for x in inputs)).numpy()
    assert_close(got, expected, "float32", 8, what=name)


def test_conv1d_and_channels_last_layer_norm_over_two_axes():
    torch.manual_seed(1)
    conv = torch.nn.Conv1d(4, 6, kernel_size=3, stride=2, padding=1)
    norm = torch.nn.LayerNorm((5, 6))
    module = Lambda(lambda x: norm(conv(x).transpose(1, 2).reshape(2, 5, 6)))
    module.conv, module.norm = conv, norm
    x = torch.randn(2, 4, 10)
    graph = from_torch(module.eval(), (x,))
    got = ge2.ExecutorV2(graph).run({graph.inputs[0].name: x.numpy()})["y"]
    with torch.no_grad():
        expected = module.double()(x.double()).numpy()
    assert_close(got, expected, "float32", 12)


def test_a_symbolic_batch_stays_symbolic_and_one_executor_runs_two_sizes():
    torch.manual_seed(2)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    graph = from_torch(module, (torch.randn(3, 8),), dynamic_shapes=({0: batch},))
    assert isinstance(graph.inputs[0].type.shape[0], str), graph.inputs[0].type
    executor = ge2.ExecutorV2(graph)
    for rows in (2, 5):
        x = torch.randn(rows, 8)
        got = executor.run({graph.inputs[0].name: x.numpy()})["y"]
        with torch.no_grad():
            assert_close(got, module.double()(x.double()).numpy(), "float32", 16)
        module.float()
        np.testing.assert_equal(got.shape, (rows, 4))


def test_a_padding_mask_indexed_by_symbolic_positions_runs_two_sizes():
    """HF's masks index ``mask[batch_idx, kv_idx]`` with aranges over a symbolic batch and sequence: the paired
    index stays symbolic, and one executor runs two sizes."""
    def masked(x, mask):
        batch_idx = torch.arange(mask.shape[0])[:, None, None, None]
        kv_idx = torch.arange(mask.shape[1])[None, None, None, :]
        return x[:, None] * mask.bool()[batch_idx, kv_idx]

    module = Lambda(masked).eval()
    dynamic = {"inputs": ({0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC},
                          {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC})}
    example = (torch.randn(2, 6), torch.ones(2, 6, dtype=torch.int64))
    graph = from_torch(module, example, dynamic_shapes=dynamic)
    assert all(isinstance(d, str) for d in graph.inputs[1].type.shape), graph.inputs[1].type
    executor = ge2.ExecutorV2(graph)
    for batch, sequence in ((2, 6), (3, 4)):
        x = torch.randn(batch, sequence)
        mask = torch.randint(0, 2, (batch, sequence))
        got = executor.run({graph.inputs[0].name: x.numpy(), graph.inputs[1].name: mask.numpy()})["y"]
        np.testing.assert_array_equal(got, masked(x, mask).numpy())


def test_diff_and_constants_along_a_symbolic_sequence_run_two_sizes():
    """HF's packed-sequence check (diff of the positions with one prepended) and T5's full_like of the relative
    positions, over a symbolic sequence: symbolic in the graph, one executor for two lengths."""
    def function(positions, x):
        steps = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1)
        capped = torch.min(x, torch.full_like(x, 0.5))
        return capped * steps + torch.ones_like(x)

    module = Lambda(function).eval()
    dynamic = {"inputs": ({0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC},
                          {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC})}
    graph = from_torch(module, (torch.arange(12).reshape(2, 6), torch.randn(2, 6)), dynamic_shapes=dynamic)
    assert isinstance(graph.inputs[0].type.shape[1], str), graph.inputs[0].type
    executor = ge2.ExecutorV2(graph)
    for batch, sequence in ((2, 6), (3, 4)):
        positions = torch.randint(0, 9, (batch, sequence))
        x = torch.randn(batch, sequence)
        got = executor.run({graph.inputs[0].name: positions.numpy(), graph.inputs[1].name: x.numpy()})["y"]
        assert_close(got, function(positions, x.double()).numpy(), "float32", 1, what=f"{batch}x{sequence}")


@pytest.mark.parametrize("mask_kind", ["bool", "float", "bool_causal"])
def test_sdpa_with_a_mask_and_grouped_heads(mask_kind):
    """F.scaled_dot_product_attention with attn_mask (a padding keep-mask or an additive bias) and enable_gqa."""
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    keep[1, ..., 4:] = False
    mask = keep if mask_kind != "float" else torch.where(keep, 0.0, -1e4) + 0.1 * torch.randn(2, 1, 5, 6)
    if mask_kind == "bool_causal":  # a padding mask and a causal one combined, as decoders export them
        mask = mask & torch.ones(5, 6).tril().bool()

    def attend(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    module = Lambda(attend).eval()
    inputs = (q, k, v, mask)
    graph = from_torch(module, inputs)
    feeds = {value.name: x.numpy() for value, x in zip(graph.inputs, inputs)}
    got = ge2.ExecutorV2(graph).run(feeds)["y"]
    expected = attend(*(x.double() if x.is_floating_point() else x for x in inputs)).numpy()
    assert_close(got, expected, "float32", 8)


def test_multihead_attention_module():
    """nn.MultiheadAttention (batch_first, need_weights=False), as torchvision's ViT calls it."""
    torch.manual_seed(4)
    attention = torch.nn.MultiheadAttention(32, 4, batch_first=True).eval()
    module = Lambda(lambda x: attention(x, x, x, need_weights=False)[0])
    module.attention = attention
    x = torch.randn(2, 6, 32)
    graph = from_torch(module.eval(), (x,))
    got = ge2.ExecutorV2(graph).run({graph.inputs[0].name: x.numpy()})["y"]
    with torch.no_grad():
        expected = module.double()(x.double()).numpy()
    assert_close(got, expected, "float32", 32)


def test_eager_attention_with_a_relative_position_bias_is_one_attention_node():
    """T5's eager attention: softmax(q k^T + position_bias) v, no scale: one attention node with the bias input."""
    torch.manual_seed(5)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    position_bias = torch.randn(1, 4, 6, 6)

    def eager(q, k, v, bias):
        scores = torch.matmul(q, k.transpose(3, 2)) + bias
        return torch.matmul(torch.softmax(scores.float(), dim=-1).type_as(scores), v)

    module = Lambda(eager).eval()
    inputs = (q, k, v, position_bias)
    graph = from_torch(module, inputs)
    optimized = ge2.ExecutorV2(graph).optimized_graph
    assert optimized.op_counts().get("attention") == 1, optimized.op_counts()
    got = ge2.ExecutorV2(graph).run({value.name: x.numpy() for value, x in zip(graph.inputs, inputs)})["y"]
    assert_close(got, eager(*(x.double() for x in inputs)).numpy(), "float32", 8)


def test_constants_made_like_other_tensors():
    """ones_like / zeros_like / full_like / new_ones and ones / full of a size: params of the right dtype."""
    torch.manual_seed(6)

    def function(x):
        return (torch.ones_like(x) + torch.full_like(x, 2.5) * x + x.new_ones(3, 4) - torch.zeros_like(x)
                + torch.full((3, 4), 0.25))

    module = Lambda(function).eval()
    x = torch.randn(3, 4)
    graph = from_torch(module, (x,))
    got = ge2.ExecutorV2(graph).run({graph.inputs[0].name: x.numpy()})["y"]
    assert_close(got, function(x.double()).numpy(), "float32")
