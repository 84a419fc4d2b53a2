"""Fused ops: groups of pointwise ops (and a row reduction with its pointwise prologue and epilogue) that the fusion
pass (``passes/pointwise_fusion.py``) makes into one node, run on CUDA as one generated kernel (``codegen/``).

- ``fused_pointwise(*inputs, members=..., outputs=...)``: the members (``codegen/group.py``) computed element by
  element over the broadcast of the inputs; ``outputs`` are the member indices the node returns (at most
  ``MAX_OUTPUTS``), all of the group's iteration shape.
- ``fused_reduction(*inputs, members=..., reduce=..., axes=..., epilogue=..., outputs=...)``: the members computed
  over the reduced input (the prologue; none: the first input is reduced), the last member reduced (``sum``,
  ``mean``, ``max``, ``min``) over its trailing ``axes`` dims, then the ``epilogue`` members over the reduced value
  (epilogue arg ``("reduced",)``); ``outputs`` are epilogue member indices (empty: the reduced value itself).
  ``var``/``std`` give two outputs, the mean (reduced dims kept) and the population variance or standard
  deviation, with no epilogue (codegen/reduction.py).
- ``fused_row(*inputs, members=..., outputs=...)``: a row op (layernorm, rmsnorm, softmax or log_softmax over the
  last axis) among pointwise members: the prologue before it, the epilogue after it (``codegen/row.py``); its
  candidates are the generated persistent-row kernel and the op's hand-written kernels with the prologue and
  epilogue as generated pointwise kernels around them (``row_kernel_and_pointwise``), timed against each other
  when a plan is built.

The CPU backend runs the members' own references, each rounded to its dtype, so a fused graph computes on the CPU
exactly what the unfused one does. Fused ops are compiler-internal: they have no face (``FUSED_OPS``), and no
gradient (fusion runs after autograd).

Every op with a ``scalar`` expression also gets the ``generated`` candidate here: its own generated kernel.
"""
from __future__ import annotations

from ..codegen import candidate as _candidate
from ..codegen import compiler as _compiler
from ..codegen import reduction as _reduction
from ..codegen import row as _row
from ..codegen.group import Member, member_types, members_of, run_members
from ..codegen.pointwise import broadcast_shape, pointwise_source, scalar_of, why_not_generated
from ..dtypes import itemsize as _itemsize
from ..ir.schema import OPS, VARIADIC_OUTPUTS, Attr, Candidate, Input, OpDef, Problem, add_candidate, register

MAX_OUTPUTS = 8
FUSED_OPS = frozenset({"fused_pointwise", "fused_reduction", "fused_row"})
# Below every hand-written kernel of an op (they stay the default; autotuning times the generated one against them
# and keeps the faster); the only candidate of a fused op and of a pointwise op with no hand-written kernel.
GENERATED_PRIORITY = 5


def _check_outputs(outputs) -> str | None:
    if len(outputs) > MAX_OUTPUTS or not all(isinstance(i, int) and not isinstance(i, bool) for i in outputs):
        return f"must be at most {MAX_OUTPUTS} member indices"
    return None


def _check_members(members, allow_empty: bool = False) -> str | None:
    try:
        members_of(members, allow_empty=allow_empty)
    except ValueError as error:
        return str(error)
    return None


# ---------------------------------------------------------------------------------------------------------------
# fused_pointwise
# ---------------------------------------------------------------------------------------------------------------
def _pointwise_outputs(attrs, members) -> list[int]:
    outputs = list(attrs["outputs"])
    for index in outputs:
        if not 0 <= index < len(members):
            raise ValueError(f"outputs: member index {index} out of range (the group has {len(members)} members)")
    return outputs


def _infer_pointwise(in_types, attrs):
    members = members_of(attrs["members"])
    types = member_types(members, in_types)
    return [types[i] for i in _pointwise_outputs(attrs, members)]


def _reference_pointwise(inputs, attrs):
    members = members_of(attrs["members"])
    values = run_members(members, inputs)
    return [values[i] for i in _pointwise_outputs(attrs, members)]


