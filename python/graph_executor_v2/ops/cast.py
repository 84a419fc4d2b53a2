"""cast: ``y = x`` converted to another dtype, as NumPy's ``astype`` and C++ conversions do: floats round to nearest
even, floats to integers truncate toward zero, integers wrap, anything to bool is ``x != 0`` (NaN is true).

Mixed precision inserts it between float32 values (masters, reductions, losses) and low-precision GEMMs; imported
models cast masks and indices. The native kernel lives in ``_ops_elementwise`` (``kernels/cast.cu``): float dtypes,
element by element through float32 registers, any alignment; casts from or to other dtypes run on generated kernels
(the scalar rule). Backward: dx = dy cast back to x's dtype (a float x; integer, bool and FP8 inputs have no
gradient).

Casts to FP8 (float8_e4m3fn, float8_e5m2) saturate: a value beyond the format's largest finite one (448 for E4M3,
57344 for E5M2), infinities included, becomes that value with its sign, and NaN stays NaN (cuBLASLt and Transformer
Engine do the same; a plain ``astype`` through ml_dtypes gives NaN or infinity). Casts between the float and FP8
dtypes run on the native kernel, each rounding once (every one of them converts to float32 exactly). A cast to FP8
with a scale, computing the amax in the same pass, is ``quantize_fp8``.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import ALL_DTYPES, FLOAT8_DTYPES, FLOAT_DTYPES, is_float, saturate_to_float8, to_numpy
from ..ir.types import TensorType
from ._base import (Attr, Candidate, Input, OpDef, Problem, Sample, as_float64, attach_grad, in_ptr, native_launch,
                    out_ptr, register, sample_array, stream_arg)
from ._face import Face


def _native_module():
    return _native.load("_ops_elementwise")


def reference(x, dtype: str) -> np.ndarray:
    """x converted to ``dtype``: a float result in float64 (exact: every float dtype converts exactly to float64),
    an integer or bool one as it is."""
    _check_dtype(dtype, "dtype")
    if dtype in FLOAT8_DTYPES:
        return saturate_to_float8(as_float64(x), dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.asarray(x).astype(to_numpy(dtype))
    return as_float64(y) if is_float(dtype) else y


def reference_backward(dy, x) -> np.ndarray:
    """dx in float64: dy rounded to x's dtype."""
    return as_float64(np.asarray(dy).astype(np.asarray(x).dtype))


def _check_dtype(dtype, argument):
    if dtype not in ALL_DTYPES:
        raise ValueError(f"{argument}: expected one of {', '.join(ALL_DTYPES)}, got {dtype!r}")


def _differentiable(dtype: np.dtype) -> bool:
    """A float input (float64 included, as references see them) has a gradient; integers, bool and FP8 none."""
    return dtype.kind not in "iub" and dtype.name not in FLOAT8_DTYPES


# ---------------------------------------------------------------------------------------------------------------
# Op definition
# ---------------------------------------------------------------------------------------------------------------
def _infer(in_types, attrs):
    (x,) = in_types
    if x is None:
        raise ValueError("input 'x' is required")
    _check_dtype(x.dtype, "x")
    return [TensorType(x.shape, attrs["dtype"])]


def _prepare(problem: Problem):
    x, y = problem.in_types[0], problem.out_types[0]
    return native_launch(_native_module().cast, in_ptr(0), x.dtype, out_ptr(0), y.dtype, x.numel, stream_arg())


def _supports(problem: Problem):
    if not _native.is_built("_ops_elementwise"):
        return "native module _ops_elementwise is not built"
    dtypes = (problem.in_types[0].dtype, problem.out_types[0].dtype)
    if not all(dtype in FLOAT_DTYPES + FLOAT8_DTYPES for dtype in dtypes):
        return f"casts between float and FP8 dtypes, got {dtypes[0]} -> {dtypes[1]}"
    return None


OP = register(OpDef(
    name="cast",
    samples=lambda rng: [Sample((sample_array(rng, 4, 6),), {"dtype": "float16"})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("dtype", str, choices=ALL_DTYPES, doc="the output dtype"),),
    infer=_infer,
    reference=lambda inputs, attrs: [reference(inputs[0], attrs["dtype"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [
        reference_backward(out_grads[0], inputs[0]) if _differentiable(np.asarray(inputs[0]).dtype) else None],
    candidates=(Candidate("scalar", 10, "float and FP8 dtypes, element by element through float32, grid-stride",
                          _supports, _prepare, any_alignment=True),),
    scalar=lambda args, attrs, ctype: f"({args[0]})",  # the generated kernel's conversion to the output dtype is it
    doc=__doc__,
))

# Grad rule: dy cast back to x's dtype; integer, bool and FP8 inputs have none.
attach_grad(OP, lambda g, node, dys: [g.cast(dys[0], dtype=node.inputs[0].type.dtype)
                                      if is_float(node.inputs[0].type.dtype) else None])


def _backward(dy, inputs, attrs, kernel, out, stream):
    """``(dx,)``: dy cast back to x's dtype (None for an integer, bool or FP8 x)."""
    (x,) = inputs
    x_dtype = _device.view_of(x, "x").dtype
    if not is_float(x_dtype):
        return (None,)
    return (FACE.forward(dy, dtype=x_dtype, kernel=kernel,
                         out=None if out is None else out[0], stream=stream),)


# The face (ops/_face.py): forward / forward_numpy / backward / backward_numpy / kernels / prepare.
FACE = Face(OP, _backward)
globals().update(FACE.functions())
