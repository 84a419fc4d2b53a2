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


def test_flatten_and_the_shape_of_a_symbolic_shape_run_two_sizes(rng):
    """The legacy exporter's Flatten of a [batch, seq, 4] tensor (T5's mask at axis 2; torchvision's classifier at
    axis 1) multiplies symbolic extents, and the Shape of a shape-valued constant (its length, an int) folds: here
    it picks the last extent for a Reshape([-1, shape[rank - 1]]). One executor runs two sizes, checked against
    NumPy in float64 and onnxruntime."""
    nodes = [helper.make_node("Flatten", ["x"], ["rows"], axis=2),
             helper.make_node("Flatten", ["x"], ["batches"], axis=1),
             helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Shape", ["shape"], ["rank"]),
             helper.make_node("Sub", ["rank", "one"], ["last"]),
             helper.make_node("Slice", ["shape", "last", "rank"], ["width"]),
             helper.make_node("Concat", ["minus_one", "width"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["reshaped"]),
             helper.make_node("Relu", ["rows"], ["positive_rows"]),
             helper.make_node("Reshape", ["batches", "target"], ["batch_rows"]),
             helper.make_node("Add", ["positive_rows", "batch_rows"], ["sum"]),
             helper.make_node("Add", ["sum", "reshaped"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
                   [_ints("one", [1]), _ints("minus_one", [-1])])
    graph = onnx_frontend.load(model)
    assert graph.outputs["y"].type.shape == ("batch*seq", 4)
    flattened = [node.attrs["shape"] for node in graph.nodes if node.op == "reshape"]
    assert ("batch*seq", 4) in flattened and ("batch", "4*seq") in flattened, flattened
    executor = ge2.ExecutorV2(graph)
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in ((2, 3, 4), (3, 5, 4)):
        x = rng.standard_normal(shape).astype(np.float32)
        rows = x.astype(np.float64).reshape(-1, 4)
        y = executor.run({"x": x})["y"]
        assert_close(y, np.maximum(rows, 0) + 2 * rows, "float32")
        assert_close(y, session.run(None, {"x": x})[0], "float32")


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_to_sizes_with_a_symbolic_batch_runs_two_sizes(rng, mode):
    """The dynamo exporter's upsampling (DeepLabV3's head): Resize's sizes concatenate the input's own leading
    extents, symbolic batch included, with the target height and width; one executor runs two batches, against
    onnxruntime."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "zero", "two"], ["leading"]),
             helper.make_node("Concat", ["leading", "target"], ["sizes"], axis=0),
             helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode)]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4, 5])],
                   [_ints("zero", [0]), _ints("two", [2]), _ints("target", [8, 9])], opset=19)
    graph = onnx_frontend.load(model)
    assert graph.outputs["y"].type.shape == ("batch", 3, 8, 9)
    executor = ge2.ExecutorV2(graph)
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (2, 3):
        x = rng.standard_normal((batch, 3, 4, 5)).astype(np.float32)
        assert_close(executor.run({"x": x})["y"], session.run(None, {"x": x})[0], "float32", 5)


def test_symbolic_sizes_used_as_numbers_run_two_sizes(rng):
    """The legacy exporter multiplies tensors by sizes from Shape (BERT's and T5's position arithmetic): a symbolic
    size used as a number, 0-d (the sequence length) or inside a 1-d shape (a graph output here), becomes a tensor
    holding the size the plan binds. One executor runs two sizes, against NumPy."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Range", ["zero", "seq", "one"], ["positions"]),
             helper.make_node("Mul", ["positions", "seq"], ["scaled"]),
             helper.make_node("Cast", ["scaled"], ["float_scaled"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "float_scaled"], ["y"]),
             helper.make_node("Mul", ["shape", "two"], ["doubled_shape"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("doubled_shape", TensorProto.INT64, None)]
    graph = helper.make_graph(nodes, "sizes", inputs, outputs, [_ints("zero", 0), _ints("one", 1), _ints("two", 2)])
    executor = ge2.ExecutorV2(onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    for batch, seq in ((2, 3), (3, 7)):
        x = rng.standard_normal((batch, seq)).astype(np.float32)
        got = executor.run({"x": x})
        np.testing.assert_array_equal(got["y"], x + (np.arange(seq) * seq).astype(np.float32))
        np.testing.assert_array_equal(got["doubled_shape"], [2 * batch, 2 * seq])


def test_size_and_cast_like(rng):
    """Size is a constant (a symbolic product where the shape has symbolic dims: here the target of a Reshape that
    flattens x, so one executor runs two sizes; a 0-d int64 output where the shape is static), and CastLike casts to
    the element type of its second input, a graph input or a constant."""
    nodes = [helper.make_node("Size", ["x"], ["count"]),
             helper.make_node("Unsqueeze", ["count", "zero"], ["flat_shape"]),
             helper.make_node("Reshape", ["x", "flat_shape"], ["flat"]),
             helper.make_node("CastLike", ["flat", "half_like"], ["half"]),
             helper.make_node("CastLike", ["half", "int_like"], ["y"]),
             helper.make_node("Size", ["half_like"], ["half_count"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
              helper.make_tensor_value_info("half_like", TensorProto.FLOAT16, [2, 2])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.INT64, None),
               helper.make_tensor_value_info("half", TensorProto.FLOAT16, None),
               helper.make_tensor_value_info("half_count", TensorProto.INT64, None)]
    graph = helper.make_graph(nodes, "size", inputs, outputs, [_ints("zero", [0]), _ints("int_like", [7])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    loaded = onnx_frontend.load(model)
    assert loaded.outputs["y"].type.shape == ("3*batch",) and loaded.outputs["y"].type.dtype == "int64"
    executor = ge2.ExecutorV2(loaded)
    for batch in (2, 5):
        x = (rng.standard_normal((batch, 3)) * 100).astype(np.float32)
        got = executor.run({"x": x, "half_like": np.zeros((2, 2), np.float16)})
        np.testing.assert_array_equal(got["half"], x.reshape(-1).astype(np.float16))
        np.testing.assert_array_equal(got["y"], x.reshape(-1).astype(np.float16).astype(np.int64))
        assert got["half_count"].shape == () and got["half_count"] == 4


def _reported(nodes, initializers, input_shape=("n",)):
    """The (node name, reason) pairs the importer reports for a model of input x [input_shape]."""
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))], initializers)
    with pytest.raises(UnsupportedModelError) as caught:
        onnx_frontend.load(model)
    return [(problem[0], problem[2]) for problem in caught.value.problems]


def test_shape_arithmetic_that_depends_on_the_sizes_is_reported():
    shape = helper.make_node("Shape", ["x"], ["shape"])
    # x [n] reshaped to [n + 1]: the element counts differ for every n.
    grown = _reported([shape, helper.make_node("Add", ["shape", "one"], ["grown"]),
                       helper.make_node("Reshape", ["x", "grown"], ["y"], name="reshape_to_n_plus_1")],
                      [_ints("one", [1])])
    assert grown[0][0] == "reshape_to_n_plus_1" and "element counts differ" in grown[0][1]
    # n == 5 holds for some sizes only.
    compared = _reported([shape, helper.make_node("Equal", ["shape", "five"], ["is_five"], name="n_is_five"),
                          helper.make_node("Where", ["is_five", "shape", "five"], ["target"]),
                          helper.make_node("Reshape", ["x", "target"], ["y"])], [_ints("five", [5])])
    assert compared[0][0] == "n_is_five" and "depends on the sizes" in compared[0][1]
    # n / m of two names: no dim.
    divided = _reported([shape, helper.make_node("Gather", ["shape", "zero"], ["n"]),
                         helper.make_node("Gather", ["shape", "one"], ["m"]),
                         helper.make_node("Div", ["n", "m"], ["ratio"], name="n_over_m"),
                         helper.make_node("Reshape", ["x", "ratio"], ["y"])],
                        [_ints("zero", [0]), _ints("one", [1])], ("n", "m"))
    assert divided[0][0] == "n_over_m" and "not a multiple" in divided[0][1]
    # A range from a symbolic start: GE2's arange starts at a constant.
    ranged = _reported([shape, helper.make_node("Gather", ["shape", "zero"], ["n"]),
                        helper.make_node("Mul", ["n", "two"], ["twice"]),
                        helper.make_node("Range", ["n", "twice", "one"], ["positions"], name="range_from_n"),
                        helper.make_node("Cast", ["positions"], ["y"], to=TensorProto.FLOAT)],
                       [_ints("zero", 0), _ints("one", 1), _ints("two", 2)])
    assert ranged[0][0] == "range_from_n" and "constant start" in ranged[0][1]


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


def test_dims_are_integer_polynomials_in_one_canonical_form():
    """Sums, differences and floor divisions of dims (exporters' s + 1, 2 * s - 1, s // 2): one canonical string per
    polynomial, so equal sizes compare equal, and each evaluates as Python would at every binding."""
    assert dims.add("seq", 1) == "seq+1" and dims.canonical("seq + 1") == "seq+1"
    assert dims.subtract("seq+1", 1) == "seq" and dims.subtract("seq", "seq") == 0
    assert dims.add(dims.product(2, "s"), -1) == "2*s-1"
    assert dims.product("s+1", "s") == "s*s+s" == dims.canonical("s**2 + s")
    assert dims.floor_divide("2*s", 2) == "s" and dims.floor_divide("s", 2) == "s//2"
    assert dims.floor_divide("2*s+3", 2) == "s+1" and dims.floor_divide("s+1", 2) == "(s+1)//2"
    assert dims.canonical("3*s//2*t") == "(s//2)*t+s*t"  # Python's left-to-right (3 * s) // 2 * t
    with pytest.raises(ValueError, match="not a multiple"):
        dims.floor_divide("s", "t")
    with pytest.raises(ValueError, match="not an integer expression"):
        dims.canonical("batch size")
    expressions = ["s+1", "2*s-1", "s//2", "(s+1)//2", "-(s//2)+s", "2*(s//2)", "(s//2)*t+s*t", "s*s-3*t+7",
                   "(2*s+t-1)//3", "s-3*(s//3)"]
    for text in expressions:
        form = dims.canonical(text)
        assert dims.canonical(form) == form, text
        assert dims.names(form) <= {"s", "t"}
        for s in (1, 2, 5, 8):
            for t in (1, 3):
                assert dims.evaluate(form, {"s": s, "t": t}) == eval(text, {"s": s, "t": t}), (text, s, t)
    assert dims.evaluate("(s+1)//2*t", {"s": 4}) == "2*t"
    # Orders that hold for every size >= 1, and those that depend on it.
    assert dims.compare("s+1", "s") == 1 and dims.compare("s", "2*s") == -1 and dims.compare("s", 0) == 1
    assert dims.compare("s", "t") is None and dims.compare("s-1", 0) is None and dims.compare("s", 4) is None
    assert dims.lower_bound("s-1") == 0 and dims.lower_bound("1-s") is None and dims.lower_bound("(s-3)//2") == -1
    # An input extent of seq+1 binds seq; one that no seq >= 1 gives does not.
    assert dims.solve("s+1", 5, {}) == {"s": 4} and dims.solve("2*s", 5, {}) is None
    assert dims.solve("s*t", 6, {"t": 2}) == {"s": 3} and dims.solve("s+1", 1, {}) is None
    assert dims.solve("s*t", 6, {}) is None  # two unknowns: not guessed


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
    """diff along a fixed axis and along the symbolic batch (batch - 1 rows; batch + 1 with a prepended row, back to
    batch: HF's packed-sequence check), one executor at two batch sizes."""
    torch_frontend = pytest.importorskip("graph_executor_v2.frontend.torch")
    diff = torch_frontend.RULES["aten.diff.default"]
    g = ge2.ir.Graph("diff")
    x, before, after, first = (g.input(name, shape, dtype) for name, shape in
                               (("x", ("batch", 5)), ("before", ("batch", 2)), ("after", ("batch", 1)),
                                ("first", (1, 5))))
    ctx = _ValuesContext(g)
    g.output(diff(ctx, x, 1, -1), "plain")
    g.output(diff(ctx, x, 1, 1, before, after), "padded")
    g.output(diff(ctx, x, 1, 0), "down")
    g.output(diff(ctx, x, 1, 0, first), "down_prepended")
    assert g.outputs["down"].type.shape == ("batch-1", 5)
    assert g.outputs["down_prepended"].type.shape == ("batch", 5)
    with pytest.raises(torch_frontend.Unsupported, match="n=2"):
        diff(ctx, x, 2, 1)
    numpy_dtype = {"float32": np.float32, "int64": np.int64, "bool": np.bool_}[dtype]
    executor = ge2.ExecutorV2(g)
    for batch in (3, 6):
        feeds = {name: (rng.standard_normal(shape) * 10).astype(numpy_dtype)
                 for name, shape in (("x", (batch, 5)), ("before", (batch, 2)), ("after", (batch, 1)),
                                     ("first", (1, 5)))}
        out = executor.run(feeds)
        np.testing.assert_array_equal(out["plain"], np.diff(feeds["x"], axis=-1))
        np.testing.assert_array_equal(out["padded"], np.diff(feeds["x"], axis=1, prepend=feeds["before"],
                                                             append=feeds["after"]))
        np.testing.assert_array_equal(out["down"], np.diff(feeds["x"], axis=0))
        np.testing.assert_array_equal(out["down_prepended"], np.diff(feeds["x"], axis=0, prepend=feeds["first"]))


def test_torch_size_arithmetic_makes_symbolic_dims():
    """torch.export's SymInt arithmetic (operator.add / sub / mul / floordiv on sym_size results) as dims."""
    torch_frontend = pytest.importorskip("graph_executor_v2.frontend.torch")
    ctx = _ValuesContext(ge2.ir.Graph("sizes"))
    rule = {name: torch_frontend.RULES[f"<built-in function {name}>"] for name in ("add", "sub", "mul", "floordiv")}
    assert rule["add"](ctx, "seq", 1) == "seq+1"
    assert rule["sub"](ctx, "seq+1", 1) == "seq"
    assert rule["mul"](ctx, 2, "seq") == "2*seq"
    assert rule["floordiv"](ctx, "seq", 2) == "seq//2"
    assert rule["floordiv"](ctx, "4*seq", 2) == "2*seq"
    assert rule["add"](ctx, 3, 4) == 7


def test_torch_arange_up_to_a_sum_of_dims_binds_per_plan(rng):
    """torch.arange(past, past + seq) and arange(0, seq + 1) (positions after a prepended one): the arange op over
    an axis of that many elements, bound per plan; a range from a symbolic start is reported."""
    torch_frontend = pytest.importorskip("graph_executor_v2.frontend.torch")
    arange = torch_frontend.RULES["aten.arange.start_step"]
    g = ge2.ir.Graph("ranges")
    ctx = _ValuesContext(g)
    x = g.input("x", ("batch", "seq"), "float32")
    joined = g.concat([g.slice(x, starts=(0,), ends=(1,), axes=(1,)), x], axis=1)
    positions = arange(ctx, 3, torch_frontend.RULES["<built-in function add>"](ctx, "seq", 3), 1, dtype="int64")
    longer = arange(ctx, 0, "seq+1", 1, dtype="float32")
    assert positions.type.shape == ("seq",) and longer.type.shape == ("seq+1",) == joined.type.shape[1:]
    g.output(positions, "positions")
    g.output(longer, "longer")
    with pytest.raises(torch_frontend.Unsupported, match="constant start"):
        arange(ctx, "seq", "2*seq", 1)
    with pytest.raises(torch_frontend.Unsupported, match="no tensor of the graph has an axis of 'seq//2\\+1'"):
        arange(ctx, 0, "seq+1", 2)
    executor = ge2.ExecutorV2(g)
    for seq in (4, 7):
        out = executor.run({"x": rng.standard_normal((2, seq)).astype(np.float32)})
        np.testing.assert_array_equal(out["positions"], np.arange(3, 3 + seq))
        np.testing.assert_array_equal(out["longer"], np.arange(seq + 1, dtype=np.float32))


def _floats(name, values):
    return numpy_helper.from_array(np.asarray(values, np.float32), name)


def _decoder_shape_patterns_model(rng):
    """x [batch, seq, 8] through the shape arithmetic exporters write for decoders (GPT-2, Llama, Mistral), every size
    from Shape -> Gather: a causal mask from Range(0, s) and LessOrEqual, expanded to [batch, 1, s, s] by a Concat of
    Shape-Gathers; position ids Range(past, past + s); heads by Reshape to Concat(batch, seq, 2, 4); attention;
    HF's packed-sequence diff (Concat of a prepended column: s + 1, then Slices back to s, one ending at s + 1);
    x[:, :s - s % 2] reshaped to [batch, s // 2, 2, 8]; Max(s, 1); a ConstantOfShape([s, s]) -> Trilu prefix sum."""
    weights = {name: rng.standard_normal((8, 8)).astype(np.float32) / 3 for name in ("wq", "wk", "wv")}
    node = helper.make_node
    nodes = [
        node("Shape", ["x"], ["shape"]),
        node("Gather", ["shape", "zero"], ["b"], axis=0), node("Gather", ["shape", "one"], ["s"], axis=0),
        node("Unsqueeze", ["b", "axis0"], ["b1"]), node("Unsqueeze", ["s", "axis0"], ["s1"]),
        # The causal mask.
        node("Range", ["zero", "s", "one"], ["positions"]),
        node("Unsqueeze", ["positions", "axis1"], ["rows"]), node("Unsqueeze", ["positions", "axis0"], ["cols"]),
        node("LessOrEqual", ["cols", "rows"], ["allowed"]),
        node("Where", ["allowed", "f_zero", "f_lowest"], ["bias2d"]),
        node("Concat", ["b1", "one_1d", "s1", "s1"], ["bias_shape"], axis=0),
        node("Expand", ["bias2d", "bias_shape"], ["bias"]),
        # Position ids from past = 3.
        node("Add", ["s", "past"], ["past_end"]),
        node("Range", ["past", "past_end", "one"], ["position_ids"]),
        node("Cast", ["position_ids"], ["position_f"], to=TensorProto.FLOAT),
        node("Unsqueeze", ["position_f", "axes02"], ["position_col"]),
        node("Mul", ["position_col", "f_tenth"], ["position_bias"]),
        node("Add", ["x", "position_bias"], ["h"]),
        # Heads, attention with the expanded causal bias, heads merged back.
        node("Concat", ["b1", "s1", "heads"], ["heads_shape"], axis=0),
        node("Concat", ["b1", "s1", "width"], ["merged_shape"], axis=0),
    ]
    for name in ("q", "k", "v"):
        nodes += [node("MatMul", ["h", f"w{name}"], [f"{name}_flat"]),
                  node("Reshape", [f"{name}_flat", "heads_shape"], [f"{name}_split"]),
                  node("Transpose", [f"{name}_split"], [f"{name}_heads"], perm=(0, 2, 1, 3))]
    nodes += [
        node("Transpose", ["k_heads"], ["k_t"], perm=(0, 1, 3, 2)),
        node("MatMul", ["q_heads", "k_t"], ["scores_raw"]),
        node("Mul", ["scores_raw", "f_scale"], ["scores_scaled"]),
        node("Add", ["scores_scaled", "bias"], ["scores"]),
        node("Softmax", ["scores"], ["probabilities"], axis=-1),
        node("MatMul", ["probabilities", "v_heads"], ["context_heads"]),
        node("Transpose", ["context_heads"], ["context_split"], perm=(0, 2, 1, 3)),
        node("Reshape", ["context_split", "merged_shape"], ["context"]),
        # The packed-sequence diff of the first feature.
        node("Slice", ["x", "zero_1d", "one_1d", "two_1d"], ["column3d"]),
        node("Squeeze", ["column3d", "two_1d"], ["column"]),
        node("Slice", ["column", "zero_1d", "one_1d", "one_1d"], ["first"]),
        node("Sub", ["first", "f_one"], ["prepended"]),
        node("Concat", ["prepended", "column"], ["joined"], axis=1),
        node("Add", ["s1", "one_1d"], ["s_plus_1"]),
        node("Slice", ["joined", "one_1d", "s_plus_1", "one_1d"], ["later"]),
        node("Slice", ["joined", "zero_1d", "s1", "one_1d"], ["earlier"]),
        node("Sub", ["later", "earlier"], ["steps"]),
        node("Unsqueeze", ["steps", "two_1d"], ["steps3d"]),
        # x[:, :s - s % 2] as [batch, s // 2, 2, 8], summed over both middle axes; Max(s, 1) rows of ones.
        node("Mod", ["s1", "two_1d"], ["odd"]), node("Sub", ["s1", "odd"], ["even"]),
        node("Slice", ["x", "zero_1d", "even", "one_1d"], ["even_rows"]),
        node("Div", ["s1", "two_1d"], ["half"]),
        node("Max", ["s1", "one_1d"], ["s_at_least_1"]),
        node("Concat", ["b1", "half", "two_1d", "width"], ["pairs_shape"], axis=0),
        node("Reshape", ["even_rows", "pairs_shape"], ["pairs"]),
        node("ReduceSum", ["pairs", "axes12"], ["pair_sum"], keepdims=1),
        node("Concat", ["b1", "s_at_least_1", "width"], ["same_shape"], axis=0),
        node("Reshape", ["pair_sum", "b_one_width"], ["pair_sum3d"]),
        # A prefix sum over the sequence: ConstantOfShape([s, s]) -> lower triangle, times x.
        node("Concat", ["s1", "s1"], ["square"], axis=0),
        node("ConstantOfShape", ["square"], ["ones"], value=numpy_helper.from_array(np.ones(1, np.float32))),
        node("Trilu", ["ones"], ["lower"], upper=0),
        node("MatMul", ["lower", "x"], ["prefix"]),
        node("Mul", ["prefix", "f_tenth"], ["prefix_small"]),
        node("Add", ["context", "steps3d"], ["sum1"]),
        node("Add", ["sum1", "pair_sum3d"], ["sum2"]),
        node("Add", ["sum2", "prefix_small"], ["sum3"]),
        node("Reshape", ["sum3", "same_shape"], ["y"]),
    ]
    initializers = [_ints("zero", 0), _ints("one", 1), _ints("past", 3), _ints("axis0", [0]), _ints("axis1", [1]),
                    _ints("axes02", [0, 2]), _ints("axes12", [1, 2]), _ints("zero_1d", [0]), _ints("one_1d", [1]),
                    _ints("two_1d", [2]), _ints("heads", [2, 4]), _ints("width", [8]),
                    _ints("b_one_width", [0, 1, 8]),
                    _floats("f_zero", 0.0), _floats("f_lowest", -1e9), _floats("f_tenth", 0.1),
                    _floats("f_scale", 0.5), _floats("f_one", 1.0)]
    initializers += [numpy_helper.from_array(w, name) for name, w in weights.items()]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])], initializers)
    return model, {name: w.astype(np.float64) for name, w in weights.items()}


