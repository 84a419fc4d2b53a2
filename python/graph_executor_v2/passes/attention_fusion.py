"""Attention fusion: the written-out attention of one head becomes one ``attention`` node, and every attention node
is simplified (``simplify_attention``, shared by both frontends): a constant causal bias becomes ``causal=True``, a
zero bias goes away, and K/V heads repeated for grouped queries (``repeat_kv``: reshape(expand(reshape(k))), or
repeat_interleave) are read directly, the op's native grouped-query attention. ``attention_bias`` turns an exporter's
mask (boolean keep-mask or additive float) into the op's bias input.

    scores = matmul(q, transpose(k, perm=(1, 0)))          q: [seq_q, d], k: [seq_k, d], v: [seq_k, d]
    scaled = mul(scores, c)  or  div(scores, c)            c: a one-element parameter
    masked = add(scaled, mask)                             optional; mask: the causal (top-left) parameter,
                                                           0 where j <= i and -inf (or finfo.min) elsewhere
    y      = matmul(softmax(masked, axis=-1), v)
  ->
    y = reshape(attention(reshape(q), reshape(k), reshape(v), scale=c or 1/c, causal=mask given)[0])

with q, k, v seen as [1, 1, seq, d]. Any other mask, a softmax over another axis, or an interior value read
elsewhere (the pattern matcher's guards) leaves the graph as it is. It runs before canonicalization, which would
turn the matmuls into gemms.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import FLOAT_DTYPES, to_numpy
from ..ir import dims
from ..ir.graph import Graph, Value
from .pattern import Pat, Rule, rewrite


def _scalar(value: Value) -> float | None:
    """The value of a one-element parameter, or None."""
    if not value.is_param or value.data.size != 1:
        return None
    scalar = float(np.asarray(value.data, dtype=np.float64).reshape(-1)[0])
    return scalar if np.isfinite(scalar) and scalar != 0 else None


def is_causal_bias(data: np.ndarray, seq_q, seq_k) -> bool:
    """Whether ``data`` is the additive top-left causal mask of [seq_q, seq_k] scores: 0 where j <= i, and
    elsewhere -inf or, as PyTorch's exported scaled_dot_product_attention writes it, a value at most half its
    dtype's lowest (finfo.min): a score plus that underflows to probability 0 as -inf does, for any scores a
    softmax of that dtype holds."""
    if not isinstance(seq_q, int) or not isinstance(seq_k, int):
        return False
    data = np.asarray(data)
    if data.shape != (seq_q, seq_k) or data.dtype.kind != "f":
        return False
    visible = np.tril(np.ones((seq_q, seq_k), dtype=bool))
    hidden = data[~visible].astype(np.float64)
    return bool((data[visible] == 0).all() and (np.isneginf(hidden) | (hidden <= np.finfo(data.dtype).min / 2)).all())


def _is_causal_mask(mask: Value, seq_q, seq_k) -> bool:
    return mask.is_param and is_causal_bias(mask.data, seq_q, seq_k)


def _fuse(graph: Graph, scores: Value, factor: Value, probs: Value, v: Value, mask: Value | None, divide: bool):
    matmul = scores.producer
    q, kt = matmul.inputs
    if kt.producer is None or kt.producer.op != "transpose" or tuple(kt.producer.attrs["perm"]) != (1, 0):
        return None
    k = kt.producer.inputs[0]
    if probs.producer.attrs["axis"] not in (-1, 1):
        return None
    scalar = _scalar(factor)
    if scalar is None:
        return None
    types = [x.type for x in (q, k, v)]
    if any(t.rank != 2 for t in types) or len({t.dtype for t in types}) != 1 or types[0].dtype not in FLOAT_DTYPES:
        return None
    (seq_q, head_dim), (seq_k, k_dim), v_shape = types[0].shape, types[1].shape, types[2].shape
    if not isinstance(head_dim, int) or k_dim != head_dim or tuple(v_shape) != (seq_k, head_dim):
        return None
    if mask is not None and not _is_causal_mask(mask, seq_q, seq_k):
        return None
    heads = [graph.reshape(x, shape=(1, 1, -1, head_dim)) for x in (q, k, v)]
    y, _ = graph.attention(*heads, causal=mask is not None, scale=1.0 / scalar if divide else scalar)
    return graph.reshape(y, shape=(-1, head_dim))


def _rule(scale_op: str, masked: bool) -> Rule:
    scores = Pat("matmul", (Pat(name="q"), Pat("transpose", name="kt")), name="scores")
    scaled = Pat(scale_op, (scores, Pat(name="factor")), any_order=scale_op == "mul")
    logits = Pat("add", (scaled, Pat(name="mask")), any_order=True) if masked else scaled
    pattern = Pat("matmul", (Pat("softmax", (logits,), name="probs"), Pat(name="v")))

    def fuse_attention(graph: Graph, scores, factor, probs, v, q=None, kt=None, mask=None):
        return _fuse(graph, scores, factor, probs, v, mask, divide=scale_op == "div")

    return pattern, fuse_attention


RULES: list[Rule] = [_rule(scale_op, masked) for masked in (True, False) for scale_op in ("mul", "div")]


def attention_bias(graph: Graph, mask: Value, q: Value, k: Value) -> Value:
    """The additive bias [1 or batch, 1 or heads, seq_q, seq_k] of the attention of [batch, heads, seq, dim] q and k
    for ``mask`` as PyTorch's scaled_dot_product_attention takes it (broadcastable to [batch, heads, seq_q, seq_k]):
    a boolean mask keeps the True positions (the others get -inf), a float mask is added as it is."""
    dtype = q.type.dtype
    if mask.type.dtype == "bool":
        zero = graph.param(graph.unique_name("mask_keep"), np.array(0, to_numpy(dtype)))
        hidden = graph.param(graph.unique_name("mask_hidden"), np.array(-np.inf, to_numpy(dtype)))
        bias = graph.where(mask, zero, hidden)
    else:
        bias = mask if mask.type.dtype == dtype else graph.cast(mask, dtype=dtype)
    if bias.type.rank > 4:
        raise ValueError(f"attn_mask: expected at most 4 dims, got shape {bias.type.shape}")
    if bias.type.rank < 4:
        bias = graph.reshape(bias, shape=(1,) * (4 - bias.type.rank) + tuple(bias.type.shape))
    batch, heads, seq_q = q.type.shape[:3]
    target = (bias.type.shape[0], bias.type.shape[1], seq_q, k.type.shape[2])
    if tuple(bias.type.shape) != target:
        bias = graph.expand(bias, shape=target)
    return bias


def _repeated_heads(value: Value) -> tuple[Value, int] | None:
    """(k, n) when ``value`` is k [batch, heads, seq, dim] with every head repeated n times in place (HF's
    repeat_kv: reshape(expand(reshape(k, [b, h, 1, s, d]), [b, h, n, s, d]), [b, h * n, s, d]), or
    repeat_interleave(k, n, axis=1)); else None."""
    node = value.producer
    if node is None:
        return None
    if node.op == "repeat_interleave" and node.attrs["axis"] % 4 == 1 and value.type.rank == 4:
        return node.inputs[0], node.attrs["repeats"]
    if node.op != "reshape" or value.type.rank != 4:
        return None
    expand = node.inputs[0].producer
    if expand is None or expand.op != "expand" or expand.outputs[0].type.rank != 5:
        return None
    inner = expand.inputs[0]
    if inner.producer is None or inner.producer.op != "reshape" or inner.type.rank != 5:
        return None
    source = inner.producer.inputs[0]
    batch, heads, one, seq, dim = inner.type.shape
    expanded = tuple(expand.outputs[0].type.shape)
    if source.type.rank != 4 or one != 1 or tuple(source.type.shape) != (batch, heads, seq, dim):
        return None
    repeats = expanded[2]
    if expanded != (batch, heads, repeats, seq, dim) or not isinstance(repeats, int):
        return None
    if tuple(value.type.shape) != (batch, dims.product(heads, repeats), seq, dim):
        return None
    return source, repeats


def _constant_value(value: Value, known: dict) -> np.ndarray | None:
    """The value of ``value`` when it depends on parameters only (an exporter's mask built from constants and
    arange comparisons), computed by the ops' references; None when it depends on an input."""
    if value.is_param:
        return np.asarray(value.data)
    node = value.producer
    if node is None or not node.opdef.pure or len(node.outputs) != 1:
        return None
    if value.name not in known:
        inputs = [None if x is None else _constant_value(x, known) for x in node.inputs]
        if any(x is None and original is not None for x, original in zip(inputs, node.inputs)):
            known[value.name] = None
        else:
            known[value.name] = node.opdef.run_reference(inputs, node.attrs)[0]
    return known[value.name]


