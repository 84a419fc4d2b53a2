"""FP8 GEMMs and convolutions: inference on calibrated scales (``ExecutorV2(..., precision="fp8")``, ``quantize``)
and training on delayed scaling (``Trainer(..., amp="fp8")``, ``train_rewrite``, GEMMs only).

Inference: GEMMs and convolutions whose weight is a parameter run as ``quantize_fp8`` + ``scaled_gemm`` /
``scaled_conv2d`` on calibrated per-tensor scales.

Per GEMM ``y = act(x @ W + bias)`` (a ``gemm`` node after fusion):
- the activation x is quantized to E4M3 on the device with ``x_scale = 448 / (amax_x * 2**margin)``, amax_x the
  largest ``|x|`` seen over the calibration feeds (static scaling: the scale is a parameter of the plan);
- the weight is quantized once, on the host, with its own amax, and stored transposed as [n, k] (cuBLASLt's FP8
  layout, the "TN" rule: the transpose is arranged here once, not per call);
- ``scaled_gemm`` multiplies them with the reciprocal scales, adds the bias (stored in bfloat16, float16 for a
  float16 output: cuBLASLt's FP8 bias types) and applies relu/gelu in its epilogue; its output keeps x's dtype, or,
  when the next FP8 GEMM alone reads it, is that GEMM's E4M3 input directly (cuBLASLt's scaled FP8 output: no
  quantize between the two, and one rounding instead of two).

A GEMM stays as it is, with its reason in the notes (``explain()``), when it has no parameter weight, a residual or
alpha != 1, an activation cuBLASLt's FP8 epilogue lacks (silu, leaky_relu), or k or n not a multiple of 16.

Per convolution ``y = clip(act(conv(x, w) + bias + residual))`` (a ``conv2d`` node after fusion), NHWC with groups 1,
C and K multiples of 16, float16/bfloat16 activations and a parameter weight: x is quantized to E4M3 on the device
with its calibrated static scale as a GEMM's, w once on the host (its [K, R, S, C] layout is cuDNN's), and
``scaled_conv2d`` convolves them with the reciprocal scales and the whole epilogue in float32 in one cuDNN graph,
writing x's dtype. A convolution outside those rules stays as it is with its reason, and so does one for which
cuDNN has no FP8 engine (the ``engine_reason`` callback: ``scaled_conv2d.unsupported_reason``, which the executor
passes when it calibrates on the GPU), with cuDNN's reason.
The scales and FP8 weights are parameters of the rewritten graph, so ``ExecutorV2.save`` keeps them with the plan.

Training (Transformer Engine's recipe): see ``train_rewrite`` and ``DelayedScaling``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..dtypes import FLOAT8_MAX, FLOAT_DTYPES, itemsize, saturate_to_float8, to_numpy
from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ir.schema import Problem
from ..ops import scaled_conv2d
from ..ops.scaled_gemm import ACTIVATIONS as FP8_ACTIVATIONS
from ..ops.scaled_gemm import bias_dtype_for

FP8_INFERENCE_DTYPE = "float8_e4m3fn"
FP8_OPS = ("scaled_gemm", "scaled_conv2d")  # what an FP8 inference graph holds once calibrated
SITE_OPS = ("gemm", "conv2d")
CONV_DTYPES = ("float16", "bfloat16")

# problem -> why the GPU cannot run that scaled_conv2d (None: it can); the executor's on the GPU
EngineReason = Callable[[Problem], "str | None"]


def site_reason(graph: Graph, node: Node) -> str | None:
    """Why ``node`` (a gemm or a conv2d) cannot run in FP8 (None when it can)."""
    if node.op == "conv2d":
        return _conv_site_reason(node)
    if node.op != "gemm":
        return "not a gemm or a conv2d"
    a, w, _, c = node.inputs
    attrs = node.attrs
    if not w.is_param:
        return "the weight is not a parameter (only constant weights are quantized ahead of time)"
    if c is not None or attrs["alpha"] != 1.0:
        return "a residual input or alpha != 1 (scaled_gemm has neither)"
    if attrs["act"] not in FP8_ACTIVATIONS:
        return f"activation {attrs['act']} has no cuBLASLt FP8 epilogue (none, relu, gelu)"
    if attrs["trans_a"] or a.type.rank != 2 or a.type.dtype not in FLOAT_DTYPES:
        return "the activation is not a row-major 2-d float matrix"
    k, n = (w.type.shape[1], w.type.shape[0]) if attrs["trans_b"] else w.type.shape
    if k % 16 or n % 16:
        return f"k={k} and n={n} must be multiples of 16 (cuBLASLt's FP8 rule)"
    return None


def _conv_site_reason(node: Node) -> str | None:
    x, w, _, _ = (list(node.inputs) + [None, None])[:4]
    attrs = node.attrs
    if not w.is_param:
        return "the weight is not a parameter (only constant weights are quantized ahead of time)"
    if x.type.dtype not in CONV_DTYPES:
        return f"the activation is {x.type.dtype}, not 16-bit (float16 or bfloat16)"
    if attrs["layout"] != "NHWC" or attrs["groups"] != 1:
        return f"layout {attrs['layout']}, groups {attrs['groups']}: cuDNN's FP8 convolutions take NHWC, groups 1"
    if not x.type.is_concrete:
        return f"the activation's shape {x.type.shape} is not concrete"
    c, k = x.type.shape[3], w.type.shape[0]
    if c % 16 or k % 16:
        return f"C={c} and K={k} must be multiples of 16 (FP8 channels in 16-byte vectors)"
    return None


def sites(graph: Graph) -> list[tuple[Node, str | None]]:
    """Every gemm and conv2d node of ``graph`` with the reason it stays out of FP8 (None: it can run in FP8)."""
    return [(node, site_reason(graph, node)) for node in graph.nodes if node.op in SITE_OPS]


def scale_for(amax: float, margin: int = 0, dtype: str = FP8_INFERENCE_DTYPE) -> float:
    """The quantization scale that maps ``amax`` to the format's largest value, backed off by ``2**margin``; 1 for
    an amax of 0 or one that is not finite (nothing to scale, or nothing sensible to scale by)."""
    if not np.isfinite(amax) or amax <= 0.0:
        return 1.0
    return float(np.float32(FLOAT8_MAX[dtype] / (amax * 2.0 ** margin)))


def quantize(graph: Graph, activation_amax: dict[str, float], margin: int = 0,
             engine_reason: EngineReason | None = None) -> list[str]:
    """Rewrites every eligible gemm and conv2d of ``graph`` in place (see the module docstring);
    ``activation_amax`` maps the name of each one's activation input to its calibrated amax; ``engine_reason``
    (on the GPU) says why a convolution's ``scaled_conv2d`` cannot run there (it then stays in 16 bits). Returns
    notes, one per gemm and conv2d."""
    found = sites(graph)
    # read before any rewrite: a rewritten node's output (the next one's input) is a new value
    amax_of = {node: activation_amax[node.inputs[0].name] for node, reason in found if reason is None}
    notes = []
    quantized: dict[str, tuple[Value, Value, float]] = {}  # activation name -> its E4M3 value, 1 / scale, scale
    for node, reason in found:
        if reason is not None:
            notes.append(f"{node.name}: stays {node.outputs[0].type.dtype}: {reason}")
        elif node.op == "conv2d":
            notes.append(_rewrite_conv(graph, node, amax_of[node], margin, engine_reason, quantized))
        else:
            notes.append(_rewrite(graph, node, amax_of[node], margin, quantized))
    notes += _chain_fp8_outputs(graph)
    skip_unread_amax(graph)
    return notes


def skip_unread_amax(graph: Graph) -> None:
    """A scaled_gemm whose amax nothing reads does not compute it (with_amax=False: no AMAX_D_POINTER, and no
    reduction over a 16-bit output where cuBLASLt computes none)."""
    users = graph.users()
    for node in graph.nodes:
        if node.op == "scaled_gemm" and not users.get(node.outputs[1]) and not graph.is_output(node.outputs[1]):
            node.attrs["with_amax"] = False


def _chain_fp8_outputs(graph: Graph) -> list[str]:
    """A scaled_gemm whose only reader is the next GEMM's quantize_fp8 writes FP8 itself: its output scale is that
    quantize's scale (cuBLASLt's D scale, rounding once from float32), and the quantize goes. Its bias becomes
    bfloat16 if it was float16 (cuBLASLt's bias type with an FP8 output)."""
    users = graph.users()
    notes = []
    for node in [n for n in graph.nodes if n.op == "quantize_fp8"]:
        source = node.inputs[0].producer
        if source is None or source.op != "scaled_gemm" or source.attrs["out_dtype"] not in FLOAT_DTYPES:
            continue
        if users.get(node.inputs[0]) != [node] or graph.is_output(node.inputs[0]) or graph.is_output(node.outputs[0]):
            continue
        if users.get(node.outputs[1]):  # the amax is read: keep the quantize
            continue
        bias = source.inputs[4]
        if bias is not None and bias.type.dtype != "bfloat16":
            bias = _param(graph, f"{source.name}.fp8.bias", bias.data.astype(to_numpy("bfloat16")))
        _write_for_reader(graph, source, node, node.attrs["dtype"], bias, node.inputs[1])
        notes.append(f"{source.name}: writes {node.attrs['dtype']} for the next GEMM (scale_d = {node.name}'s scale; "
                     f"{node.name} removed)")
    return notes


def _write_for_reader(graph: Graph, gemm: Node, reader: Node, out_dtype: str, bias: Value | None,
                      scale_d: Value | None) -> Value:
    """``gemm`` (a scaled_gemm) rebuilt to write ``out_dtype`` itself (with ``bias`` and ``scale_d``) in place of
    ``reader``, the one node that read its output: both go; the new output takes the reader's uses and the new amax
    the old one's. Returns the new output."""
    a, b, scale_a, scale_b = gemm.inputs[:4]
    with graph.inserting_before(reader):
        y, amax = graph.scaled_gemm(a, b, scale_a, scale_b, bias, scale_d, **{**gemm.attrs, "out_dtype": out_dtype})
    graph.replace_uses(reader.outputs[0], y)
    graph.replace_uses(gemm.outputs[1], amax)
    graph.remove_node(reader)
    graph.remove_node(gemm)
    return y


def _param(graph: Graph, base: str, array) -> Value:
    return graph.param(graph.unique_name(base), np.asarray(array))


def _quantized_activation(graph: Graph, x: Value, x_amax: float, margin: int, prefix: str,
                          quantized: dict) -> tuple[Value, Value, float]:
    """(x in E4M3, 1 / its scale, its scale): one quantize_fp8 per activation, shared by the nodes that read it.
    Call inside ``graph.inserting_before`` the first reader."""
    if x.name not in quantized:
        x_scale = scale_for(x_amax, margin)
        x8, _ = graph.quantize_fp8(x, _param(graph, f"{prefix}.x_scale", np.float32(x_scale)),
                                   dtype=FP8_INFERENCE_DTYPE)
        quantized[x.name] = (x8, _param(graph, f"{prefix}.x_scale_inv", np.float32(1.0) / np.float32(x_scale)),
                             x_scale)
    return quantized[x.name]


def _quantized_weight(weight, margin: int) -> tuple[np.ndarray, float, float]:
    """(E4M3 weight, its amax, its scale): quantized once, on the host."""
    weight = np.asarray(weight, np.float64)
    w_amax = float(np.abs(weight).max()) if weight.size else 0.0
    w_scale = scale_for(w_amax, margin)
    w8 = saturate_to_float8(weight * np.float32(w_scale), FP8_INFERENCE_DTYPE).astype(to_numpy(FP8_INFERENCE_DTYPE))
    return np.ascontiguousarray(w8), w_amax, w_scale


def _conv_problem(node: Node) -> Problem:
    """The scaled_conv2d problem ``node`` (an eligible conv2d) becomes."""
    x, w, bias, residual = (list(node.inputs) + [None, None])[:4]
    scalar = TensorType((), "float32")
    attrs = {attr.name: node.attrs[attr.name] for attr in scaled_conv2d.OP.attrs if attr.name in node.attrs}
    attrs.update(out_dtype=x.type.dtype, with_amax=False)
    in_types = (TensorType(x.type.shape, FP8_INFERENCE_DTYPE), TensorType(w.type.shape, FP8_INFERENCE_DTYPE), scalar,
                scalar, None if bias is None else TensorType(bias.type.shape, bias_dtype_for(x.type.dtype)),
                None if residual is None else residual.type, None)
    return Problem("scaled_conv2d", in_types, tuple(scaled_conv2d.OP.infer(in_types, attrs)), attrs)


def _rewrite_conv(graph: Graph, node: Node, x_amax: float, margin: int, engine_reason: EngineReason | None,
                  quantized: dict) -> str:
    problem = _conv_problem(node)
    declined = engine_reason(problem) if engine_reason is not None else None
    if declined is not None:
        return f"{node.name}: stays {node.outputs[0].type.dtype}: the GPU declines its FP8 convolution: {declined}"
    x, w, bias, residual = (list(node.inputs) + [None, None])[:4]
    out_dtype = problem.attrs["out_dtype"]
    w8, w_amax, w_scale = _quantized_weight(w.data, margin)
    prefix = f"{node.name}.fp8"
    with graph.inserting_before(node):
        x8, x_scale_inv, x_scale = _quantized_activation(graph, x, x_amax, margin, prefix, quantized)
        bias_value = bias
        if bias is not None and bias.type.dtype != problem.in_types[4].dtype:
            bias_value = _param(graph, f"{prefix}.bias", bias.data.astype(to_numpy(problem.in_types[4].dtype)))
        y, _ = graph.scaled_conv2d(x8, _param(graph, f"{prefix}.w", w8), x_scale_inv,
                                   _param(graph, f"{prefix}.w_scale_inv", np.float32(1.0) / np.float32(w_scale)),
                                   bias_value, residual, None, **problem.attrs)
    graph.replace_uses(node.outputs[0], y)
    graph.remove_node(node)
    r, s = w.type.shape[1:3]
    return (f"{node.name}: FP8 E4M3 convolution {r}x{s} [{x.type.shape[3]} -> {w8.shape[0]}] "
            f"act={problem.attrs['act']}, x amax {x_amax:.4g} (scale {x_scale:.4g}), w amax {w_amax:.4g} "
            f"(scale {w_scale:.4g}), output {out_dtype}")


def _rewrite(graph: Graph, node: Node, x_amax: float, margin: int, quantized: dict) -> str:
    x, w, bias, _ = node.inputs
    attrs = node.attrs
    out_dtype = node.outputs[0].type.dtype
    weight = w.data.astype(np.float64)
    w8, w_amax, w_scale = _quantized_weight(weight if attrs["trans_b"] else weight.T, margin)  # [n, k]: the TN layout
    prefix = f"{node.name}.fp8"
    with graph.inserting_before(node):
        x8, x_scale_inv, x_scale = _quantized_activation(graph, x, x_amax, margin, prefix, quantized)
        w8_value = _param(graph, f"{prefix}.w", w8)
        bias_value = None
        if bias is not None:
            bias_dtype = bias_dtype_for(out_dtype)
            bias_value = bias if bias.type.dtype == bias_dtype else _param(
                graph, f"{prefix}.bias", bias.data.astype(to_numpy(bias_dtype)))
        y, _ = graph.scaled_gemm(x8, w8_value, x_scale_inv,
                                 _param(graph, f"{prefix}.w_scale_inv", np.float32(1.0) / np.float32(w_scale)),
                                 bias_value, None, act=attrs["act"], out_dtype=out_dtype)
    graph.replace_uses(node.outputs[0], y)
    graph.remove_node(node)
    return (f"{node.name}: FP8 E4M3 GEMM [{x.type.shape[-1]} -> {w8.shape[0]}] act={attrs['act']}, x amax {x_amax:.4g} "
            f"(scale {x_scale:.4g}), w amax {w_amax:.4g} (scale {w_scale:.4g}), output {out_dtype}")


# ---------------------------------------------------------------------------------------------------------------
# Training: delayed scaling
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DelayedScaling:
    """The FP8 training recipe of ``Trainer(..., amp="fp8", fp8=DelayedScaling(...))``.

    ``history``: steps of amax kept per tensor; the scale is ``fp8_max / (max(history) * 2**margin)``.
    ``keep_first_last``: the first and the last GEMM of the forward pass (a GPT's first QKV projection and its LM
    head) stay bfloat16, as Transformer Engine advises: they see the raw embedding and produce the
    logits, where FP8's 3-bit (E4M3) mantissa costs the most. ``exclude``: weight parameter names that stay
    bfloat16 too.
    ``calibrate``: before its first step the trainer runs forward/backward passes on the first batch, updating
    nothing but the scaling state, until the amaxes settle (three passes for a transformer: a gradient reaching a
    GEMM through another FP8 GEMM's dgrad is all zeros in the first), so the first step quantizes with scales
    from its own data. Without it (Transformer Engine's behaviour) the first
    step quantizes activations and gradients with scale 1, and a mean loss's gradients, around 1e-6 for GPT-2's
    8192 tokens a step, fall below E5M2's smallest subnormal (2**-16): the FP8 layers' first gradients are zeros
    and the loss lags bfloat16's (float8_experimental, too, populates its initial amaxes rather than starting at
    scale 1)."""

    history: int = 16
    margin: int = 0
    keep_first_last: bool = True
    exclude: tuple[str, ...] = ()
    calibrate: bool = True

    def __post_init__(self):
        if isinstance(self.history, bool) or not isinstance(self.history, int) or self.history < 1:
            raise ValueError(f"DelayedScaling: history must be an int >= 1, got {self.history!r}")
        if isinstance(self.margin, bool) or not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"DelayedScaling: margin must be an int >= 0, got {self.margin!r}")
        if not isinstance(self.calibrate, bool):
            raise TypeError(f"DelayedScaling: calibrate must be True or False, got {self.calibrate!r}")
        object.__setattr__(self, "exclude", tuple(self.exclude))


