# SPDX-License-Identifier: MIT
"""The benchmark harness: every operation, for every library that is
installed (numba-cuda, CuPy, PyTorch, RMM, cuda.core, each imported only
when it is), timed side by side in one process.

An operation is a name and, per library, a factory that returns the
callable to time (or raises ``Skip`` / ImportError when that library
cannot do it here).  Each callable must leave the device idle when it
returns (it synchronises itself), so a timing covers the whole operation.

Timing: ``repeats`` samples, each the mean of ``inner`` back-to-back calls
(``inner`` chosen so a sample lasts about 2 ms), after 20 ms of warm-up.  The
table gives the median and the 10th / 90th percentiles of the samples in
microseconds, and cudamem's median over the best peer's median.

A time budget (``benchmarks/run.py --budget``) caps a measurement: once
it has run ``max_s`` seconds (warm-up included) it stops sampling, but
never before ``min_repeats`` samples (11 by default), so that a capped
row still has a median and a spread.  The defaults of ``repeats``,
``max_s`` and ``min_repeats`` come from CUDAMEM_BENCH_REPEATS,
CUDAMEM_BENCH_MAX_S and CUDAMEM_BENCH_MIN_REPEATS, so that the rows
timed in a subprocess (the ``[pool]`` rows, the interop rows) follow the
run's settings too.  Rows
with ``"unit": "k/s"`` time one operation of several threads together
(seconds per operation, all threads counted) and print thousands of
operations per second; their ratios are still of times (below 1: cudamem
does more per second).  An operation with ``"per": N`` does N like
things in one timed call (200 copies in one replay of a graph): each of
its times, self-timed columns' too, is divided by N, so the row reads
per thing.
"""

import gc
import json
import os
import statistics
import time


class Skip(Exception):
    """This library cannot run this operation here."""


class Measured(tuple):
    """A factory's answer when it timed the operation itself (for example
    in a subprocess, where a setting that must precede the first context
    can be chosen): (median, p10, p90) seconds per call."""


# rmm and cuda.core are passed to a factory as the objects it needs made
# once (cudamem._bench.load_rmm / load_cuda_core say which).
LIBS = ("cudamem", "numba", "cupy", "torch", "rmm", "cuda.core", "driver")


def load_lib(name):
    """Import a library by its short name; None if it is not usable."""
    try:
        if name == "cudamem":
            import cudamem

            cudamem.current_context()
            return cudamem
        if name == "numba":
            import numpy as np

            if not hasattr(np, "row_stack"):
                np.row_stack = np.vstack  # numba-cuda 0.30 under NumPy 2.5
            from numba import cuda

            cuda.current_context()
            return cuda
        if name == "cupy":
            import cupy

            cupy.cuda.runtime.getDeviceCount()
            return cupy
        if name == "torch":
            import torch

            if not torch.cuda.is_available():
                return None
            torch.cuda.init()
            return torch
        if name in ("rmm", "cuda.core"):
            from cudamem import _bench

            return _bench.load_rmm() if name == "rmm" \
                else _bench.load_cuda_core()
        if name == "driver":
            from cudamem import _core

            if _core._backend() != "driver":
                return None
            return _core
    except Exception:  # noqa: BLE001 - any failure means "not here"
        return None
    return None


