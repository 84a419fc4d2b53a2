"""Every pass alone: op counts before and after, and the same numbers before and after on the CPU backend."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ir import Graph
from graph_executor_v2.passes import PASSES, Pass, PassManager, Pat, resolve, rewrite
from graph_executor_v2.testing import assert_close, random_array


def apply(pass_name: str, graph: Graph):
    optimized, (record,) = PassManager([PASSES[pass_name]], verify_each=True).run(graph)
    return optimized, record


def assert_same_numerics(before: Graph, after: Graph, rng, dtype="float32", reduction_length=64):
    """Runs both graphs unoptimized on the CPU with the same feeds (shaped like ``after``'s inputs)."""
    feeds = {v.name: random_array(rng, v.type.shape, v.type.dtype) for v in after.inputs}
    expected = ge2.ExecutorV2(before, passes=[]).run(feeds)
    actual = ge2.ExecutorV2(after, passes=[]).run(feeds)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert_close(actual[name], expected[name], dtype, reduction_length, what=name)


def weights(g: Graph, rng, name, shape, dtype="float32"):
    return g.param(name, random_array(rng, shape, dtype, scale=shape[0] ** -0.5))


# --- infer_shapes -------------------------------------------------------------------------------------------------
def test_infer_shapes_binds_symbolic_dims(rng):
    g = Graph("g")
    x = g.input("x", ("batch", 16), "float32")
    y = g.relu(g.matmul(x, weights(g, rng, "w", (16, 8))))
    g.output(y, "y")
    bound = g.clone()
    bound.inputs[0].type = ge2.ir.TensorType((5, 16), "float32")
    optimized, record = apply("infer_shapes", bound)
    assert record.notes == ("matmul_0: float32[batch, 8] -> float32[5, 8]",
                            "relu_0: float32[batch, 8] -> float32[5, 8]")
    assert record.ops_before == record.ops_after == {"matmul": 1, "relu": 1}
    assert optimized.outputs["y"].type.shape == (5, 8)
    assert_same_numerics(g, optimized, rng)


def test_infer_shapes_names_the_node_that_no_longer_checks(rng):
    g = Graph("g")
    x = g.input("x", ("batch", "k"), "float32")
    g.output(g.matmul(x, weights(g, rng, "w", (16, 8))), "y")
    g.inputs[0].type = ge2.ir.TensorType((5, 15), "float32")
    with pytest.raises(ValueError, match=r"node 'matmul_0' \(matmul\).*inner dimension"):
        apply("infer_shapes", g)


# --- dce ----------------------------------------------------------------------------------------------------------
def test_dce_removes_dead_nodes_and_params(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    h = g.matmul(x, weights(g, rng, "w", (16, 8)))
    g.tanh(g.sigmoid(h))  # dead chain
    weights(g, rng, "unused", (3, 3))
    g.output(g.relu(h), "y")
    optimized, record = apply("dce", g)
    assert record.ops_before == {"matmul": 1, "sigmoid": 1, "tanh": 1, "relu": 1}
    assert record.ops_after == {"matmul": 1, "relu": 1}
    assert sorted(optimized.params) == ["w"]
    assert optimized.inputs[0].name == "x"  # inputs stay: they are the signature
    assert_same_numerics(g, optimized, rng)


# --- cse ----------------------------------------------------------------------------------------------------------
def test_cse_merges_identical_subexpressions(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    w = weights(g, rng, "w", (16, 8))
    left = g.relu(g.matmul(x, w))
    right = g.relu(g.matmul(x, w))  # the same chain again: merged link by link in one sweep
    other = g.sigmoid(g.matmul(x, w))
    g.output(g.add(g.add(left, right), other), "y")
    optimized, record = apply("cse", g)
    assert record.ops_before == {"matmul": 3, "relu": 2, "sigmoid": 1, "add": 2}
    assert record.ops_after == {"matmul": 1, "relu": 1, "sigmoid": 1, "add": 2}
    assert_same_numerics(g, optimized, rng)


def test_cse_keeps_nodes_that_differ_in_attributes_or_are_impure(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    w = weights(g, rng, "w", (16, 8))
    g.output(g.add(g.gemm(x, w, act="relu"), g.gemm(x, w, act="gelu")), "y")
    g.output(g.add(g.dropout(x, p=0.5, seed=1), g.dropout(x, p=0.5, seed=1)), "z")  # random: a runtime may re-seed
    optimized, record = apply("cse", g)
    assert record.ops_after == record.ops_before == {"gemm": 2, "add": 2, "dropout": 2}
    assert_same_numerics(g, optimized, rng)


# --- constant_fold ------------------------------------------------------------------------------------------------
def test_constant_fold_evaluates_parameter_only_subgraphs(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    w = weights(g, rng, "w", (16, 8))
    scale = g.param("scale", np.full((16, 8), 0.5, np.float32))
    folded_weight = g.relu(g.mul(w, scale))  # param-only: becomes one parameter
    g.output(g.matmul(x, folded_weight), "y")
    optimized, record = apply("constant_fold", g)
    assert record.ops_before == {"mul": 1, "relu": 1, "matmul": 1}
    assert record.ops_after == {"matmul": 1}
    folded = optimized.nodes[0].inputs[1]
    assert folded.is_param
    np.testing.assert_array_equal(folded.data, np.maximum(w.data * 0.5, 0))
    assert_same_numerics(g, optimized, rng)


def test_constant_fold_leaves_impure_nodes(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    g.output(g.matmul(x, g.dropout(weights(g, rng, "w", (16, 8)), p=0.25, seed=3)), "y")
    _, record = apply("constant_fold", g)
    assert record.ops_after == {"dropout": 1, "matmul": 1}


# --- canonicalize -------------------------------------------------------------------------------------------------
def test_canonicalize_matmul_plus_bias_becomes_gemm_in_either_order(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    b1 = g.param("b1", random_array(rng, (8,), "float32"))
    b2 = g.param("b2", random_array(rng, (1, 8), "float32"))  # a (1, N) row is a bias too
    first = g.add(g.matmul(x, weights(g, rng, "w1", (16, 8))), b1)
    second = g.add(b2, g.matmul(x, weights(g, rng, "w2", (16, 8))))
    g.output(first, "first")
    g.output(second, "second")
    optimized, record = apply("canonicalize", g)
    assert record.ops_before == {"matmul": 2, "add": 2}
    assert record.ops_after == {"gemm": 2, "reshape": 1}  # the (1, N) row is reshaped to (N,) (folded later)
    assert all(node.inputs[2] is not None for node in optimized.nodes if node.op == "gemm")
    assert_same_numerics(g, optimized, rng)


def test_canonicalize_bias_add_after_gemm_and_plain_matmul(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    h = g.bias_add(g.matmul(x, weights(g, rng, "w", (16, 8))), g.param("b", random_array(rng, (8,), "float32")))
    g.output(g.matmul(h, weights(g, rng, "w2", (8, 3))), "y")
    optimized, record = apply("canonicalize", g)
    assert record.ops_after == {"gemm": 2}
    assert_same_numerics(g, optimized, rng)


def test_canonicalize_guards_keep_shared_or_non_bias_adds(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    shared = g.matmul(x, weights(g, rng, "w", (16, 8)))
    g.output(g.add(shared, g.param("b", random_array(rng, (8,), "float32"))), "biased")
    g.output(g.relu(shared), "other_use")  # the product has two consumers: folding would compute it twice
    residual = g.input("r", (4, 8), "float32")
    g.output(g.add(g.matmul(x, weights(g, rng, "w3", (16, 8))), residual), "not_a_bias")
    g.output(g.add(g.matmul(x, weights(g, rng, "w4", (16, 8))), g.param("s", np.ones((1, 1), np.float32))),
             "scalar")
    optimized, record = apply("canonicalize", g)
    assert record.ops_before == {"matmul": 3, "add": 3, "relu": 1}
    assert record.ops_after == {"gemm": 3, "bias_add": 1, "add": 2, "relu": 1}
    assert_same_numerics(g, optimized, rng)


def test_canonicalize_folds_a_bias_added_to_a_reshaped_product(rng):
    """A linear layer as the dynamo exporter writes it (BERT's, ViT's projections): the input flattened to 2-d,
    multiplied, the product viewed as [batch, seq, N] and the bias added there. The bias joins the gemm when the view
    keeps the rows (last dim N); a view that splits N (heads) does not take it."""
    g = Graph("g")
    x = g.input("x", (2, 3, 16), "float32")
    flat = g.reshape(x, shape=(6, 16))
    kept_rows = g.reshape(g.matmul(flat, weights(g, rng, "w1", (16, 8))), shape=(2, 3, 8))
    g.output(g.add(kept_rows, g.param("b1", random_array(rng, (8,), "float32"))), "projected")
    split = g.reshape(g.matmul(flat, weights(g, rng, "w2", (16, 8))), shape=(2, 3, 2, 4))
    g.output(g.add(split, g.param("b2", random_array(rng, (4,), "float32"))), "heads")
    optimized, record = apply("canonicalize", g)
    assert record.ops_after == {"reshape": 3, "gemm": 2, "bias_add": 1}
    biased = [node for node in optimized.nodes if node.op == "gemm" and node.inputs[2] is not None]
    assert [node.inputs[2].name for node in biased] == ["b1"]
    assert_same_numerics(g, optimized, rng)


@pytest.mark.parametrize("axis, index, index_shape", [(0, 1, ()), (1, -1, ()), (2, 0, (1,))])
def test_canonicalize_gathers_of_one_constant_index_become_slices(rng, axis, index, index_shape):
    """ViT-B/16's export unbinds q, k and v with Gather of a constant scalar: a slice (a block copy) instead."""
    g = Graph("g")
    x = g.input("x", (3, 4, 5), "float32")
    g.output(g.relu(g.gather(x, g.param("i", np.full(index_shape, index, np.int64)), axis=axis)), "y")
    g.output(g.gather(x, g.input("j", (2,), "int64"), axis=0), "computed_indices")  # stays a gather
    optimized, record = apply("canonicalize", g)
    reshapes = {"reshape": 1} if index_shape == () else {}  # a [1] index keeps the axis: the slice's own shape
    assert record.ops_after == {"slice": 1, "relu": 1, "gather": 1, **reshapes}
    (sliced,) = [n for n in optimized.nodes if n.op == "slice"]
    assert sliced.attrs["axes"] == (axis,) and sliced.attrs["starts"] == (index % x.type.shape[axis],)
    feeds = {"x": random_array(rng, (3, 4, 5), "float32"), "j": np.array([2, 0], np.int64)}
    expected = ge2.ExecutorV2(g, passes=[]).run(feeds)
    actual = ge2.ExecutorV2(optimized, passes=[]).run(feeds)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name])


def _patch_conv64(x, w, bias, layout):
    """conv2d with kernel = stride and no padding in float64: every output pixel is one patch times w."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    if layout == "NHWC":
        x, w = x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2)
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    patches = x.reshape(n, c, h // kh, kh, wd // kw, kw)
    shift = 0 if bias is None else np.asarray(bias, np.float64)[:, None, None]
    y = np.einsum("ncharb,ocab->nohr", patches, w) + shift
    return y.transpose(0, 2, 3, 1) if layout == "NHWC" else y


@pytest.mark.parametrize("layout, with_bias", [("NCHW", True), ("NHWC", False)])
def test_canonicalize_patch_embedding_conv_becomes_one_gemm(rng, layout, with_bias):
    """ViT's patch embedding (a 16 x 16 / 16 conv on RGB; here 4 x 2 / (4, 2) on 3 channels): the patches as rows,
    one gemm (bias included), then the tokens read batch-first with no transpose left but the patches' own."""
    g = Graph("g")
    shape = (2, 3, 8, 6) if layout == "NCHW" else (2, 8, 6, 3)
    x = g.input("x", shape, "float32")
    w = weights(g, rng, "w", (5, 3, 4, 2) if layout == "NCHW" else (5, 4, 2, 3))
    bias = g.param("b", random_array(rng, (5,), "float32")) if with_bias else None
    y = g.conv2d(x, w, bias, stride=(4, 2), layout=layout)
    tokens = g.transpose(g.reshape(y, shape=(2, 5, 6)), perm=(0, 2, 1)) if layout == "NCHW" else g.reshape(
        y, shape=(2, 6, 5))
    g.output(tokens, "tokens")
    optimized, record = apply("canonicalize", g)
    assert record.notes[0].rule == "patch_conv_to_gemm" and "conv2d" not in record.ops_after
    executor = ge2.ExecutorV2(g, precision="highest")
    assert executor.optimized_graph.op_counts().get("transpose") == 1  # the patches; NCHW's back-and-forth cancels
    feeds = {"x": random_array(rng, shape, "float32")}
    expected = _patch_conv64(feeds["x"], w.data, None if bias is None else bias.data, layout)
    expected = expected.reshape(2, 5, 6).transpose(0, 2, 1) if layout == "NCHW" else expected.reshape(2, 6, 5)
    assert_close(executor.run(feeds)["tokens"], expected, "float32", reduction_length=24)


@pytest.mark.parametrize("attrs, channels", [({"stride": 2, "padding": 1}, 3), ({"stride": 2, "dilation": 2}, 3),
                                             ({"stride": 1}, 3), ({"stride": 2}, 8), ({"stride": 2, "act": "relu"}, 3)])
def test_canonicalize_keeps_convs_that_are_not_patch_embeddings(rng, attrs, channels):
    g = Graph("g")
    x = g.input("x", (1, channels, 8, 8), "float32")
    kernel = 1 if attrs["stride"] == 1 else 2
    g.output(g.conv2d(x, weights(g, rng, "w", (4, channels, kernel, kernel)), **attrs), "y")
    _, record = apply("canonicalize", g)
    assert record.ops_after == {"conv2d": 1}


def test_canonicalize_computed_rows_become_bias_adds(rng):
    g = Graph("g")
    x = g.input("x", (4, 8), "float32")
    row = g.input("row", (1, 8), "float32")
    g.output(g.add(x, g.relu(row)), "y")
    optimized, record = apply("canonicalize", g)
    assert record.ops_after == {"relu": 1, "reshape": 1, "bias_add": 1}
    assert_same_numerics(g, optimized, rng)


def test_canonicalize_folds_2d_transposes_into_gemm_flags(rng):
    g = Graph("g")
    x = g.input("x", (16, 4), "float32")  # used as x^T
    w_t = weights(g, rng, "w_t", (8, 16))  # stored (out, in), as F.linear keeps it
    shared = g.transpose(w_t, perm=(1, 0))
    g.output(g.matmul(g.transpose(x, perm=(-1, -2)), shared), "y")
    g.output(g.matmul(g.relu(g.transpose(x, perm=(1, 0))), shared), "z")  # the transpose of w_t feeds two gemms
    optimized, record = apply("canonicalize", g)
    assert record.ops_before == {"transpose": 3, "matmul": 2, "relu": 1}
    assert record.ops_after == {"transpose": 1, "gemm": 2, "relu": 1}  # relu(x^T) still needs its transpose
    first, second = (node for node in optimized.nodes if node.op == "gemm")
    assert (first.attrs["trans_a"], first.attrs["trans_b"]) == (True, True)
    assert (second.attrs["trans_a"], second.attrs["trans_b"]) == (False, True)
    assert_same_numerics(g, optimized, rng)


def test_canonicalize_removes_identities_and_merges_chains(rng):
    g = Graph("g")
    x = g.input("x", (2, 3, 4), "float32")
    same = g.reshape(g.transpose(x, perm=(0, 1, 2)), shape=(2, 3, 4))  # both identities
    there_and_back = g.transpose(g.transpose(same, perm=(2, 0, 1)), perm=(1, 2, 0))  # composes to the identity
    rotated = g.transpose(g.transpose(there_and_back, perm=(1, 0, 2)), perm=(0, 2, 1))  # one transpose
    flat = g.reshape(g.reshape(rotated, shape=(6, 4)), shape=(-1,))  # one reshape
    g.output(g.relu(g.dropout(flat, p=0.0, seed=7)), "y")  # dropping nothing is the identity
    g.output(g.dropout(flat, p=0.5, seed=7), "dropped")  # this one stays
    optimized, record = apply("canonicalize", g)
    assert record.ops_before == {"transpose": 5, "reshape": 3, "relu": 1, "dropout": 2}
    assert record.ops_after == {"transpose": 1, "reshape": 1, "relu": 1, "dropout": 1}
    assert optimized.nodes[0].attrs["perm"] == (1, 2, 0)
    assert_same_numerics(g, optimized, rng)


@pytest.mark.parametrize("a_shape, b_shape, ops_after", [
    ((2, 3, 5, 4), (4, 6), {"reshape": 2, "gemm": 1}),  # B without batch: one gemm of A's rows
    ((2, 1, 3, 4), (1, 1, 4, 6), {"reshape": 3, "gemm": 1}),  # B's batch dims all 1
    ((2, 1, 3, 4), (3, 4, 2), {"reshape": 20, "slice": 12, "gemm": 6, "concat": 1}),  # per broadcast batch entry
    (("b", 4, 1), ("b", 1, 7), {"mul": 1}),  # an outer product (K = 1), a symbolic batch too: a multiply
    (("b", 3, 4), ("b", 4, 2), {"matmul": 1}),  # a symbolic batch otherwise: stays (on the reference)
])
def test_canonicalize_lowers_batched_matmuls(rng, a_shape, b_shape, ops_after):
    g = Graph("g")
    g.output(g.matmul(g.input("a", a_shape, "float32"), g.input("b", b_shape, "float32")), "y")
    optimized, record = apply("canonicalize", g)
    assert record.ops_after == ops_after, record.ops_after
    bound = {"b": 3}
    feeds = {v.name: random_array(rng, tuple(bound.get(d, d) for d in v.type.shape), "float32") for v in g.inputs}
    expected = np.matmul(feeds["a"].astype(np.float64), feeds["b"].astype(np.float64))
    assert_close(ge2.ExecutorV2(optimized, passes=[]).run(feeds)["y"], expected, "float32", a_shape[-1])


# --- pad_gemm_columns ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("trans_b, with_bias", [(False, True), (True, False)])
def test_pad_gemm_columns_computes_unaligned_columns_aligned_and_slices_them_back(rng, trans_b, with_bias):
    """1031 float16 columns (GPT-2's LM head has 50257): the weight gets 57 zero columns (a parameter: folded), the
    gemm writes 1088 aligned ones, a slice keeps the first 1031; the output is the unpadded graph's."""
    g = Graph("g")
    x = g.input("x", (5, 16), "float16")
    w = weights(g, rng, "w", (1031, 16) if trans_b else (16, 1031), "float16")
    bias = g.param("b", random_array(rng, (1031,), "float16")) if with_bias else None
    g.output(g.gemm(x, w, bias, trans_b=trans_b), "y")
    padded, record = apply("pad_gemm_columns", g)
    (gemm,) = [n for n in padded.nodes if n.op == "gemm"]
    assert gemm.outputs[0].type.shape == (5, 1088) and padded.outputs["y"].type.shape == (5, 1031)
    assert padded.outputs["y"].producer.op == "slice" and "1031 columns computed as 1088" in record.notes[0]
    folded, _ = PassManager([PASSES["constant_fold"]]).run(padded)
    assert folded.op_counts() == {"gemm": 1, "slice": 1}  # the weight's (and bias's) pad is a parameter now
    assert_same_numerics(g, padded, rng, "float16", 16)


@pytest.mark.parametrize("columns, dtype, weight_is_param", [(1032, "float16", True), (999, "float16", True),
                                                             (1031, "float32", True), (1031, "bfloat16", False)])
def test_pad_gemm_columns_leaves_aligned_small_float32_or_computed_weights(rng, columns, dtype, weight_is_param):
    g = Graph("g")
    x = g.input("x", (5, 16), dtype)
    w = weights(g, rng, "w", (16, columns), dtype) if weight_is_param else g.input("w", (16, columns), dtype)
    g.output(g.gemm(x, w), "y")
    _, record = apply("pad_gemm_columns", g)
    assert not record.changed


def test_pad_gemm_columns_runs_in_the_default_pipeline(rng):
    g = Graph("g")
    x = g.input("x", (3, 8), "float16")
    g.output(g.matmul(x, weights(g, rng, "w", (8, 1031), "float16")), "logits")
    executor = ge2.ExecutorV2(g)
    assert executor.optimized_graph.op_counts() == {"gemm": 1, "slice": 1}
    assert "1031 columns computed as 1088" in executor.explain()
    feeds = {"x": random_array(rng, (3, 8), "float16")}
    assert_close(executor.run(feeds)["logits"], ge2.ExecutorV2(g, passes=[]).run(feeds)["logits"], "float16", 8)


# --- pad_after_cast -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0.0, -np.inf])
def test_pad_after_cast_pads_the_narrow_values_bit_for_bit(rng, value):
    """pad_classes' LM head after autocast: a float32 weight padded, then cast to bfloat16 for its gemm. The cast moves
    to the unpadded weight and the pad to its bfloat16 output; the values are the same bits."""
    g = Graph("g")
    w = g.input("w", (50, 4), "float32")
    g.output(g.cast(g.pad(w, pads=(0, 0, 14, 0), value=value), dtype="bfloat16"), "y")
    moved, record = apply("pad_after_cast", g)
    (pad,) = [n for n in moved.nodes if n.op == "pad"]
    assert pad.inputs[0].producer.op == "cast" and pad.outputs[0].type.dtype == "bfloat16"
    assert moved.outputs["y"].producer is pad and pad.attrs["value"] == value and "after its cast" in record.notes[0]
    feeds = {"w": random_array(rng, (50, 4), "float32") * 1e3}
    expected = ge2.ExecutorV2(g, passes=[]).run(feeds)["y"]
    actual = ge2.ExecutorV2(moved, passes=[]).run(feeds)["y"]
    np.testing.assert_array_equal(actual.view(np.uint16), expected.view(np.uint16))


def test_pad_after_cast_leaves_widening_casts_shared_pads_and_unrepresentable_constants(rng):
    g = Graph("g")
    w = g.input("w", (8, 4), "float32")
    h = g.input("h", (8, 4), "bfloat16")
    g.output(g.cast(g.pad(h, pads=(1, 0, 0, 0)), dtype="float32"), "widened")
    shared = g.pad(w, pads=(1, 0, 0, 0))
    g.output(g.cast(shared, dtype="bfloat16"), "narrowed")
    g.output(shared, "shared")
    g.output(g.cast(g.pad(w, pads=(0, 0, 2, 0), value=0.1), dtype="bfloat16"), "tenth")  # 0.1 is no bfloat16
    _, record = apply("pad_after_cast", g)
    assert not record.changed


@pytest.mark.parametrize("trans_b, with_bias", [(False, True), (True, False)])
def test_split_gemm_columns_computes_each_sliced_column_block_on_its_own(rng, trans_b, with_bias):
    """GPT-2's fused QKV: gemm [B * S, 3E] viewed [B, S, 3E] and split in three slices of the last axis; and the
    same product viewed [B, S, 3, E] (ViT's in_proj once its transposes are gone) sliced on the 3: one gemm per
    slice, no slice copies, the same numbers."""
    g = Graph("g")
    x = g.input("x", (6, 8), "float32")
    w = weights(g, rng, "w", (12, 8) if trans_b else (8, 12))
    bias = g.param("b", random_array(rng, (12,), "float32")) if with_bias else None
    flat = g.gemm(x, w, bias, trans_b=trans_b)
    view = g.reshape(flat, shape=(2, 3, 12))
    for index in range(3):
        g.output(g.relu(g.slice(view, starts=(4 * index,), ends=(4 * index + 4,), axes=(2,))), f"part{index}")
    heads = g.reshape(g.gemm(x, w, bias, trans_b=trans_b, name="second"), shape=(2, 3, 3, 4))
    for index in range(3):
        g.output(g.slice(heads, starts=(index,), ends=(index + 1,), axes=(-2,)), f"head{index}")
    optimized, record = apply("split_gemm_columns", g)
    # the slices left are of the parameters (folded as constants in the pipeline): w and the bias, per gemm
    assert record.ops_after == {"gemm": 6, "slice": 12 if with_bias else 6, "reshape": 6, "relu": 3}
    assert record.notes[0] == "gemm_0: read only in 3 column slices ([0:4], [4:8], [8:12]): one gemm each"
    assert all(node.inputs[0].is_param for node in optimized.nodes if node.op == "slice")
    assert_same_numerics(g, optimized, rng, reduction_length=8)


def test_split_gemm_columns_leaves_products_read_whole_once_or_with_steps(rng):
    g = Graph("g")
    x = g.input("x", (6, 8), "float32")
    read_whole = g.gemm(x, weights(g, rng, "w1", (8, 12)))
    g.output(g.slice(read_whole, starts=(0,), ends=(4,), axes=(1,)), "a")
    g.output(g.slice(read_whole, starts=(4,), ends=(8,), axes=(1,)), "b")
    g.output(read_whole, "whole")
    strided = g.gemm(x, weights(g, rng, "w2", (8, 12)))
    g.output(g.slice(strided, starts=(0,), ends=(12,), axes=(1,), steps=(2,)), "c")
    g.output(g.slice(strided, starts=(1,), ends=(12,), axes=(1,), steps=(2,)), "d")
    rows = g.gemm(x, weights(g, rng, "w3", (8, 12)))
    g.output(g.slice(rows, starts=(0,), ends=(3,), axes=(0,)), "e")
    g.output(g.slice(rows, starts=(3,), ends=(6,), axes=(0,)), "f")
    _, record = apply("split_gemm_columns", g)
    assert record.notes == ()


# --- fuse ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_fuse_activation_into_gemm(rng, activation):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    h = g.gemm(x, weights(g, rng, "w", (16, 8)), g.param("b", random_array(rng, (8,), "float32")))
    g.output(getattr(g, activation)(h), "y")
    optimized, record = apply("fuse", g)
    assert record.ops_before == {"gemm": 1, activation: 1}
    assert record.ops_after == {"gemm": 1}
    assert optimized.nodes[0].attrs["act"] == activation
    assert_same_numerics(g, optimized, rng)


def test_fuse_residual_then_activation(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    r = g.input("r", (4, 8), "float32")
    h = g.gemm(x, weights(g, rng, "w", (16, 8)), g.param("b", random_array(rng, (8,), "float32")), alpha=0.5)
    g.output(g.silu(g.add(r, h)), "y")  # silu(r + gemm): residual first, then the activation
    optimized, record = apply("fuse", g)
    assert record.ops_before == {"gemm": 1, "add": 1, "silu": 1}
    assert record.ops_after == {"gemm": 1}
    (node,) = optimized.nodes
    assert node.inputs[3].name == "r" and node.attrs["beta"] == 1.0 and node.attrs["act"] == "silu"
    assert node.attrs["alpha"] == 0.5
    assert_same_numerics(g, optimized, rng)


def test_fuse_guards(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    r = g.input("r", (4, 8), "float32")
    w = weights(g, rng, "w", (16, 8))
    exposed = g.gemm(x, w, name="exposed")
    g.output(exposed, "exposed")  # a graph output: relu cannot absorb it
    g.output(g.relu(exposed), "a")
    shared = g.gemm(x, w, name="shared", alpha=2.0)
    g.output(g.add(g.relu(shared), g.sigmoid(shared)), "b")  # two consumers
    elsewhere = g.gemm(x, w, name="elsewhere", alpha=3.0, device="cuda:1")
    g.output(g.relu(elsewhere), "c")  # another device
    g.output(g.gelu_erf(g.gemm(x, w, alpha=4.0)), "d")  # exact GELU is not an epilogue
    g.output(g.add(g.gemm(x, w, act="relu", alpha=5.0), r), "e")  # residual after an activation
    g.output(g.add(g.gemm(x, w, alpha=6.0), g.param("row", np.ones(8, np.float32))), "f")  # broadcast: not C
    optimized, record = apply("fuse", g)
    assert record.notes == ()
    assert record.ops_after == record.ops_before
    assert_same_numerics(g, optimized, rng)


def test_rewrites_keep_placement(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    g.output(g.relu(g.matmul(x, weights(g, rng, "w", (16, 8)), device="cuda:1"), device="cuda:1"), "y")
    optimized, _ = PassManager(resolve(["canonicalize", "fuse"]), verify_each=True).run(g)
    assert [(n.op, n.attrs["act"], n.device) for n in optimized.nodes] == [("gemm", "relu", "cuda:1")]


def test_fuse_keeps_dtypes_consistent(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float16")
    g.output(g.relu(g.gemm(x, weights(g, rng, "w", (16, 8), "float16"))), "y")
    optimized, _ = apply("fuse", g)
    assert [n.op for n in optimized.nodes] == ["gemm"]
    assert optimized.outputs["y"].type.dtype == "float16"
    assert_same_numerics(g, optimized, rng, "float16")


# --- the default pipeline and the pass manager --------------------------------------------------------------------
def test_default_pipeline_on_a_residual_mlp(rng):
    g = Graph("g")
    x = g.input("x", ("batch", 32), "float32")
    h = g.gelu(g.add(g.matmul(x, weights(g, rng, "w1", (32, 32))), g.param("b1", random_array(rng, (32,), "float32"))))
    h = g.add(g.matmul(h, weights(g, rng, "w2", (32, 32))), x)  # residual
    row_bias = g.param("b3", random_array(rng, (1, 10), "float32"))  # a (1, N) row: reshaped, then folded
    g.output(g.add(g.matmul(h, weights(g, rng, "w3", (32, 10))), row_bias), "y")
    optimized, records = PassManager(resolve(None), verify_each=True).run(g)
    assert [n.op for n in optimized.nodes] == ["gemm", "gemm", "gemm"]
    assert [n.attrs["act"] for n in optimized.nodes] == ["gelu", "none", "none"]
    assert optimized.nodes[1].inputs[3].name == "x"
    bound = optimized.clone()
    bound.inputs[0].type = ge2.ir.TensorType((6, 32), "float32")
    bound, _ = apply("infer_shapes", bound)
    assert_same_numerics(g, bound, rng)
    assert [r.name for r in records] == list(ge2.passes.DEFAULT_PIPELINE)


def test_pass_manager_leaves_the_input_graph_alone(rng):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    g.output(g.relu(g.matmul(x, weights(g, rng, "w", (16, 8)))), "y")
    text = str(g)
    PassManager(resolve(None)).run(g)
    assert str(g) == text


def test_pass_manager_verifies_after_each_pass_when_asked(rng):
    def break_types(graph):
        graph.nodes[0].outputs[0].type = ge2.ir.TensorType((1, 1), "float32")
        return ["broke it"]

    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    g.output(g.relu(g.matmul(x, weights(g, rng, "w", (16, 8)))), "y")
    PassManager([Pass("broken", break_types)]).run(g)  # not asked: no check
    with pytest.raises(ValueError, match=r"after pass 'broken': node 'matmul_0'"):
        PassManager([Pass("broken", break_types)], verify_each=True).run(g)


def test_dump_ir_prints_before_and_after_each_pass(rng, monkeypatch, capsys):
    g = Graph("g")
    x = g.input("x", (4, 16), "float32")
    g.output(g.relu(g.matmul(x, weights(g, rng, "w", (16, 8)))), "y")
    monkeypatch.setenv("GE2_DUMP_IR", "1")
    PassManager(resolve(["canonicalize", "fuse"])).run(g)
    err = capsys.readouterr().err
    assert "// ----- before canonicalize -----" in err and "// ----- after fuse (1 change(s)) -----" in err
    assert "matmul(%x, %w)" in err and '{act="relu"}' in err


def test_unknown_pass_name():
    with pytest.raises(ValueError, match="unknown pass 'fusion'"):
        resolve(["fusion"])


def test_rules_that_never_converge_raise(rng):
    def rebuild(graph, y):
        return graph.relu(y.producer.inputs[0])

    g = Graph("g")
    g.output(g.relu(g.input("x", (2,), "float32")), "y")
    with pytest.raises(RuntimeError, match="did not converge"):
        rewrite(g.clone(), [(Pat("relu", name="y"), rebuild)])
