"""attention's flash_sm90 candidate (forward and backward on Hopper's wgmma and TMA, sm_90a, CuTe): its kernels() row,
its declines with their reasons, forward and backward (CPU); y, lse and dq, dk, dv against the float64 reference for
both dtypes, head_dim 64, 128 and 256, causal and not, seq 1, odd lengths, seq_q != seq_k, both layouts and grouped K/V
heads, with poisoned outputs, and the lse contract with another candidate both ways (GPU, an sm_90 device and a
CUTLASS build)."""
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
from test_attention import _check_backward, _check_forward

KERNEL = "flash_sm90"


def _native():
    return attention._native_module()


def _reason(head_dim=64, dtype="float16", bias=False, causal=False, window=(-1, -1), softcap=0.0):
    return _native().unsupported_reason(KERNEL, head_dim, dtype, bias, seq_q=9, seq_k=9, causal=causal,
                                        window_left=window[0], window_right=window[1], softcap=softcap)


def _row():
    return next(row for row in attention.kernels() if row["name"] == KERNEL)


# ---------------------------------------------------------------------------------------------------------------
# CPU: the table, the declines, the backward's workspace
# ---------------------------------------------------------------------------------------------------------------
def test_row_states_the_candidate():
    row = _row()
    assert row["priority"] == 15  # below flash (20) until the H200 has checked it; above rowwise (10)
    assert all(word in row["description"] for word in ("wgmma", "TMA", "Forward:", "Backward:"))
    assert "head_dim 64, 128 or 256" in row["constraints"] and "no bias, window or soft cap" in row["constraints"]
    assert not row["fallback"]
    built = "NOT BUILT" not in _reason()
    assert ("NOT BUILT" in row["description"]) == (not built)


def test_backward_has_the_forwards_candidates_and_flashs_workspace():
    forward = [c.name for c in selection.candidates(ge2.ops.OPS["attention"])]
    backward = [c.name for c in selection.candidates(ge2.ops.OPS["attention_backward"])]
    assert KERNEL in forward and backward == forward
    # D_i (batch * heads_q * seq_q floats) and the float32 dQ accumulator (head_dim floats per row), as flash's
    rows = 3 * 4 * 9
    for layout_bshd in (False, True):
        assert _native().workspace_bytes(KERNEL, 3, 4, 2, 9, 11, 64, layout_bshd, "float16", True) == rows * 4 * 65
        assert (_native().workspace_bytes(KERNEL, 3, 4, 2, 9, 11, 64, layout_bshd, "float16", True) ==
                _native().workspace_bytes("flash", 3, 4, 2, 9, 11, 64, layout_bshd, "float16", True))
    assert _native().workspace_bytes(KERNEL, 1, 2, 2, 9, 9, 64, False, "float16", False) == 0


