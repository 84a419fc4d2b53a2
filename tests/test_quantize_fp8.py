"""quantize_fp8 and quantize_fp8_transpose: the references (CPU), the one-pass kernels against them bit for bit
(GPU), the amax, and bad input; fp8_scale_update, delayed scaling's state update, against its reference."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.dtypes import saturate_to_float8
from graph_executor_v2.ops import activations, quantize_fp8
from graph_executor_v2.testing import assert_within_one_fp8_ulp, captured_graph

FP8 = {"float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
SOURCES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _same_bits_or_both_nan(actual, expected, what):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, what
    bad = ~((actual == expected) & (np.signbit(actual) == np.signbit(expected)) | np.isnan(actual) & np.isnan(expected))
    if bad.any():
        index = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} differ; first at {index}: got "
                             f"{actual[index]!r}, expected {expected[index]!r}")


def _input(rng, shape, source):
    """Normal values over many binades (FP8's subnormals to past its largest value once scaled)."""
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-10, 10, shape))).astype(SOURCES[source])


def test_reference_scales_rounds_saturates_and_reports_the_unscaled_amax():
    x = np.array([1.0, -3.0, 500.0, np.inf, 0.01, -0.0], np.float32)
    y, amax = quantize_fp8.reference(x, np.float32(2.0), "float8_e4m3fn")
    np.testing.assert_array_equal(y[:4], [2.0, -6.0, 448.0, 448.0])  # 1000 and inf saturate
    assert y[4] == float(np.float32(0.02).astype(ml_dtypes.float8_e4m3fn)) and np.signbit(y[5])
    assert amax.shape == () and amax == np.inf
    assert quantize_fp8.reference(x[:3], np.float32(2.0))[1] == 500.0
    assert np.isnan(quantize_fp8.reference(np.array([1.0, np.nan], np.float32), np.float32(1.0))[1])
    assert quantize_fp8.reference(np.zeros((0, 3), np.float32), np.float32(1.0))[1] == 0.0


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_cpu_graph_matches_the_reference(rng, dtype):
    x = _input(rng, (6, 10), "bfloat16")
    g = ge2.ir.Graph("quantize")
    y, amax = g.quantize_fp8(g.input("x", x.shape, "bfloat16"), g.input("scale", (), "float32"), dtype=dtype)
    g.output(y, "y")
    g.output(amax, "amax")
    out = ge2.ExecutorV2(g).run({"x": x, "scale": np.array(3.0, np.float32)})
    expected_y, expected_amax = quantize_fp8.reference(x, np.float32(3.0), dtype)
    assert out["y"].dtype == FP8[dtype] and out["amax"].dtype == np.float32
    _same_bits_or_both_nan(out["y"], expected_y, "y")
    assert out["amax"] == expected_amax


