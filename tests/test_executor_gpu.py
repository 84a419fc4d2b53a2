"""ExecutorV2 on the GPU: MLPs against float64 NumPy, fused vs unfused plans, the fallbacks (forced by
GE2_FORCE_NO_EPILOGUE, by a candidate that cannot prepare, by an op with no GPU kernel), device arrays in and out,
no device allocation in the steady state, autotuning by default and across processes."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.ops._base import OPS, Candidate
from graph_executor_v2.runtime.autotune import AutotuneCache
from graph_executor_v2.testing import assert_close, mlp, random_array

pytestmark = pytest.mark.gpu

SIZES = (128, 256, 256, 11)
# gemm's GPU kernels: any of them may win the plan's timing (cutlass_sm90 where it is built)
GPU_GEMM_KERNELS = ("cublaslt_epilogue", "cublaslt_postkernel", "cutlass_sm90", "tiled")


def check_mlp(executor, reference, rng, batch, dtype, **run_options):
    x = random_array(rng, (batch, SIZES[0]), dtype)
    y = executor.run({"x": x}, **run_options)["y"]
    assert_close(y, reference(x), dtype, max(SIZES), what=f"{executor.device} MLP ({dtype})")
    return x, y


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_mlp_on_cuda_matches_float64_numpy(rng, dtype, activation):
    g, reference = mlp(rng, SIZES, dtype, activation, residual=True)
    ex = ge2.ExecutorV2(g, device="cuda", verify=True)
    assert [n.op for n in ex.optimized_graph.nodes] == ["gemm"] * 3
    for batch in (64, 1, 257):
        check_mlp(ex, reference, rng, batch, dtype)
    assert ex.fallbacks == [], ex.explain()
    kernels = {s.kernel for plan in ex.plans for s in plan.selections}
    assert kernels <= set(GPU_GEMM_KERNELS), ex.explain()


def test_fused_and_unfused_plans_agree_on_cuda(rng):
    g, reference = mlp(rng, SIZES, "float16", "gelu", batch=64, residual=True)
    fused = ge2.ExecutorV2(g, device="cuda")
    unfused = ge2.ExecutorV2(g, device="cuda", passes=[])
    assert len(fused.optimized_graph.nodes) < len(unfused.optimized_graph.nodes)
    x, fused_y = check_mlp(fused, reference, rng, 64, "float16")
    unfused_y = unfused.run({"x": x})["y"]
    assert_close(unfused_y, reference(x), "float16", max(SIZES))
    assert_close(fused_y, unfused_y.astype(np.float64), "float16", max(SIZES))


def test_force_no_epilogue_skips_the_cublaslt_epilogue(rng, monkeypatch):
    monkeypatch.setenv("GE2_FORCE_NO_EPILOGUE", "1")
    g, reference = mlp(rng, SIZES, "float16", "relu", batch=64)
    ex = ge2.ExecutorV2(g, device="cuda")
    check_mlp(ex, reference, rng, 64, "float16")
    selections = ex.plans[0].selections
    assert all(s.kernel != "cublaslt_epilogue" for s in selections)
    assert all(("cublaslt_epilogue", "excluded by GE2_FORCE_NO_EPILOGUE=1") in s.rejected for s in selections)
    assert "not viable: cublaslt_epilogue: excluded by GE2_FORCE_NO_EPILOGUE=1" in ex.explain()


def test_a_candidate_that_fails_to_prepare_falls_to_the_next(rng, monkeypatch):
    def refuse(problem):
        raise RuntimeError("forced failure: no algorithm")

    failing = Candidate("always_fails", 1000, "fails on purpose", lambda problem: None, refuse)
    monkeypatch.setitem(OPS, "gemm", replace(OPS["gemm"], candidates=(failing,) + OPS["gemm"].candidates))
    g, reference = mlp(rng, SIZES, "float32", "silu", batch=32)
    # the priority order tries the failing candidate first (measured choice may find a cached winner and never try it)
    ex = ge2.ExecutorV2(g, device="cuda", autotune=False)
    check_mlp(ex, reference, rng, 32, "float32")
    for selection in ex.plans[0].selections:
        assert selection.fallbacks == (("always_fails", "RuntimeError: forced failure: no algorithm"),)
        assert selection.kernel in GPU_GEMM_KERNELS
    text = ex.explain()
    assert "fallback: always_fails failed to prepare: RuntimeError: forced failure" in text
    assert "fallbacks: 3" in text


def test_an_op_with_no_gpu_kernel_runs_through_the_host(rng, monkeypatch):
    monkeypatch.setitem(OPS, "silu", replace(OPS["silu"], candidates=()))
    g, reference = mlp(rng, SIZES, "float32", "silu", batch=16)
    ex = ge2.ExecutorV2(g, device="cuda", passes=[])
    check_mlp(ex, reference, rng, 16, "float32")
    silu = [s for s in ex.plans[0].selections if s.op == "silu"]
    assert [s.kernel for s in silu] == ["host_reference"] * 2
    assert all(s in ex.fallbacks for s in silu)
    assert "silu_0 (silu) runs host_reference" in ex.explain()


def test_device_arrays_in_device_arrays_out(rng):
    runtime = ge2.device.runtime()
    g, reference = mlp(rng, SIZES, "float16", "relu", batch=32)
    ex = ge2.ExecutorV2(g, device="cuda")
    x = random_array(rng, (32, SIZES[0]), "float16")
    y = ex.run({"x": runtime.DeviceArray.from_numpy(x)})["y"]
    assert isinstance(y, runtime.DeviceArray) and y.shape == (32, SIZES[-1])
    assert_close(y.numpy(), reference(x), "float16", max(SIZES))
    out = runtime.DeviceArray.empty([32, SIZES[-1]], "float16")
    out.poison()
    result = ex.run({"x": runtime.DeviceArray.from_numpy(x)}, out={"y": out})
    assert result["y"] is out
    assert_close(out.numpy(), reference(x), "float16", max(SIZES))
    with pytest.raises(ValueError, match=r"out\['y'\]: expected shape \(32, 11\), got \(32, 12\)"):
        ex.run({"x": x}, out={"y": runtime.DeviceArray.empty([32, 12], "float16")})


def test_torch_tensors_in_torch_tensors_out(rng):
    torch = pytest.importorskip("torch")
    g, reference = mlp(rng, SIZES, "float32", "gelu", batch=8)
    ex = ge2.ExecutorV2(g, device="cuda")
    x = random_array(rng, (8, SIZES[0]), "float32")
    y = ex.run({"x": torch.from_numpy(x).cuda()})["y"]
    assert isinstance(y, torch.Tensor) and y.is_cuda
    assert_close(y.cpu().numpy(), reference(x), "float32", max(SIZES))


@pytest.mark.exclusive_gpu
def test_no_device_allocation_in_the_steady_state(rng):
    runtime = ge2.device.runtime()
    g, reference = mlp(rng, SIZES, "float16", "gelu", batch=64, residual=True)
    ex = ge2.ExecutorV2(g, device="cuda")
    feeds = {"x": runtime.DeviceArray.from_numpy(random_array(rng, (64, SIZES[0]), "float16"))}
    out = {"y": runtime.DeviceArray.empty([64, SIZES[-1]], "float16")}
    for _ in range(3):  # warm-up: library handles and workspaces are created on first use
        ex.run(feeds, out=out)
    runtime.synchronize()
    free_before, _ = runtime.memory_info()
    for _ in range(50):
        ex.run(feeds, out=out)
    runtime.synchronize()
    assert runtime.memory_info()[0] == free_before
    assert len(ex.plans) == 1


def test_symbolic_batch_on_cuda(rng):
    g, reference = mlp(rng, SIZES, "float32", "relu")
    ex = ge2.ExecutorV2(g, device="cuda")
    for batch in (5, 64, 5):
        check_mlp(ex, reference, rng, batch, "float32")
    assert len(ex.plans) == 2


AUTOTUNE_SCRIPT = """
import numpy as np, graph_executor_v2 as ge2
g = ge2.ir.Graph("tuned")
x = g.input("x", (512, 256), "float16")
w = g.param("w", np.full((256, 384), 0.01, np.float16))
g.output(g.relu(g.matmul(x, w)), "y")
ex = ge2.ExecutorV2(g, device="cuda", autotune=True)
print(ex.plans[0].selections[0].reason)
"""


def test_autotune_persists_across_processes(tmp_path):
    environment = {**os.environ, "GE2_CACHE_DIR": str(tmp_path),
                   "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "python")}
    run = lambda: subprocess.run([sys.executable, "-c", AUTOTUNE_SCRIPT], env=environment, capture_output=True,  # noqa
                                 text=True, check=True).stdout.strip()
    first = run()
    assert first.startswith("autotuned: "), first
    assert (tmp_path / "autotune.jsonl").exists()
    second = run()
    assert second.startswith("autotune cache: "), second
    (tmp_path / "autotune.jsonl").write_text("corrupt {")
    assert run().startswith("autotuned: ")  # a corrupt cache is ignored and rewritten, never a crash


def test_plans_choose_by_measurement_by_default(rng, tmp_path, monkeypatch):
    """Every GEMM (several viable kernels each: aligned float16) is timed once per problem at plan build and
    explain() shows the times; autotune=False keeps the priority order and times nothing."""
    monkeypatch.setenv("GE2_CACHE_DIR", str(tmp_path))
    sizes = (128, 256, 256, 64)
    g, reference = mlp(rng, sizes, "float16", "relu", batch=64)
    measured = ge2.ExecutorV2(g, device="cuda")
    x = random_array(rng, (64, sizes[0]), "float16")
    assert_close(measured.run({"x": x})["y"], reference(x), "float16", max(sizes), what="measured")
    text = measured.explain()
    print(text)
    reasons = [s.reason for s in measured.plans[0].selections]
    assert all(reason.startswith("autotuned: ") for reason in reasons), text  # three GEMMs, three problems
    assert all(reason.count(" ms") >= 2 for reason in reasons), text  # at least two candidates timed each
    assert "autotune: 3 problem(s) timed in " in text
    plan = measured.plans[0]
    assert plan.timed_problems == 3 and plan.build_seconds >= plan.tuning_seconds > 0
    assert plan.cuda_graph is not None and plan.capture_seconds > 0
    entries = AutotuneCache().entries()  # the journal: one line per timed problem, with what its timing took
    assert len(entries) == 3 and all(entry["problem"].startswith("gemm(") for entry in entries), entries
    assert 0 < sum(entry["seconds"] for entry in entries) <= plan.tuning_seconds * 1.01 + 1e-3, entries
    by_priority = ge2.ExecutorV2(g, device="cuda", autotune=False)
    assert_close(by_priority.run({"x": x})["y"], reference(x), "float16", max(sizes), what="by priority")
    assert all(s.reason.startswith("highest priority of ") for s in by_priority.plans[0].selections), \
        by_priority.explain()
    assert by_priority.plans[0].tuning_seconds == 0


def test_a_plan_compiles_the_generated_kernels_it_times_ahead_in_parallel(rng, tmp_path, monkeypatch):
    """Two unfused pointwise nodes, each with a generated candidate timed against the hand-written ones: both
    kernels compile in the plan's parallel precompile (before any node is prepared), and the nodes' prepares then
    find them in the kernel cache."""
    from graph_executor_v2.codegen import compiler

    monkeypatch.setenv("GE2_CACHE_DIR", str(tmp_path))
    g = ge2.ir.Graph("two_pointwise")
    x = g.input("x", (64, 1000), "float16")
    g.output(g.gelu(x), "g")
    g.output(g.silu(x), "s")
    compiler.STATS.clear()
    executor = ge2.ExecutorV2(g, device="cuda", passes=[])
    plan = executor.plans[0]
    cold = [record for record in compiler.STATS.records if not record.cache_hit]
    assert len(cold) == 2 and all(record.group == record.kernel for record in cold), cold  # precompile's records
    assert plan.compile_seconds >= max(record.seconds for record in cold)
    assert all(" generated " in s.reason for s in plan.selections), executor.explain()  # timed with the others
    x_host = random_array(rng, (64, 1000), "float16")
    outputs = executor.run({"x": x_host})
    for name, op in (("g", "gelu"), ("s", "silu")):  # the ops' float64 references
        assert_close(outputs[name], OPS[op].reference([x_host.astype(np.float64)], {})[0], "float16", what=op)
