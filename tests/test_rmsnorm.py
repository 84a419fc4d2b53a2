"""rmsnorm: reference math, validation, OpDef and graph (CPU); every kernel x dtype x shape, backward, stability,
alignment, determinism and interop on the GPU."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir import Graph, TensorType
from graph_executor_v2.ops import rmsnorm
from graph_executor_v2.ops._base import Problem
from graph_executor_v2.testing import assert_close, random_array, tolerance
from row_norm_checks import (DTYPES, EDGE_SHAPES, KERNELS, assert_within, inputs, kernel_sweep_tests, numeric_gradient)

F32 = np.float32


# ---------------------------------------------------------------------------------------------------------------
# CPU: reference against closed forms and finite differences
# ---------------------------------------------------------------------------------------------------------------
def test_reference_closed_form():
    x = np.array([[3.0, 4.0], [-2.0, -2.0], [0.0, 0.0]])
    gamma = np.array([2.0, -1.0])
    y, rstd = rmsnorm.reference(x, gamma, eps=1e-6)
    np.testing.assert_allclose(rstd, [1 / np.sqrt(12.5 + 1e-6), 1 / np.sqrt(4 + 1e-6), 1 / np.sqrt(1e-6)])
    np.testing.assert_allclose(y[0], x[0] / np.sqrt(12.5 + 1e-6) * gamma)
    np.testing.assert_allclose(y[1], -gamma, rtol=1e-6)  # a constant row c normalizes to sign(c)
    np.testing.assert_array_equal(y[2], 0.0)  # and a zero row stays zero


def test_reference_is_scale_invariant(rng):
    x, gamma = rng.standard_normal((2, 3, 16)), rng.standard_normal(16)
    y, _ = rmsnorm.reference(x, gamma, eps=0.0)
    np.testing.assert_allclose(rmsnorm.reference(5.0 * x, gamma, eps=0.0)[0], y, atol=1e-12)
    assert y.shape == x.shape


def test_reference_backward_closed_forms(rng):
    x, dy, gamma = rng.standard_normal((6, 9)), rng.standard_normal((6, 9)), rng.standard_normal(9)
    dx, dgamma = rmsnorm.reference_backward(dy, x, gamma, eps=0.0)
    rstd = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True))
    np.testing.assert_allclose(dgamma, (dy * x * rstd).sum(axis=0))
    np.testing.assert_allclose((dx * x).sum(axis=-1), 0.0, atol=1e-12)  # y does not change when x scales


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4), (4, 1)])
def test_reference_backward_matches_finite_differences(rng, shape):
    x, dy, gamma = rng.standard_normal(shape), rng.standard_normal(shape), rng.standard_normal(shape[-1])
    eps = 1e-3
    dx, dgamma = rmsnorm.reference_backward(dy, x, gamma, eps)

    def loss():
        return float((rmsnorm.reference(x, gamma, eps)[0] * dy).sum())

    for name, analytic, array in (("dx", dx, x), ("dgamma", dgamma, gamma)):
        np.testing.assert_allclose(analytic, numeric_gradient(loss, array), rtol=1e-5, atol=1e-7, err_msg=name)


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation before any device work
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(4, F32)), ValueError,
         r"gamma: expected shape \(3,\) \(the last axis of x\), got float32\[4\]"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones((3, 1), F32)), ValueError, r"gamma: expected shape \(3,\)"),
        (dict(x=np.ones((2, 3), np.float16), gamma=np.ones(3, F32)), TypeError,
         r"gamma: expected dtype float16 \(the dtype of x\), got float32"),
        (dict(x=np.ones((2, 3), np.int64), gamma=np.ones(3, np.int64)), TypeError,
         r"x: expected dtype float32, float16 or bfloat16, got int64"),
        (dict(x=np.array(1.0, F32), gamma=np.ones(1, F32)), ValueError, r"x: expected at least 1 dimension"),
        (dict(x=np.ones((4, 0), F32), gamma=np.ones(0, F32)), ValueError,
         r"x: the last \(normalized\) axis needs at least 1 element"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), eps=0.0), ValueError, r"'eps' must be a finite value > 0"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), eps=float("inf")), ValueError,
         r"'eps' must be a finite value > 0"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), eps=True), TypeError,
         r"attribute 'eps' expected float, got bool"),
        (dict(x=np.ones((2, 3), F32), gamma=np.ones(3, F32), kernel="warp"), ValueError,
         r"kernel: expected one of auto, warp_per_row, block_per_row, multipass"),
        (dict(x=np.ones((2, 3), F32), gamma=(1.0, 1.0, 1.0)), TypeError, r"gamma: expected a NumPy array"),
    ],
)
def test_forward_numpy_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        rmsnorm.forward_numpy(**kwargs)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(dy=np.ones((2, 4), F32)), ValueError, r"dy: expected shape \(2, 3\) \(the output's\), got \(2, 4\)"),
        (dict(dy=np.ones((2, 3), np.float16)), TypeError, r"dy: expected dtype float32 \(the output's\)"),
        (dict(gamma=np.ones(3, np.float16)), TypeError, r"gamma: expected dtype float32"),
        (dict(rstd=np.ones((2, 1), F32)), ValueError, r"rstd: expected shape \(2,\) \(one float32 per row of x\)"),
        (dict(rstd=np.ones(2, np.float16)), TypeError, r"rstd: expected dtype float32, got float16"),
        (dict(eps=-1.0), ValueError, r"'eps' must be a finite value > 0"),
    ],
)
def test_backward_numpy_rejects_bad_arguments(kwargs, error, match):
    arguments = dict(dy=np.ones((2, 3), F32), x=np.ones((2, 3), F32), gamma=np.ones(3, F32))
    arguments.update(kwargs)
    with pytest.raises(error, match=match):
        rmsnorm.backward_numpy(**arguments)


def test_forward_rejects_host_arrays_for_device_path():
    with pytest.raises(TypeError, match=r"x: expected a CUDA device array"):
        rmsnorm.forward(np.ones((2, 3), F32), np.ones(3, F32))


def test_no_gpu_is_a_clear_error():
    if ge2.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        rmsnorm.backward_numpy(np.ones((2, 3), F32), np.ones((2, 3), F32), np.ones(3, F32))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        rmsnorm.backward_workspace_bytes((2, 3), "bfloat16")


def test_kernels_and_limits_reported_by_the_native_module():
    if not ge2._native.is_built("_ops_rmsnorm"):
        pytest.skip("_ops_rmsnorm is not built")
    assert [k["name"] for k in rmsnorm.kernels()] == list(KERNELS)
    reason = rmsnorm._native_module().unsupported_reason
    assert reason("warp_per_row", 1024, "bfloat16", True, True) == ""
    assert "cols <= 1024 (backward)" in reason("warp_per_row", 1032, "bfloat16", True, True)
    assert reason("warp_per_row", 512, "bfloat16", False, True) == ""
    assert "cols <= 512 (backward, scalar loads)" in reason("warp_per_row", 513, "bfloat16", True, True)
    assert reason("block_per_row", 32768, "float32", True, False) == ""
    assert "cols <= 8192 (backward)" in reason("block_per_row", 8196, "float32", True, True)
    assert "cols <= 4096 (backward, scalar loads)" in reason("block_per_row", 4097, "float32", True, True)
    assert reason("multipass", 1 << 20, "float16", False, False) == ""


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(cols=-3), r"cols: expected >= 1"),
        (dict(dtype="uint8"), r"dtype: expected float32, float16 or bfloat16, got uint8"),
        (dict(dtype="float64"), r"dtype: expected one of"),
        (dict(eps=float("nan")), r"eps: expected a finite value > 0"),
        (dict(gamma=0), r"gamma: null device pointer"),
        (dict(x=0), r"x: null device pointer"),
        (dict(cols=40000, kernel="block_per_row"), r"kernel: 'block_per_row' cannot run this problem: .*32768"),
    ],
)
def test_native_forward_checks_arguments_before_any_device_work(changes, match):
    """Every case fails before a launch (the addresses are not real), so this needs no GPU."""
    if not ge2._native.is_built("_ops_rmsnorm"):
        pytest.skip("_ops_rmsnorm is not built")
    args = dict(x=256, gamma=512, beta=0, y=1024, mean=0, rstd=0, rows=4, cols=64, dtype="bfloat16", eps=1e-6,
                kernel="warp_per_row", stream=0)
    args.update(changes)
    with pytest.raises(ValueError, match=match):
        rmsnorm._native_module().forward(**args)


def test_native_backward_checks_arguments_before_any_device_work():
    if not ge2._native.is_built("_ops_rmsnorm"):
        pytest.skip("_ops_rmsnorm is not built")
    backward = rmsnorm._native_module().backward
    with pytest.raises(ValueError, match=r"dgamma: null device pointer"):
        backward(256, 256, 512, 0, 0, 256, 0, 0, 256, 4, 2, 64, "float32", 1e-6, "warp_per_row", 0)
    with pytest.raises(ValueError, match=r"dx: null device pointer"):
        backward(256, 256, 512, 0, 0, 0, 512, 0, 256, 4, 2, 64, "float32", 1e-6, "warp_per_row", 0)
    with pytest.raises(ValueError, match=r"kernel: 'warp_per_row' cannot run this problem: .*cols <= 512"):
        backward(256, 256, 512, 0, 0, 256, 512, 0, 256, 4, 2, 513, "float32", 1e-6, "warp_per_row", 0)


# ---------------------------------------------------------------------------------------------------------------
# CPU: the op definition, the graph builder and the CPU backend
# ---------------------------------------------------------------------------------------------------------------
def test_opdef_infers_and_validates():
    op = ge2.ops.OPS["rmsnorm"]
    assert [i.name for i in op.inputs] == ["x", "gamma"] and op.outputs == ("y",)
    attrs = op.validate_attrs({}, "node rms0")
    assert attrs == {"eps": 1e-6}
    assert op.infer([TensorType((3, 7), "float16"), TensorType((7,), "float16")], attrs) == \
        [TensorType((3, 7), "float16")]
    assert op.infer([TensorType(("b", "s", 64), "bfloat16"), TensorType((64,), "bfloat16")], attrs) == \
        [TensorType(("b", "s", 64), "bfloat16")]
    with pytest.raises(ValueError, match=r"gamma: expected shape \(7,\)"):
        op.infer([TensorType((3, 7), "float16"), TensorType((3, 7), "float16")], attrs)
    with pytest.raises(TypeError, match=r"gamma: expected dtype float16"):
        op.infer([TensorType((3, 7), "float16"), TensorType((7,), "bfloat16")], attrs)
    with pytest.raises(TypeError, match=r"x: expected dtype float32, float16 or bfloat16, got int32"):
        op.infer([TensorType((3, 7), "int32"), TensorType((7,), "int32")], attrs)
    with pytest.raises(ValueError, match=r"input 'gamma' is required"):
        op.infer([TensorType((3, 7), "float32"), None], attrs)
    with pytest.raises(ValueError, match=r"attribute 'eps' must be a finite value > 0"):
        op.validate_attrs({"eps": 0.0}, "node rms0")


def test_run_reference_and_reference_backward(rng):
    op = ge2.ops.OPS["rmsnorm"]
    x, gamma = random_array(rng, (4, 6), "bfloat16"), random_array(rng, (6,), "bfloat16")
    attrs = op.validate_attrs({"eps": 1e-2}, "node")
    (y,) = op.run_reference([x, gamma], attrs)
    assert y.dtype == ge2.dtypes.to_numpy("bfloat16") and y.shape == (4, 6)
    assert_close(y, rmsnorm.reference(x, gamma, 1e-2)[0], "bfloat16")
    dy = rng.standard_normal((4, 6))
    grads = op.reference_backward([x, gamma], [y], [dy], attrs)
    for got, expected in zip(grads, rmsnorm.reference_backward(dy, x, gamma, 1e-2)):
        np.testing.assert_array_equal(got, expected)


def test_graph_builder_and_cpu_executor(rng):
    g = Graph("rms")
    x = g.input("x", ("batch", 24), "float16")
    gamma = g.param("gamma", random_array(rng, (24,), "float16"))
    g.output(g.rmsnorm(x, gamma), "y")
    executor = ge2.ExecutorV2(g, device="cpu")
    for batch in (1, 5):
        x_value = random_array(rng, (batch, 24), "float16")
        y = executor.run({"x": x_value})["y"]
        assert y.dtype == np.float16 and y.shape == (batch, 24)
        assert_close(y, rmsnorm.reference(x_value, gamma.data)[0], "float16")
    with pytest.raises(ValueError, match="eps"):
        g.rmsnorm(x, gamma, eps=-1.0)


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _check_forward(rng, poisoned, to_device, shape, dtype, kernel, offset=0.0, eps=1e-6):
    x, gamma = inputs(rng, shape, dtype, offset, params=1)
    rows = int(np.prod(shape[:-1]))
    y, rstd = poisoned(shape, dtype), poisoned((rows,), "float32")
    result = rmsnorm.forward(to_device(x), to_device(gamma), eps=eps, save_stats=True, kernel=kernel, out=y,
                             rstd_out=rstd)
    assert result[0] is y and result[1] is rstd
    y_ref, rstd_ref = rmsnorm.reference(x, gamma, eps)
    what = f"{kernel} {dtype} {shape} offset={offset}"
    atol, rtol = tolerance(dtype)
    # No mean is subtracted, so a large offset costs nothing: the sum of squares is accurate to ~1e-7 relative.
    assert_within(y.numpy(), y_ref, atol, rtol, f"y {what}")
    assert_within(rstd.numpy(), rstd_ref, 0.0, 2e-5, f"rstd {what}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_auto_edge_shapes_and_large_values(rng, poisoned, to_device, dtype):
    for shape in EDGE_SHAPES:
        _check_forward(rng, poisoned, to_device, shape, dtype, "auto")
    for cols in (64, 4096, 65537):
        _check_forward(rng, poisoned, to_device, (6, cols), dtype, "auto", offset=1e3)


@pytest.mark.gpu
def test_forward_zero_rows_and_zero_row_values(to_device):
    x = ge2.device.runtime().DeviceArray.empty([0, 16], "bfloat16")
    gamma = to_device(np.ones(16, ge2.dtypes.to_numpy("bfloat16")))
    y, rstd = rmsnorm.forward(x, gamma, save_stats=True)
    assert y.shape == (0, 16) and rstd.shape == (0,)
    dx, dgamma = rmsnorm.backward(x, x, gamma)
    assert dx.shape == (0, 16)
    np.testing.assert_array_equal(dgamma.numpy().astype(np.float32), 0)
    zeros = to_device(np.zeros((3, 16), ge2.dtypes.to_numpy("bfloat16")))
    np.testing.assert_array_equal(rmsnorm.forward(zeros, gamma).numpy().astype(np.float32), 0)


@pytest.mark.gpu
def test_explicit_kernel_that_cannot_run_is_a_clear_error(to_device):
    x = to_device(np.ones((2, 1032), np.float32))
    gamma = to_device(np.ones(1032, np.float32))
    with pytest.raises(ValueError, match=r"kernel: 'warp_per_row' cannot run this problem: .*cols <= 1024"):
        rmsnorm.forward(x, gamma, kernel="warp_per_row")
    with pytest.raises(ValueError, match=r"kernel: 'warp_per_row' cannot run this problem"):
        rmsnorm.backward(x, x, gamma, kernel="warp_per_row")


def _check_backward(rng, poisoned, to_device, shape, dtype, kernel, saved_stats, eps=1e-6):
    x, gamma = inputs(rng, shape, dtype, params=1)
    dy = random_array(rng, shape, dtype)
    dx_ref, dgamma_ref = rmsnorm.reference_backward(dy, x, gamma, eps)
    x_d, gamma_d = to_device(x), to_device(gamma)
    rstd = rmsnorm.forward(x_d, gamma_d, eps=eps, save_stats=True)[1] if saved_stats else None
    cols, rows = shape[-1], int(np.prod(shape[:-1]))
    outs = poisoned(shape, dtype), poisoned((cols,), dtype)
    dx, dgamma = rmsnorm.backward(to_device(dy), x_d, gamma_d, eps=eps, kernel=kernel, out=outs, rstd=rstd)
    assert dx is outs[0] and dgamma is outs[1]
    what = f"{kernel} {dtype} {shape} saved_stats={saved_stats}"
    atol, rtol = tolerance(dtype)
    assert_within(dx.numpy(), dx_ref, 4 * atol, 2 * rtol, f"dx {what}")
    assert_close(dgamma.numpy(), dgamma_ref, dtype, rows, what=f"dgamma {what}")


(test_forward_every_kernel_dtype_and_length, test_backward_every_kernel_dtype_and_length,
 test_backward_many_rows_per_block, test_backward_large_many_rows_per_block) = kernel_sweep_tests(
    rmsnorm._native_module, _check_forward, _check_backward, channels=1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_auto_edge_shapes(rng, poisoned, to_device, dtype):
    for shape in EDGE_SHAPES:
        _check_backward(rng, poisoned, to_device, shape, dtype, "auto", saved_stats=False)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_backward_matches_finite_differences(rng, to_device, kernel):
    for shape in ((3, 5), (2, 2, 33)):
        x, gamma = (a.astype(np.float64) for a in inputs(rng, shape, "float32", params=1))
        dy = rng.standard_normal(shape)
        eps = 1e-3

        def loss():
            return float((rmsnorm.reference(x, gamma, eps)[0] * dy).sum())

        numeric = [numeric_gradient(loss, a) for a in (x, gamma)]
        grads = rmsnorm.backward(*(to_device(a.astype(F32)) for a in (dy, x, gamma)), eps=eps, kernel=kernel)
        for name, got, expected in zip(("dx", "dgamma"), grads, numeric):
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4, err_msg=f"{name} {shape}")


@pytest.mark.gpu
def test_backward_is_deterministic(rng, to_device):
    x, gamma = inputs(rng, (3001, 4096), "float16", params=1)
    dy = random_array(rng, (3001, 4096), "float16")
    args = [to_device(a) for a in (dy, x, gamma)]
    first = [g.numpy() for g in rmsnorm.backward(*args)]
    for _ in range(3):
        again = [g.numpy() for g in rmsnorm.backward(*args)]
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.gpu
def test_backward_workspace_argument(rng, to_device):
    x, gamma = inputs(rng, (40, 2000), "bfloat16", params=1)
    dy = random_array(rng, (40, 2000), "bfloat16")
    need = rmsnorm.backward_workspace_bytes((40, 2000), "bfloat16")
    assert need > 0 and need % (4 * 2000) == 0  # whole float32 rows of column sums
    runtime = ge2.device.runtime()
    args = [to_device(a) for a in (dy, x, gamma)]
    _, dgamma = rmsnorm.backward(*args, workspace=runtime.DeviceArray.empty([need // 4], "float32"))
    assert_close(dgamma.numpy(), rmsnorm.reference_backward(dy, x, gamma)[1], "bfloat16", 40)
    with pytest.raises(ValueError, match=r"workspace: this problem needs \d+ bytes"):
        rmsnorm.backward(*args, workspace=runtime.DeviceArray.empty([need // 4 - 1], "float32"))


@pytest.mark.gpu
def test_graph_candidates_launch(rng, poisoned, to_device):
    op = ge2.ops.OPS["rmsnorm"]
    x, gamma = inputs(rng, (3, 5, 1000), "bfloat16", params=1)
    attrs = op.validate_attrs({"eps": 1e-5}, "node")
    types = (TensorType(x.shape, "bfloat16"), TensorType(gamma.shape, "bfloat16"))
    problem = Problem("rmsnorm", types, tuple(op.infer(types, attrs)), attrs)
    inputs_d = [to_device(a) for a in (x, gamma)]
    expected = rmsnorm.reference(x, gamma, 1e-5)[0]
    assert [c.name for c in op.candidates] == list(KERNELS) and selection.candidates(op)[-1].always_works
    for candidate in op.candidates:
        assert candidate.supports(problem) is None
        y = poisoned(x.shape, "bfloat16")
        candidate.prepare(problem)([a.ptr for a in inputs_d], [y.ptr], 0)
        assert_close(y.numpy(), expected, "bfloat16", what=candidate.name)


@pytest.mark.gpu
def test_cuda_executor(rng):
    g = Graph("rms")
    x = g.input("x", ("batch", 4096), "float16")
    gamma = g.param("gamma", random_array(rng, (4096,), "float16"))
    g.output(g.rmsnorm(x, gamma, eps=1e-5), "y")
    x_value = random_array(rng, (9, 4096), "float16")
    y = ge2.ExecutorV2(g, device="cuda").run({"x": x_value})["y"]
    assert_close(y, rmsnorm.reference(x_value, gamma.data, 1e-5)[0], "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_torch_views_take_the_scalar_path(dtype):
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    for rows, cols in ((5, 64), (3, 4096), (2, 16384)):
        storage = torch.randn(rows * cols + 1, device="cuda", dtype=tdtype)
        x = storage[1:].view(rows, cols)  # one element off a 256-byte boundary: not 16-byte aligned
        gamma = torch.randn(cols + 1, device="cuda", dtype=tdtype)[1:]
        y = rmsnorm.forward(x, gamma)
        expected = rmsnorm.reference(*(t.float().cpu().numpy() for t in (x, gamma)))[0]
        assert_close(y.float().cpu().numpy(), expected, dtype, what=f"y {rows}x{cols}")
        dy = torch.randn(rows, cols, device="cuda", dtype=tdtype)
        dx, dgamma = rmsnorm.backward(dy, x, gamma)
        dx_ref, dgamma_ref = rmsnorm.reference_backward(*(t.float().cpu().numpy() for t in (dy, x, gamma)))
        atol, rtol = tolerance(dtype)
        assert_within(dx.float().cpu().numpy(), dx_ref, 4 * atol, 2 * rtol, f"dx {rows}x{cols}")
        assert_close(dgamma.float().cpu().numpy(), dgamma_ref, dtype, rows, what=f"dgamma {rows}x{cols}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_interop_matches_torch(dtype):
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    x = torch.randn(8, 16, 1024, device="cuda", dtype=tdtype, requires_grad=True)
    gamma = torch.randn(1024, device="cuda", dtype=tdtype, requires_grad=True)
    y, rstd = rmsnorm.forward(x.detach(), gamma.detach(), eps=1e-6, save_stats=True)
    assert isinstance(y, torch.Tensor) and y.dtype == tdtype and rstd.shape == (128,)
    if hasattr(torch.nn.functional, "rms_norm"):
        expected = torch.nn.functional.rms_norm(x, (1024,), gamma, 1e-6)
    else:
        expected = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.float()).to(tdtype)
    atol, rtol = tolerance(dtype)
    torch.testing.assert_close(y, expected.detach(), atol=2 * atol, rtol=2 * rtol)
    dy = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, (x, gamma), dy)
    grads = rmsnorm.backward(dy, x.detach(), gamma.detach(), eps=1e-6, rstd=rstd)
    for name, got, ref in zip(("dx", "dgamma"), grads, expected_grads):
        assert isinstance(got, torch.Tensor) and got.dtype == tdtype
        scale = float(ref.float().abs().max())
        torch.testing.assert_close(got.float(), ref.float(), atol=4 * rtol * scale, rtol=4 * rtol, msg=name)
