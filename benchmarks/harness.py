"""Side-by-side GPU timing for GE2 and PyTorch in one process: CUDA-event medians with the L2 flushed between
repetitions, correctness checked before anything is timed, results as JSON plus a markdown table."""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))


def torch_cuda():
    """torch with a CUDA device, or exit with a clear message (benchmarks compare against PyTorch on the GPU)."""
    try:
        import torch
    except ImportError:
        sys.exit("benchmarks need PyTorch with CUDA; torch is not installed")
    if not torch.cuda.is_available():
        sys.exit("benchmarks need a CUDA GPU; none is available")
    return torch


# Cycles of the device sleep before each timed call of median_ms: ~100 us at the H200's ~2 GHz, longer than the host
# takes to launch a call (a few to tens of us, more when other jobs load the CPUs).
SLEEP_CYCLES = 200_000


def median_ms(fn, warmup: int = 10, reps: int = 50, flush_l2: bool = True) -> float:
    """Median time of ``fn()`` in milliseconds, each repetition timed with CUDA events on the current stream. The
    stream first sleeps on the device (SLEEP_CYCLES), so the host's launch of ``fn`` is queued while
    the GPU is busy and the events time the device's work only: without it host time leaks into kernels under
    ~30 us when the CPUs are busy (host work in ``fn`` that outlasts the sleep still counts)."""
    return interleaved_median_ms({"fn": fn}, warmup, reps, flush_l2)["fn"]


def interleaved_median_ms(fns: dict, warmup: int = 10, reps: int = 50, flush_l2: bool = True) -> dict:
    """Median milliseconds of each function in ``fns`` (name -> fn), timed as median_ms times one, but round by
    round: each round times every function once, starting at the next one each round. A drift of the GPU's clocks
    or of the machine's load over the run then reaches every side alike; separate medians taken one after the other
    put it on one side (bench_gemm's 8192x1024x4096 float16 cutlass_sm90 row read 0.87x and 1.03x cuBLASLt in two
    runs that way)."""
    torch = torch_cuda()
    flush = torch.empty(64 << 20, dtype=torch.int8, device="cuda") if flush_l2 else None  # 64 MB > 50 MB of L2
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    times = {name: [] for name in names}
    for rep in range(reps):
        for i in range(len(names)):
            name = names[(rep + i) % len(names)]
            if flush is not None:
                flush.zero_()
            torch.cuda._sleep(SLEEP_CYCLES)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(values) for name, values in times.items()}


def wall_ms(fn, warmup: int = 5, reps: int = 30) -> float:
    """Median wall-clock milliseconds of ``fn()`` (host work such as onnxruntime's CPU provider)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def graph_replay_ms(fn, calls: int = 20, reps: int = 10) -> float:
    """Device time per call of ``fn`` with no host time at all: ``calls`` calls captured once into a CUDA graph on
    a side stream, the graph replayed ``reps`` times between two CUDA events, divided by ``calls``. ``fn`` must
    enqueue on ``torch.cuda.current_stream()`` (the capture stream) and allocate nothing outside PyTorch's
    allocator; warmed up (plans built, autotuning done) before the capture."""
    torch = torch_cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):  # the warm-up's stream: per-stream workspaces exist already
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (reps * calls)


def host_overhead_us(fn, calls: int = 2000, burst: int = 100) -> float:
    """Host time per call of ``fn``: calls are issued in short bursts with the device drained between them and only
    the issuing is timed, so a full launch queue never turns the figure into device time."""
    torch = torch_cuda()
    for _ in range(burst):
        fn()
    elapsed = 0.0
    for _ in range(calls // burst):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(burst):
            fn()
        elapsed += time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / (calls // burst * burst) * 1e6


def environment() -> dict:
    torch = torch_cuda()
    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def write_results(name: str, rows: list[dict], columns: list[tuple[str, str]], title: str) -> str:
    """Writes results/<name>.json and results/<name>.md; returns the markdown table, titled with the GPU it ran on.
    ``columns`` are (key, header) pairs; floats print with 3 significant decimals."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    env = environment()
    (RESULTS / f"{name}.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=2))
    lines = [f"### {title} on {env['gpu']}", "", "| " + " | ".join(h for _, h in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row.get(key, "")
            cells.append(f"{value:.3f}" if isinstance(value, float) else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    (RESULTS / f"{name}.md").write_text(table)
    out = os.environ.get("GE2_BENCH_OUT")
    if out:  # gpu_check.sh collects every table here
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.md").write_text(table)
    return table
