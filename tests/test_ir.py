"""The IR: generated builders, type inference on build, errors that name the node, verifier, printer, JSON."""
from __future__ import annotations

import inspect
import json

import ml_dtypes
import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ir import Graph, TensorType, UnknownOpError, verify
from graph_executor_v2.ops._base import OPS, Input, OpDef


def small_mlp(dtype="float32", batch=4):
    g = Graph("mlp")
    x = g.input("x", (batch, 8), dtype)
    w = g.param("w", np.arange(48, dtype=np.float32).reshape(8, 6).astype(ge2.dtypes.to_numpy(dtype)) / 48)
    b = g.param("b", np.linspace(-1, 1, 6).astype(ge2.dtypes.to_numpy(dtype)))
    y = g.relu(g.add(g.matmul(x, w), b), name="hidden")
    g.output(y, "y")
    return g


# --- builders ---------------------------------------------------------------------------------------------------
def test_builders_infer_types_and_return_values():
    g = Graph("g")
    x = g.input("x", ("batch", 16), "float32")
    w = g.param("w", np.ones((16, 4), np.float32))
    y = g.matmul(x, w)
    assert isinstance(y, ge2.ir.Value)
    assert y.type == TensorType(("batch", 4), "float32")
    z = g.gemm(x, w, act="gelu", alpha=2)  # ints are accepted for float attributes
    assert z.producer.attrs["alpha"] == 2.0 and z.producer.attrs["act"] == "gelu"
    assert z.producer.attrs["beta"] == 0.0  # defaults are filled in
    assert [n.op for n in g.nodes] == ["matmul", "gemm"]


def test_optional_inputs_by_position_or_keyword():
    g = Graph("g")
    x = g.input("x", (2, 3), "float32")
    w = g.param("w", np.ones((3, 5), np.float32))
    b = g.param("b", np.ones(5, np.float32))
    by_keyword = g.gemm(x, w, bias=b)
    by_position = g.gemm(x, w, b)
    assert by_keyword.producer.inputs == [x, w, b, None] == by_position.producer.inputs


def test_every_registered_op_has_a_builder_with_a_signature():
    g = Graph("g")
    for op, opdef in OPS.items():
        builder = getattr(g, op)
        parameters = inspect.signature(builder).parameters
        assert [p for p in parameters][:len(opdef.inputs)] == [i.name for i in opdef.inputs], op
        reserved = {"name", "device"} & ({a.name for a in opdef.attrs} | {i.name for i in opdef.inputs})
        assert not reserved, f"op {op} uses builder keywords {reserved}"
        assert op in dir(g)


def test_multi_output_op_returns_a_tuple(monkeypatch):
    def infer(in_types, attrs):
        return [in_types[0], in_types[0]]

    def reference(inputs, attrs):
        return [inputs[0] * 1.0, inputs[0] * 2.0]

    monkeypatch.setitem(OPS, "twice", OpDef("twice", (Input("x"),), ("one", "two"), (), infer, reference))
    g = Graph("g")
    x = g.input("x", (3,), "float32")
    one, two = g.twice(x, name="t")
    assert (one.name, two.name) == ("t.one", "t.two")
    assert one.producer is two.producer


def test_node_and_value_names():
    g = small_mlp()
    assert [n.name for n in g.nodes] == ["matmul_0", "add_0", "hidden"]
    assert g.outputs["y"].name == "hidden"
    with pytest.raises(ValueError, match="'hidden'.*already used"):
        g.relu(g.inputs[0], name="hidden")
    with pytest.raises(ValueError, match="value name 'x' is already used"):
        g.input("x", (1,), "float32")
    with pytest.raises(ValueError, match="output 'y' is declared twice"):
        g.output(g.inputs[0], "y")


def test_params_are_copied_and_frozen():
    source = np.ones((2, 2), np.float32)
    g = Graph("g")
    p = g.param("p", source)
    source[0, 0] = 7
    assert p.data[0, 0] == 1
    with pytest.raises(ValueError):
        p.data[0, 0] = 3


# --- errors name the node -----------------------------------------------------------------------------------------
def test_inner_dimension_mismatch_names_the_node():
    g = Graph("g")
    x = g.input("x", (4, 8), "float32")
    w = g.param("w", np.ones((7, 3), np.float32))
    with pytest.raises(ValueError, match=r"node 'matmul_0' \(matmul\).*inner dimension"):
        g.matmul(x, w)
    assert g.nodes == []  # a failed build leaves the graph unchanged


