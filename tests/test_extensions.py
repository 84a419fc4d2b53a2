"""Ops and kernel candidates registered from outside GE2 (``ops.register``, ``ops.add_candidate``): origin stamping,
ranking, autotuning and fallbacks over external candidates, their marks in explanations, argument errors; on the
GPU a user's own gemm candidate chosen by ExecutorV2 next to one rejected, as ``explain()`` shows."""
from __future__ import annotations

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import selection
from graph_executor_v2.ir import Graph
from graph_executor_v2.ops import OPS, Candidate, Input, OpDef, Problem, add_candidate, register, remove_candidate
from graph_executor_v2.runtime import Preferences, choose_kernel
from graph_executor_v2.runtime.autotune import AutotuneCache
from graph_executor_v2.runtime.registry import kernel_label
from test_registry import FAKE_GPU, candidate


def fake_opdef(name, *candidates):
    return OpDef(name, (Input("x"),), ("y",), (), lambda types, attrs: [types[0]],
                 lambda inputs, attrs: [inputs[0]], candidates=tuple(candidates))


@pytest.fixture
def fake_op(monkeypatch):
    """GE2's own op 'fake' (y = x) with the given candidates; returns (node, problem)."""

    def install(*candidates):
        monkeypatch.setitem(OPS, "fake", fake_opdef("fake", *candidates))
        g = Graph("g")
        y = g.fake(g.input("x", (64, 64), "float16"))
        return y.producer, Problem("fake", (g.inputs[0].type,), (y.type,), {}, (9, 0))

    return install


def run_as_package(package, source, **names):
    """Runs ``source`` as code of module ``<package>.plugin``, as a user's package would call GE2."""
    namespace = {"__name__": f"{package}.plugin", **names}
    exec(compile(source, f"<{package}.plugin>", "exec"), namespace)
    return namespace


# --- origin -------------------------------------------------------------------------------------------------------
def test_register_from_another_package_marks_its_candidates_external(monkeypatch):
    monkeypatch.delitem(OPS, "plugin_op", raising=False)
    namespace = run_as_package("my_plugin", "OP = register(opdef)", register=register,
                               opdef=fake_opdef("plugin_op", candidate("plugin_fast", 10)))
    try:
        assert OPS["plugin_op"] is namespace["OP"]
        assert [c.origin for c in OPS["plugin_op"].candidates] == ["my_plugin"]
        assert kernel_label("plugin_op", "plugin_fast") == "plugin_fast [external: my_plugin]"
    finally:
        del OPS["plugin_op"]


def test_ge2s_own_candidates_are_not_external():
    own = [opdef for opdef in OPS.values() if opdef.infer.__module__.startswith("graph_executor_v2.")]
    assert len(own) > 10 and all(c.origin == "" for opdef in own for c in opdef.candidates)
    assert kernel_label("gemm", "cublaslt_epilogue") == "cublaslt_epilogue"
    assert kernel_label("gemm", "host_reference") == "host_reference"


def test_add_candidate_stamps_the_calling_package(fake_op):
    fake_op(candidate("own", 10))
    namespace = run_as_package("my_gemm_variants", "added = add_candidate('fake', new)", add_candidate=add_candidate,
                               new=candidate("mine", 20))
    assert namespace["added"].origin == "my_gemm_variants"
    assert [c.name for c in OPS["fake"].candidates] == ["own", "mine"]
    assert add_candidate("fake", candidate("named", 5), origin="explicit").origin == "explicit"


# --- the registry treats them like its own ----------------------------------------------------------------------
def test_external_candidate_chosen_and_one_rejected_with_its_reason(fake_op):
    node, problem = fake_op(candidate("own_tiled", 10, always_works=True))
    add_candidate("fake", candidate("user_fast", 30), origin="user_kernels")
    add_candidate("fake", candidate("user_tensor_core", 40, supports=lambda p: "needs K % 128 == 0"),
                  origin="user_kernels")
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences())
    assert selection.kernel == "user_fast"
    assert selection.rejected == (("user_tensor_core", "needs K % 128 == 0"),)
    assert kernel_label("fake", selection.kernel) == "user_fast [external: user_kernels]"
    assert kernel_label("fake", "own_tiled") == "own_tiled"