FORWARD_DTYPE, GRADIENT_DTYPE = "float8_e4m3fn", "float8_e5m2"
STATE_PREFIX = "fp8/"  # state parameters: fp8/<weight>/<x|w|g>.<history|scale|scale_inv>


def _training_site_reason(graph: Graph, node: Node, backward: Node | None) -> str | None:
    a, w, bias, c = node.inputs
    attrs = node.attrs
    if not w.is_param:
        return "the weight is not a parameter"
    if attrs["act"] not in ("none", "relu") or c is not None or attrs["alpha"] != 1.0 or attrs["trans_a"]:
        # relu's backward reads the output; gelu's would recompute the pre-activation with a bfloat16 gemm
        return "not x @ W (+ bias) with act none or relu (another activation, a residual, alpha or a transposed x)"
    if a.type.dtype != "bfloat16" or a.type.rank != 2:
        return f"the activation is {a.type}, not a 2-d bfloat16 matrix"
    m, k = a.type.shape
    n = w.type.shape[0] if attrs["trans_b"] else w.type.shape[1]
    if any(not isinstance(d, int) or d % 16 for d in (m, n, k)):
        return f"m={m}, n={n}, k={k} must be multiples of 16 (cuBLASLt's FP8 rule, m for the weight gradient)"
    if bias is not None and bias.type.dtype != "bfloat16":
        return f"the bias is {bias.type.dtype}, not bfloat16"
    if backward is None:
        return "no gemm_backward of its own (the weight is not trained here)"
    if backward.attrs["a_act"] != "none" or backward.attrs["alpha"] != 1.0:
        return "its gemm_backward chains an activation"
    return None


