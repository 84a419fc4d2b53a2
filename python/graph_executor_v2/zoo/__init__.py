"""The model zoo: real models (torchvision, small Hugging Face configs, random weights) through GE2's frontends,
checked against PyTorch in float64 and timed against PyTorch eager and torch.compile on the GPU.

``python -m graph_executor_v2 zoo [--models a,b] [--frontend onnx,torch] [--dtype float32,float16] [--quick]``
runs every (model, dtype) in a process of its own (``zoo/worker.py``) under a time limit, so one model that fails,
hangs or crashes costs only its own rows, and writes ``benchmarks/results/zoo.md`` (and ``zoo.json``). Each row is a
(model, frontend, dtype): whether the import succeeded, the unsupported nodes with their reasons when not, GE2's max
error and PyTorch's own in that dtype (both relative to the float64 result's largest value), whether GE2 is within 4x
of PyTorch plus a floor (``worker.matches``), the GE2 / eager / torch.compile times and the nodes that fell back to a
host round trip. ``--jobs`` workers prepare side by side (export, import, plan, check, compile); each then times
alone, with no other worker running (``_Turns``), so that parallel workers do not disturb the times. The models need torch, torchvision and transformers (the GPU machine has them); where they are
missing each row says so. ``--device cpu`` runs PyTorch and GE2's CPU backend instead of the GPU: imports and errors
on a machine without one (no times). The exporter column names what wrote each imported graph.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from ..device import device_count
from .models import MODELS
from .worker import COMPILE_MODE, PREPARED, TWO_SIZES

FRONTENDS = ("onnx", "onnx-legacy", "torch")
DTYPES = ("float32", "float16")
QUICK_TIME_LIMIT_S = 60
MINIMUM_START_S = 20  # with less left before --deadline a model is not started: loading torch alone takes seconds
TIMING_LIMIT_S = 120  # one worker's timing turn: GE2, eager and torch.compile, 23 runs each, of one (model, dtype)
ALIVE_MOST = 24  # workers holding their models at once, preparing or waiting for a turn to time (host memory: 2-4 GB
#                 each; session 31's part 1 ran 16 CNN workers at once on a 128 GB machine)
TIMING_RESERVE_S = 40  # with --deadline on the GPU, preparation ends this long before it, left to the timing turns


def _missing_package(family: str) -> str | None:
    for package in ("torch", family):
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed"
    return None


def _worker_command(name: str, frontends: list[str], dtypes: list[str], out: Path, compile_too: bool,
                    two_sizes: bool, device: str, handshake: bool) -> list[str]:
    return [sys.executable, "-m", "graph_executor_v2.zoo.worker", name, "--frontends", ",".join(frontends),
            "--dtypes", ",".join(dtypes), "--out", str(out), "--device", device] + \
        ([] if compile_too else ["--no-compile"]) + (["--two-sizes"] if two_sizes else []) + \
        (["--handshake"] if handshake else [])


def _run_model(name: str, frontends: list[str], dtypes: list[str], time_limit: float, compile_too: bool,
               two_sizes: bool = False, limit_source: str = "", device: str = "cuda", gpu: str | None = None,
               turns: _Turns | None = None) -> list:
    """The records of one model, from its worker process (on CUDA device ``gpu`` alone where given); a case the
    worker did not finish gets a record saying why (the time limit, with ``limit_source`` naming what set it; a
    crash with its last lines of output). ``time_limit`` bounds the worker's preparation. With ``turns`` the worker
    times only in a turn of its own (``_Turns.turn``: no other worker running), and its records say so
    (``timed_alone``); ``turns.done_preparing()`` is called once it has prepared or ended."""
    missing = _missing_package(MODELS[name].family)
    expected = [(frontend, dtype) for dtype in dtypes for frontend in frontends]
    if missing:
        if turns is not None:
            turns.done_preparing()
        return [_failed(name, frontend, dtype, f"skipped: {missing}") for frontend, dtype in expected]
    with tempfile.TemporaryDirectory() as directory:
        out, log = Path(directory) / "records.jsonl", Path(directory) / "stderr.txt"
        command = _worker_command(name, frontends, dtypes, out, compile_too, two_sizes, device, turns is not None)
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
            str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH")])))
        if gpu is not None:
            environment["CUDA_VISIBLE_DEVICES"] = gpu
        why = timing_error = None
        in_turn = False  # the worker was timed alone (if it timed anything)
        out_of_time = threading.Event()
        with log.open("w") as stderr, subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                       stderr=stderr, text=True, env=environment) as process:
            def cut():
                out_of_time.set()
                process.kill()

            limit = threading.Timer(time_limit, cut)
            limit.start()
            prepared = False
            try:
                for line in process.stdout:  # the worker prints nothing else of use; stderr goes to the log
                    if line.strip() == PREPARED:
                        prepared = True
                        break
            finally:
                limit.cancel()
                if turns is not None:
                    turns.done_preparing()
            if prepared:
                with turns.turn() as allowed:
                    if allowed is None:
                        timing_error = "not timed: the zoo's deadline had passed before its turn"
                        process.communicate("stop\n")
                    else:
                        in_turn = True
                        try:
                            process.communicate("time\n", timeout=allowed)
                        except subprocess.TimeoutExpired:
                            process.kill()
                            process.communicate()
                            timing_error = f"not timed: its timing's limit of {allowed:.0f} s was reached"
            else:
                process.communicate()
        if out_of_time.is_set():
            why = f"time limit of {time_limit:.0f} s reached{limit_source}"
        elif process.returncode != 0:
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
            why = f"worker exited with code {process.returncode}: {tail[-400:]}"
            timing_error = timing_error or (f"not timed: {why}" if prepared else None)
        latest = {}  # a later line of a case (its times) replaces the earlier one
        for line in out.read_text().splitlines() if out.exists() else []:
            record = json.loads(line)
            latest[(record["frontend"], record["dtype"], record.get("check"))] = record
    records = list(latest.values())
    for record in records:
        if "ge2_ms" in record or "compile_ms" in record:
            record["timed_alone"] = in_turn
        elif timing_error and ("ge2_error" in record or "compile_mode" in record and "compile_error" not in record):
            record["timing_error"] = timing_error  # what it would have timed
    done = {(r["frontend"], r["dtype"]) for r in records if "check" not in r}
    records += [_failed(name, frontend, dtype, why or "the worker wrote no record")
                for frontend, dtype in expected if (frontend, dtype) not in done]
    return records


class _Turns:
    """Workers prepare side by side, ``jobs`` at a time, and are timed one at a time with no other worker preparing
    or timing: the GPU and the CPU are the timed worker's alone. A worker that has prepared waits for its turn,
    holding its models; at most ``alive_most`` workers prepare or wait at once, and once that limit holds a worker
    back, no new one starts until the waiting ones have all had their turn (the ones preparing finish, then the
    waiting ones time). No turn starts after ``deadline_at`` (a ``time.perf_counter()`` value), and one lasts at
    most ``TIMING_LIMIT_S`` or what is left before it."""

    def __init__(self, jobs: int, alive_most: int, deadline_at: float | None = None):
        self._condition = threading.Condition()
        self._jobs, self._alive_most, self._deadline_at = jobs, max(jobs, alive_most), deadline_at
        self._preparing = self._waiting = self._started = 0
        self._timing = self._draining = False

    def start_preparing(self, ticket: int) -> None:
        """Blocks until the worker of ``ticket`` (0, 1, ...: the order the workers start in) may start."""
        with self._condition:
            def may_start() -> bool:
                if ticket != self._started or self._preparing >= self._jobs:
                    return False
                if self._preparing + self._waiting >= self._alive_most:
                    self._draining = True  # held back by memory: time the waiting ones first
                return not (self._draining or self._timing)

            self._condition.wait_for(may_start)
            self._preparing += 1
            self._started += 1
            self._condition.notify_all()

    def done_preparing(self) -> None:
        with self._condition:
            self._preparing -= 1
            self._condition.notify_all()

    def _left(self) -> float | None:
        return None if self._deadline_at is None else self._deadline_at - time.perf_counter()

    @contextlib.contextmanager
    def turn(self):
        """Waits until no worker prepares or times; yields the seconds the timing may take, or None where the
        deadline passed first."""
        with self._condition:
            self._waiting += 1
            ready = self._condition.wait_for(lambda: self._preparing == 0 and not self._timing, timeout=self._left())
            self._waiting -= 1
            left = self._left()
            ready = ready and (left is None or left > 0)
            self._timing = ready
        try:
            yield (min(TIMING_LIMIT_S, left) if left is not None else TIMING_LIMIT_S) if ready else None
        finally:
            with self._condition:
                self._timing = False
                self._draining = self._draining and self._waiting > 0
                self._condition.notify_all()


def _visible_gpus() -> list[str]:
    """The CUDA device ids a worker may be given: CUDA_VISIBLE_DEVICES's entries where it is set, else every GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [entry.strip() for entry in visible.split(",") if entry.strip()]
    return [str(index) for index in range(device_count())]


