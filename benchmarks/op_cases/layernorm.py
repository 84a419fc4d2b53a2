"""layernorm vs PyTorch: float16 16384 x 4096. GE2's forward runs as a plan would (the prepared candidate launch,
one binding call, y only); its backward is the native call with saved statistics, preallocated gradients and
workspace. PyTorch runs what its autograd runs: native_layer_norm and native_layer_norm_backward."""
from __future__ import annotations

from graph_executor_v2.ops import _row_norm, layernorm

from ._launch import close, holding, prepared

ROWS, COLS, EPS = 16384, 4096, 1e-5


def cases(torch):
    f16 = torch.float16
    x = torch.randn(ROWS, COLS, device="cuda", dtype=f16)
    dy = torch.randn(ROWS, COLS, device="cuda", dtype=f16)
    gamma = torch.randn(COLS, device="cuda", dtype=f16)
    beta = torch.randn(COLS, device="cuda", dtype=f16)
    y = torch.empty_like(x)
    element_bytes = ROWS * COLS * 2

    forward = prepared("layernorm", (x, gamma, beta), (y,), {"eps": EPS})

    def torch_forward():
        return torch.ops.aten.native_layer_norm(x, [COLS], gamma, beta, EPS)

    def check_forward():
        forward()
        close(torch, y, torch_forward()[0], "layernorm forward", rtol=4e-3, atol=4e-3)

    _, mean, rstd = layernorm.forward(x, gamma, beta, eps=EPS, save_stats=True)
    _, torch_mean, torch_rstd = torch_forward()
    dx, dgamma, dbeta = torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(beta)
    native = layernorm._native_module()
    kernel = _row_norm.choose_kernel(native, "auto", COLS, "float16", True, True)  # the selector's choice
    workspace_bytes = native.backward_workspace_bytes(ROWS, COLS, "float16", kernel, True)
    workspace = torch.empty(workspace_bytes // 4, device="cuda", dtype=torch.float32)
    operands = (dy, x, gamma, mean, rstd, dx, dgamma, dbeta, workspace)
    pointers = [t.data_ptr() for t in operands]
    # `backward` holds the operands: mean, rstd and the workspace are referenced nowhere else, and once freed the
    # caching allocator hands their memory to later allocations (PyTorch's forward outputs, same sizes), so the
    # backward would read whatever statistics were written there last.
    backward = holding(lambda: native.backward(*pointers, workspace_bytes, ROWS, COLS, "float16", EPS, kernel, 0),
                       *operands)

    def torch_backward():
        return torch.ops.aten.native_layer_norm_backward(dy, x, [COLS], torch_mean, torch_rstd, gamma, beta,
                                                         [True, True, True])

    def check_backward():
        backward()
        expected = torch_backward()
        close(torch, dx, expected[0], "layernorm backward dx", rtol=4e-3, atol=4e-3)
        for name, got, ref in (("dgamma", dgamma, expected[1]), ("dbeta", dbeta, expected[2])):
            scale = ref.float().abs().max().item()  # sums over 16384 rows: compare relative to their size
            close(torch, got, ref, f"layernorm backward {name}", rtol=1e-2, atol=1e-2 * scale)

    stats_bytes = 2 * ROWS * 4
    return [
        {"name": f"layernorm fwd f16 {ROWS}x{COLS}", "ge2": forward, "torch": torch_forward, "check": check_forward,
         "bytes": 2 * element_bytes + 2 * COLS * 2, "target": {"tb_s": 2.4}},
        {"name": f"layernorm bwd f16 {ROWS}x{COLS}", "ge2": backward, "torch": torch_backward,
         "check": check_backward, "bytes": 3 * element_bytes + stats_bytes + 3 * COLS * 2,
         "target": {"copy_fraction": 0.7}},
    ]
