"""Arithmetic on dims: an int, or a symbolic dim bound at run time.

A symbolic dim is an integer polynomial of names, written as a Python expression in one canonical form, so equal
expressions compare equal as strings: ``"batch"``, ``"12*batch*seq"`` (a product: the factor first, then the names
sorted), ``"seq+1"``, ``"2*seq-1"``, ``"s//2"`` (a floor division by an integer that does not divide, kept as one
term), ``"(s+1)//2*t"``. That is what exporters' shape arithmetic makes of sizes: ``batch * seq`` rows,
``heads * head_dim`` columns, the size divided back, ``seq + 1`` positions after a prepended one, ``s // 2`` halves.
Names are identifiers; every name stands for a size >= 1. ``evaluate`` turns a dim into an int once its names are
bound.
"""
from __future__ import annotations

import functools
import re

Dim = int | str

# A polynomial: monomial (sorted tuple of terms, with repeats for powers) -> integer coefficient, no zero
# coefficients; () is the constant. A term is a name, or a floor division "(P)//k" of a polynomial that k does not
# divide (kept whole, like a name).
_Poly = dict

_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|\*\*|[-+*()]))")


def _check(dim: Dim) -> None:
    if isinstance(dim, bool) or not isinstance(dim, (int, str)):
        raise TypeError(f"dim: expected an int or a symbolic name, got {type(dim).__name__} ({dim!r})")


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> tuple:
    """The polynomial of a dim's text, as a sorted tuple of (monomial, coefficient) (hashable, cached)."""
    tokens, position = [], 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            if text[position:].strip() == "":
                break
            raise ValueError(f"dim: {text!r} is not an integer expression of names (+, -, *, // and parentheses)")
        tokens.append(match.group(1) or match.group(2) or match.group(3))
        position = match.end()
    parser = _Parser(tokens, text)
    poly = parser.expression()
    if parser.index != len(tokens):
        raise ValueError(f"dim: {text!r} is not an integer expression of names (+, -, *, // and parentheses)")
    return tuple(sorted(poly.items()))


class _Parser:
    """Recursive descent over Python's precedence: + and - below * and // (left to right), below ** (an integer
    power) and unary minus."""

    def __init__(self, tokens: list, text: str):
        self.tokens, self.text, self.index = tokens, text, 0

    def _peek(self):
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def _take(self):
        token = self._peek()
        if token is None:
            raise ValueError(f"dim: {self.text!r} ends in the middle of an expression")
        self.index += 1
        return token

    def expression(self) -> _Poly:
        poly = self.term()
        while self._peek() in ("+", "-"):
            sign = 1 if self._take() == "+" else -1
            poly = _add(poly, _scale(self.term(), sign))
        return poly

    def term(self) -> _Poly:
        poly = self.unary()
        while self._peek() in ("*", "//"):
            if self._take() == "*":
                poly = _multiply(poly, self.unary())
            else:
                divisor = self.unary()
                if set(divisor) - {()}:
                    raise ValueError(f"dim: {self.text!r} divides by a symbolic dim; // takes an integer")
                poly = _floor_divide(poly, divisor.get((), 0), self.text)
        return poly

    def unary(self) -> _Poly:
        if self._peek() == "-":
            self._take()
            return _scale(self.unary(), -1)
        poly = self.atom()
        if self._peek() == "**":
            self._take()
            exponent = self._take()
            if not exponent.isdigit():
                raise ValueError(f"dim: {self.text!r} raises to {exponent!r}; ** takes an integer exponent")
            power = _constant(1)
            for _ in range(int(exponent)):
                power = _multiply(power, poly)
            return power
        return poly

    def atom(self) -> _Poly:
        token = self._take()
        if token == "(":
            poly = self.expression()
            if self._take() != ")":
                raise ValueError(f"dim: {self.text!r} has an unclosed parenthesis")
            return poly
        if token.isdigit():
            return _constant(int(token))
        if token in ("+", "-", "*", "**", "//", ")"):
            raise ValueError(f"dim: {self.text!r} is not an integer expression of names")
        return {(token,): 1}


def _constant(value: int) -> _Poly:
    return {(): value} if value else {}


def _add(a: _Poly, b: _Poly) -> _Poly:
    result = dict(a)
    for monomial, coefficient in b.items():
        result[monomial] = result.get(monomial, 0) + coefficient
        if result[monomial] == 0:
            del result[monomial]
    return result


def _scale(poly: _Poly, factor: int) -> _Poly:
    return {monomial: coefficient * factor for monomial, coefficient in poly.items()} if factor else {}


