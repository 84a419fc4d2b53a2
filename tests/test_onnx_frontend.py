"""ONNX import: models against onnxruntime and float64 NumPy, errors that list every offending node, inputs bound
as constants, the CLI, and ONNX's own node tests through its conformance runner (onnx.backend.test).

Every ONNX node test whose op types and element types GE2 claims runs on the CPU backend here (and on the GPU
backend on the GPU machine); the ones GE2 does not pass yet are listed below with their reason (strict xfail: a
fixed one must leave the list).
"""
import copy
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2.frontend import UnsupportedModelError  # noqa: E402
from graph_executor_v2.frontend import onnx as onnx_frontend  # noqa: E402
from graph_executor_v2.frontend.onnx_backend import Ge2Backend, claimed_node_tests  # noqa: E402
from graph_executor_v2.ops import attention  # noqa: E402
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
    assert graph.op_counts() == {"gemm": 1, "relu": 1, "matmul": 1, "softmax": 1}  # w2's Transpose folded
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
    nodes = [helper.make_node("Tan", ["x"], ["a"], name="root"),
             helper.make_node("Relu", ["x"], ["b"], name="fine"),
             helper.make_node("Acos", ["b"], ["c"], name="erf"),
             helper.make_node("Add", ["a", "c"], ["y"], name="after")]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    with pytest.raises(UnsupportedModelError) as caught:
        onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    message = str(caught.value)
    assert "node 'root' (Tan)" in message and "node 'erf' (Acos)" in message
    assert [p[:2] for p in caught.value.problems] == [("root", "Tan"), ("erf", "Acos")]  # 'after' only depends


def test_unsupported_attribute_and_dtype_are_reported():
    nodes = [helper.make_node("LayerNormalization", ["x", "s"], ["y"], stash_type=0),
             helper.make_node("Softmax", ["i"], ["z"])]
    graph = helper.make_graph(nodes, "attrs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                               helper.make_tensor_value_info("i", TensorProto.INT32, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
                               helper.make_tensor_value_info("z", TensorProto.INT32, [3])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "s")])
    with pytest.raises(UnsupportedModelError, match="stash_type=0 is not supported") as caught:
        onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "input has dtype int32" in str(caught.value)


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


