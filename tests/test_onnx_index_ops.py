"""ONNX import of the shape and index ops (Pad, Expand, Gather, GatherElements, GatherND, Tile, CumSum, Trilu, Range,
Resize, Einsum): small graphs built with onnx.helper, run on GE2's CPU backend against onnxruntime."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.frontend import onnx as onnx_frontend  # noqa: E402
from graph_executor_v2.testing import assert_close  # noqa: E402

FLOAT = TensorProto.FLOAT


def _check(nodes, inputs, feeds, initializers=(), opset=18, reduction=1, feeds_too=()):
    """The model imported and run on GE2 (for each feed dict) against onnxruntime."""
    graph = helper.make_graph(nodes, "index_ops", inputs, [helper.make_tensor_value_info("y", FLOAT, None)],
                              list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    loaded = onnx_frontend.load(model)
    executor = ge2.ExecutorV2(loaded)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in (feeds, *feeds_too):
        expected = session.run(None, feed)[0]
        got = executor.run(feed)["y"]
        assert_close(got, expected.astype(np.float64), "float32", reduction)
    return loaded


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _input(name, shape, dtype=FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(rng, mode):
    x = rng.standard_normal((2, 3, 5)).astype(np.float32)
    inputs = ["x", "pads"] + (["value"] if mode == "constant" else [])
    initializers = [_ints("pads", [0, 1, 2, 0, 2, 3]), numpy_helper.from_array(np.array(0.5, np.float32), "value")]
    loaded = _check([helper.make_node("Pad", inputs, ["y"], mode=mode)], [_input("x", [2, 3, 5])], {"x": x},
                    initializers)
    assert loaded.op_counts() == {"pad": 1}


def test_pad_with_axes(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    _check([helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"], mode="edge")], [_input("x", [2, 3, 4])],
           {"x": x}, [_ints("pads", [1, 2, 3, 0]), _ints("axes", [-1, 1])])


def test_gather_of_any_axis_and_gather_elements(rng):
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    ids = np.array([[0, -1], [3, 2]], np.int64)
    nodes = [helper.make_node("Gather", ["x", "ids"], ["g"], axis=2),
             helper.make_node("GatherElements", ["g", "where"], ["y"], axis=1)]
    where = np.array(rng.integers(-5, 5, (4, 3, 2, 2)), np.int64)
    loaded = _check(nodes, [_input("x", [4, 5, 6]), _input("ids", [2, 2], TensorProto.INT64),
                            _input("where", [4, 3, 2, 2], TensorProto.INT64)], {"x": x, "ids": ids, "where": where})
    assert loaded.op_counts() == {"gather": 1, "gather_elements": 1}


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd(rng, batch_dims):
    """GatherND (roberta's and T5's exports): index tuples from an input and from a constant, with batch_dims."""
    x = rng.standard_normal((3, 4, 5, 2)).astype(np.float32)
    extents = x.shape[batch_dims:batch_dims + 2]
    tuples = np.stack([rng.integers(-e, e, (3, 6)) for e in extents], axis=-1).astype(np.int64)
    fixed = np.stack([rng.integers(0, e, (3, 2)) for e in extents], axis=-1).astype(np.int64)
    nodes = [helper.make_node("GatherND", ["x", "where"], ["g"], batch_dims=batch_dims),
             helper.make_node("GatherND", ["x", "fixed"], ["h"], batch_dims=batch_dims),
             helper.make_node("Concat", ["g", "h"], ["y"], axis=1)]
    loaded = _check(nodes, [_input("x", [3, 4, 5, 2]), _input("where", [3, 6, 2], TensorProto.INT64)],
                    {"x": x, "where": tuples}, [numpy_helper.from_array(fixed, "fixed")])
    assert loaded.op_counts() == {"gather_nd": 2, "concat": 1}


def test_tile_cumsum_trilu(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    nodes = [helper.make_node("Tile", ["x", "repeats"], ["t"]),
             helper.make_node("CumSum", ["t", "axis"], ["c"], exclusive=1, reverse=1),
             helper.make_node("Trilu", ["c", "k"], ["y"], upper=0)]
    loaded = _check(nodes, [_input("x", [3, 4])], {"x": x},
                    [_ints("repeats", [2, 3]), _ints("axis", 1), _ints("k", -1)], reduction=12)
    assert loaded.op_counts() == {"tile": 1, "cumsum": 1, "trilu": 1}


def test_expand_and_range_over_symbolic_dims(rng):
    """positions = Range(0, seq, 1) and Expand to [batch, seq] from Shape: symbolic, one executor for two sizes."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Range", ["zero", "seq", "one"], ["positions"]),
             helper.make_node("Cast", ["positions"], ["float_positions"], to=FLOAT),
             helper.make_node("Slice", ["shape", "zero_1d", "two_1d"], ["target"]),
             helper.make_node("Expand", ["float_positions", "target"], ["grid"]),
             helper.make_node("Add", ["grid", "x"], ["y"])]
    initializers = [_ints("zero", 0), _ints("one", 1), _ints("zero_1d", [0]), _ints("two_1d", [2])]
    feeds = [{"x": rng.standard_normal(shape).astype(np.float32)} for shape in ((2, 3), (4, 7))]
    loaded = _check(nodes, [_input("x", ["batch", "seq"])], feeds[0], initializers, feeds_too=feeds[1:])
    assert {"arange", "expand"} <= set(loaded.op_counts())


