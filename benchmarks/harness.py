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
microseconds, and cudamem's median over the best peer's median.  Rows
with ``"unit": "k/s"`` time one operation of several threads together
(seconds per operation, all threads counted) and print thousands of
operations per second; their ratios are still of times (below 1: cudamem
does more per second).
"""

import gc
import json
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


def time_callable(fn, repeats=31, target_s=0.002, max_inner=10000):
    """Per-call seconds of fn: (median, p10, p90)."""
    t0 = time.perf_counter()
    warm = 0
    while warm < 5 or time.perf_counter() - t0 < 0.02:  # 20 ms warm-up
        fn()
        warm += 1
    one = max((time.perf_counter() - t0) / warm, 1e-7)
    inner = max(1, min(max_inner, int(target_s / one)))
    samples = []
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
    finally:
        if gc_was:
            gc.enable()
    return summarize(samples)


def summarize(samples):
    """(median, p10, p90) of a list of samples."""
    samples = sorted(samples)
    return (statistics.median(samples), _percentile(samples, 0.1),
            _percentile(samples, 0.9))


def run_ops(ops, libs, select=None, repeats=31, results=None):
    """Time every op for every lib; a list of result dicts (appended to
    ``results`` as each row ends, when given, so that a run cut short
    still has the rows it finished)."""
    results = [] if results is None else results
    for op in ops:
        if select and not any(s in op["name"] for s in select):
            continue
        row = {"op": op["name"], "unit": op.get("unit", "us"),
               "bytes": op.get("bytes"), "times": {}}
        for lib in LIBS:
            mod = libs.get(lib)
            factory = op["impls"].get(lib)
            if mod is None or factory is None:
                continue
            try:
                fn = factory(mod)
                if isinstance(fn, Measured):
                    row["times"][lib] = tuple(fn)
                else:
                    row["times"][lib] = time_callable(fn, repeats=repeats)
            except (Skip, ImportError, NotImplementedError) as e:
                row.setdefault("skipped", {})[lib] = str(e)[:80]
            except Exception as e:  # noqa: BLE001 - reported, not fatal
                row.setdefault("errors", {})[lib] = "%s: %s" % (
                    type(e).__name__, str(e)[:120])
            finally:
                gc.collect()
        results.append(row)
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


def format_table(results):
    """A fixed-width table: one line per op, median [p10-p90] per lib."""
    lines = []
    head = "%-40s" % "operation (us: median [p10, p90])"
    for lib in LIBS:
        head += " %-22s" % lib
    head += " %8s %8s" % ("vs best", "vs drv")
    lines.append(head)
    lines.append("-" * len(head))
    for row in results:
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
        lines.append(line)
        for kind in ("errors", "skipped"):
            for lib, msg in row.get(kind, {}).items():
                label = "error" if kind == "errors" else "skipped"
                lines.append("    %s %s: %s" % (label, lib, msg))
    return "\n".join(lines)


def to_json(results):
    return json.dumps(results, indent=1)
