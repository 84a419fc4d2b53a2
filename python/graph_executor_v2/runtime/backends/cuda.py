"""The CUDA backend: parameters uploaded once, one arena allocated once per plan, raw pointers for the kernels.

Nothing here touches the native runtime before a CUDA executor is built, so the CPU path never needs it.
"""
from __future__ import annotations

import numpy as np

from ... import device as _device
from ...codegen.candidate import precompile
from ...dtypes import itemsize, to_numpy
from ...ir.types import TensorType
from ...ir.schema import Candidate, OpDef, Problem
from ...ops.optimizer import BufferCopies


HOST_FALLBACK = "host_reference"


class _BorrowedBytes:
    """``__cuda_array_interface__`` of ``nbytes`` device bytes at ``pointer``, to wrap as a borrowed DeviceArray."""

    def __init__(self, pointer: int, nbytes: int, keep_alive):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False),
                                         "version": 3, "strides": None}
        self.keep_alive = keep_alive


def borrow(pointer: int, nbytes: int, keep_alive=None):
    """A uint8 DeviceArray over existing device memory (bytes carry every dtype, bfloat16 included)."""
    return _device.runtime().DeviceArray.from_cuda_array_interface(_BorrowedBytes(pointer, nbytes, keep_alive))


def host_fallback_candidate(opdef: OpDef) -> Candidate:
    """The last resort on CUDA: copy the inputs to the host, run the NumPy reference, copy the outputs back.

    Slow and synchronizing, but it makes every graph runnable (an op with no GPU kernel yet, a native module that
    is not built); the plan reports every node that ends up here."""

    def prepare(problem: Problem):
        attrs = problem.attrs
        in_types = problem.in_types

        def launch(ins, outs, stream):
            host_inputs = [None if t is None else _to_host(pointer, t, stream) for pointer, t in zip(ins, in_types)]
            for pointer, result in zip(outs, opdef.run_reference(host_inputs, attrs)):
                borrow(pointer, result.nbytes).copy_from_numpy(np.ascontiguousarray(result).reshape(-1).view(np.uint8),
                                                               stream)

        return launch

    return Candidate(HOST_FALLBACK, -1, "NumPy reference on the host, with copies (last resort)",
                     lambda problem: None, prepare, always_works=True)


def _checked_host_out(out: np.ndarray, argument: str) -> np.ndarray:
    if not out.flags.c_contiguous:
        raise ValueError(f"{argument}: expected a C-contiguous NumPy array")
    return out


class CopyingGraph:
    """A plan's captured CUDA graph with the copies of a run around it as memcpy nodes, so that ``ExecutorV2.run`` is
    one launch: each input copied from its feed into its slot, then the plan, then each output copied from its slot
    to where the caller wants it (``CudaGraph.with_copies``).

    One per plan and kind of run (which inputs come from the host and which outputs go to it). Graph memcpy nodes
    cannot use pageable memory, so host feeds and fetches go through page-locked staging buffers: the CPU copies a
    host feed into its buffer before the launch, and a host result out of its buffer once the launch has finished.
    Device feeds and results are copied from and to the caller's arrays directly; a run that brings another address
    than the last one repoints that memcpy node (``set_copy``: no new instantiation)."""

    def __init__(self, runtime, graph, input_slots: list, output_slots: list, host_inputs: tuple,
                 host_outputs: tuple):
        self.graph = graph
        self.input_staging = [_staging(runtime, slot) if host else None for slot, host in zip(input_slots, host_inputs)]
        self.output_staging = [_staging(runtime, slot) if host else None
                               for slot, host in zip(output_slots, host_outputs)]
        # (position, slot address, bytes, staging address or None) of every copy (an empty tensor has none)
        self.input_copies = [(position, slot.ptr, slot.nbytes, None if buffer is None else buffer.ctypes.data)
                             for position, (slot, buffer) in enumerate(zip(input_slots, self.input_staging))
                             if slot.nbytes]
        self.output_copies = [(position, slot.ptr, slot.nbytes, None if buffer is None else buffer.ctypes.data)
                              for position, (slot, buffer) in enumerate(zip(output_slots, self.output_staging))
                              if slot.nbytes]
        self.uses_host = any(host_inputs) or any(host_outputs)
        self.finished = runtime.Event(timing=False)  # the last launch: staging buffers are free again after it
        self.launched = None  # the with_copies graph, built at the first launch (the device addresses known then)
        self.addresses: list[tuple[int, int]] = []  # (destination, source) of every memcpy node, as set now

    def stage(self, feeds: list) -> None:
        """Copies the host feeds (None: a device feed) into their staging buffers, once the last launch is done
        with them."""
        if any(buffer is not None for buffer in self.input_staging):
            self.finished.synchronize()
        for buffer, value in zip(self.input_staging, feeds):
            if buffer is not None:
                np.copyto(buffer, value)

    def launch(self, sources: list, destinations: list, stream: int) -> bool:
        """Launches the graph on ``stream`` with input ``i`` copied from ``sources[i]`` (a device address; None: its
        staging buffer) and output ``j`` to ``destinations[j]`` (likewise). False, having launched nothing, when CUDA
        refuses an address for a memcpy node (memory of another kind than the graph was built with)."""
        copies = [(slot_address, sources[position] if staged is None else staged, nbytes)
                  for position, slot_address, nbytes, staged in self.input_copies]
        inputs = len(copies)
        copies += [(destinations[position] if staged is None else staged, slot_address, nbytes)
                   for position, slot_address, nbytes, staged in self.output_copies]
        if self.launched is None:
            self.launched = self.graph.with_copies(copies[:inputs], copies[inputs:])
            self.addresses = [copy[:2] for copy in copies]
        else:
            for index, (destination, source, nbytes) in enumerate(copies):
                if self.addresses[index] != (destination, source):
                    if not self.launched.set_copy(index, destination, source, nbytes):
                        return False
                    self.addresses[index] = (destination, source)
        self.launched.replay(stream)
        if self.uses_host:
            self.finished.record(stream)
        return True

    def host_result(self, index: int, out: np.ndarray | None, argument: str) -> np.ndarray:
        """Output ``index``'s staged result, copied into ``out`` or a new array, once the launch has finished."""
        self.finished.synchronize()
        staged = self.output_staging[index]
        if out is None:
            return staged.copy()
        np.copyto(_checked_host_out(out, argument), staged)
        return out


