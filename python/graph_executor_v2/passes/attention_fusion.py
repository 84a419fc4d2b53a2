"""Attention fusion, one pass shared by both frontends: the written-out attention becomes one ``attention`` node,
and every attention node is simplified (``simplify_attention``).

The 4-d form, [batch, heads, seq, dim] (both exporters' eager attention and their decomposition of
scaled_dot_product_attention; each intermediate read by the next node only)::

    scores = matmul(q [* a], kt [* b])               kt: transpose(k, (0, 1, 3, 2)); transpose(k, (0, 2, 3, 1)) of a
    logits = scores [* c or / c]                         [batch, seq, heads, dim] k; or the dynamo exporter's
             [+ mask, or where(hidden, -inf, .),         reshape(transpose(reshape(k, [b * h, s, d]), (0, 2, 1)))
              or where(keep, ., -inf)]               a, b, c: one-element parameters; mask: any additive tensor
    p      = [cast, dropout p=0, where(isnan(.), 0, .)] softmax([cast] logits, axis=-1)
    y      = matmul(p, v)                                       (T5's relative position bias, BERT's padding mask)
  ->
    y = attention(q, k, v, bias, scale=a * b * c)

with the mask as the op's additive bias [1 or batch, 1 or heads, seq_q, seq_k] (``attention_bias``); a constant
causal mask is ``causal=True`` and a zero one none. Without a bias, q, k and v that are each transpose(x, (0, 2, 1,
3)) of [batch, seq, heads, dim] projections are read in the "bshd" layout and the head transposes go away.

The 2-d form of one head (matmul(q, transpose(k)) with a causal mask or none) becomes attention on [1, 1, seq, d]
views. ``simplify_attention`` then turns a constant causal bias into ``causal=True``, drops a zero bias, and reads
K/V heads repeated for grouped queries (``repeat_kv``: reshape(expand(reshape(k))), or repeat_interleave) directly,
the op's native grouped-query attention.

RoPE's rotate-half, concat(-x[..., d/2:], x[..., :d/2]), becomes roll(x, d/2) * [-1 .. -1, 1 .. 1]: one
data-movement kernel and a multiply the pointwise fusion takes with the rest of x * cos + rotate_half(x) * sin.

Anything else (another mask, a softmax over another axis, an interior value read elsewhere) is left as it is. The
pass runs before canonicalization, which would turn the matmuls into gemms.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import FLOAT_DTYPES, to_numpy
from ..ir import dims
from ..ir.graph import Graph, Node, Value
from ..ops.slice import axis_slice
from .cleanup import eliminate_dead_code
from .pattern import Pat, Rule, remove_unused, rewrite


def _scalar(value: Value) -> float | None:
    """The value of a one-element parameter, or None."""
    if not value.is_param or value.data.size != 1:
        return None
    scalar = float(np.asarray(value.data, dtype=np.float64).reshape(-1)[0])
    return scalar if np.isfinite(scalar) and scalar != 0 else None


def is_causal_bias(data: np.ndarray, seq_q, seq_k) -> bool:
    """Whether ``data`` is the additive top-left causal mask of [seq_q, seq_k] scores: 0 where j <= i, and
    elsewhere -inf or, as PyTorch's exported scaled_dot_product_attention writes it, a value at most half its
    dtype's lowest (finfo.min): a score plus that underflows to probability 0 as -inf does, for any scores a
    softmax of that dtype holds."""
    if not isinstance(seq_q, int) or not isinstance(seq_k, int):
        return False
    data = np.asarray(data)
    if data.shape != (seq_q, seq_k) or data.dtype.kind != "f":
        return False
    visible = np.tril(np.ones((seq_q, seq_k), dtype=bool))
    hidden = data[~visible].astype(np.float64)
    return bool((data[visible] == 0).all() and (np.isneginf(hidden) | (hidden <= np.finfo(data.dtype).min / 2)).all())


def _one_square(data: np.ndarray) -> np.ndarray | None:
    """The [seq_q, seq_k] matrix of a constant bias [..., seq_q, seq_k] that repeats it over every leading dim (an
    exporter's causal mask expanded over the batch), else None."""
    if data.ndim < 2:
        return None
    square = data.reshape((-1,) + data.shape[-2:])
    return square[0] if (square == square[:1]).all() else None


def _is_causal_mask(mask: Value, seq_q, seq_k) -> bool:
    return mask.is_param and is_causal_bias(mask.data, seq_q, seq_k)


def _fuse(graph: Graph, scores: Value, factor: Value, probs: Value, v: Value, mask: Value | None, divide: bool):
    matmul = scores.producer
    q, kt = matmul.inputs
    if kt.producer is None or kt.producer.op != "transpose" or tuple(kt.producer.attrs["perm"]) != (1, 0):
        return None
    k = kt.producer.inputs[0]
    if probs.producer.attrs["axis"] not in (-1, 1):
        return None
    scalar = _scalar(factor)
    if scalar is None:
        return None
    types = [x.type for x in (q, k, v)]
    if any(t.rank != 2 for t in types) or len({t.dtype for t in types}) != 1 or types[0].dtype not in FLOAT_DTYPES:
        return None
    (seq_q, head_dim), (seq_k, k_dim), v_shape = types[0].shape, types[1].shape, types[2].shape
    if not isinstance(head_dim, int) or k_dim != head_dim or tuple(v_shape) != (seq_k, head_dim):
        return None
    if mask is not None and not _is_causal_mask(mask, seq_q, seq_k):
        return None
    heads = [graph.reshape(x, shape=(1, 1, -1, head_dim)) for x in (q, k, v)]
    y, _ = graph.attention(*heads, causal=mask is not None, scale=1.0 / scalar if divide else scalar)
    return graph.reshape(y, shape=(-1, head_dim))


def _rule(scale_op: str, masked: bool) -> Rule:
    scores = Pat("matmul", (Pat(name="q"), Pat("transpose", name="kt")), name="scores")
    scaled = Pat(scale_op, (scores, Pat(name="factor")), any_order=scale_op == "mul")
    logits = Pat("add", (scaled, Pat(name="mask")), any_order=True) if masked else scaled
    pattern = Pat("matmul", (Pat("softmax", (logits,), name="probs"), Pat(name="v")))

    def fuse_attention(graph: Graph, scores, factor, probs, v, q=None, kt=None, mask=None):
        return _fuse(graph, scores, factor, probs, v, mask, divide=scale_op == "div")

    return pattern, fuse_attention


RULES: list[Rule] = [_rule(scale_op, masked) for masked in (True, False) for scale_op in ("mul", "div")]


def attention_bias(graph: Graph, mask: Value, q: Value, k: Value) -> Value:
    """The additive bias [1 or batch, 1 or heads, seq_q, seq_k] of the attention of [batch, heads, seq, dim] q and k
    for ``mask`` as PyTorch's scaled_dot_product_attention takes it (broadcastable to [batch, heads, seq_q, seq_k]):
    a boolean mask keeps the True positions (the others get -inf), a float mask is added as it is."""
    dtype = q.type.dtype
    if mask.type.dtype == "bool":
        zero = graph.param(graph.unique_name("mask_keep"), np.array(0, to_numpy(dtype)))
        hidden = graph.param(graph.unique_name("mask_hidden"), np.array(-np.inf, to_numpy(dtype)))
        bias = graph.where(mask, zero, hidden)
    else:
        bias = mask if mask.type.dtype == dtype else graph.cast(mask, dtype=dtype)
    if bias.type.rank > 4:
        raise ValueError(f"attn_mask: expected at most 4 dims, got shape {bias.type.shape}")
    if bias.type.rank < 4:
        bias = graph.reshape(bias, shape=(1,) * (4 - bias.type.rank) + tuple(bias.type.shape))
    batch, heads, seq_q = q.type.shape[:3]
    target = (bias.type.shape[0], bias.type.shape[1], seq_q, k.type.shape[2])
    if tuple(bias.type.shape) != target:
        bias = graph.expand(bias, shape=target)
    return bias


def _repeated_heads(value: Value) -> tuple[Value, int] | None:
    """(k, n) when ``value`` is k [batch, heads, seq, dim] with every head repeated n times in place (HF's
    repeat_kv: reshape(expand(reshape(k, [b, h, 1, s, d]), [b, h, n, s, d]), [b, h * n, s, d]), or
    repeat_interleave(k, n, axis=1)); else None."""
    node = value.producer
    if node is None:
        return None
    if node.op == "repeat_interleave" and node.attrs["axis"] % 4 == 1 and value.type.rank == 4:
        return node.inputs[0], node.attrs["repeats"]
    if node.op != "reshape" or value.type.rank != 4:
        return None
    expand = node.inputs[0].producer
    if expand is None or expand.op != "expand" or expand.outputs[0].type.rank != 5:
        return None
    inner = expand.inputs[0]
    if inner.producer is None or inner.producer.op != "reshape" or inner.type.rank != 5:
        return None
    source = inner.producer.inputs[0]
    batch, heads, one, seq, dim = inner.type.shape
    expanded = tuple(expand.outputs[0].type.shape)
    if source.type.rank != 4 or one != 1 or tuple(source.type.shape) != (batch, heads, seq, dim):
        return None
    repeats = expanded[2]
    if expanded != (batch, heads, repeats, seq, dim) or not isinstance(repeats, int):
        return None
    if tuple(value.type.shape) != (batch, dims.product(heads, repeats), seq, dim):
        return None
    return source, repeats


class _Constants:
    """The values computed from parameters only (an exporter's mask built from constants and arange comparisons),
    found in one sweep in graph order and computed on demand by the ops' references. A value of symbolic shape is
    none of them (a constant expanded to the sequence length is known only once a plan binds it)."""

    def __init__(self, graph: Graph):
        self.derived: set[Value] = set()
        for node in graph.nodes:
            if (node.opdef.pure and len(node.outputs) == 1 and node.outputs[0].type.is_concrete
                    and all(x is None or x.is_param or x in self.derived for x in node.inputs)):
                self.derived.add(node.outputs[0])
        self.known: dict[Value, np.ndarray] = {}

    def value(self, value: Value) -> np.ndarray | None:
        """The value of ``value`` when it depends on parameters only; None when it depends on an input."""
        if value.is_param:
            return np.asarray(value.data)
        if value not in self.derived:
            return None
        if value not in self.known:
            node = value.producer
            inputs = [None if x is None else self.value(x) for x in node.inputs]
            self.known[value] = node.opdef.run_reference(inputs, node.attrs)[0]
        return self.known[value]


def simplify_attention(graph: Graph) -> list[str]:
    """Every attention node: a constant causal bias (a parameter, or computed from parameters only) -> causal=True, a
    zero bias dropped, repeated K/V heads read directly (the op's grouped-query attention)."""
    notes = []
    constants = _Constants(graph)
    for node in graph.nodes:
        if node.op != "attention":
            continue
        q, k, v, bias = node.inputs
        if node.attrs["layout"] == "bhsd":
            keys, values = _repeated_heads(k), _repeated_heads(v)
            if keys is not None and values is not None and keys[1] == values[1]:
                node.inputs[1], node.inputs[2] = keys[0], values[0]
                notes.append(f"{node.name}: K/V heads repeated {keys[1]}x read as grouped-query attention")
        data = None if bias is None else constants.value(bias)
        if data is None:
            continue
        seq_q, seq_k = q.type.shape[2], k.type.shape[2]
        if not np.any(data):
            node.inputs[3] = None
            notes.append(f"{node.name}: zero bias dropped")
        elif (square := _one_square(data)) is not None and is_causal_bias(square, seq_q, seq_k):
            node.inputs[3] = None
            node.attrs["causal"] = True
            notes.append(f"{node.name}: causal bias -> causal=True")
    return notes


# --- the 4-d attention ------------------------------------------------------------------------------------------
class _Match:
    """The walk from one matmul(probs, v) back to q and k: interior nodes must feed only the next one."""

    def __init__(self, graph: Graph, users: dict, constants: _Constants, root: Node):
        self.graph, self.users, self.constants, self.root = graph, users, constants, root
        self.nodes: list[Node] = [root]

    def sole(self, value: Value | None, ops: tuple, readers: int = 1) -> Node | None:
        """The producer of ``value`` when it is one of ``ops`` and ``value`` feeds ``readers`` nodes (those of the
        pattern) and is no graph output."""
        node = None if value is None else value.producer
        if (node is None or node.op not in ops or len(node.outputs) != 1
                or len(self.users.get(value, ())) != readers or self.graph.is_output(value)
                or node.device != self.root.device):
            return None
        return node

    def nan_rows_zeroed(self, node: Node) -> Value | None:
        """p for ``node`` = where(isnan(p), 0, p): torchlib's scaled_dot_product_attention zeroes the rows of a
        softmax over keys that are all hidden, as the attention op does (y = 0 for a row with no visible key)."""
        condition, zero, kept = node.inputs
        test = self.sole(condition, ("isnan",))
        fill = self.constants.value(zero)
        if test is None or test.inputs[0] is not kept or fill is None or np.any(fill):
            return None
        self.take(test)
        return kept

    def take(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    def unscaled(self, value: Value, divide_too: bool = False) -> tuple[Value, float]:
        """(x, factor) for ``value`` = x * factor (or x / factor' with ``divide_too``); x itself with factor 1."""
        node = self.sole(value, ("mul", "div") if divide_too else ("mul",))
        if node is not None:
            a, b = node.inputs
            if node.op == "mul" and _scalar(a) is not None:
                self.take(node)
                return b, _scalar(a)
            if _scalar(b) is not None:
                self.take(node)
                return a, _scalar(b) if node.op == "mul" else 1.0 / _scalar(b)
        return value, 1.0

    def is_lowest(self, value: Value) -> bool:
        """A constant of -inf, or of at most half its dtype's lowest (finfo.min, what exporters fill masks with)."""
        data = self.constants.value(value)
        if data is None or data.dtype.kind != "f" or data.size == 0:
            return False
        lowest = np.finfo(np.float32 if value.type.dtype == "bfloat16" else to_numpy(value.type.dtype)).min
        data = data.astype(np.float64)
        return bool((np.isneginf(data) | (data <= lowest / 2)).all())

    def is_scores(self, value: Value) -> bool:
        """Whether ``value`` is q k^T, maybe scaled (which operand of the masking add is the scores)."""
        scaled = self.sole(value, ("mul", "div"))
        if scaled is not None and any(_scalar(x) is not None for x in scaled.inputs):
            value = next(x for x in scaled.inputs if _scalar(x) is None)
        return self.sole(value, ("matmul",)) is not None

    def key(self, kt: Value) -> tuple[Value, str] | None:
        """(k, its layout) for ``kt`` = k^T: transpose(k, (0, 1, 3, 2)) of a "bhsd" k, transpose(k, (0, 2, 3, 1)) of
        a "bshd" one, or reshape(transpose(x, (0, 2, 1)), [b, h, d, s]) of an x of [b * h, s, d]: k is x reshaped to
        [b, h, s, d], or, where x = reshape(k, [b * h, s, d]), that k (of any shape with those elements: the exporter
        merges repeat_kv's reshape of [b, h_kv, n, s, d] into it; k is then reshaped to [b, h, s, d], where the
        grouped-query simplification finds repeat_kv again)."""
        node = self.sole(kt, ("transpose", "reshape"))
        if node is None:
            return None
        if node.op == "transpose":
            layout = {(0, 1, 3, 2): "bhsd", (0, 2, 3, 1): "bshd"}.get(tuple(a % 4 for a in node.attrs["perm"]))
            return (self.take(node).inputs[0], layout) if layout and kt.type.rank == 4 else None
        inner = self.sole(node.inputs[0], ("transpose",))
        if inner is None or tuple(a % 3 for a in inner.attrs["perm"]) != (0, 2, 1):
            return None
        if kt.type.rank != 4:
            return None
        batch, heads, dim, seq = kt.type.shape
        shapes = [tuple(x.type.shape) for x in (inner.inputs[0], node.inputs[0])]
        bh = dims.product(batch, heads)
        if shapes != [(bh, seq, dim), (bh, dim, seq)]:
            return None
        for taken in (node, inner):
            self.take(taken)
        # k = the [b * h, s, d] tensor reshaped, whatever produced it: nn.MultiheadAttention's export (ViT-B/16)
        # makes it by a transpose of [s, b * h, d], not by a reshape of k
        flatten = self.sole(inner.inputs[0], ("reshape",))
        key = inner.inputs[0] if flatten is None else self.take(flatten).inputs[0]
        if tuple(key.type.shape) != (batch, heads, seq, dim):
            key = self.graph.reshape(key, shape=(batch, heads, seq, dim))
        return key, "bhsd"


def _head_source(value: Value) -> Value | None:
    """x for ``value`` = transpose(x, (0, 2, 1, 3)): the [batch, seq, heads, dim] tensor the heads were split from."""
    node = value.producer
    if node is None or node.op != "transpose" or tuple(a % 4 for a in node.attrs["perm"]) != (0, 2, 1, 3):
        return None
    return node.inputs[0]


def _attention_4d(graph: Graph, users: dict, constants: _Constants, root: Node) -> tuple[Value, list[Node]] | None:
    """The attention replacing ``root`` = matmul(probs, v) and the nodes it replaces, or None (see the module)."""
    match = _Match(graph, users, constants, root)
    probs, v = root.inputs
    if v.type.rank != 4 or probs.type.rank != 4 or v.type.dtype not in FLOAT_DTYPES:
        return None
    between = ("cast", "dropout", "where", "softmax")
    node = match.sole(probs, between)
    while node is not None and node.op != "softmax":  # softmax in float32 cast back; dropout p = 0; NaN rows zeroed
        match.take(node)
        if node.op == "dropout" and node.attrs["p"] != 0.0:
            return None
        if node.op == "where":
            kept = match.nan_rows_zeroed(node)
            node = None if kept is None else match.sole(kept, between, readers=2)  # read by isnan and where
        else:
            node = match.sole(node.inputs[0], between)
    if node is None or node.attrs["axis"] % 4 != 3:
        return None
    logits = match.take(node).inputs[0]
    widened = match.sole(logits, ("cast",))
    if widened is not None and widened.inputs[0].type.dtype == v.type.dtype:
        logits = match.take(widened).inputs[0]
    mask, hidden = None, False  # hidden: the mask is a boolean that is True where a key is hidden
    masking = match.sole(logits, ("add", "where"))
    if masking is not None and masking.op == "add":
        first, second = masking.inputs
        if not match.is_scores(first) and not match.is_scores(second):
            return None
        logits, mask = (first, second) if match.is_scores(first) else (second, first)
        match.take(masking)
    elif masking is not None:
        condition, x, y = masking.inputs
        if condition.type.dtype != "bool":
            return None
        if match.is_lowest(x) and match.is_scores(y):
            logits, mask, hidden = y, condition, True
        elif match.is_lowest(y) and match.is_scores(x):
            logits, mask = x, condition
        else:
            return None
        match.take(masking)
    scores, scale = match.unscaled(logits, divide_too=True)
    product = match.sole(scores, ("matmul",))
    if product is None:
        return None
    match.take(product)
    q, q_factor = match.unscaled(product.inputs[0])
    kt, k_factor = match.unscaled(product.inputs[1])
    key = match.key(kt)
    if key is None:
        return None
    k, k_layout = key
    if q.type.rank != 4 or k.type.rank != 4 or len({q.type.dtype, k.type.dtype, v.type.dtype}) != 1:
        return None
    k_shape = tuple(k.type.shape[axis] for axis in ((0, 1, 2, 3) if k_layout == "bhsd" else (0, 2, 1, 3)))
    batch, heads, seq_q, head_dim = q.type.shape
    seq_k = k_shape[2]
    if k_shape != (batch, heads, seq_k, head_dim) or tuple(v.type.shape) != k_shape:
        return None
    scale *= q_factor * k_factor
    causal, bias_data = False, None
    if mask is not None and (data := constants.value(mask)) is not None:
        bias_data = np.where(data, -np.inf, 0.0) if hidden else (
            np.where(data, 0.0, -np.inf) if data.dtype == bool else data.astype(np.float64))
        if bias_data.ndim > 4:
            return None
        square = _one_square(bias_data)
        if not np.any(bias_data):
            mask, bias_data = None, None
        elif square is not None and is_causal_bias(square.astype(to_numpy(q.type.dtype)), seq_q, seq_k):
            mask, bias_data, causal = None, None, True
    if mask is None:
        sources = [_head_source(q), k if k_layout == "bshd" else _head_source(k), _head_source(v)]
        if all(sources):
            y = graph.attention(*sources, causal=causal, scale=scale, layout="bshd")[0]
            heads_split = [x.producer for x in (q, k, v) if x.producer is not None]
            return graph.transpose(y, perm=(0, 2, 1, 3)), match.nodes + heads_split
    k_bhsd = k if k_layout == "bhsd" else graph.transpose(k, perm=(0, 2, 1, 3))
    bias = None
    if bias_data is not None:
        mask = graph.param(graph.unique_name("attention_mask"), bias_data.astype(to_numpy(q.type.dtype)))
    elif hidden:
        mask = graph.logical_not(mask)
    if mask is not None:
        try:
            bias = attention_bias(graph, mask, q, k_bhsd)
        except ValueError:  # a mask that does not broadcast to the scores
            return None
    try:
        y = graph.attention(q, k_bhsd, v, bias, causal=causal, scale=scale, layout="bhsd")[0]
    except ValueError:  # shapes the op does not take
        return None
    return y, match.nodes


def fuse_attention_4d(graph: Graph) -> list[str]:
    """Every 4-d written-out attention (see the module) as one attention node; one note per fusion."""
    notes = []
    users, constants, removed = graph.users(), _Constants(graph), set()
    for root in list(graph.nodes):
        if root.op != "matmul" or root in removed:
            continue
        with graph.inserting_before(root) as added:
            found = _attention_4d(graph, users, constants, root)
        if found is None:
            for node in reversed(added):  # declined after building: the new nodes read nothing yet
                graph.remove_node(node)
            continue
        y, replaced = found
        for node in added:
            node.device = root.device  # a rewrite never moves work to another device
        graph.replace_uses(root.outputs[0], y)
        users = graph.users()
        gone = set(remove_unused(graph, replaced, users))
        removed.update(node for node in replaced if node.name in gone)
        users = graph.users()
        notes.append(f"attention: {', '.join(sorted(gone))} -> {', '.join(n.name for n in added)}")
    return notes


# --- RoPE's rotate-half ---------------------------------------------------------------------------------------
def _half(value: Value) -> tuple[Value, int] | None:
    """(x, 0 or 1) when ``value`` is the first or second half of x's last axis (a slice of step 1)."""
    node = value.producer
    x = node.inputs[0]
    rank, width = x.type.rank, x.type.shape[-1]
    starts, ends = node.attrs["starts"], node.attrs["ends"]
    axes, steps = node.attrs["axes"] or tuple(range(len(starts))), node.attrs["steps"] or (1,) * len(starts)
    if (len(starts) != 1 or axes[0] % rank != rank - 1 or steps[0] != 1 or not isinstance(width, int) or width % 2
            or isinstance(ends[0], str)):
        return None
    start, count = axis_slice(width, starts[0], ends[0], 1)
    if count != width // 2 or start not in (0, width // 2):
        return None
    return x, start // count


# concat(-x[..., d/2:], x[..., :d/2], axis=-1) = roll(x, d/2, axis=-1) * [-1] * d/2 + [1] * d/2
def rotate_half_to_roll(graph: Graph, upper: Value, lower: Value, y: Value):
    if y.producer.attrs["axis"] % y.type.rank != y.type.rank - 1 or y.type.dtype not in FLOAT_DTYPES:
        return None
    first, second = _half(upper), _half(lower)
    if first is None or second is None or first[0] is not second[0] or (first[1], second[1]) != (1, 0):
        return None
    x = first[0]
    half = x.type.shape[-1] // 2
    sign = graph.param(graph.unique_name("rotate_half_sign"),
                       np.concatenate([-np.ones(half), np.ones(half)]).astype(to_numpy(x.type.dtype)))
    return graph.mul(graph.roll(x, shifts=(half,), axes=(x.type.rank - 1,)), sign)


ROTATE_HALF: list[Rule] = [
    (Pat("concat", (Pat("neg", (Pat("slice", name="upper", shared=True),)), Pat("slice", name="lower", shared=True)),
         name="y"), rotate_half_to_roll),
]


def fuse_attention(graph: Graph) -> list:
    return (fuse_attention_4d(graph) + rewrite(graph, RULES) + rewrite(graph, ROTATE_HALF)
            + simplify_attention(graph))


def fuse_imported_attention(graph: Graph) -> list:
    """The end of an import, in both frontends: unread values dropped (an unread output, a Dropout's mask, would
    count as a reader of what attention fuses), the written-out attention fused (``fuse_attention``), and the nodes
    it replaced dropped; the graph as imported then shows the attention nodes it will run."""
    eliminate_dead_code(graph)
    notes = fuse_attention(graph)
    eliminate_dead_code(graph)
    return notes
