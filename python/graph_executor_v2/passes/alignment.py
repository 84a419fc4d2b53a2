"""Alignment of inference GEMMs: ``pad_gemm_columns``.

A 16-bit gemm whose column count N is not a multiple of 8 has output (and weight) rows that are not 16-byte
aligned, which keeps cuBLASLt off its Hopper tensor-core kernels: GPT-2's LM head (N = 50257) ran at ~100 TFLOP/s
on the H200, 0.09 of the roofline (issue 24's profile; ``passes/training.py``'s ``pad_classes`` fixed the training
side, where a loss reads the logits). Where the weight is a parameter, its columns are padded with zeros to a
multiple of 64 (once: the pad folds as a constant), the gemm computes the aligned product, and a slice keeps the
first N columns: one copy of the output in place of a GEMM several times slower. Below 1024 columns the copy and
the added columns would be a noticeable share of a small GEMM, and the gemm stays as it is.
"""
from __future__ import annotations

from ..ir.graph import Graph
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
