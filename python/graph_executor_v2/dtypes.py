"""Element types GE2 knows, by name, and their NumPy host types.

bfloat16 host arrays are NumPy arrays of ``ml_dtypes.bfloat16`` (NumPy has no bfloat16 of its own); the same
names are used everywhere: ``float32 float16 bfloat16 int32 int64 uint8``.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
INT_DTYPES = ("int32", "int64", "uint8")
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES

_NUMPY = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
}
_ITEMSIZE = {name: dtype.itemsize for name, dtype in _NUMPY.items()}


def normalize(dtype, argument: str = "dtype") -> str:
    """Accepts a GE2 name, a NumPy dtype, a torch dtype or a CuPy dtype and returns the GE2 name."""
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    elif hasattr(dtype, "is_floating_point") and str(dtype).startswith("torch."):
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise TypeError(f"{argument}: expected one of {', '.join(ALL_DTYPES)}, got {dtype!r}") from None
    if name not in _NUMPY:
        raise TypeError(f"{argument}: expected one of {', '.join(ALL_DTYPES)}, got {name!r}")
    return name


def to_numpy(name: str) -> np.dtype:
    return _NUMPY[normalize(name)]


def itemsize(name: str) -> int:
    return _ITEMSIZE[name]


def is_float(name: str) -> bool:
    return name in FLOAT_DTYPES
