"""What layernorm and rmsnorm share: validation, the device-array plumbing and the kernel candidates.

Both normalize the last axis of ``x`` (any rank >= 1, seen as ``rows x cols``) with parameters of shape
``(cols,)`` and the dtype of ``x``, float32 statistics inside; their native modules instantiate one set of kernels
(``backends/cuda/ops/row_norm``), ``centered`` (layernorm: subtract the mean, add beta) or not
(rmsnorm). The op modules keep what differs: the math of the references and the native call signatures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import device as _device
from .. import selection
from ..dtypes import FLOAT_DTYPES, normalize
from ..ir.types import TensorType
from . import _layout
from ._base import Candidate, Problem, native_launch, require_inputs, table_candidate
from ._face import Face

_FLOAT32_MAX = float(np.finfo(np.float32).max)

# The kernels, best first; their priorities and descriptions are in the native kernels() table (row_norm/api.hpp).
KERNELS = ("warp_per_row", "block_per_row", "multipass")


@dataclass(frozen=True)
class NormShape:
    rows: int
    cols: int
    dtype: str
    shape: tuple  # of x


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes, dtypes and attributes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def eps_problem(eps) -> str | None:
    """What is wrong with ``eps`` (None when it is a finite value > 0 in float32, as the kernels use it)."""
    value = float(eps)
    if math.isfinite(value) and 0.0 < value <= _FLOAT32_MAX and np.float32(value) > 0:
        return None
    return "must be a finite value > 0 (in float32)"


def check_operands(x_shape, x_dtype, params) -> NormShape:
    """Validates x and its parameters ``params`` = [(name, shape, dtype), ...]; raises ValueError/TypeError naming
    the argument, what was expected and what came."""
    x_shape = tuple(x_shape)
    if len(x_shape) < 1:
        raise ValueError("x: expected at least 1 dimension (the last one is normalized), got a 0-d array")
    if x_dtype not in FLOAT_DTYPES:
        raise TypeError(f"x: expected dtype float32, float16 or bfloat16, got {x_dtype}")
    cols = x_shape[-1]
    if cols < 1:
        raise ValueError(f"x: the last (normalized) axis needs at least 1 element, got shape {x_shape}")
    for name, shape, dtype in params:
        if tuple(shape) != (cols,):
            raise ValueError(f"{name}: expected shape ({cols},) (the last axis of x), got {tuple(shape)}")
        if dtype != x_dtype:
            raise TypeError(f"{name}: expected dtype {x_dtype} (the dtype of x), got {dtype}")
    return NormShape(math.prod(x_shape[:-1]), cols, x_dtype, x_shape)


def check_statistic(argument: str, stat_shape, stat_dtype: str, shape: NormShape) -> None:
    """A saved per-row statistic (mean or rstd) given to a backward: float32, shape (rows,)."""
    if tuple(stat_shape) != (shape.rows,):
        raise ValueError(f"{argument}: expected shape ({shape.rows},) (one float32 per row of x), "
                         f"got {tuple(stat_shape)}")
    if stat_dtype != "float32":
        raise TypeError(f"{argument}: expected dtype float32, got {stat_dtype}")


def infer(in_types, attrs, names) -> list[TensorType]:
    """OpDef.infer: ``names`` are the input names, x first, then the (cols,) parameters."""
    require_inputs(in_types, names)
    x = in_types[0]
    if x.rank < 1:
        raise ValueError(f"x: expected at least 1 dimension (the last one is normalized), got {x}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x: expected dtype float32, float16 or bfloat16, got {x.dtype}")
    cols = x.shape[-1]
    if isinstance(cols, int) and cols < 1:
        raise ValueError(f"x: the last (normalized) axis needs at least 1 element, got {x}")
    for name, t in zip(names[1:], in_types[1:]):
        if t.rank != 1:
            raise ValueError(f"{name}: expected shape ({cols},) (the last axis of x), got {t}")
        comparable = type(t.shape[0]) is type(cols)  # two extents, or two symbolic names
        if comparable and t.shape[0] != cols:
            raise ValueError(f"{name}: expected shape ({cols},) (the last axis of x), got {t}")
        if t.dtype != x.dtype:
            raise TypeError(f"{name}: expected dtype {x.dtype} (the dtype of x), got {t.dtype}")
    return [TensorType(x.shape, x.dtype)]


# ---------------------------------------------------------------------------------------------------------------
# Device arrays
# ---------------------------------------------------------------------------------------------------------------
def statistic(array, argument: str, shape: NormShape, device: int):
    """The view of a saved per-row statistic on the device (None when not given)."""
    if array is None:
        return None
    view = _device.view_of(array, argument)
    check_statistic(argument, view.shape, view.dtype, shape)
    if not view.is_contiguous:
        raise ValueError(f"{argument}: expected a contiguous array, got strides {view.strides}")
    _layout.check_device(view, device, argument)
    return view


def choose_kernel(module, requested: str, cols: int, dtype: str, aligned: bool, backward: bool) -> str:
    """The kernel of a native call of row-norm ``module`` (the loaded ``_ops_layernorm`` or ``_ops_rmsnorm``) on rows
    of ``cols``: ``requested``, or for "auto" the selector's choice (``aligned``: every pointer 16-byte aligned)."""
    return selection.table_kernel(module.__name__.rpartition(".")[2], requested,
                                  lambda name: module.unsupported_reason(name, cols, dtype, aligned, backward), dtype)