def simplify_attention(graph: Graph) -> list[str]:
    """Every attention node: a constant causal bias (a parameter, or computed from parameters only) -> causal=True, a
    zero bias dropped, repeated K/V heads read directly (the op's grouped-query attention)."""
    notes = []
    for node in graph.nodes:
        if node.op != "attention":
            continue
        q, k, v, bias = node.inputs
        if node.attrs["layout"] == "bhsd":
            keys, values = _repeated_heads(k), _repeated_heads(v)
            if keys is not None and values is not None and keys[1] == values[1]:
                node.inputs[1], node.inputs[2] = keys[0], values[0]
                notes.append(f"{node.name}: K/V heads repeated {keys[1]}x read as grouped-query attention")
        data = None if bias is None else _constant_value(bias, {})
        if data is None:
            continue
        seq_q, seq_k = q.type.shape[2], k.type.shape[2]
        if not np.any(data):
            node.inputs[3] = None
            notes.append(f"{node.name}: zero bias dropped")
        elif data.shape[:2] == (1, 1) and is_causal_bias(data.reshape(data.shape[2:]), seq_q, seq_k):
            node.inputs[3] = None
            node.attrs["causal"] = True
            notes.append(f"{node.name}: causal bias -> causal=True")
    return notes


def fuse_attention(graph: Graph) -> list:
    return rewrite(graph, RULES) + simplify_attention(graph)
