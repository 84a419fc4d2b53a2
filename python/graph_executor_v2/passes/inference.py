"""Shape/dtype inference: recomputes every node's output types from the graph's input types, in order.

Run after the input types change (symbolic dims bound to a run's shapes) or on a graph assembled by hand. Errors
name the node whose inputs no longer check.
"""
from __future__ import annotations

from ..ir import dims
from ..ir.graph import Graph, infer_types


def infer_shapes(graph: Graph, bound: dict[str, int] | None = None) -> list[str]:
    """``bound``: symbolic dims -> sizes of this run; attributes that hold those dims (a reshape's target shape
    written with the model's ``batch``) are bound first, so every type comes out concrete."""
    notes = []
    if bound:
        for node in graph.nodes:
            node.attrs = {name: _bound_attr(value, bound) for name, value in node.attrs.items()}
    for node in graph.nodes:
        in_types = [None if v is None else v.type for v in node.inputs]
        for value, inferred in zip(node.outputs, infer_types(node.opdef, in_types, node.attrs, node.where())):
            if value.type != inferred:
                notes.append(f"{value.name}: {value.type} -> {inferred}")
                value.type = inferred
    return notes


def _bound_attr(value, bound: dict[str, int]):
    """A tuple attribute with its symbolic dims replaced by sizes, where ``bound`` gives every name they use."""
    if not isinstance(value, tuple) or not any(isinstance(item, str) for item in value):
        return value
    evaluated = []
    for item in value:
        if isinstance(item, str) and dims.names(item) <= bound.keys():
            item = dims.evaluate(item, bound)
        evaluated.append(item)
    return tuple(evaluated)
