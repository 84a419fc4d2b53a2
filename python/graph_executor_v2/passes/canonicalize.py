"""Canonicalization: one spelling for each computation, so fusion rules need to know only that one.

- every matrix product is a ``gemm`` (a matmul is a gemm at its defaults; a batched matmul is one gemm of A's rows
  when B has no batch, else one gemm per batch entry, when its shapes are static, and a multiply when K = 1);
- a transpose feeding a gemm operand is the gemm's ``trans_a``/``trans_b``;
- a row-vector add is a ``bias_add`` (broadcast normalization), and a bias after a gemm (or after a reshape of it
  that keeps its rows) is the gemm's bias;
- ``x * sigmoid(x)`` (how exporters write SiLU) is ``silu(x)``, and the tanh-GELU written out,
  ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` (HF GPT-2's gelu_new), is ``gelu(x)``, so the gemm
  before it takes it as its epilogue;
- identities disappear: reshapes to the same shape, identity transposes, dropout with p = 0; chains of
  transposes or of reshapes become one;
- a gather of one constant index is a slice (a block copy);
- a patch embedding (a conv whose kernel is its stride, unpadded, over a few input channels: ViT's 16 x 16 / 16 on
  RGB) is one gemm over the patches.
"""
from __future__ import annotations

import math

import numpy as np

from ..dtypes import FLOAT_DTYPES, INT_DTYPES
from ..ir.graph import Graph, Value
from .pattern import Pat, Rule, rewrite

SWAP_2D = (1, 0)


def _perm(transpose: Value) -> tuple[int, ...]:
    """The transpose's permutation with negative axes resolved."""
    rank = transpose.type.rank
    return tuple(axis % rank for axis in transpose.producer.attrs["perm"])


# matmul(a, b) = gemm(a, b); batched: see lower_batched_matmul
def matmul_to_gemm(graph: Graph, y: Value):
    a, b = y.producer.inputs
    if a.type.rank == 2 and b.type.rank == 2:
        return graph.gemm(a, b)
    return lower_batched_matmul(graph, a, b, y)


def lower_batched_matmul(graph: Graph, a: Value, b: Value, y: Value) -> Value | None:
    """numpy.matmul of rank >= 2 operands on 2-d gemms: B without batch (its batch dims all 1, A's at least as many)
    multiplies A's rows at once; otherwise one gemm per batch entry (slices of A and B), concatenated. An outer
    product (K = 1: RoPE's frequencies times positions) is a broadcast multiply, whatever the batch dims. None with
    symbolic batch dims otherwise (the matmul stays, on the reference)."""
    (m, k), n = a.type.shape[-2:], b.type.shape[-1]
    if k == 1:
        return graph.mul(a, b)
    if all(d == 1 for d in b.type.shape[:-2]) and a.type.rank >= b.type.rank and isinstance(k, int):
        b2 = b if b.type.rank == 2 else graph.reshape(b, shape=tuple(b.type.shape[-2:]))
        return graph.reshape(graph.gemm(graph.reshape(a, shape=(-1, k)), b2), shape=tuple(y.type.shape))
    if not a.type.is_concrete or not b.type.is_concrete:
        return None
    a_batch, b_batch, batch = tuple(a.type.shape[:-2]), tuple(b.type.shape[:-2]), tuple(y.type.shape[:-2])
    a_flat = graph.reshape(a, shape=(int(np.prod(a_batch, dtype=np.int64)), m, k))
    b_flat = graph.reshape(b, shape=(int(np.prod(b_batch, dtype=np.int64)), k, n))

    def entry(index: tuple, own: tuple) -> int:
        """The flat index, in an operand of batch dims ``own`` (aligned right, size 1 broadcast), of ``index``."""
        if not own:
            return 0
        return int(np.ravel_multi_index(tuple(i if d > 1 else 0 for i, d in zip(index[len(index) - len(own):], own)),
                                        own))

    products = []
    for index in np.ndindex(*batch):
        a_index, b_index = entry(index, a_batch), entry(index, b_batch)
        a_entry = graph.reshape(graph.slice(a_flat, starts=(a_index,), ends=(a_index + 1,), axes=(0,)), shape=(m, k))
        b_entry = graph.reshape(graph.slice(b_flat, starts=(b_index,), ends=(b_index + 1,), axes=(0,)), shape=(k, n))
        products.append(graph.reshape(graph.gemm(a_entry, b_entry), shape=(1, m, n)))
    stacked = products[0] if len(products) == 1 else graph.concat(products, axis=0)
    return graph.reshape(stacked, shape=tuple(y.type.shape))


