"""Test set-up for GE2 and for out-of-tree op packages: the ``gpu`` marker, fresh random generators, and device
helpers. A ``conftest.py`` loads it with ``pytest_plugins = ("graph_executor_v2.pytest_plugin",)`` (GE2's
tests/conftest.py does).

GPU tests are skipped with a reason on a machine with no GPU; ``--require-gpu`` or ``GE2_REQUIRE_GPU=1`` turns
those skips into failures (the GPU suite must never pass by skipping). A test skipped by ``pytest.importorskip`` of
an optional package says which extra installs it.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

import graph_executor_v2 as ge2
from graph_executor_v2._optional import EXTRAS


def pytest_addoption(parser):
    parser.addoption("--require-gpu", action="store_true", help="fail, rather than skip, tests marked gpu")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (skipped without one unless GE2_REQUIRE_GPU=1 or "
                            "--require-gpu)")
    config.addinivalue_line("markers", "slow: builds native code with CMake and nvcc (minutes); CI runs it, "
                            "-m 'not slow' leaves it out")


def _gpu_required(config) -> bool:
    return config.getoption("--require-gpu") or os.environ.get("GE2_REQUIRE_GPU") == "1"


def pytest_collection_modifyitems(config, items):
    if ge2.device_count() > 0:
        return
    if _gpu_required(config):
        failure = pytest.mark.usefixtures("_fail_without_gpu")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(failure)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is available on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _name_the_extra(report) -> None:
    """A skip by ``pytest.importorskip`` of a package an extra installs: its reason names the extra too."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return
    path, line, reason = report.longrepr
    match = re.search(r"could not import '([\w.]+)'", reason)
    if match and match.group(1).split(".")[0] in EXTRAS:
        extra, _ = EXTRAS[match.group(1).split(".")[0]]
        report.longrepr = (path, line, f"{reason} (pip install graph_executor_v2[{extra}])")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _name_the_extra(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _name_the_extra(outcome.get_result())


@pytest.fixture
def _fail_without_gpu():
    pytest.fail("GPU tests are required (--require-gpu / GE2_REQUIRE_GPU=1) but no CUDA GPU is available")


@pytest.fixture
def rng(request):
    """A fresh generator per test; the seed is printed on failure so a run can be repeated."""
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


@pytest.fixture
def to_device():
    """Host array -> DeviceArray of the same shape (0-d stays 0-d; from_numpy copies non-contiguous input)."""
    return ge2.device.runtime().DeviceArray.from_numpy


@pytest.fixture
def poisoned():
    """A NaN-filled DeviceArray of a shape and dtype: an output a kernel must overwrite completely."""
    runtime = ge2.device.runtime()

    def make(shape, dtype):
        array = runtime.DeviceArray.empty(list(shape), dtype)
        array.poison()
        return array

    return make
