"""CUDA C++ for a row reduction with a pointwise prologue and epilogue (``fused_reduction``).

The prologue's last member, of shape ``S``, is reduced over its trailing ``axes`` dims: ``rows = prod(S[:-axes])``
rows of ``cols = prod(S[-axes:])`` elements. Each row is read once: the prologue is computed element by element as
the row is loaded (16-byte packs for operands of the full shape when they are aligned and the row length allows),
accumulated in float32 in registers, combined across the row's threads with warp shuffles (and, for a block per
row, through shared memory), and the epilogue runs on the row's result before the one store per output.
- rows of at most ``WARP_ROW_LIMIT`` elements: a warp per row, 8 rows per block;
- longer rows: a block of ``BLOCK`` threads per row.
``max``/``min`` propagate NaN (as NumPy); ``mean`` divides the float32 sum by the row length.
``var``/``std``, the two-output form of ``m = mean(x, keepdims=True); mean((x - m)^2)`` (and its ``sqrt``): one read
of the row, Welford's running mean and sum of squared deviations per thread, combined across threads with Chan's
formula; outputs the mean (reduced dims kept) and the population variance (or standard deviation).
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

REDUCTIONS = ("sum", "mean", "max", "min", "var", "std")
MOMENTS = ("var", "std")  # two outputs: the mean (its dims kept) and the population variance or its square root
WARP_ROW_LIMIT = 1024
_IDENTITY = {"sum": "0.0f", "mean": "0.0f", "max": "-__int_as_float(0x7f800000)", "min": "__int_as_float(0x7f800000)"}
_COMBINE = {"sum": "{a} + {b}", "mean": "{a} + {b}",
            "max": "(({b}) > ({a}) || ({b}) != ({b})) ? ({b}) : ({a})",
            "min": "(({b}) < ({a}) || ({b}) != ({b})) ? ({b}) : ({a})"}


_WARPS = BLOCK // 32
_WELFORD = r"""
// Welford: a running mean and sum of squared deviations, one value at a time; Chan: two such partials combined.
__device__ __forceinline__ void ge2_welford_add(float& n, float& mean, float& m2, float value) {
  n += 1.0f;
  const float delta = value - mean;
  mean += delta / n;
  m2 += delta * (value - mean);
}
__device__ __forceinline__ void ge2_welford_combine(float& n, float& mean, float& m2, float other_n,
                                                    float other_mean, float other_m2) {
  if (other_n == 0.0f) return;
  const float total = n + other_n;
  const float delta = other_mean - mean;
  const float weight = other_n / total;
  mean += delta * weight;
  m2 += other_m2 + delta * delta * n * weight;
  n = total;
}
"""


class _Accumulator:
    """The C++ of a reduction's per-thread state: declared, combined across a warp, through shared memory."""

    def __init__(self, reduce: str):
        self.moments = reduce in MOMENTS
        self.reduce = reduce
        self.names = ("acc_n", "acc_mean", "acc_m2") if self.moments else ("acc",)

    def declare(self) -> str:
        if self.moments:
            return "float acc_n = 0.0f, acc_mean = 0.0f, acc_m2 = 0.0f;"
        return f"float acc = {_IDENTITY[self.reduce]};"

    def warp_reduce(self) -> list[str]:
        lines = ["for (int offset = 16; offset > 0; offset >>= 1) {"]
        lines += [f"  const float other_{n} = __shfl_xor_sync(0xffffffffu, {n}, offset);" for n in self.names]
        if self.moments:
            lines.append("  ge2_welford_combine(acc_n, acc_mean, acc_m2, other_acc_n, other_acc_mean, other_acc_m2);")
        else:
            lines.append(f"  acc = {_COMBINE[self.reduce].format(a='acc', b='other_acc')};")
        return lines + ["}"]

    def shared(self) -> str:
        return f"__shared__ float partial[{len(self.names)}][{_WARPS}];"

    def to_shared(self) -> list[str]:
        return [f"partial[{k}][threadIdx.x / 32] = {n};" for k, n in enumerate(self.names)]

    def from_shared(self) -> list[str]:
        identity = ["0.0f"] * 3 if self.moments else [_IDENTITY[self.reduce]]
        return [f"{n} = threadIdx.x < {_WARPS} ? partial[{k}][threadIdx.x] : {identity[k]};"
                for k, n in enumerate(self.names)]


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
        group = ReductionGroup(members_of(attrs["members"], allow_empty=True), attrs["reduce"], attrs["axes"],
                               attrs["keepdims"], members_of(attrs["epilogue"], reduced=True),
                               tuple(attrs["outputs"]))
        if group.reduce in MOMENTS and (group.epilogue or group.outputs):
            raise ValueError(f"epilogue: a {group.reduce} reduction has no epilogue (its outputs are the mean and "
                             f"the {group.reduce})")
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
        full = types[-1] if types else in_types[0]  # no prologue: the first input is reduced
        if self.axes > full.rank:
            raise ValueError(f"axes: {self.axes} trailing dims reduced, but the reduced value has rank {full.rank}")
        if full.is_concrete and any(d == 0 for d in full.shape[full.rank - self.axes:]):
            raise ValueError(f"axes: reduced dims {full.shape[full.rank - self.axes:]} hold no element")
        kept = full.shape[:full.rank - self.axes]
        reduced = TensorType(kept + ((1,) * self.axes if self.keepdims else ()), full.dtype)
        return types, reduced, member_types(self.epilogue, in_types, reduced)

    def infer(self, in_types) -> list[TensorType]:
        types, reduced, epilogue = self._types(in_types)
        if self.reduce in MOMENTS:
            full = types[-1] if types else in_types[0]
            return [TensorType(full.shape[:full.rank - self.axes] + (1,) * self.axes, full.dtype), reduced]
        return [epilogue[i] for i in self.outputs] if self.outputs else [reduced]

    def reference(self, inputs) -> list[np.ndarray]:
        value = run_members(self.members, inputs)[-1] if self.members else inputs[0]
        axis = tuple(range(value.ndim - self.axes, value.ndim))
        if self.reduce in MOMENTS:  # as the unfused nodes compute it, each result rounded to the dtype
            mean = OPS["mean"].run_reference([value], {"axis": axis, "keepdims": True})[0]
            deviation = OPS["sub"].run_reference([value, mean], {})[0]
            square = OPS["mul"].run_reference([deviation, deviation], {})[0]
            variance = OPS["mean"].run_reference([square], {"axis": axis, "keepdims": self.keepdims})[0]
            if self.reduce == "std":
                variance = OPS["sqrt"].run_reference([variance], {})[0]
            return [mean, variance]
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
        shape = tuple((types[-1] if types else in_types[0]).shape)
        rank = len(shape)
        rows = int(np.prod(shape[:rank - self.axes], dtype=np.int64))
        cols = int(np.prod(shape[rank - self.axes:], dtype=np.int64))
        wide = rows * cols > INDEX_32_LIMIT
        index_type, suffix = ("unsigned long long", "ull") if wide else ("unsigned int", "u")
        in_dtypes = [t.dtype for t in in_types]
        prologue_inputs = sorted({a[1] for m in self.members for a in m.args if a is not None and a[0] == "input"}
                                 if self.members else {0})
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
        moments = self.reduce in MOMENTS
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
            last = f"m{len(self.members) - 1}" if self.members else "x0"
            if moments:
                lines.append(f"ge2_welford_add(acc_n, acc_mean, acc_m2, (float)({last}));")
            else:
                lines.append(f"acc = {_COMBINE[self.reduce].format(a='acc', b=f'(float)({last})')};")
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
        if moments:
            variance = f"acc_m2 / (float){cols}"
            second = f"sqrtf({variance})" if self.reduce == "std" else variance
            epilogue_lines += [f"out0[row] = {elements.to_storage(out_types[0].dtype, 'acc_mean')};",
                               f"out1[row] = {elements.to_storage(out_types[1].dtype, second)};"]
        else:
            for k in epilogue_inputs:
                value = load(k, broadcast_index(out_extents, out_carried_of[k], "row", suffix))
                epilogue_lines.append(f"const {elements.compute_type(in_dtypes[k])} z{k} = {value};")
            epilogue_lines.append("const float r = " + ("acc;" if self.reduce != "mean" else f"acc / (float){cols};"))
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
        accumulator = _Accumulator(self.reduce)

        def indent(lines, depth):
            return "\n".join(" " * depth + line for line in lines)

        if warp_rows:
            block_combine = ""
            store_guard = "lane_in_row == 0 && has_row"
            row_loop_head = f"""for (index_t row_base = (index_t)blockIdx.x * {rows_per_block}{suffix}; row_base < {rows}{suffix};
       row_base += (index_t)gridDim.x * {rows_per_block}{suffix}) {{
    const index_t row = row_base + threadIdx.x / 32;
    const bool has_row = row < {rows}{suffix};"""
        else:
            block_combine = f"""
    if (lane == 0) {{
{indent(accumulator.to_shared(), 6)}
    }}
    __syncthreads();
    if (threadIdx.x < 32) {{
{indent(accumulator.from_shared(), 6)}
{indent(accumulator.warp_reduce(), 6)}
    }}
    __syncthreads();  // the partials are rewritten by the next row"""
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
        source = f"""{elements.PREAMBLE}{_WELFORD if moments else ""}
// {self.reduce} over {self.axes} trailing dim(s) of {shape}: {rows} rows of {cols}; prologue {len(self.members)} op(s): {", ".join(f"{m.op} ({m.node})" for m in self.members)}; epilogue {len(self.epilogue)} op(s)
extern "C" __global__ void __launch_bounds__({BLOCK}) {name}({", ".join(parameters)}) {{
  typedef {index_type} index_t;
  const unsigned lane_in_row = threadIdx.x % {row_threads};
  const unsigned lane = threadIdx.x % 32;
  (void)lane;
  {accumulator.shared() if not warp_rows else ""}
  {row_loop_head}
    {accumulator.declare()}
    {vector_loop}{{
      for (index_t col = lane_in_row; has_row && col < {cols}{suffix}; col += {row_threads}{suffix}) {{
        const index_t i = row * {cols}{suffix} + col;
{indent(scalar_element, 8)}
      }}
    }}
{indent(accumulator.warp_reduce(), 4)}{block_combine}
    if ({store_guard}) {{
{indent(epilogue_lines, 6)}
    }}
  }}
}}
"""
        blocks = (rows + rows_per_block - 1) // rows_per_block
        return KernelSource(name, source, min(blocks, MAX_GRID) if rows else 0, BLOCK, len(in_types),
                            len(out_types))

