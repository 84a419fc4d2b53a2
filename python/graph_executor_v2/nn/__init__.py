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
from ..ops import _layout

BUFFER_UPDATE_PREFIX = "update/"  # graph output "update/<param>": the param's value for the next step (a buffer)

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


class Buffer(Parameter):
    """A non-trainable array a layer keeps across steps (batch norm's running statistics), float32. It appears in
    the graph as a param like a ``Parameter``; a layer that updates it declares the new value as a graph output
    named ``BUFFER_UPDATE_PREFIX + name``, which the ``Trainer`` copies back into the buffer after every step (and
    which a caller running the graph itself may write back with ``load_state_dict``)."""


class Module:
    """The base of every layer: parameters, buffers, sub-modules, train/eval mode, state dicts and graph building."""

    ignored_state_keys: tuple[str, ...] = ()  # state-dict keys of PyTorch's layer that load_state_dict skips
    float32_parameters = False  # True: to(dtype) leaves this layer's parameters in float32

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}.__init__ must call super().__init__() before setting "
                                 f"'{name}'")
        self._parameters.pop(name, None)
        self._buffers.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Buffer):
            self._buffers[name] = value
        elif isinstance(value, Parameter):
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

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Buffer]]:
        for module_name, module in self.named_modules(prefix):
            for name, buffer in module._buffers.items():
                yield (f"{module_name}.{name}" if module_name else name), buffer

    def _named_state(self) -> Iterator[tuple[str, Parameter]]:
        """Parameters and buffers in PyTorch's state_dict order: per module its parameters, then its buffers."""
        seen: set[int] = set()
        for module_name, module in self.named_modules():
            for name, array in [*module._parameters.items(), *module._buffers.items()]:
                if id(array) not in seen:
                    seen.add(id(array))
                    yield (f"{module_name}.{name}" if module_name else name), array

    def state_dict(self) -> dict[str, np.ndarray]:
        return {name: p.data.copy() for name, p in self._named_state()}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copies arrays (NumPy, or anything ``np.asarray`` takes, e.g. CPU torch tensors) into the parameters and
        buffers. Keys a layer lists in ``ignored_state_keys`` (PyTorch state GE2 has no use for) are skipped."""
        own = dict(self._named_state())
        ignored = {f"{path}.{key}" if path else key for path, module in self.named_modules()
                   for key in module.ignored_state_keys}
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own) - ignored)
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
        """Sets the graph dtype of every parameter (the float32 masters stay); layers whose op keeps its parameters
        in float32 (``float32_parameters``, e.g. batch norm) and buffers keep float32."""
        dtype = normalize(dtype, "dtype")
        for _, module in self.named_modules():
            if not module.float32_parameters:
                for parameter in module._parameters.values():
                    parameter.dtype = dtype
        return self

    # --- graphs -----------------------------------------------------------------------------------------------
    def forward(self, g: Graph, *inputs):
        raise NotImplementedError(f"{type(self).__name__} must define forward(self, g, *inputs)")

    def __call__(self, g: Graph, *inputs, **kwargs):
        if not isinstance(g, Graph):
            raise TypeError(f"g: expected the ir.Graph being built as the first argument, got {type(g).__name__}")
        if any(p.name is None for _, p in self._named_state()):
            self._name_parameters()
        return self.forward(g, *inputs, **kwargs)

    def _name_parameters(self) -> None:
        for name, parameter in self._named_state():
            parameter.name = name

    def graph(self, input_spec, name: str | None = None) -> Graph:
        """The IR graph of this model. ``input_spec``: ``(shape, dtype)`` for one input named ``x``, or a dict
        ``name -> (shape, dtype)`` (inputs passed to ``forward`` in that order). Outputs: ``y`` for one value, else
        ``y0, y1, ...``, or the names of a dict that ``forward`` returns; in training mode also the new values of
        the buffers a layer updates (``BUFFER_UPDATE_PREFIX + name``, see ``Buffer``)."""
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


def _pair(value, argument: str) -> tuple[int, int]:
    values = (int(value),) * 2 if _layout.is_int(value) else _layout.int_tuple(value, argument)
    if len(values) != 2:
        raise TypeError(f"{argument}: expected an int or 2 ints (height, width), got {value!r}")
    return values


def _check_layout(layout) -> str:
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout: expected 'NCHW' or 'NHWC', got {layout!r}")
    return layout


class Conv2d(Module):
    """2-d convolution on the ``conv2d`` op, as ``torch.nn.Conv2d``: ``weight`` [out_channels, in_channels/groups,
    kH, kW] (PyTorch's layout whatever ``layout`` says; NHWC graphs read it through a transpose), ``bias``
    [out_channels]. ``padding``: an int, (h, w), ``"valid"`` (0) or ``"same"`` (stride 1; an odd total goes to the
    bottom/right as PyTorch pads). Initialised as PyTorch: kaiming_uniform(a=sqrt(5)) for the weight, i.e. uniform
    in +-1/sqrt(fan_in) with fan_in = in_channels/groups * kH * kW, and the bias uniform in the same bound.
    ``layout``: "NCHW" (x [N, C, H, W]) or "NHWC" (x [N, H, W, C])."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, layout: str = "NCHW"):
        super().__init__()
        _check_positive(in_channels=in_channels, out_channels=out_channels, groups=groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"groups: {groups} must divide in_channels ({in_channels}) and out_channels "
                             f"({out_channels})")
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride, self.dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
        _check_positive(kernel_size=min(self.kernel_size), stride=min(self.stride), dilation=min(self.dilation))
        if padding == "same" and self.stride != (1, 1):
            raise ValueError(f"padding: 'same' needs stride 1 (as in PyTorch), got stride {self.stride}")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"padding: expected an int, (h, w), 'same' or 'valid', got {padding!r}")
        elif min(_pair(padding, "padding")) < 0:
            raise ValueError(f"padding: expected entries >= 0, got {padding!r}")
        self.padding = padding if isinstance(padding, str) else _pair(padding, "padding")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.layout = _check_layout(layout)
        fan_in = in_channels // groups * self.kernel_size[0] * self.kernel_size[1]
        bound = 1.0 / math.sqrt(fan_in)
        self.weight = Parameter(_uniform(bound, (out_channels, in_channels // groups, *self.kernel_size)))
        self.bias = Parameter(_uniform(bound, (out_channels,))) if bias else None

    def _op_padding(self):
        """The op's padding: (h, w), or (top, bottom, left, right) for "same"."""
        if self.padding == "valid":
            return 0
        if self.padding == "same":
            pads = []
            for kernel, dilation in zip(self.kernel_size, self.dilation):
                total = dilation * (kernel - 1)
                pads += [total // 2, total - total // 2]
            return tuple(pads)
        return self.padding

    def forward(self, g, x):
        channels = x.type.shape[1 if self.layout == "NCHW" else -1] if x.type.rank == 4 else None
        if channels != self.in_channels:
            raise ValueError(f"Conv2d input: expected a 4-d {self.layout} array with {self.in_channels} channels, "
                             f"got {x.type}")
        weight = self.weight.value(g)
        if self.layout == "NHWC":
            weight = g.transpose(weight, perm=(0, 2, 3, 1))
        bias = None if self.bias is None else self.bias.value(g)
        return g.conv2d(x, weight, bias, stride=self.stride, padding=self._op_padding(), dilation=self.dilation,
                        groups=self.groups, layout=self.layout)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"bias={self.bias is not None}, layout={self.layout!r}")


class BatchNorm2d(Module):
    """Batch normalization over N, H, W per channel, on the ``batch_norm`` op, as ``torch.nn.BatchNorm2d``:
    ``weight`` ones, ``bias`` zeros (``affine=False``: fixed ones and zeros), buffers ``running_mean`` zeros and
    ``running_var`` ones, kept in float32 whatever the input's dtype.

    Training mode normalizes with the batch statistics and declares the updated running statistics (momentum
    ``momentum``, unbiased variance, as PyTorch) as graph outputs ``BUFFER_UPDATE_PREFIX + "<path>.running_mean"``
    / ``...running_var``, which ``ge2.train.Trainer`` copies into its running buffers after every step. Eval mode
    normalizes with the running statistics. PyTorch's ``num_batches_tracked`` (used only for ``momentum=None``,
    which this layer does not offer) is skipped by ``load_state_dict``."""

    ignored_state_keys = ("num_batches_tracked",)
    float32_parameters = True

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True,
                 layout: str = "NCHW"):
        super().__init__()
        _check_positive(num_features=num_features)
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps <= 0:
            raise ValueError(f"eps: expected a float > 0, got {eps!r}")
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum: expected a float in [0, 1] (None, PyTorch's cumulative average, is not "
                             f"offered), got {momentum!r}")
        self.num_features, self.eps, self.momentum, self.affine = num_features, float(eps), float(momentum), affine
        self.layout = _check_layout(layout)
        if affine:
            self.weight = Parameter(np.ones(num_features, np.float32))
            self.bias = Parameter(np.zeros(num_features, np.float32))
        self.running_mean = Buffer(np.zeros(num_features, np.float32))
        self.running_var = Buffer(np.ones(num_features, np.float32))

    def forward(self, g, x):
        channels = x.type.shape[1 if self.layout == "NCHW" else -1] if x.type.rank == 4 else None
        if channels != self.num_features:
            raise ValueError(f"BatchNorm2d input: expected a 4-d {self.layout} array with {self.num_features} "
                             f"channels, got {x.type}")
        if self.affine:
            weight, bias = self.weight.value(g), self.bias.value(g)
        else:
            weight = g.param(g.unique_name("batch_norm_ones"), np.ones(self.num_features, np.float32))
            bias = g.param(g.unique_name("batch_norm_zeros"), np.zeros(self.num_features, np.float32))
        y, _, _, running_mean, running_var = g.batch_norm(
            x, weight, bias, self.running_mean.value(g), self.running_var.value(g), training=self.training,
            momentum=self.momentum, eps=self.eps, layout=self.layout)
        if self.training:
            g.output(running_mean, BUFFER_UPDATE_PREFIX + self.running_mean.name)
            g.output(running_var, BUFFER_UPDATE_PREFIX + self.running_var.name)
        return y

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"layout={self.layout!r}")


class MaxPool2d(Module):
    """Max pooling on the ``max_pool2d`` op, as ``torch.nn.MaxPool2d`` (stride defaults to the kernel size)."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False,
                 layout: str = "NCHW"):
        super().__init__()
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride")
        self.padding, self.dilation = _pair(padding, "padding"), _pair(dilation, "dilation")
        self.ceil_mode, self.layout = bool(ceil_mode), _check_layout(layout)

    def forward(self, g, x):
        y, _ = g.max_pool2d(x, kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                            dilation=self.dilation, ceil_mode=self.ceil_mode, layout=self.layout)
        return y

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """Average pooling on the ``avg_pool2d`` op, as ``torch.nn.AvgPool2d`` (stride defaults to the kernel size)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 layout: str = "NCHW"):
        super().__init__()
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = self.kernel_size if stride is None else _pair(stride, "stride")
        self.padding = _pair(padding, "padding")
        self.ceil_mode, self.count_include_pad = bool(ceil_mode), bool(count_include_pad)
        self.layout = _check_layout(layout)

    def forward(self, g, x):
        return g.avg_pool2d(x, kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                            ceil_mode=self.ceil_mode, count_include_pad=self.count_include_pad, layout=self.layout)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"ceil_mode={self.ceil_mode}, count_include_pad={self.count_include_pad}")


