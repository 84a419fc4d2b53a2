"""The CPU backend: an arena of host bytes, and every node run by its op's NumPy reference.

The arena is filled with 0xFF bytes (NaN in every float dtype) when allocated, so a kernel that reads a buffer
nobody wrote, or a memory plan that lets two live buffers share bytes, shows up as NaN or wrong numbers in the
CPU tests, not only on the GPU.
"""
from __future__ import annotations

import numpy as np

from ...dtypes import to_numpy
from ...ir.types import TensorType
from ...ops._base import Candidate, OpDef, Problem


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

    def upload(self, array: np.ndarray) -> np.ndarray:
        return array  # parameters are read-only arrays already; kernels only read them

    def allocate(self, nbytes: int) -> np.ndarray:
        return np.full(nbytes, 0xFF, np.uint8)

    def slot(self, arena: np.ndarray, offset: int, type: TensorType) -> np.ndarray:
        dtype = to_numpy(type.dtype)
        return arena[offset:offset + type.numel * dtype.itemsize].view(dtype).reshape(type.shape)

    def address(self, slot: np.ndarray) -> np.ndarray:
        return slot

    def feed(self, slot: np.ndarray, value, name: str, stream) -> None:
        if not isinstance(value, np.ndarray):
            raise TypeError(f"input '{name}': expected a NumPy array on device='cpu', got {type(value).__name__}")
        np.copyto(slot, value)

    def fetch(self, slot: np.ndarray, type: TensorType, device_like, stream) -> np.ndarray:
        return slot.copy()

    def default_stream(self):
        return None
