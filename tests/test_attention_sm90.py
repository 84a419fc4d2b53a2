"""attention's flash_sm90 candidate (the forward on Hopper's wgmma and TMA, sm_90a, CuTe): its kernels() row, its
declines with their reasons and its absence from the backward's candidates (CPU); y and lse against the float64
reference for both dtypes, head_dim 64 and 128, causal and not, odd lengths, both layouts and grouped K/V heads, with
poisoned outputs, and another candidate's backward from its lse (GPU, an sm_90 device and a CUTLASS build)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir import TensorType
from graph_executor_v2.ops import attention
from graph_executor_v2.testing import assert_close, random_array
from attention_checks import reference_backward_from_stored_y
from test_attention import _check_forward

KERNEL = "flash_sm90"
FORWARD_ONLY = "kernel: flash_sm90 runs the forward only (the backward: cudnn, flash, rowwise, unfused)"


def _native():
    return attention._native_module()


def _reason(head_dim=64, dtype="float16", bias=False, causal=False, window=(-1, -1), softcap=0.0):
    return _native().unsupported_reason(KERNEL, head_dim, dtype, bias, seq_q=9, seq_k=9, causal=causal,
                                        window_left=window[0], window_right=window[1], softcap=softcap)


def _row():
    return next(row for row in attention.kernels() if row["name"] == KERNEL)


# ---------------------------------------------------------------------------------------------------------------
# CPU: the table, the declines, forward only
# ---------------------------------------------------------------------------------------------------------------
def test_row_states_the_candidate():
    row = _row()
    assert row["priority"] == 15  # below flash (20) until the H200 has checked it; above rowwise (10)
    assert "forward only" in row["description"] and "wgmma" in row["description"] and "TMA" in row["description"]
    assert "head_dim 64 or 128" in row["constraints"] and "no bias, window or soft cap" in row["constraints"]
    assert not row["fallback"]
    built = "NOT BUILT" not in _reason()
    assert ("NOT BUILT" in row["description"]) == (not built)


def test_backward_has_no_flash_sm90_candidate():
    forward = [c.name for c in selection.candidates(ge2.ops.OPS["attention"])]
    backward = [c.name for c in selection.candidates(ge2.ops.OPS["attention_backward"])]
    assert KERNEL in forward and KERNEL not in backward
    assert backward == [name for name in forward if name != KERNEL]
    with pytest.raises(ValueError, match=re.escape(FORWARD_ONLY)):
        _native().workspace_bytes(KERNEL, 1, 2, 2, 9, 9, 64, False, "float16", True)
    assert _native().workspace_bytes(KERNEL, 1, 2, 2, 9, 9, 64, False, "float16", False) == 0


@pytest.mark.parametrize("problem,reason", (
    (dict(head_dim=40), "flash_sm90 is built for head_dim 64 and 128, got head_dim 40"),
    (dict(head_dim=256, dtype="bfloat16"), "flash_sm90 is built for head_dim 64 and 128, got head_dim 256"),
    (dict(dtype="float32"), "flash_sm90 runs float16 and bfloat16 on wgmma: got float32"),
    (dict(bias=True), "flash_sm90 takes no additive bias (cudnn and rowwise do)"),
    (dict(window=(4, -1), causal=True), "flash_sm90 takes no sliding window (flash, rowwise and unfused do)"),
    (dict(window=(-1, 0)), "flash_sm90 takes no sliding window (flash, rowwise and unfused do)"),
    (dict(softcap=30.0), "flash_sm90 takes no soft cap (flash, rowwise and unfused do)"),
))
def test_declines_with_the_reason(problem, reason):
    got = _reason(**problem)
    if got.startswith("flash_sm90 is NOT BUILT: "):  # a build without CUTLASS declines everything, first
        assert got == _reason(head_dim=128, dtype="bfloat16")
        return
    assert got == reason
    # the selector's check (the forward OpDef's candidate) says the same
    head_dim, dtype = problem.get("head_dim", 64), problem.get("dtype", "float16")
    q = TensorType((1, 2, 9, head_dim), dtype)
    inputs = (q, q, q) + ((TensorType((1, 1, 9, 9), dtype),) if problem.get("bias") else ())
    attrs = {"causal": problem.get("causal", False), "scale": None, "layout": "bhsd",
             "window": problem.get("window", (-1, -1)), "softcap": problem.get("softcap", 0.0)}
    candidate = next(c for c in ge2.ops.OPS["attention"].candidates if c.name == KERNEL)
    assert candidate.supports(ge2.ops.Problem(op="attention", in_types=inputs, out_types=(), attrs=attrs)) == reason


@pytest.mark.parametrize("head_dim,dtype", ((64, "float16"), (128, "bfloat16")))
@pytest.mark.parametrize("causal", (False, True))
def test_runs_its_problems_only_built_and_on_sm90(head_dim, dtype, causal):
    """A problem it takes: declined only for the build (NOT BUILT, why) or the device (not sm_90, which)."""
    reason = _reason(head_dim, dtype, causal=causal)
    assert reason == "" or re.fullmatch(r"flash_sm90 is NOT BUILT: .+|flash_sm90 needs an sm_90 GPU \(built for "
                                        r"sm_90a: wgmma and TMA\), this device is (absent|sm_\d+)", reason), reason


# ---------------------------------------------------------------------------------------------------------------
# GPU: numbers against the float64 reference
# ---------------------------------------------------------------------------------------------------------------
def _require_flash_sm90():
    reason = _reason()
    if reason:
        pytest.skip(reason)


def _problem(rng, batch, heads_q, heads_kv, seq_q, seq_k, head_dim, dtype, layout):
    arrays = [random_array(rng, (batch, heads, seq, head_dim), dtype)
              for heads, seq in ((heads_q, seq_q), (heads_kv, seq_k), (heads_kv, seq_k), (heads_q, seq_q))]
    return [x if layout == "bhsd" else np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in arrays]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("head_dim", (64, 128))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("seq", (1, 7, 129, 1000))
def test_forward_matches_the_reference(rng, poisoned, dtype, head_dim, causal, seq):
    _require_flash_sm90()
    q, k, v, _ = _problem(rng, 2, 3, 3, seq, seq, head_dim, dtype, "bhsd")
    _check_forward(q, k, v, causal, "bhsd", KERNEL, poisoned, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("layout", attention.LAYOUTS)
@pytest.mark.parametrize("heads_q,heads_kv,seq_q,seq_k,head_dim", (
    (8, 2, 33, 33, 64), (4, 1, 7, 129, 64), (4, 4, 129, 7, 128), (4, 2, 130, 1000, 128), (2, 2, 1000, 77, 64),
    (2, 1, 1, 1000, 128), (3, 3, 256, 256, 128)))
def test_grouped_heads_unequal_lengths_and_layouts(rng, poisoned, dtype, causal, layout, heads_q, heads_kv, seq_q,
                                                   seq_k, head_dim):
    _require_flash_sm90()
    q, k, v, _ = _problem(rng, 2, heads_q, heads_kv, seq_q, seq_k, head_dim, dtype, layout)
    _check_forward(q, k, v, causal, layout, KERNEL, poisoned, dtype, scale=0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("causal", (False, True))
def test_long_rows_wrap_the_pipeline(rng, poisoned, dtype, causal):
    """2048 keys: 16 K/V tiles through the 2-stage ring of every CTA (8 passes of each stage's barriers)."""
    _require_flash_sm90()
    q, k, v, _ = _problem(rng, 1, 2, 1, 2048, 2048, 128, dtype, "bshd")
    _check_forward(q, k, v, causal, "bshd", KERNEL, poisoned, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("causal", (False, True))
def test_backward_reads_its_lse(rng, poisoned, dtype, causal):
    """The lse contract: flash's backward from flash_sm90's y and lse gives the reference gradients; flash_sm90 named
    for the backward is refused."""
    _require_flash_sm90()
    runtime = ge2.device.runtime()
    q, k, v, dy = _problem(rng, 2, 4, 2, 129, 200, 128, dtype, "bhsd")
    y, lse = _check_forward(q, k, v, causal, "bhsd", KERNEL, poisoned, dtype)
    device = [runtime.DeviceArray.from_numpy(x) for x in (dy, q, k, v)]
    outs = tuple(poisoned(x.shape, dtype) for x in (q, k, v))
    grads = attention.backward(*device, causal=causal, kernel="flash", out=outs, y=y, lse=lse)
    expected = reference_backward_from_stored_y(dy, q, k, v, y.numpy(), causal=causal)
    for name, got, want in zip("qkv", grads, expected):
        assert_close(got.numpy(), want, dtype, reduction_length=q.shape[-1], what=f"d{name} from flash_sm90's lse")
    with pytest.raises(ValueError, match="kernel: 'flash_sm90' cannot run this problem: attention_backward has no "
                                         "kernel 'flash_sm90'"):
        attention.backward(*device, causal=causal, kernel=KERNEL, y=y, lse=lse)


@pytest.mark.gpu
def test_declined_problem_is_refused_by_name(rng):
    _require_flash_sm90()
    runtime = ge2.device.runtime()
    q, k, v, _ = _problem(rng, 1, 2, 2, 9, 9, 64, "float16", "bhsd")
    device = [runtime.DeviceArray.from_numpy(x) for x in (q, k, v)]
    with pytest.raises(ValueError, match=re.escape(f"kernel: '{KERNEL}' cannot run this problem: flash_sm90 takes "
                                                   "no sliding window")):
        attention.forward(*device, window=(2, 0), kernel=KERNEL)