def _percentile(sorted_xs, q):
    k = (len(sorted_xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (k - lo)


REPEATS = 31
MIN_REPEATS = 11

# The sample count of the last time_callable (run_ops records it per
# column, so a capped row says how many samples it had).
last_samples = [0]


def _env_number(name, kind, default):
    text = os.environ.get(name, "")
    try:
        return kind(text) if text else default
    except ValueError:
        raise ValueError("%s=%r is not a number" % (name, text)) from None


def defaults():
    """(repeats, max_s, min_repeats) from the environment (see the
    module's docstring); max_s None: no cap."""
    repeats = _env_number("CUDAMEM_BENCH_REPEATS", int, REPEATS)
    max_s = _env_number("CUDAMEM_BENCH_MAX_S", float, 0.0) or None
    least = _env_number("CUDAMEM_BENCH_MIN_REPEATS", int, MIN_REPEATS)
    return repeats, max_s, min(least, repeats)


def _warm(fn, target_s=0.002, max_inner=10000):
    """Run fn for 20 ms (at least 5 calls); the calls per sample that
    make a sample last about target_s."""
    t0 = time.perf_counter()
    warm = 0
    while warm < 5 or time.perf_counter() - t0 < 0.02:  # 20 ms warm-up
        fn()
        warm += 1
    one = max((time.perf_counter() - t0) / warm, 1e-7)
    return max(1, min(max_inner, int(target_s / one)))


def _sample(fn, inner, n, stop_at=None, least=0, samples=None):
    """Append to samples (a new list when None) n samples of fn, each
    the mean of inner calls, the collector off; fewer once stop_at
    (perf_counter) has passed and at least least were taken."""
    samples = [] if samples is None else samples
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for k in range(n):
            t0 = time.perf_counter()
            if stop_at is not None and k >= least and t0 >= stop_at:
                break
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
    finally:
        if gc_was:
            gc.enable()
    return samples


def time_callable(fn, repeats=None, target_s=0.002, max_inner=10000,
                  max_s=None, min_repeats=None):
    """Per-call seconds of fn: (median, p10, p90).  repeats samples, or
    fewer once max_s seconds have passed (warm-up included) and at least
    min_repeats were taken; None takes the default (see defaults())."""
    env_repeats, env_max_s, env_least = defaults()
    repeats = env_repeats if repeats is None else repeats
    max_s = env_max_s if max_s is None else max_s
    least = min(repeats, env_least if min_repeats is None else min_repeats)
    start = time.perf_counter()
    inner = _warm(fn, target_s, max_inner)
    stop_at = None if max_s is None else start + max_s
    samples = _sample(fn, inner, repeats, stop_at, least)
    last_samples[0] = len(samples)
    return summarize(samples)


def time_alternated(fns, repeats, rounds, target_s=0.002, max_inner=10000):
    """{name: (median, p10, p90)} of the callables in fns ({name: fn}),
    timed in turns: each warmed up, then rounds rounds of
    ceil(repeats / rounds) samples each, the order reversed every other
    round, the samples of all rounds pooled.  For columns that make the
    same work (the same driver call), so that neither the order they are
    timed in nor a drift of the machine during the row lands on one of
    them."""
    names = list(fns)
    inner = {k: _warm(fns[k], target_s, max_inner) for k in names}
    per = -(-repeats // rounds)
    samples = {k: [] for k in names}
    for r in range(rounds):
        for k in (names if r % 2 else names[::-1]):
            _sample(fns[k], inner[k], per, samples=samples[k])
    return {k: summarize(v) for k, v in samples.items()}


def alternated(measure, names, rounds):
    """{name: [measure(name) per round]}: every name measured once a
    round, the order reversed every other round, so that no column is
    always timed first or after the same neighbour."""
    names = list(names)
    times = {k: [] for k in names}
    for r in range(rounds):
        for k in (names if r % 2 else names[::-1]):
            times[k].append(measure(k))
    return times


def summarize(samples):
    """(median, p10, p90) of a list of samples."""
    samples = sorted(samples)
    return (statistics.median(samples), _percentile(samples, 0.1),
            _percentile(samples, 0.9))


class Budget:
    """A run's time budget, shared out as it goes: each measurement (one
    library's column of one row) may run for what is left over the
    measurements still to come (``cap``), so that the columns that take
    less than their share leave it to the later, slower ones (the
    pageable sweeps come last).  ``measurements`` is set by the caller to
    the number it will make and counted down by run_ops."""

    def __init__(self, seconds, start=None):
        start = time.perf_counter() if start is None else start
        self.deadline = start + seconds
        self.measurements = 0

    def left(self):
        return self.deadline - time.perf_counter()

    def spent(self):
        return self.left() <= 0

    def cap(self):
        """Seconds the next measurement may take."""
        return max(self.left(), 0.0) / max(self.measurements, 1)

    def done(self, n=1):
        self.measurements = max(0, self.measurements - n)


def selected(op, select=None, exclude=None):
    """Whether op's name matches one of select (all when empty) and none
    of exclude."""
    name = op["name"]
    if select and not any(s in name for s in select):
        return False
    return not (exclude and any(s in name for s in exclude))


def count_measurements(ops, libs, select=None, exclude=None):
    """The library columns run_ops would time for these ops."""
    return sum(1 for op in ops if selected(op, select, exclude)
               for lib in LIBS
               if libs.get(lib) is not None and lib in op["impls"])


def _record_error(row, lib, e):
    """Note in row why lib's column has no time."""
    if isinstance(e, (Skip, ImportError, NotImplementedError)):
        row.setdefault("skipped", {})[lib] = str(e)[:80]
    else:
        row.setdefault("errors", {})[lib] = "%s: %s" % (
            type(e).__name__, str(e)[:120])


def _row_alternated(op, libs, present, row, repeats, rounds):
    """The columns of one row timed in turns (time_alternated): every
    library's callable made first and tried once, then timed together;
    a column that times itself (Measured) keeps its own figure."""
    per = op.get("per", 1)
    fns = {}
    for lib in present:
        try:
            fn = op["impls"][lib](libs[lib])
            if isinstance(fn, Measured):
                row["times"][lib] = tuple(v / per for v in fn)
                continue
            fn()
            fns[lib] = fn
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            _record_error(row, lib, e)
    if not fns:
        return
    try:
        times = time_alternated(fns, repeats, rounds)
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        for lib in fns:
            _record_error(row, lib, e)
        return
    n = -(-repeats // rounds) * rounds
    for lib, t in times.items():
        row["times"][lib] = tuple(v / per for v in t)
        row.setdefault("samples", {})[lib] = n


def run_ops(ops, libs, select=None, repeats=None, results=None,
            exclude=None, budget=None, on_row=None, rounds=1):
    """Time every op for every lib; a list of result dicts (appended to
    ``results`` as each row ends, when given, so that a run cut short
    still has the rows it finished; on_row(row) is called then too).

    rounds > 1 times each row's columns in turns (time_alternated), the
    callables of all its libraries alive at once; not with a budget.

    With a Budget, each column is capped at budget.cap() seconds (also
    for the columns timed in a subprocess: CUDAMEM_BENCH_MAX_S is set
    for them), and once the budget is spent the rows left are reported
    as not run instead of timed.  A row records its wall time
    (``seconds``) and the samples of each column timed here
    (``samples``)."""
    results = [] if results is None else results
    saved_cap = os.environ.get("CUDAMEM_BENCH_MAX_S")
    try:
        for op in ops:
            if not selected(op, select, exclude):
                continue
            row = {"op": op["name"], "unit": op.get("unit", "us"),
                   "bytes": op.get("bytes"), "times": {}}
            per = op.get("per", 1)
            if per != 1:
                row["per"] = per
            present = [lib for lib in LIBS if libs.get(lib) is not None
                       and op["impls"].get(lib) is not None]
            if budget is not None and budget.spent():
                row["not_run"] = "the run's time budget was spent"
                budget.done(len(present))
                results.append(row)
                if on_row is not None:
                    on_row(row)
                continue
            t_row = time.perf_counter()
            if rounds > 1:
                _row_alternated(op, libs, present, row,
                                defaults()[0] if repeats is None
                                else repeats, rounds)
                present = []
                gc.collect()
            for lib in present:
                mod = libs[lib]
                factory = op["impls"][lib]
                cap = None
                if budget is not None:
                    cap = budget.cap()
                    os.environ["CUDAMEM_BENCH_MAX_S"] = "%.3f" % cap
                try:
                    fn = factory(mod)
                    if isinstance(fn, Measured):
                        t = tuple(fn)
                    else:
                        t = time_callable(fn, repeats=repeats, max_s=cap)
                        row.setdefault("samples", {})[lib] = last_samples[0]
                    row["times"][lib] = tuple(v / per for v in t)
                except Exception as e:  # noqa: BLE001 - reported, not fatal
                    _record_error(row, lib, e)
                finally:
                    if budget is not None:
                        budget.done()
                    gc.collect()
            row["seconds"] = round(time.perf_counter() - t_row, 3)
            results.append(row)
            if on_row is not None:
                on_row(row)
    finally:
        if saved_cap is None:
            os.environ.pop("CUDAMEM_BENCH_MAX_S", None)
        else:
            os.environ["CUDAMEM_BENCH_MAX_S"] = saved_cap
    return results


def ratio(row):
    """cudamem's median over the best peer's (not the bare driver's)."""
    t = row["times"]
    if "cudamem" not in t:
        return None
    peers = [v[0] for k, v in t.items() if k not in ("cudamem", "driver")]
    if not peers:
        return None
    return t["cudamem"][0] / min(peers)


def driver_ratio(row):
    t = row["times"]
    if "cudamem" not in t or "driver" not in t:
        return None
    return t["cudamem"][0] / t["driver"][0]


def header_lines():
    """The table's heading, two lines."""
    head = "%-40s" % "operation (us: median [p10, p90])"
    for lib in LIBS:
        head += " %-22s" % lib
    head += " %8s %8s" % ("vs best", "vs drv")
    return [head, "-" * len(head)]


def row_lines(row):
    """One row of the table: its line, then its errors and skips."""
    if row.get("not_run"):
        return ["%-40s not run: %s" % (row["op"][:40], row["not_run"])]
    line = "%-40s" % row["op"][:40]
    for lib in LIBS:
        v = row["times"].get(lib)
        if v is None:
            cell = "-"
        elif row.get("unit") == "k/s":
            cell = "%.1f k/s" % (1e-3 / v[0])
        elif row.get("bytes"):
            cell = "%.1f GB/s" % (row["bytes"] / v[0] / 1e9)
        else:
            cell = "%.2f [%.2f,%.2f]" % (v[0] * 1e6, v[1] * 1e6,
                                         v[2] * 1e6)
        line += " %-22s" % cell
    r = ratio(row)
    d = driver_ratio(row)
    line += " %8s %8s" % ("%.2fx" % r if r else "-",
                          "%.2fx" % d if d else "-")
    lines = [line]
    for kind in ("errors", "skipped"):
        for lib, msg in row.get(kind, {}).items():
            label = "error" if kind == "errors" else "skipped"
            lines.append("    %s %s: %s" % (label, lib, msg))
    return lines


def format_table(results):
    """A fixed-width table: one line per op, median [p10-p90] per lib."""
    lines = header_lines()
    for row in results:
        lines.extend(row_lines(row))
    return "\n".join(lines)


def to_json(results):
    return json.dumps(results, indent=1)
