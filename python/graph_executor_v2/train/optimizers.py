"""Optimizers and learning-rate schedules of ``ge2.train``: hyper-parameters, checked where they are made.

``SGD`` (momentum, dampening, Nesterov, L2 weight decay), ``Adam`` (L2 weight decay) and ``AdamW`` (decoupled weight
decay) follow ``torch.optim`` exactly. ``lr`` is a float or a schedule: ``Constant``, ``LinearWarmup``, ``Cosine``
(linear warm-up then cosine decay), each a function of the 1-based step number.

``update(...)`` is the float64 reference of one step on one parameter (what the CPU backend runs, written into the
float32 master and state buffers in place).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def _check_number(owner: str, name: str, value, low: float, high: float = math.inf, low_open: bool = False,
                  high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{owner}: {name} expected a number, got {type(value).__name__} ({value!r})")
    value = float(value)
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if not math.isfinite(value) or below or above:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open or high == math.inf else ']'}"
        raise ValueError(f"{owner}: {name} must be in {interval}, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------------------------
# Learning-rate schedules
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Constant:
    lr: float

    def __post_init__(self):
        object.__setattr__(self, "lr", _check_number("Constant", "lr", self.lr, 0.0, low_open=True))

    def __call__(self, step: int) -> float:
        return self.lr


@dataclass(frozen=True)
class LinearWarmup:
    """lr * min(1, step / warmup_steps)."""

    lr: float
    warmup_steps: int

    def __post_init__(self):
        object.__setattr__(self, "lr", _check_number("LinearWarmup", "lr", self.lr, 0.0, low_open=True))
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 1:
            raise ValueError(f"LinearWarmup: warmup_steps must be an int >= 1, got {self.warmup_steps!r}")

    def __call__(self, step: int) -> float:
        return self.lr * min(1.0, step / self.warmup_steps)


@dataclass(frozen=True)
class Cosine:
    """Linear warm-up over ``warmup_steps``, then cosine decay from lr to ``min_lr`` at ``total_steps`` (and after)."""

    lr: float
    total_steps: int
    warmup_steps: int = 0
    min_lr: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "lr", _check_number("Cosine", "lr", self.lr, 0.0, low_open=True))
        object.__setattr__(self, "min_lr", _check_number("Cosine", "min_lr", self.min_lr, 0.0, self.lr))
        for name in ("total_steps", "warmup_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Cosine: {name} must be an int >= 0, got {value!r}")
        if self.total_steps <= self.warmup_steps:
            raise ValueError(f"Cosine: total_steps must be > warmup_steps ({self.warmup_steps}), got "
                             f"{self.total_steps}")

    def __call__(self, step: int) -> float:
        if step <= self.warmup_steps:
            return self.lr * step / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * progress))


def _schedule(owner: str, lr):
    if isinstance(lr, (Constant, LinearWarmup, Cosine)):
        return lr
    try:
        return Constant(lr)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{owner}: lr must be a number > 0 or a schedule (Constant, LinearWarmup, Cosine): "
                          f"{error}") from None


# ---------------------------------------------------------------------------------------------------------------
# Optimizers
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SGD:
    lr: object = 0.01
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "lr", _schedule("SGD", self.lr))
        object.__setattr__(self, "momentum", _check_number("SGD", "momentum", self.momentum, 0.0, 1.0,
                                                           high_open=True))
        object.__setattr__(self, "dampening", _check_number("SGD", "dampening", self.dampening, 0.0, 1.0))
        object.__setattr__(self, "weight_decay", _check_number("SGD", "weight_decay", self.weight_decay, 0.0))
        if not isinstance(self.nesterov, bool):
            raise TypeError(f"SGD: nesterov expected a bool, got {type(self.nesterov).__name__}")
        if self.nesterov and (self.momentum == 0.0 or self.dampening != 0.0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening 0, got momentum "
                             f"{self.momentum} and dampening {self.dampening}")

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum else ()


@dataclass(frozen=True)
class Adam:
    """Adam with L2 weight decay (added to the gradient), as torch.optim.Adam."""

    lr: object = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    decoupled = False

    def __post_init__(self):
        owner = type(self).__name__
        object.__setattr__(self, "lr", _schedule(owner, self.lr))
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise ValueError(f"{owner}: betas expected a pair (beta1, beta2), got {self.betas!r}")
        object.__setattr__(self, "betas", tuple(_check_number(owner, f"betas[{i}]", b, 0.0, 1.0, high_open=True)
                                                for i, b in enumerate(self.betas)))
        object.__setattr__(self, "eps", _check_number(owner, "eps", self.eps, 0.0, low_open=True))
        object.__setattr__(self, "weight_decay", _check_number(owner, "weight_decay", self.weight_decay, 0.0))

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class AdamW(Adam):
    """Adam with decoupled weight decay (p *= 1 - lr * weight_decay), as torch.optim.AdamW."""

    weight_decay: float = 0.01

    decoupled = True


OPTIMIZERS = (SGD, Adam, AdamW)


def describe(optimizer) -> dict:
    """The hyper-parameters as plain JSON values (a checkpoint's metadata)."""
    fields = {name: getattr(optimizer, name) for name in optimizer.__dataclass_fields__}
    fields["lr"] = {"schedule": type(optimizer.lr).__name__, **optimizer.lr.__dict__}
    return {"optimizer": type(optimizer).__name__, **{k: list(v) if isinstance(v, tuple) else v
                                                      for k, v in fields.items()}}


def update(optimizer, step: int, param: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray]) -> None:
    """One step (1-based ``step``) on ``param`` and its ``state`` buffers, in place, float64 math."""
    p, g = param.astype(np.float64), grad.astype(np.float64)
    lr = optimizer.lr(step)
    if isinstance(optimizer, SGD):
        if optimizer.weight_decay:
            g = g + optimizer.weight_decay * p
        if optimizer.momentum:
            buffer = state["momentum_buffer"]
            b = g if step == 1 else optimizer.momentum * buffer.astype(np.float64) + (1 - optimizer.dampening) * g
            buffer[...] = b
            g = g + optimizer.momentum * b if optimizer.nesterov else b
        param[...] = p - lr * g
        return
    beta1, beta2 = optimizer.betas
    if optimizer.decoupled:
        p = p * (1.0 - lr * optimizer.weight_decay)
    elif optimizer.weight_decay:
        g = g + optimizer.weight_decay * p
    m = beta1 * state["exp_avg"].astype(np.float64) + (1 - beta1) * g
    v = beta2 * state["exp_avg_sq"].astype(np.float64) + (1 - beta2) * g * g
    state["exp_avg"][...] = m
    state["exp_avg_sq"][...] = v
    bias1, bias2 = 1 - beta1 ** step, 1 - beta2 ** step
    param[...] = p - (lr / bias1) * m / (np.sqrt(v) / math.sqrt(bias2) + optimizer.eps)


def clip_coefficient(grads: list[np.ndarray], max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (global L2 norm + 1e-6))."""
    total = math.sqrt(sum(float(np.square(g.astype(np.float64)).sum()) for g in grads))
    return min(1.0, max_norm / (total + 1e-6))
