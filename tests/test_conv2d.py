"""conv2d: the float64 reference against a direct loop and finite differences, validation, the OpDefs, and (GPU)
every candidate against the reference, forward and backward, over layouts, dtypes and attributes."""
from __future__ import annotations

import contextlib
import itertools
import re

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, conv2d
from graph_executor_v2.ops._base import Problem
from graph_executor_v2.testing import assert_close, random_array
from row_norm_checks import numeric_gradient

DTYPES = ("float32", "float16", "bfloat16")
HALF_DTYPES = ("float16", "bfloat16")


def direct_conv(x, w, bias, stride, padding, dilation, groups):
    """NCHW convolution as the textbook sum, one output element at a time (small shapes only)."""
    (sh, sw), (dh, dw) = stride, dilation
    top, bottom, left, right = padding
    n, c, h, width = x.shape
    k, cg, r, s = w.shape
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (top, bottom), (left, right)))
    p = (h + top + bottom - dh * (r - 1) - 1) // sh + 1
    q = (width + left + right - dw * (s - 1) - 1) // sw + 1
    kg = k // groups
    y = np.zeros((n, k, p, q))
    for b, o, i, j in itertools.product(range(n), range(k), range(p), range(q)):
        group = o // kg
        for ci, ri, si in itertools.product(range(cg), range(r), range(s)):
            y[b, o, i, j] += padded[b, group * cg + ci, i * sh + ri * dh, j * sw + si * dw] * w[o, ci, ri, si]
    if bias is not None:
        y += bias[None, :, None, None]
    return y


# (N, C, H, W, K, R, S, stride, padding, dilation, groups, act, bias)
CASES = [
    (2, 3, 9, 7, 5, 3, 3, 1, 1, 1, 1, "relu", True),
    (1, 4, 8, 8, 8, 1, 1, 1, 0, 1, 1, "none", False),  # 1x1, batch 1
    (2, 3, 17, 15, 4, 7, 7, 2, 3, 1, 1, "gelu", True),  # 7x7 stride 2
    (2, 6, 10, 9, 9, 3, 3, 2, (1, 0, 2, 1), (2, 1), 3, "silu", True),  # groups, explicit padding, dilation
    (2, 8, 11, 11, 8, 3, 3, 1, 1, 1, 8, "leaky_relu", True),  # depthwise
    (3, 5, 6, 13, 7, 2, 4, (1, 3), (0, 1), 1, 1, "none", True),  # rectangular kernel and stride
]
LARGE_CASE = (4, 32, 28, 28, 64, 3, 3, 1, 1, 1, 1, "relu", True)
CASE_IDS = ["3x3", "1x1_batch1", "7x7_stride2", "groups_dilation_pad4", "depthwise", "rectangular"]


def make_problem(rng, case, layout, dtype):
    n, c, h, w, k, r, s, stride, padding, dilation, groups, act, with_bias = case
    x = random_array(rng, (n, c, h, w), dtype)
    weights = random_array(rng, (k, c // groups, r, s), dtype)
    bias = random_array(rng, (k,), dtype) if with_bias else None
    if layout == "NHWC":
        x, weights = np.ascontiguousarray(x.transpose(0, 2, 3, 1)), np.ascontiguousarray(weights.transpose(0, 2, 3, 1))
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout, act=act)
    return x, weights, bias, attrs


# ---------------------------------------------------------------------------------------------------------------
# Reference (CPU)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_reference_matches_direct_sum(rng, case, layout):
    x, w, bias, attrs = make_problem(rng, case, layout, "float32")
    y, z = conv2d.reference(x, w, bias, **{**attrs, "act": "none"})
    x_nchw, w_nchw = (x, w) if layout == "NCHW" else (x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2))
    geometry = conv2d.check_problem(x.shape, "float32", w.shape, "float32", **attrs)
    expected = direct_conv(x_nchw, w_nchw, bias, geometry.stride, geometry.padding, geometry.dilation,
                           geometry.groups)
    if layout == "NHWC":
        expected = expected.transpose(0, 2, 3, 1)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(z, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[4], CASES[5]], ids=["3x3", "groups", "depthwise", "rect"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_reference_backward_matches_finite_differences(rng, case, layout):
    x, w, bias, attrs = make_problem(rng, case, layout, "float32")
    x, w = x[:1].astype(np.float64), w.astype(np.float64)  # batch 1 keeps the central differences cheap
    bias = None if bias is None else bias.astype(np.float64)
    y, _ = conv2d.reference(x, w, bias, **attrs)
    dy = rng.standard_normal(y.shape)
    grads = conv2d.reference_backward(dy, x, w, bias, **attrs)

    def loss():
        return float((conv2d.reference(x, w, bias, **attrs)[0] * dy).sum())

    for name, array, grad in (("dx", x, grads[0]), ("dw", w, grads[1]), ("dbias", bias, grads[2])):
        if array is None:
            assert grad is None
            continue
        np.testing.assert_allclose(grad, numeric_gradient(loss, array), rtol=1e-5, atol=1e-6, err_msg=name)


def test_output_size_formula():
    geometry = conv2d.check_problem((32, 3, 224, 224), "float16", (64, 3, 7, 7), "float16", stride=2, padding=3)
    assert (geometry.p, geometry.q) == (112, 112)
    geometry = conv2d.check_problem((1, 10, 9, 8), "float32", (4, 5, 3, 2), "float32", stride=(2, 3),
                                    padding=(1, 0, 2, 1), dilation=(2, 1), groups=2, layout="NCHW")
    # P = (9 + 1 + 0 - 2*2 - 1) // 2 + 1 = 3; Q = (8 + 2 + 1 - 1 - 1) // 3 + 1 = 4
    assert geometry.out_shape == (1, 4, 3, 4)
    geometry = conv2d.check_problem((2, 9, 8, 10), "float32", (4, 3, 2, 5), "float32", layout="NHWC", groups=2)
    assert geometry.out_shape == (2, 7, 7, 4)  # H=9, W=8, R=3, S=2


# ---------------------------------------------------------------------------------------------------------------
# Validation (CPU): every error names its argument
# ---------------------------------------------------------------------------------------------------------------
GOOD = dict(x_shape=(2, 4, 8, 8), x_dtype="float32", w_shape=(6, 2, 3, 3), w_dtype="float32")


@pytest.mark.parametrize("change, error, match", [
    (dict(x_shape=(4, 8, 8)), ValueError, "x: expected a 4-d"),
    (dict(w_shape=(6, 2, 3)), ValueError, "w: expected a 4-d"),
    (dict(x_dtype="int32", w_dtype="int32"), TypeError, "x: expected dtype"),
    (dict(w_dtype="float16"), TypeError, "w: expected dtype float32"),
    (dict(groups=3), ValueError, "groups: must divide"),
    (dict(groups=0), ValueError, "groups: must be >= 1"),
    (dict(groups=2.0), TypeError, "groups: expected an int"),
    (dict(w_shape=(6, 4, 3, 3)), ValueError, "w: expected C/groups = 2"),
    (dict(w_shape=(6, 2, 11, 3), padding=1), ValueError, "w: the .*kernel 11x3 is larger than the padded input 10x10"),
    (dict(dilation=5), ValueError, "w: the .*kernel 11x11 is larger than the padded input"),
    (dict(stride=0), ValueError, "stride: every entry must be >= 1"),
    (dict(stride=(1, 2, 3)), ValueError, "stride: expected an int or 2 ints"),
    (dict(stride="2"), TypeError, "stride: expected a list or tuple of ints"),
    (dict(padding=-1), ValueError, "padding: every entry must be >= 0"),
    (dict(padding=(1, 1, 1)), ValueError, "padding: expected an int, 2 ints"),
    (dict(dilation=(1, 0)), ValueError, "dilation: every entry must be >= 1"),
    (dict(layout="NWHC"), ValueError, "layout: expected NCHW or NHWC"),
    (dict(act="tanh"), ValueError, "act: expected one of"),
    (dict(slope="x"), TypeError, "slope: expected a float"),
    (dict(bias_shape=(5,), bias_dtype="float32"), ValueError, r"bias: expected shape \(6,\)"),
    (dict(bias_shape=(6,), bias_dtype="float16"), TypeError, "bias: expected dtype float32"),
    (dict(x_shape=(2, 4, 0, 8)), ValueError, "x: every dimension must be >= 1"),
])
def test_bad_problems_raise_naming_the_argument(change, error, match):
    arguments = {**GOOD, "groups": 2, **change}
    with pytest.raises(error, match=match):
        conv2d.check_problem(**arguments)


def test_forward_numpy_checks_before_touching_the_gpu(rng):
    x, w = random_array(rng, (1, 2, 5, 5), "float32"), random_array(rng, (3, 2, 3, 3), "float32")
    expected = "kernel: expected one of auto, cudnn_graph, cutlass_sm90, implicit_gemm, depthwise, cudnn, im2col_gemm"
    with pytest.raises(ValueError, match=expected):
        conv2d.forward_numpy(x, w, kernel="winograd")
    with pytest.raises(TypeError, match="x: expected a NumPy array"):
        conv2d.forward_numpy(x.tolist(), w)
    with pytest.raises(ValueError, match="dy: expected shape"):
        conv2d.backward_numpy(np.zeros((1, 3, 4, 4), np.float32), x, w)
    with pytest.raises(TypeError, match="dy: expected dtype float32"):
        conv2d.backward_numpy(np.zeros((1, 3, 3, 3), np.float16), x, w)


# ---------------------------------------------------------------------------------------------------------------
# OpDefs (CPU)
# ---------------------------------------------------------------------------------------------------------------
def test_opdef_infer_and_reference(rng):
    op = OPS["conv2d"]
    attrs = op.validate_attrs({"stride": 2, "padding": (1, 1), "act": "relu", "layout": "NHWC"}, "node")
    x, w, b = (random_array(rng, s, "float16") for s in ((2, 9, 9, 4), (8, 3, 3, 4), (8,)))
    (out_type,) = op.infer([TensorType(x.shape, "float16"), TensorType(w.shape, "float16"),
                            TensorType(b.shape, "float16")], attrs)
    assert out_type == TensorType((2, 5, 5, 8), "float16")
    (y,) = op.run_reference([x, w, b], attrs)
    assert y.dtype == np.float16 and y.shape == (2, 5, 5, 8)
    expected, _ = conv2d.reference(x, w, b, stride=2, padding=(1, 1), act="relu", layout="NHWC")
    assert_close(y, expected, "float16", reduction_length=36)
    with pytest.raises(TypeError, match="'groups' expected int"):
        op.validate_attrs({"groups": "2"}, "node")
    with pytest.raises(ValueError, match="'stride' every entry must be >= 1"):
        op.validate_attrs({"stride": (0, 1)}, "node")
    with pytest.raises(ValueError, match="'padding' expected an int, 2 ints"):
        op.validate_attrs({"padding": (1, 2, 3)}, "node")
    with pytest.raises(ValueError, match="w: the .*kernel .* larger than the padded input"):
        op.infer([TensorType((1, 2, 2, 2), "float32"), TensorType((3, 2, 3, 3), "float32"), None],
                 op.validate_attrs({}, "node"))
    # a symbolic batch passes through (with the residual's); every other axis is checked and must be concrete
    residual = TensorType(("n", 5, 5, 8), "float16")
    assert op.infer([TensorType(("n", 9, 9, 4), "float16"), TensorType(w.shape, "float16"), None, residual],
                    attrs) == [residual]
    with pytest.raises(ValueError, match="residual: expected the batch 'n' of x on axis 0"):
        op.infer([TensorType(("n", 9, 9, 4), "float16"), TensorType(w.shape, "float16"), None,
                  TensorType((2, 5, 5, 8), "float16")], attrs)
    with pytest.raises(ValueError, match="x: conv2d needs a concrete shape, got \\(1, 'h', 9, 4\\)"):
        op.infer([TensorType(("n", "h", 9, 4), "float16"), TensorType(w.shape, "float16"), None], attrs)


def test_backward_opdef_matches_reference_backward(rng):
    op = OPS["conv2d_backward"]
    attrs = op.validate_attrs({"padding": 1, "groups": 2, "act": "gelu"}, "node")
    x, w, b = (random_array(rng, s, "float32") for s in ((2, 4, 6, 5), (6, 2, 3, 3), (6,)))
    dy = random_array(rng, (2, 6, 6, 5), "float32")
    types = [TensorType(a.shape, "float32") for a in (dy, x, w, b)]
    assert op.infer(types, attrs) == [types[1], types[2], TensorType((6,), "float32")]
    dx, dw, dbias = op.run_reference([dy, x, w, b], attrs)
    expected = conv2d.reference_backward(dy, x, w, b, padding=1, groups=2, act="gelu")
    for actual, wanted in zip((dx, dw, dbias), expected):
        assert_close(actual, wanted, "float32", reduction_length=60)
    # Without a bias input the op still returns the bias gradient of the convolution (the grad rule drops it).
    _, _, dbias_no_input = op.run_reference([dy, x, w, None], op.validate_attrs({"padding": 1, "groups": 2}, "n"))
    assert_close(dbias_no_input, dy.astype(np.float64).sum(axis=(0, 2, 3)), "float32", reduction_length=60)


def _conv_pair_loss(rng):
    """sum(conv(relu(conv(x, w1)), w2, b2)): a bias-free convolution (ResNet's, before batch norm), then one with a
    bias."""
    g = ge2.ir.Graph("convs")
    x = g.input("x", (2, 4, 6, 6), "float32")
    h = g.relu(g.conv2d(x, g.param("w1", random_array(rng, (8, 4, 3, 3), "float32", 0.3)), None, padding=1))
    y = g.conv2d(h, g.param("w2", random_array(rng, (4, 8, 3, 3), "float32", 0.2)),
                 g.param("b2", random_array(rng, (4,), "float32", 0.1)), padding=1)
    g.output(g.sum(y), "loss")
    return g


def test_grad_rule_computes_dbias_only_where_the_conv_has_a_bias(rng):
    """conv2d_backward's with_dbias is the grad rule's: False for a convolution without a bias, whose dbias nothing
    reads (its reduction cost ResNet-18's training step 1.9 of 15.7 ms on the H200), True with one."""
    from graph_executor_v2 import autograd

    grads = autograd.backward_graph(_conv_pair_loss(rng), "loss", ["w1", "w2", "b2"])
    flags = sorted((node.inputs[3] is not None, node.attrs["with_dbias"]) for node in grads.nodes
                   if node.op == "conv2d_backward")
    assert flags == [(False, False), (True, True)]
    assert grads.outputs["grad/b2"].producer.op == "conv2d_backward"


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["cudnn_graph", "cudnn", "im2col_gemm"])
def test_backward_without_dbias_matches_the_cpu(rng, kernel):
    """Every backward candidate launched with with_dbias False (no dbias pointer) gives the gradients of the CPU
    reference; the biased convolution's dbias is still computed."""
    from graph_executor_v2 import autograd

    if not {"cudnn_graph": conv2d.has_cudnn_graph(), "cudnn": conv2d.has_cudnn()}.get(kernel, True):
        pytest.skip(f"{kernel} is not in this build")
    grads = autograd.backward_graph(_conv_pair_loss(rng), "loss", ["x", "w1", "w2", "b2"])
    feeds = {"x": random_array(rng, (2, 4, 6, 6), "float32")}
    expected = ge2.ExecutorV2(grads, device="cpu", passes=[]).run(feeds)
    executor = ge2.ExecutorV2(grads, device="cuda", passes=[], precision="highest",
                              kernels={"conv2d_backward": kernel})
    got = executor.run(feeds)
    kernels = {s.kernel for s in executor.plans[0].selections if s.op == "conv2d_backward"}
    assert kernels == {kernel}, executor.explain()
    for name, value in expected.items():
        assert_close(got[name], value.astype(np.float64), "float32", reduction_length=72, what=name)


