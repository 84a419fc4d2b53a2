"""Loads GE2's native modules (``_runtime``, ``_ops_<op>``) with an error that says how to build them."""
from __future__ import annotations

import importlib
from types import ModuleType

_loaded: dict[str, ModuleType] = {}


def load(name: str) -> ModuleType:
    """Imports ``graph_executor_v2.<name>``; raises ImportError naming the module and the build command."""
    module = _loaded.get(name)
    if module is not None:
        return module
    try:
        module = importlib.import_module(f"graph_executor_v2.{name}")
    except ImportError as error:
        raise ImportError(
            f"graph_executor_v2: native module '{name}' is not built ({error}). Build with "
            "`pip install -e .` or `cmake -S . -B build && cmake --build build` (see README.md)."
        ) from error
    _loaded[name] = module
    return module


def is_built(name: str) -> bool:
    try:
        load(name)
    except ImportError:
        return False
    return True
