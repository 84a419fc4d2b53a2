"""Matrix products the frontends write as GE2 matmuls: numpy.matmul with batch dims (``batched_matmul``) and
``einsum`` (ONNX Einsum, torch.einsum) as transposes, reshapes, sums and matmuls."""
from __future__ import annotations

import string

from ..ir import dims
from ..ir.graph import Graph, Value
from ._errors import Unsupported


def batched_matmul(g: Graph, a: Value, b: Value) -> Value:
    """numpy.matmul semantics for a batched B as one GE2 matmul (the batch dims broadcast; a 1-d A is a row, dropped
    at the end). The attention pass reads it whole; canonicalization lowers what is left to 2-d gemms."""
    a2 = g.reshape(a, shape=(1, *a.type.shape)) if a.type.rank == 1 else a
    try:
        y = g.matmul(a2, b)
    except ValueError as error:  # batch dims that do not broadcast, inner dims that differ
        raise Unsupported(f"MatMul of shapes {tuple(a.type.shape)} and {tuple(b.type.shape)}: {error}") from None
    return g.reshape(y, shape=(*y.type.shape[:-2], y.type.shape[-1])) if a.type.rank == 1 else y


def _parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' letters and the output's, an ellipsis spelled out as capital letters (right-aligned)."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise Unsupported(f"einsum {equation!r} names {len(terms)} operands, got {len(ranks)}")
    spare = [c for c in string.ascii_uppercase if c not in equation]
    widest = max((rank - len(term.replace("...", "")) for term, rank in zip(terms, ranks) if "..." in term),
                 default=0)
    ellipsis = "".join(spare[:widest])
    letters = []
    for term, rank in zip(terms, ranks):
        if "..." in term:
            count = rank - len(term.replace("...", ""))
            term = term.replace("...", ellipsis[widest - count:])
        if len(term) != rank:
            raise Unsupported(f"einsum term {term!r} for an operand of rank {rank}")
        if len(set(term)) != len(term):
            raise Unsupported(f"einsum term {term!r} repeats a letter (a diagonal)")
        letters.append(term)
    if arrow:
        output = rhs.replace("...", ellipsis)
    else:  # implicit: the ellipsis, then the letters that appear once, sorted
        counts = "".join(letters)
        output = ellipsis + "".join(sorted(c for c in set(counts) if counts.count(c) == 1 and c not in ellipsis))
    return letters, output


def _arranged(g: Graph, x: Value, letters: str, order: str) -> Value:
    """``x`` (axes named by ``letters``) transposed to ``order``."""
    perm = tuple(letters.index(c) for c in order)
    return x if perm == tuple(range(len(perm))) else g.transpose(x, perm=perm)


def _reshaped(g: Graph, x: Value, shape: tuple) -> Value:
    return x if tuple(x.type.shape) == tuple(shape) else g.reshape(x, shape=tuple(shape))


def _summed_out(g: Graph, x: Value, letters: str, keep: set) -> tuple[Value, str]:
    """Sums the axes whose letters no later operand and not the output use."""
    axes = tuple(i for i, c in enumerate(letters) if c not in keep)
    if not axes:
        return x, letters
    return g.sum(x, axis=axes, keepdims=False), "".join(c for c in letters if c in keep)


def _contract(g: Graph, a: Value, a_letters: str, b: Value, b_letters: str, output: str) -> tuple[Value, str]:
    """The product of two operands with the letters of ``output`` kept: [batch, left, contracted] x
    [batch, contracted, right] as one (batched) matmul."""
    sizes = {}
    for x, letters in ((a, a_letters), (b, b_letters)):
        for c, d in zip(letters, x.type.shape):
            if sizes.setdefault(c, d) != d:
                raise Unsupported(f"einsum letter {c!r} has sizes {sizes[c]!r} and {d!r} (broadcasting is not lowered)")
    batch = "".join(c for c in output if c in a_letters and c in b_letters)
    contracted = "".join(c for c in a_letters if c in b_letters and c not in output)
    left = "".join(c for c in a_letters if c not in b_letters)
    right = "".join(c for c in b_letters if c not in a_letters)
    size = lambda group: dims.product(*(sizes[c] for c in group))  # noqa: E731
    a3 = _reshaped(g, _arranged(g, a, a_letters, batch + left + contracted), (size(batch), size(left),
                                                                              size(contracted)))
    b3 = _reshaped(g, _arranged(g, b, b_letters, batch + contracted + right), (size(batch), size(contracted),
                                                                               size(right)))
    if batch:
        product = batched_matmul(g, a3, b3)
    else:
        product = g.reshape(g.matmul(_reshaped(g, a3, a3.type.shape[1:]), _reshaped(g, b3, b3.type.shape[1:])),
                            shape=(1, size(left), size(right)))
    letters = batch + left + right
    return _reshaped(g, product, tuple(sizes[c] for c in letters)), letters


def einsum(g: Graph, equation: str, operands: list[Value]) -> Value:
    """``einsum(equation, *operands)`` as GE2 ops: letters only one operand has and nothing later needs are summed
    first, then the operands are multiplied left to right (each product a matmul over the shared letters), and the
    result is transposed to the output's order. No repeated letters (diagonals) or broadcasting of size-1 dims."""
    letters, output = _parse(equation, [x.type.rank for x in operands])
    result, result_letters = None, ""
    for index, (x, term) in enumerate(zip(operands, letters)):
        later = set(output).union(*letters[index + 1:])
        x, term = _summed_out(g, x, term, later | set(result_letters))
        if result is None:
            result, result_letters = x, term
            continue
        result, result_letters = _summed_out(g, result, result_letters, later | set(term))
        keep = "".join(c for c in dict.fromkeys(result_letters + term) if c in later)
        result, result_letters = _contract(g, result, result_letters, x, term, keep)
    result, result_letters = _summed_out(g, result, result_letters, set(output))
    if set(result_letters) != set(output):
        raise Unsupported(f"einsum {equation!r}: output letters {output!r} not among the operands'")
    return _arranged(g, result, result_letters, output)
