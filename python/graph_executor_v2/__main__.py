"""``python -m graph_executor_v2 <command>``:
``demo``: an MLP through ExecutorV2, end to end (below).
``train-digits``: the training job (``apps/digits.py``).
``train-gpt``: a small GPT trained on the Python standard library's source (``apps/gpt.py``).
``new-op NAME [--inputs a,b] [--out-of-tree DIR]``: a new op (see scaffold.py).
``run-onnx MODEL``: an ONNX model imported, planned, run and checked against onnxruntime.
``onnx-conformance``: ONNX's own node tests of the op types GE2 claims.
``zoo [--models ...] [--frontend onnx,torch] [--dtype ...] [--quick]``: real models against PyTorch (zoo/).

``demo`` builds the MLP the way a user writes it (matmul, add, activation), prints the graph before and after the passes
and the plan, runs it on the GPU when there is one (else on the CPU backend), checks the result against float64
NumPy and prints timings: compile, the fused plan and the unfused one.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from . import ExecutorV2, device, zoo
from ._help import HelpFormatter
from .testing import assert_close, mlp, random_array


def _median_ms(run, repetitions, synchronize):
    for _ in range(3):
        run()
    times = []
    for _ in range(repetitions):
        synchronize()
        start = time.perf_counter()
        run()
        synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def demo(arguments) -> int:
    on_gpu = device.device_count() > 0 and not arguments.cpu
    target = "cuda" if on_gpu else "cpu"
    dtype = arguments.dtype or ("float16" if on_gpu else "float32")
    sizes = tuple(int(s) for s in arguments.sizes.split(","))
    rng = np.random.default_rng(arguments.seed)
    graph, reference = mlp(rng, sizes, dtype, arguments.activation, batch=arguments.batch)
    where = f"GPU: {device.runtime().device_properties(0)['name']}" if on_gpu else "CPU backend (no GPU in use)"
    print(f"== the graph as written; running on the {where}")
    print(graph)

    start = time.perf_counter()
    executor = ExecutorV2(graph, device=target)
    compile_ms = (time.perf_counter() - start) * 1e3
    print("\n== after the passes")
    print(executor.optimized_graph)
    print("\n== the plan")
    print(executor.explain())

    x = random_array(rng, (arguments.batch, sizes[0]), dtype)
    result = executor.run({"x": x})["y"]
    print("\n== check against float64 NumPy")
    assert_close(result, reference(x), dtype, max(sizes), what="demo MLP")
    error = np.max(np.abs(result.astype(np.float64) - reference(x)))
    print(f"max abs error {error:.3e} ({dtype}, K up to {max(sizes)}): within tolerance")

    unfused = ExecutorV2(graph, device=target, passes=[])
    if on_gpu:
        runtime = device.runtime()
        feeds = {"x": runtime.DeviceArray.from_numpy(x)}
        out = {"y": runtime.DeviceArray.empty(list(result.shape), dtype)}
        synchronize = runtime.synchronize
        run_fused = lambda: executor.run(feeds, out=out)  # noqa: E731  device in, device out: no copies to host
        run_unfused = lambda: unfused.run(feeds, out=out)  # noqa: E731
    else:
        feeds = {"x": x}
        synchronize = lambda: None  # noqa: E731
        run_fused = lambda: executor.run(feeds)  # noqa: E731
        run_unfused = lambda: unfused.run(feeds)  # noqa: E731
    fused_ms = _median_ms(run_fused, arguments.repetitions, synchronize)
    unfused_ms = _median_ms(run_unfused, arguments.repetitions, synchronize)
    flops = 2.0 * arguments.batch * sum(a * b for a, b in zip(sizes, sizes[1:]))
    print("\n== timings (median of %d runs, %s)" % (arguments.repetitions, target))
    print(f"compile (passes + kernels + memory plan): {compile_ms:.1f} ms")
    print(f"fused plan   ({len(executor.optimized_graph.nodes)} kernels): {fused_ms:.3f} ms "
          f"({flops / fused_ms / 1e9:.2f} TFLOP/s)")
    print(f"unfused plan ({len(unfused.optimized_graph.nodes)} kernels): {unfused_ms:.3f} ms")
    if on_gpu:
        print(f"fusion: the fused plan runs in {fused_ms / unfused_ms:.2f}x the unfused plan's time (fewer launches, "
              "and the intermediates between a GEMM and its bias and activation never go through memory)")
    else:
        print("fusion pays on the GPU, not here: the CPU backend runs every node as its float64 NumPy reference, so a "
              "fused node does the same arithmetic in one call (its epilogue can even cost more) and saves no "
              "launches or memory traffic; it is the oracle the GPU kernels are checked against, not a fast path. "
              "On a GPU this demo times the native kernels (scripts/demo.sh demo there)")
    return 0


def run_onnx(arguments) -> int:
    """Imports an ONNX model, prints its plan, runs it and checks it against onnxruntime when installed."""
    from .frontend import onnx as onnx_frontend

    on_gpu = device.device_count() > 0 and not arguments.cpu
    try:
        model = onnx_frontend.read_model(arguments.model)
        shapes, notes = input_shapes(model, dict(arguments.dim or ()))
    except (OSError, ValueError) as error:
        print(f"run-onnx: {error}", file=sys.stderr)
        return 2
    for note in notes:
        print(note)
    graph = onnx_frontend.load(model, input_shapes=shapes)
    executor = ExecutorV2(graph, device="cuda" if on_gpu else "cpu")
    print(executor.explain())
    rng = np.random.default_rng(arguments.seed)
    given = dict(np.load(arguments.inputs)) if arguments.inputs else {}
    feeds = {}
    for value in graph.inputs:
        if value.name in given:
            feeds[value.name] = given[value.name]
        elif value.type.dtype in ("int32", "int64"):
            feeds[value.name] = rng.integers(0, 2, size=value.type.shape).astype(value.type.dtype)
        else:
            feeds[value.name] = random_array(rng, value.type.shape, value.type.dtype)
    outputs = executor.run(feeds)
    for name, array in outputs.items():
        print(f"output '{name}': {array.dtype}{list(array.shape)}, mean {np.mean(array.astype(np.float64)):.6g}")
    try:
        import onnxruntime
    except ImportError:
        print("onnxruntime is not installed: no comparison (pip install graph_executor_v2[onnx])")
        return 0
    session = onnxruntime.InferenceSession(arguments.model, providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    worst = 0.0
    for name, array in outputs.items():
        error, scale, nans = _difference(array, expected[name])
        nan_note = f"; {nans} element(s) NaN in one and not the other" if nans else ""
        print(f"output '{name}' vs onnxruntime: max abs difference {error:.3e} (max |value| {scale:.3e}){nan_note}")
        worst = max(worst, error / max(scale, 1e-30))  # inf when a NaN differs: never within tolerance
    tolerance = 1e-4 if all(a.dtype == np.float32 for a in outputs.values()) else 2e-2
    print("matches onnxruntime" if worst <= tolerance else "DIFFERS from onnxruntime")
    return 0 if worst <= tolerance else 1


def _difference(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, float, int]:
    """(max abs difference, max finite |value| of ``theirs``, elements NaN in exactly one of them). Equal values
    (infinities of one sign, NaN in both) differ by 0; a NaN in one only, or an infinity against a number, by inf."""
    ours, theirs = ours.astype(np.float64), theirs.astype(np.float64)
    nan_in_one = np.isnan(ours) != np.isnan(theirs)
    same = (ours == theirs) | (np.isnan(ours) & np.isnan(theirs))
    with np.errstate(invalid="ignore"):
        difference = np.abs(ours - theirs)
    difference = np.where(same, 0.0, np.where(np.isnan(difference), np.inf, difference))
    finite = np.abs(theirs[np.isfinite(theirs)])
    return float(np.max(difference, initial=0.0)), float(np.max(finite, initial=0.0)), int(nan_in_one.sum())


def input_shapes(model, sizes: dict[str, int]) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Concrete shapes of an ONNX model's inputs: symbolic dims from ``sizes`` (a dim's name, or
    ``INPUT:AXIS`` for a dim with no name), a symbolic first dim (a batch) 1 unless given; ValueError naming every
    other symbolic dim, or a size given for a dim the model does not have. Returns (input -> shape, notes)."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    shapes, notes, missing, known = {}, [], [], set()
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = []
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                shape.append(int(dim.dim_value))
                continue
            name = dim.dim_param or f"{value.name}:{axis}"
            known.add(name)
            if name in sizes:
                shape.append(sizes[name])
            elif axis == 0:
                shape.append(1)
                note = f"dim '{name}' (axis 0 of input '{value.name}') is symbolic: taken as a batch of 1 " \
                       f"(--dim {name}=SIZE sets it)"
                if note not in notes:
                    notes.append(note)
            else:
                missing.append(f"axis {axis} of input '{value.name}' is the symbolic dim '{name}'")
        shapes[value.name] = tuple(shape)
    unknown = sorted(set(sizes) - known)
    if unknown:
        raise ValueError(f"--dim: the model has no symbolic dim {', '.join(map(repr, unknown))}; its symbolic dims: "
                         f"{', '.join(sorted(known)) or 'none'}")
    if missing:
        raise ValueError("; ".join(missing) + ": give each a size with --dim NAME=SIZE")
    return shapes, notes


def _dim_size(text: str) -> tuple[str, int]:
    """--dim NAME=SIZE as (NAME, SIZE)."""
    name, equals, size = text.rpartition("=")
    if not equals or not name or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE with SIZE an int >= 1, got {text!r}")
    return name, int(size)


def onnx_conformance(arguments) -> int:
    """ONNX's own node tests of the op types GE2 claims: the pass rate and every failure with its reason."""
    if arguments.gpu and device.device_count() == 0:
        print("onnx-conformance: --gpu needs an NVIDIA GPU and this machine has none (leave --gpu out to run the "
              "CPU backend)", file=sys.stderr)
        return 2
    from .frontend.onnx_backend import conformance_report

    report = conformance_report("CUDA" if arguments.gpu else "CPU")
    print(report.format())
    return 0


