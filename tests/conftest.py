"""Shared test set-up: the ``gpu`` and ``slow`` markers and the fixtures (``rng``, ``to_device``, ``poisoned``) live
in ``graph_executor_v2.pytest_plugin``, which out-of-tree op packages use too."""
pytest_plugins = ("graph_executor_v2.pytest_plugin",)

# onnxruntime first: imported after cuDNN and PyTorch's libraries are loaded (a GPU test earlier in the same
# process), its native module crashed the process on the H200 machine (test_conv_epilogue, run in shards).
try:
    import onnxruntime  # noqa: F401
except ImportError:
    pass
