"""attention: reference math against an explicit loop and finite differences, validation, OpDefs and graphs
(CPU); every kernel x dtype x causal x length x head_dim x layout, GQA and seq_q != seq_k, forward and backward
against the float64 reference on the GPU."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir import Graph, TensorType
from graph_executor_v2.ops import attention
from graph_executor_v2.testing import assert_close, random_array
from attention_checks import reference_backward_from_stored_y
from row_norm_checks import numeric_gradient

DTYPES = ("float16", "bfloat16")
ALL_DTYPES = ("float32", "float16", "bfloat16")
KERNELS = ("cudnn", "flash", "rowwise", "unfused")  # the GPU tests run each where it applies, forward and backward
# kernels() as listed; flash_sm90 (an sm_90 GPU and a CUTLASS build) has its own tests (tests/test_attention_sm90.py).
TABLE = ("cudnn", "flash", "flash_sm90", "rowwise", "unfused")
NOT_BUILT = (r"not built: (cuDNN frontend headers not found \(install nvidia-cudnn-frontend or set "
             r"GE2_CUDNN_FRONTEND_DIR\)|CMake found no cuDNN \(cudnn.h and libcudnn: .*\))")


def _looped_reference(q, k, v, causal, scale):
    """The definition, one (batch, head, row) at a time, bhsd layout: an oracle written independently of the
    vectorized reference."""
    batch, heads_q, seq_q, head_dim = q.shape
    group = heads_q // k.shape[1]
    y = np.zeros(q.shape)
    lse = np.zeros((batch, heads_q, seq_q))
    for b in range(batch):
        for h in range(heads_q):
            keys, values = k[b, h // group].astype(np.float64), v[b, h // group].astype(np.float64)
            for i in range(seq_q):
                visible = min(i + 1, keys.shape[0]) if causal else keys.shape[0]
                scores = scale * keys[:visible] @ q[b, h, i].astype(np.float64)
                lse[b, h, i] = math.log(sum(math.exp(s) for s in scores))
                y[b, h, i] = np.exp(scores - lse[b, h, i]) @ values[:visible]
    return y, lse


def _to_layout(x, layout):
    return x if layout == "bhsd" else np.ascontiguousarray(x.transpose(0, 2, 1, 3))


def _problem(rng, batch, heads_q, heads_kv, seq_q, seq_k, head_dim, dtype, layout="bhsd"):
    """q, k, v (and dy) in ``layout``: normal values rounded to ``dtype``."""
    arrays = [random_array(rng, (batch, heads, seq, head_dim), dtype)
              for heads, seq in ((heads_q, seq_q), (heads_kv, seq_k), (heads_kv, seq_k), (heads_q, seq_q))]
    return [_to_layout(x, layout) for x in arrays]


# ---------------------------------------------------------------------------------------------------------------
# CPU: reference math
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("seq_q,seq_k", ((1, 1), (5, 5), (3, 7), (7, 3)))
def test_reference_matches_the_definition(rng, causal, seq_q, seq_k):
    q, k, v, _ = _problem(rng, 2, 4, 2, seq_q, seq_k, 6, "float32")
    y, lse = attention.reference(q, k, v, causal=causal)
    expected_y, expected_lse = _looped_reference(q, k, v, causal, 1 / math.sqrt(6))
    np.testing.assert_allclose(y, expected_y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, expected_lse, rtol=1e-12, atol=1e-12)


def test_causal_is_top_left_aligned(rng):
    # seq_q < seq_k: row 0 sees key 0 alone, so y[0] is v[0] whatever the scores (PyTorch's is_causal).
    q, k, v, _ = _problem(rng, 1, 1, 1, 2, 5, 4, "float32")
    y, lse = attention.reference(q, k, v, causal=True, scale=0.7)
    np.testing.assert_allclose(y[0, 0, 0], v[0, 0, 0], rtol=1e-12)
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    np.testing.assert_allclose(lse[0, 0, 0], 0.7 * q64[0, 0, 0] @ k64[0, 0, 0], rtol=1e-12)


def test_layouts_agree(rng):
    q, k, v, _ = _problem(rng, 2, 4, 2, 5, 6, 8, "float32")
    y, lse = attention.reference(q, k, v, causal=True)
    y_seq_major, lse_seq_major = attention.reference(*(_to_layout(x, "bshd") for x in (q, k, v)), causal=True,
                                                     layout="bshd")
    np.testing.assert_allclose(y_seq_major, _to_layout(y, "bshd"), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse_seq_major, lse, rtol=1e-12)


@pytest.mark.parametrize("layout", attention.LAYOUTS)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("heads_kv,seq_q,seq_k", ((2, 3, 3), (1, 4, 3), (2, 2, 5)))
def test_reference_backward_matches_finite_differences(rng, layout, causal, heads_kv, seq_q, seq_k):
    q, k, v, dy = (x.astype(np.float64) for x in _problem(rng, 1, 2, heads_kv, seq_q, seq_k, 3, "float32", layout))
    grads = attention.reference_backward(dy, q, k, v, causal=causal, scale=0.8, layout=layout)

    def loss():
        return float((attention.reference(q, k, v, causal=causal, scale=0.8, layout=layout)[0] * dy).sum())

    for name, array, grad in zip("qkv", (q, k, v), grads):
        np.testing.assert_allclose(grad, numeric_gradient(loss, array), rtol=1e-6, atol=1e-8, err_msg=name)


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation, OpDefs, graphs
# ---------------------------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_argument():
    f16 = "float16"
    good = ((2, 4, 8, 16), f16, (2, 2, 8, 16), f16, (2, 2, 8, 16), f16, "bhsd")
    assert attention.problem_sizes(*good) == dict(batch=2, heads_q=4, heads_kv=2, seq_q=8, seq_k=8, head_dim=16)
    cases = [
        (TypeError, r"q: expected dtype float32, float16 or bfloat16, got int32", {1: "int32"}),
        (TypeError, r"k: expected dtype float16 \(the dtype of q\), got bfloat16", {3: "bfloat16"}),
        (ValueError, r"q: expected a rank-4 array", {0: (2, 4, 8)}),
        (ValueError, r"v: expected shape \(2, 2, 8, 16\) \(the shape of k\)", {4: (2, 2, 9, 16)}),
        (ValueError, r"k: expected batch 2", {2: (3, 2, 8, 16), 4: (3, 2, 8, 16)}),
        (ValueError, r"k: expected head_dim 16", {2: (2, 2, 8, 32), 4: (2, 2, 8, 32)}),
        (ValueError, r"k: expected a number of heads that divides the 4 heads of q, got 3", {2: (2, 3, 8, 16),
                                                                                          4: (2, 3, 8, 16)}),
        (ValueError, r"q: expected every size >= 1", {0: (2, 4, 0, 16)}),
        (ValueError, r"layout: expected one of bhsd, bshd, got 'sbhd'", {6: "sbhd"}),
    ]
    for error, message, changes in cases:
        arguments = [changes.get(i, value) for i, value in enumerate(good)]
        with pytest.raises(error, match=message):
            attention.problem_sizes(*arguments)


def test_bad_scalar_arguments_name_the_argument():
    q = np.zeros((1, 1, 2, 4), np.float16)
    with pytest.raises(TypeError, match="attribute 'scale' expected float, got str"):
        attention.forward_numpy(q, q, q, scale="0.5")
    with pytest.raises(ValueError, match="attribute 'scale' must be finite and nonzero, got nan"):
        attention.forward_numpy(q, q, q, scale=float("nan"))
    with pytest.raises(TypeError, match="attribute 'causal' expected bool, got int"):
        attention.forward_numpy(q, q, q, causal=1)
    with pytest.raises(ValueError,
                       match="kernel: expected one of auto, cudnn, flash, flash_sm90, rowwise, unfused, got 'flash9'"):
        attention.forward_numpy(q, q, q, kernel="flash9")
    with pytest.raises(TypeError, match="q: expected a NumPy array, got list"):
        attention.forward_numpy([[1.0]], q, q)
    with pytest.raises(ValueError, match=r"dy: expected shape \(1, 1, 2, 4\) \(y's\)"):
        attention.backward_numpy(np.zeros((1, 1, 3, 4), np.float16), q, q, q)
    with pytest.raises(TypeError, match=r"dy: expected dtype float16 \(y's\), got float32"):
        attention.backward_numpy(q.astype(np.float32), q, q, q)
    # the saved forward results: both or neither, of the forward's shapes
    with pytest.raises(ValueError, match="lse: expected y and lse together"):
        attention.backward_numpy(q, q, q, q, y=q)
    with pytest.raises(ValueError, match=r"lse: expected shape \(1, 1, 2\) \(the forward's\), got \(1, 1\)"):
        attention.backward_numpy(q, q, q, q, y=q, lse=np.zeros((1, 1), np.float32))


def test_kernels_report_constraints():
    table = attention.kernels()
    assert [k["name"] for k in table] == list(TABLE)
    assert [k["priority"] for k in table] == [30, 20, 15, 10, 5]  # cudnn, flash, flash_sm90, rowwise, unfused
    assert all(k["constraints"] for k in table)
    candidates = selection.candidates(ge2.ops.OPS["attention"])
    assert [(c.name, c.priority) for c in candidates] == [(k["name"], k["priority"]) for k in table]
    assert [c.name for c in candidates if c.always_works] == ["unfused"]
    assert [c.name for c in candidates if c.any_alignment] == ["rowwise", "unfused"]
    backward = selection.candidates(ge2.ops.OPS["attention_backward"])
    assert [(c.name, c.always_works) for c in backward] == [(c.name, c.always_works) for c in candidates]


@pytest.mark.parametrize("head_dim,dtype,reason", (
    (40, "float16", "flash is built for head_dim 64 and 128, got head_dim 40"),
    (256, "bfloat16", "flash is built for head_dim 64 and 128, got head_dim 256"),
    (64, "float32", "flash runs float16 and bfloat16 on tensor cores: got float32"),
))
def test_flash_reports_why_it_cannot_run(head_dim, dtype, reason):
    native = attention._native_module()
    assert native.unsupported_reason("flash", head_dim, dtype) == reason
    assert native.unsupported_reason("flash", 128, "bfloat16") == ""
    assert native.unsupported_reason("flash", 64, "float16") == ""
    problem = ge2.ops.Problem(op="attention", in_types=(TensorType((1, 2, 9, head_dim), dtype),) * 3, out_types=(),
                              attrs={"causal": False, "scale": None, "layout": "bhsd"})
    supports = {c.name: c.supports(problem) for c in ge2.ops.OPS["attention"].candidates}
    assert supports.pop("cudnn") == (native.unsupported_reason("cudnn", head_dim, dtype) or None)
    assert supports.pop("flash_sm90") == (native.unsupported_reason("flash_sm90", head_dim, dtype) or None)
    assert supports == {"flash": reason, "unfused": None, "rowwise": None}


def _cudnn_supports(head_dim, dtype):
    """The reason of the forward and the backward cudnn candidate for a GQA problem of ``head_dim`` (None: it
    applies)."""
    reasons = []
    for opdef, first_input in ((ge2.ops.OPS["attention"], 0), (ge2.ops.OPS["attention_backward"], 1)):
        q, kv = TensorType((2, 4, 9, head_dim), dtype), TensorType((2, 2, 11, head_dim), dtype)
        in_types = (q, kv, kv) if first_input == 0 else (q, q, kv, kv, q, TensorType((2, 4, 9), "float32"))
        problem = ge2.ops.Problem(op=opdef.name, in_types=in_types, out_types=(),
                                  attrs={"causal": True, "scale": None, "layout": "bhsd"})
        reasons.append(next(c for c in opdef.candidates if c.name == "cudnn").supports(problem))
    return reasons


def test_cudnn_reports_why_it_is_not_built():
    """A build without cuDNN or without the frontend headers says so in kernels() and in every capability check
    (the registry's rejections, which explain() prints); auto and the registry go on to flash."""
    if attention.has_cudnn():
        pytest.skip("this build has the cudnn candidate (test_cudnn_constraints_name_the_reason runs)")
    native = attention._native_module()
    row = next(row for row in attention.kernels() if row["name"] == "cudnn")
    assert re.search(r"NOT BUILT \((cuDNN frontend headers not found|CMake found no cuDNN)", row["description"])
    reason = native.unsupported_reason("cudnn", 64, "float16")
    assert re.fullmatch(NOT_BUILT, reason)
    assert _cudnn_supports(64, "float16") == [reason, reason]
    with pytest.raises(ValueError, match=f"kernel: {re.escape(reason)}"):
        native.prepare("cudnn", 1, 2, 2, 9, 9, 64, False, 0.5, True, "float16", False)
    g = Graph("attention")
    q, k, v = (g.input(name, (2, 4, 9, 64), "float16") for name in "qkv")
    y, _ = g.attention(q, k, v, causal=True)
    problem = ge2.ops.Problem(op="attention", in_types=(q.type, k.type, v.type), out_types=(),
                              attrs={"causal": True, "scale": None, "layout": "bhsd"})
    fake_gpu = ge2.runtime.Capabilities("cuda", (9, 0), "Fake GPU", "Fake GPU | test")
    ranking = ge2.runtime.select(y.producer, problem, fake_gpu, ge2.runtime.Preferences())
    assert dict(ranking.rejected)["cudnn"] == reason
    assert ranking.viable[0].name == "flash"


@pytest.mark.parametrize("head_dim,dtype,reason", (
    (64, "float32", "cudnn runs cuDNN's fused SDPA, which takes float16 and bfloat16: got float32"),
    (72, "float32", "cudnn runs cuDNN's fused SDPA, which takes float16 and bfloat16: got float32"),
    (60, "float16", "cudnn (cuDNN's fused SDPA) needs head_dim a multiple of 8 and <= 256, got head_dim 60"),
    (1, "bfloat16", "cudnn (cuDNN's fused SDPA) needs head_dim a multiple of 8 and <= 256, got head_dim 1"),
    (264, "bfloat16", "cudnn (cuDNN's fused SDPA) needs head_dim a multiple of 8 and <= 256, got head_dim 264"),
    (8, "float16", ""), (72, "bfloat16", ""), (128, "float16", ""), (256, "bfloat16", ""),
))
def test_cudnn_constraints_name_the_reason(head_dim, dtype, reason):
    if not attention.has_cudnn():
        pytest.skip("this build has no cudnn candidate (test_cudnn_reports_why_it_is_not_built runs)")
    row = next(row for row in attention.kernels() if row["name"] == "cudnn")
    assert "NOT BUILT" not in row["description"] and "Graph::sdpa" in row["description"]
    assert attention._native_module().unsupported_reason("cudnn", head_dim, dtype) == reason
    assert _cudnn_supports(head_dim, dtype) == [reason or None] * 2
    if reason:
        with pytest.raises(ValueError, match=f"kernel: {re.escape(reason)}"):
            attention._native_module().prepare("cudnn", 1, 2, 2, 9, 9, head_dim, False, 0.5, True, dtype, True)


@pytest.mark.parametrize("head_dim", (1, 40, 72, 160, 256, 272, 1000))
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_unfused_runs_every_head_dim_and_rowwise_up_to_256(head_dim, dtype):
    native = attention._native_module()
    assert native.unsupported_reason("unfused", head_dim, dtype) == ""
    rowwise = native.unsupported_reason("rowwise", head_dim, dtype)
    assert rowwise == ("" if head_dim <= 256 else
                       f"rowwise holds a row in registers: needs head_dim <= 256, got {head_dim}")
    for opdef, first_input in ((ge2.ops.OPS["attention"], 0), (ge2.ops.OPS["attention_backward"], 1)):
        q = TensorType((2, 4, 9, head_dim), dtype)
        kv = TensorType((2, 2, 11, head_dim), dtype)
        lse = TensorType((2, 4, 9), "float32")
        in_types = ((q, kv, kv) if first_input == 0 else (q, q, kv, kv, q, lse))
        problem = ge2.ops.Problem(op=opdef.name, in_types=in_types, out_types=(),
                                  attrs={"causal": True, "scale": None, "layout": "bhsd"})
        supports = {c.name: c.supports(problem) for c in opdef.candidates}
        assert supports["unfused"] is None and supports["rowwise"] == (rowwise or None)


@pytest.mark.parametrize("head_dim,dtype,cudnn_applies,ranked", (
    (64, "float16", True, ["flash", "rowwise", "unfused"]),
    (80, "bfloat16", True, ["rowwise", "unfused"]),
    (128, "float32", False, ["rowwise", "unfused"]),
    (272, "float16", False, ["unfused"]),
))
def test_registry_ranks_cudnn_then_flash_then_rowwise_then_unfused(head_dim, dtype, cudnn_applies, ranked):
    """The plan's kernel for an attention node (the registry's ranking, as auto chooses natively): cudnn first where
    it is built and applies; unfused only where nothing else applies, or when autotuning or a preference picks it."""
    if cudnn_applies and attention.has_cudnn():
        ranked = ["cudnn", *ranked]
    if not attention._native_module().unsupported_reason("flash_sm90", head_dim, dtype):  # built, on an sm_90 GPU
        ranked = [name for flash in ranked for name in ((flash, "flash_sm90") if flash == "flash" else (flash,))]
    g = Graph("attention")
    q, k, v = (g.input(name, (2, 4, 9, head_dim), dtype) for name in "qkv")
    y, _ = g.attention(q, k, v, causal=True)
    problem = ge2.ops.Problem(op="attention", in_types=(q.type, k.type, v.type), out_types=(),
                              attrs={"causal": True, "scale": None, "layout": "bhsd"})
    fake_gpu = ge2.runtime.Capabilities("cuda", (9, 0), "Fake GPU", "Fake GPU | test")
    ranking = ge2.runtime.select(y.producer, problem, fake_gpu, ge2.runtime.Preferences())
    assert [c.name for c in ranking.viable][:-1] == ranked  # the host round trip comes last


def _workspace(kernel, batch, heads_q, heads_kv, seq_q, seq_k, head_dim, layout, dtype, backward):
    return attention._native_module().workspace_bytes(kernel, batch, heads_q, heads_kv, seq_q, seq_k, head_dim,
                                                      layout == "bshd", dtype, backward)


def _round(size):
    return -(-size // 256) * 256


@pytest.mark.parametrize("dtype,element", (("float32", 4), ("float16", 2), ("bfloat16", 2)))
def test_unfused_workspace_is_bounded_by_chunks(monkeypatch, dtype, element):
    monkeypatch.delenv("GE2_ATTENTION_SCORE_BUDGET", raising=False)
    # Per query row of a chunk: float32 S and P (float32, or a 16-bit high and residual part: 8 bytes a score either
    # way), and for 16-bit storage the row's float32 O or dQ.
    split = element == 2
    row_sums = 4 if split else 0  # bytes of float32 O or dQ per head_dim element of a row

    def chunk_bytes(units, rows, seq_k, head_dim):
        scores = units * rows * seq_k
        parts = _round(scores * element) * (2 if split else 1)
        return _round(scores * 4) + parts + _round(units * rows * head_dim * row_sums)

    # (1, 32, 8192, 128) under 512 MiB: a whole head of rows per chunk in float32, half a head in 16-bit (its float32
    # O rows tip a head past the budget); the backward adds D_i and, in 16-bit, the float32 dK, dV sums of a head.
    rows = 8192 if not split else 4096
    forward = _workspace("unfused", 1, 32, 32, 8192, 8192, 128, "bhsd", dtype, False)
    backward = _workspace("unfused", 1, 32, 32, 8192, 8192, 128, "bhsd", dtype, True)
    assert forward == chunk_bytes(1, rows, 8192, 128) <= 512 << 20
    assert backward == forward + 32 * 8192 * 4 + (2 * 8192 * 128 * 4 if split else 0) <= 1 << 30
    # A small problem takes what it needs: every unit in one chunk (a batched GEMM spans the K/V heads of one batch
    # element in bshd); the grouped heads are four passes, whose dK, dV add up in place (float32) or in float32 sums.
    seq_q, seq_k, head_dim = 33, 40, 72
    small = (2, 8, 2, seq_q, seq_k, head_dim, "bshd", dtype)
    row_dot = _round(2 * 8 * seq_q * 4)
    sums = 2 * _round(2 * seq_k * head_dim * 4) if split else 0
    assert _workspace("unfused", *small, False) == chunk_bytes(2, seq_q, seq_k, head_dim)
    assert _workspace("unfused", *small, True) == chunk_bytes(2, seq_q, seq_k, head_dim) + row_dot + sums
    # A budget below one unit: row blocks of one unit, of even sizes (33 rows in blocks of 17, 20 fitting).
    monkeypatch.setenv("GE2_ATTENTION_SCORE_BUDGET", str(20 * (seq_k * 8 + head_dim * row_sums) + 1))
    sums = 2 * _round(seq_k * head_dim * 4) if split else 0
    assert _workspace("unfused", *small, False) == chunk_bytes(1, 17, seq_k, head_dim)
    assert _workspace("unfused", *small, True) == chunk_bytes(1, 17, seq_k, head_dim) + row_dot + sums


def test_workspace_bytes_of_the_other_kernels_and_bad_arguments(monkeypatch):
    with pytest.raises(ValueError, match="kernel: expected flash, flash_sm90, rowwise or unfused .*got cudnn"):
        _workspace("cudnn", 2, 4, 2, 9, 11, 64, "bhsd", "float16", True)
    assert _workspace("rowwise", 2, 4, 2, 9, 11, 64, "bhsd", "float16", False) == 0
    assert _workspace("rowwise", 2, 4, 2, 9, 11, 64, "bhsd", "float16", True) == 2 * 4 * 9 * 4
    assert _workspace("flash", 2, 4, 2, 9, 11, 64, "bhsd", "float16", False) == 0
    with pytest.raises(ValueError, match=r"kernel: expected one of cudnn, flash, flash_sm90, rowwise, unfused "
                                         r"\(attention's kernels\), got 'auto'"):  # the Python selector chooses
        _workspace("auto", 2, 4, 2, 9, 11, 64, "bhsd", "float16", True)
    with pytest.raises(ValueError, match="heads_kv: expected a divisor of heads_q = 4, got 3"):
        _workspace("unfused", 2, 4, 3, 9, 11, 64, "bhsd", "float16", True)
    monkeypatch.setenv("GE2_ATTENTION_SCORE_BUDGET", "lots")
    with pytest.raises(ValueError, match="GE2_ATTENTION_SCORE_BUDGET: expected a positive number of bytes, got 'lots'"):
        _workspace("unfused", 2, 4, 2, 9, 11, 64, "bhsd", "float16", True)


def test_opdef_infers_types_and_raises_naming_inputs():
    opdef = ge2.ops.OPS["attention"]
    attrs = opdef.validate_attrs({"layout": "bshd", "causal": True}, "node")
    assert attrs == {"causal": True, "scale": None, "layout": "bshd", "window": (-1, -1), "softcap": 0.0}
    q, kv = TensorType(("batch", 128, 8, 64), "bfloat16"), TensorType(("batch", 256, 2, 64), "bfloat16")
    assert opdef.infer([q, kv, kv], attrs) == [q, TensorType(("batch", 8, 128), "float32")]
    with pytest.raises(ValueError, match="k: expected a number of heads that divides the 8 heads of q, got 3"):
        bad_kv = TensorType(("batch", 4, 3, 64), "bfloat16")
        opdef.infer([q, bad_kv, bad_kv], attrs)
    with pytest.raises(ValueError, match="attribute 'scale' must be finite and nonzero"):
        opdef.validate_attrs({"scale": float("inf")}, "node")
    backward = ge2.ops.OPS["attention_backward"]
    lse = TensorType(("batch", 8, 128), "float32")
    assert backward.infer([q, q, kv, kv, q, lse], attrs) == [q, kv, kv]
    with pytest.raises(ValueError, match="input 'lse': expected shape"):
        backward.infer([q, q, kv, kv, q, TensorType(("batch", 8, 128), "float16")], attrs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_graph_runs_on_cpu_executor(rng, dtype):
    g = Graph("self_attention")
    q = g.input("q", ("batch", 3, 5, 8), dtype)
    k = g.input("k", ("batch", 1, 7, 8), dtype)
    v = g.input("v", ("batch", 1, 7, 8), dtype)
    y, lse = g.attention(q, k, v, causal=True, scale=0.5)
    g.output(y, "y")
    g.output(lse, "lse")
    feeds = dict(zip("qkv", _problem(rng, 2, 3, 1, 5, 7, 8, dtype)))
    result = ge2.ExecutorV2(g, device="cpu").run(feeds)
    expected_y, expected_lse = attention.reference(feeds["q"], feeds["k"], feeds["v"], causal=True, scale=0.5)
    assert_close(result["y"], expected_y, dtype, what="y")
    assert_close(result["lse"], expected_lse, "float32", what="lse")
    assert result["y"].dtype == feeds["q"].dtype and result["lse"].dtype == np.float32


def test_backward_opdef_reference_matches_reference_backward(rng):
    q, k, v, dy = _problem(rng, 1, 2, 1, 4, 6, 8, "float32")
    attrs = {"causal": True, "scale": None, "layout": "bhsd"}
    y, lse = attention.reference(q, k, v, causal=True)
    saved = [y.astype(np.float32), lse.astype(np.float32)]
    outputs = ge2.ops.OPS["attention_backward"].run_reference([dy, q, k, v, *saved], attrs)
    for name, got, expected in zip("qkv", outputs, attention.reference_backward(dy, q, k, v, causal=True)):
        assert_close(got, expected, "float32", what=f"d{name}")


# ---------------------------------------------------------------------------------------------------------------
# CPU: the attention fusion pass
# ---------------------------------------------------------------------------------------------------------------
def _written_out_attention(rng, seq_q, seq_k, head_dim, dtype="float32", mask="causal", scale_op="mul",
                           softmax_axis=-1):
    """One head of attention as users write it; ``mask``: "causal" (0 / -inf), "finfo" (0 / the dtype's lowest, as
    PyTorch's exported SDPA writes it), None, "other" (a mask that is not causal) or "weak" (-1e4 for the hidden
    keys: not low enough to be a mask)."""
    g = Graph("written_out_attention")
    q = g.input("q", (seq_q, head_dim), dtype)
    k = g.input("k", (seq_k, head_dim), dtype)
    v = g.input("v", (seq_k, head_dim), dtype)
    factor = head_dim ** -0.5 if scale_op == "mul" else head_dim ** 0.5
    scores = getattr(g, scale_op)(g.matmul(q, g.transpose(k, perm=(1, 0))),
                                  g.param("factor", np.array(factor, dtype=np.float32).astype(q.type.dtype)))
    if mask is not None:
        hidden = {"finfo": np.finfo(q.type.dtype).min, "weak": -1e4}.get(mask, -np.inf)
        values = np.where(np.tril(np.ones((seq_q, seq_k), dtype=bool)), 0.0, hidden).astype(np.float32)
        if mask == "other":
            values[0, 0] = -1.0
        scores = g.add(scores, g.param("mask", values.astype(q.type.dtype)))
    g.output(g.matmul(g.softmax(scores, axis=softmax_axis), v), "y")
    return g


def _op_counts(graph):
    counts = {}
    for node in graph.nodes:
        counts[node.op] = counts.get(node.op, 0) + 1
    return counts


@pytest.mark.parametrize("scale_op", ("mul", "div"))
@pytest.mark.parametrize("mask", ("causal", "finfo", None))
@pytest.mark.parametrize("seq_q,seq_k", ((6, 6), (3, 8), (8, 3)))
def test_fusion_pass_makes_one_attention_node(rng, scale_op, mask, seq_q, seq_k):
    g = _written_out_attention(rng, seq_q, seq_k, 8, mask=mask, scale_op=scale_op)
    before = _op_counts(g)
    assert before == {"matmul": 2, "transpose": 1, scale_op: 1, "softmax": 1, **({"add": 1} if mask else {})}
    optimized, records = ge2.passes.PassManager(ge2.passes.resolve(["fuse_attention", "dce"]),
                                                verify_each=True).run(g)
    assert _op_counts(optimized) == {"reshape": 4, "attention": 1}
    (node,) = [n for n in optimized.nodes if n.op == "attention"]
    assert node.attrs["causal"] == (mask is not None)
    assert node.attrs["scale"] == pytest.approx(8 ** -0.5, rel=1e-6)
    feeds = {name: random_array(rng, shape, "float32") for name, shape in
             (("q", (seq_q, 8)), ("k", (seq_k, 8)), ("v", (seq_k, 8)))}
    expected = ge2.ExecutorV2(g, device="cpu", passes=[]).run(feeds)["y"]
    fused = ge2.ExecutorV2(g, device="cpu").run(feeds)["y"]  # the default pipeline fuses too
    reference, _ = attention.reference(*(feeds[name][None, None] for name in "qkv"), causal=mask is not None)
    assert_close(fused, reference[0, 0], "float32", reduction_length=8)
    assert_close(fused, expected, "float32", reduction_length=8)


@pytest.mark.parametrize("change", ("other_mask", "weak_mask", "softmax_axis"))
def test_fusion_pass_leaves_other_patterns(rng, change):
    g = _written_out_attention(rng, 5, 5, 8, mask={"other_mask": "other", "weak_mask": "weak"}.get(change, "causal"),
                               softmax_axis=0 if change == "softmax_axis" else -1)
    optimized, _ = ge2.passes.PassManager(ge2.passes.resolve(["fuse_attention"]), verify_each=True).run(g)
    assert _op_counts(optimized) == _op_counts(g)


def test_fusion_pass_keeps_scores_read_elsewhere(rng):
    g = _written_out_attention(rng, 4, 4, 8)
    scores = next(n for n in g.nodes if n.op == "softmax").inputs[0]
    g.output(scores, "scores")  # an interior value that is a graph output must survive
    optimized, _ = ge2.passes.PassManager(ge2.passes.resolve(["fuse_attention"]), verify_each=True).run(g)
    assert "attention" not in _op_counts(optimized)


# ---------------------------------------------------------------------------------------------------------------
# GPU: every kernel against the float64 reference
# ---------------------------------------------------------------------------------------------------------------
def _check_forward(q, k, v, causal, layout, kernel, poisoned, dtype, scale=None):
    runtime = ge2.device.runtime()
    sizes = attention.shape_sizes(q.shape, k.shape, v.shape, layout)
    y_out = poisoned(q.shape, dtype)
    lse_out = poisoned((sizes["batch"], sizes["heads_q"], sizes["seq_q"]), "float32")
    y, lse = attention.forward(*(runtime.DeviceArray.from_numpy(x) for x in (q, k, v)), causal=causal, scale=scale,
                               layout=layout, kernel=kernel, out=(y_out, lse_out))
    expected_y, expected_lse = attention.reference(q, k, v, causal=causal, scale=scale, layout=layout)
    # float32 y: the scores' rounding (a head_dim-long dot product) shows through the exponent
    assert_close(y.numpy(), expected_y, dtype, reduction_length=sizes["head_dim"] if dtype == "float32" else 1,
                 what="y")
    assert_close(lse.numpy(), expected_lse, "float32", reduction_length=sizes["head_dim"], what="lse")
    return y, lse


def _check_backward(q, k, v, dy, causal, layout, kernel, poisoned, dtype, scale=None):
    runtime = ge2.device.runtime()
    y, lse = _check_forward(q, k, v, causal, layout, kernel, poisoned, dtype, scale)
    outs = tuple(poisoned(x.shape, dtype) for x in (q, k, v))
    grads = attention.backward(*(runtime.DeviceArray.from_numpy(x) for x in (dy, q, k, v)), causal=causal,
                               scale=scale, layout=layout, kernel=kernel, out=outs, y=y, lse=lse)
    # D_i = dy_i . y_i from the stored y, as the kernels take it (attention_checks.py).
    expected = reference_backward_from_stored_y(dy, q, k, v, y.numpy(), causal=causal, scale=scale, layout=layout)
    # Softmax weights sum to one, so the error does not grow with the length: D_i, a head_dim-long dot product, is
    # the largest source.
    head_dim = q.shape[-1]
    for name, got, want in zip("qkv", grads, expected):
        assert_close(got.numpy(), want, dtype, reduction_length=head_dim, what=f"d{name}")


def _check_or_refused(q, k, v, dy, causal, layout, kernel, poisoned, dtype, scale=None):
    """Forward and backward against the reference where ``kernel`` applies; elsewhere both faces must refuse it,
    naming the kernel and the reason. cudnn, where it is not built, is skipped with the reason; cuDNN's SDPA backward
    has no engine for seq_q = seq_k = 1, which it must say."""
    reason = attention._native_module().unsupported_reason(kernel, q.shape[-1], dtype)
    if kernel == "cudnn" and not attention.has_cudnn():
        pytest.skip(reason)
    if kernel == "cudnn" and not reason and q.shape[-2] == k.shape[-2] == 1:
        _check_forward(q, k, v, causal, layout, kernel, poisoned, dtype, scale)
        device = [ge2.device.runtime().DeviceArray.from_numpy(x) for x in (q, k, v, dy)]
        with pytest.raises(RuntimeError, match="kernel 'cudnn': cuDNN has no engine for this problem"):
            attention.backward(device[3], *device[:3], causal=causal, scale=scale, layout=layout, kernel=kernel)
        return
    if not reason:
        _check_backward(q, k, v, dy, causal, layout, kernel, poisoned, dtype, scale)
        return
    device = [ge2.device.runtime().DeviceArray.from_numpy(x) for x in (q, k, v, dy)]
    message = f"kernel: '{kernel}' cannot run this problem: {re.escape(reason)}"
    with pytest.raises(ValueError, match=message):
        attention.forward(*device[:3], causal=causal, scale=scale, layout=layout, kernel=kernel)
    with pytest.raises(ValueError, match=message):
        attention.backward(device[3], *device[:3], causal=causal, scale=scale, layout=layout, kernel=kernel)


HEAD_DIMS = (64, 128, 40, 72, 160)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("seq", (1, 17, 128))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_forward_and_backward(rng, poisoned, kernel, dtype, causal, seq, head_dim):
    q, k, v, dy = _problem(rng, 2, 3, 3, seq, seq, head_dim, dtype)
    _check_or_refused(q, k, v, dy, causal, "bhsd", kernel, poisoned, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_forward_and_backward_1000_rows_large(rng, poisoned, kernel, dtype, causal, head_dim):
    q, k, v, dy = _problem(rng, 2, 3, 3, 1000, 1000, head_dim, dtype)
    _check_or_refused(q, k, v, dy, causal, "bhsd", kernel, poisoned, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("layout", attention.LAYOUTS)
@pytest.mark.parametrize("heads_q,heads_kv,seq_q,seq_k,head_dim", (
    (8, 2, 33, 33, 64), (4, 1, 17, 70, 64), (4, 4, 70, 17, 64), (4, 2, 130, 200, 128), (2, 2, 200, 77, 128),
    (6, 3, 45, 20, 72), (3, 1, 9, 31, 160)))
def test_gqa_and_unequal_lengths(rng, poisoned, kernel, dtype, causal, layout, heads_q, heads_kv, seq_q, seq_k,
                                 head_dim):
    q, k, v, dy = _problem(rng, 2, heads_q, heads_kv, seq_q, seq_k, head_dim, dtype, layout)
    _check_or_refused(q, k, v, dy, causal, layout, kernel, poisoned, dtype, scale=0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("seq,head_dim", ((1000, 64), (4096, 128)))
def test_long_sequences_large(rng, poisoned, kernel, dtype, causal, seq, head_dim):
    q, k, v, dy = _problem(rng, 1, 2, 1, seq, seq, head_dim, dtype)
    _check_or_refused(q, k, v, dy, causal, "bhsd", kernel, poisoned, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", (None, "3000"))
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("layout", attention.LAYOUTS)
@pytest.mark.parametrize("heads_q,heads_kv,seq_q,seq_k,head_dim", ((8, 2, 33, 40, 72), (4, 4, 21, 9, 40)))
def test_unfused_in_chunks(rng, poisoned, monkeypatch, budget, dtype, causal, layout, heads_q, heads_kv, seq_q,
                           seq_k, head_dim):
    """A small score budget cuts the problem into blocks of units and row blocks of one unit (dK, dV added up over
    them, in float32 sums for 16-bit storage); the answer must not change."""
    if budget is not None:
        monkeypatch.setenv("GE2_ATTENTION_SCORE_BUDGET", budget)
    q, k, v, dy = _problem(rng, 3, heads_q, heads_kv, seq_q, seq_k, head_dim, dtype, layout)
    _check_backward(q, k, v, dy, causal, layout, "unfused", poisoned, dtype, scale=0.4)


def _half_ulp(y, dtype):
    """Half the spacing of ``dtype``'s numbers at |y| (float16's subnormal spacing below its normal range)."""
    mantissa_bits, min_exponent = {"float16": (10, -14), "bfloat16": (7, -126)}[dtype]
    exponent = np.floor(np.log2(np.maximum(np.abs(y), 2.0 ** min_exponent)))
    return 2.0 ** (exponent - mantissa_bits - 1)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", (None, "3000"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_unfused_rounds_y_once(rng, poisoned, monkeypatch, budget, dtype):
    """P reaches the P V GEMMs as a 16-bit high and residual part (2^-16 relative apart from P at worst, bfloat16),
    so y is within half an ulp of the float64 reference plus 2^-15 max|v|. P stored in the dtype (rounded once)
    puts about 0.5% of the float16 and 20% of the bfloat16 elements past that bound."""
    if budget is not None:
        monkeypatch.setenv("GE2_ATTENTION_SCORE_BUDGET", budget)
    q, k, v, _ = _problem(rng, 2, 4, 2, 128, 128, 64, dtype, "bshd")
    y_out, lse_out = poisoned(q.shape, dtype), poisoned((2, 4, 128), "float32")
    y, _ = attention.forward(*(ge2.device.runtime().DeviceArray.from_numpy(x) for x in (q, k, v)), causal=True,
                             layout="bshd", kernel="unfused", out=(y_out, lse_out))
    expected, _ = attention.reference(q, k, v, causal=True, layout="bshd")
    got = y.numpy().astype(np.float64)
    excess = np.abs(got - expected) - (_half_ulp(got, dtype) + 2.0 ** -15 * np.abs(v.astype(np.float64)).max())
    assert not np.isnan(got).any()
    assert (excess <= 0).all(), (f"{int((excess > 0).sum())} of {got.size} elements more than half an ulp off, "
                                 f"by up to {excess.max():.3e}")


@pytest.mark.gpu
def test_auto_runs_cudnn_else_flash_else_rowwise_else_unfused(rng, poisoned):
    # The selector's choice, which the face's prepared call names: the first in priority order that runs the problem.
    cudnn = attention.has_cudnn()
    for dtype, head_dim, expected in (("bfloat16", 128, "cudnn" if cudnn else "flash"),
                                      ("float16", 96, "cudnn" if cudnn else "rowwise"), ("float16", 100, "rowwise"),
                                      ("float32", 64, "rowwise"), ("bfloat16", 272, "unfused")):
        host = _problem(rng, 1, 2, 2, 20, 20, head_dim, dtype)[:3]
        q, k, v = (ge2.device.runtime().DeviceArray.from_numpy(x) for x in host)
        assert attention.prepare(q, k, v, causal=True, scale=0.5).kernel == expected, (dtype, head_dim)
        y, lse = poisoned(q.shape, dtype), poisoned((1, 2, 20), "float32")
        attention.forward(q, k, v, causal=True, scale=0.5, out=(y, lse))
        expected_y, _ = attention.reference(*host, causal=True, scale=0.5)
        assert_close(y.numpy(), expected_y, dtype, reduction_length=head_dim if dtype == "float32" else 1,
                     what=f"y ({expected})")


def test_native_entry_points_run_the_kernel_they_are_named():
    """No native call chooses: "auto" is the Python selector's word, and the binding refuses it naming the op."""
    if not ge2._native.is_built("_ops_attention"):
        pytest.skip("_ops_attention is not built")
    native = attention._native_module()
    expected = r"kernel: expected one of cudnn, flash, flash_sm90, rowwise, unfused \(attention's kernels\), got 'auto'"
    with pytest.raises(ValueError, match=expected):
        native.unsupported_reason("auto", 64, "float16")
    with pytest.raises(ValueError, match=expected):
        native.forward(16, 16, 16, 16, 16, batch=1, heads_q=1, heads_kv=1, seq_q=1, seq_k=1, head_dim=64,
                       seq_major=False, scale=1.0, causal=False, dtype="float16", kernel="auto", stream=0)
    with pytest.raises(ValueError, match="kernel: flash is built for head_dim 64 and 128, got head_dim 96"):
        native.forward(16, 16, 16, 16, 16, batch=1, heads_q=1, heads_kv=1, seq_q=1, seq_k=1, head_dim=96,
                       seq_major=False, scale=1.0, causal=False, dtype="float16", kernel="flash", stream=0)
    with pytest.raises(ValueError, match="kernel: flash needs inputs at 16-byte and outputs at 4-byte aligned"):
        native.backward(16, 16, 16, 16, 18, 16, 16, 16, 16, batch=1, heads_q=1, heads_kv=1, seq_q=1, seq_k=1,
                        head_dim=64, seq_major=False, scale=1.0, causal=False, dtype="float16", kernel="flash",
                        stream=0)


@pytest.mark.gpu
def test_flash_refuses_misaligned_arrays_and_auto_falls_back(rng):
    torch = pytest.importorskip("torch")
    shape = (1, 2, 24, 64)
    storage = torch.randn(1 + 3 * math.prod(shape), device="cuda", dtype=torch.float16)
    q, k, v = (storage[1 + i * math.prod(shape):1 + (i + 1) * math.prod(shape)].view(shape) for i in range(3))
    assert q.data_ptr() % 16 != 0
    with pytest.raises(ValueError, match="kernel: flash needs inputs at 16-byte and outputs at 4-byte aligned"):
        attention.forward(q, k, v, kernel="flash")
    if attention.has_cudnn():
        with pytest.raises(RuntimeError, match="kernel 'cudnn': needs 16-byte aligned tensors"):
            attention.forward(q, k, v, kernel="cudnn")
    host = [x.float().cpu().numpy() for x in (q, k, v)]
    expected_y, _ = attention.reference(*host, causal=True)
    dy = torch.randn(shape, device="cuda", dtype=torch.float16)
    expected = attention.reference_backward(dy.float().cpu().numpy(), *host, causal=True)
    for kernel in ("auto", "unfused"):  # auto: cudnn and flash decline, rowwise runs; unfused's GEMMs on 2-byte aligned
        y, lse = attention.forward(q, k, v, causal=True, kernel=kernel)
        assert_close(y.float().cpu().numpy(), expected_y, "float16", what=f"y ({kernel}, misaligned)")
        grads = attention.backward(dy, q, k, v, causal=True, kernel=kernel, y=y, lse=lse)
        for name, got, want in zip("qkv", grads, expected):
            assert_close(got.float().cpu().numpy(), want, "float16", reduction_length=64,
                         what=f"d{name} ({kernel}, misaligned)")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", attention.LAYOUTS)
def test_flash_backward_takes_4_byte_aligned_outputs(layout):
    """flash's outputs need only 4-byte alignment: y (the backward's o, read by the row_dot preprocess) and dq (written
    by dq_store) at 4 bytes past a 16-byte boundary take those kernels' narrow paths."""
    torch = pytest.importorskip("torch")
    batch, heads, seq, head_dim = 2, 3, 77, 64
    shape = (batch, heads, seq, head_dim) if layout == "bhsd" else (batch, seq, heads, head_dim)
    q, k, v, dy = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(4))
    size = math.prod(shape)
    storage = torch.empty(2 + 2 * size, device="cuda", dtype=torch.float16)
    y, dq = (storage[2 + i * size:2 + (i + 1) * size].view(shape) for i in range(2))
    assert y.data_ptr() % 16 == 4 and dq.data_ptr() % 16 == 4  # size * 2 bytes is a multiple of 16
    lse = torch.empty(batch, heads, seq, device="cuda", dtype=torch.float32)
    attention.forward(q, k, v, causal=True, layout=layout, kernel="flash", out=(y, lse))
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    attention.backward(dy, q, k, v, causal=True, layout=layout, kernel="flash", out=(dq, dk, dv), y=y, lse=lse)
    host = [x.float().cpu().numpy() for x in (dy, q, k, v)]
    expected = reference_backward_from_stored_y(*host, y.float().cpu().numpy(), causal=True, layout=layout)
    for name, got, want in zip("qkv", (dq, dk, dv), expected):
        assert_close(got.float().cpu().numpy(), want, "float16", reduction_length=head_dim, what=f"d{name}")


@pytest.mark.gpu
def test_float32_and_numpy_face(rng):
    q, k, v, dy = _problem(rng, 1, 2, 2, 9, 11, 96, "float32")
    y, lse = attention.forward_numpy(q, k, v, causal=True)
    expected_y, expected_lse = attention.reference(q, k, v, causal=True)
    assert_close(y, expected_y, "float32", reduction_length=96, what="y")
    assert_close(lse, expected_lse, "float32", reduction_length=96, what="lse")
    grads = attention.backward_numpy(dy, q, k, v, causal=True)
    for name, got, want in zip("qkv", grads, attention.reference_backward(dy, q, k, v, causal=True)):
        assert_close(got, want, "float32", reduction_length=96, what=f"d{name}")


@pytest.mark.gpu
def test_head_dim_beyond_rowwise_runs_on_unfused(rng):
    q, k, v, dy = _problem(rng, 1, 2, 1, 6, 5, 272, "float16")
    with pytest.raises(ValueError, match="kernel: 'rowwise' cannot run this problem: .*head_dim <= 256, got 272"):
        attention.forward_numpy(q, k, v, kernel="rowwise")
    y, lse = attention.forward_numpy(q, k, v, causal=True)
    expected_y, expected_lse = attention.reference(q, k, v, causal=True)
    assert_close(y, expected_y, "float16", what="y")
    assert_close(lse, expected_lse, "float32", reduction_length=272, what="lse")
    grads = attention.backward_numpy(dy, q, k, v, causal=True)
    for name, got, want in zip("qkv", grads, attention.reference_backward(dy, q, k, v, causal=True)):
        assert_close(got, want, "float16", reduction_length=272, what=f"d{name}")


@pytest.mark.gpu
def test_graph_runs_on_cuda_executor(rng):
    g = Graph("self_attention")
    q = g.input("q", (2, 16, 4, 64), "bfloat16")
    kv = [g.input(name, (2, 16, 2, 64), "bfloat16") for name in "kv"]
    y, _ = g.attention(q, *kv, causal=True, layout="bshd")
    g.output(y, "y")
    feeds = dict(zip("qkv", _problem(rng, 2, 4, 2, 16, 16, 64, "bfloat16", "bshd")))
    executor = ge2.ExecutorV2(g, device="cuda", autotune=False)  # the priority order is what this test pins
    result = executor.run(feeds)
    expected, _ = attention.reference(feeds["q"], feeds["k"], feeds["v"], causal=True, layout="bshd")
    assert_close(result["y"], expected, "bfloat16", what="y")
    expected_kernel = "cudnn" if attention.has_cudnn() else "flash"
    assert {s.op: s.kernel for plan in executor.plans for s in plan.selections} == {"attention": expected_kernel}


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,kernel", ((80, "rowwise"), (272, "unfused")))
def test_graph_selects_rowwise_then_unfused_where_flash_does_not_apply(rng, head_dim, kernel):
    g = Graph("self_attention")
    q, k, v = (g.input(name, (2, 3, 7, head_dim), "float32") for name in "qkv")
    y, _ = g.attention(q, k, v, causal=True)
    g.output(y, "y")
    feeds = dict(zip("qkv", _problem(rng, 2, 3, 3, 7, 7, head_dim, "float32")))
    executor = ge2.ExecutorV2(g, device="cuda", autotune=False)  # the priority order is what this test pins
    result = executor.run(feeds)
    expected, _ = attention.reference(feeds["q"], feeds["k"], feeds["v"], causal=True)
    assert_close(result["y"], expected, "float32", reduction_length=head_dim, what="y")
    assert {s.op: s.kernel for plan in executor.plans for s in plan.selections} == {"attention": kernel}


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,budget", (("auto", None), ("cudnn", None), ("unfused", None), ("unfused", "3000")))
def test_replays_in_a_cuda_graph(rng, monkeypatch, kernel, budget):
    if kernel == "cudnn" and not attention.has_cudnn():
        pytest.skip(attention._native_module().unsupported_reason("cudnn", 64, "float16"))
    if budget is not None:
        monkeypatch.setenv("GE2_ATTENTION_SCORE_BUDGET", budget)
    runtime = ge2.device.runtime()
    stream = runtime.Stream()
    host = _problem(rng, 2, 4, 2, 40, 40, 64, "float16", "bshd")
    q, k, v, dy = (runtime.DeviceArray.from_numpy(x) for x in host)
    y, lse = runtime.DeviceArray.empty(list(q.shape), "float16"), runtime.DeviceArray.empty([2, 4, 40], "float32")
    grads = tuple(runtime.DeviceArray.empty(list(x.shape), "float16") for x in (q, k, v))

    def run():
        attention.forward(q, k, v, causal=True, layout="bshd", kernel=kernel, out=(y, lse), stream=stream)
        attention.backward(dy, q, k, v, causal=True, layout="bshd", kernel=kernel, out=grads, stream=stream, y=y,
                           lse=lse)

    run()  # grows the workspace outside the capture
    stream.synchronize()
    graph = runtime.CudaGraph()
    graph.begin_capture(stream.handle)
    try:
        run()
    except BaseException:
        graph.abort_capture()  # else this thread stays capturing and later CUDA calls (torch's too) fail
        raise
    graph.end_capture()
    fresh = _problem(rng, 2, 4, 2, 40, 40, 64, "float16", "bshd")
    for device_array, values in zip((q, k, v, dy), fresh):
        device_array.copy_from_numpy(values)
    for output in (y, lse, *grads):
        output.poison(stream.handle)
    graph.replay(stream.handle)
    stream.synchronize()
    expected_y, expected_lse = attention.reference(*fresh[:3], causal=True, layout="bshd")
    assert_close(y.numpy(), expected_y, "float16", what="captured y")
    assert_close(lse.numpy(), expected_lse, "float32", reduction_length=64, what="captured lse")
    expected = attention.reference_backward(fresh[3], *fresh[:3], causal=True, layout="bshd")
    for name, got, want in zip("qkv", grads, expected):
        assert_close(got.numpy(), want, "float16", reduction_length=64, what=f"captured d{name}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_interop_is_zero_copy(dtype):
    torch = pytest.importorskip("torch")
    q, k, v, dy = (torch.randn(2, 3, 33, 64, device="cuda", dtype=getattr(torch, dtype)) for _ in range(4))
    y, lse = attention.forward(q, k, v, causal=True)
    assert isinstance(y, torch.Tensor) and isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert_close(y.float().cpu().numpy(), expected.cpu().numpy(), dtype, what="y vs torch")
    grads = attention.backward(dy, q, k, v, causal=True, y=y, lse=lse)
    host = [x.float().cpu().numpy() for x in (q, k, v, dy)]
    for name, got, want in zip("qkv", grads, attention.reference_backward(host[3], *host[:3], causal=True)):
        assert isinstance(got, torch.Tensor)
        assert_close(got.float().cpu().numpy(), want, dtype, reduction_length=64, what=f"d{name}")


@pytest.mark.gpu
def test_cudnn_refuses_to_build_plans_during_capture(rng):
    """A native call on a problem cudnn has no plans for yet refuses to build them inside a capture, with a clear
    error (prepare(), which the registry and the face call first, builds them ahead), and the capture can be
    aborted."""
    if not attention.has_cudnn():
        pytest.skip(attention._native_module().unsupported_reason("cudnn", 64, "float16"))
    runtime = ge2.device.runtime()
    stream = runtime.Stream()
    q, k, v = (runtime.DeviceArray.from_numpy(x) for x in _problem(rng, 1, 2, 2, 43, 43, 64, "float16")[:3])
    y, lse = runtime.DeviceArray.empty([1, 2, 43, 64], "float16"), runtime.DeviceArray.empty([1, 2, 43], "float32")
    graph = runtime.CudaGraph()
    graph.begin_capture(stream.handle)
    try:
        with pytest.raises(RuntimeError, match="kernel 'cudnn' must build its cuDNN plans before CUDA graph capture; "
                                               "run the problem once on this stream first"):
            attention._native_module().forward(q.ptr, k.ptr, v.ptr, y.ptr, lse.ptr, batch=1, heads_q=2, heads_kv=2,
                                               seq_q=43, seq_k=43, head_dim=64, seq_major=False, scale=0.25,
                                               causal=True, dtype="float16", kernel="cudnn", stream=stream.handle)
    finally:
        graph.abort_capture()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("other", ("flash", "rowwise"))
def test_cudnn_lse_and_the_other_kernels_lse_are_interchangeable(rng, poisoned, dtype, causal, other):
    """cuDNN's Stats is GE2's lse: cudnn's forward feeds flash's and rowwise's backward, and theirs feed cudnn's."""
    if not attention.has_cudnn():
        pytest.skip(attention._native_module().unsupported_reason("cudnn", 64, "float16"))
    runtime = ge2.device.runtime()
    host = _problem(rng, 2, 4, 2, 70, 90, 64, dtype, "bshd")
    q, k, v, dy = (runtime.DeviceArray.from_numpy(x) for x in host)
    expected_y, expected_lse = attention.reference(*host[:3], causal=causal, scale=0.3, layout="bshd")
    expected = attention.reference_backward(host[3], *host[:3], causal=causal, scale=0.3, layout="bshd")
    for forward_kernel, backward_kernel in (("cudnn", other), (other, "cudnn")):
        outs = (poisoned(host[0].shape, dtype), poisoned((2, 4, 70), "float32"))
        y, lse = attention.forward(q, k, v, causal=causal, scale=0.3, layout="bshd", kernel=forward_kernel, out=outs)
        assert_close(y.numpy(), expected_y, dtype, what=f"y ({forward_kernel})")
        assert_close(lse.numpy(), expected_lse, "float32", reduction_length=64, what=f"lse ({forward_kernel})")
        grads = attention.backward(dy, q, k, v, causal=causal, scale=0.3, layout="bshd", kernel=backward_kernel,
                                   out=tuple(poisoned(x.shape, dtype) for x in host[:3]), y=y, lse=lse)
        for name, got, want in zip("qkv", grads, expected):
            assert_close(got.numpy(), want, dtype, reduction_length=64,
                         what=f"d{name} ({backward_kernel} from {forward_kernel}'s lse)")
