"""conv2d's cutlass_sm90 candidate (CUTLASS 3.x sm90 implicit GEMM, sm_90a), pinned by name: the forward and the
backward (dx, dw, dbias) against the float64 reference in float16 and bfloat16 on edge shapes (odd H and W, stride
2, uneven padding, dilation, 1x1 and 7x7 filters, partial pixel, filter and channel tiles), the fused epilogue (bias,
residual, every activation, the clip), what it declines (with the reason) and misaligned tensors. On a CPU machine:
kernels() says whether it was built, and why not."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ops import OPS, conv2d
from graph_executor_v2.testing import assert_close, random_array
from test_conv2d import assert_gradients_written

HALF_DTYPES = ("float16", "bfloat16")
ACTS = ("none", "relu", "gelu", "silu", "leaky_relu")

# (N, C, H, W, K, R, S, stride, padding, dilation, act, bias)
CASES = [
    (2, 16, 9, 7, 24, 1, 1, 1, 0, 1, "none", False),  # 1x1, odd H and W
    (2, 32, 14, 13, 64, 1, 1, 2, 0, 1, "relu", False),  # 1x1 stride 2 (a ResNet downsample)
    (2, 8, 11, 9, 16, 3, 3, 1, 1, 1, "relu", True),  # one 8-channel step of a 64-channel tile
    (3, 24, 13, 12, 40, 3, 3, 2, (1, 0, 2, 1), 1, "gelu", True),  # stride 2, uneven padding, a partial filter tile
    (2, 16, 8, 8, 16, 3, 3, 2, 0, 1, "none", True),  # stride 2 skips the last input row and column
    (2, 40, 12, 11, 64, 3, 3, 1, 2, 2, "silu", True),  # dilation 2, C = 40
    (2, 8, 23, 21, 16, 7, 7, 2, 3, 1, "leaky_relu", True),  # the stem's 7x7 stride 2
    (2, 16, 10, 17, 24, 2, 5, (2, 1), (0, 1), (1, 2), "none", True),  # rectangular filter, stride and dilation
    (2, 136, 9, 10, 72, 3, 3, 1, 1, 1, "gelu", True),  # three channel tiles per tap, the last an eighth full
    (3, 16, 56, 56, 136, 3, 3, 1, 1, 1, "relu", True),  # many pixel tiles, a partial filter tile
]
CASE_IDS = ["1x1_odd", "1x1_stride2", "3x3_c8", "3x3_stride2_pad4", "3x3_stride2_tail", "3x3_dilation2_c40",
            "7x7_stride2", "rectangular", "c136", "56x56_k136"]


def _row():
    return next(row for row in conv2d.kernels() if row["name"] == "cutlass_sm90")


def _require_native():
    if not ge2._native.is_built("_ops_conv2d"):
        pytest.skip("_ops_conv2d is not built")


def _built() -> bool:
    return "NOT BUILT" not in _row()["description"]


def _require_candidate():
    _require_native()
    if not _built():
        pytest.skip(f"cutlass_sm90 is not built: {_row()['description']}")


def _geometry(n=2, c=16, h=8, w=8, k=16, r=3, s=3, dtype="float16", layout="NHWC", **attrs):
    x_shape = (n, h, w, c) if layout == "NHWC" else (n, c, h, w)
    groups = attrs.get("groups", 1)
    w_shape = (k, r, s, c // groups) if layout == "NHWC" else (k, c // groups, r, s)
    return conv2d.check_problem(x_shape, dtype, w_shape, dtype, layout=layout, **attrs)


def _problem(rng, case, dtype, with_residual=False):
    n, c, h, w, k, r, s, stride, padding, dilation, act, with_bias = case
    x = random_array(rng, (n, h, w, c), dtype)
    weights = random_array(rng, (k, r, s, c), dtype, 1.0 / np.sqrt(c * r * s))  # keeps z O(1): activations bend
    bias = random_array(rng, (k,), dtype) if with_bias else None
    attrs = dict(stride=stride, padding=padding, dilation=dilation, layout="NHWC", act=act)
    geometry = conv2d.check_problem(x.shape, dtype, weights.shape, dtype, **attrs)
    residual = random_array(rng, geometry.out_shape, dtype) if with_residual else None
    return x, weights, bias, residual, attrs, geometry


def _check(rng, poisoned, to_device, case, dtype, with_residual=False, **extra):
    _require_candidate()
    x, w, bias, residual, attrs, geometry = _problem(rng, case, dtype, with_residual)
    attrs.update(extra)
    expected, _ = conv2d.reference(x, w, bias, residual, **attrs)
    out = poisoned(expected.shape, dtype)  # NaN: an element the kernel forgets to write can never pass
    device = lambda a: None if a is None else to_device(a)  # noqa: E731
    result = conv2d.forward(device(x), device(w), device(bias), device(residual), **attrs, kernel="cutlass_sm90",
                            out=out)
    assert result is out
    assert_close(out.numpy(), expected, dtype, reduction_length=geometry.reduction_length, what="y")


# ---------------------------------------------------------------------------------------------------------------
# CPU: the kernels() row and the reasons it declines
# ---------------------------------------------------------------------------------------------------------------
def test_kernels_row_says_built_or_not_built_with_the_reason():
    _require_native()
    row = _row()
    assert row["priority"] == 35 and tuple(row["dtypes"]) == ("float16", "bfloat16") and row["constraints"]
    assert [c.name for c in OPS["conv2d"].candidates][:2] == ["cudnn_graph", "cutlass_sm90"]
    assert "cutlass_sm90" in [c.name for c in selection.candidates(OPS["conv2d"])]
    geometry = _geometry()
    reason = conv2d.unsupported_reason("cutlass_sm90", geometry, "relu", True)
    if _built():
        assert reason is None or reason.startswith("needs an sm_90 GPU")
    else:
        assert row["description"].startswith("CUTLASS 3.x implicit GEMM for Hopper (sm_90a): NOT BUILT (")
        assert reason.startswith("NOT BUILT: ")


@pytest.mark.parametrize("change, reason", [
    (dict(c=12), "input channels C and output channels K must be multiples of 8 (16-byte TMA rows of x, w and y), "
                 "got C=12, K=16"),
    (dict(k=20), "got C=16, K=20"),
    (dict(layout="NCHW"), "NHWC only"),
    (dict(dtype="float32"), "float16 and bfloat16 only, got float32"),
    (dict(groups=2), "groups == 1 only, got groups=2"),
    (dict(backward=True, act="relu"), "backward with act none only"),
    (dict(backward=True, stride=2), "backward with stride 1 only (CUTLASS 4.2's sm90 dgrad has no strided form), "
                                    "got stride 2x2"),
    (dict(padding=130), "padding up to 128 and a dilated filter extent (R-1)*dilation below 255 (TMA im2col "
                        "offsets), got padding top/left 130/130"),
    (dict(h=300, r=129, dilation=2), "got padding top/left 0/0, filter 129x3 dilation 2x2"),
    (dict(stride=9), "stride up to 8 (TMA im2col element strides), got 9x9"),
    (dict(act="tanh"), "act none, relu, leaky_relu, gelu or silu only (the instantiated ones), got tanh"),
])
def test_declines_what_it_does_not_support_naming_the_reason(change, reason):
    _require_candidate()
    change = dict(change)  # the parameter's own dict stays whole
    backward = change.pop("backward", False)
    act = change.pop("act", "none" if backward else "relu")
    geometry = _geometry(**change)
    assert reason in conv2d.unsupported_reason("cutlass_sm90", geometry, act, True, backward=backward)


def _pointwise_tile(problem, dtype="float16", act="relu", sms=132, r=1, residual=True):
    """The forward's 1x1 GEMM tile for problem (N, C, H = W, K), with a residual unless told."""
    n, c, h, k = problem
    return conv2d.cutlass_sm90_pointwise_tile(_geometry(n=n, c=c, h=h, w=h, k=k, r=r, s=r, dtype=dtype), act, sms,
                                              residual=residual)


