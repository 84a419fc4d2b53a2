"""Shared test set-up: the ``gpu`` and ``slow`` markers and the fixtures (``rng``, ``to_device``, ``poisoned``) live
in ``graph_executor_v2.pytest_plugin``, which out-of-tree op packages use too."""
pytest_plugins = ("graph_executor_v2.pytest_plugin",)
