"""Numerical checks shared by the test suite and the benchmarks (which check correctness before they time)."""
from __future__ import annotations

import numpy as np

# (atol, rtol) against a float64 reference, per result dtype. "tf32" is float32 storage with TF32 matmul inputs.
_TOLERANCES = {
    "float64": (1e-12, 1e-12),
    "float32": (1e-5, 1e-5),
    "tf32": (2e-3, 2e-3),
    "float16": (1e-3, 2e-3),
    "bfloat16": (1e-2, 1e-2),
}


def tolerance(dtype: str, reduction_length: int = 1) -> tuple[float, float]:
    """(atol, rtol) for a result of ``dtype``; atol grows with sqrt of the reduction length (GEMM's K)."""
    atol, rtol = _TOLERANCES[dtype]
    return atol * max(1.0, float(reduction_length)) ** 0.5, rtol


def assert_close(actual, expected, dtype: str, reduction_length: int = 1, what: str = "result") -> None:
    """|actual - expected| <= atol + rtol * |expected| elementwise; NaN in ``actual`` never passes."""
    actual = np.asarray(actual).astype(np.float64)
    expected = np.asarray(expected).astype(np.float64)
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape} != expected {expected.shape}")
    atol, rtol = tolerance(dtype, reduction_length)
    bad = ~(np.abs(actual - expected) <= atol + rtol * np.abs(expected))  # NaN compares False -> bad
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        error = np.nanmax(np.abs(actual - expected)) if np.isfinite(actual).any() else float("nan")
        raise AssertionError(
            f"{what} ({dtype}): {int(bad.sum())} of {bad.size} elements out of tolerance (atol={atol:.2e}, "
            f"rtol={rtol:.2e}); first at {index}: got {actual[index]!r}, expected {expected[index]!r}; "
            f"max abs error {error:.3e}"
        )


def random_array(rng: np.random.Generator, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    """Fresh normal random values, rounded to ``dtype`` (so the float64 reference sees the same inputs)."""
    from .dtypes import to_numpy

    return (rng.standard_normal(shape) * scale).astype(to_numpy(dtype))
