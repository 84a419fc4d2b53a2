"""GPT-2 124M training step (batch 8 x 1024), GE2 FP8 vs GE2 bfloat16, in one process, CUDA-graph replay (the
bench_train gpt2_fp8 row without torch.compile): for a quick before/after of an FP8 step change.

Run: python benchmarks/fp8_step_times.py [--layers 12] [--reps 30] [--streams 1,2] [--unbatched] [--unfused-adds]
[--profile] [--kernels] [--weights-only]
--streams times both steps at each count of streams (``Trainer(streams=)``: with 2 the weight-gradient GEMMs run
beside the next layer's backward); --kernels prints the first FP8 step's kernels as soon as it is timed
(torch.profiler over CUDA-graph replays: device time a step per kernel, and per group: GEMMs, quantizes, attention,
...); --unbatched also times the FP8 step with its weights' quantizes one node each (train_rewrite without
_batch_weight_quantizes: the step before quantize_fp8_transpose_multi); --profile prints the FP8 plan's per-op table
(``ExecutorV2.profile``, node by node); --unfused-adds also times the FP8 step without ``fuse_gradient_adds`` (the
residual-stream gradients added and cast by a generated kernel, then quantized); --weights-only times just the
quantizes of the FP8 step's 47 weights (GPT-2 124M's shapes, bfloat16 to E4M3), one quantize_fp8_transpose node each
against one quantize_fp8_transpose_multi, as CUDA graphs."""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import median_ms, torch_cuda  # noqa: E402

import graph_executor_v2 as ge2  # noqa: E402
from graph_executor_v2 import nn  # noqa: E402
from graph_executor_v2.models.gpt import GPT, GPTConfig  # noqa: E402
from graph_executor_v2.passes import fp8  # noqa: E402


def weight_quantizes(layers: int) -> None:
    """The FP8 step's weight quantizes alone: a plan of one quantize_fp8_transpose per weight against one of
    quantize_fp8_transpose_multi, CUDA-graph replay (``ExecutorV2.profile``)."""
    import ml_dtypes
    rng = np.random.default_rng(0)
    shapes = [shape for layer in range(layers) for shape in ((2304, 768), (768, 768), (3072, 768), (768, 3072))][1:]
    weights = [(rng.standard_normal(shape) * 0.02).astype(ml_dtypes.bfloat16) for shape in shapes]
    moved = sum(w.size * 4 for w in weights)  # 2 bytes read, 1 + 1 written an element
    upload = ge2.device.runtime().DeviceArray.from_numpy
    feeds = {**{f"w{i}": upload(w) for i, w in enumerate(weights)},
             **{f"s{i}": upload(np.array(64.0, np.float32)) for i in range(len(weights))}}
    for label in ("one node a weight", "multi"):
        g = ge2.ir.Graph(label.replace(" ", "_"))
        # graph inputs, not parameters: a plan may fold what it computes from constants alone
        pairs = [(g.input(f"w{i}", w.shape, "bfloat16"), g.input(f"s{i}", (), "float32"))
                 for i, w in enumerate(weights)]
        if label == "multi":
            outputs = g.quantize_fp8_transpose_multi(*[v for pair in pairs for v in pair])
        else:
            outputs = [v for w, s in pairs for v in g.quantize_fp8_transpose(w, s)[:3]]
        for index, value in enumerate(outputs):
            g.output(value, f"o{index}")
        profile = ge2.ExecutorV2(g, device="cuda").profile(feeds, runs=10)
        graph_ms = profile.cuda_graph_ms
        print(f"{len(weights)} weight quantizes, {label}: {graph_ms} ms as a CUDA graph "
              f"({moved / (graph_ms * 1e-3) / 1e12 if graph_ms else float('nan'):.2f} TB/s), "
              f"{profile.node_by_node_ms:.4f} ms node by node", flush=True)


# Kernel groups of a GPT step, by a substring of the kernel's name (first match wins; lower case).
KERNEL_GROUPS = (("quantize (FP8 casts, transposes, amax)", ("quantize",)),
                 ("scale update", ("scale_update",)),
                 ("attention", ("flash", "attention", "fmha", "sdpa", "dot_do_o", "convert_dq")),
                 ("cross entropy", ("cross_entropy", "softmax")),
                 ("optimizer", ("adam", "optim", "multi_tensor")),
                 ("GEMMs (cuBLASLt / CUTLASS)", ("gemm", "xmma", "cutlass", "nvjet", "matmul", "splitk")),
                 ("layernorm / fused rows", ("layernorm", "row", "norm")),
                 ("pointwise / casts / copies", ("pointwise", "cast", "elementwise", "copy", "slice", "concat",
                                                 "gelu", "add", "memset", "memcpy")))


