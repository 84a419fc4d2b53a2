"""Shape and index ops that real models are made of, all on one native module (``_ops_indexing``,
backends/cuda/ops/indexing):

- ``expand(x, shape)``: NumPy broadcasting of x with ``shape`` (ONNX Expand; a -1 or 1 keeps x's dim).
- ``pad(x, pads, mode, value)``: ``pads`` = (begins of every axis, then ends), ONNX's order; "constant" (negative
  pads crop), "reflect" (the edge not repeated), "edge" or "wrap" (circular).
- ``roll(x, shifts, axes)``, ``repeat_interleave(x, repeats, axis)``, ``tile(x, repeats)``: as NumPy's roll, repeat,
  tile.
- ``gather(x, indices, axis)``: ONNX Gather / ``np.take`` (index_select): y = x.shape[:axis] + indices.shape +
  x.shape[axis + 1:]; negative indices count from the end.
- ``gather_elements(x, indices, axis)``: ONNX GatherElements / ``take_along_axis``: y has indices' shape.
- ``gather_nd(x, indices, batch_dims)``: ONNX GatherND: each tuple of r = indices.shape[-1] indices addresses x's r
  axes after the first ``batch_dims`` (which x and indices share); y = x.shape[:b] + indices.shape[b:-1] +
  x.shape[b + r:].
- ``cumsum(x, axis, exclusive, reverse)``: ONNX CumSum.
- ``trilu(x, k, upper)``: ONNX Trilu on the last two axes (tril / triu with diagonal k).
- ``arange(x, axis, start, delta, dtype)``: ``start + delta * [0, 1, ..., n - 1]`` with n = x.shape[axis] (a size
  that may be symbolic: the positions of a sequence).
- ``resize(x, size, mode, coordinates, nearest_mode, scales, layout)``: ONNX Resize of the last two axes (``layout``
  "NCHW", the default) or of the two before the last (``"NHWC"``: channels-last, the channels the innermost axis),
  nearest or (bi)linear, coordinate transformations half_pixel, pytorch_half_pixel, align_corners, asymmetric.
- ``adaptive_avg_pool2d(x, output_size)``: PyTorch's adaptive average pooling of the last two axes.

An index outside its axis (gather, gather_elements, gather_nd) reads nothing: its element is NaN (floats) or 0
(integers), in the reference as on the GPU. Gradients: expand, pad, roll, repeat_interleave, tile, cumsum and trilu
(ordinary ops of the gradient); the gathers, arange, resize and adaptive pooling have none here.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from ..dtypes import FLOAT_DTYPES, itemsize, to_numpy
from ..ir import dims
from ..ir.types import TensorType
from . import _layout
from ._base import (Attr, Candidate, Input, OPS, OpDef, Problem, Sample, attach_grad, in_ptr, native_launch, out_ptr,
                    register, sample_array, stream_arg, table_candidate)
from ._face import FACES, Face

MODULE = "_ops_indexing"
OFFSET, REFLECT, EDGE, WRAP, DIVIDE, MODULO = range(6)  # ge2::indexing::AxisMode
COORDINATES = ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")  # ge2::indexing::Coordinates
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")  # ge2::indexing::Rounding
INDEX_DTYPES = ("int32", "int64")


def _native_module():
    return _native.load(MODULE)


def _built(problem: Problem):
    return None if _native.is_built(MODULE) else f"native module {MODULE} is not built"


def _fill_bits(value: float, dtype: str) -> int:
    """The bytes of ``value`` in ``dtype`` as an unsigned integer (what the data-movement kernels write)."""
    size = itemsize(dtype)
    return int(np.array(value).astype(to_numpy(dtype)).reshape(1).view(f"u{size}")[0])


def _missing(dtype: str) -> float:
    """What an index outside its axis reads: NaN in a float dtype, 0 otherwise."""
    return float("nan") if dtype in FLOAT_DTYPES else 0


def _concrete(t: TensorType, argument: str) -> tuple[int, ...]:
    if not t.is_concrete:
        raise ValueError(f"{argument}: this op needs concrete extents here, got {t.shape}")
    return tuple(t.shape)


def _axis_map_launch(x_shape, y_shape, modes, params, dtype, fill=0.0):
    return native_launch(_native_module().axis_map, in_ptr(0), out_ptr(0), list(x_shape), list(y_shape),
                         list(modes), list(params), itemsize(dtype), _fill_bits(fill, dtype), stream_arg())


def _candidate(name: str, prepare) -> tuple[Candidate, ...]:
    return (table_candidate("_ops_indexing", name, _built, prepare),)


def _no_gradient(dy, inputs, attrs, kernel, out, stream):
    return (None,) * len(inputs)


def _register(opdef: OpDef, backward=_no_gradient) -> OpDef:
    opdef = register(opdef)
    Face(opdef, backward)
    return opdef


def _grad_face(op: str):
    """A face's backward through the op's grad rule: the rule's nodes (ordinary GE2 ops, no backward kernel of their
    own) run one by one through their faces on the device arrays, the last one into ``out``."""

    def backward(dy, inputs, attrs, kernel, out, stream):
        from .. import device as _device
        from ..ir.graph import Graph

        view = _device.view_of(inputs[0], "x")
        g = Graph(f"{op}_backward")
        x = g.input("x", tuple(view.shape), view.dtype)
        y = getattr(g, op)(x, **attrs)
        dy_value = g.input("dy", y.type.shape, y.type.dtype)
        (dx,) = OPS[op].grad(g, g.nodes[-1], [dy_value])
        target = None if out is None else out[0]
        values = {x.name: inputs[0], dy_value.name: dy}
        steps = g.nodes[1:]
        if not steps:  # the gradient is dy itself (an expand to x's own shape)
            if target is None:
                return (dy,)
            return (FACES["reshape"].forward(dy, shape=tuple(view.shape), out=target, stream=stream),)
        for index, node in enumerate(steps):
            last = index == len(steps) - 1
            values[node.outputs[0].name] = FACES[node.op].forward(
                *(values[v.name] for v in node.inputs), **node.attrs, out=target if last else None, stream=stream)
        return (values[dx.name],)

    return backward


# ---------------------------------------------------------------------------------------------------------------
# expand
# ---------------------------------------------------------------------------------------------------------------
def expand_shape(x_shape, shape) -> tuple:
    """NumPy broadcasting of ``x_shape`` and ``shape`` (a -1 in ``shape`` keeps x's dim, as torch.expand)."""
    shape = tuple(shape)
    rank = max(len(x_shape), len(shape))
    x_full = (1,) * (rank - len(x_shape)) + tuple(x_shape)
    target = (1,) * (rank - len(shape)) + shape
    result = []
    for axis, (a, b) in enumerate(zip(x_full, target)):
        if b == -1 or b == 1 or a == b:
            result.append(a)
        elif a == 1:
            result.append(b)
        else:
            raise ValueError(f"shape: x's dim {a!r} (axis {axis}) does not broadcast to {b!r}; x {tuple(x_shape)}, "
                             f"shape {shape}")
    return tuple(result)


def _shape_check(value) -> str | None:
    ok = all((_layout.is_int(d) and d >= -1) or isinstance(d, str) for d in value)
    return None if ok else "must hold ints >= -1 and symbolic dims"


def _infer_expand(in_types, attrs):
    (x,) = in_types
    return [TensorType(expand_shape(x.shape, attrs["shape"]), x.dtype)]


def _prepare_expand(problem: Problem):
    x, y = problem.in_types[0], problem.out_types[0]
    x_shape = (1,) * (y.rank - x.rank) + _concrete(x, "x")
    return _axis_map_launch(x_shape, y.shape, [MODULO] * y.rank, [0] * y.rank, x.dtype)


def _reference_expand_backward(dy, x_shape):
    dy = np.asarray(dy, np.float64)
    extra = dy.ndim - len(x_shape)
    axes = tuple(range(extra)) + tuple(extra + a for a, d in enumerate(x_shape) if d == 1 and dy.shape[extra + a] != 1)
    return dy.sum(axis=axes).reshape(x_shape) if axes else dy.reshape(x_shape)


EXPAND = _register(OpDef(
    name="expand",
    samples=lambda rng: [Sample((sample_array(rng, 3, 1),), {"shape": (2, 3, 4)})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("shape", tuple, check=_shape_check, doc="the shape x is broadcast with (-1: x's dim)"),),
    infer=_infer_expand,
    reference=lambda inputs, attrs: [np.broadcast_to(_layout.exact(inputs[0]),
                                                     expand_shape(np.shape(inputs[0]), attrs["shape"])).copy()],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        _reference_expand_backward(out_grads[0], np.shape(inputs[0]))],
    candidates=_candidate("axis_map", _prepare_expand),
    doc="expand(x, shape): NumPy broadcasting of x with shape (ONNX Expand, torch.expand).",
), backward=_grad_face("expand"))


