"""quantize_fp8: ``y = FP8(x * scale)`` and ``amax = max |x|``, in one pass over x; and ``fp8_scale_update``,
delayed scaling's per-tensor state update.

x is float32, float16 or bfloat16; ``scale`` a float32 scalar (a 0-d or one-element tensor: it stays on the device,
so delayed scaling never syncs the host); y is ``dtype`` (float8_e4m3fn, the default, or float8_e5m2), rounded to
nearest even and saturating like ``cast`` (beyond the largest finite value, infinities included, gives it; NaN
stays NaN). ``amax`` is a 0-d float32, the largest ``|x|`` before scaling (what delayed scaling records to choose
the next scale), NaN when x holds a NaN, 0 for an empty x. The product ``x * scale`` is rounded to float32 before
the cast, as the kernel computes it.

The native kernel (``_ops_quantize_fp8``) reduces the amax per block over the float bits of ``|x|`` and the block
that finishes last writes it: no separate amax kernel, and no memset of the amax before the kernel (the amax is
written, not accumulated into, so a captured training step holds one node per quantize; the kernels' README says
how). FP8 values carry no gradient (autograd differentiates the float
dtypes); ``Trainer(amp="fp8")`` builds its FP8 backward itself.

``fp8_scale_update(history_0, scale_0, amax_0, history_1, ...) -> (history_0, scale_0, scale_inv_0, history_1, ...)``
(Transformer Engine's delayed scaling, "max" over the history), for any number of tensors of one FP8 format: each
step's amax enters its history first (newest first, the oldest drops out), and the next scale is
``fp8_max(dtype) / (max(history) * 2**margin)``. An all-zero history keeps the previous scale; a non-finite amax (an
overflowed step) leaves history and scale as they were, so one overflow never poisons the scale. All float32,
updated on the device inside a captured training step: no host synchronization. The kernel updates up to 64 tensors
a launch (one block each), so a training step's hundreds of FP8 tensors cost a few launches, not one each.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from ..dtypes import FLOAT8_DTYPES, FLOAT8_MAX, FLOAT_DTYPES, saturate_to_float8, to_numpy
from ..ir.types import TensorType
from ..ir.schema import VARIADIC_OUTPUTS
from ._base import (Attr, Input, OpDef, Problem, Sample, as_float64, in_ptr, in_ptrs, native_launch, out_ptr,
                    out_ptrs, register, require_inputs, sample_array, stream_arg, table_candidate)
from . import activations
from ._face import Face


def _native_module():
    return _native.load("_ops_quantize_fp8")


def reference(x, scale, dtype: str = "float8_e4m3fn"):
    """(y, amax) in float64: y exactly representable in ``dtype``, amax a 0-d array."""
    _check_float8(dtype, "dtype")
    x32 = np.asarray(x).astype(np.float32)
    scaled = x32 * np.float32(np.asarray(scale, np.float32).reshape(()))  # float32 product, as the kernel
    magnitudes = np.abs(x32.astype(np.float64))
    amax = float(magnitudes.max()) if magnitudes.size else 0.0
    if magnitudes.size and np.isnan(magnitudes).any():
        amax = float("nan")
    return saturate_to_float8(scaled, dtype), np.asarray(amax)


def check_scale(t, argument: str) -> None:
    """A per-tensor scale (or amax) of FP8 ops: float32, one element (0-d or shape (1,))."""
    if t.dtype != "float32":
        raise TypeError(f"{argument}: expected a float32 scalar, got dtype {t.dtype}")
    if t.is_concrete and t.numel != 1:
        raise ValueError(f"{argument}: expected one element (a 0-d or (1,) tensor), got shape {t.shape}")


def _check_float8(dtype, argument):
    if dtype not in FLOAT8_DTYPES:
        raise ValueError(f"{argument}: expected one of {', '.join(FLOAT8_DTYPES)}, got {dtype!r}")


# ---------------------------------------------------------------------------------------------------------------
# Op definition
# ---------------------------------------------------------------------------------------------------------------
def _infer(in_types, attrs):
    require_inputs(in_types, ("x", "scale"))
    x, scale = in_types
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x: expected one of {', '.join(FLOAT_DTYPES)}, got {x.dtype}")
    check_scale(scale, "scale")
    return [TensorType(x.shape, attrs["dtype"]), TensorType((), "float32")]


def _reference(inputs, attrs):
    y, amax = reference(inputs[0], inputs[1], attrs["dtype"])
    return [y, amax]


def _prepare(problem: Problem):
    x, y = problem.in_types[0], problem.out_types[0]
    return native_launch(_native_module().forward, in_ptr(0), x.dtype, in_ptr(1), out_ptr(0), y.dtype, out_ptr(1),
                         x.numel, stream_arg())


def _supports(problem: Problem):
    return None if _native.is_built("_ops_quantize_fp8") else "native module _ops_quantize_fp8 is not built"


def _samples(rng):
    return [Sample((sample_array(rng, 4, 6), np.array(4.0, np.float32)), {}, "E4M3, a 0-d scale"),
            Sample((sample_array(rng, 3, 37) * 1e4, np.array([2.0], np.float32)), {"dtype": "float8_e5m2"},
                   "E5M2, a (1,) scale, values past E5M2's range (saturate), an odd length (the element-wise tail)")]


# The FP8 output dtype: every quantize op's attribute.
_FP8_DTYPE_ATTR = Attr("dtype", str, "float8_e4m3fn", choices=FLOAT8_DTYPES, doc="the FP8 output dtype")


OP = register(OpDef(
    name="quantize_fp8",
    samples=_samples,
    inputs=(Input("x"), Input("scale")),
    outputs=("y", "amax"),
    attrs=(_FP8_DTYPE_ATTR,),
    infer=_infer,
    reference=_reference,
    # no reference_backward and no grad rule: FP8 values are not differentiated (see the module docstring)
    candidates=(table_candidate("_ops_quantize_fp8", "cuda", _supports, _prepare),),
    doc=__doc__,
))


def _no_gradients(dy, inputs, attrs, kernel, out, stream):
    """No gradients: FP8 values are not differentiated."""
    return [None] * len(inputs)


# The face (ops/_face.py): forward / forward_numpy / backward / backward_numpy / kernels / prepare.
FACE = Face(OP, _no_gradients)
globals().update(FACE.functions())


# ---------------------------------------------------------------------------------------------------------------
# quantize_fp8_transpose: both layouts from one read of x
# ---------------------------------------------------------------------------------------------------------------
PROLOGUE_ACTIVATIONS = ("none", "gelu", "silu")  # the activations a training graph keeps as nodes (relu is fused)


def _infer_transpose(in_types, attrs):
    y, amax = _infer(in_types[:2], attrs)
    if y.rank != 2:
        raise ValueError(f"x: expected a 2-d array, got shape {y.shape}")
    preact, x1, x2 = (list(in_types[2:]) + [None, None, None])[:3]
    if preact is not None:
        if attrs["act"] == "none":
            raise ValueError("preact: given with act='none' (the derivative of which activation?)")
        if preact != in_types[0]:
            raise ValueError(f"preact: expected {in_types[0]} (x's type), got {preact}")
    rows, cols = y.shape
    if x2 is not None and x1 is None:
        raise ValueError("x2: given without x1 (the column blocks follow x in order)")
    for name, block in (("x1", x1), ("x2", x2)):
        if block is None:
            continue
        if preact is not None:
            raise ValueError(f"{name}: column blocks take no preact (x's columns come from several arrays)")
        if block.dtype != in_types[0].dtype or block.rank != 2 or block.shape[0] != rows:
            raise ValueError(f"{name}: expected a 2-d {in_types[0].dtype} array of {rows} rows (x's), got {block}")
        cols += block.shape[1]
    y = TensorType((rows, cols), y.dtype)
    column_sum = TensorType((cols if attrs["with_column_sum"] else 0,), in_types[0].dtype)
    return [y, TensorType((cols, rows), y.dtype), amax, column_sum]


def prologue_value(x, preact, act: str) -> np.ndarray:
    """What quantize_fp8_transpose quantizes, in float32 as its kernels compute it (from float64 math rounded once):
    x, act(x) (no preact) or x * act'(preact)."""
    x32 = np.asarray(x).astype(np.float32)
    if act == "none":
        return x32
    if preact is None:
        return activations.apply(act, x32.astype(np.float64)).astype(np.float32)
    derivative = activations.derivative(act, np.asarray(preact).astype(np.float32).astype(np.float64))
    return (x32.astype(np.float64) * derivative.astype(np.float32)).astype(np.float32)


