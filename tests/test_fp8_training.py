"""FP8 training: Trainer(..., amp="fp8") with delayed scaling. CPU: the rewrite (which GEMMs, why the others stay
bfloat16), the scaling state as buffers (history roll, scale = fp8_max / max(history)), checkpoints, overflow
without NaN parameters, learning. GPU: the step on the native kernels (no fallback, captured), and the 6x384 GPT
over 1000 steps within 2% of bfloat16 (``large``)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import nn
from graph_executor_v2.datasets import python_source_corpus, random_windows
from graph_executor_v2.models.gpt import GPT, GPTConfig
from graph_executor_v2.passes import fp8

SMALL = GPTConfig(vocab=256, context=32, layers=2, heads=2, width=64)


def _gpt(config=SMALL, seed=0):
    nn.manual_seed(seed)
    return GPT(config)


def _batches(count, batch, context, seed=0):
    corpus = python_source_corpus(max_bytes=1 << 20)
    rng = np.random.default_rng(seed)
    return [dict(zip(("ids", "targets"), random_windows(corpus.train, batch, context, rng))) for _ in range(count)]


def _trainer(model, batch, device="cpu", amp="fp8", **options):
    return ge2.train.Trainer(model.loss_graph(batch), loss="loss", device=device, amp=amp, grad_clip=1.0,
                             optimizer=ge2.train.AdamW(lr=1e-3), **options)


def _states(trainer):
    """weight -> tensor (x, w, g) -> {history, scale, scale_inv} from the trainer's buffers."""
    states = {}
    for name, value in trainer.buffers().items():
        if name.startswith(fp8.STATE_PREFIX):
            weight, tail = name[len(fp8.STATE_PREFIX):].rsplit("/", 1)
            tensor, field = tail.split(".")
            states.setdefault(weight, {}).setdefault(tensor, {})[field] = value
    return states


def test_recipe_and_arguments_are_checked():
    with pytest.raises(ValueError, match="history must be an int >= 1"):
        ge2.train.DelayedScaling(history=0)
    with pytest.raises(ValueError, match="margin must be an int >= 0"):
        ge2.train.DelayedScaling(margin=-1)
    model = _gpt()
    with pytest.raises(ValueError, match="fp8: a DelayedScaling recipe needs amp='fp8'"):
        _trainer(model, 4, amp="bfloat16", fp8=ge2.train.DelayedScaling())
    with pytest.raises(TypeError, match="fp8: expected a ge2.train.DelayedScaling"):
        _trainer(model, 4, fp8={"history": 4})
    with pytest.raises(ValueError, match="amp: expected None, 'float16', 'bfloat16' or 'fp8'"):
        _trainer(model, 4, amp="fp16")


def test_the_linear_gemms_run_in_fp8_except_the_first_and_last():
    trainer = _trainer(_gpt(), 4)
    ops = trainer.train_graph.op_counts()
    # 2 blocks x (qkv, out_proj, fc1, fc2) = 8 linear GEMMs; the first (block 0's qkv) stays bfloat16, the LM head
    # (tied embedding: its weight is a cast, not a parameter) is no FP8 site at all
    # per GEMM: x, W and dY quantized with both layouts in one pass each, three FP8 GEMMs, three scale updates
    assert ops["scaled_gemm"] == ops["quantize_fp8_transpose"] == ops["fp8_scale_update"] == 7 * 3
    assert "quantize_fp8" not in ops and "transpose" not in ops
    # each FP8 site's dbias comes from its dY quantize's own read of dY (no separate sum over dY)
    quantizes = [n for n in trainer.train_graph.nodes if n.op == "quantize_fp8_transpose"]
    assert sum(n.attrs["with_column_sum"] for n in quantizes) == 7
    assert all(n.attrs["dtype"] == "float8_e5m2" for n in quantizes if n.attrs["with_column_sum"])
    # delayed scaling reads the amax of x, W and dY (from their quantize), never a GEMM's output amax
    assert all(not n.attrs["with_amax"] for n in trainer.train_graph.nodes if n.op == "scaled_gemm")
    explained = trainer.explain()
    assert explained.count("runs in FP8: forward E4M3 x E4M3, dgrad and wgrad E5M2 x E4M3") == 7
    assert "(blocks.0.attn.in_proj_weight) stays bfloat16: the forward pass's first or last GEMM" in explained
    assert "stays bfloat16: the weight is not a parameter" in explained  # the tied LM head
    every = _trainer(_gpt(), 4, fp8=ge2.train.DelayedScaling(keep_first_last=False, exclude=("blocks.1.mlp.2.weight",)))
    assert every.train_graph.op_counts()["scaled_gemm"] == 7 * 3
    assert "(blocks.1.mlp.2.weight) stays bfloat16: its weight is in DelayedScaling.exclude" in every.explain()


