"""JSON save/load of a graph that round-trips: same inputs, parameters (bit for bit), nodes, attributes, outputs.

Parameters are stored as dtype, shape and base64 of their bytes in the host's (little-endian) order; bfloat16
through ml_dtypes.
Loading rebuilds every node through ``Graph.add_node``, so a file naming an unknown op or attribute, or whose
types do not check, fails with the node's name.
"""
from __future__ import annotations

import base64
import json

import numpy as np

from ..dtypes import to_numpy

FORMAT = "graph_executor_v2.graph"
VERSION = 1


def graph_to_json(graph) -> str:
    document = {
        "format": FORMAT,
        "version": VERSION,
        "name": graph.name,
        "inputs": [{"name": v.name, "shape": list(v.type.shape), "dtype": v.type.dtype} for v in graph.inputs],
        "params": [{"name": v.name, "shape": list(v.type.shape), "dtype": v.type.dtype,
                    "data": base64.b64encode(v.data.tobytes()).decode()}
                   for v in graph.params.values()],
        "nodes": [{"name": n.name, "op": n.op, "inputs": [None if v is None else v.name for v in n.inputs],
                   "attrs": n.attrs, "device": n.device} for n in graph.nodes],
        "outputs": [{"name": name, "value": v.name} for name, v in graph.outputs.items()],
    }
    return json.dumps(document, indent=1)


def read_document(text: str) -> dict:
    """The JSON document of a saved graph, its format and version checked."""
    document = json.loads(text)
    if document.get("format") != FORMAT or document.get("version") != VERSION:
        raise ValueError(f"not a graph_executor_v2 graph of version {VERSION}: format={document.get('format')!r}, "
                         f"version={document.get('version')!r}")
    return document


def fill_graph(graph, document: dict) -> None:
    """Rebuilds the document's inputs, parameters, nodes and outputs in the empty ``graph`` (``Graph.from_json``
    makes it: graph.py owns the type, this module only reads and writes its JSON form)."""
    values = {}
    for entry in document["inputs"]:
        values[entry["name"]] = graph.input(entry["name"], entry["shape"], entry["dtype"])
    for entry in document["params"]:
        data = np.frombuffer(base64.b64decode(entry["data"]), dtype=to_numpy(entry["dtype"]))
        values[entry["name"]] = graph.param(entry["name"], data.reshape(entry["shape"]))
    for entry in document["nodes"]:
        where = f"node '{entry['name']}' ({entry['op']})"
        missing = [name for name in entry["inputs"] if name is not None and name not in values]
        if missing:
            raise ValueError(f"{where}: input '{missing[0]}' is not defined before this node")
        node = graph.add_node(entry["op"], [None if name is None else values[name] for name in entry["inputs"]],
                              entry["attrs"], name=entry["name"], device=entry["device"])
        values.update((value.name, value) for value in node.outputs)
    for entry in document["outputs"]:
        if entry["value"] not in values:
            raise ValueError(f"output '{entry['name']}': value '{entry['value']}' is not defined")
        graph.output(values[entry["value"]], entry["name"])
