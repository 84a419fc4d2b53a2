"""``python -m graph_executor_v2 new-op NAME``: writes a new op that builds and passes its tests as generated.

The op computes ``y = alpha * (sum of its inputs)``, elementwise: a simple, correct kernel to replace. In a GE2
checkout (``root``) it writes
    backends/cuda/ops/NAME/{api.hpp, launcher.cu, kernels/NAME.cu, README.md}
    src/bindings/NAME_pybind.cpp
    python/graph_executor_v2/ops/NAME.py     OpDef + NAME_backward, inference, float64 reference, candidate, grad
                                             rule and the op face (forward_numpy, forward, backward_numpy,
                                             backward, kernels)
    tests/test_NAME.py                       CPU tests and gpu-marked tests against the reference
    benchmarks/op_cases/NAME.py              GE2 vs PyTorch
and adds ``add_standalone_op(NAME)`` to CMakeLists.txt and ``from . import NAME`` to ops/__init__.py. Out of tree
(``out_of_tree``) it writes the same op into its own project (CMakeLists.txt with find_package(graph_executor_v2),
pyproject.toml, python/<package>/, tests/), creating the project files the first time, so that
``pip install --no-build-isolation DIR`` builds it against the installed GE2.
"""
from __future__ import annotations

import ast
import keyword
import re
from dataclasses import dataclass
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).parent / "templates" / "new_op"
IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*$")
# C++ keywords and names the generated code itself uses: an op or input named like one would not compile or would
# shadow a local.
RESERVED = frozenset("""
    alignas alignof and asm auto bitand bitor bool break case catch char class compl const constexpr continue
    decltype default delete do double else enum explicit export extern false float for friend goto if inline int
    long mutable namespace new noexcept not nullptr operator or private protected public register return short
    signed sizeof static struct switch template this throw true try typedef typeid typename union unsigned using
    virtual void volatile while xor
    alpha args count device dtype dy earlier first given grad grad_view grad_views grads i index kernel m name named
    np op out release requested shape stream stride torch view views y y_view
""".split())


@dataclass(frozen=True)
class Layout:
    """Where the files of an op go, relative to the project root."""

    package: str  # the Python package holding the op module and its native module
    op_module_dir: str  # where ops/<name>.py goes
    in_tree: bool

    def files(self, name: str) -> dict[str, str]:
        files = {
            "api.hpp.tmpl": f"backends/cuda/ops/{name}/api.hpp",
            "launcher.cu.tmpl": f"backends/cuda/ops/{name}/launcher.cu",
            "kernel.cu.tmpl": f"backends/cuda/ops/{name}/kernels/{name}.cu",
            "README.md.tmpl": f"backends/cuda/ops/{name}/README.md",
            "pybind.cpp.tmpl": f"src/bindings/{name}_pybind.cpp",
            "op.py.tmpl": f"{self.op_module_dir}/{name}.py",
            "test_op.py.tmpl": f"tests/test_{name}.py",
        }
        if self.in_tree:  # benchmarks/op_cases run through GE2's benchmarks/bench_ops.py
            files["bench_case.py.tmpl"] = f"benchmarks/op_cases/{name}.py"
        return files


def check_name(value: str, argument: str) -> str:
    if not IDENTIFIER.match(value) or keyword.iskeyword(value) or value in RESERVED:
        raise ValueError(f"{argument}: expected a lowercase identifier ([a-z][a-z0-9_]*) that is not a Python or C++ "
                         f"keyword nor one of the generated code's own names, got {value!r}")
    return value


def check_inputs(inputs: list[str]) -> list[str]:
    if not inputs:
        raise ValueError("inputs: expected at least one input name")
    for value in inputs:
        check_name(value, "inputs")
    names = list(inputs) + ["d" + value for value in inputs]
    duplicates = sorted({value for value in names if names.count(value) > 1})
    if duplicates:
        raise ValueError(f"inputs: names and their gradients (d<input>) must be distinct, got {', '.join(duplicates)} "
                         f"twice in {', '.join(inputs)}")
    return list(inputs)


