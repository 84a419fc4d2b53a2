"""Test helpers for the row-wise norms (layernorm, rmsnorm): the row lengths that reach every kernel path, central
differences, and a tolerance check that never lets NaN pass."""
from __future__ import annotations

import numpy as np
import pytest

DTYPES = ("float32", "float16", "bfloat16")
KERNELS = ("warp_per_row", "block_per_row", "multipass")

# Row lengths that reach every path: one column, odd and non-multiple-of-8 lengths (scalar loads), the warp
# kernel's 1024 limit, block groups of 128..1024 threads, rows longer than any register path.
FORWARD_COLS = (1, 7, 8, 33, 100, 256, 1000, 1024, 1025, 2048, 4096, 5000, 10000, 16384, 32768, 65537)
BACKWARD_COLS = (1, 7, 8, 100, 512, 1000, 1024, 1025, 4096, 4100, 8192, 10000, 65537)

# Leading shapes for the "auto" kernel: size-1 axes, 1-d and 3-d/4-d inputs, many short rows.
EDGE_SHAPES = ((1, 1), (1, 4096), (3, 1), (2, 3, 7), (4, 5, 6, 33), (17,), (130, 64), (1000, 24), (5000, 8))

# Shapes that give the backward's persistent blocks several iterations of rows each (a few hundred rows give each
# block one): row-to-row state in the loop, and the column sums accumulated over many rows. (3000, 1000) and
# (40000, 64) are quick; the (5000, 4096) ones and the benchmark's float16 (16384, 4096) run in the "large" tests.
MANY_ROWS_SHAPES = ((3000, 1000), (40000, 64))
LARGE_MANY_ROWS_SHAPES = tuple(((5000, 4096), dtype) for dtype in DTYPES) + (((16384, 4096), "float16"),)


def block_iterations(native, shape, dtype: str, kernel: str, channels: int) -> float:
    """Row iterations per block of the backward's persistent grid on this GPU: its part count is the workspace's
    float32 rows of column sums (`channels` of them per part: dgamma, and dbeta for layernorm); warp_per_row
    blocks take 4 rows per iteration."""
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    parts = native.backward_workspace_bytes(rows, cols, dtype, kernel, True) // (4 * channels * cols)
    return rows / (parts * (4 if kernel == "warp_per_row" else 1))


def supported_cols(native, kernel: str, dtype: str, candidates, backward: bool = False) -> list[int]:
    """The lengths among `candidates` that `kernel` runs (with aligned pointers); at least three, so that no
    kernel is tested on a single length by accident."""
    cols = [c for c in candidates if native.unsupported_reason(kernel, c, dtype, True, backward) == ""]
    assert len(cols) >= 3, f"{kernel}: only {cols} of {candidates} supported"
    return cols


def rows_for(cols: int, short: int, long: int = 5) -> int:
    """Enough rows to cover uneven shares of rows per block and group, without slow references for long rows."""
    return short if cols <= 4096 else long


def statistics_error(offset: float) -> float:
    """Absolute error of float32 row statistics (the mean, and so x - mean) for rows around `offset`: summing
    values of size |offset| in float32 loses ~1e-7 of them."""
    return 1e-6 + 4e-7 * abs(offset)


def numeric_gradient(loss, array: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar loss() with respect to every element of `array` (changed and restored in
    place, so loss() sees it)."""
    grad = np.zeros_like(array)
    for i in np.ndindex(array.shape):
        saved = array[i]
        array[i] = saved + h
        plus = loss()
        array[i] = saved - h
        minus = loss()
        array[i] = saved
        grad[i] = (plus - minus) / (2 * h)
    return grad


def assert_within(actual, expected, atol: float, rtol: float, what: str) -> None:
    """|actual - expected| <= atol + rtol * |expected| elementwise; NaN never passes."""
    actual = np.asarray(actual).astype(np.float64)
    expected = np.asarray(expected).astype(np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    bad = ~(np.abs(actual - expected) <= atol + rtol * np.abs(expected))
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} out of tolerance (atol={atol:.2e}, "
                             f"rtol={rtol:.2e}); first at {index}: got {actual[index]!r}, expected {expected[index]!r}")


def inputs(rng: np.random.Generator, shape, dtype: str, offset: float = 0.0, params: int = 2):
    """x = offset + N(0, 1) rounded to dtype, and `params` N(0, 1) vectors of its last extent (gamma, beta)."""
    from graph_executor_v2.dtypes import to_numpy

    numpy_dtype = to_numpy(dtype)
    x = (rng.standard_normal(shape) + offset).astype(numpy_dtype)
    return (x,) + tuple(rng.standard_normal(shape[-1:]).astype(numpy_dtype) for _ in range(params))


def kernel_sweep_tests(native, check_forward, check_backward, channels: int):
    """The GPU tests that are the same for layernorm and rmsnorm but for the op: its forward and backward checks
    over every kernel, dtype and row length, and backward grids whose blocks loop over many rows. ``native()``
    loads the op's module; ``channels``: its parameter gradients (2 with dbeta, 1 without). A test module binds
    the returned functions to their names, so pytest collects them there."""

    @pytest.mark.gpu
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("kernel", KERNELS)
    def test_forward_every_kernel_dtype_and_length(rng, poisoned, to_device, dtype, kernel):
        for cols in supported_cols(native(), kernel, dtype, FORWARD_COLS):
            check_forward(rng, poisoned, to_device, (rows_for(cols, 37), cols), dtype, kernel)

    @pytest.mark.gpu
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("kernel", KERNELS)
    @pytest.mark.parametrize("saved_stats", (True, False))
    def test_backward_every_kernel_dtype_and_length(rng, poisoned, to_device, dtype, kernel, saved_stats):
        for cols in supported_cols(native(), kernel, dtype, BACKWARD_COLS, backward=True):
            check_backward(rng, poisoned, to_device, (rows_for(cols, 301), cols), dtype, kernel, saved_stats)

    @pytest.mark.gpu
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("kernel", KERNELS)
    @pytest.mark.parametrize("saved_stats", (True, False))
    def test_backward_many_rows_per_block(rng, poisoned, to_device, dtype, kernel, saved_stats):
        # A few hundred rows give each block of the persistent backward grid one row; these shapes make every block
        # loop over several (checked, so the test keeps its point on any GPU).
        assert max(block_iterations(native(), shape, dtype, kernel, channels) for shape in MANY_ROWS_SHAPES) >= 2
        for shape in MANY_ROWS_SHAPES:
            check_backward(rng, poisoned, to_device, shape, dtype, kernel, saved_stats)

    @pytest.mark.gpu
    @pytest.mark.parametrize("shape, dtype", LARGE_MANY_ROWS_SHAPES)
    @pytest.mark.parametrize("kernel", ("block_per_row", "multipass"))  # the ones that run 4096 columns backward
    @pytest.mark.parametrize("saved_stats", (True, False))
    def test_backward_large_many_rows_per_block(rng, poisoned, to_device, shape, dtype, kernel, saved_stats):
        # The benchmark's problem (float16 16384 x 4096: ~40 rows per block on an H100) and (5000, 4096) in every
        # dtype.
        assert block_iterations(native(), shape, dtype, kernel, channels) >= 2
        check_backward(rng, poisoned, to_device, shape, dtype, kernel, saved_stats)

    return (test_forward_every_kernel_dtype_and_length, test_backward_every_kernel_dtype_and_length,
            test_backward_many_rows_per_block, test_backward_large_many_rows_per_block)
