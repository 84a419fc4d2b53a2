"""The offline sweep behind gemm's cutlass_sm90 tile table (backends/cuda/ops/gemm/cutlass/tile_table.hpp): times
every tile/schedule configuration (GE2_CUTLASS_SM90_TILE forces one) on a grid of shapes, float16 and bfloat16,
bias + gelu + residual and the plain product; on shapes of at least 512 128x128 output tiles it also times the
winner with the tile scheduler's swizzle 2, 4 and 8 (GE2_CUTLASS_SM90_SWIZZLE). It prints the winner per shape and
the kTileTable it implies (per tile count the configuration that won most rows, consecutive counts with one winner
merged into one rule, with the swizzle that won most of its rows) and writes it to the file the candidate compiles,
backends/cuda/ops/gemm/cutlass/tile_rules.inc (or --table PATH), with the GPU and date it was measured on; the
results table goes to benchmarks/results/cutlass_gemm_sweep.md. The whole sweep takes about 40 s on the H200. Needs an
sm_90 GPU, PyTorch (for the device buffers and the timer) and a build with CUTLASS.

Run: python benchmarks/sweep_cutlass_gemm.py [--quick] [--table PATH]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter
from pathlib import Path

from harness import environment, median_ms, torch_cuda, write_results

from graph_executor_v2.ops import gemm

# The configuration names of tile_table.hpp's kTileConfigNames, with their TileConfig enumerators.
CONFIGS = {"pingpong_64x128x64": "Pingpong64x128",
           "cooperative_128x128x64": "Cooperative128x128",
           "pingpong_128x128x64_cluster2x1": "Pingpong128x128Cluster2x1",
           "cooperative_128x256x64_cluster2x1": "Cooperative128x256Cluster2x1"}
SWIZZLES = (2, 4, 8)  # tried on the winner of the large shapes; every configuration is first timed with 1
SWIZZLE_FROM_TILES = 512
# bench_gemm's targets (2048 and up, 8192x1024x4096) and transformer layers (GPT-2's 768/3072 widths, batch x seq rows)
SHAPES = [(128, 1024, 4096), (256, 4096, 4096), (512, 4096, 4096), (1024, 1024, 4096), (1024, 4096, 4096),
          (2048, 2048, 2048), (4096, 768, 3072), (4096, 3072, 768), (4096, 4096, 4096), (8192, 1024, 4096),
          (8192, 8192, 8192), (16384, 4096, 4096)]
TABLE = Path(__file__).resolve().parents[1] / "backends/cuda/ops/gemm/cutlass/tile_rules.inc"
TIMING = {"warmup": 5, "reps": 30}  # medians of 30 keep the whole sweep near 40 s


def output_tiles(m: int, n: int) -> int:
    return math.ceil(m / 128) * math.ceil(n / 128)


def time_config(torch, config, swizzle, m, n, k, dtype_name, fused, failures):
    """Median ms of one configuration; infinite (never the winner) when it refuses the problem or its result is
    wrong, which is appended to ``failures``."""
    dtype = getattr(torch, dtype_name)
    a = torch.randn(m, k, device="cuda", dtype=dtype) / k**0.5
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    bias = torch.randn(n, device="cuda", dtype=dtype) if fused else None
    c = torch.randn(m, n, device="cuda", dtype=dtype) if fused else None
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    kwargs = {"act": "gelu", "beta": 1.0} if fused else {}
    os.environ["GE2_CUTLASS_SM90_TILE"] = config  # read by every launch
    os.environ["GE2_CUTLASS_SM90_SWIZZLE"] = str(swizzle)
    try:
        run = lambda: gemm.forward(a, b, bias, c, kernel="cutlass_sm90", out=out, **kwargs)  # noqa: E731
        run()
        expected = a.float() @ b.float()
        if fused:
            z = expected + bias.float() + c.float()
            expected = 0.5 * z * (1 + torch.tanh(0.7978845608028654 * (z + 0.044715 * z**3)))
        error = ((out.float() - expected).abs().max() / expected.abs().max()).item()
        if not error < 2e-2:
            failures.append(f"{config} swizzle {swizzle} wrong at {m}x{n}x{k} {dtype_name}: rel err {error:.3e}")
            return math.inf
        return median_ms(run, **TIMING)
    except ValueError as error:  # the configuration declined the problem (CUTLASS's can_implement)
        failures.append(f"{config} swizzle {swizzle} refused {m}x{n}x{k} {dtype_name}: {error}")
        return math.inf
    finally:
        del os.environ["GE2_CUTLASS_SM90_TILE"], os.environ["GE2_CUTLASS_SM90_SWIZZLE"]


def tile_table(rows) -> str:
    """kTileTable's C++ text: per tile count the configuration that won most rows (ties: the least total time),
    consecutive tile counts with one winner in one rule, up to the largest count of its run."""
    by_tiles: dict[int, list[dict]] = {}
    for row in rows:
        by_tiles.setdefault(row["tiles"], []).append(row)
    runs: list[tuple[int, str, list[dict]]] = []  # (largest tile count, configuration, its rows)
    for tiles in sorted(by_tiles):
        group = by_tiles[tiles]
        wins = Counter(row["best"] for row in group)
        winner = min(wins, key=lambda c: (-wins[c], sum(row[c] for row in group)))
        if runs and runs[-1][1] == winner:
            runs[-1] = (tiles, winner, runs[-1][2] + group)
        else:
            runs.append((tiles, winner, group))
    lines = []
    for index, (tiles, config, group) in enumerate(runs):
        swizzle = Counter(row["swizzle"] for row in group if row["best"] == config).most_common(1)[0][0]
        limit = "INT64_MAX" if index == len(runs) - 1 else str(tiles)
        lines.append(f"    {{{limit}, {{TileConfig::{CONFIGS[config]}, {swizzle}}}}},")
    return "constexpr TileRule kTileTable[] = {\n" + "\n".join(lines) + "\n};"


def table_file(rows, env) -> str:
    """tile_rules.inc's text: where and when the rules were measured, then kTileTable."""
    return ("// Written by benchmarks/sweep_cutlass_gemm.py (do not edit: re-run the sweep on the GPU and check its\n"
            f"// output in): measured on {env['gpu']}, {env['time']}, CUDA {env['cuda']}, {len(rows)} rows "
            f"({len({row['shape'] for row in rows})} shapes x float16/bfloat16 x plain/bias+gelu+residual).\n"
            "// Included by tile_table.hpp inside namespace ge2::gemm::cutlass_sm90.\n" + tile_table(rows) + "\n")


