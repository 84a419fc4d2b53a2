"""Declarative rewrites: a rule is a (pattern, function) pair; the function returns the replacement or None.

A ``Pat`` matches a value by the op that produces it and, recursively, that op's inputs, binding values by name::

    # relu(gemm(a, b)) = gemm(a, b, act="relu")
    (Pat("relu", (Pat("gemm", name="mm"),)), fuse_activation)

``rewrite`` walks the nodes in topological order, tries the rules whose root op matches, calls the function with
the bindings (new nodes it builds go right before the root), replaces the root's output and deletes the matched
nodes nothing reads any more, until no rule fires. Interior matches carry ONNX Runtime's guards unless marked
``shared``: exactly one consumer, not a graph output, same device as the root; dtype checks belong to the rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations
from typing import Callable, Iterator, Sequence

from ..ir.graph import Graph, Node, Value

MAX_SWEEPS = 100  # a rule set that has not converged by then rewrites in a cycle: a bug in the rules


@dataclass(frozen=True)
class Pat:
    op: str | tuple[str, ...] | None = None  # producing op(s); None matches any value, an absent input too
    inputs: tuple["Pat", ...] | None = None  # None: any inputs
    name: str | None = None  # binds the matched value (None for an absent input) under this name
    any_order: bool = False  # the inputs may match in any order (commutative ops)
    shared: bool = False  # an interior match may have other consumers (it is then kept, not duplicated)


Rule = tuple[Pat, Callable[..., "Value | None"]]


@dataclass(frozen=True)
class _Context:
    graph: Graph
    users: dict[Value, list[Node]]
    root: Node


def _matches(pat: Pat, value: Value | None, context: _Context, bindings: dict, nodes: tuple
             ) -> Iterator[tuple[dict, tuple]]:
    """Every way ``pat`` matches ``value``, as (bindings, matched nodes) extended from the given ones."""
    if pat.name is not None:
        if pat.name in bindings and bindings[pat.name] is not value:
            return
        bindings = {**bindings, pat.name: value}
    if pat.op is None:
        yield bindings, nodes
        return
    if value is None or value.producer is None or len(value.producer.outputs) != 1:
        return
    node = value.producer
    if node.op not in ((pat.op,) if isinstance(pat.op, str) else pat.op):
        return
    if node is not context.root and not pat.shared and not exclusive(context.graph, context.users, value,
                                                                      context.root):
        return
    nodes = nodes + (node,)
    if pat.inputs is None:
        yield bindings, nodes
        return
    if len(pat.inputs) != len(node.inputs):
        return
    orders = permutations(node.inputs) if pat.any_order else [node.inputs]
    for inputs in orders:
        yield from _match_all(list(zip(pat.inputs, inputs)), context, bindings, nodes)


def _match_all(pairs: list, context: _Context, bindings: dict, nodes: tuple) -> Iterator[tuple[dict, tuple]]:
    if not pairs:
        yield bindings, nodes
        return
    (pat, value), rest = pairs[0], pairs[1:]
    for bound, matched in _matches(pat, value, context, bindings, nodes):
        yield from _match_all(rest, context, bound, matched)


def exclusive(graph: Graph, users: dict[Value, list[Node]], value: Value, consumer: Node) -> bool:
    """ONNX Runtime's fusion guards: ``value`` feeds only ``consumer``, is no graph output, same device."""
    return (len(users.get(value, [])) == 1 and not graph.is_output(value)
            and value.producer.device == consumer.device)


@dataclass(frozen=True)
class Rewrite:
    """What one rule application did: the nodes it removed and the nodes (or value) that replace them."""

    rule: str
    removed: tuple[str, ...]
    added: tuple[str, ...]

    @property
    def is_fusion(self) -> bool:
        return len(self.removed) >= 2 and len(self.added) == 1

    def __str__(self) -> str:
        return f"{self.rule}: {', '.join(self.removed)} -> {', '.join(self.added)}"


def rewrite(graph: Graph, rules: Sequence[Rule]) -> list[Rewrite]:
    """Applies ``rules`` to a fixed point, in place; returns one note per rewrite.

    Rules are indexed by their root op, and the users of every value are computed once and then kept up to date by
    each rewrite (the nodes it builds, the uses it moves, the nodes it removes), so a sweep costs the size of the
    graph, not its square. A rule's function only builds nodes (``graph.<op>(...)``); the rewrite does the rest."""
    by_op: dict[str, list[Rule]] = {}
    for rule in rules:
        pat = rule[0]
        for op in (pat.op,) if isinstance(pat.op, str) else pat.op:
            by_op.setdefault(op, []).append(rule)
    notes: list[Rewrite] = []
    users = graph.users()
    removed: set[Node] = set()
    for _ in range(MAX_SWEEPS):
        fired = False
        for node in list(graph.nodes):
            if node not in removed and node.op in by_op:
                note = _rewrite_node(graph, users, removed, node, by_op[node.op])
                if note:
                    notes.append(note)
                    fired = True
        if not fired:
            return notes
    raise RuntimeError(f"rewrite rules did not converge after {MAX_SWEEPS} sweeps; last rewrites: {notes[-3:]}")


def _rewrite_node(graph: Graph, users: dict[Value, list[Node]], removed: set[Node], root: Node,
                  rules: Sequence[Rule]) -> Rewrite | None:
    context = _Context(graph, users, root)
    for pat, build in rules:
        for bindings, matched in _matches(pat, root.outputs[0], context, {}, ()):
            with graph.inserting_before(root) as added:
                replacement = build(graph, **bindings)
            if replacement is None:
                for node in added:  # a rule that built nodes and then declined: they read nothing now
                    graph.remove_node(node)
                continue
            for node in added:
                node.device = root.device  # a rewrite never moves work to another device
                for value in node.inputs:
                    if value is not None:
                        users.setdefault(value, []).append(node)
            _replace_uses(graph, users, root.outputs[0], replacement)
            gone = remove_unused(graph, matched, users)
            removed.update(node for node in matched if node.name in gone)
            return Rewrite(build.__name__, gone, tuple(n.name for n in added) or (replacement.name,))
    return None


def _replace_uses(graph: Graph, users: dict[Value, list[Node]], old: Value, new: Value) -> None:
    """``graph.replace_uses`` through the users index: only the readers of ``old`` are visited."""
    readers = users.pop(old, [])
    for node in dict.fromkeys(readers):
        node.inputs = [new if v is old else v for v in node.inputs]
    users.setdefault(new, []).extend(readers)
    graph.outputs = {name: new if v is old else v for name, v in graph.outputs.items()}


def remove_unused(graph: Graph, candidates: Sequence[Node], users: dict[Value, list[Node]] | None = None
                  ) -> tuple[str, ...]:
    """Deletes the nodes of ``candidates`` whose outputs nothing reads, consumers first; returns their names in
    graph order. ``users`` (kept up to date) saves recomputing them."""
    users = graph.users() if users is None else users
    pending, removed = list(dict.fromkeys(candidates)), []
    position = {node: graph.nodes.index(node) for node in pending}
    progress = True
    while progress:  # a node becomes unused once its readers among the candidates are gone
        progress = False
        for node in list(pending):
            if any(users.get(v) or graph.is_output(v) for v in node.outputs):
                continue
            graph.remove_node(node)
            for value in node.inputs:
                if value is not None and node in users.get(value, ()):
                    users[value].remove(node)
            pending.remove(node)
            removed.append(node)
            progress = True
    return tuple(node.name for node in sorted(removed, key=position.get))
