"""ONNX import: ``load(path_or_ModelProto) -> ir.Graph``.

The model goes through ``onnx.shape_inference`` first; initializers become params (or stay host constants where an
ONNX op takes a shape, axes or indices as a tensor input); graph inputs become graph inputs, with a named symbolic
dim (``dim_param``) kept symbolic. Every node is translated by one rule of ``RULES`` (ONNX op type -> function that
emits GE2 nodes); opsets 13 up to the newest the installed ``onnx`` knows are read.

An unsupported op, attribute value, dtype or dynamic shape is collected, not raised at once: ``load`` raises one
``UnsupportedModelError`` that lists every offending node with its op type and the reason.
"""
from __future__ import annotations

import os
import re
from typing import Callable

import numpy as np

from ..dtypes import FLOAT_DTYPES
from ..ir.graph import Graph, Value
from ._errors import NeedsConstant, Unsupported, UnsupportedModelError

MIN_OPSET = 13


def _onnx():
    try:
        import onnx
    except ImportError as error:  # pragma: no cover - the extra is declared in pyproject.toml
        raise ImportError("ge2.frontend.onnx needs the 'onnx' package: pip install graph_executor_v2[onnx]") from error
    return onnx


# ONNX TensorProto element types GE2 has (the rest are reported as unsupported).
def _dtype_names():
    onnx = _onnx()
    T = onnx.TensorProto
    return {T.FLOAT: "float32", T.FLOAT16: "float16", T.BFLOAT16: "bfloat16", T.INT32: "int32", T.INT64: "int64",
            T.UINT8: "uint8"}


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

    def value(self, name: str) -> Value:
        """The GE2 Value of an ONNX tensor; a constant becomes a param on first use as a tensor."""
        if name in self.values:
            return self.values[name]
        if name in self.constants:
            array = self.constants[name]
            if array.dtype == np.float64:
                raise Unsupported(f"constant '{name}' is float64, which GE2 does not run")
            value = self.graph.param(_fresh_name(self.graph, name), np.ascontiguousarray(array))
            self.values[name] = value
            return value
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
            raise NeedsConstant(name, what)
        raise Unsupported(f"{what} ('{name}') must be a constant (an initializer, a Constant node or a graph input "
                          "given in constant_inputs); GE2 plans shapes when it compiles")


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


def _binary(ge2_op):
    def translate(ctx, inputs, attrs):
        _only(attrs, {})
        a = _float_input(ctx.value(inputs[0]), "input A")
        b = _float_input(ctx.value(inputs[1]), "input B")
        if a.type.dtype != b.type.dtype:
            raise Unsupported(f"inputs have dtypes {a.type.dtype} and {b.type.dtype}")
        return [getattr(ctx.graph, ge2_op)(a, b)]

    return translate


