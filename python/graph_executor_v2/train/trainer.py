"""``Trainer``: compile once, train many.

The graph is canonicalized and fused for training (``passes.TRAINING_FORWARD``), differentiated
(``autograd.backward_graph``), and the graph holding forward, loss and gradients is optimized
(``passes.TRAINING_BACKWARD``). One ``ExecutorV2`` plan per batch signature runs the whole step in one arena planned
over the step's lifetimes: forward, loss, backward, then the optimizer launches appended to the same plan (gradient
clipping and the parameter updates). Parameters (float32 masters) and optimizer states are persistent buffers
updated in place; the plan reads the parameters where they live, so nothing is copied between steps. A step feeds
the batch and launches the plan: reading the loss (``float(loss)``) is the caller's choice and the only host sync.

On ``device="cpu"`` every node and the optimizer run through the NumPy references (the CPU backend).
"""
from __future__ import annotations

import hashlib
import json
from typing import Sequence

import numpy as np

from .. import autograd
from ..dtypes import FLOAT_DTYPES, to_numpy
from ..ir.graph import Graph
from ..passes import TRAINING_BACKWARD, TRAINING_FORWARD, PassManager, resolve
from ..runtime.backends import backend_for
from ..runtime.executor import ExecutorV2, Plan
from . import optimizers as _optim
from .losses import CONSTANT_PREFIX

CHECKPOINT_FORMAT = "ge2.train/1"


