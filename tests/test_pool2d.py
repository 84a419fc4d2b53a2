"""max_pool2d, avg_pool2d, global_avg_pool: references against direct loops and finite differences, output sizes,
validation, graph inference and grad rules (CPU); every attribute x layout x dtype on the GPU against the float64
reference, with poisoned outputs, and against PyTorch where it is importable."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ir import Graph
from graph_executor_v2.ops import OPS, avg_pool2d, global_avg_pool, max_pool2d, pool2d
from graph_executor_v2.testing import assert_close, random_array
from row_norm_checks import numeric_gradient

F32 = np.float32
DTYPES = ("float32", "float16", "bfloat16")


def to_layout(x_nchw: np.ndarray, layout: str) -> np.ndarray:
    return x_nchw if layout == "NCHW" else np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1))


def loop_pool(x, mode, kernel, stride, padding, dilation=(1, 1), ceil_mode=False, count_include_pad=True):
    """Direct loops over an NCHW float64 array: (y, argmax) (argmax -1 for avg)."""
    n_, c_, h_, w_ = x.shape
    window = pool2d.check_window(x.shape, None, kernel, stride, padding, dilation, ceil_mode, count_include_pad)
    y = np.zeros((n_, c_, window.out_height, window.out_width))
    argmax = np.full(y.shape, -1, dtype=np.int64)
    for n, c, oh, ow in np.ndindex(*y.shape):
        h0, w0 = oh * stride[0] - padding[0], ow * stride[1] - padding[1]
        taps = [(h0 + i * dilation[0], w0 + j * dilation[1]) for i in range(kernel[0]) for j in range(kernel[1])]
        inside = [(h, w) for h, w in taps if 0 <= h < h_ and 0 <= w < w_]
        if mode == "max":
            values = [x[n, c, h, w] for h, w in inside]
            best = int(np.argmax(values))  # first maximum (no NaN here)
            y[n, c, oh, ow], argmax[n, c, oh, ow] = values[best], inside[best][0] * w_ + inside[best][1]
        else:
            h1, w1 = min(h0 + kernel[0], h_ + padding[0]), min(w0 + kernel[1], w_ + padding[1])
            divisor = (h1 - h0) * (w1 - w0) if count_include_pad else len(inside)
            y[n, c, oh, ow] = sum(x[n, c, h, w] for h, w in inside) / divisor
    return y, argmax


# (kernel, stride, padding, dilation, ceil_mode): 1x1, 2x2/2, 3x3/2 pad 1 (ResNet stem), rectangular, dilated,
# ceil mode with and without the dropped last window, stride 1 with padding, 7x7.
WINDOWS = [
    ((1, 1), (1, 1), (0, 0), (1, 1), False),
    ((2, 2), (2, 2), (0, 0), (1, 1), False),
    ((3, 3), (2, 2), (1, 1), (1, 1), False),
    ((3, 3), (2, 2), (1, 1), (1, 1), True),
    ((2, 3), (1, 2), (1, 1), (1, 1), True),
    ((3, 3), (3, 3), (1, 1), (1, 1), True),
    ((3, 3), (1, 1), (1, 1), (1, 1), False),
    ((3, 2), (2, 1), (1, 0), (2, 3), False),
    ((7, 7), (1, 1), (3, 3), (1, 1), False),
]
AVG_WINDOWS = [w for w in WINDOWS if w[3] == (1, 1)]


def max_attrs(window, layout="NCHW"):
    kernel, stride, padding, dilation, ceil_mode = window
    return dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode,
                layout=layout)


def avg_attrs(window, count_include_pad, layout="NCHW"):
    kernel, stride, padding, _, ceil_mode = window
    return dict(kernel_size=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode,
                count_include_pad=count_include_pad, layout=layout)


# ---------------------------------------------------------------------------------------------------------------
# CPU: references, output sizes, validation
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_max_reference_matches_loops(rng, window, layout):
    x = rng.standard_normal((2, 3, 9, 8))
    expected_y, expected_index = loop_pool(x, "max", *window[:4], ceil_mode=window[4])
    y, indices = OPS["max_pool2d"].reference([to_layout(x, layout)], max_attrs(window, layout))
    np.testing.assert_array_equal(y, to_layout(expected_y, layout))
    np.testing.assert_array_equal(indices, to_layout(expected_index, layout))
    assert indices.dtype == np.int32


@pytest.mark.parametrize("window", AVG_WINDOWS)
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_avg_reference_matches_loops(rng, window, count_include_pad, layout):
    x = rng.standard_normal((2, 3, 9, 8))
    expected, _ = loop_pool(x, "avg", *window[:3], ceil_mode=window[4], count_include_pad=count_include_pad)
    (y,) = OPS["avg_pool2d"].reference([to_layout(x, layout)], avg_attrs(window, count_include_pad, layout))
    np.testing.assert_allclose(y, to_layout(expected, layout), rtol=1e-12, atol=1e-12)


def test_max_reference_nan_and_ties():
    x = np.array([[[[1.0, 5.0, 5.0], [np.nan, 2.0, np.nan]]]])
    y, indices = OPS["max_pool2d"].reference([x], max_attrs(((2, 2), (1, 1), (0, 0), (1, 1), False)))
    assert np.isnan(y[0, 0, 0, 0]) and np.isnan(y[0, 0, 0, 1])
    np.testing.assert_array_equal(indices[0, 0, 0], [3, 5])  # the first NaN in window order wins
    y, indices = OPS["max_pool2d"].reference([x[:, :, :1]], max_attrs(((1, 2), (1, 1), (0, 0), (1, 1), False)))
    np.testing.assert_array_equal(indices[0, 0, 0], [1, 1])  # ties: the first tap


@pytest.mark.parametrize(
    "size, kernel, stride, padding, dilation, ceil_mode, expected",
    [(112, 3, 2, 1, 1, False, 56), (7, 2, 2, 0, 1, False, 3), (7, 2, 2, 0, 1, True, 4), (5, 3, 3, 1, 1, True, 2),
     (6, 2, 2, 1, 1, True, 4), (9, 3, 1, 1, 2, False, 7), (1, 1, 1, 0, 1, False, 1), (1, 2, 2, 1, 1, True, 1)])
def test_output_size_formula(size, kernel, stride, padding, dilation, ceil_mode, expected):
    assert pool2d.output_size(size, kernel, stride, padding, dilation, ceil_mode, "height") == expected


def test_global_reference(rng):
    x = rng.standard_normal((2, 3, 4, 5))
    (y,) = OPS["global_avg_pool"].reference([x], {"layout": "NCHW"})
    np.testing.assert_allclose(y, x.mean(axis=(2, 3), keepdims=True))
    (y,) = OPS["global_avg_pool"].reference([to_layout(x, "NHWC")], {"layout": "NHWC"})
    np.testing.assert_allclose(y, to_layout(x.mean(axis=(2, 3), keepdims=True), "NHWC"))


@pytest.mark.parametrize("op, attrs", [
    ("max_pool2d", max_attrs(((3, 3), (2, 2), (1, 1), (1, 1), True))),
    ("max_pool2d", max_attrs(((2, 2), (1, 1), (1, 0), (2, 1), False), "NHWC")),
    ("avg_pool2d", avg_attrs(((3, 3), (2, 2), (1, 1), (1, 1), True), False)),
    ("avg_pool2d", avg_attrs(((2, 3), (1, 2), (1, 1), (1, 1), False), True, "NHWC")),
    ("global_avg_pool", {"layout": "NCHW"}),
    ("global_avg_pool", {"layout": "NHWC"}),
])
def test_reference_backward_matches_finite_differences(rng, op, attrs):
    opdef = OPS[op]
    x = rng.standard_normal((2, 5, 6, 3) if attrs["layout"] == "NHWC" else (2, 3, 5, 6))
    full = opdef.validate_attrs(attrs, op)
    y = opdef.reference([x], full)[0]
    dy = rng.standard_normal(y.shape)
    (dx,) = opdef.reference_backward([x], None, [dy], full)

    def loss():
        return float((opdef.reference([x], full)[0] * dy).sum())

    np.testing.assert_allclose(dx, numeric_gradient(loss, x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kernel_size=5), ValueError, r"kernel_size: the window span 5 along height is larger than the padded input"),
    (dict(kernel_size=3, padding=2), ValueError, r"padding: expected at most half the window span \(1\)"),
    (dict(kernel_size=2, stride=0), ValueError, r"stride: expected values >= 1"),
    (dict(kernel_size=0), ValueError, r"kernel_size: expected values >= 1"),
    (dict(kernel_size=(2, 2, 2)), TypeError, r"kernel_size: expected an int or a pair"),
    (dict(kernel_size=2, dilation=0), ValueError, r"dilation: expected values >= 1"),
    (dict(kernel_size=2, padding=-1), ValueError, r"padding: expected values >= 0"),
    (dict(kernel_size=2, layout="NCWH"), ValueError, r"layout: expected 'NCHW' or 'NHWC'"),
    (dict(kernel_size=2, ceil_mode=1), TypeError, r"ceil_mode: expected a bool"),
])
def test_check_window_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        pool2d.check_window((2, 3, 4, 4), "float32", **kwargs)


@pytest.mark.parametrize("shape, dtype, match", [((2, 3, 4), "float32", r"x: expected a 4-d array"),
                                                 ((2, 3, 4, 4), "int32", r"x: expected dtype float32")])
def test_check_window_x_errors(shape, dtype, match):
    with pytest.raises((ValueError, TypeError), match=match):
        pool2d.check_window(shape, dtype, 2)


def test_host_face_validates_before_the_gpu():
    x = np.ones((1, 2, 3, 3), F32)
    with pytest.raises(ValueError, match="kernel_size"):
        max_pool2d.forward_numpy(x, kernel_size=4)
    with pytest.raises(ValueError, match="kernel: expected one of auto, window"):
        avg_pool2d.forward_numpy(x, 2, kernel="global")
    with pytest.raises(ValueError, match=r"dy: expected shape \(1, 2, 1, 1\)"):
        global_avg_pool.backward_numpy(np.ones((1, 2, 3, 3), F32), x)
    with pytest.raises(TypeError, match="dy: expected dtype float32"):
        avg_pool2d.backward_numpy(np.ones((1, 2, 1, 1), np.float16), x, 3)
    with pytest.raises(TypeError, match="x: expected a NumPy array"):
        max_pool2d.forward_numpy([[1.0]], 1)


# ---------------------------------------------------------------------------------------------------------------
# CPU: graph building, inference and the grad rules on the reference backend
# ---------------------------------------------------------------------------------------------------------------
def test_graph_inference_and_errors():
    g = Graph("pool")
    x = g.input("x", ("batch", 64, 112, 112), "float16")
    y, indices = g.max_pool2d(x, kernel_size=3, stride=2, padding=1)
    assert y.type.shape == ("batch", 64, 56, 56) and y.type.dtype == "float16"
    assert indices.type.shape == ("batch", 64, 56, 56) and indices.type.dtype == "int32"
    z = g.avg_pool2d(g.input("xh", (2, 7, 7, 32), "bfloat16"), kernel_size=2, ceil_mode=True, layout="NHWC")
    assert z.type.shape == (2, 4, 4, 32)
    assert g.global_avg_pool(x).type.shape == ("batch", 64, 1, 1)
    with pytest.raises(ValueError, match=r"node 'max_pool2d_1' \(max_pool2d\): kernel_size: the window span 9"):
        g.max_pool2d(g.input("small", (1, 1, 4, 4), "float32"), kernel_size=9)
    with pytest.raises(ValueError, match=r"padding: expected at most half"):
        g.avg_pool2d(x, kernel_size=2, padding=2)
    with pytest.raises(TypeError, match=r"attribute 'kernel_size' expected int or tuple"):
        g.max_pool2d(x, kernel_size="3")
    with pytest.raises(ValueError, match=r"attribute 'layout' expected one of NCHW, NHWC"):
        g.global_avg_pool(x, layout="CHWN")
    with pytest.raises(ValueError, match=r"dy: expected float16\[batch, 64, 56, 56\]"):
        g.max_pool2d_backward(x, indices, x, kernel_size=3, stride=2, padding=1)


def _run_grad(op, attrs, x, dy):
    """dx from the op's grad rule, built into a graph and run on the CPU backend."""
    g = Graph(op)
    xv = g.input("x", x.shape, x.dtype.name)
    outputs = getattr(g, op)(xv, **attrs)
    y = outputs[0] if isinstance(outputs, tuple) else outputs
    dyv = g.input("dy", y.type.shape, y.type.dtype)
    grads = OPS[op].grad(g, y.producer, [dyv] + [None] * (len(y.producer.outputs) - 1))
    g.output(grads[0], "dx")
    return ge2.ExecutorV2(g, device="cpu").run({"x": x, "dy": dy})["dx"]


