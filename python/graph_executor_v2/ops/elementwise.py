"""elementwise: binary ops with NumPy broadcasting, unary activations and math, and bias_add.

Ops (each its own OpDef, one native module ``_ops_elementwise`` for all):
- binary ``add sub mul div``: ``y = a (op) b`` with NumPy broadcasting (size-1 dims, missing leading dims).
- unary ``relu gelu gelu_erf silu sigmoid tanh exp neg``: activations follow ``ops/activations.py`` (GELU is the
  tanh form, ``gelu_erf`` the exact one) and ``_common/activation.hpp`` on the GPU.
- ``bias_add``: ``y = x + bias`` with ``x[..., N]`` and ``bias[N]``.
Binary ops take any numeric dtypes and promote them as PyTorch does (``dtypes.result_type``; integer division
truncates toward zero, as ONNX's Div); relu and neg take integers too, the other unary ops float32/float16/bfloat16.
The native kernels take operands of one float dtype and compute in float32; the other problems run on generated
kernels (each op's ``scalar`` rule).

Backward: unary ops take ``(dy, x) -> dx``; binary ops return ``(da, db)``, each summed over the dims its operand
was broadcast along; ``bias_add`` returns ``(dx, dbias)``.

Kernel candidates (``kernels()``), best first:
1. ``vec16``: contiguous operands of one shape, 16-byte vector loads and stores, one pass (needs 16-byte alignment).
2. ``rowcol``: binary broadcast that collapses to a 2-d ``[rows, cols]`` problem where each operand is full, a row
   vector, a column vector or a scalar (bias rows, per-row scales, scalars), vectorized along the columns.
3. ``strided``: general broadcast by strided index math over up to 8 collapsed dims; unary ops element by
   element: the path that always works.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import FLOAT_DTYPES, INT_DTYPES, result_type, to_numpy
from ..ir.types import TensorType
from . import _layout, activations
from ._scalar import expression, literal
from ._base import (Input, OPS, OpDef, Problem, Sample, as_float64, in_ptr, native_launch, out_ptr, register,
                    require_inputs, sample_array, stream_arg, table_candidate)
from ._face import Face

BINARY_OPS = ("add", "sub", "mul", "div")
UNARY_OPS = ("relu", "gelu", "gelu_erf", "silu", "sigmoid", "tanh", "exp", "neg")
INTEGER_UNARY_OPS = ("relu", "neg")  # the unary ops that take integers too
ELEMENTWISE_OPS = BINARY_OPS + UNARY_OPS + ("bias_add",)
MAX_DIMS = 8  # after collapsing adjacent dims that broadcast alike


def _native_module():
    return _native.load("_ops_elementwise")


# ---------------------------------------------------------------------------------------------------------------
# Shapes: NumPy broadcasting, with symbolic dims where they can be resolved.
# ---------------------------------------------------------------------------------------------------------------
def broadcast_shapes(a_shape, b_shape, names=("a", "b")) -> tuple:
    """The NumPy broadcast of two shapes. Symbolic dims broadcast with 1 and with themselves; a symbolic dim
    against an integer > 1 takes the integer (the symbol must bind to it or to 1). Raises ValueError naming both."""
    rank = max(len(a_shape), len(b_shape))
    a = (1,) * (rank - len(a_shape)) + tuple(a_shape)
    b = (1,) * (rank - len(b_shape)) + tuple(b_shape)
    out = []
    for axis, (da, db) in enumerate(zip(a, b)):
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        elif isinstance(da, str) and isinstance(db, int):
            out.append(db)
        elif isinstance(db, str) and isinstance(da, int):
            out.append(da)
        else:
            raise ValueError(f"{names[0]}, {names[1]}: shapes {tuple(a_shape)} and {tuple(b_shape)} do not "
                             f"broadcast (axis {axis - rank}: {da} vs {db})")
    return tuple(out)


def reduce_to_shape(g: np.ndarray, shape) -> np.ndarray:
    """Sums ``g`` (broadcast shape) over the dims along which an operand of ``shape`` was broadcast."""
    shape = tuple(shape)
    extra = g.ndim - len(shape)
    if extra:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _check_dtype(t: TensorType, name: str, like: TensorType | None = None) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float32, float16 or bfloat16, got {t.dtype}")
    if like is not None and t.dtype != like.dtype:
        raise TypeError(f"{name}: expected dtype {like.dtype} (the dtype of the first input), got {t.dtype}")


def _infer_binary(in_types, attrs):
    require_inputs(in_types, ("a", "b"))
    a, b = in_types
    dtype = result_type(a, b)
    if dtype == "bool":
        raise TypeError(f"a, b: expected numeric dtypes (arithmetic on two masks; logical_and/logical_or combine "
                        f"them), got {a.dtype} and {b.dtype}")
    shape = broadcast_shapes(a.shape, b.shape)
    if a.is_concrete and b.is_concrete and len(collapse(a.shape, b.shape)[0]) > MAX_DIMS:
        raise ValueError(f"a, b: at most {MAX_DIMS} dims after collapsing, got shapes {a.shape} and {b.shape}")
    return [TensorType(shape, dtype)]


def _infer_unary(in_types, attrs):
    require_inputs(in_types, ("x",))
    _check_dtype(in_types[0], "x")
    return [in_types[0]]


def _infer_integer_unary(in_types, attrs):
    """relu and neg: also on integers (exact, wrapping as C++: neg of uint8 x is 256 - x)."""
    require_inputs(in_types, ("x",))
    if in_types[0].dtype not in FLOAT_DTYPES + INT_DTYPES:
        raise TypeError(f"x: expected a numeric dtype (float or integer), got {in_types[0].dtype}")
    return [in_types[0]]


def _infer_bias_add(in_types, attrs):
    require_inputs(in_types, ("x", "bias"))
    x, bias = in_types
    _check_dtype(x, "x")
    _check_dtype(bias, "bias", x)
    if x.rank < 1:
        raise ValueError(f"x: expected at least 1 dim (the bias runs along the last), got {x}")
    if bias.rank != 1:
        raise ValueError(f"bias: expected a 1-d array of length x.shape[-1], got {bias}")
    n, nb = x.shape[-1], bias.shape[0]
    if isinstance(n, int) and isinstance(nb, int) and n != nb:
        raise ValueError(f"bias: expected shape ({n},) (x.shape[-1]), got {bias.shape}")
    return [x]


def collapse(a_shape, b_shape) -> tuple[tuple, tuple, tuple]:
    """(out, a, b) shapes of equal rank with adjacent dims merged where both operands broadcast alike (size-1
    output dims dropped). The native launcher does the same; this copy serves shape checks with no GPU."""
    out = broadcast_shapes(a_shape, b_shape)
    rank = len(out)
    a = (1,) * (rank - len(a_shape)) + tuple(a_shape)
    b = (1,) * (rank - len(b_shape)) + tuple(b_shape)
    merged: list[list[int]] = []
    previous = None
    for do, da, db in zip(out, a, b):
        if do == 1:
            continue
        kind = (da == do, db == do)
        if merged and kind == previous:
            merged[-1] = [merged[-1][0] * do, merged[-1][1] * da, merged[-1][2] * db]
        else:
            merged.append([do, da, db])
        previous = kind
    return tuple(m[0] for m in merged), tuple(m[1] for m in merged), tuple(m[2] for m in merged)


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def reference(op: str, *inputs) -> np.ndarray:
    """Forward in float64, or exactly in the promoted integer dtype (wrapping as the GPU does) for integer
    operands."""
    if op in BINARY_OPS:
        promoted = integer_result(inputs)
        if promoted is not None:
            a, b = (np.asarray(x).astype(promoted) for x in inputs)
            if op == "div":
                return truncating_divide(a, b)
            with np.errstate(over="ignore"):
                return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](a, b)
        a, b = as_float64(inputs[0]), as_float64(inputs[1])
        with np.errstate(divide="ignore", invalid="ignore"):  # x / 0 is +-inf or NaN, as on the GPU
            return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op](a, b)
    if op == "bias_add":
        return as_float64(inputs[0]) + as_float64(inputs[1])
    if op in INTEGER_UNARY_OPS and integer_result(inputs[:1]) is not None:
        x = np.asarray(inputs[0])
        return np.negative(x) if op == "neg" else np.maximum(x, x.dtype.type(0))
    x = as_float64(inputs[0])
    if op == "exp":
        return np.exp(x)
    if op == "neg":
        return -x
    if op in UNARY_OPS:
        return activations.apply(op, x)
    raise ValueError(f"op: expected one of {', '.join(ELEMENTWISE_OPS)}, got {op!r}")


def integer_result(inputs) -> np.dtype | None:
    """The NumPy dtype an integer op computes exactly in (PyTorch promotion of its operands), or None when the
    operands promote to a floating type (a reference then computes in float64)."""
    arrays = [np.asarray(x) for x in inputs if x is not None]
    if any(a.dtype.kind not in "iub" for a in arrays):
        return None
    return to_numpy(result_type(*arrays))


def truncating_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division rounding toward zero (C++, ONNX Div); a division by zero gives 0, as the generated
    kernels do (C++ leaves it undefined)."""
    safe = np.where(b == 0, 1, b).astype(np.result_type(a, b))
    with np.errstate(over="ignore"):
        quotient = np.abs(a.astype(np.int64)) // np.abs(safe.astype(np.int64))
        quotient = np.where((a < 0) != (safe < 0), -quotient, quotient)
    return np.where(b == 0, 0, quotient).astype(np.result_type(a, b))


