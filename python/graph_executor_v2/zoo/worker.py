"""One model of the zoo in its own process: ``python -m graph_executor_v2.zoo.worker MODEL --frontends ...
--dtypes ... --out FILE``. The worker prepares first: every (frontend, dtype) case is imported, planned, run and
checked, the two-sizes check runs and torch.compile compiles the model once per dtype (its first call); each result
is appended to FILE as one JSON line as soon as it is known, so a crash or the parent's time limit loses only the
step under way. Then it times, on the GPU: GE2, PyTorch eager and the compiled model, every case's record appended
again with its times (a later line of the same case replaces the earlier one). With ``--handshake`` it prints
``PREPARED`` after preparing and times only once its parent writes ``time`` to its stdin: the parent lets workers
prepare side by side and times them one at a time, with no other worker running.

A case: the model in float64 on the device (the reference), PyTorch in the dtype under test (its own error against
the reference), the model imported into GE2 (``frontend``: "onnx" = torch.onnx.export's default dynamo exporter,
"onnx-legacy" = its TorchScript exporter, "torch" = ``frontend.torch.from_torch``), planned and run on the device,
its error, and on the GPU the times: GE2, PyTorch eager, torch.compile. ``--device cpu`` runs both PyTorch and GE2's
CPU backend instead (a machine without a GPU checks imports and errors; no times).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from .._optional import require
from .models import MODELS

# GE2's error may be 4x PyTorch's own against float64, plus this floor (relative to the output's largest value).
ERROR_FACTOR = 4.0
ERROR_FLOOR = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}


def relative_error(result, reference: np.ndarray) -> float:
    """max |result - reference| / max |reference|; NaN anywhere (or a shape mismatch) is infinite."""
    result = np.asarray(result, np.float64)
    if result.shape != reference.shape:
        return float("inf")
    difference = np.abs(result - reference)
    if not np.all(np.isfinite(difference)):
        return float("inf")
    return float(difference.max(initial=0.0) / max(float(np.abs(reference).max(initial=0.0)), 1e-30))


# PyTorch's own error at or above this (or not finite) means the model overflows in the dtype: no comparison.
NO_COMPARISON_ERROR = 0.5


def no_comparison(torch_error: float, dtype: str) -> str | None:
    """Why a row compares nothing (PyTorch's own error against float64 not finite or about 1: the model overflows
    in ``dtype``), or None when it does compare."""
    if math.isfinite(torch_error) and torch_error < NO_COMPARISON_ERROR:
        return None
    return f"no comparison: PyTorch's own {dtype} error is {torch_error:.2e} (the model overflows in {dtype})"


def matches(ge2_error: float, torch_error: float, dtype: str) -> bool:
    """GE2 within 4x PyTorch's own error plus the floor; never where PyTorch's own error compares nothing."""
    return no_comparison(torch_error, dtype) is None and ge2_error <= ERROR_FACTOR * torch_error + ERROR_FLOOR[dtype]


def _median_cuda_ms(torch, function, warmup: int = 3, repetitions: int = 20) -> float:
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repetitions):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _as_numpy(torch, tensor) -> np.ndarray:
    if isinstance(tensor, torch.Tensor):
        return tensor.detach().to("cpu", torch.float64).numpy()
    return np.asarray(tensor, np.float64)


def _export_dynamo(torch, module, inputs, path: str, **options) -> str:
    """``torch.onnx.export(dynamo=True)``; what was exported, as the zoo's rows name it: "dynamo", or where torch
    fails to trace scaled_dot_product_attention's output strides (T5: its fake CUDA/CPU kernel returns a [b, s, h, d]
    layout and a later re-trace of the same graph a [b, h, s, d] one, so a reshape of its transpose becomes an
    invalid view), "dynamo, SDPA traced as math" after exporting again with PyTorch's math SDPA kernel selected.
    The exported ONNX graph holds the same attention either way; the kernel choice only affects the trace."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        torch.onnx.export(module, inputs, path, dynamo=True, **options)
        return "dynamo"
    except Exception as error:  # noqa: BLE001 - retried once below, and re-raised if that fails too
        if "Cannot view a tensor" not in "".join(_causes(error)):
            raise
    # The failed trace left its SDPA results in the fake-tensor cache, whose key does not hold the kernel choice.
    torch._subclasses.fake_tensor.FakeTensorMode.cache_clear()
    with sdpa_kernel([SDPBackend.MATH]):
        torch.onnx.export(module, inputs, path, dynamo=True, **options)
    return "dynamo, SDPA traced as math"


def _causes(error: BaseException) -> list[str]:
    """The text of ``error`` and of every exception it was raised from."""
    texts = []
    while error is not None:
        texts.append(str(error))
        error = error.__cause__ or error.__context__
    return texts


