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
    return ge2.ExecutorV2(graph, device=device, precision="highest").run({"x": x})["y"]


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


# --- convolutional layers ----------------------------------------------------------------------------------------
def _conv64(x, w, bias, stride, padding, dilation, groups):
    """Direct float64 convolution, NCHW, PyTorch's weight layout; padding (top, bottom, left, right)."""
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), padding[:2], padding[2:]))
    n, c, h, width = x.shape
    k, cg, r, s = w.shape
    p = (h - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (width - dilation[1] * (s - 1) - 1) // stride[1] + 1
    y = np.zeros((n, k, p, q))
    per_group = k // groups
    for i in range(r):
        for j in range(s):
            rows = x[:, :, i * dilation[0]:i * dilation[0] + stride[0] * (p - 1) + 1:stride[0],
                     j * dilation[1]:j * dilation[1] + stride[1] * (q - 1) + 1:stride[1]]
            for group in range(groups):
                taps = rows[:, group * cg:(group + 1) * cg]
                filters = w[group * per_group:(group + 1) * per_group, :, i, j].astype(np.float64)
                y[:, group * per_group:(group + 1) * per_group] += np.einsum("ncpq,kc->nkpq", taps, filters)
    return y if bias is None else y + bias.astype(np.float64)[None, :, None, None]


def _pool64(x, kernel, stride, padding, dilation=(1, 1), ceil_mode=False, mode="max", count_include_pad=True):
    """Float64 max/avg pooling over NCHW with PyTorch's output size (ceil_mode windows must start inside)."""
    n, c, h, w = x.shape
    sizes = []
    for extent, k, s, p, d in zip((h, w), kernel, stride, padding, dilation):
        span = extent + 2 * p - d * (k - 1) - 1
        out = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (out - 1) * s >= extent + p:
            out -= 1
        sizes.append(out)
    y = np.zeros((n, c, *sizes))
    for a in range(sizes[0]):
        for b in range(sizes[1]):
            rows = [a * stride[0] - padding[0] + i * dilation[0] for i in range(kernel[0])]
            cols = [b * stride[1] - padding[1] + j * dilation[1] for j in range(kernel[1])]
            inside_rows = [i for i in rows if 0 <= i < h]
            inside_cols = [j for j in cols if 0 <= j < w]
            window = x[:, :, inside_rows][:, :, :, inside_cols].astype(np.float64)
            if mode == "max":
                y[:, :, a, b] = window.max(axis=(2, 3))
            else:
                count = kernel[0] * kernel[1] if count_include_pad else len(inside_rows) * len(inside_cols)
                y[:, :, a, b] = window.sum(axis=(2, 3)) / count
    return y


@pytest.mark.parametrize("shape, conv", [
    ((2, 3, 9, 7), dict(out_channels=5, kernel_size=3, padding=1)),
    ((1, 4, 8, 8), dict(out_channels=6, kernel_size=3, stride=2, padding=(1, 0), groups=2)),
    ((3, 6, 7, 11), dict(out_channels=6, kernel_size=(3, 1), dilation=(2, 1), groups=6, bias=False)),
    ((2, 2, 5, 6), dict(out_channels=3, kernel_size=(2, 3), padding="same", dilation=2)),
    ((2, 3, 13, 13), dict(out_channels=8, kernel_size=7, stride=2, padding=3)),
    ((1, 5, 4, 4), dict(out_channels=2, kernel_size=1, padding="valid")),
])
def test_conv2d_matches_numpy(rng, shape, conv):
    nn.manual_seed(int(rng.integers(1 << 30)))
    layer = nn.Conv2d(shape[1], **conv)
    x = rng.standard_normal(shape).astype(np.float32)
    padding = layer._op_padding()
    padding = (padding,) * 4 if isinstance(padding, int) else padding
    padding = padding if len(padding) == 4 else (padding[0], padding[0], padding[1], padding[1])
    bias = None if layer.bias is None else layer.bias.data
    expected = _conv64(x, layer.weight.data, bias, layer.stride, padding, layer.dilation, layer.groups)
    if conv.get("padding") == "same":
        assert expected.shape[2:] == shape[2:]
    fan_in = layer.weight.data[0].size
    assert_close(_run(layer, x), expected, "float32", reduction_length=fan_in)


def test_conv2d_nhwc_reads_pytorch_weights(rng):
    nchw = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
    nhwc = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, layout="NHWC")
    nhwc.load_state_dict(nchw.state_dict())
    x = rng.standard_normal((2, 4, 9, 10)).astype(np.float32)
    expected = _conv64(x, nchw.weight.data, nchw.bias.data, (2, 2), (1, 1, 1, 1), (1, 1), 2)
    out = _run(nhwc, np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
    assert_close(out, expected.transpose(0, 2, 3, 1), "float32", reduction_length=18)


def test_conv_and_batch_norm_initialisation_follows_pytorch():
    nn.manual_seed(3)
    conv = nn.Conv2d(16, 64, 5, groups=4)
    bound = 1 / np.sqrt(16 // 4 * 25)  # kaiming_uniform(a=sqrt(5)) is uniform in +-1/sqrt(fan_in)
    for parameter in (conv.weight.data, conv.bias.data):
        assert np.abs(parameter).max() <= bound
    assert np.abs(conv.weight.data).max() > 0.95 * bound
    assert abs(conv.weight.data.std() - bound / np.sqrt(3)) < 0.02 * bound
    assert conv.weight.shape == (64, 4, 5, 5)
    norm = nn.BatchNorm2d(7)
    for array, value in ((norm.weight, 1), (norm.bias, 0), (norm.running_mean, 0), (norm.running_var, 1)):
        np.testing.assert_array_equal(array.data, np.full(7, value, np.float32))


def test_cnn_state_dict_is_pytorchs_and_skips_num_batches_tracked(rng):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    names = ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var"]
    assert list(model.state_dict()) == names
    assert [n for n, _ in model.named_parameters()] == names[:4]
    assert [n for n, _ in model.named_buffers()] == names[4:]
    state = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in model.state_dict().items()}
    model.load_state_dict({**state, "1.num_batches_tracked": np.array(3)})
    np.testing.assert_array_equal(model.state_dict()["1.running_var"], state["1.running_var"])
    with pytest.raises(KeyError, match="unexpected keys \\['2.num_batches_tracked'\\]"):
        model.load_state_dict({**state, "2.num_batches_tracked": np.array(3)})
    model.to("float16")
    graph = model.graph(((1, 3, 5, 5), "float16"))
    assert graph.params["0.weight"].type.dtype == "float16"
    assert all(graph.params[n].type.dtype == "float32" for n in names[2:])  # batch_norm keeps float32


def _batch_norm64(x, gamma, beta, mean, var, eps):
    shape = (1, -1, 1, 1)
    return (x.astype(np.float64) - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * gamma.reshape(shape) \
        + beta.reshape(shape)


def test_batch_norm_eval_uses_running_statistics(rng):
    norm = nn.BatchNorm2d(5, eps=1e-3).eval()
    state = {"weight": rng.standard_normal(5), "bias": rng.standard_normal(5), "running_mean": rng.standard_normal(5),
             "running_var": rng.uniform(0.5, 2.0, 5)}
    norm.load_state_dict(state)
    x = rng.standard_normal((3, 5, 4, 7)).astype(np.float32)
    graph = norm.graph((x.shape, "float32"))
    assert list(graph.outputs) == ["y"]  # nothing to update in eval mode
    expected = _batch_norm64(x, *(state[k].astype(np.float32) for k in ("weight", "bias", "running_mean",
                                                                        "running_var")), 1e-3)
    assert_close(_run(norm, x), expected, "float32", reduction_length=4)


def test_batch_norm_training_normalizes_with_batch_statistics_and_declares_updates(rng):
    norm = nn.BatchNorm2d(3, momentum=0.25)
    norm.load_state_dict({"weight": rng.standard_normal(3), "bias": rng.standard_normal(3),
                          "running_mean": rng.standard_normal(3), "running_var": rng.uniform(0.5, 2, 3)})
    x = rng.standard_normal((4, 3, 5, 3)).astype(np.float32) * 3 + 1
    graph = norm.graph((x.shape, "float32"))
    update = nn.BUFFER_UPDATE_PREFIX
    assert list(graph.outputs) == [update + "running_mean", update + "running_var", "y"]
    out = ge2.ExecutorV2(graph).run({"x": x})
    state = norm.state_dict()
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
    assert_close(out["y"], _batch_norm64(x, state["weight"], state["bias"], mean, var, 1e-5), "float32",
                 reduction_length=60)
    assert_close(out[update + "running_mean"], 0.75 * state["running_mean"] + 0.25 * mean, "float32",
                 reduction_length=60)
    assert_close(out[update + "running_var"], 0.75 * state["running_var"] + 0.25 * var * 60 / 59, "float32",
                 reduction_length=60)


class _SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4, 3)

    def forward(self, g, x, labels):
        logits = self.head(g, self.features(g, x))
        return {"logits": logits, "loss": ge2.train.cross_entropy(g, logits, labels)}


def test_trainer_writes_running_statistics_back_and_checkpoints_them(rng, tmp_path):
    model = _SmallCnn()
    spec = {"x": ((6, 2, 6, 6), "float32"), "labels": ((6,), "int64")}
    trainer = ge2.train.Trainer(model.graph(spec), optimizer=ge2.train.SGD(lr=0.05))
    assert trainer.buffer_names == ["features.1.running_mean", "features.1.running_var"]
    assert not set(trainer.buffer_names) & set(trainer.trained)
    running_mean, running_var = np.zeros(4), np.ones(4)
    for _ in range(3):
        state = {**trainer.parameters(), **trainer.buffers()}
        x = rng.standard_normal((6, 2, 6, 6)).astype(np.float32)
        conv = _conv64(x, state["features.0.weight"], state["features.0.bias"], (1, 1), (1, 1, 1, 1), (1, 1), 1)
        trainer.step({"x": x, "labels": rng.integers(0, 3, 6)})
        running_mean = 0.9 * running_mean + 0.1 * conv.mean(axis=(0, 2, 3))
        running_var = 0.9 * running_var + 0.1 * conv.var(axis=(0, 2, 3), ddof=1)
        buffers = trainer.buffers()
        assert_close(buffers["features.1.running_mean"], running_mean, "float32", reduction_length=216)
        assert_close(buffers["features.1.running_var"], running_var, "float32", reduction_length=216)
    # The eval graph with the trained state: batch norm on the running statistics.
    model.load_state_dict({**trainer.parameters(), **trainer.buffers()})
    evaluated = model.eval().graph(spec)
    assert [n.attrs["training"] for n in evaluated.nodes if n.op == "batch_norm"] == [False]
    np.testing.assert_array_equal(evaluated.params["features.1.running_var"].data, buffers["features.1.running_var"])
    path = tmp_path / "cnn.safetensors"
    trainer.save(path)
    saved = trainer.buffers()
    trainer.step({"x": rng.standard_normal((6, 2, 6, 6)).astype(np.float32), "labels": rng.integers(0, 3, 6)})
    trainer.load(path)
    for name, value in saved.items():
        np.testing.assert_array_equal(trainer.buffers()[name], value)
    with pytest.raises(ValueError, match="trainable: 'features.1.running_mean' is a buffer"):
        ge2.train.Trainer(model.train().graph(spec), optimizer=ge2.train.SGD(lr=0.1),
                          trainable=["features.1.running_mean", "head.weight"])


@pytest.mark.parametrize("pool, kernel, stride, padding, dilation, ceil_mode, count_include_pad", [
    ("max", (2, 2), (2, 2), (0, 0), (1, 1), False, True),
    ("max", (3, 3), (2, 2), (1, 1), (1, 1), True, True),
    ("max", (3, 2), (1, 2), (1, 0), (2, 1), False, True),
    ("avg", (3, 3), (2, 2), (1, 1), (1, 1), False, True),
    ("avg", (3, 3), (2, 2), (1, 1), (1, 1), False, False),
    ("avg", (2, 3), (1, 2), (0, 1), (1, 1), False, False),
])
def test_pooling_layers_match_numpy(rng, pool, kernel, stride, padding, dilation, ceil_mode, count_include_pad):
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    if pool == "max":
        layer = nn.MaxPool2d(kernel, stride, padding, dilation, ceil_mode)
    else:
        layer = nn.AvgPool2d(kernel, stride, padding, ceil_mode, count_include_pad)
    expected = _pool64(x, kernel, stride, padding, dilation, ceil_mode, pool, count_include_pad)
    assert_close(_run(layer, x), expected, "float32", reduction_length=kernel[0] * kernel[1])


def test_adaptive_average_pooling(rng):
    x = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
    x64 = x.astype(np.float64)
    assert_close(_run(nn.AdaptiveAvgPool2d(1), x), x64.mean(axis=(2, 3), keepdims=True), "float32",
                 reduction_length=24)
    expected = x64.reshape(2, 3, 3, 2, 2, 2).mean(axis=(3, 5))
    assert_close(_run(nn.AdaptiveAvgPool2d((3, 2)), x), expected, "float32", reduction_length=4)
    with pytest.raises(ValueError, match="output_size: \\(4, 4\\) must divide"):
        nn.AdaptiveAvgPool2d(4).graph((x.shape, "float32"))


def test_cnn_layer_arguments_are_checked():
    with pytest.raises(ValueError, match="groups: 2 must divide in_channels \\(3\\)"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="padding: 'same' needs stride 1"):
        nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding: expected an int, \\(h, w\\), 'same' or 'valid'"):
        nn.Conv2d(3, 4, 3, padding="full")
    with pytest.raises(TypeError, match="kernel_size: expected an int or 2 ints"):
        nn.Conv2d(3, 4, (3, 3, 3))
    with pytest.raises(ValueError, match="momentum: expected a float in \\[0, 1\\]"):
        nn.BatchNorm2d(4, momentum=None)
    with pytest.raises(ValueError, match="layout: expected 'NCHW' or 'NHWC'"):
        nn.MaxPool2d(2, layout="NCWH")
    with pytest.raises(ValueError, match="Conv2d input: expected a 4-d NCHW array with 3 channels"):
        nn.Conv2d(3, 4, 3).graph(((1, 4, 5, 5), "float32"))
    with pytest.raises(ValueError, match="BatchNorm2d input: expected a 4-d NCHW array with 4 channels"):
        nn.BatchNorm2d(4).graph(((2, 3, 5, 5), "float32"))


@pytest.mark.gpu
def test_cnn_against_torch_on_the_gpu(rng):
    """Same weights -> same output: eval mode (running statistics) and training mode (batch statistics and the
    running-statistic updates), on the CUDA backend, TF32 off on both sides."""
    torch = pytest.importorskip("torch")
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch_model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                      torch.nn.MaxPool2d(3, 2, 1), torch.nn.Conv2d(8, 8, 3, groups=2, bias=False),
                                      torch.nn.AvgPool2d(2, ceil_mode=True), torch.nn.AdaptiveAvgPool2d(1),
                                      torch.nn.Flatten(), torch.nn.Linear(8, 5))
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                          nn.Conv2d(8, 8, 3, groups=2, bias=False), nn.AvgPool2d(2, ceil_mode=True),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    with torch.no_grad():
        torch_model[1].running_mean.uniform_(-0.5, 0.5)
        torch_model[1].running_var.uniform_(0.5, 2.0)
    model.load_state_dict({k: v.detach().numpy() for k, v in torch_model.state_dict().items()})
    x = rng.standard_normal((4, 3, 15, 13)).astype(np.float32)
    expected = torch_model.eval()(torch.from_numpy(x)).detach().double().numpy()
    assert_close(_run(model.eval(), x, device="cuda"), expected, "float32", reduction_length=72)
    out = ge2.ExecutorV2(model.train().graph((x.shape, "float32")), device="cuda", precision="highest").run({"x": x})
    expected = torch_model.train()(torch.from_numpy(x)).detach().double().numpy()
    assert_close(out["y"], expected, "float32", reduction_length=4 * 15 * 13)
    for name in ("running_mean", "running_var"):
        assert_close(out[nn.BUFFER_UPDATE_PREFIX + "1." + name], getattr(torch_model[1], name).double().numpy(),
                     "float32", reduction_length=4 * 15 * 13, what=name)