# ---------------------------------------------------------------------------------------------------------------
# GPU: every candidate against the float64 reference
# ---------------------------------------------------------------------------------------------------------------
def cudnn_variant(case, backward):
    """The case as the cuDNN candidate takes it: act none, symmetric padding, a bias only in backward."""
    n, c, h, w, k, r, s, stride, padding, dilation, groups, _, with_bias = case
    padding = padding[0] if isinstance(padding, tuple) and len(padding) == 4 else padding
    return (n, c, h, w, k, r, s, stride, padding, dilation, groups, "none", with_bias and backward)


def cudnn_graph_variant(case, layout, dtype, backward):
    """The case as the cudnn_graph candidate takes it: the fused bias/activation only where cuDNN's runtime fusion
    runs it (NHWC float16/bfloat16, each group's C and K multiples of 8); in backward act none and even padding."""
    n, c, h, w, k, r, s, stride, padding, dilation, groups, act, with_bias = case
    fusable = dtype == "float32" or (layout == "NHWC" and (c // groups) % 8 == 0 and (k // groups) % 8 == 0)
    if backward:
        act = "none"
        if isinstance(padding, tuple) and len(padding) == 4:  # uneven padding's backward runs elsewhere
            padding = (padding[0], padding[2])
    elif not fusable:
        act, with_bias = "none", False
    return (n, c, h, w, k, r, s, stride, padding, dilation, groups, act, with_bias)


def skip_unless_built(kernel):
    if kernel == "cudnn" and not conv2d.has_cudnn():
        pytest.skip("this build of _ops_conv2d has no cuDNN (kernels() says so)")
    if kernel == "cudnn_graph" and not conv2d.has_cudnn_graph():
        pytest.skip("this build of _ops_conv2d has no cuDNN frontend (kernels() says why)")


def variant_for(kernel, case, layout, dtype, backward):
    if kernel == "cudnn":
        return cudnn_variant(case, backward)
    if kernel == "cudnn_graph":
        return cudnn_graph_variant(case, layout, dtype, backward)
    return case


@contextlib.contextmanager
def asymmetric_padding_may_have_no_engine(kernel, case):
    """cuDNN's graph API takes top/bottom and left/right padding apart, but not every cuDNN has an engine for uneven
    padding: that (and only that) is an expected failure, naming cuDNN's reason; numbers are checked whenever it
    runs."""
    padding = case[8]
    uneven = isinstance(padding, tuple) and len(padding) == 4 and (padding[0], padding[2]) != (padding[1], padding[3])
    try:
        yield
    except RuntimeError as error:
        if kernel == "cudnn_graph" and uneven and "cuDNN has no engine" in str(error):
            pytest.xfail(f"cudnn_graph with uneven padding {padding}: {error}")
        raise


# Strict float32 keeps cuDNN's FFT and non-fused Winograd algorithms (float32 transforms), as PyTorch with TF32 off
# runs them (the README's precision note). Their error is a fraction of the result's largest value, not of each
# element: session 43 measured 1.22e-5 of it on y of ResNet-18's C128 H28 3x3 layer (batch 32) and 66 small dx
# elements of LARGE_CASE past float32's elementwise tolerance. The bound is 4x that figure; TF32 or 16-bit inputs
# err by 1e-3 of it and more.
CUDNN_FLOAT32_TRANSFORM_ERROR = 5e-5


def cudnn_float32_slack(kernel, dtype, expected):
    """assert_close's slack for a float32 result that cuDNN may have computed (kernel cudnn, cudnn_graph, or auto,
    which may select them): CUDNN_FLOAT32_TRANSFORM_ERROR of the largest expected value; none otherwise."""
    if dtype != "float32" or kernel not in ("auto", "cudnn", "cudnn_graph"):
        return 0.0
    return CUDNN_FLOAT32_TRANSFORM_ERROR * float(np.abs(expected).max())


def wgrad_length(n_pq, dtype):
    """The reduction length dw is checked at. cuDNN's float32 weight-gradient engines accumulate the N*P*Q products
    in long sequential runs, so their error grows like the length rather than its square root (2e-3 at N*P*Q = 3136
    on the H100, 3.6x float32's atol there); float32 gets 4x the atol (16x the length: atol grows with its square
    root). TF32 would still be ~1e-2 off there."""
    return n_pq * 16 if dtype == "float32" else n_pq


def check_forward(rng, poisoned, to_device, case, layout, dtype, kernel):
    skip_unless_built(kernel)
    case = variant_for(kernel, case, layout, dtype, backward=False)
    x, w, bias, attrs = make_problem(rng, case, layout, dtype)
    expected, _ = conv2d.reference(x, w, bias, **attrs)
    out = poisoned(expected.shape, dtype)
    with asymmetric_padding_may_have_no_engine(kernel, case):
        result = conv2d.forward(to_device(x), to_device(w), None if bias is None else to_device(bias), **attrs,
                                kernel=kernel, out=out)
    assert result is out
    geometry = conv2d.check_problem(x.shape, dtype, w.shape, dtype, **attrs)
    assert_close(out.numpy(), expected, dtype, reduction_length=geometry.reduction_length, what="y",
                 slack=cudnn_float32_slack(kernel, dtype, expected))


def assert_gradients_written(grads, outs, expected, lengths, dtype, kernel=None):
    """dx, dw and dbias each written into its given output and close to the float64 reference (reduction lengths
    in the same order; cuDNN's float32 slack for ``kernel``); a gradient with no reference (no bias) is None."""
    for name, grad, out, wanted, length in zip(("dx", "dw", "dbias"), grads, outs, expected, lengths):
        if wanted is None:
            assert grad is None
            continue
        assert grad is out
        assert_close(grad.numpy(), wanted, dtype, reduction_length=length, what=name,
                     slack=cudnn_float32_slack(kernel, dtype, wanted))


def check_backward(rng, poisoned, to_device, case, layout, dtype, kernel):
    skip_unless_built(kernel)
    case = variant_for(kernel, case, layout, dtype, backward=True)
    x, w, bias, attrs = make_problem(rng, case, layout, dtype)
    y, _ = conv2d.reference(x, w, bias, **attrs)
    dy = random_array(rng, y.shape, dtype)
    expected = conv2d.reference_backward(dy, x, w, bias, **attrs)
    outs = (poisoned(x.shape, dtype), poisoned(w.shape, dtype), None if bias is None else poisoned(bias.shape, dtype),
            None)  # no residual: its entry stays None
    with asymmetric_padding_may_have_no_engine(kernel, case):
        grads = conv2d.backward(to_device(dy), to_device(x), to_device(w), None if bias is None else to_device(bias),
                                **attrs, kernel=kernel, out=outs)
    assert len(grads) == 4 and grads[3] is None
    geometry = conv2d.check_problem(x.shape, dtype, w.shape, dtype, **attrs)
    n_pq = geometry.n * geometry.p * geometry.q
    lengths = (geometry.k // geometry.groups * geometry.r * geometry.s, wgrad_length(n_pq, dtype), n_pq)
    assert_gradients_written(grads, outs, expected, lengths, dtype, kernel)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["auto", "cudnn_graph", "cudnn", "im2col_gemm"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward_matches_reference(rng, poisoned, to_device, case, layout, dtype, kernel):
    check_forward(rng, poisoned, to_device, case, layout, dtype, kernel)


# (n, c, h, w, k, r, s, stride, padding, dilation, groups, act, with_bias), groups == C == K
DEPTHWISE_CASES = [
    CASES[4],  # 3x3, leaky_relu
    (2, 32, 14, 14, 32, 3, 3, 1, 1, 1, 32, "silu", True),  # EfficientNet's
    (1, 24, 15, 13, 24, 5, 5, 2, 2, 1, 24, "relu", False),  # 5x5 stride 2, odd sizes
    (2, 16, 9, 9, 16, 3, 3, (2, 1), (2, 0, 1, 2), (2, 1), 16, "gelu", True),  # uneven padding, dilation
    (1, 12, 7, 7, 12, 3, 3, 1, 1, 1, 12, "none", True),  # channels not a multiple of 8: the scalar kernel in NHWC
    # 33 channel vectors: two blocks of channels, the second one vector wide; 7x7 filters of 32 vectors would not
    # fit 48 KB of shared memory, so a block takes 31
    (1, 264, 9, 9, 264, 7, 7, 1, 3, 1, 264, "relu", True),
    # 16-bit NHWC 3x3/5x5 at stride 1/2 run depthwise_nhwc_tiled (channel tiles of up to 64, 8 x 16 outputs or
    # fewer, one instantiation per activation): 144 channels in three tiles of 48 (a warp spans two strips);
    # 13 x 11 outputs: rows in tiles of 8 and 5, a strip of 4 one column short; batch 1
    (1, 144, 13, 11, 144, 5, 5, 1, 2, 1, 144, "silu", True),
    # stride 2 on odd sizes, 96 channels (two tiles of 48), 9 x 10 outputs
    (2, 96, 17, 19, 96, 3, 3, 2, 1, 1, 96, "silu", True),
    # 5x5 stride 2 with asymmetric padding (top 1, bottom 2, left 2, right 1): 11 x 18 outputs, tiles of 4 x 8;
    # 72 channels in a tile of 40 and a part-empty one (32 of 40)
    (2, 72, 23, 37, 72, 5, 5, 2, (1, 2, 2, 1), 1, 72, "relu", True),
    # the tiled kernel's other activations: gelu on 48 channels (one tile, 24 lanes) and 14 x 14 outputs (rows in
    # tiles of 8 and 6, bands of 2); none at stride 2 on 240 channels (five tiles of 48), 5 x 4 outputs (a band
    # with one row inside the image); leaky_relu on 200 channels (tiles of 40)
    (2, 48, 14, 14, 48, 3, 3, 1, 1, 1, 48, "gelu", True),
    (1, 240, 9, 7, 240, 3, 3, 2, 1, 1, 240, "none", False),
    (1, 200, 11, 10, 200, 5, 5, 1, 2, 1, 200, "leaky_relu", True),
    # 536 channels (8 x 67): no tile from 32 to 64 divides them; 17 tiles of 32, the last with 24
    (1, 536, 6, 5, 536, 3, 3, 1, 1, 1, 536, "silu", True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", DEPTHWISE_CASES, ids=["3x3", "efficientnet", "5x5_stride2", "uneven_dilated",
                                                       "12_channels", "264_channels_7x7", "144_channels_5x5",
                                                       "96_channels_stride2", "5x5_stride2_asymmetric",
                                                       "48_channels_gelu", "240_channels_stride2_none",
                                                       "200_channels_5x5_leaky_relu", "536_channels"])
def test_depthwise_forward_matches_reference(rng, poisoned, to_device, case, layout, dtype):
    check_forward(rng, poisoned, to_device, case, layout, dtype, "depthwise")


def check_pointwise_case(rng, poisoned, to_device, case, dtype):
    """A 1x1 case (N, H, W, C, K, act, with residual, clip) on implicit_gemm against float64, outputs poisoned."""
    skip_unless_built("implicit_gemm")
    n, h, w, c, k, act, with_residual, clip = case
    x, weights = random_array(rng, (n, h, w, c), dtype), random_array(rng, (k, 1, 1, c), dtype, 1.0 / np.sqrt(c))
    bias = random_array(rng, (k,), dtype)
    residual = random_array(rng, (n, h, w, k), dtype) if with_residual else None
    attrs = dict(layout="NHWC", act=act, **({} if clip is None else {"clip_min": clip[0], "clip_max": clip[1]}))
    expected, _ = conv2d.reference(x, weights, bias, residual, **attrs)
    out = poisoned(expected.shape, dtype)
    conv2d.forward(to_device(x), to_device(weights), to_device(bias),
                   None if residual is None else to_device(residual), **attrs, kernel="implicit_gemm", out=out)
    assert_close(out.numpy(), expected, dtype, reduction_length=c, what=f"y of {case}")


# (N, H, W, C, K, act, with residual, clip): 1x1 convolutions of at most 64 output pixels run implicit_gemm's
# pointwise_small_m (a squeeze-and-excitation's convs); 75 pixels take the tiles
SMALL_M_CASES = [
    (32, 1, 1, 96, 8, "silu", False, None),  # EfficientNet's SE reduce conv (its K widened to 8): 2 blocks
    (32, 1, 1, 1152, 48, "silu", False, None),  # the largest: 144 channel vectors over 15 warps, 24 blocks
    (32, 1, 1, 48, 1152, "sigmoid", False, None),  # an SE expand conv with its gate: 6 vectors, one warp
    (1, 1, 1, 8, 13, "none", True, None),  # one pixel, K % 4 != 0 (the last block part empty), a residual
    (16, 2, 2, 40, 20, "relu", True, (0.0, 0.5)),  # 64 pixels (two per lane), a residual and a clip
    (5, 3, 5, 16, 12, "gelu", False, None),  # 75 pixels: the tiles
    (64, 1, 1, 1536, 7, "silu", True, None),  # 16 warps, two batches per warp, both pixel halves, K odd
    (20, 1, 1, 1224, 5, "none", False, None),  # 153 vectors over 16 warps (uneven), 20 pixels (lanes idle)
    (1, 2, 3, 24, 3, "sigmoid", False, None),  # 6 pixels of one image, 3 vectors: one warp
    (1, 7, 7, 64, 260, "relu", True, None),  # K > 256: 4 filters a block (the last one part empty), 49 pixels
    (1, 7, 7, 512, 264, "none", False, None),  # C * K above 2^17: the tiles
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", SMALL_M_CASES, ids=["se_reduce", "se_reduce_1152", "se_expand_sigmoid",
                                                     "one_pixel_residual", "64_pixels_clip", "75_pixels",
                                                     "two_batches_residual", "uneven_warps", "one_warp",
                                                     "wide_k_residual", "many_weights_tiles"])
def test_implicit_gemm_pointwise_small_m_matches_reference(rng, poisoned, to_device, case, dtype):
    check_pointwise_case(rng, poisoned, to_device, case, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_depthwise_fuses_residual_and_clip(rng, poisoned, to_device, dtype):
    x, w, bias, attrs = make_problem(rng, DEPTHWISE_CASES[1], "NHWC", dtype)
    attrs.update(act="relu", clip_min=0.0, clip_max=0.5)
    expected_shape = conv2d.reference(x, w, bias, **attrs)[0].shape
    residual = random_array(rng, expected_shape, dtype)
    expected, _ = conv2d.reference(x, w, bias, residual=residual, **attrs)
    out = poisoned(expected.shape, dtype)
    conv2d.forward(to_device(x), to_device(w), to_device(bias), to_device(residual), **attrs, kernel="depthwise",
                   out=out)
    assert_close(out.numpy(), expected, dtype, reduction_length=9, what="y")


def test_depthwise_takes_depthwise_forward_problems_only():
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    depthwise = conv2d.check_problem((2, 8, 8, 16), "float16", (16, 3, 3, 1), "float16", padding=1, groups=16,
                                     layout="NHWC")
    assert conv2d.unsupported_reason("depthwise", depthwise, "silu", True) is None
    assert "forward only" in conv2d.unsupported_reason("depthwise", depthwise, "none", False, backward=True)
    grouped = conv2d.check_problem((2, 8, 8, 16), "float16", (16, 3, 3, 4), "float16", padding=1, groups=4,
                                   layout="NHWC")
    assert "groups == C == K" in conv2d.unsupported_reason("depthwise", grouped, "none", False)
    multiplier = conv2d.check_problem((2, 16, 8, 8), "float32", (32, 1, 3, 3), "float32", padding=1, groups=16)
    assert "got C=16, K=32, groups=16" in conv2d.unsupported_reason("depthwise", multiplier, "none", False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cudnn_graph_fuses_the_epilogue_of_grouped_16bit_convolutions(rng, poisoned, to_device, dtype):
    """A ResNeXt-style grouped convolution (4 groups of 16 channels) with bias, residual and ReLU in NHWC runs on
    cuDNN's runtime fusion with the epilogue in the graph (float32 intermediates, y rounded once), where it ran on
    im2col_gemm before; against float64."""
    skip_unless_built("cudnn_graph")
    case = (2, 64, 9, 9, 64, 3, 3, 1, 1, 1, 4, "relu", True)
    x, w, bias, attrs = make_problem(rng, case, "NHWC", dtype)
    expected_shape = conv2d.reference(x, w, bias, **attrs)[0].shape
    residual = random_array(rng, expected_shape, dtype)
    expected, _ = conv2d.reference(x, w, bias, residual=residual, **attrs)
    geometry = conv2d.check_problem(x.shape, dtype, w.shape, dtype, **attrs)
    assert conv2d.unsupported_reason("cudnn_graph", geometry, "relu", True, has_residual=True) is None
    out = poisoned(expected.shape, dtype)
    conv2d.forward(to_device(x), to_device(w), to_device(bias), to_device(residual), **attrs, kernel="cudnn_graph",
                   out=out)
    assert_close(out.numpy(), expected, dtype, reduction_length=geometry.reduction_length, what="y")


def test_cudnn_graph_declines_grouped_16bit_convolutions_with_an_epilogue_before_asking_cudnn():
    """cuDNN answers INVALID_DATA_CONFIG for a grouped 16-bit convolution writing float32 (the epilogue's input)
    after trying every engine of its fallback list: 74 s of EfficientNet-B0's cold plan build. Declined up front;
    without an epilogue (16-bit output) cuDNN is still asked."""
    if not ge2._native.is_built("_ops_conv2d") or "cudnn_graph" not in [row["name"] for row in conv2d.kernels()]:
        pytest.skip("_ops_conv2d is not built with cudnn_graph")
    # depthwise, and 4 groups of 4 channels (each group's C not a multiple of 8: outside cuDNN's runtime fusion)
    for groups, weight in ((16, (16, 3, 3, 1)), (4, (16, 3, 3, 4))):
        problem = conv2d.check_problem((2, 8, 8, 16), "float16", weight, "float16", padding=1, groups=groups,
                                       layout="NHWC")
        reason = conv2d.unsupported_reason("cudnn_graph", problem, "silu", True)
        assert reason is not None and "grouped 16-bit convolution writing float32" in reason
        plain = conv2d.unsupported_reason("cudnn_graph", problem, "none", False)
        assert plain is None or "grouped 16-bit" not in plain


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["auto", "cudnn_graph", "cudnn", "im2col_gemm"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_backward_matches_reference(rng, poisoned, to_device, case, layout, dtype, kernel):
    check_backward(rng, poisoned, to_device, case, layout, dtype, kernel)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["cudnn_graph", "cudnn", "im2col_gemm"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_large_forward_and_backward(rng, poisoned, to_device, layout, dtype, kernel):
    check_forward(rng, poisoned, to_device, LARGE_CASE, layout, dtype, kernel)
    check_backward(rng, poisoned, to_device, LARGE_CASE, layout, dtype, kernel)


@pytest.mark.parametrize("change, reason", [
    (dict(act="relu"), "a 16-bit epilogue (bias, residual, activation, clip) after cuDNN would round"),
    (dict(bias=True), "a 16-bit epilogue (bias, residual, activation, clip) after cuDNN would round"),
    (dict(padding=(1, 0, 1, 1)), "symmetric padding only"),
])
def test_cudnn_constraints_name_the_reason(change, reason):
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    if not conv2d.has_cudnn():
        assert "NOT BUILT" in next(row for row in conv2d.kernels() if row["name"] == "cudnn")["description"]
        reason = "has no cuDNN"
    attrs = {"padding": 1, **{k: v for k, v in change.items() if k != "bias"}}
    act = attrs.pop("act", "none")
    geometry = conv2d.check_problem((2, 4, 8, 8), "float16", (4, 4, 3, 3), "float16", **attrs)
    assert reason in conv2d.unsupported_reason("cudnn", geometry, act, change.get("bias", False))
    assert conv2d.unsupported_reason("im2col_gemm", geometry, act, change.get("bias", False)) is None


@pytest.mark.gpu
def test_tf32_only_when_asked(rng, to_device):
    x, w, bias, attrs = make_problem(rng, LARGE_CASE, "NHWC", "float32")
    expected, _ = conv2d.reference(x, w, bias, **attrs)
    args = (to_device(x), to_device(w), to_device(bias))
    strict = conv2d.forward(*args, **attrs).numpy()
    assert_close(strict, expected, "float32", reduction_length=288)
    fast = conv2d.forward(*args, **attrs, allow_tf32=True).numpy()
    assert_close(fast, expected, "tf32", reduction_length=288)


@pytest.mark.gpu
def test_forward_numpy_and_backward_numpy(rng):
    x, w, bias, attrs = make_problem(rng, CASES[3], "NCHW", "float32")
    y = conv2d.forward_numpy(x, w, bias, **attrs)
    assert_close(y, conv2d.reference(x, w, bias, **attrs)[0], "float32", reduction_length=18)
    dy = random_array(rng, y.shape, "float32")
    grads = conv2d.backward_numpy(dy, x, w, None, **attrs)
    expected = conv2d.reference_backward(dy, x, w, None, **attrs)
    assert grads[2] is None
    assert_close(grads[0], expected[0], "float32", reduction_length=27)
    assert_close(grads[1], expected[1], "float32", reduction_length=y.size // 9)


@pytest.mark.gpu
def test_torch_interop_matches_pytorch(rng):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    x, w, bias, attrs = make_problem(rng, CASES[3], "NCHW", "float32")
    attrs["padding"], attrs["act"] = (1, 2), "relu"  # symmetric: what F.conv2d takes
    tx, tw, tb = (torch.from_numpy(a).cuda() for a in (x, w, bias))
    y = conv2d.forward(tx, tw, tb, **attrs)
    assert isinstance(y, torch.Tensor) and y.is_cuda
    expected = torch.relu(functional.conv2d(tx.double(), tw.double(), tb.double(), stride=2, padding=(1, 2),
                                            dilation=(2, 1), groups=3))
    assert_close(y.cpu().numpy(), expected.cpu().numpy(), "float32", reduction_length=18)
    grads = conv2d.backward(torch.ones_like(y), tx, tw, tb, **attrs)
    assert all(isinstance(g, torch.Tensor) for g in grads[:3]) and grads[3] is None


@pytest.mark.gpu
def test_device_argument_errors(rng, to_device, poisoned):
    x, w = to_device(random_array(rng, (2, 4, 6, 6), "float32")), to_device(random_array(rng, (3, 4, 3, 3), "float32"))
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3, 4, 4\)"):
        conv2d.forward(x, w, out=poisoned((2, 3, 4, 5), "float32"))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        conv2d.forward(x, w, out=poisoned((2, 3, 4, 4), "float16"))
    with pytest.raises(TypeError, match="x: expected a CUDA device array"):
        conv2d.forward(np.zeros((2, 4, 6, 6), np.float32), w)
    with pytest.raises(ValueError, match=r"out: expected one entry per input \(x, w, bias, residual\)"):
        conv2d.backward(poisoned((2, 3, 4, 4), "float32"), x, w, out=(None,))
    torch = pytest.importorskip("torch")
    strided = torch.zeros((2, 4, 6, 12), device="cuda")[..., ::2]
    with pytest.raises(ValueError, match="x: expected a contiguous row-major array"):
        conv2d.forward(strided, torch.zeros((3, 4, 3, 3), device="cuda"))


@pytest.mark.gpu
def test_named_kernel_that_cannot_run_raises(rng, to_device):
    x, w = to_device(random_array(rng, (2, 4, 6, 6), "float16")), to_device(random_array(rng, (3, 4, 3, 3), "float16"))
    with pytest.raises(ValueError, match="kernel: 'cudnn' cannot run this problem: a 16-bit epilogue"):
        conv2d.forward(x, w, act="relu", kernel="cudnn")


def test_kernels_table():
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    rows = {row["name"]: row for row in conv2d.kernels()}
    assert list(rows) == ["cudnn_graph", "cutlass_sm90", "implicit_gemm", "depthwise", "cudnn", "im2col_gemm"]
    assert [row["priority"] for row in rows.values()] == [40, 35, 30, 25, 20, 10]
    assert all(row["description"] and row["constraints"] for row in rows.values())
    assert conv2d.has_cudnn() == ("NOT BUILT" not in rows["cudnn"]["description"])
    assert conv2d.has_cudnn_graph() == ("NOT BUILT" not in rows["cudnn_graph"]["description"])
    assert [c.name for c in OPS["conv2d"].candidates] == list(rows)
    assert [c.priority for c in selection.candidates(OPS["conv2d"])] == [row["priority"] for row in rows.values()]


NOT_BUILT_FRONTEND = "cuDNN frontend headers not found (install nvidia-cudnn-frontend or set GE2_CUDNN_FRONTEND_DIR)"


def graph_problem(dtype="float16", layout="NHWC", c=16, k=16, groups=1, act="relu", bias=True, backward=False,
                  padding=1):
    x_shape = (2, 8, 8, c) if layout == "NHWC" else (2, c, 8, 8)
    w_shape = (k, 3, 3, c // groups) if layout == "NHWC" else (k, c // groups, 3, 3)
    geometry = conv2d.check_problem(x_shape, dtype, w_shape, dtype, padding=padding, groups=groups, layout=layout)
    return geometry, act, bias, backward


def test_cudnn_graph_reports_why_it_is_not_built():
    """A build without cuDNN or without the frontend headers says so in kernels() and in every capability check
    (the registry's rejections, which explain() prints)."""
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    if conv2d.has_cudnn_graph():
        pytest.skip("this build has the cudnn_graph candidate (test_cudnn_graph_constraints_name_the_reason runs)")
    row = next(row for row in conv2d.kernels() if row["name"] == "cudnn_graph")
    missing = NOT_BUILT_FRONTEND if conv2d.has_cudnn() else "CMake found no cuDNN"
    assert f"NOT BUILT ({missing}" in row["description"]
    for backward in (False, True):
        geometry, act, bias, _ = graph_problem(act="none", bias=False)
        assert conv2d.unsupported_reason("cudnn_graph", geometry, act, bias, backward).startswith(
            f"not built: {missing}")
    ranking = registry_ranking("float32", "NCHW", {"padding": 1})
    assert dict(ranking.rejected)["cudnn_graph"].startswith(f"not built: {missing}")
    assert ranking.viable[0].name != "cudnn_graph"


@pytest.mark.parametrize("change, reason", [
    (dict(backward=True), "activation gradients"),
])
def test_cudnn_graph_constraints_name_the_reason(change, reason):
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    if not conv2d.has_cudnn_graph():
        pytest.skip("this build has no cudnn_graph (test_cudnn_graph_reports_why_it_is_not_built runs)")
    geometry, act, bias, backward = graph_problem(**change)
    assert reason in conv2d.unsupported_reason("cudnn_graph", geometry, act, bias, backward)
    # What it takes: any layout, dtype, groups and padding without an epilogue; backward with a bias (dbias by a
    # reduction) and even padding; the fused epilogue in NHWC float16/bfloat16.
    for dtype, layout, groups, padding in (("float32", "NCHW", 2, (1, 0, 2, 1)), ("bfloat16", "NHWC", 4, 1),
                                           ("float16", "NCHW", 1, (0, 1))):
        geometry, _, _, _ = graph_problem(dtype, layout, groups=groups, padding=padding)
        assert conv2d.unsupported_reason("cudnn_graph", geometry, "none", False) is None
        backward_reason = conv2d.unsupported_reason("cudnn_graph", geometry, "none", True, backward=True)
        if isinstance(padding, tuple) and len(padding) == 4:
            assert "uneven padding in backward" in backward_reason
            assert conv2d.unsupported_reason("im2col_gemm", geometry, "none", True, backward=True) is None
        else:
            assert backward_reason is None
    for dtype in HALF_DTYPES:
        for act in ("relu", "gelu", "silu", "leaky_relu"):
            geometry, _, _, _ = graph_problem(dtype, act=act)
            assert conv2d.unsupported_reason("cudnn_graph", geometry, act, True) is None
    # Where cuDNN's runtime fusion does not run (float32; 16-bit NCHW, grouped or with odd channels) the graph
    # writes the convolution in float32 and GE2's epilogue kernel finishes y: every epilogue is taken.
    for dtype, layout, groups, c, k in (("float32", "NCHW", 2, 16, 16), ("float16", "NCHW", 1, 16, 16),
                                        ("bfloat16", "NHWC", 2, 16, 16), ("float16", "NHWC", 1, 12, 20)):
        geometry, _, _, _ = graph_problem(dtype, layout, c=c, k=k, groups=groups)
        assert conv2d.unsupported_reason("cudnn_graph", geometry, "silu", True, has_residual=True) is None
    # ... except where implicit_gemm fuses it in one kernel (16-bit NHWC, groups 1, C % 8 == 0, K % 8 != 0)
    geometry, _, _, _ = graph_problem("float16", "NHWC", c=16, k=20)
    assert "implicit_gemm fuses this epilogue in one kernel" in conv2d.unsupported_reason("cudnn_graph", geometry,
                                                                                          "relu", True)


def registry_ranking(dtype, layout, attrs):
    from graph_executor_v2.ir.graph import Node
    from graph_executor_v2.runtime.registry import Capabilities, Preferences, select

    op = OPS["conv2d"]
    attrs = op.validate_attrs({"layout": layout, **attrs}, "node")
    x_shape, w_shape = ((2, 16, 8, 8), (8, 16, 3, 3)) if layout == "NCHW" else ((2, 8, 8, 16), (8, 3, 3, 16))
    types = (TensorType(x_shape, dtype), TensorType(w_shape, dtype), None)
    problem = Problem("conv2d", types, tuple(op.infer(types, attrs)), attrs)
    node = Node("conv", "conv2d", [], dict(attrs))
    return select(node, problem, Capabilities("cuda", (9, 0), "Fake GPU", "test"), Preferences())


class _NoEngineForGrouped:
    """_ops_conv2d as a GPU whose cuDNN has no engine for grouped convolutions would answer: the static checks pass,
    preparing a grouped problem raises as the native cudnn_graph does."""

    def __init__(self):
        self.prepared = []

    def unsupported_reason(self, kernel, geometry, *args):
        return ""

    def prepare(self, kernel, geometry, *args):
        self.prepared.append((kernel, geometry[-1]))
        if geometry[-1] > 1:  # ConvGeometry.native ends with groups
            raise RuntimeError("kernel 'cudnn_graph': cuDNN has no engine for this problem (no heuristic engine)")


def test_cudnn_graph_declines_at_ranking_where_cudnn_has_no_engine(monkeypatch):
    """Where a GPU can answer, cudnn_graph asks cuDNN while ranking: a problem without an engine is declined with
    cuDNN's reason (auto then ranks the next candidate, and no failed prepare counts as a fallback); one with an
    engine stays viable. The other candidates never ask, and without a GPU nothing is asked."""
    native = _NoEngineForGrouped()
    monkeypatch.setattr(conv2d, "_native_module", lambda: native)
    op = OPS["conv2d"]
    forward = {c.name: c for c in op.candidates}
    backward = {c.name: c for c in OPS["conv2d_backward"].candidates}

    def problem(groups, backward_pass=False):
        attrs = op.validate_attrs({"layout": "NHWC", "padding": 1, "groups": groups}, "node")
        types = (TensorType((2, 8, 8, 16), "float16"), TensorType((16, 3, 3, 16 // groups), "float16"),
                 TensorType((16,), "float16"))
        out = tuple(op.infer(types, attrs))
        if backward_pass:
            return Problem("conv2d_backward", (out[0], *types), (), attrs)
        return Problem("conv2d", types, out, attrs)

    monkeypatch.setattr(conv2d._device, "is_available", lambda: False)
    assert forward["cudnn_graph"].supports(problem(groups=16)) is None and native.prepared == []
    monkeypatch.setattr(conv2d._device, "is_available", lambda: True)
    assert forward["cudnn_graph"].supports(problem(groups=1)) is None
    declined = forward["cudnn_graph"].supports(problem(groups=16))
    assert "cuDNN has no engine for this problem" in declined, declined
    assert "cuDNN has no engine" in backward["cudnn_graph"].supports(problem(groups=4, backward_pass=True))
    assert forward["im2col_gemm"].supports(problem(groups=16)) is None
    assert native.prepared == [("cudnn_graph", 1), ("cudnn_graph", 16), ("cudnn_graph", 4)]


@pytest.mark.gpu
def test_depthwise_and_narrow_16bit_convolutions_run_without_a_fallback(rng):
    """EfficientNet's and ConvNeXt's float16 convolutions outside cuDNN's runtime fusion (a depthwise 7x7 and 3x3
    with bias and SiLU, a 1x1 expansion from 4 channels), NHWC as the layout pass makes them: the executor chooses a
    kernel for each without a failed prepare (cudnn_graph declines at ranking where cuDNN has no engine), and the
    numbers match float64."""
    g = ge2.ir.Graph("depthwise")
    x = g.input("x", (2, 14, 14, 32), "float16")
    depthwise7 = g.conv2d(x, g.param("w7", random_array(rng, (32, 7, 7, 1), "float16", 0.2)),
                          g.param("b7", random_array(rng, (32,), "float16", 0.1)), padding=3, groups=32, layout="NHWC")
    depthwise3 = g.conv2d(depthwise7, g.param("w3", random_array(rng, (32, 3, 3, 1), "float16", 0.3)),
                          g.param("b3", random_array(rng, (32,), "float16", 0.1)), padding=1, groups=32,
                          act="silu", layout="NHWC")
    squeezed = g.conv2d(depthwise3, g.param("ws", random_array(rng, (4, 1, 1, 32), "float16", 0.2)), layout="NHWC")
    g.output(g.conv2d(squeezed, g.param("we", random_array(rng, (32, 1, 1, 4), "float16", 0.4)),
                      g.param("be", random_array(rng, (32,), "float16", 0.1)), act="silu", layout="NHWC"), "y")
    feeds = {"x": random_array(rng, (2, 14, 14, 32), "float16")}
    executor = ge2.ExecutorV2(g, device="cuda")
    got = executor.run(feeds)["y"]
    assert executor.fallbacks == [], executor.explain()
    expected = ge2.ExecutorV2(g, device="cpu", passes=[]).run(feeds)["y"]
    assert_close(got, expected.astype(np.float64), "float16", reduction_length=49, what=executor.explain())


def _first_or_no_engine(ranking) -> bool:
    """cudnn_graph ranked first, or declined because cuDNN itself has no engine for the problem (asked at ranking
    on a GPU): either way no other reason keeps it out."""
    return ranking.viable[0].name == "cudnn_graph" or "cuDNN has no engine" in dict(ranking.rejected)["cudnn_graph"]


def test_registry_ranks_cudnn_graph_first_where_it_is_built():
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    if not conv2d.has_cudnn_graph():
        pytest.skip("this build has no cudnn_graph")
    assert _first_or_no_engine(registry_ranking("float32", "NCHW", {"padding": 1}))
    assert _first_or_no_engine(registry_ranking("float16", "NHWC", {"padding": 1, "act": "relu"}))
    # float32's epilogue runs after cuDNN's convolution in place (float32 is the epilogue's own precision)
    assert _first_or_no_engine(registry_ranking("float32", "NCHW", {"padding": 1, "act": "relu"}))
    assert _first_or_no_engine(registry_ranking("float16", "NCHW", {"padding": 1, "act": "relu"}))


# (N, C, H, W, K, R, S, stride, padding, dilation, groups, act, bias): NHWC float16/bfloat16 with C, K multiples of 8
EPILOGUE_CASES = [
    (2, 16, 9, 7, 24, 3, 3, 1, 1, 1, 1, "relu", True),
    (1, 32, 15, 13, 40, 1, 1, 2, 0, 1, 1, "gelu", True),
    (2, 40, 12, 11, 64, 3, 3, 1, 1, 1, 1, "silu", True),
    (2, 8, 23, 21, 16, 7, 7, 2, 3, 1, 1, "leaky_relu", False),
    (2, 16, 10, 12, 32, 3, 3, 1, 1, 1, 1, "none", True),
]
EPILOGUE_IDS = ["3x3_relu_bias", "1x1_stride2_gelu_bias", "3x3_silu_bias_c40", "7x7_stride2_leaky_relu", "bias_only"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("case", EPILOGUE_CASES, ids=EPILOGUE_IDS)
def test_cudnn_graph_fused_epilogue_matches_reference(rng, poisoned, to_device, case, dtype):
    check_forward(rng, poisoned, to_device, case, "NHWC", dtype, "cudnn_graph")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_cudnn_graph_float32_is_strict_unless_tf32_is_allowed(rng, to_device, layout):
    """Strict float32 must not take cuDNN's TF32 engines: over a reduction of 288 TF32 is ~1e-3 off, far outside
    float32's tolerance."""
    skip_unless_built("cudnn_graph")
    case = (*LARGE_CASE[:11], "none", False)  # the convolution alone: the engines' own math is what is checked
    x, w, bias, attrs = make_problem(rng, case, layout, "float32")
    expected, _ = conv2d.reference(x, w, bias, **attrs)
    args = (to_device(x), to_device(w), None)
    strict = conv2d.forward(*args, **attrs, kernel="cudnn_graph").numpy()
    assert_close(strict, expected, "float32", reduction_length=288, what="strict float32 y")
    fast = conv2d.forward(*args, **attrs, kernel="cudnn_graph", allow_tf32=True).numpy()
    assert_close(fast, expected, "tf32", reduction_length=288, what="tf32 y")
    dy = random_array(rng, expected.shape, "float32")
    dx, dw, _, _ = conv2d.backward(to_device(dy), *args, **attrs, kernel="cudnn_graph")
    wanted = conv2d.reference_backward(dy, x, w, None, **attrs)
    assert_close(dx.numpy(), wanted[0], "float32", reduction_length=64 * 9, what="strict float32 dx")
    assert_close(dw.numpy(), wanted[1], "float32", reduction_length=wgrad_length(4 * 28 * 28, "float32"),
                 what="strict float32 dw")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["cudnn", "cudnn_graph"])
def test_strict_float32_keeps_cudnns_transformed_algorithms_within_pytorchs_error(rng, poisoned, to_device,
                                                                                   monkeypatch, kernel):
    """Strict float32 keeps cuDNN's FFT and Winograd algorithms (float32 transforms), as PyTorch with TF32 off does:
    it runs this layer, ResNet-18's C128 H28 3x3 at batch 32, as FFT on the H200. Judged as DESIGN.md judges deep
    models: y, dx and dw within 4x PyTorch's own float32 error against float64, or within the transforms' bound
    (CUDNN_FLOAT32_TRANSFORM_ERROR of the largest value) where PyTorch's cudnn.benchmark took a direct algorithm in
    this process; TF32 or 16-bit inputs (1e-3 and worse) fail it."""
    torch = pytest.importorskip("torch")
    skip_unless_built(kernel)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)  # PyTorch's fastest algorithms, as GE2 times its own
    x = random_array(rng, (32, 128, 28, 28), "float32")
    w = random_array(rng, (128, 128, 3, 3), "float32") / np.float32(np.sqrt(128 * 9))
    dy = random_array(rng, (32, 128, 28, 28), "float32")

    def pytorch(dtype):  # y, dx, dw
        tx, tw = (torch.from_numpy(a).to("cuda", dtype).requires_grad_() for a in (x, w))
        y = torch.nn.functional.conv2d(tx, tw, padding=1)
        y.backward(torch.from_numpy(dy).to("cuda", dtype))
        return [t.detach().double().cpu().numpy() for t in (y, tx.grad, tw.grad)]

    wanted = pytorch(torch.float64)
    theirs = pytorch(torch.float32)
    args = (to_device(x), to_device(w), None)
    y = poisoned(dy.shape, "float32")  # NaN: an element the kernels forget to write can never pass
    assert conv2d.forward(*args, padding=1, kernel=kernel, out=y) is y
    outs = (poisoned(x.shape, "float32"), poisoned(w.shape, "float32"), None, None)
    dx, dw, _, _ = conv2d.backward(to_device(dy), *args, padding=1, kernel=kernel, out=outs)
    assert dx is outs[0] and dw is outs[1]
    for name, ours, their, reference in zip(("y", "dx", "dw"), (y.numpy(), dx.numpy(), dw.numpy()), theirs, wanted):
        scale = np.abs(reference).max()
        error, their_error = (np.abs(a.astype(np.float64) - reference).max() / scale for a in (ours, their))
        assert np.isfinite(ours).all(), f"{name}: not finite"
        assert error <= max(4 * their_error, CUDNN_FLOAT32_TRANSFORM_ERROR), (
            f"{name}: GE2's error against float64 {error:.2e} of the largest value, PyTorch's {their_error:.2e}")


@pytest.mark.gpu
def test_cudnn_graph_replays_in_a_cuda_graph_and_refuses_to_set_up_during_capture(rng):
    """Plans are built and timed on the first uncaptured call; a captured replay then computes fresh inputs. A
    problem first seen during capture is refused with a clear error instead of building plans there."""
    skip_unless_built("cudnn_graph")
    runtime = ge2.device.runtime()
    stream = runtime.Stream()
    case = EPILOGUE_CASES[0]
    x, w, bias, attrs = make_problem(rng, case, "NHWC", "float16")
    x_dev, w_dev, bias_dev = (runtime.DeviceArray.from_numpy(a) for a in (x, w, bias))
    y = runtime.DeviceArray.empty(list(conv2d.reference(x, w, bias, **attrs)[0].shape), "float16")
    dy = runtime.DeviceArray.from_numpy(random_array(rng, tuple(y.shape), "float16"))
    grads = (runtime.DeviceArray.empty(list(x.shape), "float16"), runtime.DeviceArray.empty(list(w.shape), "float16"),
             runtime.DeviceArray.empty([case[4]], "float16"), None)
    no_act = {**attrs, "act": "none"}

    def run():
        conv2d.forward(x_dev, w_dev, bias_dev, **attrs, kernel="cudnn_graph", out=y, stream=stream)
        conv2d.backward(dy, x_dev, w_dev, bias_dev, **no_act, kernel="cudnn_graph", out=grads, stream=stream)

    run()
    stream.synchronize()
    graph = runtime.CudaGraph()
    graph.begin_capture(stream.handle)
    run()
    graph.end_capture()
    fresh_x, fresh_w, fresh_bias, fresh_dy = (random_array(rng, a.shape, "float16")
                                              for a in (x, w, bias, dy.numpy()))
    for device_array, values in zip((x_dev, w_dev, bias_dev, dy), (fresh_x, fresh_w, fresh_bias, fresh_dy)):
        device_array.copy_from_numpy(values)
    for output in (y, *grads[:3]):
        output.poison(stream.handle)
    graph.replay(stream.handle)
    stream.synchronize()
    expected, _ = conv2d.reference(fresh_x, fresh_w, fresh_bias, **attrs)
    assert_close(y.numpy(), expected, "float16", reduction_length=16 * 9, what="captured y")
    wanted = conv2d.reference_backward(fresh_dy, fresh_x, fresh_w, fresh_bias, **no_act)
    for name, got, want, length in zip(("dx", "dw", "dbias"), grads, wanted, (24 * 9, 2 * 9 * 7, 2 * 9 * 7)):
        assert_close(got.numpy(), want, "float16", reduction_length=length, what=f"captured {name}")

    # The native call, so that nothing but the kernel itself runs inside the capture: a problem never seen before.
    unseen = conv2d.check_problem((3, 5, 7, 16), "float16", (8, 3, 3, 16), "float16", padding=1, layout="NHWC")
    out = runtime.DeviceArray.empty(list(unseen.out_shape), "float16")
    x_unseen = runtime.DeviceArray.from_numpy(random_array(rng, (3, 5, 7, 16), "float16"))
    w_unseen = runtime.DeviceArray.from_numpy(random_array(rng, (8, 3, 3, 16), "float16"))
    capture = runtime.CudaGraph()
    capture.begin_capture(stream.handle)
    try:
        with pytest.raises(RuntimeError, match="kernel 'cudnn_graph' must build its cuDNN plans before CUDA graph "
                                               "capture; run the problem once on this stream first"):
            conv2d._native_module().forward(x_unseen.ptr, w_unseen.ptr, 0, 0, out.ptr, unseen.native, "NHWC",
                                            "float16", "none", 0.01, False, -np.inf, np.inf, "cudnn_graph",
                                            stream.handle)
    finally:
        capture.abort_capture()


@pytest.mark.gpu
def test_cudnn_graph_declines_offset_views_and_auto_takes_the_next(rng):
    """cuDNN's plans assume 16-byte aligned tensors: the named kernel says so, auto's backward runs another one."""
    torch = pytest.importorskip("torch")
    skip_unless_built("cudnn_graph")
    x, w, _, attrs = make_problem(rng, (2, 16, 6, 6, 8, 3, 3, 1, 1, 1, 1, "none", False), "NHWC", "float16")
    dy = random_array(rng, (2, 6, 6, 8), "float16")
    storage = torch.empty(dy.size + 1, dtype=torch.float16, device="cuda")
    offset_dy = storage[1:].view(dy.shape)
    offset_dy.copy_(torch.from_numpy(dy))
    tx, tw = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    with pytest.raises(RuntimeError, match="kernel 'cudnn_graph': needs 16-byte aligned tensors"):
        conv2d.backward(offset_dy, tx, tw, None, **attrs, kernel="cudnn_graph")
    dx, dw, _, _ = conv2d.backward(offset_dy, tx, tw, None, **attrs)
    expected = conv2d.reference_backward(dy, x, w, None, **attrs)
    assert_close(dx.cpu().numpy(), expected[0], "float16", reduction_length=8 * 9, what="dx")
    assert_close(dw.cpu().numpy(), expected[1], "float16", reduction_length=2 * 36, what="dw")


def test_native_entry_points_run_the_kernel_they_are_named():
    """No native call chooses: "auto" is the Python selector's word, and the binding refuses it naming the op."""
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    native = conv2d._native_module()
    geometry = conv2d.check_problem((2, 6, 6, 16), "float16", (4, 3, 3, 16), "float16", padding=1, layout="NHWC")
    expected = (r"kernel: expected one of cudnn_graph, cutlass_sm90, implicit_gemm, depthwise, cudnn, im2col_gemm "
                r"\(conv2d's kernels\), got 'auto'")
    with pytest.raises(ValueError, match=expected):
        native.forward(16, 16, 0, 0, 16, geometry.native, "NHWC", "float16", "none", 0.01, False, -np.inf, np.inf,
                       "auto", 0)
    with pytest.raises(ValueError, match=expected):
        native.backward(16, 16, 16, 0, 16, 16, 0, geometry.native, "NHWC", "float16", "none", 0.01, False, "auto", 0)
    with pytest.raises(ValueError, match=expected):
        conv2d.unsupported_reason("auto", geometry, "none", False)
    with pytest.raises(ValueError, match="kernel: 'implicit_gemm' cannot run this problem: forward only"):
        native.backward(16, 16, 16, 0, 16, 16, 0, geometry.native, "NHWC", "float16", "none", 0.01, False,
                        "implicit_gemm", 0)


@pytest.mark.gpu
def test_cudnn_graph_named_problem_it_cannot_run_raises(rng, to_device):
    skip_unless_built("cudnn_graph")
    x, w = to_device(random_array(rng, (2, 4, 6, 6), "float16")), to_device(random_array(rng, (3, 4, 3, 3), "float16"))
    dy = to_device(random_array(rng, (2, 3, 4, 4), "float16"))
    with pytest.raises(ValueError, match="kernel: 'cudnn_graph' cannot run this problem: activation gradients"):
        conv2d.backward(dy, x, w, act="relu", kernel="cudnn_graph")


# ---------------------------------------------------------------------------------------------------------------
# implicit_gemm: GE2's own tensor-core forward (NHWC, float16/bfloat16, groups 1, C % 8 == 0)
# ---------------------------------------------------------------------------------------------------------------
# (N, C, H, W, K, R, S, stride, padding, dilation, groups, act, bias)
IGEMM_CASES = [
    (2, 16, 9, 7, 24, 1, 1, 1, 0, 1, 1, "none", False),
    (1, 32, 15, 13, 40, 1, 1, 2, 0, 1, 1, "relu", True),
    (2, 8, 11, 9, 17, 3, 3, 1, 1, 1, 1, "relu", True),  # odd K: element stores, a partial column tile
    (3, 24, 13, 12, 33, 3, 3, 2, (1, 0, 2, 1), 1, 1, "gelu", True),
    (2, 40, 12, 11, 64, 3, 3, 1, 2, 2, 1, "silu", True),  # C = 40: a channel tile that is a quarter full
    (2, 8, 23, 21, 16, 7, 7, 2, 3, 1, 1, "leaky_relu", True),
    (2, 16, 10, 17, 12, 2, 5, (2, 1), (0, 1), (1, 2), 1, "none", True),  # rectangular kernel, stride, dilation
    (1, 64, 7, 7, 256, 3, 3, 1, 1, 1, 1, "none", True),  # two channel tiles per tap, batch 1
    (3, 16, 56, 56, 232, 3, 3, 1, 1, 1, 1, "relu", True),  # many blocks in both directions, a partial column tile
]
IGEMM_IDS = ["1x1", "1x1_stride2_batch1", "3x3_odd_k", "3x3_stride2_pad4", "3x3_dilation2_c40", "7x7_stride2",
             "rectangular", "c64_k256_batch1", "wide_tiles"]
# Beyond IGEMM_CASES for the per-config runs: three 64-channel tiles per tap with the last one an eighth full, and a
# 1x1 layer whose M = 3 * 29 * 29 = 2523 leaves a partial tile for every BM (64, 128, 192, 256).
IGEMM_CONFIG_CASES = IGEMM_CASES + [
    (2, 136, 9, 10, 72, 3, 3, 1, 1, 1, 1, "gelu", True),
    (3, 64, 29, 29, 136, 1, 1, 1, 0, 1, 1, "relu", False),
]
IGEMM_CONFIG_IDS = IGEMM_IDS + ["c136_three_channel_tiles", "1x1_m_tail"]
IGEMM_CONFIG_PATTERN = r"(\d+) = (\d+)x(\d+) (\d+) warps (\d+) stages"


def implicit_gemm_configs() -> list[int]:
    """The tile configs kernels/implicit_gemm.cu instantiates (its kConfigs), forced by GE2_IMPLICIT_GEMM_CONFIG, as
    kernels() lists them, so a new config is checked without editing this file; none where _ops_conv2d is not built
    (the GPU tests skip there anyway). test_implicit_gemm_lists_its_configs checks the listing itself."""
    if not ge2._native.is_built("_ops_conv2d"):
        return []
    description = next(row["description"] for row in conv2d.kernels() if row["name"] == "implicit_gemm")
    return [int(index) for index, *_ in re.findall(IGEMM_CONFIG_PATTERN, description)]


IGEMM_CONFIGS = implicit_gemm_configs()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("case", IGEMM_CASES, ids=IGEMM_IDS)
def test_implicit_gemm_forward_matches_reference(rng, poisoned, to_device, case, dtype):
    check_forward(rng, poisoned, to_device, case, "NHWC", dtype, "implicit_gemm")


@pytest.mark.gpu
@pytest.mark.parametrize("config", IGEMM_CONFIGS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("case", IGEMM_CONFIG_CASES, ids=IGEMM_CONFIG_IDS)
def test_implicit_gemm_every_config_matches_reference(rng, poisoned, to_device, monkeypatch, case, dtype, config):
    """Each tile config, forced, on every edge the kernel has: partial M, K and channel tiles, C below and above one
    64-channel tile, stride, dilation, padding, odd K (element stores), bias and every activation."""
    monkeypatch.setenv("GE2_IMPLICIT_GEMM_CONFIG", str(config))
    check_forward(rng, poisoned, to_device, case, "NHWC", dtype, "implicit_gemm")


@pytest.mark.gpu
@pytest.mark.parametrize("config", IGEMM_CONFIGS)
def test_implicit_gemm_writes_an_unaligned_out_element_by_element(rng, monkeypatch, config):
    """K % 8 == 0 but y 8 bytes past a 16-byte boundary: the epilogue's element stores, every byte of y written."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("GE2_IMPLICIT_GEMM_CONFIG", str(config))
    x, w, bias, attrs = make_problem(rng, IGEMM_CASES[7], "NHWC", "float16")
    expected, _ = conv2d.reference(x, w, bias, **attrs)
    storage = torch.full((expected.size + 4,), float("nan"), dtype=torch.float16, device="cuda")
    out = storage[4:].view(expected.shape)
    conv2d.forward(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda(), torch.from_numpy(bias).cuda(), **attrs,
                   kernel="implicit_gemm", out=out)
    assert_close(out.cpu().numpy(), expected, "float16", reduction_length=64 * 9, what="y")
    assert storage[:4].isnan().all()


@pytest.mark.gpu
def test_implicit_gemm_config_variable_is_checked(rng, to_device, monkeypatch):
    x = to_device(random_array(rng, (2, 6, 6, 16), "float16"))
    w = to_device(random_array(rng, (4, 3, 3, 16), "float16"))
    for value in (str(len(IGEMM_CONFIGS)), "-1", "fast"):
        monkeypatch.setenv("GE2_IMPLICIT_GEMM_CONFIG", value)
        with pytest.raises(ValueError, match=f"GE2_IMPLICIT_GEMM_CONFIG: expected a config index "
                                             f"0..{len(IGEMM_CONFIGS) - 1}, got '{value}'"):
            conv2d.forward(x, w, layout="NHWC", kernel="implicit_gemm")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_auto_runs_implicit_gemm_on_nhwc_half(rng, poisoned, to_device, dtype):
    """auto prefers implicit_gemm where it applies; forward_numpy and a torch out go the same way."""
    case = IGEMM_CASES[3]
    check_forward(rng, poisoned, to_device, case, "NHWC", dtype, "auto")
    x, w, bias, attrs = make_problem(rng, case, "NHWC", dtype)
    expected, _ = conv2d.reference(x, w, bias, **attrs)
    y = conv2d.forward_numpy(x, w, bias, **attrs, kernel="implicit_gemm")
    assert_close(y, expected, dtype, reduction_length=24 * 9, what="y")


@pytest.mark.gpu
def test_implicit_gemm_rejects_what_it_cannot_run(rng, to_device):
    x = to_device(random_array(rng, (2, 6, 6, 12), "float16"))
    w = to_device(random_array(rng, (4, 3, 3, 12), "float16"))
    with pytest.raises(ValueError, match="kernel: 'implicit_gemm' cannot run this problem: input channels C must be "
                                         "a multiple of 8 .*got C=12"):
        conv2d.forward(x, w, layout="NHWC", kernel="implicit_gemm")
    x32 = to_device(random_array(rng, (2, 6, 6, 16), "float32"))
    w32 = to_device(random_array(rng, (4, 3, 3, 16), "float32"))
    with pytest.raises(ValueError, match="kernel: 'implicit_gemm' cannot run this problem: float16 and bfloat16"):
        conv2d.forward(x32, w32, layout="NHWC", kernel="implicit_gemm")
    dy = to_device(random_array(rng, (2, 4, 4, 4), "float16"))
    x16 = to_device(random_array(rng, (2, 6, 6, 16), "float16"))
    w16 = to_device(random_array(rng, (4, 3, 3, 16), "float16"))
    with pytest.raises(ValueError, match="kernel: 'implicit_gemm' cannot run this problem: conv2d_backward has no "
                                         "kernel 'implicit_gemm'"):
        conv2d.backward(dy, x16, w16, layout="NHWC", kernel="implicit_gemm")


@pytest.mark.gpu
def test_implicit_gemm_needs_aligned_inputs_and_auto_falls_back(rng):
    """An x view 2 bytes past a 16-byte boundary: the named kernel refuses, auto runs another candidate."""
    torch = pytest.importorskip("torch")
    x, w, bias, attrs = make_problem(rng, IGEMM_CASES[2], "NHWC", "float16")
    storage = torch.empty(x.size + 1, dtype=torch.float16, device="cuda")
    offset_x = storage[1:].view(x.shape)
    offset_x.copy_(torch.from_numpy(x))
    tw, tb = torch.from_numpy(w).cuda(), torch.from_numpy(bias).cuda()
    with pytest.raises(ValueError, match="kernel 'implicit_gemm' needs 16-byte aligned x and w"):
        conv2d.forward(offset_x, tw, tb, **attrs, kernel="implicit_gemm")
    expected, _ = conv2d.reference(x, w, bias, **attrs)
    y = conv2d.forward(offset_x, tw, tb, **attrs)
    assert_close(y.cpu().numpy(), expected, "float16", reduction_length=8 * 9, what="y")


@pytest.mark.parametrize("change, reason", [
    (dict(c=12), "input channels C must be a multiple of 8"),
    (dict(layout="NCHW"), "NHWC only"),
    (dict(dtype="float32"), "float16 and bfloat16 only"),
    (dict(groups=2), "groups == 1 only"),
    (dict(backward=True), "forward only"),
])
def test_implicit_gemm_constraints_name_the_reason(change, reason):
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    c, layout, dtype = change.get("c", 16), change.get("layout", "NHWC"), change.get("dtype", "float16")
    groups = change.get("groups", 1)
    x_shape = (2, 8, 8, c) if layout == "NHWC" else (2, c, 8, 8)
    w_shape = (4, 3, 3, c // groups) if layout == "NHWC" else (4, c // groups, 3, 3)
    geometry = conv2d.check_problem(x_shape, dtype, w_shape, dtype, padding=1, groups=groups, layout=layout)
    assert reason in conv2d.unsupported_reason("implicit_gemm", geometry, "relu", True,
                                               backward=change.get("backward", False))
    base = conv2d.check_problem((2, 8, 8, 16), "bfloat16", (4, 3, 3, 16), "bfloat16", padding=1, layout="NHWC")
    assert conv2d.unsupported_reason("implicit_gemm", base, "relu", True) is None


def test_implicit_gemm_lists_its_configs():
    """kernels() names the tile configs GE2_IMPLICIT_GEMM_CONFIG picks from, indexed as the GPU tests force them."""
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    description = next(row["description"] for row in conv2d.kernels() if row["name"] == "implicit_gemm")
    configs = re.findall(IGEMM_CONFIG_PATTERN + r" \(warp (\d+)x(\d+), (\d) CTAs/SM(, prefetch loop)?(, x via L1)?\)",
                         description)
    assert [int(index) for index, *_ in configs] == list(range(len(configs))) == IGEMM_CONFIGS
    # (BM, BN, warps, stages, warp tile, CTAs per SM, prefetching loop, x through L1), in kConfigs order
    assert [(int(bm), int(bn), int(warps), int(stages), f"{wm}x{wn}", int(ctas), bool(prefetch), bool(l1))
            for _, bm, bn, warps, stages, wm, wn, ctas, prefetch, l1 in configs] == [
        (128, 64, 4, 3, "64x32", 3, False, False), (128, 128, 8, 3, "64x32", 2, False, False),
        (192, 64, 6, 3, "64x32", 2, False, False), (256, 64, 8, 3, "64x32", 1, False, False),
        (64, 64, 4, 4, "32x32", 3, False, False), (128, 128, 4, 3, "64x64", 2, False, False),
        (64, 64, 4, 4, "32x32", 3, True, False), (64, 64, 4, 4, "32x32", 3, True, True),
        (64, 64, 4, 3, "32x32", 4, True, True), (128, 64, 8, 4, "32x32", 2, True, True),
        (64, 128, 4, 3, "32x64", 3, True, True)]


def test_implicit_gemm_takes_filters_up_to_16_wide():
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    for r, s, reason in ((16, 16, None), (17, 3, "filter height R and width S at most 16"),
                         (3, 17, "filter height R and width S at most 16")):
        geometry = conv2d.check_problem((1, 20, 20, 8), "float16", (4, r, s, 8), "float16", padding=1, layout="NHWC")
        got = conv2d.unsupported_reason("implicit_gemm", geometry, "none", False)
        assert got is None if reason is None else reason in got


def test_registry_ranks_implicit_gemm_first_for_nhwc_half():
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    op = OPS["conv2d"]
    attrs = op.validate_attrs({"padding": 1, "layout": "NHWC", "act": "relu"}, "node")
    types = (TensorType((2, 8, 8, 16), "float16"), TensorType((4, 3, 3, 16), "float16"), TensorType((4,), "float16"))
    problem = Problem("conv2d", types, tuple(op.infer(types, attrs)), attrs)
    viable = selection.rank(op, problem).viable
    assert viable[0].name == "implicit_gemm"
    nchw_attrs = op.validate_attrs({"padding": 1}, "node")
    nchw_types = (TensorType((2, 16, 8, 8), "float16"), TensorType((4, 16, 3, 3), "float16"), None)
    nchw = Problem("conv2d", nchw_types, tuple(op.infer(nchw_types, nchw_attrs)), nchw_attrs)
    assert "NHWC only" in next(c for c in op.candidates if c.name == "implicit_gemm").supports(nchw)


@pytest.mark.parametrize("epilogue", [{"act": "relu", "bias": True}, {"clip_min": 0.0, "clip_max": 6.0},
                                      {"clip_min": 0.0, "bias": True}])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_cudnn_declines_a_16bit_depthwise_conv_with_an_epilogue_in_supports(layout, epilogue):
    """mobilenet_v2 float16 on the H200: legacy cuDNN accepted a clip-only epilogue in supports() (the clip bounds
    did not reach the native check) and refused it at launch; it must decline where the ranking is made."""
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")
    op = OPS["conv2d"]
    bias = epilogue.get("bias", False)
    attrs = op.validate_attrs({"padding": 1, "groups": 16, "layout": layout,
                               **{k: v for k, v in epilogue.items() if k != "bias"}}, "node")
    x_shape, w_shape = ((2, 16, 8, 8), (16, 1, 3, 3)) if layout == "NCHW" else ((2, 8, 8, 16), (16, 3, 3, 1))
    types = (TensorType(x_shape, "float16"), TensorType(w_shape, "float16"), TensorType((16,), "float16") if bias
             else None)
    problem = Problem("conv2d", types, tuple(op.infer(types, attrs)), attrs)
    cudnn = next(c for c in op.candidates if c.name == "cudnn")
    expected = "a 16-bit epilogue" if conv2d.has_cudnn() else "has no cuDNN"
    assert expected in (cudnn.supports(problem) or "")
    ranking = selection.rank(op, problem)
    assert "cudnn" not in [c.name for c in ranking.viable]
    assert "im2col_gemm" in [c.name for c in ranking.viable]
    # float32: the epilogue after cuDNN rounds nothing, so cuDNN keeps the problem where it is built
    types32 = tuple(None if t is None else TensorType(t.shape, "float32") for t in types)
    problem32 = Problem("conv2d", types32, tuple(op.infer(types32, attrs)), attrs)
    assert cudnn.supports(problem32) is None or not conv2d.has_cudnn()