def _state(graph: Graph, prefix: str, recipe: DelayedScaling, dtype: str, initial=None) -> dict[str, Value]:
    """A tensor's scaling state: scale 1 and an empty history, or, given the ``initial`` values (a weight, known
    before the first step), their amax recorded and the scale it gives."""
    history, scale = np.zeros(recipe.history, np.float32), np.float32(1.0)
    if initial is not None:
        amax = np.float32(np.abs(initial.astype(np.float64)).max(initial=0.0))
        history[0] = amax
        scale = np.float32(scale_for(float(amax), recipe.margin, dtype))
    return {"history": graph.param(f"{prefix}.history", history),
            "scale": graph.param(f"{prefix}.scale", np.array(scale, np.float32)),
            "scale_inv": graph.param(f"{prefix}.scale_inv", np.array(np.float32(1.0) / scale, np.float32))}


# (a tensor's state, the amax its step recorded) per FP8 format: updated together at the end of the step
PendingUpdates = dict[str, list[tuple[dict[str, Value], Value]]]


def _update_states(graph: Graph, pending: PendingUpdates, margin: int, update_prefix: str) -> None:
    """One ``fp8_scale_update`` per FP8 format for every state of the step, appended after the nodes whose amax it
    reads; its outputs are the graph outputs ``update_prefix + name`` the trainer copies over the state."""
    for dtype, updates in pending.items():
        if not updates:
            continue
        outputs = graph.fp8_scale_update(*[value for state, amax in updates
                                           for value in (state["history"], state["scale"], amax)],
                                         dtype=dtype, margin=margin)
        for index, (state, _) in enumerate(updates):
            for key, value in zip(("history", "scale", "scale_inv"), outputs[3 * index:3 * index + 3]):
                graph.output(value, update_prefix + state[key].name)


