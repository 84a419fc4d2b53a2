"""Attention with an additive bias, and the attention simplifications both frontends share
(passes/attention_fusion.py): a constant causal bias -> causal=True (also one built from arange comparisons, folded
first), repeat_kv -> grouped-query attention, masks -> the bias input; ONNX's written-out attention with a mask
from a graph input. CPU backend against float64 NumPy (and onnxruntime); the kernels that take a bias on the GPU."""
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, attention
from graph_executor_v2.passes.attention_fusion import attention_bias, fuse_attention
from graph_executor_v2.testing import assert_close, random_array


def _attention64(q, k, v, bias=None, causal=False, scale=None):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scores = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if bias is not None:
        scores = scores + bias.astype(np.float64)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("bias_shape", [(1, 1, 5, 7), (2, 1, 5, 7), (2, 4, 5, 7), (1, 4, 5, 7)])
def test_reference_adds_the_broadcast_bias(rng, bias_shape):
    q, k, v = (random_array(rng, s, "float32") for s in ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)))
    bias = random_array(rng, bias_shape, "float32")
    bias[..., -2:] = -np.inf  # hidden keys
    y, lse = attention.reference(q, k, v, bias=bias)
    assert_close(y, _attention64(q, k, v, bias), "float32", 8)
    dq, dk, dv = attention.reference_backward(random_array(rng, q.shape, "float32"), q, k, v, bias=bias)
    assert dq.shape == q.shape and dk.shape == k.shape and np.isfinite(dq).all()


def test_bias_inference_names_shape_and_dtype():
    t = TensorType
    q, kv = t((2, 4, 5, 8), "float16"), t((2, 2, 7, 8), "float16")
    attrs = OPS["attention"].validate_attrs({}, "attention")
    assert OPS["attention"].infer([q, kv, kv, t((2, 1, 5, 7), "float16")], attrs)[0] == q
    with pytest.raises(ValueError, match=r"bias: expected shape \[1 or 2, 1 or 4, 5, 7\], got \(3, 1, 5, 7\)"):
        OPS["attention"].infer([q, kv, kv, t((3, 1, 5, 7), "float16")], attrs)
    with pytest.raises(TypeError, match="bias: expected dtype float16"):
        OPS["attention"].infer([q, kv, kv, t((1, 1, 5, 7), "float32")], attrs)
    with pytest.raises(ValueError, match="bias: expected a rank-4 array"):
        OPS["attention"].infer([q, kv, kv, t((5, 7), "float16")], attrs)


def _graph(with_repeat=False, bias_kind=None, causal_from_arange=False):
    """attention on [2, 4, 5, 8] q and [2, 2, 5, 8] K/V (or those repeated 2x with repeat_kv's reshape/expand)."""
    g = ge2.ir.Graph("masks")
    q = g.input("q", (2, 4, 5, 8), "float32")
    k = g.input("k", (2, 2, 5, 8), "float32")
    v = g.input("v", (2, 2, 5, 8), "float32")
    if with_repeat:
        def repeat(x):
            inner = g.reshape(x, shape=(2, 2, 1, 5, 8))
            return g.reshape(g.expand(inner, shape=(2, 2, 2, 5, 8)), shape=(2, 4, 5, 8))

        k, v = repeat(k), repeat(v)
    bias = None
    if bias_kind == "causal_param":
        bias = g.param("causal", np.where(np.tril(np.ones((5, 5), bool)), 0, -np.inf).astype(np.float32)
                       .reshape(1, 1, 5, 5))
    elif bias_kind == "arange":  # positions compared, as exporters build the causal mask
        rows = g.param("rows", np.arange(5, dtype=np.int64).reshape(5, 1))
        cols = g.param("cols", np.arange(5, dtype=np.int64).reshape(1, 5))
        keep = g.reshape(g.less_equal(cols, rows), shape=(1, 1, 5, 5))
        bias = attention_bias(g, keep, q, k)
    elif bias_kind == "padding":
        mask = g.input("mask", (2, 5), "bool")
        bias = attention_bias(g, g.reshape(mask, shape=(2, 1, 1, 5)), q, k)
    y, _ = g.attention(q, k, v, bias)
    g.output(y, "y")
    return g


