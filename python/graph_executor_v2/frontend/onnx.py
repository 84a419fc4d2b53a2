"""ONNX import: ``load(path_or_ModelProto) -> ir.Graph``.

The model goes through ``onnx.shape_inference`` first; initializers become params (or stay host constants where an
ONNX op takes a shape, axes or indices as a tensor input); graph inputs become graph inputs, with a named symbolic
dim (``dim_param``) kept symbolic. Every node is translated by one rule of ``RULES`` (ONNX op type -> function that
emits GE2 nodes); opsets 13 up to the newest the installed ``onnx`` knows are read.

Constant subgraphs are folded while importing: a node whose inputs are all known (initializers, Constant nodes,
``Shape`` of a statically shaped tensor, earlier folded nodes) is evaluated once with ONNX's reference
implementation (``onnx.reference``), of any op type, so an exporter's shape arithmetic and mask construction
(Shape -> Slice -> Concat -> Expand -> Trilu -> Equal -> Where) becomes a constant. Shape arithmetic on symbolic
dims (``SYMBOLIC_FOLDS``: s + 1, 2 * s, s // 2, comparisons that hold for every size) gives symbolic dims
(``ir/dims.py``), bound when a plan binds the inputs; a Range up to one is the arange op. A MatMul of a batched B is one
(batched) matmul; at the end the attention pass both frontends share (``passes.attention_fusion.fuse_attention``)
turns the written-out attention of a transformer (QK^T, scale, mask or bias, softmax, times V) into one
``attention`` node (``fuse_imported_attention``). Nodes no graph output needs are dropped at the end.

An unsupported op, attribute value, dtype or dynamic shape is collected, not raised at once: ``load`` raises one
``UnsupportedModelError`` that lists every offending node with its op type and the reason.
"""
from __future__ import annotations

import os
import re
from typing import Callable

import numpy as np

from .._optional import require
from ..dtypes import ALL_DTYPES, FLOAT_DTYPES
from ..ir import dims
from ..ir.graph import Graph, Value
from ..ops.elementwise import broadcast_shapes
from ..ops.indexing import COORDINATES as RESIZE_COORDINATES, reference_gather_elements
from ..passes.attention_fusion import fuse_imported_attention
from ._arange import symbolic_range, symbolic_scalar
from ._batch_norm import float32_statistics
from ._einsum import batched_matmul, einsum
from ._errors import NeedsConstant, Unsupported, UnsupportedModelError
from ._resize import interpolation_weights

MIN_OPSET = 13


def _onnx():
    return require("onnx", "ge2.frontend.onnx")


# ONNX TensorProto element types GE2 has (the rest are reported as unsupported).
def _dtype_names():
    onnx = _onnx()
    T = onnx.TensorProto
    return {T.FLOAT: "float32", T.FLOAT16: "float16", T.BFLOAT16: "bfloat16", T.INT32: "int32", T.INT64: "int64",
            T.UINT8: "uint8", T.BOOL: "bool"}


# ---------------------------------------------------------------------------------------------------------------
# The import context: ONNX value names -> GE2 Values or host constants.
# ---------------------------------------------------------------------------------------------------------------
class _Context:
    def __init__(self, graph: Graph, opset: int, value_info: dict):
        self.graph = graph
        self.opset = opset
        self.value_info = value_info  # ONNX name -> (shape or None, dtype or None) from shape inference
        self.values: dict[str, Value] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.failed: set[str] = set()  # outputs of nodes that could not be imported
        # ONNX name -> the integer graph inputs it is computed from by nodes that fold once those are constants (a
        # window's size through Cast and Sub, a crop's shape through Max and Sub): what to bind where a rule needs it
        self.derived: dict[str, frozenset] = {}
        self.node_outputs: list[str] = []  # the output names of the node being translated ("" for an absent one)

    def wants(self, index: int) -> bool:
        """Whether the node being translated has its optional output ``index``."""
        return index < len(self.node_outputs) and bool(self.node_outputs[index])

    def value(self, name: str) -> Value:
        """The GE2 Value of an ONNX tensor; a constant becomes a param on first use as a tensor."""
        if name in self.values:
            return self.values[name]
        if name in self.constants:
            array = self.constants[name]
            if array.dtype == np.float64:
                raise Unsupported(f"constant '{name}' is float64, which GE2 does not run")
            if _is_symbolic(array):  # shape arithmetic used as numbers: each symbolic size from the graph
                value = self.values[name] = _symbolic_tensor(self, name, array)
                return value
            if array.dtype.name not in ALL_DTYPES:
                raise Unsupported(f"constant '{name}' of dtype {array.dtype} is used as a tensor; GE2 has "
                                  f"{', '.join(ALL_DTYPES)}")
            # np.ascontiguousarray makes a 0-d array 1-d: the reshape keeps a scalar constant 0-d
            value = self.graph.param(_fresh_name(self.graph, name), np.ascontiguousarray(array).reshape(array.shape))
            self.values[name] = value
            return value
        if name in self.derived:
            raise _NotImported(name)
        raise Unsupported(f"input '{name}' is not produced by any node, input or initializer")

    def shape(self, name: str) -> tuple:
        """The shape of an ONNX tensor, without turning a constant into a param."""
        if name in self.constants:
            return tuple(np.shape(self.constants[name]))
        return tuple(self.value(name).type.shape)

    def constant(self, name: str, what: str) -> np.ndarray:
        """A tensor input that must be known when the graph is imported (a shape, axes, pads, ...)."""
        if name in self.constants:
            return self.constants[name]
        if name in self.values and self.values[name].is_input:
            raise NeedsConstant({name}, what)
        if name in self.derived:
            raise NeedsConstant(self.derived[name], what)
        raise Unsupported(f"{what} ('{name}') must be a constant (an initializer, a Constant node or a graph input "
                          "given in constant_inputs); GE2 plans shapes when it compiles")


class _NotImported(Unsupported):
    """A value computed from graph inputs whose producer failed (listed already) is used as a tensor."""


def _symbolic_tensor(ctx: _Context, name: str, array: np.ndarray) -> Value:
    """A shape-valued constant with symbolic entries (a 0-d or 1-d object array of ints and dim names) as a tensor
    of its ONNX element type: the ints as constants, each name's size counted over an axis of that many elements
    (``_arange.symbolic_scalar``)."""
    g = ctx.graph
    dtype = ctx.value_info.get(name, (None, None))[1] or "int64"
    if array.ndim > 1:
        raise Unsupported(f"constant '{name}' of symbolic dims of rank {array.ndim} is used as a tensor")
    pieces = [symbolic_scalar(g, entry, dtype) if isinstance(entry, str)
              else g.param(_fresh_name(g, name), np.array(int(entry), _numpy_dtype(dtype)))
              for entry in array.reshape(-1)]
    if array.ndim == 0:
        return pieces[0]
    return g.concat([g.reshape(piece, shape=(1,)) for piece in pieces], axis=0)


def _fresh_name(graph: Graph, name: str) -> str:
    return graph.unique_name(re.sub(r"[^A-Za-z0-9_.:/-]", "_", name) or "value")


def _attributes(node) -> dict:
    onnx = _onnx()
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _decode(value):
    return value.decode() if isinstance(value, bytes) else value


def _float_input(value: Value, what: str) -> Value:
    if value.type.dtype not in FLOAT_DTYPES:
        raise Unsupported(f"{what} has dtype {value.type.dtype}; GE2 runs this op on float32, float16 and bfloat16")
    return value


def _only(attrs: dict, allowed: dict) -> None:
    """Rejects an attribute whose value GE2 does not implement (allowed: name -> predicate of accepted values)."""
    for name, value in attrs.items():
        accept = allowed.get(name)
        if accept is None:
            raise Unsupported(f"attribute '{name}' is not supported")
        if not accept(_decode(value)):
            raise Unsupported(f"attribute {name}={_decode(value)!r} is not supported")


_ANY = lambda value: True  # noqa: E731


# ---------------------------------------------------------------------------------------------------------------
# Rules: one per ONNX op type. Each takes (ctx, inputs (ONNX names), attrs) and returns the GE2 Values of the
# node's outputs in order.
# ---------------------------------------------------------------------------------------------------------------
Rule = Callable[[_Context, list, dict], list]
RULES: dict[str, Rule] = {}


def rule(*op_types: str):
    def register_rule(function: Rule) -> Rule:
        for op_type in op_types:
            RULES[op_type] = function
        return function

    return register_rule


def _binary(ge2_op, **attrs_of_op):
    def translate(ctx, inputs, attrs):
        _only(attrs, {})
        return [getattr(ctx.graph, ge2_op)(ctx.value(inputs[0]), ctx.value(inputs[1]), **attrs_of_op)]

    return translate


# Div of integers truncates toward zero in GE2 as in ONNX.
for _op_type, _ge2_op in (("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Div", "div"), ("Equal", "equal"),
                          ("Less", "less"), ("LessOrEqual", "less_equal"), ("Greater", "greater"),
                          ("GreaterOrEqual", "greater_equal"), ("And", "logical_and"), ("Or", "logical_or"),
                          ("Xor", "logical_xor")):
    RULES[_op_type] = _binary(_ge2_op)


def _unary(ge2_op, **defaults):
    """A unary op whose ONNX attributes (``defaults``: ONNX name -> (GE2 name, ONNX default)) map one to one."""
    def translate(ctx, inputs, attrs):
        _only(attrs, dict.fromkeys(defaults, _ANY))
        ge2_attrs = {name: float(attrs.get(onnx_name, default)) for onnx_name, (name, default) in defaults.items()}
        return [getattr(ctx.graph, ge2_op)(ctx.value(inputs[0]), **ge2_attrs)]

    return translate


for _op_type, _ge2_op in (("Relu", "relu"), ("Sigmoid", "sigmoid"), ("Tanh", "tanh"), ("Exp", "exp"),
                          ("Neg", "neg"), ("Abs", "abs"), ("Sign", "sign"), ("Sqrt", "sqrt"),
                          ("Reciprocal", "reciprocal"), ("Floor", "floor"), ("Ceil", "ceil"), ("Round", "round"),
                          ("Erf", "erf"), ("Log", "log"), ("Sin", "sin"), ("Cos", "cos"), ("Softplus", "softplus"),
                          ("Mish", "mish"), ("HardSwish", "hardswish"), ("Not", "logical_not"),
                          ("IsNaN", "isnan")):
    RULES[_op_type] = _unary(_ge2_op)
RULES["LeakyRelu"] = _unary("leaky_relu", alpha=("alpha", 0.01))
RULES["Elu"] = _unary("elu", alpha=("alpha", 1.0))
RULES["HardSigmoid"] = _unary("hardsigmoid", alpha=("alpha", 0.2), beta=("beta", 0.5))


@rule("IsInf")
def _isinf(ctx, inputs, attrs):
    _only(attrs, {"detect_positive": _ANY, "detect_negative": _ANY})
    g, x = ctx.graph, ctx.value(inputs[0])
    positive, negative = int(attrs.get("detect_positive", 1)), int(attrs.get("detect_negative", 1))
    infinite = g.isinf(x)
    if positive and negative:
        return [infinite]
    zero = g.param(_fresh_name(g, "isinf_zero"), np.zeros((), _numpy_dtype(x.type.dtype)))
    if not positive and not negative:
        return [g.logical_and(infinite, g.logical_not(infinite))]
    return [g.logical_and(infinite, g.greater(x, zero) if positive else g.less(x, zero))]


@rule("Pow")
def _pow(ctx, inputs, attrs):
    """ONNX's Pow keeps the base's type (an int32 base to a float exponent is int32): the promoted result is cast
    back to it."""
    _only(attrs, {})
    g = ctx.graph
    base, exponent = ctx.value(inputs[0]), ctx.value(inputs[1])
    y = g.pow(base, exponent)
    return [y if y.type.dtype == base.type.dtype else g.cast(y, dtype=base.type.dtype)]


