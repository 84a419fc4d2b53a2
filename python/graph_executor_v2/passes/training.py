"""Passes around autograd: the forward fusion a trainer can differentiate, and the backward fusions.

- ``pad_classes``: a classifier GEMM whose logits only a cross_entropy reads, with a class count that is not a
  multiple of 8 (GPT-2's 50257), computes the classes rounded up to a multiple of 64 instead: zero weight rows (or
  columns) and a -inf bias on the added classes, whose softmax is exactly 0, so the loss and every gradient are
  unchanged (the added classes' gradients are 0 and are cut off again by the pad's backward). Unaligned rows of
  16-bit logits keep cuBLASLt off its Hopper kernels: GPT-2's head ran at 100-150 TFLOP/s, 14.6 of a 31.8 ms step
  on the H200. A label in the added classes (out of range, unchecked in a plan) gives an infinite loss instead of
  NaN.
- ``fuse_relu``: gemm epilogue fusion of residual adds and ReLU only. ReLU's derivative reads its output, so the
  fused gemm keeps everything the backward needs; GELU/SiLU stay separate nodes, whose saved input (the
  pre-activation) the backward reads (fusing them would recompute the pre-activation GEMM in the backward).
- ``chain_activation_backward``: ``act_backward(gemm_backward(...).da, p)`` where the gemm's ``a`` is ``act(p)``
  (or, for ReLU, ``a`` itself) becomes one ``gemm_backward`` with ``a_act``/``a_preact``: the activation's
  derivative applied to dA by the gemm's backward (cuBLASLt DGELU epilogue or its post-kernel) instead of a node.
- ``trim_gemm_backward``: a gemm_backward output nothing reads (dA of the first layer) is not computed.
- ``fuse_loss_gradient``: a scalar cross_entropy and its backward seeded by a constant 1 become one
  ``cross_entropy_with_grad`` (one pass over the logits). Not for a seed that changes (a loss scale). Under mixed
  precision the logits are 16-bit, cast to float32 for the loss (autocast's policy), and their gradient is cast
  back: the fused op then reads the 16-bit logits and writes the 16-bit gradient itself (``float32_loss``: the same
  float32 math and the same roundings, without the two float32 copies of the logits, a GPT's largest tensors).
"""
from __future__ import annotations

import numpy as np

from ..dtypes import to_numpy
from ..ir.graph import Graph
from .fusion import fuse_activation, fuse_residual
from .pattern import Pat, Rule, rewrite

CHAINABLE = ("relu", "gelu", "silu")
PADDED_CLASSES_MULTIPLE = 64
PADDED_CLASSES_MIN = 1024  # below this the added classes would cost a noticeable share of a small GEMM

RELU_RULES: list[Rule] = [
    (Pat("add", (Pat("gemm", name="mm"), Pat(name="residual")), any_order=True), fuse_residual),
    (Pat(("relu",), (Pat("gemm", name="mm"),), name="y"), fuse_activation),
]


def fuse_relu(graph: Graph) -> list:
    return rewrite(graph, RELU_RULES)


def pad_classes(graph: Graph) -> list[str]:
    notes = []
    users = graph.users()
    for node in list(graph.nodes):
        if node.op != "gemm":
            continue
        logits = node.outputs[0]
        classes = logits.type.shape[1]
        readers = users.get(logits, [])
        if (not isinstance(classes, int) or classes % 8 == 0 or classes < PADDED_CLASSES_MIN or not readers
                or graph.is_output(logits)
                or any(reader.op != "cross_entropy" or reader.inputs[0] is not logits for reader in readers)):
            continue
        if node.inputs[3] is not None or node.attrs["act"] != "none":
            continue
        added = -classes % PADDED_CLASSES_MULTIPLE
        with graph.inserting_before(node):
            padded = padded_columns_gemm(graph, node, added, added_bias=-np.inf)
        graph.replace_uses(logits, padded)
        graph.remove_node(node)
        notes.append(f"{node.name}: {classes} classes computed as {classes + added} ({padded.producer.name}; the "
                     f"{added} added have a -inf bias, so cross_entropy ignores them exactly)")
    return notes


def padded_columns_gemm(graph: Graph, node, added: int, added_bias: float):
    """``node`` (a gemm) computing ``added`` more output columns, inserted at the graph's insertion point: zero
    weights for them, and ``added_bias`` as their bias (a bias input is created where the gemm has none and
    ``added_bias`` is not 0)."""
    a, w, bias, _ = node.inputs
    y = node.outputs[0]
    # pads: the begins of every axis, then the ends; the columns are w's rows with trans_b, else its columns
    padded_w = graph.pad(w, pads=(0, 0, added, 0) if node.attrs["trans_b"] else (0, 0, 0, added))
    if bias is not None:
        bias = graph.pad(bias, pads=(0, added), value=added_bias)
    elif added_bias != 0:
        values = np.concatenate([np.zeros(y.type.shape[-1]), np.full(added, added_bias)])
        bias = graph.param(graph.unique_name(f"{node.name}_added_columns_bias"), values.astype(to_numpy(y.type.dtype)))
    return graph.gemm(a, padded_w, bias, None, **node.attrs)


