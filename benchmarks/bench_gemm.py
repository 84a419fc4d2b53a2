"""GEMM + bias + activation: GE2's fused path vs torch._addmm_activation (cuBLASLt epilogue), F.linear + activation,
and the GEMM alone, float16 and bfloat16, relu and gelu, one process, one GPU. Correctness first, then medians.
Host time per call (64x256x128) is in bench_host_overhead.py.

FP8 rows (results gemm_fp8): GE2's scaled_gemm (E4M3 x E4M3 -> bfloat16, per-tensor scales; its amax checked once,
then timed without it, as torch._scaled_mm computes none) at 4096^3 and 8192^3 against GE2's own bfloat16 gemm on
the same problem and against torch._scaled_mm where the installed torch has it (both with FP8 fast accumulation
off, torch's default). Targets: >= 1.6x GE2 bfloat16 at 8192^3, >= 0.97x
torch._scaled_mm.

cutlass_sm90 rows (results gemm_cutlass; needs a build with CUTLASS and an sm_90 GPU, else skipped with the reason):
GE2's CUTLASS candidate pinned by name against GE2's cuBLASLt candidate on plain GEMMs >= 2048 (target >= 0.95x),
and on y = gelu(A @ B + bias + C) (bias, gelu and the residual C, beta = 1, in its one epilogue) at 4096^3 and
8192x1024x4096 against cuBLASLt's matmul plus one separate bias/residual/gelu kernel (cublaslt_postkernel, target
>= 1.1x) and against cuBLASLt's own one-pass epilogue with C (cublaslt_epilogue); and on the skip connection
y = gelu(A @ B + bias) + C (residual_after_act) against cuBLASLt's bias+gelu epilogue plus a separate add (target
>= 1.1x) and against cuBLASLt's matmul plus GE2's post-kernel (cublaslt_postkernel). A row's sides are timed
interleaved, round by round (harness.interleaved_median_ms).

Run: python benchmarks/bench_gemm.py [--quick] [--cutlass]  (--cutlass: only the cutlass_sm90 rows)
"""
from __future__ import annotations

import sys

from harness import interleaved_median_ms, median_ms, torch_cuda, write_results

from graph_executor_v2.ops import gemm, scaled_gemm

FP8_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
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


def bench_fp8(torch, m, n, k):
    """GE2 FP8 (A [m, k] x W [n, k]^T, the TN layout) vs GE2 bfloat16 (the same product) vs torch._scaled_mm."""
    a16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    # per-tensor scales as delayed scaling would choose them: amax to 448
    scale_a = (448.0 / a16.float().abs().max()).reshape(())
    scale_w = (448.0 / w16.float().abs().max()).reshape(())
    a8 = (a16.float() * scale_a).to(torch.float8_e4m3fn)
    w8 = (w16.float() * scale_w).to(torch.float8_e4m3fn)
    inv_a, inv_w = (1.0 / scale_a).float(), (1.0 / scale_w).float()
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    amax = torch.empty((), device="cuda", dtype=torch.float32)
    y16 = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    w16_t = w16.t().contiguous()  # gemm's B is [k, n]

    def run_fp8():  # no amax, as torch._scaled_mm computes none (checked once below, with it)
        return scaled_gemm.forward(a8, w8, inv_a, inv_w, with_amax=False, out=(y, amax))

    def run_bf16():
        return gemm.forward(a16, w16_t, out=y16)

    scaled_gemm.forward(a8, w8, inv_a, inv_w, out=(y, amax))
    run_bf16()
    expected = (a8.float() * inv_a) @ (w8.float() * inv_w).t()
    error = ((y.float() - expected).abs().max() / expected.abs().max()).item()
    amax_error = abs(amax.item() - expected.abs().max().item()) / expected.abs().max().item()
    if not (error < 1e-2 and amax_error < 1e-2):
        raise AssertionError(f"GE2 FP8 disagrees with float32 at {m}x{n}x{k}: rel err {error:.3e}, amax rel err "
                             f"{amax_error:.3e}")
    times = {"fp8_ms": median_ms(run_fp8), "bf16_ms": median_ms(run_bf16)}
    if hasattr(torch, "_scaled_mm"):
        scaled_mm = lambda: torch._scaled_mm(a8, w8.t(), scale_a=inv_a, scale_b=inv_w,  # noqa: E731
                                             out_dtype=torch.bfloat16)
        theirs = scaled_mm()
        torch_error = ((theirs.float() - y.float()).abs().max() / expected.abs().max()).item()
        if not torch_error < 1e-2:
            raise AssertionError(f"GE2 FP8 disagrees with torch._scaled_mm at {m}x{n}x{k}: {torch_error:.3e}")
        times["scaled_mm_ms"] = median_ms(scaled_mm)
    flops = 2.0 * m * n * k
    row = {"shape": f"{m}x{n}x{k}", **times, "max_rel_err": error}
    row["fp8_tflops"] = flops / (times["fp8_ms"] * 1e-3) / 1e12
    row["bf16_tflops"] = flops / (times["bf16_ms"] * 1e-3) / 1e12
    row["vs_bf16"] = times["bf16_ms"] / times["fp8_ms"]
    row["vs_scaled_mm"] = times["scaled_mm_ms"] / times["fp8_ms"] if "scaled_mm_ms" in times else float("nan")
    targets, misses = ["vs _scaled_mm>=0.97"], []
    if (m, n, k) == (8192, 8192, 8192):
        targets.append("vs GE2 bf16>=1.6")
        if row["vs_bf16"] < 1.6:
            misses.append("bf16")
    if "scaled_mm_ms" in times and row["vs_scaled_mm"] < 0.97:
        misses.append("scaled_mm")
    row["target"] = ", ".join(targets)
    row["met"] = ("NO (" + ",".join(misses) + ")") if misses else "yes"
    return row


