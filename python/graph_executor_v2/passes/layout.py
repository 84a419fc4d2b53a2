"""Layout planning for convolutional networks: every layout-aware node runs in the layout its dtype prefers, and
transposes remain only at the edges of each region of such nodes.

``PREFERRED``: NHWC for float16/bfloat16 (cuDNN's runtime-fusion engines, which fuse a conv's bias, residual and
activation, and GE2's implicit GEMM take only channels-last; pooling and batch norm read channel vectors), NCHW for
float32 unless measured otherwise, region by region. A float32 region is a maximal set of layout-aware nodes and of
the ops step 2 moves transposes through, connected by float32 4-d activations, with a convolution in it: what ends
up with one transpose at each entry and exit. Given ``measure`` and the copy bandwidth (an executor on CUDA passes
``runtime/layout_timing.py``'s timer and the roofline's measured copy), the graph's costliest distinct float32
convolution problems (up to 8 or 80% of the FLOPs, each timed once in each layout with its fastest kernel, as the plan
will choose) are summed per region, the transposes its edges would need are added to the layout it is not in (bytes
read and written at the copy bandwidth), and the region takes NHWC where that total is more than 3% below NCHW's (the
autotuner's margin). A note per region says its convs, both sums, the transposes' cost and the choice (or why it
stays NCHW: no timed problem, a timing that failed). Without ``measure`` (the CPU, no GPU) an NCHW float32 graph, as
every exported one is, is left alone.

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
5. Where that pad reads a conv's output (through an activation that keeps 0 at 0: EfficientNet's squeeze-and-
   excitation, a 96 -> 4 conv and silu before the 4 -> 96 conv), the producer computes the zero channels itself
   instead: its weights and bias get zero filters (folded as constants), and the pad, a kernel launch of its own,
   drops (``widen_conv_output``).

``ACTIVATION_OPERANDS`` says which inputs and outputs of each layout-aware op are activations in its layout; the
rest (statistics, per-channel vectors) do not depend on it. conv2d's weight follows its layout (KCRS for NCHW, KRSC
for NHWC), so it is transposed with the activations (a parameter: folded once, at pass time), and so is its fused
residual. The pass's last note counts the nodes in each layout and the transposes of activations that remain.
"""
from __future__ import annotations

import functools
import math
import numbers

from ..dtypes import itemsize
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


def _relayout(graph: Graph, node, transposed: dict, target: str | None) -> str | None:
    """Rebuilds ``node`` in the ``target`` layout; None when it already is (or is not 4-d, or target is None).
    ``transposed`` maps (value, perm) to the transposes built so far, so a value read by several nodes is transposed
    once."""
    inputs, outputs = ACTIVATION_OPERANDS[node.op]
    x = node.inputs[0]
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


def _is_view(shape, perm) -> bool:
    """Whether transposing a concrete ``shape`` by ``perm`` keeps the order of the dims larger than 1 (a reshape)."""
    moved = [axis for axis in perm if shape[axis] != 1]
    return moved == sorted(moved)


# transpose(x, p) that keeps the order of the dims larger than 1 = reshape(x): a view, no copy
def unit_transpose_to_reshape(graph: Graph, x: Value, y: Value):
    if not x.type.is_concrete or not _is_view(x.type.shape, _perm(y)) or _perm(y) == tuple(range(x.type.rank)):
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


# The unary ops and conv2d activations with f(0) = 0: a channel of zero filters and zero bias stays 0 through them
ZERO_PRESERVING_OPS = ("relu", "gelu", "gelu_erf", "silu", "tanh", "neg")
ZERO_PRESERVING_CONV_ACTS = ("none", "relu", "gelu", "silu", "leaky_relu")


def _folds(value: Value) -> bool:
    """Whether constant folding turns the value into a parameter: a parameter, or pure ops of parameters only (a
    conv weight this pass transposed, not folded yet). Walked without recursion: a value computed from the graph's
    input reaches it through every layer."""
    pending, seen = [value], set()
    while pending:
        current = pending.pop()
        if current is None or current in seen:
            continue
        seen.add(current)
        node = current.producer
        if node is None:
            if not current.is_param:  # a graph input
                return False
            continue
        if not node.opdef.pure:
            return False
        pending += node.inputs
    return True


