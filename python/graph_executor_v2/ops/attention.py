"""attention: ``y = softmax(scale * q k^T + bias + causal mask) v`` per (batch, head), with the row log-sum-exp saved.

Shapes (``layout``): ``"bhsd"`` is ``[batch, heads, seq, head_dim]``; ``"bshd"`` is ``[batch, seq, heads,
head_dim]``, what a fused QKV projection gives without a transpose. q is ``heads_q`` heads of ``seq_q`` rows; k and v
share ``heads_kv`` heads of ``seq_k`` rows, and ``heads_kv`` divides ``heads_q`` (grouped-query attention: query head
h reads K/V head ``h // (heads_q // heads_kv)``). y has q's shape and dtype; ``lse`` is ``[batch, heads_q, seq_q]``
float32, ``lse[b, h, i] = log(sum_j exp(scale * q_i . k_j))`` over the keys row i sees.

``bias`` (optional) is an additive bias of q's dtype, ``[1 or batch, 1 or heads_q, seq_q, seq_k]`` (broadcast over an
axis of extent 1): a padding mask (0 / -inf or finfo.min per key), a relative position bias (T5), any mask. It has
no gradient here. The cudnn and rowwise kernels take it; flash and unfused decline it.

``causal`` masks with the top-left alignment, PyTorch's ``is_causal``: query row i sees keys ``j <= i`` whatever
seq_q and seq_k are (with seq_q > seq_k the last rows see every key; with seq_q < seq_k the last keys are seen by
no row). ``scale`` defaults to ``1 / sqrt(head_dim)``. float32 softmax statistics and accumulation for every
storage dtype (float32, float16, bfloat16).

``window=(left, right)`` is sliding-window (local) attention, FlashAttention's ``window_size``: query row i sees keys
``i + o - left <= j <= i + o + right`` with ``o = seq_k - seq_q`` (the bottom-right alignment: the last query row
sits over the last key), -1 leaving that side unbounded; ``(-1, -1)`` (the default) is no window. ``causal`` and
``window`` both apply (a key is visible when both let it through): with seq_q == seq_k, ``causal=True`` is the same
as ``right=0``, so ``causal=True, window=(w, -1)`` and ``window=(w, 0)`` are one mask. With seq_q != seq_k the two
alignments differ (causal stays top-left), and the mask is their intersection.

``softcap=c`` (0: off) is logit soft-capping (Gemma 2, FlashAttention's ``softcap``): each scaled score
``s = scale * q_i . k_j`` becomes ``c * tanh(s / c)`` before the bias is added and the mask and softmax apply; the
backward multiplies dS by its derivative ``1 - tanh(s / c)^2``.

A query row with no visible key (a window or a causal mask that hides every key, or a -inf bias on every key) gives
``y = 0`` and ``lse = +inf`` (FlashAttention's convention: ``exp(s - lse)`` is then 0 in the backward, so its
gradients are 0 too).

Backward, from dy and the saved y and lse: ``D_i = dy_i . y_i``, ``P_ij = exp(scale * q_i . k_j - lse_i)``,
``dS_ij = P_ij (dy_i . v_j - D_i)`` (times the soft cap's derivative), ``dq = scale dS k``, ``dk = scale dS^T q``,
``dv = P^T dy`` (dk, dv summed over the query heads of each K/V group). lse carries no gradient: it is a saved
statistic.

Kernel candidates (``kernels()``), in priority order (``auto`` takes the first that applies):
1. ``cudnn``: cuDNN's fused SDPA through the cuDNN frontend (Graph::sdpa, whose row statistics are lse, and
   Graph::sdpa_backward, which reads any candidate's lse), built only where CMake found cuDNN and the frontend
   headers (the nvidia-cudnn-frontend package or GE2_CUDNN_FRONTEND_DIR; ``has_cudnn()``); float16 and bfloat16,
   head_dim a multiple of 8 up to 256, 16-byte aligned arrays; windows through cuDNN's diagonal band (declined: a
   soft cap, rows with no visible key, a window together with causal when seq_q != seq_k, a window with a left
   bound when seq_q > seq_k). Its plans are built once per problem by ``prepare``
   or the first call (never during CUDA graph capture) and timed on the first call; ``auto`` takes the next
   candidate when cuDNN declines a problem.
2. ``flash``: FlashAttention-2 on tensor cores (mma.sync), float16 and bfloat16, head_dim 64 and 128, any length;
   its backward adds dq in float32 atomics.
   ``flash_sm90``: Hopper's wgmma and TMA (CuTe, sm_90a; built where CMake found CUTLASS's headers, run on an sm_90
   GPU): a producer warpgroup loads tiles by TMA into a 2-stage ring, two consumer warpgroups run the products; the
   forward's online softmax is in float32 registers, the backward keeps dk, dv in registers per 128 keys (64 at
   head_dim 256) and adds dq in float32 atomics; float16 and bfloat16, head_dim 64, 128 and 256, any length, causal
   or not (no bias, window or soft cap). It writes and reads the same lse as the others.
3. ``rowwise``: a warp per query row (forward, dq) or key row (dk, dv), float32 online softmax, no tensor cores, no
   cuBLAS and no score scratch; head_dim <= 256, any length.
4. ``unfused``: S = scale q k^T and y = P v on cuBLASLt around a softmax kernel (16-bit P and dS as a high and a
   residual part, so they are not rounded to the input dtype), through a per-stream workspace in chunks of heads and
   query rows; any head_dim, length, dtype and alignment (the path that always works).
"""
from __future__ import annotations

