"""The extras add up: `pip install ".[test]"` brings every module the tests import (or they skip naming their extra),
and every optional dependency the library imports is declared in the extra its ImportError names.

scripts/check_extras.sh runs this file in a fresh venv holding only the project's dependencies and its test extra
(CI does), where a module missing from the extra fails here instead of in the middle of the suite."""
from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

from graph_executor_v2 import _optional

tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml")

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = pathlib.Path(__file__).resolve().parent
# Import names whose distribution has another name.
DISTRIBUTIONS = {"sklearn": "scikit-learn", "skbuild": "scikit-build-core", "scikit_build_core": "scikit-build-core"}


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]


def _names(requirements) -> set[str]:
    """Distribution names of requirement strings ("onnx>=1.14" -> "onnx"), lowercased."""
    return {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower() for requirement in requirements}


def _imported_modules(path: pathlib.Path, include_guarded: bool = True) -> set[str]:
    """Top-level modules a file imports anywhere in it (module level or inside functions); ``include_guarded=False``
    leaves out the imports inside a ``try`` that catches ImportError (optional by construction)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = set()
    if not include_guarded:
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any("ImportError" in ast.unparse(h.type or ast.Name("")) or
                                                 "ModuleNotFoundError" in ast.unparse(h.type or ast.Name(""))
                                                 for h in node.handlers):
                skipped.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    modules = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules


def _third_party_imports() -> dict[str, set[str]]:
    """Module -> the test files importing it, leaving out the standard library, GE2 and the tests' own helpers."""
    local = {path.stem for path in TESTS.glob("*.py")}
    found: dict[str, set[str]] = {}
    for path in sorted(TESTS.glob("*.py")):
        for module in _imported_modules(path):
            if module in sys.stdlib_module_names or module in local or module == "graph_executor_v2":
                continue
            found.setdefault(module, set()).add(path.name)
    return found


def test_the_test_extra_carries_what_the_tests_import():
    """A test imports a third-party module with a plain import only when the test extra (or a core dependency)
    installs it; anything else goes through pytest.importorskip, whose skip names the module."""
    declared = _names(_project()["dependencies"]) | _names(_project()["optional-dependencies"]["test"])
    for module, files in _third_party_imports().items():
        distribution = DISTRIBUTIONS.get(module, module).lower().replace("_", "-")
        assert distribution in {name.replace("_", "-") for name in declared}, (
            f"{sorted(files)} import {module}, which neither the dependencies nor the test extra declare: add "
            f"{distribution} to the test extra in pyproject.toml, or use pytest.importorskip")
        assert importlib.util.find_spec(module) is not None, (
            f"{sorted(files)} import {module}, declared but not installed: pip install '.[test]'")


def test_the_test_extra_carries_the_optional_packages_the_tests_exercise():
    """The tests train with progress bars and checkpoints, load the digits, plot and import ONNX: the test extra
    holds the train, plot and onnx extras, which must be installed where the tests run; torch stays optional."""
    extras = _project()["optional-dependencies"]
    test = _names(extras["test"])
    for extra in ("train", "plot", "onnx"):
        assert _names(extras[extra]) <= test, f"the test extra lacks {sorted(_names(extras[extra]) - test)} of [{extra}]"
    for module, (extra, distribution) in _optional.EXTRAS.items():
        if extra != "torch":
            assert importlib.util.find_spec(module) is not None, f"{module} ([{extra}]) is not installed"


def test_every_optional_dependency_is_declared_in_the_extra_its_error_names():
    extras = _project()["optional-dependencies"]
    for module, (extra, distribution) in _optional.EXTRAS.items():
        assert extra in extras, f"{module}: the error names [{extra}], which pyproject.toml does not declare"
        assert distribution.lower() in _names(extras[extra]), f"[{extra}] does not install {distribution} ({module})"


def test_the_library_imports_optional_packages_only_through_require():
    """A plain import of an optional package in the library would fail with ModuleNotFoundError, naming no extra
    (an import inside ``try: ... except ImportError`` is optional on purpose and allowed; a submodule's import in a
    file that requires the package first is too)."""
    package = ROOT / "python" / "graph_executor_v2"
    for path in sorted(package.rglob("*.py")):
        if path.name == "_optional.py":
            continue
        source = path.read_text()
        for module in _imported_modules(path, include_guarded=False) & set(_optional.EXTRAS):
            # Submodules may be imported once the file has required the package itself.
            assert f'require("{module}' in source, (
                f"{path.relative_to(ROOT)} imports {module} without _optional.require, whose error names the extra")


def test_a_test_skipped_for_a_missing_optional_package_names_its_extra(tmp_path):
    """GE2's pytest plugin adds the extra to pytest.importorskip's reason, in a test and at a module's top."""
    (tmp_path / "conftest.py").write_text('import sys\nsys.modules["torch"] = None  # as if not installed\n'
                                          'pytest_plugins = ("graph_executor_v2.pytest_plugin",)\n')
    (tmp_path / "test_in_a_test.py").write_text('import pytest\n\ndef test_x():\n    pytest.importorskip("torch")\n')
    (tmp_path / "test_at_the_top.py").write_text('import pytest\ntorch = pytest.importorskip("torch")\n\n'
                                                 'def test_y():\n    pass\n')
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                            cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skips) == 2 and all("(pip install graph_executor_v2[torch])" in line for line in skips), \
        result.stdout[-2000:]
