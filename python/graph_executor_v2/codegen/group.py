"""A fused group as data: its member ops in order, each reading group inputs, earlier members or folded constants.

The fused ops (``ops/fused.py``) keep their group in the attribute ``members``, a tuple of plain dicts (so a graph
with fused nodes serializes, prints and compares like any other):
``{"op": "mul", "node": "mul_3", "attrs": {...}, "args": (("input", 0), ("member", 1), ("constant", 0.5,
"float32", ()), None)}``. ``node`` is the original node's name, for explain() and error messages. An arg is a group
input (its index), an earlier member's output, a constant folded into the source (value, dtype, shape), or None
for an absent optional input.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..dtypes import to_numpy
from ..ir.types import TensorType
from ..ir.schema import OPS


@dataclass(frozen=True)
class Member:
    op: str
    node: str
    attrs: dict
    args: tuple

    def as_attr(self) -> dict:
        return {"op": self.op, "node": self.node, "attrs": dict(self.attrs), "args": self.args}


def members_of(attr: Sequence[dict], reduced: bool = False, allow_empty: bool = False) -> tuple[Member, ...]:
    """The members of a ``members`` attribute (validated: known ops, args referring to inputs or earlier members;
    with ``reduced``, an epilogue's, also to the reduced value, arg ``("reduced",)``; empty only when
    ``allow_empty`` or ``reduced``: a reduction with no prologue or no epilogue)."""
    members = []
    for index, entry in enumerate(attr):
        if not isinstance(entry, dict) or set(entry) != {"op", "node", "attrs", "args"}:
            raise ValueError(f"members[{index}]: expected a dict with keys op, node, attrs, args, got {entry!r}")
        if entry["op"] not in OPS:
            raise ValueError(f"members[{index}]: unknown op {entry['op']!r}")
        args = tuple(None if a is None else tuple(a) for a in entry["args"])
        for arg in args:
            if arg is None:
                continue
            kind = arg[0]
            if kind == "member" and not (isinstance(arg[1], int) and 0 <= arg[1] < index):
                raise ValueError(f"members[{index}]: arg {arg!r} must name an earlier member")
            if kind not in ("input", "member", "constant") + (("reduced",) if reduced else ()):
                raise ValueError(f"members[{index}]: arg kind {kind!r} is not input, member or constant")
        members.append(Member(entry["op"], entry["node"], dict(entry["attrs"]), args))
    if not members and not (reduced or allow_empty):
        raise ValueError("members: expected at least one member op")
    return tuple(members)


def constant_array(arg) -> np.ndarray:
    _, value, dtype, shape = arg
    return np.full(tuple(shape), value, dtype=to_numpy(dtype))


def member_types(members: Sequence[Member], in_types: Sequence[TensorType | None],
                 reduced: TensorType | None = None) -> list[TensorType]:
    """The output type of every member (each member has one output), by the members' own shape inference
    (``reduced``: the type of an epilogue's reduced value)."""
    types: list[TensorType] = []
    for index, member in enumerate(members):
        arg_types = []
        for arg in member.args:
            if arg is None:
                arg_types.append(None)
            elif arg[0] == "input":
                if not 0 <= arg[1] < len(in_types) or in_types[arg[1]] is None:
                    raise ValueError(f"members[{index}] ({member.node}): arg {arg!r} is not an input of the group "
                                     f"({len(in_types)} inputs)")
                arg_types.append(in_types[arg[1]])
            elif arg[0] == "member":
                arg_types.append(types[arg[1]])
            elif arg[0] == "reduced":
                arg_types.append(reduced)
            else:
                arg_types.append(TensorType(tuple(arg[3]), arg[2]))
        try:
            outputs = OPS[member.op].infer(arg_types, member.attrs)
        except (ValueError, TypeError) as error:
            raise type(error)(f"member '{member.node}' ({member.op}): {error}") from None
        types.append(outputs[0])
    return types


def run_members(members: Sequence[Member], inputs: Sequence[np.ndarray | None],
                reduced: np.ndarray | None = None) -> list[np.ndarray]:
    """Every member's output by its op's reference, each cast to its dtype: the group computed exactly as the
    unfused nodes would compute it (the CPU backend of a fused node)."""
    values: list[np.ndarray] = []
    for member in members:
        args = []
        for arg in member.args:
            if arg is None:
                args.append(None)
            elif arg[0] == "input":
                args.append(inputs[arg[1]])
            elif arg[0] == "member":
                args.append(values[arg[1]])
            elif arg[0] == "reduced":
                args.append(reduced)
            else:
                args.append(constant_array(arg))
        values.append(OPS[member.op].run_reference(args, member.attrs)[0])
    return values


def describe(members: Sequence[Member]) -> str:
    """``mul (mul_3), sigmoid (sigmoid_2), ...``: the member ops with their original node names."""
    return ", ".join(f"{m.op} ({m.node})" for m in members)


def fused_members(node) -> str:
    """The members of a fused node (``fused_pointwise``/``fused_reduction``) with their original node names."""
    members = members_of(node.attrs["members"], allow_empty=node.op == "fused_reduction")
    if node.op == "fused_reduction":
        axes = node.attrs["axes"]
        epilogue = members_of(node.attrs["epilogue"], reduced=True)
        return ((describe(members) or "input 0") + f" -> {node.attrs['reduce']} over {axes} trailing dim(s)"
                + (f" -> {describe(epilogue)}" if epilogue else ""))
    return describe(members)
