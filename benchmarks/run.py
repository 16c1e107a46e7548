# SPDX-License-Identifier: MIT
"""Run cudamem's benchmarks side by side with numba-cuda, CuPy, PyTorch,
RMM, cuda.core and the bare driver, whichever are installed, and print
one table.

    python benchmarks/run.py [-k SUBSTRING ...] [-x SUBSTRING ...]
        [--modules ops_alloc,ops_threads] [--libs cudamem,cupy]
        [--repeats N] [--rounds R] [--budget SECONDS] [--json FILE]
        [--list] [--tree DIR]

Each row is printed as it finishes, with its wall time and the samples
of each column (``n=``), and the whole table once more at the end.

``--budget SECONDS`` makes the run end within about that many seconds:
each column of a row may take what is left over the columns still to
come (harness.Budget), so that quick rows give their share to the slow
ones after them; a column stops sampling at its share, but never before
``--min-repeats`` samples (11), and once the budget is spent the rows
left are listed as not run.  Rows that time a fixed stretch (the thread
rows), start a subprocess, or run a Dask cluster are not shortened; the
order of MODULES puts the pageable sweeps, the slowest rows, last.

``--rounds R`` times each row's columns in turns: every library's
callable is made and warmed up, then R rounds of about N / R samples
each, the order of the libraries reversed every other round
(harness.time_alternated).  By default each column is timed whole, one
library after the other; where the columns make the same driver call
(the page-locked copies), a difference of a percent or two can be the
order or the machine drifting during the row, which the turns spread
over every column.  Not with ``--budget``, nor for the rows of
``run_extra``.

``--tree DIR`` times the cudamem of another checkout (built in place
there), for an A/B of two trees with the same benchmark code
(tools/ab_bench.sh); run it from a folder that holds no cudamem package.

Never run from the test suite; timings are not assertions.
"""

import argparse
import importlib
import os
import pathlib
import signal
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _tree_first(argv):
    """The checkout whose cudamem is timed: --tree DIR, else this one
    (its in-place build comes first on sys.path).  Decided before
    harness imports anything; the subprocesses of some rows get it
    through PYTHONPATH."""
    tree = HERE.parent
    for i, a in enumerate(argv):
        if a == "--tree" and i + 1 < len(argv):
            tree = pathlib.Path(argv[i + 1]).resolve()
        elif a.startswith("--tree="):
            tree = pathlib.Path(a.split("=", 1)[1]).resolve()
    sys.path.insert(0, str(tree))
    # Also for this checkout itself: a row's `python -c` child has its
    # working folder, not this one, first on its path (tools/ab_bench.sh
    # runs from an empty folder, and there the B side's children could
    # not import cudamem).  A tree without cudamem/ (the installed-wheel
    # run) adds nothing that shadows the installed package.
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree) + (os.pathsep + old if old else "")
    return tree


_tree_first(sys.argv[1:])

import harness  # noqa: E402

