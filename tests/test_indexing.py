"""The shape and index ops of ops/indexing.py (one native module, _ops_indexing): references against ONNX's own
reference implementation and NumPy, inference and validation errors, gradients through graphs on the CPU backend;
on the GPU every kernel against the float64 reference, outputs poisoned first, over dtypes and edge shapes."""
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, indexing
from graph_executor_v2.testing import assert_close, random_array

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402


def _onnx_run(op_type, inputs, attrs=None, opset=20, outputs=1):
    """ONNX's reference implementation of one node on host arrays (the independent oracle)."""
    names = [f"in{i}" if value is not None else "" for i, value in enumerate(inputs)]
    node = helper.make_node(op_type, names, [f"out{i}" for i in range(outputs)], **(attrs or {}))
    evaluator = ReferenceEvaluator(node, opsets={"": opset})
    return evaluator.run(None, {n: v for n, v in zip(names, inputs) if n})


def _ints(values):
    return np.array(values, np.int64)


# --- references against ONNX's reference implementation ------------------------------------------------------
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("shape, pads", [((3, 4), (1, 2, 2, 1)), ((2, 3, 5), (0, 2, 4, 1, 2, 3)), ((4,), (3, 0))])
def test_pad_reference_matches_onnx(rng, mode, shape, pads):
    x = random_array(rng, shape, "float32")
    value = np.array(1.25, np.float32)
    expected = _onnx_run("Pad", [x, _ints(pads), value if mode == "constant" else None], {"mode": mode})[0]
    np.testing.assert_array_equal(indexing.reference_pad(x, pads, mode, 1.25), expected)


def test_pad_crops_with_negative_pads_and_rejects_them_elsewhere(rng):
    x = random_array(rng, (4, 5), "float32")
    got = indexing.reference_pad(x, (-1, 2, 1, -2), "constant", 0.0)
    np.testing.assert_array_equal(got, np.pad(x[1:, :3], ((0, 1), (2, 0))))
    with pytest.raises(ValueError, match="pads: negative pads crop only in constant mode"):
        OPS["pad"].infer([TensorType((4, 5), "float32")], OPS["pad"].validate_attrs({"pads": (-1, 0, 0, 0),
                                                                                      "mode": "edge"}, "pad"))
    with pytest.raises(ValueError, match=r"pads: expected 4 entries"):
        OPS["pad"].infer([TensorType((4, 5), "float32")], OPS["pad"].validate_attrs({"pads": (1, 1)}, "pad"))


def test_pad_backward_adds_every_copy_back(rng):
    """The reference gradient is the adjoint: <pad(x), dy> == <x, pad_backward(dy)> for every mode."""
    x = rng.standard_normal((3, 4))
    for mode in ("constant", "reflect", "edge", "wrap"):
        y = indexing.reference_pad(x, (2, 1, 1, 3), mode)
        dy = rng.standard_normal(y.shape)
        dx = indexing.reference_pad_backward(dy, x.shape, (2, 1, 1, 3), mode)
        if mode == "constant":
            assert np.isclose((y * dy).sum(), (x * dx).sum())  # the constant 0 adds nothing
        else:
            assert np.isclose((y * dy).sum(), (x * dx).sum()), mode


@pytest.mark.parametrize("axis, index_shape", [(0, (2, 3)), (1, (4,)), (-1, ()), (2, (2, 2))])
def test_gather_reference_matches_onnx(rng, axis, index_shape):
    x = random_array(rng, (5, 4, 3), "float32")
    extent = x.shape[axis]
    indices = rng.integers(-extent, extent, index_shape).astype(np.int64)
    expected = _onnx_run("Gather", [x, indices], {"axis": axis})[0]
    np.testing.assert_array_equal(indexing.reference_gather(x, indices, axis), expected)


def test_gather_out_of_range_reads_nan_or_zero():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = indexing.reference_gather(x, np.array([0, 3, -4]), 1)
    assert np.isnan(got[:, 1:]).all() and (got[:, 0] == [0, 3]).all()
    ints = indexing.reference_gather(x.astype(np.int64), np.array([5]), 0)
    assert (ints == 0).all()


