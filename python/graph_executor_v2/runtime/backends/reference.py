"""The CPU backend: an arena of host bytes, and every node run by its op's NumPy reference.

The arena is filled with 0xFF bytes (NaN in every float dtype) when allocated, so a kernel that reads a buffer
nobody wrote, or a memory plan that lets two live buffers share bytes, shows up as NaN or wrong numbers in the
CPU tests, not only on the GPU.
"""
from __future__ import annotations

import numpy as np

from ...dtypes import to_numpy
from ...ir.types import TensorType
from ...ir.schema import Candidate, OpDef, Problem


def reference_candidate(opdef: OpDef) -> Candidate:
    """The candidate that always works on the CPU: float64 NumPy math, cast and written into the output slots."""

    def prepare(problem: Problem):
        attrs = problem.attrs

        def launch(ins, outs, stream):
            for out, result in zip(outs, opdef.run_reference(ins, attrs)):
                np.copyto(out, result)

        return launch

    return Candidate("numpy_reference", 0, "NumPy float64 reference (the CPU backend)", lambda problem: None, prepare,
                     always_works=True)


class ReferenceBackend:
    device = "cpu"
    address_of_absent = None  # what a kernel gets for an absent optional input
    asynchronous = False  # every node runs in order on the host: results are there when a run returns

    @staticmethod
    def caller_stream(stream) -> None:
        return None  # the CPU has no streams

    def to_host(self, buffer: np.ndarray) -> np.ndarray:
        return buffer.copy()

    def store(self, buffer: np.ndarray, array: np.ndarray, stream=None) -> None:
        buffer[...] = np.reshape(array, buffer.shape)

    def copier(self, pairs):
        """launch(stream) copying each (destination, source) pair of arrays."""
        def launch(stream=None):
            for destination, source in pairs:
                destination[...] = source.reshape(destination.shape)

        return launch

    def precompile(self, problems: list, settled) -> None:
        pass  # fused nodes run their members' references: nothing to compile

    def upload(self, array: np.ndarray) -> np.ndarray:
        return array  # parameters are read-only arrays already; kernels only read them

    def allocate(self, nbytes: int) -> np.ndarray:
        return np.full(nbytes, 0xFF, np.uint8)

    def slot(self, arena: np.ndarray, offset: int, tensor_type: TensorType) -> np.ndarray:
        dtype = to_numpy(tensor_type.dtype)
        return arena[offset:offset + tensor_type.numel * dtype.itemsize].view(dtype).reshape(tensor_type.shape)

    def address(self, slot: np.ndarray) -> np.ndarray:
        return slot

    def feed(self, slot: np.ndarray, value, name: str, stream, view=None) -> None:
        if not isinstance(value, np.ndarray):
            raise TypeError(f"input '{name}': expected a NumPy array on device='cpu', got {type(value).__name__}")
        np.copyto(slot, value)

    def fetch(self, slot: np.ndarray, tensor_type: TensorType, stream, device_like=None, out=None,
              argument: str = "out", out_view=None) -> np.ndarray:
        """A copy of the slot, or ``out`` (a NumPy array of the slot's shape and dtype) overwritten with it."""
        if out is None:
            return slot.copy()
        if not isinstance(out, np.ndarray):
            raise TypeError(f"{argument}: expected a NumPy array on device='cpu', got {type(out).__name__}")
        np.copyto(out, slot)
        return out

    def streams(self, count: int) -> list:
        return [None] * count  # the CPU runs every node in order

    def stream_handle(self, stream):
        return stream

    # Data parallelism (distributed/data_parallel.py): the ranks exchange NumPy buffers through the store, in order.
    collectives = "the store (CPU)"

    def check_process_group(self, group) -> None:
        """Raises when ``group`` cannot exchange this backend's buffers: the store exchanges NumPy arrays always."""

    def side_stream(self) -> tuple:
        """(a stream for work that overlaps the plan's, kept alive by the caller; its handle): none on the CPU."""
        return None, None

    def overlapped(self, work, side_stream) -> tuple:
        """``(hook, done)``: ``hook(stream)`` runs ``work(side_stream)`` once what ``stream`` holds so far is done;
        ``done`` is an event that ``done.wait_on(stream)`` waits for, or None. On the CPU: in order, at once."""
        return (lambda stream: work(side_stream)), None

    def hold_captured_collectives(self, group, plan) -> None:
        """Registers ``plan`` with ``group`` when its captured form holds the group's collectives: the CPU captures
        nothing."""

    def synchronize(self) -> None:
        pass  # the host work is done when a call returns
