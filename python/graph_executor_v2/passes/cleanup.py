"""Dead-code elimination and common-subexpression elimination."""
from __future__ import annotations

from ..ir.graph import Graph, Value


def eliminate_dead_code(graph: Graph) -> list[str]:
    """Removes the nodes and parameters no graph output depends on (inputs stay: they are the signature)."""
    live: set[Value] = set(graph.outputs.values())
    notes = []
    for node in reversed(list(graph.nodes)):
        if any(value in live for value in node.outputs):
            live.update(value for value in node.inputs if value is not None)
        else:
            graph.remove_node(node)
            notes.append(f"removed node {node.name} ({node.op})")
    for param in list(graph.params.values()):
        if param not in live:
            graph.remove_param(param)
            notes.append(f"removed param {param.name}")
    return notes[::-1]


def eliminate_common_subexpressions(graph: Graph) -> list[str]:
    """Merges nodes computing the same op on the same values with the same attributes (and placement)."""
    first_of: dict[tuple, object] = {}
    notes = []
    for node in list(graph.nodes):
        if not node.opdef.pure:
            continue
        key = (node.op, tuple(id(value) for value in node.inputs), repr(sorted(node.attrs.items())), node.device)
        twin = first_of.setdefault(key, node)
        if twin is node:
            continue
        for duplicate, kept in zip(node.outputs, twin.outputs):
            graph.replace_uses(duplicate, kept)
        graph.remove_node(node)
        notes.append(f"{node.name} is {twin.name}")
    return notes
