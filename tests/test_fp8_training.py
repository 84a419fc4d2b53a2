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
from graph_executor_v2.nn.losses import CONSTANT_PREFIX
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
    # per GEMM: x, W and dY quantized with both layouts in one pass each, three FP8 GEMMs; the 21 states update in
    # two nodes at the end of the step (E4M3: x and W; E5M2: dY)
    # the weights' quantizes (parameters: all known at the step's start) are one node, one launch
    # the residual-stream gradients of three dY quantizes (block 1's out_proj, block 0's fc2 and out_proj) are added
    # by the quantize itself (quantize_fp8_add_transpose): 7 * 2 quantizes in all
    assert ops["scaled_gemm"] == 7 * 3 and ops["quantize_fp8_transpose"] == 7 * 2 - 3
    assert ops["quantize_fp8_add_transpose"] == 3
    assert ops["quantize_fp8_transpose_multi"] == 1
    multi = next(n for n in trainer.train_graph.nodes if n.op == "quantize_fp8_transpose_multi")
    assert len(multi.inputs) == 7 * 2 and all(x.is_param and x.name.endswith("weight") for x in multi.inputs[0::2])
    assert multi.attrs["dtype"] == "float8_e4m3fn" and len(multi.outputs) == 7 * 3
    # it runs where the first weight's quantize ran, before the first FP8 GEMM reads any of its outputs
    first_reader = min(trainer.train_graph.nodes.index(n) for n in trainer.train_graph.nodes
                       if any(v in multi.outputs for v in n.inputs))
    assert trainer.train_graph.nodes.index(multi) < first_reader
    updates = [n for n in trainer.train_graph.nodes if n.op == "fp8_scale_update"]
    assert sorted((n.attrs["dtype"], len(n.inputs)) for n in updates) == [("float8_e4m3fn", 14 * 3),
                                                                          ("float8_e5m2", 7 * 3)]
    assert "quantize_fp8" not in ops and "transpose" not in ops
    # each FP8 site's dbias comes from its dY quantize's own read of dY (no separate sum over dY)
    quantizes = [n for n in trainer.train_graph.nodes if n.op == "quantize_fp8_transpose"]
    adds = [n for n in trainer.train_graph.nodes if n.op == "quantize_fp8_add_transpose"]
    assert sum(n.attrs["with_column_sum"] for n in quantizes + adds) == 7
    assert all(n.attrs["dtype"] == "float8_e5m2" for n in quantizes + adds if n.attrs["with_column_sum"])
    assert all(n.attrs["value_dtype"] == "bfloat16" for n in adds)
    # the GELU between fc1 and fc2 is the prologue of fc2's x quantize, and GELU's backward that of fc1's dY
    # quantize (with the pre-activation): neither runs as a node
    assert "gelu" not in ops and "gelu_backward" not in ops
    prologues = sorted((n.attrs["act"], n.inputs[2] is not None, n.attrs["with_column_sum"]) for n in quantizes
                       if n.attrs["act"] != "none")
    assert prologues == [("gelu", False, False)] * 2 + [("gelu", True, True)] * 2, prologues
    # the dgrads whose float32 gradient goes on to a layernorm_backward (fc1's in both blocks, block 1's QKV) write
    # float32 themselves: no cast kernel widens a bfloat16 output
    gemms = [n for n in trainer.train_graph.nodes if n.op == "scaled_gemm"]
    assert [n.attrs["out_dtype"] for n in gemms].count("float32") == 3
    assert not [n for n in trainer.train_graph.nodes if n.op == "cast" and n.inputs[0].producer in gemms]
    # block 1's QKV output gradients (q, k and v's, joined by join_slice_gradients) are read in place by their dY
    # quantize (x, x1, x2): no concat; block 0's QKV stays bfloat16, its gemm_backward reads the one concat left
    in_blocks = [n for n in quantizes if n.inputs[3] is not None]
    assert len(in_blocks) == 1 and in_blocks[0].inputs[4] is not None and ops["concat"] == 1, ops
    assert in_blocks[0].attrs["with_column_sum"] and in_blocks[0].outputs[0].type.shape[1] == 3 * SMALL.width
    # delayed scaling reads the amax of x, W and dY (from their quantize), never a GEMM's output amax
    assert all(not n.attrs["with_amax"] for n in trainer.train_graph.nodes if n.op == "scaled_gemm")
    explained = trainer.explain()
    assert explained.count("runs in FP8: forward E4M3 x E4M3, dgrad and wgrad E5M2 x E4M3") == 7
    assert "7 weight quantizes (float8_e4m3fn) batched into" in explained
    assert explained.count("writes float32 for") == 3
    assert explained.count("(concat of 3 on axis 2) read in place by") == 1
    assert "(blocks.0.attn.in_proj_weight) stays bfloat16: the forward pass's first or last GEMM" in explained
    assert "stays bfloat16: the weight is not a parameter" in explained  # the tied LM head
    every = _trainer(_gpt(), 4, fp8=ge2.train.DelayedScaling(keep_first_last=False, exclude=("blocks.1.mlp.2.weight",)))
    assert every.train_graph.op_counts()["scaled_gemm"] == 7 * 3
    assert "(blocks.1.mlp.2.weight) stays bfloat16: its weight is in DelayedScaling.exclude" in every.explain()


