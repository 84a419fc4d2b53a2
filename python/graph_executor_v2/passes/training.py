"""Passes around autograd: the forward fusion a trainer can differentiate, and the backward fusions.

- ``fuse_relu``: gemm epilogue fusion of residual adds and ReLU only. ReLU's derivative reads its output, so the
  fused gemm keeps everything the backward needs; GELU/SiLU stay separate nodes, whose saved input (the
  pre-activation) the backward reads (fusing them would recompute the pre-activation GEMM in the backward).
- ``chain_activation_backward``: ``act_backward(gemm_backward(...).da, p)`` where the gemm's ``a`` is ``act(p)``
  (or, for ReLU, ``a`` itself) becomes one ``gemm_backward`` with ``a_act``/``a_preact``: the activation's
  derivative applied to dA by the gemm's backward (cuBLASLt DGELU epilogue or its post-kernel) instead of a node.
- ``trim_gemm_backward``: a gemm_backward output nothing reads (dA of the first layer) is not computed.
"""
from __future__ import annotations

from ..ir.graph import Graph
from .fusion import fuse_activation, fuse_residual
from .pattern import Pat, Rule, rewrite

CHAINABLE = ("relu", "gelu", "silu")

RELU_RULES: list[Rule] = [
    (Pat("add", (Pat("gemm", name="mm"), Pat(name="residual")), any_order=True), fuse_residual),
    (Pat(("relu",), (Pat("gemm", name="mm"),), name="y"), fuse_activation),
]


def fuse_relu(graph: Graph) -> list:
    return rewrite(graph, RELU_RULES)


def chain_activation_backward(graph: Graph) -> list[str]:
    notes = []
    for node in list(graph.nodes):
        act = node.op[:-len("_backward")] if node.op.endswith("_backward") else None
        if act not in CHAINABLE or node not in graph.nodes:
            continue
        da, preact = node.inputs
        gemm_bwd = da.producer
        if gemm_bwd is None or gemm_bwd.op != "gemm_backward" or gemm_bwd.outputs[0] is not da:
            continue
        if gemm_bwd.attrs["a_act"] != "none" or graph.is_output(da) or len(graph.users().get(da, [])) != 1:
            continue
        a = gemm_bwd.inputs[1]
        produced_by_act = a.producer is not None and a.producer.op == act and a.producer.inputs[0] is preact
        if not (produced_by_act or (act == "relu" and a is preact)) or preact.type != a.type:
            continue
        with graph.inserting_before(node):
            chained = graph.gemm_backward(*gemm_bwd.inputs[:3], preact, **{**gemm_bwd.attrs, "a_act": act})
        graph.replace_uses(node.outputs[0], chained[0])
        for old, new in zip(gemm_bwd.outputs[1:], chained[1:]):
            graph.replace_uses(old, new)
        graph.remove_node(node)
        graph.remove_node(gemm_bwd)
        notes.append(f"fused {node.name} ({node.op}) into {chained[0].producer.name} (gemm_backward a_act={act})")
    return notes


def trim_gemm_backward(graph: Graph) -> list[str]:
    users = graph.users()
    notes = []
    for node in graph.nodes:
        if node.op != "gemm_backward":
            continue
        for value, flag in zip(node.outputs, ("with_da", "with_db", "with_dbias")):
            if node.attrs[flag] and not users.get(value) and not graph.is_output(value):
                node.attrs[flag] = False
                notes.append(f"{node.name}: {value.name} is not computed (nothing reads it)")
    return notes
