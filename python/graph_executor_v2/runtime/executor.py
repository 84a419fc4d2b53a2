"""ExecutorV2: compile a graph (passes -> a kernel per node -> buffers in one arena), then run it.

Compiling verifies the graph and runs the passes once. A plan is built per input signature (the concrete shapes
and dtypes of the inputs; symbolic dims bind at run time) and cached: the graph with its dims bound, a kernel
chosen for every node by the registry, a memory plan, the arena allocated once, and the launch list with every
address resolved. Parameters are uploaded once per executor. Running a plan copies the inputs into the arena,
makes one call per node, and copies the outputs out: no allocation on the device in the steady state.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .. import device as _device
from ..dtypes import itemsize
from ..ir.graph import Graph
from ..ir.types import TensorType
from ..ir.verify import verify as verify_graph
from ..ops._base import Problem
from ..passes import Pass, PassManager, PassRecord, infer_shapes, resolve
from .autotune import AutotuneCache
from .backends import backend_for
from .planner import Buffer, MemoryPlan, plan_memory
from .registry import Capabilities, Preferences, Selection, choose_kernel, kernel_label

Signature = tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) of each graph input, in order


@dataclass
class Plan:
    signature: Signature
    graph: Graph  # the optimized graph with every dim bound
    selections: list[Selection]
    memory: MemoryPlan
    arena: object  # kept alive: every slot and address points into it
    slots: dict[str, object]  # value name -> slot (arena buffers and parameters)
    steps: list[tuple]  # (launch, input addresses, output addresses), one per node


class ExecutorV2:
    """Compiles ``graph`` for ``device`` ("cpu": NumPy references; "cuda": the native kernels) and runs it.

    ``passes``: pass names or ``Pass`` objects (None: ``passes.DEFAULT_PIPELINE``; ``[]``: none).
    ``autotune``: time the viable GPU kernels once per problem and keep the winners in the autotune cache.
    ``kernels``: op -> kernel tried first. ``reuse_memory=False`` gives every buffer its own bytes.
    ``verify``: run the verifier after every pass (the input graph is always verified).
    ``params``: parameter name -> buffer the caller owns (a NumPy array on "cpu", a DeviceArray on "cuda"), used in
    place of an uploaded copy: a trainer updates them in place and plans read the current values.
    """

    def __init__(self, graph: Graph, device: str = "cpu", passes: Sequence[str | Pass] | None = None,
                 autotune: bool = False, kernels: dict[str, str] | None = None, reuse_memory: bool = True,
                 verify: bool = False, params: dict | None = None):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
        verify_graph(graph)  # a bad graph fails here, naming the node, before any pass runs
        self.device = device
        self.source_graph = graph
        self.optimized_graph, self.pass_records = PassManager(resolve(passes), verify_each=verify).run(graph)
        self.reuse_memory = reuse_memory
        self.capabilities = Capabilities.detect(device)
        self.preferences = Preferences.from_env(kernels, autotune)
        self._autotune_cache = AutotuneCache() if autotune and device == "cuda" else None
        self._backend = backend_for(device)
        params = params or {}
        self._param_slots = {name: params[name] if name in params else self._backend.upload(value.data)
                             for name, value in self.optimized_graph.params.items()}
        self._plans: dict[Signature, Plan] = {}
        if all(value.type.is_concrete for value in self.optimized_graph.inputs):
            self._plan_for(tuple((v.type.shape, v.type.dtype) for v in self.optimized_graph.inputs))

    # --- running --------------------------------------------------------------------------------------------------
    def run(self, feeds: dict, stream=None, out: dict | None = None) -> dict:
        """Runs the graph on ``feeds`` (input name -> array) and returns output name -> array.

        NumPy inputs give NumPy outputs. On CUDA, device inputs (GE2 DeviceArray, torch, CuPy) give new device
        arrays of the same kind as the first of them; ``out`` (output name -> array) names arrays to write instead,
        so a steady-state loop allocates nothing. ``stream`` orders the work (default: the legacy stream)."""
        plan = self._plan_for(self._signature_of(feeds))
        out = out or {}
        unknown = sorted(set(out) - set(plan.graph.outputs))
        if unknown:
            raise ValueError(f"out: unknown output(s) {unknown}; the graph's outputs are {list(plan.graph.outputs)}")
        for name, array in out.items():
            _check_array(array, f"out['{name}']", plan.graph.outputs[name].type)
        backend = self._backend
        handle = backend.default_stream() if stream is None else _device.stream_handle(stream)
        for value in plan.graph.inputs:
            backend.feed(plan.slots[value.name], feeds[value.name], value.name, handle)
        for launch, ins, outs in plan.steps:
            launch(ins, outs, handle)
        device_like = next((f for f in feeds.values() if not isinstance(f, np.ndarray)), None)
        return {name: backend.fetch(plan.slots[value.name], value.type, handle, device_like, out.get(name),
                                    f"out['{name}']")
                for name, value in plan.graph.outputs.items()}

    def _signature_of(self, feeds: dict) -> Signature:
        """Checks the feeds against the declared inputs; symbolic dims must bind consistently across inputs."""
        declared = self.optimized_graph.inputs
        names = [v.name for v in declared]
        missing = [name for name in names if name not in feeds]
        if missing:
            raise ValueError(f"missing input(s) {missing}; graph '{self.source_graph.name}' takes {names}")
        unknown = sorted(set(feeds) - set(names))
        if unknown:
            raise ValueError(f"unknown input(s) {unknown}; graph '{self.source_graph.name}' takes {names}")
        dims: dict[str, int] = {}
        signature = []
        for value in declared:
            shape, dtype = _shape_and_dtype(feeds[value.name], f"input '{value.name}'")
            expected = value.type
            if dtype != expected.dtype:
                raise TypeError(f"input '{value.name}': expected dtype {expected.dtype}, got {dtype}")
            if not _bind(expected.shape, shape, dims):
                described = ", ".join(f"{d}={dims[d]}" if isinstance(d, str) and d in dims else str(d)
                                      for d in expected.shape)
                raise ValueError(f"input '{value.name}': expected shape ({described}), got {shape}")
            signature.append((shape, dtype))
        return tuple(signature)

    def plan_for(self, feeds: dict) -> Plan:
        """The plan (built on first use) for the signature of ``feeds``, which are checked but not copied."""
        return self._plan_for(self._signature_of(feeds))

    # --- compiling ------------------------------------------------------------------------------------------------
    def _plan_for(self, signature: Signature) -> Plan:
        plan = self._plans.get(signature)
        if plan is None:
            plan = self._plans[signature] = self._build_plan(signature)
        return plan

    def _build_plan(self, signature: Signature) -> Plan:
        graph = self.optimized_graph.clone()
        for value, (shape, dtype) in zip(graph.inputs, signature):
            value.type = TensorType(shape, dtype)
        infer_shapes(graph)

        step_count = len(graph.nodes)
        first = {value.name: -1 for value in graph.inputs}
        last = dict.fromkeys(first, -1)
        for index, node in enumerate(graph.nodes):
            for value in node.inputs:
                if value is not None and not value.is_param:
                    last[value.name] = index
            for value in node.outputs:
                first[value.name] = last[value.name] = index
        for value in graph.outputs.values():
            if not value.is_param:
                last[value.name] = step_count
        types = {v.name: v.type for v in graph.inputs}
        types.update((v.name, v.type) for node in graph.nodes for v in node.outputs)
        memory = plan_memory([Buffer(name, types[name].numel * itemsize(types[name].dtype), first[name], last[name])
                              for name in first], self.reuse_memory)

        backend = self._backend
        arena = backend.allocate(memory.arena_bytes)
        slots = dict(self._param_slots)
        slots.update((name, backend.slot(arena, offset, types[name])) for name, offset in memory.offsets.items())
        addresses = {name: backend.address(slot) for name, slot in slots.items()}
        absent = backend.address_of_absent

        selections, steps = [], []
        for node in graph.nodes:
            ins = tuple(absent if v is None else addresses[v.name] for v in node.inputs)
            outs = tuple(addresses[v.name] for v in node.outputs)
            problem = Problem(node.op, tuple(None if v is None else v.type for v in node.inputs),
                              tuple(v.type for v in node.outputs), node.attrs,
                              self.capabilities.compute_capability)
            timer = None
            if self._autotune_cache is not None:
                def timer(launch, ins=ins, outs=outs):
                    stream = backend.default_stream()
                    return backend.time_ms(lambda: launch(ins, outs, stream), stream)
            selection = choose_kernel(node, problem, self.capabilities, self.preferences, timer, self._autotune_cache)
            selections.append(selection)
            steps.append((selection.launch, ins, outs))
        return Plan(signature, graph, selections, memory, arena, slots, steps)

    # --- reporting ------------------------------------------------------------------------------------------------
    @property
    def plans(self) -> list[Plan]:
        """The plans built so far, one per input signature."""
        return list(self._plans.values())

    @property
    def fallbacks(self) -> list[Selection]:
        """Every node, in every plan, that did not get its first-ranked kernel or runs through the host."""
        return [s for plan in self._plans.values() for s in plan.selections if s.is_fallback]

    def explain(self) -> str:
        caps = self.capabilities
        target = "cpu (NumPy references)" if caps.device == "cpu" else (
            f"cuda ({caps.gpu_name}, sm_{caps.compute_capability[0]}{caps.compute_capability[1]})")
        lines = [f"ExecutorV2 '{self.source_graph.name}' on {target}", "passes:"]
        lines += [_describe_pass(record) for record in self.pass_records] or ["  (none)"]
        fusions = [str(n) for r in self.pass_records for n in r.notes if getattr(n, "is_fusion", False)]
        lines.append(f"fusions: {len(fusions)}")
        lines += [f"  {fusion}" for fusion in fusions]
        lines.append("ops: " + _format_counts(self.source_graph.op_counts()) + " -> "
                     + _format_counts(self.optimized_graph.op_counts()))
        if not self._plans:
            lines.append("plans: none yet (symbolic input dims bind at the first run)")
        for plan in self._plans.values():
            inputs = ", ".join(f"{v.name}: {v.type}" for v in plan.graph.inputs)
            lines.append(f"plan for ({inputs}): {len(plan.steps)} kernels, {plan.memory.summary()}")
            width = max((len(s.node) for s in plan.selections), default=0)
            for selection in plan.selections:
                label = functools.partial(kernel_label, selection.op)
                lines.append(f"  {selection.node:<{width}}  {selection.op:<10} -> {label(selection.kernel)}: "
                             f"{selection.reason}")
                lines += [f"      fallback: {label(name)} failed to prepare: {why}"
                          for name, why in selection.fallbacks]
                lines += [f"      not viable: {label(name)}: {why}" for name, why in selection.rejected]
        fallbacks = self.fallbacks
        lines.append(f"fallbacks: {len(fallbacks)}")
        lines += [f"  {s.node} ({s.op}) runs {kernel_label(s.op, s.kernel)}" for s in fallbacks]
        return "\n".join(lines)


def _describe_pass(record: PassRecord) -> str:
    if not record.changed:
        return f"  {record.name}: no change"
    counts = ""
    if record.ops_before != record.ops_after:
        counts = f" ({_format_counts(record.ops_before)} -> {_format_counts(record.ops_after)})"
    return "\n".join([f"  {record.name}: {len(record.notes)} change(s){counts}"]
                     + [f"    {note}" for note in record.notes])


def _format_counts(counts: dict) -> str:
    return "{" + ", ".join(f"{op}: {n}" for op, n in sorted(counts.items())) + "}"


def _bind(expected: tuple, actual: tuple, dims: dict[str, int]) -> bool:
    """Whether ``actual`` fits ``expected``; on success the symbolic dims it binds are added to ``dims``."""
    if len(actual) != len(expected):
        return False
    bound = dict(dims)
    for want, got in zip(expected, actual):
        if (bound.setdefault(want, got) if isinstance(want, str) else want) != got:
            return False
    dims.update(bound)
    return True


def _shape_and_dtype(value, argument: str) -> tuple[tuple[int, ...], str]:
    if isinstance(value, np.ndarray):
        return tuple(value.shape), value.dtype.name
    view = _device.view_of(value, argument)
    return tuple(view.shape), view.dtype


def _check_array(value, argument: str, expected: TensorType) -> None:
    shape, dtype = _shape_and_dtype(value, argument)
    if dtype != expected.dtype:
        raise TypeError(f"{argument}: expected dtype {expected.dtype}, got {dtype}")
    if shape != expected.shape:
        raise ValueError(f"{argument}: expected shape {expected.shape}, got {shape}")
