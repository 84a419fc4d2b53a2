"""graph_executor_v2 (GE2): per-op CUDA kernels and a graph compiler (ExecutorV2) for NVIDIA GPUs."""
from . import device, dtypes, ir, ops, testing
from .device import device_count, is_available

__version__ = "0.1.0"

__all__ = ["device", "dtypes", "ir", "ops", "testing", "device_count", "is_available", "__version__"]