# ---------------------------------------------------------------------------------------------------------------
# pad
# ---------------------------------------------------------------------------------------------------------------
def pad_geometry(shape, pads, mode) -> tuple[tuple, tuple, tuple]:
    """(begins, ends, output shape) of a pad; raises naming ``pads`` when it does not fit."""
    pads = _layout.int_tuple(pads, "pads")
    rank = len(shape)
    if len(pads) != 2 * rank:
        raise ValueError(f"pads: expected {2 * rank} entries (the begins of the {rank} axes, then the ends), got "
                         f"{len(pads)}")
    begins, ends = pads[:rank], pads[rank:]
    out = []
    for axis, (extent, begin, end) in enumerate(zip(shape, begins, ends)):
        if mode != "constant" and (begin < 0 or end < 0):
            raise ValueError(f"pads: negative pads crop only in constant mode, got {pads} in {mode} mode")
        if begin == 0 and end == 0:
            out.append(extent)
            continue
        if not isinstance(extent, int):  # checked again once the plan binds it
            padded = dims.add(extent, begin, end)
            if dims.lower_bound(padded) is None or dims.lower_bound(padded) < 0:
                raise ValueError(f"pads: axis {axis} of the symbolic extent {extent!r} may be cropped below zero by "
                                 f"{begin} and {end}")
            out.append(padded)
            continue
        if mode != "constant" and extent == 0:
            raise ValueError(f"pads: axis {axis} is empty; only constant padding applies to it")
        if extent + begin + end < 0:
            raise ValueError(f"pads: axis {axis} of extent {extent} cropped below zero by {begin} and {end}")
        out.append(extent + begin + end)
    return begins, ends, tuple(out)


def _infer_pad(in_types, attrs):
    (x,) = in_types
    return [TensorType(pad_geometry(x.shape, attrs["pads"], attrs["mode"])[2], x.dtype)]


def reference_pad(x, pads, mode="constant", value=0.0) -> np.ndarray:
    x = _layout.exact(x)
    begins, ends, _ = pad_geometry(x.shape, pads, mode)
    crop = tuple(slice(max(-b, 0), x.shape[a] - max(-e, 0)) for a, (b, e) in enumerate(zip(begins, ends)))
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends)]
    if mode == "constant":
        return np.pad(x[crop], widths, mode="constant", constant_values=value)
    return np.pad(x, widths, mode=mode)


def _pad_indices(extent, begin, out, mode):
    """The input index of every output index along one axis (-1: the constant), as the kernel computes it."""
    o = np.arange(out) - begin
    if mode == "constant":
        return np.where((o >= 0) & (o < extent), o, -1)
    if mode == "edge":
        return np.clip(o, 0, extent - 1)
    if mode == "wrap":
        return np.mod(o, extent)
    period = max(2 * (extent - 1), 1)
    o = np.mod(o, period)
    return np.where(o < extent, o, period - o) if extent > 1 else np.zeros_like(o)


def reference_pad_backward(dy, x_shape, pads, mode) -> np.ndarray:
    """dx: every dy element added to the x element it was copied from (the constant's positions drop out)."""
    dy = np.asarray(dy, np.float64)
    begins, _, out_shape = pad_geometry(x_shape, pads, mode)
    index = [_pad_indices(n, b, o, mode) for n, b, o in zip(x_shape, begins, out_shape)]
    grids = np.meshgrid(*index, indexing="ij") if index else []
    valid = np.all([grid >= 0 for grid in grids], axis=0) if grids else np.ones((), bool)
    dx = np.zeros(x_shape)
    np.add.at(dx, tuple(grid[valid] for grid in grids), dy[valid])
    return dx


