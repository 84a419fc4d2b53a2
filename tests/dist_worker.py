"""One rank of a data-parallel training job, for tests/test_distributed.py (started by the launcher):

    python -m graph_executor_v2.distributed.run --nproc-per-node 2 tests/dist_worker.py --device cuda --out DIR

Every rank starts from its own random parameters (Trainer(distributed=True) must replace them by rank 0's), trains
an MLP with ``fit`` over the same data set (each rank takes its shard of each global batch) and writes its losses
and final parameters to ``DIR/rank<r>.npz``. With ``--reference``, rank 0 then trains a plain single-process
Trainer from rank 0's initial parameters on the same global batches and writes ``DIR/reference.npz``, and again from
those parameters nudged by one float32 ulp (``DIR/reference_nudged.npz``).
``--kill-rank R --kill-step S``: rank R kills itself with SIGKILL before step S (the others must not hang).
"""
import argparse
import os
import signal
from pathlib import Path

import numpy as np

import graph_executor_v2 as ge2
from graph_executor_v2 import distributed

SIZES = (64, 128, 10)


def initial_parameters(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal(SIZES[:2]) * SIZES[0] ** -0.5).astype(np.float32),
            "b1": (rng.standard_normal(SIZES[1]) * 0.1).astype(np.float32),
            "w2": (rng.standard_normal(SIZES[1:]) * SIZES[1] ** -0.5).astype(np.float32),
            "b2": (rng.standard_normal(SIZES[2]) * 0.1).astype(np.float32)}


def mlp_graph(params: dict) -> ge2.ir.Graph:
    g = ge2.ir.Graph("dp_mlp")
    x = g.input("x", ("B", SIZES[0]), "float32")
    labels = g.input("labels", ("B",), "int64")
    p = {name: g.param(name, value) for name, value in params.items()}
    h = g.relu(g.add(g.matmul(x, p["w1"]), p["b1"]))
    g.output(g.cross_entropy(g.add(g.matmul(h, p["w2"]), p["b2"]), labels), "loss")
    return g


def data_set(count: int, seed: int) -> dict:
    """Random inputs labelled by their largest leading feature (a learnable task); the same on every rank."""
    x = np.random.default_rng(seed).standard_normal((count, SIZES[0])).astype(np.float32)
    return {"x": x, "labels": x[:, :SIZES[2]].argmax(axis=1).astype(np.int64)}


def optimizer(kind: str):
    return ge2.train.SGD(lr=0.05, momentum=0.9) if kind == "sgd" else ge2.train.AdamW(lr=1e-3, weight_decay=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="the global batch")
    parser.add_argument("--bucket-bytes", type=int, default=16 << 10, help="small: several buckets per step")
    parser.add_argument("--seed", type=int, default=0, help="rank r starts from parameters of seed + r")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=0)
    arguments = parser.parse_args()

    distributed.init(backend="nccl" if arguments.device == "cuda" else "store", timeout=120)
    rank = distributed.rank()
    # (a kill run steps until it is stopped: it cycles over at most 100 batches)
    batches = min(arguments.steps, 100) if arguments.kill_rank >= 0 else arguments.steps
    data = data_set(batches * arguments.batch_size, arguments.seed + 7919)
    trainer = ge2.train.Trainer(mlp_graph(initial_parameters(arguments.seed + rank)), device=arguments.device,
                                optimizer=optimizer(arguments.optimizer), distributed=True,
                                bucket_bytes=arguments.bucket_bytes)
    if arguments.kill_rank >= 0:
        part = distributed.shard(arguments.batch_size)
        for step in range(arguments.steps):
            if rank == arguments.kill_rank and step == arguments.kill_step:
                os.kill(os.getpid(), signal.SIGKILL)
            first = step % batches * arguments.batch_size
            rows = slice(first, first + arguments.batch_size)
            float(trainer.step({name: np.ascontiguousarray(array[rows][part]) for name, array in data.items()}))
        distributed.shutdown()
        return
    history = trainer.fit(data, epochs=1, batch_size=arguments.batch_size, shuffle=True, seed=0, progress=False)
    np.savez(arguments.out / f"rank{rank}.npz", loss=np.array(history["loss"]), **trainer.parameters())
    if rank == 0:
        print(trainer.explain(), flush=True)
    if arguments.reference and rank == 0:
        # The single-process reference, and the same run from parameters one float32 ulp away: how far float32
        # rounding alone moves this training (its chaos floor, which the data-parallel run may reach too).
        for name, nudge in (("reference", False), ("reference_nudged", True)):
            start = initial_parameters(arguments.seed)
            if nudge:
                start = {key: np.nextafter(value, np.float32(np.inf)) for key, value in start.items()}
            single = ge2.train.Trainer(mlp_graph(start), device=arguments.device,
                                       optimizer=optimizer(arguments.optimizer))
            history = single.fit(data, epochs=1, batch_size=arguments.batch_size, shuffle=True, seed=0,
                                 progress=False)
            np.savez(arguments.out / f"{name}.npz", loss=np.array(history["loss"]), **single.parameters())
    distributed.shutdown()


if __name__ == "__main__":
    main()
