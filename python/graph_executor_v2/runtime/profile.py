"""What a plan spends its time on: per node its kernel, median time, share, achieved rate and roofline fraction.

Nodes are timed one by one on one stream (CUDA events between consecutive nodes on the GPU, the host clock on the
CPU), medians over the runs. Each op counts its own work (``OpDef.flops`` / ``OpDef.bytes_moved``): a node with
FLOPs (gemm, matmul, conv2d, attention and their backwards) is measured in TFLOP/s against the device's peak for
its dtype, every other node in GB/s against the measured copy bandwidth (``roofline.py``: computed from the
device's properties, so any GPU gets one). The whole plan is timed too, node by node on its streams and as a
CUDA-graph replay.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from ..codegen.compiler import STATS, describe_build
from ..ir.schema import OPS
from .roofline import current as current_roofline


@dataclass(frozen=True)
class NodeTime:
    node: str
    op: str
    kernel: str
    fallback: bool
    stream: int
    median_ms: float
    share: float  # of the sum of the node medians
    rate: float  # FLOP/s for nodes that count FLOPs, bytes/s otherwise
    unit: str  # "TFLOP/s" or "GB/s"
    roofline_fraction: float | None


@dataclass(frozen=True)
class OpTime:
    """The nodes of one (op, kernel) pair together: where a plan's time goes, by kind of work."""
    op: str
    kernel: str
    nodes: int
    total_ms: float  # sum of the nodes' medians
    share: float  # of the sum of all node medians
    roofline_fraction: float | None  # time-weighted mean of the nodes' fractions; None when a node has none


@dataclass(frozen=True)
class Profile:
    graph: str
    device: str
    runs: int
    nodes: list[NodeTime]
    node_by_node_ms: float  # the whole plan run node by node on its streams (median)
    cuda_graph_ms: float | None  # the whole plan as one CUDA-graph replay (median); None when not captured
    # generated kernels: (node, kernel, how it was built: cold compile or cache-hit time)
    compiles: tuple[tuple[str, str, str], ...] = ()

    def table(self) -> str:
        header = f"{'node':<24} {'op':<12} {'kernel':<22} {'median ms':>10} {'share':>6} {'rate':>16} {'roofline':>8}"
        lines = [f"profile of '{self.graph}' on {self.device}, {self.runs} runs", header, "-" * len(header)]
        for row in self.nodes:
            scale = 1e12 if row.unit == "TFLOP/s" else 1e9
            kernel = row.kernel + ("*" if row.fallback else "")
            fraction = "-" if row.roofline_fraction is None else f"{row.roofline_fraction:.1%}"
            lines.append(f"{row.node:<24} {row.op:<12} {kernel:<22} {row.median_ms:>10.4f} {row.share:>6.1%} "
                         f"{row.rate / scale:>8.3g} {row.unit:<7} {fraction:>8}")
        lines.append(f"plan: {self.node_by_node_ms:.4f} ms node by node, " + (
            "not captured" if self.cuda_graph_ms is None else f"{self.cuda_graph_ms:.4f} ms as a CUDA graph")
            + "  (* fallback)")
        lines += [f"generated {kernel} ({node}): {built}" for node, kernel, built in self.compiles]
        return "\n".join(lines)

    __str__ = table

    def by_op(self) -> list[OpTime]:
        """The node times summed per (op, kernel), the largest total first."""
        groups: dict[tuple[str, str], list[NodeTime]] = {}
        for row in self.nodes:
            groups.setdefault((row.op, row.kernel), []).append(row)
        total = sum(row.median_ms for row in self.nodes) or 1.0
        summary = []
        for (op, kernel), rows in groups.items():
            group_ms = sum(row.median_ms for row in rows)
            fractions = [row.roofline_fraction for row in rows]
            fraction = (None if group_ms == 0 or any(f is None for f in fractions) else
                        sum(f * row.median_ms for f, row in zip(fractions, rows)) / group_ms)
            summary.append(OpTime(op, kernel, len(rows), group_ms, group_ms / total, fraction))
        return sorted(summary, key=lambda entry: -entry.total_ms)

    def op_table(self) -> str:
        """``by_op()`` as text: per (op, kernel) its node count, total ms, share and roofline fraction."""
        header = f"{'op':<20} {'kernel':<26} {'nodes':>5} {'total ms':>10} {'share':>6} {'roofline':>8}"
        lines = [f"profile of '{self.graph}' on {self.device} by op, {self.runs} runs", header, "-" * len(header)]
        for entry in self.by_op():
            fraction = "-" if entry.roofline_fraction is None else f"{entry.roofline_fraction:.1%}"
            lines.append(f"{entry.op:<20} {entry.kernel:<26} {entry.nodes:>5} {entry.total_ms:>10.4f} "
                         f"{entry.share:>6.1%} {fraction:>8}")
        return "\n".join(lines)

    def export_chrome_trace(self, path) -> None:
        """Writes the node timeline (one complete event per node, laid end to end as they ran when timed one by
        one) as Chrome trace JSON, which chrome://tracing and Perfetto open."""
        events, start_us = [], 0.0
        for row in self.nodes:
            duration_us = row.median_ms * 1e3
            events.append({"name": row.node, "cat": row.op, "ph": "X", "ts": start_us, "dur": duration_us,
                           "pid": self.graph, "tid": f"stream {row.stream}",
                           "args": {"op": row.op, "kernel": row.kernel, "fallback": row.fallback,
                                    f"{row.unit}": row.rate / (1e12 if row.unit == "TFLOP/s" else 1e9),
                                    "roofline_fraction": row.roofline_fraction}})
            start_us += duration_us
        Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, indent=1))


