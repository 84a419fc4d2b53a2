"""GPT-2 124M training step (batch 8 x 1024), GE2 FP8 vs GE2 bfloat16, in one process, CUDA-graph replay (the
bench_train gpt2_fp8 row without torch.compile): for a quick before/after of an FP8 step change.

Run: python benchmarks/fp8_step_times.py [--layers 12] [--reps 30] [--unbatched] [--profile] [--weights-only]
--unbatched also times the FP8 step with its weights' quantizes one node each (train_rewrite without
_batch_weight_quantizes: the step before quantize_fp8_transpose_multi); --profile prints the FP8 plan's per-op table
(``ExecutorV2.profile``, node by node); --weights-only times just the quantizes of the FP8 step's 47 weights (GPT-2
124M's shapes, bfloat16 to E4M3), one quantize_fp8_transpose node each against one quantize_fp8_transpose_multi, as
CUDA graphs."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--unbatched", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--weights-only", action="store_true")
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
    batched = fp8._batch_weight_quantizes
    runs = [("fp8", "fp8", batched), ("bfloat16", "bfloat16", batched)]
    if arguments.unbatched:
        runs.insert(1, ("fp8 unbatched", "fp8", lambda graph, names: []))
    results, trainers = {}, {}
    for label, amp, batching in runs:
        started = time.perf_counter()
        fp8._batch_weight_quantizes = batching
        try:
            trainer = ge2.train.Trainer(model.loss_graph(batch), device="cuda", amp=amp,
                                        optimizer=ge2.train.AdamW(lr=1e-3, weight_decay=0.01))
        finally:
            fp8._batch_weight_quantizes = batched
        losses = [float(trainer.step(feeds)) for _ in range(3)]
        ms = median_ms(lambda: trainer.step(feeds), warmup=5, reps=arguments.reps, flush_l2=False)
        ops = trainer.train_graph.op_counts()
        results[label] = ms
        trainers[label] = trainer
        print(f"{label}: {ms:.3f} ms a step (losses {np.round(losses, 4)}; {ops.get('quantize_fp8_transpose', 0)} "
              f"quantize_fp8_transpose, {ops.get('quantize_fp8_transpose_multi', 0)} multi; "
              f"{trainer._executor.plans[0].capture}; built and run in {time.perf_counter() - started:.1f} s)",
              flush=True)
    for label in results:
        if label != "bfloat16":
            print(f"{label} vs bfloat16: {results['bfloat16'] / results[label]:.3f}x", flush=True)
    if arguments.profile:
        profile = trainers["fp8"]._executor.profile(feeds, runs=5)
        print(profile.op_table(), flush=True)
        print(f"plan: {profile.node_by_node_ms:.3f} ms node by node, {profile.cuda_graph_ms} ms as a CUDA graph")


if __name__ == "__main__":
    main()
