"""``python -m graph_executor_v2 train-gpt``: a small GPT trained on the Python standard library's own source.

The text is ``datasets.python_source_corpus()`` (a fixed, sorted list of ``Lib/*.py`` modules, the last 10% held
out), read as bytes: a vocabulary of 256. ``models.gpt.GPT`` is trained by ``ge2.train.Trainer`` (AdamW, linear
warm-up then cosine decay, gradient clipping, one plan per step; on the GPU mixed precision in bfloat16 and the
step captured as one CUDA graph) on random windows of the training bytes, with a progress bar. The validation loss
is measured every ``eval_every`` steps on fixed windows of the held-out bytes, and the report compares it with the
unigram entropy of the bytes (the loss of the best model that ignores context). The loss curve is written as a PNG
when matplotlib is installed.

Defaults: on the GPU 4 layers, 4 heads, 256 wide, context 128; on the CPU backend (``--cpu``, or no GPU) a tiny
configuration that trains in seconds.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from .. import device as _device
from .. import nn
from .._optional import require
from ..datasets import python_source_corpus, random_windows, unigram_entropy
from ..models.gpt import GPT, GPTConfig
from ..train.optimizers import AdamW, Cosine
from ..train.trainer import Trainer


@dataclass(frozen=True)
class RunConfig:
    """A training run: the model's shape, the schedule and the measurements."""

    layers: int
    heads: int
    width: int
    context: int
    batch_size: int
    steps: int
    lr: float
    warmup_steps: int
    eval_every: int
    eval_batches: int
    amp: str | None
    min_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    log_every: int = 10  # steps between reads of the training loss (each read is a host synchronization)
    seed: int = 0

    def __post_init__(self):
        for name in ("layers", "heads", "width", "context", "batch_size", "steps", "eval_every", "eval_batches",
                     "log_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or not (
                0 <= self.warmup_steps < self.steps):
            raise ValueError(f"warmup_steps: expected an int in [0, steps={self.steps}), got {self.warmup_steps!r}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr: expected a positive float, got {self.lr!r}")

    def model(self) -> GPTConfig:
        return GPTConfig(vocab=256, context=self.context, layers=self.layers, heads=self.heads, width=self.width)


GPU_DEFAULTS = RunConfig(layers=4, heads=4, width=256, context=128, batch_size=64, steps=2000, lr=2e-3,
                         warmup_steps=100, eval_every=200, eval_batches=8, amp="bfloat16")
CPU_DEFAULTS = RunConfig(layers=2, heads=2, width=48, context=32, batch_size=16, steps=200, lr=3e-3,
                         warmup_steps=20, eval_every=50, eval_batches=4, amp=None)


