"""Epilogue fusion into gemm: an activation after it becomes its ``act``, a residual add its ``beta * C``.

The pattern matcher applies ONNX Runtime's guards to the gemm being absorbed (its only consumer is the fused
node, it is not a graph output, same device); each rule adds the dtype and shape checks. A residual is fused
before the activation that may follow it (gemm's epilogue computes ``act(alpha*A@B + beta*C + bias)``).
"""
from __future__ import annotations

from ..ir.graph import Graph, Value
from .pattern import Pat, Rule, rewrite

# elementwise op -> gemm ``act``: the activations cuBLASLt's epilogue or GE2's post-kernel compute (GELU: tanh form)
GEMM_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu"}


# act(gemm(a, b, bias, c)) = gemm(a, b, bias, c, act=act)
def fuse_activation(graph: Graph, mm: Value, y: Value):
    gemm = mm.producer
    if gemm.attrs["act"] != "none" or y.type != mm.type:
        return None
    return graph.gemm(*gemm.inputs, **{**gemm.attrs, "act": GEMM_ACTIVATIONS[y.producer.op]})


# gemm(a, b, bias) + r = gemm(a, b, bias, c=r, beta=1) for a full M x N residual r of the gemm's dtype
def fuse_residual(graph: Graph, mm: Value, residual: Value):
    gemm = mm.producer
    a, b, bias, c = gemm.inputs
    if c is not None or gemm.attrs["act"] != "none" or residual.type != mm.type:
        return None
    return graph.gemm(a, b, bias, residual, **{**gemm.attrs, "beta": 1.0})


RULES: list[Rule] = [
    (Pat("add", (Pat("gemm", name="mm"), Pat(name="residual")), any_order=True), fuse_residual),
    (Pat(tuple(GEMM_ACTIVATIONS), (Pat("gemm", name="mm"),), name="y"), fuse_activation),
]


def fuse(graph: Graph) -> list:
    return rewrite(graph, RULES)
