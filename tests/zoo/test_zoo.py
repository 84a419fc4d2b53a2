"""The model zoo: its machinery on any machine (the table, the error measure, a worker that crashes or runs out of
time), and real models against PyTorch in float64 on the GPU machine (torch, torchvision, transformers)."""
import copy
import json
import math
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from graph_executor_v2 import zoo
from graph_executor_v2.zoo import worker
from graph_executor_v2.zoo.models import MODELS


def test_relative_error_counts_nan_and_shape_mismatch_as_infinite():
    reference = np.array([[1.0, -4.0], [2.0, 0.5]])
    assert worker.relative_error(reference + 0.04, reference) == pytest.approx(0.01)
    assert worker.relative_error(np.where(reference > 1, np.nan, reference), reference) == math.inf
    assert worker.relative_error(reference[:1], reference) == math.inf
    assert worker.matches(3.9e-5, 1e-5, "float32") and not worker.matches(6e-5, 1e-5, "float32")
    assert worker.matches(1.7e-3, 2e-4, "float16") and not worker.matches(1.9e-3, 2e-4, "float16")
    # PyTorch's own error not finite or about 1 (the model overflows in float16): no comparison, never a match
    for overflowed in (math.inf, math.nan, 1.0):
        assert not worker.matches(overflowed, overflowed, "float16")
        assert worker.no_comparison(overflowed, "float16").startswith("no comparison: PyTorch's own float16 error")
    assert worker.no_comparison(0.3, "float16") is None


def test_the_issue_lists_every_model():
    torchvision = {"resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2", "mobilenet_v2", "mobilenet_v3_large",
                   "efficientnet_b0", "efficientnet_v2_s", "densenet121", "googlenet", "inception_v3",
                   "convnext_tiny", "vit_b_16", "vgg11_bn", "shufflenet_v2_x1_0", "deeplabv3_mobilenet_v3_large"}
    transformers = {"bert", "roberta", "gpt2", "llama", "mistral", "vit", "clip_vision", "t5_encoder",
                    "whisper_encoder"}
    assert {n for n, s in MODELS.items() if s.family == "torchvision"} == torchvision
    assert {n for n, s in MODELS.items() if s.family == "transformers"} == transformers


def _records():
    return [
        {"model": "resnet18", "frontend": "onnx", "dtype": "float32", "imported": True, "problems": [], "error": None,
         "exporter": "dynamo", "ge2_error": 1e-6, "torch_error": 2e-6, "match": True, "ge2_ms": 0.5, "eager_ms": 1.0,
         "fallbacks": 0, "fallback_ops": [], "timed_alone": True},
        {"model": "bert", "frontend": "torch", "dtype": "float32", "imported": False, "error": None,
         "problems": [["node_7", "aten.cumsum.default", "ATen op not supported by GE2"]]},
        {"model": "resnet18", "frontend": None, "dtype": "float32", "compile_ms": 0.25, "compile_mode": "default",
         "timed_alone": True},
        {"model": "resnet18", "frontend": "onnx", "dtype": "float32", "check": "two_sizes", "match": False,
         "error": "export: UserError: Detected mismatch between the structure of `inputs` and `dynamic_shapes`"},
        {"model": "bert", "frontend": "torch", "dtype": "float32", "check": "two_sizes", "error": None,
         "match": True, "exporter": "torch.export", "symbolic_inputs": ["int64[s0, s1]", "int64[s0, s1]"]},
    ]


