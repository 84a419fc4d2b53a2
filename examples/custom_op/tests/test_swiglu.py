"""swiglu, built out of tree: the float64 reference against closed forms and finite differences, the OpDefs, the
kernels' capability checks (host code of the native module), GE2's registry choosing between the two variants
(autotuned, one rejected with its reason, marked external), a graph through autograd and a few training steps on
the CPU backend, validation; on the GPU both kernels x every dtype x edge shapes against the reference (outputs
poisoned), misaligned views, torch interop, an autotuned plan's explain() and gradients through the kernels."""
from __future__ import annotations

import re

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import autograd
from graph_executor_v2.ir import Graph
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, Problem
from graph_executor_v2.runtime import Capabilities, Preferences, choose_kernel
from graph_executor_v2.runtime.autotune import AutotuneCache
from graph_executor_v2.runtime.registry import kernel_label
from graph_executor_v2.testing import assert_close, random_array
from graph_executor_v2.train import SGD, Trainer

from ge2_swiglu import swiglu

DTYPES = ("float32", "float16", "bfloat16")
PACK = {"float32": 4, "float16": 8, "bfloat16": 8}
SHAPES = [(1,), (7,), (3, 5), (64, 256), (33, 1001), (1 << 20,)]  # odd, non-multiple-of-8, several waves
FAKE_GPU = Capabilities("cuda", (9, 0), "Fake GPU", "Fake GPU | test")


def fits_vec16(shape, dtype) -> bool:
    return int(np.prod(shape)) % PACK[dtype] == 0


# ---------------------------------------------------------------------------------------------------------------
# CPU: reference, OpDefs, capability checks, registry, graphs and training, validation
# ---------------------------------------------------------------------------------------------------------------
def test_reference_closed_form():
    a = np.array([0.0, 1.0, -1.0, 20.0, -20.0])
    expected = 2.0 * np.array([0.0, 0.7310585786300049, -0.2689414213699951, 20.0 / (1.0 + np.exp(-20.0)),
                               -20.0 / (1.0 + np.exp(20.0))])
    np.testing.assert_allclose(swiglu.reference(a, np.full(5, 2.0)), expected, rtol=1e-15, atol=0)


def test_reference_backward_matches_finite_differences(rng):
    a, b, dy = (rng.standard_normal((3, 4)) * 3 for _ in range(3))
    step = 1e-6
    da, db = swiglu.reference_backward(dy, a, b)
    np.testing.assert_allclose(da, dy * (swiglu.reference(a + step, b) - swiglu.reference(a - step, b)) / (2 * step),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(db, dy * (swiglu.reference(a, b + step) - swiglu.reference(a, b - step)) / (2 * step),
                               rtol=1e-6, atol=1e-7)


def test_infer_and_its_errors():
    x = TensorType((3, 5), "bfloat16")
    assert OPS["swiglu"].infer([x, x], {}) == [x]
    assert OPS["swiglu_backward"].infer([x, x, x], {}) == [x, x]
    with pytest.raises(TypeError, match="a: expected dtype float32, float16 or bfloat16, got int64"):
        OPS["swiglu"].infer([TensorType((3, 5), "int64")] * 2, {})
    with pytest.raises(ValueError, match=r"b: expected shape \(3, 5\) \(the shape of a\), got \(5, 3\)"):
        OPS["swiglu"].infer([x, TensorType((5, 3), "bfloat16")], {})
    with pytest.raises(ValueError, match=r"dy: expected bfloat16\[3, 5\] \(the type of y\), got float32\[3, 5\]"):
        OPS["swiglu_backward"].infer([TensorType((3, 5), "float32"), x, x], {})


def test_kernel_capability_checks_run_on_the_host():
    native = swiglu._native_module()
    assert native.unsupported_reason("vec16", 1024, "float16", True) == ""
    assert native.unsupported_reason("vec16", 1001, "float16", True) == \
        "element count 1001 is not a multiple of 8 (16-byte packs of float16)"
    assert native.unsupported_reason("vec16", 1000, "float32", False) == "an array is not 16-byte aligned"
    assert native.unsupported_reason("scalar", 1001, "float16", False) == ""
    assert [k["name"] for k in swiglu.kernels()] == ["vec16", "scalar"]


def swiglu_problem(shape, dtype):
    g = Graph("swiglu")
    y = g.swiglu(g.input("a", shape, dtype), g.input("b", shape, dtype))
    return y.producer, Problem("swiglu", (y.type, y.type), (y.type,), {}, (9, 0))


def test_registry_autotunes_between_the_variants_as_external_candidates(tmp_path):
    node, problem = swiglu_problem((64, 256), "float16")
    timings = iter([0.030, 0.045])  # vec16 (ranked first, timed first), then scalar
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences(autotune=True), lambda launch: next(timings),
                              AutotuneCache(tmp_path / "autotune.json"))
    assert selection.kernel == "vec16"
    assert selection.reason == "autotuned: vec16 0.0300 ms, scalar 0.0450 ms"
    assert kernel_label("swiglu", "vec16") == "vec16 [external: ge2_swiglu]"
    assert kernel_label("swiglu_backward", "scalar") == "scalar [external: ge2_swiglu]"


