"""quantize_fp8_transpose vs PyTorch, the five quantizes of a GPT-2 124M FP8 training step (8192 tokens, width
768; 141 of them a step, 4.08 ms in session 30's profile at about 1.4 TB/s): a layer input [8192, 768], a weight
[3072, 768], the QKV output gradient with its dbias [8192, 2304] (contiguous, and as the q, k and v gradients that
FP8 training's quantize reads in place of their concat: PyTorch concatenates them), GELU's output quantized from
fc1's output [8192, 3072] and GELU's input gradient from fc2's dX and the pre-activation, with its dbias. GE2 runs the prepared
candidate a plan runs; PyTorch runs the same math unfused (scale, cast, transpose, amax, column sum), so the row's
point is GE2's TB/s against the copy ceiling. Bytes: x (and the pre-activation) read once, y and y_t written once."""
from __future__ import annotations

from ._launch import close, prepared

TARGET = {"copy_fraction": 0.8}
TOKENS, WIDTH = 8192, 768
# (name, shape, FP8 dtype, act, with the pre-activation, with the column sum, column blocks of x)
SHAPES = (("x", (TOKENS, WIDTH), "float8_e4m3fn", "none", False, False, 1),
          ("w", (4 * WIDTH, WIDTH), "float8_e4m3fn", "none", False, False, 1),
          ("dY+dbias", (TOKENS, 3 * WIDTH), "float8_e5m2", "none", False, True, 1),
          ("dY q|k|v blocks+dbias", (TOKENS, 3 * WIDTH), "float8_e5m2", "none", False, True, 3),
          ("gelu(x)", (TOKENS, 4 * WIDTH), "float8_e4m3fn", "gelu", False, False, 1),
          ("dY*gelu'(x)+dbias", (TOKENS, 4 * WIDTH), "float8_e5m2", "gelu", True, True, 1))


def cases(torch):
    F = torch.nn.functional
    result = []
    for label, (rows, cols), dtype, act, with_preact, with_sum, blocks in SHAPES:
        fp8 = getattr(torch, dtype)
        # FP8 training's QKV dY: q's, k's and v's gradients, which GE2 reads in place and PyTorch concatenates
        parts = [torch.randn(rows, cols // blocks, device="cuda", dtype=torch.bfloat16) for _ in range(blocks)]
        x = torch.cat(parts, dim=1) if blocks > 1 else parts[0]
        preact = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) if with_preact else None
        scale = torch.tensor(0.5 * float(torch.finfo(fp8).max) / 6.0, device="cuda")  # |values| < 6: in range
        y = torch.empty(rows, cols, device="cuda", dtype=fp8)
        y_t = torch.empty(cols, rows, device="cuda", dtype=fp8)
        amax = torch.empty((), device="cuda")
        column_sum = torch.empty(cols if with_sum else 0, device="cuda", dtype=torch.bfloat16)
        run = prepared("quantize_fp8_transpose", [parts[0], scale, preact, *parts[1:]], [y, y_t, amax, column_sum],
                       {"dtype": dtype, "act": act, "with_column_sum": with_sum})

        def values(x=x, parts=parts, preact=preact, act=act):
            if len(parts) > 1:
                return torch.cat(parts, dim=1).float()
            if act == "none":
                return x.float()
            if preact is None:
                return F.gelu(x.float(), approximate="tanh")  # GE2's gelu
            z = preact.float().requires_grad_()
            (derivative,) = torch.autograd.grad(F.gelu(z, approximate="tanh").sum(), z)
            return x.float() * derivative

        def torch_quantize(values=values, scale=scale, fp8=fp8, with_sum=with_sum):
            v = values()
            q = (v * scale).to(fp8)
            return q, q.t().contiguous(), v.abs().amax(), v.sum(0) if with_sum else None

        def check(run=run, y=y, y_t=y_t, amax=amax, column_sum=column_sum, values=values, label=label,
                  act=act, with_sum=with_sum, torch_quantize=torch_quantize):
            for out in (y, y_t):
                out.view(torch.uint8).fill_(0x7F)  # NaN in both FP8 formats
            amax.fill_(float("nan"))
            column_sum.fill_(float("nan"))
            run()
            q, q_t, expected_amax, expected_sum = torch_quantize()
            if act == "none":  # the same float32 product, one rounding: the same bits
                if not (torch.equal(y.view(torch.uint8), q.view(torch.uint8))
                        and torch.equal(y_t.view(torch.uint8), q_t.view(torch.uint8))):
                    raise AssertionError(f"quantize_fp8_transpose {label}: y or y_t differs from PyTorch's cast")
            else:  # float32 tanh and GELU formulas differ in the last bits: one FP8 step (E4M3 2^-3, E5M2 2^-2)
                close(torch, y, q, f"{label} y", rtol=0.26, atol=2.0 ** -6)
                close(torch, y_t, q_t, f"{label} y_t", rtol=0.26, atol=2.0 ** -6)
            close(torch, amax, expected_amax, f"{label} amax", rtol=1e-5, atol=0)
            if with_sum:
                close(torch, column_sum, expected_sum, f"{label} column sum", rtol=2e-2, atol=0.5)

        moved = x.numel() * x.element_size() * (2 if with_preact else 1) + 2 * x.numel()
        result.append({"name": f"quantize_fp8_transpose {label} bf16 {rows}x{cols}", "ge2": run,
                       "torch": torch_quantize, "check": check, "bytes": moved, "target": TARGET})
    return result