def substitutions(name: str, inputs: list[str], package: str, in_tree: bool) -> dict[str, str]:
    grads = ["d" + value for value in inputs]
    formula = f"y = alpha * ({' + '.join(inputs)})" if len(inputs) > 1 else f"y = alpha * {inputs[0]}"
    if in_tree:
        imports = ("from .. import _native, selection\nfrom .. import device as _device\n"
                   "from ..dtypes import FLOAT_DTYPES\nfrom ..ir.types import TensorType\nfrom . import _layout\n"
                   "from ._base import (Attr, Candidate, Input, OpDef, Problem, Sample, as_float64, in_ptr, "
                   "native_launch, out_ptr,\n                    register, sample_array, stream_arg, table_candidate)\n"
                   "from ._face import Face\nfrom ._grad import register_backward")
        op_import = f"from graph_executor_v2.ops import {name} as op"
    else:
        imports = ("from graph_executor_v2 import _native, selection\nfrom graph_executor_v2 import device as _device\n"
                   "from graph_executor_v2.dtypes import FLOAT_DTYPES\n"
                   "from graph_executor_v2.ir.types import TensorType\n"
                   "from graph_executor_v2.ops import (Attr, Candidate, Face, Input, OpDef, Problem, Sample, _layout, "
                   "in_ptr,\n                                   native_launch, out_ptr, register, register_backward, "
                   "sample_array, stream_arg,\n                                   table_candidate)\n"
                   "from graph_executor_v2.ops._base import as_float64")
        op_import = f"from {package} import {name} as op"
    grad_copies = ["grad"] + ["grad.copy()"] * (len(inputs) - 1)
    return {
        "name": name,
        "package": package,
        "formula": formula,
        "count": str(len(inputs)),
        "first": inputs[0],
        "params": ", ".join(inputs),
        "params_tuple": ", ".join(inputs) + ("," if len(inputs) == 1 else ""),
        "inputs_tuple": ", ".join(f'"{value}"' for value in inputs) + ("," if len(inputs) == 1 else ""),
        "signature": ", ".join(inputs) + ", alpha=1.0",
        "grad_names": ", ".join(grads),
        "imports": imports,
        "op_import": op_import,
        "reference_sum": " + ".join(f"as_float64({value})" for value in inputs),
        "reference_grads": ", ".join(grad_copies) + ("," if len(inputs) == 1 else ""),
        "grad_list": "list(grads)" if len(inputs) > 1 else "[grads]",
        "torch_sum": " + ".join(inputs),
        "input_fields": "\n".join(f"  const void* {value} = nullptr;" for value in inputs),
        "grad_fields": "\n".join(f"  void* {grad} = nullptr;  // nullptr: not asked for" for grad in grads),
        "check_inputs": "\n".join(f'  check_pointer(args.{value}, "{value}");' for value in inputs),
        "kernel_inputs": ", ".join(f"const T* __restrict__ {value}" for value in inputs),
        "kernel_grads": ", ".join(f"T* __restrict__ {grad}" for grad in grads),
        "kernel_sum": " + ".join(f"to_float({value}[i])" for value in inputs),
        "kernel_grad_stores": "\n".join(f"    if ({grad} != nullptr) {grad}[i] = grad;" for grad in grads),
        "launch_inputs": ", ".join(f"static_cast<const scalar_t*>(args.{value})" for value in inputs),
        "launch_grads": ", ".join(f"static_cast<scalar_t*>(args.{grad})" for grad in grads),
        "binding_input_params": ", ".join(f"std::uintptr_t {value}" for value in inputs),
        "binding_grad_params": ", ".join(f"std::uintptr_t {grad}" for grad in grads),
        "binding_input_assign": "\n".join(f"        args.{value} = as_pointer({value});" for value in inputs),
        "binding_grad_assign": "\n".join(f"        args.{grad} = as_pointer({grad});" for grad in grads),
        "binding_input_names": ", ".join(f'py::arg("{value}")' for value in inputs),
        "binding_grad_names": ", ".join(f'py::arg("{grad}")' for grad in grads),
    }


def render(template: str, values: dict[str, str]) -> str:
    if template == "test_op.py.tmpl":  # ops with several inputs also test that the inputs must agree
        several = int(values["count"]) > 1
        values = dict(values, mismatch_test=render("test_mismatch.py.tmpl", values) if several else "")
    return Template((TEMPLATES / template).read_text(encoding="utf-8")).substitute(values)