# The rows the open work needs come first (allocation, small copies,
# threads, indexing), the slow bandwidth sweeps of pageable memory last,
# so that a time limit on the run cuts them rather than the per-call
# rows.
MODULES = ["ops_alloc", "ops_transfer", "ops_threads", "ops_indexing",
           "ops_hostmem", "ops_streams", "ops_graphs", "ops_kernels",
           "ops_ipc", "ops_multigpu", "ops_interop", "ops_staging"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", action="append", default=[],
                    help="only operations whose name contains this")
    ap.add_argument("-x", "--exclude", action="append", default=[],
                    help="leave out operations whose name contains this")
    ap.add_argument("--modules",
                    help="comma-separated modules of MODULES to run "
                         "(default: all, in MODULES' order)")
    ap.add_argument("--libs",
                    help="comma-separated libraries to time (default: "
                         "every one installed): " + ",".join(harness.LIBS))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--repeats", type=int, default=harness.REPEATS,
                    help="samples per column (default %(default)s)")
    ap.add_argument("--min-repeats", type=int, default=harness.MIN_REPEATS,
                    help="the fewest samples a column is cut to under "
                         "--budget (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time each row's columns in this many turns "
                         "(see above; default %(default)s: one after "
                         "the other)")
    ap.add_argument("--budget", type=float,
                    help="seconds the whole run should take (see above)")
    ap.add_argument("--list", action="store_true",
                    help="print the selected rows' names and exit")
    ap.add_argument("--tree", help="the checkout whose cudamem is timed")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    if args.repeats < 1 or args.min_repeats < 1:
        ap.error("--repeats and --min-repeats must be at least 1")
    if args.rounds < 1 or args.rounds > args.repeats:
        ap.error("--rounds must be between 1 and --repeats")
    if args.rounds > 1 and args.budget is not None:
        ap.error("--rounds and --budget do not go together")
    modules = MODULES
    if args.modules:
        modules = [m.strip() for m in args.modules.split(",") if m.strip()]
        unknown = sorted(set(modules) - set(MODULES))
        if unknown:
            ap.error("unknown module(s) %s; known: %s"
                     % (", ".join(unknown), ", ".join(MODULES)))
    wanted = harness.LIBS
    if args.libs:
        wanted = [x.strip() for x in args.libs.split(",") if x.strip()]
        unknown = sorted(set(wanted) - set(harness.LIBS))
        if unknown:
            ap.error("unknown library(ies) %s; known: %s"
                     % (", ".join(unknown), ", ".join(harness.LIBS)))
    # Rows timed in a subprocess read these (harness.defaults()).
    os.environ["CUDAMEM_BENCH_REPEATS"] = str(args.repeats)
    os.environ["CUDAMEM_BENCH_MIN_REPEATS"] = str(args.min_repeats)

    mods = [importlib.import_module(name) for name in modules]
    if args.list:
        for mod in mods:
            for op in mod.OPS:
                if harness.selected(op, args.k, args.exclude):
                    print("%s: %s" % (mod.__name__, op["name"]))
            if hasattr(mod, "run_extra"):
                print("%s: (rows of run_extra)" % mod.__name__)
        return 0

    libs = {name: harness.load_lib(name) if name in wanted else None
            for name in harness.LIBS}
    print("libraries: " + ", ".join(
        "%s=%s" % (k, "yes" if v is not None else "no")
        for k, v in libs.items()))
    if libs.get("cudamem") is not None:
        print("cudamem: %s" % libs["cudamem"].__file__)
    if os.environ.get("CUDAMEM_SIMULATOR", "0") not in ("0", ""):
        print("note: cudamem runs on the CPU simulator; its timings are "
              "CPU timings")
    budget = None
    nlibs = sum(1 for v in libs.values() if v is not None)
    if args.budget is not None:
        budget = harness.Budget(args.budget, start=t_start)
        # Each module's run_extra counts as one column per library.
        budget.measurements = sum(
            harness.count_measurements(m.OPS, libs, args.k, args.exclude)
            + (nlibs if hasattr(m, "run_extra") else 0)
            for m in mods)
        print("budget: %.0f s for %d columns (at least %d samples each; "
              "%.1f s spent loading the libraries)"
              % (args.budget, budget.measurements, args.min_repeats,
                 time.perf_counter() - t_start))
    # A throwaway pass over the first selected operation: the first
    # timings of a process (the libraries' first allocations, the clock
    # ramping up) read 2-4 times the steady cost on the H200, and the
    # first library of the first row would carry that alone.
    first = [op for m in mods for op in m.OPS
             if harness.selected(op, args.k, args.exclude)][:1]
    harness.run_ops(first, libs, repeats=5)

    print("\n".join(harness.header_lines()))
    sys.stdout.flush()

    def show(row):
        lines = harness.row_lines(row)
        if "seconds" in row:
            n = row.get("samples", {})
            lines[0] += "  (%.1f s%s)" % (
                row["seconds"], ", n=%d-%d" % (min(n.values()),
                                               max(n.values()))
                if n else "")
        print("\n".join(lines))
        sys.stdout.flush()
        # The JSON too, row by row: a run killed where SIGTERM cannot
        # reach Python (a thread stuck in the driver with the GIL) still
        # leaves the rows it finished.
        if args.json:
            pathlib.Path(args.json).write_text(harness.to_json(results))

    # A time limit (timeout's SIGTERM) ends the run with the table of the
    # rows finished so far, marked as cut, instead of with nothing.
    results = []
    cut = False

    def _stop(signum, frame):
        raise _Cut()

    signal.signal(signal.SIGTERM, _stop)
    try:
        for mod in mods:
            harness.run_ops(mod.OPS, libs, select=args.k,
                            repeats=args.repeats, results=results,
                            exclude=args.exclude, budget=budget,
                            on_row=show, rounds=args.rounds)
            if not hasattr(mod, "run_extra"):
                continue
            # Operations the in-process timer cannot measure (IPC needs
            # a second process) come as ready rows from run_extra.
            if budget is not None and budget.spent():
                extra = [{"op": "%s: run_extra" % mod.__name__,
                          "times": {},
                          "not_run": "the run's time budget was spent"}]
            else:
                t0 = time.perf_counter()
                extra = mod.run_extra(libs, select=args.k,
                                      repeats=args.repeats)
                extra = [r for r in extra
                         if not any(s in r["op"] for s in args.exclude)]
                if extra:
                    print("(%s's %d rows below took %.1f s together)"
                          % (mod.__name__, len(extra),
                             time.perf_counter() - t0))
            if budget is not None:
                budget.done(nlibs)
            for r in extra:
                results.append(r)
                show(r)
    except _Cut:
        cut = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print()
    print(harness.format_table(results))
    if cut:
        print("note: the run was cut by its time limit after %d rows"
              % len(results))
    skipped = sum(1 for r in results if r.get("not_run"))
    if skipped:
        print("note: %d rows not run: the --budget of %.0f s was spent"
              % (skipped, args.budget))
    print("benchmarks: %d rows in %.1f s" % (len(results) - skipped,
                                             time.perf_counter() - t_start))
    if args.json:
        pathlib.Path(args.json).write_text(harness.to_json(results))
    return 0


class _Cut(BaseException):
    """The run's time limit (SIGTERM) came."""


if __name__ == "__main__":
    sys.exit(main())
