"""Where a plan's memory lives and how values cross into and out of it: ``reference`` (NumPy, CPU) and ``cuda``.

Both offer the same small face to the executor: ``upload`` a parameter, ``allocate`` the arena, carve a ``slot``
(a typed region) out of it, give a kernel the ``address`` of a slot, ``feed`` a run's input into a slot and
``fetch`` a result out of one. On the CPU a slot is a NumPy view and its address is the view itself; on CUDA a
slot is a borrowed ``DeviceArray`` and its address a raw pointer.
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
