"""What a plan costs per iteration when the GPU work is small: ExecutorV2 as a CUDA graph vs PyTorch, one process.

- mlp: 64x128 -> 256 -> 11, float32, relu. GE2 ``run()`` (torch tensor in, copied into the plan's slot; result
  copied into a preallocated ``out=``: both copies are memcpy nodes of the plan's CUDA graph, so a run is one
  launch) and zero-copy ``Plan.replay()`` against PyTorch eager and a PyTorch CUDA-graph replay of the same forward
  (static input, no copy). Targets (issue 22): run() <= 1.0x and replay() <= 1.0x the PyTorch graph; both >= 3x
  faster than eager.
- resnet50: ResNet-50 float16 batch 32 (torchvision, random weights) imported through ONNX as in bench_models.py,
  the same four variants; GE2 at its default precision and PyTorch at its defaults (float16: float32 accumulation
  on both sides). Target: run() <= 1.0x the PyTorch graph.
- branches: 8 independent 64x256 GEMM+bias+relu branches summed (float32), one GE2 graph on 1 stream vs 4
  streams (both replayed as CUDA graphs), and PyTorch eager for scale.

Time per iteration = wall time of a loop of back-to-back calls divided by its length, after a device
synchronisation on both ends: what a training or serving loop sees, host and device overlapped (median of 7
loops). Correctness is checked against float64 NumPy first. Strict float32 math (no TF32) on both sides.

Run: python benchmarks/bench_plan_overhead.py [--cases mlp,branches,resnet50] (default: all three) [--budget-s S]
(--budget-s: cases not started once S seconds have passed are rows saying so; on the H200 mlp and branches take
seconds, resnet50 one to three minutes: its ONNX export, a cold plan build with candidate timing, then the loops.)
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
from bench_mlp_inference import torch_graph, torch_mlp
from harness import torch_cuda, write_results

import graph_executor_v2 as ge2
from graph_executor_v2.testing import assert_close, branches, mlp

LOOP = 2000
RESNET_LOOP = 50  # ~2 ms per iteration
LOOPS = 7


def per_iteration_us(torch, fn, loop: int = LOOP) -> float:
    for _ in range(min(200, loop)):
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
    assert_one_launch(plan)
    slot_x = torch.from_dlpack(plan.inputs["x"])
    slot_y = torch.from_dlpack(plan.outputs["y"])
    slot_x.copy_(x)
    plan.replay()
    assert_close(slot_y.cpu().numpy(), expected, "float32", max(sizes), what="GE2 replay()")
    graph, static_y = torch_graph(torch, eager, x.clone())
    graph.replay()
    assert_close(static_y.cpu().numpy(), expected, "float32", max(sizes), what="PyTorch graph")

    return variant_rows(torch, "mlp 64x128->256->11 f32", eager, x, graph, executor, plan, {"x": x}, {"y": y},
                        LOOP, eager_target=3.0)


RUN = "GE2 run() (copies in and out: memcpy nodes of the graph)"
REPLAY = "GE2 Plan.replay() (zero copy)"


def assert_one_launch(plan) -> None:
    """The plan is captured and its run() so far was one launch with the copies inside (CopyingGraph)."""
    assert plan.cuda_graph is not None, plan.capture
    assert plan.copying_graphs and not any(isinstance(c, str) for c in plan.copying_graphs.values()), \
        plan.copying_graphs


def variant_rows(torch, case, eager, x, graph, executor, plan, feeds, out, loop, eager_target=None) -> list[dict]:
    """The four rows of one case: PyTorch eager and CUDA-graph replay, GE2 run() and Plan.replay(), each with its
    ratio to the PyTorch graph (target <= 1.0x for both GE2 variants) and its speedup over eager."""
    times = {
        "torch eager": per_iteration_us(torch, lambda: eager(x), loop),
        "torch CUDA graph replay": per_iteration_us(torch, graph.replay, loop),
        RUN: per_iteration_us(torch, lambda: executor.run(feeds, out=out), loop),
        REPLAY: per_iteration_us(torch, plan.replay, loop),
    }
    graph_us, eager_us = times["torch CUDA graph replay"], times["torch eager"]
    rows = []
    for name, us in times.items():
        row = {"case": case, "variant": name, "us_per_iter": us, "vs_torch_graph": us / graph_us,
               "speedup_vs_eager": eager_us / us, "target": "", "met": ""}
        if name in (RUN, REPLAY):
            met = us / graph_us <= 1.0 and (eager_target is None or eager_us / us >= eager_target)
            row["target"] = "<= 1.0x graph" + (f", >= {eager_target:g}x eager" if eager_target else "")
            row["met"] = "yes" if met else "no"
        rows.append(row)
    return rows


def resnet50_rows(torch, rng) -> list[dict]:
    """ResNet-50 float16 batch 32, imported through ONNX (bench_models.py's row and export)."""
    import bench_models
    from graph_executor_v2.zoo.worker import matches, relative_error

    row = next(row for row in bench_models.ROWS if row.id == "resnet50_f16_b32")
    master, host_inputs = row.build(torch, row.batch)
    with torch.no_grad():
        module64, inputs64 = bench_models._on_gpu(torch, master, host_inputs, "float64")
        reference = bench_models._numpy(torch, module64(*inputs64))
        del module64, inputs64
        module, (x,) = bench_models._on_gpu(torch, master, host_inputs, "float16")
        torch_error = relative_error(bench_models._numpy(torch, module(x)), reference)
        with tempfile.TemporaryDirectory() as directory:
            graph, _, _ = bench_models._export_and_import(torch, module, (x,), directory)
        started = time.perf_counter()
        executor = ge2.ExecutorV2(graph, device="cuda")
        build_s = time.perf_counter() - started
        name, output = graph.inputs[0].name, next(iter(graph.outputs))
        y = torch.empty(graph.outputs[output].type.shape, dtype=torch.float16, device="cuda")
        for _ in range(2):  # the first run warms up and captures, the second is one launch with its copies
            y.fill_(float("nan"))
            executor.run({name: x}, out={output: y})
        ge2_error = relative_error(bench_models._numpy(torch, y), reference)
        assert matches(ge2_error, torch_error, "float16"), f"GE2 run(): error {ge2_error} vs torch {torch_error}"
        plan = executor.plan()
        assert_one_launch(plan)
        replayed, static_y = torch_graph(torch, module, x.clone())
        replayed.replay()
        graph_error = relative_error(bench_models._numpy(torch, static_y), reference)
        assert matches(graph_error, torch_error, "float16"), f"PyTorch graph: error {graph_error}"
        rows = variant_rows(torch, "resnet50 f16 batch 32", module, x, replayed, executor, plan, {name: x},
                            {output: y}, RESNET_LOOP)
    rows[2]["variant"] += f" (plan built in {build_s:.1f} s, autotuning {plan.tuning_seconds:.1f} s)"
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


CASES = {"mlp": mlp_rows, "branches": branch_rows, "resnet50": resnet50_rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {', '.join(CASES)}")
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="seconds after which the cases not started yet are skipped (rows say so)")
    arguments = parser.parse_args()
    cases = arguments.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown case(s) {unknown}; expected some of {list(CASES)}")
    torch = torch_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(0)
    started, rows = time.perf_counter(), []
    for case in cases:
        if time.perf_counter() - started > arguments.budget_s:
            rows.append({"case": case, "variant": f"not run: time budget (--budget-s {arguments.budget_s:g}) spent"})
            continue
        rows += CASES[case](torch, rng)
    columns = [("case", "case"), ("variant", "variant"), ("us_per_iter", "us / iteration"),
               ("vs_torch_graph", "vs torch graph"), ("speedup_vs_eager", "speedup vs eager"),
               ("target", "target"), ("met", "met")]
    print(write_results("plan_overhead", rows, columns, "Plan overhead: ExecutorV2 CUDA graphs vs PyTorch"))


if __name__ == "__main__":
    main()
