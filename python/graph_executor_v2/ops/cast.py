"""cast: ``y = x`` converted to another dtype, as NumPy's ``astype`` and C++ conversions do: floats round to nearest
even, floats to integers truncate toward zero, integers wrap, anything to bool is ``x != 0`` (NaN is true).

Mixed precision inserts it between float32 values (masters, reductions, losses) and low-precision GEMMs; imported
models cast masks and indices. The native kernel lives in ``_ops_elementwise`` (``kernels/cast.cu``): float dtypes,
element by element through float32 registers, any alignment; casts from or to other dtypes run on generated kernels
(the scalar rule). Backward: dx = dy cast back to x's dtype (a float x; integer and bool inputs have no gradient).
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import ALL_DTYPES, FLOAT_DTYPES, is_float, to_numpy
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
    with np.errstate(invalid="ignore", over="ignore"):
        y = np.asarray(x).astype(to_numpy(dtype))
    return as_float64(y) if is_float(dtype) else y


def reference_backward(dy, x) -> np.ndarray:
    """dx in float64: dy rounded to x's dtype."""
    return as_float64(np.asarray(dy).astype(np.asarray(x).dtype))


def _check_dtype(dtype, argument):
    if dtype not in ALL_DTYPES:
        raise ValueError(f"{argument}: expected one of {', '.join(ALL_DTYPES)}, got {dtype!r}")


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
    if not all(map(is_float, dtypes)):
        return f"casts between float dtypes, got {dtypes[0]} -> {dtypes[1]}"
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
        reference_backward(out_grads[0], inputs[0]) if np.asarray(inputs[0]).dtype.kind not in "iub" else None],
    candidates=(Candidate("scalar", 10, "float dtypes, element by element through float32, grid-stride", _supports,
                          _prepare, any_alignment=True),),
    scalar=lambda args, attrs, ctype: f"({args[0]})",  # the generated kernel's conversion to the output dtype is it
    doc=__doc__,
))

# Grad rule: dy cast back to x's dtype; integer and bool inputs have none.
attach_grad(OP, lambda g, node, dys: [g.cast(dys[0], dtype=node.inputs[0].type.dtype)
                                      if is_float(node.inputs[0].type.dtype) else None])


def _backward(dy, inputs, attrs, kernel, out, stream):
    """``(dx,)``: dy cast back to x's dtype (None for an integer or bool x)."""
    (x,) = inputs
    x_dtype = _device.view_of(x, "x").dtype
    if not is_float(x_dtype):
        return (None,)
    return (FACE.forward(dy, dtype=x_dtype, kernel=kernel,
                         out=None if out is None else out[0], stream=stream),)


# The face (ops/_face.py): forward / forward_numpy / backward / backward_numpy / kernels / prepare.
FACE = Face(OP, _backward)
globals().update(FACE.functions())
