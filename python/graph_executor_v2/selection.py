"""The kernel selector: which candidate runs an op's problem, and why. One question, asked in one place by the op
faces (``ops/_face.py``), the graph registry (``runtime/registry.py``, with autotuning) and any op that runs another
op's kernels itself.

Candidates (``ir/schema.py``). An OpDef's candidates are
- table candidates, ``table_candidate(module, name, supports, prepare)``: a kernel of a native module whose
  ``kernels()`` row (``kernel_table()`` in ``backends/cuda/ops/<op>``) gives the priority, description,
  constraints, alignment, dtypes and whether it is the fallback. Written there only; ``candidates(opdef)`` reads
  the table once per process and fills them in;
- described candidates, ``Candidate(name, priority, description, supports, prepare, ...)``: everything in Python.

A new kind of candidate plugs in as one of these, with no change here: a generated (NVRTC) kernel, an out-of-tree
kernel (``ops.add_candidate(op, Candidate(...))``), a CUTLASS or FP8 kernel in a native module of its own (a table
candidate of that module). It states what it needs in ``supports(problem)`` (dtype, shape, compute capability,
"the compiler is available": the reason when it does not apply), its rank in ``priority`` and its launch in
``prepare(problem)`` (may raise RuntimeError: the next candidate runs instead).

Ranking (``rank``): capabilities turned off by the environment, alignment, the dtypes a candidate runs (the
problem's data dtype, its first input's), then each candidate's ``supports``;
the viable ones best ``priority`` first, a pinned kernel first of all. Choosing (``choose``): the ranked candidates
prepared in order, a failure falling to the next (recorded), after autotuning when a timer is given: the viable
candidates timed once per problem and the winner kept in the ``AutotuneCache`` (``runtime/autotune.py``).
Plans on CUDA choose by measurement by default: ``ExecutorV2`` calls ``choose`` with a ``timer`` that runs the
candidate on the plan's own buffers (``autotune=False`` passes none: the priority order decides).

Native calls outside an OpDef's candidates (a backward binding, a face whose forward is more than one launch)
choose here too (``table_kernel``): the highest-priority kernel of the module's table that runs the call. No native
entry point chooses: each runs the kernel it is named, after checking that the kernel can run the problem.

Environment switches name a capability, never a kernel (``CAPABILITY_SWITCHES``): ``GE2_FORCE_NO_EPILOGUE=1``
turns off "fused_epilogue", so every candidate declaring it (``Candidate.capabilities``) is out, in faces and
plans alike.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Callable

from . import _native
from .ir.schema import Candidate, Launch, OpDef, Problem

# environment variable -> the capability that "1" turns off
CAPABILITY_SWITCHES = {"GE2_FORCE_NO_EPILOGUE": "fused_epilogue"}
VECTOR_ALIGNMENT = 16  # bytes: what a kernel not marked for any alignment may assume of its pointers
TIE_FRACTION = 0.03  # autotuned timings this close to the fastest are a tie, which priority breaks (timing noise)

_TABLES: dict[str, dict[str, dict]] = {}
_RESOLVED: dict[Candidate, Candidate] = {}


def disabled_capabilities() -> dict[str, str]:
    """Capability -> the switch that turned it off (``"GE2_FORCE_NO_EPILOGUE=1"``), from the environment now."""
    return {capability: f"{variable}=1" for variable, capability in CAPABILITY_SWITCHES.items()
            if os.environ.get(variable) == "1"}


def kernel_table(module: str) -> dict[str, dict]:
    """The ``kernels()`` rows of native module ``module`` by kernel name (read once per process): GE2's own
    (``"_ops_gemm"``) or another package's (``"my_ops._ops_swiglu"``)."""
    rows = _TABLES.get(module)
    if rows is None:
        package, _, name = module.rpartition(".")
        native = _native.load(name, package or "graph_executor_v2")
        rows = _TABLES[module] = {row["name"]: row for row in native.kernels()}
    return rows


def table_dtypes(row: dict) -> tuple[str, ...]:
    """The dtypes a ``kernels()`` row runs; () (every dtype) for a table without them (an out-of-tree module built
    against a kernel_info.hpp that had none)."""
    return tuple(row.get("dtypes", ()))


def resolve(candidate: Candidate) -> Candidate:
    """``candidate`` with its metadata: a described one as it is, a table one filled in from its kernel table
    (raises ImportError when the module is not built, LookupError when its table has no such kernel)."""
    if not candidate.table:
        return candidate
    resolved = _RESOLVED.get(candidate)
    if resolved is None:
        row = kernel_table(candidate.table).get(candidate.name)
        if row is None:
            raise LookupError(f"native module '{candidate.table}' has no kernel '{candidate.name}' in its kernels() "
                              f"table ({', '.join(kernel_table(candidate.table))})")
        resolved = _RESOLVED[candidate] = replace(
            candidate, priority=row["priority"], description=row["description"], always_works=row["fallback"],
            any_alignment=row["fallback"] or row["alignment"] < VECTOR_ALIGNMENT, dtypes=table_dtypes(row))
    return resolved


