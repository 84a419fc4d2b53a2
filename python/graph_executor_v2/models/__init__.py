"""Reference models built with ``ge2.nn``."""
from .gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
