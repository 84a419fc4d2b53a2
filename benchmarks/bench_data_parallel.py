"""Data-parallel training: ge2.train.Trainer(distributed=True) vs PyTorch DistributedDataParallel, 1 and 2 GPUs.

One command does everything: ``python benchmarks/bench_data_parallel.py`` starts the GE2 launcher twice,
``python -m graph_executor_v2.distributed.run --nproc-per-node N benchmarks/bench_data_parallel.py --worker ...``
with N = 1 and N = 2 (2 only where the machine has 2 GPUs), collects what rank 0 measured and writes the tables.

Models: the MLP 1024 -> 4096 -> 4096 -> 1024 (ReLU), batch 512 per GPU, and the GPT of the attention issue
(``ge2.models.gpt``: 6 layers, 384 wide, 6 heads, context 256, vocabulary 8192, batch 32 per GPU; PyTorch runs
``models.gpt.torch_gpt`` with the same weights); AMP bfloat16, AdamW, weak scaling (the global batch grows with the
GPUs). In each process, side by side:
- GE2: the whole step (forward, backward, bucketed NCCL all-reduces on a communication stream overlapping the
  backward, optimizer) is one captured CUDA graph. Gradients are all-reduced in their compute dtype (bfloat16).
- PyTorch: DDP (``bucket_cap_mb=25``, ``gradient_as_bucket_view``) with autocast bfloat16 and fused AdamW, eager
  (DDP's usual mode); gradients are float32 (autocast keeps float32 parameters), so it moves twice the bytes.
- 1 GPU: each framework also without data parallelism, the baseline of the scaling efficiency
  (efficiency = 1-GPU step time / N-GPU step time at the same per-GPU batch; target >= 90%).
- N = 2: GE2's MLP step for several bucket sizes (the default, 25 MB, is chosen by this measurement), and NCCL's
  all-reduce alone (``ge2.distributed.all_reduce``) on the MLP gradients' size and on 256 MB: bus bandwidth
  (nccl-tests' convention, 2 (N - 1) / N x bytes / time), the ceiling for the overlap.
Correctness first: GE2's and PyTorch's global mean losses over the first steps agree within 2% (AMP).


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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from harness import median_ms, torch_cuda, write_results

import graph_executor_v2 as ge2
from bench_train import ge2_graph, init
from graph_executor_v2 import distributed, nn
from graph_executor_v2.distributed.buckets import DEFAULT_BUCKET_BYTES
from graph_executor_v2.models.gpt import GPT, GPTConfig, torch_gpt

SIZES = (1024, 4096, 4096, 1024)
BATCH_PER_GPU = 512
GPT_CONFIG = GPTConfig(vocab=8192, context=256, layers=6, heads=6, width=384)
GPT_BATCH_PER_GPU = 32
BUCKET_SWEEP = (4 << 20, DEFAULT_BUCKET_BYTES, 1 << 30)  # small, the default, one bucket for everything
REPS = 200


# --- the models ------------------------------------------------------------------------------------------------
@dataclass
class Workload:
    """One model as both frameworks train it on this rank: GE2's graph, PyTorch's module and loss, the rank's feeds."""
    name: str
    shape: str
    ge2_graph: Callable[[], object]
    torch_model: Callable[[], object]  # a new module on this rank's GPU, with the shared initial weights
    torch_loss: Callable[[object, dict], object]  # (module or its DDP wrapper, feeds) -> loss, under autocast
    feeds: dict


