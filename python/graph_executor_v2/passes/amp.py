"""Mixed precision: every node gets a compute dtype from one policy table, and casts go where dtypes change.

``POLICY`` is the single table: GEMMs run in the low precision (float16 or bfloat16 storage; the kernels accumulate
in float32); softmax, norms, reductions, exp and losses run in float32; every other op (elementwise, data movement,
dropout, embedding) follows its inputs, in float32 when they disagree. A float32 parameter whose every consumer is a
low-precision op becomes a low-precision parameter (a trainer keeps its float32 master and has the optimizer write
the low-precision copy); elsewhere a ``cast`` node converts a value once per dtype, before its first use.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import FLOAT_DTYPES, itemsize, to_numpy
from ..ir.graph import Graph, Value, infer_types

LOW, FLOAT32, FOLLOW = "low", "float32", "follow"
POLICY = {
    "gemm": LOW, "matmul": LOW,
    "softmax": FLOAT32, "log_softmax": FLOAT32, "layernorm": FLOAT32, "rmsnorm": FLOAT32,
    "sum": FLOAT32, "mean": FLOAT32, "max": FLOAT32, "exp": FLOAT32, "cross_entropy": FLOAT32,
}
AMP_DTYPES = ("float16", "bfloat16")


def compute_dtype(op: str, input_dtypes: list[str], low: str) -> str:
    """The dtype a node of ``op`` computes in, given its float inputs' dtypes."""
    policy = POLICY.get(op, FOLLOW)
    if policy == LOW:
        return low
    if policy == FLOAT32 or len(set(input_dtypes)) > 1:
        return "float32"
    return input_dtypes[0] if input_dtypes else "float32"


def autocast(graph: Graph, dtype: str) -> list[str]:
    """Rewrites ``graph`` in place for mixed precision in ``dtype`` (float16 or bfloat16); returns notes."""
    if dtype not in AMP_DTYPES:
        raise ValueError(f"amp: expected one of {', '.join(AMP_DTYPES)} or None, got {dtype!r}")
    notes = _lower_params(graph, dtype)
    casts: dict[tuple[Value, str], Value] = {}
    for node in list(graph.nodes):
        if node.op == "cast":
            continue
        floats = [v for v in node.inputs if v is not None and v.type.dtype in FLOAT_DTYPES]
        if not floats:
            continue
        target = compute_dtype(node.op, [v.type.dtype for v in floats], dtype)
        for index, value in enumerate(node.inputs):
            if value is None or value.type.dtype not in FLOAT_DTYPES or value.type.dtype == target:
                continue
            key = (value, target)
            if key not in casts:
                with graph.inserting_before(node):
                    casts[key] = graph.cast(value, dtype=target)
                notes.append(f"cast {value.name} to {target} for {node.name} ({node.op})")
            node.inputs[index] = casts[key]
        for value, inferred in zip(node.outputs, infer_types(node.opdef, [None if v is None else v.type
                                                                           for v in node.inputs],
                                                             node.attrs, node.where())):
            value.type = inferred
    return notes


def pad_after_cast(graph: Graph) -> list[str]:
    """A pad whose only reader is a narrowing cast (pad_classes' float32 LM-head weight padded, then cast to 16 bits
    for its GEMM) pads the cast's output instead: the cast moves only the unpadded elements, the pad moves 16-bit
    ones, and the pad's gradient (a crop) runs in 16 bits before the widening cast back. Exact: a cast is
    elementwise, and a constant pad moves only when its value is the same in the narrow dtype."""
    notes = []
    for cast in [node for node in graph.nodes if node.op == "cast"]:
        pad = cast.inputs[0].producer
        if pad is None or pad.op != "pad" or graph.users().get(pad.outputs[0]) != [cast] \
                or graph.is_output(pad.outputs[0]):
            continue
        source, target = pad.outputs[0].type.dtype, cast.attrs["dtype"]
        if source not in FLOAT_DTYPES or target not in FLOAT_DTYPES or itemsize(target) >= itemsize(source):
            continue
        value = pad.attrs["value"]
        if pad.attrs["mode"] == "constant" and not np.isnan(value) and \
                float(np.asarray(value).astype(to_numpy(target))) != value:
            continue
        with graph.inserting_before(cast):
            padded = graph.pad(graph.cast(pad.inputs[0], **cast.attrs), **pad.attrs)
        graph.replace_uses(cast.outputs[0], padded)
        graph.remove_node(cast)
        graph.remove_node(pad)
        notes.append(f"{pad.name} pads {pad.inputs[0].name} after its cast to {target} ({padded.producer.name})")
    return notes


def _lower_params(graph: Graph, dtype: str) -> list[str]:
    users = graph.users()
    notes = []
    for name, param in list(graph.params.items()):
        consumers = users.get(param, [])
        if param.type.dtype != "float32" or not consumers or graph.is_output(param):
            continue
        if any(POLICY.get(node.op, FOLLOW) != LOW for node in consumers):
            continue
        graph.remove_param(param)
        lowered = graph.param(name, param.data.astype(to_numpy(dtype)))
        graph.replace_uses(param, lowered)
        notes.append(f"param {name} stored in {dtype}")
    return notes
