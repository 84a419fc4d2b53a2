"""The graph IR: ``Graph`` holds inputs, parameters, nodes in topological order and named outputs.

A ``Value`` is defined exactly once: as a graph input, as a parameter (a constant NumPy array), or as an output of a
``Node``. Nodes are built through methods generated from the op definitions in ``ops.OPS``:
``g.gemm(a, b, bias=None, c=None, act="relu")`` takes the op's inputs positionally (or by name) and its attributes
by keyword, validates the attributes and infers the output types on the spot, so a bad graph fails where it is
built, with the node's name in the message. A single-output op returns its ``Value``, a multi-output op a tuple.

Passes edit a graph in place through a few primitives (``users``, ``replace_uses``, ``remove_node``,
``inserting_before``); ``clone`` gives them a copy to own. Parameter arrays are read-only and shared by clones.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Iterator, Sequence

import numpy as np

from .._suggest import did_you_mean
from ..dtypes import normalize
from .printer import format_graph
from .schema import OPS, REQUIRED, VARIADIC_OUTPUTS, OpDef
from .serialize import fill_graph, graph_to_json, read_document
from .types import TensorType


class Value:
    """A tensor of the graph: ``name``, ``type``, and where it comes from (input, parameter or node output)."""

    __slots__ = ("name", "type", "producer", "data")

    def __init__(self, name: str, type: TensorType, producer: "Node | None" = None, data: np.ndarray | None = None):
        self.name = name
        self.type = type
        self.producer = producer  # the node that computes it; None for inputs and parameters
        self.data = data  # the constant array of a parameter; None otherwise

    @property
    def is_param(self) -> bool:
        return self.data is not None

    @property
    def is_input(self) -> bool:
        return self.producer is None and self.data is None

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


class Node:
    """One op application. ``inputs`` holds ``None`` for absent optional inputs; ``attrs`` is always complete."""

    __slots__ = ("name", "op", "inputs", "outputs", "attrs", "device")

    def __init__(self, name: str, op: str, inputs: list[Value | None], attrs: dict, device: str | None = None):
        self.name = name
        self.op = op
        self.inputs = inputs
        self.outputs: list[Value] = []
        self.attrs = attrs
        # Placement annotation (e.g. "cuda:1"); None is the executor's device. Rewrites never fuse across
        # placements; today's single-device executor runs every node on its own device.
        self.device = device

    @property
    def opdef(self) -> OpDef:
        return OPS[self.op]

    def where(self) -> str:
        """How error messages name this node."""
        return f"node '{self.name}' ({self.op})"

    def __repr__(self) -> str:
        return f"<Node {self.name}: {self.op}>"


OPS_LISTING = "sorted(graph_executor_v2.ops.OPS)"


class UnknownOpError(AttributeError, ValueError):
    """``g.<name>`` for a name that is neither a Graph attribute nor a registered op."""


class Graph:
    def __init__(self, name: str = "graph"):
        self.name = name
        self.inputs: list[Value] = []
        self.params: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.outputs: dict[str, Value] = {}  # output name -> value, in declaration order
        self._value_names: set[str] = set()
        self._node_names: set[str] = set()
        self._insert_at: Node | None = None  # new nodes go before this one; None appends
        self._built: list[Node] | None = None  # the nodes built inside the innermost inserting_before block
        self._next_index: dict[str, int] = {}  # op -> next number for generated node names

    # --- sources and sinks ----------------------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence, dtype) -> Value:
        """A graph input; dims are ints or symbolic names (``"batch"``) bound when the graph runs."""
        value = Value(self._claim_value_name(name), TensorType(tuple(shape), normalize(dtype, f"input '{name}'")))
        self.inputs.append(value)
        return value

    def param(self, name: str, array: np.ndarray) -> Value:
        """A constant parameter. The array is copied and frozen, so later edits of the caller's array do not leak."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"param '{name}': expected a NumPy array, got {type(array).__name__}")
        dtype = normalize(array.dtype, f"param '{name}'")
        data = np.array(array, order="C", copy=True)
        data.flags.writeable = False
        value = Value(self._claim_value_name(name), TensorType(data.shape, dtype), data=data)
        self.params[value.name] = value
        return value

    def output(self, value: Value, name: str | None = None) -> Value:
        name = value.name if name is None else name
        self._check_owned(value, f"output '{name}'")
        if name in self.outputs:
            raise ValueError(f"output '{name}' is declared twice")
        self.outputs[name] = value
        return value

    def unique_name(self, base: str) -> str:
        """``base`` if no value has that name yet, else ``base_1``, ``base_2``, ...: a name for a new value."""
        candidate, index = base, 1
        while candidate in self._value_names:
            candidate, index = f"{base}_{index}", index + 1
        return candidate

    # --- nodes ----------------------------------------------------------------------------------------------------
    def add_node(self, op: str, inputs: Sequence[Value | None], attrs: dict | None = None, name: str | None = None,
                 device: str | None = None) -> Node:
        """Builds a node: checks the op, its inputs and attributes, and infers its output types.

        Errors are ValueError/TypeError whose message starts with the node's name."""
        fresh_index = self._fresh_index(op)
        node_name = f"{op}_{fresh_index}" if name is None else name
        where = f"node '{node_name}' ({op})"
        opdef = OPS.get(op)
        if opdef is None:
            raise ValueError(f"{where}: unknown op '{op}'; {did_you_mean(op, OPS, OPS_LISTING)}")
        if node_name in self._node_names:
            raise ValueError(f"{where}: the node name is already used")
        inputs = list(inputs)
        check_arity(opdef, inputs, where)
        for schema_name, value in zip(input_names(opdef, len(inputs)), inputs):
            if value is not None:
                self._check_owned(value, f"{where}: input '{schema_name}'")
        full_attrs = opdef.validate_attrs(dict(attrs or {}), where)
        out_types = infer_types(opdef, [None if v is None else v.type for v in inputs], full_attrs, where)

        value_names = [node_name] if len(out_types) == 1 else [f"{node_name}.{o}" for o in output_names(opdef,
                                                                                                          len(out_types))]
        taken = [n for n in value_names if n in self._value_names]
        if taken:
            raise ValueError(f"{where}: the value name '{taken[0]}' is already used")

        node = Node(node_name, op, inputs, full_attrs, device)
        self._node_names.add(node_name)
        if name is None:
            self._next_index[op] = fresh_index + 1
        for value_name, out_type in zip(value_names, out_types):
            node.outputs.append(Value(self._claim_value_name(value_name), out_type, producer=node))
        if self._insert_at is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(self.nodes.index(self._insert_at), node)
            self._built.append(node)
        return node

    def __getattr__(self, op: str):
        """``g.<op>(*inputs, name=None, **attrs)``: the builder of every registered op, generated from its OpDef."""
        if op.startswith("_") or op not in OPS:
            raise UnknownOpError(f"Graph has no attribute or op '{op}'; {did_you_mean(op, OPS, OPS_LISTING)}")
        return _builder(self, OPS[op])

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(OPS))

    # --- editing primitives for passes ----------------------------------------------------------------------------
    def users(self) -> dict[Value, list[Node]]:
        """Every value's consumer nodes (a node appears once per input slot it uses the value in)."""
        result: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for value in node.inputs:
                if value is not None:
                    result.setdefault(value, []).append(node)
        return result

    def is_output(self, value: Value) -> bool:
        return any(v is value for v in self.outputs.values())

    def replace_uses(self, old: Value, new: Value) -> None:
        """Makes every node input and graph output that reads ``old`` read ``new``."""
        for node in self.nodes:
            node.inputs = [new if v is old else v for v in node.inputs]
        self.outputs = {name: new if v is old else v for name, v in self.outputs.items()}

    def remove_node(self, node: Node) -> None:
        self.nodes.remove(node)
        self._node_names.discard(node.name)
        for value in node.outputs:
            self._value_names.discard(value.name)

    def remove_param(self, value: Value) -> None:
        del self.params[value.name]
        self._value_names.discard(value.name)

    @contextlib.contextmanager
    def inserting_before(self, node: Node) -> Iterator[list[Node]]:
        """Nodes built inside the block go right before ``node``, keeping the order topological; the block gets the
        list of the nodes it built (a pass keeping its own index of users updates it from there)."""
        previous, self._insert_at = self._insert_at, node
        previous_built, self._built = self._built, []
        try:
            yield self._built
        finally:
            if previous_built is not None:
                previous_built.extend(self._built)
            self._insert_at, self._built = previous, previous_built

    def clone(self) -> "Graph":
        """A structural copy with new Values and Nodes (parameter arrays are shared; they are read-only)."""
        copy = Graph(self.name)
        mapping: dict[Value, Value] = {}
        for value in self.inputs:
            mapping[value] = copy.input(value.name, value.type.shape, value.type.dtype)
        for value in self.params.values():
            mapping[value] = Value(copy._claim_value_name(value.name), value.type, data=value.data)
            copy.params[value.name] = mapping[value]
        for node in self.nodes:
            twin = Node(node.name, node.op, [None if v is None else mapping[v] for v in node.inputs],
                        dict(node.attrs), node.device)
            copy._node_names.add(node.name)
            for value in node.outputs:
                mapping[value] = Value(copy._claim_value_name(value.name), value.type, producer=twin)
                twin.outputs.append(mapping[value])
            copy.nodes.append(twin)
        copy.outputs = {name: mapping[v] for name, v in self.outputs.items()}
        copy._next_index = dict(self._next_index)
        return copy

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return counts

    # --- text and JSON (implemented in printer.py and serialize.py) ----------------------------------------------
    def __str__(self) -> str:
        return format_graph(self)

    def to_json(self) -> str:
        return graph_to_json(self)

    @staticmethod
    def from_json(text: str) -> "Graph":
        document = read_document(text)
        graph = Graph(document["name"])
        fill_graph(graph, document)
        return graph

    def save(self, path) -> None:
        with open(path, "w", encoding="utf-8") as file:
            file.write(self.to_json())

    @staticmethod
    def load(path) -> "Graph":
        with open(path, encoding="utf-8") as file:
            return Graph.from_json(file.read())

    # --- internals ------------------------------------------------------------------------------------------------
    def _check_owned(self, value, where: str) -> None:
        if not isinstance(value, Value):
            raise TypeError(f"{where}: expected a Value of graph '{self.name}', got {type(value).__name__}"
                            + ("; wrap constants with g.param(name, array)" if isinstance(value, np.ndarray) else ""))
        defined = (value in self.inputs or self.params.get(value.name) is value
                   or (value.producer is not None and value.producer in self.nodes))
        if not defined:
            raise ValueError(f"{where}: value '{value.name}' does not belong to graph '{self.name}'")

    def _claim_value_name(self, name: str) -> str:
        if not isinstance(name, str) or not name:
            raise TypeError(f"value names must be non-empty strings, got {name!r}")
        if name in self._value_names:
            raise ValueError(f"graph '{self.name}': the value name '{name}' is already used")
        self._value_names.add(name)
        return name

    def _fresh_index(self, op: str) -> int:
        # Numbers only grow (a removed node's name is not handed out again, so pass notes stay unambiguous), and
        # single-output nodes name their value after themselves, so the name must be free in both namespaces.
        index = self._next_index.get(op, 0)
        while f"{op}_{index}" in self._node_names or f"{op}_{index}" in self._value_names:
            index += 1
        return index


