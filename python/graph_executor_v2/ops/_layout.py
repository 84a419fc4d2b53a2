"""Helpers shared by the data-movement ops (transpose/reshape, slice, concat): axis and index arguments, exact
references, and the checks on device arrays they take and return; and the argument checks of elementwise ops whose
inputs share one shape and dtype (the ops ``new-op`` generates, out-of-tree ops). Nothing here launches device
work."""
from __future__ import annotations

import numpy as np

from .. import device as _device
from ..dtypes import ALL_DTYPES, FLOAT_DTYPES, itemsize, normalize

MAX_RANK = 8  # what the native modules take (TensorView's kMaxDims)


def exact(x: np.ndarray) -> np.ndarray:
    """A reference's working copy: float64 for float dtypes (exact for float16/bfloat16/float32), the array itself
    for integers (int64 values above 2^53 would not survive float64)."""
    x = np.asarray(x)
    return x if np.issubdtype(x.dtype, np.integer) else x.astype(np.float64)


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def int_tuple(value, argument: str) -> tuple[int, ...]:
    """A list/tuple of ints as a tuple of Python ints; TypeError naming ``argument`` otherwise."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{argument}: expected a list or tuple of ints, got {type(value).__name__} ({value!r})")
    for item in value:
        if not is_int(item):
            raise TypeError(f"{argument}: expected ints, got {type(item).__name__} ({item!r}) in {tuple(value)!r}")
    return tuple(int(item) for item in value)


def ints_check(value) -> str | None:
    """Attr check: every entry an int."""
    return None if all(is_int(item) for item in value) else "must hold only ints"


def normalize_axis(axis, rank: int, argument: str) -> int:
    """``axis`` in [-rank, rank) as a non-negative axis."""
    if not is_int(axis):
        raise TypeError(f"{argument}: expected an int, got {type(axis).__name__} ({axis!r})")
    if not -rank <= axis < rank:
        raise ValueError(f"{argument}: axis {axis} is out of range for rank {rank} (expected {-rank} to {rank - 1})")
    return int(axis) % rank


def check_rank(rank: int, argument: str) -> None:
    if rank > MAX_RANK:
        raise ValueError(f"{argument}: expected rank <= {MAX_RANK}, got rank {rank}")


def check_dtype(dtype: str, argument: str) -> str:
    if dtype not in ALL_DTYPES:
        raise TypeError(f"{argument}: expected one of {', '.join(ALL_DTYPES)}, got {dtype}")
    return dtype


def host_dtype(x, argument: str) -> str:
    """The GE2 dtype name of a NumPy array argument of forward_numpy/backward_numpy."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{argument}: expected a NumPy array, got {type(x).__name__}")
    return normalize(x.dtype, argument)


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, running = [], 1
    for extent in reversed(tuple(shape)):
        strides.append(running)
        running *= extent
    return tuple(reversed(strides))


def numel(shape) -> int:
    count = 1
    for extent in shape:
        count *= extent
    return count


def to_device(x: np.ndarray):
    """A contiguous DeviceArray copy of a host array (0-d stays 0-d, which np.ascontiguousarray would not keep)."""
    return _device.runtime().DeviceArray.from_numpy(np.require(x, requirements="C"))


def checked_view(array, argument: str, shape: tuple, dtype: str, device: int):
    """The view of ``array`` after checking its shape, dtype, contiguity and device; errors name ``argument``."""
    view = _device.view_of(array, argument)
    if tuple(view.shape) != tuple(shape):
        raise ValueError(f"{argument}: expected shape {tuple(shape)}, got {tuple(view.shape)}")
    if view.dtype != dtype:
        raise TypeError(f"{argument}: expected dtype {dtype}, got {view.dtype}")
    if not view.is_contiguous:
        raise ValueError(f"{argument}: expected a contiguous array, got strides {view.strides} for shape "
                         f"{tuple(view.shape)}")
    check_device(view, device, argument)
    return view


def input_views(arrays: dict) -> dict:
    """Zero-copy views of the given device arrays (name -> array), each contiguous and on the device of the
    first; errors name the argument."""
    views = {name: _device.view_of(a, name) for name, a in arrays.items()}
    device = next(iter(views.values())).device
    for name, view in views.items():
        if not view.is_contiguous:
            raise ValueError(f"{name}: expected a contiguous row-major array, got strides {view.strides} for shape "
                             f"{tuple(view.shape)}")
        check_device(view, device, name)
    return views