def test_dtype_conflict_names_the_node():
    g = Graph("g")
    x = g.input("x", (4, 8), "bool")
    h = g.input("h", (4, 8), "bool")
    with pytest.raises(TypeError, match=r"node 'sum' \(add\).*bool"):
        g.add(x, h, name="sum")


def test_unknown_op_and_attribute():
    g = Graph("g")
    x = g.input("x", (4, 8), "float32")
    with pytest.raises(ValueError, match="unknown op 'conv9d'"):
        g.add_node("conv9d", [x])
    with pytest.raises(ValueError, match="no attribute or op 'conv9d'"):
        g.conv9d(x)
    with pytest.raises(UnknownOpError):
        g.conv9d
    assert not hasattr(g, "conv9d")
    w = g.param("w", np.ones((8, 2), np.float32))
    with pytest.raises(ValueError, match=r"node 'gemm_0' \(gemm\): unknown attribute.*'actt'"):
        g.gemm(x, w, actt="relu")
    with pytest.raises(ValueError, match=r"node 'gemm_0' \(gemm\): attribute 'act' expected one of"):
        g.gemm(x, w, act="swish")
    with pytest.raises(TypeError, match=r"node 'gemm_0' \(gemm\): attribute 'trans_a' expected bool"):
        g.gemm(x, w, trans_a="yes")


def test_bad_inputs_name_the_node():
    g = Graph("g")
    x = g.input("x", (4, 8), "float32")
    with pytest.raises(ValueError, match=r"node 'gemm_0' \(gemm\): input 'b' is required"):
        g.gemm(x)
    with pytest.raises(TypeError, match=r"g.relu\(\): takes the inputs \(x\) and at most 0 attribute\(s\) \(none\) "
                                        r"by position, got 1 more"):
        g.relu(x, x)
    with pytest.raises(TypeError, match="wrap constants with g.param"):
        g.relu(np.ones((4, 8), np.float32))
    other = Graph("other").input("x", (4, 8), "float32")
    with pytest.raises(ValueError, match="does not belong to graph 'g'"):
        g.relu(other)


