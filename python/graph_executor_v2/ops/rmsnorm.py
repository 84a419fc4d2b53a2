"""rmsnorm: ``y = x / sqrt(mean(x^2) + eps) * gamma`` over the last axis of ``x``.

``x`` has any rank >= 1 (``rows`` = the product of the leading dims, ``cols`` = the last one); ``gamma`` has shape
``(cols,)`` and the dtype of ``x`` (float32, float16 or bfloat16). Statistics are float32.
``forward(..., save_stats=True)`` also returns the float32 ``rstd = 1 / sqrt(mean(x^2) + eps)`` of every row,
shape ``(rows,)``, which ``backward`` takes to skip recomputing it.

Backward: ``dx`` and ``dgamma = sum over rows of dy * x * rstd``, the column sum deterministic: per-block partial
sums in a float32 workspace (allocated here, or passed as ``workspace=`` with at least
``backward_workspace_bytes()`` bytes), then a second kernel that adds them in a fixed order.

Kernel candidates (``kernels()``, with their exact limits), best first: ``warp_per_row`` (cols <= 1024),
``block_per_row`` (cols <= 32768 forward, 8192 backward), both holding the row in registers with 16-byte vector
loads where aligned (scalar loads, with lower limits, otherwise); ``multipass`` (any cols, any alignment), the
one that always works. The kernels are shared with layernorm.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from . import _row_norm
from ._base import Attr, Input, OpDef, Sample, as_float64, register, sample_array

DEFAULT_EPS = 1e-6


def _native_module():
    return _native.load("_ops_rmsnorm")


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def reference(x, gamma, eps=DEFAULT_EPS):
    """Returns (y, rstd) in float64; rstd flattened to one per row."""
    x64 = as_float64(x)
    rstd = 1.0 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    return x64 * rstd * as_float64(gamma), rstd.reshape(-1)


def reference_backward(dy, x, gamma, eps=DEFAULT_EPS):
    """Returns (dx, dgamma) in float64."""
    dy64, x64, gamma64 = as_float64(dy), as_float64(x), as_float64(gamma)
    rstd = 1.0 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    xhat = x64 * rstd
    g = dy64 * gamma64
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy64 * xhat).reshape(-1, x64.shape[-1]).sum(axis=0)


# ---------------------------------------------------------------------------------------------------------------
# Python face: generated (ops/_face.py, ops/_row_norm.py); backward also takes a ``workspace``.
# ---------------------------------------------------------------------------------------------------------------
def backward_workspace_bytes(x_shape, dtype, kernel="auto", aligned=True) -> int:
    """Bytes of float32 workspace ``backward`` needs for an x of this shape and dtype on the current GPU
    (``aligned``: dy, x, gamma and dx 16-byte aligned, as every plan buffer is)."""
    return _row_norm.workspace_bytes(_native_module, "rmsnorm", x_shape, dtype, kernel, aligned)


# ---------------------------------------------------------------------------------------------------------------
# Op definition: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
_INPUTS = ("x", "gamma")


def _infer(in_types, attrs):
    return _row_norm.infer(in_types, attrs, _INPUTS)


def _reference(inputs, attrs):
    x, gamma = inputs
    return [reference(x, gamma, attrs["eps"])[0]]


def _reference_backward(inputs, outputs, out_grads, attrs):
    x, gamma = inputs
    return list(reference_backward(out_grads[0], x, gamma, attrs["eps"]))


OP = register(OpDef(
    name="rmsnorm",
    samples=lambda rng: [Sample((sample_array(rng, 4, 8), sample_array(rng, 8))),
                         Sample((sample_array(rng, 3, 5), sample_array(rng, 5)), {}, "odd rows")],
    inputs=tuple(Input(name) for name in _INPUTS),
    outputs=("y",),
    attrs=(Attr("eps", float, DEFAULT_EPS, check=_row_norm.eps_problem, doc="added to the mean square"),),
    infer=_infer,
    reference=_reference,
    reference_backward=_reference_backward,
    candidates=_row_norm.candidates("_ops_rmsnorm", _native_module),
    doc=__doc__,
))
globals().update(_row_norm.make_face(OP, _native_module, ("rstd",)).functions())


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: ``rmsnorm_backward(dy, x, gamma) -> (dx, dgamma)``, the native backward (rstd recomputed from x).
# ---------------------------------------------------------------------------------------------------------------
from . import _grad  # noqa: E402  (the grad section stays separate from the face above)
from ._base import Problem, attach_grad  # noqa: E402


def _infer_backward(in_types, attrs):
    dy, x, gamma = in_types
    if dy != x:
        raise ValueError(f"dy: expected {x} (the type of x), got {dy}")
    return [x, gamma]


def _prepare_backward(problem: Problem):
    native = _native_module()

    def call(ins, outs, workspace, size, shape, eps, kernel, stream):
        native.backward(ins[0], ins[1], ins[2], 0, 0, outs[0], outs[1], 0, workspace, size, shape.rows,
                        shape.cols, shape.dtype, eps, kernel, stream)

    return _grad.row_norm_backward_launch(native, problem, call)


BACKWARD_OP = _grad.register_backward(OpDef(
    name="rmsnorm_backward",
    inputs=(Input("dy"), Input("x"), Input("gamma")),
    outputs=("dx", "dgamma"),
    attrs=OP.attrs,
    infer=_infer_backward,
    reference=lambda inputs, attrs: list(reference_backward(*inputs, attrs["eps"])),
    candidates=(_grad.native_candidate("_ops_rmsnorm", "dx, dgamma with a float32 workspace", _prepare_backward),),
    doc="rmsnorm_backward(dy, x, gamma) -> (dx, dgamma)",
))

attach_grad(OP, lambda g, node, dys: list(g.rmsnorm_backward(dys[0], node.inputs[0], node.inputs[1],
                                                              eps=node.attrs["eps"])))
