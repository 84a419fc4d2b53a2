"""optimizer vs PyTorch: one AdamW step over 100 float32 tensors, 50M parameters in all.

GE2 runs its fused multi-tensor step (device step counter and schedule; one update launch plus a one-block
prologue); PyTorch runs torch.optim.AdamW with fused=True and with foreach=True. With clipping, GE2 adds its norm
pass and PyTorch runs clip_grad_norm_ (foreach) before its fused step.
Bytes per element: p, g, m, v read and p, m, v written (28 B); clipping reads g once more (32 B).
"""
from __future__ import annotations

import numpy as np

from graph_executor_v2.ops import optimizer as opt

TENSORS, TOTAL = 100, 50_000_000
LR, BETAS, EPS, WEIGHT_DECAY, MAX_NORM = 1e-3, (0.9, 0.999), 1e-8, 0.01, 1.0


def _sizes():
    weights = np.random.default_rng(0).uniform(0.2, 1.8, TENSORS)
    sizes = np.floor(weights / weights.sum() * TOTAL).astype(np.int64)
    sizes[-1] += TOTAL - sizes.sum()
    return [int(n) for n in sizes]


def _relative_error(got, expected):
    return max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, expected))


def cases(torch):
    sizes = _sizes()
    generator = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for torch_flavour, clip in (("fused", False), ("foreach", False), ("fused", True)):
        torch_params = [torch.randn(n, device="cuda", generator=generator, requires_grad=True) for n in sizes]
        for p in torch_params:
            p.grad = torch.randn(p.shape, device="cuda", generator=generator)
        params = [p.detach().clone() for p in torch_params]
        grads = [p.grad for p in torch_params]  # shared: both sides read the same gradients
        states = [[torch.zeros_like(p), torch.zeros_like(p)] for p in params]
        config = opt.OptimizerConfig("adamw", LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                     max_norm=MAX_NORM if clip else None)
        fused = opt.FusedOptimizerStep.from_arrays(config, params, grads, states)
        optimizer = torch.optim.AdamW(torch_params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                      **{torch_flavour: True})
        stream = torch.cuda.current_stream()

        def ge2_step(fused=fused, stream=stream):
            fused.launch(stream)

        def torch_step(optimizer=optimizer, torch_params=torch_params, clip=clip):
            if clip:
                torch.nn.utils.clip_grad_norm_(torch_params, MAX_NORM, foreach=True)
            optimizer.step()

        def check(params=params, torch_params=torch_params, states=states, optimizer=optimizer, clip=clip,
                  ge2_step=ge2_step, torch_step=torch_step):
            saved = [g.clone() for g in grads] if clip else None
            ge2_step()
            torch_step()  # clip_grad_norm_ scales the shared gradients in place: after GE2 read them
            if clip:
                for g, original in zip(grads, saved):
                    g.copy_(original)
            torch.cuda.synchronize()
            error = _relative_error(params, [p.detach() for p in torch_params])
            moments = _relative_error([s[0] for s in states],
                                      [optimizer.state[p]["exp_avg"] for p in torch_params])
            if error > 1e-5 or moments > 1e-5:
                raise AssertionError(f"AdamW step: relative error {error:.2e} (params), {moments:.2e} (exp_avg)")

        label = f"AdamW 100 tensors 50M f32{' +clip' if clip else ''} vs torch {torch_flavour}"
        rows.append({"name": label, "ge2": ge2_step, "torch": torch_step, "check": check,
                     "bytes": TOTAL * (32 if clip else 28), "target": {"copy_fraction": 0.85}})
    return rows
