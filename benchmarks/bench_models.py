"""Whole models imported through ONNX, run by GE2 against PyTorch eager, torch.compile and onnxruntime, in one
process on the GPU (issue 22's table). Random weights (torchvision / transformers constructors, never a download).

Rows: ResNet-50 float16 and float32 at batch 1 and 32; EfficientNet-B0 float16 batch 32; ViT-B/16 float16 batch 32;
BERT-base float16 (sequence 128, batch 32); GPT-2 124M forward (LM head included) float16, 8 x 512 tokens.

Each row: the model is exported by torch.onnx.export (the dynamo exporter; the TorchScript one when that fails),
imported (``frontend.onnx``) and planned by ``ExecutorV2`` with its default passes and precision; its output is
checked against the model in float64 first (GE2's error within 4x of PyTorch's own in that dtype plus a floor, the
zoo's rule). A model that does not import is a row saying why (the unsupported nodes), not a silent gap. The
torchvision models get the zoo's random-weight preparation (``zoo.models.random_weights_ready``: ViT's all-zero head
gets weights, so its output compares something; batch norms get measured statistics, so float16 does not overflow).

Columns: GE2, PyTorch eager and torch.compile median ms (CUDA events, L2 flushed), torch.compile's mode and compile
time (its first call, after ``torch._dynamo.reset()``, static shapes) and its error against float64, onnxruntime's
ms with its provider named (the CPU provider is wall-clock and, being slow, timed on batch-1 rows only unless
GE2_BENCH_ORT=all), the precision each side ran at, GE2's kernel count (plan steps that launch: views excluded)
and which conv2d kernels it chose.

Profiles (for a row's cause): results/models_profile.md (a subset: models_<ids>_profile.md) holds, per row, GE2's
``ex.profile()`` summed per (op, kernel) (``Profile.op_table``), its slowest nodes and ``explain()``. GE2's timed
runs lie between cudaProfilerStart/Stop, so ``nsys profile --capture-range=cudaProfilerApi
--cuda-graph-trace=node`` over a one-row run records exactly them (kernels inside the CUDA graph included).

Environment:
- GE2_BENCH_COMPILE_MODE: torch.compile's mode for every row (default "max-autotune", the issue's; "default"
  compiles in a fraction of the time; "none" skips torch.compile), or per dtype, e.g.
  "float16:max-autotune,float32:default" (a dtype not named: "none"). The table says which ran on each row.
- GE2_BENCH_MODELS: comma-separated row ids to run a subset (resnet50_f16_b32, ...), in the table's order.
- GE2_BENCH_BUDGET_S: a time budget in seconds for the whole run. The run has two phases: every row's GE2 part
  (export, cold build with timing, GE2 and eager times, profile, warm build, onnxruntime: 20-80 s a row on the
  H200), then torch.compile row by row (max-autotune compiles for minutes per model), so a short budget costs
  compile columns, never a row's GE2 figures. Once the budget is spent, the rows left are written as "not run:
  time budget", a warm build is skipped and no compile starts. The tables are written after every step, so a run
  killed by a time limit keeps what it did.
- GE2_BENCH_COMPILE_FIRST: comma-separated row ids that get their torch.compile first, in that order; then the
  float16 rows (the ones with a target against torch.compile), then the float32 ones, in the table's order.
- GE2_BENCH_WARM_BUILD, GE2_BENCH_PROFILE: "1" (every row, the default), "0" (none) or comma-separated row ids.
- GE2_BENCH_COMPILE_CONV_BACKENDS: torch._inductor's max_autotune_conv_backends for the max-autotune compiles, e.g.
  "ATEN" (cuDNN only). In torch 2.11 Triton's convolution templates fault with an illegal address while autotuning
  EfficientNet-B0's depthwise convs (which leaves the process's CUDA context unusable), so that row needs "ATEN";
  the mode column names the setting.

GE2's plan is built with its default measured kernel choice (autotune). The plan-build cost has a table of its own,
results/models_build.md (a subset of rows: results/models_<ids>.md and models_<ids>_build.md), per row:
- cold, in the benchmark's process with an empty GE2_CACHE_DIR (no compiled kernel, no autotune entry): ONNX export
  and import seconds, then ExecutorV2's passes, its plan (of which: compiling generated kernels ahead, in parallel,
  and timing candidates, with the count of problems timed, of nodes the autotune cache answered and of nodes left
  to priority once the plan's tuning budget was spent; and the other nodes' choices: capability checks, which for
  cudnn_graph build cuDNN's plans, and prepares), parameter upload and the rest, and the first run (the
  warm-up node by node, then the CUDA-graph capture, which is also shown alone); the first row run also pays
  GE2's one-time library set-up (cuDNN and cuBLASLt handles, module loads);
- warm, in a new process with the caches the cold build filled (what a second run of a user's script pays): the
  same columns (GE2_BENCH_WARM_BUILD chooses the rows; skipped once the time budget is spent).

Precision: PyTorch runs at its defaults, set explicitly (cuDNN convolutions may use TF32, matmuls may not), GE2 at
its "default" precision, which is the same policy; float16 rows accumulate in float32 on both sides.

Run: python benchmarks/bench_models.py
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from harness import RESULTS, median_ms, torch_cuda, wall_ms, write_results

import graph_executor_v2 as ge2
from graph_executor_v2.frontend import UnsupportedModelError
from graph_executor_v2.frontend import onnx as onnx_frontend
from graph_executor_v2.runtime.autotune import AutotuneCache, seconds_by_op, summarize
from graph_executor_v2.runtime.executor import ALIAS
from graph_executor_v2.zoo.models import _wrapped, random_weights_ready
from graph_executor_v2.zoo.worker import matches, relative_error

COMPILE_MODES = ("max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead", "default", "none")
BUDGET_S = float(os.environ.get("GE2_BENCH_BUDGET_S", "inf"))
STARTED = time.perf_counter()
ORT_ROWS = os.environ.get("GE2_BENCH_ORT", "batch1")  # "all": time onnxruntime's CPU provider on every row


def budget_left() -> float:
    return BUDGET_S - (time.perf_counter() - STARTED)


def compile_modes(setting: str) -> dict[str, str]:
    """GE2_BENCH_COMPILE_MODE: one torch.compile mode for every row ("max-autotune"), or per dtype
    ("float16:max-autotune,float32:default"; a dtype not named gets "none"). Returns dtype -> mode."""
    if ":" not in setting:
        pairs = [(dtype, setting) for dtype in ("float16", "float32")]
    else:
        pairs = [tuple(part.split(":", 1)) for part in setting.split(",")]
    modes = {"float16": "none", "float32": "none"} if ":" in setting else {}
    for dtype, mode in pairs:
        if dtype not in ("float16", "float32") or mode not in COMPILE_MODES:
            raise ValueError(f"GE2_BENCH_COMPILE_MODE: expected a mode of {COMPILE_MODES} or dtype:mode pairs "
                             f"(dtype float16 or float32), got {setting!r}")
        modes[dtype] = mode
    return modes


def row_switch(variable: str, default: str, row_id: str) -> bool:
    """An on/off setting per row: "1" (every row), "0" (none) or comma-separated row ids."""
    setting = os.environ.get(variable, default)
    return setting == "1" or row_id in setting.split(",")


COMPILE_MODE = compile_modes(os.environ.get("GE2_BENCH_COMPILE_MODE", "max-autotune"))


@dataclass(frozen=True)
class Row:
    id: str
    model: str
    dtype: str
    batch: int
    build: object  # build(torch, batch) -> (module in eval mode on the CPU, float32; inputs tuple on the CPU)
    shape: str  # the input, for the table


def _torchvision(name):
    def build(torch, batch):
        import torchvision

        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None).eval()
        # as the zoo does: ViT's zero head gets weights, batch norms measured statistics (no float16 overflow)
        random_weights_ready(torch, model, torch.randn(min(batch, 8), 3, 224, 224))
        return model, (torch.randn(batch, 3, 224, 224),)

    return build


def _bert(torch, batch):
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig()).eval()  # bert-base: 12 x 768, 12 heads
    ids = torch.randint(3, model.config.vocab_size, (batch, 128), generator=torch.Generator().manual_seed(1))
    return _wrapped(torch, model, ("input_ids",)), (ids,)


def _gpt2(torch, batch):
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(use_cache=False)).eval()  # 124M: 12 x 768
    ids = torch.randint(0, model.config.vocab_size, (batch, 512), generator=torch.Generator().manual_seed(1))
    return _wrapped(torch, model, ("input_ids",)), (ids,)


ROWS = [
    Row("resnet50_f16_b1", "ResNet-50", "float16", 1, _torchvision("resnet50"), "1x3x224x224"),
    Row("resnet50_f16_b32", "ResNet-50", "float16", 32, _torchvision("resnet50"), "32x3x224x224"),
    Row("resnet50_f32_b1", "ResNet-50", "float32", 1, _torchvision("resnet50"), "1x3x224x224"),
    Row("resnet50_f32_b32", "ResNet-50", "float32", 32, _torchvision("resnet50"), "32x3x224x224"),
    Row("efficientnet_b0_f16_b32", "EfficientNet-B0", "float16", 32, _torchvision("efficientnet_b0"),
        "32x3x224x224"),
    Row("vit_b_16_f16_b32", "ViT-B/16", "float16", 32, _torchvision("vit_b_16"), "32x3x224x224"),
    Row("bert_base_f16_b32", "BERT-base", "float16", 32, _bert, "32x128 tokens"),
    Row("gpt2_124m_f16_8x512", "GPT-2 124M (LM head)", "float16", 8, _gpt2, "8x512 tokens"),
]


def _on_gpu(torch, module, inputs, dtype):
    torch_dtype = getattr(torch, dtype)
    return (copy.deepcopy(module).to("cuda", torch_dtype),
            tuple(x.to("cuda", torch_dtype) if x.is_floating_point() else x.to("cuda") for x in inputs))


def _numpy(torch, tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float64).numpy()


def _export_and_import(torch, module, inputs, directory, seconds: dict | None = None):
    """(graph, exporter, ONNX path): the dynamo exporter first, the TorchScript one when it fails. ``seconds``, when
    given, receives "export_s" (the exporter that succeeded) and "import_s"."""
    names = [f"input{index}" for index in range(len(inputs))]
    path = str(Path(directory) / "model.onnx")
    failures = []
    for exporter, options in (("dynamo", dict(dynamo=True)), ("torchscript", dict(dynamo=False, opset_version=17))):
        started = time.perf_counter()
        try:
            torch.onnx.export(module, inputs, path, input_names=names, output_names=["y"], **options)
        except Exception as error:  # noqa: BLE001 - the other exporter is tried, both failures reported
            failures.append(f"{exporter} export: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
            continue
        exported = time.perf_counter()
        graph = onnx_frontend.load(path)
        if seconds is not None:
            seconds.update(export_s=exported - started, import_s=time.perf_counter() - exported)
        return graph, exporter, path
    raise RuntimeError("; ".join(failures))


@contextlib.contextmanager
def _cache_directory(path):
    """GE2_CACHE_DIR (the kernel and autotune caches) set to ``path`` for the block."""
    previous = os.environ.get("GE2_CACHE_DIR")
    os.environ["GE2_CACHE_DIR"] = str(path)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["GE2_CACHE_DIR"]
        else:
            os.environ["GE2_CACHE_DIR"] = previous


def build_and_run_once(graph, host_feeds: dict, device: str = "cuda") -> tuple:
    """(executor, its first run's outputs, the seconds of each part of getting there): ExecutorV2's passes and plan
    (of which compiling generated kernels ahead and timing candidates, with their counts), parameter upload and the
    rest of the constructor, and the first run on host feeds (warm-up node by node, then the capture)."""
    started = time.perf_counter()
    executor = ge2.ExecutorV2(graph, device=device)
    build_s = time.perf_counter() - started
    plan = executor.plans[0]
    started = time.perf_counter()
    outputs = executor.run(host_feeds)  # host results: the run has finished when it returns
    first_run_s = time.perf_counter() - started
    passes_s = sum(record.seconds for record in executor.pass_records)
    split = {"build_s": build_s, "passes_s": passes_s, "plan_s": plan.build_seconds,
             "kernel_compile_s": plan.compile_seconds, "tuning_s": plan.tuning_seconds,
             "choosing_s": plan.choose_seconds - plan.tuning_seconds,
             "other_s": build_s - passes_s - plan.build_seconds, "first_run_s": first_run_s,
             "capture_s": plan.capture_seconds, "timed": plan.timed_problems, "cache_hits": plan.cached_choices,
             "untimed": plan.untimed}
    return executor, outputs, split


def warm_build(directory, cache, seconds: float) -> dict:
    """The plan build of the model exported in ``directory`` again, in a new process, with the caches in ``cache``
    that the cold build filled: what a second run of a user's script pays (``--warm-build``)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--warm-build", str(directory)]
    result = subprocess.run(command, env={**os.environ, "GE2_CACHE_DIR": str(cache)}, capture_output=True, text=True,
                            timeout=seconds)
    if result.returncode != 0:
        raise RuntimeError(f"warm build failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _warm_build_main(directory: str) -> None:
    """--warm-build DIR: imports DIR/model.onnx, builds and runs it once on DIR/inputs.npz; prints the split."""
    started = time.perf_counter()
    graph = onnx_frontend.load(str(Path(directory) / "model.onnx"))
    import_s = time.perf_counter() - started
    with np.load(Path(directory) / "inputs.npz") as inputs:
        feeds = {name: inputs[name] for name in inputs.files}
    _, _, split = build_and_run_once(graph, feeds)
    print(json.dumps({"import_s": import_s, **split}))


def _kernel_count(executor) -> tuple[int, str]:
    """(launching steps of the plan, conv2d kernels chosen as 'name xN')."""
    plan = executor.plans[0]
    convs = collections.Counter(s.kernel for s in plan.selections if s.op == "conv2d")
    return (sum(s.kernel != ALIAS for s in plan.selections),
            ", ".join(f"{kernel} x{count}" for kernel, count in convs.most_common()))


def _onnxruntime(row, path, inputs, reference, record):
    try:
        import onnxruntime
    except ImportError:
        record["ort"] = "onnxruntime is not installed"
        return
    provider = ("CUDAExecutionProvider" if "CUDAExecutionProvider" in onnxruntime.get_available_providers()
                else "CPUExecutionProvider")
    record["ort_provider"] = provider.removesuffix("ExecutionProvider")
    if provider == "CPUExecutionProvider" and ORT_ROWS != "all" and row.batch != 1:
        record["ort"] = "not timed (CPU provider, batch > 1; GE2_BENCH_ORT=all times it)"
        return
    session = onnxruntime.InferenceSession(path, providers=[provider])
    feeds = {arg.name: x.cpu().numpy() for arg, x in zip(session.get_inputs(), inputs)}
    result = session.run(None, feeds)[0]
    record["ort_error"] = relative_error(result, reference)
    record["ort_ms"] = wall_ms(lambda: session.run(None, feeds), warmup=1, reps=3)


def _precision(torch, dtype):
    if dtype != "float32":
        return f"{dtype} (float32 accumulation)"
    conv = "TF32" if torch.backends.cudnn.allow_tf32 else "FP32"
    matmul = "TF32" if torch.backends.cuda.matmul.allow_tf32 else "FP32"
    return f"float32: conv {conv}, matmul {matmul}"


@dataclass
class Kept:
    """What a row keeps for its torch.compile, which runs after every row's GE2 part: the module and inputs in the
    row's dtype on the GPU, and the float64 reference output (host)."""
    module: object
    inputs: tuple
    reference: np.ndarray


def run_row(torch, row: Row) -> tuple[dict, Kept | None]:
    """The row's GE2 part (export, import, cold build, GE2 and eager times, profile, warm build, onnxruntime):
    (its record, what its torch.compile needs; None when the model could not be built)."""
    record = {"id": row.id, "model": row.model, "dtype": row.dtype, "input": row.shape, "status": "ok"}
    started = time.perf_counter()
    try:
        master, host_inputs = row.build(torch, row.batch)
    except ImportError as error:
        return {**record, "status": f"not run: {error}"}, None
    with torch.no_grad():
        module64, inputs64 = _on_gpu(torch, master, host_inputs, "float64")
        reference = _numpy(torch, module64(*inputs64))
        del module64, inputs64
        module, inputs = _on_gpu(torch, master, host_inputs, row.dtype)
        record["torch_error"] = relative_error(_numpy(torch, module(*inputs)), reference)
        record["eager_ms"] = median_ms(lambda: module(*inputs), warmup=5, reps=20)
        record["torch_precision"] = _precision(torch, row.dtype)
        with tempfile.TemporaryDirectory() as directory:
            seconds = {}
            try:
                graph, exporter, path = _export_and_import(torch, module, inputs, directory, seconds)
            except UnsupportedModelError as error:
                unsupported = sorted({f"{op} ({reason[:60]})" for _, op, reason in error.problems})
                record["status"] = f"does not import: {len(error.problems)} node(s): " + "; ".join(unsupported[:4])
                graph = None
            except Exception as error:  # noqa: BLE001 - an export failure is a row of the table, not a crash
                record["status"] = f"does not export: {str(error)[:300]}"
                graph = None
            if graph is not None:
                record["exporter"] = exporter
                record.update(seconds)
                host_feeds = {value.name: x.cpu().numpy() for value, x in zip(graph.inputs, inputs)}
                cache = Path(directory) / "cache"
                with _cache_directory(cache):  # cold: no compiled kernel, no autotune entry
                    executor, first, split = build_and_run_once(graph, host_feeds)
                    tuned = AutotuneCache().entries()
                record.update(split)
                print(f"{row.id}: what the cold build's timing cost:\n{summarize(tuned, top=8)}", flush=True)
                record["tuning_by_op"] = ", ".join(f"{op} {len(seconds)}: {sum(seconds):.1f} s"
                                                   for op, seconds in seconds_by_op(tuned).items())
                feeds = {value.name: x for value, x in zip(graph.inputs, inputs)}
                output = next(iter(graph.outputs))
                record["ge2_error"] = relative_error(first[output].astype(np.float64), reference)
                record["match"] = matches(record["ge2_error"], record["torch_error"], row.dtype)
                torch.cuda.profiler.start()  # nsys --capture-range=cudaProfilerApi records GE2's timed runs only
                record["ge2_ms"] = median_ms(lambda: executor.run(feeds), warmup=5, reps=20)
                torch.cuda.profiler.stop()
                record["kernels"], record["conv_kernels"] = _kernel_count(executor)
                record["fallbacks"] = len(executor.fallbacks)
                record["ge2_precision"] = (f"{executor.precision}: " + _precision_of_graph(executor, row.dtype))
                record["vs_eager"] = record["eager_ms"] / record["ge2_ms"]
                if row_switch("GE2_BENCH_PROFILE", "1", row.id):
                    record["profile"] = _profile_text(executor, feeds)
                del executor
                warm = row_switch("GE2_BENCH_WARM_BUILD", "1", row.id)
                if warm and budget_left() > 0:
                    np.savez(Path(directory) / "inputs.npz", **host_feeds)
                    try:
                        warm = warm_build(directory, cache, min(180.0, max(30.0, budget_left())))
                        record.update({f"warm_{key}": value for key, value in warm.items()})
                    except Exception as error:  # noqa: BLE001 - reported in the row
                        record["warm_note"] = f"{type(error).__name__}: {str(error)[:200]}"
                else:
                    record["warm_note"] = ("not run: time budget spent" if warm else
                                           "not run (GE2_BENCH_WARM_BUILD leaves this row out)")
                try:
                    _onnxruntime(row, path, inputs, reference, record)
                except Exception as error:  # noqa: BLE001 - an onnxruntime failure is reported in the row
                    record["ort"] = f"onnxruntime failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record, Kept(module, inputs, reference)


def compile_row(torch, row: Row, record: dict, kept: Kept) -> None:
    """The row's torch.compile columns: compile time (the first call), error against float64, median ms."""
    mode = record["compile_mode"] = COMPILE_MODE[row.dtype]
    if mode == "none":
        return
    conv_backends = os.environ.get("GE2_BENCH_COMPILE_CONV_BACKENDS")
    if conv_backends and mode.startswith("max-autotune"):
        from torch._inductor import config as inductor_config  # torch is imported at run time in this script

        inductor_config.max_autotune_conv_backends = conv_backends
        record["compile_mode"] = f"{mode} (conv backends: {conv_backends})"
    if budget_left() <= 0:
        record["compile_error"] = f"not run: time budget (GE2_BENCH_BUDGET_S={BUDGET_S:g}) spent"
        return
    started = time.perf_counter()
    try:
        with torch.no_grad():
            # A fresh compile per row, static shapes: a code object compiled for an earlier row (ResNet's forward at
            # another batch) would otherwise recompile with a dynamic batch.
            torch._dynamo.reset()
            compiled = torch.compile(kept.module, mode=mode, dynamic=False)
            result = compiled(*kept.inputs)
            torch.cuda.synchronize()
            record["compile_s"] = time.perf_counter() - started
            record["compile_error_vs_f64"] = relative_error(_numpy(torch, result), kept.reference)
            del result
            record["compile_ms"] = median_ms(lambda: compiled(*kept.inputs), warmup=5, reps=20)
        if "ge2_ms" in record:
            record["vs_compile"] = record["compile_ms"] / record["ge2_ms"]
    except Exception as error:  # noqa: BLE001 - reported in the row
        record["compile_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    record["seconds"] = round(record.get("seconds", 0.0) + time.perf_counter() - started, 1)


def compile_order(rows: list[Row]) -> list[Row]:
    """The order rows get their torch.compile in: GE2_BENCH_COMPILE_FIRST's row ids first (as listed), then the
    float16 rows (those with a target against torch.compile), then the float32 ones, each in the table's order."""
    first = [row_id for row_id in os.environ.get("GE2_BENCH_COMPILE_FIRST", "").split(",") if row_id]
    ranked = [row for row_id in first for row in rows if row.id == row_id]
    return ranked + [row for dtype in ("float16", "float32") for row in rows
                     if row.dtype == dtype and row not in ranked]


def _precision_of_graph(executor, dtype) -> str:
    """The float32 math of GE2's convolutions and GEMMs, counted ("conv2d TF32 x52, conv2d FP32 x1, gemm FP32 x1")."""
    if dtype != "float32":
        return f"{dtype} (float32 accumulation)"
    flags = collections.Counter((n.op, "TF32" if n.attrs["allow_tf32"] else "FP32")
                                for n in executor.optimized_graph.nodes if n.op in ("conv2d", "gemm"))
    return ", ".join(f"{op} {math} x{count}" for (op, math), count in sorted(flags.items()))


SLOWEST_NODES = 15


def _profile_text(executor, feeds) -> str:
    """What GE2's time went to, for a row's cause: ``ex.profile()`` summed per (op, kernel), its slowest nodes, and
    ``explain()`` (passes, fusions, kernel choices and their timings)."""
    profile = executor.profile(feeds)
    slowest = sorted(profile.nodes, key=lambda row: -row.median_ms)[:SLOWEST_NODES]
    lines = [profile.op_table(), "", f"slowest {len(slowest)} nodes:"]
    lines += [f"  {row.node} ({row.op}, {row.kernel}{'*' if row.fallback else ''}): {row.median_ms:.4f} ms, "
              f"{row.share:.1%}" + ("" if row.roofline_fraction is None else f", {row.roofline_fraction:.1%} of "
                                    f"roofline") for row in slowest]
    lines.append(f"plan: {profile.node_by_node_ms:.4f} ms node by node, "
                 + ("not captured" if profile.cuda_graph_ms is None else
                    f"{profile.cuda_graph_ms:.4f} ms as a CUDA graph"))
    return "\n".join(lines + ["", executor.explain()])


def _write_profiles(name: str, records: list[dict]) -> None:
    """results/<name>.md (and GE2_BENCH_OUT's copy): every profiled row's figures, then its profile text."""
    sections = []
    for record in records:
        if "profile" in record:
            figures = ", ".join(f"{key} {record[key]:.3f}" for key in ("ge2_ms", "eager_ms", "compile_ms",
                                                                        "vs_eager", "vs_compile") if key in record)
            sections.append(f"## {record['id']}: {figures}\n\n```\n{record['profile']}\n```\n")
    if not sections:
        return
    text = "# GE2 profiles of bench_models' rows (ex.profile() and explain())\n\n" + "\n".join(sections)
    for directory in filter(None, (RESULTS, os.environ.get("GE2_BENCH_OUT"))):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"{name}.md").write_text(text)


def main():
    torch = torch_cuda()
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's defaults, stated (and what GE2's "default" precision is)
    torch.backends.cuda.matmul.allow_tf32 = False
    wanted = os.environ.get("GE2_BENCH_MODELS")
    rows = [row for row in ROWS if not wanted or row.id in wanted.split(",")]
    columns = [("model", "model"), ("dtype", "dtype"), ("input", "input"), ("status", "status"),
               ("ge2_ms", "GE2 ms"), ("eager_ms", "eager ms"), ("compile_ms", "torch.compile ms"),
               ("compile_mode", "torch.compile mode"), ("compile_s", "compile s (first call)"),
               ("vs_eager", "GE2 x eager"), ("vs_compile", "GE2 x compile"),
               ("ort_provider", "onnxruntime provider"), ("ort_ms", "onnxruntime ms"), ("ort", "onnxruntime note"),
               ("kernels", "GE2 kernels"), ("build_s", "GE2 build s (cold; models_build.md splits it)"),
               ("compile_error", "torch.compile note"),
               ("conv_kernels", "GE2 conv2d kernels"), ("fallbacks", "GE2 fallbacks"),
               ("ge2_error", "GE2 error"), ("torch_error", "torch error"), ("match", "match"),
               ("compile_error_vs_f64", "torch.compile error"),
               ("ge2_precision", "GE2 precision"), ("torch_precision", "torch precision"), ("exporter", "exporter")]
    title = ("Imported models: GE2 vs PyTorch eager, torch.compile and onnxruntime (targets: >= 1.0x "
             "torch.compile(mode='max-autotune') on float16 rows, >= 1.2x eager on every row)")
    split = [("export_s", "export s"), ("import_s", "import s"), ("passes_s", "passes s"), ("plan_s", "plan s"),
             ("kernel_compile_s", "of which kernel compile s"), ("tuning_s", "of which tuning s"),
             ("timed", "problems timed"), ("cache_hits", "autotune cache hits"),
             ("untimed", "by priority (tuning budget spent)"),
             ("choosing_s", "of which choosing without timing s (ranking, prepares)"),
             ("other_s", "upload + other s"),
             ("first_run_s", "first run s"), ("capture_s", "of which capture s")]
    build_columns = ([("model", "model"), ("dtype", "dtype"), ("input", "input"), ("kernels", "GE2 kernels")]
                     + [(key, f"cold: {header}") for key, header in split]
                     + [("tuning_by_op", "cold: timing per op (problems: seconds)")]
                     + [(f"warm_{key}", f"warm: {header}") for key, header in split[1:]]
                     + [("warm_note", "warm note")])
    build_title = ("GE2 plan build of imported models: cold (empty kernel and autotune caches, in the benchmark's "
                   "process) and warm (a new process with the caches the cold build filled)")
    # A subset writes tables of its own (models_<ids>.md), so runs of different subsets do not overwrite each other.
    name = "models" if len(rows) == len(ROWS) else "_".join(["models", *(row.id for row in rows)])
    records, kept, table = {}, {}, f"no row selected by GE2_BENCH_MODELS={wanted!r}"

    def write() -> str:  # after every step: a time limit keeps what was done
        done = [records[row.id] for row in rows if row.id in records]
        write_results(f"{name}_build", done, build_columns, build_title)
        _write_profiles(f"{name}_profile", done)
        return write_results(name, done, columns, title)

    # Every row's GE2 part first, then torch.compile row by row (minutes each in max-autotune) while the budget
    # lasts: a budget that runs short costs compile columns, never a row's GE2 figures.
    for row in rows:
        if budget_left() <= 0:
            records[row.id] = {"id": row.id, "model": row.model, "dtype": row.dtype, "input": row.shape,
                               "status": f"not run: time budget (GE2_BENCH_BUDGET_S={BUDGET_S:g}) spent"}
        else:
            try:
                records[row.id], kept[row.id] = run_row(torch, row)
            except Exception as error:  # noqa: BLE001 - one model's failure is its row; the others still run
                records[row.id] = {"id": row.id, "model": row.model, "dtype": row.dtype, "input": row.shape,
                                   "status": f"failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}",
                                   "traceback": traceback.format_exc(limit=8)[-1500:]}
            print({k: v for k, v in records[row.id].items() if k not in ("traceback", "profile")}, flush=True)
            torch.cuda.empty_cache()
        table = write()
    for row in compile_order([row for row in rows if kept.get(row.id) is not None]):
        compile_row(torch, row, records[row.id], kept[row.id])
        print(f"{row.id}: torch.compile " + ", ".join(f"{key} {records[row.id][key]}" for key in (
            "compile_mode", "compile_s", "compile_ms", "vs_compile", "compile_error") if key in records[row.id]),
              flush=True)
        table = write()
    print(table)
    if records:
        print((RESULTS / f"{name}_build.md").read_text())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Imported models: GE2 vs PyTorch eager, torch.compile and "
                                                 "onnxruntime (issue 22's table)")
    parser.add_argument("--warm-build", metavar="DIR",
                        help="internal: the warm plan build of the model a row exported into DIR, in a new process")
    arguments = parser.parse_args()
    if arguments.warm_build:
        _warm_build_main(arguments.warm_build)
    else:
        main()