def _decoder_shape_patterns_reference(x, weights):
    batch, seq, _ = x.shape
    h = x + 0.1 * (3 + np.arange(seq))[None, :, None]
    q, k, v = ((h @ weights[f"w{name}"]).reshape(batch, seq, 2, 4).transpose(0, 2, 1, 3) for name in "qkv")
    scores = 0.5 * q @ k.transpose(0, 1, 3, 2) + np.where(np.tril(np.ones((seq, seq), bool)), 0.0, -1e9)
    probabilities = np.exp(scores - scores.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    context = (probabilities @ v).transpose(0, 2, 1, 3).reshape(batch, seq, 8)
    column = x[:, :, 0]
    steps = np.diff(column, axis=1, prepend=column[:, :1] - 1)
    even = seq - seq % 2
    pair_sum = x[:, :even].reshape(batch, seq // 2, 2, 8).sum(axis=(1, 2))[:, None, :]
    prefix = np.cumsum(x, axis=1) * 0.1
    return context + steps[:, :, None] + pair_sum + prefix


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_decoder_shape_arithmetic_stays_symbolic_and_one_executor_runs_two_sizes(rng, device):
    """The exporters' shape arithmetic of GPT-2 / Llama / Mistral (sums s + 1, past + s, s // 2, s % 2, Max) imports
    as symbolic dims, and one executor (CPU, CUDA) runs three (batch, sequence) sizes against float64 NumPy."""
    model, weights = _decoder_shape_patterns_model(rng)
    graph = onnx_frontend.load(model)
    assert graph.inputs[0].type.shape == ("batch", "seq", 8)
    assert graph.outputs["y"].type.shape == ("batch", "seq", 8)
    extents = {d for node in graph.nodes for value in node.outputs for d in value.type.shape}
    assert {"seq+1", "seq//2", "2*(seq//2)"} <= extents
    ops = [node.op for node in graph.nodes]
    assert ops.count("arange") == 2 and "attention" in ops  # both ranges; the written-out attention fused
    executor = ge2.ExecutorV2(graph, device=device)
    for shape in ((2, 5, 8), (3, 8, 8), (1, 2, 8)):
        x = rng.standard_normal(shape).astype(np.float32)
        y = executor.run({"x": x})["y"]
        assert_close(y, _decoder_shape_patterns_reference(x.astype(np.float64), weights), "float32",
                     reduction_length=shape[1])
    assert len(executor._plans) == 3


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_sums_of_dims_bind_per_plan_and_inputs_bind_the_name_in_an_expression(rng, device):
    """pad, concat and slice with symbolic sums (b + 1, 2 * b + 1, back to b), and an input declared [b + 1, 3]: the
    executor binds b from it, checks the other input against b, and names the expression when they disagree."""
    g = ge2.ir.Graph("sums")
    x = g.input("x", ("b", 3), "float32")
    longer = g.input("longer", ("b + 1", 3), "float32")
    padded = g.pad(x, pads=(1, 0, 0, 0))
    joined = g.concat([padded, x], axis=0)
    tail = g.slice(joined, starts=("b+1",), ends=(2**63 - 1,), axes=(0,))
    assert (padded.type.shape, joined.type.shape, tail.type.shape) == (("b+1", 3), ("2*b+1", 3), ("b", 3))
    assert longer.type.shape == ("b+1", 3)
    g.output(g.add(padded, longer), "y")
    g.output(g.relu(tail), "tail")
    executor = ge2.ExecutorV2(g, device=device)
    for batch in (2, 5):
        feeds = {"x": rng.standard_normal((batch, 3)).astype(np.float32),
                 "longer": rng.standard_normal((batch + 1, 3)).astype(np.float32)}
        out = executor.run(feeds)
        np.testing.assert_array_equal(out["y"], np.pad(feeds["x"], ((1, 0), (0, 0))) + feeds["longer"])
        np.testing.assert_array_equal(out["tail"], np.maximum(feeds["x"], 0))
    with pytest.raises(ValueError, match=r"input 'longer': expected shape \(b\+1, 3\), got \(5, 3\)"):
        executor.run({"x": np.zeros((2, 3), np.float32), "longer": np.zeros((5, 3), np.float32)})


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("scale_op", ["div", "mul"])
def test_torch_eager_attention_is_fused_by_the_shared_pass(rng, scale_op, device):
    """Eager attention as the torch rules translate it (BERT's eager path: matmul(q, transpose(k, -1, -2)) / sqrt(d)
    + an additive padding bias, softmax, dropout in eval, matmul by v), with a symbolic batch and sequence: the end
    of from_torch (the pass the ONNX importer shares) leaves one attention node, and one executor runs two sizes
    against float64 NumPy."""
    torch_frontend = pytest.importorskip("graph_executor_v2.frontend.torch")
    from graph_executor_v2.passes.attention_fusion import fuse_imported_attention

    rules = torch_frontend.RULES
    g = ge2.ir.Graph("eager_attention")
    ctx = _ValuesContext(g)
    q, k, v = (g.input(name, ("batch", 2, "seq", 8), "float32") for name in "qkv")
    bias = g.input("bias", ("batch", 1, 1, "seq"), "float32")
    scores = rules["aten.matmul.default"](ctx, q, rules["aten.transpose.int"](ctx, k, -1, -2))
    scaled = (rules["aten.div.Tensor"](ctx, scores, 8 ** 0.5) if scale_op == "div"
              else rules["aten.mul.Tensor"](ctx, scores, 8 ** -0.5))
    logits = rules["aten.add.Tensor"](ctx, scaled, bias)
    probabilities = rules["aten.dropout.default"](ctx, rules["aten._softmax.default"](ctx, logits, -1, False), 0.1,
                                                  False)
    g.output(rules["aten.matmul.default"](ctx, probabilities, v), "y")
    assert [node.op for node in g.nodes if node.op in ("matmul", "softmax", "attention")] == \
        ["matmul", "softmax", "matmul"]
    notes = fuse_imported_attention(g)
    assert len(notes) == 1
    assert [node.op for node in g.nodes if node.op in ("matmul", "softmax", "attention")] == ["attention"]
    attention = next(node for node in g.nodes if node.op == "attention")
    assert attention.attrs["scale"] == pytest.approx(8 ** -0.5) and attention.inputs[3] is not None
    executor = ge2.ExecutorV2(g, device=device)
    for batch, seq in ((2, 5), (3, 7)):
        feeds = {name: rng.standard_normal((batch, 2, seq, 8)).astype(np.float32) for name in "qkv"}
        feeds["bias"] = np.where(rng.random((batch, 1, 1, seq)) < 0.3, -1e9, 0.0).astype(np.float32)
        feeds["bias"][..., 0] = 0.0  # every row sees a key
        q64, k64, v64, bias64 = (feeds[name].astype(np.float64) for name in ("q", "k", "v", "bias"))
        logits64 = q64 @ k64.transpose(0, 1, 3, 2) / 8 ** 0.5 + bias64
        weights = np.exp(logits64 - logits64.max(-1, keepdims=True))
        expected = weights / weights.sum(-1, keepdims=True) @ v64
        assert_close(executor.run(feeds)["y"], expected, "float32", reduction_length=seq)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_advanced_index_of_symbolic_aranges_binds_per_plan(rng, device):
    """The dynamo exporter's x[batch_idx, q_idx] (HF's packed-sequence mask): index tensors from Range(0, b) and
    Range(0, s) broadcast to a shape computed as Shape(Max(Expand(1, Shape(i)) ...)), stacked and read by GatherND;
    one executor at two sizes against NumPy's advanced indexing."""
    node = helper.make_node
    nodes = [node("Shape", ["x"], ["shape"]), node("Gather", ["shape", "zero"], ["b"]),
             node("Gather", ["shape", "one"], ["s"]),
             node("Range", ["zero", "b", "one"], ["batch_positions"]),
             node("Range", ["zero", "s", "one"], ["positions"]),
             node("Reshape", ["batch_positions", "batch_column"], ["batch_index"]),
             node("Reshape", ["positions", "sequence_column"], ["sequence_index"]),
             node("Shape", ["batch_index"], ["batch_index_shape"]),
             node("Shape", ["sequence_index"], ["sequence_index_shape"]),
             node("Expand", ["one", "batch_index_shape"], ["batch_ones"]),
             node("Expand", ["one", "sequence_index_shape"], ["sequence_ones"]),
             node("Max", ["batch_ones", "sequence_ones"], ["broadcast"]),
             node("Shape", ["broadcast"], ["broadcast_shape"]),
             node("Expand", ["batch_index", "broadcast_shape"], ["batch_wide"]),
             node("Expand", ["sequence_index", "broadcast_shape"], ["sequence_wide"]),
             node("Unsqueeze", ["batch_wide", "last"], ["batch_last"]),
             node("Unsqueeze", ["sequence_wide", "last"], ["sequence_last"]),
             node("Concat", ["batch_last", "sequence_last"], ["index"], axis=-1),
             node("GatherND", ["x", "index"], ["y"])]
    initializers = [_ints("zero", 0), _ints("one", 1), _ints("batch_column", [-1, 1, 1, 1]),
                    _ints("sequence_column", [1, 1, -1, 1]), _ints("last", [-1])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])], initializers,
                   opset=18)
    graph = onnx_frontend.load(model)
    assert graph.outputs["y"].type.shape == ("batch", 1, "seq", 1)
    executor = ge2.ExecutorV2(graph, device=device)
    for batch, seq in ((2, 5), (3, 7)):
        x = rng.standard_normal((batch, seq)).astype(np.float32)
        expected = x[np.arange(batch)[:, None, None, None], np.arange(seq)[None, None, :, None]]
        np.testing.assert_array_equal(executor.run({"x": x})["y"], expected)
