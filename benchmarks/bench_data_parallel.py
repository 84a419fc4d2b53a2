"""Data-parallel training: ge2.train.Trainer(distributed=True) vs PyTorch DistributedDataParallel, 1 and 2 GPUs.

One command does everything: ``python benchmarks/bench_data_parallel.py`` starts the GE2 launcher twice,
``python -m graph_executor_v2.distributed.run --nproc-per-node N benchmarks/bench_data_parallel.py --worker ...``
with N = 1 and N = 2 (2 only where the machine has 2 GPUs), collects what rank 0 measured and writes the tables.

Model: MLP 1024 -> 4096 -> 4096 -> 1024 (ReLU), AMP bfloat16, AdamW, batch 512 per GPU (weak scaling: the global
batch grows with the GPUs). In each process, side by side:
- GE2: the whole step (forward, backward, bucketed NCCL all-reduces on a communication stream overlapping the
  backward, optimizer) is one captured CUDA graph. Gradients are all-reduced in their compute dtype (bfloat16).
- PyTorch: DDP (``bucket_cap_mb=25``, ``gradient_as_bucket_view``) with autocast bfloat16 and fused AdamW, eager
  (DDP's usual mode); gradients are float32 (autocast keeps float32 parameters), so it moves twice the bytes.
- 1 GPU: each framework also without data parallelism, the baseline of the scaling efficiency
  (efficiency = 1-GPU step time / N-GPU step time at the same per-GPU batch; target >= 90%).
- N = 2: GE2's step for several bucket sizes (the default, 25 MB, is chosen by this measurement), and NCCL's
  all-reduce alone (``ge2.distributed.all_reduce``) on the gradients' size and on 256 MB: bus bandwidth
  (nccl-tests' convention, 2 (N - 1) / N x bytes / time), the ceiling for the overlap.
Correctness first: GE2's and PyTorch's global mean losses over the first steps agree within 2% (AMP).

The GPT of the attention issue is not benchmarked here: its model (models/gpt.py, with the attention op) is not on
this branch; its row is added once the branches are merged.

Step times are medians of CUDA-event timings (benchmarks/harness.py) on rank 0; every rank runs the same steps.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from harness import median_ms, torch_cuda, write_results

import graph_executor_v2 as ge2
from bench_train import ge2_graph, init
from graph_executor_v2 import distributed
from graph_executor_v2.distributed.buckets import DEFAULT_BUCKET_BYTES

SIZES = (1024, 4096, 4096, 1024)
BATCH_PER_GPU = 512
BUCKET_SWEEP = (4 << 20, DEFAULT_BUCKET_BYTES, 1 << 30)  # small, the default, one bucket for everything
REPS = 200


# --- one rank ----------------------------------------------------------------------------------------------------
def torch_model(torch, params, local_rank):
    layers = []
    for index in range(len(SIZES) - 1):
        linear = torch.nn.Linear(SIZES[index], SIZES[index + 1], device=f"cuda:{local_rank}")
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(params[f"w{index}"].T.copy()))
            linear.bias.copy_(torch.from_numpy(params[f"b{index}"]))
        layers += [linear, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def torch_step(torch, model, module):
    """A PyTorch step (autocast bfloat16, fused AdamW) of ``module`` (the model, or its DDP wrapper)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)

    def step(x, labels):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(module(x).float(), labels)
        loss.backward()
        optimizer.step()
        return loss

    return step


def torch_process_group(torch, rank, world):
    """torch.distributed over NCCL; its store on a free port rank 0 announces through GE2's store (the launcher's
    MASTER_PORT is GE2's)."""
    store = distributed.group().store
    address = os.environ["MASTER_ADDR"]
    if rank == 0:
        with socket.socket() as probe:
            probe.bind((address, 0))
            store.set("bench/torch_port", str(probe.getsockname()[1]).encode())
    port = int(store.get("bench/torch_port"))
    torch.distributed.init_process_group("nccl", init_method=f"tcp://{address}:{port}", rank=rank, world_size=world)


