"""The GPT model (``ge2.models.gpt``) end to end on the CPU backend: its forward against a float64 NumPy GPT with the
same weights, its gradients (through the trainer's passes and autograd) against float64 finite differences, and
training with AdamW lowering the loss."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import autograd, nn
from graph_executor_v2.datasets import python_source_corpus, random_windows
from graph_executor_v2.models.gpt import GPT, GPTConfig
from graph_executor_v2.passes import TRAINING_BACKWARD, TRAINING_FORWARD, PassManager, resolve
from graph_executor_v2.testing import assert_close

TINY = GPTConfig(vocab=19, context=7, layers=2, heads=2, width=12)


# ---------------------------------------------------------------------------------------------------------------
# A float64 NumPy GPT: the oracle (parameter names and layouts are the model's, PyTorch's)
# ---------------------------------------------------------------------------------------------------------------
def _layernorm(x, weight, bias, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps) * weight + bias


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def numpy_gpt_logits(params: dict, ids: np.ndarray, config: GPTConfig) -> np.ndarray:
    """Logits [batch * context, vocab] in float64."""
    p = {name: np.asarray(value, np.float64) for name, value in params.items()}
    batch, context = ids.shape
    heads, head_dim = config.heads, config.width // config.heads
    x = p["wte.weight"][ids] + p["wpe.weight"][:context]
    causal = np.tril(np.ones((context, context), bool))
    for layer in range(config.layers):
        block = f"blocks.{layer}."
        h = _layernorm(x, p[block + "ln_1.weight"], p[block + "ln_1.bias"])
        qkv = h @ p[block + "attn.in_proj_weight"].T + p[block + "attn.in_proj_bias"]
        qkv = qkv.reshape(batch, context, 3, heads, head_dim).transpose(2, 0, 3, 1, 4)  # [3, b, h, s, d]
        scores = qkv[0] @ qkv[1].swapaxes(-1, -2) / np.sqrt(head_dim)
        scores = np.where(causal, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        attended = (weights @ qkv[2]).transpose(0, 2, 1, 3).reshape(batch, context, config.width)
        x = x + attended @ p[block + "attn.out_proj.weight"].T + p[block + "attn.out_proj.bias"]
        h = _layernorm(x, p[block + "ln_2.weight"], p[block + "ln_2.bias"])
        h = _gelu_tanh(h @ p[block + "mlp.0.weight"].T + p[block + "mlp.0.bias"])
        x = x + h @ p[block + "mlp.2.weight"].T + p[block + "mlp.2.bias"]
    x = _layernorm(x, p["ln_f.weight"], p["ln_f.bias"])
    return x.reshape(batch * context, config.width) @ p["wte.weight"].T  # the tied head


def numpy_gpt_loss(params: dict, ids: np.ndarray, targets: np.ndarray, config: GPTConfig) -> float:
    logits = numpy_gpt_logits(params, ids, config)
    peak = logits.max(axis=1, keepdims=True)
    log_z = peak[:, 0] + np.log(np.exp(logits - peak).sum(axis=1))
    return float((log_z - logits[np.arange(len(logits)), targets.reshape(-1)]).mean())


def _model(rng, config=TINY) -> GPT:
    """A GPT whose every parameter (biases and norms included) is random, so every path carries a gradient."""
    nn.manual_seed(int(rng.integers(0, 2**31)))
    model = GPT(config)
    model.load_state_dict({name: rng.normal(1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight")
                                            or name == "ln_f.weight" else 0.0, 0.3, p.shape)
                           for name, p in model.named_parameters()})
    return model


def _batch(rng, batch, config=TINY):
    ids = rng.integers(0, config.vocab, (batch, config.context)).astype(np.int64)
    return ids, rng.integers(0, config.vocab, (batch, config.context)).astype(np.int64)


# ---------------------------------------------------------------------------------------------------------------
def test_forward_matches_numpy_gpt(rng):
    model = _model(rng)
    ids, targets = _batch(rng, 3)
    params = model.state_dict()
    logits_graph = model.graph({"ids": ((3, TINY.context), "int64")})
    counts = logits_graph.op_counts()
    assert counts["attention"] == TINY.layers and counts["embedding"] == 2, counts
    logits = ge2.ExecutorV2(logits_graph).run({"ids": ids})["y"]
    assert_close(logits, numpy_gpt_logits(params, ids, TINY), "float32", 4 * TINY.width, what="GPT logits")
    loss = ge2.ExecutorV2(model.loss_graph(3)).run({"ids": ids, "targets": targets})["loss"]
    assert loss.shape == () and loss.dtype == np.float32
    assert_close(loss, numpy_gpt_loss(params, ids, targets, TINY), "float32", 4 * TINY.width, what="GPT loss")


def test_tied_head_is_one_parameter(rng):
    graph = _model(rng).loss_graph(2)
    assert "wte.weight" in graph.params and not any("head" in name for name in graph.params)
    users = graph.users()[graph.params["wte.weight"]]
    assert sorted(node.op for node in users) == ["embedding", "gemm"]


def test_gradients_match_finite_differences(rng):
    """Every parameter's gradient (the tied embedding's two uses summed) through the trainer's passes."""
    model = _model(rng)
    batch = 2
    ids, targets = _batch(rng, batch)
    params = model.state_dict()
    forward, _ = PassManager(resolve(TRAINING_FORWARD)).run(model.loss_graph(batch))
    differentiated, _ = PassManager(resolve(TRAINING_BACKWARD)).run(autograd.backward_graph(forward, "loss"))
    results = ge2.ExecutorV2(differentiated, passes=[]).run({"ids": ids, "targets": targets})
    assert_close(results["loss"], numpy_gpt_loss(params, ids, targets, TINY), "float32", 4 * TINY.width, "loss")
    assert {name for name in results if name.startswith(autograd.GRAD_PREFIX)} == {
        autograd.grad_name(name) for name in params}

    step = 1e-6
    for name, value in params.items():
        got = results[autograd.grad_name(name)]
        assert got.shape == value.shape and np.isfinite(got).all(), name
        # every entry of small tensors, a random sample of the larger ones
        flat = np.arange(value.size) if value.size <= 24 else rng.choice(value.size, 24, replace=False)
        numeric = np.empty(len(flat))
        for position, index in enumerate(flat):
            losses = []
            for sign in (1.0, -1.0):
                shifted = dict(params)
                shifted[name] = value.astype(np.float64).copy()
                shifted[name].reshape(-1)[index] += sign * step
                losses.append(numpy_gpt_loss(shifted, ids, targets, TINY))
            numeric[position] = (losses[0] - losses[1]) / (2 * step)
        assert_close(got.reshape(-1)[flat], numeric, "float32", 4 * TINY.width, what=f"d loss / d {name}")


