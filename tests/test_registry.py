"""The kernel registry: ranking, capability checks, visible fallbacks, pins, exclusions and the autotune cache.

A fake op with fake candidates stands in for a GPU op, so every path runs with no GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from graph_executor_v2.ir import Graph
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2 import selection
from graph_executor_v2.ops._base import OPS, Candidate, Input, OpDef, Problem, table_candidate
from graph_executor_v2.runtime import Capabilities, ExecutorV2, Preferences, choose_kernel, select
from graph_executor_v2.runtime import autotune
from graph_executor_v2.runtime import executor as executor_module
from graph_executor_v2.runtime.autotune import AutotuneCache, default_cache_path
from graph_executor_v2.runtime.backends.reference import ReferenceBackend
from graph_executor_v2.runtime.registry import problem_key

FAKE_GPU = Capabilities("cuda", (9, 0), "Fake GPU", "Fake GPU | CUDA runtime 0 | cuBLASLt test")
PYTHON_DIR = str(Path(__file__).resolve().parents[1] / "python")


def candidate(name, priority, supports=None, prepare_error=None, always_works=False, capabilities=()):
    def prepare(problem):
        if prepare_error is not None:
            raise prepare_error
        return lambda ins, outs, stream: None

    return Candidate(name, priority, f"{name} kernel", supports or (lambda problem: None), prepare, always_works,
                     capabilities=capabilities)


@pytest.fixture
def fake_op(monkeypatch):
    """Registers op 'fake' (y = x) with the given candidates; returns (node, problem)."""

    def install(*candidates):
        opdef = OpDef("fake", (Input("x"),), ("y",), (), lambda types, attrs: [types[0]],
                      lambda inputs, attrs: [inputs[0]], candidates=tuple(candidates))
        monkeypatch.setitem(OPS, "fake", opdef)
        g = Graph("g")
        y = g.fake(g.input("x", (64, 64), "float16"))
        return y.producer, Problem("fake", (g.inputs[0].type,), (y.type,), {}, (9, 0))

    return install


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GE2_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# --- ranking ------------------------------------------------------------------------------------------------------
def test_cpu_has_only_the_reference(fake_op):
    node, problem = fake_op(candidate("fast", 30))
    ranking = select(node, problem, Capabilities("cpu"), Preferences())
    assert [c.name for c in ranking.viable] == ["numpy_reference"]
    assert ranking.viable[0].always_works


def test_ranking_by_priority_after_capability_checks(fake_op):
    node, problem = fake_op(candidate("medium", 20), candidate("fast", 30, supports=lambda p: "needs K % 128 == 0"),
                            candidate("slow", 10, always_works=True), candidate("quick", 25))
    ranking = select(node, problem, FAKE_GPU, Preferences())
    assert [c.name for c in ranking.viable] == ["quick", "medium", "slow", "host_reference"]
    assert ranking.rejected == (("fast", "needs K % 128 == 0"),)
    assert ranking.reason == "highest priority of 3 viable"


def test_a_capability_check_that_raises_rejects_only_that_candidate(fake_op):
    def unbuilt(problem):
        raise ImportError("native module '_ops_fake' is not built")

    node, problem = fake_op(candidate("native", 30, supports=unbuilt), candidate("other", 10))
    ranking = select(node, problem, FAKE_GPU, Preferences())
    assert [c.name for c in ranking.viable] == ["other", "host_reference"]
    assert "ImportError: native module '_ops_fake' is not built" in ranking.rejected[0][1]


def test_a_candidate_without_the_problems_dtype_is_declined_before_its_check(fake_op):
    """Candidate.dtypes (a table candidate's come from its kernel_table() row): the problem's data dtype (its first
    input's, float16 here) must be among them; the candidate's own supports is not even asked."""
    asked = []

    def supports(problem):
        asked.append(problem)
        return None

    node, problem = fake_op(replace(candidate("half_only", 30), dtypes=("float16", "bfloat16")),
                            replace(candidate("float32_only", 40, supports=supports), dtypes=("float32",)),
                            candidate("any", 10))
    ranking = selection.rank(OPS["fake"], problem)
    assert [c.name for c in ranking.viable] == ["half_only", "any"]
    assert ranking.rejected == (("float32_only", "dtype float16 is not among the dtypes it runs (float32)"),)
    assert asked == []


def test_table_kernel_chooses_by_the_table_for_a_native_call(monkeypatch):
    """A native call that is not a candidate's launch: the named kernel, or the table's best whose check passes."""
    rows = {"fast": {"name": "fast", "priority": 30, "dtypes": ("float16",)},
            "medium": {"name": "medium", "priority": 20, "dtypes": ()},
            "slow": {"name": "slow", "priority": 10, "dtypes": ("float16", "float32")}}
    monkeypatch.setitem(selection._TABLES, "_ops_fake", rows)
    checks = {"medium": "needs cols % 8 == 0"}
    assert selection.table_kernel("_ops_fake", "auto", checks.get, "float16") == "fast"
    assert selection.table_kernel("_ops_fake", "auto", checks.get, "float32") == "slow"
    assert selection.table_kernel("_ops_fake", "auto", lambda name: None, "float32") == "medium"
    assert selection.table_kernel("_ops_fake", "medium", checks.get, "float32") == "medium"  # the native call checks
    with pytest.raises(ValueError, match="kernel: 'fast' cannot run this problem: dtype float32 is not among"):
        selection.table_kernel("_ops_fake", "fast", checks.get, "float32")
    with pytest.raises(ValueError, match=r"no kernel of _ops_fake can run this problem \(fast: dtype int32 .*; "
                                         r"medium: needs cols % 8 == 0; slow: dtype int32"):
        selection.table_kernel("_ops_fake", "auto", checks.get, "int32")


def test_every_native_kernel_table_lists_its_dtypes():
    """kernel_table() rows carry the dtypes each kernel runs (KernelInfo::dtypes), GE2 dtype names."""
    from graph_executor_v2 import _native
    from graph_executor_v2.dtypes import ALL_DTYPES

    if not _native.is_built("_ops_concat"):
        pytest.skip("native modules are not built")
    for module in ("_ops_concat", "_ops_cross_entropy"):
        for row in _native.load(module).kernels():
            assert row["dtypes"] and set(row["dtypes"]) <= set(ALL_DTYPES), (module, row)
    assert all(row["dtypes"] == ALL_DTYPES[:3] for row in _native.load("_ops_cross_entropy").kernels())
    assert all(set(row["dtypes"]) == set(ALL_DTYPES) for row in _native.load("_ops_concat").kernels())
    transpose = {row["name"]: row["dtypes"] for row in _native.load("_ops_transpose").kernels()}
    assert transpose["tiled_packed"] == ("float16", "bfloat16") and set(transpose["strided"]) == set(ALL_DTYPES)


def test_force_no_epilogue_excludes_every_candidate_with_a_fused_epilogue(fake_op, monkeypatch):
    """The switch names a capability: any candidate declaring "fused_epilogue" is out, whatever its name."""
    node, problem = fake_op(candidate("my_fused", 40, capabilities=("fused_epilogue",)),
                            candidate("cublaslt_epilogue", 30, capabilities=("fused_epilogue",)),
                            candidate("cublaslt_postkernel", 20))
    monkeypatch.setenv("GE2_FORCE_NO_EPILOGUE", "1")
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences.from_env())
    assert selection.kernel == "cublaslt_postkernel"
    assert selection.rejected == (("my_fused", "excluded by GE2_FORCE_NO_EPILOGUE=1"),
                                  ("cublaslt_epilogue", "excluded by GE2_FORCE_NO_EPILOGUE=1"))
    monkeypatch.delenv("GE2_FORCE_NO_EPILOGUE")
    assert choose_kernel(node, problem, FAKE_GPU, Preferences.from_env()).kernel == "my_fused"


def test_force_no_epilogue_applies_to_the_real_gemm_op(monkeypatch):
    monkeypatch.setenv("GE2_FORCE_NO_EPILOGUE", "1")
    g = Graph("g")
    x = g.input("x", (64, 64), "float16")
    y = g.gemm(x, g.param("w", np.ones((64, 32), np.float16)), act="relu")
    problem = Problem("gemm", (x.type, g.params["w"].type, None, None), (y.type,), y.producer.attrs, (9, 0))
    ranking = select(y.producer, problem, FAKE_GPU, Preferences.from_env())
    assert "cublaslt_epilogue" not in [c.name for c in ranking.viable]
    assert ("cublaslt_epilogue", "excluded by GE2_FORCE_NO_EPILOGUE=1") in ranking.rejected


def test_pinned_kernel_goes_first_and_a_bad_pin_is_reported(fake_op):
    node, problem = fake_op(candidate("fast", 30), candidate("slow", 10), candidate("picky", 5, lambda p: "no"))
    pinned = select(node, problem, FAKE_GPU, Preferences(kernels={"fake": "slow"}))
    assert [c.name for c in pinned.viable][:2] == ["slow", "fast"] and pinned.reason == "pinned by preferences"
    bad = select(node, problem, FAKE_GPU, Preferences(kernels={"fake": "picky"}))
    assert bad.viable[0].name == "fast" and "pinned 'picky' is not viable: no" in bad.reason


# --- fallbacks ----------------------------------------------------------------------------------------------------
def test_prepare_failure_falls_to_the_next_candidate_and_is_recorded(fake_op):
    node, problem = fake_op(candidate("cublaslt", 30, prepare_error=RuntimeError("no cuBLASLt algorithm")),
                            candidate("tiled", 10, always_works=True))
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences())
    assert selection.kernel == "tiled"
    assert selection.fallbacks == (("cublaslt", "RuntimeError: no cuBLASLt algorithm"),)
    assert selection.reason == "first to prepare after 1 failure(s)"
    assert selection.is_fallback


def test_every_gpu_candidate_failing_ends_on_the_host(fake_op):
    node, problem = fake_op(candidate("only", 30, prepare_error=RuntimeError("boom")))
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences())
    assert selection.kernel == "host_reference" and selection.is_fallback
    node, problem = fake_op()  # an op with no GPU kernel at all
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences())
    assert selection.kernel == "host_reference" and "no GPU candidate applies" in selection.reason


# --- autotuning ---------------------------------------------------------------------------------------------------
def fake_timer(times_ms):
    def time(launch):
        return times_ms[launch.kernel]

    return time


def named_candidate(name, priority):
    def prepare(problem):
        def launch(ins, outs, stream):
            pass

        launch.kernel = name
        return launch

    return Candidate(name, priority, name, lambda problem: None, prepare)


def test_autotune_picks_the_fastest_and_caches_it(fake_op, cache_dir):
    node, problem = fake_op(named_candidate("fast_on_paper", 30), named_candidate("fast_in_practice", 10))
    prefs = Preferences(autotune=True)
    selection = choose_kernel(node, problem, FAKE_GPU, prefs, fake_timer({"fast_on_paper": 2.0,
                                                                         "fast_in_practice": 1.0}))
    assert selection.kernel == "fast_in_practice"
    assert selection.reason.startswith("autotuned: fast_in_practice 1.0000 ms, fast_on_paper 2.0000 ms")
    header, line = (cache_dir / "autotune.jsonl").read_text().splitlines()  # a header, then one line per problem
    assert json.loads(header) == {"format": "graph_executor_v2.autotune", "version": 2}
    entry = json.loads(line)
    assert entry.pop("seconds") >= 0  # the timing's wall time, prepares included
    assert entry == {"setup": FAKE_GPU.setup, "problem": problem_key(problem), "winner": "fast_in_practice",
                     "times_ms": {"fast_on_paper": 2.0, "fast_in_practice": 1.0}}

    def no_timing(launch):
        raise AssertionError("a cached problem must not be timed again")

    again = choose_kernel(node, problem, FAKE_GPU, prefs, no_timing, AutotuneCache())
    assert again.kernel == "fast_in_practice"
    assert again.reason == "autotune cache: fast_in_practice (fast_in_practice 1.0000 ms, fast_on_paper 2.0000 ms)"


def test_autotune_ties_go_to_the_higher_priority(fake_op, cache_dir):
    """Timings within TIE_FRACTION of the fastest are noise: the candidate ranked first by priority wins them."""
    node, problem = fake_op(named_candidate("preferred", 30), named_candidate("marginally_faster", 10))
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences(autotune=True),
                              fake_timer({"preferred": 1.02, "marginally_faster": 1.0}))
    assert selection.kernel == "preferred"
    assert "preferred: within 3% of the fastest, first by priority" in selection.reason
    node, problem = fake_op(named_candidate("first", 30), named_candidate("clearly_faster", 10))
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences(autotune=True),
                              fake_timer({"first": 1.05, "clearly_faster": 1.0}))
    assert selection.kernel == "clearly_faster"


def test_autotune_keeps_setups_apart(fake_op, cache_dir):
    node, problem = fake_op(named_candidate("a", 30), named_candidate("b", 10))
    prefs = Preferences(autotune=True)
    choose_kernel(node, problem, FAKE_GPU, prefs, fake_timer({"a": 2.0, "b": 1.0}))
    other_gpu = Capabilities("cuda", (9, 0), "Other GPU", "Other GPU | CUDA runtime 1 | cuBLASLt 2")
    selection = choose_kernel(node, problem, other_gpu, prefs, fake_timer({"a": 1.0, "b": 2.0}))
    assert selection.kernel == "a"
    assert AutotuneCache().lookup(FAKE_GPU.setup, problem_key(problem)) == "b"


def test_autotune_race_drops_a_candidate_that_fails(fake_op, cache_dir):
    node, problem = fake_op(candidate("broken", 30, prepare_error=RuntimeError("no algorithm")),
                            named_candidate("a", 20), named_candidate("b", 10))
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences(autotune=True), fake_timer({"a": 3.0, "b": 1.0}))
    assert selection.kernel == "b" and selection.reason == "autotuned: b 1.0000 ms, a 3.0000 ms"
    assert selection.fallbacks == (("broken", "RuntimeError: no algorithm"),)


def test_a_race_failure_ranked_below_the_winner_is_not_a_fallback(fake_op, cache_dir):
    """Priority order would never have prepared it: it is out of the race, listed with its reason, and the node
    still counts as having its kernel (ExecutorV2.fallbacks stays empty)."""
    node, problem = fake_op(named_candidate("a", 30), candidate("broken", 20, prepare_error=RuntimeError("no engine")),
                            named_candidate("b", 10))
    selection = choose_kernel(node, problem, FAKE_GPU, Preferences(), fake_timer({"a": 1.0, "b": 3.0}))
    assert selection.kernel == "a" and selection.reason == "autotuned: a 1.0000 ms, b 3.0000 ms"
    assert selection.fallbacks == () and not selection.is_fallback
    assert selection.rejected == (("broken", "failed when timed: RuntimeError: no engine"),)


def run_python(code: str, env: dict) -> str:
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env, "PYTHONPATH": PYTHON_DIR},
                            capture_output=True, text=True, check=True)
    return result.stdout.strip()


def test_autotune_cache_survives_a_new_process(fake_op, cache_dir):
    node, problem = fake_op(named_candidate("a", 30), named_candidate("b", 10))
    choose_kernel(node, problem, FAKE_GPU, Preferences(autotune=True), fake_timer({"a": 5.0, "b": 1.0}))
    code = ("from graph_executor_v2.runtime.autotune import AutotuneCache; "
            f"print(AutotuneCache().lookup({FAKE_GPU.setup!r}, {problem_key(problem)!r}))")
    assert run_python(code, {"GE2_CACHE_DIR": str(cache_dir)}) == "b"
    # ... and what another process stores is merged, not overwritten
    code = ("from graph_executor_v2.runtime.autotune import AutotuneCache; "
            f"AutotuneCache().store({FAKE_GPU.setup!r}, 'other problem', 'c', {{'c': 0.5}})")
    run_python(code, {"GE2_CACHE_DIR": str(cache_dir)})
    cache = AutotuneCache()
    assert cache.lookup(FAKE_GPU.setup, "other problem") == "c"
    assert cache.lookup(FAKE_GPU.setup, problem_key(problem)) == "b"


@pytest.mark.parametrize("content, why", [
    ("{ not json", "corrupt"),
    ('{"format": "graph_executor_v2.autotune", "version": 1, "setups": {}}', r"stale \(version 1, expected 2\)"),
    ('["a list"]\n', "not an autotune cache"),
    (autotune.HEADER + '{"setup": 3}\n', "malformed entry"),
    (autotune.HEADER + '{"setup": "s", "prob\n', "corrupt line"),
])
def test_a_bad_cache_file_warns_and_is_rewritten(fake_op, cache_dir, content, why, monkeypatch):
    cache_dir.mkdir(parents=True)
    (cache_dir / "autotune.jsonl").write_text(content)
    node, problem = fake_op(named_candidate("a", 30), named_candidate("b", 10))
    with pytest.warns(UserWarning, match=f"ignoring the autotune cache .*{why}"):
        selection = choose_kernel(node, problem, FAKE_GPU, Preferences(autotune=True),
                                  fake_timer({"a": 1.0, "b": 2.0}))
    assert selection.kernel == "a"
    monkeypatch.setattr(autotune, "_JOURNALS", {})  # as a new process: the file read from its start
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten file is clean
        assert AutotuneCache().lookup(FAKE_GPU.setup, problem_key(problem)) == "a"


def test_a_store_appends_one_line_and_a_miss_reads_what_others_appended(cache_dir):
    """The file is a journal: a store neither rewrites nor reparses what is there (so a shared file that grew to
    thousands of problems costs each store the same), and a miss reads the lines other processes appended, leaving
    a line that is not finished for the next read."""
    cache = AutotuneCache()
    cache.store("setup", "first", "a", {"a": 1.0, "b": 2.0}, seconds=0.5)
    path = cache_dir / "autotune.jsonl"
    before, inode = path.read_bytes(), path.stat().st_ino
    run_python("from graph_executor_v2.runtime.autotune import AutotuneCache; "
               "AutotuneCache().store('setup', 'second', 'b', {'a': 3.0, 'b': 1.0})", {"GE2_CACHE_DIR": str(cache_dir)})
    after = path.read_bytes()
    assert path.stat().st_ino == inode and after.startswith(before) and after.count(b"\n") == 3
    assert cache.lookup("setup", "second") == "b" and cache.times("setup", "second") == {"a": 3.0, "b": 1.0}
    finished = json.dumps({"setup": "setup", "problem": "third", "winner": "c", "times_ms": {"c": 1.0}}) + "\n"
    with open(path, "a") as file:
        file.write(finished[:30])  # a writer half-way through its line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.lookup("setup", "third") is None
        with open(path, "a") as file:
            file.write(finished[30:])
        assert cache.lookup("setup", "third") == "c"
    assert {(e["problem"], e["seconds"]) for e in cache.entries()} == {("first", 0.5), ("second", None),
                                                                       ("third", None)}


def test_processes_storing_at_once_lose_no_entry(cache_dir):
    code = ("import sys; from graph_executor_v2.runtime.autotune import AutotuneCache; cache = AutotuneCache(); "
            "[cache.store('setup', f'{sys.argv[1]} {i}', 'a', {'a': float(i)}) for i in range(100)]")
    environment = {**os.environ, "GE2_CACHE_DIR": str(cache_dir), "PYTHONPATH": PYTHON_DIR}
    writers = [subprocess.Popen([sys.executable, "-c", code, str(n)], env=environment) for n in range(4)]
    assert [writer.wait() for writer in writers] == [0] * 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one header, 400 whole lines
        entries = AutotuneCache().entries()
    assert sorted(e["problem"] for e in entries) == sorted(f"{n} {i}" for n in range(4) for i in range(100))


def test_a_corrupt_cache_in_a_new_process_only_warns(cache_dir):
    cache_dir.mkdir(parents=True)
    (cache_dir / "autotune.jsonl").write_bytes(b"\x00\xff garbage")
    code = ("import warnings; warnings.simplefilter('always'); "
            "from graph_executor_v2.runtime.autotune import AutotuneCache; print(AutotuneCache().lookup('s', 'p'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "GE2_CACHE_DIR": str(cache_dir), "PYTHONPATH": PYTHON_DIR})
    assert result.returncode == 0 and result.stdout.strip() == "None"
    assert "ignoring the autotune cache" in result.stderr


def test_an_unwritable_cache_only_warns(fake_op, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("GE2_CACHE_DIR", str(blocker / "cache"))  # a directory below a file cannot be created
    node, problem = fake_op(named_candidate("a", 30), named_candidate("b", 10))
    with pytest.warns(UserWarning) as caught:
        selection = choose_kernel(node, problem, FAKE_GPU, Preferences(autotune=True),
                                  fake_timer({"a": 2.0, "b": 1.0}))
    assert selection.kernel == "b"
    assert any("could not write the autotune cache" in str(w.message) for w in caught)


def test_default_cache_location(monkeypatch, tmp_path):
    monkeypatch.delenv("GE2_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_path() == tmp_path / "graph_executor_v2" / "autotune.jsonl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_path() == tmp_path / ".cache" / "graph_executor_v2" / "autotune.jsonl"
    monkeypatch.setenv("GE2_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_path() == tmp_path / "mine" / "autotune.jsonl"


# --- table candidates: metadata read from the native kernels() table -----------------------------------------------
@pytest.fixture
def fake_table(monkeypatch):
    """A native module '_ops_fake_table' whose kernels() lists three kernels (the selector imports it by name)."""
    import types

    rows = [{"name": "vector", "priority": 30, "description": "16-byte vectors", "constraints": "aligned",
             "fallback": False, "alignment": 16},
            {"name": "gather", "priority": 20, "description": "views too", "constraints": "any",
             "fallback": False, "alignment": 1},
            {"name": "scalar", "priority": 10, "description": "always", "constraints": "none",
             "fallback": True, "alignment": 1}]
    module = types.ModuleType("graph_executor_v2._ops_fake_table")
    module.kernels = lambda: rows
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(selection, "_TABLES", {})
    monkeypatch.setattr(selection, "_RESOLVED", {})
    return rows


def test_table_candidates_take_priority_description_and_alignment_from_the_kernel_table(fake_op, fake_table):
    table = [table_candidate("_ops_fake_table", name, lambda p: None, lambda p: (lambda i, o, s: None))
             for name in ("scalar", "gather", "vector")]
    with pytest.raises(TypeError, match="kernel table"):
        sorted(table, key=lambda c: -c.priority)  # never ranked by a value nobody read
    node, problem = fake_op(*table)
    resolved = selection.candidates(OPS["fake"])
    assert [(c.name, c.priority, c.description, c.always_works, c.any_alignment) for c in resolved] == [
        ("scalar", 10, "always", True, True), ("gather", 20, "views too", False, True),
        ("vector", 30, "16-byte vectors", False, False)]
    assert [c.name for c in selection.rank(OPS["fake"], problem).viable] == ["vector", "gather", "scalar"]
    unaligned = selection.rank(OPS["fake"], problem, aligned=False)
    assert [c.name for c in unaligned.viable] == ["gather", "scalar"]
    assert unaligned.rejected == (("vector", "the inputs are not 16-byte aligned"),)
    assert choose_kernel(node, problem, FAKE_GPU, Preferences()).description == "16-byte vectors"
    assert selection.kernels(OPS["fake"]) == [fake_table[2], fake_table[1], fake_table[0]]


def test_a_table_candidate_missing_from_its_table_or_module_is_rejected_with_the_reason(fake_op, fake_table):
    missing = table_candidate("_ops_fake_table", "tiled", lambda p: None, lambda p: None)
    unbuilt = table_candidate("_ops_not_built_anywhere", "vector", lambda p: None, lambda p: None)
    node, problem = fake_op(missing, unbuilt)
    ranking = select(node, problem, FAKE_GPU, Preferences())
    assert [c.name for c in ranking.viable] == ["host_reference"]
    assert "has no kernel 'tiled' in its kernels() table (vector, gather, scalar)" in ranking.rejected[0][1]
    assert "_ops_not_built_anywhere" in ranking.rejected[1][1] and "ImportError" in ranking.rejected[1][1]


# --- measured choice at plan build ----------------------------------------------------------------------------------
class TimedReferenceBackend(ReferenceBackend):
    """The CPU backend posing as one whose kernels are timed between events, as CUDA's are, so that plan building's
    autotuning runs here: ``time_ms`` runs the launch once and returns the fake time of the kernel it launched."""

    asynchronous = True

    def __init__(self, times_ms):
        self.times_ms, self.launched, self.timed = times_ms, [], []

    def event(self):
        return None

    def precompile(self, problems, settled):
        self.precompiled = [(problem.in_types[0].shape, settled(problem)) for problem in problems]

    def time_ms(self, run, stream):
        run()
        self.timed.append(self.launched[-1])
        return self.times_ms[self.launched[-1]]


def recording_candidate(name, priority, launched):
    def prepare(problem):
        return lambda ins, outs, stream: launched.append(name)

    return Candidate(name, priority, name, lambda problem: None, prepare)


@pytest.fixture
def fake_gpu_executor(monkeypatch, cache_dir):
    """(graph, make): a graph of four 'fake' nodes on two problems (three of shape (64, 64), one of (32, 64)), and
    make(**options) -> (ExecutorV2 on the fake timed backend, that backend)."""
    launched = []
    opdef = OpDef("fake", (Input("x"),), ("y",), (), lambda types, attrs: [types[0]],
                  lambda inputs, attrs: [inputs[0]],
                  candidates=(recording_candidate("on_paper", 30, launched), recording_candidate("fast", 10, launched)))
    monkeypatch.setitem(OPS, "fake", opdef)
    monkeypatch.setattr(Capabilities, "detect",
                        staticmethod(lambda device: FAKE_GPU if device == "cuda" else Capabilities("cpu")))
    g = Graph("measured")
    g.output(g.fake(g.fake(g.fake(g.input("a", (64, 64), "float32")))), "y")
    g.output(g.fake(g.input("b", (32, 64), "float32")), "z")

    def make(**options):
        backend = TimedReferenceBackend({"on_paper": 2.0, "fast": 1.0})
        backend.launched = launched
        monkeypatch.setattr(executor_module, "backend_for", lambda device: backend)
        return ExecutorV2(g, device="cuda", passes=[], **options), backend

    return g, make


def test_plans_time_each_distinct_problem_once_by_default_and_keep_the_fastest(fake_gpu_executor):
    _, make = fake_gpu_executor
    executor, backend = make()
    assert backend.timed == ["on_paper", "fast", "on_paper", "fast"]  # two problems, two candidates each
    selections = executor.plans[0].selections
    assert [s.kernel for s in selections] == ["fast"] * 4
    reasons = sorted(s.reason for s in selections)
    assert reasons == ["autotune cache: fast (fast 1.0000 ms, on_paper 2.0000 ms)"] * 2 + [
        "autotuned: fast 1.0000 ms, on_paper 2.0000 ms"] * 2
    text = executor.explain()
    assert "-> fast: autotuned: fast 1.0000 ms, on_paper 2.0000 ms" in text
    assert "autotune: 2 problem(s) timed in " in text and ", 2 node(s) from the autotune cache; plan built in" in text
    plan = executor.plans[0]
    assert plan.build_seconds >= plan.choose_seconds >= plan.tuning_seconds > 0

    again, backend = make()  # a new executor (as a new process would) reads the winners from the cache on disk
    assert backend.timed == []
    assert [s.kernel for s in again.plans[0].selections] == ["fast"] * 4
    assert "autotune: 0 problem(s) timed in 0.00 s, 4 node(s) from the autotune cache" in again.explain()


def test_a_plan_offers_every_node_to_the_parallel_compile_with_the_kernel_known_to_run(fake_gpu_executor):
    """Compilation is what runs in parallel ahead of timing: every node's problem is offered, with the one kernel
    that will run when the autotune cache or a pin settles it (the other candidates then need no compile)."""
    _, make = fake_gpu_executor
    _, backend = make()
    assert backend.precompiled == [((64, 64), None)] * 3 + [((32, 64), None)]
    _, backend = make()
    assert backend.precompiled == [((64, 64), "fast")] * 3 + [((32, 64), "fast")]
    _, backend = make(kernels={"fake": "on_paper"})
    assert {settled for _, settled in backend.precompiled} == {"on_paper"}


def test_autotune_false_keeps_the_priority_order_and_times_nothing(fake_gpu_executor):
    _, make = fake_gpu_executor
    executor, backend = make(autotune=False)
    assert backend.timed == []
    assert [s.kernel for s in executor.plans[0].selections] == ["on_paper"] * 4
    assert {s.reason for s in executor.plans[0].selections} == {"highest priority of 2 viable"}
    assert "autotune: off (autotune=False: highest priority first)" in executor.explain()


def test_a_pinned_op_is_not_timed(fake_gpu_executor):
    _, make = fake_gpu_executor
    executor, backend = make(kernels={"fake": "fast"})
    assert backend.timed == []
    assert {(s.kernel, s.reason) for s in executor.plans[0].selections} == {("fast", "pinned by preferences")}


def test_the_cpu_times_nothing(fake_gpu_executor):
    graph, _ = fake_gpu_executor
    executor = ExecutorV2(graph, device="cpu", passes=[])  # ReferenceBackend has no time_ms: a timing would raise
    assert {s.kernel for s in executor.plans[0].selections} == {"numpy_reference"}
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    b = np.ones((32, 64), np.float32)
    result = executor.run({"a": a, "b": b})
    np.testing.assert_array_equal(result["y"], a)
    np.testing.assert_array_equal(result["z"], b)


def test_an_executor_uses_what_another_one_timed_after_it_was_built(fake_gpu_executor):
    """Two executors of one graph agree on every kernel (bit-identical results): a miss reads the file again."""
    _, make = fake_gpu_executor
    cache = AutotuneCache()  # read before anything was timed
    make()
    square = TensorType((64, 64), "float32")
    assert cache.lookup(FAKE_GPU.setup, problem_key(Problem("fake", (square,), (square,), {}, (9, 0)))) == "fast"


def test_an_unwritable_cache_still_times_each_problem_once(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("GE2_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(UserWarning) as caught:
        cache = AutotuneCache()
        cache.store("setup", "problem", "b", {"a": 2.0, "b": 1.0})
    assert any("could not write the autotune cache" in str(w.message) for w in caught)
    assert cache.lookup("setup", "another problem") is None  # a miss reads the (absent) file again...
    assert cache.lookup("setup", "problem") == "b"  # ... and keeps what was stored in memory
    assert cache.times("setup", "problem") == {"a": 2.0, "b": 1.0}


def test_a_spent_tuning_budget_leaves_the_rest_to_priority_but_the_cache_still_answers(fake_gpu_executor,
                                                                                      monkeypatch):
    _, make = fake_gpu_executor
    monkeypatch.setattr(executor_module, "TUNING_BUDGET_S", 0.0)  # spent before the first node
    executor, backend = make()
    assert backend.timed == []
    assert [s.kernel for s in executor.plans[0].selections] == ["on_paper"] * 4
    assert "tuning budget (0 s) spent: 4 node(s) by priority" in executor.explain()
    monkeypatch.setattr(executor_module, "TUNING_BUDGET_S", 20.0)
    make()  # times the two problems and stores the winners
    monkeypatch.setattr(executor_module, "TUNING_BUDGET_S", 0.0)
    cached, backend = make()
    assert backend.timed == [] and [s.kernel for s in cached.plans[0].selections] == ["fast"] * 4
    assert "4 node(s) from the autotune cache; plan built" in cached.explain()


def test_the_tuning_budget_counts_timing_not_ranking(fake_gpu_executor, monkeypatch):
    """Every node ranks its candidates, timed or not, and ranking can be slow (cudnn_graph's capability check builds
    cuDNN's plans: ~2 s per problem in a cold process on the H200, which spent ResNet-50's whole budget on 10 of 48
    problems): only the races, the candidates' prepares and timed runs, spend the budget."""
    import time

    _, make = fake_gpu_executor
    ranking_s = 0.05

    def slow_to_rank(candidate):
        def supports(problem):
            time.sleep(ranking_s)
            return candidate.supports(problem)

        return replace(candidate, supports=supports)

    opdef = OPS["fake"]
    monkeypatch.setitem(OPS, "fake", replace(opdef, candidates=tuple(map(slow_to_rank, opdef.candidates))))
    monkeypatch.setattr(executor_module, "TUNING_BUDGET_S", ranking_s)  # less than one node's ranking
    executor, backend = make()
    assert backend.timed == ["on_paper", "fast", "on_paper", "fast"]  # both problems timed
    plan = executor.plans[0]
    assert plan.untimed == 0 and plan.timed_problems == 2
    assert plan.tuning_seconds < ranking_s and plan.choose_seconds - plan.tuning_seconds >= 4 * 2 * ranking_s
    assert plan.tuning_seconds == pytest.approx(sum(entry["seconds"] for entry in AutotuneCache().entries()))
    assert [s.tuning_seconds > 0 for s in plan.selections] == [True, False, False, True]  # two cache answers


def test_the_tuning_summary_adds_the_seconds_per_op_and_names_the_costliest(cache_dir):
    cache = AutotuneCache()
    cache.store("setup", 'gemm(float16[64,64]) {} sm(9, 0)', "cublaslt", {"cublaslt": 0.01, "tiled": 0.02}, 0.25)
    cache.store("setup", 'gemm(float16[8,8]) {} sm(9, 0)', "tiled", {"cublaslt": 0.01, "tiled": 0.005}, 0.5)
    cache.store("setup", 'conv2d(float16[1,3,8,8]) {} sm(9, 0)', "cudnn", {"cudnn": 0.1, "im2col_gemm": 0.3}, 2.0)
    cache.store("setup", 'relu(float32[4]) {} sm(9, 0)', "vec16", {"vec16": 0.001, "generated": 0.002})  # no seconds
    lines = autotune.summarize(cache.entries(), top=2).splitlines()
    assert lines == [
        "4 problem(s) in the cache, 3 with their timing's seconds: 2.8 s",
        "  conv2d: 1 problem(s), 2.00 s, at most 2.000 s",
        "  gemm: 2 problem(s), 0.75 s, at most 0.500 s",
        "costliest 2:",
        "  2.000 s  conv2d(float16[1,3,8,8]) {} sm(9, 0)  (2 candidates, cudnn won)",
        "  0.500 s  gemm(float16[8,8]) {} sm(9, 0)  (2 candidates, tiled won)",
    ]
