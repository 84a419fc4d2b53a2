"""pointwise ops (ops/pointwise.py) vs PyTorch: float16 and int32, 64M elements (8192 x 8192), each op on its best
candidate (the generated kernel) as a plan would launch it; bool masks for comparisons and where."""
from __future__ import annotations

from ._launch import close, prepared

ROWS, COLS = 8192, 8192
TARGET = {"copy_fraction": 0.85}


def cases(torch):
    n = ROWS * COLS
    a = torch.randn(ROWS, COLS, device="cuda", dtype=torch.float16)
    b = torch.randn(ROWS, COLS, device="cuda", dtype=torch.float16)
    i = torch.randint(-1000, 1000, (ROWS, COLS), device="cuda", dtype=torch.int32)
    j = torch.randint(1, 50, (COLS,), device="cuda", dtype=torch.int32)
    mask = a > 0
    result = []

    def case(name, op, inputs, attrs, torch_fn, out, moved):
        run = prepared(op, inputs, (out,), attrs)

        def check():
            run()
            close(torch, out, torch_fn(), name)

        result.append({"name": name, "ge2": run, "torch": torch_fn, "check": check, "bytes": moved,
                       "target": TARGET})

    half = lambda: torch.empty_like(a)  # noqa: E731
    case("pointwise erf f16 64M", "erf", (a,), {}, lambda: torch.erf(a), half(), 4 * n)
    case("pointwise hardswish f16 64M", "hardswish", (a,), {}, lambda: torch.nn.functional.hardswish(a), half(), 4 * n)
    case("pointwise clip f16 64M", "clip", (a,), {"min": -1.0, "max": 1.0}, lambda: torch.clamp(a, -1.0, 1.0), half(),
         4 * n)
    case("pointwise pow f16 64M", "pow", (a.abs(), b), {}, lambda: torch.pow(a.abs(), b), half(), 6 * n)
    case("pointwise less f16 -> bool 64M", "less", (a, b), {}, lambda: torch.lt(a, b),
         torch.empty_like(a, dtype=torch.bool), 5 * n)
    case("pointwise where bool,f16,f16 64M", "where", (mask, a, b), {}, lambda: torch.where(mask, a, b), half(), 7 * n)
    case("pointwise mod int32 by a row 64M", "mod", (i, j), {}, lambda: torch.remainder(i, j), torch.empty_like(i),
         8 * n)
    case("pointwise div int32 (truncating) 64M", "div", (i, j), {}, lambda: torch.div(i, j, rounding_mode="trunc"),
         torch.empty_like(i), 8 * n)
    return result
