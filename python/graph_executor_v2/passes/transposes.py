"""Transpose propagation over whole graphs: transposes move toward the outputs, through what commutes with them,
until they meet and cancel; whatever remains of a chain of reshapes and transposes is at most one transpose.

nn.MultiheadAttention works sequence-first, so a batch-first model (torchvision's ViT-B/16) exports each block as
transpose [N, L, E] -> [L, N, E], the QKV projection, a transpose that unbinds q/k/v, one transpose per head split, a
transpose after the attention and one back to batch-first: 7 transposes a block, 85 kernels and 0.87 ms of ViT-B/16
in float16 at batch 32 on the H200. Moved and merged, they cancel to none: the projections read and write
batch-first rows and the attention reads its heads in the "bshd" layout.

The rules (each an identity):

- ``normalize_chain``: a chain of reshapes and transposes whose interior values have no other reader is one
  reshape, at most one transpose, and one reshape. The chain's dims are factored into atoms (every reshape splits or
  merges whole atoms, an atom splitting where a reshape needs it); the atoms' order at the end against their order
  at the start is the one permutation left, with the atoms that stay adjacent merged. The transpose is the chain's
  last node when the end's dims are whole atoms (or 1), so what reads it can take it further.
- ``sink_through_slice``: ``slice(transpose(x, p), axes) = transpose(slice(x, p[axes]), p)``.
- ``sink_through_gemm``: a gemm is row by row, so a transpose that keeps the trailing axes the gemm's K is made of
  commutes with it: ``gemm(reshape(transpose(w, p), [R, K])) = reshape(transpose(reshape(gemm(reshape(w, [R, K])),
  w's leading dims + [N]), p), [R, N])`` (no ``c``, A not transposed; its bias and activation are per row).
- ``sink_past_row_operand``: ``binary(transpose(a, p), c)`` with ``c`` of lower rank broadcast over a's leading
  axes, when p keeps c's trailing axes in place: ``transpose(binary(a, c), p)``.
- ``attention_reads_bshd``: ``attention(transpose(q, h), transpose(k, h), transpose(v, h))`` in "bhsd" with
  ``h = (0, 2, 1, 3)`` = ``transpose(attention(q, k, v, layout="bshd"), h)`` (the log-sum-exp unread).
- plan_layouts' rules: elementwise ops, broadcasting binary ops, reductions.

Moving a transpose can also make it larger (past a gemm that widens the rows) without meeting another one, so the
pass works on a copy and keeps the result only when the bytes the graph's activation transposes write went down
(``transposed_bytes``); its last note says both totals.
"""
from __future__ import annotations

import math

from ..dtypes import itemsize
from ..ir.graph import Graph, Value
from .layout import BINARY_OPS, _perm, unit_transpose_to_reshape
from .layout import RULES as LAYOUT_RULES
from .pattern import Pat, Rule, exclusive, rewrite

CHAIN_OPS = ("reshape", "transpose")
HEADS_SPLIT = (0, 2, 1, 3)  # [batch, seq, heads, dim] <-> [batch, heads, seq, dim]