CUTLASS_PLAIN_SHAPES = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (8192, 1024, 4096)]
CUTLASS_FUSED_SHAPES = [(4096, 4096, 4096), (8192, 1024, 4096)]


def cutlass_unavailable() -> str:
    """Empty when the cutlass_sm90 candidate can run here, else why not."""
    row = next((k for k in gemm.kernels() if k["name"] == "cutlass_sm90"), None)
    if row is None or "NOT BUILT" in row["description"]:
        return row["description"] if row else "no cutlass_sm90 candidate"
    return gemm._native_module().unsupported_reason("cutlass_sm90", 256, 256, 256, "float16", "gelu", True, True,
                                                    False, True, False, False)


CUTLASS_EPILOGUES = {"none": {}, "bias+gelu+residual": {"act": "gelu", "beta": 1.0},
                     "bias+gelu, then +residual": {"act": "gelu", "beta": 1.0, "residual_after_act": True}}


def bench_cutlass(torch, m, n, k, dtype_name, epilogue):
    dtype = getattr(torch, dtype_name)
    fused = epilogue != "none"
    after = epilogue == "bias+gelu, then +residual"
    a = torch.randn(m, k, device="cuda", dtype=dtype) / k**0.5
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype) if fused else None
    c = torch.randn(m, n, device="cuda", dtype=dtype) if fused else None
    out, lt_out = torch.empty(m, n, device="cuda", dtype=dtype), torch.empty(m, n, device="cuda", dtype=dtype)
    kwargs = CUTLASS_EPILOGUES[epilogue]
    run_cutlass = lambda: gemm.forward(a, b, bias, c, kernel="cutlass_sm90", out=out, **kwargs)  # noqa: E731
    if after:  # cuBLASLt's bias+gelu epilogue, then the residual added by a separate kernel
        def run_lt():
            gemm.forward(a, b, bias, None, act="gelu", kernel="cublaslt_epilogue", out=lt_out)
            lt_out.add_(c)
    else:
        run_lt = lambda: gemm.forward(a, b, bias, c, kernel="cublaslt_epilogue", out=lt_out, **kwargs)  # noqa: E731
    run_cutlass()
    run_lt()
    error = ((out.float() - lt_out.float()).abs().max() / lt_out.float().abs().max()).item()
    if not error < (1e-2 if dtype_name == "bfloat16" else 2e-3):
        raise AssertionError(f"cutlass_sm90 disagrees with cuBLASLt at {m}x{n}x{k} {dtype_name}: rel err {error:.3e}")
    # with the residual after the activation cuBLASLt has no one-pass epilogue: run_lt is the two-kernel baseline
    fns = {"cutlass_ms": run_cutlass, "lt_plus_add_ms" if after else "lt_ms": run_lt}
    if fused:
        # cuBLASLt's plain matmul, then bias, residual and gelu by GE2's one post-kernel (the same math, two passes)
        post_out = torch.empty(m, n, device="cuda", dtype=dtype)
        fns["postkernel_ms"] = lambda: gemm.forward(a, b, bias, c, kernel="cublaslt_postkernel", out=post_out, **kwargs)
    times = interleaved_median_ms(fns)
    if fused:
        times.setdefault("lt_plus_add_ms", times["postkernel_ms"])
    row = {"shape": f"{m}x{n}x{k}", "dtype": dtype_name, "epilogue": epilogue, **times, "max_rel_err": error}
    row["cutlass_tflops"] = 2.0 * m * n * k / (times["cutlass_ms"] * 1e-3) / 1e12
    row["vs_lt"] = times["lt_ms"] / times["cutlass_ms"] if "lt_ms" in times else float("nan")
    row["vs_lt_plus_add"] = times["lt_plus_add_ms"] / times["cutlass_ms"] if fused else float("nan")
    row["target"] = "vs cuBLASLt+add>=1.1" if fused else "vs cuBLASLt>=0.95"
    met = row["vs_lt_plus_add"] >= 1.1 if fused else row["vs_lt"] >= 0.95
    row["met"] = "yes" if met else "NO"
    return row