def _reference_transpose(inputs, attrs):
    x = np.concatenate([block for block in (list(inputs[:1]) + list(inputs[3:5])) if block is not None], axis=1)
    value = prologue_value(x, inputs[2] if len(inputs) > 2 else None, attrs["act"])
    y, amax = reference(value, inputs[1], attrs["dtype"])
    column_sum = value.astype(np.float64).sum(axis=0) if attrs["with_column_sum"] else np.zeros(0)
    return [y, np.ascontiguousarray(y.T), amax, column_sum]


def _prepare_transpose(problem: Problem):
    x = problem.in_types[0]
    rows, cols = problem.out_types[0].shape
    preact, x1, x2 = (list(problem.in_types[2:]) + [None, None, None])[:3]
    blocks = [value for index, block in ((3, x1), (4, x2)) if block is not None
              for value in (in_ptr(index), block.shape[1])]
    return native_launch(_native_module().quantize_transpose, in_ptr(0), x.dtype, in_ptr(1), out_ptr(0), out_ptr(1),
                         problem.attrs["dtype"], out_ptr(2), out_ptr(3) if problem.attrs["with_column_sum"] else 0,
                         rows, cols, stream_arg(), problem.attrs["act"], in_ptr(2) if preact is not None else 0,
                         *blocks)


