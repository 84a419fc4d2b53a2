"""scaled_gemm: the float64 reference that emulates the quantization (CPU), cuBLASLt's FP8 matmul against it (GPU:
FP8 outputs within one FP8 ulp, 16/32-bit outputs within their tolerance, the amax), the layout and alignment rules
declined with their reasons, and bad input."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import testing
from graph_executor_v2.ops import activations, scaled_gemm

FP8 = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
BIAS = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# amax: float32 sums; a 16-bit output's amax may come from the rounded output (the amax kernel): its half ulp
AMAX_RTOL = {"bfloat16": 2.0 ** -8 + 1e-3, "float16": 2.0 ** -11 + 1e-3}


def _fp8(rng, shape, dtype):
    return rng.standard_normal(shape).astype(FP8[dtype])


def _scalar(value):
    return np.array(value, np.float32)


def _accumulation_bound(inputs, fast_accum):
    """|y - reference| that cuBLASLt's accumulation order and precision may add, in the output's units:
    eps * scale_d * scale_a * scale_b * sum_k |a_ik b_jk| (eps 2^-12; 2^-10 with fast accumulation; measured on the
    H200: the largest gaps near zero are ~50x below this)."""
    a, b, scale_a, scale_b, _, scale_d = inputs
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    eps = 2.0 ** (-10 if fast_accum else -12)
    return eps * (1.0 if scale_d is None else float(scale_d)) * abs(float(scale_a) * float(scale_b)) * magnitude


# half an ulp of a 16/32-bit output, relative: its own rounding
HALF_ULP = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}
# the epilogue's largest slope: an accumulation error passes through the activation at most this much larger
SLOPE = {"none": 1.0, "relu": 1.0, "gelu": 1.13}


def _assert_within_accumulation_error(y, expected, out_dtype, bound, what):
    """A 16/32-bit output: within the FP8 accumulation's error (``_accumulation_bound``, through the activation's
    slope) plus its own rounding. Not testing.tolerance's sqrt(k) growth: that models 16-bit products summed in
    float32, while Hopper's FP8 tensor cores keep fewer accumulator bits between cuBLASLt's float32 promotions (the
    H200 gave float16 errors of 1.5e-5 * scale * sum |a b|, past float16's tolerance at k = 1536 near zero)."""
    expected = np.asarray(expected, np.float64)
    gap = np.abs(np.asarray(y).astype(np.float64) - expected)
    allowed = bound * (1.0 + HALF_ULP[out_dtype]) + HALF_ULP[out_dtype] * np.abs(expected)
    bad = ~(gap <= allowed)  # NaN fails
    if bad.any():
        index = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements past the accumulation bound plus "
                             f"half an ulp; first at {index}: got {y[index]!r}, expected {expected[index]!r}, "
                             f"allowed {allowed[index]:.3g}; largest gap / bound {float((gap / allowed).max()):.3f}")


# ---------------------------------------------------------------------------------------------------------------
# CPU: the reference and validation
# ---------------------------------------------------------------------------------------------------------------
def test_reference_is_the_scaled_product_with_the_epilogue_and_the_amax_before_scale_d(rng):
    a, b = _fp8(rng, (4, 32), "float8_e4m3fn"), _fp8(rng, (3, 32), "float8_e5m2")
    bias = rng.standard_normal(3).astype(ml_dtypes.bfloat16)
    y, amax = scaled_gemm.reference(a, b, _scalar(0.5), _scalar(3.0), bias, act="gelu")
    z = 1.5 * (a.astype(np.float64) @ b.astype(np.float64).T) + bias.astype(np.float64)
    np.testing.assert_allclose(y, activations.apply("gelu", z), rtol=1e-15)
    assert amax == np.abs(y).max()
    y8, amax8 = scaled_gemm.reference(a, b, _scalar(0.5), _scalar(3.0), bias, _scalar(1000.0), act="gelu",
                                      out_dtype="float8_e4m3fn")
    assert amax8 == amax  # before scale_d
    expected = np.clip((activations.apply("gelu", z).astype(np.float32) * np.float32(1000.0)), -448, 448)
    np.testing.assert_array_equal(y8, expected.astype(ml_dtypes.float8_e4m3fn).astype(np.float64))
    assert np.abs(y8).max() == 448.0  # saturated, not NaN
    # trans_a / trans_b=False: the same product from the other layouts
    y_t, _ = scaled_gemm.reference(np.ascontiguousarray(a.T), np.ascontiguousarray(b.T), _scalar(0.5),
                                   _scalar(3.0), bias, act="gelu", trans_a=True, trans_b=False)
    np.testing.assert_array_equal(y_t, y)


