"""CUDA C++ for a pointwise group: every output element computed from the inputs' elements in one pass.

The shapes are concrete when a plan is built, so the source is specialized to them: extents, broadcast strides and
folded constants are literals (the compiler turns the index divisions into multiplications). The kernel:
- walks the elements in a grid-stride loop, ``V`` elements per step and up to ``UNROLL`` steps a thread whose loads
  are all issued before the first is used (a block covers ``BLOCK * UNROLL`` consecutive steps): operands of the full output shape are read and
  written as 16-byte packs when every such pointer is 16-byte aligned (checked at run time: a view may be
  misaligned), with a scalar loop for the tail and for the misaligned case;
- reads a broadcast operand at ``sum(coordinate_d * stride_d)`` over the output's dims collapsed where all operands
  broadcast alike; in the vector loop, where a vector step stays inside one innermost row (its extent a multiple of
  ``V``), once a step: as 16-byte packs when the operand runs along that row (a bias: its ``V`` elements are
  consecutive), as one value when it does not (a per-row scale); else element by element;
- indexes with 32-bit integers unless the element count needs 64 bits;
- computes floating values in float32 (16-bit ones widened on load, rounded once on store) and integer values in
  their exact type; each member's math is its op's ``scalar`` C++ expression.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

from ..dtypes import compute_ctype, itemsize
from ..ir.types import TensorType
from ..ir.schema import OPS
from ..ops.elementwise import broadcast_shapes
from . import elements
from .group import Member, member_types

BLOCK = 256
PACK_BYTES = 16
MAX_GRID = 1 << 20  # blocks; the loops are grid-stride, so this bounds the launch, not the size
UNROLL = 4  # vector steps a thread loads before computing any
MAX_PACKS_IN_FLIGHT = 16  # 16-byte packs a thread holds across its unrolled steps (registers)
INDEX_32_LIMIT = (1 << 31) - 1


@dataclass(frozen=True)
class KernelSource:
    """A generated kernel and how to launch it: ``grid`` blocks of ``block`` threads, pointers only as arguments
    (inputs, then outputs)."""

    name: str
    source: str
    grid: int
    block: int
    inputs: int
    outputs: int
    shared_bytes: int = 0


def scalar_of(op: str) -> Callable | None:
    """The op's per-element C++ expression builder (``OpDef.scalar``), or None when it has none."""
    return getattr(OPS[op], "scalar", None)


def broadcast_shape(shapes) -> tuple | None:
    """The NumPy broadcast of ``shapes`` (symbolic dims as ``ops.elementwise.broadcast_shapes`` takes them), or None
    when they do not broadcast."""
    try:
        return tuple(functools.reduce(broadcast_shapes, shapes))
    except ValueError:
        return None


def why_not_generated(members: Sequence[Member], in_types, out_types) -> str | None:
    """Why a group cannot be generated (an op without ``scalar``, a dtype without a C type), or None."""
    for member in members:
        if scalar_of(member.op) is None:
            return f"op '{member.op}' ({member.node}) has no scalar expression"
    for t in (*in_types, *out_types):
        if t is not None and not elements.is_supported(t.dtype):
            return f"dtype {t.dtype} has no generated-code type"
    if any(t is not None and not t.is_concrete for t in (*in_types, *out_types)):
        return "shapes are symbolic"
    return None


def _padded(shape, rank) -> tuple:
    return (1,) * (rank - len(shape)) + tuple(shape)


def collapse_dims(shape: tuple, operand_shapes: Sequence[tuple]) -> tuple[list[int], list[list[bool]]]:
    """The iteration ``shape`` with size-1 dims dropped and neighbours merged where every operand broadcasts alike:
    (extents, per operand whether it runs along each extent)."""
    rank = len(shape)
    padded = [_padded(s, rank) for s in operand_shapes]
    extents: list[int] = []
    carried: list[list[bool]] = [[] for _ in operand_shapes]
    previous = None
    for axis, extent in enumerate(shape):
        if extent == 1:
            continue
        kind = tuple(p[axis] == extent for p in padded)
        if extents and kind == previous:
            extents[-1] *= extent
        else:
            extents.append(extent)
            for flags, flag in zip(carried, kind):
                flags.append(flag)
        previous = kind
    return extents, carried


def broadcast_index(extents: list[int], carried: list[bool], index: str, suffix: str) -> str:
    """The element offset of an operand that runs along the ``carried`` extents, from the flat output index."""
    terms = []
    stride = 1
    inner = 1
    for axis in reversed(range(len(extents))):
        extent = extents[axis]
        if carried[axis]:
            coordinate = index if inner == 1 else f"({index} / {inner}{suffix})"
            if axis > 0:
                coordinate = f"({coordinate} % {extent}{suffix})"
            terms.append(coordinate if stride == 1 else f"{coordinate} * {stride}{suffix}")
            stride *= extent
        inner *= extent
    return " + ".join(reversed(terms)) if terms else f"0{suffix}"


