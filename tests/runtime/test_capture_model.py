# SPDX-License-Identifier: MIT
"""The model-based test of cudamem's background work during a capture
another library began (tests/helpers/capture_model.py), in a process of
its own per memory manager: seeded random programs of recorded copies
between drops of arrays, streams and events, garbage collections and
flushes, each capture required to end valid and its replays to match a
NumPy model.  CUDAMEM_MODEL_PROGRAMS sets the number (1000 on the
simulator, 200 on a GPU).  A failure prints the seed and the program."""

import os
import subprocess
import sys

import pytest

from helpers import ROOT, TESTS, environ
from helpers.isolation import SIMULATOR

# Each test only runs children (tests/helpers/ahead.py).
pytestmark = pytest.mark.ahead


@pytest.mark.slow
@pytest.mark.parametrize("env", [{"CUDAMEM_MEMORY_MANAGER": "default"},
                                 {"CUDAMEM_MEMORY_MANAGER": "pool",
                                  "CUDAMEM_POOL_VMM": "1"},
                                 {"CUDAMEM_MEMORY_MANAGER": "pool",
                                  "CUDAMEM_POOL_VMM": "0"},
                                 {"CUDAMEM_MEMORY_MANAGER": "async"}],
                         ids=["default", "pool", "pool_segments", "async"])
def test_random_programs_beside_another_librarys_capture(env):
    n = int(os.environ.get("CUDAMEM_MODEL_PROGRAMS",
                           "1000" if SIMULATOR else "200"))
    e = dict(environ())
    e.update(env)
    e["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS), str(ROOT)]
        + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    p = subprocess.run(
        [sys.executable, str(TESTS / "helpers" / "capture_model.py"),
         str(n)], env=e, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert "%d programs matched" % n in p.stdout
