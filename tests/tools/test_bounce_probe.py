# SPDX-License-Identifier: MIT
"""tools/bounce_probe.py (a copy of pageable memory to the host, direct,
through the staging pipeline and through a page-locked buffer by hand):
it runs on the simulator, prints a line per size with every column, the
bytes land, and it leaves the staging pipeline's tunables as it found
them."""

import os
import subprocess
import sys

import pytest

from helpers import ROOT
from helpers.isolation import SIMULATOR

PROBE = ROOT / "tools" / "bounce_probe.py"


@pytest.mark.skipif(not SIMULATOR, reason="a GPU probe: the simulator's run")
def test_probe_runs_and_restores_the_tunables():
    code = (
        "import runpy, sys\n"
        "from cudamem import _core\n"
        "before = _core._staging_config()\n"
        "sys.path.insert(0, %r)\n"
        "sys.argv = [%r, '1', '16,64']\n"
        "runpy.run_path(%r, run_name='__main__')\n"
        "after = _core._staging_config()\n"
        "assert after == before, (before, after)\n"
        "print('restored')\n" % (str(PROBE.parent), str(PROBE),
                                  str(PROBE)))
    env = dict(os.environ, CUDAMEM_STAGING_THRESHOLD="8M")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=300, env=env, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "KiB " in ln]
    assert [ln.split()[0] for ln in lines] == ["16", "64"], out.stdout
    for ln in lines:
        for col in ("direct", "cudamem", "staged", "bounce", "locked",
                    "memcpy"):
            assert " %s " % col in ln, ln
    assert out.stdout.rstrip().endswith("restored")
