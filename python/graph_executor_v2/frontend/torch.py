"""PyTorch import: ``from_torch(module, example_inputs) -> ir.Graph`` through ``torch.export``.

The module is exported (``torch.export.export``, which traces to ATen ops); its parameters and buffers become
params under their ``state_dict`` names, its user inputs become graph inputs with the example inputs' shapes and
dtypes, and every ATen op is translated by one rule of ``RULES``. Nodes GE2 cannot translate are collected and
raised together as one ``UnsupportedModelError`` listing each with its ATen target. At the end, attention written
out in eager code (QK^T, scale, bias, softmax, times V: BERT's eager path, T5's relative position bias) becomes
attention nodes through the pass the ONNX importer runs too (``passes.attention_fusion.fuse_imported_attention``).
torch is an optional extra: importing this module needs it.
"""
from __future__ import annotations

import operator
from typing import Callable

import numpy as np

from .._optional import require
from ..dtypes import is_float, normalize, result_type, to_numpy
from ..ir import dims
from ..ir.graph import Graph, Value
from ..passes.attention_fusion import attention_bias, fuse_imported_attention
from ._arange import symbolic_range
from ._batch_norm import float32_statistics
from ._einsum import batched_matmul, einsum
from ._errors import Unsupported, UnsupportedModelError


def _torch():
    return require("torch", "ge2.frontend.torch")


class _Context:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.values: dict[str, object] = {}  # fx node name -> Value, a tuple of Values, or a Python constant
        self.node_target = ""  # the ATen target of the node being translated (a rule shared by overloads reads it)

    def get(self, argument):
        """An fx argument as GE2 Values or Python constants (lists, ints, floats, None)."""
        fx = _torch().fx
        if isinstance(argument, fx.Node):
            if argument.name not in self.values:
                raise Unsupported(f"input '{argument.name}' was not translated")
            return self.values[argument.name]
        if isinstance(argument, (list, tuple)):
            return type(argument)(self.get(a) for a in argument)
        return argument

    def tensor(self, argument, like: Value | None = None) -> Value:
        """A tensor argument; a Python number becomes a 0-d param of ``like``'s dtype."""
        value = self.get(argument)
        if isinstance(value, Value):
            return value
        if isinstance(value, (int, float)) and like is not None:
            from ..dtypes import to_numpy

            return self.graph.param(self.graph.unique_name("scalar"), np.array(value, to_numpy(like.type.dtype)))
        raise Unsupported(f"expected a tensor, got {type(value).__name__} ({value!r})")


Rule = Callable[..., object]
RULES: dict[str, Rule] = {}


def rule(*names: str):
    """Registers a translation for ATen overloads named like ``"aten.relu.default"``."""

    def register_rule(function: Rule) -> Rule:
        for name in names:
            RULES[name] = function
        return function

    return register_rule


def _unary(op):
    return lambda ctx, x: getattr(ctx.graph, op)(ctx.tensor(x))


for _aten, _op in (("relu", "relu"), ("sigmoid", "sigmoid"), ("tanh", "tanh"), ("silu", "silu"), ("exp", "exp"),
                   ("neg", "neg"), ("abs", "abs"), ("sign", "sign"), ("exp2", "exp2"), ("expm1", "expm1"),
                   ("log", "log"), ("log2", "log2"), ("log1p", "log1p"), ("sqrt", "sqrt"), ("rsqrt", "rsqrt"),
                   ("reciprocal", "reciprocal"), ("sin", "sin"), ("cos", "cos"), ("erf", "erf"), ("floor", "floor"),
                   ("ceil", "ceil"), ("round", "round"), ("trunc", "trunc"), ("mish", "mish"),
                   ("hardswish", "hardswish"), ("hardsigmoid", "hardsigmoid"), ("logical_not", "logical_not"),
                   ("isnan", "isnan"), ("isinf", "isinf")):
    RULES[f"aten.{_aten}.default"] = _unary(_op)


@rule("aten.gelu.default")
def _gelu(ctx, x, approximate="none"):
    x = ctx.tensor(x)
    return ctx.graph.gelu(x) if approximate == "tanh" else ctx.graph.gelu_erf(x)


@rule("aten.softplus.default")
def _softplus(ctx, x, beta=1.0, threshold=20.0):
    return ctx.graph.softplus(ctx.tensor(x), beta=float(beta), threshold=float(threshold))


@rule("aten.leaky_relu.default")
def _leaky_relu(ctx, x, negative_slope=0.01):
    return ctx.graph.leaky_relu(ctx.tensor(x), alpha=float(negative_slope))


@rule("aten.elu.default")
def _elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    if scale != 1 or input_scale != 1:
        raise Unsupported(f"scale={scale}, input_scale={input_scale} (SELU/CELU forms)")
    return ctx.graph.elu(ctx.tensor(x), alpha=float(alpha))


def _bound(value):
    return None if value is None else float(value)


@rule("aten.clamp.default", "aten.clip.default")
def _clamp(ctx, x, min=None, max=None):  # noqa: A002 (ATen's argument names)
    return ctx.graph.clip(ctx.tensor(x), min=_bound(min), max=_bound(max))


@rule("aten.clamp.Tensor", "aten.clip.Tensor")
def _clamp_tensor(ctx, x, min=None, max=None):  # noqa: A002
    y = ctx.tensor(x)
    if min is not None:
        y = ctx.graph.maximum(y, _operand(ctx, min, y))
    if max is not None:
        y = ctx.graph.minimum(y, _operand(ctx, max, y))
    return y


@rule("aten.hardtanh.default")
def _hardtanh(ctx, x, min_val=-1.0, max_val=1.0):
    return ctx.graph.clip(ctx.tensor(x), min=float(min_val), max=float(max_val))


@rule("aten.relu6.default")
def _relu6(ctx, x):
    return ctx.graph.clip(ctx.tensor(x), min=0.0, max=6.0)


def _operand(ctx, argument, other: Value) -> Value:
    """A tensor argument; a Python number as PyTorch promotes it against the tensor ``other``: a 0-d param of the
    promoted dtype (float32 for a float result: a 0-d tensor does not widen ``other``'s float16)."""
    value = ctx.get(argument)
    if isinstance(value, Value):
        return value
    return _number(ctx, value, result_type(other.type, value) if isinstance(value, (bool, int, float)) else None)


def _number(ctx, value, dtype: str | None) -> Value:
    """A 0-d param holding the Python number ``value``, of ``dtype`` (float32 for any float dtype)."""
    if not isinstance(value, (bool, int, float)):
        raise Unsupported(f"expected a tensor or a number, got {type(value).__name__} ({value!r})")
    return ctx.graph.param(ctx.graph.unique_name("scalar"),
                           np.array(value, to_numpy("float32" if is_float(dtype) else dtype)))


