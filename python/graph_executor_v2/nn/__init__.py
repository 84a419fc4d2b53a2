"""``ge2.nn``: layers that build IR and own their parameters.

A ``Module`` holds ``Parameter``s (NumPy arrays, float32 masters) and sub-modules, and writes its computation into
a graph in ``forward(self, g, *inputs)`` with the graph builder (``g.<op>(...)``). ``model.graph(input_spec)``
returns the whole ``ir.Graph``; the trainer and ``ExecutorV2`` take it like any graph. Parameters appear in the
graph as params named by their path (``"0.weight"``, ``"encoder.norm.bias"``), the names PyTorch's
``state_dict`` uses, so ``load_state_dict`` takes a PyTorch state dict (as NumPy arrays) directly.

Layers are initialised as PyTorch initialises the same layers (same distributions), from GE2's own generator:
``ge2.nn.manual_seed(n)`` makes construction reproducible. Weight layouts are PyTorch's (``Linear.weight`` is
``[out_features, in_features]``).
"""
from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from ..dtypes import normalize, to_numpy
from ..ir.graph import Graph, Value

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Seeds the generator every layer draws its initial weights from."""
    global _generator
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
    _generator = np.random.default_rng(int(seed))


def _uniform(bound: float, shape) -> np.ndarray:
    return _generator.uniform(-bound, bound, size=shape).astype(np.float32)


class Parameter:
    """A trainable array (float32 master copy). ``name`` is its path in the module tree, set when a graph is
    built; ``dtype`` is the dtype it has in the graph (the master is cast to it)."""

    def __init__(self, data: np.ndarray, dtype: str = "float32"):
        if not isinstance(data, np.ndarray):
            raise TypeError(f"data: expected a NumPy array, got {type(data).__name__}")
        self.data = np.ascontiguousarray(data, dtype=np.float32)
        self.dtype = normalize(dtype, "dtype")
        self.name: str | None = None

    @property
    def shape(self) -> tuple:
        return self.data.shape

    def value(self, g: Graph) -> Value:
        """This parameter as a param of graph ``g`` (created on first use, shared after)."""
        if self.name is None:
            raise ValueError("parameter has no name yet: build graphs with model.graph(...) or call the root "
                             "module on the graph")
        existing = g.params.get(self.name)
        if existing is not None:
            return existing
        return g.param(self.name, self.data.astype(to_numpy(self.dtype)))

    def __repr__(self) -> str:
        return f"Parameter({self.name or '?'}, shape={self.data.shape}, dtype={self.dtype})"


class Module:
    """The base of every layer: parameters, sub-modules, train/eval mode, state dicts and graph building."""

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() before setting "
                                 f"'{name}'")
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    # --- the tree ---------------------------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        yield prefix, self
        for name, module in self._modules.items():
            yield from module.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter once (a shared one under its first path), in registration order."""
        seen: set[int] = set()
        for module_name, module in self.named_modules(prefix):
            for name, parameter in module._parameters.items():
                if id(parameter) not in seen:
                    seen.add(id(parameter))
                    yield (f"{module_name}.{name}" if module_name else name), parameter

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def state_dict(self) -> dict[str, np.ndarray]:
        return {name: p.data.copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copies arrays (NumPy, or anything ``np.asarray`` takes, e.g. CPU torch tensors) into the parameters."""
        own = dict(self.named_parameters())
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if strict and (missing or unexpected):
            raise KeyError(f"state: missing keys {missing}, unexpected keys {unexpected}")
        for name, parameter in own.items():
            if name not in state:
                continue
            array = np.asarray(state[name], dtype=np.float32)
            if array.shape != parameter.shape:
                raise ValueError(f"state['{name}']: expected shape {parameter.shape}, got {array.shape}")
            parameter.data = np.ascontiguousarray(array)

    def train(self, mode: bool = True) -> "Module":
        for _, module in self.named_modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def to(self, dtype) -> "Module":
        """Sets the graph dtype of every parameter (the float32 masters stay)."""
        dtype = normalize(dtype, "dtype")
        for parameter in self.parameters():
            parameter.dtype = dtype
        return self

    # --- graphs -----------------------------------------------------------------------------------------------
    def forward(self, g: Graph, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must define forward(self, g, *inputs)")

    def __call__(self, g: Graph, *inputs, **kwargs):
        if not isinstance(g, Graph):
            raise TypeError(f"g: expected the ir.Graph being built as the first argument, got {type(g).__name__}")
        if any(p.name is None for p in self.parameters()):
            self._name_parameters()
        return self.forward(g, *inputs, **kwargs)

    def _name_parameters(self) -> None:
        for name, parameter in self.named_parameters():
            parameter.name = name

    def graph(self, input_spec, name: str | None = None) -> Graph:
        """The IR graph of this model. ``input_spec``: ``(shape, dtype)`` for one input named ``x``, or a dict
        ``name -> (shape, dtype)`` (inputs passed to ``forward`` in that order). Outputs: ``y`` for one value, else
        ``y0, y1, ...``, or the names of a dict that ``forward`` returns."""
        if isinstance(input_spec, tuple) and len(input_spec) == 2 and not isinstance(input_spec[1], tuple):
            input_spec = {"x": input_spec}
        if not isinstance(input_spec, dict) or not input_spec:
            raise TypeError("input_spec: expected (shape, dtype) or a dict name -> (shape, dtype), got "
                            f"{input_spec!r}")
        g = Graph(name or type(self).__name__)
        self._name_parameters()
        inputs = []
        for input_name, spec in input_spec.items():
            if not (isinstance(spec, tuple) and len(spec) == 2):
                raise TypeError(f"input_spec['{input_name}']: expected (shape, dtype), got {spec!r}")
            inputs.append(g.input(input_name, tuple(spec[0]), spec[1]))
        result = self(g, *inputs)
        if isinstance(result, Value):
            g.output(result, "y")
        elif isinstance(result, dict):
            for output_name, value in result.items():
                g.output(value, output_name)
        else:
            for index, value in enumerate(result):
                g.output(value, f"y{index}")
        return g

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        children = [f"  ({name}): " + repr(module).replace("\n", "\n  ") for name, module in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + (")" if not children else "\n" + "\n".join(children) + "\n)")


# ---------------------------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------------------------
def _rows(g: Graph, x: Value, features: int, what: str) -> tuple[Value, tuple | None]:
    """x as a 2-d [rows, features] array, and the leading shape to restore (None when x was already 2-d)."""
    if x.type.rank < 1 or x.type.shape[-1] != features:
        raise ValueError(f"{what}: expected an input whose last dim is {features}, got {x.type}")
    if x.type.rank == 2:
        return x, None
    if not x.type.is_concrete:
        raise ValueError(f"{what}: a {x.type.rank}-d input needs concrete dims to flatten, got {x.type}")
    return g.reshape(x, shape=(-1, features)), tuple(x.type.shape[:-1])


class Linear(Module):
    """``y = x W^T + b`` over the last axis; W is [out_features, in_features] (PyTorch's layout). Initialised as
    ``torch.nn.Linear``: W and b uniform in +-1/sqrt(in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        _check_positive(in_features=in_features, out_features=out_features)
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        self.weight = Parameter(_uniform(bound, (out_features, in_features)))
        self.bias = Parameter(_uniform(bound, (out_features,))) if bias else None

    def forward(self, g, x):
        rows, lead = _rows(g, x, self.in_features, "Linear input")
        bias = None if self.bias is None else self.bias.value(g)
        y = g.gemm(rows, self.weight.value(g), bias, trans_b=True)
        return y if lead is None else g.reshape(y, shape=(*lead, self.out_features))

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class LayerNorm(Module):
    """Normalizes the last axis; gamma ones, beta zeros (``torch.nn.LayerNorm(normalized_shape)`` with an int)."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, elementwise_affine: bool = True):
        super().__init__()
        _check_positive(normalized_shape=normalized_shape)
        self.normalized_shape, self.eps = normalized_shape, float(eps)
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(np.ones(normalized_shape, np.float32))
            self.bias = Parameter(np.zeros(normalized_shape, np.float32))

    def forward(self, g, x):
        _check_last_dim(x, self.normalized_shape, "LayerNorm input")
        if self.elementwise_affine:
            return g.layernorm(x, self.weight.value(g), self.bias.value(g), eps=self.eps)
        dtype = to_numpy(x.type.dtype)  # no affine: fixed ones and zeros, constants of the graph
        ones = g.param(g.unique_name("layernorm_ones"), np.ones(self.normalized_shape, dtype))
        zeros = g.param(g.unique_name("layernorm_zeros"), np.zeros(self.normalized_shape, dtype))
        return g.layernorm(x, ones, zeros, eps=self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class RMSNorm(Module):
    """``y = x / sqrt(mean(x^2) + eps) * weight`` over the last axis; weight ones. ``eps`` defaults to 1e-6
    (``torch.nn.RMSNorm`` takes the dtype's machine epsilon when given None)."""

    def __init__(self, normalized_shape: int, eps: float = 1e-6):
        super().__init__()
        _check_positive(normalized_shape=normalized_shape)
        self.normalized_shape, self.eps = normalized_shape, float(eps)
        self.weight = Parameter(np.ones(normalized_shape, np.float32))

    def forward(self, g, x):
        _check_last_dim(x, self.normalized_shape, "RMSNorm input")
        return g.rmsnorm(x, self.weight.value(g), eps=self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class Embedding(Module):
    """Rows of a [num_embeddings, embedding_dim] table by integer ids; initialised N(0, 1) as PyTorch does."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        _check_positive(num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(_generator.standard_normal((num_embeddings, embedding_dim)).astype(np.float32))

    def forward(self, g, ids):
        return g.embedding(self.weight.value(g), ids)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Dropout(Module):
    """Zeroes elements with probability p and scales the rest by 1/(1-p) in training; the identity in eval mode.
    The mask's seed is drawn from GE2's generator when the graph is built."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ValueError(f"p: expected a probability in [0, 1), got {p!r}")
        self.p = float(p)

    def forward(self, g, x):
        if not self.training or self.p == 0.0:
            return x
        return g.dropout(x, p=self.p, seed=int(_generator.integers(0, 2**31 - 1)))

    def extra_repr(self):
        return f"p={self.p}"


def _activation(op: str, doc: str):
    class Activation(Module):
        def forward(self, g, x):
            return getattr(g, op)(x)

    Activation.__name__ = Activation.__qualname__ = doc.split(":")[0]
    Activation.__doc__ = doc
    return Activation


ReLU = _activation("relu", "ReLU: max(x, 0)")
SiLU = _activation("silu", "SiLU: x * sigmoid(x)")
Sigmoid = _activation("sigmoid", "Sigmoid: 1 / (1 + exp(-x))")
Tanh = _activation("tanh", "Tanh: tanh(x)")


class GELU(Module):
    """GELU: the exact (erf) form by default, the tanh form with ``approximate="tanh"`` (as torch.nn.GELU)."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, g, x):
        return g.gelu(x) if self.approximate == "tanh" else g.gelu_erf(x)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class Softmax(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, g, x):
        return g.softmax(x, axis=self.dim)


class LogSoftmax(Softmax):
    def forward(self, g, x):
        return g.log_softmax(x, axis=self.dim)


class Flatten(Module):
    """Flattens dims ``start_dim..end_dim`` into one (``torch.nn.Flatten``: from dim 1 by default)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, g, x):
        rank = x.type.rank
        start, end = self.start_dim % rank, self.end_dim % rank
        if start > end:
            raise ValueError(f"start_dim: {self.start_dim} comes after end_dim {self.end_dim} for a {rank}-d input")
        shape = x.type.shape
        if not all(isinstance(d, int) for d in shape[start:end + 1]):
            raise ValueError(f"Flatten input: dims {start}..{end} must be concrete, got {x.type}")
        merged = int(np.prod(shape[start:end + 1], dtype=np.int64))
        return g.reshape(x, shape=(*shape[:start], merged, *shape[end + 1:]))


class MultiheadAttention(Module):
    """Self-attention (``forward(g, x)``) or attention of ``query`` over ``key``/``value`` (``forward(g, q, k, v)``),
    inputs [batch, seq, embed_dim] (``batch_first=True`` in PyTorch's terms), on the ``attention`` op.

    Parameters as ``torch.nn.MultiheadAttention``: a packed ``in_proj_weight`` [3 * embed_dim, embed_dim] (xavier
    uniform), ``in_proj_bias`` (zeros) and ``out_proj`` (a Linear whose bias starts at zero). The projections run as
    one GEMM; the heads are split by reshapes and the op reads [batch, seq, heads, head_dim] directly."""

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True, causal: bool = False):
        super().__init__()
        _check_positive(embed_dim=embed_dim, num_heads=num_heads)
        if embed_dim % num_heads:
            raise ValueError(f"num_heads: {num_heads} must divide embed_dim {embed_dim}")
        self.embed_dim, self.num_heads, self.causal = embed_dim, num_heads, bool(causal)
        bound = math.sqrt(6.0 / (embed_dim + 3 * embed_dim))  # xavier_uniform_ on the packed [3E, E] weight
        self.in_proj_weight = Parameter(_uniform(bound, (3 * embed_dim, embed_dim)))
        self.in_proj_bias = Parameter(np.zeros(3 * embed_dim, np.float32)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        if bias:
            self.out_proj.bias.data[:] = 0.0

    def forward(self, g, query, key=None, value=None):
        if (key is None) != (value is None):
            raise ValueError("key, value: give both (cross-attention) or neither (self-attention)")
        width, heads = self.embed_dim, self.num_heads
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if tensor is not None and (tensor.type.rank != 3 or tensor.type.shape[-1] != width):
                raise ValueError(f"MultiheadAttention {name}: expected [batch, seq, {width}], got {tensor.type}")
        weight = self.in_proj_weight.value(g)
        bias = None if self.in_proj_bias is None else self.in_proj_bias.value(g)
        if key is None:  # one GEMM for q, k and v
            batch, seq, _ = query.type.shape
            qkv = g.gemm(g.reshape(query, shape=(-1, width)), weight, bias, trans_b=True)
            qkv = g.reshape(qkv, shape=(batch, seq, 3, heads, width // heads))
            q, k, v = (g.reshape(g.slice(qkv, starts=(i,), ends=(i + 1,), axes=(2,)),
                                 shape=(batch, seq, heads, width // heads)) for i in range(3))
        else:
            q, k, v = (self._project(g, tensor, weight, bias, index) for index, tensor in
                       enumerate((query, key, value)))
        attended, _ = g.attention(q, k, v, causal=self.causal, layout="bshd")  # (y, lse)
        batch, seq = query.type.shape[:2]
        return self.out_proj(g, g.reshape(attended, shape=(batch, seq, width)))

    def _project(self, g, tensor, weight, bias, index):
        width, heads = self.embed_dim, self.num_heads
        rows = slice(index * width, (index + 1) * width)
        part = g.slice(weight, starts=(rows.start,), ends=(rows.stop,), axes=(0,))
        part_bias = None if bias is None else g.slice(bias, starts=(rows.start,), ends=(rows.stop,), axes=(0,))
        batch, seq, _ = tensor.type.shape
        projected = g.gemm(g.reshape(tensor, shape=(-1, width)), part, part_bias, trans_b=True)
        return g.reshape(projected, shape=(batch, seq, heads, width // heads))

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, causal={self.causal}"


class Sequential(Module):
    """Modules applied in order, named "0", "1", ... (as torch.nn.Sequential)."""

    def __init__(self, *modules: Module):
        super().__init__()
        for index, module in enumerate(modules):
            if not isinstance(module, Module):
                raise TypeError(f"modules[{index}]: expected a ge2.nn.Module, got {type(module).__name__}")
            setattr(self, str(index), module)

    def __len__(self):
        return len(self._modules)

    def __getitem__(self, index: int) -> Module:
        return list(self._modules.values())[index]

    def forward(self, g, x):
        for module in self._modules.values():
            x = module(g, x)
        return x


# ---------------------------------------------------------------------------------------------------------------
def _check_positive(**sizes) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")


def _check_last_dim(x: Value, size: int, what: str) -> None:
    if x.type.rank < 1 or x.type.shape[-1] != size:
        raise ValueError(f"{what}: expected an input whose last dim is {size}, got {x.type}")


__all__ = ["manual_seed", "Parameter", "Module", "Linear", "LayerNorm", "RMSNorm", "Embedding", "Dropout", "ReLU",
           "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Flatten", "MultiheadAttention",
           "Sequential"]
