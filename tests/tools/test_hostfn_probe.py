# SPDX-License-Identifier: MIT
"""tools/hostfn_probe.py runs each case in a process of its own and
tells a case that finished from one that blocked.  On the simulator the
cases with an NVRTC kernel fail (the simulator cannot launch one), and
the rest show what an H100 showed (CUDA 13.0): a kernel copy recorded
into a capture waits for the held host function unless a capture with
a kernel ended in the context before, and the simulator, which waits
likewise, aborts with the reason where a GPU would hang; a copy, copy
nodes, a kernel copy after such a capture (launched or not) and a
capture whose gate opens from a timer finish."""

import os
import subprocess
import sys

from helpers import ROOT
from helpers.isolation import SIMULATOR

import pytest


@pytest.mark.skipif(not SIMULATOR, reason="the GPU runs it in .ci/gpu")
def test_the_probe_on_the_simulator():
    env = dict(os.environ, CUDAMEM_SIM_CAPTURE_WAIT_S="2")
    p = subprocess.run([sys.executable, str(ROOT / "tools" /
                                            "hostfn_probe.py"), "20"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    rows = dict(line.split(None, 1) for line in p.stdout.splitlines())
    assert set(rows) == {"copy", "kernel-first", "kernel-warm",
                         "capture-kernel-first", "capture-kernel-warm",
                         "capture-kcopy-first", "capture-kcopy-warm",
                         "capture-kcopy-captured",
                         "capture-kernel-after-kcopy",
                         "capture-kernel-after-capture",
                         "capture-copy-node",
                         "capture-kcopy-pycallback"}, p.stdout
    for case, what in rows.items():
        if case.startswith("kernel") or "-kernel" in case:
            assert what.startswith("failed:") and "need a GPU" in what, \
                (case, what)
        elif case == "capture-kcopy-first":
            assert what.startswith("failed:") and "would hang" in what, \
                (case, what)
        else:
            assert what == "finished", (case, what)
