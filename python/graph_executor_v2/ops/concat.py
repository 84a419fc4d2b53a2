"""concat: ``y = concatenate(xs, axis)``, any number of inputs of one dtype and rank whose extents agree on every
axis but ``axis``; exact in every dtype. Backward splits dy into the inputs' gradients along ``axis``.

Seen from the axis, input i is ``outer`` rows (the product of the extents before the axis) of
``width_i = extent_i * inner`` contiguous elements, and y's rows are the inputs' rows side by side. Kernel candidates
(``kernels()``), best first:
1. ``fused``: one kernel moves every input, up to 32 per launch, their pointers, widths and column offsets passed by
   value in the kernel arguments (more inputs take more launches); 16-byte units when every width, offset and
   pointer allows. Always works.
2. ``copy2d``: one ``cudaMemcpy2DAsync`` per input (``cudaMemcpyAsync`` for a single row); rows of y must fit
   cudaMemcpy2D's pitch limit (2^31 - 1 bytes) when there are several.
Every input must be contiguous (as plan buffers are).
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from .. import selection
from ..ir import dims
from ..ir.types import TensorType
from . import _layout
from ._base import (Attr, Input, OpDef, Problem, Sample, in_ptrs, native_launch, out_ptr, register, sample_array,
                    stream_arg, table_candidate)
from ._face import Face


def _native_module():
    return _native.load("_ops_concat")


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes and dtypes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def _mismatch(index, shape, first, axis) -> str:
    expected = ", ".join("*" if k == axis else str(extent) for k, extent in enumerate(first))
    return (f"xs[{index}]: expected dims ({expected}) (those of xs[0] except on axis {axis}), got shape "
            f"{tuple(shape)}")


def check_shapes(shapes, axis) -> tuple[int, tuple]:
    """Validates the inputs' shapes; returns (the non-negative axis, y's shape)."""
    if len(shapes) == 0:
        raise ValueError("xs: expected at least one input, got none")
    first = tuple(shapes[0])
    if len(first) == 0:
        raise ValueError("xs[0]: expected rank >= 1 (0-d arrays have no axis to join along), got a 0-d array")
    _layout.check_rank(len(first), "xs[0]")
    axis = _layout.normalize_axis(axis, len(first), "axis")
    for index, shape in enumerate(shapes):
        if len(shape) != len(first):
            raise ValueError(f"xs[{index}]: expected rank {len(first)} (the rank of xs[0]), got shape {tuple(shape)}")
        if any(extent != first[k] for k, extent in enumerate(shape) if k != axis):
            raise ValueError(_mismatch(index, shape, first, axis))
    y_shape = list(first)
    y_shape[axis] = sum(shape[axis] for shape in shapes)
    return axis, tuple(y_shape)


def check_inputs(shapes, dtypes, axis) -> tuple[int, tuple]:
    """Validates the inputs' shapes and dtypes (one GE2 dtype for all); returns (the non-negative axis, y's
    shape)."""
    for index, dtype in enumerate(dtypes):
        _layout.check_dtype(dtype, f"xs[{index}]")
        if dtype != dtypes[0]:
            raise TypeError(f"xs[{index}]: expected dtype {dtypes[0]} (the dtype of xs[0]), got {dtype}")
    return check_shapes(shapes, axis)


def layout(shapes, axis) -> tuple[int, list[int]]:
    """(outer, widths): every input as ``outer`` rows of ``widths[i]`` contiguous elements."""
    outer = _layout.numel(shapes[0][:axis])
    inner = _layout.numel(shapes[0][axis + 1:])
    return outer, [shape[axis] * inner for shape in shapes]


def check_sections(dy_shape, sections, axis) -> tuple[int, tuple[int, ...]]:
    """backward: each input's extent along ``axis``, which must add up to dy's."""
    if len(dy_shape) == 0:
        raise ValueError("dy: expected rank >= 1, got a 0-d array")
    axis = _layout.normalize_axis(axis, len(dy_shape), "axis")
    sections = _layout.int_tuple(sections, "sections")
    if len(sections) == 0 or any(extent < 0 for extent in sections) or sum(sections) != dy_shape[axis]:
        raise ValueError(f"sections: expected one extent >= 0 per input, adding up to dy's extent {dy_shape[axis]} "
                         f"along axis {axis}, got {sections}")
    return axis, sections


def _sequence(xs, argument):
    if not isinstance(xs, (list, tuple)):
        raise TypeError(f"{argument}: expected a list or tuple of arrays, got {type(xs).__name__}")
    return list(xs)


# ---------------------------------------------------------------------------------------------------------------
# Reference: exact (float64 for floats, the integers themselves), the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def reference(xs, axis) -> np.ndarray:
    xs = [np.asarray(x) for x in _sequence(xs, "xs")]
    axis, _ = check_shapes([x.shape for x in xs], axis)
    return np.concatenate([_layout.exact(x) for x in xs], axis=axis)


def reference_backward(dy, sections, axis) -> list[np.ndarray]:
    dy = _layout.exact(dy)
    axis, sections = check_sections(dy.shape, sections, axis)
    return np.split(dy, np.cumsum(sections)[:-1], axis=axis)


# ---------------------------------------------------------------------------------------------------------------
# Python face: generated (ops/_face.py); forward is one candidate launch, backward splits dy here.
# ---------------------------------------------------------------------------------------------------------------
def backward_kernel(requested: str, outer: int, widths: list[int], dtype: str) -> str:
    """The kernel of a native backward call: ``requested``, or for "auto" the selector's choice."""
    native = _native_module()
    return selection.table_kernel("_ops_concat", requested,
                                  lambda name: native.unsupported_reason(name, outer, widths, dtype), dtype)


