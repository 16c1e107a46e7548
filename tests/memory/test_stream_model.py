# SPDX-License-Identifier: MIT
"""The model-based stream test (tests/helpers/stream_model.py) under
every kind of memory manager, each in a process of its own: thousands of
seeded random programs over 3 to 6 streams on the simulator, with
CUDAMEM_SIM_DELAY_US keeping work pending and CUDAMEM_POOL_POISON making
a use-after-free read wrong bytes; a couple of hundred on a GPU.
CUDAMEM_MODEL_PROGRAMS sets the number per manager.  A failure prints
the seed and the shrunk program."""

import os
import subprocess
import sys

import pytest

from helpers import ROOT, TESTS, environ
from helpers.isolation import SIMULATOR

# Each test only runs children (tests/helpers/ahead.py).
pytestmark = pytest.mark.ahead


@pytest.mark.slow
@pytest.mark.parametrize("manager",
                         ["default", "pool", "pool-vmm", "async", "plugin"])
def test_random_programs_match_the_model(manager):
    n = int(os.environ.get("CUDAMEM_MODEL_PROGRAMS",
                           "500" if SIMULATOR else "60"))
    env = dict(environ(), CUDAMEM_POOL_POISON="1",
               CUDAMEM_POOL_RELEASE_THRESHOLD="0",
               CUDAMEM_POOL_RELEASE_INTERVAL="0")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS), str(ROOT)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if SIMULATOR:
        env.setdefault("CUDAMEM_SIM_DELAY_US", "20")
    p = subprocess.run(
        [sys.executable, str(TESTS / "helpers" / "stream_model.py"), manager,
         str(n)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert "%d programs matched" % n in p.stdout
