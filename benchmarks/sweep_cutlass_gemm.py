"""The offline sweep behind gemm's cutlass_sm90 tile tables (backends/cuda/ops/gemm/cutlass/tile_table.hpp): times
every tile/schedule configuration (GE2_CUTLASS_SM90_TILE forces one) on a grid of shapes, float16 and bfloat16,
bias + gelu + residual and the plain product, beside cuBLASLt with the same epilogue; on shapes of at least 256
128x128 output tiles it also times the winner with the tile scheduler's swizzle 2, 4 and 8
(GE2_CUTLASS_SM90_SWIZZLE), then with the best swizzle along M and along N (GE2_CUTLASS_SM90_RASTER). The
configurations compiled for act none only (ACT_NONE_ONLY) are timed on the plain rows only. It prints the winner per
shape and the four tables it implies (per dtype, act none from the plain rows and the activations from the fused
ones: per tile count the configuration that won most rows, consecutive counts with one winner merged into one rule,
with the swizzle and raster order that won most of its rows) and writes them to the file the candidate compiles,
backends/cuda/ops/gemm/cutlass/tile_rules.inc (or --table PATH), with the GPU and date they were measured on; the
results table goes to benchmarks/results/cutlass_gemm_sweep.md. Needs an sm_90 GPU, PyTorch (for the device buffers
and the timer) and a build with CUTLASS.

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
           "cooperative_128x256x64_cluster2x1": "Cooperative128x256Cluster2x1",
           "cooperative_128x256x64": "Cooperative128x256",
           "pingpong_128x128x64": "Pingpong128x128",
           "pingpong_128x128x64_cluster2x1_noc": "Pingpong128x128Cluster2x1NoC"}
# tile_table.hpp's kActNoneOnly: compiled for the plain product (act none) only
ACT_NONE_ONLY = ("cooperative_128x256x64", "pingpong_128x128x64", "pingpong_128x128x64_cluster2x1_noc")
SWIZZLES = (2, 4, 8)  # tried on the winner of the large shapes; every configuration is first timed with 1
RASTERS = {"heuristic": "Heuristic", "m": "AlongM", "n": "AlongN"}  # GE2_CUTLASS_SM90_RASTER -> Raster
SWIZZLE_FROM_TILES = 256
# bench_gemm's targets (2048 and up, 8192x1024x4096) and transformer layers (GPT-2's 768/3072 widths, batch x seq rows)
SHAPES = [(128, 1024, 4096), (256, 4096, 4096), (512, 4096, 4096), (1024, 1024, 4096), (1024, 4096, 4096),
          (2048, 2048, 2048), (4096, 768, 3072), (4096, 3072, 768), (4096, 4096, 4096), (8192, 1024, 4096),
          (8192, 8192, 8192), (16384, 4096, 4096)]
TABLE = Path(__file__).resolve().parents[1] / "backends/cuda/ops/gemm/cutlass/tile_rules.inc"
TIMING = {"warmup": 5, "reps": 40}
# (dtype, epilogue) -> the table's C++ name
TABLE_NAMES = {("float16", "none"): "kTileTableFloat16ActNone", ("float16", "bias+gelu+residual"):
               "kTileTableFloat16Activation", ("bfloat16", "none"): "kTileTableBFloat16ActNone",
               ("bfloat16", "bias+gelu+residual"): "kTileTableBFloat16Activation"}


def output_tiles(m: int, n: int) -> int:
    return math.ceil(m / 128) * math.ceil(n / 128)


class Problem:
    """One row's device buffers (fresh random inputs, a NaN-poisoned output) and its float32 reference."""

    def __init__(self, torch, m, n, k, dtype_name, fused):
        dtype = getattr(torch, dtype_name)
        self.torch, self.m, self.n, self.k, self.dtype_name = torch, m, n, k, dtype_name
        self.a = torch.randn(m, k, device="cuda", dtype=dtype) / k**0.5
        self.b = torch.randn(k, n, device="cuda", dtype=dtype)
        self.bias = torch.randn(n, device="cuda", dtype=dtype) if fused else None
        self.c = torch.randn(m, n, device="cuda", dtype=dtype) if fused else None
        self.out = torch.empty(m, n, device="cuda", dtype=dtype)
        self.kwargs = {"act": "gelu", "beta": 1.0} if fused else {}
        expected = self.a.float() @ self.b.float()
        if fused:
            z = expected + self.bias.float() + self.c.float()
            expected = 0.5 * z * (1 + torch.tanh(0.7978845608028654 * (z + 0.044715 * z**3)))
        self.expected = expected

    def time(self, kernel, failures, **settings):
        """Median ms of ``kernel`` (GE2_CUTLASS_SM90_<KEY>=<value> for every ``settings`` item); infinite (never the
        winner) when it refuses the problem or its result is wrong, which is appended to ``failures``."""
        what = f"{kernel} {settings} at {self.m}x{self.n}x{self.k} {self.dtype_name}"
        os.environ.update({f"GE2_CUTLASS_SM90_{key.upper()}": str(value) for key, value in settings.items()})
        try:
            run = lambda: gemm.forward(self.a, self.b, self.bias, self.c, kernel=kernel, out=self.out,  # noqa: E731
                                       **self.kwargs)
            self.out.fill_(float("nan"))
            run()
            error = ((self.out.float() - self.expected).abs().max() / self.expected.abs().max()).item()
            if not error < 2e-2:
                failures.append(f"{what} wrong: rel err {error:.3e}")
                return math.inf
            return median_ms(run, **TIMING)
        except ValueError as error:  # the configuration declined the problem (CUTLASS's can_implement)
            failures.append(f"{what} refused: {error}")
            return math.inf
        finally:
            for key in settings:
                del os.environ[f"GE2_CUTLASS_SM90_{key.upper()}"]