# --- schema helpers shared by the builder, the verifier and the inference pass --------------------------------------
def input_names(opdef: OpDef, count: int) -> list[str]:
    """Schema name of each of ``count`` inputs (a variadic input repeats its name with an index)."""
    names = []
    for schema in opdef.inputs:
        if schema.variadic:
            names += [f"{schema.name}[{i}]" for i in range(count - len(names))]
        else:
            names.append(schema.name)
    return names[:count]


def check_arity(opdef: OpDef, inputs: Sequence[Value | None], where: str) -> None:
    fixed = [s for s in opdef.inputs if not s.variadic]
    variadic = any(s.variadic for s in opdef.inputs)
    if len(inputs) < len(fixed) or (not variadic and len(inputs) > len(fixed)):
        expected = ", ".join(s.name + ("?" if s.optional else "") + ("..." if s.variadic else "")
                             for s in opdef.inputs)
        raise TypeError(f"{where}: expected inputs ({expected}), got {len(inputs)}")
    for schema, value in zip(fixed, inputs):
        if value is None and not schema.optional:
            raise ValueError(f"{where}: input '{schema.name}' is required")


def infer_types(opdef: OpDef, in_types: list[TensorType | None], attrs: dict, where: str) -> list[TensorType]:
    try:
        out_types = list(opdef.infer(in_types, attrs))
    except (ValueError, TypeError) as error:
        raise type(error)(f"{where}: {error}") from None
    variadic = opdef.outputs[-1:] == (VARIADIC_OUTPUTS,)
    if len(out_types) != len(opdef.outputs) and not (variadic and len(out_types) >= 1):
        raise ValueError(f"{where}: inference returned {len(out_types)} types for outputs {opdef.outputs}")
    return out_types