def _prepare_pad(problem: Problem):
    x, y = problem.in_types[0], problem.out_types[0]
    attrs = problem.attrs
    begins, _, _ = pad_geometry(_concrete(x, "x"), attrs["pads"], attrs["mode"])
    mode = {"constant": OFFSET, "reflect": REFLECT, "edge": EDGE, "wrap": WRAP}[attrs["mode"]]
    return _axis_map_launch(x.shape, y.shape, [mode] * x.rank, begins, x.dtype, attrs["value"])


PAD = _register(OpDef(
    name="pad",
    samples=lambda rng: [Sample((sample_array(rng, 3, 4),), {"pads": (1, 0, 2, 1), "mode": "reflect"})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("pads", tuple, check=_layout.ints_check, doc="begins of every axis, then ends (ONNX order)"),
           Attr("mode", str, "constant", choices=("constant", "reflect", "edge", "wrap")),
           Attr("value", float, 0.0, doc="the constant (constant mode)")),
    infer=_infer_pad,
    reference=lambda inputs, attrs: [reference_pad(inputs[0], attrs["pads"], attrs["mode"], attrs["value"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        reference_pad_backward(out_grads[0], np.shape(inputs[0]), attrs["pads"], attrs["mode"])],
    candidates=_candidate("axis_map", _prepare_pad),
    doc="pad(x, pads, mode='constant', value=0.0): ONNX Pad (constant, reflect, edge).",
), backward=_grad_face("pad"))


# ---------------------------------------------------------------------------------------------------------------
# roll, repeat_interleave, tile
# ---------------------------------------------------------------------------------------------------------------
def _roll_axes(rank, shifts, axes):
    shifts = _layout.int_tuple(shifts, "shifts")
    axes = _layout.int_tuple(axes, "axes")
    if len(shifts) != len(axes):
        raise ValueError(f"shifts: expected one per axis ({len(axes)}), got {len(shifts)}")
    return shifts, tuple(_layout.normalize_axis(a, rank, "axes") for a in axes)


def _infer_roll(in_types, attrs):
    (x,) = in_types
    _roll_axes(x.rank, attrs["shifts"], attrs["axes"])
    return [x]


def _prepare_roll(problem: Problem):
    (x,) = problem.in_types
    shape = _concrete(x, "x")
    shifts, axes = _roll_axes(x.rank, problem.attrs["shifts"], problem.attrs["axes"])
    params = [0] * x.rank
    for shift, axis in zip(shifts, axes):
        params[axis] += shift
    params = [p % n if n else 0 for p, n in zip(params, shape)]
    modes = [WRAP if n else OFFSET for n in shape]
    return _axis_map_launch(shape, shape, modes, params, x.dtype)


def reference_roll(x, shifts, axes):
    return np.roll(_layout.exact(x), tuple(shifts), tuple(axes))


ROLL = _register(OpDef(
    name="roll",
    samples=lambda rng: [Sample((sample_array(rng, 4, 6),), {"shifts": (1,), "axes": (1,)})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("shifts", tuple, check=_layout.ints_check), Attr("axes", tuple, check=_layout.ints_check)),
    infer=_infer_roll,
    reference=lambda inputs, attrs: [reference_roll(inputs[0], attrs["shifts"], attrs["axes"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        reference_roll(out_grads[0], [-s for s in attrs["shifts"]], attrs["axes"])],
    candidates=_candidate("axis_map", _prepare_roll),
    doc="roll(x, shifts, axes): np.roll / torch.roll.",
), backward=_grad_face("roll"))


def _infer_repeat_interleave(in_types, attrs):
    (x,) = in_types
    axis = _layout.normalize_axis(attrs["axis"], x.rank, "axis")
    shape = list(x.shape)
    shape[axis] = dims.product(shape[axis], attrs["repeats"])
    return [TensorType(tuple(shape), x.dtype)]


def _prepare_repeat_interleave(problem: Problem):
    x, y = problem.in_types[0], problem.out_types[0]
    axis = _layout.normalize_axis(problem.attrs["axis"], x.rank, "axis")
    modes, params = [OFFSET] * x.rank, [0] * x.rank
    modes[axis], params[axis] = DIVIDE, problem.attrs["repeats"]
    return _axis_map_launch(_concrete(x, "x"), y.shape, modes, params, x.dtype)


def _reference_repeat_backward(dy, x_shape, repeats, axis):
    dy = np.asarray(dy, np.float64)
    axis %= len(x_shape)
    grouped = dy.reshape(*x_shape[:axis], x_shape[axis], repeats, *x_shape[axis + 1:])
    return grouped.sum(axis=axis + 1)


REPEAT_INTERLEAVE = _register(OpDef(
    name="repeat_interleave",
    samples=lambda rng: [Sample((sample_array(rng, 2, 3),), {"repeats": 2, "axis": 1})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("repeats", int, check=lambda r: None if r >= 1 else "must be >= 1"), Attr("axis", int)),
    infer=_infer_repeat_interleave,
    reference=lambda inputs, attrs: [np.repeat(_layout.exact(inputs[0]), attrs["repeats"], attrs["axis"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        _reference_repeat_backward(out_grads[0], np.shape(inputs[0]), attrs["repeats"], attrs["axis"])],
    candidates=_candidate("axis_map", _prepare_repeat_interleave),
    doc="repeat_interleave(x, repeats, axis): np.repeat with one repeat count (torch.repeat_interleave).",
), backward=_grad_face("repeat_interleave"))


def _infer_tile(in_types, attrs):
    (x,) = in_types
    repeats = _layout.int_tuple(attrs["repeats"], "repeats")
    if len(repeats) != x.rank or min(repeats, default=1) < 0:
        raise ValueError(f"repeats: expected {x.rank} counts >= 0 (one per axis of x), got {repeats}")
    return [TensorType(tuple(dims.product(d, r) for d, r in zip(x.shape, repeats)), x.dtype)]


def _prepare_tile(problem: Problem):
    x, y = problem.in_types[0], problem.out_types[0]
    return _axis_map_launch(_concrete(x, "x"), y.shape, [MODULO] * x.rank, [0] * x.rank, x.dtype)


def _reference_tile_backward(dy, x_shape, repeats):
    dy = np.asarray(dy, np.float64)
    interleaved = dy.reshape(tuple(v for r, n in zip(repeats, x_shape) for v in (r, n)))
    return interleaved.sum(axis=tuple(range(0, 2 * len(x_shape), 2))).reshape(x_shape)


TILE = _register(OpDef(
    name="tile",
    samples=lambda rng: [Sample((sample_array(rng, 2, 3),), {"repeats": (2, 1)})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("repeats", tuple, check=_layout.ints_check, doc="copies per axis"),),
    infer=_infer_tile,
    reference=lambda inputs, attrs: [np.tile(_layout.exact(inputs[0]), attrs["repeats"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        _reference_tile_backward(out_grads[0], np.shape(inputs[0]), attrs["repeats"])],
    candidates=_candidate("axis_map", _prepare_tile),
    doc="tile(x, repeats): np.tile with one count per axis (ONNX Tile).",
), backward=_grad_face("tile"))


# ---------------------------------------------------------------------------------------------------------------
# gather, gather_elements
# ---------------------------------------------------------------------------------------------------------------
def _check_indices(indices: TensorType):
    if indices.dtype not in INDEX_DTYPES:
        raise TypeError(f"indices: expected int32 or int64, got {indices.dtype}")


def _infer_gather(in_types, attrs):
    x, indices = in_types
    _check_indices(indices)
    if x.rank == 0:
        raise ValueError("x: gathering from a 0-d tensor")
    axis = _layout.normalize_axis(attrs["axis"], x.rank, "axis")
    shape = tuple(x.shape[:axis]) + tuple(indices.shape) + tuple(x.shape[axis + 1:])
    _layout.check_rank(len(shape), "y")
    return [TensorType(shape, x.dtype)]


def _wrapped(indices, extent):
    """Negative indices counted from the end; out-of-range ones marked -1."""
    indices = np.asarray(indices).astype(np.int64)
    indices = np.where(indices < 0, indices + extent, indices)
    return np.where((indices >= 0) & (indices < extent), indices, -1)


def reference_gather(x, indices, axis) -> np.ndarray:
    x = _layout.exact(x)
    axis %= x.ndim
    index = _wrapped(indices, x.shape[axis])
    y = np.take(x, np.maximum(index, 0), axis=axis)
    missing = index.reshape((1,) * axis + index.shape + (1,) * (x.ndim - axis - 1)) < 0
    fill = _missing("float32" if x.dtype.kind == "f" else "int64")
    return np.where(missing, fill, y) if missing.any() else y


def _prepare_gather(problem: Problem):
    x, indices = problem.in_types
    axis = _layout.normalize_axis(problem.attrs["axis"], x.rank, "axis")
    shape = _concrete(x, "x")
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    count = int(np.prod(_concrete(indices, "indices"), dtype=np.int64))
    return native_launch(_native_module().gather, in_ptr(0), in_ptr(1), out_ptr(0), [outer, count, inner],
                         [shape[axis] * inner, inner, 1], [0, 1, 0], 1, shape[axis], indices.dtype,
                         itemsize(x.dtype), _fill_bits(_missing(x.dtype), x.dtype), stream_arg())


GATHER = _register(OpDef(
    name="gather",
    samples=lambda rng: [Sample((sample_array(rng, 5, 4), rng.integers(0, 5, (3,))), {"axis": 0})],
    inputs=(Input("x"), Input("indices")),
    outputs=("y",),
    attrs=(Attr("axis", int, 0),),
    infer=_infer_gather,
    reference=lambda inputs, attrs: [reference_gather(inputs[0], inputs[1], attrs["axis"])],
    candidates=_candidate("gather", _prepare_gather),
    doc="gather(x, indices, axis=0): ONNX Gather / np.take (index_select).",
))


def _infer_gather_elements(in_types, attrs):
    x, indices = in_types
    _check_indices(indices)
    if indices.rank != x.rank or x.rank == 0:
        raise ValueError(f"indices: expected rank {x.rank} (x's), got {indices.rank}")
    axis = _layout.normalize_axis(attrs["axis"], x.rank, "axis")
    for a, (n, m) in enumerate(zip(x.shape, indices.shape)):
        if a != axis and isinstance(n, int) and isinstance(m, int) and m > n:
            raise ValueError(f"indices: extent {m} along axis {a} exceeds x's {n}")
    return [TensorType(indices.shape, x.dtype)]


def reference_gather_elements(x, indices, axis) -> np.ndarray:
    x = _layout.exact(x)
    axis %= x.ndim
    indices = np.asarray(indices)
    index = _wrapped(indices, x.shape[axis])
    window = tuple(slice(0, m) if a != axis else slice(None) for a, m in enumerate(indices.shape))
    y = np.take_along_axis(x[window], np.maximum(index, 0), axis=axis)
    fill = _missing("float32" if x.dtype.kind == "f" else "int64")
    return np.where(index < 0, fill, y) if (index < 0).any() else y


def _prepare_gather_elements(problem: Problem):
    x, indices = problem.in_types
    axis = _layout.normalize_axis(problem.attrs["axis"], x.rank, "axis")
    shape = _concrete(x, "x")
    return native_launch(_native_module().gather, in_ptr(0), in_ptr(1), out_ptr(0),
                         list(_concrete(indices, "indices")), list(_layout.contiguous_strides(shape)),
                         list(_layout.contiguous_strides(indices.shape)), axis, shape[axis], indices.dtype,
                         itemsize(x.dtype), _fill_bits(_missing(x.dtype), x.dtype), stream_arg())


GATHER_ELEMENTS = _register(OpDef(
    name="gather_elements",
    samples=lambda rng: [Sample((sample_array(rng, 4, 5), rng.integers(0, 4, (2, 5))), {"axis": 0})],
    inputs=(Input("x"), Input("indices")),
    outputs=("y",),
    attrs=(Attr("axis", int, 0),),
    infer=_infer_gather_elements,
    reference=lambda inputs, attrs: [reference_gather_elements(inputs[0], inputs[1], attrs["axis"])],
    candidates=_candidate("gather", _prepare_gather_elements),
    doc="gather_elements(x, indices, axis=0): ONNX GatherElements / take_along_axis.",
))



def _gather_nd_geometry(x: TensorType, indices: TensorType, batch_dims) -> tuple[int, int]:
    """(b, r): the shared leading axes and the components of one index tuple; ValueError for what GatherND refuses."""
    _check_indices(indices)
    if not isinstance(batch_dims, int) or isinstance(batch_dims, bool) or batch_dims < 0:
        raise ValueError(f"batch_dims: expected an int >= 0, got {batch_dims!r}")
    if x.rank == 0 or indices.rank == 0:
        raise ValueError(f"x, indices: expected rank >= 1, got ranks {x.rank} and {indices.rank}")
    if batch_dims >= min(x.rank, indices.rank):
        raise ValueError(f"batch_dims: expected < {min(x.rank, indices.rank)} (the smaller rank of x and indices), "
                         f"got {batch_dims}")
    components = indices.shape[-1]
    if not isinstance(components, int):
        raise ValueError(f"indices: the last extent (the tuple length) must be static, got {components!r}")
    if not 1 <= components <= x.rank - batch_dims:
        raise ValueError(f"indices: tuples of {components} components for x of rank {x.rank} with batch_dims="
                         f"{batch_dims} (expected 1 to {x.rank - batch_dims})")
    for axis in range(batch_dims):
        if x.shape[axis] != indices.shape[axis]:
            raise ValueError(f"indices: batch axis {axis} has extent {indices.shape[axis]}, x's has {x.shape[axis]}")
    return batch_dims, components


def _infer_gather_nd(in_types, attrs):
    x, indices = in_types
    b, r = _gather_nd_geometry(x, indices, attrs["batch_dims"])
    shape = tuple(x.shape[:b]) + tuple(indices.shape[b:-1]) + tuple(x.shape[b + r:])
    _layout.check_rank(len(shape), "y")
    return [TensorType(shape, x.dtype)]


def reference_gather_nd(x, indices, batch_dims=0) -> np.ndarray:
    x = _layout.exact(x)
    indices = np.asarray(indices)
    b, r = batch_dims, indices.shape[-1]
    batch = x.shape[:b]
    count = int(np.prod(batch, dtype=np.int64))
    x_rows = x.reshape((count,) + x.shape[b:])
    tuples = indices.reshape(count, -1, r)
    wrapped = np.stack([_wrapped(tuples[..., j], x.shape[b + j]) for j in range(r)], axis=-1)
    missing = (wrapped < 0).any(axis=-1)
    rows = np.arange(count)[:, None]
    picked = x_rows[(rows,) + tuple(np.maximum(wrapped[..., j], 0) for j in range(r))]
    if missing.any():
        fill = _missing("float32" if x.dtype.kind == "f" else "int64")
        picked = np.where(missing.reshape(missing.shape + (1,) * (picked.ndim - 2)), fill, picked)
    return picked.reshape(batch + indices.shape[b:-1] + x.shape[b + r:])


def _prepare_gather_nd(problem: Problem):
    x, indices = problem.in_types
    (y,) = problem.out_types
    b, r = _gather_nd_geometry(x, indices, problem.attrs["batch_dims"])
    x_strides = _layout.contiguous_strides(_concrete(x, "x"))
    index_strides = _layout.contiguous_strides(_concrete(indices, "indices"))
    tuple_axes = indices.rank - 1 - b
    rest = x.rank - b - r
    # y's axes: the batch (in x and in indices), the tuples' own axes (indices only), the rest of x (x only)
    y_x_strides = list(x_strides[:b]) + [0] * tuple_axes + list(x_strides[b + r:])
    y_index_strides = list(index_strides[:b]) + list(index_strides[b:b + tuple_axes]) + [0] * rest
    return native_launch(_native_module().gather_nd, in_ptr(0), in_ptr(1), out_ptr(0), list(_concrete(y, "y")),
                         y_x_strides, y_index_strides, list(x.shape[b:b + r]), list(x_strides[b:b + r]),
                         indices.dtype, itemsize(x.dtype), _fill_bits(_missing(x.dtype), x.dtype), stream_arg())


GATHER_ND = _register(OpDef(
    name="gather_nd",
    samples=lambda rng: [Sample((sample_array(rng, 4, 5, 3), rng.integers(-4, 4, (6, 2))), {"batch_dims": 0}),
                         Sample((sample_array(rng, 2, 4, 3), rng.integers(0, 4, (2, 5, 1))), {"batch_dims": 1},
                                "batch_dims=1")],
    inputs=(Input("x"), Input("indices")),
    outputs=("y",),
    attrs=(Attr("batch_dims", int, 0),),
    infer=_infer_gather_nd,
    reference=lambda inputs, attrs: [reference_gather_nd(inputs[0], inputs[1], attrs["batch_dims"])],
    candidates=_candidate("gather_nd", _prepare_gather_nd),
    doc="gather_nd(x, indices, batch_dims=0): ONNX GatherND.",
))

# ---------------------------------------------------------------------------------------------------------------
# cumsum, trilu
# ---------------------------------------------------------------------------------------------------------------
def reference_cumsum(x, axis, exclusive=False, reverse=False) -> np.ndarray:
    x = _layout.exact(x)
    axis %= x.ndim
    data = np.flip(x, axis) if reverse else x
    total = np.cumsum(data, axis=axis)
    if exclusive:
        total = total - data
    return np.flip(total, axis) if reverse else total


def _infer_cumsum(in_types, attrs):
    (x,) = in_types
    if x.rank == 0:
        raise ValueError("x: cumsum of a 0-d tensor")
    _layout.normalize_axis(attrs["axis"], x.rank, "axis")
    if x.dtype not in FLOAT_DTYPES + INDEX_DTYPES:
        raise TypeError(f"x: expected a float, int32 or int64 dtype, got {x.dtype}")
    return [x]


def _prepare_cumsum(problem: Problem):
    (x,) = problem.in_types
    shape = _concrete(x, "x")
    axis = _layout.normalize_axis(problem.attrs["axis"], x.rank, "axis")
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return native_launch(_native_module().cumsum, in_ptr(0), out_ptr(0), outer, shape[axis], inner,
                         problem.attrs["exclusive"], problem.attrs["reverse"], x.dtype, stream_arg())


CUMSUM = _register(OpDef(
    name="cumsum",
    samples=lambda rng: [Sample((sample_array(rng, 4, 6),), {"axis": 1})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("axis", int), Attr("exclusive", bool, False), Attr("reverse", bool, False)),
    infer=_infer_cumsum,
    reference=lambda inputs, attrs: [reference_cumsum(inputs[0], attrs["axis"], attrs["exclusive"],
                                                      attrs["reverse"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        reference_cumsum(out_grads[0], attrs["axis"], attrs["exclusive"], not attrs["reverse"])],
    candidates=_candidate("cumsum", _prepare_cumsum),
    doc="cumsum(x, axis, exclusive=False, reverse=False): ONNX CumSum.",
), backward=_grad_face("cumsum"))


def reference_trilu(x, k=0, upper=True) -> np.ndarray:
    x = _layout.exact(x)
    return np.triu(x, k) if upper else np.tril(x, k)


def _infer_trilu(in_types, attrs):
    (x,) = in_types
    if x.rank < 2:
        raise ValueError(f"x: expected rank >= 2 (the last two axes are the matrix), got rank {x.rank}")
    return [x]


def _prepare_trilu(problem: Problem):
    (x,) = problem.in_types
    shape = _concrete(x, "x")
    batch = int(np.prod(shape[:-2], dtype=np.int64))
    return native_launch(_native_module().trilu, in_ptr(0), out_ptr(0), batch, shape[-2], shape[-1],
                         problem.attrs["k"], problem.attrs["upper"], itemsize(x.dtype), stream_arg())


TRILU = _register(OpDef(
    name="trilu",
    samples=lambda rng: [Sample((sample_array(rng, 4, 6),), {"k": 1})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("k", int, 0, doc="the diagonal: 0 main, > 0 above, < 0 below"), Attr("upper", bool, True)),
    infer=_infer_trilu,
    reference=lambda inputs, attrs: [reference_trilu(inputs[0], attrs["k"], attrs["upper"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        reference_trilu(np.asarray(out_grads[0], np.float64), attrs["k"], attrs["upper"])],
    candidates=_candidate("trilu", _prepare_trilu),
    doc="trilu(x, k=0, upper=True): ONNX Trilu (triu / tril) of the last two axes.",
), backward=_grad_face("trilu"))


# ---------------------------------------------------------------------------------------------------------------
# arange
# ---------------------------------------------------------------------------------------------------------------
def _infer_arange(in_types, attrs):
    (x,) = in_types
    axis = _layout.normalize_axis(attrs["axis"], x.rank, "axis")
    if attrs["dtype"] not in FLOAT_DTYPES + INDEX_DTYPES:
        raise ValueError(f"dtype: expected a float, int32 or int64 dtype, got {attrs['dtype']!r}")
    return [TensorType((x.shape[axis],), attrs["dtype"])]


def reference_arange(x, axis, start, delta, dtype):
    count = np.shape(x)[axis % np.ndim(x)]
    values = start + delta * np.arange(count, dtype=np.float64)
    return values if dtype in FLOAT_DTYPES else values.astype(np.int64)


def _prepare_arange(problem: Problem):
    y = problem.out_types[0]
    return native_launch(_native_module().arange, out_ptr(0), y.shape[0], problem.attrs["start"],
                         problem.attrs["delta"], y.dtype, stream_arg())


ARANGE = _register(OpDef(
    name="arange",
    samples=lambda rng: [Sample((sample_array(rng, 4, 6),), {"axis": 1})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("axis", int, 0, doc="the axis of x whose extent is the count"), Attr("start", float, 0.0),
           Attr("delta", float, 1.0), Attr("dtype", str, "int64")),
    infer=_infer_arange,
    reference=lambda inputs, attrs: [reference_arange(inputs[0], attrs["axis"], attrs["start"], attrs["delta"],
                                                      attrs["dtype"])],
    candidates=_candidate("arange", _prepare_arange),
    doc="arange(x, axis=0, start=0.0, delta=1.0, dtype='int64'): start + delta * i for i < x.shape[axis] "
        "(ONNX Range / torch.arange over a length that may be symbolic).",
))


# ---------------------------------------------------------------------------------------------------------------
# resize, adaptive_avg_pool2d
# ---------------------------------------------------------------------------------------------------------------
def _size_check(value) -> str | None:
    return None if len(value) == 2 and all(_layout.is_int(v) and v >= 1 for v in value) else "must be 2 ints >= 1"


def _scales_check(value) -> str | None:
    return None if len(value) == 2 and all(isinstance(v, (int, float)) and v > 0 for v in value) else \
        "must be 2 numbers > 0"


RESIZE_LAYOUTS = ("NCHW", "NHWC")  # the resized axes: the last two, or the two before the channels (last)


def _resized_axes(rank: int, layout: str) -> tuple[int, int]:
    return (rank - 2, rank - 1) if layout == "NCHW" else (rank - 3, rank - 2)


def _infer_resize(in_types, attrs):
    (x,) = in_types
    least = 2 if attrs["layout"] == "NCHW" else 3
    if x.rank < least:
        raise ValueError(f"x: expected rank >= {least} (layout {attrs['layout']} resizes axes "
                         f"{'-2 and -1' if least == 2 else '-3 and -2'}), got rank {x.rank}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x: expected a float dtype, got {x.dtype}")
    first, second = _resized_axes(x.rank, attrs["layout"])
    _concrete(TensorType((x.shape[first], x.shape[second]), x.dtype), "x (its resized axes)")
    shape = list(x.shape)
    shape[first], shape[second] = attrs["size"]
    return [TensorType(tuple(shape), x.dtype)]


def _resize_scales(in_shape, size, scales):
    return tuple(float(s) for s in scales) if scales is not None else tuple(o / i for o, i in zip(size, in_shape))


def _original(resized, scale, in_length, coordinates):
    """ONNX's x_original; its length_resized is in_length * scale, unrounded."""
    resized = np.asarray(resized, np.float64)
    resized_length = in_length * scale
    if coordinates == "half_pixel":
        return (resized + 0.5) / scale - 0.5
    if coordinates == "pytorch_half_pixel":
        return (resized + 0.5) / scale - 0.5 if resized_length > 1 else np.zeros_like(resized)
    if coordinates == "align_corners":
        return resized * (in_length - 1) / (resized_length - 1) if resized_length != 1 else np.zeros_like(resized)
    return resized / scale


def _nearest(coordinate, mode, length):
    fraction = coordinate - np.floor(coordinate)
    if mode == "round_prefer_floor":
        index = np.where(fraction == 0.5, np.floor(coordinate), np.round(coordinate))
    elif mode == "round_prefer_ceil":
        index = np.where(fraction == 0.5, np.ceil(coordinate), np.round(coordinate))
    elif mode == "floor":
        index = np.floor(coordinate)
    else:
        index = np.ceil(coordinate)
    return np.clip(index, 0, length - 1).astype(np.int64)


def reference_resize(x, size, mode="nearest", coordinates="half_pixel", nearest_mode="round_prefer_floor",
                     scales=None, layout="NCHW") -> np.ndarray:
    """ONNX Resize of the last two axes (NHWC: the two before the last) in float64 (linear: the edge beyond the
    input, as ONNX's reference)."""
    x = _layout.exact(x)
    if layout == "NHWC":
        resized = reference_resize(np.moveaxis(x, -1, -3), size, mode, coordinates, nearest_mode, scales)
        return np.moveaxis(resized, -3, -1)
    in_shape = x.shape[-2:]
    scale = _resize_scales(in_shape, size, scales)
    y = x
    for axis, (n, m, s) in enumerate(zip(in_shape, size, scale)):
        position = _original(np.arange(m), s, n, coordinates)
        axis_index = x.ndim - 2 + axis
        if mode == "nearest":
            y = np.take(y, _nearest(position, nearest_mode, n), axis=axis_index)
            continue
        position = np.clip(position, 0, n - 1)
        low = np.floor(position).astype(np.int64)
        high = np.minimum(low + 1, n - 1)
        weight = (position - low).reshape((-1,) + (1,) * (1 - axis))
        y = np.take(y, low, axis=axis_index) * (1 - weight) + np.take(y, high, axis=axis_index) * weight
    return y


def _prepare_resize(problem: Problem):
    x, y = problem.in_types[0], problem.out_types[0]
    attrs = problem.attrs
    shape = _concrete(x, "x")
    first, second = _resized_axes(len(shape), attrs["layout"])
    planes = int(np.prod(shape[:first], dtype=np.int64))
    channels = 1 if attrs["layout"] == "NCHW" else shape[-1]
    scale_h, scale_w = _resize_scales((shape[first], shape[second]), attrs["size"], attrs["scales"])
    return native_launch(_native_module().resize, in_ptr(0), out_ptr(0), planes, shape[first], shape[second],
                         attrs["size"][0], attrs["size"][1], channels, scale_h, scale_w,
                         COORDINATES.index(attrs["coordinates"]), attrs["mode"] == "linear",
                         NEAREST_MODES.index(attrs["nearest_mode"]), x.dtype, stream_arg())


RESIZE = _register(OpDef(
    name="resize",
    samples=lambda rng: [Sample((sample_array(rng, 1, 2, 3, 4),), {"size": (6, 8), "mode": "linear"})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("size", tuple, check=_size_check, doc="the output extents of the last two axes"),
           Attr("mode", str, "nearest", choices=("nearest", "linear")),
           Attr("coordinates", str, "half_pixel", choices=COORDINATES, doc="ONNX coordinate_transformation_mode"),
           Attr("nearest_mode", str, "round_prefer_floor", choices=NEAREST_MODES),
           Attr("scales", tuple, None, check=_scales_check,
                doc="the scales the coordinates use (ONNX's scales input); default size / input size"),
           Attr("layout", str, "NCHW", choices=RESIZE_LAYOUTS,
                doc="NCHW: the last two axes are resized; NHWC: the two before the last (channels-last)")),
    infer=_infer_resize,
    reference=lambda inputs, attrs: [reference_resize(inputs[0], attrs["size"], attrs["mode"], attrs["coordinates"],
                                                      attrs["nearest_mode"], attrs["scales"], attrs["layout"])],
    candidates=_candidate("resize", _prepare_resize),
    doc="resize(x, size, mode='nearest', coordinates='half_pixel', nearest_mode='round_prefer_floor', scales=None, "
        "layout='NCHW'): ONNX Resize / F.interpolate of the last two axes (NHWC: of the two before the channels).",
))


def reference_adaptive_avg_pool2d(x, output_size) -> np.ndarray:
    x = _layout.exact(x)
    in_h, in_w = x.shape[-2:]
    out_h, out_w = output_size
    y = np.empty(x.shape[:-2] + (out_h, out_w))
    for i in range(out_h):
        rows = slice(i * in_h // out_h, -(-(i + 1) * in_h // out_h))
        for j in range(out_w):
            columns = slice(j * in_w // out_w, -(-(j + 1) * in_w // out_w))
            y[..., i, j] = x[..., rows, columns].mean(axis=(-2, -1))
    return y


def _prepare_adaptive_avg_pool2d(problem: Problem):
    (x,) = problem.in_types
    shape = _concrete(x, "x")
    planes = int(np.prod(shape[:-2], dtype=np.int64))
    out_h, out_w = problem.attrs["output_size"]
    return native_launch(_native_module().adaptive_avg_pool, in_ptr(0), out_ptr(0), planes, shape[-2], shape[-1],
                         out_h, out_w, x.dtype, stream_arg())


def _infer_adaptive_avg_pool2d(in_types, attrs):
    (x,) = in_types
    if x.rank < 2:
        raise ValueError(f"x: expected rank >= 2 (the last two axes are pooled), got rank {x.rank}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x: expected a float dtype, got {x.dtype}")
    in_h, in_w = _concrete(TensorType(x.shape[-2:], x.dtype), "x (its last two axes)")
    if in_h == 0 or in_w == 0:
        raise ValueError(f"x: pooling empty planes {in_h} x {in_w}")
    return [TensorType(tuple(x.shape[:-2]) + tuple(attrs["output_size"]), x.dtype)]


ADAPTIVE_AVG_POOL2D = _register(OpDef(
    name="adaptive_avg_pool2d",
    samples=lambda rng: [Sample((sample_array(rng, 1, 2, 6, 4),), {"output_size": (3, 2)})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("output_size", tuple, check=_size_check),),
    infer=_infer_adaptive_avg_pool2d,
    reference=lambda inputs, attrs: [reference_adaptive_avg_pool2d(inputs[0], attrs["output_size"])],
    candidates=_candidate("adaptive_avg_pool", _prepare_adaptive_avg_pool2d),
    doc="adaptive_avg_pool2d(x, output_size): PyTorch's adaptive average pooling of the last two axes.",
))


# ---------------------------------------------------------------------------------------------------------------
# Grad rules: ordinary ops of the gradient.
# ---------------------------------------------------------------------------------------------------------------
def _expand_grad(g, node, dys):
    from ._grad import sum_to

    return [sum_to(g, dys[0], tuple(node.inputs[0].type.shape))]


def _pad_grad(g, node, dys):
    """constant: the adjoint of padding by p is padding by -p (a crop, or zeros where the pad cropped). reflect and
    edge, one axis at a time (the pad is separable): the centre of dy, plus the border copies added back where they
    came from: the reflected borders flipped onto x[1:b + 1] and x[n - 1 - e:n - 1], the edge borders summed onto
    x[0] and x[n - 1], the wrapped borders onto the far ends they copy."""
    mode, pads = node.attrs["mode"], node.attrs["pads"]
    if mode == "constant":
        return [g.pad(dys[0], pads=tuple(-p for p in pads))]
    x = node.inputs[0].type
    rank = x.rank
    dx = dys[0]
    for axis in range(rank):
        begin, end, extent = pads[axis], pads[rank + axis], x.shape[axis]
        if begin == 0 and end == 0:
            continue
        if (mode == "reflect" and (begin >= extent or end >= extent)) or (mode == "wrap" and max(begin, end) > extent):
            raise ValueError(f"{node.where()}: the gradient of {mode} padding needs pads within the extent "
                             f"({extent} along axis {axis}), got {begin} and {end}")

        def placed(value, before, after, axis=axis):  # value padded with zeros along axis to x's extent
            widths = [0] * (2 * rank)
            widths[axis], widths[rank + axis] = before, after
            return g.pad(value, pads=tuple(widths))

        total = g.slice(dx, starts=(begin,), ends=(begin + extent,), axes=(axis,))
        if mode == "wrap":  # the borders are copies of the far ends: x[n - b:] and x[:e]
            if begin:
                total = g.add(total, placed(g.slice(dx, starts=(0,), ends=(begin,), axes=(axis,)), extent - begin, 0))
            if end:
                border = g.slice(dx, starts=(begin + extent,), ends=(begin + extent + end,), axes=(axis,))
                total = g.add(total, placed(border, 0, extent - end))
        elif mode == "reflect":
            if begin:
                flipped = g.slice(dx, starts=(begin - 1,), ends=(_INT_MIN,), axes=(axis,), steps=(-1,))
                total = g.add(total, placed(flipped, 1, extent - 1 - begin))
            if end:
                flipped = g.slice(dx, starts=(begin + extent + end - 1,), ends=(begin + extent - 1,), axes=(axis,),
                                  steps=(-1,))
                total = g.add(total, placed(flipped, extent - 1 - end, 1))
        else:
            if begin:
                border = g.sum(g.slice(dx, starts=(0,), ends=(begin,), axes=(axis,)), axis=axis, keepdims=True)
                total = g.add(total, placed(border, 0, extent - 1))
            if end:
                border = g.sum(g.slice(dx, starts=(begin + extent,), ends=(begin + extent + end,), axes=(axis,)),
                               axis=axis, keepdims=True)
                total = g.add(total, placed(border, extent - 1, 0))
        dx = total
    return [dx]


_INT_MIN = -2**63  # a slice end that runs backwards through element 0


def _repeat_interleave_grad(g, node, dys):
    x = node.inputs[0].type
    axis = node.attrs["axis"] % x.rank
    grouped = g.reshape(dys[0], shape=(*x.shape[:axis], x.shape[axis], node.attrs["repeats"], *x.shape[axis + 1:]))
    return [g.sum(grouped, axis=axis + 1, keepdims=False)]


def _tile_grad(g, node, dys):
    x = node.inputs[0].type
    repeats = node.attrs["repeats"]
    interleaved = g.reshape(dys[0], shape=tuple(v for r, n in zip(repeats, x.shape) for v in (r, n)))
    summed = g.sum(interleaved, axis=tuple(range(0, 2 * x.rank, 2)), keepdims=False)
    return [g.reshape(summed, shape=tuple(x.shape))]


attach_grad(EXPAND, _expand_grad)
attach_grad(PAD, _pad_grad)
attach_grad(ROLL, lambda g, node, dys: [g.roll(dys[0], shifts=tuple(-s for s in node.attrs["shifts"]),
                                               axes=node.attrs["axes"])])
attach_grad(REPEAT_INTERLEAVE, _repeat_interleave_grad)
attach_grad(TILE, _tile_grad)
attach_grad(CUMSUM, lambda g, node, dys: [g.cumsum(dys[0], axis=node.attrs["axis"], exclusive=node.attrs["exclusive"],
                                                   reverse=not node.attrs["reverse"])])
attach_grad(TRILU, lambda g, node, dys: [g.trilu(dys[0], k=node.attrs["k"], upper=node.attrs["upper"])])
