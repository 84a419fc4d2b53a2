"""transpose and reshape: data movement, exact in every dtype (float32, float16, bfloat16, int32, int64, uint8).

``transpose(x, perm)``: ``y[i_0, ..., i_{r-1}] = x[j]`` with ``j[perm[k]] = i_k``, i.e. ``y = x.transpose(perm)``
(NumPy/PyTorch ``permute``), for any rank <= 8. ``perm`` is a permutation of the axes; negative axes count from the
end. ``y`` is contiguous; ``x`` may have any strides (a torch view is read in place). Backward is the transpose by
the inverse permutation.

``reshape(x, shape)``: the same elements in row-major order with another shape; one entry of ``shape`` may be -1
(inferred from the element count). On device, reshape of a contiguous array is a zero-copy view:
``forward("reshape", x, shape)`` returns ``x.view(shape)`` for torch, ``x.reshape(shape)`` for CuPy and GE2's
``DeviceArray``; a strided input is first gathered into a contiguous array. Backward is reshape back.

reshape as an alias in a plan: the output's bytes are the input's bytes (plan buffers are contiguous), so an
executor may give the output the input's arena offset, extend the input buffer's lifetime to the output's last use,
and skip the node. That is valid unless the input is a graph input or parameter the caller may overwrite between
runs while the output is still read, or the output is a graph output that must own its buffer; only then does it
run the OpDef's candidate, a device-to-device copy (``copy``).

Transpose kernel candidates (``kernels()``), best first. A transpose is first reduced to a copy from x's permuted
strides into the contiguous y and simplified: extent-1 axes go, and axes that stay neighbours merge (a 4-d
(0, 2, 1, 3) permute is a batched move of whole rows; a 2-d transpose stays 2-d). Then:
1. ``tiled_packed``: 64x64 shared-memory tiles of 2-byte elements moved as 4-byte words, 2x2 blocks transposed in
   registers: every warp reads and writes 128 contiguous bytes. For float16/bfloat16 when x's unit-stride axis
   moves and both tile axes are even and >= 8.
2. ``tiled``: 32x32 shared-memory tiles padded against bank conflicts, any element size, when x's unit-stride axis
   moves and both tile axes are >= 8. Other axes are batch axes.
3. ``strided``: a gather in y's order, 16-byte vectors when the innermost axis stays innermost (whole rows move),
   cudaMemcpyAsync when nothing moves. Always works.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from .. import selection
from ..dtypes import itemsize
from ..ir import dims
from ..ir.types import TensorType
from . import _layout
from ._base import (Attr, Candidate, Input, OpDef, Problem, Sample, in_ptr, native_launch, out_ptr, register,
                    sample_array, stream_arg, table_candidate)
from ._face import FACES, Face


def _native_module():
    return _native.load("_ops_transpose")


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes and arguments only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def check_perm(perm, rank: int) -> tuple[int, ...]:
    """``perm`` as a tuple of non-negative axes; raises naming ``perm`` unless it is a permutation of ``rank``
    axes (negative axes count from the end)."""
    perm = _layout.int_tuple(perm, "perm")
    _layout.check_rank(rank, "x")
    if len(perm) != rank:
        raise ValueError(f"perm: expected {rank} axes (the rank of x), got {len(perm)}: {perm}")
    normalized = tuple(_layout.normalize_axis(axis, rank, "perm") for axis in perm)
    if len(set(normalized)) != rank:
        repeated = next(axis for axis in normalized if normalized.count(axis) > 1)
        raise ValueError(f"perm: expected a permutation of 0..{rank - 1}, got {perm} (axis {repeated} appears "
                         "more than once)")
    return normalized


def inverse_perm(perm) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for position, axis in enumerate(perm):
        inverse[axis] = position
    return tuple(inverse)


def reshape_shape(in_shape, shape) -> tuple[int, ...]:
    """The output shape of reshaping ``in_shape`` to ``shape`` (at most one -1, inferred); raises naming
    ``shape`` when the element counts cannot match."""
    shape = _layout.int_tuple(shape, "shape")
    _layout.check_rank(len(shape), "shape")
    if any(extent < -1 for extent in shape):
        raise ValueError(f"shape: expected extents >= 0 and at most one -1, got {shape}")
    unknown = [axis for axis, extent in enumerate(shape) if extent == -1]
    if len(unknown) > 1:
        raise ValueError(f"shape: at most one -1 may be inferred, got {shape}")
    total = _layout.numel(in_shape)
    known = _layout.numel(extent for extent in shape if extent != -1)
    mismatch = ValueError(f"shape: cannot reshape {tuple(in_shape)} ({total} elements) into {shape}")
    if unknown:
        if known == 0 or total % known != 0:
            raise mismatch
        return tuple(total // known if extent == -1 else extent for extent in shape)
    if known != total:
        raise mismatch
    return shape


# ---------------------------------------------------------------------------------------------------------------
# Reference: exact (float64 for floats, the integers themselves), the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def reference_transpose(x, perm) -> np.ndarray:
    x = _layout.exact(x)
    return np.transpose(x, check_perm(perm, x.ndim))


def reference_reshape(x, shape) -> np.ndarray:
    x = _layout.exact(x)
    return np.reshape(x, reshape_shape(x.shape, shape))


# ---------------------------------------------------------------------------------------------------------------
# Python face: this module is transpose's, ``ge2.ops.reshape`` reshape's (generated, ops/_face.py). Both take
# strided inputs; reshape of a contiguous array returns a view.
# ---------------------------------------------------------------------------------------------------------------
def _transpose(x, perm, kernel="auto", out=None, stream=None):
    view = _device.view_of(x, "x")
    perm = check_perm(perm, len(view.shape))
    y, y_view = _layout.output(out, x, "out", tuple(view.shape[axis] for axis in perm), view.dtype, view.device)
    _layout.check_no_overlap(y_view, "out", view, "x")
    native, shape, strides = _native_module(), list(view.shape), list(view.strides)
    kernel = selection.table_kernel(
        "_ops_transpose", kernel,
        lambda name: native.unsupported_reason(name, shape, strides, list(perm), view.dtype, view.ptr, y_view.ptr),
        view.dtype)
    native.forward(view.ptr, y_view.ptr, shape, strides, list(perm), view.dtype, kernel,
                   _device.stream_handle(stream))
    return y


def _reshape(x, shape, out=None, stream=None):
    view = _device.view_of(x, "x")
    new_shape = reshape_shape(view.shape, shape)
    if out is None and view.is_contiguous:
        return _view_as(x, new_shape)
    if out is None:  # a strided input: gather it into a contiguous array of its own shape, then view that
        gathered = _device.empty_like_kind(x, tuple(view.shape), view.dtype, view.device)
        _gather(view, _device.view_of(gathered, "out"), stream)
        return _view_as(gathered, new_shape)
    _, out_view = _layout.output(out, x, "out", new_shape, view.dtype, view.device)
    _layout.check_no_overlap(out_view, "out", view, "x")
    _gather(view, out_view, stream)
    return out


def _gather(view, out_view, stream):
    """Copies ``view`` in row-major order into the contiguous ``out_view`` (same element count)."""
    handle = _device.stream_handle(stream)
    if view.is_contiguous:
        _native_module().copy(view.ptr, out_view.ptr, _layout.numel(view.shape) * itemsize(view.dtype), handle)
    else:
        identity = list(range(len(view.shape)))
        _native_module().forward(view.ptr, out_view.ptr, list(view.shape), list(view.strides), identity, view.dtype,
                                 "strided", handle)


def _view_as(x, shape):
    """A zero-copy view of the contiguous array ``x`` with another shape, of ``x``'s kind."""
    module = type(x).__module__
    if module.startswith("torch"):
        return x.view(shape)
    if module.startswith("cupy"):
        return x.reshape(shape)
    return _device.as_device_array(x, "x").reshape(list(shape))