def kernel_table(torch, step, steps: int) -> None:
    """Device time a step of each kernel of ``step`` (CUDA-graph replays, torch.profiler), and per group."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = [(event.key, event.device_time_total / 1e3 / steps, event.count / steps)
            for event in prof.key_averages() if event.device_time_total > 0]
    rows.sort(key=lambda row: -row[1])
    total = sum(ms for _, ms, _ in rows)
    if not rows:
        print("kernels of one step: torch.profiler recorded no kernel (CUPTI saw none of the graph's)", flush=True)
        return
    groups: dict[str, float] = {}
    for name, ms, _ in rows:
        lowered = name.lower()
        group = next((label for label, keys in KERNEL_GROUPS if any(key in lowered for key in keys)), "other")
        groups[group] = groups.get(group, 0.0) + ms
    print(f"kernels of one step (torch.profiler, {steps} replays): {total:.3f} ms of device time a step", flush=True)
    for label, ms in sorted(groups.items(), key=lambda item: -item[1]):
        print(f"  {ms:8.3f} ms  {100 * ms / total:5.1f}%  {label}")
    print("  ms/step   calls/step  kernel")
    for name, ms, count in rows[:60]:
        print(f"  {ms:8.3f}  {count:6.1f}  {name[:150]}")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--unbatched", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--weights-only", action="store_true")
    parser.add_argument("--streams", default="1", help="comma-separated counts of streams, e.g. 1,2")
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--unfused-adds", action="store_true")
    arguments = parser.parse_args()
    if arguments.weights_only:
        weight_quantizes(arguments.layers)
        return
    torch = torch_cuda()
    config, batch = GPTConfig(vocab=50257, context=1024, layers=arguments.layers, heads=12, width=768), 8
    rng = np.random.default_rng(0)
    nn.manual_seed(1)
    model = GPT(config)
    ids, targets = (torch.tensor(rng.integers(0, config.vocab, (batch, config.context)), device="cuda")
                    for _ in range(2))
    feeds = {"ids": ids, "targets": targets}
    counts = [int(count) for count in arguments.streams.split(",")]
    tails = {streams: "" if streams == 1 else f" streams={streams}" for streams in counts}
    runs = [(f"{amp}{tails[streams]}", amp, {}, streams) for streams in counts for amp in ("fp8", "bfloat16")]
    # variants of the first FP8 step with one of the FP8 pass's rewrites off (replaced by a no-op), timed third
    if arguments.unbatched:
        runs.insert(2, ("fp8 unbatched", "fp8", {"_batch_weight_quantizes": lambda graph, names: []}, counts[0]))
    if arguments.unfused_adds:
        runs.insert(2, ("fp8 unfused adds", "fp8", {"fuse_gradient_adds": lambda graph: []}, counts[0]))
    results, trainers = {}, {}
    for label, amp, switched_off, streams in runs:
        started = time.perf_counter()
        kept = {name: getattr(fp8, name) for name in switched_off}
        for name, replacement in switched_off.items():
            setattr(fp8, name, replacement)
        try:
            trainer = ge2.train.Trainer(model.loss_graph(batch), device="cuda", amp=amp, streams=streams,
                                        optimizer=ge2.train.AdamW(lr=1e-3, weight_decay=0.01))
        finally:
            for name, function in kept.items():
                setattr(fp8, name, function)
        losses = [float(trainer.step(feeds)) for _ in range(3)]
        ms = median_ms(lambda: trainer.step(feeds), warmup=5, reps=arguments.reps, flush_l2=False)
        ops = trainer.train_graph.op_counts()
        results[label] = ms
        trainers[label] = trainer
        print(f"{label}: {ms:.3f} ms a step (losses {np.round(losses, 4)}; {ops.get('quantize_fp8_transpose', 0)} "
              f"quantize_fp8_transpose, {ops.get('quantize_fp8_add_transpose', 0)} add, "
              f"{ops.get('quantize_fp8_transpose_multi', 0)} multi; "
              f"{trainer._executor.plans[0].capture}; built and run in {time.perf_counter() - started:.1f} s)",
              flush=True)
        if arguments.kernels and len(results) == 1:  # the first FP8 step's kernels, early (time-capped calls)
            try:
                kernel_table(torch, lambda: trainer.step(feeds), steps=5)
            except Exception as error:  # noqa: BLE001 - a profiler failure must not cost the timings after it
                print(f"kernels of one step: torch.profiler failed: {type(error).__name__}: {error}", flush=True)
    for label, amp, _, streams in runs:
        if amp == "fp8":  # against bfloat16 at the same count of streams, and at the first count
            same, first_count = f"bfloat16{tails[streams]}", f"bfloat16{tails[counts[0]]}"
            print(f"{label} vs {same}: {results[same] / results[label]:.3f}x; vs {first_count}: "
                  f"{results[first_count] / results[label]:.3f}x", flush=True)
    first = f"fp8{tails[counts[0]]}"
    if arguments.profile:
        profile = trainers[first]._executor.profile(feeds, runs=5)
        print(profile.op_table(), flush=True)
        print(f"plan: {profile.node_by_node_ms:.3f} ms node by node, {profile.cuda_graph_ms} ms as a CUDA graph")


if __name__ == "__main__":
    main()