TRANSPOSE = register(OpDef(
    name="quantize_fp8_transpose",
    samples=lambda rng: [Sample((sample_array(rng, 4, 6), np.array(4.0, np.float32))),
                         Sample((sample_array(rng, 33, 65) * 1e4, np.array([2.0], np.float32)),
                                {"dtype": "float8_e5m2"}, "partial tiles, values past E5M2's range"),
                         Sample((rng.integers(-8, 9, (70, 48)).astype(np.float32), np.array(8.0, np.float32)),
                                {"dtype": "float8_e5m2", "with_column_sum": True},
                                "the column sum over three row tiles (integers: exact float32 sums)"),
                         Sample((sample_array(rng, 33, 65), np.array(16.0, np.float32)), {"act": "gelu"},
                                "GELU of x quantized"),
                         Sample((sample_array(rng, 40, 24), np.array(16.0, np.float32), sample_array(rng, 40, 24)),
                                {"act": "gelu", "dtype": "float8_e5m2", "with_column_sum": True},
                                "x times GELU's derivative at preact (GELU's input gradient), its column sum"),
                         Sample((sample_array(rng, 70, 16), np.array(8.0, np.float32), None, sample_array(rng, 70, 24),
                                 sample_array(rng, 70, 8)), {"dtype": "float8_e5m2", "with_column_sum": True},
                                "x in three column blocks (a QKV projection's gradients, not concatenated)")],
    inputs=(Input("x"), Input("scale"), Input("preact", optional=True), Input("x1", optional=True),
            Input("x2", optional=True)),
    outputs=("y", "y_t", "amax", "column_sum"),
    attrs=(_FP8_DTYPE_ATTR,
           Attr("with_column_sum", bool, False,
                doc="True: column_sum [cols] (x's dtype) is the sum of the quantized values (before quantization) "
                    "over the rows (dbias of a linear layer whose output gradient they are), from the same read; "
                    "False: column_sum is empty"),
           Attr("act", str, "none", choices=PROLOGUE_ACTIVATIONS,
                doc="quantize act(x), or with preact x * act'(preact), computed in float32 from the same read "
                    "(an activation's output, or its input gradient, never written in 16 bits)")),
    infer=_infer_transpose,
    reference=_reference_transpose,
    # no reference_backward and no grad rule: FP8 values are not differentiated
    candidates=(table_candidate("_ops_quantize_fp8", "transpose", _supports, _prepare_transpose),),
    doc="quantize_fp8_transpose(x, scale, preact?, x1?, x2?) -> (y, y_t, amax, column_sum): quantize_fp8 of a 2-d "
        "x, and y's transpose, from one read of x (Transformer Engine's cast-transpose: FP8 training needs both "
        "layouts of x and dY, cuBLASLt's FP8 matmul taking only the TN layout); with with_column_sum, also the sum "
        "of the unquantized values over the rows, accumulated in float32 (cast-transpose-dbias: dY's bias "
        "gradient); with act, the values are act(x), or x * act'(preact) (an activation fused in front: GELU's "
        "output or its input gradient quantized without a 16-bit copy). With x1 (and x2), of x's rows and dtype, "
        "the quantized matrix is x, x1 and x2 side by side (concatenated along columns), read in place: a QKV "
        "projection's three output gradients quantized without their 16-bit concatenation (no preact then).",
))

