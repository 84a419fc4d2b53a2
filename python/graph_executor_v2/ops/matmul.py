"""matmul: ``Y = A @ B`` for ``A`` (..., M x K) and ``B`` (..., K x N) of one float dtype, float32 accumulation;
leading (batch) dims broadcast as numpy.matmul's.

A plain product is a gemm with every attribute at its default, so this op has no kernels of its own: inference
and the kernel candidates are gemm's, seen through that translation, and canonicalization rewrites matmul into
gemm (where bias, transposes and activations can fuse). It stays an op because it is what graphs are written in.
A batched matmul is what frontends write for numpy.matmul of a batched B (attention's Q K^T and P V): the attention
pass reads it whole, and canonicalization lowers what is left to 2-d gemms (one per batch entry; with symbolic batch
dims it stays, and runs on the reference). Its face (``ge2.ops.matmul``) runs gemm's kernels on 2-d operands;
backward returns (da, db) from gemm's backward.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..ir.types import TensorType
from . import gemm
from ._base import Candidate, Input, OpDef, Problem, Sample, as_float64, register, sample_array
from ._face import Face
from .elementwise import broadcast_shapes, reduce_to_shape

_GEMM_DEFAULTS = gemm.OP.validate_attrs({}, "matmul")


def is_batched(in_types) -> bool:
    return any(t.rank != 2 for t in in_types)


def _infer(in_types, attrs):
    a, b = in_types
    if not is_batched(in_types):
        return gemm.OP.infer(list(in_types) + [None, None], _GEMM_DEFAULTS)
    if a.rank < 2 or b.rank < 2:
        raise ValueError(f"a, b: expected rank >= 2 (a batched matmul), got shapes {a.shape} and {b.shape}")
    (matrix,) = gemm.OP.infer([TensorType(a.shape[-2:], a.dtype), TensorType(b.shape[-2:], b.dtype), None, None],
                              _GEMM_DEFAULTS)
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [TensorType(batch + tuple(matrix.shape), matrix.dtype)]


def _swapped(x):
    return x.swapaxes(-1, -2)


def _reference(inputs, attrs):
    a, b = inputs
    return [np.matmul(as_float64(a), as_float64(b))]


def _reference_backward(inputs, outputs, out_grads, attrs):
    a, b = inputs
    dy, a64, b64 = as_float64(out_grads[0]), as_float64(a), as_float64(b)
    return [reduce_to_shape(np.matmul(dy, _swapped(b64)), a64.shape),
            reduce_to_shape(np.matmul(_swapped(a64), dy), b64.shape)]


def _as_gemm_problem(problem: Problem) -> Problem:
    return replace(problem, op="gemm", in_types=tuple(problem.in_types) + (None, None), attrs=_GEMM_DEFAULTS)


def _via_gemm(candidate: Candidate) -> Candidate:
    """The gemm candidate run with no bias and no C (their pointers are 0)."""

    def prepare(problem: Problem):
        launch_gemm = candidate.prepare(_as_gemm_problem(problem))

        def launch(ins, outs, stream):
            launch_gemm((ins[0], ins[1], 0, 0), outs, stream)

        return launch

    def supports(problem: Problem):
        if is_batched(problem.in_types):
            return ("a batched matmul has no kernel of its own: the canonicalize pass lowers it to 2-d gemms "
                    "(its batch dims must then be static)")
        return candidate.supports(_as_gemm_problem(problem))

    return replace(candidate, supports=supports, prepare=prepare)


OP = register(OpDef(
    name="matmul",
    samples=lambda rng: [Sample((sample_array(rng, 4, 8), sample_array(rng, 8, 6))),
                         Sample((sample_array(rng, 1, 5), sample_array(rng, 5, 3)), {}, "one row")],
    flops=lambda in_types, out_types, attrs: 2.0 * out_types[0].numel * in_types[0].shape[-1],
    inputs=(Input("a"), Input("b")),
    outputs=("y",),
    attrs=(),
    infer=_infer,
    reference=_reference,
    reference_backward=_reference_backward,
    candidates=tuple(_via_gemm(c) for c in gemm.OP.candidates),
    doc=__doc__,
))


def _backward(dy, inputs, attrs, kernel, out, stream):
    """(da, db) through gemm's backward with no bias and no C."""
    return gemm.backward(dy, inputs[0], inputs[1], kernel=kernel, out=None if out is None else (*out, None, None),
                         stream=stream)[:2]


globals().update(Face(OP, _backward).functions())
# ---------------------------------------------------------------------------------------------------------------
# Grad rule: gemm's backward with no bias.
# ---------------------------------------------------------------------------------------------------------------
from ._base import attach_grad  # noqa: E402  (the grad section stays separate from the op above)


def _summed_to(g, x, shape):
    """``x`` summed over the batch dims along which an operand of ``shape`` was broadcast."""
    extra = x.type.rank - len(shape)
    broadcast = tuple(extra + i for i, d in enumerate(shape[:-2]) if d == 1 and x.type.shape[extra + i] != 1)
    axes = tuple(range(extra)) + broadcast
    if not axes:
        return x
    return g.reshape(g.sum(x, axis=axes), shape=tuple(shape))


def _grad_matmul(g, node, dys):
    a, b = node.inputs
    if is_batched([a.type, b.type]):  # numpy.matmul's adjoint: the other operand swapped, broadcast dims summed
        swap = lambda x: g.transpose(x, perm=(*range(x.type.rank - 2), x.type.rank - 1, x.type.rank - 2))  # noqa: E731
        return [_summed_to(g, g.matmul(dys[0], swap(b)), a.type.shape),
                _summed_to(g, g.matmul(swap(a), dys[0]), b.type.shape)]
    da, db, _ = g.gemm_backward(dys[0], a, b, with_dbias=False)
    return [da, db]


attach_grad(OP, _grad_matmul)
