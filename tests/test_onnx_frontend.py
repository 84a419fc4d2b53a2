"""ONNX import: models against onnxruntime and float64 NumPy, errors that list every offending node, inputs bound
as constants, the CLI, and ONNX's own node tests through its conformance runner (onnx.backend.test).

Every ONNX node test whose op types and element types GE2 claims runs on the CPU backend here (and on the GPU
backend on the GPU machine); the ones GE2 does not pass yet are listed below with their reason (strict xfail: a
fixed one must leave the list).
"""
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.frontend import UnsupportedModelError  # noqa: E402
from graph_executor_v2.frontend import onnx as onnx_frontend  # noqa: E402
from graph_executor_v2.frontend.onnx_backend import Ge2Backend, claimed_node_tests  # noqa: E402
from graph_executor_v2.testing import assert_close  # noqa: E402


def _mlp_model(rng, opset=17):
    w1 = numpy_helper.from_array(rng.standard_normal((10, 16)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((5, 16)).astype(np.float32), "w2")
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2t"], ["z"]),
             helper.make_node("Transpose", ["w2"], ["w2t"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    nodes = nodes[:2] + [nodes[3], nodes[2], nodes[4]]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w1, b1, w2])
    # IR version 8 (what opset 17 came with), so older onnxruntime builds load it too.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _numpy_mlp(model, x):
    weights = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    h = np.maximum(x.astype(np.float64) @ weights["w1"] + weights["b1"], 0)
    z = h @ weights["w2"].T
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_mlp_matches_numpy_and_onnxruntime(rng):
    model = _mlp_model(rng)
    graph = onnx_frontend.load(model)
    assert graph.op_counts() == {"gemm": 1, "relu": 1, "transpose": 1, "matmul": 1, "softmax": 1}
    x = rng.standard_normal((7, 10)).astype(np.float32)
    out = ge2.ExecutorV2(graph).run({"x": x})["y"]
    assert_close(out, _numpy_mlp(model, x), "float32", reduction_length=16)
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(out, session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_symbolic_batch_binds_at_run_time(rng):
    graph = onnx_frontend.load(_mlp_model(rng))
    assert graph.inputs[0].type.shape == ("batch", 10)
    executor = ge2.ExecutorV2(graph)
    for batch in (1, 3):
        assert executor.run({"x": np.ones((batch, 10), np.float32)})["y"].shape == (batch, 5)


def test_every_unsupported_node_is_listed_in_one_error(rng):
    nodes = [helper.make_node("Sqrt", ["x"], ["a"], name="root"),
             helper.make_node("Relu", ["x"], ["b"], name="fine"),
             helper.make_node("Erf", ["b"], ["c"], name="erf"),
             helper.make_node("Add", ["a", "c"], ["y"], name="after")]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    with pytest.raises(UnsupportedModelError) as caught:
        onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    message = str(caught.value)
    assert "node 'root' (Sqrt)" in message and "node 'erf' (Erf)" in message
    assert [p[:2] for p in caught.value.problems] == [("root", "Sqrt"), ("erf", "Erf")]  # 'after' only depends


def test_unsupported_attribute_and_dtype_are_reported():
    nodes = [helper.make_node("LayerNormalization", ["x", "s"], ["y"], stash_type=0),
             helper.make_node("Add", ["i", "i"], ["z"])]
    graph = helper.make_graph(nodes, "attrs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                               helper.make_tensor_value_info("i", TensorProto.INT32, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
                               helper.make_tensor_value_info("z", TensorProto.INT32, [3])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "s")])
    with pytest.raises(UnsupportedModelError, match="stash_type=0 is not supported") as caught:
        onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "input A has dtype int32" in str(caught.value)


def test_shape_inputs_are_bound_as_constants(rng):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "reshape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                                                 helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedModelError, match="constant_inputs") as caught:
        onnx_frontend.load(model)
    assert caught.value.constant_inputs == {"shape"}
    loaded = onnx_frontend.load(model, constant_inputs={"shape": np.array([3, -1])})
    assert [v.name for v in loaded.inputs] == ["x"]
    x = rng.standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_array_equal(ge2.ExecutorV2(loaded).run({"x": x})["y"], x.reshape(3, 4))
    with pytest.raises(ValueError, match="constant_inputs: unknown input"):
        onnx_frontend.load(model, constant_inputs={"nope": np.array([1])})


def test_old_opsets_are_converted(rng):
    model = _mlp_model(rng, opset=11)
    x = rng.standard_normal((2, 10)).astype(np.float32)
    out = ge2.ExecutorV2(onnx_frontend.load(model)).run({"x": x})["y"]
    assert_close(out, _numpy_mlp(model, x), "float32", reduction_length=16)


