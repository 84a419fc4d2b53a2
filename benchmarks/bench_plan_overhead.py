"""What a plan costs per iteration when the GPU work is small: ExecutorV2 as a CUDA graph vs PyTorch, one process.

- mlp: 64x128 -> 256 -> 11, float32, relu. GE2 ``run()`` (torch tensor in, copied into the plan's slot; result
  copied into a preallocated ``out=``) and zero-copy ``Plan.replay()`` against PyTorch eager and a PyTorch
  CUDA-graph replay of the same forward (static input, no copy). Targets: run() <= 1.1x and replay() <= 1.0x the
  PyTorch graph; both >= 3x faster than eager.
- branches: 8 independent 64x256 GEMM+bias+relu branches summed (float32), one GE2 graph on 1 stream vs 4
  streams (both replayed as CUDA graphs), and PyTorch eager for scale.

Time per iteration = wall time of a loop of back-to-back calls divided by its length, after a device
synchronisation on both ends: what a training or serving loop sees, host and device overlapped (median of 7
loops). Correctness is checked against float64 NumPy first. Strict float32 math (no TF32) on both sides.

Run: python benchmarks/bench_plan_overhead.py
"""
from __future__ import annotations

import statistics
import time

import numpy as np
from bench_mlp_inference import torch_graph, torch_mlp
from harness import torch_cuda, write_results

import graph_executor_v2 as ge2
from graph_executor_v2.testing import assert_close, branches, mlp

LOOP = 2000
LOOPS = 7


def per_iteration_us(torch, fn, loop: int = LOOP) -> float:
    for _ in range(200):
        fn()
    times = []
    for _ in range(LOOPS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(loop):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / loop * 1e6)
    return statistics.median(times)


def mlp_rows(torch, rng) -> list[dict]:
    sizes, batch = (128, 256, 11), 64
    g, reference = mlp(rng, sizes, "float32", "relu", batch=batch)
    executor = ge2.ExecutorV2(g, device="cuda")
    eager = torch_mlp(torch, g, len(sizes) - 1, "relu")
    x_host = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    x = torch.from_numpy(x_host).cuda()
    expected = reference(x_host)

    y = torch.empty((batch, sizes[-1]), device="cuda")
    executor.run({"x": x}, out={"y": y})
    executor.run({"x": x}, out={"y": y})  # the second run replays the captured graph
    assert_close(y.cpu().numpy(), expected, "float32", max(sizes), what="GE2 run()")
    plan = executor.plan()
    assert plan.cuda_graph is not None, plan.capture
    slot_x = torch.from_dlpack(plan.inputs["x"])
    slot_y = torch.from_dlpack(plan.outputs["y"])
    slot_x.copy_(x)
    plan.replay()
    assert_close(slot_y.cpu().numpy(), expected, "float32", max(sizes), what="GE2 replay()")
    graph, static_y = torch_graph(torch, eager, x.clone())
    graph.replay()
    assert_close(static_y.cpu().numpy(), expected, "float32", max(sizes), what="PyTorch graph")

    times = {
        "torch eager": per_iteration_us(torch, lambda: eager(x)),
        "torch CUDA graph replay": per_iteration_us(torch, graph.replay),
        "GE2 run() (copies in and out)": per_iteration_us(torch, lambda: executor.run({"x": x}, out={"y": y})),
        "GE2 Plan.replay() (zero copy)": per_iteration_us(torch, plan.replay),
    }
    graph_us, eager_us = times["torch CUDA graph replay"], times["torch eager"]
    targets = {"GE2 run() (copies in and out)": 1.1, "GE2 Plan.replay() (zero copy)": 1.0}
    rows = []
    for name, us in times.items():
        row = {"case": "mlp 64x128->256->11 f32", "variant": name, "us_per_iter": us,
               "vs_torch_graph": us / graph_us, "speedup_vs_eager": eager_us / us, "target": "", "met": ""}
        if name in targets:
            row["target"] = f"<= {targets[name]}x graph, >= 3x eager"
            row["met"] = "yes" if us / graph_us <= targets[name] and eager_us / us >= 3 else "no"
        rows.append(row)
    return rows


def branch_rows(torch, rng) -> list[dict]:
    count, width, batch = 8, 256, 64
    g, reference = branches(rng, count, width, "float32", batch=batch)
    x_host = rng.standard_normal((batch, width)).astype(np.float32)
    expected = reference(x_host)
    rows, times = [], {}
    outputs = {}
    for streams in (1, 4):
        executor = ge2.ExecutorV2(g, device="cuda", streams=streams)
        plan = executor.plan()
        plan.inputs["x"].copy_from_numpy(x_host)
        plan.replay()
        plan.replay()
        assert plan.cuda_graph is not None, plan.capture
        outputs[streams] = plan.outputs["y"].numpy()
        assert_close(outputs[streams], expected, "float32", width * count, what=f"{streams} stream(s)")
        times[streams] = per_iteration_us(torch, plan.replay)
        rows.append({"case": f"{count} branches {batch}x{width} f32", "variant": f"GE2 replay, {streams} stream(s)",
                     "us_per_iter": times[streams], "vs_torch_graph": "", "speedup_vs_eager": "",
                     "target": "1 vs N streams: same numbers, report speedup",
                     "met": "same numbers" if streams == 1 or np.array_equal(outputs[1], outputs[streams])
                     else "DIFFERENT"})
    weights = [tuple(torch.tensor(g.params[f"{name}{i}"].data, device="cuda") for name in ("w", "b"))
               for i in range(count)]
    x = torch.from_numpy(x_host).cuda()

    def eager():
        return sum(torch.relu(torch.addmm(b, x, w)) for w, b in weights)

    eager_us = per_iteration_us(torch, eager)
    rows.append({"case": rows[0]["case"], "variant": "torch eager", "us_per_iter": eager_us, "vs_torch_graph": "",
                 "speedup_vs_eager": 1.0, "target": "", "met": ""})
    for row in rows[:2]:
        row["speedup_vs_eager"] = eager_us / row["us_per_iter"]
    rows[1]["variant"] += f" ({times[1] / times[4]:.2f}x vs 1 stream)"
    return rows


def main():
    torch = torch_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(0)
    rows = mlp_rows(torch, rng) + branch_rows(torch, rng)
    columns = [("case", "case"), ("variant", "variant"), ("us_per_iter", "us / iteration"),
               ("vs_torch_graph", "vs torch graph"), ("speedup_vs_eager", "speedup vs eager"),
               ("target", "target"), ("met", "met")]
    print(write_results("plan_overhead", rows, columns, "Plan overhead: ExecutorV2 CUDA graphs vs PyTorch"))


if __name__ == "__main__":
    main()
