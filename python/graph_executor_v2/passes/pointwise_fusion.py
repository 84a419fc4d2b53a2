"""Pointwise fusion: each maximal connected subgraph of pointwise ops becomes one ``fused_pointwise`` node, and a
row reduction absorbs the pointwise group that feeds it (its prologue) and the one that reads it (its epilogue) into
one ``fused_reduction`` node. Their kernels are generated (``codegen/``); on the CPU they run the members' references.

Guards (ONNX Runtime style, checked before any rewrite):
- a member is pointwise: its op has a ``scalar`` expression, one output whose shape is the broadcast of its
  inputs', and dtypes the generated code has types for (no float8); every member of a group has the same output
  shape (the group's iteration shape) and placement;
- groups never form a cycle: two parts merge only when no path leaves one and comes back into the other through a
  node outside them;
- nothing is recomputed: a member value read outside its group, or a graph output, becomes an output of the fused
  node and is stored once;
- bounded: at most ``MAX_INPUTS`` inputs, ``MAX_OUTPUTS`` outputs and ``MAX_MEMBERS`` members (code size) a group.
Streams are assigned after the passes (``runtime/schedule.py``), to whole nodes: a fused node runs on one stream, so
no group spans a cross-stream edge. ``GE2_NO_FUSION=1`` turns the pass off (before/after comparisons); without NVRTC
(``codegen.compiler.availability()``) it does nothing, since a fused node would have no kernel.

A row op (layernorm, rmsnorm, softmax or log_softmax over the last axis, rows of at most ``codegen.row.ROW_LIMIT``
elements) absorbs the pointwise group that feeds its ``x`` (the prologue) and one pointwise group that reads its
output (the epilogue) into one ``fused_row`` node (``fuse_rows``): LayerNorm -> GELU -> residual add becomes one
kernel that reads x, the residual, gamma and beta and writes y. Its backward (training) stays unfused: the row op's
input and output, when the backward reads them, become outputs of the fused node.

Single-element parameters are folded into the generated source as constants (``fuse_pointwise``); the training
variant (``fuse_pointwise_training``) keeps every parameter an input, since a trainer updates them in place.
"""
from __future__ import annotations

import heapq
import os
from typing import Callable

from ..codegen.compiler import availability
from ..codegen.elements import is_supported
from ..codegen.pointwise import broadcast_shape
from ..codegen.row import ROW_LIMIT, ROW_OPS
from ..ir.graph import Graph, Node, Value
from ..ir.schema import OPS
from ..ops.fused import MAX_OUTPUTS

MAX_INPUTS = 16
MAX_MEMBERS = 48
REDUCTIONS = ("sum", "mean", "max", "min")
FLOATS = ("float32", "float16", "bfloat16")


def is_pointwise(node: Node) -> bool:
    opdef = OPS[node.op]
    if getattr(opdef, "scalar", None) is None or len(node.outputs) != 1:
        return False
    shapes = [tuple(v.type.shape) for v in node.inputs if v is not None]
    generated_types = all(is_supported(v.type.dtype) for v in (*node.inputs, *node.outputs) if v is not None)
    return (bool(shapes) and None not in node.inputs and generated_types
            and broadcast_shape(shapes) == tuple(node.outputs[0].type.shape))