def test_gather_elements_reference_matches_onnx(rng):
    x = random_array(rng, (4, 5), "float32")
    indices = rng.integers(-4, 4, (3, 5)).astype(np.int64)
    expected = _onnx_run("GatherElements", [x, indices], {"axis": 0})[0]
    np.testing.assert_array_equal(indexing.reference_gather_elements(x, indices, 0), expected)
    small = rng.integers(0, 5, (2, 3)).astype(np.int32)  # smaller than x on the other axis (torch.gather allows it)
    expected = np.array([[x[i, small[i, j]] for j in range(3)] for i in range(2)])
    np.testing.assert_array_equal(indexing.reference_gather_elements(x, small, 1), expected)


# (x shape, indices shape, batch_dims): tuples addressing one axis, two, all of them; batch dims shared; 1-d indices
GATHER_ND_CASES = [((4, 5, 3), (6, 2), 0), ((2, 4, 3), (2, 5, 1), 1), ((2, 3, 4, 5), (2, 3, 7, 2), 2),
                   ((3, 4), (2, 2, 2), 0), ((3, 4), (2,), 0), ((2, 3, 4), (2, 1), 1)]


def _gather_nd_indices(rng, x_shape, index_shape, batch_dims, dtype="int64"):
    """Index tuples in [-extent, extent) of each addressed axis (negative ones count from the end)."""
    extents = x_shape[batch_dims:batch_dims + index_shape[-1]]
    return np.stack([rng.integers(-e, e, index_shape[:-1]) for e in extents], axis=-1).astype(dtype)


@pytest.mark.parametrize("x_shape, index_shape, batch_dims", GATHER_ND_CASES)
def test_gather_nd_reference_matches_onnx(rng, x_shape, index_shape, batch_dims):
    x = random_array(rng, x_shape, "float32")
    indices = _gather_nd_indices(rng, x_shape, index_shape, batch_dims)
    expected = _onnx_run("GatherND", [x, indices], {"batch_dims": batch_dims})[0]
    got = indexing.reference_gather_nd(x, indices, batch_dims)
    np.testing.assert_array_equal(got, expected)
    assert OPS["gather_nd"].infer([TensorType(x_shape, "float32"), TensorType(index_shape, "int64")],
                                  {"batch_dims": batch_dims}) == [TensorType(expected.shape, "float32")]


def test_gather_nd_out_of_range_reads_nan_or_zero():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = indexing.reference_gather_nd(x, np.array([[0, 4], [-1, -1], [3, 0]]))
    assert np.isnan(got[[0, 2]]).all() and got[1] == 11
    assert (indexing.reference_gather_nd(x.astype(np.int32), np.array([[5, 0]])) == 0).all()


def test_gather_nd_names_bad_arguments():
    t = TensorType
    gather_nd = OPS["gather_nd"]
    assert gather_nd.infer([t(("b", 6, 5), "float16"), t(("b", 3, 1), "int32")], {"batch_dims": 1}) == [
        t(("b", 3, 5), "float16")]
    with pytest.raises(ValueError, match=r"indices: tuples of 3 components for x of rank 3 with batch_dims=1"):
        gather_nd.infer([t((2, 6, 5), "float32"), t((2, 3), "int64")], {"batch_dims": 1})
    with pytest.raises(ValueError, match="indices: batch axis 0 has extent 3, x's has 2"):
        gather_nd.infer([t((2, 6, 5), "float32"), t((3, 1), "int64")], {"batch_dims": 1})
    with pytest.raises(ValueError, match="batch_dims: expected < 2"):
        gather_nd.infer([t((2, 6, 5), "float32"), t((2, 1), "int64")], {"batch_dims": 2})
    with pytest.raises(TypeError, match="indices: expected int32 or int64, got float32"):
        gather_nd.infer([t((2, 6), "float32"), t((2, 1), "float32")], {"batch_dims": 0})
    with pytest.raises(ValueError, match="the last extent"):
        gather_nd.infer([t((2, 6), "float32"), t((2, "r"), "int64")], {"batch_dims": 0})


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_reference_matches_onnx(rng, exclusive, reverse):
    x = rng.standard_normal((3, 5, 2))
    expected = _onnx_run("CumSum", [x, np.array(1)], {"exclusive": int(exclusive), "reverse": int(reverse)})[0]
    np.testing.assert_allclose(indexing.reference_cumsum(x, 1, exclusive, reverse), expected, rtol=1e-12)


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("k", [-2, 0, 1, 7])
def test_trilu_reference_matches_onnx(rng, upper, k):
    x = random_array(rng, (2, 4, 6), "float32")
    expected = _onnx_run("Trilu", [x, np.array(k, np.int64)], {"upper": int(upper)})[0]
    np.testing.assert_array_equal(indexing.reference_trilu(x, k, upper), expected)


