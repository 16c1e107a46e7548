# SPDX-License-Identifier: MIT
"""benchmarks/run.py --budget, as a GPU session uses it: the rules that
tools/bench_budget_check.py asserts with fake operations of known cost
(a column's share, the least number of samples, rows past a spent
budget reported as not run, the cap seen by subprocesses)."""

import subprocess
import sys

from helpers import ROOT


def test_benchmark_budget_rules():
    p = subprocess.run([sys.executable, "tools/bench_budget_check.py"],
                       cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().endswith("ok"), p.stdout + p.stderr
