"""Shape/dtype inference: recomputes every node's output types from the graph's input types, in order.

Run after the input types change (symbolic dims bound to a run's shapes) or on a graph assembled by hand. Errors
name the node whose inputs no longer check.
"""
from __future__ import annotations

from ..ir.graph import Graph, infer_types


def infer_shapes(graph: Graph) -> list[str]:
    notes = []
    for node in graph.nodes:
        in_types = [None if v is None else v.type for v in node.inputs]
        for value, inferred in zip(node.outputs, infer_types(node.opdef, in_types, node.attrs, node.where())):
            if value.type != inferred:
                notes.append(f"{value.name}: {value.type} -> {inferred}")
                value.type = inferred
    return notes
