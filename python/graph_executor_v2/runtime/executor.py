"""ExecutorV2: compile a graph (passes -> a kernel per node -> buffers in one arena), then run it.

Compiling verifies the graph and runs the passes once. A plan is built per input signature (the concrete shapes
and dtypes of the inputs; symbolic dims bind at run time) and cached: the graph with its dims bound, a kernel
chosen for every node by the registry, a memory plan, the arena allocated once, and the launch list with every
address resolved. Parameters are uploaded once per executor. Running a plan copies the inputs into the arena,
makes one call per node, and copies the outputs out: no allocation on the device in the steady state.

On CUDA the steps run on streams the executor owns (``streams=``: independent branches run concurrently, events
order every cross-stream edge), ordered against the caller's stream with events and never a device-wide
synchronisation. With ``cuda_graph=True`` (the default) the first run of a plan warms it up (library handles,
workspaces, algorithm timing) and the plan is then captured once as a CUDA graph (its streams fork from and join
back into the first one, so the graph is self-contained): every later ``run()`` is one launch, on the caller's
stream, of that graph with the copies of the feeds into the plan's static input slots and of the outputs out as
memcpy nodes around it (host arrays go through page-locked staging buffers; ``backends/cuda.py``, ``CopyingGraph``).
``Plan.inputs`` / ``Plan.outputs`` expose those slots, so a loop can write inputs in place and call
``Plan.replay()`` with no copy.
A plan that cannot be captured (a host-fallback node, a kernel that synchronizes) runs node by node, and
``explain()`` names the node and the reason.
"""
from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from .. import device as _device
from ..codegen.compiler import STATS, describe_build
from ..codegen.group import fused_members
from ..dtypes import itemsize
from ..ir import dims
from ..ir.graph import Graph
from ..ir.schema import Problem
from ..ir.types import TensorType
from ..ir.verify import verify as verify_graph
from ..ops import scaled_conv2d
from ..ops.fused import FUSED_OPS
from ..passes import Pass, PassManager, PassRecord, eliminate_dead_code, fp8, infer_shapes, plan_layouts, resolve
from ..passes.precision import apply_precision, check_precision
from ..passes.precision import describe as describe_precision
from .autotune import AutotuneCache
from .backends import backend_for
from .backends.cuda import HOST_FALLBACK
from .layout_timing import conv_layout_timer
from .planner import Buffer, MemoryPlan, alias_roots, plan_memory
from .profile import Profile, profile_plan
from .roofline import current as current_roofline
from .registry import Capabilities, Preferences, Selection, choose_kernel, kernel_label, problem_key
from .schedule import Schedule, schedule, width

ALIAS = "alias"  # the "kernel" of a node whose outputs share its input's buffer: nothing runs
# Seconds of candidate timing (the racing candidates' prepares and timed runs) one plan may spend; the nodes after it
# take the priority order unless the autotune cache knows their problem (a large graph's first build stays bounded;
# the next one is cached). Ranking is not counted: every node ranks its candidates, timed or not, and cudnn_graph's
# capability checks build cuDNN's plans there (a cold process compiles cuDNN's runtime-fusion kernels: ~2 s for each
# of ResNet-50's first conv problems on the H200, which used the whole budget on 10 problems and left 38 untimed).
TUNING_BUDGET_S = 20.0
MAX_DEFAULT_STREAMS = 4  # enough for the branches of the graphs we see (q/k/v, wide MLP heads); each costs a workspace

Signature = tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) of each graph input, in order


@dataclass(frozen=True)
class Step:
    """One node of a plan with everything resolved: its launch, addresses, stream and events."""

    launch: Callable
    ins: tuple
    outs: tuple
    stream: int  # index into the executor's streams
    waits: tuple[int, ...]  # steps (on other streams) whose events this step waits for
    signals: bool  # records its event after the launch (a step on another stream waits for it)
    label: str  # "<op> <node> <kernel>[ fallback]": the NVTX range and the profile row