def _staging(runtime, slot) -> np.ndarray:
    """A page-locked host array of the slot's shape and dtype."""
    return runtime.pinned_empty(slot.nbytes).view(to_numpy(slot.dtype)).reshape(slot.shape)


def _to_host(pointer: int, tensor_type: TensorType, stream) -> np.ndarray:
    nbytes = tensor_type.numel * itemsize(tensor_type.dtype)
    return borrow(pointer, nbytes).numpy(stream).view(to_numpy(tensor_type.dtype)).reshape(tensor_type.shape)


class CudaBackend:
    device = "cuda"
    address_of_absent = 0  # what a kernel gets for an absent optional input
    # Work is enqueued on streams and finishes later: plans order it with events, capture it as CUDA graphs and
    # time kernels between events; a result is read back when the caller asks for it.
    asynchronous = True
    caller_stream = staticmethod(_device.stream_handle)  # the caller's stream argument (None: legacy) -> handle

    def __init__(self):
        _device.require_gpu("ExecutorV2(device='cuda')")
        self.runtime = _device.runtime()
        self.device_index = self.runtime.current_device()

    def upload(self, array: np.ndarray):
        return self.runtime.DeviceArray.from_numpy(np.require(array, requirements="C"), self.device_index)

    def allocate(self, nbytes: int):
        arena = self.runtime.DeviceArray.empty([max(nbytes, 1)], "uint8", self.device_index)
        arena.poison()  # NaN everywhere until a kernel writes: reading an unwritten buffer cannot pass a test
        return arena

    def slot(self, arena, offset: int, tensor_type: TensorType):
        return arena.view(offset, list(tensor_type.shape), tensor_type.dtype)

    def address(self, slot) -> int:
        return slot.ptr

    def streams(self, count: int) -> list:
        """``count`` non-blocking streams owned by the executor (CUDA graphs cannot capture the legacy stream)."""
        return [self.runtime.Stream(self.device_index) for _ in range(count)]

    def stream_handle(self, stream) -> int:
        return stream.handle

    def event(self):
        return self.runtime.Event(timing=False)

    def to_host(self, buffer) -> np.ndarray:
        """A host copy of a whole buffer (synchronizes)."""
        return buffer.numpy().reshape(buffer.shape)

    def store(self, buffer, array: np.ndarray, stream: int = 0) -> None:
        """Writes the host ``array`` (the buffer's dtype, any shape of its size) into ``buffer`` on ``stream``."""
        buffer.copy_from_numpy(np.require(array, requirements="C").reshape(buffer.shape), stream)

    def copier(self, pairs):
        """launch(stream) copying each (destination, source) pair's bytes (same sizes) on ``stream``: one kernel for
        all of them (a table uploaded here), so a captured step holds one node, not a memcpy node per pair."""
        copies = BufferCopies([(source.ptr, destination.ptr, destination.nbytes) for destination, source in pairs],
                              self.device_index)
        return copies.launch

    def precompile(self, problems: list, settled) -> None:
        """Compiles the kernels a plan's nodes may prepare in parallel, before they are prepared and timed one by
        one (``codegen.candidate.precompile``; ``settled(problem)``: the one candidate known to run, or None)."""
        precompile(problems, settled)

    def feed(self, slot, value, name: str, stream: int, view=None) -> None:
        """Copies ``value`` (NumPy, or a device array whose ``DeviceView`` may be given) into ``slot`` on
        ``stream``."""
        if isinstance(value, np.ndarray):
            slot.copy_from_numpy(np.require(value, requirements="C"), stream)  # keeps 0-d (ascontiguousarray: 1-d)
            return
        self.runtime.memcpy_device_to_device(slot.ptr, self.feed_address(value, name, view), slot.nbytes, stream)

    def feed_address(self, value, name: str, view=None) -> int:
        """The address of device feed ``value`` (its ``DeviceView`` may be given), once checked: contiguous, on the
        executor's device."""
        view = view or _device.view_of(value, f"input '{name}'")
        if not view.is_contiguous:
            raise ValueError(f"input '{name}': expected a contiguous array, got strides {view.strides}")
        if view.device != self.device_index:
            raise ValueError(f"input '{name}': expected an array on cuda:{self.device_index}, got cuda:{view.device}")
        return view.ptr

    def fetch(self, slot, tensor_type: TensorType, stream: int, device_like=None, out=None, argument: str = "out",
              out_view=None):
        """The slot copied into ``out`` (host or device, shape and dtype already checked; ``out_view``: its
        ``DeviceView`` when known), else into a new device array of ``device_like``'s kind, else into a new host
        array."""
        if isinstance(out, np.ndarray):
            _checked_host_out(out, argument)[...] = slot.numpy(stream)
            return out
        if out is None and device_like is None:
            return slot.numpy(stream)
        result, address = self.fetch_target(tensor_type, device_like, out, argument, out_view)
        self.runtime.memcpy_device_to_device(address, slot.ptr, slot.nbytes, stream)
        return result

    def fetch_target(self, tensor_type: TensorType, device_like, out, argument: str, out_view=None) -> tuple:
        """(the device array a result goes to: ``out``, else a new one of ``device_like``'s kind; its address),
        once checked: contiguous, on the executor's device."""
        result = out if out is not None else _device.empty_like_kind(device_like, tensor_type.shape,
                                                                     tensor_type.dtype, self.device_index)
        view = out_view if out is not None and out_view is not None else _device.view_of(result, argument)
        if not view.is_contiguous or view.device != self.device_index:
            raise ValueError(f"{argument}: expected a contiguous array on cuda:{self.device_index}, got strides "
                             f"{view.strides} on cuda:{view.device}")
        return result, view.ptr

    def copying_graph(self, graph, input_slots: list, output_slots: list, host_inputs: tuple, host_outputs: tuple):
        """A ``CopyingGraph`` of a plan's captured ``graph`` for runs whose feeds / fetches are host (True) or
        device (False) arrays, input by input and output by output."""
        return CopyingGraph(self.runtime, graph, input_slots, output_slots, host_inputs, host_outputs)

    # Data parallelism (distributed/data_parallel.py): NCCL on a communication stream, captured with the plan.
    collectives = "NCCL on a communication stream"

    def check_process_group(self, group) -> None:
        """Raises when ``group`` cannot exchange device buffers (they need NCCL)."""
        if group.communicator is None:
            raise ValueError(f"distributed: device 'cuda' needs the 'nccl' backend, but this job runs the "
                             f"'{group.backend}' backend (ge2.distributed.init(backend='nccl'))")

    def side_stream(self) -> tuple:
        """(a stream for work that overlaps the plan's, kept alive by the caller; its handle)."""
        stream = self.streams(1)[0]
        return stream, self.stream_handle(stream)

    def overlapped(self, work, side_stream: int) -> tuple:
        """``(hook, done)``: ``hook(stream)`` makes ``side_stream`` wait for what ``stream`` holds so far, enqueues
        ``work(side_stream)`` and records ``done``, the event that ``done.wait_on(stream)`` joins back (no host
        synchronisation, so a captured plan captures the fork and the join)."""
        ready, done = self.event(), self.event()

        def hook(stream):
            ready.record(stream)
            ready.wait_on(side_stream)
            work(side_stream)
            done.record(side_stream)

        return hook, done

    def hold_captured_collectives(self, group, plan) -> None:
        """Registers ``plan`` with ``group``: its CUDA graph, once captured, holds the group's communicator."""
        group.add_captured_plan(plan)

    def synchronize(self) -> None:
        self.runtime.synchronize()

    def time_ms(self, run, stream: int, warmup: int = 3, repetitions: int = 20, budget_ms: float = 10.0) -> float:
        """Mean milliseconds of ``run()`` on ``stream``, between CUDA events, after a warm-up. The warm-up's time
        bounds the repetitions to about ``budget_ms`` of device time (at least 3), so timing a plan's large
        convolutions stays cheap."""
        start, end = self.runtime.Event(), self.runtime.Event()
        start.record(stream)
        for _ in range(warmup):
            run()
        end.record(stream)
        end.synchronize()
        estimate = start.elapsed_ms(end) / warmup  # first launches included: an overestimate, never too many runs
        repetitions = max(3, min(repetitions, int(budget_ms / max(estimate, 1e-3))))
        start.record(stream)
        for _ in range(repetitions):
            run()
        end.record(stream)
        end.synchronize()
        return start.elapsed_ms(end) / repetitions
