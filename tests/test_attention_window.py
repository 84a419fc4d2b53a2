"""attention's sliding window (``window=(left, right)``, bottom-right aligned) and logit soft cap (``softcap``):
the float64 references against a loop over the definition and finite differences, rows with no visible key,
validation and the candidates' declines (CPU); every kernel x window x soft cap x dtype x head_dim against the
float64 reference, forward and backward, with poisoned outputs (GPU)."""
from __future__ import annotations

import contextlib
import math
import re

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import autograd
from graph_executor_v2.ir import Graph, TensorType
from graph_executor_v2.ops import attention
from graph_executor_v2.testing import assert_close, random_array
from attention_checks import reference_backward_from_stored_y
from row_norm_checks import numeric_gradient

KERNELS = ("cudnn", "flash", "rowwise", "unfused")
# (left, right): none, left only, right only, both, a band of one key, a band that excludes the diagonal's key
WINDOWS = ((-1, -1), (3, -1), (-1, 2), (2, 1), (0, 0), (4, 0))


def _looped_reference(q, k, v, causal, scale, window, softcap):
    """The definition one (batch, head, row) at a time, bhsd layout, no grouped heads: row i sees key j when
    j <= i (causal) and i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right (-1: unbounded); scores are
    softcap * tanh(s / softcap). A row that sees no key gives y = 0 and lse = +inf."""
    batch, heads, seq_q, _ = q.shape
    seq_k = k.shape[2]
    left, right = window
    y, lse = np.zeros(q.shape), np.zeros((batch, heads, seq_q))
    for b in range(batch):
        for h in range(heads):
            for i in range(seq_q):
                diagonal = i + seq_k - seq_q
                keys = [j for j in range(seq_k) if (not causal or j <= i) and (left < 0 or j >= diagonal - left)
                        and (right < 0 or j <= diagonal + right)]
                if not keys:
                    lse[b, h, i] = math.inf
                    continue
                scores = [scale * float(q[b, h, i].astype(np.float64) @ k[b, h, j].astype(np.float64))
                          for j in keys]
                if softcap:
                    scores = [softcap * math.tanh(s / softcap) for s in scores]
                lse[b, h, i] = math.log(sum(math.exp(s) for s in scores))
                y[b, h, i] = sum(math.exp(s - lse[b, h, i]) * v[b, h, j].astype(np.float64)
                                 for s, j in zip(scores, keys))
    return y, lse


def _problem(rng, batch, heads_q, heads_kv, seq_q, seq_k, head_dim, dtype):
    """q, k, v and dy in bhsd: normal values rounded to ``dtype``."""
    return [random_array(rng, (batch, heads, seq, head_dim), dtype)
            for heads, seq in ((heads_q, seq_q), (heads_kv, seq_k), (heads_kv, seq_k), (heads_q, seq_q))]


# ---------------------------------------------------------------------------------------------------------------
# CPU: reference math
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("softcap", (0.0, 1.5))
@pytest.mark.parametrize("seq_q,seq_k", ((1, 1), (5, 5), (3, 7), (7, 3)))
def test_reference_matches_the_definition(rng, window, causal, softcap, seq_q, seq_k):
    q, k, v, _ = _problem(rng, 2, 2, 2, seq_q, seq_k, 6, "float32")
    y, lse = attention.reference(q, k, v, causal=causal, scale=0.9, window=window, softcap=softcap)
    expected_y, expected_lse = _looped_reference(q, k, v, causal, 0.9, window, softcap)
    np.testing.assert_allclose(y, expected_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)