class Trainer:
    """Trains the parameters of ``graph`` to minimize its scalar output ``loss``.

    ``optimizer``: ``SGD``, ``Adam`` or ``AdamW``. ``grad_clip``: clip gradients to this global L2 norm (None: no
    clipping). ``amp``: None (mixed precision is not available in this build; see the report of issue 8).
    ``trainable``: names of the parameters to train (default every float parameter not named ``const/...``); the
    others stay constant.
    """

    def __init__(self, graph: Graph, loss: str = "loss", device: str = "cpu", optimizer=None, amp=None,
                 grad_clip: float | None = None, trainable: Sequence[str] | None = None, reuse_memory: bool = True):
        if not isinstance(graph, Graph):
            raise TypeError(f"graph: expected a ge2.ir.Graph, got {type(graph).__name__}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
        if not isinstance(optimizer, _optim.OPTIMIZERS):
            raise TypeError(f"optimizer: expected ge2.train.SGD, Adam or AdamW, got {type(optimizer).__name__}")
        if amp is not None:
            raise ValueError(f"amp: expected None (mixed precision is not available yet), got {amp!r}")
        if grad_clip is not None:
            grad_clip = _optim._check_number("Trainer", "grad_clip", grad_clip, 0.0, low_open=True)
        autograd.loss_value(graph, loss)  # a missing or non-scalar loss fails here, naming it
        self.graph, self.loss_name, self.device = graph, loss, device
        self.optimizer, self.grad_clip, self.amp = optimizer, grad_clip, amp

        names = [n for n, v in graph.params.items() if v.type.dtype in FLOAT_DTYPES
                 and not n.startswith(CONSTANT_PREFIX)] if trainable is None else list(trainable)
        for name in names:
            if name not in graph.params:
                raise ValueError(f"trainable: unknown parameter {name!r}; graph '{graph.name}' has parameters "
                                 f"{list(graph.params)}")
            if graph.params[name].type.dtype not in FLOAT_DTYPES:
                raise TypeError(f"trainable: parameter {name!r} has dtype {graph.params[name].type.dtype}; only "
                                "float parameters are trained")
        self.forward_graph, self._forward_records = PassManager(resolve(TRAINING_FORWARD)).run(graph)
        # Parameters the loss does not read (removed by dead-code elimination) keep their values and get no update.
        self.trained = [name for name in names if name in self.forward_graph.params]
        differentiated = autograd.backward_graph(self.forward_graph, loss, wrt=self.trained)
        self.train_graph, self._backward_records = PassManager(resolve(TRAINING_BACKWARD)).run(differentiated)

        self._backend = backend_for(device)
        self._masters = {name: self._new_buffer(np.asarray(v.data, np.float32)) for name, v in graph.params.items()
                         if name in names}
        self._states = {name: {state: self._new_buffer(np.zeros(v.type.shape, np.float32))
                               for state in optimizer.state_names}
                        for name, v in graph.params.items() if name in self.trained}
        # Parameters the graph computes with in another dtype than float32 get a copy in that dtype, which the
        # optimizer rewrites from the master after every update.
        self._copies = {name: self._new_buffer(np.asarray(graph.params[name].data))
                        for name in self._masters if graph.params[name].type.dtype != "float32"}
        self.step_count = 0
        self._executor = ExecutorV2(self.train_graph, device, passes=[], reuse_memory=reuse_memory,
                                    params=self._compute_params())
        self._extended: set[int] = set()  # ids of the plans whose optimizer launches are appended
        self._inference = None

    # --- training -------------------------------------------------------------------------------------------------
    def step(self, batch: dict):
        """One training step on ``batch`` (input name -> array); returns the loss as a 0-d array."""
        plan = self._plan(batch)
        backend = self._backend
        stream = backend.default_stream()
        for value in plan.graph.inputs:
            backend.feed(plan.slots[value.name], batch[value.name], value.name, stream)
        self.step_count += 1
        for launch, ins, outs in plan.steps:
            launch(ins, outs, stream)
        loss = plan.graph.outputs[self.loss_name]
        return backend.fetch(plan.slots[loss.name], loss.type, stream)

    def fit(self, data: dict, epochs: int = 1, batch_size: int = 32, shuffle: bool = True, seed: int = 0,
            progress: bool = True) -> dict:
        """Trains over ``data`` (input name -> array, all with the same first dim) for ``epochs``, in batches (the
        last one may be smaller), with a tqdm progress bar. Returns {"loss": per-step losses, "epoch_loss": the
        mean loss of each epoch}."""
        count = _check_data(data, self.train_graph)
        for name, value in (("epochs", epochs), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        rng = np.random.default_rng(seed)
        steps_per_epoch = -(-count // batch_size)
        history = {"loss": [], "epoch_loss": []}
        bar = _progress_bar(epochs * steps_per_epoch, progress)
        try:
            for _ in range(epochs):
                order = rng.permutation(count) if shuffle else np.arange(count)
                epoch_losses = []
                for start in range(0, count, batch_size):
                    index = order[start:start + batch_size]
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
        return {name: self._to_host(buffer) for name, buffer in self._masters.items()}

    def executor(self, device: str | None = None) -> ExecutorV2:
        """An ExecutorV2 running the graph on the current parameters (the trainer's own buffers, no copy: later
        steps are seen by it)."""
        if self._inference is None:
            self._inference = ExecutorV2(self.graph, self.device, passes=TRAINING_FORWARD,
                                         params=self._compute_params())
        return self._inference

    def save(self, path) -> None:
        """A safetensors file with the parameters, the optimizer state and the step (metadata: the graph's
        fingerprint and the optimizer's hyper-parameters)."""
        from safetensors.numpy import save_file

        tensors = {f"param/{name}": value for name, value in self.parameters().items()}
        for name, states in self._states.items():
            tensors.update((f"state/{name}/{state}", self._to_host(buffer)) for state, buffer in states.items())
        tensors["step"] = np.array(self.step_count, np.int64)
        metadata = {"format": CHECKPOINT_FORMAT, "graph": self.fingerprint(),
                    "optimizer": json.dumps(_optim.describe(self.optimizer))}
        save_file(tensors, str(path), metadata=metadata)

    def load(self, path) -> None:
        """Restores a checkpoint written by ``save`` for the same graph (ValueError otherwise)."""
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as file:
            metadata = file.metadata() or {}
            if metadata.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(f"path: {path} is not a ge2.train checkpoint (format {metadata.get('format')!r})")
            if metadata.get("graph") != self.fingerprint():
                raise ValueError(f"path: the checkpoint {path} was saved from another graph (its parameters, "
                                 f"shapes or dtypes differ from graph '{self.graph.name}')")
            expected = {f"param/{name}" for name in self._masters} | {"step"} | {
                f"state/{name}/{state}" for name, states in self._states.items() for state in states}
            missing = sorted(expected - set(file.keys()))
            if missing:
                raise ValueError(f"path: the checkpoint {path} lacks {missing} (saved with another optimizer?)")
            tensors = {key: file.get_tensor(key) for key in expected}
        for name, buffer in self._masters.items():
            self._write(buffer, tensors[f"param/{name}"])
        for name, states in self._states.items():
            for state, buffer in states.items():
                self._write(buffer, tensors[f"state/{name}/{state}"])
        for name, copy in self._copies.items():
            self._write(copy, tensors[f"param/{name}"])
        self.step_count = int(tensors["step"])

    def fingerprint(self) -> str:
        """A hash of the graph's name, parameters (names, shapes, dtypes) and trained set."""
        params = sorted((name, list(v.type.shape), v.type.dtype) for name, v in self.graph.params.items())
        described = [self.graph.name, params, self.trained]
        return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]

    # --- reporting ------------------------------------------------------------------------------------------------
    @property
    def peak_bytes(self) -> int:
        """Device (or host) bytes of the largest step plan built so far: its arena (activations, gradients,
        temporaries) plus the persistent parameters and optimizer states."""
        arenas = [plan.memory.arena_bytes for plan in self._executor.plans]
        return (max(arenas) if arenas else 0) + self.persistent_bytes

    @property
    def persistent_bytes(self) -> int:
        buffers = list(self._masters.values()) + [b for states in self._states.values() for b in states.values()]
        return sum(int(np.prod(b.shape)) * 4 for b in buffers)

    def explain(self) -> str:
        graph = self.train_graph
        backward = _backward_nodes(graph)
        forward_nodes = [n for n in graph.nodes if n not in backward]
        lines = [f"Trainer '{self.graph.name}' on {self.device}: loss '{self.loss_name}', "
                 f"{len(self.trained)} trained parameter(s), optimizer {_optim.describe(self.optimizer)}",
                 f"forward ({len(forward_nodes)} nodes): " + ", ".join(f"{n.name}={n.op}" for n in forward_nodes),
                 f"backward ({len(backward)} nodes): " + ", ".join(f"{n.name}={n.op}" for n in graph.nodes
                                                                   if n in backward)]
        fusions = [note for record in self._forward_records + self._backward_records for note in record.notes
                   if record.name in ("fuse_relu", "chain_activation_backward", "trim_gemm_backward")]
        lines.append(f"fusions: {len(fusions)}")
        lines += [f"  {note}" for note in fusions]
        clip = f"clip to global norm {self.grad_clip}, " if self.grad_clip else ""
        lines.append(f"optimizer: {clip}{type(self.optimizer).__name__} on {len(self.trained)} parameter(s), states "
                     f"{list(self.optimizer.state_names)}")
        lines.append(f"memory: persistent {self.persistent_bytes / 2**20:.3g} MB (float32 masters and states), "
                     f"peak {self.peak_bytes / 2**20:.3g} MB")
        lines.append(self._executor.explain())
        return "\n".join(lines)

    # --- internals ------------------------------------------------------------------------------------------------
    def _plan(self, batch: dict) -> Plan:
        if not isinstance(batch, dict):
            raise TypeError(f"batch: expected a dict of input name -> array, got {type(batch).__name__}")
        try:
            plan = self._executor.plan_for(batch)
        except (ValueError, TypeError) as error:
            raise type(error)(f"batch: {error}") from None
        if id(plan) not in self._extended:
            plan.steps.append(self._optimizer_launch(plan))
            self._extended.add(id(plan))
        return plan

    def _optimizer_launch(self, plan: Plan) -> tuple:
        """The optimizer as the plan's last step: clipping and every parameter's update, reading the gradient
        slots of this plan and writing the masters and states in place."""
        grads = [plan.slots[plan.graph.outputs[autograd.grad_name(name)].name] for name in self.trained]
        params = [self._masters[name] for name in self.trained]
        copies = [self._copies.get(name) for name in self.trained]
        states = [self._states[name] for name in self.trained]
        optimizer, max_norm = self.optimizer, self.grad_clip
        if self.device != "cpu":
            raise NotImplementedError  # replaced by the device optimizer kernels (issue 8, optim op)

        def launch(ins, outs, stream):
            scale = 1.0 if max_norm is None else _optim.clip_coefficient(grads, max_norm)
            for param, grad, state, copy in zip(params, grads, states, copies):
                _optim.update(optimizer, self.step_count, param, grad if scale == 1.0 else grad * scale, state)
                if copy is not None:
                    copy[...] = param.astype(copy.dtype)

        return launch, (), ()

    def _compute_params(self) -> dict:
        """The buffers the plans read as parameters: the masters, or their copies in the graph's dtype."""
        return {name: self._copies.get(name, master) for name, master in self._masters.items()}

    def _new_buffer(self, array: np.ndarray):
        if self.device == "cpu":
            return np.array(array, copy=True)
        return self._backend.upload(array)

    def _write(self, buffer, array: np.ndarray) -> None:
        array = np.asarray(array).astype(buffer.dtype if self.device == "cpu" else to_numpy(buffer.dtype))
        array = array.reshape(buffer.shape)
        if self.device == "cpu":
            buffer[...] = array
        else:
            buffer.copy_from_numpy(array)

    def _to_host(self, buffer) -> np.ndarray:
        return buffer.copy() if self.device == "cpu" else buffer.numpy()


def _backward_nodes(graph: Graph) -> set:
    """The nodes that depend on the loss's gradient seed."""
    seed = graph.params.get(autograd.SEED)
    reached, nodes = {seed}, set()
    for node in graph.nodes:
        if any(v is not None and v in reached for v in node.inputs):
            nodes.add(node)
            reached.update(node.outputs)
    return nodes


def _check_data(data: dict, graph: Graph) -> int:
    if not isinstance(data, dict) or not data:
        raise TypeError(f"data: expected a dict of input name -> array, got {type(data).__name__}")
    names = {v.name for v in graph.inputs}
    if set(data) != names:
        raise ValueError(f"data: expected arrays for the inputs {sorted(names)}, got {sorted(data)}")
    counts = {name: len(array) for name, array in data.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"data: every array needs the same first dim (one row per example), got {counts}")
    return next(iter(counts.values()))


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="step", leave=True)