def _sm_count() -> int:
    runtime = ge2.device.runtime()
    return runtime.device_properties(runtime.current_device())["sm_count"]


def _require_pointwise_tile():
    _require_native()
    if not hasattr(conv2d._native_module(), "cutlass_sm90_pointwise_tile"):
        pytest.skip("this _ops_conv2d predates cutlass_sm90_pointwise_tile (rebuild it)")


# ResNet-50's 1x1 layers at N = 32 on the H200's 132 SMs: (C, H, K) and the forward's 1x1 GEMM tile with a residual.
# The transposed 128 x 192 tile where its tiles fill their waves, C >= 256 and (C == 256 or one wave): session 38's
# bench call (cuDNN's time / GE2's, the transposed tile against main's before).
RESNET50_POINTWISE_TILES = [
    ((512, 28, 128), "trans_128x192"),  # 131 tiles: 0.924x cuDNN against 0.894x
    ((256, 14, 1024), "trans_128x192"),  # 264 tiles, two whole waves: 0.740x against 0.647x
    ((256, 56, 128), "trans_128x192"),  # 523 tiles: 1.011x against 0.974x
    ((1024, 14, 512), "trans_128x192"),  # 132 tiles, one whole wave: 0.873x against 0.828x
    ((512, 28, 256), "gemm_64x128"),  # 262 tiles, two waves of a long reduction: 0.760x against 0.777x
    ((1024, 14, 256), "gemm_64x128"),  # 66 tiles, half a wave: 0.704x against 0.929x
    ((2048, 7, 512), "gemm_64x128"),  # 36 tiles: 0.406x against 0.842x
    ((512, 7, 2048), "gemm_64x128"),  # 144 tiles, 1.09 waves: 0.554x against 0.738x
    ((64, 56, 256), "coop_256x128"),  # C = 64: 0.795x against 0.856x
    ((128, 28, 512), "coop_256x128"),  # C = 128: 0.725x against 0.750x
    ((256, 56, 64), "coop_256x64"),  # 64 filters: half a 128-filter tile
]


