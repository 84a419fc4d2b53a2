"""CUDA C++ for a row reduction with a pointwise prologue and epilogue (``fused_reduction``).

The prologue's last member, of shape ``S``, is reduced over its trailing ``axes`` dims: ``rows = prod(S[:-axes])``
rows of ``cols = prod(S[-axes:])`` elements. Each row is read once: the prologue is computed element by element as
the row is loaded (16-byte packs for operands of the full shape when they are aligned and the row length allows),
accumulated in float32 in registers, combined across the row's threads with warp shuffles (and, for a block per
row, through shared memory), and the epilogue runs on the row's result before the one store per output.
- rows of at most ``WARP_ROW_LIMIT`` elements: a warp per row, 8 rows per block;
- longer rows: a block of ``BLOCK`` threads per row.
``max``/``min`` propagate NaN (as NumPy); ``mean`` divides the float32 sum by the row length.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dtypes import FLOAT_DTYPES, itemsize
from ..ir.types import TensorType
from ..ir.schema import OPS
from . import elements
from .group import Member, member_types, members_of, run_members
from .pointwise import (BLOCK, INDEX_32_LIMIT, MAX_GRID, PACK_BYTES, KernelSource, broadcast_index, collapse_dims,
                        member_expressions, why_not_generated, _padded)

REDUCTIONS = ("sum", "mean", "max", "min")
WARP_ROW_LIMIT = 1024
_IDENTITY = {"sum": "0.0f", "mean": "0.0f", "max": "-__int_as_float(0x7f800000)", "min": "__int_as_float(0x7f800000)"}
_COMBINE = {"sum": "{a} + {b}", "mean": "{a} + {b}",
            "max": "(({b}) > ({a}) || ({b}) != ({b})) ? ({b}) : ({a})",
            "min": "(({b}) < ({a}) || ({b}) != ({b})) ? ({b}) : ({a})"}


@dataclass(frozen=True)
class ReductionGroup:
    members: tuple[Member, ...]
    reduce: str
    axes: int
    keepdims: bool
    epilogue: tuple[Member, ...]
    outputs: tuple[int, ...]

    @staticmethod
    def from_attrs(attrs: dict) -> "ReductionGroup":
        group = ReductionGroup(members_of(attrs["members"]), attrs["reduce"], attrs["axes"], attrs["keepdims"],
                               members_of(attrs["epilogue"], reduced=True), tuple(attrs["outputs"]))
        for index in group.outputs:
            if not 0 <= index < len(group.epilogue):
                raise ValueError(f"outputs: epilogue member index {index} out of range ({len(group.epilogue)} "
                                 f"epilogue members)")
        return group

    def all_members(self) -> tuple[Member, ...]:
        return self.members + (Member(self.reduce, f"{self.reduce} over {self.axes} trailing dim(s)", {}, ()),) \
            + self.epilogue

    # --- types and the reference ----------------------------------------------------------------------------------
    def _types(self, in_types):
        types = member_types(self.members, in_types)
        full = types[-1]
        if self.axes > full.rank:
            raise ValueError(f"axes: {self.axes} trailing dims reduced, but the reduced value has rank {full.rank}")
        if full.is_concrete and any(d == 0 for d in full.shape[full.rank - self.axes:]):
            raise ValueError(f"axes: reduced dims {full.shape[full.rank - self.axes:]} hold no element")
        kept = full.shape[:full.rank - self.axes]
        reduced = TensorType(kept + ((1,) * self.axes if self.keepdims else ()), full.dtype)
        return types, reduced, member_types(self.epilogue, in_types, reduced)

    def infer(self, in_types) -> list[TensorType]:
        _, reduced, epilogue = self._types(in_types)
        return [epilogue[i] for i in self.outputs] if self.outputs else [reduced]

    def reference(self, inputs) -> list[np.ndarray]:
        value = run_members(self.members, inputs)[-1]
        axis = tuple(range(value.ndim - self.axes, value.ndim))
        if self.reduce in OPS:
            reduced = OPS[self.reduce].run_reference([value], {"axis": axis, "keepdims": self.keepdims})[0]
        else:  # min: no op of its own; NumPy's, rounded to the dtype as an op's reference would be
            reduced = np.min(value.astype(np.float64), axis=axis, keepdims=self.keepdims).astype(value.dtype)
        if not self.outputs:
            return [reduced]
        values = run_members(self.epilogue, inputs, reduced)
        return [values[i] for i in self.outputs]

    # --- code -----------------------------------------------------------------------------------------------------
    def why_not(self, in_types, out_types) -> str | None:
        why = why_not_generated(self.members + self.epilogue, in_types, out_types)
        if why:
            return why
        _, reduced, _ = self._types(in_types)
        if reduced.dtype not in FLOAT_DTYPES:
            return f"the reduced value is {reduced.dtype}: generated reductions accumulate floating values"
        return None

    def source(self, name: str, in_types, out_types) -> KernelSource:
        types, reduced, epilogue_types = self._types(in_types)
        shape = tuple(types[-1].shape)
        rank = len(shape)
        rows = int(np.prod(shape[:rank - self.axes], dtype=np.int64))
        cols = int(np.prod(shape[rank - self.axes:], dtype=np.int64))
        wide = rows * cols > INDEX_32_LIMIT
        index_type, suffix = ("unsigned long long", "ull") if wide else ("unsigned int", "u")
        in_dtypes = [t.dtype for t in in_types]
        prologue_inputs = sorted({a[1] for m in self.members for a in m.args if a is not None and a[0] == "input"})
        epilogue_inputs = sorted({a[1] for m in self.epilogue for a in m.args if a is not None and a[0] == "input"})
        full = {k: tuple(_padded(in_types[k].shape, rank)) == shape for k in prologue_inputs}
        extents, carried = collapse_dims(shape, [in_types[k].shape for k in prologue_inputs])
        carried_of = dict(zip(prologue_inputs, carried))
        out_shape = tuple(reduced.shape)
        out_extents, out_carried = collapse_dims(out_shape, [in_types[k].shape for k in epilogue_inputs])
        out_carried_of = dict(zip(epilogue_inputs, out_carried))

        full_sizes = [itemsize(in_types[k].dtype) for k in prologue_inputs if full[k]]
        vector = PACK_BYTES // min(full_sizes) if full_sizes else 1
        if cols % vector:
            vector = 1
        warp_rows = cols <= WARP_ROW_LIMIT
        row_threads = 32 if warp_rows else BLOCK
        rows_per_block = BLOCK // row_threads

        def load(k: str, index: str) -> str:
            return elements.from_storage(in_dtypes[k], f"in{k}[{index}]")

        def prologue(value_of_full) -> list[str]:
            lines = []
            for k in prologue_inputs:
                value = value_of_full(k) if full[k] else load(k, broadcast_index(extents, carried_of[k], "i", suffix))
                lines.append(f"const {elements.compute_type(in_dtypes[k])} x{k} = {value};")
            lines += member_expressions(self.members, types, lambda k: f"x{k}", in_types, "m")
            last = f"m{len(self.members) - 1}"
            combine = _COMBINE[self.reduce].format(a="acc", b=f"(float)({last})")
            lines.append(f"acc = {combine};")
            return lines

        vector_lines = []
        for k in prologue_inputs:
            if full[k]:
                packs = vector * itemsize(in_dtypes[k]) // PACK_BYTES
                vector_lines.append(f"ge2_pack p{k}[{packs}];")
                vector_lines += [f"p{k}[{q}] = reinterpret_cast<const ge2_pack*>(in{k})[(base / {vector}{suffix})"
                                 f" * {packs}{suffix} + {q}];" for q in range(packs)]
                storage = elements.storage_type(in_dtypes[k])
                vector_lines.append(f"const {storage}* e{k} = reinterpret_cast<const {storage}*>(p{k});")
        vector_element = prologue(lambda k: elements.from_storage(in_dtypes[k], f"e{k}[lane]"))
        scalar_element = prologue(lambda k: load(k, "i"))

        epilogue_lines = []
        for k in epilogue_inputs:
            value = load(k, broadcast_index(out_extents, out_carried_of[k], "row", suffix))
            epilogue_lines.append(f"const {elements.compute_type(in_dtypes[k])} z{k} = {value};")
        result = "acc" if self.reduce != "mean" else f"(acc / (float){cols})"
        epilogue_lines.append(f"const float r = {result};")
        epilogue_lines += member_expressions(self.epilogue, epilogue_types, lambda k: f"z{k}", in_types, "e",
                                             reduced=("r", reduced))
        stored = [f"e{i}" for i in self.outputs] or ["r"]
        epilogue_lines += [f"out{k}[row] = {elements.to_storage(t.dtype, value)};"
                           for k, (value, t) in enumerate(zip(stored, out_types))]

        aligned_pointers = [f"in{k}" for k in prologue_inputs if full[k]]
        aligned = (" | ".join(f"reinterpret_cast<unsigned long long>({p})" for p in aligned_pointers)
                   if aligned_pointers and vector > 1 else None)
        parameters = [f"const {elements.storage_type(t.dtype)}* __restrict__ in{k}" for k, t in enumerate(in_types)]
        parameters += [f"{elements.storage_type(t.dtype)}* __restrict__ out{k}" for k, t in enumerate(out_types)]
        combine_other = _COMBINE[self.reduce].format(a="acc", b="other")

        def indent(lines, depth):
            return "\n".join(" " * depth + line for line in lines)

        if warp_rows:
            cross = f"""  const bool has_row = row < {rows}{suffix};"""
            block_combine = ""
            store_guard = "lane_in_row == 0 && has_row"
            row_loop_head = f"""for (index_t row_base = (index_t)blockIdx.x * {rows_per_block}{suffix}; row_base < {rows}{suffix};
       row_base += (index_t)gridDim.x * {rows_per_block}{suffix}) {{
    const index_t row = row_base + threadIdx.x / 32;
{cross}"""
        else:
            block_combine = f"""
    if (lane == 0) partial[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {{
      acc = threadIdx.x < {BLOCK // 32} ? partial[threadIdx.x] : {_IDENTITY[self.reduce]};
      for (int offset = 16; offset > 0; offset >>= 1) {{
        const float other = __shfl_xor_sync(0xffffffffu, acc, offset);
        acc = {combine_other};
      }}
    }}
    __syncthreads();  // partial is rewritten by the next row"""
            store_guard = "threadIdx.x == 0"
            row_loop_head = f"""for (index_t row = blockIdx.x; row < {rows}{suffix}; row += gridDim.x) {{
    const bool has_row = true;"""
        vector_loop = ""
        if aligned is not None:
            vector_loop = f"""if ((({aligned}) & 15ull) == 0) {{
      for (index_t col = (index_t)lane_in_row * {vector}{suffix}; has_row && col < {cols}{suffix}; col += {row_threads * vector}{suffix}) {{
        const index_t base = row * {cols}{suffix} + col;
{indent(vector_lines, 8)}
#pragma unroll
        for (int lane = 0; lane < {vector}; ++lane) {{
          const index_t i = base + lane;
          (void)i;
{indent(vector_element, 10)}
        }}
      }}
    }} else """
        source = f"""{elements.PREAMBLE}
// {self.reduce} over {self.axes} trailing dim(s) of {shape}: {rows} rows of {cols}; prologue {len(self.members)} op(s): {", ".join(f"{m.op} ({m.node})" for m in self.members)}; epilogue {len(self.epilogue)} op(s)
extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({", ".join(parameters)}) {{
  typedef {index_type} index_t;
  const unsigned lane_in_row = threadIdx.x % {row_threads};
  const unsigned lane = threadIdx.x % 32;
  (void)lane;
  {"__shared__ float partial[" + str(BLOCK // 32) + "];" if not warp_rows else ""}
  {row_loop_head}
    float acc = {_IDENTITY[self.reduce]};
    {vector_loop}{{
      for (index_t col = lane_in_row; has_row && col < {cols}{suffix}; col += {row_threads}{suffix}) {{
        const index_t i = row * {cols}{suffix} + col;
{indent(scalar_element, 8)}
      }}
    }}
    for (int offset = 16; offset > 0; offset >>= 1) {{
      const float other = __shfl_xor_sync(0xffffffffu, acc, offset);
      acc = {combine_other};
    }}{block_combine}
    if ({store_guard}) {{
{indent(epilogue_lines, 6)}
    }}
  }}
}}
"""
        blocks = (rows + rows_per_block - 1) // rows_per_block
        return KernelSource(name, source, min(blocks, MAX_GRID) if rows else 0, BLOCK, len(in_types),
                            len(out_types))

