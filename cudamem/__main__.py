# SPDX-License-Identifier: MIT
"""``python -m cudamem``: the report a user wants first.

With no arguments (or ``info``), prints the backend, the driver version
and each device with its name, compute capability, total and free
memory; exits 1 when no backend can be used, after saying why.

``python -m cudamem bench [--quick] [--compare] [--json FILE]
[--plot FILE.png]`` measures transfer bandwidth and call latency beside
the bare driver (and numba-cuda, CuPy, PyTorch, RMM, cuda.core with
``--compare``).  ``bench --memory [--quick] [--compare] [--cap BYTES]
[--json FILE]`` measures instead how much device memory each memory
manager holds on four seeded workloads (peak used / peak live) and its
cost per operation (and CuPy's, PyTorch's, RMM's and cuda.core's with
``--compare``).

``python -m cudamem memviz SNAPSHOT.json -o memory.html|memory.png``
draws a snapshot written by ``cudamem.dump_snapshot``.

``python -m cudamem test [PYTEST ARGS...]`` runs the validation suite
shipped in the package (``cudamem.tests``; needs pytest) and ends with a
pass/fail line.  ``python -m cudamem --version`` prints the version.

One rule picks the backend of the report, ``test`` and ``bench``: when
none of CUDAMEM_SIMULATOR, NUMBA_ENABLE_CUDASIM and NUMBA_DISABLE_CUDA is
set and the CUDA driver does not initialise (asked of a child process,
so that this one can still choose), the command says why on standard
error and runs on the CPU simulator.  CUDAMEM_SIMULATOR=0 asks for the
driver only: without one the report and ``bench`` exit 1.

Exit status: 0 done (on the driver or the simulator); 1 no backend
(report, bench) or a failed test (test: pytest's status, 5 when no test
was selected); 2 a usage error, an unreadable input, or a missing
optional package (pytest, matplotlib).
"""

import argparse
import os
import subprocess
import sys
import time

import cudamem
from cudamem import _core


# The variables that choose the backend (or none) by hand: when one is
# set, the command does as it says and never falls back.
_CHOSEN_BY = ("CUDAMEM_SIMULATOR", "NUMBA_ENABLE_CUDASIM",
              "NUMBA_DISABLE_CUDA")
_PROBE = ("import cudamem, sys; e = cudamem.cuda_error(); "
          "sys.stdout.write(e or ''); sys.exit(1 if e else 0)")


def _fall_back():
    """The rule every subcommand that needs a device follows: without a
    backend chosen in the environment, when the driver does not
    initialise, choose the simulator (CUDAMEM_SIMULATOR=1, inherited by
    child processes too) and say so on standard error.  Returns the
    driver's error when it fell back, else None."""
    if any(os.environ.get(name, "") != "" for name in _CHOSEN_BY):
        return None
    env = dict(os.environ, CUDAMEM_SIMULATOR="0")
    try:
        p = subprocess.run([sys.executable, "-c", _PROBE], env=env,
                           capture_output=True, text=True, timeout=120)
        if p.returncode == 0:
            return None
        why = p.stdout.strip() or (p.stderr.strip().splitlines()
                                   or ["the driver probe failed"])[-1]
    except (OSError, subprocess.TimeoutExpired) as e:
        why = "the driver probe failed: %s" % e
    os.environ["CUDAMEM_SIMULATOR"] = "1"
    print("cudamem: no usable CUDA driver, so this runs on the CPU "
          "simulator (CUDAMEM_SIMULATOR=1 chooses it without this note, "
          "CUDAMEM_SIMULATOR=0 makes it an error).\n"
          "cudamem: the driver said: %s" % why, file=sys.stderr)
    sys.stderr.flush()
    return why


def _gib(n):
    return "%.2f GiB" % (n / 2**30)


def info():
    fell_back = _fall_back()
    print("cudamem %s" % cudamem.__version__)
    print("built against: %s" % _core._cuda_headers)
    err = cudamem.cuda_error()
    if err is not None:
        print("backend: unavailable")
        print(err)
        return 1
    print("backend: %s%s" % (_core._backend(),
                             " (no usable CUDA driver: the CPU simulator "
                             "stands in)" if fell_back else ""))
    print("driver version: CUDA %d.%d" % cudamem.driver_version())
    print("default stream: %s" % ("per-thread"
                                  if _core._per_thread_default_stream()
                                  else "legacy"))
    print("devices: %d" % len(cudamem.gpus))
    for gpu in cudamem.gpus:
        dev = gpu._device
        with gpu:
            free, total = cudamem.current_context().get_memory_info()
        cc = dev.compute_capability
        print("  [%d] %s  compute capability %d.%d  %d SMs  "
              "memory %s total, %s free" % (
                  dev.id, dev.name, cc[0], cc[1], dev.MULTIPROCESSOR_COUNT,
                  _gib(total), _gib(free)))
        print("      %s" % dev.uuid)
    return 0


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m cudamem",
        description="cudamem: the device report (no arguments), a "
                    "benchmark, or a memory snapshot viewer.")
    p.add_argument("--version", action="version",
                   version="cudamem %s" % cudamem.__version__)
    sub = p.add_subparsers(dest="command")
    sub.add_parser("info", help="the device report (the default)")
    b = sub.add_parser(
        "bench", help="host<->device bandwidth and call latency",
        description="Bandwidth over sizes 4 KiB .. 1 GiB for pinned, "
                    "pageable (staging off) and pageable (staged) memory, "
                    "and the latency of common calls, beside the bare "
                    "driver.")
    b.add_argument("--quick", action="store_true",
                   help="fewer sizes and samples (seconds, not minutes)")
    b.add_argument("--compare", action="store_true",
                   help="also numba-cuda, CuPy, PyTorch, RMM and cuda.core "
                        "when installed")
    b.add_argument("--json", metavar="FILE", help="write the figures")
    b.add_argument("--plot", metavar="FILE.png",
                   help="draw bandwidth against size (needs matplotlib: "
                        "pip install matplotlib)")
    b.add_argument("--max-size", metavar="BYTES", type=int, default=None,
                   help="the largest transfer (default 1 GiB; 16 MiB on "
                        "the simulator)")
    b.add_argument("--no-progress", action="store_true",
                   help="no progress bar")
    b.add_argument("--memory", action="store_true",
                   help="instead: peak device memory used / peak live "
                        "bytes and us per operation of each memory manager "
                        "(and the peers with --compare) on four seeded "
                        "workloads, each in fresh processes")
    b.add_argument("--cap", metavar="BYTES", type=int, default=None,
                   help="with --memory: the bound on live bytes (default "
                        "2 GiB; 192 MiB on the simulator)")
    m = sub.add_parser(
        "memviz", help="draw a memory snapshot",
        description="Turn a snapshot (cudamem.dump_snapshot, or "
                    "err.dump of an out-of-memory error) into one "
                    "self-contained HTML page, or a PNG timeline.")
    m.add_argument("snapshot", help="the snapshot's JSON file")
    m.add_argument("-o", "--output", required=True,
                   help="memory.html (interactive page) or memory.png "
                        "(needs matplotlib)")
    t = sub.add_parser(
        "test", help="run the validation suite of this install",
        description="Run cudamem's validation suite (cudamem.tests: "
                    "device arrays and transfers, streams and events, "
                    "host memory, memory managers, IPC, interop with the "
                    "libraries installed) on the CUDA driver when one "
                    "initialises, else on the simulator. Needs pytest "
                    "(pip install pytest); further arguments go "
                    "to pytest.")
    t.add_argument("pytest_args", nargs=argparse.REMAINDER,
                   help="passed to pytest (-k EXPR, -x, --junitxml=...)")
    return p