def _failed(model: str, frontend: str, dtype: str, why: str) -> dict:
    return {"model": model, "frontend": frontend, "dtype": dtype, "imported": False, "problems": [], "error": why}


def _number(value, digits: str) -> str:
    return "" if value is None else format(value, digits)


def _two_sizes_cell(check: dict | None, dtype: str) -> str:
    """The two-sizes column of a row: float32 rows only (the check runs in float32), the reason when it failed."""
    if check is None or dtype != "float32":
        return ""
    if check.get("match"):
        return "yes"
    return "**no**: " + (check.get("error") or "").replace("|", "/")[:160]


def format_markdown(records: list[dict], settings: str) -> str:
    """The zoo table, the summary of matched pairs per dtype and every unsupported node with its reason."""
    compiled = {(r["model"], r["dtype"]): r for r in records if r["frontend"] is None}
    checks = [r for r in records if r.get("check") == "two_sizes"]
    cases = [r for r in records if r["frontend"] is not None and "check" not in r]
    compile_modes = sorted({r["compile_mode"] for r in compiled.values() if r.get("compile_mode")})
    lines = ["# Model zoo", "", settings, "",
             "Errors: max |y - y64| / max |y64| against PyTorch in float64; match: GE2's error <= 4 x PyTorch's own "
             "in the same dtype + a floor (1e-5 float32, 1e-3 float16), both at their default precision (TF32 "
             "convolutions, strict FP32 matmuls).", "",
             "Times: median of 20 runs (after 3) in ms on the GPU: GE2 with its CUDA graph, PyTorch eager, and "
             f"torch.compile (mode {', '.join(compile_modes) or COMPILE_MODE}, compiled once per (model, dtype), its "
             "time shared by the frontends' rows). A row's three times come from one process, the worker of its "
             "(model, dtype), which imported, planned and compiled beside other workers, then timed with no other "
             "worker running; a row timed beside other workers (runs before session 31) says so in its note.", "",
             "two sizes (float32 rows): the model exported with a symbolic batch (and sequence, for token inputs) and "
             f"one executor run at (batch, sequence) {' and '.join(str(tuple(size)) for size in TWO_SIZES)}, each "
             "matched against float64 like the row; the reason when not.", "",
             "exporter: what wrote the graph GE2 imported: torch.export (frontend torch), torch.onnx.export's "
             "default dynamo exporter (onnx) or its legacy TorchScript one (onnx-legacy); 'SDPA traced as math' where "
             "the dynamo export failed on attention's output strides and was exported again with PyTorch's math "
             "attention kernel selected (the same ONNX attention, a different trace).", "",
             "| model | frontend | exporter | dtype | import | GE2 error | PyTorch error | match | GE2 ms | eager ms | "
             "compile ms | fallbacks | two sizes | note |",
             "| --- | --- | --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    two_sizes = {(r["model"], r["frontend"]): r for r in checks}
    for r in cases:
        compile_record = compiled.get((r["model"], r["dtype"]), {})
        note = r.get("error") or ""
        if r["problems"]:
            first = r["problems"][0]
            note = f"{len(r['problems'])} unsupported node(s), first: {first[1]} ({first[2][:80]})"
        for extra in (r.get("timing_error"), compile_record.get("compile_error") and "torch.compile failed: " +
                      compile_record["compile_error"], r.get("ge2_ms") is not None and not r.get("timed_alone") and
                      "timed beside other workers", r.get("ge2_ms") is not None and not compile_record and
                      "torch.compile not timed (by the run of this row)",
                      r.get("fallback_ops") and "fallback: " + ", ".join(r["fallback_ops"])):
            if extra:
                note = (note + "; " if note else "") + extra
        match = {True: "yes", False: "**no**", None: ""}[r.get("match")]
        lines.append(f"| {r['model']} | {r['frontend']} | {r.get('exporter') or ''} | {r['dtype']} | "
                     f"{'yes' if r['imported'] else '**no**'} | "
                     f"{_number(r.get('ge2_error'), '.2e')} | {_number(r.get('torch_error'), '.2e')} | {match} | "
                     f"{_number(r.get('ge2_ms'), '.3f')} | {_number(r.get('eager_ms'), '.3f')} | "
                     f"{_number(compile_record.get('compile_ms'), '.3f')} | {_number(r.get('fallbacks'), 'd')} | "
                     f"{_two_sizes_cell(two_sizes.get((r['model'], r['frontend'])), r['dtype'])} | "
                     f"{note.replace('|', '/')} |")
    lines += ["", "## Summary", ""]
    for dtype in sorted({r["dtype"] for r in cases}):
        rows = [r for r in cases if r["dtype"] == dtype]
        imported = sum(r["imported"] for r in rows)
        matched = sum(bool(r.get("match")) for r in rows)
        lines.append(f"- {dtype}: {matched} of {len(rows)} (model, frontend) pairs import and match; {imported} "
                     "import")
    if checks:
        matched = sum(bool(r.get("match")) for r in checks)
        lines.append(f"- two sizes: {matched} of {len(checks)} (model, frontend) pairs run both sizes on one executor "
                     "and match")
        lines += ["", "## Symbolic shapes: one executor, two sizes (float32)", "",
                  "| model | frontend | exporter | inputs as imported | result |", "| --- | --- | --- | --- | --- |"]
        for r in checks:
            result = "match" if r.get("match") else (r.get("error") or "").replace("|", "/")
            lines.append(f"| {r['model']} | {r['frontend']} | {r.get('exporter') or ''} | "
                         f"{', '.join(r.get('symbolic_inputs', []))} | {result} |")
    failures = [r for r in cases if r["problems"]]
    if failures:
        lines += ["", "## Unsupported nodes", ""]
        for r in failures:
            lines.append(f"- {r['model']} / {r['frontend']} / {r['dtype']}:")
            lines += [f"  - `{node}` ({op}): {reason}" for node, op, reason in r["problems"][:25]]
            if len(r["problems"]) > 25:
                lines.append(f"  - ... and {len(r['problems']) - 25} more")
    errors = [r for r in cases if r.get("traceback")]
    if errors:
        lines += ["", "## Errors after import", ""]
        for r in errors:
            lines += [f"- {r['model']} / {r['frontend']} / {r['dtype']}:", "```", r["traceback"].strip(), "```"]
    return "\n".join(lines) + "\n"


def _names(text: str | None, allowed, what: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in allowed]
    if unknown:
        raise ValueError(f"--{what}: unknown {', '.join(unknown)}; expected among {', '.join(allowed)}")
    return names


def run_models(models: list[str], frontends: list[str], dtypes: list[str], *, time_limit: float, compile_too: bool,
               two_sizes: bool, jobs: int = 1, deadline: float | None = None, on_model=None,
               device: str = "cuda", gpus: list[str] | None = None, timing_reserve: float = 0.0) -> list:
    """Every model's records, one worker process per (model, dtype), ``jobs`` preparing at a time (``_Turns``: each
    is timed alone once prepared), each on the least busy of ``gpus`` (CUDA device ids) where given, so that workers
    run side by side on several GPUs; the two-sizes check runs in the float32 worker. A model's dtypes in workers of
    their own: a heavy model's float16 rows do not wait for (or share the time limit of) its float32 ones. The slow
    models start first, so that no slow one is left to start near the end; each worker gets ``time_limit`` seconds
    to prepare, less where ``deadline`` (seconds from now for the whole run) less ``timing_reserve`` (kept for the
    timing turns) leaves less, and one not started before then gets records saying so. ``on_model(records so far,
    in the order of ``models``)`` is called after every worker (the table is written there, so a run cut from
    outside keeps what it did)."""
    started = time.perf_counter()
    done: dict[tuple[str, str], list] = {}
    lock = threading.Lock()
    running = dict.fromkeys(gpus or [], 0)  # worker processes per GPU
    turns = _Turns(jobs, ALIVE_MOST, None if deadline is None else started + deadline)

    def run(ticket: int, name: str, dtype: str) -> list:
        turns.start_preparing(ticket)
        left = None if deadline is None else deadline - timing_reserve - (time.perf_counter() - started)
        if left is not None and left < MINIMUM_START_S:
            turns.done_preparing()
            return [_failed(name, frontend, dtype, f"not started: the zoo's deadline of {deadline:.0f} s had passed")
                    for frontend in frontends]
        limit, source = time_limit, ""
        if left is not None and left < time_limit:
            limit, source = left, " (what the zoo's --deadline left)"
        if not running:
            return _run_model(name, frontends, [dtype], limit, compile_too, two_sizes, limit_source=source,
                              device=device, turns=turns)
        with lock:
            gpu = min(running, key=running.get)
            running[gpu] += 1
        try:
            return _run_model(name, frontends, [dtype], limit, compile_too, two_sizes, limit_source=source,
                              device=device, gpu=gpu, turns=turns)
        finally:
            with lock:
                running[gpu] -= 1

    def in_order() -> list:
        return [r for model in models for dtype in dtypes for r in done.get((model, dtype), [])]

    # Stable: the given order within each class, float32 before float16 of a model
    order = sorted(((name, dtype) for name in models for dtype in dtypes), key=lambda task: not MODELS[task[0]].slow)
    # threads: each waits on a worker process, which prepares (jobs at a time) or waits for its turn to time
    with ThreadPoolExecutor(max_workers=max(jobs, ALIVE_MOST) + 1) as pool:  # + 1: a start held back drains
        futures = {pool.submit(run, ticket, *task): task for ticket, task in enumerate(order)}
        for future in as_completed(futures):
            task = futures[future]
            with lock:
                done[task] = future.result()
                for r in done[task]:
                    if r["frontend"] is not None and "check" not in r:
                        verdict = ("match" if r.get("match") else "MISMATCH" if r.get("match") is False else
                                   f"{len(r['problems'])} unsupported node(s)" if r["problems"] else r.get("error"))
                        print(f"{task[0]:30s} {r['frontend']:12s} {r['dtype']:8s} {verdict}", flush=True)
                if on_model is not None:
                    on_model(in_order())
    return in_order()


def merge_runs(runs: list[list[dict]]) -> list[dict]:
    """The records of several zoo runs (zoo.json files, in order) as one: a later run's record of a (model, frontend,
    dtype, check) replaces an earlier one, unless the later run did not start that model (its deadline had passed);
    rows in the zoo's model order."""
    merged: dict[tuple, dict] = {}
    for records in runs:
        for r in records:
            key = (r["model"], r["frontend"], r["dtype"], r.get("check"))
            if key in merged and (r.get("error") or "").startswith("not started:"):
                continue
            merged[key] = r
    order = {name: index for index, name in enumerate(MODELS)}
    return sorted(merged.values(), key=lambda r: order.get(r["model"], len(order)))  # stable within a model


def _merge(arguments) -> int:
    runs = []
    for path in arguments.merge:
        try:
            runs.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as error:
            print(f"zoo: --merge: cannot read {path}: {error}", file=sys.stderr)
            return 2
    out = Path(arguments.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records = merge_runs(runs)
    settings = (f"Merged from {', '.join(arguments.merge)}: a later run's row replaces an earlier one, except rows "
                "the later run did not start.")
    out.write_text(format_markdown(records, settings))
    out.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


def main(arguments) -> int:
    """The ``zoo`` command (arguments from ``__main__``)."""
    if arguments.merge:
        return _merge(arguments)
    try:
        if arguments.models:
            models = _names(arguments.models, list(MODELS), "models")
        else:
            models = [name for name, spec in MODELS.items() if spec.quick or not arguments.quick]
        frontends = _names(arguments.frontend, FRONTENDS, "frontend")
        dtypes = _names(arguments.dtype or ("float32" if arguments.quick else ",".join(DTYPES)), DTYPES, "dtype")
        if arguments.jobs < 1:
            raise ValueError(f"--jobs: expected at least 1, got {arguments.jobs}")
    except ValueError as error:
        print(f"zoo: {error}", file=sys.stderr)
        return 2
    time_limit = arguments.time_limit or (QUICK_TIME_LIMIT_S if arguments.quick else 300)
    compile_too = not (arguments.no_compile or arguments.quick or arguments.device == "cpu")
    gpus = _visible_gpus() if arguments.device == "cuda" else []
    started = time.perf_counter()
    out = Path(arguments.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(records, final: bool = False):
        settings = (f"Models: {', '.join(models)}; frontends: {', '.join(frontends)}; dtypes: {', '.join(dtypes)}; "
                    f"device {arguments.device}; batch 2; time limit {time_limit:.0f} s per model"
                    + (f", {arguments.deadline:.0f} s for the whole run" if arguments.deadline else "")
                    + f"; {arguments.jobs} worker(s) preparing at a time"
                    + (f" over {len(gpus)} GPUs" if len(gpus) > 1 else "") + ", each timed alone; torch.compile "
                    f"{'timed' if compile_too else 'not timed'}; "
                    + (f"total {time.perf_counter() - started:.0f} s." if final else
                       f"{len({(r['model'], r['dtype']) for r in records})} of {len(models) * len(dtypes)} "
                       "(model, dtype) workers done so far."))
        out.write_text(format_markdown(records, settings))
        out.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")

    # torch.compile's compiler processes: the cores shared among the workers preparing at a time
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // arguments.jobs)))
    records = run_models(models, frontends, dtypes, time_limit=time_limit, compile_too=compile_too,
                         two_sizes=not arguments.quick if arguments.two_sizes is None else arguments.two_sizes,
                         jobs=arguments.jobs,
                         deadline=arguments.deadline, on_model=write, device=arguments.device,
                         gpus=gpus if len(gpus) > 1 else None,
                         timing_reserve=TIMING_RESERVE_S if arguments.device == "cuda" else 0.0)
    write(records, final=True)
    print(f"\nwrote {out} and {out.with_suffix('.json')}")
    return 0


def add_parser(commands) -> None:
    """The ``zoo`` subcommand of ``python -m graph_executor_v2``."""
    parser = commands.add_parser("zoo", help="real models (torchvision, Hugging Face) through GE2's frontends, "
                                             "checked against PyTorch float64 and timed")
    parser.add_argument("--models", help=f"comma-separated, among: {', '.join(MODELS)} (default: all)")
    parser.add_argument("--frontend", default="onnx,torch", help=f"among {', '.join(FRONTENDS)} (default: "
                                                                 "onnx,torch)")
    parser.add_argument("--dtype", help="float32,float16 (default: both; float32 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help=f"the models marked quick ({', '.join(n for n, s in MODELS.items() if s.quick)}), "
                             f"float32, no torch.compile, {QUICK_TIME_LIMIT_S} s per model: a few minutes on an H200")
    parser.add_argument("--no-compile", action="store_true", help="do not time torch.compile")
    parser.add_argument("--two-sizes", action=argparse.BooleanOptionalAction, default=None,
                        help="also import with a symbolic batch (and sequence, for token inputs) and run two sizes on "
                             "one executor (float32; on by default, off with --quick unless given)")
    parser.add_argument("--time-limit", type=float, help="seconds per worker to prepare (default: 300; 60 with "
                                                          "--quick); its timing has up to "
                                                          f"{TIMING_LIMIT_S} s more")
    parser.add_argument("--jobs", type=int, default=1,
                        help="workers preparing at a time, one process per (model, dtype) (default: 1); the slow ones "
                             "first; with several GPUs visible, each worker on the least busy one. Each worker times "
                             "alone once it has prepared, with no other worker running")
    parser.add_argument("--deadline", type=float,
                        help="seconds for the whole run (default: none): on the GPU the last "
                             f"{TIMING_RESERVE_S} s are kept for timing; a worker's time limit shrinks to what is "
                             f"left, a model not started with {MINIMUM_START_S} s left is reported as not started; the "
                             "table is written after every model either way")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="where PyTorch and GE2 run: cpu checks imports and errors on GE2's CPU backend, without "
                             "times or torch.compile")
    parser.add_argument("--merge", nargs="+", metavar="ZOO_JSON",
                        help="run nothing: merge the zoo.json files of earlier runs (a later file's rows replace an "
                             "earlier one's, except rows it did not start) into one table at --out (default: run "
                             "the models)")
    parser.add_argument("--out", default="benchmarks/results/zoo.md", help="the markdown file (JSON next to it)")
    parser.set_defaults(handler=main)
