"""The convolutional-network passes: plan_layouts (chains of layout-aware ops in their dtype's preferred layout,
transposes only at the edges) and fold_batch_norm (an inference batch norm folded into the conv2d before it).
Op counts before and after, and the CPU backend's results unchanged by each rewrite."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ir import Graph
from graph_executor_v2.ops import OPS, batch_norm
from graph_executor_v2.passes import PASSES, PassManager
from graph_executor_v2.testing import assert_close, random_array


def _stand_in_conv2d():
    """A NumPy-only conv2d OpDef with the schema the conv2d op has (inputs x, w, bias?; attrs layout, stride,
    padding, dilation, groups, act; weight KCRS for NCHW, KRSC for NHWC), registered only while the real op (branch
    wip/conv) is absent from this tree, so the passes are exercised either way. groups 1, no activation."""
    from graph_executor_v2.ir.types import TensorType
    from graph_executor_v2.ops._base import Attr, Input, OpDef

    def to_nchw(x, w, layout):
        return (x, w) if layout == "NCHW" else (x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2))

    def out_size(size, kernel, stride, padding, dilation):
        return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1

    def infer(in_types, attrs):
        x, w, _ = in_types
        n, c, h, wd = x.shape if attrs["layout"] == "NCHW" else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
        k, r, s_ = (w.shape[0], w.shape[2], w.shape[3]) if attrs["layout"] == "NCHW" else w.shape[:3]
        (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
        oh, ow = out_size(h, r, sh, ph, dh), out_size(wd, s_, sw, pw, dw)
        return [TensorType((n, k, oh, ow) if attrs["layout"] == "NCHW" else (n, oh, ow, k), x.dtype)]

    def reference(inputs, attrs):
        x, w = to_nchw(np.asarray(inputs[0], np.float64), np.asarray(inputs[1], np.float64), attrs["layout"])
        (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
        padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        oh, ow = out_size(x.shape[2], w.shape[2], sh, ph, dh), out_size(x.shape[3], w.shape[3], sw, pw, dw)
        y = np.zeros((x.shape[0], w.shape[0], oh, ow))
        for r in range(w.shape[2]):
            for s_ in range(w.shape[3]):
                taps = padded[:, :, r * dh:r * dh + sh * (oh - 1) + 1:sh, s_ * dw:s_ * dw + sw * (ow - 1) + 1:sw]
                y += np.einsum("nchw,kc->nkhw", taps, w[:, :, r, s_])
        if inputs[2] is not None:
            y += np.asarray(inputs[2], np.float64)[None, :, None, None]
        return [y if attrs["layout"] == "NCHW" else y.transpose(0, 2, 3, 1)]

    pair = dict(kind=tuple)
    return OpDef(name="conv2d", inputs=(Input("x"), Input("w"), Input("bias", optional=True)), outputs=("y",),
                 attrs=(Attr("layout", str, "NCHW", choices=("NCHW", "NHWC")), Attr("stride", default=(1, 1), **pair),
                        Attr("padding", default=(0, 0), **pair), Attr("dilation", default=(1, 1), **pair),
                        Attr("groups", int, 1, choices=(1,)), Attr("act", str, "none", choices=("none",))),
                 infer=infer, reference=reference, doc="stand-in conv2d for the pass tests")


@pytest.fixture
def conv2d():
    """The conv2d op: the real one when registered, else the stand-in for the duration of the test."""
    if "conv2d" in OPS:
        yield OPS["conv2d"]
        return
    OPS["conv2d"] = _stand_in_conv2d()
    try:
        yield OPS["conv2d"]
    finally:
        del OPS["conv2d"]


def _statistics(g, rng, channels, prefix):
    arrays = (rng.standard_normal(channels), rng.standard_normal(channels), rng.standard_normal(channels),
              rng.random(channels) + 0.5)
    return [g.param(f"{prefix}_{name}", a.astype(np.float32)) for name, a in zip(batch_norm.PARAMETERS, arrays)]


def _run_pass(name, graph):
    rewritten, records = PassManager([PASSES[name]], verify_each=True).run(graph)
    return rewritten, records[0]


def _same_results(before: Graph, after: Graph, feeds: dict, dtype: str, length: int = 1):
    expected = ge2.ExecutorV2(before, device="cpu", passes=[]).run(feeds)
    got = ge2.ExecutorV2(after, device="cpu", passes=[]).run(feeds)
    for name in expected:
        assert_close(got[name], expected[name].astype(np.float64), dtype, length, what=name)


def _layout_nodes(graph: Graph):
    return [n for n in graph.nodes if "layout" in n.attrs]


def _pool_bn_chain(rng, dtype, layout="NCHW"):
    """bn -> relu -> bn -> (+ the first relu) -> max_pool -> global_avg_pool, all in ``layout``."""
    g = Graph("chain")
    shape = (2, 8, 9, 9) if layout == "NCHW" else (2, 9, 9, 8)
    x = g.input("x", shape, dtype)
    a = g.relu(g.batch_norm(x, *_statistics(g, rng, 8, "bn1"), layout=layout)[0])
    b = g.batch_norm(a, *_statistics(g, rng, 8, "bn2"), layout=layout)[0]
    pooled, _ = g.max_pool2d(g.add(b, a), kernel_size=3, stride=2, padding=1, layout=layout)
    g.output(g.global_avg_pool(pooled, layout=layout), "out")
    return g, {"x": random_array(rng, shape, dtype)}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_plan_layouts_keeps_a_chain_in_nhwc(rng, dtype):
    g, feeds = _pool_bn_chain(rng, dtype)
    assert g.op_counts().get("transpose", 0) == 0
    after, record = _run_pass("plan_layouts", g)
    assert all(n.attrs["layout"] == "NHWC" for n in _layout_nodes(after))
    # the input's transpose; the pooled [N, 1, 1, C] output goes back to [N, C, 1, 1] as a reshape (a view)
    assert after.op_counts()["transpose"] == 1 and after.op_counts()["reshape"] == 1
    assert {k: v for k, v in after.op_counts().items() if k not in ("transpose", "reshape")} == g.op_counts()
    assert record.changed and "1 activation transpose(s) remain" in record.notes[-1]
    _same_results(g, after, feeds, dtype, 16)


def test_plan_layouts_moves_float32_nhwc_to_nchw_and_leaves_nchw_alone(rng):
    g, feeds = _pool_bn_chain(rng, "float32", "NHWC")
    after, _ = _run_pass("plan_layouts", g)
    assert all(n.attrs["layout"] == "NCHW" for n in _layout_nodes(after))
    assert after.op_counts()["transpose"] == 1 and after.op_counts()["reshape"] == 1
    _same_results(g, after, feeds, "float32", 16)
    unchanged, record = _run_pass("plan_layouts", after)
    assert not record.changed and unchanged.op_counts() == after.op_counts()


def test_plan_layouts_covers_the_backward_ops(rng):
    """A training graph: forward pool/bn plus the backward ops of their grad rules, all moved, edges only."""
    g = Graph("train_chain")
    x = g.input("x", (2, 8, 7, 7), "float16")
    params = [g.input(name, (8,), "float32") for name in batch_norm.PARAMETERS]
    bn = g.batch_norm(x, *params, training=True)
    y, _ = g.max_pool2d(bn[0], kernel_size=2)
    dy = g.input("dy", y.type.shape, "float16")
    (dbn,) = OPS["max_pool2d"].grad(g, y.producer, [dy, None])
    dx, dgamma, _, _, _ = OPS["batch_norm"].grad(g, bn[0].producer, [dbn, None, None, None, None])
    for name, value in (("y", y), ("dx", dx), ("dgamma", dgamma), ("running_var", bn[4])):
        g.output(value, name)
    after, _ = _run_pass("plan_layouts", g)
    assert all(n.attrs["layout"] == "NHWC" for n in _layout_nodes(after))
    assert after.op_counts()["transpose"] == 4  # in: x, dy; out: y, dx
    feeds = {"x": random_array(rng, (2, 8, 7, 7), "float16"), "dy": random_array(rng, y.type.shape, "float16"),
             "gamma": np.ones(8, np.float32), "beta": np.zeros(8, np.float32),
             "running_mean": np.zeros(8, np.float32), "running_var": np.ones(8, np.float32)}
    _same_results(g, after, feeds, "float16", 98)


def _conv_bn(rng, dtype, layout="NCHW", training=False, bias=True):
    g = Graph("conv_bn")
    shape = (2, 3, 8, 8) if layout == "NCHW" else (2, 8, 8, 3)
    w_shape = (6, 3, 3, 3)  # KCRS or KRSC: 3 input channels, 3 x 3
    x = g.input("x", shape, dtype)
    w = g.param("w", random_array(rng, w_shape, dtype, 0.3))
    b = g.param("b", random_array(rng, (6,), dtype)) if bias else None
    conv = g.conv2d(x, w, b, stride=(1, 1), padding=(1, 1), layout=layout)
    outputs = g.batch_norm(conv, *_statistics(g, rng, 6, "bn"), training=training, layout=layout)
    g.output(g.relu(outputs[0]), "y")
    return g, {"x": random_array(rng, shape, dtype)}, conv, outputs


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fold_batch_norm_into_conv(rng, conv2d, bias, layout):
    g, feeds, _, _ = _conv_bn(rng, "float32", layout, bias=bias)
    after, record = _run_pass("fold_batch_norm", g)
    assert g.op_counts()["batch_norm"] == 1 and "batch_norm" not in after.op_counts()
    assert after.op_counts()["conv2d"] == 1 and record.changed
    _same_results(g, after, feeds, "float32", 27)


def test_fold_batch_norm_guards(rng, conv2d):
    g, _, _, _ = _conv_bn(rng, "float32", training=True)
    assert not _run_pass("fold_batch_norm", g)[1].changed  # training: batch statistics, nothing to fold
    g, _, conv, _ = _conv_bn(rng, "float32")
    g.output(conv, "conv_too")  # the conv's own output is needed
    assert not _run_pass("fold_batch_norm", g)[1].changed
    g, _, _, outputs = _conv_bn(rng, "float32")
    g.output(outputs[1], "saved_mean")  # a statistic output is read
    assert not _run_pass("fold_batch_norm", g)[1].changed


def test_fold_batch_norm_runs_in_the_default_pipeline(rng, conv2d):
    g, feeds, _, _ = _conv_bn(rng, "float32")
    executor = ge2.ExecutorV2(g, device="cpu")
    assert_close(executor.run(feeds)["y"], ge2.ExecutorV2(g, device="cpu", passes=[]).run(feeds)["y"]
                 .astype(np.float64), "float32", 27)


def test_plan_layouts_on_a_conv_chain(rng, conv2d):
    g = Graph("convs")
    x = g.input("x", (2, 4, 8, 8), "float16")
    h = x
    for index in range(3):
        w = g.param(f"w{index}", random_array(rng, (4, 4, 3, 3), "float16", 0.2))
        h = g.relu(g.batch_norm(g.conv2d(h, w, None, stride=(1, 1), padding=(1, 1)),
                                *_statistics(g, rng, 4, f"bn{index}"))[0])
    g.output(h, "y")
    after, _ = _run_pass("plan_layouts", g)
    assert all(n.attrs["layout"] == "NHWC" for n in _layout_nodes(after))
    activation_transposes = [n for n in after.nodes if n.op == "transpose" and not n.inputs[0].is_param]
    assert len(activation_transposes) == 2  # the input and the output; weight transposes fold as constants
    _same_results(g, after, {"x": random_array(rng, (2, 4, 8, 8), "float16")}, "float16", 36)


@pytest.mark.parametrize("keepdims", [True, False])
def test_plan_layouts_sinks_transposes_through_reductions(rng, conv2d, keepdims):
    """A squeeze-and-excitation block as exporters write it (EfficientNet's ReduceMean over H and W): in NHWC the
    mean reads the conv's output directly; the transposed copy of the activation it read before is gone."""
    g = Graph("squeeze_excite")
    x = g.input("x", (2, 8, 6, 6), "float16")
    h = g.relu(g.conv2d(x, g.param("w", random_array(rng, (8, 8, 3, 3), "float16", 0.2)), None, stride=(1, 1),
                        padding=(1, 1)))
    squeezed = g.mean(h, axis=(2, 3), keepdims=keepdims)
    if keepdims:  # [N, C, 1, 1] scales the activation
        g.output(g.mul(g.sigmoid(squeezed), h), "y")
        g.output(g.max(h, axis=3, keepdims=False), "z")  # [N, C, H]: NHWC's [N, H, C] transposed back
    else:  # [N, C] feeds a classifier
        g.output(g.gemm(squeezed, g.param("fc", random_array(rng, (8, 4), "float16", 0.3))), "y")
    after, record = _run_pass("plan_layouts", g)
    assert all(n.attrs["layout"] == "NHWC" for n in _layout_nodes(after))
    reductions = [n for n in after.nodes if n.op in ("mean", "max")]
    assert all(n.inputs[0].producer.op == "conv2d" or n.inputs[0].producer.op == "relu" for n in reductions)
    assert [n.attrs["axis"] for n in reductions if n.op == "mean"] == [(1, 2)]
    activation_transposes = [n for n in after.nodes if n.op == "transpose" and not n.inputs[0].is_param]
    assert len(activation_transposes) == (3 if keepdims else 1), record.notes[-1]  # x in; y back (and z's order)
    _same_results(g, after, {"x": random_array(rng, (2, 8, 6, 6), "float16")}, "float16", 72)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_plan_layouts_keeps_an_upsampling_between_convs_channels_last(rng, conv2d, mode):
    """conv -> relu -> resize 2x -> conv (a segmentation head's, a U-Net's upsampling): the resize runs on the NHWC
    activation (layout="NHWC"), so the region has one transpose in and one out, none around the resize."""
    g = Graph("upsample")
    x = g.input("x", (2, 8, 5, 6), "float16")
    h = g.relu(g.conv2d(x, g.param("w1", random_array(rng, (8, 8, 3, 3), "float16", 0.2)), None, stride=(1, 1),
                        padding=(1, 1)))
    up = g.resize(h, size=(10, 12), mode=mode)
    g.output(g.conv2d(up, g.param("w2", random_array(rng, (4, 8, 3, 3), "float16", 0.2)), None, stride=(1, 1),
                      padding=(1, 1)), "y")
    after, record = _run_pass("plan_layouts", g)
    (resize,) = [n for n in after.nodes if n.op == "resize"]
    assert resize.attrs["layout"] == "NHWC" and resize.inputs[0].producer.op == "relu"
    activation_transposes = [n for n in after.nodes if n.op == "transpose" and not n.inputs[0].is_param]
    assert len(activation_transposes) == 2, record.notes[-1]
    _same_results(g, after, {"x": random_array(rng, (2, 8, 5, 6), "float16")}, "float16", 144)


# --- the float32 layout by measurement ----------------------------------------------------------------------------
def _float32_conv_chain(rng, channels=8):
    g = Graph("float32_convs")
    x = g.input("x", (2, channels, 6, 6), "float32")
    h = x
    for index in range(2):
        w = g.param(f"w{index}", random_array(rng, (channels, channels, 3, 3), "float32", 0.2))
        h = g.relu(g.conv2d(h, w, None, stride=(1, 1), padding=(1, 1)))
    g.output(h, "y")
    return g


@pytest.mark.parametrize("nhwc_ms, expected", [(0.5, "NHWC"), (0.99, "NCHW"), (RuntimeError("no plan"), "NCHW")])
def test_plan_layouts_chooses_the_float32_layout_its_measurement_finds_faster(rng, conv2d, nhwc_ms, expected):
    """An executor on CUDA passes ``measure``: the float32 convolutions take NHWC only when it is more than 3% faster
    in sum (NCHW 1 ms each here); a timing that fails keeps NCHW. The note states both sums, or the failure."""
    g = _float32_conv_chain(rng)
    asked = []

    def measure(node, layout):
        asked.append((node.name, layout))
        if isinstance(nhwc_ms, Exception) and layout == "NHWC":
            raise nhwc_ms
        return 1.0 if layout == "NCHW" else nhwc_ms

    rewritten, records = PassManager([ge2.passes.Pass("plan_layouts", lambda graph: ge2.passes.plan_layouts(
        graph, measure=measure))], verify_each=True).run(g)
    assert {n.attrs["layout"] for n in _layout_nodes(rewritten)} == {expected}
    assert {name for name, _ in asked} == {"conv2d_0"}  # conv2d_1 is the same problem: timed once, counted twice
    if isinstance(nhwc_ms, Exception):
        assert records[0].notes[0] == "float32 layout: NCHW (timing it in NHWC failed: no plan)"
    else:
        assert records[0].notes[0] == (f"float32 layout by measurement: the 1 costliest of 1 convolution problem(s) "
                                       f"(100% of the FLOPs), NCHW 2.0000 ms, NHWC {2 * nhwc_ms:.4f} ms -> {expected}")
    _same_results(g, rewritten, {"x": random_array(rng, (2, 8, 6, 6), "float32")}, "float32", 72)


def test_the_float32_layout_measures_the_costliest_convolution_problems_only(rng, conv2d):
    """A convolution with 90% of the FLOPs is timed; the small one (10%) is not: the timed problems stop at 80% of
    the FLOPs (or 8 problems), so a network of many conv shapes plans a bounded number of one-conv graphs."""
    g = Graph("two_sizes")
    big, small = g.input("big", (2, 8, 24, 24), "float32"), g.input("small", (2, 8, 8, 8), "float32")
    w = g.param("w", random_array(rng, (8, 8, 3, 3), "float32", 0.2))
    g.output(g.conv2d(big, w, None, stride=(1, 1), padding=(1, 1)), "y_big")
    g.output(g.conv2d(small, w, None, stride=(1, 1), padding=(1, 1)), "y_small")
    asked = []

    def measure(node, layout):
        asked.append(node.inputs[0].name)
        return 1.0

    _, records = PassManager([ge2.passes.Pass("plan_layouts", lambda graph: ge2.passes.plan_layouts(
        graph, measure=measure))]).run(g)
    assert set(asked) == {"big"}
    assert records[0].notes[0].startswith("float32 layout by measurement: the 1 costliest of 2 convolution problem(s) "
                                          "(90% of the FLOPs)")


def test_the_layout_timer_plans_the_convolution_alone_in_the_asked_layout(rng, conv2d):
    """The graph the timer plans: the node's conv2d with its operands as inputs, x, w and the residual permuted into
    the asked layout (KRSC weights for NHWC), the bias as it is, every other attribute kept."""
    from graph_executor_v2.runtime.layout_timing import _single_conv

    g = Graph("g")
    x = g.input("x", (2, 4, 7, 5), "float16")
    w = g.param("w", random_array(rng, (6, 4, 3, 3), "float16"))
    bias = g.param("b", random_array(rng, (6,), "float16"))
    y = g.conv2d(x, w, bias, stride=(2, 1), padding=(1, 1), act="relu")
    alone = _single_conv(y.producer, "NHWC")
    assert [tuple(v.type.shape) for v in alone.inputs] == [(2, 7, 5, 4), (6, 3, 3, 4), (6,)]
    (node,) = alone.nodes
    assert node.attrs == {**y.producer.attrs, "layout": "NHWC"}
    assert alone.outputs["y"].type.shape == (2, 4, 5, 6)
    assert [tuple(v.type.shape) for v in _single_conv(y.producer, "NCHW").inputs] == [(2, 4, 7, 5), (6, 4, 3, 3),
                                                                                      (6,)]


@pytest.mark.gpu
def test_an_executor_on_cuda_measures_the_float32_layout(rng):
    """ExecutorV2 on CUDA times the float32 convolutions in both layouts before it plans the layouts (the note in
    explain() says the sums and the choice); either way the result matches float64."""
    g = _float32_conv_chain(rng, channels=32)
    executor = ge2.ExecutorV2(g, device="cuda", precision="highest")
    (record,) = [r for r in executor.pass_records if r.name == "plan_layouts"]
    assert record.notes[0].startswith("float32 layout by measurement: the 1 costliest of 1 convolution problem(s)")
    feeds = {"x": random_array(rng, (2, 32, 6, 6), "float32")}
    expected = ge2.ExecutorV2(g, device="cpu", passes=[]).run(feeds)["y"]
    assert_close(executor.run(feeds)["y"], expected.astype(np.float64), "float32", 288)
