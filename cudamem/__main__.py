# SPDX-License-Identifier: MIT
"""``python -m cudamem``: the report a user wants first.

With no arguments (or ``info``), prints the backend, the driver version
and each device with its name, compute capability, total and free
memory; exits 1 when no backend can be used, after saying why.

``python -m cudamem bench [--quick] [--compare] [--json FILE]
[--plot FILE.png]`` measures transfer bandwidth and call latency beside
the bare driver (and numba-cuda, CuPy, PyTorch with ``--compare``).

``python -m cudamem memviz SNAPSHOT.json -o memory.html|memory.png``
draws a snapshot written by ``cudamem.dump_snapshot``.
"""

import argparse
import sys

import cudamem
from cudamem import _core


def _gib(n):
    return "%.2f GiB" % (n / 2**30)


def info():
    print("cudamem %s" % cudamem.__version__)
    print("built against: %s" % _core._cuda_headers)
    err = cudamem.cuda_error()
    if err is not None:
        print("backend: unavailable")
        print(err)
        return 1
    print("backend: %s" % _core._backend())
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
                   help="also numba-cuda, CuPy and PyTorch when installed")
    b.add_argument("--json", metavar="FILE", help="write the figures")
    b.add_argument("--plot", metavar="FILE.png",
                   help="draw bandwidth against size (needs matplotlib: "
                        "pip install cudamem[plot])")
    b.add_argument("--max-size", metavar="BYTES", type=int, default=None,
                   help="the largest transfer (default 1 GiB; 16 MiB on "
                        "the simulator)")
    b.add_argument("--no-progress", action="store_true",
                   help="no progress bar")
    m = sub.add_parser(
        "memviz", help="draw a memory snapshot",
        description="Turn a snapshot (cudamem.dump_snapshot, or "
                    "err.dump of an out-of-memory error) into one "
                    "self-contained HTML page, or a PNG timeline.")
    m.add_argument("snapshot", help="the snapshot's JSON file")
    m.add_argument("-o", "--output", required=True,
                   help="memory.html (interactive page) or memory.png "
                        "(needs matplotlib)")
    return p


def _bench(args):
    from cudamem import _bench

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("--plot needs matplotlib: pip install 'cudamem[plot]'",
                  file=sys.stderr)
            return 2
    err = cudamem.cuda_error()
    if err is not None:
        print("backend: unavailable\n%s" % err, file=sys.stderr)
        return 1
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
            print("a PNG needs matplotlib: pip install 'cudamem[plot]'",
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
    args = _parser().parse_args(argv)
    if args.command == "bench":
        return _bench(args)
    if args.command == "memviz":
        return _memviz(args)
    return info()


if __name__ == "__main__":
    sys.exit(main())