def test_bad_input_is_named():
    g = ge2.ir.Graph("bad")
    x = g.input("x", (4, 4), "float32")
    with pytest.raises(TypeError, match="x: expected one of float32"):
        g.quantize_fp8(g.input("ids", (4,), "int32"), g.input("s0", (), "float32"))
    with pytest.raises(TypeError, match="scale: expected a float32 scalar"):
        g.quantize_fp8(x, g.input("s1", (), "float16"))
    with pytest.raises(ValueError, match=r"scale: expected one element"):
        g.quantize_fp8(x, g.input("s2", (2,), "float32"))
    with pytest.raises(ValueError, match="dtype"):
        g.quantize_fp8(x, g.input("s3", (1,), "float32"), dtype="bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize("source", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("shape", [(1,), (7, 33), (1025, 1023), (2048, 1024)])
def test_kernel_is_bit_exact_with_the_amax_of_the_same_pass(rng, source, dtype, shape):
    x = _input(rng, shape, source)
    flat = x.reshape(-1)
    flat[: min(4, flat.size)] = np.array([0.0, -0.0, 1e4, -3e-5])[: min(4, flat.size)].astype(x.dtype)
    scale = np.array(rng.choice([1.0, 37.5, 2.0 ** -4, 1000.0]), np.float32)
    y, amax = quantize_fp8.forward_numpy(x, scale, dtype)
    expected_y, expected_amax = quantize_fp8.reference(x, scale, dtype)
    what = f"{source}->{dtype} shape {shape} scale {float(scale)}"
    _same_bits_or_both_nan(y, expected_y, what)
    assert amax.dtype == np.float32 and amax.shape == () and amax == expected_amax, (what, amax, expected_amax)


@pytest.mark.gpu
def test_amax_propagates_nan_and_inf_and_is_not_carried_between_calls(rng):
    scale = np.array(1.0, np.float32)
    x = _input(rng, (300,), "float32")
    x[17] = np.inf
    y, amax = quantize_fp8.forward_numpy(x, scale)
    assert amax == np.inf and float(y[17]) == 448.0
    x[200] = np.nan
    y, amax = quantize_fp8.forward_numpy(x, scale)
    assert np.isnan(amax) and np.isnan(float(y[200]))
    # the same output arrays, a smaller input: amax is this call's, not the maximum with the previous one
    rt = ge2.device.runtime()
    x_device = rt.DeviceArray.from_numpy(x)
    y_device, amax_device = rt.DeviceArray.empty([300], "float8_e4m3fn"), rt.DeviceArray.empty([], "float32")
    scale_device = rt.DeviceArray.from_numpy(scale)
    quantize_fp8.forward(x_device, scale_device, out=(y_device, amax_device))
    small = np.full(300, 0.5, np.float32)
    quantize_fp8.forward(rt.DeviceArray.from_numpy(small), scale_device, out=(y_device, amax_device))
    assert amax_device.numpy() == 0.5


@pytest.mark.gpu
@pytest.mark.parametrize("offset_elements", [1, 3])
def test_misaligned_views_take_the_element_wise_path(rng, offset_elements):
    rt = ge2.device.runtime()
    x = _input(rng, (4096 + 8,), "bfloat16")
    base = rt.DeviceArray.from_numpy(x)
    view = base.view(2 * offset_elements, [4096], "bfloat16")  # 16-bit elements at a 2/6-byte offset
    y, amax = quantize_fp8.forward(view, rt.DeviceArray.from_numpy(np.array(8.0, np.float32)))
    expected_y, expected_amax = quantize_fp8.reference(x[offset_elements:offset_elements + 4096], np.float32(8.0))
    _same_bits_or_both_nan(y.numpy(), expected_y, f"offset {offset_elements}")
    assert amax.numpy() == expected_amax


@pytest.mark.gpu
def test_quantize_node_in_a_cuda_plan(rng):
    x = _input(rng, (256, 96), "float32")
    g = ge2.ir.Graph("quantize_plan")
    y, amax = g.quantize_fp8(g.input("x", x.shape, "float32"), g.input("scale", (1,), "float32"), dtype="float8_e5m2")
    g.output(y, "y")
    g.output(amax, "amax")
    executor = ge2.ExecutorV2(g, device="cuda")
    assert not executor.fallbacks
    out = executor.run({"x": x, "scale": np.array([0.25], np.float32)})
    expected_y, expected_amax = quantize_fp8.reference(x, np.float32(0.25), "float8_e5m2")
    _same_bits_or_both_nan(out["y"], expected_y, "plan y")
    assert out["amax"] == expected_amax


def test_scale_update_rolls_the_history_and_targets_the_format_maximum():
    history = np.array([1.0, 4.0, 2.0, 0.5], np.float32)
    new_history, scale, scale_inv = quantize_fp8.reference_scale_update(history, 1.0, 3.0, "float8_e4m3fn", margin=1)
    np.testing.assert_array_equal(new_history, [3.0, 1.0, 4.0, 2.0])  # newest first, the oldest dropped
    assert scale == np.float32(448.0 / 2 / 4.0) and scale_inv == np.float32(1.0) / scale
    e5m2 = quantize_fp8.reference_scale_update(history, 1.0, 3.0, "float8_e5m2")[1]
    assert e5m2 == np.float32(57344.0 / 4.0)
    # nothing seen yet: the scale stays; an overflowed step (inf/NaN amax) leaves the whole state as it was
    assert quantize_fp8.reference_scale_update(np.zeros(3, np.float32), 7.0, 0.0)[1] == 7.0
    for bad in (np.inf, np.nan):
        kept, scale, _ = quantize_fp8.reference_scale_update(history, 5.0, bad)
        np.testing.assert_array_equal(kept, history)
        assert scale == np.float32(448.0 / 4.0)


def test_scale_update_bad_input_is_named():
    g = ge2.ir.Graph("bad_update")
    with pytest.raises(TypeError, match=r"states\[0\] \(tensor 0's history\): expected a 1-d float32"):
        g.fp8_scale_update(g.input("h", (2, 2), "float32"), g.input("s", (), "float32"), g.input("a", (), "float32"))
    with pytest.raises(ValueError, match="margin"):
        g.fp8_scale_update(g.input("h1", (4,), "float32"), g.input("s1", (), "float32"),
                           g.input("a1", (), "float32"), margin=-1)
    good = [g.input("h2", (4,), "float32"), g.input("s2", (), "float32"), g.input("a2", (), "float32")]
    with pytest.raises(ValueError, match=r"states: expected \(history, scale, amax\) for each tensor, got 4 inputs"):
        g.fp8_scale_update(*good, g.input("h3", (4,), "float32"))
    with pytest.raises(ValueError, match=r"states\[5\] \(tensor 1's amax\): expected one element"):
        g.fp8_scale_update(*good, g.input("h4", (4,), "float32"), g.input("s4", (), "float32"),
                           g.input("a4", (2,), "float32"))
    with pytest.raises(TypeError, match=r"states\[4\] \(tensor 1's scale\): expected a float32 scalar"):
        g.fp8_scale_update(*good, g.input("h5", (4,), "float32"), g.input("s5", (), "float16"),
                           g.input("a5", (), "float32"))


def _scale_states(rng, lengths):
    """(history, scale, amax) per length: histories of positive values (all zero for every fifth), scales in
    [0.5, 8), amaxes cycling through the cases the update treats apart (0, a value, a tiny one, inf, NaN)."""
    amaxes = [0.0, 3.0, 1e-30, np.inf, np.nan, 250.0]
    states = []
    for index, length in enumerate(lengths):
        history = (np.abs(rng.standard_normal(length)) * 10).astype(np.float32) * (index % 5 != 0)
        states += [history, np.array(rng.uniform(0.5, 8.0), np.float32), np.array(amaxes[index % 6], np.float32)]
    return states


def test_scale_update_of_several_tensors_is_each_ones_update(rng):
    states = _scale_states(rng, [1, 16, 3, 7])
    g = ge2.ir.Graph("several_updates")
    values = [g.input(f"v{i}", array.shape, "float32") for i, array in enumerate(states)]
    outputs = g.fp8_scale_update(*values, dtype="float8_e5m2", margin=1)
    for index, value in enumerate(outputs):
        g.output(value, f"out{index}")
    assert len(outputs) == 12 and [v.type.shape for v in outputs[:3]] == [(1,), (), ()]
    got = ge2.ExecutorV2(g, device="cpu").run({f"v{i}": array for i, array in enumerate(states)})
    for tensor in range(4):
        expected = quantize_fp8.reference_scale_update(*states[3 * tensor:3 * tensor + 3], "float8_e5m2", margin=1)
        for field, want in enumerate(expected):
            np.testing.assert_array_equal(got[f"out{3 * tensor + field}"], want, err_msg=f"tensor {tensor} {field}")


@pytest.mark.gpu
@pytest.mark.parametrize("length", [1, 16, 1024])
@pytest.mark.parametrize("amax", [0.0, 3.0, 1e-30, np.inf, np.nan])
def test_scale_update_kernel_matches_the_reference(rng, length, amax):
    history = (np.abs(rng.standard_normal(length)) * 10).astype(np.float32)
    if amax == 0.0:
        history[:] = 0.0
    expected = quantize_fp8.reference_scale_update(history, 2.0, amax, "float8_e5m2", margin=2)
    got = ge2.ops.fp8_scale_update.forward_numpy([history, np.array(2.0, np.float32), np.array(amax, np.float32)],
                                                 dtype="float8_e5m2", margin=2)
    for name, actual, want in zip(("history", "scale", "scale_inv"), got, expected):
        np.testing.assert_array_equal(actual, want, err_msg=f"{name} (length {length}, amax {amax})")


@pytest.mark.skipif(not ge2._native.is_built("_ops_quantize_fp8"), reason="_ops_quantize_fp8 not built")
def test_native_scale_update_checks_come_before_any_launch():
    native = ge2._native.load("_ops_quantize_fp8")
    fake = [256 * i for i in range(1, 7)]  # never dereferenced: the checks raise first
    with pytest.raises(ValueError, match="inputs, outputs: expected 3 addresses per history length"):
        native.scale_update(fake[:3], fake[3:5], [4], "float8_e4m3fn", 0, 0)
    with pytest.raises(ValueError, match=r"states\[1\]: the amax history needs >= 1 entry, got length 0"):
        native.scale_update(fake[:3] * 2, fake[3:] * 2, [4, 0], "float8_e4m3fn", 0, 0)
    with pytest.raises(ValueError, match=r"states\[0\]: history, scale, amax and the outputs: null device pointer"):
        native.scale_update([0, *fake[1:3]], fake[3:], [4], "float8_e5m2", 0, 0)
    with pytest.raises(ValueError, match="dtype: expected float8_e4m3fn or float8_e5m2, got bfloat16"):
        native.scale_update(fake[:3], fake[3:], [4], "bfloat16", 0, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("count", [64, 141])  # one full launch; three launches (64 + 64 + 13), a GPT-2 step's count
def test_scale_update_kernel_updates_every_tensor_of_several_launches(rng, count):
    lengths = [(1, 16, 1024, 5)[index % 4] for index in range(count)]
    states = _scale_states(rng, lengths)
    got = ge2.ops.fp8_scale_update.forward_numpy(states, dtype="float8_e4m3fn", margin=1)
    assert len(got) == 3 * count
    for tensor in range(count):
        expected = quantize_fp8.reference_scale_update(*states[3 * tensor:3 * tensor + 3], "float8_e4m3fn", margin=1)
        for name, actual, want in zip(("history", "scale", "scale_inv"), got[3 * tensor:3 * tensor + 3], expected):
            np.testing.assert_array_equal(actual, want, err_msg=f"tensor {tensor} of {count}: {name}")


def test_transposing_quantize_gives_both_layouts(rng):
    x = _input(rng, (5, 7), "float32")
    g = ge2.ir.Graph("quantize_transpose")
    y, y_t, amax, column_sum = g.quantize_fp8_transpose(g.input("x", x.shape, "float32"),
                                                        g.input("scale", (), "float32"), with_column_sum=True)
    assert (y.type.shape, y_t.type.shape, column_sum.type.shape) == ((5, 7), (7, 5), (7,))
    for value, name in ((y, "y"), (y_t, "y_t"), (amax, "amax"), (column_sum, "column_sum")):
        g.output(value, name)
    out = ge2.ExecutorV2(g).run({"x": x, "scale": np.array(16.0, np.float32)})
    expected_y, expected_amax = quantize_fp8.reference(x, np.float32(16.0))
    _same_bits_or_both_nan(out["y"], expected_y, "y")
    _same_bits_or_both_nan(out["y_t"], expected_y.T, "y_t")
    assert out["amax"] == expected_amax
    np.testing.assert_allclose(out["column_sum"], x.astype(np.float64).sum(axis=0), rtol=1e-6)
    without = ge2.ir.Graph("without_column_sum")
    assert without.quantize_fp8_transpose(without.input("x", (5, 7), "float32"),
                                          without.input("s", (), "float32"))[3].type.shape == (0,)
    with pytest.raises(ValueError, match="x: expected a 2-d array"):
        g.quantize_fp8_transpose(g.input("v", (4,), "float32"), g.input("s", (), "float32"))


def test_column_blocks_are_quantized_as_their_concatenation(rng):
    """x, x1 and x2 side by side (a QKV projection's gradients read in place of their concat): the graph's results
    (CPU reference backend) are those of the concatenated matrix."""
    parts = [_input(rng, (70, width), "float32") for width in (16, 24, 8)]
    g = ge2.ir.Graph("column_blocks")
    blocks = [g.input(name, part.shape, "float32") for name, part in zip(("x", "x1", "x2"), parts)]
    y, y_t, amax, column_sum = g.quantize_fp8_transpose(blocks[0], g.input("scale", (), "float32"), None, *blocks[1:],
                                                        dtype="float8_e5m2", with_column_sum=True)
    assert (y.type.shape, y_t.type.shape, column_sum.type.shape) == ((70, 48), (48, 70), (48,))
    for value, name in ((y, "y"), (y_t, "y_t"), (amax, "amax"), (column_sum, "column_sum")):
        g.output(value, name)
    out = ge2.ExecutorV2(g).run({"x": parts[0], "x1": parts[1], "x2": parts[2], "scale": np.array(8.0, np.float32)})
    x = np.concatenate(parts, axis=1)
    expected_y, expected_amax = quantize_fp8.reference(x, np.float32(8.0), "float8_e5m2")
    _same_bits_or_both_nan(out["y"], expected_y, "y")
    _same_bits_or_both_nan(out["y_t"], expected_y.T, "y_t")
    assert out["amax"] == expected_amax
    np.testing.assert_allclose(out["column_sum"], x.astype(np.float64).sum(axis=0), rtol=1e-6)


def test_column_blocks_bad_input_is_named():
    g = ge2.ir.Graph("bad_blocks")
    x, s = g.input("x", (4, 8), "float32"), g.input("s", (), "float32")
    with pytest.raises(ValueError, match="x2: given without x1"):
        g.quantize_fp8_transpose(x, s, None, None, g.input("b0", (4, 8), "float32"))
    with pytest.raises(ValueError, match=r"x1: expected a 2-d float32 array of 4 rows \(x's\)"):
        g.quantize_fp8_transpose(x, s, None, g.input("b1", (5, 8), "float32"))
    with pytest.raises(ValueError, match="x1: expected a 2-d float32 array"):
        g.quantize_fp8_transpose(x, s, None, g.input("b2", (4, 8), "bfloat16"))
    with pytest.raises(ValueError, match="x1: column blocks take no preact"):
        g.quantize_fp8_transpose(x, s, g.input("p", (4, 8), "float32"), g.input("b3", (4, 8), "float32"), act="gelu")


def test_native_column_block_checks_come_before_any_launch():
    native = ge2._native.load("_ops_quantize_fp8")
    fake = 256  # never dereferenced: the checks raise first
    with pytest.raises(ValueError, match="x2: given without x1"):
        native.quantize_transpose(fake, "bfloat16", fake, fake, fake, "float8_e4m3fn", fake, 0, 4, 8, 0, "none", 0,
                                  0, 0, fake, 4)
    with pytest.raises(ValueError, match=r"more_blocks\[0\].cols: expected 1 to 7"):
        native.quantize_transpose(fake, "bfloat16", fake, fake, fake, "float8_e4m3fn", fake, 0, 4, 8, 0, "none", 0,
                                  fake, 8)
    with pytest.raises(ValueError, match="preact: not with column blocks"):
        native.quantize_transpose(fake, "bfloat16", fake, fake, fake, "float8_e4m3fn", fake, 0, 4, 8, 0, "gelu", fake,
                                  fake, 4)


@pytest.mark.gpu
# GPT-2's QKV output gradients (4096 of its 8192 rows: the 64 x 64 kernel, runs of row tiles); two blocks; widths
# that are not multiples of 64 (the element-wise kernel)
@pytest.mark.parametrize("rows, widths", [(4096, (768, 768, 768)), (192, (64, 128)), (96, (40, 24, 16))])
def test_column_blocks_kernel_is_bit_exact(rng, rows, widths):
    rt = ge2.device.runtime()
    parts = [_input(rng, (rows, width), "bfloat16") for width in widths]
    x = np.concatenate(parts, axis=1)
    cols = x.shape[1]
    y, y_t = rt.DeviceArray.empty([rows, cols], "float8_e5m2"), rt.DeviceArray.empty([cols, rows], "float8_e5m2")
    amax, column_sum = rt.DeviceArray.empty([], "float32"), rt.DeviceArray.empty([cols], "bfloat16")
    blocks = [rt.DeviceArray.from_numpy(part) for part in parts]
    ge2.ops.quantize_fp8_transpose.forward(blocks[0], rt.DeviceArray.from_numpy(np.array(37.5, np.float32)), None,
                                           *blocks[1:], dtype="float8_e5m2", with_column_sum=True,
                                           out=_poisoned(y, y_t, amax, column_sum))
    expected_y, expected_amax = quantize_fp8.reference(x, np.float32(37.5), "float8_e5m2")
    what = f"blocks {widths} of {rows} rows"
    _same_bits_or_both_nan(y.numpy(), expected_y, what + " y")
    _same_bits_or_both_nan(y_t.numpy(), expected_y.T, what + " y_t")
    _same_bits_or_both_nan(amax.numpy(), expected_amax, what + " amax")
    _same_bits_or_both_nan(column_sum.numpy(), _column_sum_in_kernel_order(x), what + " column sums")


def _activated(x, preact, act):
    """act(x), or x * act'(preact), in float64 from the float32 values (an independent statement of the prologue)."""
    x64 = x.astype(np.float32).astype(np.float64)
    if preact is None:
        return activations.apply(act, x64)
    return x64 * activations.derivative(act, preact.astype(np.float32).astype(np.float64))


@pytest.mark.parametrize("act", ["gelu", "silu"])
@pytest.mark.parametrize("with_preact", [False, True])
def test_activation_prologue_quantizes_the_activated_values(rng, act, with_preact):
    x = _input(rng, (6, 9), "float32")
    preact = _input(rng, (6, 9), "float32") if with_preact else None
    g = ge2.ir.Graph("prologue")
    inputs = [g.input("x", x.shape, "float32"), g.input("scale", (), "float32")]
    if with_preact:
        inputs.append(g.input("preact", x.shape, "float32"))
    y, y_t, amax, column_sum = g.quantize_fp8_transpose(*inputs, act=act, dtype="float8_e5m2", with_column_sum=True)
    for value, name in ((y, "y"), (y_t, "y_t"), (amax, "amax"), (column_sum, "column_sum")):
        g.output(value, name)
    feeds = {"x": x, "scale": np.array(4.0, np.float32), **({"preact": preact} if with_preact else {})}
    out = ge2.ExecutorV2(g).run(feeds)
    value = _activated(x, preact, act)
    assert_within_one_fp8_ulp(out["y"], saturate_to_float8(value * 4.0, "float8_e5m2"), "float8_e5m2", "y")
    _same_bits_or_both_nan(out["y_t"], out["y"].T, "y_t")
    np.testing.assert_allclose(out["amax"], np.abs(value).max(), rtol=1e-6)
    np.testing.assert_allclose(out["column_sum"], value.sum(axis=0), rtol=1e-5, atol=1e-6)


def test_activation_prologue_bad_input_is_named():
    g = ge2.ir.Graph("bad_prologue")
    x, s = g.input("x", (4, 8), "bfloat16"), g.input("s", (), "float32")
    with pytest.raises(ValueError, match="preact: given with act='none'"):
        g.quantize_fp8_transpose(x, s, g.input("p", (4, 8), "bfloat16"))
    with pytest.raises(ValueError, match=r"preact: expected bfloat16\[4, 8\]"):
        g.quantize_fp8_transpose(x, s, g.input("q", (4, 8), "float32"), act="gelu")
    with pytest.raises(ValueError, match="act"):
        g.quantize_fp8_transpose(x, s, act="relu")


@pytest.mark.skipif(not ge2._native.is_built("_ops_quantize_fp8"), reason="_ops_quantize_fp8 not built")
def test_native_prologue_checks_come_before_any_launch():
    native = ge2._native.load("_ops_quantize_fp8")
    fake = 256  # never dereferenced: the checks raise first
    with pytest.raises(ValueError, match="act: leaky_relu"):
        native.quantize_transpose(fake, "bfloat16", fake, fake, fake, "float8_e4m3fn", fake, 0, 4, 4, 0, "leaky_relu")
    with pytest.raises(ValueError, match="preact: given with act none"):
        native.quantize_transpose(fake, "bfloat16", fake, fake, fake, "float8_e4m3fn", fake, 0, 4, 4, 0, "none", fake)


@pytest.mark.gpu
@pytest.mark.parametrize("source", ["float32", "bfloat16"])
@pytest.mark.parametrize("act, with_preact", [("gelu", False), ("gelu", True), ("silu", False), ("silu", True)])
# the element-wise kernel, the 64 x 64 one, and the 64 x 64 one with runs of several row tiles a block (63 row tiles:
# the last run of each column strip shorter); float32 with preact runs element-wise at every shape (its two tiles a
# stage would not fit the 64 x 64 kernel's ring twice)
@pytest.mark.parametrize("shape", [(33, 65), (128, 192), (4032, 768)])
def test_activation_prologue_kernel_matches_the_reference(rng, source, act, with_preact, shape):
    _check_activation_prologue(rng, source, act, with_preact, shape)


@pytest.mark.gpu
@pytest.mark.parametrize("with_preact", [False, True])
def test_gelu_prologues_over_runs_that_wrap_the_stage_ring(rng, with_preact):
    """FP8 training's GELU quantizes at a shape where a block's run of row tiles (3 on an H200: 1536 tiles over a wave
    of about 660 blocks) is longer than the ring of two stages the kernel with preact keeps in flight."""
    _check_activation_prologue(rng, "bfloat16", "gelu", with_preact, (8192, 768))


def _check_activation_prologue(rng, source, act, with_preact, shape):
    x = _input(rng, shape, source)
    preact = _input(rng, shape, source) if with_preact else None
    scale = np.array(16.0, np.float32)
    y, y_t, amax, column_sum = ge2.ops.quantize_fp8_transpose.forward_numpy(x, scale, preact, dtype="float8_e4m3fn",
                                                                            with_column_sum=True, act=act)
    value = _activated(x, preact, act)
    what = f"{source} {act} preact={with_preact} {shape}"
    # float32 math on the device (tanhf, expf) against float64: one FP8 ulp where a value sits on a rounding edge, or
    # the float32 evaluation's error where the activation's terms cancel (GELU's derivative near z = -5 is 1e-7 made
    # of two terms near 1e-5, PyTorch's float32 formula alike; H200: 3 FP8 ulps at dY = 1112)
    evaluation = _prologue_evaluation_bound(x, preact, act)
    assert_within_one_fp8_ulp(y, saturate_to_float8(value * 16.0, "float8_e4m3fn"), "float8_e4m3fn", what + " y",
                              accumulation_bound=16.0 * evaluation)
    _same_bits_or_both_nan(y_t, y.T, what + " y_t")
    np.testing.assert_allclose(amax, np.abs(value).max(), rtol=1e-6, atol=evaluation.max(), err_msg=what + " amax")
    bound = np.abs(value).sum(axis=0) * (shape[0] * 2.0 ** -24 + {"float32": 2.0 ** -22, "bfloat16": 2.0 ** -8}[source])
    gap = np.abs(column_sum.astype(np.float64) - value.sum(axis=0))
    assert (gap <= bound + evaluation.sum(axis=0) + 1e-6).all(), f"{what} column_sum: max gap {gap.max():.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["tanh", "sigmoid"])
@pytest.mark.parametrize("with_preact", [False, True])
def test_native_prologues_other_than_gelu_and_silu_run_element_wise_as_exact(rng, act, with_preact):
    """The 64 x 64 kernel is compiled for the prologues FP8 training uses (none, gelu, silu); another activation of the
    native API at a shape that kernel takes (multiples of 64, aligned) runs the element-wise kernel, as exact."""
    rt = ge2.device.runtime()
    stream = rt.Stream()
    rows, cols = 128, 192
    x = _input(rng, (rows, cols), "bfloat16")
    preact = _input(rng, (rows, cols), "bfloat16") if with_preact else None
    x_device, scale = rt.DeviceArray.from_numpy(x), rt.DeviceArray.from_numpy(np.array(16.0, np.float32))
    preact_device = rt.DeviceArray.from_numpy(preact) if with_preact else None
    y, y_t = rt.DeviceArray.empty([rows, cols], "float8_e4m3fn"), rt.DeviceArray.empty([cols, rows], "float8_e4m3fn")
    amax, column_sum = rt.DeviceArray.empty([], "float32"), rt.DeviceArray.empty([cols], "bfloat16")
    for output in (y, y_t, amax, column_sum):
        output.poison(stream.handle)
    ge2._native.load("_ops_quantize_fp8").quantize_transpose(
        x_device.ptr, "bfloat16", scale.ptr, y.ptr, y_t.ptr, "float8_e4m3fn", amax.ptr, column_sum.ptr, rows, cols,
        stream.handle, act, preact_device.ptr if with_preact else 0)
    stream.synchronize()
    value = _activated(x, preact, act)
    what = f"{act} preact={with_preact}"
    # tanh, sigmoid and their derivatives' terms are at most 1 (2 with preact): float32 evaluation error of a few ulps
    evaluation = 2.0 ** -20 * np.abs(x.astype(np.float64)) * 2.0
    assert_within_one_fp8_ulp(y.numpy(), saturate_to_float8(value * 16.0, "float8_e4m3fn"), "float8_e4m3fn",
                              what + " y", accumulation_bound=16.0 * evaluation)
    _same_bits_or_both_nan(y_t.numpy(), y.numpy().T, what + " y_t")
    np.testing.assert_allclose(amax.numpy(), np.abs(value).max(), rtol=1e-6, atol=evaluation.max(), err_msg=what)
    bound = np.abs(value).sum(axis=0) * (rows * 2.0 ** -24 + 2.0 ** -8)
    gap = np.abs(column_sum.numpy().astype(np.float64) - value.sum(axis=0))
    assert (gap <= bound + evaluation.sum(axis=0) + 1e-6).all(), f"{what} column_sum: max gap {gap.max():.3g}"


def _prologue_evaluation_bound(x, preact, act):
    """Elementwise bound on the float32 evaluation error of act(x) or x * act'(preact): 16 float32 ulps of the sum of
    the magnitudes of the formula's terms (activation.hpp's), times |x|."""
    x64 = np.abs(np.asarray(x).astype(np.float64))
    if preact is None:  # gelu: 0.5 x (1 + tanh(inner(x))), an error in tanh times |x| / 2; silu: x * sigmoid(x)
        magnitude = 1.0 + (x64 if act == "gelu" else 0.0)
    else:
        z = np.asarray(preact).astype(np.float64)
        if act == "gelu":
            t = np.tanh(0.7978845608028654 * (z + 0.044715 * z ** 3))
            magnitude = 0.5 * (1 + np.abs(t)) + 0.5 * np.abs(z) * (1 + t * t) * 0.7978845608028654 * (
                1 + 3 * 0.044715 * z * z)
        else:  # silu: s (1 + z (1 - s))
            with np.errstate(over="ignore"):
                s = 1 / (1 + np.exp(-z))
            magnitude = s * (1 + np.abs(z) * (1 + s))
    return 2.0 ** -20 * x64 * magnitude


@pytest.mark.gpu
@pytest.mark.parametrize("source", ["float32", "bfloat16"])
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
# (768, 2304), (128, 192), (8192, 768) and (8128, 768) take the 64 x 64 vectorized kernel (the last two more tiles
# than resident blocks: runs of several row tiles a block, 8128 = 127 row tiles making each strip's last run shorter);
# the others the element-wise one.
@pytest.mark.parametrize("shape", [(1, 1), (33, 65), (768, 2304), (128, 192), (8192, 768), (8128, 768), (8192, 16)])
def test_transposing_kernel_is_bit_exact(rng, source, dtype, shape):
    x = _input(rng, shape, source)
    scale = np.array(rng.choice([1.0, 37.5, 1000.0]), np.float32)
    y, y_t, amax, column_sum = ge2.ops.quantize_fp8_transpose.forward_numpy(x, scale, dtype=dtype,
                                                                            with_column_sum=True)
    expected_y, expected_amax = quantize_fp8.reference(x, scale, dtype)
    what = f"{source}->{dtype} shape {shape} scale {float(scale)}"
    _same_bits_or_both_nan(y, expected_y, what + " y")
    _same_bits_or_both_nan(y_t, expected_y.T, what + " y_t")
    assert amax == expected_amax, (what, amax, expected_amax)
    # the column sum (dbias) of the unquantized x: float32 sums (rows * 2^-24 relative to sum |x| at most), rounded
    # once to x's dtype (its half ulp)
    x64 = x.astype(np.float64)
    bound = np.abs(x64).sum(axis=0) * (shape[0] * 2.0 ** -24 + {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}[source])
    gap = np.abs(column_sum.astype(np.float64) - x64.sum(axis=0))
    assert (gap <= bound).all(), f"{what} column_sum: max gap {gap.max():.3g}, bound there {bound[gap.argmax()]:.3g}"
    y_alone, _, _, empty = ge2.ops.quantize_fp8_transpose.forward_numpy(x, scale, dtype=dtype)
    _same_bits_or_both_nan(y_alone, expected_y, what + " y without the column sum")
    assert empty.shape == (0,)


def _column_sum_in_kernel_order(x):
    """quantize_fp8_transpose's column sums with the kernels' float32 additions in their order, rounded once to x's
    dtype: a tile's thread adds its rows (p, p + rows per pass, ...) from 0, the tile adds its threads' partial rows
    in order, and the row tiles' partials are added in row order. 64 x 64 tiles with 32 rows a pass when both extents
    are multiples of 64 (the wide kernel, for aligned arrays), else 32 x 32 with 8."""
    rows, cols = x.shape
    tile, rows_per_pass = (64, 32) if rows % 64 == 0 and cols % 64 == 0 else (32, 8)
    values, total = x.astype(np.float32), np.zeros(cols, np.float32)
    for row0 in range(0, rows, tile):
        threads = np.zeros((rows_per_pass, cols), np.float32)
        for first in range(row0, min(row0 + tile, rows), rows_per_pass):
            chunk = values[first:min(first + rows_per_pass, row0 + tile, rows)]
            threads[:len(chunk)] += chunk
        tile_sum = np.zeros(cols, np.float32)
        for partial_row in threads:
            tile_sum += partial_row
        total += tile_sum
    return total.astype(x.dtype)


def _poisoned(*arrays):
    for array in arrays:
        array.poison()
    return arrays


@pytest.mark.gpu
@pytest.mark.parametrize("source", ["float32", "bfloat16"])
# the element-wise kernel, the 64 x 64 one, and the 64 x 64 one with runs of several row tiles a block (the last of
# each column strip shorter in (8128, 768))
@pytest.mark.parametrize("shape", [(96, 80), (256, 192), (8192, 768), (8128, 768)])
def test_repeated_calls_write_each_calls_amax_and_column_sum_without_zeroing(rng, source, shape):
    """The kernels write the amax and the column sums (the last block finishes them): called again on the same
    poisoned outputs, with a smaller maximum, with all zeros, with a NaN, each call gives its own results, the column
    sums bit for bit the kernels' float32 additions in their order."""
    rt = ge2.device.runtime()
    scale = rt.DeviceArray.from_numpy(np.array(2.0, np.float32))
    rows, cols = shape
    y, y_t = rt.DeviceArray.empty([rows, cols], "float8_e5m2"), rt.DeviceArray.empty([cols, rows], "float8_e5m2")
    amax, column_sum = rt.DeviceArray.empty([], "float32"), rt.DeviceArray.empty([cols], source)
    y_flat, amax_flat = rt.DeviceArray.empty([rows * cols], "float8_e5m2"), rt.DeviceArray.empty([], "float32")
    large = _input(rng, shape, source)
    with_nan = _input(rng, shape, source)
    with_nan[rows // 2, cols - 1] = np.nan
    inputs = {"large": large, "smaller": (large / 64).astype(large.dtype), "zeros": np.zeros(shape, large.dtype),
              "fresh": _input(rng, shape, source), "NaN": with_nan}
    for what, x in inputs.items():
        ge2.ops.quantize_fp8_transpose.forward(rt.DeviceArray.from_numpy(x), scale, dtype="float8_e5m2",
                                               with_column_sum=True, out=(y, y_t, *_poisoned(amax, column_sum)))
        quantize_fp8.forward(rt.DeviceArray.from_numpy(x.reshape(-1)), scale, dtype="float8_e5m2",
                             out=(y_flat, *_poisoned(amax_flat)))
        expected_amax = quantize_fp8.reference(x, np.float32(2.0), "float8_e5m2")[1]
        for name, got in (("quantize_fp8_transpose", amax.numpy()), ("quantize_fp8", amax_flat.numpy())):
            _same_bits_or_both_nan(got, expected_amax, f"{what} {source} {shape}: {name}'s amax")
        _same_bits_or_both_nan(column_sum.numpy(), _column_sum_in_kernel_order(x), f"{what} {source} {shape} sums")


@pytest.mark.gpu
# runs of row tiles longer than the 64 x 64 kernel's ring of stages (4 for 16-bit x, 2 for float32) on an H200:
# (12288, 1024) is 3072 tiles, runs of 4 (without the column sum) and 5 (with it: fewer blocks resident) tiles, the
# last run of each strip 2; (8192, 768) float32, runs of 2 and 3
@pytest.mark.parametrize("source, shape, dtype", [("bfloat16", (12288, 1024), "float8_e5m2"),
                                                  ("float32", (8192, 768), "float8_e4m3fn")])
def test_runs_that_wrap_the_stage_ring_are_bit_exact(rng, source, shape, dtype):
    rt = ge2.device.runtime()
    rows, cols = shape
    x = _input(rng, shape, source)
    scale = np.float32(rng.choice([1.0, 37.5, 1000.0]))
    expected_y, expected_amax = quantize_fp8.reference(x, scale, dtype)
    x_device, scale_device = rt.DeviceArray.from_numpy(x), rt.DeviceArray.from_numpy(np.array(scale))
    for with_column_sum in (False, True):  # two kernels: without and with the column sum
        y, y_t = rt.DeviceArray.empty([rows, cols], dtype), rt.DeviceArray.empty([cols, rows], dtype)
        amax = rt.DeviceArray.empty([], "float32")
        column_sum = rt.DeviceArray.empty([cols if with_column_sum else 0], source)
        _poisoned(y, y_t, amax, *([column_sum] if with_column_sum else []))  # (an empty array has no address)
        ge2.ops.quantize_fp8_transpose.forward(x_device, scale_device, dtype=dtype, with_column_sum=with_column_sum,
                                               out=(y, y_t, amax, column_sum))
        what = f"{source}->{dtype} {shape} column sum {with_column_sum}"
        _same_bits_or_both_nan(y.numpy(), expected_y, what + " y")
        _same_bits_or_both_nan(y_t.numpy(), expected_y.T, what + " y_t")
        _same_bits_or_both_nan(amax.numpy(), expected_amax, what + " amax")
        if with_column_sum:
            _same_bits_or_both_nan(column_sum.numpy(), _column_sum_in_kernel_order(x), what + " column sums")


@pytest.mark.gpu
def test_transpose_not_16_byte_aligned_takes_the_element_wise_kernel_as_exact(rng):
    """The 64 x 64 kernel stores y_t in 16-byte vectors: a y_t 8 bytes off (a view into a larger buffer) takes the
    element-wise kernel, with the same values and nothing written outside the view."""
    rt = ge2.device.runtime()
    rows, cols = 128, 192
    x = _input(rng, (rows, cols), "bfloat16")
    scale = rt.DeviceArray.from_numpy(np.array(8.0, np.float32))
    y, amax = rt.DeviceArray.empty([rows, cols], "float8_e4m3fn"), rt.DeviceArray.empty([], "float32")
    buffer = rt.DeviceArray.empty([rows * cols + 16], "float8_e4m3fn")
    _poisoned(y, amax, buffer)
    y_t = buffer.view(8, [cols, rows], "float8_e4m3fn")
    no_sum = rt.DeviceArray.empty([0], "bfloat16")
    ge2.ops.quantize_fp8_transpose.forward(rt.DeviceArray.from_numpy(x), scale, out=(y, y_t, amax, no_sum))
    expected_y, expected_amax = quantize_fp8.reference(x, np.float32(8.0))
    _same_bits_or_both_nan(y.numpy(), expected_y, "y")
    _same_bits_or_both_nan(y_t.numpy(), expected_y.T, "y_t")
    assert amax.numpy() == expected_amax
    untouched = buffer.numpy().view(np.uint8)
    assert (untouched[:8] == 0xFF).all() and (untouched[8 + rows * cols:] == 0xFF).all(), "written outside y_t"


@pytest.mark.gpu
def test_captured_quantizes_are_one_kernel_node_each_and_replay_without_zeroing(rng):
    """A CUDA graph of quantize_fp8 and quantize_fp8_transpose (with its column sum) holds their two kernels and
    nothing else (no memset of the amax, no column-sum kernel), and replayed on new inputs, poisoned outputs, with
    maxima that shrink from one replay to the next, each replay gives its own amaxes and sums."""
    rt = ge2.device.runtime()
    stream = rt.Stream()
    shape, flat_size = (512, 320), 4096 + 5  # the 64 x 64 kernel; the vectorized kernel and its tail
    x, x_flat = rt.DeviceArray.empty(list(shape), "bfloat16"), rt.DeviceArray.empty([flat_size], "float32")
    scale = rt.DeviceArray.from_numpy(np.array(0.5, np.float32))
    y = rt.DeviceArray.empty(list(shape), "float8_e4m3fn")
    y_t = rt.DeviceArray.empty(list(shape[::-1]), "float8_e4m3fn")
    amax, column_sum = rt.DeviceArray.empty([], "float32"), rt.DeviceArray.empty([shape[1]], "bfloat16")
    y_flat, amax_flat = rt.DeviceArray.empty([flat_size], "float8_e4m3fn"), rt.DeviceArray.empty([], "float32")

    def run():
        ge2.ops.quantize_fp8_transpose.forward(x, scale, with_column_sum=True, out=(y, y_t, amax, column_sum),
                                               stream=stream)
        quantize_fp8.forward(x_flat, scale, out=(y_flat, amax_flat), stream=stream)

    graph = captured_graph(run, stream)
    assert graph.node_types == {"kernel": 2}, graph.node_types
    for replay, magnitude in enumerate([1.0, 2.0 ** -6, 2.0 ** -12]):
        host = (_input(rng, shape, "bfloat16") * magnitude).astype(ml_dtypes.bfloat16)
        host_flat = (_input(rng, (flat_size,), "float32") * magnitude).astype(np.float32)
        x.copy_from_numpy(host, stream.handle)
        x_flat.copy_from_numpy(host_flat, stream.handle)
        for output in (y, y_t, amax, column_sum, y_flat, amax_flat):
            output.poison(stream.handle)
        graph.replay(stream.handle)
        stream.synchronize()
        expected_y, expected_amax = quantize_fp8.reference(host, np.float32(0.5))
        _same_bits_or_both_nan(y.numpy(), expected_y, f"replay {replay}: y")
        _same_bits_or_both_nan(y_t.numpy(), expected_y.T, f"replay {replay}: y_t")
        assert amax.numpy() == expected_amax, (replay, amax.numpy(), expected_amax)
        _same_bits_or_both_nan(column_sum.numpy(), _column_sum_in_kernel_order(host), f"replay {replay}: sums")
        expected_y_flat, expected_amax_flat = quantize_fp8.reference(host_flat, np.float32(0.5))
        _same_bits_or_both_nan(y_flat.numpy(), expected_y_flat, f"replay {replay}: flat y")
        assert amax_flat.numpy() == expected_amax_flat, (replay, amax_flat.numpy(), expected_amax_flat)


def test_column_sum_emulation_is_the_sum_to_float32_rounding(rng):
    """The kernel-order emulation above is a column sum (a test helper that could drift into anything else would
    make the GPU checks meaningless): within float32's accumulated rounding of float64's, both tilings."""
    for shape in ((96, 80), (256, 192), (1, 3)):
        x = _input(rng, shape, "float32")
        x64 = x.astype(np.float64)
        bound = np.abs(x64).sum(axis=0) * shape[0] * 2.0 ** -23
        assert (np.abs(_column_sum_in_kernel_order(x).astype(np.float64) - x64.sum(axis=0)) <= bound).all(), shape


# --- quantize_fp8_transpose_multi: several tensors' cast-transposes in one launch -------------------------------
def test_multi_quantize_is_each_tensors_quantize_transpose(rng):
    """The CPU graph (reference backend): each tensor's (y, y_t, amax) is quantize_fp8_transpose's of it alone."""
    arrays = [_input(rng, shape, "float32") for shape in ((5, 7), (64, 128), (0, 3), (1, 1))]
    scales = [np.array(s, np.float32) for s in (16.0, 0.5, 1.0, 448.0)]
    g = ge2.ir.Graph("multi")
    values = []
    for index, (x, scale) in enumerate(zip(arrays, scales)):
        values += [g.input(f"x{index}", x.shape, "float32"), g.input(f"s{index}", scale.shape, "float32")]
    outputs = g.quantize_fp8_transpose_multi(*values, dtype="float8_e5m2")
    assert len(outputs) == 12 and [v.type.shape for v in outputs[:3]] == [(5, 7), (7, 5), ()]
    assert outputs[0].type.dtype == "float8_e5m2"
    for index, value in enumerate(outputs):
        g.output(value, f"out{index}")
    got = ge2.ExecutorV2(g, device="cpu").run({**{f"x{i}": x for i, x in enumerate(arrays)},
                                               **{f"s{i}": s for i, s in enumerate(scales)}})
    for index, (x, scale) in enumerate(zip(arrays, scales)):
        expected_y, expected_amax = quantize_fp8.reference(x, scale, "float8_e5m2")
        _same_bits_or_both_nan(got[f"out{3 * index}"], expected_y, f"tensor {index} y")
        _same_bits_or_both_nan(got[f"out{3 * index + 1}"], expected_y.T, f"tensor {index} y_t")
        _same_bits_or_both_nan(got[f"out{3 * index + 2}"], expected_amax, f"tensor {index} amax")


def test_multi_quantize_bad_input_is_named():
    g = ge2.ir.Graph("bad_multi")
    x, s = g.input("x", (4, 8), "bfloat16"), g.input("s", (), "float32")
    with pytest.raises(ValueError, match=r"tensors: expected \(x, scale\) for each tensor, got 3 inputs"):
        g.quantize_fp8_transpose_multi(x, s, x)
    with pytest.raises(TypeError, match=r"tensors\[2\] \(tensor 1's x\): expected a 2-d array"):
        g.quantize_fp8_transpose_multi(x, s, g.input("v", (4,), "bfloat16"), s)
    with pytest.raises(TypeError, match=r"tensors\[2\] \(tensor 1's x\): expected bfloat16 \(tensor 0's dtype"):
        g.quantize_fp8_transpose_multi(x, s, g.input("f", (4, 8), "float32"), s)
    with pytest.raises(TypeError, match=r"tensors\[3\] \(tensor 1's scale\): expected a float32 scalar"):
        g.quantize_fp8_transpose_multi(x, s, x, g.input("h", (), "float16"))
    with pytest.raises(ValueError, match=r"tensors\[1\] \(tensor 0's scale\): expected one element"):
        g.quantize_fp8_transpose_multi(x, g.input("s2", (2,), "float32"))
    with pytest.raises(ValueError, match="dtype"):
        g.quantize_fp8_transpose_multi(x, s, dtype="bfloat16")


@pytest.mark.skipif(not ge2._native.is_built("_ops_quantize_fp8"), reason="_ops_quantize_fp8 not built")
def test_native_multi_quantize_checks_come_before_any_launch():
    native = ge2._native.load("_ops_quantize_fp8")
    fake = [256 * i for i in range(1, 6)]  # never dereferenced: the checks raise first
    with pytest.raises(ValueError, match="inputs, outputs, rows, cols: expected 2 input and 3 output addresses"):
        native.quantize_transpose_multi(fake[:2], fake[2:4], [4], [8], "bfloat16", "float8_e4m3fn", 0)
    with pytest.raises(ValueError, match=r"tensors\[1\]: scale: null device pointer"):
        native.quantize_transpose_multi(fake[:2] + [fake[0], 0], fake[2:] * 2, [4, 4], [8, 8], "bfloat16",
                                        "float8_e4m3fn", 0)
    with pytest.raises(ValueError, match=r"tensors\[0\]: rows, cols: expected 0 to 2\^31 - 1, got -1, 8"):
        native.quantize_transpose_multi(fake[:2], fake[2:], [-1], [8], "bfloat16", "float8_e4m3fn", 0)
    with pytest.raises(ValueError, match=r"tensors\[0\]: x, y, y_t: null device pointer"):
        native.quantize_transpose_multi([0, fake[1]], fake[2:], [4], [8], "bfloat16", "float8_e4m3fn", 0)
    with pytest.raises(ValueError, match=r"tensors\[0\]: dtype: expected float8_e4m3fn or float8_e5m2"):
        native.quantize_transpose_multi(fake[:2], fake[2:], [4], [8], "bfloat16", "bfloat16", 0)


# GPT-2 124M's weight shapes (whole 64 x 64 tiles: 8-element vectors), with shapes that are not multiples of 64 and
# an empty tensor between them (element-wise tiles, partial at the edges; an amax of nothing)
MULTI_SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072), (33, 65), (0, 64), (1, 1), (128, 200), (64, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("source", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_multi_quantize_kernel_is_bit_exact_with_one_quantize_per_tensor(rng, source, dtype):
    rt = ge2.device.runtime()
    arrays = [_input(rng, shape, source) for shape in MULTI_SHAPES]
    arrays[3][5, 7] = np.nan  # one tensor's NaN shows in its amax alone
    scales = [np.array(rng.choice([1.0, 37.5, 1000.0, 0.01]), np.float32) for _ in arrays]
    inputs, outputs = [], []
    for x, scale in zip(arrays, scales):
        inputs += [rt.DeviceArray.from_numpy(x), rt.DeviceArray.from_numpy(scale)]
        rows, cols = x.shape
        outputs += [rt.DeviceArray.empty([rows, cols], dtype), rt.DeviceArray.empty([cols, rows], dtype),
                    rt.DeviceArray.empty([], "float32")]
    for _ in range(2):  # twice on the same poisoned outputs: each call's own amaxes (the counters were reset)
        ge2.ops.quantize_fp8_transpose_multi.forward(inputs, dtype=dtype, out=_poisoned(*outputs))
        for index, (x, scale) in enumerate(zip(arrays, scales)):
            what = f"{source}->{dtype} tensor {index} {x.shape} scale {float(scale)}"
            y, y_t, amax = (outputs[3 * index + i].numpy() for i in range(3))
            expected_y, expected_amax = quantize_fp8.reference(x, scale, dtype)
            _same_bits_or_both_nan(y, expected_y, what + " y")
            _same_bits_or_both_nan(y_t, expected_y.T, what + " y_t")
            _same_bits_or_both_nan(amax, expected_amax, what + " amax")
            if x.size:  # the same bits as quantize_fp8_transpose of the tensor alone
                alone = ge2.ops.quantize_fp8_transpose.forward_numpy(x, scale, dtype=dtype)
                _same_bits_or_both_nan(y, alone[0], what + " y vs quantize_fp8_transpose")
                _same_bits_or_both_nan(amax, alone[2], what + " amax vs quantize_fp8_transpose")


@pytest.mark.gpu
@pytest.mark.parametrize("count", [64, 141])  # one full launch; three launches (64 + 64 + 13)
def test_multi_quantize_kernel_over_several_launches(rng, count):
    shapes = [((64, 128), (33, 17), (0, 4), (128, 64))[index % 4] for index in range(count)]
    arrays = [_input(rng, shape, "bfloat16") for shape in shapes]
    scales = [np.array(2.0 ** (index % 7 - 3), np.float32) for index in range(count)]
    _check_multi_quantize(arrays, scales, "float8_e4m3fn")


def _check_multi_quantize(arrays, scales, dtype):
    """quantize_fp8_transpose_multi of (arrays, scales) on the GPU: each tensor's (y, y_t, amax) its reference's."""
    got = ge2.ops.quantize_fp8_transpose_multi.forward_numpy(
        [array for pair in zip(arrays, scales) for array in pair], dtype=dtype)
    assert len(got) == 3 * len(arrays)
    for index, (x, scale) in enumerate(zip(arrays, scales)):
        expected_y, expected_amax = quantize_fp8.reference(x, scale, dtype)
        what = f"tensor {index} of {len(arrays)} {x.shape}"
        _same_bits_or_both_nan(got[3 * index], expected_y, what + " y")
        _same_bits_or_both_nan(got[3 * index + 1], expected_y.T, what + " y_t")
        _same_bits_or_both_nan(got[3 * index + 2], expected_amax, what + " amax")


@pytest.mark.gpu
def test_multi_quantize_block_runs_cross_tensors(rng):
    """Enough tiles for runs of several consecutive tiles a block (2,664 tiles: runs of 3-4 on an H200's wave of
    resident blocks), tensors of 110 tiles between one-tile ones, so runs start and end inside tensors and span a
    tensor's end: every tensor's amax is its own (each scaled differently, one with a NaN, one all zeros)."""
    shapes = [shape for _ in range(24) for shape in ((640, 704), (33, 17))]
    arrays = [(_input(rng, shape, "bfloat16") * (index + 1)).astype(ml_dtypes.bfloat16)
              for index, shape in enumerate(shapes)]
    arrays[5][:] = 0
    arrays[8][100, 3] = np.nan
    scales = [np.array(2.0 ** (index % 9 - 6), np.float32) for index in range(len(shapes))]
    _check_multi_quantize(arrays, scales, "float8_e5m2")


@pytest.mark.gpu
def test_multi_quantize_of_misaligned_views_runs_element_wise(rng):
    """x one element past 16-byte alignment (a view into a larger array): the tensor takes the element-wise tile
    path, with the same bits."""
    rt = ge2.device.runtime()
    x = _input(rng, (64 * 64 + 1,), "bfloat16")
    scale = np.array(8.0, np.float32)
    base = rt.DeviceArray.from_numpy(x)
    view = base.view(2, [64, 64], "bfloat16")  # 16-bit elements at a 2-byte offset
    y, y_t, amax = (rt.DeviceArray.empty([64, 64], "float8_e4m3fn"), rt.DeviceArray.empty([64, 64], "float8_e4m3fn"),
                    rt.DeviceArray.empty([], "float32"))
    ge2.ops.quantize_fp8_transpose_multi.forward([view, rt.DeviceArray.from_numpy(scale)], out=_poisoned(y, y_t, amax))
    expected_y, expected_amax = quantize_fp8.reference(x[1:].reshape(64, 64), scale)
    _same_bits_or_both_nan(y.numpy(), expected_y, "misaligned y")
    _same_bits_or_both_nan(y_t.numpy(), expected_y.T, "misaligned y_t")
    _same_bits_or_both_nan(amax.numpy(), expected_amax, "misaligned amax")


# --- quantize_fp8_add_transpose: a float32 sum, its rounding quantized in the same pass ------------------------
def _add_cast_quantize(x, addend, scale, dtype, value_dtype):
    """What the fused op replaces: a float32 add, a cast to value_dtype, a quantize_fp8_transpose."""
    total = x.astype(np.float32) + addend.astype(np.float32)
    value = total.astype(SOURCES[value_dtype])
    y, amax = quantize_fp8.reference(value, scale, dtype)
    return total, value, y, amax


def test_add_transpose_is_the_add_the_cast_and_the_quantize(rng):
    """The graph's results (CPU reference backend): the float32 sum, and the quantize of its rounding to value_dtype,
    whose column sum is the rounded values' sum."""
    x, addend = _input(rng, (40, 24), "float32"), _input(rng, (40, 24), "float32")
    g = ge2.ir.Graph("add_transpose")
    outputs = g.quantize_fp8_add_transpose(g.input("x", x.shape, "float32"), g.input("a", x.shape, "float32"),
                                           g.input("scale", (), "float32"), dtype="float8_e5m2", with_column_sum=True)
    assert [v.type.dtype for v in outputs] == ["float32", "float8_e5m2", "float8_e5m2", "float32", "bfloat16"]
    for value, name in zip(outputs, ("sum", "y", "y_t", "amax", "column_sum")):
        g.output(value, name)
    out = ge2.ExecutorV2(g).run({"x": x, "a": addend, "scale": np.array(16.0, np.float32)})
    total, value, expected_y, expected_amax = _add_cast_quantize(x, addend, np.float32(16.0), "float8_e5m2",
                                                                 "bfloat16")
    np.testing.assert_array_equal(out["sum"], total)
    _same_bits_or_both_nan(out["y"], expected_y, "y")
    _same_bits_or_both_nan(out["y_t"], expected_y.T, "y_t")
    assert out["amax"] == expected_amax
    np.testing.assert_allclose(out["column_sum"].astype(np.float64), value.astype(np.float64).sum(axis=0),
                               rtol=1e-2, atol=1e-2 * np.abs(value.astype(np.float64)).sum(axis=0).max())


def test_add_transpose_bad_input_is_named():
    g = ge2.ir.Graph("bad_add_transpose")
    x, s = g.input("x", (64, 64), "float32"), g.input("s", (), "float32")
    with pytest.raises(TypeError, match="x: expected a 2-d float32 array"):
        g.quantize_fp8_add_transpose(g.input("h", (64, 64), "bfloat16"), x, s)
    with pytest.raises(ValueError, match="addend: expected"):
        g.quantize_fp8_add_transpose(x, g.input("a", (64, 32), "float32"), s)
    with pytest.raises(ValueError, match="value_dtype"):
        g.quantize_fp8_add_transpose(x, x, s, value_dtype="int32")


@pytest.mark.skipif(not ge2._native.is_built("_ops_quantize_fp8"), reason="_ops_quantize_fp8 not built")
def test_native_add_transpose_checks_come_before_any_launch():
    native = ge2._native.load("_ops_quantize_fp8")
    fake = [256 * (i + 1) for i in range(9)]
    with pytest.raises(ValueError, match="x, addend, sum, y, y_t: null device pointer"):
        native.quantize_add_transpose(fake[0], 0, fake[2], "bfloat16", fake[3], fake[4], fake[5], "float8_e5m2",
                                      fake[6], 0, 64, 64, 0)
    with pytest.raises(ValueError, match="rows, cols: must be >= 0"):
        native.quantize_add_transpose(*fake[:3], "bfloat16", *fake[3:6], "float8_e5m2", fake[6], 0, -1, 64, 0)
    with pytest.raises(ValueError, match="value_dtype: expected float32, float16 or bfloat16, got int32"):
        native.quantize_add_transpose(*fake[:3], "int32", *fake[3:6], "float8_e5m2", fake[6], 0, 64, 64, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("value_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
# (8192, 768) and (8128, 768) take the 64 x 64 kernel (runs of several row tiles; 8128: each strip's last run
# shorter), (33, 65) and (64, 200) the element-wise one
@pytest.mark.parametrize("shape", [(8192, 768), (8128, 768), (128, 192), (33, 65), (64, 200)])
def test_add_transpose_kernel_is_bit_exact(rng, value_dtype, dtype, shape):
    """The sum bit for bit the float32 add, y, y_t and the amax those of its rounding, and the column sums bit for bit
    the kernels' float32 additions of the rounded values in their order; with outputs poisoned first."""
    rt = ge2.device.runtime()
    x, addend = _input(rng, shape, "float32"), _input(rng, shape, "float32")
    x.reshape(-1)[::97] = -addend.reshape(-1)[::97]  # exact zeros among the sums
    scale = np.float32(rng.choice([1.0, 37.5, 1000.0]))
    rows, cols = shape
    outs = (rt.DeviceArray.empty([rows, cols], "float32"), rt.DeviceArray.empty([rows, cols], dtype),
            rt.DeviceArray.empty([cols, rows], dtype), rt.DeviceArray.empty([], "float32"),
            rt.DeviceArray.empty([cols], value_dtype))
    ge2.ops.quantize_fp8_add_transpose.forward(rt.DeviceArray.from_numpy(x), rt.DeviceArray.from_numpy(addend),
                                               rt.DeviceArray.from_numpy(np.array(scale)), dtype=dtype,
                                               value_dtype=value_dtype, with_column_sum=True, out=_poisoned(*outs))
    total, value, expected_y, expected_amax = _add_cast_quantize(x, addend, scale, dtype, value_dtype)
    what = f"{value_dtype}->{dtype} shape {shape} scale {float(scale)}"
    _same_bits_or_both_nan(outs[0].numpy(), total, what + " sum")
    _same_bits_or_both_nan(outs[1].numpy(), expected_y, what + " y")
    _same_bits_or_both_nan(outs[2].numpy(), expected_y.T, what + " y_t")
    _same_bits_or_both_nan(outs[3].numpy(), expected_amax, what + " amax")
    _same_bits_or_both_nan(outs[4].numpy(), _column_sum_in_kernel_order(value), what + " column_sum")