# --- chains of reshapes and transposes ------------------------------------------------------------------------
class _Atoms:
    """The source's dims factored into atoms. ``order``: atom ids in the source's row-major order; ``layout``: the
    current tensor's dims, each the list of its atom ids (empty for a dim of 1) in the current order."""

    def __init__(self, shape):
        self.sizes: dict[int, int] = {}
        self.order: list[int] = []
        self.layout: list[list[int]] = []
        for extent in shape:
            self.layout.append(self._new_atoms(extent))

    def _new_atoms(self, extent) -> list[int]:
        if extent == 1:
            return []
        atom = len(self.sizes)
        self.sizes[atom] = extent
        self.order.append(atom)
        return [atom]

    def _split(self, atom: int, outer: int) -> tuple[int, int]:
        """Replaces ``atom`` by (outer, inner) atoms wherever it appears; returns their ids."""
        first, second = len(self.sizes), len(self.sizes) + 1
        self.sizes[first], self.sizes[second] = outer, self.sizes[atom] // outer
        at = self.order.index(atom)
        self.order[at:at + 1] = [first, second]
        for group in self.layout:
            if atom in group:
                at = group.index(atom)
                group[at:at + 1] = [first, second]
        return first, second

    def transpose(self, perm) -> None:
        self.layout = [self.layout[axis] for axis in perm]

    def reshape(self, shape) -> bool:
        """Regroups the atoms into ``shape``'s dims, splitting atoms where a dim ends inside one; False when a dim
        ends inside an atom it does not divide (not a regrouping of whole factors)."""
        flat = [atom for group in self.layout for atom in group]
        layout, position = [], 0
        for extent in shape:
            group, remaining = [], extent
            while remaining > 1:
                atom = flat[position]
                size = self.sizes[atom]
                if remaining % size == 0:
                    group.append(atom)
                    remaining //= size
                    position += 1
                elif size % remaining == 0:
                    outer, inner = self._split(atom, remaining)
                    flat[position:position + 1] = [outer, inner]
                    group.append(outer)
                    remaining = 1
                    position += 1
                else:
                    return False
            layout.append(group)
        self.layout = layout
        return position == len(flat)


def _chain(graph: Graph, users: dict, end: Value) -> list:
    """The reshape/transpose nodes from the chain's source to ``end``, each interior value read by its successor
    only (a transpose read elsewhere too is kept where it is: it is computed anyway)."""
    nodes = [end.producer]
    while True:
        value = nodes[0].inputs[0]
        if value.producer is None or value.producer.op not in CHAIN_OPS or not exclusive(graph, users, value,
                                                                                         nodes[0]):
            return nodes
        nodes.insert(0, value.producer)


def _normal_form(source: Value, nodes: list, end: Value) -> list[tuple[str, tuple]] | None:
    """The chain as at most (reshape, transpose, reshape), as (op, shape or perm) steps; None when a reshape is not
    a regrouping of whole factors."""
    if 0 in source.type.shape:
        return None
    atoms = _Atoms(source.type.shape)
    for node in nodes:
        if node.op == "transpose":
            atoms.transpose(_perm(node.outputs[0]))
        elif not atoms.reshape(node.outputs[0].type.shape):
            return None
    order = {atom: index for index, atom in enumerate(atoms.order)}
    end_shape = tuple(end.type.shape)
    whole = [group for group in atoms.layout if group]
    if all([order[a] for a in group] == list(range(order[group[0]], order[group[0]] + len(group))) for group in whole):
        # every dim of the end is a run of the source's atoms: one transpose of those runs, and it comes last
        by_source = sorted(whole, key=lambda group: order[group[0]])
        if by_source == whole:
            return [] if end_shape == tuple(source.type.shape) else [("reshape", end_shape)]
        units = len(atoms.layout) - len(whole)
        source_shape = tuple(math.prod(atoms.sizes[a] for a in group) for group in by_source) + (1,) * units
        unit_slots = iter(range(len(by_source), len(source_shape)))
        perm = tuple(by_source.index(group) if group else next(unit_slots) for group in atoms.layout)
        steps = [] if source_shape == tuple(source.type.shape) else [("reshape", source_shape)]
        return steps + [("transpose", perm)]
    # else the atoms that stay adjacent (a run of the source order kept together) merge, and a reshape follows
    runs: list[list[int]] = []
    for atom in (atom for group in whole for atom in group):
        if runs and order[runs[-1][-1]] + 1 == order[atom]:
            runs[-1].append(atom)
        else:
            runs.append([atom])
    by_source = sorted(runs, key=lambda run: order[run[0]])
    perm = tuple(by_source.index(run) for run in runs)
    if perm == tuple(range(len(perm))):
        return [] if end_shape == tuple(source.type.shape) else [("reshape", end_shape)]
    source_shape = tuple(math.prod(atoms.sizes[a] for a in run) for run in by_source)
    steps = [] if source_shape == tuple(source.type.shape) else [("reshape", source_shape)]
    return steps + [("transpose", perm), ("reshape", end_shape)]


