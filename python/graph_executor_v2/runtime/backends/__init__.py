"""Where a plan's memory lives and how values cross into and out of it: ``reference`` (NumPy, CPU) and ``cuda``.

Both offer the same small face to the executor and the trainer, so neither asks which device it runs on:
``upload`` a parameter (or any buffer that lives across runs), ``allocate`` the arena, carve a ``slot`` (a typed
region) out of it, give a kernel the ``address`` of a slot, ``feed`` a run's input into a slot and ``fetch`` a
result out of one, ``store`` a host array into a buffer, ``to_host`` a buffer, ``copy`` one buffer into another
(captured with a plan on CUDA), ``precompile`` a plan's generated kernels, make the ``streams`` a plan runs on
(with their ``stream_handle``) and turn a caller's stream argument into a handle (``caller_stream``).
``asynchronous`` says whether work is enqueued on streams (ordered by events, captured as CUDA graphs, timed
between events) or done when the call returns. On the CPU a slot is a NumPy view, its address the view itself, and
a stream nothing; on CUDA a slot is a typed ``DeviceArray`` view of the arena, its address a raw pointer, and the
streams non-blocking ``Stream`` objects.
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
