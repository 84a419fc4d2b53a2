"""Which stream runs each step of a plan, and which events order the streams.

Steps come in topological order. A step continues the stream of one of its producers when that producer is the
last step on it (a chain stays on one stream and needs no event); otherwise it takes an unused stream, else the
stream whose last step is the earliest. Every producer on another stream that is not already ordered before the
step (through the steps of its own stream) becomes a wait on that producer's event. All streams fork from the
first one after the inputs are written and join back into it before the outputs are read.

``before(x, y)``: whether step x is finished before step y starts, for the memory planner (-1 is the writing of
the inputs, the number of steps the reading of the outputs).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import Graph


@dataclass(frozen=True)
class Schedule:
    stream_of: tuple[int, ...]  # stream index of each step
    waits: tuple[tuple[int, ...], ...]  # the steps on other streams each step waits for (through their events)
    ancestors: tuple[int, ...]  # bit p of ancestors[s]: step p is finished before step s starts
    stream_count: int  # streams used (at most the number asked for)

    @property
    def signalling(self) -> frozenset[int]:
        """Steps that record an event because a step on another stream waits for them."""
        return frozenset(p for waits in self.waits for p in waits)

    def before(self, x: int, y: int) -> bool:
        steps = len(self.stream_of)
        if x == -1:
            return y != -1
        if y == steps:
            return x != steps
        if x == steps or y == -1:
            return False
        return bool(self.ancestors[y] >> x & 1)


def producers(graph: Graph) -> list[list[int]]:
    """For each step, the steps that write its inputs (graph inputs and parameters are written by none)."""
    writer = {value.name: index for index, node in enumerate(graph.nodes) for value in node.outputs}
    return [sorted({writer[v.name] for v in node.inputs if v is not None and v.name in writer})
            for node in graph.nodes]


def width(graph: Graph) -> int:
    """The most steps at one depth of the graph: how many streams it can keep busy, roughly."""
    depth: list[int] = []
    for preds in producers(graph):
        depth.append(1 + max((depth[p] for p in preds), default=0))
    return max((depth.count(d) for d in set(depth)), default=1)


def schedule(graph: Graph, streams: int) -> Schedule:
    stream_of: list[int] = []
    waits: list[tuple[int, ...]] = []
    ancestors: list[int] = []
    last_on: list[int | None] = [None] * max(1, streams)  # the latest step of each stream
    for step, preds in enumerate(producers(graph)):
        chained = [p for p in preds if last_on[stream_of[p]] == p]
        unused = [s for s, last in enumerate(last_on) if last is None]
        if chained:
            stream = stream_of[chained[0]]
        elif unused:
            stream = unused[0]
        else:
            stream = min(range(len(last_on)), key=lambda s: last_on[s])
        previous = last_on[stream]
        ordered = 0 if previous is None else ancestors[previous] | 1 << previous
        step_waits = tuple(p for p in preds if not ordered >> p & 1)
        for p in step_waits:
            ordered |= ancestors[p] | 1 << p
        stream_of.append(stream)
        waits.append(step_waits)
        ancestors.append(ordered)
        last_on[stream] = step
    return Schedule(tuple(stream_of), tuple(waits), tuple(ancestors), 1 + max(stream_of, default=0))