@pytest.mark.parametrize("bias_kind", ["causal_param", "arange"])
def test_constant_causal_bias_becomes_causal(rng, bias_kind):
    g = _graph(bias_kind=bias_kind)
    executor = ge2.ExecutorV2(g)
    (node,) = [n for n in executor.optimized_graph.nodes if n.op == "attention"]
    assert node.attrs["causal"] and node.inputs[3] is None, node
    feeds = {n: random_array(rng, v.type.shape, "float32") for n, v in zip("qkv", g.inputs)}
    assert_close(executor.run(feeds)["y"], _attention64(feeds["q"], feeds["k"], feeds["v"], causal=True), "float32", 8)


def test_a_constant_bias_of_symbolic_shape_waits_for_the_plan(rng):
    """A constant expanded to the sequence length (T5's full_like of the positions, exported with a symbolic
    sequence) is no constant before the plan binds the length: the pass leaves it, and one executor runs two
    lengths with it."""
    g = ge2.ir.Graph("symbolic_bias")
    q, k, v = (g.input(name, (2, 2, "s", 8), "float32") for name in "qkv")
    bias = g.expand(g.param("half", np.array(0.5, np.float32)), shape=(1, 1, "s", "s"))
    y, _ = g.attention(q, k, v, bias)
    g.output(y, "y")
    executor = ge2.ExecutorV2(g)
    for sequence in (5, 3):
        feeds = {name: random_array(rng, (2, 2, sequence, 8), "float32") for name in "qkv"}
        assert_close(executor.run(feeds)["y"], _attention64(feeds["q"], feeds["k"], feeds["v"]), "float32", 8)


def test_repeat_kv_becomes_grouped_query_attention(rng):
    g = _graph(with_repeat=True)
    notes = fuse_attention(g)
    (node,) = [n for n in g.nodes if n.op == "attention"]
    assert [v.name for v in node.inputs[1:3]] == ["k", "v"], notes
    feeds = {n: random_array(rng, v.type.shape, "float32") for n, v in zip("qkv", g.inputs)}
    assert_close(ge2.ExecutorV2(g).run(feeds)["y"], _attention64(feeds["q"], feeds["k"], feeds["v"]), "float32", 8)


def test_padding_mask_from_an_input_is_the_bias(rng):
    g = _graph(bias_kind="padding")
    feeds = {n: random_array(rng, v.type.shape, "float32") for n, v in zip("qkv", g.inputs)}
    feeds["mask"] = np.ones((2, 5), bool)
    feeds["mask"][1, 3:] = False
    bias = np.where(feeds["mask"], 0.0, -np.inf).reshape(2, 1, 1, 5)
    got = ge2.ExecutorV2(g).run(feeds)["y"]
    assert_close(got, _attention64(feeds["q"], feeds["k"], feeds["v"], bias), "float32", 8)


@pytest.mark.parametrize("dropout_p, fused", [(0.0, True), (0.1, False)])
def test_written_out_4d_attention_in_ge2_ir(rng, dropout_p, fused):
    """matmul(dropout(cast(softmax(cast(q k^T / c + bias)))), v) as the torch frontend writes eager attention
    (float16 scores, softmax in float32, dropout at p = 0): one attention node with the bias; a real dropout keeps
    the graph as it is."""
    g = ge2.ir.Graph("eager_attention")
    q, k, v = (g.input(n, (2, 3, 5, 8), "float16") for n in "qkv")
    bias = g.input("bias", (2, 1, 1, 5), "float16")
    scores = g.div(g.matmul(q, g.transpose(k, perm=(0, 1, 3, 2))), g.param("root_d", np.array(8 ** 0.5, np.float16)))
    probs = g.cast(g.softmax(g.cast(g.add(scores, bias), dtype="float32"), axis=-1), dtype="float16")
    y = g.matmul(g.dropout(probs, p=dropout_p, seed=0), v)
    g.output(y, "y")
    notes = fuse_attention(g)
    counts = g.op_counts()
    assert (counts.get("attention", 0) == 1) == fused and ("softmax" in counts) != fused, (counts, notes)
    if not fused:
        return
    (node,) = [n for n in g.nodes if n.op == "attention"]
    assert node.attrs["scale"] == pytest.approx(1 / float(np.float16(8 ** 0.5))) and node.inputs[3] is not None
    feeds = {n: random_array(rng, (2, 3, 5, 8), "float16") for n in "qkv"}
    feeds["bias"] = np.zeros((2, 1, 1, 5), np.float16)
    feeds["bias"][0, ..., -2:] = -np.inf
    expected = _attention64(feeds["q"], feeds["k"], feeds["v"], feeds["bias"])
    assert_close(ge2.ExecutorV2(g).run(feeds)["y"], expected, "float16", 8)


