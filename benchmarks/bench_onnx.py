"""ONNX models exported by PyTorch, run by GE2 (imported with frontend.onnx, on the GPU), onnxruntime and PyTorch
eager in one process. Outputs are checked before anything is timed.

onnxruntime runs with its CUDA provider when the installed build has one, else the CPU provider: the table says
which. GE2 and PyTorch take device tensors; onnxruntime's CUDA provider is bound to device buffers (I/O binding) so
no host copies are timed; the CPU provider's time is wall-clock (the only way it runs).

Models (random weights): an MLP 1024 -> 4096 -> 1024 (batch 256) and a transformer MLP block (pre-norm
LayerNorm, Linear 768 -> 3072, GELU, Linear 3072 -> 768, residual; 8 x 128 tokens), float32; a GPT-2 block
(``models.gpt.torch_gpt_block``: 768 wide, 12 heads x 64, causal F.scaled_dot_product_attention, which GE2 imports
as one attention node; 8 x 256 tokens) in float32 and float16; ResNet-18 (``models.resnet.torch_resnet18``,
torchvision's layout, eval mode, 8 x 3 x 224 x 224) in float32. Every output is checked against the module in
float64 first (dtype-aware tolerance). TF32 is off on every side. Target: GE2 >= 1.0x onnxruntime CUDA.

Run: python benchmarks/bench_onnx.py
"""
from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from harness import median_ms, torch_cuda, wall_ms, write_results

import graph_executor_v2 as ge2
from graph_executor_v2.frontend import onnx as onnx_frontend
from graph_executor_v2.models.gpt import GPTConfig, torch_gpt_block
from graph_executor_v2.models.resnet import torch_resnet18
from graph_executor_v2.testing import assert_close, torch_mlp_block


def models(torch):
    """name -> (module, input, dtype, reduction length of the tolerance), on the CPU."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
    gpt2 = torch_gpt_block(GPTConfig(context=256, heads=12, width=768, layers=1))
    tokens = torch.randn(8, 256, 768)
    return {"mlp 256x1024->4096->1024": (mlp, torch.randn(256, 1024), "float32", 4096),
            "transformer MLP block 1024x768": (torch_mlp_block(768), torch.randn(1024, 768), "float32", 3072),
            "GPT-2 block 8x256x768, 12 heads": (gpt2, tokens, "float32", 3072),
            "GPT-2 block 8x256x768, 12 heads (f16)": (copy.deepcopy(gpt2).half(), tokens.half(), "float16", 3072),
            "ResNet-18 8x3x224x224": (torch_resnet18(), torch.randn(8, 3, 224, 224), "float32", 4608)}


def exported(torch, module, x, directory: str) -> tuple[str, object]:
    """(path, GE2 graph): ``module`` (eval mode, on the CPU) through torch.onnx.export and GE2's ONNX import."""
    path = str(Path(directory) / "model.onnx")
    torch.onnx.export(module.eval(), (x,), path, input_names=["x"], output_names=["y"])
    return path, onnx_frontend.load(path)


def onnxruntime_runner(onnxruntime, torch, path: str, x):
    """(run, provider, timer): onnxruntime on device buffers with the CUDA provider when it has one, else on host
    arrays with the CPU provider."""
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        session = onnxruntime.InferenceSession(path, providers=["CUDAExecutionProvider"])
        binding = session.io_binding()
        x_cuda = x.cuda().contiguous()
        binding.bind_input("x", "cuda", 0, x.numpy().dtype, list(x_cuda.shape), x_cuda.data_ptr())
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
    torch.backends.cudnn.allow_tf32 = False
    try:
        import onnxruntime
    except ImportError:
        onnxruntime = None
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for name, (module, x, dtype, reduction) in models(torch).items():
            path, graph = exported(torch, module, x, directory)
            executor = ge2.ExecutorV2(graph, device="cuda", precision="highest")  # TF32 off, as PyTorch here
            x_cuda = x.cuda()
            with torch.no_grad():
                expected = copy.deepcopy(module).double().cuda()(x_cuda.double()).cpu().numpy()
                module_cuda = module.cuda()
                assert_close(module_cuda(x_cuda).float().cpu().numpy(), expected, dtype, reduction,
                             what=f"PyTorch {name}")
                ge2_y = executor.run({"x": x_cuda})["y"]
                assert_close(ge2_y.float().cpu().numpy(), expected, dtype, reduction, what=f"GE2 {name}")
                ge2_ms = median_ms(lambda: executor.run({"x": x_cuda}), warmup=10, reps=100)
                torch_ms = median_ms(lambda: module_cuda(x_cuda), warmup=10, reps=100)
            row = {"model": name, "dtype": dtype, "ge2_ms": ge2_ms, "torch_eager_ms": torch_ms,
                   "vs_torch": torch_ms / ge2_ms, "fallbacks": len(executor.fallbacks),
                   "attention_nodes": graph.op_counts().get("attention", 0)}
            if onnxruntime is not None:
                run, provider, timer = onnxruntime_runner(onnxruntime, torch, path, x)
                assert_close(run(), expected, dtype, reduction, what=f"onnxruntime {name}")
                ort_ms = timer(run)
                row.update(ort_provider=provider, ort_ms=ort_ms, vs_ort=ort_ms / ge2_ms,
                           target=">= 1.0x onnxruntime CUDA" if provider == "CUDA" else
                           "(onnxruntime has no CUDA provider here)")
            rows.append(row)
            module.cpu()
    columns = [("model", "model"), ("dtype", "dtype"), ("ge2_ms", "GE2 ms"), ("torch_eager_ms", "torch eager ms"),
               ("vs_torch", "GE2 x vs torch"), ("ort_provider", "onnxruntime provider"), ("ort_ms", "onnxruntime ms"),
               ("vs_ort", "GE2 x vs onnxruntime"), ("fallbacks", "GE2 fallbacks"),
               ("attention_nodes", "GE2 attention nodes"), ("target", "target")]
    print(write_results("onnx", rows, columns, "ONNX models exported by PyTorch: GE2 vs onnxruntime and PyTorch eager"))


if __name__ == "__main__":
    main()
