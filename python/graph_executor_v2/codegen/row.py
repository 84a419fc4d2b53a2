"""CUDA C++ for a row operation (layernorm, rmsnorm, softmax or log_softmax over the last axis) with a pointwise
prologue and epilogue (``fused_row``): the "persistent row" kernel.

The group is one list of members (``codegen/group.py``) in which exactly one member is the row op; the members
before it are the prologue (their last one, or group input 0 when there is none, is the row op's ``x``), the
members after it the epilogue. Every member has the shape of ``x``: ``rows`` rows of ``cols`` elements.

Each row is read once and written once:
1. the prologue is computed element by element as the row is loaded, and the row op's input kept in float32
   registers (``CHUNKS * V`` values a thread);
2. the statistics are reduced across the row's threads (warp shuffles, then shared memory for a block per row):
   layernorm two passes over the registers (mean, then the sum of squared deviations), rmsnorm the mean square,
   softmax the (NaN-propagating) maximum then the sum of ``exp(x - max)``;
3. the row op's output, the epilogue and every output are computed element by element and stored.
Operands of the full shape are read and written as 16-byte packs of ``V`` elements when every such pointer is
16-byte aligned (checked at run time: a view may be misaligned) and ``cols`` is a multiple of ``V``; scalar
accesses at the same columns otherwise. ``gamma``/``beta`` (shape ``(cols,)``) and broadcast operands are read
element by element (they stay in L1/L2).
Rows of at most ``WARP_ROW_LIMIT`` elements: a warp per row, ``WARP_ROWS_PER_BLOCK`` rows a block; longer rows up
to ``ROW_LIMIT``: a block per row, of enough threads (128 to 1024) for two chunks each. The epilogue's full-shape
operands (a residual) are loaded with the row (within ``PREFETCH_PACKS`` a thread), so their latency hides behind
the reductions. Longer rows keep the hand-written kernels (the fusion pass does not group them).

Epilogue members read group inputs, constants, the row op's output, later members and the row op's input (kept in
registers); never another prologue member (it is not kept). Outputs are the row op's input (when a member),
the row op's output or epilogue members.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import FLOAT_DTYPES, itemsize
from ..ir.types import TensorType
from . import elements
from .group import Member, member_types, members_of, run_members
from .pointwise import INDEX_32_LIMIT, MAX_GRID, PACK_BYTES, KernelSource, broadcast_index, collapse_dims, \
    member_expressions, why_not_generated, _padded

ROW_OPS = ("layernorm", "rmsnorm", "softmax", "log_softmax")
PARAMETERS = {"layernorm": ("gamma", "beta"), "rmsnorm": ("gamma",), "softmax": (), "log_softmax": ()}
ROW_LIMIT = 16384  # elements a row held in registers: 16 floats a thread at 1024 threads
WARP_ROW_LIMIT = 1024
WARP_ROWS_PER_BLOCK = 4
MAX_THREADS = 1024
PREFETCH_PACKS = 8  # 16-byte packs of the epilogue's operands a thread loads early (registers)


@dataclass(frozen=True)
class RowGroup:
    members: tuple[Member, ...]
    outputs: tuple[int, ...]
    row: int  # index of the row op member

    @staticmethod
    def from_attrs(attrs: dict) -> "RowGroup":
        members = members_of(attrs["members"])
        rows = [j for j, m in enumerate(members) if m.op in ROW_OPS]
        if len(rows) != 1:
            raise ValueError(f"members: expected exactly one row op ({', '.join(ROW_OPS)}), got {len(rows)}")
        row = rows[0]
        member = members[row]
        x = member.args[0]
        expected = ("member", row - 1) if row else ("input", 0)
        if x is None or tuple(x[:2]) != expected:
            raise ValueError(f"members[{row}] ({member.node}): its x must be {expected} (the prologue's last member, "
                             f"or input 0 without a prologue), got {x!r}")
        for arg in member.args[1:]:
            if arg is None or arg[0] not in ("input", "constant"):
                raise ValueError(f"members[{row}] ({member.node}): its parameters must be group inputs or constants, "
                                 f"got {arg!r}")
        kept = row - 1 if row else None  # the prologue member the epilogue may read (held in registers)
        for j, epilogue_member in enumerate(members[row + 1:], start=row + 1):
            for arg in epilogue_member.args:
                if arg is not None and arg[0] == "member" and arg[1] < row and arg[1] != kept:
                    raise ValueError(f"members[{j}] ({epilogue_member.node}): an epilogue member reads prologue "
                                     f"member {arg[1]}, which is not kept (only the row op's input is)")
        outputs = tuple(attrs["outputs"])
        if not outputs:
            raise ValueError("outputs: expected at least one member index")
        for index in outputs:
            if not (0 <= index < len(members) and (index >= row or index == kept)):
                raise ValueError(f"outputs: member index {index} must be the row op's input member ({kept}), the "
                                 f"row op ({row}) or an epilogue member (up to {len(members) - 1})")
        return RowGroup(members, outputs, row)

    @property
    def op(self) -> str:
        return self.members[self.row].op

    def infer(self, in_types) -> list[TensorType]:
        types = member_types(self.members, in_types)
        shape = types[self.row].shape
        member = self.members[self.row]
        if member.op in ("softmax", "log_softmax") and member.attrs["axis"] % len(shape) != len(shape) - 1:
            raise ValueError(f"members[{self.row}] ({member.node}): a fused {member.op} normalizes the last axis, "
                             f"got axis={member.attrs['axis']} of rank {len(shape)}")
        for j in range(len(self.members)):
            if j != self.row and types[j].shape != shape:
                raise ValueError(f"members[{j}] ({self.members[j].node}): shape {types[j].shape} is not the row "
                                 f"shape {shape}")
        return [types[i] for i in self.outputs]

    def reference(self, inputs) -> list[np.ndarray]:
        values = run_members(self.members, inputs)
        return [values[i] for i in self.outputs]

    def why_not(self, in_types, out_types) -> str | None:
        why = why_not_generated(self.members[:self.row] + self.members[self.row + 1:], in_types, out_types)
        if why:
            return why
        types = member_types(self.members, in_types)
        x = types[self.row]
        if x.dtype not in FLOAT_DTYPES:
            return f"the row op's input is {x.dtype}: generated row kernels normalize floating values"
        cols = x.shape[-1] if x.rank else 1
        if cols > ROW_LIMIT:
            return f"rows of {cols} elements exceed the register-resident bound ({ROW_LIMIT})"
        return None

    # --- code -----------------------------------------------------------------------------------------------------
    def source(self, name: str, in_types, out_types) -> KernelSource:
        members, row_index = self.members, self.row
        types = member_types(members, in_types)
        shape = tuple(types[row_index].shape)
        cols = shape[-1]
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        wide = rows * cols > INDEX_32_LIMIT
        index_type, suffix = ("unsigned long long", "ull") if wide else ("unsigned int", "u")
        row_member = members[row_index]
        parameter_args = row_member.args[1:]
        prologue = members[:row_index]
        epilogue = members[row_index + 1:]

        def inputs_of(group) -> list[int]:
            return sorted({a[1] for m in group for a in m.args if a is not None and a[0] == "input"})

        prologue_inputs = inputs_of(prologue) if prologue else [0]
        epilogue_inputs = inputs_of(epilogue)
        full = {k: tuple(_padded(t.shape, len(shape))) == shape for k, t in enumerate(in_types)}
        extents, carried = collapse_dims(shape, [t.shape for t in in_types])

        reread = [k for k in epilogue_inputs if k or row_index]  # input 0 without a prologue is in registers
        streamed = sorted({k for k in prologue_inputs + reread if full[k]})
        parameter_inputs = sorted({a[1] for a in parameter_args if a[0] == "input"})  # packs at col0 when aligned
        full_sizes = [itemsize(in_types[k].dtype) for k in streamed + parameter_inputs]
        full_sizes += [itemsize(t.dtype) for t in out_types]
        vector = PACK_BYTES // min(full_sizes)
        if cols % vector:
            vector = 1
        warp_rows = cols <= WARP_ROW_LIMIT
        if warp_rows:
            row_threads, block = 32, 32 * WARP_ROWS_PER_BLOCK
        else:  # two chunks a thread (more loads in flight, more blocks a multiprocessor), 128 to 1024 threads
            packs_per_row = -(-cols // vector)
            row_threads = min(MAX_THREADS, max(128, -(-packs_per_row // (2 * 32)) * 32))
            block = row_threads
        chunks = -(-cols // (vector * row_threads))
        warps = block // 32
        kept = row_index - 1 if row_index else None

        def packs_of(dtype: str) -> int:
            return vector * itemsize(dtype) // PACK_BYTES

        def element(k: int, vectorized: bool) -> str:
            """Input k at the element (``i``, lane ``l`` of chunk ``c``) as its compute type."""
            t = in_types[k]
            if full[k]:
                raw = f"e{k}[l]" if vectorized else f"in{k}[i]"
            else:
                raw = f"in{k}[{broadcast_index(extents, carried[k], 'i', suffix)}]"
            return elements.from_storage(t.dtype, raw)

        # The epilogue's full-shape operands (a residual) are loaded with the row, in the vectorized path, so their
        # latency hides behind the statistics' reductions (within PREFETCH_PACKS a thread).
        prefetched, budget = [], PREFETCH_PACKS
        for k in (k for k in reread if full[k] and vector > 1):
            if chunks * packs_of(in_types[k].dtype) <= budget:
                prefetched.append(k)
                budget -= chunks * packs_of(in_types[k].dtype)

        def pack_loads(ks, phase: int) -> list[str]:
            lines = []
            for k in ks:
                if not full[k]:
                    continue
                storage = elements.storage_type(in_types[k].dtype)
                packs = packs_of(in_types[k].dtype)
                if phase == 3 and k in prefetched:
                    lines.append(f"const {storage}* e{k} = reinterpret_cast<const {storage}*>(pre{k} + c * {packs});")
                    continue
                lines.append(f"ge2_pack p{k}[{packs}];")
                lines += [f"p{k}[{q}] = reinterpret_cast<const ge2_pack*>(in{k} + base)[{q}];" for q in range(packs)]
                lines.append(f"const {storage}* e{k} = reinterpret_cast<const {storage}*>(p{k});")
            if phase == 1:
                for k in prefetched:
                    packs = packs_of(in_types[k].dtype)
                    source = f"p{k}" if k in ks else f"reinterpret_cast<const ge2_pack*>(in{k} + base)"
                    lines += [f"pre{k}[c * {packs} + {q}] = {source}[{q}];" for q in range(packs)]
            return lines

        def input_values(ks, vectorized: bool) -> list[str]:
            return [f"const {elements.compute_type(in_types[k].dtype)} x{k} = {element(k, vectorized)};" for k in ks]

        # Phase 1: the prologue into the register row.
        def phase1(vectorized: bool) -> list[str]:
            lines = input_values(prologue_inputs, vectorized)
            if prologue:
                lines += member_expressions(members, types, lambda k: f"x{k}", in_types, "m",
                                            only=range(row_index))
                lines.append(f"v[c * {vector} + l] = (float)(m{row_index - 1});")
            else:
                lines.append("v[c * %d + l] = (float)(x0);" % vector)
            return lines

        # gamma/beta (shape (cols,)): packs at col0 in the vectorized path, like the streamed operands
        vectorized_parameter = {"value": False}

        def parameter(position: int) -> str:
            arg = parameter_args[position]
            if arg[0] == "constant":
                return f"(float)({elements.literal(arg[1], arg[2])})"
            raw = f"g{arg[1]}[l]" if vectorized_parameter["value"] else f"in{arg[1]}[col]"
            return f"(float)({elements.from_storage(in_types[arg[1]].dtype, raw)})"

        op = row_member.op

        def normalize() -> str:
            if op == "layernorm":
                return f"(value - mean) * rstd * {parameter(0)} + {parameter(1)}"
            if op == "rmsnorm":
                return f"value * rstd * {parameter(0)}"
            if op == "softmax":
                return "expf(value - row_max) * inverse_sum"
            return "(value - row_max) - log_sum"

        # Phase 3: the row op's output, the epilogue and the stores.
        def phase3(vectorized: bool) -> list[str]:
            lines = ["const float value = v[c * %d + l];" % vector, "const unsigned col = col0 + l;", "(void)col;"]
            if kept is not None:
                lines += [f"const float m{kept} = value;", f"(void)m{kept};"]
            vectorized_parameter["value"] = vectorized
            lines.append(f"const float m{row_index} = {normalize()};  // {op} ({row_member.node})")
            if kept is None and 0 in epilogue_inputs:  # the row op's input, read again (x + f(x)): from registers
                lines.append(f"const {elements.compute_type(in_types[0].dtype)} x0 = value;")
            lines += input_values([k for k in epilogue_inputs if k or kept is not None], vectorized)
            lines += member_expressions(members, types, lambda k: f"x{k}", in_types, "m",
                                        only=range(row_index + 1, len(members)))
            for k, (index, t) in enumerate(zip(self.outputs, out_types)):
                value = elements.to_storage(t.dtype, f"m{index}")
                lines.append(f"f{k}[l] = {value};" if vectorized else f"out{k}[i] = {value};")
            return lines

        def chunk_loop(body_vector: list[str], body_scalar: list[str], loads, stores: bool) -> str:
            vector_lines = list(pack_loads(loads, 3 if stores else 1))
            if stores:
                for k in parameter_inputs:
                    storage = elements.storage_type(in_types[k].dtype)
                    packs = packs_of(in_types[k].dtype)
                    vector_lines.append(f"ge2_pack gp{k}[{packs}];")
                    vector_lines += [f"gp{k}[{q}] = reinterpret_cast<const ge2_pack*>(in{k} + col0)[{q}];"
                                     for q in range(packs)]
                    vector_lines.append(f"const {storage}* g{k} = reinterpret_cast<const {storage}*>(gp{k});")
                for k, t in enumerate(out_types):
                    storage = elements.storage_type(t.dtype)
                    vector_lines.append(f"ge2_pack q{k}[{packs_of(t.dtype)}];")
                    vector_lines.append(f"{storage}* f{k} = reinterpret_cast<{storage}*>(q{k});")
            store_lines = []
            if stores:
                for k, t in enumerate(out_types):
                    store_lines += [f"reinterpret_cast<ge2_pack*>(out{k} + base)[{q}] = q{k}[{q}];"
                                    for q in range(packs_of(t.dtype))]
            scalar = f"""#pragma unroll
