"""Pieces the grad rules of several ops share: reducing a broadcast gradient back to an operand's shape, a
reshape that tolerates one symbolic dim, and the single native candidate of a backward op.

A grad rule lives in its op's own module (``attach_grad`` at the end of ``ops/<op>.py``); backward computations are
``<op>_backward`` OpDefs whose reference is the op's float64 ``reference_backward`` and whose GPU candidate calls the
op's native ``backward``.
"""
from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from .. import _native
from ..dtypes import to_numpy
from ..ir.schema import _package_of
from ._base import Candidate, Launch, OpDef, Problem, register

# The ops that compute gradients (``<op>_backward``, ``cross_entropy_with_grad``): IR ops that training plans run,
# whose kernels users reach through the forward op's face (``ops.relu.backward``), so they have no face of their own.
BACKWARD_OPS: set[str] = set()


def register_backward(opdef: OpDef, origin: str | None = None) -> OpDef:
    """Registers an op that computes gradients (see ``BACKWARD_OPS``): an op's, a scaffolded op's or another
    package's. ``origin`` as for ``register`` (default: the calling package, so another package's backward op is
    marked external like its forward)."""
    registered = register(opdef, _package_of(sys._getframe(1)) if origin is None else origin)
    BACKWARD_OPS.add(opdef.name)
    return registered


def sum_to(g, dy, shape: tuple):
    """``dy`` (a broadcast result) summed over the dims along which an operand of ``shape`` was broadcast, then
    reshaped to ``shape`` (NumPy broadcasting: missing leading dims and size-1 dims)."""
    shape = tuple(shape)
    if tuple(dy.type.shape) == shape:
        return dy
    extra = dy.type.rank - len(shape)
    axes = list(range(extra))
    for axis, extent in enumerate(shape):
        if extent == 1 and dy.type.shape[extra + axis] != 1:
            axes.append(extra + axis)
    summed = g.sum(dy, axis=tuple(axes), keepdims=False) if axes else dy
    return summed if tuple(summed.type.shape) == shape else reshape_to(g, summed, shape)


def reshape_to(g, x, shape: tuple):
    """``reshape(x, shape)`` where ``shape`` may hold one symbolic dim (it becomes -1)."""
    symbolic = [d for d in shape if isinstance(d, str)]
    if len(symbolic) > 1:
        raise ValueError(f"shape: a gradient reshape to {shape} has more than one symbolic dim; bind the input "
                         "shapes first")
    return g.reshape(x, shape=tuple(-1 if isinstance(d, str) else d for d in shape))


def native_candidate(module: str, description: str, prepare: Callable[[Problem], Launch]) -> Candidate:
    """The one GPU candidate of a backward op: the op's native ``backward``. Where the module has several backward
    kernels, ``prepare`` names the one the selector's ``table_kernel`` picks for the problem (no native call picks).
    A backward op whose kernels differ in speed enough to be timed declares them as table candidates instead
    (gemm_backward, conv2d_backward, attention_backward)."""

    def supports(problem: Problem):
        return None if _native.is_built(module) else f"native module {module} is not built"

    return Candidate("native_backward", 10, description, supports, prepare, always_works=True)


def constant(g, value: float, dtype: str):
    """A 0-d parameter holding ``value`` (a scale in a gradient), under a fresh name."""
    index = 0
    while True:
        try:
            return g.param(f"grad_const_{index}", np.array(value, dtype=to_numpy(dtype)))
        except ValueError:  # the name is taken
            index += 1


def device_workspace(nbytes: int):
    """A device buffer a backward launch keeps for the plan's life (allocated when the plan is prepared, never in a
    step, so a captured step stays valid)."""
    from .. import device as _device

    runtime = _device.runtime()
    return runtime.DeviceArray.empty([max(nbytes, 4)], "uint8", runtime.current_device())


def row_norm_backward_launch(native, problem: Problem, call: Callable) -> Launch:
    """The launch of a row norm's backward (layernorm, rmsnorm): its float32 workspace allocated once, here;
    ``call(ins, outs, workspace_ptr, workspace_bytes, shape, eps, kernel, stream)`` makes the native call with the
    selector's kernel (plan buffers are 16-byte aligned)."""
    from ._row_norm import choose_kernel, problem_dims

    shape = problem_dims(problem)
    kernel = choose_kernel(native, "auto", shape.cols, shape.dtype, True, True)
    size = native.backward_workspace_bytes(shape.rows, shape.cols, shape.dtype, kernel, True)
    workspace = device_workspace(size)
    eps = float(problem.attrs["eps"])

    def launch(ins, outs, stream, workspace=workspace):  # the default argument keeps the workspace alive
        call(ins, outs, workspace.ptr, size, shape, eps, kernel, stream)

    return launch
