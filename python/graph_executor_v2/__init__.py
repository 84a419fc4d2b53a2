"""graph_executor_v2 (GE2): per-op CUDA kernels and a graph compiler (ExecutorV2) for NVIDIA GPUs."""
from . import device, dtypes, ir, ops, passes, runtime, testing
from . import autograd, train
from .device import device_count, is_available
from .runtime import ExecutorV2

__version__ = "0.1.0"


def cmake_dir() -> str:
    """The directory of ``graph_executor_v2Config.cmake``, for out-of-tree ops:
    ``cmake -Dgraph_executor_v2_DIR=$(python -c "import graph_executor_v2; print(graph_executor_v2.cmake_dir())")``.

    An installed package carries it in ``graph_executor_v2/cmake`` (with the shim headers in ``include``); a source
    checkout (``PYTHONPATH=python`` or an editable install) uses the repository's ``cmake/``."""
    from pathlib import Path

    package_dirs = [Path(directory) for directory in __path__]
    for directory in package_dirs + [Path(__file__).resolve().parents[2]]:
        if (directory / "cmake" / "graph_executor_v2Config.cmake").is_file():
            return str(directory / "cmake")
    raise FileNotFoundError("graph_executor_v2: graph_executor_v2Config.cmake is neither installed with the package "
                            f"({', '.join(map(str, package_dirs))}) nor in a source checkout around it")


__all__ = ["ExecutorV2", "autograd", "cmake_dir", "device", "dtypes", "ir", "ops", "passes", "runtime", "testing",
           "train",
           "device_count", "is_available", "__version__"]
