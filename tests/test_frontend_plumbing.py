"""Frontend plumbing: the ONNX importer's inputs (bytes, file-like objects), symbolic dims through exporters' shape
arithmetic (one executor, several sizes), dim arithmetic, and torch.export's in-place forms (no torch needed)."""
import io

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.frontend import UnsupportedModelError  # noqa: E402
from graph_executor_v2.frontend import onnx as onnx_frontend  # noqa: E402
from graph_executor_v2.ir import dims  # noqa: E402
from graph_executor_v2.testing import assert_close  # noqa: E402


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes, inputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "plumbing", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _relu_model():
    return _model([helper.make_node("Relu", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])])


@pytest.mark.parametrize("form", ["bytes", "bytearray", "memoryview", "file", "path", "proto"])
def test_onnx_load_takes_what_onnx_load_takes(rng, tmp_path, form):
    model = _relu_model()
    serialized = model.SerializeToString()
    path = tmp_path / "relu.onnx"
    path.write_bytes(serialized)
    given = {"bytes": serialized, "bytearray": bytearray(serialized), "memoryview": memoryview(serialized),
             "file": io.BytesIO(serialized), "path": str(path), "proto": model}[form]
    graph = onnx_frontend.load(given)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(ge2.ExecutorV2(graph).run({"x": x})["y"], np.maximum(x, 0))


def test_onnx_load_rejects_other_arguments():
    with pytest.raises(TypeError, match="model: expected a path, bytes, a binary file-like object"):
        onnx_frontend.load(3.5)


