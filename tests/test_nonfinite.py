"""Non-finite values in training: the trainer's device-side check (the fused optimizer's flag on CUDA, the same rule
in the CPU backend's reference optimizer), on_nonfinite="raise" / "skip", and fit's check of its host data."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2

gpu = pytest.mark.gpu


def _classifier(rng, bias=None):
    g = ge2.ir.Graph("classifier")
    x = g.input("x", ("B", 4), "float32")
    labels = g.input("labels", ("B",), "int64")
    w = g.param("w", rng.normal(0, 0.5, (4, 3)).astype(np.float32))
    logits = g.add(g.matmul(x, w), g.param("b", np.zeros(3, np.float32) if bias is None else bias))
    g.output(g.cross_entropy(logits, labels), "loss")
    return g


def _overflowing_gradient(rng):
    """loss = sum(x @ w): finite for x ~ 3e38 and w ~ 1e-30, but d loss / d w = the column sums of x overflow."""
    g = ge2.ir.Graph("overflow")
    x = g.input("x", (2, 3), "float32")
    w = g.param("w", np.full((3, 1), 1e-30, np.float32))
    g.output(g.sum(g.matmul(x, w)), "loss")
    return g


def _batch(rng, rows=8):
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    return {"x": x, "labels": rng.integers(0, 3, rows).astype(np.int64)}


def _trainer(graph, device, **options):
    return ge2.train.Trainer(graph, loss="loss", device=device, optimizer=ge2.train.SGD(lr=0.1, momentum=0.9),
                             **options)


def _check_nan_batch_raises(device, rng):
    trainer = _trainer(_classifier(rng), device)
    for _ in range(2):  # on CUDA the plan is captured after its first step: the bad step replays the CUDA graph
        float(trainer.step(_batch(rng)))
    before = trainer.parameters()
    bad = _batch(rng)
    bad["x"][5, 1] = np.nan
    with pytest.raises(FloatingPointError) as caught:
        float(trainer.step(bad))
    message = str(caught.value)
    assert "at step 3: first the loss 'loss' (nan)" in message
    assert "the gradient of parameter 'w'" in message and "the gradient of parameter 'b'" in message
    assert "parameters are as they were before step 3" in message and "on_nonfinite='skip'" in message
    for name, value in trainer.parameters().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    assert (trainer.nonfinite_steps, trainer.optimizer_steps, trainer.step_count) == (1, 2, 3)
    loss = float(trainer.step(_batch(rng)))  # training goes on from the parameters before the bad step
    assert np.isfinite(loss) and trainer.optimizer_steps == 3
    assert any(not np.array_equal(value, before[name]) for name, value in trainer.parameters().items())


def test_nan_in_a_batch_raises_naming_the_step_and_keeps_the_parameters(rng):
    _check_nan_batch_raises("cpu", rng)


def _check_gradient_named(device):
    trainer = _trainer(_overflowing_gradient(None), device)
    x = np.full((2, 3), 3e38, np.float32)
    with pytest.raises(FloatingPointError, match=r"at step 1: first the gradient of parameter 'w' \(3 of 3 elements "
                                                 r"NaN or inf\); its update was dropped"):
        float(trainer.step({"x": x}))
    np.testing.assert_array_equal(trainer.parameters()["w"], np.full((3, 1), 1e-30, np.float32))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_a_non_finite_gradient_with_a_finite_loss_is_named(rng):
    _check_gradient_named("cpu")


def test_a_non_finite_parameter_is_named(rng):
    trainer = _trainer(_classifier(rng, bias=np.array([0, np.inf, 0], np.float32)), "cpu")
    with pytest.raises(FloatingPointError, match="parameter 'b' \\(1 of 3 elements NaN or inf\\)"):
        trainer.step(_batch(rng))


def _check_skip(device, rng):
    trainer = _trainer(_classifier(rng), device, on_nonfinite="skip")
    losses = [float(trainer.step(_batch(rng)))]
    before = trainer.parameters()
    bad = _batch(rng)
    bad["x"][0, 0] = np.inf
    losses.append(float(trainer.step(bad)))
    for name, value in trainer.parameters().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    losses.append(float(trainer.step(_batch(rng))))
    assert np.isnan(losses[1]) and np.isfinite(losses[0]) and np.isfinite(losses[2])
    assert (trainer.nonfinite_steps, trainer.optimizer_steps, trainer.step_count) == (1, 2, 3)


def test_skip_drops_the_update_and_counts_it(rng):
    _check_skip("cpu", rng)


def test_fit_checks_its_data_naming_the_array_and_the_row(rng):
    trainer = _trainer(_classifier(rng), "cpu")
    data = _batch(rng, rows=40)
    data["x"][17, 2] = -np.inf
    data["x"][30, 0] = np.nan
    with pytest.raises(ValueError, match=r"data\['x'\]: row 17 holds a non-finite value \(-inf\); 2 row\(s\) in "
                                         r"all have NaN or inf \(rows \[17, 30\]\)"):
        trainer.fit(data, progress=False)
    assert trainer.step_count == 0


def test_on_nonfinite_is_checked(rng):
    with pytest.raises(ValueError, match="on_nonfinite: expected 'raise' or 'skip', got 'ignore'"):
        _trainer(_classifier(rng), "cpu", on_nonfinite="ignore")


@gpu
def test_nonfinite_on_the_gpu_inside_the_captured_step(rng):
    """CUDA: the same behaviour from the fused optimizer's device-side flag, inside the captured CUDA graph."""
    _check_nan_batch_raises("cuda", rng)
    _check_gradient_named("cuda")
    _check_skip("cuda", rng)


@gpu
def test_nonfinite_on_the_gpu_reported_at_a_later_read(rng):
    """Steps enqueued without reading their loss: the flag stays on the device, and the next read names the first
    bad step (no host synchronisation in between); the plan is a captured CUDA graph."""
    trainer = _trainer(_classifier(rng), "cuda")
    float(trainer.step(_batch(rng)))
    bad = _batch(rng)
    bad["x"][2, 3] = np.nan
    trainer.step(_batch(rng))
    before = trainer.parameters()
    trainer.step(bad)
    assert trainer._executor.plans[0].cuda_graph is not None
    after_bad = trainer.parameters()
    for name, value in after_bad.items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    trainer.step(_batch(rng))
    loss = trainer.step(_batch(rng))
    with pytest.raises(FloatingPointError, match=r"at step 3 \(reported at the read of step 5\): first a gradient "
                                                 r"\(overwritten since by later steps\)"):
        float(loss)
    assert (trainer.nonfinite_steps, trainer.optimizer_steps) == (1, 4)
    assert np.isfinite(float(trainer.step(_batch(rng))))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
def test_skip_counts_on_across_a_checkpoint(rng, tmp_path, device):
    trainer = _trainer(_classifier(rng), device, on_nonfinite="skip")
    bad = _batch(rng)
    bad["x"][1, 1] = np.nan
    float(trainer.step(_batch(rng)))
    float(trainer.step(bad))
    trainer.save(tmp_path / "ckpt.safetensors")
    trainer.load(tmp_path / "ckpt.safetensors")
    assert np.isnan(float(trainer.step(bad)))
    assert (trainer.nonfinite_steps, trainer.optimizer_steps, trainer.step_count) == (2, 1, 3)
