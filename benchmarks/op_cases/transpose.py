"""transpose vs PyTorch's permute().contiguous(), float16: the 2-d 8192x8192 transpose (tiled_packed) and the
attention-style (0, 2, 1, 3) permute of (32, 2048, 16, 128) (whole 256-byte rows move: 16-byte vectors). GE2 runs the
prepared candidate a plan would run, into a preallocated output; bytes are one read and one write of the tensor."""
from __future__ import annotations

from ._launch import prepared

TARGET = {"copy_fraction": 0.85}


def cases(torch):
    result = []
    for name, shape, perm in (("transpose f16 8192x8192 (1,0)", (8192, 8192), (1, 0)),
                              ("transpose f16 32x2048x16x128 (0,2,1,3)", (32, 2048, 16, 128), (0, 2, 1, 3))):
        x = torch.randn(*shape, device="cuda", dtype=torch.float16)
        y = torch.empty(tuple(shape[p] for p in perm), device="cuda", dtype=torch.float16)
        run = prepared("transpose", [x], [y], {"perm": perm})

        def check(run=run, x=x, y=y, perm=perm):
            y.fill_(float("nan"))
            run()
            if not torch.equal(y, x.permute(*perm).contiguous()):
                raise AssertionError("transpose: GE2 disagrees with PyTorch")

        result.append({"name": name, "ge2": run, "torch": lambda x=x, perm=perm: x.permute(*perm).contiguous(),
                       "check": check, "bytes": 2 * x.numel() * 2, "target": TARGET})
    return result