def _operands(ctx, a, b) -> tuple[Value, Value]:
    a_value, b_value = ctx.get(a), ctx.get(b)
    if not isinstance(a_value, Value) and not isinstance(b_value, Value):
        raise Unsupported(f"two numbers ({a_value!r}, {b_value!r}): no tensor")
    like = a_value if isinstance(a_value, Value) else b_value
    return _operand(ctx, a, like), _operand(ctx, b, like)


def _binary(op, **attrs):
    def translate(ctx, a, b, alpha=1):
        a, b = _operands(ctx, a, b)
        if alpha != 1:  # add/sub's a + alpha * b
            b = ctx.graph.mul(b, _operand(ctx, alpha, b))
        return getattr(ctx.graph, op)(a, b, **attrs)

    return translate


for _aten, _op in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("pow", "pow"), ("eq", "equal"),
                   ("ne", "not_equal"), ("lt", "less"), ("le", "less_equal"), ("gt", "greater"),
                   ("ge", "greater_equal")):
    RULES[f"aten.{_aten}.Tensor"] = _binary(_op)
    RULES[f"aten.{_aten}.Scalar"] = _binary(_op)
RULES["aten.pow.Tensor_Tensor"] = _binary("pow")
RULES["aten.pow.Tensor_Scalar"] = _binary("pow")
RULES["aten.pow.Scalar"] = _binary("pow")
@rule("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(ctx, a, b, alpha=1):
    """``b - alpha * a`` (``1.0 - mask`` in exported attention code)."""
    return _binary("sub")(ctx, b, a, alpha)


@rule("aten.scalar_tensor.default")
def _scalar_tensor(ctx, value, dtype=None, **kwargs):
    """A 0-d tensor of a number (torch.where of numbers traces to it): PyTorch's default dtypes unless given."""
    if dtype is None:
        return _number(ctx, value, result_type(value))
    return ctx.graph.param(ctx.graph.unique_name("scalar"), np.array(value, to_numpy(normalize(dtype, "dtype"))))


for _aten, _op in (("minimum", "minimum"), ("maximum", "maximum"), ("logical_and", "logical_and"),
                   ("logical_or", "logical_or"), ("logical_xor", "logical_xor")):
    RULES[f"aten.{_aten}.default"] = _binary(_op)
RULES["aten.min.other"] = _binary("minimum")  # torch.min(a, b): elementwise, as torch.minimum
RULES["aten.max.other"] = _binary("maximum")
for _overload in ("Tensor", "Scalar"):
    RULES[f"aten.remainder.{_overload}"] = _binary("mod", fmod=False)
    RULES[f"aten.fmod.{_overload}"] = _binary("mod", fmod=True)


def _bitwise(op):
    """``&``, ``|``, ``^``, ``~`` of masks (bool tensors) are the logical ops; GE2 has no bitwise integer ops."""
    def translate(ctx, *arguments):
        values = [ctx.get(argument) for argument in arguments]
        if not all(isinstance(v, Value) and v.type.dtype == "bool" for v in values):
            raise Unsupported(f"bitwise {op.removeprefix('logical_')} of non-bool operands")
        return getattr(ctx.graph, op)(*values)

    return translate


for _aten, _op in (("bitwise_and", "logical_and"), ("bitwise_or", "logical_or"), ("bitwise_xor", "logical_xor")):
    RULES[f"aten.{_aten}.Tensor"] = _bitwise(_op)
for _aten, _op in (("__and__", "logical_and"), ("__or__", "logical_or"), ("__xor__", "logical_xor")):
    RULES[f"aten.{_aten}.Tensor"] = _bitwise(_op)  # the operators ``&``, ``|``, ``^`` as some exports keep them
RULES["aten.bitwise_not.default"] = _bitwise("logical_not")


def _divide(ctx, a, b, rounding_mode):
    """torch's division: true division (integers become float32), or rounded toward zero or down."""
    g = ctx.graph
    a, b = _operands(ctx, a, b)
    if rounding_mode is None:
        if not is_float(result_type(a.type, b.type)):
            a, b = g.cast(a, dtype="float32"), g.cast(b, dtype="float32")
        return g.div(a, b)
    if rounding_mode not in ("trunc", "floor"):
        raise Unsupported(f"rounding_mode={rounding_mode!r}")
    if not is_float(result_type(a.type, b.type)):  # integer division truncates; floor: the remainder taken off
        return g.div(a, b) if rounding_mode == "trunc" else g.div(g.sub(a, g.mod(a, b)), b)
    return getattr(g, rounding_mode)(g.div(a, b))


@rule("aten.div.Tensor", "aten.div.Scalar")
def _div(ctx, a, b):
    return _divide(ctx, a, b, None)


@rule("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(ctx, a, b, rounding_mode=None):
    return _divide(ctx, a, b, rounding_mode)


@rule("aten.floor_divide.default", "aten.floor_divide.Scalar")
def _floor_divide(ctx, a, b):
    return _divide(ctx, a, b, "floor")


@rule("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(ctx, condition, a, b):
    condition = ctx.tensor(condition)
    a_value, b_value = ctx.get(a), ctx.get(b)
    if not isinstance(a_value, Value) and not isinstance(b_value, Value):  # two numbers: PyTorch's default dtypes
        dtype = result_type(a_value, b_value)
        return ctx.graph.where(condition, _number(ctx, a_value, dtype), _number(ctx, b_value, dtype))
    return ctx.graph.where(condition, *_operands(ctx, a, b))


@rule("aten.linear.default")
def _linear(ctx, x, weight, bias=None):
    g = ctx.graph
    x, weight = ctx.tensor(x), ctx.tensor(weight)
    bias = None if bias is None else ctx.tensor(bias)
    features = weight.type.shape[1]
    rows = x if x.type.rank == 2 else g.reshape(x, shape=(-1, features))
    y = g.gemm(rows, weight, bias, trans_b=True)
    return y if x.type.rank == 2 else g.reshape(y, shape=(*x.type.shape[:-1], weight.type.shape[0]))


@rule("aten.addmm.default")
def _addmm(ctx, bias, a, b, beta=1, alpha=1):
    if beta != 1:
        raise Unsupported(f"beta={beta}")
    bias = ctx.tensor(bias)
    if bias.type.rank != 1:
        raise Unsupported(f"a bias of shape {bias.type.shape}")
    return ctx.graph.gemm(ctx.tensor(a), ctx.tensor(b), bias, alpha=float(alpha))


@rule("aten.mm.default", "aten.matmul.default")
def _matmul(ctx, a, b):
    g = ctx.graph
    a, b = ctx.tensor(a), ctx.tensor(b)
    if b.type.rank > 2 and a.type.rank >= 2:  # batched: one 2-d product per batch entry
        return batched_matmul(g, a, b)
    if b.type.rank != 2 or a.type.rank < 2:
        raise Unsupported(f"matmul of shapes {a.type.shape} and {b.type.shape}: GE2 multiplies by a 2-d B")
    rows = a if a.type.rank == 2 else g.reshape(a, shape=(-1, a.type.shape[-1]))
    y = g.matmul(rows, b)
    return y if a.type.rank == 2 else g.reshape(y, shape=(*a.type.shape[:-1], b.type.shape[1]))


@rule("aten.t.default")
def _t(ctx, x):
    x = ctx.tensor(x)
    return x if x.type.rank < 2 else ctx.graph.transpose(x, perm=(1, 0))


@rule("aten.permute.default")
def _permute(ctx, x, dims):
    x = ctx.tensor(x)
    return ctx.graph.transpose(x, perm=tuple(d % x.type.rank for d in dims))


@rule("aten.transpose.int")
def _transpose(ctx, x, dim0, dim1):
    x = ctx.tensor(x)
    perm = list(range(x.type.rank))
    perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    return ctx.graph.transpose(x, perm=tuple(perm))


@rule("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default")
def _view(ctx, x, shape):
    return ctx.graph.reshape(ctx.tensor(x), shape=tuple(d if isinstance(d, str) else int(d) for d in ctx.get(shape)))


@rule("aten.unflatten.int")
def _unflatten(ctx, x, dim, sizes):
    """Axis ``dim`` split into ``sizes`` (one may be -1): a reshape."""
    x = ctx.tensor(x)
    shape = x.type.shape
    dim %= x.type.rank
    return ctx.graph.reshape(x, shape=(*shape[:dim], *(int(d) for d in ctx.get(sizes)), *shape[dim + 1:]))


@rule("aten.flatten.using_ints")
def _flatten(ctx, x, start_dim=0, end_dim=-1):
    x = ctx.tensor(x)
    shape, rank = x.type.shape, x.type.rank
    start, end = start_dim % rank, end_dim % rank
    merged = int(np.prod(shape[start:end + 1], dtype=np.int64))
    return ctx.graph.reshape(x, shape=(*shape[:start], merged, *shape[end + 1:]))


@rule("aten.contiguous.default", "aten.clone.default", "aten.detach.default", "aten.alias.default",
      "aten.lift_fresh_copy.default")
def _identity(ctx, x, *args, **kwargs):
    return ctx.tensor(x)


# --- export bookkeeping: checks and conversions torch.export writes around the computation ----------------------
@rule("aten._assert_tensor_metadata.default")
def _assert_tensor_metadata(ctx, x, size=None, stride=None, dtype=None, *args, **kwargs):
    """A check torch.export keeps from the traced program: honoured for the shape and dtype GE2 sees (strides,
    device and layout are the plan's, not the model's); produces nothing."""
    x = ctx.tensor(x)
    if dtype is not None and normalize(dtype, "dtype") != x.type.dtype:
        raise Unsupported(f"the model asserts dtype {dtype} where GE2 computes {x.type.dtype}")
    if size is not None and len(size) != x.type.rank:
        raise Unsupported(f"the model asserts rank {len(size)} where GE2 computes shape {x.type.shape}")
    return None


@rule("aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default", "aten._assert_async.msg")
def _assert_scalar(ctx, *args, **kwargs):
    """Range checks on symbolic sizes: the plan binds concrete sizes, so nothing remains to check."""
    return None


@rule("aten.to.dtype", "aten.to.dtype_layout", "aten._to_copy.default", "aten.to.device", "aten.type_as.default")
def _to(ctx, x, *args, dtype=None, **kwargs):
    """A dtype conversion (a cast); device, layout, memory format and copy flags change nothing in a GE2 plan."""
    x = ctx.tensor(x)
    target = ctx.node_target
    if target == "aten.type_as.default":
        dtype = ctx.tensor(args[0]).type.dtype
    elif target == "aten.to.dtype" and args:
        dtype = args[0]
    elif target == "aten.to.device" and len(args) > 1:
        dtype = args[1]
    if dtype is None:
        return x
    dtype = normalize(dtype, "dtype")
    return x if dtype == x.type.dtype else ctx.graph.cast(x, dtype=dtype)


@rule("aten.sym_size.int")
def _sym_size(ctx, x, dim):
    """The size of one dim: an int, or the name of a symbolic dim (used by view/reshape/expand shapes)."""
    x = ctx.tensor(x)
    return x.type.shape[int(dim) % x.type.rank]


# Size arithmetic on symbolic dims (ir/dims.py): seq + 1, 2 * seq, seq // 2.
for _arithmetic, _combine in (("<built-in function mul>", dims.product), ("<built-in function add>", dims.add),
                              ("<built-in function sub>", dims.subtract),
                              ("<built-in function floordiv>", dims.floor_divide)):
    RULES[_arithmetic] = lambda ctx, a, b, combine=_combine: combine(_dim(ctx.get(a)), _dim(ctx.get(b)))


@rule("aten.dropout.default")
def _dropout(ctx, x, p, train):
    if train:
        raise Unsupported("dropout in training mode: export the module in eval() mode")
    return ctx.tensor(x)


@rule("aten.layer_norm.default")
def _layer_norm(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, *args):
    """Over the trailing axes of ``normalized_shape``: several are flattened into one row (and back)."""
    g = ctx.graph
    x = ctx.tensor(x)
    normalized = tuple(int(d) for d in normalized_shape)
    if tuple(x.type.shape[x.type.rank - len(normalized):]) != normalized:
        raise Unsupported(f"normalized_shape={normalized} is not the trailing shape of {x.type.shape}")
    width = int(np.prod(normalized, dtype=np.int64))
    from ..dtypes import to_numpy

    dtype = to_numpy(x.type.dtype)

    def row(value, fill, label):
        if value is None:
            return g.param(g.unique_name(label), np.full(width, fill, dtype))
        value = ctx.tensor(value)
        return value if value.type.rank == 1 else g.reshape(value, shape=(width,))

    weight, bias = row(weight, 1.0, "ln_ones"), row(bias, 0.0, "ln_zeros")
    if len(normalized) == 1:
        return g.layernorm(x, weight, bias, eps=float(eps))
    rows = g.reshape(x, shape=(*x.type.shape[:x.type.rank - len(normalized)], width))
    return g.reshape(g.layernorm(rows, weight, bias, eps=float(eps)), shape=tuple(x.type.shape))


@rule("aten.rms_norm.default")
def _rms_norm(ctx, x, normalized_shape, weight=None, eps=None):
    if weight is None or eps is None or len(normalized_shape) != 1:
        raise Unsupported("rms_norm needs a weight, an explicit eps and one normalized axis")
    return ctx.graph.rmsnorm(ctx.tensor(x), ctx.tensor(weight), eps=float(eps))


@rule("aten.softmax.int", "aten._softmax.default")
def _softmax(ctx, x, dim, *args):
    return ctx.graph.softmax(ctx.tensor(x), axis=int(dim))


@rule("aten.log_softmax.int", "aten._log_softmax.default")
def _log_softmax(ctx, x, dim, *args):
    return ctx.graph.log_softmax(ctx.tensor(x), axis=int(dim))


@rule("aten.embedding.default")
def _embedding(ctx, weight, ids, *args):
    return ctx.graph.embedding(ctx.tensor(weight), ctx.tensor(ids))


def _reduction(op):
    def translate(ctx, x, dim=None, keepdim=False, dtype=None):
        if dtype is not None:
            raise Unsupported(f"dtype={dtype}")
        axis = None if dim is None or len(dim) == 0 else tuple(int(d) for d in dim)
        return getattr(ctx.graph, op)(ctx.tensor(x), axis=axis, keepdims=bool(keepdim))

    return translate


RULES["aten.sum.dim_IntList"] = _reduction("sum")
RULES["aten.mean.dim"] = _reduction("mean")
RULES["aten.amax.default"] = _reduction("max")


def _truth_reduction(every: bool):
    """any / all: whether some / every element along ``dim`` (all axes when none) is nonzero: the max of the
    elements' truth (all: no element false). T5 in float16 asks ``isinf(hidden).any()``."""

    def translate(ctx, x, dim=None, keepdim=False):
        g = ctx.graph
        x = ctx.tensor(x)
        truth = x if x.type.dtype == "bool" else g.not_equal(x, _number(ctx, 0, x.type.dtype))
        axes = [dim] if isinstance(dim, int) else list(dim or ())
        axis = tuple(int(d) for d in axes) if axes else None
        sought = g.logical_not(truth) if every else truth
        found = g.greater(g.max(g.cast(sought, dtype="float32"), axis=axis, keepdims=bool(keepdim)),
                          _number(ctx, 0.5, "float32"))
        return g.logical_not(found) if every else found

    return translate


for _overload in ("default", "dim", "dims"):
    RULES[f"aten.any.{_overload}"] = _truth_reduction(every=False)
    RULES[f"aten.all.{_overload}"] = _truth_reduction(every=True)


@rule("aten.cat.default")
def _cat(ctx, tensors, dim=0):
    return ctx.graph.concat([ctx.tensor(t) for t in tensors], axis=int(dim))


@rule("aten.slice.Tensor")
def _slice(ctx, x, dim=0, start=None, end=None, step=1):
    x = ctx.tensor(x)
    start = 0 if start is None else _dim(ctx.get(start))
    end = 2**63 - 1 if end is None else _dim(ctx.get(end))  # symbolic: x[:, :seq] with seq bound at run time
    if isinstance(end, str) and end == x.type.shape[int(dim)]:
        end = 2**63 - 1
    return ctx.graph.slice(x, starts=(start,), ends=(end,), axes=(int(dim),), steps=(int(step),))


@rule("aten.diff.default")
def _diff(ctx, x, n=1, dim=-1, prepend=None, append=None):
    """``x[1:] - x[:-1]`` along ``dim`` after concatenating prepend and append (bool: !=, as torch's xor); along a
    symbolic axis the lengths are sums of dims (HF's packed-sequence check prepends one position: seq+1, then seq)."""
    if int(n) != 1:
        raise Unsupported(f"diff with n={n} (GE2 maps n=1: apply diff n times in the model)")
    g = ctx.graph
    x = ctx.tensor(x)
    if x.type.rank == 0:
        raise Unsupported("diff of a 0-d tensor (torch needs at least 1 dimension)")
    dim = int(dim) % x.type.rank
    parts = [ctx.tensor(part) for part in (prepend, x, append) if part is not None]
    x = g.concat(parts, axis=dim) if len(parts) > 1 else x
    later = g.slice(x, starts=(1,), ends=(2**63 - 1,), axes=(dim,), steps=(1,))
    earlier = g.slice(x, starts=(0,), ends=(-1,), axes=(dim,), steps=(1,))
    return g.logical_xor(later, earlier) if x.type.dtype == "bool" else g.sub(later, earlier)


@rule("aten.select.int")
def _select(ctx, x, dim, index):
    g = ctx.graph
    x = ctx.tensor(x)
    dim = int(dim) % x.type.rank
    index = int(index) + (x.type.shape[dim] if int(index) < 0 else 0)
    picked = g.slice(x, starts=(index,), ends=(index + 1,), axes=(dim,))
    return g.reshape(picked, shape=tuple(d for i, d in enumerate(x.type.shape) if i != dim))


@rule("aten.split.Tensor", "aten.split_with_sizes.default")
def _split(ctx, x, sizes, dim=0):
    g = ctx.graph
    x = ctx.tensor(x)
    dim = int(dim) % x.type.rank
    extent = x.type.shape[dim]
    if isinstance(sizes, int):
        sizes = [min(sizes, extent - start) for start in range(0, extent, sizes)]
    pieces, start = [], 0
    for size in sizes:
        pieces.append(g.slice(x, starts=(start,), ends=(start + int(size),), axes=(dim,)))
        start += int(size)
    return tuple(pieces)


@rule("aten.chunk.default")
def _chunk(ctx, x, chunks, dim=0):
    x = ctx.tensor(x)
    extent = x.type.shape[int(dim) % x.type.rank]
    return _split(ctx, x, -(-extent // int(chunks)), dim)


# --- convolutional networks -------------------------------------------------------------------------------------
def _ints(value, count: int = 2) -> tuple:
    """An ATen int list argument ([k] repeats k) as a tuple of ``count`` ints."""
    values = [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return tuple(values * count if len(values) == 1 else values)


def _check_4d(x: Value, what: str) -> None:
    if x.type.rank != 4:
        raise Unsupported(f"{what} of a rank-{x.type.rank} input (GE2's op takes 4-d NCHW)")


def _conv(ctx, x, weight, bias, stride, padding, dilation, groups):
    g = ctx.graph
    x, weight = ctx.tensor(x), ctx.tensor(weight)
    _check_4d(x, "conv")
    bias = None if bias is None else ctx.tensor(bias)
    stride, dilation = _ints(stride), _ints(dilation)
    if isinstance(padding, str):  # conv2d.padding: "valid" or "same" (stride 1; PyTorch puts an odd pad at the end)
        if padding == "valid":
            padding = 0
        else:
            pads = []
            for kernel, step in zip(weight.type.shape[2:], dilation):
                total = step * (kernel - 1)
                pads += [total // 2, total - total // 2]
            padding = tuple(pads)
    else:
        padding = _ints(padding)
    return g.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=int(groups))


@rule("aten.conv2d.default", "aten.conv2d.padding")
def _conv2d(ctx, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(ctx, x, weight, bias, stride, padding, dilation, groups)


@rule("aten.convolution.default")
def _convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        raise Unsupported("transposed convolution")
    if len(stride) == 1:
        return _conv1d(ctx, x, weight, bias, stride, padding, dilation, groups)
    if len(stride) != 2:
        raise Unsupported(f"a {len(stride)}-d convolution (GE2 convolves 1-d and 2-d)")
    return _conv(ctx, x, weight, bias, stride, padding, dilation, groups)


@rule("aten.conv1d.default", "aten.conv1d.padding")
def _conv1d(ctx, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """A 1-d convolution as a 2-d one of height 1: [N, C, L] -> [N, C, 1, L], the kernel [O, C/g, 1, K]."""
    g = ctx.graph
    x, weight = ctx.tensor(x), ctx.tensor(weight)
    if x.type.rank != 3:
        raise Unsupported(f"conv1d of a rank-{x.type.rank} input (GE2 takes [N, C, L])")
    x4 = g.reshape(x, shape=(x.type.shape[0], x.type.shape[1], 1, x.type.shape[2]))
    w4 = g.reshape(weight, shape=(*weight.type.shape[:2], 1, weight.type.shape[2]))
    single = lambda value: int(value[0] if isinstance(value, (list, tuple)) else value)  # noqa: E731
    pad = padding if isinstance(padding, str) else (0, single(padding))
    y = _conv(ctx, x4, w4, bias, (1, single(stride)), pad, (1, single(dilation)), groups)
    return g.reshape(y, shape=(*y.type.shape[:2], y.type.shape[3]))


def _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Inference batch norm on the running statistics: (y, saved_mean, saved_invstd) of GE2's op."""
    if training:
        raise Unsupported("batch norm in training mode: export the module in eval() mode")
    if running_mean is None or running_var is None:
        raise Unsupported("batch norm without running statistics (track_running_stats=False)")
    g = ctx.graph
    x = ctx.tensor(x)
    stats = [ctx.tensor(running_mean), ctx.tensor(running_var)]
    channels = stats[0].type.shape[0]
    weight = ctx.tensor(weight) if weight is not None else g.param(g.unique_name("bn_ones"),
                                                                   np.ones(channels, np.float32))
    bias = ctx.tensor(bias) if bias is not None else g.param(g.unique_name("bn_zeros"), np.zeros(channels, np.float32))
    weight, bias, *stats = float32_statistics(g, [weight, bias, *stats])
    y, saved_mean, saved_invstd, _, _ = g.batch_norm(x, weight, bias, *stats, training=False, eps=float(eps))
    return y, saved_mean, saved_invstd


@rule("aten.batch_norm.default")
def _batch_norm_composite(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps, *args):
    return _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps)[0]


@rule("aten._native_batch_norm_legit_no_training.default")
def _batch_norm_no_training(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(ctx, x, weight, bias, running_mean, running_var, False, momentum, eps)


@rule("aten._native_batch_norm_legit.default", "aten.native_batch_norm.default",
      "aten._native_batch_norm_legit_functional.default")
def _batch_norm_native(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps)


def _window(kernel_size, stride, padding):
    kernel = _ints(kernel_size)
    return kernel, kernel if stride is None or len(stride) == 0 else _ints(stride), _ints(padding)


@rule("aten.max_pool2d.default", "aten.max_pool2d_with_indices.default")
def _max_pool2d(ctx, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """max_pool2d -> y; the _with_indices form -> (y, indices), GE2's int32 indices within each plane."""
    x = ctx.tensor(x)
    _check_4d(x, "max_pool2d")
    kernel, stride, padding = _window(kernel_size, stride, padding)
    y, indices = ctx.graph.max_pool2d(x, kernel_size=kernel, stride=stride, padding=padding,
                                      dilation=_ints(dilation), ceil_mode=bool(ceil_mode))
    return (y, indices) if ctx.node_target.startswith("aten.max_pool2d_with_indices") else y


@rule("aten.avg_pool2d.default")
def _avg_pool2d(ctx, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    if divisor_override is not None:
        raise Unsupported(f"divisor_override={divisor_override}")
    x = ctx.tensor(x)
    _check_4d(x, "avg_pool2d")
    kernel, stride, padding = _window(kernel_size, stride, padding)
    return ctx.graph.avg_pool2d(x, kernel_size=kernel, stride=stride, padding=padding, ceil_mode=bool(ceil_mode),
                                count_include_pad=bool(count_include_pad))


@rule("aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(ctx, x, output_size):
    """Output 1x1 is global_avg_pool; any other size the adaptive_avg_pool2d op (PyTorch's windows)."""
    g = ctx.graph
    x = ctx.tensor(x)
    _check_4d(x, "adaptive_avg_pool2d")
    out = tuple(x.type.shape[2 + i] if d is None else int(d) for i, d in enumerate(
        output_size if isinstance(output_size, (list, tuple)) else (output_size, output_size)))
    if out == (1, 1):
        return g.global_avg_pool(x)
    return g.adaptive_avg_pool2d(x, output_size=out)


@rule("aten.unsqueeze.default")
def _unsqueeze(ctx, x, dim):
    x = ctx.tensor(x)
    shape = list(x.type.shape)
    shape.insert(int(dim) % (x.type.rank + 1), 1)
    return ctx.graph.reshape(x, shape=tuple(shape))


@rule("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def _squeeze(ctx, x, dim=None):
    x = ctx.tensor(x)
    shape = x.type.shape
    dims_ = range(x.type.rank) if dim is None else [dim] if isinstance(dim, int) else dim
    drop = {int(d) % max(x.type.rank, 1) for d in dims_ if shape[int(d) % max(x.type.rank, 1)] == 1}
    return ctx.graph.reshape(x, shape=tuple(d for axis, d in enumerate(shape) if axis not in drop))


@rule("aten.ones.default", "aten.zeros.default", "aten.full.default", "aten.ones_like.default",
      "aten.zeros_like.default", "aten.full_like.default", "aten.new_ones.default", "aten.new_zeros.default",
      "aten.new_full.default")
def _filled(ctx, *args, dtype=None, **kwargs):
    """A constant tensor (ones, zeros, full; of a given size, or like / new from another tensor) as a param; of a
    symbolic shape, the number expanded to it."""
    target = ctx.node_target.split(".")[1]
    like = ctx.tensor(args[0]) if target.endswith("_like") or target.startswith("new_") else None
    if target.endswith("_like"):
        size, rest = like.type.shape, args[1:]
    elif like is not None:
        size, rest = tuple(ctx.get(args[1])), args[2:]
    else:
        size, rest = tuple(ctx.get(args[0])), args[1:]
    value = rest[0] if "full" in target else (1 if "ones" in target else 0)
    if dtype is not None:
        name = normalize(dtype, "dtype")
    elif like is not None:
        name = like.type.dtype
    else:
        name = "float32" if isinstance(value, float) else "bool" if isinstance(value, bool) else "int64"
    if any(isinstance(d, str) for d in size):  # symbolic: the number broadcast to the shape bound at run time
        number = ctx.graph.param(ctx.graph.unique_name("constant"), np.array(value, to_numpy(name)))
        return ctx.graph.expand(number, shape=tuple(size))
    return ctx.graph.param(ctx.graph.unique_name("constant"), np.full(tuple(size), value, to_numpy(name)))


@rule("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx, x, mask, value):
    x = ctx.tensor(x)
    filler = ctx.tensor(value, x)
    if filler.type.dtype != x.type.dtype:
        filler = ctx.graph.cast(filler, dtype=x.type.dtype)
    return ctx.graph.where(ctx.tensor(mask), filler, x)


@rule("aten.bmm.default")
def _bmm(ctx, a, b):
    return batched_matmul(ctx.graph, ctx.tensor(a), ctx.tensor(b))


# --- shape and index ops (ops/indexing.py) ---------------------------------------------------------------------
def _dim(value):
    """A size argument: an int, or a symbolic dim (a sym_size result)."""
    return value if isinstance(value, str) else int(value)


@rule("aten.expand.default")
def _expand(ctx, x, size, implicit=False):
    return ctx.graph.expand(ctx.tensor(x), shape=tuple(_dim(d) for d in ctx.get(size)))


def _torch_pads(x: Value, pad) -> tuple:
    """F.pad's (last axis first: left, right, then the axis before...) as GE2's (begins of every axis, then ends)."""
    rank = x.type.rank
    begins, ends = [0] * rank, [0] * rank
    for index in range(len(pad) // 2):
        axis = rank - 1 - index
        begins[axis], ends[axis] = int(pad[2 * index]), int(pad[2 * index + 1])
    return tuple(begins + ends)


@rule("aten.constant_pad_nd.default")
def _constant_pad(ctx, x, pad, value=0.0):
    x = ctx.tensor(x)
    return ctx.graph.pad(x, pads=_torch_pads(x, pad), mode="constant", value=float(value))


@rule("aten.pad.default")
def _pad(ctx, x, pad, mode="constant", value=None):
    x = ctx.tensor(x)
    modes = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        raise Unsupported(f"padding mode {mode!r} (GE2 pads constant, reflect, replicate and circular)")
    return ctx.graph.pad(x, pads=_torch_pads(x, pad), mode=modes[mode], value=float(value or 0.0))


def _mode_pad(mode):
    def translate(ctx, x, padding):
        x = ctx.tensor(x)
        return ctx.graph.pad(x, pads=_torch_pads(x, padding), mode=mode)

    return translate


for _aten, _mode in (("reflection_pad1d", "reflect"), ("reflection_pad2d", "reflect"), ("reflection_pad3d", "reflect"),
                     ("replication_pad1d", "edge"), ("replication_pad2d", "edge"), ("replication_pad3d", "edge"),
                     ("_pad_circular", "wrap")):
    RULES[f"aten.{_aten}.default"] = _mode_pad(_mode)


@rule("aten.roll.default")
def _roll(ctx, x, shifts, dims=()):
    x = ctx.tensor(x)
    shifts = [int(s) for s in (shifts if isinstance(shifts, (list, tuple)) else [shifts])]
    axes = [int(d) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
    if not axes:  # roll of the flattened tensor
        flat = ctx.graph.reshape(x, shape=(-1,))
        return ctx.graph.reshape(ctx.graph.roll(flat, shifts=tuple(shifts), axes=(0,)), shape=tuple(x.type.shape))
    return ctx.graph.roll(x, shifts=tuple(shifts), axes=tuple(axes))


@rule("aten.repeat_interleave.self_int")
def _repeat_interleave(ctx, x, repeats, dim=None, output_size=None):
    x = ctx.tensor(x)
    if dim is None:
        x, dim = ctx.graph.reshape(x, shape=(-1,)), 0
    return ctx.graph.repeat_interleave(x, repeats=int(repeats), axis=int(dim))


@rule("aten.repeat.default")
def _repeat(ctx, x, repeats):
    """Tensor.repeat: tile, with leading axes of 1 when there are more repeats than axes."""
    x = ctx.tensor(x)
    repeats = tuple(int(r) for r in repeats)
    if len(repeats) > x.type.rank:
        x = ctx.graph.reshape(x, shape=(1,) * (len(repeats) - x.type.rank) + tuple(x.type.shape))
    return ctx.graph.tile(x, repeats=repeats)


@rule("aten.gather.default")
def _gather_elements(ctx, x, dim, index, sparse_grad=False):
    return ctx.graph.gather_elements(ctx.tensor(x), ctx.tensor(index), axis=int(dim))


@rule("aten.index_select.default")
def _index_select(ctx, x, dim, index):
    return ctx.graph.gather(ctx.tensor(x), ctx.tensor(index), axis=int(dim))


def _varying_axes(index: Value, rank: int) -> list[int]:
    """The axes of the broadcast index shape (``rank`` axes, right-aligned) along which ``index`` is not 1."""
    offset = rank - index.type.rank
    return [offset + axis for axis, size in enumerate(index.type.shape) if size != 1]


@rule("aten.index.Tensor")
def _index(ctx, x, indices):
    """x[..., i, ...]: one index tensor (None for the axes taken whole before it) is a gather along its axis.
    Several are broadcast together and paired, as PyTorch does:
    - as an outer product (each varies along its own broadcast axes, in the order of the axes it indexes: HF's
      ``mask[batch_idx, kv_idx]``): one gather per indexed axis, symbolic sizes included;
    - otherwise they address the flattened block of their axes: one gather of i_0 * (n_1 * ... * n_k) + ... + i_k,
      the later indices taken modulo their axis so that negative ones count from its end (the gather honours the
      first one's sign); the sizes after the first must be concrete.
    Indexed axes apart from each other go first, as PyTorch puts the broadcast index dims first then."""
    g = ctx.graph
    x = ctx.tensor(x)
    given = [(axis, ctx.tensor(index)) for axis, index in enumerate(indices) if index is not None]
    if not given:
        raise Unsupported("indexing without an index tensor")
    if any(index.type.dtype == "bool" for _, index in given):
        raise Unsupported("boolean mask indexing (the result's size depends on the values)")
    if len(given) == 1:
        return g.gather(x, given[0][1], axis=given[0][0])
    axes, indexes = [axis for axis, _ in given], [index for _, index in given]
    first = axes[0]
    if axes != list(range(first, first + len(axes))):
        x = g.transpose(x, perm=tuple(axes + [axis for axis in range(x.type.rank) if axis not in axes]))
        first = 0
    shape = x.type.shape
    rest = shape[first + len(indexes):]
    rank = max(index.type.rank for index in indexes)
    spans = [_varying_axes(index, rank) for index in indexes]
    if all(spans) and all(left[-1] < right[0] for left, right in zip(spans, spans[1:])):
        broadcast = [1] * rank
        for index, span in zip(indexes, spans):
            for axis in span:
                broadcast[axis] = index.type.shape[axis - (rank - index.type.rank)]
        y = x
        for position, index in enumerate(indexes):
            y = g.gather(y, g.reshape(index, shape=(dims.product(*index.type.shape),)), axis=first + position)
        return g.reshape(y, shape=(*shape[:first], *broadcast, *rest))
    sizes = list(shape[first:first + len(indexes)])
    if any(isinstance(size, str) for size in sizes[1:]):
        raise Unsupported(f"indexing the axes {axes} of shape {shape} with paired (not outer-product) indices: a "
                          "symbolic size after the first indexed axis")
    combined = None
    for position, index in enumerate(indexes):
        if position > 0:
            index = g.mod(index, _number(ctx, sizes[position], index.type.dtype), fmod=False)
        stride = int(np.prod(sizes[position + 1:], dtype=np.int64))
        if stride != 1:
            index = g.mul(index, _number(ctx, stride, index.type.dtype))
        combined = index if combined is None else g.add(combined, index)
    merged = g.reshape(x, shape=(*shape[:first], dims.product(*sizes), *rest))
    return g.gather(merged, combined, axis=first)


@rule("aten.cumsum.default")
def _cumsum(ctx, x, dim, dtype=None):
    x = ctx.tensor(x)
    if dtype is not None and normalize(dtype, "dtype") != x.type.dtype:
        x = ctx.graph.cast(x, dtype=normalize(dtype, "dtype"))
    elif x.type.dtype in ("bool", "uint8", "int32"):  # torch sums integers (and bools) in int64
        x = ctx.graph.cast(x, dtype="int64")
    return ctx.graph.cumsum(x, axis=int(dim))


@rule("aten.tril.default")
def _tril(ctx, x, diagonal=0):
    return ctx.graph.trilu(ctx.tensor(x), k=int(diagonal), upper=False)


@rule("aten.triu.default")
def _triu(ctx, x, diagonal=0):
    return ctx.graph.trilu(ctx.tensor(x), k=int(diagonal), upper=True)


@rule("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(ctx, *bounds, dtype=None, **kwargs):
    """A constant range becomes a param; a range up to a symbolic dim (``arange(past, past + seq)``) the arange op
    (``_arange.symbolic_range``)."""
    g = ctx.graph
    bounds = [ctx.get(b) for b in bounds]
    start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds, 1)[:3]
    floating = any(isinstance(b, float) for b in (start, end, step))
    name = normalize(dtype, "dtype") if dtype is not None else ("float32" if floating else "int64")
    if not any(isinstance(b, str) for b in (start, end, step)):
        return g.param(g.unique_name("arange"), np.arange(start, end, step).astype(to_numpy(name)))
    return symbolic_range(g, start, end, step, name)


def _upsample(ctx, x, output_size, scales, mode, align_corners=False):
    """F.interpolate of a 4-d tensor: nearest is ONNX's asymmetric + floor; bilinear is half_pixel (the input
    clamped at 0, PyTorch's area_pixel_compute_source_index) or align_corners. Given scale factors are used in
    the coordinates, as PyTorch does."""
    x = ctx.tensor(x)
    _check_4d(x, f"upsample_{mode}")
    height, width = x.type.shape[2:]
    if output_size:
        size = tuple(int(d) for d in output_size)
        given = None if not scales or any(s is None for s in scales) else tuple(float(s) for s in scales)
    elif scales:
        given = tuple(float(s) for s in scales)
        size = (int(np.floor(height * given[0])), int(np.floor(width * given[1])))
    else:
        raise Unsupported("upsampling without an output size or scale factors")
    if mode == "nearest":
        return ctx.graph.resize(x, size=size, mode="nearest", coordinates="asymmetric", nearest_mode="floor",
                                scales=given)
    coordinates = "align_corners" if align_corners else "half_pixel"
    return ctx.graph.resize(x, size=size, mode="linear", coordinates=coordinates,
                            scales=None if align_corners else given)


@rule("aten.upsample_nearest2d.default")
def _upsample_nearest(ctx, x, output_size, scales_h=None, scales_w=None):
    return _upsample(ctx, x, output_size, (scales_h, scales_w), "nearest")


@rule("aten.upsample_nearest2d.vec")
def _upsample_nearest_vec(ctx, x, output_size, scale_factors):
    return _upsample(ctx, x, output_size, scale_factors, "nearest")


@rule("aten.upsample_bilinear2d.default")
def _upsample_bilinear(ctx, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _upsample(ctx, x, output_size, (scales_h, scales_w), "linear", bool(align_corners))


@rule("aten.upsample_bilinear2d.vec")
def _upsample_bilinear_vec(ctx, x, output_size, align_corners, scale_factors):
    return _upsample(ctx, x, output_size, scale_factors, "linear", bool(align_corners))


@rule("aten.einsum.default")
def _einsum(ctx, equation, tensors, path=None):
    return einsum(ctx.graph, equation, [ctx.tensor(t) for t in tensors])


# --- attention --------------------------------------------------------------------------------------------------
def _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa=False):
    """GE2's attention op; an ``attn_mask`` (a boolean keep-mask or an additive float bias, broadcast as PyTorch
    does) becomes its additive ``bias`` input, [1 or batch, 1 or heads, seq_q, seq_k]. passes/attention_fusion.py
    then folds a constant causal bias into causal=True."""
    if dropout_p:
        raise Unsupported(f"dropout_p={dropout_p}: export the module in eval() mode")
    q, k, v = ctx.tensor(q), ctx.tensor(k), ctx.tensor(v)
    if q.type.rank != 4:
        raise Unsupported(f"attention on rank-{q.type.rank} tensors (GE2's op takes [batch, heads, seq, dim])")
    if k.type.shape[1] != q.type.shape[1] and not enable_gqa:
        raise Unsupported("K/V heads differ from the query heads without enable_gqa")
    scale = None if scale is None else float(scale)
    bias = None if attn_mask is None else attention_bias(ctx.graph, ctx.tensor(attn_mask), q, k)
    return ctx.graph.attention(q, k, v, bias, causal=bool(is_causal), scale=scale, layout="bhsd")


@rule("aten.scaled_dot_product_attention.default")
def _sdpa(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return _attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)[0]


@rule("aten._scaled_dot_product_flash_attention_for_cpu.default")
def _sdpa_flash_cpu(ctx, q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """(output, logsumexp): GE2's op gives the log-sum-exp too."""
    return tuple(_attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale))


@rule("aten._native_multi_head_attention.default")
def _native_multi_head_attention(ctx, query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                 proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    """nn.MultiheadAttention's fused inference path (batch_first [batch, seq, embed]): the Q, K, V projections
    (rows of the packed qkv weight), attention in the bshd layout, the output projection. (output, None)."""
    if mask is not None:
        raise Unsupported("a mask in nn.MultiheadAttention's fused path")
    if need_weights:
        raise Unsupported("need_weights=True (the attention probabilities as an output)")
    g = ctx.graph
    embed, heads = int(embed_dim), int(num_head)
    weight, bias = ctx.tensor(qkv_weight), ctx.tensor(qkv_bias)
    projected = []
    for index, source in enumerate((query, key, value)):
        rows = dict(starts=(index * embed,), ends=((index + 1) * embed,), axes=(0,))
        x = ctx.tensor(source)
        y = _linear(ctx, x, g.slice(weight, **rows), g.slice(bias, **rows))
        projected.append(g.reshape(y, shape=(*x.type.shape[:2], heads, embed // heads)))
    attended, _ = g.attention(*projected, layout="bshd")
    out = _linear(ctx, g.reshape(attended, shape=(*attended.type.shape[:2], embed)), proj_weight, proj_bias)
    return out, None


@rule("<built-in function getitem>")
def _getitem(ctx, items, index):
    items = ctx.get(items)
    if not isinstance(items, tuple):
        raise Unsupported(f"indexing a {type(items).__name__}")
    if not -len(items) <= index < len(items):
        raise Unsupported(f"output {index} of a node GE2 translates into {len(items)} outputs")
    return items[index]


def _target_name(target) -> str:
    if target is operator.getitem:
        return "<built-in function getitem>"
    return str(target)


def functional_form(target: str) -> str | None:
    """The functional ATen op of an in-place one (``aten.hardtanh_.default`` -> ``aten.hardtanh.default``, as
    nn.ReLU6(inplace=True) or ``out += identity`` keep them), when GE2 translates that form; else None."""
    parts = target.split(".")
    if len(parts) != 3 or parts[0] != "aten" or not parts[1].endswith("_") or parts[1].startswith("_"):
        return None
    functional = ".".join((parts[0], parts[1][:-1], parts[2]))
    return functional if functional in RULES else None


def _functional_target(node, target: str, positions: dict, problems: list) -> str | None:
    """The target to translate ``node`` with: an in-place op as its functional form when its input is not read
    again after it (None, with a problem recorded, otherwise): then the in-place update is pure."""
    functional = functional_form(target)
    if functional is None:
        return target
    mutated = node.args[0]
    later = [user.name for user in mutated.users if positions[user] > positions[node]]
    if later:
        problems.append((node.name, target, f"in-place update of '{mutated.name}', which {later} read afterwards"))
        return None
    return functional


def supported_targets() -> list[str]:
    """The ATen targets ``from_torch`` translates; the in-place form of each (``aten.relu_.default``) too."""
    return sorted(RULES)


def from_torch(module, example_inputs: tuple, name: str | None = None, dynamic_shapes=None) -> Graph:
    """A ``torch.nn.Module`` as a GE2 graph, traced with ``torch.export`` on ``example_inputs`` (a tuple).

    ``dynamic_shapes`` goes to ``torch.export.export`` (e.g. ``({0: torch.export.Dim("batch")},)``): the dims it
    marks stay symbolic in the graph (named by torch's symbols, ``s0``...), and one executor runs several sizes."""
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"example_inputs: expected a tuple of tensors, got {type(example_inputs).__name__}")
    exported = torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes)
    signature = exported.graph_signature
    state = exported.state_dict
    constants = getattr(exported, "constants", {})
    graph = Graph(name or type(module).__name__)
    ctx = _Context(graph)
    problems: list[tuple[str, str, str]] = []
    failed: set[str] = set()
    input_kinds = {spec.arg.name: spec for spec in signature.input_specs}
    user_index = 0
    positions = {node: index for index, node in enumerate(exported.graph.nodes)}
    for node in exported.graph.nodes:
        if node.op == "placeholder":
            spec = input_kinds[node.name]
            kind = spec.kind.name
            if kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
                tensor = state[spec.target] if spec.target in state else constants[spec.target]
                array = _to_numpy(tensor)
                ctx.values[node.name] = graph.param(graph.unique_name(spec.target), array)
            elif kind == "USER_INPUT":
                example = example_inputs[user_index]
                user_index += 1
                ctx.values[node.name] = graph.input(graph.unique_name(node.name), _shape_of(node, example),
                                                    normalize(example.dtype, f"example_inputs[{user_index - 1}]"))
            else:
                problems.append((node.name, kind, "input kind not supported"))
                failed.add(node.name)
        elif node.op == "call_function":
            target = _target_name(node.target)
            if any(isinstance(a, torch.fx.Node) and a.name in failed for a in node.all_input_nodes):
                failed.add(node.name)
                continue
            target = _functional_target(node, target, positions, problems)
            if target is None:
                failed.add(node.name)
                continue
            ctx.node_target = target
            translate = RULES.get(target)
            if translate is None:
                problems.append((node.name, target, "ATen op not supported by GE2"))
                failed.add(node.name)
                continue
            try:
                ctx.values[node.name] = translate(ctx, *node.args, **node.kwargs)
            except Unsupported as reason:
                problems.append((node.name, target, str(reason)))
                failed.add(node.name)
            except (ValueError, TypeError) as error:
                problems.append((node.name, target, str(error)))
                failed.add(node.name)
        elif node.op == "output":
            if problems:
                break
            results = node.args[0]
            user_outputs = [spec for spec in signature.output_specs if spec.kind.name == "USER_OUTPUT"]
            values = [ctx.get(result) for result in results][:len(user_outputs)] if isinstance(
                results, (list, tuple)) else [ctx.get(results)]
            for index, value in enumerate(values):
                graph.output(value, "y" if len(values) == 1 else f"y{index}")
    if problems:
        raise UnsupportedModelError(graph.name, problems)
    fuse_imported_attention(graph)  # eager attention written out, as the ONNX importer (passes/attention_fusion.py)
    return graph


def _shape_of(node, example) -> tuple:
    """The shape of a user input as exported: ints, and the names of the symbolic sizes dynamic_shapes made."""
    traced = node.meta.get("val")
    shape = traced.shape if traced is not None and hasattr(traced, "shape") else example.shape
    return tuple(int(d) if isinstance(d, int) or str(d).isdigit() else str(d) for d in shape)


def _to_numpy(tensor) -> np.ndarray:
    torch = _torch()
    tensor = tensor.detach().to("cpu")
    if tensor.dtype == torch.bfloat16:
        from ..dtypes import to_numpy

        return tensor.view(torch.int16).numpy().view(to_numpy("bfloat16"))
    return tensor.numpy()


__all__ = ["from_torch", "supported_targets", "RULES"]
