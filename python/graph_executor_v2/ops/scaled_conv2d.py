"""scaled_conv2d: ``y = clip(act(scale_x * scale_w * conv(x, w) + bias + residual))`` with FP8 x and w on Hopper's
FP8 tensor cores (cuDNN's graph API), NHWC, and ``amax = max |y|`` before an FP8 output's scale.

The convolution counterpart of ``scaled_gemm`` (an op of its own for the same reasons: device-scalar scales, a
second output, FP8 dtype rules) and what ``ExecutorV2(..., precision="fp8")`` rewrites eligible ``conv2d`` nodes
into (``passes/fp8.py``).

- ``x``: [N, H, W, C], ``w``: [K, R, S, C] (conv2d's NHWC layouts; groups 1), float8_e4m3fn or float8_e5m2.
- ``scale_x``, ``scale_w``: float32 scalars (0-d or one element), the dequantization factors: ``real_x = x *
  scale_x`` (the reciprocals of the quantization scales, as ``scaled_gemm``'s).
- ``bias``: [K], the output's dtype (bfloat16 with an FP8 output); ``residual``: y's shape and dtype, a 16-bit
  output only; both added before ``act`` (none, relu, gelu (tanh form), silu, leaky_relu with ``slope``), then the
  clip to [``clip_min``, ``clip_max``]: conv2d's epilogue, computed in float32.
- ``scale_y``: float32 scalar, required with an FP8 output and refused otherwise: ``y = FP8(... * scale_y)``.
- ``stride``, ``padding``, ``dilation``: as conv2d's.
- Outputs: ``y`` [N, P, Q, K] of ``out_dtype`` (float16, bfloat16, float8_e4m3fn or float8_e5m2) and ``amax``, a 0-d
  float32: ``max |y|`` before ``scale_y``, computed with ``with_amax=True``, which needs an FP8 output (cuDNN's
  AMAX reduction sits before the output scale; a 16-bit output's amax is left to whoever reads y).

The GPU candidate, ``cudnn_graph_fp8`` (in _ops_conv2d, beside conv2d's ``cudnn_graph``, whose graph code it
shares), builds one cuDNN graph: conv_fprop of the FP8 tensors (exact products, float32 accumulation), the
dequantization as two pointwise multiplies, the epilogue's pointwise nodes in float32, an FP8 output's AMAX
reduction and output scale. It needs sm_89+, NHWC, groups 1, C and K multiples of 16 and 16-byte aligned tensors;
whether cuDNN has an engine shows when its plans are built: where a GPU can answer, ``unsupported_reason`` builds
them and declines with cuDNN's reason when it has none (a graph then runs the op on the host fallback, and the FP8
pass keeps that convolution in 16 bits).

Numerics. The reference emulates the quantization exactly: FP8 inputs are exact in float64, the convolution is
summed in float64 and scaled, the epilogue applied, and an FP8 output rounded by ``saturate_to_float8`` from float32.
cuDNN sums in float32 in its own order, so a 16-bit output is within the accumulation error plus its own rounding
(``testing.tolerance``), an FP8 output within one FP8 ulp of the reference or, where the sum cancels, the
accumulation error. FP8 values carry no gradient (see ``quantize_fp8``).
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import FLOAT8_DTYPES, saturate_to_float8, to_numpy
from ..ir.types import TensorType
from . import conv2d
from ._base import (Attr, Input, OpDef, Problem, Sample, as_float64, in_ptr, native_launch, out_ptr, register,
                    require_inputs, stream_arg, table_candidate)
from ._face import Face
from .quantize_fp8 import check_scale
from .scaled_gemm import bias_dtype_for

OUT_DTYPES = ("bfloat16", "float16") + FLOAT8_DTYPES
KERNEL = "cudnn_graph_fp8"
_GEOMETRY_ATTRS = ("stride", "padding", "dilation", "act", "slope", "clip_min", "clip_max")


def _native_module():
    return _native.load("_ops_conv2d")


def reference(x, w, scale_x, scale_w, bias=None, residual=None, scale_y=None, *, stride=1, padding=0, dilation=1,
              act="none", slope=0.01, clip_min=None, clip_max=None, out_dtype="bfloat16"):
    """(y, amax) in float64: y exact for a 16-bit output (the caller rounds it), an exactly representable value for an
    FP8 one; amax a 0-d array (NaN when a NaN reached the output)."""
    real_x = as_float64(x) * float(np.float32(np.asarray(scale_x).reshape(())))
    real_w = as_float64(w) * float(np.float32(np.asarray(scale_w).reshape(())))
    y, _ = conv2d.reference(real_x, real_w, bias, residual, stride=stride, padding=padding, dilation=dilation,
                            layout="NHWC", act=act, slope=slope, clip_min=clip_min, clip_max=clip_max)
    amax = np.asarray(float("nan") if np.isnan(y).any() else (np.abs(y).max() if y.size else 0.0))
    if out_dtype in FLOAT8_DTYPES:
        y = saturate_to_float8(y.astype(np.float32) * np.float32(np.asarray(scale_y).reshape(())), out_dtype)
    return y, amax


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes and dtypes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def geometry_of(in_types, attrs) -> conv2d.ConvGeometry:
    """The convolution's geometry (conv2d's checks of shapes and attributes, NHWC); TypeError/ValueError naming the
    argument otherwise."""
    require_inputs(in_types, ("x", "w", "scale_x", "scale_w"))
    x, w = in_types[0], in_types[1]
    for name, t in (("x", x), ("w", w)):
        if t.dtype not in FLOAT8_DTYPES:
            raise TypeError(f"{name}: expected one of {', '.join(FLOAT8_DTYPES)}, got {t.dtype}")
        if not t.is_concrete:
            raise ValueError(f"{name}: scaled_conv2d needs a concrete shape, got {t.shape}")
    # conv2d's shape checks on float32 stand-ins: the FP8 dtypes are checked above
    return conv2d.check_problem(x.shape, "float32", w.shape, "float32", layout="NHWC",
                                **{name: attrs[name] for name in _GEOMETRY_ATTRS})


def _infer(in_types, attrs):
    geometry = geometry_of(in_types, attrs)
    _, _, scale_x, scale_w, bias, residual, scale_y = in_types
    check_scale(scale_x, "scale_x")
    check_scale(scale_w, "scale_w")
    out_dtype = attrs["out_dtype"]
    fp8_out = out_dtype in FLOAT8_DTYPES
    if bias is not None:
        expected = bias_dtype_for(out_dtype)
        if tuple(bias.shape) != (geometry.k,):
            raise ValueError(f"bias: expected shape ({geometry.k},) (one per output channel), got {bias.shape}")
        if bias.dtype != expected:
            raise TypeError(f"bias: expected {expected} with a {out_dtype} output, got {bias.dtype}")
    if residual is not None:
        if fp8_out:
            raise ValueError(f"residual: only with a 16-bit output, out_dtype is {out_dtype}")
        if tuple(residual.shape) != geometry.out_shape or residual.dtype != out_dtype:
            raise ValueError(f"residual: expected shape {geometry.out_shape} and dtype {out_dtype} (the output's), "
                             f"got {residual.shape} {residual.dtype}")
    if fp8_out:
        if scale_y is None:
            raise ValueError(f"scale_y: an {out_dtype} output needs its scale (a float32 scalar)")
        check_scale(scale_y, "scale_y")
    elif scale_y is not None:
        raise ValueError(f"scale_y: only an FP8 output takes a scale, out_dtype is {out_dtype}")
    if attrs["with_amax"] and not fp8_out:
        raise ValueError(f"with_amax: the amax comes with an FP8 output only (cuDNN reduces it before scale_y), "
                         f"out_dtype is {out_dtype}")
    return [TensorType(geometry.out_shape, out_dtype), TensorType((), "float32")]


def _reference(inputs, attrs):
    return list(reference(*inputs, **{name: attrs[name] for name in _GEOMETRY_ATTRS},
                          out_dtype=attrs["out_dtype"]))


# ---------------------------------------------------------------------------------------------------------------
# The GPU candidate: _ops_conv2d's cudnn_graph_fp8.
# ---------------------------------------------------------------------------------------------------------------
def _native_problem(problem: Problem) -> tuple:
    """(geometry, x_dtype, w_dtype, out_dtype, bias_dtype, has_residual, act, slope, clip_low, clip_high) as the
    native functions take them ('' for no bias)."""
    x, w, _, _, bias, residual, _ = problem.in_types
    attrs = problem.attrs
    geometry = geometry_of(problem.in_types, attrs)
    return (geometry.native, x.dtype, w.dtype, attrs["out_dtype"], "" if bias is None else bias.dtype,
            residual is not None, attrs["act"], float(attrs["slope"]), *conv2d.clip_bounds(attrs))


def unsupported_reason(problem: Problem) -> str | None:
    """Why cudnn_graph_fp8 cannot run ``problem`` (None when it can): its rules, then, where a GPU can answer, cuDNN
    itself (its plans are built: the error when it has no FP8 engine for the problem; the plans are cached for the
    prepare that follows), as conv2d's cudnn_graph asks at ranking time. The FP8 pass asks it per convolution on
    the GPU and keeps those it declines in 16 bits."""
    if not _native.is_built("_ops_conv2d"):
        return "native module _ops_conv2d is not built"
    native = _native_problem(problem)
    geometry, x_dtype, w_dtype, out_dtype, bias_dtype, has_residual, act, _, low, high = native
    major, minor = problem.compute_capability
    reason = _native_module().scaled_unsupported_reason(geometry, x_dtype, w_dtype, out_dtype, bias_dtype,
                                                        has_residual, act, low, high, problem.attrs["with_amax"],
                                                        major, minor)
    if reason or not _device.is_available():
        return reason or None
    try:
        _native_module().scaled_prepare(*native, problem.attrs["with_amax"])
    except RuntimeError as error:
        return str(error)
    return None


def _prepare(problem: Problem):
    native = _native_problem(problem)
    with_amax = problem.attrs["with_amax"]
    _native_module().scaled_prepare(*native, with_amax)  # cached by unsupported_reason's build on a GPU
    return native_launch(_native_module().scaled_forward, in_ptr(0), in_ptr(1), in_ptr(2), in_ptr(3), in_ptr(4),
                         in_ptr(5), in_ptr(6), out_ptr(0), out_ptr(1) if with_amax else 0, native[0], *native[1:5],
                         *native[6:], stream_arg())


def _samples(rng):
    # small integers and power-of-two scales: every float32 sum is exact and every output inside E4M3's range, so each
    # face matches the reference exactly. FP8 outputs with their amax: a 16-bit output computes no amax, and the
    # faces check every output
    fp8 = lambda *shape: rng.integers(-3, 4, shape).astype(to_numpy("float8_e4m3fn"))  # noqa: E731
    half, two, quarter = (np.array(v, np.float32) for v in (0.5, 2.0, 0.25))
    bias = rng.integers(-3, 4, 32).astype(to_numpy("bfloat16"))
    fp8_out = {"out_dtype": "float8_e4m3fn", "with_amax": True}
    return [Sample((fp8(1, 6, 6, 32), fp8(32, 1, 1, 32), half, quarter, None, None, quarter), fp8_out,
                   "1x1 E4M3 -> E4M3 with its scale and amax (cuDNN's FP8 fprop sample's graph)"),
            Sample((fp8(2, 5, 5, 16), fp8(16, 3, 3, 16), half, two, bias[:16], None, quarter),
                   {"padding": 1, "act": "relu", **fp8_out}, "3x3, bias and relu")]


OP = register(OpDef(
    name="scaled_conv2d",
    samples=_samples,
    flops=lambda in_types, out_types, attrs: 2.0 * out_types[0].numel * int(np.prod(in_types[1].shape[1:])),
    inputs=(Input("x"), Input("w"), Input("scale_x"), Input("scale_w"), Input("bias", optional=True),
            Input("residual", optional=True), Input("scale_y", optional=True)),
    outputs=("y", "amax"),
    attrs=tuple(attr for attr in conv2d.ATTRS if attr.name in _GEOMETRY_ATTRS) + (
        Attr("out_dtype", str, "bfloat16", choices=OUT_DTYPES),
        Attr("with_amax", bool, False, doc="True: amax is computed (an FP8 output only)"),
    ),
    infer=_infer,
    reference=_reference,
    # no reference_backward and no grad rule: FP8 values are not differentiated (see quantize_fp8)
    candidates=(table_candidate("_ops_conv2d", KERNEL, unsupported_reason, _prepare),),
    doc=__doc__,
))


def _backward(dy, inputs, attrs, kernel, out, stream):
    """No gradients: FP8 values are not differentiated."""
    return (None,) * len(inputs)


def _no_kernel(problem: Problem):
    raise ValueError(f"scaled_conv2d: {unsupported_reason(problem)}")


# The face (ops/_face.py): forward / forward_numpy / backward / backward_numpy / kernels / prepare.
globals().update(Face(OP, _backward, no_kernel=_no_kernel).functions())