def output_names(opdef: OpDef, count: int) -> list[str]:
    """The names of a node's ``count`` outputs: the OpDef's, or ``y0, y1, ...`` for an op whose outputs are
    ``(VARIADIC_OUTPUTS,)`` (a fused node returns as many values as its group stores)."""
    if opdef.outputs[-1:] == (VARIADIC_OUTPUTS,):
        return [f"y{i}" for i in range(count)]
    return list(opdef.outputs)


def _builder(graph: Graph, opdef: OpDef):
    fixed = [s for s in opdef.inputs if not s.variadic]
    variadic = next((s for s in opdef.inputs if s.variadic), None)
    attr_names = [a.name for a in opdef.attrs]

    def build(*args, name: str | None = None, device: str | None = None, **kwargs):
        # Positional arguments are the inputs, then the attributes in OpDef order (as NumPy users write
        # g.transpose(x, (2, 0, 1))). A variadic op's inputs are its leading Values (or one list of them).
        if variadic is not None:
            if len(args) > len(fixed) and isinstance(args[len(fixed)], (list, tuple)):
                args = (*args[:len(fixed)], *args[len(fixed)], *args[len(fixed) + 1:])  # g.concat([a, b], 0)
            count = len(fixed)
            while count < len(args) and isinstance(args[count], Value):
                count += 1
        else:
            count = min(len(args), len(fixed))
        args, positional_attrs = args[:count], args[count:]
        if len(positional_attrs) > len(attr_names):
            inputs_text = ", ".join(s.name + ("..." if s.variadic else "") for s in opdef.inputs)
            raise TypeError(f"g.{opdef.name}(): takes the inputs ({inputs_text}) and at most {len(attr_names)} "
                            f"attribute(s) ({', '.join(attr_names) or 'none'}) by position, got "
                            f"{len(positional_attrs)} more positional argument(s) {positional_attrs!r}")
        for attr_name, value in zip(attr_names, positional_attrs):
            if attr_name in kwargs:
                raise TypeError(f"g.{opdef.name}(): attribute '{attr_name}' is given by position and by keyword")
            kwargs[attr_name] = value
        inputs = list(args) + [None] * (len(fixed) - len(args))  # omitted optional inputs are absent
        for index, schema in enumerate(fixed):
            if schema.name in kwargs:
                if index < len(args):
                    raise TypeError(f"g.{opdef.name}(): input '{schema.name}' is given by position and by keyword")
                inputs[index] = kwargs.pop(schema.name)
        if variadic is not None:
            inputs += list(kwargs.pop(variadic.name, ()))
        node = graph.add_node(opdef.name, inputs, kwargs, name=name, device=device)  # the rest are attributes
        return node.outputs[0] if len(node.outputs) == 1 else tuple(node.outputs)

    build.__name__ = opdef.name
    build.__doc__ = opdef.doc
    build.__signature__ = _signature(opdef)
    return build


def _signature(opdef: OpDef) -> inspect.Signature:
    Parameter = inspect.Parameter
    parameters = []
    for schema in opdef.inputs:
        if schema.variadic:
            parameters.append(Parameter(schema.name, Parameter.VAR_POSITIONAL))
        else:
            default = None if schema.optional else Parameter.empty
            parameters.append(Parameter(schema.name, Parameter.POSITIONAL_OR_KEYWORD, default=default))
    # After a variadic input, attributes can only be keywords in a Python signature; build() reads them by
    # position too (after the inputs).
    kind = Parameter.KEYWORD_ONLY if any(s.variadic for s in opdef.inputs) else Parameter.POSITIONAL_OR_KEYWORD
    for attr in opdef.attrs:
        default = Parameter.empty if attr.default is REQUIRED else attr.default
        parameters.append(Parameter(attr.name, kind, default=default))
    parameters.append(Parameter("name", Parameter.KEYWORD_ONLY, default=None))
    parameters.append(Parameter("device", Parameter.KEYWORD_ONLY, default=None))
    return inspect.Signature(parameters)