class AdaptiveAvgPool2d(Module):
    """``torch.nn.AdaptiveAvgPool2d`` for output sizes whose windows do not overlap: 1 (or (1, 1)) is the
    ``global_avg_pool`` op; an output size that divides H and W is ``avg_pool2d`` with kernel = stride = H/oh x W/ow
    (what PyTorch computes then). Other sizes (overlapping windows of varying size) raise ValueError."""

    def __init__(self, output_size, layout: str = "NCHW"):
        super().__init__()
        self.output_size = _pair(output_size, "output_size")
        _check_positive(output_size=min(self.output_size))
        self.layout = _check_layout(layout)

    def forward(self, g, x):
        if x.type.rank != 4:
            raise ValueError(f"AdaptiveAvgPool2d input: expected a 4-d {self.layout} array, got {x.type}")
        if self.output_size == (1, 1):
            return g.global_avg_pool(x, layout=self.layout)
        height, width = x.type.shape[2:] if self.layout == "NCHW" else x.type.shape[1:3]
        if height % self.output_size[0] or width % self.output_size[1]:
            raise ValueError(f"output_size: {self.output_size} must divide the input's H x W ({height} x {width}); "
                             "windows of varying size are not supported")
        window = (height // self.output_size[0], width // self.output_size[1])
        return g.avg_pool2d(x, kernel_size=window, stride=window, layout=self.layout)

    def extra_repr(self):
        return f"output_size={self.output_size}"


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


__all__ = ["manual_seed", "Parameter", "Buffer", "BUFFER_UPDATE_PREFIX", "Module", "Linear", "LayerNorm", "RMSNorm",
           "Embedding", "Dropout", "ReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Flatten",
           "MultiheadAttention", "Sequential", "Conv2d", "BatchNorm2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"]
