"""dropout: Philox4x32-10 known-answer vectors (NumPy and the kernels' own code run on the host), the mask's
definition, statistics and validation (CPU); on the GPU every kernel x dtype against the NumPy mask element by
element, reproducibility across kernels, launch shapes and chunked launches, backward, mask statistics on 1M
elements, in place, plan-style launches and torch interop."""
from __future__ import annotations

import math

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2 import _native
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, Problem
from graph_executor_v2.ops import dropout as dp
from graph_executor_v2.testing import assert_close, random_array

DTYPES = ("float32", "float16", "bfloat16")
native_built = pytest.mark.skipif(not _native.is_built("_ops_dropout"), reason="_ops_dropout not built")

# Random123's published known-answer vectors for Philox4x32-10 (its tests/kat_vectors): counter, key, output.
PHILOX_KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def keep_fraction_bounds(p: float, count: int, sigmas: float = 5.0) -> tuple[float, float]:
    sigma = math.sqrt(p * (1 - p) / count)
    return 1 - p - sigmas * sigma, 1 - p + sigmas * sigma


# ---------------------------------------------------------------------------------------------------------------
# CPU: Philox, the mask, references, validation
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("counter, key, expected", PHILOX_KAT)
def test_numpy_philox_known_answers(counter, key, expected):
    assert tuple(int(word) for word in dp.philox4x32_10(counter, key)) == expected


@native_built
@pytest.mark.parametrize("counter, key, expected", PHILOX_KAT)
def test_kernel_philox_known_answers(counter, key, expected):
    """The kernels' Philox (philox.cuh, compiled for the host too) against the published vectors."""
    assert tuple(_native.load("_ops_dropout").philox4x32_10(counter, key)) == expected


@native_built
def test_kernel_philox_matches_numpy_on_random_inputs(rng):
    native = _native.load("_ops_dropout")
    counters = rng.integers(0, 2**32, (200, 4), dtype=np.uint64)
    keys = rng.integers(0, 2**32, (200, 2), dtype=np.uint64)
    vectorized = dp.philox4x32_10(counters.T, keys.T)
    for i in range(200):
        expected = tuple(int(word[i]) for word in vectorized)
        assert tuple(native.philox4x32_10(tuple(map(int, counters[i])), tuple(map(int, keys[i])))) == expected