def busbw_gbs(torch, nbytes: int, world: int) -> float:
    """NCCL all-reduce bus bandwidth (GB/s) of ``nbytes`` of bfloat16 through ge2.distributed."""
    buffer = torch.zeros(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    ms = median_ms(lambda: distributed.all_reduce(buffer, "sum", torch.cuda.current_stream().cuda_stream),
                   warmup=5, reps=50, flush_l2=False)
    return nbytes * 2 * (world - 1) / world / (ms * 1e-3) / 1e9


def worker(out: Path) -> None:
    torch = torch_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    distributed.init(backend="nccl", timeout=300)
    rank, world = distributed.rank(), distributed.world_size()
    torch_process_group(torch, rank, world)
    params = init(np.random.default_rng(0), SIZES)  # the same weights everywhere (both also broadcast rank 0's)
    data = np.random.default_rng(100 + rank)  # each rank its own shard of the global batch
    x = torch.tensor(data.standard_normal((BATCH_PER_GPU, SIZES[0])).astype(np.float32), device="cuda")
    labels = torch.tensor(data.integers(0, SIZES[-1], BATCH_PER_GPU), device="cuda")
    bench = Bench(torch, params, local_rank, {"x": x, "labels": labels})
    results = {"world": world, **bench.data_parallel()}
    if world == 1:
        results.update(bench.single())
    else:
        results["buckets"] = {bucket_bytes: bench.ge2_buckets(bucket_bytes) for bucket_bytes in BUCKET_SWEEP}
        gradient_bytes = 2 * sum(a * b + b for a, b in zip(SIZES, SIZES[1:]))  # bfloat16
        results["allreduce"] = {nbytes: busbw_gbs(torch, nbytes, world) for nbytes in (gradient_bytes, 256 << 20)}
    if rank == 0:
        out.write_text(json.dumps(results))
    torch.distributed.destroy_process_group()
    distributed.shutdown()


class Bench:
    """The measurements of one rank; each builds its trainers and models and frees them when it returns."""

    def __init__(self, torch, params, local_rank, feeds):
        self.torch, self.params, self.local_rank, self.feeds = torch, params, local_rank, feeds

    def ge2_trainer(self, **extra):
        gc.collect()  # the trainers of earlier measurements (their plans hold closures over them: cycles)
        return ge2.train.Trainer(ge2_graph(self.params, len(SIZES) - 1), device="cuda", amp="bfloat16",
                                 optimizer=ge2.train.AdamW(lr=1e-3, weight_decay=0.01), **extra)

    def time_ms(self, step) -> float:
        return median_ms(step, warmup=20, reps=REPS, flush_l2=False)

    def data_parallel(self) -> dict:
        """GE2 and DDP step times, after their global mean losses of the first steps agree (correctness first)."""
        torch, feeds = self.torch, self.feeds
        trainer = self.ge2_trainer(distributed=True)
        model = torch_model(torch, self.params, self.local_rank)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[self.local_rank], bucket_cap_mb=25,
                                                        gradient_as_bucket_view=True)
        ddp_step = torch_step(torch, model, ddp)
        ge2_losses = [float(trainer.step(feeds)) for _ in range(3)]
        torch_losses = []
        for _ in range(3):
            loss = ddp_step(feeds["x"], feeds["labels"]).detach()
            torch.distributed.all_reduce(loss, op=torch.distributed.ReduceOp.AVG)
            torch_losses.append(float(loss))
        np.testing.assert_allclose(ge2_losses, torch_losses, rtol=0.02, err_msg="GE2 vs PyTorch DDP global losses")
        return {"losses": {"ge2": ge2_losses, "torch_ddp": torch_losses},
                "ge2_ms": self.time_ms(lambda: trainer.step(feeds)),
                "ge2_capture": trainer._executor.plans[0].capture,
                "torch_ddp_ms": self.time_ms(lambda: ddp_step(feeds["x"], feeds["labels"]))}

    def single(self) -> dict:
        """The baselines of the scaling efficiency: one GPU, no data parallelism at all."""
        trainer = self.ge2_trainer()
        model = torch_model(self.torch, self.params, self.local_rank)
        step = torch_step(self.torch, model, model)
        return {"ge2_single_ms": self.time_ms(lambda: trainer.step(self.feeds)),
                "torch_single_ms": self.time_ms(lambda: step(self.feeds["x"], self.feeds["labels"]))}

    def ge2_buckets(self, bucket_bytes: int) -> dict:
        trainer = self.ge2_trainer(distributed=True, bucket_bytes=bucket_bytes)
        ms = self.time_ms(lambda: trainer.step(self.feeds))
        return {"ms": ms, "all_reduces": len(trainer._averager.buckets[id(trainer._executor.plans[0])])}


