"""Reverse-mode autograd over the IR.

``backward_graph(graph, loss, wrt)`` returns one graph holding the forward, the loss and the gradient of the loss
with respect to every value in ``wrt`` (parameters or inputs), as outputs named ``grad/<name>``. The gradients come
from each op's grad rule (``OpDef.grad``, in ``ops/<op>.py``), walked in reverse topological order: the gradient of
a value used several times is the sum of its partial gradients, integer values get none. The loss's own gradient
(the seed) is the 0-d parameter ``SEED`` (1.0), which a trainer may replace by a loss scale.

The result is an ordinary graph: the passes optimize it (``passes.TRAINING_BACKWARD``: CSE, DCE and the backward
fusions: a GEMM's dgrad chained with the previous layer's activation backward, unneeded gradients not computed).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .dtypes import FLOAT_DTYPES, to_numpy
from .ir.graph import Graph, Value

GRAD_PREFIX = "grad/"
SEED = "loss_grad_seed"


def grad_name(name: str) -> str:
    """The output name of the gradient of value ``name``."""
    return GRAD_PREFIX + name


def loss_value(graph: Graph, loss: str | Value) -> Value:
    """The graph output named ``loss`` (or the Value itself), checked to be a float scalar."""
    if isinstance(loss, Value):
        value = loss
    elif loss in graph.outputs:
        value = graph.outputs[loss]
    else:
        raise ValueError(f"loss: expected the name of a graph output, got {loss!r}; the outputs of graph "
                         f"'{graph.name}' are {list(graph.outputs)}")
    if value.type.shape != () or value.type.dtype not in FLOAT_DTYPES:
        raise ValueError(f"loss: expected a scalar (0-d) float output, got '{value.name}': {value.type}; reduce it "
                         "first (for example cross_entropy with reduction='mean', or g.mean)")
    return value


def backward_graph(graph: Graph, loss: str | Value = "loss", wrt: Sequence[str] | None = None) -> Graph:
    """A copy of ``graph`` with the gradients of ``loss`` w.r.t. ``wrt`` (names of parameters or inputs; default
    every float parameter) added as outputs ``grad/<name>``. Raises ValueError naming a bad loss, an unknown name,
    a value the loss does not depend on, or an op with no grad rule."""
    g = graph.clone()
    loss_out = loss_value(g, _output_name(graph, loss))
    targets = _targets(g, wrt)
    needs_grad = _depending_on(g, targets)
    seed_name = SEED
    while seed_name in g.params or any(v.name == seed_name for v in g.inputs):
        seed_name += "_"
    seed = g.param(seed_name, np.ones((), to_numpy(loss_out.type.dtype)))

    partials: dict[Value, list[Value]] = {loss_out: [seed]}
    for node in reversed(list(g.nodes)):  # the forward nodes only: rules append after them
        out_grads = [_accumulate(g, partials.pop(v, [])) for v in node.outputs]
        if all(grad is None for grad in out_grads):
            continue
        if not any(v is not None and v in needs_grad for v in node.inputs):
            continue
        if node.opdef.grad is None:
            raise ValueError(f"{node.where()}: op '{node.op}' has no grad rule, so the loss cannot be differentiated "
                             "through it")
        in_grads = node.opdef.grad(g, node, out_grads)
        if len(in_grads) != len(node.inputs):
            raise ValueError(f"{node.where()}: the grad rule returned {len(in_grads)} gradients for "
                             f"{len(node.inputs)} inputs")
        for value, grad in zip(node.inputs, in_grads):
            if value is None or grad is None or value not in needs_grad:
                continue
            if not _same_type(grad.type, value.type):
                raise ValueError(f"{node.where()}: the grad rule gave {grad.type} for input '{value.name}' of type "
                                 f"{value.type}")
            partials.setdefault(value, []).append(grad)
    for target in targets:
        grad = _accumulate(g, partials.get(target, []))
        if grad is None:
            raise ValueError(f"wrt: '{target.name}' does not influence the loss '{loss_out.name}'")
        g.output(grad, grad_name(target.name))
    return g


def _output_name(graph: Graph, loss) -> str:
    if isinstance(loss, Value):
        names = [name for name, value in graph.outputs.items() if value is loss]
        if not names:
            raise ValueError(f"loss: value '{loss.name}' is not an output of graph '{graph.name}'")
        return names[0]
    if not isinstance(loss, str):
        raise TypeError(f"loss: expected an output name or a Value, got {type(loss).__name__}")
    return loss


def _targets(g: Graph, wrt) -> list[Value]:
    if wrt is None:
        return [v for v in g.params.values() if v.type.dtype in FLOAT_DTYPES]
    if isinstance(wrt, str):
        raise TypeError("wrt: expected a sequence of names, got a single string; wrap it in a list")
    inputs = {v.name: v for v in g.inputs}
    targets = []
    for name in wrt:
        value = g.params.get(name) or inputs.get(name)
        if value is None:
            raise ValueError(f"wrt: unknown parameter or input {name!r}; graph '{g.name}' has parameters "
                             f"{list(g.params)} and inputs {list(inputs)}")
        if value.type.dtype not in FLOAT_DTYPES:
            raise TypeError(f"wrt: '{name}' has dtype {value.type.dtype}; only float values have gradients")
        targets.append(value)
    return targets


def _depending_on(g: Graph, targets: list[Value]) -> set[Value]:
    """The float values that depend on any target (the targets included)."""
    result = set(targets)
    for node in g.nodes:
        if any(v is not None and v in result for v in node.inputs):
            result.update(v for v in node.outputs if v.type.dtype in FLOAT_DTYPES)
    return result


def _accumulate(g: Graph, grads: list[Value]) -> Value | None:
    """The sum of the partial gradients of one value (None when it has none)."""
    if not grads:
        return None
    total = grads[0]
    for grad in grads[1:]:
        total = g.add(total, grad)
    return total


def _same_type(a, b) -> bool:
    """Equal dtypes and ranks, and equal dims wherever both are concrete (a reshape may have bound a symbol)."""
    return a.dtype == b.dtype and a.rank == b.rank and all(
        x == y or not isinstance(x, int) or not isinstance(y, int) for x, y in zip(a.shape, b.shape))