def train_rewrite(graph: Graph, forward_names: set[str], recipe: DelayedScaling, update_prefix: str) -> list[str]:
    """Rewrites the GEMMs of a training graph (forward, loss and gradients, before its backward passes) to FP8 in
    place, and returns notes (one per GEMM: FP8, or why it stays bfloat16).

    A forward ``gemm`` y = x @ W^T + bias (nn.Linear's layout) or x @ W + bias, relu fused or not, bfloat16 after
    autocast, with its ``gemm_backward`` (which receives relu's backward already applied):
    - forward: x and W quantized to E4M3 (amax in the same pass), ``scaled_gemm`` with their reciprocal scales, the
      bias (and relu) in its epilogue and FP8 fast accumulation (Transformer Engine's choice), bfloat16 out;
    - dgrad: dY quantized to E5M2, dX = dY8 @ W8 (E5M2 x E4M3);
    - wgrad: dW = dY8^T @ x8 (or its transpose for a [k, n] W; E5M2 x E4M3); dbias = sum(dY) (of the bfloat16 dY,
      float32 accumulation) from the quantize's own read of dY.
    cuBLASLt's FP8 matmul takes only the TN layout, so x, W and dY are quantized by ``quantize_fp8_transpose``,
    which writes both layouts from one read.
    Every quantized tensor (x, W, dY) has a state of float32 parameters ``fp8/<weight>/<x|w|g>.{history, scale,
    scale_inv}`` (x and dY start at scale 1 with an empty history, which the trainer's calibration fills before the
    first step unless ``recipe.calibrate`` is False; W from its initial amax): a step quantizes with
    the scale its predecessors chose, and two ``fp8_scale_update`` nodes at the end of the step (one per FP8 format,
    every tensor's state in a few launches) compute the next state into graph outputs ``update_prefix + name``, which
    the trainer copies over the state after the step (its buffers: on the device, captured with the step, saved in
    checkpoints). The names of the forward nodes it adds join ``forward_names``."""
    backward_of: dict[tuple, Node] = {}
    for node in graph.nodes:
        if node.op == "gemm_backward" and node.name not in forward_names:
            backward_of.setdefault((node.inputs[1], node.inputs[2]), node)
    candidates = [node for node in graph.nodes if node.op == "gemm" and node.name in forward_names]
    # paired before any rewrite: a rewritten GEMM's output (the next one's input) is a new value
    pairs = {node: backward_of.get((node.inputs[0], node.inputs[1])) for node in candidates}
    reasons = {node: _training_site_reason(graph, node, pairs[node]) for node in candidates}
    if recipe.keep_first_last and candidates:
        for node in {candidates[0], candidates[-1]}:
            if reasons[node] is None:
                reasons[node] = "the forward pass's first or last GEMM (DelayedScaling.keep_first_last)"
    for node in candidates:
        if reasons[node] is None and node.inputs[1].name in recipe.exclude:
            reasons[node] = "its weight is in DelayedScaling.exclude"
    notes = []
    pending: PendingUpdates = {FORWARD_DTYPE: [], GRADIENT_DTYPE: []}
    for node in candidates:
        if reasons[node] is not None:
            notes.append(f"{node.name} ({node.inputs[1].name}) stays bfloat16: {reasons[node]}")
            continue
        forward_names.update(_rewrite_training_site(graph, node, pairs[node], recipe, pending))
        notes.append(f"{node.name} ({node.inputs[1].name}) runs in FP8: forward E4M3 x E4M3, dgrad and wgrad "
                     f"E5M2 x E4M3, delayed scaling (history {recipe.history}, margin {recipe.margin})")
    _update_states(graph, pending, recipe.margin, update_prefix)
    skip_unread_amax(graph)
    return (notes + _batch_weight_quantizes(graph, forward_names) + _fuse_activation_quantizes(graph, forward_names)
            + _widen_outputs(graph))


