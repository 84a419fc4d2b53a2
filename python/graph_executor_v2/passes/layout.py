"""Layout planning for convolutional networks: every layout-aware node runs in the layout its dtype prefers, and
transposes remain only at the edges of each region of such nodes.

``PREFERRED``: NHWC for float16/bfloat16 (cuDNN's runtime-fusion engines, which fuse a conv's bias, residual and
activation, and GE2's implicit GEMM take only channels-last; pooling and batch norm read channel vectors), NCHW for
float32 unless measured otherwise: given ``measure`` (an executor on CUDA passes one: ``runtime/layout_timing.py``),
the float32 convolutions are timed in both layouts (each its fastest kernel, as the plan will choose; the costliest
distinct problems, up to 8 or 80% of the FLOPs) and the graph's float32 nodes take NHWC where that sum is more than
3% faster (the autotuner's own margin: it also pays the
transposes at the region's edges); the note says both sums. Without ``measure`` (the CPU, no GPU) an NCHW float32
graph, as every exported one is, is left alone.

1. Each layout-aware node in the other layout is rebuilt in the preferred one, its 4-d activation operands
   transposed in (NCHW -> NHWC: perm (0, 2, 3, 1)) and its used 4-d activation outputs transposed back. A value read
   by several nodes is transposed once.
2. Transposes sink through what commutes with them: elementwise ops (``relu(transpose(x)) = transpose(relu(x))``; a
   binary op whose operands are transposed alike, broadcasting included, or whose other operand's transpose costs
   nothing: a parameter, folded by constant folding, or a value the graph already transposes), concat (on the
   permuted axis) and reductions (``sum``/``mean``/``max`` over the permuted axes: an exported global average pool,
   EfficientNet's squeeze-and-excitation ReduceMean, reads the NHWC activation instead of a transposed copy) and
   resize (``resize(transpose(x))`` resizes x's H and W in its own layout: a segmentation head's or a U-Net's
   upsampling stays channels-last). A transpose back then meets the next node's transpose in, and the pair merges
   into the identity and drops.
3. A transpose that only moves size-1 dims (a pooled [N, 1, 1, C] back to [N, C, 1, 1]) is a reshape, a view.
4. A 16-bit NHWC conv whose input channels are not a multiple of 8 (a network's first conv, on RGB) reads its input
   and weights zero-padded to the next multiple, so that its epilogue fuses (``_pad_channels``).

``ACTIVATION_OPERANDS`` says which inputs and outputs of each layout-aware op are activations in its layout; the
rest (statistics, per-channel vectors) do not depend on it. conv2d's weight follows its layout (KCRS for NCHW, KRSC
for NHWC), so it is transposed with the activations (a parameter: folded once, at pass time), and so is its fused
residual. The pass's last note counts the nodes in each layout and the transposes of activations that remain.
"""
from __future__ import annotations

import functools

from ..ir.graph import Graph, Value
from ..ops import elementwise, pointwise
from ..ops.reduce import OP_NAMES as REDUCTION_OPS
from ..ops.reduce import normalize_axes
from .canonicalize import drop_identity_transpose, merge_transposes
from .pattern import Pat, Rule, rewrite

PREFERRED = {"float16": "NHWC", "bfloat16": "NHWC", "float32": "NCHW"}
# What commutes with a transpose: every elementwise op, one operand or two (broadcasting alike)
UNARY_OPS = tuple(dict.fromkeys(elementwise.UNARY_OPS + pointwise.UNARY_OPS))
BINARY_OPS = tuple(dict.fromkeys(elementwise.BINARY_OPS + pointwise.BINARY_OPS))
PERMS = {("NCHW", "NHWC"): (0, 2, 3, 1), ("NHWC", "NCHW"): (0, 3, 1, 2)}

# op -> (input positions, output positions) of tensors laid out by the node's ``layout`` attribute
ACTIVATION_OPERANDS = {
    "conv2d": ((0, 1, 3), (0,)),
    "max_pool2d": ((0,), (0, 1)),
    "max_pool2d_backward": ((0, 1, 2), (0,)),
    "avg_pool2d": ((0,), (0,)),
    "avg_pool2d_backward": ((0, 1), (0,)),
    "global_avg_pool": ((0,), (0,)),
    "global_avg_pool_backward": ((0, 1), (0,)),
    "batch_norm": ((0,), (0,)),
    "batch_norm_backward": ((0, 1), (0,)),
}