def test_delayed_scaling_state_rolls_and_sets_the_scales_after_each_step():
    trainer = _trainer(_gpt(), 4, fp8=ge2.train.DelayedScaling(history=3, margin=1))
    batches = _batches(4, 4, SMALL.context)
    start = _states(trainer)
    # x and the gradient start at scale 1 and an empty history; a weight from its initial amax
    assert all(s[t]["scale"] == 1.0 and not s[t]["history"].any() for s in start.values() for t in "xg")
    for weight, state in start.items():
        amax = np.float32(np.abs(trainer.parameters()[weight].astype(ml_dtypes.bfloat16).astype(np.float64)).max())
        assert state["w"]["history"][0] == amax and not state["w"]["history"][1:].any()
        assert state["w"]["scale"] == np.float32(np.float32(448.0 / (float(amax) * 2)))  # margin 1
    previous = None
    for batch in batches:
        trainer.step(batch)
        states = _states(trainer)
        for weight, tensors in states.items():
            for tensor, field in tensors.items():
                target = (448.0 if tensor in "xw" else 57344.0) / 2  # margin 1
                assert field["history"][0] > 0, (weight, tensor)
                assert field["scale"] == np.float32(target) / np.float32(field["history"].max()), (weight, tensor)
                assert field["scale_inv"] == np.float32(1) / field["scale"]
                if previous is not None:  # newest first: last step's newest moved one place
                    np.testing.assert_array_equal(field["history"][1:], previous[weight][tensor]["history"][:-1])
        previous = states
    # the weight's amax is the largest |w| of the bfloat16 copy the step read (the master before this step's update)
    w_history = previous["blocks.1.mlp.0.weight"]["w"]["history"]
    assert w_history[0] == pytest.approx(float(np.abs(trainer.parameters()["blocks.1.mlp.0.weight"]).max()), rel=2e-2)


def test_fp8_training_learns_and_tracks_bfloat16(rng):
    batches = _batches(12, 8, SMALL.context, seed=1)
    fp8_losses = [float(_loss) for _loss in map(_trainer(_gpt(seed=1), 8).step, batches)]
    bf16_losses = [float(_loss) for _loss in map(_trainer(_gpt(seed=1), 8, amp="bfloat16").step, batches)]
    assert np.mean(fp8_losses[-3:]) < 0.9 * fp8_losses[0], fp8_losses
    deviation = np.abs(np.array(fp8_losses) - bf16_losses) / np.array(bf16_losses)
    assert deviation.max() < 0.05, (fp8_losses, bf16_losses)


def test_checkpoints_save_and_restore_the_scaling_state(tmp_path):
    batches = _batches(4, 4, SMALL.context, seed=2)
    trainer = _trainer(_gpt(seed=2), 4)
    for batch in batches[:2]:
        trainer.step(batch)
    trainer.save(tmp_path / "fp8.safetensors")
    restored = _trainer(_gpt(seed=5), 4)
    restored.load(tmp_path / "fp8.safetensors")
    saved = trainer.buffers()
    assert any(name.startswith(fp8.STATE_PREFIX) for name in saved)
    for name, value in restored.buffers().items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)
    # both continue identically from the restored state
    assert float(restored.step(batches[2])) == float(trainer.step(batches[2]))


def test_overflowing_inputs_leave_no_nan_parameters(rng):
    """An input with inf and NaN: FP8 casts saturate, the non-finite amax leaves the scaling state as it was, and
    the step whose gradients are not finite drops its update (on_nonfinite="skip"), so every parameter stays
    finite."""
    graph, _ = ge2.testing.mlp(rng, [32, 64, 64, 32], "float32", "relu", batch=16)
    g = graph
    labels = g.input("labels", (16,), "int64")
    g.output(g.cross_entropy(g.outputs["y"], labels, reduction="mean"), "loss")
    del g.outputs["y"]
    trainer = ge2.train.Trainer(g, loss="loss", amp="fp8", optimizer=ge2.train.SGD(lr=0.1), on_nonfinite="skip",
                                fp8=ge2.train.DelayedScaling(keep_first_last=False))
    feeds = {"x": rng.standard_normal((16, 32)).astype(np.float32), "labels": rng.integers(0, 32, 16)}
    trainer.step(feeds)
    before = _states(trainer)
    assert len(before) == 3  # every layer in FP8 (keep_first_last=False), relu in the epilogue
    bad = dict(feeds, x=feeds["x"].copy())
    bad["x"][0, 0], bad["x"][1, 1] = np.inf, np.nan
    trainer.step(bad)
    assert all(np.isfinite(value).all() for value in trainer.parameters().values())
    assert trainer.optimizer_steps == 1 and trainer.nonfinite_steps == 1  # the overflowed step was dropped
    after = _states(trainer)
    first = sorted(before)[0]
    np.testing.assert_array_equal(after[first]["x"]["history"], before[first]["x"]["history"])
    assert after[first]["x"]["scale"] == before[first]["x"]["scale"]
    trainer.step(feeds)
    assert trainer.optimizer_steps == 2 and all(np.isfinite(v).all() for v in trainer.parameters().values())


