"""Kernel registry: which candidate runs a node, and why.

``select`` ranks the candidates of a node's op for one concrete problem after the capability checks (each
candidate's ``supports``: dtype, shape, alignment, compute capability) and the preferences (pinned or excluded
kernels). On the CPU the only candidate is the op's NumPy reference. On CUDA the op's own candidates come first,
best priority first, and the host round trip through the NumPy reference comes last, so every node gets a kernel.

``choose_kernel`` prepares the ranked candidates in order: one whose ``prepare`` raises (cuBLASLt finds no
algorithm, a native module is not built) falls to the next, and the ``Selection`` records why. With autotuning
it first times the viable GPU candidates once per problem and keeps the winner in the ``AutotuneCache``.

Candidates that other packages registered (``ops.register``, ``ops.add_candidate``) go through the same ranking,
autotuning and fallbacks; ``kernel_label`` marks them external in explanations.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable

from .. import _native
from .. import device as _device
from ..ir.graph import Node
from ..ir.schema import OPS, Candidate, Launch, Problem
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
    """``kernels``: op -> candidate tried first; ``exclude``: candidate name -> why it is never used."""

    kernels: dict[str, str] = field(default_factory=dict)
    exclude: dict[str, str] = field(default_factory=dict)
    autotune: bool = False

    @staticmethod
    def from_env(kernels: dict[str, str] | None = None, autotune: bool = False) -> "Preferences":
        exclude = {}
        if os.environ.get("GE2_FORCE_NO_EPILOGUE") == "1":
            exclude["cublaslt_epilogue"] = "GE2_FORCE_NO_EPILOGUE=1"
        return Preferences(dict(kernels or {}), exclude, autotune)


@dataclass(frozen=True)
class Ranking:
    viable: tuple[Candidate, ...]  # best first
    rejected: tuple[tuple[str, str], ...]  # (candidate, why not)
    reason: str  # why the first one is first


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

    @property
    def is_fallback(self) -> bool:
        """True when the node did not get the first-ranked kernel, or only the host round trip."""
        return bool(self.fallbacks) or self.kernel == HOST_FALLBACK


def select(node: Node, problem: Problem, caps: Capabilities, prefs: Preferences) -> Ranking:
    opdef = OPS[node.op]
    if caps.device == "cpu":
        return Ranking((reference_candidate(opdef),), (), "the NumPy reference is the CPU backend")
    viable, rejected = [], []
    for candidate in opdef.candidates:
        if candidate.name in prefs.exclude:
            rejected.append((candidate.name, f"excluded by {prefs.exclude[candidate.name]}"))
            continue
        try:
            why_not = candidate.supports(problem)
        except Exception as error:  # e.g. its native module is not built: the candidate is out, the plan goes on
            why_not = f"capability check raised {type(error).__name__}: {error}"
        if why_not:
            rejected.append((candidate.name, why_not))
        else:
            viable.append(candidate)
    viable.sort(key=lambda c: -c.priority)
    reason = f"highest priority of {len(viable)} viable" if viable else "no GPU candidate applies: host round trip"
    pinned = prefs.kernels.get(node.op)
    if pinned is not None:
        if any(c.name == pinned for c in viable):
            viable.sort(key=lambda c: c.name != pinned)
            reason = "pinned by preferences"
        else:
            why = dict(rejected).get(pinned, "not a candidate of this op")
            reason += f" (pinned '{pinned}' is not viable: {why})"
    return Ranking(tuple(viable) + (host_fallback_candidate(opdef),), tuple(rejected), reason)


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
    """The kernel for ``node``: the first ranked candidate that prepares (the autotuned winner first, if asked)."""
    ranking = select(node, problem, caps, prefs)
    order, reason = list(ranking.viable), ranking.reason
    prepared: dict[str, Launch] = {}
    fallbacks: list[tuple[str, str]] = []
    tunable = order[:-1]  # the GPU candidates; the host round trip is never a contender
    if prefs.autotune and timer is not None and len(tunable) > 1 and node.op not in prefs.kernels:
        cache = cache if cache is not None else AutotuneCache()
        key = problem_key(problem)
        winner = cache.lookup(caps.setup, key)
        if winner in {c.name for c in tunable}:
            reason = f"autotune cache: {winner}"
        else:
            times = {}
            for candidate in tunable:
                try:
                    prepared[candidate.name] = candidate.prepare(problem)
                    times[candidate.name] = timer(prepared[candidate.name])
                except Exception as error:  # a candidate that cannot run is out of the race, visibly
                    prepared.pop(candidate.name, None)
                    fallbacks.append((candidate.name, f"{type(error).__name__}: {error}"))
            if times:
                winner = min(times, key=times.get)
                cache.store(caps.setup, key, winner, times)
                reason = "autotuned: " + ", ".join(f"{name} {ms:.4f} ms" for name, ms in sorted(times.items(),
                                                                                                key=lambda i: i[1]))
        order.sort(key=lambda c: c.name != winner)
    for candidate in order:
        if any(name == candidate.name for name, _ in fallbacks):
            continue
        launch = prepared.get(candidate.name)
        if launch is None:
            try:
                launch = candidate.prepare(problem)
            except Exception as error:  # falls to the next candidate; the plan says why
                fallbacks.append((candidate.name, f"{type(error).__name__}: {error}"))
                continue
        if candidate is not order[0]:
            reason = f"first to prepare after {len(fallbacks)} failure(s)"
        return Selection(node.name, node.op, candidate.name, candidate.description, launch, reason,
                         ranking.rejected, tuple(fallbacks))
    raise RuntimeError(f"{node.where()}: no kernel could be prepared: {fallbacks}")  # host_reference never fails
