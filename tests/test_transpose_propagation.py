"""propagate_transposes (passes/transposes.py): transposes move through gemm rows, slices, attention heads and
pointwise ops until they cancel, chains of reshapes and transposes keep at most one transpose, and the pass keeps
its result only when fewer bytes are transposed. Each graph runs against float64 NumPy on the CPU backend and, for
the nn.MultiheadAttention block ViT-B/16 exports, on CUDA (``gpu``)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ir import Graph
from graph_executor_v2.passes import PASSES, PassManager
from graph_executor_v2.passes.transposes import transposed_bytes
from graph_executor_v2.testing import assert_close

EPS = 1e-6


def _propagated(graph: Graph):
    optimized, (record,) = PassManager([PASSES["propagate_transposes"]], verify_each=True).run(graph)
    return optimized, record


def _run(graph: Graph, feeds, device="cpu", passes=None):
    return ge2.ExecutorV2(graph, device=device, passes=passes, precision="highest").run(feeds)


def _param(g: Graph, rng, name, shape, dtype):
    return g.param(name, (rng.standard_normal(shape) * shape[0] ** -0.5).astype(dtype))


# --- the block ViT-B/16's dynamo export writes: nn.MultiheadAttention sequence-first in a batch-first model ------
def _multihead_block(rng, batch, seq, heads, head_dim, dtype):
    """LayerNorm -> transpose to [L, N, E] -> QKV matmul + bias -> view [1, L, N, 3, E] -> transpose (3, 1, 2, 0, 4)
    -> squeeze -> Gather q/k/v -> per head [L, N * H, d] -> transpose -> [N, H, L, d] -> attention -> transpose
    (2, 0, 1, 3) -> out projection Gemm -> [L, N, E] -> transpose back -> residual add, then the MLP block."""
    width = heads * head_dim
    g = Graph("multihead_block")
    x = g.input("x", (batch, seq, width), dtype)
    params = {name: _param(g, rng, name, shape, dtype) for name, shape in [
        ("ln1_g", (width,)), ("ln1_b", (width,)), ("w_in", (width, 3 * width)), ("b_in", (3 * width,)),
        ("w_out", (width, width)), ("b_out", (width,)), ("ln2_g", (width,)), ("ln2_b", (width,)),
        ("w_fc1", (width, 4 * width)), ("b_fc1", (4 * width,)), ("w_fc2", (4 * width, width)), ("b_fc2", (width,))]}
    normed = g.layernorm(x, params["ln1_g"], params["ln1_b"], eps=EPS)
    projected = g.add(g.matmul(g.transpose(normed, perm=(1, 0, 2)), params["w_in"]), params["b_in"])
    unbound = g.reshape(g.reshape(projected, shape=(seq, batch, 3, width)), shape=(1, seq, batch, 3, width))
    unbound = g.reshape(g.transpose(unbound, perm=(3, 1, 2, 0, 4)), shape=(3, seq, batch, width))
    per_head = []
    for index in range(3):
        part = g.gather(unbound, g.param(f"index_{index}", np.array(index, np.int64)), axis=0)
        flat = g.transpose(g.reshape(part, shape=(seq, batch * heads, head_dim)), perm=(1, 0, 2))
        per_head.append(g.reshape(flat, shape=(batch, heads, seq, head_dim)))
    attended, _ = g.attention(*per_head, layout="bhsd")
    merged = g.reshape(g.transpose(attended, perm=(2, 0, 1, 3)), shape=(seq * batch, width))
    out = g.gemm(merged, params["w_out"], params["b_out"], trans_b=True)
    hidden = g.add(x, g.transpose(g.reshape(out, shape=(seq, batch, width)), perm=(1, 0, 2)))
    normed2 = g.layernorm(hidden, params["ln2_g"], params["ln2_b"], eps=EPS)
    mlp = g.gelu_erf(g.add(g.matmul(normed2, params["w_fc1"]), params["b_fc1"]))
    g.output(g.add(hidden, g.add(g.matmul(mlp, params["w_fc2"]), params["b_fc2"])), "y")
    return g, {name: np.asarray(value.data, np.float64) for name, value in params.items()}


def _layernorm64(x, gamma, beta):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + EPS) * gamma + beta


def _multihead_block64(x, p, heads):
    """The block in float64, batch-first throughout (what the transposes compute, written without them)."""
    batch, seq, width = x.shape
    head_dim = width // heads
    qkv = _layernorm64(x, p["ln1_g"], p["ln1_b"]) @ p["w_in"] + p["b_in"]
    q, k, v = (qkv[..., i * width:(i + 1) * width].reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)
               for i in range(3))
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    attended = (weights / weights.sum(-1, keepdims=True)) @ v
    hidden = x + attended.transpose(0, 2, 1, 3).reshape(batch, seq, width) @ p["w_out"].T + p["b_out"]
    fc1 = _layernorm64(hidden, p["ln2_g"], p["ln2_b"]) @ p["w_fc1"] + p["b_fc1"]
    erf = np.vectorize(math.erf)
    return hidden + (0.5 * fc1 * (1 + erf(fc1 / math.sqrt(2)))) @ p["w_fc2"] + p["b_fc2"]


def test_multihead_attention_block_loses_every_transpose(rng):
    """7 transposes before (ViT-B/16: 84 in its 12 blocks), none after; the attention reads "bshd"."""
    graph, params = _multihead_block(rng, batch=3, seq=5, heads=2, head_dim=8, dtype=np.float32)
    executor = ge2.ExecutorV2(graph, device="cpu", precision="highest")
    counts = executor.optimized_graph.op_counts()
    assert graph.op_counts()["transpose"] == 7 and "transpose" not in counts and counts["attention"] == 1
    (attention,) = [node for node in executor.optimized_graph.nodes if node.op == "attention"]
    assert attention.attrs["layout"] == "bshd"
    (record,) = [r for r in executor.pass_records if r.name == "propagate_transposes"]
    # [N, L, E] 4-byte activations: the input and output transposes, 3 heads, the fused QKV (3 E): 9 of them
    assert record.notes[-1] == f"transposes: {9 * 3 * 5 * 16 * 4} -> 0 bytes written by activation transposes"
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    expected = _multihead_block64(x.astype(np.float64), params, heads=2)
    assert_close(executor.run({"x": x})["y"], expected, "float32", reduction_length=64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_multihead_attention_block_on_cuda(rng, dtype):
    """The block on the GPU after the default pipeline: attention in "bshd" (cuDNN's or flash's in float16), no
    transpose kernel; float16 against float64 of the float16 inputs and weights."""
    heads, head_dim = 2, 64
    graph, params = _multihead_block(rng, batch=2, seq=17, heads=heads, head_dim=head_dim, dtype=np.dtype(dtype))
    executor = ge2.ExecutorV2(graph, device="cuda", precision="highest")
    assert "transpose" not in executor.optimized_graph.op_counts()
    x = rng.standard_normal((2, 17, heads * head_dim)).astype(dtype)
    expected = _multihead_block64(x.astype(np.float64), params, heads)
    assert_close(executor.run({"x": x})["y"], expected, dtype, reduction_length=4 * heads * head_dim)


# --- chains of reshapes and transposes --------------------------------------------------------------------------
def _transposes(graph: Graph):
    return [tuple(node.attrs["perm"]) for node in graph.nodes if node.op == "transpose"]


def test_a_chain_keeps_one_transpose_of_the_atoms_that_move(rng):
    """[2, 3, 4] -> (1, 0, 2) -> [3, 8] -> (1, 0) is one transpose (0, 2, 1) of [2, 3, 4] and a reshape to [8, 3]."""
    g = Graph("chain")
    x = g.input("x", (2, 3, 4), "float32")
    g.output(g.transpose(g.reshape(g.transpose(x, perm=(1, 0, 2)), shape=(3, 8)), perm=(1, 0)), "y")
    optimized, record = _propagated(g)
    assert _transposes(optimized) == [(0, 2, 1)] and optimized.op_counts() == {"transpose": 1, "reshape": 1}
    assert record.notes[-1] == f"transposes: {2 * 24 * 4} -> {24 * 4} bytes written by activation transposes"
    feeds = {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)}
    expected = feeds["x"].astype(np.float64).transpose(1, 0, 2).reshape(3, 8).T
    np.testing.assert_array_equal(_run(optimized, feeds, passes=[])["y"], expected)


def test_transposes_that_undo_each_other_across_reshapes_cancel(rng):
    """Heads split [N, L, H * d] -> [N, H, L, d] and merged back through a reshape to [N * H, L, d]: a view."""
    g = Graph("cancel")
    x = g.input("x", (2, 5, 12), "float32")
    heads = g.transpose(g.reshape(x, shape=(2, 5, 3, 4)), perm=(0, 2, 1, 3))
    flat = g.reshape(heads, shape=(6, 5, 4))
    back = g.transpose(g.reshape(flat, shape=(2, 3, 5, 4)), perm=(0, 2, 1, 3))
    g.output(g.relu(g.reshape(back, shape=(10, 12))), "y")
    optimized, _ = _propagated(g)
    assert optimized.op_counts() == {"reshape": 1, "relu": 1}
    feeds = {"x": rng.standard_normal((2, 5, 12)).astype(np.float32)}
    np.testing.assert_array_equal(_run(optimized, feeds, passes=[])["y"], np.maximum(feeds["x"], 0).reshape(10, 12))


def test_a_reshape_that_does_not_regroup_whole_factors_stays(rng):
    """[4, 6] -> (1, 0) -> [8, 3]: 8 neither divides nor is divided by 6, so no atoms fit; the graph is unchanged."""
    g = Graph("mixed")
    x = g.input("x", (4, 6), "float32")
    g.output(g.transpose(g.reshape(g.transpose(x, perm=(1, 0)), shape=(8, 3)), perm=(1, 0)), "y")
    optimized, record = _propagated(g)
    assert record.notes == () and optimized.op_counts() == g.op_counts()


# --- what transposes move through -------------------------------------------------------------------------------
def test_slices_take_the_transpose_along_with_negative_axes_and_steps(rng):
    g = Graph("slices")
    x = g.input("x", (4, 5, 6), "float32")
    moved = g.slice(g.transpose(x, perm=(2, 0, 1)), starts=(1, 5), ends=(5, 0), axes=(-2, 0), steps=(1, -2))
    g.output(g.transpose(moved, perm=(1, 2, 0)), "y")
    optimized, _ = _propagated(g)
    assert optimized.op_counts() == {"slice": 1}
    (node,) = optimized.nodes
    assert node.attrs["axes"] == (0, 2)
    feeds = {"x": rng.standard_normal((4, 5, 6)).astype(np.float32)}
    expected = feeds["x"].transpose(2, 0, 1)[5:0:-2, 1:5].transpose(1, 2, 0)
    np.testing.assert_array_equal(_run(optimized, feeds, passes=[])["y"], expected)


def test_a_row_bias_and_a_gemm_let_the_transpose_through(rng):
    """transpose (1, 0, 2) -> + bias[E] -> flatten -> gemm -> view [L, N, F] -> transpose back: no transpose."""
    g = Graph("rows")
    x = g.input("x", (3, 4, 8), "float32")
    w, bias = _param(g, rng, "w", (8, 6), np.float32), _param(g, rng, "b", (8,), np.float32)
    shifted = g.add(g.transpose(x, perm=(1, 0, 2)), bias)
    product = g.gemm(g.reshape(shifted, shape=(12, 8)), w)
    g.output(g.transpose(g.reshape(product, shape=(4, 3, 6)), perm=(1, 0, 2)), "y")
    optimized, _ = _propagated(g)
    assert "transpose" not in optimized.op_counts()
    feeds = {"x": rng.standard_normal((3, 4, 8)).astype(np.float32)}
    expected = (feeds["x"].astype(np.float64) + np.asarray(bias.data, np.float64)) @ np.asarray(w.data, np.float64)
    assert_close(_run(optimized, feeds, passes=[])["y"], expected, "float32", reduction_length=8)


def test_a_transpose_that_would_only_grow_stays_where_it_is(rng):
    """Sinking (1, 0, 2) through a gemm that widens the rows 4x meets nothing: the pass keeps the graph as it was."""
    g = Graph("widen")
    x = g.input("x", (3, 4, 8), "float32")
    w = _param(g, rng, "w", (8, 32), np.float32)
    g.output(g.gemm(g.reshape(g.transpose(x, perm=(1, 0, 2)), shape=(12, 8)), w), "y")
    optimized, record = _propagated(g)
    assert record.notes == () and optimized.op_counts() == g.op_counts()
    assert transposed_bytes(optimized) == 3 * 4 * 8 * 4


def test_attention_whose_log_sum_exp_is_read_keeps_its_layout(rng):
    g = Graph("lse")
    inputs = [g.input(name, (2, 5, 3, 8), "float32") for name in "qkv"]
    y, lse = g.attention(*(g.transpose(v, perm=(0, 2, 1, 3)) for v in inputs), layout="bhsd")
    g.output(g.transpose(y, perm=(0, 2, 1, 3)), "y")
    g.output(lse, "lse")
    optimized, record = _propagated(g)
    assert record.notes == () and optimized.op_counts() == g.op_counts()