# ---------------------------------------------------------------------------------------------------------------
# Op definitions: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _infer_transpose(in_types, attrs):
    (x,) = in_types
    perm = check_perm(attrs["perm"], x.rank)
    return [TensorType(tuple(x.shape[axis] for axis in perm), x.dtype)]


def _infer_reshape(in_types, attrs):
    (x,) = in_types
    shape = tuple(attrs["shape"])
    if x.is_concrete and not any(isinstance(extent, str) for extent in shape):
        return [TensorType(reshape_shape(x.shape, shape), x.dtype)]
    # Symbolic dims (in the input or the target): a -1 is the quotient of the element counts as symbolic products
    # (dims.quotient); a fully given target is taken as it is (unless the counts differ for every size) and checked
    # when the plan binds the dims.
    _layout.check_rank(len(shape), "shape")
    if any(isinstance(extent, int) and extent < -1 for extent in shape) or shape.count(-1) > 1:
        raise ValueError(f"shape: expected extents >= 0, symbolic dims and at most one -1, got {shape}")
    if -1 in shape:
        try:
            inferred = dims.quotient(dims.product(*x.shape), dims.product(*(d for d in shape if d != -1)))
        except ValueError:
            raise ValueError(f"shape: cannot reshape {tuple(x.shape)} into {shape}: the known dims do not divide "
                             "the element count") from None
        shape = tuple(inferred if extent == -1 else extent for extent in shape)
    elif dims.compare(dims.product(*x.shape), dims.product(*shape)) not in (0, None):
        raise ValueError(f"shape: cannot reshape {tuple(x.shape)} into {shape}: the element counts differ for "
                         "every size")
    return [TensorType(shape, x.dtype)]


