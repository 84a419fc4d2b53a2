"""slice: ``y = x[starts:ends:steps]`` on the listed axes, with ONNX Slice semantics; exact in every dtype.

``slice(x, starts, ends, axes=None, steps=None)``: ``axes`` defaults to the first ``len(starts)`` axes and may be
negative; ``steps`` defaults to 1 and may be negative (never 0); each axis appears once. Per sliced axis of extent
``d`` (ONNX Slice-13): a negative start or end counts from the end (``+ d``); then, for a positive step, start and end
are clamped to ``[0, d]``; for a negative step, start to ``[0, d - 1]`` and end to ``[-1, d - 1]``; the axis keeps
``max(0, ceil((end - start) / step))`` elements, ``start, start + step, ...``. An end of exactly ``2**31 - 1`` or
``2**63 - 1`` (INT_MAX) means "no end": through the last element in the step's direction, so with a negative step
through element 0, as ONNX Runtime reads it; ``-2**63`` (INT_MIN) slices backwards to the beginning by clamping.
This is NumPy's slicing except for two corners, both as in ONNX Runtime: with a negative step, a start below ``-d``
starts at element 0 (ONNX clamps it to 0; NumPy yields nothing), and an INT_MAX end runs to element 0 (NumPy would
clamp it to ``d - 1`` and yield nothing).

Forward gathers the slice (any input strides) into a contiguous ``y``: the slice is a strided view of ``x`` (strides
times steps, origin at the starts), copied by the shared strided-copy kernel, so a step-1 slice of outer axes is one
``cudaMemcpyAsync``, a slice that keeps whole rows moves 16-byte vectors, and steps on the innermost axis move
elements. Backward writes ``dx`` (zeros, with the slice set to ``dy``) in one pass over ``dx``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _native
from .. import device as _device
from ..ir import dims
from ..ir.types import TensorType
from . import _layout
from ._base import (Attr, Input, OpDef, Problem, Sample, in_ptr, native_launch, out_ptr, register, sample_array,
                    stream_arg, table_candidate)
from ._face import Face

_BIG = 2**31 - 1  # an end at least this large slices a symbolic axis to its end
_NO_END = (2**31 - 1, 2**63 - 1)  # INT32_MAX and INT64_MAX as an end: through the last element in the step's direction


def _native_module():
    return _native.load("_ops_slice")


# ---------------------------------------------------------------------------------------------------------------
# Validation and ONNX normalization: shapes and arguments only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
class Geometry(NamedTuple):
    """The slice of every axis of x: y's extents, and the starts (inside x when y is not empty) and steps."""

    starts: tuple[int, ...]
    steps: tuple[int, ...]
    shape: tuple[int, ...]  # y's shape


def _arguments(rank, starts, ends, axes, steps):
    """(axes, starts, ends, steps) as equally long tuples of ints, axes non-negative and unique."""
    starts = _layout.int_tuple(starts, "starts")
    ends = _layout.int_tuple(ends, "ends")
    if len(ends) != len(starts):
        raise ValueError(f"ends: expected {len(starts)} entries (one per start), got {len(ends)}")
    if axes is None:
        if len(starts) > rank:
            raise ValueError(f"starts: expected at most {rank} entries (the rank of x) when axes is not given, "
                             f"got {len(starts)}")
        axes = tuple(range(len(starts)))
    else:
        axes = _layout.int_tuple(axes, "axes")
        if len(axes) != len(starts):
            raise ValueError(f"axes: expected {len(starts)} entries (one per start), got {len(axes)}")
        axes = tuple(_layout.normalize_axis(axis, rank, "axes") for axis in axes)
        repeated = [axis for axis in set(axes) if axes.count(axis) > 1]
        if repeated:
            raise ValueError(f"axes: each axis may be sliced once, got axis {repeated[0]} more than once in {axes}")
    if steps is None:
        steps = (1,) * len(starts)
    else:
        steps = _layout.int_tuple(steps, "steps")
        if len(steps) != len(starts):
            raise ValueError(f"steps: expected {len(starts)} entries (one per start), got {len(steps)}")
        if 0 in steps:
            raise ValueError(f"steps: a step of 0 is not allowed, got {steps}")
    return axes, starts, ends, steps


