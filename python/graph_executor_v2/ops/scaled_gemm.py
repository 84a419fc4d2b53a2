"""scaled_gemm: ``Y = act(scale_a * scale_b * op(A) @ op(B) + bias)`` with FP8 A and B on Hopper's FP8 tensor cores
(cuBLASLt), and ``amax = max |Y|`` before an FP8 output's scale.

Why an op of its own and not an FP8 mode of ``gemm``: its inputs differ (per-tensor scales as device scalars, an
output scale), it has a second output (the amax that delayed scaling records), its dtype rules differ (A and B FP8,
the output any of bfloat16, float16, float32, float8_e4m3fn, float8_e5m2, the bias bfloat16 unless the output is
float16) and so do its layout rules; inside ``gemm`` every one of these would be a special case of every check, and
``gemm``'s residual, alpha/beta and saved pre-activation have no FP8 counterpart here.

- ``a``: [m, k] (``trans_a``: [k, m]), ``b``: [n, k] as ``trans_b=True`` (the default: how nn.Linear stores its
  weight) or [k, n] with ``trans_b=False``; float8_e4m3fn or float8_e5m2, not both E5M2.
- ``scale_a``, ``scale_b``: float32 scalars (0-d or one element) multiplying the product: the dequantization
  factors, ``real_a = a * scale_a`` (the reciprocals of the quantization scales; ``torch._scaled_mm``'s convention).
- ``bias``: [n], bfloat16 (float16 with a float16 output), added before ``act`` (none, relu, gelu: cuBLASLt's
  epilogues; gelu is the tanh form).
- ``scale_d``: float32 scalar, required with an FP8 output and refused otherwise: ``Y = FP8(act(...) * scale_d)``,
  rounded to nearest even and saturating as ``cast``.
- Outputs: ``y`` [m, n] of ``out_dtype``, and ``amax``, a 0-d float32: ``max |act(...)|`` before ``scale_d``
  (``with_amax=False``: not computed, when nothing reads it).

The GPU candidate is cuBLASLt's FP8 matmul. It runs only the "TN" layout on Hopper (A row-major [m, k], B
row-major [n, k]), m, n and k multiples of 16, 16-byte aligned buffers, and an E5M2 output only from an E5M2
input; a problem outside those rules is declined
with its reason (a graph then runs it on the host fallback; the FP8 passes arrange the transposes for their own
GEMMs). The amax comes from cuBLASLt (AMAX_D_POINTER) where it computes one, else from a small reduction over Y
(a 16/32-bit output only: an FP8 output's amax precedes its scale and cast).

Numerics. The reference emulates the quantization exactly: FP8 inputs are exact in float64, the sum of products is
accumulated in float64, the epilogue applied, and an FP8 output rounded by ``saturate_to_float8`` from the float32
product with scale_d, as the GPU rounds it. cuBLASLt accumulates in its own order and precision, so the result is
not bit for bit the reference's: an FP8 output is within one FP8 ulp of it (the neighbouring FP8 value when the sum
lands on the other side of a rounding boundary), except where the sum cancels to near zero, there within the
accumulation error ``2^-12 * scale_d * scale_a * scale_b * sum_k |a_ik b_jk|`` (``2^-10`` with fast accumulation;
on the H200 99.3-99.8% of FP8 elements equal the reference); a 16/32-bit output within the same accumulation error
(through the activation's slope) plus half an ulp of its own rounding. tests/test_scaled_gemm.py
checks both on the GPU. FP8 values carry no gradient (see ``quantize_fp8``).
"""
from __future__ import annotations

import numpy as np

from .. import _native
from ..dtypes import FLOAT8_DTYPES, saturate_to_float8, to_numpy
from ..ir.types import TensorType
from . import activations
from ._base import (Attr, Input, OpDef, Problem, Sample, as_float64, in_ptr, native_launch, out_ptr, register,
                    require_inputs, stream_arg, table_candidate)
from ._face import Face
from .quantize_fp8 import check_scale

OUT_DTYPES = ("bfloat16", "float16", "float32") + FLOAT8_DTYPES
ACTIVATIONS = ("none", "relu", "gelu")