def test_only_a_dgrad_bound_for_a_layernorm_backward_writes_float32(rng):
    """x @ W1 -> layernorm -> @ W2 -> loss, both GEMMs FP8. W2's dgrad reaches the layernorm's backward through a
    widening cast alone: it writes float32 itself. W1's output reaches the layernorm through a cast too, but that
    cast fuses into the layernorm's kernel (fused_row), which reads the bfloat16: it stays; so do the bfloat16 logits
    (the fused loss reads them in 16 bits)."""
    g = ge2.ir.Graph("ln_between")
    x, labels = g.input("x", (32, 32), "float32"), g.input("labels", (32,), "int64")
    w1, w2 = (g.param(name, (rng.standard_normal((32, 32)) * 0.2).astype(np.float32)) for name in ("w1", "w2"))
    gamma, beta = g.param("gamma", np.ones(32, np.float32)), g.param("beta", np.zeros(32, np.float32))
    hidden = g.layernorm(g.gemm(x, w1, trans_b=True), gamma, beta)
    g.output(g.cross_entropy(g.gemm(hidden, w2, trans_b=True), labels), "loss")
    trainer = ge2.train.Trainer(g, loss="loss", amp="fp8", optimizer=ge2.train.AdamW(lr=1e-3),
                                fp8=ge2.train.DelayedScaling(keep_first_last=False))
    graph = trainer.train_graph
    users = graph.users()
    # reader -> the dtype the scaled_gemm feeding it writes (the weight gradients are graph outputs, read by none)
    out_dtypes = {users[n.outputs[0]][0].op: n.attrs["out_dtype"] for n in graph.nodes
                  if n.op == "scaled_gemm" and users.get(n.outputs[0])}
    assert out_dtypes == {"fused_row": "bfloat16", "cross_entropy_with_grad": "bfloat16",
                          "layernorm_backward": "float32"}, out_dtypes
    assert "writes float32 for" in trainer.explain()
    feeds = {"x": rng.standard_normal((32, 32)).astype(np.float32), "labels": rng.integers(0, 32, 32)}
    assert np.isfinite(float(trainer.step(feeds)))


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


def _loss_scaled_graph(model, batch, factor):
    """The model's loss graph with its loss multiplied by ``factor`` (a constant, not trained)."""
    g = model.loss_graph(batch)
    loss = g.outputs.pop("loss")
    g.output(g.mul(loss, g.param(f"{CONSTANT_PREFIX}loss_factor", np.array(factor, np.float32))), "loss")
    return g