def candidates(opdef: OpDef) -> tuple[Candidate, ...]:
    """The op's candidates in declaration order with their metadata (the kernel tables read)."""
    return tuple(resolve(candidate) for candidate in opdef.candidates)


def kernels(opdef: OpDef) -> list[dict]:
    """The ``kernels()`` list of an op's face: one row per candidate, in declaration order (a table candidate's
    row as its native module states it)."""
    rows = []
    for candidate in opdef.candidates:
        if candidate.table:
            rows.append(kernel_table(candidate.table)[candidate.name])
        else:
            rows.append({"name": candidate.name, "priority": candidate.priority, "description": candidate.description,
                         "constraints": "any" if candidate.always_works else "see description",
                         "fallback": candidate.always_works,
                         "alignment": 1 if candidate.always_works or candidate.any_alignment else VECTOR_ALIGNMENT,
                         "dtypes": candidate.dtypes})
    return rows


def problem_dtype(problem: Problem) -> str | None:
    """The dtype of a problem's data, which ``Candidate.dtypes`` lists: its first present input's."""
    return next((t.dtype for t in problem.in_types if t is not None), None)


def dtype_reason(dtypes, dtype: str | None) -> str | None:
    """Why a kernel that runs ``dtypes`` (empty: every dtype) cannot run data of ``dtype``; None when it can."""
    if not dtypes or dtype is None or dtype in dtypes:
        return None
    return f"dtype {dtype} is not among the dtypes it runs ({', '.join(dtypes)})"


def table_kernel(module: str, requested: str, why_not: Callable[[str], str | None], dtype: str | None = None
                 ) -> str:
    """The kernel of native module ``module`` (its ``kernels()`` table) for a native call that is not an OpDef
    candidate's launch: ``requested`` when it is a kernel name, else ("auto") the highest-priority kernel that runs
    the call. ``why_not(name)``: the native supports check of that kernel for the call (empty or None when it
    runs); ``dtype``: the call's data dtype, checked against each kernel's dtypes first. Raises ValueError naming
    each kernel's reason when none runs it, or why the requested one cannot."""
    rows = kernel_table(module)
    if requested != "auto":
        reason = dtype_reason(table_dtypes(rows[requested]), dtype) if requested in rows else None
        if reason:
            raise ValueError(f"kernel: '{requested}' cannot run this problem: {reason}")
        return requested  # the native call checks the rest and raises naming why it cannot run
    reasons = []
    for row in sorted(rows.values(), key=lambda r: -r["priority"]):
        reason = dtype_reason(table_dtypes(row), dtype) or why_not(row["name"])
        if not reason:
            return row["name"]
        reasons.append(f"{row['name']}: {reason}")
    raise ValueError(f"kernel: no kernel of {module} can run this problem ({'; '.join(reasons)})")


@dataclass(frozen=True)
class Ranking:
    viable: tuple[Candidate, ...]  # best first
    rejected: tuple[tuple[str, str], ...]  # (candidate, why not)
    reason: str  # why the first one is first


def rank(opdef: OpDef, problem: Problem, *, pinned: str | None = None, excluded: dict[str, str] | None = None,
         aligned: bool = True, none_viable: str = "no candidate applies",
         supports: Callable[[Candidate, Problem], str | None] | None = None) -> Ranking:
    """The candidates that can run ``problem``, best first, and why the others cannot. ``pinned``: a kernel name
    tried first when viable; ``excluded``: candidate name -> why it is never used; ``aligned``: False when the
    pointers may not be 16-byte aligned (views), which leaves the candidates that take any alignment;
    ``none_viable``: the reason when no candidate is viable; ``supports``: in place of each candidate's own check,
    the check of a direct native call that knows more than the problem (its pointers, the outputs it saves)."""
    disabled = disabled_capabilities()
    viable, rejected = [], []
    for declared in opdef.candidates:
        name = declared.name
        off = next((capability for capability in declared.capabilities if capability in disabled), None)
        if excluded and name in excluded:
            rejected.append((name, f"excluded by {excluded[name]}"))
            continue
        if off is not None:
            rejected.append((name, f"excluded by {disabled[off]}"))
            continue
        try:
            candidate = resolve(declared)
            if not aligned and not (candidate.always_works or candidate.any_alignment):
                why_not = "the inputs are not 16-byte aligned"
            else:
                why_not = dtype_reason(candidate.dtypes, problem_dtype(problem)) or (
                    candidate.supports(problem) if supports is None else supports(candidate, problem))
        except Exception as error:  # e.g. its native module is not built: the candidate is out, the others go on
            why_not = f"capability check raised {type(error).__name__}: {error}"
        if why_not:
            rejected.append((name, why_not))
        else:
            viable.append(candidate)
    viable.sort(key=lambda c: -c.priority)
    reason = f"highest priority of {len(viable)} viable" if viable else none_viable
    if pinned is not None:
        if any(c.name == pinned for c in viable):
            viable.sort(key=lambda c: c.name != pinned)
            reason = "pinned by preferences"
        else:
            why = dict(rejected).get(pinned, "not a candidate of this op")
            reason += f" (pinned '{pinned}' is not viable: {why})"
    return Ranking(tuple(viable), tuple(rejected), reason)