def test_markdown_table_lists_results_compile_times_and_every_unsupported_node():
    text = zoo.format_markdown(_records(), "settings line")
    assert ("| resnet18 | onnx | dynamo | float32 | yes | 1.00e-06 | 2.00e-06 | yes | 0.500 | 1.000 | 0.250 | 0 | "
            "**no**: "
            "export: UserError: Detected mismatch between the structure of `inputs` and `dynamic_shapes` |  |") in text
    assert "| bert | torch |  | float32 | **no** |  |  |  |  |  |  |  | yes | 1 unsupported node(s)" in text
    assert "- `node_7` (aten.cumsum.default): ATen op not supported by GE2" in text
    assert "- float32: 1 of 2 (model, frontend) pairs import and match; 1 import" in text
    assert "- two sizes: 1 of 2 (model, frontend) pairs run both sizes on one executor and match" in text
    assert "| bert | torch | torch.export | int64[s0, s1], int64[s0, s1] | match |" in text
    assert "| resnet18 | onnx |  |  | export: UserError: Detected mismatch" in text
    assert "torch.compile (mode default, compiled once per (model, dtype)" in text
    assert "A row's three times come from one process, the worker of its (model, dtype)" in text


def test_markdown_notes_say_what_was_not_timed_or_timed_beside_other_workers():
    """A row timed in an older run beside other workers says so; a worker whose timing did not happen, or whose
    torch.compile failed, says why in its rows' notes."""
    case, _, compiled = _records()[:3]
    older = {**case, "timed_alone": False}
    untimed = {**case, "dtype": "float16", "ge2_ms": None, "eager_ms": None, "timed_alone": False,
               "timing_error": "not timed: the zoo's deadline had passed before its turn"}
    failed_compile = {**compiled, "dtype": "float16", "compile_ms": None,
                      "compile_error": "BackendCompilerFailed: inductor raised"}
    text = zoo.format_markdown([older, untimed, failed_compile], "settings line")
    assert ("| 0.500 | 1.000 |  | 0 |  | timed beside other workers; torch.compile not timed (by the run of this "
            "row) |") in text
    assert ("|  |  |  | 0 |  | not timed: the zoo's deadline had passed before its turn; torch.compile failed: "
            "BackendCompilerFailed: inductor raised |") in text


class _FakeTensor:
    """What the dynamic-shape helpers read of a tensor: its rank and whether it holds floats."""

    def __init__(self, rank: int, floating: bool):
        self.rank, self.floating = rank, floating

    def dim(self):
        return self.rank

    def is_floating_point(self):
        return self.floating


def test_dynamic_shapes_are_keyed_by_the_forward_parameters():
    """torch.export matches dynamic_shapes against forward's signature: the zoo's wrapper takes ``*inputs`` (one
    parameter, a tuple, so the spec of its inputs is a tuple under that name); a plain forward gets a spec per
    named parameter. Batch on axis 0 of every input, sequence on axis 1 of token inputs only."""
    fake_torch = SimpleNamespace(export=SimpleNamespace(Dim=SimpleNamespace(DYNAMIC=lambda min, max: (min, max))))
    ids, pixels = _FakeTensor(2, floating=False), _FakeTensor(4, floating=True)
    batch, sequence = (2, 64), (2, worker.SEQUENCE_MAX)

    class Wrapped:
        def forward(self, *inputs):
            return inputs

    class Named:
        def forward(self, input_ids, pixel_values=None):
            return input_ids

    assert worker.dynamic_shapes(fake_torch, Wrapped(), (ids, ids)) == {
        "inputs": ({0: batch, 1: sequence}, {0: batch, 1: sequence})}
    assert worker.dynamic_shapes(fake_torch, Wrapped(), (pixels,)) == {"inputs": ({0: batch},)}
    assert worker.dynamic_shapes(fake_torch, Named(), (ids, pixels)) == {"input_ids": {0: batch, 1: sequence},
                                                                         "pixel_values": {0: batch}}
    assert worker.dynamic_axes((ids, pixels), ["input0", "input1"]) == {"input0": {0: "batch", 1: "sequence"},
                                                                       "input1": {0: "batch"}}


def _arguments(tmp_path, **given):
    values = dict(models="resnet18", frontend="onnx,torch", dtype="float32", quick=False, no_compile=True,
                  time_limit=None, two_sizes=None, jobs=1, deadline=None, device="cuda", merge=None,
                  out=str(tmp_path / "zoo.md"))
    values.update(given)
    return SimpleNamespace(**values)


