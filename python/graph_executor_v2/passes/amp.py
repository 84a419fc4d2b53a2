"""Mixed precision: every node gets a compute dtype from one policy table, and casts go where dtypes change.

``POLICY`` is the single table: GEMMs run in the low precision (float16 or bfloat16 storage; the kernels accumulate
in float32); softmax, norms, reductions, exp and losses run in float32; every other op (elementwise, data movement,
dropout, embedding) follows its inputs, in float32 when they disagree. A float32 parameter whose every consumer is a
low-precision op becomes a low-precision parameter (a trainer keeps its float32 master and has the optimizer write
the low-precision copy); elsewhere a ``cast`` node converts a value once per dtype, before its first use.
"""
from __future__ import annotations

from ..dtypes import FLOAT_DTYPES, to_numpy
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
