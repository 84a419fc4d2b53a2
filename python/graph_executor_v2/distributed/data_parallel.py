"""Gradient averaging inside a training plan: what ``Trainer(distributed=True)`` adds to each step plan.

Every rank runs the same step plan on its shard of the batch. The plan's gradients are grouped into buckets
(``buckets.plan_buckets``, in the order the backward finishes them) and each bucket is averaged over the ranks as
soon as the last node that writes or reads any of its gradients has run (``Plan.after_step``):

- CUDA: the compute stream records an event, the trainer's communication stream waits on it and runs the
  bucket's all-reduce (one NCCL group, ``ncclAvg``), then records the bucket's event; the epilogue makes the
  compute stream wait on every bucket's event before the optimizer. No host synchronisation, so the all-reduces
  overlap the rest of the backward and are captured into the step's CUDA graph with everything else (the comm
  stream forks from and joins back into the capture stream through those events).
- CPU: the same hooks average the NumPy gradients through the store, in order (the CI path).

The loss is averaged the same way (one more bucket, after its last reader), so every rank reports the global mean
loss. Averaging the ranks' mean gradients equals the mean gradient of the global batch when every rank holds the
same number of examples (``Trainer.fit`` shards each global batch that way).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from . import all_reduce_bucket, broadcast
from .buckets import DEFAULT_BUCKET_BYTES, plan_buckets
from ..dtypes import itemsize


@dataclass(frozen=True)
class ScheduledBucket:
    values: tuple[str, ...]  # value names of the plan (gradients, or the loss), averaged together
    nbytes: int
    after: int  # index of the plan step after which the all-reduce starts


def schedule_buckets(graph, gradients: Sequence[str], loss: str | None,
                     bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[ScheduledBucket]:
    """Buckets of ``gradients`` (value names of ``graph``, a plan's graph in step order) and, last, the ``loss``
    value alone, each with the step after which its values are final: the last step that writes or reads one of
    them (an all-reduce in place must not run while a later node still reads the rank's own gradient). Values that
    no node touches (inputs, parameters) are final from the start, after step 0."""
    last_use = {}
    for index, node in enumerate(graph.nodes):
        for value in (*node.inputs, *node.outputs):
            if value is not None:
                last_use[value.name] = index
    types = {value.name: value.type for value in graph.inputs}
    types.update((value.name, value.type) for value in graph.params.values())
    types.update((value.name, value.type) for node in graph.nodes for value in node.outputs)
    unique = list(dict.fromkeys(gradients))  # CSE may give two parameters one gradient value: reduce it once
    order = sorted(unique, key=lambda name: last_use.get(name, 0))
    scheduled = [ScheduledBucket(bucket.names, bucket.nbytes, max(last_use.get(name, 0) for name in bucket.names))
                 for bucket in plan_buckets([(name, types[name].numel * itemsize(types[name].dtype))
                                             for name in order], bucket_bytes)]
    if loss is not None and loss not in unique:
        scheduled.append(ScheduledBucket((loss,), types[loss].numel * itemsize(types[loss].dtype),
                                         last_use.get(loss, 0)))
    return sorted(scheduled, key=lambda bucket: bucket.after)  # stable: every rank issues them in one order


class GradientAverager:
    """Averages the gradients (and the loss) of training plans over the ranks of ``group`` (a
    ``ge2.distributed.ProcessGroup``); ``backend``: the trainer's executor backend (CPU or CUDA)."""

    def __init__(self, group, backend, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes: expected a positive int, got {bucket_bytes!r}")
        backend.check_process_group(group)
        self.group, self.bucket_bytes, self._backend = group, bucket_bytes, backend
        # The communication stream (kept alive here) and its handle; none on the CPU.
        self._comm_stream, self._comm = backend.side_stream()
        self.buckets: dict[int, list[ScheduledBucket]] = {}  # id(plan) -> its buckets (for explain)

    def broadcast(self, buffers) -> None:
        """Overwrites every buffer with rank 0's (start of training, after a checkpoint is loaded)."""
        for buffer in buffers:
            broadcast(buffer, root=0)
        self._backend.synchronize()

    def attach(self, plan, gradients: Sequence[str], loss: str | None) -> None:
        """Adds the bucket all-reduces to ``plan`` (after the steps that finish them) and, to its epilogue, the
        wait for them; call before the plan's first run (which captures it) and before the optimizer's launch."""
        if plan.schedule.stream_count != 1:  # a later reader on another stream could still be running
            raise ValueError(f"plan: gradient averaging hooks after the steps of one stream, got a plan on "
                             f"{plan.schedule.stream_count} streams")
        buckets = schedule_buckets(plan.graph, gradients, loss, self.bucket_bytes)
        self.buckets[id(plan)] = buckets
        self._backend.hold_captured_collectives(self.group, plan)
        done_events = []
        for bucket in buckets:
            arrays = [plan.slots[name] for name in bucket.values]
            hook, done = self._backend.overlapped(lambda comm, arrays=arrays: all_reduce_bucket(arrays, "avg", comm),
                                                  self._comm)
            plan.after_step.setdefault(bucket.after, []).append(hook)
            if done is not None:
                done_events.append(done)
        if done_events:
            def join(stream, done_events=done_events):  # the optimizer reads averaged gradients only
                for done in done_events:
                    done.wait_on(stream)

            plan.epilogue.append(join)

    def describe(self, plan) -> str:
        buckets = self.buckets.get(id(plan), [])
        where = self._backend.collectives
        lines = [f"data parallel: rank {self.group.rank} of {self.group.world_size}, gradients and loss averaged "
                 f"by {where}: {len(buckets)} all-reduce(s) a step, buckets closed at "
                 f"{self.bucket_bytes / 2**20:.3g} MB"]
        lines += [f"  after step {bucket.after} ({plan.graph.nodes[bucket.after].name}): "
                  f"{bucket.nbytes / 2**20:.3g} MB, {', '.join(bucket.values)}" for bucket in buckets]
        return "\n".join(lines)