def _clamp(value, low, high):
    return max(low, min(value, high))


def axis_slice(extent: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX's (start, count) of one axis: the slice takes ``start + i * step`` for ``i < count``."""
    if extent == 0:
        return 0, 0
    if end in _NO_END and step < 0:
        end = -1
    elif end < 0:
        end += extent
    if start < 0:
        start += extent
    if step > 0:
        start, end = _clamp(start, 0, extent), _clamp(end, 0, extent)
        count = (end - start + step - 1) // step
    else:
        start, end = _clamp(start, 0, extent - 1), _clamp(end, -1, extent - 1)
        count = (start - end - step - 1) // -step
    count = max(0, count)
    return (start if count > 0 else 0), count


def geometry(shape, starts, ends, axes=None, steps=None) -> Geometry:
    """Validates a slice of an array of ``shape`` and normalizes it; raises naming the argument."""
    shape = tuple(shape)
    _layout.check_rank(len(shape), "x")
    axes, starts, ends, steps = _arguments(len(shape), starts, ends, axes, steps)
    full_starts, full_steps, y_shape = [0] * len(shape), [1] * len(shape), list(shape)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        full_starts[axis], y_shape[axis] = axis_slice(shape[axis], start, end, step)
        full_steps[axis] = step
    return Geometry(tuple(full_starts), tuple(full_steps), tuple(y_shape))


def _check_dy(dy_shape, input_shape, starts, ends, axes, steps) -> Geometry:
    input_shape = _layout.int_tuple(input_shape, "input_shape")
    if any(extent < 0 for extent in input_shape):
        raise ValueError(f"input_shape: expected extents >= 0, got {input_shape}")
    result = geometry(input_shape, starts, ends, axes, steps)
    if tuple(dy_shape) != result.shape:
        raise ValueError(f"dy: expected shape {result.shape} (the slice of input_shape {input_shape}), got "
                         f"{tuple(dy_shape)}")
    return result


# ---------------------------------------------------------------------------------------------------------------
# Reference: exact (float64 for floats, the integers themselves), the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def _index(result: Geometry):
    """NumPy basic indexing that takes the normalized slice."""
    index = []
    for start, step, count in zip(result.starts, result.steps, result.shape):
        stop = start + count * step
        index.append(slice(start, stop if stop >= 0 else None, step) if count > 0 else slice(0, 0))
    return tuple(index)


def reference(x, starts, ends, axes=None, steps=None) -> np.ndarray:
    x = _layout.exact(x)
    return x[_index(geometry(x.shape, starts, ends, axes, steps))].copy()


def reference_backward(dy, input_shape, starts, ends, axes=None, steps=None) -> np.ndarray:
    """dx of x's shape: zeros, with the slice set to dy."""
    dy = _layout.exact(dy)
    result = _check_dy(dy.shape, input_shape, starts, ends, axes, steps)
    dx = np.zeros(tuple(input_shape), dtype=dy.dtype)
    dx[_index(result)] = dy
    return dx


# ---------------------------------------------------------------------------------------------------------------
# Python face: generated (ops/_face.py); forward and backward take any strides, so they are written here.
# ---------------------------------------------------------------------------------------------------------------
def _forward(inputs, attrs, kernel, out, stream):
    """A contiguous array of x's kind (or ``out``) from x of any strides."""
    x = inputs[0]
    view = _device.view_of(x, "x")
    result = geometry(view.shape, *_slice_args(attrs))
    y, y_view = _layout.output(out, x, "out", result.shape, view.dtype, view.device)
    _layout.check_no_overlap(y_view, "out", view, "x")
    _native_module().forward(view.ptr, y_view.ptr, list(view.shape), list(view.strides), list(result.starts),
                             list(result.steps), list(result.shape), view.dtype, _device.stream_handle(stream))
    return y


def _backward(dy, inputs, attrs, kernel, out, stream):
    """(dx,): zeros of x's shape with the slice set to dy (dy of any strides), contiguous, of dy's kind."""
    input_shape = tuple(_device.view_of(inputs[0], "x").shape)
    view = _device.view_of(dy, "dy")
    result = _check_dy(view.shape, input_shape, *_slice_args(attrs))
    dx, dx_view = _layout.output(None if out is None else out[0], dy, "out[0]", input_shape, view.dtype, view.device)
    _layout.check_no_overlap(dx_view, "out[0]", view, "dy")
    _native_module().backward(view.ptr, dx_view.ptr, list(view.strides), list(input_shape), list(result.starts),
                              list(result.steps), list(result.shape), view.dtype, _device.stream_handle(stream))
    return (dx,)


# ---------------------------------------------------------------------------------------------------------------
# Op definition: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _slice_args(attrs):
    return attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"]


def _is_symbolic_dim(value) -> bool:
    try:
        return isinstance(value, str) and isinstance(dims.canonical(value), str)
    except ValueError:
        return False


def _positions_check(value) -> str | None:
    """Attr check of starts and ends: ints, or symbolic dims (bound when a plan binds the inputs' dims)."""
    return None if all(_layout.is_int(v) or _is_symbolic_dim(v) for v in value) else \
        "must hold only ints and symbolic dims"


def _infer(in_types, attrs):
    (x,) = in_types
    starts, ends = tuple(attrs["starts"]), tuple(attrs["ends"])
    if x.is_concrete and not any(isinstance(v, str) for v in starts + ends):
        return [TensorType(geometry(x.shape, *_slice_args(attrs)).shape, x.dtype)]
    # Symbolic extents, starts or ends (see _symbolic_axis_slice): the plan infers again from the bound sizes.
    _layout.check_rank(x.rank, "x")
    placeholders = tuple(0 if isinstance(v, str) else v for v in starts), \
        tuple(0 if isinstance(v, str) else v for v in ends)
    axes, _, _, steps = _arguments(x.rank, *placeholders, attrs["axes"], attrs["steps"])
    shape = list(x.shape)
    for axis, start, end, step in zip(axes, starts, ends, steps):
        if all(isinstance(v, int) for v in (shape[axis], start, end)):
            shape[axis] = axis_slice(shape[axis], start, end, step)[1]
            continue
        extent = _symbolic_axis_slice(shape[axis], start, end, step)
        if extent is None:
            raise ValueError(f"axes: axis {axis} of extent {shape[axis]!r} sliced from {start!r} to {end!r} by "
                             f"{step}: its length depends on the sizes in a way GE2 does not infer (it takes a "
                             f"whole axis, a fixed count, or start <= end <= extent it can prove, step > 0)")
        shape[axis] = extent
    return [TensorType(tuple(shape), x.dtype)]


def _symbolic_axis_slice(extent, start, end, step):
    """The extent of a slice where the extent, start or end is a symbolic dim (ir/dims.py), or None: a negative int
    counts from the end, an end >= INT32_MAX is the end; then the slice takes ``end - start`` elements (every
    ``step``-th) when ``0 <= start <= end`` holds for every size. An end beyond the extent is clamped where that is
    provable, else taken as it is (the length the model's traced guards promise: exporters' ``x[:, :seq]``,
    ``x[:, -1]``, ``x[:, :4]``); a bound plan infers again from the bound sizes, with ONNX clamping."""
    if step <= 0:
        return None
    if isinstance(start, int) and start < 0:
        start = dims.add(extent, start)
    if isinstance(end, int) and end >= _BIG:
        end = extent
    elif isinstance(end, int) and end < 0:
        end = dims.add(extent, end)
    if dims.compare(end, extent) == 1:
        end = extent
    length = dims.subtract(end, start)
    if isinstance(length, int):  # x[:, 2:7:2], x[:, -4:-1] of an axis long enough: a count (ONNX: none if < 0)
        return max(0, -(-length // step))
    start_floor, length_floor = dims.lower_bound(start), dims.lower_bound(length)
    if start_floor is None or start_floor < 0 or length_floor is None or length_floor < 0:
        return None
    return dims.floor_divide(dims.add(length, step - 1), step)


def _prepare(problem: Problem):
    (x,) = problem.in_types
    result = geometry(x.shape, *_slice_args(problem.attrs))
    shape, strides = list(x.shape), list(_layout.contiguous_strides(x.shape))
    starts, steps, y_shape, dtype = list(result.starts), list(result.steps), list(result.shape), x.dtype
    return native_launch(_native_module().forward, in_ptr(0), out_ptr(0), shape, strides, starts, steps, y_shape,
                         dtype, stream_arg())


OP = register(OpDef(
    name="slice",
    samples=lambda rng: [Sample((sample_array(rng, 5, 6),),
                                {"starts": (1,), "ends": (5,), "axes": (1,), "steps": (2,)})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(
        Attr("starts", tuple, check=_positions_check,
             doc="first index per sliced axis (ONNX clamping); a symbolic dim is bound with the inputs' dims"),
        Attr("ends", tuple, check=_positions_check,
             doc="end (exclusive) per sliced axis (ONNX clamping); a symbolic dim is bound with the inputs' dims"),
        Attr("axes", tuple, None, check=_layout.ints_check, doc="the sliced axes; default the first len(starts)"),
        Attr("steps", tuple, None, check=_layout.ints_check, doc="step per sliced axis, nonzero; default 1"),
    ),
    infer=_infer,
    reference=lambda inputs, attrs: [reference(inputs[0], *_slice_args(attrs))],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        reference_backward(out_grads[0], np.shape(inputs[0]), *_slice_args(attrs))],
    candidates=(
        table_candidate("_ops_slice", "strided", lambda problem: None, _prepare),
    ),
    doc="slice(x, starts, ends, axes=None, steps=None): ONNX Slice; exact in every dtype.",
))
globals().update(Face(OP, _backward, forward=_forward).functions())


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: ``slice_backward(dy, x)`` (x for its shape): zeros with the slice set to dy, the native backward.
# ---------------------------------------------------------------------------------------------------------------
from . import _grad  # noqa: E402  (the grad section stays separate from the face above)
from ._base import attach_grad  # noqa: E402


def _infer_backward(in_types, attrs):
    dy, x = in_types
    (y,) = _infer([x], attrs)
    if dy != y:
        raise ValueError(f"dy: expected {y} (the slice's output type), got {dy}")
    return [x]


def _prepare_backward(problem: Problem):
    x = problem.in_types[1]
    result = geometry(x.shape, *_slice_args(problem.attrs))
    dy_strides = list(_layout.contiguous_strides(result.shape))
    shape, starts, steps, y_shape, dtype = list(x.shape), list(result.starts), list(result.steps), \
        list(result.shape), x.dtype
    return native_launch(_native_module().backward, in_ptr(0), out_ptr(0), dy_strides, shape, starts, steps, y_shape,
                         dtype, stream_arg())


BACKWARD_OP = _grad.register_backward(OpDef(
    name="slice_backward",
    inputs=(Input("dy"), Input("x")),
    outputs=("dx",),
    attrs=OP.attrs,
    infer=_infer_backward,
    reference=lambda inputs, attrs: [reference_backward(inputs[0], np.shape(inputs[1]), *_slice_args(attrs))],
    candidates=(_grad.native_candidate("_ops_slice", "zeros, then dy scattered into the slice", _prepare_backward),),
    doc="slice_backward(dy, x) -> dx: zeros of x's shape with the slice set to dy",
))

attach_grad(OP, lambda g, node, dys: [g.slice_backward(dys[0], node.inputs[0], **node.attrs)])
