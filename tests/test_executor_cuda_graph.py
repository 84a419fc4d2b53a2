"""ExecutorV2 plans as CUDA graphs on the GPU: captured and uncaptured plans bit-identical, one graph per input
signature, feeds that change between replays, zero-copy slots, plans that cannot be captured (a host-fallback
node, a kernel that synchronizes), workspaces that grow elsewhere, flat device memory over 10k replays, several
streams, ordering against the caller's stream, NVTX and the profile."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ir import Graph
from graph_executor_v2.ops._base import OPS, Candidate
from graph_executor_v2.testing import assert_close, branches, mlp, random_array

pytestmark = pytest.mark.gpu

SIZES = (128, 256, 11)


def layer_graph(rng, dtype):
    """layernorm -> GEMM+GELU -> softmax: row ops and a GEMM in one plan."""
    g = Graph(f"layer_{dtype}")
    x = g.input("x", ("batch", 64), dtype)
    gamma, beta = (g.param(name, random_array(rng, (64,), dtype)) for name in ("gamma", "beta"))
    h = g.layernorm(x, gamma, beta)
    h = g.gelu(g.add(g.matmul(h, g.param("w", random_array(rng, (64, 96), dtype, scale=0.125))),
                     g.param("b", random_array(rng, (96,), dtype, scale=0.1))))
    g.output(g.softmax(h), "y")
    return g


def graphs_under_test(rng):
    """(name, graph, executor options, input width) of every graph the bit-identity test covers."""
    return [
        ("mlp f32 relu", mlp(rng, (128, 256, 256, 11), "float32", "relu", residual=True)[0], {}, 128),
        ("mlp f16 gelu", mlp(rng, (64, 96, 32), "float16", "gelu")[0], {}, 64),
        ("mlp bf16 silu", mlp(rng, (32, 64, 16), "bfloat16", "silu")[0], {}, 32),
        ("8 branches f32, 4 streams", branches(rng, 8, 64, "float32", batch="batch")[0], {"streams": 4}, 64),
        ("layernorm gemm softmax f32", layer_graph(rng, "float32"), {}, 64),
        ("layernorm gemm softmax f16", layer_graph(rng, "float16"), {"streams": 2}, 64),
    ]


def test_captured_and_uncaptured_plans_are_bit_identical(rng):
    for name, g, options, width in graphs_under_test(rng):
        captured = ge2.ExecutorV2(g, device="cuda", **options)
        uncaptured = ge2.ExecutorV2(g, device="cuda", cuda_graph=False, **options)
        dtype = g.inputs[0].type.dtype
        for batch in (64, 1, 37, 64):
            x = random_array(rng, (batch, width), dtype)
            expected = uncaptured.run({"x": x})["y"]
            actual = captured.run({"x": x})["y"]
            assert np.isfinite(expected.astype(np.float64)).all(), name
            np.testing.assert_array_equal(actual.view(np.uint8), expected.view(np.uint8), err_msg=name)
        for plan in captured.plans:
            assert plan.cuda_graph is not None and plan.capture.startswith("captured"), (name, plan.capture)
            kernels = plan.cuda_graph.node_types["kernel"]  # the node count and its kinds, kernels among them
            assert f"{plan.cuda_graph.node_count} graph nodes (" in plan.capture, (name, plan.capture)
            assert f"{kernels} kernel" in plan.capture, (name, plan.capture)
        assert all(plan.cuda_graph is None and plan.capture == "off (cuda_graph=False)" for plan in uncaptured.plans)
        assert "cuda graph: captured" in captured.explain()


def test_many_signatures_each_get_their_own_graph(rng):
    g, reference = mlp(rng, SIZES, "float32", "relu")
    ex = ge2.ExecutorV2(g, device="cuda")
    batches = (1, 7, 64, 257, 7, 1, 1000)
    for batch in batches:
        x = random_array(rng, (batch, SIZES[0]), "float32")
        assert_close(ex.run({"x": x})["y"], reference(x), "float32", max(SIZES), what=f"batch {batch}")
    assert len(ex.plans) == len(set(batches))
    graphs = [plan.cuda_graph for plan in ex.plans]
    assert all(graph is not None for graph in graphs) and len({id(graph) for graph in graphs}) == len(graphs)


def test_feeds_that_change_between_replays_are_seen(rng):
    runtime = ge2.device.runtime()
    g, reference = mlp(rng, SIZES, "float32", "gelu", batch=64)
    ex = ge2.ExecutorV2(g, device="cuda")
    out = runtime.DeviceArray.empty([64, SIZES[-1]], "float32")
    for step in range(6):  # NumPy feeds, then device feeds copied into the slots, then device out=
        x = random_array(rng, (64, SIZES[0]), "float32")
        if step < 2:
            y = ex.run({"x": x})["y"]
        else:
            out.poison()
            y = ex.run({"x": runtime.DeviceArray.from_numpy(x)}, out={"y": out})["y"].numpy()
        assert_close(y, reference(x), "float32", max(SIZES), what=f"run {step}")
    assert ex.plans[0].cuda_graph is not None


def test_zero_copy_replay_through_the_plan_slots(rng):
    g, reference = mlp(rng, SIZES, "float16", "relu")
    ex = ge2.ExecutorV2(g, device="cuda")
    plan = ex.plan({"x": (48, SIZES[0])})
    x_slot, y_slot = plan.inputs["x"], plan.outputs["y"]
    assert (x_slot.shape, x_slot.dtype, y_slot.shape) == ((48, SIZES[0]), "float16", (48, SIZES[-1]))
    for step in range(4):  # the first replay warms up and captures; the others replay the graph
        x = random_array(rng, (48, SIZES[0]), "float16")
        x_slot.copy_from_numpy(x)
        y_slot.poison()
        plan.replay()
        assert_close(y_slot.numpy(), reference(x), "float16", max(SIZES), what=f"replay {step}")
    assert plan.cuda_graph is not None


def test_runs_are_ordered_against_the_callers_stream(rng):
    torch = pytest.importorskip("torch")
    g, reference = mlp(rng, SIZES, "float32", "relu", batch=256)
    ex = ge2.ExecutorV2(g, device="cuda")
    side = torch.cuda.Stream()
    x_host = random_array(rng, (256, SIZES[0]), "float32")
    x = torch.from_numpy(x_host).cuda()
    ex.run({"x": x})
    with torch.cuda.stream(side):
        for _ in range(3):  # the caller's work right before and after each run is on a busy foreign stream
            torch.cuda._sleep(1_000_000)
            x_side = x * 2
            y = torch.empty((256, SIZES[-1]), device="cuda")
            ex.run({"x": x_side}, stream=side, out={"y": y})
            y_doubled = y * 1
    side.synchronize()
    assert_close(y_doubled.cpu().numpy(), reference(x_host * 2), "float32", max(SIZES))


def test_a_host_fallback_plan_runs_uncaptured_and_says_why(rng, monkeypatch):
    monkeypatch.setitem(OPS, "silu", replace(OPS["silu"], candidates=()))
    g, reference = mlp(rng, SIZES, "float32", "silu", batch=16)
    ex = ge2.ExecutorV2(g, device="cuda", passes=[])
    for _ in range(3):
        x = random_array(rng, (16, SIZES[0]), "float32")
        assert_close(ex.run({"x": x})["y"], reference(x), "float32", max(SIZES))
    plan = ex.plans[0]
    assert plan.cuda_graph is None
    assert "cuda graph: not captured: node 'silu_0' (silu) runs host_reference" in ex.explain()


def test_a_kernel_that_synchronizes_runs_uncaptured_and_is_named(rng, monkeypatch):
    runtime = ge2.device.runtime()
    first = OPS["gemm"].candidates[0]

    def prepare(problem):
        launch = first.prepare(problem)

        def synchronizing(ins, outs, stream):
            launch(ins, outs, stream)
            runtime.Stream.wrap(stream).synchronize()  # not allowed while the stream is being captured

        return synchronizing

    syncing = Candidate("synchronizing", 1000, "waits for its stream", first.supports, prepare)
    monkeypatch.setitem(OPS, "gemm", replace(OPS["gemm"], candidates=(syncing,) + OPS["gemm"].candidates))
    g, reference = mlp(rng, SIZES, "float32", "relu", batch=32)
    ex = ge2.ExecutorV2(g, device="cuda", autotune=False)  # priority 1000: the synchronizing kernel runs every gemm
    for _ in range(3):
        x = random_array(rng, (32, SIZES[0]), "float32")
        assert_close(ex.run({"x": x})["y"], reference(x), "float32", max(SIZES))
    plan = ex.plans[0]
    assert plan.cuda_graph is None
    first_node = plan.graph.nodes[0].name
    assert f"cuda graph: not captured: node '{first_node}' (gemm)" in ex.explain(), ex.explain()
    assert "synchronizing" in plan.capture


def test_a_captured_plan_survives_workspaces_growing_elsewhere(rng):
    """The embedding gather records bad ids in its module's per-stream workspace. The workspace of the plan's own
    stream and of other streams then grows (backward calls with many ids, other plans of other shapes); a freed
    buffer would be written by every replay that meets a bad id."""
    from graph_executor_v2.ops import embedding

    runtime = ge2.device.runtime()
    vocab, dim = 50, 64
    table = random_array(rng, (vocab, dim), "float32")
    g = Graph("lookup")
    g.output(g.embedding(g.param("table", table), g.input("ids", ("count",), "int32")), "y")
    ex = ge2.ExecutorV2(g, device="cuda")
    ids = rng.integers(0, vocab, 40).astype(np.int32)
    assert_close(ex.run({"ids": ids})["y"], table[ids], "float32")
    assert ex.plans[0].cuda_graph is not None
    other_stream = runtime.Stream()
    table_on_device = runtime.DeviceArray.from_numpy(table)
    for count in (10_000, 300_000, 2_000_000):
        big_ids = runtime.DeviceArray.from_numpy(rng.integers(0, vocab, count).astype(np.int32))
        dy = runtime.DeviceArray.from_numpy(np.ones((count, dim), np.float32))
        for stream in (ex.streams[0], other_stream):
            embedding.backward(dy, table_on_device, big_ids, stream=stream)
        ex.run({"ids": rng.integers(0, vocab, count // 100).astype(np.int32)})  # other plans, other shapes
    runtime.synchronize()
    for _ in range(3):
        ids = rng.integers(0, vocab, 40).astype(np.int32)
        ids[7] = vocab + 3  # a bad id: the kernel writes the workspace of the captured plan
        y = ex.run({"ids": ids})["y"]
        assert np.isnan(y[7]).all()
        good = np.arange(40) != 7
        assert_close(y[good], table[ids[good]], "float32")
    runtime.synchronize()


@pytest.mark.exclusive_gpu
def test_device_memory_stays_flat_over_10k_replays(rng):
    runtime = ge2.device.runtime()
    g, reference = mlp(rng, SIZES, "float32", "relu", batch=64)
    ex = ge2.ExecutorV2(g, device="cuda")
    plan = ex.plan()
    x = random_array(rng, (64, SIZES[0]), "float32")
    plan.inputs["x"].copy_from_numpy(x)
    feeds = {"x": runtime.DeviceArray.from_numpy(x)}
    out = {"y": runtime.DeviceArray.empty([64, SIZES[-1]], "float32")}
    for _ in range(3):
        plan.replay()
        ex.run(feeds, out=out)
    runtime.synchronize()
    free_before, _ = runtime.memory_info()
    for _ in range(10_000):
        plan.replay()
    for _ in range(1_000):
        ex.run(feeds, out=out)
    runtime.synchronize()
    assert runtime.memory_info()[0] == free_before
    assert_close(plan.outputs["y"].numpy(), reference(x), "float32", max(SIZES))
    assert_close(out["y"].numpy(), reference(x), "float32", max(SIZES))


def test_eight_branches_give_the_same_numbers_on_one_and_on_four_streams(rng):
    g, reference = branches(rng, 8, 128, "float32", batch=64)
    one = ge2.ExecutorV2(g, device="cuda", streams=1)
    four = ge2.ExecutorV2(g, device="cuda", streams=4)
    uncaptured = ge2.ExecutorV2(g, device="cuda", streams=4, cuda_graph=False)
    assert four.plans[0].schedule.stream_count == 4
    for _ in range(3):
        x = random_array(rng, (64, 128), "float32")
        y = one.run({"x": x})["y"]
        np.testing.assert_array_equal(four.run({"x": x})["y"], y)
        np.testing.assert_array_equal(uncaptured.run({"x": x})["y"], y)
        assert_close(y, reference(x), "float32", 128 * 8)
    assert "on 4 stream(s)" in four.plans[0].capture


def test_profile_on_the_gpu(rng, tmp_path):
    g, _ = mlp(rng, SIZES, "float16", "relu", batch=64)
    ex = ge2.ExecutorV2(g, device="cuda")
    profile = ex.profile({"x": random_array(rng, (64, SIZES[0]), "float16")}, runs=10)
    assert [row.node for row in profile.nodes] == [n.name for n in ex.plans[0].graph.nodes]
    assert all(row.median_ms > 0 and row.unit == "TFLOP/s" for row in profile.nodes)
    assert profile.cuda_graph_ms is not None and profile.cuda_graph_ms > 0 and profile.node_by_node_ms > 0
    assert all(0 < row.roofline_fraction < 1 for row in profile.nodes)  # any GPU: its roofline is computed
    path = tmp_path / "trace.json"
    profile.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert len(events) == len(profile.nodes) and all(e["ph"] == "X" for e in events)


NVTX_SCRIPT = """
import numpy as np, graph_executor_v2 as ge2
from graph_executor_v2.testing import mlp, random_array
g, reference = mlp(np.random.default_rng(0), (32, 64, 8), "float32", "relu", batch=4)
ex = ge2.ExecutorV2(g, device="cuda")
x = random_array(np.random.default_rng(1), (4, 32), "float32")
for _ in range(3):
    y = ex.run({"x": x})["y"]