def test_unaligned_vocabulary_head_is_padded_with_the_same_loss_and_gradients(rng):
    """A vocabulary of 1031 (not a multiple of 8, as GPT-2's 50257): the trainer's forward passes compute the tied
    head over 1088 classes (pad_classes); the float64 NumPy GPT's loss, and every gradient of the unpadded graph,
    hold; the trainer explains the padding."""
    config = GPTConfig(vocab=1031, context=5, layers=1, heads=2, width=12)
    model = _model(rng, config)
    ids, targets = _batch(rng, 2, config)
    feeds = {"ids": ids, "targets": targets}
    passes = [name for name in TRAINING_FORWARD if name != "pad_classes"]
    results = {}
    for padded in (False, True):
        forward, records = PassManager(resolve(TRAINING_FORWARD if padded else passes)).run(model.loss_graph(2))
        heads = [n.outputs[0].type.shape for n in forward.nodes if n.op == "gemm" and n.attrs["trans_b"]
                 and n.inputs[1].producer is not None]
        assert heads == ([(10, 1088)] if padded else []), heads
        differentiated, _ = PassManager(resolve(TRAINING_BACKWARD)).run(autograd.backward_graph(forward, "loss"))
        results[padded] = ge2.ExecutorV2(differentiated, passes=[]).run(feeds)
    assert_close(results[True]["loss"], numpy_gpt_loss(model.state_dict(), ids, targets, config), "float32",
                 4 * config.width, "loss")
    for name, value in results[False].items():
        assert_close(results[True][name], value.astype(np.float64), "float32", 1031, what=name)
    trainer = ge2.train.Trainer(model.loss_graph(2), optimizer=ge2.train.AdamW(lr=1e-3), amp="bfloat16")
    explained = trainer.explain()
    assert "1031 classes computed as 1088" in explained and "after its cast to bfloat16" in explained
    # the float32 tied weight is cast first and padded in bfloat16; its gradient's crop runs in bfloat16 too
    pads = [n for n in trainer.train_graph.nodes if n.op == "pad"]
    assert sorted((n.outputs[0].type.shape[0], n.outputs[0].type.dtype) for n in pads) == [(1031, "bfloat16"),
                                                                                          (1088, "bfloat16")]


