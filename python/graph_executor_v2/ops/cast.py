"""cast: ``y = x`` converted to another float dtype (float32, float16, bfloat16; round to nearest even).

Mixed precision inserts it between float32 values (masters, reductions, losses) and low-precision GEMMs. The native
kernel lives in ``_ops_elementwise`` (``kernels/cast.cu``): element by element through float32 registers, any
alignment. Backward: dx = dy cast back to x's dtype.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import FLOAT_DTYPES, to_numpy
from ..ir.types import TensorType
from ._base import (Attr, Candidate, Input, OpDef, Problem, as_float64, attach_grad, in_ptr, native_launch, out_ptr,
                    register, stream_arg)
from ._face import Face


def _native_module():
    return _native.load("_ops_elementwise")


def reference(x, dtype: str) -> np.ndarray:
    """x rounded to ``dtype``, returned in float64 (exact: every float dtype converts exactly to float64)."""
    _check_dtype(dtype, "dtype")
    return as_float64(np.asarray(x).astype(to_numpy(dtype)))


def reference_backward(dy, x) -> np.ndarray:
    """dx in float64: dy rounded to x's dtype."""
    return as_float64(np.asarray(dy).astype(np.asarray(x).dtype))


def _check_dtype(dtype, argument):
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{argument}: expected one of {', '.join(FLOAT_DTYPES)}, got {dtype!r}")


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
    return None if _native.is_built("_ops_elementwise") else "native module _ops_elementwise is not built"


OP = register(OpDef(
    name="cast",
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(Attr("dtype", str, choices=FLOAT_DTYPES, doc="the output dtype"),),
    infer=_infer,
    reference=lambda inputs, attrs: [reference(inputs[0], attrs["dtype"])],
    reference_backward=lambda inputs, outputs, out_grads, attrs: [reference_backward(out_grads[0], inputs[0])],
    candidates=(Candidate("scalar", 10, "element by element through float32, grid-stride", _supports, _prepare,
                          always_works=True),),
    doc=__doc__,
))

# Grad rule: dy cast back to x's dtype.
attach_grad(OP, lambda g, node, dys: [g.cast(dys[0], dtype=node.inputs[0].type.dtype)])


def _backward(dy, inputs, attrs, kernel, out, stream):
    """``(dx,)``: dy cast back to x's dtype."""
    (x,) = inputs
    return (FACE.forward(dy, dtype=_device.view_of(x, "x").dtype, kernel=kernel,
                         out=None if out is None else out[0], stream=stream),)


# The face (ops/_face.py): forward / forward_numpy / backward / backward_numpy / kernels / prepare.
FACE = Face(OP, _backward)
globals().update(FACE.functions())