def _generate_pointwise(problem: Problem, name: str):
    members = members_of(problem.attrs["members"])
    return pointwise_source(name, members, problem.attrs["outputs"], problem.in_types, problem.out_types)


def _why_not_pointwise(problem: Problem):
    return why_not_generated(members_of(problem.attrs["members"]), problem.in_types, problem.out_types)


FUSED_POINTWISE = register(OpDef(
    name="fused_pointwise", inputs=(Input("inputs", variadic=True),),
    outputs=(VARIADIC_OUTPUTS,),
    attrs=(Attr("members", tuple, check=_check_members, doc="the member ops (codegen/group.py)"),
           Attr("outputs", tuple, check=_check_outputs, doc="member indices the node returns")),
    infer=_infer_pointwise, reference=_reference_pointwise,
    candidates=(_candidate.generated_candidate(
        "pointwise", lambda p: members_of(p.attrs["members"]), _why_not_pointwise, _generate_pointwise,
        GENERATED_PRIORITY, "generated by codegen: one pass, 16-byte vectors when aligned, NVRTC"),),
    doc="fused_pointwise(*inputs): a group of pointwise ops as one kernel; outputs are member results"))


# ---------------------------------------------------------------------------------------------------------------
# fused_reduction
# ---------------------------------------------------------------------------------------------------------------
def _reduction_parts(attrs):
    return _reduction.ReductionGroup.from_attrs(attrs)


def _infer_reduction(in_types, attrs):
    return _reduction_parts(attrs).infer(in_types)


def _reference_reduction(inputs, attrs):
    return _reduction_parts(attrs).reference(inputs)


def _generate_reduction(problem: Problem, name: str):
    return _reduction_parts(problem.attrs).source(name, problem.in_types, problem.out_types)


def _why_not_reduction(problem: Problem):
    return _reduction_parts(problem.attrs).why_not(problem.in_types, problem.out_types)


FUSED_REDUCTION = register(OpDef(
    name="fused_reduction", inputs=(Input("inputs", variadic=True),),
    outputs=(VARIADIC_OUTPUTS,),
    attrs=(Attr("members", tuple, check=lambda m: _check_members(m, allow_empty=True),
                doc="the prologue: its last member is reduced (none: the first input is)"),
           Attr("reduce", str, choices=_reduction.REDUCTIONS, doc="the reduction of the last prologue member"),
           Attr("axes", int, check=lambda n: None if n >= 1 else "must be >= 1", doc="trailing dims reduced"),
           Attr("keepdims", bool, False, doc="keep the reduced dims as size 1"),
           Attr("epilogue", tuple, (), doc="members over the reduced value (arg ('member', -1))"),
           Attr("outputs", tuple, (), check=_check_outputs, doc="epilogue member indices; () is the reduced value")),
    infer=_infer_reduction, reference=_reference_reduction,
    candidates=(_candidate.generated_candidate(
        "reduction", lambda p: _reduction_parts(p.attrs).all_members(), _why_not_reduction, _generate_reduction,
        GENERATED_PRIORITY, "generated by codegen: rows reduced in registers, prologue and epilogue fused"),),
    doc="fused_reduction(*inputs): a pointwise prologue, a reduction over the trailing dims and an epilogue"))


# ---------------------------------------------------------------------------------------------------------------
# fused_row
# ---------------------------------------------------------------------------------------------------------------
def _row_group(attrs) -> _row.RowGroup:
    return _row.RowGroup.from_attrs(attrs)


def _generate_row(problem: Problem, name: str):
    return _row_group(problem.attrs).source(name, problem.in_types, problem.out_types)


def _why_not_row(problem: Problem):
    return _row_group(problem.attrs).why_not(problem.in_types, problem.out_types)


# The hand-written row kernels compete with the generated one: the same group as up to three launches, the prologue
# (a generated pointwise kernel into a buffer), the row op's own best-ranked hand-written kernel, the epilogue (a
# generated pointwise kernel reading the row op's output from a buffer).
COMPOSITE = "row_kernel_and_pointwise"