@dataclass(frozen=True)
class Choice:
    candidate: Candidate
    launch: Launch
    reason: str
    rejected: tuple[tuple[str, str], ...] = ()
    fallbacks: tuple[tuple[str, str], ...] = ()  # (candidate, the error its prepare raised)
    tuning_seconds: float = 0.0  # wall time of the race (the candidates' prepares and timed runs); 0 when none ran


def choose(ranking: Ranking, problem: Problem, *, last_resort: Candidate | None = None,
           timer: Callable[[Launch], float] | None = None, tune_key: tuple[object, str, str] | None = None,
           catch: type[BaseException] | tuple = Exception) -> Choice:
    """The first of ``ranking.viable`` (then ``last_resort``) whose ``prepare`` succeeds; NoKernelPrepared when
    none does.

    With ``tune_key`` = (cache, setup, problem key), the winner the cache holds for the problem is prepared first;
    on a miss, with a ``timer`` (launch -> milliseconds), the viable candidates race and the cache keeps the winner
    (without one, the priority order stands). ``catch``: the prepare
    errors that fall to the next candidate (the others propagate)."""
    order, reason = list(ranking.viable), ranking.reason
    prepared: dict[str, Launch] = {}
    fallbacks: list[tuple[str, str]] = []
    tuning_seconds = 0.0
    rejected = ranking.rejected
    if tune_key is not None and len(order) > 1:
        cache, setup, key = tune_key
        winner = cache.lookup(setup, key)
        if winner in {c.name for c in order}:
            reason = f"autotune cache: {winner} ({format_times(cache.times(setup, key))})"
        elif timer is not None:
            times, failed = {}, []
            race_started = time.perf_counter()
            for candidate in order:
                try:
                    prepared[candidate.name] = candidate.prepare(problem)
                    times[candidate.name] = timer(prepared[candidate.name])
                except Exception as error:  # a candidate that cannot run is out of the race, visibly
                    prepared.pop(candidate.name, None)
                    failed.append((candidate.name, f"{type(error).__name__}: {error}"))
            if times:
                # Measurement decides; priority only breaks ties (timings within TIE_FRACTION of the fastest).
                fastest = min(times.values())
                winner = next(c.name for c in order if times.get(c.name, float("inf")) <= fastest * (1 + TIE_FRACTION))
                tuning_seconds = time.perf_counter() - race_started
                cache.store(setup, key, winner, times, seconds=tuning_seconds)
                reason = "autotuned: " + format_times(times)
                if times[winner] > fastest:
                    reason += f" ({winner}: within {TIE_FRACTION:.0%} of the fastest, first by priority)"
            # A failure ranked above the winner is a fallback (the priority order would have tried it first); one
            # ranked below it is only out of the race: not viable, with the reason.
            names = [c.name for c in order]
            above = set(names[:names.index(winner)] if winner in times else names)
            fallbacks += [(name, why) for name, why in failed if name in above]
            rejected += tuple((name, f"failed when timed: {why}") for name, why in failed if name not in above)
        order.sort(key=lambda c: c.name != winner)
    if last_resort is not None:
        order.append(last_resort)
    out_of_the_race = {name for name, _ in (*fallbacks, *rejected)}
    for candidate in order:
        if candidate.name in out_of_the_race:
            continue
        launch = prepared.get(candidate.name)
        if launch is None:
            try:
                launch = candidate.prepare(problem)
            except catch as error:  # falls to the next candidate; the choice says why
                fallbacks.append((candidate.name, f"{type(error).__name__}: {error}"))
                continue
        if candidate is not order[0]:
            reason = f"first to prepare after {len(fallbacks)} failure(s)"
        return Choice(candidate, launch, reason, rejected, tuple(fallbacks), tuning_seconds)
    raise NoKernelPrepared(tuple(fallbacks))


def format_times(times_ms: dict[str, float]) -> str:
    """``"b 1.0000 ms, a 3.0000 ms"``: candidates fastest first (what explain() shows of an autotuned choice)."""
    return ", ".join(f"{name} {ms:.4f} ms" for name, ms in sorted(times_ms.items(), key=lambda item: item[1]))


class NoKernelPrepared(RuntimeError):
    """No viable candidate prepared: ``fallbacks`` holds (candidate, the error its prepare raised)."""

    def __init__(self, fallbacks: tuple[tuple[str, str], ...]):
        super().__init__("; ".join(f"{name}: {error}" for name, error in fallbacks) or "no candidate applies")
        self.fallbacks = fallbacks
