"""Generated kernels (codegen/) and the pointwise fusion pass (passes/pointwise_fusion.py).

CPU part (runs anywhere NVRTC is installed; compiling needs no GPU): every op's scalar expression compiles in a
generated kernel for every dtype its inference accepts; fused graphs compute what the unfused ones do (the CPU
backend runs the members' references), random pointwise DAGs included; the pass's guards; the cubin cache (hit,
miss, corrupt file, two processes at once); NVRTC errors; gradients through fused training graphs against finite
differences. GPU part (``gpu``): the generated kernels against the float64 references, fused plans against unfused
ones, CUDA-graph capture, 100 groups in one plan, sizes from 1 element to 2^31+ (``large``), misaligned views.
"""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2.codegen import candidate as codegen_candidate
from graph_executor_v2.codegen import compiler, elements
from graph_executor_v2.codegen.pointwise import KernelSource, pointwise_source
from graph_executor_v2.codegen.reduction import ReductionGroup
from graph_executor_v2.codegen.row import ROW_LIMIT, RowGroup
from graph_executor_v2.ir.types import TensorType
from graph_executor_v2.ops import OPS, Problem
from graph_executor_v2.ops import fused as fused_ops
from graph_executor_v2.ops.fused import FUSED_OPS
from graph_executor_v2.passes import PassManager, resolve
from graph_executor_v2.passes.pointwise_fusion import MAX_INPUTS, fuse_pointwise, is_pointwise
from graph_executor_v2.testing import assert_close, random_array

DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "uint8", "bool")
FLOATS = ("float32", "float16", "bfloat16")
# Attributes of ops that have required ones (the others run with their defaults).
SAMPLE_ATTRS = {"clip": {"min": -0.5, "max": 0.5}, "cast": {"dtype": "float32"}}

needs_nvrtc = pytest.mark.skipif(compiler.availability() is not None, reason=str(compiler.availability()))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Every test compiles into a cache of its own (no test sees another's cubins)."""
    monkeypatch.setenv("GE2_CACHE_DIR", str(tmp_path / "cache"))


def _scalar_ops() -> list[str]:
    return sorted(n for n, o in OPS.items() if getattr(o, "scalar", None) is not None and n not in FUSED_OPS)


def _attrs_of(op: str) -> dict:
    try:
        return OPS[op].validate_attrs(SAMPLE_ATTRS.get(op, {}), op)
    except ValueError as error:
        raise AssertionError(f"op {op} needs an entry in SAMPLE_ATTRS: {error}") from None


def _single_problems(op: str, dtype: str):
    """Problems of ``op`` over (4, 5) and broadcast (5,) inputs, or all (4, 5), of ``dtype`` (a bool condition first,
    for where) that its inference accepts and its generated candidate takes; gradient ops over float dtypes only."""
    if ("_backward" in op or "_grad_" in op) and dtype not in FLOATS:
        return
    opdef = OPS[op]
    attrs = _attrs_of(op)
    count = len(opdef.inputs)
    generated = next(c for c in opdef.candidates if c.name == codegen_candidate.NAME)
    seen = set()
    for shapes in ([(4, 5)] + [(5,)] * (count - 1), [(4, 5)] * count):
        for dtypes in ([dtype] * count, ["bool"] + [dtype] * (count - 1)):
            in_types = tuple(TensorType(s, d) for s, d in zip(shapes, dtypes))
            try:
                out_types = tuple(opdef.infer(list(in_types), attrs))
            except (ValueError, TypeError):
                continue
            problem = Problem(op, in_types, out_types, attrs)
            if in_types not in seen and generated.supports(problem) is None:
                seen.add(in_types)
                yield problem


def _generated_source(problem: Problem, name: str):
    from graph_executor_v2.ops import fused

    generate = {"fused_pointwise": fused._generate_pointwise, "fused_reduction": fused._generate_reduction,
                "fused_row": fused._generate_row}
    return generate.get(problem.op, fused._generate_single)(problem, name)


def _one_translation_unit(kernels) -> str:
    """Several generated kernels in one source (one preamble): one NVRTC run compiles them all."""
    bodies = [k.source.replace(elements.PREAMBLE, "") for k in kernels]
    return elements.PREAMBLE + "\n".join(bodies)


# ---------------------------------------------------------------------------------------------------------------
# Source generation and compilation (CPU)
# ---------------------------------------------------------------------------------------------------------------
@needs_nvrtc
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "float32"])  # float32 loads and stores as they are
def test_every_scalar_op_compiles_in_a_generated_kernel(dtype):
    kernels, covered = [], []
    for op in _scalar_ops():
        for problem in _single_problems(op, dtype):
            kernels.append(codegen_candidate.build("pointwise", (), lambda n, p=problem: _generated_source(p, n)))
            covered.append(op)
    if dtype in FLOATS:  # every op takes floating inputs, except the logical ones and where's condition
        assert len(set(covered)) >= len(_scalar_ops()) - 5, sorted(set(_scalar_ops()) - set(covered))
    if not kernels:
        pytest.skip(f"no scalar op takes {dtype} inputs")
    cubin = compiler.compile_cubin(_one_translation_unit(kernels), "every_op_" + dtype, 90, f"every op, {dtype}")
    assert len(cubin) > 1000


def _pointwise_kernel(in_types, members, outputs, out_types):
    from graph_executor_v2.codegen.group import members_of

    return pointwise_source("k", members_of(members), outputs, in_types, out_types)


def _member(op, *args, node=None, **attrs):
    return {"op": op, "node": node or op, "attrs": OPS[op].validate_attrs(attrs, op), "args": tuple(args)}