def _pointwise_part(members, outputs, in_types):
    """(members, a function writing their pointwise kernel under a name): ``members`` over inputs ``in_types``
    computing ``outputs``."""
    out_types = tuple(member_types(members, in_types)[i] for i in outputs)
    return members, lambda name: pointwise_source(name, members, outputs, in_types, out_types)


def _composite_parts(problem: Problem):
    """The generated parts of the composite: (prologue, epilogue), each None or a ``_pointwise_part``; the epilogue
    reads the group's inputs, then the row op's output, then (with a prologue) the row op's input."""
    group = _row_group(problem.attrs)
    members, row, outputs = group.members, group.row, group.outputs
    in_types = tuple(problem.in_types)
    types = member_types(members, in_types)
    kept = row - 1 if row else None
    prologue = _pointwise_part(members[:row], (kept,), in_types) if kept is not None else None
    epilogue = None
    epilogue_outputs = [i for i in outputs if i > row]
    if epilogue_outputs:
        count = len(in_types)
        mapping = {row: ("input", count), kept: ("input", count + 1)}

        def remap(arg):
            if arg is None or arg[0] != "member":
                return arg
            return mapping[arg[1]] if arg[1] <= row else ("member", arg[1] - row - 1)

        epilogue_members = tuple(Member(m.op, m.node, m.attrs, tuple(remap(a) for a in m.args))
                                 for m in members[row + 1:])
        epilogue_types = in_types + (types[row],) + ((types[kept],) if kept is not None else ())
        epilogue = _pointwise_part(epilogue_members, tuple(i - row - 1 for i in epilogue_outputs), epilogue_types)
    return prologue, epilogue


def _composite_kernels(problem: Problem):
    return [_candidate.build("pointwise", members, generate)
            for members, generate in filter(None, _composite_parts(problem))]


def _composite_plan(problem: Problem):
    """(steps, buffer sizes): each step (launch, input sources, output sources), a source ("in", k), ("out", k) or
    ("buffer", b)."""
    from .. import selection

    group = _row_group(problem.attrs)
    members, row, outputs = group.members, group.row, group.outputs
    in_types = tuple(problem.in_types)
    types = member_types(members, in_types)
    arch = _candidate.arch_of(problem)
    kept = row - 1 if row else None
    row_type = types[row]
    buffers: list[int] = []

    def place(index: int):
        """Where member ``index`` is written: its output slot, else a new buffer."""
        if index in outputs:
            return ("out", outputs.index(index))
        buffers.append(row_type.numel * _itemsize(types[index].dtype))
        return ("buffer", len(buffers) - 1)

    prologue, epilogue = _composite_parts(problem)
    steps = []
    x_source = ("in", 0)
    if prologue is not None:
        x_source = place(kept)
        steps.append((_candidate.generated_launch("pointwise", *prologue, arch),
                      [("in", k) for k in range(len(in_types))], [x_source]))
    row_member = members[row]
    parameters = row_member.args[1:]
    row_problem = Problem(row_member.op, (types[kept] if kept is not None else in_types[0],)
                          + tuple(in_types[a[1]] for a in parameters), (row_type,), dict(row_member.attrs),
                          problem.compute_capability)
    choice = selection.choose(selection.rank(OPS[row_member.op], row_problem), row_problem)
    y_source = place(row)
    steps.append((choice.launch, [x_source] + [("in", a[1]) for a in parameters], [y_source]))
    if epilogue is not None:
        sources = [("in", k) for k in range(len(in_types))] + [y_source] + ([x_source] if kept is not None else [])
        steps.append((_candidate.generated_launch("pointwise", *epilogue, arch), sources,
                      [("out", outputs.index(i)) for i in outputs if i > row]))
    return steps, buffers