def _channel_extra(pad: Value) -> int | None:
    """The zero channels a constant-zero pad adds at the end of a 4-d value's last axis and nowhere else, or None."""
    attrs = pad.producer.attrs
    pads = tuple(attrs["pads"])
    if attrs["mode"] != "constant" or attrs["value"] != 0.0 or len(pads) != 8 or any(pads[:7]) or pads[7] <= 0:
        return None
    return pads[7]


# pad(f(conv2d(x, w, b)), C + extra) = f(conv2d(x, w', b')), w' and b' with `extra` zero filters: a zero filter's
# output is 0 (plus a zero bias), and f(0) = 0 (f: none, or a ZERO_PRESERVING op; conv2d's own act and clip alike)
def widen_conv_output(graph: Graph, conv: Value, y: Value, act: Value | None = None):
    extra = _channel_extra(y)
    node = conv.producer
    attrs = node.attrs
    weight, bias = node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None
    residual = node.inputs[3] if len(node.inputs) > 3 else None
    clip_keeps_zero = ((attrs.get("clip_min") is None or attrs["clip_min"] <= 0.0)
                       and (attrs.get("clip_max") is None or attrs["clip_max"] >= 0.0))
    if (extra is None or attrs["layout"] != "NHWC" or attrs["groups"] != 1 or residual is not None
            or attrs["act"] not in ZERO_PRESERVING_CONV_ACTS or not clip_keeps_zero or not _folds(weight)
            or not (bias is None or _folds(bias))):
        return None
    inputs = list(node.inputs)
    inputs[1] = graph.pad(weight, pads=(0, 0, 0, 0, extra, 0, 0, 0))  # [K, R, S, C]: K grows at its end
    if bias is not None:
        inputs[2] = graph.pad(bias, pads=(0, extra))
    widened = graph.add_node("conv2d", inputs, dict(attrs), device=node.device).outputs[0]
    if act is None:
        return widened
    return graph.add_node(act.producer.op, [widened], dict(act.producer.attrs), device=act.producer.device).outputs[0]


WIDEN_RULES: list[Rule] = [
    (Pat("pad", (Pat(ZERO_PRESERVING_OPS, (Pat("conv2d", name="conv"),), name="act"),), name="y"),
     widen_conv_output),
    (Pat("pad", (Pat("conv2d", name="conv"),), name="y"), widen_conv_output),
]


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


MEASURED_MARGIN = 0.97  # a layout must be this much faster (the autotuner's margin)
# The costliest distinct problems are timed, until they hold this share of the convolutions' FLOPs or this many: a
# network of 60 conv shapes (DenseNet-121) would otherwise plan 120 one-conv graphs at build time.
MEASURED_FLOPS_SHARE = 0.8
MEASURED_PROBLEMS = 8
# Ops a region's layout passes through (step 2's rules): its nodes, besides the layout-aware ones
LAYOUT_FREE_OPS = frozenset(UNARY_OPS + BINARY_OPS + REDUCTION_OPS + ("resize", "concat"))


def _problem(node) -> tuple:
    """What makes two convolutions the same timing: operand types and attributes."""
    return (tuple(None if v is None else v.type for v in node.inputs),
            tuple(sorted((name, repr(value)) for name, value in node.attrs.items())))


def _is_float32_conv(node) -> bool:
    return node.op == "conv2d" and node.inputs[0].type.dtype == "float32" and node.inputs[0].type.rank == 4 \
        and node.inputs[0].type.is_concrete


