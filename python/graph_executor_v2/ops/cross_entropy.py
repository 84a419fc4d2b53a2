"""cross_entropy: softmax cross-entropy of ``logits`` (batch, classes) against integer ``labels`` (batch,).

``loss[r] = logsumexp(logits[r]) - logits[r, labels[r]]``, then ``reduction``: ``"none"`` returns the (batch,)
losses, ``"sum"`` their sum and ``"mean"`` their sum divided by the number of labels that are not
``ignore_index`` (a 0-d array; NaN when every label is ignored, as in PyTorch). Rows labelled ``ignore_index`` have
loss 0 and gradient 0. Logits float32/float16/bfloat16 (the loss has their dtype), labels int32/int64; float32 math
with max-subtraction (stable for logits of 1e4). The sum behind "sum"/"mean" is deterministic.

Gradient: ``dlogits[r] = (softmax(logits[r]) - onehot(labels[r])) * upstream[r]`` with ``upstream[r]`` = dloss[r]
("none"), dloss ("sum") or dloss / count ("mean"). One kernel reads each row once and writes its loss and its
gradient: ``forward_backward`` (upstream 1) costs one read and one write of the logits for the whole training step.

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
from ..dtypes import FLOAT_DTYPES, to_numpy
from ..ir.types import TensorType
from . import _layout
from ._base import Attr, Candidate, Input, OpDef, Problem, as_float64, register

REDUCTIONS = ("none", "sum", "mean")
LABEL_DTYPES = ("int32", "int64")
KERNELS = ("auto", "warp_row", "block_row", "streaming")


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


def _check_kernel(kernel):
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {', '.join(KERNELS)}, got {kernel!r}")


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
# Python face
# ---------------------------------------------------------------------------------------------------------------
def _host_problem(logits, labels, reduction, ignore_index, kernel):
    logits_dtype, labels_dtype = _layout.host_dtype(logits, "logits"), _layout.host_dtype(labels, "labels")
    rows, classes = check_problem(logits.shape, logits_dtype, labels.shape, labels_dtype, reduction, ignore_index)
    _check_kernel(kernel)
    check_labels(labels, classes, ignore_index)
    return rows, classes


def forward_numpy(logits, labels, reduction="mean", ignore_index=-100, kernel="auto") -> np.ndarray:
    """Host arrays in, the loss as a host array out ((rows,) for "none", 0-d otherwise). Runs on the GPU."""
    _host_problem(logits, labels, reduction, ignore_index, kernel)
    _device.require_gpu("cross_entropy.forward_numpy")
    loss = forward(_layout.to_device(logits), _layout.to_device(labels), reduction, ignore_index, kernel,
                   check_labels=False)
    return loss.numpy()


def forward_backward_numpy(logits, labels, reduction="mean", ignore_index=-100, kernel="auto"):
    """Host arrays in: (loss, dlogits) as host arrays, dlogits for an upstream gradient of 1."""
    _host_problem(logits, labels, reduction, ignore_index, kernel)
    _device.require_gpu("cross_entropy.forward_backward_numpy")
    loss, dlogits = forward_backward(_layout.to_device(logits), _layout.to_device(labels), reduction, ignore_index,
                                     kernel, check_labels=False)
    return loss.numpy(), dlogits.numpy()


def backward_numpy(dloss, logits, labels, reduction="mean", ignore_index=-100, kernel="auto") -> np.ndarray:
    """Host arrays in: dlogits as a host array. ``dloss`` has the loss's shape and the logits' dtype."""
    rows, _ = _host_problem(logits, labels, reduction, ignore_index, kernel)
    dloss_dtype = _layout.host_dtype(dloss, "dloss")
    _check_dloss(dloss.shape, dloss_dtype, rows, _layout.host_dtype(logits, "logits"), reduction)
    _device.require_gpu("cross_entropy.backward_numpy")
    dlogits = backward(_layout.to_device(dloss), _layout.to_device(logits), _layout.to_device(labels), reduction,
                       ignore_index, kernel, check_labels=False)
    return dlogits.numpy()


def _check_dloss(shape, dtype, rows, logits_dtype, reduction):
    expected = loss_shape(rows, reduction)
    if tuple(shape) != expected:
        raise ValueError(f"dloss: expected shape {expected} (the shape of the {reduction!r} loss), got {tuple(shape)}")
    if dtype != logits_dtype:
        raise TypeError(f"dloss: expected dtype {logits_dtype} (the dtype of logits), got {dtype}")


def _device_problem(logits, labels, reduction, ignore_index, kernel):
    vlogits, vlabels = _device.view_of(logits, "logits"), _device.view_of(labels, "labels")
    rows, classes = check_problem(vlogits.shape, vlogits.dtype, vlabels.shape, vlabels.dtype, reduction,
                                  ignore_index)
    _check_kernel(kernel)
    for name, view in (("logits", vlogits), ("labels", vlabels)):
        if not view.is_contiguous:
            raise ValueError(f"{name}: expected a contiguous array, got strides {view.strides} for shape "
                             f"{tuple(view.shape)}")
    _layout.check_device(vlabels, vlogits.device, "labels")
    return vlogits, vlabels, rows, classes


def forward(logits, labels, reduction="mean", ignore_index=-100, kernel="auto", out=None, stream=None,
            check_labels=True):
    """Device arrays (DeviceArray, torch, CuPy) in, the loss out as the same kind of array as ``logits`` (``out``
    is written when given). ``check_labels`` waits for the stream to raise on a bad label."""
    vlogits, vlabels, rows, classes = _device_problem(logits, labels, reduction, ignore_index, kernel)
    loss, vloss = _layout.output(out, logits, "out", loss_shape(rows, reduction), vlogits.dtype, vlogits.device)
    _native_module().forward(vlogits.ptr, vlabels.ptr, vloss.ptr, 0, rows, classes, vlogits.dtype, vlabels.dtype,
                             reduction, int(ignore_index), kernel, bool(check_labels), _device.stream_handle(stream))
    return loss


def forward_backward(logits, labels, reduction="mean", ignore_index=-100, kernel="auto", loss_out=None,
                     dlogits_out=None, stream=None, check_labels=True):
    """The fused training step: (loss, dlogits) with dlogits the gradient of the loss (upstream 1), computed in one
    pass over the logits."""
    vlogits, vlabels, rows, classes = _device_problem(logits, labels, reduction, ignore_index, kernel)
    loss, vloss = _layout.output(loss_out, logits, "loss_out", loss_shape(rows, reduction), vlogits.dtype,
                                 vlogits.device)
    dlogits, vdlogits = _layout.output(dlogits_out, logits, "dlogits_out", (rows, classes), vlogits.dtype,
                                       vlogits.device)
    _layout.check_no_overlap(vdlogits, "dlogits_out", vlogits, "logits")
    _native_module().forward(vlogits.ptr, vlabels.ptr, vloss.ptr, vdlogits.ptr, rows, classes, vlogits.dtype,
                             vlabels.dtype, reduction, int(ignore_index), kernel, bool(check_labels),
                             _device.stream_handle(stream))
    return loss, dlogits


def backward(dloss, logits, labels, reduction="mean", ignore_index=-100, kernel="auto", out=None, stream=None,
             check_labels=True):
    """Device arrays in: dlogits = d(loss)/d(logits) scaled by ``dloss`` (the loss's shape, the logits' dtype),
    recomputing the softmax from the logits."""
    vlogits, vlabels, rows, classes = _device_problem(logits, labels, reduction, ignore_index, kernel)
    vdloss = _device.view_of(dloss, "dloss")
    _check_dloss(vdloss.shape, vdloss.dtype, rows, vlogits.dtype, reduction)
    _layout.check_device(vdloss, vlogits.device, "dloss")
    dlogits, vdlogits = _layout.output(out, logits, "out", (rows, classes), vlogits.dtype, vlogits.device)
    _layout.check_no_overlap(vdlogits, "out", vlogits, "logits")
    _native_module().backward(vdloss.ptr, vlogits.ptr, vlabels.ptr, vdlogits.ptr, rows, classes, vlogits.dtype,
                              vlabels.dtype, reduction, int(ignore_index), kernel, bool(check_labels),
                              _device.stream_handle(stream))
    return dlogits


def kernels() -> list[dict]:
    """The candidates with their constraints, as the native module reports them."""
    return _native_module().kernels()


# ---------------------------------------------------------------------------------------------------------------
# Op definition: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
def _infer(in_types, attrs):
    logits, labels = in_types
    for name, t in (("logits", logits), ("labels", labels)):
        if t is None:
            raise ValueError(f"input '{name}' is required")
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


def _candidate(name, priority, description, always_works=False):
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
        native_forward = _native_module().forward

        def launch(ins, outs, stream):
            native_forward(ins[0], ins[1], outs[0], 0, rows, classes, dtype, label_dtype, reduction, ignore_index,
                           name, False, stream)

        return launch

    return Candidate(name, priority, description, supports, prepare, always_works)


OP = register(OpDef(
    name="cross_entropy",
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
        _candidate("warp_row", 30, "a warp per row, row in registers: one read of the logits"),
        _candidate("block_row", 20, "a block per row, row in registers: one read of the logits"),
        _candidate("streaming", 10, "a block per row, online max/sum then gradient pass: any row",
                   always_works=True),
    ),
    doc=__doc__,
))


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


def _prepare_backward(problem: Problem):
    _, logits, labels = problem.in_types
    rows, classes = logits.shape
    dtype, label_dtype = logits.dtype, labels.dtype
    reduction, ignore_index = problem.attrs["reduction"], int(problem.attrs["ignore_index"])
    native_backward = _native_module().backward

    def launch(ins, outs, stream):  # labels unchecked: checking them would synchronize the step
        native_backward(ins[0], ins[1], ins[2], outs[0], rows, classes, dtype, label_dtype, reduction, ignore_index,
                        "auto", False, stream)

    return launch


BACKWARD_OP = register(OpDef(
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