def _backward(dy, inputs, attrs, kernel, out, stream):
    """One gradient per array of ``xs``: the sections of dy along ``axis``, arrays of dy's kind (or the given
    ``out`` entries)."""
    views = _layout.input_views({f"xs[{i}]": x for i, x in enumerate(inputs)})
    axis, y_shape = check_inputs([v.shape for v in views.values()], [v.dtype for v in views.values()],
                                 attrs["axis"])
    first = views["xs[0]"]
    view = _layout.checked_view(dy, "dy", y_shape, first.dtype, first.device)
    shapes = [tuple(v.shape) for v in views.values()]
    grads, pointers = [], []
    for index, shape in enumerate(shapes):
        argument = f"out[{index}]"
        grad, grad_view = _layout.output(None if out is None else out[index], dy, argument, shape, view.dtype,
                                         view.device)
        _layout.check_no_overlap(grad_view, argument, view, "dy")
        grads.append(grad)
        pointers.append(grad_view.ptr)
    outer, widths = layout(shapes, axis)
    _native_module().backward(view.ptr, pointers, outer, widths, view.dtype,
                              backward_kernel(kernel, outer, widths, view.dtype), _device.stream_handle(stream))
    return grads


# ---------------------------------------------------------------------------------------------------------------
# Op definition: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _compatible(a, b):
    return a == b or isinstance(a, str) != isinstance(b, str)


def _infer(in_types, attrs):
    if any(t is None for t in in_types):
        raise ValueError("xs: every input is required")
    if all(t.is_concrete for t in in_types):
        _, y_shape = check_inputs([t.shape for t in in_types], [t.dtype for t in in_types], attrs["axis"])
        return [TensorType(y_shape, in_types[0].dtype)]
    # Symbolic extents: an int and a name are compatible (the name binds to the int); along the joined axis the
    # extents add up (ir/dims.py: a prepended position makes seq+1).
    first = in_types[0]
    if first.rank == 0:
        raise ValueError("xs[0]: expected rank >= 1 (0-d arrays have no axis to join along), got a 0-d array")
    axis = _layout.normalize_axis(attrs["axis"], first.rank, "axis")
    shape = list(first.shape)
    for index, t in enumerate(in_types):
        if t.dtype != first.dtype:
            raise TypeError(f"xs[{index}]: expected dtype {first.dtype} (the dtype of xs[0]), got {t.dtype}")
        if t.rank != first.rank:
            raise ValueError(f"xs[{index}]: expected rank {first.rank} (the rank of xs[0]), got shape {t.shape}")
        for k, extent in enumerate(t.shape):
            if k == axis:
                continue
            if not _compatible(extent, shape[k]):
                raise ValueError(_mismatch(index, t.shape, first.shape, axis))
            if isinstance(extent, int):
                shape[k] = extent
    shape[axis] = dims.add(*(t.shape[axis] for t in in_types))
    return [TensorType(tuple(shape), first.dtype)]


def _reference_backward(inputs, outputs, out_grads, attrs):
    axis = _layout.normalize_axis(attrs["axis"], np.ndim(inputs[0]), "axis")
    return reference_backward(out_grads[0], [np.shape(x)[axis] for x in inputs], axis)


def _candidate(name):
    def arguments(problem: Problem):
        shapes = [t.shape for t in problem.in_types]
        axis, _ = check_inputs(shapes, [t.dtype for t in problem.in_types], problem.attrs["axis"])
        outer, widths = layout(shapes, axis)
        return outer, widths, problem.in_types[0].dtype

    def supports(problem: Problem):
        return _native_module().unsupported_reason(name, *arguments(problem)) or None

    def prepare(problem: Problem):
        outer, widths, dtype = arguments(problem)
        return native_launch(_native_module().forward, in_ptrs(), out_ptr(0), outer, widths, dtype, name, stream_arg())

    return table_candidate("_ops_concat", name, supports, prepare)


OP = register(OpDef(
    name="concat",
    samples=lambda rng: [Sample(([sample_array(rng, 2, 3), sample_array(rng, 2, 4)],), {"axis": 1})],
    inputs=(Input("xs", variadic=True),),
    outputs=("y",),
    attrs=(Attr("axis", int, doc="the axis to join along; negative counts from the end"),),
    infer=_infer,
    reference=lambda inputs, attrs: [reference(list(inputs), attrs["axis"])],
    reference_backward=_reference_backward,
    candidates=(
        _candidate("fused"),
        _candidate("copy2d"),
    ),
    doc="concat(xs, axis): the inputs joined along axis; backward splits dy. Exact in every dtype.",
))
globals().update(Face(OP, _backward).functions())


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: each input's gradient is its slice of dy along the axis.
# ---------------------------------------------------------------------------------------------------------------
from ._base import attach_grad  # noqa: E402  (the grad section stays separate from the face above)


def _grad_concat(g, node, dys):
    (dy,) = dys
    axis = node.attrs["axis"] % dy.type.rank
    grads, start = [], 0
    for x in node.inputs:
        end = dims.add(start, x.type.shape[axis])  # symbolic positions are bound with the plan's dims
        grads.append(g.slice(dy, starts=(start,), ends=(end,), axes=(axis,)))
        start = end
    return grads


attach_grad(OP, _grad_concat)
