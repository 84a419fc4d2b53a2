"""Reductions ``sum``, ``mean``, ``max`` over ``axis`` (an int, a tuple of ints, or None for every axis) with
``keepdims``; float32/float16/bfloat16 data, float32 accumulation, the result in the input dtype.

Reducing over an axis of size 0 is rejected (ValueError naming ``axis``): ``max`` of nothing has no value, and
``sum``/``mean`` reject it too rather than invent 0 and NaN. ``max`` propagates NaN, as NumPy does. Results are
deterministic: every kernel combines in a fixed order.

Backward: ``sum`` broadcasts dy over the reduced axes, ``mean`` the same divided by the reduced count, ``max``
gives dy to the elements equal to the maximum, split equally among ties (as ``torch.amax``), 0 elsewhere.

Before choosing a kernel the problem is simplified: size-1 axes dropped, neighbouring axes that are both reduced or
both kept merged. Kernel candidates (``kernels()``), best first:
1. ``row_warp``: reduced axes trailing (Rows) and runs of at most 4096: a group of lanes per output.
2. ``row_block``: Rows of any length: a block per output; few long rows (the all-reduce included) are split over
   blocks into float32 partials combined in a fixed order by a second kernel.
3. ``column``: reduced axes followed by kept ones ([outer, length, inner]): column tiles with coalesced rows.
4. ``generic``: any set of axes, e.g. (0, 2) of a 3-d array: the path that always works.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import FLOAT_DTYPES, normalize
from ..ir.types import TensorType
from . import _layout
from ._base import Attr, Candidate, Input, OpDef, Problem, as_float64, register

OP_NAMES = ("sum", "mean", "max")
KERNELS = ("auto", "row_warp", "row_block", "column", "generic")


def _native_module():
    return _native.load("_ops_reduce")


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes, dtypes and arguments only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def _check_op(op):
    if op not in OP_NAMES:
        raise ValueError(f"op: expected one of {', '.join(OP_NAMES)}, got {op!r}")


def _check_kernel(kernel):
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {', '.join(KERNELS)}, got {kernel!r}")


def _check_dtype(dtype, argument):
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{argument}: expected dtype float32, float16 or bfloat16, got {dtype}")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def normalize_axes(axis, ndim: int) -> tuple[int, ...]:
    """The reduced axes as a sorted tuple of indices in [0, ndim); None means every axis."""
    if axis is None:
        return tuple(range(ndim))
    if _is_int(axis):
        axes = (axis,)
    elif isinstance(axis, (tuple, list)):
        axes = tuple(axis)
        for entry in axes:
            if not _is_int(entry):
                raise TypeError(f"axis: expected ints, got {type(entry).__name__} ({entry!r}) in {axis!r}")
    else:
        raise TypeError(f"axis: expected None, an int or a tuple of ints, got {type(axis).__name__} ({axis!r})")
    normalized = []
    for entry in axes:
        if not -ndim <= entry < ndim:
            raise ValueError(f"axis: expected axes in [{-ndim}, {ndim}) for an array of {ndim} dimension(s), "
                             f"got {entry}")
        if int(entry) % ndim in normalized:
            raise ValueError(f"axis: axis {int(entry) % ndim} is given more than once in {axis!r}")
        normalized.append(int(entry) % ndim)
    return tuple(sorted(normalized))


def _check_not_empty(op, shape, axes):
    for a in axes:
        if shape[a] == 0:
            raise ValueError(f"axis: cannot {op} over axis {a} of size 0 (x has shape {tuple(shape)}): an empty "
                             "reduction has no value")


def output_shape(shape, axes, keepdims) -> tuple:
    if keepdims:
        return tuple(1 if d in axes else extent for d, extent in enumerate(shape))
    return tuple(extent for d, extent in enumerate(shape) if d not in axes)


@dataclass(frozen=True)
class ReduceProblem:
    """A validated problem: the shape of x, the normalized reduced axes, the shape of y and the dtype."""

    op: str
    shape: tuple
    axes: tuple
    out_shape: tuple
    dtype: str


def _check_axes(op, shape, axis, keepdims) -> tuple[int, ...]:
    _check_op(op)
    if not isinstance(keepdims, (bool, np.bool_)):
        raise TypeError(f"keepdims: expected a bool, got {type(keepdims).__name__} ({keepdims!r})")
    axes = normalize_axes(axis, len(shape))
    _check_not_empty(op, shape, axes)
    return axes


def check_problem(op, shape, dtype, axis, keepdims) -> ReduceProblem:
    """Validates a reduction; raises ValueError/TypeError naming the argument, the expectation and the value."""
    axes = _check_axes(op, shape, axis, keepdims)
    _check_dtype(dtype, "x")
    return ReduceProblem(op, tuple(shape), axes, output_shape(shape, axes, bool(keepdims)), dtype)


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
_NUMPY_REDUCTIONS = {"sum": np.sum, "mean": np.mean, "max": np.max}


def reference(op, x, axis=None, keepdims=False):
    """op(x) over ``axis`` in float64."""
    x64 = as_float64(x)
    axes = _check_axes(op, x64.shape, axis, keepdims)
    return np.asarray(_NUMPY_REDUCTIONS[op](x64, axis=axes, keepdims=bool(keepdims)))


def reference_backward(op, dy, x, axis=None, keepdims=False):
    """dx in float64 from the output gradient ``dy`` (shaped like the forward output) and ``x``."""
    x64 = as_float64(x)
    axes = _check_axes(op, x64.shape, axis, keepdims)
    dy64 = as_float64(dy).reshape(output_shape(x64.shape, axes, True))
    if op == "sum":
        return np.broadcast_to(dy64, x64.shape).copy()
    count = int(np.prod([x64.shape[a] for a in axes], dtype=np.int64))
    if op == "mean":
        return np.broadcast_to(dy64 / count, x64.shape).copy()
    maximum = x64.max(axis=axes, keepdims=True)
    ties = (x64 == maximum) | (np.isnan(x64) & np.isnan(maximum))
    return dy64 * ties / ties.sum(axis=axes, keepdims=True)


# ---------------------------------------------------------------------------------------------------------------
# Python face
# ---------------------------------------------------------------------------------------------------------------
def _host_array(value, argument):
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{argument}: expected a NumPy array, got {type(value).__name__}")
    return value


def _check_native_kernel(kernel, problem: ReduceProblem):
    if kernel != "auto":
        reason = _native_module().unsupported_reason(kernel, list(problem.shape), list(problem.axes))
        if reason:
            raise ValueError(f"kernel: '{kernel}' cannot run this problem: {reason}")


def forward_numpy(op, x, axis=None, keepdims=False, kernel="auto"):
    """Host array in, host array out (runs on the GPU)."""
    _host_array(x, "x")
    problem = check_problem(op, x.shape, normalize(x.dtype, "x"), axis, keepdims)
    _check_kernel(kernel)
    _device.require_gpu(f"{op}.forward_numpy")
    _check_native_kernel(kernel, problem)
    device_x = _device.runtime().DeviceArray.from_numpy(np.asarray(x, order="C"))  # 0-d stays 0-d
    return forward(op, device_x, axis=axis, keepdims=keepdims, kernel=kernel).numpy()


def forward(op, x, axis=None, keepdims=False, kernel="auto", out=None, stream=None):
    """Device array (DeviceArray, torch, CuPy) in, device array out, zero-copy. ``out`` is written when given;
    otherwise the output is allocated as the same kind of array as ``x``."""
    vx = _device.view_of(x, "x")
    problem = check_problem(op, vx.shape, vx.dtype, axis, keepdims)
    _check_kernel(kernel)
    if not vx.is_contiguous:
        raise ValueError(f"x: expected a contiguous array, got strides {vx.strides} for shape {vx.shape}")
    _check_native_kernel(kernel, problem)
    y, vy = _layout.output(out, x, "out", problem.out_shape, vx.dtype, vx.device)
    _native_module().forward(op, vx.ptr, vy.ptr, list(problem.shape), list(problem.axes), vx.dtype, kernel,
                             _device.stream_handle(stream))
    return y


def _check_backward(op, dy_shape, dy_dtype, x_shape, x_dtype, y_shape, y_dtype, axis, keepdims) -> ReduceProblem:
    problem = check_problem(op, x_shape, x_dtype, axis, keepdims)
    if tuple(dy_shape) != problem.out_shape:
        raise ValueError(f"dy: expected shape {problem.out_shape} (the output of {op} with keepdims={keepdims}), "
                         f"got {tuple(dy_shape)}")
    if dy_dtype != x_dtype:
        raise TypeError(f"dy: expected dtype {x_dtype} (the dtype of x), got {dy_dtype}")
    if op == "max":
        if y_shape is None:
            raise ValueError("y: required for op 'max' (the forward output, to find the maximum's position)")
        if tuple(y_shape) != problem.out_shape:
            raise ValueError(f"y: expected shape {problem.out_shape} (the forward output), got {tuple(y_shape)}")
        if y_dtype != x_dtype:
            raise TypeError(f"y: expected dtype {x_dtype} (the dtype of x), got {y_dtype}")
    return problem


def backward_numpy(op, dy, x, y=None, axis=None, keepdims=False):
    """Host arrays in (output gradient, input, and for max the forward output), host dx out (runs on the GPU)."""
    _host_array(dy, "dy")
    _host_array(x, "x")
    if y is not None:
        _host_array(y, "y")
    _check_backward(op, dy.shape, normalize(dy.dtype, "dy"), x.shape, normalize(x.dtype, "x"),
                    None if y is None else y.shape, None if y is None else normalize(y.dtype, "y"), axis, keepdims)
    _device.require_gpu(f"{op}.backward_numpy")
    # np.asarray keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d).
    upload = lambda a: None if a is None else _device.runtime().DeviceArray.from_numpy(np.asarray(a, order="C"))  # noqa
    return backward(op, upload(dy), upload(x), upload(y), axis=axis, keepdims=keepdims).numpy()


def backward(op, dy, x, y=None, axis=None, keepdims=False, out=None, stream=None):
    """Device arrays in: returns dx (x's shape) as a device array of dy's kind (or ``out``). ``y``, the forward
    output, is required for max; sum and mean read only dy."""
    vdy, vx = _device.view_of(dy, "dy"), _device.view_of(x, "x")
    vy = None if y is None else _device.view_of(y, "y")
    problem = _check_backward(op, vdy.shape, vdy.dtype, vx.shape, vx.dtype, None if vy is None else vy.shape,
                              None if vy is None else vy.dtype, axis, keepdims)
    for name, view in (("dy", vdy), ("x", vx), ("y", vy)):
        if view is None:
            continue
        if not view.is_contiguous:
            raise ValueError(f"{name}: expected a contiguous array, got strides {view.strides} for shape {view.shape}")
        if view.device != vdy.device:
            raise ValueError(f"{name}: expected an array on cuda:{vdy.device} (the device of dy), "
                             f"got cuda:{view.device}")
    dx, vdx = _layout.output(out, dy, "out", problem.shape, problem.dtype, vdy.device)
    reads_values = op == "max"
    _native_module().backward(op, vdy.ptr, vx.ptr if reads_values else 0, vy.ptr if reads_values else 0, vdx.ptr,
                              list(problem.shape), list(problem.axes), problem.dtype, _device.stream_handle(stream))
    return dx


def kernels() -> list[dict]:
    """The kernel variants with their constraints, as the native module reports them."""
    return _native_module().kernels()


# ---------------------------------------------------------------------------------------------------------------
# Op definitions: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _AxisAttr(Attr):
    """``axis``: None, an int or a tuple of ints. A list (what a JSON round trip gives back) becomes a tuple, so
    attributes stay hashable and compare equal across save and load."""

    def validate(self, value, where):
        if isinstance(value, list):
            value = tuple(value)
        if isinstance(value, tuple):
            value = tuple(int(v) if _is_int(v) else v for v in value)
        elif _is_int(value):
            value = int(value)
        return super().validate(value, where)


def _make_infer(op):
    def infer(in_types, attrs):
        (x,) = in_types
        if x is None:
            raise ValueError("input 'x' is required")
        _check_dtype(x.dtype, "x")
        axes = normalize_axes(attrs["axis"], x.rank)
        _check_not_empty(op, x.shape, axes)  # symbolic dims are not 0
        return [TensorType(output_shape(x.shape, axes, attrs["keepdims"]), x.dtype)]

    return infer


def _make_candidate(op, name, priority, description, always_works=False):
    def supports(problem: Problem):
        x = problem.in_types[0]
        axes = normalize_axes(problem.attrs["axis"], x.rank)
        return _native_module().unsupported_reason(name, list(x.shape), list(axes)) or None

    def prepare(problem: Problem):
        x = problem.in_types[0]
        shape, axes = list(x.shape), list(normalize_axes(problem.attrs["axis"], x.rank))
        native_forward, dtype = _native_module().forward, x.dtype

        def launch(ins, outs, stream):
            native_forward(op, ins[0], outs[0], shape, axes, dtype, name, stream)

        return launch

    return Candidate(name, priority, description, supports, prepare, always_works)


def _register(op):
    return register(OpDef(
        name=op,
        inputs=(Input("x"),),
        outputs=("y",),
        attrs=(
            _AxisAttr("axis", (int, tuple), None, doc="reduced axes: an int, a tuple of ints, or None for all"),
            Attr("keepdims", bool, False, doc="keep reduced axes as size 1"),
        ),
        infer=_make_infer(op),
        reference=lambda inputs, attrs: [reference(op, inputs[0], attrs["axis"], attrs["keepdims"])],
        reference_backward=lambda inputs, outputs, out_grads, attrs: [
            reference_backward(op, out_grads[0], inputs[0], attrs["axis"], attrs["keepdims"])],
        candidates=(
            _make_candidate(op, "row_warp", 30, "trailing reduced axes, runs <= 4096: lanes per output"),
            _make_candidate(op, "row_block", 20, "trailing reduced axes: a block per output, split when few"),
            _make_candidate(op, "column", 20, "[outer, length, inner]: column tiles, coalesced rows"),
            _make_candidate(op, "generic", 5, "any axes: a warp per output walking the reduced indices",
                            always_works=True),
        ),
        doc=__doc__,
    ))


SUM = _register("sum")
MEAN = _register("mean")
MAX = _register("max")


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: ``<op>_backward(dy, x, y?)`` (y, the forward output, only for max), the native backward.
# ---------------------------------------------------------------------------------------------------------------
from . import _grad  # noqa: E402  (the grad section stays separate from the face above)
from ._base import attach_grad  # noqa: E402


def _register_backward(op):
    def infer(in_types, attrs):
        dy, x, y = in_types
        (expected,) = _make_infer(op)([x], attrs)
        if dy.shape != expected.shape or dy.dtype != x.dtype:
            raise ValueError(f"dy: expected {expected} (the {op} output type), got {dy}")
        if op == "max" and y is None:
            raise ValueError("y: required for max_backward (the forward output)")
        return [x]

    def prepare(problem: Problem):
        x = problem.in_types[1]
        shape, axes = list(x.shape), list(normalize_axes(problem.attrs["axis"], x.rank))
        native_backward, dtype = _native_module().backward, x.dtype
        reads_values = op == "max"

        def launch(ins, outs, stream):
            native_backward(op, ins[0], ins[1] if reads_values else 0, ins[2] if reads_values else 0, outs[0],
                            shape, axes, dtype, stream)

        return launch

    return register(OpDef(
        name=f"{op}_backward",
        inputs=(Input("dy"), Input("x"), Input("y", optional=True)),
        outputs=("dx",),
        attrs=(_AxisAttr("axis", (int, tuple), None), Attr("keepdims", bool, False)),
        infer=infer,
        reference=lambda inputs, attrs: [reference_backward(op, inputs[0], inputs[1], attrs["axis"],
                                                            attrs["keepdims"])],
        candidates=(_grad.native_candidate("_ops_reduce", f"dx of {op}: dy broadcast over the reduced axes",
                                           prepare),),
        doc=f"{op}_backward(dy, x, y?) -> dx of y = {op}(x, axis, keepdims)",
    ))


def _grad_rule(op):
    def rule(g, node, dys):
        x = node.inputs[0]
        y = node.outputs[0] if op == "max" else None
        return [getattr(g, f"{op}_backward")(dys[0], x, y, **node.attrs)]

    return rule


for _op, _opdef in (("sum", SUM), ("mean", MEAN), ("max", MAX)):
    _register_backward(_op)
    attach_grad(_opdef, _grad_rule(_op))