def _import(torch, frontend: str, module, inputs, directory: str, dynamic: bool = False):
    """(the GE2 graph of ``module`` on ``inputs``, the exporter that wrote it): ``module`` exported on ``inputs``
    (both on the device, in the dtype under test); with ``dynamic``, with the symbolic axes of ``dynamic_shapes``
    (torch.export, the dynamo exporter) / ``dynamic_axes`` (the legacy exporter)."""
    if frontend == "torch":
        from ..frontend.torch import from_torch

        options = {"dynamic_shapes": dynamic_shapes(torch, module, inputs)} if dynamic else {}
        return from_torch(module, inputs, **options), "torch.export"
    from ..frontend import onnx as onnx_frontend

    path = str(Path(directory) / "model.onnx")
    names = [f"input{index}" for index in range(len(inputs))]
    if frontend == "onnx":
        options = {"dynamic_shapes": dynamic_shapes(torch, module, inputs)} if dynamic else {}
        exporter = _export_dynamo(torch, module, inputs, path, input_names=names, output_names=["y"], **options)
    else:
        options = {"dynamic_axes": {**dynamic_axes(inputs, names), "y": {0: "batch"}}} if dynamic else {}
        torch.onnx.export(module, inputs, path, input_names=names, output_names=["y"], dynamo=False, opset_version=17,
                          **options)
        exporter = "legacy (TorchScript)"
    return onnx_frontend.load(path), exporter


def _feed(x, device: str):
    """A torch tensor as GE2 takes it on ``device``: the tensor itself on the GPU, a NumPy array on the CPU."""
    return x if device == "cuda" else x.numpy()


def _on_device(torch, master, inputs, dtype: str, device: str):
    """(module, inputs) on ``device`` in ``dtype`` (integer inputs, token ids and masks, stay as they are)."""
    torch_dtype = getattr(torch, dtype)
    module = copy.deepcopy(master).to(device, torch_dtype)
    return module, tuple(x.to(device, torch_dtype) if x.is_floating_point() else x.to(device) for x in inputs)