def output(out, template, argument: str, shape: tuple, dtype: str, device: int):
    """``out`` checked (shape, dtype, contiguous, device), or a new array of ``template``'s kind; returns
    (array, view)."""
    array = out if out is not None else _device.empty_like_kind(template, tuple(shape), dtype, device)
    return array, checked_view(array, argument, shape, dtype, device)


def check_device(view, device: int, argument: str) -> None:
    if view.device != device:
        raise ValueError(f"{argument}: expected an array on cuda:{device} (the device of the first input), got "
                         f"cuda:{view.device}")


def byte_span(view) -> tuple[int, int]:
    """[first, last) byte addresses a strided device view touches (empty when it has no elements)."""
    if numel(view.shape) == 0:
        return view.ptr, view.ptr
    size = itemsize(view.dtype)
    low = high = 0
    for extent, stride in zip(view.shape, view.strides):
        reach = (extent - 1) * stride
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return view.ptr + low * size, view.ptr + (high + 1) * size


def check_no_overlap(output_view, output_argument: str, input_view, input_argument: str) -> None:
    """Out-of-place ops: an output that shares bytes with an input would read values it already overwrote."""
    out_low, out_high = byte_span(output_view)
    in_low, in_high = byte_span(input_view)
    if out_low < in_high and in_low < out_high:
        raise ValueError(f"{output_argument}: must not overlap {input_argument} (the op is not in place)")


# --- elementwise ops: inputs of one shape and dtype (the generated ops of ``new-op`` and out-of-tree ops) ---------
def _one_of(dtypes) -> str:
    return dtypes[0] if len(dtypes) == 1 else f"{', '.join(dtypes[:-1])} or {dtypes[-1]}"


def same_host_arrays(named_arrays, dtypes=FLOAT_DTYPES) -> str:
    """Host arrays ``((name, array), ...)``, every one of the first one's shape and dtype (one of ``dtypes``);
    returns that dtype. Errors name the offending argument."""
    (first_name, first), *rest = named_arrays
    dtype = host_dtype(first, first_name)
    if dtype not in dtypes:
        raise TypeError(f"{first_name}: expected dtype {_one_of(dtypes)}, got {dtype}")
    for name, array in rest:
        if host_dtype(array, name) != dtype:
            raise TypeError(f"{name}: expected dtype {dtype} (the dtype of {first_name}), got {array.dtype}")
        if array.shape != first.shape:
            raise ValueError(f"{name}: expected shape {first.shape} (the shape of {first_name}), got {array.shape}")
    return dtype


def same_device_views(named_arrays, dtypes=FLOAT_DTYPES) -> list:
    """Views of device arrays ``((name, array), ...)``: contiguous, every one of the first one's shape, dtype (one
    of ``dtypes``) and device."""
    first_name, first = named_arrays[0]
    view = _device.view_of(first, first_name)
    if view.dtype not in dtypes:
        raise TypeError(f"{first_name}: expected dtype {_one_of(dtypes)}, got {view.dtype}")
    shape, dtype, device = tuple(view.shape), view.dtype, view.device
    return [checked_view(array, name, shape, dtype, device) for name, array in named_arrays]


def gradient_outputs(out, template, count: int, read_views, shape: tuple, dtype: str, device: int):
    """The ``count`` gradients a backward writes: ``out`` (None, or a tuple with an array or None per gradient)
    checked, the rest allocated like ``template``. None overlaps another or an array the kernel reads
    (``read_views``: (name, view) pairs). Returns (arrays, views)."""
    if out is None:
        out = (None,) * count
    if not isinstance(out, (tuple, list)) or len(out) != count:
        raise TypeError(f"out: expected None or a tuple of {count} arrays or None, got {type(out).__name__}"
                        + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    read_views, arrays, views = list(read_views), [], []
    for index, given in enumerate(out):
        array, view = output(given, template, f"out[{index}]", shape, dtype, device)
        for name, other in read_views + [(f"out[{i}]", v) for i, v in enumerate(views)]:
            check_no_overlap(view, f"out[{index}]", other, name)
        arrays.append(array)
        views.append(view)
    return arrays, views
