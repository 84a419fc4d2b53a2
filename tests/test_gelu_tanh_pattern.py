"""The written-out tanh-GELU (``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``, HF GPT-2's gelu_new as
exporters write it) becomes one ``gelu`` (canonicalize), which the gemm before it then takes as its epilogue (fuse),
through the reshape exporters put between a linear layer's product and its activation."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.frontend import onnx as onnx_frontend  # noqa: E402
from graph_executor_v2.ir import Graph  # noqa: E402
from graph_executor_v2.ops import activations  # noqa: E402
from graph_executor_v2.passes import PASSES, PassManager  # noqa: E402
from graph_executor_v2.testing import assert_close, random_array  # noqa: E402

SCALE = math.sqrt(2.0 / math.pi)
GELU = {"half": 0.5, "one": 1.0, "scale": SCALE, "cubic": 0.044715, "three": 3.0, "inner_one": 1.0, "two": 2.0}
EXPANDED_CUBES = ("pow", "mul", "mul_right")  # sqrt(2/pi) * (x + 0.044715 * x^3), x^3 written so
FACTORED_SQUARES = ("square_pow", "square_mul", "square_cubic_first")  # x * sqrt(2/pi) * (1 + 0.044715 * x^2)


def written_out_gelu(g: Graph, x, *, cube="pow", outer="half_x_first", constants_first=False, shape=(),
                     const_dtype=np.float32, values=None):
    """GELU's tanh form as separate ops on ``x``: ``cube`` pow | mul (x * x * x) | mul_right (x * (x * x)), or the
    argument factored (gelu_fast), x^2 written as ``cube`` square_pow (pow(x, 2)) | square_mul (x * x, times 0.044715)
    | square_cubic_first ((0.044715 * x) * x); ``outer`` half_x_first ((0.5 * x) * (1 + t)) | half_inner (x * (0.5 * (1 + t))) | half_last (0.5 * (x * (1 + t)))
    | no_half (x * (1 + t): not GELU); constants of ``shape`` (or name -> shape, () for those not named) and
    ``const_dtype``, ``values`` overriding GELU's."""
    values = {**GELU, **(values or {})}

    def const(name):
        own_shape = shape.get(name, ()) if isinstance(shape, dict) else shape
        return g.param(g.unique_name(name), np.full(own_shape, values[name], const_dtype))

    def mul(a, b):
        return g.mul(b, a) if constants_first else g.mul(a, b)  # a is the computed operand, b the constant

    def add(a, b):
        return g.add(b, a) if constants_first else g.add(a, b)

    if cube in EXPANDED_CUBES:
        cubed = {"pow": lambda: g.pow(x, const("three")), "mul": lambda: g.mul(g.mul(x, x), x),
                 "mul_right": lambda: g.mul(x, g.mul(x, x))}[cube]()
        argument = mul(add(x, mul(cubed, const("cubic"))), const("scale"))
    else:
        square_term = {"square_pow": lambda: mul(g.pow(x, const("two")), const("cubic")),
                       "square_mul": lambda: mul(g.mul(x, x), const("cubic")),
                       "square_cubic_first": lambda: g.mul(mul(x, const("cubic")), x)}[cube]()
        argument = g.mul(mul(x, const("scale")), add(square_term, const("inner_one")))
    one_plus_tanh = add(g.tanh(argument), const("one"))
    if outer == "half_x_first":
        return g.mul(mul(x, const("half")), one_plus_tanh)
    if outer == "half_inner":
        return g.mul(x, mul(one_plus_tanh, const("half")))
    if outer == "half_last":
        return mul(g.mul(x, one_plus_tanh), const("half"))
    return g.mul(x, one_plus_tanh)


def canonicalized(g: Graph) -> Graph:
    optimized, _ = PassManager([PASSES["canonicalize"]], verify_each=True).run(g)
    return optimized


def run_reference(g: Graph, feeds: dict) -> dict:
    return ge2.ExecutorV2(g, passes=[]).run(feeds)


