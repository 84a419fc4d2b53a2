"""The convolutional-network passes: plan_layouts (chains of layout-aware ops in their dtype's preferred layout,
transposes only at the edges) and fold_batch_norm (an inference batch norm folded into the conv2d before it).
Op counts before and after, and the CPU backend's results unchanged by each rewrite."""
from __future__ import annotations

import functools
import re

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


COPY_BYTES_PER_S = 1e12  # the stand-in device's copy bandwidth: 1000 GB/s
CHAIN_EDGE_BYTES = 2 * 2 * (2 * 8 * 6 * 6 * 4)  # _float32_conv_chain: x in and y out, each read and written once


def _plan_layouts_measured(graph, measure, copy_bytes_per_s=COPY_BYTES_PER_S):
    return PassManager([ge2.passes.Pass("plan_layouts", lambda g: ge2.passes.plan_layouts(
        g, measure=measure, copy_bytes_per_s=copy_bytes_per_s))], verify_each=True).run(graph)


def _conv_layouts(graph) -> dict:
    """{input channels: layout} of the graph's convolutions (the tests give each region its own channel count)."""
    return {n.inputs[1].type.shape[1 if n.attrs["layout"] == "NCHW" else 3]: n.attrs["layout"]
            for n in graph.nodes if n.op == "conv2d"}


@pytest.mark.parametrize("nhwc_ms, expected", [(0.5, "NHWC"), (0.99, "NCHW")])
def test_plan_layouts_chooses_the_float32_layout_its_measurement_finds_faster(rng, conv2d, nhwc_ms, expected):
    """An executor on CUDA passes ``measure`` and the copy bandwidth: the float32 region takes NHWC only when it is
    more than 3% faster in sum, its edge transposes included (NCHW 1 ms each here). The notes state the timed share,
    then the region: its convs, both sums, the transposes' cost and the choice."""
    g = _float32_conv_chain(rng)
    asked = []

    def measure(node, layout):
        asked.append((node.name, layout))
        return 1.0 if layout == "NCHW" else nhwc_ms

    rewritten, records = _plan_layouts_measured(g, measure)
    assert {n.attrs["layout"] for n in _layout_nodes(rewritten)} == {expected}
    assert asked == [("conv2d_0", "NCHW"), ("conv2d_0", "NHWC")]  # conv2d_1 is the same problem: timed once
    assert list(records[0].notes[:2]) == [
        "float32 layout by measurement: the 1 costliest of 1 convolution problem(s) (100% of the FLOPs), 1 region(s)",
        f"float32 region 1 of 1: 2 conv(s) (conv2d_0, conv2d_1), 2 timed: NCHW 2.0000 ms, NHWC {2 * nhwc_ms:.4f} ms, "
        f"NHWC + {CHAIN_EDGE_BYTES / COPY_BYTES_PER_S * 1e3:.4f} ms of transposes (2 at its edges, "
        f"{CHAIN_EDGE_BYTES} bytes at 1000 GB/s) -> {expected}"]
    _same_results(g, rewritten, {"x": random_array(rng, (2, 8, 6, 6), "float32")}, "float32", 72)


@pytest.mark.parametrize("nhwc_ms, reason", [
    (RuntimeError("no plan"), "timing conv2d_0 in NHWC failed: no plan"),
    (float("nan"), "timing conv2d_0 in NHWC failed: measure returned nan, expected a positive finite time in ms"),
    (-1.0, "timing conv2d_0 in NHWC failed: measure returned -1.0, expected a positive finite time in ms"),
    ("0.5", "timing conv2d_0 in NHWC failed: measure returned '0.5', expected a positive finite time in ms")])
def test_a_failing_or_bad_measurement_keeps_the_region_in_nchw(rng, conv2d, nhwc_ms, reason):
    g = _float32_conv_chain(rng)

    def measure(node, layout):
        if layout == "NCHW":
            return 1.0
        if isinstance(nhwc_ms, Exception):
            raise nhwc_ms
        return nhwc_ms

    rewritten, records = _plan_layouts_measured(g, measure)
    assert {n.attrs["layout"] for n in _layout_nodes(rewritten)} == {"NCHW"}
    assert records[0].notes[1] == f"float32 region 1 of 1: 2 conv(s) (conv2d_0, conv2d_1), 2 timed: NCHW ({reason})"


