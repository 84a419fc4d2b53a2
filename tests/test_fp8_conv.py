"""FP8 convolutions: scaled_conv2d's float64 reference that emulates the quantization, its validation, the FP8
inference pass on conv2d nodes (what it rewrites, what it declines and why, the fallback to 16 bits when the GPU has
no FP8 engine), and (GPU) cuDNN's FP8 graph against the reference and a calibrated convolution network."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import testing
from graph_executor_v2.ops import conv2d, quantize_fp8, scaled_conv2d, scaled_gemm
from graph_executor_v2.passes import fp8

E4M3 = "float8_e4m3fn"
STORAGE = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _fp8(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(ml_dtypes.float8_e4m3fn)


def _scalar(value):
    return np.array(value, np.float32)


# ---------------------------------------------------------------------------------------------------------------
# CPU: the reference and validation
# ---------------------------------------------------------------------------------------------------------------
def test_reference_of_a_1x1_convolution_is_the_scaled_gemm_reference(rng):
    """A 1x1 stride-1 NHWC convolution is a GEMM over the N*H*W pixels: both FP8 references agree bit for bit,
    epilogue, output scale and amax included."""
    x, w = _fp8(rng, (2, 3, 5, 32)), _fp8(rng, (48, 1, 1, 32))
    bias = rng.standard_normal(48).astype(ml_dtypes.bfloat16)
    scales = (_scalar(0.5), _scalar(0.375))
    y, amax = scaled_conv2d.reference(x, w, *scales, bias, None, _scalar(6.0), act="relu", out_dtype=E4M3)
    y_gemm, amax_gemm = scaled_gemm.reference(x.reshape(-1, 32), w.reshape(48, 32), *scales, bias, _scalar(6.0),
                                              act="relu", out_dtype=E4M3)
    np.testing.assert_array_equal(y.reshape(-1, 48), y_gemm)
    assert amax == amax_gemm and amax > 0


def test_reference_is_conv2d_of_the_dequantized_inputs_with_the_epilogue(rng):
    x, w = _fp8(rng, (2, 7, 6, 16)), _fp8(rng, (32, 3, 3, 16))
    residual = rng.standard_normal((2, 4, 3, 32)).astype(np.float16)
    attrs = dict(stride=2, padding=(1, 2, 1, 0), dilation=1, act="leaky_relu", slope=0.2, clip_min=-1.0, clip_max=4.0)
    y, amax = scaled_conv2d.reference(x, w, _scalar(0.25), _scalar(2.0), None, residual, out_dtype="float16", **attrs)
    expected, _ = conv2d.reference(x.astype(np.float64) * 0.25, w.astype(np.float64) * 2.0, None, residual,
                                   layout="NHWC", **attrs)
    np.testing.assert_allclose(y, expected, rtol=1e-15, atol=0)
    assert amax == np.abs(expected).max() and y.min() == -1.0 and y.max() == 4.0  # clipped both ways


def test_reference_saturates_an_fp8_output_and_propagates_nan(rng):
    x, w = _fp8(rng, (1, 4, 4, 16)), _fp8(rng, (16, 1, 1, 16))
    y, amax = scaled_conv2d.reference(x, w, _scalar(1.0), _scalar(1.0), scale_y=_scalar(1e6), out_dtype=E4M3)
    assert np.abs(y).max() == 448.0 and not np.isnan(y).any()  # saturated, not NaN
    x[0, 1, 2, 3] = np.nan
    _, amax = scaled_conv2d.reference(x, w, _scalar(1.0), _scalar(1.0), out_dtype="bfloat16")
    assert np.isnan(amax)


def _graph(x_shape=(2, 6, 6, 16), w_shape=(32, 3, 3, 16), x_dtype=E4M3, out_dtype="bfloat16", bias=None,
           residual=None, scale_y=False, **attrs):
    g = ge2.ir.Graph("scaled_conv2d")
    inputs = [g.input("x", x_shape, x_dtype), g.input("w", w_shape, E4M3), g.input("sx", (), "float32"),
              g.input("sw", (), "float32"),
              None if bias is None else g.input("bias", bias[0], bias[1]),
              None if residual is None else g.input("residual", residual[0], residual[1]),
              g.input("sy", (), "float32") if scale_y else None]
    y, amax = g.scaled_conv2d(*inputs, out_dtype=out_dtype, **attrs)
    g.output(y, "y")
    g.output(amax, "amax")
    return g


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="x: expected one of float8_e4m3fn"):
        _graph(x_dtype="bfloat16")
    with pytest.raises(ValueError, match="w: expected C/groups = 16"):
        _graph(w_shape=(32, 3, 3, 8))
    with pytest.raises(TypeError, match="bias: expected bfloat16 with a float8_e4m3fn output"):
        _graph(out_dtype=E4M3, scale_y=True, bias=((32,), "float16"))
    with pytest.raises(TypeError, match="bias: expected float16 with a float16 output"):
        _graph(out_dtype="float16", bias=((32,), "bfloat16"))
    with pytest.raises(ValueError, match=r"bias: expected shape \(32,\)"):
        _graph(bias=((16,), "bfloat16"))
    with pytest.raises(ValueError, match="residual: only with a 16-bit output"):
        _graph(out_dtype=E4M3, scale_y=True, residual=((2, 4, 4, 32), "bfloat16"))
    with pytest.raises(ValueError, match="residual: expected shape"):
        _graph(residual=((2, 6, 6, 32), "bfloat16"))
    with pytest.raises(ValueError, match="scale_y: an float8_e4m3fn output needs its scale"):
        _graph(out_dtype=E4M3)
    with pytest.raises(ValueError, match="scale_y: only an FP8 output takes a scale"):
        _graph(scale_y=True)
    with pytest.raises(ValueError, match="with_amax: the amax comes with an FP8 output only"):
        _graph(with_amax=True)
    with pytest.raises(ValueError, match="act"):
        _graph(act="tanh")


def test_cpu_graph_runs_the_reference(rng):
    x, w = _fp8(rng, (2, 6, 6, 16)), _fp8(rng, (32, 3, 3, 16))
    feeds = {"x": x, "w": w, "sx": _scalar(0.5), "sw": _scalar(0.25), "sy": _scalar(4.0),
             "bias": rng.standard_normal(32).astype(ml_dtypes.bfloat16)}
    out = ge2.ExecutorV2(_graph(out_dtype=E4M3, scale_y=True, bias=((32,), "bfloat16"), with_amax=True, padding=1,
                                act="gelu")).run(feeds)
    y, amax = scaled_conv2d.reference(x, w, feeds["sx"], feeds["sw"], feeds["bias"], None, feeds["sy"], padding=1,
                                      act="gelu", out_dtype=E4M3)
    assert out["y"].dtype == ml_dtypes.float8_e4m3fn and out["y"].shape == (2, 6, 6, 32)
    np.testing.assert_array_equal(out["y"], y.astype(ml_dtypes.float8_e4m3fn))
    assert out["amax"] == np.float32(amax)


@pytest.mark.skipif(not ge2._native.is_built("_ops_conv2d"), reason="native module _ops_conv2d not built")
def test_candidate_rules_are_declined_with_their_reason(monkeypatch):
    # the rules alone: where a GPU can answer, unsupported_reason also asks cuDNN (the GPU tests below)
    monkeypatch.setattr(scaled_conv2d._device, "is_available", lambda: False)
    def problem(c=16, k=32, out_dtype="bfloat16", cc=(9, 0), **attrs):
        in_types = (ge2.ir.TensorType((2, 6, 6, c), E4M3), ge2.ir.TensorType((k, 3, 3, c), E4M3),
                    ge2.ir.TensorType((), "float32"), ge2.ir.TensorType((), "float32"), None, None, None)
        attrs = {"stride": 1, "padding": 1, "dilation": 1, "act": "none", "slope": 0.01, "clip_min": None,
                 "clip_max": None, "out_dtype": out_dtype, "with_amax": False, **attrs}
        return ge2.ops.Problem("scaled_conv2d", in_types, (ge2.ir.TensorType((2, 6, 6, k), out_dtype),), attrs, cc)

    if not conv2d.has_cudnn_graph():
        assert "not built" in scaled_conv2d.unsupported_reason(problem())
        return
    assert scaled_conv2d.unsupported_reason(problem()) is None
    assert scaled_conv2d.unsupported_reason(problem(out_dtype=E4M3, with_amax=True)) is None
    assert "multiples of 16" in scaled_conv2d.unsupported_reason(problem(c=24))
    assert "multiples of 16" in scaled_conv2d.unsupported_reason(problem(k=40))
    assert "sm_89 or newer" in scaled_conv2d.unsupported_reason(problem(cc=(8, 0)))


# ---------------------------------------------------------------------------------------------------------------
# CPU: the FP8 inference pass on convolutions
# ---------------------------------------------------------------------------------------------------------------
def _convnet(rng, dtype="bfloat16", channels=(16, 32, 48), layout="NHWC", groups=1, residual=True, batch=2,
             size=8):
    """conv 3x3 (bias, relu) -> conv 1x1 with a residual of its own input's projection (bias, silu); float64
    reference of the unquantized network returned too."""
    storage = ge2.dtypes.to_numpy(dtype)
    c0, c1, c2 = channels
    g = ge2.ir.Graph("convnet")
    nhwc = layout == "NHWC"
    x_shape = (batch, size, size, c0) if nhwc else (batch, c0, size, size)
    x = g.input("x", x_shape, dtype)
    w_shape = lambda k, c, r: (k, r, r, c // groups) if nhwc else (k, c // groups, r, r)  # noqa: E731
    params = {"w0": (rng.standard_normal(w_shape(c1, c0, 3)) * 0.2).astype(storage),
              "b0": (rng.standard_normal(c1) * 0.1).astype(storage),
              "w1": (rng.standard_normal(w_shape(c2, c1, 1)) * 0.2).astype(storage),
              "b1": (rng.standard_normal(c2) * 0.1).astype(storage),
              "skip": (rng.standard_normal(w_shape(c2, c1, 1)) * 0.2).astype(storage)}
    values = {name: g.param(name, array) for name, array in params.items()}
    h = g.conv2d(x, values["w0"], values["b0"], padding=1, layout=layout, groups=groups, act="relu")
    skip = g.conv2d(h, values["skip"], layout=layout, groups=groups) if residual else None
    y = g.conv2d(h, values["w1"], values["b1"], skip, layout=layout, groups=groups, act="silu")
    g.output(y, "y")

    def reference(x_value):
        attrs = dict(layout=layout, groups=groups)
        h_ref, _ = conv2d.reference(x_value, params["w0"], params["b0"], padding=1, act="relu", **attrs)
        skip_ref = conv2d.reference(h_ref, params["skip"], **attrs)[0] if residual else None
        return conv2d.reference(h_ref, params["w1"], params["b1"], skip_ref, act="silu", **attrs)[0]

    return g, reference


def _feeds(rng, count, shape=(2, 8, 8, 16), dtype="bfloat16"):
    return [{"x": rng.standard_normal(shape).astype(ge2.dtypes.to_numpy(dtype))} for _ in range(count)]


def _relative_rms(got, exact):
    got, exact = np.asarray(got, np.float64), np.asarray(exact, np.float64)
    return float(np.sqrt(np.mean((got - exact) ** 2) / np.mean(exact ** 2)))


def _assert_fp8_network_error(got, exact, what):
    """The calibrated FP8 network against the unquantized one: relative RMS error below 15%. Each E4M3 operand
    carries a relative rounding error of at most 2^-4 (about 3.6% RMS), so two FP8 layers land near 5-8%; a wrong
    scale or weight layout gives errors of order 100%."""
    relative = _relative_rms(got, exact)
    assert relative <= 0.15, f"{what}: relative RMS error {relative:.3%} against the unquantized network"


def _quantization_bound(x, w, x_amax, w_amax, **attrs):
    """|FP8 conv - exact conv| elementwise for x and w quantized with the scales of their amaxes: each rounding is
    within 2^-4 relative (E4M3's half ulp) or, below the smallest normal, 2^-10 / scale absolute, so
    |x_q w_q - x w| <= (|x| + dx)(|w| + dw) - |x||w|, summed by the convolution of the magnitudes."""
    x, w = np.abs(np.asarray(x, np.float64)), np.abs(np.asarray(w, np.float64))
    dx = 2.0 ** -4 * x + 2.0 ** -10 * x_amax / 448.0
    dw = 2.0 ** -4 * w + 2.0 ** -10 * w_amax / 448.0
    conv = lambda a, b: conv2d.reference(a, b, layout="NHWC", **attrs)[0]  # noqa: E731
    return conv(x + dx, w + dw) - conv(x, w)


def test_calibration_rewrites_the_eligible_convolutions_with_their_input_amax(rng):
    graph, _ = _convnet(rng)
    executor = ge2.ExecutorV2(graph, precision="fp8")
    feeds = _feeds(rng, 3)
    amax = executor.calibrate(feeds)
    assert amax["x"] == max(float(np.abs(f["x"].astype(np.float64)).max()) for f in feeds)
    assert len(amax) == 2 and all(value > 0 for value in amax.values())  # x and the hidden activation (read twice)
    counts = executor.optimized_graph.op_counts()
    assert counts == {"quantize_fp8": 2, "scaled_conv2d": 3}, counts  # one quantize per activation, shared
    explained = executor.explain()
    assert "precision: fp8 (E4M3 GEMMs and convolutions" in explained
    assert explained.count("FP8 E4M3 convolution") == 3
    # the weights are E4M3 parameters in cuDNN's [K, R, S, C] layout; the scales are parameters of the plan
    w8 = [value for name, value in executor.optimized_graph.params.items() if name.endswith(".fp8.w")]
    assert sorted(v.data.shape for v in w8) == [(32, 3, 3, 16), (48, 1, 1, 32), (48, 1, 1, 32)]
    assert all(v.data.dtype == ml_dtypes.float8_e4m3fn for v in w8)
    scales = sorted(float(v.data) for name, v in executor.optimized_graph.params.items() if name.endswith(".x_scale"))
    assert scales == sorted(np.float32(448.0 / a) for a in amax.values())


def test_the_rewrite_computes_the_emulated_fp8_convolutions(rng):
    """The calibrated graph equals the layer-by-layer emulation written by hand (quantize, FP8 convolution with the
    epilogue in float64, bfloat16 between layers), and stays within FP8's quantization error of the unquantized
    network."""
    graph, reference = _convnet(rng, residual=False)
    executor = ge2.ExecutorV2(graph, precision="fp8")
    amax = executor.calibrate(_feeds(rng, 2))
    x = _feeds(rng, 1)[0]["x"]
    got = executor.run({"x": x})["y"]
    params = graph.params
    hidden = next(name for name in amax if name != "x")

    def layer(value, amax_value, w, b, **attrs):
        x_scale = np.float32(fp8.scale_for(amax_value))
        w_scale = np.float32(fp8.scale_for(float(np.abs(params[w].data.astype(np.float64)).max())))
        x8, _ = quantize_fp8.reference(value, x_scale)
        w8 = ge2.dtypes.saturate_to_float8(params[w].data.astype(np.float64) * w_scale, E4M3)
        y, _ = scaled_conv2d.reference(x8, w8, np.float32(1) / x_scale, np.float32(1) / w_scale, params[b].data,
                                       **attrs)
        return y.astype(ml_dtypes.bfloat16)

    h = layer(x, amax["x"], "w0", "b0", padding=1, act="relu")
    y = layer(h, amax[hidden], "w1", "b1", act="silu")
    np.testing.assert_array_equal(got, y)
    # the first layer alone: within the quantization bound of the unquantized layer (relu is 1-Lipschitz), plus
    # bfloat16's rounding of h
    w0 = params["w0"].data
    exact_h, _ = conv2d.reference(x, w0, params["b0"].data, padding=1, layout="NHWC", act="relu")
    bound = _quantization_bound(x, w0, amax["x"], float(np.abs(w0.astype(np.float64)).max()), padding=1)
    gap = np.abs(h.astype(np.float64) - exact_h)
    assert (gap <= bound + 2.0 ** -8 * np.abs(exact_h) + 1e-12).all(), f"max gap {gap.max():.4g}"
    _assert_fp8_network_error(got, reference(x), "two FP8 convolutions")


@pytest.mark.parametrize("variant, reason", [
    (dict(layout="NCHW"), "layout NCHW, groups 1: cuDNN's FP8 convolutions take NHWC, groups 1"),
    (dict(groups=2), "layout NHWC, groups 2"),
    (dict(dtype="float32"), "the activation is float32, not 16-bit"),
    (dict(channels=(16, 24, 48)), "C=16 and K=24 must be multiples of 16"),
])
def test_ineligible_convolutions_stay_16_bit_with_their_reason(rng, variant, reason):
    graph, reference = _convnet(rng, residual=False, **variant)
    # without passes: plan_layouts would turn the 16-bit NCHW convolutions into NHWC ones (the next test)
    executor = ge2.ExecutorV2(graph, precision="fp8", passes=[])
    nhwc = variant.get("layout", "NHWC") == "NHWC"
    feeds = _feeds(rng, 1, (2, 8, 8, 16) if nhwc else (2, 16, 8, 8), variant.get("dtype", "bfloat16"))
    executor.calibrate(feeds)
    assert reason in executor.explain()
    assert "conv2d" in executor.optimized_graph.op_counts()
    relative = _relative_rms(executor.run(feeds[0])["y"], reference(feeds[0]["x"]))
    assert relative <= 2e-2, f"{variant}: relative RMS error {relative:.3%} (16-bit or float32, not FP8's)"


def test_16_bit_nchw_convolutions_run_in_fp8_after_plan_layouts(rng):
    graph, reference = _convnet(rng, layout="NCHW")
    executor = ge2.ExecutorV2(graph, precision="fp8")
    feeds = _feeds(rng, 2, (2, 16, 8, 8))
    executor.calibrate(feeds)
    assert executor.optimized_graph.op_counts().get("scaled_conv2d") == 3, executor.explain()
    _assert_fp8_network_error(executor.run(feeds[0])["y"], reference(feeds[0]["x"]), "NCHW made NHWC")


def test_a_convolution_with_a_computed_weight_stays_16_bit(rng):
    g = ge2.ir.Graph("weight_input")
    y = g.conv2d(g.input("x", (2, 4, 4, 16), "bfloat16"), g.input("w", (16, 1, 1, 16), "bfloat16"), layout="NHWC")
    g.output(y, "y")
    notes = fp8.quantize(g, {"x": 1.0})
    assert notes == ["conv2d_0: stays bfloat16: the weight is not a parameter (only constant weights are quantized "
                     "ahead of time)"]


def test_a_convolution_the_gpu_declines_stays_16_bit_with_the_engine_reason(rng):
    """On the GPU the pass asks each convolution's scaled_conv2d problem whether cuDNN has an engine for it
    (``scaled_conv2d.unsupported_reason``); a declined one keeps its 16-bit conv2d and explain() gives cuDNN's
    reason."""
    graph, reference = _convnet(rng)
    asked = []

    def engine_reason(problem):
        asked.append(problem)
        if problem.in_types[1].shape[1] == 3:  # the 3x3 convolution
            return "cuDNN has no engine for this problem (no plan built)"
        return None

    notes = fp8.quantize(graph, {value: 2.0 for value in ("x", "conv2d_0")}, engine_reason=engine_reason)
    assert [p.op for p in asked] == ["scaled_conv2d"] * 3
    assert all(p.in_types[0].dtype == E4M3 and p.attrs["out_dtype"] == "bfloat16" for p in asked)
    assert notes[0] == ("conv2d_0: stays bfloat16: the GPU declines its FP8 convolution: cuDNN has no engine for this "
                        "problem (no plan built)")
    counts = graph.op_counts()
    assert counts["conv2d"] == 1 and counts["scaled_conv2d"] == 2, counts


def test_the_executor_gives_the_pass_its_engine_check_on_the_gpu_only(rng, monkeypatch):
    graph, _ = _convnet(rng)
    executor = ge2.ExecutorV2(graph, precision="fp8")
    assert executor._fp8_engine_reason() is None  # the CPU reference runs every FP8 convolution
    monkeypatch.setattr(executor, "_fp8_engine_reason", lambda: lambda problem: "no engine (test)")
    executor.calibrate(_feeds(rng, 1))
    assert executor.optimized_graph.op_counts() == {"conv2d": 3}
    assert executor.explain().count("the GPU declines its FP8 convolution: no engine (test)") == 3
    assert not executor.needs_calibration  # calibrated, with every convolution left in 16 bits
    executor.run(_feeds(rng, 1)[0])


def test_saved_fp8_convolutions_run_as_loaded(rng, tmp_path):
    graph, _ = _convnet(rng)
    executor = ge2.ExecutorV2(graph, precision="fp8")
    executor.calibrate(_feeds(rng, 2))
    path = tmp_path / "fp8_convnet.json"
    executor.save(path)
    loaded = ge2.ExecutorV2(ge2.ir.Graph.load(path), precision="fp8")
    assert not loaded.needs_calibration
    x = _feeds(rng, 1)[0]
    np.testing.assert_array_equal(loaded.run(x)["y"], executor.run(x)["y"])


# ---------------------------------------------------------------------------------------------------------------
# GPU: cuDNN's FP8 graph against the reference
# ---------------------------------------------------------------------------------------------------------------
def _accumulation_bound(x, w, scale, attrs):
    """|y - reference| that cuDNN's float32 accumulation in its own order may add: 2^-12 * scale * the convolution
    of |x| and |w| (scaled_gemm's bound; float32 sums of exact FP8 products are far tighter)."""
    magnitude, _ = conv2d.reference(np.abs(x.astype(np.float64)), np.abs(w.astype(np.float64)), layout="NHWC",
                                    **{k: attrs[k] for k in ("stride", "padding", "dilation") if k in attrs})
    return 2.0 ** -12 * scale * magnitude


def _engine_or_xfail(problem_inputs, attrs):
    """xfail (with cuDNN's reason, for the report) where cuDNN has no FP8 engine for the problem: the pass keeps
    such convolutions in 16 bits (test_a_convolution_the_gpu_declines_... covers that)."""
    in_types = tuple(None if a is None else ge2.ir.TensorType(a.shape, ge2.dtypes.normalize(a.dtype))
                     for a in problem_inputs)
    full = {a.name: a.default for a in scaled_conv2d.OP.attrs} | attrs
    problem = ge2.ops.Problem("scaled_conv2d", in_types, tuple(scaled_conv2d.OP.infer(in_types, full)), full,
                              ge2.device.compute_capability(0))
    reason = scaled_conv2d.unsupported_reason(problem)
    if reason is not None:
        pytest.xfail(f"cuDNN declines this FP8 convolution: {reason}")


CONFIGS = [
    ("3x3 pad 1", (4, 14, 14, 64), (64, 3, 3, 64), dict(padding=1)),
    ("1x1", (8, 7, 7, 128), (256, 1, 1, 128), {}),
    ("3x3 stride 2", (2, 16, 16, 32), (64, 3, 3, 32), dict(stride=2, padding=1)),
    ("5x5 dilation 2", (2, 16, 16, 16), (32, 5, 5, 16), dict(dilation=2, padding=4)),
    ("7x7 stride 2 pad 3 (a stem)", (2, 32, 32, 16), (64, 7, 7, 16), dict(stride=2, padding=3)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name, x_shape, w_shape, attrs", CONFIGS, ids=[c[0] for c in CONFIGS])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
def test_cudnn_fp8_convolution_matches_the_reference(rng, name, x_shape, w_shape, attrs, out_dtype):
    """The plain FP8 convolution (no epilogue): cuDNN must have an engine for the 3x3 and 1x1 ones on Hopper; the
    others xfail with cuDNN's reason where it has none (the pass keeps such convolutions in 16 bits)."""
    x, w = _fp8(rng, x_shape), _fp8(rng, w_shape)
    scale_x, scale_w = _scalar(0.5), _scalar(0.125)
    if name not in ("3x3 pad 1", "1x1"):
        _engine_or_xfail((x, w, scale_x, scale_w, None, None, None), dict(out_dtype=out_dtype, **attrs))
    y, amax = scaled_conv2d.forward_numpy(x, w, scale_x, scale_w, out_dtype=out_dtype, **attrs)
    expected, _ = scaled_conv2d.reference(x, w, scale_x, scale_w, out_dtype=out_dtype, **attrs)
    assert y.dtype == STORAGE[out_dtype] and y.shape == expected.shape
    reduction = int(np.prod(w_shape[1:]))
    testing.assert_close(y, expected, out_dtype, reduction, what=f"{name} -> {out_dtype}")


EPILOGUES = [
    ("bias + relu", dict(act="relu"), True, False),
    ("bias + gelu", dict(act="gelu"), True, False),
    ("bias + silu + residual", dict(act="silu"), True, True),
    ("leaky_relu + clip", dict(act="leaky_relu", slope=0.1, clip_min=-0.5, clip_max=6.0), False, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name, attrs, with_bias, with_residual", EPILOGUES, ids=[e[0] for e in EPILOGUES])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16"])
def test_cudnn_fp8_epilogues_match_the_reference(rng, name, attrs, with_bias, with_residual, out_dtype):
    x, w = _fp8(rng, (4, 10, 10, 32)), _fp8(rng, (48, 3, 3, 32))
    storage = STORAGE[out_dtype]
    bias = (rng.standard_normal(48) * 2).astype(storage) if with_bias else None
    residual = rng.standard_normal((4, 10, 10, 48)).astype(storage) if with_residual else None
    inputs = (x, w, _scalar(0.25), _scalar(0.25), bias, residual, None)
    attrs = dict(padding=1, out_dtype=out_dtype, **attrs)
    _engine_or_xfail(inputs, attrs)
    y, _ = scaled_conv2d.forward_numpy(*inputs, **attrs)
    expected, _ = scaled_conv2d.reference(*inputs, **attrs)
    testing.assert_close(y, expected, out_dtype, 9 * 32, what=f"{name} -> {out_dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["none", "relu"])
def test_cudnn_fp8_output_with_its_scale_and_amax(rng, act):
    """cuDNN's FP8 fprop graph as its sample builds it: E4M3 out times scale_y, the amax before scale_y. |y| stays
    below ~10 (0.25 * a sum of 64 standard normal products: sigma 2), so y * scale_y stays inside E4M3's range
    (whether cuDNN's cast saturates an overflow is not what this checks)."""
    x, w = _fp8(rng, (8, 12, 12, 64)), _fp8(rng, (128, 1, 1, 64))
    scale_x, scale_w, scale_y = _scalar(0.5), _scalar(0.5), _scalar(28.0)
    attrs = dict(act=act, out_dtype=E4M3, with_amax=True)
    inputs = (x, w, scale_x, scale_w, None, None, scale_y)
    _engine_or_xfail(inputs, attrs)
    y, amax = scaled_conv2d.forward_numpy(*inputs, **attrs)
    expected, expected_amax = scaled_conv2d.reference(*inputs, act=act, out_dtype=E4M3)  # amax: always
    assert y.dtype == ml_dtypes.float8_e4m3fn
    testing.assert_within_one_fp8_ulp(y, expected, E4M3, f"act={act}",
                                      _accumulation_bound(x, w, 0.25 * float(scale_y), attrs))
    assert abs(float(amax) - float(expected_amax)) <= 1e-3 * float(expected_amax)


@pytest.mark.gpu
def test_fp8_convnet_on_the_gpu_matches_the_calibrated_reference(rng):
    """The calibrated network on the GPU: every eligible convolution on cudnn_graph_fp8 (no host fallback), against
    the same FP8 network on the CPU reference backend and against the unquantized float64 network."""
    graph, reference = _convnet(rng, channels=(32, 64, 64), batch=8, size=16)
    calibration = _feeds(rng, 4, (8, 16, 16, 32))
    on_gpu = ge2.ExecutorV2(graph, device="cuda", precision="fp8")
    amax = on_gpu.calibrate(calibration)
    on_cpu = ge2.ExecutorV2(graph, precision="fp8")
    assert on_cpu.calibrate(calibration) == pytest.approx(amax, rel=1e-2)
    x = _feeds(rng, 1, (8, 16, 16, 32))[0]
    got, expected = on_gpu.run(x)["y"], on_cpu.run(x)["y"]
    print(on_gpu.explain())
    selections = [s for plan in on_gpu.plans for s in plan.selections]
    convs = [s for s in selections if s.op in ("scaled_conv2d", "conv2d")]
    # the plain 3x3 (bias, relu) is the config cuDNN's FP8 engines are made for; a declined epilogue stays conv2d
    assert any(s.op == "scaled_conv2d" for s in convs), on_gpu.explain()
    assert all(s.kernel == scaled_conv2d.KERNEL for s in convs if s.op == "scaled_conv2d"), on_gpu.explain()
    assert not on_gpu.fallbacks, on_gpu.explain()
    scale = float(np.abs(expected.astype(np.float64)).max())
    error = float(np.abs(got.astype(np.float64) - expected.astype(np.float64)).max())
    # The GPU's and the CPU's first convolution round h to bfloat16 apart from each other now and then, and an h
    # element next to an E4M3 rounding boundary then quantizes one FP8 step apart: at the top of the range that is
    # 32 / 448 of h's calibrated amax, which the 1x1 convolutions carry to y times one weight (the H200 showed 0.94
    # against max |y| 26: one such step, 16.75 / 14 x 0.78). A wrong scale or layout is off by the order of max |y|.
    one_step = amax["conv2d_0"] * 32.0 / 448.0 * max(float(np.abs(graph.params[name].data).max())
                                                     for name in ("w1", "skip"))
    assert error <= 3e-2 * scale + one_step, (f"max |gpu - cpu reference| {error:.4g} against max |y| {scale:.4g} "
                                              f"(one FP8 step of h through a weight: {one_step:.4g})")
    _assert_fp8_network_error(got, reference(x["x"]), "GPU")