def test_values_computed_from_integer_inputs_name_the_inputs_to_bind(rng):
    """A Range limit computed from an integer graph input through Cast and Acosh (a rule GE2 lacks: listed, and folded
    once the input is bound), and a Pad's pads computed from another: the error names both inputs, as ONNX's
    expanded window and CenterCropPad functions need; bound, every such node folds and the graph imports."""
    scalar = lambda name, value: numpy_helper.from_array(np.array(value, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Cast", ["n"], ["n_float"], to=TensorProto.FLOAT),
             helper.make_node("Acosh", ["n_float"], ["root"]),
             helper.make_node("Range", ["zero", "root", "half"], ["positions"]),
             helper.make_node("Add", ["p", "two"], ["pads"]),
             helper.make_node("Pad", ["x", "pads"], ["padded"])]
    graph = helper.make_graph(nodes, "computed_sizes",
                              [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                               helper.make_tensor_value_info("p", TensorProto.INT64, [2]),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("positions", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("padded", TensorProto.FLOAT, None)],
                              [scalar("zero", 0.0), scalar("half", 0.5),
                               numpy_helper.from_array(np.array(2, np.int64), "two")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedModelError) as caught:
        onnx_frontend.load(model)
    assert caught.value.constant_inputs == {"n", "p"}
    reasons = {op: reason for _, op, reason in caught.value.problems}
    assert reasons["Acosh"] == "op type not supported by GE2"
    assert reasons["Range"].startswith("limit comes from graph input(s) 'n'; ")
    assert "comes from graph input(s) 'p'; " in reasons["Pad"]
    loaded = onnx_frontend.load(model, constant_inputs={"n": np.array(9), "p": np.array([1, 0])})
    assert [v.name for v in loaded.inputs] == ["x"]
    x = rng.standard_normal(3).astype(np.float32)
    out = ge2.ExecutorV2(loaded).run({"x": x})
    np.testing.assert_array_equal(out["positions"], np.arange(0, np.arccosh(9.0), 0.5, dtype=np.float32))
    np.testing.assert_array_equal(out["padded"], np.pad(x, (3, 2)))


def test_a_float64_intermediate_computes_in_float32_and_never_leaves_the_graph(rng):
    """ONNX's expanded functions widen to float64 (ReduceLogSumExp, Attention's softmax_precision): GE2 has no
    float64 and computes such a value in float32 (as its Attention does softmax_precision=double), to float32's
    accuracy; a float64 graph output is refused, naming the output."""
    nodes = [helper.make_node("Cast", ["x"], ["wide"], to=TensorProto.DOUBLE),
             helper.make_node("Exp", ["wide"], ["exp"]),
             helper.make_node("ReduceSum", ["exp", "axes"], ["total"], keepdims=0),
             helper.make_node("Log", ["total"], ["log_sum_exp"]),
             helper.make_node("Cast", ["log_sum_exp"], ["y"], to=TensorProto.FLOAT)]
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 33])
    graph = helper.make_graph(nodes, "log_sum_exp", [x_info], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                             None)], [axes])
    x = rng.standard_normal((4, 33)).astype(np.float32)
    out = ge2.ExecutorV2(onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])))
    y = out.run({"x": x})["y"]
    assert y.dtype == np.float32
    assert_close(y, np.log(np.exp(x.astype(np.float64)).sum(axis=1)), "float32", reduction_length=33)
    wide_output = helper.make_graph(nodes[:1], "wide", [x_info],
                                    [helper.make_tensor_value_info("wide", TensorProto.DOUBLE, None)])
    with pytest.raises(UnsupportedModelError, match="'wide' .*element type 11 is not one GE2 produces"):
        onnx_frontend.load(helper.make_model(wide_output, opset_imports=[helper.make_opsetid("", 18)]))


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices_count_across_the_tensor(rng, storage_order):
    """MaxPool's Indices output: int64 positions in the whole [N, C, H, W] tensor, each plane row-major
    (storage_order 0) or column-major (1), against ONNX's reference, with N, C > 1 and a non-square plane; a
    symbolic batch is refused."""
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("MaxPool", ["x"], ["y", "indices"], kernel_shape=[3, 2], strides=[2, 2],
                            pads=[1, 0, 1, 0], storage_order=storage_order)

    def model(batch):
        graph = helper.make_graph([node], "argmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                   [batch, 3, 5, 7])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                                   helper.make_tensor_value_info("indices", TensorProto.INT64, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])

    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    expected_y, expected_indices = ReferenceEvaluator(model(2)).run(None, {"x": x})
    out = ge2.ExecutorV2(onnx_frontend.load(model(2))).run({"x": x})
    np.testing.assert_array_equal(out["y"], expected_y)
    assert out["indices"].dtype == np.int64
    np.testing.assert_array_equal(out["indices"], expected_indices)
    np.testing.assert_array_equal(x.reshape(-1)[out["indices"]] if storage_order == 0 else
                                  x.transpose(0, 1, 3, 2).reshape(-1)[out["indices"]], expected_y)
    with pytest.raises(UnsupportedModelError, match="Indices output with a symbolic batch"):
        onnx_frontend.load(model("batch"))


def test_old_opsets_are_converted(rng):
    model = _mlp_model(rng, opset=11)
    x = rng.standard_normal((2, 10)).astype(np.float32)
    out = ge2.ExecutorV2(onnx_frontend.load(model)).run({"x": x})["y"]
    assert_close(out, _numpy_mlp(model, x), "float32", reduction_length=16)


def test_bad_model_argument():
    with pytest.raises(TypeError, match="model: expected a path, bytes"):
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
# Node tests GE2 claims but does not pass yet, with the reason (each regex matches test names): none on the CPU.
# (onnx_backend.NOT_CLAIMED lists the node tests of claimed op types that GE2 does not claim, and why.)
KNOWN_FAILURES: dict[str, str] = {}


# Where attention's cudnn candidate is built, the conformance backend (kernels in priority order, not timed:
# onnx_backend.AUTOTUNE) runs ONNX Attention on it on the GPU, and the written-out Attention functions of the
# _expanded tests too (the attention fusion makes them one attention node).
KNOWN_FAILURES_WITH_CUDNN_ATTENTION = {
    r"test_attention_4d(_causal|_gqa_with_past_and_present)?_fp16|test_attention_4d_causal_fp16_expanded":
        "cuDNN's SDPA rounds the probabilities to float16 before P @ V (as PyTorch's flash and cuDNN backends do): "
        "1-2 output elements of 192 (of 576 with GQA and a KV cache) are 2 float16 ulps off (H200: max |err| "
        "4.9e-4, within GE2's float16 bound atol 1e-3 / rtol 2e-3), where the test allows rtol 1e-3 (one ulp); "
        "rowwise and unfused are within one ulp. ONNX seeds the test data: the outcome is the same every run. "
        "test_attention_4d_causal_fp16_expanded fuses into the same attention node (H200, session 31: 1 element of "
        "192); test_attention_4d_fp16_expanded passes there (its scale, a product of two float16-rounded factors, is "
        "4e-4 from 1/sqrt(8))",
}


def _built_with_cudnn_attention() -> bool:
    try:
        return attention.has_cudnn()
    except ImportError:  # no native modules: the CUDA tests skip anyway
        return False


def _backend_tests():
    from onnx.backend.test.runner import Runner

    runner = Runner(Ge2Backend, __name__)
    claimed = re.compile("^(" + "|".join(sorted({case.name for case in claimed_node_tests()})) + ")_(cpu|cuda)$")
    runner.include(claimed.pattern)
    for pattern in KNOWN_FAILURES:
        runner.xfail(f"^({pattern})_(cpu|cuda)$")
    if _built_with_cudnn_attention():
        for pattern in KNOWN_FAILURES_WITH_CUDNN_ATTENTION:
            runner.xfail(f"^({pattern})_cuda$")
    test_cases = runner.test_cases
    for case_class in test_cases.values():  # the runner skips the rest; leave them out instead of skipping 3000
        for attribute in [a for a in vars(case_class) if a.startswith("test_") and not claimed.match(a)]:
            delattr(case_class, attribute)
    return test_cases


globals().update(_backend_tests())


def test_the_conformance_backend_takes_kernels_in_priority_order(rng):
    """Conformance results, and the expected failures above, must not depend on which candidate won a timing race
    (measured choice picked rowwise over cudnn for ONNX's float16 attention on the H200, an unexpected success)."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    rep = Ge2Backend.prepare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "CPU")
    assert [executor.preferences.autotune for executor in rep._executors.values()] == [False]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(rep.run([x])[0], np.maximum(x, 0))


def test_claimed_node_tests_are_many():
    """A guard that the conformance cases above really run: GE2 claims this many ONNX node tests."""
    assert len(claimed_node_tests()) >= 900


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
            out = ge2.ExecutorV2(graph, device=device, precision="highest").run({"x": x.numpy()})["y"]
            assert_close(out, expected, "float32", reduction_length=128, what=f"{name} on {device}")


def _export(torch, module, x, path, exporter: str) -> None:
    """torch.onnx.export through the dynamo exporter (onnxscript) or the legacy TorchScript one; skips where the
    installed PyTorch lacks the one asked for."""
    import inspect

    if exporter == "torchscript" and "dynamo" not in inspect.signature(torch.onnx.export).parameters:
        pytest.skip("this PyTorch has only one ONNX exporter")
    try:
        torch.onnx.export(module, (x,), str(path), input_names=["x"], output_names=["y"],
                          dynamo=exporter == "dynamo")
    except ModuleNotFoundError as error:  # the dynamo exporter needs onnxscript
        pytest.skip(f"torch.onnx.export needs {error.name}")
    try:
        onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        if exporter == "dynamo":
            raise
        # Seen with torch 2.15: float16 scaled_dot_product_attention is written in float32 and its float32 residual
        # feeds a float16 LayerNormalization, which onnxruntime rejects as well.
        pytest.skip(f"the TorchScript exporter wrote an invalid model: {str(error).splitlines()[0]}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("attention", ["sdpa", "written_out"])
def test_gpt2_block_exported_by_torch_matches_torch_and_onnxruntime(tmp_path, rng, attention, exporter, dtype):
    """A GPT-2 block (pre-LayerNorm, fused QKV Linear, 4 heads x 64, causal attention as SDPA or written out,
    GELU(tanh) MLP, residuals; ``models.gpt.torch_gpt_block``) exported by torch.onnx.export: the exporters' Split /
    Slice+Squeeze of the QKV projection, shape arithmetic and causal-mask construction fold at import and the
    attention becomes one GE2 attention node. Against the block in float64 and against onnxruntime."""
    torch = pytest.importorskip("torch", reason="exporting models needs PyTorch (on the GPU machine)")
    onnxruntime = pytest.importorskip("onnxruntime")
    from graph_executor_v2.models.gpt import GPTConfig, torch_gpt_block

    torch.manual_seed(int(rng.integers(2 ** 31)))
    config = GPTConfig(context=64, heads=4, width=256, layers=1)
    block = torch_gpt_block(config, attention).eval()
    torch_dtype = getattr(torch, dtype)
    block, x = block.to(torch_dtype), torch.randn(2, 64, 256).to(torch_dtype)
    with torch.no_grad():  # the reference: the same (rounded) weights and inputs in float64
        expected = copy.deepcopy(block).double()(x.double()).numpy()
    path = tmp_path / "gpt2_block.onnx"
    _export(torch, block, x, path, exporter)
    graph = onnx_frontend.load(str(path))
    counts = graph.op_counts()
    assert counts.get("attention") == 1 and "softmax" not in counts, counts
    assert counts.get("matmul", 0) + counts.get("gemm", 0) == 4, counts  # QKV, out_proj, the MLP's two Linears
    feed = x.numpy()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    onnxruntime_y = session.run(None, {"x": feed})[0]
    assert_close(onnxruntime_y, expected, dtype, reduction_length=1024, what="onnxruntime")
    for device in ["cpu"] + (["cuda"] if ge2.is_available() else []):
        out = ge2.ExecutorV2(graph, device=device, precision="highest").run({graph.inputs[0].name: feed})["y"]
        assert out.dtype == feed.dtype
        assert_close(out, expected, dtype, reduction_length=1024, what=f"GE2 on {device}")
        assert_close(out, onnxruntime_y.astype(np.float64), dtype, reduction_length=1024,
                     what=f"GE2 on {device} vs onnxruntime")


# --- convolutional networks and attention -----------------------------------------------------------------------
def _cnn_model(rng):
    """Conv (SAME_LOWER, groups, bias) -> BatchNormalization -> Relu -> MaxPool (ceil_mode) -> Conv (pads, strides,
    dilations) -> AveragePool (count_include_pad) -> GlobalAveragePool -> Flatten -> Gemm."""
    def tensor(name, shape, low=-0.5, high=0.5):
        return numpy_helper.from_array(rng.uniform(low, high, shape).astype(np.float32), name)

    initializers = [tensor("w1", (6, 2, 3, 3)), tensor("b1", (6,)), tensor("scale", (6,)), tensor("shift", (6,)),
                    tensor("mean", (6,)), tensor("var", (6,), 0.5, 2.0), tensor("w2", (8, 6, 3, 2)),
                    tensor("w3", (5, 8)), tensor("b3", (5,))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], auto_pad="SAME_LOWER", group=2, strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c1", "scale", "shift", "mean", "var"], ["n1"], epsilon=1e-3),
             helper.make_node("Relu", ["n1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                              ceil_mode=1),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 0, 2, 1], dilations=[1, 2]),
             helper.make_node("AveragePool", ["c2"], ["p2"], kernel_shape=[2, 3], pads=[1, 1, 1, 1],
                              count_include_pad=1),
             helper.make_node("GlobalAveragePool", ["p2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 17, 14])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_cnn_matches_onnxruntime(rng):
    onnxruntime = pytest.importorskip("onnxruntime")
    model = _cnn_model(rng)
    graph = onnx_frontend.load(model)
    assert graph.op_counts()["conv2d"] == 2 and graph.op_counts()["batch_norm"] == 1
    x = rng.standard_normal((3, 4, 17, 14)).astype(np.float32)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    for device in ["cpu"] + (["cuda"] if ge2.is_available() else []):
        out = ge2.ExecutorV2(graph, device=device, precision="highest").run({"x": x})["y"]
        assert_close(out, expected, "float32", reduction_length=54, what=device)


def test_batch_normalization_training_mode_returns_onnx_running_statistics(rng):
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], epsilon=1e-2,
                              momentum=0.8, training_mode=1)]
    stats = {name: rng.uniform(0.5, 1.5, 3).astype(np.float32) for name in "sbmv"}
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 2, 5])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "rm", "rv")],
                              [numpy_helper.from_array(a, n) for n, a in stats.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    x = rng.standard_normal((4, 3, 2, 5)).astype(np.float32)
    out = ge2.ExecutorV2(onnx_frontend.load(model)).run({"x": x})
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))  # ONNX: the biased variance, momentum on the old
    shape = (1, 3, 1, 1)
    expected = (x64 - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + 1e-2) * stats["s"].reshape(shape) \
        + stats["b"].reshape(shape)
    assert_close(out["y"], expected, "float32", reduction_length=40)
    assert_close(out["rm"], 0.8 * stats["m"] + 0.2 * mean, "float32", reduction_length=40)
    assert_close(out["rv"], 0.8 * stats["v"] + 0.2 * var, "float32", reduction_length=40)


def _attention64(q, k, v, causal, scale):
    """Float64 attention over [batch, heads, seq, dim] with grouped K/V heads (top-left causal mask)."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k.astype(np.float64), group, axis=1), np.repeat(v.astype(np.float64), group, axis=1)
    scores = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * scale
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", weights / weights.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("rank, causal, scale", [(4, False, None), (4, True, 0.3), (3, True, None)])
def test_attention_op(rng, rank, causal, scale):
    if onnx.defs.onnx_opset_version() < 23:
        pytest.skip("the ONNX Attention op needs opset 23")
    batch, heads, kv_heads, seq_q, seq_k, dim = 2, 4, 2, 5, 7, 8
    q = rng.standard_normal((batch, heads, seq_q, dim)).astype(np.float32)
    k = rng.standard_normal((batch, kv_heads, seq_k, dim)).astype(np.float32)
    v = rng.standard_normal((batch, kv_heads, seq_k, dim)).astype(np.float32)
    attrs = {"is_causal": int(causal)}
    if scale is not None:
        attrs["scale"] = scale
    feeds = {"Q": q, "K": k, "V": v}
    if rank == 3:  # [batch, seq, heads * dim]
        attrs.update(q_num_heads=heads, kv_num_heads=kv_heads)
        feeds = {n: np.ascontiguousarray(a.transpose(0, 2, 1, 3).reshape(batch, a.shape[2], -1))
                 for n, a in feeds.items()}
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], **attrs)
    graph = helper.make_graph([node], "attention", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
                                                    for n, a in feeds.items()],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    loaded = onnx_frontend.load(model)
    assert loaded.op_counts()["attention"] == 1
    out = ge2.ExecutorV2(loaded).run(feeds)["Y"]
    expected = _attention64(q, k, v, causal, scale if scale is not None else dim ** -0.5)
    if rank == 3:
        expected = expected.transpose(0, 2, 1, 3).reshape(batch, seq_q, -1)
    assert_close(out, expected, "float32", reduction_length=seq_k)