def _relayout(graph: Graph, node, transposed: dict, preferred: dict) -> str | None:
    """Rebuilds ``node`` in its dtype's ``preferred`` layout; None when it already is (or is not 4-d).
    ``transposed`` maps (value, perm) to the transposes built so far, so a value read by several nodes is transposed
    once."""
    inputs, outputs = ACTIVATION_OPERANDS[node.op]
    x = node.inputs[0]
    target = preferred.get(x.type.dtype)
    current = node.attrs["layout"]
    if target is None or target == current or x.type.rank != 4:
        return None
    to_target, back = PERMS[(current, target)], PERMS[(target, current)]
    users = graph.users()
    with graph.inserting_before(node):
        new_inputs = list(node.inputs)
        for i in inputs:
            value = node.inputs[i] if i < len(node.inputs) else None
            if value is None:  # an absent optional operand (conv2d's residual)
                continue
            if (value, to_target) not in transposed:
                transposed[value, to_target] = graph.transpose(value, perm=to_target)
            new_inputs[i] = transposed[value, to_target]
        rebuilt = graph.add_node(node.op, new_inputs, {**node.attrs, "layout": target}, device=node.device)
        for index, (old, new) in enumerate(zip(node.outputs, rebuilt.outputs)):
            if index in outputs and (users.get(old) or graph.is_output(old)):
                new = graph.transpose(new, perm=back)
            graph.replace_uses(old, new)
    graph.remove_node(node)
    return f"relayout: {node.name} ({node.op}) {current} -> {target} as {rebuilt.name}"


def _perm(t: Value) -> tuple[int, ...]:
    return tuple(t.producer.attrs["perm"])


def _inverse(perm) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for axis, source in enumerate(perm):
        inverse[source] = axis
    return tuple(inverse)


# unary(transpose(x, p)) = transpose(unary(x), p)
def sink_through_unary(graph: Graph, x: Value, t: Value, y: Value):
    moved = graph.add_node(y.producer.op, [x], dict(y.producer.attrs)).outputs[0]
    return graph.transpose(moved, perm=_perm(t))


# binary(transpose(a, p), transpose(b, p)) = transpose(binary(a, b), p) for operands of one rank (broadcasting
# commutes with a permutation applied to both)
def sink_through_binary(graph: Graph, a: Value, b: Value, ta: Value, tb: Value, y: Value):
    if _perm(ta) != _perm(tb) or a.type.rank != b.type.rank:
        return None
    moved = graph.add_node(y.producer.op, [a, b], dict(y.producer.attrs)).outputs[0]
    return graph.transpose(moved, perm=_perm(ta))


# binary(transpose(a, p), c) = transpose(binary(a, c'), p), c' = transpose(c, p^-1) of c of a's rank, when c' costs
# nothing: c is a parameter (its transpose folds as a constant) or the graph already has c' (a ResNet block's input
# is transposed into the region for the block's first conv, and its skip connection reads it there); either order
def sink_past_operand(graph: Graph, a: Value, t: Value, c: Value, y: Value):
    if c.type.rank != a.type.rank:
        return None
    perm = _perm(t)
    inverse = _inverse(perm)
    if c.is_param:
        moved_c = graph.transpose(c, perm=inverse)
    else:
        position = graph.nodes.index(y.producer)
        existing = [n for n in graph.users().get(c, []) if n.op == "transpose" and _perm(n.outputs[0]) == inverse
                    and graph.nodes.index(n) < position]
        if not existing:
            return None
        moved_c = existing[0].outputs[0]
    operands = [a, moved_c]
    if y.producer.inputs[0] is c:
        operands.reverse()
    moved = graph.add_node(y.producer.op, operands, dict(y.producer.attrs)).outputs[0]
    return graph.transpose(moved, perm=perm)


# reduce(transpose(x, p), axes) = transpose(reduce(x, p[axes]), q): keepdims keeps the rank (q = p, and a transpose
# of the reduced size-1 dims becomes a view); without it q orders x's kept axes as the transposed input had them
def sink_through_reduction(graph: Graph, x: Value, t: Value, y: Value):
    perm = _perm(t)
    attrs = y.producer.attrs
    axes = normalize_axes(attrs["axis"], len(perm))
    reduced = graph.add_node(y.producer.op, [x], {**attrs, "axis": tuple(sorted(perm[a] for a in axes))}).outputs[0]
    if attrs["keepdims"]:
        return graph.transpose(reduced, perm=perm)
    kept = [perm[a] for a in range(len(perm)) if a not in axes]  # x's axes, in the order the result has them
    order = tuple(sorted(kept).index(a) for a in kept)
    return reduced if order == tuple(range(len(order))) else graph.transpose(reduced, perm=order)


# resize(transpose(x, p)) = transpose(resize(x, layout of x), p) for p between NCHW and NHWC: the resize takes x's
# spatial axes where x has them (the channels-last kernel when x is NHWC)
def sink_through_resize(graph: Graph, x: Value, t: Value, y: Value):
    attrs = y.producer.attrs
    source_layout = {("NCHW", PERMS[("NHWC", "NCHW")]): "NHWC", ("NHWC", PERMS[("NCHW", "NHWC")]): "NCHW"}.get(
        (attrs["layout"], _perm(t)))
    if source_layout is None or x.type.rank != 4:
        return None
    return graph.transpose(graph.resize(x, **{**attrs, "layout": source_layout}), perm=_perm(t))


