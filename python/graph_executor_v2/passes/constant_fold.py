"""Constant folding: a node whose inputs are all parameters becomes a parameter, computed once by the op's NumPy
reference (float64 math, cast to the node's dtype). Chains fold in one sweep since results are parameters too.
Ops that are not pure (``OpDef.pure``, e.g. random ones) are never folded."""
from __future__ import annotations

from ..ir.graph import Graph


def fold_constants(graph: Graph) -> list[str]:
    notes = []
    for node in list(graph.nodes):
        if not node.opdef.pure or not all(value is None or value.is_param for value in node.inputs):
            continue
        if any(isinstance(value, tuple) and any(isinstance(item, str) for item in value)
               for value in node.attrs.values()):
            continue  # a symbolic dim in an attribute (x[:, :seq]): computed once the plan binds it
        results = node.opdef.run_reference([None if v is None else v.data for v in node.inputs], node.attrs)
        graph.remove_node(node)  # frees the output names for the parameters that replace them
        for value, result in zip(node.outputs, results):
            graph.replace_uses(value, graph.param(value.name, result))
        notes.append(f"folded {node.name} ({node.op}) into param(s) {', '.join(v.name for v in node.outputs)}")
    return notes
