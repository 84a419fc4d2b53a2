"""Arithmetic on dims: an int, or a symbolic dim bound at run time.

A symbolic dim is a name (``"batch"``) or a product of names and one integer factor, written in one canonical form
(``"12*batch*seq"``: the factor first, then the names sorted), so equal products compare equal as strings. That is
what exporters' shape arithmetic makes of sizes (``batch * seq`` rows, ``heads * head_dim`` columns, the size
divided back); a sum of dims is not a dim here. ``evaluate`` turns one into an int once its names are bound.
"""
from __future__ import annotations

from collections import Counter

Dim = int | str


def _factors(dim: Dim) -> tuple[int, Counter]:
    """(integer factor, names with their powers) of a dim."""
    if isinstance(dim, bool) or not isinstance(dim, (int, str)):
        raise TypeError(f"dim: expected an int or a symbolic name, got {type(dim).__name__} ({dim!r})")
    if isinstance(dim, int):
        return dim, Counter()
    factor, names = 1, Counter()
    for part in dim.split("*"):
        part = part.strip()
        if part.lstrip("-").isdigit():
            factor *= int(part)
        elif part:
            names[part] += 1
        else:
            raise ValueError(f"dim: {dim!r} is not a product of names and integers")
    return factor, names


def _canonical(factor: int, names: Counter) -> Dim:
    if not names or factor == 0:
        return factor
    parts = [name for name in sorted(names) for _ in range(names[name])]
    return "*".join(([str(factor)] if factor != 1 else []) + parts)


def product(*dims: Dim) -> Dim:
    """The product of dims: an int when all are ints, else the canonical symbolic product."""
    factor, names = 1, Counter()
    for dim in dims:
        f, n = _factors(dim)
        factor *= f
        names.update(n)
    return _canonical(factor, names)


def quotient(numerator: Dim, denominator: Dim) -> Dim:
    """``numerator / denominator`` when it divides exactly (every name of the denominator in the numerator, the
    integer factor a multiple); raises ValueError otherwise (a size no shape can have)."""
    f_num, n_num = _factors(numerator)
    f_den, n_den = _factors(denominator)
    if f_den == 0 or f_num % f_den or any(n_num[name] < power for name, power in n_den.items()):
        raise ValueError(f"dim: {numerator!r} is not a multiple of {denominator!r}")
    return _canonical(f_num // f_den, n_num - n_den)


def is_symbolic(dim: Dim) -> bool:
    return isinstance(dim, str)


def names(dim: Dim) -> set[str]:
    """The symbolic names a dim is made of."""
    return set(_factors(dim)[1])


def evaluate(dim: Dim, bound: dict[str, int]) -> Dim:
    """The dim with its names replaced by their bound sizes: an int when every name is bound, else the product of
    what remains."""
    factor, counts = _factors(dim)
    left = Counter()
    for name, power in counts.items():
        if name in bound:
            factor *= bound[name] ** power
        else:
            left[name] = power
    return _canonical(factor, left)


def bind_shape(shape, bound: dict[str, int]) -> tuple:
    """Every dim of ``shape`` evaluated with ``bound`` (ints and symbolic dims; -1 and other ints unchanged)."""
    return tuple(evaluate(d, bound) if isinstance(d, str) else d for d in shape)