def workspace_for(native, workspace, template, shape: NormShape, kernel: str, aligned: bool, device: int):
    """The backward's float32 workspace (allocated when not given) and its view and size in bytes."""
    need = native.backward_workspace_bytes(shape.rows, shape.cols, shape.dtype, kernel, aligned)
    if workspace is None:
        workspace = _device.empty_like_kind(template, (max(1, -(-need // 4)),), "float32", device)
    view = _device.view_of(workspace, "workspace")
    size = math.prod(view.shape) * 4
    if view.dtype != "float32":
        raise TypeError(f"workspace: expected dtype float32, got {view.dtype}")
    if not view.is_contiguous:
        raise ValueError(f"workspace: expected a contiguous array, got strides {view.strides}")
    if size < need:
        raise ValueError(f"workspace: this problem needs {need} bytes (backward_workspace_bytes), got {size}")
    _layout.check_device(view, device, "workspace")
    return workspace, view, size


def workspace_bytes(native, op: str, x_shape, dtype, kernel: str, aligned: bool) -> int:
    """backward_workspace_bytes of op ``op`` (``native()`` loads its module)."""
    shape = check_operands(x_shape, normalize(dtype, "dtype"), [])
    if kernel not in ("auto",) + KERNELS:
        raise ValueError(f"kernel: expected auto or one of the candidates, got {kernel!r}")
    _device.require_gpu(f"{op}.backward_workspace_bytes")
    module = native()
    kernel = choose_kernel(module, kernel, shape.cols, shape.dtype, bool(aligned), True)
    return module.backward_workspace_bytes(shape.rows, shape.cols, shape.dtype, kernel, bool(aligned))


def address(view) -> int:
    """The device address of an optional view (0 for an absent one, as the native modules take it)."""
    return 0 if view is None else view.ptr


def is_aligned(*views) -> bool:
    return all(v.ptr % 16 == 0 for v in views)


# ---------------------------------------------------------------------------------------------------------------
# The face (ops/_face.py): forward with saved statistics and backward, the same code for both ops
# ---------------------------------------------------------------------------------------------------------------
def make_face(opdef, native, stats: tuple[str, ...]) -> Face:
    """The face of a row norm whose native module is ``native()`` (both modules take the same arguments, 0 for what
    rmsnorm has not: beta, mean, dbeta) and whose saved statistics are ``stats`` ((mean, rstd) or (rstd,))."""
    names = tuple(i.name for i in opdef.inputs)

    def checked(arrays: dict):
        views = _layout.input_views(arrays)
        vx = views["x"]
        shape = check_operands(vx.shape, vx.dtype, [(n, views[n].shape, views[n].dtype) for n in names[1:]
                                                    if n in views])
        return views, shape

    def forward_with_stats(inputs, attrs, kernel, out, stream, save_stats=False, **stat_outs):
        """forward(..., save_stats=True): returns (y, *stats), the float32 per-row statistics, written into
        ``<stat>_out`` when given."""
        x = inputs[0]
        views, shape = checked(dict(zip(names, inputs)))
        device = views["x"].device
        y, vy = _layout.output(out, x, "out", shape.shape, shape.dtype, device)
        saved = [_layout.output(stat_outs.get(f"{stat}_out"), x, f"{stat}_out", (shape.rows,), "float32", device)
                 if save_stats else (None, None) for stat in stats]
        saved_views = dict(zip(stats, (view for _, view in saved)))
        module = native()
        aligned = is_aligned(*(v for v in (views["x"], vy, views["gamma"], views.get("beta")) if v is not None))
        kernel = choose_kernel(module, kernel, shape.cols, shape.dtype, aligned, False)
        module.forward(views["x"].ptr, views["gamma"].ptr, address(views.get("beta")), vy.ptr,
                       address(saved_views.get("mean")), address(saved_views.get("rstd")), shape.rows, shape.cols,
                       shape.dtype, attrs["eps"], kernel, _device.stream_handle(stream))
        return (y, *(array for array, _ in saved)) if save_stats else y

    def backward(dy, inputs, attrs, kernel, out, stream, workspace=None, **saved):
        """(dx, d(each parameter)). The saved statistics of forward(save_stats=True) (all or none) skip recomputing
        them. ``workspace``: a float32 device array of at least backward_workspace_bytes() bytes, allocated here
        when not given (as an array of x's kind, released on return: with a stream other than that library's
        current one, pass your own). The parameter sums are deterministic (fixed-order partial sums)."""
        x = inputs[0]
        views, shape = checked({"dy": dy, **dict(zip(names, inputs))})
        device = views["x"].device
        _layout.checked_view(dy, "dy", shape.shape, shape.dtype, device)
        check_saved(shape, saved)
        stat_views = {name: statistic(saved.get(name), name, shape, device) for name in stats}
        grads = [_layout.output(None if out is None else out[i], x, f"out[{i}]",
                                shape.shape if i == 0 else (shape.cols,), shape.dtype, device)
                 for i in range(len(names))]
        grad_views = [view for _, view in grads] + [None]  # no dbeta for rmsnorm
        module = native()
        aligned = is_aligned(views["dy"], views["x"], views["gamma"], grad_views[0])
        kernel = choose_kernel(module, kernel, shape.cols, shape.dtype, aligned, True)
        workspace, vworkspace, size = workspace_for(module, workspace, x, shape, kernel, aligned, device)
        module.backward(views["dy"].ptr, views["x"].ptr, views["gamma"].ptr, address(stat_views.get("mean")),
                        address(stat_views.get("rstd")), grad_views[0].ptr, grad_views[1].ptr,
                        address(grad_views[2]), vworkspace.ptr, size, shape.rows, shape.cols, shape.dtype,
                        attrs["eps"], kernel, _device.stream_handle(stream))
        return tuple(array for array, _ in grads)

    def check_saved(shape: NormShape, saved: dict) -> None:
        """All saved statistics or none, each float32 of shape (rows,) (host arrays or device views)."""
        given = [name for name in stats if saved.get(name) is not None]
        if given and len(given) != len(stats):
            raise ValueError(f"{', '.join(stats)}: pass all saved statistics or none (then they are recomputed "
                             f"from x)")
        for name in given:
            check_statistic(name, saved[name].shape, normalize(saved[name].dtype, name), shape)

    def check_host(inputs, attrs, workspace=None, **saved):
        x = inputs[0]
        check_saved(check_operands(x.shape, normalize(x.dtype, "x"), []), saved)

    return Face(opdef, backward, backward_host_check=check_host,
                extras={"save_stats": False, **{f"{stat}_out": None for stat in stats}},
                forward_extras=forward_with_stats, saved={**dict.fromkeys(stats), "workspace": None})


# ---------------------------------------------------------------------------------------------------------------
# Graph candidates
# ---------------------------------------------------------------------------------------------------------------
def problem_dims(problem: Problem) -> NormShape:
    x = problem.in_types[0]
    return NormShape(math.prod(x.shape[:-1]), x.shape[-1], x.dtype, tuple(x.shape))


def _make_launch(native, kernel: str, problem: Problem):
    """launch(in_ptrs, out_ptrs, stream): one native forward, beta the third input when there is one (layernorm)."""
    shape, eps = problem_dims(problem), float(problem.attrs["eps"])
    return native_launch(native.bind_forward(shape.rows, shape.cols, shape.dtype, eps, kernel,
                                             len(problem.in_types) > 2))  # a C launch


def candidates(module: str, native) -> tuple[Candidate, ...]:
    """One candidate per kernel of native module ``module``; ``native()`` loads it."""
    result = []
    for name in KERNELS:
        def supports(problem: Problem, name=name):
            shape = problem_dims(problem)
            # Plan buffers are 256-byte aligned: only cols decides between vector and scalar loads.
            return native().unsupported_reason(name, shape.cols, shape.dtype, True, False) or None

        def prepare(problem: Problem, name=name):
            return _make_launch(native(), name, problem)

        result.append(table_candidate(module, name, supports, prepare))
    return tuple(result)
