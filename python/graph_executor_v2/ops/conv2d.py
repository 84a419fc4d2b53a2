"""conv2d: ``y = act(conv(x, w) + bias + residual)`` with stride, padding, dilation and groups, NCHW or NHWC.

Layouts (the ``layout`` attribute names both the activations' and the weights' layout):
- ``NCHW``: x ``[N, C, H, W]``, w ``[K, C/groups, R, S]`` (PyTorch's), y ``[N, K, P, Q]``;
- ``NHWC``: x ``[N, H, W, C]``, w ``[K, R, S, C/groups]``, y ``[N, P, Q, K]``.
``stride`` and ``dilation`` are an int or (h, w); ``padding`` an int, (h, w) (symmetric) or (top, bottom, left,
right). ``groups`` divides C and K (groups == C == K is depthwise). ``bias`` ``[K]``, ``residual`` (y's shape and dtype,
added before the activation: a ResNet block's skip connection), ``act`` (none, relu, gelu (tanh form), silu, sigmoid,
leaky_relu with ``slope``) and a clip of the result to [``clip_min``, ``clip_max``] (either None for no bound: relu6 is
``clip_min=0, clip_max=6``; NaN passes) are fused into the epilogue, computed in float32 and rounded to y's dtype once.
float32/float16/bfloat16 with float32 accumulation; TF32 only with ``allow_tf32``. Output size: ``P = (H + pad_top +
pad_bottom - dilation_h * (R - 1) - 1) // stride_h + 1`` (Q likewise).

Kernel candidates (``kernels()``), best first:
1. ``cudnn_graph``: cuDNN's graph API through the cuDNN frontend (conv_fprop with bias, residual and activation fused as
   pointwise nodes with float32 intermediates, conv_dgrad, conv_wgrad; dbias by GE2's reduction): up to 10 plans from
   heuristics mode A's engines then cuDNN's fallback list (PyTorch's cudnn.benchmark sources and limit), built once per
   problem by ``prepare`` or the first call, timed on the first call (the fastest kept). Strict float32 leaves out TF32
   engines (FFT and Winograd ones compute in float32 and stay, as with PyTorch's TF32 off). Built when CMake finds cuDNN and the frontend headers (the nvidia-cudnn-frontend package or
   GE2_CUDNN_FRONTEND_DIR; ``has_cudnn_graph()``); the epilogue fused into the graph in float16/bfloat16 NHWC with
   each group's C and K multiples of 8 (cuDNN's runtime-fusion engines; groups 1 or a ResNeXt-style grouped
   convolution); elsewhere the graph writes the convolution in float32 (16-bit: to a scratch buffer; float32: y
   itself) and GE2's epilogue kernel finishes y, rounded once, except a grouped 16-bit one (depthwise included), for
   which cuDNN has no engine writing float32 (declined up front: searching its fallback list took seconds a
   problem); backward act none. Where cuDNN has no engine for a problem, preparing it raises and ``auto`` takes the
   next candidate.
2. ``cutlass_sm90``: CUTLASS 3.x's sm90 implicit GEMM for Hopper (sm_90a): x loaded by TMA in im2col mode, w by
   tiled TMA, a multi-stage shared-memory pipeline feeding wgmma with float32 accumulation, and the whole epilogue
   (bias, residual, activation, clip) fused through an epilogue visitor tree, y rounded once; backward with act none
   and stride 1 (CUTLASS's dgrad and wgrad kernels, wgrad's long N*P*Q reduction in slices through a float32
   workspace where its output tiles are too few for the GPU, dbias by GE2's reduction). NHWC, float16/bfloat16,
   groups 1, C and K multiples of 8, padding <= 128, (R-1)*dilation < 255, stride <= 8 (TMA's im2col limits);
   every tensor 16-byte aligned. NOT BUILT (its ``kernels()`` row says why) without CUTLASS's headers (the
   ``cutlass`` extra or ``GE2_CUTLASS_DIR``, with CUTLASS's tools/util/include beside include/).
3. ``implicit_gemm``: GE2's own implicit GEMM on tensor cores (no im2col buffer): x gathered on the fly by 16-byte
   cp.async, a 4-stage shared-memory pipeline, ldmatrix + mma.sync m16n8k16, float32 accumulation, bias, residual and
   activation fused into the epilogue. Forward only, NHWC, float16/bfloat16, groups 1, C % 8 == 0 (x and w 16-byte
   aligned). Backward runs on ``cudnn_graph``, ``cutlass_sm90``, ``cudnn`` or ``im2col_gemm``.
4. ``depthwise``: GE2's direct depthwise convolution (groups == C == K), forward only, any layout and float dtype: a
   channel's R x S taps accumulated in float32 and the fused epilogue applied before y is rounded once. 16-bit NHWC
   with C a multiple of 8 and a 3x3 or 5x5 filter at stride 1 or 2: output tiles whose input window (halo included,
   64 channels) is staged in shared memory, a thread computing strips of 4 outputs of a channel pair from registers;
   other 16-bit NHWC with C a multiple of 8: a thread per 8 channels of a pixel (16-byte loads); else a thread per
   output. The 16-bit depthwise convolutions with an epilogue (EfficientNet's, MobileNet's) have no cuDNN
   runtime-fusion engine and must not round before the epilogue, so only im2col_gemm ran them before (21.4 of
   EfficientNet-B0's 22.7 ms on the H200).
5. ``cudnn``: cuDNN's legacy C API (cudnnConvolutionForward / BackwardData / BackwardFilter; dbias by GE2's
   reduction), the algorithm cudnnFind* times fastest, cached per problem. Built when CMake finds cuDNN (the
   nvidia-cudnn-cu13 package or the CUDA toolkit; ``has_cudnn()``); a forward epilogue only in float32 (one in-place
   kernel over y: float32 is the epilogue's own precision, so nothing is rounded twice); backward act none;
   symmetric padding.
6. ``im2col_gemm``: im2col into a per-stream workspace, one batched cuBLASLt GEMM (a batch entry per group) and one
   fused bias/residual/activation kernel; backward dX by GEMM + a col2im gather, dW by GEMM, dbias by a reduction. Every
   attribute combination: the path that always works.
``auto`` times the ones that apply (and, for the cuDNN ones, have an engine or algorithm for the problem) and keeps
the fastest.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import FLOAT_DTYPES
from ..ir.types import TensorType
from . import _grad, _layout, activations
from ._base import (Attr, Input, OpDef, Problem, Sample, as_float64, attach_grad, in_ptr, native_launch, out_ptr,
                    register, require_inputs, sample_array, stream_arg, table_candidate)
from ._face import Face, choose_launch

CONV_ACTIVATIONS = ("none", "relu", "gelu", "silu", "sigmoid", "leaky_relu")
LAYOUTS = ("NCHW", "NHWC")


def _native_module():
    return _native.load("_ops_conv2d")


# ---------------------------------------------------------------------------------------------------------------
# Attributes and shapes: validation needs no GPU.
# ---------------------------------------------------------------------------------------------------------------
def _pair(value, argument: str, minimum: int) -> tuple[int, int]:
    values = (value, value) if _layout.is_int(value) else _layout.int_tuple(value, argument)
    if len(values) != 2:
        raise ValueError(f"{argument}: expected an int or 2 ints (height, width), got {value!r}")
    if min(values) < minimum:
        raise ValueError(f"{argument}: every entry must be >= {minimum}, got {value!r}")
    return values


def _padding(value) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) from an int, (h, w) or (top, bottom, left, right)."""
    values = (value,) if _layout.is_int(value) else _layout.int_tuple(value, "padding")
    if len(values) not in (1, 2, 4):
        raise ValueError(f"padding: expected an int, 2 ints (h, w) or 4 ints (top, bottom, left, right), "
                         f"got {value!r}")
    if min(values) < 0:
        raise ValueError(f"padding: every entry must be >= 0, got {value!r}")
    if len(values) == 1:
        return values * 4
    if len(values) == 2:
        return values[0], values[0], values[1], values[1]
    return values


