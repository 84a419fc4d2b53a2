"""``python -m graph_executor_v2 train-digits``: an MLP trained on scikit-learn's handwritten digits.

1797 8x8 images of the digits 0-9 (``sklearn.datasets.load_digits``, shipped inside scikit-learn) are split 80/20
(stratified), scaled to [0, 1], and an MLP 64 -> 128 -> 10 (ReLU, softmax cross-entropy) is trained with AdamW by
``ge2.train.Trainer``, one plan per step, with a progress bar. Reports the test accuracy (the job fails below 95%)
and writes the loss curve as a PNG when matplotlib is installed.
"""
from __future__ import annotations

import time

import numpy as np

from .. import device as _device
from ..ir import Graph
from .losses import cross_entropy
from .optimizers import AdamW, Cosine
from .trainer import Trainer

REQUIRED_ACCURACY = 0.95


def digits_graph(rng: np.random.Generator, hidden: int = 128) -> Graph:
    """The MLP 64 -> hidden -> 10 with its loss, initialized as torch.nn.Linear (uniform +-1/sqrt(fan_in))."""
    g = Graph("digits_mlp")
    x = g.input("x", ("batch", 64), "float32")
    labels = g.input("labels", ("batch",), "int64")

    def linear(h, fan_in, fan_out, index):
        bound = fan_in ** -0.5
        w = g.param(f"w{index}", rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32))
        b = g.param(f"b{index}", rng.uniform(-bound, bound, fan_out).astype(np.float32))
        return g.add(g.matmul(h, w), b)

    logits = linear(g.relu(linear(x, 64, hidden, 1)), hidden, 10, 2)
    g.output(logits, "logits")
    g.output(cross_entropy(g, logits, labels), "loss")
    return g


def load_split(seed: int):
    """(x_train, y_train, x_test, y_test): float32 pixels in [0, 1], int64 labels, a stratified 80/20 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    return x_train, y_train, x_test, y_test


def train_digits(device: str = "auto", epochs: int = 30, batch_size: int = 64, hidden: int = 128, lr: float = 3e-3,
                 seed: int = 0, plot: str | None = "digits_loss.png", progress: bool = True) -> dict:
    """Trains and evaluates; returns {"accuracy", "history", "seconds", "device", "plot"}."""
    if device == "auto":
        device = "cuda" if _device.device_count() > 0 else "cpu"
    x_train, y_train, x_test, y_test = load_split(seed)
    steps = epochs * -(-len(x_train) // batch_size)
    trainer = Trainer(digits_graph(np.random.default_rng(seed), hidden), loss="loss", device=device,
                      optimizer=AdamW(lr=Cosine(lr, total_steps=steps, warmup_steps=steps // 20),
                                      weight_decay=1e-4))
    start = time.perf_counter()
    history = trainer.fit({"x": x_train, "labels": y_train}, epochs=epochs, batch_size=batch_size, shuffle=True,
                          seed=seed, progress=progress)
    seconds = time.perf_counter() - start
    logits = trainer.executor().run({"x": x_test})["logits"]
    accuracy = float((np.asarray(logits).argmax(axis=1) == y_test).mean())
    written = _plot(history["loss"], plot, epochs) if plot else None
    return {"accuracy": accuracy, "history": history, "seconds": seconds, "device": device, "plot": written,
            "trainer": trainer}


def _plot(losses, path: str, epochs: int) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot(np.arange(1, len(losses) + 1), losses, linewidth=1)
    axis.set_xlabel("step")
    axis.set_ylabel("training loss")
    axis.set_yscale("log")
    axis.set_title(f"digits MLP, {epochs} epochs")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def main(arguments) -> int:
    result = train_digits("cpu" if arguments.cpu else "auto", arguments.epochs, arguments.batch_size,
                          arguments.hidden, arguments.lr, arguments.seed, arguments.plot or None)
    trainer = result["trainer"]
    print(trainer.explain())
    history = result["history"]
    print(f"\ntrained {len(history['loss'])} steps in {result['seconds']:.2f} s on {result['device']}: "
          f"loss {history['epoch_loss'][0]:.4f} (epoch 1) -> {history['epoch_loss'][-1]:.4f} "
          f"(epoch {len(history['epoch_loss'])})")
    print(f"test accuracy: {result['accuracy'] * 100:.2f}% (required >= {REQUIRED_ACCURACY * 100:.0f}%)")
    if result["plot"]:
        print(f"loss curve: {result['plot']}")
    elif arguments.plot:
        print("loss curve: not written (pip install matplotlib, or the [plot] extra)")
    return 0 if result["accuracy"] >= REQUIRED_ACCURACY else 1