def test_reference_amax_propagates_nan():
    a = np.array([[np.nan, 1.0]], ml_dtypes.float8_e4m3fn)
    assert np.isnan(scaled_gemm.reference(a, a, _scalar(1.0), _scalar(1.0))[1])


def _graph(m, n, k, a_dtype="float8_e4m3fn", b_dtype="float8_e4m3fn", out_dtype="bfloat16", bias_dtype=None,
           with_scale_d=None, **attrs):
    g = ge2.ir.Graph("scaled_gemm")
    b_shape = (k, n) if attrs.get("trans_b") is False else (n, k)
    inputs = [g.input("a", (m, k), a_dtype), g.input("b", b_shape, b_dtype), g.input("scale_a", (), "float32"),
              g.input("scale_b", (1,), "float32"),
              None if bias_dtype is None else g.input("bias", (n,), bias_dtype),
              g.input("scale_d", (), "float32") if (with_scale_d if with_scale_d is not None
                                                    else out_dtype in FP8) else None]
    y, amax = g.scaled_gemm(*inputs, out_dtype=out_dtype, **attrs)
    g.output(y, "y")
    g.output(amax, "amax")
    return g


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32", "float8_e4m3fn", "float8_e5m2"])
def test_cpu_graph_runs_the_reference(rng, out_dtype):
    a, b = _fp8(rng, (16, 48), "float8_e4m3fn"), _fp8(rng, (32, 48), "float8_e4m3fn")
    bias = rng.standard_normal(32).astype(ml_dtypes.bfloat16)
    feeds = {"a": a, "b": b, "scale_a": _scalar(0.25), "scale_b": _scalar([2.0]), "bias": bias}
    if out_dtype in FP8:
        feeds["scale_d"] = _scalar(8.0)
    out = ge2.ExecutorV2(_graph(16, 32, 48, out_dtype=out_dtype, bias_dtype="bfloat16", act="relu")).run(feeds)
    y, amax = scaled_gemm.reference(a, b, feeds["scale_a"], feeds["scale_b"], bias, feeds.get("scale_d"), act="relu",
                                    out_dtype=out_dtype)
    assert out["y"].dtype == ge2.dtypes.to_numpy(out_dtype) and out["amax"].shape == ()
    np.testing.assert_array_equal(out["y"], y.astype(ge2.dtypes.to_numpy(out_dtype)))
    assert out["amax"] == np.float32(amax)


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="a: expected one of float8_e4m3fn"):
        _graph(16, 16, 16, a_dtype="bfloat16")
    with pytest.raises(ValueError, match="b: inner dimension mismatch"):
        g = ge2.ir.Graph("bad")
        g.scaled_gemm(g.input("a", (16, 32), "float8_e4m3fn"), g.input("b", (16, 48), "float8_e4m3fn"),
                      g.input("sa", (), "float32"), g.input("sb", (), "float32"))
    with pytest.raises(TypeError, match="bias: expected bfloat16 with a float32 output"):
        _graph(16, 16, 16, out_dtype="float32", bias_dtype="float32")
    with pytest.raises(TypeError, match="bias: expected float16 with a float16 output"):
        _graph(16, 16, 16, out_dtype="float16", bias_dtype="bfloat16")
    with pytest.raises(ValueError, match="scale_d: an float8_e5m2 output needs its scale"):
        _graph(16, 16, 16, out_dtype="float8_e5m2", with_scale_d=False)
    with pytest.raises(ValueError, match="scale_d: only an FP8 output takes a scale"):
        _graph(16, 16, 16, out_dtype="bfloat16", with_scale_d=True)
    with pytest.raises(ValueError, match="scale_a: expected one element"):
        g = ge2.ir.Graph("bad_scale")
        g.scaled_gemm(g.input("a", (16, 32), "float8_e4m3fn"), g.input("b", (16, 32), "float8_e4m3fn"),
                      g.input("sa", (2,), "float32"), g.input("sb", (), "float32"))
    with pytest.raises(ValueError, match="act"):
        _graph(16, 16, 16, act="silu")