def test_tied_embedding_gradient_sums_both_uses(rng):
    """A token that is never an input still gets a gradient, from the output head alone."""
    model = _model(rng)
    ids, targets = _batch(rng, 2)
    ids[ids == 0] = 1  # token 0 is read by the head only
    graph = model.loss_graph(2)
    grads = ge2.ExecutorV2(autograd.backward_graph(graph, "loss", ["wte.weight"]), passes=[]).run(
        {"ids": ids, "targets": targets})["grad/wte.weight"]
    params = model.state_dict()
    step = 1e-6
    for column in (0, 5):
        losses = []
        for sign in (1.0, -1.0):
            shifted = dict(params)
            shifted["wte.weight"] = params["wte.weight"].astype(np.float64).copy()
            shifted["wte.weight"][0, column] += sign * step
            losses.append(numpy_gpt_loss(shifted, ids, targets, TINY))
        assert abs(grads[0, column]) > 1e-6
        assert_close(grads[0, column], (losses[0] - losses[1]) / (2 * step), "float32", 4 * TINY.width,
                     what="head-only gradient of an unused token")


def test_adamw_training_lowers_the_loss_on_text(rng):
    config = GPTConfig(vocab=256, context=16, layers=2, heads=2, width=32)
    nn.manual_seed(0)
    model = GPT(config)
    corpus = python_source_corpus(max_bytes=40_000)
    trainer = ge2.train.Trainer(model.loss_graph(8), loss="loss", device="cpu",
                                optimizer=ge2.train.AdamW(lr=1e-2, weight_decay=0.01))
    data_rng = np.random.default_rng(0)
    losses = []
    for _ in range(30):
        ids, targets = random_windows(corpus.train, 8, config.context, data_rng)
        losses.append(float(trainer.step({"ids": ids, "targets": targets})))
    assert np.isfinite(losses).all()
    assert abs(losses[0] - np.log(256)) < 0.3, losses[0]  # GPT-2 init: close to uniform over the bytes
    assert np.mean(losses[-5:]) < losses[0] - 1.0, losses
    assert set(trainer.parameters()) == {name for name, _ in model.named_parameters()}


def test_context_longer_than_the_model_raises(rng):
    model = GPT(TINY)
    g = ge2.ir.Graph("too_long")
    with pytest.raises(ValueError, match="ids: context 8 exceeds"):
        model(g, g.input("ids", (1, TINY.context + 1), "int64"))


# ---------------------------------------------------------------------------------------------------------------
# Reshape as an alias (OpDef.aliases): no copy in the plan, same bytes, same numbers
# ---------------------------------------------------------------------------------------------------------------
def _block_graph(rng, batch=2, config=TINY):
    from graph_executor_v2.models.gpt import Block

    nn.manual_seed(int(rng.integers(0, 2**31)))
    block = Block(config)
    return block.graph(((batch, config.context, config.width), "float32"), name="gpt_block")


def test_reshape_declares_its_output_a_view_of_its_input():
    assert ge2.ops.OPS["reshape"].aliases == ((0, 0),)
    assert ge2.ops.OPS["transpose"].aliases == () and ge2.ops.OPS["slice"].aliases == ()


