"""Device-side interop: GE2's DeviceArray, streams, and zero-copy views of PyTorch and CuPy arrays.

Ops accept any CUDA array: a ``DeviceArray``, a ``torch.Tensor`` on CUDA, a CuPy array, or anything exposing
``__dlpack__`` / ``__cuda_array_interface__``. ``view_of`` turns one into a ``DeviceView`` (address, shape, dtype,
strides) without copying; ops allocate their outputs as the same kind of array as their first input.
"""
from __future__ import annotations

import functools
import sys
from typing import NamedTuple

from . import _native
from .dtypes import ALL_DTYPES, normalize


def runtime():
    """The native ``_runtime`` module."""
    return _native.load("_runtime")


def device_count() -> int:
    """Number of visible CUDA GPUs; 0 when there is none (or the native runtime is not built)."""
    try:
        return runtime().device_count()
    except ImportError:
        return 0


def is_available() -> bool:
    return device_count() > 0


def require_gpu(what: str = "this operation") -> None:
    """Raises RuntimeError with a clear reason when no GPU can run ``what``."""
    if device_count() == 0:
        raise RuntimeError(f"ge2: {what} needs a CUDA GPU, and none is available on this machine")


def __getattr__(name):
    # DeviceArray, Stream, Event, CudaGraph live in the native runtime; load it only when asked for.
    if name in ("DeviceArray", "Stream", "Event", "CudaGraph"):
        return getattr(runtime(), name)
    raise AttributeError(name)


class DeviceView(NamedTuple):
    """A borrowed device array: everything an op launcher needs, nothing that owns memory."""

    ptr: int
    shape: tuple
    dtype: str
    strides: tuple  # in elements
    device: int
    is_contiguous: bool


class _TorchDtypes(dict):
    """torch dtype -> GE2 name, filled on first use (torch is imported only by callers that use it)."""

    def __missing__(self, dtype):
        name = str(dtype).removeprefix("torch.")
        self[dtype] = name if name in ALL_DTYPES else None  # None: normalize() raises the TypeError
        return self[dtype]


_TORCH_DTYPES = _TorchDtypes()


_KINDS: dict[type, str] = {}


def array_kind(array) -> str:
    """Which library an array comes from ("ge2", "torch", "cupy" or "other"), remembered per type (this sits on
    every op call's hot path)."""
    kind = _KINDS.get(type(array))
    if kind is None:
        module = type(array).__module__
        kind = next((k for prefix, k in (("graph_executor_v2", "ge2"), ("torch", "torch"), ("cupy", "cupy"))
                     if module.startswith(prefix)), "other")
        _KINDS[type(array)] = kind
    return kind


