"""cast: the reference (CPU), the native kernel against it (GPU) and bad input; FP8 casts saturate, and FP8 arrays
travel as DeviceArrays, host arrays (ml_dtypes) and torch tensors (DLPack and the face's torch path)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ops import cast

PAIRS = [("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32"),
         ("float16", "bfloat16"), ("bfloat16", "float16"), ("float32", "float32")]
NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
         "float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2}
FP8_PAIRS = [("float32", "float8_e4m3fn"), ("float32", "float8_e5m2"), ("bfloat16", "float8_e4m3fn"),
             ("float16", "float8_e5m2"), ("float8_e4m3fn", "float32"), ("float8_e5m2", "bfloat16"),
             ("float8_e4m3fn", "float16"), ("float8_e4m3fn", "float8_e5m2"), ("float8_e5m2", "float8_e4m3fn")]
# Values where a cast to FP8 can go wrong: signed zeros, overflow (saturates), infinities (saturate), NaN (stays),
# ties at the largest finite value's rounding edge, subnormals and underflow, and ties to even.
SPECIAL = np.array([0.0, -0.0, 1e6, -1e6, np.inf, -np.inf, np.nan, 448.0, 464.0, 480.0, 57344.0, 61440.0, 2.0 ** -9,
                    2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -16, 2.0 ** -17, 1.0625, 1.1875, -0.3])


def _fp8_input(rng, shape, source):
    """Normal values spread over FP8's range (scaled by powers of two), with the special values in front."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, shape))
    flat = x.reshape(-1)
    flat[: min(SPECIAL.size, flat.size)] = SPECIAL[: flat.size]
    return x.astype(NUMPY[source])