def test_a_worker_that_crashes_or_runs_out_of_time_costs_only_its_own_rows(tmp_path, monkeypatch):
    """The models' packages are declared present, so the worker starts; here (no torch) it crashes at once, and a
    time limit shorter than its start-up cuts it: either way every case of the model gets a row saying why."""
    pytest.importorskip("numpy")
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed: the worker would not crash")
    except ImportError:
        pass
    monkeypatch.setattr(zoo, "_missing_package", lambda family: None)
    crashed = zoo._run_model("resnet18", ["onnx", "torch"], ["float32"], time_limit=120, compile_too=False)
    assert [(r["frontend"], r["imported"]) for r in crashed] == [("onnx", False), ("torch", False)]
    assert all("worker exited with code 1" in r["error"] and "torch" in r["error"] for r in crashed), crashed
    timed_out = zoo._run_model("resnet18", ["onnx"], ["float32"], time_limit=0.001, compile_too=False)
    assert timed_out[0]["error"] == "time limit of 0 s reached"


def test_zoo_command_writes_the_table_and_rejects_unknown_names(tmp_path, capsys):
    assert zoo.main(_arguments(tmp_path, models="resnet18,nope")) == 2
    assert "--models: unknown nope" in capsys.readouterr().err
    assert zoo.main(_arguments(tmp_path, frontend="onnx,caffe")) == 2
    assert zoo.main(_arguments(tmp_path, jobs=0)) == 2
    assert "--jobs: expected at least 1, got 0" in capsys.readouterr().err
    assert zoo.main(_arguments(tmp_path)) == 0
    records = json.loads((tmp_path / "zoo.json").read_text())
    # one row per frontend; where torch is installed the worker also runs the two-sizes check, rows of their own
    assert [(r["model"], r["frontend"]) for r in records if "check" not in r] == [("resnet18", "onnx"),
                                                                                  ("resnet18", "torch")]
    assert {r["check"] for r in records if "check" in r} <= {"two_sizes"}
    assert (tmp_path / "zoo.md").read_text().startswith("# Model zoo")


def test_runs_merge_into_one_table_later_rows_first_unless_not_started(tmp_path, capsys):
    """Two runs' zoo.json files as one table: the second run's rows replace the first's, except where the second
    did not start the model; the rows follow the zoo's model order whatever order the files hold them in."""
    first = [zoo._failed("bert", "onnx", "float32", "not started: the zoo's deadline of 380 s had passed"),
             {**_records()[0]},
             zoo._failed("gpt2", "torch", "float16", "time limit of 22 s reached")]
    second = [{**_records()[0], "model": "bert", "ge2_error": 3e-7},
              zoo._failed("resnet18", "onnx", "float32", "not started: the zoo's deadline of 120 s had passed"),
              {**_records()[0], "model": "gpt2", "frontend": "torch", "dtype": "float16"}]
    paths = []
    for index, run in enumerate((first, second)):
        paths.append(str(tmp_path / f"run{index}.json"))
        (tmp_path / f"run{index}.json").write_text(json.dumps(run))
    out = tmp_path / "merged.md"
    assert zoo.main(_arguments(tmp_path, merge=paths, out=str(out))) == 0
    merged = json.loads(out.with_suffix(".json").read_text())
    assert [(r["model"], r["frontend"], r["dtype"], r.get("match")) for r in merged] == [
        ("resnet18", "onnx", "float32", True), ("bert", "onnx", "float32", True), ("gpt2", "torch", "float16", True)]
    assert merged[1]["ge2_error"] == 3e-7
    text = out.read_text()
    assert text.startswith("# Model zoo") and f"Merged from {paths[0]}, {paths[1]}" in text
    assert "- float32: 2 of 2 (model, frontend) pairs import and match" in text
    assert zoo.main(_arguments(tmp_path, merge=[str(tmp_path / "missing.json")])) == 2
    assert "--merge: cannot read" in capsys.readouterr().err


