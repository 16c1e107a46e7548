# SPDX-License-Identifier: MIT
"""The validation suite's backend (the CUDA driver when one initialises,
else the simulator), its markers and its report header."""

import pytest

from cudamem.tests._backend import choose_backend

SIMULATOR = choose_backend()

import cudamem  # noqa: E402
from cudamem.tests._util import device_line  # noqa: E402


def pytest_configure(config):
    for line in (
        "gpu: needs a real GPU (skipped on the simulator)",
        "multi_gpu: needs two or more devices",
    ):
        config.addinivalue_line("markers", line)


def pytest_report_header(config):
    return device_line()


def pytest_collection_modifyitems(config, items):
    ndev = None
    for item in items:
        if SIMULATOR and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason="needs a real GPU"))
        if item.get_closest_marker("multi_gpu"):
            if ndev is None:
                ndev = len(cudamem.gpus) if cudamem.is_available() else 0
            if ndev < 2:
                item.add_marker(pytest.mark.skip(
                    reason="needs 2 or more devices (%d here)" % ndev))


@pytest.fixture(scope="session", autouse=True)
def _backend():
    """Every test needs a working backend: without one the session stops
    with the reason instead of failing each test alike."""
    err = cudamem.cuda_error()
    if err is not None:
        pytest.exit("cudamem has no backend here: %s" % err, returncode=1)


@pytest.fixture
def stream():
    s = cudamem.stream()
    yield s
    s.synchronize()
