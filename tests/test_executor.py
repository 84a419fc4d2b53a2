"""ExecutorV2 on the CPU backend: the issue's contract, MLPs against float64 NumPy, input checks, symbolic dims,
plan caching, the memory planner and explain()."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ir import Graph
from graph_executor_v2.ops import activations
from graph_executor_v2.runtime.planner import ALIGNMENT, Buffer, may_share, plan_memory
from graph_executor_v2.testing import assert_close, branches, mlp, random_array


def test_the_issue_contract_verbatim():
    g = ge2.ir.Graph("mlp")
    x = g.input("x", (64, 128), "float32")
    w1 = g.param("w1", np.random.randn(128, 256).astype(np.float32))
    b1 = g.param("b1", np.zeros(256, np.float32))
    h = g.relu(g.add(g.matmul(x, w1), b1))          # also g.gelu (tanh form), g.silu
    w2 = g.param("w2", np.random.randn(256, 11).astype(np.float32))
    y = g.add(g.matmul(h, w2), g.param("b2", np.zeros(11, np.float32)))
    g.output(y, "logits")
    ex = ge2.ExecutorV2(g, device="cpu")            # or "cuda"
    x_value = np.random.randn(64, 128).astype(np.float32)
    out = ex.run({"x": x_value})   # {"logits": ndarray (64, 11)}
    print(ex.explain())
    assert [n.op for n in ex.optimized_graph.nodes] == ["gemm", "gemm"]

    assert list(out) == ["logits"] and out["logits"].shape == (64, 11) and out["logits"].dtype == np.float32
    expected = np.maximum(x_value.astype(np.float64) @ w1.data, 0) @ w2.data
    assert_close(out["logits"], expected, "float32", 256)


# --- MLPs against float64 NumPy -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_mlp_matches_float64_numpy(rng, dtype, activation):
    sizes = (48, 96, 64, 64, 10)
    g, reference = mlp(rng, sizes, dtype, activation, residual=True)
    ex = ge2.ExecutorV2(g, device="cpu", verify=True)
    assert [n.op for n in ex.optimized_graph.nodes] == ["gemm"] * 4
    assert [n.attrs["act"] for n in ex.optimized_graph.nodes] == [activation] * 3 + ["none"]
    assert ex.optimized_graph.nodes[2].inputs[3] is not None  # the residual rides in as C
    for batch in (1, 33):
        x = random_array(rng, (batch, sizes[0]), dtype)
        out = ex.run({"x": x})["y"]
        assert out.dtype == ge2.dtypes.to_numpy(dtype) and out.shape == (batch, sizes[-1])
        assert_close(out, reference(x), dtype, max(sizes), what=f"{activation} MLP, batch {batch}")


def test_bfloat16_mlp(rng):
    g, reference = mlp(rng, (32, 64, 16), "bfloat16", "gelu", batch=8)
    x = random_array(rng, (8, 32), "bfloat16")
    assert_close(ge2.ExecutorV2(g).run({"x": x})["y"], reference(x), "bfloat16", 64)


def test_transformer_mlp_block(rng):
    """x + W2 gelu(W1 layernorm(x) + b1) + b2: the residual rides into the second gemm as C."""
    tokens, width, hidden = 24, 32, 64
    g = Graph("block")
    x = g.input("x", ("tokens", width), "float32")
    gamma = g.param("gamma", random_array(rng, (width,), "float32"))
    beta = g.param("beta", random_array(rng, (width,), "float32"))
    w1 = g.param("w1", random_array(rng, (hidden, width), "float32", scale=width ** -0.5))  # stored (out, in)
    b1 = g.param("b1", random_array(rng, (hidden,), "float32"))
    w2 = g.param("w2", random_array(rng, (width, hidden), "float32", scale=hidden ** -0.5))
    b2 = g.param("b2", random_array(rng, (width,), "float32"))
    h = g.gelu(g.add(g.matmul(g.layernorm(x, gamma, beta), g.transpose(w1, perm=(1, 0))), b1))
    g.output(g.add(x, g.add(g.matmul(h, g.transpose(w2, perm=(1, 0))), b2)), "y")
    ex = ge2.ExecutorV2(g, verify=True)
    assert [n.op for n in ex.optimized_graph.nodes] == ["layernorm", "gemm", "gemm"]
    first, second = ex.optimized_graph.nodes[1:]
    assert (first.attrs["act"], first.attrs["trans_b"]) == ("gelu", True)
    assert second.inputs[3].name == "x" and second.attrs["beta"] == 1.0

    x_value = random_array(rng, (tokens, width), "float32")
    x64 = x_value.astype(np.float64)
    normed = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5) * gamma.data + beta.data
    hidden64 = activations.apply("gelu", normed @ w1.data.T.astype(np.float64) + b1.data)
    expected = x64 + hidden64 @ w2.data.T.astype(np.float64) + b2.data
    assert_close(ex.run({"x": x_value})["y"], expected, "float32", hidden)


def test_fused_and_unfused_plans_agree(rng):
    g, reference = mlp(rng, (64, 128, 128, 32), "float32", "silu", batch=16, residual=True)
    fused = ge2.ExecutorV2(g)
    unfused = ge2.ExecutorV2(g, passes=[])
    assert len(fused.optimized_graph.nodes) == 3 < len(unfused.optimized_graph.nodes) == 9
    x = random_array(rng, (16, 64), "float32")
    fused_out, unfused_out = fused.run({"x": x})["y"], unfused.run({"x": x})["y"]
    assert_close(fused_out, unfused_out, "float32", 128)
    assert_close(fused_out, reference(x), "float32", 128)


def test_a_wrong_kernel_would_be_caught(rng):
    """The oracle has teeth: a graph computing something else fails the same comparison."""
    g, reference = mlp(rng, (16, 32, 8), "float32", "gelu", batch=4)
    wrong, _ = mlp(rng, (16, 32, 8), "float32", "silu", batch=4)
    x = random_array(rng, (4, 16), "float32")
    ge2.testing.assert_close(ge2.ExecutorV2(g).run({"x": x})["y"], reference(x), "float32", 32)
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_close(ge2.ExecutorV2(wrong).run({"x": x})["y"], reference(x), "float32", 32)


# --- inputs -------------------------------------------------------------------------------------------------------
@pytest.fixture
def two_input_graph():
    g = Graph("two")
    x = g.input("x", ("batch", 8), "float32")
    r = g.input("r", ("batch", 4), "float32")
    g.output(g.add(g.matmul(x, g.param("w", np.eye(8, 4, dtype=np.float32))), r), "y")
    return g


def test_input_checks_name_the_input_the_expectation_and_what_came(two_input_graph):
    ex = ge2.ExecutorV2(two_input_graph)
    x, r = np.ones((3, 8), np.float32), np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"missing input\(s\) \['r'\]; graph 'two' takes \['x', 'r'\]"):
        ex.run({"x": x})
    with pytest.raises(ValueError, match=r"unknown input\(s\) \['z'\]"):
        ex.run({"x": x, "r": r, "z": r})
    with pytest.raises(ValueError, match=r"input 'x': expected shape \(batch, 8\), got \(3, 9\)"):
        ex.run({"x": np.ones((3, 9), np.float32), "r": r})
    with pytest.raises(ValueError, match=r"input 'r': expected shape \(batch=3, 4\), got \(5, 4\)"):
        ex.run({"x": x, "r": np.ones((5, 4), np.float32)})
    with pytest.raises(ValueError, match=r"input 'x': expected shape \(batch, 8\), got \(8,\)"):
        ex.run({"x": np.ones(8, np.float32), "r": r})
    with pytest.raises(TypeError, match="input 'r': expected dtype float32, got float64"):
        ex.run({"x": x, "r": np.ones((3, 4))})
    with pytest.raises(TypeError, match="input 'x'"):
        ex.run({"x": [[1.0] * 8] * 3, "r": r})


def test_concrete_input_shapes_are_checked(rng):
    g, _ = mlp(rng, (8, 4), "float32", "relu", batch=2)
    with pytest.raises(ValueError, match=r"input 'x': expected shape \(2, 8\), got \(3, 8\)"):
        ge2.ExecutorV2(g).run({"x": np.ones((3, 8), np.float32)})


def test_symbolic_dims_bind_at_run_time_with_one_plan_per_signature(rng, two_input_graph):
    ex = ge2.ExecutorV2(two_input_graph)
    assert ex.plans == [] and "none yet" in ex.explain()
    for batch in (3, 7, 3, 7, 1):
        x, r = random_array(rng, (batch, 8), "float32"), random_array(rng, (batch, 4), "float32")
        y = ex.run({"x": x, "r": r})["y"]
        assert_close(y, x[:, :4].astype(np.float64) + r, "float32")
    assert sorted(plan.graph.inputs[0].type.shape[0] for plan in ex.plans) == [1, 3, 7]


def test_steady_state_reuses_the_plan_and_its_arena(rng):
    g, reference = mlp(rng, (16, 32, 32, 4), "float32", "relu", batch=8)
    ex = ge2.ExecutorV2(g)
    (plan,) = ex.plans  # concrete inputs: planned at compile time
    arena = plan.arena
    for _ in range(3):
        x = random_array(rng, (8, 16), "float32")
        assert_close(ex.run({"x": x})["y"], reference(x), "float32", 32)
    assert ex.plans == [plan] and plan.arena is arena


def test_outputs_that_are_inputs_or_params_and_multiple_outputs(rng):
    g = Graph("g")
    x = g.input("x", (2, 3), "float32")
    p = g.param("p", np.arange(6, dtype=np.float32).reshape(2, 3))
    g.output(x, "same")
    g.output(p, "constant")
    g.output(g.mul(x, p), "product")
    x_value = random_array(rng, (2, 3), "float32")
    out = ge2.ExecutorV2(g).run({"x": x_value})
    np.testing.assert_array_equal(out["same"], x_value)
    np.testing.assert_array_equal(out["constant"], p.data)
    assert_close(out["product"], x_value.astype(np.float64) * p.data, "float32")
    out["constant"][0, 0] = 99  # results are the caller's copies
    assert ge2.ExecutorV2(g).run({"x": x_value})["constant"][0, 0] == 0


def test_results_written_into_given_arrays(rng):
    g, reference = mlp(rng, (8, 16, 4), "float32", "relu", batch=3)
    ex = ge2.ExecutorV2(g)
    x = random_array(rng, (3, 8), "float32")
    out = np.full((3, 4), np.nan, np.float32)
    result = ex.run({"x": x}, out={"y": out})
    assert result["y"] is out
    assert_close(out, reference(x), "float32", 16)
    with pytest.raises(ValueError, match=r"out\['y'\]: expected shape \(3, 4\), got \(4, 3\)"):
        ex.run({"x": x}, out={"y": np.zeros((4, 3), np.float32)})
    with pytest.raises(TypeError, match=r"out\['y'\]: expected dtype float32, got float16"):
        ex.run({"x": x}, out={"y": np.zeros((3, 4), np.float16)})
    with pytest.raises(ValueError, match=r"out: unknown output\(s\) \['z'\]"):
        ex.run({"x": x}, out={"z": out})


def test_executor_leaves_the_source_graph_alone(rng):
    g, _ = mlp(rng, (8, 8, 4), "float32", "relu")
    text = str(g)
    ge2.ExecutorV2(g)
    assert str(g) == text


def test_bad_graphs_fail_at_compile_naming_the_node(rng):
    g, _ = mlp(rng, (8, 8, 4), "float32", "relu")
    g.nodes.reverse()
    with pytest.raises(ValueError, match=r"node '\w+' \(\w+\): input '\w+' reads"):
        ge2.ExecutorV2(g)
    with pytest.raises(ValueError, match="device: expected 'cpu' or 'cuda', got 'tpu'"):
        ge2.ExecutorV2(mlp(rng, (8, 4), "float32", "relu")[0], device="tpu")


@pytest.mark.skipif(ge2.device_count() > 0, reason="checks the error on a machine with no GPU")
def test_cuda_without_a_gpu_is_a_clear_error(rng):
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        ge2.ExecutorV2(mlp(rng, (8, 4), "float32", "relu")[0], device="cuda")


# --- memory planning ----------------------------------------------------------------------------------------------
def test_planner_never_overlaps_live_buffers_and_aligns_offsets(rng):
    for _ in range(50):
        count = int(rng.integers(1, 30))
        buffers = []
        for index in range(count):
            first = int(rng.integers(-1, 20))
            last = first + int(rng.integers(0, 6))
            buffers.append(Buffer(f"b{index}", int(rng.integers(0, 5000)), first, (last,)))
        plan = plan_memory(buffers)
        for buffer in buffers:
            offset = plan.offsets[buffer.name]
            assert offset % ALIGNMENT == 0 and offset + buffer.nbytes <= plan.arena_bytes
        for a, b in itertools.combinations(buffers, 2):
            if a.writer <= b.readers[-1] and b.writer <= a.readers[-1]:
                a_range = range(plan.offsets[a.name], plan.offsets[a.name] + max(a.nbytes, 1))
                b_range = range(plan.offsets[b.name], plan.offsets[b.name] + max(b.nbytes, 1))
                assert not set(a_range) & set(b_range), (a, b)
        assert plan.arena_bytes <= plan.unshared_bytes


def test_planner_reuses_memory_along_a_chain_and_can_be_switched_off():
    chain = [Buffer(f"b{i}", 1 << 20, i, (i + 1,)) for i in range(10)]  # each read only by the next step
    plan = plan_memory(chain)
    assert plan.arena_bytes == 2 << 20  # two buffers in flight at any time
    assert plan.summary() == "memory reduced from 10 MB -> 2 MB (10 buffers, one arena)"
    unshared = plan_memory(chain, reuse=False)
    assert unshared.arena_bytes == unshared.unshared_bytes == 10 << 20


def test_memory_reuse_does_not_change_results(rng):
    g, reference = mlp(rng, (64,) + (128,) * 6 + (8,), "float32", "gelu", batch=32)
    reused = ge2.ExecutorV2(g, passes=[])
    separate = ge2.ExecutorV2(g, passes=[], reuse_memory=False)
    (reused_plan,), (separate_plan,) = reused.plans, separate.plans
    assert reused_plan.memory.arena_bytes < separate_plan.memory.arena_bytes / 4
    x = random_array(rng, (32, 64), "float32")
    np.testing.assert_array_equal(reused.run({"x": x})["y"], separate.run({"x": x})["y"])
    assert_close(reused.run({"x": x})["y"], reference(x), "float32", 128)


# --- explain ------------------------------------------------------------------------------------------------------
def test_explain_reports_passes_fusions_kernels_memory_and_fallbacks(rng):
    g, _ = mlp(rng, (16, 32, 4), "float32", "silu", batch=4)
    text = ge2.ExecutorV2(g).explain()
    assert text.startswith("ExecutorV2 'mlp_silu_float32' on cpu (NumPy references)")
    assert "  canonicalize: 6 change(s) ({add: 2, matmul: 2, silu: 1} -> {gemm: 2, silu: 1})" in text
    assert "    fuse_activation: gemm_2, silu_0 -> gemm_4" in text
    assert "fusions: 3" in text
    assert "ops: {add: 2, matmul: 2, silu: 1} -> {gemm: 2}" in text
    assert "plan for (x: float32[4, 16]): 2 kernels, memory reduced from" in text
    assert "  gemm_4  gemm       -> numpy_reference: the NumPy reference is the CPU backend" in text
    assert text.endswith("fallbacks: 0")


def test_gelu_is_the_tanh_form(rng):
    g = Graph("g")
    x = g.input("x", (1, 5), "float32")
    g.output(g.gelu(g.matmul(x, g.param("eye", np.eye(5, dtype=np.float32)))), "y")
    values = np.array([[-3.0, -1.0, 0.0, 0.5, 2.0]], np.float32)
    out = ge2.ExecutorV2(g).run({"x": values})["y"]
    z = values.astype(np.float64)
    tanh_form = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    assert_close(out, tanh_form, "float32")


# --- streams, zero-copy plans, profile ----------------------------------------------------------------------------
def test_branches_on_several_streams_match_one_stream_bit_for_bit(rng):
    g, reference = branches(rng, 8, 48, "float32", batch="batch")
    one, four = ge2.ExecutorV2(g, streams=1), ge2.ExecutorV2(g, streams=4)
    assert ge2.ExecutorV2(g).stream_count == 4  # the default: the graph's width, capped
    assert ge2.ExecutorV2(mlp(rng, (8, 8, 4), "float32", "relu")[0]).stream_count == 1  # a chain needs one
    for batch in (64, 1, 7):
        x = random_array(rng, (batch, 48), "float32")
        y = four.run({"x": x})["y"]
        np.testing.assert_array_equal(y, one.run({"x": x})["y"])
        assert_close(y, reference(x), "float32", 48 * 8)
    order = four.plans[0].schedule
    assert order.stream_count == 4
    gemm_streams = [s for node, s in zip(four.plans[0].graph.nodes, order.stream_of) if node.op == "gemm"]
    assert set(gemm_streams) == {0, 1, 2, 3} and max(map(gemm_streams.count, gemm_streams)) <= 3
    assert one.plans[0].schedule.stream_count == 1 and not one.plans[0].schedule.signalling


def test_every_cross_stream_edge_is_ordered_by_an_event(rng):
    g, _ = branches(rng, 6, 16, "float32")
    plan = ge2.ExecutorV2(g, streams=3).plans[0]
    order = plan.schedule
    writer = {v.name: i for i, node in enumerate(plan.graph.nodes) for v in node.outputs}
    for step, node in enumerate(plan.graph.nodes):
        for value in node.inputs:
            producer = writer.get(value.name) if value is not None else None
            if producer is None:
                continue
            assert order.before(producer, step)
            if order.stream_of[producer] != order.stream_of[step]:
                previous = max((s for s in range(step) if order.stream_of[s] == order.stream_of[step]), default=None)
                assert producer in order.waits[step] or (previous is not None and order.before(producer, previous))
                assert plan.steps[producer].signals or producer not in order.waits[step]


def test_the_planner_keeps_buffers_of_concurrent_nodes_apart(rng):
    g, _ = branches(rng, 8, 48, "float32")
    for streams in (1, 4):
        plan = ge2.ExecutorV2(g, streams=streams).plans[0]
        nodes, order = plan.graph.nodes, plan.schedule
        for i, j in itertools.combinations(range(len(nodes)), 2):
            if order.before(i, j) or order.before(j, i):
                continue
            assert streams > 1
            for a in nodes[i].outputs:
                for b in nodes[j].outputs:
                    a_start, b_start = plan.memory.offsets[a.name], plan.memory.offsets[b.name]
                    a_bytes = a.type.numel * ge2.dtypes.itemsize(a.type.dtype)
                    b_bytes = b.type.numel * ge2.dtypes.itemsize(b.type.dtype)
                    assert a_start + a_bytes <= b_start or b_start + b_bytes <= a_start, (a.name, b.name)


def test_planner_shares_bytes_only_between_ordered_buffers():
    # Steps 0 -> 1 on one stream, 2 -> 3 on another, with no edge between the streams.
    a, b = Buffer("a", 1 << 20, 0, (1,)), Buffer("b", 1 << 20, 2, (3,))
    assert plan_memory([a, b]).arena_bytes == 1 << 20  # one stream: a is dead before b is written
    concurrent = lambda x, y: (x, y) in {(0, 1), (2, 3)} or x == -1 or y == 4  # noqa: E731
    assert not may_share(a, b, concurrent)
    plan = plan_memory([a, b], before=concurrent)
    assert plan.arena_bytes == 2 << 20 and plan.offsets["a"] != plan.offsets["b"]


def test_plan_slots_replay_without_copies_and_see_new_inputs(rng):
    g, reference = mlp(rng, (16, 32, 8), "float32", "relu")
    ex = ge2.ExecutorV2(g)
    plan = ex.plan({"x": (5, 16)})
    assert plan is ex.plan({"x": (5, 16)}) and ex.plans == [plan]
    assert set(plan.inputs) == {"x"} and set(plan.outputs) == {"y"} and plan.outputs["y"].shape == (5, 8)
    for _ in range(3):
        x = random_array(rng, (5, 16), "float32")
        plan.inputs["x"][...] = x
        plan.replay()
        assert_close(plan.outputs["y"], reference(x), "float32", 32)
        first = plan.outputs["y"].copy()
        plan.outputs["y"][...] = np.nan
        plan.replay()  # the inputs survive a replay: no buffer of the plan shares their bytes
        np.testing.assert_array_equal(plan.inputs["x"], x)
        np.testing.assert_array_equal(plan.outputs["y"], first)
    with pytest.raises(ValueError, match=r"shapes: unknown input\(s\) \['z'\]"):
        ex.plan({"z": (5, 16)})
    with pytest.raises(ValueError, match=r"shapes\['x'\]: expected a concrete shape matching \('batch', 16\), got "
                                         r"\(5, 17\)"):
        ex.plan({"x": (5, 17)})
    with pytest.raises(ValueError, match=r"shapes\['x'\]: expected a concrete shape"):
        ex.plan()


def test_bad_streams_and_runs_are_rejected(rng):
    g, _ = mlp(rng, (8, 8, 4), "float32", "relu", batch=2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="streams: expected None or an int >= 1"):
            ge2.ExecutorV2(g, streams=bad)
    with pytest.raises(ValueError, match="runs: expected an int >= 1, got 0"):
        ge2.ExecutorV2(g).profile({"x": random_array(rng, (2, 8), "float32")}, runs=0)


def test_roofline_is_computed_from_device_properties_and_measured_once(tmp_path, monkeypatch):
    """Any GPU gets a roofline: compute peaks from SM count x clock x its architecture's rate, the copy bandwidth
    measured once per device and setup and then read back from the cache file (here an H200's properties)."""
    from graph_executor_v2.runtime import roofline

    monkeypatch.setenv("GE2_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(roofline, "_MEASURED", {})
    h200 = {"name": "NVIDIA H200", "compute_capability": (9, 0), "sm_count": 132, "clock_rate_khz": 1980000,
            "memory_clock_rate_khz": 3201000, "memory_bus_width_bits": 6144}
    measured = []

    def measure():
        measured.append(1)
        return 4.2e12

    first = roofline.roofline_of(h200, "H200 | CUDA 13", measure)
    assert math.isclose(first.flops["bfloat16"], 132 * 1.98e9 * 4096)  # ~1.07 PFLOP/s dense
    assert math.isclose(first.flops["float32"], 132 * 1.98e9 * 256)
    assert math.isclose(first.memory_bytes_per_s, 2 * 3.201e9 * 768)  # ~4.9 TB/s
    assert first.peak("GB/s", "float16") == 4.2e12 and first.peak("TFLOP/s", "int64") is None
    assert roofline.roofline_of(h200, "H200 | CUDA 13", measure) is first and len(measured) == 1
    monkeypatch.setattr(roofline, "_MEASURED", {})  # a new process reads the cache file instead of measuring
    assert roofline.roofline_of(h200, "H200 | CUDA 13", measure) == first and len(measured) == 1
    ampere = roofline.peak_flops({**h200, "compute_capability": (8, 7)})  # takes the 8.6 rates
    assert math.isclose(ampere["float16"], 132 * 1.98e9 * 1024)
    assert roofline.peak_flops({**h200, "compute_capability": (7, 5)}) == {}  # older than every known entry


def test_profile_table_and_chrome_trace(rng, tmp_path):
    g, _ = mlp(rng, (32, 64, 16), "float32", "gelu", batch=8)
    ex = ge2.ExecutorV2(g, passes=[])
    profile = ex.profile({"x": random_array(rng, (8, 32), "float32")}, runs=3)
    nodes = ex.plans[0].graph.nodes
    assert [row.node for row in profile.nodes] == [node.name for node in nodes]
    assert math.isclose(sum(row.share for row in profile.nodes), 1.0)
    assert all(row.median_ms > 0 and row.kernel == "numpy_reference" for row in profile.nodes)
    matmul = profile.nodes[0]
    assert matmul.op == "matmul" and matmul.unit == "TFLOP/s"
    assert math.isclose(matmul.rate, 2 * 8 * 32 * 64 / (matmul.median_ms * 1e-3))
    add = profile.nodes[1]
    assert add.op == "add" and add.unit == "GB/s"
    assert math.isclose(add.rate, (8 * 64 + 64 + 8 * 64) * 4 / (add.median_ms * 1e-3))
    assert profile.node_by_node_ms > 0 and profile.cuda_graph_ms is None
    text = str(profile)
    assert all(node.name in text for node in nodes) and "not captured" in text
    path = tmp_path / "trace.json"
    profile.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert [e["name"] for e in events] == [node.name for node in nodes]
    assert all(e["ph"] == "X" and e["dur"] > 0 for e in events)
    assert all(later["ts"] >= earlier["ts"] + earlier["dur"] - 1e-9 for earlier, later in zip(events, events[1:]))


def test_profile_by_op_sums_the_nodes_of_each_op_and_kernel(rng):
    g, _ = mlp(rng, (32, 64, 64, 16), "float32", "relu", batch=8)
    ex = ge2.ExecutorV2(g, passes=[])
    profile = ex.profile({"x": random_array(rng, (8, 32), "float32")}, runs=3)
    summary = profile.by_op()
    ops = [node.op for node in ex.plans[0].graph.nodes]
    assert sorted((entry.op, entry.nodes) for entry in summary) == sorted((op, ops.count(op)) for op in set(ops))
    for entry in summary:
        rows = [row for row in profile.nodes if row.op == entry.op]
        assert math.isclose(entry.total_ms, sum(row.median_ms for row in rows))
        assert entry.kernel == "numpy_reference" and entry.roofline_fraction is None  # the CPU has no roofline
    assert [entry.total_ms for entry in summary] == sorted((entry.total_ms for entry in summary), reverse=True)
    assert math.isclose(sum(entry.share for entry in summary), 1.0)
    text = profile.op_table()
    assert all(f"{entry.op} " in text for entry in summary) and "by op" in text


def test_profile_by_op_weighs_roofline_fractions_by_time():
    from graph_executor_v2.runtime.profile import NodeTime, Profile

    def node(name, ms, fraction):
        return NodeTime(name, "gemm", "cublaslt", False, 0, ms, 0.0, 1.0, "TFLOP/s", fraction)

    profile = Profile("g", "gpu", 1, [node("a", 1.0, 0.8), node("b", 3.0, 0.4)], 4.0, None)
    (entry,) = profile.by_op()
    assert entry.nodes == 2 and math.isclose(entry.total_ms, 4.0) and math.isclose(entry.share, 1.0)
    assert math.isclose(entry.roofline_fraction, (0.8 * 1.0 + 0.4 * 3.0) / 4.0)
    (unknown,) = Profile("g", "gpu", 1, [node("a", 1.0, 0.8), node("b", 1.0, None)], 2.0, None).by_op()
    assert unknown.roofline_fraction is None


def test_explain_names_the_stream_of_every_node(rng):
    g, _ = branches(rng, 4, 16, "float32")
    text = ge2.ExecutorV2(g, streams=2).explain()
    assert "[stream 0]" in text and "[stream 1]" in text
    assert "[stream" not in ge2.ExecutorV2(g, streams=1).explain()


def test_after_step_hooks_run_after_their_step_in_order(rng):
    g = Graph("hooks")
    x = g.input("x", (3, 4), "float32")
    a = g.relu(x)
    b = g.neg(a)
    g.output(g.mul(b, b), "y")
    executor = ge2.ExecutorV2(g, "cpu", passes=[])
    plan = executor.plan()
    seen = []
    # a hook sees its step's output and may change it in place before later steps read it (what an all-reduce does)
    plan.after_step[0] = [lambda stream: seen.append(("relu", plan.slots[a.name].copy()))]
    plan.after_step[1] = [lambda stream: seen.append("neg"), lambda stream: plan.slots[b.name].__imul__(2.0)]
    plan.epilogue.append(lambda stream: seen.append("epilogue"))
    values = rng.standard_normal((3, 4)).astype(np.float32)
    result = executor.run({"x": values})["y"]
    assert seen[0][0] == "relu" and seen[1:] == ["neg", "epilogue"]
    np.testing.assert_array_equal(seen[0][1], np.maximum(values, 0))
    assert_close(result, (2 * np.maximum(values, 0).astype(np.float64)) ** 2, "float32")
