"""The op schema: the definition of an op (OpDef, its attributes and inputs, its kernel candidates) and the
registry of them (OPS). Device-free, beneath the IR: the graph, its verifier and printer read it, and every
``ops/<op>.py`` registers its OpDefs here (through ``ops/_base.py``, which adds the launch slots of candidates).

Every ``ops/<op>.py`` registers one or more ``OpDef``s. The IR (builders, verifier), the passes (shape/dtype
inference), the kernel registry (candidates), the CPU backend (NumPy reference) and the tests all read them;
no op knowledge is written anywhere else.

Contract of the callables an OpDef carries (``attrs`` is always the full, validated attribute dict):
- ``infer(in_types, attrs) -> list[TensorType]``: output types from input types (``None`` for an absent
  optional input). Raises ValueError/TypeError naming the input and what was expected; the caller prefixes the
  node name.
- ``reference(inputs, attrs) -> list[np.ndarray]``: NumPy forward, computed in float64 and cast to the output
  dtype by the caller (``run_reference``), so it is both the oracle and the CPU backend.
- ``reference_backward(inputs, outputs, out_grads, attrs) -> list[np.ndarray | None]``: gradients w.r.t. each
  input, float64 (``None`` for inputs with no gradient, e.g. integer ids).
- ``candidates``: the ways to run the op on a GPU, best first by ``priority``; the registry adds the CPU
  reference as the candidate that always works on the CPU.
- ``aliases``: (output, input) index pairs of a view-like op (reshape): the output may share the input's buffer.
- ``grad(g, node, out_grads) -> list[Value | None]``: the grad rule (autograd). Given the graph ``g`` being built,
  the forward ``node`` and the gradient Values of its outputs (None where an output has none), it emits nodes with
  the builder (``g.<op>(...)``) and returns one gradient Value per forward input (None for none). Backward
  computations are ops of their own (``<op>_backward``). Rules are attached at the end of each op module with
  ``attach_grad`` (after the OpDefs they use are registered).
- ``scalar(args, attrs, ctype) -> str``: a pointwise op's per-element math for generated kernels (codegen). ``args``
  are the C++ expressions of its inputs, each already converted to the compute type ``ctype``
  (``dtypes.compute_ctype`` of the node's input types: ``"float"`` when they promote to a floating dtype, 16-bit
  types computing in float32, else ``"int"``, ``"long long"``, ``"unsigned char"`` or ``"bool"``); the result is a
  C++ expression of the op's single output (predicates give ``bool``), which the generated kernel casts to the
  output dtype. Only CUDA math functions (``erff``, ``expf``, ``fmodf``, ``rintf``, ...) and plain C++ appear
  (an immediately invoked lambda where an argument is used twice), exact where the reference is exact. ``None``
  for an op that is not pointwise.

Extending GE2 from another package (no fork): ``register(opdef)`` adds a new op, ``add_candidate(op, candidate)``
adds a kernel to an existing one (a user's own GEMM variant competing with cuBLASLt). Both stamp the candidates
with their ``origin`` (the registering package), the registry ranks, autotunes and falls back over them like over
GE2's own ones, and ``explain()`` marks them external.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from .._suggest import did_you_mean
from ..dtypes import to_numpy
from .types import TensorType

REQUIRED = object()
# ``OpDef.outputs == (VARIADIC_OUTPUTS,)``: the node has as many outputs as ``infer`` returns (named y0, y1, ...).
VARIADIC_OUTPUTS = "..."


@dataclass(frozen=True)
class Attr:
    """An attribute with its expected Python type(s), an optional default, allowed choices and a check."""

    name: str
    kind: type | tuple[type, ...]
    default: Any = REQUIRED
    choices: tuple | None = None
    check: Callable[[Any], str | None] | None = None  # returns a message describing what is wrong, or None
    doc: str = ""

    def validate(self, value: Any, where: str) -> Any:
        if self.kind is float and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            value = float(value)
        if self.kind is int and isinstance(value, np.integer):
            value = int(value)
        if self.kind is tuple and isinstance(value, list):
            value = tuple(value)
        if isinstance(value, bool) and self.kind in (int, float):
            raise TypeError(f"{where}: attribute '{self.name}' expected {self.kind.__name__}, got bool")
        if not isinstance(value, self.kind) and not (value is None and self.default is None):
            expected = self.kind.__name__ if isinstance(self.kind, type) else " or ".join(k.__name__ for k in self.kind)
            raise TypeError(f"{where}: attribute '{self.name}' expected {expected}, got {type(value).__name__} "
                            f"({value!r})")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{where}: attribute '{self.name}' expected one of {', '.join(map(str, self.choices))}, "
                             f"got {value!r}")
        if self.check is not None and value is not None:
            problem = self.check(value)
            if problem:
                raise ValueError(f"{where}: attribute '{self.name}' {problem}, got {value!r}")
        return value


@dataclass(frozen=True)
class Input:
    name: str
    optional: bool = False
    variadic: bool = False  # takes the rest of the inputs (concat)


@dataclass(frozen=True)
class Problem:
    """Everything a kernel candidate needs to decide whether it applies and to prepare a launch."""

    op: str
    in_types: tuple[TensorType | None, ...]  # concrete shapes; None for absent optional inputs
    out_types: tuple[TensorType, ...]
    attrs: dict
    compute_capability: tuple[int, int] = (9, 0)


# launch(input_ptrs, output_ptrs, stream) -> None. Input pointers of absent optional inputs are 0. All buffers are
# contiguous, 256-byte aligned and on the current device. Per-node Python cost in a plan is this one call.
Launch = Callable[[Sequence[int], Sequence[int], int], None]


class _FromTable:
    """What a table candidate's priority, description, always_works and any_alignment are until the selector reads
    them from its native module's kernel table (``selection.candidates``): using it raises, so nothing ranks by a
    value that was never read."""

    def _unread(self, *_):
        raise TypeError("a table candidate's metadata is read from its native kernel table: ask "
                        "graph_executor_v2.selection.candidates(opdef), not OpDef.candidates")

    __bool__ = __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __int__ = _unread

    def __repr__(self) -> str:
        return "<from the kernel table>"


FROM_TABLE = _FromTable()


@dataclass(frozen=True)
class Candidate:
    """One way to run an op on the GPU.

    A described candidate states its metadata here (an out-of-tree kernel, a generated one, a wrapper); a table
    candidate (``table_candidate``) names the native module whose ``kernels()`` row states it, so it is written once,
    in C++, and the selector (``graph_executor_v2/selection.py``) fills it in."""

    name: str
    priority: int  # higher is preferred among the candidates that support a problem
    description: str
    supports: Callable[[Problem], str | None]  # None when it applies, else the reason it does not
    prepare: Callable[[Problem], Launch]  # may raise RuntimeError (e.g. no cuBLASLt algorithm): next one is tried
    always_works: bool = False  # the fallback that supports every valid problem on the GPU
    any_alignment: bool = False  # takes element-aligned pointers (views into other arrays), not only 16-byte ones
    origin: str = ""  # the package that registered it from outside GE2; "" for GE2's own candidates
    # What it offers that an environment switch may turn off (selection.CAPABILITY_SWITCHES: "fused_epilogue").
    capabilities: tuple[str, ...] = ()
    table: str = ""  # the native module whose kernels() row gives the metadata ("" for a described candidate)
    # The dtypes of the op's data (its first input) it runs; () for every dtype the op takes. The selector declines
    # it for any other before calling ``supports``.
    dtypes: tuple[str, ...] = ()


def table_candidate(table: str, name: str, supports: Callable[[Problem], str | None],
                    prepare: Callable[[Problem], Launch], capabilities: tuple[str, ...] = ()) -> Candidate:
    """The candidate of kernel ``name`` of the native module ``table`` (``"_ops_gemm"``, or ``"my_ops._ops_swiglu"``
    for another package's): its priority, description, alignment and whether it is the fallback come from that
    module's ``kernels()`` table."""
    return Candidate(name, FROM_TABLE, FROM_TABLE, supports, prepare, FROM_TABLE, FROM_TABLE,
                     capabilities=tuple(capabilities), table=table)


@dataclass(frozen=True)
class Sample:
    """One problem of an op, as its tests walk it through every face (and the profiler and benchmarks may): the
    inputs in OpDef order (host arrays; a list for a variadic input; None, or left off at the end, for an absent
    optional input), the attributes, and what the sample exercises."""

    inputs: tuple
    attrs: dict = field(default_factory=dict)
    note: str = ""


def sample_array(rng: np.random.Generator, *shape: int, positive: bool = False, dtype: str = "float32"
                 ) -> np.ndarray:
    """An array of ``shape`` and ``dtype``, standard normal values (``positive``: their magnitudes plus 0.5, for a
    log's argument, a divisor or a variance): what most samples are made of."""
    values = rng.standard_normal(shape)
    return (np.abs(values) + 0.5 if positive else values).astype(to_numpy(dtype))


def _numel(t: TensorType | None) -> int:
    return 0 if t is None else t.numel


@dataclass(frozen=True)
class OpDef:
    name: str
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    attrs: tuple[Attr, ...]
    infer: Callable[[Sequence[TensorType | None], dict], list[TensorType]]
    reference: Callable[[Sequence[np.ndarray | None], dict], list[np.ndarray]]
    reference_backward: Callable[..., list[np.ndarray | None]] | None = None
    candidates: tuple[Candidate, ...] = ()
    doc: str = ""
    # False when outputs are not a function of inputs and attributes alone (random ops): never folded or merged.
    pure: bool = True
    grad: Callable[..., list] | None = None
    # (output index, input index) pairs: that output holds that input's bytes unchanged (a view: the same row-major
    # elements, another shape), so a plan may give it the input's buffer and launch nothing (runtime/planner.py).
    aliases: tuple[tuple[int, int], ...] = ()
    # The per-element C++ expression of a pointwise op (module docstring); None for the other ops.
    scalar: Callable[[Sequence[str], dict, str], str] | None = None
    # What the op says about itself (OpInfo-style): its sample problems, samples(rng) -> [Sample, ...], the first
    # the typical one, the others edge cases (None: one float32 (4, 6) array per required input); the FLOPs of
    # one run, flops(in_types, out_types, attrs) (None: a bandwidth-bound op, counted in bytes); the bytes one run
    # moves, bytes_moved(in_types, out_types, attrs) (None: every input read once, every output written once).
    samples: Callable[[np.random.Generator], list[Sample]] | None = None
    flops: Callable[[Sequence[TensorType | None], Sequence[TensorType], dict], float] | None = None
    bytes_moved: Callable[[Sequence[TensorType | None], Sequence[TensorType], dict], float] | None = None
    attr_map: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "attr_map", {a.name: a for a in self.attrs})

    def validate_attrs(self, attrs: dict, where: str) -> dict:
        """Full attribute dict with defaults filled in; unknown or missing attributes raise, naming ``where``."""
        unknown = set(attrs) - set(self.attr_map)
        if unknown:
            hints = "; ".join((f"'{name}': " if len(unknown) > 1 else "")
                              + did_you_mean(name, self.attr_map, "the OpDef") for name in sorted(unknown))
            raise ValueError(f"{where}: unknown attribute(s) {sorted(unknown)} for op '{self.name}'; {hints} "
                             f"(its attributes: {sorted(self.attr_map)})")
        result = {}
        for attr in self.attrs:
            if attr.name in attrs:
                result[attr.name] = attr.validate(attrs[attr.name], where)
            elif attr.default is REQUIRED:
                raise ValueError(f"{where}: op '{self.name}' requires attribute '{attr.name}'")
            else:
                result[attr.name] = attr.default
        return result

    def sample_inputs(self, rng: np.random.Generator) -> list[Sample]:
        """The op's sample problems (see ``samples``), fresh random values each call."""
        if self.samples is not None:
            return list(self.samples(rng))
        return [Sample(tuple(sample_array(rng, 4, 6) for item in self.inputs if not item.optional))]

    def flop_count(self, in_types: Sequence[TensorType | None], out_types: Sequence[TensorType], attrs: dict
                   ) -> float:
        """Floating-point operations of one run (0 for an op counted in bytes)."""
        return 0.0 if self.flops is None else float(self.flops(in_types, out_types, attrs))

    def byte_count(self, in_types: Sequence[TensorType | None], out_types: Sequence[TensorType], attrs: dict
                   ) -> float:
        """Bytes one run moves to and from device memory."""
        if self.bytes_moved is not None:
            return float(self.bytes_moved(in_types, out_types, attrs))
        return float(sum(_numel(t) * to_numpy(t.dtype).itemsize for t in (*in_types, *out_types) if t is not None))

    def run_reference(self, inputs: Sequence[np.ndarray | None], attrs: dict) -> list[np.ndarray]:
        """The CPU backend: float64 reference math, cast to the inferred output dtypes."""
        in_types = [None if x is None else TensorType(x.shape, np.dtype(x.dtype).name) for x in inputs]
        out_types = self.infer(in_types, attrs)
        outputs = self.reference(inputs, attrs)
        return [np.asarray(o).astype(to_numpy(t.dtype)) for o, t in zip(outputs, out_types)]