@pytest.mark.parametrize("cube", EXPANDED_CUBES + FACTORED_SQUARES)
@pytest.mark.parametrize("outer", ["half_x_first", "half_inner", "half_last"])
@pytest.mark.parametrize("constants_first", [False, True])
@pytest.mark.parametrize("shape", [(), (1,), (1, 1, 1)])
def test_every_arrangement_becomes_one_gelu(rng, cube, outer, constants_first, shape):
    g = Graph("g")
    x = g.input("x", (2, 3, 16), "float32")
    g.output(written_out_gelu(g, x, cube=cube, outer=outer, constants_first=constants_first, shape=shape), "y")
    optimized = canonicalized(g)
    assert optimized.op_counts() == {"gelu": 1}
    assert optimized.nodes[0].inputs[0] is optimized.inputs[0]
    feeds = {"x": random_array(rng, (2, 3, 16), "float32", scale=3.0)}
    expected = activations.apply("gelu", feeds["x"].astype(np.float64))
    before, after = run_reference(g, feeds)["y"], run_reference(optimized, feeds)["y"]
    assert_close(after, expected, "float32", what="gelu")
    assert_close(before, expected, "float32", reduction_length=8, what="written-out gelu")  # 8 roundings


@pytest.mark.parametrize("dtype, const_dtype", [("float16", np.float16), ("float16", np.float32),
                                                ("bfloat16", ml_dtypes.bfloat16), ("bfloat16", np.float32)])
def test_constants_of_the_exporters_dtypes_match(rng, dtype, const_dtype):
    """A 16-bit export stores GELU's constants rounded to its dtype; PyTorch's scalars are float32 0-d tensors."""
    g = Graph("g")
    x = g.input("x", (4, 8), dtype)
    g.output(written_out_gelu(g, x, const_dtype=const_dtype), "y")
    optimized = canonicalized(g)
    assert optimized.op_counts() == {"gelu": 1}
    feeds = {"x": random_array(rng, (4, 8), dtype, scale=3.0)}
    assert_close(run_reference(optimized, feeds)["y"], activations.apply("gelu", feeds["x"].astype(np.float64)),
                 dtype, what="gelu")


@pytest.mark.parametrize("values, cube, outer", [
    ({"cubic": 0.0447}, "pow", "half_x_first"),  # another constant is another function
    ({"scale": 0.8}, "pow", "half_x_first"),
    ({"scale": math.sqrt(2.0 / math.pi) * (1 + 2 ** -20)}, "mul", "half_x_first"),  # beyond float32 rounding
    ({"half": 0.25}, "pow", "half_inner"),
    ({"one": 2.0}, "mul", "half_last"),
    ({"three": 2.0}, "pow", "half_x_first"),
    ({"two": 3.0}, "square_pow", "half_x_first"),
    ({"inner_one": 2.0}, "square_mul", "half_inner"),
    ({"scale": 0.8}, "square_cubic_first", "half_last"),
    ({}, "pow", "no_half"),  # 0.5 missing: x * (1 + tanh(...))
    ({}, "square_mul", "no_half"),
])
def test_near_misses_stay(rng, values, cube, outer):
    g = Graph("g")
    x = g.input("x", (4, 8), "float32")
    g.output(written_out_gelu(g, x, cube=cube, outer=outer, values=values), "y")
    optimized = canonicalized(g)
    assert "gelu" not in optimized.op_counts()
    assert optimized.op_counts() == g.op_counts()


@pytest.mark.parametrize("reader", ["tanh", "cube", "inner", "half_x"])
def test_an_intermediate_read_elsewhere_keeps_the_expression(rng, reader):
    g = Graph("g")
    x = g.input("x", (4, 8), "float32")
    y = written_out_gelu(g, x, cube="mul")
    producers = {node.op: node for node in g.nodes}
    intermediate = {"tanh": producers["tanh"].outputs[0],
                    "cube": g.nodes[1].outputs[0],  # (x * x) * x
                    "inner": next(n for n in g.nodes if n.op == "add").outputs[0],  # x + 0.044715 * x^3
                    "half_x": y.producer.inputs[0]}[reader]  # 0.5 * x
    g.output(y, "y")
    g.output(g.neg(intermediate), "elsewhere")
    optimized = canonicalized(g)
    assert "gelu" not in optimized.op_counts()
    feeds = {"x": random_array(rng, (4, 8), "float32")}
    before, after = run_reference(g, feeds), run_reference(optimized, feeds)
    for name in before:
        assert_close(after[name], before[name], "float32", what=name)


