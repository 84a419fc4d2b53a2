"""2-D pooling: ``max_pool2d``, ``avg_pool2d`` and ``global_avg_pool`` over NCHW or NHWC arrays.

``x`` is 4-d, ``[N, C, H, W]`` (``layout="NCHW"``) or ``[N, H, W, C]`` (``layout="NHWC"``), float32, float16 or
bfloat16 (float32 math inside). Window attributes are an int or an ``(h, w)`` pair, as in PyTorch:
``kernel_size``; ``stride`` (default: the kernel size); ``padding`` (implicit, at most half the window span);
``dilation`` (max pooling only); ``ceil_mode`` (round the output size up; a window must still start inside the
input or its left padding); ``count_include_pad`` (avg pooling: divide by the whole window, padding included, or
only by its part inside the input). The output size along an axis is

    floor_or_ceil((size + 2 * padding - dilation * (kernel - 1) - 1) / stride) + 1

``max_pool2d`` has two outputs: ``y`` and ``indices``, the int32 argmax of every output as the plane index
``ih * W + iw`` (PyTorch's ``return_indices`` convention; -1 for a window with no input element). NaN wins over
numbers; among equal values the first tap in row-major window order wins. The backward takes the indices (a
saved output, so it reads int32 indices of the output's size rather than re-reading x and recomputing every
window) and gathers: no atomics, deterministic. ``avg_pool2d``'s backward gathers ``dy / divisor``;
``global_avg_pool`` (``y`` is ``[N, C, 1, 1]`` or ``[N, 1, 1, C]``) broadcasts ``dy / (H * W)``.

Each op has the face ``ge2.ops.<op>.forward_numpy / forward / backward_numpy / backward / kernels / prepare``
(max_pool2d's backward takes the saved ``indices`` by keyword, else recomputes them); the backward computations are
the graph ops ``<op>_backward`` (inputs ``dy``, the saved indices for max pooling, and ``x`` for its shape).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import FLOAT_DTYPES
from ..ir.types import TensorType
from . import _grad, _layout
from ._base import (Attr, Candidate, Input, OPS, OpDef, Problem, Sample, attach_grad, in_ptr, native_launch, out_ptr,
                    register, require_inputs, sample_array, stream_arg, table_candidate)
from ._face import FACES, Face

LAYOUTS = ("NCHW", "NHWC")


def _native_module():
    return _native.load("_ops_pool2d")


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes, dtypes and attributes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """One windowed pooling problem, everything concrete except batch and channels (which may be symbolic)."""

    batch: object
    channels: object
    height: int
    width: int
    out_height: int
    out_width: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    count_include_pad: bool
    layout: str

    def x_shape(self) -> tuple:
        return self._shape(self.height, self.width)

    def y_shape(self) -> tuple:
        return self._shape(self.out_height, self.out_width)

    def _shape(self, height, width) -> tuple:
        if self.layout == "NCHW":
            return (self.batch, self.channels, height, width)
        return (self.batch, height, width, self.channels)

    def native_sizes(self) -> tuple:
        return (self.batch, self.channels, self.height, self.width, self.out_height, self.out_width)

    def native_window(self) -> tuple:
        return (*self.kernel, *self.stride, *self.padding, *self.dilation)


def pair(value, argument: str, minimum: int) -> tuple[int, int]:
    """An int or an (h, w) pair of ints >= ``minimum`` as a pair; errors name ``argument``."""
    if _layout.is_int(value):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(_layout.is_int(v) for v in value):
        raise TypeError(f"{argument}: expected an int or a pair of ints (h, w), got {value!r}")
    if any(v < minimum for v in value):
        raise ValueError(f"{argument}: expected values >= {minimum}, got {tuple(value)}")
    return int(value[0]), int(value[1])


def _pair_check(value) -> str | None:
    """Attr check: an int or a pair of ints (the value ranges are checked with the input shape)."""
    if _layout.is_int(value) or (isinstance(value, tuple) and len(value) == 2
                                 and all(_layout.is_int(v) for v in value)):
        return None
    return "must be an int or a pair of ints (h, w)"


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'NCHW' or 'NHWC', got {layout!r}")
    return layout


def check_x(shape, dtype: str | None, layout: str) -> tuple:
    """(batch, channels, height, width) of a 4-d x in ``layout`` (dtype None: a float64 reference input)."""
    check_layout(layout)
    shape = tuple(shape)
    if len(shape) != 4:
        raise ValueError(f"x: expected a 4-d array ({layout}), got shape {shape}")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise TypeError(f"x: expected dtype float32, float16 or bfloat16, got {dtype}")
    batch, channels, height, width = shape if layout == "NCHW" else (shape[0], shape[3], shape[1], shape[2])
    return batch, channels, height, width


def output_size(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool, axis: str) -> int:
    """PyTorch's pooling output size along one axis (``axis`` names it in errors)."""
    span = dilation * (kernel - 1) + 1
    if 2 * padding > span:
        raise ValueError(f"padding: expected at most half the window span ({span // 2}) along {axis}, got "
                         f"{padding} (kernel_size {kernel}, dilation {dilation})")
    if size + 2 * padding < span:
        raise ValueError(f"kernel_size: the window span {span} along {axis} is larger than the padded input "
                         f"({size} + 2 * {padding})")
    extent = size + 2 * padding - span
    out = (-(-extent // stride) if ceil_mode else extent // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + padding:  # the last window would start in the right padding
        out -= 1
    return out


def check_window(x_shape, x_dtype, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                 count_include_pad=True, layout="NCHW") -> Window:
    """Validates a windowed pooling problem and returns its Window; errors name the argument."""
    batch, channels, height, width = check_x(x_shape, x_dtype, layout)
    for name, extent in (("height", height), ("width", width)):
        if not isinstance(extent, int):
            raise ValueError(f"x: windowed pooling needs a known {name}, got the symbolic dim {extent!r}")
        if extent < 1:
            raise ValueError(f"x: expected {name} >= 1, got shape {tuple(x_shape)}")
    kernel = pair(kernel_size, "kernel_size", 1)
    strides = kernel if stride is None else pair(stride, "stride", 1)
    pads = pair(padding, "padding", 0)
    dilations = pair(dilation, "dilation", 1)
    if not isinstance(ceil_mode, (bool, np.bool_)):
        raise TypeError(f"ceil_mode: expected a bool, got {type(ceil_mode).__name__}")
    if not isinstance(count_include_pad, (bool, np.bool_)):
        raise TypeError(f"count_include_pad: expected a bool, got {type(count_include_pad).__name__}")
    out_height = output_size(height, kernel[0], strides[0], pads[0], dilations[0], bool(ceil_mode), "height")
    out_width = output_size(width, kernel[1], strides[1], pads[1], dilations[1], bool(ceil_mode), "width")
    if height * width >= 2 ** 31:
        raise ValueError(f"x: height * width must be < 2^31 (int32 argmax indices), got {height} * {width}")
    return Window(batch, channels, height, width, out_height, out_width, kernel, strides, pads, dilations,
                  bool(count_include_pad), layout)


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def _to_nchw(x: np.ndarray, layout: str) -> np.ndarray:
    return x if layout == "NCHW" else x.transpose(0, 3, 1, 2)


def _from_nchw(x: np.ndarray, layout: str) -> np.ndarray:
    return x if layout == "NCHW" else x.transpose(0, 2, 3, 1)


def _taps(window: Window):
    """Per kernel tap: the input rows/cols every output reads (clipped into range) and where they are valid."""
    oh, ow = np.arange(window.out_height), np.arange(window.out_width)
    for kh in range(window.kernel[0]):
        ih = oh * window.stride[0] - window.padding[0] + kh * window.dilation[0]
        for kw in range(window.kernel[1]):
            iw = ow * window.stride[1] - window.padding[1] + kw * window.dilation[1]
            valid = ((ih >= 0) & (ih < window.height))[:, None] & ((iw >= 0) & (iw < window.width))[None, :]
            yield np.clip(ih, 0, window.height - 1), np.clip(iw, 0, window.width - 1), valid


def _avg_divisor(window: Window) -> np.ndarray:
    """[OH, OW] divisors of avg pooling, as PyTorch computes them."""
    def axis(out, kernel, stride, pad, size):
        start = np.arange(out) * stride - pad
        end = np.minimum(start + kernel, size + pad)
        if not window.count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, size)
        return end - start

    return np.outer(axis(window.out_height, window.kernel[0], window.stride[0], window.padding[0], window.height),
                    axis(window.out_width, window.kernel[1], window.stride[1], window.padding[1], window.width))


def reference_max(x, window: Window):
    """(y, indices): y float64, indices int32 in the layout of x."""
    x64 = _to_nchw(np.asarray(x).astype(np.float64), window.layout)
    shape = x64.shape[:2] + (window.out_height, window.out_width)
    best, argmax = np.full(shape, -np.inf), np.full(shape, -1, dtype=np.int64)
    for ih, iw, valid in _taps(window):
        values = x64[:, :, ih[:, None], iw[None, :]]
        better = valid & ((values > best) | (np.isnan(values) & ~np.isnan(best)))
        best = np.where(better, values, best)
        argmax = np.where(better, ih[:, None] * window.width + iw[None, :], argmax)
    return _from_nchw(best, window.layout), _from_nchw(argmax.astype(np.int32), window.layout)


def reference_avg(x, window: Window):
    x64 = _to_nchw(np.asarray(x).astype(np.float64), window.layout)
    total = np.zeros(x64.shape[:2] + (window.out_height, window.out_width))
    for ih, iw, valid in _taps(window):
        total += np.where(valid, x64[:, :, ih[:, None], iw[None, :]], 0.0)
    return _from_nchw(total / _avg_divisor(window), window.layout)


def reference_max_backward(dy, indices, window: Window):
    """dx (float64) from dy and the forward's argmax indices."""
    dy64 = _to_nchw(np.asarray(dy).astype(np.float64), window.layout)
    index = _to_nchw(np.asarray(indices), window.layout)
    batch, channels = dy64.shape[:2]
    dx = np.zeros((batch, channels, window.height * window.width))
    flat_index, flat_dy = index.reshape(batch, channels, -1), dy64.reshape(batch, channels, -1)
    n, c, o = np.nonzero(flat_index >= 0)
    np.add.at(dx, (n, c, flat_index[n, c, o]), flat_dy[n, c, o])
    return _from_nchw(dx.reshape(batch, channels, window.height, window.width), window.layout)


def reference_avg_backward(dy, window: Window):
    dy64 = _to_nchw(np.asarray(dy).astype(np.float64), window.layout) / _avg_divisor(window)
    dx = np.zeros(dy64.shape[:2] + (window.height, window.width))
    for ih, iw, valid in _taps(window):
        rows, cols = np.nonzero(valid)
        np.add.at(dx, (slice(None), slice(None), ih[rows], iw[cols]), dy64[:, :, rows, cols])
    return _from_nchw(dx, window.layout)


def reference_global(x, layout="NCHW"):
    x64 = np.asarray(x).astype(np.float64)
    return x64.mean(axis=(2, 3) if layout == "NCHW" else (1, 2), keepdims=True)


def reference_global_backward(dy, x_shape, layout="NCHW"):
    axes = (2, 3) if layout == "NCHW" else (1, 2)
    spatial = x_shape[axes[0]] * x_shape[axes[1]]
    return np.broadcast_to(np.asarray(dy).astype(np.float64) / spatial, tuple(x_shape)).copy()


# ---------------------------------------------------------------------------------------------------------------
# Faces (ops/_face.py): ge2.ops.max_pool2d, ge2.ops.avg_pool2d, ge2.ops.global_avg_pool, generated from the OpDefs
# below; the backward is the part a definition cannot say.
# ---------------------------------------------------------------------------------------------------------------
def _global_dims(x_shape, layout: str) -> tuple[int, int, int]:
    batch, channels, height, width = x_shape if layout == "NCHW" else (x_shape[0], x_shape[3], x_shape[1],
                                                                       x_shape[2])
    return batch, channels, height * width


def _global_y_shape(x_shape, layout: str) -> tuple:
    batch, channels = (x_shape[0], x_shape[1]) if layout == "NCHW" else (x_shape[0], x_shape[3])
    return (batch, channels, 1, 1) if layout == "NCHW" else (batch, 1, 1, channels)


def _backward(op: str):
    def backward(dy, inputs, attrs, kernel, out, stream, indices=None):
        """(dx,) as an array of dy's kind (or ``out``'s entry); x gives the shape only. max_pool2d reads the
        forward's argmax ``indices`` (recomputed from x when absent)."""
        (x,) = inputs
        vdy, vx = _device.view_of(dy, "dy"), _device.view_of(x, "x")
        y_type = OPS[op].infer([TensorType(tuple(vx.shape), vx.dtype)], attrs)[0]
        _layout.checked_view(dy, "dy", y_type.shape, y_type.dtype, vx.device)
        dx, vdx = _layout.output(None if out is None else out[0], dy, "out", tuple(vx.shape), vx.dtype, vx.device)
        layout, handle = attrs["layout"], _device.stream_handle(stream)
        if op == "global_avg_pool":
            _native_module().global_backward(vdy.ptr, vdx.ptr, *_global_dims(vx.shape, layout), layout, vx.dtype,
                                             handle)
            return (dx,)
        window = window_of(TensorType(tuple(vx.shape), vx.dtype), attrs)
        indices_ptr = 0
        if op == "max_pool2d":
            if indices is None:
                _, indices = FACES[op].forward(x, **attrs, kernel=kernel, stream=stream)
            indices_ptr = _layout.checked_view(indices, "indices", window.y_shape(), "int32", vx.device).ptr
        _native_module().backward("max" if op == "max_pool2d" else "avg", vdy.ptr, indices_ptr, vdx.ptr,
                                  window.native_sizes(), window.native_window(), window.count_include_pad, layout,
                                  vx.dtype, handle)
        return (dx,)

    return backward


# ---------------------------------------------------------------------------------------------------------------
# Op definitions: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
OPS_DOC = {
    "max_pool2d": "max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, layout='NCHW') "
                  "-> (y, indices)",
    "avg_pool2d": "avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, "
                  "layout='NCHW') -> y",
    "global_avg_pool": "global_avg_pool(x, layout='NCHW') -> y: the mean over H x W, keeping 4 dims",
}


def _window_attrs(max_pool: bool) -> tuple[Attr, ...]:
    attrs = [
        Attr("kernel_size", (int, tuple), check=_pair_check, doc="window size: an int or (h, w)"),
        Attr("stride", (int, tuple), None, check=_pair_check, doc="an int or (h, w); default: kernel_size"),
        Attr("padding", (int, tuple), 0, check=_pair_check, doc="implicit padding, at most half the window span"),
    ]
    if max_pool:
        attrs.append(Attr("dilation", (int, tuple), 1, check=_pair_check, doc="distance between window taps"))
    attrs.append(Attr("ceil_mode", bool, False, doc="round the output size up"))
    if not max_pool:
        attrs.append(Attr("count_include_pad", bool, True, doc="divide by the whole window, padding included"))
    attrs.append(Attr("layout", str, "NCHW", choices=LAYOUTS, doc="NCHW or NHWC"))
    return tuple(attrs)


def window_of(x_type: TensorType, attrs: dict) -> Window:
    """The Window of a node's x and attributes (max or avg pooling)."""
    return check_window(x_type.shape, x_type.dtype, attrs["kernel_size"], attrs["stride"], attrs["padding"],
                        attrs.get("dilation", 1), attrs["ceil_mode"], attrs.get("count_include_pad", True),
                        attrs["layout"])


def _infer_max(in_types, attrs):
    require_inputs(in_types, ("x",))
    window = window_of(in_types[0], attrs)
    return [TensorType(window.y_shape(), in_types[0].dtype), TensorType(window.y_shape(), "int32")]


def _infer_avg(in_types, attrs):
    require_inputs(in_types, ("x",))
    window = window_of(in_types[0], attrs)
    return [TensorType(window.y_shape(), in_types[0].dtype)]


def _infer_global(in_types, attrs):
    require_inputs(in_types, ("x",))
    (x,) = in_types
    check_x(x.shape, x.dtype, attrs["layout"])
    return [TensorType(_global_y_shape(x.shape, attrs["layout"]), x.dtype)]


def _check_dy_type(dy: TensorType, expected: TensorType) -> None:
    if dy != expected:
        raise ValueError(f"dy: expected {expected} (the type of y), got {dy}")


def _infer_max_backward(in_types, attrs):
    require_inputs(in_types, ("dy", "indices", "x"))
    dy, indices, x = in_types
    y_type, index_type = _infer_max([x], attrs)
    _check_dy_type(dy, y_type)
    if indices != index_type:
        raise ValueError(f"indices: expected {index_type} (the forward's indices), got {indices}")
    return [x]


def _infer_avg_backward(in_types, attrs):
    require_inputs(in_types, ("dy", "x"))
    dy, x = in_types
    _check_dy_type(dy, _infer_avg([x], attrs)[0])
    return [x]


def _infer_global_backward(in_types, attrs):
    require_inputs(in_types, ("dy", "x"))
    dy, x = in_types
    _check_dy_type(dy, _infer_global([x], attrs)[0])
    return [x]


def _window_launch(mode: str, backward: bool):
    """prepare(problem) for the windowed kernels: one native call per launch."""
    def prepare(problem: Problem):
        x_type = problem.in_types[-1] if backward else problem.in_types[0]
        window = window_of(x_type, problem.attrs)
        native = _native_module()
        sizes, taps, include_pad, layout = (window.native_sizes(), window.native_window(), window.count_include_pad,
                                            window.layout)
        dtype, is_max = x_type.dtype, mode == "max"
        if not backward:
            return native_launch(native.forward, mode, in_ptr(0), out_ptr(0), out_ptr(1) if is_max else 0, sizes,
                                 taps, include_pad, layout, dtype, stream_arg())
        return native_launch(native.backward, mode, in_ptr(0), in_ptr(1) if is_max else 0, out_ptr(0), sizes, taps,
                             include_pad, layout, dtype, stream_arg())

    return prepare


def _global_launch(backward: bool):
    def prepare(problem: Problem):
        x_type = problem.in_types[-1] if backward else problem.in_types[0]
        layout = problem.attrs["layout"]
        dims, dtype = _global_dims(x_type.shape, layout), x_type.dtype
        native_call = _native_module().global_backward if backward else _native_module().global_forward
        return native_launch(native_call, in_ptr(0), out_ptr(0), *dims, layout, dtype, stream_arg())

    return prepare


def _supported(problem: Problem):
    return None if _native.is_built("_ops_pool2d") else "native module _ops_pool2d is not built"


def _candidate(name: str, prepare) -> tuple[Candidate, ...]:
    return (table_candidate("_ops_pool2d", name, _supported, prepare),)


def _host_window(x, attrs) -> Window:
    """The Window of a reference input (any float dtype, float64 included)."""
    return check_window(np.shape(x), None, attrs["kernel_size"], attrs["stride"], attrs["padding"],
                        attrs.get("dilation", 1), attrs["ceil_mode"], attrs.get("count_include_pad", True),
                        attrs["layout"])


def _reference_max(inputs, attrs):
    return list(reference_max(inputs[0], _host_window(inputs[0], attrs)))


def _reference_max_backward(inputs, outputs, out_grads, attrs):
    window = _host_window(inputs[0], attrs)
    _, indices = reference_max(inputs[0], window)
    return [reference_max_backward(out_grads[0], indices, window)]


def _reference_avg(inputs, attrs):
    return [reference_avg(inputs[0], _host_window(inputs[0], attrs))]


def _reference_avg_backward(inputs, outputs, out_grads, attrs):
    return [reference_avg_backward(out_grads[0], _host_window(inputs[0], attrs))]


MAX_OP = register(OpDef(
    samples=lambda rng: [Sample((sample_array(rng, 2, 3, 5, 4),), {"kernel_size": 2, "stride": 1})],
    name="max_pool2d", inputs=(Input("x"),), outputs=("y", "indices"), attrs=_window_attrs(True), infer=_infer_max,
    reference=_reference_max, reference_backward=_reference_max_backward,
    candidates=_candidate("window", _window_launch("max", False)), doc=OPS_DOC["max_pool2d"]))

MAX_BACKWARD_OP = _grad.register_backward(OpDef(
    name="max_pool2d_backward", inputs=(Input("dy"), Input("indices"), Input("x")), outputs=("dx",),
    attrs=MAX_OP.attrs, infer=_infer_max_backward,
    reference=lambda inputs, attrs: [reference_max_backward(inputs[0], inputs[1], _host_window(inputs[2], attrs))],
    candidates=_candidate("window", _window_launch("max", True)),
    doc="max_pool2d_backward(dy, indices, x) -> dx (x gives the shape only)"))

AVG_OP = register(OpDef(
    samples=lambda rng: [Sample((sample_array(rng, 2, 3, 5, 4),), {"kernel_size": 2, "stride": 1})],
    name="avg_pool2d", inputs=(Input("x"),), outputs=("y",), attrs=_window_attrs(False), infer=_infer_avg,
    reference=_reference_avg, reference_backward=_reference_avg_backward,
    candidates=_candidate("window", _window_launch("avg", False)), doc=OPS_DOC["avg_pool2d"]))

AVG_BACKWARD_OP = _grad.register_backward(OpDef(
    name="avg_pool2d_backward", inputs=(Input("dy"), Input("x")), outputs=("dx",), attrs=AVG_OP.attrs,
    infer=_infer_avg_backward,
    reference=lambda inputs, attrs: [reference_avg_backward(inputs[0], _host_window(inputs[1], attrs))],
    candidates=_candidate("window", _window_launch("avg", True)),
    doc="avg_pool2d_backward(dy, x) -> dx (x gives the shape only)"))

_GLOBAL_ATTRS = (Attr("layout", str, "NCHW", choices=LAYOUTS, doc="NCHW or NHWC"),)

GLOBAL_OP = register(OpDef(
    samples=lambda rng: [Sample((sample_array(rng, 2, 3, 2, 5),))],
    name="global_avg_pool", inputs=(Input("x"),), outputs=("y",), attrs=_GLOBAL_ATTRS, infer=_infer_global,
    reference=lambda inputs, attrs: [reference_global(inputs[0], attrs["layout"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        reference_global_backward(out_grads[0], np.shape(inputs[0]), attrs["layout"])],
    candidates=_candidate("global", _global_launch(False)),
    doc=OPS_DOC["global_avg_pool"]))

GLOBAL_BACKWARD_OP = _grad.register_backward(OpDef(
    name="global_avg_pool_backward", inputs=(Input("dy"), Input("x")), outputs=("dx",), attrs=_GLOBAL_ATTRS,
    infer=_infer_global_backward,
    reference=lambda inputs, attrs: [reference_global_backward(inputs[0], np.shape(inputs[1]), attrs["layout"])],
    candidates=_candidate("global", _global_launch(True)),
    doc="global_avg_pool_backward(dy, x) -> dx (x gives the shape only)"))


# ---------------------------------------------------------------------------------------------------------------
# Grad rules: the backward ops above, fed with the saved indices (max) and x (for its shape).
# ---------------------------------------------------------------------------------------------------------------
def _grad_max(g, node, out_grads):
    dy = out_grads[0]
    if dy is None:
        return [None]
    return [g.max_pool2d_backward(dy, node.outputs[1], node.inputs[0], **node.attrs)]


def _grad_avg(g, node, out_grads):
    return [None if out_grads[0] is None else g.avg_pool2d_backward(out_grads[0], node.inputs[0], **node.attrs)]


def _grad_global(g, node, out_grads):
    return [None if out_grads[0] is None else g.global_avg_pool_backward(out_grads[0], node.inputs[0],
                                                                         **node.attrs)]


attach_grad(MAX_OP, _grad_max)
attach_grad(AVG_OP, _grad_avg)
attach_grad(GLOBAL_OP, _grad_global)

# The faces, ``ge2.ops.<op>.forward / forward_numpy / backward / backward_numpy / kernels / prepare``: max_pool2d's
# forward returns (y, indices), and its backward takes dy (the gradient of y) and the saved indices by keyword.
for _op in (MAX_OP, AVG_OP, GLOBAL_OP):
    Face(_op, _backward(_op.name), saved=("indices",) if _op is MAX_OP else ())
