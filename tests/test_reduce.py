"""sum, mean, max: reference math, axis handling, validation, OpDef and graphs (CPU); every op x dtype x kernel x
layout, backward (ties split equally for max), NaN, empty and size-1 axes, split reductions, determinism and
interop on the GPU."""
from __future__ import annotations

import json

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir import Graph, TensorType
from graph_executor_v2.ops import reduce
from graph_executor_v2.ops._base import Problem
from graph_executor_v2.testing import assert_close
from row_norm_checks import numeric_gradient

OPS = ("sum", "mean", "max")
DTYPES = ("float32", "float16", "bfloat16")
KERNELS = ("row_warp", "row_block", "column", "column_wave", "generic")
F32 = np.float32


# ---------------------------------------------------------------------------------------------------------------
# CPU: reference against closed forms and finite differences
# ---------------------------------------------------------------------------------------------------------------
def test_reference_closed_forms():
    x = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(reduce.reference("sum", x, 1), [[12, 15, 18, 21], [48, 51, 54, 57]])
    np.testing.assert_array_equal(reduce.reference("sum", x, (0, 2)), [60, 92, 124])
    np.testing.assert_array_equal(reduce.reference("sum", x), 276)
    assert reduce.reference("sum", x).shape == ()
    assert reduce.reference("mean", x, None, True).shape == (1, 1, 1)
    np.testing.assert_array_equal(reduce.reference("mean", x, -1, True), [[[1.5], [5.5], [9.5]], [[13.5], [17.5],
                                                                                                 [21.5]]])
    np.testing.assert_array_equal(reduce.reference("max", x, (2, 0)), [15, 19, 23])
    np.testing.assert_array_equal(reduce.reference("sum", x, ()), x)  # no axes: nothing reduced
    with_nan = np.array([[1.0, np.nan, 3.0], [-np.inf, -np.inf, -np.inf]])
    maximum = reduce.reference("max", with_nan, 1)
    assert np.isnan(maximum[0]) and maximum[1] == -np.inf


def test_reference_backward_closed_forms():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [5.0, 0.0, -1.0]])
    dy = np.array([6.0, 3.0, 1.0])
    np.testing.assert_array_equal(reduce.reference_backward("max", dy, x, 1),
                                  [[0, 3, 3], [1, 1, 1], [1, 0, 0]])  # ties share dy equally
    np.testing.assert_array_equal(reduce.reference_backward("sum", dy, x, 1), np.repeat(dy[:, None], 3, 1))
    np.testing.assert_array_equal(reduce.reference_backward("mean", dy, x, 1, True), np.repeat(dy[:, None], 3, 1) / 3)
    np.testing.assert_array_equal(reduce.reference_backward("max", np.array(4.0), x), np.where(x == 5.0, 4.0, 0.0))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, axis, keepdims", [((3, 4), 1, False), ((3, 4), 0, True), ((2, 3, 4), (0, 2), False),
                                                   ((2, 3, 4), None, True), ((5,), 0, False)])
def test_reference_backward_matches_finite_differences(rng, op, shape, axis, keepdims):
    x = rng.permutation(np.arange(np.prod(shape), dtype=np.float64)).reshape(shape) * 0.1  # distinct: no ties
    y = reduce.reference(op, x, axis, keepdims)
    dy = rng.standard_normal(y.shape)
    dx = reduce.reference_backward(op, dy, x, axis, keepdims)
    numeric = numeric_gradient(lambda: float((reduce.reference(op, x, axis, keepdims) * dy).sum()), x, h=1e-4)
    np.testing.assert_allclose(dx, numeric, rtol=1e-6, atol=1e-8)


def test_normalize_axes_and_output_shape():
    assert reduce.normalize_axes(None, 3) == (0, 1, 2)
    assert reduce.normalize_axes(-1, 3) == (2,)
    assert reduce.normalize_axes((2, -3), 3) == (0, 2)
    assert reduce.normalize_axes([np.int64(1)], 3) == (1,)
    assert reduce.normalize_axes((), 3) == ()
    assert reduce.normalize_axes(None, 0) == ()
    assert reduce.output_shape((2, 3, 4), (0, 2), False) == (3,)
    assert reduce.output_shape((2, 3, 4), (0, 2), True) == (1, 3, 1)


