"""ONNX models exported by PyTorch, run by GE2 (imported with frontend.onnx, on the GPU), onnxruntime and PyTorch
eager in one process. Outputs are checked against PyTorch before anything is timed.

onnxruntime runs with its CUDA provider when the installed build has one, else the CPU provider: the table says
which. GE2 and PyTorch take device tensors; onnxruntime's CUDA provider is bound to device buffers (I/O binding) so
no host copies are timed; the CPU provider's time is wall-clock (the only way it runs).

Models (random weights, float32): an MLP 1024 -> 4096 -> 1024 (batch 256) and a transformer MLP block (pre-norm
LayerNorm, Linear 768 -> 3072, GELU, Linear 3072 -> 768, residual; 8 x 128 tokens). Target: GE2 >= 1.0x
onnxruntime CUDA.

Run: python benchmarks/bench_onnx.py
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import median_ms, torch_cuda, write_results

import graph_executor_v2 as ge2
from graph_executor_v2.frontend import onnx as onnx_frontend
from graph_executor_v2.testing import assert_close, torch_mlp_block


def models(torch):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
    return {"mlp 256x1024->4096->1024": (mlp, torch.randn(256, 1024), 4096),
            "transformer MLP block 1024x768": (torch_mlp_block(768), torch.randn(1024, 768), 3072)}


def wall_ms(fn, warmup=5, reps=30) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def onnxruntime_runner(onnxruntime, torch, path: str, x):
    """(run, provider, timer): onnxruntime on device buffers with the CUDA provider when it has one, else on host
    arrays with the CPU provider."""
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        session = onnxruntime.InferenceSession(path, providers=["CUDAExecutionProvider"])
        binding = session.io_binding()
        x_cuda = x.cuda().contiguous()
        binding.bind_input("x", "cuda", 0, np.float32, list(x_cuda.shape), x_cuda.data_ptr())
        binding.bind_output("y", "cuda")

        def run():
            session.run_with_iobinding(binding)
            return binding.copy_outputs_to_cpu()[0]

        return run, "CUDA", lambda fn: median_ms(lambda: session.run_with_iobinding(binding))
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    host = x.numpy()
    return (lambda: session.run(None, {"x": host})[0]), "CPU", wall_ms


def main():
    torch = torch_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        import onnxruntime
    except ImportError:
        onnxruntime = None
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for name, (module, x, reduction) in models(torch).items():
            module.eval()
            path = str(Path(directory) / "model.onnx")
            torch.onnx.export(module, (x,), path, input_names=["x"], output_names=["y"])
            executor = ge2.ExecutorV2(onnx_frontend.load(path), device="cuda")
            module_cuda, x_cuda = module.cuda(), x.cuda()
            with torch.no_grad():
                expected = module_cuda(x_cuda).double().cpu().numpy()
                ge2_y = executor.run({"x": x_cuda})["y"]
                assert_close(ge2_y.cpu().numpy(), expected, "float32", reduction, what=f"GE2 {name}")
                ge2_ms = median_ms(lambda: executor.run({"x": x_cuda}), warmup=10, reps=100)
                torch_ms = median_ms(lambda: module_cuda(x_cuda), warmup=10, reps=100)
            row = {"model": name, "ge2_ms": ge2_ms, "torch_eager_ms": torch_ms, "vs_torch": torch_ms / ge2_ms,
                   "fallbacks": len(executor.fallbacks)}
            if onnxruntime is not None:
                run, provider, timer = onnxruntime_runner(onnxruntime, torch, path, x)
                assert_close(run(), expected, "float32", reduction, what=f"onnxruntime {name}")
                ort_ms = timer(run)
                row.update(ort_provider=provider, ort_ms=ort_ms, vs_ort=ort_ms / ge2_ms,
                           target=">= 1.0x onnxruntime CUDA" if provider == "CUDA" else
                           "(onnxruntime has no CUDA provider here)")
            rows.append(row)
            module.cpu()
    columns = [("model", "model"), ("ge2_ms", "GE2 ms"), ("torch_eager_ms", "torch eager ms"),
               ("vs_torch", "GE2 x vs torch"), ("ort_provider", "onnxruntime provider"), ("ort_ms", "onnxruntime ms"),
               ("vs_ort", "GE2 x vs onnxruntime"), ("fallbacks", "GE2 fallbacks"), ("target", "target")]
    print(write_results("onnx", rows, columns, "ONNX models: GE2 vs onnxruntime and PyTorch eager (float32)"))


if __name__ == "__main__":
    main()
