"""batch_norm: per-channel normalization over the batch and spatial axes, with running statistics.

``x`` has rank >= 2 with its channels at axis 1 (``layout="NCHW"``: ``[N, C, ...]``) or last (``layout="NHWC"``:
``[N, ..., C]``), dtype float32, float16 or bfloat16. ``gamma``, ``beta``, ``running_mean`` and ``running_var``
are float32 ``(C,)`` whatever the dtype of x (as cuDNN and PyTorch's mixed precision keep them); every statistic is
float32.

    training:  mean, var = batch mean and biased variance of x over every axis but the channels
               running_mean_out = (1 - momentum) * running_mean + momentum * mean
               running_var_out  = (1 - momentum) * running_var  + momentum * var * count / (count - 1)
    inference: mean, var = running_mean, running_var; running_*_out = running_* (unchanged)
    y = (x - mean) * invstd * gamma + beta,  invstd = 1 / sqrt(var + eps)

Outputs: ``y``, ``saved_mean``, ``saved_invstd`` (what the backward reads) and ``running_mean_out``,
``running_var_out``. The running-statistic update is not hidden in-place mutation of a parameter: it is two
outputs of the node, so a graph stays a pure function and the trainer (or the caller) writes them back into its
running buffers after the step. The device face also accepts the running buffers themselves as ``out`` entries
for an in-place update (each channel reads its old value before writing the new one).

Backward (from the saved statistics): ``dgamma = sum(dy * xhat)``, ``dbeta = sum(dy)`` and
``dx = gamma * invstd * (dy - dbeta / count - xhat * dgamma / count)`` in training (the batch statistics depend on
x), ``dx = gamma * invstd * dy`` in inference. The running statistics get no gradient.

Kernel (``kernels()``): ``split_welford``: Welford partials per (split, channel), merged in a fixed order
(deterministic), a per-channel finalize, then one affine pass over x; the backward alike.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import FLOAT_DTYPES
from ..ir.types import TensorType
from . import _grad, _layout, _row_norm
from ._base import (Attr, Input, OpDef, Problem, Sample, as_float64, attach_grad, in_ptr, native_launch, out_ptr,
                    register, require_inputs, sample_array, stream_arg, table_candidate)
from ._face import FACES, Face

LAYOUTS = ("NCHW", "NHWC")
PARAMETERS = ("gamma", "beta", "running_mean", "running_var")
DEFAULT_MOMENTUM = 0.1
DEFAULT_EPS = 1e-5


def _native_module():
    return _native.load("_ops_batch_norm")


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes, dtypes and attributes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def _momentum_problem(momentum) -> str | None:
    return None if 0.0 <= float(momentum) <= 1.0 else "must be in [0, 1]"


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'NCHW' or 'NHWC', got {layout!r}")
    return layout


def dims(x_shape, layout: str) -> tuple:
    """(batch, channels, spatial) of x: spatial is the product of the axes other than batch and channels."""
    x_shape = tuple(x_shape)
    channels = x_shape[1] if layout == "NCHW" else x_shape[-1]
    rest = x_shape[2:] if layout == "NCHW" else x_shape[1:-1]
    spatial = 1
    for extent in rest:
        spatial = spatial * extent if isinstance(extent, int) and isinstance(spatial, int) else "?"
    return x_shape[0], channels, spatial


def check_operands(x_shape, x_dtype, params: dict, training: bool, layout: str) -> tuple:
    """Validates x and the (C,) float32 parameters ``params`` = {name: (shape, dtype)}; returns (batch, channels,
    spatial). ``x_dtype`` None: a float64 reference input."""
    check_layout(layout)
    x_shape = tuple(x_shape)
    if len(x_shape) < 2:
        raise ValueError(f"x: expected at least 2 dimensions (batch and channels), got shape {x_shape}")
    if x_dtype is not None and x_dtype not in FLOAT_DTYPES:
        raise TypeError(f"x: expected dtype float32, float16 or bfloat16, got {x_dtype}")
    batch, channels, spatial = dims(x_shape, layout)
    if any(isinstance(d, int) and d < 1 for d in x_shape):
        raise ValueError(f"x: expected every dimension >= 1, got shape {x_shape}")
    count = batch * spatial if isinstance(batch, int) and isinstance(spatial, int) else None
    if training and count == 1:
        raise ValueError(f"x: training needs more than one value per channel (batch * spatial > 1), got shape "
                         f"{x_shape}")
    for name, (shape, dtype) in params.items():
        shape = tuple(shape)
        comparable = len(shape) == 1 and type(shape[0]) is type(channels)
        if len(shape) != 1 or (comparable and shape[0] != channels):
            raise ValueError(f"{name}: expected shape ({channels},) (the channels of x, {layout}), got {shape}")
        if dtype is not None and dtype != "float32":
            raise TypeError(f"{name}: expected dtype float32 (batch_norm keeps parameters and statistics in "
                            f"float32), got {dtype}")
    return batch, channels, spatial


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def _reduce_axes(ndim: int, layout: str) -> tuple:
    return tuple(a for a in range(ndim) if a != (1 if layout == "NCHW" else ndim - 1))


def _per_channel(values: np.ndarray, ndim: int, layout: str) -> np.ndarray:
    """A (C,) array shaped to broadcast against x."""
    shape = [1] * ndim
    shape[1 if layout == "NCHW" else ndim - 1] = -1
    return values.reshape(shape)


def statistics(x, running_mean, running_var, training=False, eps=DEFAULT_EPS, layout="NCHW"):
    """(mean, invstd, var) in float64, (C,) each: the batch's (training) or the running ones."""
    x64 = as_float64(x)
    if training:
        axes = _reduce_axes(x64.ndim, layout)
        mean, var = x64.mean(axis=axes), x64.var(axis=axes)
    else:
        mean, var = as_float64(running_mean), as_float64(running_var)
    return mean, 1.0 / np.sqrt(var + eps), var