import math

import numpy as np

from .. import _native
from .. import device as _device
from ..dtypes import FLOAT_DTYPES
from ..ir.types import TensorType
from . import _grad, _layout
from ._base import (Attr, Candidate, Input, OpDef, Problem, Sample, as_float64, attach_grad, in_ptr, native_launch,
                    out_ptr, register, require_inputs, sample_array, stream_arg, table_candidate)
from ._face import FACES, Face, choose_launch

LAYOUTS = ("bhsd", "bshd")


def _native_module():
    return _native.load("_ops_attention")


# ---------------------------------------------------------------------------------------------------------------
# Validation: shapes, dtypes and arguments only, so it runs (and is tested) with no GPU.
# ---------------------------------------------------------------------------------------------------------------
def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")


def _scale_problem(scale) -> str | None:
    """Attr check (the type is already a float): what is wrong with ``scale``, or None."""
    return None if math.isfinite(scale) and scale != 0 else "must be finite and nonzero"


def _check_scale(scale):
    if scale is None:
        return
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.integer, np.floating)):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__} ({scale!r})")
    if _scale_problem(float(scale)):
        raise ValueError(f"scale: expected a finite nonzero float or None, got {scale!r}")


def _window_problem(window) -> str | None:
    """Attr check (the type is already a tuple): what is wrong with ``window``, or None."""
    if len(window) != 2 or not all(_layout.is_int(side) and side >= -1 for side in window):
        return "must be (left, right): two ints >= -1 (-1: unbounded)"
    return None


def _softcap_problem(softcap) -> str | None:
    """Attr check (the type is already a float): what is wrong with ``softcap``, or None."""
    return None if math.isfinite(softcap) and softcap >= 0 else "must be finite and >= 0 (0: off)"


def _check_window(window):
    if not isinstance(window, (tuple, list)):
        raise TypeError(f"window: expected a tuple (left, right) of ints, got {type(window).__name__} ({window!r})")
    if _window_problem(tuple(window)):
        raise ValueError(f"window: expected (left, right), two ints >= -1 (-1: unbounded), got {window!r}")


def _check_softcap(softcap):
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, (int, float, np.integer, np.floating)):
        raise TypeError(f"softcap: expected a float, got {type(softcap).__name__} ({softcap!r})")
    if _softcap_problem(float(softcap)):
        raise ValueError(f"softcap: expected a finite float >= 0 (0: off), got {softcap!r}")