def test_calibration_gives_the_first_steps_the_gradients_of_a_mean_loss_over_many_tokens():
    """GPT-2's bench row (8192 tokens a step) rose to loss 11.98 at its third FP8 step against bfloat16's 9.89: a
    mean loss's gradients there are around 1e-6, below E5M2's smallest subnormal (2**-16) at the initial scale 1,
    so the FP8 layers' first gradients were zeros, and so were the gradients their dgrad passes on. The loss
    multiplied by 1/8192 gives the small GPT such gradients. Calibrated (the default), every weight moves in the
    first step and the loss stays with bfloat16's; uncalibrated (Transformer Engine's scale-1 start), no weight
    inside the blocks moves in the first step (bfloat16 ones included: their gradient comes through an FP8 dgrad)
    and the loss lags."""
    batch = _batches(1, 8, SMALL.context, seed=4)[0]
    factor, steps = 1.0 / 8192, 3
    initial = {name: p.data.copy() for name, p in _gpt(seed=4).named_parameters()}
    trainers = {key: ge2.train.Trainer(_loss_scaled_graph(_gpt(seed=4), 8, factor), loss="loss", amp=amp,
                                       optimizer=ge2.train.Adam(lr=1e-3), **options)
                for key, amp, options in (("bfloat16", "bfloat16", {}), ("calibrated", "fp8", {}),
                                          ("uncalibrated", "fp8", {"fp8": ge2.train.DelayedScaling(calibrate=False)}))}
    losses, moved = {}, {}
    for key, trainer in trainers.items():
        losses[key] = [float(trainer.step(batch)) / factor]
        moved[key] = {name: float(np.mean(value != initial[name])) for name, value in trainer.parameters().items()}
        losses[key] += [float(trainer.step(batch)) / factor for _ in range(steps - 1)]
    fp8_weights = sorted(_states(trainers["calibrated"]))
    assert len(fp8_weights) == 7
    # three passes: x and the gradients after fc2/out_proj, then those behind their dgrad, then settled
    assert trainers["calibrated"].fp8_calibration_passes == 3 and trainers["uncalibrated"].fp8_calibration_passes == 0
    assert "calibrated by 3 forward/backward pass(es) on the first batch" in trainers["calibrated"].explain()
    block_weights = [name for name in initial if name.startswith("blocks.") and name.endswith("weight")]
    assert set(fp8_weights) < set(block_weights)
    for key in ("bfloat16", "calibrated"):
        assert all(moved[key][name] > 0.9 for name in block_weights), (key, moved[key])
    assert all(moved["uncalibrated"][name] == 0.0 for name in block_weights), moved["uncalibrated"]
    deviation = {key: np.abs(np.array(losses[key]) - losses["bfloat16"]) / losses["bfloat16"]
                 for key in ("calibrated", "uncalibrated")}
    assert deviation["calibrated"].max() < 0.002, losses
    assert deviation["uncalibrated"].max() > 0.005, losses  # the defect this guards against
    # the calibration's amaxes are in the history, behind the first step's own
    for tensors in _states(trainers["calibrated"]).values():
        for tensor in ("x", "g"):
            assert (tensors[tensor]["history"][:steps + 3] > 0).sum() >= steps + 2, tensors[tensor]["history"]