def _multiply(a: _Poly, b: _Poly) -> _Poly:
    result: _Poly = {}
    for ma, ca in a.items():
        for mb, cb in b.items():
            result = _add(result, {tuple(sorted(ma + mb)): ca * cb})
    return result


def _floor_divide(poly: _Poly, divisor: int, text: str = "") -> _Poly:
    """``poly // divisor``: the multiples of ``divisor`` come out of the floor, the rest stays one term."""
    if divisor <= 0:
        raise ValueError(f"dim: {text or _format(poly)!r} floor-divided by {divisor}; expected a divisor >= 1")
    whole, rest = {}, {}
    for monomial, coefficient in poly.items():
        quotient, remainder = divmod(coefficient, divisor)
        if quotient:
            whole[monomial] = quotient
        if remainder:
            rest[monomial] = remainder
    if not rest:
        return whole
    if set(rest) == {()}:
        return whole  # 0 <= remainder < divisor: its floor is 0
    return _add(whole, {(f"({_format(rest)})//{divisor}",): 1})


def _poly(dim: Dim) -> _Poly:
    _check(dim)
    return _constant(dim) if isinstance(dim, int) else dict(_parse(dim))


def _term_text(term: str, alone: bool) -> str:
    """A term in a product: a floor division is parenthesized unless it is the whole monomial."""
    if "//" not in term:
        return term
    inner = term[1:term.rindex(")//")]
    simple = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", inner) is not None
    bare = f"{inner}{term[term.rindex(')//') + 1:]}" if simple else term
    return bare if alone else f"({bare})"


def _monomial_text(monomial: tuple, coefficient: int) -> str:
    magnitude = abs(coefficient)
    # A lone floor division stays bare only with coefficient 1: -s//2 would read as (-s)//2.
    parts = ([str(magnitude)] if magnitude != 1 else []) + [_term_text(t, len(monomial) == 1 and coefficient == 1)
                                                            for t in monomial]
    return "*".join(parts)


def _format(poly: _Poly) -> str:
    # Highest degree first, then by the terms; the constant last.
    ordered = sorted((m for m in poly if m), key=lambda m: (-len(m), m)) + ([()] if () in poly else [])
    text = ""
    for monomial in ordered:
        coefficient = poly[monomial]
        body = _monomial_text(monomial, coefficient) if monomial else str(abs(coefficient))
        sign = "-" if coefficient < 0 else ("+" if text else "")
        text += sign + body
    return text


def _dim(poly: _Poly) -> Dim:
    if not poly:
        return 0
    if set(poly) == {()}:
        return poly[()]
    return _format(poly)


@functools.lru_cache(maxsize=4096)
def canonical(dim: Dim) -> Dim:
    """``dim`` in its canonical form (an int when it has no names): ``"seq + 1"`` -> ``"seq+1"``."""
    return _dim(_poly(dim))


def product(*dims: Dim) -> Dim:
    """The product of dims: an int when all are ints, else the canonical symbolic product."""
    result = _constant(1)
    for dim in dims:
        result = _multiply(result, _poly(dim))
    return _dim(result)


def add(*dims: Dim) -> Dim:
    """The sum of dims (a concat's extent, a slice's end past a prepended element)."""
    result: _Poly = {}
    for dim in dims:
        result = _add(result, _poly(dim))
    return _dim(result)


def subtract(a: Dim, b: Dim) -> Dim:
    return _dim(_add(_poly(a), _scale(_poly(b), -1)))


def quotient(numerator: Dim, denominator: Dim) -> Dim:
    """``numerator / denominator`` when it divides exactly (a polynomial times the denominator, which is one
    product of names and an integer); raises ValueError otherwise (a size no shape can have)."""
    num, den = _poly(numerator), _poly(denominator)
    if len(den) == 1:
        (den_monomial, den_coefficient), = den.items()
        result = {}
        for monomial, coefficient in num.items():
            remaining = list(monomial)
            for term in den_monomial:
                if term not in remaining:
                    break
                remaining.remove(term)
            else:
                if coefficient % den_coefficient == 0:
                    result[tuple(remaining)] = coefficient // den_coefficient
                    continue
            break
        else:
            return _dim(result)
    elif num == den and den:
        return 1
    raise ValueError(f"dim: {numerator!r} is not a multiple of {denominator!r}")


def floor_divide(numerator: Dim, denominator: Dim) -> Dim:
    """``numerator // denominator``: the exact quotient where it divides, else a floor division by an integer
    (``"s//2"``); ValueError for a symbolic denominator that does not divide."""
    try:
        return quotient(numerator, denominator)
    except ValueError:
        if not isinstance(denominator, int):
            raise
    return _dim(_floor_divide(_poly(numerator), denominator))