# --- the driver ----------------------------------------------------------------------------------------------------
def launch(nproc: int) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "rank0.json"
        repository = Path(__file__).resolve().parents[1]
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(repository / "python"), str(repository / "benchmarks"), os.environ.get("PYTHONPATH", "")]))
        command = [sys.executable, "-m", "graph_executor_v2.distributed.run", "--nproc-per-node", str(nproc),
                   "--master-port", "0", __file__, "--worker", "--out", str(out)]
        print("$ " + " ".join(command), flush=True)
        subprocess.run(command, env=environment, check=True, timeout=1200)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help="(internal) one rank, started by the launcher")
    parser.add_argument("--out", type=Path)
    arguments = parser.parse_args()
    if arguments.worker:
        worker(arguments.out)
        return
    torch_cuda()
    gpus = ge2.device_count()
    one = launch(1)
    two = launch(2) if gpus >= 2 else None
    shape = f"{BATCH_PER_GPU}/GPU x " + "->".join(map(str, SIZES))
    rows = [{"gpus": 1, "mode": "single (no data parallelism)", "shape": shape, "ge2_ms": one["ge2_single_ms"],
             "torch_ms": one["torch_single_ms"], "ratio": one["ge2_single_ms"] / one["torch_single_ms"]},
            {"gpus": 1, "mode": "data parallel (world 1)", "shape": shape, "ge2_ms": one["ge2_ms"],
             "torch_ms": one["torch_ddp_ms"], "ratio": one["ge2_ms"] / one["torch_ddp_ms"],
             "capture": one["ge2_capture"]}]
    if two is None:
        print(f"the 2-GPU rows are not measured: this machine has {gpus} GPU(s)")
    else:
        rows.append({"gpus": 2, "mode": "data parallel", "shape": shape, "ge2_ms": two["ge2_ms"],
                     "torch_ms": two["torch_ddp_ms"], "ratio": two["ge2_ms"] / two["torch_ddp_ms"],
                     "ge2_efficiency": one["ge2_single_ms"] / two["ge2_ms"],
                     "torch_efficiency": one["torch_single_ms"] / two["torch_ddp_ms"],
                     "capture": two["ge2_capture"], "target": "GE2 eff. >= 90%, GE2 / torch <= 1"})
        for bucket_bytes, measured in two["buckets"].items():
            rows.append({"gpus": 2, "mode": f"GE2 buckets of {int(bucket_bytes) / 2**20:g} MB "
                                            f"({measured['all_reduces']} all-reduces a step, the loss's included)",
                         "shape": shape, "ge2_ms": measured["ms"],
                         "ge2_efficiency": one["ge2_single_ms"] / measured["ms"]})
    columns = [("gpus", "GPUs"), ("mode", "mode"), ("shape", "MLP, AMP bfloat16, AdamW"), ("ge2_ms", "GE2 step ms"),
               ("torch_ms", "torch (DDP) step ms"), ("ratio", "GE2 / torch"),
               ("ge2_efficiency", "GE2 scaling eff."), ("torch_efficiency", "torch scaling eff."),
               ("capture", "GE2 CUDA graph"), ("target", "target")]
    print(write_results("data_parallel", rows, columns,
                        "Data-parallel training step: ge2 Trainer(distributed=True) vs PyTorch DDP"))
    if two is not None:
        bandwidth = [{"bytes_mb": int(nbytes) / 2**20, "busbw_gbs": value} for nbytes, value in
                     two["allreduce"].items()]
        print(write_results("data_parallel_allreduce", bandwidth, [("bytes_mb", "all-reduce MB (bfloat16)"),
                                                                   ("busbw_gbs", "NCCL bus bandwidth GB/s")],
                            "NCCL all-reduce alone on 2 GPUs (ge2.distributed.all_reduce)"))
    print("GPT (attention issue): not benchmarked on this branch (models/gpt.py is not here yet)")


if __name__ == "__main__":
    main()
