"""batch_norm: reference closed forms and finite differences, validation, graph inference and the grad rule (CPU);
training and inference forward and backward for both layouts and every dtype on the GPU against the float64
reference with poisoned outputs, the in-place running update, determinism, plans and PyTorch."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.dtypes import to_numpy
from graph_executor_v2.ir import Graph
from graph_executor_v2.ops import OPS, batch_norm
from graph_executor_v2.testing import assert_close, random_array
from row_norm_checks import numeric_gradient

F32 = np.float32
DTYPES = ("float32", "float16", "bfloat16")


def to_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """An NCHW-ordered array (any rank >= 2) with its channels moved last for NHWC."""
    return x if layout == "NCHW" else np.ascontiguousarray(np.moveaxis(x, 1, -1))


def operands(rng, shape, dtype="float32", layout="NCHW", offset=0.0):
    channels = shape[1]
    x = to_layout(random_array(rng, shape, dtype) + np.asarray(offset, dtype=to_numpy(dtype)), layout)
    gamma = rng.standard_normal(channels).astype(F32)
    beta = rng.standard_normal(channels).astype(F32)
    running_mean = rng.standard_normal(channels).astype(F32)
    running_var = (rng.random(channels) + 0.5).astype(F32)
    return x, gamma, beta, running_mean, running_var


# ---------------------------------------------------------------------------------------------------------------
# CPU: references
# ---------------------------------------------------------------------------------------------------------------
def test_reference_training_closed_form(rng):
    x = rng.standard_normal((4, 3, 5, 2))
    gamma, beta = np.array([1.0, 2.0, -0.5]), np.array([0.0, 1.0, 3.0])
    running_mean, running_var = np.array([0.1, 0.2, 0.3]), np.array([1.0, 2.0, 3.0])
    y, mean, invstd, rm, rv = batch_norm.reference(x, gamma, beta, running_mean, running_var, training=True,
                                                   momentum=0.25, eps=1e-3)
    per_channel = x.transpose(1, 0, 2, 3).reshape(3, -1)
    np.testing.assert_allclose(mean, per_channel.mean(axis=1))
    np.testing.assert_allclose(invstd, 1 / np.sqrt(per_channel.var(axis=1) + 1e-3))
    np.testing.assert_allclose(rm, 0.75 * running_mean + 0.25 * per_channel.mean(axis=1))
    np.testing.assert_allclose(rv, 0.75 * running_var + 0.25 * per_channel.var(axis=1, ddof=1))  # unbiased
    normalized = (y - beta[None, :, None, None]) / gamma[None, :, None, None]
    np.testing.assert_allclose(normalized.mean(axis=(0, 2, 3)), 0, atol=1e-12)


def test_reference_inference_uses_running_statistics(rng):
    x, gamma, beta, running_mean, running_var = operands(rng, (2, 4, 3))
    y, mean, invstd, rm, rv = batch_norm.reference(x, gamma, beta, running_mean, running_var, training=False)
    np.testing.assert_array_equal(mean, running_mean)
    np.testing.assert_array_equal(rm, running_mean)
    np.testing.assert_array_equal(rv, running_var)
    x, gamma, beta, mean64, var64 = (a.astype(np.float64) for a in (x, gamma, beta, running_mean, running_var))
    expected = (x - mean64[None, :, None]) / np.sqrt(var64[None, :, None] + 1e-5) * gamma[None, :, None] \
        + beta[None, :, None]
    np.testing.assert_allclose(y, expected, rtol=1e-12)


def test_layouts_agree(rng):
    x, gamma, beta, running_mean, running_var = operands(rng, (3, 5, 4, 2), "float32")
    nchw = batch_norm.reference(x, gamma, beta, running_mean, running_var, True)
    nhwc = batch_norm.reference(to_layout(x, "NHWC"), gamma, beta, running_mean, running_var, True, layout="NHWC")
    np.testing.assert_allclose(nhwc[0], to_layout(nchw[0], "NHWC"), rtol=1e-12, atol=1e-12)
    for a, b in zip(nchw[1:], nhwc[1:]):
        np.testing.assert_allclose(a, b, rtol=1e-12)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("layout, shape", [("NCHW", (3, 2, 4)), ("NHWC", (2, 3, 2, 3)), ("NCHW", (5, 3))])
def test_reference_backward_matches_finite_differences(rng, training, layout, shape):
    x, gamma, beta, running_mean, running_var = operands(rng, shape, layout=layout)
    x, eps = x.astype(np.float64), 1e-3
    gamma, beta = gamma.astype(np.float64), beta.astype(np.float64)
    dy = rng.standard_normal(x.shape)
    attrs = OPS["batch_norm"].validate_attrs(dict(training=training, eps=eps, layout=layout), "bn")
    grads = OPS["batch_norm"].reference_backward([x, gamma, beta, running_mean, running_var], None, [dy], attrs)
    assert grads[3] is None and grads[4] is None

    def loss():
        return float((batch_norm.reference(x, gamma, beta, running_mean, running_var, training, 0.1, eps,
                                           layout)[0] * dy).sum())

    for name, analytic, array in (("dx", grads[0], x), ("dgamma", grads[1], gamma), ("dbeta", grads[2], beta)):
        np.testing.assert_allclose(analytic, numeric_gradient(loss, array), rtol=1e-5, atol=1e-7, err_msg=name)


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation before any device work
# ---------------------------------------------------------------------------------------------------------------
def _bad(**changes):
    arrays = dict(x=np.ones((2, 3, 4, 4), F32), gamma=np.ones(3, F32), beta=np.ones(3, F32),
                  running_mean=np.zeros(3, F32), running_var=np.ones(3, F32))
    arrays.update(changes)
    return arrays


@pytest.mark.parametrize("arrays, attrs, error, match", [
    (_bad(gamma=np.ones(4, F32)), {}, ValueError, r"gamma: expected shape \(3,\) \(the channels of x, NCHW\)"),
    (_bad(beta=np.ones(3, np.float16)), {}, TypeError, r"beta: expected dtype float32"),
    (_bad(running_var=np.ones((1, 3), F32)), {}, ValueError, r"running_var: expected shape \(3,\)"),
    (_bad(x=np.ones(3, F32)), {}, ValueError, r"x: expected at least 2 dimensions"),
    (_bad(x=np.ones((2, 3, 4), np.int32)), {}, TypeError, r"x: expected dtype float32, float16 or bfloat16"),
    (_bad(x=np.ones((1, 3, 1, 1), F32)), dict(training=True), ValueError, r"x: training needs more than one value"),
    (_bad(x=np.ones((2, 4, 4, 3), F32)), dict(layout="NCHW"), ValueError, r"gamma: expected shape \(4,\)"),
    (_bad(), dict(layout="CHWN"), ValueError, r"attribute 'layout' expected one of NCHW, NHWC"),
    (_bad(), dict(eps=0.0), ValueError, r"attribute 'eps' must be a finite value > 0"),
    (_bad(), dict(momentum=1.5), ValueError, r"attribute 'momentum' must be in \[0, 1\]"),
    (_bad(), dict(training="yes"), TypeError, r"attribute 'training' expected bool"),
    (_bad(), dict(kernel="cudnn"), ValueError, r"kernel: expected one of auto, split_welford"),
])
def test_forward_numpy_validation(arrays, attrs, error, match):
    with pytest.raises(error, match=match):
        batch_norm.forward_numpy(*arrays.values(), **attrs)


def test_backward_numpy_validation():
    arrays = _bad()
    with pytest.raises(ValueError, match=r"dy: expected shape \(2, 3, 4, 4\)"):
        batch_norm.backward_numpy(np.ones((2, 3, 4, 5), F32), *arrays.values())
    with pytest.raises(TypeError, match=r"dy: expected dtype float32"):
        batch_norm.backward_numpy(np.ones((2, 3, 4, 4), np.float16), *arrays.values())
    with pytest.raises(ValueError, match=r"saved_mean, saved_invstd: pass both"):
        batch_norm.backward_numpy(np.ones((2, 3, 4, 4), F32), *arrays.values(), saved_mean=np.zeros(3, F32))
    with pytest.raises(ValueError, match=r"saved_invstd: expected shape \(3,\)"):
        batch_norm.backward_numpy(np.ones((2, 3, 4, 4), F32), *arrays.values(), saved_mean=np.zeros(3, F32),
                                  saved_invstd=np.ones(2, F32))


# ---------------------------------------------------------------------------------------------------------------
# CPU: graph building, inference and the grad rule on the reference backend
# ---------------------------------------------------------------------------------------------------------------
def _params(g, channels, rng, prefix=""):
    return [g.param(prefix + name, array)
            for name, array in zip(batch_norm.PARAMETERS, operands(rng, (2, channels))[1:])]


def test_graph_inference_and_errors(rng):
    g = Graph("bn")
    x = g.input("x", ("batch", 56, 56, 64), "float16")
    y, mean, invstd, running_mean, running_var = g.batch_norm(x, *_params(g, 64, rng), training=True, layout="NHWC")
    assert y.type == x.type
    assert all(v.type.shape == (64,) and v.type.dtype == "float32" for v in (mean, invstd, running_mean, running_var))
    with pytest.raises(ValueError, match=r"node 'batch_norm_1' \(batch_norm\): gamma: expected shape \(56,\)"):
        g.batch_norm(x, *_params(g, 64, rng, "b_"))  # NCHW reads axis 1 as the channels
    with pytest.raises(ValueError, match=r"attribute 'momentum' must be in \[0, 1\]"):
        g.batch_norm(x, *_params(g, 64, rng, "c_"), momentum=-0.1, layout="NHWC")
    with pytest.raises(ValueError, match=r"dy: expected float16\[batch, 56, 56, 64\]"):
        g.batch_norm_backward(mean, x, _params(g, 64, rng, "d_")[0], mean, invstd, layout="NHWC")


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_grad_rule_on_cpu_backend(rng, training, layout):
    x, gamma, beta, running_mean, running_var = operands(rng, (3, 4, 2, 5), layout=layout)
    g = Graph("bn_grad")
    xv = g.input("x", x.shape, "float32")
    params = [g.input(name, (4,), "float32") for name in batch_norm.PARAMETERS]
    outputs = g.batch_norm(xv, *params, training=training, layout=layout)
    dy = g.input("dy", x.shape, "float32")
    grads = OPS["batch_norm"].grad(g, outputs[0].producer, [dy, None, None, None, None])
    assert grads[3] is None and grads[4] is None
    for name, value in zip(("dx", "dgamma", "dbeta"), grads):
        g.output(value, name)
    g.output(outputs[3], "running_mean_out")
    dy_host = rng.standard_normal(x.shape).astype(F32)
    feeds = {"x": x, "gamma": gamma, "beta": beta, "running_mean": running_mean, "running_var": running_var,
             "dy": dy_host}
    result = ge2.ExecutorV2(g, device="cpu").run(feeds)
    attrs = OPS["batch_norm"].validate_attrs(dict(training=training, layout=layout), "bn")
    expected = OPS["batch_norm"].reference_backward([x, gamma, beta, running_mean, running_var], None,
                                                    [dy_host.astype(np.float64)], attrs)
    for name, reference in zip(("dx", "dgamma", "dbeta"), expected):
        assert_close(result[name], reference, "float32", 30, what=name)
    assert_close(result["running_mean_out"], batch_norm.reference(x, gamma, beta, running_mean, running_var,
                                                                  training, layout=layout)[3], "float32")


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
# (batch, channels, spatial...): batch 1, one channel, odd and non-multiple-of-8 sizes, rank 2 and 3, a ResNet
# layer, many channels with little data each and few channels with much data each (the two split regimes).
SHAPES = [(2, 1, 1, 1), (1, 3, 5, 7), (4, 16, 8, 8), (3, 13, 7, 5), (7, 24), (5, 8, 33), (2, 64, 28, 28),
          (1, 2048, 3, 3), (64, 3, 32, 32)]


def _tolerance_length(shape) -> int:
    """Reduction length behind each statistic (atol grows with its square root)."""
    return int(np.prod(shape)) // shape[1]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_backward_gpu(rng, poisoned, to_device, shape, training, layout, dtype):
    check_forward_and_backward(rng, poisoned, to_device, shape, training, layout, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_many_splits_gpu(rng, poisoned, to_device, layout, dtype):
    """Many splits per channel, which the finalize kernels merge in parallel rows of 32 over blocks of 8 channels:
    here NHWC takes 528 splits (16.5 rows' worth), NCHW 60 (float32) or 30 (16-bit types), and 5 channels leave
    most of a block's channel lanes empty."""
    check_forward_and_backward(rng, poisoned, to_device, (15, 5, 128, 128), True, layout, dtype)


def check_forward_and_backward(rng, poisoned, to_device, shape, training, layout, dtype):
    x, gamma, beta, running_mean, running_var = operands(rng, shape, dtype, layout, offset=3.0)
    channels = shape[1]
    expected = batch_norm.reference(x, gamma, beta, running_mean, running_var, training, 0.1, 1e-5, layout)
    outs = (poisoned(x.shape, dtype), *(poisoned((channels,), "float32") for _ in range(4)))
    batch_norm.forward(*(to_device(a) for a in (x, gamma, beta, running_mean, running_var)), training=training,
                       layout=layout, out=outs)
    assert_close(outs[0].numpy(), expected[0], dtype, what="y")
    for name, got, want in zip(("saved_mean", "saved_invstd", "running_mean_out", "running_var_out"), outs[1:],
                               expected[1:]):
        assert_close(got.numpy(), want, "float32", what=name)

    dy = random_array(rng, x.shape, dtype)
    expected_grads = batch_norm.reference_backward(dy, x, gamma, expected[1], expected[2], training, layout)
    grads = (poisoned(x.shape, dtype), poisoned((channels,), "float32"), poisoned((channels,), "float32"))
    result = batch_norm.backward(*(to_device(a) for a in (dy, x, gamma, beta, running_mean, running_var)),
                                 training=training, layout=layout, out=(*grads, None, None), saved_mean=outs[1],
                                 saved_invstd=outs[2])
    assert result[3] is None and result[4] is None
    length = _tolerance_length(shape)
    scale = float(np.abs(expected_grads[1]).max() + np.abs(expected_grads[2]).max())
    assert_close(grads[0].numpy(), expected_grads[0], dtype, 16, what="dx")
    for name, got, want in zip(("dgamma", "dbeta"), grads[1:], expected_grads[1:]):
        # sums over `length` products of dtype-rounded values: float32 accumulation error, relative to their size
        assert_close(got.numpy() / scale, want / scale, "float32", length, what=name)


@pytest.mark.gpu
def test_in_place_running_update_and_determinism_gpu(rng, to_device):
    x, gamma, beta, running_mean, running_var = operands(rng, (8, 32, 24, 24), "float16", "NHWC")
    device = [to_device(a) for a in (x, gamma, beta, running_mean, running_var)]
    first = batch_norm.forward(*device, training=True, layout="NHWC")
    again = batch_norm.forward(*device, training=True, layout="NHWC")
    np.testing.assert_array_equal(first[0].numpy(), again[0].numpy())  # fixed merge order: bitwise repeatable
    np.testing.assert_array_equal(first[2].numpy(), again[2].numpy())
    DeviceArray = ge2.device.runtime().DeviceArray
    out = (DeviceArray.empty(list(x.shape), "float16"), DeviceArray.empty([32], "float32"),
           DeviceArray.empty([32], "float32"), device[3], device[4])  # the running buffers updated in place
    batch_norm.forward(*device, training=True, momentum=0.3, layout="NHWC", out=out)
    expected = batch_norm.reference(x, gamma, beta, running_mean, running_var, True, 0.3, 1e-5, "NHWC")
    assert_close(device[3].numpy(), expected[3], "float32", what="running_mean (in place)")
    assert_close(device[4].numpy(), expected[4], "float32", what="running_var (in place)")
    assert_close(out[0].numpy(), expected[0], "float16", what="y")


@pytest.mark.gpu
def test_host_faces_gpu(rng):
    x, gamma, beta, running_mean, running_var = operands(rng, (4, 6, 5, 5), "bfloat16")
    outputs = batch_norm.forward_numpy(x, gamma, beta, running_mean, running_var, training=True)
    expected = batch_norm.reference(x, gamma, beta, running_mean, running_var, True)
    assert_close(outputs[0], expected[0], "bfloat16")
    dy = random_array(rng, x.shape, "bfloat16")
    grads = batch_norm.backward_numpy(dy, x, gamma, beta, running_mean, running_var, training=True)  # recomputed
    expected_grads = batch_norm.reference_backward(dy, x, gamma, expected[1], expected[2], True)
    assert_close(grads[0], expected_grads[0], "bfloat16", 16)
    assert grads[3] is None and grads[4] is None
    assert [k["name"] for k in batch_norm.kernels()] == ["split_welford"]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_graph_on_gpu_with_grad(rng, layout):
    x, gamma, beta, running_mean, running_var = operands(rng, (4, 8, 6, 6), "float16", layout)
    g = Graph("bn_gpu")
    xv = g.input("x", x.shape, "float16")
    params = [g.input(name, (8,), "float32") for name in batch_norm.PARAMETERS]
    outputs = g.batch_norm(xv, *params, training=True, layout=layout)
    dy = g.input("dy", x.shape, "float16")
    grads = OPS["batch_norm"].grad(g, outputs[0].producer, [dy, None, None, None, None])
    for name, value in (("y", outputs[0]), ("running_var_out", outputs[4]), ("dx", grads[0]), ("dgamma", grads[1])):
        g.output(value, name)
    feeds = {"x": x, "gamma": gamma, "beta": beta, "running_mean": running_mean, "running_var": running_var,
             "dy": random_array(rng, x.shape, "float16")}
    gpu = ge2.ExecutorV2(g, device="cuda").run(feeds)
    cpu = ge2.ExecutorV2(g, device="cpu").run(feeds)
    for name in ("y", "dx"):
        assert_close(gpu[name], cpu[name].astype(np.float64), "float16", 16, what=name)
    for name in ("running_var_out", "dgamma"):
        assert_close(gpu[name], cpu[name].astype(np.float64), "float32", 144, what=name)


@pytest.mark.gpu
@pytest.mark.parametrize("training", [True, False])
def test_matches_torch(training):
    torch = pytest.importorskip("torch")
    x = torch.randn(8, 32, 14, 14, device="cuda", requires_grad=True)
    gamma = torch.randn(32, device="cuda", requires_grad=True)
    beta = torch.randn(32, device="cuda", requires_grad=True)
    running_mean, running_var = torch.randn(32, device="cuda"), torch.rand(32, device="cuda") + 0.5
    ours = batch_norm.forward(x.detach(), gamma.detach(), beta.detach(), running_mean, running_var,
                              training=training, momentum=0.1)
    torch_mean, torch_var = running_mean.clone(), running_var.clone()
    y = torch.nn.functional.batch_norm(x, torch_mean, torch_var, gamma, beta, training=training, momentum=0.1)
    assert torch.allclose(ours[0], y, atol=1e-4, rtol=1e-4)
    assert torch.allclose(ours[3], torch_mean, atol=1e-5) and torch.allclose(ours[4], torch_var, atol=1e-5)
    dy = torch.randn_like(y)
    y.backward(dy)
    dx, dgamma, dbeta, _, _ = batch_norm.backward(dy, x.detach(), gamma.detach(), beta.detach(), running_mean,
                                                  running_var, training=training, saved_mean=ours[1],
                                                  saved_invstd=ours[2])
    assert torch.allclose(dx, x.grad, atol=1e-4, rtol=1e-4)
    assert torch.allclose(dgamma, gamma.grad, atol=1e-3, rtol=1e-4)
    assert torch.allclose(dbeta, beta.grad, atol=1e-3, rtol=1e-4)
