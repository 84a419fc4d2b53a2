"""Reference models built with ``ge2.nn``."""
from .gpt import GPT, GPTConfig
from .resnet import ResNet, resnet18, resnet50

__all__ = ["GPT", "GPTConfig", "ResNet", "resnet18", "resnet50"]
