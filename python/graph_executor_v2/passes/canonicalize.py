"""Canonicalization: one spelling for each computation, so fusion rules need to know only that one.

- every matrix product is a ``gemm`` (a matmul is a gemm at its defaults);
- a transpose feeding a gemm operand is the gemm's ``trans_a``/``trans_b``;
- a row-vector add is a ``bias_add`` (broadcast normalization), and a bias after a gemm is the gemm's bias;
- ``x * sigmoid(x)`` (how exporters write SiLU) is ``silu(x)``;
- identities disappear: reshapes to the same shape, identity transposes, dropout with p = 0; chains of
  transposes or of reshapes become one.
"""
from __future__ import annotations

from ..dtypes import FLOAT_DTYPES
from ..ir.graph import Graph, Value
from .pattern import Pat, Rule, rewrite

SWAP_2D = (1, 0)


def _perm(transpose: Value) -> tuple[int, ...]:
    """The transpose's permutation with negative axes resolved."""
    rank = transpose.type.rank
    return tuple(axis % rank for axis in transpose.producer.attrs["perm"])


# matmul(a, b) = gemm(a, b)
def matmul_to_gemm(graph: Graph, y: Value):
    a, b = y.producer.inputs
    return graph.gemm(a, b)


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


RULES: list[Rule] = [
    (Pat("matmul", name="y"), matmul_to_gemm),
    (Pat("mul", (Pat(name="x"), Pat("sigmoid", (Pat(name="x"),), name="gate")), name="y", any_order=True),
     mul_sigmoid_to_silu),
    (Pat("gemm", (Pat("transpose", (Pat(name="a"),), name="t", shared=True), Pat(name="b"), Pat(name="bias"),
                  Pat(name="c")), name="y"), fold_transpose_a),
    (Pat("gemm", (Pat(name="a"), Pat("transpose", (Pat(name="b"),), name="t", shared=True), Pat(name="bias"),
                  Pat(name="c")), name="y"), fold_transpose_b),
    (Pat("add", (Pat(name="x"), Pat(name="row")), name="y", any_order=True), add_row_to_bias_add),
    (Pat("bias_add", (Pat("gemm", name="mm"), Pat(name="bias"))), fold_bias_into_gemm),
    (Pat("transpose", (Pat(name="x"),), name="y"), drop_identity_transpose),
    (Pat("transpose", (Pat("transpose", name="inner", shared=True),), name="y"), merge_transposes),
    (Pat("reshape", (Pat(name="x"),), name="y"), drop_identity_reshape),
    (Pat("reshape", (Pat("reshape", name="inner", shared=True),), name="y"), merge_reshapes),
    (Pat("dropout", (Pat(name="x"),), name="y"), drop_identity_dropout),
]


def canonicalize(graph: Graph) -> list:
    return rewrite(graph, RULES)
