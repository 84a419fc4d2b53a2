"""The attention pass both frontends share (passes/attention_fusion.py) on ONNX graphs built with onnx.helper, one
per form the exporters write: BERT's padding mask from an attention_mask input, T5's relative position bias (float32
softmax of float16 scores), GPT-2's Where on a causal constant, the dynamo exporter's decomposition of
scaled_dot_product_attention, Llama's repeat_kv and RoPE's rotate-half. Each is imported, checked to become what
the pass promises (op counts, attributes) and run against float64 NumPy on the CPU backend and on CUDA (``gpu``)."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.frontend import onnx as onnx_frontend  # noqa: E402
from graph_executor_v2.testing import assert_close  # noqa: E402

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
LOWEST = float(np.finfo(np.float32).min)
HEADS, DIM = 2, 8
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _model(nodes, inputs, initializers, elem=FLOAT, opset=18):
    graph = helper.make_graph(nodes, "attention", inputs, [helper.make_tensor_value_info("y", elem, None)],
                              initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _array(name, values, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(values, dtype), name)


def _attention64(q, k, v, bias=0.0, scale=None):
    """softmax(q k^T * scale + bias) v in float64 on [batch, heads, seq, dim] arrays."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scores = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale) + bias
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


def _heads(x):
    """[batch, seq, heads * dim] -> [batch, heads, seq, dim] (NumPy)."""
    return x.reshape(x.shape[0], x.shape[1], HEADS, DIM).transpose(0, 2, 1, 3)


def _executor(loaded, device):
    return ge2.ExecutorV2(loaded, device=device, precision="highest")


def _attention_node(loaded):
    (node,) = [node for node in loaded.nodes if node.op == "attention"]
    return node