class _Groups:
    """Groups of pointwise nodes (node -> group id), grown in topological order."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.index = {node: i for i, node in enumerate(graph.nodes)}
        self.users = graph.users()
        self.group_of: dict[Node, int] = {}
        self.members: dict[int, list[Node]] = {}
        self._next_group = 0

    def _escapes_and_returns(self, start: set[Node], target: set[Node]) -> bool:
        """Whether a path leaves ``start`` through a node outside ``start | target`` and reaches ``target``."""
        union = start | target
        limit = max(self.index[n] for n in target)
        frontier = [u for n in start for v in n.outputs for u in self.users.get(v, []) if u not in union]
        seen = set()
        while frontier:
            node = frontier.pop()
            if node in seen or self.index[node] > limit:
                continue
            seen.add(node)
            for value in node.outputs:
                for user in self.users.get(value, []):
                    if user in target:
                        return True
                    if user not in union:
                        frontier.append(user)
        return False

    def can_merge(self, a: set[Node], b: set[Node]) -> bool:
        if len(a) + len(b) > MAX_MEMBERS or len(self.inputs_of(a | b)) > MAX_INPUTS:
            return False
        return not self._escapes_and_returns(a, b) and not self._escapes_and_returns(b, a)

    def inputs_of(self, nodes: set[Node]) -> list[Value]:
        inputs = []
        for node in nodes:
            for value in node.inputs:
                if value is not None and value.producer not in nodes and value not in inputs:
                    inputs.append(value)
        return inputs

    def add(self, node: Node, compatible: Callable[[Node, Node], bool]) -> None:
        current = {node}
        for value in node.inputs:
            producer = value.producer if value is not None else None
            if producer not in self.group_of or producer in current or not compatible(producer, node):
                continue
            other = set(self.members[self.group_of[producer]])
            if self.can_merge(other, current):
                current |= other
        group, self._next_group = self._next_group, self._next_group + 1
        self.members[group] = sorted(current, key=self.index.get)
        for member in current:
            old = self.group_of.get(member)
            if old is not None and old != group:
                self.members.pop(old, None)
            self.group_of[member] = group


def _member_attr(node: Node, args: list) -> dict:
    return {"op": node.op, "node": node.name, "attrs": dict(node.attrs), "args": tuple(args)}


def _arg_for(value: Value, inputs: list[Value], member_index: dict[Value, int], fold_params: bool):
    if value in member_index:
        return ("member", member_index[value])
    if fold_params and value.is_param and value.type.numel == 1:
        return ("constant", value.data.reshape(-1)[0].item(), value.type.dtype, tuple(value.type.shape))
    if value not in inputs:
        inputs.append(value)
    return ("input", inputs.index(value))


def _outputs_of(graph: Graph, members: list[Node], users: dict) -> list[Value]:
    inside = set(members)
    return [n.outputs[0] for n in members
            if graph.is_output(n.outputs[0]) or any(u not in inside for u in users.get(n.outputs[0], []))]


def _topological_sort(graph: Graph) -> None:
    """Reorders ``graph.nodes`` topologically, keeping the current order where it is already valid."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    remaining = {node: sum(1 for v in node.inputs if v is not None and v.producer in position)
                 for node in graph.nodes}
    users = graph.users()
    ready = [(position[n], id(n), n) for n, count in remaining.items() if count == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, _, node = heapq.heappop(ready)
        ordered.append(node)
        for value in node.outputs:
            for user in users.get(value, []):
                remaining[user] -= 1
                if remaining[user] == 0:
                    heapq.heappush(ready, (position[user], id(user), user))
    if len(ordered) != len(graph.nodes):
        raise RuntimeError("pointwise fusion made a cycle (a bug in its merge guard)")
    graph.nodes[:] = ordered


def _replace_group(graph: Graph, members: list[Node], users: dict, fold_params: bool):
    """The group as one fused_pointwise node (inserted before its last member); returns it."""
    inputs: list[Value] = []
    member_index: dict[Value, int] = {}
    member_attrs = []
    for index, node in enumerate(members):
        member_attrs.append(_member_attr(node, [_arg_for(v, inputs, member_index, fold_params) for v in node.inputs]))
        member_index[node.outputs[0]] = index
    outputs = _outputs_of(graph, members, users)
    with graph.inserting_before(members[-1]):
        fused = graph.add_node("fused_pointwise", inputs,
                               {"members": tuple(member_attrs), "outputs": tuple(member_index[v] for v in outputs)},
                               device=members[0].device)
    for old, new in zip(outputs, fused.outputs):
        graph.replace_uses(old, new)
    for node in members:
        graph.remove_node(node)
    return fused


class FusionNote(str):
    """A note of this pass that explain() lists under "fusions"; ``absorbed``: fused nodes a later fusion took in."""

    is_fusion = True
    absorbed: tuple[str, ...] = ()


def split_binary_backward(graph: Graph) -> list[str]:
    """``mul_backward``/``div_backward`` with no broadcast (dy, a and b of one shape) as the pointwise ops they are,
    so the backward chains around them fuse: mul: (dy * b, dy * a); div: (dy / b, -(dy * a) / (b * b))."""
    notes = []
    for node in list(graph.nodes):
        if node.op not in ("mul_backward", "div_backward"):
            continue
        dy, a, b = node.inputs
        if not (dy.type == a.type == b.type):
            continue
        with graph.inserting_before(node):
            if node.op == "mul_backward":
                da, db = graph.mul(dy, b), graph.mul(dy, a)
            else:
                da, db = graph.div(dy, b), graph.neg(graph.div(graph.mul(dy, a), graph.mul(b, b)))
        for old, new in zip(node.outputs, (da, db)):
            graph.replace_uses(old, new)
        graph.remove_node(node)
        notes.append(f"{node.name} ({node.op}) split into pointwise ops")
    return notes


def fuse_pointwise_groups(graph: Graph, fold_params: bool) -> list[str]:
    # Without NVRTC a fused node would have no kernel but the host round trip: the ops stay as they are.
    if os.environ.get("GE2_NO_FUSION") == "1" or availability() is not None:
        return []
    split = split_binary_backward(graph)
    moments = fuse_moments(graph)
    groups = _Groups(graph)

    def compatible(producer: Node, consumer: Node) -> bool:
        return (producer.device == consumer.device
                and tuple(producer.outputs[0].type.shape) == tuple(consumer.outputs[0].type.shape))

    for node in graph.nodes:
        if is_pointwise(node):
            groups.add(node, compatible)
    notes = []
    for members in list(groups.members.values()):
        if len(members) < 2 or len(_outputs_of(graph, members, groups.users)) > MAX_OUTPUTS:
            continue
        fused = _replace_group(graph, members, groups.users, fold_params)
        notes.append(FusionNote(f"{fused.name}: fused {len(members)} pointwise ops into one generated kernel: "
                                + ", ".join(f"{n.op} ({n.name})" for n in members)))
    if notes:
        _topological_sort(graph)
    reductions = fuse_reductions(graph, fold_params)
    rows = fuse_rows(graph)
    absorbed = {name for note in reductions + rows for name in note.absorbed}
    return split + moments + [n for n in notes if n.split(":")[0] not in absorbed] + reductions + rows


# ---------------------------------------------------------------------------------------------------------------
# Reductions: a pointwise prologue and epilogue around sum/mean/max/min over trailing dims.
# ---------------------------------------------------------------------------------------------------------------
def _trailing_axes(node: Node) -> int | None:
    """How many trailing dims the reduction ``node`` reduces, or None when its axes are not the trailing ones."""
    rank = node.inputs[0].type.rank
    axis = node.attrs.get("axis")
    axes = tuple(range(rank)) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    axes = sorted({a % rank for a in axes}) if rank else []
    if not axes or axes != list(range(rank - len(axes), rank)):
        return None
    return len(axes)


def _group_members(node: Node) -> tuple[list[dict], list[Value]] | None:
    """(member attrs, inputs) of a fused_pointwise node with one output (its last member), or of a single
    pointwise node; None otherwise."""
    if node.op == "fused_pointwise":
        if len(node.outputs) != 1 or node.attrs["outputs"] != (len(node.attrs["members"]) - 1,):
            return None
        return [dict(m) for m in node.attrs["members"]], list(node.inputs)
    if is_pointwise(node):
        return [_member_attr(node, [("input", i) for i in range(len(node.inputs))])], list(node.inputs)
    return None


def _remap(members: list[dict], mapping: dict[int, tuple]) -> list[dict]:
    """The members with their ("input", k) args replaced by ``mapping[k]``."""
    return [{**m, "args": tuple(mapping[a[1]] if a is not None and a[0] == "input" else a for a in m["args"])}
            for m in members]


def fuse_moments(graph: Graph) -> list[str]:
    """``v = mean(d * d)`` with ``d = x - m``, ``m = mean(x, keepdims=True)`` over the same trailing dims -> one
    fused_reduction ``var`` of x with outputs (m, v), or ``std`` (m, sqrt(v)) when a sqrt is v's only reader: one
    read of x instead of two. ``d`` stays where it is read elsewhere (a normalization) and fuses with its readers."""
    notes = []
    for node in list(graph.nodes):
        if node.op != "mean" or node not in graph.nodes or _trailing_axes(node) is None:
            continue
        users = graph.users()
        squared = node.inputs[0]
        square = squared.producer
        if (square is None or square.op != "mul" or square.inputs[0] is not square.inputs[1]
                or graph.is_output(squared) or len(users.get(squared, [])) != 1):
            continue
        difference = square.inputs[0].producer
        if difference is None or difference.op != "sub":
            continue
        x, mean = difference.inputs
        first = mean.producer
        if (first is None or first.op != "mean" or first.inputs[0] is not x or not first.attrs["keepdims"]
                or _trailing_axes(first) != _trailing_axes(node) or x.type.dtype not in FLOATS
                or len({n.device for n in (first, difference, square, node)}) != 1):
            continue
        readers = users.get(node.outputs[0], [])
        root = readers[0] if (len(readers) == 1 and readers[0].op == "sqrt"
                              and not graph.is_output(node.outputs[0])) else None
        reduce = "std" if root is not None else "var"
        with graph.inserting_before(first):
            fused = graph.add_node("fused_reduction", [x], {
                "members": (), "reduce": reduce, "axes": _trailing_axes(node), "keepdims": node.attrs["keepdims"],
                "epilogue": (), "outputs": ()}, device=node.device)
        graph.replace_uses(first.outputs[0], fused.outputs[0])
        graph.replace_uses((root or node).outputs[0], fused.outputs[1])
        removed = [first, square, node] + ([root] if root is not None else [])
        for old in removed:
            graph.remove_node(old)
        if not any(difference.outputs[0] in n.inputs for n in graph.nodes) and not graph.is_output(
                difference.outputs[0]):
            graph.remove_node(difference)
            removed.append(difference)
        notes.append(FusionNote(f"{fused.name}: fused {', '.join(f'{n.op} ({n.name})' for n in removed)} into one "
                                f"{reduce} with two outputs (the mean and the {reduce})"))
    return notes


def fuse_reductions(graph: Graph, fold_params: bool) -> list[str]:
    notes = []
    for node in list(graph.nodes):
        if node.op not in REDUCTIONS or node not in graph.nodes or node.op not in OPS:
            continue
        axes = _trailing_axes(node)
        x = node.inputs[0]
        if axes is None or x.type.dtype not in FLOATS:
            continue
        users = graph.users()
        producer = x.producer
        prologue = _group_members(producer) if producer is not None else None
        if prologue is None or graph.is_output(x) or len(users.get(x, [])) != 1 or producer.device != node.device:
            continue
        members, inputs = prologue
        reduced = node.outputs[0]
        consumers = users.get(reduced, [])
        epilogue_node = consumers[0] if len(consumers) == 1 and not graph.is_output(reduced) else None
        epilogue = _group_members(epilogue_node) if epilogue_node is not None else None
        if epilogue is not None and (epilogue_node.device != node.device or tuple(
                epilogue_node.outputs[0].type.shape) != tuple(reduced.type.shape)):
            epilogue = None
        all_inputs = list(inputs)
        epilogue_attrs: list[dict] = []
        if epilogue is not None:
            epilogue_members, epilogue_inputs = epilogue
            mapping = {}
            for k, value in enumerate(epilogue_inputs):
                if value is reduced:
                    mapping[k] = ("reduced",)
                    continue
                if value not in all_inputs:
                    all_inputs.append(value)
                mapping[k] = ("input", all_inputs.index(value))
            epilogue_attrs = _remap(epilogue_members, mapping)
            if len(all_inputs) > MAX_INPUTS or any(v.producer is epilogue_node for v in all_inputs):
                epilogue, epilogue_attrs, all_inputs = None, [], list(inputs)
        attrs = {"members": tuple(members), "reduce": node.op, "axes": axes, "keepdims": node.attrs["keepdims"],
                 "epilogue": tuple(epilogue_attrs),
                 "outputs": (len(epilogue_attrs) - 1,) if epilogue_attrs else ()}
        last = epilogue_node if epilogue is not None else node
        with graph.inserting_before(last):
            fused = graph.add_node("fused_reduction", all_inputs, attrs, device=node.device)
        graph.replace_uses(last.outputs[0], fused.outputs[0])
        for old in (producer, node) + ((epilogue_node,) if epilogue is not None else ()):
            graph.remove_node(old)
        described = [m["op"] + f" ({m['node']})" for m in members] + [f"{node.op} ({node.name})"]
        described += [m["op"] + f" ({m['node']})" for m in epilogue_attrs]
        note = FusionNote(f"{fused.name}: fused a {node.op} over {axes} trailing dim(s) with its pointwise "
                          f"prologue{' and epilogue' if epilogue_attrs else ''}: " + ", ".join(described))
        note.absorbed = tuple(n.name for n in (producer, epilogue_node) if n is not None and n.op == "fused_pointwise")
        notes.append(note)
    if notes:
        _topological_sort(graph)
    return notes


def fuse_pointwise(graph: Graph) -> list[str]:
    return fuse_pointwise_groups(graph, fold_params=True)


def fuse_pointwise_training(graph: Graph) -> list[str]:
    return fuse_pointwise_groups(graph, fold_params=False)


# ---------------------------------------------------------------------------------------------------------------
# Row ops: layernorm/rmsnorm/softmax/log_softmax with a pointwise prologue and epilogue (codegen/row.py).
# ---------------------------------------------------------------------------------------------------------------
def _is_row_op(node: Node) -> bool:
    if node.op not in ROW_OPS:
        return False
    x = node.inputs[0]
    if not x.type.is_concrete or x.type.rank < 1 or x.type.dtype not in FLOATS or x.type.shape[-1] > ROW_LIMIT:
        return False
    if node.op in ("softmax", "log_softmax") and node.attrs["axis"] % x.type.rank != x.type.rank - 1:
        return False
    return all(v is not None for v in node.inputs)


def _pointwise_group(node: Node) -> tuple[list[dict], list[Value], list[int]] | None:
    """(member attrs, inputs, the member index of each output) of a fused_pointwise node or a single pointwise
    node; None otherwise."""
    if node.op == "fused_pointwise":
        return [dict(m) for m in node.attrs["members"]], list(node.inputs), list(node.attrs["outputs"])
    if is_pointwise(node):
        return [_member_attr(node, [("input", i) for i in range(len(node.inputs))])], list(node.inputs), [0]
    return None


def _depends_on(values, nodes: set[Node]) -> bool:
    """Whether any of ``values`` is computed (directly or through other nodes) from a node in ``nodes``."""
    stack = [v.producer for v in values if v is not None and v.producer is not None]
    seen = set()
    while stack:
        node = stack.pop()
        if node in nodes:
            return True
        if node in seen:
            continue
        seen.add(node)
        stack += [v.producer for v in node.inputs if v is not None and v.producer is not None]
    return False


def _epilogue_of(graph: Graph, node: Node, users) -> tuple[Node | None, Node | None]:
    """(the pointwise group reading the row op's output y, the reshape between them or None): a reader of y's shape
    first; else a group behind a reshape that keeps the last axis (a (batch, seq, width) row op feeding a
    (batch * seq, width) cast before a GEMM), whose other inputs have at most one dim (they broadcast alike in both
    shapes)."""
    y = node.outputs[0]

    def group_of_shape(reader: Node, shape) -> bool:
        return (reader.device == node.device and _pointwise_group(reader) is not None
                and all(tuple(v.type.shape) == tuple(shape) for v in reader.outputs))

    for reader in users.get(y, []):
        if reader is not node and group_of_shape(reader, y.type.shape):
            return reader, None
    for reshape in users.get(y, []):
        if reshape.op != "reshape" or reshape.device != node.device:
            continue
        view = reshape.outputs[0]
        readers = users.get(view, [])
        if (not view.type.is_concrete or view.type.rank < 1 or view.type.shape[-1] != y.type.shape[-1]
                or graph.is_output(view) or len(readers) != 1 or not group_of_shape(readers[0], view.type.shape)):
            continue
        if all(v is view or v.type.rank <= 1 for v in readers[0].inputs):
            return readers[0], reshape
    return None, None


def _row_group(graph: Graph, node: Node, prologue_node, epilogue_node, users, reshape=None):
    """(members, inputs, outputs as (member index, value replaced)) of the row op ``node`` with the given prologue
    and epilogue nodes (either may be None; ``reshape``: the reshape between y and the epilogue), or None when it
    would form a cycle or exceed the bounds."""
    x, y = node.inputs[0], node.outputs[0]
    view = reshape.outputs[0] if reshape is not None else y
    inputs: list[Value] = []

    def input_arg(value: Value):
        if value not in inputs:
            inputs.append(value)
        return ("input", inputs.index(value))

    members: list[dict] = []
    if prologue_node is not None:
        prologue_members, prologue_inputs = _group_members(prologue_node)
        members = _remap(prologue_members, {k: input_arg(v) for k, v in enumerate(prologue_inputs)})
        x_arg = ("member", len(members) - 1)
    else:
        x_arg = input_arg(x)  # input 0
    row = len(members)
    members.append(_member_attr(node, [x_arg] + [input_arg(v) for v in node.inputs[1:]]))
    epilogue_outputs: list[tuple[int, Value]] = []
    if epilogue_node is not None:
        epilogue_members, epilogue_inputs, outputs = _pointwise_group(epilogue_node)
        mapping = {k: ("member", row) if v is y or v is view else x_arg if v is x else input_arg(v)
                   for k, v in enumerate(epilogue_inputs)}
        for m in epilogue_members:
            members.append({**m, "args": tuple(
                mapping[a[1]] if a is not None and a[0] == "input"
                else ("member", a[1] + row + 1) if a is not None and a[0] == "member" else a for a in m["args"])})
        epilogue_outputs = [(row + 1 + index, value) for index, value in zip(outputs, epilogue_node.outputs)]
    group_nodes = {n for n in (prologue_node, node, reshape, epilogue_node) if n is not None}
    outputs: list[tuple[int, Value]] = []
    if prologue_node is not None and (graph.is_output(x) or any(u not in group_nodes for u in users.get(x, []))):
        outputs.append((row - 1, x))
    if epilogue_node is None or graph.is_output(y) or any(u not in group_nodes for u in users.get(y, [])):
        outputs.append((row, y))
    outputs += epilogue_outputs
    if (len(inputs) > MAX_INPUTS or len(outputs) > MAX_OUTPUTS or len(members) > MAX_MEMBERS
            or _depends_on(inputs, group_nodes)):
        return None
    return members, inputs, outputs


def fuse_rows(graph: Graph) -> list[str]:
    """Each row op with the pointwise group feeding it and one pointwise group reading it -> one fused_row."""
    notes = []
    for node in list(graph.nodes):
        if node not in graph.nodes or not _is_row_op(node):
            continue
        users = graph.users()
        x, y = node.inputs[0], node.outputs[0]
        producer = x.producer
        prologue_node = (producer if producer is not None and producer.device == node.device
                         and _group_members(producer) is not None else None)
        epilogue_node, reshape = _epilogue_of(graph, node, users)
        group = None
        for candidate_prologue, candidate_epilogue in ((prologue_node, epilogue_node), (prologue_node, None),
                                                       (None, epilogue_node)):
            if candidate_prologue is None and candidate_epilogue is None:
                continue
            group = _row_group(graph, node, candidate_prologue, candidate_epilogue, users,
                               reshape if candidate_epilogue is not None else None)
            if group is not None:
                prologue_node, epilogue_node = candidate_prologue, candidate_epilogue
                break
        if group is None:
            continue
        if epilogue_node is None:
            reshape = None
        members, inputs, outputs = group
        with graph.inserting_before(node):
            fused = graph.add_node("fused_row", inputs, {"members": tuple(members),
                                                         "outputs": tuple(index for index, _ in outputs)},
                                   device=node.device)
            # epilogue outputs behind the reshape get it back (an alias: no copy)
            results = [graph.reshape(new, shape=tuple(old.type.shape)) if old.type.shape != new.type.shape else new
                       for (_, old), new in zip(outputs, fused.outputs)]
        for (_, old), new in zip(outputs, results):
            graph.replace_uses(old, new)
        replaced = [n for n in (prologue_node, node, reshape, epilogue_node) if n is not None]
        for old in replaced:
            graph.remove_node(old)
        note = FusionNote(f"{fused.name}: fused a {node.op} with its pointwise "
                          + " and ".join(part for part, n in (("prologue", prologue_node), ("epilogue", epilogue_node))
                                         if n is not None)
                          + ": " + ", ".join(f"{m['op']} ({m['node']})" for m in members))
        note.absorbed = tuple(n.name for n in replaced if n.op == "fused_pointwise")
        notes.append(note)
        _topological_sort(graph)
    return notes
