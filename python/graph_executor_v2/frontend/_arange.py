"""Ranges up to a symbolic dim (ONNX Range, torch.arange), the arange op over an axis of that many elements; a
symbolic dim's size as a number in a tensor, from the same op."""
from __future__ import annotations

import numpy as np

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
    value, axis = _axis_of(g, count, "the length of this range")
    return g.arange(value, axis=axis, start=float(start), delta=float(delta), dtype=dtype)


def symbolic_scalar(g: Graph, dim: str, dtype: str) -> Value:
    """A 0-d tensor holding the size a symbolic dim takes when a plan binds it (a sequence length the legacy
    exporter multiplies a tensor by): for each term of the dim (a name, a floor division), the largest of 1, 2, ...
    over an axis of that many elements, combined as the dim's polynomial; exact in float32 below 2**24."""
    total = None
    for terms, coefficient in dims.monomials(dim):
        monomial = g.param(g.unique_name("dim_coefficient"), np.array(float(coefficient), np.float32))
        for term in terms:
            value, axis = _axis_of(g, term, f"a term of {dim!r} used as a number")
            counted = g.max(g.arange(value, axis=axis, start=1.0, delta=1.0, dtype="float32"), axis=0,
                            keepdims=False)
            monomial = g.mul(monomial, counted)
        total = monomial if total is None else g.add(total, monomial)
    return total if dtype == "float32" else g.cast(total, dtype=dtype)


def _axis_of(g: Graph, extent, what: str) -> tuple[Value, int]:
    """A tensor of the graph with an axis of ``extent`` elements, and that axis."""
    for value in [*g.inputs, *(output for node in g.nodes for output in node.outputs)]:
        if extent in value.type.shape:
            return value, list(value.type.shape).index(extent)
    raise Unsupported(f"no tensor of the graph has an axis of {extent!r} elements, {what}")