def _why_not_composite(problem: Problem):
    unavailable = _compiler.availability()
    if unavailable:
        return f"NOT AVAILABLE: {unavailable}"
    group = _row_group(problem.attrs)
    if any(a is None or a[0] == "constant" for a in group.members[group.row].args[1:]):
        return "a parameter of the row op is folded into the group as a constant"
    return why_not_generated(group.members[:group.row] + group.members[group.row + 1:], problem.in_types,
                             problem.out_types)


def _prepare_composite(problem: Problem):
    from ._grad import device_workspace

    steps, sizes = _composite_plan(problem)
    buffers = [device_workspace(size) for size in sizes]  # kept for the plan's life, as a backward's workspace

    def launch(ins, outs, stream, buffers=buffers):
        def address(source):
            kind, index = source
            return ins[index] if kind == "in" else outs[index] if kind == "out" else buffers[index].ptr

        for step, in_sources, out_sources in steps:
            step([address(s) for s in in_sources], [address(s) for s in out_sources], stream)

    return launch


_prepare_composite.kernels = _composite_kernels  # what codegen.candidate.precompile() compiles ahead


def _composite_candidate() -> Candidate:
    return Candidate(COMPOSITE, GENERATED_PRIORITY - 1,
                     "the row op's hand-written kernel, with the prologue and epilogue as generated pointwise kernels "
                     "around it (up to three launches)", _why_not_composite, _prepare_composite)


FUSED_ROW = register(OpDef(
    name="fused_row", inputs=(Input("inputs", variadic=True),),
    outputs=(VARIADIC_OUTPUTS,),
    attrs=(Attr("members", tuple, check=_check_members,
                doc="pointwise members around exactly one row op (layernorm, rmsnorm, softmax, log_softmax)"),
           Attr("outputs", tuple, check=_check_outputs, doc="member indices the node returns")),
    infer=lambda in_types, attrs: _row_group(attrs).infer(in_types),
    reference=lambda inputs, attrs: _row_group(attrs).reference(inputs),
    candidates=(_candidate.generated_candidate(
        "row", lambda p: members_of(p.attrs["members"]), _why_not_row, _generate_row, GENERATED_PRIORITY,
        "generated by codegen: the row held in registers, prologue, statistics and epilogue in one pass"),
        _composite_candidate()),
    doc="fused_row(*inputs): a pointwise prologue, a row normalization over the last axis and an epilogue"))


# ---------------------------------------------------------------------------------------------------------------
# The generated candidate of every single op with a scalar expression: a group of one member.
# ---------------------------------------------------------------------------------------------------------------
def _single_member(problem: Problem) -> tuple[Member, ...]:
    args = tuple(None if t is None else ("input", k) for k, t in enumerate(problem.in_types))
    return (Member(problem.op, problem.op, dict(problem.attrs), args),)


def _generate_single(problem: Problem, name: str):
    return pointwise_source(name, _single_member(problem), (0,), problem.in_types, problem.out_types)


def _why_not_single(problem: Problem):
    if None in problem.in_types:
        return "an optional input is absent"
    shapes = [t.shape for t in problem.in_types]
    if broadcast_shape(shapes) != tuple(problem.out_types[0].shape):
        return (f"the output shape {problem.out_types[0].shape} is not the broadcast of the input shapes "
                f"{', '.join(map(str, shapes))}: not an element-by-element problem")
    return why_not_generated(_single_member(problem), problem.in_types, problem.out_types)


def add_generated_candidates() -> list[str]:
    """Adds the ``generated`` candidate to every registered single-output op with a ``scalar`` expression that has
    none yet; returns their names."""
    added = []
    for name, opdef in list(OPS.items()):
        if scalar_of(name) is None or len(opdef.outputs) != 1 or name in FUSED_OPS:
            continue
        if any(c.name == _candidate.NAME for c in opdef.candidates):
            continue
        add_candidate(name, _candidate.generated_candidate(
            "pointwise", _single_member, _why_not_single, _generate_single, GENERATED_PRIORITY,
            "generated by codegen from the op's scalar expression (NVRTC), any alignment"), origin="")
        added.append(name)
    return added


add_generated_candidates()
