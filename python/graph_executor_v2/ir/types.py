"""Tensor types of the IR: a shape of integer or named symbolic dimensions, and a dtype name."""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import ALL_DTYPES

Dim = int | str  # an integer extent, or a symbolic name bound at run time ("batch")


@dataclass(frozen=True)
class TensorType:
    shape: tuple[Dim, ...]
    dtype: str

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.dtype not in ALL_DTYPES:
            raise TypeError(f"TensorType.dtype: expected one of {', '.join(ALL_DTYPES)}, got {self.dtype!r}")
        for dim in self.shape:
            if isinstance(dim, bool) or not isinstance(dim, (int, str)) or (isinstance(dim, int) and dim < 0):
                raise ValueError(f"TensorType.shape: dims must be ints >= 0 or symbolic names, got {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_concrete(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int:
        if not self.is_concrete:
            raise ValueError(f"numel of a symbolic shape {self.shape}")
        count = 1
        for d in self.shape:
            count *= d
        return count

    def bind(self, dims: dict[str, int]) -> "TensorType":
        """Replaces symbolic dims with their bound values."""
        return TensorType(tuple(dims.get(d, d) if isinstance(d, str) else d for d in self.shape), self.dtype)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"