def reference_backward(op: str, dy, *inputs) -> tuple:
    """Gradients in float64: ``dx`` for unary ops, ``(da, db)`` for binary ops, ``(dx, dbias)`` for bias_add."""
    dy = as_float64(dy)
    if op in BINARY_OPS:
        a, b = as_float64(inputs[0]), as_float64(inputs[1])
        if op == "add":
            ga, gb = dy, dy
        elif op == "sub":
            ga, gb = dy, -dy
        elif op == "mul":
            ga, gb = dy * b, dy * a
        else:
            ga, gb = dy / b, -dy * a / (b * b)
        return reduce_to_shape(np.broadcast_to(ga, dy.shape), a.shape), reduce_to_shape(
            np.broadcast_to(gb, dy.shape), b.shape)
    if op == "bias_add":
        return dy, dy.reshape(-1, dy.shape[-1]).sum(axis=0)
    x = as_float64(inputs[0])
    if op == "exp":
        return dy * np.exp(x)
    if op == "neg":
        return -dy
    if op in UNARY_OPS:
        return dy * activations.derivative(op, x)
    raise ValueError(f"op: expected one of {', '.join(ELEMENTWISE_OPS)}, got {op!r}")


# ---------------------------------------------------------------------------------------------------------------
# Per-element C++ for generated kernels (OpDef.scalar): float math as _common/activation.hpp computes it, except the
# tanh-form GELU and its derivative. They use the identity 0.5 (1 + tanh(y)) = sigmoid(2y) = 1 / (1 + e) with
# e = exp(-2y): one exp2 and one reciprocal instead of tanhf's two branches, half the instructions (the GPT-2 MLP's
# generated kernels were compute-bound at 0.67 of copy bandwidth), and no cancellation in 1 + tanh(y) for negative
# x. Emulated in float32 over x in [-12, 12] (exp2 within 2 ulp, reciprocal within 1): GELU within 3 ulp of
# max(|value|, 1), its derivative within 4 (the tanhf forms: 2 and 10).
# ---------------------------------------------------------------------------------------------------------------
# e as exp2(-2 sqrt(2/pi) log2(e) x (1 + 0.044715 x^2)), y = sqrt(2/pi) (x + 0.044715 x^3).
_GELU_EXP2 = "exp2f(-2.302208198144325f * x * (1.0f + 0.044715f * x * x))"
_GELU_TANH = f"__fdividef(x, 1.0f + {_GELU_EXP2})"
_GELU_ERF = "0.5f * x * (1.0f + erff(x * 0.7071067811865476f))"
_SIGMOID = "1.0f / (1.0f + expf(-x))"
_UNARY_BODIES = {
    "gelu": _GELU_TANH,
    "gelu_erf": _GELU_ERF,
    "silu": f"x * ({_SIGMOID})",
    "sigmoid": _SIGMOID,
    "tanh": "tanhf(x)",
    "exp": "expf(x)",
}
# d op(x) / dx, for the unary backward ops: dx = dy * derivative.
_DERIVATIVE_BODIES = {
    "relu": "x > 0.0f ? 1.0f : 0.0f",
    # s + 2 x s (1 - s) dy/dx with s = sigmoid(2y); 1 - s = e s (exact where s is near 1), 1 where e overflows.
    "gelu": f"[](float x) {{ const float e = {_GELU_EXP2}; const float s = __fdividef(1.0f, 1.0f + e); "
            "return s * (1.0f + 1.5957691216057308f * x * fminf(e * s, 1.0f) * (1.0f + 0.134145f * x * x)); }(x)",
    "gelu_erf": "0.5f * (1.0f + erff(x * 0.7071067811865476f)) + x * 0.3989422804014327f * expf(-0.5f * x * x)",
    "silu": f"({_SIGMOID}) * (1.0f + x * (1.0f - ({_SIGMOID})))",
    "sigmoid": f"({_SIGMOID}) * (1.0f - ({_SIGMOID}))",
    "tanh": "1.0f - tanhf(x) * tanhf(x)",
    "exp": "expf(x)",
}


