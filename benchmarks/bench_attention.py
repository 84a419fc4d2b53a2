"""attention: every GE2 kernel candidate (cudnn where it is built, flash, flash_sm90, rowwise, unfused: a row each) vs
torch.nn.functional.scaled_dot_product_attention, forward and forward+backward, float16 and bfloat16, one process,
one GPU. Correctness against PyTorch first, then times: the median of one call from an idle device (host time
included) and the device time per call in a CUDA graph replay (no host time: kernel against kernel).

Targets (issue 9): the op (best candidate) >= 1.0x PyTorch forward and >= 0.95x forward+backward at every row;
GE2's own flash kernel >= 0.8x forward and >= 0.7x forward+backward at the head_dim-128 rows. Sliding-window rows
(issue 23: ``window=(left, right)``) run PyTorch's SDPA with the same band as an explicit boolean mask.
flash_sm90 (issue 23) >= 0.9x forward and >= 0.8x forward+backward at the head_dim-128 rows. A kernel that declines
a row's problem (flash_sm90: windows) is left out of it, with the reason.

Run: python benchmarks/bench_attention.py [--quick] [--kernel NAME[,NAME...]]
"""
from __future__ import annotations

import sys

from harness import graph_replay_ms, median_ms, torch_cuda, write_results

import numpy as np

from graph_executor_v2.ops import attention

NO_WINDOW = (-1, -1)
# (batch, heads, seq, head_dim, causal, window)
SHAPES = [(8, 12, 1024, 64, True, NO_WINDOW), (8, 12, 1024, 64, False, NO_WINDOW), (4, 16, 4096, 128, True, NO_WINDOW),
          (16, 16, 512, 128, False, NO_WINDOW), (1, 32, 8192, 128, True, NO_WINDOW),
          # head_dim 256 (Gemma's)
          (4, 16, 2048, 256, True, NO_WINDOW), (8, 8, 1024, 256, False, NO_WINDOW),
          # sliding windows: Mistral's (4096 keys back, none ahead) and a symmetric local band
          (2, 16, 8192, 128, False, (4095, 0)), (4, 16, 4096, 128, False, (256, 256)),
          (8, 12, 2048, 64, True, (512, -1))]
QUICK_SHAPES = SHAPES[:2] + SHAPES[-1:]


def _relative_error(actual, expected):
    return ((actual.float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-6)).item()


def _band_mask(torch, seq, causal, window):
    """The window (and causal mask) as PyTorch's boolean attn_mask [seq, seq] (True: attend), None without a window."""
    if window == NO_WINDOW:
        return None
    begin, end = attention.visible_keys(seq, seq, causal, window)
    keys = np.arange(seq)
    return torch.from_numpy((keys >= begin[:, None]) & (keys < end[:, None])).to("cuda")


def bench_shape(torch, batch, heads, seq, head_dim, causal, window, dtype_name, kernel):
    F = torch.nn.functional
    dtype = getattr(torch, dtype_name)
    q, k, v, dy = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=dtype) for _ in range(4))
    y = torch.empty_like(q)
    lse = torch.empty(batch, heads, seq, device="cuda", dtype=torch.float32)
    grads = tuple(torch.empty_like(x) for x in (q, k, v))

    def ge2_forward(stream=None):
        attention.forward(q, k, v, causal=causal, window=window, kernel=kernel, out=(y, lse), stream=stream)

    def ge2_forward_backward(stream=None):
        ge2_forward(stream)
        attention.backward(dy, q, k, v, causal=causal, window=window, kernel=kernel,
                           out=grads, y=y, lse=lse, stream=stream)

    def on_current_stream(fn):  # what a graph capture records
        return lambda: fn(torch.cuda.current_stream())

    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    # A window goes to PyTorch as an explicit mask (which holds causal too); is_causal takes no mask.
    mask = _band_mask(torch, seq, causal, window)
    masking = dict(is_causal=causal) if mask is None else dict(attn_mask=mask)

    def torch_forward():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, **masking)

    def torch_forward_backward():
        out = F.scaled_dot_product_attention(*leaves, **masking)
        return torch.autograd.grad(out, leaves, dy)

    ge2_forward_backward()
    tolerance = 2e-2 if dtype_name == "bfloat16" else 5e-3
    errors = {"y": _relative_error(y, torch_forward())}
    errors.update({f"d{name}": _relative_error(got, want)
                   for name, got, want in zip("qkv", grads, torch_forward_backward())})
    worst = max(errors.values())
    if not worst < tolerance:
        raise AssertionError(f"GE2 {kernel} disagrees with torch at {(batch, heads, seq, head_dim, causal, window)} "
                             f"{dtype_name}: {errors}")

    reps = dict(warmup=3, reps=10)
    times = {"ge2_fwd_ms": median_ms(ge2_forward, **reps), "torch_fwd_ms": median_ms(torch_forward, **reps),
             "ge2_fwdbwd_ms": median_ms(ge2_forward_backward, **reps),
             "torch_fwdbwd_ms": median_ms(torch_forward_backward, **reps),
             "ge2_fwd_graph_ms": graph_replay_ms(on_current_stream(ge2_forward)),
             "torch_fwd_graph_ms": graph_replay_ms(torch_forward),
             "ge2_fwdbwd_graph_ms": graph_replay_ms(on_current_stream(ge2_forward_backward)),
             "torch_fwdbwd_graph_ms": graph_replay_ms(torch_forward_backward)}
    # Forward FLOPs: two GEMMs of 2 * head_dim per head and visible score (seq^2, halved by a causal mask, the band's
    # scores under a window); backward is 2.5x that.
    if window == NO_WINDOW:
        scores = seq * seq * (0.5 if causal else 1.0)
    else:
        begin, end = attention.visible_keys(seq, seq, causal, window)
        scores = float(np.maximum(end - begin, 0).sum())
    flops = 4.0 * batch * heads * head_dim * scores
    band = "" if window == NO_WINDOW else f",w={window[0]}:{window[1]}"
    row = {"shape": f"({batch},{heads},{seq},{head_dim},{'T' if causal else 'F'}{band})", "dtype": dtype_name,
           "kernel": kernel, **times, "max_rel_err": worst,
           "ge2_fwd_tflops": flops / (times["ge2_fwd_graph_ms"] * 1e-3) / 1e12,
           "vs_torch_fwd": times["torch_fwd_ms"] / times["ge2_fwd_ms"],
           "vs_torch_fwdbwd": times["torch_fwdbwd_ms"] / times["ge2_fwdbwd_ms"],
           "vs_torch_fwd_graph": times["torch_fwd_graph_ms"] / times["ge2_fwd_graph_ms"],
           "vs_torch_fwdbwd_graph": times["torch_fwdbwd_graph_ms"] / times["ge2_fwdbwd_graph_ms"]}
    row["op_target_met"] = _target(row, 1.0, 0.95, "")
    row["op_target_graph_met"] = _target(row, 1.0, 0.95, "_graph")
    row["flash_target_met"] = _target(row, 0.8, 0.7, "_graph") if kernel == "flash" and head_dim == 128 else "-"
    row["sm90_target_met"] = _target(row, 0.9, 0.8, "_graph") if kernel == "flash_sm90" and head_dim == 128 else "-"
    return row