# transpose(x, p) that keeps the order of the dims larger than 1 = reshape(x): a view, no copy
def unit_transpose_to_reshape(graph: Graph, x: Value, y: Value):
    if not x.type.is_concrete:
        return None
    moved = [axis for axis in _perm(y) if x.type.shape[axis] != 1]
    if moved != sorted(moved) or _perm(y) == tuple(range(x.type.rank)):
        return None
    return graph.reshape(x, shape=y.type.shape)


RULES: list[Rule] = [
    (Pat(UNARY_OPS, (Pat("transpose", (Pat(name="x"),), name="t", shared=True),), name="y"), sink_through_unary),
    (Pat(BINARY_OPS, (Pat("transpose", (Pat(name="a"),), name="ta", shared=True),
                      Pat("transpose", (Pat(name="b"),), name="tb", shared=True)), name="y"), sink_through_binary),
    (Pat(BINARY_OPS, (Pat("transpose", (Pat(name="a"),), name="t", shared=True), Pat(name="c")), name="y",
         any_order=True), sink_past_operand),
    (Pat(REDUCTION_OPS, (Pat("transpose", (Pat(name="x"),), name="t", shared=True),), name="y"),
     sink_through_reduction),
    (Pat("resize", (Pat("transpose", (Pat(name="x"),), name="t", shared=True),), name="y"), sink_through_resize),
    (Pat("transpose", (Pat(name="x"),), name="y"), drop_identity_transpose),
    (Pat("transpose", (Pat("transpose", name="inner", shared=True),), name="y"), merge_transposes),
]
# after sinking: what is left of the transposes back
FINAL_RULES: list[Rule] = [(Pat("transpose", (Pat(name="x"),), name="y"), unit_transpose_to_reshape)]


def _sink_through_concat(graph: Graph) -> list[str]:
    """concat(transpose(x0, p), transpose(x1, p), ..., axis) = transpose(concat(x0, x1, ..., axis=p[axis]), p)."""
    notes = []
    for node in list(graph.nodes):
        if node.op != "concat" or node not in graph.nodes:
            continue
        sources = [v.producer if v.producer is not None and v.producer.op == "transpose" else None
                   for v in node.inputs]
        if not sources or any(s is None for s in sources) or len({tuple(s.attrs["perm"]) for s in sources}) != 1:
            continue
        perm = tuple(sources[0].attrs["perm"])
        axis = node.attrs["axis"] % node.outputs[0].type.rank
        with graph.inserting_before(node):
            joined = graph.add_node("concat", [s.inputs[0] for s in sources], {**node.attrs, "axis": perm[axis]},
                                    device=node.device).outputs[0]
            moved = graph.transpose(joined, perm=perm)
        graph.replace_uses(node.outputs[0], moved)
        graph.remove_node(node)
        users = graph.users()
        for source in {id(s): s for s in sources}.values():
            if not users.get(source.outputs[0]) and not graph.is_output(source.outputs[0]):
                graph.remove_node(source)
        notes.append(f"sink_through_concat: {node.name} -> {joined.producer.name}")
    return notes


CHANNEL_VECTOR = 8  # 16-byte vectors of 16-bit channels: what cuDNN's runtime fusion and implicit_gemm read


def _pad_channels(graph: Graph, node) -> str | None:
    """A 16-bit NHWC conv2d (groups 1) whose input channels are not a multiple of 8 (an image's 3) reads x and w
    zero-padded to the next multiple: the fused epilogues (cuDNN's runtime fusion, implicit_gemm) need channel
    vectors, and the zeros add nothing to any sum. w is a parameter (its pad folds as a constant) or padded too."""
    if node.op != "conv2d" or node.attrs["layout"] != "NHWC" or node.attrs["groups"] != 1:
        return None
    x, w = node.inputs[0], node.inputs[1]
    if x.type.dtype not in ("float16", "bfloat16") or x.type.rank != 4 or not x.type.is_concrete:
        return None
    channels = x.type.shape[3]
    extra = -channels % CHANNEL_VECTOR
    if extra == 0:
        return None
    pads = (0, 0, 0, 0, 0, 0, 0, extra)  # begins of the 4 axes, then ends: C grows at its end
    with graph.inserting_before(node):
        inputs = list(node.inputs)
        inputs[0], inputs[1] = graph.pad(x, pads=pads), graph.pad(w, pads=pads)
        rebuilt = graph.add_node(node.op, inputs, dict(node.attrs), device=node.device)
    graph.replace_uses(node.outputs[0], rebuilt.outputs[0])
    graph.remove_node(node)
    return f"pad_channels: {node.name} C {channels} -> {channels + extra} (zeros) as {rebuilt.name}"


