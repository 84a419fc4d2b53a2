"""The indexing module vs PyTorch, float16: expand [1, 4096, 1] -> [64, 4096, 256] (broadcast copy), reflect pad of
[64, 256, 128, 128] by 3 (ConvNeXt / segmentation heads), gather of 4096 rows of a [32000, 1024] table
(index_select), cumsum along 4096 of [1024, 4096] (position ids) and bilinear 2x upsampling of [16, 64, 128, 128].
Bytes: each input read once, each output written once."""
from __future__ import annotations

from ._launch import prepared

TARGET = {"copy_fraction": 0.70}


def cases(torch):
    f16 = torch.float16
    result = []

    def case(name, op, inputs, attrs, torch_fn, exact=True):
        expected = torch_fn()
        y = torch.empty_like(expected)
        run = prepared(op, inputs, [y], attrs)

        def check(run=run, y=y):
            y.fill_(float("nan") if y.is_floating_point() else 0)
            run()
            reference = torch_fn()
            ok = torch.equal(y, reference) if exact else torch.allclose(y.float(), reference.float(), atol=2e-2,
                                                                        rtol=2e-2)
            if not ok:
                raise AssertionError(f"{op}: GE2 disagrees with PyTorch")

        moved = sum(x.numel() * x.element_size() for x in inputs) + expected.numel() * expected.element_size()
        result.append({"name": name, "ge2": run, "torch": torch_fn, "check": check, "bytes": moved, "target": TARGET})

    column = torch.randn(1, 4096, 1, device="cuda", dtype=f16)
    case("expand f16 [1,4096,1]->[64,4096,256]", "expand", [column], {"shape": (64, 4096, 256)},
         lambda: column.expand(64, 4096, 256).contiguous())
    image = torch.randn(64, 256, 128, 128, device="cuda", dtype=f16)
    case("pad reflect f16 [64,256,128,128] by 3", "pad", [image], {"pads": (0, 0, 3, 3, 0, 0, 3, 3),
                                                                   "mode": "reflect"},
         lambda: torch.nn.functional.pad(image, (3, 3, 3, 3), mode="reflect"))
    table = torch.randn(32000, 1024, device="cuda", dtype=f16)
    ids = torch.randint(0, 32000, (4096,), device="cuda")
    case("gather f16 [32000,1024] 4096 rows", "gather", [table, ids], {"axis": 0},
         lambda: table.index_select(0, ids))
    values = torch.randn(1024, 4096, device="cuda", dtype=f16)
    case("cumsum f16 [1024,4096] axis 1", "cumsum", [values], {"axis": 1},
         lambda: torch.cumsum(values.float(), 1).to(f16), exact=False)
    small = torch.randn(16, 64, 128, 128, device="cuda", dtype=f16)
    case("resize bilinear 2x f16 [16,64,128,128]", "resize", [small], {"size": (256, 256), "mode": "linear"},
         lambda: torch.nn.functional.interpolate(small, scale_factor=2, mode="bilinear", align_corners=False),
         exact=False)
    return result