for (int l = 0; l < {vector}; ++l) {{
  const index_t i = base + l;
  (void)i;
{indent(body_scalar, 2)}
}}"""
            if vector > 1:
                scalar = f"""if (vectorized) {{
{indent(vector_lines, 2)}
#pragma unroll
  for (int l = 0; l < {vector}; ++l) {{
    const index_t i = base + l;
    (void)i;
{indent(body_vector, 4)}
  }}
{indent(store_lines, 2)}
}} else {{
{indent([scalar], 2)}
}}"""
            return f"""#pragma unroll
for (int c = 0; c < {chunks}; ++c) {{
  const unsigned col0 = (c * {row_threads}u + lane_in_row) * {vector}u;
  if (col0 < {cols}u) {{
    const index_t base = row * {cols}{suffix} + col0;
{indent([scalar], 4)}
  }}
}}"""

        def valid_sum(expression: str) -> str:
            return f"""{{
      float partial_sum = 0.0f;
#pragma unroll
      for (int c = 0; c < {chunks}; ++c) {{
        if ((c * {row_threads}u + lane_in_row) * {vector}u < {cols}u) {{
#pragma unroll
          for (int l = 0; l < {vector}; ++l) {{
            const float value = v[c * {vector} + l];
            partial_sum += {expression};
          }}
        }}
      }}"""

        if op == "layernorm":
            statistics = f"""float mean, rstd;
    {valid_sum("value")}
      mean = {name}_row_sum(partial_sum, partial) / (float){cols};
    }}
    {valid_sum("(value - mean) * (value - mean)")}
      rstd = 1.0f / sqrtf({name}_row_sum(partial_sum, partial) / (float){cols} + {elements.literal(row_member.attrs['eps'], 'float32')});
    }}"""
        elif op == "rmsnorm":
            statistics = f"""float rstd;
    {valid_sum("value * value")}
      rstd = 1.0f / sqrtf({name}_row_sum(partial_sum, partial) / (float){cols} + {elements.literal(row_member.attrs['eps'], 'float32')});
    }}"""
        else:
            statistics = f"""float row_max = -__int_as_float(0x7f800000);
