"""embedding: ``y[..., :] = table[ids[...], :]`` for a (vocab, dim) table and ids of any shape (int32/int64);
``y`` has shape ``ids.shape + (dim,)`` and the table's dtype (float32/float16/bfloat16).

Backward: ``dtable`` (vocab, dim) is the scatter-add of the rows of ``dy`` by id (rows no id names are 0),
accumulated in float32 and bitwise deterministic: ids are stably radix-sorted on the GPU and every sum runs in a
fixed order (no float atomics). Its workspace (held by the native module per stream) is about 16 bytes per id plus
``count * dim / 16`` float32 of partial sums.

Ids outside [0, vocab) raise ValueError: host arrays are checked before any device work; on device arrays the
kernels check every id (never reading out of bounds; forward writes a NaN row, backward skips the row) and
``check_ids=True`` (the default of the eager functions) waits for the stream and raises. Graph plans launch with
the check off and stay asynchronous.

Kernel candidates (``kernels()``), best first:
1. ``vec16``: 16-byte loads and stores, a power-of-two group of lanes per row (dim a multiple of 16 / itemsize).
2. ``scalar``: element by element: any dim, any alignment.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from .. import selection
from ..dtypes import FLOAT_DTYPES
from ..ir.types import TensorType
from . import _layout
from ._base import (Input, OpDef, Problem, Sample, as_float64, in_ptr, native_launch, out_ptr, register, require_inputs,
                    sample_array, stream_arg, table_candidate)
from ._face import Face

ID_DTYPES = ("int32", "int64")


def _native_module():
    return _native.load("_ops_embedding")


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes and dtypes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def check_problem(table_shape, table_dtype, ids_shape, ids_dtype) -> tuple[int, int, int]:
    """Validates an embedding lookup; returns (vocab, dim, number of ids)."""
    if len(table_shape) != 2:
        raise ValueError(f"table: expected a 2-d array (vocab, dim), got shape {tuple(table_shape)}")
    if table_dtype not in FLOAT_DTYPES:
        raise TypeError(f"table: expected dtype float32, float16 or bfloat16, got {table_dtype}")
    vocab, dim = table_shape
    if vocab < 1 or dim < 1:
        raise ValueError(f"table: expected vocab >= 1 and dim >= 1, got shape {tuple(table_shape)}")
    if ids_dtype not in ID_DTYPES:
        raise TypeError(f"ids: expected dtype int32 or int64, got {ids_dtype}")
    if len(ids_shape) + 1 > _layout.MAX_RANK:
        raise ValueError(f"ids: expected rank <= {_layout.MAX_RANK - 1} (the output adds a dim), got shape "
                         f"{tuple(ids_shape)}")
    return vocab, dim, _layout.numel(ids_shape)


def check_ids(ids: np.ndarray, vocab: int) -> None:
    """Host ids: every id in [0, vocab); ValueError naming the first bad one and its (flat) position."""
    flat = np.asarray(ids).reshape(-1)
    bad = (flat < 0) | (flat >= vocab)
    if bad.any():
        position = int(np.argmax(bad))
        raise ValueError(f"ids: id {int(flat[position])} at position {position} is outside [0, {vocab})")


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def reference(table, ids) -> np.ndarray:
    table = as_float64(table)
    ids = np.asarray(ids)
    check_ids(ids, table.shape[0])
    return table[ids.astype(np.int64)]


def reference_backward(dy, ids, vocab: int) -> np.ndarray:
    """dtable (vocab, dim) in float64: the rows of dy added by id."""
    dy = as_float64(dy)
    ids = np.asarray(ids)
    check_ids(ids, vocab)
    dtable = np.zeros((vocab, dy.shape[-1]))
    np.add.at(dtable, ids.reshape(-1).astype(np.int64), dy.reshape(-1, dy.shape[-1]))
    return dtable


# ---------------------------------------------------------------------------------------------------------------
# Python face: generated (ops/_face.py). ``check_ids`` (default True) waits for the stream to raise on an id
# outside [0, vocab); host ids are checked before any upload.
# ---------------------------------------------------------------------------------------------------------------
def _forward(inputs, attrs, kernel, out, stream, check_ids=True):
    """``table[ids]`` as an array of table's kind (or ``out``)."""
    views = _layout.input_views(dict(zip(("table", "ids"), inputs)))
    vtable, vids = views["table"], views["ids"]
    vocab, dim, count = check_problem(vtable.shape, vtable.dtype, vids.shape, vids.dtype)
    y, vy = _layout.output(out, inputs[0], "out", tuple(vids.shape) + (dim,), vtable.dtype, vtable.device)
    _layout.check_no_overlap(vy, "out", vtable, "table")
    native, aligned = _native_module(), not (vtable.ptr | vy.ptr) % 16
    kernel = selection.table_kernel("_ops_embedding", kernel,
                                    lambda name: native.unsupported_reason(name, dim, vtable.dtype, aligned),
                                    vtable.dtype)
    native.forward(vtable.ptr, vids.ptr, vy.ptr, vocab, dim, count, vtable.dtype, vids.dtype, kernel, bool(check_ids),
                   _device.stream_handle(stream))
    return y


