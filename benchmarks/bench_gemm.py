"""GEMM + bias + activation: GE2's fused path vs torch._addmm_activation (cuBLASLt epilogue), F.linear + activation,
and the GEMM alone, float16 and bfloat16, relu and gelu, one process, one GPU. Correctness first, then medians.
Host time per call (64x256x128) is in bench_host_overhead.py.

Run: python benchmarks/bench_gemm.py [--quick]
"""
from __future__ import annotations

import sys

from harness import median_ms, torch_cuda, write_results

from graph_executor_v2.ops import gemm

SHAPES = [(64, 256, 128), (1000, 1000, 1000), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192),
          (16384, 4096, 4096), (4096, 16384, 4096), (1, 4096, 4096)]


def bench_shape(torch, m, n, k, dtype_name, act):
    F = torch.nn.functional
    dtype = getattr(torch, dtype_name)
    a = torch.randn(m, k, device="cuda", dtype=dtype) / k**0.5
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    w = b.t().contiguous()  # F.linear's (out_features, in_features) weight
    bias = torch.randn(n, device="cuda", dtype=dtype)
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    use_gelu = act == "gelu"
    torch_act = (lambda x: F.gelu(x, approximate="tanh")) if use_gelu else F.relu

    def run_ge2():
        return gemm.forward(a, b, bias, act=act, out=out)

    run_ge2()
    expected = torch._addmm_activation(bias, a, b, use_gelu=use_gelu)
    error = ((out.float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-6)).item()
    if not error < (1e-2 if dtype_name == "bfloat16" else 2e-3):
        raise AssertionError(f"GE2 disagrees with torch at {m}x{n}x{k} {dtype_name} {act}: rel err {error:.3e}")

    times = {
        "ge2_ms": median_ms(run_ge2),
        "addmm_act_ms": median_ms(lambda: torch._addmm_activation(bias, a, b, use_gelu=use_gelu)),
        "linear_act_ms": median_ms(lambda: torch_act(F.linear(a, w, bias))),
        "mm_ms": median_ms(lambda: torch.mm(a, b)),
    }
    flops = 2.0 * m * n * k
    row = {"shape": f"{m}x{n}x{k}", "dtype": dtype_name, "act": act, **times, "max_rel_err": error}
    row["ge2_tflops"] = flops / (times["ge2_ms"] * 1e-3) / 1e12
    row["vs_addmm_act"] = times["addmm_act_ms"] / times["ge2_ms"]
    row["vs_linear_act"] = times["linear_act_ms"] / times["ge2_ms"]
    row["vs_mm"] = times["mm_ms"] / times["ge2_ms"]
    big = min(m, n, k) >= 1000
    row["target"] = "vs addmm_act>=0.97" if big else ""
    if (m, n, k) == (4096, 4096, 4096) and act == "relu":
        row["target"] += ", vs linear+relu>=1.05"
    misses = []
    if big and row["vs_addmm_act"] < 0.97:
        misses.append("addmm")
    if (m, n, k) == (4096, 4096, 4096) and act == "relu" and row["vs_linear_act"] < 1.05:
        misses.append("linear")
    row["met"] = ("NO (" + ",".join(misses) + ")") if misses else ("yes" if row["target"] else "")
    return row


def main(quick: bool) -> None:
    torch = torch_cuda()
    rows = []
    shapes = SHAPES[:4] if quick else SHAPES
    for m, n, k in shapes:
        for dtype_name in ("float16", "bfloat16"):
            for act in ("relu", "gelu"):
                row = bench_shape(torch, m, n, k, dtype_name, act)
                rows.append(row)
                print(f"{row['shape']:>16} {dtype_name:<8} {act:<4} ge2 {row['ge2_ms']:.4f} ms "
                      f"{row['ge2_tflops']:6.1f} TF/s | addmm_act x{row['vs_addmm_act']:.3f} | "
                      f"linear+act x{row['vs_linear_act']:.3f} | mm x{row['vs_mm']:.3f} {row['met']}", flush=True)
    columns = [("shape", "M x N x K"), ("dtype", "dtype"), ("act", "act"), ("ge2_ms", "GE2 ms"),
               ("ge2_tflops", "GE2 TFLOP/s"), ("addmm_act_ms", "_addmm_activation ms"),
               ("linear_act_ms", "F.linear+act ms"), ("mm_ms", "mm alone ms"), ("vs_addmm_act", "x vs addmm_act"),
               ("vs_linear_act", "x vs linear+act"), ("target", "target"), ("met", "met")]
    print(write_results("gemm", rows, columns, "GEMM + bias + activation (medians, L2 flushed)"))


if __name__ == "__main__":
    main("--quick" in sys.argv)