def view_of(array, argument: str = "array") -> DeviceView:
    """Zero-copy view of a CUDA array. Raises TypeError naming ``argument`` for host or unsupported objects."""
    kind = array_kind(array)
    if kind == "ge2":
        return DeviceView(*array.view_tuple())
    if kind == "torch":
        device = array.get_device()  # -1 on the CPU
        if device < 0:
            raise TypeError(f"{argument}: expected a CUDA tensor, got a torch tensor on {array.device}")
        return DeviceView(
            array.data_ptr(), tuple(array.shape), _TORCH_DTYPES.get(array.dtype) or normalize(array.dtype, argument),
            array.stride(), device, array.is_contiguous(),
        )
    if kind == "cupy":
        itemsize = array.dtype.itemsize
        return DeviceView(
            array.data.ptr, array.shape, normalize(array.dtype, argument),
            tuple(s // itemsize for s in array.strides), array.device.id, array.flags.c_contiguous,
        )
    on_host = hasattr(array, "__dlpack_device__") and array.__dlpack_device__()[0] != 2  # 2: kDLCUDA
    if not on_host and (hasattr(array, "__cuda_array_interface__") or hasattr(array, "__dlpack__")):
        return DeviceView(*as_device_array(array, argument).view_tuple())
    raise TypeError(
        f"{argument}: expected a CUDA device array (ge2 DeviceArray, torch.Tensor on CUDA, CuPy array), "
        f"got {type(array).__name__}; use forward_numpy for host arrays"
    )


def _torch_signature(array):
    return (array.shape, array.dtype, array.get_device(), array.is_contiguous()), array.data_ptr()


def _ge2_signature(array):
    view = array.view_tuple()
    return view[1:], view[0]


def _cupy_signature(array):
    return (array.shape, array.dtype, array.strides, array.device.id), array.data.ptr


def _other_signature(array):
    view = view_of(array)
    return view[1:], view[0]


_SIGNATURES = {"torch": _torch_signature, "ge2": _ge2_signature, "cupy": _cupy_signature, "other": _other_signature}
_SIGNATURE_OF_TYPE: dict[type, object] = {}


def signature(array) -> tuple[tuple, int]:
    """(key, address): a hashable key of everything but the address that decides whether an op can run on the
    array (shape, dtype, layout, device), and the address. The cheapest query each library offers, chosen once
    per type: op faces call this on every call and validate once per key (with ``view_of``)."""
    function = _SIGNATURE_OF_TYPE.get(type(array))
    if function is None:
        function = _SIGNATURE_OF_TYPE[type(array)] = _SIGNATURES[array_kind(array)]
    return function(array)


def as_device_array(array, argument: str = "array"):
    """A ``DeviceArray`` sharing memory with ``array`` (DeviceArray, DLPack or CUDA-array-interface object)."""
    rt = runtime()
    if isinstance(array, rt.DeviceArray):
        return array
    if hasattr(array, "__dlpack__"):
        if hasattr(array, "__dlpack_device__") and array.__dlpack_device__()[0] != 2:
            raise TypeError(f"{argument}: expected a CUDA array, got one on DLPack device {array.__dlpack_device__()}")
        try:
            capsule = array.__dlpack__(max_version=(1, 1))  # 1.1: the float8 type codes
        except TypeError:  # producers that predate versioned DLPack
            capsule = array.__dlpack__()
        return rt.DeviceArray.from_dlpack_capsule(capsule)
    if hasattr(array, "__cuda_array_interface__"):
        return rt.DeviceArray.from_cuda_array_interface(array)
    raise TypeError(f"{argument}: expected an object with __dlpack__ or __cuda_array_interface__, "
                    f"got {type(array).__name__}")


def empty_like_kind(template, shape: tuple, dtype: str, device: int):
    """An uninitialized output of the same kind as ``template`` (torch in, torch out; CuPy in, CuPy out)."""
    return allocator(template, shape, dtype, device)()


def allocator(template, shape: tuple, dtype: str, device: int):
    """A function of no arguments making uninitialized outputs of ``template``'s kind (torch in, torch out; CuPy in,
    CuPy out; else DeviceArray), the dtype and device looked up here once."""
    kind = array_kind(template)
    shape = tuple(shape)
    if kind == "torch":
        torch = sys.modules["torch"]
        return functools.partial(torch.empty, shape, dtype=getattr(torch, dtype), device=torch.device("cuda", device))
    if kind == "cupy" and dtype != "bfloat16":
        cupy = sys.modules["cupy"]

        def make():  # no reference to the template: a cached allocator must not keep an input alive
            with cupy.cuda.Device(device):
                return cupy.empty(shape, dtype=dtype)

        return make
    return functools.partial(runtime().DeviceArray.empty, list(shape), dtype, device)


@functools.cache
def compute_capability(device: int) -> tuple[int, int]:
    return tuple(runtime().device_properties(device)["compute_capability"])


def stream_handle(stream) -> int:
    """cudaStream_t as an int from None (legacy default stream), an int, a GE2 Stream, torch or CuPy streams."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attribute in ("handle", "cuda_stream", "ptr"):  # GE2, torch, CuPy
        handle = getattr(stream, attribute, None)
        if isinstance(handle, int):
            return handle
    raise TypeError(f"stream: expected None, an int handle, a ge2 Stream, a torch or CuPy stream, "
                    f"got {type(stream).__name__}")