@rule("Mod")
def _mod(ctx, inputs, attrs):
    _only(attrs, {"fmod": lambda v: v in (0, 1)})
    return [ctx.graph.mod(ctx.value(inputs[0]), ctx.value(inputs[1]), fmod=bool(attrs.get("fmod", 0)))]


def _variadic(ge2_op):
    """Min / Max / Sum over one or more inputs, broadcast together: a chain of the binary op."""
    def translate(ctx, inputs, attrs):
        _only(attrs, {})
        values = [ctx.value(name) for name in inputs if name]
        y = values[0]
        for value in values[1:]:
            y = getattr(ctx.graph, ge2_op)(y, value)
        return [y]

    return translate


RULES["Min"] = _variadic("minimum")
RULES["Max"] = _variadic("maximum")
RULES["Sum"] = _variadic("add")


@rule("Clip")
def _clip(ctx, inputs, attrs):
    """Bounds from the attributes (opset < 11) or the optional inputs: constant bounds are clip's attributes,
    tensor ones a maximum then a minimum."""
    _only(attrs, {"min": _ANY, "max": _ANY})
    g, x = ctx.graph, ctx.value(inputs[0])
    bounds = {"min": attrs.get("min"), "max": attrs.get("max")}
    tensors = {}
    for index, name in ((1, "min"), (2, "max")):
        if len(inputs) > index and inputs[index]:
            if inputs[index] in ctx.constants:
                bounds[name] = np.asarray(ctx.constants[inputs[index]]).item()
            else:
                tensors[name] = ctx.value(inputs[index])
    y = g.clip(x, **{name: None if value is None else float(value) for name, value in bounds.items()})
    if "min" in tensors:
        y = g.maximum(y, tensors["min"])
    if "max" in tensors:
        y = g.minimum(y, tensors["max"])
    return [y]


@rule("Gelu")
def _gelu(ctx, inputs, attrs):
    _only(attrs, {"approximate": lambda v: v in ("none", "tanh")})
    x = _float_input(ctx.value(inputs[0]), "input X")
    return [ctx.graph.gelu(x) if _decode(attrs.get("approximate", "none")) == "tanh" else ctx.graph.gelu_erf(x)]


@rule("Identity", "Dropout")
def _identity(ctx, inputs, attrs):
    # Dropout is the identity at inference, and in training with a ratio of 0: its training_mode input must be
    # absent or a constant false, or its ratio a constant 0.
    if len(inputs) > 2 and inputs[2] and bool(np.asarray(ctx.constant(inputs[2], "training_mode")).item()):
        ratio = float(np.asarray(ctx.constant(inputs[1], "ratio")).item()) if len(inputs) > 1 and inputs[1] else 0.5
        if ratio != 0:
            raise Unsupported(f"training_mode=True with ratio {ratio}: GE2 imports models for inference")
    _only(attrs, {"seed": _ANY})
    x = ctx.value(inputs[0])
    if not ctx.wants(1):
        return [x]
    return [x, ctx.graph.logical_or(ctx.graph.isnan(x), ctx.graph.logical_not(ctx.graph.isnan(x)))]  # mask: all kept


def _softmax_like(ge2_op):
    def translate(ctx, inputs, attrs):
        _only(attrs, {"axis": _ANY})
        x = _float_input(ctx.value(inputs[0]), "input")
        rank = x.type.rank
        axis = int(attrs.get("axis", -1 if ctx.opset >= 13 else 1))
        if ctx.opset >= 13:
            return [getattr(ctx.graph, ge2_op)(x, axis=axis)]
        # Before opset 13 the input is seen as 2-d [prod(shape[:axis]), prod(shape[axis:])].
        axis %= rank
        flat = ctx.graph.reshape(x, shape=(int(np.prod(x.type.shape[:axis])), -1))
        return [ctx.graph.reshape(getattr(ctx.graph, ge2_op)(flat, axis=1), shape=x.type.shape)]

    return translate


RULES["Softmax"] = _softmax_like("softmax")
RULES["LogSoftmax"] = _softmax_like("log_softmax")


@rule("Gemm")
def _gemm(ctx, inputs, attrs):
    _only(attrs, {"alpha": _ANY, "beta": _ANY, "transA": _ANY, "transB": _ANY})
    g = ctx.graph
    a = _float_input(ctx.value(inputs[0]), "input A")
    b = _float_input(ctx.value(inputs[1]), "input B")
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    trans_a, trans_b = bool(attrs.get("transA", 0)), bool(attrs.get("transB", 0))
    if len(inputs) < 3 or not inputs[2] or beta == 0.0:
        return [g.gemm(a, b, alpha=alpha, trans_a=trans_a, trans_b=trans_b)]
    m = a.type.shape[1 if trans_a else 0]
    n = b.type.shape[0 if trans_b else 1]
    c_name = inputs[2]
    c_shape = ctx.shape(c_name)
    if c_shape in ((n,), (1, n)):  # a row bias: the epilogue adds it
        if c_name in ctx.constants:
            bias_array = (np.asarray(ctx.constants[c_name]) * beta).reshape(n).astype(ctx.constants[c_name].dtype)
            bias = g.param(_fresh_name(g, c_name + ".bias"), bias_array)
        else:
            bias = ctx.value(c_name)
            if c_shape == (1, n):
                bias = g.reshape(bias, shape=(n,))
            if beta != 1.0:
                bias = g.mul(bias, g.param(_fresh_name(g, c_name + ".beta"), np.array(beta, _numpy_dtype(bias.type.dtype))))
        return [g.gemm(a, b, bias, alpha=alpha, trans_a=trans_a, trans_b=trans_b)]
    if c_shape == (m, n):
        return [g.gemm(a, b, None, ctx.value(c_name), alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b)]
    # Any other broadcastable C (a scalar, a column): the product, then a broadcasting add of beta * C.
    c = ctx.value(c_name)
    if beta != 1.0:
        c = g.mul(c, g.param(_fresh_name(g, c_name + ".beta"), np.array(beta, _numpy_dtype(c.type.dtype))))
    return [g.add(g.gemm(a, b, alpha=alpha, trans_a=trans_a, trans_b=trans_b), c)]


@rule("MatMul")
def _matmul(ctx, inputs, attrs):
    _only(attrs, {})
    g = ctx.graph
    a = _float_input(ctx.value(inputs[0]), "input A")
    b = _float_input(ctx.value(inputs[1]), "input B")
    if a.type.rank == 0 or b.type.rank == 0:
        raise Unsupported("MatMul of a 0-d tensor")
    if b.type.rank > 2 and (any(d != 1 for d in b.type.shape[:-2]) or b.type.rank > a.type.rank):
        return [batched_matmul(g, a, b)]
    if b.type.rank > 2:  # B's batch dims are all 1 and A has as many: one 2-d B for every row of A
        b = g.reshape(b, shape=tuple(b.type.shape[-2:]))
    a2 = a if a.type.rank == 2 else g.reshape(a, shape=(-1, a.type.shape[-1]))
    b2 = b if b.type.rank == 2 else g.reshape(b, shape=(b.type.shape[0], 1))
    y = g.matmul(a2, b2)
    out_shape = tuple(a.type.shape[:-1]) + ((b.type.shape[-1],) if b.type.rank == 2 else ())
    return [y if tuple(y.type.shape) == out_shape else g.reshape(y, shape=out_shape)]


@rule("LayerNormalization")
def _layer_norm(ctx, inputs, attrs):
    _only(attrs, {"axis": _ANY, "epsilon": _ANY, "stash_type": lambda v: v == 1})
    g = ctx.graph
    x = _float_input(ctx.value(inputs[0]), "input X")
    rank = x.type.rank
    axis = int(attrs.get("axis", -1)) % rank
    normalized = tuple(x.type.shape[axis:])
    width = int(np.prod(normalized))
    gamma = ctx.value(inputs[1])
    if len(inputs) > 2 and inputs[2]:
        beta = ctx.value(inputs[2])
    else:
        beta = g.param(_fresh_name(g, inputs[1] + ".zero_bias"), np.zeros(width, _numpy_dtype(gamma.type.dtype)))
    for name, value in (("Scale", gamma), ("B", beta)):
        if tuple(value.type.shape) not in (normalized, (width,)):
            raise Unsupported(f"{name} of shape {value.type.shape} broadcasts; GE2 takes the normalized shape "
                              f"{normalized}")
    flat = axis != rank - 1
    rows = g.reshape(x, shape=(*x.type.shape[:axis], width)) if flat else x
    gamma = g.reshape(gamma, shape=(width,)) if gamma.type.rank != 1 else gamma
    beta = g.reshape(beta, shape=(width,)) if beta.type.rank != 1 else beta
    eps = float(attrs.get("epsilon", 1e-5))
    y = g.layernorm(rows, gamma, beta, eps=eps)
    y = g.reshape(y, shape=x.type.shape) if flat else y
    if not ctx.wants(1) and not ctx.wants(2):
        return [y]
    # The optional Mean and InvStdDev outputs (shape x.shape[:axis] + [1] * (rank - axis), float32).
    if x.type.dtype != "float32":
        raise Unsupported(f"the Mean and InvStdDev outputs of a {x.type.dtype} input (GE2 computes them in float32 "
                          "from float32 inputs)")
    stat_shape = (*x.type.shape[:axis], *([1] * (rank - axis)))
    mean = g.mean(rows, axis=-1, keepdims=True)
    return [y, g.reshape(mean, shape=stat_shape), g.reshape(_inverse_std(g, g.sub(rows, mean), width, eps),
                                                            shape=stat_shape)]


def _inverse_std(g: Graph, centered: Value, width: int, eps: float) -> Value:
    """1 / sqrt(mean(centered^2) + eps) per row of the 2-d float32 ``centered`` (rows of mean 0), as [rows, 1]. GE2
    has no sqrt op; rmsnorm computes the inverse square root: the row [centered, c] with c^2 = width * eps - eps / 2
    and the rmsnorm epsilon e = eps / (2 * (width + 1)) has mean square + e = width * (var + eps) / (width + 1), so
    rmsnorm's last entry is c * sqrt((width + 1) / width) * invstd."""
    rows = int(np.prod(centered.type.shape[:-1], dtype=np.int64))
    c = np.sqrt(width * eps - eps / 2)
    column = g.param(_fresh_name(g, "layernorm_invstd_column"), np.full((rows, 1), c, np.float32))
    ones = g.param(_fresh_name(g, "layernorm_invstd_ones"), np.ones(width + 1, np.float32))
    normalized = g.rmsnorm(g.concat([g.reshape(centered, shape=(rows, width)), column], axis=1), ones,
                           eps=eps / (2 * (width + 1)))
    last = g.slice(normalized, starts=(width,), ends=(width + 1,), axes=(1,))
    scale = g.param(_fresh_name(g, "layernorm_invstd_scale"),
                    np.array(1.0 / (c * np.sqrt((width + 1) / width)), np.float32))
    return g.mul(last, scale)


@rule("Transpose")
def _transpose(ctx, inputs, attrs):
    _only(attrs, {"perm": _ANY})
    x = ctx.value(inputs[0])
    perm = tuple(attrs.get("perm", range(x.type.rank - 1, -1, -1)))
    return [ctx.graph.transpose(x, perm=perm)]


