"""The float32 precision policy: which float32 convolutions and GEMMs may use TF32 tensor cores.

``PRECISIONS``:
- ``"highest"``: strict FP32 everywhere (float32 products, float32 accumulation): PyTorch with
  ``torch.backends.cudnn.allow_tf32 = False`` and ``torch.backends.cuda.matmul.allow_tf32 = False``. As there, cuDNN's
  FFT and Winograd convolution algorithms (float32 transforms) may run: conv2d's README gives their measured error.
- ``"high"``: TF32 for float32 convolutions and GEMMs (10-bit mantissa products, float32 accumulation):
  ``torch.set_float32_matmul_precision("high")`` with cuDNN's default.
- ``"default"``: PyTorch's defaults: cuDNN convolutions may use TF32 (``torch.backends.cudnn.allow_tf32`` is True),
  matmuls may not (``torch.backends.cuda.matmul.allow_tf32`` is False).
- ``"fp8"`` (``ExecutorV2`` only): GEMMs with a parameter weight on FP8 tensor cores (``passes/fp8.py``, after
  ``calibrate``); every other float32 node as ``"default"``.

``POLICY`` is the per-op table (op -> the precisions under which its float32 nodes get ``allow_tf32``); every other
op computes float32 in float32 whatever the policy (norms, softmax, reductions, pointwise). 16-bit nodes are
untouched: their tensor-core products are exact in float32 and accumulate in float32.

A float32 convolution with fewer than ``NARROW_CHANNELS`` input channels per group stays strict FP32 under every
policy: PyTorch's cuDNN ran ViT-B/16's 3-channel 16x16 patch embedding in FP32 on the H200 with TF32 allowed (its
error against float64 1.9e-6, FP32's; TF32-rounded inputs give 2.4e-4, which GE2 had), and such a convolution is a
network's stem, a small part of its time: strict there, GE2 is not less precise than PyTorch.
"""
from __future__ import annotations

from ..ir.graph import Graph

FLOAT32_PRECISIONS = ("default", "highest", "high")
PRECISIONS = FLOAT32_PRECISIONS + ("fp8",)
POLICY = {
    "conv2d": ("default", "high"),
    "conv2d_backward": ("default", "high"),
    "gemm": ("high",),
    "gemm_backward": ("high",),
}


NARROW_CHANNELS = 8


def _narrow_convolution(node) -> bool:
    """A conv2d / conv2d_backward node with fewer than NARROW_CHANNELS input channels per group (w's C/groups)."""
    if node.op not in ("conv2d", "conv2d_backward"):
        return False
    w = node.inputs[1 if node.op == "conv2d" else 2]
    channels = w.type.shape[1 if node.attrs["layout"] == "NCHW" else 3]
    return isinstance(channels, int) and channels < NARROW_CHANNELS


def check_precision(precision, allowed=PRECISIONS) -> str:
    if precision not in allowed:
        raise ValueError(f"precision: expected one of {', '.join(repr(p) for p in allowed)}, got {precision!r}")
    return precision


def describe(precision: str) -> str:
    """One line per op family for explain(): what float32 runs as under ``precision``."""
    check_precision(precision)
    parts = [f"{op} {'TF32' if precision in allowed else 'strict FP32'}" for op, allowed in POLICY.items()
             if not op.endswith("_backward")]
    narrow = (f"; float32 conv2d of fewer than {NARROW_CHANNELS} input channels per group strict FP32"
              if precision in POLICY["conv2d"] else "")
    return f"precision: {precision!r} (float32 {', '.join(parts)}, backward alike{narrow}; everything else float32)"


def apply_precision(graph: Graph, precision: str) -> list[str]:
    """Sets ``allow_tf32`` on every float32 node the policy covers; returns one note per node changed."""
    check_precision(precision)
    policy = "default" if precision == "fp8" else precision  # FP8 rewrites GEMMs itself; float32 as the default
    notes = []
    for node in graph.nodes:
        allowed = POLICY.get(node.op)
        if allowed is None or node.inputs[0] is None or node.inputs[0].type.dtype != "float32":
            continue
        wanted = policy in allowed and not _narrow_convolution(node)
        if node.attrs["allow_tf32"] != wanted:
            node.attrs["allow_tf32"] = wanted
            notes.append(f"{node.name} ({node.op}): allow_tf32 {wanted}")
    return notes