def _batch_weight_quantizes(graph: Graph, forward_names: set[str]) -> list[str]:
    """The weights' quantize_fp8_transpose nodes (a parameter x, no column sum, no activation) of one x dtype and FP8
    format become one quantize_fp8_transpose_multi, where the first of them was: the same values bit for bit (the
    same scales, amaxes and rounding), in one launch instead of one per weight, each of which was too little work
    to fill the GPU (GPT-2 124M: 47 weights, 3.8-5.8 us each). The inputs are parameters, so the node may run as
    early as the first weight's quantize."""
    users = graph.users()
    groups: dict[tuple[str, str], list[Node]] = {}
    for node in graph.nodes:
        if (node.op == "quantize_fp8_transpose" and node.inputs[0].is_param and node.attrs["act"] == "none"
                and not node.attrs["with_column_sum"] and all(value is None for value in node.inputs[2:])
                and not users.get(node.outputs[3]) and not graph.is_output(node.outputs[3])):
            groups.setdefault((node.inputs[0].type.dtype, node.attrs["dtype"]), []).append(node)
    notes = []
    for (_, dtype), nodes in groups.items():
        if len(nodes) < 2:
            continue
        with graph.inserting_before(nodes[0]):
            outputs = graph.quantize_fp8_transpose_multi(*[value for node in nodes for value in node.inputs[:2]],
                                                         dtype=dtype)
        for index, node in enumerate(nodes):
            for old, new in zip(node.outputs[:3], outputs[3 * index:3 * index + 3]):
                graph.replace_uses(old, new)
            graph.remove_node(node)
        batched = outputs[0].producer.name
        if nodes[0].name in forward_names:
            forward_names.add(batched)
        notes.append(f"{len(nodes)} weight quantizes ({dtype}) batched into {batched} "
                     f"(quantize_fp8_transpose_multi: one launch)")
    return notes