TRANSPOSE_FACE = Face(TRANSPOSE, _no_gradients)


# ---------------------------------------------------------------------------------------------------------------
# quantize_fp8_add_transpose: a float32 sum, its rounding quantized in the same pass
# ---------------------------------------------------------------------------------------------------------------
def _infer_add_transpose(in_types, attrs):
    require_inputs(in_types, ("x", "addend", "scale"))
    x, addend, scale = in_types
    if x.dtype != "float32" or x.rank != 2:
        raise TypeError(f"x: expected a 2-d float32 array, got {x}")
    if addend != x:
        raise ValueError(f"addend: expected {x} (x's type), got {addend}")
    if attrs["value_dtype"] not in FLOAT_DTYPES:
        raise ValueError(f"value_dtype: expected one of {', '.join(FLOAT_DTYPES)}, got {attrs['value_dtype']!r}")
    y, y_t, amax, _ = _infer_transpose([x, scale], {**attrs, "act": "none"})
    column_sum = TensorType((x.shape[1] if attrs["with_column_sum"] else 0,), attrs["value_dtype"])
    return [x, y, y_t, amax, column_sum]


def _reference_add_transpose(inputs, attrs):
    x, addend, scale = inputs
    total = np.asarray(x, np.float32) + np.asarray(addend, np.float32)  # the float32 add, as a pointwise add
    value = total.astype(to_numpy(attrs["value_dtype"]))  # then the cast (round to nearest even)
    y, y_t, amax, column_sum = _reference_transpose([value, scale], {**attrs, "act": "none"})
    return [total, y, y_t, amax, column_sum]


def _prepare_add_transpose(problem: Problem):
    rows, cols = problem.in_types[0].shape
    attrs = problem.attrs
    return native_launch(_native_module().quantize_add_transpose, in_ptr(0), in_ptr(1), out_ptr(0),
                         attrs["value_dtype"], in_ptr(2), out_ptr(1), out_ptr(2), attrs["dtype"], out_ptr(3),
                         out_ptr(4) if attrs["with_column_sum"] else 0, rows, cols, stream_arg())


ADD_TRANSPOSE = register(OpDef(
    name="quantize_fp8_add_transpose",
    samples=lambda rng: [Sample((sample_array(rng, 64, 128), sample_array(rng, 64, 128), np.array(16.0, np.float32)),
                                {"dtype": "float8_e5m2", "with_column_sum": True}, "the 64 x 64 kernel's shape"),
                         Sample((sample_array(rng, 33, 40), sample_array(rng, 33, 40), np.array(4.0, np.float32)),
                                {"value_dtype": "float16"}, "partial tiles (the element-wise kernel), rounded to "
                                "float16")],
    inputs=(Input("x"), Input("addend"), Input("scale")),
    outputs=("sum", "y", "y_t", "amax", "column_sum"),
    attrs=(_FP8_DTYPE_ATTR,
           Attr("value_dtype", str, "bfloat16", choices=FLOAT_DTYPES,
                doc="the dtype the float32 sum is rounded to before it is quantized (and column_sum's)"),
           Attr("with_column_sum", bool, False,
                doc="True: column_sum [cols] (value_dtype) is the sum of the rounded values over the rows; False: "
                    "column_sum is empty")),
    infer=_infer_add_transpose,
    reference=_reference_add_transpose,
    # no reference_backward and no grad rule: FP8 training builds its backward itself
    candidates=(table_candidate("_ops_quantize_fp8", "transpose", _supports, _prepare_add_transpose),),
    doc="quantize_fp8_add_transpose(x, addend, scale) -> (sum, y, y_t, amax, column_sum): sum = x + addend "
        "(float32, 2-d), and quantize_fp8_transpose of v = sum rounded to value_dtype (y, y_t, amax = max |v| and, "
        "with with_column_sum, v's sum over the rows in value_dtype), in one pass: bit for bit an add, a cast to "
        "value_dtype and a quantize_fp8_transpose, with the cast's 16-bit tensor never written. FP8 training's "
        "residual-stream gradients (the float32 sum of two layers' input gradients, whose bfloat16 copy only the "
        "next GEMM's dY quantize read) take it.",
))

