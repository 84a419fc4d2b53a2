"""swiglu: ``y = silu(a) * b = a * sigmoid(a) * b``, elementwise, built out of tree against GE2.

SwiGLU takes its two halves as two inputs, ``a`` (the gate) and ``b`` (the up projection), of one shape and dtype
(float32, float16, bfloat16; float32 math in the kernels, float64 in the reference): in a transformer MLP they are
the outputs of two matmuls, ``swiglu(x @ w_gate, x @ w_up)``. A model that computes one fused projection of width
2H passes its halves as two slices. Gradients: ``db = dy * silu(a)``, ``da = dy * b * s * (1 + a * (1 - s))`` with
``s = sigmoid(a)``.

Face (GE2's convention): ``forward_numpy(a, b, kernel="auto")``, ``forward(a, b, kernel="auto", out=None,
stream=None)``, ``backward_numpy(dy, a, b, kernel="auto")`` and ``backward(dy, a, b, kernel="auto", out=None,
stream=None)`` -> ``(da, db)``, ``kernels()``.

Kernel candidates, registered with GE2's registry (marked external in ``explain()``), best first:
1. ``vec16``: 16-byte loads and stores (element count a multiple of 4 for float32, 8 for 16-bit types).
2. ``scalar``: element by element, any size: the path that always works.
With ``ExecutorV2(..., autotune=True)`` both are timed once per problem and the faster one runs.
"""
from __future__ import annotations

import numpy as np

from graph_executor_v2 import _native
from graph_executor_v2 import device as _device
from graph_executor_v2.dtypes import FLOAT_DTYPES
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import (Candidate, Input, OpDef, Problem, _layout, in_ptr, native_launch, out_ptr, register,
                                   stream_arg)
from graph_executor_v2.ops._base import as_float64

INPUTS = ("a", "b")
KERNELS = ("auto", "vec16", "scalar")