# The ops a widened scaled_gemm output may go to: normalizations' backwards, which read a float32 gradient
# (autocast's policy) and fuse no cast in front of them, so the cast is a kernel of its own. Elsewhere the cast
# fuses into its reader, which then reads the narrower bytes: a pointwise op, a forward normalization (fused_row's
# prologue), cross_entropy (16-bit logits after fuse_loss_gradient).
WIDENED_FOR = ("layernorm_backward", "rmsnorm_backward")


def _final_readers(graph: Graph, value: Value, users: dict) -> list[Node] | None:
    """The nodes reading ``value`` through chains of reshapes; None when one of the values is a graph output."""
    readers = []
    for reader in users.get(value, []):
        if reader.op != "reshape":
            readers.append(reader)
        elif graph.is_output(reader.outputs[0]) or (through := _final_readers(graph, reader.outputs[0], users)) is None:
            return None
        else:
            readers += through
    return None if graph.is_output(value) else readers


def _widen_outputs(graph: Graph) -> list[str]:
    """A scaled_gemm whose output only a widening cast reads, on its way to a normalization's backward
    (``WIDENED_FOR``: fc1's and QKV's dgrad into their layernorm_backward), writes the wider dtype itself: cuBLASLt's
    FP8 matmul rounds its float32 sum once, where a bfloat16 output and a cast kernel (2 bytes read, 4 written an
    element) rounded it to bfloat16 first."""
    users = graph.users()
    notes = []
    for node in [n for n in graph.nodes if n.op == "scaled_gemm" and n.attrs["out_dtype"] in FLOAT_DTYPES]:
        y, bias = node.outputs[0], node.inputs[4]
        readers = users.get(y, [])
        if len(readers) != 1 or readers[0].op != "cast" or graph.is_output(y):
            continue
        cast = readers[0]
        wide = cast.attrs["dtype"]
        final = _final_readers(graph, cast.outputs[0], users)
        if (wide not in FLOAT_DTYPES or itemsize(wide) <= itemsize(y.type.dtype) or not final
                or any(reader.op not in WIDENED_FOR for reader in final)
                or (bias is not None and bias.type.dtype != bias_dtype_for(wide))):
            continue
        widened = _write_for_reader(graph, node, cast, wide, bias, node.inputs[5])
        notes.append(f"{node.name} writes {wide} for {cast.name}'s readers ({widened.producer.name}; {cast.name} "
                     f"removed)")
    return notes


PROLOGUE_OPS = ("gelu", "silu")  # the activations a training graph keeps as nodes (ReLU fuses into its gemm)


def _view_source(graph: Graph, value: Value, users: dict) -> tuple[Value, Node | None]:
    """(the value that ``value`` is a chain of reshapes of, each read by the next alone; the chain's first reshape,
    None when ``value`` is no reshape)."""
    first = None
    while (value.producer is not None and value.producer.op == "reshape"
           and users.get(value.producer.inputs[0]) == [value.producer]
           and not graph.is_output(value.producer.inputs[0])):
        first = value.producer
        value = first.inputs[0]
    return value, first


def _sole_producer(graph: Graph, node: Node) -> tuple[Value, Node | None]:
    """(the value ``node``'s x is a chain of reshapes of, its producer when that value is read by nothing else and
    is no graph output, else None)."""
    users = graph.users()
    source, first_view = _view_source(graph, node.inputs[0], users)
    reader = first_view if first_view is not None else node
    if graph.is_output(source) or users.get(source) != [reader]:
        return source, None
    return source, source.producer