def test_window_is_bottom_right_aligned_and_causal_is_right_zero(rng):
    # seq_q < seq_k: the last query row sits over the last key; window (0, 0) shows row i key i + seq_k - seq_q alone.
    q, k, v, _ = _problem(rng, 1, 1, 1, 3, 5, 4, "float32")
    y, _ = attention.reference(q, k, v, window=(0, 0))
    np.testing.assert_allclose(y[0, 0], v[0, 0, 2:], rtol=1e-12)
    # seq_q == seq_k: causal=True is right = 0, and causal with a window is the window with right = 0.
    q, k, v, _ = _problem(rng, 1, 2, 1, 6, 6, 4, "float32")
    for left in (-1, 0, 2):
        with_causal = attention.reference(q, k, v, causal=True, window=(left, -1))
        right_zero = attention.reference(q, k, v, window=(left, 0))
        for got, want in zip(with_causal, right_zero):
            np.testing.assert_array_equal(got, want)
    begin, end = attention.visible_keys(4, 6, causal=True, window=(1, 1))
    # row i: keys [i + 2 - 1, i + 2 + 1] (bottom-right window) and j <= i (top-left causal): both apply
    np.testing.assert_array_equal(begin, [1, 2, 3, 4])
    np.testing.assert_array_equal(end, [1, 2, 3, 4])


def test_rows_with_no_visible_key_give_zero_and_infinite_lse(rng):
    # seq_q > seq_k with right = 0: rows i < seq_q - seq_k see no key.
    q, k, v, dy = _problem(rng, 1, 2, 2, 6, 3, 4, "float32")
    y, lse = attention.reference(q, k, v, window=(-1, 0))
    assert (y[:, :, :3] == 0).all() and np.isposinf(lse[:, :, :3]).all()
    assert np.isfinite(y).all() and np.isfinite(lse[:, :, 3:]).all()
    dq, dk, dv = attention.reference_backward(dy, q, k, v, window=(-1, 0))
    assert (dq[:, :, :3] == 0).all() and all(np.isfinite(grad).all() for grad in (dq, dk, dv))


def test_softcap_bounds_the_scores_and_a_large_cap_changes_nothing(rng):
    q, k, v, _ = _problem(rng, 1, 1, 1, 5, 5, 4, "float32")
    q = q * 40  # scores far beyond the cap
    _, lse = attention.reference(q, k, v, softcap=2.0)
    assert (lse <= 2.0 + math.log(5) + 1e-12).all()
    plain, capped = attention.reference(q / 40, k, v), attention.reference(q / 40, k, v, softcap=1e6)
    for got, want in zip(capped, plain):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("layout", attention.LAYOUTS)
@pytest.mark.parametrize("causal,window,softcap", ((False, (1, 1), 0.0), (False, (-1, -1), 1.2), (True, (1, -1), 0.7),
                                                   (False, (2, 0), 0.9), (False, (-1, 0), 1.1)))
@pytest.mark.parametrize("heads_kv,seq_q,seq_k", ((2, 4, 4), (1, 3, 5), (2, 5, 3)))
def test_reference_backward_matches_finite_differences(rng, layout, causal, window, softcap, heads_kv, seq_q, seq_k):
    arrays = [x.astype(np.float64) for x in _problem(rng, 1, 2, heads_kv, seq_q, seq_k, 3, "float32")]
    q, k, v, dy = (x if layout == "bhsd" else np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in arrays)
    attrs = dict(causal=causal, scale=0.8, layout=layout, window=window, softcap=softcap)
    grads = attention.reference_backward(dy, q, k, v, **attrs)

    def loss():
        return float((attention.reference(q, k, v, **attrs)[0] * dy).sum())

    for name, array, grad in zip("qkv", (q, k, v), grads):
        np.testing.assert_allclose(grad, numeric_gradient(loss, array), rtol=1e-6, atol=1e-8, err_msg=name)


