"""``python -m graph_executor_v2 train-digits``: an MLP or a CNN trained on scikit-learn's handwritten digits.

1797 8x8 images of the digits 0-9 (``sklearn.datasets.load_digits``, shipped inside scikit-learn) are split 80/20
(stratified), scaled to [0, 1], and trained with AdamW by ``ge2.train.Trainer``, one plan per step, with a progress
bar:
- ``--model mlp`` (the default): an MLP 64 -> 128 -> 10 (ReLU, softmax cross-entropy); the job fails below 95%;
- ``--model cnn``: the images as 1x8x8, conv-bn-relu blocks with max pooling and a linear head, written with
  ``ge2.nn`` (``DigitsCnn``); batch norm trains on batch statistics and keeps running ones (the trainer's buffers),
  and the test accuracy comes from the eval-mode graph on the running statistics; the job fails below 97%. Its
  graph has a concrete batch (conv2d plans need one), so each epoch drops its last partial batch.
Reports the test accuracy and writes the loss curve as a PNG when matplotlib is installed.
"""
from __future__ import annotations

import os
import time

import numpy as np

from .. import device as _device
from .. import nn
from .._optional import require
from ..ir import Graph
from ..runtime import ExecutorV2
from ..nn.losses import cross_entropy
from ..train.optimizers import AdamW, Cosine
from ..train.trainer import Trainer

REQUIRED_ACCURACY = 0.95  # the MLP's bar
REQUIRED_CNN_ACCURACY = 0.97
DEFAULT_EPOCHS = {"mlp": 30, "cnn": 15}


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


class DigitsCnn(nn.Module):
    """1x8x8 -> [conv3x3-bn-relu] x2 (width) -> maxpool 2 -> conv3x3-bn-relu (2 width) -> maxpool 2 -> linear (2 x 2 x
    2 width -> 10). ``forward(g, x, labels)`` gives the logits and the mean cross-entropy; ``forward(g, x)`` the
    logits."""

    def __init__(self, width: int = 16):
        super().__init__()

        def block(inputs, outputs):
            return [nn.Conv2d(inputs, outputs, 3, padding=1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU()]

        self.features = nn.Sequential(*block(1, width), *block(width, width), nn.MaxPool2d(2),
                                      *block(width, 2 * width), nn.MaxPool2d(2), nn.Flatten())
        self.head = nn.Linear(2 * width * 2 * 2, 10)

    def forward(self, g, x, labels=None):
        logits = self.head(g, self.features(g, x))
        if labels is None:
            return {"logits": logits}
        return {"logits": logits, "loss": cross_entropy(g, logits, labels)}


def load_split(seed: int):
    """(x_train, y_train, x_test, y_test): float32 pixels in [0, 1], int64 labels, a stratified 80/20 split."""
    load_digits = require("sklearn.datasets", "the digits data set (scikit-learn's)").load_digits
    train_test_split = require("sklearn.model_selection", "the digits data set (scikit-learn's)").train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, stratify=y, random_state=seed)
    return x_train, y_train, x_test, y_test


def train_digits(device: str = "auto", epochs: int | None = None, batch_size: int = 64, hidden: int = 128,
                 lr: float = 3e-3, seed: int = 0, plot: str | None = "runs/digits_loss.png", progress: bool = True,
                 model: str = "mlp", width: int = 16) -> dict:
    """Trains and evaluates ``model`` ("mlp": ``hidden`` units; "cnn": ``DigitsCnn(width)``) for ``epochs`` (None:
    the model's default); returns {"accuracy", "history", "seconds", "device", "plot", "trainer", "model"}."""
    if model not in DEFAULT_EPOCHS:
        raise ValueError(f"model: expected 'mlp' or 'cnn', got {model!r}")
    if device == "auto":
        device = "cuda" if _device.device_count() > 0 else "cpu"
    epochs = DEFAULT_EPOCHS[model] if epochs is None else epochs
    x_train, y_train, x_test, y_test = load_split(seed)
    cnn = model == "cnn"
    if cnn:  # the images as 1x8x8; the graph is built for one batch size, so partial batches are dropped
        x_train, x_test = x_train.reshape(-1, 1, 8, 8), x_test.reshape(-1, 1, 8, 8)
        nn.manual_seed(seed)
        network = DigitsCnn(width)
        graph = network.graph({"x": ((batch_size, 1, 8, 8), "float32"), "labels": ((batch_size,), "int64")},
                              name="digits_cnn")
        steps = epochs * (len(x_train) // batch_size)
    else:
        graph = digits_graph(np.random.default_rng(seed), hidden)
        steps = epochs * -(-len(x_train) // batch_size)
    trainer = Trainer(graph, loss="loss", device=device,
                      optimizer=AdamW(lr=Cosine(lr, total_steps=steps, warmup_steps=steps // 20),
                                      weight_decay=1e-4))
    start = time.perf_counter()
    history = trainer.fit({"x": x_train, "labels": y_train}, epochs=epochs, batch_size=batch_size, shuffle=True,
                          seed=seed, progress=progress, drop_last=cnn)
    seconds = time.perf_counter() - start
    if cnn:  # evaluation in eval mode: batch norm on the running statistics the training left
        network.load_state_dict({**trainer.parameters(), **trainer.buffers()})
        evaluation = ExecutorV2(network.eval().graph({"x": (x_test.shape, "float32")}, name="digits_cnn_eval"),
                                device=device)
        logits = evaluation.run({"x": x_test})["logits"]
    else:
        logits = trainer.executor().run({"x": x_test})["logits"]
    accuracy = float((np.asarray(logits).argmax(axis=1) == y_test).mean())
    written = _plot(history["loss"], plot, epochs, model) if plot else None
    return {"accuracy": accuracy, "history": history, "seconds": seconds, "device": device, "plot": written,
            "trainer": trainer, "model": model}


def _plot(losses, path: str, epochs: int, model: str) -> str | None:
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
    axis.set_title(f"digits {model.upper()}, {epochs} epochs")
    figure.tight_layout()
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def main(arguments) -> int:
    result = train_digits("cpu" if arguments.cpu else "auto", arguments.epochs, arguments.batch_size,
                          arguments.hidden, arguments.lr, arguments.seed, arguments.plot or None,
                          model=arguments.model, width=arguments.width)
    trainer = result["trainer"]
    print(trainer.explain())
    history = result["history"]
    print(f"\ntrained {len(history['loss'])} steps in {result['seconds']:.2f} s on {result['device']}: "
          f"loss {history['epoch_loss'][0]:.4f} (epoch 1) -> {history['epoch_loss'][-1]:.4f} "
          f"(epoch {len(history['epoch_loss'])})")
    required = REQUIRED_CNN_ACCURACY if result["model"] == "cnn" else REQUIRED_ACCURACY
    print(f"test accuracy ({result['model']}): {result['accuracy'] * 100:.2f}% (required >= {required * 100:.0f}%)")
    if result["plot"]:
        print(f"loss curve: written to {result['plot']}")
    elif arguments.plot:
        print("loss curve: not written: matplotlib is not installed (pip install graph_executor_v2[plot])")
    return 0 if result["accuracy"] >= required else 1
