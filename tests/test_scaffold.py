"""The layer author's path. ``python -m graph_executor_v2 new-op``: argument errors (nothing written), the files and
registrations it writes into a temporary copy of the repository, and (marked slow: CMake + nvcc) the generated op
built and its generated tests run, in tree and out of tree. The out-of-tree example (examples/custom_op): its own
tests run against the installed ge2_swiglu (scripts/run_tests.sh installs it), else against a CMake build of it.
On a GPU machine the generated and the example's GPU tests run too."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2 import _native
from graph_executor_v2.scaffold import new_op

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "python" / "graph_executor_v2"
SKIPPED_IN_COPY = shutil.ignore_patterns(".git", ".venv", "build", "__pycache__", "*.so", "results", ".gpu",
                                         "examples", ".pytest_cache")


# An editable install (scikit-build-core, as scripts/run_tests.sh makes) puts a finder first on sys.meta_path that
# sends every "import graph_executor_v2" to this checkout. Subprocesses that must import a copy (or an installed
# package) from PYTHONPATH drop it in a sitecustomize, which runs after the .pth files that install it.
SITECUSTOMIZE = (
    "import sys\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != 'ScikitBuildRedirectingFinder']\n")


@pytest.fixture
def own_imports(tmp_path):
    """A PYTHONPATH entry that makes subprocesses import graph_executor_v2 from PYTHONPATH only."""
    directory = tmp_path / "own_imports"
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return directory


@pytest.fixture
def repo_copy(tmp_path):
    """The repository's sources, copied (no build outputs)."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, ignore=SKIPPED_IN_COPY)
    return copy


def run(command, cwd, pythonpath, timeout=900, hide_gpu=False):
    """Runs ``command`` with ``pythonpath`` first on PYTHONPATH; fails the test with its output on a non-zero exit.
    ``hide_gpu``: as on a machine without one (CI's), for the CPU tests of an op whose module is not built, which on
    a GPU machine would otherwise try to run it."""
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(p) for p in pythonpath] + inherited))
    if hide_gpu:
        environment["CUDA_VISIBLE_DEVICES"] = ""
        environment.pop("GE2_REQUIRE_GPU", None)
    result = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def tool(name):
    """A build tool from the environment of this Python (the test extras install cmake and ninja), else PATH."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def toolchain_or_skip():
    """cmake and nvcc as the build uses them; a skip says what is missing (CI has both)."""
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    cmake = tool("cmake")
    if cmake is None or not os.path.exists(nvcc):
        pytest.skip(f"needs cmake and nvcc (found cmake={cmake}, nvcc={nvcc if os.path.exists(nvcc) else None})")
    return cmake, nvcc


def cmake_build(source, build, cmake, nvcc, *defines, target=None, pythonpath=(PACKAGE.parent,)):
    import pybind11

    configure = [cmake, "-S", source, "-B", build, f"-DPython_EXECUTABLE={sys.executable}",
                 f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", f"-DCMAKE_CUDA_COMPILER={nvcc}", *defines]
    if tool("ninja"):
        configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}"]
    run(configure, source, pythonpath)
    run([cmake, "--build", build] + (["--target", target] if target else []), source, pythonpath)


def share_runtime(copy_package: Path) -> None:
    """The generated GPU tests need _runtime: the one this session uses, when it is built."""
    if _native.is_built("_runtime"):
        runtime = Path(_native.load("_runtime").__file__)
        shutil.copy2(runtime, copy_package / runtime.name)


def generated_test_summary(output: str) -> str:
    return output.strip().splitlines()[-1]


# --- argument errors: nothing is written -------------------------------------------------------------------------
@pytest.mark.parametrize("name, inputs, message", [
    ("Bad-Name", None, "name: expected a lowercase identifier"),
    ("class", None, "name: expected a lowercase identifier .* got 'class'"),
    ("gemm", None, "name: GE2 already has an op 'gemm'"),
    ("fresh", ["a", "a"], "inputs: names and their gradients .* got a, da twice"),
    ("fresh", ["x", "dx"], "inputs: names and their gradients .* got dx twice"),
    ("fresh", ["kernel"], "inputs: expected a lowercase identifier .* got 'kernel'"),
    ("fresh", [], "inputs: expected at least one input name"),
])
def test_bad_arguments_write_nothing(repo_copy, name, inputs, message):
    before = sorted(p for p in repo_copy.rglob("*"))
    with pytest.raises(ValueError, match=message):
        new_op(name, inputs if inputs is not None else ["x"], root=repo_copy)
    assert sorted(p for p in repo_copy.rglob("*")) == before


def test_root_must_be_a_checkout_and_files_are_never_overwritten(tmp_path, repo_copy):
    with pytest.raises(ValueError, match="root: expected a GE2 source checkout"):
        new_op("fresh", root=tmp_path)
    existing = repo_copy / "tests" / "test_fresh.py"
    existing.write_text("# the author's own\n")
    with pytest.raises(ValueError, match="name: op 'fresh' would overwrite .*test_fresh.py"):
        new_op("fresh", root=repo_copy)
    assert existing.read_text() == "# the author's own\n"
    assert not (repo_copy / "backends/cuda/ops/fresh").exists()


def test_command_line_reports_bad_arguments(repo_copy):
    result = subprocess.run([sys.executable, "-m", "graph_executor_v2", "new-op", "gemm"], cwd=repo_copy,
                            env=dict(os.environ, PYTHONPATH=str(repo_copy / "python")), capture_output=True, text=True)
    assert result.returncode == 2
    assert "new-op: name: GE2 already has an op 'gemm'" in result.stderr


def test_elementwise_argument_helpers_of_generated_ops():
    """ops._layout's checks that generated and out-of-tree elementwise ops share (their host side)."""
    from graph_executor_v2.ops import _layout

    x = np.zeros((3, 5), np.float16)
    assert _layout.same_host_arrays((("a", x), ("b", x))) == "float16"
    with pytest.raises(TypeError, match="a: expected dtype float32, float16 or bfloat16, got int32"):
        _layout.same_host_arrays((("a", x.astype(np.int32)),))
    with pytest.raises(TypeError, match=r"b: expected dtype float16 \(the dtype of a\), got float32"):
        _layout.same_host_arrays((("a", x), ("b", x.astype(np.float32))))
    with pytest.raises(ValueError, match=r"b: expected shape \(3, 5\) \(the shape of a\), got \(5, 3\)"):
        _layout.same_host_arrays((("a", x), ("b", x.T)))
    with pytest.raises(TypeError, match="out: expected None or a tuple of 2 arrays or None, got tuple of length 1"):
        _layout.gradient_outputs((None,), None, 2, [], (3, 5), "float16", 0)
    with pytest.raises(TypeError, match="out: expected None or a tuple of 2 arrays or None, got dict"):
        _layout.gradient_outputs({}, None, 2, [], (3, 5), "float16", 0)