def new_op(name: str, inputs: list[str] | None = None, root: str | Path = ".", out_of_tree: str | Path | None = None,
           package: str | None = None) -> list[Path]:
    """Writes the op ``name`` (into the GE2 checkout ``root``, or the project ``out_of_tree``); returns the files
    written or changed. Raises ValueError (naming the argument) before writing anything when a name is bad or taken,
    or when a file to be written exists."""
    from .ops import OPS

    check_name(name, "name")
    inputs = check_inputs(["x"] if inputs is None else inputs)
    for op in (name, f"{name}_backward"):
        if op in OPS:
            raise ValueError(f"name: GE2 already has an op '{op}'")
    if out_of_tree is None:
        project = Path(root)
        if not (project / "CMakeLists.txt").is_file() or not (project / "python/graph_executor_v2/ops").is_dir():
            raise ValueError(f"root: expected a GE2 source checkout (CMakeLists.txt, python/graph_executor_v2/ops), "
                             f"got {project.resolve()}")
        layout = Layout("graph_executor_v2", "python/graph_executor_v2/ops", in_tree=True)
    else:
        project = Path(out_of_tree)
        existing_packages = sorted(init.parent.name for init in (project / "python").glob("*/__init__.py"))
        if package is None and len(existing_packages) == 1:  # another op for the project's package
            package = existing_packages[0]
        package = check_name(package or f"ge2_{name}", "package")
        layout = Layout(package, f"python/{package}", in_tree=False)
    targets = {template: project / path for template, path in layout.files(name).items()}
    existing = [str(path) for path in targets.values() if path.exists()]
    if existing:
        raise ValueError(f"name: op '{name}' would overwrite {', '.join(existing)}")

    values = substitutions(name, inputs, layout.package, layout.in_tree)
    contents = {path: render(template, values) for template, path in targets.items()}  # all or nothing
    written = []
    for path, content in contents.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        written.append(path)
    if layout.in_tree:
        written.append(_add_cmake_line(project / "CMakeLists.txt", f"add_standalone_op({name})"))
        written.append(_add_import(project / "python/graph_executor_v2/ops/__init__.py", name))
    else:
        project_files = {"CMakeLists.txt.tmpl": project / "CMakeLists.txt",
                         "pyproject.toml.tmpl": project / "pyproject.toml",
                         "package_init.py.tmpl": project / layout.op_module_dir / "__init__.py",
                         "conftest.py.tmpl": project / "tests/conftest.py",
                         "gitignore.tmpl": project / ".gitignore"}
        for template, path in project_files.items():
            if not path.exists():
                path.write_text(render(template, values), encoding="utf-8")
                written.append(path)
        written.append(_add_cmake_line(project / "CMakeLists.txt", f"add_standalone_op({name} PACKAGE {package})"))
        init = project / layout.op_module_dir / "__init__.py"
        init.write_text(init.read_text(encoding="utf-8") + f"from . import {name}\n", encoding="utf-8")
        written.append(init)
    return list(dict.fromkeys(written))  # a project file created and then extended is listed once


def _add_cmake_line(path: Path, line: str) -> Path:
    """``line`` after the last add_standalone_op line (at the end when there is none)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    last = max((i for i, text in enumerate(lines) if text.startswith("add_standalone_op(")), default=len(lines) - 1)
    lines.insert(last + 1, line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _add_import(path: Path, name: str) -> Path:
    """``from . import <name>`` after the last such line of ops/__init__.py, and <name> in its ``__all__``."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("from . import "))
    lines.insert(last + 1, f"from . import {name}")
    text = "\n".join(lines) + "\n"
    assignment = next(node for node in ast.parse(text).body if isinstance(node, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets))
    names = ast.literal_eval(assignment.value) + [name]
    lines = text.splitlines()
    lines[assignment.lineno - 1:assignment.end_lineno] = _wrapped_list("__all__ = [", names)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _wrapped_list(opening: str, names: list[str], width: int = 120) -> list[str]:
    lines, current = [], opening
    for index, item in enumerate(names):
        piece = f'"{item}"' + ("]" if index == len(names) - 1 else ",")
        if len(current) + len(piece) + 1 > width and current.strip() != opening.strip():
            lines.append(current.rstrip())
            current = " " * len(opening)
        current += piece + " "
    lines.append(current.rstrip())
    return lines