def test_models_run_in_parallel_slow_ones_first_within_the_deadline(monkeypatch):
    """The slow models start first; jobs workers run at a time; a model's time limit shrinks to what the deadline
    leaves, a model that would start too late is reported as not started, and the table is rewritten after every
    model with the records so far, in the models' order."""
    started, limits = [], {}

    def fake_run_model(name, frontends, dtypes, time_limit, compile_too, two_sizes=False, limit_source="",
                       device="cuda", gpu=None, turns=None):
        started.append(name)
        limits[name] = (time_limit, limit_source)
        time.sleep(1.0)  # seconds apart from the deadline's margins below, so a loaded CI host keeps the outcome
        turns.done_preparing()
        return [zoo._failed(name, frontend, dtype, "ran") for dtype in dtypes for frontend in frontends]

    monkeypatch.setattr(zoo, "_run_model", fake_run_model)
    monkeypatch.setattr(zoo, "MINIMUM_START_S", 1.5)
    slow = next(name for name, spec in MODELS.items() if spec.slow)
    models = ["resnet18", "vgg11_bn", slow]
    zoo.run_models(models, ["torch"], ["float32"], time_limit=30, compile_too=False, two_sizes=False)
    assert started == [slow, "resnet18", "vgg11_bn"]
    assert all(limit == 30 and source == "" for limit, source in limits.values())

    started.clear()
    limits.clear()
    snapshots = []
    records = zoo.run_models(models, ["torch"], ["float32"], time_limit=30, compile_too=False, two_sizes=False,
                             jobs=2, deadline=2.0, on_model=lambda so_far: snapshots.append(
                                 [r["model"] for r in so_far]))
    assert sorted(started) == sorted([slow, "resnet18"])  # vgg11_bn waited for a job until 1 s before the deadline
    assert [r["model"] for r in records] == models  # the given order, whatever finished first
    assert records[1]["error"] == "not started: the zoo's deadline of 2 s had passed"
    assert all(1.5 < limit <= 2.0 and source == " (what the zoo's --deadline left)" for limit, source in
               limits.values())
    assert len(snapshots) == 3 and snapshots[-1] == models

    # one worker per (model, dtype): float16 rows neither wait for float32 ones nor share their time limit
    started.clear()
    records = zoo.run_models(["resnet18", slow], ["torch"], ["float32", "float16"], time_limit=30, compile_too=False,
                             two_sizes=False, jobs=4)
    assert sorted(started) == sorted(["resnet18", "resnet18", slow, slow])
    assert [(r["model"], r["dtype"]) for r in records] == [("resnet18", "float32"), ("resnet18", "float16"),
                                                            (slow, "float32"), (slow, "float16")]


def test_workers_spread_over_the_visible_gpus(monkeypatch):
    """With several GPUs, each worker process runs on the one with the fewest workers alive on it (preparing or
    waiting for its turn to time), alone (CUDA_VISIBLE_DEVICES): 4 jobs over 2 GPUs prepare 2 models on each; the 2
    that start while the first 4 wait go one to each GPU; the ids come from CUDA_VISIBLE_DEVICES where it is set."""
    given, busy, most = {}, {"3": 0, "5": 0}, {"3": 0, "5": 0}
    lock = threading.Lock()
    models = ["resnet18", "resnet50", "vgg11_bn", "googlenet", "bert", "gpt2"]

    def fake_run_model(name, frontends, dtypes, time_limit, compile_too, two_sizes=False, limit_source="",
                       device="cuda", gpu=None, turns=None):
        with lock:
            given[name] = gpu
            busy[gpu] += 1
            most[gpu] = max(most[gpu], busy[gpu])
        # staggered preparations: one ends every 0.4 s, so a job frees (and the next model starts) while others still
        # prepare, and no turn can begin (it needs none preparing) before all six have started, even on a busy CI host
        time.sleep(0.3 + 0.4 * models.index(name))
        turns.done_preparing()
        with turns.turn():
            with lock:
                busy[gpu] -= 1
        return [zoo._failed(name, frontend, dtype, "ran") for dtype in dtypes for frontend in frontends]

    monkeypatch.setattr(zoo, "_run_model", fake_run_model)
    zoo.run_models(models, ["torch"], ["float32"], time_limit=30, compile_too=False, two_sizes=False, jobs=4,
                   gpus=["3", "5"])
    assert set(given) == set(models) and set(given.values()) == {"3", "5"}
    assert most == {"3": 3, "5": 3}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert zoo._visible_gpus() == ["3", "5"]