def main_cutlass(torch, quick: bool) -> None:
    reason = cutlass_unavailable()
    if reason:
        print(f"cutlass_sm90 rows skipped: {reason}")
        return
    rows = []
    cases = [(shape, "none") for shape in CUTLASS_PLAIN_SHAPES] + [
        (shape, epilogue) for shape in CUTLASS_FUSED_SHAPES for epilogue in list(CUTLASS_EPILOGUES)[1:]]
    for (m, n, k), epilogue in cases[:3] if quick else cases:
        for dtype_name in ("float16", "bfloat16"):
            row = bench_cutlass(torch, m, n, k, dtype_name, epilogue)
            rows.append(row)
            print(f"{row['shape']:>16} {dtype_name:<8} {row['epilogue']:<25} cutlass_sm90 {row['cutlass_ms']:.4f} ms "
                  f"{row['cutlass_tflops']:6.1f} TF/s | cuBLASLt x{row['vs_lt']:.3f} | cuBLASLt+add "
                  f"x{row['vs_lt_plus_add']:.3f} {row['met']}", flush=True)
    columns = [("shape", "M x N x K"), ("dtype", "dtype"), ("epilogue", "epilogue"), ("cutlass_ms", "cutlass_sm90 ms"),
               ("cutlass_tflops", "cutlass_sm90 TFLOP/s"), ("lt_ms", "cuBLASLt (same epilogue) ms"),
               ("postkernel_ms", "cuBLASLt + GE2 post-kernel ms"),
               ("lt_plus_add_ms", "cuBLASLt + epilogue kernel ms"), ("vs_lt", "x vs cuBLASLt"),
               ("vs_lt_plus_add", "x vs cuBLASLt+add"), ("target", "target"), ("met", "met")]
    print(write_results("gemm_cutlass", rows, columns, "cutlass_sm90 vs cuBLASLt (interleaved medians, L2 flushed)"))


def main(quick: bool, cutlass_only: bool) -> None:
    torch = torch_cuda()
    if cutlass_only:
        main_cutlass(torch, quick)
        return
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

    main_cutlass(torch, quick)

    fp8_rows = []
    for m, n, k in FP8_SHAPES[:1] if quick else FP8_SHAPES:
        row = bench_fp8(torch, m, n, k)
        fp8_rows.append(row)
        print(f"{row['shape']:>16} fp8 {row['fp8_ms']:.4f} ms {row['fp8_tflops']:6.1f} TF/s | GE2 bf16 "
              f"{row['bf16_tflops']:6.1f} TF/s x{row['vs_bf16']:.3f} | _scaled_mm x{row['vs_scaled_mm']:.3f} "
              f"{row['met']}", flush=True)
    columns = [("shape", "M x N x K"), ("fp8_ms", "GE2 FP8 ms"), ("fp8_tflops", "GE2 FP8 TFLOP/s"),
               ("bf16_ms", "GE2 bf16 ms"), ("bf16_tflops", "GE2 bf16 TFLOP/s"), ("scaled_mm_ms", "_scaled_mm ms"),
               ("vs_bf16", "x vs GE2 bf16"), ("vs_scaled_mm", "x vs _scaled_mm"), ("target", "target"),
               ("met", "met")]
    print(write_results("gemm_fp8", fp8_rows, columns,
                        "FP8 GEMM, E4M3 x E4M3 -> bfloat16, per-tensor scales (medians, L2 flushed)"))


if __name__ == "__main__":
    main("--quick" in sys.argv, "--cutlass" in sys.argv)