def _float32_activations(node) -> tuple[list, list]:
    """(inputs, outputs) of ``node`` that are float32 4-d activations: the values a layout change transposes."""
    if node.op in ACTIVATION_OPERANDS:
        positions_in, positions_out = ACTIVATION_OPERANDS[node.op]
        inputs = [node.inputs[i] for i in positions_in if i < len(node.inputs)]
        outputs = [node.outputs[i] for i in positions_out]
    else:
        inputs, outputs = node.inputs, node.outputs

    def activation(value):
        return value is not None and not value.is_param and value.type.dtype == "float32" and value.type.rank == 4 \
            and value.type.is_concrete
    return [v for v in inputs if activation(v)], [v for v in outputs if activation(v)]


def _float32_regions(graph: Graph) -> list[list]:
    """The float32 regions, each its nodes in graph order: maximal sets of layout-aware and layout-free nodes
    connected through float32 4-d activations, each holding a float32 4-d convolution. They are what step 2 leaves
    with one transpose at each entry and exit when the region changes layout."""
    root = {node: node for node in graph.nodes if node.op in ACTIVATION_OPERANDS or node.op in LAYOUT_FREE_OPS}

    def find(node):
        while root[node] is not node:
            root[node] = root[root[node]]
            node = root[node]
        return node

    first_toucher: dict = {}
    for node in root:
        inputs, outputs = _float32_activations(node)
        for value in inputs + outputs:
            root[find(node)] = find(first_toucher.setdefault(value, node))
    regions: dict = {}
    for node in root:
        regions.setdefault(find(node), []).append(node)
    return [nodes for nodes in regions.values() if any(map(_is_float32_conv, nodes))]


def _edge_bytes(graph: Graph, region: list, current: str) -> tuple[int, int]:
    """(transposes, bytes they read and write) at ``region``'s entries and exits if it left ``current``: each
    activation produced outside and read inside, or produced inside and read outside (or a graph output), once. A
    transpose that only moves size-1 dims is a view (step 3) and costs nothing."""
    members, users = set(region), graph.users()
    edges: dict = {}
    for node in region:
        inputs, outputs = _float32_activations(node)
        for value in inputs:
            if value.producer not in members:
                edges[value] = None
        for value in outputs:
            if graph.is_output(value) or any(user not in members for user in users.get(value, [])):
                edges[value] = None
    perm = PERMS[(current, "NHWC" if current == "NCHW" else "NCHW")]
    moving = [v for v in edges if not _is_view(v.type.shape, perm)]
    return len(moving), sum(2 * v.type.numel * itemsize(v.type.dtype) for v in moving)


def _positive(number) -> bool:
    return isinstance(number, numbers.Real) and not isinstance(number, bool) and math.isfinite(number) and number > 0


def _timed(measure, node, layout: str) -> float:
    """``measure(node, layout)``, checked: a time in ms, positive and finite."""
    ms = measure(node, layout)
    if not _positive(ms):
        raise ValueError(f"measure returned {ms!r}, expected a positive finite time in ms")
    return float(ms)