# gemm(transpose(a), b) = gemm(a, b, trans_a=not trans_a) for a 2-d transpose
def fold_transpose_a(graph: Graph, y: Value, t: Value, a: Value, b: Value, bias: Value | None, c: Value | None):
    attrs = y.producer.attrs
    return graph.gemm(a, b, bias, c, **{**attrs, "trans_a": not attrs["trans_a"]}) if _perm(t) == SWAP_2D else None


# gemm(a, transpose(b)) = gemm(a, b, trans_b=not trans_b) for a 2-d transpose
def fold_transpose_b(graph: Graph, y: Value, t: Value, a: Value, b: Value, bias: Value | None, c: Value | None):
    attrs = y.producer.attrs
    return graph.gemm(a, b, bias, c, **{**attrs, "trans_b": not attrs["trans_b"]}) if _perm(t) == SWAP_2D else None


# x + row[1, ..., 1, N] = bias_add(x, reshape(row, (N,))) when the sum keeps x's shape (either operand order) and
# both are of one float dtype (bias_add's)
def add_row_to_bias_add(graph: Graph, x: Value, row: Value, y: Value):
    shape = row.type.shape
    if not shape or any(d != 1 for d in shape[:-1]) or y.type != x.type or x.type.shape[-1] != shape[-1]:
        return None
    if row.type.dtype != x.type.dtype or x.type.dtype not in FLOAT_DTYPES:
        return None
    if row.type.rank > 1:
        row = graph.reshape(row, shape=(shape[-1],))
    return graph.bias_add(x, row)


# bias_add(gemm(a, b, c), bias) = gemm(a, b, bias, c) while the gemm has no bias and no activation yet
def fold_bias_into_gemm(graph: Graph, mm: Value, bias: Value):
    gemm = mm.producer
    a, b, existing_bias, c = gemm.inputs
    if existing_bias is not None or gemm.attrs["act"] != "none" or bias.type.dtype != mm.type.dtype:
        return None
    return graph.gemm(a, b, bias, c, **gemm.attrs)


# bias_add(reshape(gemm(a, b, c)), bias) = reshape(gemm(a, b, bias, c)) when the reshape keeps the gemm's rows (its
# last dim is N): exporters flatten a linear layer's input to 2-d, multiply, view the product as 3-d and add the bias
# there (BERT's and ViT's query/key/value projections)
def fold_bias_through_reshape(graph: Graph, mm: Value, view: Value, bias: Value):
    if not view.type.is_concrete or view.type.shape[-1] != mm.type.shape[-1]:
        return None
    folded = fold_bias_into_gemm(graph, mm, bias)
    return None if folded is None else graph.reshape(folded, shape=tuple(view.type.shape))


# gather(x, i, axis) with one constant index = reshape(slice(x, i:i+1 along axis)): a block copy (one memcpy along an
# outer axis) where gather indexes element by element (ViT-B/16's q/k/v unbind, 36 gathers: 1.54 ms, a quarter of
# its H200 time at batch 32)
def gather_constant_to_slice(graph: Graph, x: Value, indices: Value, y: Value):
    if not indices.is_param or indices.data.size != 1 or not x.type.is_concrete or not y.type.is_concrete:
        return None
    axis = y.producer.attrs["axis"] % x.type.rank
    extent = x.type.shape[axis]
    index = int(np.asarray(indices.data).reshape(-1)[0])
    index += extent if index < 0 else 0
    if not 0 <= index < extent:
        return None  # out of range: gather's own check reports it
    return graph.reshape(graph.slice(x, starts=(index,), ends=(index + 1,), axes=(axis,)), shape=tuple(y.type.shape))


PATCH_CHANNELS = 8  # fewer input channels than a 16-byte vector of 16-bit values: what a conv kernel has to pad


