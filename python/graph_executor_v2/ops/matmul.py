"""matmul: ``Y = A @ B`` for a 2-d ``A`` (M x K) and ``B`` (K x N) of one float dtype, float32 accumulation.

A plain product is a gemm with every attribute at its default, so this op has no kernels of its own: inference
and the kernel candidates are gemm's, seen through that translation, and canonicalization rewrites matmul into
gemm (where bias, transposes and activations can fuse). It stays an op because it is what graphs are written in.
Its face (``ge2.ops.matmul``) runs gemm's kernels; backward returns (da, db) from gemm's backward.
"""
from __future__ import annotations

from dataclasses import replace

from . import gemm
from ._base import Candidate, Input, OpDef, Problem, Sample, as_float64, register, sample_array
from ._face import Face

_GEMM_DEFAULTS = gemm.OP.validate_attrs({}, "matmul")


def _infer(in_types, attrs):
    return gemm.OP.infer(list(in_types) + [None, None], _GEMM_DEFAULTS)


def _reference(inputs, attrs):
    a, b = inputs
    return [as_float64(a) @ as_float64(b)]


def _reference_backward(inputs, outputs, out_grads, attrs):
    a, b = inputs
    dy = as_float64(out_grads[0])
    return [dy @ as_float64(b).T, as_float64(a).T @ dy]


def _as_gemm_problem(problem: Problem) -> Problem:
    return replace(problem, op="gemm", in_types=tuple(problem.in_types) + (None, None), attrs=_GEMM_DEFAULTS)


def _via_gemm(candidate: Candidate) -> Candidate:
    """The gemm candidate run with no bias and no C (their pointers are 0)."""

    def prepare(problem: Problem):
        launch_gemm = candidate.prepare(_as_gemm_problem(problem))

        def launch(ins, outs, stream):
            launch_gemm((ins[0], ins[1], 0, 0), outs, stream)

        return launch

    return replace(candidate, supports=lambda problem: candidate.supports(_as_gemm_problem(problem)),
                   prepare=prepare)


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


def _grad_matmul(g, node, dys):
    da, db, _ = g.gemm_backward(dys[0], *node.inputs, with_dbias=False)
    return [da, db]


attach_grad(OP, _grad_matmul)
