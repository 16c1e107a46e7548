# SPDX-License-Identifier: MIT
"""Check the benchmark harness's time budget without a GPU and without
cudamem: fake operations of known cost run through harness.run_ops
with a harness.Budget, and the rules of benchmarks/run.py --budget are
asserted:

- a column stops sampling at its share of the budget, but never before
  the least number of samples (--min-repeats);
- columns that take less than their share leave it to later ones;
- once the budget is spent, the rows left are reported as not run;
- subprocesses see the cap (CUDAMEM_BENCH_MAX_S), and it is cleared
  after the run.

    python tools/bench_budget_check.py      # prints "ok" or fails
"""

import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent
                       / "benchmarks"))

import harness  # noqa: E402


def sleeper(seconds):
    def factory(mod):
        return lambda: time.sleep(seconds)
    return factory


def op(name, seconds):
    return {"name": name, "impls": {"cudamem": sleeper(seconds)}}


def main():
    libs = {"cudamem": object()}
    os.environ.pop("CUDAMEM_BENCH_MAX_S", None)

    # Without a budget: every sample is taken.
    rows = harness.run_ops([op("slow", 0.01)], libs, repeats=15)
    assert rows[0]["samples"] == {"cudamem": 15}, rows

    # A column of 10 ms calls under a share of 0.1 s stops at the least
    # number of samples (11), not at the share (which would be ~5).
    b = harness.Budget(0.1)
    b.measurements = 1
    rows = harness.run_ops([op("slow", 0.01)], libs, repeats=31, budget=b)
    assert rows[0]["samples"] == {"cudamem": harness.MIN_REPEATS}, rows

    # Quick columns first leave their share to the slow one after them:
    # 5 quick rows (about 0.08 s each: 20 ms of warm-up and 31 samples of
    # 2 ms) and one slow row of 5 ms calls (31 samples: about 0.2 s) in a
    # 3 s budget: the slow row gets its 31 although an even split would
    # give it 0.5 s only at the start, and less had the quick rows used
    # theirs.
    ops = [op("quick %d" % i, 0.0) for i in range(5)] + [op("slow", 0.005)]
    b = harness.Budget(3.0)
    b.measurements = harness.count_measurements(ops, libs)
    assert b.measurements == 6
    rows = harness.run_ops(ops, libs, repeats=31, budget=b)
    assert rows[-1]["samples"] == {"cudamem": 31}, rows[-1]
    assert b.measurements == 0

    # A spent budget: the rows left are listed, not timed.
    seen = []
    b = harness.Budget(0.05)
    ops = [op("first", 0.01), op("second", 0.01), op("third", 0.01)]
    b.measurements = 3
    rows = harness.run_ops(ops, libs, repeats=31, budget=b,
                           on_row=seen.append)
    assert [r["op"] for r in seen] == ["first", "second", "third"]
    assert "not_run" not in rows[0] and rows[-1].get("not_run"), rows
    assert all("not run" in harness.row_lines(r)[0]
               for r in rows if r.get("not_run"))

    # A subprocess-style factory sees the cap in the environment; the
    # variable is gone afterwards.
    caps = []

    def env_factory(mod):
        caps.append(float(os.environ["CUDAMEM_BENCH_MAX_S"]))
        return harness.Measured((1e-6, 1e-6, 1e-6))

    b = harness.Budget(10.0)
    b.measurements = 2
    harness.run_ops([{"name": "child", "impls": {"cudamem": env_factory}}],
                    libs, budget=b)
    assert len(caps) == 1 and 4.0 < caps[0] <= 5.0, caps
    assert "CUDAMEM_BENCH_MAX_S" not in os.environ

    # The defaults a child reads.
    os.environ.update(CUDAMEM_BENCH_REPEATS="9", CUDAMEM_BENCH_MAX_S="0.5",
                      CUDAMEM_BENCH_MIN_REPEATS="20")
    try:
        assert harness.defaults() == (9, 0.5, 9)
    finally:
        for k in ("CUDAMEM_BENCH_REPEATS", "CUDAMEM_BENCH_MAX_S",
                  "CUDAMEM_BENCH_MIN_REPEATS"):
            os.environ.pop(k)
    assert harness.defaults() == (harness.REPEATS, None,
                                  harness.MIN_REPEATS)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