@pytest.mark.parametrize("mode, coordinates, nearest_mode", [
    ("nearest", "asymmetric", "floor"),  # PyTorch's nearest
    ("nearest", "half_pixel", "round_prefer_floor"),
    ("nearest", "align_corners", "round_prefer_ceil"),
    ("nearest", "pytorch_half_pixel", "ceil"),
    ("linear", "half_pixel", "round_prefer_floor"),
    ("linear", "pytorch_half_pixel", "round_prefer_floor"),
    ("linear", "align_corners", "round_prefer_floor"),
    ("linear", "asymmetric", "round_prefer_floor"),
])
@pytest.mark.parametrize("size", [(7, 10), (2, 3), (1, 5)])
def test_resize_reference_matches_onnx(rng, mode, coordinates, nearest_mode, size):
    x = rng.standard_normal((2, 3, 4, 5))
    attrs = {"mode": mode, "coordinate_transformation_mode": coordinates, "nearest_mode": nearest_mode}
    expected = _onnx_run("Resize", [x, None, None, _ints((2, 3) + size)], attrs)[0]
    np.testing.assert_allclose(indexing.reference_resize(x, size, mode, coordinates, nearest_mode), expected,
                               rtol=1e-12, atol=1e-12)


def test_resize_with_given_scales_matches_onnx(rng):
    x = rng.standard_normal((1, 2, 3, 4))
    scales = np.array([1, 1, 2.5, 1.5], np.float32)
    expected = _onnx_run("Resize", [x, None, scales], {"mode": "linear"})[0]
    size = expected.shape[-2:]
    np.testing.assert_allclose(indexing.reference_resize(x, size, "linear", scales=(2.5, 1.5)), expected, rtol=1e-12)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_channels_last_resizes_the_two_axes_before_the_channels(rng, mode):
    """layout="NHWC": [N, H, W, C] resized on H and W is the NCHW resize of the channels moved first (ONNX's)."""
    x = rng.standard_normal((2, 4, 5, 3))
    expected = _onnx_run("Resize", [x.transpose(0, 3, 1, 2), None, None, _ints((2, 3, 7, 3))], {"mode": mode})[0]
    actual = indexing.reference_resize(x, (7, 3), mode, layout="NHWC")
    np.testing.assert_allclose(actual, expected.transpose(0, 2, 3, 1), rtol=1e-12, atol=1e-12)
    g = ge2.ir.Graph("g")
    assert g.resize(g.input("x", (2, 4, 5, 3), "float32"), size=(7, 3), layout="NHWC").type.shape == (2, 7, 3, 3)
    with pytest.raises(ValueError, match=r"rank >= 3"):
        g.resize(g.input("v", (4, 5), "float32"), size=(7, 3), layout="NHWC")