ADD_TRANSPOSE_FACE = Face(ADD_TRANSPOSE, _no_gradients)


# ---------------------------------------------------------------------------------------------------------------
# quantize_fp8_transpose_multi: several tensors' cast-transposes in one launch
# ---------------------------------------------------------------------------------------------------------------
def _infer_multi(in_types, attrs):
    if not in_types or len(in_types) % 2:
        raise ValueError(f"tensors: expected (x, scale) for each tensor, got {len(in_types)} inputs")
    out_types, x_dtype = [], None
    for first in range(0, len(in_types), 2):
        x, scale = in_types[first:first + 2]
        tensor = f"tensor {first // 2}"
        if x is None or x.dtype not in FLOAT_DTYPES or x.rank != 2:
            raise TypeError(f"tensors[{first}] ({tensor}'s x): expected a 2-d array of {', '.join(FLOAT_DTYPES)}, "
                            f"got {x}")
        if x_dtype is not None and x.dtype != x_dtype:
            raise TypeError(f"tensors[{first}] ({tensor}'s x): expected {x_dtype} (tensor 0's dtype: one dtype a "
                            f"launch), got {x.dtype}")
        x_dtype = x.dtype
        if scale is None:
            raise ValueError(f"tensors[{first + 1}] ({tensor}'s scale): required")
        check_scale(scale, f"tensors[{first + 1}] ({tensor}'s scale)")
        rows, cols = x.shape
        out_types += [TensorType((rows, cols), attrs["dtype"]), TensorType((cols, rows), attrs["dtype"]),
                      TensorType((), "float32")]
    return out_types


def _reference_multi(inputs, attrs):
    outputs = []
    for first in range(0, len(inputs), 2):
        y, amax = reference(inputs[first], inputs[first + 1], attrs["dtype"])
        outputs += [y, np.ascontiguousarray(y.T), amax]
    return outputs


def _prepare_multi(problem: Problem):
    shapes = [x.shape for x in problem.in_types[0::2]]
    return native_launch(_native_module().quantize_transpose_multi, in_ptrs(), out_ptrs(),
                         [rows for rows, _ in shapes], [cols for _, cols in shapes], problem.in_types[0].dtype,
                         problem.attrs["dtype"], stream_arg())


MULTI = register(OpDef(
    name="quantize_fp8_transpose_multi",
    samples=lambda rng: [Sample(([sample_array(rng, 4, 6), np.array(4.0, np.float32)],)),
                         Sample(([sample_array(rng, 33, 65) * 1e4, np.array([2.0], np.float32),
                                  sample_array(rng, 64, 128), np.array(16.0, np.float32),
                                  np.zeros((0, 5), np.float32), np.array(1.0, np.float32)],),
                                {"dtype": "float8_e5m2"},
                                "three tensors: partial tiles past E5M2's range, whole 64 x 64 tiles, an empty one")],
    inputs=(Input("tensors", variadic=True),),
    outputs=(VARIADIC_OUTPUTS,),
    attrs=(_FP8_DTYPE_ATTR,),
    infer=_infer_multi,
    reference=_reference_multi,
    candidates=(table_candidate("_ops_quantize_fp8", "transpose_multi", _supports, _prepare_multi),),
    doc="quantize_fp8_transpose_multi(x_0, scale_0, x_1, scale_1, ...) -> (y_0, y_t_0, amax_0, y_1, ...): "
        "quantize_fp8_transpose (no column sum, no activation) of several 2-d tensors of one dtype, bit for bit, in "
        "one launch (up to 64 tensors a launch; one wave of blocks, each a run of consecutive 64 x 64 tiles across "
        "them): FP8 training's weights, each too little work to fill the GPU alone, quantized together.",
))