@pytest.mark.parametrize("copy_bytes_per_s, expected", [(1e12, "NHWC"), (CHAIN_EDGE_BYTES / 0.2e-3, "NCHW")])
def test_the_edge_transposes_decide_a_marginal_region(rng, conv2d, copy_bytes_per_s, expected):
    """NHWC's convs are 10% faster (1.8 against 2.0 ms); at a copy bandwidth where the region's two edge transposes
    take 0.2 ms, NHWC's total is 2.0 ms and the region stays NCHW."""
    g = _float32_conv_chain(rng)
    rewritten, records = _plan_layouts_measured(g, lambda node, layout: 1.0 if layout == "NCHW" else 0.9,
                                                copy_bytes_per_s)
    assert {n.attrs["layout"] for n in _layout_nodes(rewritten)} == {expected}
    transposes_ms = CHAIN_EDGE_BYTES / copy_bytes_per_s * 1e3
    assert records[0].notes[1].endswith(f"NCHW 2.0000 ms, NHWC 1.8000 ms, NHWC + {transposes_ms:.4f} ms of "
                                        f"transposes (2 at its edges, {CHAIN_EDGE_BYTES} bytes at "
                                        f"{copy_bytes_per_s / 1e9:.0f} GB/s) -> {expected}")


def _two_regions(rng, second_channels=8):
    """conv (4 -> 8 channels, 16x16) -> relu -> pad (not layout-free: the regions' border) -> conv (``second_channels``
    -> 8, 4x4, stride 2) -> relu: two float32 regions with a transpose pair between them when they differ."""
    g = Graph("two_regions")
    x = g.input("x", (2, 4, 16, 16), "float32")
    first = g.relu(g.conv2d(x, g.param("w0", random_array(rng, (8, 4, 3, 3), "float32", 0.3)), None,
                            stride=(1, 1), padding=(1, 1)))
    padded = g.pad(first, pads=(0, 0, 1, 1, 0, second_channels - 8, 1, 1))
    g.output(g.relu(g.conv2d(padded, g.param("w1", random_array(rng, (8, second_channels, 3, 3), "float32", 0.2)),
                             None, stride=(2, 2), padding=(1, 1))), "y")
    return g, {"x": random_array(rng, (2, 4, 16, 16), "float32")}


@pytest.mark.parametrize("nhwc_channels", [4, 8])
def test_two_regions_with_opposite_preferences_take_opposite_layouts(rng, conv2d, nhwc_channels):
    """Each region is timed on its own convolution (the stub's NHWC is twice as fast for one, twice as slow for the
    other), and each takes its faster layout; the result is the original graph's."""
    g, feeds = _two_regions(rng)
    asked = []

    def measure(node, layout):
        channels = node.inputs[1].type.shape[1]
        asked.append((channels, layout))
        return 1.0 if layout == "NCHW" else (0.5 if channels == nhwc_channels else 2.0)

    rewritten, records = _plan_layouts_measured(g, measure)
    assert _conv_layouts(rewritten) == {nhwc_channels: "NHWC", 12 - nhwc_channels: "NCHW"}
    assert sorted(asked) == [(4, "NCHW"), (4, "NHWC"), (8, "NCHW"), (8, "NHWC")]
    notes = records[0].notes
    assert notes[0].endswith("(100% of the FLOPs), 2 region(s)")
    first, second = ("NHWC", "NCHW") if nhwc_channels == 4 else ("NCHW", "NHWC")
    assert notes[1].startswith("float32 region 1 of 2: 1 conv(s) (conv2d_0), 1 timed: NCHW 1.0000 ms, NHWC "
                               f"{0.5 if first == 'NHWC' else 2.0:.4f} ms, NHWC + ")
    assert notes[1].endswith(f"-> {first}") and notes[2].endswith(f"-> {second}")
    assert notes[2].startswith("float32 region 2 of 2: 1 conv(s) (conv2d_1), 1 timed: NCHW 1.0000 ms")
    _same_results(g, rewritten, feeds, "float32", 72)