def test_adaptive_avg_pool_matches_average_pooling_when_windows_divide_and_overlaps_otherwise(rng):
    x = rng.standard_normal((2, 3, 6, 8))
    np.testing.assert_allclose(indexing.reference_adaptive_avg_pool2d(x, (3, 2)),
                               x.reshape(2, 3, 3, 2, 2, 4).mean(axis=(3, 5)))
    y = indexing.reference_adaptive_avg_pool2d(x[..., :5, :7], (3, 3))  # PyTorch's windows: rows [0,2) [1,4) [3,5)
    np.testing.assert_allclose(y[..., 1, 0], x[..., 1:4, 0:3].mean(axis=(-2, -1)))


def test_expand_roll_tile_repeat_arange_references():
    x = np.arange(6.0, dtype=np.float32).reshape(2, 1, 3)
    np.testing.assert_array_equal(OPS["expand"].run_reference([x], {"shape": (4, 2, 5, 3)})[0],
                                  np.broadcast_to(x, (4, 2, 5, 3)))
    np.testing.assert_array_equal(indexing.expand_shape((2, 1, 3), (-1, 4, 1)), (2, 4, 3))
    np.testing.assert_array_equal(indexing.reference_roll(x, (1, -1), (0, 2)), np.roll(x, (1, -1), (0, 2)))
    np.testing.assert_array_equal(_onnx_run("Tile", [x, _ints((2, 3, 1))])[0],
                                  OPS["tile"].run_reference([x], {"repeats": (2, 3, 1)})[0])
    np.testing.assert_array_equal(OPS["repeat_interleave"].run_reference([x], {"repeats": 2, "axis": -1})[0],
                                  np.repeat(x, 2, axis=-1))
    got = OPS["arange"].run_reference([x], OPS["arange"].validate_attrs({"axis": 2, "start": 2, "delta": 3}, "a"))[0]
    np.testing.assert_array_equal(got, _onnx_run("Range", [np.array(2), np.array(11), np.array(3)])[0])
    assert got.dtype == np.int64


def test_inference_keeps_symbolic_dims_and_names_bad_arguments():
    t = TensorType
    assert OPS["expand"].infer([t(("b", 1, 4), "float16")], {"shape": ("b", 6, 4)}) == [t(("b", 6, 4), "float16")]
    assert OPS["arange"].infer([t(("b", "s"), "int64")], OPS["arange"].validate_attrs({"axis": 1}, "a")) == [
        t(("s",), "int64")]
    assert OPS["repeat_interleave"].infer([t((2, "h", 5, 8), "float32")], {"repeats": 3, "axis": 1}) == [
        t((2, "3*h", 5, 8), "float32")]
    assert OPS["gather"].infer([t((7, 5), "float32"), t((2, 3), "int32")], {"axis": 0}) == [t((2, 3, 5), "float32")]
    with pytest.raises(ValueError, match=r"shape: x's dim 3 \(axis 1\) does not broadcast to 4"):
        OPS["expand"].infer([t((2, 3), "float32")], {"shape": (2, 4)})
    with pytest.raises(TypeError, match="indices: expected int32 or int64, got float32"):
        OPS["gather"].infer([t((7, 5), "float32"), t((2,), "float32")], {"axis": 0})
    with pytest.raises(ValueError, match="indices: expected rank 2"):
        OPS["gather_elements"].infer([t((7, 5), "float32"), t((2,), "int64")], {"axis": 0})
    with pytest.raises(ValueError, match="x: expected rank >= 2"):
        OPS["trilu"].infer([t((7,), "float32")], {"k": 0, "upper": True})
    with pytest.raises(ValueError, match="axis: axis 3 is out of range"):
        OPS["cumsum"].infer([t((7, 2), "float32")], {"axis": 3, "exclusive": False, "reverse": False})
    with pytest.raises(ValueError, match="attribute 'size' must be 2 ints >= 1"):
        OPS["resize"].validate_attrs({"size": (0, 3)}, "resize")
    # a padded symbolic axis: the sum of dims (ir/dims.py); one that may be cropped below zero is refused
    assert OPS["pad"].infer([t(("b", 3), "float32")], OPS["pad"].validate_attrs({"pads": (1, 0, 0, 0)}, "pad")) == \
        [t(("b+1", 3), "float32")]
    with pytest.raises(ValueError, match="pads: axis 0 of the symbolic extent 'b' may be cropped below zero by -2"):
        OPS["pad"].infer([t(("b", 3), "float32")], OPS["pad"].validate_attrs({"pads": (-2, 0, 0, 0)}, "pad"))


