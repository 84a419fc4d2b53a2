"""The attention backward's float64 reference as the kernels' contract states it, shared by test_attention.py and
test_attention_window.py."""
from __future__ import annotations

import numpy as np

from graph_executor_v2.ops import attention


def reference_backward_from_stored_y(dy, q, k, v, y, causal=False, scale=None, layout="bhsd", bias=None,
                                     window=(-1, -1), softcap=0.0):
    """(dq, dk, dv) in float64 with D_i = dy_i . y_i taken from the stored ``y`` (the backward's input, rounded to
    its dtype), as every kernel, FlashAttention and PyTorch take it, instead of the exact y of reference_backward.
    The difference is linear in dD_i = dy_i . (y_i - exact y_i): dS_ij moves by -P_ij dD_i (times the soft cap's
    derivative), so dq_i by scale sum_j dS_ij k_j and dk_j by scale sum_i dS_ij q_i (summed over each K/V group); dv
    does not use D. With peaked softmax rows (a large scale * |q . k|) this term alone reaches the 16-bit tolerance of
    a head_dim-long sum, so it belongs in the reference, not in a looser tolerance."""
    attrs = dict(causal=causal, scale=scale, layout=layout, bias=bias, window=window, softcap=softcap)
    dq, dk, dv = attention.reference_backward(dy, q, k, v, **attrs)
    exact_y, _ = attention.reference(q, k, v, **attrs)
    q64, k64, _, group = attention._expanded(q, k, v, layout)
    dy64, stored, exact = (attention._heads_first(np.asarray(x).astype(np.float64), layout) for x in (dy, y, exact_y))
    scale = attention.default_scale(scale, q64.shape[-1])
    p, _, capped = attention._probabilities(q64, k64, causal, scale, bias, window, softcap)
    shift = -p * (dy64 * (stored - exact)).sum(axis=-1, keepdims=True)
    if capped is not None:
        shift = shift * (1.0 - capped * capped)
    dq_shift = scale * shift @ k64
    dk_shift = scale * shift.transpose(0, 1, 3, 2) @ q64
    b, h, s, d = dk_shift.shape
    dk_shift = dk_shift.reshape(b, h // group, group, s, d).sum(axis=2)
    return (dq + attention._heads_first(dq_shift, layout), dk + attention._heads_first(dk_shift, layout), dv)
