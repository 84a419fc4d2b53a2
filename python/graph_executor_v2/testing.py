"""Numerical checks shared by the test suite and the benchmarks (which check correctness before they time)."""
from __future__ import annotations

import numpy as np

from ._optional import require
from .dtypes import to_numpy

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


def assert_close(actual, expected, dtype: str, reduction_length: int = 1, what: str = "result",
                 slack=0.0) -> None:
    """|actual - expected| <= atol + rtol * |expected| + slack elementwise. NaN in ``actual`` passes only where the
    reference itself is NaN (a mean over nothing, a NaN input); infinities must match exactly. ``slack`` (a number or
    an array of ``expected``'s shape): a further error bound the computation is known to have beyond its dtype's
    rounding, derived for it (an approximate function inside a library's epilogue)."""
    actual = np.asarray(actual).astype(np.float64)
    expected = np.asarray(expected).astype(np.float64)
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {actual.shape} != expected {expected.shape}")
    atol, rtol = tolerance(dtype, reduction_length)
    with np.errstate(invalid="ignore"):  # inf - inf
        close = np.abs(actual - expected) <= atol + rtol * np.abs(expected) + slack  # NaN compares False
    bad = ~(close | (actual == expected) | (np.isnan(actual) & np.isnan(expected)))
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        error = np.nanmax(np.abs(actual - expected)) if np.isfinite(actual).any() else float("nan")
        raise AssertionError(
            f"{what} ({dtype}): {int(bad.sum())} of {bad.size} elements out of tolerance (atol={atol:.2e}, "
            f"rtol={rtol:.2e}{'' if np.all(np.equal(slack, 0)) else ', plus the slack given'}); first at {index}: "
            f"got {actual[index]!r}, expected {expected[index]!r}; max abs error {error:.3e}"
        )


def _fp8_ordered(values) -> np.ndarray:
    """FP8 values as integers in value order (sign-magnitude bits): neighbours differ by one."""
    bits = np.asarray(values).view(np.uint8).astype(np.int64)
    return np.where(bits & 0x80, -(bits & 0x7F), bits & 0x7F)


def assert_within_one_fp8_ulp(actual, expected_float64, dtype: str, what: str = "result",
                              accumulation_bound=None) -> None:
    """Each element of the FP8 array ``actual`` one FP8 ulp from the reference at most, or, where the sum cancels to
    near zero (FP8 ulps there are tiny), within ``accumulation_bound`` (the float32 accumulation's error, in output
    units, elementwise) of it. ``expected_float64`` holds exactly representable ``dtype`` values."""
    storage = to_numpy(dtype)
    expected = np.asarray(expected_float64).astype(storage)
    actual = np.asarray(actual)
    distance = np.abs(_fp8_ordered(actual.astype(storage)) - _fp8_ordered(expected))
    gap = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    bad = (distance > 1) & ~(gap <= (0.0 if accumulation_bound is None else accumulation_bound))
    if bad.any():
        index = tuple(np.argwhere(bad)[0])
        bound = "" if accumulation_bound is None else f", accumulation bound {float(accumulation_bound[index]):.3g}"
        raise AssertionError(f"{what}: {int(bad.sum())} of {distance.size} elements more than one FP8 ulp away and "
                             f"past the accumulation bound (max {int(distance.max())} ulps); first at {index}: got "
                             f"{actual[index]!r}, expected {expected[index]!r}{bound}; exactly equal: "
                             f"{float((distance == 0).mean()):.4f}")


def random_array(rng: np.random.Generator, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    """Fresh normal random values, rounded to ``dtype`` (so the float64 reference sees the same inputs)."""
    from .dtypes import to_numpy

    return (rng.standard_normal(shape) * scale).astype(to_numpy(dtype))


def captured_graph(run, stream):
    """A CUDA graph of ``run()``'s launches on ``stream`` (a runtime Stream): ``run`` goes once uncaptured first, so
    plans and workspaces are set up outside the capture, then once captured. A failed capture is aborted (else the
    thread stays capturing and later CUDA calls fail) and its error raised."""
    from .device import runtime

    run()
    stream.synchronize()
    graph = runtime().CudaGraph()
    graph.begin_capture(stream.handle)
    try:
        run()
    except BaseException:
        graph.abort_capture()
        raise
    graph.end_capture()
    return graph


def mlp(rng: np.random.Generator, sizes, dtype: str, activation: str, batch="batch", residual: bool = False):
    """An MLP graph written the way users write it (matmul, add, activation; ``residual`` adds each square
    layer's input back before its activation), and its float64 NumPy twin on the same dtype-rounded weights.

    Parameters are ``w{i}`` (fan_in x fan_out) and ``b{i}``; the input is ``x`` (batch x sizes[0]) and the output
    ``y``. Returns ``(graph, reference)`` with ``reference(x) -> float64 array``."""
    from .ir import Graph
    from .ops import activations

    g = Graph(f"mlp_{activation}_{dtype}")
    h = g.input("x", (batch, sizes[0]), dtype)
    layers = []
    for index, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        w = g.param(f"w{index}", random_array(rng, (fan_in, fan_out), dtype, scale=fan_in ** -0.5))
        b = g.param(f"b{index}", random_array(rng, (fan_out,), dtype, scale=0.1))
        add_input = residual and fan_in == fan_out
        z = g.add(g.matmul(h, w), b)
        if add_input:
            z = g.add(z, h)
        last = index == len(sizes) - 2
        h = z if last else getattr(g, activation)(z)
        layers.append((w.data.astype(np.float64), b.data.astype(np.float64), add_input, last))
    g.output(h, "y")

    def reference(x: np.ndarray) -> np.ndarray:
        h64 = np.asarray(x).astype(np.float64)
        for w, b, add_input, last in layers:
            z = h64 @ w + b
            if add_input:
                z = z + h64
            h64 = z if last else activations.apply(activation, z)
        return h64

    return g, reference


def branches(rng: np.random.Generator, count: int, width: int, dtype: str, activation: str = "relu", batch=64):
    """``count`` independent GEMM+bias+activation branches of one input ``x`` (batch x width), summed into ``y``:
    the graph that exercises several streams. Returns ``(graph, reference)`` like ``mlp``."""
    from .ir import Graph
    from .ops import activations

    g = Graph(f"branches_{count}x{width}_{dtype}")
    x = g.input("x", (batch, width), dtype)
    weights, total = [], None
    for index in range(count):
        w = g.param(f"w{index}", random_array(rng, (width, width), dtype, scale=width ** -0.5))
        b = g.param(f"b{index}", random_array(rng, (width,), dtype, scale=0.1))
        h = getattr(g, activation)(g.add(g.matmul(x, w), b))
        total = h if total is None else g.add(total, h)
        weights.append((w.data.astype(np.float64), b.data.astype(np.float64)))
    g.output(total, "y")

    def reference(x_value: np.ndarray) -> np.ndarray:
        x64 = np.asarray(x_value).astype(np.float64)
        return sum(activations.apply(activation, x64 @ w + b) for w, b in weights)

    return g, reference


def torch_mlp_block(width: int):
    """A PyTorch pre-norm transformer MLP block with a residual (what a GPT block is around its attention):
    ``x + down(gelu_tanh(up(layernorm(x))))``, hidden width ``4 * width``; the model the torch frontend tests and the
    ONNX benchmark import. Needs PyTorch."""
    torch = require("torch", "ge2.testing.torch_mlp_block")

    class MlpBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)
            self.up = torch.nn.Linear(width, 4 * width)
            self.down = torch.nn.Linear(4 * width, width)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x)), approximate="tanh"))

    return MlpBlock()