print(ex._nvtx, float(np.abs(y - reference(x)).max()))
"""


@pytest.mark.parametrize("setting", ["1", "0"])
def test_nvtx_ranges_switch_on_with_the_environment(setting):
    environment = {**os.environ, "GE2_NVTX": setting,
                   "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "python")}
    result = subprocess.run([sys.executable, "-c", NVTX_SCRIPT], env=environment, capture_output=True, text=True,
                            check=True).stdout.split()
    assert result[0] == str(setting == "1") and float(result[1]) < 1e-4


def test_zero_dimensional_inputs_and_params_keep_their_shape(rng):
    """A 0-d feed (ONNX's scalar inputs) goes into its slot of shape (), not as a 1-element vector."""
    g = Graph("scalars")
    x, s = g.input("x", (3, 4), "float32"), g.input("s", (), "float32")
    g.output(g.mul(g.mul(x, s), g.param("t", np.array(0.5, np.float32))), "y")
    feeds = {"x": random_array(rng, (3, 4), "float32"), "s": np.array(3.0, np.float32)}
    expected = ge2.ExecutorV2(g, device="cpu").run(feeds)["y"]
    assert_close(ge2.ExecutorV2(g, device="cuda").run(feeds)["y"], expected, "float32")
    assert_close(expected, feeds["x"].astype(np.float64) * 1.5, "float32")