@rule("Reshape")
def _reshape(ctx, inputs, attrs):
    _only(attrs, {"allowzero": _ANY})
    x = ctx.value(inputs[0])
    shape = [d if isinstance(d, str) else int(d)
             for d in np.asarray(ctx.constant(inputs[1], "the target shape")).reshape(-1)]
    if not attrs.get("allowzero", 0):  # 0 copies the input's dim at that position
        shape = [x.type.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [ctx.graph.reshape(x, shape=tuple(shape))]


@rule("Flatten")
def _flatten(ctx, inputs, attrs):
    _only(attrs, {"axis": _ANY})
    x = ctx.value(inputs[0])
    axis = int(attrs.get("axis", 1))
    axis += x.type.rank if axis < 0 else 0  # ONNX axes of Flatten run over [-rank, rank]
    # Symbolic extents multiply into symbolic products (a legacy export's Flatten of a [batch, ...] tensor)
    return [ctx.graph.reshape(x, shape=(dims.product(*x.type.shape[:axis]), dims.product(*x.type.shape[axis:])))]


@rule("Concat")
def _concat(ctx, inputs, attrs):
    _only(attrs, {"axis": _ANY})
    return [ctx.graph.concat([ctx.value(name) for name in inputs if name], axis=int(attrs["axis"]))]


@rule("Slice")
def _slice(ctx, inputs, attrs):
    _only(attrs, {})
    x = ctx.value(inputs[0])

    def ints(index, what):
        if len(inputs) <= index or not inputs[index]:
            return None
        return tuple(v if isinstance(v, str) else int(v)
                     for v in np.asarray(ctx.constant(inputs[index], what)).reshape(-1))

    starts, ends, axes = ints(1, "starts"), ints(2, "ends"), ints(3, "axes")
    if any(isinstance(v, str) for v in axes or ()):
        raise Unsupported("a symbolic axis (starts and ends may be symbolic, the sliced axes are fixed)")
    # A symbolic end equal to the axis' own extent is the whole axis.
    axis_list = axes if axes is not None else tuple(range(len(ends)))
    ends = tuple(2**63 - 1 if isinstance(end, str) and end == x.type.shape[axis % x.type.rank] else end
                 for end, axis in zip(ends, axis_list))
    return [ctx.graph.slice(x, starts=starts, ends=ends, axes=axes, steps=ints(4, "steps"))]


@rule("Gather")
def _gather(ctx, inputs, attrs):
    """A float table's rows by ids (axis 0 of a 2-d table: a token embedding) run on the embedding op, the rest on
    the gather op (any axis and dtype; ONNX's negative indices count from the end)."""
    _only(attrs, {"axis": _ANY})
    g = ctx.graph
    data = ctx.value(inputs[0])
    if data.type.rank == 0:
        raise Unsupported("gather from a 0-d tensor")
    axis = int(attrs.get("axis", 0)) % data.type.rank
    extent = data.type.shape[axis]
    if inputs[1] in ctx.constants:
        indices = np.asarray(ctx.constants[inputs[1]]).astype(np.int64)
        if isinstance(extent, int) and np.any((indices < -extent) | (indices >= extent)):
            raise Unsupported(f"indices outside [-{extent}, {extent})")
        ids = g.param(_fresh_name(g, inputs[1]), indices)
    else:
        ids = ctx.value(inputs[1])
        if ids.type.dtype not in ("int32", "int64"):
            raise Unsupported(f"indices of dtype {ids.type.dtype}")
    if axis == 0 and data.type.rank == 2 and data.type.dtype in FLOAT_DTYPES and inputs[1] not in ctx.constants:
        return [g.embedding(data, ids)]
    return [g.gather(data, ids, axis=axis)]


@rule("GatherElements")
def _gather_elements(ctx, inputs, attrs):
    _only(attrs, {"axis": _ANY})
    return [ctx.graph.gather_elements(ctx.value(inputs[0]), ctx.value(inputs[1]), axis=int(attrs.get("axis", 0)))]


@rule("GatherND")
def _gather_nd(ctx, inputs, attrs):
    _only(attrs, {"batch_dims": _ANY})
    batch_dims = int(attrs.get("batch_dims", 0))
    return [ctx.graph.gather_nd(ctx.value(inputs[0]), ctx.value(inputs[1]), batch_dims=batch_dims)]


@rule("Shape")
def _shape(ctx, inputs, attrs):
    """A constant: the shape is known when the graph is imported. A symbolic dim stays symbolic: the constant is
    then an object array of ints and dim names (``_fold_symbolic`` carries it through the exporter's shape
    arithmetic into a Reshape's target, bound when a plan binds the inputs' dims)."""
    _only(attrs, {"start": _ANY, "end": _ANY})
    shape = ctx.shape(inputs[0])
    rank = len(shape)
    start, end = (int(np.clip(v + rank if v < 0 else v, 0, rank))
                  for v in (int(attrs.get("start", 0)), int(attrs.get("end", rank))))
    if all(isinstance(d, int) for d in shape):
        return [np.array(shape[start:end], np.int64)]
    return [np.array(list(shape[start:end]) + [None], object)[:-1]]  # a 1-d object array even of one name


@rule("Size")
def _size(ctx, inputs, attrs):
    """A constant: the number of elements, a product of symbolic dims where the shape has them."""
    _only(attrs, {})
    count = dims.product(*ctx.shape(inputs[0]))
    return [np.array(count, np.int64) if isinstance(count, int) else np.array(count, object)]


def _axes_input(ctx, inputs) -> list | None:
    """The axes of Squeeze/Unsqueeze (an input since opset 13), or None if absent."""
    if len(inputs) < 2 or not inputs[1]:
        return None
    return [int(a) for a in np.asarray(ctx.constant(inputs[1], "axes")).reshape(-1)]


def _resolved_axes(axes: list, rank: int) -> tuple:
    if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
        raise Unsupported(f"axes {axes} are out of range or repeated for rank {rank}")
    return tuple(sorted(a % rank for a in axes))


@rule("Squeeze")
def _squeeze(ctx, inputs, attrs):
    _only(attrs, {})
    x = ctx.value(inputs[0])
    shape = tuple(x.type.shape)
    axes = _axes_input(ctx, inputs)
    axes = tuple(i for i, d in enumerate(shape) if d == 1) if axes is None else _resolved_axes(axes, len(shape))
    if any(shape[a] != 1 for a in axes):
        raise Unsupported(f"squeezing axes {axes} of shape {shape}: only size-1 dims can be removed")
    return [ctx.graph.reshape(x, shape=tuple(d for i, d in enumerate(shape) if i not in axes))]


@rule("Unsqueeze")
def _unsqueeze(ctx, inputs, attrs):
    _only(attrs, {})
    x = ctx.value(inputs[0])
    shape = list(x.type.shape)
    axes = _axes_input(ctx, inputs)
    if axes is None:
        raise Unsupported("Unsqueeze without axes")
    for axis in _resolved_axes(axes, len(shape) + len(axes)):  # axes of the output, inserted in increasing order
        shape.insert(axis, 1)
    return [ctx.graph.reshape(x, shape=tuple(shape))]


@rule("Split")
def _split(ctx, inputs, attrs):
    """Slices along ``axis``: sizes from the ``split`` input, or ``num_outputs`` (opset 18) parts of
    ceil(extent / num_outputs), the last one smaller; with neither, as many equal parts as the node has outputs."""
    _only(attrs, {"axis": _ANY, "num_outputs": _ANY})
    x = ctx.value(inputs[0])
    axis = int(attrs.get("axis", 0)) % x.type.rank
    extent = x.type.shape[axis]
    if not isinstance(extent, int):
        raise Unsupported(f"splitting the symbolic dim {extent!r}")
    count = len(ctx.node_outputs)
    if len(inputs) > 1 and inputs[1]:
        sizes = [int(v) for v in np.asarray(ctx.constant(inputs[1], "split (the sizes)")).reshape(-1)]
    elif "num_outputs" in attrs:
        part = -(-extent // int(attrs["num_outputs"]))
        sizes = [min(part, extent - start) for start in range(0, extent, part)] if extent else [0] * count
    elif extent % count == 0:
        sizes = [extent // count] * count
    else:
        raise Unsupported(f"{extent} does not split into {count} equal parts")
    if len(sizes) != count or sum(sizes) != extent or min(sizes) < 0:
        raise Unsupported(f"split sizes {sizes} for {count} outputs of a dim of {extent}")
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
    return [ctx.graph.slice(x, starts=(int(start),), ends=(int(start) + size,), axes=(axis,))
            for start, size in zip(starts, sizes)]


@rule("Expand")
def _expand(ctx, inputs, attrs):
    """numpy broadcasting of the input and ``shape`` (a dim of 1 in ``shape`` keeps the input's); ``shape`` may hold
    symbolic dims (from Shape)."""
    _only(attrs, {})
    x = ctx.value(inputs[0])
    target = tuple(d if isinstance(d, str) else int(d)
                   for d in np.asarray(ctx.constant(inputs[1], "the target shape")).reshape(-1))
    return [ctx.graph.expand(x, shape=target)]


@rule("Where")
def _where(ctx, inputs, attrs):
    """A select; one whose condition is a constant of one truth value is the branch it picks, where that branch has
    the result's shape (ONNX's expanded Attention zeroes the rows its mask leaves empty: none, for a causal mask over
    at least as many keys as queries)."""
    _only(attrs, {})
    truth = np.asarray(ctx.constants.get(inputs[0], np.zeros(0, bool)))
    if truth.dtype == bool and truth.size:
        if truth.all() or not truth.any():
            picked, other = (inputs[1], inputs[2]) if truth.all() else (inputs[2], inputs[1])
            result = broadcast_shapes(broadcast_shapes(truth.shape, ctx.shape(other)), ctx.shape(picked))
            if tuple(result) == tuple(ctx.shape(picked)):
                return [ctx.value(picked)]
    return [ctx.graph.where(*(ctx.value(name) for name in inputs[:3]))]


def _reduce(ge2_op):
    def translate(ctx, inputs, attrs):
        _only(attrs, {"axes": _ANY, "keepdims": _ANY, "noop_with_empty_axes": _ANY})
        x = ctx.value(inputs[0])
        if ge2_op == "max" and x.type.dtype in ("int32", "int64") and _cast_from_bool(x):
            # The largest of truths cast to integers (torch's any() as the dynamo exporter writes it): any, cast
            return [ctx.graph.cast(any_of(ctx, x.producer.inputs[0], inputs, attrs), dtype=x.type.dtype)]
        if x.type.dtype == "bool" and ge2_op == "max":
            return [any_of(ctx, x, inputs, attrs)]
        return [reduce(ctx, _float_input(x, "input data"), inputs, attrs)]

    def any_of(ctx, mask, inputs, attrs):
        """Whether any element of the bool ``mask`` is true: the maximum of it as 0/1 floats, then > 0."""
        reduced = reduce(ctx, ctx.graph.cast(mask, dtype="float32"), inputs, attrs)
        zero = ctx.graph.param(_fresh_name(ctx.graph, "any_zero"), np.zeros((), np.float32))
        return ctx.graph.greater(reduced, zero)

    def reduce(ctx, x, inputs, attrs):
        axes = attrs.get("axes")
        if len(inputs) > 1 and inputs[1]:
            axes = np.asarray(ctx.constant(inputs[1], "axes")).reshape(-1)
        axes = None if axes is None or len(axes) == 0 else tuple(int(a) for a in axes)
        if axes is None and attrs.get("noop_with_empty_axes", 0):
            return x
        keepdims = bool(attrs.get("keepdims", 1))
        shape = x.type.shape
        reduced = range(len(shape)) if axes is None else [a % len(shape) for a in axes]
        if any(shape[a] == 0 for a in reduced):  # a reduction over nothing: ONNX's identity value, a constant
            out_shape = tuple(1 if i in reduced else d for i, d in enumerate(shape) if keepdims or i not in reduced)
            value = EMPTY_REDUCTION[ge2_op]
            return ctx.graph.param(_fresh_name(ctx.graph, f"empty_{ge2_op}"),
                                   np.full(out_shape, value, _numpy_dtype(x.type.dtype)))
        return getattr(ctx.graph, ge2_op)(x, axis=axes, keepdims=keepdims)

    return translate


def _cast_from_bool(x: Value) -> bool:
    """Whether ``x`` is a cast of a bool tensor (its values are 0 and 1)."""
    return x.producer is not None and x.producer.op == "cast" and x.producer.inputs[0].type.dtype == "bool"


EMPTY_REDUCTION = {"sum": 0.0, "mean": np.nan, "max": -np.inf}  # ONNX's results over an empty set


RULES["ReduceSum"] = _reduce("sum")
RULES["ReduceMean"] = _reduce("mean")
RULES["ReduceMax"] = _reduce("max")


# --- convolutional networks -------------------------------------------------------------------------------------
def _as_2d(g: Graph, x: Value, what: str) -> tuple[Value, bool]:
    """x as a 4-d NCHW tensor (a 1-d [N, C, L] one as [N, C, 1, L]) and whether it was 1-d."""
    if x.type.rank == 3:
        return g.reshape(x, shape=(x.type.shape[0], x.type.shape[1], 1, x.type.shape[2])), True
    if x.type.rank != 4:
        raise Unsupported(f"{what} of a rank-{x.type.rank} input (GE2 has 1-d and 2-d ones)")
    return x, False


@rule("Conv")
def _conv(ctx, inputs, attrs):
    """2-d convolution on conv2d; a 1-d one as a 2-d one of height 1."""
    _only(attrs, {"auto_pad": _ANY, "dilations": _ANY, "group": _ANY, "kernel_shape": _ANY, "pads": _ANY,
                  "strides": _ANY})
    g = ctx.graph
    x = _float_input(ctx.value(inputs[0]), "input X")
    w = ctx.value(inputs[1])
    if x.type.rank not in (3, 4) or w.type.rank != x.type.rank:
        raise Unsupported(f"Conv of a rank-{x.type.rank} input (GE2 convolves 1-d and 2-d ones)")
    strides, dilations, begin, end = _window_attrs(x, attrs, tuple(w.type.shape[2:]), "Conv")
    bias = ctx.value(inputs[2]) if len(inputs) > 2 and inputs[2] else None
    one_d = x.type.rank == 3
    if one_d:
        x, _ = _as_2d(g, x, "Conv")
        w = g.reshape(w, shape=(*w.type.shape[:2], 1, w.type.shape[2]))
        strides, dilations, begin, end = (1, *strides), (1, *dilations), (0, *begin), (0, *end)
    y = g.conv2d(x, w, bias, stride=strides, padding=(begin[0], end[0], begin[1], end[1]), dilation=dilations,
                 groups=int(attrs.get("group", 1)))
    return [g.reshape(y, shape=(*y.type.shape[:2], y.type.shape[3])) if one_d else y]


def _window_attrs(x: Value, attrs: dict, kernel: tuple, what: str):
    """(strides, dilations, begin pads, end pads) of a windowed node (Conv, MaxPool, AveragePool) over the spatial
    dims of x, auto_pad resolved (SAME_UPPER puts an odd padding at the end, SAME_LOWER at the beginning)."""
    spatial = tuple(x.type.shape[2:])
    if not all(isinstance(d, int) for d in spatial):
        raise Unsupported(f"{what} needs concrete spatial dims, got {spatial}")
    rank = len(spatial)
    strides = tuple(int(v) for v in attrs.get("strides", (1,) * rank))
    dilations = tuple(int(v) for v in attrs.get("dilations", (1,) * rank))
    pads = tuple(int(v) for v in attrs.get("pads", (0,) * 2 * rank))
    if not len(kernel) == len(strides) == len(dilations) == rank or len(pads) != 2 * rank:
        raise Unsupported(f"kernel_shape, strides, dilations or pads do not match the {rank} spatial dims")
    auto_pad = _decode(attrs.get("auto_pad", "NOTSET"))
    if auto_pad == "NOTSET":
        return strides, dilations, pads[:rank], pads[rank:]
    if auto_pad == "VALID":
        return strides, dilations, (0,) * rank, (0,) * rank
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"attribute auto_pad={auto_pad!r} is not supported")
    begin, end = [], []
    for extent, k, stride, dilation in zip(spatial, kernel, strides, dilations):
        total = max((-(-extent // stride) - 1) * stride + dilation * (k - 1) + 1 - extent, 0)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return strides, dilations, tuple(begin), tuple(end)


def _window_geometry(x: Value, attrs: dict, what: str):
    """(kernel, strides, dilations, begin pads, end pads, output sizes) of a pooling node, the output sizes by
    ONNX's rule (ceil_mode: the last window starts inside the input or its begin padding)."""
    kernel = tuple(int(v) for v in attrs["kernel_shape"])
    strides, dilations, begin, end = _window_attrs(x, attrs, kernel, what)
    spatial = tuple(x.type.shape[2:])
    ceil_mode = bool(attrs.get("ceil_mode", 0))
    outputs = []
    for index, extent in enumerate(spatial):
        span = dilations[index] * (kernel[index] - 1) + 1
        size = (extent + begin[index] + end[index] - span) / strides[index] + 1
        count = int(np.ceil(size)) if ceil_mode else int(np.floor(size))
        if ceil_mode and (count - 1) * strides[index] >= extent + begin[index]:
            count -= 1
        if count < 1:
            raise Unsupported(f"a window larger than the padded input along spatial dim {index}")
        outputs.append(count)
    return kernel, strides, dilations, begin, end, tuple(outputs)


def _pool(ctx, inputs, attrs, op: str):
    """MaxPool / AveragePool. 1-d and 2-d windows GE2's pooling ops take (symmetric pads of at most half the window,
    no dilation for averages) run on them; the rest (3-d, asymmetric or large pads, dilated averages) is pooled one
    spatial axis at a time from strided slices of the explicitly padded input (``_pool_axis``): max and average
    over a box are separable."""
    allowed = {"auto_pad": _ANY, "ceil_mode": _ANY, "dilations": _ANY, "kernel_shape": _ANY, "pads": _ANY,
               "strides": _ANY}
    if op == "max_pool2d":
        allowed["storage_order"] = lambda v: v in (0, 1)
    else:
        allowed["count_include_pad"] = _ANY
    _only(attrs, allowed)
    g = ctx.graph
    x = ctx.value(inputs[0])
    with_indices = op == "max_pool2d" and ctx.wants(1)
    if op == "max_pool2d" and x.type.dtype == "uint8":  # pooled in float32, which holds every uint8 exactly
        pooled = _pooled(g, g.cast(x, dtype="float32"), attrs, op, with_indices)
        pooled = (g.cast(pooled[0], dtype="uint8"), *pooled[1:]) if with_indices else g.cast(pooled, dtype="uint8")
    else:
        pooled = _pooled(g, _float_input(x, "input X"), attrs, op, with_indices)
    return list(pooled) if with_indices else [pooled]


def _tensor_indices(g: Graph, plane_indices: Value, plane_shape: tuple, storage_order: int) -> Value:
    """ONNX MaxPool's Indices from GE2's argmax within each plane (int32 ``h * W + w`` of a [N, C, H, W] input):
    int64 positions in the whole tensor, row-major (``storage_order`` 0: ``((n * C + c) * H + h) * W + w``) or with
    each plane column-major (1: ``(n * C + c) * H * W + w * H + h``)."""
    batch, channels, height, width = plane_shape
    if not isinstance(batch, int) or not isinstance(channels, int):
        raise Unsupported(f"the Indices output with a symbolic batch or channel count ({batch}, {channels})")
    plane = g.cast(plane_indices, dtype="int64")
    if storage_order == 1:
        row = g.div(plane, g.param(_fresh_name(g, "pool_width"), np.array(width, np.int64)))
        column = g.sub(plane, g.mul(row, g.param(_fresh_name(g, "pool_width"), np.array(width, np.int64))))
        plane = g.add(g.mul(column, g.param(_fresh_name(g, "pool_height"), np.array(height, np.int64))), row)
    offsets = (np.arange(batch * channels, dtype=np.int64) * height * width).reshape(batch, channels, 1, 1)
    return g.add(plane, g.param(_fresh_name(g, "pool_plane_offsets"), offsets))


def _pooled(g: Graph, x: Value, attrs, op: str, with_indices: bool = False):
    """``_pool``'s result for a float ``x``; with ``with_indices`` (max pooling), (the result, ONNX's Indices)."""
    if x.type.rank not in (3, 4, 5):
        raise Unsupported(f"{op} of a rank-{x.type.rank} input (GE2 pools 1-d, 2-d and 3-d windows)")
    kernel, strides, dilations, begin, end, outputs = _window_geometry(x, attrs, op)
    include_pad = bool(attrs.get("count_include_pad", 0))
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    direct = (x.type.rank < 5 and begin == end and all(p <= span // 2 for p, span in zip(begin, spans))
              and (op == "max_pool2d" or set(dilations) == {1}))
    if direct:
        x4, one_d = _as_2d(g, x, op)
        if one_d:  # the window on the width axis, the height axis a unit one
            kernel, strides, dilations = ((1, *values) for values in (kernel, strides, dilations))
            begin = (0, *begin)
        window = dict(kernel_size=kernel, stride=strides, padding=begin, ceil_mode=bool(attrs.get("ceil_mode", 0)))
        if op == "max_pool2d":
            y, plane_indices = g.max_pool2d(x4, dilation=dilations, **window)
        else:
            y = g.avg_pool2d(x4, count_include_pad=include_pad, **window)
        if tuple(y.type.shape[2:]) != ((1,) if one_d else ()) + outputs:
            raise Unsupported(f"{op} gives {y.type.shape[2:]} outputs where ONNX's rule gives {outputs}")
        results = [y]
        if with_indices:
            results.append(_tensor_indices(g, plane_indices, tuple(x4.type.shape), int(attrs.get("storage_order", 0))))
        if one_d:
            results = [g.reshape(r, shape=(*r.type.shape[:2], r.type.shape[3])) for r in results]
        return tuple(results) if with_indices else results[0]
    if with_indices:
        raise Unsupported("the Indices output of a window GE2 pools one axis at a time (3-d, asymmetric or large "
                          "pads)")
    y = x
    for axis in range(len(kernel)):
        y = _pool_axis(g, y, 2 + axis, kernel[axis], strides[axis], dilations[axis], begin[axis], end[axis],
                       outputs[axis], "max" if op == "max_pool2d" else "avg", include_pad)
    return y


def _pool_axis(g: Graph, x: Value, axis: int, kernel: int, stride: int, dilation: int, begin: int, end: int,
               count: int, mode: str, include_pad: bool) -> Value:
    """Max or average pooling of ``x`` along ``axis`` alone, as ONNX defines it: the input padded with ``begin`` /
    ``end`` values that never win a max (-inf) or add nothing to a sum (0), windows of ``kernel`` taps ``dilation``
    apart every ``stride``; an average divides by the taps inside the padded input (``include_pad``) or inside the
    input itself. The taps are ``kernel`` strided slices, stacked and reduced."""
    shape = list(x.type.shape)
    extent = shape[axis]
    needed = (count - 1) * stride + dilation * (kernel - 1) + 1  # what the windows read, ceil_mode's extra included
    tail = max(needed - begin - extent, 0)
    fill = -np.inf if mode == "max" else 0.0
    dtype = _numpy_dtype(x.type.dtype)
    pieces = []
    for size in (begin, tail):
        shape[axis] = size
        pieces.append(g.param(_fresh_name(g, "pool_pad"), np.full(shape, fill, dtype)) if size else None)
    padded = g.concat([p for p in (pieces[0], x, pieces[1]) if p is not None], axis=axis) if begin or tail else x
    taps = []
    for tap in range(kernel):
        start = tap * dilation
        sliced = g.slice(padded, starts=(start,), ends=(start + (count - 1) * stride + 1,), axes=(axis,),
                         steps=(stride,))
        taps.append(g.reshape(sliced, shape=(*sliced.type.shape[:axis + 1], 1, *sliced.type.shape[axis + 1:])))
    stacked = taps[0] if kernel == 1 else g.concat(taps, axis=axis + 1)
    if mode == "max":
        return g.max(stacked, axis=axis + 1, keepdims=False)
    total = g.sum(stacked, axis=axis + 1, keepdims=False)
    positions = np.arange(count)[:, None] * stride + np.arange(kernel)[None, :] * dilation  # in padded coordinates
    limit = (positions < begin + extent + end) if include_pad else ((positions >= begin) & (positions < begin + extent))
    divisor = np.maximum(limit.sum(axis=1), 1)
    scale_shape = [1] * x.type.rank
    scale_shape[axis] = count
    return g.mul(total, g.param(_fresh_name(g, "pool_divisor"), (1.0 / divisor).reshape(scale_shape).astype(dtype)))


RULES["MaxPool"] = lambda ctx, inputs, attrs: _pool(ctx, inputs, attrs, "max_pool2d")
RULES["AveragePool"] = lambda ctx, inputs, attrs: _pool(ctx, inputs, attrs, "avg_pool2d")


@rule("GlobalAveragePool")
def _global_average_pool(ctx, inputs, attrs):
    _only(attrs, {})
    g = ctx.graph
    x = _float_input(ctx.value(inputs[0]), "input X")
    x4, one_d = _as_2d(g, x, "GlobalAveragePool")
    y = g.global_avg_pool(x4)
    return [g.reshape(y, shape=(*x.type.shape[:2], 1)) if one_d else y]


@rule("GlobalMaxPool")
def _global_max_pool(ctx, inputs, attrs):
    """The maximum over every spatial axis (any number of them), kept as extents of 1."""
    _only(attrs, {})
    x = _float_input(ctx.value(inputs[0]), "input X")
    if x.type.rank < 3:
        raise Unsupported(f"GlobalMaxPool of a rank-{x.type.rank} input (expected [N, C, spatial...])")
    return [ctx.graph.max(x, axis=tuple(range(2, x.type.rank)), keepdims=True)]


@rule("BatchNormalization")
def _batch_normalization(ctx, inputs, attrs):
    """Inference (running statistics); ``training_mode=1`` normalizes with the batch statistics and returns ONNX's
    running statistics, ``momentum * running + (1 - momentum) * batch`` with the biased batch variance, computed
    from the op's saved statistics (GE2's own running update is PyTorch's, with the unbiased variance)."""
    _only(attrs, {"epsilon": _ANY, "momentum": _ANY, "training_mode": _ANY})
    g = ctx.graph
    x = _float_input(ctx.value(inputs[0]), "input X")
    params = float32_statistics(g, [ctx.value(name) for name in inputs[1:5]])
    for name, value in zip(("scale", "B", "input_mean", "input_var"), params):
        if value.type.dtype != "float32":
            raise Unsupported(f"{name} of dtype {value.type.dtype} (GE2's batch_norm keeps float32 statistics)")
    eps, momentum = float(attrs.get("epsilon", 1e-5)), float(attrs.get("momentum", 0.9))
    training = bool(attrs.get("training_mode", 0))
    if x.type.rank < 2:
        raise Unsupported(f"a rank-{x.type.rank} input")
    y, mean, invstd, _, _ = g.batch_norm(x, *params, training=training, momentum=1.0 - momentum, eps=eps)
    if not training:
        if ctx.wants(1) or ctx.wants(2):
            raise Unsupported("running statistic outputs without training_mode=1")
        return [y]
    float32 = np.float32

    def constant(value, label):
        return g.param(_fresh_name(g, f"batch_norm_{label}"), np.array(value, float32))

    variance = g.sub(g.div(constant(1.0, "one"), g.mul(invstd, invstd)), constant(eps, "eps"))
    keep, take = constant(momentum, "momentum"), constant(1.0 - momentum, "one_minus_momentum")
    running_mean = g.add(g.mul(params[2], keep), g.mul(mean, take))
    running_var = g.add(g.mul(params[3], keep), g.mul(variance, take))
    return [y, running_mean, running_var]


@rule("Attention")
def _attention(ctx, inputs, attrs):
    """ONNX's Attention (opset 23+). Q, K, V are 4-d [batch, heads, seq, head_dim], or 3-d [batch, seq, heads *
    head_dim] with q_num_heads / kv_num_heads; K/V heads may be grouped. Without a mask, a KV cache, softcap, a
    window, the qk_matmul_output or a V head size of its own, it is GE2's attention op (is_causal top-left as GE2's,
    scale). Otherwise it is lowered onto GE2 ops as ONNX's reference computes it: QK^T (a batched matmul, which
    canonicalization lowers to one 2-d gemm per batch and head; fine for small models, not fast), softcap, the
    additive bias (attn_mask, the causal and window masks aligned after the cache), softmax, and the product with V.
    ``nonpad_kv_seqlen`` must be a constant (the conformance backend binds it per value, as a Reshape's shape);
    boolean masks are not supported.
    A row whose keys the causal, window and length masks all exclude is 0, as in ONNX; one that only attn_mask
    excludes entirely gives NaN where ONNX gives 0."""
    _only(attrs, {"is_causal": _ANY, "scale": _ANY, "q_num_heads": _ANY, "kv_num_heads": _ANY, "softcap": _ANY,
                  "qk_matmul_output_mode": lambda v: v in (0, 1, 2, 3), "softmax_precision": _ANY,
                  "left_window_size": lambda v: v >= -1, "right_window_size": lambda v: v >= -1})
    lengths = None
    if len(inputs) > 6 and inputs[6]:
        lengths = np.asarray(ctx.constant(inputs[6], "nonpad_kv_seqlen (valid keys per batch entry)")).reshape(-1)
    g = ctx.graph
    q, k, v = (_float_input(ctx.value(name), label) for name, label in zip(inputs[:3], ("Q", "K", "V")))
    optional = {name: ctx.value(inputs[index]) if len(inputs) > index and inputs[index] else None
                for index, name in ((3, "attn_mask"), (4, "past_key"), (5, "past_value"))}
    if (optional["past_key"] is None) != (optional["past_value"] is None):
        raise Unsupported("past_key and past_value come together")
    causal = bool(attrs.get("is_causal", 0))
    scale = float(attrs["scale"]) if "scale" in attrs else None
    softcap = float(attrs.get("softcap", 0.0))
    window = (int(attrs.get("left_window_size", -1)), int(attrs.get("right_window_size", -1)))
    rank = q.type.rank
    if rank not in (3, 4) or k.type.rank != rank or v.type.rank != rank:
        raise Unsupported(f"Q, K, V of ranks {q.type.rank}, {k.type.rank}, {v.type.rank} (3-d or 4-d ones)")
    if rank == 3 and ("q_num_heads" not in attrs or "kv_num_heads" not in attrs):
        raise Unsupported("3-d Q, K, V need q_num_heads and kv_num_heads")
    simple = (all(value is None for value in optional.values()) and lengths is None and softcap == 0.0
              and window == (-1, -1)
              and not any(ctx.wants(index) for index in (1, 2, 3)) and v.type.shape[-1] * (
                  int(attrs["q_num_heads"]) if rank == 3 else 1) == q.type.shape[-1] * (
                  int(attrs["kv_num_heads"]) if rank == 3 else 1))
    if rank == 3:  # [batch, seq, heads * dim] -> [batch, seq, heads, dim]
        heads = {"Q": int(attrs["q_num_heads"]), "K": int(attrs["kv_num_heads"]), "V": int(attrs["kv_num_heads"])}
        split = []
        for label, value in zip(("Q", "K", "V"), (q, k, v)):
            batch, seq, width = value.type.shape
            if width % heads[label]:
                raise Unsupported(f"{label} width {width} is not a multiple of its {heads[label]} heads")
            split.append(g.reshape(value, shape=(batch, seq, heads[label], width // heads[label])))
        if simple:
            y = g.attention(*split, causal=causal, scale=scale, layout="bshd")[0]
            return [g.reshape(y, shape=(*q.type.shape[:2], -1))]
        q, k, v = (g.transpose(value, perm=(0, 2, 1, 3)) for value in split)
    elif simple:
        return [g.attention(q, k, v, causal=causal, scale=scale, layout="bhsd")[0]]
    y, present_key, present_value, scores = _attention_lowered(ctx, q, k, v, optional, lengths, causal, scale,
                                                               softcap, window,
                                                               int(attrs.get("qk_matmul_output_mode", 0)))
    if rank == 3:
        y = g.reshape(g.transpose(y, perm=(0, 2, 1, 3)), shape=(*y.type.shape[:1], y.type.shape[2], -1))
    return [y, present_key, present_value, scores]


def _attention_lowered(ctx, q, k, v, optional, lengths, causal, scale, softcap, window, mode):
    """ONNX's reference attention on GE2 ops, 4-d [batch, heads, seq, dim] inputs: (Y, present_key,
    present_value, qk_matmul_output). ``lengths``: nonpad_kv_seqlen's values (keys past them are masked, and the
    causal and window masks end there) or None."""
    g = ctx.graph
    dtype = _numpy_dtype(q.type.dtype)

    def constant(array, label):
        return g.param(_fresh_name(g, f"attention_{label}"), np.asarray(array, dtype))

    past = 0
    if optional["past_key"] is not None:
        past = optional["past_key"].type.shape[2]
        k = g.concat([optional["past_key"], k], axis=2)
        v = g.concat([optional["past_value"], v], axis=2)
    present_key, present_value = k, v
    batch, heads, seq_q, dim = q.type.shape
    kv_heads, seq_k = k.type.shape[1], k.type.shape[2]
    if heads != kv_heads:  # grouped K/V heads: each repeated for its group, [h0, h0, h1, h1, ...]
        if heads % kv_heads:
            raise Unsupported(f"{kv_heads} K/V heads do not divide the {heads} query heads")
        group = heads // kv_heads

        def repeat(value):
            parts = [g.reshape(value, shape=(batch, kv_heads, 1, seq_k, value.type.shape[3]))] * group
            return g.reshape(g.concat(parts, axis=2), shape=(batch, heads, seq_k, value.type.shape[3]))

        k, v = repeat(k), repeat(v)
    root = np.sqrt(dim ** -0.5 if scale is None else scale)  # ONNX scales Q and K by sqrt(scale) each
    scaled_q = g.mul(q, constant(root, "scale"))
    scaled_k = g.mul(g.transpose(k, perm=(0, 1, 3, 2)), constant(root, "scale"))
    scores = batched_matmul(g, scaled_q, scaled_k)
    if softcap > 0:
        scores = g.mul(g.tanh(g.mul(scores, constant(1.0 / softcap, "softcap_inverse"))),
                       constant(softcap, "softcap"))
    # The additive bias: the mask (padded with -inf up to the keys), then the causal and window masks, aligned
    # after the cache (query i is at position past + i, or lengths[b] - seq_q + i with nonpad_kv_seqlen).
    bias = optional["attn_mask"]
    keep = None  # a boolean mask: True keeps a key (its bias is made below, once the static masks are known)
    if bias is not None and bias.type.dtype == "bool":
        keep, bias = bias, None
        missing = seq_k - keep.type.shape[-1]
        if missing > 0:
            pad = g.param(_fresh_name(g, "attention_mask_pad"), np.zeros((*keep.type.shape[:-1], missing), bool))
            keep = g.concat([keep, pad], axis=keep.type.rank - 1)
    if bias is not None:
        if bias.type.dtype != q.type.dtype:
            raise Unsupported(f"attn_mask of dtype {bias.type.dtype} (a {q.type.dtype} additive mask is supported)")
        missing = seq_k - bias.type.shape[-1]
        if missing > 0:
            pad = constant(np.full((*bias.type.shape[:-1], missing), -np.inf), "mask_pad")
            bias = g.concat([bias, pad], axis=bias.type.rank - 1)
    offset = past if lengths is None else (lengths - seq_q).reshape(-1, 1, 1, 1)
    position = np.arange(seq_q)[:, None] + offset - np.arange(seq_k)[None, :]  # query position - key position
    allowed = np.ones(position.shape, bool)
    if causal:
        allowed &= position >= 0
    if window[0] >= 0:
        allowed &= position <= window[0]
    if window[1] >= 0:
        allowed &= -position <= window[1]
    if lengths is not None:
        if lengths.shape != (batch,):
            raise Unsupported(f"nonpad_kv_seqlen of shape {lengths.shape} for a batch of {batch}")
        allowed &= np.arange(seq_k) < lengths.reshape(-1, 1, 1, 1)
    # A row the causal/window/length masks leave no key is zero in ONNX: its bias stays finite (no NaN from a
    # softmax over -inf only) and its probabilities are multiplied by 0.
    empty_rows = ~allowed.any(axis=-1, keepdims=True)
    has_key = None
    if keep is not None:  # rows the boolean and static masks together leave no key are 0 too, as in ONNX
        reachable = g.mul(g.cast(keep, dtype=q.type.dtype), constant(allowed, "allowed"))
        has_key = g.greater(g.max(reachable, axis=-1, keepdims=True), constant(0.0, "zero"))
        bias = g.where(g.logical_or(keep, g.logical_not(has_key)), constant(0.0, "mask_keep"),
                       constant(-np.inf, "mask_drop"))
    if not allowed.all():
        static = constant(np.where(allowed | empty_rows, 0.0, -np.inf), "static_mask")
        bias = static if bias is None else g.add(bias, static)
    with_bias = scores if bias is None else g.add(scores, bias)
    probabilities = g.softmax(with_bias, axis=-1)
    if empty_rows.any():
        probabilities = g.mul(probabilities, constant(~empty_rows, "empty_rows"))
    if has_key is not None:  # a select, not a product: the softmax of a row with no key left is NaN
        probabilities = g.where(has_key, probabilities, constant(0.0, "zero"))
    output = {0: scores, 1: scores, 2: with_bias, 3: probabilities}[mode]
    return batched_matmul(g, probabilities, v), present_key, present_value, output


ONNX_DOUBLE = 11  # TensorProto.DOUBLE


@rule("Cast")
def _cast(ctx, inputs, attrs):
    """A cast; one of a float tensor to float64 (an expanded function's wider softmax or log-sum-exp) computes in
    float32: GE2 has no float64, and its Attention computes softmax_precision=double in float32 as well. A float64
    value must not reach a graph output (``load`` refuses one)."""
    _only(attrs, {"to": _ANY, "saturate": _ANY, "round_mode": _ANY})
    x = ctx.value(inputs[0])
    if int(attrs["to"]) == ONNX_DOUBLE and x.type.dtype in FLOAT_DTYPES:
        return [_cast_to(ctx, x, "float32")]
    target = _dtype_names().get(int(attrs["to"]))
    if target is None:
        raise Unsupported(f"cast to ONNX element type {attrs['to']}")
    return [_cast_to(ctx, x, target)]


@rule("CastLike")
def _cast_like(ctx, inputs, attrs):
    """A cast to the element type of the second input (whose values are not read)."""
    _only(attrs, {"saturate": _ANY, "round_mode": _ANY})
    like = inputs[1]
    if like in ctx.constants:
        array = ctx.constants[like]
        if array.dtype.name not in ALL_DTYPES:
            raise Unsupported(f"cast like '{like}' of dtype {array.dtype}; GE2 has {', '.join(ALL_DTYPES)}")
        target = array.dtype.name
    else:
        target = ctx.value(like).type.dtype
    if inputs[0] in ctx.constants:  # a constant stays one (a pad value; shape arithmetic, as Cast's fold keeps it)
        constant = ctx.constants[inputs[0]]
        return [constant if _is_symbolic(constant) else constant.astype(_numpy_dtype(target))]
    return [_cast_to(ctx, ctx.value(inputs[0]), target)]


def _cast_to(ctx, x: Value, target: str) -> Value:
    if target == x.type.dtype:
        return x
    if "cast" not in _registered_ops():
        raise Unsupported(f"cast {x.type.dtype} -> {target}: GE2 has no cast op")
    return ctx.graph.cast(x, dtype=target)


def _registered_ops():
    from ..ops import OPS

    return OPS


def _numpy_dtype(name: str):
    from ..dtypes import to_numpy

    return to_numpy(name)


# --- shape and index ops (ops/indexing.py) ---------------------------------------------------------------------
def _optional_constant(ctx, inputs, index: int, what: str):
    return np.asarray(ctx.constant(inputs[index], what)) if len(inputs) > index and inputs[index] else None


@rule("Pad")
def _pad(ctx, inputs, attrs):
    """Constant, reflect, edge and wrap padding; ``pads`` (and ``axes``, opset 18) are constants."""
    _only(attrs, {"mode": lambda v: v in ("constant", "reflect", "edge", "wrap")})
    x = ctx.value(inputs[0])
    rank = x.type.rank
    pads = [int(p) for p in np.asarray(ctx.constant(inputs[1], "pads")).reshape(-1)]
    value = _optional_constant(ctx, inputs, 2, "constant_value")
    axes = _optional_constant(ctx, inputs, 3, "axes")
    if axes is not None:  # pads for the listed axes only: spread over every axis
        axes = [int(a) % rank for a in axes.reshape(-1)]
        full = [0] * (2 * rank)
        for index, axis in enumerate(axes):
            full[axis], full[rank + axis] = pads[index], pads[len(axes) + index]
        pads = full
    value = 0.0 if value is None or value.size == 0 else float(value.reshape(-1)[0])
    return [ctx.graph.pad(x, pads=tuple(pads), mode=_decode(attrs.get("mode", "constant")), value=value)]


@rule("Tile")
def _tile(ctx, inputs, attrs):
    _only(attrs, {})
    repeats = tuple(int(r) for r in np.asarray(ctx.constant(inputs[1], "repeats")).reshape(-1))
    return [ctx.graph.tile(ctx.value(inputs[0]), repeats=repeats)]


@rule("CumSum")
def _cumsum(ctx, inputs, attrs):
    _only(attrs, {"exclusive": _ANY, "reverse": _ANY})
    axis = int(np.asarray(ctx.constant(inputs[1], "axis")).reshape(-1)[0])
    return [ctx.graph.cumsum(ctx.value(inputs[0]), axis=axis, exclusive=bool(attrs.get("exclusive", 0)),
                             reverse=bool(attrs.get("reverse", 0)))]


@rule("Trilu")
def _trilu(ctx, inputs, attrs):
    _only(attrs, {"upper": _ANY})
    k = _optional_constant(ctx, inputs, 1, "k")
    return [ctx.graph.trilu(ctx.value(inputs[0]), k=0 if k is None else int(k.reshape(-1)[0]),
                            upper=bool(attrs.get("upper", 1)))]


@rule("Range")
def _range(ctx, inputs, attrs):
    """A range whose limit is a symbolic dim (constant ranges fold at import): ``_arange.symbolic_range``."""
    _only(attrs, {})
    start, limit, delta = (np.asarray(ctx.constant(name, what)).reshape(-1)[0]
                           for name, what in zip(inputs, ("start", "limit", "delta")))
    dtype = ctx.value_info.get(ctx.node_outputs[0], (None, None))[1] or "int64"
    return [symbolic_range(ctx.graph, start, limit, delta, dtype)]


@rule("ConstantOfShape")
def _constant_of_shape(ctx, inputs, attrs):
    """A constant broadcast to a shape with symbolic dims (constant shapes fold at import): a one-element param
    expanded to the shape (of rank >= 1: it has a symbolic dim), bound with the plan's dims."""
    _only(attrs, {"value": _ANY})
    shape = tuple(_dim_of(d) for d in np.asarray(ctx.constant(inputs[0], "the shape")).reshape(-1))
    value = _onnx().numpy_helper.to_array(attrs["value"]) if "value" in attrs else np.zeros(1, np.float32)
    element = ctx.graph.param(_fresh_name(ctx.graph, "constant_of_shape"), np.asarray(value).reshape(1))
    return [ctx.graph.expand(element, shape=shape)]


@rule("Resize")
def _resize(ctx, inputs, attrs):
    """Resizing of the last two axes of a 4-d (or 3-d, last axis) tensor; sizes or scales (and roi) constant,
    leading axes unscaled. Nearest and (bi)linear with the coordinate transformations half_pixel,
    pytorch_half_pixel, align_corners and asymmetric run as the resize op; the other modes (cubic, antialias,
    exclude_outside, half_pixel_symmetric, tf_crop_and_resize) as one matmul per axis with interpolation weights
    computed at import (``_resize``)."""
    _only(attrs, {"mode": lambda v: v in ("nearest", "linear", "cubic"),
                  "coordinate_transformation_mode": lambda v: v in (*RESIZE_COORDINATES, "half_pixel_symmetric",
                                                                    "tf_crop_and_resize"),
                  "nearest_mode": _ANY, "cubic_coeff_a": _ANY, "exclude_outside": _ANY, "extrapolation_value": _ANY,
                  "antialias": _ANY, "keep_aspect_ratio_policy": lambda v: v in ("stretch", "not_larger",
                                                                                 "not_smaller"), "axes": _ANY})
    g = ctx.graph
    x = _float_input(ctx.value(inputs[0]), "input X")
    rank = x.type.rank
    scales = _optional_constant(ctx, inputs, 2, "scales")
    sizes = _optional_constant(ctx, inputs, 3, "sizes")
    if "axes" in attrs:  # scales / sizes of the listed axes only: spread over every axis (1 / the input's extent)
        axes = [int(a) % rank for a in attrs["axes"]]
        if scales is not None and scales.size:
            full = np.ones(rank)
            full[axes] = scales.reshape(-1)
            scales = full
        if sizes is not None and sizes.size:
            full = np.array(x.type.shape, object)
            full[axes] = sizes.reshape(-1)
            sizes = full
    if rank not in (3, 4) or not all(isinstance(d, int) for d in x.type.shape[2:]):
        raise Unsupported(f"resizing a rank-{rank} tensor of shape {x.type.shape} (GE2 resizes the concrete last "
                          "two axes of 4-d, or the last of 3-d)")
    spatial = tuple(x.type.shape[2:])
    policy = _decode(attrs.get("keep_aspect_ratio_policy", "stretch"))
    if sizes is not None and sizes.size and policy != "stretch":  # one scale for the resized axes, sizes rounded
        resized = [int(a) % rank for a in attrs.get("axes", range(rank))]
        ratios = [int(sizes.reshape(-1)[a]) / x.type.shape[a] for a in resized]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        scales = np.array([scale if a in resized else 1.0 for a in range(rank)])
        sizes = np.array([int(scale * d + 0.5) if a in resized else d for a, d in enumerate(x.type.shape)])
        given = tuple(float(v) for v in scales[2:])
    else:
        given = None
    if sizes is not None and sizes.size:
        sizes = tuple(_dim_of(v) for v in sizes.reshape(-1))  # the leading ones symbolic where x's are
        if sizes[:2] != tuple(x.type.shape[:2]):
            raise Unsupported(f"sizes {sizes} change the leading axes")
        if not all(isinstance(d, int) for d in sizes[2:]):
            raise Unsupported(f"sizes {sizes}: GE2 resizes to concrete extents")
        out, given_scales = sizes[2:], given
    elif scales is not None and scales.size:
        scales = tuple(float(v) for v in scales.reshape(-1))
        if scales[:2] != (1.0, 1.0):
            raise Unsupported(f"scales {scales} change the leading axes")
        out = tuple(int(np.floor(n * s)) for n, s in zip(spatial, scales[2:]))
        given_scales = scales[2:]
    else:
        raise Unsupported("Resize without scales or sizes")
    mode = _decode(attrs.get("mode", "nearest"))
    coordinates = _decode(attrs.get("coordinate_transformation_mode", "half_pixel"))
    if (mode == "cubic" or coordinates not in RESIZE_COORDINATES or attrs.get("exclude_outside", 0)
            or attrs.get("antialias", 0)):
        return [_resize_by_matmuls(ctx, inputs, attrs, x, out, given_scales, mode, coordinates)]
    one_d = rank == 3
    if one_d:
        x = g.reshape(x, shape=(*x.type.shape[:2], 1, spatial[0]))
        out, given_scales = (1, *out), None if given_scales is None else (1.0, *given_scales)
    y = g.resize(x, size=out, mode=mode, coordinates=coordinates,
                 nearest_mode=_decode(attrs.get("nearest_mode", "round_prefer_floor")), scales=given_scales)
    return [g.reshape(y, shape=(*y.type.shape[:2], out[-1])) if one_d else y]


def _resize_by_matmuls(ctx, inputs, attrs, x: Value, out: tuple, scales: tuple | None, mode: str,
                       coordinates: str) -> Value:
    """Resize as one matmul per resized axis (the last two of a 4-d x, the last of a 3-d one) with its [out, in]
    interpolation weights; tf_crop_and_resize's positions outside the input then take extrapolation_value."""
    g = ctx.graph
    rank = x.type.rank
    spatial = tuple(x.type.shape[2:])
    scales = scales or tuple(o / i for o, i in zip(out, spatial))
    roi = _optional_constant(ctx, inputs, 1, "roi")
    if coordinates == "tf_crop_and_resize":
        if roi is None or not roi.size:
            raise Unsupported("tf_crop_and_resize without a roi")
        resized_axes = [int(a) % rank for a in attrs.get("axes", range(rank))]
        roi = roi.reshape(2, -1).astype(np.float32)  # ONNX's roi is float32: coordinates as ONNX computes them
        bounds = [(roi[0][resized_axes.index(a)], roi[1][resized_axes.index(a)]) if a in resized_axes else (0.0, 1.0)
                  for a in range(2, rank)]
    else:
        bounds = [(0.0, 1.0)] * len(spatial)
    options = dict(mode=mode, coordinates=coordinates, nearest_mode=_decode(attrs.get("nearest_mode",
                                                                                      "round_prefer_floor")),
                   cubic_a=float(attrs.get("cubic_coeff_a", -0.75)),
                   exclude_outside=bool(attrs.get("exclude_outside", 0)), antialias=bool(attrs.get("antialias", 0)))
    dtype = _numpy_dtype(x.type.dtype)
    y, outside = x, np.zeros(out, bool)
    for axis, (in_length, out_length, scale, roi_bounds) in enumerate(zip(spatial, out, scales, bounds)):
        weights, inside = interpolation_weights(in_length, out_length, scale, roi=roi_bounds, **options)
        outside |= ~inside.reshape((-1,) + (1,) * (len(spatial) - 1 - axis))
        matrix = g.param(_fresh_name(g, "resize_weights"), weights.astype(dtype))
        if axis == len(spatial) - 1:  # the last axis: rows of y times weights^T, one 2-d matmul
            rows = g.reshape(y, shape=(-1, in_length))
            transposed = g.param(_fresh_name(g, "resize_weights"), np.ascontiguousarray(weights.T).astype(dtype))
            y = g.reshape(g.matmul(rows, transposed), shape=(*y.type.shape[:-1], out_length))
        else:  # axis -2: weights times every [in, width] plane
            y = g.matmul(matrix, y)
    if outside.any():  # positions outside the input: their weights are zero, the value is added
        value = float(attrs.get("extrapolation_value", 0.0)) * outside
        y = g.add(y, g.param(_fresh_name(g, "extrapolation"), value.astype(dtype)))
    return y


@rule("Einsum")
def _einsum(ctx, inputs, attrs):
    _only(attrs, {"equation": _ANY})
    return [einsum(ctx.graph, _decode(attrs["equation"]), [ctx.value(name) for name in inputs])]


# ---------------------------------------------------------------------------------------------------------------
# Constant folding
# ---------------------------------------------------------------------------------------------------------------
# Random results (Dropout too: its rule imports it for inference, where it is the identity, or rejects it).
_NOT_FOLDED = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
               "Dropout"}


def _foldable(ctx: _Context, node) -> bool:
    """Whether every input of ``node`` is a known constant (and its result is deterministic, with no subgraph)."""
    inputs = [name for name in node.input if name]
    return bool(inputs) and all(name in ctx.constants for name in inputs) and _folds(node)


def _folds(node) -> bool:
    """Whether ``node`` folds when its inputs are constants: deterministic, with no subgraph."""
    return node.op_type not in _NOT_FOLDED and not any(
        a.type in (_onnx().AttributeProto.GRAPH, _onnx().AttributeProto.GRAPHS) for a in node.attribute)


def _derived_from(ctx: _Context, node) -> frozenset:
    """The integer graph inputs the outputs of ``node`` are computed from, where it folds once they are constants
    (every input a constant or derived from them, at least one derived); empty otherwise."""
    inputs = [name for name in node.input if name]
    if not inputs or not _folds(node) or not all(name in ctx.constants or name in ctx.derived for name in inputs):
        return frozenset()
    return frozenset().union(*(ctx.derived.get(name, frozenset()) for name in inputs))


def _is_symbolic(array) -> bool:
    return isinstance(array, np.ndarray) and array.dtype == object


def _elementwise(combine):
    """A binary op over arrays of ints and symbolic dims (numpy broadcasting)."""
    function = np.frompyfunc(lambda a, b: combine(a if isinstance(a, str) else int(a),
                                                  b if isinstance(b, str) else int(b)), 2, 1)
    return lambda a, b: np.asarray(function(a, b), object)


def _dim_of(entry):
    return entry if isinstance(entry, str) else int(entry)


def _at_least(a, b) -> bool:
    """Whether dim ``a`` >= dim ``b``, known for every size (ir/dims.py: names are >= 1); a comparison that depends
    on the sizes is refused."""
    known = dims.greater_or_equal(_dim_of(a), _dim_of(b))
    if known is None:
        raise Unsupported(f"comparing the dims {a!r} and {b!r}: the result depends on the sizes")
    return known


def _equal(a, b) -> bool:
    order = dims.compare(_dim_of(a), _dim_of(b))
    if order is None:
        raise Unsupported(f"comparing the dims {a!r} and {b!r}: the result depends on the sizes")
    return order == 0


def _comparison(test):
    """A comparison of dims (numpy broadcasting): a bool array, known when the graph is imported."""
    function = np.frompyfunc(test, 2, 1)
    return lambda inputs, attrs: np.asarray(function(inputs[0], inputs[1]), bool)


def _extremum(pick_first):
    """Min / Max of dims over the inputs (numpy broadcasting), where their order is known for every size."""
    function = np.frompyfunc(lambda a, b: a if pick_first(a, b) else b, 2, 1)

    def fold(inputs, attrs):
        result = np.asarray(inputs[0], object)
        for other in inputs[1:]:
            result = np.asarray(function(result, other), object)
        return result

    return fold


def _modulo(a, b):
    """``a mod b`` of a dim by a positive int (ONNX Mod with fmod=0: the divisor's sign): a - b * (a // b)."""
    if isinstance(b, str) or int(b) <= 0:
        raise ValueError(f"{a!r} mod {b!r}: GE2 takes a symbolic dim modulo a positive integer")
    return dims.subtract(a, dims.product(b, dims.floor_divide(a, b)))


def _axes_of(inputs, attrs):
    """The axes of a Squeeze / Unsqueeze: the second input (opset 13) or the attribute."""
    if len(inputs) > 1 and inputs[1] is not None:
        return [int(a) for a in np.asarray(inputs[1]).reshape(-1)]
    return [int(a) for a in attrs.get("axes", [])]


def _symbolic_slice(inputs, attrs):
    data = inputs[0]
    starts, ends = (np.asarray(v).reshape(-1) for v in inputs[1:3])
    if any(isinstance(v, str) for v in (*starts, *ends)):
        raise Unsupported("slicing a shape at a symbolic position")
    axes = np.asarray(inputs[3]).reshape(-1) if len(inputs) > 3 and inputs[3] is not None else range(len(starts))
    steps = np.asarray(inputs[4]).reshape(-1) if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    index = [slice(None)] * data.ndim
    for axis, start, end, step in zip(axes, starts, ends, steps):
        index[int(axis)] = slice(int(start), int(end), int(step))
    return data[tuple(index)]


# Shape arithmetic with symbolic dims (object arrays of ints and dim names): the op types exporters write between a
# Shape and the Reshape / Expand that reads it. Each takes the node's inputs (None for absent ones) and attributes.
SYMBOLIC_FOLDS = {
    "Identity": lambda inputs, attrs: inputs[0],
    # The extents of a shape-valued constant are ints even where its entries are symbolic
    "Shape": lambda inputs, attrs: np.asarray(inputs[0].shape[slice(attrs.get("start"), attrs.get("end"))],
                                              np.int64),
    "Cast": lambda inputs, attrs: inputs[0],  # int64 <-> int32 of sizes
    "Gather": lambda inputs, attrs: np.take(inputs[0], np.asarray(inputs[1]).astype(np.int64),
                                            axis=int(attrs.get("axis", 0))),
    "Unsqueeze": lambda inputs, attrs: np.expand_dims(
        inputs[0], tuple(sorted(a % (inputs[0].ndim + len(_axes_of(inputs, attrs)))
                                for a in _axes_of(inputs, attrs)))),
    "Squeeze": lambda inputs, attrs: np.squeeze(inputs[0], axis=tuple(_axes_of(inputs, attrs)) or None),
    "Concat": lambda inputs, attrs: np.concatenate([np.asarray(i, object) for i in inputs], axis=int(attrs["axis"])),
    "Reshape": lambda inputs, attrs: np.reshape(inputs[0], [int(d) for d in np.asarray(inputs[1]).reshape(-1)]),
    "Slice": lambda inputs, attrs: _symbolic_slice(inputs, attrs),
    "Add": lambda inputs, attrs: _elementwise(dims.add)(inputs[0], inputs[1]),
    "Sub": lambda inputs, attrs: _elementwise(dims.subtract)(inputs[0], inputs[1]),
    "Mul": lambda inputs, attrs: _elementwise(dims.product)(inputs[0], inputs[1]),
    # Sizes are >= 0, where ONNX's integer Div (truncating) is the floor division.
    "Div": lambda inputs, attrs: _elementwise(dims.floor_divide)(inputs[0], inputs[1]),
    "Mod": lambda inputs, attrs: _elementwise(_modulo)(inputs[0], inputs[1]),
    "Neg": lambda inputs, attrs: _elementwise(dims.subtract)(0, inputs[0]),
    "Max": _extremum(_at_least),
    "Min": _extremum(lambda a, b: _at_least(b, a)),
    "Equal": _comparison(_equal),
    "Less": _comparison(lambda a, b: not _at_least(a, b)),
    "LessOrEqual": _comparison(lambda a, b: _at_least(b, a)),
    "Greater": _comparison(lambda a, b: not _at_least(b, a)),
    "GreaterOrEqual": _comparison(_at_least),
    "Where": lambda inputs, attrs: np.where(np.asarray(inputs[0], bool), inputs[1], inputs[2]).astype(object),
    "ReduceProd": lambda inputs, attrs: np.asarray(dims.product(*np.asarray(inputs[0]).reshape(-1)), object),
}


def _fold_symbolic(node, ctx: _Context) -> list | None:
    """``node`` on constant inputs some of which hold symbolic dims (``SYMBOLIC_FOLDS``); None for an op type that
    makes a tensor of a symbolic size (Range, ConstantOfShape), which its rule translates."""
    fold = SYMBOLIC_FOLDS.get(node.op_type)
    if node.op_type in ("Range", "ConstantOfShape"):  # positions up to a symbolic length, a filled mask: tensors
        return None
    if node.op_type in ("Slice", "Expand") and not _is_symbolic(ctx.constants[node.input[0]]):
        return None  # a constant tensor (position ids) sliced or broadcast to a symbolic size: the op, bound per plan
    if fold is None:
        raise Unsupported(f"{node.op_type} of a shape with symbolic dims: GE2 folds "
                          f"{', '.join(sorted(SYMBOLIC_FOLDS))} of symbolic shapes")
    inputs = [ctx.constants[name] if name else None for name in node.input]
    try:
        result = np.asarray(fold(inputs, _attributes(node)), object)  # a 0-d result of one name stays an array
    except ValueError as error:  # a quotient that does not divide, axes that do not fit
        raise Unsupported(f"shape arithmetic on symbolic dims: {error}") from None
    entries = result.reshape(-1)
    if any(isinstance(d, str) for d in entries):
        return [result]
    # The names cancelled out (a dim divided by itself) or the result is a comparison: a plain array again.
    return [result.astype(bool if all(isinstance(d, (bool, np.bool_)) for d in entries) else np.int64)]


# Op types whose ONNX reference implementation fails on what exporters write, folded by GE2's reference instead:
# onnx.reference's GatherElements picks with np.choose, which takes at most 32 choices (BERT's token type ids are
# GatherElements of a [1, max_positions] buffer).
GE2_FOLDS = {
    "GatherElements": lambda inputs, attrs: reference_gather_elements(inputs[0], inputs[1], int(attrs.get("axis", 0))),
}


def _fold(node, ctx: _Context) -> list | None:
    """The outputs of ``node`` on its constant inputs, computed by ONNX's reference implementation at the model's
    opset (``_fold_symbolic`` when an input holds symbolic dims, ``GE2_FOLDS`` where ONNX's reference fails; None:
    not folded, translated by its rule)."""
    from onnx.reference import ReferenceEvaluator

    if any(_is_symbolic(ctx.constants[name]) for name in node.input if name):
        return _fold_symbolic(node, ctx)
    if node.op_type in GE2_FOLDS:
        inputs = [ctx.constants[name] if name else None for name in node.input]
        try:
            result = GE2_FOLDS[node.op_type](inputs, _attributes(node))
        except (ValueError, IndexError) as error:  # indices that do not fit the data
            raise Unsupported(f"folding this node of constant inputs failed: {error}") from None
        return [np.asarray(result).astype(np.asarray(inputs[0]).dtype)]

    try:
        evaluator = ReferenceEvaluator(node, opsets={"": ctx.opset})
        outputs = evaluator.run(None, {name: ctx.constants[name] for name in node.input if name})
    except Exception as error:  # the reference raises its own errors for inputs it rejects
        raise Unsupported(f"folding this node of constant inputs failed: {type(error).__name__}: {error}") from None
    return [np.asarray(output) for output in outputs]


# ---------------------------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------------------------
def supported_op_types() -> list[str]:
    """The ONNX op types ``load`` translates (each may still reject some attribute values or dtypes)."""
    return sorted(RULES)


def read_model(path) -> "onnx.ModelProto":
    """The ModelProto in the file ``path``; OSError (missing, a directory) or ValueError (not an ONNX model) naming
    the file."""
    onnx = _onnx()
    name = os.fspath(path)
    if os.path.isdir(name):
        raise IsADirectoryError(f"model: {name!r} is a directory, not an .onnx file")
    try:
        model = onnx.load(name)
    except OSError:
        raise  # names the file already
    except Exception as error:  # protobuf's DecodeError and its relatives
        raise ValueError(f"model: {name!r} is not an ONNX model: it does not parse as an ONNX protobuf "
                         f"({type(error).__name__}: {error})") from None
    if not model.HasField("graph"):
        raise ValueError(f"model: {name!r} is not an ONNX model: it holds no graph "
                         f"({os.path.getsize(name)} bytes)")
    return model


def load(model, input_shapes: dict | None = None, constant_inputs: dict | None = None, name: str | None = None) -> Graph:
    """An ONNX model (a path, the serialized bytes, a binary file-like object or a ``ModelProto``, as
    ``onnx.load`` takes) as a GE2 graph.

    ``input_shapes`` (input name -> shape) overrides declared input shapes, e.g. to bind a dim the model leaves
    unnamed. ``constant_inputs`` (input name -> array) fixes graph inputs to values, for inputs an op needs when the
    graph is built (a Reshape's shape, a Slice's starts): they stop being inputs. Raises ``UnsupportedModelError``
    listing every node GE2 cannot import (and, in ``constant_inputs``, which inputs want a fixed value)."""
    onnx = _onnx()
    if isinstance(model, (str, os.PathLike)):
        model = read_model(model)
    elif isinstance(model, (bytes, bytearray, memoryview)):
        model = onnx.load_model_from_string(bytes(model))
    elif hasattr(model, "read"):
        model = onnx.load(model)
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model: expected a path, bytes, a binary file-like object or an onnx.ModelProto, got "
                        f"{type(model).__name__}")
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    model_name = name or model.graph.name or "onnx_model"
    if opset < MIN_OPSET:  # older models are read through ONNX's own converter
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
        except Exception as error:  # the converter raises its own C++ errors
            raise UnsupportedModelError(model_name, [("(model)", "opset", f"opset {opset} could not be converted "
                                                     f"to opset {MIN_OPSET}: {error}")]) from None
        opset = MIN_OPSET
    model = onnx.shape_inference.infer_shapes(model)
    dtypes = _dtype_names()
    value_info = {}
    for info in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        tensor_type = info.type.tensor_type
        shape = None
        if tensor_type.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else _dim_param(d.dim_param)
                          for d in tensor_type.shape.dim)
        value_info[info.name] = (shape, dtypes.get(tensor_type.elem_type))

    graph = Graph(model_name)
    ctx = _Context(graph, opset, value_info)
    problems: list[tuple[str, str, str]] = []
    for initializer in model.graph.initializer:
        ctx.constants[initializer.name] = onnx.numpy_helper.to_array(initializer)
    overrides = dict(input_shapes or {})
    fixed = dict(constant_inputs or {})
    graph_inputs = {info.name for info in model.graph.input}
    unknown = sorted(set(fixed) - graph_inputs)
    if unknown:
        raise ValueError(f"constant_inputs: unknown input(s) {unknown}; the model's inputs are {sorted(graph_inputs)}")
    ctx.constants.update((input_name, np.asarray(array)) for input_name, array in fixed.items())
    needs_constant: set[str] = set()
    for info in model.graph.input:
        if info.name in ctx.constants:
            continue  # an initializer listed as an input (IR version < 4), or fixed by constant_inputs
        shape, dtype = value_info[info.name]
        shape = tuple(overrides.pop(info.name, shape) or ())
        if dtype is None:
            problems.append((info.name, "input", f"element type {info.type.tensor_type.elem_type} is not supported"))
            ctx.failed.add(info.name)
            continue
        if any(d is None for d in shape):
            problems.append((info.name, "input", f"shape {shape} has a dim with no name and no size; pass "
                                                 "input_shapes={...} to bind it"))
            ctx.failed.add(info.name)
            continue
        ctx.values[info.name] = graph.input(_fresh_name(graph, info.name), shape, dtype)
        if dtype in ("int32", "int64"):  # sizes and shapes come as integers
            ctx.derived[info.name] = frozenset({info.name})
    if overrides:
        raise ValueError(f"input_shapes: unknown input(s) {sorted(overrides)}")

    for index, node in enumerate(model.graph.node):
        node_name = node.name or f"{node.op_type}_{index}"
        standard = node.domain in ("", "ai.onnx")
        if any(name in ctx.failed for name in node.input):
            if not standard or node.op_type not in RULES:  # listed too: it would fail whatever its inputs
                problems.append((node_name, node.op_type, "op type not supported by GE2"))
            ctx.failed.update(node.output)  # its cause is already listed
            continue
        derived = _derived_from(ctx, node) if standard else frozenset()
        ctx.derived.update((name, derived) for name in node.output if name and derived)
        try:
            if node.op_type == "Constant" and standard:
                ctx.constants[node.output[0]] = _constant_value(_attributes(node))
                continue
            folded = _fold(node, ctx) if standard and _foldable(ctx, node) else None
            if folded is not None:
                ctx.constants.update(zip(node.output, folded))
                continue
            if not standard or node.op_type not in RULES:
                raise Unsupported("op type not supported by GE2")
            ctx.node_outputs = list(node.output)
            outputs = RULES[node.op_type](ctx, list(node.input), _attributes(node))
            used = [name for name in node.output if name]
            if len(used) > len(outputs):
                raise Unsupported(f"optional output(s) {used[len(outputs):]} are not produced by GE2")
            for onnx_name, value in zip(node.output, outputs):
                if onnx_name and isinstance(value, np.ndarray):  # a rule that computed a constant (Shape)
                    ctx.constants[onnx_name] = value
                elif onnx_name:
                    ctx.values[onnx_name] = value
        except _NotImported:  # the producer's failure is listed; derived outputs stay derived, so that a rule
            ctx.failed.update(name for name in node.output if name not in ctx.derived)  # needing one names the inputs
        except Unsupported as reason:
            problems.append((node_name, node.op_type, str(reason)))
            ctx.failed.update(name for name in node.output if name not in ctx.derived)
            if isinstance(reason, NeedsConstant):
                needs_constant |= reason.input_names
        except (ValueError, TypeError) as error:  # GE2's own inference rejected the node
            problems.append((node_name, node.op_type, str(error)))
            ctx.failed.update(name for name in node.output if name not in ctx.derived)
    for output in model.graph.output:
        elem_type = output.type.tensor_type.elem_type
        if output.name not in ctx.failed and elem_type and elem_type not in dtypes:
            problems.append((output.name, "output", f"element type {elem_type} is not one GE2 produces (a float64 "
                                                    "value computes in float32 inside the graph, never as an output)"))
    if problems:
        raise UnsupportedModelError(model_name, problems, frozenset(needs_constant))
    for output in model.graph.output:
        graph.output(ctx.value(output.name), output.name)
    fuse_imported_attention(graph)  # the pass both frontends share (passes/attention_fusion.py)
    return graph


def _dim_param(text: str):
    """A named dim as GE2 writes it (ir/dims.py): an expression of names as it is (the dynamo exporter writes
    ``s41 + 1``), any other text as one name made an identifier (``"batch size"`` -> ``batch_size``); None when
    unnamed."""
    if not text:
        return None
    try:
        return dims.canonical(text)
    except ValueError:
        name = re.sub(r"\W+", "_", text).strip("_") or "dim"
        return f"_{name}" if name[0].isdigit() else name


def _constant_value(attrs: dict) -> np.ndarray:
    onnx = _onnx()
    if "value" in attrs:
        return onnx.numpy_helper.to_array(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in attrs:
            return np.array(attrs[key], dtype=dtype)
    raise Unsupported(f"Constant with attribute(s) {sorted(attrs)}")


__all__ = ["load", "read_model", "supported_op_types", "UnsupportedModelError", "RULES", "MIN_OPSET"]
