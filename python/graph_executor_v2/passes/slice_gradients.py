"""``join_slice_gradients``: the gradient of a value split into slices that tile one axis is the concat of the
slices' gradients.

A fused QKV projection is split into q, k and v by three slices; autograd gives each slice's gradient as a
``slice_backward`` (zeros of the whole value with the slice written in) and sums the three with adds: three full
writes and two full adds where one concat moves each byte once. Rewrite (guards first): an add tree whose leaves are
``slice_backward`` nodes of one value, each slicing one axis with step 1, together covering that axis exactly once,
and whose inner values (the leaves and the partial sums) are read by the tree alone and are not graph outputs:
    add(add(slice_backward(da, x, a), slice_backward(db, x, b)), slice_backward(dc, x, c)) -> concat(da, db, dc)
(ordered by start along the axis).
"""
from __future__ import annotations

from ..ir.graph import Graph, Node, Value
from ..ops.slice import _slice_args, geometry


def join_slice_gradients(graph: Graph) -> list[str]:
    notes = []
    for node in reversed(list(graph.nodes)):  # a tree's root (its last add) comes first
        if node.op != "add" or node not in graph.nodes:
            continue
        users = graph.users()
        leaves = _leaves(graph, node, users, root=True)
        if leaves is None or len(leaves) < 2:
            continue
        joined = _tiling(leaves)
        if joined is None:
            continue
        axis, ordered = joined
        with graph.inserting_before(node):
            concat = graph.concat(*[leaf.inputs[0] for leaf in ordered], axis=axis)
        graph.replace_uses(node.outputs[0], concat)
        notes.append(f"joined {', '.join(leaf.name for leaf in ordered)} (slice_backward) summed by {node.name} into "
                     f"{concat.producer.name} (concat on axis {axis})")
    return notes


def _leaves(graph: Graph, node: Node, users: dict, root: bool = False) -> list[Node] | None:
    """The slice_backward nodes an add tree sums, or None when the tree holds anything else or leaks a value."""
    if not root and (graph.is_output(node.outputs[0]) or len(users.get(node.outputs[0], [])) != 1):
        return None
    if node.op == "slice_backward":
        return [node]
    if node.op != "add" or any(v is None or v.producer is None for v in node.inputs):
        return None
    if node.inputs[0].type.shape != node.inputs[1].type.shape:  # a broadcasting add is no sum of equals
        return None
    leaves = []
    for value in node.inputs:
        found = _leaves(graph, value.producer, users)
        if found is None:
            return None
        leaves += found
    return leaves


def _tiling(leaves: list[Node]) -> tuple[int, list[Node]] | None:
    """(axis, the leaves ordered along it) when the leaves' slices of one value cover one axis exactly once."""
    x: Value = leaves[0].inputs[1]
    if any(leaf.inputs[1] is not x for leaf in leaves) or not x.type.is_concrete:
        return None
    spans, axes = [], set()
    for leaf in leaves:
        sliced = geometry(x.type.shape, *_slice_args(leaf.attrs))
        if any(step != 1 for step in sliced.steps):
            return None
        differing = [a for a, (part, whole) in enumerate(zip(sliced.shape, x.type.shape)) if part != whole]
        if len(differing) != 1:
            return None
        axis = differing[0]
        axes.add(axis)
        spans.append((sliced.starts[axis], sliced.starts[axis] + sliced.shape[axis], leaf))
    if len(axes) != 1:
        return None
    axis = axes.pop()
    spans.sort(key=lambda span: span[0])
    position = 0
    for start, end, _ in spans:
        if start != position:
            return None
        position = end
    if position != x.type.shape[axis]:
        return None
    return axis, [leaf for _, _, leaf in spans]
