"""slice vs PyTorch, float16 8192x8192: every other column (x[:, ::2]) forward and backward, and a block of rows
(one contiguous copy); and GPT-2's logits crop, the first 50257 of 50304 float16 columns of 4096 rows (output rows
2 bytes apart from 16-byte alignment: the strided copy's row kernel). Every-other-column reads every 32-byte sector
of x, so its bytes count all of x read plus y written; its backward writes all of dx (zeros off the slice) and reads
dy once, against PyTorch's zero fill plus strided copy (what autograd's slice_backward runs)."""
from __future__ import annotations

from ._launch import prepared

ROWS, COLS = 8192, 8192
FORWARD_TARGET = {"copy_fraction": 0.85}
BACKWARD_TARGET = {"copy_fraction": 0.70}


def cases(torch):
    from graph_executor_v2.ops import slice as sl

    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.float16)
    logits = torch.randn(4096, 50304, device="cuda", dtype=torch.float16)
    nbytes = x.numel() * 2
    result = []
    for name, source, attrs, torch_fn, moved in (
        ("slice f16 4096x50304 [:, :50257]", logits, {"starts": (0,), "ends": (50257,), "axes": (1,)},
         lambda: logits[:, :50257].contiguous(), 2 * 2 * 4096 * 50257),
        ("slice f16 8192x8192 [:, ::2]", x, {"starts": (0,), "ends": (COLS,), "axes": (1,), "steps": (2,)},
         lambda: x[:, ::2].contiguous(), nbytes + nbytes // 2),
        ("slice f16 8192x8192 [1024:7168]", x, {"starts": (1024,), "ends": (7168,)},
         lambda: x[1024:7168].clone(), 2 * (nbytes * 6144 // ROWS)),
    ):
        expected = torch_fn()
        y = torch.empty_like(expected)
        run = prepared("slice", [source], [y], attrs)

        def check(run=run, y=y, torch_fn=torch_fn):
            y.fill_(float("nan"))
            run()
            if not torch.equal(y, torch_fn()):
                raise AssertionError("slice: GE2 disagrees with PyTorch")

        result.append({"name": name, "ge2": run, "torch": torch_fn, "check": check, "bytes": moved,
                       "target": FORWARD_TARGET})

    dy = torch.randn(ROWS, COLS // 2, device="cuda", dtype=torch.float16)
    dx, dx_torch = torch.empty_like(x), torch.empty_like(x)
    native = sl._native_module()

    def backward():
        native.backward(dy.data_ptr(), dx.data_ptr(), [COLS // 2, 1], [ROWS, COLS], [0, 0], [1, 2],
                        [ROWS, COLS // 2], "float16", 0)

    def backward_torch():
        dx_torch.zero_()
        dx_torch[:, ::2] = dy

    def check_backward():
        dx.fill_(float("nan"))
        backward()
        backward_torch()
        if not torch.equal(dx, dx_torch):
            raise AssertionError("slice backward: GE2 disagrees with PyTorch")

    result.append({"name": "slice bwd f16 8192x8192 [:, ::2]", "ge2": backward, "torch": backward_torch,
                   "check": check_backward, "bytes": nbytes + nbytes // 2, "target": BACKWARD_TARGET})
    return result