@dataclass
class Plan:
    """One input signature of an executor, compiled: graph, kernels, memory, schedule and (on CUDA) its CUDA graph.

    ``inputs`` / ``outputs``: value name -> the plan's static slot (a DeviceArray on CUDA, a NumPy view on the
    CPU). Writing ``inputs`` in place and calling ``replay()`` runs the plan with no copy; ``outputs`` then hold
    the results until the next run of this plan."""

    signature: Signature
    graph: Graph  # the optimized graph with every dim bound
    selections: list[Selection]
    memory: MemoryPlan
    schedule: Schedule
    arena: object  # kept alive: every slot and address points into it
    slots: dict[str, object]  # value name -> slot (arena buffers and parameters)
    steps: list[Step]
    inputs: dict[str, object]
    outputs: dict[str, object]
    executor: "ExecutorV2" = field(repr=False)
    capture: str = "not captured yet (the first run warms the plan up)"  # the CUDA graph's state, or why not
    cuda_graph: object | None = field(default=None, repr=False)  # the captured graph, once there is one
    events: list = field(default_factory=list, repr=False)  # per step (CUDA, signalling steps only), then fork/join
    warmed_up: bool = False
    # (host feed?, per input; host result?, per output) -> the CopyingGraph that runs it in one launch (CUDA), or
    # why that kind of run copies outside the graph
    copying_graphs: dict = field(default_factory=dict, repr=False)
    build_seconds: float = 0.0  # building the plan, kernel timing included
    compile_seconds: float = 0.0  # of which compiling generated kernels ahead, in parallel (NVRTC)
    choose_seconds: float = 0.0  # of which choosing every node's kernel: ranking, prepares and timing
    tuning_seconds: float = 0.0  # of that, timing candidates (prepares and timed runs) of problems not cached yet
    capture_seconds: float = 0.0  # capturing and instantiating the CUDA graph (after the first run's warm-up)
    untimed: int = 0  # nodes left to priority order because the plan's tuning budget was spent
    # launch(stream) calls run after every node, on the first stream, and captured with the plan: a trainer's
    # optimizer (set before the plan's first run, which captures it).
    epilogue: list = field(default_factory=list, repr=False)
    # step index -> launch(stream) calls run right after that step, on its stream, and captured with the plan: a
    # data-parallel trainer starts a gradient bucket's all-reduce once the last node writing or reading it has run.
    after_step: dict = field(default_factory=dict, repr=False)

    def replay(self, stream=None) -> None:
        """Runs the plan on what its ``inputs`` slots hold now, with no copy in or out; the results are in
        ``outputs``. ``stream`` (None: the legacy default stream) is the caller's: the run waits for the work
        already enqueued on it, and work enqueued on it afterwards sees the results."""
        executor = self.executor
        executor._execute(self, executor._backend.caller_stream(stream))

    def run(self, feeds: dict, views: dict, stream=None):
        """Feed, then execute: the path of ``Trainer.step``, the data-parallel step and uncaptured runs.
        Copies every input of ``feeds`` (input name -> array; ``views``: their views from ``plan_for``) into its
        slot on the caller's ``stream``, then runs the plan as ``replay`` does; returns the caller stream's handle,
        on which the backend's ``fetch`` reads results. (``ExecutorV2.run`` of a captured plan puts these copies in
        the graph instead: ``_run_in_one_launch``.)"""
        caller = self._feed(feeds, views, stream)
        self.executor._execute(self, caller)
        return caller

    def run_uncaptured(self, feeds: dict, views: dict, stream=None):
        """``run`` node by node (epilogue included), leaving the plan's warm-up and CUDA graph as they were: a run
        before the plan's first real one (a trainer's FP8 scaling calibration, before it attaches its optimizer).
        Returns the caller stream's handle."""
        caller = self._feed(feeds, views, stream)
        self.executor._launch_steps(self, caller)
        return caller

    def _feed(self, feeds: dict, views: dict, stream):
        """Copies every input of ``feeds`` into its slot on the caller's ``stream``; returns that stream's handle."""
        backend = self.executor._backend
        caller = backend.caller_stream(stream)
        for value in self.graph.inputs:
            name = value.name
            backend.feed(self.slots[name], feeds[name], name, caller, views[name])
        return caller

    @property
    def timed_problems(self) -> int:
        """Nodes whose candidates this plan timed (one per distinct problem: later nodes read the cache)."""
        return sum(s.reason.startswith("autotuned") for s in self.selections)

    @property
    def cached_choices(self) -> int:
        """Nodes whose kernel the autotune cache answered (timed by an earlier node, plan or process)."""
        return sum(s.reason.startswith("autotune cache") for s in self.selections)

    def __repr__(self) -> str:
        """One line: the graph and signature, kernels, memory and (CUDA) the CUDA graph; ``describe()`` has all."""
        inputs = ", ".join(f"{v.name}: {v.type}" for v in self.graph.inputs)
        kernels = sum(s.kernel != ALIAS for s in self.selections)
        capture = f", cuda graph: {self.capture}" if self.executor.device == "cuda" else ""
        return (f"<Plan of '{self.graph.name}' for ({inputs}): {kernels} kernel(s), {self.memory.summary()}{capture}; "
                "describe() lists every node and buffer>")

    def describe(self) -> str:
        """The whole plan: every node with its kernel and stream, and the arena byte by byte (value, offset, size);
        parameters live outside it."""
        types = {v.name: v.type for v in self.graph.inputs}
        types.update((v.name, v.type) for node in self.graph.nodes for v in node.outputs)
        lines = [repr(self), "nodes, in launch order:"]
        for selection, step in zip(self.selections, self.steps):
            lines.append(f"  {selection.node} ({selection.op}) -> {kernel_label(selection.op, selection.kernel)} "
                         f"[stream {step.stream}]")
        lines.append(f"arena ({self.memory.arena_bytes} bytes):")
        for name, offset in sorted(self.memory.offsets.items(), key=lambda item: (item[1], item[0])):
            value_type = types.get(name)
            size = f"{value_type}, {value_type.numel * itemsize(value_type.dtype)} bytes" if value_type else "scratch"
            lines.append(f"  [{offset:>10}] {name}: {size}")
        params = self.graph.params
        param_bytes = sum(v.type.numel * itemsize(v.type.dtype) for v in params.values())
        lines.append(f"parameters: {len(params)} ({param_bytes} bytes, outside the arena)")
        return "\n".join(lines)