def _work(node) -> tuple[float, str]:
    """(amount, unit) of one node, as its op counts it: FLOPs when it counts any, else bytes moved."""
    opdef = OPS[node.op]
    in_types = [None if v is None else v.type for v in node.inputs]
    out_types = [v.type for v in node.outputs]
    flops = opdef.flop_count(in_types, out_types, node.attrs)
    if flops > 0:
        return flops, "TFLOP/s"
    return opdef.byte_count(in_types, out_types, node.attrs), "GB/s"


def profile_plan(executor, plan, runs: int) -> Profile:
    """Times ``plan`` (already fed) ``runs`` times node by node, then as a whole; see the module docstring."""
    backend = executor._backend
    steps = plan.steps
    per_node = [[] for _ in steps]
    whole = []
    on_gpu = backend.asynchronous
    if on_gpu:
        runtime = backend.runtime
        stream = executor._stream_handles[0]
        marks = [runtime.Event() for _ in range(len(steps) + 1)]
        for _ in range(runs):
            marks[0].record(stream)
            for index, step in enumerate(steps):
                step.launch(step.ins, step.outs, stream)
                marks[index + 1].record(stream)
            marks[-1].synchronize()
            for index in range(len(steps)):
                per_node[index].append(marks[index].elapsed_ms(marks[index + 1]))
        whole_ms = lambda run: _event_ms(runtime, stream, run, runs)  # noqa: E731
        node_by_node = whole_ms(lambda: executor._launch_steps(plan, stream))
        replayed = None if plan.cuda_graph is None else whole_ms(lambda: plan.cuda_graph.replay(stream))
    else:
        for _ in range(runs):
            for index, step in enumerate(steps):
                started = time.perf_counter()
                step.launch(step.ins, step.outs, None)
                per_node[index].append((time.perf_counter() - started) * 1e3)
        for _ in range(runs):
            started = time.perf_counter()
            executor._launch_steps(plan, None)
            whole.append((time.perf_counter() - started) * 1e3)
        node_by_node, replayed = statistics.median(whole), None

    roofline = current_roofline(backend.runtime, executor.capabilities.setup) if on_gpu else None
    medians = [statistics.median(times) for times in per_node]
    total = sum(medians) or 1.0
    rows = []
    for node, selection, step, median_ms in zip(plan.graph.nodes, plan.selections, steps, medians):
        amount, unit = _work(node)
        rate = amount / (median_ms * 1e-3) if median_ms > 0 else 0.0
        fraction = None
        if roofline is not None:
            peak = roofline.peak(unit, node.outputs[0].type.dtype)
            fraction = rate / peak if peak else None
        rows.append(NodeTime(node.name, node.op, selection.kernel, selection.is_fallback, step.stream, median_ms,
                             median_ms / total, rate, unit, fraction))
    device = executor.capabilities.gpu_name or executor.device
    compiles = tuple((selection.node, record.kernel, describe_build(record))
                     for selection in plan.selections if (record := STATS.of_launch(selection.launch)) is not None)
    return Profile(executor.source_graph.name, device, runs, rows, node_by_node, replayed, compiles)


def _event_ms(runtime, stream: int, run, runs: int) -> float:
    """Median milliseconds of ``run()`` on ``stream`` between CUDA events, one pair per run."""
    run()  # warm-up
    pairs = [(runtime.Event(), runtime.Event()) for _ in range(runs)]
    for start, end in pairs:
        start.record(stream)
        run()
        end.record(stream)
    pairs[-1][1].synchronize()
    return statistics.median(start.elapsed_ms(end) for start, end in pairs)
