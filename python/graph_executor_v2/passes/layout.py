"""Layout planning for convolutional chains: every layout-aware node runs in the layout its dtype prefers (NHWC
for float16/bfloat16, where tensor-core convolutions and channel-vector pooling/batch-norm kernels want it; NCHW
for float32), and transposes remain only at the edges of each chain.

1. Each layout-aware node in the other layout is rebuilt in the preferred one, its 4-d activation operands
   transposed in (NCHW -> NHWC: perm (0, 2, 3, 1)) and its used 4-d activation outputs transposed back.
2. Transposes sink through elementwise ops (``relu(transpose(x)) = transpose(relu(x))``, and a binary op whose two
   operands are transposed alike), so that a transpose back meets the next node's transpose in, and
   canonicalization's rules merge the pair into the identity and drop it.

``ACTIVATION_OPERANDS`` says which inputs and outputs of each layout-aware op are activations in its layout; the
rest (weights' statistics, per-channel vectors) do not depend on it. conv2d's weight follows its layout (KCRS for
NCHW, KRSC for NHWC), so it is transposed with the activations.
"""
from __future__ import annotations

from ..ir.graph import Graph, Value
from ..ops.elementwise import BINARY_OPS, UNARY_OPS
from .canonicalize import drop_identity_transpose, merge_transposes
from .pattern import Pat, Rule, rewrite

PREFERRED = {"float16": "NHWC", "bfloat16": "NHWC", "float32": "NCHW"}
PERMS = {("NCHW", "NHWC"): (0, 2, 3, 1), ("NHWC", "NCHW"): (0, 3, 1, 2)}

# op -> (input positions, output positions) of tensors laid out by the node's ``layout`` attribute
ACTIVATION_OPERANDS = {
    "conv2d": ((0, 1), (0,)),
    "max_pool2d": ((0,), (0, 1)),
    "max_pool2d_backward": ((0, 1, 2), (0,)),
    "avg_pool2d": ((0,), (0,)),
    "avg_pool2d_backward": ((0, 1), (0,)),
    "global_avg_pool": ((0,), (0,)),
    "global_avg_pool_backward": ((0, 1), (0,)),
    "batch_norm": ((0,), (0,)),
    "batch_norm_backward": ((0, 1), (0,)),
}


def _relayout(graph: Graph, node, transposed: dict) -> str | None:
    """Rebuilds ``node`` in its dtype's preferred layout; None when it already is (or is not 4-d). ``transposed``
    maps (value, perm) to the transposes built so far, so a value read by several nodes is transposed once."""
    inputs, outputs = ACTIVATION_OPERANDS[node.op]
    x = node.inputs[0]
    target = PREFERRED.get(x.type.dtype)
    current = node.attrs["layout"]
    if target is None or target == current or x.type.rank != 4:
        return None
    to_target, back = PERMS[(current, target)], PERMS[(target, current)]
    users = graph.users()
    with graph.inserting_before(node):
        new_inputs = list(node.inputs)
        for i in inputs:
            value = node.inputs[i]
            if (value, to_target) not in transposed:
                transposed[value, to_target] = graph.transpose(value, perm=to_target)
            new_inputs[i] = transposed[value, to_target]
        rebuilt = graph.add_node(node.op, new_inputs, {**node.attrs, "layout": target}, device=node.device)
        for index, (old, new) in enumerate(zip(node.outputs, rebuilt.outputs)):
            if index in outputs and (users.get(old) or graph.is_output(old)):
                new = graph.transpose(new, perm=back)
            graph.replace_uses(old, new)
    graph.remove_node(node)
    return f"relayout: {node.name} ({node.op}) {current} -> {target} as {rebuilt.name}"


# unary(transpose(x, p)) = transpose(unary(x), p)
def sink_through_unary(graph: Graph, x: Value, t: Value, y: Value):
    moved = graph.add_node(y.producer.op, [x], dict(y.producer.attrs)).outputs[0]
    return graph.transpose(moved, perm=t.producer.attrs["perm"])


# binary(transpose(a, p), transpose(b, p)) = transpose(binary(a, b), p) for operands of one shape
def sink_through_binary(graph: Graph, a: Value, b: Value, ta: Value, tb: Value, y: Value):
    if ta.producer.attrs["perm"] != tb.producer.attrs["perm"] or a.type.shape != b.type.shape:
        return None
    moved = graph.add_node(y.producer.op, [a, b], dict(y.producer.attrs)).outputs[0]
    return graph.transpose(moved, perm=ta.producer.attrs["perm"])


RULES: list[Rule] = [
    (Pat(UNARY_OPS, (Pat("transpose", (Pat(name="x"),), name="t", shared=True),), name="y"), sink_through_unary),
    (Pat(BINARY_OPS, (Pat("transpose", (Pat(name="a"),), name="ta", shared=True),
                      Pat("transpose", (Pat(name="b"),), name="tb", shared=True)), name="y"), sink_through_binary),
    (Pat("transpose", (Pat(name="x"),), name="y"), drop_identity_transpose),
    (Pat("transpose", (Pat("transpose", name="inner", shared=True),), name="y"), merge_transposes),
]


def plan_layouts(graph: Graph) -> list:
    notes: list = []
    transposed: dict = {}
    for node in list(graph.nodes):
        if node.op in ACTIVATION_OPERANDS:
            note = _relayout(graph, node, transposed)
            if note:
                notes.append(note)
    if notes:
        notes += rewrite(graph, RULES)
    return notes