def _shape_check(value) -> str | None:
    """Attr check of reshape's target: ints and symbolic dims (names or products, see ir/dims.py)."""
    if all(_layout.is_int(item) or isinstance(item, str) for item in value):
        return None
    return "must hold only ints and symbolic dims"


def _transpose_candidate(name):
    def arguments(problem: Problem):
        (x,) = problem.in_types
        perm = check_perm(problem.attrs["perm"], x.rank)
        return list(x.shape), list(_layout.contiguous_strides(x.shape)), list(perm), x.dtype

    def supports(problem: Problem):
        shape, strides, perm, dtype = arguments(problem)
        return _native_module().unsupported_reason(name, shape, strides, perm, dtype, 256, 256) or None

    def prepare(problem: Problem):
        shape, strides, perm, dtype = arguments(problem)
        return native_launch(_native_module().forward, in_ptr(0), out_ptr(0), shape, strides, perm, dtype, name,
                             stream_arg())

    return table_candidate("_ops_transpose", name, supports, prepare)


def _prepare_reshape_copy(problem: Problem):
    nbytes = problem.in_types[0].numel * itemsize(problem.in_types[0].dtype)
    return native_launch(_native_module().copy, in_ptr(0), out_ptr(0), nbytes, stream_arg())


TRANSPOSE = register(OpDef(
    name="transpose",
    samples=lambda rng: [Sample((sample_array(rng, 2, 3, 4),), {"perm": (2, 0, 1)})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("perm", tuple, check=_layout.ints_check, doc="output axis k is input axis perm[k]"),),
    infer=_infer_transpose,
    reference=lambda inputs, attrs: [reference_transpose(inputs[0], attrs["perm"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        np.transpose(_layout.exact(out_grads[0]), inverse_perm(check_perm(attrs["perm"], np.ndim(inputs[0]))))],
    candidates=(
        _transpose_candidate("tiled_packed"),
        _transpose_candidate("tiled"),
        _transpose_candidate("strided"),
    ),
    doc="transpose(x, perm): y = x.transpose(perm), any rank <= 8; exact in every dtype.",
))

def _first(out):
    return None if out is None else out[0]


def _transpose_forward(inputs, attrs, kernel, out, stream):
    return _transpose(inputs[0], attrs["perm"], kernel, out, stream)


def _transpose_backward(dy, inputs, attrs, kernel, out, stream):
    """(dx,): dy transposed by the inverse permutation."""
    perm = check_perm(attrs["perm"], len(_device.view_of(inputs[0], "x").shape))
    return (_transpose(dy, inverse_perm(perm), out=_first(out), stream=stream),)


Face(TRANSPOSE, _transpose_backward, forward=_transpose_forward)
globals().update(FACES["transpose"].functions())

RESHAPE = register(OpDef(
    name="reshape",
    samples=lambda rng: [Sample((sample_array(rng, 4, 6),), {"shape": (3, -1)})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("shape", tuple, check=_shape_check,
                doc="the new shape: ints (one may be -1) and symbolic dims bound with the input's"),),
    infer=_infer_reshape,
    reference=lambda inputs, attrs: [reference_reshape(inputs[0], attrs["shape"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        np.reshape(_layout.exact(out_grads[0]), np.shape(inputs[0]))],
    candidates=(
        Candidate("copy", 10, "device-to-device copy, for when the executor cannot alias the output to the input",
                  lambda problem: None, _prepare_reshape_copy, always_works=True),
    ),
    aliases=((0, 0),),
    doc="reshape(x, shape): the same row-major elements with another shape (one -1 inferred). The output may alias "
        "the input (same bytes): an executor that can alias skips the node; otherwise it runs a device copy.",
))


def _reshape_forward(inputs, attrs, kernel, out, stream):
    return _reshape(inputs[0], attrs["shape"], out, stream)


def _reshape_backward(dy, inputs, attrs, kernel, out, stream):
    """(dx,): dy with x's shape (a view when dy is contiguous and no ``out`` is given)."""
    return (_reshape(dy, tuple(_device.view_of(inputs[0], "x").shape), out=_first(out), stream=stream),)


Face(RESHAPE, _reshape_backward, forward=_reshape_forward)
# ---------------------------------------------------------------------------------------------------------------
# Grad rule: a transpose by the inverse permutation; a reshape back to x's shape.
# ---------------------------------------------------------------------------------------------------------------
from . import _grad  # noqa: E402  (the grad section stays separate from the face above)
from ._base import attach_grad  # noqa: E402


def _grad_transpose(g, node, dys):
    perm = check_perm(node.attrs["perm"], node.inputs[0].type.rank)
    return [g.transpose(dys[0], perm=inverse_perm(perm))]


def _grad_reshape(g, node, dys):
    return [_grad.reshape_to(g, dys[0], node.inputs[0].type.shape)]


attach_grad(TRANSPOSE, _grad_transpose)
attach_grad(RESHAPE, _grad_reshape)
