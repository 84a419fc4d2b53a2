"""``ge2.distributed``: data parallelism over the GPUs of a host (or of several hosts) through NCCL.

Start a job with the launcher, one process per GPU::

    python -m graph_executor_v2.distributed.run --nproc-per-node 2 train.py --epochs 3

Each process calls ``ge2.distributed.init()`` (it reads ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` from the environment the launcher sets), works, and calls ``ge2.distributed.shutdown()``.
Rank 0 hosts a TCP store (``store.TCPStore``) through which the ranks meet, check that they agree on the world,
and exchange NCCL's unique id.

Backends: ``"nccl"`` (device arrays; the ``_ops_collectives`` module, built when NCCL is found) and ``"store"``
(NumPy arrays exchanged through the store: the CPU backend's collectives, slow but exact, which is how a world of
several processes runs in CI on a machine with no GPU). ``init`` picks NCCL when this process has a GPU and the
module, else the store.

Failures never hang: every wait is bounded by ``timeout``; a watchdog thread aborts the NCCL communicator when
NCCL reports an asynchronous error or another rank announces its failure in the store, and an uncaught exception
in a rank announces it there before the process exits.
"""
from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from .. import device as _device
from .store import StoreError, TCPStore

ENVIRONMENT = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_TIMEOUT = 300.0
ABORT_WAIT_S = 10.0  # how long a failing rank lets ncclCommAbort run before it exits anyway


def _collectives():
    return _native.load("_ops_collectives")


def unavailable_reason() -> str | None:
    """None when NCCL collectives can run here, else why not."""
    try:
        _collectives()
    except ImportError as error:
        return f"the _ops_collectives module is not built (NCCL was not found at build time): {error}"
    if not _device.is_available():
        return "no CUDA GPU is available"
    return None


def is_available() -> bool:
    """Whether NCCL data parallelism can run in this process (NCCL built in, and a GPU)."""
    return unavailable_reason() is None


@dataclass
class ProcessGroup:
    rank: int
    world_size: int
    local_rank: int
    backend: str  # "nccl" or "store"
    store: TCPStore
    timeout: float
    communicator: int | None = None  # the NCCL communicator's handle
    _sequence: int = 0
    _watchdog: threading.Thread | None = field(default=None, repr=False)
    _closing: threading.Event = field(default_factory=threading.Event, repr=False)
    # Plans whose CUDA graphs captured this communicator's all-reduces (weak: a plan lives as long as its trainer).
    # NCCL counts every such graph as a reference to the communicator, and destroying or aborting it waits until
    # they are gone, so shutdown() releases them first.
    _captured_plans: list = field(default_factory=list, repr=False)

    def add_captured_plan(self, plan) -> None:
        """Registers a plan whose CUDA graph (once captured) holds this group's collectives."""
        self._captured_plans.append(weakref.ref(plan))

    def release_captured_plans(self) -> None:
        """Drops the CUDA graphs of the registered plans (they run node by node from then on, and their collectives
        fail cleanly once the group is gone)."""
        for reference in self._captured_plans:
            plan = reference()
            if plan is not None and plan.cuda_graph is not None:
                plan.cuda_graph = None
                plan.capture = "released by ge2.distributed.shutdown(): its all-reduces used the job's communicator"
        self._captured_plans.clear()

    def next_key(self, kind: str) -> str:
        self._sequence += 1
        return f"{kind}/{self._sequence}"


_group: ProcessGroup | None = None


def _environment() -> dict[str, str]:
    missing = [name for name in ENVIRONMENT if not os.environ.get(name)]
    if missing:
        raise RuntimeError(f"ge2.distributed.init: environment variable(s) {', '.join(missing)} not set; start the "
                           "script with python -m graph_executor_v2.distributed.run --nproc-per-node N script.py")
    return {name: os.environ[name] for name in ENVIRONMENT + ("LOCAL_RANK",) if name in os.environ}


