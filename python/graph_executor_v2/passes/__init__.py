"""Graph passes: each small, pure (it edits the graph the pass manager owns) and tested alone.

``DEFAULT_PIPELINE`` is what ``ExecutorV2`` runs unless told otherwise; ``resolve`` turns names into passes.
"""
from __future__ import annotations

from typing import Sequence

from .alignment import pad_gemm_columns, split_gemm_columns
from .attention_fusion import fuse_attention
from .batch_norm_fold import fold_batch_norm
from .canonicalize import canonicalize, lower_batched_matmuls
from .amp import POLICY, autocast, pad_after_cast
from .cleanup import eliminate_common_subexpressions, eliminate_dead_code
from .constant_fold import fold_constants
from .fusion import fuse
from .inference import infer_shapes
from .layout import plan_layouts
from .manager import Pass, PassManager, PassRecord
from .pattern import Pat, Rewrite, rewrite
from .pointwise_fusion import fuse_pointwise, fuse_pointwise_training
from .slice_gradients import join_slice_gradients
from .transposes import propagate_transposes
from .training import chain_activation_backward, fuse_loss_gradient, fuse_relu, pad_classes, trim_gemm_backward

PASSES: dict[str, Pass] = {p.name: p for p in (
    Pass("infer_shapes", infer_shapes, "recompute every output type from the input types"),
    Pass("dce", eliminate_dead_code, "remove nodes and params no output depends on"),
    Pass("cse", eliminate_common_subexpressions, "merge nodes computing the same thing"),
    Pass("constant_fold", fold_constants, "evaluate parameter-only nodes once, as parameters"),
    Pass("fuse_attention", fuse_attention, "matmul -> scale -> causal mask -> softmax -> matmul -> one attention"),
    Pass("canonicalize", canonicalize, "matmul -> gemm, transposes -> trans flags, row adds -> bias_add -> gemm "
                                       "bias, drop identities"),
    Pass("lower_batched_matmuls", lower_batched_matmuls, "batched matmuls -> 2-d gemms (static batch dims)"),
    Pass("fuse", fuse, "fuse residual adds and activations into gemm and conv2d epilogues"),
    Pass("fuse_pointwise", fuse_pointwise, "connected pointwise ops -> one generated kernel (fused_pointwise); row "
                                           "reductions with their pointwise prologue/epilogue -> fused_reduction"),
    Pass("fuse_pointwise_training", fuse_pointwise_training,
         "fuse_pointwise for training graphs: parameters stay inputs (the trainer updates them in place)"),
    Pass("fuse_relu", fuse_relu, "fuse residual adds and ReLU (not GELU/SiLU) into gemm epilogues, for training"),
    Pass("pad_classes", pad_classes, "a loss's classifier gemm with classes not a multiple of 8 computes them rounded "
                                     "up to 64 (zero weights, -inf bias: cross_entropy ignores them exactly)"),
    Pass("pad_after_cast", pad_after_cast, "a pad read only by a narrowing cast pads the cast's output instead "
                                           "(fewer bytes through both, and its gradient's crop in 16 bits)"),
    Pass("pad_gemm_columns", pad_gemm_columns, "a 16-bit gemm of >= 1024 columns, not a multiple of 8, with a "
                                               "parameter weight computes them aligned (zero columns up to a "
                                               "multiple of 64) and slices the output back"),
    Pass("split_gemm_columns", split_gemm_columns, "a gemm product (parameter weight) read only in column slices "
                                                   "(a fused QKV's q, k, v) is one gemm per slice: no slice copies"),
    Pass("chain_activation_backward", chain_activation_backward,
         "apply an activation's backward inside the next gemm's dA (gemm_backward a_act)"),
    Pass("trim_gemm_backward", trim_gemm_backward, "do not compute gemm_backward outputs nothing reads"),
    Pass("fuse_loss_gradient", fuse_loss_gradient,
         "a cross_entropy and its backward seeded by 1 -> one cross_entropy_with_grad pass over the logits"),
    Pass("join_slice_gradients", join_slice_gradients,
         "sums of slice_backward that tile one axis -> one concat (the gradient of a fused QKV projection)"),
    Pass("fold_batch_norm", fold_batch_norm, "fold inference batch norms into the conv2d before them"),
    Pass("plan_layouts", plan_layouts, "run conv/pool/batch-norm chains in their dtype's preferred layout, "
                                       "transposes only at the edges"),
    Pass("propagate_transposes", propagate_transposes,
         "move transposes through gemm rows, slices, attention heads and pointwise ops until they cancel; a chain "
         "of reshapes and transposes keeps at most one transpose (kept only when fewer bytes are transposed)"),
)}