def test_workers_prepare_side_by_side_and_time_alone(monkeypatch):
    """jobs workers prepare at a time; a prepared worker waits for a turn to time in which no other worker prepares
    or times; at most ALIVE_MOST workers prepare or wait at once, and a start that limit holds back lets the waiting
    ones time first (a run of many models times as it goes instead of stalling)."""
    events, lock = [], threading.Lock()

    def log(*event):
        with lock:
            events.append((time.perf_counter(), *event))

    def fake_run_model(name, frontends, dtypes, time_limit, compile_too, two_sizes=False, limit_source="",
                       device="cuda", gpu=None, turns=None):
        log("prepare", name)
        time.sleep(0.2 + 0.1 * (len(name) % 3))
        log("prepared", name)
        turns.done_preparing()
        with turns.turn() as allowed:
            assert allowed == zoo.TIMING_LIMIT_S
            log("time", name)
            time.sleep(0.02)
            log("timed", name)
        return [zoo._failed(name, frontend, dtype, "ran") for dtype in dtypes for frontend in frontends]

    monkeypatch.setattr(zoo, "_run_model", fake_run_model)
    monkeypatch.setattr(zoo, "ALIVE_MOST", 6)
    models = list(MODELS)[:12]
    records = zoo.run_models(models, ["torch"], ["float32"], time_limit=30, compile_too=False, two_sizes=False, jobs=4)
    assert [r["model"] for r in records] == models
    preparing, waiting, timing, most_preparing, most_alive = set(), set(), set(), 0, 0
    for _, kind, name in sorted(events):
        if kind == "prepare":
            assert not timing, f"{name} started while {timing} timed"
            preparing.add(name)
        elif kind == "prepared":
            preparing.remove(name)
            waiting.add(name)
        elif kind == "time":
            assert not preparing and not timing, f"{name} timed while {preparing or timing} ran"
            waiting.remove(name)
            timing.add(name)
        else:
            timing.remove(name)
        most_preparing = max(most_preparing, len(preparing))
        most_alive = max(most_alive, len(preparing | waiting | timing))
    assert most_preparing == 4  # side by side, never more than jobs
    assert most_alive == 6  # the limit holds, and is reached
    first_time = min(when for when, kind, _ in events if kind == "time")
    assert first_time < max(when for when, kind, _ in events if kind == "prepare")  # drained, then went on


def test_a_turn_is_refused_after_the_deadline_and_lasts_what_is_left():
    turns = zoo._Turns(jobs=2, alive_most=4, deadline_at=time.perf_counter() + 30)
    with turns.turn() as allowed:
        assert 29 < allowed <= 30  # less than TIMING_LIMIT_S: what the deadline leaves
    late = zoo._Turns(jobs=2, alive_most=4, deadline_at=time.perf_counter() - 1)
    with late.turn() as allowed:
        assert allowed is None
    late.start_preparing(0)  # the refused turn left nothing draining


_FAKE_WORKER = r"""
import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
record = {"model": "resnet18", "frontend": "torch", "dtype": "float32", "imported": True, "problems": [],
          "error": None, "ge2_error": 1e-6, "match": True}
def emit(r):
    with open(out, "a") as stream:
        stream.write(json.dumps(r) + "\n")
emit(record)
print("some library's chatter", flush=True)
print("PREPARED", flush=True)
if sys.stdin.readline().strip() == "time":
    emit({**record, "ge2_ms": 0.5, "eager_ms": 2.0})
"""


