"""Memory planner: every intermediate buffer of a plan gets an offset in one arena.

A buffer is written by one step (graph inputs: before the first step) and read by others (graph outputs: after
the last step). Steps on several streams are only partially ordered, so lifetimes are intervals on a partial
order: two buffers may share bytes only when every use of one happens before the write of the other, where
``before(x, y)`` says whether step x is finished before step y starts (one stream: ``x < y``). Offsets are
assigned greedily, largest buffer first, each at the lowest 256-byte aligned offset free of every buffer already
placed that it may not share with. ``reuse=False`` gives every buffer its own bytes (the switch for debugging
aliasing).

Views are not buffers of their own: ``alias_roots`` gives every output that its op declares a view of an input
(``OpDef.aliases``: reshape) the buffer of that input, so the node moves no byte; the root buffer then lives until
the last use of any of its views.
"""
from __future__ import annotations

import logging
import operator
from dataclasses import dataclass
from typing import Callable

ALIGNMENT = 256  # bytes: what cuBLASLt and vectorized kernels want, and cudaMalloc's own alignment

log = logging.getLogger("graph_executor_v2")


@dataclass(frozen=True)
class Buffer:
    name: str
    nbytes: int
    writer: int  # step that writes it (-1: before the first step)
    readers: tuple[int, ...]  # steps that read it (number of steps: read after the last step)


@dataclass(frozen=True)
class MemoryPlan:
    offsets: dict[str, int]
    arena_bytes: int
    unshared_bytes: int  # what one allocation per buffer would take

    def summary(self) -> str:
        megabytes = lambda n: n / 2**20  # noqa: E731
        return (f"memory reduced from {megabytes(self.unshared_bytes):.3g} MB -> "
                f"{megabytes(self.arena_bytes):.3g} MB ({len(self.offsets)} buffers, one arena)")


def aligned(nbytes: int) -> int:
    return max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)


def may_share(a: Buffer, b: Buffer, before: Callable[[int, int], bool] = operator.lt) -> bool:
    """Whether ``a`` and ``b`` are never live at the same time: all uses of one precede the write of the other."""
    return (all(before(use, b.writer) for use in (a.writer, *a.readers))
            or all(before(use, a.writer) for use in (b.writer, *b.readers)))


def alias_roots(graph) -> dict:
    """Value -> the value whose buffer it shares (its root: never itself a view), for every view a plan may alias.

    Values are written once (SSA), so a view sees exactly the bytes its root's writer left. Not aliased: views of
    parameters (buffers outside the arena, which an optimizer rewrites after the step), and a graph output that
    would be a view of a graph input (the caller rewrites the input slots under outputs it still reads)."""
    outputs = set(graph.outputs.values())
    roots: dict = {}
    for node in graph.nodes:
        found = {}
        for out_index, in_index in node.opdef.aliases:
            source, view = node.inputs[in_index], node.outputs[out_index]
            root = roots.get(source, source)
            if root.is_param or (view in outputs and root.is_input):
                continue
            if view.type.numel != root.type.numel or view.type.dtype != root.type.dtype:
                continue  # not a view after all (a malformed declaration): keep the copy
            found[view] = root
        if len(found) == len(node.outputs):  # all or nothing: a node that runs writes every one of its outputs
            roots.update(found)
    return roots


def plan_memory(buffers: list[Buffer], reuse: bool = True,
                before: Callable[[int, int], bool] = operator.lt) -> MemoryPlan:
    offsets: dict[str, int] = {}
    end = 0
    if not reuse:
        for buffer in buffers:
            offsets[buffer.name], end = end, end + aligned(buffer.nbytes)
    placed: list[tuple[int, int, Buffer]] = []  # (offset, size, buffer), largest first
    for buffer in sorted(buffers, key=lambda b: (-b.nbytes, b.writer, b.name)) if reuse else ():
        size = aligned(buffer.nbytes)
        conflicting = sorted((o, s) for o, s, other in placed if not may_share(buffer, other, before))
        offset = 0
        for other_offset, other_size in conflicting:  # the lowest gap that fits
            if offset + size <= other_offset:
                break
            offset = max(offset, other_offset + other_size)
        placed.append((offset, size, buffer))
        offsets[buffer.name] = offset
        end = max(end, offset + size)
    plan = MemoryPlan({b.name: offsets[b.name] for b in buffers}, end, sum(aligned(b.nbytes) for b in buffers))
    log.debug("%s", plan.summary())
    return plan
