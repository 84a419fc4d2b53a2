"""softmax / log_softmax vs PyTorch: float16 16384 x 4096 over the last axis (GE2's block_row kernel), plus a short-row
shape (warp_row) and a non-last axis (strided). GE2's forward runs as a plan would (the prepared candidate launch,
one binding call); its backward is the native call on preallocated dx. PyTorch runs what its autograd runs:
_softmax / _log_softmax and their backward_data kernels. Bytes: x read + y written (forward); y and dy read + dx
written (backward)."""
from __future__ import annotations

from graph_executor_v2.ops import softmax

from ._launch import close, prepared

ROWS, COLS = 16384, 4096


def cases(torch):
    f16 = torch.float16
    aten = torch.ops.aten
    native = softmax._native_module()
    result = []

    def forward_case(name, op, shape, axis, target):
        x = torch.randn(*shape, device="cuda", dtype=f16) * 3
        y = torch.empty_like(x)
        run = prepared(op, (x,), (y,), {"axis": axis})
        torch_op = aten._softmax if op == "softmax" else aten._log_softmax

        def torch_forward():
            return torch_op(x, axis, False)

        def check():
            run()
            close(torch, y, torch_forward(), name)

        result.append({"name": name, "ge2": run, "torch": torch_forward, "check": check, "bytes": 2 * x.nbytes,
                       "target": target})

    def backward_case(name, op):
        x = torch.randn(ROWS, COLS, device="cuda", dtype=f16) * 3
        y = (aten._softmax if op == "softmax" else aten._log_softmax)(x, -1, False)
        dy = torch.randn_like(x)
        dx = torch.empty_like(x)
        torch_op = aten._softmax_backward_data if op == "softmax" else aten._log_softmax_backward_data
        kernel = softmax._backward_kernel("auto", COLS, 1, "float16")  # the selector's choice

        def run():
            native.backward(op, y.data_ptr(), dy.data_ptr(), dx.data_ptr(), ROWS, COLS, 1, "float16", kernel, 0)

        def torch_backward():
            return torch_op(dy, y, -1, f16)

        def check():
            run()
            close(torch, dx, torch_backward(), name)

        result.append({"name": name, "ge2": run, "torch": torch_backward, "check": check, "bytes": 3 * x.nbytes,
                       "target": {"copy_fraction": 0.7}})

    forward_case(f"softmax fwd f16 {ROWS}x{COLS}", "softmax", (ROWS, COLS), -1, {"tb_s": 2.4})
    forward_case(f"log_softmax fwd f16 {ROWS}x{COLS}", "log_softmax", (ROWS, COLS), -1, {"tb_s": 2.4})
    backward_case(f"softmax bwd f16 {ROWS}x{COLS}", "softmax")
    backward_case(f"log_softmax bwd f16 {ROWS}x{COLS}", "log_softmax")
    forward_case("softmax fwd f16 65536x512 (warp_row)", "softmax", (65536, 512), -1, {"tb_s": 2.4})
    forward_case("softmax fwd f16 64x1024x512 axis=1 (strided)", "softmax", (64, 1024, 512), 1, {})
    return result
