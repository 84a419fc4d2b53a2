"""The quick start's scripts: the build reports its progress, and the jobs write their files under runs/ (git-ignored)
and say where; scripts/import_layers.py's layering report (Python imports and the native runtime's units)."""
from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

BUILD_OUTPUT = """Collecting numpy>=1.24
  Downloading numpy-2.1.0.whl (16 MB)
-- The CUDA compiler identification is NVIDIA 13.0.88
[1/105] Building CXX object CMakeFiles/_runtime.dir/src/runtime/runtime_pybind.cpp.o
[17/105] Building CUDA object CMakeFiles/_ops_gemm.dir/backends/cuda/ops/gemm/launcher.cu.o
[104/105] Linking CXX shared module /tmp/x/python/graph_executor_v2/_ops_gemm.cpython-311-x86_64-linux-gnu.so
FAILED: CMakeFiles/_ops_softmax.dir/backends/cuda/ops/softmax/launcher.cu.o
launcher.cu(12): error: identifier "x" is undefined
Successfully installed graph_executor_v2-0.1.0
"""


def test_the_build_reports_module_n_of_m_with_the_elapsed_time(tmp_path):
    log = tmp_path / "build.log"
    result = subprocess.run(["bash", str(ROOT / "scripts" / "build_progress.sh"), str(log)], input=BUILD_OUTPUT,
                            capture_output=True, text=True, check=True)
    shown = [line.split("] ", 1)[1] for line in result.stdout.splitlines()]
    assert all(line.startswith("  [  0m0") for line in result.stdout.splitlines())  # the elapsed time first
    assert shown == ["Collecting numpy>=1.24",
                     "step 1 of 105: compiling _runtime (runtime_pybind.cpp)",
                     "step 17 of 105: compiling _ops_gemm (launcher.cu)",
                     "step 104 of 105: linking _ops_gemm",
                     'launcher.cu(12): error: identifier "x" is undefined',
                     "Successfully installed graph_executor_v2-0.1.0"]
    assert log.read_text() == BUILD_OUTPUT  # everything in the log


def test_setup_builds_on_every_core_with_the_plot_extra():
    setup = (ROOT / "scripts" / "setup_env.sh").read_text()
    assert 'CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}' in setup
    assert 'pip install -v --progress-bar off -e ".[test,train,plot]" 2>&1 | scripts/build_progress.sh' in setup
    assert "--plot runs/digits_loss.png" in (ROOT / "scripts" / "demo.sh").read_text()


def test_runs_is_git_ignored():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    result = subprocess.run(["git", "check-ignore", "-q", "runs/digits_loss.png"], cwd=ROOT)
    assert result.returncode == 0, "runs/ is not in .gitignore"


def test_train_digits_writes_its_plot_under_runs_and_says_where(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason="the plot extra: pip install graph_executor_v2[plot]")
    from graph_executor_v2.__main__ import main

    monkeypatch.chdir(tmp_path)
    main(["train-digits", "--cpu", "--epochs", "1"])  # one epoch: below the accuracy bar, exit code 1 is fine
    written = tmp_path / "runs" / "digits_loss.png"
    assert written.read_bytes().startswith(b"\x89PNG")
    assert f"loss curve: written to {written}" in capsys.readouterr().out


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tree_has_no_upward_import_and_no_cycle_python_or_native():
    """scripts/import_layers.py on this tree: the layering of issue 25 holds (Python imports and the units of the
    native runtime, src/runtime)."""
    output = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_layers.py"), "--verbose"], check=True,
                            capture_output=True, text=True).stdout
    assert "upward imports: 0\n" in output and "import cycles: 0 " in output, output
    assert "native unit cycles: 0\n" in output and "  devices.cpp -> (none)\n" in output, output


def test_the_native_unit_check_finds_a_cycle_through_a_shared_header(tmp_path):
    """Two units calling each other's functions, declared in one shared header: a cycle, though neither includes the
    other's header; a function only the unit itself declares (a static helper) makes no dependency."""
    layers = _script("import_layers")
    (tmp_path / "shared.hpp").write_text("int device_count();\nvoid register_streams(int module);\n")
    (tmp_path / "runtime_pybind.cpp").write_text(
        '#include "shared.hpp"\nint device_count() {\n  return 1;\n}\nvoid module() { register_streams(0); }\n')
    (tmp_path / "streams.cpp").write_text(
        '#include "shared.hpp"\nstatic int helper() { return 2; }\n'
        'void register_streams(int module) {\n  helper();\n  device_count();  // uses the other unit\n}\n')
    graph = layers.native_unit_graph(tmp_path)
    assert graph == {"runtime_pybind": {"streams"}, "streams": {"runtime_pybind"}}
    assert layers.cycles(graph) == [["runtime_pybind", "streams"]]
    (tmp_path / "devices.cpp").write_text('#include "shared.hpp"\nint device_count() {\n  return 1;\n}\n')
    (tmp_path / "runtime_pybind.cpp").write_text('#include "shared.hpp"\nvoid module() { register_streams(0); }\n')
    graph = layers.native_unit_graph(tmp_path)
    assert graph == {"devices": set(), "runtime_pybind": {"streams"}, "streams": {"devices"}}
    assert layers.cycles(graph) == []


def test_compare_test_ids_counts_ids_per_function_and_reads_gpu_logs(tmp_path):
    """scripts/compare_test_ids.py (issue 25's same-counts proof): ids grouped by file and test function (the
    parameters stripped), and a GPU run's per-file totals summed over shards from pytest's last summary line."""
    compare = _script("compare_test_ids")
    ids = ["tests/test_a.py::test_x[float16]", "tests/test_a.py::test_x[float32]", "tests/test_a.py::Cls::test_y",
           "tests/test_b.py::test_z"]
    assert compare.by_function(ids) == {"tests/test_a.py": {"test_x": 2, "Cls::test_y": 1},
                                        "tests/test_b.py": {"test_z": 1}}
    (tmp_path / "test_a.0.log").write_text("....\n3 passed, 1 skipped, 2 deselected in 1.0s\n")
    (tmp_path / "test_a.1.log").write_text("F.\nFAILED x\n1 failed, 1 passed, 1 xfailed, 4 warnings in 2.0s\n")
    (tmp_path / "test_b.log").write_text("1 error in 0.1s\n")
    assert compare.gpu_log_totals([tmp_path]) == {"tests/test_a.py": 7, "tests/test_b.py": 1}