def test_block_plan_aliases_every_reshape_and_keeps_the_numbers(rng):
    graph = _block_graph(rng)
    x = rng.standard_normal((2, TINY.context, TINY.width)).astype(np.float32)
    aliased = ge2.ExecutorV2(graph)
    copied = ge2.ExecutorV2(graph, reuse_memory=False)  # the debugging switch: every value its own bytes
    plan, = aliased.plans
    reshapes = [(node, selection) for node, selection in zip(plan.graph.nodes, plan.selections)
                if node.op == "reshape"]
    assert len(reshapes) >= 6, plan.graph.op_counts()  # rows in and out of 3 Linears, the heads split and merged
    for node, selection in reshapes:
        assert selection.kernel == "alias", (node.name, selection.kernel)
        view, source = node.outputs[0], node.inputs[0]
        assert view.name not in plan.memory.offsets  # no buffer of its own
        assert plan.slots[view.name].ctypes.data == plan.slots[source.name].ctypes.data, node.name
        assert plan.slots[view.name].shape == view.type.shape
    assert f"{len(reshapes)} view(s) aliased, no copy" in aliased.explain()
    assert all(s.kernel != "alias" for s in copied.plans[0].selections)
    assert plan.memory.arena_bytes < copied.plans[0].memory.arena_bytes
    np.testing.assert_array_equal(aliased.run({"x": x})["y"], copied.run({"x": x})["y"])


def test_training_step_with_aliased_views_matches_the_unaliased_one(rng):
    model = _model(rng)
    ids, targets = _batch(rng, 2)
    losses = {}
    for reuse in (True, False):
        trainer = ge2.train.Trainer(model.loss_graph(2), loss="loss", device="cpu",
                                    optimizer=ge2.train.AdamW(lr=1e-2), reuse_memory=reuse)
        losses[reuse] = [float(trainer.step({"ids": ids, "targets": targets})) for _ in range(3)]
        plan = trainer._executor.plans[0]
        views = sum(selection.kernel == "alias" for selection in plan.selections)
        assert (views > 0) == reuse
    assert losses[True] == losses[False]


def test_views_of_parameters_and_outputs_viewing_inputs_keep_their_copy(rng):
    g = ge2.ir.Graph("views")
    x = g.input("x", (4, 6), "float32")
    w = g.param("w", rng.standard_normal((2, 12)).astype(np.float32))
    inner = g.reshape(g.relu(x), shape=(24,))  # a view of an intermediate: aliased
    g.output(g.reshape(x, shape=(6, 4)), "x_view")  # an output viewing an input: copied
    g.output(g.add(g.reshape(w, shape=(24,)), inner), "y")  # a view of a parameter: copied
    executor = ge2.ExecutorV2(g, passes=[])
    kernels = {s.node: s.kernel for s in executor.plans[0].selections}
    assert [kernels[n.name] for n in executor.plans[0].graph.nodes if n.op == "reshape"] == [
        "alias", "numpy_reference", "numpy_reference"]
    x_value = rng.standard_normal((4, 6)).astype(np.float32)
    result = executor.run({"x": x_value})
    np.testing.assert_array_equal(result["x_view"], x_value.reshape(6, 4))
    expected = w.data.reshape(24).astype(np.float64) + np.maximum(x_value, 0).reshape(24)
    assert_close(result["y"], expected, "float32", what="y")


@pytest.mark.gpu
def test_block_plan_aliases_reshapes_on_the_gpu(rng):
    graph = _block_graph(rng)
    x = rng.standard_normal((2, TINY.context, TINY.width)).astype(np.float32)
    executor = ge2.ExecutorV2(graph, device="cuda")
    plan, = executor.plans
    for node, selection in zip(plan.graph.nodes, plan.selections):
        if node.op == "reshape":
            assert selection.kernel == "alias", node.name
            assert plan.slots[node.outputs[0].name].ptr == plan.slots[node.inputs[0].name].ptr, node.name
    expected = ge2.ExecutorV2(graph).run({"x": x})["y"]
    for _ in range(2):  # node by node, then the captured graph
        assert_close(executor.run({"x": x})["y"], expected.astype(np.float64), "tf32", 4 * TINY.width, "block")