# ---------------------------------------------------------------------------------------------------------------
# CPU: validation before any device work
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (("sum", np.ones((2, 3), F32)), dict(axis=2), ValueError, r"axis: expected axes in \[-2, 2\).*got 2"),
        (("mean", np.ones((2, 3), F32)), dict(axis=(0, -3)), ValueError, r"axis: expected axes in \[-2, 2\)"),
        (("max", np.ones((2, 3), F32)), dict(axis=(1, -1)), ValueError, r"axis: axis 1 is given more than once"),
        (("sum", np.ones((2, 3), F32)), dict(axis=1.0), TypeError,
         r"attribute 'axis' expected int or tuple, got float"),
        (("sum", np.ones((2, 3), F32)), dict(axis=True), TypeError, r"axis: expected None, an int or a tuple"),
        (("sum", np.ones((2, 3), F32)), dict(axis=(0, "1")), TypeError, r"axis: expected ints, got str"),
        (("sum", np.ones((2, 3), F32)), dict(keepdims=1), TypeError, r"attribute 'keepdims' expected bool, got int"),
        (("max", np.ones((2, 0), F32)), dict(axis=1), ValueError, r"axis: cannot max over axis 1 of size 0"),
        (("max", np.ones((2, 0), F32)), {}, ValueError, r"axis: cannot max over axis 1 of size 0"),
        (("sum", np.ones((0, 3), F32)), dict(axis=0), ValueError, r"axis: cannot sum over axis 0 of size 0"),
        (("mean", np.ones((4, 0, 3), F32)), dict(axis=(0, 1)), ValueError, r"axis: cannot mean over axis 1"),
        (("sum", np.ones((2, 3), np.int32)), {}, TypeError, r"x: expected dtype float32, float16 or bfloat16"),
        (("sum", [[1.0, 2.0]]), {}, TypeError, r"x: expected a NumPy array, got list"),
        (("sum", np.ones((2, 3), F32)), dict(kernel="tree"), ValueError, r"kernel: expected one of auto"),
    ],
)
def test_forward_numpy_rejects_bad_arguments(args, kwargs, error, match):
    op, *arrays = args
    with pytest.raises(error, match=match):
        getattr(ge2.ops, op).forward_numpy(*arrays, **kwargs)


def test_references_reject_empty_reductions():
    with pytest.raises(ValueError, match=r"axis: cannot max over axis 0 of size 0"):
        reduce.reference("max", np.ones((0, 2)), 0)
    with pytest.raises(ValueError, match=r"axis: cannot sum over axis 1 of size 0"):
        reduce.reference_backward("sum", np.ones(3), np.ones((3, 0)), 1)
    assert reduce.reference("sum", np.ones((0, 2)), 1).shape == (0,)  # empty kept axes are fine


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (("sum", np.ones((3,), F32), np.ones((2, 3), F32)), dict(axis=1), ValueError,
         r"dy: expected shape \(2,\) \(the output's\), got \(3,\)"),
        (("mean", np.ones((2,), F32), np.ones((2, 3), F32)), dict(axis=1, keepdims=True), ValueError,
         r"dy: expected shape \(2, 1\)"),
        (("sum", np.ones((2,), np.float16), np.ones((2, 3), F32)), dict(axis=1), TypeError,
         r"dy: expected dtype float32 \(the output's\), got float16"),
        (("max", np.ones((2,), F32), np.ones((2, 3), F32)), dict(axis=1, y=[1.0, 2.0]), TypeError,
         r"y: expected a NumPy array"),
        (("max", np.ones((2,), F32), np.ones((2, 0), F32)), dict(axis=1), ValueError, r"axis: cannot max over"),
    ],
)
def test_backward_numpy_rejects_bad_arguments(args, kwargs, error, match):
    op, *arrays = args
    with pytest.raises(error, match=match):
        getattr(ge2.ops, op).backward_numpy(*arrays, **kwargs)