def _native_module():
    return _native.load("_ops_scaled_gemm")


def bias_dtype_for(out_dtype: str) -> str:
    """The bias dtype cuBLASLt's FP8 matmul takes with an output of ``out_dtype``."""
    return "float16" if out_dtype == "float16" else "bfloat16"


def reference(a, b, scale_a, scale_b, bias=None, scale_d=None, *, trans_a=False, trans_b=True, act="none",
              out_dtype="bfloat16"):
    """(y, amax) in float64. y is the exact epilogue result for a 16/32-bit output (the caller rounds it) and an
    exactly representable value for an FP8 one; amax is a 0-d array (NaN when a NaN reached the output)."""
    a64, b64 = as_float64(a), as_float64(b)
    product = (a64.T if trans_a else a64) @ (b64.T if trans_b else b64)
    scale = float(np.float32(np.asarray(scale_a).reshape(()))) * float(np.float32(np.asarray(scale_b).reshape(())))
    z = scale * product
    if bias is not None:
        z = z + as_float64(bias)[None, :]
    y = activations.apply(act, z)
    amax = np.asarray(np.abs(y).max() if y.size else 0.0)
    if y.size and np.isnan(y).any():
        amax = np.asarray(float("nan"))
    if out_dtype in FLOAT8_DTYPES:
        scaled = y.astype(np.float32) * np.float32(np.asarray(scale_d).reshape(()))
        y = saturate_to_float8(scaled, out_dtype)
    return y, amax


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes and dtypes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def _infer(in_types, attrs):
    require_inputs(in_types, ("a", "b", "scale_a", "scale_b"))
    a, b, scale_a, scale_b, bias, scale_d = in_types
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in FLOAT8_DTYPES:
            raise TypeError(f"{name}: expected one of {', '.join(FLOAT8_DTYPES)}, got {t.dtype}")
        if t.rank != 2:
            raise ValueError(f"{name}: expected a 2-d array, got shape {t.shape}")
    m, k = (a.shape[1], a.shape[0]) if attrs["trans_a"] else a.shape
    k_b, n = (b.shape[1], b.shape[0]) if attrs["trans_b"] else b.shape
    if isinstance(k, int) and isinstance(k_b, int) and k != k_b:
        raise ValueError(f"b: inner dimension mismatch: op(a) is {m}x{k} but op(b) is {k_b}x{n}")
    check_scale(scale_a, "scale_a")
    check_scale(scale_b, "scale_b")
    out_dtype = attrs["out_dtype"]
    if bias is not None:
        expected = bias_dtype_for(out_dtype)
        if bias.rank != 1 or (isinstance(n, int) and bias.shape[0] != n):
            raise ValueError(f"bias: expected shape ({n},), got {bias.shape}")
        if bias.dtype != expected:
            raise TypeError(f"bias: expected {expected} with a {out_dtype} output (cuBLASLt's FP8 bias types), "
                            f"got {bias.dtype}")
    if out_dtype in FLOAT8_DTYPES:
        if scale_d is None:
            raise ValueError(f"scale_d: an {out_dtype} output needs its scale (a float32 scalar)")
        check_scale(scale_d, "scale_d")
    elif scale_d is not None:
        raise ValueError(f"scale_d: only an FP8 output takes a scale, out_dtype is {out_dtype}")
    return [TensorType((m, n), out_dtype), TensorType((), "float32")]


def _reference(inputs, attrs):
    a, b, scale_a, scale_b, bias, scale_d = inputs
    y, amax = reference(a, b, scale_a, scale_b, bias, scale_d, trans_a=attrs["trans_a"], trans_b=attrs["trans_b"],
                        act=attrs["act"], out_dtype=attrs["out_dtype"])
    return [y, amax]


def _sizes(problem: Problem):
    a, b, _, _, bias, _ = problem.in_types
    m, n = problem.out_types[0].shape
    k = a.shape[0] if problem.attrs["trans_a"] else a.shape[1]
    return m, n, k, a.dtype, b.dtype, "" if bias is None else bias.dtype