def main(argv=None) -> int:
    arguments = build_parser().parse_args(argv)
    return arguments.handler(arguments)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per job, every flag with its help and default."""
    from .apps.gpt import CPU_DEFAULTS, GPU_DEFAULTS

    parser = argparse.ArgumentParser(prog="python -m graph_executor_v2", formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name, help, handler):
        sub = commands.add_parser(name, help=help, description=help, formatter_class=HelpFormatter)
        sub.set_defaults(handler=handler)
        return sub

    demo_parser = command("demo", "an MLP through ExecutorV2: passes, plan, check, timings", demo)
    demo_parser.add_argument("--cpu", action="store_true", help="use the CPU backend even when a GPU is present")
    demo_parser.add_argument("--batch", type=int, default=256, help="rows of the input")
    demo_parser.add_argument("--sizes", default="512,1024,1024,10", help="layer widths, input first")
    demo_parser.add_argument("--activation", choices=("relu", "gelu", "silu"), default="gelu",
                             help="the hidden layers' activation")
    demo_parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                             help="default: float16 on the GPU, float32 on the CPU")
    demo_parser.add_argument("--repetitions", type=int, default=50, help="timed runs of each plan (the median)")
    demo_parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the input")
    digits_parser = command("train-digits", "train an MLP or a CNN on scikit-learn's digits with ge2.train",
                            train_digits)
    digits_parser.add_argument("--cpu", action="store_true", help="use the CPU backend even when a GPU is present")
    digits_parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                               help="mlp, or cnn (conv-bn-relu blocks on the 1x8x8 images)")
    digits_parser.add_argument("--epochs", type=int, default=None, help="passes over the training set (default: "
                                                                         "30 for mlp, 15 for cnn)")
    digits_parser.add_argument("--batch-size", type=int, default=64, help="examples per step")
    digits_parser.add_argument("--hidden", type=int, default=128, help="mlp: hidden units")
    digits_parser.add_argument("--width", type=int, default=16, help="cnn: channels of the first blocks")
    digits_parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW, cosine)")
    digits_parser.add_argument("--seed", type=int, default=0, help="seed of the weights, the split and the order")
    digits_parser.add_argument("--plot", default="runs/digits_loss.png", help="loss-curve PNG ('' for none)")
    gpt_parser = command("train-gpt", "train a small GPT on the bytes of Python's standard library with ge2.train; "
                                      "reports the validation loss", train_gpt)
    gpt_parser.add_argument("--cpu", action="store_true", help="use the CPU backend (and its tiny default config) "
                                                               "even when a GPU is present")
    for flag, kind, what in (("--layers", int, "blocks"), ("--heads", int, "attention heads"),
                             ("--width", int, "model width"), ("--context", int, "context length in bytes"),
                             ("--batch-size", int, "windows per step"), ("--steps", int, "training steps"),
                             ("--lr", float, "peak learning rate"), ("--warmup-steps", int, "linear warm-up steps"),
                             ("--weight-decay", float, "AdamW's decoupled weight decay"),
                             ("--grad-clip", float, "global gradient-norm clip"),
                             ("--eval-every", int, "steps between validation losses"),
                             ("--eval-batches", int, "validation batches"),
                             ("--log-every", int, "steps between reads of the training loss"),
                             ("--seed", int, "seed of the weights and the windows")):
        field = flag[2:].replace("-", "_")
        on_gpu, on_cpu = getattr(GPU_DEFAULTS, field), getattr(CPU_DEFAULTS, field)
        default = f"{on_gpu:g}" if on_gpu == on_cpu else f"{on_gpu:g} on the GPU, {on_cpu:g} on the CPU"
        gpt_parser.add_argument(flag, type=kind, help=f"{what} (default: {default})")
    gpt_parser.add_argument("--amp", choices=("none", "bfloat16", "float16"),
                            help=f"mixed precision (default: {GPU_DEFAULTS.amp or 'none'} on the GPU, "
                                 f"{CPU_DEFAULTS.amp or 'none'} on the CPU)")
    gpt_parser.add_argument("--plot", default="runs/gpt_loss.png", help="loss-curve PNG ('' for none)")
    gpt_parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    new_op_parser = command("new-op", "write a new op (kernel, launcher, binding, OpDef, tests, benchmark) that "
                                      "builds and passes", new_op)
    new_op_parser.add_argument("name", help="the op's name, a lowercase identifier")
    new_op_parser.add_argument("--inputs", default="x", help="comma-separated input names")
    new_op_parser.add_argument("--root", default=".", help="the GE2 checkout to add the op to")
    new_op_parser.add_argument("--out-of-tree", metavar="DIR",
                               help="write the op into its own project DIR, built against the installed GE2 (default: "
                                    "into the GE2 checkout at --root)")
    new_op_parser.add_argument("--package", help="out of tree: the Python package (default: ge2_<name>)")
    onnx_parser = command("run-onnx", "import an ONNX model, print its plan, run it, compare with onnxruntime",
                          run_onnx)
    onnx_parser.add_argument("model", help="path of the .onnx file")
    onnx_parser.add_argument("--inputs", help=".npz file of input arrays by name (default: random inputs)")
    onnx_parser.add_argument("--dim", type=_dim_size, action="append", metavar="NAME=SIZE",
                             help="the size of a symbolic dim (INPUT:AXIS for one with no name); repeatable "
                                  "(default: 1 for a symbolic first dim, a batch; others must be given)")
    onnx_parser.add_argument("--cpu", action="store_true", help="use the CPU backend even when a GPU is present")
    onnx_parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    conformance_parser = command("onnx-conformance", "ONNX's node tests of the op types GE2 claims: pass rate and "
                                                     "failures", onnx_conformance)
    conformance_parser.add_argument("--gpu", action="store_true", help="run them on the GPU backend (needs a GPU)")
    zoo.add_parser(commands)
    commands.choices["zoo"].formatter_class = HelpFormatter  # its flags' help with their defaults too
    return parser


def train_digits(arguments) -> int:
    from .apps import digits

    return digits.main(arguments)


def train_gpt(arguments) -> int:
    from .apps import gpt

    return gpt.main(arguments)


def new_op(arguments) -> int:
    from .scaffold import new_op as write_op

    try:
        written = write_op(arguments.name, [name.strip() for name in arguments.inputs.split(",")],
                           root=arguments.root, out_of_tree=arguments.out_of_tree, package=arguments.package)
    except ValueError as error:
        print(f"new-op: {error}", file=sys.stderr)
        return 2
    print("\n".join(f"wrote {path}" for path in written))
    print(f"next: change the kernel in backends/cuda/ops/{arguments.name}/kernels/{arguments.name}.cu (and the "
          "reference in the op's Python module), build, test: docs/writing-an-op.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
