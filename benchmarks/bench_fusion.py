"""Pointwise and reduction fusion: GE2's generated kernels vs PyTorch eager and torch.compile, one process, one GPU.

Rows (float16 unless said):
- swish_residual: ``x * sigmoid(x) + r``, 16384x4096: one fused_pointwise kernel.
- layernorm_gelu_residual: LayerNorm -> exact GELU -> residual add, 16384x4096: one fused_row node, whose plan
  times the generated persistent-row kernel (reads x, r, gamma, beta, writes y once) against the hand-written
  layernorm kernel followed by a generated GELU + add kernel, and keeps the faster (``ge2_kernel`` column).
- gpt2_mlp_forward / gpt2_mlp_backward: the GPT-2 MLP's pointwise part, 16 x 1024 tokens x 3072: ``gelu(x + b)``
  (tanh form) and its backward ``gelu'(x + b) * dy``.
- nhwc_chain: 6 ops over NHWC 64x56x56x256 with a per-channel scale and bias: ``tanh(relu(x * s + b + r) * 0.5)``
  (the 0.5 folded into the source).
- mse_rows: ``mean((x - y)^2)`` per row of 16384x4096: one fused_reduction kernel (prologue in registers).
- train_gpt / train_resnet18 / train_resnet50 (float32 ResNets at GE2's default precision, bf16-AMP GPT,
  bench_train.py's configurations): step time and kernels per step with the fusion pass off (``GE2_NO_FUSION=1``)
  and on.

Every row is checked first against the same math in float64 (the torch function on float64 copies of the inputs)
with GE2's float16 tolerance (``ge2.testing.assert_close``): PyTorch eager float16 is no reference, it rounds
between its ops (LayerNorm's output before the GELU). A row that fails its check is printed, says so in the table's
``check`` column, and the bench goes on to the next row. GE2 runs its plan's CUDA graph on inputs already in the
plan's slots (``Plan.replay``), PyTorch eager and ``torch.compile`` (default mode) on the same values. GB/s counts
each input read once and each output written once, against the device copy bandwidth measured here (a 1 GiB
``copy_``); targets: >= 90% of copy bandwidth on the pointwise chains and >= 1.0x torch.compile. Cold compile (an
empty kernel cache) and cache-hit times are per plan, summed over its generated kernels.
Timing: CUDA-event medians with the L2 flushed between repetitions (benchmarks/harness.py).

Run: python benchmarks/bench_fusion.py [--rows swish_residual,...] (about 90 s on an H200; the tables are
rewritten after each row, so a run stopped by a time limit keeps what it measured)
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
from harness import median_ms, torch_cuda, write_results

import graph_executor_v2 as ge2
from graph_executor_v2.codegen import compiler
from graph_executor_v2.runtime.executor import ALIAS
from graph_executor_v2.testing import assert_close

ROWS = ("swish_residual", "layernorm_gelu_residual", "gpt2_mlp_forward", "gpt2_mlp_backward", "nhwc_chain",
        "mse_rows", "train_gpt", "train_resnet18", "train_resnet50")


def copy_bandwidth(torch) -> float:
    """Bytes per second of a 1 GiB device copy (read + write)."""
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    ms = median_ms(lambda: target.copy_(source), reps=20)
    return 2 * source.numel() / (ms * 1e-3)


# Each case builds its GE2 graph and returns the torch function of the inputs in graph order; the function computes
# in its inputs' dtype (float64 copies give the reference).
def swish_residual(torch, g):
    x, r = g.input("x", (16384, 4096), "float16"), g.input("r", (16384, 4096), "float16")
    g.output(g.add(g.mul(x, g.sigmoid(x)), r), "y")
    return lambda x, r: x * torch.sigmoid(x) + r


def layernorm_gelu_residual(torch, g, rng):
    shape = (16384, 4096)
    x, r = g.input("x", shape, "float16"), g.input("r", shape, "float16")
    weight, bias = (rng.standard_normal(4096).astype(np.float16) for _ in range(2))
    y = g.layernorm(x, g.param("gamma", weight), g.param("beta", bias))
    g.output(g.add(g.gelu_erf(y), r), "y")
    w, b = torch.tensor(weight, device="cuda"), torch.tensor(bias, device="cuda")
    F = torch.nn.functional
    return lambda x, r: F.gelu(F.layer_norm(x, (4096,), w.to(x.dtype), b.to(x.dtype))) + r


def gpt2_mlp_forward(torch, g):
    x = g.input("x", (16384, 3072), "float16")
    g.output(g.gelu(g.bias_add(x, g.input("b", (3072,), "float16"))), "y")
    F = torch.nn.functional
    return lambda x, b: F.gelu(x + b, approximate="tanh")


def gpt2_mlp_backward(torch, g):
    dy, x = g.input("dy", (16384, 3072), "float16"), g.input("x", (16384, 3072), "float16")
    b = g.input("b", (3072,), "float16")
    g.output(g.gelu_backward(dy, g.bias_add(x, b)), "dx")
    return lambda dy, x, b: torch.ops.aten.gelu_backward(dy, x + b, approximate="tanh")


def nhwc_chain(torch, g):
    shape = (64, 56, 56, 256)
    x, r = g.input("x", shape, "float16"), g.input("r", shape, "float16")
    s, b = g.input("s", (256,), "float16"), g.input("b", (256,), "float16")
    half = g.param("half", np.array(0.5, np.float16))
    g.output(g.tanh(g.mul(g.relu(g.add(g.add(g.mul(x, s), b), r)), half)), "y")
    return lambda x, r, s, b: torch.tanh(torch.relu(x * s + b + r) * 0.5)


def mse_rows(torch, g):
    x, y = g.input("x", (16384, 4096), "float16"), g.input("y", (16384, 4096), "float16")
    d = g.sub(x, y)
    g.output(g.mean(g.mul(d, d), axis=-1), "loss")
    return lambda x, y: torch.mean((x - y) ** 2, dim=-1)


def bench_pointwise(torch, name, rng, bandwidth) -> dict:
    g = ge2.ir.Graph(name)
    make = globals()[name]
    needs_rng = "rng" in make.__code__.co_varnames[:make.__code__.co_argcount]
    torch_fn = make(torch, g, rng) if needs_rng else make(torch, g)
    host = {v.name: (rng.standard_normal(v.type.shape) * 0.5).astype(v.type.dtype) for v in g.inputs}
    inputs = [torch.tensor(host[v.name], device="cuda") for v in g.inputs]

    compiler.STATS.clear()
    with tempfile.TemporaryDirectory() as cold_cache:  # an empty kernel cache: every kernel compiles
        previous = os.environ.get("GE2_CACHE_DIR")
        os.environ["GE2_CACHE_DIR"] = cold_cache
        try:
            ge2.ExecutorV2(g, "cuda")
            cold = [r for r in compiler.STATS.records if not r.cache_hit]
            compiler.STATS.clear()
            ex = ge2.ExecutorV2(g, "cuda")  # the same kernels, from the cache
            hits = [r for r in compiler.STATS.records if r.cache_hit]
        finally:
            if previous is None:
                del os.environ["GE2_CACHE_DIR"]
            else:
                os.environ["GE2_CACHE_DIR"] = previous
    plan = ex.plan()
    feeds = dict(zip((v.name for v in g.inputs), inputs))
    result = ex.run(feeds)  # warm-up and capture; checked against the float64 reference
    expected = torch_fn(*inputs)
    reference = torch_fn(*(t.double() for t in inputs)).cpu().numpy()
    (output_name,) = result
    dtype = g.outputs[output_name].type.dtype
    length = g.inputs[0].type.shape[-1] if name == "mse_rows" else 1
    compiled = torch.compile(torch_fn)
    failures = []
    for what, got in (("GE2", result[output_name]), ("torch.compile", compiled(*inputs))):
        try:
            assert_close(got.float().cpu().numpy(), reference, dtype, length, what=f"{name}: {what} vs float64")
        except AssertionError as error:
            print(f"CHECK FAILED: {error}", flush=True)
            failures.append(what)

    ge2_ms = median_ms(plan.replay)
    eager_ms = median_ms(lambda: torch_fn(*inputs))
    compile_ms = median_ms(lambda: compiled(*inputs))
    moved = sum(t.numel() * t.element_size() for t in inputs) + expected.numel() * expected.element_size()
    ge2_rate = moved / (ge2_ms * 1e-3)
    kernels = [s for s in plan.selections if s.kernel != ALIAS]
    return {
        "row": name, "ge2_ms": ge2_ms, "torch_eager_ms": eager_ms, "torch_compile_ms": compile_ms,
        "vs_compile": compile_ms / ge2_ms, "ge2_gbps": ge2_rate / 1e9, "copy_fraction": ge2_rate / bandwidth,
        "ge2_kernels": len(kernels), "generated": sum(s.kernel == "generated" for s in kernels),
        "cold_compile_ms": sum(r.seconds for r in cold) * 1e3, "cache_hit_ms": sum(r.seconds for r in hits) * 1e3,
        "ge2_kernel": ", ".join(dict.fromkeys(s.kernel for s in kernels)),
        "target": ">= 0.9 copy, >= 1.0x compile",
        "check": f"FAILED: {', '.join(failures)}" if failures else "ok",
    }


def bench_training(torch, name, rng) -> dict:
    """A bench_train.py step with the fusion pass off and on: step time and kernels per step."""
    import bench_train

    case = next(c for c in bench_train.CASES if c["case"] == name.removeprefix("train_"))
    row = {"row": name}
    for label, switch in (("unfused", "1"), ("fused", "0")):
        os.environ["GE2_NO_FUSION"] = switch
        try:
            trainer, feeds = _trainer(torch, bench_train, case, rng)
            for _ in range(3):
                float(trainer.step(feeds))
            row[f"{label}_ms"] = median_ms(lambda: trainer.step(feeds), warmup=3, reps=10, flush_l2=False)
            plan = trainer._executor.plans[0]
            row[f"{label}_kernels"] = sum(s.kernel != ALIAS for s in plan.selections)
            if label == "fused":
                row["generated"] = sum(s.kernel == "generated" for s in plan.selections)
                chosen = [s.kernel for s in plan.selections if s.op == "fused_row"]  # generated or hand-written
                row["fused_rows"] = ", ".join(f"{kernel} x{chosen.count(kernel)}" for kernel in dict.fromkeys(chosen))
        finally:
            del os.environ["GE2_NO_FUSION"]
    row["speedup"] = row["unfused_ms"] / row["fused_ms"]
    row["target"] = "report"
    return row


def _trainer(torch, bench_train, case, rng):
    if case["case"] == "gpt":
        from graph_executor_v2 import nn
        from graph_executor_v2.models.gpt import GPT

        config, batch = case["gpt"], case["batch"]
        nn.manual_seed(0)
        model = GPT(config)
        ids, targets = (torch.tensor(rng.integers(0, config.vocab, (batch, config.context)), device="cuda")
                        for _ in range(2))
        trainer = ge2.train.Trainer(model.loss_graph(batch), device="cuda",
                                    optimizer=ge2.train.AdamW(lr=1e-3, weight_decay=0.01), amp=case["amp"])
        return trainer, {"ids": ids, "targets": targets}
    batch, image = case["batch"], case["image"]
    build = bench_train.RESNETS[case["model"]][0]
    graph = build().train().graph({"x": ((batch, 3, image, image), "float32"), "labels": ((batch,), "int64")})
    trainer = ge2.train.Trainer(graph, device="cuda", optimizer=ge2.train.SGD(lr=0.05, momentum=0.9))
    x = torch.randn(batch, 3, image, image, device="cuda")
    return trainer, {"x": x, "labels": torch.randint(0, 1000, (batch,), device="cuda")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows to run (default: all)")
    chosen = parser.parse_args().rows.split(",")
    unknown = sorted(set(chosen) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown row(s) {unknown}; expected among {list(ROWS)}")
    torch = torch_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(0)
    bandwidth = copy_bandwidth(torch)
    pointwise_columns = [
        ("row", "row"), ("ge2_ms", "GE2 ms"), ("torch_eager_ms", "torch eager ms"),
        ("torch_compile_ms", "torch.compile ms"), ("vs_compile", "speedup vs compile"), ("ge2_gbps", "GE2 GB/s"),
        ("copy_fraction", "of copy bandwidth"), ("ge2_kernels", "GE2 kernels"), ("generated", "generated"),
        ("ge2_kernel", "GE2 kernel(s)"), ("cold_compile_ms", "cold compile ms"), ("cache_hit_ms", "cache hit ms"), ("target", "target"),
        ("check", "check vs float64")]
    training_columns = [
        ("row", "row"), ("unfused_ms", "step ms, no fusion"), ("fused_ms", "step ms, fused"), ("speedup", "speedup"),
        ("unfused_kernels", "kernels/step before"), ("fused_kernels", "kernels/step after"),
        ("generated", "generated"), ("fused_rows", "fused_row kernels"), ("target", "target")]
    pointwise, training = [], []
    # The tables are rewritten after every row: a time limit that stops the run keeps the rows measured so far.
    for name in (n for n in ROWS if n in chosen):
        if name.startswith("train_"):
            training.append(bench_training(torch, name, rng))
            table = write_results("fusion_training", training, training_columns, "Fusion in training steps")
        else:
            pointwise.append(bench_pointwise(torch, name, rng, bandwidth))
            table = write_results("fusion", pointwise, pointwise_columns,
                                  f"Fusion: generated kernels vs PyTorch (copy {bandwidth / 1e9:.0f} GB/s)")
        print(table, flush=True)


if __name__ == "__main__":
    main()
