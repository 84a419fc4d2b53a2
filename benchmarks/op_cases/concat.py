"""concat vs torch.cat, float16: 4 x (4096x4096) along axis 1 (every row interleaves the inputs) with each GE2
candidate (fused kernel, one cudaMemcpy2DAsync per input), along axis 0 (contiguous blocks), and the backward split
(PyTorch's autograd returns views there; the comparison copies them into separate gradients, as GE2 writes)."""
from __future__ import annotations

from ._launch import prepared

N, COUNT = 4096, 4
FORWARD_TARGET = {"copy_fraction": 0.85}
BACKWARD_TARGET = {"copy_fraction": 0.70}


def cases(torch):
    from graph_executor_v2.ops import concat as cc

    xs = [torch.randn(N, N, device="cuda", dtype=torch.float16) for _ in range(COUNT)]
    moved = 2 * COUNT * N * N * 2
    result = []
    for name, axis, candidate in (("concat f16 4x4096x4096 axis 1 (fused)", 1, "fused"),
                                  ("concat f16 4x4096x4096 axis 1 (copy2d)", 1, "copy2d"),
                                  ("concat f16 4x4096x4096 axis 0", 0, None)):
        y = torch.cat(xs, dim=axis)
        y_torch = torch.empty_like(y)
        run = prepared("concat", xs, [y], {"axis": axis}, candidate)

        def check(run=run, y=y, axis=axis):
            y.fill_(float("nan"))
            run()
            if not torch.equal(y, torch.cat(xs, dim=axis)):
                raise AssertionError("concat: GE2 disagrees with PyTorch")

        result.append({"name": name, "ge2": run, "torch": lambda axis=axis, y_torch=y_torch: torch.cat(
            xs, dim=axis, out=y_torch), "check": check, "bytes": moved, "target": FORWARD_TARGET})

    dy = torch.randn(N, COUNT * N, device="cuda", dtype=torch.float16)
    grads = [torch.empty(N, N, device="cuda", dtype=torch.float16) for _ in range(COUNT)]
    grads_torch = [torch.empty_like(g) for g in grads]
    native = cc._native_module()
    grad_ptrs = [g.data_ptr() for g in grads]
    kernel = cc.backward_kernel("auto", N, [N] * COUNT, "float16")  # the selector's choice, as the face makes it

    def backward():
        native.backward(dy.data_ptr(), grad_ptrs, N, [N] * COUNT, "float16", kernel, 0)

    def backward_torch():
        for grad, part in zip(grads_torch, dy.split(N, dim=1)):
            grad.copy_(part)

    def check_backward():
        for grad in grads:
            grad.fill_(float("nan"))
        backward()
        backward_torch()
        if not all(torch.equal(g, t) for g, t in zip(grads, grads_torch)):
            raise AssertionError("concat backward: GE2 disagrees with PyTorch")

    result.append({"name": "concat bwd (split) f16 4x4096x4096 axis 1", "ge2": backward, "torch": backward_torch,
                   "check": check_backward, "bytes": moved, "target": BACKWARD_TARGET})
    return result
