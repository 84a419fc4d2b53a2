"""The verifier: single definition, topological order, op schema, attributes and types.

Raises ValueError/TypeError whose message names the offending node, value or output. Run on every graph the
executor compiles, and after every pass when the pass manager is asked to verify.
"""
from __future__ import annotations

from .._suggest import did_you_mean
from .schema import OPS
from .graph import OPS_LISTING, Graph, Value, check_arity, infer_types, input_names


def verify(graph: Graph) -> None:
    defined: set[Value] = set()
    value_names: set[str] = set()

    def define(value: Value, where: str) -> None:
        if value in defined:
            raise ValueError(f"{where}: value '{value.name}' is defined twice")
        if value.name in value_names:
            raise ValueError(f"{where}: value name '{value.name}' is used by two values")
        defined.add(value)
        value_names.add(value.name)

    for value in graph.inputs:
        if not value.is_input:
            raise ValueError(f"input '{value.name}': is also a parameter or a node output")
        define(value, f"input '{value.name}'")
    for name, value in graph.params.items():
        where = f"param '{name}'"
        if not value.is_param or value.name != name:
            raise ValueError(f"{where}: expected a parameter named '{name}', got {value!r}")
        if value.data.shape != value.type.shape or str(value.data.dtype) != value.type.dtype:
            raise TypeError(f"{where}: data is {value.data.dtype}{list(value.data.shape)} but the type says "
                            f"{value.type}")
        define(value, where)

    node_names: set[str] = set()
    for node in graph.nodes:
        where = node.where()
        if node.name in node_names:
            raise ValueError(f"{where}: the node name is used twice")
        node_names.add(node.name)
        opdef = OPS.get(node.op)
        if opdef is None:
            raise ValueError(f"{where}: unknown op '{node.op}'; {did_you_mean(node.op, OPS, OPS_LISTING)}")
        check_arity(opdef, node.inputs, where)
        for schema_name, value in zip(input_names(opdef, len(node.inputs)), node.inputs):
            if value is not None and value not in defined:
                raise ValueError(f"{where}: input '{schema_name}' reads '{value.name}', which is not defined before "
                                 "this node")
        if opdef.validate_attrs(node.attrs, where) != node.attrs:
            raise ValueError(f"{where}: attributes {node.attrs} are not the complete, validated set")
        out_types = infer_types(opdef, [None if v is None else v.type for v in node.inputs], node.attrs, where)
        if len(node.outputs) != len(out_types):
            raise ValueError(f"{where}: has {len(node.outputs)} outputs, the op defines {len(out_types)}")
        for value, expected in zip(node.outputs, out_types):
            if value.producer is not node:
                raise ValueError(f"{where}: output '{value.name}' names another producer")
            if value.type != expected:
                error = TypeError if value.type.dtype != expected.dtype else ValueError
                raise error(f"{where}: output '{value.name}' is typed {value.type} but inference gives {expected}")
            define(value, where)

    for name, value in graph.outputs.items():
        if value not in defined:
            raise ValueError(f"output '{name}': value '{value.name}' is not defined in graph '{graph.name}'")
