"""Declarative rewrites: a rule is a (pattern, function) pair; the function returns the replacement or None.

A ``Pat`` matches a value by the op that produces it and, recursively, that op's inputs, binding values by name::

    # a @ b + bias = gemm(a, b, bias)
    (Pat("add", (Pat("gemm", name="mm"), Pat(name="bias")), any_order=True), fold_bias)

``rewrite`` walks the nodes in topological order, tries the rules whose root op matches, calls the function with
the bindings (new nodes it builds go right before the root), replaces the root's output and deletes the matched
nodes nothing reads any more, until no rule fires. Interior matches carry ONNX Runtime's guards unless marked
``shared``: exactly one consumer, not a graph output, same device as the root; dtype checks belong to the rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations
from typing import Callable, Sequence

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


@dataclass
class _Match:
    graph: Graph
    users: dict[Value, list[Node]]
    root: Node
    bindings: dict
    nodes: list[Node]


def _match(pat: Pat, value: Value | None, state: _Match, is_root: bool) -> bool:
    if pat.op is not None:
        if value is None or value.producer is None or len(value.producer.outputs) != 1:
            return False
        node = value.producer
        if node.op not in ((pat.op,) if isinstance(pat.op, str) else pat.op):
            return False
        if not is_root and not pat.shared and not exclusive(state.graph, state.users, value, state.root):
            return False
        if pat.inputs is not None:
            if len(pat.inputs) != len(node.inputs):
                return False
            orders = permutations(range(len(node.inputs))) if pat.any_order else [range(len(node.inputs))]
            for order in orders:
                trial = _Match(state.graph, state.users, state.root, dict(state.bindings), list(state.nodes))
                if all(_match(p, node.inputs[i], trial, False) for p, i in zip(pat.inputs, order)):
                    state.bindings, state.nodes = trial.bindings, trial.nodes
                    break
            else:
                return False
        state.nodes.append(node)
    if pat.name is not None:
        if pat.name in state.bindings and state.bindings[pat.name] is not value:
            return False
        state.bindings[pat.name] = value
    return True


def exclusive(graph: Graph, users: dict[Value, list[Node]], value: Value, consumer: Node) -> bool:
    """ONNX Runtime's fusion guards: ``value`` feeds only ``consumer``, is no graph output, same device."""
    return (len(users.get(value, [])) == 1 and not graph.is_output(value)
            and value.producer.device == consumer.device)


def rewrite(graph: Graph, rules: Sequence[Rule]) -> list[str]:
    """Applies ``rules`` to a fixed point, in place; returns one note per rewrite."""
    by_op: dict[str, list[Rule]] = {}
    for rule in rules:
        pat = rule[0]
        for op in (pat.op,) if isinstance(pat.op, str) else pat.op:
            by_op.setdefault(op, []).append(rule)
    notes: list[str] = []
    for _ in range(MAX_SWEEPS):
        fired = False
        for node in list(graph.nodes):
            if node in graph.nodes and node.op in by_op:
                note = _rewrite_node(graph, node, by_op[node.op])
                if note:
                    notes.append(note)
                    fired = True
        if not fired:
            return notes
    raise RuntimeError(f"rewrite rules did not converge after {MAX_SWEEPS} sweeps; last rewrites: {notes[-3:]}")


def _rewrite_node(graph: Graph, root: Node, rules: Sequence[Rule]) -> str | None:
    users = graph.users()
    for pat, build in rules:
        state = _Match(graph, users, root, {}, [])
        if not _match(pat, root.outputs[0], state, True):
            continue
        existing = set(graph.nodes)
        with graph.inserting_before(root):
            replacement = build(graph, **state.bindings)
        if replacement is None:
            continue
        graph.replace_uses(root.outputs[0], replacement)
        removed = remove_unused(graph, state.nodes)
        added = [n.name for n in graph.nodes if n not in existing] or [replacement.name]
        return f"{build.__name__}: {', '.join(removed)} -> {', '.join(added)}"
    return None


def remove_unused(graph: Graph, candidates: Sequence[Node]) -> list[str]:
    """Deletes the nodes of ``candidates`` whose outputs nothing reads, consumers first; returns their names."""
    removed = []
    for node in sorted(candidates, key=graph.nodes.index, reverse=True):
        users = graph.users()
        if not any(users.get(v) or graph.is_output(v) for v in node.outputs):
            graph.remove_node(node)
            removed.append(node.name)
    return removed[::-1]