def test_a_problem_shared_by_two_regions_is_timed_once(rng, conv2d):
    g = Graph("shared_problem")
    w = g.param("w", random_array(rng, (8, 8, 3, 3), "float32", 0.2))
    x = g.input("x", (2, 8, 6, 6), "float32")
    first = g.relu(g.conv2d(x, w, None, stride=(1, 1), padding=(1, 1)))
    g.output(g.conv2d(g.pad(first, pads=(0, 0, 0, 0, 0, 0, 0, 0)), w, None, stride=(1, 1), padding=(1, 1)), "y")
    asked = []

    def measure(node, layout):
        asked.append(layout)
        return 1.0 if layout == "NCHW" else 0.5

    _, records = _plan_layouts_measured(g, measure)
    assert asked == ["NCHW", "NHWC"]
    assert [note.split(": ", 1)[1][:48] for note in records[0].notes[1:3]] == [
        "1 conv(s) (conv2d_0), 1 timed: NCHW 1.0000 ms, N", "1 conv(s) (conv2d_1), 1 timed: NCHW 1.0000 ms, N"]


def test_a_failed_timing_keeps_only_its_own_region_in_nchw(rng, conv2d):
    g, feeds = _two_regions(rng)

    def measure(node, layout):
        if node.inputs[1].type.shape[1] == 8 and layout == "NHWC":
            raise ValueError("no kernel")
        return 1.0 if layout == "NCHW" else 0.5

    rewritten, records = _plan_layouts_measured(g, measure)
    assert _conv_layouts(rewritten) == {4: "NHWC", 8: "NCHW"}
    assert records[0].notes[2] == ("float32 region 2 of 2: 1 conv(s) (conv2d_1), 1 timed: NCHW (timing conv2d_1 in "
                                   "NHWC failed: no kernel)")
    _same_results(g, rewritten, feeds, "float32", 72)


def test_a_residual_block_is_one_region_with_one_transpose_at_each_edge(rng, conv2d):
    """conv -> relu -> conv, + the block's input, relu: the add joins both convs and the input into one region;
    in NHWC only the input's transpose in and the output's back remain."""
    g = Graph("residual")
    x = g.input("x", (2, 8, 6, 6), "float32")
    h = g.relu(g.conv2d(x, g.param("w0", random_array(rng, (8, 8, 3, 3), "float32", 0.2)), None, stride=(1, 1),
                        padding=(1, 1)))
    h = g.conv2d(h, g.param("w1", random_array(rng, (8, 8, 1, 1), "float32", 0.3)), None, stride=(1, 1),
                 padding=(0, 0))
    g.output(g.relu(g.add(h, x)), "y")
    rewritten, records = _plan_layouts_measured(g, lambda node, layout: 1.0 if layout == "NCHW" else 0.5)
    assert records[0].notes[0].endswith(", 1 region(s)")
    assert f"(2 at its edges, {CHAIN_EDGE_BYTES} bytes" in records[0].notes[1]
    assert len([n for n in rewritten.nodes if n.op == "transpose" and not n.inputs[0].is_param]) == 2
    _same_results(g, rewritten, {"x": random_array(rng, (2, 8, 6, 6), "float32")}, "float32", 81)


def test_a_transpose_that_is_a_view_costs_nothing_at_a_region_edge(rng, conv2d):
    """A region ending in a global mean with keepdims: its [N, C, 1, 1] output's transpose back is a view (a
    reshape), so only the input's transpose in is charged."""
    g = Graph("pooled")
    x = g.input("x", (2, 8, 6, 6), "float32")
    h = g.relu(g.conv2d(x, g.param("w", random_array(rng, (8, 8, 3, 3), "float32", 0.2)), None, stride=(1, 1),
                        padding=(1, 1)))
    g.output(g.mean(h, axis=(2, 3), keepdims=True), "y")
    rewritten, records = _plan_layouts_measured(g, lambda node, layout: 1.0 if layout == "NCHW" else 0.5)
    assert f"(1 at its edges, {CHAIN_EDGE_BYTES // 2} bytes at 1000 GB/s) -> NHWC" in records[0].notes[1]
    _same_results(g, rewritten, {"x": random_array(rng, (2, 8, 6, 6), "float32")}, "float32", 72)