def _unary_scalar(op):
    def scalar(args, attrs, ctype):
        if op == "neg":
            return expression("-x", ("x",), args, ctype)
        if op == "relu":  # NaN passes through, as np.maximum(x, 0) does
            return expression(f"x < {literal(0, ctype)} ? {literal(0, ctype)} : x", ("x",), args, ctype)
        return expression(_UNARY_BODIES[op], ("x",), args, ctype)

    return scalar


def _unary_backward_scalar(op):
    def scalar(args, attrs, ctype):
        return expression(f"dy * ({_DERIVATIVE_BODIES[op]})", ("dy", "x"), args, ctype)

    return scalar


def binary_scalar(op):
    """The scalar rule of ``add sub mul div`` (and bias_add, an add): integer division truncates toward zero as
    ONNX's Div and C++ do, and an integer division by zero gives 0 (the reference does the same)."""
    def scalar(args, attrs, ctype):
        if op == "div" and ctype != "float":
            return expression(f"b == {literal(0, ctype)} ? {literal(0, ctype)} : a / b", ("a", "b"), args, ctype)
        symbol = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
        return expression(f"a {symbol} b", ("a", "b"), args, ctype)

    return scalar


# ---------------------------------------------------------------------------------------------------------------
# Python face: ``ge2.ops.<op>`` for each op, generated (ops/_face.py); the gradients come from here.
# ---------------------------------------------------------------------------------------------------------------
def _backward(op):
    native_op = "add" if op == "bias_add" else op

    def backward(dy, inputs, attrs, kernel, out, stream):
        """``(dx,)`` for unary ops, ``(da, db)`` for binary ops (each summed over its broadcast dims), ``(dx,
        dbias)`` for bias_add; arrays of the first input's kind (or the given ``out`` entries)."""
        views = list(_layout.input_views(dict(zip(_input_names(op), inputs))).values())
        (out_type,) = OPS[op].infer([TensorType(v.shape, v.dtype) for v in views], {})
        vdy = _layout.checked_view(dy, "dy", out_type.shape, out_type.dtype, views[0].device)
        grads = [_layout.output(None if out is None else out[i], inputs[0], f"out[{i}]", tuple(v.shape),
                                out_type.dtype, v.device) for i, v in enumerate(views)]
        native, handle = _native_module(), _device.stream_handle(stream)
        if op in UNARY_OPS:
            native.unary_backward(op, vdy.ptr, views[0].ptr, grads[0][1].ptr, out_type.numel, out_type.dtype, handle)
        else:
            native.binary_backward(native_op, vdy.ptr, views[0].ptr, views[1].ptr, grads[0][1].ptr, grads[1][1].ptr,
                                   list(views[0].shape), list(views[1].shape), out_type.dtype, handle)
        return tuple(array for array, _ in grads)

    return backward