def _native_module():
    return _native.load("_ops_swiglu", "ge2_swiglu")


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def _sigmoid(a: np.ndarray) -> np.ndarray:
    # exp of -|a| only: no overflow, and full relative precision for large negative a (where s ~ exp(a)).
    e = np.exp(-np.abs(a))
    return np.where(a >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def reference(a, b) -> np.ndarray:
    a, b = as_float64(a), as_float64(b)
    return a * _sigmoid(a) * b


def reference_backward(dy, a, b) -> tuple[np.ndarray, np.ndarray]:
    """(da, db), float64."""
    dy, a, b = as_float64(dy), as_float64(a), as_float64(b)
    s = _sigmoid(a)
    return dy * b * s * (1.0 + a * (1.0 - s)), dy * a * s


# ---------------------------------------------------------------------------------------------------------------
# Validation: runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def _check_kernel(kernel) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {', '.join(KERNELS)}, got {kernel!r}")


# ---------------------------------------------------------------------------------------------------------------
# Python face
# ---------------------------------------------------------------------------------------------------------------
def forward_numpy(a, b, kernel="auto") -> np.ndarray:
    """Host arrays in, host array out. Runs on the GPU."""
    _layout.same_host_arrays((("a", a), ("b", b)))
    _check_kernel(kernel)
    _device.require_gpu("swiglu.forward_numpy")
    return forward(_layout.to_device(a), _layout.to_device(b), kernel=kernel).numpy()


def forward(a, b, kernel="auto", out=None, stream=None):
    """Device arrays (DeviceArray, torch, CuPy) in, ``silu(a) * b`` out as the same kind of array as ``a`` (written
    into ``out`` when given; ``out`` may be ``a`` or ``b``: in place)."""
    views = _layout.same_device_views((("a", a), ("b", b)))
    _check_kernel(kernel)
    first = views[0]
    y, y_view = _layout.output(out, a, "out", tuple(first.shape), first.dtype, first.device)
    for name, view in zip(INPUTS, views):
        if view.ptr != y_view.ptr:  # exactly in place is fine (each element is read and written by one thread)
            _layout.check_no_overlap(y_view, "out", view, name)
    _native_module().forward(views[0].ptr, views[1].ptr, y_view.ptr, _layout.numel(first.shape), first.dtype, kernel,
                             _device.stream_handle(stream))
    return y


def backward_numpy(dy, a, b, kernel="auto") -> tuple[np.ndarray, np.ndarray]:
    """Host arrays in: (da, db), host arrays."""
    _layout.same_host_arrays((("dy", dy), ("a", a), ("b", b)))
    _check_kernel(kernel)
    _device.require_gpu("swiglu.backward_numpy")
    grads = backward(_layout.to_device(dy), _layout.to_device(a), _layout.to_device(b), kernel=kernel)
    return tuple(grad.numpy() for grad in grads)


def backward(dy, a, b, kernel="auto", out=None, stream=None) -> tuple:
    """Device arrays in: (da, db) as the same kind of array as ``dy`` (written into ``out``, a tuple of two arrays
    or None, where given)."""
    views = _layout.same_device_views((("dy", dy), ("a", a), ("b", b)))
    _check_kernel(kernel)
    dy_view = views[0]
    grads, grad_views = _layout.gradient_outputs(out, dy, 2, zip(("dy", "a", "b"), views), tuple(dy_view.shape),
                                                 dy_view.dtype, dy_view.device)
    _native_module().backward(*(view.ptr for view in views), *(view.ptr for view in grad_views),
                              _layout.numel(dy_view.shape), dy_view.dtype, kernel, _device.stream_handle(stream))
    return tuple(grads)


def kernels() -> list[dict]:
    """The kernel candidates with their constraints, as the native module reports them."""
    return _native_module().kernels()


# ---------------------------------------------------------------------------------------------------------------
# Op definitions: what GE2's IR, passes, registry, autograd and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _infer(in_types, attrs):
    for name, value in zip(INPUTS, in_types):
        if value is None:
            raise ValueError(f"input '{name}' is required")
    a, b = in_types
    if a.dtype not in FLOAT_DTYPES:
        raise TypeError(f"a: expected dtype float32, float16 or bfloat16, got {a.dtype}")
    if b != a:
        raise ValueError(f"b: expected {a} (the type of a), got {b}")
    return [TensorType(a.shape, a.dtype)]


def _infer_backward(in_types, attrs):
    dy, a, b = in_types
    (y,) = _infer([a, b], attrs)
    if dy != y:
        raise ValueError(f"dy: expected {y} (the type of y), got {dy}")
    return [y, y]


def _supports(kernel: str):
    def supports(problem: Problem) -> str | None:
        # Plan buffers are contiguous and 256-byte aligned: only the element count and dtype decide.
        x = problem.in_types[0]
        return _native_module().unsupported_reason(kernel, x.numel, x.dtype, True) or None

    return supports


def _candidate(kernel: str, priority: int, description: str, always_works: bool = False) -> Candidate:
    def prepare(problem: Problem):
        count, dtype = problem.in_types[0].numel, problem.in_types[0].dtype
        return native_launch(_native_module().forward, in_ptr(0), in_ptr(1), out_ptr(0), count, dtype, kernel,
                             stream_arg())

    return Candidate(kernel, priority, description, _supports(kernel), prepare, always_works)


def _backward_candidate(kernel: str, priority: int, description: str, always_works: bool = False) -> Candidate:
    def prepare(problem: Problem):
        count, dtype = problem.in_types[0].numel, problem.in_types[0].dtype
        return native_launch(_native_module().backward, in_ptr(0), in_ptr(1), in_ptr(2), out_ptr(0), out_ptr(1), count,
                             dtype, kernel, stream_arg())

    return Candidate(kernel, priority, description, _supports(kernel), prepare, always_works)


def _grad(g, node, out_grads):
    """Autograd: ``swiglu_backward(dy, a, b)`` gives (da, db)."""
    (dy,) = out_grads
    if dy is None:
        return [None, None]
    return list(g.swiglu_backward(dy, *node.inputs))


OP = register(OpDef(
    name="swiglu",
    inputs=(Input("a"), Input("b")),
    outputs=("y",),
    attrs=(),
    infer=_infer,
    reference=lambda inputs, attrs: [reference(*inputs)],
    reference_backward=lambda inputs, outputs, out_grads, attrs: list(reference_backward(out_grads[0], *inputs)),
    candidates=(
        _candidate("vec16", 20, "16-byte loads and stores, one pack per thread"),
        _candidate("scalar", 10, "one element per thread", always_works=True),
    ),
    grad=_grad,
    doc=__doc__,
))

BACKWARD_OP = register(OpDef(
    name="swiglu_backward",
    inputs=(Input("dy"), Input("a"), Input("b")),
    outputs=("da", "db"),
    attrs=(),
    infer=_infer_backward,
    reference=lambda inputs, attrs: list(reference_backward(*inputs)),
    candidates=(
        _backward_candidate("vec16", 20, "16-byte loads and stores, one pack per thread"),
        _backward_candidate("scalar", 10, "one element per thread", always_works=True),
    ),
    doc="swiglu_backward(dy, a, b) -> (da, db)",
))