def reference(x, gamma, beta, running_mean, running_var, training=False, momentum=DEFAULT_MOMENTUM, eps=DEFAULT_EPS,
              layout="NCHW"):
    """(y, saved_mean, saved_invstd, running_mean_out, running_var_out) in float64."""
    x64 = as_float64(x)
    mean, invstd, var = statistics(x64, running_mean, running_var, training, eps, layout)
    scale = as_float64(gamma) * invstd
    y = (x64 - _per_channel(mean, x64.ndim, layout)) * _per_channel(scale, x64.ndim, layout) \
        + _per_channel(as_float64(beta), x64.ndim, layout)
    running_mean64, running_var64 = as_float64(running_mean), as_float64(running_var)
    if training:
        count = x64.size // mean.size
        running_mean64 = (1 - momentum) * running_mean64 + momentum * mean
        running_var64 = (1 - momentum) * running_var64 + momentum * var * count / (count - 1)
    return y, mean, invstd, running_mean64, running_var64


def reference_backward(dy, x, gamma, saved_mean, saved_invstd, training=False, layout="NCHW"):
    """(dx, dgamma, dbeta) in float64 from the saved statistics."""
    dy64, x64 = as_float64(dy), as_float64(x)
    axes = _reduce_axes(x64.ndim, layout)
    mean, invstd = as_float64(saved_mean), as_float64(saved_invstd)
    xhat = (x64 - _per_channel(mean, x64.ndim, layout)) * _per_channel(invstd, x64.ndim, layout)
    dgamma, dbeta = (dy64 * xhat).sum(axis=axes), dy64.sum(axis=axes)
    scale = _per_channel(as_float64(gamma) * invstd, x64.ndim, layout)
    if not training:
        return dy64 * scale, dgamma, dbeta
    count = x64.size // mean.size
    dx = scale * (dy64 - _per_channel(dbeta, x64.ndim, layout) / count
                  - xhat * _per_channel(dgamma, x64.ndim, layout) / count)
    return dx, dgamma, dbeta


# ---------------------------------------------------------------------------------------------------------------
# Python face: generated from the OpDef (ops/_face.py); the backward below is the part a definition cannot say.
# ---------------------------------------------------------------------------------------------------------------
def _check_dy(dy_shape, dy_dtype, x_shape, x_dtype):
    if tuple(dy_shape) != tuple(x_shape):
        raise ValueError(f"dy: expected shape {tuple(x_shape)} (the shape of x), got {tuple(dy_shape)}")
    if dy_dtype != x_dtype:
        raise TypeError(f"dy: expected dtype {x_dtype} (the dtype of x), got {dy_dtype}")