@pytest.mark.parametrize("op, attrs", [
    ("max_pool2d", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("max_pool2d", dict(kernel_size=2, dilation=2, layout="NHWC")),
    ("avg_pool2d", dict(kernel_size=3, stride=2, padding=1, count_include_pad=False)),
    ("global_avg_pool", dict(layout="NHWC")),
])
def test_grad_rule_on_cpu_backend(rng, op, attrs):
    x = rng.standard_normal((2, 7, 6, 3)).astype(F32)
    opdef = OPS[op]
    full = opdef.validate_attrs(attrs, op)
    y = opdef.reference([x], full)[0]
    dy = rng.standard_normal(y.shape).astype(F32)
    expected = opdef.reference_backward([x.astype(np.float64)], None, [dy.astype(np.float64)], full)[0]
    assert_close(_run_grad(op, attrs, x, dy), expected, "float32", 9)
    assert opdef.grad is not None and OPS[f"{op}_backward"].candidates


def test_cpu_executor_runs_a_pooling_graph(rng):
    g = Graph("pools")
    x = g.input("x", (2, 4, 9, 9), "float32")
    y, _ = g.max_pool2d(x, kernel_size=3, stride=2, padding=1)
    g.output(g.global_avg_pool(g.avg_pool2d(y, kernel_size=2, ceil_mode=True)), "out")
    x_host = rng.standard_normal((2, 4, 9, 9)).astype(F32)
    expected = x_host.astype(np.float64)
    expected, _ = loop_pool(expected, "max", (3, 3), (2, 2), (1, 1))
    expected, _ = loop_pool(expected, "avg", (2, 2), (2, 2), (0, 0), ceil_mode=True)
    assert_close(ge2.ExecutorV2(g, device="cpu").run({"x": x_host})["out"], expected.mean(axis=(2, 3), keepdims=True),
                 "float32")


# ---------------------------------------------------------------------------------------------------------------
# GPU: every attribute x layout x dtype against the float64 reference
# ---------------------------------------------------------------------------------------------------------------
# NCHW backward threads take 16 bytes of consecutive columns when the width allows (4 float32, 8 16-bit): widths 8,
# 12 and 24 give one to six such groups per row, the odd widths one column per thread.
SHAPES = [(1, 1, 1, 1), (2, 3, 9, 8), (1, 16, 7, 13), (3, 8, 12, 12), (2, 5, 17, 3), (2, 3, 10, 24)]


def _fits(shape, window, layout="NCHW"):
    try:
        pool2d.check_window(shape, "float32", *window[:4], ceil_mode=window[4], layout=layout)
        return True
    except ValueError:
        return False


MAX_CASES = [(s, w) for s, w in itertools.product(SHAPES, WINDOWS) if _fits(s, w)]
AVG_CASES = [(s, w) for s, w in itertools.product(SHAPES, AVG_WINDOWS) if _fits(s, w)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape, window", MAX_CASES)
def test_max_pool2d_gpu(rng, poisoned, to_device, shape, window, layout, dtype):
    x = to_layout(random_array(rng, shape, dtype), layout)
    attrs = max_attrs(window, layout)
    expected_y, expected_indices = OPS["max_pool2d"].reference([x], attrs)
    y, indices = poisoned(expected_y.shape, dtype), poisoned(expected_y.shape, "int32")
    max_pool2d.forward(to_device(x), **attrs, out=(y, indices))
    assert_close(y.numpy(), expected_y, dtype, what="y")
    np.testing.assert_array_equal(indices.numpy(), expected_indices)

    dy = random_array(rng, expected_y.shape, dtype)
    expected_dx = pool2d.reference_max_backward(dy, expected_indices, pool2d._host_window(x, attrs))
    dx = poisoned(x.shape, dtype)
    max_pool2d.backward(to_device(dy), to_device(x), **attrs, out=dx, indices=indices)
    # a gradient sums up to ceil(k/s)^2 values of dy, rounded once to dtype
    assert_close(dx.numpy(), expected_dx, dtype, 4, what="dx")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("shape, window", AVG_CASES)
def test_avg_pool2d_gpu(rng, poisoned, to_device, shape, window, count_include_pad, layout, dtype):
    x = to_layout(random_array(rng, shape, dtype), layout)
    attrs = avg_attrs(window, count_include_pad, layout)
    (expected_y,) = OPS["avg_pool2d"].reference([x], attrs)
    y = poisoned(expected_y.shape, dtype)
    avg_pool2d.forward(to_device(x), **attrs, out=y)
    taps = window[0][0] * window[0][1]
    assert_close(y.numpy(), expected_y, dtype, taps, what="y")

    dy = random_array(rng, expected_y.shape, dtype)
    expected_dx = pool2d.reference_avg_backward(dy, pool2d._host_window(x, attrs))
    dx = poisoned(x.shape, dtype)
    avg_pool2d.backward(to_device(dy), to_device(x), **attrs, out=dx)
    assert_close(dx.numpy(), expected_dx, dtype, taps, what="dx")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_misaligned_views_gpu(rng, dtype, layout):
    """Arrays one element past a 16-byte boundary, with a width and channel count that would otherwise take 16-byte
    column groups (NCHW backward) and channel vectors (NHWC, argmax indices included): the one-element path."""
    torch = pytest.importorskip("torch")

    def misaligned(array):
        storage = torch.empty(array.size + 1, device="cuda", dtype=getattr(torch, str(array.dtype)))
        view = storage[1:].view(array.shape)
        view.copy_(torch.from_numpy(array).cuda())
        return view

    x_host = to_layout(random_array(rng, (2, 8, 9, 16), dtype), layout)
    x = misaligned(x_host)
    for window in (((3, 3), (2, 2), (1, 1), (1, 1), False), ((2, 3), (1, 2), (1, 1), (1, 1), True)):
        attrs = max_attrs(window, layout)
        expected_y, expected_indices = OPS["max_pool2d"].reference([x_host], attrs)
        y = misaligned(np.full(expected_y.shape, np.nan, x_host.dtype))
        indices = misaligned(np.full(expected_y.shape, -7, np.int32))
        max_pool2d.forward(x, **attrs, out=(y, indices))
        assert_close(y.float().cpu().numpy(), expected_y, dtype, what=f"y {window}")
        np.testing.assert_array_equal(indices.cpu().numpy(), expected_indices)
        dy_host = random_array(rng, expected_y.shape, dtype)
        dx = misaligned(np.full(x_host.shape, np.nan, x_host.dtype))
        max_pool2d.backward(misaligned(dy_host), x, **attrs, out=dx, indices=indices)
        expected_dx = pool2d.reference_max_backward(dy_host, expected_indices, pool2d._host_window(x_host, attrs))
        assert_close(dx.float().cpu().numpy(), expected_dx, dtype, 4, what=f"max dx {window}")

        attrs = avg_attrs(window, False, layout)
        (expected_y,) = OPS["avg_pool2d"].reference([x_host], attrs)
        dy_host = random_array(rng, expected_y.shape, dtype)
        dx = misaligned(np.full(x_host.shape, np.nan, x_host.dtype))
        avg_pool2d.backward(misaligned(dy_host), x, **attrs, out=dx)
        expected_dx = pool2d.reference_avg_backward(dy_host, pool2d._host_window(x_host, attrs))
        taps = window[0][0] * window[0][1]
        assert_close(dx.float().cpu().numpy(), expected_dx, dtype, taps, what=f"avg dx {window}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 7, 7), (3, 40, 5, 9), (2, 24, 16, 16), (1, 2, 64, 61),
                                   (4, 2048, 7, 7)])
def test_global_avg_pool_gpu(rng, poisoned, to_device, shape, layout, dtype):
    x = to_layout(random_array(rng, shape, dtype), layout)
    expected = pool2d.reference_global(x, layout)
    y = poisoned(expected.shape, dtype)
    global_avg_pool.forward(to_device(x), layout=layout, out=y)
    assert_close(y.numpy(), expected, dtype, shape[2] * shape[3], what="y")
    dy = random_array(rng, expected.shape, dtype)
    dx = poisoned(x.shape, dtype)
    global_avg_pool.backward(to_device(dy), to_device(x), layout=layout, out=dx)
    assert_close(dx.numpy(), pool2d.reference_global_backward(dy, x.shape, layout), dtype, what="dx")


@pytest.mark.gpu
def test_host_faces_and_recomputed_indices_gpu(rng):
    x = random_array(rng, (2, 3, 11, 10), "float32")
    y, indices = max_pool2d.forward_numpy(x, 3, 2, 1, ceil_mode=True)
    expected_y, expected_indices = OPS["max_pool2d"].reference([x], max_attrs(((3, 3), (2, 2), (1, 1), (1, 1), True)))
    assert_close(y, expected_y, "float32")
    np.testing.assert_array_equal(indices, expected_indices)
    dy = random_array(rng, y.shape, "float32")
    (dx,) = max_pool2d.backward_numpy(dy, x, 3, 2, 1, ceil_mode=True)  # indices recomputed
    assert_close(dx, pool2d.reference_max_backward(dy, expected_indices, pool2d._host_window(
        x, max_attrs(((3, 3), (2, 2), (1, 1), (1, 1), True)))), "float32", 4)
    assert [k["name"] for k in max_pool2d.kernels()] == ["window"]
    assert [k["name"] for k in global_avg_pool.kernels()] == ["global"]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_graph_on_gpu_with_grad(rng, layout):
    """A plan on the GPU: the candidates' launches for the forward ops and the backward ops of the grad rules."""
    shape = (2, 9, 9, 8) if layout == "NHWC" else (2, 8, 9, 9)
    g = Graph("pool_gpu")
    x = g.input("x", shape, "float16")
    y, _ = g.max_pool2d(x, kernel_size=3, stride=2, padding=1, layout=layout)
    z = g.avg_pool2d(y, kernel_size=2, ceil_mode=True, count_include_pad=False, layout=layout)
    out = g.global_avg_pool(z, layout=layout)
    dout = g.input("dout", out.type.shape, "float16")
    (dz,) = OPS["global_avg_pool"].grad(g, out.producer, [dout])
    (dy,) = OPS["avg_pool2d"].grad(g, z.producer, [dz])
    (dx,) = OPS["max_pool2d"].grad(g, y.producer, [dy, None])
    g.output(out, "out")
    g.output(dx, "dx")
    feeds = {"x": random_array(rng, shape, "float16"), "dout": random_array(rng, out.type.shape, "float16")}
    gpu = ge2.ExecutorV2(g, device="cuda").run(feeds)
    cpu = ge2.ExecutorV2(g, device="cpu").run(feeds)
    assert_close(gpu["out"], cpu["out"].astype(np.float64), "float16", 16)
    assert_close(gpu["dx"], cpu["dx"].astype(np.float64), "float16", 16)


@pytest.mark.gpu
def test_matches_torch(rng):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    x = torch.randn(4, 16, 33, 31, device="cuda")
    y, indices = max_pool2d.forward(x, 3, 2, 1, ceil_mode=True)
    expected_y, expected_indices = functional.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
    assert isinstance(y, torch.Tensor)
    assert torch.equal(y, expected_y) and torch.equal(indices.long(), expected_indices)
    x_last = x.permute(0, 2, 3, 1).contiguous()
    avg = avg_pool2d.forward(x_last, 3, 2, 1, ceil_mode=True, count_include_pad=False, layout="NHWC")
    expected = functional.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False).permute(0, 2, 3, 1)
    assert torch.allclose(avg, expected, atol=1e-6, rtol=1e-5)
    pooled = global_avg_pool.forward(x.half())
    assert torch.allclose(pooled.float(), functional.adaptive_avg_pool2d(x.half(), 1).float(), atol=1e-3, rtol=2e-3)
