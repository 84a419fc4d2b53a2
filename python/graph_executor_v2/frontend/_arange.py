"""Ranges up to a symbolic dim (ONNX Range, torch.arange), the arange op over an axis of that many elements."""
from __future__ import annotations

from ..ir import dims
from ..ir.graph import Graph, Value
from ._errors import Unsupported


def symbolic_range(g: Graph, start, limit, delta, dtype: str) -> Value:
    """``start, start + delta, ...`` below ``limit``, a symbolic dim (ir/dims.py: ``seq``, ``past + seq``): the
    arange op over an axis of a tensor the graph already has with that many elements (an input's sequence axis, a
    concat's seq+1 positions), bound when a plan binds the dims. ``start`` and ``delta`` are integers, delta > 0."""
    if isinstance(start, str) or isinstance(delta, str):
        raise Unsupported(f"a range from {start!r} by {delta!r}: GE2's arange takes a constant start and delta")
    if float(delta) != int(delta) or int(delta) <= 0 or float(start) != int(start):
        raise Unsupported(f"a range from {start} by {delta} up to the symbolic dim {limit!r} (GE2 counts integer "
                          "steps up from an integer start)")
    start, delta = int(start), int(delta)
    count = dims.floor_divide(dims.add(dims.subtract(limit, start), delta - 1), delta)
    if isinstance(count, str) and (dims.lower_bound(count) is None or dims.lower_bound(count) < 0):
        raise Unsupported(f"a range from {start} to {limit!r} may be empty or negative")
    for value in [*g.inputs, *(output for node in g.nodes for output in node.outputs)]:
        if count in value.type.shape:
            return g.arange(value, axis=list(value.type.shape).index(count), start=float(start), delta=float(delta),
                            dtype=dtype)
    raise Unsupported(f"no tensor of the graph has an axis of {count!r} elements, the length of this range")
