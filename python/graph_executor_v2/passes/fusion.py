"""Epilogue fusion into gemm and conv2d: an activation after either (or after a reshape of a gemm) becomes its
``act``, a residual add gemm's ``beta * C`` or conv2d's ``residual``, a clip after conv2d (relu6, hardtanh) its
``clip_min``/``clip_max``.

The pattern matcher applies ONNX Runtime's guards to the node being absorbed (its only consumer is the fused node,
it is not a graph output, same device); each rule adds the dtype and shape checks. A residual is fused before the
activation that may follow it: gemm's epilogue computes ``act(alpha*A@B + beta*C + bias)`` (cuBLASLt adds C before
its bias/activation epilogue) and conv2d's ``act(conv(x, w) + bias + residual)``, both in float32 with the output
rounded once.
"""
from __future__ import annotations

from ..ir.graph import Graph, Value
from ..ops.conv2d import conv_inputs
from .pattern import Pat, Rule, rewrite

# elementwise op -> epilogue ``act`` of gemm and conv2d: what every candidate's epilogue computes (cuBLASLt's, cuDNN's
# pointwise nodes, GE2's kernels; GELU in the tanh form)
EPILOGUE_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu"}
# conv2d's epilogue also computes sigmoid (cuBLASLt's has none): a squeeze-and-excitation gate (EfficientNet's 16)
# is then no kernel launch of its own
CONV_EPILOGUE_ACTIVATIONS = {**EPILOGUE_ACTIVATIONS, "sigmoid": "sigmoid"}


# act(gemm(a, b, bias, c)) = gemm(a, b, bias, c, act=act)
def fuse_activation(graph: Graph, mm: Value, y: Value):
    gemm = mm.producer
    if gemm.attrs["act"] != "none" or y.type != mm.type:
        return None
    return graph.gemm(*gemm.inputs, **{**gemm.attrs, "act": EPILOGUE_ACTIVATIONS[y.producer.op]})


# act(reshape(gemm(a, b, bias, c))) = reshape(gemm(a, b, bias, c, act=act)): an activation is elementwise, so it
# applies before the view as well; exporters view a linear layer's 2-d product as 3-d before its activation (HF
# GPT-2's MLP: addmm, view, gelu)
def fuse_activation_through_reshape(graph: Graph, mm: Value, view: Value, y: Value):
    gemm = mm.producer
    if gemm.attrs["act"] != "none" or y.type != view.type:
        return None
    fused = graph.gemm(*gemm.inputs, **{**gemm.attrs, "act": EPILOGUE_ACTIVATIONS[y.producer.op]})
    return graph.reshape(fused, **view.producer.attrs)


# gemm(a, b, bias) + r = gemm(a, b, bias, c=r, beta=1) for a full M x N residual r of the gemm's dtype
def fuse_residual(graph: Graph, mm: Value, residual: Value):
    gemm = mm.producer
    a, b, bias, c = gemm.inputs
    if c is not None or gemm.attrs["act"] != "none" or residual.type != mm.type:
        return None
    return graph.gemm(a, b, bias, residual, **{**gemm.attrs, "beta": 1.0})


# act(conv2d(x, w, bias, residual)) = conv2d(x, w, bias, residual, act=act)
def fuse_conv_activation(graph: Graph, conv: Value, y: Value):
    node = conv.producer
    if (node.attrs["act"] != "none" or node.attrs["clip_min"] is not None or node.attrs["clip_max"] is not None
            or y.type != conv.type):
        return None
    return graph.conv2d(*conv_inputs(node.inputs), **{**node.attrs, "act": CONV_EPILOGUE_ACTIVATIONS[y.producer.op]})


# clip(conv2d(...), lo, hi) = conv2d(..., clip_min=lo, clip_max=hi): relu6 and hardtanh after a convolution
def fuse_conv_clip(graph: Graph, conv: Value, y: Value):
    node = conv.producer
    if node.attrs["clip_min"] is not None or node.attrs["clip_max"] is not None or y.type != conv.type:
        return None
    bounds = y.producer.attrs
    return graph.conv2d(*conv_inputs(node.inputs), **{**node.attrs, "clip_min": bounds["min"],
                                                      "clip_max": bounds["max"]})


# conv2d(x, w, bias) + r = conv2d(x, w, bias, residual=r) for r of the output's shape, layout and dtype
def fuse_conv_residual(graph: Graph, conv: Value, residual: Value):
    node = conv.producer
    x, w, bias, existing = conv_inputs(node.inputs)
    if (existing is not None or node.attrs["act"] != "none" or node.attrs["clip_min"] is not None
            or node.attrs["clip_max"] is not None or residual is conv or residual.type != conv.type):
        return None
    return graph.conv2d(x, w, bias, residual, **node.attrs)


RULES: list[Rule] = [
    (Pat("add", (Pat("gemm", name="mm"), Pat(name="residual")), any_order=True), fuse_residual),
    (Pat(tuple(EPILOGUE_ACTIVATIONS), (Pat("gemm", name="mm"),), name="y"), fuse_activation),
    (Pat(tuple(EPILOGUE_ACTIVATIONS), (Pat("reshape", (Pat("gemm", name="mm"),), name="view"),), name="y"),
     fuse_activation_through_reshape),
    (Pat("add", (Pat("conv2d", name="conv"), Pat(name="residual")), any_order=True), fuse_conv_residual),
    (Pat(tuple(CONV_EPILOGUE_ACTIVATIONS), (Pat("conv2d", name="conv"),), name="y"), fuse_conv_activation),
    (Pat("clip", (Pat("conv2d", name="conv"),), name="y"), fuse_conv_clip),
]


def fuse(graph: Graph) -> list:
    return rewrite(graph, RULES)
