"""The columns of inference GEMMs: ``pad_gemm_columns`` (alignment) and ``split_gemm_columns`` (a product read
only in column slices is one gemm per slice).

A 16-bit gemm whose column count N is not a multiple of 8 has output (and weight) rows that are not 16-byte
aligned, which keeps cuBLASLt off its Hopper tensor-core kernels: GPT-2's LM head (N = 50257) ran at ~100 TFLOP/s
on the H200, 0.09 of the roofline (issue 24's profile; ``passes/training.py``'s ``pad_classes`` fixed the training
side, where a loss reads the logits). Where the weight is a parameter, its columns are padded with zeros to a
multiple of 64 (once: the pad folds as a constant), the gemm computes the aligned product, and a slice keeps the
first N columns: one copy of the output in place of a GEMM several times slower. Below 1024 columns the copy and
the added columns would be a noticeable share of a small GEMM, and the gemm stays as it is.

A fused QKV projection whose product is read only through column slices (q, k and v: GPT-2's Conv1D split, ViT-B/16's
in_proj once ``propagate_transposes`` has moved its transposes away) copied each slice out of the product: 36 slice
kernels, 0.32 ms of ViT-B/16 and 0.26 ms of GPT-2 124M in float16 on the H200. With a parameter weight, each slice
is the gemm of that slice's columns of the weight (and bias), which writes it contiguous: the same FLOPs, no copies,
and the three gemms are independent (the plan runs them on parallel streams).
"""
from __future__ import annotations

import math

from ..ir.graph import Graph, Node, Value
from ..ops.slice import geometry
from .training import PADDED_CLASSES_MIN, PADDED_CLASSES_MULTIPLE, padded_columns_gemm

ALIGNED_DTYPES = ("float16", "bfloat16")  # 8 elements = 16 bytes; float32 GEMMs were not measured slower unaligned


def pad_gemm_columns(graph: Graph) -> list[str]:
    notes = []
    for node in list(graph.nodes):
        if node.op != "gemm":
            continue
        _, w, _, c = node.inputs
        y = node.outputs[0]
        columns = y.type.shape[-1]
        if (y.type.dtype not in ALIGNED_DTYPES or not isinstance(columns, int) or columns % 8 == 0
                or columns < PADDED_CLASSES_MIN or not w.is_param or c is not None):
            continue
        added = -columns % PADDED_CLASSES_MULTIPLE
        with graph.inserting_before(node):
            padded = padded_columns_gemm(graph, node, added, added_bias=0.0)
            kept = graph.slice(padded, starts=(0,), ends=(columns,), axes=(1,))
        graph.replace_uses(y, kept)
        graph.remove_node(node)
        notes.append(f"{node.name}: {columns} columns computed as {columns + added} ({padded.producer.name}, "
                     f"aligned), the first {columns} kept ({kept.producer.name})")
    return notes


def _column_slice(node: Node, view: Value, rows: int) -> tuple[int, int] | None:
    """(first column, end column) of the gemm's product that ``node`` (a slice of ``view``, the product or a reshape of
    it whose leading dims hold the rows) takes, with every row; None for any other slice."""
    shape = tuple(view.type.shape)
    lead = next((j for j in range(len(shape) + 1) if math.prod(shape[:j]) == rows), None)
    if lead is None or node.op != "slice" or node.inputs[0] is not view:
        return None
    attrs = node.attrs
    sliced = geometry(shape, attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"])
    moved = [axis for axis in range(len(shape)) if sliced.shape[axis] != shape[axis] or sliced.steps[axis] != 1]
    if len(moved) != 1 or moved[0] < lead or sliced.steps[moved[0]] != 1:
        return None
    axis = moved[0]
    if any(shape[k] != 1 for k in range(lead, axis)):
        return None  # a column axis outside the slice's varies faster than rows but slower than the sliced one
    inner = math.prod(shape[axis + 1:])
    start = sliced.starts[axis] * inner
    return start, start + sliced.shape[axis] * inner


def split_gemm_columns(graph: Graph) -> list[str]:
    notes = []
    users = graph.users()
    for node in list(graph.nodes):
        if node.op != "gemm" or node not in graph.nodes:
            continue
        a, w, bias, c = node.inputs
        y = node.outputs[0]
        if not w.is_param or c is not None or graph.is_output(y) or not y.type.is_concrete:
            continue
        rows = y.type.shape[0]
        slices, views = [], []  # (slice node, first column, end column); the reshapes between
        for reader in users.get(y, []):
            if reader.op == "reshape" and not graph.is_output(reader.outputs[0]):
                views.append(reader)
                readers = [(r, reader.outputs[0]) for r in users.get(reader.outputs[0], [])]
            else:
                readers = [(reader, y)]
            slices += [(r, _column_slice(r, view, rows)) for r, view in readers]
        if len(slices) < 2 or any(columns is None for _, columns in slices):
            continue  # read whole somewhere, or once (pad_gemm_columns' own slice)
        axis = 0 if node.attrs["trans_b"] else 1
        for sliced, (start, end) in slices:
            with graph.inserting_before(sliced):
                part_w = graph.slice(w, starts=(start,), ends=(end,), axes=(axis,))
                part_bias = None if bias is None else graph.slice(bias, starts=(start,), ends=(end,), axes=(0,))
                part = graph.gemm(a, part_w, part_bias, None, **node.attrs)
                result = graph.reshape(part, shape=tuple(sliced.outputs[0].type.shape))
            graph.replace_uses(sliced.outputs[0], result)
            graph.remove_node(sliced)
        for view in views:
            graph.remove_node(view)
        graph.remove_node(node)
        users = graph.users()
        notes.append(f"{node.name}: read only in {len(slices)} column slices "
                     f"({', '.join(f'[{start}:{end}]' for _, (start, end) in slices)}): one gemm each")
    return notes
