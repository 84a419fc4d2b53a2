"""cross_entropy: softmax cross-entropy of ``logits`` (batch, classes) against integer ``labels`` (batch,).

``loss[r] = logsumexp(logits[r]) - logits[r, labels[r]]``, then ``reduction``: ``"none"`` returns the (batch,)
losses, ``"sum"`` their sum and ``"mean"`` their sum divided by the number of labels that are not
``ignore_index`` (a 0-d array; NaN when every label is ignored, as in PyTorch). Rows labelled ``ignore_index`` have
loss 0 and gradient 0. Logits float32/float16/bfloat16 (the loss has their dtype), labels int32/int64; float32 math
with max-subtraction (stable for logits of 1e4). The sum behind "sum"/"mean" is deterministic.

Gradient: ``dlogits[r] = (softmax(logits[r]) - onehot(labels[r])) * upstream[r]`` with ``upstream[r]`` = dloss[r]
("none"), dloss ("sum") or dloss / count ("mean"). One kernel reads each row once and writes its loss and its
gradient: ``forward_backward`` (upstream 1) costs one read and one write of the logits for the whole training step.
The graph op ``cross_entropy_with_grad`` (the training fusion) takes ``float32_loss``: a float32 loss of 16-bit
logits, whose gradient keeps their dtype (mixed precision without float32 copies of the logits).

Labels outside [0, classes) that are not ``ignore_index`` raise ValueError: host arrays are checked before any
device work; on device arrays the kernel checks each label (never reading out of bounds), writes NaN for that row,
and ``check_labels=True`` (the default of the eager functions) waits for the stream and raises. Graph plans launch
with the check off and stay asynchronous: a bad label then shows as NaN.

Kernel candidates (``kernels()``), best first:
1. ``warp_row``: a warp per row held in registers (short rows).
2. ``block_row``: a block per row held in registers (rows up to 65536 float16 / 32768 float32 classes; 16-byte
   aligned, classes a multiple of 16 / itemsize).
3. ``streaming``: a block per row, online max/sum pass then gradient pass: any row length and alignment.
"""
from __future__ import annotations

import numpy as np

from .. import _native
from .. import device as _device
from .. import selection
from ..dtypes import FLOAT_DTYPES, to_numpy
from ..ir.types import TensorType
from . import _layout
from ._base import (Attr, Input, OpDef, Problem, Sample, as_float64, in_ptr, native_launch, out_ptr, register,
                    require_inputs, sample_array, stream_arg, table_candidate)
from ._face import FACES, Face

REDUCTIONS = ("none", "sum", "mean")
LABEL_DTYPES = ("int32", "int64")


def _native_module():
    return _native.load("_ops_cross_entropy")


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes, dtypes and attributes only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def check_problem(logits_shape, logits_dtype, labels_shape, labels_dtype, reduction="mean",
                  ignore_index=-100) -> tuple[int, int]:
    """Validates a cross-entropy problem; returns (rows, classes). Errors name the argument, what was expected and
    what came."""
    if len(logits_shape) != 2:
        raise ValueError(f"logits: expected a 2-d array (batch, classes), got shape {tuple(logits_shape)}")
    if logits_dtype not in FLOAT_DTYPES:
        raise TypeError(f"logits: expected dtype float32, float16 or bfloat16, got {logits_dtype}")
    if labels_dtype not in LABEL_DTYPES:
        raise TypeError(f"labels: expected dtype int32 or int64, got {labels_dtype}")
    rows, classes = logits_shape
    if tuple(labels_shape) != (rows,):
        raise ValueError(f"labels: expected shape ({rows},) (one label per row of logits), got {tuple(labels_shape)}")
    if classes < 1:
        raise ValueError(f"logits: expected at least one class (shape[1] >= 1), got shape {tuple(logits_shape)}")
    _check_attrs(reduction, ignore_index)
    return rows, classes


def _check_attrs(reduction, ignore_index) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    if not _layout.is_int(ignore_index):
        raise TypeError(f"ignore_index: expected an int, got {type(ignore_index).__name__} ({ignore_index!r})")
    if not -2**63 <= ignore_index < 2**63:
        raise ValueError(f"ignore_index: expected a value that fits int64, got {ignore_index}")


