"""Tensor types of the IR: a shape of integer or named symbolic dimensions, and a dtype name."""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import ALL_DTYPES
from . import dims

Dim = int | str  # an integer extent, or a symbolic dim bound at run time ("batch", "seq+1"; see ir/dims.py)


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
                raise ValueError(f"TensorType.shape: dims must be ints >= 0 or symbolic dims, got {self.shape}")
        # Symbolic dims in their canonical form, so equal sizes compare equal ("seq + 1" is "seq+1").
        try:
            shape = tuple(dims.canonical(d) if isinstance(d, str) else d for d in self.shape)
        except ValueError as error:
            raise ValueError(f"TensorType.shape: {error} (in {tuple(self.shape)})") from None
        object.__setattr__(self, "shape", shape)

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

    def bind(self, bound: dict[str, int]) -> "TensorType":
        """Replaces symbolic dims with their bound values."""
        return TensorType(dims.bind_shape(self.shape, bound), self.dtype)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"