def mlp_workload(torch, rank: int, local_rank: int) -> Workload:
    params = init(np.random.default_rng(0), SIZES)  # the same weights everywhere (both also broadcast rank 0's)
    data = np.random.default_rng(100 + rank)  # each rank its own shard of the global batch
    x = torch.tensor(data.standard_normal((BATCH_PER_GPU, SIZES[0])).astype(np.float32), device="cuda")
    labels = torch.tensor(data.integers(0, SIZES[-1], BATCH_PER_GPU), device="cuda")

    def torch_model():
        layers = []
        for index in range(len(SIZES) - 1):
            linear = torch.nn.Linear(SIZES[index], SIZES[index + 1], device=f"cuda:{local_rank}")
            with torch.no_grad():
                linear.weight.copy_(torch.from_numpy(params[f"w{index}"].T.copy()))
                linear.bias.copy_(torch.from_numpy(params[f"b{index}"]))
            layers += [linear, torch.nn.ReLU()]
        return torch.nn.Sequential(*layers[:-1])

    return Workload("mlp", f"MLP {BATCH_PER_GPU}/GPU x " + "->".join(map(str, SIZES)),
                    lambda: ge2_graph(params, len(SIZES) - 1), torch_model,
                    lambda module, feeds: torch.nn.functional.cross_entropy(module(feeds["x"]).float(),
                                                                            feeds["labels"]),
                    {"x": x, "labels": labels})


def gpt_workload(torch, rank: int, local_rank: int) -> Workload:
    nn.manual_seed(0)
    model = GPT(GPT_CONFIG)
    state = {name: torch.from_numpy(value) for name, value in model.state_dict().items()}
    data = np.random.default_rng(200 + rank)
    ids, targets = (torch.tensor(data.integers(0, GPT_CONFIG.vocab, (GPT_BATCH_PER_GPU, GPT_CONFIG.context)),
                                 device="cuda") for _ in range(2))

    def torch_model():
        module = torch_gpt(GPT_CONFIG).to(f"cuda:{local_rank}")
        module.load_state_dict(state)
        return module

    config = GPT_CONFIG
    return Workload("gpt", f"GPT {GPT_BATCH_PER_GPU}/GPU x {config.layers}x{config.width} ({config.heads} heads), "
                    f"context {config.context}, vocab {config.vocab}", lambda: model.loss_graph(GPT_BATCH_PER_GPU),
                    torch_model, lambda module, feeds: module(feeds["ids"], feeds["targets"]),
                    {"ids": ids, "targets": targets})


