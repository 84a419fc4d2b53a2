"""Pooling vs PyTorch on ResNet shapes (N=32): max_pool2d 3x3/2 pad 1 on the stem output (64 x 112 x 112),
avg_pool2d 2x2/2 on 256 x 56 x 56, global_avg_pool on 2048 x 7 x 7 (N=256, so the array is large enough to time
bandwidth rather than a launch); float16 NHWC (PyTorch channels_last) and float32 NCHW. GE2 runs as a plan would
(the prepared candidate launch, one binding call); max_pool2d also writes its int32 indices, so PyTorch runs
max_pool2d with return_indices=True (what its training path runs). Backward rows: max_pool2d (dy and indices read,
dx written) and avg_pool2d. Bytes: each input read once, each output written once; target 85% of copy bandwidth."""
from __future__ import annotations

from ._launch import prepared

TARGET = {"copy_fraction": 0.85}


def _close(torch, actual, expected, what, rtol=2e-3, atol=2e-3):
    if not torch.allclose(actual.float(), expected.float(), rtol=rtol, atol=atol):
        error = (actual.float() - expected.float()).abs().max().item()
        raise AssertionError(f"{what}: GE2 disagrees with PyTorch (max abs error {error:.3e})")


def _as_layout(t, layout):
    """A PyTorch NCHW-shaped tensor (channels_last in memory for NHWC) as GE2 sees it."""
    return t.permute(0, 2, 3, 1) if layout == "NHWC" else t


def _input(torch, shape, dtype, layout):
    """(x for GE2 in its layout, the same values as PyTorch's NCHW-shaped tensor in the matching memory format)."""
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    if layout == "NHWC":
        x = x.contiguous(memory_format=torch.channels_last)
    return _as_layout(x, layout), x


def _max_cases(torch, dtype, layout, tag):
    x, x_torch = _input(torch, (32, 64, 112, 112), dtype, layout)
    attrs = {"kernel_size": 3, "stride": 2, "padding": 1, "layout": layout}
    torch_y, torch_indices = torch.nn.functional.max_pool2d(x_torch, 3, 2, 1, return_indices=True)
    y = torch.empty_like(_as_layout(torch_y, layout))
    indices = torch.empty(y.shape, device="cuda", dtype=torch.int32)
    forward = prepared("max_pool2d", (x,), (y, indices), attrs)

    def torch_forward():
        return torch.nn.functional.max_pool2d(x_torch, 3, 2, 1, return_indices=True)

    def check_forward():
        forward()
        _close(torch, y, _as_layout(torch_forward()[0], layout), "max_pool2d forward", rtol=0, atol=0)

    dy_torch = torch.randn_like(torch_y)
    dy = _as_layout(dy_torch, layout)
    dx = torch.empty_like(x)
    forward()  # the indices the backward reads
    backward = prepared("max_pool2d_backward", (dy, indices, x), (dx,), attrs)

    def torch_backward():
        return torch.ops.aten.max_pool2d_with_indices_backward(dy_torch, x_torch, [3, 3], [2, 2], [1, 1], [1, 1],
                                                               False, torch_indices)

    def check_backward():
        backward()
        _close(torch, dx, _as_layout(torch_backward(), layout), "max_pool2d backward")

    size = "32x64x112x112 k3s2p1"
    return [{"name": f"max_pool2d fwd {tag} {size}", "ge2": forward, "torch": torch_forward, "check": check_forward,
             "bytes": x.nbytes + y.nbytes + indices.nbytes, "target": TARGET},
            {"name": f"max_pool2d bwd {tag} {size}", "ge2": backward, "torch": torch_backward,
             "check": check_backward, "bytes": dy.nbytes + indices.nbytes + dx.nbytes, "target": TARGET}]


def _avg_cases(torch, dtype, layout, tag):
    x, x_torch = _input(torch, (32, 256, 56, 56), dtype, layout)
    attrs = {"kernel_size": 2, "layout": layout}
    y = torch.empty_like(_as_layout(torch.nn.functional.avg_pool2d(x_torch, 2), layout))
    forward = prepared("avg_pool2d", (x,), (y,), attrs)

    def torch_forward():
        return torch.nn.functional.avg_pool2d(x_torch, 2)

    def check_forward():
        forward()
        _close(torch, y, _as_layout(torch_forward(), layout), "avg_pool2d forward")

    dy_torch = torch.randn_like(torch_forward())
    dy = _as_layout(dy_torch, layout)
    dx = torch.empty_like(x)
    backward = prepared("avg_pool2d_backward", (dy, x), (dx,), attrs)

    def torch_backward():
        return torch.ops.aten.avg_pool2d_backward(dy_torch, x_torch, [2, 2], [2, 2], [0, 0], False, True, None)

    def check_backward():
        backward()
        _close(torch, dx, _as_layout(torch_backward(), layout), "avg_pool2d backward")

    size = "32x256x56x56 k2s2"
    return [{"name": f"avg_pool2d fwd {tag} {size}", "ge2": forward, "torch": torch_forward, "check": check_forward,
             "bytes": x.nbytes + y.nbytes, "target": TARGET},
            {"name": f"avg_pool2d bwd {tag} {size}", "ge2": backward, "torch": torch_backward,
             "check": check_backward, "bytes": dy.nbytes + dx.nbytes, "target": TARGET}]


def _global_case(torch, dtype, layout, tag):
    x, x_torch = _input(torch, (256, 2048, 7, 7), dtype, layout)
    y = torch.empty_like(_as_layout(torch.nn.functional.adaptive_avg_pool2d(x_torch, 1), layout))
    forward = prepared("global_avg_pool", (x,), (y,), {"layout": layout})

    def torch_forward():
        return torch.nn.functional.adaptive_avg_pool2d(x_torch, 1)

    def check():
        forward()
        _close(torch, y, _as_layout(torch_forward(), layout), "global_avg_pool")

    return {"name": f"global_avg_pool fwd {tag} 256x2048x7x7", "ge2": forward, "torch": torch_forward,
            "check": check, "bytes": x.nbytes + y.nbytes, "target": TARGET}


def cases(torch):
    result = []
    for dtype, layout, tag in ((torch.float16, "NHWC", "f16 NHWC"), (torch.float32, "NCHW", "f32 NCHW")):
        result += _max_cases(torch, dtype, layout, tag)
        result += _avg_cases(torch, dtype, layout, tag)
        result.append(_global_case(torch, dtype, layout, tag))
    return result