def test_onnx_written_out_attention_with_a_mask_input(rng):
    onnx = pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from graph_executor_v2.frontend import onnx as onnx_frontend

    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "mask"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
             helper.make_node("MatMul", ["probabilities", "v"], ["y"])]
    shape = [2, 3, 5, 8]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [2, 1, 1, 5]))
    graph = helper.make_graph(nodes, "masked", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(8 ** -0.5, np.float32), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    loaded = onnx_frontend.load(model)
    assert loaded.op_counts().get("attention") == 1 and "softmax" not in loaded.op_counts(), loaded.op_counts()
    feeds = {n: random_array(rng, shape, "float32") for n in "qkv"}
    feeds["mask"] = np.where(rng.random((2, 1, 1, 5)) < 0.3, -1e9, 0.0).astype(np.float32)
    feeds["mask"][..., 0] = 0
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = ge2.ExecutorV2(loaded).run(feeds)["y"]
    np.testing.assert_allclose(got, session.run(None, feeds)[0], rtol=1e-5, atol=1e-6)


# --- GPU: the kernels that take a bias ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kernel", ["auto", "rowwise", "cudnn"])
@pytest.mark.parametrize("bias_shape, causal", [((2, 1, 9, 11), False), ((1, 1, 9, 11), True), ((2, 4, 9, 11), False)])
def test_biased_attention_kernels(rng, poisoned, to_device, dtype, kernel, bias_shape, causal):
    if kernel == "cudnn" and (dtype == "float32" or not attention.has_cudnn()):
        pytest.skip("cudnn takes float16 and bfloat16, where it is built")
    q = random_array(rng, (2, 4, 9, 64), dtype)
    k, v = random_array(rng, (2, 2, 11, 64), dtype), random_array(rng, (2, 2, 11, 64), dtype)
    bias = random_array(rng, bias_shape, dtype)
    bias[..., 7:] = -np.inf  # keys hidden by the mask (every row keeps keys 0..6)
    y_out, lse_out = poisoned(q.shape, dtype), poisoned((2, 4, 9), "float32")
    y, lse = attention.forward(*(to_device(x) for x in (q, k, v, bias)), causal=causal, kernel=kernel,
                               out=(y_out, lse_out))
    expected, expected_lse = attention.reference(q, k, v, causal=causal, bias=bias)
    got = y.numpy()
    print(kernel, dtype, bias_shape, causal, "max |error|", float(np.abs(got.astype(np.float64) - expected).max()))
    assert_close(got, expected, dtype, 64, what=f"{kernel} biased attention")
    assert_close(lse.numpy(), expected_lse, "float32", 64, what=f"{kernel} lse")
    dy = random_array(rng, q.shape, dtype)
    grads = attention.backward(to_device(dy), *(to_device(x) for x in (q, k, v, bias)), causal=causal, kernel=kernel)
    expected_grads = attention.reference_backward(dy, q, k, v, causal=causal, bias=bias)
    assert grads[3] is None
    for name, grad, want in zip(("dq", "dk", "dv"), grads, expected_grads):
        assert_close(grad.numpy(), want, dtype, 64, what=f"{kernel} biased attention {name}")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["flash", "unfused"])
def test_kernels_without_a_bias_decline_it(rng, to_device, kernel):
    q = random_array(rng, (1, 2, 4, 64), "float16")
    bias = np.zeros((1, 1, 4, 4), np.float16)
    with pytest.raises(ValueError, match="takes no additive bias"):
        attention.forward(*(to_device(x) for x in (q, q, q, bias)), kernel=kernel)
