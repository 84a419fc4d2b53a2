"""Batch norm's affine parameters and running statistics as float32, the dtype GE2's batch_norm keeps them in."""
from __future__ import annotations

import numpy as np

from ..ir.graph import Graph, Value

_SIXTEEN_BIT_FLOATS = ("float16", "bfloat16")


def float32_statistics(g: Graph, values: list[Value]) -> list[Value]:
    """A 16-bit model stores gamma/beta/mean/var in 16 bits: a constant becomes a float32 parameter (exact: every
    16-bit float is a float32), a computed tensor a float32 cast. Other dtypes pass through for the op to judge."""
    converted = []
    for value in values:
        if value.type.dtype not in _SIXTEEN_BIT_FLOATS:
            converted.append(value)
        elif value.is_param:
            converted.append(g.param(g.unique_name(f"{value.name}_float32"), value.data.astype(np.float32)))
        else:
            converted.append(g.cast(value, dtype="float32"))
    return converted