def test_flops_count_the_visible_scores():
    q, kv = TensorType((2, 3, 6, 8), "float16"), TensorType((2, 3, 9, 8), "float16")
    opdef = ge2.ops.OPS["attention"]
    attrs = opdef.validate_attrs({"window": (1, 0)}, "node")
    begin, end = attention.visible_keys(6, 9, window=(1, 0))
    assert (end - begin).sum() == 12  # two keys per row
    assert opdef.flops([q, kv, kv], [], attrs) == 4.0 * 2 * 3 * 8 * 12
    plain = opdef.validate_attrs({}, "node")
    assert opdef.flops([q, kv, kv], [], plain) == 4.0 * 2 * 3 * 8 * 6 * 9


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation, OpDefs, graphs
# ---------------------------------------------------------------------------------------------------------------
def test_attributes_default_and_validate():
    opdef = ge2.ops.OPS["attention"]
    attrs = opdef.validate_attrs({}, "node")
    assert attrs["window"] == (-1, -1) and attrs["softcap"] == 0.0
    assert opdef.validate_attrs({"window": [2, np.int64(0)], "softcap": 3}, "node")["window"] == (2, 0)
    assert opdef.validate_attrs({"softcap": 3}, "node")["softcap"] == 3.0
    bad_windows = ((0,), (1, 2, 3), (-2, 0), (0, -5), (1.5, 0), (True, 0), ("1", 0))
    for window in bad_windows:
        with pytest.raises(ValueError, match=r"attribute 'window' must be \(left, right\): two ints >= -1"):
            opdef.validate_attrs({"window": window}, "node")
    with pytest.raises(TypeError, match="attribute 'window' expected tuple, got int"):
        opdef.validate_attrs({"window": 3}, "node")
    for softcap in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="attribute 'softcap' must be finite and >= 0"):
            opdef.validate_attrs({"softcap": softcap}, "node")
    with pytest.raises(TypeError, match="attribute 'softcap' expected float, got bool"):
        opdef.validate_attrs({"softcap": True}, "node")


def test_faces_and_references_name_the_argument(rng):
    q, k, v, dy = _problem(rng, 1, 2, 2, 4, 4, 8, "float16")
    with pytest.raises(ValueError, match="attribute 'window' must be"):
        attention.forward_numpy(q, k, v, window=(-3, 1))
    with pytest.raises(ValueError, match="attribute 'softcap' must be finite and >= 0"):
        attention.backward_numpy(dy, q, k, v, softcap=-2.0)
    with pytest.raises(ValueError, match=r"window: expected \(left, right\), two ints >= -1"):
        attention.reference(q, k, v, window=(0, 1, 2))
    with pytest.raises(TypeError, match="window: expected a tuple"):
        attention.reference_backward(dy, q, k, v, window=4)
    with pytest.raises(ValueError, match="softcap: expected a finite float >= 0"):
        attention.reference(q, k, v, softcap=float("nan"))
    with pytest.raises(TypeError, match="softcap: expected a float"):
        attention.reference(q, k, v, softcap="1")
    g = Graph("bad_window")
    x = g.input("q", (1, 2, 4, 8), "float16")
    with pytest.raises(ValueError, match="attribute 'window' must be"):
        g.attention(x, x, x, window=(0, -2))


def _native_reason(kernel, head_dim, dtype, seq_q, seq_k, causal=False, window=(-1, -1), softcap=0.0):
    return attention._native_module().unsupported_reason(kernel, head_dim, dtype, False, seq_q=seq_q, seq_k=seq_k,
                                                         causal=causal, window_left=window[0],
                                                         window_right=window[1], softcap=softcap)


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("softcap", (0.0, 30.0))
@pytest.mark.parametrize("seq_q,seq_k", ((5, 5), (3, 9), (9, 3)))
def test_own_kernels_take_every_window_and_softcap(window, softcap, seq_q, seq_k):
    for kernel in ("flash", "rowwise", "unfused"):
        for causal in (False, True):
            assert _native_reason(kernel, 64, "bfloat16", seq_q, seq_k, causal, window, softcap) == ""