def test_graph_of_index_ops_runs_on_the_cpu_backend_with_two_sizes(rng):
    """expand + pad + cumsum + trilu + gather on a symbolic batch: one executor, two sizes, against NumPy."""
    g = ge2.ir.Graph("index_ops")
    x = g.input("x", ("batch", 4, 4), "float32")
    ids = g.input("ids", (3,), "int64")
    y = g.trilu(g.cumsum(x, axis=2), k=0, upper=False)
    y = g.gather(g.pad(y, pads=(0, 1, 0, 0, 1, 2), mode="edge"), ids, axis=1)
    g.output(g.expand(y, shape=(2, "batch", 3, 6)), "y")
    executor = ge2.ExecutorV2(g)
    for batch in (2, 3):
        value = random_array(rng, (batch, 4, 4), "float32")
        index = np.array([0, 4, -1])
        expected = np.tril(np.cumsum(value.astype(np.float64), axis=2))
        expected = np.pad(expected, ((0, 0), (1, 1), (0, 2)), mode="edge")[:, index]
        got = executor.run({"x": value, "ids": index})["y"]
        assert_close(got, np.broadcast_to(expected, (2, batch, 3, 6)), "float32", 4)


# --- GPU: every kernel against the float64 reference, outputs poisoned first ----------------------------------
def _gpu_case(op, inputs, attrs, dtype, poisoned, to_device):
    opdef = OPS[op]
    full = opdef.validate_attrs(attrs, op)
    expected = opdef.run_reference(inputs, full)[0]
    out = poisoned(expected.shape, expected.dtype.name)
    face = getattr(ge2.ops, op)
    result = face.forward(*[to_device(x) for x in inputs], **attrs, out=out)
    got = result.numpy()
    what = f"{op} {dtype} {[np.shape(x) for x in inputs]} {attrs}"
    print(what, "max |error|", float(np.nanmax(np.abs(got.astype(np.float64) - expected.astype(np.float64)),
                                               initial=0.0)))
    if np.issubdtype(expected.dtype, np.integer):
        np.testing.assert_array_equal(got, expected, err_msg=what)
    else:
        reduction = np.shape(inputs[0])[attrs["axis"]] if op == "cumsum" else 1  # a sum along the axis
        assert_close(got, expected, dtype, reduction, what=what)