def test_mask_definition(rng):
    """Element e = offset + i uses word e % 4 of philox((e // 4 low, e // 4 high, 0, 0), (seed low, seed high))."""
    for seed, offset in ((0, 0), (2**40 + 17, 5), (2**64 - 1, 2**35 + 3), (12345, 2**64 - 50)):
        p = 0.37
        mask = dp.keep_mask(50, p, seed, offset)
        for i in rng.choice(50, 10, replace=False):
            element = offset + int(i)
            words = dp.philox4x32_10((element // 4 & 0xFFFFFFFF, element // 4 >> 32, 0, 0),
                                     (seed & 0xFFFFFFFF, seed >> 32))
            assert mask[i] == (int(words[element % 4]) < dp.keep_threshold(p))


def test_mask_depends_only_on_seed_offset_and_index():
    whole = dp.keep_mask(1000, 0.5, 99, 0)
    for offset in (1, 2, 3, 4, 517):
        np.testing.assert_array_equal(dp.keep_mask(1000 - offset, 0.5, 99, offset), whole[offset:])
    assert not np.array_equal(dp.keep_mask(1000, 0.5, 100, 0), whole)  # another seed, another mask


def test_keep_threshold():
    assert dp.keep_threshold(0.0) == 2**32
    assert dp.keep_threshold(0.5) == 2**31
    assert dp.keep_threshold(0.1) == math.floor(0.9 * 2**32)
    assert dp.keep_mask(100, 0.0, 7).all()


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_mask_statistics(p):
    mask = dp.keep_mask(1 << 20, p, 2024, 0)
    low, high = keep_fraction_bounds(p, mask.size)
    assert low <= mask.mean() <= high
    # neighbours are independent: P(both kept) ~ (1 - p)^2
    both = np.mean(mask[:-1] & mask[1:])
    sigma = math.sqrt((1 - p) ** 2 * (1 - (1 - p) ** 2) / mask.size)
    assert abs(both - (1 - p) ** 2) < 6 * sigma


def test_reference_closed_form(rng):
    x = rng.standard_normal((7, 9))
    mask = dp.keep_mask(63, 0.25, 5, 3).reshape(7, 9)
    np.testing.assert_array_equal(dp.reference(x, 0.25, 5, 3), np.where(mask, x / 0.75, 0.0))
    np.testing.assert_array_equal(dp.reference(x, 0.0, 5), x)
    np.testing.assert_array_equal(dp.reference_backward(x, 0.25, 5, 3), dp.reference(x, 0.25, 5, 3))


def test_reference_backward_matches_finite_differences(rng):
    x = rng.standard_normal(40)
    dy = rng.standard_normal(40)
    grad = dp.reference_backward(dy, 0.3, 11)
    numeric = np.array([(np.sum(dy * dp.reference(x + e, 0.3, 11)) - np.sum(dy * dp.reference(x - e, 0.3, 11))) / 2e-6
                        for e in np.eye(40) * 1e-6])
    np.testing.assert_allclose(grad, numeric, atol=1e-6)


def test_registered_opdef():
    op = OPS["dropout"]
    assert [i.name for i in op.inputs] == ["x"] and [a.name for a in op.attrs] == ["p", "seed", "offset"]
    assert op.pure is False
    assert [c.name for c in op.candidates] == ["vec16", "scalar"]
    assert [c.always_works for c in selection.candidates(op)] == [False, True]
    attrs = op.validate_attrs({"p": 0.5, "seed": 3}, "node")
    assert attrs["offset"] == 0
    (out,) = op.infer([TensorType(("batch", 8), "bfloat16")], attrs)
    assert out == TensorType(("batch", 8), "bfloat16")
    with pytest.raises(ValueError, match="attribute 'p' must satisfy 0 <= p < 1, got 1.0"):
        op.validate_attrs({"p": 1.0, "seed": 3}, "node")
    with pytest.raises(ValueError, match="attribute 'seed' must be in"):
        op.validate_attrs({"p": 0.5, "seed": -1}, "node")
    with pytest.raises(ValueError, match="requires attribute 'seed'"):
        op.validate_attrs({"p": 0.5}, "node")
    with pytest.raises(TypeError, match="x: expected dtype float32, float16 or bfloat16, got int32"):
        op.infer([TensorType((4,), "int32")], attrs)
    with pytest.raises(ValueError, match="offset: offset \\+ element count"):
        op.infer([TensorType((8,), "float32")], op.validate_attrs({"p": 0.5, "seed": 3, "offset": 2**64 - 4}, "n"))


def test_run_reference_and_executor_cpu(rng):
    x = random_array(rng, (6, 10), "float16")
    attrs = {"p": 0.4, "seed": 77, "offset": 8}
    (y,) = OPS["dropout"].run_reference([x], attrs)
    assert y.dtype == np.float16
    assert_close(y, dp.reference(x, 0.4, 77, 8), "float16")
    g = ge2.ir.Graph("drop")
    v = g.input("x", ("batch", 10), "float16")
    g.output(g.dropout(v, p=0.4, seed=77, offset=8), "y")
    assert_close(ge2.ExecutorV2(g, device="cpu").run({"x": x})["y"], dp.reference(x, 0.4, 77, 8), "float16")


def test_validation_errors_name_the_argument(rng):
    x = random_array(rng, (4, 5), "float32")
    calls = [
        (lambda: dp.forward_numpy(x, 1.0, 0), ValueError, "attribute 'p' must satisfy 0 <= p < 1, got 1.0"),
        (lambda: dp.forward_numpy(x, -0.1, 0), ValueError, "attribute 'p' must satisfy 0 <= p < 1"),
        (lambda: dp.forward_numpy(x, float("nan"), 0), ValueError, "attribute 'p' must satisfy 0 <= p < 1"),
        (lambda: dp.forward_numpy(x, "0.5", 0), TypeError, "attribute 'p' expected float"),
        (lambda: dp.forward_numpy(x, True, 0), TypeError, "attribute 'p' expected float, got bool"),
        (lambda: dp.forward_numpy(x, 0.5, -1), ValueError, r"attribute 'seed' must be in \[0, 2\*\*64\)"),
        (lambda: dp.forward_numpy(x, 0.5, 2**64), ValueError, "attribute 'seed' must be in"),
        (lambda: dp.forward_numpy(x, 0.5, 1.5), TypeError, "attribute 'seed' expected int"),
        (lambda: dp.forward_numpy(x, 0.5, 1, offset=-4), ValueError, "attribute 'offset' must be in"),
        (lambda: dp.forward_numpy(x, 0.5, 1, offset=2**64 - 10), ValueError,
         r"offset: offset \+ element count .* exceeds 2\*\*64"),
        (lambda: dp.forward_numpy(x.astype(np.int32), 0.5, 1), TypeError, "x: expected dtype float32"),
        (lambda: dp.forward_numpy(x.tolist(), 0.5, 1), TypeError, "x: expected a NumPy array"),
        (lambda: dp.forward_numpy(x, 0.5, 1, kernel="fast"), ValueError, "kernel: expected one of auto, vec16"),
        (lambda: dp.backward_numpy(x.astype(np.float64), x, 0.5, 1), TypeError, "dy: expected"),
        (lambda: dp.backward_numpy(x, x, 1.5, 1), ValueError, "attribute 'p' must satisfy 0 <= p < 1"),
        (lambda: dp.keep_mask(10, 0.5, -3), ValueError, "seed"),
    ]
    for call, error, message in calls:
        with pytest.raises(error, match=message):
            call()


@native_built
def test_native_reasons_and_table():
    native = _native.load("_ops_dropout")
    assert [k["name"] for k in native.kernels()] == ["vec16", "scalar"]
    assert native.unsupported_reason("vec16", 8, True) == ""
    assert "multiple of 4" in native.unsupported_reason("vec16", 6, True)
    assert "aligned" in native.unsupported_reason("vec16", 0, False)
    assert native.unsupported_reason("scalar", 7, False) == ""


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def check_output(y, x, p, seed, offset, dtype, what):
    """Element by element: dropped elements exactly 0, kept ones x / (1 - p) (x is never 0 here)."""
    y64 = np.asarray(y).astype(np.float64).reshape(-1)
    mask = dp.keep_mask(y64.size, p, seed, offset)
    np.testing.assert_array_equal(y64 != 0, mask, err_msg=f"mask {what}")
    assert_close(y64, dp.reference(x, p, seed, offset).reshape(-1), dtype, what=what)


def nonzero_random(rng, shape, dtype):
    x = np.asarray(random_array(rng, shape, dtype))  # 0-d stays an array
    x[x.astype(np.float64) == 0] = 1  # so a zero output means "dropped"
    return x


# shapes: empty, 0-d, sizes around the 4-element Philox groups and 16-byte packs, a 2-d array, 1M elements.
SHAPES = [(0,), (), (1,), (3,), (4,), (5,), (7,), (8,), (9,), (1000,), (1001,), (33, 77), (1 << 20,)]
OFFSETS = [0, 4, 5, 2**40 + 3, 2**64 - (1 << 21)]
SEEDS = [0, 2**63 + 5]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_every_kernel(rng, to_device, poisoned, dtype, shape):
    x = nonzero_random(rng, shape, dtype)
    native = _native.load("_ops_dropout")
    for offset in OFFSETS:
        for seed in SEEDS:
            p = float(rng.choice([0.1, 0.5, 0.8]))
            for kernel in ("vec16", "scalar", "auto"):
                if kernel == "vec16" and native.unsupported_reason("vec16", offset, True):
                    continue
                out = poisoned(shape, dtype)
                assert dp.forward(to_device(x), p, seed, offset, kernel, out=out) is out
                check_output(out.numpy(), x, p, seed, offset, dtype, f"{kernel} {shape} offset {offset} seed {seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_same_mask_on_any_launch(rng, to_device, dtype):
    """vec16 and scalar agree bit for bit, and launching in chunks (each with its offset) equals one launch."""
    x = nonzero_random(rng, (10007,), dtype)
    whole = dp.forward(to_device(x), 0.3, 42, 0, "vec16").numpy()
    assert dp.forward(to_device(x), 0.3, 42, 0, "scalar").numpy().tobytes() == whole.tobytes()
    for cuts in ((5000,), (1, 2, 3, 4000), (4096, 8192)):
        bounds = (0,) + cuts + (x.size,)
        pieces = [dp.forward(to_device(x[a:b]), 0.3, 42, a).numpy() for a, b in zip(bounds, bounds[1:])]
        assert np.concatenate(pieces).tobytes() == whole.tobytes(), cuts
    assert dp.forward(to_device(x.reshape(1, 10007)), 0.3, 42).numpy().reshape(-1).tobytes() == whole.tobytes()
    other = dp.forward(to_device(x), 0.3, 43, 0).numpy()
    assert 0.4 < np.mean((whole != 0) == (other != 0)) < 0.75  # another seed, an independent mask


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_regenerates_the_mask(rng, to_device, poisoned, dtype):
    x = nonzero_random(rng, (64, 33), dtype)
    dy = nonzero_random(rng, (64, 33), dtype)
    for offset in (0, 6):
        y = dp.forward(to_device(x), 0.45, 9, offset).numpy()
        out = poisoned((64, 33), dtype)
        assert dp.backward(to_device(dy), to_device(x), 0.45, 9, offset, out=out)[0] is out
        dx = out.numpy()
        check_output(dx, dy, 0.45, 9, offset, dtype, f"backward offset {offset}")
        np.testing.assert_array_equal(dx != 0, y != 0)
        check_output(dp.backward_numpy(dy, x, 0.45, 9, offset)[0], dy, 0.45, 9, offset, dtype, "backward_numpy")


@pytest.mark.gpu
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_mask_statistics_on_the_gpu(to_device, p):
    ones = np.ones(1 << 20, np.float32)
    y = dp.forward(to_device(ones), p, 123).numpy()
    scale = np.float32(1.0 / (1.0 - p))
    assert set(np.unique(y).tolist()) <= {0.0, float(scale)}
    low, high = keep_fraction_bounds(p, y.size)
    assert low <= np.mean(y != 0) <= high
    np.testing.assert_array_equal(y != 0, dp.keep_mask(y.size, p, 123))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_p_zero_is_identity_and_in_place(rng, to_device, dtype):
    x = nonzero_random(rng, (1000,), dtype)
    assert dp.forward(to_device(x), 0.0, 5).numpy().tobytes() == x.tobytes()
    assert dp.forward_numpy(x, 0, 5).tobytes() == x.tobytes()
    device_x = to_device(x)
    assert dp.forward(device_x, 0.25, 5, out=device_x) is device_x
    check_output(device_x.numpy(), x, 0.25, 5, 0, dtype, "in place")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_candidates_launch_plan_style(rng, to_device, poisoned, dtype):
    op = OPS["dropout"]
    x = nonzero_random(rng, (17, 31), dtype)
    for offset in (0, 3):
        attrs = op.validate_attrs({"p": 0.6, "seed": 2**50 + 1, "offset": offset}, "node")
        in_types = (TensorType(x.shape, dtype),)
        problem = Problem("dropout", in_types, tuple(op.infer(in_types, attrs)), attrs)
        ran = 0
        for candidate in op.candidates:
            if candidate.supports(problem) is not None:
                continue
            out = poisoned(x.shape, dtype)
            # Hold the DeviceArray: `[to_device(x).ptr]` frees x (cudaFree) before the launch reads it.
            x_device = to_device(x)
            candidate.prepare(problem)([x_device.ptr], [out.ptr], 0)
            check_output(out.numpy(), x, 0.6, 2**50 + 1, offset, dtype, f"{candidate.name} offset {offset}")
            ran += 1
        assert ran == (2 if offset == 0 else 1)


ODD_COUNTS = (1, 3, 5, 7, 9, 15, 17, 31, 33, 527, 1001, 4099)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_odd_counts_every_path(rng, to_device, poisoned, dtype):
    """Counts that are not a multiple of the 16-byte pack through every path: forward/backward x numpy/device/
    native raw pointers, and the plan-style candidate launch. Each device input is held alive for its launch
    (memcheck catches any read past `count`); raw-pointer outputs have a poisoned guard band that must stay NaN
    (a write past `count` fails even without the sanitizer)."""
    native = _native.load("_ops_dropout")
    op = OPS["dropout"]
    guard = 64  # elements past the end, at least 4 packs for every dtype
    p, seed = 0.4, 2**33 + 7
    for count in ODD_COUNTS:
        x = nonzero_random(rng, (count,), dtype)
        for offset in (0, 4, 3):
            what = f"count {count} offset {offset}"
            check_output(dp.forward_numpy(x, p, seed, offset), x, p, seed, offset, dtype, f"forward_numpy {what}")
            check_output(dp.backward_numpy(x, x, p, seed, offset)[0], x, p, seed, offset, dtype,
                         f"backward_numpy {what}")
            for kernel in ("vec16", "scalar", "auto"):
                if kernel == "vec16" and native.unsupported_reason("vec16", offset, True):
                    continue
                x_device = to_device(x)
                out = poisoned((count,), dtype)
                assert dp.forward(x_device, p, seed, offset, kernel, out=out) is out
                check_output(out.numpy(), x, p, seed, offset, dtype, f"forward {kernel} {what}")
                out = poisoned((count,), dtype)
                assert dp.backward(x_device, x_device, p, seed, offset, kernel, out=(out,))[0] is out
                check_output(out.numpy(), x, p, seed, offset, dtype, f"backward {kernel} {what}")
                for direction in ("forward", "backward"):
                    guarded = poisoned((count + guard,), dtype)
                    # the native entry points run a named kernel: "auto" is the selector's choice for these arrays
                    named = dp.kernel_for(kernel, offset, not (x_device.ptr | guarded.ptr) % 16, dtype)
                    getattr(native, direction)(x_device.ptr, guarded.ptr, count, dtype, p, seed, offset, named, 0)
                    y = guarded.numpy()
                    check_output(y[:count], x, p, seed, offset, dtype, f"native {direction} {kernel} {what}")
                    assert np.isnan(y[count:].astype(np.float32)).all(), f"native {direction} {kernel} {what}: " \
                                                                          "wrote past count"
            attrs = op.validate_attrs({"p": p, "seed": seed, "offset": offset}, "node")
            in_types = (TensorType(x.shape, dtype),)
            problem = Problem("dropout", in_types, tuple(op.infer(in_types, attrs)), attrs)
            for candidate in op.candidates:
                if candidate.supports(problem) is not None:
                    continue
                x_device = to_device(x)
                guarded = poisoned((count + guard,), dtype)
                candidate.prepare(problem)([x_device.ptr], [guarded.ptr], 0)
                y = guarded.numpy()
                check_output(y[:count], x, p, seed, offset, dtype, f"plan-style {candidate.name} {what}")
                assert np.isnan(y[count:].astype(np.float32)).all(), f"plan-style {candidate.name} {what}: " \
                                                                      "wrote past count"


@pytest.mark.gpu
def test_large_float16_mask(rng, to_device):
    """16M float16 elements: the statistics and the exact mask over many grid-stride iterations."""
    x = np.ones(1 << 24, np.float16)
    y = dp.forward(to_device(x), 0.2, 31337, 1 << 30).numpy()
    low, high = keep_fraction_bounds(0.2, y.size)
    assert low <= np.mean(y != 0) <= high
    np.testing.assert_array_equal(y != 0, dp.keep_mask(y.size, 0.2, 31337, 1 << 30))


@pytest.mark.gpu
def test_torch_interop_and_misaligned_views(rng):
    torch = pytest.importorskip("torch")
    for dtype in DTYPES:
        torch_dtype = getattr(torch, dtype)
        x = torch.randn(3000, device="cuda").to(torch_dtype)
        x[x == 0] = 1
        y = dp.forward(x, 0.3, 8)
        assert isinstance(y, torch.Tensor) and y.dtype == torch_dtype and y.shape == x.shape
        host = x.float().cpu().numpy()
        check_output(y.float().cpu().numpy(), host, 0.3, 8, 0, dtype, "torch")
        # one element off a 16-byte boundary: the scalar path, same mask
        storage = torch.empty(3001, dtype=torch_dtype, device="cuda")
        shifted = storage[1:]
        shifted.copy_(x)
        assert torch.equal(dp.forward(shifted, 0.3, 8), y)
        assert torch.equal(dp.backward(shifted, shifted, 0.3, 8)[0], y)


@pytest.mark.gpu
def test_device_errors(rng, to_device):
    x = to_device(random_array(rng, (8,), "float32"))
    with pytest.raises(ValueError, match=r"out: expected shape \(8,\)"):
        dp.forward(x, 0.5, 1, out=to_device(np.zeros(9, np.float32)))
    with pytest.raises(ValueError, match="kernel: 'vec16' cannot run this problem: offset 3"):
        dp.forward(x, 0.5, 1, 3, kernel="vec16")
    torch = pytest.importorskip("torch")
    t = torch.zeros(16, device="cuda")
    with pytest.raises(ValueError, match="out: must not overlap x"):
        dp.forward(t[:8], 0.5, 1, out=t[4:12])
    with pytest.raises(ValueError, match="x: expected a contiguous"):
        dp.forward(t[::2], 0.5, 1)