def member_expressions(members: Sequence[Member], types: Sequence[TensorType], value_of_input: Callable[[int], str],
                       input_types: Sequence[TensorType], prefix: str,
                       reduced: tuple[str, TensorType] | None = None, only: range | None = None) -> list[str]:
    """C++ statements computing every member (or the members whose indices are in ``only``) into ``<prefix><j>``
    (its compute type), reading group input k as ``value_of_input(k)`` (and an epilogue's reduced value as
    ``reduced``: (expression, type)). Each member computes in ``dtypes.compute_ctype`` of its operands' types, its
    ``scalar`` contract."""
    lines = []
    for j, member in enumerate(members):
        if only is not None and j not in only:
            continue
        arg_exprs, arg_types = [], []
        for arg in member.args:
            if arg is None:
                arg_exprs.append("")
                arg_types.append(None)
            elif arg[0] == "input":
                arg_exprs.append(value_of_input(arg[1]))
                arg_types.append(input_types[arg[1]])
            elif arg[0] == "member":
                arg_exprs.append(f"{prefix}{arg[1]}")
                arg_types.append(types[arg[1]])
            elif arg[0] == "reduced":
                arg_exprs.append(reduced[0])
                arg_types.append(reduced[1])
            else:
                arg_exprs.append(elements.literal(arg[1], arg[2]))
                arg_types.append(TensorType(tuple(arg[3]), arg[2]))
        ctype = compute_ctype(arg_types)
        converted = [e if t is None else elements.convert(e, elements.compute_type(t.dtype), ctype)
                     for e, t in zip(arg_exprs, arg_types)]
        expression = scalar_of(member.op)(converted, member.attrs, ctype)
        value_type = elements.compute_type(types[j].dtype)
        lines.append(f"const {value_type} {prefix}{j} = ({value_type})({expression});  // {member.op} ({member.node})")
    return lines