@pytest.mark.parametrize("problem, tile", RESNET50_POINTWISE_TILES,
                         ids=[f"c{c}_h{h}_k{k}" for (c, h, k), _ in RESNET50_POINTWISE_TILES])
def test_pointwise_tile_rule_on_resnet50_layers(monkeypatch, problem, tile):
    _require_pointwise_tile()
    monkeypatch.delenv("GE2_CUTLASS_SM90_CONV_1X1", raising=False)
    assert _pointwise_tile((32, *problem)) == tile


# The same layers without a residual, float16: the tiles without C (session 40's mid call, us on the tile with C ->
# its twin without; cuDNN). The transposed tile takes C512 H28 K256 too, where with C it lost.
RESNET50_POINTWISE_TILES_WITHOUT_RESIDUAL = [
    ((512, 28, 128), "trans_128x192_noc"),  # 9.0 -> 8.0 (8.4)
    ((256, 14, 1024), "trans_128x192_noc"),  # 11.7 -> 10.3 (8.8)
    ((256, 56, 128), "trans_128x192_noc"),  # 25.3 -> 23.6 (26.0)
    ((1024, 14, 512), "trans_128x192_noc"),  # 12.6 -> 11.9 (11.2)
    ((512, 28, 256), "trans_128x192_noc"),  # 14.8 against gemm_64x128_noc's 16.5 (12.5)
    ((1024, 14, 256), "gemm_64x128_noc"),  # 8.5 -> 8.3 (8.0)
    ((2048, 7, 512), "gemm_64x128_noc"),  # 8.5 -> 8.2 (7.2)
    ((512, 7, 2048), "gemm_64x128_noc"),  # 10.8 -> 9.9 (8.0)
    ((64, 56, 256), "coop_256x128_noc"),  # 28.3 -> 24.5 (21.7)
    ((128, 28, 512), "coop_256x128_noc"),  # 16.8 -> 14.8 (16.7)
    ((256, 56, 64), "coop_256x64_noc"),  # 18.7 -> 18.2 (18.3)
    ((64, 56, 64), "coop_256x64_noc"),  # 9.7 -> 8.6 (6.3)
]


@pytest.mark.parametrize("problem, tile", RESNET50_POINTWISE_TILES_WITHOUT_RESIDUAL,
                         ids=[f"c{c}_h{h}_k{k}" for (c, h, k), _ in RESNET50_POINTWISE_TILES_WITHOUT_RESIDUAL])
def test_pointwise_tile_rule_without_a_residual_takes_the_tiles_without_c(monkeypatch, problem, tile):
    _require_pointwise_tile()
    monkeypatch.delenv("GE2_CUTLASS_SM90_CONV_1X1", raising=False)
    assert _pointwise_tile((32, *problem), residual=False) == tile
    # bfloat16 has no tiles without C: the residual changes nothing there
    bfloat16 = _pointwise_tile((32, *problem), residual=False, dtype="bfloat16")
    assert bfloat16 == _pointwise_tile((32, *problem), dtype="bfloat16") and not bfloat16.endswith("_noc")


def test_pointwise_tile_residual_must_be_a_bool():
    _require_pointwise_tile()
    with pytest.raises(TypeError, match="residual: expected a bool, got int"):
        _pointwise_tile((32, 512, 28, 128), residual=1)


def test_pointwise_tile_rule_keeps_bfloat16_and_the_rest_off_the_transposed_tile(monkeypatch):
    _require_pointwise_tile()
    monkeypatch.delenv("GE2_CUTLASS_SM90_CONV_1X1", raising=False)
    assert _pointwise_tile((32, 512, 28, 128), dtype="bfloat16") == "gemm_64x128"
    assert _pointwise_tile((32, 512, 28, 128), act="gelu") == "conv"  # the smooth family: the conv collective
    assert _pointwise_tile((32, 512, 28, 128), r=3) == "conv"
    assert _pointwise_tile((32, 512, 28, 128), sms=114) == "gemm_64x128"  # 131 tiles on 114 SMs: 1.15 waves
    assert _pointwise_tile((3, 264, 89, 128)) == "trans_128x192"  # the GPU test's shape: 124 tiles, one wave