def train_gpt(run: RunConfig, device: str, plot: str | None = None, progress: bool = True) -> dict:
    """Trains and evaluates; returns {"history", "unigram_entropy", "seconds", "device", "plot", "trainer", ...}.

    ``history``: "step"/"loss" (the training loss every ``log_every`` steps) and "eval_step"/"val_loss" (the
    validation loss before the first step and every ``eval_every`` steps, and after the last)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    corpus = python_source_corpus(validation_fraction=0.1)
    nn.manual_seed(run.seed)
    model = GPT(run.model())
    schedule = Cosine(run.lr, total_steps=run.steps, warmup_steps=run.warmup_steps,
                      min_lr=run.lr * run.min_lr_fraction)
    trainer = Trainer(model.loss_graph(run.batch_size), loss="loss", device=device, amp=run.amp,
                      optimizer=AdamW(lr=schedule, weight_decay=run.weight_decay), grad_clip=run.grad_clip)
    # Fixed held-out windows: every evaluation sees the same bytes, so the curve moves only with the model.
    validation_rng = np.random.default_rng(run.seed + 1)
    validation = [random_windows(corpus.validation, run.batch_size, run.context, validation_rng)
                  for _ in range(run.eval_batches)]
    evaluate = trainer.executor()

    def validation_loss() -> float:
        return float(np.mean([float(evaluate.run({"ids": ids, "targets": targets})["loss"])
                              for ids, targets in validation]))

    history = {"step": [], "loss": [], "eval_step": [0], "val_loss": [validation_loss()]}
    data_rng = np.random.default_rng(run.seed)
    bar = _progress_bar(run.steps, progress)
    start = time.perf_counter()
    try:
        for step in range(1, run.steps + 1):
            ids, targets = random_windows(corpus.train, run.batch_size, run.context, data_rng)
            loss = trainer.step({"ids": ids, "targets": targets})
            if step % run.log_every == 0 or step == run.steps:
                history["step"].append(step)
                history["loss"].append(float(loss))
                if bar is not None:
                    bar.set_postfix(loss=f"{history['loss'][-1]:.3f}", val=f"{history['val_loss'][-1]:.3f}")
            if step % run.eval_every == 0 or step == run.steps:
                history["eval_step"].append(step)
                history["val_loss"].append(validation_loss())
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    entropy = unigram_entropy(corpus.train)
    written = _plot(history, entropy, plot, run) if plot else None
    return {"history": history, "unigram_entropy": entropy, "seconds": seconds, "device": device, "plot": written,
            "trainer": trainer, "run": run, "train_bytes": len(corpus.train),
            "validation_bytes": len(corpus.validation), "parameters": sum(p.data.size for p in model.parameters())}


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    tqdm = require("tqdm.auto", "train-gpt's progress bar (--no-progress goes without)").tqdm
    return tqdm(total=total, unit="step", leave=True)


def _plot(history: dict, entropy: float, path: str, run: RunConfig) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot(history["step"], history["loss"], linewidth=1, label="training")
    axis.plot(history["eval_step"], history["val_loss"], marker="o", markersize=3, label="validation")
    axis.axhline(entropy, color="gray", linestyle="--", linewidth=1, label="unigram entropy")
    axis.set_xlabel("step")
    axis.set_ylabel("loss (nats per byte)")
    axis.set_title(f"GPT {run.layers}x{run.width}, {run.heads} heads, context {run.context}: Python stdlib bytes")
    axis.legend()
    figure.tight_layout()
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def run_config(arguments, device: str) -> RunConfig:
    """The defaults of ``device`` with the command line's flags over them."""
    defaults = GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS
    given = {name: getattr(arguments, name) for name in asdict(defaults) if getattr(arguments, name, None) is not None}
    if getattr(arguments, "amp", None) == "none":
        given["amp"] = None
    if "steps" in given and "warmup_steps" not in given:  # a shorter run keeps its warm-up shorter than itself
        given["warmup_steps"] = min(defaults.warmup_steps, given["steps"] // 10)
    return replace(defaults, **given)


def main(arguments) -> int:
    device = "cpu" if arguments.cpu or _device.device_count() == 0 else "cuda"
    try:
        run = run_config(arguments, device)
        run.model()  # heads must divide width
    except ValueError as error:
        print(f"train-gpt: {error}")
        return 2
    result = train_gpt(run, device, arguments.plot or None, progress=not arguments.no_progress)
    history, entropy = result["history"], result["unigram_entropy"]
    print(f"GPT: {run.layers} layers, {run.heads} heads, {run.width} wide, context {run.context}, "
          f"{result['parameters']:,} parameters; batch {run.batch_size}, AdamW (lr {run.lr:g}, cosine, "
          f"{run.warmup_steps} warm-up steps), amp {run.amp or 'off'}, on {device}")
    print(f"data: {result['train_bytes']:,} training and {result['validation_bytes']:,} validation bytes of the "
          "Python standard library's source")
    print(f"trained {run.steps} steps in {result['seconds']:.1f} s "
          f"({result['seconds'] / run.steps * 1e3:.1f} ms per step, evaluations included)")
    print("validation loss (nats per byte): " + ", ".join(
        f"{loss:.3f} @ {step}" for step, loss in zip(history["eval_step"], history["val_loss"])))
    final = history["val_loss"][-1]
    relation = "below" if final < entropy else "NOT below"
    print(f"final validation loss {final:.4f} nats/byte ({final / math.log(2):.3f} bits/byte): {relation} the "
          f"unigram entropy {entropy:.4f} nats/byte ({entropy / math.log(2):.3f} bits/byte) by "
          f"{entropy - final:+.4f}")
    if result["plot"]:
        print(f"loss curve: written to {result['plot']}")
    elif arguments.plot:
        print("loss curve: not written: matplotlib is not installed (pip install graph_executor_v2[plot])")
    return 0