def _fuse_activation_quantizes(graph: Graph, forward_names: set[str]) -> list[str]:
    """A quantize_fp8_transpose of an activation's output (the GELU between two FP8 GEMMs) or of its input gradient,
    which nothing else reads (through reshapes), quantizes act(x) or dY * act'(x) itself (its ``act`` prologue):
    the activation's node and its 16-bit output go."""
    notes = []
    for node in [n for n in graph.nodes if n.op == "quantize_fp8_transpose" and n.attrs["act"] == "none"]:
        _, activation = _sole_producer(graph, node)
        if activation is None or activation.op not in (*PROLOGUE_OPS, *(f"{op}_backward" for op in PROLOGUE_OPS)):
            continue
        shape = node.inputs[0].type.shape
        with graph.inserting_before(node):
            if activation.op in PROLOGUE_OPS:
                act, x, preact = activation.op, graph.reshape(activation.inputs[0], shape=shape), None
            else:  # <act>_backward(dy, preact)
                act = activation.op[:-len("_backward")]
                x, preact = (graph.reshape(value, shape=shape) for value in activation.inputs)
            fused = graph.quantize_fp8_transpose(x, node.inputs[1], preact, **{**node.attrs, "act": act})
        for old, new in zip(node.outputs, fused):
            graph.replace_uses(old, new)
        if node.name in forward_names:
            forward_names.update(value.producer.name for value in (fused[0], x, preact) if value is not None)
        graph.remove_node(node)
        notes.append(f"{activation.name} ({activation.op}) fused into {fused[0].producer.name} "
                     f"(quantize_fp8_transpose act={act}{' with preact' if preact is not None else ''}): no 16-bit "
                     f"copy of its output")
    return notes


def _remove_through_views(graph: Graph, node: Node, source: Node) -> None:
    """Removes ``node`` (its outputs' uses replaced already), the chain of reshapes between ``source`` and it
    (``_view_source``'s), and ``source``."""
    graph.remove_node(node)
    view = node.inputs[0].producer
    while view is not None and view is not source:
        previous = view.inputs[0].producer
        graph.remove_node(view)
        view = previous
    graph.remove_node(source)


MAX_COLUMN_BLOCKS = 3  # x and two more column blocks a quantize_fp8_transpose reads in place (x1, x2)


def read_column_blocks(graph: Graph) -> list[str]:
    """A quantize_fp8_transpose (no preact) of a concat that nothing else reads (through reshapes), whose parts lie
    side by side in the 2-d x (concatenated along an axis after the rows': a QKV projection's output gradients,
    joined by join_slice_gradients), reads the parts in place (its x, x1, x2): the concat and its 16-bit output go.
    Runs after join_slice_gradients, which makes the concat (FP8 training's second pass)."""
    notes = []
    for node in [n for n in graph.nodes if n.op == "quantize_fp8_transpose"]:
        if any(value is not None for value in node.inputs[2:]):
            continue
        source, concat = _sole_producer(graph, node)
        if concat is None or concat.op != "concat" or not 2 <= len(concat.inputs) <= MAX_COLUMN_BLOCKS:
            continue
        rows = node.inputs[0].type.shape[0]
        axis = concat.attrs["axis"] % source.type.rank
        if not source.type.is_concrete or int(np.prod(source.type.shape[:axis])) != rows:
            continue  # unknown extents, or parts that would interleave within x's rows
        with graph.inserting_before(node):
            blocks = [graph.reshape(part, shape=(rows, int(np.prod(part.type.shape[axis:]))))
                      for part in concat.inputs]
            fused = graph.quantize_fp8_transpose(blocks[0], node.inputs[1], None, *blocks[1:], **node.attrs)
        for old, new in zip(node.outputs, fused):
            graph.replace_uses(old, new)
        _remove_through_views(graph, node, concat)
        notes.append(f"{concat.name} (concat of {len(blocks)} on axis {axis}) read in place by "
                     f"{fused[0].producer.name} (quantize_fp8_transpose x, x1{', x2' if len(blocks) > 2 else ''}): "
                     f"no 16-bit concatenation")
    return notes