def test_registry_rejects_vec16_with_its_reason_on_an_odd_size():
    node, problem = swiglu_problem((33, 1001), "bfloat16")
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences())
    assert selection.kernel == "scalar"
    assert selection.rejected == (("vec16", "element count 33033 is not a multiple of 8 (16-byte packs of bfloat16)"),)


def mlp_with_swiglu(rng, batch=16, width=8, hidden=12):
    """x -> swiglu(x @ w_gate, x @ w_up) @ w_down, mean squared error against ``target``."""
    g = Graph("swiglu_mlp")
    x, target = g.input("x", (batch, width), "float32"), g.input("target", (batch, width), "float32")
    weights = {name: g.param(name, random_array(rng, shape, "float32", scale=shape[0] ** -0.5))
               for name, shape in (("w_gate", (width, hidden)), ("w_up", (width, hidden)), ("w_down", (hidden, width)))}
    h = g.swiglu(g.matmul(x, weights["w_gate"]), g.matmul(x, weights["w_up"]))
    error = g.sub(g.matmul(h, weights["w_down"]), target)
    g.output(g.mean(g.mul(error, error)), "loss")
    return g, {name: value.data.astype(np.float64) for name, value in weights.items()}


def test_gradients_through_a_graph_match_numpy(rng):
    g, w = mlp_with_swiglu(rng)
    x, target = random_array(rng, (16, 8), "float32"), random_array(rng, (16, 8), "float32")
    result = ge2.ExecutorV2(autograd.backward_graph(g, "loss"), device="cpu").run({"x": x, "target": target})
    gate, up = x @ w["w_gate"], x @ w["w_up"]
    h = swiglu.reference(gate, up)
    error = h @ w["w_down"] - target
    d_out = 2 * error / error.size
    d_gate, d_up = swiglu.reference_backward(d_out @ w["w_down"].T, gate, up)
    expected = {"w_down": h.T @ d_out, "w_gate": x.T @ d_gate, "w_up": x.T @ d_up}
    assert_close(result["loss"], np.mean(error ** 2), "float32", error.size)
    for name, grad in expected.items():
        assert_close(result[autograd.grad_name(name)], grad, "float32", 16, what=f"gradient of {name}")


def test_training_through_swiglu_lowers_the_loss(rng):
    g, _ = mlp_with_swiglu(rng)
    x = random_array(rng, (16, 8), "float32")
    batch = {"x": x, "target": np.tanh(x)}
    trainer = Trainer(g, "loss", device="cpu", optimizer=SGD(lr=0.2))
    losses = [float(trainer.step(batch)) for _ in range(30)]
    assert losses[-1] < 0.7 * losses[0], losses


def test_validation_before_any_device_work():
    x = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError, match="kernel: expected one of auto, vec16, scalar, got 'fast'"):
        swiglu.forward_numpy(x, x, kernel="fast")
    with pytest.raises(TypeError, match="a: expected dtype float32, float16 or bfloat16, got int32"):
        swiglu.forward_numpy(x.astype(np.int32), x.astype(np.int32))
    with pytest.raises(TypeError, match=r"b: expected dtype float32 \(the dtype of a\), got float16"):
        swiglu.forward_numpy(x, x.astype(np.float16))
    with pytest.raises(ValueError, match=r"b: expected shape \(3, 5\) \(the shape of a\), got \(5, 3\)"):
        swiglu.forward_numpy(x, x.T.copy())
    with pytest.raises(ValueError, match=r"dy: expected shape \(5, 3\) \(the output's\), got \(3, 5\)"):
        swiglu.backward_numpy(x, x.T.copy(), x.T.copy())
    with pytest.raises(TypeError, match="a: expected a NumPy array, got list"):
        swiglu.forward_numpy([1.0], x)


