"""Loads GE2's native modules (``_runtime``, ``_ops_<op>``), and those of out-of-tree op packages, with an error that
says how to build them."""
from __future__ import annotations

import importlib
from types import ModuleType

_loaded: dict[str, ModuleType] = {}


def load(name: str, package: str = "graph_executor_v2") -> ModuleType:
    """Imports ``<package>.<name>``; raises ImportError naming the module and the build command."""
    qualified = f"{package}.{name}"
    module = _loaded.get(qualified)
    if module is not None:
        return module
    try:
        module = importlib.import_module(qualified)
    except ImportError as error:
        raise ImportError(
            f"{package}: native module '{name}' is not built ({error}). Build with "
            "`pip install -e .` or `cmake -S . -B build && cmake --build build` (see README.md)."
        ) from error
    _loaded[qualified] = module
    return module


def is_built(name: str, package: str = "graph_executor_v2") -> bool:
    try:
        load(name, package)
    except ImportError:
        return False
    return True