def visible_keys(seq_q: int, seq_k: int, causal: bool = False, window=(-1, -1)) -> tuple[np.ndarray, np.ndarray]:
    """(begin, end) per query row: row i sees keys [begin[i], end[i]) (none when end <= begin), the causal mask
    (top-left) and the window (bottom-right) applied together."""
    left, right = (int(side) for side in window)
    rows = np.arange(seq_q, dtype=np.int64)
    diagonal = rows + (seq_k - seq_q)  # the key over query row i, bottom-right aligned
    begin = np.maximum(diagonal - left, 0) if left >= 0 else np.zeros_like(rows)
    end = np.full_like(rows, seq_k)
    if right >= 0:
        end = np.minimum(end, diagonal + right + 1)
    if causal:
        end = np.minimum(end, rows + 1)
    return begin, end


def _dims(shape, layout, argument):
    """(batch, heads, seq, head_dim) of a rank-4 shape in ``layout``."""
    if len(shape) != 4:
        order = "[batch, heads, seq, head_dim]" if layout == "bhsd" else "[batch, seq, heads, head_dim]"
        raise ValueError(f"{argument}: expected a rank-4 array {order} (layout {layout!r}), got shape {tuple(shape)}")
    batch, second, third, head_dim = shape
    return (batch, second, third, head_dim) if layout == "bhsd" else (batch, third, second, head_dim)


def problem_sizes(q_shape, q_dtype, k_shape, k_dtype, v_shape, v_dtype, layout) -> dict:
    """The sizes of an attention problem; raises naming q, k, v or layout when the arrays do not fit together."""
    for name, dtype in (("q", q_dtype), ("k", k_dtype), ("v", v_dtype)):
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name}: expected dtype float32, float16 or bfloat16, got {dtype}")
    for name, dtype in (("k", k_dtype), ("v", v_dtype)):
        if dtype != q_dtype:
            raise TypeError(f"{name}: expected dtype {q_dtype} (the dtype of q), got {dtype}")
    return shape_sizes(q_shape, k_shape, v_shape, layout)


def shape_sizes(q_shape, k_shape, v_shape, layout) -> dict:
    """The sizes from the shapes alone (the float64 reference takes any float dtype)."""
    _check_layout(layout)
    batch, heads_q, seq_q, head_dim = _dims(q_shape, layout, "q")
    k_batch, heads_kv, seq_k, k_head_dim = _dims(k_shape, layout, "k")
    _dims(v_shape, layout, "v")
    if tuple(v_shape) != tuple(k_shape):
        raise ValueError(f"v: expected shape {tuple(k_shape)} (the shape of k), got {tuple(v_shape)}")
    if k_batch != batch:
        raise ValueError(f"k: expected batch {batch} (the batch of q), got {k_batch} in shape {tuple(k_shape)}")
    if k_head_dim != head_dim:
        raise ValueError(f"k: expected head_dim {head_dim} (the head_dim of q), got {k_head_dim} in shape "
                         f"{tuple(k_shape)}")
    for name, shape, sizes in (("q", q_shape, (batch, heads_q, seq_q, head_dim)),
                               ("k", k_shape, (batch, heads_kv, seq_k, head_dim))):
        if any(isinstance(size, int) and size < 1 for size in sizes):
            raise ValueError(f"{name}: expected every size >= 1, got shape {tuple(shape)}")
    if isinstance(heads_q, int) and isinstance(heads_kv, int) and heads_q % heads_kv:
        raise ValueError(f"k: expected a number of heads that divides the {heads_q} heads of q, got {heads_kv} "
                         f"in shape {tuple(k_shape)}")
    return dict(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seq_q=seq_q, seq_k=seq_k, head_dim=head_dim)