# cudnn's declines, in the order it checks them (None: it takes the problem).
CUDNN_CASES = (
    (5, 5, False, (-1, -1), 30.0, "has no logit soft cap"),
    (5, 5, False, (2, 1), 1.0, "has no logit soft cap"),
    (6, 3, False, (-1, 0), 0.0, "does not specify the output of a query row with no visible key"),
    (5, 5, False, (0, 0), 0.0, None),
    (5, 5, True, (2, -1), 0.0, None),
    (3, 9, False, (2, 1), 0.0, None),
    (3, 9, False, (-1, 0), 0.0, None),
    (3, 9, True, (7, -1), 0.0,
     "takes causal \\(top-left\\) with a window \\(bottom-right\\) only where seq_q == seq_k"),
    (9, 5, False, (6, -1), 0.0, "takes a window's left bound only where seq_q <= seq_k"),
    (9, 5, False, (-1, 4), 0.0, None),
)


@pytest.mark.parametrize("seq_q,seq_k,causal,window,softcap,reason", CUDNN_CASES)
def test_cudnn_declines_with_a_reason(seq_q, seq_k, causal, window, softcap, reason):
    if not attention.has_cudnn():
        pytest.skip("this build has no cudnn candidate: it declines every problem as not built")
    got = _native_reason("cudnn", 64, "float16", seq_q, seq_k, causal, window, softcap)
    if reason is None:
        assert got == ""
    else:
        assert re.search(reason, got) and got.startswith("cudnn (cuDNN's fused SDPA)")
    # the registry's candidate says the same, forward and backward
    q, kv = TensorType((1, 2, seq_q, 64), "float16"), TensorType((1, 2, seq_k, 64), "float16")
    attrs = ge2.ops.OPS["attention"].validate_attrs({"causal": causal, "window": window, "softcap": softcap}, "node")
    lse = TensorType((1, 2, seq_q), "float32")
    for op, in_types in (("attention", (q, kv, kv)), ("attention_backward", (q, q, kv, kv, q, lse))):
        problem = ge2.ops.Problem(op=op, in_types=in_types, out_types=(), attrs=attrs)
        cudnn = next(c for c in ge2.ops.OPS[op].candidates if c.name == "cudnn")
        assert cudnn.supports(problem) == (got or None)


def test_native_calls_check_the_window_and_softcap():
    native = attention._native_module()
    with pytest.raises(ValueError, match="window_left, window_right: expected >= -1"):
        native.prepare("rowwise", 1, 2, 2, 9, 9, 64, False, 0.5, False, "float16", False, window_left=-2)
    with pytest.raises(ValueError, match="softcap: expected a finite value >= 0"):
        native.prepare("rowwise", 1, 2, 2, 9, 9, 64, False, 0.5, False, "float16", False, softcap=-1.0)


def test_graph_and_autograd_on_cpu_executor(rng):
    g = Graph("local_attention")
    q = g.input("q", (2, 2, 5, 8), "float32")
    k = g.input("k", (2, 1, 7, 8), "float32")
    v = g.input("v", (2, 1, 7, 8), "float32")
    y, _ = g.attention(q, k, v, window=(2, 1), softcap=1.5, scale=0.6)
    assert y.producer.attrs["window"] == (2, 1) and y.producer.attrs["softcap"] == 1.5
    dy = random_array(rng, (2, 2, 5, 8), "float32")
    g.output(y, "y")
    g.output(g.sum(g.mul(y, g.param("dy", dy))), "loss")
    feeds = dict(zip("qkv", _problem(rng, 2, 2, 1, 5, 7, 8, "float32")))
    expected, _ = attention.reference(*feeds.values(), window=(2, 1), softcap=1.5, scale=0.6)
    assert_close(ge2.ExecutorV2(g, device="cpu").run(feeds)["y"], expected, "float32", what="y")
    # The grad rule hands the window and the soft cap to attention_backward.
    backward = autograd.backward_graph(g, "loss", wrt=["q", "k", "v"])
    nodes = [node for node in backward.nodes if node.op == "attention_backward"]
    assert len(nodes) == 1 and nodes[0].attrs["window"] == (2, 1) and nodes[0].attrs["softcap"] == 1.5
    grads = ge2.ExecutorV2(backward, device="cpu", passes=[]).run(feeds)
    expected_grads = attention.reference_backward(dy, *feeds.values(), window=(2, 1), softcap=1.5, scale=0.6)
    for name, want in zip("qkv", expected_grads):
        assert_close(grads[f"grad/{name}"], want, "float32", reduction_length=8, what=f"d{name}")