@pytest.mark.skipif(not ge2._native.is_built("_ops_scaled_gemm"), reason="native module _ops_scaled_gemm not built")
def test_cublaslt_rules_are_declined_with_their_reason():
    problem = lambda m=32, n=32, k=32, a="float8_e4m3fn", b="float8_e4m3fn", cc=(9, 0), **attrs: ge2.ops.Problem(  # noqa
        "scaled_gemm", (ge2.ir.TensorType((m, k), a), ge2.ir.TensorType((n, k), b), None, None, None, None),
        (ge2.ir.TensorType((m, n), "bfloat16"), ge2.ir.TensorType((), "float32")),
        {"trans_a": False, "trans_b": True, "act": "none", "out_dtype": "bfloat16", "fast_accum": False, **attrs},
        cc)
    assert scaled_gemm.unsupported_reason(problem()) is None
    assert "multiples of 16" in scaled_gemm.unsupported_reason(problem(m=20))
    assert "multiples of 16" in scaled_gemm.unsupported_reason(problem(k=40))
    assert "TN layout" in scaled_gemm.unsupported_reason(problem(trans_b=False))
    assert "TN layout" in scaled_gemm.unsupported_reason(problem(trans_a=True))
    assert "E5M2 x E5M2" in scaled_gemm.unsupported_reason(problem(a="float8_e5m2", b="float8_e5m2"))
    assert "E5M2 output only from an E5M2 input" in scaled_gemm.unsupported_reason(problem(out_dtype="float8_e5m2"))
    assert scaled_gemm.unsupported_reason(problem(a="float8_e5m2", out_dtype="float8_e5m2")) is None
    assert "compute capability 8.9" in scaled_gemm.unsupported_reason(problem(cc=(8, 0)))


# ---------------------------------------------------------------------------------------------------------------
# GPU: cuBLASLt against the reference
# ---------------------------------------------------------------------------------------------------------------
SHAPES = [(16, 16, 16), (64, 48, 96), (256, 512, 1024), (1008, 784, 1536)]


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("a_dtype, b_dtype", [("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e4m3fn"),
                                              ("float8_e4m3fn", "float8_e5m2")])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32", "float8_e4m3fn", "float8_e5m2"])
def test_cublaslt_matches_the_reference(rng, m, n, k, a_dtype, b_dtype, out_dtype):
    a, b = _fp8(rng, (m, k), a_dtype), _fp8(rng, (n, k), b_dtype)
    scale_a, scale_b = _scalar(rng.choice([0.5, 1.0, 3.0])), _scalar(2.0 ** -float(rng.integers(0, 6)))
    scale_d = _scalar(448.0 / (3.0 * np.sqrt(k))) if out_dtype in FP8 else None  # a few values saturate
    run = lambda: scaled_gemm.forward_numpy(a, b, scale_a, scale_b, None, scale_d, out_dtype=out_dtype)  # noqa: E731
    if out_dtype == "float8_e5m2" and a_dtype == b_dtype == "float8_e4m3fn":
        with pytest.raises(ValueError, match="E5M2 output only from an E5M2 input"):
            run()
        return
    _check(run, (a, b, scale_a, scale_b, None, scale_d), dict(out_dtype=out_dtype),
           f"m={m} n={n} k={k} {a_dtype} x {b_dtype} -> {out_dtype} scale_a={float(scale_a)} "
           f"scale_b={float(scale_b)} scale_d={None if scale_d is None else float(scale_d)}")


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["none", "relu", "gelu"])
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32", "float8_e4m3fn"])
@pytest.mark.parametrize("fast_accum", [False, True])
def test_bias_and_activation_epilogues(rng, act, out_dtype, fast_accum):
    m, n, k = 128, 96, 256
    a, b = _fp8(rng, (m, k), "float8_e4m3fn"), _fp8(rng, (n, k), "float8_e4m3fn")
    bias = (rng.standard_normal(n) * 4).astype(BIAS.get(out_dtype, ml_dtypes.bfloat16))
    scale_a, scale_b = _scalar(0.75), _scalar(0.5)
    scale_d = _scalar(16.0) if out_dtype in FP8 else None
    attrs = dict(act=act, out_dtype=out_dtype, fast_accum=fast_accum)
    run = lambda: scaled_gemm.forward_numpy(a, b, scale_a, scale_b, bias, scale_d, **attrs)  # noqa: E731
    _check(run, (a, b, scale_a, scale_b, bias, scale_d), attrs,
           f"m={m} n={n} k={k} act={act} bias {bias.dtype} -> {out_dtype} fast_accum={fast_accum}")