@pytest.mark.parametrize("mode, coordinates, nearest_mode", [
    ("nearest", "asymmetric", "floor"), ("nearest", "half_pixel", "round_prefer_ceil"),
    ("linear", "half_pixel", "round_prefer_floor"), ("linear", "align_corners", "round_prefer_floor"),
    ("linear", "pytorch_half_pixel", "round_prefer_floor")])
@pytest.mark.parametrize("by", ["sizes", "scales"])
def test_resize(rng, mode, coordinates, nearest_mode, by):
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    extra = ([_ints("sizes", [2, 3, 9, 13])] if by == "sizes"
             else [numpy_helper.from_array(np.array([1, 1, 2.0, 1.5], np.float32), "scales")])
    inputs = ["x", "", "", "sizes"] if by == "sizes" else ["x", "", "scales"]
    loaded = _check([helper.make_node("Resize", inputs, ["y"], mode=mode, coordinate_transformation_mode=coordinates,
                                      nearest_mode=nearest_mode)], [_input("x", [2, 3, 5, 6])], {"x": x}, extra)
    assert loaded.op_counts() == {"resize": 1}


@pytest.mark.parametrize("axes", [None, [1]])
def test_any_as_the_max_of_truths_cast_to_integers(rng, axes):
    """torch's any() as the dynamo exporter writes it (T5's float16 clamp: isinf(h).any()): Cast(bool -> int64),
    ReduceMax, Cast(-> bool); over every axis or one, against onnxruntime and NumPy."""
    reduce_inputs = ["ints"] + (["axes"] if axes else [])
    nodes = [helper.make_node("IsInf", ["x"], ["infinite"]),
             helper.make_node("Cast", ["infinite"], ["ints"], to=TensorProto.INT64),
             helper.make_node("ReduceMax", reduce_inputs, ["largest"], keepdims=1 if axes else 0),
             helper.make_node("Cast", ["largest"], ["flag"], to=TensorProto.BOOL),
             helper.make_node("Neg", ["x"], ["negated"]),
             helper.make_node("Where", ["flag", "negated", "x"], ["y"])]
    finite = rng.standard_normal((3, 4)).astype(np.float32)
    with_inf = finite.copy()
    with_inf[1, 2] = np.inf
    feeds = [{"x": finite}, {"x": with_inf}]
    loaded = _check(nodes, [_input("x", [3, 4])], feeds[0], [_ints("axes", axes or [])], feeds_too=feeds[1:])
    assert "max" in loaded.op_counts()
    executor = ge2.ExecutorV2(loaded)
    for feed in feeds:
        x = feed["x"]
        flag = np.isinf(x).any(axis=None if axes is None else 1, keepdims=axes is not None)
        np.testing.assert_array_equal(executor.run(feed)["y"], np.where(flag, -x, x))