def test_a_worker_times_only_in_its_turn_and_its_rows_say_so(tmp_path, monkeypatch):
    """The handshake with a real process: the worker's first record (no times) is replaced by its timed one, marked
    timed alone; where the deadline passed before its turn the worker is told to stop, and the row says it was not
    timed."""
    script = tmp_path / "fake_worker.py"
    script.write_text(_FAKE_WORKER)
    monkeypatch.setattr(zoo, "_missing_package", lambda family: None)
    monkeypatch.setattr(zoo, "_worker_command", lambda name, frontends, dtypes, out, *rest: [
        sys.executable, str(script), "--out", str(out)])
    turns = zoo._Turns(jobs=1, alive_most=2)
    turns.start_preparing(0)
    [record] = zoo._run_model("resnet18", ["torch"], ["float32"], time_limit=60, compile_too=True, turns=turns)
    assert (record["ge2_ms"], record["eager_ms"], record["timed_alone"]) == (0.5, 2.0, True)
    late = zoo._Turns(jobs=1, alive_most=2, deadline_at=time.perf_counter() - 1)
    late.start_preparing(0)
    [record] = zoo._run_model("resnet18", ["torch"], ["float32"], time_limit=60, compile_too=True, turns=late)
    assert "ge2_ms" not in record and "timed_alone" not in record and record["match"]
    assert record["timing_error"] == "not timed: the zoo's deadline had passed before its turn"


def test_sized_inputs_are_contiguous_at_the_new_batch_and_sequence():
    """The two-sizes check feeds its inputs to GE2 as they are: contiguous, the batch rows repeated from the first,
    token inputs cut (or repeated) to the sequence, other inputs at their own size."""
    torch = pytest.importorskip("torch", reason="the zoo's inputs are torch tensors")
    ids = torch.arange(32).reshape(2, 16)
    pixels = torch.randn(2, 3, 4, 4)
    sized_ids, sized_pixels = worker.sized_inputs(torch, (ids, pixels), 3, 14)
    assert sized_ids.is_contiguous() and sized_pixels.is_contiguous()
    assert torch.equal(sized_ids, torch.cat([ids, ids[:1]])[:, :14])
    assert torch.equal(sized_pixels, torch.cat([pixels, pixels[:1]]))
    assert torch.equal(worker.sized_inputs(torch, (ids,), 2, 20)[0][:, 16:], ids[:, :4])


# --- real models on the GPU machine -----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("frontend", ["onnx", "torch"])
def test_resnet18_imports_and_matches_pytorch(frontend):
    """The zoo's check on the CNN the issue found passing through both frontends: imported, within 4x of PyTorch's
    own float32 error against float64 (a regression here is a frontend or kernel regression)."""
    torch = pytest.importorskip("torch", reason="the zoo needs PyTorch")
    pytest.importorskip("torchvision", reason="the zoo's CNNs come from torchvision")
    master, inputs = MODELS["resnet18"].build(torch)
    with torch.no_grad():
        reference = master.double()(*(x.double() for x in inputs)).numpy()
    master = master.float()
    record, time_case = worker.run_case(torch, "resnet18", frontend, "float32", master, inputs, reference)
    record = time_case()
    print(json.dumps(record, indent=1))  # the whole record in the log of a failing run
    assert record["imported"] and record["error"] is None, record
    assert record["match"], record
    assert record["ge2_ms"] > 0 and record["eager_ms"] > 0, record