@pytest.mark.parametrize("copy_bytes_per_s, expected", [(1e12, "NCHW"), (1e9, "NHWC")])
def test_a_channels_last_region_charges_the_transposes_to_nchw(rng, conv2d, copy_bytes_per_s, expected):
    """A float32 region already in NHWC (a hand-built graph) pays the transposes at its edges only if it moves to
    NCHW: NCHW's convs are 20% faster here (0.008 against 0.010 ms), but not with 0.0092 ms of transposes (1 GB/s)."""
    g = Graph("channels_last")
    x = g.input("x", (2, 6, 6, 8), "float32")
    h = x
    for index in range(2):
        w = g.param(f"w{index}", random_array(rng, (8, 3, 3, 8), "float32", 0.2))
        h = g.relu(g.conv2d(h, w, None, stride=(1, 1), padding=(1, 1), layout="NHWC"))
    g.output(h, "y")
    rewritten, records = _plan_layouts_measured(g, lambda node, layout: 0.004 if layout == "NCHW" else 0.005,
                                                copy_bytes_per_s)
    assert {n.attrs["layout"] for n in _layout_nodes(rewritten)} == {expected}
    assert records[0].notes[1].endswith(
        f"NCHW 0.0080 ms, NHWC 0.0100 ms, NCHW + {CHAIN_EDGE_BYTES / copy_bytes_per_s * 1e3:.4f} ms of transposes "
        f"(2 at its edges, {CHAIN_EDGE_BYTES} bytes at {copy_bytes_per_s / 1e9:.0f} GB/s) -> {expected}")
    _same_results(g, rewritten, {"x": random_array(rng, (2, 6, 6, 8), "float32")}, "float32", 72)


@pytest.mark.parametrize("copy_bytes_per_s", [None, 0.0, float("inf"), True, "1e12"])
def test_plan_layouts_refuses_a_measure_without_a_copy_bandwidth(rng, conv2d, copy_bytes_per_s):
    with pytest.raises(ValueError, match="copy_bytes_per_s: expected a positive number of bytes per second"):
        ge2.passes.plan_layouts(_float32_conv_chain(rng), measure=lambda node, layout: 1.0,
                                copy_bytes_per_s=copy_bytes_per_s)


def test_the_float32_layout_measures_the_costliest_convolution_problems_only(rng, conv2d):
    """A convolution with 90% of the FLOPs is timed; the small one (10%) is not: the timed problems stop at 80% of
    the FLOPs (or 8 problems), so a network of many conv shapes plans a bounded number of one-conv graphs. The small
    one's region keeps NCHW and its note says why."""
    g = Graph("two_sizes")
    big, small = g.input("big", (2, 8, 24, 24), "float32"), g.input("small", (2, 8, 8, 8), "float32")
    w = g.param("w", random_array(rng, (8, 8, 3, 3), "float32", 0.2))
    g.output(g.conv2d(big, w, None, stride=(1, 1), padding=(1, 1)), "y_big")
    g.output(g.conv2d(small, w, None, stride=(1, 1), padding=(1, 1)), "y_small")
    asked = []

    def measure(node, layout):
        asked.append(node.inputs[0].name)
        return 1.0 if layout == "NCHW" else 0.5

    rewritten, records = _plan_layouts_measured(g, measure)
    assert set(asked) == {"big"}
    assert records[0].notes[0] == ("float32 layout by measurement: the 1 costliest of 2 convolution problem(s) "
                                   "(90% of the FLOPs), 2 region(s)")
    assert records[0].notes[2] == ("float32 region 2 of 2: 1 conv(s) (conv2d_1), 0 timed: NCHW (none of its "
                                   "convolutions is among the costliest problems)")
    assert [n.attrs["layout"] for n in rewritten.nodes if n.op == "conv2d"] == ["NHWC", "NCHW"]


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


