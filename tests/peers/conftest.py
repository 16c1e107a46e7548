# SPDX-License-Identifier: MIT
"""The CuPy and PyTorch differential programs run for minutes on a GPU:
they run where CUDAMEM_PEERS=1 is set (``.ci/gpu``'s ``peers`` part sets
it), and skip otherwise, saying so."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("CUDAMEM_PEERS") == "1":
        return
    here = os.path.dirname(os.path.abspath(__file__))
    skip = pytest.mark.skip(
        reason="the CuPy and PyTorch differential programs run with "
               "CUDAMEM_PEERS=1 (.ci/gpu's peers part sets it)")
    for item in items:
        if str(item.fspath).startswith(here + os.sep):
            item.add_marker(skip)
