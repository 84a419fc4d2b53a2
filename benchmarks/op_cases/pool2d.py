"""Pooling vs PyTorch on ResNet shapes (N=32): max_pool2d 3x3/2 pad 1 on the stem output (64 x 112 x 112),
avg_pool2d 2x2/2 on 256 x 56 x 56, global_avg_pool on 2048 x 7 x 7 (N=256, so the array is large enough to time
bandwidth rather than a launch); float16 NHWC (PyTorch channels_last) and float32 NCHW. GE2 runs as a plan would
(the prepared candidate launch, one binding call); max_pool2d also writes its int32 indices, so PyTorch runs
max_pool2d with return_indices=True (what its training path runs). Backward rows: max_pool2d (dy and indices read,
dx written) and avg_pool2d. Bytes: each input read once, each output written once; target 85% of copy bandwidth."""
from __future__ import annotations

from graph_executor_v2.ops import pool2d

from ._launch import prepared

TARGET = {"copy_fraction": 0.85}


def _close(torch, actual, expected, what, rtol=2e-3, atol=2e-3):
    if not torch.allclose(actual.float(), expected.float(), rtol=rtol, atol=atol):
        error = (actual.float() - expected.float()).abs().max().item()
        raise AssertionError(f"{what}: GE2 disagrees with PyTorch (max abs error {error:.3e})")


def _input(torch, shape, dtype, layout):
    """(x for GE2 in its layout, the same values as PyTorch's NCHW-shaped tensor in the matching memory format)."""
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    if layout == "NHWC":
        x = x.contiguous(memory_format=torch.channels_last)
        return x.permute(0, 2, 3, 1), x
    return x, x


def _to_layout(t, layout):
    return t.permute(0, 2, 3, 1) if layout == "NHWC" else t


def cases(torch):
    functional = torch.nn.functional
    aten = torch.ops.aten
    result = []
    for dtype, layout, tag in ((torch.float16, "NHWC", "f16 NHWC"), (torch.float32, "NCHW", "f32 NCHW")):
        # max_pool2d 3x3/2 pad 1, forward and backward
        x, x_torch = _input(torch, (32, 64, 112, 112), dtype, layout)
        attrs = {"kernel_size": 3, "stride": 2, "padding": 1, "layout": layout}
        window = pool2d.check_window(tuple(x.shape), str(dtype).removeprefix("torch."), 3, 2, 1, layout=layout)
        y_shape = window.y_shape()
        y = torch.empty(y_shape, device="cuda", dtype=dtype)
        indices = torch.empty(y_shape, device="cuda", dtype=torch.int32)
        forward = prepared("max_pool2d", (x,), (y, indices), attrs)

        def torch_max(x_torch=x_torch):
            return functional.max_pool2d(x_torch, 3, 2, 1, return_indices=True)

        def check_max(forward=forward, y=y, torch_max=torch_max, layout=layout, name=f"max_pool2d fwd {tag}"):
            forward()
            _close(torch, y, _to_layout(torch_max()[0], layout), name, rtol=0, atol=0)

        name = f"max_pool2d fwd {tag} 32x64x112x112 k3s2p1"
        result.append({"name": name, "ge2": forward, "torch": torch_max, "check": check_max,
                       "bytes": x.nbytes + y.nbytes + indices.nbytes, "target": TARGET})

        torch_y, torch_indices = torch_max()
        dy_torch = torch.randn_like(torch_y)
        dy = _to_layout(dy_torch, layout).contiguous()
        forward()
        dx = torch.empty_like(x)
        backward = prepared("max_pool2d_backward", (dy, indices, x), (dx,), attrs)

        def torch_max_backward(dy_torch=dy_torch, x_torch=x_torch, torch_indices=torch_indices):
            return aten.max_pool2d_with_indices_backward(dy_torch, x_torch, [3, 3], [2, 2], [1, 1], [1, 1], False,
                                                         torch_indices)

        def check_max_backward(backward=backward, dx=dx, fn=torch_max_backward, layout=layout):
            backward()
            _close(torch, dx, _to_layout(fn(), layout), "max_pool2d backward")

        result.append({"name": f"max_pool2d bwd {tag} 32x64x112x112 k3s2p1", "ge2": backward,
                       "torch": torch_max_backward, "check": check_max_backward,
                       "bytes": dy.nbytes + indices.nbytes + dx.nbytes, "target": TARGET})

        # avg_pool2d 2x2/2, forward and backward
        x, x_torch = _input(torch, (32, 256, 56, 56), dtype, layout)
        attrs = {"kernel_size": 2, "layout": layout}
        y = torch.empty((32, 256, 28, 28) if layout == "NCHW" else (32, 28, 28, 256), device="cuda", dtype=dtype)
        avg = prepared("avg_pool2d", (x,), (y,), attrs)

        def torch_avg(x_torch=x_torch):
            return functional.avg_pool2d(x_torch, 2)

        def check_avg(avg=avg, y=y, fn=torch_avg, layout=layout):
            avg()
            _close(torch, y, _to_layout(fn(), layout), "avg_pool2d forward")

        result.append({"name": f"avg_pool2d fwd {tag} 32x256x56x56 k2s2", "ge2": avg, "torch": torch_avg,
                       "check": check_avg, "bytes": x.nbytes + y.nbytes, "target": TARGET})

        dy_torch = torch.randn_like(torch_avg())
        dy = _to_layout(dy_torch, layout).contiguous()
        dx = torch.empty_like(x)
        avg_backward = prepared("avg_pool2d_backward", (dy, x), (dx,), attrs)

        def torch_avg_backward(dy_torch=dy_torch, x_torch=x_torch):
            return aten.avg_pool2d_backward(dy_torch, x_torch, [2, 2], [2, 2], [0, 0], False, True, None)

        def check_avg_backward(run=avg_backward, dx=dx, fn=torch_avg_backward, layout=layout):
            run()
            _close(torch, dx, _to_layout(fn(), layout), "avg_pool2d backward")

        result.append({"name": f"avg_pool2d bwd {tag} 32x256x56x56 k2s2", "ge2": avg_backward,
                       "torch": torch_avg_backward, "check": check_avg_backward,
                       "bytes": dy.nbytes + dx.nbytes, "target": TARGET})

        # global_avg_pool = adaptive_avg_pool2d(1)
        x, x_torch = _input(torch, (256, 2048, 7, 7), dtype, layout)
        y = torch.empty((256, 2048, 1, 1) if layout == "NCHW" else (256, 1, 1, 2048), device="cuda", dtype=dtype)
        pooled = prepared("global_avg_pool", (x,), (y,), {"layout": layout})

        def torch_global(x_torch=x_torch):
            return functional.adaptive_avg_pool2d(x_torch, 1)

        def check_global(run=pooled, y=y, fn=torch_global, layout=layout):
            run()
            _close(torch, y, _to_layout(fn(), layout), "global_avg_pool")

        result.append({"name": f"global_avg_pool fwd {tag} 256x2048x7x7", "ge2": pooled, "torch": torch_global,
                       "check": check_global, "bytes": x.nbytes + y.nbytes, "target": TARGET})
    return result