def test_bad_model_argument():
    with pytest.raises(TypeError, match="model: expected a path or an onnx.ModelProto"):
        onnx_frontend.load(42)


def test_run_onnx_cli_compares_with_onnxruntime(rng, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from graph_executor_v2.__main__ import main

    path = tmp_path / "mlp.onnx"
    model = _mlp_model(rng)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4  # random inputs need a concrete batch
    onnx.save(model, str(path))
    assert main(["run-onnx", str(path), "--cpu"]) == 0
    printed = capsys.readouterr().out
    assert "plan for" in printed and "matches onnxruntime" in printed


# --- ONNX's conformance runner ---------------------------------------------------------------------------------
# Node tests GE2 claims but does not pass yet, with the reason (each regex matches test names).
KNOWN_FAILURES = {
    r"test_(add|sub|mul|div)_(uint8|int32_trunc)": "GE2's elementwise arithmetic runs on float dtypes only",
    r"test_gather_negative_indices": "negative indices that arrive at run time are out of range for embedding",
    r"test_maxpool_2d_uint8": "GE2's pooling runs on float dtypes only",
    r"test_maxpool_with_argmax_2d_precomputed_(pads|strides)":
        "the Indices output: GE2's max_pool2d indexes within each plane (int32), ONNX across the tensor (int64, "
        "storage_order); no integer arithmetic converts them",
    r"test_(max|average)pool_3d_.*": "3-d pooling: GE2's pooling ops are 2-d",
    r"test_averagepool_2d_dilations": "avg_pool2d has no dilation",
    r"test_(max|average)pool_2d_(pads|pads_count_include_pad|same_upper|same_lower)":
        "pads larger than half the window or asymmetric (SAME_*): GE2's pooling pads both sides alike, at most "
        "half the window",
    r"test_attention_.*(attn_mask|past_and_present|padded_kv|nonpad|softcap|qk_matmul|local_window|"
    r"bidirectional_window).*":
        "Attention with a mask, a KV cache (past/present), nonpad_kv_seqlen, softcap, the qk_matmul_output or a "
        "local window: GE2's attention op takes q, k, v, is_causal and scale only",
    r"test_attention_(3d|4d)_diff_heads_sizes(_scaled|_causal)?": "V's head size differs from K's; GE2's attention "
                                                                  "op needs equal ones",
}


def _backend_tests():
    from onnx.backend.test.runner import Runner

    runner = Runner(Ge2Backend, __name__)
    claimed = re.compile("^(" + "|".join(sorted({case.name for case in claimed_node_tests()})) + ")_(cpu|cuda)$")
    runner.include(claimed.pattern)
    for pattern in KNOWN_FAILURES:
        runner.xfail(f"^{pattern}_(cpu|cuda)$")
    test_cases = runner.test_cases
    for case_class in test_cases.values():  # the runner skips the rest; leave them out instead of skipping 3000
        for attribute in [a for a in vars(case_class) if a.startswith("test_") and not claimed.match(a)]:
            delattr(case_class, attribute)
    return test_cases


globals().update(_backend_tests())


def test_claimed_node_tests_are_many():
    """A guard that the conformance cases above really run: GE2 claims this many ONNX node tests."""
    assert len(claimed_node_tests()) >= 190


def test_models_exported_by_torch_match_torch_and_onnxruntime(tmp_path):
    """An MLP and a transformer MLP block exported by torch.onnx.export (generated here, not committed)."""
    torch = pytest.importorskip("torch", reason="exporting models needs PyTorch (on the GPU machine)")
    onnxruntime = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(32)
            self.up = torch.nn.Linear(32, 128)
            self.down = torch.nn.Linear(128, 32)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x)), approximate="tanh"))

    models = {"mlp": (torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)),
                      torch.randn(8, 20)),
              "block": (Block(), torch.randn(16, 32))}
    devices = ["cpu"] + (["cuda"] if ge2.is_available() else [])
    for name, (module, x) in models.items():
        module.eval()
        path = tmp_path / f"{name}.onnx"
        torch.onnx.export(module, (x,), str(path), input_names=["x"], output_names=["y"])
        graph = onnx_frontend.load(str(path))
        expected = module(x).detach().double().numpy()
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], expected, rtol=1e-4, atol=1e-5)
        for device in devices:
            out = ge2.ExecutorV2(graph, device=device).run({"x": x.numpy()})["y"]
            assert_close(out, expected, "float32", reduction_length=128, what=f"{name} on {device}")