def test_dynamo_export_is_retried_with_math_attention_only_for_the_stride_failure(monkeypatch, tmp_path):
    """torch's dynamo exporter can fail on scaled_dot_product_attention's output strides ("Cannot view a tensor"
    raised inside its decomposition): the zoo exports once more with the math SDPA kernel selected and says so;
    any other export failure is raised as it is, after one attempt."""
    torch = pytest.importorskip("torch", reason="the retry selects a PyTorch SDPA kernel")
    calls = []

    def failing_export(*arguments, **options):
        calls.append(torch.backends.cuda.flash_sdp_enabled())
        if len(calls) == 1:
            try:
                raise ValueError("Cannot view a tensor with shape torch.Size([2, 16, 4, 32]) and strides ...")
            except ValueError as cause:
                raise RuntimeError("Failed to decompose the FX graph for ONNX compatibility") from cause

    monkeypatch.setattr(torch.onnx, "export", failing_export)
    assert worker._export_dynamo(torch, None, (), str(tmp_path / "m.onnx")) == "dynamo, SDPA traced as math"
    assert calls == [torch.backends.cuda.flash_sdp_enabled(), False]  # the second export: flash attention off

    def other_failure(*arguments, **options):
        calls.append("other")
        raise RuntimeError("Unsupported FX nodes: {'aten.frobnicate'}")

    calls.clear()
    monkeypatch.setattr(torch.onnx, "export", other_failure)
    with pytest.raises(RuntimeError, match="frobnicate"):
        worker._export_dynamo(torch, None, (), str(tmp_path / "m.onnx"))
    assert calls == ["other"]


def test_t5_encoder_through_the_dynamo_exporter_on_the_cpu(tmp_path):
    """T5EncoderModel (relative position bias, padding mask) through torch.onnx.export's dynamo exporter, imported
    and run on GE2's CPU backend against PyTorch float64. With autograd on, torch 2.11's exporter fails on SDPA's
    output strides, which the zoo's retry covers; the row names the exporter that wrote the graph."""
    torch = pytest.importorskip("torch", reason="the zoo needs PyTorch")
    pytest.importorskip("transformers", reason="T5 comes from transformers")
    import graph_executor_v2 as ge2

    master, inputs = MODELS["t5_encoder"].build(torch)
    with torch.no_grad():
        reference = master.double()(*inputs).numpy()
        torch_error = worker.relative_error(master.float()(*inputs).numpy(), reference)
    graph, exporter = worker._import(torch, "onnx", master, inputs, str(tmp_path))  # autograd on: the retry
    assert exporter in ("dynamo", "dynamo, SDPA traced as math")
    assert graph.op_counts().get("attention", 0) == 2, graph.op_counts()  # one per layer, the bias as its input
    result = ge2.ExecutorV2(graph, device="cpu").run({v.name: x.numpy() for v, x in zip(graph.inputs, inputs)})
    error = worker.relative_error(next(iter(result.values())), reference)
    assert worker.matches(error, torch_error, "float32"), (error, torch_error)


@pytest.mark.parametrize("frontend", ["onnx", "onnx-legacy", "torch"])
def test_a_case_runs_on_the_cpu_without_times(frontend):
    """``--device cpu``: PyTorch and GE2's CPU backend, the same record as on the GPU (imported, the exporter, both
    errors against float64, the match) without the GPU's times."""
    torch = pytest.importorskip("torch", reason="the zoo needs PyTorch")
    torch.manual_seed(0)
    master = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    inputs = (torch.randn(3, 16),)
    with torch.no_grad():
        reference = copy.deepcopy(master).double()(inputs[0].double()).numpy()
    record, time_case = worker.run_case(torch, "mlp", frontend, "float32", master, inputs, reference, device="cpu")
    assert time_case is None
    assert record["imported"] and record["error"] is None, record
    assert record["exporter"] == {"onnx": "dynamo", "onnx-legacy": "legacy (TorchScript)",
                                  "torch": "torch.export"}[frontend]
    assert record["match"] and record["ge2_error"] < 1e-6, record
    assert "ge2_ms" not in record and "eager_ms" not in record


def test_the_two_sizes_check_is_on_by_default_and_can_be_turned_off():
    from graph_executor_v2.__main__ import build_parser

    parse = lambda *flags: build_parser().parse_args(["zoo", *flags]).two_sizes  # noqa: E731
    assert (parse(), parse("--two-sizes"), parse("--no-two-sizes")) == (None, True, False)
