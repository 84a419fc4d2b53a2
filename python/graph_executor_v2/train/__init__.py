"""Training: ``Trainer`` (compile once, train many), optimizers and learning-rate schedules, loss builders."""
from ..nn.losses import cross_entropy, mse
from .optimizers import SGD, Adam, AdamW, Constant, Cosine, DynamicLossScale, LinearWarmup
from .trainer import Trainer

__all__ = ["SGD", "Adam", "AdamW", "Constant", "Cosine", "DynamicLossScale", "LinearWarmup",
           "Trainer", "cross_entropy", "mse"]