def test_device_path_rejects_host_arrays():
    with pytest.raises(TypeError, match=r"x: expected a CUDA device array"):
        ge2.ops.sum.forward(np.ones((2, 3), F32))
    with pytest.raises(TypeError, match=r"x: expected a CUDA device array"):
        ge2.ops.sum.backward(np.ones(2, F32), np.ones((2, 3), F32), axis=1)


def test_no_gpu_is_a_clear_error():
    if ge2.device_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        ge2.ops.sum.forward_numpy(np.ones((2, 3), F32))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        ge2.ops.max.backward_numpy(np.ones(2, F32), np.ones((2, 3), F32), axis=1, y=np.ones(2, F32))


# Layouts after dropping size-1 axes and merging neighbours, and the kernels that can run them.
LAYOUTS = [
    ((2, 3, 4), (2,), "rows", dict(outer=6, length=4, inner=1)),
    ((2, 3, 4), (1, 2), "rows", dict(outer=2, length=12, inner=1)),
    ((2, 3, 4), (0, 1, 2), "rows", dict(outer=1, length=24, inner=1)),
    ((2, 3, 4), (0,), "columns", dict(outer=1, length=2, inner=12)),
    ((2, 3, 4), (1,), "columns", dict(outer=2, length=3, inner=4)),
    ((2, 3, 4), (0, 2), "generic", dict(outputs=3, count=8)),
    ((2, 1, 4), (1,), "rows", dict(outer=8, length=1, inner=1)),
    ((1, 3, 1, 4), (0, 2), "rows", dict(outer=12, length=1, inner=1)),
    ((5, 1, 3), (0, 1), "columns", dict(outer=1, length=5, inner=3)),
    ((), (), "rows", dict(outer=1, length=1, inner=1)),
    ((2, 3, 4, 5), (0, 2), "generic", dict(outputs=15, count=8)),
    ((2, 3, 4, 5), (1, 3), "generic", dict(outputs=8, count=15)),
]


def test_native_layouts():
    if not ge2._native.is_built("_ops_reduce"):
        pytest.skip("_ops_reduce is not built")
    native = reduce._native_module()
    for shape, axes, kind, fields in LAYOUTS:
        layout = native.layout(list(shape), list(axes))
        assert layout["kind"] == kind, (shape, axes)
        assert {k: layout[k] for k in fields} == fields, (shape, axes)
        for kernel in KERNELS:
            reason = native.unsupported_reason(kernel, list(shape), list(axes))
            expected = kernel == "generic" or (kind == "rows" and kernel in ("row_warp", "row_block")) or (
                kind == "columns" and kernel in ("column", "column_wave"))
            assert (reason == "") == expected, (shape, axes, kernel, reason)
    assert "at most 4096" in native.unsupported_reason("row_warp", [3, 4097], [1])
    with pytest.raises(ValueError, match=r"axes: axis 1 is repeated"):
        native.layout([2, 3], [1, 1])
    with pytest.raises(ValueError, match=r"axis: cannot reduce over axis 1 of size 0"):
        native.layout([2, 0], [1])
    for op in OPS:
        assert [k["name"] for k in getattr(ge2.ops, op).kernels()] == list(KERNELS)