def pointwise_source(name: str, members: Sequence[Member], outputs: Sequence[int],
                     in_types: Sequence[TensorType], out_types: Sequence[TensorType]) -> KernelSource:
    """The kernel computing the group's ``outputs`` (member indices) over ``in_types`` into ``out_types``."""
    types = member_types(members, in_types)
    shape = tuple(out_types[0].shape)
    count = out_types[0].numel
    for index, t in zip(outputs, out_types):
        if tuple(t.shape) != shape or types[index].dtype != t.dtype:
            raise ValueError(f"outputs: every output must have the iteration shape {shape} and its member's dtype, "
                             f"got {t} for member {members[index].node} ({types[index]})")
    wide = count > INDEX_32_LIMIT
    index_type, suffix = ("unsigned long long", "ull") if wide else ("unsigned int", "u")
    in_dtypes = [t.dtype for t in in_types]
    full = [tuple(_padded(t.shape, len(shape))) == shape for t in in_types]
    extents, carried = collapse_dims(shape, [t.shape for t in in_types])
    full_sizes = [itemsize(t.dtype) for t, f in zip(in_types, full) if f] + [itemsize(t.dtype) for t in out_types]
    vector = PACK_BYTES // min(full_sizes)  # elements per step of the vector loop
    vector_count = count // vector

    parameters = [f"const {elements.storage_type(t.dtype)}* __restrict__ in{k}" for k, t in enumerate(in_types)]
    parameters += [f"{elements.storage_type(t.dtype)}* __restrict__ out{k}" for k, t in enumerate(out_types)]

    def broadcast_load(k: int, index: str) -> str:
        return elements.from_storage(in_types[k].dtype, f"in{k}[{broadcast_index(extents, carried[k], index, suffix)}]")

    def body(value_of_input, store) -> list[str]:
        lines = [f"const {elements.compute_type(t.dtype)} x{k} = {value_of_input(k)};" for k, t in enumerate(in_types)]
        lines += member_expressions(members, types, lambda k: f"x{k}", in_types, "m")
        lines += [store(k, elements.to_storage(t.dtype, f"m{index}"))
                  for k, (index, t) in enumerate(zip(outputs, out_types))]
        return lines

    def packs_of(dtype: str) -> int:
        return vector * itemsize(dtype) // PACK_BYTES

    # How the vector loop reads each broadcast operand. A step's V elements lie in one innermost row when the row's
    # extent is a multiple of V: an operand running along that row holds them consecutively, at an offset that is a
    # multiple of V (16-byte aligned when its base is), so it loads as packs like a full operand (a bias: one load
    # a step instead of V loads and V index computations); one that does not run along it has one value for the
    # whole step (a per-row scale).
    in_row = extents[-1] % vector == 0 if extents else False
    packed = [full[k] or (in_row and carried[k][-1] and vector * itemsize(t.dtype) % PACK_BYTES == 0)
              for k, t in enumerate(in_types)]
    uniform = [not full[k] and in_row and not carried[k][-1] for k in range(len(in_types))]

    # Several packs in flight a thread (the loads of ``unroll`` vector steps are issued before any is used): one
    # 16-byte load per operand a thread leaves the memory system idle between requests (0.68-0.85 of copy
    # bandwidth on the H200); the bound on the input packs a thread holds (a step's output packs live only while it
    # is stored) keeps the widest mixes (int64 with bool, many broadcast packs, eight outputs) in registers.
    packs_per_step = sum(packs_of(t.dtype) for k, t in enumerate(in_types) if packed[k])
    unroll = next(u for u in (UNROLL, 2, 1) if u == 1 or u * packs_per_step <= MAX_PACKS_IN_FLIGHT)
    step_start = f"(v * {vector}{suffix})"  # the flat index of a vector step's first element
    load_lines = []
    vector_lines = []
    load_body = []
    for k, t in enumerate(in_types):
        if packed[k]:
            packs = packs_of(t.dtype)
            load_lines.append(f"ge2_pack p{k}[{unroll * packs}];")
            vector_lines.append(f"const {elements.storage_type(t.dtype)}* e{k} = "
                                f"reinterpret_cast<const {elements.storage_type(t.dtype)}*>(p{k} + u * {packs});")
            first_pack = (f"v * {packs}{suffix}" if full[k] else
                          f"({broadcast_index(extents, carried[k], step_start, suffix)}) / {vector // packs}{suffix}")
            load_body += [f"p{k}[u * {packs} + {q}] = reinterpret_cast<const ge2_pack*>(in{k})[{first_pack} + {q}];"
                          for q in range(packs)]
        elif uniform[k]:
            vector_lines.append(f"const {elements.compute_type(t.dtype)} b{k} = {broadcast_load(k, step_start)};")
    for k, t in enumerate(out_types):
        vector_lines.append(f"ge2_pack q{k}[{packs_of(t.dtype)}];")
        vector_lines.append(f"{elements.storage_type(t.dtype)}* f{k} = "
                            f"reinterpret_cast<{elements.storage_type(t.dtype)}*>(q{k});")
    element_lines = body(lambda k: elements.from_storage(in_dtypes[k], f"e{k}[lane]") if packed[k] else
                         f"b{k}" if uniform[k] else broadcast_load(k, "i"),
                         lambda k, value: f"f{k}[lane] = {value};")
    store_lines = []
    for k, t in enumerate(out_types):
        packs = packs_of(t.dtype)
        store_lines += [f"reinterpret_cast<ge2_pack*>(out{k})[v * {packs}{suffix} + {q}] = q{k}[{q}];"
                        for q in range(packs)]
    scalar_lines = body(lambda k: elements.from_storage(in_dtypes[k], f"in{k}[i]") if full[k] else
                        broadcast_load(k, "i"), lambda k, value: f"out{k}[i] = {value};")

    def indent(lines, depth):
        return "\n".join(" " * depth + line for line in lines)

    vector_pointers = [f"in{k}" for k, p in enumerate(packed) if p] + [f"out{k}" for k in range(len(out_types))]
    aligned = " | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in vector_pointers)
    source = f"""{elements.PREAMBLE}
// {len(members)} op(s): {", ".join(f"{m.op} ({m.node})" for m in members)}
// iteration shape {shape}, {count} elements, {vector} per vector step, {"64" if wide else "32"}-bit indices
extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({", ".join(parameters)}) {{
  typedef {index_type} index_t;
  const index_t stride = (index_t)gridDim.x * blockDim.x;
  const index_t first = (index_t)blockIdx.x * blockDim.x + threadIdx.x;
  if ((({aligned}) & 15ull) == 0) {{
    for (index_t v0 = (index_t)blockIdx.x * {BLOCK * unroll}{suffix} + threadIdx.x; v0 < {vector_count}{suffix};
         v0 += (index_t)gridDim.x * {BLOCK * unroll}{suffix}) {{
{indent(load_lines, 6)}
#pragma unroll
      for (int u = 0; u < {unroll}; ++u) {{
        const index_t v = v0 + u * {BLOCK}{suffix};
        if (v < {vector_count}{suffix}) {{
{indent(load_body, 10)}
        }}
      }}
#pragma unroll
      for (int u = 0; u < {unroll}; ++u) {{
        const index_t v = v0 + u * {BLOCK}{suffix};
        if (v < {vector_count}{suffix}) {{
{indent(vector_lines, 10)}
#pragma unroll
          for (int lane = 0; lane < {vector}; ++lane) {{
            const index_t i = v * {vector}{suffix} + lane;
            (void)i;
{indent(element_lines, 12)}
          }}
{indent(store_lines, 10)}
        }}
      }}
    }}
    for (index_t i = {vector_count * vector}{suffix} + first; i < {count}{suffix}; i += stride) {{
{indent(scalar_lines, 6)}
    }}
  }} else {{
    for (index_t i = first; i < {count}{suffix}; i += stride) {{
{indent(scalar_lines, 6)}
    }}
  }}
}}
"""
    units = max(-(-vector_count // unroll), 1)
    grid = 0 if count == 0 else min((units + BLOCK - 1) // BLOCK, MAX_GRID)
    return KernelSource(name, source, grid, BLOCK, len(in_types), len(out_types))
