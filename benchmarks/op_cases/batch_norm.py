"""batch_norm vs PyTorch on ResNet-50 shapes (N=32): 256 x 56 x 56 and 64 x 112 x 112, float16 NHWC (PyTorch
channels_last, float32 parameters as under autocast) and float32 NCHW; training forward (statistics, running
update, y), training backward (dx, dgamma, dbeta from the saved statistics) and inference forward. GE2 runs as a
plan would (the prepared candidate launch, one binding call). PyTorch runs what its autograd runs:
native_batch_norm and native_batch_norm_backward. Bytes: x read + y written (forward); dy, x read + dx written
(backward); target 85% of copy bandwidth. The training forward reads x twice (statistics, then y) and the backward
reads dy and x twice; the second pass walks backwards to reuse what L2 still holds."""
from __future__ import annotations

from graph_executor_v2.ops import batch_norm

from ._launch import prepared

TARGET = {"copy_fraction": 0.85}
EPS, MOMENTUM = 1e-5, 0.1


def _close(torch, actual, expected, what, rtol=2e-3, atol=2e-3):
    if not torch.allclose(actual.float(), expected.float(), rtol=rtol, atol=atol):
        error = (actual.float() - expected.float()).abs().max().item()
        raise AssertionError(f"{what}: GE2 disagrees with PyTorch (max abs error {error:.3e})")


def cases(torch):
    aten = torch.ops.aten
    result = []
    shapes = ((32, 256, 56, 56), (32, 64, 112, 112))
    for dtype, layout, tag in ((torch.float16, "NHWC", "f16 NHWC"), (torch.float32, "NCHW", "f32 NCHW")):
        for shape in shapes:
            channels = shape[1]
            size = "x".join(map(str, shape))
            x_torch = torch.randn(*shape, device="cuda", dtype=dtype) + 1.0
            if layout == "NHWC":
                x_torch = x_torch.contiguous(memory_format=torch.channels_last)
            x = x_torch.permute(0, 2, 3, 1) if layout == "NHWC" else x_torch  # contiguous in GE2's layout
            gamma, beta = torch.randn(channels, device="cuda"), torch.randn(channels, device="cuda")
            running_mean, running_var = torch.zeros(channels, device="cuda"), torch.ones(channels, device="cuda")
            y = torch.empty_like(x)
            stats = [torch.empty(channels, device="cuda") for _ in range(4)]
            inputs = (x, gamma, beta, running_mean, running_var)
            for training in (True, False):
                run = prepared("batch_norm", inputs, (y, *stats),
                               {"training": training, "momentum": MOMENTUM, "eps": EPS, "layout": layout})
                torch_mean, torch_var = running_mean.clone(), running_var.clone()

                def torch_forward(training=training, torch_mean=torch_mean, torch_var=torch_var):
                    return aten.native_batch_norm(x_torch, gamma, beta, torch_mean, torch_var, training, MOMENTUM,
                                                  EPS)

                def check(run=run, fn=torch_forward, training=training, layout=layout):
                    run()
                    expected = fn()[0]
                    _close(torch, y, expected.permute(0, 2, 3, 1) if layout == "NHWC" else expected,
                           f"batch_norm forward (training={training})")

                mode = "train" if training else "infer"
                result.append({"name": f"batch_norm {mode} fwd {tag} {size}", "ge2": run, "torch": torch_forward,
                               "check": check, "bytes": 2 * x.nbytes, "target": TARGET})

            # backward from the saved statistics of a training forward
            batch_norm.forward(*inputs, training=True, layout=layout, out=(y, *stats))
            dy_torch = torch.randn_like(x_torch)
            dy = dy_torch.permute(0, 2, 3, 1) if layout == "NHWC" else dy_torch
            dx, dgamma, dbeta = torch.empty_like(x), torch.empty_like(gamma), torch.empty_like(beta)
            backward = prepared("batch_norm_backward", (dy, x, gamma, stats[0], stats[1]), (dx, dgamma, dbeta),
                                {"training": True, "layout": layout})
            _, save_mean, save_invstd = aten.native_batch_norm(x_torch, gamma, beta, running_mean.clone(),
                                                               running_var.clone(), True, MOMENTUM, EPS)

            def torch_backward(dy_torch=dy_torch, x_torch=x_torch, save_mean=save_mean, save_invstd=save_invstd):
                return aten.native_batch_norm_backward(dy_torch, x_torch, gamma, None, None, save_mean, save_invstd,
                                                       True, EPS, [True, True, True])

            def check_backward(run=backward, fn=torch_backward, layout=layout, dx=dx, dgamma=dgamma, dbeta=dbeta):
                run()
                expected = fn()
                _close(torch, dx, expected[0].permute(0, 2, 3, 1) if layout == "NHWC" else expected[0],
                       "batch_norm backward dx")
                for name, got, ref in (("dgamma", dgamma, expected[1]), ("dbeta", dbeta, expected[2])):
                    scale = ref.abs().max().item()  # sums over ~100k values: relative to their size
                    _close(torch, got, ref, f"batch_norm backward {name}", rtol=1e-2, atol=1e-3 * scale)

            result.append({"name": f"batch_norm train bwd {tag} {size}", "ge2": backward, "torch": torch_backward,
                           "check": check_backward, "bytes": 3 * x.nbytes, "target": TARGET})
    return result
