"""Shared test set-up: the ``gpu`` marker and fixtures live in ``graph_executor_v2.pytest_plugin``, which
out-of-tree op packages use too."""
from graph_executor_v2.pytest_plugin import (  # noqa: F401  (pytest finds hooks and fixtures by name here)
    _fail_without_gpu, poisoned, pytest_addoption, pytest_collection_modifyitems, pytest_configure, rng, to_device)
