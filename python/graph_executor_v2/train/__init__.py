"""Training: ``Trainer`` (compile once, train many), optimizers and learning-rate schedules, loss builders."""
from ..nn.losses import cross_entropy, mse
from ..passes.fp8 import DelayedScaling
from .optimizers import SGD, Adam, AdamW, Constant, Cosine, DynamicLossScale, LinearWarmup
from .trainer import Trainer

__all__ = ["SGD", "Adam", "AdamW", "Constant", "Cosine", "DelayedScaling", "DynamicLossScale", "LinearWarmup",
           "Trainer", "cross_entropy", "mse"]