def test_cnn_and_attention_rejections_list_every_node():
    nodes = [helper.make_node("Conv", ["x3", "w3"], ["c"], name="conv3d"),
             helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], pads=[0, 0, 1, 1],
                               name="argmax"),  # asymmetric pads: pooled one axis at a time
             helper.make_node("MaxPool", ["xi"], ["a"], kernel_shape=[3, 3], name="int_pool")]
    inputs = [helper.make_tensor_value_info("x3", TensorProto.FLOAT, [1, 2, 4, 4, 4]),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8]),
              helper.make_tensor_value_info("xi", TensorProto.INT32, [1, 2, 8, 8])]
    graph = helper.make_graph(nodes, "bad", inputs, [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                                                     for n in ("c", "p", "a")],
                              [numpy_helper.from_array(np.ones((3, 2, 2, 2, 2), np.float32), "w3")])
    with pytest.raises(UnsupportedModelError) as caught:
        onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    reasons = {name: reason for name, _, reason in caught.value.problems}
    assert "rank-5 input" in reasons["conv3d"]
    assert "Indices output" in reasons["argmax"]
    assert "dtype int32" in reasons["int_pool"]  # uint8 is pooled exactly in float32, wider integers are not


@pytest.mark.parametrize("op, attrs", [
    ("MaxPool", dict(kernel_shape=[3, 2, 3], strides=[2, 1, 2], pads=[1, 0, 2, 0, 1, 1], dilations=[1, 2, 1])),
    ("AveragePool", dict(kernel_shape=[2, 3, 3], strides=[1, 2, 2], auto_pad="SAME_UPPER")),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 2, 2, 1], count_include_pad=1,
                         ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[3, 2], dilations=[2, 2], pads=[2, 1, 2, 1])),
    ("MaxPool", dict(kernel_shape=[4, 4], strides=[3, 3], pads=[3, 0, 1, 2], ceil_mode=1)),
])
def test_pooling_beyond_the_ops_matches_onnxruntime(rng, op, attrs):
    """3-d windows, asymmetric or large pads, dilated averages: pooled one axis at a time from strided slices."""
    onnxruntime = pytest.importorskip("onnxruntime")
    shape = [2, 3, 7, 9, 8][:2 + len(attrs["kernel_shape"])]
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    x = rng.standard_normal(shape).astype(np.float32)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    out = ge2.ExecutorV2(onnx_frontend.load(model)).run({"x": x})["y"]
    assert_close(out, expected, "float32", reduction_length=18)