def _int_variable(environment: dict, name: str, low: int, high: int | None = None) -> int:
    text = environment[name]
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}: expected an int, got {text!r}") from None
    if value < low or (high is not None and value >= high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"environment variable {name}: expected an int {bounds}, got {value}")
    return value


def init(backend: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> ProcessGroup:
    """Joins the job: connects to (rank 0: hosts) the store, checks that every rank agrees on the world, and
    creates the NCCL communicator (backend "nccl") on GPU ``LOCAL_RANK``. Returns the process group."""
    global _group
    if _group is not None:
        raise RuntimeError("ge2.distributed.init: already initialized; call shutdown() first")
    if backend not in (None, "nccl", "store"):
        raise ValueError(f"backend: expected 'nccl', 'store' or None (choose), got {backend!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
    environment = _environment()
    world = _int_variable(environment, "WORLD_SIZE", 1)
    rank = _int_variable(environment, "RANK", 0, world)
    local_rank = _int_variable(environment, "LOCAL_RANK", 0) if "LOCAL_RANK" in environment else rank
    port = _int_variable(environment, "MASTER_PORT", 1, 65536)
    if backend is None:
        backend = "nccl" if is_available() else "store"
    elif backend == "nccl" and not is_available():
        raise RuntimeError(f"backend 'nccl' is not available: {unavailable_reason()}")
    if backend == "nccl" and local_rank >= _device.device_count():
        raise ValueError(f"environment variable LOCAL_RANK: {local_rank}, but this host has "
                         f"{_device.device_count()} GPU(s); run at most that many processes per node")

    store = TCPStore(environment["MASTER_ADDR"], port, is_master=rank == 0, timeout=timeout)
    group = ProcessGroup(rank, world, local_rank, backend, store, float(timeout))
    try:
        _join(group)
        if backend == "nccl":
            _device.runtime().set_device(local_rank)
            if rank == 0:
                store.set("nccl/id", _collectives().unique_id())
            group.communicator = _collectives().create(store.get("nccl/id"), world, rank, local_rank, timeout)
    except Exception:
        store.close()
        raise
    _group = group
    group._watchdog = threading.Thread(target=_watch, args=(group,), name="ge2-distributed-watchdog", daemon=True)
    group._watchdog.start()
    _install_failure_hook(group)
    return group


def _join(group: ProcessGroup) -> None:
    """Every rank claims its rank once and states its world size; all must agree before any collective."""
    store = group.store
    claimed, _ = store.set_if_absent(f"join/rank/{group.rank}", str(os.getpid()).encode())
    if not claimed:
        raise RuntimeError(f"ge2.distributed.init: rank {group.rank} is claimed by two processes; RANK must be "
                           "unique in the job")
    store.set(f"join/world/{group.rank}", str(group.world_size).encode())
    store.add("join/count")
    try:
        store.wait_count("join/count", group.world_size, what=f"ranks (WORLD_SIZE={group.world_size})")
    except StoreError as error:
        raise RuntimeError(f"ge2.distributed.init: {error}; start every rank with the same WORLD_SIZE") from None
    worlds = {other: int(store.get(f"join/world/{other}")) for other in range(group.world_size)}
    disagree = {other: world for other, world in worlds.items() if world != group.world_size}
    if disagree:
        raise RuntimeError(f"ge2.distributed.init: world size mismatch: rank {group.rank} has WORLD_SIZE="
                           f"{group.world_size}, but ranks {sorted(disagree)} have {sorted(set(disagree.values()))}")


def _watch(group: ProcessGroup, interval: float = 0.5) -> None:
    """Aborts the communicator when NCCL reports an asynchronous error or another rank announced its failure, and
    ends the process (a rank blocked in a collective would otherwise wait for a dead peer forever)."""
    while not group._closing.wait(interval):
        reason = None
        try:
            if group.store.check("failed"):
                reason = group.store.get("failed").decode()
        except StoreError as error:
            reason = f"the job's store is gone ({error})"
        if reason is None and group.communicator is not None:
            message = _collectives().async_error(group.communicator)
            if message:
                reason = f"NCCL reported: {message}"
        if reason is not None and not group._closing.is_set():
            if group.communicator is not None:
                # The abort waits for the captured graphs that hold the communicator, which only the main thread
                # (blocked, most likely, on the dead peer) can drop: give it a bounded time, the exit ends the rest.
                aborting = threading.Thread(target=_collectives().abort, args=(group.communicator,), daemon=True)
                aborting.start()
                aborting.join(ABORT_WAIT_S)
                group.communicator = None
            sys.stderr.write(f"ge2.distributed: rank {group.rank} stops: {reason}\n")
            sys.stderr.flush()
            os._exit(1)


def _install_failure_hook(group: ProcessGroup) -> None:
    previous = sys.excepthook

    def announce(kind, value, traceback):
        try:
            group.store.set_if_absent("failed", f"rank {group.rank} raised {kind.__name__}: {value}".encode())
        except StoreError:
            pass
        previous(kind, value, traceback)

    sys.excepthook = announce


def group() -> ProcessGroup:
    if _group is None:
        raise RuntimeError("ge2.distributed: not initialized; call ge2.distributed.init() first")
    return _group


def is_initialized() -> bool:
    return _group is not None


def rank() -> int:
    return group().rank


def world_size() -> int:
    return group().world_size


def barrier() -> None:
    current = group()
    key = current.next_key("barrier")
    current.store.add(key)
    current.store.wait_count(key, current.world_size, what="ranks at the barrier")


def all_reduce(array, op: str = "avg", stream=None):
    """Reduces ``array`` over every rank in place (``op``: "sum", "avg" or "max") and returns it.

    Device arrays (DeviceArray, torch, CuPy) go through NCCL on ``stream``; NumPy arrays through the store."""
    if op not in ("sum", "avg", "max"):
        raise ValueError(f"op: expected 'sum', 'avg' or 'max', got {op!r}")
    current = group()
    if isinstance(array, np.ndarray):
        return _store_all_reduce(current, array, op)
    if current.communicator is None:
        raise RuntimeError("all_reduce: device arrays need the 'nccl' backend; this job runs the 'store' backend")
    view = _device.view_of(array, "array")
    if not view.is_contiguous:
        raise ValueError(f"array: expected a contiguous array, got strides {view.strides}")
    count = int(np.prod(view.shape, dtype=np.int64))
    _collectives().all_reduce(current.communicator, view.ptr, view.ptr, count, view.dtype, op,
                              _device.stream_handle(stream), current.timeout)
    return array


def all_reduce_bucket(arrays: list, op: str = "avg", stream=None) -> None:
    """All-reduces several arrays in place as one bucket: device arrays as one NCCL group on ``stream``, NumPy float
    arrays as one exchange through the store (exact: summed in float64, in rank order)."""
    if op not in ("sum", "avg", "max"):
        raise ValueError(f"op: expected 'sum', 'avg' or 'max', got {op!r}")
    current = group()
    on_host = [isinstance(array, np.ndarray) for array in arrays]
    if arrays and all(on_host):
        _store_all_reduce_bucket(current, arrays, op)
        return
    if any(on_host):
        raise TypeError(f"arrays: expected all NumPy or all device arrays, got NumPy at "
                        f"{[i for i, host in enumerate(on_host) if host]} only")
    if current.communicator is None:
        raise RuntimeError("all_reduce_bucket: device arrays need the 'nccl' backend; this job runs the 'store' "
                           "backend")
    views = [_device.view_of(a, f"arrays[{i}]") for i, a in enumerate(arrays)]
    pointers = [v.ptr for v in views]
    _collectives().all_reduce_group(current.communicator, pointers, pointers,
                                    [int(np.prod(v.shape, dtype=np.int64)) for v in views], [v.dtype for v in views],
                                    op, _device.stream_handle(stream), current.timeout)


def broadcast(array, root: int = 0, stream=None):
    """Overwrites ``array`` on every rank with rank ``root``'s (NumPy through the store, device arrays through NCCL)."""
    current = group()
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < current.world_size:
        raise ValueError(f"root: expected a rank in [0, {current.world_size}), got {root!r}")
    if isinstance(array, np.ndarray):
        key = current.next_key("broadcast")
        if current.rank == root:
            current.store.set(key, np.ascontiguousarray(array).tobytes())
        else:
            array[...] = np.frombuffer(current.store.get(key), dtype=array.dtype).reshape(array.shape)
        _release(current, key, [key])
        return array
    if current.communicator is None:
        raise RuntimeError("broadcast: device arrays need the 'nccl' backend")
    view = _device.view_of(array, "array")
    count = int(np.prod(view.shape, dtype=np.int64))
    _collectives().broadcast(current.communicator, view.ptr, view.ptr, count, view.dtype, root,
                             _device.stream_handle(stream), current.timeout)
    return array


def _store_all_reduce(current: ProcessGroup, array: np.ndarray, op: str) -> np.ndarray:
    key = current.next_key("all_reduce")
    current.store.set(f"{key}/{current.rank}", np.ascontiguousarray(array).tobytes())
    parts = [np.frombuffer(current.store.get(f"{key}/{other}"), dtype=array.dtype).reshape(array.shape)
             for other in range(current.world_size)]
    # Every rank sums in rank order, so every rank gets the same bits.
    if op == "max":
        result = np.maximum.reduce(parts)
    else:
        result = parts[0].astype(np.float64 if array.dtype.kind == "f" else array.dtype)
        for part in parts[1:]:
            result = result + part
        if op == "avg":
            result = result / current.world_size
    array[...] = result.astype(array.dtype)
    _release(current, key, [f"{key}/{other}" for other in range(current.world_size)])
    return array


def _store_all_reduce_bucket(current: ProcessGroup, arrays: list, op: str) -> None:
    """One store exchange for the whole bucket: the arrays flattened into one float64 vector (exact for every float
    dtype), reduced, and written back in each array's dtype."""
    for index, array in enumerate(arrays):
        if array.dtype.kind != "f" and str(array.dtype) != "bfloat16":
            raise TypeError(f"arrays[{index}]: expected a float array, got dtype {array.dtype}")
    flat = np.concatenate([np.asarray(array, np.float64).reshape(-1) for array in arrays])
    _store_all_reduce(current, flat, op)
    start = 0
    for array in arrays:
        array[...] = flat[start:start + array.size].reshape(array.shape).astype(array.dtype)
        start += array.size


def _release(current: ProcessGroup, key: str, keys: list[str]) -> None:
    """The last rank to read a collective's keys deletes them, so the store does not grow with every step."""
    if current.store.add(f"{key}/readers") == current.world_size:
        for name in keys + [f"{key}/readers"]:
            current.store.delete(name)


def shard(count: int, rank: int | None = None, world: int | None = None) -> slice:
    """The contiguous part of ``count`` items this rank owns (sizes differ by at most one, in rank order)."""
    rank = group().rank if rank is None else rank
    world = group().world_size if world is None else world
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank: expected an int in [0, {world}), got {rank}")
    base, extra = divmod(int(count), world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def shutdown() -> None:
    """Leaves the job: a last barrier (so rank 0's store outlives every rank's use of it), then frees the NCCL
    communicator and closes the store."""
    global _group
    current = group()
    barrier()
    current._closing.set()
    if current._watchdog is not None:
        current._watchdog.join()
    if current.communicator is not None:
        current.release_captured_plans()
        _device.runtime().synchronize()  # the released graphs' last launches end before NCCL tears down
        _collectives().destroy(current.communicator)
        current.communicator = None
    current.store.add("shutdown/left")
    if current.rank == 0:  # rank 0 hosts the store: it closes last, once every rank has left
        current.store.wait_count("shutdown/left", current.world_size, what="ranks leaving")
    current.store.close()
    _group = None


__all__ = ["init", "shutdown", "is_available", "unavailable_reason", "is_initialized", "group", "rank",
           "world_size", "barrier", "all_reduce", "all_reduce_bucket", "broadcast", "shard", "ProcessGroup",
           "TCPStore", "StoreError"]