# --- BERT: scores / sqrt(d) + (1 - mask) * lowest, the mask an int64 input ----------------------------------------
def _bert_model(batch, seq=6):
    width = HEADS * DIM
    split = [helper.make_node("Reshape", [f"{n}_in", "split_shape"], [f"{n}_split"]) for n in "qkv"]
    split += [helper.make_node("Transpose", [f"{n}_split"], [f"{n}h"], perm=[0, 2, 1, 3]) for n in "qkv"]
    nodes = split + [
        helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qh", "kt"], ["scores"]),
        helper.make_node("Div", ["scores", "root_d"], ["scaled"]),
        helper.make_node("Unsqueeze", ["mask", "axes_1_2"], ["mask4"]),
        helper.make_node("Cast", ["mask4"], ["mask_float"], to=FLOAT),
        helper.make_node("Sub", ["one", "mask_float"], ["hidden"]),
        helper.make_node("Mul", ["hidden", "lowest"], ["extended"]),
        helper.make_node("Add", ["scaled", "extended"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
        helper.make_node("MatMul", ["probabilities", "vh"], ["context"]),
        helper.make_node("Transpose", ["context"], ["merged"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["merged", "merge_shape"], ["y"])]
    initializers = [_array("split_shape", [0, 0, HEADS, DIM], np.int64), _array("merge_shape", [0, 0, width], np.int64),
                    _array("root_d", np.sqrt(DIM)), _array("axes_1_2", [1, 2], np.int64), _array("one", 1.0),
                    _array("lowest", LOWEST)]
    inputs = [helper.make_tensor_value_info(f"{n}_in", FLOAT, [batch, seq, width]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT64, [batch, seq]))
    return _model(nodes, inputs, initializers)


def _bert_feeds(rng, batch, seq=6):
    feeds = {f"{n}_in": rng.standard_normal((batch, seq, HEADS * DIM)).astype(np.float32) for n in "qkv"}
    mask = np.ones((batch, seq), np.int64)
    mask[0, -2:] = 0  # padding: the last keys of the first sequence are hidden
    feeds["mask"] = mask
    return feeds


def _bert_expected(feeds):
    bias = ((1.0 - feeds["mask"]) * LOWEST)[:, None, None, :]
    y = _attention64(*(_heads(feeds[f"{n}_in"]) for n in "qkv"), bias=bias)
    return y.transpose(0, 2, 1, 3).reshape(feeds["q_in"].shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [2, "batch"])
def test_bert_padding_mask_becomes_the_attention_bias(rng, device, batch):
    loaded = onnx_frontend.load(_bert_model(batch))
    counts = loaded.op_counts()
    assert counts.get("attention") == 1 and not {"softmax", "matmul"} & set(counts), counts
    node = _attention_node(loaded)
    assert node.inputs[3] is not None and not node.attrs["causal"]
    assert node.attrs["scale"] == pytest.approx(1 / np.sqrt(DIM))
    executor = _executor(loaded, device)
    for rows in (2,) if batch == 2 else (2, 3):  # a symbolic batch: one executor, two sizes
        feeds = _bert_feeds(rng, rows)
        assert_close(executor.run(feeds)["y"], _bert_expected(feeds), "float32", reduction_length=DIM)


# --- T5: no scale, the relative position bias (+ the padding mask) added, softmax in float32 -------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("device", DEVICES)
def test_t5_relative_position_bias_becomes_the_attention_bias(rng, device, dtype):
    batch, seq, buckets = 2, 5, 8
    elem = FLOAT if dtype == "float32" else FLOAT16
    numpy_dtype = np.dtype(dtype)
    positions = np.arange(seq)
    bucket_ids = np.clip(positions[None, :] - positions[:, None] + buckets // 2, 0, buckets - 1).astype(np.int64)
    table = rng.standard_normal((buckets, HEADS)).astype(numpy_dtype)
    nodes = [helper.make_node("Gather", ["table", "bucket_ids"], ["rows"], axis=0),  # [seq, seq, heads]: folded
             helper.make_node("Transpose", ["rows"], ["per_head"], perm=[2, 0, 1]),
             helper.make_node("Unsqueeze", ["per_head", "axis_0"], ["position_bias"]),
             helper.make_node("Add", ["position_bias", "padding"], ["bias"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Add", ["scores", "bias"], ["logits"]),
             helper.make_node("Cast", ["logits"], ["logits32"], to=FLOAT),
             helper.make_node("Softmax", ["logits32"], ["probabilities32"], axis=-1),
             helper.make_node("Cast", ["probabilities32"], ["probabilities"], to=elem),
             helper.make_node("MatMul", ["probabilities", "v"], ["y"])]
    shape = [batch, HEADS, seq, DIM]
    inputs = [helper.make_tensor_value_info(n, elem, shape) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("padding", elem, [batch, 1, 1, seq]))
    model = _model(nodes, inputs, [numpy_helper.from_array(table, "table"), _array("bucket_ids", bucket_ids, np.int64),
                                   _array("axis_0", [0], np.int64)], elem)
    loaded = onnx_frontend.load(model)
    counts = loaded.op_counts()
    assert counts.get("attention") == 1 and not {"softmax", "matmul", "cast"} & set(counts), counts
    node = _attention_node(loaded)
    assert node.attrs["scale"] == 1.0 and node.inputs[3] is not None
    feeds = {n: rng.standard_normal(shape).astype(numpy_dtype) for n in "qkv"}
    padding = np.zeros((batch, 1, 1, seq), numpy_dtype)
    padding[1, ..., -1] = np.finfo(numpy_dtype).min
    feeds["padding"] = padding
    bias = table.astype(np.float64)[bucket_ids].transpose(2, 0, 1)[None] + padding.astype(np.float64)
    expected = _attention64(feeds["q"], feeds["k"], feeds["v"], bias=bias, scale=1.0)
    assert_close(_executor(loaded, device).run(feeds)["y"], expected, dtype, reduction_length=DIM)


# --- GPT-2: Where(causal keep-mask, scores / sqrt(d), lowest), heads split by transposes -------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_gpt2_where_on_a_causal_constant_becomes_causal_attention_on_the_projections(rng, device):
    batch, seq = 2, 6
    keep = np.tril(np.ones((seq, seq), bool)).reshape(1, 1, seq, seq)
    nodes = [helper.make_node("Transpose", [n], [f"{n}h"], perm=[0, 2, 1, 3]) for n in "qkv"] + [
        helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qh", "kt"], ["scores"]),
        helper.make_node("Div", ["scores", "root_d"], ["scaled"]),
        helper.make_node("Where", ["keep", "scaled", "lowest"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
        helper.make_node("MatMul", ["probabilities", "vh"], ["y"])]
    shape = [batch, seq, HEADS, DIM]
    model = _model(nodes, [helper.make_tensor_value_info(n, FLOAT, shape) for n in "qkv"],
                   [_array("root_d", np.sqrt(DIM)), _array("lowest", LOWEST), _array("keep", keep, bool)])
    loaded = onnx_frontend.load(model)
    node = _attention_node(loaded)
    assert node.attrs["causal"] and node.attrs["layout"] == "bshd" and node.inputs[3] is None
    assert [x.name for x in node.inputs[:3]] == [v.name for v in loaded.inputs]  # the head transposes went away
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    bias = np.where(keep, 0.0, -np.inf)
    expected = _attention64(*(feeds[n].transpose(0, 2, 1, 3) for n in "qkv"), bias=bias)
    assert_close(_executor(loaded, device).run(feeds)["y"], expected, "float32", reduction_length=DIM)


# --- Where(hidden keys, -inf, scores), the condition computed from a graph input (a boolean padding mask) -----------
def test_where_on_hidden_keys_from_an_input_becomes_a_keep_mask_bias(rng):
    batch, seq = 2, 5
    nodes = [helper.make_node("Not", ["keep"], ["hidden"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Mul", ["scale", "scores"], ["scaled"]),
             helper.make_node("Where", ["hidden", "minus_inf", "scaled"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probabilities"], axis=3),
             helper.make_node("MatMul", ["probabilities", "v"], ["y"])]
    shape = [batch, HEADS, seq, DIM]
    inputs = [helper.make_tensor_value_info(n, FLOAT, shape) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, [batch, 1, 1, seq]))
    loaded = onnx_frontend.load(_model(nodes, inputs, [_array("scale", 0.25), _array("minus_inf", -np.inf)]))
    node = _attention_node(loaded)
    assert node.attrs["scale"] == 0.25 and node.inputs[3] is not None and "softmax" not in loaded.op_counts()
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    feeds["keep"] = np.ones((batch, 1, 1, seq), bool)
    feeds["keep"][1, ..., 2:] = False
    expected = _attention64(feeds["q"], feeds["k"], feeds["v"], bias=np.where(feeds["keep"], 0.0, -np.inf),
                            scale=0.25)
    assert_close(_executor(loaded, "cpu").run(feeds)["y"], expected, "float32", reduction_length=DIM)


# --- the dynamo exporter's scaled_dot_product_attention: q * sqrt(s), reshaped K^T * sqrt(s), + causal mask, Dropout
@pytest.mark.parametrize("batch", [2, "batch"])
@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_decomposition_with_a_reshaped_key_transpose(rng, device, batch):
    """K^T as torchlib writes it: Reshape(k, [-1, s, d]) -> Transpose (0, 2, 1) -> Reshape to Shape(k)[:2] + [d, s];
    the probabilities' NaN rows (keys all hidden) are zeroed by Where(IsNaN(p), 0, p), then pass a Dropout whose mask
    output is named but unread."""
    seq = 5
    root_scale = np.sqrt(0.3)
    causal = np.where(np.tril(np.ones((seq, seq), bool)), 0.0, LOWEST).astype(np.float32)
    nodes = [helper.make_node("Mul", ["q", "root_scale"], ["q_scaled"]),
             helper.make_node("Shape", ["k"], ["k_shape"]),
             helper.make_node("Slice", ["k_shape", "zero", "two"], ["k_leading"]),
             helper.make_node("Concat", ["k_leading", "dim_seq"], ["kt_shape"], axis=0),
             helper.make_node("Reshape", ["k", "flat_shape"], ["k_flat"]),
             helper.make_node("Transpose", ["k_flat"], ["kt_flat"], perm=[0, 2, 1]),
             helper.make_node("Reshape", ["kt_flat", "kt_shape"], ["kt"]),
             helper.make_node("Mul", ["kt", "root_scale"], ["kt_scaled"]),
             helper.make_node("MatMul", ["q_scaled", "kt_scaled"], ["scores"]),
             helper.make_node("Add", ["scores", "causal"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
             helper.make_node("IsNaN", ["probabilities"], ["nan_rows"]),
             helper.make_node("Where", ["nan_rows", "zero_float", "probabilities"], ["zeroed"]),
             helper.make_node("Dropout", ["zeroed", "ratio"], ["kept", "dropout_mask"]),
             helper.make_node("MatMul", ["kept", "v"], ["y"])]
    shape = [batch, HEADS, seq, DIM]
    model = _model(nodes, [helper.make_tensor_value_info(n, FLOAT, shape) for n in "qkv"],
                   [_array("root_scale", root_scale), _array("causal", causal), _array("ratio", 0.0),
                    _array("zero_float", [0.0]),
                    _array("zero", [0], np.int64), _array("two", [2], np.int64),
                    _array("dim_seq", [DIM, seq], np.int64), _array("flat_shape", [-1, seq, DIM], np.int64)])
    loaded = onnx_frontend.load(model)
    assert loaded.op_counts() == {"attention": 1}
    node = _attention_node(loaded)
    assert node.attrs["causal"] and node.attrs["scale"] == pytest.approx(0.3) and node.inputs[3] is None
    executor = _executor(loaded, device)
    for rows in (2,) if batch == 2 else (2, 3):
        feeds = {n: rng.standard_normal((rows, HEADS, seq, DIM)).astype(np.float32) for n in "qkv"}
        expected = _attention64(feeds["q"], feeds["k"], feeds["v"], bias=np.where(causal < 0, -np.inf, 0.0),
                                scale=0.3)
        assert_close(executor.run(feeds)["y"], expected, "float32", reduction_length=DIM)


# --- nn.MultiheadAttention (torchvision's ViT-B/16) through the dynamo exporter: heads split seq-first ------------
@pytest.mark.parametrize("device", DEVICES)
def test_multihead_attention_export_with_a_transposed_flat_key(rng, device):
    """q, k and v come [seq, batch * heads, dim] (MultiheadAttention works sequence-first) and are transposed to
    [batch * heads, seq, dim]; K^T = Reshape(Transpose(that, (0, 2, 1)), [b, h, d, s]), with no Reshape of a 4-d K
    under it; q and K^T each scaled by sqrt(scale). One attention node, as ViT-B/16's export needs (it fell to 12
    batched matmuls per layer, one gemm per batch entry and head)."""
    batch, seq = 3, 5
    root_scale = np.sqrt(1 / np.sqrt(DIM))
    nodes = [helper.make_node("Transpose", [f"{n}_sbd"], [f"{n}_flat"], perm=[1, 0, 2]) for n in "qkv"]
    nodes += [helper.make_node("Reshape", ["q_flat", "heads_shape"], ["q"]),
              helper.make_node("Reshape", ["v_flat", "heads_shape"], ["v"]),
              helper.make_node("Transpose", ["k_flat"], ["kt_flat"], perm=[0, 2, 1]),
              helper.make_node("Reshape", ["kt_flat", "kt_shape"], ["kt"]),
              helper.make_node("Mul", ["q", "root_scale"], ["q_scaled"]),
              helper.make_node("Mul", ["kt", "root_scale"], ["kt_scaled"]),
              helper.make_node("MatMul", ["q_scaled", "kt_scaled"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["probabilities"], axis=-1),
              helper.make_node("MatMul", ["probabilities", "v"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info(f"{n}_sbd", FLOAT, [seq, batch * HEADS, DIM]) for n in "qkv"],
                   [_array("root_scale", root_scale), _array("heads_shape", [batch, HEADS, seq, DIM], np.int64),
                    _array("kt_shape", [batch, HEADS, DIM, seq], np.int64)])
    loaded = onnx_frontend.load(model)
    assert loaded.op_counts().get("attention") == 1 and "matmul" not in loaded.op_counts()
    assert _attention_node(loaded).attrs["scale"] == pytest.approx(1 / np.sqrt(DIM))
    feeds = {f"{n}_sbd": rng.standard_normal((seq, batch * HEADS, DIM)).astype(np.float32) for n in "qkv"}
    q, k, v = (feeds[f"{n}_sbd"].transpose(1, 0, 2).reshape(batch, HEADS, seq, DIM) for n in "qkv")
    assert_close(_executor(loaded, device).run(feeds)["y"], _attention64(q, k, v), "float32", reduction_length=DIM)


# --- Llama: repeat_kv (reshape(expand(reshape))) read as grouped-query attention ---------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("key_form", ["transpose", "dynamo"])
def test_repeat_kv_becomes_grouped_query_attention(rng, device, key_form):
    """K^T a Transpose of the repeated K, or as the dynamo exporter writes Llama: Reshape(Transpose(Reshape(expanded
    K [b, h_kv, n, s, d], [b * h, s, d]), (0, 2, 1)), [b, h, d, s]), its causal mask expanded over the batch."""
    batch, seq, kv_heads, groups = 2, 5, 2, 3
    heads = kv_heads * groups
    causal = np.where(np.tril(np.ones((seq, seq), bool)), 0.0, -np.inf).astype(np.float32)
    nodes = []
    for n in "kv":
        nodes += [helper.make_node("Unsqueeze", [n, "axis_2"], [f"{n}5"]),
                  helper.make_node("Expand", [f"{n}5", "expanded_shape"], [f"{n}_expanded"]),
                  helper.make_node("Reshape", [f"{n}_expanded", "repeated_shape"], [f"{n}_repeated"])]
    if key_form == "transpose":
        nodes.append(helper.make_node("Transpose", ["k_repeated"], ["kt"], perm=[0, 1, 3, 2]))
    else:
        nodes = [node for node in nodes if node.output[0] != "k_repeated"]
        nodes += [helper.make_node("Reshape", ["k_expanded", "flat_shape"], ["k_flat"]),
                  helper.make_node("Transpose", ["k_flat"], ["kt_flat"], perm=[0, 2, 1]),
                  helper.make_node("Reshape", ["kt_flat", "kt_shape"], ["kt"])]
        causal = np.broadcast_to(causal, (batch, 1, seq, seq)).copy()
    nodes += [helper.make_node("MatMul", ["q", "kt"], ["scores"]),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
              helper.make_node("Add", ["scaled", "causal"], ["logits"]),
              helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
              helper.make_node("MatMul", ["probabilities", "v_repeated"], ["y"])]
    inputs = [helper.make_tensor_value_info("q", FLOAT, [batch, heads, seq, DIM])]
    inputs += [helper.make_tensor_value_info(n, FLOAT, [batch, kv_heads, seq, DIM]) for n in "kv"]
    model = _model(nodes, inputs, [_array("axis_2", [2], np.int64), _array("scale", 1 / np.sqrt(DIM)),
                                   _array("expanded_shape", [batch, kv_heads, groups, seq, DIM], np.int64),
                                   _array("repeated_shape", [batch, heads, seq, DIM], np.int64),
                                   _array("flat_shape", [batch * heads, seq, DIM], np.int64),
                                   _array("kt_shape", [batch, heads, DIM, seq], np.int64), _array("causal", causal)])
    loaded = onnx_frontend.load(model)
    assert loaded.op_counts() == {"attention": 1}
    node = _attention_node(loaded)
    assert node.attrs["causal"] and [x.name for x in node.inputs[:3]] == [v.name for v in loaded.inputs]
    feeds = {"q": rng.standard_normal((batch, heads, seq, DIM)).astype(np.float32)}
    feeds.update({n: rng.standard_normal((batch, kv_heads, seq, DIM)).astype(np.float32) for n in "kv"})
    repeated = [np.repeat(feeds[n], groups, axis=1) for n in "kv"]
    expected = _attention64(feeds["q"], *repeated, bias=causal.astype(np.float64))
    assert_close(_executor(loaded, device).run(feeds)["y"], expected, "float32", reduction_length=DIM)


# --- RoPE's rotate-half: concat(-x2, x1) -> roll(x, d/2) * sign -----------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("device", DEVICES)
def test_rope_rotate_half_becomes_a_roll_and_pointwise_ops(rng, device, dtype):
    batch, seq = 2, 5
    elem = FLOAT if dtype == "float32" else FLOAT16
    numpy_dtype = np.dtype(dtype)
    angles = np.arange(seq)[:, None] * (10000.0 ** (-np.arange(DIM // 2) / (DIM // 2)))[None, :]
    cos, sin = (np.concatenate([f(angles)] * 2, axis=-1).astype(numpy_dtype) for f in (np.cos, np.sin))
    nodes = [helper.make_node("Slice", ["x", "zero", "half", "last"], ["x1"]),
             helper.make_node("Slice", ["x", "half", "end", "last"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["minus_x2"]),
             helper.make_node("Concat", ["minus_x2", "x1"], ["rotated"], axis=-1),
             helper.make_node("Mul", ["x", "cos"], ["x_cos"]),
             helper.make_node("Mul", ["rotated", "sin"], ["rotated_sin"]),
             helper.make_node("Add", ["x_cos", "rotated_sin"], ["y"])]
    initializers = [_array("zero", [0], np.int64), _array("half", [DIM // 2], np.int64),
                    _array("end", [2 ** 63 - 1], np.int64), _array("last", [-1], np.int64),
                    numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")]
    shape = [batch, HEADS, seq, DIM]
    loaded = onnx_frontend.load(_model(nodes, [helper.make_tensor_value_info("x", elem, shape)], initializers, elem))
    counts = loaded.op_counts()
    assert counts == {"roll": 1, "mul": 3, "add": 1}, counts
    x = rng.standard_normal(shape).astype(numpy_dtype)
    x64 = x.astype(np.float64)
    expected = x64 * cos + np.concatenate([-x64[..., DIM // 2:], x64[..., :DIM // 2]], axis=-1) * sin
    assert_close(_executor(loaded, device).run({"x": x})["y"], expected, dtype, reduction_length=2)


def test_rotate_half_of_other_slices_and_softmax_over_another_axis_stay_as_written(rng):
    """concat(-x[..., 1:], x[..., :1]) is no rotate-half, and a softmax over the query axis is no attention."""
    batch, seq = 2, 4
    nodes = [helper.make_node("Slice", ["x", "zero", "one", "last"], ["x1"]),
             helper.make_node("Slice", ["x", "one", "end", "last"], ["x2"]),
             helper.make_node("Neg", ["x2"], ["minus_x2"]),
             helper.make_node("Concat", ["minus_x2", "x1"], ["q"], axis=-1),
             helper.make_node("Transpose", ["x"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["probabilities"], axis=2),
             helper.make_node("MatMul", ["probabilities", "x"], ["y"])]
    initializers = [_array("zero", [0], np.int64), _array("one", [1], np.int64),
                    _array("end", [2 ** 63 - 1], np.int64), _array("last", [-1], np.int64)]
    shape = [batch, HEADS, seq, DIM]
    loaded = onnx_frontend.load(_model(nodes, [helper.make_tensor_value_info("x", FLOAT, shape)], initializers))
    counts = loaded.op_counts()
    assert counts.get("concat") == 1 and counts.get("softmax") == 1 and "attention" not in counts, counts
    x = rng.standard_normal(shape).astype(np.float32)
    x64 = x.astype(np.float64)
    q = np.concatenate([-x64[..., 1:], x64[..., :1]], axis=-1)
    scores = q @ np.swapaxes(x64, -1, -2)
    weights = np.exp(scores - scores.max(2, keepdims=True))
    expected = (weights / weights.sum(2, keepdims=True)) @ x64
    assert_close(_executor(loaded, "cpu").run({"x": x})["y"], expected, "float32", reduction_length=DIM)
