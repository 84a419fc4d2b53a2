"""softmax and log_softmax over one axis (``axis``, default -1); float32 math for float32, float16, bfloat16.

    softmax(x)     = exp(x - max(x)) / sum(exp(x - max(x)))
    log_softmax(x) = (x - max(x)) - log(sum(exp(x - max(x))))

Subtracting the maximum keeps large logits (1e4 and beyond) finite and exact; ``-inf`` entries (masks) give 0
(softmax) or -inf (log_softmax). A slice that is all ``-inf`` or holds a NaN comes out NaN, as in the float64
reference.

Any axis runs without a transpose: the contiguous array is seen as ``[outer, n, inner]`` with the softmax axis
of length n in the middle. The last axis (inner == 1) uses the row kernels; any other axis the strided kernel,
whose warps read runs of adjacent inner elements.

Backward, from the forward output ``y``: softmax ``dx = y * (dy - sum(dy * y))``, log_softmax
``dx = dy - exp(y) * sum(dy)`` (sums over the axis).

Kernel candidates (``kernels()``), best first:
1. ``warp_row``: last axis, n <= 1024: a group of lanes (up to a warp) per row, the row in registers.
2. ``block_row``: last axis, n <= 16384 (8192 backward): one block per row, the row in registers.
3. ``block_row_two_pass``: last axis, any n: online max/sum pass, then a write pass (x read twice).
4. ``strided``: any axis, any size: the path that always works.
The register kernels read x once and write y once, with 16-byte accesses when n is a multiple of the vector
width and every pointer is 16-byte aligned.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from .. import selection
from ..dtypes import FLOAT_DTYPES
from . import _layout
from ._base import (Attr, Input, OPS, OpDef, Problem, Sample, as_float64, native_launch, register, sample_array,
                    table_candidate)
from ._face import FACES, Face

OP_NAMES = ("softmax", "log_softmax")


def _native_module():
    return _native.load("_ops_softmax")


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def reference(op, x, axis=-1):
    """softmax or log_softmax of ``x`` over ``axis``, in float64."""
    x64 = as_float64(x)
    axis = check_axis(axis, x64.ndim)
    if x64.size == 0:
        return x64.copy()
    # -inf - -inf and log(0) are NaN / -inf by design (all -inf slices); no warnings for them.
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        shifted = x64 - x64.max(axis=axis, keepdims=True)
        total = np.exp(shifted).sum(axis=axis, keepdims=True)
        if op == "log_softmax":
            return shifted - np.log(total)
        return np.exp(shifted) / total


def reference_backward(op, dy, y, axis=-1):
    """dx in float64 from the output gradient ``dy`` and the forward output ``y``."""
    dy64, y64 = as_float64(dy), as_float64(y)
    axis = check_axis(axis, y64.ndim)
    if op == "softmax":
        return y64 * (dy64 - (dy64 * y64).sum(axis=axis, keepdims=True))
    return dy64 - np.exp(y64) * dy64.sum(axis=axis, keepdims=True)


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes, dtypes and arguments only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def check_axis(axis, ndim: int) -> int:
    """The axis as an index in [0, ndim); raises naming ``axis`` (or ``x`` for a 0-d array)."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis: expected an int, got {type(axis).__name__} ({axis!r})")
    if ndim == 0:
        raise ValueError("x: softmax needs an array of at least 1 dimension, got a 0-d array")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis: expected an int in [{-ndim}, {ndim}) for an array of {ndim} dimension(s), "
                         f"got {axis}")
    return int(axis) % ndim


def _check_dtype(dtype, argument):
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{argument}: expected dtype float32, float16 or bfloat16, got {dtype}")


def layout(shape, axis) -> tuple[int, int, int]:
    """(outer, n, inner): the contiguous array as [outer, n, inner] with the softmax axis of length n."""
    axis = check_axis(axis, len(shape))
    return int(np.prod(shape[:axis], dtype=np.int64)), int(shape[axis]), int(np.prod(shape[axis + 1:],
                                                                                   dtype=np.int64))


def _backward_kernel(requested: str, n: int, inner: int, dtype: str) -> str:
    """The backward kernel: ``requested`` after checking it (ValueError naming why it cannot run the problem), or
    for "auto" the selector's choice."""
    native = _native_module()
    if requested != "auto":
        reason = native.unsupported_reason(requested, n, inner, True)
        if reason:
            raise ValueError(f"kernel: '{requested}' cannot run this problem: {reason}")
    return selection.table_kernel("_ops_softmax", requested,
                                  lambda name: native.unsupported_reason(name, n, inner, True), dtype)


