"""Gradient buckets: which gradients are all-reduced together.

A backward pass finishes gradients roughly from the last layer to the first. Grouping consecutive gradients (in
that order) into buckets of about ``bucket_bytes`` lets each bucket's all-reduce start as soon as its last
gradient is final, overlapping communication with the rest of the backward: small buckets start sooner, large
ones waste less per-launch latency. A gradient larger than a bucket gets a bucket of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

# 25 MB, PyTorch DDP's default: large enough that NCCL's fixed cost per call (tens of microseconds) is small
# against the transfer, small enough that the first bucket still closes early in the backward of the models we
# train (bench_data_parallel.py's MLP has ~48 MB of bfloat16 gradients: 2 buckets); the benchmark's sweep (4 MB,
# 25 MB, one bucket) measures the choice.
DEFAULT_BUCKET_BYTES = 25 << 20


@dataclass(frozen=True)
class Bucket:
    names: tuple[str, ...]  # gradients in the order they become final
    nbytes: int


def plan_buckets(gradients: Sequence[tuple[str, int]], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """Buckets over ``gradients`` ((name, nbytes) in the order the backward finishes them), each closed once it
    holds at least ``bucket_bytes``."""
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes: expected a positive int, got {bucket_bytes!r}")
    names = [name for name, _ in gradients]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"gradients: each gradient once, got {repeated} more than once")
    buckets, current, size = [], [], 0
    for name, nbytes in gradients:
        if nbytes < 0:
            raise ValueError(f"gradients: '{name}' has a negative size {nbytes}")
        current.append(name)
        size += nbytes
        if size >= bucket_bytes:
            buckets.append(Bucket(tuple(current), size))
            current, size = [], 0
    if current:
        buckets.append(Bucket(tuple(current), size))
    return buckets
