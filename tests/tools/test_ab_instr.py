# SPDX-License-Identifier: MIT
"""tools/ab_instr.py: instructions per call of a statement under two
trees, from callgrind; a tree against itself differs by nothing."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import cudamem
from helpers import ROOT

pytestmark = [
    pytest.mark.skipif(shutil.which("valgrind") is None,
                       reason="valgrind is not installed"),
    pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""),
                       reason="a sanitizer build does not run under "
                              "valgrind"),
    pytest.mark.ahead]

# The folder the cudamem under test is imported from: the checkout built
# in place, or the installed wheel's site-packages.
TREE = str(pathlib.Path(cudamem.__file__).resolve().parent.parent)


def test_a_tree_against_itself():
    p = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "ab_instr.py"), TREE,
         TREE, "--setup", "import numpy as np; f = np.float32",
         "--stmt", "cuda.device_array(16, f)", "--n0", "20", "--n1",
         "220", "--env", "CUDAMEM_MEMORY_MANAGER=pool"],
        capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {}
    for line in p.stdout.splitlines()[4:]:
        if line.startswith("no cm_ function"):
            continue
        name, a, b, d = line[:40].rstrip(), *line[40:].split()
        rows[name] = (float(a), float(b), float(d))
    # The extension's own instructions: the same in both runs, and a
    # device array's making (its allocation from the pool among them)
    # is part of them.
    a, b, d = rows["cudamem's C (self)"]
    assert a > 100 and abs(d) <= 0.02 * a
    # The whole program: more than the extension, and the same in both
    # runs (one hash seed for all of them; with Python's random seed the
    # start-up alone differed by more than 200 calls cost).
    w, wb, wd = rows["the whole program"]
    assert w > a and abs(wd) <= 0.02 * w
    # Its functions, by name where the build keeps their symbols (the
    # installed wheel's is stripped: the tool says so).
    if "stripped" in p.stdout.splitlines()[-1]:
        assert not any(n.startswith("cm_device") for n in rows)
    else:
        assert "cm_device_array (incl.)" in rows
        assert "cm_pool_alloc (incl.)" in rows


def test_refuses_fewer_second_runs():
    p = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "ab_instr.py"), ".", ".",
         "--stmt", "pass", "--n0", "10", "--n1", "10"],
        capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--n1 must be larger" in p.stderr