def test_checkpoints_save_and_restore_the_scaling_state(tmp_path):
    batches = _batches(4, 4, SMALL.context, seed=2)
    trainer = _trainer(_gpt(seed=2), 4)
    assert "no calibration pass run yet (no step taken, or the state came calibrated)" in trainer.explain()
    for batch in batches[:2]:
        trainer.step(batch)
    trainer.save(tmp_path / "fp8.safetensors")
    restored = _trainer(_gpt(seed=5), 4)
    restored.load(tmp_path / "fp8.safetensors")
    saved = trainer.buffers()
    assert any(name.startswith(fp8.STATE_PREFIX) for name in saved)
    for name, value in restored.buffers().items():
        np.testing.assert_array_equal(value, saved[name], err_msg=name)
    # both continue identically from the restored state (calibrated already: no calibration pass)
    assert float(restored.step(batches[2])) == float(trainer.step(batches[2]))
    assert restored.fp8_calibration_passes == 0 and trainer.fp8_calibration_passes > 0


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
def test_gpt2_sized_fp8_steps_track_bfloat16_from_the_first_step():
    """bench_train.py's gpt2_fp8 setting (GPT-2's width, heads and vocabulary, batch 8 x 1024: 8192 tokens a step,
    AdamW lr 1e-3, no clipping, the same batch every step), 4 layers: every weight moves in the first step and the
    FP8 loss is within 2% of bfloat16's at every step. Before the first-step calibration the 12-layer row's FP8 loss
    rose to 11.98 at its third step against bfloat16's 9.89 (E5M2 gradients at scale 1 flushed to zero)."""
    config, batch, steps = GPTConfig(vocab=50257, context=1024, layers=4, heads=12, width=768), 8, 4
    rng = np.random.default_rng(11)
    feeds = {name: rng.integers(0, config.vocab, (batch, config.context)) for name in ("ids", "targets")}
    initial = {name: p.data.copy() for name, p in _gpt(config, seed=11).named_parameters()}
    curves = {}
    for amp in ("bfloat16", "fp8"):
        trainer = ge2.train.Trainer(_gpt(config, seed=11).loss_graph(batch), loss="loss", device="cuda", amp=amp,
                                    optimizer=ge2.train.AdamW(lr=1e-3, weight_decay=0.01))
        curves[amp] = [float(trainer.step(feeds))]
        # moved by an update (about lr), not by the weight decay alone (lr * 0.01 * |w|, below 1e-6)
        unmoved = [name for name, value in trainer.parameters().items()
                   if name.endswith("weight") and np.mean(np.abs(value - initial[name]) > 1e-5) < 0.9]
        assert not unmoved, (amp, unmoved)
        curves[amp] += [float(trainer.step(feeds)) for _ in range(steps - 1)]
        assert not trainer._executor.fallbacks, amp
    assert trainer.fp8_calibration_passes >= 2, trainer.explain()
    print(f"losses bfloat16 {np.round(curves['bfloat16'], 4)}, fp8 {np.round(curves['fp8'], 4)}")
    np.testing.assert_allclose(curves["fp8"], curves["bfloat16"], rtol=0.02, err_msg="FP8 vs bfloat16 per step")


@pytest.mark.gpu
@pytest.mark.large
def test_large_gpt_6x384_trains_1000_steps_in_fp8_within_2_percent_of_bfloat16():
    """The attention issue's GPT (6 layers, width 384) from the same initialisation, issue 24's criterion: the FP8 loss
    curve within 2% of bfloat16's after the warm-up (the learning rate's, the first 100 steps). A precision's loss
    curve is the mean of four runs over four orders of the same batches: one run is one trajectory of a chaotic
    system, and a loss spike in any one of them moves the others' gaps (with two orders, session 43's suite put FP8
    2.28% and float32 1.60% from bfloat16 over 20-step means). On the H200 a float32 run (amp=None) differs from
    bfloat16 by up to 3.6% at single steps (0.93% mean, 2.09% over 20-step means), FP8 by up to 3.9% (0.88% mean, 1.54%
    over 20-step means; main efb6fec); in session 41, single runs put float32 2.29% from bfloat16 over 20-step means
    twice, and FP8 2.52% once, where bfloat16 spiked at step 246 (FP8 10.2% and float32 8.8% from it at that step).
    So the curve is the 20-step running mean of the runs' mean, held to 2%, and FP8's mean per-step gap to 1%, or
    to float32's (the yardstick, measured in the same test) with 25% slack where that is larger. All the figures are
    printed; before the first-step calibration FP8 missed by 5.66% at step 108 (1.12% over 20-step means)."""
    config = GPTConfig(vocab=256, context=256, layers=6, heads=6, width=384)
    steps, batch, warmup, window = 1000, 16, 100, 20
    orders = [_batches(steps, batch, config.context, seed=seed) for seed in (7, 8, 9, 10)]
    schedule = ge2.train.Cosine(1e-3, total_steps=steps, warmup_steps=warmup, min_lr=1e-4)
    curves = {}
    for amp in ("bfloat16", "fp8", None):
        runs = []
        for batches in orders:
            trainer = ge2.train.Trainer(_gpt(config, seed=7).loss_graph(batch), loss="loss", device="cuda", amp=amp,
                                        grad_clip=1.0, optimizer=ge2.train.AdamW(lr=schedule, weight_decay=0.1))
            runs.append([float(trainer.step(b)) for b in batches])
            assert not trainer._executor.fallbacks, amp
        curves[amp or "float32"] = np.mean(runs, axis=0)

    def gaps(run):
        """(per-step relative gaps to bfloat16 after the warm-up, the same over ``window``-step means)"""
        step = np.abs(curves[run] - curves["bfloat16"])[warmup:] / curves["bfloat16"][warmup:]
        smooth = {r: np.convolve(curves[r], np.ones(window) / window, mode="valid") for r in (run, "bfloat16")}
        return step, (np.abs(smooth[run] - smooth["bfloat16"]) / smooth["bfloat16"])[warmup:]

    for run in ("fp8", "float32"):
        step, smoothed = gaps(run)
        print(f"{run} vs bfloat16 per step: max {step.max():.3%} at step {int(step.argmax()) + warmup + 1}, mean "
              f"{step.mean():.3%}; over {window} steps: max {smoothed.max():.3%}, mean {smoothed.mean():.3%}; final "
              f"losses {curves[run][-1]:.4f} / {curves['bfloat16'][-1]:.4f}")
    deviation, smoothed = gaps("fp8")
    yardstick, _ = gaps("float32")
    worst = int(smoothed.argmax()) + warmup
    assert smoothed.max() <= 0.02, (f"the FP8 loss curve ({window}-step means) is {smoothed.max():.3%} from "
                                    f"bfloat16's at step {worst + 1}")
    assert deviation.mean() <= max(0.01, 1.25 * yardstick.mean()), (
        f"FP8's mean per-step gap to bfloat16 {deviation.mean():.3%}, float32's {yardstick.mean():.3%}")