def _target(row, forward, forward_backward, timing):
    misses = [name for name, ratio, target in (("fwd", row[f"vs_torch_fwd{timing}"], forward),
                                               ("fwd+bwd", row[f"vs_torch_fwdbwd{timing}"], forward_backward))
              if ratio < target]
    return ("NO (" + ",".join(misses) + ")") if misses else "yes"


def main():
    torch = torch_cuda()
    shapes = QUICK_SHAPES if "--quick" in sys.argv else SHAPES
    candidates = [entry["name"] for entry in attention.kernels() if entry["name"] != "cudnn" or attention.has_cudnn()]
    if "--kernel" in sys.argv:
        candidates = sys.argv[sys.argv.index("--kernel") + 1].split(",")
    rows = []
    for batch, heads, seq, head_dim, causal, window in shapes:
        for dtype_name in ("float16", "bfloat16"):
            for kernel in candidates:
                declined = attention._native_module().unsupported_reason(
                    kernel, head_dim, dtype_name, seq_q=seq, seq_k=seq, causal=causal, window_left=window[0],
                    window_right=window[1])
                if declined:
                    print(f"{kernel} left out of {(batch, heads, seq, head_dim, causal, window)} {dtype_name}: "
                          f"{declined}", flush=True)
                    continue
                rows.append(bench_shape(torch, batch, heads, seq, head_dim, causal, window, dtype_name, kernel))
                print(rows[-1], flush=True)
    columns = [("shape", "(B,H,S,D,causal[,w=left:right])"), ("dtype", "dtype"), ("kernel", "kernel"),
               ("ge2_fwd_ms", "GE2 fwd ms"), ("torch_fwd_ms", "torch fwd ms"), ("vs_torch_fwd", "fwd vs torch"),
               ("ge2_fwdbwd_ms", "GE2 fwd+bwd ms"), ("torch_fwdbwd_ms", "torch fwd+bwd ms"),
               ("vs_torch_fwdbwd", "fwd+bwd vs torch"), ("ge2_fwd_graph_ms", "GE2 fwd ms graph"),
               ("torch_fwd_graph_ms", "torch fwd ms graph"), ("vs_torch_fwd_graph", "fwd vs torch graph"),
               ("ge2_fwdbwd_graph_ms", "GE2 fwd+bwd ms graph"), ("torch_fwdbwd_graph_ms", "torch fwd+bwd ms graph"),
               ("vs_torch_fwdbwd_graph", "fwd+bwd vs torch graph"), ("ge2_fwd_tflops", "GE2 fwd TFLOP/s (graph)"),
               ("max_rel_err", "max rel err"), ("op_target_met", "op target per call (>=1.0x fwd, >=0.95x fwd+bwd)"),
               ("op_target_graph_met", "op target graph"),
               ("flash_target_met", "flash target at head_dim 128, graph (>=0.8x fwd, >=0.7x fwd+bwd)"),
               ("sm90_target_met", "flash_sm90 target at head_dim 128, graph (>=0.9x fwd, >=0.8x fwd+bwd)")]
    print(write_results("attention", rows, columns, "attention vs torch scaled_dot_product_attention"))


if __name__ == "__main__":
    main()