# ---------------------------------------------------------------------------------------------------------------
# CPU: op definitions and graphs
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
def test_opdef_infers_and_runs_reference(op):
    opdef = ge2.ops.OPS[op]
    attrs = opdef.validate_attrs({"axis": [2, 0], "keepdims": True}, "node r0")
    assert attrs["axis"] == (2, 0)  # a list (as JSON returns it) becomes a tuple
    x_type = TensorType((4, 5, 6), "float16")
    assert opdef.infer([x_type], attrs) == [TensorType((1, 5, 1), "float16")]
    assert opdef.infer([x_type], opdef.validate_attrs({}, "n")) == [TensorType((), "float16")]
    assert opdef.infer([TensorType(("batch", 5), "bfloat16")], opdef.validate_attrs({"axis": 1}, "n")) == [
        TensorType(("batch",), "bfloat16")]
    x = (np.arange(120, dtype=np.float16) / 16).reshape(4, 5, 6)
    (y,) = opdef.run_reference([x], attrs)
    assert y.dtype == np.float16 and y.shape == (1, 5, 1)
    np.testing.assert_allclose(y.astype(np.float64), reduce.reference(op, x, (0, 2), True), rtol=1e-3)
    (dx,) = opdef.reference_backward([x], [y], [np.ones((1, 5, 1))], attrs)
    np.testing.assert_allclose(dx, reduce.reference_backward(op, np.ones((1, 5, 1)), x, (0, 2), True))


def test_opdef_rejects_bad_attributes_at_graph_build():
    g = Graph("g")
    x = g.input("x", (4, 0, 6), "float32")
    with pytest.raises(ValueError, match=r"node 'max_0' \(max\): axis: cannot max over axis 1 of size 0"):
        g.max(x, axis=1)
    with pytest.raises(ValueError, match=r"node 'sum_0' \(sum\): axis: expected axes in \[-3, 3\)"):
        g.sum(x, axis=(0, 3))
    with pytest.raises(TypeError, match=r"attribute 'axis' expected int or tuple, got float"):
        g.mean(x, axis=1.5)
    with pytest.raises(TypeError, match=r"attribute 'keepdims' expected bool"):
        g.sum(x, axis=0, keepdims="yes")
    assert g.sum(x, axis=(0, 2)).type == TensorType((0,), "float32")  # empty kept axes are fine


def test_graph_json_round_trip_keeps_tuple_axes():
    g = Graph("g")
    x = g.input("x", (4, 5, 6), "float32")
    g.output(g.mean(g.sum(x, axis=(0, 2), keepdims=True), axis=None), "m")
    text = g.to_json()
    assert json.loads(text)["nodes"][0]["attrs"]["axis"] == [0, 2]
    loaded = Graph.from_json(text)
    assert loaded.nodes[0].attrs == {"axis": (0, 2), "keepdims": True}
    assert loaded.to_json() == text


@pytest.mark.parametrize("dtype", DTYPES)
def test_graph_runs_on_cpu_executor(rng, dtype):
    g = Graph("stats")
    x = g.input("x", ("batch", 6, 7), dtype)
    g.output(g.sum(x, axis=-1), "sum")
    g.output(g.mean(x, axis=(0, 2), keepdims=True), "mean")
    g.output(g.max(x), "max")
    x_value = (rng.standard_normal((3, 6, 7)) + 0.5).astype(ge2.dtypes.to_numpy(dtype))
    result = ge2.ExecutorV2(g, device="cpu").run({"x": x_value})
    assert_close(result["sum"], reduce.reference("sum", x_value, -1), dtype, 7, what="sum")
    assert_close(result["mean"], reduce.reference("mean", x_value, (0, 2), True), dtype, what="mean")
    assert_close(result["max"], reduce.reference("max", x_value), dtype, what="max")
    assert result["max"].shape == () and result["mean"].shape == (1, 6, 1)


def test_candidates_cover_every_problem():
    for op in OPS:
        candidates = ge2.ops.OPS[op].candidates
        assert [c.name for c in candidates] == list(KERNELS)
        assert [c.name for c in selection.candidates(ge2.ops.OPS[op]) if c.always_works] == ["generic"]
    if not ge2._native.is_built("_ops_reduce"):
        return
    x = TensorType((8, 16, 4), "float16")

    def problem(axis):
        return Problem("sum", (x,), (x,), {"axis": axis, "keepdims": False})

    supports = {c.name: c.supports for c in ge2.ops.OPS["sum"].candidates}
    assert supports["row_warp"](problem(2)) is None
    assert supports["column"](problem(1)) is None
    assert "trailing" in supports["row_block"](problem(0))
    assert "one run" in supports["column"](problem((0, 2)))
    assert supports["generic"](problem((0, 2))) is None


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _values(rng, shape, dtype, op, count):
    """N(0, 1) plus an offset, so that a sum or mean is not ~0 (a wrong result cannot hide in the tolerance), small
    enough for sums that float16 totals do not overflow; rounded to dtype."""
    offset = 0.5 if op != "sum" else (0.1 if count <= 200_000 else 0.0)
    return np.asarray(rng.standard_normal(shape) + offset).astype(ge2.dtypes.to_numpy(dtype))


