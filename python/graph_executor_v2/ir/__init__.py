"""GE2's intermediate representation."""
from .types import Dim, TensorType

__all__ = ["Dim", "TensorType"]