def test_pointwise_tile_setting_wins_and_is_checked(monkeypatch):
    _require_pointwise_tile()
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", "trans_128x192")
    assert _pointwise_tile((2, 64, 8, 64)) == "trans_128x192"
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", "conv")
    assert _pointwise_tile((32, 512, 28, 128)) == "conv"
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", "trans_128x192")
    with pytest.raises(ValueError, match="trans_128x192 runs float16 only, got bfloat16"):
        _pointwise_tile((32, 512, 28, 128), dtype="bfloat16")
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", "trans_128x192_1x2")  # session 37's trial, removed
    with pytest.raises(ValueError, match="or trans_128x192_noc, got 'trans_128x192_1x2'"):
        _pointwise_tile((32, 512, 28, 128))


# The 1x1 GEMM's tiles without the epilogue's source operand (float16 only): problems without a residual run on them,
# the others on their namesakes with one.
NO_C_TILES = ("gemm_64x128_noc", "coop_256x64_noc", "coop_256x128_noc", "trans_128x192_noc")


@pytest.mark.parametrize("tile", NO_C_TILES)
def test_pointwise_no_c_tiles_are_named_and_float16_only(monkeypatch, tile):
    _require_pointwise_tile()
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", tile)
    assert _pointwise_tile((2, 64, 8, 64)) == tile
    assert _pointwise_tile((32, 512, 28, 128), act="none") == tile
    assert _pointwise_tile((32, 512, 28, 128), act="gelu") == "conv"  # the smooth family: the conv collective
    with pytest.raises(ValueError, match=f"GE2_CUTLASS_SM90_CONV_1X1: {tile} runs float16 only, got bfloat16"):
        _pointwise_tile((32, 512, 28, 128), dtype="bfloat16")


@pytest.mark.parametrize("sms", (0, -4, 1.5, True))
def test_pointwise_tile_refuses_a_bad_sm_count(sms):
    with pytest.raises(ValueError, match=f"sms: expected a positive number of SMs, got {sms!r}"):
        _pointwise_tile((32, 512, 28, 128), sms=sms)


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
# The forward's paths, forced (each runs any K): the conv collective's two tiles and the persistent ping-pong kernel
# (the piecewise-linear family only), with the 1x1 cases off the 1x1 GEMM.
FORWARD_PATHS = {"conv_128x128": {"GE2_CUTLASS_SM90_CONV_FPROP": "conv", "GE2_CUTLASS_SM90_CONV_TILE": "128x128"},
                 "conv_128x64": {"GE2_CUTLASS_SM90_CONV_FPROP": "conv", "GE2_CUTLASS_SM90_CONV_TILE": "128x64"},
                 "pingpong": {"GE2_CUTLASS_SM90_CONV_FPROP": "pingpong"}}


def _force_forward_path(monkeypatch, path, act):
    if path == "pingpong" and act not in ("none", "relu", "leaky_relu"):
        pytest.skip("the ping-pong forward runs the piecewise-linear activations only")
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", "conv")
    for variable, value in FORWARD_PATHS[path].items():
        monkeypatch.setenv(variable, value)


