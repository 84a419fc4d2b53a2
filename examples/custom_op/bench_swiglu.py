"""swiglu vs PyTorch, float16, 16M elements: each kernel variant (vec16, scalar) forward and backward against
``F.silu(a) * b`` and its autograd backward, in one process on one GPU. Every case checks GE2 against PyTorch
before it is timed; bytes are what the op must move (forward: a, b read, y written; backward: dy, a, b read, da,
db written). Uses GE2's benchmark harness (benchmarks/harness.py of the GE2 checkout this example lives in).
Run: python examples/custom_op/bench_swiglu.py (with ge2_swiglu installed or on PYTHONPATH)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from harness import median_ms, torch_cuda, write_results  # noqa: E402

from ge2_swiglu import swiglu  # noqa: E402

COUNT = 1 << 24
COPY_CEILING_TB_S = 3.0  # H100 device-to-device copy, read+write


def main() -> None:
    torch = torch_cuda()
    functional = torch.nn.functional
    a, b, dy = (torch.randn(COUNT, device="cuda", dtype=torch.float16) for _ in range(3))
    y, da, db = (torch.empty_like(a) for _ in range(3))
    a_leaf, b_leaf = a.clone().requires_grad_(), b.clone().requires_grad_()
    y_torch = functional.silu(a_leaf) * b_leaf
    native = swiglu._native_module()

    def check(name, result, expected):
        if not torch.allclose(result.float(), expected.float(), rtol=4e-3, atol=4e-3):
            raise AssertionError(f"swiglu {name}: GE2 disagrees with PyTorch")

    rows = []
    for kernel in ("vec16", "scalar"):
        def forward(kernel=kernel):
            native.forward(a.data_ptr(), b.data_ptr(), y.data_ptr(), COUNT, "float16", kernel, 0)

        def backward(kernel=kernel):
            native.backward(dy.data_ptr(), a.data_ptr(), b.data_ptr(), da.data_ptr(), db.data_ptr(), COUNT, "float16",
                            kernel, 0)

        y.fill_(float("nan"))
        forward()
        check("forward", y, functional.silu(a.float()) * b.float())
        da.fill_(float("nan"))
        db.fill_(float("nan"))
        backward()
        expected_da, expected_db = torch.autograd.grad(y_torch, (a_leaf, b_leaf), dy, retain_graph=True)
        check("da", da, expected_da)
        check("db", db, expected_db)
        cases = [(f"swiglu fwd f16 16M ({kernel})", forward, lambda: functional.silu(a) * b, 3),
                 (f"swiglu bwd f16 16M ({kernel})", backward,
                  lambda: torch.autograd.grad(y_torch, (a_leaf, b_leaf), dy, retain_graph=True), 5)]
        for name, ge2_run, torch_run, arrays in cases:
            ge2_ms, torch_ms = median_ms(ge2_run), median_ms(torch_run)
            ge2_tb_s = arrays * COUNT * 2 / (ge2_ms * 1e-3) / 1e12
            rows.append({"case": name, "ge2_ms": ge2_ms, "ge2_tb_s": ge2_tb_s, "torch_ms": torch_ms,
                         "speedup": torch_ms / ge2_ms, "copy_fraction": ge2_tb_s / COPY_CEILING_TB_S})
            print(f"{name:<34} ge2 {ge2_ms:8.4f} ms {ge2_tb_s:5.2f} TB/s | torch {torch_ms:8.4f} ms "
                  f"| x{torch_ms / ge2_ms:5.2f}", flush=True)
    columns = [("case", "case"), ("ge2_ms", "GE2 ms"), ("ge2_tb_s", "GE2 TB/s"), ("torch_ms", "PyTorch ms"),
               ("speedup", "speedup"), ("copy_fraction", "of copy ceiling")]
    print(write_results("swiglu", rows, columns, "SwiGLU (out-of-tree example) vs PyTorch (medians, L2 flushed)"))


if __name__ == "__main__":
    main()
