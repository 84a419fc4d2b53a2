"""Where the host time of one op call goes (gemm 64x256x128 float16, softmax over 64x256): each layer of the face's
call path timed alone, down to the native launch, next to the PyTorch call. Run on the GPU machine:
python scripts/profile_gemm_overhead.py"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from harness import host_overhead_us  # noqa: E402  (also puts python/ on the path)

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.ops import _face  # noqa: E402


def main():
    import torch

    ops = ge2.ops
    half = dict(device="cuda", dtype=torch.float16)
    ta, tb, tbias = torch.zeros(64, 128, **half), torch.zeros(128, 256, **half), torch.zeros(256, **half)
    ty, tx = torch.empty(64, 256, **half), torch.zeros(64, 256, **half)
    runtime = ge2.device.runtime()
    a, b = runtime.DeviceArray.empty([64, 128], "float16"), runtime.DeviceArray.empty([128, 256], "float16")
    bias, y = runtime.DeviceArray.empty([256], "float16"), runtime.DeviceArray.empty([64, 256], "float16")
    for array in (a, b, bias, y):
        array.zero()
    face = _face.FACES["gemm"]
    entry = face._entry("gemm.forward", [ta, tb, tbias, None], ("relu",), "auto")
    launch, pointers, out_pointers = entry.launch, [ta.data_ptr(), tb.data_ptr(), tbias.data_ptr(), 0], [ty.data_ptr()]
    prepared, prepared_device = ops.gemm.prepare(ta, tb, tbias, act="relu"), ops.gemm.prepare(a, b, bias, act="relu")
    native, softmax_native = ops.gemm._native_module(), ops.softmax._native_module()
    softmax_kernel = ops.softmax.prepare(tx).kernel  # the selector's choice: the binding runs what it is named
    raw = lambda kernel: native.forward(a.ptr, b.ptr, 0, bias.ptr, y.ptr, 0, 64, 256, 128, "float16",  # noqa: E731
                                        False, False, 1.0, 0.0, "relu", 0.01, False, kernel, 0)
    rows = {
        "device.signature(torch)": lambda: ge2.device.signature(ta),
        "device.signature(DeviceArray)": lambda: ge2.device.signature(a),
        "device.view_of(torch) (the slow path)": lambda: ge2.device.view_of(ta, "a"),
        "torch.empty (a new output)": lambda: torch.empty(64, 256, **half),
        "cached entry lookup, the slow path (3 torch inputs)": lambda: face._entry("gemm.forward",
                                                                               [ta, tb, tbias, None], ("relu",), "auto"),
        "native prepared call's checks and launch (try_call)": lambda: entry.call.try_call([ta, tb, tbias, None], ty,
                                                                                            None),
        f"candidate launch ({entry.kernel}), pointers given": lambda: launch(pointers, out_pointers, 0),
        "native forward, tiled (launch only)": lambda: raw("tiled"),
        "native forward, cublaslt_epilogue": lambda: raw("cublaslt_epilogue"),
        "softmax binding, launch only": lambda: softmax_native.forward("softmax", tx.data_ptr(), ty.data_ptr(), 64, 256,
                                                                       1, "float16", softmax_kernel, 0),
        "gemm.prepare(...)(DeviceArray, out=)": lambda: prepared_device(a, b, bias, out=y),
        "gemm.prepare(...)(torch, out=)": lambda: prepared(ta, tb, tbias, out=ty),
        "gemm.forward(torch, out=)": lambda: ops.gemm.forward(ta, tb, tbias, act="relu", out=ty),
        "gemm.forward(torch)": lambda: ops.gemm.forward(ta, tb, tbias, act="relu"),
        "torch._addmm_activation": lambda: torch._addmm_activation(tbias, ta, tb),
        "softmax.forward(torch)": lambda: ops.softmax.forward(tx),
        "torch.softmax": lambda: torch.softmax(tx, -1),
    }
    for name, fn in rows.items():
        print(f"{name:<48} {host_overhead_us(fn):7.2f} us/call")


if __name__ == "__main__":
    main()