def test_external_candidate_wins_autotuning(fake_op, tmp_path):
    node, problem = fake_op(candidate("own", 30))
    add_candidate("fake", candidate("user_variant", 10), origin="user_kernels")
    times = {}

    def timer(launch):
        name = "own" if not times else "user_variant"  # candidates are timed in ranking order
        times[name] = 0.5 if name == "own" else 0.2
        return times[name]

    cache = AutotuneCache(tmp_path / "autotune.jsonl")
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences(autotune=True), timer, cache)
    assert selection.kernel == "user_variant"
    assert selection.reason.startswith("autotuned: user_variant 0.2000 ms, own 0.5000 ms")


def test_external_candidate_that_fails_to_prepare_falls_back_visibly(fake_op):
    node, problem = fake_op(candidate("own", 10, always_works=True))
    add_candidate("fake", candidate("user_broken", 50, prepare_error=RuntimeError("no such algorithm")),
                  origin="user_kernels")
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences())
    assert selection.kernel == "own"
    assert selection.fallbacks == (("user_broken", "RuntimeError: no such algorithm"),)


def test_pinning_and_removing_an_external_candidate(fake_op):
    node, problem = fake_op(candidate("own", 30))
    add_candidate("fake", candidate("user_variant", 10), origin="user_kernels")
    assert choose_kernel(node, problem, FAKE_GPU, Preferences(kernels={"fake": "user_variant"})).kernel == \
        "user_variant"
    assert remove_candidate("fake", "user_variant").name == "user_variant"
    assert [c.name for c in OPS["fake"].candidates] == ["own"]


# --- argument errors ----------------------------------------------------------------------------------------------
def test_add_candidate_argument_errors(fake_op):
    fake_op(candidate("own", 10))
    with pytest.raises(ValueError, match="op: expected a registered op .*got 'no_such_op'"):
        add_candidate("no_such_op", candidate("x", 1))
    with pytest.raises(TypeError, match="candidate: expected a graph_executor_v2.ops.Candidate, got dict"):
        add_candidate("fake", {"name": "x"})
    with pytest.raises(ValueError, match="candidate: op 'fake' already has a candidate named 'own'"):
        add_candidate("fake", candidate("own", 20))
    with pytest.raises(ValueError, match="name: op 'fake' has no candidate 'missing' \\(it has own\\)"):
        remove_candidate("fake", "missing")


def test_register_twice_is_an_error(monkeypatch):
    monkeypatch.delitem(OPS, "plugin_twice", raising=False)
    register(fake_opdef("plugin_twice"), origin="p")
    try:
        with pytest.raises(ValueError, match="op 'plugin_twice' is registered twice"):
            register(fake_opdef("plugin_twice"), origin="p")
    finally:
        del OPS["plugin_twice"]


# --- GPU: a user's own gemm candidate next to cuBLASLt ----------------------------------------------------------
@pytest.mark.gpu
def test_explain_shows_an_external_gemm_candidate_chosen_and_one_rejected(rng):
    """A user's gemm variant (here GE2's tiled kernel under another name, only float32) outranks cuBLASLt; a second
    one that refuses the problem is listed with its reason; both are marked external in explain()."""
    gemm = OPS["gemm"]
    tiled = next(c for c in selection.candidates(gemm) if c.always_works)
    mine = Candidate("my_gemm", 1000, "a user's gemm", lambda p: None if p.in_types[0].dtype == "float32" else
                     "float32 only", tiled.prepare)
    picky = Candidate("my_gemm_k128", 2000, "a user's gemm for K % 128 == 0",
                      lambda p: None if p.in_types[0].shape[1] % 128 == 0 else "needs K % 128 == 0", tiled.prepare)
    add_candidate("gemm", mine, origin="user_gemms")
    add_candidate("gemm", picky, origin="user_gemms")
    try:
        g = Graph("external_gemm")
        x = g.input("x", (64, 96), "float32")
        w = g.param("w", (rng.standard_normal((96, 48)) / 10).astype(np.float32))
        g.output(g.matmul(x, w), "y")
        executor = ge2.ExecutorV2(g, device="cuda", autotune=False)  # priority 1000 wins only by priority
        x_host = rng.standard_normal((64, 96)).astype(np.float32)
        y = executor.run({"x": x_host})["y"]
        ge2.testing.assert_close(y, x_host.astype(np.float64) @ w.data.astype(np.float64), "tf32", 96)
        text = executor.explain()
        assert "-> my_gemm [external: user_gemms]" in text
        assert "not viable: my_gemm_k128 [external: user_gemms]: needs K % 128 == 0" in text
    finally:
        remove_candidate("gemm", "my_gemm")
        remove_candidate("gemm", "my_gemm_k128")
