"""Loss builders: graph nodes computing a scalar loss, for ``Trainer`` (any scalar the graph computes is a loss).

Constants a loss needs are parameters named ``const/...``: ``Trainer`` never trains those.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import to_numpy

CONSTANT_PREFIX = "const/"
REDUCTIONS = ("mean", "sum")


def _check_reduction(reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(REDUCTIONS)}, got {reduction!r}")


def _constant(g, value: float, dtype: str):
    index = 0
    while f"{CONSTANT_PREFIX}{index}" in g.params:
        index += 1
    return g.param(f"{CONSTANT_PREFIX}{index}", np.array(value, to_numpy(dtype)))


def mse(g, prediction, target, reduction: str = "mean"):
    """mean (or sum) over every element of (prediction - target)**2, as torch.nn.MSELoss."""
    _check_reduction(reduction)
    difference = g.sub(prediction, target)
    squared = g.mul(difference, difference)
    return g.mean(squared) if reduction == "mean" else g.sum(squared)


def cross_entropy(g, logits, labels, reduction: str = "mean", ignore_index: int = -100,
                  label_smoothing: float = 0.0):
    """Softmax cross-entropy of ``logits`` (rows, classes) against integer ``labels``, as
    torch.nn.functional.cross_entropy. With ``label_smoothing`` e the target is (1 - e) one-hot + e / classes:
    loss = (1 - e) * CE + e * mean over classes of -log_softmax, reduced over the rows. Rows labelled
    ``ignore_index`` are left out of the CE term only, so smoothing needs every label to be a class."""
    _check_reduction(reduction)
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing: expected a number in [0, 1], got {label_smoothing!r}")
    loss = g.cross_entropy(logits, labels, reduction=reduction, ignore_index=ignore_index)
    if label_smoothing == 0.0:
        return loss
    dtype = loss.type.dtype
    per_row = g.mean(g.log_softmax(logits, axis=-1), axis=-1)
    uniform = g.mean(per_row) if reduction == "mean" else g.sum(per_row)
    return g.sub(g.mul(loss, _constant(g, 1.0 - label_smoothing, dtype)),
                 g.mul(uniform, _constant(g, label_smoothing, dtype)))