# ---------------------------------------------------------------------------------------------------------------
# GPU: every kernel against the float64 reference
# ---------------------------------------------------------------------------------------------------------------
def _check(rng, poisoned, kernel, dtype, heads_q, heads_kv, seq_q, seq_k, head_dim, causal, window, softcap):
    """Forward and backward of ``kernel`` against the float64 reference, outputs poisoned first; where the kernel
    declines the problem, both faces must say why."""
    q, k, v, dy = _problem(rng, 2, heads_q, heads_kv, seq_q, seq_k, head_dim, dtype)
    attrs = dict(causal=causal, window=window, softcap=softcap, scale=None)
    reason = _native_reason(kernel, head_dim, dtype, seq_q, seq_k, causal, window, softcap)
    runtime = ge2.device.runtime()
    device = [runtime.DeviceArray.from_numpy(x) for x in (q, k, v, dy)]
    if reason:
        if kernel == "cudnn" and not attention.has_cudnn():
            pytest.skip(reason)
        message = f"kernel: '{kernel}' cannot run this problem: {re.escape(reason)}"
        with pytest.raises(ValueError, match=message):
            attention.forward(*device[:3], **attrs, kernel=kernel)
        with pytest.raises(ValueError, match=message):
            attention.backward(device[3], *device[:3], **attrs, kernel=kernel)
        return
    y_out, lse_out = poisoned(q.shape, dtype), poisoned((2, heads_q, seq_q), "float32")
    with _cudnn_may_decline(kernel):
        y, lse = attention.forward(*device[:3], **attrs, kernel=kernel, out=(y_out, lse_out))
    expected_y, expected_lse = attention.reference(q, k, v, **attrs)
    assert_close(y.numpy(), expected_y, dtype, what="y")
    assert_close(lse.numpy(), expected_lse, "float32", reduction_length=head_dim, what="lse")  # +inf must match
    outs = tuple(poisoned(x.shape, dtype) for x in (q, k, v))
    with _cudnn_may_decline(kernel):
        grads = attention.backward(device[3], *device[:3], **attrs, kernel=kernel, out=outs, y=y, lse=lse)
    for name, got, want in zip("qkv", grads, reference_backward_from_stored_y(dy, q, k, v, y.numpy(), **attrs)):
        assert_close(got.numpy(), want, dtype, reduction_length=head_dim, what=f"d{name}")


@contextlib.contextmanager
def _cudnn_may_decline(kernel):
    """cuDNN builds its plans at run time and may have no engine for a band (its versions differ in what they take;
    auto then moves on): a skip that names cuDNN's reason, never a pass. Other kernels' errors propagate."""
    try:
        yield
    except RuntimeError as error:
        if kernel != "cudnn" or "kernel 'cudnn'" not in str(error):
            raise
        pytest.skip(f"cuDNN declined at run time: {error}")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("head_dim", (64, 128))
@pytest.mark.parametrize("softcap", (0.0, 5.0))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("window", WINDOWS[1:])
@pytest.mark.parametrize("seq_q,seq_k", ((130, 130), (67, 200), (200, 67)))
def test_window_and_softcap(rng, poisoned, kernel, dtype, head_dim, softcap, causal, window, seq_q, seq_k):
    _check(rng, poisoned, kernel, dtype, 2, 1, seq_q, seq_k, head_dim, causal, window, softcap)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("head_dim", (64, 128))
