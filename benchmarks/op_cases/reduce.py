"""sum / mean / max vs PyTorch, float16 16384 x 4096: a sum over the last axis (row_warp), a mean over axis 0
(column), a max over the last axis and a sum of everything (row_block split into partials). GE2 runs as a plan
would: the prepared candidate launch, one binding call, on a preallocated output. Bytes: x read + y written."""
from __future__ import annotations

from ._launch import close, prepared

ROWS, COLS = 16384, 4096


def cases(torch):
    x = torch.randn(ROWS, COLS, device="cuda", dtype=torch.float16)
    result = []

    def case(name, op, axis, torch_fn, atol=2e-3):
        expected = torch_fn()
        y = torch.empty_like(expected)
        run = prepared(op, (x,), (y,), {"axis": axis, "keepdims": False})

        def check():
            run()
            close(torch, y, torch_fn(), name, atol=atol)

        result.append({"name": name, "ge2": run, "torch": torch_fn, "check": check,
                       "bytes": x.nbytes + y.nbytes, "target": {"copy_fraction": 0.85}})

    # Sums over 4096 or more float16 values: float32 accumulation in both, compared with a tolerance for the order.
    case(f"sum last axis f16 {ROWS}x{COLS}", "sum", -1, lambda: torch.sum(x, -1), atol=5e-2)
    case(f"mean axis 0 f16 {ROWS}x{COLS}", "mean", 0, lambda: torch.mean(x, 0))
    case(f"max last axis f16 {ROWS}x{COLS}", "max", -1, lambda: torch.amax(x, -1))
    case(f"sum all f16 {ROWS}x{COLS}", "sum", None, lambda: torch.sum(x), atol=2.0)
    return result