# Folding runs after canonicalization, so the reshapes it inserts for parameter rows become parameters (and so do
# the zero columns pad_gemm_columns adds to an unaligned weight). Attention fuses before canonicalization turns its
# matmuls into gemms. Layouts are planned after batch norms fold into their convs and before epilogue fusion
# (transposes sink through the activations and residual adds still apart), and the weights' transposes it leaves fold
# as constants; the transposes left anywhere then move until they cancel (propagate_transposes), after which a fused
# QKV's product is read only in column slices and splits (split_gemm_columns; its weight slices fold as constants).
# Pointwise fusion runs after the epilogue fusion, on what the epilogues did not absorb.
DEFAULT_PIPELINE = ("infer_shapes", "dce", "cse", "fuse_attention", "canonicalize", "pad_gemm_columns", "constant_fold",
                    "fold_batch_norm", "plan_layouts", "propagate_transposes", "split_gemm_columns", "constant_fold",
                    "fuse", "fuse_pointwise", "dce")
# Training: the forward is canonicalized and fused before autograd (no constant folding: parameters are trained),
# the graph with gradients is then cleaned (batched matmuls of gradients lowered to gemms) and its backward fused.
TRAINING_FORWARD = ("infer_shapes", "dce", "cse", "fuse_attention", "canonicalize", "pad_classes", "fuse_relu",
                    "dce")
TRAINING_BACKWARD = ("infer_shapes", "cse", "dce", "lower_batched_matmuls", "chain_activation_backward",
                     "trim_gemm_backward", "fuse_loss_gradient", "join_slice_gradients", "dce")
# Last of all (after activation checkpointing, which finds forward nodes by name): forward and backward pointwise
# chains of the differentiated graph fuse.
TRAINING_FUSION = ("fuse_pointwise_training", "dce")


def resolve(passes: Sequence[str | Pass] | None) -> list[Pass]:
    """Pass objects for names (or passes); None is the default pipeline, an empty sequence no pass at all."""
    result = []
    for entry in DEFAULT_PIPELINE if passes is None else passes:
        if isinstance(entry, Pass):
            result.append(entry)
        elif entry in PASSES:
            result.append(PASSES[entry])
        else:
            raise ValueError(f"passes: unknown pass {entry!r}; known passes: {', '.join(PASSES)}")
    return result


__all__ = ["DEFAULT_PIPELINE", "PASSES", "POLICY", "TRAINING_BACKWARD", "TRAINING_FORWARD", "TRAINING_FUSION", "Pass",
           "PassManager", "PassRecord", "Pat", "Rewrite", "autocast", "canonicalize", "chain_activation_backward",
           "eliminate_common_subexpressions", "eliminate_dead_code", "fold_batch_norm", "fold_constants", "fuse",
           "fuse_attention", "fuse_loss_gradient", "fuse_pointwise", "fuse_pointwise_training", "fuse_relu",
           "infer_shapes", "join_slice_gradients", "lower_batched_matmuls", "pad_gemm_columns", "plan_layouts",
           "propagate_transposes", "resolve", "rewrite", "split_gemm_columns", "trim_gemm_backward"]