def test_source_vectorizes_aligned_operands_and_indexes_broadcasts_by_folded_strides():
    x, bias = TensorType((8, 16, 40), "float16"), TensorType((16, 1), "float16")
    members = (_member("add", ("input", 0), ("input", 1)), _member("relu", ("member", 0)))
    kernel = _pointwise_kernel((x, bias), members, (1,), (x,))
    source = kernel.source
    assert "8 per vector step, 32-bit indices" in source  # 16-byte packs of float16
    assert "typedef unsigned int index_t" in source
    assert "reinterpret_cast<const ge2_pack*>(in0)" in source  # the full-shape input as packs
    assert "ge2_pack* __restrict__" not in source
    assert "in1[((i / 40u) % 16u)]" in source  # the broadcast bias: row index of the collapsed [8, 16, 40]
    # a vector step (8 elements) stays in one row of 40: the bias is read once a step in the vector loop
    assert "const float b1 = ge2_from_half(in1[(((v * 8u) / 40u) % 16u)]);" in source
    assert "const float x1 = b1;" in source
    assert "reinterpret_cast<unsigned long long>(in0) | reinterpret_cast<unsigned long long>(out0)" in source
    assert "u < 4; ++u" in source  # four vector steps a thread, their loads issued first
    assert kernel.grid == (8 * 16 * 40 // 8 // 4 + 255) // 256 and kernel.block == 256


def _broadcast_problem(dtype: str, cols: int) -> Problem:
    """(x + bias) * row_scale - wide over [3, 5, cols]: a bias along the rows (cols,), a scale per row (3, 5, 1) and a
    float32 operand over the last two dims (5, cols)."""
    in_types = (TensorType((3, 5, cols), dtype), TensorType((cols,), dtype), TensorType((3, 5, 1), dtype),
                TensorType((5, cols), "float32"))
    members = (_member("add", ("input", 0), ("input", 1)), _member("mul", ("member", 0), ("input", 2)),
               _member("sub", ("member", 1), ("input", 3)))
    attrs = {"members": members, "outputs": (2,)}
    return Problem("fused_pointwise", in_types, tuple(OPS["fused_pointwise"].infer(list(in_types), attrs)), attrs)


def test_broadcast_operands_load_once_a_vector_step_when_it_stays_in_one_row():
    kernel = _generated_source(_broadcast_problem("float16", 64), "k")
    source = kernel.source
    assert "8 per vector step" in source  # 16-byte packs of the float16 x
    # the bias and the float32 operand as packs (the float32 one as two: 8 floats), the row scale once a step
    assert "reinterpret_cast<const ge2_pack*>(in1)[(((v * 8u) % 64u)) / 8u + 0]" in source
    assert ("reinterpret_cast<const ge2_pack*>(in3)[((((v * 8u) / 64u) % 5u) * 64u + ((v * 8u) % 64u)) / 4u + 1]"
            in source)
    assert "const float b2 = ge2_from_half(in2[((v * 8u) / 320u) * 5u + (((v * 8u) / 64u) % 5u)]);" in source
    assert "| reinterpret_cast<unsigned long long>(in1) |" in source  # the packed bias is checked for alignment
    assert "in2) |" not in source
    # rows of 60 are not a multiple of 8: every element reads its own operands
    ragged = _generated_source(_broadcast_problem("float16", 60), "k").source
    assert "in1[(i % 60u)]" in ragged and "ge2_pack*>(in1)" not in ragged and " b2 = " not in ragged


def test_source_uses_64_bit_indices_only_past_2_to_the_31_elements():
    small, large = TensorType((2 ** 31 - 1,), "uint8"), TensorType((2 ** 31 + 16,), "uint8")
    members = (_member("add", ("input", 0), ("input", 0)),)
    assert "typedef unsigned int index_t" in _pointwise_kernel((small,), members, (0,), (small,)).source
    wide = _pointwise_kernel((large,), members, (0,), (large,)).source
    assert "typedef unsigned long long index_t" in wide and f"{2 ** 31 + 16}ull" in wide


def test_constants_are_folded_as_exact_literals():
    x = TensorType((3,), "float32")
    members = (_member("mul", ("input", 0), ("constant", 0.1, "float32", ())),)
    source = _pointwise_kernel((x,), members, (0,), (x,)).source
    assert repr(float(np.float32(0.1))) in source or "0.1f" in source


def test_empty_tensors_launch_nothing():
    x = TensorType((0, 5), "float32")
    kernel = _pointwise_kernel((x,), (_member("relu", ("input", 0)),), (0,), (x,))
    assert kernel.grid == 0


def _ptxas_report(source: str, name: str) -> dict[str, int]:
    """ptxas's report on kernel ``name`` of ``source`` compiled for sm_90: {"stack frame", "spill stores",
    "spill loads", "registers"} in bytes (registers: count). Fails naming the log when the report is missing."""
    _, log = compiler._native_module().compile(source, name + ".cu", 90, ["--ptxas-options=-v"])
    entry = re.search(rf"Function properties for {re.escape(name)}\n(.*?)Used (\d+) registers", log, re.S)
    assert entry, f"no ptxas report for {name} in NVRTC's log:\n{log!r}"
    numbers = {key: int(re.search(rf"(\d+) bytes {key}", entry.group(1)).group(1))
               for key in ("stack frame", "spill stores", "spill loads")}
    return {**numbers, "registers": int(entry.group(2))}


@needs_nvrtc
def test_ptxas_report_sees_a_stack_frame_and_spills():
    """The spill check below can fail: a dynamically indexed local array lives on the stack, and a launch bound of
    32 registers over 64 live values spills."""
    source = elements.PREAMBLE + textwrap.dedent("""
        extern "C" __global__ void ge2_stack(float* y, int i) { float a[64];
          for (int k = 0; k < 64; ++k) a[k] = y[k * blockDim.x + threadIdx.x];
          a[i & 63] += 1.0f;
          float s = 0.0f;
          for (int k = 0; k < 64; ++k) s += a[(k * i) & 63];
          y[threadIdx.x] = s; }
        extern "C" __global__ void __launch_bounds__(1024, 2) ge2_spill(float* y) { float a[64];
          #pragma unroll
          for (int k = 0; k < 64; ++k) a[k] = y[k * 1024 + threadIdx.x];
          float s = 0.0f;
          #pragma unroll
          for (int k = 0; k < 64; ++k) s += a[k] * a[63 - k] * a[(k * 7) & 63];
          y[threadIdx.x] = s; }
        """)
    assert _ptxas_report(source, "ge2_stack")["stack frame"] >= 64 * 4
    spilling = _ptxas_report(source, "ge2_spill")
    assert spilling["registers"] <= 32 and spilling["spill stores"] > 0 and spilling["spill loads"] > 0, spilling


@needs_nvrtc
@pytest.mark.parametrize("dtypes", [("float16", "float16"), ("int64", "bool"), ("float32", "uint8")])
def test_generated_kernels_do_not_spill(dtypes):
    """The widest vector steps (16 elements when a 1-byte operand sits next to 8-byte ones) and a block-per-row
    variance stay in registers (ptxas's report, compiled here for sm_90). Each kernel is compiled twice: with a
    driver, NVRTC 12.9+ would take the second from the driver's compute cache and skip ptxas (an empty log, as on
    the H200) unless the native compile turns that cache off."""
    a, b = (TensorType((1024, 2048), d) for d in dtypes)
    members = (_member("add", ("input", 0), ("input", 1)), _member("mul", ("member", 0), ("input", 0)))
    attrs = {"members": members, "outputs": (1,)}
    problems = [Problem("fused_pointwise", (a, b), tuple(OPS["fused_pointwise"].infer([a, b], attrs)), attrs)]
    if a.dtype in FLOATS:
        moments = {"members": (), "reduce": "var", "axes": 1, "keepdims": False, "epilogue": (), "outputs": ()}
        problems.append(Problem("fused_reduction", (a,), tuple(OPS["fused_reduction"].infer([a], moments)),
                                moments))
    for problem in problems:
        kernel = codegen_candidate.build("spill", (), lambda n, p=problem: _generated_source(p, n))
        for _ in range(2):
            report = _ptxas_report(kernel.source, kernel.name)
            assert report["stack frame"] == report["spill stores"] == report["spill loads"] == 0, report


# ---------------------------------------------------------------------------------------------------------------
# The compile cache (CPU: compiling needs no GPU)
# ---------------------------------------------------------------------------------------------------------------
SOURCE = elements.PREAMBLE + 'extern "C" __global__ void ge2_cache_test(float* y) { y[threadIdx.x] = erff(1.0f); }\n'


@needs_nvrtc
def test_cache_miss_then_hit_then_corrupt_file_recompiled_with_a_warning():
    compiler.STATS.clear()
    cubin = compiler.compile_cubin(SOURCE, "ge2_cache_test", 90, "cache test")
    assert not compiler.STATS.records[-1].cache_hit
    files = list(compiler.cache_directory().glob("*.cubin"))
    assert len(files) == 1
    assert compiler.compile_cubin(SOURCE, "ge2_cache_test", 90, "cache test") == cubin
    assert compiler.STATS.records[-1].cache_hit
    assert compiler.compile_cubin(SOURCE, "ge2_cache_test", 80, "cache test") != cubin  # the arch is in the key
    content = files[0].read_bytes()
    files[0].write_bytes(content[:-10] + b"0123456789")  # a flipped tail: the digest no longer matches
    with pytest.warns(UserWarning, match="corrupt kernel cache file"):
        assert compiler.compile_cubin(SOURCE, "ge2_cache_test", 90, "cache test") == cubin
    assert not compiler.STATS.records[-1].cache_hit
    assert files[0].read_bytes() == content  # rewritten
    files[0].write_bytes(b"")
    with pytest.warns(UserWarning, match="corrupt"):
        compiler.compile_cubin(SOURCE, "ge2_cache_test", 90, "cache test")


@needs_nvrtc
def test_two_processes_compiling_the_same_kernel_at_once(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from graph_executor_v2.codegen import compiler
        source = {SOURCE!r}
        for _ in range(3):
            cubin = compiler.compile_cubin(source, "ge2_cache_test", 90, "two processes")
        sys.stdout.write(str(len(cubin)))
    """)
    environment = {**os.environ, "GE2_CACHE_DIR": str(tmp_path / "shared"),
                   "PYTHONPATH": str(Path(ge2.__file__).parents[1])}
    processes = [subprocess.Popen([sys.executable, "-c", script], env=environment, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in processes]
    assert all(p.returncode == 0 for p in processes), results
    assert results[0][0] == results[1][0]
    files = list((tmp_path / "shared" / "kernels").iterdir())
    assert len(files) == 1 and files[0].suffix == ".cubin"  # no temporary file left behind
    monkey_cache = compiler._read_cached(files[0])
    assert monkey_cache is not None and str(len(monkey_cache)) == results[0][0]


@needs_nvrtc
def test_dump_kernels_writes_every_generated_source(tmp_path, monkeypatch):
    monkeypatch.setenv("GE2_DUMP_KERNELS", str(tmp_path / "dump"))
    compiler.compile_cubin(SOURCE, "ge2_cache_test", 90, "dump test")
    assert (tmp_path / "dump" / "ge2_cache_test.cu").read_text() == SOURCE


@needs_nvrtc
def test_nvrtc_error_names_the_group_with_the_log_and_the_failing_line():
    broken = elements.PREAMBLE + 'extern "C" __global__ void ge2_broken(float* y) {\n  y[0] = no_such_function(1.0f);\n}\n'
    with pytest.raises(RuntimeError) as raised:
        compiler.compile_cubin(broken, "ge2_broken", 90, "fused_pointwise group [relu (relu_7)]")
    message = str(raised.value)
    assert "fused_pointwise group [relu (relu_7)]" in message
    assert "no_such_function" in message and "is undefined" in message  # NVRTC's log
    assert "y[0] = no_such_function(1.0f);" in message.split("failing source line(s):")[1]  # the line itself
    # which NVRTC compiled it: the version and the library file loaded (the toolkit's or the PyPI wheel's)
    assert re.search(r"NVRTC \d+\.\d+ \(/\S*libnvrtc\S*\) could not compile ge2_broken\.cu", message), message


@needs_nvrtc
def test_a_broken_scalar_rule_fails_the_plan_build_with_the_node_name():
    opdef = OPS["relu"]
    original = opdef.scalar
    object.__setattr__(opdef, "scalar", lambda args, attrs, ctype: f"undefined_relu({args[0]})")
    try:
        problem = next(_single_problems("relu", "float32"))
        generated = next(c for c in opdef.candidates if c.name == codegen_candidate.NAME)
        with pytest.raises(RuntimeError, match=r"(?s)pointwise group \[relu \(relu\)\].*undefined_relu"):
            generated.prepare(problem)
    finally:
        object.__setattr__(opdef, "scalar", original)


def test_without_nvrtc_the_generated_candidate_is_not_available_and_nothing_fuses(monkeypatch):
    def missing():
        raise ImportError("libnvrtc.so.13: cannot open shared object file")

    monkeypatch.setattr(compiler, "_native_module", missing)
    x = TensorType((4, 5), "float32")
    problem = Problem("relu", (x,), (x,), {})
    generated = next(c for c in OPS["relu"].candidates if c.name == codegen_candidate.NAME)
    assert generated.supports(problem).startswith("NOT AVAILABLE: NVRTC is not available: libnvrtc.so.13")
    # the hand-written kernels are untouched (still ranked first), and nothing is fused
    assert OPS["relu"].candidates[0].name == "vec16"
    graph, records = PassManager(resolve(["fuse_pointwise"])).run(_chain_graph())
    assert "fused_pointwise" not in graph.op_counts() and not records[0].changed

def test_without_the_toolkit_nvrtc_the_pypi_wheel_library_is_loaded_first(tmp_path, monkeypatch):
    """Where only the driver is installed, ``_codegen`` fails to import on libnvrtc; the PyPI wheel's library
    (nvidia/cuda_nvrtc/lib or CUDA 13's nvidia/cu13/lib) is then loaded globally and the import retried."""
    import ctypes.util

    loadable = ctypes.util.find_library("m")  # any loadable shared library stands in for the wheel's libnvrtc
    assert loadable, "the C math library must be findable"
    loadable = next(Path(p) for p in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64")
                    if (Path(p) / loadable).exists()) / loadable
    wheel_lib = tmp_path / "nvidia" / "cuda_nvrtc" / "lib"
    wheel_lib.mkdir(parents=True)
    (wheel_lib / "libnvrtc-builtins.so.13.0").symlink_to(loadable)  # loadable, but never loaded: it is not NVRTC
    # tmp_path alone: an installed nvidia.cu13 or nvidia.cuda_nvrtc wheel (torch's, on a GPU machine) must not answer
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    importlib.invalidate_caches()
    for name in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, name)
    assert compiler._preload_wheel_nvrtc() is False  # the wheel's directory holds only the builtins library

    (wheel_lib / "libnvrtc.so.13").symlink_to(loadable)
    attempts = []

    def load(name):
        attempts.append(name)
        if len(attempts) == 1:
            raise ImportError("libnvrtc.so.13: cannot open shared object file: No such file or directory")
        return "the module"

    monkeypatch.setattr(compiler._native, "load", load)
    assert compiler._native_module() == "the module" and attempts == ["_codegen", "_codegen"]

    # an import error that is not about NVRTC is not hidden behind a retry
    attempts.clear()

    def broken(name):
        attempts.append(name)
        raise ImportError("undefined symbol: _ZN3ge24fooEv")

    monkeypatch.setattr(compiler._native, "load", broken)
    with pytest.raises(ImportError, match="undefined symbol"):
        compiler._native_module()
    assert attempts == ["_codegen"]



# ---------------------------------------------------------------------------------------------------------------
# The fusion pass (CPU)
# ---------------------------------------------------------------------------------------------------------------
def _chain_graph(dtype="float16", shape=(64, 256)):
    g = ge2.ir.Graph("chain")
    x, r = g.input("x", shape, dtype), g.input("r", shape, dtype)
    b = g.input("b", shape[-1:], dtype)
    y = g.add(g.mul(x, g.tanh(x)), r)
    g.output(y, "y")
    g.output(g.relu(g.bias_add(y, b)), "z")
    return g


def _feeds(rng, graph):
    return {v.name: random_array(rng, v.type.shape, v.type.dtype) for v in graph.inputs}


@needs_nvrtc  # the pass fuses only where the kernels can be generated
def test_a_chain_with_two_outputs_is_one_node_storing_each_output_once(rng):
    g = _chain_graph()
    ex = ge2.ExecutorV2(g, "cpu")
    fused = [n for n in ex.optimized_graph.nodes]
    assert [n.op for n in fused] == ["fused_pointwise"]
    assert len(fused[0].outputs) == 2  # y (read by the graph and the next ops) and z
    members = [m["node"] for m in fused[0].attrs["members"]]
    assert members == ["tanh_0", "mul_0", "add_0", "bias_add_0", "relu_0"]
    explained = ex.explain()
    assert "fusions: 1" in explained
    assert "members: tanh (tanh_0), mul (mul_0), add (add_0), bias_add (bias_add_0), relu (relu_0)" in explained
    feeds = _feeds(rng, g)
    fused_out, unfused_out = ex.run(feeds), ge2.ExecutorV2(g, "cpu", passes=[]).run(feeds)
    for name in ("y", "z"):
        np.testing.assert_array_equal(fused_out[name], unfused_out[name])


@needs_nvrtc
def test_gemm_epilogues_fuse_first_and_the_pointwise_pass_takes_the_rest(rng):
    g = ge2.ir.Graph("mlp")
    x = g.input("x", (8, 16), "float32")
    w = g.param("w", random_array(rng, (16, 32), "float32"))
    h = g.relu(g.matmul(x, w))  # the relu goes into the gemm epilogue
    y = g.mul(g.tanh(h), g.sigmoid(h))
    g.output(y, "y")
    ex = ge2.ExecutorV2(g, "cpu")
    ops = [n.op for n in ex.optimized_graph.nodes]
    assert ops == ["gemm", "fused_pointwise"] and ex.optimized_graph.nodes[0].attrs["act"] == "relu"
    feeds = _feeds(rng, g)
    np.testing.assert_array_equal(ex.run(feeds)["y"], ge2.ExecutorV2(g, "cpu", passes=[]).run(feeds)["y"])


@needs_nvrtc
def test_no_cycle_through_a_node_outside_the_group():
    # a = relu(x); m = gemm(a, w); c = add(a, m): a and c may not share a node (m sits between them)
    g = ge2.ir.Graph("cycle")
    x = g.input("x", (8, 8), "float32")
    w = g.input("w", (8, 8), "float32")
    a = g.relu(x)
    g.output(g.add(g.exp(a), g.matmul(a, w)), "y")
    graph, _ = PassManager(resolve(["fuse_pointwise"])).run(g)
    ge2.ir.verify(graph)
    ops = [n.op for n in graph.nodes]
    assert ops.count("fused_pointwise") == 1 and "add" in ops  # relu+exp fused; add after the matmul alone


def test_different_placements_and_shapes_do_not_fuse():
    g = ge2.ir.Graph("placed")
    x = g.input("x", (4, 8), "float32")
    y = g.relu(x)
    z = g.add_node("exp", [y], device="cuda:1").outputs[0]
    v = g.input("v", (8,), "float32")
    s = g.neg(v)  # a smaller shape: its own group (here of one node, so not fused)
    g.output(g.add(z, s), "y")
    graph, _ = PassManager(resolve(["fuse_pointwise"])).run(g)
    assert [n.op for n in graph.nodes] == ["relu", "exp", "neg", "add"]


@needs_nvrtc
def test_groups_are_bounded_in_inputs():
    g = ge2.ir.Graph("wide")
    inputs = [g.input(f"x{i}", (4, 8), "float32") for i in range(MAX_INPUTS + 4)]
    total = inputs[0]
    for value in inputs[1:]:
        total = g.add(total, value)
    g.output(total, "y")
    graph, _ = PassManager(resolve(["fuse_pointwise"])).run(g)
    assert all(len(n.inputs) <= MAX_INPUTS for n in graph.nodes)
    assert sum(n.op == "fused_pointwise" for n in graph.nodes) >= 2


@needs_nvrtc
def test_single_element_parameters_are_folded_except_for_training():
    g = ge2.ir.Graph("scaled")
    x = g.input("x", (4, 8), "float32")
    half = g.param("half", np.array(0.5, np.float32))
    g.output(g.relu(g.mul(x, half)), "y")
    inference, _ = PassManager(resolve(["fuse_pointwise"])).run(g)
    training, _ = PassManager(resolve(["fuse_pointwise_training"])).run(g)
    (node,) = inference.nodes
    assert [v.name for v in node.inputs] == ["x"]
    assert node.attrs["members"][0]["args"][1] == ("constant", 0.5, "float32", ())
    assert [v.name for v in training.nodes[0].inputs] == ["x", "half"]


def test_no_fusion_environment_switch(monkeypatch):
    monkeypatch.setenv("GE2_NO_FUSION", "1")
    graph, records = PassManager(resolve(["fuse_pointwise"])).run(_chain_graph())
    assert "fused_pointwise" not in graph.op_counts() and not records[0].changed


@needs_nvrtc
@pytest.mark.parametrize("axis, keepdims, fused", [(2, False, True), (-1, True, True), ((1, 2), False, True),
                                                   (None, False, True), (1, False, False)])
def test_reductions_fuse_their_prologue_and_epilogue_over_trailing_axes(rng, axis, keepdims, fused):
    g = ge2.ir.Graph("mse")
    x, y = g.input("x", (6, 5, 7), "float32"), g.input("y", (6, 5, 7), "float32")
    d = g.sub(x, y)
    m = g.mean(g.mul(d, d), axis=axis, keepdims=keepdims)
    g.output(g.exp(g.neg(m)), "loss")
    ex = ge2.ExecutorV2(g, "cpu")
    ops = [n.op for n in ex.optimized_graph.nodes]
    assert (ops == ["fused_reduction"]) == fused, ops
    if fused:
        node = ex.optimized_graph.nodes[0]
        assert [m["node"] for m in node.attrs["epilogue"]] == ["neg_0", "exp_0"]
        assert "-> mean over" in ex.explain()
    feeds = _feeds(rng, g)
    np.testing.assert_array_equal(ex.run(feeds)["loss"], ge2.ExecutorV2(g, "cpu", passes=[]).run(feeds)["loss"])


def _normalization_graph(shape, dtype, std: bool):
    """A normalization written out (as exporters write LayerNorm): mean, deviation, variance, then the deviation
    divided by sqrt(variance + eps); or, with ``std``, the row means and standard deviations."""
    g = ge2.ir.Graph("moments")
    x = g.input("x", shape, dtype)
    m = g.mean(x, axis=-1, keepdims=True)
    d = g.sub(x, m)
    v = g.mean(g.mul(d, d), axis=-1, keepdims=not std)
    if std:
        g.output(g.sqrt(v), "s")
        g.output(m, "m")
    else:
        g.output(g.div(d, g.sqrt(g.add(v, g.param("eps", np.array(1e-5, dtype))))), "y")
    return g


@needs_nvrtc
@pytest.mark.parametrize("std", [False, True])
def test_mean_and_variance_become_one_two_output_reduction(rng, std):
    g = _normalization_graph((6, 50), "float32", std)
    ex = ge2.ExecutorV2(g, "cpu")
    counts = ex.optimized_graph.op_counts()
    reductions = [n for n in ex.optimized_graph.nodes if n.op == "fused_reduction"]
    assert len(reductions) == 1 and len(reductions[0].outputs) == 2 and "mean" not in counts
    assert reductions[0].attrs["reduce"] == ("std" if std else "var")
    assert counts == ({"fused_reduction": 1} if std else {"fused_reduction": 1, "fused_pointwise": 2})
    feeds = _feeds(rng, g)
    fused, unfused = ex.run(feeds), ge2.ExecutorV2(g, "cpu", passes=[]).run(feeds)
    for name in unfused:
        np.testing.assert_array_equal(fused[name], unfused[name], err_msg=name)


@needs_nvrtc
def test_a_prologue_value_read_elsewhere_is_not_recomputed():
    g = ge2.ir.Graph("shared")
    x = g.input("x", (6, 7), "float32")
    sq = g.mul(x, x)
    g.output(g.sum(sq, axis=1), "s")
    g.output(g.relu(sq), "r")  # sq is read twice: the pointwise group stores it, the sum reads it
    graph, _ = PassManager(resolve(["fuse_pointwise"])).run(g)
    assert sorted(n.op for n in graph.nodes) == ["fused_pointwise", "sum"]


UNARY = ("relu", "gelu", "gelu_erf", "silu", "sigmoid", "tanh", "neg", "exp")
BINARY = ("add", "sub", "mul", "div")


def _random_dag(rng, ops: int, dtype: str = "float32"):
    """A random pointwise DAG of ``ops`` nodes over three inputs (one broadcast), a few values read twice, some
    intermediate values graph outputs."""
    g = ge2.ir.Graph("random")
    values = [g.input("a", (5, 12), dtype), g.input("b", (5, 12), dtype), g.input("c", (12,), dtype)]
    for index in range(ops):
        if rng.random() < 0.5:
            op = UNARY[rng.integers(len(UNARY))]
            source = values[rng.integers(len(values))]
            if op == "exp":  # keep exp's argument bounded
                source = g.tanh(source)
            values.append(getattr(g, op)(source))
        else:
            op = BINARY[rng.integers(len(BINARY))]
            left, right = (values[rng.integers(len(values))] for _ in range(2))
            if op == "div":
                right = g.add(g.sigmoid(right), g.sigmoid(right))  # in (0, 2): no division by ~0
            values.append(getattr(g, op)(left, right))
        if rng.random() < 0.15:
            g.output(values[-1], f"out{index}")
    g.output(values[-1], "last")
    return g


@needs_nvrtc
@pytest.mark.parametrize("seed", range(12))
def test_random_pointwise_dags_fuse_and_match_the_unfused_graph(seed):
    rng = np.random.default_rng(seed)
    g = _random_dag(rng, int(rng.integers(2, 21)))
    ex = ge2.ExecutorV2(g, "cpu", verify=True)
    assert not any(is_pointwise(n) and n.op not in FUSED_OPS and _has_pointwise_neighbour(ex.optimized_graph, n)
                   for n in ex.optimized_graph.nodes if n.outputs[0].type.shape == (5, 12))
    feeds = _feeds(rng, g)
    fused, unfused = ex.run(feeds), ge2.ExecutorV2(g, "cpu", passes=[]).run(feeds)
    for name in unfused:
        np.testing.assert_array_equal(fused[name], unfused[name], err_msg=name)


def _has_pointwise_neighbour(graph, node) -> bool:
    """Whether a pointwise node of the same shape feeds ``node`` (the pass would have fused them)."""
    return any(v is not None and v.producer is not None and is_pointwise(v.producer)
               and v.type.shape == node.outputs[0].type.shape for v in node.inputs)


@needs_nvrtc
def test_random_dags_generate_kernels_that_compile():
    kernels = []
    for seed in range(4):
        rng = np.random.default_rng(100 + seed)
        for dtype in ("float32", "bfloat16"):
            graph = ge2.ExecutorV2(_random_dag(rng, 12, dtype), "cpu").plans[0].graph
            for node in graph.nodes:
                if node.op in FUSED_OPS:
                    problem = Problem(node.op, tuple(v.type for v in node.inputs),
                                      tuple(v.type for v in node.outputs), node.attrs)
                    kernels.append(codegen_candidate.build("pointwise", (),
                                                           lambda n, p=problem: _generated_source(p, n)))
    assert kernels
    compiler.compile_cubin(_one_translation_unit(kernels), "random_dags", 90, "random DAGs")


@needs_nvrtc
@pytest.mark.parametrize("std", [False, True])
@pytest.mark.parametrize("cols", [50, 3000])
def test_variance_kernels_compile(std, cols):
    graph = ge2.ExecutorV2(_normalization_graph((4, cols), "bfloat16", std), "cpu").plans[0].graph
    kernels = [codegen_candidate.build("moments", (), lambda n, p=p: _generated_source(p, n))
               for p in (Problem(node.op, tuple(v.type for v in node.inputs), tuple(v.type for v in node.outputs),
                                 node.attrs) for node in graph.nodes)]
    source = _one_translation_unit(kernels)
    assert "ge2_welford_combine" in source and ("partial[3][8]" in source) == (cols > 1024)
    compiler.compile_cubin(source, f"moments_{cols}_{std}", 90, "moments")


@needs_nvrtc
@pytest.mark.parametrize("reduce, cols", [("sum", 37), ("mean", 4096), ("max", 1000), ("min", 5000)])
def test_reduction_kernels_compile_for_warp_and_block_rows(reduce, cols):
    x = TensorType((9, cols), "float16")
    group = ReductionGroup.from_attrs({
        "members": (_member("mul", ("input", 0), ("input", 0)),), "reduce": reduce, "axes": 1, "keepdims": False,
        "epilogue": (_member("sqrt" if "sqrt" in OPS else "exp", ("reduced",)),), "outputs": (0,)})
    out_types = group.infer([x])
    kernel = group.source("ge2_reduction_test", [x], out_types)
    assert ("__shared__" in kernel.source) == (cols > 1024)
    compiler.compile_cubin(kernel.source, kernel.name, 90, f"{reduce} test")


# ---------------------------------------------------------------------------------------------------------------
# Row ops (layernorm, rmsnorm, softmax, log_softmax) with a pointwise prologue and epilogue: fused_row
# ---------------------------------------------------------------------------------------------------------------
ROW_OPS = ("layernorm", "rmsnorm", "softmax", "log_softmax")


def _row_graph(op: str, shape, dtype: str, prologue: bool = True, epilogue: bool = True, keep_x: bool = False,
               rounded_to: str | None = None):
    """``(x + r) * s`` (the prologue; ``s`` a per-column scale), the row op, ``gelu_erf(y) + r`` (the epilogue);
    with ``keep_x``, the prologue's result is also an output (a pre-LN residual stream). The parameters are the same
    values for every ``dtype`` once ``rounded_to`` that dtype (a float32 reference of a 16-bit graph)."""
    rng = np.random.default_rng(0)

    def parameter(shape):
        return random_array(rng, shape, rounded_to or dtype).astype(ge2.dtypes.to_numpy(dtype))

    g = ge2.ir.Graph(f"{op}_row")
    x, r = g.input("x", shape, dtype), g.input("r", shape, dtype)
    h = g.mul(g.add(x, r), g.input("s", shape[-1:], dtype)) if prologue else x
    cols = shape[-1]
    if op == "layernorm":
        y = g.layernorm(h, g.param("gamma", parameter((cols,))),
                        g.param("beta", parameter((cols,))))
    elif op == "rmsnorm":
        y = g.rmsnorm(h, g.param("gamma", parameter((cols,))))
    else:
        y = getattr(g, op)(h)
    g.output(g.add(g.gelu_erf(y), r) if epilogue else y, "y")
    if keep_x:
        g.output(h, "h")
    return g


def _row_feeds(rng, graph):
    feeds = _feeds(rng, graph)
    feeds["x"] = (feeds["x"].astype(np.float64) * 2 + 3).astype(feeds["x"].dtype)  # a mean far from 0
    return feeds


@needs_nvrtc
@pytest.mark.parametrize("op", ROW_OPS)
def test_a_row_op_with_its_prologue_and_epilogue_is_one_fused_row_node(rng, op):
    g = _row_graph(op, (6, 40), "float32", keep_x=True)
    ex = ge2.ExecutorV2(g, "cpu")
    (node,) = ex.optimized_graph.nodes
    assert node.op == "fused_row" and len(node.outputs) == 2  # y and the kept prologue value h
    assert [m["op"] for m in node.attrs["members"]] == ["add", "mul", op, "gelu_erf", "add"]
    assert f"{op} (" in ex.explain() and "fused_row" in ex.explain()
    feeds = _row_feeds(rng, g)
    fused, unfused = ex.run(feeds), ge2.ExecutorV2(g, "cpu", passes=[]).run(feeds)
    for name in unfused:  # the CPU backend runs the members' references: exactly the unfused graph
        np.testing.assert_array_equal(fused[name], unfused[name], err_msg=name)


@needs_nvrtc
def test_layernorm_gelu_residual_reads_x_residual_gamma_beta_and_writes_y_once():
    g = _row_graph("layernorm", (16, 4096), "float16", prologue=False)
    graph = ge2.ExecutorV2(g, "cpu").optimized_graph
    (node,) = graph.nodes
    assert [v.name for v in node.inputs] == ["x", "gamma", "beta", "r"] and len(node.outputs) == 1


@needs_nvrtc
@pytest.mark.parametrize("prologue, epilogue", [(True, False), (False, True)])
def test_a_prologue_or_an_epilogue_alone_fuses(rng, prologue, epilogue):
    g = _row_graph("rmsnorm", (5, 9), "float32", prologue, epilogue)
    ex = ge2.ExecutorV2(g, "cpu")
    assert ex.optimized_graph.op_counts() == {"fused_row": 1}
    feeds = _row_feeds(rng, g)
    np.testing.assert_array_equal(ex.run(feeds)["y"], ge2.ExecutorV2(g, "cpu", passes=[]).run(feeds)["y"])


@needs_nvrtc
def test_an_epilogue_behind_a_reshape_that_keeps_the_last_axis_fuses(rng):
    g = ge2.ir.Graph("ln_reshape_cast")
    x = g.input("x", (2, 3, 8), "float32")
    y = g.layernorm(x, g.param("gamma", random_array(rng, (8,), "float32")),
                    g.param("beta", random_array(rng, (8,), "float32")))
    flat = g.reshape(y, shape=(6, 8))  # as the GPT's blocks feed their GEMMs
    g.output(g.mul(g.cast(flat, dtype="bfloat16"), g.input("s", (8,), "bfloat16")), "z")
    g.output(g.sigmoid(g.reshape(g.softmax(x), shape=(2, 24))), "w")  # the last axis changes: no fusion through it
    ex = ge2.ExecutorV2(g, "cpu")
    counts = ex.optimized_graph.op_counts()
    assert counts["fused_row"] == 1 and "layernorm" not in counts and "cast" not in counts and "softmax" in counts
    (row,) = [n for n in ex.optimized_graph.nodes if n.op == "fused_row"]
    assert [m["op"] for m in row.attrs["members"]] == ["layernorm", "cast", "mul"]
    assert row.outputs[0].type.shape == (2, 3, 8) and row.outputs[0].type.dtype == "bfloat16"
    feeds = _feeds(rng, g)
    fused, unfused = ex.run(feeds), ge2.ExecutorV2(g, "cpu", passes=[]).run(feeds)
    for name in unfused:
        assert fused[name].shape == unfused[name].shape
        np.testing.assert_array_equal(fused[name], unfused[name], err_msg=name)


@needs_nvrtc
def test_rows_past_the_register_bound_and_other_axes_keep_the_hand_written_kernels():
    long_rows = ge2.ExecutorV2(_row_graph("layernorm", (2, ROW_LIMIT + 1), "float16"), "cpu").optimized_graph
    assert "fused_row" not in long_rows.op_counts() and long_rows.op_counts()["layernorm"] == 1
    at_bound = ge2.ExecutorV2(_row_graph("layernorm", (2, ROW_LIMIT), "float16"), "cpu").optimized_graph
    assert at_bound.op_counts() == {"fused_row": 1}
    g = ge2.ir.Graph("first_axis")
    x = g.input("x", (4, 6), "float32")
    g.output(g.exp(g.softmax(g.neg(x), axis=0)), "y")
    assert "softmax" in ge2.ExecutorV2(g, "cpu").optimized_graph.op_counts()


@needs_nvrtc
def test_an_epilogue_reading_the_row_output_through_a_gemm_does_not_form_a_cycle(rng):
    g = ge2.ir.Graph("cycle")
    x = g.input("x", (4, 8), "float32")
    y = g.layernorm(g.tanh(x), g.param("gamma", random_array(rng, (8,), "float32")),
                    g.param("beta", random_array(rng, (8,), "float32")))
    w = g.param("w", random_array(rng, (8, 8), "float32"))
    g.output(g.mul(g.sigmoid(y), g.matmul(y, w)), "z")  # the epilogue also reads gemm(y): it cannot join
    ex = ge2.ExecutorV2(g, "cpu")
    counts = ex.optimized_graph.op_counts()
    assert counts["fused_row"] == 1 and "layernorm" not in counts
    (row,) = [n for n in ex.optimized_graph.nodes if n.op == "fused_row"]
    assert [m["op"] for m in row.attrs["members"]] == ["tanh", "layernorm"]
    feeds = _feeds(rng, g)
    np.testing.assert_array_equal(ex.run(feeds)["z"], ge2.ExecutorV2(g, "cpu", passes=[]).run(feeds)["z"])


@needs_nvrtc
def test_training_fuses_the_forward_row_and_leaves_its_backward_unfused(rng):
    g = ge2.ir.Graph("ln_train")
    x = g.input("x", (6, 16), "float32")
    gamma = g.param("gamma", 1 + random_array(rng, (16,), "float32", scale=0.1))
    beta = g.param("beta", random_array(rng, (16,), "float32", scale=0.1))
    h = g.add(g.gelu_erf(g.layernorm(g.tanh(x), gamma, beta)), x)
    g.output(g.mean(g.mul(h, h)), "loss")
    differentiated = ge2.autograd.backward_graph(g, "loss", wrt=["gamma", "beta"])
    fused_graph, _ = PassManager(resolve(["infer_shapes", "cse", "dce", "fuse_pointwise_training", "dce"])).run(
        differentiated)
    counts = fused_graph.op_counts()
    assert counts.get("fused_row") == 1 and counts.get("layernorm_backward") == 1 and "layernorm" not in counts
    feeds = {"x": random_array(rng, (6, 16), "float32")}
    fused = ge2.ExecutorV2(fused_graph, "cpu", passes=[]).run(feeds)
    unfused = ge2.ExecutorV2(differentiated, "cpu", passes=[]).run(feeds)
    for name in unfused:
        np.testing.assert_array_equal(fused[name], unfused[name], err_msg=name)


def _row_attrs(op: str, dtype: str, prologue=True, epilogue=True):
    """fused_row attrs of ``(x + r)`` -> op -> ``gelu_erf(y) * s`` over inputs x, r, s (per column), params; without
    the prologue, x -> op -> ``gelu_erf(y) * s + x``."""
    members = [_member("add", ("input", 0), ("input", 1))] if prologue else []
    x_arg = ("member", 0) if prologue else ("input", 0)
    parameters = {"layernorm": (("input", 3), ("input", 4)), "rmsnorm": (("input", 3),)}.get(op, ())
    members.append(_member(op, x_arg, *parameters))
    row = len(members) - 1
    if epilogue:
        members += [_member("gelu_erf", ("member", row)), _member("mul", ("member", row + 1), ("input", 2))]
        if not prologue:  # the row op's input read again by the epilogue: from the registers
            members.append(_member("add", ("member", row + 2), ("input", 0)))
    outputs = (len(members) - 1,) + ((0,) if prologue else ())
    return {"members": tuple(members), "outputs": outputs}


def _row_problem(op: str, shape, dtype: str, prologue=True, epilogue=True) -> Problem:
    cols = shape[-1]
    in_types = [TensorType(shape, dtype), TensorType(shape, dtype), TensorType((cols,), dtype)]
    in_types += [TensorType((cols,), dtype)] * {"layernorm": 2, "rmsnorm": 1}.get(op, 0)
    attrs = _row_attrs(op, dtype, prologue, epilogue)
    return Problem("fused_row", tuple(in_types), tuple(OPS["fused_row"].infer(in_types, attrs)), attrs)


ROW_COLS = (1, 7, 13, 64, 1000, 1024, 1025, 4096, ROW_LIMIT)
COMPILED_ROW_COLS = (7, 1024, 1025, 4096, ROW_LIMIT)  # warp/block rows, scalar/vector accesses, the bound


@needs_nvrtc
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ROW_OPS)
def test_row_kernels_compile_for_warp_and_block_rows_vector_and_scalar(op, dtype):
    kernels = [codegen_candidate.build("row", (), lambda n, p=_row_problem(op, (3, cols), dtype): _generated_source(
        p, n)) for cols in COMPILED_ROW_COLS]
    for cols, kernel in zip(COMPILED_ROW_COLS, kernels):
        assert ("__shared__" in kernel.source) == (cols > 1024)
        assert ("if (vectorized)" in kernel.source) == (cols % (16 // np.dtype(ge2.dtypes.to_numpy(dtype)).itemsize)
                                                        == 0)
    kernels.append(codegen_candidate.build("row", (), lambda n: _generated_source(
        _row_problem(op, (3, 4096), dtype, prologue=False), n)))
    assert "const float x0 = value;" in kernels[-1].source  # the epilogue's x from the registers
    # the competing candidate's generated parts: the prologue, and the epilogue reading the row op's output
    kernels += fused_ops._composite_kernels(_row_problem(op, (3, 4096), dtype))
    source = _one_translation_unit(kernels)
    assert "tanhf" not in source and "erff" in source  # exact GELU
    compiler.compile_cubin(source, f"rows_{op}_{dtype}", 90, f"{op} rows")


@needs_nvrtc
def test_a_plan_precompiles_the_kernels_of_both_row_candidates():
    problem = _row_problem("rmsnorm", (4, 2048), "bfloat16")
    compiler.STATS.clear()
    codegen_candidate.precompile([problem])
    compiled = {r.kernel for r in compiler.STATS.records}
    expected = {k.name for k in fused_ops._composite_kernels(problem)}
    members = RowGroup.from_attrs(problem.attrs).members
    expected.add(codegen_candidate.build("row", members, lambda n: _generated_source(problem, n)).name)
    assert compiled == expected and len(expected) == 3


@needs_nvrtc
@pytest.mark.parametrize("settled", ["generated", "row_kernel_and_pointwise"])
def test_a_plan_precompiles_only_the_settled_candidate(settled):
    """A problem whose kernel is known before timing (the autotune cache's winner, a pin) compiles that one's."""
    problem = _row_problem("rmsnorm", (4, 2048), "bfloat16")
    compiler.STATS.clear()
    codegen_candidate.precompile([problem], lambda p: settled)
    compiled = {r.kernel for r in compiler.STATS.records}
    members = RowGroup.from_attrs(problem.attrs).members
    generated = {codegen_candidate.build("row", members, lambda n: _generated_source(problem, n)).name}
    composite = {k.name for k in fused_ops._composite_kernels(problem)}
    assert compiled == (generated if settled == "generated" else composite)


@needs_nvrtc
def test_a_plan_precompiles_the_generated_candidate_of_an_unfused_op():
    """Every node's problem is offered, not only fused ones: gelu's generated kernel, which its timing prepares."""
    x = TensorType((64, 1000), "float16")
    problem = Problem("gelu", (x,), (x,), {}, (9, 0))
    compiler.STATS.clear()
    codegen_candidate.precompile([problem])
    assert [r.kernel.startswith("ge2_") and "gelu" in r.kernel for r in compiler.STATS.records] == [True]
    compiler.STATS.clear()
    codegen_candidate.precompile([problem], lambda p: "vec16")  # the cache settled on a hand-written kernel
    assert compiler.STATS.records == []


def test_the_precompile_never_fails_a_plan_build(monkeypatch):
    """Compiling ahead is only a head start: a candidate whose kernels cannot be generated or compiled is left to its
    node's prepare, which raises with the node's group and lets the plan fall back to the next candidate."""
    from graph_executor_v2.ir.schema import Candidate, Input, OpDef

    def prepare(problem):
        raise AssertionError("precompile must not prepare")

    def unlisted(problem):
        raise KeyError("no kernel for this problem")

    def uncompilable(problem):
        return [codegen_candidate.named(KernelSource("GE2_KERNEL_NAME", "not CUDA", 1, 1, 1, 1),
                                        "ge2_not_cuda")]

    prepare.kernels = unlisted
    other = lambda problem: None  # noqa: E731
    other.kernels = uncompilable
    candidates = (Candidate("unlisted", 20, "", lambda problem: None, prepare),
                  Candidate("uncompilable", 10, "", lambda problem: None, other))
    monkeypatch.setitem(OPS, "fake_precompiled", OpDef("fake_precompiled", (Input("x"),), ("y",), (),
                                                       lambda types, attrs: [types[0]], lambda inputs, attrs: inputs,
                                                       candidates=candidates))
    x = TensorType((4,), "float32")
    codegen_candidate.precompile([Problem("fake_precompiled", (x,), (x,), {}, (9, 0))])


@needs_nvrtc
def test_row_kernels_index_64_bit_past_2_to_the_31_elements_and_are_dumped(tmp_path, monkeypatch):
    monkeypatch.setenv("GE2_DUMP_KERNELS", str(tmp_path / "dump"))
    kernel = codegen_candidate.build("row", (), lambda n: _generated_source(
        _row_problem("layernorm", (2 ** 19 + 1, 4096), "float16"), n))
    assert "typedef unsigned long long index_t;" in kernel.source
    compiler.compile_cubin(kernel.source, kernel.name, 90, "wide layernorm")
    assert (tmp_path / "dump" / f"{kernel.name}.cu").read_text() == kernel.source


def test_row_groups_are_validated():
    good = _row_attrs("layernorm", "float32")
    RowGroup.from_attrs(good)
    two_rows = {**good, "members": good["members"] + (_member("softmax", ("member", 3)),)}
    with pytest.raises(ValueError, match="exactly one row op"):
        RowGroup.from_attrs(two_rows)
    members = (_member("exp", ("input", 0)), _member("neg", ("member", 0)), _member("softmax", ("member", 1)),
               _member("add", ("member", 2), ("member", 0)))
    with pytest.raises(ValueError, match="not kept"):
        RowGroup.from_attrs({"members": members, "outputs": (3,)})
    with pytest.raises(ValueError, match="outputs: member index 0"):
        RowGroup.from_attrs({"members": members[:3], "outputs": (0,)})
    last_axis = RowGroup.from_attrs({"members": (_member("softmax", ("input", 0), axis=2),), "outputs": (0,)})
    assert last_axis.infer([TensorType((2, 3, 4), "float32")]) == [TensorType((2, 3, 4), "float32")]
    with pytest.raises(ValueError, match="normalizes the last axis, got axis=0"):
        RowGroup.from_attrs({"members": (_member("softmax", ("input", 0), axis=0),), "outputs": (0,)}).infer(
            [TensorType((2, 3, 4), "float32")])
    problem = _row_problem("softmax", (2, ROW_LIMIT + 1), "float32")
    assert "register-resident bound" in RowGroup.from_attrs(problem.attrs).why_not(problem.in_types,
                                                                                    problem.out_types)


# ---------------------------------------------------------------------------------------------------------------
# Training: fused forward and backward chains
# ---------------------------------------------------------------------------------------------------------------
@needs_nvrtc
def test_training_graphs_fuse_forward_and_backward_and_gradients_match_finite_differences(rng):
    g = ge2.ir.Graph("train_chain")
    x = g.input("x", (3, 4), "float32")
    w = g.param("w", random_array(rng, (4,), "float32"))
    h = g.mul(g.silu(g.add(x, w)), g.tanh(x))
    g.output(g.sum(g.mul(h, h)), "loss")
    differentiated = ge2.autograd.backward_graph(g, "loss", wrt=["w"])
    fused_graph, _ = PassManager(resolve(["infer_shapes", "cse", "dce", "fuse_pointwise_training", "dce"])).run(
        differentiated)
    assert sum(n.op in FUSED_OPS for n in fused_graph.nodes) >= 2  # a forward group and a backward group
    assert not any(n.op.endswith("_backward") and is_pointwise(n) for n in fused_graph.nodes)
    feeds = {"x": random_array(rng, (3, 4), "float32")}
    grad = ge2.ExecutorV2(fused_graph, "cpu", passes=[]).run(feeds)["grad/w"]

    def loss(wv):
        xv = feeds["x"].astype(np.float64)
        z = xv + wv
        h = z / (1 + np.exp(-z)) * np.tanh(xv)
        return float(np.sum(h * h))

    base = np.asarray(g.params["w"].data, np.float64)
    numeric = np.zeros(4)
    for i in range(4):
        step = np.zeros(4)
        step[i] = 1e-6
        numeric[i] = (loss(base + step) - loss(base - step)) / 2e-6
    assert_close(grad, numeric, "float32", what="d loss / d w")


@needs_nvrtc
def test_trainer_steps_fuse_and_match_unfused_training(rng, monkeypatch):
    def trained(no_fusion: str):
        monkeypatch.setenv("GE2_NO_FUSION", no_fusion)
        g = ge2.ir.Graph("mlp")
        x = g.input("x", (8, 6), "float32")
        w = g.param("w", np.linspace(-1, 1, 6 * 5).reshape(6, 5).astype(np.float32))
        b = g.param("b", np.linspace(-0.5, 0.5, 5).astype(np.float32))
        h = g.gelu_erf(g.add(g.matmul(x, w), b))
        g.output(g.mean(g.mul(h, h)), "loss")
        trainer = ge2.train.Trainer(g, "loss", optimizer=ge2.train.SGD(lr=0.1), device="cpu")
        feeds = {"x": np.linspace(-2, 2, 48).reshape(8, 6).astype(np.float32)}
        losses = [float(trainer.step(feeds)) for _ in range(3)]
        return losses, trainer.train_graph.op_counts()

    fused_losses, fused_ops = trained("0")
    unfused_losses, unfused_ops = trained("1")
    assert "fused_pointwise" in fused_ops or "fused_reduction" in fused_ops
    assert not set(unfused_ops) & FUSED_OPS
    np.testing.assert_allclose(fused_losses, unfused_losses, rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------
def _run_problem(problem: Problem, arrays, to_device, poisoned, offset: int = 0):
    """Prepares the generated candidate of ``problem`` and launches it on device copies of ``arrays`` (each shifted
    by ``offset`` elements from a 256-byte aligned allocation: a misaligned view); returns the outputs on the host."""
    generated = next(c for c in OPS[problem.op].candidates if c.name == codegen_candidate.NAME)
    assert generated.supports(problem) is None
    launch = generated.prepare(problem)
    runtime = ge2.device.runtime()
    keep, ins = [], []
    for array in arrays:
        array = array.view(np.uint8) if array.dtype == np.bool_ else array  # DeviceArrays hold masks as bytes
        padded = np.zeros(array.size + 64, array.dtype)
        padded[offset:offset + array.size] = array.reshape(-1)
        device = to_device(padded)
        keep.append(device)
        ins.append(device.ptr + offset * array.itemsize)
    outs, out_arrays = [], []
    for t in problem.out_types:
        itemsize = np.dtype(ge2.dtypes.to_numpy(t.dtype)).itemsize
        poison = poisoned((t.numel + 64,), "uint8" if t.dtype == "bool" else t.dtype)
        out_arrays.append(poison)
        outs.append(poison.ptr + offset * itemsize)
    launch(ins, outs, 0)
    runtime.synchronize()
    results = []
    for poison, t in zip(out_arrays, problem.out_types):
        values = poison.numpy()[offset:offset + t.numel].reshape(t.shape)
        results.append(values.view(np.bool_) if t.dtype == "bool" else values)
    return results


def _tolerance_dtype(dtype: str) -> str:
    return dtype if dtype in FLOATS else "float32"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOATS + ("int32", "bool"))
@pytest.mark.parametrize("offset", [0, 1])
def test_every_scalar_op_on_the_gpu_against_its_reference(rng, to_device, poisoned, dtype, offset):
    for op in _scalar_ops():
        for problem in _single_problems(op, dtype):
            arrays = [_random_input(rng, t, divisor=k > 0) for k, t in enumerate(problem.in_types)]
            expected = OPS[op].run_reference(arrays, problem.attrs)
            (got,) = _run_problem(problem, arrays, to_device, poisoned, offset)
            _compare(got, expected[0], problem.out_types[0].dtype, f"{op} {dtype} offset {offset} element(s)")


def _random_input(rng, t: TensorType, divisor: bool = False):
    """Fresh values of ``t``; integer ``divisor`` operands are never 0 (division by 0 has tests of its own)."""
    if t.dtype == "bool":
        return rng.random(t.shape) < 0.5
    if t.dtype in ("int32", "int64", "uint8"):
        values = rng.integers(1 if t.dtype == "uint8" else -20, 20, t.shape)
        if divisor:
            values = np.where(values == 0, 7, values)
        return values.astype(ge2.dtypes.to_numpy(t.dtype))
    return random_array(rng, t.shape, t.dtype)


def _compare(got, expected, dtype: str, what: str):
    if dtype in FLOATS:
        assert_close(got, expected, dtype, what=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


def _float32_reference(graph_in_float32, feeds) -> dict:
    """The unfused graph on the CPU in float32 on the feeds' values: a generated kernel rounds once, at its store,
    where the unfused 16-bit graph rounds after every op (a cancellation then differs by more than one rounding)."""
    return ge2.ExecutorV2(graph_in_float32, "cpu", passes=[]).run(
        {name: value.astype(np.float32) for name, value in feeds.items()})


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (33, 4097), (2, 3, 4, 5, 6, 7)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_fused_plans_match_the_unfused_reference(rng, shape, dtype):
    g = _chain_graph(dtype, shape)
    feeds = _feeds(rng, g)
    expected = _float32_reference(_chain_graph("float32", shape), feeds)
    ex = ge2.ExecutorV2(g, "cuda")
    assert [s.kernel for s in ex.plans[0].selections] == ["generated"]
    for _ in range(2):  # the first run warms up and captures, the second replays the CUDA graph
        got = ex.run(feeds)
        for name in expected:
            assert_close(got[name], expected[name], dtype, what=name)
    assert ex.plans[0].capture.startswith("captured")
    # add(x, r) of a row-shaped r (shapes (1,), (7,)) is canonicalized into a bias_add: the name follows the members
    (fused,) = [n for n in ex.optimized_graph.nodes if n.op == "fused_pointwise"]
    ops = list(dict.fromkeys(m["op"] for m in fused.attrs["members"]))
    assert ops in (["tanh", "mul", "add", "bias_add", "relu"], ["tanh", "mul", "bias_add", "relu"]), ops
    assert f"kernel ge2_pointwise_{'_'.join(ops)}_" in ex.explain()
    profile = ex.profile(feeds, runs=3)
    assert profile.compiles and profile.compiles[0][0] == "fused_pointwise_0"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "int64"])
@pytest.mark.parametrize("cols", [64, 60])
@pytest.mark.parametrize("offset", [0, 1])
def test_broadcast_operands_read_once_a_vector_step_on_the_gpu(rng, to_device, poisoned, dtype, cols, offset):
    """A bias as packs, a row scale once a step and a float32 operand over two dims as packs (rows of 64; rows of 60
    with float32 and int64, whose float32 output makes 4-element steps), or element by element (float16's 8-element
    steps in rows of 60); misaligned views (offset 1) take the scalar loop."""
    problem = _broadcast_problem(dtype, cols)
    assert problem.out_types[0].dtype == "float32"
    arrays = [_random_input(rng, t) for t in problem.in_types]
    x, bias, scale, wide = (a.astype(np.float64) for a in arrays)
    # in float64: the kernel keeps the float16 intermediates in float32 (the members' reference rounds each one)
    expected = (x + bias) * scale - wide
    (got,) = _run_problem(problem, arrays, to_device, poisoned, offset)
    assert_close(got, expected, "float32", what=f"{dtype} rows of {cols}, offset {offset}")


@pytest.mark.gpu
def test_a_hundred_groups_in_one_plan_captured(rng):
    g = ge2.ir.Graph("hundred")
    x = g.input("x", (16, 128), "float32")
    w = g.param("w", random_array(rng, (128, 128), "float32", scale=0.05))
    h = x
    for _ in range(100):  # a gemm, then pointwise ops its epilogue does not take: one group per layer
        h = g.sub(g.tanh(g.matmul(h, w)), g.mul(g.sigmoid(h), h))
    g.output(h, "y")
    ex = ge2.ExecutorV2(g, "cuda")
    assert sum(s.op == "fused_pointwise" and s.kernel == "generated" for s in ex.plans[0].selections) == 100
    feeds = {"x": random_array(rng, (16, 128), "float32", scale=0.1)}
    expected = ge2.ExecutorV2(g, "cpu", passes=[]).run(feeds)["y"]
    for _ in range(2):
        assert_close(ex.run(feeds)["y"], expected, "float32", reduction_length=128 * 100, what="y")
    assert ex.plans[0].capture.startswith("captured")


@pytest.mark.gpu
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("cols", [1, 33, 1024, 1025, 6000])
def test_fused_reductions_on_the_gpu(rng, reduce, cols):
    def squared_distance(dtype):
        g = ge2.ir.Graph("mse_rows")
        x, y = g.input("x", (37, cols), dtype), g.input("y", (37, cols), dtype)
        d = g.sub(x, y)
        g.output(g.neg(getattr(g, reduce)(g.mul(d, d), axis=-1)), "r")
        return g

    g = squared_distance("float16")
    ex = ge2.ExecutorV2(g, "cuda")
    assert [s.op for s in ex.plans[0].selections] == ["fused_reduction"]
    feeds = _feeds(rng, g)
    expected = _float32_reference(squared_distance("float32"), feeds)["r"]
    assert_close(ex.run(feeds)["r"], expected, "float16", reduction_length=cols, what=f"{reduce} of {cols}")


@pytest.mark.gpu
@pytest.mark.parametrize("std", [False, True])
@pytest.mark.parametrize("cols", [1, 50, 1024, 3000])
@pytest.mark.parametrize("dtype", FLOATS)
def test_variance_and_std_on_the_gpu(rng, std, cols, dtype):
    g = _normalization_graph((19, cols), dtype, std)
    ex = ge2.ExecutorV2(g, "cuda")
    assert "fused_reduction" in [s.op for s in ex.plans[0].selections]
    feeds = {"x": random_array(rng, (19, cols), dtype, scale=3.0) + np.asarray(5, dtype)}  # a mean far from 0
    expected = _float32_reference(_normalization_graph((19, cols), "float32", std), feeds)
    got = ex.run(feeds)
    for name in expected:
        assert_close(got[name], expected[name], dtype, reduction_length=cols, what=f"{name}, {cols} columns")


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_fused_reduction_on_misaligned_views(rng, to_device, poisoned, offset):
    x = TensorType((5, 64), "float16")
    attrs = {"members": (_member("mul", ("input", 0), ("input", 0)),), "reduce": "sum", "axes": 1,
             "keepdims": False, "epilogue": (), "outputs": ()}
    problem = Problem("fused_reduction", (x,), tuple(OPS["fused_reduction"].infer([x], attrs)), attrs)
    array = random_array(rng, x.shape, "float16")
    (got,) = _run_problem(problem, [array], to_device, poisoned, offset)
    expected = OPS["fused_reduction"].run_reference([array], attrs)[0]
    assert_close(got, expected, "float16", reduction_length=64, what="sum of squares")


@pytest.mark.gpu
def test_more_than_2_to_the_31_elements_large(to_device):
    count = 2 ** 31 + 24
    x = TensorType((count,), "uint8")
    attrs = {"members": (_member("add", ("input", 0), ("constant", 3, "uint8", ())),), "outputs": (0,)}
    problem = Problem("fused_pointwise", (x,), (x,), attrs)
    generated = OPS["fused_pointwise"].candidates[0]
    launch = generated.prepare(problem)
    host = np.arange(count, dtype=np.int64).astype(np.uint8)
    source = to_device(host)
    out = ge2.device.runtime().DeviceArray.empty([count], "uint8")
    launch([source.ptr], [out.ptr], 0)
    result = out.numpy()
    np.testing.assert_array_equal(result[:4096], host[:4096] + 3)
    np.testing.assert_array_equal(result[-4096:], host[-4096:] + 3)
    np.testing.assert_array_equal(result[2 ** 31 - 8: 2 ** 31 + 8], host[2 ** 31 - 8: 2 ** 31 + 8] + 3)


@pytest.mark.gpu
def test_training_on_the_gpu_runs_fused_groups_and_matches_the_cpu(rng):
    g = ge2.ir.Graph("mlp")
    x = g.input("x", (16, 32), "float32")
    w = g.param("w", random_array(rng, (32, 64), "float32", scale=0.2))
    b = g.param("b", random_array(rng, (64,), "float32"))
    h = g.gelu_erf(g.add(g.matmul(x, w), b))
    g.output(g.mean(g.mul(h, g.sigmoid(h))), "loss")
    feeds = {"x": random_array(rng, (16, 32), "float32")}
    losses = {}
    for device in ("cpu", "cuda"):
        trainer = ge2.train.Trainer(g, "loss", optimizer=ge2.train.SGD(lr=0.1), device=device)
        losses[device] = [float(trainer.step(feeds)) for _ in range(3)]
        if device == "cuda":
            assert any(s.op in FUSED_OPS and s.kernel == "generated" for s in trainer._executor.plans[0].selections)
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", ROW_COLS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ROW_OPS)
def test_generated_row_kernels_on_the_gpu(rng, to_device, poisoned, op, dtype, cols):
    # 16-byte packs, then a misaligned view (scalar accesses); without a prologue, the epilogue reads x again
    for offset, prologue in ((0, True), (1, True), (0, False)):
        problem = _row_problem(op, (5, cols), dtype, prologue=prologue)
        arrays = [random_array(rng, t.shape, dtype) for t in problem.in_types]
        arrays[0] = (arrays[0].astype(np.float64) * 2 + 3).astype(arrays[0].dtype)
        expected = OPS["fused_row"].run_reference([a.astype(np.float32) for a in arrays], problem.attrs)
        got = _run_problem(problem, arrays, to_device, poisoned, offset)
        for k, (g, e) in enumerate(zip(got, expected)):
            assert_close(g, e, dtype, reduction_length=cols, what=f"{op} {dtype} cols {cols} output {k} offset "
                                                                   f"{offset} prologue {prologue}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ROW_OPS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_fused_row_plans_time_the_generated_kernel_against_the_hand_written_one(rng, op, dtype):
    shape = (33, 1000)
    g = _row_graph(op, shape, dtype, keep_x=True)
    ex = ge2.ExecutorV2(g, "cuda")
    (selection,) = ex.plans[0].selections
    assert selection.op == "fused_row" and selection.kernel in ("generated", "row_kernel_and_pointwise")
    assert "generated" in selection.reason and "row_kernel_and_pointwise" in selection.reason  # both timed
    feeds = _row_feeds(rng, g)
    expected = _float32_reference(_row_graph(op, shape, "float32", keep_x=True, rounded_to=dtype), feeds)
    for _ in range(2):  # warm-up and capture, then the CUDA graph replays
        got = ex.run(feeds)
        for name in expected:
            assert_close(got[name], expected[name], dtype, reduction_length=shape[-1], what=name)
    assert f"ge2_row_add_mul_{op}_gelu_erf_" in ex.explain() or selection.kernel != "generated"


@pytest.mark.gpu
@pytest.mark.parametrize("op", ROW_OPS)
@pytest.mark.parametrize("cols", [1, 13, 4096])
def test_the_hand_written_row_kernel_with_generated_prologue_and_epilogue_on_the_gpu(rng, to_device, poisoned, op,
                                                                                      cols):
    problem = _row_problem(op, (7, cols), "float16")
    composite = next(c for c in OPS["fused_row"].candidates if c.name == "row_kernel_and_pointwise")
    assert composite.supports(problem) is None
    arrays = [random_array(rng, t.shape, "float16") for t in problem.in_types]
    launch = composite.prepare(problem)
    ins = [to_device(a) for a in arrays]
    outs = [poisoned(t.shape, t.dtype) for t in problem.out_types]
    launch([a.ptr for a in ins], [o.ptr for o in outs], 0)
    ge2.device.runtime().synchronize()
    expected = OPS["fused_row"].run_reference([a.astype(np.float32) for a in arrays], problem.attrs)
    for k, (out, e) in enumerate(zip(outs, expected)):
        assert_close(out.numpy(), e, "float16", reduction_length=cols, what=f"{op} output {k}")


@pytest.mark.gpu
def test_rows_past_the_bound_run_the_hand_written_kernels_on_the_gpu(rng):
    shape = (3, ROW_LIMIT + 3)
    g = _row_graph("layernorm", shape, "float16")
    ex = ge2.ExecutorV2(g, "cuda")
    assert "layernorm" in [s.op for s in ex.plans[0].selections]
    feeds = _row_feeds(rng, g)
    expected = _float32_reference(_row_graph("layernorm", shape, "float32", rounded_to="float16"), feeds)["y"]
    assert_close(ex.run(feeds)["y"], expected, "float16", reduction_length=shape[-1], what="y")


def _row_float64(op, prologue, x, r, s, *parameters):
    """The outputs of ``_row_attrs``'s group in float64: (the epilogue's result[, the prologue's value])."""
    from math import erf

    from graph_executor_v2.ops import layernorm, rmsnorm, softmax

    x64, r64, s64 = (a.astype(np.float64) for a in (x, r, s))
    h = x64 + r64 if prologue else x64
    if op == "layernorm":
        y = layernorm.reference(h, *parameters)[0]
    elif op == "rmsnorm":
        y = rmsnorm.reference(h, *parameters)[0]
    else:
        y = softmax.reference(op, h)
    z = 0.5 * y * (1 + np.vectorize(erf)(y / np.sqrt(2))) * s64
    return [z, h] if prologue else [z + x64]


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [7, 768, 1000, 4096, ROW_LIMIT])
@pytest.mark.parametrize("op", ROW_OPS)
def test_float32_row_kernels_are_float32_accurate(rng, to_device, poisoned, op, cols):
    """Against float64 at float32's own tolerance (no allowance for the row length): the statistics are reduced from
    float32 registers in two passes, so a row of 16384 elements keeps float32 accuracy."""
    for prologue in (True, False):
        problem = _row_problem(op, (3, cols), "float32", prologue=prologue)
        arrays = [random_array(rng, t.shape, "float32") for t in problem.in_types]
        arrays[0] = arrays[0] * 2 + 3
        expected = _row_float64(op, prologue, *arrays)
        got = _run_problem(problem, arrays, to_device, poisoned)
        for k, (g, e) in enumerate(zip(got, expected)):
            assert_close(g, e, "float32", what=f"{op} cols {cols} output {k} prologue {prologue}")
