"""MLP inference: ExecutorV2 (cuda) vs PyTorch eager, one process, one GPU. Correctness first, then medians.

- small: 64x128 -> 256 -> 11, float32, relu. Launch-bound: what counts is the CUDA graph (bench_plan_overhead.py).
- large: 4096x1024 -> 4096 -> 4096 -> 1024, float16, GELU (tanh). Compute-bound: GE2 fuses bias + GELU into the
  GEMM epilogue where PyTorch eager runs F.linear then a separate activation kernel. Target: >= 1.0x.

Both sides take a torch tensor and return a torch tensor; ExecutorV2 copies the input into its arena and the
result out of it (two device copies per run, counted in its time) and replays the plan as a CUDA graph; PyTorch
runs eager and as a CUDA-graph replay of the same forward (static input, no copy). Strict float32 math (no TF32)
on both sides.
Timing: CUDA-event medians with the L2 flushed between repetitions (benchmarks/harness.py).

Run: python benchmarks/bench_mlp_inference.py
"""
from __future__ import annotations

import numpy as np
from harness import median_ms, torch_cuda, write_results

import graph_executor_v2 as ge2
from graph_executor_v2.testing import assert_close, mlp

CASES = [
    {"case": "small", "batch": 64, "sizes": (128, 256, 11), "dtype": "float32", "activation": "relu"},
    {"case": "large", "batch": 4096, "sizes": (1024, 4096, 4096, 1024), "dtype": "float16", "activation": "gelu"},
]


def torch_mlp(torch, graph, layer_count: int, activation: str):
    """PyTorch eager on the graph's own weights: F.linear (+ activation) per layer."""
    F = torch.nn.functional
    act = (lambda z: F.gelu(z, approximate="tanh")) if activation == "gelu" else F.relu
    layers = [(torch.from_numpy(np.ascontiguousarray(graph.params[f"w{i}"].data.T)).cuda(),  # (out, in)
               torch.from_numpy(graph.params[f"b{i}"].data.copy()).cuda()) for i in range(layer_count)]

    def run(x):
        for index, (w, b) in enumerate(layers):
            x = F.linear(x, w, b)
            if index < layer_count - 1:
                x = act(x)
        return x

    return run


def torch_graph(torch, forward, static_x):
    """A PyTorch CUDA graph of ``forward(static_x)``, captured the documented way (warm-up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            forward(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = forward(static_x)
    return graph, static_y


def relative_error(actual, expected) -> str:
    """Max abs error over max |expected|, formatted (the table's fixed 3 decimals would show 0.000)."""
    return f"{np.max(np.abs(actual.astype(np.float64) - expected)) / np.max(np.abs(expected)):.1e}"


def bench(torch, case, rng) -> dict:
    sizes, dtype = case["sizes"], case["dtype"]
    graph, reference = mlp(rng, sizes, dtype, case["activation"], batch=case["batch"])
    executor = ge2.ExecutorV2(graph, device="cuda")
    eager = torch_mlp(torch, graph, len(sizes) - 1, case["activation"])
    x_host = (rng.standard_normal((case["batch"], sizes[0]))).astype(dtype)
    x = torch.from_numpy(x_host).cuda()

    expected = reference(x_host)
    ge2_y = executor.run({"x": x})["y"].cpu().numpy()
    torch_y = eager(x).cpu().numpy()
    assert_close(ge2_y, expected, dtype, max(sizes), what=f"GE2 {case['case']} MLP")

    graph, static_y = torch_graph(torch, eager, x.clone())
    graph.replay()
    assert_close(static_y.cpu().numpy(), expected, dtype, max(sizes), what=f"PyTorch graph {case['case']} MLP")

    ge2_ms = median_ms(lambda: executor.run({"x": x}), warmup=20, reps=200)
    torch_ms = median_ms(lambda: eager(x), warmup=20, reps=200)
    graph_ms = median_ms(graph.replay, warmup=20, reps=200)
    flops = 2.0 * case["batch"] * sum(a * b for a, b in zip(sizes, sizes[1:]))
    return {
        "case": case["case"], "shape": f"{case['batch']}x" + "->".join(map(str, sizes)), "dtype": dtype,
        "activation": case["activation"], "ge2_ms": ge2_ms, "torch_eager_ms": torch_ms,
        "speedup": torch_ms / ge2_ms, "torch_graph_ms": graph_ms, "vs_torch_graph": graph_ms / ge2_ms,
        "ge2_tflops": flops / (ge2_ms * 1e-3) / 1e12,
        "torch_tflops": flops / (torch_ms * 1e-3) / 1e12,
        "ge2_rel_err": relative_error(ge2_y, expected), "torch_rel_err": relative_error(torch_y, expected),
        "ge2_kernels": "+".join(s.kernel for s in executor.plans[0].selections),
        "ge2_cuda_graph": executor.plans[0].capture,
        "fallbacks": len(executor.fallbacks),
        "target": ">= 1.0x" if case["case"] == "large" else "report (launch-bound)",
    }


def main():
    torch = torch_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(0)
    rows = [bench(torch, case, rng) for case in CASES]
    columns = [("case", "case"), ("shape", "shape"), ("dtype", "dtype"), ("activation", "act"),
               ("ge2_ms", "GE2 ms"), ("torch_eager_ms", "torch eager ms"), ("speedup", "speedup"),
               ("torch_graph_ms", "torch graph ms"), ("vs_torch_graph", "speedup vs torch graph"),
               ("ge2_tflops", "GE2 TFLOP/s"), ("torch_tflops", "torch TFLOP/s"), ("ge2_rel_err", "GE2 rel err"),
               ("torch_rel_err", "torch rel err"), ("ge2_kernels", "GE2 kernels"), ("ge2_cuda_graph", "GE2 CUDA graph"),
               ("fallbacks", "fallbacks"), ("target", "target")]
    print(write_results("mlp_inference", rows, columns,
                        "MLP inference: ExecutorV2 (cuda) vs PyTorch eager and CUDA graph"))


if __name__ == "__main__":
    main()
