"""dropout vs PyTorch: float16, 64M elements, p = 0.1. GE2's forward is a plan-style prepared launch; its backward
regenerates the mask from the seed (one binding call). PyTorch's native_dropout also writes a mask, which its
backward reads. Bytes: x read and y written (forward), dy read and dx written (backward): what GE2 must move."""
from __future__ import annotations

import numpy as np

from graph_executor_v2.ops import dropout as dp
from ._launch import prepared

COUNT, P, SEED = 1 << 26, 0.1, 1234
CHECKED = 1 << 20  # elements compared with the NumPy mask (all of them are checked statistically)


def cases(torch):
    x = torch.randn(COUNT, device="cuda", dtype=torch.float16)
    x[x == 0] = 1
    y = torch.empty_like(x)
    forward = prepared("dropout", [x], [y], {"p": P, "seed": SEED})
    scale = 1.0 / (1.0 - P)

    def check(result, source):
        kept = result != 0
        fraction = kept.float().mean().item()
        sigma = (P * (1 - P) / COUNT) ** 0.5
        if abs(fraction - (1 - P)) > 6 * sigma:
            raise AssertionError(f"dropout: kept fraction {fraction:.5f}, expected {1 - P} +- {6 * sigma:.1e}")
        expected_mask = dp.keep_mask(CHECKED, P, SEED)
        if not np.array_equal(kept[:CHECKED].cpu().numpy(), expected_mask):
            raise AssertionError("dropout: the mask differs from the NumPy Philox reference")
        expected = torch.where(kept, source.float() * scale, torch.zeros_like(source, dtype=torch.float32))
        if not torch.allclose(result.float(), expected, rtol=2e-3, atol=1e-3):
            raise AssertionError("dropout: kept values are not x / (1 - p)")

    def check_forward():
        forward()
        check(y, x)

    dy = torch.randn_like(x)
    dy[dy == 0] = 1
    dx = torch.empty_like(x)
    native_backward = dp._native_module().backward
    kernel = dp.kernel_for("auto", 0, not (dy.data_ptr() | dx.data_ptr()) % 16, "float16")

    def backward():
        native_backward(dy.data_ptr(), dx.data_ptr(), COUNT, "float16", P, SEED, 0, kernel, 0)

    def check_backward():
        backward()
        forward()
        check(dx, dy)
        if not torch.equal(dx != 0, y != 0):
            raise AssertionError("dropout backward: its mask is not the forward's")

    _, mask = torch.ops.aten.native_dropout(x, P, True)
    nbytes = 2 * COUNT * 2
    return [
        {"name": f"dropout fwd f16 64M p={P}", "ge2": forward,
         "torch": lambda: torch.ops.aten.native_dropout(x, P, True), "check": check_forward, "bytes": nbytes,
         "target": {"copy_fraction": 0.85}},
        {"name": f"dropout bwd f16 64M p={P}", "ge2": backward,
         "torch": lambda: torch.ops.aten.native_dropout_backward(dy, mask, scale), "check": check_backward,
         "bytes": nbytes, "target": {"copy_fraction": 0.70}},
    ]