# a region's note after a measurement on the GPU: both sums, NHWC's edge transposes, the choice
MEASURED_SUMS = (r"NCHW \d+\.\d{4} ms, NHWC \d+\.\d{4} ms, NHWC \+ \d+\.\d{4} ms of transposes \(2 at its edges, "
                 r"\d+ bytes at \d+ GB/s\) -> (NCHW|NHWC)")


@pytest.mark.gpu
def test_an_executor_on_cuda_measures_the_float32_layout(rng):
    """ExecutorV2 on CUDA times the float32 convolutions in both layouts before it plans the layouts (the note in
    explain() says the sums and the choice); either way the result matches float64."""
    g = _float32_conv_chain(rng, channels=32)
    executor = ge2.ExecutorV2(g, device="cuda", precision="highest")
    (record,) = [r for r in executor.pass_records if r.name == "plan_layouts"]
    assert record.notes[0] == ("float32 layout by measurement: the 1 costliest of 1 convolution problem(s) (100% of "
                               "the FLOPs), 1 region(s)")
    assert re.fullmatch(r"float32 region 1 of 1: 2 conv\(s\) \(conv2d_0, conv2d_1\), 2 timed: " + MEASURED_SUMS,
                        record.notes[1]), record.notes[1]
    assert record.notes[1] in executor.explain()
    feeds = {"x": random_array(rng, (2, 32, 6, 6), "float32")}
    expected = ge2.ExecutorV2(g, device="cpu", passes=[]).run(feeds)["y"]
    assert_close(executor.run(feeds)["y"], expected.astype(np.float64), "float32", 288)


@pytest.mark.gpu
def test_an_executor_on_cuda_measures_each_float32_region(rng):
    """Two float32 regions apart (a pad between them): each is timed and chosen on its own, explain() lists both,
    and the result matches float64 whatever they chose."""
    g, feeds = _two_regions(rng)
    executor = ge2.ExecutorV2(g, device="cuda", precision="highest")
    (record,) = [r for r in executor.pass_records if r.name == "plan_layouts"]
    assert record.notes[0].endswith("(100% of the FLOPs), 2 region(s)")
    for number, conv in ((1, "conv2d_0"), (2, "conv2d_1")):
        note = record.notes[number]
        assert re.fullmatch(rf"float32 region {number} of 2: 1 conv\(s\) \({conv}\), 1 timed: " + MEASURED_SUMS,
                            note), note
        assert note in executor.explain()
        assert {note[-4:]} == {layout for channels, layout in _conv_layouts(executor.optimized_graph).items()
                               if channels == (4 if number == 1 else 8)}
    expected = ge2.ExecutorV2(g, device="cpu", passes=[]).run(feeds)["y"]
    assert_close(executor.run(feeds)["y"], expected.astype(np.float64), "float32", 72)


@pytest.mark.gpu
@pytest.mark.parametrize("nhwc_channels", [4, 8])
def test_float32_regions_in_opposite_layouts_run_on_cuda(rng, nhwc_channels):
    """The default pipeline on CUDA with a stand-in measurement that sends one region to NHWC and the other to NCHW
    (a transpose pair between them): the result matches float64."""
    g, feeds = _two_regions(rng)

    def measure(node, layout):
        return 1.0 if layout == "NCHW" else (0.5 if node.inputs[1].type.shape[1] == nhwc_channels else 2.0)

    by_stub = functools.partial(ge2.passes.plan_layouts, measure=measure, copy_bytes_per_s=COPY_BYTES_PER_S)
    pipeline = [ge2.passes.Pass("plan_layouts_by_stub", by_stub, p.doc) if p.name == "plan_layouts" else p
                for p in ge2.passes.resolve(None)]
    executor = ge2.ExecutorV2(g, device="cuda", passes=pipeline, precision="highest")
    assert _conv_layouts(executor.optimized_graph) == {nhwc_channels: "NHWC", 12 - nhwc_channels: "NCHW"}
    expected = ge2.ExecutorV2(g, device="cpu", passes=[]).run(feeds)["y"]
    assert_close(executor.run(feeds)["y"], expected.astype(np.float64), "float32", 72)