class _Tally:
    """A pytest plugin that counts outcomes and prints the closing line."""

    def __init__(self):
        self.counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
        self.start = time.monotonic()

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            key = "error" if (report.failed and report.when != "call") \
                else report.outcome
            self.counts[key] = self.counts.get(key, 0) + 1

    def pytest_unconfigure(self, config):
        # After pytest's own summary: the last two lines of the output.
        from cudamem.tests._util import device_line

        c = self.counts
        print(device_line())
        print("validation: %d passed, %d failed, %d skipped, %d errors in "
              "%.1f s" % (c["passed"], c["failed"], c["skipped"],
                          c["error"], time.monotonic() - self.start))


def _test(args):
    try:
        import pytest
    except ImportError:
        print("the validation suite needs pytest: pip install pytest",
              file=sys.stderr)
        return 2
    import cudamem.tests

    _fall_back()
    here = os.path.dirname(os.path.abspath(cudamem.tests.__file__))
    # The suite's own pytest.ini and root, not the caller's configuration.
    argv = [here, "-c", os.path.join(here, "pytest.ini"), "--rootdir",
            here, "-p", "no:cacheprovider"]
    extra = list(args.pytest_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return int(pytest.main(argv + extra, plugins=[_Tally()]))


def _bench(args):
    from cudamem import _bench

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("--plot needs matplotlib: pip install matplotlib",
                  file=sys.stderr)
            return 2
    _fall_back()
    err = cudamem.cuda_error()
    if err is not None:
        print("backend: unavailable\n%s" % err, file=sys.stderr)
        return 1
    if args.memory:
        return _bench_memory(args)
    res = _bench.run(quick=args.quick, compare=args.compare,
                     progress=not args.no_progress and sys.stderr.isatty(),
                     max_size=args.max_size)
    print(_bench.format_table(res))
    if args.json:
        _bench.write_json(res, args.json)
        print("figures written to %s" % args.json)
    if args.plot:
        _bench.write_plot(res, args.plot)
        print("plot written to %s" % args.plot)
    return 0


def _bench_memory(args):
    from cudamem import _bench, _bench_memory

    if args.plot:
        print("--plot draws bandwidth; --memory has no plot",
              file=sys.stderr)
        return 2
    res = _bench.run_memory(
        quick=args.quick, compare=args.compare, cap=args.cap,
        progress=not args.no_progress and sys.stderr.isatty())
    print(_bench_memory.format_table(res))
    if args.json:
        _bench_memory.write_json(res, args.json)
        print("figures written to %s" % args.json)
    return 0


def _memviz(args):
    from cudamem import _memviz

    try:
        snap = _memviz.load(args.snapshot)
    except (OSError, ValueError) as e:
        print("memviz: cannot read %s: %s" % (args.snapshot, e),
              file=sys.stderr)
        return 2
    out = args.output
    if out.lower().endswith(".png"):
        try:
            _memviz.write_png(snap, out)
        except ImportError:
            print("a PNG needs matplotlib: pip install matplotlib",
                  file=sys.stderr)
            return 2
    elif out.lower().endswith((".html", ".htm")):
        _memviz.write_html(snap, out)
    else:
        print("memviz: the output must end in .html or .png, not %r"
              % out, file=sys.stderr)
        return 2
    print("written to %s" % out)
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["test"] and argv[1:] not in (["-h"], ["--help"]):
        # Everything after "test" is pytest's, options first included
        # (argparse's REMAINDER does not take a leading "-k EXPR").
        args = argparse.Namespace(command="test", pytest_args=argv[1:])
        return _test(args)
    args = _parser().parse_args(argv)
    if args.command == "bench":
        return _bench(args)
    if args.command == "memviz":
        return _memviz(args)
    if args.command == "test":
        return _test(args)
    return info()


if __name__ == "__main__":
    sys.exit(main())