def chain_activation_backward(graph: Graph) -> list[str]:
    notes = []
    for node in list(graph.nodes):
        act = node.op[:-len("_backward")] if node.op.endswith("_backward") else None
        if act not in CHAINABLE or node not in graph.nodes:
            continue
        da, preact = node.inputs
        gemm_bwd = da.producer
        if gemm_bwd is None or gemm_bwd.op != "gemm_backward" or gemm_bwd.outputs[0] is not da:
            continue
        if gemm_bwd.attrs["a_act"] != "none" or graph.is_output(da) or len(graph.users().get(da, [])) != 1:
            continue
        a = gemm_bwd.inputs[1]
        produced_by_act = a.producer is not None and a.producer.op == act and a.producer.inputs[0] is preact
        if not (produced_by_act or (act == "relu" and a is preact)) or preact.type != a.type:
            continue
        with graph.inserting_before(node):
            chained = graph.gemm_backward(*gemm_bwd.inputs[:3], preact, **{**gemm_bwd.attrs, "a_act": act})
        graph.replace_uses(node.outputs[0], chained[0])
        for old, new in zip(gemm_bwd.outputs[1:], chained[1:]):
            graph.replace_uses(old, new)
        graph.remove_node(node)
        graph.remove_node(gemm_bwd)
        notes.append(f"fused {node.name} ({node.op}) into {chained[0].producer.name} (gemm_backward a_act={act})")
    return notes


def fuse_loss_gradient(graph: Graph) -> list[str]:
    notes = []
    for node in list(graph.nodes):
        if node.op != "cross_entropy_backward" or node not in graph.nodes:
            continue
        seed, logits, labels = node.inputs
        if seed.data is None or seed.type.shape != () or float(seed.data) != 1.0:
            continue
        loss_node = next((n for n in graph.nodes if n.op == "cross_entropy" and n.inputs == [logits, labels]
                          and n.attrs == node.attrs), None)
        if loss_node is None or node.attrs["reduction"] == "none":
            continue
        casts_back = _casts_back(graph, logits, node.outputs[0])
        with graph.inserting_before(loss_node):
            if casts_back is None:
                loss, dlogits = graph.cross_entropy_with_grad(logits, labels, **node.attrs)
            else:
                loss, dlogits = graph.cross_entropy_with_grad(logits.producer.inputs[0], labels, **node.attrs,
                                                              float32_loss=True)
        graph.replace_uses(loss_node.outputs[0], loss)
        graph.replace_uses(node.outputs[0], dlogits)
        for cast in casts_back or ():
            graph.replace_uses(cast.outputs[0], dlogits)
            graph.remove_node(cast)
        graph.remove_node(node)
        graph.remove_node(loss_node)
        notes.append(f"fused {loss_node.name} and {node.name} into {loss.producer.name} (cross_entropy_with_grad"
                     + (f" on the {dlogits.type.dtype} logits, float32 loss)" if casts_back else ")"))
    return notes


def _casts_back(graph: Graph, logits, dlogits) -> list | None:
    """The cast nodes taking the float32 gradient ``dlogits`` back to the dtype of the 16-bit logits that ``logits``
    was cast from (mixed precision), when they are its only readers; else None."""
    cast = logits.producer
    if cast is None or cast.op != "cast" or logits.type.dtype != "float32" or graph.is_output(dlogits):
        return None
    low = cast.inputs[0].type.dtype
    readers = graph.users().get(dlogits, [])
    if low not in ("float16", "bfloat16") or not readers:
        return None
    if any(reader.op != "cast" or reader.attrs["dtype"] != low or reader.inputs[0] is not dlogits
           for reader in readers):
        return None
    return readers


def trim_gemm_backward(graph: Graph) -> list[str]:
    users = graph.users()
    notes = []
    for node in graph.nodes:
        if node.op != "gemm_backward":
            continue
        for value, flag in zip(node.outputs, ("with_da", "with_db", "with_dbias")):
            if node.attrs[flag] and not users.get(value) and not graph.is_output(value):
                node.attrs[flag] = False
                notes.append(f"{node.name}: {value.name} is not computed (nothing reads it)")
    return notes


def recompute(graph: Graph, forward: set[str], chosen) -> list[str]:
    """Activation checkpointing: each forward node (its name in ``forward``) whose name, output name or op is in
    ``chosen`` and whose outputs the backward reads is computed again right before its first backward consumer,
    which reads the copy; the original then dies with its last forward use. Run it last: CSE would merge the copy
    back."""
    chosen = set(chosen)
    backward = [n for n in graph.nodes if n.name not in forward]
    in_backward = set(backward)
    copies: dict = {}  # forward value -> its recomputed copy
    notes = []
    for node in [n for n in graph.nodes if n not in in_backward]:
        if not ({node.name, node.op} | {v.name for v in node.outputs}) & chosen:
            continue
        readers = [n for n in backward if any(v in node.outputs for v in n.inputs)]
        if not readers:
            continue
        with graph.inserting_before(readers[0]):
            twin = graph.add_node(node.op, [copies.get(v, v) for v in node.inputs], dict(node.attrs),
                                  name=f"{node.name}.recomputed", device=node.device)
        for value in twin.inputs:  # a copy it reads may sit later (before its own first reader): move it up
            if value is not None and value in copies.values():
                _hoist(graph, value.producer, twin, set(copies.values()))
        for old, new in zip(node.outputs, twin.outputs):
            copies[old] = new
            for reader in readers:
                reader.inputs = [new if v is old else v for v in reader.inputs]
        notes.append(f"{node.name} ({node.op}) recomputed before {readers[0].name}")
    return notes


def _hoist(graph: Graph, node, before, copies: set) -> None:
    """Moves ``node`` (a recomputed copy) and the copies it reads right before ``before`` if it sits after it."""
    if graph.nodes.index(node) < graph.nodes.index(before):
        return
    for value in node.inputs:
        if value is not None and value in copies:
            _hoist(graph, value.producer, before, copies)
    graph.nodes.remove(node)
    graph.nodes.insert(graph.nodes.index(before), node)