def _measured_float32_layouts(graph: Graph, measure, copy_bytes_per_s: float) -> tuple[dict, list]:
    """({layout-aware node: its float32 layout}, notes), region by region. The graph's costliest float32 4-d
    convolution problems (each weighted by how many nodes share it; bounded over the whole graph) are timed once
    each by ``measure(conv node, layout) -> ms``; a region sums its own convolutions of those problems in both
    layouts, adds to the layout it is not in the transposes its edges would need (bytes read and written at
    ``copy_bytes_per_s``), and takes NHWC when that total is more than 3% below NCHW's. A region keeps NCHW when
    none of its problems was timed, or when timing one failed (its note says why)."""
    regions = _float32_regions(graph)
    if not regions:
        return {}, []
    problems: dict[tuple, list] = {}
    for region in regions:
        for node in region:
            if _is_float32_conv(node):
                problems.setdefault(_problem(node), []).append(node)
    flops = {key: len(nodes) * nodes[0].opdef.flop_count([None if v is None else v.type for v in nodes[0].inputs],
                                                         [v.type for v in nodes[0].outputs], nodes[0].attrs)
             for key, nodes in problems.items()}
    total, covered, timed_keys = sum(flops.values()), 0.0, []
    for key in sorted(problems, key=flops.get, reverse=True):
        if len(timed_keys) == MEASURED_PROBLEMS or (timed_keys and covered >= MEASURED_FLOPS_SHARE * total):
            break
        timed_keys.append(key)
        covered += flops[key]
    times: dict[tuple, dict] = {}  # problem -> {layout: ms}, or the failure's text under "failed"
    for key in timed_keys:
        times[key] = {}
        for layout in ("NCHW", "NHWC"):
            try:
                times[key][layout] = _timed(measure, problems[key][0], layout)
            except (RuntimeError, ValueError) as error:  # a plan that cannot be built: the problem stays unmeasured
                times[key] = {"failed": f"timing {problems[key][0].name} in {layout} failed: {error}"}
                break
    share = covered / total if total else 1.0
    notes = [f"float32 layout by measurement: the {len(timed_keys)} costliest of {len(problems)} convolution "
             f"problem(s) ({share:.0%} of the FLOPs), {len(regions)} region(s)"]
    layouts: dict = {}
    for number, region in enumerate(regions, 1):
        convs = [n for n in region if _is_float32_conv(n)]
        timed = [n for n in convs if _problem(n) in times]
        heading = (f"float32 region {number} of {len(regions)}: {len(convs)} conv(s) "
                   f"({', '.join(n.name for n in convs)}), {len(timed)} timed")
        failures = [times[_problem(n)]["failed"] for n in timed if "failed" in times[_problem(n)]]
        if failures or not timed:
            reason = failures[0] if failures else "none of its convolutions is among the costliest problems"
            notes.append(f"{heading}: NCHW ({reason})")
            continue
        current = "NHWC" if 2 * sum(n.attrs["layout"] == "NHWC" for n in convs) > len(convs) else "NCHW"
        other = "NHWC" if current == "NCHW" else "NCHW"
        count, moved = _edge_bytes(graph, region, current)
        sums = {layout: sum(times[_problem(n)][layout] for n in timed) for layout in ("NCHW", "NHWC")}
        transposes_ms = moved / copy_bytes_per_s * 1e3
        totals = {**sums, other: sums[other] + transposes_ms}
        chosen = "NHWC" if totals["NHWC"] < MEASURED_MARGIN * totals["NCHW"] else "NCHW"
        layouts.update({n: chosen for n in region if n.op in ACTIVATION_OPERANDS})
        notes.append(f"{heading}: NCHW {sums['NCHW']:.4f} ms, NHWC "
                     f"{sums['NHWC']:.4f} ms, {other} + {transposes_ms:.4f} ms of transposes ({count} at its edges, "
                     f"{moved} bytes at {copy_bytes_per_s / 1e9:.0f} GB/s) -> {chosen}")
    return layouts, notes


def plan_layouts(graph: Graph, measure=None, copy_bytes_per_s: float | None = None) -> list:
    """See the module's doc. ``measure(conv node, layout) -> ms`` and the device's ``copy_bytes_per_s`` (read +
    write) choose each float32 region's layout; without them every float32 node takes NCHW."""
    if measure is not None and not _positive(copy_bytes_per_s):
        raise ValueError(f"copy_bytes_per_s: expected a positive number of bytes per second with measure, got "
                         f"{copy_bytes_per_s!r}")
    notes: list = []
    transposed: dict = {}
    layouts: dict = {}
    if measure is not None:
        layouts, measured = _measured_float32_layouts(graph, measure, copy_bytes_per_s)
        notes += measured
    for node in list(graph.nodes):
        if node.op in ACTIVATION_OPERANDS:
            note = _relayout(graph, node, transposed, layouts.get(node, PREFERRED.get(node.inputs[0].type.dtype)))
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
    notes += rewrite(graph, WIDEN_RULES)  # pad_channels' pads, and those of a graph that was NHWC already
    if notes:
        notes.append(_summary(graph))
    return notes