MULTI_FACE = Face(MULTI, _no_gradients)


# ---------------------------------------------------------------------------------------------------------------
# fp8_scale_update: delayed scaling's state update
# ---------------------------------------------------------------------------------------------------------------
def reference_scale_update(history, scale, amax, dtype: str = "float8_e4m3fn", margin: int = 0):
    """(new_history, new_scale, new_scale_inv) as float32 arrays, as the kernel computes them."""
    history = np.asarray(history, np.float32)
    scale = np.float32(np.asarray(scale, np.float32).reshape(()))
    newest = np.float32(np.asarray(amax, np.float32).reshape(()))
    if not np.isfinite(newest):
        new_history = history.copy()
    else:
        new_history = np.concatenate([[newest], history[:-1]]).astype(np.float32)
    largest = np.float32(new_history.max())
    target = np.float32(np.ldexp(np.float32(FLOAT8_MAX[dtype]), -margin))
    with np.errstate(divide="ignore", over="ignore"):
        updated = target / largest if largest > 0 else scale
    chosen = updated if np.isfinite(updated) and updated > 0 else scale
    return new_history, np.asarray(chosen, np.float32), np.asarray(np.float32(1.0) / chosen, np.float32)


def _infer_scale_update(in_types, attrs):
    if not in_types or len(in_types) % 3:
        raise ValueError(f"states: expected (history, scale, amax) for each tensor, got {len(in_types)} inputs")
    out_types = []
    for first in range(0, len(in_types), 3):
        history, scale, amax = in_types[first:first + 3]
        tensor = f"tensor {first // 3}"
        if history is None or history.dtype != "float32" or history.rank != 1:
            raise TypeError(f"states[{first}] ({tensor}'s history): expected a 1-d float32 array, got {history}")
        for value, index, role in ((scale, first + 1, "scale"), (amax, first + 2, "amax")):
            if value is None:
                raise ValueError(f"states[{index}] ({tensor}'s {role}): required")
            check_scale(value, f"states[{index}] ({tensor}'s {role})")
        out_types += [history, TensorType((), "float32"), TensorType((), "float32")]
    return out_types


def _reference_scale_update(inputs, attrs):
    return [array for first in range(0, len(inputs), 3)
            for array in reference_scale_update(*inputs[first:first + 3], attrs["dtype"], attrs["margin"])]


def _prepare_scale_update(problem: Problem):
    lengths = [history.shape[0] for history in problem.in_types[0::3]]
    return native_launch(_native_module().scale_update, in_ptrs(), out_ptrs(), lengths, problem.attrs["dtype"],
                         problem.attrs["margin"], stream_arg())


def _non_negative(value):
    return None if value >= 0 else "must be >= 0"


SCALE_UPDATE = register(OpDef(
    name="fp8_scale_update",
    samples=lambda rng: [Sample(([np.abs(sample_array(rng, 8)), np.array(2.0, np.float32),
                                  np.array(3.5, np.float32)],), {"margin": 1}),
                         Sample(([np.zeros(4, np.float32), np.array(2.0, np.float32), np.array(np.inf, np.float32)],),
                                {"dtype": "float8_e5m2"}, "an overflowed step: the state stays"),
                         Sample(([np.abs(sample_array(rng, 3)), np.array(1.0, np.float32), np.array(0.25, np.float32),
                                  np.zeros(5, np.float32), np.array(4.0, np.float32), np.array(9.0, np.float32)],),
                                {}, "two tensors, histories of different lengths")],
    inputs=(Input("states", variadic=True),),
    outputs=(VARIADIC_OUTPUTS,),
    attrs=(Attr("dtype", str, "float8_e4m3fn", choices=FLOAT8_DTYPES, doc="the format the scales target"),
           Attr("margin", int, 0, check=_non_negative, doc="scales backed off by 2**margin")),
    infer=_infer_scale_update,
    reference=_reference_scale_update,
    candidates=(table_candidate("_ops_quantize_fp8", "scale_update", _supports, _prepare_scale_update),),
    doc=__doc__,
))

SCALE_UPDATE_FACE = Face(SCALE_UPDATE, _no_gradients)