def _forward(op, x, axis, keepdims, kernel, poisoned):
    problem = reduce.check_problem(op, x.shape, ge2.dtypes.normalize(x.dtype), axis, keepdims)
    out = poisoned(problem.out_shape, problem.dtype)
    device_x = ge2.device.runtime().DeviceArray.from_numpy(np.asarray(x, order="C"))
    getattr(ge2.ops, op).forward(device_x, axis=axis, keepdims=keepdims, kernel=kernel, out=out)
    return out.numpy()


def _check_forward(op, x, axis, keepdims, kernel, poisoned, what):
    dtype = ge2.dtypes.normalize(x.dtype)
    problem = reduce.check_problem(op, x.shape, dtype, axis, keepdims)
    count = int(np.prod([x.shape[a] for a in problem.axes], dtype=np.int64))
    y = _forward(op, x, axis, keepdims, kernel, poisoned)
    # A sum's error grows with the count; a mean's and a max's do not.
    assert_close(y, reduce.reference(op, x, axis, keepdims), dtype, count if op == "sum" else 1, what=what)


# (shape, axis) pairs covering every layout kind: rows short and long (sub-warp groups, the row_warp limit, split
# rows, the all-reduce), columns wide and narrow (tiles narrowed, split columns), generic patterns, size-1 axes,
# odd and non-multiple-of-8 extents.
CASES = [
    ((1,), None), ((7,), 0), ((37, 1), 1), ((37, 5), 1), ((64, 8), -1), ((33, 100), 1), ((9, 1000), 1),
    ((5, 4096), 1), ((5, 4097), 1), ((3, 10000), 1), ((2, 65537), 1), ((1, 1_000_003), None), ((4096,), None),
    ((2, 3, 4), (1, 2)), ((64, 8), 0), ((37, 5), 0), ((1000, 3), 0), ((100_003, 2), 0), ((2048, 16), 0),
    ((8, 3, 4096), 1), ((5, 7, 9), 1), ((7, 130, 24), (0, 1)), ((2, 3, 4), (0, 2)), ((6, 5, 4, 3), (1, 3)),
    ((6, 5, 4, 3), (0, 2)), ((3, 1, 4, 1), (1, 3)), ((4, 1, 5), 1), ((2, 3), ()), ((), None), ((5, 1), 0),
    # squeeze-and-excitation means of NHWC activations (EfficientNet's): column_wave splits the H*W run
    ((4, 14, 14, 480), (1, 2)), ((2, 56, 56, 40), (1, 2)),
]


def _applies(kernel, shape, axis):
    kind = reduce._native_module().layout(list(shape), list(reduce.normalize_axes(axis, len(shape))))
    if kernel == "generic":
        return True
    if kernel in ("column", "column_wave"):
        return kind["kind"] == "columns"
    return kind["kind"] == "rows" and (kernel == "row_block" or kind["length"] <= 4096)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kernel", ("auto",) + KERNELS)
