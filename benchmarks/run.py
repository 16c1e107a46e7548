# SPDX-License-Identifier: MIT
"""Run cudamem's benchmarks side by side with numba-cuda, CuPy, PyTorch,
RMM, cuda.core and the bare driver, whichever are installed, and print
one table.

    python benchmarks/run.py [-k SUBSTRING ...] [--json FILE] [--repeats N]

Never run from the test suite; timings are not assertions.
"""

import argparse
import importlib
import os
import pathlib
import signal
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the in-tree build comes first

import harness  # noqa: E402

# The slow bandwidth sweeps of pageable memory come last, so that a time
# limit on the run cuts them rather than the per-call rows.
MODULES = ["ops_alloc", "ops_transfer", "ops_hostmem", "ops_streams",
           "ops_threads", "ops_kernels", "ops_indexing", "ops_ipc",
           "ops_multigpu",
           "ops_interop", "ops_staging"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", action="append", default=[],
                    help="only operations whose name contains this")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--repeats", type=int, default=31)
    args = ap.parse_args(argv)

    libs = {name: harness.load_lib(name) for name in harness.LIBS}
    print("libraries: " + ", ".join(
        "%s=%s" % (k, "yes" if v is not None else "no")
        for k, v in libs.items()))
    if os.environ.get("CUDAMEM_SIMULATOR", "0") not in ("0", ""):
        print("note: cudamem runs on the CPU simulator; its timings are "
              "CPU timings")
    ops = []
    extras = []
    for name in MODULES:
        mod = importlib.import_module(name)
        ops.extend(mod.OPS)
        # Operations the in-process timer cannot measure (IPC needs a
        # second process) come as ready rows from run_extra.
        if hasattr(mod, "run_extra"):
            extras.append(mod.run_extra)
    # A throwaway pass over the first selected operation: the first
    # timings of a process (the libraries' first allocations, the clock
    # ramping up) read 2-4 times the steady cost on the H200, and the
    # first library of the first row would carry that alone.
    first = [op for op in ops
             if not args.k or any(s in op["name"] for s in args.k)][:1]
    harness.run_ops(first, libs, repeats=5)
    # A time limit (timeout's SIGTERM) ends the run with the table of the
    # rows finished so far, marked as cut, instead of with nothing.
    results = []
    cut = False

    def _stop(signum, frame):
        raise _Cut()

    signal.signal(signal.SIGTERM, _stop)
    try:
        harness.run_ops(ops, libs, select=args.k, repeats=args.repeats,
                        results=results)
        for extra in extras:
            results.extend(extra(libs, select=args.k,
                                 repeats=args.repeats))
    except _Cut:
        cut = True
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(harness.format_table(results))
    if cut:
        print("note: the run was cut by its time limit after %d rows"
              % len(results))
    if args.json:
        pathlib.Path(args.json).write_text(harness.to_json(results))
    return 0


class _Cut(BaseException):
    """The run's time limit (SIGTERM) came."""


if __name__ == "__main__":
    sys.exit(main())