def check_labels(labels: np.ndarray, classes: int, ignore_index: int = -100) -> None:
    """Host labels: every label is ignore_index or in [0, classes); ValueError naming the first bad row."""
    labels = np.asarray(labels)
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= classes))
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(f"labels: label {int(labels[row])} at row {row} is outside [0, {classes}) and is not "
                         f"ignore_index ({ignore_index})")


def loss_shape(rows: int, reduction: str) -> tuple:
    return (rows,) if reduction == "none" else ()


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def _softmax_parts(x: np.ndarray):
    """(softmax, logsumexp) per row, max-subtracted."""
    row_max = x.max(axis=1, keepdims=True)
    exps = np.exp(x - row_max)
    sums = exps.sum(axis=1, keepdims=True)
    return exps / sums, (row_max + np.log(sums))[:, 0]


def _count(labels, ignore_index) -> int:
    return int(np.count_nonzero(labels != ignore_index))


def reference(logits, labels, reduction="mean", ignore_index=-100) -> np.ndarray:
    """The loss in float64: (rows,) for "none", 0-d otherwise."""
    x = as_float64(logits)
    labels = np.asarray(labels).astype(np.int64)
    check_problem(x.shape, "float32", labels.shape, "int64", reduction, ignore_index)
    check_labels(labels, x.shape[1], ignore_index)
    ignored = labels == ignore_index
    safe = np.where(ignored, 0, labels)
    _, lse = _softmax_parts(x)
    rows = np.where(ignored, 0.0, lse - x[np.arange(x.shape[0]), safe])
    if reduction == "none":
        return rows
    if reduction == "sum":
        return np.asarray(rows.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(rows.sum() / np.float64(_count(labels, ignore_index)))


def reference_backward(dloss, logits, labels, reduction="mean", ignore_index=-100) -> np.ndarray:
    """d(loss)/d(logits) in float64 for an upstream gradient ``dloss`` ((rows,) for "none", 0-d otherwise)."""
    x = as_float64(logits)
    labels = np.asarray(labels).astype(np.int64)
    check_problem(x.shape, "float32", labels.shape, "int64", reduction, ignore_index)
    check_labels(labels, x.shape[1], ignore_index)
    dloss = as_float64(dloss)
    if dloss.shape != loss_shape(x.shape[0], reduction):
        raise ValueError(f"dloss: expected shape {loss_shape(x.shape[0], reduction)}, got {dloss.shape}")
    ignored = labels == ignore_index
    if reduction == "none":
        upstream = dloss
    elif reduction == "sum":
        upstream = np.full(x.shape[0], float(dloss))
    else:
        count = _count(labels, ignore_index)
        upstream = np.full(x.shape[0], float(dloss) / count if count else 0.0)
    softmax, _ = _softmax_parts(x)
    grad = softmax
    grad[np.arange(x.shape[0])[~ignored], labels[~ignored]] -= 1.0
    grad *= upstream[:, None]
    grad[ignored] = 0.0
    return grad


# ---------------------------------------------------------------------------------------------------------------
# Python face: generated (ops/_face.py), plus the fused ``forward_backward``. ``check_labels`` (default True) waits
# for the stream to raise on a bad label; host labels are checked before any upload.
# ---------------------------------------------------------------------------------------------------------------
def _device_problem(logits, labels, reduction, ignore_index):
    views = _layout.input_views({"logits": logits, "labels": labels})
    vlogits, vlabels = views["logits"], views["labels"]
    rows, classes = check_problem(vlogits.shape, vlogits.dtype, vlabels.shape, vlabels.dtype, reduction,
                                  ignore_index)
    return vlogits, vlabels, rows, classes


def _kernel(requested: str, classes: int, dtype: str, *pointers: int) -> str:
    """The kernel for a native call on rows of ``classes`` logits at ``pointers`` (logits, and dlogits when
    written): ``requested``, or for "auto" the selector's choice (the rows are vectorizable when every pointer is
    16-byte aligned and the classes divide into 16-byte packs)."""
    vectorizable = classes % (16 // to_numpy(dtype).itemsize) == 0 and not any(pointer % 16 for pointer in pointers)
    native = _native_module()
    return selection.table_kernel("_ops_cross_entropy", requested,
                                  lambda name: native.unsupported_reason(name, classes, dtype, vectorizable), dtype)


def _forward(inputs, attrs, kernel, out, stream, check_labels=True):
    """The loss as an array of logits' kind (or ``out``)."""
    logits, labels = inputs
    reduction, ignore_index = attrs["reduction"], attrs["ignore_index"]
    vlogits, vlabels, rows, classes = _device_problem(logits, labels, reduction, ignore_index)
    loss, vloss = _layout.output(out, logits, "out", loss_shape(rows, reduction), vlogits.dtype, vlogits.device)
    kernel = _kernel(kernel, classes, vlogits.dtype, vlogits.ptr)
    _native_module().forward(vlogits.ptr, vlabels.ptr, vloss.ptr, 0, rows, classes, vlogits.dtype, vlabels.dtype,
                             reduction, ignore_index, kernel, bool(check_labels), _device.stream_handle(stream))
    return loss


def forward_backward(logits, labels, reduction="mean", ignore_index=-100, kernel="auto", out=None, stream=None, *,
                     check_labels=True):
    """The fused training step on device arrays: (loss, dlogits), dlogits the gradient of the loss for an upstream
    gradient of 1, in one pass over the logits. ``out``: (loss, dlogits) arrays to write."""
    attrs = OP.validate_attrs({"reduction": reduction, "ignore_index": ignore_index}, "cross_entropy.forward_backward")
    FACES["cross_entropy"]._check_kernel(kernel)
    vlogits, vlabels, rows, classes = _device_problem(logits, labels, attrs["reduction"], attrs["ignore_index"])
    loss_out, dlogits_out = (None, None) if out is None else out
    loss, vloss = _layout.output(loss_out, logits, "out[0]", loss_shape(rows, attrs["reduction"]), vlogits.dtype,
                                 vlogits.device)
    dlogits, vdlogits = _layout.output(dlogits_out, logits, "out[1]", (rows, classes), vlogits.dtype,
                                       vlogits.device)
    _layout.check_no_overlap(vdlogits, "out[1]", vlogits, "logits")
    kernel = _kernel(kernel, classes, vlogits.dtype, vlogits.ptr, vdlogits.ptr)
    _native_module().forward(vlogits.ptr, vlabels.ptr, vloss.ptr, vdlogits.ptr, rows, classes, vlogits.dtype,
                             vlabels.dtype, attrs["reduction"], attrs["ignore_index"], kernel, bool(check_labels),
                             _device.stream_handle(stream))
    return loss, dlogits


def forward_backward_numpy(logits, labels, reduction="mean", ignore_index=-100, kernel="auto"):
    """``forward_backward`` on host arrays (runs on the GPU): (loss, dlogits) as NumPy arrays."""
    where = "cross_entropy.forward_backward_numpy"
    attrs = OP.validate_attrs({"reduction": reduction, "ignore_index": ignore_index}, where)
    inputs = [logits, labels]
    OP.infer(FACES["cross_entropy"]._host_types(inputs, ["logits", "labels"]), attrs)
    _check_host_labels(inputs, attrs)
    FACES["cross_entropy"]._check_kernel(kernel)
    _device.require_gpu(where)
    loss, dlogits = forward_backward(_layout.to_device(logits), _layout.to_device(labels), **attrs, kernel=kernel,
                                     check_labels=False)
    return loss.numpy(), dlogits.numpy()


def _backward(dy, inputs, attrs, kernel, out, stream, check_labels=True):
    """(dlogits, None): d(loss)/d(logits) scaled by dy (the loss's shape, the logits' dtype), the softmax
    recomputed from the logits; integer labels have no gradient."""
    logits, labels = inputs
    reduction, ignore_index = attrs["reduction"], attrs["ignore_index"]
    vlogits, vlabels, rows, classes = _device_problem(logits, labels, reduction, ignore_index)
    vdy = _layout.checked_view(dy, "dy", loss_shape(rows, reduction), vlogits.dtype, vlogits.device)
    dlogits, vdlogits = _layout.output(None if out is None else out[0], logits, "out[0]", (rows, classes),
                                       vlogits.dtype, vlogits.device)
    _layout.check_no_overlap(vdlogits, "out[0]", vlogits, "logits")
    kernel = _kernel(kernel, classes, vlogits.dtype, vlogits.ptr, vdlogits.ptr)
    _native_module().backward(vdy.ptr, vlogits.ptr, vlabels.ptr, vdlogits.ptr, rows, classes, vlogits.dtype,
                              vlabels.dtype, reduction, ignore_index, kernel, bool(check_labels),
                              _device.stream_handle(stream))
    return dlogits, None


def _check_host_labels(inputs, attrs):
    check_labels(inputs[1], inputs[0].shape[1], attrs["ignore_index"])


# ---------------------------------------------------------------------------------------------------------------
# Op definition: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _infer(in_types, attrs):
    logits, labels = in_types
    require_inputs(in_types, ("logits", "labels"))
    if logits.rank != 2:
        raise ValueError(f"logits: expected a 2-d array (batch, classes), got {logits}")
    if logits.dtype not in FLOAT_DTYPES:
        raise TypeError(f"logits: expected dtype float32, float16 or bfloat16, got {logits.dtype}")
    if labels.dtype not in LABEL_DTYPES:
        raise TypeError(f"labels: expected dtype int32 or int64, got {labels.dtype}")
    if labels.rank != 1:
        raise ValueError(f"labels: expected a 1-d array (one label per row of logits), got {labels}")
    rows, classes = logits.shape
    if isinstance(rows, int) and isinstance(labels.shape[0], int) and labels.shape[0] != rows:
        raise ValueError(f"labels: expected shape ({rows},) (one label per row of logits), got {labels.shape}")
    if isinstance(classes, int) and classes < 1:
        raise ValueError(f"logits: expected at least one class (shape[1] >= 1), got {logits}")
    _check_attrs(attrs["reduction"], attrs["ignore_index"])
    return [TensorType(loss_shape(rows, attrs["reduction"]), logits.dtype)]


def _reference(inputs, attrs):
    return [reference(inputs[0], inputs[1], attrs["reduction"], attrs["ignore_index"])]


def _reference_backward(inputs, outputs, out_grads, attrs):
    return [reference_backward(out_grads[0], inputs[0], inputs[1], attrs["reduction"], attrs["ignore_index"]), None]


def _candidate(name):
    def supports(problem: Problem):
        logits = problem.in_types[0]
        vector = 16 // to_numpy(logits.dtype).itemsize
        # Plan buffers are contiguous and 256-byte aligned: rows are aligned when classes divide into packs.
        reason = _native_module().unsupported_reason(name, logits.shape[1], logits.dtype,
                                                     logits.shape[1] % vector == 0)
        return reason or None

    def prepare(problem: Problem):
        logits, labels = problem.in_types
        rows, classes = logits.shape
        dtype, label_dtype = logits.dtype, labels.dtype
        reduction, ignore_index = problem.attrs["reduction"], int(problem.attrs["ignore_index"])
        return native_launch(_native_module().forward, in_ptr(0), in_ptr(1), out_ptr(0), 0, rows, classes, dtype,
                             label_dtype, reduction, ignore_index, name, False, stream_arg())

    return table_candidate("_ops_cross_entropy", name, supports, prepare)


OP = register(OpDef(
    name="cross_entropy",
    samples=lambda rng: [Sample((sample_array(rng, 4, 5), rng.integers(0, 5, 4)), {"reduction": "sum"})],
    inputs=(Input("logits"), Input("labels")),
    outputs=("loss",),
    attrs=(
        Attr("reduction", str, "mean", choices=REDUCTIONS),
        Attr("ignore_index", int, -100, doc="label value whose rows have no loss and no gradient"),
    ),
    infer=_infer,
    reference=_reference,
    reference_backward=_reference_backward,
    candidates=(
        _candidate("warp_row"),
        _candidate("block_row"),
        _candidate("streaming"),
    ),
    doc=__doc__,
))
globals().update(Face(OP, _backward, forward=_forward, extras={"check_labels": True}, forward_extras=_forward,
                      saved={"check_labels": True}, host_check=_check_host_labels).functions())


# ---------------------------------------------------------------------------------------------------------------
# Grad rule: ``cross_entropy_backward(dloss, logits, labels) -> dlogits`` (the softmax recomputed from the logits),
# the native backward; labels get no gradient.
# ---------------------------------------------------------------------------------------------------------------
from . import _grad  # noqa: E402  (the grad section stays separate from the face above)
from ._base import attach_grad  # noqa: E402


def _infer_backward(in_types, attrs):
    dloss, logits, labels = in_types
    (loss,) = _infer([logits, labels], attrs)
    if dloss != loss:
        raise ValueError(f"dloss: expected {loss} (the loss type), got {dloss}")
    return [logits]


def _problem_args(logits, labels, attrs) -> tuple:
    """(rows, classes, dtype, label dtype, reduction, ignore_index) as the native calls take them."""
    rows, classes = logits.shape
    return rows, classes, logits.dtype, labels.dtype, attrs["reduction"], int(attrs["ignore_index"])


def _plan_kernel(args: tuple) -> str:
    """The kernel of a plan's launch (its buffers are 256-byte aligned) for these ``_problem_args``."""
    classes, dtype = args[1], args[2]
    return _kernel("auto", classes, dtype)


def _prepare_backward(problem: Problem):
    args = _problem_args(*problem.in_types[1:], problem.attrs)
    # labels unchecked (False): checking them would synchronize the step.
    return native_launch(_native_module().backward, in_ptr(0), in_ptr(1), in_ptr(2), out_ptr(0), *args,
                         _plan_kernel(args), False, stream_arg())


BACKWARD_OP = _grad.register_backward(OpDef(
    name="cross_entropy_backward",
    inputs=(Input("dloss"), Input("logits"), Input("labels")),
    outputs=("dlogits",),
    attrs=OP.attrs,
    infer=_infer_backward,
    reference=lambda inputs, attrs: [reference_backward(*inputs, attrs["reduction"], attrs["ignore_index"])],
    candidates=(_grad.native_candidate("_ops_cross_entropy", "softmax minus one-hot, scaled by dloss",
                                       _prepare_backward),),
    doc="cross_entropy_backward(dloss, logits, labels) -> dlogits",
))

attach_grad(OP, lambda g, node, dys: [g.cross_entropy_backward(dys[0], *node.inputs, **node.attrs), None])


def _infer_with_grad(in_types, attrs):
    if attrs["reduction"] == "none":
        raise ValueError("reduction: cross_entropy_with_grad computes the gradient of a scalar loss; expected "
                         "'mean' or 'sum', got 'none'")
    (loss,) = _infer(in_types[:2], attrs)
    if attrs["float32_loss"]:
        loss = TensorType(loss.shape, "float32")
    return [loss, in_types[0]]


def _prepare_with_grad(problem: Problem):
    args = _problem_args(*problem.in_types, problem.attrs)
    loss_dtype = problem.out_types[0].dtype
    # labels unchecked (False): checking them would synchronize the step.
    return native_launch(_native_module().forward, in_ptr(0), in_ptr(1), out_ptr(0), out_ptr(1), *args,
                         _plan_kernel(args), False, stream_arg(), loss_dtype)


# The loss and its gradient w.r.t. the logits (upstream gradient 1) in one pass over the logits: what the training
# fusion ``fuse_loss_gradient`` turns a cross_entropy + cross_entropy_backward(seed 1) pair into. With
# ``float32_loss`` the loss is float32 for 16-bit logits (mixed precision: the loss of float32-cast logits and their
# gradient cast back, from the 16-bit logits in one pass, without the two float32 copies of the logits).
WITH_GRAD_OP = _grad.register_backward(OpDef(
    name="cross_entropy_with_grad",
    inputs=(Input("logits"), Input("labels")),
    outputs=("loss", "dlogits"),
    attrs=(*OP.attrs, Attr("float32_loss", bool, False,
                           doc="the loss in float32 whatever the logits' dtype (dlogits keeps the logits' dtype)")),
    infer=_infer_with_grad,
    reference=lambda inputs, attrs: [reference(*inputs, attrs["reduction"], attrs["ignore_index"]),
                                     reference_backward(np.ones(()), *inputs, attrs["reduction"],
                                                        attrs["ignore_index"])],
    candidates=(_grad.native_candidate("_ops_cross_entropy", "loss and dlogits in one pass over the logits",
                                       _prepare_with_grad),),
    doc="cross_entropy_with_grad(logits, labels) -> (loss, dlogits): a scalar loss and its gradient (upstream 1)",
))