@pytest.mark.gpu
def test_gpt_training_step_on_the_gpu_matches_the_cpu_backend(rng):
    model = _model(rng)
    ids, targets = _batch(rng, 2)
    losses = {}
    for device in ("cpu", "cuda"):
        trainer = ge2.train.Trainer(model.loss_graph(2), loss="loss", device=device,
                                    optimizer=ge2.train.AdamW(lr=1e-3))
        losses[device] = [float(trainer.step({"ids": ids, "targets": targets})) for _ in range(5)]
    assert_close(losses["cuda"], np.array(losses["cpu"], np.float64), "tf32", 4 * TINY.width, "GPT losses")


# ---------------------------------------------------------------------------------------------------------------
# python -m graph_executor_v2 train-gpt
# ---------------------------------------------------------------------------------------------------------------
def test_train_gpt_cli_lowers_the_validation_loss_on_the_cpu(capsys):
    from graph_executor_v2.__main__ import main

    code = main(["train-gpt", "--cpu", "--steps", "16", "--layers", "1", "--heads", "2", "--width", "16",
                 "--context", "16", "--batch-size", "8", "--lr", "1e-2", "--warmup-steps", "2", "--eval-every", "8",
                 "--eval-batches", "2", "--plot", "", "--no-progress"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "GPT: 1 layers, 2 heads, 16 wide, context 16" in text and "amp off, on cpu" in text
    line = next(line for line in text.splitlines() if line.startswith("validation loss (nats per byte): "))
    curve = [(int(step), float(loss)) for loss, step in
             (entry.split(" @ ") for entry in line.split(": ", 1)[1].split(", "))]
    assert [step for step, _ in curve] == [0, 8, 16]
    losses = [loss for _, loss in curve]
    assert abs(losses[0] - np.log(256)) < 0.2, losses  # untrained: about uniform over the bytes
    assert losses[2] < losses[1] < losses[0] - 1.0, losses
    assert "unigram entropy 3." in text


def test_train_gpt_cli_rejects_a_bad_config(capsys):
    from graph_executor_v2.__main__ import main

    assert main(["train-gpt", "--cpu", "--heads", "5", "--width", "16", "--plot", "", "--no-progress"]) == 2
    assert "heads: 5 must divide width 16" in capsys.readouterr().out
    assert main(["train-gpt", "--cpu", "--steps", "10", "--warmup-steps", "10", "--no-progress"]) == 2
    assert "warmup_steps: expected an int in [0, steps=10)" in capsys.readouterr().out
    assert main(["train-gpt", "--cpu", "--steps", "0", "--no-progress"]) == 2
    assert "steps: expected an int >= 1, got 0" in capsys.readouterr().out


def test_train_gpt_config_defaults_and_flags():
    import argparse

    from graph_executor_v2.apps.gpt import CPU_DEFAULTS, GPU_DEFAULTS, run_config

    assert (GPU_DEFAULTS.layers, GPU_DEFAULTS.heads, GPU_DEFAULTS.width, GPU_DEFAULTS.context) == (4, 4, 256, 128)
    assert GPU_DEFAULTS.amp == "bfloat16" and CPU_DEFAULTS.amp is None
    flags = argparse.Namespace(steps=30, layers=3, amp="none", lr=None)
    run = run_config(flags, "cuda")
    assert (run.steps, run.layers, run.amp, run.warmup_steps, run.width) == (30, 3, None, 3, 256)


def test_views_on_parallel_branches_keep_their_roots_alive(rng):
    """Views read on other streams than their root's writer: the root's bytes live until the last view is read."""
    g = ge2.ir.Graph("branches")
    x = g.input("x", (6, 8), "float32")
    results = []
    for index in range(3):
        h = g.reshape(g.exp(g.mul(x, g.param(f"s{index}", np.full((8,), 0.1 * (index + 1), np.float32)))),
                      shape=(48,))
        results.append(g.reshape(g.tanh(g.reshape(h, shape=(8, 6))), shape=(48,)))
    g.output(g.add(g.add(results[0], results[1]), results[2]), "y")
    executor = ge2.ExecutorV2(g, passes=[], streams=3)
    plan, = executor.plans
    assert plan.schedule.stream_count == 3
    assert sum(s.kernel == "alias" for s in plan.selections) == 9
    x_value = rng.standard_normal((6, 8)).astype(np.float32)
    x64 = x_value.astype(np.float64)
    expected = sum(np.tanh(np.exp(x64 * 0.1 * (i + 1)).reshape(8, 6)).reshape(48) for i in range(3))
    assert_close(executor.run({"x": x_value})["y"], expected, "float32", 3, what="y")


# ---------------------------------------------------------------------------------------------------------------
# join_slice_gradients: the QKV split's gradient is one concat
# ---------------------------------------------------------------------------------------------------------------
def test_qkv_gradient_is_one_concat_per_layer(rng):
    forward, _ = PassManager(resolve(TRAINING_FORWARD)).run(_model(rng).loss_graph(2))
    differentiated, records = PassManager(resolve(TRAINING_BACKWARD)).run(autograd.backward_graph(forward, "loss"))
    counts = differentiated.op_counts()
    assert "slice_backward" not in counts and counts["concat"] == TINY.layers, counts
    joined = [note for record in records if record.name == "join_slice_gradients" for note in record.notes]
    assert len(joined) == TINY.layers and all("concat on axis 2" in note for note in joined), joined


def _sliced_sum(rng, spans, steps=None):
    """loss = sum(w * sum of the slices of x along axis 1), so x's gradient sums one slice_backward per span."""
    g = ge2.ir.Graph("slices")
    x = g.input("x", (3, 10), "float32")
    total = None
    for start, end in spans:
        part = g.slice(x, starts=(start,), ends=(end,), axes=(1,), steps=steps)
        weighted = g.sum(g.mul(part, g.param(f"w{start}_{end}", rng.standard_normal((3, end - start))
                                             .astype(np.float32))))
        total = weighted if total is None else g.add(total, weighted)
    g.output(total, "loss")
    return g


@pytest.mark.parametrize("spans, joined", [
    (((0, 4), (4, 10)), True),
    (((4, 10), (0, 1), (1, 4)), True),  # any order
    (((0, 4), (5, 10)), False),  # a gap
    (((0, 6), (4, 10)), False),  # an overlap
])
def test_join_slice_gradients_only_when_the_slices_tile_the_axis(rng, spans, joined):
    graph = _sliced_sum(rng, spans)
    differentiated, _ = PassManager(resolve(TRAINING_BACKWARD)).run(autograd.backward_graph(graph, "loss", ["x"]))
    counts = differentiated.op_counts()
    assert ("concat" in counts) == joined and ("slice_backward" in counts) != joined, counts
    x = rng.standard_normal((3, 10)).astype(np.float32)
    grad = ge2.ExecutorV2(differentiated, passes=[]).run({"x": x})["grad/x"]
    expected = np.zeros((3, 10))
    for start, end in spans:
        expected[:, start:end] += graph.params[f"w{start}_{end}"].data
    assert_close(grad, expected, "float32", what="d loss / d x")


@pytest.mark.gpu
def test_train_gpt_on_the_gpu_captures_the_step_and_learns():
    from dataclasses import replace

    from graph_executor_v2.apps.gpt import GPU_DEFAULTS, train_gpt

    run = replace(GPU_DEFAULTS, layers=2, width=128, context=64, batch_size=32, steps=150, warmup_steps=15,
                  eval_every=75, eval_batches=2)
    result = train_gpt(run, "cuda", plot=None, progress=False)
    trainer = result["trainer"]
    assert not trainer._executor.fallbacks, [s.node for s in trainer._executor.fallbacks]
    assert trainer._executor.plans[0].capture.startswith("captured"), trainer._executor.plans[0].capture
    losses = result["history"]["val_loss"]
    assert losses[0] > 5.0 and losses[2] < losses[1] < 3.5, losses