@pytest.mark.gpu
def test_fp8_step_on_the_gpu_matches_the_cpu_emulation_and_is_captured():
    batches = _batches(5, 8, SMALL.context, seed=3)
    gpu = _trainer(_gpt(seed=3), 8, device="cuda")
    cpu = _trainer(_gpt(seed=3), 8)
    gpu_losses = [float(gpu.step(batch)) for batch in batches]
    cpu_losses = [float(cpu.step(batch)) for batch in batches]
    explained = gpu.explain()
    print(explained)
    assert not gpu._executor.fallbacks, [s.node for s in gpu._executor.fallbacks]
    assert "cuda graph: captured" in explained or "cuda graph: replayed" in explained, explained
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=2e-2, err_msg="FP8 step: GPU vs CPU emulation")
    gpu_states, cpu_states = _states(gpu), _states(cpu)
    for weight, tensors in cpu_states.items():
        for tensor, field in tensors.items():
            np.testing.assert_allclose(gpu_states[weight][tensor]["scale"], field["scale"], rtol=5e-2,
                                       err_msg=f"{weight}/{tensor} scale")


@pytest.mark.gpu
@pytest.mark.large
def test_large_gpt_6x384_trains_1000_steps_in_fp8_within_2_percent_of_bfloat16():
    """The attention issue's GPT (6 layers, width 384) from the same initialisation on the same batches: the FP8 loss
    within 2% of the bfloat16 loss at every step after the warm-up (the first 100 steps: delayed scaling starts from
    scale 1 and learns the tensors' ranges; the learning-rate warm-up is as long), issue 24's criterion. The H200
    runs so far miss it: per-step gap 0.77% mean, 3.3% largest (step 771, FP8 the lower), within 2% over 20-step
    means, FP8's final loss 1.5% below bfloat16's; both figures are printed."""
    config = GPTConfig(vocab=256, context=256, layers=6, heads=6, width=384)
    steps, batch, warmup, window = 1000, 16, 100, 20
    batches = _batches(steps, batch, config.context, seed=7)
    schedule = ge2.train.Cosine(1e-3, total_steps=steps, warmup_steps=warmup, min_lr=1e-4)
    curves = {}
    for amp in ("bfloat16", "fp8"):
        trainer = ge2.train.Trainer(_gpt(config, seed=7).loss_graph(batch), loss="loss", device="cuda", amp=amp,
                                    grad_clip=1.0, optimizer=ge2.train.AdamW(lr=schedule, weight_decay=0.1))
        curves[amp] = np.array([float(trainer.step(b)) for b in batches])
        assert not trainer._executor.fallbacks, amp
    deviation = np.abs(curves["fp8"] - curves["bfloat16"])[warmup:] / curves["bfloat16"][warmup:]
    smooth = {amp: np.convolve(curve, np.ones(window) / window, mode="valid") for amp, curve in curves.items()}
    smoothed = np.abs(smooth["fp8"] - smooth["bfloat16"])[warmup:] / smooth["bfloat16"][warmup:]
    worst = int(deviation.argmax()) + warmup
    print(f"FP8 vs bfloat16 per step: max {deviation.max():.3%} at step {worst + 1}, mean {deviation.mean():.3%}; "
          f"over {window} steps: max {smoothed.max():.3%}, mean {smoothed.mean():.3%}; final losses "
          f"{curves['fp8'][-1]:.4f} / {curves['bfloat16'][-1]:.4f}")
    assert deviation.max() <= 0.02, (f"step {worst + 1}: FP8 {curves['fp8'][worst]:.4f} vs bfloat16 "
                                     f"{curves['bfloat16'][worst]:.4f}; over {window}-step means the largest gap is "
                                     f"{smoothed.max():.3%}")
