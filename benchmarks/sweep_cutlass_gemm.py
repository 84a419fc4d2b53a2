"""The offline sweep behind gemm's cutlass_sm90 tile table (backends/cuda/ops/gemm/cutlass/tile_table.hpp): times
every tile/schedule configuration (GE2_CUTLASS_SM90_TILE forces one) on a grid of shapes, float16 and bfloat16,
bias + gelu + residual and the plain product, and prints the winner per shape with the table rule it implies (the
largest count of 128x128 output tiles up to which ping-pong 64x128 wins; cooperative 128x128 above it). Paste the
printed kTileTable into tile_table.hpp. Needs an sm_90 GPU and PyTorch (for the device buffers and the timer).

Run: python benchmarks/sweep_cutlass_gemm.py [--quick]
"""
from __future__ import annotations

import math
import os
import sys

from harness import median_ms, torch_cuda, write_results

from graph_executor_v2.ops import gemm

CONFIGS = ("pingpong_64x128x64", "cooperative_128x128x64")
SHAPES = [(128, 1024, 4096), (256, 4096, 4096), (512, 4096, 4096), (1024, 1024, 4096), (1024, 4096, 4096),
          (2048, 2048, 2048), (4096, 4096, 4096), (8192, 1024, 4096), (8192, 8192, 8192), (16384, 4096, 4096)]


def output_tiles(m: int, n: int) -> int:
    return math.ceil(m / 128) * math.ceil(n / 128)


def time_config(torch, config, m, n, k, dtype_name, fused):
    dtype = getattr(torch, dtype_name)
    a = torch.randn(m, k, device="cuda", dtype=dtype) / k**0.5
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype) if fused else None
    c = torch.randn(m, n, device="cuda", dtype=dtype) if fused else None
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    kwargs = {"act": "gelu", "beta": 1.0} if fused else {}
    os.environ["GE2_CUTLASS_SM90_TILE"] = config  # read by every launch
    try:
        run = lambda: gemm.forward(a, b, bias, c, kernel="cutlass_sm90", out=out, **kwargs)  # noqa: E731
        run()
        expected = a.float() @ b.float()
        if fused:
            z = expected + bias.float() + c.float()
            expected = 0.5 * z * (1 + torch.tanh(0.7978845608028654 * (z + 0.044715 * z**3)))
        error = ((out.float() - expected).abs().max() / expected.abs().max()).item()
        if not error < 2e-2:
            raise AssertionError(f"cutlass_sm90 {config} wrong at {m}x{n}x{k} {dtype_name}: rel err {error:.3e}")
        return median_ms(run)
    finally:
        del os.environ["GE2_CUTLASS_SM90_TILE"]


def main(quick: bool) -> None:
    torch = torch_cuda()
    rows = []
    for m, n, k in SHAPES[::3] if quick else SHAPES:
        for dtype_name in ("float16", "bfloat16"):
            for fused in (False, True):
                times = {config: time_config(torch, config, m, n, k, dtype_name, fused) for config in CONFIGS}
                best = min(times, key=times.get)
                row = {"shape": f"{m}x{n}x{k}", "tiles": output_tiles(m, n), "dtype": dtype_name,
                       "epilogue": "bias+gelu+residual" if fused else "none", **times, "best": best,
                       "tflops": 2.0 * m * n * k / (times[best] * 1e-3) / 1e12}
                rows.append(row)
                print(f"{row['shape']:>16} {row['tiles']:6d} tiles {dtype_name:<8} {row['epilogue']:<18} "
                      + " ".join(f"{c} {t:.4f} ms" for c, t in times.items()) + f" -> {best}", flush=True)
    columns = [("shape", "M x N x K"), ("tiles", "128x128 tiles"), ("dtype", "dtype"), ("epilogue", "epilogue"),
               *[(c, f"{c} ms") for c in CONFIGS], ("best", "best"), ("tflops", "best TFLOP/s")]
    print(write_results("cutlass_gemm_sweep", rows, columns, "cutlass_sm90 tile/schedule sweep (medians)"))
    # The rule: ping-pong up to the largest tile count at which it won a majority of its rows.
    by_tiles: dict[int, list[bool]] = {}
    for row in rows:
        by_tiles.setdefault(row["tiles"], []).append(row["best"] == "pingpong_64x128x64")
    pingpong_up_to = max((t for t, wins in by_tiles.items() if sum(wins) * 2 > len(wins)), default=0)
    print("constexpr TileRule kTileTable[] = {\n"
          f"    {{{pingpong_up_to}, TileConfig::Pingpong64x128}},\n"
          "    {INT64_MAX, TileConfig::Cooperative128x128},\n};")


if __name__ == "__main__":
    main("--quick" in sys.argv)
