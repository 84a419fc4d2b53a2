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
4. ``column_wave``: the same problems and kernel launched as about one wave of resident blocks: tiles up to 32
   vectors wide, the reduced axis split into float32 partials (combined in a fixed order by a second kernel) until
   the blocks fill every SM, each thread's batch of loads in flight together. Autotuning times it against
   ``column`` (EfficientNet's squeeze-and-excitation means, [32, H*W, C]).
5. ``generic``: any set of axes, e.g. (0, 2) of a 3-d array: the path that always works.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import FLOAT_DTYPES
from ..ir.types import TensorType
from . import _layout
from ._base import (Attr, Input, OPS, OpDef, Problem, Sample, as_float64, in_ptr, native_launch, out_ptr, register,
                    sample_array, stream_arg, table_candidate)
from ._face import FACES, Face

OP_NAMES = ("sum", "mean", "max")


def _native_module():
    return _native.load("_ops_reduce")


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes, dtypes and arguments only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def _check_op(op):
    if op not in OP_NAMES:
        raise ValueError(f"op: expected one of {', '.join(OP_NAMES)}, got {op!r}")


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
# Python face: ``ge2.ops.sum``, ``ops.mean``, ``ops.max``, generated (ops/_face.py); the gradients come from here.
# ---------------------------------------------------------------------------------------------------------------
def _backward(op):
    def backward(dy, inputs, attrs, kernel, out, stream, y=None):
        """``(dx,)``, dx of x's shape; max reads x and the forward output ``y`` (recomputed when not given)."""
        (x,) = inputs
        vx = _device.view_of(x, "x")
        problem = check_problem(op, vx.shape, vx.dtype, attrs["axis"], attrs["keepdims"])
        vdy = _layout.checked_view(dy, "dy", problem.out_shape, problem.dtype, vx.device)
        reads_values = op == "max"
        vy = None
        if reads_values:
            if y is None:
                y = FACES[op].forward(x, attrs["axis"], attrs["keepdims"], stream=stream)
            vy = _layout.checked_view(y, "y", problem.out_shape, problem.dtype, vx.device)
            vx = _layout.checked_view(x, "x", problem.shape, problem.dtype, vx.device)
        dx, vdx = _layout.output(None if out is None else out[0], dy, "out", problem.shape, problem.dtype, vx.device)
        _native_module().backward(op, vdy.ptr, vx.ptr if reads_values else 0, vy.ptr if reads_values else 0,
                                  vdx.ptr, list(problem.shape), list(problem.axes), problem.dtype,
                                  _device.stream_handle(stream))
        return (dx,)

    return backward


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


def _make_candidate(op, name):
    def supports(problem: Problem):
        x = problem.in_types[0]
        axes = normalize_axes(problem.attrs["axis"], x.rank)
        return _native_module().unsupported_reason(name, list(x.shape), list(axes)) or None

    def prepare(problem: Problem):
        x = problem.in_types[0]
        shape, axes = list(x.shape), list(normalize_axes(problem.attrs["axis"], x.rank))
        return native_launch(_native_module().forward, op, in_ptr(0), out_ptr(0), shape, axes, x.dtype, name,
                             stream_arg())

    return table_candidate("_ops_reduce", name, supports, prepare)


def _samples(op):
    def samples(rng):
        # max: distinct values (its gradient goes to the one maximum, so ties would make the gradient ambiguous)
        x = rng.permutation(24).reshape(4, 6).astype(np.float32) if op == "max" else sample_array(rng, 4, 6)
        return [Sample((x,), {"axis": 1}), Sample((sample_array(rng, 3, 5),), {"axis": None}, "every axis")]

    return samples


def _register(op):
    return register(OpDef(
        name=op,
        samples=_samples(op),
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
            _make_candidate(op, "row_warp"),
            _make_candidate(op, "row_block"),
            _make_candidate(op, "column"),
            _make_candidate(op, "column_wave"),
            _make_candidate(op, "generic"),
        ),
        doc=__doc__,
    ))


SUM = _register("sum")
MEAN = _register("mean")
MAX = _register("max")
for _op in OP_NAMES:
    Face(OPS[_op], _backward(_op), saved=("y",))


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
        reads_values = op == "max"
        return native_launch(_native_module().backward, op, in_ptr(0), in_ptr(1) if reads_values else 0,
                             in_ptr(2) if reads_values else 0, out_ptr(0), shape, axes, x.dtype, stream_arg())

    return _grad.register_backward(OpDef(
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