def bias_dims(bias_shape, sizes: dict) -> tuple[int, int]:
    """(bias_batch, bias_heads) of an additive bias [1 or batch, 1 or heads_q, seq_q, seq_k]; raises naming bias."""
    expected = f"[1 or {sizes['batch']}, 1 or {sizes['heads_q']}, {sizes['seq_q']}, {sizes['seq_k']}]"
    if len(bias_shape) != 4:
        raise ValueError(f"bias: expected a rank-4 array {expected}, got shape {tuple(bias_shape)}")
    batch, heads, seq_q, seq_k = bias_shape
    if (batch not in (1, sizes["batch"]) or heads not in (1, sizes["heads_q"]) or seq_q != sizes["seq_q"]
            or seq_k != sizes["seq_k"]):
        raise ValueError(f"bias: expected shape {expected}, got {tuple(bias_shape)}")
    return batch, heads


def default_scale(scale, head_dim) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


# ---------------------------------------------------------------------------------------------------------------
# Reference (float64): the oracle of every test and the CPU backend.
# ---------------------------------------------------------------------------------------------------------------
def _heads_first(x, layout):
    return x if layout == "bhsd" else x.transpose(0, 2, 1, 3)


def _probabilities(q, k, causal, scale, bias=None, window=(-1, -1), softcap=0.0):
    """(P, lse, capped) in float64 from [b, h, s, d] q and group-expanded k (plus the broadcast bias); ``capped``:
    the soft-capped scores over the cap, tanh(s / c), for the backward (None without a cap). Rows with no visible
    key: P = 0, lse = +inf."""
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    capped = None
    if softcap:
        capped = np.tanh(scores / softcap)
        scores = softcap * capped
    if bias is not None:
        scores = scores + as_float64(bias)
    seq_q, seq_k = scores.shape[-2:]
    begin, end = visible_keys(seq_q, seq_k, causal, window)
    keys = np.arange(seq_k)
    scores = np.where((keys >= begin[:, None]) & (keys < end[:, None]), scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    empty = peak == -np.inf
    total = np.exp(scores - np.where(empty, 0.0, peak)).sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, np.inf, peak + np.log(total))
    return np.exp(scores - lse), lse[..., 0], capped


def _expanded(q, k, v, layout):
    """q, k, v as float64 [b, h, s, d] with k and v repeated over each group of query heads."""
    q64, k64, v64 = (_heads_first(as_float64(x), layout) for x in (q, k, v))
    group = q64.shape[1] // k64.shape[1]
    return q64, np.repeat(k64, group, axis=1), np.repeat(v64, group, axis=1), group


def _check_reference_arguments(q, k, v, scale, layout, bias, window, softcap):
    sizes = shape_sizes(q.shape, k.shape, v.shape, layout)
    _check_scale(scale)
    _check_window(window)
    _check_softcap(softcap)
    if bias is not None:
        bias_dims(bias.shape, sizes)


def reference(q, k, v, causal=False, scale=None, layout="bhsd", bias=None, window=(-1, -1), softcap=0.0):
    """(y, lse) in float64."""
    _check_reference_arguments(q, k, v, scale, layout, bias, window, softcap)
    q64, k64, v64, _ = _expanded(q, k, v, layout)
    p, lse, _ = _probabilities(q64, k64, causal, default_scale(scale, q64.shape[-1]), bias, window, softcap)
    return _heads_first(p @ v64, layout), lse


