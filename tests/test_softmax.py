"""softmax / log_softmax: reference math, validation, OpDef and graphs (CPU); every op x dtype x kernel x shape,
any axis, backward, large logits, masks, alignment, determinism and interop on the GPU."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir import Graph, TensorType
from graph_executor_v2.ops import softmax
from graph_executor_v2.ops._base import Problem
from graph_executor_v2.testing import assert_close, random_array
from row_norm_checks import numeric_gradient

OPS = ("softmax", "log_softmax")
DTYPES = ("float32", "float16", "bfloat16")
KERNELS = ("warp_row", "block_row", "block_row_two_pass", "strided")
F32 = np.float32

# Last-axis lengths that reach every path: one element, sub-warp groups (1..16 lanes), odd and non-multiple-of-8
# lengths (scalar accesses), the warp_row limit (1024) and one past it, block_row widths, its limits (8192
# backward, 16384 forward) and one past them, rows longer than any block (10000, 65537).
ROW_LENGTHS = (1, 2, 7, 8, 24, 33, 100, 256, 1000, 1024, 1025, 4096, 5000, 8192, 8193, 10000, 16384, 16385, 65537)


def _rows_for(n):
    return 37 if n <= 1024 else (5 if n <= 16385 else 2)  # uneven shares of rows per block, quick references


def _supported(kernel, n, inner, backward):
    if kernel == "strided":
        return True
    if inner != 1:
        return False
    limit = {"warp_row": 1024, "block_row": 8192 if backward else 16384, "block_row_two_pass": None}[kernel]
    return limit is None or n <= limit


# ---------------------------------------------------------------------------------------------------------------
# CPU: reference against closed forms and finite differences
# ---------------------------------------------------------------------------------------------------------------
def test_reference_closed_form():
    x = np.log(np.array([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]))
    np.testing.assert_allclose(softmax.reference("softmax", x), [[1 / 6, 2 / 6, 3 / 6], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(softmax.reference("log_softmax", x),
                               np.log([[1 / 6, 2 / 6, 3 / 6], [1 / 3, 1 / 3, 1 / 3]]))
    # axis 0 of x is the last axis of x.T
    np.testing.assert_allclose(softmax.reference("softmax", x, axis=0), softmax.reference("softmax", x.T).T)


def test_reference_is_safe_for_large_logits_and_masks():
    x = np.array([1e4, 1e4 + np.log(3.0)])
    np.testing.assert_allclose(softmax.reference("softmax", x), [0.25, 0.75])
    np.testing.assert_allclose(softmax.reference("log_softmax", x), np.log([0.25, 0.75]))
    masked = np.array([[-np.inf, 0.0, 0.0], [-np.inf, -np.inf, -np.inf]])
    y = softmax.reference("softmax", masked)
    np.testing.assert_array_equal(y[0], [0.0, 0.5, 0.5])
    assert np.isnan(y[1]).all()  # a fully masked row has no distribution
    log_y = softmax.reference("log_softmax", masked)
    np.testing.assert_allclose(log_y[0], [-np.inf, -np.log(2.0), -np.log(2.0)])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, axis", [((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1), ((4, 1), -1), ((6,), 0)])
def test_reference_backward_matches_finite_differences(rng, op, shape, axis):
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    dx = softmax.reference_backward(op, dy, softmax.reference(op, x, axis), axis)
    numeric = numeric_gradient(lambda: float((softmax.reference(op, x, axis) * dy).sum()), x)
    np.testing.assert_allclose(dx, numeric, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation before any device work
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (("softmax", np.ones((2, 3), F32)), dict(axis=2), ValueError, r"axis: expected an int in \[-2, 2\).*got 2"),
        (("log_softmax", np.ones((2, 3), F32)), dict(axis=-3), ValueError, r"axis: expected an int in \[-2, 2\)"),
        (("softmax", np.ones((2, 3), F32)), dict(axis=1.0), TypeError, r"attribute 'axis' expected int, got float"),
        (("softmax", np.ones((2, 3), F32)), dict(axis=True), TypeError, r"attribute 'axis' expected int, got bool"),
        (("softmax", np.ones((2, 3), F32)), dict(axis=None), TypeError, r"attribute 'axis' expected int, got NoneType"),
        (("softmax", np.ones((), F32)), {}, ValueError, r"x: softmax needs an array of at least 1"),
        (("softmax", np.ones((2, 3), np.int32)), {}, TypeError, r"x: expected dtype float32, float16 or bfloat16"),
        (("softmax", [[1.0, 2.0]]), {}, TypeError, r"x: expected a NumPy array, got list"),
        (("softmax", np.ones((2, 3), F32)), dict(kernel="fastest"), ValueError, r"kernel: expected one of auto"),
    ],
)
def test_forward_numpy_rejects_bad_arguments(args, kwargs, error, match):
    op, *arrays = args
    with pytest.raises(error, match=match):
        getattr(ge2.ops, op).forward_numpy(*arrays, **kwargs)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (("softmax", np.ones((2, 3), F32), np.ones((3, 2), F32)), {}, ValueError,
         r"dy: expected shape \(3, 2\) \(the output's\), got \(2, 3\)"),
        (("softmax", np.ones((2, 3), np.float16), np.ones((2, 3), F32)), {}, TypeError,
         r"dy: expected dtype float32 \(the output's\), got float16"),
        (("log_softmax", np.ones((2, 3), F32), np.ones((2, 3), F32)), dict(axis=5), ValueError, r"axis: expected"),
        (("softmax", np.ones((2, 3), F32), np.ones((2, 3), F32)), dict(y=[[1.0]]), TypeError,
         r"y: expected a NumPy array"),
        (("softmax", np.ones((2, 3), F32), [[1.0]]), {}, TypeError, r"x: expected a NumPy array"),
    ],
)
def test_backward_numpy_rejects_bad_arguments(args, kwargs, error, match):
    op, *arrays = args
    with pytest.raises(error, match=match):
        getattr(ge2.ops, op).backward_numpy(*arrays, **kwargs)


def test_device_path_rejects_host_arrays():
    with pytest.raises(TypeError, match=r"x: expected a CUDA device array"):
        softmax.forward(np.ones((2, 3), F32))
    with pytest.raises(TypeError, match=r"x: expected a CUDA device array"):
        ge2.ops.log_softmax.backward(np.ones((2, 3), F32), np.ones((2, 3), F32))


def test_no_gpu_is_a_clear_error():
    if ge2.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        softmax.forward_numpy(np.ones((2, 3), F32))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        ge2.ops.log_softmax.backward_numpy(np.ones((2, 3), F32), np.ones((2, 3), F32))


def test_layout_is_outer_n_inner():
    assert softmax.layout((2, 3, 4, 5), 1) == (2, 3, 20)
    assert softmax.layout((2, 3, 4, 5), -1) == (24, 5, 1)
    assert softmax.layout((7,), 0) == (1, 7, 1)
    assert softmax.layout((3, 0, 4), 0) == (1, 3, 0)


def test_kernels_report_constraints():
    if not ge2._native.is_built("_ops_softmax"):
        pytest.skip("_ops_softmax is not built")
    assert [k["name"] for k in softmax.kernels()] == list(KERNELS)
    assert all(k["constraints"] for k in softmax.kernels())
    native = softmax._native_module()
    assert "inner == 1" in native.unsupported_reason("warp_row", 8, 4, False)
    assert "n <= 1024" in native.unsupported_reason("warp_row", 1025, 1, False)
    assert "n <= 16384 (forward)" in native.unsupported_reason("block_row", 16385, 1, False)
    assert "n <= 8192 (backward)" in native.unsupported_reason("block_row", 8193, 1, True)
    assert native.unsupported_reason("block_row_two_pass", 10 ** 7, 1, True) == ""
    assert native.unsupported_reason("strided", 10 ** 7, 99, False) == ""
    with pytest.raises(ValueError, match="kernel: expected one of"):
        native.unsupported_reason("magic", 8, 1, False)


# ---------------------------------------------------------------------------------------------------------------
# CPU: op definitions and graphs
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
def test_opdef_infers_and_runs_reference(op):
    opdef = ge2.ops.OPS[op]
    attrs = opdef.validate_attrs({"axis": 0}, "node s0")
    assert opdef.infer([TensorType((4, 6), "bfloat16")], attrs) == [TensorType((4, 6), "bfloat16")]
    assert opdef.infer([TensorType(("batch", 6), "float16")], opdef.validate_attrs({}, "n")) == [
        TensorType(("batch", 6), "float16")]
    x = np.arange(24, dtype=np.float16).reshape(4, 6) / 8
    (y,) = opdef.run_reference([x], attrs)
    assert y.dtype == np.float16 and y.shape == (4, 6)
    np.testing.assert_allclose(y.astype(np.float64), softmax.reference(op, x, axis=0), rtol=1e-3, atol=1e-3)
    (dx,) = opdef.reference_backward([x], [y], [np.ones((4, 6))], attrs)
    np.testing.assert_allclose(dx, softmax.reference_backward(op, np.ones((4, 6)), softmax.reference(op, x, 0), 0))


def test_opdef_rejects_bad_inputs_at_graph_build():
    g = Graph("g")
    x = g.input("x", (4, 6), "float32")
    with pytest.raises(ValueError, match=r"node 'softmax_0' \(softmax\).*axis: expected an int in \[-2, 2\)"):
        g.softmax(x, axis=2)
    with pytest.raises(TypeError, match=r"attribute 'axis' expected int"):
        g.log_softmax(x, axis=(0,))
    with pytest.raises(TypeError, match=r"x: expected dtype float32, float16 or bfloat16, got int32"):
        g.softmax(g.input("ids", (4,), "int32"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_graph_runs_on_cpu_executor(rng, dtype):
    g = Graph("probabilities")
    x = g.input("x", ("batch", 5, 7), dtype)
    g.output(g.softmax(x, axis=1), "p")
    g.output(g.log_softmax(x), "logp")
    feeds = {"x": random_array(rng, (3, 5, 7), dtype, 3.0)}
    result = ge2.ExecutorV2(g, device="cpu").run(feeds)
    assert_close(result["p"], softmax.reference("softmax", feeds["x"], axis=1), dtype, what="p")
    assert_close(result["logp"], softmax.reference("log_softmax", feeds["x"]), dtype, what="logp")
    assert result["p"].dtype == feeds["x"].dtype


def test_candidates_cover_every_problem():
    for op in OPS:
        candidates = selection.candidates(ge2.ops.OPS[op])
        assert [c.name for c in candidates] == list(KERNELS)
        assert [c.name for c in candidates if c.always_works] == ["strided"]
    if not ge2._native.is_built("_ops_softmax"):
        return
    def problem(shape, axis):
        t = TensorType(shape, "float16")
        return Problem("softmax", (t,), (t,), {"axis": axis})

    supports = {c.name: c.supports for c in ge2.ops.OPS["softmax"].candidates}
    assert supports["warp_row"](problem((8, 1024), -1)) is None
    assert "n <= 1024" in supports["warp_row"](problem((8, 1025), -1))
    assert "inner == 1" in supports["block_row"](problem((8, 16, 4), 1))
    assert supports["strided"](problem((8, 16, 4), 0)) is None


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _forward(op, x, axis, kernel, poisoned):
    """GPU forward into a NaN-poisoned output, returned as a host array."""
    device_x = ge2.device.runtime().DeviceArray.from_numpy(np.ascontiguousarray(x))
    out = poisoned(x.shape, ge2.dtypes.normalize(x.dtype))
    getattr(ge2.ops, op).forward(device_x, axis=axis, kernel=kernel, out=out)
    return out.numpy()


def _backward(op, dy, y, axis, kernel, poisoned):
    """GPU backward from the saved forward output y (x, only read for its shape and dtype, is y itself)."""
    runtime = ge2.device.runtime()
    out = poisoned(y.shape, ge2.dtypes.normalize(y.dtype))
    device_y = runtime.DeviceArray.from_numpy(y)
    (dx,) = getattr(ge2.ops, op).backward(runtime.DeviceArray.from_numpy(dy), device_y, axis=axis, kernel=kernel,
                                          out=out, y=device_y)
    assert dx is out
    return out.numpy()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_forward_every_row_length(rng, poisoned, op, dtype, kernel):
    for n in ROW_LENGTHS:
        x = random_array(rng, (_rows_for(n), n), dtype, 2.0)
        if not _supported(kernel, n, 1, False):
            with pytest.raises(ValueError, match=f"kernel: '{kernel}' cannot run this problem"):
                _forward(op, x, -1, kernel, poisoned)
            continue
        y = _forward(op, x, -1, kernel, poisoned)
        assert_close(y, softmax.reference(op, x), dtype, what=f"{op} {kernel} n={n}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_backward_every_row_length(rng, poisoned, op, dtype, kernel):
    for n in ROW_LENGTHS:
        shape = (_rows_for(n), n)
        y = softmax.reference(op, random_array(rng, shape, dtype, 2.0)).astype(ge2.dtypes.to_numpy(dtype))
        dy = random_array(rng, shape, dtype)
        if not _supported(kernel, n, 1, True):
            with pytest.raises(ValueError, match=f"kernel: '{kernel}' cannot run this problem"):
                _backward(op, dy, y, -1, kernel, poisoned)
            continue
        dx = _backward(op, dy, y, -1, kernel, poisoned)
        assert_close(dx, softmax.reference_backward(op, dy, y), dtype, n, what=f"{op} {kernel} n={n}")


# Shapes and axes for the strided path: every axis of 1-d..4-d arrays, inner widths below and above a warp tile,
# size-1 axes, odd extents, a long axis with few columns and a short one with many.
AXIS_CASES = [((6,), 0), ((4, 5), 0), ((3, 4, 5), 0), ((3, 4, 5), 1), ((3, 4, 5), -3), ((2, 3, 4, 5), 2),
              ((7, 1, 9), 1), ((1, 9, 1), 1), ((5, 33, 3), 1), ((2, 1000, 2), 1), ((3000, 7), 0), ((9, 40, 130), 1),
              ((4, 3, 64, 17), 1), ((1, 2, 1), 0)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_any_axis_forward_and_backward(rng, poisoned, op, dtype):
    for shape, axis in AXIS_CASES:
        x = random_array(rng, shape, dtype, 2.0)
        inner = int(np.prod(shape[axis % len(shape) + 1:]))
        kernels = ("auto", "strided") if inner != 1 else ("auto", "strided", "block_row_two_pass")
        for kernel in kernels:
            y = _forward(op, x, axis, kernel, poisoned)
            assert_close(y, softmax.reference(op, x, axis), dtype, what=f"{op} {shape} axis={axis} {kernel}")
            dy = random_array(rng, shape, dtype)
            dx = _backward(op, dy, y, axis, kernel, poisoned)
            assert_close(dx, softmax.reference_backward(op, dy, y, axis), dtype, shape[axis],
                         what=f"d{op} {shape} axis={axis} {kernel}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, axis", [((3, 5), -1), ((4, 3, 2), 1), ((2, 40), -1), ((33, 2), 0)])
def test_backward_against_finite_differences(rng, op, shape, axis):
    x = rng.standard_normal(shape).astype(F32)
    dy = rng.standard_normal(shape).astype(F32)
    y = getattr(ge2.ops, op).forward_numpy(x, axis=axis)
    (dx,) = getattr(ge2.ops, op).backward_numpy(dy, x, axis=axis, y=y)
    (recomputed,) = getattr(ge2.ops, op).backward_numpy(dy, x, axis=axis)  # y recomputed from x
    np.testing.assert_array_equal(dx, recomputed)
    x64 = x.astype(np.float64)
    numeric = numeric_gradient(lambda: float((softmax.reference(op, x64, axis) * dy).sum()), x64)
    assert_close(dx, numeric, "float32", shape[axis], what=f"d{op} vs central differences")
    assert_close(dx, softmax.reference_backward(op, dy, softmax.reference(op, x, axis), axis), "float32",
                 shape[axis], what=f"d{op} vs reference_backward")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_large_logits_stay_finite(rng, poisoned, op, dtype):
    for n, axis in ((64, -1), (1000, -1), (4096, -1), (20000, -1), (300, 0)):
        shape = (n, 3) if axis == 0 else (3, n)
        x = (1e4 + rng.standard_normal(shape) * 5.0).astype(ge2.dtypes.to_numpy(dtype))
        x[0, 0] = -1e4  # a huge spread in the same slice
        y = _forward(op, x, axis, "auto", poisoned)
        assert np.isfinite(y.astype(np.float64)).all(), f"{op} n={n}: non-finite output for logits ~1e4"
        assert_close(y, softmax.reference(op, x, axis), dtype, what=f"{op} logits ~1e4 n={n} axis={axis}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_masked_rows(rng, poisoned, op, kernel):
    n = 1000 if kernel != "block_row_two_pass" else 20000
    x = rng.standard_normal((6, n)).astype(F32)
    x[0, : n // 2] = -np.inf  # a leading masked run (the online statistics start at -inf)
    x[1, 1::2] = -np.inf
    x[2, :] = -np.inf  # fully masked: NaN, as the reference
    x[3, -1] = np.nan  # NaN poisons its row
    y = _forward(op, x, -1, kernel, poisoned)
    expected = softmax.reference(op, x)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected), err_msg=f"{op} {kernel}: NaN positions")
    np.testing.assert_array_equal(np.isneginf(y), np.isneginf(expected), err_msg=f"{op} {kernel}: -inf positions")
    finite = np.isfinite(expected)
    assert_close(y[finite], expected[finite], "float32", what=f"{op} {kernel} masked rows")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_size_one_axes(poisoned, op, dtype):
    x = np.full((5, 1), 3.0, dtype=ge2.dtypes.to_numpy(dtype))
    for kernel in KERNELS:
        y = _forward(op, x, -1, kernel, poisoned)
        np.testing.assert_array_equal(y.astype(np.float64), 1.0 if op == "softmax" else 0.0)
        dx = _backward(op, np.ones_like(x), y, -1, kernel, poisoned)
        np.testing.assert_array_equal(dx.astype(np.float64), 0.0)  # a distribution over one element is constant


@pytest.mark.gpu
def test_empty_arrays_launch_nothing():
    runtime = ge2.device.runtime()
    for shape, axis in (((0, 5), -1), ((3, 0), -1), ((3, 0, 4), 0)):
        x = runtime.DeviceArray.empty(list(shape), "float16")
        y = softmax.forward(x, axis=axis)
        assert y.shape == shape
        assert ge2.ops.log_softmax.backward(y, x, axis=axis, y=y)[0].shape == shape


def test_selector_picks_the_kernel_for_the_shape():
    """The order the C++ chain had: warp_row, block_row, block_row_two_pass on the last axis, else strided."""
    picks = {
        (2, 1000, 1): "warp_row", (2, 4096, 1): "block_row", (2, 16385, 1): "block_row_two_pass",
        (2, 100, 3): "strided",
    }
    for (outer, n, inner), expected in picks.items():
        shape = (outer, n, inner) if inner != 1 else (outer, n)
        problem = Problem("softmax", (TensorType(shape, "float16"),), (TensorType(shape, "float16"),), {"axis": 1})
        assert selection.rank(softmax.SOFTMAX, problem).viable[0].name == expected
    assert softmax._backward_kernel("auto", 8192, 1, "float16") == "block_row"
    assert softmax._backward_kernel("auto", 8193, 1, "float16") == "block_row_two_pass"
    assert softmax._backward_kernel("auto", 100, 3, "float16") == "strided"
    with pytest.raises(ValueError, match="kernel: 'block_row' cannot run this problem: block_row holds a row"):
        softmax._backward_kernel("block_row", 8193, 1, "float16")
    with pytest.raises(ValueError, match="kernel: expected one of warp_row"):  # the selector chooses, not C++
        softmax._native_module().unsupported_reason("auto", 8, 1, False)


@pytest.mark.gpu
def test_native_calls_check_the_named_kernel():
    runtime = ge2.device.runtime()
    native = softmax._native_module()
    x, y = (runtime.DeviceArray.from_numpy(np.zeros((2, 40000), np.float16)) for _ in range(2))
    assert native.forward("softmax", x.ptr, y.ptr, 2, 1000, 1, "float16", "warp_row", 0) == "warp_row"
    with pytest.raises(ValueError, match="y: null device pointer"):
        native.forward("softmax", x.ptr, 0, 2, 8, 1, "float16", "warp_row", 0)
    with pytest.raises(ValueError, match=r"kernel: 'warp_row' cannot run this problem"):
        native.forward("softmax", x.ptr, y.ptr, 2, 8, 3, "float16", "warp_row", 0)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_results_are_deterministic(rng, kernel):
    n = 20000 if kernel == "block_row_two_pass" else 1000
    x = random_array(rng, (64, n), "float32", 3.0)
    dy = random_array(rng, (64, n), "float32")
    first = softmax.forward_numpy(x, kernel=kernel)
    assert np.array_equal(first, softmax.forward_numpy(x, kernel=kernel))
    (dx,) = softmax.backward_numpy(dy, x, kernel=kernel, y=first)
    assert np.array_equal(dx, softmax.backward_numpy(dy, x, kernel=kernel, y=first)[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16", "float32"))
def test_misaligned_views_and_torch_interop(dtype):
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    for n in (8, 1000, 4096, 20000):
        rows = 6
        storage = torch.randn(rows * n + 1, device="cuda", dtype=tdtype) * 3
        x = storage[1:].view(rows, n)  # contiguous but one element off 16-byte alignment: scalar accesses
        out_storage = torch.full((rows * n + 1,), float("nan"), device="cuda", dtype=tdtype)
        out = out_storage[1:].view(rows, n)
        for op, reference in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
            result = getattr(ge2.ops, op).forward(x, out=out)
            assert result is out
            expected = reference(x.float(), -1)
            assert_close(out.float().cpu().numpy(), expected.cpu().numpy(), dtype, what=f"{op} misaligned n={n}")
    x = torch.randn(4, 7, 9, device="cuda", dtype=tdtype, requires_grad=True)
    for op, function in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
        for axis in (0, 1, 2):
            y = getattr(ge2.ops, op).forward(x.detach(), axis=axis, stream=torch.cuda.current_stream())
            assert isinstance(y, torch.Tensor) and y.dtype == tdtype and y.shape == x.shape
            reference = function(x.float(), axis)
            assert_close(y.float().cpu().numpy(), reference.detach().cpu().numpy(), dtype, what=f"{op} axis={axis}")
            dy = torch.randn_like(x)
            (grad,) = torch.autograd.grad(reference, x, dy.float())
            (dx,) = getattr(ge2.ops, op).backward(dy, x.detach(), axis=axis, y=y)
            assert isinstance(dx, torch.Tensor)
            assert_close(dx.float().cpu().numpy(), grad.float().cpu().numpy(), dtype, 9,
                         what=f"d{op} axis={axis} vs torch autograd")
    with pytest.raises(ValueError, match=r"x: expected a contiguous"):
        softmax.forward(torch.randn(8, 8, device="cuda").t())


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_large_fp16_rows_match_torch(op):
    torch = pytest.importorskip("torch")
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.float16) * 4
    y = getattr(ge2.ops, op).forward(x)
    expected = (torch.softmax if op == "softmax" else torch.log_softmax)(x.float(), -1)
    torch.testing.assert_close(y.float(), expected, rtol=2e-3, atol=1e-3)
    dy = torch.randn_like(x)
    (dx,) = getattr(ge2.ops, op).backward(dy, x, y=y)
    y_ = y.float().requires_grad_()
    if op == "softmax":
        grad = y_ * (dy.float() - (dy.float() * y_).sum(-1, keepdim=True))
    else:
        grad = dy.float() - torch.exp(y_) * dy.float().sum(-1, keepdim=True)
    torch.testing.assert_close(dx.float(), grad.detach(), rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
def test_graph_runs_on_cuda_executor(rng):
    g = Graph("attention_probs")
    x = g.input("x", (8, 4, 300), "float16")
    g.output(g.softmax(x), "p")
    g.output(g.log_softmax(x, axis=1), "logp")
    feeds = {"x": random_array(rng, (8, 4, 300), "float16", 3.0)}
    executor = ge2.ExecutorV2(g, device="cuda", autotune=False)  # the priority order is what this test pins
    result = executor.run(feeds)
    assert_close(result["p"], softmax.reference("softmax", feeds["x"]), "float16", what="p")
    assert_close(result["logp"], softmax.reference("log_softmax", feeds["x"], axis=1), "float16", what="logp")
    kernels = {s.op: s.kernel for plan in executor.plans for s in plan.selections}
    assert kernels == {"softmax": "warp_row", "log_softmax": "strided"}


@pytest.mark.gpu
def test_replays_in_a_cuda_graph(rng):
    runtime = ge2.device.runtime()
    stream = runtime.Stream()
    x = runtime.DeviceArray.from_numpy(random_array(rng, (64, 3000), "float16"))
    y, dx = runtime.DeviceArray.empty([64, 3000], "float16"), runtime.DeviceArray.empty([64, 3000], "float16")

    def run():
        softmax.forward(x, out=y, stream=stream)
        softmax.backward(x, x, out=dx, stream=stream, y=y)

    run()
    stream.synchronize()
    graph = runtime.CudaGraph()
    graph.begin_capture(stream.handle)
    run()
    graph.end_capture()
    new_x = random_array(rng, (64, 3000), "float16", 2.0)
    x.copy_from_numpy(new_x)
    y.poison(stream.handle)
    dx.poison(stream.handle)
    graph.replay(stream.handle)
    stream.synchronize()
    y_ref = softmax.reference("softmax", new_x)
    assert_close(y.numpy(), y_ref, "float16", what="captured softmax")
    assert_close(dx.numpy(), softmax.reference_backward("softmax", new_x, y.numpy()), "float16", 3000,
                 what="captured softmax backward")