def _float64_reference(nodes, input_shape, x, initializers):
    """ONNX's reference evaluator on the same graph in float64 (its input and output declared DOUBLE)."""
    from onnx.reference import ReferenceEvaluator

    graph = helper.make_graph(nodes, "float64", [_input("x", list(input_shape), TensorProto.DOUBLE)],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    return ReferenceEvaluator(model).run(None, {"x": x.astype(np.float64)})[0]


def _scales(values):
    return numpy_helper.from_array(np.array(values, np.float32), "scales")


@pytest.mark.parametrize("shape, inputs, initializers, attributes", [
    ((2, 3, 5, 6), ["x", "", "scales"], [_scales([1, 1, 0.6, 1.7])], dict(mode="cubic")),
    ((2, 3, 5, 6), ["x", "", "", "sizes"], [_ints("sizes", [2, 3, 8, 4])],
     dict(mode="cubic", coordinate_transformation_mode="align_corners")),
    ((2, 3, 5, 6), ["x", "", "scales"], [_scales([1, 1, 1.5, 0.7])],
     dict(mode="cubic", coordinate_transformation_mode="asymmetric", cubic_coeff_a=-0.5, exclude_outside=1)),
    ((1, 2, 9, 10), ["x", "", "scales"], [_scales([1, 1, 0.5, 0.6])], dict(mode="linear", antialias=1)),
    ((1, 2, 9, 10), ["x", "", "", "sizes"], [_ints("sizes", [1, 2, 4, 3])], dict(mode="cubic", antialias=1)),
    ((2, 3, 5, 6), ["x", "", "scales"], [_scales([1, 1, 0.7, 1.3])],
     dict(mode="linear", coordinate_transformation_mode="half_pixel_symmetric")),
    ((2, 3, 5, 6), ["x", "roi", "", "sizes"],
     [numpy_helper.from_array(np.array([0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4], np.float32), "roi"),
      _ints("sizes", [2, 3, 7, 4])],
     dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=10.0)),
    ((2, 3, 5, 6), ["x", "roi", "", "sizes"],
     [numpy_helper.from_array(np.array([0.1, 0.7], np.float32), "roi"), _ints("sizes", [5])],
     dict(mode="nearest", coordinate_transformation_mode="tf_crop_and_resize", axes=[3], nearest_mode="ceil")),
    ((2, 3, 7), ["x", "", "scales"], [_scales([1, 1, 1.6])], dict(mode="cubic", cubic_coeff_a=-0.6)),
])
def test_resize_as_interpolation_matmuls(rng, shape, inputs, initializers, attributes):
    """The Resize modes GE2's resize kernel does not run (cubic with its coefficient and exclude_outside,
    antialiased downsampling, half_pixel_symmetric, tf_crop_and_resize with roi, extrapolation and axes, a 3-d
    input) import as one matmul per axis with interpolation weights, checked against ONNX's reference evaluator in
    float64 and onnxruntime (which resizes cubically only 2-d and 4-d tensors)."""
    x = rng.standard_normal(shape).astype(np.float32)
    nodes = [helper.make_node("Resize", inputs, ["y"], **attributes)]
    if len(shape) == 4:
        loaded = _check(nodes, [_input("x", list(shape))], {"x": x}, initializers, opset=19, reduction=shape[-1])
    else:
        graph = helper.make_graph(nodes, "resize", [_input("x", list(shape))],
                                  [helper.make_tensor_value_info("y", FLOAT, None)], list(initializers))
        loaded = onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9))
    assert "resize" not in loaded.op_counts() and loaded.op_counts()["matmul"] == (2 if len(shape) == 4 else 1)
    got = ge2.ExecutorV2(loaded).run({"x": x})["y"]
    assert_close(got, _float64_reference(nodes, shape, x, initializers), "float32", shape[-1])


@pytest.mark.parametrize("equation, shapes", [
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]), ("ij,jk->ik", [(3, 4), (4, 5)]), ("i,j->ij", [(3,), (4,)]),
    ("...ij,jk->...ik", [(2, 3, 4), (4, 5)]), ("bld,lrd->blr", [(2, 3, 4), (3, 5, 4)]), ("ij->j", [(3, 4)])])
def test_einsum(rng, equation, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)}
    _check([helper.make_node("Einsum", names, ["y"], equation=equation)],
           [_input(n, list(s)) for n, s in zip(names, shapes)], feeds, reduction=8)
