"""Inference batch norm folded into the convolution before it:

    batch_norm(conv2d(x, w, b), gamma, beta, mean, var) = conv2d(x, w * s, (b - mean) * s + beta),
    s = gamma / sqrt(var + eps) per output channel

Guards, in ONNX Runtime's style: the batch norm is in inference mode (``training=False``); its x comes from a ``conv2d``
with no fused activation or residual and the same layout, read by nothing else and not a graph output; its other outputs
(saved statistics, running statistics) are unused; the weights, the conv bias (if any) and the four statistics are
parameters (constants), so the new weights are computed once here, in float64, and rounded to the weights' dtype. The
weight's output channels are its axis 0.
"""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Value
from .pattern import exclusive


def _fresh_param(graph: Graph, base: str, array: np.ndarray) -> Value:
    """A parameter under ``base`` or, if taken, ``base_1``, ``base_2``, ..."""
    name, index = base, 0
    while name in graph.params or any(name == v.name for v in graph.inputs) or \
            any(name == o.name for node in graph.nodes for o in node.outputs):
        index += 1
        name = f"{base}_{index}"
    return graph.param(name, array)


def fold_batch_norm(graph: Graph) -> list[str]:
    notes = []
    for bn in list(graph.nodes):
        if bn.op != "batch_norm" or bn.attrs["training"]:
            continue
        users = graph.users()
        y = bn.inputs[0]
        conv = y.producer
        if conv is None or conv.op != "conv2d" or conv.attrs.get("act", "none") != "none":
            continue
        if len(conv.inputs) > 3 and conv.inputs[3] is not None:  # a fused residual is not scaled by the norm
            continue
        if conv.attrs["layout"] != bn.attrs["layout"] or not exclusive(graph, users, y, bn):
            continue
        if any(users.get(v) or graph.is_output(v) for v in bn.outputs[1:]):
            continue
        x, w, bias = conv.inputs[0], conv.inputs[1], conv.inputs[2] if len(conv.inputs) > 2 else None
        statistics = bn.inputs[1:]
        if not w.is_param or (bias is not None and not bias.is_param) or not all(v.is_param for v in statistics):
            continue
        gamma, beta, mean, var = (v.data.astype(np.float64) for v in statistics)
        scale = gamma / np.sqrt(var + bn.attrs["eps"])
        if w.type.shape[0] != scale.shape[0]:
            continue
        weights = w.data.astype(np.float64) * scale.reshape((-1,) + (1,) * (w.data.ndim - 1))
        old_bias = 0.0 if bias is None else bias.data.astype(np.float64)
        bias_dtype = w.data.dtype if bias is None else bias.data.dtype
        new_w = _fresh_param(graph, f"{w.name}_bn_folded", weights.astype(w.data.dtype))
        new_bias = _fresh_param(graph, f"{conv.name}_bias_bn_folded", ((old_bias - mean) * scale + beta)
                                .astype(bias_dtype))
        with graph.inserting_before(bn):
            folded = graph.conv2d(x, new_w, new_bias, **conv.attrs)
        graph.replace_uses(bn.outputs[0], folded)
        graph.remove_node(bn)
        graph.remove_node(conv)
        notes.append(f"fold_batch_norm: {conv.name} + {bn.name} -> {folded.producer.name}")
    return notes
