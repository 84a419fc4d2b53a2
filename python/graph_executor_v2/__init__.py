"""graph_executor_v2 (GE2): per-op CUDA kernels and a graph compiler (ExecutorV2) for NVIDIA GPUs."""
from . import device, dtypes, ir, ops, passes, runtime, testing
from . import autograd, train
from .device import device_count, is_available
from .runtime import ExecutorV2

__version__ = "0.1.0"

__all__ = ["ExecutorV2", "autograd", "device", "dtypes", "ir", "ops", "passes", "runtime", "testing", "train",
           "device_count", "is_available", "__version__"]
