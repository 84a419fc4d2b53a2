"""dropout: ``y = x * mask / (1 - p)`` with a mask from the counter-based Philox4x32-10 generator.

The mask depends only on (``seed``, ``offset``, element index), never on how the work is launched: element
``e = offset + i`` (i the flat index into x) takes word ``e % 4`` of
``philox4x32_10(counter=(e // 4 low 32 bits, e // 4 high 32 bits, 0, 0), key=(seed low 32 bits, seed high 32 bits))``
and is kept when that word is below ``floor((1 - p) * 2**32)``. ``keep_mask`` computes the same mask in NumPy,
so GPU results are checked element by element. ``p`` in [0, 1) (p = 0 is the identity), ``seed`` in [0, 2**64),
``offset`` >= 0 (give successive calls disjoint offsets, or new seeds, for independent masks).

Backward is the same operation on dy (``dx = dy * mask / (1 - p)``), the mask regenerated from (seed, offset):
nothing is stored between forward and backward. Dropped elements are multiplied by 0 (a NaN or infinite input
gives NaN, as in the reference). x may be float32/float16/bfloat16 of any shape; float32 math.

The op is registered as not pure: passes never fold or merge it, so a runtime may re-seed it per step.

Kernel candidates (``kernels()``), best first:
1. ``vec16``: 16-byte loads and stores (offset a multiple of 4, 16-byte aligned arrays).
2. ``scalar``: element by element: any offset and alignment.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _native
from .. import device as _device
from .. import selection
from ..dtypes import FLOAT_DTYPES
from ..ir.types import TensorType
from . import _layout
from ._base import (Attr, Input, OpDef, Problem, Sample, as_float64, in_ptr, native_launch, out_ptr, register,
                    sample_array, stream_arg, table_candidate)
from ._face import Face

_MASK32 = np.uint64(0xFFFFFFFF)
_ROUND_MULTIPLIERS = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_KEY_INCREMENTS = (np.uint64(0x9E3779B9), np.uint64(0xBB67AE85))


def _native_module():
    return _native.load("_ops_dropout")


# ---------------------------------------------------------------------------------------------------------------
# Philox4x32-10 and the mask, in NumPy (vectorized, uint64 arithmetic on 32-bit words).
# ---------------------------------------------------------------------------------------------------------------
def philox4x32_10(counter, key) -> tuple[np.ndarray, ...]:
    """Philox4x32-10 of ``counter`` (4 words) under ``key`` (2 words); each word an int or an array of them
    (broadcast together). Returns the 4 output words as uint32 arrays."""
    c0, c1, c2, c3 = (np.asarray(word, dtype=np.uint64) & _MASK32 for word in counter)
    k0, k1 = (np.asarray(word, dtype=np.uint64) & _MASK32 for word in key)
    for round_index in range(10):
        if round_index:
            k0 = (k0 + _KEY_INCREMENTS[0]) & _MASK32
            k1 = (k1 + _KEY_INCREMENTS[1]) & _MASK32
        product0 = _ROUND_MULTIPLIERS[0] * c0  # 32 x 32 bits: exact in uint64
        product1 = _ROUND_MULTIPLIERS[1] * c2
        c0, c1, c2, c3 = ((product1 >> np.uint64(32)) ^ c1 ^ k0, product1 & _MASK32,
                          (product0 >> np.uint64(32)) ^ c3 ^ k1, product0 & _MASK32)
    return tuple(np.asarray(word, dtype=np.uint32) for word in np.broadcast_arrays(c0, c1, c2, c3))


def keep_threshold(p: float) -> int:
    """An element is kept when its Philox word is below this: floor((1 - p) * 2**32), in double as the GPU does."""
    return int(math.floor((1.0 - p) * 4294967296.0))


def keep_mask(count: int, p: float, seed: int, offset: int = 0) -> np.ndarray:
    """The boolean keep mask of elements offset .. offset + count - 1, exactly as the kernels draw it."""
    check_attrs(p, seed, offset, count)
    if count == 0:
        return np.zeros(0, dtype=bool)
    first_group, last_group = offset // 4, (offset + count - 1) // 4
    groups = np.arange(first_group, last_group + 1, dtype=np.uint64)
    words = philox4x32_10((groups & _MASK32, groups >> np.uint64(32), 0, 0), (seed & 0xFFFFFFFF, seed >> 32))
    per_element = np.stack(words, axis=1).reshape(-1)  # element 4 * g + j is words[j][g]
    start = offset - 4 * first_group
    return per_element[start:start + count].astype(np.uint64) < np.uint64(keep_threshold(p))


# ---------------------------------------------------------------------------------------------------------------
# Validation: attributes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def _p_problem(p) -> str | None:
    return None if 0.0 <= p < 1.0 else "must satisfy 0 <= p < 1"


def _seed_problem(seed) -> str | None:
    return None if 0 <= seed < 2**64 else "must be in [0, 2**64)"


def _offset_problem(offset) -> str | None:
    return None if 0 <= offset < 2**64 else "must be in [0, 2**64)"


def check_attrs(p, seed, offset=0, count=0) -> None:
    """Raises TypeError/ValueError naming p, seed or offset."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"p: expected a float, got {type(p).__name__} ({p!r})")
    if not 0.0 <= p < 1.0:  # NaN fails too
        raise ValueError(f"p: expected 0 <= p < 1, got {p!r}")
    for name, value, problem in (("seed", seed, _seed_problem), ("offset", offset, _offset_problem)):
        if not _layout.is_int(value):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__} ({value!r})")
        if problem(value):
            raise ValueError(f"{name}: expected a value in [0, 2**64), got {value}")
    if offset + count > 2**64:
        raise ValueError(f"offset: offset + element count ({offset} + {count}) exceeds 2**64, the Philox counter "
                         "space")


