"""GE2's test set-up: the ``gpu`` marker (skipped with no GPU, required with GE2_REQUIRE_GPU=1) and the fixtures
``rng``, ``to_device``, ``poisoned``."""
pytest_plugins = ("graph_executor_v2.pytest_plugin",)
