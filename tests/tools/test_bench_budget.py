# SPDX-License-Identifier: MIT
"""benchmarks/run.py --budget, as a GPU session uses it: the rules that
tools/bench_budget_check.py asserts with fake operations of known cost
(a column's share, the least number of samples, rows past a spent
budget reported as not run, the cap seen by subprocesses)."""

import os
import subprocess
import sys

from helpers import ROOT


def test_benchmark_budget_rules():
    p = subprocess.run([sys.executable, "tools/bench_budget_check.py"],
                       cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().endswith("ok"), p.stdout + p.stderr


def test_rows_subprocesses_see_the_timed_tree(tmp_path):
    """run.py hands the checkout it times to its rows' `python -c`
    children through PYTHONPATH, also when that checkout is its own and
    it runs from another folder (tools/ab_bench.sh runs it from an empty
    one: there the B side's children once imported no cudamem)."""
    code = ("import os, runpy, sys; sys.argv = ['run.py']; "
            "runpy.run_path(%r, run_name='imported'); "
            "print(os.environ['PYTHONPATH'].split(os.pathsep)[0])"
            % str(ROOT / "benchmarks" / "run.py"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1] == str(ROOT.resolve())


def test_alternated_reverses_the_order_every_other_round():
    """harness.alternated, the probes' loop: each name once a round, the
    order reversed every other round, the samples kept per name."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import harness

    seen = []

    def measure(k):
        seen.append(k)
        return len(seen)
    times = harness.alternated(measure, {"a": 1, "b": 2, "c": 3}, 3)
    assert seen == ["c", "b", "a", "a", "b", "c", "c", "b", "a"]
    assert times == {"a": [3, 4, 9], "b": [2, 5, 8], "c": [1, 6, 7]}


def test_rounds_time_a_rows_columns_in_turns():
    """run_ops(rounds=R): every column's callable made and tried first,
    then the columns timed in turns, the order reversed every other
    round; a self-timed column keeps its figure, a skipped one says
    why, and each timed column has R * ceil(repeats / R) samples."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import harness

    log = []

    def factory(name):
        def make(mod):
            def fn():
                log.append(name)
            return fn
        return make

    def skip(mod):
        raise harness.Skip("not here")

    op = {"name": "turns", "impls": {
        "cudamem": factory("cudamem"), "cupy": factory("cupy"),
        "torch": skip,
        "driver": lambda mod: harness.Measured((1e-6, 5e-7, 2e-6))}}
    libs = {k: object() for k in ("cudamem", "cupy", "torch", "driver")}
    row, = harness.run_ops([op], libs, repeats=7, rounds=3)
    assert set(row["times"]) == {"cudamem", "cupy", "driver"}
    assert row["times"]["driver"] == (1e-6, 5e-7, 2e-6)
    assert row["skipped"] == {"torch": "not here"}
    assert row["samples"] == {"cudamem": 9, "cupy": 9}
    runs = [k for i, k in enumerate(log) if i == 0 or log[i - 1] != k]
    # tried: cudamem, cupy; warmed: cudamem, cupy; round 0 reversed
    # (cupy, cudamem), round 1 in order, round 2 reversed: neighbours
    # of the same name merge into one run.
    assert runs == ["cudamem", "cupy", "cudamem", "cupy", "cudamem",
                    "cupy", "cudamem"]


def test_rounds_and_budget_are_refused():
    p = subprocess.run([sys.executable, "benchmarks/run.py", "--rounds",
                        "3", "--budget", "10", "--list"],
                       cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    assert "--rounds and --budget" in p.stderr