class ExecutorV2:
    """Compiles ``graph`` for ``device`` ("cpu": NumPy references; "cuda": the native kernels) and runs it.

    ``passes``: pass names or ``Pass`` objects (None: ``passes.DEFAULT_PIPELINE``; ``[]``: none).
    ``autotune`` (default True): on CUDA, plan building times the viable kernels of every node's problem (op,
    shapes, dtypes, attributes) on the plan's own buffers and keeps the fastest; priority only breaks ties (within
    3%) and orders the fallbacks. A problem is timed once: later nodes and plans with the same problem, and later
    processes on the same GPU and CUDA setup, read the winner from the autotune cache on disk
    (``runtime/autotune.py``); ``explain()`` shows the times. False: the highest-priority viable kernel runs (tests
    that assert a kernel by its priority; where a generated kernel competes with hand-written ones they are
    timed in any case). The CPU has one candidate per op and times nothing.
    ``kernels``: op -> kernel tried first. ``reuse_memory=False`` gives every buffer its own bytes.
    ``verify``: run the verifier after every pass (the input graph is always verified).
    ``cuda_graph`` (CUDA): capture every plan as a CUDA graph after its first run and replay it from then on.
    ``streams``: how many streams independent nodes may run on (None: the graph's width, at most
    ``MAX_DEFAULT_STREAMS``); the memory plan never lets nodes that may run at the same time share bytes. On the
    CPU the schedule (and so the memory plan) is the same and the nodes run in order.
    ``GE2_NVTX=1`` in the environment puts an NVTX range around every node, capture and replay (CUDA).
    ``params``: parameter name -> buffer the caller owns (a NumPy array on "cpu", a DeviceArray on "cuda"), used in
    place of an uploaded copy: a trainer updates them in place and plans read the current values.
    ``precision``: "default" (PyTorch's defaults: float32 convolutions may use TF32, matmuls may not), "highest"
    (strict FP32), "high" (TF32 for both) (``passes/precision.py``, applied after the passes, shown by ``explain()``);
    or "fp8": the GEMMs and NHWC convolutions with a parameter weight run on FP8 tensor cores (``passes/fp8.py``)
    once ``calibrate`` has chosen their activations' scales, float32 elsewhere as "default"; a graph saved after calibration (``save``)
    holds its scales and FP8 weights and runs in FP8 as loaded.
    """

    def __init__(self, graph: Graph, device: str = "cpu", passes: Sequence[str | Pass] | None = None,
                 autotune: bool = True, kernels: dict[str, str] | None = None, reuse_memory: bool = True,
                 verify: bool = False, cuda_graph: bool = True, streams: int | None = None,
                 params: dict | None = None, precision: str = "default"):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
        if streams is not None and (isinstance(streams, bool) or not isinstance(streams, int) or streams < 1):
            raise ValueError(f"streams: expected None or an int >= 1, got {streams!r}")
        verify_graph(graph)  # a bad graph fails here, naming the node, before any pass runs
        self.device = device
        self.source_graph = graph
        self.precision = check_precision(precision)
        pipeline = resolve(passes)
        self.capabilities = Capabilities.detect(device)
        self._backend = backend_for(device)
        if device == "cuda" and autotune and any(p.name == "plan_layouts" for p in pipeline):
            # plan_layouts times the float32 convolutions in both layouts, and a region's edge transposes at the
            # device's copy bandwidth
            copy_bytes_per_s = current_roofline(self._backend.runtime, self.capabilities.setup).copy_bytes_per_s
            measured = functools.partial(plan_layouts, measure=conv_layout_timer(type(self), self.precision),
                                         copy_bytes_per_s=copy_bytes_per_s)
            pipeline = [Pass(p.name, measured, p.doc) if p.name == "plan_layouts" else p for p in pipeline]
        self.optimized_graph, self.pass_records = PassManager(
            [*pipeline, Pass("precision", functools.partial(apply_precision, precision=precision))],
            verify_each=verify).run(graph)
        self.reuse_memory = reuse_memory
        self.preferences = Preferences.from_env(kernels, autotune)
        # Plans time candidates (registry.choose_kernel) on a backend whose kernels are timed between events; the
        # cache keeps the winners across nodes, plans and processes.
        self._autotune_cache = AutotuneCache() if self._backend.asynchronous else None
        self._params = params or {}
        self._param_slots = {name: self._params[name] if name in self._params else self._backend.upload(value.data)
                             for name, value in self.optimized_graph.params.items()}
        self.cuda_graph = bool(cuda_graph) and self._backend.asynchronous
        self.stream_count = streams or min(MAX_DEFAULT_STREAMS, width(self.optimized_graph))
        self._nvtx = self._backend.asynchronous and os.environ.get("GE2_NVTX") == "1"
        self._streams = self._backend.streams(self.stream_count)  # kept: handles below point into them
        self._stream_handles = [self._backend.stream_handle(stream) for stream in self._streams]
        self._plans: dict[Signature, Plan] = {}
        self._calibrated = False
        if self.needs_calibration:
            return  # plans wait for the scales (calibrate)
        if all(value.type.is_concrete for value in self.optimized_graph.inputs):
            self._plan_for(tuple((v.type.shape, v.type.dtype) for v in self.optimized_graph.inputs))

    # --- FP8 ------------------------------------------------------------------------------------------------------
    @property
    def needs_calibration(self) -> bool:
        """precision="fp8" on a graph not calibrated (no FP8 GEMM or convolution yet): ``calibrate`` must choose the
        scales before a run."""
        counts = self.optimized_graph.op_counts()
        return self.precision == "fp8" and not self._calibrated and not any(op in counts for op in fp8.FP8_OPS)

    def calibrate(self, feeds_iterable, margin: int = 0) -> dict[str, float]:
        """Runs the graph as compiled (its own dtypes) on every feeds dict of ``feeds_iterable``, records the largest
        ``|x|`` reaching each FP8-eligible GEMM's and convolution's activation input, and rewrites them to FP8 with
        the scales ``448 / (amax * 2**margin)`` (``passes/fp8.py``; on the GPU a convolution for which cuDNN has no
        FP8 engine stays in 16 bits, its reason in ``explain()``). Returns activation name -> amax. Plans are rebuilt;
        the scales are parameters of the graph from then on (``save`` keeps them)."""
        if self.precision != "fp8":
            raise ValueError(f"calibrate: needs ExecutorV2(..., precision='fp8'), this one has precision "
                             f"{self.precision!r}")
        if not self.needs_calibration:
            raise ValueError("calibrate: this executor's graph is calibrated already (it holds FP8 GEMMs)")
        if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
            raise ValueError(f"margin: expected an int >= 0, got {margin!r}")
        eligible = [node for node, reason in fp8.sites(self.optimized_graph) if reason is None]
        probe = self.optimized_graph.clone()
        activations = sorted({node.inputs[0].name for node in eligible})
        values = {v.name: v for v in probe.inputs} | {v.name: v for n in probe.nodes for v in n.outputs}
        for name in activations:
            probe.output(values[name], f"calibrate/{name}")
        runner = ExecutorV2(probe, self.device, passes=[], params=self._param_slots, streams=1,
                            autotune=self.preferences.autotune)
        amax = dict.fromkeys(activations, 0.0)
        batches = 0
        for feeds in feeds_iterable:
            outputs = runner.run(feeds)
            for name in activations:
                value = outputs[f"calibrate/{name}"]
                host = value if isinstance(value, np.ndarray) else _device.as_device_array(value).numpy()
                amax[name] = max(amax[name], float(np.abs(host.astype(np.float64)).max(initial=0.0)))
            batches += 1
        if batches == 0:
            raise ValueError("feeds_iterable: expected at least one feeds dict, got none")
        graph = self.optimized_graph.clone()
        started = time.perf_counter()
        before = graph.op_counts()
        notes = fp8.quantize(graph, amax, margin, self._fp8_engine_reason()) + eliminate_dead_code(graph)
        self.pass_records.append(PassRecord(f"fp8 (calibrated on {batches} feed(s), margin {margin})", tuple(notes),
                                            before, graph.op_counts(), time.perf_counter() - started))
        self.optimized_graph = graph
        self._calibrated = True
        self._param_slots = {name: self._params[name] if name in self._params else self._backend.upload(value.data)
                             for name, value in graph.params.items()}
        self._plans = {}
        if all(value.type.is_concrete for value in graph.inputs):
            self._plan_for(tuple((v.type.shape, v.type.dtype) for v in graph.inputs))
        return amax

    def _fp8_engine_reason(self):
        """On the GPU: why this device cannot run an FP8 convolution problem (its cuDNN plans are built to find out);
        None on the CPU, whose reference runs every one."""
        if self.device != "cuda":
            return None
        capability = self.capabilities.compute_capability
        return lambda problem: scaled_conv2d.unsupported_reason(replace(problem, compute_capability=capability))

    def save(self, path) -> None:
        """Writes the compiled graph (after the passes and, with precision="fp8", the calibration: FP8 weights and
        scales included) as a graph JSON file; ``ExecutorV2(ge2.ir.Graph.load(path), ...)`` runs it again."""
        self.optimized_graph.save(path)

    # --- running --------------------------------------------------------------------------------------------------
    def run(self, feeds: dict, stream=None, out: dict | None = None) -> dict:
        """Runs the graph on ``feeds`` (input name -> array) and returns output name -> array.

        NumPy inputs give NumPy outputs. On CUDA, device inputs (GE2 DeviceArray, torch, CuPy) give new device
        arrays of the same kind as the first of them; ``out`` (output name -> array) names arrays to write instead,
        so a steady-state loop allocates nothing. ``stream`` is the caller's stream (default: the legacy stream):
        the feeds are copied in, the captured graph is launched and the outputs are copied out on it; a plan that
        runs node by node runs on the executor's streams in between, ordered by events. Runs of one executor on
        different streams must not overlap in time: they share its plans' buffers and its streams' workspaces."""
        signature, feed_views = self._signature_of(feeds)
        plan = self._plan_for(signature)
        out = out or {}
        if not out.keys() <= plan.graph.outputs.keys():
            unknown = sorted(set(out) - set(plan.graph.outputs))
            raise ValueError(f"out: unknown output(s) {unknown}; the graph's outputs are {list(plan.graph.outputs)}")
        out_views = {name: _check_array(array, f"out['{name}']", plan.graph.outputs[name].type, self.device)
                     for name, array in out.items()}
        device_like = next((f for f in feeds.values() if not isinstance(f, np.ndarray)), None)
        if plan.cuda_graph is not None:
            results = self._run_in_one_launch(plan, feeds, feed_views, stream, out, out_views, device_like)
            if results is not None:
                return results
        caller = plan.run(feeds, feed_views, stream)
        fetch = self._backend.fetch
        return {name: fetch(plan.slots[value.name], value.type, caller, device_like, out.get(name),
                            f"out['{name}']", out_views.get(name))
                for name, value in plan.graph.outputs.items()}

    def _run_in_one_launch(self, plan: Plan, feeds: dict, feed_views: dict, stream, out: dict, out_views: dict,
                           device_like) -> dict | None:
        """``run`` of a captured plan as one launch of its ``CopyingGraph`` for this kind of run (which feeds and
        results are host arrays): the copies in and out are memcpy nodes of that graph. None when this kind of run
        copies outside the graph instead (CUDA refused the copies; ``explain()`` says why)."""
        backend = self._backend
        inputs, outputs = plan.graph.inputs, plan.graph.outputs
        host_inputs = tuple(isinstance(feeds[value.name], np.ndarray) for value in inputs)
        host_outputs = tuple(isinstance(out.get(name), np.ndarray) or (name not in out and device_like is None)
                             for name in outputs)
        kind = (host_inputs, host_outputs)
        copying = plan.copying_graphs.get(kind)
        if isinstance(copying, str):
            return None
        if copying is None:
            copying = plan.copying_graphs[kind] = backend.copying_graph(
                plan.cuda_graph, [plan.slots[value.name] for value in inputs],
                [plan.slots[value.name] for value in outputs.values()], host_inputs, host_outputs)
        sources = [None if host else backend.feed_address(feeds[value.name], value.name, feed_views[value.name])
                   for value, host in zip(inputs, host_inputs)]
        results, destinations = {}, []
        for (name, value), host in zip(outputs.items(), host_outputs):
            address = None
            if not host:
                results[name], address = backend.fetch_target(value.type, device_like, out.get(name),
                                                              f"out['{name}']", out_views.get(name))
            destinations.append(address)
        copying.stage([feeds[value.name] if host else None for value, host in zip(inputs, host_inputs)])
        caller = backend.caller_stream(stream)
        if self._nvtx:
            backend.runtime.nvtx_push(f"ge2 run {self.source_graph.name}")
        try:
            launched = copying.launch(sources, destinations, caller)
        except RuntimeError as error:  # building the graph failed: this kind of run copies outside it from now on
            plan.copying_graphs[kind] = f"copies outside the graph ({error})"
            return None
        finally:
            if self._nvtx:
                backend.runtime.nvtx_pop()
        if not launched:
            return None
        for index, (name, host) in enumerate(zip(outputs, host_outputs)):
            if host:
                results[name] = copying.host_result(index, out.get(name), f"out['{name}']")
        return {name: results[name] for name in outputs}

    def plan(self, shapes: dict[str, tuple] | None = None) -> Plan:
        """The plan for inputs of these shapes (input name -> shape; None: the declared shapes, all concrete),
        built if needed: its ``inputs`` / ``outputs`` slots and ``replay()`` make a loop with no copy at all."""
        declared = self.optimized_graph.inputs
        shapes = shapes or {}
        unknown = sorted(set(shapes) - {v.name for v in declared})
        if unknown:
            raise ValueError(f"shapes: unknown input(s) {unknown}; the graph takes {[v.name for v in declared]}")
        dims: dict[str, int] = {}
        signature = []
        for value in declared:
            shape = tuple(shapes.get(value.name, value.type.shape))
            if not all(isinstance(d, int) for d in shape) or not _bind(value.type.shape, shape, dims):
                raise ValueError(f"shapes['{value.name}']: expected a concrete shape matching {value.type.shape}, "
                                 f"got {shape}")
            signature.append((shape, value.type.dtype))
        return self._plan_for(tuple(signature))

    # --- executing ------------------------------------------------------------------------------------------------
    def _execute(self, plan: Plan, caller) -> None:
        """Runs ``plan`` on what its input slots hold, ordered after ``caller``'s stream (CUDA) and before what
        is enqueued on it next: the captured graph, launched on ``caller`` itself, when there is one; else node by
        node on the executor's streams, ordered by events (then captured, once)."""
        if plan.cuda_graph is not None:  # self-contained (its streams fork and join inside): one launch, no event
            if self._nvtx:
                runtime = self._backend.runtime
                runtime.nvtx_push(f"ge2 replay {self.source_graph.name}")
                plan.cuda_graph.replay(caller)
                runtime.nvtx_pop()
            else:
                plan.cuda_graph.replay(caller)
            return
        self._launch_steps(plan, caller)
        if not plan.warmed_up:
            plan.warmed_up = True
            self._capture(plan)

    def _launch_steps(self, plan: Plan, caller) -> None:
        """Every step on its stream, with the events of the schedule. ``caller``: a stream to order against
        (None while capturing: the capture stream is the first of the executor's own)."""
        if not self._backend.asynchronous:  # every step in order, nothing to order against
            for index, step in enumerate(plan.steps):
                step.launch(step.ins, step.outs, None)
                for launch in plan.after_step.get(index, ()):
                    launch(None)
            for launch in plan.epilogue:
                launch(None)
            return
        handles, events, runtime = self._stream_handles, plan.events, self._backend.runtime
        main = handles[0]
        others = handles[1:plan.schedule.stream_count]
        ready, fork, done = events[-3:]
        if caller is not None and caller != main:
            ready.record(caller)
            ready.wait_on(main)
        if others:
            fork.record(main)
            for handle in others:
                fork.wait_on(handle)
        for index, step in enumerate(plan.steps):
            handle = handles[step.stream]
            for producer in step.waits:
                events[producer].wait_on(handle)
            if self._nvtx:
                runtime.nvtx_push(step.label)
            try:
                step.launch(step.ins, step.outs, handle)
            except Exception as error:
                raise RuntimeError(f"{plan.graph.nodes[index].where()}: {step.label}: {error}") from error
            finally:
                if self._nvtx:
                    runtime.nvtx_pop()
            if step.signals:
                events[index].record(handle)
            for launch in plan.after_step.get(index, ()):
                launch(handle)
        for handle, joined in zip(others, plan.events[len(plan.steps):-3]):
            joined.record(handle)
            joined.wait_on(main)
        for launch in plan.epilogue:  # after every node and join, on the first stream
            launch(main)
        if caller is not None and caller != main:
            done.record(main)
            done.wait_on(caller)

    def _capture(self, plan: Plan) -> None:
        """Captures the warmed-up ``plan`` as a CUDA graph on the first stream, or records why it cannot be."""
        if not self.cuda_graph:
            return
        host = next((s for s in plan.selections if s.kernel == HOST_FALLBACK), None)
        if host is not None:
            plan.capture = (f"not captured: node '{host.node}' ({host.op}) runs {HOST_FALLBACK}, a host round trip "
                            f"that synchronizes")
            return
        runtime = self._backend.runtime
        started = time.perf_counter()
        graph = runtime.CudaGraph()
        if self._nvtx:
            runtime.nvtx_push(f"ge2 capture {self.source_graph.name}")
        try:
            graph.begin_capture(self._stream_handles[0])
            self._launch_steps(plan, None)
            graph.end_capture()
        except Exception as error:  # the plan stays correct node by node; explain() says why
            graph.abort_capture()
            plan.capture = f"not captured: {error}"
            return
        finally:
            if self._nvtx:
                runtime.nvtx_pop()
        plan.cuda_graph = graph
        # the kinds of nodes, so that what runs besides kernels (memsets, copies) shows in explain()
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(graph.node_types.items()))
        plan.capture = (f"captured: {graph.node_count} graph nodes ({kinds}) on {plan.schedule.stream_count} "
                        f"stream(s)")
        plan.capture_seconds = time.perf_counter() - started

    def _signature_of(self, feeds: dict) -> tuple[Signature, dict]:
        """Checks the feeds against the declared inputs (symbolic dims must bind consistently across inputs);
        returns the signature and every feed as a NumPy array or a ``DeviceView`` (each looked at once per run)."""
        declared = self.optimized_graph.inputs
        names = [v.name for v in declared]
        if len(feeds) == len(names) and all(name in feeds for name in names):
            views = {name: _viewed(feeds[name], f"input '{name}'", self.device) for name in names}
            signature = tuple((tuple(view.shape), _dtype_name(view)) for view in views.values())
            if signature in self._plans:  # checked in full when its plan was built: the steady state stops here
                return signature, views
        missing = [name for name in names if name not in feeds]
        if missing:
            raise ValueError(f"missing input(s) {missing}; graph '{self.source_graph.name}' takes {names}")
        unknown = sorted(set(feeds) - set(names))
        if unknown:
            raise ValueError(f"unknown input(s) {unknown}; graph '{self.source_graph.name}' takes {names}")
        dims: dict[str, int] = {}
        signature, views = [], {}
        for value in declared:
            views[value.name] = viewed = _viewed(feeds[value.name], f"input '{value.name}'", self.device)
            shape, dtype = tuple(viewed.shape), _dtype_name(viewed)
            expected = value.type
            if dtype != expected.dtype:
                raise TypeError(f"input '{value.name}': expected dtype {expected.dtype}, got {dtype}")
            if not _bind(expected.shape, shape, dims):
                described = ", ".join(f"{d}={dims[d]}" if isinstance(d, str) and d in dims else str(d)
                                      for d in expected.shape)
                raise ValueError(f"input '{value.name}': expected shape ({described}), got {shape}")
            signature.append((shape, dtype))
        return tuple(signature), views

    def plan_for(self, feeds: dict) -> tuple[Plan, dict]:
        """The plan (built on first use) for the signature of ``feeds``, which are checked but not copied, and the
        feeds' views (what ``backend.feed`` takes)."""
        signature, feed_views = self._signature_of(feeds)
        return self._plan_for(signature), feed_views

    # --- compiling ------------------------------------------------------------------------------------------------
    def _plan_for(self, signature: Signature) -> Plan:
        if self.needs_calibration:
            raise RuntimeError("precision='fp8': call calibrate(feeds_iterable) first; it chooses the FP8 scales of "
                               "the GEMMs from sample feeds")
        plan = self._plans.get(signature)
        if plan is None:
            plan = self._plans[signature] = self._build_plan(signature)
        return plan

    def _build_plan(self, signature: Signature) -> Plan:
        started = time.perf_counter()
        graph = self.optimized_graph.clone()
        bound: dict[str, int] = {}
        for value, (shape, dtype) in zip(graph.inputs, signature):
            _bind(value.type.shape, shape, bound)
            value.type = TensorType(shape, dtype)
        infer_shapes(graph, bound)

        order = schedule(graph, self.stream_count)
        step_count = len(graph.nodes)
        # Views (reshapes) share their root's buffer and launch nothing; reuse_memory=False turns that off too.
        roots = alias_roots(graph) if self.reuse_memory else {}
        writer = {value.name: -1 for value in graph.inputs}
        readers: dict[str, set[int]] = {name: set() for name in writer}
        for index, node in enumerate(graph.nodes):
            for value in node.inputs:
                if value is not None and not value.is_param:
                    readers[roots.get(value, value).name].add(index)
            for value in node.outputs:
                if value not in roots:
                    writer[value.name] = index
                    readers[value.name] = set()
        # Inputs and outputs stay live through the whole plan: a zero-copy loop writes the inputs once and replays,
        # and reads the outputs after the run.
        for value in (*graph.inputs, *graph.outputs.values()):
            if not value.is_param:
                readers[roots.get(value, value).name].add(step_count)
        types = {v.name: v.type for v in graph.inputs}
        types.update((v.name, v.type) for node in graph.nodes for v in node.outputs)
        memory = plan_memory([Buffer(name, types[name].numel * itemsize(types[name].dtype), writer[name],
                                     tuple(sorted(readers[name]))) for name in writer],
                             self.reuse_memory, order.before)

        backend = self._backend
        arena = backend.allocate(memory.arena_bytes)
        slots = dict(self._param_slots)
        slots.update((name, backend.slot(arena, offset, types[name])) for name, offset in memory.offsets.items())
        slots.update((view.name, backend.slot(arena, memory.offsets[root.name], view.type))
                     for view, root in roots.items())
        addresses = {name: backend.address(slot) for name, slot in slots.items()}
        absent = backend.address_of_absent

        selections, steps = [], []
        choose_seconds = 0.0  # wall time of every node's choice: ranking (capability checks) and prepares
        tuning_seconds = 0.0  # of which timing candidates: the races' prepares and timed runs (ranking not included)
        untimed = 0  # nodes chosen by priority once TUNING_BUDGET_S was spent (the cache still answers)
        signalling = order.signalling
        # The kernels the nodes may prepare compile in parallel, then load node by node from the kernel cache.
        compiling = time.perf_counter()
        backend.precompile([_problem_of(node, self.capabilities) for node in graph.nodes
                            if not (node.outputs and node.outputs[0] in roots)], self._settled_kernel)
        compile_seconds = time.perf_counter() - compiling
        for index, node in enumerate(graph.nodes):
            ins = tuple(absent if v is None else addresses[v.name] for v in node.inputs)
            outs = tuple(addresses[v.name] for v in node.outputs)
            problem = _problem_of(node, self.capabilities)
            if node.outputs and node.outputs[0] in roots:  # a view: every output shares its root's buffer
                shared = roots[node.outputs[0]].name
                selections.append(Selection(node.name, node.op, ALIAS, "the output is a view of the input's buffer",
                                            _no_launch, f"no copy: shares the buffer of '{shared}'"))
                steps.append(Step(_no_launch, ins, outs, order.stream_of[index], order.waits[index],
                                  index in signalling, f"{node.op} {node.name} {ALIAS}"))
                continue
            timer = None
            if self._autotune_cache is not None and tuning_seconds < TUNING_BUDGET_S:
                def timer(launch, ins=ins, outs=outs, stream=self._stream_handles[order.stream_of[index]]):
                    return backend.time_ms(lambda: launch(ins, outs, stream), stream)
            choosing = time.perf_counter()
            selection = choose_kernel(node, problem, self.capabilities, self.preferences, timer, self._autotune_cache)
            chosen_in = time.perf_counter() - choosing
            choose_seconds += chosen_in
            tuning_seconds += selection.tuning_seconds
            if (timer is None and self._autotune_cache is not None and self.preferences.autotune
                    and selection.reason.startswith("highest priority of ") and " of 1 viable" not in selection.reason):
                untimed += 1
            selections.append(selection)
            label = f"{node.op} {node.name} {selection.kernel}" + (" fallback" if selection.is_fallback else "")
            steps.append(Step(selection.launch, ins, outs, order.stream_of[index], order.waits[index],
                              index in signalling, label))
        plan = Plan(signature, graph, selections, memory, order, arena, slots, steps,
                    {v.name: slots[v.name] for v in graph.inputs},
                    {name: slots[v.name] for name, v in graph.outputs.items()}, self)
        if not self.cuda_graph:
            plan.capture = "off (cuda_graph=False)" if backend.asynchronous else "off (the CPU runs node by node)"
        if backend.asynchronous:
            # One event per signalling step, one join per extra stream, then ready, fork and done.
            plan.events = [backend.event() if index in signalling else None for index in range(step_count)]
            plan.events += [backend.event() for _ in range(order.stream_count - 1 + 3)]
        plan.build_seconds, plan.tuning_seconds, plan.untimed = time.perf_counter() - started, tuning_seconds, untimed
        plan.compile_seconds, plan.choose_seconds = compile_seconds, choose_seconds
        return plan

    def _settled_kernel(self, problem: Problem) -> str | None:
        """The one kernel a node of ``problem`` will prepare when known before timing (pinned, or the autotune
        cache's winner), else None: what the parallel precompile need not compile the others for."""
        pinned = self.preferences.kernels.get(problem.op)
        if pinned is not None or self._autotune_cache is None:
            return pinned
        return self._autotune_cache.lookup(self.capabilities.setup, problem_key(problem))

    # --- reporting ------------------------------------------------------------------------------------------------
    def profile(self, feeds: dict, runs: int = 20) -> Profile:
        """Runs the plan of ``feeds`` once (warm-up and capture), then times it ``runs`` times: per node its
        kernel, median time, share, achieved TFLOP/s or GB/s and roofline fraction, and the whole plan node by node
        and as a CUDA graph. ``print()`` the result for the table; ``export_chrome_trace(path)`` writes the
        timeline."""
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ValueError(f"runs: expected an int >= 1, got {runs!r}")
        self.run(feeds)
        return profile_plan(self, self._plan_for(self._signature_of(feeds)[0]), runs)

    @property
    def streams(self) -> list:
        """The streams the plans run on (CUDA: ``_runtime.Stream`` objects the executor owns; the first one is
        where plans are captured and replayed)."""
        return list(self._streams)

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
        lines = [f"ExecutorV2 '{self.source_graph.name}' on {target}"]
        if self.precision == "fp8":
            lines.append("precision: fp8 (E4M3 GEMMs and convolutions on calibrated per-tensor scales)" + (
                "; not calibrated yet: call calibrate(feeds_iterable)" if self.needs_calibration else ""))
        else:
            lines.append(describe_precision(self.precision))
        lines.append("passes:")
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
            views = sum(s.kernel == ALIAS for s in plan.selections)
            lines.append(f"plan for ({inputs}): {len(plan.steps) - views} kernels, {plan.memory.summary()}"
                         + (f"; {views} view(s) aliased, no copy" if views else ""))
            if self._backend.asynchronous:
                lines.append(f"  cuda graph: {plan.capture}")
                lines += [f"  run(): {_describe_copies(kind, copies)}" for kind, copies in plan.copying_graphs.items()]
                lines.append(f"  {_describe_tuning(plan, self.preferences.autotune)}")
            streams = plan.schedule.stream_count
            name_width = max((len(s.node) for s in plan.selections), default=0)
            for node, selection, step in zip(plan.graph.nodes, plan.selections, plan.steps):
                label = functools.partial(kernel_label, selection.op)
                on_stream = f" [stream {step.stream}]" if streams > 1 else ""
                lines.append(f"  {selection.node:<{name_width}}  {selection.op:<10} -> {label(selection.kernel)}: "
                             f"{selection.reason}{on_stream}")
                lines += _describe_generated(node, selection)
                lines += [f"      fallback: {label(name)} failed to prepare: {why}"
                          for name, why in selection.fallbacks]
                lines += [f"      not viable: {label(name)}: {why}" for name, why in selection.rejected]
        fallbacks = self.fallbacks
        lines.append(f"fallbacks: {len(fallbacks)}")
        lines += [f"  {s.node} ({s.op}) runs {kernel_label(s.op, s.kernel)}" for s in fallbacks]
        return "\n".join(lines)


def _problem_of(node, capabilities: Capabilities) -> Problem:
    return Problem(node.op, tuple(None if v is None else v.type for v in node.inputs),
                   tuple(v.type for v in node.outputs), node.attrs, capabilities.compute_capability)


def _describe_generated(node, selection: Selection) -> list[str]:
    """explain()'s lines for a fused node (its members and their original nodes) and a generated kernel (its name
    and what building it cost)."""
    lines = []
    if node.op in FUSED_OPS:
        lines.append(f"      members: {fused_members(node)}")
    record = STATS.of_launch(selection.launch)
    if record is not None:
        lines.append(f"      kernel {record.kernel}: {describe_build(record)}")
    return lines


def _describe_copies(kind: tuple, copying) -> str:
    """explain()'s line on one kind of run() of a captured plan: one launch, or why its copies are outside."""
    host_inputs, host_outputs = kind
    fed = f"{sum(host_inputs)} host / {len(host_inputs) - sum(host_inputs)} device feed(s)"
    fetched = f"{sum(host_outputs)} host / {len(host_outputs) - sum(host_outputs)} device result(s)"
    how = copying if isinstance(copying, str) else "one launch, the copies are memcpy nodes of the graph"
    return f"{fed}, {fetched}: {how}"


def _describe_tuning(plan: Plan, autotune: bool) -> str:
    """explain()'s line on measured choice: how many distinct problems were timed and what it cost."""
    timed, cached = plan.timed_problems, plan.cached_choices
    if not autotune and not timed:
        return f"autotune: off (autotune=False: highest priority first); plan built in {plan.build_seconds:.2f} s"
    budget = (f"; tuning budget ({TUNING_BUDGET_S:g} s) spent: {plan.untimed} node(s) by priority"
              if plan.untimed else "")
    return (f"autotune: {timed} problem(s) timed in {plan.tuning_seconds:.2f} s, {cached} node(s) from the "
            f"autotune cache{budget}; plan built in {plan.build_seconds:.2f} s ({plan.compile_seconds:.2f} s "
            f"compiling generated kernels ahead, in parallel; timing is one kernel at a time on one stream); kernels "
            f"are timed within the precision policy (a float32 node's allow_tf32)")


def _no_launch(ins, outs, stream) -> None:
    """The launch of an aliased view: its bytes are already where its root's writer put them."""


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


def _bind(expected: tuple, actual: tuple, bound: dict[str, int]) -> bool:
    """Whether ``actual`` fits ``expected``; on success the symbolic dims it binds are added to ``bound`` (a plain
    name binds to its size; an expression such as ``seq+1`` binds the one name it leaves unknown, else checks)."""
    if len(actual) != len(expected):
        return False
    found = dict(bound)
    for want, got in zip(expected, actual):
        if isinstance(want, int):
            if want != got:
                return False
        elif want in found or dims.is_name(want):
            if found.setdefault(want, got) != got:
                return False
        else:
            solved = dims.solve(want, got, found)
            if solved is None:
                return False
            found.update(solved)
    bound.update(found)
    return True


def _viewed(value, argument: str, device: str):
    """A NumPy array as is, anything else as the ``DeviceView`` of a device array (TypeError naming ``argument``;
    on the CPU backend, saying that it takes NumPy arrays)."""
    if isinstance(value, np.ndarray):
        return value
    if device == "cpu":
        raise TypeError(f"{argument}: a device='cpu' executor takes NumPy arrays, got {type(value).__name__}; "
                        "convert it with np.asarray(value, dtype) (device arrays need device='cuda')")
    return _device.view_of(value, argument)


def _dtype_name(viewed) -> str:
    return viewed.dtype.name if isinstance(viewed, np.ndarray) else viewed.dtype


def _check_array(value, argument: str, expected: TensorType, device: str):
    """``value`` viewed (see ``_viewed``), after checking its shape and dtype against ``expected``."""
    viewed = _viewed(value, argument, device)
    shape, dtype = tuple(viewed.shape), _dtype_name(viewed)
    if dtype != expected.dtype:
        raise TypeError(f"{argument}: expected dtype {expected.dtype}, got {dtype}")
    if shape != expected.shape:
        raise ValueError(f"{argument}: expected shape {expected.shape}, got {shape}")
    return viewed