def _check_dtype(dtype, argument):
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{argument}: expected dtype float32, float16 or bfloat16, got {dtype}")


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def reference(x, p, seed, offset=0) -> np.ndarray:
    x = as_float64(x)
    mask = keep_mask(x.size, p, seed, offset).reshape(x.shape)
    return x * mask / (1.0 - p)


def reference_backward(dy, p, seed, offset=0) -> np.ndarray:
    """dx for the forward with the same (p, seed, offset): the same masked scaling of dy."""
    return reference(dy, p, seed, offset)


# ---------------------------------------------------------------------------------------------------------------
# Python face: generated (ops/_face.py); forward is one candidate launch (``out=x`` runs in place), backward
# regenerates the mask here.
# ---------------------------------------------------------------------------------------------------------------
def kernel_for(requested: str, offset: int, aligned: bool, dtype: str) -> str:
    """The kernel of a native forward or backward call: ``requested``, or for "auto" the selector's choice
    (``aligned``: both arrays 16-byte aligned)."""
    native = _native_module()
    return selection.table_kernel("_ops_dropout", requested,
                                  lambda name: native.unsupported_reason(name, offset, aligned), dtype)


def _backward(dy, inputs, attrs, kernel, out, stream):
    """(dx,): dy * mask / (1 - p), the forward's mask regenerated from (seed, offset); ``out=(dy,)`` runs in
    place."""
    vx = _device.view_of(inputs[0], "x")
    view = _layout.checked_view(dy, "dy", tuple(vx.shape), vx.dtype, vx.device)
    dx, vdx = _layout.output(None if out is None else out[0], dy, "out[0]", tuple(view.shape), view.dtype,
                             view.device)
    if vdx.ptr != view.ptr:  # in place is fine (each element is read and written by one thread); partial overlap not
        _layout.check_no_overlap(vdx, "out[0]", view, "dy")
    kernel = kernel_for(kernel, attrs["offset"], not (view.ptr | vdx.ptr) % 16, view.dtype)
    _native_module().backward(view.ptr, vdx.ptr, _layout.numel(view.shape), view.dtype, attrs["p"], attrs["seed"],
                              attrs["offset"], kernel, _device.stream_handle(stream))
    return (dx,)


# ---------------------------------------------------------------------------------------------------------------
# Op definition: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _infer(in_types, attrs):
    (x,) = in_types
    if x is None:
        raise ValueError("input 'x' is required")
    _check_dtype(x.dtype, "x")
    if x.is_concrete:
        check_attrs(attrs["p"], attrs["seed"], attrs["offset"], x.numel)
    return [TensorType(x.shape, x.dtype)]


def _reference(inputs, attrs):
    return [reference(inputs[0], attrs["p"], attrs["seed"], attrs["offset"])]


def _reference_backward(inputs, outputs, out_grads, attrs):
    return [reference_backward(out_grads[0], attrs["p"], attrs["seed"], attrs["offset"])]


def _candidate(name):
    def supports(problem: Problem):
        # Plan buffers are contiguous and 256-byte aligned, so only the offset decides.
        return _native_module().unsupported_reason(name, problem.attrs["offset"], True) or None

    def prepare(problem: Problem):
        x = problem.in_types[0]
        count, dtype = x.numel, x.dtype
        p, seed, offset = float(problem.attrs["p"]), int(problem.attrs["seed"]), int(problem.attrs["offset"])
        return native_launch(_native_module().forward, in_ptr(0), out_ptr(0), count, dtype, p, seed, offset, name,
                             stream_arg())

    return table_candidate("_ops_dropout", name, supports, prepare)


OP = register(OpDef(
    name="dropout",
    samples=lambda rng: [Sample((sample_array(rng, 4, 8),), {"p": 0.25, "seed": 3})],
    inputs=(Input("x"),),
    outputs=("y",),
    attrs=(
        Attr("p", float, check=_p_problem, doc="drop probability, 0 <= p < 1"),
        Attr("seed", int, check=_seed_problem, doc="Philox key, 0 <= seed < 2**64"),
        Attr("offset", int, 0, check=_offset_problem, doc="counter offset of element 0"),
    ),
    infer=_infer,
    reference=_reference,
    reference_backward=_reference_backward,
    candidates=(
        _candidate("vec16"),
        _candidate("scalar"),
    ),
    doc=__doc__,
    pure=False,
))
globals().update(Face(OP, _backward, in_place=True).functions())


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: the backward is the same masked scaling (same p, seed, offset) applied to dy: the forward op itself.
# ---------------------------------------------------------------------------------------------------------------
from ._base import attach_grad  # noqa: E402  (the grad section stays separate from the face above)

attach_grad(OP, lambda g, node, dys: [g.dropout(dys[0], **node.attrs)])