def test_uint8_max_pool_global_max_pool_and_dropout_without_a_ratio(rng):
    """MaxPool of uint8 (pooled in float32, which holds every uint8: exact), GlobalMaxPool over three spatial axes,
    and Dropout in training mode with ratio 0 (the identity, its mask all true), against NumPy and onnxruntime."""
    onnxruntime = pytest.importorskip("onnxruntime")
    nodes = [helper.make_node("MaxPool", ["image"], ["pooled"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalMaxPool", ["volume"], ["peaks"]),
             helper.make_node("Dropout", ["volume", "ratio", "training"], ["kept", "mask"], seed=3)]
    inputs = [helper.make_tensor_value_info("image", TensorProto.UINT8, [2, 3, 7, 8]),
              helper.make_tensor_value_info("volume", TensorProto.FLOAT, [2, 3, 4, 5, 6])]
    outputs = [helper.make_tensor_value_info(name, dtype, None) for name, dtype in
               (("pooled", TensorProto.UINT8), ("peaks", TensorProto.FLOAT), ("kept", TensorProto.FLOAT),
                ("mask", TensorProto.BOOL))]
    graph = helper.make_graph(nodes, "pools", inputs, outputs,
                              [numpy_helper.from_array(np.array(0.0, np.float32), "ratio"),
                               numpy_helper.from_array(np.array(True), "training")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    feeds = {"image": rng.integers(0, 256, (2, 3, 7, 8), dtype=np.uint8),
             "volume": rng.standard_normal((2, 3, 4, 5, 6)).astype(np.float32)}
    got = ge2.ExecutorV2(onnx_frontend.load(model)).run(feeds)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds)
    padded = np.pad(feeds["image"].astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-1)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    assert got["pooled"].dtype == np.uint8
    np.testing.assert_array_equal(got["pooled"], windows.max(axis=(-2, -1)))
    np.testing.assert_array_equal(got["pooled"], expected[0])
    np.testing.assert_array_equal(got["peaks"], feeds["volume"].max(axis=(2, 3, 4), keepdims=True))
    np.testing.assert_array_equal(got["kept"], feeds["volume"])
    assert got["mask"].dtype == np.bool_ and got["mask"].all()


def test_dropout_in_training_with_a_ratio_is_refused():
    node = helper.make_node("Dropout", ["x", "ratio", "training"], ["y"], name="dropout")
    graph = helper.make_graph([node], "dropout", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(0.25, np.float32), "ratio"),
                               numpy_helper.from_array(np.array(True), "training")])
    with pytest.raises(UnsupportedModelError, match="training_mode=True with ratio 0.25"):
        onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("a_shape, b_shape", [((3, 4), (1, 1, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (3, 4, 2)),
                                              ((2, 3, 4), (1, 4, 6)), ((3, 2, 5), (5, 3))])
def test_batched_matmul_broadcasts_as_numpy(rng, a_shape, b_shape):
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    graph = helper.make_graph([node], "matmul", [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape),
                                                 helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    graph = onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    out = ge2.ExecutorV2(graph).run({"a": a, "b": b})["y"]
    assert_close(out, np.matmul(a.astype(np.float64), b.astype(np.float64)), "float32", reduction_length=5)


def test_layer_normalization_statistics_outputs(rng):
    """Mean and InvStdDev (the latter through rmsnorm: GE2 has no sqrt op) against float64 NumPy, rows of very
    different variance (a constant row included)."""
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "invstd"], axis=1, epsilon=1e-5)
    graph = helper.make_graph([node], "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 5])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in ("y", "mean", "invstd")],
                              [numpy_helper.from_array(np.ones((3, 5), np.float32), "s")])
    x = rng.standard_normal((4, 3, 5)).astype(np.float32) * np.array([1e-3, 1.0, 30.0, 0.0], np.float32)[:, None,
                                                                                                         None]
    out = ge2.ExecutorV2(onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
                         ).run({"x": x})
    x64 = x.reshape(4, 15).astype(np.float64)
    mean, var = x64.mean(axis=1), x64.var(axis=1)
    assert_close(out["mean"], mean.reshape(4, 1, 1), "float32", reduction_length=15)
    assert_close(out["invstd"], (1 / np.sqrt(var + 1e-5)).reshape(4, 1, 1), "float32", reduction_length=15)


def test_conv_1d_matches_onnxruntime(rng):
    onnxruntime = pytest.importorskip("onnxruntime")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[2], pads=[2, 1], dilations=[2], group=2)
    graph = helper.make_graph([node], "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 19])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(rng.standard_normal((6, 2, 3)).astype(np.float32), "w"),
                               numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.standard_normal((3, 4, 19)).astype(np.float32)
    expected = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    assert_close(ge2.ExecutorV2(onnx_frontend.load(model)).run({"x": x})["y"], expected, "float32",
                 reduction_length=6)


# --- constant folding, Where, the written-out attention -----------------------------------------------------------
def test_float16_batch_normalization_takes_float32_statistics(rng):
    """A float16 model's scale/B/mean (initializers) become float32 parameters, its var (a graph input) a cast."""
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-3)]
    stats = {name: rng.uniform(0.5, 1.5, 3).astype(np.float16) for name in "sbmv"}
    graph = helper.make_graph(nodes, "bn16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 3, 2, 5]),
                                              helper.make_tensor_value_info("v", TensorProto.FLOAT16, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
                              [numpy_helper.from_array(stats[n], n) for n in "sbm"])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    imported = onnx_frontend.load(model)
    bn = next(node for node in imported.nodes if node.op == "batch_norm")
    assert [value.type.dtype for value in bn.inputs[1:5]] == ["float32"] * 4
    assert bn.inputs[4].producer is not None and bn.inputs[4].producer.op == "cast"
    assert np.array_equal(bn.inputs[1].data, stats["s"].astype(np.float32))
    x = rng.standard_normal((4, 3, 2, 5)).astype(np.float16)
    out = ge2.ExecutorV2(imported).run({"x": x, "v": stats["v"]})["y"]
    assert out.dtype == np.float16
    s64 = {name: a.astype(np.float64).reshape(1, 3, 1, 1) for name, a in stats.items()}
    expected = (x.astype(np.float64) - s64["m"]) / np.sqrt(s64["v"] + 1e-3) * s64["s"] + s64["b"]
    assert_close(out, expected, "float16", reduction_length=1)


def _run_against_onnxruntime(model, feeds):
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_shape_arithmetic_and_mask_construction_fold_at_import(rng):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, and a mask from ConstantOfShape -> Trilu -> Equal -> Where
    -> Sqrt (op types GE2 has no rule for) on constants: all folded, the graph keeps only the tensor work."""
    ints = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
             helper.make_node("Unsqueeze", ["rows", "zero_axis"], ["rows_1d"]),
             helper.make_node("Concat", ["rows_1d", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"]),
             helper.make_node("ConstantOfShape", ["square"], ["ones"],
                              value=numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("Trilu", ["ones"], ["lower"], upper=0),
             helper.make_node("Equal", ["lower", "zero_float"], ["hidden"]),
             helper.make_node("Where", ["hidden", "minus_two", "four"], ["masked_constant"]),
             helper.make_node("Abs", ["masked_constant"], ["positive"]),
             helper.make_node("Sqrt", ["positive"], ["root"]),
             helper.make_node("Mul", ["flat", "root"], ["y"])]
    initializers = [ints("zero", 0), ints("zero_axis", [0]), ints("minus_one", [-1]), ints("square", [6, 6]),
                    numpy_helper.from_array(np.array(0, np.float32), "zero_float"),
                    numpy_helper.from_array(np.array(-2, np.float32), "minus_two"),
                    numpy_helper.from_array(np.array(4, np.float32), "four")]
    graph = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    loaded = onnx_frontend.load(model)
    assert loaded.op_counts() == {"reshape": 1, "mul": 1}
    x = rng.standard_normal((6, 2, 3)).astype(np.float32)
    root = np.where(np.tril(np.ones((6, 6))) == 0, np.sqrt(2.0), 2.0)
    expected = x.reshape(6, 6).astype(np.float64) * root
    out = ge2.ExecutorV2(loaded).run({"x": x})["y"]
    assert_close(out, expected, "float32")
    np.testing.assert_allclose(out, _run_against_onnxruntime(model, {"x": x}), rtol=1e-6)


@pytest.mark.parametrize("batch", [3, "batch"])
def test_bert_token_type_ids_fold_through_gather_elements(rng, batch):
    """BERT's default token type ids as the exporter writes them: GatherElements(Expand(buffer [1, 64], [1, 64]),
    Slice(position_ids [1, 64]) [1, seq], axis=1), then Expand to [batch, seq] and a Gather of the type embeddings.
    ONNX's own reference fails on this GatherElements (np.choose takes at most 32 choices); GE2 folds it with its
    reference. With a symbolic batch the last Expand is the expand op, bound when the plan binds the batch."""
    ints = lambda name, values: numpy_helper.from_array(np.array(values, np.int64), name)  # noqa: E731
    seq, width, positions = 7, 8, 64
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "zero_1d", "two_1d"], ["batch_and_seq"]),
             helper.make_node("Expand", ["type_buffer", "buffer_shape"], ["types_expanded"]),
             helper.make_node("Slice", ["position_ids", "zero_1d", "seq_1d", "one_1d"], ["positions"]),
             helper.make_node("GatherElements", ["types_expanded", "positions"], ["types_1"], axis=1),
             helper.make_node("Expand", ["types_1", "batch_and_seq"], ["token_types"]),
             helper.make_node("Gather", ["type_table", "token_types"], ["type_rows"], axis=0),
             helper.make_node("Add", ["x", "type_rows"], ["y"])]
    type_table = rng.standard_normal((2, width)).astype(np.float32)
    buffer = (np.arange(positions) % 2).astype(np.int64).reshape(1, positions)  # not all zero: the rows differ
    initializers = [ints("zero_1d", [0]), ints("one_1d", [1]), ints("two_1d", [2]), ints("seq_1d", [seq]),
                    ints("buffer_shape", [1, positions]), numpy_helper.from_array(buffer, "type_buffer"),
                    numpy_helper.from_array(np.flip(np.arange(positions)).reshape(1, positions).copy(),
                                            "position_ids"),
                    numpy_helper.from_array(type_table, "type_table")]
    graph = helper.make_graph(nodes, "bert_types", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  [batch, seq, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    loaded = onnx_frontend.load(model)
    assert "gather_elements" not in loaded.op_counts()  # folded at import
    executor = ge2.ExecutorV2(loaded)
    types = buffer[0, np.flip(np.arange(positions))[:seq]]
    for rows in (3,) if batch == 3 else (3, 5):
        x = rng.standard_normal((rows, seq, width)).astype(np.float32)
        out = executor.run({"x": x})["y"]
        assert_close(out, x.astype(np.float64) + type_table[types].astype(np.float64), "float32")
        np.testing.assert_allclose(out, _run_against_onnxruntime(model, {"x": x}), rtol=1e-6)


def test_ops_without_a_rule_on_tensors_and_symbolic_shapes_are_reported():
    nodes = [helper.make_node("Tan", ["x"], ["root"], name="sqrt_of_tensor"),
             helper.make_node("Shape", ["x"], ["shape"], name="symbolic_shape"),
             helper.make_node("Reshape", ["root", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(UnsupportedModelError) as caught:
        onnx_frontend.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    reasons = {name: reason for name, _, reason in caught.value.problems}
    assert reasons == {"sqrt_of_tensor": "op type not supported by GE2"}  # the symbolic Shape itself imports


@pytest.mark.parametrize("x_kind, y_kind", [("-inf", "tensor"), ("constant", "tensor"), ("tensor", "constant"),
                                            ("tensor", "tensor")])
def test_where_with_a_constant_condition_matches_onnxruntime(rng, x_kind, y_kind):
    condition = rng.random((1, 5, 6)) < 0.4
    initializers = [numpy_helper.from_array(condition, "condition")]
    inputs, feeds, branches = [], {}, {}
    for name, kind in (("X", x_kind), ("Y", y_kind)):
        if kind == "tensor":
            branches[name] = rng.standard_normal((3, 5, 6)).astype(np.float32)
            feeds[name] = branches[name]
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [3, 5, 6]))
        else:
            branches[name] = (np.array(-np.inf, np.float32) if kind == "-inf"
                              else rng.standard_normal((5, 1)).astype(np.float32))
            initializers.append(numpy_helper.from_array(branches[name], name))
    graph = helper.make_graph([helper.make_node("Where", ["condition", "X", "Y"], ["out"])], "where", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    loaded = onnx_frontend.load(model)
    assert loaded.op_counts() == {"where": 1}
    out = ge2.ExecutorV2(loaded).run(feeds)["out"]
    expected = np.where(condition, branches["X"].astype(np.float64), branches["Y"].astype(np.float64))
    assert_close(out, expected, "float32")
    np.testing.assert_array_equal(out, _run_against_onnxruntime(model, feeds))


def test_where_with_a_constant_condition_of_one_truth_value_is_the_branch_it_picks(rng):
    """All false: the other branch, no select (ONNX's expanded Attention zeroing the rows its causal mask leaves
    empty, none here, so that the attention fusion sees softmax -> matmul); all true but the picked branch smaller than
    the result: still a select (it broadcasts)."""
    def model(condition, x_shape):
        graph = helper.make_graph([helper.make_node("Where", ["condition", "x", "y"], ["out"])], "where",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
                                   helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5, 6])],
                                  [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(condition, "condition")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    feeds = {"x": rng.standard_normal((3, 5, 6)).astype(np.float32),
             "y": rng.standard_normal((3, 5, 6)).astype(np.float32)}
    never = onnx_frontend.load(model(np.zeros((1, 6), bool), [3, 5, 6]))
    assert "where" not in never.op_counts()
    np.testing.assert_array_equal(ge2.ExecutorV2(never).run(feeds)["out"], feeds["y"])
    always = onnx_frontend.load(model(np.ones((5, 6), bool), [6]))
    assert always.op_counts() == {"where": 1}
    small = {**feeds, "x": feeds["x"][0, 0]}
    np.testing.assert_array_equal(ge2.ExecutorV2(always).run(small)["out"], np.broadcast_to(small["x"], (3, 5, 6)))


def test_where_condition_from_a_graph_input_as_a_tensor_or_bound_as_a_constant(rng):
    graph = helper.make_graph([helper.make_node("Where", ["c", "x", "y"], ["out"])], "where",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, [4]),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    condition = np.array([True, False, False, True])
    feeds = {"x": rng.standard_normal(4).astype(np.float32), "y": rng.standard_normal((3, 4)).astype(np.float32)}
    out = ge2.ExecutorV2(onnx_frontend.load(model)).run({**feeds, "c": condition})["out"]
    np.testing.assert_array_equal(out, np.where(condition, feeds["x"], feeds["y"]))
    loaded = onnx_frontend.load(model, constant_inputs={"c": condition})
    out = ge2.ExecutorV2(loaded).run(feeds)["out"]
    np.testing.assert_array_equal(out, np.where(condition, feeds["x"], feeds["y"]))


def _written_out_attention_model(rng, mask: str, probabilities_output: bool = False):
    """softmax(Q K^T / sqrt(d) + mask) V on [batch, heads, seq, dim] inputs, the mask a constant: "causal"
    (0 / -inf), "finfo" (0 / float32's lowest, as PyTorch's SDPA export writes it), "shifted" (causal one key
    off) or "none"."""
    batch, heads, seq, dim = 2, 3, 5, 8
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Div", ["scores", "root_d"], ["scaled"])]
    initializers = [numpy_helper.from_array(np.array(np.sqrt(dim), np.float32), "root_d")]
    logits = "scaled"
    if mask != "none":
        visible = np.tril(np.ones((seq, seq), bool), k=1 if mask == "shifted" else 0)
        hidden = np.finfo(np.float32).min if mask == "finfo" else -np.inf
        initializers.append(numpy_helper.from_array(np.where(visible, 0, hidden).astype(np.float32), "mask"))
        nodes.append(helper.make_node("Add", ["mask", "scaled"], ["logits"]))
        logits = "logits"
    nodes += [helper.make_node("Softmax", [logits], ["probabilities"], axis=-1),
              helper.make_node("MatMul", ["probabilities", "v"], ["y"])]
    shape = [batch, heads, seq, dim]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if probabilities_output:
        outputs.append(helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
                                                   for n in "qkv"], outputs, initializers)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), feeds


@pytest.mark.parametrize("mask, probabilities_output, fused", [
    ("causal", False, True), ("finfo", False, True), ("none", False, True),
    ("shifted", False, True),  # not the causal mask: the attention op's additive bias
    ("causal", True, False),  # the probabilities are read elsewhere: stays written out
])
def test_written_out_attention_becomes_one_attention_node(rng, mask, probabilities_output, fused):
    model, feeds = _written_out_attention_model(rng, mask, probabilities_output)
    loaded = onnx_frontend.load(model)
    counts = loaded.op_counts()
    assert counts.get("attention", 0) == int(fused) and ("softmax" in counts) != fused, counts
    out = ge2.ExecutorV2(loaded).run(feeds)["y"]
    q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(8)
    if mask != "none":
        scores = np.where(np.tril(np.ones((5, 5), bool), k=1 if mask == "shifted" else 0), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    assert_close(out, (weights / weights.sum(-1, keepdims=True)) @ v, "float32", reduction_length=8)


def test_pointwise_model_with_masks_integers_and_tensor_bounds_matches_onnxruntime(rng):
    """Exact GELU (Erf), HardSwish, a Where on a computed mask, Mod of both signs, integer Div and Pow, Clip with a
    bound given at run time, Not/And/IsNaN and a Cast of the mask: each a GE2 pointwise op, against onnxruntime."""
    f, i = TensorProto.FLOAT, TensorProto.INT32
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    root = numpy_helper.from_array(np.array(1 / np.sqrt(2), np.float32), "root")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    three = numpy_helper.from_array(np.array(3, np.int32), "three")
    minus_three = numpy_helper.from_array(np.array(-3, np.int32), "minus_three")
    nodes = [helper.make_node("Mul", ["x", "root"], ["scaled"]), helper.make_node("Erf", ["scaled"], ["erf"]),
             helper.make_node("Add", ["erf", "one"], ["erf1"]), helper.make_node("Mul", ["x", "erf1"], ["xe"]),
             helper.make_node("Mul", ["xe", "half"], ["gelu"]),
             helper.make_node("HardSwish", ["x"], ["hs"]),
             helper.make_node("Greater", ["x", "half"], ["mask"]), helper.make_node("IsNaN", ["x"], ["nan"]),
             helper.make_node("Not", ["nan"], ["finite"]), helper.make_node("And", ["mask", "finite"], ["keep"]),
             helper.make_node("Where", ["keep", "gelu", "hs"], ["chosen"]),
             helper.make_node("Mod", ["x", "y"], ["c_mod"], fmod=1),  # floats: fmod=1 only (before opset 28)
             helper.make_node("Clip", ["chosen", "low", ""], ["clipped"]),
             helper.make_node("Cast", ["keep"], ["keep_float"], to=f),
             helper.make_node("Sum", ["clipped", "c_mod", "keep_float"], ["out"]),
             helper.make_node("Div", ["k", "three"], ["k_div"]), helper.make_node("Pow", ["k_div", "three"], ["k_pow"]),
             helper.make_node("Mod", ["k", "minus_three"], ["k_mod"]),  # the divisor's sign
             helper.make_node("Mod", ["k", "minus_three"], ["k_fmod"], fmod=1),  # the dividend's
             helper.make_node("Sub", ["k_pow", "k_mod"], ["k_difference"]),
             helper.make_node("Mul", ["k_difference", "k_fmod"], ["k_out"])]
    graph = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", f, [4, 6]),
                                                   helper.make_tensor_value_info("y", f, [6]),
                                                   helper.make_tensor_value_info("low", f, []),
                                                   helper.make_tensor_value_info("k", i, [5])],
                              [helper.make_tensor_value_info("out", f, [4, 6]),
                               helper.make_tensor_value_info("k_out", i, [5])], [half, root, one, three, minus_three])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    feeds = {"x": (rng.standard_normal((4, 6)) * 3).astype(np.float32),
             "y": (np.abs(rng.standard_normal(6)) + 0.5).astype(np.float32) * rng.choice([-1, 1], 6).astype(np.float32),
             "low": np.array(-0.25, np.float32), "k": np.array([-7, -3, 0, 5, 11], np.int32)}
    loaded = onnx_frontend.load(model)
    assert {"erf", "hardswish", "where", "mod", "maximum", "logical_and", "isnan", "logical_not", "pow"} <= set(
        loaded.op_counts())
    out = ge2.ExecutorV2(loaded).run(feeds)
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected_out, expected_k = session.run(None, feeds)
    assert_close(out["out"], expected_out.astype(np.float64), "float32")
    np.testing.assert_array_equal(out["k_out"], expected_k)
