"""Reports the imports of graph_executor_v2 that point from a lower layer to a higher one, and the import cycles;
then the dependency cycles between the units (.cpp files) of the native runtime, src/runtime.

    python scripts/import_layers.py [--verbose]

Every import counts, also one inside a function (it is still a dependency, only a deferred one). A module's layer is
the LAYERS entry of its first package level below graph_executor_v2; an import from a lower layer into a higher one
is "upward". Cycles are the strongly connected groups of modules (more than one module, or a module importing
itself). Exit status 0 always: this is a report, the numbers go into the closing note of a change.

Native units: a unit depends on another when it names a function or class that the other defines and a header of
the directory declares (so a unit's own helpers do not count), and when it includes the other's header (X.hpp of
X.cpp). Read with regular expressions, which this code style makes enough: one declaration per line, and the
definitions at namespace scope start in column 0.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGE = "graph_executor_v2"
ROOT = Path(__file__).resolve().parents[1] / "python" / PACKAGE
NATIVE_UNITS = Path(__file__).resolve().parents[1] / "src" / "runtime"

# Lowest first. Modules of one layer may import each other; a module imports only its own layer and those below.
LAYERS = [
    ["dtypes", "_optional", "_suggest", "_help"],          # dtype names; optional imports, did-you-mean, CLI help
    ["ir"],                                               # tensor types, the op schema, the graph: no device
    ["_native", "device"],                                # the native runtime and device arrays
    ["selection"],                                        # the kernel selector
    ["ops", "codegen"],                                    # op definitions, kernels' candidates and faces; generated kernels
    ["autograd", "passes"],                               # graph transformations
    ["runtime"],                                          # registry, planner, executor, backends
    ["distributed", "frontend", "nn", "models"],          # what builds on compiled graphs
    ["train"],                                            # the Trainer, losses, optimizers
    ["apps", "zoo", "datasets", "scaffold", "testing", "pytest_plugin", "__main__", "templates", "__init__"],
]
LAYER_OF = {name: index for index, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def collect_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(ROOT.rglob("*.py")) if "templates" not in path.parts}


def resolve(importer: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a (possibly relative) import's target."""
    if level == 0:
        return target or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that ``name`` imports, anywhere in its source."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = resolve(name, is_package, node.level, node.module)
            # "from package import submodule" imports the submodule; "from module import name" the module.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # "import a.b.c" of a name inside a module
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != name:
                found.add(target)
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    return LAYER_OF.get(key, len(LAYERS))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, result, counter = {}, {}, set(), [], [], [0]

    def visit(root):
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        result.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return result


def _without_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.S)


def native_unit_graph(directory: Path) -> dict[str, set[str]]:
    """Each unit (``<name>.cpp``) of ``directory`` -> the units it depends on (see the module's docstring)."""
    units = {path.stem: _without_comments(path.read_text()) for path in sorted(directory.glob("*.cpp"))}
    declared = set()
    for header in directory.glob("*.hpp"):
        text = _without_comments(header.read_text())
        declared |= set(re.findall(r"^\s*(?:[\w:<>*&]+\s+)+(\w+)\s*\([^;{]*\)\s*;", text, flags=re.M))
        declared |= set(re.findall(r"^\s*class\s+(\w+)", text, flags=re.M))
    owner = {}
    for unit, text in units.items():
        for name in declared:
            if re.search(rf"^(?!\s)[^;{{}}()]*?\b(?:\w+::)*{name}\s*\([^;{{]*\)\s*(?:const\s*)?\{{", text,
                         flags=re.M):
                owner[name] = unit
    graph = {unit: set() for unit in units}
    for unit, text in units.items():
        graph[unit] |= {owner[name] for name in owner if owner[name] != unit and re.search(rf"\b{name}\b", text)}
        graph[unit] |= {header for header in re.findall(r'^#include "(\w+)\.hpp"', text, flags=re.M)
                        if header in units and header != unit}
    return graph


def main(argv: list[str]) -> int:
    verbose = "--verbose" in argv
    modules = collect_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    # A package's __init__ re-exporting its own submodules is not a layering question: only count the imports that
    # leave a package's own tree downward-to-upward.
    upward = sorted((source, target) for source, targets in graph.items() for target in targets
                    if layer(source) < layer(target))
    found_cycles = cycles(graph)
    print(f"{len(modules)} modules, {sum(map(len, graph.values()))} imports")
    print(f"upward imports: {len(upward)}")
    for source, target in upward if verbose else []:
        print(f"  {source} -> {target}")
    print(f"import cycles: {len(found_cycles)} ({sum(map(len, found_cycles))} modules)")
    for component in found_cycles if verbose else []:
        print("  " + " <-> ".join(name.removeprefix(PACKAGE + ".") for name in component))
    units = native_unit_graph(NATIVE_UNITS)
    unit_cycles = cycles(units)
    print(f"native units ({NATIVE_UNITS.relative_to(NATIVE_UNITS.parents[1])}): {len(units)} units, "
          f"{sum(map(len, units.values()))} dependencies")
    for unit, uses in sorted(units.items()) if verbose else []:
        print(f"  {unit}.cpp -> {', '.join(f'{used}.cpp' for used in sorted(uses)) or '(none)'}")
    print(f"native unit cycles: {len(unit_cycles)}")
    for component in unit_cycles if verbose else []:
        print("  " + " <-> ".join(f"{unit}.cpp" for unit in component))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
