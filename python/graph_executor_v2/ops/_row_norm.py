"""What layernorm and rmsnorm share: validation, the device-array plumbing and the kernel candidates.

Both normalize the last axis of ``x`` (any rank >= 1, seen as ``rows x cols``) with parameters of shape
``(cols,)`` and the dtype of ``x``, float32 statistics inside; their native modules instantiate one set of kernels
(``backends/cuda/ops/_common/row_norm*.hpp``), ``centered`` (layernorm: subtract the mean, add beta) or not
(rmsnorm). The op modules keep what differs: the math of the references and the native call signatures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import device as _device
from ..dtypes import FLOAT_DTYPES, normalize
from ..ir.types import TensorType
from . import _layout
from ._base import Candidate, Problem

_FLOAT32_MAX = float(np.finfo(np.float32).max)
KERNELS = ("auto", "warp_per_row", "block_per_row", "multipass")

# (name, priority, description, always_works): the native kernels() table says the same with the constraints.
CANDIDATES = (
    ("warp_per_row", 30, "one warp per row, the row held in registers (cols <= 1024)", False),
    ("block_per_row", 20, "128-1024 threads per row, the row held in registers (cols <= 32768)", False),
    ("multipass", 10, "one block per row re-reading the row for each pass: any cols", True),
)


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


def check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"eps: expected a float, got {type(eps).__name__} ({eps!r})")
    problem = eps_problem(eps)
    if problem:
        raise ValueError(f"eps: {problem}, got {eps!r}")
    return float(eps)


def check_kernel(kernel) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {', '.join(KERNELS)}, got {kernel!r}")


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


def check_host_statistic(value, argument: str, shape: NormShape) -> None:
    """check_statistic for a host array given to backward_numpy (None: not given)."""
    if value is None:
        return
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{argument}: expected a NumPy array, got {type(value).__name__}")
    check_statistic(argument, value.shape, np.dtype(value.dtype).name, shape)


def infer(in_types, attrs, names) -> list[TensorType]:
    """OpDef.infer: ``names`` are the input names, x first, then the (cols,) parameters."""
    for name, t in zip(names, in_types):
        if t is None:
            raise ValueError(f"input '{name}' is required")
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
    check_kernel(kernel)
    _device.require_gpu(f"{op}.backward_workspace_bytes")
    return native().backward_workspace_bytes(shape.rows, shape.cols, shape.dtype, kernel, bool(aligned))


def address(view) -> int:
    """The device address of an optional view (0 for an absent one, as the native modules take it)."""
    return 0 if view is None else view.ptr


def is_aligned(*views) -> bool:
    return all(v.ptr % 16 == 0 for v in views)


def upload(arrays: dict) -> dict:
    """Host arrays -> DeviceArrays (None stays None)."""
    return {name: None if array is None else _layout.to_device(array) for name, array in arrays.items()}


# ---------------------------------------------------------------------------------------------------------------
# Graph candidates
# ---------------------------------------------------------------------------------------------------------------
def problem_dims(problem: Problem) -> NormShape:
    x = problem.in_types[0]
    return NormShape(math.prod(x.shape[:-1]), x.shape[-1], x.dtype, tuple(x.shape))


def candidates(native, make_launch) -> tuple[Candidate, ...]:
    """One candidate per kernel. ``native()`` loads the op's module; ``make_launch(module, kernel, shape, eps)``
    returns the launch(in_ptrs, out_ptrs, stream) making the one native call."""
    result = []
    for name, priority, description, always_works in CANDIDATES:
        def supports(problem: Problem, name=name):
            shape = problem_dims(problem)
            # Plan buffers are 256-byte aligned: only cols decides between vector and scalar loads.
            return native().unsupported_reason(name, shape.cols, shape.dtype, True, False) or None

        def prepare(problem: Problem, name=name):
            return make_launch(native(), name, problem_dims(problem), float(problem.attrs["eps"]))

        result.append(Candidate(name, priority, description, supports, prepare, always_works))
    return tuple(result)