@dataclass(frozen=True)
class ConvGeometry:
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    p: int
    q: int
    stride: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]
    groups: int
    layout: str
    dtype: str

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.k, self.p, self.q) if self.layout == "NCHW" else (self.n, self.p, self.q, self.k)

    @property
    def native(self) -> list[int]:
        """What _ops_conv2d takes: N, C, H, W, K, R, S, P, Q, strides, top/left padding, dilations, groups."""
        return [self.n, self.c, self.h, self.w, self.k, self.r, self.s, self.p, self.q, *self.stride,
                self.padding[0], self.padding[2], *self.dilation, self.groups]

    @property
    def reduction_length(self) -> int:
        return self.c // self.groups * self.r * self.s


def check_problem(x_shape, x_dtype, w_shape, w_dtype, bias_shape=None, bias_dtype=None, *, stride=1, padding=0,
                  dilation=1, groups=1, layout="NCHW", act="none", slope=0.01, clip_min=None, clip_max=None,
                  residual_shape=None, residual_dtype=None) -> ConvGeometry:
    """Validates a conv2d problem; raises ValueError/TypeError naming the argument, the expectation and the value."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected NCHW or NHWC, got {layout!r}")
    if act not in CONV_ACTIVATIONS:
        raise ValueError(f"act: expected one of {', '.join(CONV_ACTIVATIONS)}, got {act!r}")
    if isinstance(slope, bool) or not isinstance(slope, (int, float, np.floating, np.integer)):
        raise TypeError(f"slope: expected a float, got {type(slope).__name__}")
    if clip_min is not None and clip_max is not None and clip_min > clip_max:
        raise ValueError(f"clip_min: must be <= clip_max ({clip_max}), got {clip_min}")
    stride = _pair(stride, "stride", 1)
    dilation = _pair(dilation, "dilation", 1)
    padding = _padding(padding)
    if not _layout.is_int(groups):
        raise TypeError(f"groups: expected an int, got {type(groups).__name__} ({groups!r})")
    if groups < 1:
        raise ValueError(f"groups: must be >= 1, got {groups}")
    if len(x_shape) != 4:
        raise ValueError(f"x: expected a 4-d {layout} array, got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        expected = "[K, C/groups, R, S]" if layout == "NCHW" else "[K, R, S, C/groups]"
        raise ValueError(f"w: expected a 4-d array {expected}, got shape {tuple(w_shape)}")
    if x_dtype not in FLOAT_DTYPES:
        raise TypeError(f"x: expected dtype float32, float16 or bfloat16, got {x_dtype}")
    if w_dtype != x_dtype:
        raise TypeError(f"w: expected dtype {x_dtype} (the dtype of x), got {w_dtype}")
    n, c, h, w = x_shape if layout == "NCHW" else (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    k, cg, r, s = w_shape if layout == "NCHW" else (w_shape[0], w_shape[3], w_shape[1], w_shape[2])
    if min(n, c, h, w) < 1:
        raise ValueError(f"x: every dimension must be >= 1, got shape {tuple(x_shape)}")
    if min(k, cg, r, s) < 1:
        raise ValueError(f"w: every dimension must be >= 1, got shape {tuple(w_shape)}")
    if c % groups != 0 or k % groups != 0:
        raise ValueError(f"groups: must divide the input channels C={c} and the output channels K={k}, got {groups}")
    if cg != c // groups:
        raise ValueError(f"w: expected C/groups = {c // groups} input channels per filter (C={c}, groups={groups}), "
                         f"got {cg} in shape {tuple(w_shape)}")
    extent_h, extent_w = dilation[0] * (r - 1) + 1, dilation[1] * (s - 1) + 1
    padded_h, padded_w = h + padding[0] + padding[1], w + padding[2] + padding[3]
    if extent_h > padded_h or extent_w > padded_w:
        raise ValueError(f"w: the (dilated) kernel {extent_h}x{extent_w} is larger than the padded input "
                         f"{padded_h}x{padded_w} (input {h}x{w}, padding {padding}, dilation {dilation})")
    p = (padded_h - extent_h) // stride[0] + 1
    q = (padded_w - extent_w) // stride[1] + 1
    if bias_shape is not None:
        if tuple(bias_shape) != (k,):
            raise ValueError(f"bias: expected shape ({k},) (one per output channel), got {tuple(bias_shape)}")
        if bias_dtype != x_dtype:
            raise TypeError(f"bias: expected dtype {x_dtype}, got {bias_dtype}")
    geometry = ConvGeometry(int(n), int(c), int(h), int(w), int(k), int(r), int(s), int(p), int(q), stride, padding,
                            dilation, int(groups), layout, x_dtype)
    if residual_shape is not None:
        if tuple(residual_shape) != geometry.out_shape:
            raise ValueError(f"residual: expected the output's shape {geometry.out_shape} ({layout}), "
                             f"got {tuple(residual_shape)}")
        if residual_dtype != x_dtype:
            raise TypeError(f"residual: expected dtype {x_dtype}, got {residual_dtype}")
    return geometry


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend. Works in NCHW with [K, C/g, R, S] weights.
# ---------------------------------------------------------------------------------------------------------------
def _to_nchw(x, w, layout):
    if layout == "NHWC":
        return x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2)
    return x, w


def _taps(geometry: ConvGeometry):
    """(r, s, rows, cols): the padded-input window each filter tap reads, as strided slices."""
    (sh, sw), (dh, dw) = geometry.stride, geometry.dilation
    for r in range(geometry.r):
        rows = slice(r * dh, r * dh + sh * (geometry.p - 1) + 1, sh)
        for s in range(geometry.s):
            yield r, s, rows, slice(s * dw, s * dw + sw * (geometry.q - 1) + 1, sw)


def _clip(y, clip_min, clip_max):
    """y clipped to [clip_min, clip_max] (None: no bound), NaN passing through."""
    if clip_min is not None:
        y = np.where(y < clip_min, clip_min, y)
    if clip_max is not None:
        y = np.where(y > clip_max, clip_max, y)
    return y


def _clip_derivative(y, clip_min, clip_max):
    """1 where the clip passes y (bounds included, as the pointwise clip's gradient), else 0."""
    inside = np.ones(y.shape)
    if clip_min is not None:
        inside *= y >= clip_min
    if clip_max is not None:
        inside *= y <= clip_max
    return inside


def reference(x, w, bias=None, residual=None, *, stride=1, padding=0, dilation=1, groups=1, layout="NCHW",
              act="none", slope=0.01, clip_min=None, clip_max=None):
    """Returns (y, z) in float64, z being the pre-activation (residual included), both in ``layout``."""
    geometry = check_problem(x.shape, "float32", w.shape, "float32", stride=stride, padding=padding,
                             dilation=dilation, groups=groups, layout=layout, act=act, slope=slope,
                             clip_min=clip_min, clip_max=clip_max)
    x64, w64 = _to_nchw(as_float64(x), as_float64(w), layout)
    top, bottom, left, right = geometry.padding
    g, n = geometry.groups, geometry.n
    padded = np.pad(x64, ((0, 0), (0, 0), (top, bottom), (left, right)))
    padded = padded.reshape(n, g, geometry.c // g, *padded.shape[2:])
    filters = w64.reshape(g, geometry.k // g, geometry.c // g, geometry.r, geometry.s)
    z = np.zeros((n, g, geometry.k // g, geometry.p, geometry.q))
    for r, s, rows, cols in _taps(geometry):
        z += np.einsum("ngcpq,gkc->ngkpq", padded[:, :, :, rows, cols], filters[:, :, :, r, s])
    z = z.reshape(n, geometry.k, geometry.p, geometry.q)
    if bias is not None:
        z = z + as_float64(bias)[None, :, None, None]
    if layout == "NHWC":
        z = z.transpose(0, 2, 3, 1)
    if residual is not None:
        z = z + as_float64(residual)
    return _clip(activations.apply(act, z, slope), clip_min, clip_max), z


def reference_backward(dy, x, w, bias=None, residual=None, *, stride=1, padding=0, dilation=1, groups=1,
                       layout="NCHW", act="none", slope=0.01, clip_min=None, clip_max=None):
    """Returns (dx, dw, dbias, dresidual) in float64 (dbias, dresidual None without a bias, a residual)."""
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout, act=act,
                 slope=slope, clip_min=clip_min, clip_max=clip_max)
    _, z = reference(x, w, bias, residual, **attrs)
    geometry = check_problem(x.shape, "float32", w.shape, "float32", **attrs)
    clip_mask = _clip_derivative(activations.apply(act, z, slope), clip_min, clip_max)
    dz = as_float64(dy) * clip_mask * activations.derivative(act, z, slope)
    dresidual = None if residual is None else dz
    x64, w64 = _to_nchw(as_float64(x), as_float64(w), layout)
    if layout == "NHWC":
        dz = dz.transpose(0, 3, 1, 2)
    top, bottom, left, right = geometry.padding
    g, n, cg, kg = geometry.groups, geometry.n, geometry.c // geometry.groups, geometry.k // geometry.groups
    padded = np.pad(x64, ((0, 0), (0, 0), (top, bottom), (left, right))).reshape(n, g, cg, *np.add(
        x64.shape[2:], (top + bottom, left + right)))
    filters = w64.reshape(g, kg, cg, geometry.r, geometry.s)
    dz_groups = dz.reshape(n, g, kg, geometry.p, geometry.q)
    d_padded = np.zeros_like(padded)
    d_filters = np.zeros_like(filters)
    for r, s, rows, cols in _taps(geometry):
        d_filters[:, :, :, r, s] = np.einsum("ngcpq,ngkpq->gkc", padded[:, :, :, rows, cols], dz_groups)
        d_padded[:, :, :, rows, cols] += np.einsum("ngkpq,gkc->ngcpq", dz_groups, filters[:, :, :, r, s])
    d_padded = d_padded.reshape(n, geometry.c, *d_padded.shape[3:])
    dx = d_padded[:, :, top:top + geometry.h, left:left + geometry.w]
    dw = d_filters.reshape(w64.shape)
    if layout == "NHWC":
        dx, dw = dx.transpose(0, 2, 3, 1), dw.transpose(0, 2, 3, 1)
    return dx, dw, (None if bias is None else dz.sum(axis=(0, 2, 3))), dresidual


# ---------------------------------------------------------------------------------------------------------------
# Python face: generated from the OpDef (ops/_face.py); the backward below is the part a definition cannot say.
# ---------------------------------------------------------------------------------------------------------------
def _check_dy(dy_shape, dy_dtype, geometry: ConvGeometry):
    if tuple(dy_shape) != geometry.out_shape:
        raise ValueError(f"dy: expected shape {geometry.out_shape} (the output of the convolution), "
                         f"got {tuple(dy_shape)}")
    if dy_dtype != geometry.dtype:
        raise TypeError(f"dy: expected dtype {geometry.dtype}, got {dy_dtype}")


def _native_problem_args(geometry: ConvGeometry, attrs) -> tuple:
    """(geometry, layout, dtype, act, slope, allow_tf32) as the native forward and backward take them."""
    return (geometry.native, attrs["layout"], geometry.dtype, attrs["act"], float(attrs["slope"]),
            bool(attrs["allow_tf32"]))


def clip_bounds(attrs) -> tuple[float, float]:
    """(low, high) of the forward's clip as the native forward takes them: an absent bound is infinite."""
    low, high = attrs["clip_min"], attrs["clip_max"]
    return (-np.inf if low is None else float(low)), (np.inf if high is None else float(high))


def _refuse_residual_and_clip(inputs, attrs, **options):
    """A fused residual or clip is a graph's business: conv2d's grad rule splits them off (dresidual = dy * act'(z),
    the clip's gradient first)."""
    if conv_inputs(inputs)[3] is not None:
        raise ValueError("residual: conv2d.backward takes no fused residual (differentiate the graph instead: its "
                         "grad rule gives dresidual = dy * act'(z)); got an array")
    _refuse_clip(attrs, "conv2d.backward")


def _refuse_clip(attrs, what):
    for name in ("clip_min", "clip_max"):
        if attrs[name] is not None:
            raise ValueError(f"{name}: {what} takes no fused clip (conv2d's grad rule applies the clip's gradient "
                             f"first); got {attrs[name]}")


def _backward(dy, inputs, attrs, kernel, out, stream):
    """(dx, dw, dbias, None) as device arrays of x's kind, or ``out``'s entries (dbias None without a bias), on
    conv2d_backward's candidate named ``kernel`` or the selector's choice for these arrays. With an activation the
    pre-activation is recomputed (one forward GEMM)."""
    _refuse_residual_and_clip(inputs, attrs)
    x, w, bias, _ = conv_inputs(inputs)
    views = _layout.input_views({name: a for name, a in (("dy", dy), ("x", x), ("w", w), ("bias", bias))
                                 if a is not None})
    vdy, vx, vw, vbias = views["dy"], views["x"], views["w"], views.get("bias")
    geometry = check_problem(vx.shape, vx.dtype, vw.shape, vw.dtype, None if vbias is None else vbias.shape,
                             None if vbias is None else vbias.dtype, **_op_attrs(attrs))
    _check_dy(vdy.shape, vdy.dtype, geometry)
    shapes = (tuple(vx.shape), tuple(vw.shape), (geometry.k,))
    grads, grad_views = [], []
    for index, (shape, wanted) in enumerate(zip(shapes, (True, True, bias is not None))):
        if not wanted:
            grads.append(None)
            grad_views.append(None)
            continue
        name = f"out[{index}]"
        array, view = _layout.output(None if out is None else out[index], x, name, shape, geometry.dtype, vx.device)
        for input_name, input_view in views.items():
            if input_view is not None:
                _layout.check_no_overlap(view, name, input_view, input_name)
        grads.append(array)
        grad_views.append(view)
    in_views = (vdy, vx, vw, vbias)
    problem = Problem(BACKWARD_OP.name, tuple(None if view is None else TensorType(view.shape, view.dtype)
                                              for view in in_views),
                      tuple(TensorType(shape, geometry.dtype) for shape in shapes), attrs,
                      _device.compute_capability(vx.device))
    present = [view for view in (*in_views, *grad_views) if view is not None]
    _, launch = choose_launch(BACKWARD_OP, problem, kernel, not any(view.ptr % 16 for view in present))
    ptr = lambda view: 0 if view is None else view.ptr  # noqa: E731
    launch([ptr(view) for view in in_views], [ptr(view) for view in grad_views], _device.stream_handle(stream))
    return (*grads, None)


def has_cudnn() -> bool:
    """Whether this build of _ops_conv2d has the cuDNN candidate."""
    return bool(_native_module().has_cudnn)


def has_cudnn_graph() -> bool:
    """Whether this build of _ops_conv2d has the cuDNN graph-API candidate (cuDNN and the cuDNN frontend headers)."""
    return bool(_native_module().has_cudnn_graph)


def unsupported_reason(kernel: str, geometry: ConvGeometry, act: str, has_bias: bool, backward: bool = False, *,
                       has_residual: bool = False, clip: tuple[float, float] = (-np.inf, np.inf)):
    """None when ``kernel`` can run the problem, else the reason it cannot. ``clip``: the forward's (low, high)
    bounds, infinite when absent (a clip is part of the epilogue, as the bias and the activation)."""
    reason = _native_module().unsupported_reason(kernel, geometry.native, geometry.layout, geometry.dtype, act,
                                                 has_bias, has_residual, backward, *clip)
    return reason or None


def cutlass_sm90_pointwise_tile(geometry: ConvGeometry, act: str, sms: int, residual: bool = False) -> str:
    """The 1x1 GEMM tile cutlass_sm90's forward runs the problem (with a ``residual`` or not) in on a GPU of ``sms``
    SMs (the H200 has 132), as GE2_CUTLASS_SM90_CONV_1X1 names it (that setting wins when set), or "conv" for its conv
    collective (a problem that is not a 1x1 at stride 1 without padding with act none, relu or leaky_relu). Needs no
    GPU."""
    if isinstance(sms, bool) or not isinstance(sms, int) or sms < 1:
        raise ValueError(f"sms: expected a positive number of SMs, got {sms!r}")
    if not isinstance(residual, bool):
        raise TypeError(f"residual: expected a bool, got {type(residual).__name__}")
    return _native_module().cutlass_sm90_pointwise_tile(geometry.native, geometry.layout, geometry.dtype, act, sms,
                                                        residual)


# ---------------------------------------------------------------------------------------------------------------
# Op definitions: conv2d and conv2d_backward (what the IR, passes, registry and CPU backend read).
# ---------------------------------------------------------------------------------------------------------------
def conv_inputs(values) -> tuple:
    """conv2d's (x, w, bias, residual) from its inputs as given (a node's or a call's), absent optional ones None."""
    return tuple((list(values) + [None, None])[:4])


def _op_attrs(attrs) -> dict:
    return {name: attrs[name] for name in ("stride", "padding", "dilation", "groups", "layout", "act", "slope",
                                           "clip_min", "clip_max")}


def _types_geometry(x, w, bias, attrs, residual=None) -> ConvGeometry:
    require_inputs((x, w), ("x", "w"))
    for name, t in (("x", x), ("w", w)):
        if not t.is_concrete:
            raise ValueError(f"{name}: conv2d needs a concrete shape, got {t.shape}")
    return check_problem(x.shape, x.dtype, w.shape, w.dtype, None if bias is None else bias.shape,
                         None if bias is None else bias.dtype, **_op_attrs(attrs),
                         residual_shape=None if residual is None else residual.shape,
                         residual_dtype=None if residual is None else residual.dtype)


def _infer(in_types, attrs):
    """y's type; a symbolic batch (axis 0 of x and of the residual, the same name) passes through, everything else
    checked as at batch 1: the other axes must be concrete (a plan binds the batch and infers again)."""
    x, w, bias, residual = conv_inputs(in_types)
    batch = x.shape[0] if x is not None and x.rank >= 1 and isinstance(x.shape[0], str) else None
    if batch is not None:
        if residual is not None and residual.shape[:1] != (batch,):
            raise ValueError(f"residual: expected the batch {batch!r} of x on axis 0, got shape {residual.shape}")
        x = TensorType((1, *x.shape[1:]), x.dtype)
        residual = None if residual is None else TensorType((1, *residual.shape[1:]), residual.dtype)
    geometry = _types_geometry(x, w, bias, attrs, residual)
    shape = geometry.out_shape
    return [TensorType(shape if batch is None else (batch, *shape[1:]), geometry.dtype)]


def _reference(inputs, attrs):
    x, w, bias, residual = conv_inputs(inputs)
    return [reference(x, w, bias, residual, **_op_attrs(attrs))[0]]


def _reference_backward(inputs, outputs, out_grads, attrs):
    x, w, bias, residual = conv_inputs(inputs)
    return list(reference_backward(out_grads[0], x, w, bias, residual, **_op_attrs(attrs)))


def _attr_check(name, parse):
    """Attr.check from a parser whose errors name the attribute: the reason without the name, or None."""

    def check(value):
        try:
            parse(value)
        except (TypeError, ValueError) as error:
            return str(error).removeprefix(f"{name}: ")
        return None

    return check


ATTRS = (
    Attr("stride", (int, tuple), 1, check=_attr_check("stride", lambda v: _pair(v, "stride", 1)),
         doc="int or (h, w)"),
    Attr("padding", (int, tuple), 0, check=_attr_check("padding", _padding),
         doc="int, (h, w) or (top, bottom, left, right)"),
    Attr("dilation", (int, tuple), 1, check=_attr_check("dilation", lambda v: _pair(v, "dilation", 1)),
         doc="int or (h, w)"),
    Attr("groups", int, 1, check=lambda g: None if g >= 1 else "must be >= 1"),
    Attr("layout", str, "NCHW", choices=LAYOUTS),
    Attr("act", str, "none", choices=CONV_ACTIVATIONS),
    Attr("slope", float, 0.01, doc="leaky_relu negative slope"),
    Attr("clip_min", float, None, doc="lower bound of the clip after the activation; None for none"),
    Attr("clip_max", float, None, doc="upper bound of the clip after the activation; None for none"),
    Attr("allow_tf32", bool, False),
)


def _prepare_native(kernel, geometry: ConvGeometry, attrs, has_bias: bool, has_residual: bool,
                    backward: bool) -> None:
    """Builds what ``kernel`` needs ahead of its first launch (cudnn_graph: its cuDNN plans); RuntimeError when
    cuDNN has no engine for the problem, so that the registry takes the next candidate."""
    geometry_list, layout, dtype, act, slope, allow_tf32 = _native_problem_args(geometry, attrs)
    _native_module().prepare(kernel, geometry_list, layout, dtype, act, slope, allow_tf32, *clip_bounds(attrs),
                             has_bias, has_residual, backward)


def _engine_reason(kernel, geometry: ConvGeometry, attrs, has_bias: bool, has_residual: bool,
                   backward: bool) -> str | None:
    """cudnn_graph asks cuDNN itself at ranking time, where a GPU is there to ask: the reason when neither its
    heuristics nor its fallback list has an engine for the problem (a 16-bit grouped or depthwise convolution
    writing float32, for one), so that ``auto`` ranks the next candidate instead of counting a failed prepare as a
    fallback. The plans built here are cached, and the prepare that follows reuses them."""
    if kernel != "cudnn_graph" or not _device.is_available():
        return None
    try:
        _prepare_native(kernel, geometry, attrs, has_bias, has_residual, backward)
    except RuntimeError as error:
        return str(error)
    return None


def _forward_candidate(name):
    def supports(problem: Problem):
        x, w, bias, residual = conv_inputs(problem.in_types)
        geometry = _types_geometry(x, w, bias, problem.attrs, residual)
        return unsupported_reason(name, geometry, problem.attrs["act"], bias is not None,
                                  has_residual=residual is not None, clip=clip_bounds(problem.attrs)) or \
            _engine_reason(name, geometry, problem.attrs, bias is not None, residual is not None, backward=False)

    def prepare(problem: Problem):
        x, w, bias, residual = conv_inputs(problem.in_types)
        geometry = _types_geometry(x, w, bias, problem.attrs, residual)
        problem_args = _native_problem_args(geometry, problem.attrs)
        _prepare_native(name, geometry, problem.attrs, bias is not None, residual is not None, backward=False)
        return native_launch(_native_module().forward, in_ptr(0), in_ptr(1), in_ptr(2), in_ptr(3), out_ptr(0),
                             *problem_args, *clip_bounds(problem.attrs), name, stream_arg())

    return table_candidate("_ops_conv2d", name, supports, prepare)


def _conv_flops(in_types, out_types, attrs) -> float:
    """2 * N * K * P * Q * (C / groups) * R * S: one multiply-add per filter tap of every output."""
    g = _types_geometry(*in_types[:3], attrs)
    return 2.0 * g.n * g.k * g.p * g.q * (g.c // g.groups) * g.r * g.s


OP = register(OpDef(
    name="conv2d",
    # (a fused residual or clip is no sample: the backward face refuses them, the grad rule splits them off)
    samples=lambda rng: [Sample((sample_array(rng, 2, 2, 4, 5), sample_array(rng, 3, 2, 3, 3), sample_array(rng, 3)),
                                {"padding": 1})],
    flops=_conv_flops,
    inputs=(Input("x"), Input("w"), Input("bias", optional=True), Input("residual", optional=True)),
    outputs=("y",),
    attrs=ATTRS,
    infer=_infer,
    reference=_reference,
    reference_backward=_reference_backward,
    candidates=(_forward_candidate("cudnn_graph"),
                _forward_candidate("cutlass_sm90"),
                _forward_candidate("implicit_gemm"),
                _forward_candidate("depthwise"),
                _forward_candidate("cudnn"),
                _forward_candidate("im2col_gemm")),
    doc=__doc__,
))


# conv2d_backward: inputs (dy, x, w, bias?) -> (dx, dw, dbias); dbias is computed even without a bias input (the
# sum of dz over N, P, Q), and the grad rule drops it then.
def _infer_backward(in_types, attrs):
    dy, x, w, bias = in_types
    _refuse_clip(attrs, "conv2d_backward")
    geometry = _types_geometry(x, w, bias, attrs)
    if dy is None:
        raise ValueError("input 'dy' is required")
    _check_dy(dy.shape, dy.dtype, geometry)
    return [TensorType(x.shape, x.dtype), TensorType(w.shape, w.dtype), TensorType((geometry.k,), x.dtype)]


def _reference_of_backward(inputs, attrs):
    dy, x, w, bias = inputs
    dx, dw, _, _ = reference_backward(dy, x, w, bias, **_op_attrs(attrs))
    dz = as_float64(dy) * activations.derivative(attrs["act"], reference(x, w, bias, **_op_attrs(attrs))[1],
                                                 attrs["slope"])
    return [dx, dw, dz.sum(axis=(0, 2, 3) if attrs["layout"] == "NCHW" else (0, 1, 2))]


def _backward_candidate(name):
    def supports(problem: Problem):
        _, x, w, bias = problem.in_types
        geometry = _types_geometry(x, w, bias, problem.attrs)
        return unsupported_reason(name, geometry, problem.attrs["act"], bias is not None, backward=True) or \
            _engine_reason(name, geometry, problem.attrs, bias is not None, False, backward=True)

    def prepare(problem: Problem):
        _, x, w, bias = problem.in_types
        geometry = _types_geometry(x, w, bias, problem.attrs)
        problem_args = _native_problem_args(geometry, problem.attrs)
        _prepare_native(name, geometry, problem.attrs, bias is not None, False, backward=True)
        dbias = out_ptr(2) if problem.attrs.get("with_dbias", True) else 0  # 0: not computed
        return native_launch(_native_module().backward, in_ptr(0), in_ptr(1), in_ptr(2), in_ptr(3), out_ptr(0),
                             out_ptr(1), dbias, *problem_args, name, stream_arg())

    return table_candidate("_ops_conv2d", name, supports, prepare)


BACKWARD_OP = _grad.register_backward(OpDef(
    name="conv2d_backward",
    flops=lambda in_types, out_types, attrs: 2.0 * _conv_flops(in_types[1:4], out_types, attrs),  # dx and dw
    inputs=(Input("dy"), Input("x"), Input("w"), Input("bias", optional=True)),
    outputs=("dx", "dw", "dbias"),
    # with_dbias False (the grad rule's, for a conv without a bias): dbias, which nothing reads, is not computed
    # (its reduction over N, P, Q cost ResNet-18's training step 1.9 of 15.7 ms on the H200)
    attrs=ATTRS + (Attr("with_dbias", bool, True, doc="False: dbias is not computed (nothing reads it)"),),
    infer=_infer_backward,
    reference=_reference_of_backward,
    candidates=(_backward_candidate("cudnn_graph"),
                _backward_candidate("cutlass_sm90"),
                _backward_candidate("cudnn"),
                _backward_candidate("im2col_gemm")),
    doc="Gradients of conv2d: dx, dw and dbias (the sum of dz over N, P, Q; with_dbias=False leaves it out).",
))


def _activation_backward(g, act, dy, z, slope):
    if act == "leaky_relu":
        return g.leaky_relu_backward(dy, z, alpha=slope)
    if act == "sigmoid":  # dy * s * (1 - s) = dy * s - (dy * s) * s, s = sigmoid(z)
        s = g.sigmoid(z)
        scaled = g.mul(dy, s)
        return g.sub(scaled, g.mul(scaled, s))
    return getattr(g, f"{act}_backward")(dy, z)  # relu, gelu (tanh form), silu: the elementwise ops' own


def _grad(g, node, out_grads):
    x, w, bias, residual = conv_inputs(node.inputs)
    dy = out_grads[0]
    attrs = {**node.attrs, "clip_min": None, "clip_max": None}
    low, high = node.attrs["clip_min"], node.attrs["clip_max"]
    if low is not None or high is not None:  # the clip's gradient first, at its input act(z), recomputed
        dy = g.clip_backward(dy, g.conv2d(x, w, bias, residual, **attrs), min=low, max=high)
    if residual is None:
        dx, dw, dbias = g.conv2d_backward(dy, x, w, bias, **attrs, with_dbias=bias is not None)
        return [dx, dw, None if bias is None else dbias, None]
    # A fused residual: dresidual = dz = dy * act'(z), z (conv + bias + residual) recomputed without the activation;
    # the convolution's gradients then take dz with no activation.
    act = attrs["act"]
    dz = dy if act == "none" else _activation_backward(
        g, act, dy, g.conv2d(x, w, bias, residual, **{**attrs, "act": "none"}), attrs["slope"])
    dx, dw, dbias = g.conv2d_backward(dz, x, w, bias, **{**attrs, "act": "none"}, with_dbias=bias is not None)
    return [dx, dw, None if bias is None else dbias, dz]


attach_grad(OP, _grad)

# The face, ``ge2.ops.conv2d.forward / forward_numpy / backward / backward_numpy / kernels / prepare``.
globals().update(Face(OP, _backward, backward_host_check=_refuse_residual_and_clip).functions())