# conv2d(x, w, bias) with kernel = stride (> 1), no padding, dilation 1, groups 1 and fewer than 8 input channels
# (an image stem) = the patches as rows, one gemm: x viewed [N, C, Ho, kh, Wo, kw] and transposed to rows of C * kh *
# kw (NHWC: [N, Ho, kh, Wo, kw, C] to rows of kh * kw * C), times w viewed [O, that], the bias the gemm's, the
# product [N, Ho, Wo, O] (transposed to NCHW). A conv kernel would pad the channels to 8 or run im2col: ViT-B/16's
# patch embedding took 0.33 ms that way at batch 32 on the H200 (a channel pad at 5% of the roofline and an im2col
# conv); the gemm's K (768) is aligned and its rows come out batch-first, as the tokens are read.
def patch_conv_to_gemm(graph: Graph, y: Value):
    x, w, bias, residual = (list(y.producer.inputs) + [None, None])[:4]
    attrs = y.producer.attrs
    if residual is not None or not x.type.is_concrete or not w.type.is_concrete or x.type.rank != 4:
        return None
    nhwc = attrs["layout"] == "NHWC"
    out_channels, *kernel = w.type.shape
    kernel = tuple(kernel[:2] if nhwc else kernel[1:])
    stride = attrs["stride"] if isinstance(attrs["stride"], tuple) else (attrs["stride"],) * 2
    padding, dilation = attrs["padding"], attrs["dilation"]
    batch, *rest = x.type.shape
    channels, height, width = (rest[2], rest[0], rest[1]) if nhwc else rest
    if (tuple(stride) != kernel or max(kernel) < 2 or channels >= PATCH_CHANNELS or attrs["groups"] != 1
            or attrs["act"] != "none" or attrs["clip_min"] is not None or attrs["clip_max"] is not None
            or any(np.atleast_1d(padding)) or any(d != 1 for d in np.atleast_1d(dilation))
            or height % kernel[0] or width % kernel[1]):
        return None
    rows, cols = height // kernel[0], width // kernel[1]
    if nhwc:
        patches = graph.transpose(graph.reshape(x, shape=(batch, rows, kernel[0], cols, kernel[1], channels)),
                                  perm=(0, 1, 3, 2, 4, 5))
    else:
        patches = graph.transpose(graph.reshape(x, shape=(batch, channels, rows, kernel[0], cols, kernel[1])),
                                  perm=(0, 2, 4, 1, 3, 5))
    depth = channels * kernel[0] * kernel[1]
    product = graph.gemm(graph.reshape(patches, shape=(batch * rows * cols, depth)),
                         graph.reshape(w, shape=(out_channels, depth)), bias, trans_b=True,
                         allow_tf32=attrs["allow_tf32"])
    image = graph.reshape(product, shape=(batch, rows, cols, out_channels))
    return image if nhwc else graph.transpose(image, perm=(0, 3, 1, 2))


# transpose(x, identity) = x
def drop_identity_transpose(graph: Graph, x: Value, y: Value):
    return x if _perm(y) == tuple(range(y.type.rank)) else None


# transpose(transpose(x, p), q) = transpose(x, k -> p[q[k]])
def merge_transposes(graph: Graph, inner: Value, y: Value):
    outer_perm, inner_perm = _perm(y), _perm(inner)
    x = inner.producer.inputs[0]
    return graph.transpose(x, perm=tuple(inner_perm[axis] for axis in outer_perm))


# reshape(x, shape of x) = x
def drop_identity_reshape(graph: Graph, x: Value, y: Value):
    return x if y.type == x.type else None


# reshape(reshape(x, s), t) = reshape(x, t)
def merge_reshapes(graph: Graph, inner: Value, y: Value):
    if not y.type.is_concrete:  # reshape takes integer shapes; a symbolic target stays two reshapes
        return None
    return graph.reshape(inner.producer.inputs[0], shape=y.type.shape)


# dropout(x, p=0) = x
def drop_identity_dropout(graph: Graph, x: Value, y: Value):
    return x if y.producer.attrs["p"] == 0.0 else None


# x * sigmoid(x) = silu(x)
def mul_sigmoid_to_silu(graph: Graph, x: Value, gate: Value, y: Value):
    return graph.silu(x) if y.type == x.type else None


# The constants of the tanh-GELU, by the name its patterns bind them under
GELU_TANH_CONSTANTS = {"half": 0.5, "one": 1.0, "scale": math.sqrt(2.0 / math.pi), "cubic": 0.044715, "three": 3.0,
                       "inner_one": 1.0, "two": 2.0}


def _is_constant(value: Value, expected: float) -> bool:
    """``value`` is a one-element parameter (0-d or not) equal to ``expected`` rounded to float32, or to its own
    dtype when that is narrower (a float16 export stores 0.044715 as float16's 0.04471)."""
    if not value.is_param or value.data.size != 1 or value.type.dtype not in FLOAT_DTYPES + INT_DTYPES:
        return False
    stored = np.float32(np.asarray(value.data).reshape(()))
    return bool(stored == np.float32(np.asarray(expected, value.data.dtype)))


# 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) = gelu(x) (GELU's tanh form), with every constant a
# one-element parameter of GELU's value (a different constant is another function: it stays)
def written_out_gelu_to_gelu(graph: Graph, x: Value, y: Value, half: Value, one: Value, scale: Value, cubic: Value,
                             three: Value | None = None, inner_one: Value | None = None, two: Value | None = None):
    if y.type != x.type or x.type.dtype not in FLOAT_DTYPES:
        return None
    bound = {"half": half, "one": one, "scale": scale, "cubic": cubic, "three": three, "inner_one": inner_one,
             "two": two}
    if not all(_is_constant(value, GELU_TANH_CONSTANTS[name]) for name, value in bound.items() if value is not None):
        return None
    return graph.gelu(x)