def _check(run, inputs, attrs, what):
    out_dtype = attrs["out_dtype"]
    reference_attrs = {key: value for key, value in attrs.items() if key != "fast_accum"}
    expected_y, expected_amax = scaled_gemm.reference(*inputs, **reference_attrs)
    try:
        y, amax = run()
    except Exception as error:  # the cuBLASLt status string is in the message
        raise AssertionError(f"{what}: {error}") from error
    assert y.dtype == ge2.dtypes.to_numpy(out_dtype) and amax.shape == () and amax.dtype == np.float32, what
    fast = attrs.get("fast_accum", False)
    if out_dtype in FP8:
        testing.assert_within_one_fp8_ulp(y, expected_y, out_dtype, what, _accumulation_bound(inputs, fast))
    else:
        _assert_within_accumulation_error(y, expected_y, out_dtype,
                                          SLOPE[attrs.get("act", "none")] * _accumulation_bound(inputs, fast), what)
    unscaled = np.abs(scaled_gemm.reference(*inputs[:5], **{**reference_attrs, "out_dtype": "float32"})[0]).max()
    rtol = AMAX_RTOL.get(out_dtype, 1e-3) + (4e-3 if fast else 0.0)
    assert abs(float(amax) - float(expected_amax)) <= rtol * float(expected_amax), (
        f"{what}: amax {float(amax)!r}, expected {float(expected_amax)!r} (before scale_d; the largest |y| of the "
        f"FP8 output after it is {np.abs(y.astype(np.float64)).max()!r}, unscaled {unscaled!r})")


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float8_e4m3fn"])
def test_without_amax_the_product_is_still_right(rng, out_dtype):
    a, b = _fp8(rng, (64, 128), "float8_e4m3fn"), _fp8(rng, (32, 128), "float8_e4m3fn")
    inputs = (a, b, _scalar(0.5), _scalar(0.5), None, _scalar(8.0) if out_dtype in FP8 else None)
    y, _ = scaled_gemm.forward_numpy(*inputs, out_dtype=out_dtype, with_amax=False)
    expected, _ = scaled_gemm.reference(*inputs, out_dtype=out_dtype)
    if out_dtype in FP8:
        testing.assert_within_one_fp8_ulp(y, expected, out_dtype, "with_amax=False",
                                          _accumulation_bound(inputs, False))
    else:
        testing.assert_close(y, expected, out_dtype, 128, what="with_amax=False")


@pytest.mark.gpu
def test_declined_problems_raise_with_the_reason(rng):
    a, b = _fp8(rng, (20, 32), "float8_e4m3fn"), _fp8(rng, (16, 32), "float8_e4m3fn")
    with pytest.raises(ValueError, match="multiples of 16"):
        scaled_gemm.forward_numpy(a, b, _scalar(1.0), _scalar(1.0))
    with pytest.raises(ValueError, match="TN layout"):
        scaled_gemm.forward_numpy(a[:16], np.ascontiguousarray(b.T), _scalar(1.0), _scalar(1.0), trans_b=False)
    e5m2 = _fp8(rng, (16, 32), "float8_e5m2")
    with pytest.raises(ValueError, match="E5M2 x E5M2"):
        scaled_gemm.forward_numpy(e5m2, e5m2, _scalar(1.0), _scalar(1.0))