def _backward(dy, inputs, attrs, kernel, out, stream, check_ids=True):
    """(dtable, None): the deterministic scatter-add of dy's rows by id (``out[0]`` is overwritten when given);
    integer ids have no gradient."""
    views = _layout.input_views({"dy": dy, "table": inputs[0], "ids": inputs[1]})
    vdy, vtable, vids = views["dy"], views["table"], views["ids"]
    vocab, dim, count = check_problem(vtable.shape, vtable.dtype, vids.shape, vids.dtype)
    _layout.checked_view(dy, "dy", tuple(vids.shape) + (dim,), vtable.dtype, vtable.device)
    dtable, vdtable = _layout.output(None if out is None else out[0], dy, "out[0]", (vocab, dim), vdy.dtype,
                                     vdy.device)
    _layout.check_no_overlap(vdtable, "out[0]", vdy, "dy")
    _native_module().backward(vdy.ptr, vids.ptr, vdtable.ptr, vocab, dim, count, vdy.dtype, vids.dtype,
                              bool(check_ids), _device.stream_handle(stream))
    return dtable, None


def _check_host_ids(inputs, attrs):
    check_ids(inputs[1], inputs[0].shape[0])


# ---------------------------------------------------------------------------------------------------------------
# Op definition: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _infer(in_types, attrs):
    table, ids = in_types
    require_inputs(in_types, ("table", "ids"))
    if table.rank != 2:
        raise ValueError(f"table: expected a 2-d array (vocab, dim), got {table}")
    if table.dtype not in FLOAT_DTYPES:
        raise TypeError(f"table: expected dtype float32, float16 or bfloat16, got {table.dtype}")
    if ids.dtype not in ID_DTYPES:
        raise TypeError(f"ids: expected dtype int32 or int64, got {ids.dtype}")
    if ids.rank + 1 > _layout.MAX_RANK:
        raise ValueError(f"ids: expected rank <= {_layout.MAX_RANK - 1} (the output adds a dim), got {ids}")
    vocab, dim = table.shape
    for name, extent in (("vocab", vocab), ("dim", dim)):
        if isinstance(extent, int) and extent < 1:
            raise ValueError(f"table: expected {name} >= 1, got {table}")
    return [TensorType(tuple(ids.shape) + (dim,), table.dtype)]


def _reference(inputs, attrs):
    return [reference(inputs[0], inputs[1])]


def _reference_backward(inputs, outputs, out_grads, attrs):
    table, ids = inputs
    return [reference_backward(out_grads[0], ids, np.shape(table)[0]), None]


def _candidate(name):
    def supports(problem: Problem):
        table = problem.in_types[0]
        # Plan buffers are contiguous and 256-byte aligned, so alignment holds; only dim decides.
        return _native_module().unsupported_reason(name, table.shape[1], table.dtype, True) or None

    def prepare(problem: Problem):
        table, ids = problem.in_types
        vocab, dim = table.shape
        count = ids.numel
        dtype, id_dtype = table.dtype, ids.dtype
        return native_launch(_native_module().forward, in_ptr(0), in_ptr(1), out_ptr(0), vocab, dim, count, dtype,
                             id_dtype, name, False, stream_arg())

    return table_candidate("_ops_embedding", name, supports, prepare)


OP = register(OpDef(
    name="embedding",
    samples=lambda rng: [Sample((sample_array(rng, 7, 5), rng.integers(0, 7, (2, 3))))],
    inputs=(Input("table"), Input("ids")),
    outputs=("y",),
    attrs=(),
    infer=_infer,
    reference=_reference,
    reference_backward=_reference_backward,
    candidates=(
        _candidate("vec16"),
        _candidate("scalar"),
    ),
    doc=__doc__,
))
globals().update(Face(OP, _backward, forward=_forward, extras={"check_ids": True}, forward_extras=_forward,
                      saved={"check_ids": True}, host_check=_check_host_ids).functions())


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: ``embedding_backward(dy, ids) -> dtable``, the native deterministic scatter-add; ids get none.
# ---------------------------------------------------------------------------------------------------------------
from . import _grad  # noqa: E402  (the grad section stays separate from the face above)
from ._base import Attr, attach_grad  # noqa: E402


def _infer_backward(in_types, attrs):
    dy, ids = in_types
    vocab = attrs["vocab"]
    (y,) = _infer([TensorType((vocab, dy.shape[-1]), dy.dtype), ids], {})
    if dy != y:
        raise ValueError(f"dy: expected {y} (the embedding's output type), got {dy}")
    return [TensorType((vocab, dy.shape[-1]), dy.dtype)]


def _prepare_backward(problem: Problem):
    dy, ids = problem.in_types
    vocab, dim, count = problem.attrs["vocab"], dy.shape[-1], ids.numel
    dtype, ids_dtype = dy.dtype, ids.dtype
    # ids unchecked (False): checking them would synchronize the step.
    return native_launch(_native_module().backward, in_ptr(0), in_ptr(1), out_ptr(0), vocab, dim, count, dtype,
                         ids_dtype, False, stream_arg())


BACKWARD_OP = _grad.register_backward(OpDef(
    name="embedding_backward",
    inputs=(Input("dy"), Input("ids")),
    outputs=("dtable",),
    attrs=(Attr("vocab", int, check=lambda v: None if v >= 1 else "must be >= 1"),),
    infer=_infer_backward,
    reference=lambda inputs, attrs: [reference_backward(inputs[0], inputs[1], attrs["vocab"])],
    candidates=(_grad.native_candidate("_ops_embedding", "deterministic scatter-add of dy's rows by id",
                                       _prepare_backward),),
    doc="embedding_backward(dy, ids) -> dtable (vocab, dim)",
))


def _grad_embedding(g, node, dys):
    table, ids = node.inputs
    vocab = table.type.shape[0]
    if not isinstance(vocab, int):
        raise ValueError(f"{node.where()}: the table's vocab {vocab!r} must be concrete for its gradient")
    return [g.embedding_backward(dys[0], ids, vocab=vocab), None]


attach_grad(OP, _grad_embedding)
