"""``Trainer``: compile once, train many.

The graph is canonicalized and fused for training (``passes.TRAINING_FORWARD``), differentiated
(``autograd.backward_graph``), and the graph holding forward, loss and gradients is optimized
(``passes.TRAINING_BACKWARD``). One ``ExecutorV2`` plan per batch signature runs the whole step in one arena planned
over the step's lifetimes: forward, loss, backward, then the optimizer launches appended to the same plan (gradient
clipping and the parameter updates, the plan's epilogue). On CUDA the plan is captured as one CUDA graph after its
first step and replayed from then on. Parameters (float32 masters) and optimizer states are persistent buffers
updated in place; the plan reads the parameters where they live, so nothing is copied between steps. A step feeds
the batch and launches the plan: reading the loss (``float(loss)``) is the caller's choice and the only host sync.

Buffers (batch norm's running statistics): a graph output named ``BUFFER_UPDATE_PREFIX + name`` is the new value of
parameter ``name``, which is then a buffer, not trained: the step computes it, and the plan's epilogue copies it into
the buffer the next step reads (``buffers()`` reads them; checkpoints keep them).

On ``device="cpu"`` every node and the optimizer run through the NumPy references (the CPU backend, the optimizer
op's ``ReferenceOptimizer``). On ``device="cuda"`` the nodes run as GPU kernels and the optimizer as the optimizer
op's fused multi-tensor kernels (``FusedOptimizerStep``: device step counter, schedule, clipping, loss scaling,
low-precision copies), so the whole step is captured as one CUDA graph.

``distributed=True`` trains data-parallel over the ranks of ``ge2.distributed`` (started by its launcher, one
process per GPU): rank 0's parameters and optimizer states are broadcast at the start, every rank runs the step
on its shard of the batch, and the gradients are averaged in buckets while the backward still runs
(``distributed.data_parallel``: NCCL on a communication stream on CUDA, inside the captured step; the store on the
CPU), so every rank applies the same update and reports the global mean loss.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Sequence

import numpy as np

from .. import autograd
from .. import distributed as _distributed
from .._optional import require
from ..distributed.buckets import DEFAULT_BUCKET_BYTES
from ..distributed.data_parallel import GradientAverager
from ..dtypes import FLOAT_DTYPES, itemsize, normalize, to_numpy
from ..ir.graph import Graph
from ..passes import (TRAINING_BACKWARD, TRAINING_FORWARD, TRAINING_FUSION, Pass, PassManager, autocast,
                      eliminate_dead_code, resolve)
from ..passes import fp8 as _fp8
from ..passes.precision import FLOAT32_PRECISIONS, check_precision
from ..passes.amp import AMP_DTYPES
from ..passes.training import recompute
from ..runtime.backends import backend_for
from ..runtime.executor import ExecutorV2, Plan
from ..ops.optimizer import FusedOptimizerStep, ParamSlot, ReferenceOptimizer
from . import optimizers as _optim
from ..nn import BUFFER_UPDATE_PREFIX
from ..nn.losses import CONSTANT_PREFIX

CHECKPOINT_FORMAT = "ge2.train/1"
COUNTERS = ("step", "optimizer_steps", "loss_scale", "loss_scale_growth_tracker")
ON_NONFINITE = ("raise", "skip")


class Trainer:
    """Trains the parameters of ``graph`` to minimize its scalar output ``loss``.

    ``optimizer``: ``SGD``, ``Adam`` or ``AdamW``. ``grad_clip``: clip gradients to this global L2 norm (None: no
    clipping). ``amp``: None, "float16" or "bfloat16": mixed precision by ``passes.autocast`` (GEMMs in the low
    precision, softmax/norms/reductions/losses in float32), float32 masters updated by the optimizer, which also
    writes the low-precision copies. float16 uses dynamic loss scaling (``loss_scale``, a ``DynamicLossScale``): a
    step whose gradients hold an inf or NaN is skipped and the scale lowered. ``amp="fp8"``: bfloat16 mixed
    precision with the GEMMs of nn.Linear layers on FP8 tensor cores (``passes/fp8.py``: E4M3 forward, E5M2
    gradients, delayed scaling per tensor on the device, calibrated on the first batch before the first step;
    ``fp8``: a ``DelayedScaling`` recipe, its amax history length, margin, calibration and which GEMMs stay
    bfloat16 (by default the first and the last); the scaling state is saved
    in checkpoints; ``explain()`` lists which GEMMs run in FP8). Overflow: FP8 casts saturate, a non-finite amax
    leaves the scaling state as it was, and a step whose gradients are not finite drops its update
    (``on_nonfinite``), so the parameters never take a NaN. ``checkpoint``: activations to
    recompute in the backward instead of keeping them from the forward (names of nodes or values of the training
    graph, or op names such as "gemm"; ``explain()`` shows them): less memory for more time.
    ``trainable``: names of the parameters to train (default every float parameter not named ``const/...`` and not
    a buffer); the others stay constant. Buffers: parameters with an output ``BUFFER_UPDATE_PREFIX + name`` (see the
    module docstring).
    ``distributed``: True trains data-parallel over the ranks of ``ge2.distributed`` (``init()`` first; NCCL on
    "cuda", the store on "cpu"); ``step`` then takes this rank's shard of the batch and ``fit`` shards each global
    batch itself. ``bucket_bytes``: gradients averaged per all-reduce (default 25 MB, PyTorch DDP's: large enough
    that NCCL runs near its bus bandwidth, small enough that the first buckets start while most of the backward is
    still to run; bench_data_parallel.py measures others).
    ``on_nonfinite``: what a step whose gradients hold an inf or NaN does. Both choices drop its update, decided on
    the device inside the step (the fused optimizer's non-finite flag, as AMP's found-inf check; no host
    synchronisation of its own), so the parameters stay as they were. "raise" (the default) then raises
    ``FloatingPointError`` at the next host read of a loss (``float(loss)``; ``fit`` reads every step's), naming the
    step and the first non-finite tensor (the loss, a gradient, a parameter); "skip" goes on and counts it
    (``nonfinite_steps``). A non-finite loss read on the host raises under "raise" too. Under float16 loss scaling
    an overflowing gradient is the scaler's business (the step is dropped and the scale lowered), not an error.
    ``precision``: "default", "highest" or "high": which float32 convolutions and GEMMs (forward and backward) may use
    TF32, as ``ExecutorV2``'s (``passes.precision``; FP8 training is ``amp="fp8"``).
    ``streams``: how many CUDA streams the step's nodes may run on (``ExecutorV2``'s ``streams=``; 1, the default,
    runs the step as one chain). With 2, a node that does not continue its producer's stream takes the other one:
    FP8 training's weight-gradient GEMMs, which only the optimizer reads, then run beside the next layer's backward.
    The same kernels and values, in another order; the memory plan keeps every buffer until the steps on both
    streams are done with it, so the step may take more memory. Not with ``distributed``. (GPT-2 124M on an H200 was
    not faster with 2: docs/fp8.md.)
    """

    def __init__(self, graph: Graph, loss: str = "loss", device: str = "cpu", optimizer=None, amp=None,
                 grad_clip: float | None = None, trainable: Sequence[str] | None = None, reuse_memory: bool = True,
                 loss_scale: "_optim.DynamicLossScale | None" = None, checkpoint: Sequence[str] = (),
                 distributed: bool = False, bucket_bytes: int = DEFAULT_BUCKET_BYTES, on_nonfinite: str = "raise",
                 fp8: "_fp8.DelayedScaling | None" = None, precision: str = "default", streams: int = 1):
        if not isinstance(graph, Graph):
            raise TypeError(f"graph: expected a ge2.ir.Graph, got {type(graph).__name__}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
        if not isinstance(optimizer, _optim.OPTIMIZERS):
            raise TypeError(f"optimizer: expected ge2.train.SGD, Adam or AdamW, got {type(optimizer).__name__}")
        if amp not in (None,) + AMP_DTYPES + ("fp8",):
            raise ValueError(f"amp: expected None, 'float16', 'bfloat16' or 'fp8', got {amp!r}")
        if loss_scale is not None and not isinstance(loss_scale, _optim.DynamicLossScale):
            raise TypeError(f"loss_scale: expected a ge2.train.DynamicLossScale, got {type(loss_scale).__name__}")
        if fp8 is not None and not isinstance(fp8, _fp8.DelayedScaling):
            raise TypeError(f"fp8: expected a ge2.train.DelayedScaling, got {type(fp8).__name__}")
        if fp8 is not None and amp != "fp8":
            raise ValueError(f"fp8: a DelayedScaling recipe needs amp='fp8', got amp={amp!r}")
        if loss_scale is None and amp == "float16":
            loss_scale = _optim.DynamicLossScale()
        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise ValueError(f"streams: expected an int >= 1, got {streams!r}")
        if streams > 1 and distributed:
            raise ValueError(f"streams: {streams} with distributed=True; data-parallel steps run on one stream")
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError(f"on_nonfinite: expected 'raise' or 'skip', got {on_nonfinite!r}")
        self.fp8 = (fp8 or _fp8.DelayedScaling()) if amp == "fp8" else None
        if grad_clip is not None:
            grad_clip = _optim.check_number("Trainer", "grad_clip", grad_clip, 0.0, low_open=True)
        if not isinstance(distributed, bool):
            raise TypeError(f"distributed: expected True or False, got {type(distributed).__name__}")
        if distributed and not _distributed.is_initialized():
            raise RuntimeError("distributed: ge2.distributed is not initialized; call ge2.distributed.init() first "
                               "(start the script with python -m graph_executor_v2.distributed.run)")
        self.precision = check_precision(precision, FLOAT32_PRECISIONS)
        autograd.loss_value(graph, loss)  # a missing or non-scalar loss fails here, naming it
        self.graph, self.loss_name, self.device = graph, loss, device
        self.optimizer, self.grad_clip, self.amp, self.loss_scale = optimizer, grad_clip, amp, loss_scale
        self.on_nonfinite = on_nonfinite
        self.optimizer_config = dataclasses.replace(_optim.to_config(optimizer, grad_clip, loss_scale),
                                                    skip_nonfinite=True)

        self.buffer_names = _buffer_names(graph)
        names = [n for n, v in graph.params.items() if v.type.dtype in FLOAT_DTYPES
                 and not n.startswith(CONSTANT_PREFIX) and n not in self.buffer_names] \
            if trainable is None else list(trainable)
        for name in names:
            if name not in graph.params:
                raise ValueError(f"trainable: unknown parameter {name!r}; graph '{graph.name}' has parameters "
                                 f"{list(graph.params)}")
            if graph.params[name].type.dtype not in FLOAT_DTYPES:
                raise TypeError(f"trainable: parameter {name!r} has dtype {graph.params[name].type.dtype}; only "
                                "float parameters are trained")
            if name in self.buffer_names:
                raise ValueError(f"trainable: {name!r} is a buffer (the graph computes its next value, output "
                                 f"'{BUFFER_UPDATE_PREFIX}{name}'), not a trainable parameter")
        self.forward_graph, self._forward_records = PassManager(resolve(TRAINING_FORWARD)).run(graph)
        if amp is not None:
            low = "bfloat16" if amp == "fp8" else amp  # FP8 GEMMs inside a bfloat16 step
            self.forward_graph, amp_records = PassManager([Pass("autocast", lambda g: autocast(g, low)),
                                                           *resolve(("pad_after_cast", "cse", "dce"))]
                                                          ).run(self.forward_graph)
            self._forward_records += amp_records
        # Parameters the loss does not read (removed by dead-code elimination) keep their values and get no update.
        self.trained = [name for name in names if name in self.forward_graph.params]
        if not self.trained:
            raise ValueError(f"trainable: the loss '{loss}' depends on no trainable parameter of graph "
                             f"'{graph.name}' (parameters: {list(graph.params)})")
        self._forward_names = {node.name for node in self.forward_graph.nodes}
        differentiated = autograd.backward_graph(self.forward_graph, loss, wrt=self.trained)
        for name in [n for n in differentiated.outputs if n != loss and not n.startswith(autograd.GRAD_PREFIX)
                     and not n.startswith(BUFFER_UPDATE_PREFIX)]:
            del differentiated.outputs[name]  # a step returns the loss (and buffer updates): no other output
        # Under loss scaling the seed is the scale, not 1: the loss and its gradient cannot come from one pass.
        passes = [p for p in resolve(TRAINING_BACKWARD) if not (loss_scale and p.name == "fuse_loss_gradient")]
        if self.fp8 is not None:  # before the backward fusions, which would chain activations into gemm_backward
            forward_names = self._forward_names
            passes.insert(0, Pass("fp8", lambda g: _fp8.train_rewrite(g, forward_names, self.fp8,
                                                                        BUFFER_UPDATE_PREFIX)))
            # after join_slice_gradients, which joins a QKV projection's gradients into the concat this reads in place
            passes.append(Pass("fp8_column_blocks", _fp8.read_column_blocks))
            # before the pointwise fusion, which would join a residual gradient's add and cast into one kernel
            passes.append(Pass("fp8_gradient_adds", _fp8.fuse_gradient_adds))
        if checkpoint:
            if isinstance(checkpoint, str):
                raise TypeError("checkpoint: expected a sequence of names, got a single string; wrap it in a list")
            passes.append(Pass("recompute", lambda g: recompute(g, self._forward_names, checkpoint)))
        passes += resolve(TRAINING_FUSION)
        self.train_graph, self._backward_records = PassManager(passes).run(differentiated)

        self._backend = backend_for(device)
        # float32 masters and optimizer states where the optimizer runs: host arrays on the CPU (the NumPy
        # reference), device arrays on CUDA (the fused multi-tensor kernels of ops/optimizer.py).
        self._masters = {name: self._backend.upload(np.array(v.data, np.float32)) for name, v in graph.params.items()
                         if name in names}
        self._states = {name: {state: self._backend.upload(np.zeros(v.type.shape, np.float32))
                               for state in self.optimizer_config.state_names}
                        for name, v in graph.params.items() if name in self.trained}
        # The buffers the plans read as parameters, in the dtype the graph computes with: a float32 parameter is its
        # master itself; otherwise a low-precision copy the optimizer rewrites in the same pass as the update.
        self._compute_dtypes = {name: self.forward_graph.params[name].type.dtype if name in self.forward_graph.params
                                else graph.params[name].type.dtype for name in self._masters}
        self._param_slots = {name: self._compute_slot(name) for name in self._masters}
        # FP8 delayed scaling's state (amax histories, scales) is made of buffers too: the step computes it.
        self.buffer_names += [name for name in self.train_graph.params if name.startswith(_fp8.STATE_PREFIX)]
        self._buffers = {name: self._backend.upload(np.array((graph.params.get(name)
                                                              or self.train_graph.params[name]).data, np.float32))
                         for name in self.buffer_names}
        # The optimizer's own state: applied steps, loss scale, finite steps since the scale last changed (on CUDA a
        # host mirror of the device Control block of the fused step, synchronized when the active plan changes and
        # for checkpoints).
        self._reference = ReferenceOptimizer(self.optimizer_config)
        self._fused: dict[int, object] = {}  # id(plan) -> its FusedOptimizerStep (CUDA)
        self._active = None  # the FusedOptimizerStep whose Control block holds the current state
        # The loss gradient's seed: the loss scale under float16 loss scaling, else 1 (a constant the loss-gradient
        # fusion may have folded away).
        self._scale = np.array(self._reference.loss_scale, np.float32)
        seed_dtype = to_numpy(self.train_graph.outputs[loss].type.dtype)
        if loss_scale is not None and seed_dtype != np.float32:
            raise ValueError(f"loss_scale: loss scaling needs a float32 loss (amp computes it in float32), got a "
                             f"{self.train_graph.outputs[loss].type.dtype} loss '{loss}'")
        self._seed = self._backend.upload(self._scale.astype(seed_dtype))
        self.step_count = 0  # steps taken
        self.fp8_calibration_passes = 0  # forward/backward passes run to calibrate FP8 scaling (no update)
        # CUDA: each step's epilogue copies its loss (bytes 0-7), the applied optimizer steps (8-15) and the
        # non-finite counters (16-23) here, so a loss read is one 24-byte copy that brings the check's flag along.
        self._readout = self._backend.upload(np.zeros(3, np.int64)) if self._backend.asynchronous else None
        self._nonfinite_seen = 0  # dropped non-finite steps already reported (raise) or counted (skip)
        self._last_plan = None  # the plan of the latest step: its gradients name a non-finite tensor
        slots = {**self._param_slots, **self._buffers}
        if autograd.SEED in self.train_graph.params:
            slots[autograd.SEED] = self._seed
        # One stream by default: the step's nodes form a chain (forward, then backward), and one stream lets the
        # memory plan reuse bytes along the step's exact lifetimes (what checkpointing relies on). On CUDA the step,
        # optimizer included, is captured as one CUDA graph after its first run.
        self._executor = ExecutorV2(self.train_graph, device, passes=[], reuse_memory=reuse_memory, params=slots,
                                    streams=streams, precision=precision)
        self._inference = None
        # Data parallelism: every rank starts from rank 0's parameters and states (the gradient averaging is added
        # to each step plan as it is built).
        self._averager = GradientAverager(_distributed.group(), self._backend, bucket_bytes) if distributed else None
        if self._averager is not None:
            self._sync_from_rank_0()

    # --- training -------------------------------------------------------------------------------------------------
    def step(self, batch: dict):
        """One training step on ``batch`` (input name -> array: NumPy, or device arrays on "cuda"); returns the loss
        as a 0-d array: NumPy on "cpu", a ``DeviceLoss`` on "cuda" (``float(loss)`` is then the only host sync)."""
        plan, views = self._plan(batch)
        self.step_count += 1
        self._last_plan = plan
        caller = plan.run(batch, views)  # the whole step, on the caller's (legacy) stream: on CUDA a captured graph
        if self._backend.asynchronous:  # the loss stays on the device until it is read, with the check's counters
            return DeviceLoss(self._readout, plan.graph.outputs[self.loss_name].type.dtype, self, self.step_count)
        loss = plan.graph.outputs[self.loss_name]
        value = self._backend.fetch(plan.slots[loss.name], loss.type, caller)
        reference = self._reference
        self._check_finite(value, self.step_count, reference.step_count, reference.nonfinite_steps,
                           reference.first_nonfinite)
        return value

    def fit(self, data: dict, epochs: int = 1, batch_size: int = 32, shuffle: bool = True, seed: int = 0,
            progress: bool = True, drop_last: bool = False) -> dict:
        """Trains over ``data`` (input name -> array, all with the same first dim) for ``epochs``, in batches (the
        last one may be smaller; ``drop_last`` leaves it out, for a graph built for one batch size), with a tqdm
        progress bar. Returns {"loss": per-step losses, "epoch_loss": the mean loss of each epoch}. With
        ``distributed=True`` every rank calls it with the whole data set and the same arguments; ``batch_size`` is
        the global batch, and the losses are the global batches' means. A NaN or inf in a float array of ``data``
        is a ValueError naming the array and the row, before any step."""
        count = _check_data(data, self.train_graph)
        for name, value in (("epochs", epochs), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if drop_last and count < batch_size:
            raise ValueError(f"batch_size: {batch_size} is more than the {count} examples, and drop_last leaves "
                             "every step out")
        # Data parallel: every rank draws the same order (same seed) and takes its shard of each global batch of
        # ``batch_size``; the shards must be equal for the averaged gradient to be the global batch's, so a last
        # batch is cut to a multiple of the world size (at most world - 1 examples an epoch left out).
        world, rank = (self._averager.group.world_size, self._averager.group.rank) if self._averager else (1, 0)
        if batch_size % world:
            raise ValueError(f"batch_size: expected a multiple of the world size {world} (the global batch is "
                             f"split evenly over the ranks), got {batch_size}")
        rng = np.random.default_rng(seed)
        sizes = {start: min(batch_size, count - start) for start in range(0, count, batch_size)}
        starts = [start for start, size in sizes.items() if size >= world and not (drop_last and size < batch_size)]
        if not starts:
            raise ValueError(f"data: {count} example(s), fewer than the world size {world}")
        history = {"loss": [], "epoch_loss": []}
        bar = _progress_bar(epochs * len(starts), progress and rank == 0)
        try:
            for _ in range(epochs):
                order = rng.permutation(count) if shuffle else np.arange(count)
                epoch_losses = []
                for start in starts:
                    index = order[start:start + batch_size]
                    if world > 1:
                        index = index[:len(index) - len(index) % world]
                        index = index[_distributed.shard(len(index), rank, world)]
                    loss = float(self.step({name: np.ascontiguousarray(array[index]) for name, array in data.items()}))
                    epoch_losses.append(loss)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{loss:.4f}")
                history["loss"] += epoch_losses
                history["epoch_loss"].append(float(np.mean(epoch_losses)))
        finally:
            if bar is not None:
                bar.close()
        return history

    # --- parameters, checkpoints, inference -------------------------------------------------------------------------
    def parameters(self) -> dict[str, np.ndarray]:
        """Name -> a NumPy copy of every trainable parameter (the float32 masters)."""
        return {name: self._backend.to_host(master) for name, master in self._masters.items()}

    def buffers(self) -> dict[str, np.ndarray]:
        """Name -> a NumPy copy of every buffer (e.g. batch norm's running statistics) as the last step left it."""
        return {name: self._backend.to_host(buffer) for name, buffer in self._buffers.items()}

    def executor(self) -> ExecutorV2:
        """An ExecutorV2 for inference on the current parameters (the trainer's own buffers, no copy: later steps
        are seen by it). Its outputs are the graph's outputs other than the loss and the buffer updates (all of them
        when the loss is the only one), and its inputs those they need (no labels for a classifier's logits). It
        runs the graph as trained: a layer that behaves differently in eval mode (batch norm, dropout) needs the
        eval graph (``model.eval().graph(...)`` loaded with ``parameters()`` and ``buffers()``)."""
        if self._inference is None:
            self._inference = ExecutorV2(_inference_graph(self.forward_graph, self.loss_name), self.device,
                                         passes=[], params={**self._param_slots, **self._buffers},
                                         precision=self.precision)
        return self._inference

    def save(self, path) -> None:
        """A safetensors file with the parameters, the optimizer state and the step (metadata: the graph's
        fingerprint and the optimizer's hyper-parameters). Data parallel: every rank holds the same state, so one
        rank (rank 0) saves. An OSError names ``path`` and the cause; a failed save leaves nothing behind."""
        tensors = {f"param/{name}": value for name, value in self.parameters().items()}
        for name, states in self._states.items():
            tensors.update((f"state/{name}/{state}", self._backend.to_host(buffer)) for state, buffer in states.items())
        tensors.update((f"buffer/{name}", value) for name, value in self.buffers().items())
        self._pull_state()
        tensors["step"] = np.array(self.step_count, np.int64)
        tensors["optimizer_steps"] = np.array(self._reference.step_count, np.int64)
        tensors["loss_scale"] = np.array(self._reference.loss_scale, np.float32)
        tensors["loss_scale_growth_tracker"] = np.array(self._reference.good_steps, np.int64)
        metadata = {"format": CHECKPOINT_FORMAT, "graph": self.fingerprint(),
                    "optimizer": json.dumps(_optim.describe(self.optimizer))}
        _write_checkpoint(tensors, path, metadata)

    def load(self, path) -> None:
        """Restores a checkpoint written by ``save`` for the same graph (ValueError otherwise). Data parallel: every
        rank calls it (rank 0's parameters and states are then broadcast, so all ranks continue from the same).
        A missing file or a directory is an OSError, a corrupt, truncated or empty file a ValueError, naming
        ``path``."""
        with _open_checkpoint(path) as file:
            metadata = file.metadata() or {}
            if metadata.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(f"path: {path} is not a ge2.train checkpoint (format {metadata.get('format')!r})")
            if metadata.get("graph") != self.fingerprint():
                raise ValueError(f"path: the checkpoint {path} was saved from another graph (its parameters, "
                                 f"shapes or dtypes differ from graph '{self.graph.name}')")
            expected = {f"param/{name}" for name in self._masters} | set(COUNTERS) | {
                f"state/{name}/{state}" for name, states in self._states.items() for state in states} | {
                f"buffer/{name}" for name in self._buffers}
            missing = sorted(expected - set(file.keys()))
            if missing:
                raise ValueError(f"path: the checkpoint {path} lacks {missing} (saved with another optimizer?)")
            tensors = {key: file.get_tensor(key) for key in expected}
        for name, master in self._masters.items():
            self._backend.store(master, np.asarray(tensors[f"param/{name}"], np.float32))
            self._refresh(name)
        for name, states in self._states.items():
            for state, buffer in states.items():
                self._backend.store(buffer, np.asarray(tensors[f"state/{name}/{state}"], np.float32))
        for name, buffer in self._buffers.items():
            self._backend.store(buffer, np.asarray(tensors[f"buffer/{name}"], np.float32))
        self._pull_state()  # the count of dropped non-finite steps goes on from the device's (not in checkpoints)
        self.step_count = int(tensors["step"])
        self._reference.step_count = int(tensors["optimizer_steps"])
        self._reference.loss_scale = float(tensors["loss_scale"])
        self._reference.good_steps = int(tensors["loss_scale_growth_tracker"])
        self._refresh_seed()
        for fused in self._fused.values():
            self._push_state(fused)
        if self._averager is not None:
            self._sync_from_rank_0()

    def fingerprint(self) -> str:
        """A hash of the graph's name, parameters (names, shapes, dtypes) and trained set."""
        params = sorted((name, list(v.type.shape), v.type.dtype) for name, v in self.graph.params.items())
        described = [self.graph.name, params, self.trained]
        return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]

    @property
    def nonfinite_steps(self) -> int:
        """Steps whose update was dropped because a gradient held an inf or NaN (``on_nonfinite``); on CUDA reading
        it synchronizes."""
        self._pull_state()
        return self._reference.nonfinite_steps

    @property
    def optimizer_steps(self) -> int:
        """Updates applied (a step whose gradients overflow under loss scaling is skipped and not counted); on CUDA
        reading it synchronizes."""
        self._pull_state()
        return self._reference.step_count

    # --- reporting ------------------------------------------------------------------------------------------------
    @property
    def peak_bytes(self) -> int:
        """Device (or host) bytes of the largest step plan built so far: its arena (activations, gradients,
        temporaries) plus the persistent parameters and optimizer states."""
        arenas = [plan.memory.arena_bytes for plan in self._executor.plans]
        return (max(arenas) if arenas else 0) + self.persistent_bytes

    @property
    def persistent_bytes(self) -> int:
        """Bytes of the buffers that live across steps: float32 masters, low-precision copies, optimizer states."""
        copies = [slot for name, slot in self._param_slots.items() if slot is not self._masters[name]]
        states = [buffer for per_param in self._states.values() for buffer in per_param.values()]
        buffers = list(self._masters.values()) + copies + states
        return sum(int(np.prod(b.shape)) * itemsize(normalize(b.dtype)) for b in buffers)

    def explain(self) -> str:
        graph = self.train_graph
        forward_nodes = [n for n in graph.nodes if n.name in self._forward_names or n.name.endswith(".recomputed")]
        backward = set(graph.nodes) - set(forward_nodes)
        lines = [f"Trainer '{self.graph.name}' on {self.device}: loss '{self.loss_name}', "
                 f"{len(self.trained)} trained parameter(s), optimizer {_optim.describe(self.optimizer)}",
                 f"forward ({len(forward_nodes)} nodes): " + ", ".join(f"{n.name}={n.op}" for n in forward_nodes),
                 f"backward ({len(backward)} nodes): " + ", ".join(f"{n.name}={n.op}" for n in graph.nodes
                                                                   if n in backward)]
        fusions = [note for record in self._forward_records + self._backward_records for note in record.notes
                   if record.name in ("pad_classes", "fuse_relu", "autocast", "pad_after_cast",
                                      "chain_activation_backward", "trim_gemm_backward", "fuse_loss_gradient",
                                      "recompute", "fp8", "fp8_column_blocks", "fp8_gradient_adds")]
        lines.append(f"training rewrites (padded classes, fusions, mixed precision, FP8 GEMMs, recomputation): "
                     f"{len(fusions)}")
        lines += [f"  {note}" for note in fusions]
        clip = f"clip to global norm {self.grad_clip}, " if self.grad_clip else ""
        where = "NumPy reference (ReferenceOptimizer)" if not self._backend.asynchronous else (
            "fused multi-tensor kernels on the device (FusedOptimizerStep), the plan's epilogue")
        lines.append(f"optimizer: {clip}{type(self.optimizer).__name__} on {len(self.trained)} parameter(s), states "
                     f"{list(self.optimizer.state_names)}; {where}")
        if self.fp8 is not None:
            if not self.fp8.calibrate:
                calibration = "not calibrated: the first step quantizes with scale 1"
            elif self.fp8_calibration_passes:
                calibration = (f"calibrated by {self.fp8_calibration_passes} forward/backward pass(es) on the first "
                               "batch")
            else:
                calibration = "no calibration pass run yet (no step taken, or the state came calibrated)"
            lines.append(f"FP8 delayed scaling: amax history {self.fp8.history}, margin {self.fp8.margin}; "
                         f"{calibration}")
        lines.append(f"memory: persistent {self.persistent_bytes / 2**20:.3g} MB (masters, copies, states), "
                     f"peak {self.peak_bytes / 2**20:.3g} MB")
        if self._averager is not None:
            lines += [self._averager.describe(plan) for plan in self._executor.plans]
        lines.append(self._executor.explain())
        return "\n".join(lines)

    # --- internals ------------------------------------------------------------------------------------------------
    def _plan(self, batch: dict) -> tuple[Plan, dict]:
        """The step plan for the batch's signature (its optimizer set as the plan's epilogue on first use) and the
        batch's views."""
        if not isinstance(batch, dict):
            raise TypeError(f"batch: expected a dict of input name -> array, got {type(batch).__name__}")
        try:
            plan, views = self._executor.plan_for(batch)
        except (ValueError, TypeError) as error:
            raise type(error)(f"batch: {error}") from None
        if not plan.epilogue:
            if self.fp8 is not None and self.fp8.calibrate:  # before the optimizer and all-reduces are attached
                self._calibrate_fp8(plan, batch, views)
            if self._averager is not None:  # the gradients' all-reduces and, first in the epilogue, their wait
                self._averager.attach(plan, [plan.graph.outputs[autograd.grad_name(name)].name
                                             for name in self.trained], plan.graph.outputs[self.loss_name].name)
            plan.epilogue.append(self._optimizer_launch(plan))
            if self._buffers:
                plan.epilogue.append(self._buffer_update_launch(plan))
        fused = self._fused.get(id(plan))
        if fused is not None and fused is not self._active:  # another batch shape: move the state over (syncs)
            self._pull_state()
            self._push_state(fused)
            self._active = fused
        return plan, views

    def _optimizer_launch(self, plan: Plan):
        """The optimizer as the plan's epilogue, launch(stream): unscaling (float16 loss scaling), clipping and every
        parameter's update on the float32 masters and states, and the low-precision copies the plans read. On the
        CPU the optimizer op's ReferenceOptimizer, on CUDA its FusedOptimizerStep."""
        names = list(self.trained)
        grad_slots = [plan.slots[plan.graph.outputs[autograd.grad_name(name)].name] for name in names]
        grad_types = [plan.graph.outputs[autograd.grad_name(name)].type for name in names]
        if self._backend.asynchronous:  # the fused device step, captured with the plan
            return self._device_optimizer_launch(plan, names, grad_slots, grad_types)
        params = [self._masters[name] for name in names]
        states = [self._states[name] for name in names]
        reference = self._reference

        def launch(stream):
            grads = grad_slots
            scale = reference.loss_scale
            reference.step(params, grads, states)
            if reference.loss_scale != scale:
                self._refresh_seed(stream)
            if not reference.skipped:
                for name in names:
                    self._refresh(name, stream)

        return launch

    def _buffer_update_launch(self, plan: Plan, names=None):
        """launch(stream) copying this step's updates of the buffers ``names`` (default all; outputs of the plan)
        into the buffers the next step reads: device work only on CUDA, captured with the plan."""
        return self._backend.copier([(self._buffers[name],
                                      plan.slots[plan.graph.outputs[BUFFER_UPDATE_PREFIX + name].name])
                                     for name in (self.buffer_names if names is None else names)])

    def _calibrate_fp8(self, plan: Plan, batch: dict, views: dict) -> None:
        """FP8 delayed scaling's first scales from the data (``DelayedScaling.calibrate``), when an activation's or
        gradient's amax history is still empty: runs the plan's forward and backward on ``batch`` (no optimizer: it
        is not attached yet) and keeps only the new scaling state, until no tensor's amax moves by more than a
        factor of 2 from one pass to the next. A gradient that reaches its GEMM through another FP8 GEMM's dgrad is
        all zeros (or too small) while that GEMM's scale is still 1, so it settles a pass later: three passes for a
        transformer, at most one per FP8 GEMM and one more for a chain of them. Host reads of the histories, before
        a plan's first step only."""
        names = [name for name in self.buffer_names if name.startswith(_fp8.STATE_PREFIX)]
        histories = [self._buffers[name] for name in names if name.endswith(".history")]

        def newest() -> np.ndarray:
            return np.array([self._backend.to_host(history)[0] for history in histories], np.float64)

        if all(self._backend.to_host(history).any() for history in histories):
            return  # calibrated already: an earlier plan's steps, or a checkpoint
        keep_state = self._buffer_update_launch(plan, names)
        amax = newest()
        for _ in range(len(histories) // 3 + 1):  # x, w and g per FP8 GEMM
            keep_state(plan.run_uncaptured(batch, views))
            self.fp8_calibration_passes += 1
            previous, amax = amax, newest()
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(previous == amax, 1.0, amax / previous)  # 0 -> 0 is settled, 0 -> a value is not
            if not np.any(np.isfinite(amax) & ((ratio > 2.0) | (ratio < 0.5))):
                break

    def _device_optimizer_launch(self, plan: Plan, names, grad_slots, grad_types):
        """The fused optimizer step of this plan (one per plan: the gradients live in its arena), device work only,
        so the plan with its optimizer is captured as one CUDA graph. The loss scale it keeps in its Control block
        is copied into the seed buffer the backward reads."""
        config = self.optimizer_config
        slots = []
        for name, grad, grad_type in zip(names, grad_slots, grad_types):
            master, compute = self._masters[name], self._param_slots[name]
            low = compute is not master
            slots.append(ParamSlot(master.ptr, grad.ptr, tuple(self._states[name][s].ptr for s in config.state_names),
                                   int(np.prod(master.shape)), grad_type.dtype, compute.ptr if low else 0,
                                   self._compute_dtypes[name] if low else None))
        fused = FusedOptimizerStep(config, slots, device=self._backend.device_index)
        self._pull_state()
        self._push_state(fused)
        self._fused[id(plan)] = self._active = fused
        memcpy, seed, scale = self._backend.runtime.memcpy_device_to_device, self._seed.ptr, \
            fused.control_address("loss_scale")
        scaled = config.loss_scaling
        loss = plan.graph.outputs[self.loss_name]
        readout = [(self._readout.ptr, plan.slots[loss.name].ptr, itemsize(loss.type.dtype)),
                   (self._readout.ptr + 8, fused.control_address("step"), 8),
                   (self._readout.ptr + 16, fused.control_address("nonfinite_steps"), 8)]  # and first_nonfinite

        def launch(stream, fused=fused):  # the default argument keeps the step's device tables alive
            fused.launch(stream)
            if scaled:
                memcpy(seed, scale, 4, stream)
            for destination, source, nbytes in readout:
                memcpy(destination, source, nbytes, stream)

        return launch

    def _sync_from_rank_0(self) -> None:
        """Every rank takes rank 0's masters and optimizer states (and rewrites its low-precision copies)."""
        self._averager.broadcast([*self._masters.values(), *(buffer for states in self._states.values()
                                                             for buffer in states.values())])
        for name in self._masters:
            self._refresh(name)

    def _pull_state(self) -> None:
        """The host mirror of the optimizer state from the active device step (CUDA; synchronizes)."""
        if self._active is not None:
            state = self._active.read_state()
            self._reference.step_count, self._reference.loss_scale = int(state["step"]), float(state["loss_scale"])
            self._reference.good_steps = int(state["good_steps"])
            self._reference.nonfinite_steps = int(state["nonfinite_steps"])
            self._reference.first_nonfinite = int(state["first_nonfinite"])

    def _push_state(self, fused) -> None:
        """The host state into ``fused``'s Control block (``first_nonfinite`` restarts at 0: a non-finite step not
        yet reported is reported by the next loss read before any push)."""
        fused.set_state(self._reference.step_count, self._reference.loss_scale, self._reference.good_steps,
                        self._reference.nonfinite_steps)

    def _check_finite(self, loss, step: int, applied: int, nonfinite_steps: int, first_nonfinite: int) -> None:
        """At a host read of the loss of ``step`` (the latest step), with the optimizer's counters as that step left
        them (applied steps, steps dropped for a non-finite gradient, the attempt of the first one not yet reported):
        a step dropped since the last read, or a non-finite loss, raises FloatingPointError (on_nonfinite="raise")
        or is counted ("skip")."""
        dropped = nonfinite_steps > self._nonfinite_seen
        if not dropped and np.isfinite(np.asarray(loss, np.float64)):
            return
        self._nonfinite_seen = nonfinite_steps
        if self.on_nonfinite == "skip":
            return
        # Every step since the first dropped one was an optimizer attempt (applied or dropped): count back from now.
        first = step - (applied + nonfinite_steps - first_nonfinite) if dropped else step
        self._pull_state()
        self._reference.first_nonfinite = 0  # reported: the next dropped step is the first again
        if self._active is not None:
            self._push_state(self._active)
        raise FloatingPointError(self._describe_nonfinite(first, step, loss, dropped))

    def _describe_nonfinite(self, first: int, step: int, loss, dropped: bool) -> str:
        """The message of a non-finite step: the step, the first non-finite tensor (the loss, the gradients of the
        latest step in parameter order, the parameters), and what happened to the update."""
        found = []
        if first == step and not np.isfinite(np.asarray(loss, np.float64)):
            found.append(f"the loss '{self.loss_name}' ({float(loss)})")
        plan = self._last_plan
        if first == step and plan is not None:
            for name in self.trained:
                gradient = plan.slots[plan.graph.outputs[autograd.grad_name(name)].name]
                found += _nonfinite_entries(f"the gradient of parameter '{name}'", self._backend.to_host(gradient))
        for name, master in self._masters.items():
            found += _nonfinite_entries(f"parameter '{name}'", self._backend.to_host(master))
        what = found[0] if found else "a gradient (overwritten since by later steps)"
        others = f"; then {', '.join(found[1:4])}{' ...' if len(found) > 4 else ''}" if len(found) > 1 else ""
        if dropped:
            where = f"step {first}" if first == step else f"step {first} (reported at the read of step {step})"
            outcome = (f"its update was dropped, so the parameters are as they were before step {first}; "
                       f"{self._reference.nonfinite_steps} step(s) dropped so far")
        else:
            where = f"step {step}"
            outcome = "its gradients were finite and its update was applied"
        return (f"non-finite value at {where}: first {what}{others}; {outcome}. Look for a NaN/inf in the batch or a "
                "learning rate too high; Trainer(on_nonfinite='skip') drops such steps and goes on")


    def _compute_slot(self, name: str):
        """The buffer a plan reads for parameter ``name``: its master when it computes in float32, else a copy in
        its compute dtype."""
        master, dtype = self._masters[name], self._compute_dtypes[name]
        if dtype == "float32":
            return master
        return self._backend.upload(np.asarray(self.graph.params[name].data, np.float32).astype(to_numpy(dtype)))

    def _refresh(self, name: str, stream=None) -> None:
        """Rewrites the buffer the plans read for parameter ``name`` from its master."""
        slot, master = self._param_slots[name], self._masters[name]
        if slot is master:
            return
        backend = self._backend
        backend.store(slot, backend.to_host(master).astype(to_numpy(self._compute_dtypes[name])), stream or 0)

    def _refresh_seed(self, stream=None) -> None:
        """Rewrites the seed buffer the plans read from the loss scale (on the step's stream during a step)."""
        self._scale[...] = self._reference.loss_scale
        self._backend.store(self._seed, self._scale.astype(to_numpy(self._seed.dtype)), stream or 0)


class DeviceLoss:
    """The loss of one CUDA step: a 0-d value left on the device (no sync), in the trainer's readout buffer with
    the step's non-finite counters. ``float(loss)``, ``loss.item()`` and ``loss.numpy()`` copy both to the host in
    one read, and check them (``Trainer(on_nonfinite=...)``); read it before the next step of the same trainer,
    which writes that buffer again (a stale read raises instead of returning the newer loss)."""

    shape = ()
    ndim = 0

    def __init__(self, slot, dtype: str, trainer: "Trainer", step: int):
        self._slot, self.dtype, self._trainer, self._step = slot, dtype, trainer, step

    def numpy(self) -> np.ndarray:
        if self._trainer.step_count != self._step:
            raise RuntimeError(f"this loss (step {self._step}) was overwritten by a later step (now "
                               f"{self._trainer.step_count}); read it with float(loss) before the next step")
        raw = self._slot.numpy().reshape(3)  # int64: the loss's bytes, applied steps, the two int32 counters
        value = raw[:1].view(np.uint8)[:itemsize(self.dtype)].view(to_numpy(self.dtype)).reshape(())
        nonfinite_steps, first_nonfinite = (int(n) for n in raw[2:].view(np.int32))
        self._trainer._check_finite(value, self._step, int(raw[1]), nonfinite_steps, first_nonfinite)
        return value.copy()

    def __float__(self) -> float:
        return float(self.numpy())

    def item(self) -> float:
        return float(self)

    def __array__(self, dtype=None, copy=None):
        value = self.numpy()
        return value if dtype is None else value.astype(dtype)

    def __repr__(self) -> str:
        return f"DeviceLoss(step={self._step}, dtype={self.dtype})"


def _inference_graph(graph: Graph, loss: str) -> Graph:
    """The graph without its buffer updates and its loss output (kept when no other output is left), and without
    the inputs only those read."""
    dropped = [n for n in graph.outputs if n.startswith(BUFFER_UPDATE_PREFIX)]
    if len(graph.outputs) > len(dropped) + 1:
        dropped.append(loss)
    if not dropped:
        return graph
    inference = graph.clone()
    for name in dropped:
        del inference.outputs[name]
    eliminate_dead_code(inference)
    used = {v for node in inference.nodes for v in node.inputs} | set(inference.outputs.values())
    inference.inputs = [v for v in inference.inputs if v in used]
    return inference


def _buffer_names(graph: Graph) -> list[str]:
    """The parameters that outputs ``BUFFER_UPDATE_PREFIX + name`` update, checked: float32, same shape."""
    names = []
    for output, value in graph.outputs.items():
        if not output.startswith(BUFFER_UPDATE_PREFIX):
            continue
        name = output[len(BUFFER_UPDATE_PREFIX):]
        param = graph.params.get(name)
        if param is None:
            raise ValueError(f"graph: output '{output}' updates a buffer, but the graph has no parameter {name!r}")
        if param.type.dtype != "float32" or value.type != param.type:
            raise ValueError(f"graph: output '{output}' ({value.type}) must have the type of the float32 buffer "
                             f"{name!r} ({param.type})")
        names.append(name)
    return names


def _check_data(data: dict, graph: Graph) -> int:
    """The number of examples, after checking the arrays: one per input, the same first dim, no NaN or inf."""
    if not isinstance(data, dict) or not data:
        raise TypeError(f"data: expected a dict of input name -> array, got {type(data).__name__}")
    names = {v.name for v in graph.inputs}
    if set(data) != names:
        raise ValueError(f"data: expected arrays for the inputs {sorted(names)}, got {sorted(data)}")
    counts = {name: len(array) for name, array in data.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"data: every array needs the same first dim (one row per example), got {counts}")
    for name, array in data.items():
        dtype = np.dtype(getattr(array, "dtype", np.int64))
        if dtype.kind != "f" and dtype.name not in FLOAT_DTYPES:  # bfloat16 (ml_dtypes) is not of kind "f"
            continue
        rows = np.flatnonzero(~np.isfinite(np.asarray(array, np.float32).reshape(len(array), -1)).all(axis=1))
        if len(rows):
            values = np.asarray(array[rows[0]], np.float32).ravel()
            raise ValueError(f"data['{name}']: row {rows[0]} holds a non-finite value "
                             f"({values[~np.isfinite(values)][0]}); {len(rows)} row(s) in all have NaN or inf "
                             f"(rows {rows[:5].tolist()}{' ...' if len(rows) > 5 else ''}): drop or fix them")
    return next(iter(counts.values()))


def _write_checkpoint(tensors: dict, path, metadata: dict) -> None:
    """safetensors' save_file (which writes a temporary file next to ``path`` and renames it, removing it when
    that fails), with its errors as OSErrors naming ``path`` and the cause."""
    save_file = require("safetensors.numpy", "Trainer.save").save_file
    try:
        save_file(tensors, os.fspath(path), metadata=metadata)
    except Exception as error:  # safetensors raises its own SafetensorError around the OS error
        parent = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            cause = "it is a directory (give a file name, such as checkpoint.safetensors, inside it)"
        elif not os.path.isdir(parent):
            cause = f"the directory {parent} does not exist"
        else:
            cause = str(error).split(" at path ")[0]  # safetensors names its temporary file, not the user's
        raise OSError(f"path: cannot save the checkpoint to {os.fspath(path)!r}: {cause}") from None


def _open_checkpoint(path):
    """safetensors' safe_open on ``path``, with errors naming ``path``: OSError when it is missing or a directory,
    ValueError when it is not a complete safetensors file."""
    safe_open = require("safetensors", "Trainer.load").safe_open
    name = os.fspath(path)
    if os.path.isdir(name):
        raise IsADirectoryError(f"path: {name!r} is a directory, not a checkpoint file")
    if not os.path.exists(name):
        raise FileNotFoundError(f"path: no checkpoint at {name!r} (no such file)")
    try:
        return safe_open(name, framework="numpy")
    except Exception as error:  # SafetensorError: the header is missing, cut short or not one
        size = os.path.getsize(name)
        what = "the file is empty" if size == 0 else f"the file ({size} bytes) is corrupt or truncated"
        raise ValueError(f"path: {name!r} is not a readable safetensors checkpoint: {what} ({error})") from None


def _nonfinite_entries(what: str, array) -> list[str]:
    """[a description of ``array``'s non-finite elements] when it has some, else []."""
    bad = ~np.isfinite(np.asarray(array, np.float64))
    if not bad.any():
        return []
    return [f"{what} ({int(bad.sum())} of {bad.size} elements NaN or inf)"]


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    tqdm = require("tqdm.auto", "Trainer.fit's progress bar (progress=False goes without)").tqdm
    return tqdm(total=total, unit="step", leave=True)