def fuse_gradient_adds(graph: Graph) -> list[str]:
    """A quantize_fp8_transpose (no activation, no preact, no column blocks) of a cast of a float32 ``add`` of two
    arrays of its shape, the cast read by nothing else (through reshapes): a transformer's residual-stream
    gradient, the float32 sum of two layers' input gradients whose 16-bit copy only the next GEMM's dY quantize
    reads. One quantize_fp8_add_transpose, where the add was, writes the float32 sum (the add's output, for its
    other readers) and quantizes its rounding to the cast's dtype, bit for bit the add, the cast and the quantize:
    the 16-bit copy is never written or read (GPT-2 124M: 23 of them, 12.6 MB written and read each). Runs after the
    backward passes (FP8 training's second pass), before the pointwise fusion would join the add and the cast."""
    notes = []
    for node in [n for n in graph.nodes if n.op == "quantize_fp8_transpose"]:
        if node.attrs["act"] != "none" or any(value is not None for value in node.inputs[2:]):
            continue
        _, cast = _sole_producer(graph, node)
        if cast is None or cast.op != "cast" or cast.attrs["dtype"] not in FLOAT_DTYPES:
            continue
        add = cast.inputs[0].producer
        total = cast.inputs[0]
        if (add is None or add.op != "add" or total.type.dtype != "float32" or not total.type.is_concrete
                or any(value.type != total.type for value in add.inputs) or graph.is_output(total)):
            continue
        rows, cols = node.inputs[0].type.shape
        if total.type.shape[-1] != cols or total.type.numel != rows * cols:
            continue  # the quantized rows are not the sum's rows
        with graph.inserting_before(add):
            x, addend = (graph.reshape(value, shape=(rows, cols)) for value in add.inputs)
            fused = graph.quantize_fp8_add_transpose(x, addend, node.inputs[1], dtype=node.attrs["dtype"],
                                                     value_dtype=cast.attrs["dtype"],
                                                     with_column_sum=node.attrs["with_column_sum"])
            summed = graph.reshape(fused[0], shape=total.type.shape)
        for old, new in zip(node.outputs, fused[1:]):
            graph.replace_uses(old, new)
        _remove_through_views(graph, node, cast)
        graph.replace_uses(total, summed)
        graph.remove_node(add)
        notes.append(f"{add.name} (float32 add) and {cast.name} (cast to {cast.attrs['dtype']}) fused into "
                     f"{fused[1].producer.name} (quantize_fp8_add_transpose): the sum in float32, no 16-bit copy")
    return notes


def _rewrite_training_site(graph: Graph, node: Node, backward: Node, recipe: DelayedScaling,
                           pending: PendingUpdates) -> list[str]:
    """Rewrites one site, adding its states' updates to ``pending``; returns the names of the forward nodes it
    added."""
    x, w, bias, _ = node.inputs
    before = {n.name for n in graph.nodes}
    prefix = f"{STATE_PREFIX}{w.name}"
    # the weight's first scale comes from its initial values; x's and the gradient's from their first step
    states = {"x": _state(graph, f"{prefix}/x", recipe, FORWARD_DTYPE),
              "w": _state(graph, f"{prefix}/w", recipe, FORWARD_DTYPE, w.data),
              "g": _state(graph, f"{prefix}/g", recipe, GRADIENT_DTYPE)}
    with graph.inserting_before(node):
        # both layouts of x and W from one read each (cuBLASLt's FP8 matmul takes only the TN layout)
        x8, x8_t, x_amax, _ = graph.quantize_fp8_transpose(x, states["x"]["scale"], dtype=FORWARD_DTYPE)
        w8, w8_t, w_amax, _ = graph.quantize_fp8_transpose(w, states["w"]["scale"], dtype=FORWARD_DTYPE)
        w8_nk, w8_kn = (w8, w8_t) if node.attrs["trans_b"] else (w8_t, w8)
        # fast accumulation in the forward GEMM only, as Transformer Engine: the gradients' GEMMs keep cuBLASLt's
        # periodic promotion to float32 (their sums are longer and their errors feed the update directly)
        y, _ = graph.scaled_gemm(x8, w8_nk, states["x"]["scale_inv"], states["w"]["scale_inv"], bias, None,
                                 act=node.attrs["act"], out_dtype=node.outputs[0].type.dtype, fast_accum=True)
        pending[FORWARD_DTYPE] += [(states["x"], x_amax), (states["w"], w_amax)]
    graph.replace_uses(node.outputs[0], y)
    graph.remove_node(node)
    forward_nodes = [n.name for n in graph.nodes if n.name not in before]

    dy = backward.inputs[0]
    da, db, dbias = backward.outputs
    with graph.inserting_before(backward):
        # dbias = sum(dY) over the rows from the quantize's own read of dY (Transformer Engine's cast-transpose-dbias)
        dy8, dy8_t, dy_amax, dy_sum = graph.quantize_fp8_transpose(dy, states["g"]["scale"], dtype=GRADIENT_DTYPE,
                                                                   with_column_sum=backward.attrs["with_dbias"])
        pending[GRADIENT_DTYPE].append((states["g"], dy_amax))
        # dX [m, k] = dY [m, n] @ W_nk: cuBLASLt's B is [k, n]
        dx, _ = graph.scaled_gemm(dy8, w8_kn, states["g"]["scale_inv"], states["w"]["scale_inv"],
                                  out_dtype=da.type.dtype)
        # dW as W is stored: [n, k] = dY^T @ x (A = dY^T [n, m], B = x^T [k, m]), or [k, n] = x^T @ dY
        first, second = (dy8_t, x8_t) if node.attrs["trans_b"] else (x8_t, dy8_t)
        scales = (states["g"], states["x"]) if node.attrs["trans_b"] else (states["x"], states["g"])
        dw, _ = graph.scaled_gemm(first, second, scales[0]["scale_inv"], scales[1]["scale_inv"],
                                  out_dtype=db.type.dtype)
        replacements = [(da, dx), (db, dw)]
        if backward.attrs["with_dbias"]:
            replacements.append((dbias, dy_sum))
    for old, new in replacements:
        graph.replace_uses(old, new)
    graph.remove_node(backward)
    return forward_nodes