def test_forward_every_layout(rng, poisoned, op, dtype, kernel):
    for shape, axis in CASES:
        count = int(np.prod([shape[a] for a in reduce.normalize_axes(axis, len(shape))], dtype=np.int64))
        x = _values(rng, shape, dtype, op, count)
        if kernel != "auto" and not _applies(kernel, shape, axis):
            with pytest.raises(ValueError, match=f"kernel: '{kernel}' cannot run this problem"):
                _forward(op, x, axis, False, kernel, poisoned)
            continue
        for keepdims in (False, True):
            _check_forward(op, x, axis, keepdims, kernel, poisoned, f"{op} {kernel} {shape} axis={axis}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_backward_every_layout(rng, poisoned, op, dtype):
    runtime = ge2.device.runtime()
    for shape, axis in CASES:
        if int(np.prod(shape)) > 300_000:
            continue  # the all-reduce of a million elements is covered by the forward; keep the references quick
        # Small integers: max has many ties to split; sums stay exact.
        x = np.asarray(rng.integers(-3, 4, shape)).astype(ge2.dtypes.to_numpy(dtype))
        for keepdims in (False, True):
            y = _forward(op, x, axis, keepdims, "auto", poisoned)
            dy = np.asarray(rng.standard_normal(y.shape)).astype(x.dtype)
            out = poisoned(shape, dtype)
            (dx,) = getattr(ge2.ops, op).backward(
                runtime.DeviceArray.from_numpy(np.asarray(dy, order="C")),
                runtime.DeviceArray.from_numpy(np.asarray(x, order="C")), axis=axis, keepdims=keepdims, out=out,
                y=runtime.DeviceArray.from_numpy(np.asarray(y, order="C")) if op == "max" else None)
            assert dx is out
            assert_close(out.numpy(), reduce.reference_backward(op, dy, x, axis, keepdims), dtype,
                         what=f"d{op} {shape} axis={axis} keepdims={keepdims}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape, axis", [((3, 5), 1), ((4, 3, 2), (0, 2)), ((6, 4), 0), ((2, 3, 4), None)])
def test_backward_against_finite_differences(rng, op, shape, axis):
    x = (rng.permutation(int(np.prod(shape))).reshape(shape) * 0.25 - 1.0).astype(F32)  # distinct values: no ties
    y = getattr(ge2.ops, op).forward_numpy(x, axis=axis)
    dy = rng.standard_normal(y.shape).astype(F32)
    (dx,) = getattr(ge2.ops, op).backward_numpy(dy, x, axis=axis, y=y if op == "max" else None)
    x64 = x.astype(np.float64)
    numeric = numeric_gradient(lambda: float((reduce.reference(op, x64, axis) * dy).sum()), x64, h=1e-3)
    assert_close(dx, numeric, "float32", what=f"d{op} vs central differences")
    assert_close(dx, reduce.reference_backward(op, dy, x, axis), "float32", what=f"d{op} vs reference_backward")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
def test_max_propagates_nan_and_keeps_minus_infinity(poisoned, kernel):
    if kernel in ("column", "column_wave"):
        x = np.ones((3000, 4), F32)
        x[:, 1] = -np.inf
        x[2999, 2] = np.nan
        x[0, 3] = np.nan
        axis, expected = 0, np.array([1.0, -np.inf, np.nan, np.nan])
    else:
        x = np.ones((4, 3000), F32)
        x[1] = -np.inf
        x[2, 2999] = np.nan
        x[3, 0] = np.nan
        axis, expected = 1, np.array([1.0, -np.inf, np.nan, np.nan])
    y = _forward("max", x, axis, False, kernel, poisoned)
    np.testing.assert_array_equal(y, expected)
    (dx,) = ge2.ops.max.backward_numpy(np.full(4, 8.0, F32), x, axis=axis, y=y)
    assert_close(dx, reduce.reference_backward("max", np.full(4, 8.0), x, axis), "float32", what="dx")


@pytest.mark.gpu
def test_empty_kept_axes_launch_nothing():
    runtime = ge2.device.runtime()
    x = runtime.DeviceArray.empty([0, 5], "float16")
    y = ge2.ops.sum.forward(x, axis=1)
    assert y.shape == (0,)
    assert ge2.ops.max.backward(y, x, axis=1, y=y)[0].shape == (0, 5)
    with pytest.raises(ValueError, match=r"axis: cannot mean over axis 0 of size 0"):
        ge2.ops.mean.forward(x, axis=0)


def test_selector_picks_the_kernel_for_the_layout():
    """The order the C++ chain had: row_warp, row_block (trailing reduced axes), column, else generic."""
    picks = {((64, 100), (1,)): "row_warp", ((64, 5000), (1,)): "row_block", ((64, 100), (0,)): "column",
             ((4, 5, 6), (0, 2)): "generic", ((2_000_003,), (0,)): "row_block"}
    for (shape, axes), expected in picks.items():
        attrs = {"axis": axes, "keepdims": False}
        x = TensorType(shape, "float32")
        problem = Problem("sum", (x,), tuple(reduce.SUM.infer([x], attrs)), attrs)
        assert selection.rank(reduce.SUM, problem).viable[0].name == expected, (shape, axes)
    with pytest.raises(ValueError, match="kernel: expected one of row_warp"):  # the selector chooses, not C++
        reduce._native_module().unsupported_reason("auto", [4, 5], [1])


@pytest.mark.gpu
def test_split_reductions_are_deterministic(rng):
    native = reduce._native_module()
    runtime = ge2.device.runtime()
    x = runtime.DeviceArray.from_numpy(rng.standard_normal(2_000_003).astype(F32))
    y = runtime.DeviceArray.empty([], "float32")
    assert native.forward("sum", x.ptr, y.ptr, [2_000_003], [0], "float32", "row_block", 0) == "row_block"
    first = y.numpy()
    for _ in range(3):
        native.forward("sum", x.ptr, y.ptr, [2_000_003], [0], "float32", "row_block", 0)
        assert y.numpy().tobytes() == first.tobytes()
    np.testing.assert_allclose(first, x.numpy().astype(np.float64).sum(), rtol=1e-5, atol=1e-3)
    # column_wave: a squeeze-and-excitation mean split over H*W into float32 partials
    se = runtime.DeviceArray.from_numpy(rng.standard_normal((8, 3136, 96)).astype(np.float16))
    means = runtime.DeviceArray.empty([8, 96], "float16")
    assert native.forward("mean", se.ptr, means.ptr, [8, 3136, 96], [1], "float16", "column_wave", 0) == "column_wave"
    first = means.numpy()
    for _ in range(3):
        native.forward("mean", se.ptr, means.ptr, [8, 3136, 96], [1], "float16", "column_wave", 0)
        assert means.numpy().tobytes() == first.tobytes()
    assert_close(first, reduce.reference("mean", se.numpy(), 1), "float16", what="column_wave mean")
    outputs = runtime.DeviceArray.empty([100], "float32")
    with pytest.raises(ValueError, match="x: null device pointer"):
        native.forward("sum", 0, outputs.ptr, [4, 5], [1], "float32", "row_warp", 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float16", "bfloat16", "float32"))
def test_misaligned_views_and_torch_interop(dtype):
    torch = pytest.importorskip("torch")
    tdtype = getattr(torch, dtype)
    for shape, axis in (((6, 1000), 1), ((300, 64), 0), ((3, 40, 16), (0, 2)), ((50_000,), None)):
        count = int(np.prod(shape))
        storage = torch.randn(count + 1, device="cuda", dtype=tdtype)
        x = storage[1:].view(shape)  # one element off 16-byte alignment: scalar loads
        for op, function in (("sum", torch.sum), ("mean", torch.mean), ("max", torch.amax)):
            dims = tuple(range(len(shape))) if axis is None else axis
            y = getattr(ge2.ops, op).forward(x, axis=axis)
            assert isinstance(y, torch.Tensor) and y.dtype == tdtype
            expected = function(x.double(), dim=dims)
            assert_close(y.double().cpu().numpy(), expected.cpu().numpy(), dtype,
                         count // int(np.prod(expected.shape)) if op == "sum" else 1, what=f"{op} {shape} {axis}")
    x = torch.randn(5, 6, 7, device="cuda", dtype=tdtype).round().requires_grad_()  # rounded: ties for amax
    for op, function in (("sum", torch.sum), ("mean", torch.mean), ("max", torch.amax)):
        reference = function(x.float(), dim=(0, 2), keepdim=True)
        dy = torch.randn_like(reference)
        (grad,) = torch.autograd.grad(reference, x, dy)
        y = getattr(ge2.ops, op).forward(x.detach(), axis=(0, 2), keepdims=True, stream=torch.cuda.current_stream())
        (dx,) = getattr(ge2.ops, op).backward(dy.to(tdtype), x.detach(), axis=(0, 2), keepdims=True, y=y)
        assert isinstance(dx, torch.Tensor) and dx.shape == x.shape
        assert_close(dx.float().cpu().numpy(), grad.float().cpu().numpy(), dtype, what=f"d{op} vs torch autograd")
    with pytest.raises(ValueError, match=r"x: expected a contiguous"):
        ge2.ops.sum.forward(torch.randn(8, 8, device="cuda").t(), axis=0)


@pytest.mark.gpu
def test_large_reductions_match_torch():
    torch = pytest.importorskip("torch")
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(ge2.ops.sum.forward(x, axis=-1).float(), x.float().sum(-1), rtol=2e-3, atol=5e-2)
    torch.testing.assert_close(ge2.ops.mean.forward(x, axis=0).float(), x.float().mean(0), rtol=2e-3, atol=1e-3)
    torch.testing.assert_close(ge2.ops.max.forward(x, axis=0), x.amax(0), rtol=0, atol=0)


@pytest.mark.gpu
def test_graph_runs_on_cuda_executor(rng):
    g = Graph("stats")
    x = g.input("x", (16, 24, 40), "float16")
    g.output(g.sum(x, axis=-1), "sum")
    g.output(g.mean(x, axis=0, keepdims=True), "mean")
    g.output(g.max(x, axis=(0, 2)), "max")
    feeds = {"x": (rng.standard_normal((16, 24, 40)) + 0.5).astype(np.float16)}
    executor = ge2.ExecutorV2(g, device="cuda", autotune=False)  # the priority order is what this test pins
    result = executor.run(feeds)
    assert_close(result["sum"], reduce.reference("sum", feeds["x"], -1), "float16", 40, what="sum")
    assert_close(result["mean"], reduce.reference("mean", feeds["x"], 0, True), "float16", what="mean")
    assert_close(result["max"], reduce.reference("max", feeds["x"], (0, 2)), "float16", what="max")
    kernels = {s.op: s.kernel for plan in executor.plans for s in plan.selections}
    assert kernels == {"sum": "row_warp", "mean": "column", "max": "generic"}


@pytest.mark.gpu
def test_split_reduction_replays_in_a_cuda_graph(rng):
    """The partials workspace exists after a warm-up, so a split all-reduce and a split column reduction capture
    and replay (with new inputs) like any kernel."""
    runtime = ge2.device.runtime()
    stream = runtime.Stream()
    x = runtime.DeviceArray.from_numpy(rng.standard_normal((60_000, 3)).astype(F32))
    total, columns = runtime.DeviceArray.empty([], "float32"), runtime.DeviceArray.empty([3], "float32")
    waves = runtime.DeviceArray.empty([3], "float32")

    def run():
        ge2.ops.sum.forward(x, out=total, stream=stream)
        ge2.ops.mean.forward(x, axis=0, out=columns, stream=stream)
        ge2.ops.mean.forward(x, axis=0, out=waves, stream=stream, kernel="column_wave")

    run()  # warm up
    stream.synchronize()
    graph = runtime.CudaGraph()
    graph.begin_capture(stream.handle)
    run()
    graph.end_capture()
    new_x = rng.standard_normal((60_000, 3)).astype(F32) + 1.0
    x.copy_from_numpy(new_x)
    total.poison(stream.handle)
    columns.poison(stream.handle)
    waves.poison(stream.handle)
    graph.replay(stream.handle)
    stream.synchronize()
    assert_close(total.numpy(), reduce.reference("sum", new_x), "float32", new_x.size, what="captured sum")
    assert_close(columns.numpy(), reduce.reference("mean", new_x, 0), "float32", what="captured mean")
    assert_close(waves.numpy(), reduce.reference("mean", new_x, 0), "float32", what="captured column_wave mean")