def _steps_of(nodes: list) -> list[tuple[str, tuple]]:
    return [(n.op, _perm(n.outputs[0]) if n.op == "transpose" else tuple(n.outputs[0].type.shape)) for n in nodes]


def normalize_chains(graph: Graph) -> list[str]:
    """Every chain of reshapes and transposes (see the module) in its normal form; one note per chain rewritten."""
    notes = []
    users = graph.users()
    for node in list(graph.nodes):
        if node not in graph.nodes or node.op not in CHAIN_OPS:
            continue
        end = node.outputs[0]
        readers = users.get(end, [])
        if readers and not graph.is_output(end) and all(r.op in CHAIN_OPS for r in readers) and len(readers) == 1:
            continue  # not the end of its chain
        nodes = _chain(graph, users, end)
        source = nodes[0].inputs[0]
        if not all(v.type.is_concrete for v in [source] + [n.outputs[0] for n in nodes]):
            continue
        if len(nodes) < 2 or not any(n.op == "transpose" for n in nodes):
            continue
        steps = _normal_form(source, nodes, end)
        if steps is None or steps == _steps_of(nodes) or (not steps and graph.is_output(end)):
            continue
        with graph.inserting_before(node) as added:
            value = source
            for op, argument in steps:
                value = (graph.transpose(value, perm=argument) if op == "transpose"
                         else graph.reshape(value, shape=argument))
        graph.replace_uses(end, value)
        for old in reversed(nodes):
            graph.remove_node(old)
        users = graph.users()
        notes.append(f"normalize_chain: {', '.join(n.name for n in nodes)} -> "
                     f"{', '.join(n.name for n in added) or source.name}")
    return notes


# --- sinking rules ----------------------------------------------------------------------------------------------
# slice(transpose(x, p), axes) = transpose(slice(x, p[axes]), p)
def sink_through_slice(graph: Graph, x: Value, t: Value, y: Value):
    attrs = y.producer.attrs
    perm = _perm(t)
    rank = len(perm)
    axes = attrs["axes"] if attrs["axes"] is not None else tuple(range(len(attrs["starts"])))
    moved = graph.slice(x, starts=attrs["starts"], ends=attrs["ends"], axes=tuple(perm[a % rank] for a in axes),
                        steps=attrs["steps"])
    return graph.transpose(moved, perm=perm)


def _fixed_suffix(perm, shape, extent) -> int | None:
    """The first axis j with perm[k] = k for every k >= j and prod(shape[j:]) = extent; None if there is none."""
    j = len(perm)
    while j > 0 and math.prod(shape[j:]) < extent and perm[j - 1] == j - 1:
        j -= 1
    return j if math.prod(shape[j:]) == extent and j < len(perm) else None


# gemm(reshape(transpose(w, p), [R, K])) = reshape(transpose(reshape(gemm(reshape(w, [R, K])), [*lead, N]), p'),
# [R, N]) when p keeps the trailing axes that make K
def sink_through_gemm(graph: Graph, w: Value, t: Value, a: Value, b: Value, bias: Value | None, c: Value | None,
                      y: Value):
    attrs = y.producer.attrs
    if attrs["trans_a"] or c is not None or not t.type.is_concrete or not y.type.is_concrete:
        return None
    rows, k = a.type.shape
    perm, shape = _perm(t), tuple(t.type.shape)
    j = _fixed_suffix(perm, shape, k)
    if j is None or j == 0:
        return None
    lead = tuple(w.type.shape[:j])  # the source's leading dims, in its own order
    product = graph.gemm(graph.reshape(w, shape=(rows, k)), b, bias, None, **attrs)
    n = y.type.shape[1]
    rows_view = graph.reshape(product, shape=lead + (n,))
    moved = graph.transpose(rows_view, perm=tuple(perm[:j]) + (j,))
    return graph.reshape(moved, shape=tuple(y.type.shape))