@pytest.mark.gpu
@pytest.mark.parametrize("path", FORWARD_PATHS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forward_matches_the_reference(rng, poisoned, to_device, monkeypatch, case, dtype, path):
    """Each forward path, forced, on every edge case."""
    _force_forward_path(monkeypatch, path, case[10])
    _check(rng, poisoned, to_device, case, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("variable, value, filter_size, expected", [
    ("GE2_CUTLASS_SM90_CONV_TILE", "256x128", 3, "expected 128x128 or 128x64, got '256x128'"),
    ("GE2_CUTLASS_SM90_CONV_1X1", "gemm_256x128", 1,
     "expected conv, gemm_128x64, gemm_64x128, coop_256x64, coop_256x128, trans_128x192, gemm_64x128_noc, "
     "coop_256x64_noc, coop_256x128_noc or trans_128x192_noc, got 'gemm_256x128'"),
    ("GE2_CUTLASS_SM90_CONV_FPROP", "cooperative", 3, "expected conv or pingpong, got 'cooperative'"),
    ("GE2_CUTLASS_SM90_PDL", "yes", 1, "expected 0 or 1, got 'yes'"),
])
def test_bad_tile_setting_is_refused(rng, to_device, monkeypatch, variable, value, filter_size, expected):
    _require_candidate()
    monkeypatch.setenv(variable, value)
    x = to_device(random_array(rng, (2, 6, 6, 16), "float16"))
    w = to_device(random_array(rng, (16, filter_size, filter_size, 16), "float16"))
    with pytest.raises(ValueError, match=f"{variable}: {expected}"):
        conv2d.forward(x, w, layout="NHWC", kernel="cutlass_sm90")


@pytest.mark.gpu
@pytest.mark.parametrize("path", FORWARD_PATHS)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("act", ACTS)
def test_fused_residual_and_every_activation(rng, poisoned, to_device, monkeypatch, act, dtype, path):
    """y = act(conv + bias + residual): the residual is the epilogue's source tensor, read only when given. Every
    activation on every path and dtype: each (tile, dtype) has an instantiation per activation family (none, relu,
    leaky_relu; gelu, silu; the ping-pong kernel the first only), each family's members chosen at run time."""
    _force_forward_path(monkeypatch, path, act)
    case = (2, 24, 13, 11, 32, 3, 3, 1, 1, 1, act, True)
    _check(rng, poisoned, to_device, case, dtype, with_residual=True, slope=0.2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("act", ["relu", "gelu"])  # one of each activation family
@pytest.mark.parametrize("clip_min, clip_max", [(0.0, 0.5), (None, 0.25), (-0.25, None)])
def test_fused_clip_after_the_activation(rng, poisoned, to_device, clip_min, clip_max, act, dtype):
    """relu6-like and hardtanh-like clips, each bound alone too: the last node of the epilogue."""
    case = (2, 16, 9, 9, 24, 3, 3, 1, 1, 1, act, True)
    _check(rng, poisoned, to_device, case, dtype, with_residual=True, clip_min=clip_min, clip_max=clip_max)


# 1x1 convolutions at stride 1 without padding: GEMMs on the persistent kernel (GE2_CUTLASS_SM90_CONV_1X1 picks the
# tile, or "conv" the conv collective) for the piecewise-linear activations, the conv collective for the others.
POINTWISE_CASES = [
    (2, 16, 9, 7, 24, 1, 1, 1, 0, 1, "none", False),  # odd H and W: a partial pixel tile, a partial filter tile
    (1, 8, 3, 5, 8, 1, 1, 1, 0, 1, "relu", True),  # one 8-channel step, 15 pixels
    (3, 136, 10, 11, 72, 1, 1, 1, 0, 1, "relu", True),  # three 64-channel steps, the last an eighth full
    (2, 64, 28, 28, 136, 1, 1, 1, 0, 1, "leaky_relu", True),  # several tiles per persistent CTA, a partial filter tile
    (2, 32, 7, 9, 40, 1, 1, 1, 0, 1, "gelu", True),  # the smooth family: the conv collective whatever the setting
]
POINTWISE_IDS = ["odd", "c8", "c136", "28x28_k136", "gelu"]


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["conv", "gemm_128x64", "gemm_64x128", "coop_256x64", "coop_256x128"])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("case", POINTWISE_CASES, ids=POINTWISE_IDS)
def test_pointwise_forward_matches_the_reference(rng, poisoned, to_device, monkeypatch, case, dtype, path):
    """The 1x1 GEMM's tiles and the conv collective, each forced, with the whole epilogue (bias, residual, act)."""
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", path)
    _check(rng, poisoned, to_device, case, dtype, with_residual=True, slope=0.2)


# The transposed GEMM's edges besides POINTWISE_CASES': pixel counts that are not multiples of its 192-pixel tile,
# partial 128-filter tiles, a partial last 64-channel step.
TRANSPOSED_CASES = POINTWISE_CASES + [
    (4, 512, 28, 28, 128, 1, 1, 1, 0, 1, "relu", True),  # ResNet-50's C512 K128 at N = 4: 3,136 pixels, 16.3 tiles
    (3, 264, 11, 13, 200, 1, 1, 1, 0, 1, "leaky_relu", True),  # 429 pixels, 200 filters, 264 channels
]
TRANSPOSED_IDS = POINTWISE_IDS + ["resnet_c512_n4", "c264_k200"]


@pytest.mark.gpu
@pytest.mark.parametrize("case", TRANSPOSED_CASES, ids=TRANSPOSED_IDS)
def test_pointwise_transposed_tile_matches_the_reference(rng, poisoned, to_device, monkeypatch, case):
    """The transposed GEMM (float16 only; y^T = w x^T, the bias along M), forced, with the whole epilogue."""
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", "trans_128x192")
    _check(rng, poisoned, to_device, case, "float16", with_residual=True, slope=0.2)


# Epilogues of a problem without a residual: (act, bias, clip). "plain" (none of them) runs the tile's twin whose
# epilogue only rounds; each of the others must reach the no-C tree, which applies it.
NO_C_EPILOGUES = {"plain": ("none", False, {}), "act": (None, False, {}),
                  "clip": ("none", False, dict(clip_min=-0.75, clip_max=1.25)),
                  "bias_act_clip": (None, True, dict(clip_min=-0.75, clip_max=1.25))}


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", NO_C_EPILOGUES)
@pytest.mark.parametrize("tile", NO_C_TILES)
@pytest.mark.parametrize("case", TRANSPOSED_CASES, ids=TRANSPOSED_IDS)
def test_pointwise_no_c_tile_matches_the_reference(rng, poisoned, to_device, monkeypatch, case, tile, epilogue):
    """Each tile without a source operand (float16; ElementC void: bias, act and clip only), forced, without a
    residual, on the pointwise edges (partial pixel, filter and channel tiles), with each epilogue of NO_C_EPILOGUES
    ("act" is the case's activation, None meaning it): a plain convolution on the convert-only twin, and a clip, an
    activation or a bias that the twin would drop."""
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", tile)
    act, bias, clip = NO_C_EPILOGUES[epilogue]
    _check(rng, poisoned, to_device, case[:10] + (act or case[10], bias), "float16", slope=0.2, **clip)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", NO_C_TILES)
@pytest.mark.parametrize("case", TRANSPOSED_CASES[1:4], ids=TRANSPOSED_IDS[1:4])
def test_pointwise_no_c_tile_runs_a_residual_on_its_namesake(rng, poisoned, to_device, monkeypatch, case, tile):
    """A problem with a residual, forced onto a tile without a source operand, runs on the tile with one (the same
    tile shape and schedule): the residual is added, not dropped."""
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", tile)
    _check(rng, poisoned, to_device, case, "float16", with_residual=True, slope=0.2, clip_min=-0.5, clip_max=1.5)


@pytest.mark.gpu
def test_pointwise_default_takes_the_transposed_tile_where_its_wave_is_full(rng, poisoned, to_device, monkeypatch):
    """Unforced, on a shape the rule gives the transposed tile on the H200 (124 of 132 tiles; 23,763 pixels, not a
    multiple of 192; 264 channels, the last 64-channel step an eighth full)."""
    monkeypatch.delenv("GE2_CUTLASS_SM90_CONV_1X1", raising=False)
    case = (3, 264, 89, 89, 128, 1, 1, 1, 0, 1, "relu", True)
    if _sm_count() == 132:
        assert _pointwise_tile((3, 264, 89, 128)) == "trans_128x192"
    _check(rng, poisoned, to_device, case, "float16", with_residual=True)


@pytest.mark.gpu
def test_pointwise_default_without_a_residual_runs_the_tile_without_c(rng, poisoned, to_device, monkeypatch):
    """Unforced and without a residual, the same shape runs on the transposed tile's twin without C."""
    monkeypatch.delenv("GE2_CUTLASS_SM90_CONV_1X1", raising=False)
    case = (3, 264, 89, 89, 128, 1, 1, 1, 0, 1, "relu", True)
    if _sm_count() == 132:
        assert _pointwise_tile((3, 264, 89, 128), residual=False) == "trans_128x192_noc"
    _check(rng, poisoned, to_device, case, "float16")


@pytest.mark.gpu
def test_transposed_tile_refuses_bfloat16_and_a_misaligned_bias(rng, to_device, monkeypatch):
    """trans_128x192 has a float16 instantiation only; its bias (a column broadcast along the filters) is read by
    16-byte vectors, so an offset view of it is refused as every misaligned tensor is."""
    torch = pytest.importorskip("torch")
    _require_candidate()
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", "trans_128x192")
    x = to_device(random_array(rng, (2, 6, 6, 16), "bfloat16"))
    w = to_device(random_array(rng, (16, 1, 1, 16), "bfloat16"))
    with pytest.raises(ValueError, match="GE2_CUTLASS_SM90_CONV_1X1: trans_128x192 runs float16 only, got bfloat16"):
        conv2d.forward(x, w, layout="NHWC", kernel="cutlass_sm90")
    tx = torch.from_numpy(random_array(rng, (2, 6, 6, 16), "float16")).cuda()
    tw = torch.from_numpy(random_array(rng, (16, 1, 1, 16), "float16")).cuda()
    bias = torch.zeros(17, dtype=torch.float16, device="cuda")[1:]
    with pytest.raises(ValueError, match="kernel 'cutlass_sm90' needs 16-byte aligned x, w, y, bias and residual"):
        conv2d.forward(tx, tw, bias, layout="NHWC", kernel="cutlass_sm90")


@pytest.mark.gpu
@pytest.mark.parametrize("programmatic", ["0", "1"])
@pytest.mark.parametrize("path", ["gemm_128x64", "gemm_64x128", "coop_256x128", "trans_128x192", "pingpong",
                                  "gemm_64x128_noc", "trans_128x192_noc"])
def test_programmatic_dependent_launch_on_and_off(rng, poisoned, to_device, monkeypatch, path, programmatic):
    """The persistent kernels run as programmatic dependent launches unless GE2_CUTLASS_SM90_PDL=0: launches back to
    back, each reading what the one before wrote (the second waits for the first before its first load)."""
    _require_candidate()
    monkeypatch.setenv("GE2_CUTLASS_SM90_PDL", programmatic)
    if path == "pingpong":
        monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_FPROP", "pingpong")
        shape, r = (2, 14, 13, 136), 3
    else:
        monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_1X1", path)
        shape, r = (2, 28, 28, 136), 1
    x = random_array(rng, shape, "float16")
    w = random_array(rng, (136, r, r, 136), "float16", 1.0 / np.sqrt(136 * r * r))
    attrs = dict(padding=r // 2, layout="NHWC", act="relu")
    outs = [poisoned(shape, "float16") for _ in range(3)]  # allocated first: the launches follow one another
    current, device_w = to_device(x), to_device(w)
    for out in outs:  # y of one launch is x of the next
        conv2d.forward(current, device_w, **attrs, kernel="cutlass_sm90", out=out)
        current = out
    previous = x
    for out in outs:
        expected, _ = conv2d.reference(previous, w, None, None, **attrs)
        assert_close(out.numpy(), expected, "float16", reduction_length=136 * r * r, what="y")
        previous = out.numpy()


# The backward's cases: stride 1 (dgrad's) and act none, with the forward's edges otherwise.
BACKWARD_CASES = [
    (2, 16, 9, 7, 24, 1, 1, 1, 0, 1, "none", False),  # 1x1, odd H and W
    (2, 8, 11, 9, 16, 3, 3, 1, 1, 1, "none", True),
    (3, 24, 13, 12, 40, 3, 3, 1, (1, 0, 2, 1), 1, "none", True),  # uneven padding, a partial filter tile
    (2, 40, 12, 11, 64, 3, 3, 1, 2, 2, "none", True),  # dilation 2, C = 40
    (2, 8, 15, 13, 16, 7, 7, 1, 3, 1, "none", True),  # 7x7: dgrad's window corners at -3 and -3
    (2, 16, 10, 17, 24, 2, 5, 1, (0, 1), (1, 2), "none", True),  # rectangular filter and dilation
    (2, 136, 9, 10, 72, 3, 3, 1, 1, 1, "none", True),  # three channel tiles
    (2, 16, 28, 28, 136, 3, 3, 1, 1, 1, "none", True),  # many dgrad pixel tiles, a partial wgrad tile
]
BACKWARD_IDS = ["1x1_odd", "3x3_c8", "3x3_pad4", "3x3_dilation2_c40", "7x7", "rectangular", "c136", "28x28_k136"]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", ["128x128", "128x64"])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("case", BACKWARD_CASES, ids=BACKWARD_IDS)
def test_backward_matches_the_reference(rng, poisoned, to_device, monkeypatch, case, dtype, tile):
    """dx (dgrad, each tile forced), dw (wgrad) and dbias (GE2's reduction of dy), each written whole into a poisoned
    output; the slices of wgrad's reduction as the cost model picks them (28x28_k136: 27 output tiles, 25 k tiles in
    4 slices)."""
    monkeypatch.setenv("GE2_CUTLASS_SM90_CONV_TILE", tile)
    _check_backward(rng, poisoned, to_device, case, dtype)


def _check_backward(rng, poisoned, to_device, case, dtype):
    _require_candidate()
    x, w, bias, _, attrs, geometry = _problem(rng, case, dtype)
    y, _ = conv2d.reference(x, w, bias, **attrs)
    dy = random_array(rng, y.shape, dtype)
    expected = conv2d.reference_backward(dy, x, w, bias, **attrs)
    outs = (poisoned(x.shape, dtype), poisoned(w.shape, dtype), None if bias is None else poisoned(bias.shape, dtype),
            None)
    device = lambda a: None if a is None else to_device(a)  # noqa: E731
    grads = conv2d.backward(device(dy), device(x), device(w), device(bias), **attrs, kernel="cutlass_sm90", out=outs)
    n_pq = geometry.n * geometry.p * geometry.q
    lengths = (geometry.k * geometry.r * geometry.s, n_pq, n_pq)
    assert_gradients_written(grads, outs, expected, lengths, dtype)


# wgrad's reduction over N*P*Q runs in slices (grid layers of CTAs writing float32 partial sums, added up and rounded
# once by a second kernel) where its output tiles are too few for the GPU. Shapes whose k tiles (64 pixels of N*P*Q
# each) split unevenly, the last k tile part-full, N = 1 and odd N:
SLICE_CASES = [
    (1, 16, 12, 12, 24, 3, 3, 1, 1, 1, "none", False),  # N = 1: 144 pixels, 3 k tiles
    (3, 24, 13, 12, 40, 3, 3, 1, (1, 0, 2, 1), 1, "none", True),  # odd N, uneven padding: 468 pixels, 8 k tiles
    (5, 32, 17, 15, 72, 3, 3, 1, 1, 1, "none", True),  # 1,275 pixels, 20 k tiles; a partial second filter tile
    (3, 136, 9, 10, 72, 1, 1, 1, 0, 1, "none", False),  # 1x1: 270 pixels, 5 k tiles; a second channel tile
]
SLICE_IDS = ["n1", "n3_pad4", "n5_20_k_tiles", "1x1_c136"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("slices", ["1", "2", "3", "7"])
@pytest.mark.parametrize("case", SLICE_CASES, ids=SLICE_IDS)
def test_backward_in_forced_wgrad_slices_matches_the_reference(rng, poisoned, to_device, monkeypatch, case, slices,
                                                                dtype):
    """GE2_CUTLASS_SM90_WGRAD_SLICES forces the slice count (cut to the k tile count: 7 asked of 3 k tiles runs 3,
    of 8 runs 4 of 2): 1 is the direct kernel writing dw, the others slices of unequal length (20 k tiles in 3:
    7 + 7 + 6; in 7: six of 3 and one of 2)."""
    monkeypatch.setenv("GE2_CUTLASS_SM90_WGRAD_SLICES", slices)
    _check_backward(rng, poisoned, to_device, case, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_backward_of_a_resnet_layer_at_batch_1_matches_the_reference(rng, poisoned, to_device, dtype):
    """ResNet-50's first 3x3 layer (C = K = 64, 56 x 56) at N = 1: 9 wgrad output tiles against 49 k tiles, so the
    cost model slices the reduction by itself."""
    _check_backward(rng, poisoned, to_device, (1, 64, 56, 56, 64, 3, 3, 1, 1, 1, "none", False), dtype)


@pytest.mark.gpu
def test_bad_wgrad_slices_setting_is_refused(rng, to_device, monkeypatch):
    _require_candidate()
    monkeypatch.setenv("GE2_CUTLASS_SM90_WGRAD_SLICES", "0")
    dy = to_device(random_array(rng, (2, 6, 6, 16), "float16"))
    x = to_device(random_array(rng, (2, 6, 6, 16), "float16"))
    w = to_device(random_array(rng, (16, 1, 1, 16), "float16"))
    with pytest.raises(ValueError, match="GE2_CUTLASS_SM90_WGRAD_SLICES: expected a slice count 1..1024, got '0'"):
        conv2d.backward(dy, x, w, layout="NHWC", kernel="cutlass_sm90")


@pytest.mark.gpu
def test_named_kernel_refuses_what_it_cannot_run(rng, to_device):
    _require_candidate()
    x = to_device(random_array(rng, (2, 6, 6, 12), "float16"))
    w = to_device(random_array(rng, (16, 3, 3, 12), "float16"))
    with pytest.raises(ValueError, match=r"kernel: 'cutlass_sm90' cannot run this problem: input channels C and "
                                         r"output channels K must be multiples of 8 .*got C=12, K=16"):
        conv2d.forward(x, w, layout="NHWC", kernel="cutlass_sm90")
    dy = to_device(random_array(rng, (2, 4, 4, 16), "float16"))
    x16 = to_device(random_array(rng, (2, 6, 6, 16), "float16"))
    w16 = to_device(random_array(rng, (16, 3, 3, 16), "float16"))
    with pytest.raises(ValueError, match="kernel: 'cutlass_sm90' cannot run this problem: backward with act none"):
        conv2d.backward(dy, x16, w16, layout="NHWC", act="relu", kernel="cutlass_sm90")


@pytest.mark.gpu
@pytest.mark.parametrize("operand", ["x", "y"])
def test_misaligned_tensors_are_refused_with_the_reason(rng, operand):
    """x or y 2 bytes past a 16-byte boundary (an offset view): the named kernel refuses, naming the tensors. For a
    misaligned x, auto runs another candidate and gets the same numbers (the selector ranks by the inputs'
    alignment)."""
    torch = pytest.importorskip("torch")
    _require_candidate()
    x, w, bias, _, attrs, geometry = _problem(rng, CASES[2], "float16")
    expected, _ = conv2d.reference(x, w, bias, **attrs)
    tx, tw, tb = (torch.from_numpy(a).cuda() for a in (x, w, bias))
    out = None
    if operand == "x":
        storage = torch.empty(x.size + 1, dtype=torch.float16, device="cuda")
        tx = storage[1:].view(x.shape)
        tx.copy_(torch.from_numpy(x))
    else:
        out = torch.full((expected.size + 1,), float("nan"), dtype=torch.float16, device="cuda")[1:].view(
            expected.shape)
    with pytest.raises(ValueError, match="kernel 'cutlass_sm90' needs 16-byte aligned x, w, y, bias and residual"):
        conv2d.forward(tx, tw, tb, **attrs, kernel="cutlass_sm90", out=out)
    if operand == "x":
        y = conv2d.forward(tx, tw, tb, **attrs)
        assert_close(y.cpu().numpy(), expected, "float16", reduction_length=geometry.reduction_length, what="y")