def _backward(op):
    def backward(dy, inputs, attrs, kernel, out, stream, y=None):
        """dx from dy and the forward output ``y`` (recomputed from x when not given)."""
        (x,) = inputs
        vx = _device.view_of(x, "x")
        outer, n, inner = layout(vx.shape, attrs["axis"])
        if y is None:
            y = FACES[op].forward(x, axis=attrs["axis"], stream=stream)
        vy = _layout.checked_view(y, "y", tuple(vx.shape), vx.dtype, vx.device)
        vdy = _layout.checked_view(dy, "dy", tuple(vx.shape), vx.dtype, vx.device)
        kernel = _backward_kernel(kernel, n, inner, vx.dtype)
        dx, vdx = _layout.output(None if out is None else out[0], dy, "out", tuple(vx.shape), vx.dtype, vx.device)
        _native_module().backward(op, vy.ptr, vdy.ptr, vdx.ptr, outer, n, inner, vx.dtype, kernel,
                                  _device.stream_handle(stream))
        return (dx,)

    return backward


# ---------------------------------------------------------------------------------------------------------------
# Op definitions: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _infer(in_types, attrs):
    (x,) = in_types
    if x is None:
        raise ValueError("input 'x' is required")
    _check_dtype(x.dtype, "x")
    check_axis(attrs["axis"], x.rank)
    return [x]


def _make_reference(op):
    return lambda inputs, attrs: [reference(op, inputs[0], attrs["axis"])]


def _make_reference_backward(op):
    def reference_backward_rule(inputs, outputs, out_grads, attrs):
        y = reference(op, inputs[0], attrs["axis"])  # float64 y, not the rounded output
        return [reference_backward(op, out_grads[0], y, attrs["axis"])]

    return reference_backward_rule


def _make_candidate(op, name):
    def supports(problem: Problem):
        _, n, inner = layout(problem.in_types[0].shape, problem.attrs["axis"])
        return _native_module().unsupported_reason(name, n, inner, False) or None

    def prepare(problem: Problem):
        x = problem.in_types[0]
        outer, n, inner = layout(x.shape, problem.attrs["axis"])
        return native_launch(_native_module().bind_forward(op, outer, n, inner, x.dtype, name))  # a C launch

    return table_candidate("_ops_softmax", name, supports, prepare)


def _register(op):
    return register(OpDef(
        name=op,
        samples=lambda rng: [Sample((sample_array(rng, 4, 6),), {"axis": 0}, "the first axis (strided)"),
                             Sample((sample_array(rng, 3, 5),), {}, "the last axis, odd length"),
                             Sample((sample_array(rng, 3, 40, dtype="bfloat16"),), {}, "bfloat16")],
        inputs=(Input("x"),),
        outputs=("y",),
        attrs=(Attr("axis", int, -1, doc="the axis the softmax normalizes over"),),
        infer=_infer,
        reference=_make_reference(op),
        reference_backward=_make_reference_backward(op),
        candidates=(
            _make_candidate(op, "warp_row"),
            _make_candidate(op, "block_row"),
            _make_candidate(op, "block_row_two_pass"),
            _make_candidate(op, "strided"),
        ),
        doc=__doc__,
    ))


SOFTMAX = _register("softmax")
LOG_SOFTMAX = _register("log_softmax")
for _op in OP_NAMES:
    Face(OPS[_op], _backward(_op), saved=("y",))
# This module is the face of softmax; log_softmax's is ``ge2.ops.log_softmax``.
globals().update(FACES["softmax"].functions())


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: ``<op>_backward(dy, y)`` from the forward output, the native backward.
# ---------------------------------------------------------------------------------------------------------------
from . import _grad  # noqa: E402  (the grad section stays separate from the face above)
from ._base import attach_grad  # noqa: E402


def _register_backward(op):
    def infer(in_types, attrs):
        dy, y = in_types
        if dy != y:
            raise ValueError(f"dy: expected {y} (the type of y), got {dy}")
        return _infer([y], attrs)

    def prepare(problem: Problem):
        y = problem.in_types[1]
        outer, n, inner = layout(y.shape, problem.attrs["axis"])
        kernel = _backward_kernel("auto", n, inner, y.dtype)
        return native_launch(_native_module().bind_backward(op, outer, n, inner, y.dtype, kernel))  # a C launch

    return _grad.register_backward(OpDef(
        name=f"{op}_backward",
        inputs=(Input("dy"), Input("y")),
        outputs=("dx",),
        attrs=(Attr("axis", int, -1),),
        infer=infer,
        reference=lambda inputs, attrs: [reference_backward(op, inputs[0], inputs[1], attrs["axis"])],
        candidates=(_grad.native_candidate("_ops_softmax", f"dx of {op} from dy and y", prepare),),
        doc=f"{op}_backward(dy, y) -> dx of y = {op}(x, axis)",
    ))


def _grad_rule(op):
    def rule(g, node, dys):
        return [getattr(g, f"{op}_backward")(dys[0], node.outputs[0], axis=node.attrs["axis"])]

    return rule


for _op, _opdef in (("softmax", SOFTMAX), ("log_softmax", LOG_SOFTMAX)):
    _register_backward(_op)
    attach_grad(_opdef, _grad_rule(_op))