def torch_step(torch, model, module, loss_of, feeds):
    """A PyTorch step (autocast bfloat16, fused AdamW) of ``module`` (the model, or its DDP wrapper)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(module, feeds)
        loss.backward()
        optimizer.step()
        return loss

    return step


# --- one rank ----------------------------------------------------------------------------------------------------
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
    results = {"world": world}
    for make_workload in (mlp_workload, gpt_workload):
        bench = Bench(torch, local_rank, make_workload(torch, rank, local_rank))
        measured = {"shape": bench.workload.shape, **bench.data_parallel()}
        if world == 1:
            measured.update(bench.single())
        elif bench.workload.name == "mlp":
            measured["buckets"] = {bucket_bytes: bench.ge2_buckets(bucket_bytes) for bucket_bytes in BUCKET_SWEEP}
        results[bench.workload.name] = measured
    if world > 1:
        gradient_bytes = 2 * sum(a * b + b for a, b in zip(SIZES, SIZES[1:]))  # the MLP's, in bfloat16
        results["allreduce"] = {nbytes: busbw_gbs(torch, nbytes, world) for nbytes in (gradient_bytes, 256 << 20)}
    if rank == 0:
        out.write_text(json.dumps(results))
    torch.distributed.destroy_process_group()
    distributed.shutdown()


class Bench:
    """The measurements of one rank on one workload; each builds its trainers and models and frees them when it
    returns."""

    def __init__(self, torch, local_rank, workload: Workload):
        self.torch, self.local_rank, self.workload = torch, local_rank, workload

    def ge2_trainer(self, **extra):
        gc.collect()  # the trainers of earlier measurements (their plans hold closures over them: cycles)
        return ge2.train.Trainer(self.workload.ge2_graph(), device="cuda", amp="bfloat16",
                                 optimizer=ge2.train.AdamW(lr=1e-3, weight_decay=0.01), **extra)

    def torch_step(self, wrap_in_ddp: bool):
        model = self.workload.torch_model()
        module = model
        if wrap_in_ddp:
            module = self.torch.nn.parallel.DistributedDataParallel(model, device_ids=[self.local_rank],
                                                                    bucket_cap_mb=25, gradient_as_bucket_view=True)
        return torch_step(self.torch, model, module, self.workload.torch_loss, self.workload.feeds)

    def time_ms(self, step) -> float:
        return median_ms(step, warmup=20, reps=REPS, flush_l2=False)

    def data_parallel(self) -> dict:
        """GE2 and DDP step times, after their global mean losses of the first steps agree (correctness first)."""
        torch, feeds = self.torch, self.workload.feeds
        trainer = self.ge2_trainer(distributed=True)
        ddp_step = self.torch_step(wrap_in_ddp=True)
        ge2_losses = [float(trainer.step(feeds)) for _ in range(3)]
        torch_losses = []
        for _ in range(3):
            loss = ddp_step().detach()
            torch.distributed.all_reduce(loss, op=torch.distributed.ReduceOp.AVG)
            torch_losses.append(float(loss))
        np.testing.assert_allclose(ge2_losses, torch_losses, rtol=0.02,
                                   err_msg=f"{self.workload.name}: GE2 vs PyTorch DDP global losses")
        return {"losses": {"ge2": ge2_losses, "torch_ddp": torch_losses},
                "ge2_ms": self.time_ms(lambda: trainer.step(feeds)),
                "ge2_capture": trainer._executor.plans[0].capture,
                "torch_ddp_ms": self.time_ms(ddp_step)}

    def single(self) -> dict:
        """The baselines of the scaling efficiency: one GPU, no data parallelism at all."""
        trainer = self.ge2_trainer()
        step = self.torch_step(wrap_in_ddp=False)
        return {"ge2_single_ms": self.time_ms(lambda: trainer.step(self.workload.feeds)),
                "torch_single_ms": self.time_ms(step)}

    def ge2_buckets(self, bucket_bytes: int) -> dict:
        trainer = self.ge2_trainer(distributed=True, bucket_bytes=bucket_bytes)
        ms = self.time_ms(lambda: trainer.step(self.workload.feeds))
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
    rows = []
    for name in ("mlp", "gpt"):
        single, shape = one[name], one[name]["shape"]
        rows += [{"gpus": 1, "mode": "single (no data parallelism)", "shape": shape, "ge2_ms": single["ge2_single_ms"],
                  "torch_ms": single["torch_single_ms"], "ratio": single["ge2_single_ms"] / single["torch_single_ms"]},
                 {"gpus": 1, "mode": "data parallel (world 1)", "shape": shape, "ge2_ms": single["ge2_ms"],
                  "torch_ms": single["torch_ddp_ms"], "ratio": single["ge2_ms"] / single["torch_ddp_ms"],
                  "capture": single["ge2_capture"]}]
        if two is None:
            continue
        pair = two[name]
        rows.append({"gpus": 2, "mode": "data parallel", "shape": shape, "ge2_ms": pair["ge2_ms"],
                     "torch_ms": pair["torch_ddp_ms"], "ratio": pair["ge2_ms"] / pair["torch_ddp_ms"],
                     "ge2_efficiency": single["ge2_single_ms"] / pair["ge2_ms"],
                     "torch_efficiency": single["torch_single_ms"] / pair["torch_ddp_ms"],
                     "capture": pair["ge2_capture"], "target": "GE2 eff. >= 90%, GE2 / torch <= 1"})
        for bucket_bytes, measured in pair.get("buckets", {}).items():
            rows.append({"gpus": 2, "mode": f"GE2 buckets of {int(bucket_bytes) / 2**20:g} MB "
                                            f"({measured['all_reduces']} all-reduces a step, the loss's included)",
                         "shape": shape, "ge2_ms": measured["ms"],
                         "ge2_efficiency": single["ge2_single_ms"] / measured["ms"]})
    if two is None:
        print(f"the 2-GPU rows are not measured: this machine has {gpus} GPU(s)")
    columns = [("gpus", "GPUs"), ("mode", "mode"), ("shape", "model (AMP bfloat16, AdamW)"),
               ("ge2_ms", "GE2 step ms"), ("torch_ms", "torch (DDP) step ms"), ("ratio", "GE2 / torch"),
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


if __name__ == "__main__":
    main()
