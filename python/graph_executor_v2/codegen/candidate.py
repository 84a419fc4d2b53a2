"""The ``generated`` kernel candidate: the group's source, compiled (or taken from the cache) and loaded when a plan
is built, launched through the runtime's native ``Launch`` as a C launch (no Python per call; capturable).

Every op with a ``scalar`` expression gets one (a group of one member: the op itself), and so does every fused node.
"""
from __future__ import annotations

import hashlib
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ..ir.schema import OPS, Candidate, Problem
from ..ops._base import native_launch
from . import compiler
from .group import Member, describe
from .pointwise import KernelSource

NAME = "generated"
PLACEHOLDER = "GE2_KERNEL_NAME"


def kernel_name(kind: str, members, source: str) -> str:
    """A name that says what the kernel computes and is unique to its source: ``ge2_<kind>_<ops>_<digest>``."""
    ops = "_".join(dict.fromkeys(m.op for m in members))
    ops = re.sub(r"[^A-Za-z0-9_]", "", ops)[:48]
    return f"ge2_{kind}_{ops}_{hashlib.sha256(source.encode()).hexdigest()[:12]}"


def named(kernel: KernelSource, name: str) -> KernelSource:
    return KernelSource(name, kernel.source.replace(PLACEHOLDER, name), kernel.grid, kernel.block, kernel.inputs,
                        kernel.outputs, kernel.shared_bytes)


def arch_of(problem: Problem) -> int:
    major, minor = problem.compute_capability
    return 10 * major + minor


def build(kind: str, members: tuple[Member, ...], generate: Callable[[str], KernelSource]) -> KernelSource:
    """The named kernel source of a group (``generate(name)`` writes it)."""
    draft = generate(PLACEHOLDER)
    return named(draft, kernel_name(kind, members, draft.source))


def generated_launch(kind: str, members: tuple[Member, ...], generate: Callable[[str], KernelSource], arch: int):
    """The C launch of a group's kernel (``generate(name)`` writes it), compiled or taken from the cache, loaded."""
    kernel = build(kind, members, generate)
    group = f"{kind} group [{describe(members)}]"
    loaded, record = compiler.load_kernel(kernel.source, kernel.name, arch, group)
    launch = native_launch(loaded.bind(kernel.inputs, kernel.outputs, kernel.grid, kernel.block,
                                       kernel.shared_bytes))
    compiler.STATS.attach(launch, record)
    return launch


def generated_candidate(kind: str, members_of_problem: Callable[[Problem], tuple[Member, ...]],
                        why_not: Callable[[Problem], str | None],
                        generate: Callable[[Problem, str], KernelSource], priority: int,
                        description: str) -> Candidate:
    """A ``generated`` Candidate: ``why_not(problem)`` says what it cannot run, ``generate(problem, name)`` writes
    the kernel."""

    def supports(problem: Problem) -> str | None:
        unavailable = compiler.availability()
        if unavailable:
            return f"NOT AVAILABLE: {unavailable}"
        return why_not(problem)

    def prepare(problem: Problem):
        return generated_launch(kind, members_of_problem(problem), lambda name: generate(problem, name),
                                arch_of(problem))

    prepare.kernels = lambda problem: [build(kind, members_of_problem(problem), lambda name: generate(problem, name))]
    return Candidate(NAME, priority, description, supports, prepare, any_alignment=True)


def precompile(problems, settled: Callable[[Problem], str | None] = lambda problem: None) -> None:
    """Compiles the kernels a plan's nodes may prepare on parallel threads (NVRTC releases the GIL) into the disk
    cache, so that the nodes' prepare and timing, one after the other, find them there: those of every viable
    candidate whose ``prepare.kernels(problem)`` lists the kernels it compiles (the ``generated`` candidates;
    fused_row's hand-written row kernel with its generated prologue and epilogue). ``settled(problem)``: the one
    candidate a node will prepare when that is known before timing (the autotune cache's winner, a pinned kernel),
    else None (every viable candidate may be timed). A kernel that fails to compile is left to its node's prepare,
    which reports it with its group.

    Only compilation runs in parallel: kernels are timed one at a time on one stream (a timing beside another
    kernel would measure the sharing of the GPU, not the kernel), and native prepares (cuDNN plans, cuBLASLt
    heuristics) run in the plan's order (cuDNN's go through one lock in any case)."""
    jobs = {}
    for problem in problems:
        winner = settled(problem)
        for candidate in OPS[problem.op].candidates:
            kernels_of = getattr(candidate.prepare, "kernels", None)
            if kernels_of is None or winner not in (None, candidate.name) or candidate.supports(problem) is not None:
                continue
            try:
                kernels = kernels_of(problem)
            except Exception:  # noqa: BLE001 - ahead of time only: the node's prepare raises it, and falls back
                continue
            for kernel in kernels:
                jobs.setdefault(kernel.name, (kernel, arch_of(problem)))
    if not jobs:
        return

    def compile_one(job):
        kernel, arch = job
        try:
            compiler.compile_cubin(kernel.source, kernel.name, arch, kernel.name)
        except Exception:  # noqa: BLE001 - the node's own prepare raises it again, naming its group
            pass

    with ThreadPoolExecutor(max_workers=max(1, min(16, os.cpu_count() or 1))) as pool:
        list(pool.map(compile_one, jobs.values()))
