"""Test helpers for the data-movement ops (transpose/reshape, slice, concat): they move bits, so inputs are random
bit patterns and results must match the reference bit for bit."""
from __future__ import annotations

import numpy as np

import graph_executor_v2 as ge2
from graph_executor_v2.dtypes import to_numpy

ALL_DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "uint8")
FLOAT_BITS = {"float32": (np.uint32, 23, 8), "float16": (np.uint16, 10, 5), "bfloat16": (np.uint16, 7, 8)}


def random_values(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    """Uniformly random bit patterns (finite ones for floats: every sign, subnormals, -0.0), so that almost every
    element differs from its neighbours and a misplaced element cannot pass."""
    shape = tuple(shape)
    if dtype in FLOAT_BITS:
        bits_type, mantissa, exponent = FLOAT_BITS[dtype]
        bits = rng.integers(0, np.iinfo(bits_type).max, size=shape, dtype=bits_type, endpoint=True)
        all_ones = bits_type((1 << exponent) - 1)
        infinite = ((bits >> bits_type(mantissa)) & all_ones) == all_ones
        bits = np.where(infinite, bits & ~bits_type(1 << (mantissa + exponent - 1)), bits)  # clear the top exponent bit
        return bits.view(to_numpy(dtype))
    info = np.iinfo(to_numpy(dtype))
    return rng.integers(info.min, info.max, size=shape, dtype=to_numpy(dtype), endpoint=True)


def bits_of(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    return array.view(f"u{array.dtype.itemsize}")


def assert_same_bits(actual, expected, dtype: str, what: str = "result") -> None:
    """``actual`` equals ``expected`` (a reference, cast to ``dtype``) bit for bit; NaN (a poisoned, unwritten
    element) never passes."""
    actual = np.asarray(actual)
    expected = np.asarray(expected).astype(to_numpy(dtype))
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != expected {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    bad = bits_of(actual) != bits_of(expected)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{what} ({dtype}): {int(bad.sum())} of {bad.size} elements differ; first at {index}: "
                             f"got {actual[index]!r}, expected {expected[index]!r}")


def device(x: np.ndarray):
    """A DeviceArray copy of a host array, 0-d arrays included (np.ascontiguousarray would make them 1-d)."""
    return ge2.device.runtime().DeviceArray.from_numpy(np.require(x, requirements="C"))