@pytest.mark.gpu
def test_quantize_then_scaled_gemm_in_a_cuda_plan_with_no_fallback(rng):
    """The FP8 linear layer as the passes build it: x and w quantized (amax in the same pass), multiplied with the
    reciprocal scales, bias and gelu fused; captured and replayed, no host round trip, no new cuBLASLt plan."""
    m, n, k = 256, 384, 512
    g = ge2.ir.Graph("fp8_linear")
    x = g.input("x", (m, k), "bfloat16")
    w = g.input("w", (n, k), "bfloat16")
    scales = {name: g.input(name, (), "float32") for name in ("sx", "sw", "inv_sx", "inv_sw")}
    x8, x_amax = g.quantize_fp8(x, scales["sx"])
    w8, w_amax = g.quantize_fp8(w, scales["sw"])
    y, y_amax = g.scaled_gemm(x8, w8, scales["inv_sx"], scales["inv_sw"], g.input("bias", (n,), "bfloat16"),
                              act="gelu")
    for value, name in ((y, "y"), (x_amax, "x_amax"), (w_amax, "w_amax"), (y_amax, "y_amax")):
        g.output(value, name)
    executor = ge2.ExecutorV2(g, device="cuda")
    assert not executor.fallbacks
    feeds = {"x": rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16),
             "w": (rng.standard_normal((n, k)) * 0.05).astype(ml_dtypes.bfloat16),
             "bias": rng.standard_normal(n).astype(ml_dtypes.bfloat16)}
    sx, sw = 448.0 / float(np.abs(feeds["x"].astype(np.float64)).max()), 448.0 / 0.3
    feeds.update(sx=_scalar(sx), sw=_scalar(sw), inv_sx=_scalar(1.0 / np.float32(sx)),
                 inv_sw=_scalar(1.0 / np.float32(sw)))
    for _ in range(3):  # replays
        out = executor.run(feeds)
    x_ref, x_amax_ref = ge2.ops.quantize_fp8.reference(feeds["x"], feeds["sx"])
    w_ref, _ = ge2.ops.quantize_fp8.reference(feeds["w"], feeds["sw"])
    y_ref, y_amax_ref = scaled_gemm.reference(x_ref, w_ref, feeds["inv_sx"], feeds["inv_sw"], feeds["bias"], act="gelu")
    assert out["x_amax"] == x_amax_ref
    testing.assert_close(out["y"], y_ref, "bfloat16", k, what="fp8 linear")
    assert abs(float(out["y_amax"]) - y_amax_ref) <= AMAX_RTOL["bfloat16"] * y_amax_ref


@pytest.mark.gpu
def test_matches_torch_scaled_mm(rng):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "_scaled_mm"):
        pytest.skip(f"torch {torch.__version__} has no _scaled_mm")
    m, n, k = 512, 256, 1024
    a, b = _fp8(rng, (m, k), "float8_e4m3fn"), _fp8(rng, (n, k), "float8_e4m3fn")
    scale_a, scale_b = _scalar(0.5), _scalar(0.25)
    ours, _ = scaled_gemm.forward_numpy(a, b, scale_a, scale_b)
    to_torch = lambda x: torch.from_numpy(x.astype(np.float32)).cuda()  # noqa: E731
    theirs = torch._scaled_mm(to_torch(a).to(torch.float8_e4m3fn), to_torch(b).to(torch.float8_e4m3fn).t(),
                              scale_a=to_torch(scale_a), scale_b=to_torch(scale_b), out_dtype=torch.bfloat16)
    theirs = theirs.float().cpu().numpy()
    expected, _ = scaled_gemm.reference(a, b, scale_a, scale_b)
    testing.assert_close(ours, expected, "bfloat16", k, what="GE2 scaled_gemm")
    testing.assert_close(theirs, expected, "bfloat16", k, what="torch._scaled_mm")
    print(f"GE2 vs torch._scaled_mm: identical elements {float((ours.astype(np.float32) == theirs).mean()):.4f}")