# --- in tree -----------------------------------------------------------------------------------------------------
def test_in_tree_files_registrations_and_cpu_tests(repo_copy, own_imports):
    python = [own_imports, repo_copy / "python"]
    output = run([sys.executable, "-m", "graph_executor_v2", "new-op", "scaled_sum", "--inputs", "a,b"], repo_copy,
                 python)
    for path in ("backends/cuda/ops/scaled_sum/api.hpp", "backends/cuda/ops/scaled_sum/launcher.cu",
                 "backends/cuda/ops/scaled_sum/kernels/scaled_sum.cu", "src/bindings/scaled_sum_pybind.cpp",
                 "python/graph_executor_v2/ops/scaled_sum.py", "tests/test_scaled_sum.py",
                 "benchmarks/op_cases/scaled_sum.py"):
        assert (repo_copy / path).is_file(), path
        assert f"wrote {path}" in output
    cmake_lines = (repo_copy / "CMakeLists.txt").read_text().splitlines()
    assert cmake_lines.count("add_standalone_op(scaled_sum)") == 1
    init = (repo_copy / "python/graph_executor_v2/ops/__init__.py").read_text()
    assert "from . import scaled_sum\n" in init and '"scaled_sum"]' in init
    probe = ("import graph_executor_v2 as ge2; from graph_executor_v2.ops import scaled_sum; "
             "print(ge2.ops.OPS['scaled_sum'].candidates[0].name, ge2.ops.OPS['scaled_sum'].grad is not None, "
             "ge2.ops.OPS['scaled_sum_backward'].outputs, 'scaled_sum' in ge2.ops.__all__, "
             "'scaled_sum_backward' in ge2.ops.BACKWARD_OPS)")
    assert run([sys.executable, "-c", probe], repo_copy, python).split() == ["grid_stride", "True", "('da',",
                                                                               "'db')", "True", "True"]
    summary = generated_test_summary(run([sys.executable, "-m", "pytest", "tests/test_scaled_sum.py", "-q", "-m",
                                          "not gpu", "-p", "no:cacheprovider"], repo_copy, python, hide_gpu=True))
    assert "6 passed" in summary and "failed" not in summary, summary  # the CPU tests (the module is not built)
    # No other file to edit: the generic face tests and the grad-rule tests take the new op from its OpDef (its
    # samples; the sample walk's fixtures need _runtime), and its backward op, registered as one, gets no face.
    share_runtime(repo_copy / "python" / "graph_executor_v2")
    selected = "scaled_sum" if _native.is_built("_runtime") else "scaled_sum and not every_sample"
    summary = generated_test_summary(run([sys.executable, "-m", "pytest", "tests/test_op_faces.py",
                                          "tests/test_autograd.py", "-q", "-m", "not gpu", "-k", selected, "-p",
                                          "no:cacheprovider"], repo_copy, python, hide_gpu=True))
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary


@pytest.mark.slow
def test_in_tree_op_builds_and_its_tests_pass(repo_copy, own_imports):
    cmake, nvcc = toolchain_or_skip()
    python = [own_imports, repo_copy / "python"]
    run([sys.executable, "-m", "graph_executor_v2", "new-op", "scale"], repo_copy, python)
    cmake_build(repo_copy, repo_copy / "build", cmake, nvcc, "-DGE2_ONLY_OPS=scale", target="_ops_scale",
                pythonpath=python)
    copy_package = repo_copy / "python" / "graph_executor_v2"
    assert list(copy_package.glob("_ops_scale*.so"))
    share_runtime(copy_package)
    probe = "from graph_executor_v2.ops import scale; print([k['name'] for k in scale.kernels()])"
    assert run([sys.executable, "-c", probe], repo_copy, python).strip() == "['grid_stride']"
    summary = generated_test_summary(run([sys.executable, "-m", "pytest", "tests/test_scale.py", "-q", "-p",
                                          "no:cacheprovider"], repo_copy, python))
    assert "failed" not in summary and "error" not in summary and " passed" in summary, summary


# --- out of tree -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_out_of_tree_op_builds_against_ge2_and_its_tests_pass(tmp_path):
    cmake, nvcc = toolchain_or_skip()
    project = tmp_path / "my_ops"
    new_op("halve", out_of_tree=project)
    new_op("mix", ["p", "q"], out_of_tree=project)  # a second op joins the same project
    text = (project / "CMakeLists.txt").read_text()
    assert "add_standalone_op(halve PACKAGE ge2_halve)\nadd_standalone_op(mix PACKAGE ge2_halve)" in text
    assert (project / "python/ge2_halve/__init__.py").read_text().endswith("from . import halve\nfrom . import mix\n")
    assert str(ge2.cmake_dir()) in run([sys.executable, "-c", "import graph_executor_v2 as g; print(g.cmake_dir())"],
                                       tmp_path, [PACKAGE.parent])
    cmake_build(project, project / "build", cmake, nvcc)
    assert len(list((project / "python/ge2_halve").glob("_ops_*.so"))) == 2
    probe = ("import ge2_halve; from graph_executor_v2.runtime.registry import kernel_label; "
             "print(kernel_label('mix', 'grid_stride'), ge2_halve.mix.kernels()[0]['name'])")
    assert run([sys.executable, "-c", probe], project, [project / "python", PACKAGE.parent]).strip() == \
        "grid_stride [external: ge2_halve] grid_stride"
    summary = generated_test_summary(run([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"],
                                         project, [project / "python", PACKAGE.parent]))
    assert "failed" not in summary and "error" not in summary and " passed" in summary, summary



@pytest.mark.slow
def test_out_of_tree_op_builds_against_an_installed_package(tmp_path, repo_copy, own_imports):
    """The wheel's layout: the install rules put the CMake helper and the shim headers into the package, and an
    out-of-tree op builds against them with nothing but the installed package on PYTHONPATH."""
    cmake, nvcc = toolchain_or_skip()
    cmake_build(repo_copy, tmp_path / "build", cmake, nvcc, "-DSKBUILD=ON", "-DGE2_ONLY_OPS=no_op_only_runtime",
                pythonpath=[own_imports, repo_copy / "python"])
    prefix = tmp_path / "site"
    run([cmake, "--install", tmp_path / "build", "--prefix", prefix], tmp_path, [])
    installed = prefix / "graph_executor_v2"
    for path in ("cmake/graph_executor_v2Config.cmake", "cmake/AddStandaloneOp.cmake", "include/_common/status.hpp",
                 "include/bindings_common/op_binding.hpp"):
        assert (installed / path).is_file(), path
    shutil.copytree(repo_copy / "python" / "graph_executor_v2", installed, dirs_exist_ok=True)  # the wheel's Python
    site = [own_imports, prefix]
    assert run([sys.executable, "-c", "import graph_executor_v2 as g; print(g.cmake_dir())"], tmp_path,
               site).strip() == str(installed / "cmake")
    project = tmp_path / "my_ops"
    new_op("halve", out_of_tree=project)
    cmake_build(project, project / "build", cmake, nvcc, pythonpath=site)
    assert "include/_common" in (project / "build" / "build.ninja").read_text()
    summary = generated_test_summary(run([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"],
                                         project, [project / "python"] + site))
    assert "failed" not in summary and "error" not in summary and " passed" in summary, summary

# --- the out-of-tree example -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_custom_op_example_passes_its_own_tests(tmp_path):
    """In a process of its own: importing ge2_swiglu registers its ops, which must not join this session's OPS."""
    example = REPO / "examples" / "custom_op"
    pythonpath = [PACKAGE.parent]
    if importlib.util.find_spec("ge2_swiglu") is None:  # not installed: build it here
        cmake, nvcc = toolchain_or_skip()
        copy = tmp_path / "custom_op"
        shutil.copytree(example, copy, ignore=shutil.ignore_patterns("build", "__pycache__", "*.so"))
        cmake_build(copy, copy / "build", cmake, nvcc)
        pythonpath.insert(0, copy / "python")
    output = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-ra"], example, pythonpath)
    summary = generated_test_summary(output)
    assert "failed" not in summary and "error" not in summary and " passed" in summary, output[-3000:]