def reference_backward(dy, q, k, v, causal=False, scale=None, layout="bhsd", bias=None, window=(-1, -1),
                       softcap=0.0):
    """(dq, dk, dv) in float64, from the exact probabilities (not the rounded y and lse); the bias has none."""
    _check_reference_arguments(q, k, v, scale, layout, bias, window, softcap)
    if tuple(dy.shape) != tuple(q.shape):
        raise ValueError(f"dy: expected shape {tuple(q.shape)} (the shape of q), got {tuple(dy.shape)}")
    q64, k64, v64, group = _expanded(q, k, v, layout)
    dy64 = _heads_first(as_float64(dy), layout)
    scale = default_scale(scale, q64.shape[-1])
    p, _, capped = _probabilities(q64, k64, causal, scale, bias, window, softcap)
    dp = dy64 @ v64.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    if capped is not None:
        ds = ds * (1.0 - capped * capped)  # d(c tanh(s / c)) / ds
    dq = scale * ds @ k64
    dk = scale * ds.transpose(0, 1, 3, 2) @ q64
    dv = p.transpose(0, 1, 3, 2) @ dy64

    def grouped(x):  # sum the expanded heads back onto their K/V head
        b, h, s, d = x.shape
        return x.reshape(b, h // group, group, s, d).sum(axis=2)

    return _heads_first(dq, layout), _heads_first(grouped(dk), layout), _heads_first(grouped(dv), layout)


# ---------------------------------------------------------------------------------------------------------------
# Python face: generated from the OpDef (ops/_face.py); the backward below is the part a definition cannot say.
# ---------------------------------------------------------------------------------------------------------------
def _mask_arguments(attrs) -> dict:
    """The window and soft cap as the native calls take them (their last arguments, after the bias ones)."""
    left, right = attrs.get("window", (-1, -1))
    return dict(window_left=int(left), window_right=int(right), softcap=float(attrs.get("softcap", 0.0)))


def _unsupported_reason(kernel, sizes, dtype, bias, attrs) -> str:
    return _native_module().unsupported_reason(kernel, sizes["head_dim"], dtype, bias, seq_q=sizes["seq_q"],
                                               seq_k=sizes["seq_k"], causal=bool(attrs["causal"]),
                                               **_mask_arguments(attrs))


def _native_sizes(sizes, causal, scale, layout, dtype):
    return dict(batch=sizes["batch"], heads_q=sizes["heads_q"], heads_kv=sizes["heads_kv"], seq_q=sizes["seq_q"],
                seq_k=sizes["seq_k"], head_dim=sizes["head_dim"], seq_major=layout == "bshd",
                scale=default_scale(scale, sizes["head_dim"]), causal=bool(causal), dtype=dtype)


def _bias_sizes(bias_shape, sizes) -> dict:
    """The bias arguments of the native calls (no bias: 0 and 0)."""
    batch, heads = (0, 0) if bias_shape is None else bias_dims(bias_shape, sizes)
    return dict(bias_batch=batch, bias_heads=heads)


def _check_gradient(dy_shape, dy_dtype, q_shape, q_dtype):
    if tuple(dy_shape) != tuple(q_shape):
        raise ValueError(f"dy: expected shape {tuple(q_shape)} (the shape of q), got {tuple(dy_shape)}")
    if dy_dtype != q_dtype:
        raise TypeError(f"dy: expected dtype {q_dtype} (the dtype of q), got {dy_dtype}")


def _check_saved_pair(inputs, attrs, y=None, lse=None):
    """The saved forward results come together (backward_numpy's host check, and the device backward's)."""
    if (y is None) != (lse is None):
        raise ValueError(f"{'lse' if lse is None else 'y'}: expected y and lse together (both saved by the forward), "
                         f"got only {'y' if lse is None else 'lse'}")


def _backward(dy, inputs, attrs, kernel, out, stream, y=None, lse=None):
    """(dq, dk, dv, None) as device arrays of dy's kind (or ``out``'s entries), from dy, the forward inputs and the
    saved y and lse (the forward runs first when they are not given); the bias has no gradient. The kernel is
    attention_backward's candidate named ``kernel``, or the selector's choice for these arrays."""
    q, k, v, bias = inputs
    views = {"dy": dy, "q": q, "k": k, "v": v} | ({} if bias is None else {"bias": bias})
    vdy, vq, vk, vv, *vbias = _layout.input_views(views).values()
    sizes = problem_sizes(vq.shape, vq.dtype, vk.shape, vk.dtype, vv.shape, vv.dtype, attrs["layout"])
    if vbias:
        bias_dims(vbias[0].shape, sizes)
    _check_gradient(vdy.shape, vdy.dtype, vq.shape, vq.dtype)
    _check_saved_pair(inputs, attrs, y, lse)
    if y is None:
        y, lse = FACES["attention"].forward(q, k, v, bias, **attrs, kernel=kernel, stream=stream)
    vy = _layout.checked_view(y, "y", tuple(vq.shape), vq.dtype, vq.device)
    vlse = _layout.checked_view(lse, "lse", (sizes["batch"], sizes["heads_q"], sizes["seq_q"]), "float32", vq.device)
    grads = [_layout.output(None if out is None else out[index], dy, f"out[{index}]", view.shape, view.dtype,
                            vq.device) for index, view in enumerate((vq, vk, vv))]
    in_views = (vdy, vq, vk, vv, vy, vlse, *vbias)
    out_views = tuple(view for _, view in grads)
    problem = Problem(ATTENTION_BACKWARD.name, tuple(TensorType(view.shape, view.dtype) for view in in_views),
                      tuple(TensorType(view.shape, view.dtype) for view in out_views), attrs,
                      _device.compute_capability(vq.device))
    aligned = not any(view.ptr % 16 for view in in_views + out_views)
    _, launch = choose_launch(ATTENTION_BACKWARD, problem, kernel, aligned)
    launch([view.ptr for view in in_views], [view.ptr for view in out_views], _device.stream_handle(stream))
    return (*(array for array, _ in grads), None)


# ---------------------------------------------------------------------------------------------------------------
# Op definitions: what the IR, passes, registry and CPU backend read.
# ---------------------------------------------------------------------------------------------------------------
_ATTRS = (
    Attr("causal", bool, False, doc="mask keys j > i (top-left alignment, PyTorch's is_causal)"),
    Attr("scale", float, None, check=_scale_problem, doc="score scale; None: 1 / sqrt(head_dim)"),
    Attr("layout", str, "bhsd", choices=LAYOUTS, doc="bhsd: [batch, heads, seq, head_dim]; bshd: [batch, seq, "
                                                     "heads, head_dim]"),
    Attr("window", tuple, (-1, -1), check=_window_problem,
         doc="(left, right): row i sees keys i + o - left <= j <= i + o + right, o = seq_k - seq_q; -1: unbounded"),
    Attr("softcap", float, 0.0, check=_softcap_problem, doc="c > 0: scores s become c * tanh(s / c); 0: off"),
)


def _infer_sizes(q, k, v, attrs, bias=None):
    require_inputs((q, k, v), ("q", "k", "v"))
    sizes = problem_sizes(q.shape, q.dtype, k.shape, k.dtype, v.shape, v.dtype, attrs["layout"])
    if bias is not None:
        if bias.dtype != q.dtype:
            raise TypeError(f"bias: expected dtype {q.dtype} (the dtype of q), got {bias.dtype}")
        bias_dims(bias.shape, sizes)
    return sizes


def _optional_bias(values, index: int):
    """The optional bias among an op's inputs (or their types): absent when the list stops before it."""
    return values[index] if len(values) > index else None


def _infer(in_types, attrs):
    q, k, v = in_types[:3]
    sizes = _infer_sizes(q, k, v, attrs, _optional_bias(in_types, 3))
    return [q, TensorType((sizes["batch"], sizes["heads_q"], sizes["seq_q"]), "float32")]


def _infer_backward(in_types, attrs):
    dy, q, k, v, y, lse = in_types[:6]
    sizes = _infer_sizes(q, k, v, attrs, _optional_bias(in_types, 6))
    if dy is None or tuple(dy.shape) != tuple(q.shape) or dy.dtype != q.dtype:
        raise ValueError(f"input 'dy': expected shape {tuple(q.shape)} {q.dtype} (that of q), got "
                         f"{None if dy is None else (tuple(dy.shape), dy.dtype)}")
    if y is None or tuple(y.shape) != tuple(q.shape) or y.dtype != q.dtype:
        raise ValueError(f"input 'y': expected shape {tuple(q.shape)} {q.dtype} (that of q), got "
                         f"{None if y is None else (tuple(y.shape), y.dtype)}")
    lse_shape = (sizes["batch"], sizes["heads_q"], sizes["seq_q"])
    if lse is None or tuple(lse.shape) != lse_shape or lse.dtype != "float32":
        raise ValueError(f"input 'lse': expected shape {lse_shape} float32, got "
                         f"{None if lse is None else (tuple(lse.shape), lse.dtype)}")
    return [q, k, v]


def _reference_rule(inputs, attrs):
    return list(reference(*inputs[:3], **attrs, bias=_optional_bias(inputs, 3)))


def _reference_backward_rule(inputs, outputs, out_grads, attrs):
    return [*reference_backward(out_grads[0], *inputs[:3], **attrs, bias=_optional_bias(inputs, 3)), None]


def _reference_backward_op(inputs, attrs):
    dy, q, k, v = inputs[:4]
    return list(reference_backward(dy, q, k, v, **attrs, bias=_optional_bias(inputs, 6)))


def _bias_input(first_input: int) -> int:
    """The bias' input index: the last input, 3 of the forward (q at 0), 6 of the backward (q at 1, then y, lse)."""
    return 3 if first_input == 0 else 6


def _problem_sizes(problem: Problem, first_input: int):
    q, k, v = problem.in_types[first_input:first_input + 3]
    return _infer_sizes(q, k, v, problem.attrs, _optional_bias(problem.in_types, _bias_input(first_input)))


def _supports(problem: Problem, first_input: int, kernel: str):
    sizes = _problem_sizes(problem, first_input)
    bias = _optional_bias(problem.in_types, _bias_input(first_input)) is not None
    return _unsupported_reason(kernel, sizes, problem.in_types[first_input].dtype, bias, problem.attrs) or None


def has_cudnn() -> bool:
    """Whether the cudnn candidate was built (cuDNN and the cuDNN frontend headers found at build time)."""
    return bool(_native_module().has_cudnn)


def _prepare(problem: Problem, first_input: int, native_call: str, kernel: str):
    """The launch of the native ``forward`` or ``backward`` (``native_call``) with q at input ``first_input``.
    cudnn builds its plans here: RuntimeError when cuDNN has no engine, so that the registry takes the next
    candidate."""
    problem_sizes_ = _problem_sizes(problem, first_input)
    sizes = _native_sizes(problem_sizes_, problem.attrs["causal"], problem.attrs["scale"], problem.attrs["layout"],
                          problem.in_types[first_input].dtype)
    bias_index = _bias_input(first_input)
    bias_type = _optional_bias(problem.in_types, bias_index)
    bias_sizes = _bias_sizes(None if bias_type is None else bias_type.shape, problem_sizes_)
    mask = _mask_arguments(problem.attrs)
    _native_module().prepare(kernel, **sizes, backward=native_call == "backward", **bias_sizes, **mask)
    native = getattr(_native_module(), native_call)
    # In the binding's order, the bias (the last input), then the window and soft cap at the end: positional
    # arguments convert faster.
    bias = in_ptr(bias_index) if bias_type is not None else 0
    return native_launch(native, *map(in_ptr, range(bias_index)), *map(out_ptr, range(len(problem.out_types))),
                         *sizes.values(), kernel, stream_arg(), bias, *bias_sizes.values(), *mask.values())


# The kernels, best first; priorities, descriptions and alignments are in the native kernels() table (launcher.cu).
_KERNELS = ("cudnn", "flash", "flash_sm90", "rowwise", "unfused")


def _candidates(first_input: int, native_call: str) -> tuple[Candidate, ...]:
    """cudnn where it was built and applies, else flash, else flash_sm90, else rowwise, else unfused (head_dim >
    256); autotuning and explicit use may pick any (the forward OpDef reads q at input 0, the backward at 1)."""
    return tuple(table_candidate("_ops_attention", name,
                                 lambda problem, name=name: _supports(problem, first_input, name),
                                 lambda problem, name=name: _prepare(problem, first_input, native_call, name))
                 for name in _KERNELS)


def _attention_flops(in_types, out_types, attrs) -> float:
    """Two matmuls (QK^T and PV) of 2 * head_dim FLOPs per query head and score; every score of the problem, half
    of them under a causal mask of a square problem (FlashAttention's count), the visible ones under a window."""
    sizes = _infer_sizes(*in_types[:3], attrs)
    per_score = 4.0 * sizes["batch"] * sizes["heads_q"] * sizes["head_dim"]
    window = tuple(attrs.get("window", (-1, -1)))
    if window != (-1, -1) and all(isinstance(sizes[name], int) for name in ("seq_q", "seq_k")):
        begin, end = visible_keys(sizes["seq_q"], sizes["seq_k"], attrs["causal"], window)
        return per_score * float(np.maximum(end - begin, 0).sum())
    flops = per_score * sizes["seq_q"] * sizes["seq_k"]
    return flops / 2 if attrs["causal"] and sizes["seq_q"] == sizes["seq_k"] else flops


ATTENTION = register(OpDef(
    name="attention",
    samples=lambda rng: [Sample((sample_array(rng, 1, 2, 3, 8), sample_array(rng, 1, 1, 5, 8),
                                 sample_array(rng, 1, 1, 5, 8)), {"causal": True},
                                "grouped heads (2 query heads per key head), causal, seq_q < seq_k"),
                         Sample((sample_array(rng, 1, 2, 6, 8), sample_array(rng, 1, 2, 9, 8),
                                 sample_array(rng, 1, 2, 9, 8)), {"window": (2, 1), "softcap": 2.0},
                                "sliding window (bottom-right aligned, seq_q < seq_k) and soft cap")],
    flops=_attention_flops,
    inputs=(Input("q"), Input("k"), Input("v"), Input("bias", optional=True)),
    outputs=("y", "lse"),
    attrs=_ATTRS,
    infer=_infer,
    reference=_reference_rule,
    reference_backward=_reference_backward_rule,
    candidates=_candidates(0, "forward"),
    doc=__doc__,
))

# The gradient computation as an op of its own: dy and the saved values in, (dq, dk, dv) out.
ATTENTION_BACKWARD = _grad.register_backward(OpDef(
    name="attention_backward",
    flops=lambda in_types, out_types, attrs: 2.5 * _attention_flops(in_types[1:4], out_types, attrs),  # 5 matmuls
    inputs=(Input("dy"), Input("q"), Input("k"), Input("v"), Input("y"), Input("lse"), Input("bias", optional=True)),
    outputs=("dq", "dk", "dv"),
    attrs=_ATTRS,
    infer=_infer_backward,
    reference=_reference_backward_op,
    candidates=_candidates(1, "backward"),
    doc="attention's gradients (dq, dk, dv) from dy, the forward inputs (the bias has no gradient) and the saved y "
        "and lse.",
))

# Grad rule: the saved y and lse feed the backward, so nothing is recomputed.
attach_grad(ATTENTION, lambda g, node, dys: [*g.attention_backward(dys[0], *node.inputs[:3], *node.outputs,
                                                                   node.inputs[3], **node.attrs), None])

# The face, ``ge2.ops.attention.forward / forward_numpy / backward / backward_numpy / kernels / prepare``: forward
# returns (y, lse); backward takes dy (the gradient of y; lse has none) and the saved y and lse by keyword.
globals().update(Face(ATTENTION, _backward, saved=("y", "lse"), backward_host_check=_check_saved_pair).functions())
