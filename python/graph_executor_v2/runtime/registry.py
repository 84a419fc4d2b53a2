"""Kernel registry: which candidate runs a node, and why.

``select`` ranks the candidates of a node's op for one concrete problem after the capability checks (each
candidate's ``supports``: dtype, shape, alignment, compute capability) and the preferences (pinned or excluded
kernels). On the CPU the only candidate is the op's NumPy reference. On CUDA the op's own candidates come first,
best priority first, and the host round trip through the NumPy reference comes last, so every node gets a kernel.

``choose_kernel`` prepares the ranked candidates in order: one whose ``prepare`` raises (cuBLASLt finds no
algorithm, a native module is not built) falls to the next, and the ``Selection`` records why. With autotuning (the
default, given a timer: plans on CUDA) it first times the viable GPU candidates once per problem and keeps the
winner in the ``AutotuneCache``: measurement chooses, priority breaks ties and orders the fallbacks.

Candidates that other packages registered (``ops.register``, ``ops.add_candidate``) go through the same ranking,
autotuning and fallbacks; ``kernel_label`` marks them external in explanations.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable

from .. import _native
from .. import device as _device
from .. import selection
from ..codegen.candidate import NAME as GENERATED
from ..ir.graph import Node
from ..ir.schema import OPS, Launch, Problem
from ..selection import Ranking
from .autotune import AutotuneCache
from .backends.cuda import HOST_FALLBACK, host_fallback_candidate
from .backends.reference import reference_candidate


@dataclass(frozen=True)
class Capabilities:
    """What the target offers; ``setup`` keys the autotune cache (GPU name, CUDA and cuBLASLt versions)."""

    device: str  # "cpu" or "cuda"
    compute_capability: tuple[int, int] = (0, 0)
    gpu_name: str = ""
    setup: str = "cpu"

    @staticmethod
    def detect(device: str) -> "Capabilities":
        if device == "cpu":
            return Capabilities("cpu")
        _device.require_gpu("ExecutorV2(device='cuda')")
        runtime = _device.runtime()
        properties = runtime.device_properties(runtime.current_device())
        name = properties["name"]
        setup = f"{name} | CUDA runtime {runtime.runtime_version()} | cuBLASLt {_cublaslt_version()}"
        return Capabilities("cuda", tuple(properties["compute_capability"]), name, setup)


def _cublaslt_version() -> str:
    try:
        return str(_native.load("_ops_gemm").cublaslt_version())
    except (ImportError, AttributeError):  # gemm module not built, or built without the query
        return "unknown"


@dataclass(frozen=True)
class Preferences:
    """``kernels``: op -> candidate tried first; ``exclude``: candidate name -> why it is never used; ``autotune``:
    time the viable candidates where a timer is given (False: the highest priority runs). The environment's
    switches turn off capabilities, not kernels: the selector reads them (``selection.py``)."""

    kernels: dict[str, str] = field(default_factory=dict)
    exclude: dict[str, str] = field(default_factory=dict)
    autotune: bool = True

    @staticmethod
    def from_env(kernels: dict[str, str] | None = None, autotune: bool = True) -> "Preferences":
        return Preferences(dict(kernels or {}), {}, autotune)


@dataclass(frozen=True)
class Selection:
    node: str
    op: str
    kernel: str
    description: str
    launch: Launch
    reason: str
    rejected: tuple[tuple[str, str], ...] = ()
    fallbacks: tuple[tuple[str, str], ...] = ()  # (candidate, the error its prepare raised)
    tuning_seconds: float = 0.0  # timing candidates (their prepares and timed runs) for this choice; 0 when untimed

    @property
    def is_fallback(self) -> bool:
        """True when the node did not get the first-ranked kernel, or only the host round trip."""
        return bool(self.fallbacks) or self.kernel == HOST_FALLBACK


def select(node: Node, problem: Problem, caps: Capabilities, prefs: Preferences) -> Ranking:
    """The selector's ranking of the node's candidates (``selection.rank``), the host round trip last on CUDA."""
    opdef = OPS[node.op]
    if caps.device == "cpu":
        return Ranking((reference_candidate(opdef),), (), "the NumPy reference is the CPU backend")
    ranking = selection.rank(opdef, problem, pinned=prefs.kernels.get(node.op), excluded=prefs.exclude,
                             none_viable="no GPU candidate applies: host round trip")
    return replace(ranking, viable=ranking.viable + (host_fallback_candidate(opdef),))


def kernel_label(op: str, name: str) -> str:
    """``name``, marked ``[external: <package>]`` when a package outside GE2 registered that candidate of ``op``."""
    opdef = OPS.get(op)
    origin = next((c.origin for c in opdef.candidates if c.name == name), "") if opdef is not None else ""
    return f"{name} [external: {origin}]" if origin else name


def problem_key(problem: Problem) -> str:
    types = ",".join("_" if t is None else str(t) for t in problem.in_types)
    return f"{problem.op}({types}) {json.dumps(problem.attrs, sort_keys=True)} sm{problem.compute_capability}"


def choose_kernel(node: Node, problem: Problem, caps: Capabilities, prefs: Preferences,
                  timer: Callable[[Launch], float] | None = None, cache: AutotuneCache | None = None) -> Selection:
    """The kernel for ``node``: the first ranked candidate that prepares; with a ``timer`` and autotuning, the
    measured winner first (a problem the ``cache`` knows is not timed again: one timing per distinct problem)."""
    opdef = OPS[node.op]
    if caps.device == "cpu":
        ranking, last_resort = select(node, problem, caps, prefs), None
    else:
        ranking = selection.rank(opdef, problem, pinned=prefs.kernels.get(node.op), excluded=prefs.exclude,
                                 none_viable="no GPU candidate applies: host round trip")
        last_resort = host_fallback_candidate(opdef)
    # Autotuning by default (autotune=False opts out); and always where a generated kernel competes with
    # hand-written ones (issue 20: a generated kernel's priority says nothing about its speed).
    competing = len(ranking.viable) > 1 and any(c.name == GENERATED for c in ranking.viable)
    tune = (prefs.autotune or competing) and (timer is not None or cache is not None) and node.op not in prefs.kernels
    tune_key = ((cache if cache is not None else AutotuneCache()), caps.setup, problem_key(problem)) if tune else None
    choice = selection.choose(ranking, problem, last_resort=last_resort, timer=timer if tune else None,
                              tune_key=tune_key)  # the last resort never fails
    candidate = choice.candidate
    return Selection(node.name, node.op, candidate.name, candidate.description, choice.launch, choice.reason,
                     choice.rejected, choice.fallbacks, choice.tuning_seconds)
