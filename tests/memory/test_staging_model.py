# SPDX-License-Identifier: MIT
"""The model-based test of the staging buffers' cache
(tests/helpers/staging_model.py), in a process of its own: thousands of
seeded random programs of staged and one-buffer copies, two at a time in
two threads, on the simulator with CUDAMEM_SIM_DELAY_US keeping copies
pending; a couple of hundred on a GPU.  CUDAMEM_MODEL_PROGRAMS sets the
number.  A failure prints the seed and the program."""

import os
import subprocess
import sys

import pytest

from helpers import ROOT, TESTS, environ
from helpers.isolation import SIMULATOR

# Each test only runs children (tests/helpers/ahead.py).
pytestmark = pytest.mark.ahead


@pytest.mark.slow
@pytest.mark.parametrize("delay_us", ["20", "300"] if SIMULATOR else [None])
def test_random_staging_programs_match_the_model(delay_us):
    n = int(os.environ.get("CUDAMEM_MODEL_PROGRAMS",
                           "2000" if SIMULATOR else "200"))
    env = dict(environ())
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS), str(ROOT)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    if delay_us is not None:
        env["CUDAMEM_SIM_DELAY_US"] = delay_us
    p = subprocess.run(
        [sys.executable, str(TESTS / "helpers" / "staging_model.py"),
         str(n)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert "%d programs matched" % n in p.stdout