def _input_names(op):
    return tuple(i.name for i in OPS[op].inputs)


# ---------------------------------------------------------------------------------------------------------------
# Op definitions: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _make_candidate(name, op):
    native_op = "add" if op == "bias_add" else op

    def supports(problem: Problem):
        if not _native.is_built("_ops_elementwise"):
            return "native module _ops_elementwise is not built"
        dtypes = {t.dtype for t in problem.in_types + problem.out_types}
        if len(dtypes) > 1 or not dtypes <= set(FLOAT_DTYPES):
            return f"takes operands of one float dtype (float32, float16, bfloat16), got {', '.join(sorted(dtypes))}"
        shapes = [list(t.shape) for t in problem.in_types]
        return _native_module().unsupported_reason(name, native_op, *shapes, problem.out_types[0].dtype) or None

    def prepare(problem: Problem):
        native = _native_module()
        dtype = problem.out_types[0].dtype
        if op in UNARY_OPS:  # C launches: the arguments (and the broadcast of a binary op) are converted once
            return native_launch(native.bind_unary(native_op, problem.out_types[0].numel, dtype, name))
        a_shape, b_shape = (list(t.shape) for t in problem.in_types)
        return native_launch(native.bind_binary(native_op, a_shape, b_shape, dtype, name))

    return table_candidate("_ops_elementwise", name, supports, prepare)