@pytest.mark.gpu
def test_the_captured_fp8_step_holds_no_memset_per_quantize():
    """The quantize kernels write their amax and column sums (their last blocks finish the reductions), so the
    captured FP8 step has no memset node before each quantize: it holds fewer extra memsets over the bfloat16 step
    of the same model than it has quantizes (before, one memset per quantize)."""
    batch = _batches(1, 8, SMALL.context, seed=5)[0]
    memsets, quantizes = {}, 0
    for amp in ("bfloat16", "fp8"):
        trainer = _trainer(_gpt(seed=5), 8, device="cuda", amp=amp)
        for _ in range(3):  # warm-up, capture, replay
            trainer.step(batch)
        graphs = [plan for plan in trainer._executor.plans if plan.cuda_graph is not None]
        assert graphs, trainer.explain()
        step = max(graphs, key=lambda plan: plan.cuda_graph.node_count)
        memsets[amp] = step.cuda_graph.node_types.get("memset", 0)
        print(amp, step.cuda_graph.node_types)
        if amp == "fp8":
            quantizes = sum(s.op in ("quantize_fp8", "quantize_fp8_transpose") for s in step.selections)
    assert quantizes > 0
    assert memsets["fp8"] - memsets["bfloat16"] < quantizes, (memsets, quantizes)


def test_streams_is_checked():
    model = _gpt()
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="streams"):
            _trainer(model, 4, streams=bad)


def _unfused_gradient_adds(monkeypatch):
    monkeypatch.setattr(fp8, "fuse_gradient_adds", lambda graph: [])


def test_residual_gradient_adds_are_fused_into_their_quantizes(monkeypatch):
    """Every float32 add of two input gradients whose bfloat16 cast only a dY quantize read (a transformer's
    residual-stream gradient) becomes one quantize_fp8_add_transpose; the steps' losses and parameters are those of
    the unfused step (CPU backend: each op's reference)."""
    batches = _batches(3, 4, SMALL.context, seed=9)
    fused = _trainer(_gpt(seed=9), 4)
    ops = fused.train_graph.op_counts()
    # a 2-layer GPT: the second block's attention projection, the first block's two (fc2's of the last block reads
    # the final layernorm's gradient alone: no add)
    assert ops.get("quantize_fp8_add_transpose") == 2 * SMALL.layers - 1, ops
    assert "quantize_fp8_add_transpose" in fused.explain()
    _unfused_gradient_adds(monkeypatch)
    unfused = _trainer(_gpt(seed=9), 4)
    assert "quantize_fp8_add_transpose" not in unfused.train_graph.op_counts()
    for batch in batches:
        assert float(fused.step(batch)) == float(unfused.step(batch))
    for name, value in unfused.parameters().items():
        np.testing.assert_array_equal(fused.parameters()[name], value, err_msg=name)


