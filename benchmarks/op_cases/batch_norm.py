"""batch_norm vs PyTorch on ResNet-50 shapes (N=32): 256 x 56 x 56 and 64 x 112 x 112, float16 NHWC (PyTorch
channels_last, float32 parameters as under autocast) and float32 NCHW; training forward (statistics, running
update, y), inference forward, and training backward (dx, dgamma, dbeta from the saved statistics). GE2 runs as a
plan would (the prepared candidate launch, one binding call). PyTorch runs what its autograd runs:
native_batch_norm and native_batch_norm_backward. Bytes: x read + y written (forward); dy, x read + dx written
(backward); target 85% of copy bandwidth. The training forward reads x twice (statistics, then y) and the backward
reads dy and x twice; the second pass walks backwards to reuse what L2 still holds."""
from __future__ import annotations

from graph_executor_v2.ops import batch_norm

from ._launch import prepared

TARGET = {"copy_fraction": 0.85}
EPS, MOMENTUM = 1e-5, 0.1
SHAPES = ((32, 256, 56, 56), (32, 64, 112, 112))


def _close(torch, actual, expected, what, rtol=2e-3, atol=2e-3):
    if not torch.allclose(actual.float(), expected.float(), rtol=rtol, atol=atol):
        error = (actual.float() - expected.float()).abs().max().item()
        raise AssertionError(f"{what}: GE2 disagrees with PyTorch (max abs error {error:.3e})")


def _operands(torch, shape, dtype, layout):
    """(x in GE2's layout, the same values as PyTorch's NCHW-shaped tensor, gamma, beta, running mean, var)."""
    channels = shape[1]
    x_torch = torch.randn(*shape, device="cuda", dtype=dtype) + 1.0
    if layout == "NHWC":
        x_torch = x_torch.contiguous(memory_format=torch.channels_last)
    x = x_torch.permute(0, 2, 3, 1) if layout == "NHWC" else x_torch  # contiguous in GE2's layout
    return (x, x_torch, torch.randn(channels, device="cuda"), torch.randn(channels, device="cuda"),
            torch.zeros(channels, device="cuda"), torch.ones(channels, device="cuda"))


def _as_layout(t, layout):
    return t.permute(0, 2, 3, 1) if layout == "NHWC" else t


def _forward_case(torch, shape, dtype, layout, tag, training):
    x, x_torch, gamma, beta, running_mean, running_var = _operands(torch, shape, dtype, layout)
    y = torch.empty_like(x)
    stats = [torch.empty_like(gamma) for _ in range(4)]
    run = prepared("batch_norm", (x, gamma, beta, running_mean, running_var), (y, *stats),
                   {"training": training, "momentum": MOMENTUM, "eps": EPS, "layout": layout})
    torch_mean, torch_var = running_mean.clone(), running_var.clone()

    def torch_forward():
        return torch.ops.aten.native_batch_norm(x_torch, gamma, beta, torch_mean, torch_var, training, MOMENTUM, EPS)

    def check():
        run()
        _close(torch, y, _as_layout(torch_forward()[0], layout), f"batch_norm forward (training={training})")

    mode = "train" if training else "infer"
    return {"name": f"batch_norm {mode} fwd {tag} {'x'.join(map(str, shape))}", "ge2": run, "torch": torch_forward,
            "check": check, "bytes": 2 * x.nbytes, "target": TARGET}


def _backward_case(torch, shape, dtype, layout, tag):
    x, x_torch, gamma, beta, running_mean, running_var = _operands(torch, shape, dtype, layout)
    _, saved_mean, saved_invstd, _, _ = batch_norm.forward(x, gamma, beta, running_mean, running_var, training=True,
                                                           layout=layout)
    dy_torch = torch.randn_like(x_torch)
    dy = _as_layout(dy_torch, layout)
    dx, dgamma, dbeta = torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(beta)
    run = prepared("batch_norm_backward", (dy, x, gamma, saved_mean, saved_invstd), (dx, dgamma, dbeta),
                   {"training": True, "layout": layout})
    _, torch_mean, torch_invstd = torch.ops.aten.native_batch_norm(x_torch, gamma, beta, running_mean.clone(),
                                                                   running_var.clone(), True, MOMENTUM, EPS)

    def torch_backward():
        return torch.ops.aten.native_batch_norm_backward(dy_torch, x_torch, gamma, None, None, torch_mean,
                                                         torch_invstd, True, EPS, [True, True, True])

    def check():
        run()
        expected = torch_backward()
        _close(torch, dx, _as_layout(expected[0], layout), "batch_norm backward dx")
        for name, got, ref in (("dgamma", dgamma, expected[1]), ("dbeta", dbeta, expected[2])):
            scale = ref.abs().max().item()  # sums over ~100k values: relative to their size
            _close(torch, got, ref, f"batch_norm backward {name}", rtol=1e-2, atol=1e-3 * scale)

    return {"name": f"batch_norm train bwd {tag} {'x'.join(map(str, shape))}", "ge2": run, "torch": torch_backward,
            "check": check, "bytes": 3 * x.nbytes, "target": TARGET}


def cases(torch):
    result = []
    for dtype, layout, tag in ((torch.float16, "NHWC", "f16 NHWC"), (torch.float32, "NCHW", "f32 NCHW")):
        for shape in SHAPES:
            result.append(_forward_case(torch, shape, dtype, layout, tag, training=True))
            result.append(_forward_case(torch, shape, dtype, layout, tag, training=False))
            result.append(_backward_case(torch, shape, dtype, layout, tag))
    return result