def _check_saved_pair(inputs, attrs, saved_mean=None, saved_invstd=None):
    if (saved_mean is None) != (saved_invstd is None):
        raise ValueError("saved_mean, saved_invstd: pass both saved statistics or neither (then they are "
                         "recomputed)")


def _backward(dy, inputs, attrs, kernel, out, stream, saved_mean=None, saved_invstd=None):
    """(dx, dgamma, dbeta, None, None) as arrays of x's kind, or ``out``'s entries (the running statistics get no
    gradient). ``saved_mean``/``saved_invstd``: the forward's saved statistics (both or neither; recomputed by a
    forward into temporaries when absent, which leaves the running statistics alone)."""
    x, gamma, beta, running_mean, running_var = inputs
    views = _layout.input_views({"dy": dy, "x": x, "gamma": gamma, "beta": beta, "running_mean": running_mean,
                                 "running_var": running_var})
    vdy, vx = views["dy"], views["x"]
    batch, channels, spatial = check_operands(vx.shape, vx.dtype, {n: (views[n].shape, views[n].dtype)
                                                                   for n in PARAMETERS}, attrs["training"],
                                              attrs["layout"])
    _check_dy(vdy.shape, vdy.dtype, vx.shape, vx.dtype)
    _check_saved_pair(inputs, attrs, saved_mean, saved_invstd)
    outs = (None,) * 5 if out is None else out
    for index in (3, 4):
        if outs[index] is not None:
            raise ValueError(f"out[{index}]: expected None ({PARAMETERS[index - 1]} gets no gradient), got an array")
    if saved_mean is None:
        _, saved_mean, saved_invstd, _, _ = FACES["batch_norm"].forward(*inputs, **attrs, kernel=kernel,
                                                                        stream=stream)
    saved = {name: _layout.checked_view(array, name, (channels,), "float32", vx.device)
             for name, array in (("saved_mean", saved_mean), ("saved_invstd", saved_invstd))}
    dx, vdx = _layout.output(outs[0], x, "out[0]", tuple(vx.shape), vx.dtype, vx.device)
    dgamma, vdgamma = _layout.output(outs[1], x, "out[1]", (channels,), "float32", vx.device)
    dbeta, vdbeta = _layout.output(outs[2], x, "out[2]", (channels,), "float32", vx.device)
    _native_module().backward(vdy.ptr, vx.ptr, views["gamma"].ptr, saved["saved_mean"].ptr,
                              saved["saved_invstd"].ptr, vdx.ptr, vdgamma.ptr, vdbeta.ptr, batch, channels, spatial,
                              attrs["layout"], vx.dtype, bool(attrs["training"]), _device.stream_handle(stream))
    return dx, dgamma, dbeta, None, None


# ---------------------------------------------------------------------------------------------------------------
# Op definitions: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
ATTRS = (
    Attr("training", bool, False, doc="batch statistics and a running-statistic update (True) or the running "
                                      "statistics (False)"),
    Attr("momentum", float, DEFAULT_MOMENTUM, check=_momentum_problem, doc="weight of the batch statistics in the "
                                                                          "running update"),
    Attr("eps", float, DEFAULT_EPS, check=_row_norm.eps_problem, doc="added to the variance"),
    Attr("layout", str, "NCHW", choices=LAYOUTS, doc="channels at axis 1 (NCHW) or last (NHWC)"),
)


def _infer(in_types, attrs):
    require_inputs(in_types, ("x", *PARAMETERS))
    x = in_types[0]
    _, channels, _ = check_operands(x.shape, x.dtype, {n: (t.shape, t.dtype) for n, t in zip(PARAMETERS, in_types[1:])},
                                    attrs["training"], attrs["layout"])
    stat = TensorType((channels,), "float32")
    return [x, stat, stat, stat, stat]


def _reference(inputs, attrs):
    return list(reference(*inputs, attrs["training"], attrs["momentum"], attrs["eps"], attrs["layout"]))


def _reference_backward(inputs, outputs, out_grads, attrs):
    x, gamma, _, running_mean, running_var = inputs
    mean, invstd, _ = statistics(x, running_mean, running_var, attrs["training"], attrs["eps"], attrs["layout"])
    return [*reference_backward(out_grads[0], x, gamma, mean, invstd, attrs["training"], attrs["layout"]), None, None]


def _problem_dims(problem: Problem) -> tuple:
    x = problem.in_types[1] if problem.op == "batch_norm_backward" else problem.in_types[0]
    return (*dims(x.shape, problem.attrs["layout"]), x.dtype)


