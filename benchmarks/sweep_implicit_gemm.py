"""conv2d implicit_gemm: every tile config (forced with GE2_IMPLICIT_GEMM_CONFIG) and the launch rule's own choice
("auto") against PyTorch's cuDNN (cudnn.benchmark=True) on the ResNet-50 rows (N=32) in float16 NHWC: the three 3x3
layers the issue's target (GE2's own forward >= 0.7x PyTorch) is about, and two 1x1 layers. Each config is checked
against F.conv2d on channels_last views of the same memory (relative error < 5e-3) before it is timed; times are
device time per call in a CUDA-graph replay (kernel against kernel, no host time). The table shows which config to
choose for which shape (choose_config in kernels/implicit_gemm.cu).

Run: python benchmarks/sweep_implicit_gemm.py [--configs=0,2,auto]
"""
from __future__ import annotations

import os
import re
import sys

from harness import graph_replay_ms, torch_cuda, write_results

from graph_executor_v2.ops import conv2d

BATCH = 32
VARIABLE = "GE2_IMPLICIT_GEMM_CONFIG"
# (C, H, K, R, stride), padding R // 2.
SHAPES = [(64, 56, 64, 3, 1), (128, 28, 128, 3, 1), (256, 14, 256, 3, 1), (256, 56, 64, 1, 1), (512, 28, 128, 1, 1)]


def config_names() -> dict[str, str]:
    """Config index -> its tile shape, as kernels() lists them; "auto" leaves the choice to the launch rule."""
    description = next(row["description"] for row in conv2d.kernels() if row["name"] == "implicit_gemm")
    names = {index: f"{bm}x{bn} {warps}w {stages}s ({details})"
             for index, bm, bn, warps, stages, details in re.findall(
                 r"(\d+) = (\d+)x(\d+) (\d+) warps (\d+) stages \(([^)]*)\)", description)}
    return {**names, "auto": "launch rule"}


def relative_error(actual, expected) -> float:
    expected = expected.float()
    return ((actual.float() - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item()


def sweep_shape(torch, shape, configs: dict[str, str]) -> list[dict]:
    F = torch.nn.functional
    c, h, k, r, stride = shape
    padding = r // 2
    x = torch.randn(BATCH, h, h, c, device="cuda", dtype=torch.float16)
    w = torch.randn(k, r, r, c, device="cuda", dtype=torch.float16) / (c * r * r) ** 0.5
    x_torch, w_torch = x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2)  # channels_last views of the same memory
    attrs = dict(stride=stride, padding=padding, layout="NHWC")

    def torch_forward():
        return F.conv2d(x_torch, w_torch, stride=stride, padding=padding)

    expected = torch_forward()
    torch_ms = graph_replay_ms(torch_forward)
    p = (h + 2 * padding - r) // stride + 1
    flops = 2.0 * BATCH * k * p * p * c * r * r
    y = torch.empty(BATCH, p, p, k, device="cuda", dtype=torch.float16)

    def ge2_forward():
        return conv2d.forward(x, w, **attrs, kernel="implicit_gemm", out=y, stream=torch.cuda.current_stream())

    rows = []
    for config, name in configs.items():
        if config == "auto":
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = config
        y.fill_(float("nan"))
        ge2_forward()
        error = relative_error(y.permute(0, 3, 1, 2), expected)
        if not error < 5e-3:
            raise AssertionError(f"implicit_gemm config {config} ({name}) disagrees with torch at {shape}: relative "
                                 f"error {error}")
        ge2_ms = graph_replay_ms(ge2_forward)
        rows.append({"config": f"{config}: {name}", "shape": f"C{c} H{h} K{k} R{r} s{stride}", "ge2_ms": ge2_ms,
                     "torch_ms": torch_ms, "ratio": torch_ms / ge2_ms, "ge2_tflops": flops / (ge2_ms * 1e-3) / 1e12,
                     "torch_tflops": flops / (torch_ms * 1e-3) / 1e12, "max_rel_err": error,
                     "target": ("yes" if torch_ms / ge2_ms >= 0.7 else "NO") if r == 3 else ""})
    os.environ.pop(VARIABLE, None)
    return rows


def main() -> None:
    torch = torch_cuda()
    torch.backends.cudnn.benchmark = True
    configs = config_names()
    chosen = [arg.split("=", 1)[1].split(",") for arg in sys.argv[1:] if arg.startswith("--configs=")]
    if chosen:
        unknown = [name for name in chosen[-1] if name not in configs]
        if unknown:
            sys.exit(f"--configs: expected some of {', '.join(configs)}, got {', '.join(unknown)}")
        configs = {name: configs[name] for name in chosen[-1]}
    rows = []
    for shape in SHAPES:
        for row in sweep_shape(torch, shape, configs):
            rows.append(row)
            print(f"{row['shape']:>20} | config {row['config']:<64} | GE2 {row['ge2_ms'] * 1e3:7.1f} us | torch "
                  f"{row['torch_ms'] * 1e3:7.1f} us | x{row['ratio']:.3f} | {row['ge2_tflops']:6.1f} TFLOP/s "
                  f"{row['target']}", flush=True)
    columns = [("shape", "shape (N=32)"), ("config", "config"), ("ge2_ms", "GE2 ms (graph)"),
               ("torch_ms", "torch ms (graph)"), ("ratio", "x vs torch"), ("ge2_tflops", "GE2 TFLOP/s"),
               ("torch_tflops", "torch TFLOP/s"), ("max_rel_err", "max rel err"), ("target", "3x3 >= 0.7x")]
    print(write_results("sweep_implicit_gemm", rows, columns,
                        "conv2d implicit_gemm tile configs vs PyTorch cuDNN, float16 NHWC forward"))


if __name__ == "__main__":
    main()
