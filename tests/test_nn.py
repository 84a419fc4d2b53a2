"""ge2.nn: layers build the graph a user would write, with PyTorch's initialisation and state-dict names.

CPU: every layer against float64 NumPy on the CPU backend, initial distributions, state dicts, weight tying, errors.
GPU (torch on the GPU machine): the same modules against torch.nn with copied weights, on the CUDA backend.
"""
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import nn
from graph_executor_v2.ops import activations
from graph_executor_v2.testing import assert_close


def _run(model, x, device="cpu", dtype="float32"):
    graph = model.graph((x.shape, dtype))
    return ge2.ExecutorV2(graph, device=device).run({"x": x})["y"]


def _layernorm64(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def test_mlp_matches_numpy(rng):
    nn.manual_seed(int(rng.integers(1 << 30)))
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 7), nn.LogSoftmax())
    x = rng.standard_normal((9, 12)).astype(np.float32)
    state = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    h = x.astype(np.float64) @ state["0.weight"].T + state["0.bias"]
    h = activations.apply("gelu_erf", h)
    h = _layernorm64(h, state["2.weight"], state["2.bias"], 1e-5)
    h = h @ state["3.weight"].T + state["3.bias"]
    expected = h - h.max(-1, keepdims=True)
    expected = expected - np.log(np.exp(expected).sum(-1, keepdims=True))
    assert_close(_run(model, x), expected, "float32", reduction_length=32)


def test_linear_on_3d_input_flattens_and_restores(rng):
    layer = nn.Linear(5, 3, bias=False)
    x = rng.standard_normal((2, 4, 5)).astype(np.float32)
    out = _run(layer, x)
    assert out.shape == (2, 4, 3)
    assert_close(out, x.astype(np.float64) @ layer.weight.data.T.astype(np.float64), "float32", reduction_length=5)


def test_state_dict_names_are_pytorchs_and_round_trip(rng):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    fresh = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in model.state_dict().items()}
    model.load_state_dict(fresh)
    graph = model.graph(((1, 3), "float32"))
    for name, array in fresh.items():
        np.testing.assert_array_equal(graph.params[name].data, array)


def test_load_state_dict_errors_name_the_key():
    model = nn.Linear(3, 4)
    with pytest.raises(KeyError, match="missing keys \\['bias'\\]"):
        model.load_state_dict({"weight": np.zeros((4, 3))})
    with pytest.raises(ValueError, match="state\\['weight'\\]: expected shape \\(4, 3\\)"):
        model.load_state_dict({"weight": np.zeros((3, 4)), "bias": np.zeros(4)})


def test_initialisation_follows_pytorch():
    nn.manual_seed(1)
    layer = nn.Linear(400, 300)
    bound = 1 / np.sqrt(400)
    for parameter in (layer.weight.data, layer.bias.data):
        assert parameter.dtype == np.float32
        assert np.abs(parameter).max() <= bound
        assert np.abs(parameter).max() > 0.95 * bound  # uniform over the whole interval, not a narrower one
    assert abs(layer.weight.data.std() - bound / np.sqrt(3)) < 0.01 * bound  # std of U(-b, b) is b/sqrt(3)
    table = nn.Embedding(1000, 64).weight.data
    assert abs(table.mean()) < 0.02 and abs(table.std() - 1.0) < 0.02  # N(0, 1)
    norm = nn.LayerNorm(8)
    np.testing.assert_array_equal(norm.weight.data, np.ones(8))
    np.testing.assert_array_equal(norm.bias.data, np.zeros(8))


def test_seed_makes_construction_reproducible():
    nn.manual_seed(7)
    first = nn.Linear(6, 6).weight.data
    nn.manual_seed(7)
    np.testing.assert_array_equal(first, nn.Linear(6, 6).weight.data)
    nn.manual_seed(8)
    assert not np.array_equal(first, nn.Linear(6, 6).weight.data)


class _TiedLM(nn.Module):
    """An embedding whose table is also the output head (weight tying)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 6)
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, g, ids):
        return self.head(g, self.embed(g, ids))


def test_user_subclass_with_weight_tying(rng):
    model = _TiedLM()
    assert [name for name, _ in model.named_parameters()] == ["embed.weight"]
    graph = model.graph({"ids": ((3, 4), "int64")})
    assert list(graph.params) == ["embed.weight"]
    ids = rng.integers(0, 11, size=(3, 4))
    out = ge2.ExecutorV2(graph).run({"ids": ids})["y"]
    table = model.embed.weight.data.astype(np.float64)
    assert_close(out, table[ids] @ table.T, "float32", reduction_length=6)


def test_dropout_is_identity_in_eval_and_masks_in_training(rng):
    x = rng.standard_normal((64, 64)).astype(np.float32) + 3.0
    model = nn.Sequential(nn.Dropout(0.25))
    np.testing.assert_array_equal(_run(model.eval(), x), x)
    out = _run(model.train(), x)
    kept = out != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(out[kept], x[kept] / 0.75, rtol=1e-6)


@pytest.mark.parametrize("layer, op", [(nn.ReLU(), "relu"), (nn.SiLU(), "silu"), (nn.Sigmoid(), "sigmoid"),
                                       (nn.Tanh(), "tanh"), (nn.GELU("tanh"), "gelu"), (nn.GELU(), "gelu_erf")])
def test_activations(rng, layer, op):
    x = rng.standard_normal((5, 7)).astype(np.float32)
    assert_close(_run(layer, x), activations.apply(op, x.astype(np.float64)), "float32")


def test_rmsnorm_and_flatten(rng):
    model = nn.Sequential(nn.Flatten(), nn.RMSNorm(12, eps=1e-6))
    x = rng.standard_normal((4, 3, 4)).astype(np.float32)
    x64 = x.reshape(4, 12).astype(np.float64)
    expected = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6)
    assert_close(_run(model, x), expected, "float32")


def test_bad_arguments_raise_naming_them():
    with pytest.raises(ValueError, match="in_features"):
        nn.Linear(0, 3)
    with pytest.raises(ValueError, match="p: expected a probability"):
        nn.Dropout(1.0)
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("fast")
    with pytest.raises(TypeError, match="modules\\[1\\]"):
        nn.Sequential(nn.ReLU(), "relu")
    with pytest.raises(ValueError, match="Linear input: expected an input whose last dim is 3"):
        nn.Linear(3, 2).graph(((4, 5), "float32"))
    with pytest.raises(TypeError, match="input_spec"):
        nn.Linear(3, 2).graph([4, 3])
    with pytest.raises(TypeError, match="g: expected the ir.Graph"):
        nn.ReLU()(np.zeros(3))


@pytest.mark.gpu
def test_against_torch_modules_on_the_gpu(rng):
    torch = pytest.importorskip("torch")
    torch_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                      torch.nn.Linear(32, 8), torch.nn.Tanh()).eval()
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 8), nn.Tanh())
    model.load_state_dict({k: v.detach().numpy() for k, v in torch_model.state_dict().items()})
    x = rng.standard_normal((10, 16)).astype(np.float32)
    expected = torch_model(torch.from_numpy(x)).detach().double().numpy()
    assert_close(_run(model, x, device="cuda"), expected, "float32", reduction_length=32)
