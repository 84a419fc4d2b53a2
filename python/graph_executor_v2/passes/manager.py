"""The pass manager: runs passes over a private copy of a graph, records what each did, verifies on request.

A pass is a name and a function that edits a graph in place and returns one note per change (an empty list:
unchanged). ``GE2_DUMP_IR=1`` prints the graph before and after every pass to stderr.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..ir.graph import Graph
from ..ir.verify import verify


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Graph], list[str]]
    doc: str = ""


@dataclass(frozen=True)
class PassRecord:
    name: str
    notes: tuple[str, ...]
    ops_before: dict
    ops_after: dict
    seconds: float

    @property
    def changed(self) -> bool:
        return bool(self.notes)


class PassManager:
    def __init__(self, passes: Sequence[Pass], verify_each: bool = False):
        self.passes = tuple(passes)
        self.verify_each = verify_each

    def run(self, graph: Graph) -> tuple[Graph, list[PassRecord]]:
        """Returns the transformed copy and one record per pass; ``graph`` itself is left untouched."""
        graph = graph.clone()
        dump = os.environ.get("GE2_DUMP_IR") == "1"
        records = []
        for step in self.passes:
            if dump:
                print(f"// ----- before {step.name} -----\n{graph}", file=sys.stderr)
            ops_before = graph.op_counts()
            start = time.perf_counter()
            notes = step.run(graph)
            seconds = time.perf_counter() - start
            if self.verify_each:
                try:
                    verify(graph)
                except (ValueError, TypeError) as error:
                    raise type(error)(f"after pass '{step.name}': {error}") from error
            if dump:
                print(f"// ----- after {step.name} ({len(notes)} change(s)) -----\n{graph}", file=sys.stderr)
            records.append(PassRecord(step.name, tuple(notes), ops_before, graph.op_counts(), seconds))
        return graph, records