def _prepare_forward(problem: Problem):
    batch, channels, spatial, dtype = _problem_dims(problem)
    attrs = problem.attrs
    native_forward, layout = _native_module().forward, attrs["layout"]
    training, momentum, eps = bool(attrs["training"]), float(attrs["momentum"]), float(attrs["eps"])
    return native_launch(native_forward, *map(in_ptr, range(len(problem.in_types))),
                         *map(out_ptr, range(len(problem.out_types))), batch, channels, spatial, layout, dtype,
                         training, momentum, eps, stream_arg())


def _prepare_backward(problem: Problem):
    batch, channels, spatial, dtype = _problem_dims(problem)
    native_backward, layout, training = _native_module().backward, problem.attrs["layout"], problem.attrs["training"]
    return native_launch(native_backward, *map(in_ptr, range(len(problem.in_types))),
                         *map(out_ptr, range(len(problem.out_types))), batch, channels, spatial, layout, dtype,
                         bool(training), stream_arg())


def _supported(problem: Problem):
    return None if _native.is_built("_ops_batch_norm") else "native module _ops_batch_norm is not built"


OP = register(OpDef(
    name="batch_norm",
    samples=lambda rng: [Sample((sample_array(rng, 4, 3, 2, 2), sample_array(rng, 3), sample_array(rng, 3),
                                 sample_array(rng, 3), sample_array(rng, 3, positive=True)))],
    inputs=tuple(Input(name) for name in ("x", *PARAMETERS)),
    outputs=("y", "saved_mean", "saved_invstd", "running_mean_out", "running_var_out"),
    attrs=ATTRS,
    infer=_infer,
    reference=_reference,
    reference_backward=_reference_backward,
    candidates=(table_candidate("_ops_batch_norm", "split_welford", _supported, _prepare_forward),),
    doc=__doc__,
))


def _infer_backward(in_types, attrs):
    require_inputs(in_types, ("dy", "x", "gamma", "saved_mean", "saved_invstd"))
    dy, x, gamma, saved_mean, saved_invstd = in_types
    check_operands(x.shape, x.dtype, {"gamma": (gamma.shape, gamma.dtype), "saved_mean": (saved_mean.shape,
                                      saved_mean.dtype), "saved_invstd": (saved_invstd.shape, saved_invstd.dtype)},
                   attrs["training"], attrs["layout"])
    if dy != x:
        raise ValueError(f"dy: expected {x} (the type of x), got {dy}")
    return [x, gamma, gamma]


BACKWARD_OP = _grad.register_backward(OpDef(
    name="batch_norm_backward",
    inputs=tuple(Input(name) for name in ("dy", "x", "gamma", "saved_mean", "saved_invstd")),
    outputs=("dx", "dgamma", "dbeta"),
    attrs=ATTRS,
    infer=_infer_backward,
    reference=lambda inputs, attrs: list(reference_backward(*inputs, attrs["training"], attrs["layout"])),
    candidates=(table_candidate("_ops_batch_norm", "split_welford", _supported, _prepare_backward),),
    doc="batch_norm_backward(dy, x, gamma, saved_mean, saved_invstd) -> (dx, dgamma, dbeta)",
))


# The grad rule: the saved statistics of the forward node feed the backward op; the running statistics and the
# gradients of the statistic outputs (nothing differentiates through them) are left out.
def _grad(g, node, out_grads):
    dy = out_grads[0]
    if dy is None:
        return [None] * 5
    x, gamma = node.inputs[0], node.inputs[1]
    dx, dgamma, dbeta = g.batch_norm_backward(dy, x, gamma, node.outputs[1], node.outputs[2], **node.attrs)
    return [dx, dgamma, dbeta, None, None]


attach_grad(OP, _grad)

# The face, ``ge2.ops.batch_norm.forward / forward_numpy / backward / backward_numpy / kernels / prepare``: forward
# returns the five outputs and may write the running statistics in place (``out`` entries 3 and 4 being
# running_mean and running_var themselves); backward takes dy (the gradient of y; the statistics have none) and
# the saved statistics by keyword.
globals().update(Face(OP, _backward, saved=("saved_mean", "saved_invstd"), backward_host_check=_check_saved_pair,
                      in_place={"running_mean_out": "running_mean", "running_var_out": "running_var"}).functions())
