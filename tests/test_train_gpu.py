"""ge2.train on the GPU against PyTorch (same initial weights, batches and optimizer): float32 loss curves within
1e-4 relative (or 4x PyTorch's own float32 floor, where that is larger) at every one of 200 steps (SGD-momentum,
AdamW); mixed-precision curves (autocast, GradScaler for
float16) within 2% over 500 steps; the step on device arrays, checkpoints and inference on the GPU."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2

SIZES = (64, 128, 10)


def _init(rng, sizes=SIZES):
    """torch.nn.Linear's initialization, in GE2's (fan_in, fan_out) layout."""
    params = {}
    for index, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:]), start=1):
        bound = fan_in ** -0.5
        params[f"w{index}"] = rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)
        params[f"b{index}"] = rng.uniform(-bound, bound, fan_out).astype(np.float32)
    return params


def _graph(params):
    g = ge2.ir.Graph("mlp")
    x = g.input("x", ("B", params["w1"].shape[0]), "float32")
    labels = g.input("labels", ("B",), "int64")
    h = g.relu(g.add(g.matmul(x, g.param("w1", params["w1"])), g.param("b1", params["b1"])))
    logits = g.add(g.matmul(h, g.param("w2", params["w2"])), g.param("b2", params["b2"]))
    g.output(logits, "logits")
    g.output(g.cross_entropy(logits, labels), "loss")
    return g


def _batches(rng, count, batch=64, learnable=True):
    xs = [rng.standard_normal((batch, SIZES[0])).astype(np.float32) for _ in range(count)]
    if learnable:
        return [{"x": x, "labels": x[:, :SIZES[2]].argmax(axis=1).astype(np.int64)} for x in xs]
    return [{"x": x, "labels": rng.integers(0, SIZES[2], batch).astype(np.int64)} for x in xs]


def _torch_losses(torch, params, batches, make_optimizer, amp=None):
    F = torch.nn.functional
    weights = {k: torch.tensor(v.T.copy() if k.startswith("w") else v, device="cuda", requires_grad=True)
               for k, v in params.items()}
    optimizer = make_optimizer(list(weights.values()))
    scaler = torch.amp.GradScaler("cuda", init_scale=256.0) if amp == "float16" else None
    losses = []
    for batch in batches:
        x = torch.tensor(batch["x"], device="cuda")
        labels = torch.tensor(batch["labels"], device="cuda")
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=getattr(torch, amp or "bfloat16"), enabled=amp is not None):
            h = F.relu(F.linear(x, weights["w1"], weights["b1"]))
            loss = F.cross_entropy(F.linear(h, weights["w2"], weights["b2"]).float(), labels)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        losses.append(loss.item())
    return np.array(losses)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["sgd_momentum", "adamw"])
def test_float32_curve_matches_pytorch_at_every_step(rng, kind):
    torch = pytest.importorskip("torch")
    torch.backends.cuda.matmul.allow_tf32 = False
    params = _init(rng)
    batches = _batches(rng, 200)
    if kind == "sgd_momentum":
        ours = ge2.train.SGD(lr=0.05, momentum=0.9)
        theirs = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)  # noqa: E731
    else:
        ours = ge2.train.AdamW(lr=1e-3, weight_decay=0.01)
        theirs = lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01)  # noqa: E731
    trainer = ge2.train.Trainer(_graph(params), loss="loss", device="cuda", optimizer=ours)
    losses = np.array([float(trainer.step(batch)) for batch in batches])
    expected = _torch_losses(torch, params, batches, theirs)
    # The float32 floor: PyTorch against itself from weights one ulp away. AdamW's normalized steps carry rounding
    # differences (summation orders differ between libraries and autotuned kernels) past 1e-4 late in the run.
    nudged = {name: np.nextafter(value, np.float32(np.inf)) for name, value in params.items()}
    floor = np.max(np.abs(_torch_losses(torch, nudged, batches, theirs) / expected - 1))
    np.testing.assert_allclose(losses, expected, rtol=max(1e-4, 4 * floor),
                               err_msg=f"{kind}: GE2 vs PyTorch loss curve (float32 floor {floor:.1e})")
    # It learns (AdamW at lr 1e-3 halves the loss over 200 steps only just, seen 0.501x on the H100).
    assert losses[-20:].mean() < 0.7 * losses[:20].mean()


@pytest.mark.gpu
@pytest.mark.parametrize("amp", ["bfloat16", "float16"])
def test_mixed_precision_curve_within_two_percent_of_pytorch_autocast(rng, amp):
    torch = pytest.importorskip("torch")
    params = _init(rng)
    batches = _batches(rng, 500, learnable=False)  # the loss stays near log(10): relative errors stay meaningful
    # Both start from a loss scale of 256: GE2's float16 weight gradients overflow where PyTorch's float32 ones do
    # not, so a large first scale would skip different steps on the two sides.
    scale = ge2.train.DynamicLossScale(init_scale=256.0) if amp == "float16" else None
    trainer = ge2.train.Trainer(_graph(params), device="cuda", optimizer=ge2.train.AdamW(lr=1e-3), amp=amp,
                                loss_scale=scale)
    losses = np.array([float(trainer.step(batch)) for batch in batches])
    assert trainer.optimizer_steps == trainer.step_count
    expected = _torch_losses(torch, params, batches, lambda p: torch.optim.AdamW(p, lr=1e-3), amp=amp)
    np.testing.assert_allclose(losses, expected, rtol=0.02, err_msg=f"amp={amp}: GE2 vs PyTorch autocast")


@pytest.mark.gpu
def test_cuda_step_on_device_arrays_checkpoint_and_inference(rng, tmp_path):
    runtime = ge2.device.runtime()
    params = _init(rng)
    batches = _batches(rng, 6)
    trainer = ge2.train.Trainer(_graph(params), device="cuda", optimizer=ge2.train.AdamW(lr=1e-2))
    reference = ge2.train.Trainer(_graph(params), device="cpu", optimizer=ge2.train.AdamW(lr=1e-2))
    for batch in batches[:3]:
        device_batch = {name: runtime.DeviceArray.from_numpy(value) for name, value in batch.items()}
        loss = trainer.step(device_batch)
        assert float(loss) == pytest.approx(float(reference.step(batch)), rel=1e-4)
    path = tmp_path / "gpu.safetensors"
    trainer.save(path)
    resumed = ge2.train.Trainer(_graph(params), device="cuda", optimizer=ge2.train.AdamW(lr=1e-2))
    resumed.load(path)
    for batch in batches[3:]:
        assert float(resumed.step(batch)) == pytest.approx(float(trainer.step(batch)), rel=1e-6)
    logits = trainer.executor().run({"x": batches[0]["x"]})["logits"]
    p = {k: v.astype(np.float64) for k, v in trainer.parameters().items()}
    expected = np.maximum(batches[0]["x"] @ p["w1"] + p["b1"], 0) @ p["w2"] + p["b2"]
    ge2.testing.assert_close(logits, expected, "float32", SIZES[1])
    assert not trainer._executor.fallbacks, [s.node for s in trainer._executor.fallbacks]
    stale = trainer.step(batches[0])
    trainer.step(batches[1])
    with pytest.raises(RuntimeError, match="overwritten by a later step"):
        float(stale)
