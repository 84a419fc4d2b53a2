"""cast: the reference (CPU), the native kernel against it (GPU) and bad input."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ops import cast

PAIRS = [("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32"),
         ("float16", "bfloat16"), ("bfloat16", "float16"), ("float32", "float32")]
NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@pytest.mark.parametrize("source, target", PAIRS)
def test_reference_rounds_to_nearest_even(rng, source, target):
    x = (rng.standard_normal((7, 33)) * 3).astype(NUMPY[source])
    y = ge2.ExecutorV2(_graph(x.shape, source, target)).run({"x": x})["y"]
    assert y.dtype == NUMPY[target]
    np.testing.assert_array_equal(y, x.astype(NUMPY[target]))


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
@pytest.mark.parametrize("shape", [(1,), (7, 33), (1025, 1023)])
def test_native_cast_matches_the_reference(rng, source, target, shape):
    x = (rng.standard_normal(shape) * 3).astype(NUMPY[source])
    x.reshape(-1)[: min(4, x.size)] = np.array([0.0, -0.0, 65504.0, 1e-8])[: min(4, x.size)].astype(NUMPY[source])
    y = cast.forward_numpy(x, target)
    np.testing.assert_array_equal(y.astype(np.float64), x.astype(NUMPY[target]).astype(np.float64))
    with pytest.raises(ValueError, match="dtype"):
        cast.forward_numpy(x, "float64")


@pytest.mark.gpu
def test_cast_node_in_a_cuda_plan(rng):
    x = rng.standard_normal((64, 48)).astype(np.float32)
    executor = ge2.ExecutorV2(_graph(x.shape, "float32", "bfloat16"), device="cuda")
    assert not executor.fallbacks
    np.testing.assert_array_equal(executor.run({"x": x})["y"], x.astype(ml_dtypes.bfloat16))
