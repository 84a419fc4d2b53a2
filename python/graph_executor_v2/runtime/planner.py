"""Memory planner: every intermediate buffer of a plan gets an offset in one arena.

A buffer lives from the step that writes it to the last step that reads it (graph inputs from before the first
step, graph outputs to after the last). Buffers whose lifetimes overlap never share bytes; the others may. Offsets
are assigned greedily, largest buffer first, each at the lowest 256-byte aligned offset free of every overlapping
buffer already placed. ``reuse=False`` gives every buffer its own bytes (the switch for debugging aliasing).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

ALIGNMENT = 256  # bytes: what cuBLASLt and vectorized kernels want, and cudaMalloc's own alignment

log = logging.getLogger("graph_executor_v2")


@dataclass(frozen=True)
class Buffer:
    name: str
    nbytes: int
    first: int  # step that writes it (-1: before the first step)
    last: int  # last step that reads it (number of steps: read after the last step)


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


def plan_memory(buffers: list[Buffer], reuse: bool = True) -> MemoryPlan:
    offsets: dict[str, int] = {}
    end = 0
    if not reuse:
        for buffer in buffers:
            offsets[buffer.name], end = end, end + aligned(buffer.nbytes)
    placed: list[tuple[int, int, Buffer]] = []  # (offset, size, buffer), largest first
    for buffer in sorted(buffers, key=lambda b: (-b.nbytes, b.first, b.name)) if reuse else ():
        size = aligned(buffer.nbytes)
        overlapping = sorted((o, s) for o, s, other in placed
                             if other.first <= buffer.last and buffer.first <= other.last)
        offset = 0
        for other_offset, other_size in overlapping:  # the lowest gap that fits
            if offset + size <= other_offset:
                break
            offset = max(offset, other_offset + other_size)
        placed.append((offset, size, buffer))
        offsets[buffer.name] = offset
        end = max(end, offset + size)
    plan = MemoryPlan({b.name: offsets[b.name] for b in buffers}, end, sum(aligned(b.nbytes) for b in buffers))
    log.debug("%s", plan.summary())
    return plan
