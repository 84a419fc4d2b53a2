"""Graph passes: each small, pure (it edits the graph the pass manager owns) and tested alone.

``DEFAULT_PIPELINE`` is what ``ExecutorV2`` runs unless told otherwise; ``resolve`` turns names into passes.
"""
from __future__ import annotations

from typing import Sequence

from .batch_norm_fold import fold_batch_norm
from .canonicalize import canonicalize
from .cleanup import eliminate_common_subexpressions, eliminate_dead_code
from .constant_fold import fold_constants
from .fusion import fuse
from .inference import infer_shapes
from .layout import plan_layouts
from .manager import Pass, PassManager, PassRecord
from .pattern import Pat, Rewrite, rewrite

PASSES: dict[str, Pass] = {p.name: p for p in (
    Pass("infer_shapes", infer_shapes, "recompute every output type from the input types"),
    Pass("dce", eliminate_dead_code, "remove nodes and params no output depends on"),
    Pass("cse", eliminate_common_subexpressions, "merge nodes computing the same thing"),
    Pass("constant_fold", fold_constants, "evaluate parameter-only nodes once, as parameters"),
    Pass("canonicalize", canonicalize, "matmul -> gemm, transposes -> trans flags, row adds -> bias_add -> gemm "
                                       "bias, drop identities"),
    Pass("fuse", fuse, "fuse residual adds and activations into gemm epilogues"),
    Pass("fold_batch_norm", fold_batch_norm, "fold inference batch norms into the conv2d before them"),
    Pass("plan_layouts", plan_layouts, "run conv/pool/batch-norm chains in their dtype's preferred layout, "
                                       "transposes only at the edges"),
)}

# Folding runs after canonicalization, so the reshapes it inserts for parameter rows become parameters.
DEFAULT_PIPELINE = ("infer_shapes", "dce", "cse", "canonicalize", "constant_fold", "fold_batch_norm", "fuse", "dce")


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


__all__ = ["DEFAULT_PIPELINE", "PASSES", "Pass", "PassManager", "PassRecord", "Pat", "Rewrite", "canonicalize",
           "eliminate_common_subexpressions", "eliminate_dead_code", "fold_batch_norm", "fold_constants", "fuse",
           "infer_shapes", "plan_layouts", "resolve", "rewrite"]