def _summary(graph: Graph) -> str:
    """The regions' layouts and the transposes of activations that remain (parameters' fold as constants)."""
    layouts: dict[str, int] = {}
    for node in graph.nodes:
        if node.op in ACTIVATION_OPERANDS:
            layouts[node.attrs["layout"]] = layouts.get(node.attrs["layout"], 0) + 1
    remaining = [f"{n.name} {tuple(n.attrs['perm'])} of {n.inputs[0].name}" for n in graph.nodes
                 if n.op == "transpose" and not n.inputs[0].is_param]
    nodes = ", ".join(f"{count} in {layout}" for layout, count in sorted(layouts.items()))
    return (f"layout regions: layout-aware nodes {nodes or 'none'}; {len(remaining)} activation transpose(s) remain"
            + (": " + "; ".join(remaining) if remaining else ""))


MEASURED_MARGIN = 0.97  # NHWC must be this much faster: the autotuner's margin, and the region's edge transposes
# The costliest distinct problems are timed, until they hold this share of the convolutions' FLOPs or this many: a
# network of 60 conv shapes (DenseNet-121) would otherwise plan 120 one-conv graphs at build time.
MEASURED_FLOPS_SHARE = 0.8
MEASURED_PROBLEMS = 8


def _problem(node) -> tuple:
    """What makes two convolutions the same timing: operand types and attributes."""
    return (tuple(None if v is None else v.type for v in node.inputs),
            tuple(sorted((name, repr(value)) for name, value in node.attrs.items())))


def _measured_float32_layout(graph: Graph, measure) -> tuple[str, str | None]:
    """(the float32 layout, a note) from ``measure(conv node, layout) -> ms`` over the graph's costliest float32 4-d
    convolution problems (each weighted by how many nodes share it); NCHW when there is none, or when timing one
    fails (the note says why)."""
    convs = [n for n in graph.nodes if n.op == "conv2d" and n.inputs[0].type.dtype == "float32"
             and n.inputs[0].type.rank == 4 and n.inputs[0].type.is_concrete]
    if not convs:
        return PREFERRED["float32"], None
    problems: dict[tuple, list] = {}
    for node in convs:
        problems.setdefault(_problem(node), []).append(node)
    flops = {key: len(nodes) * nodes[0].opdef.flop_count([None if v is None else v.type for v in nodes[0].inputs],
                                                         [v.type for v in nodes[0].outputs], nodes[0].attrs)
             for key, nodes in problems.items()}
    total, covered, chosen_keys = sum(flops.values()), 0.0, []
    for key in sorted(problems, key=flops.get, reverse=True):
        if len(chosen_keys) == MEASURED_PROBLEMS or (chosen_keys and covered >= MEASURED_FLOPS_SHARE * total):
            break
        chosen_keys.append(key)
        covered += flops[key]
    totals = {}
    for layout in ("NCHW", "NHWC"):
        try:
            totals[layout] = sum(len(problems[key]) * measure(problems[key][0], layout) for key in chosen_keys)
        except (RuntimeError, ValueError) as error:  # a plan that cannot be built: the layout stays unmeasured
            return PREFERRED["float32"], (f"float32 layout: {PREFERRED['float32']} (timing it in {layout} failed: "
                                          f"{error})")
    chosen = "NHWC" if totals["NHWC"] < MEASURED_MARGIN * totals["NCHW"] else "NCHW"
    share = covered / total if total else 1.0
    return chosen, (f"float32 layout by measurement: the {len(chosen_keys)} costliest of {len(problems)} convolution "
                    f"problem(s) ({share:.0%} of the FLOPs), NCHW {totals['NCHW']:.4f} ms, NHWC "
                    f"{totals['NHWC']:.4f} ms -> {chosen}")


def plan_layouts(graph: Graph, measure=None) -> list:
    notes: list = []
    transposed: dict = {}
    preferred = dict(PREFERRED)
    if measure is not None:
        preferred["float32"], measured = _measured_float32_layout(graph, measure)
        notes += [measured] if measured else []
    for node in list(graph.nodes):
        if node.op in ACTIVATION_OPERANDS:
            note = _relayout(graph, node, transposed, preferred)
            if note:
                notes.append(note)
    notes += [note for note in map(functools.partial(_pad_channels, graph), list(graph.nodes)) if note]
    if notes:
        for _ in range(len(graph.nodes)):  # concat and the rules may each unblock the other
            changed = rewrite(graph, RULES) + _sink_through_concat(graph)
            notes += changed
            if not changed:
                break
        notes += rewrite(graph, FINAL_RULES)
        notes.append(_summary(graph))
    return notes