OPS: dict[str, OpDef] = {}


def _package_of(frame) -> str:
    """The top-level package of the code running in ``frame``: "" for GE2 itself."""
    package = frame.f_globals.get("__name__", "").split(".")[0]
    return "" if package == "graph_executor_v2" else package


def register(opdef: OpDef, origin: str | None = None) -> OpDef:
    """Adds an op to ``OPS``; returns the registered OpDef. ``origin`` (default: the calling package) marks the
    candidates of an op registered from outside GE2 as external."""
    if opdef.name in OPS:
        raise ValueError(f"op '{opdef.name}' is registered twice")
    origin = _package_of(sys._getframe(1)) if origin is None else origin
    if origin:
        opdef = replace(opdef, candidates=tuple(replace(c, origin=c.origin or origin) for c in opdef.candidates))
    OPS[opdef.name] = opdef
    return opdef


def _registered(op: str) -> OpDef:
    if op not in OPS:
        raise ValueError(f"op: expected a registered op ({', '.join(sorted(OPS))}), got {op!r}")
    return OPS[op]


def add_candidate(op: str, candidate: Candidate, origin: str | None = None) -> Candidate:
    """Adds a kernel candidate to the registered op ``op``; returns it as registered (with its ``origin``, default:
    the calling package). Plans built afterwards rank, autotune and fall back over it like over the op's own."""
    opdef = _registered(op)
    if not isinstance(candidate, Candidate):
        raise TypeError(f"candidate: expected a graph_executor_v2.ops.Candidate, got {type(candidate).__name__}")
    if any(c.name == candidate.name for c in opdef.candidates):
        raise ValueError(f"candidate: op '{op}' already has a candidate named '{candidate.name}'")
    origin = _package_of(sys._getframe(1)) if origin is None else origin
    candidate = replace(candidate, origin=candidate.origin or origin)
    object.__setattr__(opdef, "candidates", opdef.candidates + (candidate,))  # every holder of the OpDef sees it
    return candidate


def remove_candidate(op: str, name: str) -> Candidate:
    """Removes the candidate ``name`` from op ``op`` (e.g. a plugin unloading); returns it."""
    opdef = _registered(op)
    found = [c for c in opdef.candidates if c.name == name]
    if not found:
        raise ValueError(f"name: op '{op}' has no candidate {name!r} "
                         f"(it has {', '.join(c.name for c in opdef.candidates) or 'none'})")
    object.__setattr__(opdef, "candidates", tuple(c for c in opdef.candidates if c.name != name))
    return found[0]


def attach_grad(opdef: OpDef, rule: Callable[..., list]) -> OpDef:
    """Sets ``opdef.grad`` once (the OpDef is frozen everywhere else)."""
    if opdef.grad is not None:
        raise ValueError(f"op '{opdef.name}' already has a grad rule")
    object.__setattr__(opdef, "grad", rule)
    return opdef


def require_inputs(in_types, names) -> None:
    """OpDef.infer's check that the required inputs (``names``, in input order) are present."""
    for name, t in zip(names, in_types):
        if t is None:
            raise ValueError(f"input '{name}' is required")


def as_float64(x: np.ndarray | None) -> np.ndarray | None:
    return None if x is None else np.asarray(x).astype(np.float64)