@pytest.mark.parametrize("problem,reason", (
    (dict(head_dim=40), "flash_sm90 is built for head_dim 64, 128 and 256, got head_dim 40"),
    (dict(head_dim=96, dtype="bfloat16"), "flash_sm90 is built for head_dim 64, 128 and 256, got head_dim 96"),
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
    # and the backward's: (dy, q, k, v, y, lse[, bias])
    lse = TensorType((1, 2, 9), "float32")
    backward_inputs = (q, *inputs[:3], q, lse, *inputs[3:])
    candidate = next(c for c in ge2.ops.OPS["attention_backward"].candidates if c.name == KERNEL)
    assert candidate.supports(ge2.ops.Problem(op="attention_backward", in_types=backward_inputs, out_types=(),
                                              attrs=attrs)) == reason


@pytest.mark.parametrize("head_dim,dtype", ((64, "float16"), (128, "bfloat16"), (256, "float16")))
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


def _head_dim_id(head_dim):  # test ids name it, so that `-k head_dim256` selects one head_dim's cases
    return f"head_dim{head_dim}"


def _problem(rng, batch, heads_q, heads_kv, seq_q, seq_k, head_dim, dtype, layout):
    arrays = [random_array(rng, (batch, heads, seq, head_dim), dtype)
              for heads, seq in ((heads_q, seq_q), (heads_kv, seq_k), (heads_kv, seq_k), (heads_q, seq_q))]
    return [x if layout == "bhsd" else np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in arrays]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("head_dim", (64, 128, 256), ids=_head_dim_id)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("seq", (1, 7, 129, 1000))
def test_forward_and_backward_match_the_reference(rng, poisoned, dtype, head_dim, causal, seq):
    """y and lse, then dq, dk, dv from them: one tile (1, 7), a partial second (129), many (1000: 8 key tiles, 13 at
    head_dim 256, the backward's causal CTAs skipping the query tiles above their keys)."""
    _require_flash_sm90()
    q, k, v, dy = _problem(rng, 2, 3, 3, seq, seq, head_dim, dtype, "bhsd")
    _check_backward(q, k, v, dy, causal, "bhsd", KERNEL, poisoned, dtype)


_GROUPED_SHAPES = ((8, 2, 33, 33, 64), (4, 1, 7, 129, 64), (4, 4, 129, 7, 128), (4, 2, 130, 1000, 128),
                   (2, 2, 1000, 77, 64), (2, 1, 1, 1000, 128), (3, 3, 256, 256, 128))
_GROUPED_SHAPES += tuple(shape[:-1] + (256,) for shape in _GROUPED_SHAPES)


def _grouped_shape_id(shape):
    heads_q, heads_kv, seq_q, seq_k, head_dim = shape
    return f"heads{heads_q}_{heads_kv}-seq{seq_q}_{seq_k}-{_head_dim_id(head_dim)}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("layout", attention.LAYOUTS)
@pytest.mark.parametrize("heads_q,heads_kv,seq_q,seq_k,head_dim", _GROUPED_SHAPES,
                         ids=[_grouped_shape_id(shape) for shape in _GROUPED_SHAPES])
def test_grouped_heads_unequal_lengths_and_layouts(rng, poisoned, dtype, causal, layout, heads_q, heads_kv, seq_q,
                                                   seq_k, head_dim):
    """Grouped K/V heads (a backward CTA walks every query head of its group: one writer of dk, dv), seq_q != seq_k
    both ways (causal, top-left: keys past seq_q see no query, their dk, dv are 0), both layouts."""
    _require_flash_sm90()
    q, k, v, dy = _problem(rng, 2, heads_q, heads_kv, seq_q, seq_k, head_dim, dtype, layout)
    _check_backward(q, k, v, dy, causal, layout, KERNEL, poisoned, dtype, scale=0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("head_dim", (64, 128, 256), ids=_head_dim_id)
@pytest.mark.parametrize("causal", (False, True))
def test_long_sequences_wrap_the_pipelines(rng, poisoned, dtype, head_dim, causal):
    """2048 keys and queries, 2 query heads per K/V head: the forward's 16 K/V tiles (26 at head_dim 256) and the
    backward's 32 (head_dim 128 and 256) or 16 (64) Q/dO tiles per head through their 2-stage rings, and the
    backward's double-buffered dS (and P at head_dim 256)."""
    _require_flash_sm90()
    q, k, v, dy = _problem(rng, 1, 2, 1, 2048, 2048, head_dim, dtype, "bshd")
    _check_backward(q, k, v, dy, causal, "bshd", KERNEL, poisoned, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", (64, 128), ids=_head_dim_id)  # head_dim 256 runs an item a CTA
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("layout", attention.LAYOUTS)
def test_persistent_ctas_walk_several_work_items(rng, poisoned, monkeypatch, head_dim, causal, layout):
    """Persistent forward CTAs (forced on, causal too): 4 x 8 heads x 9 query blocks of 128 (the last of 6 rows) are
    288 work items for the H200's 132 CTAs, so a CTA runs 2 or 3 items of different key tile counts (700 keys) and
    its K/V ring, Q tile and O tile turn over between them."""
    _require_flash_sm90()
    monkeypatch.setenv("GE2_FLASH_SM90_PERSISTENT", "1")
    q, k, v, dy = _problem(rng, 4, 8, 2, 1030, 700, head_dim, "bfloat16", layout)
    _check_backward(q, k, v, dy, causal, layout, KERNEL, poisoned, "bfloat16", scale=0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", (64, 128), ids=_head_dim_id)
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("seq_k", (100, 300))
def test_persistent_ctas_walk_short_items(rng, poisoned, monkeypatch, head_dim, causal, seq_k):
    """Persistent forward CTAs over 4 x 8 heads x 16 query blocks (2000 rows) = 512 items of few key tiles: 100 keys
    make every item one tile (a CTA's items turn over at every tile: Q's two buffers alternate, each consumer stores
    its O rows every tile), 300 three (the last partial; causal, the first blocks see one or two)."""
    _require_flash_sm90()
    monkeypatch.setenv("GE2_FLASH_SM90_PERSISTENT", "1")
    q, k, v, _ = _problem(rng, 4, 8, 2, 2000, seq_k, head_dim, "float16", "bhsd")
    _check_forward(q, k, v, causal, "bhsd", KERNEL, poisoned, "float16", scale=0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", (64, 128, 256), ids=_head_dim_id)
@pytest.mark.parametrize("causal", (False, True))
def test_folded_scale_keeps_a_negative_scale_right(rng, poisoned, head_dim, causal):
    """The forward folds the scale into each score's exp2, so its row statistics come from the raw scores: their
    max for scale > 0, their min (masked scores +inf) for scale < 0. At -0.3 a key tile's scaled scores span more
    than 2^16 a row, so a max taken the wrong way round would overflow P's float16 (300 keys: a partial third tile)."""
    _require_flash_sm90()
    q, k, v, _ = _problem(rng, 2, 4, 2, 300, 300, head_dim, "float16", "bhsd")
    _check_forward(q, k, v, causal, "bhsd", KERNEL, poisoned, "float16", scale=-0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("section_heads", ("1", "5"))
def test_forward_section_heads_override_runs_every_item(rng, poisoned, monkeypatch, section_heads):
    """GE2_FLASH_SM90_SECTION_HEADS (for measurements) sets the forward's heads per L2 section, so the order of its
    work items: 1 runs head after head, 5 makes 6 sections of 5 of the 4 x 8 query heads and a last of 2 (9 query
    blocks a head, persistent CTAs). Every item still runs once."""
    _require_flash_sm90()
    monkeypatch.setenv("GE2_FLASH_SM90_PERSISTENT", "1")
    monkeypatch.setenv("GE2_FLASH_SM90_SECTION_HEADS", section_heads)
    q, k, v, _ = _problem(rng, 4, 8, 2, 1030, 700, 128, "float16", "bhsd")
    _check_forward(q, k, v, False, "bhsd", KERNEL, poisoned, "float16", scale=0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
def test_forward_short_rows_take_a_wave_of_whole_heads_a_section(rng, poisoned, dtype):
    """Persistent non-causal rows of at most 8 query blocks run in sections of as many heads as one wave of CTAs runs
    whole: 3 x 27 query heads of 3 blocks (300 queries, a partial last block) are 243 items, so sections of
    ceil(SMs / 3) heads and a narrower last one (132 SMs: 44, 37)."""
    _require_flash_sm90()
    q, k, v, _ = _problem(rng, 3, 27, 9, 300, 260, 128, dtype, "bhsd")
    _check_forward(q, k, v, False, "bhsd", KERNEL, poisoned, dtype)


@pytest.mark.gpu
def test_forward_heads_in_l2_sections(rng, poisoned):
    """16384 keys of head_dim 128: each head's K and V take 8 MB, so the forward's CTAs run in L2 sections of 3 heads
    and a last one of 1 (of batch 2 x 2 heads), each head's 2 query blocks found from the CTA's linear index."""
    _require_flash_sm90()
    q, k, v, _ = _problem(rng, 2, 2, 2, 129, 16384, 128, "float16", "bhsd")
    _check_forward(q, k, v, False, "bhsd", KERNEL, poisoned, "float16")


@pytest.mark.gpu
def test_backward_heads_in_l2_sections(rng, poisoned):
    """8192 queries of head_dim 128: each K/V head's Q, dO and dQ accumulator rows take 8 MB, so the backward's CTAs
    run in L2 sections of 3 heads and a last one of 1, each head's 2 key blocks found from the CTA's linear index."""
    _require_flash_sm90()
    q, k, v, dy = _problem(rng, 2, 2, 2, 8192, 129, 128, "float16", "bhsd")
    _check_backward(q, k, v, dy, False, "bhsd", KERNEL, poisoned, "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16"))
@pytest.mark.parametrize("causal", (False, True))
@pytest.mark.parametrize("other,head_dim", (("flash", 128), ("rowwise", 256)),  # flash stops at head_dim 128
                         ids=("flash-head_dim128", "rowwise-head_dim256"))
@pytest.mark.parametrize("sm90_first", (True, False))
def test_backward_reads_the_other_kernels_lse(rng, poisoned, dtype, causal, other, head_dim, sm90_first):
    """The lse contract both ways: another kernel's backward from flash_sm90's y and lse, and flash_sm90's from the
    other's."""
    _require_flash_sm90()
    forward_kernel, backward_kernel = (KERNEL, other) if sm90_first else (other, KERNEL)
    runtime = ge2.device.runtime()
    q, k, v, dy = _problem(rng, 2, 4, 2, 129, 200, head_dim, dtype, "bhsd")
    y, lse = _check_forward(q, k, v, causal, "bhsd", forward_kernel, poisoned, dtype)
    device = [runtime.DeviceArray.from_numpy(x) for x in (dy, q, k, v)]
    outs = tuple(poisoned(x.shape, dtype) for x in (q, k, v))
    grads = attention.backward(*device, causal=causal, kernel=backward_kernel, out=outs, y=y, lse=lse)
    expected = reference_backward_from_stored_y(dy, q, k, v, y.numpy(), causal=causal)
    for name, got, want in zip("qkv", grads, expected):
        assert_close(got.numpy(), want, dtype, reduction_length=q.shape[-1],
                     what=f"d{name}: {backward_kernel}'s backward from {forward_kernel}'s lse")


@pytest.mark.gpu
def test_declined_problem_is_refused_by_name(rng):
    _require_flash_sm90()
    runtime = ge2.device.runtime()
    q, k, v, dy = _problem(rng, 1, 2, 2, 9, 9, 64, "float16", "bhsd")
    device = [runtime.DeviceArray.from_numpy(x) for x in (q, k, v)]
    refused = re.escape(f"kernel: '{KERNEL}' cannot run this problem: flash_sm90 takes no sliding window")
    with pytest.raises(ValueError, match=refused):
        attention.forward(*device, window=(2, 0), kernel=KERNEL)
    y, lse = attention.forward(*device, window=(2, 0), kernel="flash")
    with pytest.raises(ValueError, match=refused):
        attention.backward(runtime.DeviceArray.from_numpy(dy), *device, window=(2, 0), kernel=KERNEL, y=y, lse=lse)


@pytest.mark.gpu
def test_misaligned_arrays_are_refused_by_name():
    """TMA reads and writes 16-byte aligned rows (inputs, O): both passes refuse other addresses before launching
    anything (the addresses below are never read)."""
    _require_flash_sm90()
    sizes = dict(batch=1, heads_q=1, heads_kv=1, seq_q=1, seq_k=1, head_dim=64, seq_major=False, scale=1.0,
                 causal=False, dtype="float16", kernel=KERNEL, stream=0)
    refused = "kernel: flash_sm90 needs inputs and outputs at 16-byte aligned addresses"
    with pytest.raises(ValueError, match=refused):
        _native().forward(24, 16, 16, 16, 16, **sizes)  # q
    with pytest.raises(ValueError, match=refused):
        _native().forward(16, 16, 16, 20, 16, **sizes)  # o: 4-byte aligned, as flash would take it
    with pytest.raises(ValueError, match=refused):
        _native().backward(16, 16, 16, 16, 16, 16, 16, 16, 18, **sizes)  # dv