def test_a_constant_computed_at_run_time_is_not_trusted(rng):
    """The 0.5 as a graph input: it may hold anything when the graph runs."""
    g = Graph("g")
    x = g.input("x", (4, 8), "float32")
    half = g.input("half", (), "float32")
    g.output(written_out_gelu(g, x, outer="half_x_first", values={"half": 0.5}), "y")
    mul_half = g.outputs["y"].producer.inputs[0].producer
    mul_half.inputs = [x, half]
    optimized = canonicalized(g)
    assert "gelu" not in optimized.op_counts()


def gpt2_mlp_onnx(rows: int, hidden: int, width: int, dtype, rng, const_shape=(), exponent_dtype=None) -> tuple:
    """GPT-2's c_fc and gelu_new as the ONNX exporter writes them (the profile's op order: mul, pow, mul, add, mul,
    tanh, add, mul), the constants initializers of the model's dtype (Pow's exponent of ``exponent_dtype``: ONNX
    lets it differ): x [2, rows/2, hidden] viewed 2-d, Gemm, viewed 3-d, the written-out GELU. Returns the model and
    its weight and bias."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    weight = random_array(rng, (hidden, width), np.dtype(dtype).name, scale=hidden ** -0.5)
    bias = random_array(rng, (width,), np.dtype(dtype).name)
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b"),
             numpy_helper.from_array(np.array([-1, hidden], np.int64), "flat"),
             numpy_helper.from_array(np.array([2, rows // 2, width], np.int64), "view")]
    const_dtypes = {name: dtype for name in GELU} | {"three": exponent_dtype or dtype}
    inits += [numpy_helper.from_array(np.full(const_shape, value, const_dtypes[name]), name)
              for name, value in GELU.items()]
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["x2"]),
             helper.make_node("Gemm", ["x2", "w", "b"], ["h2"]),
             helper.make_node("Reshape", ["h2", "view"], ["h"]),
             helper.make_node("Mul", ["h", "half"], ["mul_2"]),
             helper.make_node("Pow", ["h", "three"], ["pow_0"]),
             helper.make_node("Mul", ["pow_0", "cubic"], ["mul_3"]),
             helper.make_node("Add", ["h", "mul_3"], ["add_3"]),
             helper.make_node("Mul", ["add_3", "scale"], ["mul_4"]),
             helper.make_node("Tanh", ["mul_4"], ["tanh_0"]),
             helper.make_node("Add", ["tanh_0", "one"], ["add_4"]),
             helper.make_node("Mul", ["mul_2", "add_4"], ["y"])]
    graph = helper.make_graph(nodes, "gpt2_mlp", [helper.make_tensor_value_info("x", elem, [2, rows // 2, hidden])],
                              [helper.make_tensor_value_info("y", elem, [2, rows // 2, width])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), weight, bias


def gemm_gelu_reference(x, weight, bias):
    x64 = x.astype(np.float64).reshape(-1, weight.shape[0])
    return activations.apply("gelu", x64 @ weight.astype(np.float64) + bias.astype(np.float64))


@pytest.mark.parametrize("dtype, const_shape, exponent_dtype", [
    (np.float32, (), None), (np.float16, (), None), (np.float32, (1,), None), (np.float16, (), np.float32),
    (np.float16, (), np.int64)])
def test_imported_gpt2_mlp_gemm_carries_the_gelu_epilogue(rng, dtype, const_shape, exponent_dtype):
    model, weight, bias = gpt2_mlp_onnx(8, 32, 64, dtype, rng, const_shape, exponent_dtype)
    ex = ge2.ExecutorV2(onnx_frontend.load(model))
    counts = ex.optimized_graph.op_counts()
    assert counts.get("gemm") == 1 and not {"fused_pointwise", "gelu", "tanh", "pow"} & counts.keys(), counts
    (gemm,) = [node for node in ex.optimized_graph.nodes if node.op == "gemm"]
    assert gemm.attrs["act"] == "gelu"
    explained = ex.explain()
    assert "written_out_gelu_to_gelu: mul_0, pow_0, mul_1, add_0, mul_2, tanh_0, add_1, mul_3 -> gelu_0" in explained
    assert "fuse_activation_through_reshape: gemm_0, reshape_1, gelu_0 -> gemm_1, reshape_2" in explained
    x = random_array(rng, (2, 4, 32), np.dtype(dtype).name)
    y = ex.run({"x": x})["y"]
    assert y.shape == (2, 4, 64)
    assert_close(y.reshape(8, 64), gemm_gelu_reference(x, weight, bias), np.dtype(dtype).name, reduction_length=32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gpt2_mlp_gelu_epilogue_on_cuda_against_float64(rng, dtype):
    """The fused gemm (cuBLASLt's GELU epilogue where chosen) on the GPU, GPT-2's MLP width, against float64."""
    model, weight, bias = gpt2_mlp_onnx(64, 768, 3072, dtype, rng)
    ex = ge2.ExecutorV2(onnx_frontend.load(model), device="cuda")
    (gemm,) = [node for node in ex.optimized_graph.nodes if node.op == "gemm"]
    assert gemm.attrs["act"] == "gelu"
    assert "fused_pointwise" not in ex.optimized_graph.op_counts()
    x = random_array(rng, (2, 32, 768), np.dtype(dtype).name)
    y = ex.run({"x": x})["y"]
    assert ex.fallbacks == [], ex.explain()
    assert_close(y.reshape(64, 3072), gemm_gelu_reference(x, weight, bias), np.dtype(dtype).name,
                 reduction_length=768)


@pytest.mark.parametrize("activation", ["gelu", "relu", "silu"])
def test_fuse_an_activation_through_the_reshape_of_a_gemm(rng, activation):
    g = Graph("g")
    x = g.input("x", (8, 16), "float32")
    product = g.gemm(x, g.param("w", random_array(rng, (16, 32), "float32", scale=0.25)),
                     g.param("b", random_array(rng, (32,), "float32")))
    g.output(getattr(g, activation)(g.reshape(product, shape=(2, 4, 32))), "y")
    optimized, _ = PassManager([PASSES["fuse"]], verify_each=True).run(g)
    assert [(node.op, node.attrs.get("act")) for node in optimized.nodes] == [("gemm", activation), ("reshape", None)]
    assert optimized.outputs["y"].type.shape == (2, 4, 32)
    feeds = {"x": random_array(rng, (8, 16), "float32")}
    assert_close(run_reference(optimized, feeds)["y"], run_reference(g, feeds)["y"], "float32", reduction_length=16)


@pytest.mark.parametrize("read_elsewhere", ["product", "view", "none_but_act_set"])
def test_fuse_through_a_reshape_keeps_shared_values_and_a_set_activation(rng, read_elsewhere):
    g = Graph("g")
    x = g.input("x", (8, 16), "float32")
    w = g.param("w", random_array(rng, (16, 32), "float32"))
    product = g.gemm(x, w, act="relu" if read_elsewhere == "none_but_act_set" else "none")
    view = g.reshape(product, shape=(2, 4, 32))
    g.output(g.gelu(view), "y")
    if read_elsewhere != "none_but_act_set":
        g.output({"product": product, "view": view}[read_elsewhere], "elsewhere")
    optimized, _ = PassManager([PASSES["fuse"]], verify_each=True).run(g)
    assert optimized.op_counts() == g.op_counts()
    assert [node.attrs["act"] for node in optimized.nodes if node.op == "gemm"] == [product.producer.attrs["act"]]


def test_constants_that_broadcast_x_to_more_dims_keep_the_expression(rng):
    """A [1, 1, 1] 0.5 makes a [3, 16] x's result [1, 3, 16]: gelu(x) would have x's shape, so it is not written."""
    g = Graph("g")
    x = g.input("x", (3, 16), "float32")
    g.output(written_out_gelu(g, x, shape={"half": (1, 1, 1)}), "y")
    optimized = canonicalized(g)
    assert optimized.op_counts() == g.op_counts()
    assert optimized.outputs["y"].type.shape == (1, 3, 16)