def _candidates(op):
    if op in UNARY_OPS:
        return (_make_candidate("vec16", op),
                _make_candidate("strided", op))
    return (_make_candidate("vec16", op),
            _make_candidate("rowcol", op),
            _make_candidate("strided", op))


def _binary_def(op):
    def ref(inputs, attrs):
        return [reference(op, *inputs)]

    def ref_backward(inputs, outputs, out_grads, attrs):
        return list(reference_backward(op, out_grads[0], *inputs))

    symbol = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
    divisor = op == "div"  # samples: b nonzero

    def samples(rng):
        return [Sample((sample_array(rng, 4, 6), sample_array(rng, 6, positive=divisor)), {}, "a row broadcast"),
                Sample((sample_array(rng, 3, 5), sample_array(rng, 3, 5, positive=divisor)), {}, "same shape, odd"),
                Sample((sample_array(rng, 4, 6, dtype="float16"), sample_array(rng, 6, positive=divisor,
                                                                               dtype="float16")), {}, "float16")]

    return OpDef(name=op, inputs=(Input("a"), Input("b")), outputs=("y",), attrs=(), infer=_infer_binary,
                 samples=samples,
                 reference=ref, reference_backward=ref_backward, candidates=_candidates(op), scalar=binary_scalar(op),
                 doc=f"{op}: y = a {symbol} b with NumPy broadcasting; backward sums each gradient over the dims "
                     f"its operand was broadcast along.")


def _unary_def(op):
    def ref(inputs, attrs):
        return [reference(op, inputs[0])]

    def ref_backward(inputs, outputs, out_grads, attrs):
        return [reference_backward(op, out_grads[0], inputs[0])]

    infer = _infer_integer_unary if op in INTEGER_UNARY_OPS else _infer_unary
    return OpDef(name=op, inputs=(Input("x"),), outputs=("y",), attrs=(), infer=infer, reference=ref,
                 reference_backward=ref_backward, candidates=_candidates(op), scalar=_unary_scalar(op),
                 doc=f"{op}: y = {op}(x) elementwise; backward dx = dy * {op}'(x).")


def _bias_add_def():
    def ref(inputs, attrs):
        return [reference("bias_add", *inputs)]

    def ref_backward(inputs, outputs, out_grads, attrs):
        return list(reference_backward("bias_add", out_grads[0], *inputs))

    return OpDef(name="bias_add", inputs=(Input("x"), Input("bias")), outputs=("y",), attrs=(),
                 samples=lambda rng: [Sample((sample_array(rng, 3, 4, 6), sample_array(rng, 6)))],
                 infer=_infer_bias_add, reference=ref, reference_backward=ref_backward,
                 candidates=_candidates("bias_add")[1:], scalar=binary_scalar("add"),
                 doc="bias_add: y = x + bias, x[..., N], bias[N]; backward (dy, dy summed over all but the last "
                     "dim).")


for _op in BINARY_OPS:
    register(_binary_def(_op))
for _op in UNARY_OPS:
    register(_unary_def(_op))