class _ResidualMLP(nn.Module):
    """Pre-norm residual GELU MLP blocks, a final LayerNorm and a classifier: a GPT's residual stream and FP8 sites
    without attention or embeddings, whose backward kernels (atomics in some attention backwards) need not be
    deterministic; every kernel of this one's step is, so two runs of it agree bit for bit."""

    def __init__(self, width=64, layers=3, classes=16):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width),
                                                    nn.GELU("tanh"), nn.Linear(4 * width, width))
                                      for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, g, x):  # x [batch, seq, width], as a GPT's residual stream (3-d: no residual fused into a gemm)
        for block in self.blocks:
            x = g.add(x, block(g, x))
        batch, seq, width = x.type.shape
        return self.head(g, g.reshape(self.ln_f(g, x), shape=(batch * seq, width)))

    def loss_graph(self, batch, seq=64, width=64):
        g = ge2.ir.Graph("residual_mlp")
        self._name_parameters()
        logits = self(g, g.input("x", (batch, seq, width), "float32"))
        g.output(g.cross_entropy(logits, g.input("labels", (batch * seq,), "int64")), "loss")
        return g


def _residual_mlp_steps(device, steps=4, **options):
    """(losses, trainer) of a _ResidualMLP trained in FP8 for ``steps`` steps from the same initialisation and data."""
    nn.manual_seed(21)
    trainer = ge2.train.Trainer(_ResidualMLP().loss_graph(2), device=device, amp="fp8", grad_clip=1.0,
                                optimizer=ge2.train.AdamW(lr=1e-3), **options)
    rng = np.random.default_rng(21)
    batches = [{"x": rng.standard_normal((2, 64, 64)).astype(np.float32), "labels": rng.integers(0, 16, 128)}
               for _ in range(steps)]
    return [float(trainer.step(batch)) for batch in batches], trainer


def _assert_same_training(a, b):
    (losses_a, trainer_a), (losses_b, trainer_b) = a, b
    assert losses_a == losses_b, (losses_a, losses_b)
    for name, value in trainer_a.parameters().items():
        np.testing.assert_array_equal(trainer_b.parameters()[name], value, err_msg=name)
    for name, value in trainer_a.buffers().items():
        np.testing.assert_array_equal(trainer_b.buffers()[name], value, err_msg=name)


@pytest.mark.gpu
def test_fused_residual_gradient_quantizes_match_the_unfused_step_bit_for_bit(monkeypatch):
    """On the GPU the fused kernel's float32 sums, roundings, amaxes and column sums are the generated add-and-cast
    kernel's followed by quantize_fp8_transpose's, bit for bit: every loss, parameter and scaling state equal. (The
    two blocks below the last add their residual gradients in their fc2 dY quantize.)"""
    fused = _residual_mlp_steps("cuda")
    assert fused[1].train_graph.op_counts().get("quantize_fp8_add_transpose") == 2, fused[1].train_graph.op_counts()
    assert not fused[1]._executor.fallbacks, [s.node for s in fused[1]._executor.fallbacks]
    _unfused_gradient_adds(monkeypatch)
    unfused = _residual_mlp_steps("cuda")
    assert "quantize_fp8_add_transpose" not in unfused[1].train_graph.op_counts()
    _assert_same_training(fused, unfused)


@pytest.mark.gpu
def test_a_two_stream_fp8_step_matches_the_one_stream_step_bit_for_bit():
    """streams=2 runs the same kernels on the same values in another order (the weight-gradient GEMMs beside the
    next layer's backward): every loss, parameter and scaling state equals the one-stream step's exactly, and the
    step is still one captured CUDA graph."""
    one, two = _residual_mlp_steps("cuda"), _residual_mlp_steps("cuda", streams=2)
    explained = two[1].explain()
    assert "cuda graph: captured" in explained or "cuda graph: replayed" in explained, explained
    assert any(plan.schedule.stream_count == 2 for plan in two[1]._executor.plans)
    _assert_same_training(one, two)
