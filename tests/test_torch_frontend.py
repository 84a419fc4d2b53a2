"""PyTorch import through torch.export: modules compared with their own output on GE2's CPU backend (and on the
GPU backend where there is a GPU). Runs wherever torch is installed (the GPU machine); skips elsewhere."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch frontend is an optional extra")

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.frontend import UnsupportedModelError  # noqa: E402
from graph_executor_v2.frontend.torch import from_torch  # noqa: E402
from graph_executor_v2.testing import assert_close, torch_mlp_block  # noqa: E402


def _devices():
    return ["cpu"] + (["cuda"] if ge2.is_available() else [])


def _run_on_ge2(graph, x, device):
    """The imported graph's output y for the one input x (a torch tensor)."""
    return ge2.ExecutorV2(graph, device=device, precision="highest").run({graph.inputs[0].name: x.numpy()})["y"]


@pytest.mark.parametrize("device", _devices())
def test_mlp(device):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10),
                                 torch.nn.LogSoftmax(dim=-1)).eval()
    x = torch.randn(8, 20)
    graph = from_torch(module, (x,))
    out = _run_on_ge2(graph, x, device)
    assert_close(out, module(x).detach().double().numpy(), "float32", reduction_length=64)


@pytest.mark.parametrize("device", _devices())
def test_transformer_block_on_3d_input(device):
    torch.manual_seed(1)
    module = torch_mlp_block(32).eval()
    x = torch.randn(2, 5, 32)
    graph = from_torch(module, (x,))
    out = _run_on_ge2(graph, x, device)
    assert_close(out, module(x).detach().double().numpy(), "float32", reduction_length=128)


class _Pointwise(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x)


# Each a function of x (float32 [4, 6], values in (-3, 3)) through the pointwise ops, as torch.export traces it.
POINTWISE_FUNCTIONS = {
    "unary_math": lambda x: torch.sqrt(x.abs() + 1) + torch.erf(x) + torch.log1p(x.abs()) * torch.rsqrt(x * x + 1)
    + torch.exp2(x) - torch.expm1(x) + torch.sin(x) * torch.cos(x) + torch.log2(x.abs() + 1) + torch.reciprocal(x + 4),
    "rounding": lambda x: torch.floor(x) + torch.ceil(x) * 2 + torch.round(x * 1.5) + torch.trunc(x) + torch.sign(x),
    "activations": lambda x: torch.nn.functional.hardswish(x) + torch.nn.functional.hardsigmoid(x)
    + torch.nn.functional.softplus(x, beta=2.0, threshold=3.0) + torch.nn.functional.mish(x)
    + torch.nn.functional.leaky_relu(x, 0.2) + torch.nn.functional.elu(x, 0.5) + torch.nn.functional.relu6(x * 3)
    + torch.nn.functional.hardtanh(x, -0.5, 0.5),
    "inplace_hardtanh": lambda x: torch.nn.functional.hardtanh(x * 2, inplace=True),
    "clamp": lambda x: torch.clamp(x, min=-1.0) + torch.clamp(x, max=0.5) + torch.clamp(x, -0.2, 0.2)
    + torch.clamp(x, min=x[0], max=x[1] + 1),
    "binary": lambda x: torch.pow(x.abs() + 0.5, x) + torch.remainder(x, 0.7) + torch.fmod(x, -0.7)
    + torch.minimum(x, 0.5 - x) + (1.0 - x) + torch.maximum(x, 0.25 * x[0]) + 2 ** x + x ** 2,
    "where_compare_logical": lambda x: torch.where((x > 0) & ~(x >= 1) | (x == 0.5) ^ (x != x), x, -x)
    + torch.where(x <= -1, 1.0, 0.0) + torch.where(x < 0.5, x, 0.5) + (x > 0).float(),
    "division": lambda x: torch.div(x, 0.3, rounding_mode="floor") + torch.div(x, 0.3, rounding_mode="trunc")
    + x / (x.abs() + 1) + torch.floor_divide(x, 0.6),
    "integers": lambda x: ((x * 10).int() // 3 + (x * 10).int() % 4 - torch.div((x * 10).int(), -3,
                           rounding_mode="trunc") + (x * 10).int() / 4).float(),
    "nan_checks": lambda x: torch.isnan(torch.log(x)).float() + torch.isinf(1 / (x * 0)).float()
    + torch.logical_not(x > 0).float(),
}


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("name", sorted(POINTWISE_FUNCTIONS))
def test_pointwise_ops_match_torch(device, name):
    torch.manual_seed(2)
    module = _Pointwise(POINTWISE_FUNCTIONS[name]).eval()
    x = torch.rand(4, 6) * 6 - 3
    x[0, 0] = 0.5
    graph = from_torch(module, (x.clone(),))
    out = _run_on_ge2(graph, x, device)
    expected = module(x.double() if name not in ("integers",) else x).detach().double().numpy()
    assert_close(out, expected, "float32", reduction_length=8)