def main(quick: bool, table: Path) -> None:
    torch = torch_cuda()
    started = time.perf_counter()
    rows, failures = [], []
    for m, n, k in SHAPES[::3] if quick else SHAPES:
        for dtype_name in ("float16", "bfloat16"):
            for fused in (False, True):
                times = {config: time_config(torch, config, 1, m, n, k, dtype_name, fused, failures)
                         for config in CONFIGS}
                best = min(times, key=times.get)
                swizzled = {1: times[best]}
                if output_tiles(m, n) >= SWIZZLE_FROM_TILES:
                    swizzled.update({s: time_config(torch, best, s, m, n, k, dtype_name, fused, failures)
                                     for s in SWIZZLES})
                swizzle = min(swizzled, key=swizzled.get)
                row = {"shape": f"{m}x{n}x{k}", "tiles": output_tiles(m, n), "dtype": dtype_name,
                       "epilogue": "bias+gelu+residual" if fused else "none", **times, "best": best,
                       "swizzle": swizzle, "best_ms": swizzled[swizzle],
                       "tflops": 2.0 * m * n * k / (swizzled[swizzle] * 1e-3) / 1e12}
                rows.append(row)
                print(f"{row['shape']:>16} {row['tiles']:6d} tiles {dtype_name:<8} {row['epilogue']:<18} "
                      + " ".join(f"{c} {t:.4f} ms" for c, t in times.items())
                      + f" -> {best}, swizzle " + " ".join(f"{s}: {t:.4f} ms" for s, t in swizzled.items()),
                      flush=True)
    columns = [("shape", "M x N x K"), ("tiles", "128x128 tiles"), ("dtype", "dtype"), ("epilogue", "epilogue"),
               *[(c, f"{c} ms") for c in CONFIGS], ("best", "best"), ("swizzle", "best swizzle"),
               ("best_ms", "best ms"), ("tflops", "best TFLOP/s")]
    print(write_results("cutlass_gemm_sweep", rows, columns, "cutlass_sm90 tile/schedule sweep (medians)"))
    table.write_text(table_file(rows, environment()))
    print(f"{table} ({time.perf_counter() - started:.0f} s):\n{table.read_text()}")
    if failures:  # a wrong or refused configuration never wins a row, but the build has a defect to look at
        sys.exit("FAILED configurations:\n" + "\n".join(failures))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="every third shape only")
    parser.add_argument("--table", type=Path, default=TABLE, help=f"where the rules go (default {TABLE})")
    arguments = parser.parse_args()
    main(arguments.quick, arguments.table)
