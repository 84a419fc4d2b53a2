"""Optimizers and learning-rate schedules of ``ge2.train``: hyper-parameters, checked where they are made.

``SGD`` (momentum, dampening, Nesterov, L2 weight decay), ``Adam`` (L2 weight decay) and ``AdamW`` (decoupled weight
decay) follow ``torch.optim`` exactly. ``lr`` is a float or a schedule: ``Constant``, ``LinearWarmup``, ``Cosine``
(linear warm-up then cosine decay), each a function of the 1-based step number.

``to_config`` turns them (with clipping and loss scaling) into the optimizer op's ``OptimizerConfig``
(``ops/optimizer.py``), whose ``ReferenceOptimizer`` is the CPU step and ``FusedOptimizerStep`` the GPU one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ops.optimizer import _number


def check_number(owner: str, name: str, value, low: float, high: float = math.inf, low_open: bool = False,
                 high_open: bool = False) -> float:
    """A hyper-parameter checked by the optimizer op's rule, the error naming its owner ("AdamW: eps: ...")."""
    return _number(f"{owner}: {name}", value, low, high, low_open, high_open)


# ---------------------------------------------------------------------------------------------------------------
# Learning-rate schedules
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Constant:
    lr: float

    def __post_init__(self):
        object.__setattr__(self, "lr", check_number("Constant", "lr", self.lr, 0.0, low_open=True))

    def __call__(self, step: int) -> float:
        return self.lr


@dataclass(frozen=True)
class LinearWarmup:
    """lr * min(1, step / warmup_steps)."""

    lr: float
    warmup_steps: int

    def __post_init__(self):
        object.__setattr__(self, "lr", check_number("LinearWarmup", "lr", self.lr, 0.0, low_open=True))
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
        object.__setattr__(self, "lr", check_number("Cosine", "lr", self.lr, 0.0, low_open=True))
        object.__setattr__(self, "min_lr", check_number("Cosine", "min_lr", self.min_lr, 0.0, self.lr))
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
        object.__setattr__(self, "momentum", check_number("SGD", "momentum", self.momentum, 0.0, 1.0,
                                                           high_open=True))
        object.__setattr__(self, "dampening", check_number("SGD", "dampening", self.dampening, 0.0, 1.0))
        object.__setattr__(self, "weight_decay", check_number("SGD", "weight_decay", self.weight_decay, 0.0))
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
        object.__setattr__(self, "betas", tuple(check_number(owner, f"betas[{i}]", b, 0.0, 1.0, high_open=True)
                                                for i, b in enumerate(self.betas)))
        object.__setattr__(self, "eps", check_number(owner, "eps", self.eps, 0.0, low_open=True))
        object.__setattr__(self, "weight_decay", check_number(owner, "weight_decay", self.weight_decay, 0.0))

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


@dataclass(frozen=True)
class DynamicLossScale:
    """float16 loss scaling, as torch.cuda.amp.GradScaler: the loss gradient starts at ``init_scale``; a step whose
    unscaled gradients hold an inf or NaN is skipped and the scale multiplied by ``backoff_factor``; after
    ``growth_interval`` finite steps in a row it is multiplied by ``growth_factor``."""

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self):
        check_number("DynamicLossScale", "init_scale", self.init_scale, 0.0, low_open=True)
        check_number("DynamicLossScale", "growth_factor", self.growth_factor, 1.0, low_open=True)
        check_number("DynamicLossScale", "backoff_factor", self.backoff_factor, 0.0, 1.0, low_open=True,
                      high_open=True)
        if isinstance(self.growth_interval, bool) or not isinstance(self.growth_interval, int) \
                or self.growth_interval < 1:
            raise ValueError(f"DynamicLossScale: growth_interval must be an int >= 1, got {self.growth_interval!r}")


def to_config(optimizer, max_norm: float | None, loss_scale: "DynamicLossScale | None"):
    """The optimizer op's ``OptimizerConfig`` for ``optimizer`` (SGD, Adam, AdamW with its lr schedule), clipping to
    ``max_norm`` (None: none) and ``loss_scale`` (None: no loss scaling)."""
    from ..ops.optimizer import OptimizerConfig

    lr = optimizer.lr
    schedule = {"schedule": "constant", "lr": lr.lr}
    if isinstance(lr, LinearWarmup):
        schedule = {"schedule": "linear_warmup", "lr": lr.lr, "warmup_steps": lr.warmup_steps}
    elif isinstance(lr, Cosine):
        schedule = {"schedule": "cosine", "lr": lr.lr, "warmup_steps": lr.warmup_steps,
                    "total_steps": lr.total_steps, "min_lr": lr.min_lr}
    if isinstance(optimizer, SGD):
        algorithm = {"algorithm": "sgd", "momentum": optimizer.momentum, "dampening": optimizer.dampening,
                     "nesterov": optimizer.nesterov, "weight_decay": optimizer.weight_decay}
    else:
        algorithm = {"algorithm": "adamw" if optimizer.decoupled else "adam", "betas": optimizer.betas,
                     "eps": optimizer.eps, "weight_decay": optimizer.weight_decay}
    scaling = {} if loss_scale is None else {
        "loss_scaling": True, "init_scale": loss_scale.init_scale, "growth_factor": loss_scale.growth_factor,
        "backoff_factor": loss_scale.backoff_factor, "growth_interval": loss_scale.growth_interval}
    return OptimizerConfig(**algorithm, **schedule, **scaling, max_norm=max_norm)