def unsupported_reason(problem: Problem) -> str | None:
    """Why cuBLASLt's FP8 matmul cannot run ``problem`` (None when it can)."""
    if not _native.is_built("_ops_scaled_gemm"):
        return "native module _ops_scaled_gemm is not built"
    attrs = problem.attrs
    if attrs["trans_a"] or not attrs["trans_b"]:
        return ("cuBLASLt's FP8 matmul on Hopper runs only the TN layout: a [m, k] (trans_a=False) and b [n, k] "
                f"(trans_b=True), got trans_a={attrs['trans_a']}, trans_b={attrs['trans_b']}; transpose the "
                "operand first")
    m, n, k, a_dtype, b_dtype, bias_dtype = _sizes(problem)
    major, minor = problem.compute_capability
    return _native_module().unsupported_reason(m, n, k, a_dtype, b_dtype, attrs["out_dtype"], bias_dtype,
                                               attrs["act"], major, minor) or None


def _prepare(problem: Problem):
    m, n, k, a_dtype, b_dtype, bias_dtype = _sizes(problem)
    attrs = problem.attrs
    return native_launch(_native_module().forward, in_ptr(0), in_ptr(1), in_ptr(2), in_ptr(3), in_ptr(4), in_ptr(5),
                         out_ptr(0), out_ptr(1) if attrs["with_amax"] else 0, m, n, k, a_dtype, b_dtype,
                         attrs["out_dtype"], bias_dtype, attrs["act"], attrs["fast_accum"], stream_arg())


def _samples(rng):
    # small integers and power-of-two scales: every float32 sum is exact, so each face matches the reference exactly
    fp8 = lambda *shape: rng.integers(-4, 5, shape).astype(to_numpy("float8_e4m3fn"))  # noqa: E731
    half, two = np.array(0.5, np.float32), np.array(2.0, np.float32)
    bias = rng.integers(-3, 4, 32).astype(to_numpy("bfloat16"))
    return [Sample((fp8(16, 32), fp8(16, 32), half, two), {"out_dtype": "float32"}, "E4M3 x E4M3 -> float32"),
            Sample((fp8(16, 48), fp8(32, 48), half, two, bias, np.array(4.0, np.float32)),
                   {"out_dtype": "float8_e4m3fn", "act": "relu"}, "bias, relu and an FP8 output with its scale")]


OP = register(OpDef(
    name="scaled_gemm",
    samples=_samples,
    flops=lambda in_types, out_types, attrs: 2.0 * out_types[0].numel * (
        in_types[0].shape[0] if attrs["trans_a"] else in_types[0].shape[1]),
    inputs=(Input("a"), Input("b"), Input("scale_a"), Input("scale_b"), Input("bias", optional=True),
            Input("scale_d", optional=True)),
    outputs=("y", "amax"),
    attrs=(
        Attr("trans_a", bool, False),
        Attr("trans_b", bool, True, doc="b is [n, k] (nn.Linear's weight layout; cuBLASLt's FP8 layout)"),
        Attr("act", str, "none", choices=ACTIVATIONS),
        Attr("out_dtype", str, "bfloat16", choices=OUT_DTYPES),
        Attr("fast_accum", bool, False, doc="cuBLASLt's FP8 fast accumulation: faster, less accurate"),
        Attr("with_amax", bool, True, doc="False: amax is not computed (nothing reads it; the FP8 passes set it)"),
    ),
    infer=_infer,
    reference=_reference,
    # no reference_backward and no grad rule: FP8 values are not differentiated (see quantize_fp8)
    candidates=(table_candidate("_ops_scaled_gemm", "cublaslt_fp8", unsupported_reason, _prepare),),
    doc=__doc__,
))


def _backward(dy, inputs, attrs, kernel, out, stream):
    """No gradients: FP8 values are not differentiated."""
    return (None,) * len(inputs)


def _no_kernel(problem: Problem):
    raise ValueError(f"scaled_gemm: {unsupported_reason(problem)}")


# The face (ops/_face.py): forward / forward_numpy / backward / backward_numpy / kernels / prepare.
FACE = Face(OP, _backward, no_kernel=_no_kernel)
globals().update(FACE.functions())
