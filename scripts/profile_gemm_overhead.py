"""Where the host time of one gemm.forward call goes (64x256x128 float16): each layer of the call timed alone.
Run on the GPU machine: python scripts/profile_gemm_overhead.py"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from harness import host_overhead_us  # noqa: E402  (also puts python/ on the path)

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.ops import gemm  # noqa: E402


def main():
    import torch

    runtime = ge2.device.runtime()
    a, b = runtime.DeviceArray.empty([64, 128], "float16"), runtime.DeviceArray.empty([128, 256], "float16")
    bias, y = runtime.DeviceArray.empty([256], "float16"), runtime.DeviceArray.empty([64, 256], "float16")
    for array in (a, b, bias, y):
        array.zero()
    ta = torch.zeros(64, 128, device="cuda", dtype=torch.float16)
    tb = torch.zeros(128, 256, device="cuda", dtype=torch.float16)
    tbias = torch.zeros(256, device="cuda", dtype=torch.float16)
    native = gemm._native_module()
    raw = lambda kernel: native.forward(a.ptr, b.ptr, 0, bias.ptr, y.ptr, 0, 64, 256, 128, "float16",  # noqa: E731
                                        False, False, 1.0, 0.0, "relu", 0.01, False, kernel, 0)
    rows = {
        "view_of(DeviceArray)": lambda: ge2.device.view_of(a, "A"),
        "view_of(torch)": lambda: ge2.device.view_of(ta, "A"),
        "DeviceArray.ptr": lambda: a.ptr,
        "native forward, tiled (launch only)": lambda: raw("tiled"),
        "native forward, cublaslt_epilogue": lambda: raw("cublaslt_epilogue"),
        "native forward, auto": lambda: raw("auto"),
        "gemm.forward(DeviceArray, out=)": lambda: gemm.forward(a, b, bias, act="relu", out=y),
        "torch._addmm_activation": lambda: torch._addmm_activation(tbias, ta, tb),
    }
    for name, fn in rows.items():
        print(f"{name:<40} {host_overhead_us(fn):7.2f} us/call")


if __name__ == "__main__":
    main()