def test_attributes_by_position_after_the_inputs():
    g = Graph("g")
    x = g.input("x", (2, 3, 4), "float32")
    assert g.transpose(x, (2, 0, 1)).type == TensorType((4, 2, 3), "float32")
    assert g.sum(x, (0, 2), True).type == TensorType((1, 3, 1), "float32")
    assert g.slice(x, (1,), (3,), (1,)).type == TensorType((2, 2, 4), "float32")
    assert g.concat([x, x], 1).type == TensorType((2, 6, 4), "float32")
    assert g.concat(x, x, x, 0).type == TensorType((6, 3, 4), "float32")
    w = g.input("w", (4, 5), "float32")
    assert g.gemm(g.reshape(x, (6, 4)), w, None, None, "relu").type == TensorType((6, 5), "float32")
    assert g.nodes[-1].attrs["act"] == "relu"
    with pytest.raises(TypeError, match=r"g.transpose\(\): takes the inputs \(x\) and at most 1 attribute\(s\) "
                                        r"\(perm\) by position, got 2 more positional argument\(s\)"):
        g.transpose(x, (2, 0, 1), (0, 1, 2))
    with pytest.raises(TypeError, match=r"g.transpose\(\): attribute 'perm' is given by position and by keyword"):
        g.transpose(x, (2, 0, 1), perm=(0, 1, 2))
    with pytest.raises(TypeError, match=r"node 'transpose_\d+' \(transpose\): attribute 'perm' expected tuple"):
        g.transpose(x, 2)
    parameters = inspect.signature(g.transpose).parameters
    assert parameters["perm"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


# --- verifier -----------------------------------------------------------------------------------------------------
def test_verifier_accepts_built_graphs():
    verify(small_mlp())


def test_verifier_rejects_use_before_definition():
    g = small_mlp()
    g.nodes.reverse()
    with pytest.raises(ValueError, match=r"node 'hidden' \(relu\): input 'x' reads 'add_0', which is not defined"):
        verify(g)


def test_verifier_rejects_a_stale_type():
    g = small_mlp()
    g.nodes[0].outputs[0].type = TensorType((4, 7), "float32")
    with pytest.raises(ValueError, match=r"node 'matmul_0' \(matmul\): output 'matmul_0' is typed float32\[4, 7\]"):
        verify(g)


def test_verifier_rejects_schema_violations():
    g = small_mlp()
    g.nodes[2].attrs = {"alpha": 1.0}
    with pytest.raises(ValueError, match=r"node 'hidden' \(relu\): unknown attribute"):
        verify(g)
    g = small_mlp()
    g.nodes[0].op = "no_such_op"
    with pytest.raises(ValueError, match="node 'matmul_0' .*unknown op 'no_such_op'"):
        verify(g)
    g = small_mlp()
    g.nodes[1].outputs[0].type = TensorType((4, 6), "float16")
    with pytest.raises(TypeError, match=r"node 'add_0' \(add\): output 'add_0' is typed float16\[4, 6\]"):
        verify(g)


def test_verifier_rejects_double_definition_and_dangling_outputs():
    g = small_mlp()
    g.nodes[2].outputs.append(g.nodes[1].outputs[0])
    with pytest.raises(ValueError, match="node 'hidden'"):
        verify(g)
    g = small_mlp()
    g.outputs["ghost"] = Graph("other").input("z", (1,), "float32")
    with pytest.raises(ValueError, match="output 'ghost'"):
        verify(g)


# --- printer and JSON ---------------------------------------------------------------------------------------------
def test_printer_is_readable():
    text = str(small_mlp())
    assert text.splitlines()[0] == "graph mlp(%x: float32[4, 8]) {"
    assert "  %w: float32[8, 6] = param" in text
    assert "  %matmul_0: float32[4, 6] = matmul(%x, %w)" in text
    assert "  return y=%hidden" in text
    g = Graph("g")
    x = g.input("x", ("n", 3), "float32")
    g.output(g.gemm(x, g.param("w", np.ones((4, 3), np.float32)), act="relu", trans_b=True, device="cuda:1"))
    assert '%gemm_0: float32[n, 4] = gemm(%x, %w, _, _) {act="relu", trans_b=true} on cuda:1' in str(g)


def every_feature_graph():
    g = Graph("everything")
    x = g.input("x", ("batch", 4), "float16")
    w = g.param("w", (np.arange(12).reshape(3, 4) / 7).astype(np.float16))
    bias = g.param("bias", np.array([0.5, -0.25, 1.0], np.float16))
    bf = g.param("bf", np.array([1.5, -2.0, 3.25e-3], ml_dtypes.bfloat16))
    h = g.gemm(x, w, bias, act="leaky_relu", slope=0.2, trans_b=True, name="proj")
    g.output(g.silu(h, device="cuda:0"), "out")
    g.output(x, "passthrough")
    g.output(bf, "constant")
    return g


def test_json_round_trip(tmp_path):
    g = every_feature_graph()
    path = tmp_path / "graph.json"
    g.save(path)
    loaded = Graph.load(path)
    assert loaded.to_json() == g.to_json()
    assert str(loaded) == str(g)
    for name, value in g.params.items():
        twin = loaded.params[name]
        assert twin.data.dtype == value.data.dtype
        assert np.array_equal(twin.data.view(np.uint8), value.data.view(np.uint8))  # bit for bit
    verify(loaded)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float16)
    before = ge2.ExecutorV2(g).run({"x": x})
    after = ge2.ExecutorV2(loaded).run({"x": x})
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])


def test_json_load_rejects_unknown_ops_and_formats():
    text = small_mlp().to_json().replace('"op": "relu"', '"op": "relu9"')
    with pytest.raises(ValueError, match=r"node 'hidden' \(relu9\): unknown op"):
        Graph.from_json(text)
    with pytest.raises(ValueError, match="not a graph_executor_v2 graph"):
        Graph.from_json('{"format": "onnx"}')


def test_json_load_rejects_unknown_attributes():
    parsed = json.loads(small_mlp().to_json())
    parsed["nodes"][2]["attrs"] = {"inplace": True}
    with pytest.raises(ValueError, match=r"node 'hidden' \(relu\): unknown attribute"):
        Graph.from_json(json.dumps(parsed))


def test_clone_is_independent():
    g = small_mlp()
    copy = g.clone()
    copy.remove_node(copy.nodes[-1])
    copy.nodes[0].attrs["x"] = 1
    assert [n.name for n in g.nodes] == ["matmul_0", "add_0", "hidden"]
    assert "x" not in g.nodes[0].attrs
    assert copy.params["w"].data is g.params["w"].data  # read-only arrays are shared