def _same_bits_or_both_nan(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape
    mismatch = ~((actual == expected) & (np.signbit(actual) == np.signbit(expected))
                 | (np.isnan(actual) & np.isnan(expected)))
    if mismatch.any():
        index = np.argwhere(mismatch)[0]
        raise AssertionError(f"{int(mismatch.sum())} of {mismatch.size} differ; first at {tuple(index)}: got "
                             f"{actual[tuple(index)]!r}, expected {expected[tuple(index)]!r}")


@pytest.mark.parametrize("source, target", PAIRS)
def test_reference_rounds_to_nearest_even(rng, source, target):
    x = (rng.standard_normal((7, 33)) * 3).astype(NUMPY[source])
    y = ge2.ExecutorV2(_graph(x.shape, source, target)).run({"x": x})["y"]
    assert y.dtype == NUMPY[target]
    np.testing.assert_array_equal(y, x.astype(NUMPY[target]))


@pytest.mark.parametrize("target, limit", [("float8_e4m3fn", 448.0), ("float8_e5m2", 57344.0)])
def test_reference_saturates_to_float8(target, limit):
    x = np.array([1e6, -1e6, np.inf, -np.inf, np.nan, limit, 0.1, -0.0], np.float32)
    y = cast.reference(x, target)
    np.testing.assert_array_equal(y[:4], [limit, -limit, limit, -limit])
    assert np.isnan(y[4]) and y[5] == limit and np.signbit(y[7])
    assert y[6] == float(np.float32(0.1).astype(NUMPY[target]))  # in range: plain round to nearest even
    # ml_dtypes' own cast does not saturate: the reference must not be a plain astype
    assert not np.isfinite(x[:1].astype(NUMPY[target]).astype(np.float64)).all()


@pytest.mark.parametrize("source, target", FP8_PAIRS)
def test_float8_casts_in_a_cpu_graph(rng, source, target):
    x = _fp8_input(rng, (5, 16), source)
    y = ge2.ExecutorV2(_graph(x.shape, source, target)).run({"x": x})["y"]
    assert y.dtype == NUMPY[target]
    _same_bits_or_both_nan(y, cast.reference(x, target))


def _graph(shape, source, target):
    g = ge2.ir.Graph("cast")
    g.output(g.cast(g.input("x", shape, source), dtype=target), "y")
    return g


@pytest.mark.parametrize("source, target, values, expected", [
    ("float32", "int32", [2.7, -2.7, 0.5, -0.0], [2, -2, 0, 0]),  # toward zero
    ("float16", "uint8", [3.9, 255.0, 0.0], [3, 255, 0]),
    ("float32", "bool", [0.0, -0.0, 1e-30, float("nan"), -2.0], [False, False, True, True, True]),
    ("int64", "int32", [2**31 + 5, -1], [-(2**31) + 5, -1]),  # wraps
    ("int32", "float16", [3, -70000], [3.0, -float("inf")]),
    ("bool", "float32", [True, False], [1.0, 0.0]),
    ("uint8", "int64", [255, 0], [255, 0]),
])
def test_casts_between_every_kind_of_dtype(source, target, values, expected):
    x = np.array(values).astype(ge2.dtypes.to_numpy(source))
    y = ge2.ExecutorV2(_graph(x.shape, source, target)).run({"x": x})["y"]
    assert y.dtype == ge2.dtypes.to_numpy(target)
    np.testing.assert_array_equal(y, np.array(expected).astype(ge2.dtypes.to_numpy(target)))


def test_integer_cast_has_no_gradient():
    from graph_executor_v2.ops import OPS

    assert OPS["cast"].reference_backward([np.zeros(3, np.int32)], None, [np.ones(3)], {"dtype": "float32"}) == [None]


def test_bad_dtype_is_named():
    g = ge2.ir.Graph("bad")
    x = g.input("x", (3,), "float32")
    with pytest.raises(ValueError, match="dtype"):
        g.cast(x, dtype="float64")
    with pytest.raises(ValueError, match="dtype: expected one of"):
        cast.reference(np.zeros(3, np.float32), "int8")


@pytest.mark.gpu
@pytest.mark.parametrize("source, target", PAIRS)
# (7, 33), (1025, 1023): 8-element vectors and an element-wise tail; (64, 64): vectors only; (1,): the tail only
@pytest.mark.parametrize("shape", [(1,), (7, 33), (64, 64), (1025, 1023)])
def test_native_cast_matches_the_reference(rng, source, target, shape):
    x = (rng.standard_normal(shape) * 3).astype(NUMPY[source])
    x.reshape(-1)[: min(4, x.size)] = np.array([0.0, -0.0, 65504.0, 1e-8])[: min(4, x.size)].astype(NUMPY[source])
    y = cast.forward_numpy(x, target)
    np.testing.assert_array_equal(y.astype(np.float64), x.astype(NUMPY[target]).astype(np.float64))
    with pytest.raises(ValueError, match="dtype"):
        cast.forward_numpy(x, "float64")


@pytest.mark.gpu
@pytest.mark.parametrize("source, target", FP8_PAIRS)
@pytest.mark.parametrize("shape", [(3,), (7, 33), (1025, 1023)])
def test_native_float8_cast_is_bit_exact(rng, source, target, shape):
    x = _fp8_input(rng, shape, source)
    _same_bits_or_both_nan(cast.forward_numpy(x, target), cast.reference(x, target))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_device_arrays_round_trip_and_poison_to_nan(rng, dtype):
    x = _fp8_input(rng, (33, 17), "float32").astype(NUMPY[dtype])
    array = ge2.device.DeviceArray.from_numpy(x)
    assert (array.dtype, array.itemsize, array.nbytes) == (dtype, 1, x.size)
    _same_bits_or_both_nan(array.numpy(), x)
    array.poison()
    assert np.isnan(array.numpy().astype(np.float64)).all()
    with pytest.raises(ValueError, match="no typestr for " + dtype):
        array.__cuda_array_interface__


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_interoperates_with_torch(rng, dtype):
    """torch's float8 tensors through DLPack (codes kDLFloat8_e4m3fn = 10 / kDLFloat8_e5m2 = 12, DLPack 1.1) both
    ways, and through the op face's torch path (data_ptr, no DLPack): torch in, torch out."""
    torch = pytest.importorskip("torch")
    torch_dtype = getattr(torch, dtype)
    x = _fp8_input(rng, (16, 24), "float32")
    expected = cast.reference(x, dtype)
    # representable values, so that torch's own (non-saturating) conversion is exact
    source = torch.from_numpy(expected.astype(np.float32)).cuda().to(torch_dtype)
    try:
        borrowed = ge2.device.as_device_array(source)
    except Exception as error:  # report what this torch exports instead of a bare failure
        raise AssertionError(f"torch {torch.__version__} float8 DLPack export not importable: {error!r}") from error
    assert borrowed.dtype == dtype and borrowed.ptr == source.data_ptr()
    np.testing.assert_array_equal(borrowed.numpy().view(np.uint8), source.view(torch.uint8).cpu().numpy())
    ours = ge2.device.DeviceArray.from_numpy(expected.astype(NUMPY[dtype]))
    exported = torch.from_dlpack(ours)
    assert exported.dtype == torch_dtype and exported.data_ptr() == ours.ptr
    _same_bits_or_both_nan(exported.float().cpu().numpy(), expected)
    # the face: torch float8 in -> torch float32 out, and torch float32 in -> torch float8 out (saturated by GE2)
    widened = cast.forward(exported, "float32")
    assert isinstance(widened, torch.Tensor) and widened.dtype == torch.float32
    _same_bits_or_both_nan(widened.cpu().numpy(), expected)
    narrowed = cast.forward(torch.from_numpy(x.astype(np.float32)).cuda(), dtype)
    assert isinstance(narrowed, torch.Tensor) and narrowed.dtype == torch_dtype
    _same_bits_or_both_nan(narrowed.float().cpu().numpy(), expected)


@pytest.mark.gpu
def test_cast_node_in_a_cuda_plan(rng):
    x = rng.standard_normal((64, 48)).astype(np.float32)
    executor = ge2.ExecutorV2(_graph(x.shape, "float32", "bfloat16"), device="cuda")
    assert not executor.fallbacks
    np.testing.assert_array_equal(executor.run({"x": x})["y"], x.astype(ml_dtypes.bfloat16))