def tile_table(rows, name: str = "kTileTable") -> str:
    """One table's C++ text: per tile count the configuration that won most rows (ties: the least total time),
    consecutive tile counts with one winner in one rule, up to the largest count of its run, with the swizzle and the
    raster order that won most of the rule's rows the configuration won."""
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
        won = [row for row in group if row["best"] == config]
        swizzle = Counter(row["swizzle"] for row in won).most_common(1)[0][0]
        raster = Counter(row["raster"] for row in won).most_common(1)[0][0]
        limit = "INT64_MAX" if index == len(runs) - 1 else str(tiles)
        lines.append(f"    {{{limit}, {{TileConfig::{CONFIGS[config]}, {swizzle}, Raster::{RASTERS[raster]}}}}},")
    return f"constexpr TileRule {name}[] = {{\n" + "\n".join(lines) + "\n};"


def table_file(rows, env) -> str:
    """tile_rules.inc's text: where and when the rules were measured, then the four tables."""
    tables = [tile_table([row for row in rows if (row["dtype"], row["epilogue"]) == key], name)
              for key, name in TABLE_NAMES.items()]
    return ("// Written by benchmarks/sweep_cutlass_gemm.py (do not edit: re-run the sweep on the GPU and check its\n"
            f"// output in): measured on {env['gpu']}, {env['time']}, CUDA {env['cuda']}, {len(rows)} rows "
            f"({len({row['shape'] for row in rows})} shapes x float16/bfloat16 x plain/bias+gelu+residual).\n"
            "// Included by tile_table.hpp inside namespace ge2::gemm::cutlass_sm90.\n" + "\n".join(tables) + "\n")


def sweep_row(torch, m, n, k, dtype_name, fused, failures) -> dict:
    problem = Problem(torch, m, n, k, dtype_name, fused)
    lt_ms = problem.time("cublaslt_epilogue", failures)
    times = {config: math.inf if fused and config in ACT_NONE_ONLY
             else problem.time("cutlass_sm90", failures, tile=config, swizzle=1)
             for config in CONFIGS}
    best = min(times, key=times.get)
    schedules = {(1, "heuristic"): times[best]}
    if output_tiles(m, n) >= SWIZZLE_FROM_TILES:
        schedules.update({(s, "heuristic"): problem.time("cutlass_sm90", failures, tile=best, swizzle=s)
                          for s in SWIZZLES})
        swizzle = min(schedules, key=schedules.get)[0]
        schedules.update({(swizzle, r): problem.time("cutlass_sm90", failures, tile=best, swizzle=swizzle, raster=r)
                          for r in RASTERS if r != "heuristic"})
    swizzle, raster = min(schedules, key=schedules.get)
    best_ms = schedules[(swizzle, raster)]
    return {"shape": f"{m}x{n}x{k}", "tiles": output_tiles(m, n), "dtype": dtype_name,
            "epilogue": "bias+gelu+residual" if fused else "none", **times, "best": best, "swizzle": swizzle,
            "raster": raster, "best_ms": best_ms, "tflops": 2.0 * m * n * k / (best_ms * 1e-3) / 1e12,
            "cublaslt_ms": lt_ms, "vs_cublaslt": lt_ms / best_ms,
            "schedules": " ".join(f"{s}/{r} {t:.4f}" for (s, r), t in schedules.items())}


def main(quick: bool, table: Path) -> None:
    torch = torch_cuda()
    started = time.perf_counter()
    rows, failures = [], []
    for m, n, k in SHAPES[::3] if quick else SHAPES:
        for dtype_name in ("float16", "bfloat16"):
            for fused in (False, True):
                row = sweep_row(torch, m, n, k, dtype_name, fused, failures)
                rows.append(row)
                print(f"{row['shape']:>16} {row['tiles']:6d} tiles {dtype_name:<8} {row['epilogue']:<18} "
                      + " ".join(f"{c} {row[c]:.4f}" for c in CONFIGS)
                      + f" -> {row['best']}, swizzle/raster {row['schedules']}; cuBLASLt {row['cublaslt_ms']:.4f} ms"
                      f" (x{row['vs_cublaslt']:.3f})", flush=True)
    columns = [("shape", "M x N x K"), ("tiles", "128x128 tiles"), ("dtype", "dtype"), ("epilogue", "epilogue"),
               *[(c, f"{c} ms") for c in CONFIGS], ("best", "best"), ("swizzle", "best swizzle"),
               ("raster", "best raster"), ("best_ms", "best ms"), ("tflops", "best TFLOP/s"),
               ("cublaslt_ms", "cuBLASLt ms"), ("vs_cublaslt", "best x vs cuBLASLt")]
    print(write_results("cutlass_gemm_sweep", rows, columns,
                        "cutlass_sm90 tile/schedule sweep (medians, L2 flushed; act-none-only configurations "
                        "are not timed on the fused rows, float16-only ones on the bfloat16 rows: inf)"))
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
