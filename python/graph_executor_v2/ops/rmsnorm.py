"""rmsnorm: ``y = x / sqrt(mean(x^2) + eps) * gamma`` over the last axis of ``x``.

``x`` has any rank >= 1 (``rows`` = the product of the leading dims, ``cols`` = the last one); ``gamma`` has shape
``(cols,)`` and the dtype of ``x`` (float32, float16 or bfloat16). Statistics are float32.
``forward(..., save_stats=True)`` also returns the float32 ``rstd = 1 / sqrt(mean(x^2) + eps)`` of every row,
shape ``(rows,)``, which ``backward`` takes to skip recomputing it.

Backward: ``dx`` and ``dgamma = sum over rows of dy * x * rstd``, the column sum deterministic: per-block partial
sums in a float32 workspace (allocated here, or passed as ``workspace=`` with at least
``backward_workspace_bytes()`` bytes), then a second kernel that adds them in a fixed order.

Kernel candidates (``kernels()``, with their exact limits), best first: ``warp_per_row`` (cols <= 1024),
``block_per_row`` (cols <= 32768 forward, 8192 backward), both holding the row in registers with 16-byte vector
loads where aligned (scalar loads, with lower limits, otherwise); ``multipass`` (any cols, any alignment), the
one that always works. The kernels are shared with layernorm.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from . import _layout, _row_norm
from ._base import Attr, Input, OpDef, as_float64, register

DEFAULT_EPS = 1e-6


def _native_module():
    return _native.load("_ops_rmsnorm")


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def reference(x, gamma, eps=DEFAULT_EPS):
    """Returns (y, rstd) in float64; rstd flattened to one per row."""
    x64 = as_float64(x)
    rstd = 1.0 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    return x64 * rstd * as_float64(gamma), rstd.reshape(-1)


def reference_backward(dy, x, gamma, eps=DEFAULT_EPS):
    """Returns (dx, dgamma) in float64."""
    dy64, x64, gamma64 = as_float64(dy), as_float64(x), as_float64(gamma)
    rstd = 1.0 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    xhat = x64 * rstd
    g = dy64 * gamma64
    dx = rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy64 * xhat).reshape(-1, x64.shape[-1]).sum(axis=0)


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes, dtypes and attributes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def check_operands(x_shape, x_dtype, gamma_shape, gamma_dtype, eps=DEFAULT_EPS):
    """Validates an rmsnorm problem and returns its NormShape (rows, cols, dtype, shape)."""
    shape = _row_norm.check_operands(x_shape, x_dtype, [("gamma", gamma_shape, gamma_dtype)])
    _row_norm.check_eps(eps)
    return shape


def _check_backward(dy_shape, dy_dtype, x_shape, x_dtype, gamma_shape, gamma_dtype, eps):
    shape = check_operands(x_shape, x_dtype, gamma_shape, gamma_dtype, eps)
    if tuple(dy_shape) != shape.shape:
        raise ValueError(f"dy: expected shape {shape.shape} (the shape of x), got {tuple(dy_shape)}")
    if dy_dtype != shape.dtype:
        raise TypeError(f"dy: expected dtype {shape.dtype} (the dtype of x), got {dy_dtype}")
    return shape


# ---------------------------------------------------------------------------------------------------------------
# Python face
# ---------------------------------------------------------------------------------------------------------------
def forward_numpy(x, gamma, eps=DEFAULT_EPS, save_stats=False, kernel="auto"):
    """Host arrays in, host array(s) out: y, or (y, rstd) with ``save_stats``. Runs on the GPU."""
    arrays = {"x": x, "gamma": gamma}
    dtypes = {name: _layout.host_dtype(array, name) for name, array in arrays.items()}
    check_operands(x.shape, dtypes["x"], gamma.shape, dtypes["gamma"], eps)
    _row_norm.check_kernel(kernel)
    _device.require_gpu("rmsnorm.forward_numpy")
    on_device = _row_norm.upload(arrays)
    result = forward(on_device["x"], on_device["gamma"], eps=eps, save_stats=save_stats, kernel=kernel)
    return tuple(r.numpy() for r in result) if save_stats else result.numpy()


def forward(x, gamma, eps=DEFAULT_EPS, save_stats=False, kernel="auto", out=None, rstd_out=None, stream=None):
    """Device arrays (DeviceArray, torch, CuPy) in, device array(s) out, zero-copy: y, or (y, rstd) with
    ``save_stats``. ``out``/``rstd_out`` are written when given; otherwise outputs are allocated as the same kind
    of array as ``x``."""
    views = _row_norm.input_views({"x": x, "gamma": gamma})
    vx, vg = views["x"], views["gamma"]
    shape = check_operands(vx.shape, vx.dtype, vg.shape, vg.dtype, eps)
    _row_norm.check_kernel(kernel)
    y, vy = _layout.output(out, x, "out", shape.shape, shape.dtype, vx.device)
    rstd = vrstd = None
    if save_stats:
        rstd, vrstd = _layout.output(rstd_out, x, "rstd_out", (shape.rows,), "float32", vx.device)
    _native_module().forward(vx.ptr, vg.ptr, vy.ptr, _row_norm.address(vrstd), shape.rows, shape.cols,
                             shape.dtype, float(eps), kernel, _device.stream_handle(stream))
    return (y, rstd) if save_stats else y


def backward_numpy(dy, x, gamma, rstd=None, eps=DEFAULT_EPS, kernel="auto"):
    """Host arrays in: returns (dx, dgamma) as host arrays. ``rstd``: the saved statistic (recomputed from x when
    absent)."""
    arrays = {"dy": dy, "x": x, "gamma": gamma}
    dtypes = {name: _layout.host_dtype(array, name) for name, array in arrays.items()}
    shape = _check_backward(dy.shape, dtypes["dy"], x.shape, dtypes["x"], gamma.shape, dtypes["gamma"], eps)
    _row_norm.check_host_statistic(rstd, "rstd", shape)
    _row_norm.check_kernel(kernel)
    _device.require_gpu("rmsnorm.backward_numpy")
    on_device = _row_norm.upload({**arrays, "rstd": rstd})
    grads = backward(on_device["dy"], on_device["x"], on_device["gamma"], on_device["rstd"], eps=eps, kernel=kernel)
    return tuple(g.numpy() for g in grads)


def backward(dy, x, gamma, rstd=None, eps=DEFAULT_EPS, kernel="auto", dx_out=None, dgamma_out=None, workspace=None,
             stream=None):
    """Device arrays in: returns (dx, dgamma) as device arrays of x's kind (``*_out`` are written when given).
    ``rstd``: the saved statistic of forward(save_stats=True). ``workspace``: a float32 device array of at least
    backward_workspace_bytes() bytes, allocated here when not given (as an array of x's kind, released on
    return: with a stream other than that library's current one, pass your own)."""
    views = _row_norm.input_views({"dy": dy, "x": x, "gamma": gamma})
    vdy, vx, vg = views["dy"], views["x"], views["gamma"]
    shape = _check_backward(vdy.shape, vdy.dtype, vx.shape, vx.dtype, vg.shape, vg.dtype, eps)
    vrstd = _row_norm.statistic(rstd, "rstd", shape, vx.device)
    _row_norm.check_kernel(kernel)
    dx, vdx = _layout.output(dx_out, x, "dx_out", shape.shape, shape.dtype, vx.device)
    dgamma, vdgamma = _layout.output(dgamma_out, x, "dgamma_out", (shape.cols,), shape.dtype, vx.device)
    native = _native_module()
    workspace, vworkspace, size = _row_norm.workspace_for(native, workspace, x, shape, kernel,
                                                          _row_norm.is_aligned(vdy, vx, vg, vdx), vx.device)
    native.backward(vdy.ptr, vx.ptr, vg.ptr, _row_norm.address(vrstd), vdx.ptr, vdgamma.ptr, vworkspace.ptr, size,
                    shape.rows, shape.cols, shape.dtype, float(eps), kernel, _device.stream_handle(stream))
    return dx, dgamma


def backward_workspace_bytes(x_shape, dtype, kernel="auto", aligned=True) -> int:
    """Bytes of float32 workspace ``backward`` needs for an x of this shape and dtype on the current GPU
    (``aligned``: dy, x, gamma and dx 16-byte aligned, as every plan buffer is)."""
    return _row_norm.workspace_bytes(_native_module, "rmsnorm", x_shape, dtype, kernel, aligned)


def kernels() -> list[dict]:
    """The candidates with their constraints, as the native module reports them."""
    return _native_module().kernels()


# ---------------------------------------------------------------------------------------------------------------
# Op definition: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
_INPUTS = ("x", "gamma")


def _infer(in_types, attrs):
    return _row_norm.infer(in_types, attrs, _INPUTS)


def _reference(inputs, attrs):
    x, gamma = inputs
    return [reference(x, gamma, attrs["eps"])[0]]


def _reference_backward(inputs, outputs, out_grads, attrs):
    x, gamma = inputs
    return list(reference_backward(out_grads[0], x, gamma, attrs["eps"]))


def _make_launch(native, kernel, shape, eps):
    native_forward, rows, cols, dtype = native.forward, shape.rows, shape.cols, shape.dtype

    def launch(ins, outs, stream):
        native_forward(ins[0], ins[1], outs[0], 0, rows, cols, dtype, eps, kernel, stream)

    return launch


OP = register(OpDef(
    name="rmsnorm",
    inputs=tuple(Input(name) for name in _INPUTS),
    outputs=("y",),
    attrs=(Attr("eps", float, DEFAULT_EPS, check=_row_norm.eps_problem, doc="added to the mean square"),),
    infer=_infer,
    reference=_reference,
    reference_backward=_reference_backward,
    candidates=_row_norm.candidates(_native_module, _make_launch),
    doc=__doc__,
))


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: ``rmsnorm_backward(dy, x, gamma) -> (dx, dgamma)``, the native backward (rstd recomputed from x).
# ---------------------------------------------------------------------------------------------------------------
from . import _grad  # noqa: E402  (the grad section stays separate from the face above)
from ._base import Problem, attach_grad  # noqa: E402


def _infer_backward(in_types, attrs):
    dy, x, gamma = in_types
    if dy != x:
        raise ValueError(f"dy: expected {x} (the type of x), got {dy}")
    return [x, gamma]


def _prepare_backward(problem: Problem):
    shape = _row_norm.problem_dims(problem)
    native = _native_module()
    size = native.backward_workspace_bytes(shape.rows, shape.cols, shape.dtype, "auto", True)
    workspace = _grad.device_workspace(size)
    eps, workspace_ptr = float(problem.attrs["eps"]), workspace.ptr

    def launch(ins, outs, stream, workspace=workspace):  # the default argument keeps the workspace alive
        native.backward(ins[0], ins[1], ins[2], 0, outs[0], outs[1], workspace_ptr, size, shape.rows, shape.cols,
                        shape.dtype, eps, "auto", stream)

    return launch


BACKWARD_OP = register(OpDef(
    name="rmsnorm_backward",
    inputs=(Input("dy"), Input("x"), Input("gamma")),
    outputs=("dx", "dgamma"),
    attrs=OP.attrs,
    infer=_infer_backward,
    reference=lambda inputs, attrs: list(reference_backward(*inputs, attrs["eps"])),
    candidates=(_grad.native_candidate("_ops_rmsnorm", "dx, dgamma with a float32 workspace", _prepare_backward),),
    doc="rmsnorm_backward(dy, x, gamma) -> (dx, dgamma)",
))

attach_grad(OP, lambda g, node, dys: list(g.rmsnorm_backward(dys[0], node.inputs[0], node.inputs[1],
                                                              eps=node.attrs["eps"])))