register(_bias_add_def())
for _op in ELEMENTWISE_OPS:
    Face(OPS[_op], _backward(_op), in_place=True)


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: unary ops through ``<op>_backward(dy, x)``; mul/div through ``<op>_backward(dy, a, b) -> (da, db)``;
# add/sub/bias_add as sums of dy (no forward value is kept alive for them, so the forward still fuses).
# ---------------------------------------------------------------------------------------------------------------
from . import _grad  # noqa: E402  (the grad section stays separate from the face above)
from ._base import attach_grad  # noqa: E402


def _unary_backward_def(op):
    def launch_for(problem: Problem):
        numel, dtype = problem.out_types[0].numel, problem.out_types[0].dtype
        return native_launch(_native_module().unary_backward, op, in_ptr(0), in_ptr(1), out_ptr(0), numel, dtype,
                             stream_arg())

    return _grad.register_backward(OpDef(
        name=f"{op}_backward", inputs=(Input("dy"), Input("x")), outputs=("dx",), attrs=(),
        infer=lambda in_types, attrs: [_infer_unary(in_types[1:], attrs)[0]],
        reference=lambda inputs, attrs: [reference_backward(op, inputs[0], inputs[1])],
        candidates=(_grad.native_candidate("_ops_elementwise", f"dx = dy * {op}'(x)", launch_for),),
        scalar=_unary_backward_scalar(op),
        doc=f"{op}_backward(dy, x) -> dx = dy * {op}'(x)"))


def _binary_backward_def(op):
    def launch_for(problem: Problem):
        _, a, b = problem.in_types
        return native_launch(_native_module().binary_backward, op, in_ptr(0), in_ptr(1), in_ptr(2), out_ptr(0),
                             out_ptr(1), list(a.shape), list(b.shape), a.dtype, stream_arg())

    return _grad.register_backward(OpDef(
        name=f"{op}_backward", inputs=(Input("dy"), Input("a"), Input("b")), outputs=("da", "db"), attrs=(),
        infer=lambda in_types, attrs: [in_types[1], in_types[2]],
        reference=lambda inputs, attrs: list(reference_backward(op, *inputs)),
        candidates=(_grad.native_candidate("_ops_elementwise", f"(da, db) of a {op} b, summed over broadcast dims",
                                           launch_for),),
        doc=f"{op}_backward(dy, a, b) -> (da, db) of y = a {op} b, each summed over its broadcast dims"))


for _op in UNARY_OPS:
    if _op != "neg":
        _unary_backward_def(_op)
for _op in ("mul", "div"):
    _binary_backward_def(_op)


def _grad_unary(op):
    def rule(g, node, dys):
        (dy,) = dys
        if node.inputs[0].type.dtype not in FLOAT_DTYPES:  # relu, neg of integers: no gradient
            return [None]
        if op == "neg":
            return [g.neg(dy)]
        return [getattr(g, f"{op}_backward")(dy, node.inputs[0])]

    return rule


def _grad_add(g, node, dys):
    (dy,) = dys
    a, b = node.inputs
    return [_grad.sum_to(g, dy, a.type.shape), _grad.sum_to(g, dy, b.type.shape)]


def _grad_sub(g, node, dys):
    (dy,) = dys
    a, b = node.inputs
    return [_grad.sum_to(g, dy, a.type.shape), _grad.sum_to(g, g.neg(dy), b.type.shape)]


def _grad_mul_div(op):
    def rule(g, node, dys):
        return list(getattr(g, f"{op}_backward")(dys[0], *node.inputs))

    return rule


def _grad_bias_add(g, node, dys):
    (dy,) = dys
    return [dy, g.sum(dy, axis=tuple(range(dy.type.rank - 1))) if dy.type.rank > 1 else dy]


for _op in UNARY_OPS:
    attach_grad(OPS[_op], _grad_unary(_op))
attach_grad(OPS["add"], _grad_add)
attach_grad(OPS["sub"], _grad_sub)
attach_grad(OPS["mul"], _grad_mul_div("mul"))
attach_grad(OPS["div"], _grad_mul_div("div"))
attach_grad(OPS["bias_add"], _grad_bias_add)
