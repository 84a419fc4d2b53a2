"""The float32 precision policy (passes.precision): which float32 convolutions and GEMMs get TF32 under "default"
(PyTorch's defaults), "highest" and "high", for ExecutorV2 and Trainer, and what explain() says; on the GPU, the
numbers each policy gives against the float64 reference at its own tolerance."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ir.graph import Graph
from graph_executor_v2.passes.precision import FLOAT32_PRECISIONS, POLICY, apply_precision
from graph_executor_v2.testing import assert_close, random_array

# precision -> (conv2d allow_tf32, gemm allow_tf32) for float32 nodes
EXPECTED = {"default": (True, False), "highest": (False, False), "high": (True, True)}


def _conv_then_linear(rng, dtype="float32"):
    g = Graph("conv_linear")
    x = g.input("x", (2, 8, 6, 6), dtype)
    h = g.relu(g.conv2d(x, g.param("w", random_array(rng, (4, 8, 3, 3), dtype, 0.3)),
                        g.param("b", random_array(rng, (4,), dtype)), padding=1))
    flat = g.reshape(g.global_avg_pool(h), shape=(2, 4))
    g.output(g.add(g.matmul(flat, g.param("fc", random_array(rng, (4, 5), dtype, 0.5))),
                   g.param("fc_b", random_array(rng, (5,), dtype))), "y")
    return g, {"x": random_array(rng, (2, 8, 6, 6), dtype)}


def _tf32_flags(graph):
    return {node.op: node.attrs["allow_tf32"] for node in graph.nodes if node.op in POLICY}


@pytest.mark.parametrize("precision", FLOAT32_PRECISIONS)
def test_executor_applies_the_policy_and_explain_states_it(rng, precision):
    g, feeds = _conv_then_linear(rng)
    executor = ge2.ExecutorV2(g, device="cpu", precision=precision)
    conv_tf32, gemm_tf32 = EXPECTED[precision]
    assert _tf32_flags(executor.optimized_graph) == {"conv2d": conv_tf32, "gemm": gemm_tf32}
    explained = executor.explain()
    assert (f"precision: {precision!r} (float32 conv2d {'TF32' if conv_tf32 else 'strict FP32'}, gemm "
            f"{'TF32' if gemm_tf32 else 'strict FP32'}") in explained
    assert "  precision: " in explained  # the pass record, with its changes
    # the CPU backend computes in float64 whatever the policy: the numbers do not move
    strict = ge2.ExecutorV2(g, device="cpu", precision="highest").run(feeds)["y"]
    np.testing.assert_array_equal(executor.run(feeds)["y"], strict)


def test_default_is_pytorchs_default():
    import inspect

    assert inspect.signature(ge2.ExecutorV2).parameters["precision"].default == "default"
    assert inspect.signature(ge2.train.Trainer).parameters["precision"].default == "default"
    assert EXPECTED["default"] == (True, False)  # torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul...


def test_16_bit_nodes_are_left_alone(rng):
    g, _ = _conv_then_linear(rng, "float16")
    optimized = ge2.ExecutorV2(g, device="cpu", precision="high").optimized_graph
    assert not any(_tf32_flags(optimized).values())
    assert apply_precision(optimized, "high") == []


@pytest.mark.parametrize("precision", FLOAT32_PRECISIONS)
def test_narrow_convolutions_stay_strict(rng, precision):
    """A float32 convolution with fewer than 8 input channels per group (an RGB stem, ViT's patch embedding; a
    grouped one of 4 per group) is strict FP32 under every policy, as PyTorch's cuDNN runs them; 8 and more follow
    the policy, in either layout."""
    g = Graph("stems")
    for name, layout, w_shape, groups, wide in (("rgb", "NCHW", (16, 3, 16, 16), 1, False),
                                                ("grouped", "NCHW", (16, 4, 3, 3), 4, False),
                                                ("wide", "NHWC", (16, 3, 3, 8), 1, True)):
        channels = w_shape[1 if layout == "NCHW" else 3] * groups
        shape = (2, channels, 16, 16) if layout == "NCHW" else (2, 16, 16, channels)
        x = g.input(name, shape, "float32")
        g.output(g.conv2d(x, g.param(f"w_{name}", random_array(rng, w_shape, "float32")), None, groups=groups,
                          layout=layout, allow_tf32=True), f"y_{name}")
    apply_precision(g, precision)
    conv_tf32, _ = EXPECTED[precision]
    flags = {node.inputs[0].name: node.attrs["allow_tf32"] for node in g.nodes}
    assert flags == {"rgb": False, "grouped": False, "wide": conv_tf32}
    assert ("fewer than 8 input channels per group strict FP32" in ge2.ExecutorV2(g, precision=precision).explain()) \
        is conv_tf32


def test_policy_overrides_a_nodes_own_flag(rng):
    g = Graph("explicit")
    x = g.input("x", (3, 4), "float32")
    g.output(g.gemm(x, g.param("w", random_array(rng, (4, 2), "float32")), None, None, allow_tf32=True), "y")
    notes = apply_precision(g, "highest")
    assert notes == [f"{g.nodes[0].name} (gemm): allow_tf32 False"] and not g.nodes[0].attrs["allow_tf32"]


@pytest.mark.parametrize("bad", ["medium", None, "HIGH", 1])
def test_bad_precision_raises_naming_it(rng, bad):
    g, _ = _conv_then_linear(rng)
    with pytest.raises(ValueError, match="precision: expected one of 'default', 'highest', 'high', 'fp8', got"):
        ge2.ExecutorV2(g, device="cpu", precision=bad)
    with pytest.raises(ValueError, match="precision: expected one of 'default', 'highest', 'high', got"):
        ge2.train.Trainer(_training_graph(rng), optimizer=ge2.train.SGD(lr=0.1), precision=bad)


def test_fp8_keeps_the_default_policy_for_float32_convolutions(rng):
    """precision="fp8" rewrites GEMMs itself (after calibration); float32 convolutions run as under "default". A
    Trainer takes FP8 through amp="fp8", not precision."""
    g, _ = _conv_then_linear(rng)
    executor = ge2.ExecutorV2(g, device="cpu", precision="fp8")
    assert _tf32_flags(executor.optimized_graph) == {"conv2d": True, "gemm": False}
    assert "precision: fp8" in executor.explain()
    with pytest.raises(ValueError, match="precision: expected one of 'default', 'highest', 'high', got 'fp8'"):
        ge2.train.Trainer(_training_graph(rng), optimizer=ge2.train.SGD(lr=0.1), precision="fp8")


def _training_graph(rng):
    g = Graph("train")
    x = g.input("x", (2, 8, 5, 5), "float32")
    labels = g.input("labels", (2,), "int64")
    h = g.conv2d(x, g.param("w", random_array(rng, (4, 8, 3, 3), "float32", 0.3)), None, padding=1)
    logits = g.matmul(g.reshape(g.global_avg_pool(h), shape=(2, 4)), g.param("fc", random_array(rng, (4, 3),
                                                                                                "float32")))
    g.output(g.cross_entropy(logits, labels), "loss")
    return g


@pytest.mark.parametrize("precision", FLOAT32_PRECISIONS)
def test_trainer_applies_the_policy_to_forward_and_backward(rng, precision):
    trainer = ge2.train.Trainer(_training_graph(rng), optimizer=ge2.train.SGD(lr=0.1), precision=precision)
    graph = trainer._executor.optimized_graph
    conv_tf32, gemm_tf32 = EXPECTED[precision]
    for node in graph.nodes:
        if node.op in ("conv2d", "conv2d_backward"):
            assert node.attrs["allow_tf32"] is conv_tf32, node
        if node.op in ("gemm", "gemm_backward"):
            assert node.attrs["allow_tf32"] is gemm_tf32, node
    assert {"conv2d_backward", "gemm"} <= {n.op for n in graph.nodes}
    assert f"precision: {precision!r}" in trainer.explain()


@pytest.mark.gpu
@pytest.mark.parametrize("precision", FLOAT32_PRECISIONS)
def test_gpu_numbers_follow_the_policy(rng, precision):
    """A float32 conv of reduction 288: strict FP32 meets float32's tolerance, TF32 TF32's."""
    g = Graph("tf32")
    x = g.input("x", (4, 32, 14, 14), "float32")
    g.output(g.conv2d(x, g.param("w", random_array(rng, (64, 32, 3, 3), "float32")), None, padding=1), "y")
    feeds = {"x": random_array(rng, (4, 32, 14, 14), "float32")}
    expected = ge2.ExecutorV2(g, device="cpu").run(feeds)["y"].astype(np.float64)
    executor = ge2.ExecutorV2(g, device="cuda", precision=precision)
    got = executor.run(feeds)["y"]
    conv_tf32, _ = EXPECTED[precision]
    print(f"{precision}: max error {np.abs(got - expected).max():.3g}")  # TF32 allows, not forces: cuDNN picks
    assert_close(got, expected, "tf32" if conv_tf32 else "float32", reduction_length=288, what=executor.explain())