def _term_lower_bound(term: str) -> int | None:
    if "//" not in term:
        return 1
    split = term.rindex(")//")
    inner = lower_bound(term[1:split])
    return None if inner is None else inner // int(term[split + 3:])


def lower_bound(dim: Dim) -> int | None:
    """The least value ``dim`` can take with every name >= 1, or None when this simple reasoning finds none (a
    monomial with a negative coefficient, a floor division of something unbounded)."""
    bound = 0
    for monomial, coefficient in _poly(dim).items():
        factors = [_term_lower_bound(term) for term in monomial]
        if not monomial:
            bound += coefficient
        elif coefficient < 0 or any(f is None or f < 0 for f in factors):
            return None
        else:
            least = coefficient
            for factor in factors:
                least *= factor
            bound += least
    return bound


def greater_or_equal(a: Dim, b: Dim) -> bool | None:
    """Whether ``a >= b`` for every binding of their names: True, False (``a < b`` for every binding), or None when
    that depends on the sizes."""
    if (lower_bound(subtract(a, b)) or 0) >= 0 and lower_bound(subtract(a, b)) is not None:
        return True
    below = lower_bound(subtract(subtract(b, a), 1))
    return False if below is not None and below >= 0 else None


def compare(a: Dim, b: Dim) -> int | None:
    """-1, 0 or 1 as ``a`` is below, equal to or above ``b`` for every binding of their names; None when that
    depends on the sizes."""
    difference = subtract(a, b)
    if isinstance(difference, int):
        return (difference > 0) - (difference < 0)
    if greater_or_equal(a, b) is False:
        return -1
    if greater_or_equal(b, a) is False:
        return 1
    return None


def is_symbolic(dim: Dim) -> bool:
    return isinstance(dim, str)


def is_name(dim: Dim) -> bool:
    """Whether ``dim`` is one plain name (what an input's size binds)."""
    return isinstance(dim, str) and re.fullmatch(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*", dim) is not None


def monomials(dim: Dim) -> list[tuple[tuple[str, ...], int]]:
    """``dim`` as a sum of coefficient x product of terms: [(terms, coefficient)], a term a name or a floor division
    ``"(P)//k"``, the constant with no terms; ``"2*b*s+1"`` -> [(("b", "s"), 2), ((), 1)]."""
    return [(tuple(monomial), coefficient) for monomial, coefficient in sorted(_poly(dim).items())]


def names(dim: Dim) -> set[str]:
    """The symbolic names a dim is made of (inside floor divisions too)."""
    found = set()
    for monomial in _poly(dim):
        for term in monomial:
            found |= names(term[1:term.rindex(")//")]) if "//" in term else {term}
    return found


def evaluate(dim: Dim, bound: dict[str, int]) -> Dim:
    """The dim with its names replaced by their bound sizes: an int when every name is bound, else the canonical
    expression of what remains."""
    result: _Poly = {}
    for monomial, coefficient in _poly(dim).items():
        factor, left = coefficient, _constant(1)
        for term in monomial:
            if "//" in term:
                split = term.rindex(")//")
                value = evaluate(term[1:split], bound)
                divisor = int(term[split + 3:])
                left = _multiply(left, _constant(value // divisor) if isinstance(value, int)
                                 else _floor_divide(_poly(value), divisor))
            elif term in bound:
                factor *= bound[term]
            else:
                left = _multiply(left, {(term,): 1})
        result = _add(result, _scale(left, factor))
    return _dim(result)


def solve(dim: Dim, size: int, bound: dict[str, int]) -> dict[str, int] | None:
    """The bindings that make ``dim`` equal ``size`` given ``bound``: {} when it already evaluates to ``size``; the one
    name left when ``dim`` is ``c * name + known`` (an input of extent ``seq + 1`` binds ``seq``); None when it
    cannot equal ``size`` or more than that would have to be guessed."""
    value = evaluate(dim, bound)
    if isinstance(value, int):
        return {} if value == size else None
    poly = _poly(value)
    linear = [m for m in poly if m]
    if len(linear) != 1 or len(linear[0]) != 1 or "//" in linear[0][0]:
        return None
    (name,), coefficient = linear[0], poly[linear[0]]
    count, remainder = divmod(size - poly.get((), 0), coefficient)
    return {name: count} if remainder == 0 and count >= 1 else None


def bind_shape(shape, bound: dict[str, int]) -> tuple:
    """Every dim of ``shape`` evaluated with ``bound`` (ints and symbolic dims; -1 and other ints unchanged)."""
    return tuple(evaluate(d, bound) if isinstance(d, str) else d for d in shape)
