"""A readable text form of a graph: one line per input, parameter, node and output.

    graph mlp(%x: float32[64, 128]) {
      %w1: float32[128, 256] = param
      %gemm_0: float32[64, 256] = gemm(%x, %w1, %b1, _) {act="relu"}
      return logits=%gemm_1
    }

Attributes at their default value are left out; ``_`` marks an absent optional input.
"""
from __future__ import annotations

import json

from .schema import OPS


def format_graph(graph) -> str:
    """The text of a ``Graph`` (this module formats; graph.py owns the type, so it imports nothing of it)."""
    signature = ", ".join(repr(value) for value in graph.inputs)
    lines = [f"graph {graph.name}({signature}) {{"]
    lines += [f"  {value!r} = param" for value in graph.params.values()]
    lines += [f"  {format_node(node)}" for node in graph.nodes]
    outputs = ", ".join(f"{name}=%{value.name}" for name, value in graph.outputs.items())
    lines += [f"  return {outputs}", "}"]
    return "\n".join(lines)


def format_node(node) -> str:
    results = ", ".join(repr(value) for value in node.outputs)
    arguments = ", ".join("_" if value is None else f"%{value.name}" for value in node.inputs)
    defaults = {attr.name: attr.default for attr in OPS[node.op].attrs} if node.op in OPS else {}
    changed = {k: v for k, v in node.attrs.items() if defaults.get(k, object()) != v}
    attrs = " {" + ", ".join(f"{k}={json.dumps(v)}" for k, v in changed.items()) + "}" if changed else ""
    placement = f" on {node.device}" if node.device else ""
    return f"{results} = {node.op}({arguments}){attrs}{placement}"
