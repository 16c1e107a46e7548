# SPDX-License-Identifier: MIT
"""tools/hostfn_probe.py runs each case in a process of its own and
tells a case that finished from one that blocked; on the simulator,
whose host functions hold no lock of the driver's, every case without an
NVRTC kernel (which the simulator cannot launch) finishes."""

import subprocess
import sys

from helpers import ROOT
from helpers.isolation import SIMULATOR

import pytest


@pytest.mark.skipif(not SIMULATOR, reason="the GPU runs it in .ci/gpu")
def test_the_probe_on_the_simulator():
    p = subprocess.run([sys.executable, str(ROOT / "tools" /
                                            "hostfn_probe.py"), "20"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = dict(line.split(None, 1) for line in p.stdout.splitlines())
    assert set(rows) == {"copy", "kernel-first", "kernel-warm",
                         "capture-kernel-first", "capture-kernel-warm",
                         "capture-kcopy-first", "capture-kcopy-warm",
                         "capture-copy-node",
                         "capture-kcopy-pycallback"}, p.stdout
    for case, what in rows.items():
        if "kernel" in case and "kcopy" not in case:
            assert what.startswith("failed:") and "need a GPU" in what, \
                (case, what)
        else:
            assert what == "finished", (case, what)