# ---------------------------------------------------------------------------------------------------------------
# GPU: both kernels x every dtype and edge shape against the float64 reference
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["vec16", "scalar", "auto"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_backward(rng, to_device, poisoned, kernel, dtype, shape):
    a, b, dy = (random_array(rng, shape, dtype, scale=3.0) for _ in range(3))
    if kernel == "vec16" and not fits_vec16(shape, dtype):
        with pytest.raises(ValueError, match="kernel: 'vec16' cannot run this problem: element count"):
            swiglu.forward(to_device(a), to_device(b), kernel=kernel)
        return
    out = poisoned(shape, dtype)
    assert swiglu.forward(to_device(a), to_device(b), kernel=kernel, out=out) is out
    assert_close(out.numpy(), swiglu.reference(a, b), dtype)
    outs = (poisoned(shape, dtype), poisoned(shape, dtype))
    grads = swiglu.backward(to_device(dy), to_device(a), to_device(b), kernel=kernel, out=outs)
    assert all(g is o for g, o in zip(grads, outs))
    for name, grad, expected in zip(("da", "db"), grads, swiglu.reference_backward(dy, a, b)):
        assert_close(grad.numpy(), expected, dtype, what=name)


@pytest.mark.gpu
def test_host_faces(rng):
    a, b, dy = (random_array(rng, (5, 24), "float16") for _ in range(3))
    assert_close(swiglu.forward_numpy(a, b), swiglu.reference(a, b), "float16")
    for grad, expected in zip(swiglu.backward_numpy(dy, a, b), swiglu.reference_backward(dy, a, b)):
        assert_close(grad, expected, "float16")


@pytest.mark.gpu
def test_misaligned_views_use_the_scalar_kernel():
    torch = pytest.importorskip("torch")
    a = torch.randn(1025, device="cuda", dtype=torch.float16)[1:]  # 2 bytes past a 16-byte boundary
    b = torch.randn(1024, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="kernel: 'vec16' cannot run this problem: an array is not 16-byte aligned"):
        swiglu.forward(a, b, kernel="vec16")
    y = swiglu.forward(a, b)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float16
    assert_close(y.cpu().numpy(), swiglu.reference(a.cpu().numpy(), b.cpu().numpy()), "float16")


@pytest.mark.gpu
def test_autotuned_plan_explains_its_choice(rng, tmp_path, monkeypatch):
    monkeypatch.setenv("GE2_CACHE_DIR", str(tmp_path))
    g = Graph("swiglu_plan")
    g.output(g.swiglu(g.input("a", (4096, 1024), "float16"), g.input("b", (4096, 1024), "float16")), "y")
    g.output(g.swiglu(g.input("c", (33, 1001), "float16"), g.input("d", (33, 1001), "float16")), "y_odd")
    feeds = {name: random_array(rng, g.inputs[i].type.shape, "float16") for i, name in enumerate("abcd")}
    executor = ge2.ExecutorV2(g, device="cuda", autotune=True)
    result = executor.run(feeds)
    assert_close(result["y"], swiglu.reference(feeds["a"], feeds["b"]), "float16")
    assert_close(result["y_odd"], swiglu.reference(feeds["c"], feeds["d"]), "float16")
    text = executor.explain()
    assert "[external: ge2_swiglu]: autotuned: " in text and "vec16 " in text and "scalar " in text, text
    assert "not viable: vec16 [external: ge2_swiglu]: element count 33033 is not a multiple of 8" in text, text


@pytest.mark.gpu
def test_gradients_through_the_kernels(rng):
    """The backward graph of the MLP on the GPU: swiglu_backward runs one of the example's kernels (the Trainer's
    device optimizer is another op's; the CPU test above trains)."""
    g, w = mlp_with_swiglu(rng, batch=64, width=32, hidden=64)
    x, target = random_array(rng, (64, 32), "float32"), random_array(rng, (64, 32), "float32")
    executor = ge2.ExecutorV2(autograd.backward_graph(g, "loss"), device="cuda")
    result = executor.run({"x": x, "target": target})
    gate, up = x @ w["w_gate"], x @ w["w_up"]
    h = swiglu.reference(gate, up)
    d_out = 2 * (h @ w["w_down"] - target) / target.size
    d_gate, d_up = swiglu.reference_backward(d_out @ w["w_down"].T, gate, up)
    for name, grad in {"w_down": h.T @ d_out, "w_gate": x.T @ d_gate, "w_up": x.T @ d_up}.items():
        assert_close(result[autograd.grad_name(name)], grad, "tf32", 64, what=f"gradient of {name}")
    text = executor.explain()  # the plan times vec16 against scalar, so either may run
    assert re.search(r"swiglu_backward -> (vec16|scalar) \[external: ge2_swiglu\]", text), text
