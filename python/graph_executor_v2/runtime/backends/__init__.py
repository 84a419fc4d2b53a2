"""Where a plan's memory lives and how values cross into and out of it: ``reference`` (NumPy, CPU) and ``cuda``.

Both offer the same small face to the executor: ``upload`` a parameter, ``allocate`` the arena, carve a ``slot``
(a typed region) out of it, give a kernel the ``address`` of a slot, ``feed`` a run's input into a slot and
``fetch`` a result out of one, and make the ``streams`` a plan runs on (with their ``stream_handle``). On the CPU
a slot is a NumPy view, its address the view itself, and a stream nothing; on CUDA a slot is a typed
``DeviceArray`` view of the arena, its address a raw pointer, and the streams non-blocking ``Stream`` objects.
"""
from .cuda import CudaBackend
from .reference import ReferenceBackend


def backend_for(device: str):
    if device == "cpu":
        return ReferenceBackend()
    if device == "cuda":
        return CudaBackend()
    raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")


__all__ = ["CudaBackend", "ReferenceBackend", "backend_for"]
