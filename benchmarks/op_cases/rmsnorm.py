"""rmsnorm vs PyTorch: float16 16384 x 4096. GE2's forward runs as a plan would (the prepared candidate launch,
one binding call, y only); its backward is the native call with the saved rstd, preallocated gradients and
workspace. PyTorch runs F.rms_norm and, for the backward, its fused aten kernel where this build has one
(_fused_rms_norm_backward), else the autograd backward of F.rms_norm (or of a composite on old builds)."""
from __future__ import annotations

from graph_executor_v2.ops import _row_norm, rmsnorm

from ._launch import close, holding, prepared

ROWS, COLS, EPS = 16384, 4096, 1e-6


def _torch_rms_norm(torch, x, gamma):
    if hasattr(torch.nn.functional, "rms_norm"):
        return torch.nn.functional.rms_norm(x, (COLS,), gamma, EPS)
    return _float32_rms_norm(torch, x, gamma).to(x.dtype)


def _float32_rms_norm(torch, x, gamma):
    """The checks' reference: float32 math whatever PyTorch's half kernels accumulate in."""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS) * gamma.float()


def _torch_backward(torch, x, gamma, dy):
    """(dx, dgamma) as PyTorch's training step computes them: the fused aten kernel when there is one."""
    fused = getattr(torch.ops.aten, "_fused_rms_norm_backward", None)
    if fused is not None:
        try:
            _, rstd = torch.ops.aten._fused_rms_norm(x, [COLS], gamma, EPS)
            run = lambda: fused(dy, x, [COLS], rstd, gamma, [True, True])  # noqa: E731
            run()
            return run
        except (RuntimeError, TypeError, AttributeError):
            pass  # another signature in this build: time what autograd runs instead
    x_leaf, gamma_leaf = x.detach().requires_grad_(), gamma.detach().requires_grad_()
    y = _torch_rms_norm(torch, x_leaf, gamma_leaf)
    return lambda: torch.autograd.grad(y, (x_leaf, gamma_leaf), dy, retain_graph=True)


def cases(torch):
    f16 = torch.float16
    x = torch.randn(ROWS, COLS, device="cuda", dtype=f16)
    dy = torch.randn(ROWS, COLS, device="cuda", dtype=f16)
    gamma = torch.randn(COLS, device="cuda", dtype=f16)
    y = torch.empty_like(x)
    element_bytes = ROWS * COLS * 2

    forward = prepared("rmsnorm", (x, gamma), (y,), {"eps": EPS})

    def torch_forward():
        return _torch_rms_norm(torch, x, gamma)

    def check_forward():
        forward()
        close(torch, y, _float32_rms_norm(torch, x, gamma), "rmsnorm forward", rtol=4e-3, atol=4e-3)

    _, rstd = rmsnorm.forward(x, gamma, eps=EPS, save_stats=True)
    dx, dgamma = torch.empty_like(x), torch.empty_like(gamma)
    native = rmsnorm._native_module()
    kernel = _row_norm.choose_kernel(native, "auto", COLS, "float16", True, True)  # the selector's choice
    workspace_bytes = native.backward_workspace_bytes(ROWS, COLS, "float16", kernel, True)
    workspace = torch.empty(workspace_bytes // 4, device="cuda", dtype=torch.float32)
    operands = (dy, x, gamma, None, rstd, dx, dgamma, None, workspace)  # no mean, no dbeta: 0
    pointers = [0 if t is None else t.data_ptr() for t in operands]
    # `backward` holds the operands: rstd and the workspace are referenced nowhere else (freed, their memory would
    # go to the next allocation while the backward still reads and writes it).
    backward = holding(lambda: native.backward(*pointers, workspace_bytes, ROWS, COLS, "float16", EPS, kernel, 0),
                       *(t for t in operands if t is not None))

    torch_backward = _torch_backward(torch, x, gamma, dy)

    def check_backward():
        backward()
        x32, gamma32 = x.float().requires_grad_(), gamma.float().requires_grad_()
        expected_dx, expected_dgamma = torch.autograd.grad(_float32_rms_norm(torch, x32, gamma32), (x32, gamma32),
                                                           dy.float())
        close(torch, dx, expected_dx, "rmsnorm backward dx", rtol=4e-3, atol=4e-3)
        scale = expected_dgamma.float().abs().max().item()  # a sum over 16384 rows: compare relative to its size
        close(torch, dgamma, expected_dgamma, "rmsnorm backward dgamma", rtol=1e-2, atol=1e-2 * scale)

    return [
        {"name": f"rmsnorm fwd f16 {ROWS}x{COLS}", "ge2": forward, "torch": torch_forward, "check": check_forward,
         "bytes": 2 * element_bytes + COLS * 2, "target": {"tb_s": 2.4}},
        {"name": f"rmsnorm bwd f16 {ROWS}x{COLS}", "ge2": backward, "torch": torch_backward,
         "check": check_backward, "bytes": 3 * element_bytes + ROWS * 4 + 2 * COLS * 2,
         "target": {"copy_fraction": 0.7}},
    ]