# binary(transpose(a, p), c) = transpose(binary(a, c), p) for c of lower rank, broadcast over a's leading axes,
# when p keeps c's axes (a's last c.rank) in place; either order
def sink_past_row_operand(graph: Graph, a: Value, t: Value, c: Value, y: Value):
    perm = _perm(t)
    rank = len(perm)
    if c.type.rank >= rank or any(perm[axis] != axis for axis in range(rank - c.type.rank, rank)):
        return None
    operands = [a, c] if y.producer.inputs[0] is t else [c, a]
    moved = graph.add_node(y.producer.op, operands, dict(y.producer.attrs)).outputs[0]
    if moved.type.shape != a.type.shape:
        return None  # c broadcasts a too (a larger result): not a pure row operand
    return graph.transpose(moved, perm=perm)


def attention_reads_bshd(graph: Graph) -> list[str]:
    """attention(transpose(q, h), transpose(k, h), transpose(v, h)) in "bhsd", its log-sum-exp unread, = its
    "bshd" form of q, k and v, its output transposed by h."""
    notes = []
    users = graph.users()
    for node in list(graph.nodes):
        if node.op != "attention" or node.attrs["layout"] != "bhsd" or users.get(node.outputs[1]):
            continue
        if graph.is_output(node.outputs[1]):
            continue
        sources = []
        for value in node.inputs[:3]:
            producer = value.producer
            if producer is None or producer.op != "transpose" or _perm(value) != HEADS_SPLIT:
                break
            sources.append(producer.inputs[0])
        if len(sources) != 3:
            continue
        with graph.inserting_before(node):
            y = graph.attention(*sources, node.inputs[3], **{**node.attrs, "layout": "bshd"})[0]
            moved = graph.transpose(y, perm=HEADS_SPLIT)
        graph.replace_uses(node.outputs[0], moved)
        graph.remove_node(node)
        users = graph.users()
        for value in {id(v): v for v in node.inputs[:3]}.values():
            if not users.get(value) and not graph.is_output(value):
                graph.remove_node(value.producer)
        users = graph.users()
        notes.append(f"attention_reads_bshd: {node.name} -> {y.producer.name}")
    return notes


RULES: list[Rule] = [
    (Pat("slice", (Pat("transpose", (Pat(name="x"),), name="t", shared=True),), name="y"), sink_through_slice),
    (Pat("gemm", (Pat("reshape", (Pat("transpose", (Pat(name="w"),), name="t", shared=True),), name="a"),
                  Pat(name="b"), Pat(name="bias"), Pat(name="c")), name="y"), sink_through_gemm),
    (Pat(BINARY_OPS, (Pat("transpose", (Pat(name="a"),), name="t", shared=True), Pat(name="c")), name="y",
         any_order=True), sink_past_row_operand),
    *LAYOUT_RULES,
    (Pat("transpose", (Pat(name="x"),), name="y"), unit_transpose_to_reshape),
]


def transposed_bytes(graph: Graph) -> int:
    """The bytes written by the graph's transposes of activations (a parameter's folds as a constant); a symbolic
    shape counts as one element per symbolic dim."""
    total = 0
    for node in graph.nodes:
        if node.op == "transpose" and not node.inputs[0].is_param:
            value = node.outputs[0]
            total += math.prod(d if isinstance(d, int) else 1 for d in value.type.shape) * itemsize(value.type.dtype)
    return total


def _propagate(graph: Graph) -> list:
    notes: list = []
    for _ in range(len(graph.nodes)):  # each rule set may unblock the other
        changed = normalize_chains(graph) + rewrite(graph, RULES) + attention_reads_bshd(graph)
        notes += changed
        if not changed:
            break
    return notes


def propagate_transposes(graph: Graph) -> list:
    before = transposed_bytes(graph)
    if before == 0:
        return []
    trial = graph.clone()
    notes = _propagate(trial)
    after = transposed_bytes(trial)
    if not notes or after >= before:
        return []
    # the pass manager owns ``graph`` (a private copy) and nothing else holds its values: take the trial's contents
    graph.__dict__.update(trial.__dict__)
    return notes + [f"transposes: {before} -> {after} bytes written by activation transposes"]