MOVEMENT_CASES = [
    ("expand", [(3, 1, 5)], {"shape": (2, 3, 4, 5)}),
    ("expand", [(1,)], {"shape": (33, 7)}),
    ("pad", [(3, 4)], {"pads": (1, 2, 3, 0), "mode": "constant", "value": -2.0}),
    ("pad", [(3, 4)], {"pads": (-1, 1, 2, -2), "mode": "constant"}),
    ("pad", [(2, 3, 5)], {"pads": (0, 2, 4, 0, 2, 3), "mode": "reflect"}),
    ("pad", [(2, 1, 5)], {"pads": (0, 2, 1, 1, 3, 0), "mode": "edge"}),
    ("pad", [(2, 3, 5)], {"pads": (1, 0, 7, 0, 2, 3), "mode": "wrap"}),
    ("pad", [(2, 3)], {"pads": (0, 0, 0, 0), "mode": "constant"}),
    # the kernel merges neighbouring unpadded axes: a stem's channel pad ([N, H, W, 3] -> 8), and unpadded axes on
    # both sides of a padded one
    ("pad", [(2, 5, 6, 3)], {"pads": (0, 0, 0, 0, 0, 0, 0, 5), "mode": "constant"}),
    ("pad", [(2, 3, 4, 5, 2)], {"pads": (0, 0, 1, 0, 0, 0, 0, 2, 0, 0), "mode": "constant", "value": 1.0}),
    # the last axis alone (last_axis_pad_kernel, 4 elements a thread): cropped at its start and padded at its end;
    # 4 * 301 rows of 8, a count no multiple of a block's 1,024
    ("pad", [(7, 33, 5)], {"pads": (0, 0, -2, 0, 0, 4), "mode": "constant", "value": 3.0}),
    ("pad", [(4, 301, 3)], {"pads": (0, 0, 0, 0, 0, 5)}),
    ("roll", [(4, 7)], {"shifts": (1, -9), "axes": (0, 1)}),
    ("repeat_interleave", [(2, 3, 5)], {"repeats": 3, "axis": 1}),
    ("tile", [(2, 3)], {"repeats": (3, 2)}),
    ("trilu", [(3, 4, 6)], {"k": 1, "upper": True}),
    ("trilu", [(5, 3)], {"k": -1, "upper": False}),
    ("pad", [(0, 3)], {"pads": (1, 0, 0, 1), "mode": "constant", "value": 4.0}),  # an empty input, filled
    ("expand", [(2, 1)], {"shape": (2, 0)}),  # an empty output: nothing launched
    # the leading axis alone, fill bytes alike (0; uint8's 2): one copy of the kept rows and memsets around them
    ("pad", [(37, 5, 3)], {"pads": (4, 0, 0, 3, 0, 0)}),
    ("pad", [(37, 6)], {"pads": (-5, 0, 3, 0)}),
    ("pad", [(37, 6)], {"pads": (2, 0, -10, 0), "value": 2.0}),
    ("pad", [(9, 4)], {"pads": (-9, 0, 2, 0)}),  # every row cropped: the fill alone
    ("pad", [(50,)], {"pads": (3, 5)}),
    ("pad", [(5, 4)], {"pads": (2, 0, 1, 0), "value": -2.0}),  # fill bytes that differ: the element-wise kernel
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "int32", "uint8"])
@pytest.mark.parametrize("case", MOVEMENT_CASES, ids=lambda case: f"{case[0]}{case[1]}")
def test_movement_kernels_on_every_dtype(rng, poisoned, to_device, dtype, case):
    op, shapes, attrs = case
    inputs = [(random_array(rng, s, "float32") * 20).astype(ge2.dtypes.to_numpy(dtype)) for s in shapes]
    if "value" in attrs and dtype in ("uint8",):
        attrs = dict(attrs, value=abs(attrs["value"]))
    _gpu_case(op, inputs, attrs, dtype, poisoned, to_device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_gather_kernels(rng, poisoned, to_device, dtype, index_dtype):
    x = (random_array(rng, (5, 6, 7), "float32") * 10).astype(ge2.dtypes.to_numpy(dtype))
    for axis, index_shape in ((0, (3, 2)), (1, (9,)), (2, ()), (-1, (1, 4))):
        extent = x.shape[axis]
        indices = rng.integers(-extent, extent, index_shape).astype(index_dtype)
        _gpu_case("gather", [x, indices], {"axis": axis}, dtype, poisoned, to_device)
    indices = rng.integers(-5, 5, (4, 3, 7)).astype(index_dtype)
    _gpu_case("gather_elements", [x, indices], {"axis": 0}, dtype, poisoned, to_device)
    bad = np.array([0, 9, -1], index_dtype)  # out of range: NaN (floats) or 0, nothing read out of bounds
    _gpu_case("gather", [x, bad], {"axis": 1}, dtype, poisoned, to_device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_gather_nd_kernel(rng, poisoned, to_device, dtype, index_dtype):
    for x_shape, index_shape, batch_dims in GATHER_ND_CASES + [((3, 70, 50), (3, 400, 2), 1)]:
        x = (random_array(rng, x_shape, "float32") * 10).astype(ge2.dtypes.to_numpy(dtype))
        indices = _gather_nd_indices(rng, x_shape, index_shape, batch_dims, index_dtype)
        _gpu_case("gather_nd", [x, indices], {"batch_dims": batch_dims}, dtype, poisoned, to_device)
    x = (random_array(rng, (3, 4, 5), "float32") * 10).astype(ge2.dtypes.to_numpy(dtype))
    bad = np.array([[0, 4], [-1, -1], [3, 0], [-4, 2]], index_dtype)  # out of range: NaN (floats) or 0
    _gpu_case("gather_nd", [x, bad], {"batch_dims": 0}, dtype, poisoned, to_device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "int64"])
@pytest.mark.parametrize("shape, axis", [((3, 5, 2), 1), ((2, 1000), 1), ((300, 3), 0), ((7,), 0)])
def test_cumsum_kernel(rng, poisoned, to_device, dtype, shape, axis):
    x = (random_array(rng, shape, "float32") * 4).astype(ge2.dtypes.to_numpy(dtype))
    for exclusive in (False, True):
        for reverse in (False, True):
            _gpu_case("cumsum", [x], {"axis": axis, "exclusive": exclusive, "reverse": reverse}, dtype, poisoned,
                      to_device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64"])
def test_arange_kernel(rng, poisoned, to_device, dtype):
    x = random_array(rng, (3, 1000), "float32")
    _gpu_case("arange", [x], {"axis": 1, "start": 2.0, "delta": 3.0, "dtype": dtype}, dtype, poisoned, to_device)
    _gpu_case("arange", [x], {"axis": 0, "dtype": dtype}, dtype, poisoned, to_device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mode, coordinates, nearest_mode", [
    ("nearest", "asymmetric", "floor"), ("nearest", "half_pixel", "round_prefer_floor"),
    ("nearest", "align_corners", "round_prefer_ceil"), ("linear", "half_pixel", "round_prefer_floor"),
    ("linear", "pytorch_half_pixel", "round_prefer_floor"), ("linear", "align_corners", "round_prefer_floor"),
    ("linear", "asymmetric", "round_prefer_floor")])
def test_resize_kernel(rng, poisoned, to_device, dtype, mode, coordinates, nearest_mode):
    planar, channels_last = random_array(rng, (2, 3, 9, 14), dtype), random_array(rng, (2, 9, 14, 5), dtype)
    for size in ((18, 28), (4, 5), (1, 1), (9, 33)):
        for x, layout in ((planar, "NCHW"), (channels_last, "NHWC")):
            _gpu_case("resize", [x], {"size": size, "mode": mode, "coordinates": coordinates,
                                      "nearest_mode": nearest_mode, "layout": layout}, dtype, poisoned, to_device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_adaptive_avg_pool_kernel(rng, poisoned, to_device, dtype):
    x = random_array(rng, (2, 3, 14, 13), dtype)
    for output_size in ((7, 7), (1, 1), (5, 3), (14, 13), (20, 2)):
        _gpu_case("adaptive_avg_pool2d", [x], {"output_size": output_size}, dtype, poisoned, to_device)


@pytest.mark.gpu
def test_graph_of_index_ops_on_the_gpu_matches_the_cpu_backend(rng):
    g = ge2.ir.Graph("index_ops_gpu")
    x = g.input("x", (2, 4, 4), "float32")
    y = g.resize(g.trilu(g.cumsum(x, axis=2), upper=False), size=(8, 8), mode="linear")
    g.output(g.roll(g.pad(y, pads=(0, 1, 1, 0, 1, 1), mode="reflect"), shifts=(3,), axes=(2,)), "y")
    value = random_array(rng, (2, 4, 4), "float32")
    expected = ge2.ExecutorV2(g, device="cpu").run({"x": value})["y"]
    got = ge2.ExecutorV2(g, device="cuda").run({"x": value})["y"]
    assert_close(got, expected, "float32", 4, what="index graph on the GPU vs the CPU backend")
