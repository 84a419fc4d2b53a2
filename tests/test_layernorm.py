"""layernorm: reference math, validation, OpDef and graph (CPU); every kernel x dtype x shape, backward, stability,
alignment, determinism and interop on the GPU."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir import Graph, TensorType
from graph_executor_v2.ops import _row_norm, layernorm
from graph_executor_v2.ops._base import Problem
from graph_executor_v2.testing import assert_close, random_array, tolerance
from row_norm_checks import (DTYPES, EDGE_SHAPES, KERNELS, assert_within, inputs, kernel_sweep_tests, numeric_gradient,
                             statistics_error)

F32 = np.float32


# ---------------------------------------------------------------------------------------------------------------
# CPU: reference against closed forms and finite differences
# ---------------------------------------------------------------------------------------------------------------
def test_reference_closed_form():
    x = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
    gamma, beta = np.array([1.0, 2.0, -1.0, 0.5]), np.array([0.0, 1.0, 2.0, 3.0])
    y, mean, rstd = layernorm.reference(x, gamma, beta, eps=1e-5)
    np.testing.assert_allclose(mean, [2.5, 5.0])
    np.testing.assert_allclose(rstd, [1 / np.sqrt(1.25 + 1e-5), 1 / np.sqrt(1e-5)])
    np.testing.assert_allclose(y[0], (x[0] - 2.5) / np.sqrt(1.25 + 1e-5) * gamma + beta)
    np.testing.assert_array_equal(y[1], beta)  # a constant row normalizes to zero: y = beta


def test_reference_is_shift_and_scale_invariant(rng):
    x = rng.standard_normal((3, 5, 16))
    gamma, beta = rng.standard_normal(16), rng.standard_normal(16)
    y, _, _ = layernorm.reference(x, gamma, beta, eps=0.0)
    np.testing.assert_allclose(layernorm.reference(3.0 * x + 7.0, gamma, beta, eps=0.0)[0], y, atol=1e-12)
    assert y.shape == x.shape


def test_reference_backward_closed_forms(rng):
    x, dy = rng.standard_normal((6, 9)), rng.standard_normal((6, 9))
    gamma = rng.standard_normal(9)
    dx, dgamma, dbeta = layernorm.reference_backward(dy, x, gamma)
    _, mean, rstd = layernorm.reference(x, gamma, np.zeros(9))
    xhat = (x - mean[:, None]) * rstd[:, None]
    np.testing.assert_allclose(dbeta, dy.sum(axis=0))
    np.testing.assert_allclose(dgamma, (dy * xhat).sum(axis=0))
    np.testing.assert_allclose(dx.sum(axis=-1), 0.0, atol=1e-12)  # y does not change when x shifts


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4), (4, 1)])
def test_reference_backward_matches_finite_differences(rng, shape):
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    gamma, beta = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
    eps = 1e-3
    dx, dgamma, dbeta = layernorm.reference_backward(dy, x, gamma, eps)

    def loss():
        return float((layernorm.reference(x, gamma, beta, eps)[0] * dy).sum())

    for name, analytic, array in (("dx", dx, x), ("dgamma", dgamma, gamma), ("dbeta", dbeta, beta)):
        np.testing.assert_allclose(analytic, numeric_gradient(loss, array), rtol=1e-5, atol=1e-7, err_msg=name)


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation before any device work
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(4, F32), beta=np.ones(3, F32)), ValueError,
         r"gamma: expected shape \(3,\) \(the last axis of x\), got float32\[4\]"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), beta=np.ones((1, 3), F32)), ValueError,
         r"beta: expected shape \(3,\)"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, np.float16), beta=np.ones(3, F32)), TypeError,
         r"gamma: expected dtype float32 \(the dtype of x\), got float16"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), beta=np.ones(3, np.float16)), TypeError,
         r"beta: expected dtype float32"),
        (dict(x=np.ones((2, 3), np.int32), gamma=np.ones(3, np.int32), beta=np.ones(3, np.int32)), TypeError,
         r"x: expected dtype float32, float16 or bfloat16, got int32"),
        (dict(x=np.array(1.0, F32), gamma=np.ones(1, F32), beta=np.ones(1, F32)), ValueError,
         r"x: expected at least 1 dimension"),
        (dict(x=np.ones((2, 0), F32), gamma=np.ones(0, F32), beta=np.ones(0, F32)), ValueError,
         r"x: the last \(normalized\) axis needs at least 1 element"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), beta=np.ones(3, F32), eps=0.0), ValueError,
         r"'eps' must be a finite value > 0"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), beta=np.ones(3, F32), eps=-1e-5), ValueError,
         r"'eps' must be a finite value > 0"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), beta=np.ones(3, F32), eps=float("nan")), ValueError,
         r"'eps' must be a finite value > 0"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), beta=np.ones(3, F32), eps=1e-50), ValueError,
         r"'eps' must be a finite value > 0 \(in float32\)"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), beta=np.ones(3, F32), eps="1e-5"), TypeError,
         r"attribute 'eps' expected float, got str"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), beta=np.ones(3, F32), kernel="magic"), ValueError,
         r"kernel: expected one of auto, warp_per_row, block_per_row, multipass"),
        (dict(x=[[1.0]], gamma=np.ones(1, F32), beta=np.ones(1, F32)), TypeError, r"x: expected a NumPy array"),
    ],
)
def test_forward_numpy_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        layernorm.forward_numpy(**kwargs)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(dy=np.ones((3, 2), F32)), ValueError, r"dy: expected shape \(2, 3\) \(the output's\), got \(3, 2\)"),
        (dict(dy=np.ones((2, 3), np.float16)), TypeError, r"dy: expected dtype float32 \(the output's\)"),
        (dict(gamma=np.ones(2, F32)), ValueError, r"gamma: expected shape \(3,\)"),
        (dict(mean=np.zeros(2, F32)), ValueError, r"mean, rstd: pass all saved statistics or none"),
        (dict(rstd=np.zeros(2, F32)), ValueError, r"mean, rstd: pass all saved statistics or none"),
        (dict(mean=np.zeros(3, F32), rstd=np.ones(3, F32)), ValueError,
         r"mean: expected shape \(2,\) \(one float32 per row of x\), got \(3,\)"),
        (dict(mean=np.zeros(2, F32), rstd=np.ones(2, np.float64)), TypeError, r"rstd: expected one of float32"),
        (dict(eps=0), ValueError, r"'eps' must be a finite value > 0"),
        (dict(kernel="fast"), ValueError, r"kernel: expected one of"),
    ],
)
def test_backward_numpy_rejects_bad_arguments(kwargs, error, match):
    arguments = dict(dy=np.ones((2, 3), F32), x=np.ones((2, 3), F32), gamma=np.ones(3, F32), beta=np.ones(3, F32))
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        layernorm.backward_numpy(**arguments)


def test_forward_rejects_host_arrays_for_device_path():
    with pytest.raises(TypeError, match=r"x: expected a CUDA device array"):
        layernorm.forward(np.ones((2, 3), F32), np.ones(3, F32), np.ones(3, F32))


def test_no_gpu_is_a_clear_error():
    if ge2.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        layernorm.forward_numpy(np.ones((2, 3), F32), np.ones(3, F32), np.ones(3, F32))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        layernorm.backward_workspace_bytes((2, 3), "float32")


def test_kernels_and_limits_reported_by_the_native_module():
    if not ge2._native.is_built("_ops_layernorm"):
        pytest.skip("_ops_layernorm is not built")
    table = layernorm.kernels()
    assert [k["name"] for k in table] == list(KERNELS)
    assert all(k["constraints"] for k in table)
    reason = layernorm._native_module().unsupported_reason
    assert reason("warp_per_row", 1024, "float16", True, False) == ""
    assert "cols <= 1024 (forward)" in reason("warp_per_row", 1032, "float16", True, False)
    assert reason("block_per_row", 32768, "float16", True, False) == ""
    assert "cols <= 32768" in reason("block_per_row", 32776, "float16", True, False)
    assert reason("block_per_row", 8200, "float16", True, False) == ""  # 8200 % 8 == 0: vector loads
    assert "cols <= 8192 (forward, scalar loads)" in reason("block_per_row", 8200, "float16", False, False)
    assert "cols <= 8192 (forward, scalar loads)" in reason("block_per_row", 8193, "float16", True, False)
    assert "cols <= 512 (forward, scalar loads)" in reason("warp_per_row", 513, "float32", True, False)
    assert "backward" in reason("block_per_row", 8193, "float32", True, True)
    assert reason("multipass", 10 ** 9, "bfloat16", False, True) == ""


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(cols=0), r"cols: expected >= 1"),
        (dict(rows=-1), r"rows: expected >= 0"),
        (dict(dtype="int32"), r"dtype: expected float32, float16 or bfloat16, got int32"),
        (dict(eps=0.0), r"eps: expected a finite value > 0"),
        (dict(gamma=0), r"gamma: null device pointer"),
        (dict(beta=0), r"beta: null device pointer"),
        (dict(x=0), r"x: null device pointer"),
        (dict(y=0), r"y: null device pointer"),
        (dict(cols=2048, kernel="warp_per_row"), r"kernel: 'warp_per_row' cannot run this problem"),
        (dict(kernel="fastest"), r"kernel: expected one of warp_per_row"),
    ],
)
def test_native_forward_checks_arguments_before_any_device_work(changes, match):
    """Every case fails before a launch (the addresses are not real), so this needs no GPU."""
    if not ge2._native.is_built("_ops_layernorm"):
        pytest.skip("_ops_layernorm is not built")
    args = dict(x=256, gamma=512, beta=768, y=1024, mean=0, rstd=0, rows=4, cols=64, dtype="float16", eps=1e-5,
                kernel="warp_per_row", stream=0)
    args.update(changes)
    with pytest.raises(ValueError, match=match):
        layernorm._native_module().forward(**args)


def test_native_calls_with_no_rows_launch_nothing():
    if not ge2._native.is_built("_ops_layernorm"):
        pytest.skip("_ops_layernorm is not built")
    native = layernorm._native_module()
    kernel = _row_norm.choose_kernel(native, "auto", 64, "float32", True, False)  # the selector's choice
    assert native.forward(0, 512, 768, 0, 0, 0, 0, 64, "float32", 1e-5, kernel, 0) == kernel == "warp_per_row"
    assert _row_norm.choose_kernel(native, "auto", 1025, "float32", True, False) == "block_per_row"
    assert _row_norm.choose_kernel(native, "auto", 1025, "float32", True, True) == "block_per_row"
    assert _row_norm.choose_kernel(native, "auto", 8193, "float32", True, True) == "multipass"
    assert _row_norm.choose_kernel(native, "auto", 513, "float32", False, False) == "block_per_row"  # scalar loads
    with pytest.raises(ValueError, match="kernel: expected one of warp_per_row"):  # the selector chooses, not C++
        native.unsupported_reason("auto", 64, "float32", True, False)
    with pytest.raises(ValueError, match=r"mean, rstd: pass both saved statistics or neither"):
        layernorm._native_module().backward(256, 256, 512, 1024, 0, 256, 512, 512, 256, 4, 2, 64, "float32", 1e-5,
                                            "warp_per_row", 0)
    with pytest.raises(ValueError, match=r"dbeta: null device pointer"):
        layernorm._native_module().backward(256, 256, 512, 0, 0, 256, 512, 0, 256, 4, 2, 64, "float32", 1e-5,
                                            "warp_per_row", 0)


# ---------------------------------------------------------------------------------------------------------------
# CPU: the op definition, the graph builder and the CPU backend
# ---------------------------------------------------------------------------------------------------------------
def test_opdef_infers_and_validates():
    op = ge2.ops.OPS["layernorm"]
    assert [i.name for i in op.inputs] == ["x", "gamma", "beta"] and op.outputs == ("y",)
    attrs = op.validate_attrs({}, "node ln0")
    assert attrs == {"eps": 1e-5}
    out = op.infer([TensorType((2, 5, 8), "bfloat16"), TensorType((8,), "bfloat16"), TensorType((8,), "bfloat16")],
                   attrs)
    assert out == [TensorType((2, 5, 8), "bfloat16")]
    symbolic = op.infer([TensorType(("batch", "hidden"), "float16"), TensorType(("hidden",), "float16"),
                         TensorType(("hidden",), "float16")], attrs)
    assert symbolic == [TensorType(("batch", "hidden"), "float16")]
    with pytest.raises(ValueError, match=r"gamma: expected shape \(8,\)"):
        op.infer([TensorType((4, 8), "float32"), TensorType((7,), "float32"), TensorType((8,), "float32")], attrs)
    with pytest.raises(ValueError, match=r"beta: expected shape \(hidden,\)"):
        op.infer([TensorType((4, "hidden"), "float32"), TensorType(("hidden",), "float32"),
                  TensorType(("width",), "float32")], attrs)
    with pytest.raises(TypeError, match=r"beta: expected dtype float16 \(the dtype of x\), got float32"):
        op.infer([TensorType((4, 8), "float16"), TensorType((8,), "float16"), TensorType((8,), "float32")], attrs)
    with pytest.raises(ValueError, match=r"x: expected at least 1 dimension"):
        op.infer([TensorType((), "float32"), TensorType((1,), "float32"), TensorType((1,), "float32")], attrs)
    with pytest.raises(ValueError, match=r"attribute 'eps' must be a finite value > 0"):
        op.validate_attrs({"eps": -1.0}, "node ln0")
    with pytest.raises(ValueError, match=r"attribute 'eps' must be a finite value > 0"):
        op.validate_attrs({"eps": 0}, "node ln0")


def test_run_reference_and_reference_backward(rng):
    op = ge2.ops.OPS["layernorm"]
    x = random_array(rng, (4, 6), "float16")
    gamma, beta = random_array(rng, (6,), "float16"), random_array(rng, (6,), "float16")
    attrs = op.validate_attrs({"eps": 1e-3}, "node")
    (y,) = op.run_reference([x, gamma, beta], attrs)
    assert y.dtype == np.float16 and y.shape == (4, 6)
    np.testing.assert_allclose(y.astype(np.float64), layernorm.reference(x, gamma, beta, 1e-3)[0], atol=2e-3,
                               rtol=2e-3)
    dy = rng.standard_normal((4, 6))
    grads = op.reference_backward([x, gamma, beta], [y], [dy], attrs)
    for got, expected in zip(grads, layernorm.reference_backward(dy, x, gamma, 1e-3)):
        np.testing.assert_array_equal(got, expected)


def test_graph_builder_and_cpu_executor(rng):
    g = Graph("ln")
    x = g.input("x", ("batch", 5, 12), "float32")
    gamma = g.param("gamma", random_array(rng, (12,), "float32"))
    beta = g.param("beta", random_array(rng, (12,), "float32"))
    g.output(g.layernorm(x, gamma, beta, eps=1e-4), "y")
    executor = ge2.ExecutorV2(g, device="cpu")
    for batch in (1, 3):
        x_value = random_array(rng, (batch, 5, 12), "float32", scale=4.0)
        y = executor.run({"x": x_value})["y"]
        assert y.dtype == np.float32 and y.shape == (batch, 5, 12)
        assert_close(y, layernorm.reference(x_value, gamma.data, beta.data, 1e-4)[0], "float32")
    with pytest.raises(ValueError, match="gamma"):
        g.layernorm(x, g.param("bad", np.ones(5, np.float32)), beta)


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _check_forward(rng, poisoned, to_device, shape, dtype, kernel, offset=0.0, eps=1e-5):
    x, gamma, beta = inputs(rng, shape, dtype, offset)
    rows = int(np.prod(shape[:-1]))
    y, mean, rstd = poisoned(shape, dtype), poisoned((rows,), "float32"), poisoned((rows,), "float32")
    result = layernorm.forward(to_device(x), to_device(gamma), to_device(beta), eps=eps, save_stats=True,
                               kernel=kernel, out=y, mean_out=mean, rstd_out=rstd)
    assert result[0] is y and result[1] is mean and result[2] is rstd
    y_ref, mean_ref, rstd_ref = layernorm.reference(x, gamma, beta, eps)
    what = f"{kernel} {dtype} {shape}"
    # float32 statistics: a mean of |offset| is known to ~1e-7 * |offset|, which y sees through x - mean.
    atol, rtol = tolerance(dtype)
    stats_atol = statistics_error(offset)
    y_atol = atol + stats_atol * float(rstd_ref.max()) * float(np.abs(gamma.astype(np.float64)).max())
    assert_within(y.numpy(), y_ref, y_atol, rtol, f"y {what}")
    assert_within(mean.numpy(), mean_ref, stats_atol, 1e-5, f"mean {what}")
    assert_within(rstd.numpy(), rstd_ref, 1e-6, 2e-5, f"rstd {what}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_auto_edge_shapes(rng, poisoned, to_device, dtype):
    for shape in EDGE_SHAPES:
        _check_forward(rng, poisoned, to_device, shape, dtype, "auto")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", (64, 4096, 65537))
def test_forward_is_stable_for_large_row_means(rng, poisoned, to_device, dtype, cols):
    # x = 1e3 + N(0, 1): E[x^2] - E[x]^2 in float32 would lose the variance; two passes over the registers do not.
    _check_forward(rng, poisoned, to_device, (6, cols), dtype, "auto", offset=1e3)


@pytest.mark.gpu
def test_forward_kernels_agree(rng, to_device):
    x, gamma, beta = (to_device(a) for a in inputs(rng, (67, 1000), "float32"))
    results = [layernorm.forward(x, gamma, beta, kernel=k).numpy() for k in KERNELS]
    for kernel, result in zip(KERNELS[1:], results[1:]):
        np.testing.assert_allclose(result, results[0], rtol=1e-5, atol=2e-6, err_msg=kernel)


@pytest.mark.gpu
def test_forward_zero_rows(to_device):
    x = ge2.device.runtime().DeviceArray.empty([0, 8], "float16")
    gamma = to_device(np.ones(8, np.float16))
    y, mean, rstd = layernorm.forward(x, gamma, gamma, save_stats=True)
    assert y.shape == (0, 8) and mean.shape == (0,) and rstd.shape == (0,)
    dx, dgamma, dbeta = layernorm.backward(x, x, gamma, gamma)
    assert dx.shape == (0, 8)
    np.testing.assert_array_equal(dgamma.numpy(), 0)
    np.testing.assert_array_equal(dbeta.numpy(), 0)


@pytest.mark.gpu
def test_explicit_kernel_that_cannot_run_is_a_clear_error(to_device):
    x = to_device(np.ones((2, 2048), np.float16))
    gamma = to_device(np.ones(2048, np.float16))
    with pytest.raises(ValueError, match=r"kernel: 'warp_per_row' cannot run this problem: .*cols <= 1024"):
        layernorm.forward(x, gamma, gamma, kernel="warp_per_row")
    x = to_device(np.ones((2, 10000), np.float32))
    gamma = to_device(np.ones(10000, np.float32))
    with pytest.raises(ValueError, match=r"kernel: 'block_per_row' cannot run this problem: .*backward"):
        layernorm.backward(x, x, gamma, gamma, kernel="block_per_row")


def _check_backward(rng, poisoned, to_device, shape, dtype, kernel, saved_stats, offset=0.0, eps=1e-5):
    x, gamma, beta = inputs(rng, shape, dtype, offset)
    dy = random_array(rng, shape, dtype)
    dx_ref, dgamma_ref, dbeta_ref = layernorm.reference_backward(dy, x, gamma, eps)
    dx_x, gamma_d = to_device(x), to_device(gamma)
    mean = rstd = None
    if saved_stats:
        _, mean, rstd = layernorm.forward(dx_x, gamma_d, to_device(beta), eps=eps, save_stats=True)
    cols, rows = shape[-1], int(np.prod(shape[:-1]))
    outs = poisoned(shape, dtype), poisoned((cols,), dtype), poisoned((cols,), dtype)
    dx, dgamma, dbeta = layernorm.backward(to_device(dy), dx_x, gamma_d, to_device(beta), eps=eps, kernel=kernel,
                                           out=outs, mean=mean, rstd=rstd)
    assert all(got is out for got, out in zip((dx, dgamma, dbeta), outs))
    what = f"{kernel} {dtype} {shape} saved_stats={saved_stats}"
    atol, rtol = tolerance(dtype)
    # float32 statistics shift xhat by up to statistics_error * rstd (see _check_forward): dx sees it through
    # g * xhat terms, dgamma through its sum over rows of dy * xhat.
    dy64, gamma64 = dy.astype(np.float64), gamma.astype(np.float64)
    rstd_max = float(layernorm.reference(x, gamma, beta, eps)[2].max())
    xhat_error = statistics_error(offset) * rstd_max
    dx_atol = 4 * atol + 2 * rstd_max * xhat_error * float(np.abs(dy64 * gamma64).max())
    assert_within(dx.numpy(), dx_ref, dx_atol, 2 * rtol, f"dx {what}")
    dgamma_atol = atol * np.sqrt(rows) + xhat_error * float(np.abs(dy64).reshape(-1, cols).sum(axis=0).max())
    assert_within(dgamma.numpy(), dgamma_ref, dgamma_atol, rtol, f"dgamma {what}")
    assert_close(dbeta.numpy(), dbeta_ref, dtype, rows, what=f"dbeta {what}")


(test_forward_every_kernel_dtype_and_length, test_backward_every_kernel_dtype_and_length,
 test_backward_many_rows_per_block, test_backward_large_many_rows_per_block) = kernel_sweep_tests(
    layernorm._native_module, _check_forward, _check_backward, channels=2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_auto_edge_shapes_and_large_means(rng, poisoned, to_device, dtype):
    for shape in EDGE_SHAPES:
        _check_backward(rng, poisoned, to_device, shape, dtype, "auto", saved_stats=False)
    _check_backward(rng, poisoned, to_device, (9, 1024), dtype, "auto", saved_stats=False, offset=1e3)
    _check_backward(rng, poisoned, to_device, (9, 1024), dtype, "auto", saved_stats=True, offset=1e3)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_backward_matches_finite_differences(rng, to_device, kernel):
    # float32 on the GPU against central differences of the float64 reference forward.
    for shape in ((3, 5), (2, 2, 33)):
        x, gamma, beta = (a.astype(np.float64) for a in inputs(rng, shape, "float32"))
        dy = rng.standard_normal(shape)
        eps = 1e-3

        def loss():
            return float((layernorm.reference(x, gamma, beta, eps)[0] * dy).sum())

        numeric = [numeric_gradient(loss, a) for a in (x, gamma, beta)]
        grads = layernorm.backward(*(to_device(a.astype(F32)) for a in (dy, x, gamma, beta)), eps=eps, kernel=kernel)
        for name, got, expected in zip(("dx", "dgamma", "dbeta"), grads, numeric):
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4, err_msg=f"{name} {shape}")


@pytest.mark.gpu
def test_backward_is_deterministic(rng, to_device):
    x, gamma, beta = inputs(rng, (4097, 768), "bfloat16")
    dy = random_array(rng, (4097, 768), "bfloat16")
    args = [to_device(a) for a in (dy, x, gamma, beta)]
    first = [g.numpy() for g in layernorm.backward(*args)]
    for _ in range(3):
        again = [g.numpy() for g in layernorm.backward(*args)]
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.gpu
def test_backward_workspace_argument(rng, to_device):
    x, gamma, beta = inputs(rng, (64, 256), "float32")
    dy = random_array(rng, (64, 256), "float32")
    need = layernorm.backward_workspace_bytes((64, 256), "float32")
    assert need > 0 and need % 4 == 0
    assert layernorm.backward_workspace_bytes((0, 256), "float32") == 0
    runtime = ge2.device.runtime()
    workspace = runtime.DeviceArray.empty([need // 4], "float32")
    dx, dgamma, dbeta = layernorm.backward(to_device(dy), to_device(x), to_device(gamma), to_device(beta),
                                           workspace=workspace)
    assert_close(dgamma.numpy(), layernorm.reference_backward(dy, x, gamma)[1], "float32", 64)
    with pytest.raises(ValueError, match=r"workspace: this problem needs \d+ bytes"):
        layernorm.backward(to_device(dy), to_device(x), to_device(gamma), to_device(beta),
                           workspace=runtime.DeviceArray.empty([need // 4 - 1], "float32"))


@pytest.mark.gpu
def test_graph_candidates_launch(rng, poisoned, to_device):
    op = ge2.ops.OPS["layernorm"]
    x, gamma, beta = inputs(rng, (2, 9, 640), "float16")
    attrs = op.validate_attrs({"eps": 1e-4}, "node")
    types = tuple(TensorType(a.shape, "float16") for a in (x, gamma, beta))
    problem = Problem("layernorm", types, tuple(op.infer(types, attrs)), attrs)
    device_inputs = [to_device(a) for a in (x, gamma, beta)]
    expected = layernorm.reference(x, gamma, beta, 1e-4)[0]
    assert [c.name for c in op.candidates] == list(KERNELS) and selection.candidates(op)[-1].always_works
    for candidate in op.candidates:
        assert candidate.supports(problem) is None
        y = poisoned(x.shape, "float16")
        candidate.prepare(problem)([a.ptr for a in device_inputs], [y.ptr], 0)
        assert_close(y.numpy(), expected, "float16", what=candidate.name)
    wide = Problem("layernorm", (TensorType((2, 2048), "float16"),) + (TensorType((2048,), "float16"),) * 2,
                   (TensorType((2, 2048), "float16"),), attrs)
    assert "cols <= 1024" in op.candidates[0].supports(wide)


@pytest.mark.gpu
def test_cuda_executor(rng):
    g = Graph("ln")
    x = g.input("x", ("batch", 256), "bfloat16")
    gamma, beta = (g.param(n, random_array(rng, (256,), "bfloat16")) for n in ("gamma", "beta"))
    g.output(g.layernorm(x, gamma, beta), "y")
    x_value = random_array(rng, (33, 256), "bfloat16")
    y = ge2.ExecutorV2(g, device="cuda").run({"x": x_value})["y"]
    assert_close(y, layernorm.reference(x_value, gamma.data, beta.data)[0], "bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16", "float32"))
def test_misaligned_torch_views_take_the_scalar_path(rng, dtype):
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    for rows, cols in ((5, 64), (3, 4096), (4, 1000)):
        storage = torch.randn(rows * cols + 1, device="cuda", dtype=tdtype)
        x = storage[1:].view(rows, cols)  # one element past a 256-byte boundary: not 16-byte aligned
        gstorage = torch.randn(cols + 1, device="cuda", dtype=tdtype)
        gamma, beta = gstorage[1:], torch.randn(cols, device="cuda", dtype=tdtype)
        y = layernorm.forward(x, gamma, beta)
        expected = layernorm.reference(*(t.float().cpu().numpy() for t in (x, gamma, beta)))[0]
        assert_close(y.float().cpu().numpy(), expected, dtype, what=f"y {rows}x{cols}")
        dy = torch.randn(rows, cols, device="cuda", dtype=tdtype)
        grads = layernorm.backward(dy, x, gamma, beta)
        expected = layernorm.reference_backward(*(t.float().cpu().numpy() for t in (dy, x, gamma)))
        for name, got, ref in zip(("dx", "dgamma", "dbeta"), grads, expected):
            assert_within(got.float().cpu().numpy(), ref, 4 * tolerance(dtype)[0] * np.sqrt(rows),
                           2 * tolerance(dtype)[1], f"{name} {rows}x{cols}")


@pytest.mark.gpu
def test_non_contiguous_input_is_rejected():
    torch = pytest.importorskip("torch")
    x = torch.randn(8, 16, device="cuda")[:, :8]
    gamma = torch.ones(8, device="cuda")
    with pytest.raises(ValueError, match=r"x: expected a contiguous row-major array"):
        layernorm.forward(x, gamma, gamma)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_interop_matches_torch(dtype):
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    x = torch.randn(64, 3, 768, device="cuda", dtype=tdtype, requires_grad=True)
    gamma = torch.randn(768, device="cuda", dtype=tdtype, requires_grad=True)
    beta = torch.randn(768, device="cuda", dtype=tdtype, requires_grad=True)
    y, mean, rstd = layernorm.forward(x.detach(), gamma.detach(), beta.detach(), save_stats=True)
    assert isinstance(y, torch.Tensor) and y.dtype == tdtype and y.shape == x.shape
    assert mean.dtype == torch.float32 and mean.shape == (192,)
    expected = torch.nn.functional.layer_norm(x, (768,), gamma, beta, 1e-5)
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(y, expected.detach(), atol=2 * atol, rtol=2 * rtol)
    torch.testing.assert_close(rstd, torch.rsqrt(x.detach().float().var(-1, unbiased=False) + 1e-5).reshape(-1),
                               atol=1e-4, rtol=1e-4)
    dy = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (x, gamma, beta), dy)
    grads = layernorm.backward(dy, x.detach(), gamma.detach(), beta.detach(), mean=mean, rstd=rstd)
    for name, got, ref in zip(("dx", "dgamma", "dbeta"), grads, expected_grads):
        assert isinstance(got, torch.Tensor) and got.dtype == tdtype
        scale = float(ref.float().abs().max())
        torch.testing.assert_close(got.float(), ref.float(), atol=4 * rtol * scale, rtol=4 * rtol, msg=name)


@pytest.mark.gpu
def test_streams(rng, to_device):
    runtime = ge2.device.runtime()
    stream = runtime.Stream()
    x, gamma, beta = inputs(rng, (256, 512), "float16")
    args = [to_device(a) for a in (x, gamma, beta)]
    y = layernorm.forward(*args, stream=stream)
    grads = layernorm.backward(args[0], args[0], args[1], args[2], stream=stream)
    stream.synchronize()
    assert_close(y.numpy(), layernorm.reference(x, gamma, beta)[0], "float16")
    assert_close(grads[2].numpy(), layernorm.reference_backward(x, x, gamma)[2], "float16", 256)