for _op_type, _ge2_op in (("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("Div", "div")):
    RULES[_op_type] = _binary(_ge2_op)


def _unary(ge2_op):
    def translate(ctx, inputs, attrs):
        _only(attrs, {})
        return [getattr(ctx.graph, ge2_op)(_float_input(ctx.value(inputs[0]), "input X"))]

    return translate


for _op_type, _ge2_op in (("Relu", "relu"), ("Sigmoid", "sigmoid"), ("Tanh", "tanh"), ("Exp", "exp"),
                          ("Neg", "neg")):
    RULES[_op_type] = _unary(_ge2_op)


@rule("Gelu")
def _gelu(ctx, inputs, attrs):
    _only(attrs, {"approximate": lambda v: v in ("none", "tanh")})
    x = _float_input(ctx.value(inputs[0]), "input X")
    return [ctx.graph.gelu(x) if _decode(attrs.get("approximate", "none")) == "tanh" else ctx.graph.gelu_erf(x)]


@rule("Identity", "Dropout")
def _identity(ctx, inputs, attrs):
    # Dropout is the identity at inference: its training_mode input must be absent or a constant false.
    if len(inputs) > 2 and inputs[2] and bool(np.asarray(ctx.constant(inputs[2], "training_mode")).item()):
        raise Unsupported("training_mode=True: GE2 imports models for inference")
    _only(attrs, {"seed": _ANY})
    return [ctx.value(inputs[0])]


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
    if b.type.rank > 2:
        raise Unsupported(f"batched B of shape {b.type.shape}: GE2's matmul takes a 2-d (or 1-d) B")
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
    y = g.layernorm(rows, gamma, beta, eps=float(attrs.get("epsilon", 1e-5)))
    return [g.reshape(y, shape=x.type.shape) if flat else y]


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
    shape = [int(d) for d in np.asarray(ctx.constant(inputs[1], "the target shape")).reshape(-1)]
    if not attrs.get("allowzero", 0):  # 0 copies the input's dim at that position
        shape = [x.type.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [ctx.graph.reshape(x, shape=tuple(shape))]


@rule("Flatten")
def _flatten(ctx, inputs, attrs):
    _only(attrs, {"axis": _ANY})
    x = ctx.value(inputs[0])
    axis = int(attrs.get("axis", 1))
    axis += x.type.rank if axis < 0 else 0  # ONNX axes of Flatten run over [-rank, rank]
    outer = int(np.prod(x.type.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.type.shape[axis:], dtype=np.int64))
    return [ctx.graph.reshape(x, shape=(outer, inner))]


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
        return tuple(int(v) for v in np.asarray(ctx.constant(inputs[index], what)).reshape(-1))

    return [ctx.graph.slice(x, starts=ints(1, "starts"), ends=ints(2, "ends"), axes=ints(3, "axes"),
                            steps=ints(4, "steps"))]


@rule("Gather")
def _gather(ctx, inputs, attrs):
    """Rows of a table are an embedding lookup: the gathered axis is moved to the front (a transpose), the rest
    flattened into the row, and the result reshaped and moved back."""
    _only(attrs, {"axis": _ANY})
    g = ctx.graph
    data = ctx.value(inputs[0])
    rank = data.type.rank
    if rank == 0:
        raise Unsupported("gather from a 0-d tensor")
    axis = int(attrs.get("axis", 0))
    axis += rank if axis < 0 else 0
    extent = data.type.shape[axis]
    if inputs[1] in ctx.constants:
        indices = np.asarray(ctx.constants[inputs[1]]).astype(np.int64)
        if np.any((indices < -extent) | (indices >= extent)):
            raise Unsupported(f"indices outside [-{extent}, {extent})")
        indices = np.where(indices < 0, indices + extent, indices)  # ONNX counts negative indices from the end
        ids = g.param(_fresh_name(g, inputs[1]), indices)
    else:
        ids = ctx.value(inputs[1])
        if ids.type.dtype not in ("int32", "int64"):
            raise Unsupported(f"indices of dtype {ids.type.dtype}")
    front = data if axis == 0 else g.transpose(data, perm=(axis, *[d for d in range(rank) if d != axis]))
    rest = tuple(front.type.shape[1:])
    table = front if rank == 2 else g.reshape(front, shape=(extent, int(np.prod(rest, dtype=np.int64))))
    rows = g.embedding(table, ids)  # ids.shape + (prod(rest),)
    index_shape = tuple(ids.type.shape)
    gathered = g.reshape(rows, shape=index_shape + rest) if rank != 2 or not index_shape else rows
    if not index_shape and rank == 2:
        gathered = g.reshape(rows, shape=rest)
    if axis == 0:
        return [gathered]
    # gathered is (index dims..., data dims before axis..., data dims after axis...): move the index dims back.
    k, before = len(index_shape), axis
    perm = (*range(k, k + before), *range(k), *range(k + before, gathered.type.rank))
    return [g.transpose(gathered, perm=perm)]


def _reduce(ge2_op):
    def translate(ctx, inputs, attrs):
        _only(attrs, {"axes": _ANY, "keepdims": _ANY, "noop_with_empty_axes": _ANY})
        x = _float_input(ctx.value(inputs[0]), "input data")
        axes = attrs.get("axes")
        if len(inputs) > 1 and inputs[1]:
            axes = np.asarray(ctx.constant(inputs[1], "axes")).reshape(-1)
        axes = None if axes is None or len(axes) == 0 else tuple(int(a) for a in axes)
        if axes is None and attrs.get("noop_with_empty_axes", 0):
            return [x]
        keepdims = bool(attrs.get("keepdims", 1))
        return [getattr(ctx.graph, ge2_op)(x, axis=axes, keepdims=keepdims)]

    return translate


RULES["ReduceSum"] = _reduce("sum")
RULES["ReduceMean"] = _reduce("mean")
RULES["ReduceMax"] = _reduce("max")


@rule("Cast")
def _cast(ctx, inputs, attrs):
    _only(attrs, {"to": _ANY, "saturate": _ANY, "round_mode": _ANY})
    x = ctx.value(inputs[0])
    target = _dtype_names().get(int(attrs["to"]))
    if target is None:
        raise Unsupported(f"cast to ONNX element type {attrs['to']}")
    if target == x.type.dtype:
        return [x]
    if "cast" not in _registered_ops():
        raise Unsupported(f"cast {x.type.dtype} -> {target}: GE2 has no cast op")
    return [ctx.graph.cast(x, dtype=target)]


def _registered_ops():
    from ..ops import OPS

    return OPS


def _numpy_dtype(name: str):
    from ..dtypes import to_numpy

    return to_numpy(name)


# ---------------------------------------------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------------------------------------------
def supported_op_types() -> list[str]:
    """The ONNX op types ``load`` translates (each may still reject some attribute values or dtypes)."""
    return sorted(RULES)


def load(model, input_shapes: dict | None = None, constant_inputs: dict | None = None, name: str | None = None) -> Graph:
    """An ONNX model (a path or a ``ModelProto``) as a GE2 graph.

    ``input_shapes`` (input name -> shape) overrides declared input shapes, e.g. to bind a dim the model leaves
    unnamed. ``constant_inputs`` (input name -> array) fixes graph inputs to values, for inputs an op needs when the
    graph is built (a Reshape's shape, a Slice's starts): they stop being inputs. Raises ``UnsupportedModelError``
    listing every node GE2 cannot import (and, in ``constant_inputs``, which inputs want a fixed value)."""
    onnx = _onnx()
    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model))
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model: expected a path or an onnx.ModelProto, got {type(model).__name__}")
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
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
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
    if overrides:
        raise ValueError(f"input_shapes: unknown input(s) {sorted(overrides)}")

    unknown_ops = sorted({n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")
                          or (n.op_type not in RULES and n.op_type != "Constant")})
    for index, node in enumerate(model.graph.node):
        node_name = node.name or f"{node.op_type}_{index}"
        if node.op_type in unknown_ops or node.domain not in ("", "ai.onnx"):
            problems.append((node_name, node.op_type, "op type not supported by GE2"))
            ctx.failed.update(node.output)
            continue
        if any(name in ctx.failed for name in node.input):
            ctx.failed.update(node.output)  # its cause is already listed
            continue
        try:
            if node.op_type == "Constant":
                ctx.constants[node.output[0]] = _constant_value(_attributes(node))
                continue
            outputs = RULES[node.op_type](ctx, list(node.input), _attributes(node))
            used = [name for name in node.output if name]
            if len(used) > len(outputs):
                raise Unsupported(f"optional output(s) {used[len(outputs):]} are not produced by GE2")
            for onnx_name, value in zip(node.output, outputs):
                if onnx_name:
                    ctx.values[onnx_name] = value
        except Unsupported as reason:
            problems.append((node_name, node.op_type, str(reason)))
            ctx.failed.update(node.output)
            if isinstance(reason, NeedsConstant):
                needs_constant.add(reason.input_name)
        except (ValueError, TypeError) as error:  # GE2's own inference rejected the node
            problems.append((node_name, node.op_type, str(error)))
            ctx.failed.update(node.output)
    if problems:
        raise UnsupportedModelError(model_name, problems, frozenset(needs_constant))
    for output in model.graph.output:
        graph.output(ctx.value(output.name), output.name)
    return graph


def _constant_value(attrs: dict) -> np.ndarray:
    onnx = _onnx()
    if "value" in attrs:
        return onnx.numpy_helper.to_array(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in attrs:
            return np.array(attrs[key], dtype=dtype)
    raise Unsupported(f"Constant with attribute(s) {sorted(attrs)}")


__all__ = ["load", "supported_op_types", "UnsupportedModelError", "RULES", "MIN_OPSET"]
