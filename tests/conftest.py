"""Shared test set-up: the ``gpu`` and ``slow`` markers and the fixtures (``rng``, ``to_device``, ``poisoned``) live
in ``graph_executor_v2.pytest_plugin``, which out-of-tree op packages use too."""
import os

pytest_plugins = ("graph_executor_v2.pytest_plugin",)

# onnxruntime first: imported after cuDNN and PyTorch's libraries are loaded (a GPU test earlier in the same
# process), its native module crashed the process on the H200 machine (test_conv_epilogue, run in shards).
try:
    import onnxruntime  # noqa: F401
except ImportError:
    pass


def pytest_collection_modifyitems(config, items):
    """GE2_SHARD=i/n keeps every n-th collected test from the i-th on: scripts/gpu_test_files.sh splits its longest
    files across processes this way. (It used to pass each shard's node ids on the command line; those shards of
    test_conv_epilogue crashed on the H200 with an empty log, while the same file run whole passed.)"""
    shard = os.environ.get("GE2_SHARD")
    if not shard:
        return
    index, count = (int(part) for part in shard.split("/"))
    kept = [item for position, item in enumerate(items) if position % count == index]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept
