# SPDX-License-Identifier: MIT
"""benchmarks/dask_transfer.py runs (here on a small array): two worker
processes move a NumPy array and a DeviceNDArray, each arrives with its
values, and the table says why a DeviceNDArray cannot go by pickle.
Skipped without distributed."""

import os
import re
import subprocess
import sys

import pytest

from helpers import ROOT

pytest.importorskip("distributed")


@pytest.mark.slow
def test_dask_transfer_benchmark_runs():
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dask_transfer.py"),
         "--size", "1MiB", "--repeats", "2", "-k", "numpy", "-k",
         "cudamem", "-k", "cudamem, pickled"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert out.startswith("Dask: one 1 MiB array from one worker")
    for kind in ("numpy", "cudamem"):
        m = re.search(r"^%s +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)$"
                      % kind, out, re.M)
        assert m, out
        med, lo, hi, gbps = map(float, m.groups())
        assert 0 < lo <= med <= hi and gbps > 0
    assert re.search(r"^cudamem, pickled +not run: a DeviceNDArray does "
                     r"not pickle \(TypeError", out, re.M), out
