"""Optional dependencies: imported where they are used; a missing one is an ImportError naming the extra that
installs it (pyproject.toml's optional-dependencies; tests/test_extras.py keeps the two in step)."""
from __future__ import annotations

import importlib

# top-level module -> (the extra that installs it, its distribution on PyPI)
EXTRAS = {
    "safetensors": ("train", "safetensors"),
    "sklearn": ("train", "scikit-learn"),
    "tqdm": ("train", "tqdm"),
    "matplotlib": ("plot", "matplotlib"),
    "onnx": ("onnx", "onnx"),
    "onnxruntime": ("onnx", "onnxruntime"),
    "torch": ("torch", "torch"),
}


def require(module: str, needed_by: str):
    """``module`` imported (a dotted name is fine), or ImportError saying what needs it and the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        top = module.split(".")[0]
        extra, distribution = EXTRAS[top]
        raise ImportError(f"{needed_by} needs {distribution}, which is not installed: pip install "
                          f"graph_executor_v2[{extra}] (or pip install {distribution})") from error