def _gelu_tanh_patterns() -> list[Pat]:
    """Every arrangement exporters write the tanh-GELU in (operands of add and mul in either order). The tanh's
    argument: sqrt(2/pi) * (x + 0.044715 * x^3), x^3 as pow(x, 3) or (x * x) * x (PyTorch's and ONNX exports of HF's
    gelu_new, PyTorch's decomposition of gelu(approximate="tanh")), or factored, (x * sqrt(2/pi)) * (1 + 0.044715 *
    x^2), x^2 as pow(x, 2), x * x or 0.044715 * x * x (HF's gelu_fast). The outer product: (0.5 * x) * (1 + t),
    x * (0.5 * (1 + t)) or 0.5 * (x * (1 + t))."""
    x, scale, cubic = Pat(name="x"), Pat(name="scale"), Pat(name="cubic")
    arguments = [Pat("mul", (Pat("add", (x, Pat("mul", (cube, cubic), any_order=True)), any_order=True), scale),
                     any_order=True)
                 for cube in (Pat("pow", (x, Pat(name="three"))), Pat("mul", (Pat("mul", (x, x)), x), any_order=True))]
    for square_term in (Pat("mul", (Pat("pow", (x, Pat(name="two"))), cubic), any_order=True),
                        Pat("mul", (Pat("mul", (x, x)), cubic), any_order=True),
                        Pat("mul", (Pat("mul", (x, cubic), any_order=True), x), any_order=True)):
        arguments.append(Pat("mul", (Pat("mul", (x, scale), any_order=True),
                                     Pat("add", (square_term, Pat(name="inner_one")), any_order=True)), any_order=True))
    patterns = []
    for argument in arguments:
        one_plus_tanh = Pat("add", (Pat("tanh", (argument,)), Pat(name="one")), any_order=True)
        half = Pat(name="half")
        patterns += [Pat("mul", (Pat("mul", (x, half), any_order=True), one_plus_tanh), name="y", any_order=True),
                     Pat("mul", (x, Pat("mul", (half, one_plus_tanh), any_order=True)), name="y", any_order=True),
                     Pat("mul", (half, Pat("mul", (x, one_plus_tanh), any_order=True)), name="y", any_order=True)]
    return patterns


RULES: list[Rule] = [
    (Pat("matmul", name="y"), matmul_to_gemm),
    *[(pattern, written_out_gelu_to_gelu) for pattern in _gelu_tanh_patterns()],
    (Pat("mul", (Pat(name="x"), Pat("sigmoid", (Pat(name="x"),), name="gate")), name="y", any_order=True),
     mul_sigmoid_to_silu),
    (Pat("gemm", (Pat("transpose", (Pat(name="a"),), name="t", shared=True), Pat(name="b"), Pat(name="bias"),
                  Pat(name="c")), name="y"), fold_transpose_a),
    (Pat("gemm", (Pat(name="a"), Pat("transpose", (Pat(name="b"),), name="t", shared=True), Pat(name="bias"),
                  Pat(name="c")), name="y"), fold_transpose_b),
    (Pat("add", (Pat(name="x"), Pat(name="row")), name="y", any_order=True), add_row_to_bias_add),
    (Pat("bias_add", (Pat("gemm", name="mm"), Pat(name="bias"))), fold_bias_into_gemm),
    (Pat("bias_add", (Pat("reshape", (Pat("gemm", name="mm"),), name="view"), Pat(name="bias"))),
     fold_bias_through_reshape),
    (Pat("transpose", (Pat(name="x"),), name="y"), drop_identity_transpose),
    (Pat("transpose", (Pat("transpose", name="inner", shared=True),), name="y"), merge_transposes),
    (Pat("reshape", (Pat(name="x"),), name="y"), drop_identity_reshape),
    (Pat("reshape", (Pat("reshape", name="inner", shared=True),), name="y"), merge_reshapes),
    (Pat("dropout", (Pat(name="x"),), name="y"), drop_identity_dropout),
    (Pat("gather", (Pat(name="x"), Pat(name="indices")), name="y"), gather_constant_to_slice),
    (Pat("conv2d", name="y"), patch_conv_to_gemm),
]


def canonicalize(graph: Graph) -> list:
    return rewrite(graph, RULES)


# matmul(a, b) of batched operands = 2-d gemms (lower_batched_matmul)
def _lower_batched(graph: Graph, y: Value):
    a, b = y.producer.inputs
    return None if a.type.rank == 2 and b.type.rank == 2 else lower_batched_matmul(graph, a, b, y)


def lower_batched_matmuls(graph: Graph) -> list:
    """Only the batched matmuls lowered (the gradients of a batched matmul, in a backward graph that is not
    canonicalized)."""
    return rewrite(graph, [(Pat("matmul", name="y"), _lower_batched)])