@pytest.mark.parametrize("seq_q,seq_k", ((1, 1), (1, 77), (33, 1), (17, 17)))
def test_softcap_alone_and_edge_lengths(rng, poisoned, kernel, dtype, head_dim, seq_q, seq_k):
    _check(rng, poisoned, kernel, dtype, 2, 2, seq_q, seq_k, head_dim, False, (-1, -1), 3.0)
    _check(rng, poisoned, kernel, dtype, 2, 2, seq_q, seq_k, head_dim, False, (5, 0), 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_wide_window_over_long_keys_skips_tiles(rng, poisoned, kernel, dtype):
    # 1000 keys, a band of 100 + 30: most key tiles of every query block are skipped, and the band's edges cross
    # tiles at every offset.
    _check(rng, poisoned, kernel, dtype, 4, 2, 1000, 1000, 64, False, (100, 30), 0.0)
    _check(rng, poisoned, kernel, dtype, 4, 2, 300, 1000, 128, True, (250, -1), 10.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_auto_runs_windows_and_softcap(rng, poisoned, dtype):
    """auto takes the first candidate that applies: cudnn declines a soft cap, so flash runs it."""
    q, k, v, dy = _problem(rng, 1, 2, 2, 64, 64, 64, dtype)
    for attrs in (dict(window=(8, 0)), dict(softcap=4.0), dict(window=(-1, 3), softcap=2.0)):
        y, lse = attention.forward_numpy(q, k, v, **attrs)
        expected_y, expected_lse = attention.reference(q, k, v, **attrs)
        assert_close(y, expected_y, dtype, what="y")
        assert_close(lse, expected_lse, "float32", reduction_length=64, what="lse")
        grads = attention.backward_numpy(dy, q, k, v, **attrs)
        for name, got, want in zip("qkv", grads, reference_backward_from_stored_y(dy, q, k, v, y, **attrs)):
            assert_close(got, want, dtype, reduction_length=64, what=f"d{name}")


@pytest.mark.parametrize("attrs", (dict(causal=True, scale=0.4), dict(window=(3, 1), softcap=2.0)))
def test_stored_y_reference_is_the_kernels_computation(rng, attrs):
    """The GPU tests' backward reference takes D_i = dy_i . y_i from the stored (rounded) y, as the kernels do: with
    the exact y it is reference_backward, with a rounded one it is the kernels' formula evaluated in float64."""
    q, k, v, dy = (x.astype(np.float64) for x in _problem(rng, 1, 4, 2, 6, 9, 8, "float32"))
    y, _ = attention.reference(q, k, v, **attrs)
    for got, want in zip(reference_backward_from_stored_y(dy, q, k, v, y, **attrs),
                         attention.reference_backward(dy, q, k, v, **attrs)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    stored = y.astype(np.float16).astype(np.float64)
    scale = attrs.get("scale", 1 / math.sqrt(8))
    q64, k64 = q, np.repeat(k, 2, axis=1)  # two query heads per K/V head
    p, _, capped = attention._probabilities(q64, k64, attrs.get("causal", False), scale, None,
                                            attrs.get("window", (-1, -1)), attrs.get("softcap", 0.0))
    ds = p * (dy @ np.repeat(v, 2, axis=1).transpose(0, 1, 3, 2) - (dy * stored).sum(axis=-1, keepdims=True))
    if capped is not None:
        ds = ds * (1 - capped * capped)
    dq = scale * ds @ k64
    dk = (scale * ds.transpose(0, 1, 3, 2) @ q64).reshape(1, 2, 2, 9, 8).sum(axis=2)
    got_dq, got_dk, _ = reference_backward_from_stored_y(dy, q, k, v, stored, **attrs)
    np.testing.assert_allclose(got_dq, dq, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_dk, dk, rtol=1e-10, atol=1e-12)
