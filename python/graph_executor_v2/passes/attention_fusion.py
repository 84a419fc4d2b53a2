"""Attention fusion: the written-out attention of one head becomes one ``attention`` node.

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

from ..dtypes import FLOAT_DTYPES
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


def fuse_attention(graph: Graph) -> list:
    return rewrite(graph, RULES)
