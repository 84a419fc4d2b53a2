"""Helpers that write the C++ of ``OpDef.scalar`` (the per-element math of pointwise ops in generated kernels).

A scalar rule writes its math once as a body over named parameters (``"x < 0 ? 0 : x"``); ``expression`` puts the
argument expressions in: textually when each parameter appears at most once, else through an immediately invoked
lambda, so an argument (itself maybe a long fused expression) is evaluated once.
"""
from __future__ import annotations

import math
import re
from typing import Sequence

FLOAT_CTYPE = "float"


def is_float_ctype(ctype: str) -> bool:
    return ctype == FLOAT_CTYPE


def literal(value: float | int | bool, ctype: str) -> str:
    """``value`` as a C++ literal of ``ctype`` (float literals carry ``f``; inf and NaN as bit patterns, since
    generated kernels include no headers)."""
    if ctype == "bool":
        return "true" if value else "false"
    if is_float_ctype(ctype):
        value = float(value)
        if math.isnan(value):
            return "__int_as_float(0x7fffffff)"
        if math.isinf(value):
            return ("-" if value < 0 else "") + "__int_as_float(0x7f800000)"
        text = repr(value)
        return f"{text}f" if ("." in text or "e" in text) else f"{text}.0f"
    if value != int(value):
        raise ValueError(f"value: expected an integer for the compute type {ctype}, got {value!r}")
    value = int(value)
    if ctype == "long long":
        return f"({value}LL)" if value < 0 else f"{value}LL"
    if ctype == "unsigned char":
        return f"((unsigned char){value})"
    return f"({value})" if value < 0 else str(value)


def expression(body: str, params: Sequence[str], args: Sequence[str], ctype: str) -> str:
    """``body`` (a C++ expression over ``params``, or a block ``{ ... return ...; }`` where the math needs
    statements) applied to the argument expressions ``args`` of type ``ctype``."""
    if len(params) != len(args):
        raise ValueError(f"args: expected {len(params)} argument expression(s) ({', '.join(params)}), got {len(args)}")
    signature = ", ".join(f"{ctype} {p}" for p in params)
    if body.startswith("{"):
        return f"([]({signature}) {body}({', '.join(args)}))"
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, params)) + r")\b")
    uses = pattern.findall(body)
    if all(uses.count(p) <= 1 for p in params):  # one pass, so an argument's own text is never substituted
        by_name = dict(zip(params, args))
        return "(" + pattern.sub(lambda match: f"({by_name[match.group(1)]})", body) + ")"
    return f"([]({signature}) {{ return {body}; }}({', '.join(args)}))"