def test_every_unsupported_aten_op_is_listed():
    class Odd(torch.nn.Module):
        def forward(self, x):
            return torch.tan(x) + torch.asin(x)

    with pytest.raises(UnsupportedModelError) as caught:
        from_torch(Odd(), (torch.randn(4),))
    targets = {problem[1] for problem in caught.value.problems}
    assert any("tan" in t for t in targets) and any("asin" in t for t in targets), targets


def test_bad_arguments():
    with pytest.raises(TypeError, match="module: expected a torch.nn.Module"):
        from_torch(lambda x: x, (torch.randn(2),))
    with pytest.raises(TypeError, match="example_inputs: expected a tuple"):
        from_torch(torch.nn.ReLU(), torch.randn(2))


class _SmallCnn(torch.nn.Module):
    """conv-bn-relu, max pooling, a grouped conv with padding="same", average pooling (ceil_mode, no padding
    counted), global pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, stride=2, padding=1), torch.nn.Conv2d(8, 8, 3, padding="same", groups=4, bias=False),
            torch.nn.BatchNorm2d(8), torch.nn.ReLU(inplace=True),
            torch.nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False), torch.nn.AdaptiveAvgPool2d(1))
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def _randomize_batch_norms(module):
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                layer.running_mean.uniform_(-0.5, 0.5)
                layer.running_var.uniform_(0.5, 2.0)
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.uniform_(-0.5, 0.5)


@pytest.mark.parametrize("device", _devices())
def test_small_cnn(device):
    torch.manual_seed(2)
    module = _SmallCnn()
    _randomize_batch_norms(module)
    module.eval()
    x = torch.randn(3, 3, 29, 22)
    graph = from_torch(module, (x,))
    ops = graph.op_counts()
    assert ops["conv2d"] == 2 and ops["batch_norm"] == 2 and ops["max_pool2d"] == 1 and ops["global_avg_pool"] == 1
    out = _run_on_ge2(graph, x, device)
    assert_close(out, module(x).detach().double().numpy(), "float32", reduction_length=72)


def test_mean_over_height_and_width_and_adaptive_pooling(rng):
    class Pools(torch.nn.Module):
        def forward(self, x):
            return x.mean(dim=(-2, -1), keepdim=True) + torch.nn.functional.adaptive_avg_pool2d(x, (1, 1)) \
                + torch.nn.functional.adaptive_avg_pool2d(x, (2, 3)).sum(dim=(-2, -1), keepdim=True)

    x = torch.randn(2, 3, 8, 9)
    graph = from_torch(Pools(), (x,))
    out = ge2.ExecutorV2(graph).run({graph.inputs[0].name: x.numpy()})["y"]
    assert_close(out, Pools()(x).double().numpy(), "float32", reduction_length=72)


def test_batch_norm_in_training_mode_is_rejected():
    module = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4)).train()
    with pytest.raises(UnsupportedModelError, match="eval\\(\\) mode"):
        from_torch(module, (torch.randn(2, 2, 6, 6),))


class _GptBlock(torch.nn.Module):
    """A pre-norm GPT block: causal self-attention through F.scaled_dot_product_attention, then a GELU MLP, each
    with a residual."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        batch, seq, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, seq, width))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


@pytest.mark.parametrize("device", _devices())
def test_gpt_block_maps_sdpa_onto_the_attention_op(device):
    torch.manual_seed(3)
    module = _GptBlock().eval()
    x = torch.randn(2, 9, 32)
    graph = from_torch(module, (x,))
    assert graph.op_counts().get("attention") == 1, graph.op_counts()
    node = next(n for n in graph.nodes if n.op == "attention")
    assert node.attrs["causal"] is True
    out = _run_on_ge2(graph, x, device)
    assert_close(out, module(x).detach().double().numpy(), "float32", reduction_length=128)


def test_in_place_update_of_a_value_read_later_is_rejected():
    class Aliased(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            z = torch.relu_(y)
            return z + y  # y was overwritten by relu_: torch reads the new value

    x = torch.randn(5)
    try:
        graph = from_torch(Aliased(), (x,))
    except UnsupportedModelError as error:  # the graph kept relu_: GE2 refuses to guess
        assert "in-place update" in str(error)
        return
    # torch.export functionalized it: the graph must then compute what torch computes
    out = ge2.ExecutorV2(graph).run({graph.inputs[0].name: x.numpy()})["y"]
    assert_close(out, Aliased()(x.clone()).double().numpy(), "float32")