#pragma unroll
    for (int c = 0; c < {chunks}; ++c) {{
      if ((c * {row_threads}u + lane_in_row) * {vector}u < {cols}u) {{
#pragma unroll
        for (int l = 0; l < {vector}; ++l) row_max = {name}_max(row_max, v[c * {vector} + l]);
      }}
    }}
    row_max = {name}_row_max(row_max, partial);
    float row_sum;
    {valid_sum("expf(value - row_max)")}
      row_sum = {name}_row_sum(partial_sum, partial);
    }}
    const float inverse_sum = 1.0f / row_sum;
    const float log_sum = logf(row_sum);
    (void)inverse_sum;
    (void)log_sum;"""

        if warp_rows:
            reduce_helpers = f"""
__device__ __forceinline__ float {name}_row_sum(float value, float*) {{
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}}
__device__ __forceinline__ float {name}_row_max(float value, float*) {{
  for (int offset = 16; offset > 0; offset >>= 1) value = {name}_max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}}"""
            row_loop = f"""for (index_t row = (index_t)blockIdx.x * {WARP_ROWS_PER_BLOCK}{suffix} + threadIdx.x / 32; row < {rows}{suffix};
       row += (index_t)gridDim.x * {WARP_ROWS_PER_BLOCK}{suffix}) {{"""
            shared = "float* partial = nullptr;"
        else:
            reduce_helpers = f"""
// A block per row: each warp reduces its values, warp 0's lanes read the {warps} partials; every thread gets the
// result. The trailing barrier lets the next reduction reuse ``partial``.
__device__ __forceinline__ float {name}_row_sum(float value, float* partial) {{
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < {warps}; ++w) total += partial[w];
  __syncthreads();
  return total;
}}
__device__ __forceinline__ float {name}_row_max(float value, float* partial) {{
  for (int offset = 16; offset > 0; offset >>= 1) value = {name}_max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
  __syncthreads();
  float total = -__int_as_float(0x7f800000);
#pragma unroll
  for (int w = 0; w < {warps}; ++w) total = {name}_max(total, partial[w]);
  __syncthreads();
  return total;
}}"""
            row_loop = f"for (index_t row = blockIdx.x; row < {rows}{suffix}; row += gridDim.x) {{"
            shared = f"__shared__ float partial[{warps}];"

        aligned_pointers = [f"in{k}" for k in sorted(set(streamed + parameter_inputs))]
        aligned_pointers += [f"out{k}" for k in range(len(out_types))]
        vectorized = ("(" + " | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in aligned_pointers)
                      + ") % 16ull == 0") if vector > 1 else "false"
        parameters = [f"const {elements.storage_type(t.dtype)}* __restrict__ in{k}" for k, t in enumerate(in_types)]
        parameters += [f"{elements.storage_type(t.dtype)}* __restrict__ out{k}" for k, t in enumerate(out_types)]
        source = f"""{elements.PREAMBLE}
// NaN-propagating maximum (as NumPy's). The helpers carry the kernel's name: several kernels may share a source.
__device__ __forceinline__ float {name}_max(float a, float b) {{ return (b > a || b != b) ? b : a; }}
{reduce_helpers}
// {op} ({row_member.node}) over rows of {cols} of {shape}: {rows} rows, {"a warp" if warp_rows else f"a block of {row_threads} threads"} per row, {chunks} chunk(s) of {vector} a thread
// prologue: {", ".join(f"{m.op} ({m.node})" for m in prologue) or "none"}; epilogue: {", ".join(f"{m.op} ({m.node})" for m in epilogue) or "none"}
extern "C" __global__ void __launch_bounds__({block}) {name}({", ".join(parameters)}) {{
  typedef {index_type} index_t;
  const unsigned lane_in_row = threadIdx.x % {row_threads}u;
  const bool vectorized = {vectorized};
  (void)vectorized;
  {shared}
  {row_loop}
    float v[{chunks * vector}];
{indent([f"ge2_pack pre{k}[{chunks * packs_of(in_types[k].dtype)}];" for k in prefetched], 4)}
{indent([chunk_loop(phase1(True), phase1(False), prologue_inputs, False)], 4)}
    {statistics}
{indent([chunk_loop(phase3(True), phase3(False), reread, True)], 4)}
  }}
}}
"""
        rows_per_block = WARP_ROWS_PER_BLOCK if warp_rows else 1
        grid = min(-(-rows // rows_per_block), MAX_GRID) if rows else 0
        return KernelSource(name, source, grid, block, len(in_types), len(out_types))


def indent(lines, depth: int) -> str:
    return "\n".join(" " * depth + line if line else line for text in lines for line in text.split("\n"))