def _dynamic_heads_model():
    """x [batch, seq, 8] -> heads [batch, seq, 2, 4] (the target built from Shape -> Gather -> Unsqueeze -> Concat),
    transposed to [batch, 2, seq, 4], then flattened to [batch * seq, 8] through Mul and back through Div: the
    legacy exporter's shape arithmetic on symbolic dims."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
             helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Unsqueeze", ["batch", "axis0"], ["batch_1d"]),
             helper.make_node("Unsqueeze", ["seq", "axis0"], ["seq_1d"]),
             helper.make_node("Concat", ["batch_1d", "seq_1d", "heads"], ["heads_shape"], axis=0),
             helper.make_node("Reshape", ["x", "heads_shape"], ["split"]),
             helper.make_node("Transpose", ["split"], ["by_head"], perm=(0, 2, 1, 3)),
             helper.make_node("Relu", ["by_head"], ["positive"]),
             helper.make_node("Transpose", ["positive"], ["back"], perm=(0, 2, 1, 3)),
             helper.make_node("Mul", ["batch_1d", "seq_1d"], ["rows"]),
             helper.make_node("Concat", ["rows", "width"], ["flat_shape"], axis=0),
             helper.make_node("Reshape", ["back", "flat_shape"], ["flat"]),
             helper.make_node("Div", ["rows", "batch_1d"], ["seq_again"]),
             helper.make_node("Concat", ["batch_1d", "seq_again", "width"], ["out_shape"], axis=0),
             helper.make_node("Reshape", ["flat", "out_shape"], ["y"])]
    initializers = [_ints("zero", 0), _ints("one", 1), _ints("axis0", [0]), _ints("heads", [2, 4]),
                    _ints("width", [8])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])], initializers)


def test_symbolic_shape_arithmetic_stays_symbolic_and_one_executor_runs_two_sizes(rng):
    model = _dynamic_heads_model()
    graph = onnx_frontend.load(model)
    assert graph.inputs[0].type.shape == ("batch", "seq", 8)
    assert graph.outputs["y"].type.shape == ("batch", "seq", 8)
    reshape_targets = {node.attrs["shape"] for node in graph.nodes if node.op == "reshape"}
    assert ("batch", "seq", 2, 4) in reshape_targets and ("batch*seq", 8) in reshape_targets
    executor = ge2.ExecutorV2(graph)
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in ((2, 3, 8), (5, 1, 8)):
        x = rng.standard_normal(shape).astype(np.float32)
        y = executor.run({"x": x})["y"]
        assert y.shape == shape
        assert_close(y, np.maximum(x.astype(np.float64), 0), "float32")
        np.testing.assert_array_equal(y, session.run(None, {"x": x})[0])


def test_symbolic_shape_arithmetic_beyond_products_is_reported():
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Add", ["shape", "one"], ["grown"], name="sum_of_dims"),
             helper.make_node("Reshape", ["x", "grown"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])], [_ints("one", [1])])
    with pytest.raises(UnsupportedModelError) as caught:
        onnx_frontend.load(model)
    assert [problem[0] for problem in caught.value.problems] == ["sum_of_dims"]
    assert "symbolic dims" in caught.value.problems[0][2]


def test_dim_arithmetic():
    assert dims.product(2, 3) == 6
    assert dims.product("seq", "batch", 4) == "4*batch*seq"
    assert dims.product("batch", "batch") == "batch*batch"
    assert dims.quotient("4*batch*seq", "seq") == "4*batch"
    assert dims.quotient("4*batch*seq", "2*batch*seq") == 2
    assert dims.quotient(12, 4) == 3
    with pytest.raises(ValueError, match="not a multiple"):
        dims.quotient("batch", "seq")
    with pytest.raises(ValueError, match="not a multiple"):
        dims.quotient("3*batch", 2)
    assert dims.evaluate("4*batch*seq", {"batch": 2, "seq": 5}) == 40
    assert dims.evaluate("4*batch*seq", {"batch": 2}) == "8*seq"
    assert dims.bind_shape(("batch", -1, 3), {"batch": 7}) == (7, -1, 3)
    with pytest.raises(TypeError, match="dim: expected an int or a symbolic name"):
        dims.product(1.5)


def test_reshape_to_symbolic_dims_binds_per_plan(rng):
    g = ge2.ir.Graph("symbolic_reshape")
    x = g.input("x", ("b", "s", 6), "float32")
    flat = g.reshape(x, shape=("b*s", 6))
    assert flat.type.shape == ("b*s", 6)
    y = g.reshape(g.relu(flat), shape=("b", -1, 3))
    assert y.type.shape == ("b", "2*s", 3)
    g.output(y, "y")
    executor = ge2.ExecutorV2(g)
    for shape in ((2, 3, 6), (1, 4, 6)):
        value = rng.standard_normal(shape).astype(np.float32)
        out = executor.run({"x": value})["y"]
        np.testing.assert_array_equal(out, np.maximum(value, 0).reshape(shape[0], -1, 3))


def test_torch_in_place_ops_translate_as_their_functional_forms():
    torch_frontend = pytest.importorskip("graph_executor_v2.frontend.torch")
    assert torch_frontend.functional_form("aten.relu_.default") == "aten.relu.default"
    assert torch_frontend.functional_form("aten.add_.Tensor") == "aten.add.Tensor"
    assert torch_frontend.functional_form("aten.relu.default") is None
    assert torch_frontend.functional_form("aten._assert_tensor_metadata.default") is None
    assert torch_frontend.functional_form("aten.no_such_op_.default") is None
    for target in ("aten._assert_tensor_metadata.default", "aten.to.dtype", "aten.sym_size.int", "aten.alias.default",
                   "aten.detach.default", "aten.clone.default", "aten.lift_fresh_copy.default"):
        assert target in torch_frontend.supported_targets(), target


def test_a_constant_sliced_to_a_symbolic_length_binds_per_plan(rng):
    """position_ids[:, :seq] of a constant buffer, seq from Shape: a slice whose end binds with the inputs."""
    positions = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(1, 16), "positions")
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "one_1d", "two_1d"], ["seq"]),
             helper.make_node("Slice", ["positions", "zero_1d", "seq", "one_1d"], ["window"]),
             helper.make_node("Add", ["x", "window"], ["y"])]
    initializers = [positions, _ints("zero_1d", [0]), _ints("one_1d", [1]), _ints("two_1d", [2])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])], initializers)
    graph = onnx_frontend.load(model)
    assert graph.outputs["y"].type.shape == ("batch", "seq")
    executor = ge2.ExecutorV2(graph)
    for shape in ((2, 5), (3, 9)):
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(executor.run({"x": x})["y"], x + np.arange(shape[1], dtype=np.float32))


class _ValuesContext:
    """The torch rules' context without torch: the arguments are GE2 Values and Python constants already."""

    def __init__(self, graph):
        self.graph = graph

    def get(self, argument):
        return argument

    def tensor(self, argument):
        return argument


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_torch_diff_is_a_slice_difference_with_prepend_and_append(rng, dtype):
    torch_frontend = pytest.importorskip("graph_executor_v2.frontend.torch")
    diff = torch_frontend.RULES["aten.diff.default"]
    g = ge2.ir.Graph("diff")
    x, before, after = (g.input(name, shape, dtype) for name, shape in
                        (("x", ("batch", 5), ), ("before", ("batch", 2)), ("after", ("batch", 1))))
    ctx = _ValuesContext(g)
    g.output(diff(ctx, x, 1, -1), "plain")
    g.output(diff(ctx, x, 1, 1, before, after), "padded")
    with pytest.raises(torch_frontend.Unsupported, match="n=2"):
        diff(ctx, x, 2, 1)
    with pytest.raises(torch_frontend.Unsupported, match="symbolic dimension 'batch'"):
        diff(ctx, x, 1, 0)
    numpy_dtype = {"float32": np.float32, "int64": np.int64, "bool": np.bool_}[dtype]
    feeds = {name: (rng.standard_normal((3, width)) * 10).astype(numpy_dtype)
             for name, width in (("x", 5), ("before", 2), ("after", 1))}
    out = ge2.ExecutorV2(g).run(feeds)
    np.testing.assert_array_equal(out["plain"], np.diff(feeds["x"], axis=-1))
    np.testing.assert_array_equal(out["padded"], np.diff(feeds["x"], axis=1, prepend=feeds["before"],
                                                         append=feeds["after"]))