def run_case(torch, model_name: str, frontend: str, dtype: str, master, inputs, reference: np.ndarray,
             device: str = "cuda") -> tuple:
    """One (model, frontend, dtype) case on ``device`` ("cuda" or "cpu": both PyTorch and GE2 there): (what it found,
    as a record; on "cuda", where it ran, a function that times GE2 and PyTorch eager on it and returns the record
    with ``ge2_ms`` and ``eager_ms``, else None)."""
    from .. import ExecutorV2
    from ..frontend import UnsupportedModelError

    record = {"model": model_name, "frontend": frontend, "dtype": dtype, "imported": False, "problems": [],
              "error": None}
    started = time.perf_counter()
    module, device_inputs = _on_device(torch, master, inputs, dtype, device)
    timer = None
    try:
        with torch.no_grad():
            eager = module(*device_inputs)
            record["torch_error"] = relative_error(_as_numpy(torch, eager), reference)
            with tempfile.TemporaryDirectory() as directory:
                graph, record["exporter"] = _import(torch, frontend, module, device_inputs, directory)
            record["imported"] = True
            record["nodes"] = len(graph.nodes)
            executor = ExecutorV2(graph, device=device)
            feeds = {value.name: _feed(x, device) for value, x in zip(graph.inputs, device_inputs)}
            output_name = next(iter(graph.outputs))
            result = executor.run(feeds)[output_name]
            record["ge2_error"] = relative_error(_as_numpy(torch, result), reference)
            record["match"] = matches(record["ge2_error"], record["torch_error"], dtype)
            record["error"] = no_comparison(record["torch_error"], dtype)
            fallbacks = executor.fallbacks
            record["fallbacks"] = len(fallbacks)
            record["fallback_ops"] = sorted({selection.op for selection in fallbacks})
            if device == "cuda":
                def timer():
                    with torch.no_grad():
                        return _timed(record, lambda: {"ge2_ms": _median_cuda_ms(torch, lambda: executor.run(feeds)),
                                                       "eager_ms": _median_cuda_ms(torch,
                                                                                   lambda: module(*device_inputs))})
    except UnsupportedModelError as error:
        record["problems"] = [list(problem) for problem in error.problems]
    except Exception as error:  # noqa: BLE001 - any failure of one case is reported, the next case still runs
        record["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        record["traceback"] = traceback.format_exc(limit=6)[-2000:]
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record, timer


def _timed(record: dict, measure) -> dict:
    """``record`` with the times ``measure()`` returns, or with ``timing_error`` where it raised."""
    try:
        return {**record, **measure()}
    except Exception as error:  # noqa: BLE001 - the record keeps its check; the failure to time is reported
        return {**record, "timing_error": f"{type(error).__name__}: {error}".splitlines()[0][:300]}


# The two sizes one executor runs in the symbolic-shapes check: (batch, sequence); the sequence applies to token
# inputs ([batch, sequence] integers), every other input keeps its other axes. The second sequence still cuts into
# the padded quarter of the example attention mask, so padding is exercised at both sizes.
TWO_SIZES = ((2, 16), (3, 14))
SEQUENCE_MAX = 64  # the zoo's text configs hold 64 positions


def _is_token_input(x) -> bool:
    return x.dim() == 2 and not x.is_floating_point()


def dynamic_shapes(torch, module, inputs) -> dict:
    """torch.export's ``dynamic_shapes`` for ``module(*inputs)``: axis 0 of every input (the batch) and axis 1 of
    token inputs (the sequence) are ``Dim.DYNAMIC``: symbolic, with the relations between inputs left to torch to
    infer (a named Dim demands every guard be provable over its range, and torch cannot prove some of the models'
    own, e.g. Llama's min(32 s, 64 s) == 32 s). Keyed as torch.export matches it, by the names of ``forward``'s
    parameters; a ``*inputs`` parameter (the zoo's wrapper) takes a tuple with one spec per input."""
    import inspect

    batch = torch.export.Dim.DYNAMIC(min=2, max=64)
    sequence = torch.export.Dim.DYNAMIC(min=2, max=SEQUENCE_MAX)

    def spec(x):
        return {0: batch, 1: sequence} if _is_token_input(x) else {0: batch}

    arguments = inspect.signature(module.forward).bind(*inputs).arguments
    return {name: tuple(spec(x) for x in value) if isinstance(value, tuple) else spec(value)
            for name, value in arguments.items()}


def dynamic_axes(inputs, names: list[str]) -> dict:
    """The legacy ONNX exporter's ``dynamic_axes`` for the same axes as ``dynamic_shapes``."""
    return {name: {0: "batch", 1: "sequence"} if _is_token_input(x) else {0: "batch"}
            for name, x in zip(names, inputs)}


def sized_inputs(torch, inputs, batch: int, sequence: int) -> tuple:
    """``inputs`` at another batch (rows repeated from the first) and, for token inputs, another sequence length
    (cut, or the ids and mask repeated along the sequence)."""
    sized = []
    for x in inputs:
        x = torch.cat([x] * -(-batch // x.shape[0]))[:batch]
        if _is_token_input(x):
            x = torch.cat([x] * -(-sequence // x.shape[1]), dim=1)[:, :sequence]
        sized.append(x.contiguous())  # a feed is a contiguous array
    return tuple(sized)


def check_two_sizes(torch, model_name: str, frontend: str, master, inputs, device: str = "cuda") -> dict:
    """The symbolic-shapes check, float32: the model imported with a symbolic batch (and sequence, for token
    inputs), one executor run at each of ``TWO_SIZES``, each against PyTorch in float64 (GE2 within 4x PyTorch's own
    float32 error plus the floor). A failure at any step is the record's error, with the exception's text."""
    from .. import ExecutorV2
    from ..frontend import UnsupportedModelError

    record = {"model": model_name, "frontend": frontend, "dtype": "float32", "check": "two_sizes", "error": None,
              "sizes": [list(size) for size in TWO_SIZES]}
    started = time.perf_counter()
    module, device_inputs = _on_device(torch, master, inputs, "float32", device)
    step = "export"
    try:
        with torch.no_grad(), tempfile.TemporaryDirectory() as directory:
            graph, record["exporter"] = _import(torch, frontend, module, device_inputs, directory, dynamic=True)
            record["symbolic_inputs"] = [str(value.type) for value in graph.inputs]
            step = "plan"
            executor = ExecutorV2(graph, device=device)
            reference_module = copy.deepcopy(master).to(device, torch.float64)
            errors = []
            tokens = any(_is_token_input(x) for x in device_inputs)
            for batch, sequence in TWO_SIZES:
                step = f"batch {batch}" + (f", sequence {sequence}" if tokens else "")
                sized = sized_inputs(torch, device_inputs, batch, sequence)
                feeds = {value.name: _feed(x, device) for value, x in zip(graph.inputs, sized)}
                result = executor.run(feeds)[next(iter(graph.outputs))]
                wide = tuple(x.double() if x.is_floating_point() else x for x in sized)
                reference = _as_numpy(torch, reference_module(*wide))
                ge2_error = relative_error(_as_numpy(torch, result), reference)
                torch_error = relative_error(_as_numpy(torch, module(*sized)), reference)
                errors.append(ge2_error)
                if not matches(ge2_error, torch_error, "float32") and record["error"] is None:
                    record["error"] = f"{step}: " + (no_comparison(torch_error, "float32") or
                                                     f"GE2 error {ge2_error:.2e} vs PyTorch's {torch_error:.2e}")
            record["match"] = record["error"] is None
            record["errors"] = errors
    except UnsupportedModelError as error:
        record["error"] = f"{len(error.problems)} unsupported node(s), first: {error.problems[0][1]}: " \
                          f"{error.problems[0][2][:200]}"
        record["problems"] = [list(problem) for problem in error.problems]
    except Exception as error:  # noqa: BLE001 - reported with the step it failed at, the other cases are unaffected
        record["error"] = f"{step}: {type(error).__name__}: {error}".splitlines()[0][:400]
        record["traceback"] = traceback.format_exc(limit=8)[-2000:]
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record


# torch.compile's mode in the zoo: the default one (no CUDA graphs, no max-autotune), as users call it first.
COMPILE_MODE = "default"


def compile_model(torch, model_name: str, dtype: str, master, inputs) -> tuple:
    """torch.compile of the model in ``dtype``, compiled by its first call, once for the frontends' rows: (its record,
    a function that times it and returns the record with ``compile_ms``, or None where it failed to compile)."""
    record = {"model": model_name, "frontend": None, "dtype": dtype, "compile_mode": COMPILE_MODE}
    started = time.perf_counter()
    module, device_inputs = _on_device(torch, master, inputs, dtype, "cuda")
    timer = None
    try:
        compiled = torch.compile(module, mode=COMPILE_MODE)
        with torch.no_grad():
            compiled(*device_inputs)

        def timer():
            with torch.no_grad():
                return _timed(record, lambda: {"compile_ms": _median_cuda_ms(torch, lambda: compiled(*device_inputs))})
    except Exception as error:  # noqa: BLE001 - reported in the table, the other cases are unaffected
        record["compile_error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    record["compile_seconds"] = round(time.perf_counter() - started, 1)
    return record, timer


PREPARED = "PREPARED"  # the line a --handshake worker prints when it waits for its turn to time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graph_executor_v2.zoo.worker")
    parser.add_argument("model", choices=sorted(MODELS))
    parser.add_argument("--frontends", default="onnx,torch")
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--out", required=True, help="JSON lines file to append the records to")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--two-sizes", action="store_true",
                        help="also import with a symbolic batch (and sequence) and run two sizes on one executor")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="where PyTorch and GE2 run (cpu: no times, no torch.compile)")
    parser.add_argument("--handshake", action="store_true",
                        help=f"after preparing, print {PREPARED} and time only when stdin reads 'time' (anything "
                             "else: exit without timing)")
    arguments = parser.parse_args(argv)
    device = arguments.device
    out = Path(arguments.out)

    def emit(record):
        with out.open("a") as stream:
            stream.write(json.dumps(record) + "\n")

    torch = require("torch", "the zoo")
    if device == "cuda" and not torch.cuda.is_available():
        for dtype in arguments.dtypes.split(","):
            for frontend in arguments.frontends.split(","):
                emit({"model": arguments.model, "frontend": frontend, "dtype": dtype, "imported": False,
                      "problems": [], "error": "skipped: no CUDA GPU"})
        return 0
    # PyTorch and GE2 both at their default precision (TF32 convolutions, strict FP32 matmuls): PyTorch's own error
    # is measured as users get it, and GE2's precision="default" follows the same policy.
    master, inputs = MODELS[arguments.model].build(torch)
    with torch.no_grad():
        reference_module = copy.deepcopy(master).to(device, torch.float64)
        reference_inputs = tuple(x.to(device, torch.float64) if x.is_floating_point() else x.to(device)
                                 for x in inputs)
        reference = _as_numpy(torch, reference_module(*reference_inputs))
        del reference_module
    timers = []  # what to time once everything is prepared
    for dtype in arguments.dtypes.split(","):
        for frontend in arguments.frontends.split(","):
            record, timer = run_case(torch, arguments.model, frontend, dtype, master, inputs, reference, device)
            emit(record)
            timers += [timer] if timer else []
            torch.cuda.empty_cache()
    if arguments.two_sizes and "float32" in arguments.dtypes.split(","):
        for frontend in arguments.frontends.split(","):
            emit(check_two_sizes(torch, arguments.model, frontend, master, inputs, device))
            torch.cuda.empty_cache()
    if device == "cuda" and not arguments.no_compile:
        for dtype in arguments.dtypes.split(","):
            record, timer = compile_model(torch, arguments.model, dtype, master, inputs)
            emit(record)
            timers += [timer] if timer else []
    if timers and arguments.handshake:
        torch.cuda.empty_cache()  # what the models do not hold goes back while the worker waits for its turn
        print(PREPARED, flush=True)
        if sys.stdin.readline().strip() != "time":
            return 0
    for timer in timers:
        emit(timer())
    return 0


if __name__ == "__main__":
    sys.exit(main())
